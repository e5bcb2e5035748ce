// A small training world for runtime tests: a backend, a transfer engine, an optimizer with
// parameters and gradients of given sizes, deterministic data, and helpers to read every state.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/backends.hpp"

namespace pipeswap::test {

inline void upload(mock::backend& b, device_ptr d, void const* src, std::size_t n) {
  b.write_device(d, {static_cast<std::byte const*>(src), n});
}
inline void upload(sync_host_backend&, device_ptr d, void const* src, std::size_t n) {
  if (n) std::memcpy(d.get(), src, n);
}
inline std::vector<std::byte> download(mock::backend& b, device_ptr d, std::size_t n) { return b.read_device(d, n); }
inline std::vector<std::byte> download(sync_host_backend&, device_ptr d, std::size_t n) {
  auto const* p = d.get<std::byte>();
  return {p, p + n};
}

/// Deterministic pseudo-random floats in [-1, 1) (a fixed generator, so values are identical on
/// every platform).
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return v;
}

/// A configuration that swaps nothing (no state keys): the reference the swapping runs compare with.
inline swap_config no_swap() {
  swap_config c;
  c.state_keys = std::vector<std::string>{};
  c.packed = false;
  return c;
}

/// Parameters and gradients on the device of `b`, and the optimizer built over them: the toy
/// optimizer (support/toy_optimizer.hpp, every other parameter with a master copy when `masters`) or
/// any optimizer whose add_param takes a param_desc (Adam). Bytes move with upload() and download(),
/// found by argument-dependent lookup (support/threaded_backend.hpp has the threaded backend's).
template <class B, class Opt>
struct model {
  B& b;
  std::vector<std::size_t> sizes;
  std::vector<device_ptr> params, grads;
  Opt opt;

  template <class... OptArgs>
  model(B& backend, std::vector<std::size_t> const& sz, std::uint64_t seed, bool masters, OptArgs&&... args)
      : b(backend), opt(backend, std::forward<OptArgs>(args)...) {
    for (std::size_t i = 0; i < sz.size(); ++i) add(sz[i], seed + i, masters && i % 2 == 0);
  }
  model(model const&) = delete;
  ~model() {
    auto s = b.current_stream();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      b.deallocate_device(params[i], sizes[i] * 4, s);
      b.deallocate_device(grads[i], sizes[i] * 4, s);
    }
  }

  /// A parameter of `numel` floats drawn from `seed` and its gradient, registered with the
  /// optimizer; returns its index.
  std::size_t add(std::size_t numel, std::uint64_t seed, bool master = false) {
    auto s = b.current_stream();
    params.push_back(b.allocate_device(numel * 4, s));
    grads.push_back(b.allocate_device(numel * 4, s));
    sizes.push_back(numel);
    auto const i = sizes.size() - 1;
    auto v = random_floats(numel, seed);
    upload(b, params[i], v.data(), v.size() * 4);
    if constexpr (requires { opt.add_param(params[i], grads[i], numel, master); }) {
      opt.add_param(params[i], grads[i], numel, master);
    } else {
      opt.add_param({params[i], grads[i], numel});
    }
    return i;
  }

  void set_grads(std::uint64_t step) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto v = random_floats(sizes[i], 1000003 * (step + 1) + i);
      upload(b, grads[i], v.data(), v.size() * 4);
    }
  }

  /// Every parameter's bytes.
  std::vector<std::vector<std::byte>> params_bytes() {
    std::vector<std::vector<std::byte>> out;
    for (std::size_t i = 0; i < sizes.size(); ++i) out.push_back(download(b, params[i], sizes[i] * 4));
    return out;
  }

  /// Every parameter's bytes, then every slot's bytes (mirrors after a synchronize for swapped slots).
  template <class Runtime>
  std::vector<std::vector<std::byte>> snapshot(Runtime& rt) {
    rt.synchronize_host_mirrors();
    auto out = params_bytes();
    auto const slots = opt.slots();
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (rt.is_swappable(i)) {
        auto const m = rt.host_mirror(i);
        detail::note_host_read(b, m.data(), m.size());
        out.emplace_back(m.begin(), m.end());
      } else {
        out.push_back(download(b, rt.unswappable_device(i), slots[i].bytes()));
      }
    }
    return out;
  }
};

} // namespace pipeswap::test
