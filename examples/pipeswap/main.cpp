// pipeswap — the command: the swap simulator on a scenario (simulate), the swap planner (plan), and
// script-facing tools over the schedule and partition layers (schedule, inject, validate, partition).
// docs/cli.md describes every subcommand, its input and output and its exit statuses.
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include <pipeswap/error.hpp>

#include "commands.hpp"

namespace {

using namespace pipeswap_cli;

std::map<std::string, progress_mode> const progress_modes = {
    {"auto", progress_mode::automatic}, {"always", progress_mode::always}, {"never", progress_mode::never}};

void add_progress(CLI::App* app, progress_mode& mode) {
  app->add_option("--progress", mode,
                  "progress on stderr: auto (when stderr is a terminal and the run lasts a second), always, never")
      ->transform(CLI::CheckedTransformer(progress_modes, CLI::ignore_case))
      ->default_str("auto");
}

void add_indent(CLI::App* app, int& indent) {
  app->add_option("--indent", indent, "pretty-print the JSON output with N spaces (default: compact)")
      ->check(CLI::Range(0, 16));
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipeswap: simulate and plan optimizer-state and activation swap for pipeline-parallel training.\n"
               "With no subcommand, runs `simulate` on the built-in scenario."};
  app.set_version_flag("--version", "pipeswap 0.1.0");
  app.footer("Exit status: 0 success, 1 validation failure (problems found, nothing fits), 2 bad input.\n"
             "Documentation: docs/cli.md, docs/simulator.md.");

  simulate_args sim;
  auto* simulate = app.add_subcommand("simulate", "simulate one step of a scenario without swap, with activation "
                                                  "swap, with optimizer-state swap and with both; report per rank");
  simulate->add_option("--scenario", sim.scenario, "scenario JSON file ('-' for stdin); default: the built-in one");
  simulate->add_option("--trace", sim.trace, "Chrome/Perfetto trace of the 'both' step (empty: none)")
      ->capture_default_str();
  simulate->add_option("--svg", sim.svg, "SVG chart of device memory over time (empty: none)")->capture_default_str();
  simulate->add_option("--rank", sim.svg_rank, "the rank the chart shows (default: the highest no-swap peak)");
  simulate->add_flag("--json", sim.json, "print the report as JSON instead of a table");
  add_progress(simulate, sim.progress);

  plan_args pl;
  auto* plan = app.add_subcommand("plan", "choose what to swap so every rank fits a memory budget at the lowest "
                                          "simulated step time");
  plan->add_option("--scenario", pl.scenario, "scenario JSON file ('-' for stdin); default: the built-in one");
  plan->add_option("--budget", pl.budget_gb, "device memory budget in GB (10^9 bytes); default: the device's memory")
      ->check(CLI::PositiveNumber);
  plan->add_option("--tolerance", pl.tolerance,
                   "percent of the fastest step within which plans count as equally fast (then the fewest "
                   "host-link bytes wins, then the lowest peak); default: the scenario's plan.tolerance (0.5)")
      ->check(CLI::Range(0.0, 99.999));
  plan->add_option("--svg", pl.svg, "write the alternatives (step time against peak, one point each) as an SVG chart");
  plan->add_flag("--json", pl.json, "print the plan as JSON");
  plan->add_flag("--exhaustive", pl.exhaustive,
                 "simulate every uniform candidate before the per-rank steps (slow): what the search's "
                 "choice is checked against");
  add_progress(plan, pl.progress);

  scenario_args sc;
  auto* scenario = app.add_subcommand("scenario", "print a scenario with every field filled in (default: the "
                                                  "built-in one), a start for a scenario file");
  auto* from_file = scenario->add_option("--scenario", sc.scenario, "scenario JSON file to complete ('-' for stdin)");
  auto* megatron =
      scenario
          ->add_option("--megatron", sc.megatron,
                       "a Megatron-LM job's arguments ('-' for stdin): its launch command line or a test's MODEL_ARGS "
                       "block; prints the scenario they describe, notes on stderr")
          ->excludes(from_file);
  scenario->add_option("--gpus", sc.gpus, "with --megatron: all GPUs (default: torchrun's --nnodes × --nproc-per-node)")
      ->check(CLI::PositiveNumber)
      ->needs(megatron);
  scenario->add_option("--gpus-per-node", sc.gpus_per_node, "with --megatron: GPUs per node (default: 8)")
      ->check(CLI::PositiveNumber)
      ->needs(megatron);
  scenario->add_option("--device", sc.device, "with --megatron: a device preset, \"H100 SXM\", \"H200\" or \"B200\"")
      ->needs(megatron);
  scenario->add_option("--vocab", sc.vocab, "with --megatron: the tokenizer's vocabulary (default: --vocab-size)")
      ->check(CLI::PositiveNumber)
      ->needs(megatron);
  scenario->add_option("--name", sc.name, "with --megatron: the model's name in reports")->needs(megatron);

  schedule_args sh;
  auto* schedule = app.add_subcommand("schedule", "print a pipeline schedule: {\"ranks\": [order, ...]}");
  schedule->add_option("--kind", sh.kind, "gpipe, 1f1b or interleaved")
      ->required()
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  schedule->add_option("--ranks", sh.ranks, "pipeline ranks")->required();
  schedule->add_option("--micro", sh.micro, "micro-batches")->required();
  schedule->add_option("--stages-per-rank", sh.stages_per_rank, "stages per rank (interleaved)")->capture_default_str();
  schedule->add_flag("--overlap-b-f", sh.overlap_b_f, "interleaved: OVERLAP_B_F composites in the steady state");
  add_indent(schedule, sh.indent);

  inject_args in;
  auto* inject = app.add_subcommand("inject", "read one order (a JSON array), print it with activation-swap steps");
  inject->add_option("input", in.input, "JSON file ('-' or absent: stdin)");
  inject->add_option("--min-gap", in.min_gap,
                     "swap only chunks whose backward trails their forward by at least "
                     "this many compute slots (the injector's minimum is 4)");
  add_indent(inject, in.indent);

  validate_args va;
  auto* validate = app.add_subcommand("validate", "read {\"ranks\": [...]} or one order; report problems and "
                                                  "deadlocks as JSON; exit 1 if any");
  validate->add_option("input", va.input, "JSON file ('-' or absent: stdin)");
  validate->add_option("--stages-per-rank", va.stages_per_rank, "stages per rank (default: as many as the steps need)")
      ->check(CLI::PositiveNumber);
  validate->add_option("--placement", va.placement, "stage placement: loop or v")
      ->check(CLI::IsMember({"loop", "v"}))
      ->capture_default_str();
  add_indent(validate, va.indent);

  partition_args pa;
  auto* partition = app.add_subcommand("partition", "read {\"costs\": [...], \"swap_times\": K}; print the swap "
                                                    "batches: {\"sizes\": [...], \"batch_costs\": [...]}");
  partition->add_option("input", pa.input, "JSON file ('-' or absent: stdin)");
  partition
      ->add_option("--policy", pa.policy,
                   "reference (whole units, the reference rule) or split (equal "
                   "batches, cutting units; prints the ranges too)")
      ->check(CLI::IsMember({"reference", "split"}))
      ->capture_default_str();
  add_indent(partition, pa.indent);

  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    app.exit(e, std::cerr, std::cerr);
    return exit_bad_input;
  }

  std::string const name = app.get_subcommands().empty() ? "simulate" : app.get_subcommands().front()->get_name();
  try {
    if (name == "simulate") return run_simulate(sim);
    if (name == "plan") return run_plan(pl);
    if (name == "scenario") return run_scenario(sc);
    if (name == "schedule") return run_schedule(sh);
    if (name == "inject") return run_inject(in);
    if (name == "validate") return run_validate(va);
    if (name == "partition") return run_partition(pa);
  } catch (pipeswap::invalid_argument const& e) {
    std::cerr << "pipeswap " << name << ": " << e.what() << "\n";
    return exit_bad_input;
  } catch (bad_input const& e) {
    std::cerr << "pipeswap " << name << ": " << e.what() << "\n";
    return exit_bad_input;
  } catch (std::exception const& e) {
    std::cerr << "pipeswap " << name << ": internal error: " << e.what() << "\n";
    return exit_internal;
  }
  std::cerr << "pipeswap: unknown subcommand " << name << "\n";
  return exit_bad_input;
}
