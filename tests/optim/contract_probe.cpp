// Prints digests of pipeswap's optimizer math over a fixed set of inputs, plus a control digest of
// plain `a * b + c`. Built several times with different contraction flags (see contract_check.py):
// the pipeswap digests must not change, the control digest must (proving the flags did contract).
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <pipeswap/optim/adam_math.hpp>

namespace {

struct digest {
  std::uint64_t h = 1469598103934665603ull; // FNV-1a
  void add(void const* p, std::size_t n) {
    auto const* b = static_cast<unsigned char const*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  void add(float f) { add(&f, sizeof f); }
  void add(double d) { add(&d, sizeof d); }
};

struct lcg {
  std::uint64_t s;
  std::uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(s >> 32);
  }
  // A float with a random mantissa and an exponent in [2^lo, 2^hi), random sign.
  float value(int lo, int hi) {
    std::uint32_t const r = next();
    std::uint32_t const e = static_cast<std::uint32_t>(127 + lo) + r % static_cast<std::uint32_t>(hi - lo);
    std::uint32_t const u = (next() & 0x807fffffu) | (e << 23);
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

} // namespace

int main() {
#if defined(PIPESWAP_PROBE_NEEDS_FMA) && (defined(__x86_64__) || defined(__i386__))
  if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx2")) {
    std::puts("skip: this CPU lacks FMA/AVX2");
    return 77;
  }
#endif
  std::uint64_t volatile seed = 0x9e3779b97f4a7c15ull; // not a compile-time constant
  lcg rng{seed};
  constexpr int n = 4096;
  static float a[n], b[n], c[n];
  for (int i = 0; i < n; ++i) {
    a[i] = rng.value(-8, 8);
    b[i] = rng.value(-8, 8);
    c[i] = rng.value(-8, 8);
  }

  digest control, ops, adam, scalars;
  for (int i = 0; i < n; ++i) control.add(a[i] * b[i] + c[i]);
  {
    // Each product has a single use, so a contracting compiler would fuse every one of them.
    using namespace pipeswap::ieee;
    for (int i = 0; i < n; ++i) ops.add(add_rn(mul_rn(a[i], b[i]), c[i]));
    for (int i = 0; i < n; ++i) ops.add(sub_rn(c[i], mul_rn(a[i], b[i])));
    for (int i = 0; i < n; ++i) ops.add(sub_rn(mul_rn(a[i], b[i]), c[i]));
    for (int i = 0; i < n; ++i) ops.add(add_rn(mul_rn(double{a[i]}, double{b[i]}), double{c[i]}));
  }

  pipeswap::adam_config const configs[] = {
      {.lr = 1e-3},
      {.lr = 0.1, .weight_decay = 0.01, .amsgrad = true},
      {.lr = 0.01, .beta1 = 0.3, .beta2 = 0.99, .weight_decay = 0.1, .maximize = true, .decoupled_weight_decay = true},
  };
  for (auto const& cfg : configs) {
    static float p[n], m[n], v[n], vmax[n];
    for (int i = 0; i < n; ++i) {
      p[i] = a[i];
      m[i] = v[i] = vmax[i] = 0.0f;
    }
    for (int step = 1; step <= 5; ++step) {
      auto const s = pipeswap::make_step_scalars(cfg, step);
      scalars.add(s.bias_correction1);
      scalars.add(s.step_size);
      scalars.add(static_cast<double>(s.decay_factor));
      pipeswap::adam_update_unchecked(s, p, step % 2 ? b : c, m, v, vmax, n);
    }
    for (int i = 0; i < n; ++i) {
      adam.add(p[i]);
      adam.add(m[i]);
      adam.add(v[i]);
      adam.add(vmax[i]);
    }
  }
  std::printf("control %016llx\n", static_cast<unsigned long long>(control.h));
  std::printf("ops %016llx\n", static_cast<unsigned long long>(ops.h));
  std::printf("adam %016llx\n", static_cast<unsigned long long>(adam.h));
  std::printf("scalars %016llx\n", static_cast<unsigned long long>(scalars.h));
  return 0;
}
