// pipeswap — the swap planner: given a scenario and a device-memory budget, choose what to swap so
// that every rank fits the budget at the lowest simulated step time. What `pipeswap plan` runs.
//
// A candidate (swap_choice) sets four knobs: which activation groups are swapped (none; only the
// chunks whose backward trails their forward by at least g compute slots; every eligible chunk),
// whether optimizer states are swapped, in how many batches (swap_times) and whether packed.
//
// The search (search_plan) simulates few of the candidates. It relies on two properties of swapping,
// which it states in its explanations rather than hides:
//   (a) swapping more activation groups never raises the peak, and
//   (b) never shortens the step.
// First the optimizer settings are simulated without activation swap: for each packing, swap_times
// are walked upwards and the walk stops when a larger value lowers neither the peak nor the step
// time. Then, in order of their step time without activation swap, each setting that does not fit
// gets the least activation swap that makes it fit, found by binary search over the activation
// levels (cut short once a probe is over budget and already no faster than the best plan); the
// search stops at the first setting that is already no faster than the best plan.
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

namespace pipeswap::sim {

/// One candidate of the planner.
struct swap_choice {
  /// 0: no activation swap. schedule::min_swap_gap (4): every eligible group. Larger: only the chunks
  /// whose backward runs at least this many compute slots after their forward.
  std::size_t activation_min_gap = 0;
  bool optimizer = false;
  std::uint32_t swap_times = 16; ///< optimizer batches (when `optimizer`)
  bool packed = true;            ///< packed optimizer pipeline (when `optimizer`)

  friend bool operator==(swap_choice const& a, swap_choice const& b) noexcept {
    return a.activation_min_gap == b.activation_min_gap && a.optimizer == b.optimizer &&
           (!a.optimizer || (a.swap_times == b.swap_times && a.packed == b.packed));
  }
};

/// "optimizer swap (packed, 16 batches) + activation groups with gap >= 9", "no swap", ...
inline std::string describe(swap_choice const& c) {
  std::string opt = c.optimizer ? "optimizer swap (" + std::string(c.packed ? "packed" : "per tensor") + ", " +
                                      std::to_string(c.swap_times) + " batches)"
                                : "";
  std::string act;
  if (c.activation_min_gap > schedule::min_swap_gap)
    act = "activation groups with gap >= " + std::to_string(c.activation_min_gap);
  else if (c.activation_min_gap > 0)
    act = "every eligible activation group";
  if (opt.empty() && act.empty()) return "no swap";
  if (opt.empty()) return act;
  if (act.empty()) return opt;
  return opt + " + " + act;
}

/// What the planner keeps of one simulation.
struct plan_outcome {
  mock::sim_time step_ns = 0;
  std::uint64_t peak_bytes = 0;   ///< max over ranks
  std::uint32_t peak_rank = 0;    ///< the rank that reaches it
  std::uint64_t h2d_bytes = 0;    ///< per step, all ranks together
  std::uint64_t d2h_bytes = 0;
  std::uint32_t swapped_chunks = 0; ///< activation groups swapped, all ranks together
};

/// The candidates: activation levels and optimizer settings.
struct plan_space {
  /// Activation levels besides "none", strictly decreasing gaps (fewest groups first); the last is
  /// normally schedule::min_swap_gap, i.e. every eligible group. Empty when no group is eligible.
  std::vector<std::size_t> gaps = {schedule::min_swap_gap};
  /// Optimizer batch counts to try, in increasing order.
  std::vector<std::uint32_t> swap_times = {4, 8, 16, 32, 64};
  std::vector<bool> packed = {true, false};

  /// The number of candidates: (1 + optimizer settings) × (1 + activation levels).
  [[nodiscard]] std::size_t size() const noexcept {
    return (1 + swap_times.size() * packed.size()) * (1 + gaps.size());
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
  std::vector<considered> simulated; ///< in the order they ran
  std::vector<std::string> skipped;  ///< what was not simulated, and why
  std::size_t candidates = 0;        ///< plan_space::size()
  /// Lowest peak seen, and where: what to say when nothing fits.
  std::optional<considered> lowest_peak;
};

namespace detail {

inline std::string plan_gb(std::uint64_t b) { return fmt("%.1f GB", static_cast<double>(b) / 1e9); }

inline void check_space(plan_space const& s) {
  for (std::size_t i = 0; i < s.gaps.size(); ++i) {
    if (s.gaps[i] < schedule::min_swap_gap)
      throw invalid_argument("plan: activation gap " + std::to_string(s.gaps[i]) + " is below the injector's minimum " +
                             std::to_string(schedule::min_swap_gap));
    if (i > 0 && s.gaps[i] >= s.gaps[i - 1])
      throw invalid_argument("plan: activation gaps must be strictly decreasing");
  }
  if (s.swap_times.empty() || s.packed.empty())
    throw invalid_argument("plan: swap_times and packed need at least one value each");
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
  std::size_t const bound = std::min(res.candidates, (settings + 1) * per_setting);
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
  consider(swap_choice{}, res.baseline);

  // Optimizer settings without activation swap: walk swap_times upwards for each packing.
  struct setting {
    swap_choice choice;
    plan_outcome outcome;
  };
  std::vector<setting> list{{swap_choice{}, res.baseline}};
  for (bool packed : space.packed) {
    std::optional<plan_outcome> prev;
    for (std::size_t i = 0; i < space.swap_times.size(); ++i) {
      swap_choice const c{0, true, space.swap_times[i], packed};
      plan_outcome const o = run(c);
      list.push_back({c, o});
      consider(c, o);
      if (prev && o.peak_bytes >= prev->peak_bytes && o.step_ns >= prev->step_ns && i + 1 < space.swap_times.size()) {
        std::string rest;
        for (std::size_t k = i + 1; k < space.swap_times.size(); ++k)
          rest += (k > i + 1 ? ", " : "") + std::to_string(space.swap_times[k]);
        res.skipped.push_back("optimizer swap (" + std::string(packed ? "packed" : "per tensor") +
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
  o.swap_activations = c.activation_min_gap > 0;
  if (c.activation_min_gap > schedule::min_swap_gap) {
    o.activation_filter = [gaps = std::move(gaps), g = c.activation_min_gap](std::uint32_t rank, schedule::chunk ch) {
      return gaps->gap(rank, ch) >= g;
    };
  }
  o.swap_optimizer = c.optimizer;
  o.swap_times = c.optimizer ? c.swap_times : unswapped.swap_times;
  o.packed = c.optimizer ? c.packed : unswapped.packed;
  return o;
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
  }
  return o;
}

/// Plans `s` for a budget of `budget` bytes per device, simulating candidates with sim::simulate.
/// `progress(fraction)` is called now and then. Throws invalid_argument for a bad scenario.
inline plan_result plan(scenario const& s, std::uint64_t budget, std::function<void(double)> const& progress = {},
                        plan_space space = {}) {
  validate(s);
  auto const gaps = std::make_shared<activation_gaps const>(gaps_of(s.pipeline));
  space.gaps = gap_levels(*gaps);
  double done = 0, bound = 1;
  auto evaluate = [&](swap_choice const& c) {
    auto o = options_for(c, gaps, s.swap);
    if (progress) o.progress = [&](double f) { progress(std::min(1.0, (done + f) / bound)); };
    return outcome_of(simulate(s, o));
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
  } else {
    o += "nothing fits the budget of " + plan_gb(r.budget_bytes) + ".\n";
    if (r.lowest_peak)
      o += "  the lowest peak reached is " + plan_gb(r.lowest_peak->outcome.peak_bytes) + " on rank " +
           std::to_string(r.lowest_peak->outcome.peak_rank) + ", with " + describe(r.lowest_peak->choice) + "\n";
  }
  o += "\nsimulated " + std::to_string(r.simulated.size()) + " of " + std::to_string(r.candidates) +
       " candidates (swapping more activation groups is assumed never to raise the peak nor to shorten the step):\n";
  o += "  " + pad("step time", 10, true) + pad("peak", 11, true) + "  " + pad("candidate", 74) + "verdict\n";
  for (auto const& e : r.simulated)
    o += "  " + pad(secs(e.outcome.step_ns), 10, true) + pad(plan_gb(e.outcome.peak_bytes), 11, true) + "  " +
         pad(describe(e.choice), 74) + e.verdict + "\n";
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
    j["activations"] = c.activation_min_gap == 0                         ? Json("none")
                       : c.activation_min_gap <= schedule::min_swap_gap ? Json("all")
                                                                         : Json(c.activation_min_gap);
    j["optimizer"] = c.optimizer;
    j["swap_times"] = c.optimizer ? Json(c.swap_times) : Json(nullptr);
    j["packed"] = c.optimizer ? Json(c.packed) : Json(nullptr);
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
    j["chosen"] = std::move(c);
  } else {
    j["chosen"] = nullptr;
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
