// pipeswap — the one-line verdict of `pipeswap plan`: among the alternatives (sim/alternatives.hpp)
// the one to use, by the planner's rule (of those that fit, the equally fast within the tolerance,
// then the fewest host-link bytes, then among equally low peaks the fewest changes of the scenario's
// settings, then the lowest peak), what it saves against no swap, what it
// costs, and why the next best loses. By construction no alternative beats the one chosen on both
// step time (beyond the tolerance) and peak: one that fits and is faster beyond the tolerance would
// have been chosen, and one over the budget peaks above the choice (tests/cli/plan_search_test.cpp
// checks it over the gallery and a sweep).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <pipeswap/sim/alternatives.hpp>
#include <pipeswap/sim/report.hpp>

namespace pipeswap::sim {

struct verdict {
  std::optional<std::size_t> choice;    ///< index into the alternatives; none when nothing fits
  std::optional<std::size_t> next_best; ///< the best of the others (by the same rule), if any
  std::string reason;                   ///< why the next best loses
  std::string text;                     ///< the line
};

namespace detail {

/// Peaks closer than this to the lowest count as equally low (plan_space::peak_resolution's
/// default): 0.05 GB, a difference the reports print as 0.0 GB and far inside the memory model's
/// error. Among them a plan that keeps more of the scenario's own settings wins: a plan does not
/// change a setting for less.
inline constexpr std::uint64_t peak_resolution_bytes = 50'000'000;
inline std::string resolution_text(std::uint64_t b) { return fmt("%.2f GB", static_cast<double>(b) / 1e9); }
/// Whether two peaks are within `resolution` bytes of each other.
inline bool peaks_close(std::uint64_t a, std::uint64_t b, std::uint64_t resolution) {
  return (a > b ? a - b : b - a) <= resolution;
}

/// What the planner's rule weighs of one candidate (or alternative) that fits.
struct rule_figures {
  mock::sim_time step_ns = 0;
  std::uint64_t host_bytes = 0, peak_bytes = 0;
  int changes = 0; ///< the scenario's own settings it changes
};

/// Whether a step of `step` ns is within `tolerance` of the fastest, `fastest` ns.
inline bool within_tolerance(mock::sim_time step, mock::sim_time fastest, double tolerance) {
  return static_cast<double>(step) <= static_cast<double>(fastest) * (1.0 + tolerance);
}

/// The planner's rule over `n` items, `figures(i)` giving item i's figures or none where it does not
/// fit (or is left out): of those that fit, the ones within `tolerance` of the fastest; of them those
/// moving the fewest host-link bytes; of them those whose peak is within `resolution` bytes of their
/// lowest; of them the one that changes fewest settings, then peaks lowest, then has the shortest
/// step, then comes first. Returns its index, or none when nothing fits. detail::choose (the
/// planner's candidates) and best_alternative (the verdict's alternatives) are this rule.
template <class Figures>
std::optional<std::size_t> pick_by_rule(std::size_t n, double tolerance, std::uint64_t resolution, Figures&& figures) {
  std::vector<std::optional<rule_figures>> f(n);
  std::optional<mock::sim_time> fastest;
  for (std::size_t i = 0; i < n; ++i)
    if ((f[i] = figures(i)) && (!fastest || f[i]->step_ns < *fastest)) fastest = f[i]->step_ns;
  if (!fastest) return std::nullopt;
  for (auto& x : f)
    if (x && !within_tolerance(x->step_ns, *fastest, tolerance)) x.reset();
  std::optional<std::pair<std::uint64_t, std::uint64_t>> least; // the fewest bytes, then their lowest peak
  for (auto const& x : f)
    if (x && (!least || std::pair{x->host_bytes, x->peak_bytes} < *least))
      least = std::pair{x->host_bytes, x->peak_bytes};
  std::optional<std::size_t> best;
  auto key = [&](std::size_t i) { return std::tuple{f[i]->changes, f[i]->peak_bytes, f[i]->step_ns}; };
  for (std::size_t i = 0; i < n; ++i) {
    if (!f[i] || f[i]->host_bytes != least->first || f[i]->peak_bytes > least->second + resolution) continue;
    if (!best || key(i) < key(*best)) best = i;
  }
  return best;
}

/// Where an item that fits loses against the one the rule picked (pick_by_rule), the first key of
/// the rule that tells them apart; `fastest` is the fastest step of all that fit. The verdict's
/// reason (decide) and the planner's table (plan_result::simulated) phrase it, each for its reader.
enum class rule_loss {
  slower,               ///< beyond the tolerance of the fastest
  more_bytes,           ///< within it, but more host-link bytes
  more_changes,         ///< as many bytes and a peak within the resolution, but more changed settings
  higher_peak,          ///< as many bytes, but a peak higher by more than the resolution
  slightly_higher_peak, ///< as many bytes, but a peak higher by at most the resolution
  slower_otherwise,     ///< every key the same but a (tolerated) slower step
  tie,                  ///< the same figures: it comes after the picked one
};
inline rule_loss why_it_loses(rule_figures const& x, rule_figures const& picked, mock::sim_time fastest,
                              double tolerance, std::uint64_t resolution) {
  if (!within_tolerance(x.step_ns, fastest, tolerance)) return rule_loss::slower;
  if (x.host_bytes > picked.host_bytes) return rule_loss::more_bytes;
  if (x.changes > picked.changes && peaks_close(x.peak_bytes, picked.peak_bytes, resolution))
    return rule_loss::more_changes;
  if (x.peak_bytes > picked.peak_bytes + resolution) return rule_loss::higher_peak;
  if (x.peak_bytes > picked.peak_bytes) return rule_loss::slightly_higher_peak;
  return x.step_ns != picked.step_ns ? rule_loss::slower_otherwise : rule_loss::tie;
}

/// What the rule weighs of an alternative.
inline rule_figures figures_of(alternative const& a) { return {a.step_ns, a.host_bytes, a.peak_bytes, a.changes}; }

/// The best of `alts` (skipping `skip`) by the planner's rule (pick_by_rule); when none fits, none.
inline std::optional<std::size_t> best_alternative(std::vector<alternative> const& alts, double tolerance,
                                                   std::uint64_t resolution,
                                                   std::optional<std::size_t> skip = std::nullopt) {
  return pick_by_rule(alts.size(), tolerance, resolution, [&](std::size_t i) -> std::optional<rule_figures> {
    auto const& a = alts[i];
    if (i == skip || !a.fits) return std::nullopt;
    return figures_of(a);
  });
}

} // namespace detail

/// The verdict over `alts`; `none` is the index of the no-swap alternative (the reference of
/// "saves" and "costs"), `budget` the device budget, `tolerance` the planner's, `step_error` the
/// fraction a simulated step time may be off by (sim/accuracy.hpp; 0: not known). A next best that
/// loses on step time by less than that error is said to lose inside the model's error; `resolution`
/// the planner's peak resolution (plan_space::peak_resolution).
inline verdict decide(std::vector<alternative> const& alts, std::size_t none, std::uint64_t budget, double tolerance,
                      double step_error = 0, std::uint64_t resolution = detail::peak_resolution_bytes) {
  verdict v;
  auto const gb = [](std::uint64_t b) { return detail::gb(b); };
  auto const tol = detail::fmt("%.2f %%", tolerance * 100);
  v.choice = detail::best_alternative(alts, tolerance, resolution);
  if (!v.choice) {
    std::size_t low = 0;
    for (std::size_t i = 0; i < alts.size(); ++i)
      if (alts[i].peak_bytes < alts[low].peak_bytes) low = i;
    v.text = "verdict: nothing fits the budget of " + gb(budget) + "; the lowest peak, " + gb(alts.at(low).peak_bytes) +
             " on rank " + std::to_string(alts[low].peak_rank) + ", is " + alts[low].title + "'s";
    return v;
  }
  auto const& c = alts[*v.choice];
  auto const& base = alts.at(none);
  v.next_best = detail::best_alternative(alts, tolerance, resolution, v.choice);
  if (!v.next_best) { // nothing else fits: the one nearest to fitting
    for (std::size_t i = 0; i < alts.size(); ++i)
      if (i != *v.choice && (!v.next_best || alts[i].peak_bytes < alts[*v.next_best].peak_bytes)) v.next_best = i;
  }
  std::string what = c.key == "plan"   ? "use the plan, " + c.description
                     : c.key == "none" ? std::string("swap nothing")
                                       : c.title + " (" + c.description + ")";
  std::string saves = c.peak_bytes < base.peak_bytes
                          ? gb(base.peak_bytes - c.peak_bytes) + " below no swap's " + gb(base.peak_bytes)
                      : c.peak_bytes == base.peak_bytes
                          ? std::string("no swap's peak")
                          : gb(c.peak_bytes - base.peak_bytes) + " above no swap's " + gb(base.peak_bytes);
  v.text = "verdict: " + what + ": peak " + gb(c.peak_bytes) + " on rank " + std::to_string(c.peak_rank) + " (" +
           saves + "), step " + detail::secs(c.step_ns) + " (" + detail::percent(overhead(c.step_ns, base.step_ns)) +
           " against no swap), " + gb(c.host_bytes) + " over the host link per step";
  mock::sim_time fastest = c.step_ns;
  for (auto const& a : alts)
    if (a.fits) fastest = std::min(fastest, a.step_ns);
  if (v.next_best) {
    auto const& n = alts[*v.next_best];
    if (!n.fits)
      v.reason = "over the budget by " + gb(n.peak_bytes - budget) + " on rank " + std::to_string(n.peak_rank);
    else
      switch (detail::why_it_loses(detail::figures_of(n), detail::figures_of(c), fastest, tolerance, resolution)) {
      case detail::rule_loss::slower:
        v.reason = "step " + detail::secs(n.step_ns) + ", " + detail::percent(overhead(n.step_ns, c.step_ns)) +
                   " against this one, beyond the " + tol + " tolerance of the fastest";
        if (overhead(n.step_ns, c.step_ns) < step_error)
          v.reason += ", but inside the model's step-time error of " + detail::fmt("%.0f %%", step_error * 100) +
                      ": the simulation alone does not settle which is faster";
        break;
      case detail::rule_loss::more_bytes:
        v.reason = "as fast within the " + tol + " tolerance, but moves " + gb(n.host_bytes - c.host_bytes) +
                   " more over the host link";
        break;
      case detail::rule_loss::more_changes:
        v.reason = "as fast within the " + tol + " tolerance, moves as many bytes and peaks within " +
                   detail::resolution_text(resolution) + " of it, but changes more of your settings";
        break;
      case detail::rule_loss::higher_peak:
        v.reason = "as fast within the " + tol + " tolerance and moves as many bytes, but peaks " +
                   gb(n.peak_bytes - c.peak_bytes) + " higher";
        break;
      case detail::rule_loss::slightly_higher_peak:
        v.reason = "as fast within the " + tol + " tolerance and moves as many bytes, but peaks higher, by at most " +
                   detail::resolution_text(resolution);
        break;
      case detail::rule_loss::slower_otherwise:
      case detail::rule_loss::tie:
        v.reason = "as fast within the " + tol + " tolerance, as many bytes, as low a peak (listed after it)";
        break;
      }
    v.text += "; next best, " + n.title + ": " + v.reason;
  }
  return v;
}

} // namespace pipeswap::sim
