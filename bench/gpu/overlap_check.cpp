// overlap_check — the overlapped optimizer step (#15) on a CUDA device, for the next GPU run.
//
// An iteration is a stand-in backward on the compute stream (cudaMemsetAsync over a scratch buffer,
// repeated to take --backward-ms; it occupies the device but not the PCIe link) followed by the
// fused Adam step of N fp32 parameters (default 2^28: 2 GiB of exp_avg + exp_avg_sq). Three loops:
//   no swap      the state stays on the device;
//   reference    optimizer_swap with the defaults: the whole state crosses the link inside the step;
//   overlapped   prefetch() issued right after the backward is enqueued (its H2Ds run under it),
//                defer_offload (the last D2Hs drain into the next iteration), a device budget of
//                --budget-pct % of the state and a --resident-pct % resident share.
// Figure: the steady-state iteration period (CUDA events on the compute stream between iteration
// starts 3 and 5), per loop, and the ratios overlapped / no swap, reference / no swap, overlapped /
// reference from one run. Parameters after the same steps are compared byte for byte between the
// three loops (swapping must not change a bit).
//
// Output: a JSON object on the last line of stdout (and in --out FILE if given).
// Exit status: 0 ok; 1 a bit mismatch; 2 bad arguments or a CUDA error; 77 no CUDA device.
//
//   overlap_check [--params N] [--tensors T] [--backward-ms M] [--budget-pct P] [--resident-pct R]
//                 [--swap-times K] [--per-tensor] [--out FILE] | --version
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/backend/cuda.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/cuda/adam_kernels.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "values.hpp"

namespace ps = pipeswap;
namespace cuda = pipeswap::cuda;

namespace {

struct options {
  std::size_t params = std::size_t{1} << 28;
  std::size_t tensors = 64;
  double backward_ms = 0; // 0: the time the state takes to cross the link one way (measured)
  double budget_pct = 100;
  double resident_pct = 0;
  std::size_t swap_times = 16;
  bool packed = true;
  std::string out;
};

enum class loop { no_swap, reference, overlapped };

struct figures {
  double period_ms = 0;
  std::size_t prefetched = 0;
  double budget_high_gb = 0;
  std::vector<std::byte> params; // every parameter byte after the loop
};

/// A stand-in backward: `reps` memsets of `bytes` on the compute stream.
struct stand_in {
  ps::device_pointer_t<cuda::backend> mem{};
  void* scratch = nullptr;
  std::size_t bytes = std::size_t{256} << 20;
  int reps = 1;
  void enqueue(cudaStream_t s) const {
    for (int i = 0; i < reps; ++i) PIPESWAP_CUDA_TRY(cudaMemsetAsync(scratch, i & 0xff, bytes, s));
  }
};

figures run_loop(cuda::backend& b, options const& o, loop l, stand_in const& bwd) {
  auto const cs = b.current_stream();
  ps::transfer_engine<cuda::backend> x(b);
  double const state_bytes = 8.0 * static_cast<double>(o.params);
  std::optional<ps::device_budget> budget;
  if (l == loop::overlapped) {
    budget.emplace(static_cast<std::uint64_t>(state_bytes * o.budget_pct / 100.0));
    x.set_budget(&*budget);
  }
  ps::adam<cuda::backend> opt(b, {.lr = 1e-3});
  std::size_t const per = o.params / o.tensors;
  std::vector<ps::device_pointer_t<cuda::backend>> ps_, gs_;
  std::vector<float> host(per);
  for (std::size_t t = 0; t < o.tensors; ++t) {
    auto p = b.allocate_device(per * 4, cs);
    auto g = b.allocate_device(per * 4, cs);
    b.synchronize(b.record_event(cs));
    for (std::size_t i = 0; i < per; ++i) host[i] = ps::bench::value_at(t * per + i, 1);
    PIPESWAP_CUDA_TRY(cudaMemcpy(p.get(), host.data(), per * 4, cudaMemcpyHostToDevice));
    for (std::size_t i = 0; i < per; ++i) host[i] = ps::bench::value_at(t * per + i, 2) * 1e-2f;
    PIPESWAP_CUDA_TRY(cudaMemcpy(g.get(), host.data(), per * 4, cudaMemcpyHostToDevice));
    ps_.push_back(p);
    gs_.push_back(g);
    opt.add_param({p, g, per, ps::dtype::f32, ps::dtype::f32, false});
  }
  ps::swap_config cfg;
  cfg.swap_times = o.swap_times;
  cfg.packed = o.packed;
  cfg.min_swap_numel = 0;
  if (l == loop::no_swap) cfg.state_keys = std::vector<std::string>{};
  if (l == loop::overlapped) {
    cfg.defer_offload = true;
    cfg.resident_share = static_cast<std::size_t>(state_bytes * o.resident_pct / 100.0);
  }
  figures f;
  {
    ps::optimizer_swap<ps::adam<cuda::backend>> rt(x, opt, cfg);
    std::vector<cudaEvent_t> starts(6);
    for (auto& e : starts) PIPESWAP_CUDA_TRY(cudaEventCreate(&e));
    for (int it = 0; it < 6; ++it) {
      PIPESWAP_CUDA_TRY(cudaEventRecord(starts[it], cs.get()));
      bwd.enqueue(cs.get());
      if (l == loop::overlapped) f.prefetched = std::max(f.prefetched, rt.prefetch());
      rt.step();
    }
    rt.synchronize_host_mirrors();
    b.synchronize(b.record_event(cs));
    float ms = 0;
    PIPESWAP_CUDA_TRY(cudaEventElapsedTime(&ms, starts[3], starts[5]));
    f.period_ms = ms / 2.0;
    for (auto& e : starts) PIPESWAP_CUDA_TRY(cudaEventDestroy(e));
  }
  if (budget) f.budget_high_gb = static_cast<double>(budget->high_water()) / 1e9;
  f.params.resize(o.params / o.tensors * o.tensors * 4);
  for (std::size_t t = 0; t < o.tensors; ++t) {
    PIPESWAP_CUDA_TRY(cudaMemcpy(f.params.data() + t * per * 4, ps_[t].get(), per * 4, cudaMemcpyDeviceToHost));
  }
  for (std::size_t t = 0; t < o.tensors; ++t) {
    b.deallocate_device(ps_[t], per * 4, cs);
    b.deallocate_device(gs_[t], per * 4, cs);
  }
  b.synchronize(b.record_event(cs));
  return f;
}

int usage(char const* why) {
  std::fprintf(stderr,
               "overlap_check: %s\nusage: overlap_check [--params N] [--tensors T] [--backward-ms M] "
               "[--budget-pct P] [--resident-pct R] [--swap-times K] [--per-tensor] [--out FILE] | --version\n",
               why);
  return 2;
}

int run(options o) {
  int devices = 0;
  cudaError_t const st = cudaGetDeviceCount(&devices);
  if (st != cudaSuccess || devices == 0) {
    std::printf("overlap_check: no CUDA device: %s\n",
                st != cudaSuccess ? cudaGetErrorString(st) : "cudaGetDeviceCount found 0 devices");
    return 77;
  }
  cuda::backend b;
  auto const cs = b.current_stream();
  stand_in bwd;
  bwd.mem = b.allocate_device(bwd.bytes, cs);
  bwd.scratch = bwd.mem.get();
  // Calibrate: one memset's time, then as many as the backward should take.
  cudaEvent_t e0, e1;
  PIPESWAP_CUDA_TRY(cudaEventCreate(&e0));
  PIPESWAP_CUDA_TRY(cudaEventCreate(&e1));
  bwd.reps = 8;
  PIPESWAP_CUDA_TRY(cudaEventRecord(e0, cs.get()));
  bwd.enqueue(cs.get());
  PIPESWAP_CUDA_TRY(cudaEventRecord(e1, cs.get()));
  PIPESWAP_CUDA_TRY(cudaEventSynchronize(e1));
  float one = 0;
  PIPESWAP_CUDA_TRY(cudaEventElapsedTime(&one, e0, e1));
  one /= 8;
  if (o.backward_ms <= 0) o.backward_ms = 8.0 * static_cast<double>(o.params) / 50e9 * 1e3; // ~ one way at 50 GB/s
  bwd.reps = std::max(1, static_cast<int>(o.backward_ms / std::max(one, 1e-3f)));
  auto const none = run_loop(b, o, loop::no_swap, bwd);
  auto const ref = run_loop(b, o, loop::reference, bwd);
  auto const ovl = run_loop(b, o, loop::overlapped, bwd);
  bool const exact = none.params == ref.params && none.params == ovl.params;
  b.deallocate_device(bwd.mem, bwd.bytes, cs);
  PIPESWAP_CUDA_TRY(cudaEventDestroy(e0));
  PIPESWAP_CUDA_TRY(cudaEventDestroy(e1));
  char line[1024];
  std::snprintf(
      line, sizeof line,
      "{\"params\": %zu, \"pipeline\": \"%s\", \"swap_times\": %zu, \"backward_ms\": %.3f, \"budget_pct\": %.1f, "
      "\"resident_pct\": %.1f, \"no_swap_ms\": %.3f, \"reference_ms\": %.3f, \"overlapped_ms\": %.3f, "
      "\"ovl_over_none\": %.4f, \"ref_over_none\": %.4f, \"ovl_over_ref\": %.4f, \"prefetched\": %zu, "
      "\"budget_high_GB\": %.3f, \"bit_identical\": %s}",
      o.params, o.packed ? "packed" : "per-tensor", o.swap_times, bwd.reps * one, o.budget_pct, o.resident_pct,
      none.period_ms, ref.period_ms, ovl.period_ms, ovl.period_ms / none.period_ms, ref.period_ms / none.period_ms,
      ovl.period_ms / ref.period_ms, ovl.prefetched, ovl.budget_high_gb, exact ? "true" : "false");
  std::printf("| loop | iteration ms | / no swap |\n|---|---|---|\n| no swap | %.2f | 1.00 |\n"
              "| reference | %.2f | %.3f |\n| overlapped | %.2f | %.3f |\n",
              none.period_ms, ref.period_ms, ref.period_ms / none.period_ms, ovl.period_ms,
              ovl.period_ms / none.period_ms);
  std::printf("bit-identical: %s\n%s\n", exact ? "yes" : "NO", line);
  if (!o.out.empty()) {
    if (auto* f = std::fopen(o.out.c_str(), "w")) {
      std::fprintf(f, "%s\n", line);
      std::fclose(f);
    }
  }
  return exact ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--version") {
      std::printf("overlap_check (pipeswap %d.%d.%d)\n", PIPESWAP_VERSION_MAJOR, PIPESWAP_VERSION_MINOR,
                  PIPESWAP_VERSION_PATCH);
      return 0;
    }
    if (a == "--per-tensor") {
      o.packed = false;
      continue;
    }
    if (i + 1 >= argc) return usage((a + " needs a value").c_str());
    char const* v = argv[++i];
    if (a == "--params")
      o.params = std::strtoull(v, nullptr, 10);
    else if (a == "--tensors")
      o.tensors = std::strtoull(v, nullptr, 10);
    else if (a == "--backward-ms")
      o.backward_ms = std::atof(v);
    else if (a == "--budget-pct")
      o.budget_pct = std::atof(v);
    else if (a == "--resident-pct")
      o.resident_pct = std::atof(v);
    else if (a == "--swap-times")
      o.swap_times = std::strtoull(v, nullptr, 10);
    else if (a == "--out")
      o.out = v;
    else
      return usage(("unknown argument " + a).c_str());
  }
  if (o.params == 0 || o.tensors == 0 || o.tensors > o.params || o.swap_times == 0)
    return usage("sizes must be positive");
  try {
    return run(o);
  } catch (std::exception const& e) {
    std::printf("overlap_check: %s\n", e.what());
    return 2;
  }
}
