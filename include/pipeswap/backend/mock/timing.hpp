// pipeswap — the mock backend's timing model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include <pipeswap/detail/round.hpp>

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
/// they were enqueued (across all streams); copies in opposite directions overlap. With
/// `duplex_factor` f below 1 they share the link while they overlap: together the two directions
/// move at most 2f of their full rates (each direction's own rate as the unit). A copy that runs
/// alone gets its full rate; one that overlaps copies already planned the other way gets what those
/// leave, min(1, 2f - their share), for as long as they overlap. Copies are planned when they are
/// enqueued and a plan never changes, so the copy enqueued first keeps its share: the link's total
/// rate is right at every instant, its split between the directions favours the earlier copy.
/// Kernels: an explicit cost given at launch, or `kernel_launch_ns + bytes touched / device
/// bandwidth`. Unless `concurrent_kernels` is set, kernels share one compute engine and run one at a
/// time in enqueue order.
struct timing_model {
  link_model h2d{};
  link_model d2h{};
  std::uint64_t device_bytes_per_second = 4'800'000'000'000;
  sim_time kernel_launch_ns = 0;
  bool concurrent_kernels = false;
  /// Each direction's share of its full rate while both directions copy (0.5: they share one rate;
  /// 1: independent, the default).
  double duplex_factor = 1.0;

  [[nodiscard]] constexpr sim_time kernel_duration(std::size_t bytes_touched) const noexcept {
    link_model const mem{device_bytes_per_second, kernel_launch_ns};
    return bytes_touched == 0 ? kernel_launch_ns : mem.duration(bytes_touched);
  }

  /// 1 byte per nanosecond each way and on the device, no latencies: durations equal byte counts,
  /// which makes expected times in tests easy to compute by hand.
  static constexpr timing_model unit() noexcept {
    return timing_model{{1'000'000'000, 0}, {1'000'000'000, 0}, 1'000'000'000, 0, false, 1.0};
  }

  /// An H200 on PCIe Gen5: 55 GB/s each way with 2 µs per copy, 4.8 TB/s HBM, 4 µs per kernel.
  static constexpr timing_model h200_pcie() noexcept {
    return timing_model{{55'000'000'000, 2'000}, {55'000'000'000, 2'000}, 4'800'000'000'000, 4'000, false, 1.0};
  }
};

namespace detail {

/// The share of its full rate one copy engine is planned to run at, over time (timing_model's
/// duplex sharing): disjoint segments in time order.
class rate_timeline {
public:
  struct segment {
    sim_time begin, end;
    double share;
  };

  /// Forgets what ends at or before `t` (no copy is planned to start before the host's present).
  void forget_before(sim_time t) {
    auto const k = std::partition_point(segs_.begin(), segs_.end(), [&](segment const& s) { return s.end <= t; });
    segs_.erase(segs_.begin(), k);
  }
  void append(std::vector<segment> const& more) {
    for (auto const& s : more) {
      if (!segs_.empty() && segs_.back().end == s.begin && segs_.back().share == s.share) {
        segs_.back().end = s.end;
      } else {
        segs_.push_back(s);
      }
    }
  }
  [[nodiscard]] std::vector<segment> const& segments() const noexcept { return segs_; }

private:
  std::vector<segment> segs_;
};

/// When a copy of `bytes` on `link` ends if it starts at `start` (latency included) and the other
/// direction has `other` planned, with duplex factor `f` (timing_model). Its own shares over time
/// go to `mine`. A copy that meets none of `other` takes link.duration(bytes) exactly.
inline sim_time shared_copy_end(link_model const& link, double f, sim_time start, std::size_t bytes,
                                rate_timeline const& other, std::vector<rate_timeline::segment>& mine) {
  mine.clear();
  auto const alone = start + link.duration(bytes);
  if (bytes == 0) return alone;
  auto const t0 = start + link.latency_ns;
  auto const& segs = other.segments();
  // Disjoint and in time order: their ends increase, the first that ends after t0 is found by halving.
  auto it = std::partition_point(segs.begin(), segs.end(), [&](auto const& s) { return s.end <= t0; });
  if (f >= 1 || it == segs.end() || it->begin >= alone) {
    mine.push_back({t0, alone, 1.0});
    return alone;
  }
  double const per_ns = static_cast<double>(link.bytes_per_second) / 1e9;
  double left = static_cast<double>(bytes);
  constexpr sim_time never = std::numeric_limits<sim_time>::max();
  for (sim_time now = t0;;) {
    double share = 1;
    sim_time until = never;
    if (it != segs.end() && it->begin <= now) {
      share = std::min(1.0, 2 * f - it->share);
      until = it->end;
    } else if (it != segs.end()) {
      until = it->begin;
    }
    if (share > 0) {
      double const rate = share * per_ns;
      if (until == never || left <= static_cast<double>(until - now) * rate) {
        auto const end = now + std::max<sim_time>(1, static_cast<sim_time>(std::ceil(left / rate)));
        mine.push_back({now, end, share});
        return end;
      }
      mine.push_back({now, until, share});
      left -= static_cast<double>(until - now) * rate;
    }
    if (it != segs.end() && until == it->end) ++it;
    now = until;
  }
}

} // namespace detail

} // namespace pipeswap::mock
