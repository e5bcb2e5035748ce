// pipeswap command — the subcommands, each a function of its parsed arguments returning an exit status.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common.hpp"

namespace pipeswap_cli {

struct simulate_args {
  std::string scenario;
  std::string trace = "pipeswap_trace.json";
  std::string svg = "pipeswap_memory.svg";
  std::optional<std::uint32_t> svg_rank;
  bool json = false;
  progress_mode progress = progress_mode::automatic;
};
int run_simulate(simulate_args const&);

struct plan_args {
  std::string scenario;
  std::optional<double> budget_gb;
  std::optional<double> tolerance; ///< percent; unset: the scenario's plan.tolerance
  std::string svg;                 ///< the alternatives chart (empty: none)
  bool json = false;
  bool exhaustive = false; ///< simulate every uniform candidate (plan_space::exhaustive)
  progress_mode progress = progress_mode::automatic;
};
int run_plan(plan_args const&);

struct scenario_args {
  std::string scenario;
  std::string megatron; ///< a Megatron-LM job's arguments (sim/megatron_args.hpp)
  std::optional<std::uint64_t> gpus;
  std::optional<std::uint32_t> gpus_per_node;
  std::optional<std::string> device;
  std::optional<std::uint64_t> vocab;
  std::string name;
};
int run_scenario(scenario_args const&);

struct schedule_args {
  std::string kind;
  std::int64_t ranks = 0;
  std::int64_t micro = 0;
  std::int64_t stages_per_rank = 1;
  bool overlap_b_f = false;
  int indent = -1;
};
int run_schedule(schedule_args const&);

struct inject_args {
  std::string input;
  std::optional<std::size_t> min_gap;
  int indent = -1;
};
int run_inject(inject_args const&);

struct validate_args {
  std::string input;
  std::optional<std::int64_t> stages_per_rank;
  std::string placement = "loop";
  int indent = -1;
};
int run_validate(validate_args const&);

struct partition_args {
  std::string input;
  std::string policy = "reference";
  int indent = -1;
};
int run_partition(partition_args const&);

} // namespace pipeswap_cli
