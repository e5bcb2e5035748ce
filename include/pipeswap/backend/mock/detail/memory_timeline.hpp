// pipeswap — the mock's device memory over simulated time: every allocation and release at its time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

#include <pipeswap/backend/mock/detail/storage.hpp>
#include <pipeswap/backend/mock/types.hpp>

namespace pipeswap::mock::detail {

class memory_timeline {
public:
  /// A change whose op comes after every earlier change's: it goes after those at or before its time.
  /// Those after it are few (the streams run not far apart): a scan from the end finds the place,
  /// and costs no more than moving them.
  void add(mem_event e) {
    auto at = events_.end();
    while (at != events_.begin() && std::prev(at)->time > e.time) --at;
    events_.insert(at, e);
  }

  /// Device bytes live at simulated time `t` (every change at or before it).
  [[nodiscard]] std::size_t live_at(sim_time t) const {
    std::int64_t live = 0;
    for (auto const& e : events_)
      if (e.time <= t) live += e.delta;
    return static_cast<std::size_t>(std::max<std::int64_t>(live, 0));
  }

  /// The highest device bytes live at any simulated instant from `t` on, of the changes added so
  /// far; `live_end` is the bytes after all of them. The changes after `t` are few (the streams run
  /// not far apart): a scan from the end.
  [[nodiscard]] std::size_t peak_from(sim_time t, std::size_t live_end) const {
    auto live = static_cast<std::int64_t>(live_end), peak = live;
    for (auto it = events_.rbegin(); it != events_.rend() && it->time > t; ++it)
      peak = std::max(peak, live -= it->delta); // the bytes before this change, up to it
    return static_cast<std::size_t>(std::max<std::int64_t>(peak, 0));
  }

  /// The changes in simulated-time order (at equal times, in the order they were enqueued): kept so
  /// as they are added.
  [[nodiscard]] std::vector<mem_event> const& sorted() const noexcept { return events_; }

  /// The highest device bytes live at any simulated instant.
  [[nodiscard]] std::size_t peak() const {
    std::int64_t live = 0, peak = 0;
    for (auto const& e : sorted()) peak = std::max(peak, live += e.delta);
    return static_cast<std::size_t>(peak);
  }

  /// (time, live bytes) after the changes at each instant, in simulated-time order.
  [[nodiscard]] std::vector<std::pair<sim_time, std::size_t>> timeline() const {
    std::vector<std::pair<sim_time, std::size_t>> out;
    std::int64_t live = 0;
    for (auto const& e : sorted()) {
      live += e.delta;
      if (!out.empty() && out.back().first == e.time)
        out.back().second = static_cast<std::size_t>(live);
      else
        out.emplace_back(e.time, static_cast<std::size_t>(live));
    }
    return out;
  }

private:
  std::vector<mem_event> events_; ///< by (time, op)
};

} // namespace pipeswap::mock::detail
