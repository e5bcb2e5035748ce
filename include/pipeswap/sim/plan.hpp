// pipeswap — the swap planner: given a scenario and a device-memory budget, choose what to swap so
// that every rank fits the budget at the lowest simulated step time. What `pipeswap plan` runs.
//
// A candidate (swap_choice) sets the knobs: activation recomputation (none, selective, full), the
// distributed optimizer (with data parallelism), which activation groups are swapped (none; only the
// chunks whose backward trails their forward by at least g compute slots; every eligible chunk),
// whether optimizer states are swapped, in how many batches (swap_times) and whether packed, and
// optionally all of it per rank.
//
// The search (search_plan) runs once per family (a recomputation and a distributed-optimizer
// setting, every rank alike) and simulates few of each family's candidates. It relies on two
// properties of swapping, which it states in its explanations rather than hides:
//   (a) swapping more activation groups never raises the peak, and
//   (b) never shortens the step.
// First the optimizer settings are simulated without activation swap: for each packing, swap_times
// are walked upwards and the walk stops when a larger value lowers neither the peak nor the step
// time. Then, in order of their step time without activation swap, each setting that does not fit
// gets the least activation swap that makes it fit, found by binary search over the activation
// levels (cut short once a probe is over budget and already no faster than the best plan); the
// search stops at the first setting that is already no faster than the best plan.
// Then, per rank: each rank takes the fastest simulated candidate that fits on that rank (its own
// peak within the budget; one optimizer batch setting for all), and the mix is simulated; it is
// chosen when it fits and is faster. Last, a per-rank refinement (plan_space::refine simulations at
// most): the slowest rank's activation level and optimizer batch count move one step at a time
// (one level; a quarter more or fewer batches), the best step kept while it fits and is faster. Under overlap (b) need not hold — more activation swap can free the room for optimizer
// state — and the refinement's neighbouring levels are what find such plans. Beside the chosen plan
// the result names the best plan without any swap (recomputation and the distributed optimizer
// only), so that what swap buys is explicit.
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
  std::vector<rank_choice> ranks;

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
  std::string verdict; ///< "chosen", "over budget by ...", "fits, but ... slower than the chosen plan"
};

struct plan_result {
  std::uint64_t budget_bytes = 0;
  plan_outcome baseline; ///< no swap
  std::optional<swap_choice> chosen;
  plan_outcome chosen_outcome;
  /// The fastest fitting candidate that swaps nothing (recomputation, distributed optimizer only).
  std::optional<swap_choice> best_without_swap;
  plan_outcome best_without_swap_outcome;
  std::vector<considered> simulated; ///< in the order they ran
  std::vector<std::string> skipped;  ///< what was not simulated, and why
  std::size_t candidates = 0;        ///< plan_space::size()
  /// Lowest peak seen, and where: what to say when nothing fits.
  std::optional<considered> lowest_peak;
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
  if (s.swap_times.empty() || s.packed.empty() || s.recompute.empty() || s.distributed_optimizer.empty())
    throw invalid_argument("plan: swap_times, packed, recompute and distributed_optimizer need at least one value each");
  for (std::size_t i = 0; i < s.swap_times.size(); ++i) {
    if (s.swap_times[i] == 0) throw invalid_argument("plan: swap_times must be positive");
    if (i > 0 && s.swap_times[i] <= s.swap_times[i - 1])
      throw invalid_argument("plan: swap_times must be strictly increasing");
  }
}

} // namespace detail

/// Searches `space` for the fastest candidate whose peak is at most `budget` bytes, calling
/// `evaluate(choice) -> plan_outcome` (a simulation) for the candidates it needs; see the header
/// comment for the rules. `progress(done, bound)` is called before each simulation with the number
/// done and an upper bound of the number the search can need.
template <class Evaluate>
  requires std::is_invocable_r_v<plan_outcome, Evaluate&, swap_choice const&>
plan_result search_plan(plan_space const& space, std::uint64_t budget, Evaluate&& evaluate,
                        std::function<void(std::size_t, std::size_t)> const& progress = {}) {
  detail::check_space(space);
  plan_result res;
  res.budget_bytes = budget;
  res.candidates = space.size();
  std::size_t const levels = space.gaps.size();
  std::size_t const settings = space.swap_times.size() * space.packed.size();
  std::size_t const per_setting = levels == 0 ? 1 : 2 + static_cast<std::size_t>(std::bit_width(levels));
  auto const families = space.families();
  std::size_t const mixes = space.per_rank ? 3 * space.distributed_optimizer.size() : 0;
  std::size_t const bound =
      std::min(res.candidates, families.size() * (settings + 1) * per_setting) + mixes + 1 + (space.per_rank ? space.refine : 0);
  auto fits = [&](plan_outcome const& o) { return o.peak_bytes <= budget; };

  auto run = [&](swap_choice const& c) -> plan_outcome {
    for (auto const& e : res.simulated)
      if (e.choice == c) return e.outcome;
    if (progress) progress(res.simulated.size(), std::max(bound, res.simulated.size() + 1));
    plan_outcome const o = evaluate(c);
    res.simulated.push_back({c, o, fits(o), {}});
    if (!res.lowest_peak || o.peak_bytes < res.lowest_peak->outcome.peak_bytes) res.lowest_peak = res.simulated.back();
    return o;
  };
  auto at_level = [&](swap_choice c, std::size_t level) {
    c.activation_min_gap = level == 0 ? 0 : space.gaps[level - 1];
    return c;
  };
  // Better: faster; on a tie, fewer bytes moved, then a lower peak.
  auto better = [](plan_outcome const& a, plan_outcome const& b) {
    if (a.step_ns != b.step_ns) return a.step_ns < b.step_ns;
    if (a.h2d_bytes + a.d2h_bytes != b.h2d_bytes + b.d2h_bytes) return a.h2d_bytes + a.d2h_bytes < b.h2d_bytes + b.d2h_bytes;
    return a.peak_bytes < b.peak_bytes;
  };
  auto consider = [&](swap_choice const& c, plan_outcome const& o) {
    if (fits(o) && (!res.chosen || better(o, res.chosen_outcome))) {
      res.chosen = c;
      res.chosen_outcome = o;
    }
  };

  res.baseline = run(swap_choice{});

  auto search_family = [&](swap_choice const& family) {
  plan_outcome const family_base = run(family);
  consider(family, family_base);

  // Optimizer settings without activation swap: walk swap_times upwards for each packing.
  struct setting {
    swap_choice choice;
    plan_outcome outcome;
  };
  std::vector<setting> list{{family, family_base}};
  for (bool packed : space.packed) {
    std::optional<plan_outcome> prev;
    for (std::size_t i = 0; i < space.swap_times.size(); ++i) {
      swap_choice c = family;
      c.optimizer = true;
      c.swap_times = space.swap_times[i];
      c.packed = packed;
      plan_outcome const o = run(c);
      list.push_back({c, o});
      consider(c, o);
      if (prev && o.peak_bytes >= prev->peak_bytes && o.step_ns >= prev->step_ns && i + 1 < space.swap_times.size()) {
        std::string rest;
        for (std::size_t k = i + 1; k < space.swap_times.size(); ++k)
          rest += (k > i + 1 ? ", " : "") + std::to_string(space.swap_times[k]);
        res.skipped.push_back((family == swap_choice{} ? std::string() : describe(family) + ", ") + "optimizer swap (" +
                              std::string(packed ? "packed" : "per tensor") +
                              ") with swap_times " + rest + ": " + std::to_string(space.swap_times[i]) +
                              " batches lowered neither the peak nor the step time of " +
                              std::to_string(space.swap_times[i - 1]) + ", so more batches are not tried");
        break;
      }
      prev = o;
    }
  }
  std::stable_sort(list.begin(), list.end(),
                   [](setting const& a, setting const& b) { return a.outcome.step_ns < b.outcome.step_ns; });

  // Then, fastest setting first, the least activation swap that makes each setting fit.
  for (std::size_t si = 0; si < list.size(); ++si) {
    auto const& [choice, o0] = list[si];
    if (res.chosen && res.chosen_outcome.step_ns <= o0.step_ns) {
      for (std::size_t k = si; k < list.size(); ++k)
        if (!fits(list[k].outcome))
          res.skipped.push_back(describe(list[k].choice) + " with activation swap: not searched, its step without "
                                "activation swap (" + detail::secs(list[k].outcome.step_ns) + ") is already no "
                                "faster than the chosen plan (" + detail::secs(res.chosen_outcome.step_ns) +
                                ") and swapping activations only adds time");
      break;
    }
    if (fits(o0) || levels == 0) continue; // fits already (considered above), or nothing to swap
    plan_outcome const top = run(at_level(choice, levels));
    if (!fits(top)) continue; // over budget even with every eligible group swapped
    std::size_t lo = 1, hi = levels;
    plan_outcome at_hi = top;
    while (lo < hi) {
      std::size_t const mid = (lo + hi) / 2;
      plan_outcome const o = run(at_level(choice, mid));
      if (fits(o)) {
        hi = mid;
        at_hi = o;
      } else {
        lo = mid + 1;
        if (res.chosen && o.step_ns >= res.chosen_outcome.step_ns && lo < hi) {
          res.skipped.push_back(describe(choice) + " with activation gaps between " +
                                std::to_string(space.gaps[hi - 1]) + " and " + std::to_string(space.gaps[lo - 1]) +
                                ": not simulated, gap " + std::to_string(space.gaps[mid - 1]) +
                                " is over budget and already no faster than the chosen plan; swapping more "
                                "groups only adds time");
          break;
        }
      }
    }
    consider(at_level(choice, hi), at_hi);
  }
  };

  for (auto const& [rc, dist] : families) {
    swap_choice f;
    f.recompute = rc;
    f.distributed_optimizer = dist;
    search_family(f);
  }

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
      for (auto const& [times, packed] : tried) {
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
        consider(mix, run(mix));
      }
    }
  }

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
        // Only a strictly shorter step moves the plan (a per-rank plan is never chosen for bytes alone).
        if (o.rank_steps.size() != R || !fits(o) || o.step_ns >= cur_o.step_ns) continue;
        consider(n, o);
        if (!best_step || better(o, best_step->second)) best_step = {n, o};
      }
      if (!best_step) break; // no single step of the slowest rank's settings makes the plan faster
      cur = std::move(best_step->first);
      cur_o = std::move(best_step->second);
    }
    if (spent == space.refine)
      res.skipped.push_back("per-rank refinement: stopped after " + std::to_string(spent) +
                            " simulations (plan_space::refine); further steps of the slowest rank's settings were not tried");
  }

  for (auto const& e : res.simulated) {
    if (!e.fits || !e.choice.swap_free()) continue;
    if (!res.best_without_swap || better(e.outcome, res.best_without_swap_outcome)) {
      res.best_without_swap = e.choice;
      res.best_without_swap_outcome = e.outcome;
    }
  }

  for (auto& e : res.simulated) {
    if (res.chosen && e.choice == *res.chosen) e.verdict = "chosen";
    else if (!e.fits)
      e.verdict = "over budget by " + detail::plan_gb(e.outcome.peak_bytes - budget) + " on rank " +
                  std::to_string(e.outcome.peak_rank);
    else if (e.outcome.step_ns > res.chosen_outcome.step_ns)
      e.verdict = "fits, but " + detail::percent(overhead(e.outcome.step_ns, res.chosen_outcome.step_ns)) +
                  " slower than the chosen plan";
    else
      e.verdict = "fits and is as fast as the chosen plan, which moves fewer bytes or peaks lower";
  }
  return res;
}

/// The per-rank orders the simulator runs for `p` (the schedule layer's generators).
inline schedule::rank_orders pipeline_orders(pipeline_spec const& p) {
  auto const R = static_cast<schedule::index_type>(p.ranks), M = static_cast<schedule::index_type>(p.micro_batches);
  switch (p.schedule) {
  case schedule_kind::gpipe: return schedule::gpipe(R, M);
  case schedule_kind::one_f_one_b: return schedule::one_f_one_b(R, M);
  case schedule_kind::interleaved:
    return schedule::interleaved_1f1b({R, static_cast<schedule::index_type>(p.chunks), M, p.overlap_b_f});
  }
  throw invalid_argument("pipeline.schedule is not a known kind");
}

/// For each rank, the forward-to-backward gap (in compute slots) of every chunk injection would swap.
struct activation_gaps {
  std::vector<std::map<schedule::chunk, std::size_t>> per_rank;

  [[nodiscard]] std::size_t gap(std::uint32_t rank, schedule::chunk c) const {
    if (rank >= per_rank.size()) return 0;
    auto const it = per_rank[rank].find(c);
    return it == per_rank[rank].end() ? 0 : it->second;
  }
};

inline activation_gaps gaps_of(pipeline_spec const& p) {
  activation_gaps g;
  for (auto const& o : pipeline_orders(p)) {
    auto& m = g.per_rank.emplace_back();
    for (auto const& c : schedule::swap_candidates(o)) m[c.key] = c.gap();
  }
  return g;
}

/// At most `most` activation levels (gap thresholds, decreasing) that spread the number of swapped
/// groups evenly; the last is schedule::min_swap_gap (every eligible group). Empty if none is eligible.
inline std::vector<std::size_t> gap_levels(activation_gaps const& g, std::size_t most = 8) {
  std::map<std::size_t, std::size_t, std::greater<>> count; // gap -> groups with exactly that gap
  std::size_t total = 0;
  for (auto const& r : g.per_rank)
    for (auto const& [c, gap] : r) ++count[gap], ++total;
  std::vector<std::size_t> out;
  if (total == 0) return out;
  std::size_t acc = 0, next = 1;
  most = std::max<std::size_t>(most, 1);
  for (auto const& [gap, n] : count) {
    acc += n;
    if (acc * most >= next * total) { // reached the next share of the groups
      out.push_back(gap);
      while (next * total <= acc * most) ++next;
    }
  }
  out.back() = schedule::min_swap_gap; // the last level swaps every eligible group, with no filter
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// The simulator options of a candidate. Without optimizer swap the simulator still runs the
/// optimizer step in batches (kept on the device); they follow `unswapped`, the scenario's swap
/// settings, so that "no swap" here is the "no swap" of run_report().
inline sim_options options_for(swap_choice const& c, std::shared_ptr<activation_gaps const> gaps,
                               swap_spec const& unswapped = {}) {
  sim_options o;
  o.swap_activations = c.any_activation();
  if (!c.ranks.empty()) {
    std::vector<std::size_t> per_rank;
    for (auto const& r : c.ranks) {
      per_rank.push_back(r.activation_min_gap);
      o.recompute.push_back(r.recompute);
      o.optimizer_ranks.push_back(r.optimizer);
      o.ranks.emplace_back();
      if (r.optimizer && r.swap_times) o.ranks.back().swap_times = r.swap_times;
    }
    o.activation_filter = [gaps = std::move(gaps), per_rank](std::uint32_t rank, schedule::chunk ch) {
      auto const g = rank < per_rank.size() ? per_rank[rank] : 0;
      return g > 0 && (g <= schedule::min_swap_gap || gaps->gap(rank, ch) >= g);
    };
  } else if (c.activation_min_gap > schedule::min_swap_gap) {
    o.activation_filter = [gaps = std::move(gaps), g = c.activation_min_gap](std::uint32_t rank, schedule::chunk ch) {
      return gaps->gap(rank, ch) >= g;
    };
  }
  if (c.ranks.empty() && c.recompute != recompute_kind::none) o.recompute.assign(gaps ? gaps->per_rank.size() : 0, c.recompute);
  o.swap_optimizer = c.any_optimizer();
  o.swap_times = c.any_optimizer() ? c.swap_times : unswapped.swap_times;
  o.packed = c.any_optimizer() ? c.packed : unswapped.packed;
  o.overlap = unswapped.overlap;
  return o;
}

/// The scenario a candidate runs: `s` with the candidate's distributed-optimizer setting and, for a
/// uniform candidate, its recomputation.
inline scenario scenario_for(swap_choice const& c, scenario s) {
  s.parallel.distributed_optimizer = c.distributed_optimizer;
  if (c.ranks.empty()) s.model.recompute = c.recompute;
  return s;
}

/// What the planner keeps of a simulation.
inline plan_outcome outcome_of(sim_result const& r) {
  plan_outcome o;
  o.step_ns = r.step_ns;
  o.peak_bytes = r.peak_bytes;
  o.peak_rank = highest_peak_rank(r);
  for (auto const& x : r.ranks) {
    o.h2d_bytes += x.h2d_bytes;
    o.d2h_bytes += x.d2h_bytes;
    o.swapped_chunks += x.swapped_chunks;
    o.rank_peaks.push_back(x.peak_bytes);
    o.rank_steps.push_back(x.step_ns);
    o.resident_shares.push_back(x.resident_share_bytes);
    o.prefetched.push_back(x.prefetched_batches);
    o.rank_batches.push_back(x.optimizer_batches);
    o.lookaheads.push_back(x.load_lookahead);
    o.wait_delays.push_back(x.offload_wait_delay);
  }
  return o;
}

/// Plans `s` for a budget of `budget` bytes per device, simulating candidates with sim::simulate.
/// `progress(fraction)` is called now and then. Throws invalid_argument for a bad scenario.
/// `space.gaps` comes from the scenario's schedule; `space.distributed_optimizer` is {false, true}
/// with data parallelism (unless `space` was given with other values), and recomputation the
/// space's list. A scenario with device.end_to_end_mfu is calibrated first.
inline plan_result plan(scenario const& given, std::uint64_t budget, std::function<void(double)> const& progress = {},
                        std::optional<plan_space> given_space = std::nullopt) {
  validate(given);
  auto const s = calibrated(given);
  auto const gaps = std::make_shared<activation_gaps const>(gaps_of(s.pipeline));
  plan_space space = given_space.value_or(plan_space{});
  if (!given_space && s.parallel.dp > 1) space.distributed_optimizer = {false, true};
  space.gaps = gap_levels(*gaps);
  double done = 0, bound = 1;
  auto evaluate = [&](swap_choice const& c) {
    auto o = options_for(c, gaps, s.swap);
    auto sc = scenario_for(c, s);
    // The overlap sizes each rank's resident share and prefetch against the budget, not the device.
    if (o.overlap && budget > sc.device.reserved_bytes) sc.device.memory_bytes = std::min(sc.device.memory_bytes, budget);
    if (o.overlap && o.swap_activations) set_load_lookaheads(o, sc);
    if (progress) o.progress = [&](double f) { progress(std::min(1.0, (done + f) / bound)); };
    return outcome_of(simulate_sized(sc, o));
  };
  return search_plan(space, budget, evaluate, [&](std::size_t d, std::size_t b) {
    done = static_cast<double>(d);
    bound = static_cast<double>(b);
    if (progress) progress(done / bound);
  });
}

/// The plan as text: the choice, what it costs, what else was simulated and what was skipped.
inline std::string format_plan(plan_result const& r, scenario const& s) {
  using detail::pad;
  using detail::plan_gb;
  using detail::secs;
  std::string o = "scenario: " + describe(s) + "\nbudget: " + plan_gb(r.budget_bytes) + " per device\n";
  o += "no swap: step " + secs(r.baseline.step_ns) + ", peak " + plan_gb(r.baseline.peak_bytes) + " on rank " +
       std::to_string(r.baseline.peak_rank) + "\n\n";
  if (r.chosen) {
    auto const& c = r.chosen_outcome;
    o += "chosen: " + describe(*r.chosen) + "\n";
    o += "  step time " + secs(c.step_ns) + " (" + detail::percent(overhead(c.step_ns, r.baseline.step_ns)) +
         " against no swap)\n";
    o += "  peak " + plan_gb(c.peak_bytes) + " on rank " + std::to_string(c.peak_rank) + ", " +
         plan_gb(r.budget_bytes - c.peak_bytes) + " under the budget\n";
    o += "  per step, all ranks: " + plan_gb(c.h2d_bytes) + " host to device, " + plan_gb(c.d2h_bytes) +
         " device to host, " + std::to_string(c.swapped_chunks) + " activation groups swapped\n";
    if (s.swap.overlap) o += detail::overlap_lines(c);
    if (r.best_without_swap && !(*r.best_without_swap == *r.chosen)) {
      auto const& b = r.best_without_swap_outcome;
      o += "best without swap: " + describe(*r.best_without_swap) + "\n";
      o += "  step time " + secs(b.step_ns) + "; swap buys " +
           detail::percent(-overhead(c.step_ns, b.step_ns)) + " step time over it\n";
    } else if (!r.best_without_swap) {
      o += "best without swap: none fits; recomputation and the distributed optimizer alone cannot fit the budget\n";
    } else {
      o += "the chosen plan swaps nothing: recomputation or the distributed optimizer alone fits fastest\n";
    }
  } else {
    o += "nothing fits the budget of " + plan_gb(r.budget_bytes) + ".\n";
    if (r.lowest_peak)
      o += "  the lowest peak reached is " + plan_gb(r.lowest_peak->outcome.peak_bytes) + " on rank " +
           std::to_string(r.lowest_peak->outcome.peak_rank) + ", with " + describe(r.lowest_peak->choice) + "\n";
  }
  o += "\nsimulated " + std::to_string(r.simulated.size()) + " of " + std::to_string(r.candidates) +
       " candidates (swapping more activation groups is assumed never to raise the peak nor to shorten the step):\n";
  o += "  " + pad("step time", 10, true) + pad("peak", 11, true) + "  " + pad("candidate", 96) + "verdict\n";
  for (auto const& e : r.simulated)
    o += "  " + pad(secs(e.outcome.step_ns), 10, true) + pad(plan_gb(e.outcome.peak_bytes), 11, true) + "  " +
         pad(describe(e.choice), 96) + e.verdict + "\n";
  if (!r.skipped.empty()) {
    o += "not simulated:\n";
    for (auto const& k : r.skipped) o += "  " + k + "\n";
  }
  return o;
}

/// The plan as JSON (docs/cli.md).
template <class Json = nlohmann::ordered_json>
Json to_json(plan_result const& r) {
  auto choice = [](swap_choice const& c) {
    Json j = Json::object();
    j["description"] = describe(c);
    j["activations"] = !c.ranks.empty()                                   ? Json(nullptr)
                       : c.activation_min_gap == 0                         ? Json("none")
                       : c.activation_min_gap <= schedule::min_swap_gap ? Json("all")
                                                                         : Json(c.activation_min_gap);
    j["optimizer"] = c.any_optimizer();
    j["swap_times"] = c.any_optimizer() ? Json(c.swap_times) : Json(nullptr);
    j["packed"] = c.any_optimizer() ? Json(c.packed) : Json(nullptr);
    j["recompute"] = recompute_name(c.recompute);
    j["distributed_optimizer"] = c.distributed_optimizer;
    if (!c.ranks.empty()) {
      Json rs = Json::array();
      for (auto const& x : c.ranks) {
        Json jr = Json::object();
        jr["activations"] = x.activation_min_gap == 0                         ? Json("none")
                            : x.activation_min_gap <= schedule::min_swap_gap ? Json("all")
                                                                              : Json(x.activation_min_gap);
        jr["optimizer"] = x.optimizer;
        jr["recompute"] = recompute_name(x.recompute);
        jr["swap_times"] = x.optimizer ? Json(x.swap_times ? x.swap_times : c.swap_times) : Json(nullptr);
        rs.push_back(std::move(jr));
      }
      j["ranks"] = std::move(rs);
      j["recompute"] = nullptr;
    }
    return j;
  };
  auto outcome = [](plan_outcome const& o) {
    Json j = Json::object();
    j["step_ns"] = o.step_ns;
    j["peak_bytes"] = o.peak_bytes;
    j["peak_rank"] = o.peak_rank;
    j["h2d_bytes"] = o.h2d_bytes;
    j["d2h_bytes"] = o.d2h_bytes;
    j["swapped_chunks"] = o.swapped_chunks;
    return j;
  };
  Json j = Json::object();
  j["budget_bytes"] = r.budget_bytes;
  j["fits"] = r.chosen.has_value();
  j["baseline"] = outcome(r.baseline);
  if (r.chosen) {
    Json c = choice(*r.chosen);
    c["outcome"] = outcome(r.chosen_outcome);
    c["overhead"] = overhead(r.chosen_outcome.step_ns, r.baseline.step_ns);
    {
      auto const& o = r.chosen_outcome;
      Json ov = Json::array();
      for (std::size_t k = 0; k < o.resident_shares.size(); ++k) {
        Json x = Json::object();
        x["rank"] = k;
        x["resident_share_bytes"] = o.resident_shares[k];
        x["prefetched_batches"] = o.prefetched[k];
        x["optimizer_batches"] = o.rank_batches[k];
        x["load_lookahead"] = o.lookaheads[k];
        x["offload_wait_delay"] = k < o.wait_delays.size() ? o.wait_delays[k] : 1;
        ov.push_back(std::move(x));
      }
      c["overlap"] = std::move(ov);
    }
    j["chosen"] = std::move(c);
  } else {
    j["chosen"] = nullptr;
  }
  if (r.best_without_swap) {
    Json c = choice(*r.best_without_swap);
    c["outcome"] = outcome(r.best_without_swap_outcome);
    j["best_without_swap"] = std::move(c);
  } else {
    j["best_without_swap"] = nullptr;
  }
  j["candidates"] = r.candidates;
  Json& sim = j["simulated"] = Json::array();
  for (auto const& e : r.simulated) {
    Json x = choice(e.choice);
    x["outcome"] = outcome(e.outcome);
    x["fits"] = e.fits;
    x["verdict"] = e.verdict;
    sim.push_back(std::move(x));
  }
  j["skipped"] = r.skipped;
  return j;
}

} // namespace pipeswap::sim
