// pipeswap — the overlapped run of a configuration sized per rank (simulate_sized): each rank's
// resident share of optimizer state measured from its free memory, and the refinements that bring a
// rank over its device back under it. Used by the report and the planner (docs/simulator.md,
// "Overlap").
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/pipeline.hpp>

namespace pipeswap::sim {

/// The overlapped run of a configuration, sized per rank (with overlap; else simulate()):
///  * each rank that swaps optimizer state keeps on the device the share of it that its free memory
///    allows (rank_settings::resident_share, where not set already). The share is measured, not
///    derived: a first run without it gives the rank's peak before its backward tail (the tail only
///    gives memory back, and the prefetch there stays within the budget), and the share is the
///    device capacity less that peak and a margin of 0.5 % of the capacity;
///  * a rank that then goes over the capacity has its share cut by the excess and the margin, or,
///    with no share left, its offload wait delay and load lookahead both set back to 1 (a later wait
///    or an earlier load holds its chunk longer), or last its optimizer step run without the phases
///    (rank_settings::phased), and the run is repeated, at most `refinements` times (the planner
///    passes 4: it weighs many candidates). A run that fits, where some ranks' forwards waited for
///    the previous step's deferred offload, is compared with the same run with those ranks' phases
///    off, and the faster of the two that fits is kept. When none of the runs fits every rank, a rank still over
///    with its phases off gets its sized settings back (one more run), and the result is the run
///    with the fewest ranks over the capacity (the fastest of those).
/// A set of rank settings already run is not simulated again (its result is reused).
/// `resolved`, when given, receives the options of the run returned: simulate(s, *resolved) repeats
/// it exactly.
inline sim_result simulate_sized(scenario const& s, sim_options o, std::uint32_t refinements = 6,
                                 sim_options* resolved = nullptr) {
  auto const keep = [&](sim_options const& x) {
    if (resolved) *resolved = x;
  };
  if (!o.overlap) {
    keep(o);
    return simulate(s, o);
  }
  auto const R = s.pipeline.ranks;
  detail::require_per_rank(s, o.ranks.size(), "rank settings");
  if (o.ranks.empty()) o.ranks.resize(R);
  auto const progress = o.progress;
  o.progress = {};
  // Only the rank settings change from run to run below, and a run is a function of its inputs: a
  // setting run before (the sized run when every share came out 0, the sized settings given back
  // after the refinements) is not simulated again.
  std::vector<std::pair<std::vector<sim_options::rank_settings>, sim_result>> ran;
  std::uint32_t runs = 0, steps = 0; // every simulation below, for the result's work figures
  auto const counted = [&](sim_result r) {
    runs += 1;
    steps += r.simulated_steps;
    return r;
  };
  auto const done = [&](sim_result r) {
    r.simulations = runs;
    r.simulated_steps = steps;
    return r;
  };
  auto const run = [&](sim_options const& x) -> sim_result {
    for (auto const& [settings, r] : ran)
      if (settings == x.ranks) return r;
    auto r = counted(simulate(s, x));
    ran.emplace_back(x.ranks, r);
    return r;
  };
  std::vector<std::uint32_t> sized;
  for (std::uint32_t r = 0; r < R; ++r)
    if (o.swaps_optimizer(r) && !o.ranks[r].resident_share) sized.push_back(r);
  for (auto r : sized) o.ranks[r].resident_share = 0;
  auto const capacity = s.device.memory_bytes, margin = capacity / 200;
  sim_result res;
  if (!sized.empty()) {
    res = run(o);
    for (auto r : sized) {
      auto const peak = res.ranks[r].peak_before_tail;
      o.ranks[r].resident_share = capacity > peak + margin ? capacity - peak - margin : 0;
    }
  }
  // When no refinement fits every rank, the result reported is the one with the fewest ranks over
  // the device (the fastest of those): a rank that fits without the overlap must not be reported
  // over because another rank cannot fit at all.
  auto const over = [](sim_result const& x) {
    return std::count_if(x.ranks.begin(), x.ranks.end(), [](rank_result const& q) { return !q.fits; });
  };
  std::optional<sim_result> best;
  sim_options best_o;
  auto const as_sized = o.ranks;
  for (std::uint32_t k = 0;; ++k) {
    if (k == 0) o.progress = progress;
    res = run(o);
    o.progress = {};
    if (res.fits) {
      // Forwards that waited for the deferred offload's room may cost more than the step without
      // the phases on those ranks (the D2Hs they wait share the link with the prefetch): the faster
      // of the two that fits.
      auto alt = o;
      bool waited = false;
      for (std::uint32_t r = 0; r < R; ++r) {
        if (res.ranks[r].deferred_waited_bytes == 0 || alt.ranks[r].phased == false) continue;
        alt.ranks[r].phased = false;
        waited = true;
      }
      if (waited) {
        auto other = counted(simulate(s, alt));
        if (other.fits && other.step_ns < res.step_ns) {
          keep(alt);
          return done(std::move(other));
        }
      }
      keep(o);
      return done(std::move(res));
    }
    if (!best || over(res) < over(*best) || (over(res) == over(*best) && res.step_ns < best->step_ns)) {
      best = res;
      best_o = o;
    }
    if (k == refinements) break;
    bool changed = false;
    for (std::uint32_t r = 0; r < R; ++r) {
      auto const peak = res.ranks[r].peak_bytes;
      if (peak <= capacity) continue;
      auto& x = o.ranks[r];
      if (x.resident_share && *x.resident_share > 0) {
        auto const cut = peak - capacity + margin;
        x.resident_share = *x.resident_share > cut ? *x.resident_share - cut : 0;
        changed = true;
      } else if (o.swap_activations && (o.offload_wait_delay_of(r) > 1 || o.load_lookahead_of(r) > 1)) {
        // A later wait holds each offloaded chunk's storage longer, an earlier load its chunk: both
        // back to the reference placement at once.
        x.offload_wait_delay = 1;
        x.load_lookahead = 1;
        changed = true;
      } else if (o.swaps_optimizer(r) && x.phased != false) {
        x.phased = false; // the prefetch and the deferred offload's storage do not fit beside the rest
        changed = true;
      }
    }
    if (!changed) break;
  }
  // A rank still over the capacity with its phases off gains nothing from the refinements: it gets
  // its sized settings back (the overlap still shortens its step), the others keep theirs.
  bool reverted = false;
  for (std::uint32_t r = 0; r < R; ++r) {
    if (res.ranks[r].peak_bytes > capacity && o.ranks[r].phased == false) {
      o.ranks[r] = as_sized[r];
      reverted = true;
    }
  }
  if (reverted) {
    res = run(o);
    if (over(res) <= over(*best)) {
      keep(o);
      return done(std::move(res));
    }
  }
  keep(best_o);
  return done(std::move(*best));
}

} // namespace pipeswap::sim
