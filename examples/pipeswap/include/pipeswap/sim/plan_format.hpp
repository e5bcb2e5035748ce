// pipeswap — the planner's result as text and as JSON (what `pipeswap plan` prints; docs/cli.md).
#pragma once

#include <cmath>
#include <cstddef>
#include <iterator>
#include <cstdint>
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/sim/accuracy.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/plan_search.hpp>
#include <pipeswap/sim/report.hpp>
#include <pipeswap/sim/svg.hpp>

namespace pipeswap::sim {

namespace detail {

/// "  overlap, per rank: 0: resident 12.3 GB, 9 of 16 batches on the device at the step, loads 2
/// slots ahead; ..." (ranks alike are grouped).
inline std::string overlap_lines(plan_outcome const& c) {
  auto one = [&](std::size_t r) {
    std::string x;
    if (c.rank_batches[r] > 0)
      x = "resident " + plan_gb(c.resident_shares[r]) + ", " + std::to_string(c.prefetched[r]) + " of " +
          std::to_string(c.rank_batches[r]) + " optimizer batches on the device when the step began";
    if (c.lookaheads[r] > 1)
      x +=
          (x.empty() ? "" : ", ") + std::string("activation loads ") + std::to_string(c.lookaheads[r]) + " slots ahead";
    if (r < c.wait_delays.size() && c.wait_delays[r] > 1)
      x +=
          (x.empty() ? "" : ", ") + std::string("offloads waited ") + std::to_string(c.wait_delays[r]) + " slots after";
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

} // namespace detail

/// A setting of the user's scenario that a plan changes: the field, its value in the scenario and in
/// the plan ("per rank: 0: full; 1-3: none" when the plan's ranks differ).
struct setting_change {
  std::string field, from, to;
};

/// What `c` changes of the scenario's own settings: model.recompute, parallel.distributed_optimizer.
inline std::vector<setting_change> plan_changes(swap_choice const& c, scenario const& s) {
  std::vector<setting_change> out;
  auto const name = [](recompute_kind k) { return std::string(recompute_name(k)); };
  auto const mine = s.model.recompute;
  if (detail::recompute_changed(c, mine)) {
    std::string to = c.ranks.empty() ? name(c.recompute) : "per rank: ";
    for (std::size_t r = 0; r < c.ranks.size();) {
      std::size_t e = r;
      while (e + 1 < c.ranks.size() && c.ranks[e + 1].recompute == c.ranks[r].recompute) ++e;
      to += (r ? "; " : "") + std::to_string(r) + (e > r ? "-" + std::to_string(e) : "") + ": " +
            name(c.ranks[r].recompute);
      r = e + 1;
    }
    out.push_back({"model.recompute", name(mine), to});
  }
  if (c.distributed_optimizer != s.parallel.distributed_optimizer)
    out.push_back({"parallel.distributed_optimizer", s.parallel.distributed_optimizer ? "true" : "false",
                   c.distributed_optimizer ? "true" : "false"});
  return out;
}

/// The alternatives as a table (empty when there are none): the step, then per rank.
inline std::string format_alternatives(plan_result const& r) {
  using detail::pad;
  using detail::plan_gb;
  using detail::secs;
  if (r.alternatives.empty()) return {};
  auto const& base = r.alternatives.at(r.alternative_none);
  std::string o = "\nalternatives (step: the slowest rank's time, the highest peak, host-link bytes of all ranks; "
                  "CPU-step offload derived from the no-swap step, the others simulated):\n";
  o += "  " + pad("alternative", 30) + pad("step time", 11, true) + pad("overhead", 11, true) + pad("peak", 11, true) +
       "  " + pad("fits", 6) + pad("host link", 11, true) + "\n";
  for (std::size_t i = 0; i < r.alternatives.size(); ++i) {
    auto const& a = r.alternatives[i];
    bool const chosen = r.verdict_line.choice == i;
    o += (chosen ? "* " : "  ") + pad(a.title, 30) + pad(secs(a.step_ns), 11, true) +
         pad(i == r.alternative_none ? "-" : detail::percent(overhead(a.step_ns, base.step_ns)), 11, true) +
         pad(plan_gb(a.peak_bytes), 11, true) + "  " + pad(a.fits ? "yes" : "no", 6) +
         pad(plan_gb(a.host_bytes), 11, true) + "\n";
  }
  o += "per rank (peak / step time / host-link bytes of one device):\n";
  for (std::size_t k = 0; k < base.ranks.size(); ++k) {
    o += "  rank " + std::to_string(k) + ":";
    for (auto const& a : r.alternatives) {
      if (k >= a.ranks.size()) continue;
      auto const& x = a.ranks[k];
      o += " " + a.key + " " + plan_gb(x.peak_bytes) + " / " + secs(x.step_ns) + " / " + plan_gb(x.host_bytes) + ";";
    }
    o.back() = '\n';
  }
  return o;
}

/// The plan as text: the choice, what it costs, what else was simulated and what was skipped.
inline std::string format_plan(plan_result const& r, scenario const& s) {
  using detail::pad;
  using detail::plan_gb;
  using detail::secs;
  std::string o = "scenario: " + describe(s) + "\n" + error_line(s) + "\n";
  if (auto const pace = pace_line(s); !pace.empty()) o += pace + "\n";
  o += "budget: " + plan_gb(r.budget_bytes) + " per device\n";
  if (!r.verdict_line.text.empty()) o += r.verdict_line.text + "\n";
  o += "no swap" + (r.baseline_choice == swap_choice{} ? std::string() : " (" + describe(r.baseline_choice) + ")") +
       ": step " + secs(r.baseline.step_ns) + ", peak " + plan_gb(r.baseline.peak_bytes) + " on rank " +
       std::to_string(r.baseline.peak_rank) + "\n\n";
  if (r.chosen) {
    auto const& c = r.chosen_outcome;
    o += "chosen: " + describe(*r.chosen) + "\n";
    auto const changes = plan_changes(*r.chosen, s);
    for (auto const& x : changes) o += "  changes your setting " + x.field + ": " + x.from + " -> " + x.to + "\n";
    // Where the plan changes a setting, "no swap" still has the scenario's: say so.
    o += "  step time " + secs(c.step_ns) + " (" + detail::percent(overhead(c.step_ns, r.baseline.step_ns)) +
         " against no swap" + (changes.empty() ? "" : " with your settings") + ")\n";
    o += "  peak " + plan_gb(c.peak_bytes) + " on rank " + std::to_string(c.peak_rank) + ", " +
         plan_gb(r.budget_bytes - c.peak_bytes) + " under the budget\n";
    o += "  per step, all ranks: " + plan_gb(c.h2d_bytes) + " host to device, " + plan_gb(c.d2h_bytes) +
         " device to host, " + std::to_string(c.swapped_chunks) + " activation groups swapped\n";
    if (s.swap.overlap) o += detail::overlap_lines(c);
    if (r.best_without_swap && !(*r.best_without_swap == *r.chosen)) {
      auto const& b = r.best_without_swap_outcome;
      o += "best without swap: " + describe(*r.best_without_swap) + "\n";
      double const d = overhead(c.step_ns, b.step_ns);
      o += "  step time " + secs(b.step_ns) + "; the chosen plan's step is " +
           detail::fmt("%.2f %%", std::abs(d) * 100) + (d <= 0 ? " shorter" : " longer") + "\n";
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
  o += format_alternatives(r);
  o += "\nsimulated " + std::to_string(r.simulated.size()) + " of " + std::to_string(r.candidates) +
       " candidates (steps within " + detail::fmt("%.2f %%", r.tolerance * 100) +
       " of the fastest count as equally fast; of those the plan moves the fewest bytes over the host link, then "
       "keeps most of your settings among peaks within " +
       detail::resolution_text(r.peak_resolution) +
       " of the lowest, then peaks lowest; swapping more is assumed never to shorten the step; " +
       std::to_string(r.simulations) + " simulations of " + std::to_string(r.simulated_steps) +
       " training steps in all):\n";
  o += "  " + pad("step time", 10, true) + pad("peak", 11, true) + pad("host link", 12, true) + "  " +
       pad("candidate", 96) + "verdict\n";
  for (auto const& e : r.simulated)
    o += "  " + pad(secs(e.outcome.step_ns), 10, true) + pad(plan_gb(e.outcome.peak_bytes), 11, true) +
         pad(plan_gb(detail::link_bytes(e.outcome)), 12, true) + "  " + pad(describe(e.choice), 96) + " " + e.verdict +
         "\n";
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
    j["activations"] = !c.ranks.empty()                                 ? Json(nullptr)
                       : c.activation_min_gap == 0                      ? Json("none")
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
        jr["activations"] = x.activation_min_gap == 0                        ? Json("none")
                            : x.activation_min_gap <= schedule::min_swap_gap ? Json("all")
                                                                             : Json(x.activation_min_gap);
        jr["activation_tenths"] = x.activation_min_gap == 0 ? Json(nullptr) : Json(x.activation_tenths);
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
  j["tolerance"] = r.tolerance;
  j["peak_resolution_bytes"] = r.peak_resolution;
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
  j["work"] = {{"simulations", r.simulations}, {"simulated_steps", r.simulated_steps}};
  Json& sim = j["simulated"] = Json::array();
  for (auto const& e : r.simulated) {
    Json x = choice(e.choice);
    x["outcome"] = outcome(e.outcome);
    x["fits"] = e.fits;
    x["verdict"] = e.verdict;
    sim.push_back(std::move(x));
  }
  j["skipped"] = r.skipped;
  Json alts = Json::array();
  for (auto const& a : r.alternatives) {
    Json x = Json::object();
    x["key"] = a.key;
    x["title"] = a.title;
    x["description"] = a.description;
    x["simulated"] = a.simulated;
    x["step_ns"] = a.step_ns;
    x["peak_bytes"] = a.peak_bytes;
    x["peak_rank"] = a.peak_rank;
    x["host_bytes"] = a.host_bytes;
    x["fits"] = a.fits;
    x["changes"] = a.changes;
    Json rs = Json::array();
    for (auto const& q : a.ranks)
      rs.push_back(Json{{"step_ns", q.step_ns}, {"peak_bytes", q.peak_bytes}, {"host_bytes", q.host_bytes}});
    x["ranks"] = std::move(rs);
    alts.push_back(std::move(x));
  }
  j["alternatives"] = std::move(alts);
  auto const& v = r.verdict_line;
  Json jv = Json::object();
  jv["text"] = v.text;
  jv["choice"] = v.choice ? Json(r.alternatives.at(*v.choice).key) : Json(nullptr);
  jv["next_best"] = v.next_best ? Json(r.alternatives.at(*v.next_best).key) : Json(nullptr);
  jv["reason"] = v.reason;
  j["verdict"] = std::move(jv);
  return j;
}

/// The plan as JSON with, in "chosen", the scenario's settings it changes: "changes": [{"field",
/// "from", "to"}, ...] (docs/cli.md).
template <class Json = nlohmann::ordered_json>
Json to_json(plan_result const& r, scenario const& s) {
  Json j = to_json<Json>(r);
  j["model_error"] = error_json<Json>(s);
  j["moe_pace"] = pace_json<Json>(s);
  if (r.chosen) {
    Json ch = Json::array();
    for (auto const& x : plan_changes(*r.chosen, s))
      ch.push_back(Json{{"field", x.field}, {"from", x.from}, {"to", x.to}});
    j["chosen"]["changes"] = std::move(ch);
  }
  return j;
}

/// The alternatives as a chart: step time against peak, one point each, the budget as a level
/// (`pipeswap plan --svg`).
inline svg::chart alternatives_chart(plan_result const& r, scenario const& s) {
  svg::chart c;
  c.title = "Alternatives: step time against peak memory, " + s.model.name + ", " + std::to_string(s.pipeline.ranks) +
            " ranks";
  c.x_label = "step time (s)";
  c.y_label = "peak device memory (GB)";
  for (std::size_t i = 0; i < r.alternatives.size(); ++i) {
    auto const& a = r.alternatives[i];
    c.markers.push_back({(r.verdict_line.choice == i ? "* " : "") + a.title + " (" + detail::secs(a.step_ns) + ", " +
                             detail::gb(a.peak_bytes) + ")",
                         static_cast<double>(a.step_ns) / 1e9, static_cast<double>(a.peak_bytes) / 1e9,
                         std::string(svg::palette[i % std::size(svg::palette)])});
  }
  c.levels.push_back({"budget " + detail::gb(r.budget_bytes), static_cast<double>(r.budget_bytes) / 1e9, "#d55e00"});
  return c;
}

} // namespace pipeswap::sim
