// pipeswap — what a user weighs against swapping: a CPU-step offload of the optimizer (ZeRO-Offload,
// Megatron-Core's HybridDeviceOptimizer) modelled from a simulated step without swap, and the table
// of alternatives (no swap, pipeswap's GPU-step swap of optimizer state, activations, both and the
// plan, the CPU-step offload at four fractions, selective and full recomputation), each with its step
// time, peak and host-link bytes for the step and per rank. sim/verdict.hpp picks among them;
// docs/simulator.md ("The alternatives") states the formula and its check against a published
// measurement.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <pipeswap/core/dtype.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/report.hpp>
#include <pipeswap/sim/scenario.hpp>

namespace pipeswap::sim {

/// Bytes the host streams per parameter in a CPU Adam step: read the gradient (g), read and write
/// the fp32 master weight and both fp32 moments (2 × 3 × 4 = 24), write the updated 16-bit weight
/// (e): g + 24 + e, 30 for BF16 weights and FP32 gradients. Without an fp32 master: g + 16 + e. With
/// FSDP's fp32 shard as the master (held_weight_dtype()) there is no 16-bit weight to write: g + 24.
inline double cpu_adam_bytes_per_param(model_spec const& m, parallel_spec const& p = {}) {
  bool const writes_16_bit = held_weight_dtype(m, p) == m.param_dtype;
  return static_cast<double>(size_of(grad_dtype_of(m))) + (m.fp32_master ? 24.0 : 16.0) +
         (writes_16_bit ? static_cast<double>(size_of(m.param_dtype)) : 0.0);
}

/// One rank's figures under an alternative.
struct alternative_rank {
  mock::sim_time step_ns = 0;
  std::uint64_t peak_bytes = 0;
  std::uint64_t host_bytes = 0; ///< over the host link per step, both directions, one device
};

/// One alternative: what it is, and its figures for the step (the slowest rank's time, the highest
/// peak, host-link bytes of all ranks together) and per rank.
struct alternative {
  std::string key;         ///< "none", "optimizer_swap", "activation_swap", "both", "plan", "cpu_offload_25", ...
  std::string title;       ///< what a user reads: "no swap", "CPU-step offload of 25 % of the optimizer", ...
  std::string description; ///< the candidate it ran (describe()), or the formula's inputs
  bool simulated = true;   ///< false: derived by a formula from a simulated step (CPU-step offload)
  mock::sim_time step_ns = 0;
  std::uint64_t peak_bytes = 0;
  std::uint32_t peak_rank = 0;
  std::uint64_t host_bytes = 0;
  bool fits = false;
  /// How many of the scenario's own settings it changes (its recomputation, its distributed
  /// optimizer): the planner's rule keeps more of them among equally low peaks.
  int changes = 0;
  std::vector<alternative_rank> ranks;
};

/// The CPU-step offload of a fraction `f` of the optimizer (Megatron-Core's HybridDeviceOptimizer,
/// ZeRO-Offload), derived from the simulated step without swap of the same scenario: per rank its
/// step time, peak and optimizer state bytes (`steps`, `peaks`, `state_bytes`). Per rank r, with S_r
/// the elements of its optimizer shard (optimizer_state_bytes / 12, or / 8 without an fp32 master or
/// with FSDP's: optimizer_state_bytes_per_element()), after its last backward and one after the
/// other (the CPU step waits for the gradients, the next forward for the weights):
///   gradients to the host   f·S_r·g bytes at the rank's device-to-host rate alone
///   Adam on the host        f·S_r·cpu_adam_bytes_per_param bytes at node.cpu_adam_gbps / k, the
///                           node's host memory bandwidth for the optimizer shared by its k devices
///   weights back            f·S_r·e bytes at the rank's host-to-device rate alone (e: the held
///                           weights' type, held_weight_bytes())
/// added to the rank's step; the step is the slowest rank's. The device keeps the fp32 master and
/// the gradients; the moments of the offloaded fraction leave it: its peak falls by f·S_r·8 bytes
/// (Megatron-Bridge's measurement on Qwen3-30B-A3B: 3.8 GB per quarter, the moments of its shard).
inline alternative cpu_offload_alternative(scenario const& s, std::vector<mock::sim_time> const& steps,
                                           std::vector<std::uint64_t> const& peaks,
                                           std::vector<std::uint64_t> const& state_bytes, double f,
                                           std::uint64_t budget) {
  auto const& m = s.model;
  // the weights that come back: the rank's held weights (FSDP's fp32 shard where it is the master)
  double const g = static_cast<double>(size_of(grad_dtype_of(m))),
               e = static_cast<double>(held_weight_bytes(m, s.parallel));
  double const per_elem = static_cast<double>(optimizer_state_bytes_per_element(m, s.parallel));
  auto const links = host_link_rates(s, std::vector<bool>(s.pipeline.ranks, true));
  double const sharing = static_cast<double>(std::min<std::uint64_t>(s.node.gpus, devices_of(s)));
  double const cpu_rate = s.node.cpu_adam_gbps * 1e9 / sharing;
  alternative a;
  auto const pct = std::to_string(static_cast<int>(std::lround(f * 100)));
  a.key = "cpu_offload_" + pct;
  a.title = "CPU-step offload, " + pct + " %";
  a.description = pct + " % of the optimizer state on the host, its Adam step on the CPU at " +
                  detail::fmt("%g", s.node.cpu_adam_gbps) + " GB/s per node";
  a.simulated = false;
  for (std::size_t r = 0; r < peaks.size(); ++r) {
    double const S = static_cast<double>(state_bytes.at(r)) / per_elem * f;
    double const ns = S * g / links[r].d2h_alone_gbps + S * cpu_adam_bytes_per_param(m, s.parallel) / cpu_rate * 1e9 +
                      S * e / links[r].h2d_alone_gbps + (S > 0 ? 2 * s.device.copy_latency_us * 1e3 : 0.0);
    auto const saved = static_cast<std::uint64_t>(S * 8.0);
    auto const peak = peaks[r];
    alternative_rank x{steps.at(r) + static_cast<mock::sim_time>(std::llround(ns)), peak > saved ? peak - saved : 0,
                       static_cast<std::uint64_t>(S * (g + e))};
    a.ranks.push_back(x);
    a.host_bytes += x.host_bytes;
    a.step_ns = std::max(a.step_ns, x.step_ns);
    if (x.peak_bytes > a.peak_bytes) {
      a.peak_bytes = x.peak_bytes;
      a.peak_rank = static_cast<std::uint32_t>(r);
    }
  }
  a.fits = a.peak_bytes <= budget;
  return a;
}

/// The fractions of the optimizer a CPU-step offload is weighed at.
inline constexpr double cpu_offload_fractions[] = {0.25, 0.5, 0.75, 1.0};

} // namespace pipeswap::sim
