// Optimizer-state swap benchmarks.
//
// 1. Host bookkeeping: one step of optimizer_swap over a backend whose operations are free, against a
//    raw hand-written loop that issues the same backend calls for the same slots. Reports ns per slot
//    and the ratio to the raw loop.
// 2. Simulated step: a 1B-parameter fp32 Adam step on the mock backend with an H200-like timing model
//    (55 GB/s each way, 4.8 TB/s HBM), per-tensor and packed, swap_times 4..64, against the ideal bound
//    max(H2D bytes / BW, D2H bytes / BW) and against the same step without swap.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/h200_model.hpp"
#include "support/null_backend.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::bench::mock_adam;
using ps::bench::null_adam_kernels;
using ps::bench::null_backend;

namespace {

// ----- 1. host bookkeeping ----------------------------------------------------------------------

using null_adam = ps::adam<null_backend, null_adam_kernels>;

void BM_runtime_step_bookkeeping(benchmark::State& state) {
  auto const params = static_cast<std::size_t>(state.range(0));
  bool const packed = state.range(1) != 0;
  null_backend b;
  ps::transfer_engine<null_backend> x(b);
  null_adam opt(b);
  for (std::size_t i = 0; i < params; ++i) {
    // A parameter and its gradient each get storage of their own: add_param refuses a gradient that
    // shares bytes with any parameter.
    auto const p = b.allocate_device(4096 * 4, 0);
    auto const g = b.allocate_device(4096 * 4, 0);
    opt.add_param({p, g, 4096, ps::dtype::f32, ps::dtype::f32, false});
  }
  ps::swap_config cfg;
  cfg.swap_times = 16;
  cfg.packed = packed;
  cfg.min_swap_numel = 0;
  ps::optimizer_swap<null_adam> rt(x, opt, cfg);
  for (auto _ : state) rt.step();
  auto const slots = static_cast<double>(params * 2);
  state.counters["ns_per_slot"] =
      benchmark::Counter(slots, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * params * 2));
}

/// The floor: the backend calls a minimal hand-written per-tensor swap makes for the same slots
/// (allocate, load, one event per batch, offload, release), with no bookkeeping at all.
void BM_raw_loop_same_calls(benchmark::State& state) {
  auto const params = static_cast<std::size_t>(state.range(0));
  null_backend b;
  auto const h2d = b.new_stream(), d2h = b.new_stream();
  struct raw_slot {
    ps::device_ptr dev;
    std::byte* host;
  };
  std::vector<raw_slot> slots(params * 2);
  for (auto& s : slots) s.host = b.allocate_host(4096 * 4);
  std::size_t const batches = 16, per = (slots.size() + batches - 1) / batches;
  for (auto _ : state) {
    for (std::size_t i = 0; i < slots.size(); i += per) {
      auto const end = std::min(slots.size(), i + per);
      for (auto j = i; j < end; ++j) {
        slots[j].dev = b.allocate_device(4096 * 4, h2d);
        b.copy_h2d(slots[j].dev, slots[j].host, 4096 * 4, h2d);
      }
      b.wait_event(0, b.record_event(h2d));
      b.wait_event(d2h, b.record_event(0));
      for (auto j = i; j < end; ++j) {
        b.copy_d2h(slots[j].host, slots[j].dev, 4096 * 4, d2h);
        b.deallocate_device(slots[j].dev, 4096 * 4, d2h);
      }
      benchmark::DoNotOptimize(b.record_event(d2h));
    }
    benchmark::ClobberMemory();
  }
  auto const n = static_cast<double>(slots.size());
  state.counters["ns_per_slot"] =
      benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * slots.size()));
}

BENCHMARK(BM_runtime_step_bookkeeping)->ArgsProduct({{100, 1000, 10000}, {0, 1}})->ArgNames({"params", "packed"});
BENCHMARK(BM_raw_loop_same_calls)->Arg(100)->Arg(1000)->Arg(10000)->ArgName("params");

// ----- 2. simulated step on an H200-like device ---------------------------------------------------

struct sim_result {
  double step_ms = 0;
  double h2d_gb = 0, d2h_gb = 0;
  double peak_gb = 0;
};

/// One Adam step of the 1B-parameter model (support/h200_model.hpp), timing only.
sim_result simulate(std::size_t swap_times, bool packed, bool swap) {
  mock::backend b{ps::bench::h200_timing_only()};
  ps::transfer_engine<mock::backend> x(b);
  mock_adam opt(b);
  ps::bench::add_model_params(b, opt);
  ps::optimizer_swap<mock_adam> rt(x, opt, ps::bench::model_swap_config(swap_times, packed, swap));
  b.synchronize_device();
  auto const t0 = b.now();
  auto const h0 = b.bytes_copied_h2d(), d0 = b.bytes_copied_d2h();
  rt.step();
  b.synchronize_device();
  sim_result r;
  r.step_ms = static_cast<double>(b.now() - t0) / 1e6;
  r.h2d_gb = static_cast<double>(b.bytes_copied_h2d() - h0) / 1e9;
  r.d2h_gb = static_cast<double>(b.bytes_copied_d2h() - d0) / 1e9;
  r.peak_gb = static_cast<double>(b.peak_device_bytes()) / 1e9;
  return r;
}

void BM_simulated_adam_step_1B(benchmark::State& state) {
  auto const k = static_cast<std::size_t>(state.range(0));
  bool const packed = state.range(1) != 0;
  sim_result r, base;
  for (auto _ : state) {
    r = simulate(k, packed, true);
    base = simulate(1, false, false);
  }
  auto const bw = ps::bench::h200_link_bytes_per_second();
  double const ideal_ms = std::max(r.h2d_gb, r.d2h_gb) * 1e9 / bw * 1e3;
  state.counters["sim_step_ms"] = r.step_ms;
  state.counters["no_swap_ms"] = base.step_ms;
  state.counters["ideal_ms"] = ideal_ms;
  state.counters["efficiency"] = ideal_ms / r.step_ms; // 1.0 = at the link bound
  state.counters["peak_GB"] = r.peak_gb;
  state.counters["no_swap_peak_GB"] = base.peak_gb;
}

BENCHMARK(BM_simulated_adam_step_1B)
    ->ArgsProduct({{4, 8, 16, 32, 64}, {0, 1}})
    ->ArgNames({"swap_times", "packed"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
