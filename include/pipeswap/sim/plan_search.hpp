// pipeswap — the swap planner's search: candidates (swap_choice), what a simulation of one gives
// (plan_outcome), the space (plan_space) and search_plan(), independent of the simulator (the tests
// drive it with cost models). sim/plan.hpp runs it on the simulator; sim/plan_format.hpp prints it.
//
// A candidate (swap_choice) sets the knobs: activation recomputation (none, selective, full), the
// distributed optimizer (with data parallelism), which activation groups are swapped (none; only the
// chunks whose backward trails their forward by at least g compute slots; every eligible chunk),
// whether optimizer states are swapped, in how many batches (swap_times) and whether packed, and
// optionally all of it per rank.
//
// The choice: among the simulated candidates that fit the budget, those whose step is within
// plan_space::tolerance of the fastest (0.5 % by default) count as equally fast; of them the plan
// moves the fewest bytes over the host link, then peaks lowest (then is the faster, then the one
// simulated first).
//
// The search runs once per family (a recomputation and a distributed-optimizer setting, every rank
// alike) and simulates few of each family's candidates. It relies on one property of swapping, which
// it states in its explanations rather than hides: (b) within a family, swapping more (optimizer
// state, activation groups) never shortens the step. It does not assume that swapping more
// activation groups lowers the peak: under overlap it can raise it (docs/simulator.md, "The
// planner"), so every activation level of a setting is simulated.
// A family whose step without swap is beyond the tolerance of the fastest plan found is skipped.
// In a family, the optimizer settings are simulated without activation swap: for each packing,
// swap_times are walked upwards and the walk stops when a larger value lowers neither the peak nor
// the step time. Then, in order of their step time without activation swap, each setting that does
// not fit has its activation levels simulated, fewest groups first, until a level's step is beyond
// the tolerance of the fastest plan; the settings stop at the first whose step without activation
// swap is already beyond it.
// Then, per rank: each rank takes the fastest simulated candidate that fits on that rank (its own
// peak within the budget; one optimizer batch setting for all), and the mix is simulated. Last, a
// per-rank refinement (plan_space::refine simulations at most): the slowest rank's activation level
// and optimizer batch count move one step at a time (one level; a quarter more or fewer batches),
// the best step kept while it fits and is faster. Under overlap (b) need not hold — more activation
// swap can free the room for optimizer state — and the refinement's neighbouring levels are what
// find such plans. Beside the chosen plan the result names the best plan without any swap
// (recomputation and the distributed optimizer only), so that what swap buys is explicit.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/error.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/pipeline.hpp>
#include <pipeswap/sim/report.hpp>
#include <pipeswap/sim/scenario_json.hpp>
#include <pipeswap/sim/verdict.hpp>

#include <range/v3/algorithm/all_of.hpp>
#include <range/v3/algorithm/any_of.hpp>
#include <range/v3/algorithm/min_element.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/cartesian_product.hpp>
#include <range/v3/view/filter.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

namespace pipeswap::sim {

/// One candidate of the planner.
struct swap_choice {
  /// 0: no activation swap. schedule::min_swap_gap (4): every eligible group. Larger: only the chunks
  /// whose backward runs at least this many compute slots after their forward.
  std::size_t activation_min_gap = 0;
  bool optimizer = false;
  std::uint32_t swap_times = 16; ///< optimizer batches (when `optimizer`)
  bool packed = true;            ///< packed optimizer pipeline (when `optimizer`)
  recompute_kind recompute = recompute_kind::none; ///< every rank's, unless `ranks` is set
  bool distributed_optimizer = false;

  /// A per-rank plan: each rank's own recomputation, activation level and optimizer swap (then
  /// `activation_min_gap`, `optimizer` and `recompute` above are not used).
  struct rank_choice {
    std::size_t activation_min_gap = 0;
    bool optimizer = false;
    recompute_kind recompute = recompute_kind::none;
    std::uint32_t swap_times = 0; ///< this rank's optimizer batches (0: the plan's swap_times)
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
    return a.activation_min_gap == b.activation_min_gap && a.optimizer == b.optimizer &&
           a.recompute == b.recompute && a.distributed_optimizer == b.distributed_optimizer && a.ranks == b.ranks &&
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
  std::string out = opt.empty() && act.empty() ? "no swap" : opt.empty() ? act : act.empty() ? opt : opt + " + " + act;
  if (c.recompute != recompute_kind::none)
    out = std::string(c.recompute == recompute_kind::full ? "full" : "selective") + " recomputation" +
          (opt.empty() && act.empty() ? std::string() : " + " + out);
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
  std::uint64_t peak_bytes = 0;   ///< max over ranks
  std::uint32_t peak_rank = 0;    ///< the rank that reaches it
  std::uint64_t h2d_bytes = 0;    ///< per step, all ranks together
  std::uint64_t d2h_bytes = 0;
  std::uint32_t swapped_chunks = 0; ///< activation groups swapped, all ranks together
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
};

/// The candidates: activation levels and optimizer settings.
struct plan_space {
  /// Activation levels besides "none", strictly decreasing gaps (fewest groups first); the last is
  /// normally schedule::min_swap_gap, i.e. every eligible group. Empty when no group is eligible.
  std::vector<std::size_t> gaps = {schedule::min_swap_gap};
  /// Optimizer batch counts to try, in increasing order.
  std::vector<std::uint32_t> swap_times = {4, 8, 16, 32, 64};
  std::vector<bool> packed = {true, false};
  /// Recomputation settings to weigh (every rank alike; per-rank mixes come after).
  std::vector<recompute_kind> recompute = {recompute_kind::none, recompute_kind::selective, recompute_kind::full};
  /// Distributed-optimizer settings to weigh (plan() offers true only with data parallelism).
  std::vector<bool> distributed_optimizer = {false};
  /// Try a per-rank mix of the simulated candidates.
  bool per_rank = true;
  /// Simulations the per-rank refinement may spend (0: none): from the chosen plan, the slowest
  /// rank's activation level one level either way and its optimizer batch count a quarter up or
  /// down (within swap_times' range), greedily while that makes the plan faster and it fits.
  std::size_t refine = 8;
  /// The reference of "against no swap": swap nothing with these settings (plan() gives the
  /// scenario's own recomputation and distributed optimizer).
  swap_choice baseline;
  /// Candidates whose step is within this fraction of the fastest fitting one count as equally
  /// fast; among them the fewest host-link bytes, then the lowest peak, wins.
  double tolerance = 0.005;

  /// The families: every (recomputation, distributed optimizer) pair.
  [[nodiscard]] std::vector<std::pair<recompute_kind, bool>> families() const {
    return ranges::views::cartesian_product(recompute, distributed_optimizer) |
           ranges::views::transform([](auto const& t) { return std::pair{std::get<0>(t), std::get<1>(t)}; }) |
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
  std::size_t candidates = 0;        ///< plan_space::size()
  double tolerance = 0;              ///< plan_space::tolerance
  /// Lowest peak seen, and where: what to say when nothing fits.
  std::optional<considered> lowest_peak;
  /// What a user weighs against the plan (plan() fills them; search_plan() leaves them empty), and
  /// the verdict among them.
  std::vector<alternative> alternatives;
  std::size_t alternative_none = 0; ///< the index of "no swap" among them
  verdict verdict_line;
};

namespace detail {

inline std::string plan_gb(std::uint64_t b) { return fmt("%.1f GB", static_cast<double>(b) / 1e9); }

/// "  overlap, per rank: 0: resident 12.3 GB, 9 of 16 batches on the device at the step, loads 2
/// slots ahead; ..." (ranks alike are grouped).
inline std::string overlap_lines(plan_outcome const& c) {
  auto one = [&](std::size_t r) {
    std::string x;
    if (c.rank_batches[r] > 0)
      x = "resident " + plan_gb(c.resident_shares[r]) + ", " + std::to_string(c.prefetched[r]) + " of " +
          std::to_string(c.rank_batches[r]) + " optimizer batches on the device when the step began";
    if (c.lookaheads[r] > 1) x += (x.empty() ? "" : ", ") + std::string("activation loads ") + std::to_string(c.lookaheads[r]) + " slots ahead";
    if (r < c.wait_delays.size() && c.wait_delays[r] > 1)
      x += (x.empty() ? "" : ", ") + std::string("offloads waited ") + std::to_string(c.wait_delays[r]) + " slots after";
    return x.empty() ? std::string("nothing to overlap") : x;
  };
  auto const R = c.resident_shares.size();
  if (R == 0) return {};
  std::string o = "  overlap, per rank: ";
  for (std::size_t r = 0; r < R;) {
    auto const text = one(r);
    std::size_t e = r;
    while (e + 1 < R && one(e + 1) == text) ++e;
    o += (r ? "; " : "") + std::to_string(r) + (e > r ? "-" + std::to_string(e) : "") + ": " + text;
    r = e + 1;
  }
  return o + "\n";
}

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
    throw invalid_argument("plan: swap_times, packed, recompute and distributed_optimizer need at least one value each");
  for (std::size_t i = 0; i < s.swap_times.size(); ++i) {
    if (s.swap_times[i] == 0) throw invalid_argument("plan: swap_times must be positive");
    if (i > 0 && s.swap_times[i] <= s.swap_times[i - 1])
      throw invalid_argument("plan: swap_times must be strictly increasing");
  }
}

} // namespace detail

namespace detail {

/// Bytes over the host link, both directions.
inline std::uint64_t link_bytes(plan_outcome const& o) { return o.h2d_bytes + o.d2h_bytes; }

/// Whether a step of `step` ns is within `tolerance` of the fastest, `fastest` ns.
inline bool within_tolerance(mock::sim_time step, mock::sim_time fastest, double tolerance) {
  return static_cast<double>(step) <= static_cast<double>(fastest) * (1.0 + tolerance);
}

/// The choice among `simulated` (plan_result::simulated): of the candidates that fit, those within
/// `tolerance` of the fastest; of them the fewest host-link bytes, then the lowest peak, then the
/// shortest step, then the first simulated. Returns its index, or none when nothing fits.
inline std::optional<std::size_t> choose(std::vector<considered> const& simulated, double tolerance) {
  std::optional<mock::sim_time> fastest;
  for (auto const& e : simulated)
    if (e.fits && (!fastest || e.outcome.step_ns < *fastest)) fastest = e.outcome.step_ns;
  if (!fastest) return std::nullopt;
  std::optional<std::size_t> best;
  auto key = [](plan_outcome const& o) { return std::tuple{link_bytes(o), o.peak_bytes, o.step_ns}; };
  for (std::size_t i = 0; i < simulated.size(); ++i) {
    auto const& e = simulated[i];
    if (!e.fits || !within_tolerance(e.outcome.step_ns, *fastest, tolerance)) continue;
    if (!best || key(e.outcome) < key(simulated[*best].outcome)) best = i;
  }
  return best;
}

/// What a fitting candidate's figures say against the chosen plan's (`c`), the fastest step being
/// `fastest`: slower beyond the tolerance, or within it and what it costs more.
inline std::string verdict_against(plan_outcome const& e, plan_outcome const& c, mock::sim_time fastest,
                                   double tolerance) {
  auto const pct = percent(overhead(e.step_ns, c.step_ns));
  auto const tol = fmt("%.2f %%", tolerance * 100);
  if (!within_tolerance(e.step_ns, fastest, tolerance))
    return "fits, but " + pct + " slower than the chosen plan (beyond the " + tol + " tolerance)";
  std::string const head = "fits, within the " + tol + " tolerance (" + pct + " against the chosen plan), but ";
  if (link_bytes(e) != link_bytes(c))
    return head + "moves " + plan_gb(link_bytes(e) - link_bytes(c)) + " more over the host link";
  if (e.peak_bytes != c.peak_bytes)
    return head + "moves as many bytes and peaks " + plan_gb(e.peak_bytes - c.peak_bytes) + " higher";
  if (e.step_ns != c.step_ns) return head + "moves as many bytes, peaks as high and is slower";
  return "fits, within the " + tol + " tolerance, with the chosen plan's step, bytes and peak (simulated after it)";
}

} // namespace detail

/// Searches `space` for the plan whose peak is at most `budget` bytes (see the header comment for the
/// rules: the fastest within the tolerance, then the fewest host-link bytes, then the lowest peak),
/// calling `evaluate(choice) -> plan_outcome` (a simulation) for the candidates it needs.
/// `progress(done, bound)` is called before each simulation with the number done and an upper bound
/// of the number the search can need.
template <class Evaluate>
  requires std::is_invocable_r_v<plan_outcome, Evaluate&, swap_choice const&>
plan_result search_plan(plan_space const& space, std::uint64_t budget, Evaluate&& evaluate,
                        std::function<void(std::size_t, std::size_t)> const& progress = {}) {
  detail::check_space(space);
  plan_result res;
  res.budget_bytes = budget;
  res.candidates = space.size();
  res.tolerance = space.tolerance;
  std::size_t const levels = space.gaps.size();
  std::size_t const settings = space.swap_times.size() * space.packed.size();
  auto const families = space.families();
  std::size_t const mixes = space.per_rank ? 3 * space.distributed_optimizer.size() : 0;
  std::size_t const bound = std::min(res.candidates, families.size() * (settings + 1) * (levels + 1)) + mixes + 1 +
                            (space.per_rank ? space.refine : 0);
  auto fits = [&](plan_outcome const& o) { return o.peak_bytes <= budget; };
  std::optional<mock::sim_time> fastest; // the fastest fitting step so far
  // Whether a step can still be among the equally fast (within the tolerance of the fastest).
  auto in_reach = [&](mock::sim_time step) {
    return !fastest || detail::within_tolerance(step, *fastest, space.tolerance);
  };
  auto const reach_text = [&] {
    return "the tolerance (" + detail::fmt("%.2f %%", space.tolerance * 100) + ") of the fastest plan found (" +
           detail::secs(*fastest) + ")";
  };

  auto run = [&](swap_choice const& c) -> plan_outcome {
    for (auto const& e : res.simulated)
      if (e.choice == c) return e.outcome;
    if (progress) progress(res.simulated.size(), std::max(bound, res.simulated.size() + 1));
    plan_outcome const o = evaluate(c);
    res.simulated.push_back({c, o, fits(o), {}});
    if (!res.lowest_peak || o.peak_bytes < res.lowest_peak->outcome.peak_bytes) res.lowest_peak = res.simulated.back();
    if (fits(o) && (!fastest || o.step_ns < *fastest)) fastest = o.step_ns;
    return o;
  };
  auto at_level = [&](swap_choice c, std::size_t level) {
    c.activation_min_gap = level == 0 ? 0 : space.gaps[level - 1];
    return c;
  };
  auto update_choice = [&] {
    if (auto const i = detail::choose(res.simulated, space.tolerance)) {
      res.chosen = res.simulated[*i].choice;
      res.chosen_outcome = res.simulated[*i].outcome;
    }
  };

  res.baseline = run(space.baseline);
  res.baseline_choice = space.baseline;

  // First, every family's settings without activation swap: its step without swap, then the
  // optimizer settings (for each packing, swap_times walked upwards). A family whose step without
  // swap is beyond the tolerance of the fastest plan found so far is skipped.
  struct setting {
    swap_choice choice;
    plan_outcome outcome;
  };
  std::vector<setting> list;
  for (auto const& fam : families) { // named, not bound: clang 14 cannot capture a structured binding
    auto const rc = fam.first;
    auto const dist = fam.second;
    swap_choice family;
    family.recompute = rc;
    family.distributed_optimizer = dist;
    plan_outcome const family_base = run(family);
    if (!dist && std::find(space.distributed_optimizer.begin(), space.distributed_optimizer.end(), true) !=
                     space.distributed_optimizer.end()) {
      // Its twin with the distributed optimizer shards the same state over dp: when that is no
      // slower and peaks no higher without swap, it is with any swap too (the swaps move only the
      // shard, the step updates only the shard), so this family's swaps are not searched.
      auto twin = family;
      twin.distributed_optimizer = true;
      plan_outcome const t = run(twin);
      if (t.step_ns <= family_base.step_ns && t.peak_bytes <= family_base.peak_bytes) {
        res.skipped.push_back(describe(family) + " with swap: not searched, the distributed optimizer with the same "
                              "recomputation is no slower without swap (" + detail::secs(t.step_ns) + " against " +
                              detail::secs(family_base.step_ns) + ") and peaks lower, and its swaps move only the shard");
        continue;
      }
    }
    if (!in_reach(family_base.step_ns)) {
      res.skipped.push_back(describe(family) + " with any swap: not searched, its step without swap (" +
                            detail::secs(family_base.step_ns) + ") is already beyond " + reach_text() +
                            " and swapping only adds time");
      continue;
    }
    list.push_back({family, family_base});
    if (fits(family_base)) {
      // It moves nothing over the host link; by (b) every swap of the family is no faster and moves
      // more, so none of them can be chosen over it.
      res.skipped.push_back(describe(family) + " with swap: not searched, the family fits without swap (" +
                            detail::secs(family_base.step_ns) + ", 0 bytes over the host link) and swapping "
                            "only adds time and bytes");
      continue;
    }
    for (bool packed : space.packed) {
      std::optional<plan_outcome> prev;
      for (std::size_t i = 0; i < space.swap_times.size(); ++i) {
        swap_choice c = family;
        c.optimizer = true;
        c.swap_times = space.swap_times[i];
        c.packed = packed;
        plan_outcome const o = run(c);
        list.push_back({c, o});
        if (prev && o.peak_bytes >= prev->peak_bytes && o.step_ns >= prev->step_ns && i + 1 < space.swap_times.size()) {
          std::string rest;
          for (std::size_t k = i + 1; k < space.swap_times.size(); ++k)
            rest += (k > i + 1 ? ", " : "") + std::to_string(space.swap_times[k]);
          res.skipped.push_back((family == swap_choice{} ? std::string() : describe(family) + ", ") +
                                "optimizer swap (" + std::string(packed ? "packed" : "per tensor") +
                                ") with swap_times " + rest + ": " + std::to_string(space.swap_times[i]) +
                                " batches lowered neither the peak nor the step time of " +
                                std::to_string(space.swap_times[i - 1]) + ", so more batches are not tried");
          break;
        }
        prev = o;
      }
    }
  }
  std::stable_sort(list.begin(), list.end(),
                   [](setting const& a, setting const& b) { return a.outcome.step_ns < b.outcome.step_ns; });

  // Then, fastest setting first (of every family), every activation level of each setting that does
  // not fit, fewest groups first, until a level's step leaves the tolerance of the fastest plan.
  for (std::size_t si = 0; si < list.size(); ++si) {
    auto const& choice = list[si].choice;
    auto const& o0 = list[si].outcome;
    if (!in_reach(o0.step_ns)) {
      for (std::size_t k = si; k < list.size(); ++k)
        if (!fits(list[k].outcome))
          res.skipped.push_back(describe(list[k].choice) + " with activation swap: not searched, its step without "
                                "activation swap (" + detail::secs(list[k].outcome.step_ns) + ") is already beyond " +
                                reach_text() + " and swapping activations only adds time");
      break;
    }
    if (fits(o0) || levels == 0) continue; // fits already, or nothing to swap
    if (o0.activation_floor > budget) {
      res.skipped.push_back(describe(choice) + " with activation swap: not simulated, what no activation swap "
                            "moves (weights, gradients, the optimizer state it keeps, reserved bytes) already "
                            "needs " + detail::plan_gb(o0.activation_floor) + " on a rank");
      continue;
    }
    for (std::size_t level = 1; level <= levels; ++level) {
      plan_outcome const o = run(at_level(choice, level));
      if (!in_reach(o.step_ns) && level < levels) {
        res.skipped.push_back(describe(choice) + " with activation gaps below " + std::to_string(space.gaps[level - 1]) +
                              ": not simulated, gap " + std::to_string(space.gaps[level - 1]) + " is already beyond " +
                              reach_text() + " and swapping more groups only adds time");
        break;
      }
    }
  }
  update_choice();

  // Per rank: each rank takes the fastest simulated uniform candidate that fits on it, within one
  // distributed-optimizer setting and one optimizer batch setting (the two best of those).
  if (space.per_rank) {
    for (bool dist : space.distributed_optimizer) {
      auto pool = res.simulated | ranges::views::filter([&](considered const& e) {
                    return e.choice.ranks.empty() && e.choice.distributed_optimizer == dist &&
                           !e.outcome.rank_peaks.empty();
                  }) |
                  ranges::to<std::vector>();
      if (pool.empty()) continue;
      auto const R = pool.front().outcome.rank_peaks.size();
      // Optimizer batch settings, fastest first.
      std::vector<std::pair<mock::sim_time, std::pair<std::uint32_t, bool>>> opt_settings;
      for (auto const& e : pool)
        if (e.choice.optimizer) opt_settings.push_back({e.outcome.step_ns, {e.choice.swap_times, e.choice.packed}});
      std::sort(opt_settings.begin(), opt_settings.end());
      std::vector<std::pair<std::uint32_t, bool>> tried;
      for (auto const& [_, st] : opt_settings)
        if (std::find(tried.begin(), tried.end(), st) == tried.end() && tried.size() < 2) tried.push_back(st);
      if (tried.empty()) tried.push_back({space.swap_times.front(), space.packed.front()});
      // Then each rank's own batch count too, within the best packing (swap_times 0 below).
      if (!opt_settings.empty()) tried.push_back({0, tried.front().second});
      for (auto const& tp : tried) {
        auto const times = tp.first;
        auto const packed = tp.second;
        auto usable = pool | ranges::views::filter([&](considered const& e) {
                        return !e.choice.optimizer ||
                               ((times == 0 || e.choice.swap_times == times) && e.choice.packed == packed);
                      }) |
                      ranges::to<std::vector>();
        swap_choice mix;
        mix.distributed_optimizer = dist;
        mix.swap_times = times ? times : tried.front().first;
        mix.packed = packed;
        bool complete = true;
        for (std::size_t r : ranges::views::iota(std::size_t{0}, R)) {
          auto fitting = usable | ranges::views::filter([&](considered const& e) { return e.outcome.rank_peaks[r] <= budget; });
          auto const best = ranges::min_element(fitting, {}, [](considered const& e) { return e.outcome.step_ns; });
          if (best == ranges::end(fitting)) {
            complete = false;
            break;
          }
          mix.ranks.push_back(best->choice.on(static_cast<std::uint32_t>(r)));
          if (times == 0 && best->choice.optimizer && best->choice.swap_times != mix.swap_times)
            mix.ranks.back().swap_times = best->choice.swap_times;
        }
        if (!complete || mix.ranks.empty() ||
            ranges::all_of(mix.ranks, [&](auto const& x) { return x == mix.ranks.front(); })) {
          continue; // a rank fits nowhere, or the mix is a uniform candidate already simulated
        }
        run(mix);
      }
    }
  }
  update_choice();

  // Per-rank refinement: the step is the slowest rank's, so move that rank's own settings one step
  // at a time, scored by the simulation (which sees what a rank's swap does to the others through
  // the pipeline and the shared host link).
  if (space.per_rank && space.refine > 0 && res.chosen && !res.chosen->swap_free() &&
      !res.chosen_outcome.rank_steps.empty()) {
    swap_choice cur = *res.chosen;
    plan_outcome cur_o = res.chosen_outcome;
    auto const R = cur_o.rank_steps.size();
    if (cur.ranks.empty()) {
      auto const uniform = cur.on(0);
      cur.ranks.assign(R, uniform);
    }
    std::vector<std::size_t> act_levels{0}; // fewest groups first
    act_levels.insert(act_levels.end(), space.gaps.begin(), space.gaps.end());
    std::size_t spent = 0;
    while (spent < space.refine) {
      auto const slowest = static_cast<std::size_t>(
          std::max_element(cur_o.rank_steps.begin(), cur_o.rank_steps.end()) - cur_o.rank_steps.begin());
      auto const here = cur.ranks.at(slowest);
      std::vector<swap_choice> steps;
      auto with = [&](swap_choice::rank_choice x) {
        swap_choice n = cur;
        n.ranks[slowest] = x;
        steps.push_back(std::move(n));
      };
      auto const li = static_cast<std::size_t>(std::find(act_levels.begin(), act_levels.end(), here.activation_min_gap) -
                                               act_levels.begin());
      if (li < act_levels.size()) {
        for (std::size_t j : {li + 1, li - 1}) // one level more groups, one fewer
          if (j < act_levels.size()) {
            auto x = here;
            x.activation_min_gap = act_levels[j];
            with(x);
          }
      }
      if (here.optimizer) {
        // A quarter more batches, a quarter fewer, within the space's range.
        auto const t = here.swap_times ? here.swap_times : cur.swap_times;
        for (std::uint32_t u : {t + std::max<std::uint32_t>(1, t / 4), t - std::max<std::uint32_t>(1, t / 4)})
          if (u != t && u >= space.swap_times.front() && u <= space.swap_times.back()) {
            auto x = here;
            x.swap_times = u == cur.swap_times ? 0 : u;
            with(x);
          }
      }
      std::optional<std::pair<swap_choice, plan_outcome>> best_step;
      for (auto const& n : steps) {
        if (spent >= space.refine) break;
        auto const before = res.simulated.size();
        plan_outcome const o = run(n);
        spent += res.simulated.size() - before;
        // Only a strictly shorter step moves the refinement on (every simulated plan is weighed below).
        if (o.rank_steps.size() != R || !fits(o) || o.step_ns >= cur_o.step_ns) continue;
        if (!best_step || o.step_ns < best_step->second.step_ns) best_step = {n, o};
      }
      if (!best_step) break; // no single step of the slowest rank's settings makes the plan faster
      cur = std::move(best_step->first);
      cur_o = std::move(best_step->second);
    }
    if (spent == space.refine)
      res.skipped.push_back("per-rank refinement: stopped after " + std::to_string(spent) +
                            " simulations (plan_space::refine); further steps of the slowest rank's settings were not tried");
  }
  update_choice();

  for (auto const& e : res.simulated) {
    if (!e.fits || !e.choice.swap_free()) continue;
    if (!res.best_without_swap || e.outcome.step_ns < res.best_without_swap_outcome.step_ns) {
      res.best_without_swap = e.choice;
      res.best_without_swap_outcome = e.outcome;
    }
  }

  for (auto& e : res.simulated) {
    if (res.chosen && e.choice == *res.chosen) e.verdict = "chosen";
    else if (!e.fits)
      e.verdict = "over budget by " + detail::plan_gb(e.outcome.peak_bytes - budget) + " on rank " +
                  std::to_string(e.outcome.peak_rank);
    else
      e.verdict = detail::verdict_against(e.outcome, res.chosen_outcome, *fastest, space.tolerance);
  }
  return res;
}

} // namespace pipeswap::sim
