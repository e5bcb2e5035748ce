// pipeswap — the swap planner: given a scenario and a device-memory budget, choose what to swap so
// that every rank fits the budget at the lowest simulated step time. What `pipeswap plan` runs:
// plan() simulates the candidates search_plan() asks for (sim/plan_search.hpp states the rules);
// sim/plan_format.hpp prints the result.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/error.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/sim/alternatives.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/pipeline.hpp>
#include <pipeswap/sim/plan_format.hpp>
#include <pipeswap/sim/plan_search.hpp>
#include <pipeswap/sim/report.hpp>
#include <pipeswap/sim/sized.hpp>

namespace pipeswap::sim {

/// The per-rank orders the simulator runs for `p` (the schedule layer's generators).
inline schedule::rank_orders pipeline_orders(pipeline_spec const& p) {
  auto const R = static_cast<schedule::index_type>(p.ranks), M = static_cast<schedule::index_type>(p.micro_batches);
  switch (p.schedule) {
  case schedule_kind::gpipe: return schedule::gpipe(R, M);
  case schedule_kind::one_f_one_b: return schedule::one_f_one_b(R, M);
  case schedule_kind::interleaved:
    return schedule::interleaved_1f1b({R, static_cast<schedule::index_type>(p.stages_per_rank), M, p.overlap_b_f});
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
      if (r.activation_min_gap > 0 && r.activation_tenths < 10) o.ranks.back().swapped_tenths = r.activation_tenths;
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
  if (c.ranks.empty() && c.recompute != recompute_kind::none)
    o.recompute.assign(gaps ? gaps->per_rank.size() : 0, c.recompute);
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
/// With the scenario and the options it ran with, also the activation floor (plan_outcome).
inline plan_outcome outcome_of(sim_result const& r, scenario const* s = nullptr, sim_options const* opts = nullptr) {
  plan_outcome o;
  o.step_ns = r.step_ns;
  o.peak_bytes = r.peak_bytes;
  o.simulations = r.simulations;
  o.simulated_steps = r.simulated_steps;
  o.peak_rank = highest_peak_rank(r);
  for (auto const& x : r.ranks) {
    o.h2d_bytes += x.h2d_bytes;
    o.d2h_bytes += x.d2h_bytes;
    o.swapped_chunks += x.swapped_chunks;
    o.rank_peaks.push_back(x.peak_bytes);
    o.rank_host_bytes.push_back(x.h2d_bytes + x.d2h_bytes);
    o.rank_state_bytes.push_back(x.optimizer_state_bytes);
    if (s && opts)
      o.activation_floor =
          std::max(o.activation_floor, s->device.reserved_bytes + x.resident_param_bytes +
                                           (opts->swaps_optimizer(x.rank) ? 0 : x.optimizer_state_bytes));
    o.rank_steps.push_back(x.step_ns);
    o.resident_shares.push_back(x.resident_share_bytes);
    o.prefetched.push_back(x.prefetched_batches);
    o.rank_batches.push_back(x.optimizer_batches);
    o.lookaheads.push_back(x.load_lookahead);
    o.wait_delays.push_back(x.offload_wait_delay);
  }
  return o;
}

/// An alternative from a simulated candidate's outcome.
inline alternative alternative_of(std::string key, std::string title, swap_choice const& c, plan_outcome const& o,
                                  std::uint64_t budget) {
  alternative a;
  a.key = std::move(key);
  a.title = std::move(title);
  a.description = describe(c);
  a.step_ns = o.step_ns;
  a.peak_bytes = o.peak_bytes;
  a.peak_rank = o.peak_rank;
  a.host_bytes = o.h2d_bytes + o.d2h_bytes;
  a.fits = o.peak_bytes <= budget;
  for (std::size_t r = 0; r < o.rank_peaks.size(); ++r)
    a.ranks.push_back({r < o.rank_steps.size() ? o.rank_steps[r] : 0, o.rank_peaks[r],
                       r < o.rank_host_bytes.size() ? o.rank_host_bytes[r] : 0});
  return a;
}

/// Fills `res.alternatives` and `res.verdict_line` (docs/simulator.md, "The alternatives"): with the
/// scenario's own recomputation and distributed-optimizer settings, no swap; pipeswap's GPU-step swap
/// of the optimizer state (the fastest batch setting the search simulated for them, else the
/// scenario's swap settings), of every eligible activation group, of both; the plan; the CPU-step
/// offload of 25, 50, 75 and 100 % of the optimizer; the other recomputations. `outcome(choice)`
/// simulates a candidate (or finds it simulated).
template <class Outcome>
void add_alternatives(plan_result& res, scenario const& s, plan_space const& space, Outcome&& outcome) {
  swap_choice base;
  base.recompute = s.model.recompute;
  base.distributed_optimizer = s.parallel.distributed_optimizer;
  auto opt = base;
  opt.optimizer = true;
  opt.swap_times = s.swap.swap_times;
  opt.packed = s.swap.packed;
  std::optional<mock::sim_time> best_opt;
  for (auto const& e : res.simulated)
    if (e.choice.ranks.empty() && e.choice.optimizer && e.choice.activation_min_gap == 0 &&
        e.choice.recompute == base.recompute && e.choice.distributed_optimizer == base.distributed_optimizer &&
        (!best_opt || e.outcome.step_ns < *best_opt)) {
      best_opt = e.outcome.step_ns;
      opt.swap_times = e.choice.swap_times;
      opt.packed = e.choice.packed;
    }
  auto const B = res.budget_bytes;
  auto& alts = res.alternatives;
  alts.clear();
  auto const none_o = outcome(base);
  alts.push_back(alternative_of("none", "no swap", base, none_o, B));
  res.alternative_none = 0;
  alts.push_back(alternative_of("optimizer_swap", "optimizer swap", opt, outcome(opt), B));
  if (!space.gaps.empty()) {
    auto act = base;
    act.activation_min_gap = schedule::min_swap_gap;
    alts.push_back(alternative_of("activation_swap", "activation swap", act, outcome(act), B));
    auto both = opt;
    both.activation_min_gap = schedule::min_swap_gap;
    alts.push_back(alternative_of("both", "optimizer + activation swap", both, outcome(both), B));
  }
  if (res.chosen) {
    // The plan, unless it is one of the alternatives above: then that one is the plan.
    auto const d = describe(*res.chosen);
    auto const same = std::find_if(alts.begin(), alts.end(), [&](alternative const& a) { return a.description == d; });
    if (same == alts.end()) {
      alts.push_back(alternative_of("plan", "the plan", *res.chosen, res.chosen_outcome, B));
      auto const changes = plan_changes(*res.chosen, s);
      alts.back().changes = static_cast<int>(changes.size());
      for (auto const& x : changes) alts.back().description += ", " + x.field + " " + x.from + " -> " + x.to;
    } else
      same->title += " (the plan)";
  }
  for (double f : cpu_offload_fractions)
    alts.push_back(cpu_offload_alternative(s, none_o.rank_steps, none_o.rank_peaks, none_o.rank_state_bytes, f, B));
  for (auto rc : {recompute_kind::selective, recompute_kind::full, recompute_kind::none}) {
    if (rc == base.recompute) continue;
    auto r = base;
    r.recompute = rc;
    if (res.chosen && describe(r) == describe(*res.chosen)) continue; // the plan, listed above
    alts.push_back(alternative_of(std::string("recompute_") + std::string(recompute_name(rc)),
                                  rc == recompute_kind::none ? "no recomputation" : recompute_title(rc), r, outcome(r),
                                  B));
    alts.back().changes = static_cast<int>(plan_changes(r, s).size());
  }
  auto const* err = error_of(s);
  res.verdict_line =
      decide(alts, res.alternative_none, B, res.tolerance, err ? err->step_error() : 0.0, res.peak_resolution);
}

/// The scenario and options a candidate of plan() runs with: the candidate's settings, the device's
/// memory taken as `budget` under overlap (each rank's resident share and prefetch are sized against
/// it), the activation loads' lookaheads set from the links.
inline std::pair<scenario, sim_options> choice_setup(scenario const& s, std::uint64_t budget,
                                                     std::shared_ptr<activation_gaps const> const& gaps,
                                                     swap_choice const& c) {
  auto o = options_for(c, gaps, s.swap);
  auto sc = scenario_for(c, s);
  if (o.overlap && budget > sc.device.reserved_bytes) sc.device.memory_bytes = std::min(sc.device.memory_bytes, budget);
  if (o.overlap && o.swap_activations) set_load_lookaheads(o, sc);
  return {std::move(sc), std::move(o)};
}

/// One candidate of plan() simulated as the planner simulates it (simulate_sized, no hazard checker):
/// what the search weighs. `used`, when given, receives the options of the run.
inline plan_outcome simulate_choice(scenario const& s, std::uint64_t budget,
                                    std::shared_ptr<activation_gaps const> const& gaps, swap_choice const& c,
                                    std::function<void(double)> progress = {}, sim_options* used = nullptr) {
  auto [sc, o] = choice_setup(s, budget, gaps, c);
  o.check_hazards = false;
  o.progress = std::move(progress);
  sim_options u;
  auto const out = outcome_of(simulate_sized(sc, o, 4, &u), &sc, &o);
  u.progress = {};
  if (used) *used = std::move(u);
  return out;
}

/// The space plan() searches when it is given none: with data parallelism the distributed optimizer
/// on and off, the scenario's "op" recomputation beside the three others when it has it, and the
/// scenario's plan.tolerance (the activation levels and the baseline plan() sets from the scenario in
/// any case).
inline plan_space default_plan_space(scenario const& s) {
  plan_space space;
  if (s.model.recompute == recompute_kind::op) space.recompute.push_back(recompute_kind::op); // the scenario's own
  if (s.parallel.dp > 1) space.distributed_optimizer = {false, true};
  if (s.parallel.fsdp) space.distributed_optimizer = {true}; // FSDP shards the optimizer state
  space.tolerance = s.plan.tolerance;
  return space;
}

/// Plans `s` for a budget of `budget` bytes per device, simulating candidates with sim::simulate.
/// `progress(fraction)` is called now and then. Throws invalid_argument for a bad scenario.
/// `space.gaps` comes from the scenario's schedule; unless `space` is given, `space.distributed_optimizer`
/// is {false, true} with data parallelism and `space.tolerance` the scenario's plan.tolerance. A
/// scenario with device.end_to_end_mfu is calibrated first. The candidates are simulated without the
/// mock's hazard checker; the chosen plan is simulated again with it (a hazard throws), and error is
/// thrown if its figures differ.
inline plan_result plan(scenario const& given, std::uint64_t budget, std::function<void(double)> const& progress = {},
                        std::optional<plan_space> given_space = std::nullopt) {
  validate(given);
  auto const s = calibrated(given);
  auto const gaps = std::make_shared<activation_gaps const>(gaps_of(s.pipeline));
  plan_space space = given_space ? *given_space : default_plan_space(s);
  space.baseline = swap_choice{};
  space.baseline.recompute = s.model.recompute;
  space.baseline.distributed_optimizer = s.parallel.distributed_optimizer;
  space.gaps = gap_levels(*gaps);
  double done = 0, bound = 1;
  // The candidates run without the hazard checker (it changes no figure, and costs most of a
  // simulation); the chosen plan is simulated again with it, below.
  std::vector<std::pair<swap_choice, sim_options>> resolved;
  std::uint64_t simulations = 0, simulated_steps = 0;
  auto evaluate = [&](swap_choice const& c) {
    sim_options used;
    auto const out = simulate_choice(s, budget, gaps, c,
                                     progress ? [&](double f) { progress(std::min(1.0, (done + f) / bound)); }
                                              : std::function<void(double)>{},
                                     &used);
    resolved.emplace_back(c, std::move(used));
    simulations += out.simulations;
    simulated_steps += out.simulated_steps;
    return out;
  };
  auto res = search_plan(space, budget, evaluate, [&](std::size_t d, std::size_t b) {
    done = static_cast<double>(d);
    bound = static_cast<double>(b);
    if (progress) progress(done / bound);
  });
  if (res.chosen) {
    // The chosen plan once more, every operation through the hazard checker (raising): its figures
    // must be the ones the search weighed.
    auto const it =
        std::find_if(resolved.begin(), resolved.end(), [&](auto const& x) { return x.first == *res.chosen; });
    if (it == resolved.end()) throw error("plan: the chosen plan was not simulated");
    auto o = it->second;
    o.check_hazards = true;
    auto const checked = outcome_of(simulate(choice_setup(s, budget, gaps, *res.chosen).first, o));
    simulations += checked.simulations;
    simulated_steps += checked.simulated_steps;
    auto const& c = res.chosen_outcome;
    if (checked.step_ns != c.step_ns || checked.peak_bytes != c.peak_bytes || checked.h2d_bytes != c.h2d_bytes ||
        checked.d2h_bytes != c.d2h_bytes)
      throw error("plan: the chosen plan (" + describe(*res.chosen) +
                  ") gave other figures with the hazard checker than without it");
  }
  add_alternatives(res, s, space, [&](swap_choice const& c) {
    if (auto const* known = detail::simulated_outcome(res.simulated, c)) return *known;
    return evaluate(c);
  });
  res.simulations = simulations;
  res.simulated_steps = simulated_steps;
  return res;
}

} // namespace pipeswap::sim
