// pipeswap — splitting a step's update units into swap batches.
//
// Two policies, both runtime-knob objects in the manner of Taskflow's partitioners:
//  * balanced_partition: the integer rule of hyper-parallel's swap runtime exactly. Whole units, order kept, every batch non-empty,
//    greedy prefixes balanced against the remaining average in integer arithmetic.
//  * split_partition: cuts inside units at element granularity so every batch carries the same bytes
//    (to within one element), for optimizers whose update is elementwise (Adam).
//
// Loops, not range-v3: optimizer_swap.hpp includes this header, so whatever it includes is compiled
// by every TU that swaps an optimizer (scripts/compile_time/runtime_tu.cpp; the measured reason is in
// docs/compile-times.md, "Rules"). The greedy batch loop itself reads no better as a range
// expression. No .cu includes this header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <pipeswap/detail/round.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/swap/slot.hpp>

namespace pipeswap {

namespace detail {

__extension__ using uint128 = unsigned __int128;

inline std::uint64_t abs_diff(uint128 a, uint128 b) noexcept {
  return static_cast<std::uint64_t>(a > b ? a - b : b - a);
}

inline void check_swap_times(std::size_t swap_times) {
  if (swap_times == 0) throw invalid_argument("swap_times must be positive (got 0)");
}

} // namespace detail

/// The balanced partition rule over unit costs: returns the number of units in each batch.
///
///   k = min(swap_times, n); w_i = max(1, cost_i); greedily grow each of the first k-1 batches while
///   adding the next unit brings the batch closer to the remaining average (left / batches still
///   open), stopping early on ties, and leaving at least one unit for every later batch; the last
///   batch takes the rest.
///
/// Costs are 64-bit; the comparisons use 128-bit products, so totals up to 2^64 are exact.
/// Linear in n. Throws invalid_argument when swap_times is 0.
inline std::vector<std::size_t> partition_sizes(std::span<std::uint64_t const> costs, std::size_t swap_times) {
  detail::check_swap_times(swap_times);
  auto const n = costs.size();
  if (n == 0) return {};
  auto const k = std::min(swap_times, n);
  std::vector<std::uint64_t> w(n);
  detail::uint128 left = 0;
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = std::max<std::uint64_t>(1, costs[i]);
    left += w[i];
  }
  std::vector<std::size_t> sizes;
  sizes.reserve(k);
  std::size_t start = 0;
  for (std::size_t b = 0; b + 1 < k; ++b) {
    auto const r = static_cast<detail::uint128>(k - b);
    auto const limit = n - (k - b) + 1;
    std::size_t end = start;
    detail::uint128 acc = 0;
    while (end < limit) {
      auto const here = detail::abs_diff(left, acc * r);
      auto const there = detail::abs_diff(left, (acc + w[end]) * r);
      if (end > start && here <= there) break;
      acc += w[end];
      ++end;
    }
    sizes.push_back(end - start);
    left -= acc;
    start = end;
  }
  sizes.push_back(n - start);
  return sizes;
}

/// What a partition policy knows about a unit: its elements and the swappable bytes per element.
struct partition_item {
  std::uint64_t numel = 0;
  std::uint64_t bytes_per_element = 0;
  [[nodiscard]] std::uint64_t bytes() const noexcept { return numel * bytes_per_element; }
  friend constexpr bool operator==(partition_item, partition_item) = default;
};

using batch_plan = std::vector<std::vector<unit_range>>;

/// The balanced rule: whole units.
struct balanced_partition {
  static constexpr bool splits_units = false;

  [[nodiscard]] batch_plan operator()(std::span<partition_item const> items, std::size_t swap_times) const {
    std::vector<std::uint64_t> costs(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) costs[i] = items[i].bytes();
    auto const sizes = partition_sizes(detail::view(costs), swap_times);
    batch_plan plan;
    std::size_t u = 0;
    for (auto s : sizes) {
      auto& batch = plan.emplace_back();
      for (std::size_t j = 0; j < s; ++j, ++u) batch.push_back({u, 0, static_cast<std::size_t>(items[u].numel)});
    }
    return plan;
  }
};

/// Equal bytes per batch: cuts fall inside units, on multiples of `granularity` elements (the last
/// cut of a unit may end at its size). Batch b holds the bytes [T·b/k, T·(b+1)/k) of the T swappable
/// bytes, rounded to element boundaries, so batch sizes differ by less than one element's bytes (or
/// one granule's). Units with no swappable bytes join the batch they fall in. k = min(swap_times,
/// swappable elements / granularity rounded up), at least 1 when there is any unit.
struct split_partition {
  static constexpr bool splits_units = true;
  std::uint64_t granularity = 1;

  [[nodiscard]] batch_plan operator()(std::span<partition_item const> items, std::size_t swap_times) const {
    detail::check_swap_times(swap_times);
    if (granularity == 0) throw invalid_argument("split_partition: granularity must be positive");
    batch_plan plan;
    if (items.empty()) return plan;
    detail::uint128 total = 0;
    std::uint64_t granules = 0;
    for (auto const& it : items) {
      total += it.bytes();
      if (it.bytes_per_element) granules += detail::ceil_div(it.numel, granularity);
    }
    auto const k = static_cast<std::size_t>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(swap_times, granules)));
    plan.resize(k);
    std::size_t b = 0;
    detail::uint128 start = 0; // bytes before the current unit
    // End (exclusive, in bytes) of batch b: ceil(T·(b+1)/k).
    auto batch_end = [&](std::size_t bb) { return detail::ceil_div(total * (bb + 1), detail::uint128{k}); };
    for (std::size_t u = 0; u < items.size(); ++u) {
      auto const& it = items[u];
      auto const n = static_cast<std::size_t>(it.numel);
      std::size_t e = 0;
      if (it.bytes_per_element == 0 || n == 0) {
        plan[b].push_back({u, 0, n});
        continue;
      }
      while (e < n) {
        std::size_t cut = n;
        if (b + 1 < k) {
          auto const end_bytes = batch_end(b);
          if (end_bytes <= start) { // batch b is full: open the next one
            ++b;
            continue;
          }
          auto const need =
              static_cast<std::uint64_t>(detail::ceil_div(end_bytes - start, detail::uint128{it.bytes_per_element}));
          if (e + need < n) { // the batch ends inside this unit, on the next granule boundary
            cut = static_cast<std::size_t>(detail::round_up(std::uint64_t{e + need}, granularity));
            cut = std::clamp<std::size_t>(cut, e + 1, n);
          }
        }
        plan[b].push_back({u, e, cut});
        start += static_cast<detail::uint128>(cut - e) * it.bytes_per_element;
        e = cut;
        if (b + 1 < k && start >= batch_end(b)) ++b;
      }
    }
    std::erase_if(plan, [](auto const& batch) { return batch.empty(); });
    return plan;
  }
};

/// A partition policy maps items and swap_times to batches of unit ranges that tile every unit once,
/// in order.
template <class P>
concept partition_policy = requires(P const& p, std::span<partition_item const> items, std::size_t k) {
  { p(items, k) } -> std::same_as<batch_plan>;
  { P::splits_units } -> std::convertible_to<bool>;
};

} // namespace pipeswap
