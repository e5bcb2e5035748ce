// pipeswap — the mock backend's timing model.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pipeswap/core/detail/round.hpp>

namespace pipeswap::mock {

/// Simulated time in nanoseconds. Time starts at 0 when a mock backend is constructed.
using sim_time = std::int64_t;

namespace detail {
__extension__ using uint128 = unsigned __int128; // exact bytes × 10⁹ products
} // namespace detail

/// One direction of the host link: a fixed latency per copy plus bytes at a constant bandwidth.
struct link_model {
  std::uint64_t bytes_per_second = 55'000'000'000;
  sim_time latency_ns = 0;

  /// latency + ceil(bytes / bandwidth), computed exactly in 128-bit integers.
  [[nodiscard]] constexpr sim_time duration(std::size_t bytes) const noexcept {
    if (bytes == 0) return 0;
    auto const num = static_cast<detail::uint128>(bytes) * 1'000'000'000u;
    auto const ns = pipeswap::detail::ceil_div(num, detail::uint128{bytes_per_second});
    return latency_ns + static_cast<sim_time>(ns);
  }
};

/// How long each kind of simulated work takes.
///
/// Copies: one copy engine per direction. Copies in the same direction run one at a time in the order
/// they were enqueued (across all streams); copies in opposite directions overlap.
/// Kernels: an explicit cost given at launch, or `kernel_launch_ns + bytes touched / device
/// bandwidth`. Unless `concurrent_kernels` is set, kernels share one compute engine and run one at a
/// time in enqueue order.
struct timing_model {
  link_model h2d{};
  link_model d2h{};
  std::uint64_t device_bytes_per_second = 4'800'000'000'000;
  sim_time kernel_launch_ns = 0;
  bool concurrent_kernels = false;

  [[nodiscard]] constexpr sim_time kernel_duration(std::size_t bytes_touched) const noexcept {
    link_model const mem{device_bytes_per_second, kernel_launch_ns};
    return bytes_touched == 0 ? kernel_launch_ns : mem.duration(bytes_touched);
  }

  /// 1 byte per nanosecond each way and on the device, no latencies: durations equal byte counts,
  /// which makes expected times in tests easy to compute by hand.
  static constexpr timing_model unit() noexcept {
    return timing_model{{1'000'000'000, 0}, {1'000'000'000, 0}, 1'000'000'000, 0, false};
  }

  /// An H200 on PCIe Gen5: 55 GB/s each way with 2 µs per copy, 4.8 TB/s HBM, 4 µs per kernel.
  static constexpr timing_model h200_pcie() noexcept {
    return timing_model{{55'000'000'000, 2'000}, {55'000'000'000, 2'000}, 4'800'000'000'000, 4'000,
                        false};
  }
};

} // namespace pipeswap::mock
