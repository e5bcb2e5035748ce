// Schedule passes against order length, up to about a million entries: swap injection, the per-order
// check and the whole-schedule check (pairing, dataflow, deadlock simulation), each next to a plain
// copy of the same entries, the least any pass that writes or walks the order can cost. Complexity()
// fits the growth: every pass is O(n).
//
//   meson test -C build --benchmark        or        build/bench/schedule_bench
#include <benchmark/benchmark.h>

#include <cstdint>

#include <malloc.h>

#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/validate.hpp>

namespace ps = pipeswap::schedule;

namespace {

// Rank 0 of a two-rank GPipe: every micro-batch is swapped and its FWD-BWD gap is the whole pipeline,
// the worst case of the reference's quadratic injection. Four entries per micro-batch.
ps::order gpipe_order(std::int64_t entries) { return ps::gpipe(2, ps::index_type(entries / 4))[0]; }

// Rank 0 of an eight-rank 1F1B: steady state, short gaps, dense P2P runs.
ps::order one_f_one_b_order(std::int64_t entries) { return ps::one_f_one_b(8, ps::index_type(entries / 4))[0]; }

void copy_baseline(benchmark::State& state) {
  auto const o = gpipe_order(state.range(0));
  for (auto _ : state) {
    ps::order copy = o;
    benchmark::DoNotOptimize(copy.data());
  }
  state.SetComplexityN(std::int64_t(o.size()));
  state.SetItemsProcessed(std::int64_t(state.iterations()) * std::int64_t(o.size()));
}

template <ps::order (*Make)(std::int64_t)>
void inject(benchmark::State& state) {
  auto const o = Make(state.range(0));
  for (auto _ : state) {
    auto injected = ps::inject_swap_steps(o);
    benchmark::DoNotOptimize(injected.data());
  }
  state.SetComplexityN(std::int64_t(o.size()));
  state.SetItemsProcessed(std::int64_t(state.iterations()) * std::int64_t(o.size()));
}

void check_order(benchmark::State& state) {
  auto const o = ps::inject_swap_steps(gpipe_order(state.range(0)));
  for (auto _ : state) {
    auto problems = ps::check_order(o);
    benchmark::DoNotOptimize(problems.data());
  }
  state.SetComplexityN(std::int64_t(o.size()));
  state.SetItemsProcessed(std::int64_t(state.iterations()) * std::int64_t(o.size()));
}

// A four-rank 1F1B schedule with `range(0)` entries over all ranks.
void check_schedule(benchmark::State& state) {
  auto const orders = ps::one_f_one_b(4, ps::index_type(state.range(0) / 20));
  std::int64_t entries = 0;
  for (auto const& o : orders) entries += std::int64_t(o.size());
  ps::stage_layout const layout(4);
  for (auto _ : state) {
    auto report = ps::check_schedule(orders, layout);
    if (!report.ok()) state.SkipWithError("generated schedule reported as invalid");
    benchmark::DoNotOptimize(report.problems.data());
  }
  state.SetComplexityN(entries);
  state.SetItemsProcessed(std::int64_t(state.iterations()) * entries);
}

constexpr std::int64_t smallest = 1 << 12;
constexpr std::int64_t largest = 1 << 20;

} // namespace

BENCHMARK(copy_baseline)
    ->RangeMultiplier(4)
    ->Range(smallest, largest)
    ->Unit(benchmark::kMicrosecond)
    ->Complexity(benchmark::oN);
BENCHMARK(inject<gpipe_order>)
    ->Name("inject/gpipe")
    ->RangeMultiplier(4)
    ->Range(smallest, largest)
    ->Unit(benchmark::kMicrosecond)
    ->Complexity(benchmark::oN);
BENCHMARK(inject<one_f_one_b_order>)
    ->Name("inject/1f1b")
    ->RangeMultiplier(4)
    ->Range(smallest, largest)
    ->Unit(benchmark::kMicrosecond)
    ->Complexity(benchmark::oN);
BENCHMARK(check_order)
    ->RangeMultiplier(4)
    ->Range(smallest, largest)
    ->Unit(benchmark::kMicrosecond)
    ->Complexity(benchmark::oN);
BENCHMARK(check_schedule)
    ->RangeMultiplier(4)
    ->Range(smallest, largest)
    ->Unit(benchmark::kMicrosecond)
    ->Complexity(benchmark::oN);

// glibc serves allocations above its 32 MiB mmap threshold with fresh pages on every call, so at a
// million entries each iteration would mostly time page faults; keeping such blocks in the heap
// measures the passes themselves.
int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
