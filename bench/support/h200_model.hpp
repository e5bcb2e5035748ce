// The simulated benchmarks' model: Adam over 1B fp32 parameters in 200 tensors on the mock backend
// with the H200-like timing model (55 GB/s each way, 4.8 TB/s HBM), timing only (no bytes are kept).
// bench/optimizer_bench.cpp (one step) and bench/overlap_bench.cpp (steady-state iterations) share
// it, so their figures are of the same model.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

namespace pipeswap::bench {

using mock_adam = adam<mock::backend>;

inline constexpr std::size_t model_params = 1'000'000'000;
inline constexpr std::size_t model_tensors = 200;
/// Bytes of the swappable state: exp_avg and exp_avg_sq, fp32.
inline constexpr double model_state_bytes = 8.0 * model_params;

/// Mock options of the simulated device: the H200-like timing model, nothing materialized.
inline mock::options h200_timing_only() {
  mock::options o;
  o.timing = mock::timing_model::h200_pcie();
  o.materialize = false;
  return o;
}

/// The link's bandwidth in one direction (bytes per second).
inline double h200_link_bytes_per_second() {
  return static_cast<double>(mock::timing_model::h200_pcie().h2d.bytes_per_second);
}

/// Registers the model's tensors with `opt`: per tensor an fp32 parameter and an fp32 gradient of
/// model_params / model_tensors elements each, allocated on `b`'s compute stream.
inline void add_model_params(mock::backend& b, mock_adam& opt) {
  constexpr std::size_t per = model_params / model_tensors;
  for (std::size_t i = 0; i < model_tensors; ++i) {
    auto const p = b.allocate_device(per * 4, b.current_stream());
    auto const g = b.allocate_device(per * 4, b.current_stream());
    opt.add_param({p, g, per, dtype::f32, dtype::f32, false});
  }
}

/// swap_config for the model: `swap_times` batches, packed or per tensor; with `swap` false no state
/// key is swapped (the no-swap baseline: the state stays on the device).
inline swap_config model_swap_config(std::size_t swap_times, bool packed, bool swap) {
  swap_config cfg;
  cfg.swap_times = swap_times;
  cfg.packed = packed;
  if (!swap) cfg.state_keys = std::vector<std::string>{};
  return cfg;
}

} // namespace pipeswap::bench
