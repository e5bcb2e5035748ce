// The overlapped optimizer step (#15) against the reference step and against no swap.
//
// A training iteration on the mock backend with the H200-like timing model (55 GB/s each way,
// 4.8 TB/s HBM), timing only: a stand-in forward kernel, a stand-in backward kernel, then the Adam
// step of 1B fp32 parameters (8 GB of exp_avg + exp_avg_sq) in 200 tensors. Three loops:
//   no swap      the state stays on the device; the step is Adam alone;
//   reference    optimizer_swap with the defaults: every batch crosses the link inside the step,
//                and the compute stream waits the last D2H before the next forward;
//   overlapped   prefetch() issued while the backward kernel runs on the compute stream (as many
//                batches as a device budget of `budget_pct` % of the state admits), the resident
//                share, and defer_offload: the last D2Hs drain under the next forward.
// The figure is the steady-state iteration period (simulated; between forward starts, iterations 3
// to 5), reported per loop and as ratios from one run: overlapped / no swap, reference / no swap,
// overlapped / reference. The raw baseline is the no-swap loop; the physical bound of a swapped
// iteration is max(forward + backward + Adam, 8 GB / 55 GB/s per direction).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include <pipeswap/core/budget.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/h200_model.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;

namespace {

using ps::bench::mock_adam;
using ps::bench::model_state_bytes;

enum class loop { no_swap, reference, overlapped };

struct figures {
  double period_ms = 0;
  double peak_gb = 0;
  double budget_high_gb = 0;
  std::size_t prefetched = 0;
};

/// The steady-state period of one iteration of `l`: forward (`fwd_ms`), backward (`bwd_ms`), step.
figures run(loop l, std::size_t swap_times, bool packed, double budget_pct, double resident_pct, double fwd_ms,
            double bwd_ms) {
  mock::backend b{ps::bench::h200_timing_only()};
  ps::transfer_engine<mock::backend> x(b);
  std::optional<ps::device_budget> budget;
  if (l == loop::overlapped) {
    budget.emplace(static_cast<std::uint64_t>(model_state_bytes * budget_pct / 100.0));
    x.set_budget(&*budget);
  }
  mock_adam opt(b);
  ps::bench::add_model_params(b, opt);
  auto cfg = ps::bench::model_swap_config(swap_times, packed, l != loop::no_swap);
  if (l == loop::overlapped) {
    cfg.defer_offload = true;
    cfg.resident_share = static_cast<std::size_t>(model_state_bytes * resident_pct / 100.0);
  }
  ps::optimizer_swap<mock_adam> rt(x, opt, cfg);
  auto const cs = b.current_stream();
  auto const ns = [](double ms) { return static_cast<mock::sim_time>(ms * 1e6); };
  std::vector<mock::sim_time> starts;
  figures f;
  for (int it = 0; it < 6; ++it) {
    starts.push_back(b.record_event(cs).time);
    b.launch(cs, {"forward", {}, {}, ns(fwd_ms)});
    b.launch(cs, {"backward", {}, {}, ns(bwd_ms)});
    // The host issues the prefetch right after enqueueing the backward: its H2Ds run under it.
    if (l == loop::overlapped) f.prefetched = std::max(f.prefetched, rt.prefetch());
    rt.step();
  }
  f.period_ms = static_cast<double>(starts[5] - starts[3]) / 2e6;
  f.peak_gb = static_cast<double>(b.peak_device_bytes()) / 1e9;
  if (budget) f.budget_high_gb = static_cast<double>(budget->high_water()) / 1e9;
  return f;
}

void BM_overlapped_step_1B(benchmark::State& state) {
  auto const k = static_cast<std::size_t>(state.range(0));
  bool const packed = state.range(1) != 0;
  auto const budget_pct = static_cast<double>(state.range(2));
  auto const resident_pct = static_cast<double>(state.range(3));
  double const fwd_ms = 60, bwd_ms = 120; // the stand-in compute
  figures none, ref, ovl;
  for (auto _ : state) {
    none = run(loop::no_swap, k, packed, 0, 0, fwd_ms, bwd_ms);
    ref = run(loop::reference, k, packed, 0, 0, fwd_ms, bwd_ms);
    ovl = run(loop::overlapped, k, packed, budget_pct, resident_pct, fwd_ms, bwd_ms);
    state.SetIterationTime(ovl.period_ms / 1e3);
  }
  auto const link_ms = model_state_bytes / ps::bench::h200_link_bytes_per_second() * 1e3;
  state.counters["no_swap_ms"] = none.period_ms;
  state.counters["reference_ms"] = ref.period_ms;
  state.counters["overlapped_ms"] = ovl.period_ms;
  state.counters["bound_ms"] = std::max(none.period_ms, link_ms);
  state.counters["ovl/none"] = ovl.period_ms / none.period_ms;
  state.counters["ref/none"] = ref.period_ms / none.period_ms;
  state.counters["ovl/ref"] = ovl.period_ms / ref.period_ms;
  state.counters["prefetched"] = static_cast<double>(ovl.prefetched);
  state.counters["peak_GB"] = ovl.peak_gb;
  state.counters["ref_peak_GB"] = ref.peak_gb;
  state.counters["budget_high_GB"] = ovl.budget_high_gb;
}

BENCHMARK(BM_overlapped_step_1B)
    ->ArgsProduct({{16}, {0, 1}, {0, 25, 50, 100}, {0, 25}})
    ->ArgNames({"swap_times", "packed", "budget_pct", "resident_pct"})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
