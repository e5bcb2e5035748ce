// pipeswap simulate, plan and scenario.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include <pipeswap/sim/megatron_args.hpp>
#include <pipeswap/sim/plan.hpp>
#include <pipeswap/sim/report.hpp>
#include <pipeswap/sim/scenario_json.hpp>
#include <pipeswap/sim/svg.hpp>

#include "commands.hpp"

namespace pipeswap_cli {

namespace sim = pipeswap::sim;

int run_simulate(simulate_args const& a) {
  auto const s = load_scenario(a.scenario);
  if (a.svg_rank && *a.svg_rank >= s.pipeline.ranks)
    throw bad_input("--rank " + std::to_string(*a.svg_rank) + " is not a rank of the scenario (it has " +
                    std::to_string(s.pipeline.ranks) + ")");
  sim::report r;
  {
    progress_meter meter("pipeswap simulate", a.progress);
    r = sim::run_report(
        s, [&](double f) { meter.update(f); }, a.trace.empty() ? std::nullopt : std::optional(sim::swapping::both));
    meter.finish();
  }
  std::uint32_t const rank = a.svg_rank.value_or(sim::highest_peak_rank(r[sim::swapping::none]));
  if (!a.trace.empty()) write_file(a.trace, r[sim::swapping::both].trace_json);
  if (!a.svg.empty()) write_file(a.svg, sim::svg::render(sim::memory_chart(r, rank)));

  if (a.json) {
    auto j = sim::to_json(r);
    j["files"] = {{"trace", a.trace.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.trace)},
                  {"svg", a.svg.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.svg)},
                  {"svg_rank", rank}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << sim::format_table(r);
    if (!a.trace.empty() || !a.svg.empty()) std::cout << "\n";
    if (!a.trace.empty())
      std::cout << "trace of the 'both' step: " << a.trace << " (open it in https://ui.perfetto.dev)\n";
    if (!a.svg.empty()) std::cout << "memory chart of rank " << rank << ": " << a.svg << "\n";
  }
  return exit_ok;
}

int run_plan(plan_args const& a) {
  auto s = load_scenario(a.scenario);
  if (a.tolerance) {
    if (!(*a.tolerance >= 0 && *a.tolerance < 100))
      throw bad_input("--tolerance must be a percentage in [0, 100), got " + std::to_string(*a.tolerance));
    s.plan.tolerance = *a.tolerance / 100;
  }
  std::uint64_t budget = s.device.memory_bytes;
  if (a.budget_gb) {
    double const b = *a.budget_gb * 1e9;
    if (!(b > 0) || !std::isfinite(b) || b >= 0x1p63) throw bad_input("--budget must be a positive number of GB");
    budget = static_cast<std::uint64_t>(std::llround(b));
  }
  sim::plan_result p;
  {
    progress_meter meter("pipeswap plan", a.progress);
    auto space = sim::default_plan_space(s);
    space.exhaustive = a.exhaustive;
    p = sim::plan(
        s, budget, [&](double f) { meter.update(f); }, space);
    meter.finish();
  }
  if (!a.svg.empty()) write_file(a.svg, sim::svg::render(sim::alternatives_chart(p, s)));
  if (a.json)
    std::cout << sim::to_json(p, s).dump(2) << "\n";
  else {
    std::cout << sim::format_plan(p, s);
    if (!a.svg.empty()) std::cout << "alternatives chart: " << a.svg << "\n";
  }
  if (!p.chosen) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(budget) / 1e9);
    std::cerr << "pipeswap plan: nothing fits the budget of " << buf << "\n";
    return exit_failed;
  }
  return exit_ok;
}

int run_scenario(scenario_args const& a) {
  if (a.megatron.empty()) {
    std::cout << sim::to_json(load_scenario(a.scenario)).dump(2) << "\n";
    return exit_ok;
  }
  auto const text = read_input(a.megatron);
  auto const r = sim::scenario_from_megatron_args(text, {a.gpus, a.gpus_per_node, a.device, a.vocab, a.name});
  for (auto const& n : r.notes) std::cerr << "pipeswap scenario: note: " << n << "\n";
  std::cout << sim::to_json(r.s).dump(2) << "\n";
  return exit_ok;
}

} // namespace pipeswap_cli
