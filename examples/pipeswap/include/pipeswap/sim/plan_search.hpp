// pipeswap — the swap planner's search: search_plan(), independent of the simulator (the tests drive
// it with cost models), over the candidates (swap_choice), what a simulation of one gives
// (plan_outcome) and the space (plan_space) of sim/plan_space.hpp, by the rules of
// sim/detail/plan_rules.hpp. sim/plan.hpp runs it on the simulator; sim/plan_format.hpp prints it.
//
// A candidate (swap_choice) sets the knobs: activation recomputation (none, selective, full; "op" too
// when the scenario has it), the distributed optimizer (with data parallelism), which activation
// groups are swapped (none; only the chunks whose backward trails their forward by at least g compute
// slots; every eligible chunk), whether optimizer states are swapped, in how many batches
// (swap_times) and whether packed, and optionally all of it per rank.
//
// The choice: among the simulated candidates that fit the budget, those whose step is within
// plan_space::tolerance of the fastest (0.5 % by default) count as equally fast; of them the plan
// moves the fewest bytes over the host link; of those, peaks within plan_space::peak_resolution
// (0.05 GB) of the lowest count as equally low, and the plan changes fewest of the scenario's own
// settings (its recomputation, its distributed optimizer), then peaks lowest (then is the faster,
// then the one simulated first).
//
// The search runs once per family (a recomputation and a distributed-optimizer setting, every rank
// alike) and simulates few of each family's candidates. It relies on one property of swapping, which
// it states in its explanations rather than hides: (b) within a family, swapping more (optimizer
// state, activation groups) never shortens the step. It does not assume that swapping more
// activation groups lowers the peak: under overlap it can raise it (docs/simulator.md, "The
// planner"), so every activation level of a setting is simulated until one fits.
// A family whose step without swap is beyond the tolerance of the fastest plan found is skipped.
// In a family, the optimizer settings are simulated without activation swap: for each packing,
// swap_times are walked upwards and the walk stops when a larger value lowers neither the peak nor
// the step time. Then, in order of their step time without activation swap, each setting that does
// not fit has its activation levels simulated, fewest groups first, until a level fits (by (b) more
// groups are no faster, and they move more) or its step is beyond the tolerance of the fastest plan;
// the settings stop at the first whose step without activation swap is already beyond it. A level is
// not simulated where the same family without optimizer swap already peaked, on some rank, above the
// budget by more than that rank's optimizer state (what swapping the state takes off a peak at most).
// Then, per rank: each rank takes the fastest simulated candidate that fits on that rank (its own
// peak within the budget; one optimizer batch setting for all), and the mix is simulated. Last, a
// per-rank refinement (plan_space::refine simulations at most): the slowest rank's activation level
// and optimizer batch count move one step at a time (one level; a quarter more or fewer batches),
// the best step kept while it fits and the choice prefers it (shorter beyond the tolerance, or
// shorter within it and lighter). Under overlap (b) need not hold — more activation
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
#include <pipeswap/sim/detail/plan_rules.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/pipeline.hpp>
#include <pipeswap/sim/plan_space.hpp>
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

/// Searches `space` for the plan whose peak is at most `budget` bytes (see the header comment for the
/// rules: the fastest within the tolerance, then the fewest host-link bytes, then among equally low
/// peaks the fewest changed settings, then the lowest peak),
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
  res.peak_resolution = space.peak_resolution;
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
    if (auto const* known = detail::simulated_outcome(res.simulated, c)) return *known;
    if (progress) progress(res.simulated.size(), std::max(bound, res.simulated.size() + 1));
    plan_outcome const o = evaluate(c);
    res.simulated.push_back({c, o, fits(o), {}});
    if (!res.lowest_peak || o.peak_bytes < res.lowest_peak->outcome.peak_bytes) res.lowest_peak = res.simulated.back();
    if (fits(o) && (!fastest || o.step_ns < *fastest)) fastest = o.step_ns;
    return o;
  };
  // A family's candidate without swap, and one of its optimizer settings.
  auto family_of = [](std::pair<recompute_kind, bool> const& fam) {
    swap_choice c;
    c.recompute = fam.first;
    c.distributed_optimizer = fam.second;
    return c;
  };
  auto optimizer_setting = [](swap_choice c, std::uint32_t times, bool packed) {
    c.optimizer = true;
    c.swap_times = times;
    c.packed = packed;
    return c;
  };
  auto at_level = [&](swap_choice c, std::size_t level) {
    c.activation_min_gap = level == 0 ? 0 : space.gaps[level - 1];
    return c;
  };
  auto update_choice = [&] {
    if (auto const i = detail::choose(res.simulated, space.tolerance, space.peak_resolution, space.baseline)) {
      res.chosen = res.simulated[*i].choice;
      res.chosen_outcome = res.simulated[*i].outcome;
    }
  };

  res.baseline = run(space.baseline);
  res.baseline_choice = space.baseline;

  if (space.exhaustive) {
    // Every uniform candidate, the knobs' product, in a fixed order: what the rules below prune is
    // checked against this.
    for (auto const& fam : families) {
      auto const family = family_of(fam);
      std::vector<swap_choice> settings{family};
      for (bool packed : space.packed)
        for (auto times : space.swap_times) settings.push_back(optimizer_setting(family, times, packed));
      for (auto const& c : settings)
        for (std::size_t level = 0; level <= levels; ++level) run(at_level(c, level));
    }
  } else {

    // First, every family's settings without activation swap: its step without swap, then the
    // optimizer settings (for each packing, swap_times walked upwards). A family whose step without
    // swap is beyond the tolerance of the fastest plan found so far is skipped.
    struct setting {
      swap_choice choice;
      plan_outcome outcome;
    };
    std::vector<setting> list;
    for (auto const& fam : families) { // named, not bound: clang 14 cannot capture a structured binding
      auto const family = family_of(fam);
      plan_outcome const family_base = run(family);
      if (!family.distributed_optimizer &&
          std::find(space.distributed_optimizer.begin(), space.distributed_optimizer.end(), true) !=
              space.distributed_optimizer.end()) {
        // Its twin with the distributed optimizer shards the same state over dp: when that is no
        // slower and peaks no higher without swap, it is with any swap too (the swaps move only the
        // shard, the step updates only the shard), so this family's swaps are not searched.
        auto twin = family;
        twin.distributed_optimizer = true;
        plan_outcome const t = run(twin);
        // Where the twin's peak is within the peak resolution and the scenario's own setting is
        // without it, the family's own swaps could be chosen for keeping that setting: searched.
        if (t.step_ns <= family_base.step_ns && t.peak_bytes <= family_base.peak_bytes &&
            (space.baseline.distributed_optimizer || t.peak_bytes + space.peak_resolution < family_base.peak_bytes)) {
          res.skipped.push_back(describe(family) +
                                " with swap: not searched, the distributed optimizer with the same "
                                "recomputation is no slower without swap (" +
                                detail::secs(t.step_ns) + " against " + detail::secs(family_base.step_ns) +
                                ") and peaks lower, and its swaps move only the shard");
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
                              detail::secs(family_base.step_ns) +
                              ", 0 bytes over the host link) and swapping "
                              "only adds time and bytes");
        continue;
      }
      for (bool packed : space.packed) {
        std::optional<plan_outcome> prev;
        for (std::size_t i = 0; i < space.swap_times.size(); ++i) {
          auto const c = optimizer_setting(family, space.swap_times[i], packed);
          plan_outcome const o = run(c);
          list.push_back({c, o});
          if (prev && o.peak_bytes >= prev->peak_bytes && o.step_ns >= prev->step_ns &&
              i + 1 < space.swap_times.size()) {
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

    // Then, fastest setting first (of every family), the activation levels of each setting that does
    // not fit, fewest groups first, until a level fits or its step leaves the tolerance of the fastest
    // plan; a level that cannot fit by the twin without optimizer swap is not simulated.
    for (std::size_t si = 0; si < list.size(); ++si) {
      auto const& choice = list[si].choice;
      auto const& o0 = list[si].outcome;
      if (!in_reach(o0.step_ns)) {
        for (std::size_t k = si; k < list.size(); ++k)
          if (!fits(list[k].outcome))
            res.skipped.push_back(describe(list[k].choice) +
                                  " with activation swap: not searched, its step without "
                                  "activation swap (" +
                                  detail::secs(list[k].outcome.step_ns) + ") is already beyond " + reach_text() +
                                  " and swapping activations only adds time");
        break;
      }
      if (fits(o0) || levels == 0) continue; // fits already, or nothing to swap
      if (o0.activation_floor > budget) {
        res.skipped.push_back(describe(choice) +
                              " with activation swap: not simulated, what no activation swap "
                              "moves (weights, gradients, the optimizer state it keeps, reserved bytes) already "
                              "needs " +
                              detail::plan_gb(o0.activation_floor) + " on a rank");
        continue;
      }
      for (std::size_t level = 1; level <= levels; ++level) {
        auto const c = at_level(choice, level);
        if (auto const why = detail::cannot_fit(c, o0, res.simulated, budget)) {
          res.skipped.push_back(describe(c) + ": not simulated, " + *why);
          continue;
        }
        plan_outcome const o = run(c);
        // The levels past this one, when the walk stops here: why they are not simulated.
        auto const skip_rest = [&](std::string const& why) {
          auto const gap = std::to_string(space.gaps[level - 1]);
          if (level < levels)
            res.skipped.push_back(describe(choice) + " with activation gaps below " + gap + ": not simulated, gap " +
                                  gap + why);
        };
        if (fits(o)) {
          skip_rest(" fits, and swapping more groups only adds time and bytes");
          break;
        }
        if (!in_reach(o.step_ns)) {
          skip_rest(" is already beyond " + reach_text() + " and swapping more groups only adds time");
          break;
        }
      }
    }
  }
  update_choice();

  // Per rank: each rank takes the fastest simulated uniform candidate that fits on it, within one
  // distributed-optimizer setting and one optimizer batch setting (the two best of those).
  if (space.per_rank) {
    for (bool dist : space.distributed_optimizer) {
      auto pool =
          res.simulated | ranges::views::filter([&](considered const& e) {
            return e.choice.ranks.empty() && e.choice.distributed_optimizer == dist && !e.outcome.rank_peaks.empty();
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
        auto usable =
            pool | ranges::views::filter([&](considered const& e) {
              return !e.choice.optimizer || ((times == 0 || e.choice.swap_times == times) && e.choice.packed == packed);
            }) |
            ranges::to<std::vector>();
        swap_choice mix;
        mix.distributed_optimizer = dist;
        mix.swap_times = times ? times : tried.front().first;
        mix.packed = packed;
        bool complete = true;
        for (std::size_t r : ranges::views::iota(std::size_t{0}, R)) {
          auto fitting =
              usable | ranges::views::filter([&](considered const& e) { return e.outcome.rank_peaks[r] <= budget; });
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
      auto const slowest = static_cast<std::size_t>(std::max_element(cur_o.rank_steps.begin(), cur_o.rank_steps.end()) -
                                                    cur_o.rank_steps.begin());
      auto const here = cur.ranks.at(slowest);
      std::vector<swap_choice> steps;
      auto with = [&](swap_choice::rank_choice x) {
        swap_choice n = cur;
        n.ranks[slowest] = x;
        steps.push_back(std::move(n));
      };
      auto const li = static_cast<std::size_t>(
          std::find(act_levels.begin(), act_levels.end(), here.activation_min_gap) - act_levels.begin());
      if (li < act_levels.size()) {
        for (std::size_t j : {li + 1, li - 1}) // one level more groups, one fewer
          if (j < act_levels.size()) {
            auto x = here;
            x.activation_min_gap = act_levels[j];
            if (x.activation_min_gap == 0) x.activation_tenths = 10; // no group swaps: one way to say it
            with(x);
          }
      }
      if (here.activation_min_gap > 0) {
        // A tenth fewer of each swapped group's layers, a tenth more: the finer activation level
        // between two gaps (a group's bytes, where whole groups are too coarse).
        for (std::uint32_t t : {here.activation_tenths - 1, here.activation_tenths + 1})
          if (t >= 1 && t <= 10) {
            auto x = here;
            x.activation_tenths = t;
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
        // Only a plan the choice would take over the current one moves the refinement on: a step
        // shorter beyond the tolerance, or shorter within it and lighter (fewer host-link bytes, or
        // as many and a lower peak). Every simulated plan is weighed below in any case.
        if (o.rank_steps.size() != R || !fits(o) || o.step_ns >= cur_o.step_ns) continue;
        if (detail::within_tolerance(cur_o.step_ns, o.step_ns, space.tolerance) &&
            std::pair{detail::link_bytes(o), o.peak_bytes} >= std::pair{detail::link_bytes(cur_o), cur_o.peak_bytes})
          continue;
        if (!best_step || o.step_ns < best_step->second.step_ns) best_step = {n, o};
      }
      if (!best_step) break; // no single step of the slowest rank's settings makes a better plan
      cur = std::move(best_step->first);
      cur_o = std::move(best_step->second);
    }
    if (spent == space.refine)
      res.skipped.push_back(
          "per-rank refinement: stopped after " + std::to_string(spent) +
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
    if (res.chosen && e.choice == *res.chosen)
      e.verdict = "chosen";
    else if (!e.fits)
      e.verdict = "over budget by " + detail::plan_gb(e.outcome.peak_bytes - budget) + " on rank " +
                  std::to_string(e.outcome.peak_rank);
    else
      e.verdict = detail::verdict_against(detail::figures_of(e.choice, e.outcome, space.baseline),
                                          detail::figures_of(*res.chosen, res.chosen_outcome, space.baseline), *fastest,
                                          space.tolerance, space.peak_resolution);
  }
  return res;
}

} // namespace pipeswap::sim
