// pipeswap — the swap planner's rules (internal to sim/plan_search.hpp): the checks of a plan_space,
// the tolerance within which steps count as equally fast, the resolution within which peaks count as
// equally low, the choice among simulated candidates and what a fitting candidate's figures say
// against the chosen plan's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/sim/plan_space.hpp>
#include <pipeswap/sim/report.hpp>

namespace pipeswap::sim::detail {

inline std::string plan_gb(std::uint64_t b) { return fmt("%.1f GB", static_cast<double>(b) / 1e9); }

inline void check_space(plan_space const& s) {
  for (std::size_t i = 0; i < s.gaps.size(); ++i) {
    if (s.gaps[i] < schedule::min_swap_gap)
      throw invalid_argument("plan: activation gap " + std::to_string(s.gaps[i]) + " is below the injector's minimum " +
                             std::to_string(schedule::min_swap_gap));
    if (i > 0 && s.gaps[i] >= s.gaps[i - 1])
      throw invalid_argument("plan: activation gaps must be strictly decreasing");
  }
  if (!(s.tolerance >= 0 && s.tolerance < 1))
    throw invalid_argument("plan: the tolerance must be in [0, 1), got " + fmt("%g", s.tolerance));
  if (s.swap_times.empty() || s.packed.empty() || s.recompute.empty() || s.distributed_optimizer.empty())
    throw invalid_argument(
        "plan: swap_times, packed, recompute and distributed_optimizer need at least one value each");
  for (std::size_t i = 0; i < s.swap_times.size(); ++i) {
    if (s.swap_times[i] == 0) throw invalid_argument("plan: swap_times must be positive");
    if (i > 0 && s.swap_times[i] <= s.swap_times[i - 1])
      throw invalid_argument("plan: swap_times must be strictly increasing");
  }
}

/// Bytes over the host link, both directions.
inline std::uint64_t link_bytes(plan_outcome const& o) { return o.h2d_bytes + o.d2h_bytes; }

/// Whether candidate `c` recomputes otherwise than `mine` (on any rank, for a per-rank plan).
inline bool recompute_changed(swap_choice const& c, recompute_kind mine) {
  if (c.ranks.empty()) return c.recompute != mine;
  return std::any_of(c.ranks.begin(), c.ranks.end(), [&](auto const& r) { return r.recompute != mine; });
}

/// How many of the scenario's own settings (`mine`: its recomputation and distributed optimizer,
/// plan_space::baseline) candidate `c` changes: the recomputation (of any rank, for a per-rank plan)
/// and the distributed optimizer, 0 to 2.
inline int settings_changed(swap_choice const& c, swap_choice const& mine) {
  return int{recompute_changed(c, mine.recompute)} + int{c.distributed_optimizer != mine.distributed_optimizer};
}

/// What the rule weighs of candidate `c` and its outcome `o`, its changes counted against the
/// scenario's own settings `mine`.
inline rule_figures figures_of(swap_choice const& c, plan_outcome const& o, swap_choice const& mine) {
  return {o.step_ns, link_bytes(o), o.peak_bytes, settings_changed(c, mine)};
}

/// The choice among `simulated` (plan_result::simulated) by the planner's rule (pick_by_rule): of
/// the candidates that fit, those within `tolerance` of the fastest; of them those moving the fewest
/// host-link bytes; of them those whose peak is within `resolution` bytes of their lowest; of them the
/// one that changes fewest of the scenario's settings (`mine`), then peaks lowest, then has the
/// shortest step, then was simulated first. Returns its index, or none when nothing fits.
inline std::optional<std::size_t> choose(std::vector<considered> const& simulated, double tolerance,
                                         std::uint64_t resolution, swap_choice const& mine) {
  return pick_by_rule(simulated.size(), tolerance, resolution, [&](std::size_t i) -> std::optional<rule_figures> {
    auto const& e = simulated[i];
    if (!e.fits) return std::nullopt;
    return figures_of(e.choice, e.outcome, mine);
  });
}

/// The outcome of `c` among the simulated candidates, or null if it was not simulated.
inline plan_outcome const* simulated_outcome(std::vector<considered> const& simulated, swap_choice const& c) {
  auto const it = std::find_if(simulated.begin(), simulated.end(), [&](considered const& e) { return e.choice == c; });
  return it == simulated.end() ? nullptr : &it->outcome;
}

/// Why uniform candidate `c` (an optimizer setting, whose run without activation swap gave `setting`,
/// at an activation level) cannot fit `budget`, judged from the simulated run of the same candidate
/// without optimizer swap (its twin), if there is one: swapping the optimizer state lowers a rank's
/// peak by at most that state's bytes, so a rank whose twin peaks above the budget by more than its
/// state stays above it. None when that does not settle it.
inline std::optional<std::string> cannot_fit(swap_choice const& c, plan_outcome const& setting,
                                             std::vector<considered> const& simulated, std::uint64_t budget) {
  if (!c.ranks.empty() || !c.optimizer) return std::nullopt;
  auto twin = c;
  twin.optimizer = false;
  auto const* t = simulated_outcome(simulated, twin);
  if (!t) return std::nullopt;
  auto const& peaks = t->rank_peaks;
  auto const& state = setting.rank_state_bytes;
  for (std::size_t r = 0; r < peaks.size() && r < state.size(); ++r)
    if (peaks[r] > budget + state[r])
      return "without optimizer swap rank " + std::to_string(r) + " peaks at " + plan_gb(peaks[r]) + " (" +
             describe(twin) + "), more than the budget and its " + plan_gb(state[r]) + " of optimizer state together";
  return std::nullopt;
}

/// What a fitting candidate `e` says against the chosen plan `c` (why_it_loses), the fastest step
/// being `fastest`: slower beyond the tolerance, or within it and what it costs more.
inline std::string verdict_against(rule_figures const& e, rule_figures const& c, mock::sim_time fastest,
                                   double tolerance, std::uint64_t resolution) {
  auto const pct = percent(overhead(e.step_ns, c.step_ns));
  auto const tol = fmt("%.2f %%", tolerance * 100);
  std::string const head = "fits, within the " + tol + " tolerance (" + pct + " against the chosen plan), but ";
  switch (why_it_loses(e, c, fastest, tolerance, resolution)) {
  case rule_loss::slower: return "fits, but " + pct + " slower than the chosen plan (beyond the " + tol + " tolerance)";
  case rule_loss::more_bytes:
    return head + "moves " + plan_gb(e.host_bytes - c.host_bytes) + " more over the host link";
  case rule_loss::more_changes:
    return head + "moves as many bytes, peaks within " + resolution_text(resolution) +
           " of it and changes more of your settings";
  case rule_loss::higher_peak:
    return head + "moves as many bytes and peaks " + plan_gb(e.peak_bytes - c.peak_bytes) + " higher";
  case rule_loss::slightly_higher_peak:
    return head + "moves as many bytes and peaks higher, by at most " + resolution_text(resolution);
  case rule_loss::slower_otherwise: return head + "moves as many bytes, peaks as high and is slower";
  case rule_loss::tie: break;
  }
  return "fits, within the " + tol + " tolerance, with the chosen plan's step, bytes and peak (simulated after it)";
}

} // namespace pipeswap::sim::detail
