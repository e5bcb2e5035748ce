// pipeswap — integer rounding, the one helper every size computation uses (internal). Host and
// device: the CUDA kernels' grid and stride computations use it too, so it includes nothing but
// config.hpp (no range-v3, no standard header nvcc could choke on).
#pragma once

#include <pipeswap/config.hpp>

namespace pipeswap::detail {

/// ⌈n / d⌉ for unsigned n and d > 0 (n + d - 1 must not overflow).
template <class T>
PIPESWAP_HOST_DEVICE constexpr T ceil_div(T n, T d) noexcept {
  return (n + d - 1) / d;
}

/// The least multiple of `a` that is at least `n` (a > 0).
template <class T>
PIPESWAP_HOST_DEVICE constexpr T round_up(T n, T a) noexcept {
  return ceil_div(n, a) * a;
}

static_assert(ceil_div(0u, 4u) == 0 && ceil_div(1u, 4u) == 1 && ceil_div(8u, 4u) == 2);
static_assert(round_up(0u, 256u) == 0 && round_up(1u, 256u) == 256 && round_up(512u, 256u) == 512);

} // namespace pipeswap::detail
