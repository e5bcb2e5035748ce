// pipeswap — what the swap planner (sim/plan_search.hpp) weighs: a candidate (swap_choice) and its
// description, what a simulation of one gives (plan_outcome), the space of candidates (plan_space),
// and the result of a search (plan_result).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/sim/alternatives.hpp>
#include <pipeswap/sim/scenario.hpp>
#include <pipeswap/sim/verdict.hpp>

#include <range/v3/algorithm/any_of.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/cartesian_product.hpp>
#include <range/v3/view/transform.hpp>

namespace pipeswap::sim {

/// One candidate of the planner.
struct swap_choice {
  /// 0: no activation swap. schedule::min_swap_gap (4): every eligible group. Larger: only the chunks
  /// whose backward runs at least this many compute slots after their forward.
  std::size_t activation_min_gap = 0;
  bool optimizer = false;
  std::uint32_t swap_times = 16;                   ///< optimizer batches (when `optimizer`)
  bool packed = true;                              ///< packed optimizer pipeline (when `optimizer`)
  recompute_kind recompute = recompute_kind::none; ///< every rank's, unless `ranks` is set
  bool distributed_optimizer = false;

  /// A per-rank plan: each rank's own recomputation, activation level and optimizer swap (then
  /// `activation_min_gap`, `optimizer` and `recompute` above are not used).
  struct rank_choice {
    std::size_t activation_min_gap = 0;
    bool optimizer = false;
    recompute_kind recompute = recompute_kind::none;
    std::uint32_t swap_times = 0; ///< this rank's optimizer batches (0: the plan's swap_times)
    /// Of each group that swaps, the share of its layers' activations that swaps, in tenths (10:
    /// all; sim_options::rank_settings::swapped_tenths). The per-rank refinement sets it.
    std::uint32_t activation_tenths = 10;
    friend bool operator==(rank_choice const&, rank_choice const&) = default;
  };
  std::vector<rank_choice> ranks{};

  [[nodiscard]] rank_choice on(std::uint32_t rank) const {
    return ranks.empty() ? rank_choice{activation_min_gap, optimizer, recompute} : ranks.at(rank);
  }
  [[nodiscard]] bool any_optimizer() const {
    return ranks.empty() ? optimizer : ranges::any_of(ranks, &rank_choice::optimizer);
  }
  [[nodiscard]] bool any_activation() const {
    return ranks.empty() ? activation_min_gap > 0
                         : ranges::any_of(ranks, [](rank_choice const& r) { return r.activation_min_gap > 0; });
  }
  /// No swap of any kind (recomputation and the distributed optimizer allowed).
  [[nodiscard]] bool swap_free() const { return !any_optimizer() && !any_activation(); }

  friend bool operator==(swap_choice const& a, swap_choice const& b) noexcept {
    return a.activation_min_gap == b.activation_min_gap && a.optimizer == b.optimizer && a.recompute == b.recompute &&
           a.distributed_optimizer == b.distributed_optimizer && a.ranks == b.ranks &&
           (!a.any_optimizer() || (a.swap_times == b.swap_times && a.packed == b.packed));
  }
};

namespace detail {

inline std::string describe_one(swap_choice::rank_choice const& c, swap_choice const& all) {
  std::string opt = c.optimizer ? "optimizer swap (" + std::string(all.packed ? "packed" : "per tensor") + ", " +
                                      std::to_string(c.swap_times ? c.swap_times : all.swap_times) + " batches)"
                                : "";
  std::string act;
  if (c.activation_min_gap > schedule::min_swap_gap)
    act = "activation groups with gap >= " + std::to_string(c.activation_min_gap);
  else if (c.activation_min_gap > 0)
    act = "every eligible activation group";
  if (!act.empty() && c.activation_tenths < 10)
    act += " (" + std::to_string(c.activation_tenths) + "/10 of each group's layers)";
  std::string out = opt.empty() && act.empty() ? "no swap" : opt.empty() ? act : act.empty() ? opt : opt + " + " + act;
  if (c.recompute != recompute_kind::none)
    out = recompute_title(c.recompute) + (opt.empty() && act.empty() ? std::string() : " + " + out);
  return out;
}

} // namespace detail

/// "optimizer swap (packed, 16 batches) + activation groups with gap >= 9", "no swap", "full
/// recomputation + optimizer swap (...)", "distributed optimizer + ...", "per rank: 0: ...; 1-7: ...".
inline std::string describe(swap_choice const& c) {
  std::string out;
  if (c.ranks.empty()) {
    out = detail::describe_one(c.on(0), c);
  } else {
    out = "per rank: ";
    for (std::size_t r = 0; r < c.ranks.size();) {
      std::size_t e = r;
      while (e + 1 < c.ranks.size() && c.ranks[e + 1] == c.ranks[r]) ++e;
      out += (r ? "; " : "") + std::to_string(r) + (e > r ? "-" + std::to_string(e) : "") + ": " +
             detail::describe_one(c.ranks[r], c);
      r = e + 1;
    }
  }
  return c.distributed_optimizer ? "distributed optimizer + " + out : out;
}

/// What the planner keeps of one simulation.
struct plan_outcome {
  mock::sim_time step_ns = 0;
  std::uint64_t peak_bytes = 0; ///< max over ranks
  std::uint32_t peak_rank = 0;  ///< the rank that reaches it
  std::uint64_t h2d_bytes = 0;  ///< per step, all ranks together
  std::uint64_t d2h_bytes = 0;
  std::uint32_t swapped_chunks = 0;      ///< activation groups swapped, all ranks together
  std::vector<std::uint64_t> rank_peaks; ///< per rank (empty: not known; no per-rank mix is tried)
  /// Per rank: host-link bytes (both directions) and the optimizer state's bytes (empty: not known).
  std::vector<std::uint64_t> rank_host_bytes, rank_state_bytes;
  /// A floor no activation swap can take the peak below (0: not known): the largest, over the ranks,
  /// of what stays on the device whatever activations swap (reserved bytes, weights, gradients, and
  /// the optimizer state of a rank that does not swap it).
  std::uint64_t activation_floor = 0;
  /// Per rank: the step time (empty: not known; no per-rank refinement is tried).
  std::vector<mock::sim_time> rank_steps;
  /// With overlap, per rank: the resident share kept, the optimizer batches on the device or in
  /// flight when the step began (of `rank_batches`), the activation load lookahead and offload wait
  /// delay.
  std::vector<std::uint64_t> resident_shares;
  std::vector<std::size_t> prefetched, rank_batches, lookaheads, wait_delays;
  /// The work behind it: simulations run (a sized run counts its sizing and refinements) and
  /// training steps simulated in them.
  std::uint32_t simulations = 0, simulated_steps = 0;
};

/// The candidates: activation levels and optimizer settings.
struct plan_space {
  /// Activation levels besides "none", strictly decreasing gaps (fewest groups first); the last is
  /// normally schedule::min_swap_gap, i.e. every eligible group. Empty when no group is eligible.
  std::vector<std::size_t> gaps = {schedule::min_swap_gap};
  /// Optimizer batch counts to try, in increasing order. A factor of 4 apart: the per-rank
  /// refinement (`refine`) moves a rank's count by a quarter from there, and a step changes little
  /// between neighbouring counts (docs/simulator.md, "The planner").
  std::vector<std::uint32_t> swap_times = {4, 16, 64};
  std::vector<bool> packed = {true, false};
  /// Recomputation settings to weigh (every rank alike; per-rank mixes come after).
  std::vector<recompute_kind> recompute = {recompute_kind::none, recompute_kind::selective, recompute_kind::full};
  /// Distributed-optimizer settings to weigh (plan() offers true only with data parallelism).
  std::vector<bool> distributed_optimizer = {false};
  /// Try a per-rank mix of the simulated candidates.
  bool per_rank = true;
  /// Simulations the per-rank refinement may spend (0: none): from the chosen plan, the slowest
  /// rank's activation level one level either way, the share of each swapped group's layers a
  /// tenth either way, and its optimizer batch count a quarter up or down (within swap_times'
  /// range), greedily while that gives a fitting plan the choice prefers (shorter beyond the
  /// tolerance, or shorter within it and lighter).
  std::size_t refine = 12;
  /// Simulate every uniform candidate (no pruning) before the per-rank mixes and the refinement:
  /// slow, and what the search's choice is checked against (`pipeswap plan --exhaustive`).
  bool exhaustive = false;
  /// The reference of "against no swap": swap nothing with these settings (plan() gives the
  /// scenario's own recomputation and distributed optimizer).
  swap_choice baseline;
  /// Candidates whose step is within this fraction of the fastest fitting one count as equally
  /// fast; among them the fewest host-link bytes, then the lowest peak (below), wins.
  double tolerance = 0.005;
  /// Among those, peaks within these bytes of the lowest count as equally low, and the candidate
  /// that changes fewest of the baseline's settings wins (detail::choose; 0.05 GB by default).
  std::uint64_t peak_resolution = detail::peak_resolution_bytes;

  /// The families: every (recomputation, distributed optimizer) pair.
  [[nodiscard]] std::vector<std::pair<recompute_kind, bool>> families() const {
    return ranges::views::cartesian_product(recompute, distributed_optimizer) |
           ranges::views::transform([](auto const& t) {
             return std::pair{std::get<0>(t), std::get<1>(t)};
           }) |
           ranges::to<std::vector>();
  }

  /// The number of uniform candidates: families × (1 + optimizer settings) × (1 + activation levels).
  [[nodiscard]] std::size_t size() const noexcept {
    return recompute.size() * distributed_optimizer.size() * (1 + swap_times.size() * packed.size()) *
           (1 + gaps.size());
  }
};

/// One simulated candidate and what became of it.
struct considered {
  swap_choice choice;
  plan_outcome outcome;
  bool fits = false;
  /// "chosen", "over budget by ...", "fits, but ... slower than the chosen plan", "fits, within the
  /// tolerance ..., but moves ... more over the host link"
  std::string verdict;
};

struct plan_result {
  std::uint64_t budget_bytes = 0;
  plan_outcome baseline; ///< no swap (plan_space::baseline)
  swap_choice baseline_choice;
  std::optional<swap_choice> chosen;
  plan_outcome chosen_outcome;
  /// The fastest fitting candidate that swaps nothing (recomputation, distributed optimizer only).
  std::optional<swap_choice> best_without_swap;
  plan_outcome best_without_swap_outcome;
  std::vector<considered> simulated; ///< in the order they ran
  std::vector<std::string> skipped;  ///< what was not simulated, and why
  /// The work of the whole plan (plan() fills them): simulations run and training steps simulated,
  /// the candidates', the hazard-checked run's and the alternatives' together.
  std::uint64_t simulations = 0, simulated_steps = 0;
  std::size_t candidates = 0;        ///< plan_space::size()
  double tolerance = 0;              ///< plan_space::tolerance
  std::uint64_t peak_resolution = 0; ///< plan_space::peak_resolution
  /// Lowest peak seen, and where: what to say when nothing fits.
  std::optional<considered> lowest_peak;
  /// What a user weighs against the plan (plan() fills them; search_plan() leaves them empty), and
  /// the verdict among them.
  std::vector<alternative> alternatives;
  std::size_t alternative_none = 0; ///< the index of "no swap" among them
  verdict verdict_line;
};

} // namespace pipeswap::sim
