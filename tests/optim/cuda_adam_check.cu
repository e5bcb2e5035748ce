// The optimizer math under nvcc: instantiates adam_element, the update loop and the bf16/f16
// conversions in kernels (compiled for sm_90), and, when a GPU is present, checks that the device
// produces the same bits as the host for the same inputs. Exits 77 (skip) without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <pipeswap/optim/adam_math.hpp>

namespace ps = pipeswap;

namespace {

// One thread per element: the form the real kernels will take.
template <class P, class G>
__global__ void adam_kernel(ps::adam_step_scalars s, P* param, G const* grad, float* exp_avg, float* exp_avg_sq,
                            float* max_exp_avg_sq, std::size_t n) {
  std::size_t const i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float p = ps::to_float(param[i]);
  float unused = 0;
  ps::adam_element(s, ps::to_float(grad[i]), p, exp_avg[i], exp_avg_sq[i], s.amsgrad ? max_exp_avg_sq[i] : unused);
  param[i] = ps::from_float<P>(p);
}

// The host loop's code path, run by one thread (instantiates adam_update_unchecked on the device).
__global__ void adam_loop_kernel(ps::adam_step_scalars s, float* param, ps::bf16 const* grad, float* exp_avg,
                                 float* exp_avg_sq, float* max_exp_avg_sq, ps::bf16* model, std::size_t n) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  ps::adam_update_unchecked(s, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n);
  ps::cast_master_to_param_unchecked(param, model, n);
}

__global__ void convert_kernel(std::uint32_t first, std::size_t n, std::uint16_t* bf, std::uint16_t* hf,
                               std::uint32_t* from_bf, std::uint32_t* from_hf) {
  std::size_t const i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  std::uint32_t const u = first + static_cast<std::uint32_t>(i);
  float const x = __uint_as_float(u);
  bf[i] = ps::to_bf16(x).bits;
  hf[i] = ps::to_f16(x).bits;
  auto const h = static_cast<std::uint16_t>(u & 0xffffu);
  from_bf[i] = __float_as_uint(ps::to_float(ps::bf16{h}));
  from_hf[i] = __float_as_uint(ps::to_float(ps::f16{h}));
}

// The element operations one by one, float and double (the double forms back make_step_scalars).
// One definition, called by the kernel and by the host loop it is compared with.
__host__ __device__ void all_ops(float x, float y, float* o) {
  using namespace ps::ieee;
  double const dx = x, dy = y;
  o[0] = add_rn(x, y);
  o[1] = sub_rn(x, y);
  o[2] = mul_rn(x, y);
  o[3] = div_rn(x, y);
  o[4] = sqrt_rn(x);
  o[5] = max_nan(x, y);
  o[6] = neg(x);
  o[7] = static_cast<float>(sqrt_rn(add_rn(mul_rn(dx, dy), div_rn(sub_rn(dx, dy), dy))));
}

__global__ void ops_kernel(float const* a, float const* b, float* out, std::size_t n) {
  std::size_t const i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) all_ops(a[i], b[i], out + 8 * i);
}

#define CHECK(call)                                                                                                    \
  do {                                                                                                                 \
    cudaError_t const e_ = (call);                                                                                     \
    if (e_ != cudaSuccess) {                                                                                           \
      std::printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                               \
      std::exit(1);                                                                                                    \
    }                                                                                                                  \
  } while (0)

template <class T>
T* to_device(std::vector<T> const& v) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, v.size() * sizeof(T) + 1));
  CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> to_host(T const* d, std::size_t n) {
  std::vector<T> v(n);
  CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Same bits, or both NaN (NaN payloads differ between host and device arithmetic).
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; }

int mismatches = 0;
void expect_same(std::vector<float> const& host, std::vector<float> const& dev, char const* what) {
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (!same(host[i], dev[i]) && ++mismatches <= 10)
      std::printf("mismatch %s[%zu]: host %a device %a\n", what, i, host[i], dev[i]);
  }
}

std::vector<float> inputs(std::size_t n, std::uint32_t seed, int lo, int hi) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    auto const r = static_cast<std::uint32_t>(s >> 32);
    // Biased exponent in [127 + lo, 127 + hi), clamped to [0, 254]: 0 gives subnormals.
    int e = 127 + lo + static_cast<int>((r >> 8) % static_cast<std::uint32_t>(hi - lo));
    e = e < 0 ? 0 : e > 254 ? 254 : e;
    std::uint32_t const u =
        ((r << 24) & 0x80000000u) | (static_cast<std::uint32_t>(e) << 23) | ((r * 2654435761u) & 0x7fffffu);
    std::memcpy(&x, &u, sizeof x);
  }
  v[0] = 0.0f;
  v[1] = -0.0f;
  v[2] = 1e-40f;
  v[3] = 1e22f;
  return v;
}

void check_adam(ps::adam_config const& cfg) {
  constexpr std::size_t n = 1 << 16;
  auto p = inputs(n, 1, -6, 4);
  auto const g = inputs(n, 2, -20, 8);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), vm(n, 0.0f);
  float *dp = to_device(p), *dg = to_device(g), *dm = to_device(m), *dv = to_device(v), *dvm = to_device(vm);
  for (int step = 1; step <= 4; ++step) {
    auto const s = ps::make_step_scalars(cfg, step);
    ps::adam_update_unchecked(s, p.data(), g.data(), m.data(), v.data(), vm.data(), n);
    adam_kernel<<<(n + 255) / 256, 256>>>(s, dp, static_cast<float const*>(dg), dm, dv, dvm, n);
    CHECK(cudaGetLastError());
  }
  expect_same(p, to_host(dp, n), "param");
  expect_same(m, to_host(dm, n), "exp_avg");
  expect_same(v, to_host(dv, n), "exp_avg_sq");
  expect_same(vm, to_host(dvm, n), "max_exp_avg_sq");
  for (float* d : {dp, dg, dm, dv, dvm}) CHECK(cudaFree(d));
}

void check_master_bf16() {
  constexpr std::size_t n = 4096;
  ps::adam_config const cfg{.lr = 0.01, .weight_decay = 0.01, .amsgrad = true, .decoupled_weight_decay = true};
  auto master = inputs(n, 3, -6, 4);
  std::vector<ps::bf16> grad(n), model(n);
  auto const gf = inputs(n, 4, -20, 8);
  for (std::size_t i = 0; i < n; ++i) grad[i] = ps::to_bf16(gf[i]);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), vm(n, 0.0f);
  float *dp = to_device(master), *dm = to_device(m), *dv = to_device(v), *dvm = to_device(vm);
  ps::bf16* dg = to_device(grad);
  ps::bf16* dmodel = to_device(model);
  for (int step = 1; step <= 3; ++step) {
    auto const s = ps::make_step_scalars(cfg, step);
    ps::adam_update_unchecked(s, master.data(), grad.data(), m.data(), v.data(), vm.data(), n);
    ps::cast_master_to_param_unchecked(master.data(), model.data(), n);
    adam_loop_kernel<<<1, 1>>>(s, dp, dg, dm, dv, dvm, dmodel, n);
    CHECK(cudaGetLastError());
  }
  expect_same(master, to_host(dp, n), "master");
  auto const dev_model = to_host(dmodel, n);
  for (std::size_t i = 0; i < n; ++i)
    if (dev_model[i].bits != model[i].bits && ++mismatches <= 10)
      std::printf("mismatch model[%zu]: host %04x device %04x\n", i, model[i].bits, dev_model[i].bits);
  for (float* d : {dp, dm, dv, dvm}) CHECK(cudaFree(d));
  CHECK(cudaFree(dg));
  CHECK(cudaFree(dmodel));
}

void check_ops() {
  constexpr std::size_t n = 1 << 16;
  auto const a = inputs(n, 5, -140, 120); // subnormals to near overflow
  auto const b = inputs(n, 6, -140, 120);
  std::vector<float> host(8 * n);
  for (std::size_t i = 0; i < n; ++i) all_ops(a[i], b[i], host.data() + 8 * i);
  float *da = to_device(a), *db = to_device(b), *dout = nullptr;
  CHECK(cudaMalloc(&dout, host.size() * sizeof(float)));
  ops_kernel<<<(n + 255) / 256, 256>>>(da, db, dout, n);
  CHECK(cudaGetLastError());
  expect_same(host, to_host(dout, host.size()), "ops");
  for (float* d : {da, db, dout}) CHECK(cudaFree(d));
}

// Every float in chunks: conversions on the device equal the host's. Also covers all 16-bit
// patterns (low half of each float) for the widening direction.
void check_conversions() {
  constexpr std::size_t chunk = std::size_t{1} << 26;
  std::uint16_t *bf = nullptr, *hf = nullptr;
  std::uint32_t *fb = nullptr, *fh = nullptr;
  CHECK(cudaMalloc(&bf, chunk * 2));
  CHECK(cudaMalloc(&hf, chunk * 2));
  CHECK(cudaMalloc(&fb, chunk * 4));
  CHECK(cudaMalloc(&fh, chunk * 4));
  std::uint64_t bad = 0;
  for (std::uint64_t first = 0; first < (std::uint64_t{1} << 32); first += chunk) {
    convert_kernel<<<chunk / 256, 256>>>(static_cast<std::uint32_t>(first), chunk, bf, hf, fb, fh);
    CHECK(cudaGetLastError());
    auto const hbf = to_host(bf, chunk);
    auto const hhf = to_host(hf, chunk);
    auto const hfb = first == 0 ? to_host(fb, 0x10000) : std::vector<std::uint32_t>{};
    auto const hfh = first == 0 ? to_host(fh, 0x10000) : std::vector<std::uint32_t>{};
    for (std::size_t i = 0; i < chunk; ++i) {
      auto const u = static_cast<std::uint32_t>(first + i);
      float x;
      std::memcpy(&x, &u, sizeof x);
      bad += ps::to_bf16(x).bits != hbf[i];
      bad += ps::to_f16(x).bits != hhf[i];
    }
    for (std::size_t i = 0; i < hfb.size(); ++i) {
      auto const h = static_cast<std::uint16_t>(i);
      float const a = ps::to_float(ps::bf16{h}), b = ps::to_float(ps::f16{h});
      bad += std::memcmp(&a, &hfb[i], 4) != 0;
      bad += std::memcmp(&b, &hfh[i], 4) != 0;
    }
  }
  if (bad != 0) {
    std::printf("conversions: %llu mismatches\n", static_cast<unsigned long long>(bad));
    mismatches += 1;
  }
  for (void* d : {static_cast<void*>(bf), static_cast<void*>(hf), static_cast<void*>(fb), static_cast<void*>(fh)})
    CHECK(cudaFree(d));
}

} // namespace

int main() {
  int count = 0; // cudaGetDeviceCount leaves it untouched when there is no driver
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::puts("skip: no CUDA device");
    return 77;
  }
  check_adam({.lr = 1e-3});
  check_adam({.lr = 0.1, .weight_decay = 0.01, .amsgrad = true, .maximize = true});
  check_adam(
      {.lr = 0.01, .beta1 = 0.3, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1, .decoupled_weight_decay = true});
  check_master_bf16();
  check_ops();
  check_conversions();
  std::printf("%s: %d mismatches\n", mismatches == 0 ? "ok" : "FAILED", mismatches);
  return mismatches == 0 ? 0 : 1;
}
