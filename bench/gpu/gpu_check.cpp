// gpu_check — the one program the GPU check script (bench/gpu/run.sh) runs on a machine with a CUDA
// device. No Boost, no Google Benchmark: it builds with nvcc (or g++ plus one nvcc TU) from the
// repository alone.
//
//   1. self-test    the fused Adam kernels against the host loop (every parameter/gradient type,
//                   master, amsgrad, alignment pattern, both table paths); optimizer_swap over the
//                   CUDA backend: no-swap == host reference math, swap == no swap byte for byte
//                   (both pipelines, several swap_times, whole and split partitions, bf16 masters).
//   2. bandwidth    pinned H2D, D2H and both at once (two streams), cudaMemcpyAsync timed with
//                   CUDA events, best of a few repetitions, GB/s (1e9 bytes/s).
//   3. adam step    N fp32 parameters (default 2^30: 8 GiB of exp_avg + exp_avg_sq) with parameters
//                   and gradients on the device: the no-swap step, then swap_times 4, 8, 16, 32 for
//                   the per-tensor and the packed pipeline; step time (CUDA events on the compute
//                   stream, and host wall time) against the bound max(H2D bytes / H2D GB/s, D2H
//                   bytes / D2H GB/s) from the measured bandwidths; parameters and states compared
//                   byte for byte with the no-swap run after the same steps.
//   4. small tensors  many 64 KiB tensors (default 20000), per-tensor vs packed, same figures.
//
// Next to each measured step, the mock backend's prediction for the same configuration
// (timing_model::h200_pcie, no bytes held): `gpu_check --predict` prints only those, without a device.
//
// Output: a JSON file (--out, default gpu_figures.json) and a Markdown table on stdout.
// Exit status: 0 all checks passed; 1 a check failed (mismatch); 2 bad arguments or a CUDA error;
// 77 no CUDA device ("no CUDA device: ..." on stdout).
//
//   gpu_check [--quick] [--out FILE] [--budget SECONDS] [--selftest-only] [--params N]
//             [--small-tensors N]
//   gpu_check --predict    the mock's predictions alone (no device needed)
//   gpu_check --probe      prints the device and exits 0, or "no CUDA device: ..." and 77
//   gpu_check --version    exits 0 without touching CUDA (the binary runs on this machine)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <pipeswap/backend/cuda.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/cuda/adam_kernels.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/adam_ranges.hpp"
#include "values.hpp"

namespace ps = pipeswap;
namespace cuda = pipeswap::cuda;
using pipeswap::bench::value_at;
using clock_type = std::chrono::steady_clock;

namespace {

// ----- options, budget, output ------------------------------------------------------------------

struct options {
  bool quick = false;
  bool probe = false;
  bool predict = false;
  bool selftest_only = false;
  std::string out = "gpu_figures.json";
  double budget_s = 420;
  std::size_t params = std::size_t{1} << 30;
  std::size_t small_tensors = 20000;
};

clock_type::time_point const started = clock_type::now();
double elapsed_s() { return std::chrono::duration<double>(clock_type::now() - started).count(); }

/// A JSON object built by hand (the GPU machine may lack a JSON library).
class json {
public:
  json& num(std::string const& k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return raw(k, buf);
  }
  json& integer(std::string const& k, std::uint64_t v) { return raw(k, std::to_string(v)); }
  json& boolean(std::string const& k, bool v) { return raw(k, v ? "true" : "false"); }
  json& str(std::string const& k, std::string const& v) {
    std::string e = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') e += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) e += c;
    }
    return raw(k, e + "\"");
  }
  json& obj(std::string const& k, json const& v) { return raw(k, v.text()); }
  json& arr(std::string const& k, std::vector<json> const& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i].text();
    return raw(k, s + "]");
  }
  [[nodiscard]] std::string text() const { return "{" + body_ + "}"; }

private:
  json& raw(std::string const& k, std::string const& v) {
    body_ += (body_.empty() ? "\"" : ", \"") + k + "\": " + v;
    return *this;
  }
  std::string body_;
};

int failures = 0;

void fail(std::string const& what) {
  ++failures;
  std::printf("FAIL: %s\n", what.c_str());
  std::fflush(stdout);
}

// ----- data ---------------------------------------------------------------------------------------

/// Fills n floats with value_at, on every core.
void fill_floats(float* p, std::size_t n, std::uint64_t seed) {
  unsigned const k = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < k; ++t) {
    ts.emplace_back([=] {
      for (std::size_t i = n * t / k; i < n * (t + 1) / k; ++i) p[i] = value_at(i, seed);
    });
  }
  for (auto& t : ts) t.join();
}

/// memcmp on every core; true when equal.
bool same_bytes(void const* a, void const* b, std::size_t n) {
  unsigned const k = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<char> ok(k, 1);
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < k; ++t) {
    ts.emplace_back([&, t] {
      std::size_t const lo = n * t / k, hi = n * (t + 1) / k;
      ok[t] = std::memcmp(static_cast<char const*>(a) + lo, static_cast<char const*>(b) + lo, hi - lo) == 0;
    });
  }
  for (auto& t : ts) t.join();
  return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
}

struct param_spec {
  std::size_t numel;
  ps::dtype type = ps::dtype::f32;
  ps::dtype grad_type = ps::dtype::f32;
  bool master = false;
};

/// Parameters and gradients of a model in two device allocations (each tensor 256-byte aligned),
/// with pinned host copies of their initial values so every run starts from the same bytes.
class model {
public:
  model(cuda::backend& b, std::vector<param_spec> specs, std::uint64_t seed) : b_(b), specs_(std::move(specs)) {
    for (auto const& s : specs_) {
      poff_.push_back(pbytes_);
      goff_.push_back(gbytes_);
      pbytes_ += align(s.numel * ps::size_of(s.type));
      gbytes_ += align(s.numel * ps::size_of(s.grad_type));
    }
    auto const cs = b_.current_stream();
    params_ = b_.allocate_device(pbytes_, cs);
    grads_ = b_.allocate_device(gbytes_, cs);
    host_params_ = b_.allocate_host(pbytes_);
    auto* host_grads = b_.allocate_host(gbytes_);
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      fill(host_params_ + poff_[i], specs_[i].numel, specs_[i].type, seed + 2 * i);
      fill(host_grads + goff_[i], specs_[i].numel, specs_[i].grad_type, seed + 2 * i + 1);
    }
    b_.copy_h2d(grads_, host_grads, gbytes_, cs);
    b_.synchronize(b_.record_event(cs));
    b_.deallocate_host(host_grads, gbytes_);
  }
  model(model const&) = delete;
  ~model() {
    auto const cs = b_.current_stream();
    b_.synchronize(b_.record_event(cs));
    b_.deallocate_device(params_, pbytes_, cs);
    b_.deallocate_device(grads_, gbytes_, cs);
    b_.deallocate_host(host_params_, pbytes_);
  }

  /// Parameters back to their initial bytes (on the compute stream).
  void reset() { b_.copy_h2d(params_, host_params_, pbytes_, b_.current_stream()); }

  void add_to(ps::adam<cuda::backend>& opt) const {
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      auto const& s = specs_[i];
      opt.add_param({params_ + poff_[i], grads_ + goff_[i], s.numel, s.type, s.grad_type, s.master});
    }
  }

  /// Every parameter byte (one download).
  std::vector<std::byte> param_bytes() {
    std::vector<std::byte> out(pbytes_);
    b_.synchronize_device();
    PIPESWAP_CUDA_TRY(cudaMemcpy(out.data(), params_.get(), pbytes_, cudaMemcpyDeviceToHost));
    return out;
  }

  [[nodiscard]] std::vector<param_spec> const& specs() const { return specs_; }
  [[nodiscard]] std::size_t param_bytes_total() const { return pbytes_; }

private:
  static std::size_t align(std::size_t n) { return (n + 255) / 256 * 256; }
  static void fill(std::byte* p, std::size_t n, ps::dtype t, std::uint64_t seed) {
    if (t == ps::dtype::f32) {
      fill_floats(reinterpret_cast<float*>(p), n, seed);
      return;
    }
    std::vector<float> v(n);
    fill_floats(v.data(), n, seed);
    for (std::size_t i = 0; i < n; ++i) {
      auto const bits = t == ps::dtype::bf16 ? ps::to_bf16(v[i]).bits : ps::to_f16(v[i]).bits;
      std::memcpy(p + 2 * i, &bits, 2);
    }
  }

  cuda::backend& b_;
  std::vector<param_spec> specs_;
  std::vector<std::size_t> poff_, goff_;
  std::size_t pbytes_ = 0, gbytes_ = 0;
  ps::device_ptr params_, grads_;
  std::byte* host_params_ = nullptr;
};

/// Parameters and every state slot's bytes after a run.
struct snapshot {
  std::vector<std::byte> params;
  std::vector<std::vector<std::byte>> slots;
};

struct run_spec {
  std::string pipeline; ///< "none", "per_tensor", "packed"
  std::size_t swap_times = 1;
  bool split = false;
};

struct run_result {
  run_spec spec;
  std::vector<double> gpu_ms, host_ms;
  std::size_t swappable_bytes = 0, max_batch_bytes = 0, arena_bytes = 0, batches = 0;
  std::optional<bool> bit_exact;
  double mock_ms = 0; ///< the mock backend's prediction of one step
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double minimum(std::vector<double> const& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

/// One optimizer run: `warm` + `timed` steps from the model's initial bytes; compares parameters and
/// states with `ref` (when given) or stores them in `keep`.
template <class Partition>
run_result run_steps(cuda::backend& b, ps::transfer_engine<cuda::backend>& x, model& m, ps::adam_config const& acfg,
                     run_spec const& rs, int warm, int timed, snapshot const* ref, snapshot* keep) {
  run_result r{rs, {}, {}, 0, 0, 0, 0, std::nullopt, 0};
  m.reset();
  ps::adam<cuda::backend> opt(b, acfg);
  m.add_to(opt);
  ps::swap_config cfg;
  cfg.swap_times = rs.swap_times;
  cfg.packed = rs.pipeline == "packed";
  if (rs.pipeline == "none") cfg.state_keys = std::vector<std::string>{};
  ps::optimizer_swap<ps::adam<cuda::backend>, Partition> rt(x, opt, cfg);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  PIPESWAP_CUDA_TRY(cudaEventCreate(&e0));
  PIPESWAP_CUDA_TRY(cudaEventCreate(&e1));
  auto const cs = b.current_stream();
  for (int k = 0; k < warm + timed; ++k) {
    auto const t0 = clock_type::now();
    PIPESWAP_CUDA_TRY(cudaEventRecord(e0, cs.get()));
    rt.step();
    PIPESWAP_CUDA_TRY(cudaEventRecord(e1, cs.get()));
    auto const t1 = clock_type::now();
    PIPESWAP_CUDA_TRY(cudaEventSynchronize(e1));
    float ms = 0;
    PIPESWAP_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
    if (k >= warm) {
      r.gpu_ms.push_back(ms);
      r.host_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  PIPESWAP_CUDA_LOG(cudaEventDestroy(e0));
  PIPESWAP_CUDA_LOG(cudaEventDestroy(e1));
  r.swappable_bytes = rt.swappable_bytes();
  r.max_batch_bytes = rt.max_batch_bytes();
  r.arena_bytes = rt.arena_bytes();
  r.batches = rt.last_plan().size();
  rt.synchronize_host_mirrors();

  snapshot now;
  snapshot* out = keep != nullptr ? keep : &now;
  out->params = m.param_bytes();
  bool exact = true;
  if (ref != nullptr)
    exact = ref->params.size() == out->params.size() &&
            same_bytes(ref->params.data(), out->params.data(), out->params.size());
  std::size_t i = 0;
  auto const slots = opt.slots();
  for (std::size_t si = 0; si < slots.size(); ++si) {
    auto const* slot = &slots[si];
    std::vector<std::byte> bytes;
    std::byte const* p = nullptr;
    if (rt.is_swappable(si)) {
      p = rt.host_mirror(si).data();
    } else {
      bytes.resize(slot->bytes());
      b.synchronize_device();
      PIPESWAP_CUDA_TRY(
          cudaMemcpy(bytes.data(), rt.unswappable_device(si).get(), bytes.size(), cudaMemcpyDeviceToHost));
      p = bytes.data();
    }
    if (ref != nullptr) {
      exact = exact && i < ref->slots.size() && ref->slots[i].size() == slot->bytes() &&
              same_bytes(ref->slots[i].data(), p, slot->bytes());
    } else {
      out->slots.emplace_back(p, p + slot->bytes());
    }
    ++i;
  }
  if (ref != nullptr) r.bit_exact = exact && i == ref->slots.size();
  return r;
}

template <class... A>
run_result run_any(bool split, A&&... a) {
  return split ? run_steps<ps::split_partition>(std::forward<A>(a)...)
               : run_steps<ps::balanced_partition>(std::forward<A>(a)...);
}

/// The AdamW configuration of the step benchmarks.
ps::adam_config bench_config() {
  ps::adam_config c;
  c.lr = 1e-3;
  c.weight_decay = 0.01;
  c.decoupled_weight_decay = true;
  return c;
}

/// Beyond this many tensors the simulator's per-operation bookkeeping (op log, vector clocks) takes
/// minutes; such configurations get no prediction.
constexpr std::size_t max_predicted_tensors = 1024;

/// The mock backend's prediction of one step of `rs` (the second step, after the cold start), in ms:
/// timing_model::h200_pcie, timing only (no bytes held), hazard checker on. 0: not predicted.
double predict_ms(std::vector<param_spec> const& specs, run_spec const& rs) {
  if (specs.size() > max_predicted_tensors) return 0;
  ps::mock::options mo;
  mo.timing = ps::mock::timing_model::h200_pcie();
  mo.materialize = false;
  ps::mock::backend b(mo);
  auto const cs = b.current_stream();
  std::vector<ps::device_ptr> mem;
  ps::adam<ps::mock::backend> opt(b, bench_config());
  for (auto const& s : specs) {
    auto const p = b.allocate_device(s.numel * ps::size_of(s.type), cs);
    auto const g = b.allocate_device(s.numel * ps::size_of(s.grad_type), cs);
    b.launch(cs, {"init", {}, {{p, s.numel * ps::size_of(s.type)}, {g, s.numel * ps::size_of(s.grad_type)}}, 0});
    opt.add_param({p, g, s.numel, s.type, s.grad_type, s.master});
  }
  ps::transfer_engine<ps::mock::backend> x(b);
  ps::swap_config cfg;
  cfg.swap_times = rs.swap_times;
  cfg.packed = rs.pipeline == "packed";
  if (rs.pipeline == "none") cfg.state_keys = std::vector<std::string>{};
  double ms = 0;
  {
    ps::optimizer_swap<ps::adam<ps::mock::backend>> rt(x, opt, cfg);
    rt.step();
    b.synchronize(b.record_event(cs));
    auto const t0 = b.now();
    rt.step();
    b.synchronize(b.record_event(cs));
    ms = static_cast<double>(b.now() - t0) / 1e6;
  }
  return ms;
}

// ----- 1. self-test ------------------------------------------------------------------------------

/// The fused kernels against the host loop, through the policy adam<cuda::backend> uses: the sweep
/// of tests/support/adam_ranges.hpp once with sizes up to several blocks, once with 120 copies of
/// small sizes (a 46 KiB table: the device-memory path). Each batch's arrays travel in one device
/// allocation, each at a 256-byte boundary plus its element offset.
std::size_t selftest_kernels(cuda::backend& b) {
  std::size_t bad = 0, checks = 0;
  auto const cs = b.current_stream();
  auto check = [&](std::vector<ps::test::host_range>& rs, std::vector<ps::test::host_range>& twins,
                   std::vector<ps::adam_step_scalars> const& sc, std::string const& what) {
    std::vector<std::size_t> at; // blob offset of each array
    std::size_t total = 0;
    for (auto& r : rs) {
      for (auto& a : r.arrays) {
        at.push_back(total);
        total += (a.storage_bytes() + 255) / 256 * 256;
      }
    }
    std::vector<std::byte> blob(total);
    for (std::size_t i = 0, j = 0; i < rs.size(); ++i) {
      for (auto& a : rs[i].arrays) std::memcpy(blob.data() + at[j++], a.storage.data(), a.storage_bytes());
    }
    auto const mem = b.allocate_device(total, cs);
    b.synchronize(b.record_event(cs));
    PIPESWAP_CUDA_TRY(cudaMemcpy(mem.get(), blob.data(), total, cudaMemcpyHostToDevice));
    std::vector<ps::adam_tensor<cuda::backend>> ts;
    for (std::size_t i = 0; i < rs.size(); ++i) {
      ts.push_back(rs[i].view<cuda::backend>(
          [&](std::size_t a) { return mem + at[6 * i + a] + rs[i].arrays[a].offset * rs[i].arrays[a].esize; }));
    }
    ps::adam_kernels<cuda::backend>{}.update(b, cs, ts, sc);
    b.synchronize(b.record_event(cs));
    PIPESWAP_CUDA_TRY(cudaMemcpy(blob.data(), mem.get(), total, cudaMemcpyDeviceToHost));
    b.deallocate_device(mem, total, cs);
    for (std::size_t i = 0, j = 0; i < rs.size(); ++i) {
      for (auto& a : rs[i].arrays) std::memcpy(a.storage.data(), blob.data() + at[j++], a.storage_bytes());
      ++checks;
      auto const differ = ps::test::differs_from_reference(rs[i], twins[i], sc);
      if (!differ.empty() && ++bad <= 5) {
        std::printf("  kernel mismatch: %s, range %zu, numel %zu: %s\n", what.c_str(), i, rs[i].n, differ.c_str());
      }
    }
  };
  std::size_t const sizes[] = {1, 3, 4, 5, 13, 1030, 16391, 70001};
  std::size_t const small[] = {1, 3, 4, 5, 13, 1030};
  ps::test::for_each_sweep_batch(sizes, 1, check);
  ps::test::for_each_sweep_batch(small, 120, check);
  std::printf("  kernels: %zu ranges checked, %zu mismatches\n", checks, bad);
  return bad;
}

/// optimizer_swap on the device: the no-swap run equals the host loop, every swapped run equals it.
std::size_t selftest_swap(cuda::backend& b, ps::transfer_engine<cuda::backend>& x) {
  std::size_t bad = 0, runs = 0;
  std::vector<param_spec> specs;
  std::size_t const sizes[] = {3000, 1, 0, 65, 2048, 7, 4096, 100, 5000, 63, 1024, 40000};
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    if (i % 3 == 1) {
      specs.push_back({sizes[i], ps::dtype::bf16, ps::dtype::bf16, true});
    } else if (i % 3 == 2) {
      specs.push_back({sizes[i], ps::dtype::f16, ps::dtype::f32, true});
    } else {
      specs.push_back({sizes[i]});
    }
  }
  model m(b, specs, 42);
  for (bool amsgrad : {false, true}) {
    ps::adam_config acfg;
    acfg.lr = 0.01;
    acfg.weight_decay = 0.05;
    acfg.amsgrad = amsgrad;
    acfg.decoupled_weight_decay = !amsgrad;
    int const steps = 3;
    snapshot ref;
    run_any(false, b, x, m, acfg, run_spec{"none", 1, false}, 0, steps, nullptr, &ref);

    { // the same steps with the host loop, from the same bytes (gradients regenerated as model made them)
      std::size_t off = 0;
      m.reset();
      auto const p0 = m.param_bytes();
      std::size_t slot = 0;
      for (std::size_t i = 0; i < specs.size(); ++i) {
        auto const& s = specs[i];
        std::size_t const n = s.numel;
        ps::test::host_array param(n, ps::size_of(s.type), 0), grad(n, ps::size_of(s.grad_type), 0);
        std::memcpy(param.data(), p0.data() + off, n * ps::size_of(s.type));
        std::vector<float> gv(n);
        fill_floats(gv.data(), n, 42 + 2 * i + 1);
        grad.put(s.grad_type, gv);
        std::vector<float> mm(n, 0), vv(n, 0), vmax(n, 0), master(n);
        for (std::size_t k = 0; k < n; ++k) {
          master[k] = s.type == ps::dtype::f32    ? reinterpret_cast<float*>(param.data())[k]
                      : s.type == ps::dtype::bf16 ? ps::to_float(reinterpret_cast<ps::bf16*>(param.data())[k])
                                                  : ps::to_float(reinterpret_cast<ps::f16*>(param.data())[k]);
        }
        for (int step = 1; step <= steps; ++step) {
          auto const sc = ps::make_step_scalars(acfg, step);
          ps::adam_update_host(sc, s.type, s.grad_type, param.data(), grad.data(), mm.data(), vv.data(),
                               amsgrad ? vmax.data() : nullptr, s.master ? master.data() : nullptr, n);
        }
        bool ok = std::memcmp(ref.params.data() + off, param.data(), n * ps::size_of(s.type)) == 0;
        ok = ok && std::memcmp(ref.slots[slot++].data(), mm.data(), n * 4) == 0;
        ok = ok && std::memcmp(ref.slots[slot++].data(), vv.data(), n * 4) == 0;
        if (amsgrad) ok = ok && std::memcmp(ref.slots[slot++].data(), vmax.data(), n * 4) == 0;
        if (s.master) ok = ok && std::memcmp(ref.slots[slot++].data(), master.data(), n * 4) == 0;
        if (!ok && ++bad <= 5) std::printf("  no-swap run differs from the host loop: parameter %zu\n", i);
        off += (n * ps::size_of(s.type) + 255) / 256 * 256;
      }
      ++runs;
    }

    for (char const* pipeline : {"per_tensor", "packed"}) {
      for (std::size_t k : {1u, 2u, 3u, 7u, 16u}) {
        for (bool split : {false, true}) {
          auto const r = run_any(split, b, x, m, acfg, run_spec{pipeline, k, split}, 0, steps, &ref, nullptr);
          ++runs;
          if (!r.bit_exact.value_or(false) && ++bad <= 5) {
            std::printf("  swap changed bits: %s swap_times %zu%s amsgrad %d\n", pipeline, k, split ? " split" : "",
                        amsgrad ? 1 : 0);
          }
        }
      }
    }
  }
  std::printf("  optimizer_swap: %zu runs checked, %zu mismatches\n", runs, bad);
  return bad;
}

// ----- 2. bandwidth ------------------------------------------------------------------------------

struct bandwidth {
  double h2d = 0, d2h = 0, both_h2d = 0, both_d2h = 0, both_total = 0;
  std::size_t bytes = 0;
  int reps = 0;
};

bandwidth measure_bandwidth(cuda::backend& b, std::size_t bytes, int reps) {
  bandwidth bw;
  bw.bytes = bytes;
  bw.reps = reps;
  auto const up = b.new_stream(), down = b.new_stream();
  auto* h_src = b.allocate_host(bytes);
  auto* h_dst = b.allocate_host(bytes);
  std::memset(h_src, 1, bytes);
  std::memset(h_dst, 0, bytes);
  auto const d_in = b.allocate_device(bytes, up), d_out = b.allocate_device(bytes, up);
  PIPESWAP_CUDA_TRY(cudaMemsetAsync(d_out.get(), 2, bytes, up.get()));
  b.wait_event(down, b.record_event(up));
  cudaEvent_t ev[6];
  for (auto& e : ev) PIPESWAP_CUDA_TRY(cudaEventCreate(&e));
  auto gbps = [&](cudaEvent_t a, cudaEvent_t z) {
    float ms = 0;
    PIPESWAP_CUDA_TRY(cudaEventElapsedTime(&ms, a, z));
    return static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  };
  for (int r = 0; r < reps + 1; ++r) { // the first repetition warms up and is not counted
    // H2D alone, then D2H alone.
    PIPESWAP_CUDA_TRY(cudaEventRecord(ev[0], up.get()));
    PIPESWAP_CUDA_TRY(cudaMemcpyAsync(d_in.get(), h_src, bytes, cudaMemcpyHostToDevice, up.get()));
    PIPESWAP_CUDA_TRY(cudaEventRecord(ev[1], up.get()));
    PIPESWAP_CUDA_TRY(cudaStreamWaitEvent(down.get(), ev[1], 0));
    PIPESWAP_CUDA_TRY(cudaEventRecord(ev[2], down.get()));
    PIPESWAP_CUDA_TRY(cudaMemcpyAsync(h_dst, d_out.get(), bytes, cudaMemcpyDeviceToHost, down.get()));
    PIPESWAP_CUDA_TRY(cudaEventRecord(ev[3], down.get()));
    PIPESWAP_CUDA_TRY(cudaEventSynchronize(ev[3]));
    double const h2d = gbps(ev[0], ev[1]), d2h = gbps(ev[2], ev[3]);
    // Both at once: each stream starts behind one event, each is timed on its own.
    PIPESWAP_CUDA_TRY(cudaEventRecord(ev[0], up.get()));
    PIPESWAP_CUDA_TRY(cudaStreamWaitEvent(down.get(), ev[0], 0));
    PIPESWAP_CUDA_TRY(cudaMemcpyAsync(d_in.get(), h_src, bytes, cudaMemcpyHostToDevice, up.get()));
    PIPESWAP_CUDA_TRY(cudaMemcpyAsync(h_dst, d_out.get(), bytes, cudaMemcpyDeviceToHost, down.get()));
    PIPESWAP_CUDA_TRY(cudaEventRecord(ev[4], up.get()));
    PIPESWAP_CUDA_TRY(cudaEventRecord(ev[5], down.get()));
    PIPESWAP_CUDA_TRY(cudaEventSynchronize(ev[4]));
    PIPESWAP_CUDA_TRY(cudaEventSynchronize(ev[5]));
    double const bh = gbps(ev[0], ev[4]), bd = gbps(ev[0], ev[5]);
    float ms_h = 0, ms_d = 0;
    PIPESWAP_CUDA_TRY(cudaEventElapsedTime(&ms_h, ev[0], ev[4]));
    PIPESWAP_CUDA_TRY(cudaEventElapsedTime(&ms_d, ev[0], ev[5]));
    double const total = 2.0 * static_cast<double>(bytes) / (std::max(ms_h, ms_d) * 1e-3) / 1e9;
    if (r == 0) continue;
    bw.h2d = std::max(bw.h2d, h2d);
    bw.d2h = std::max(bw.d2h, d2h);
    if (total > bw.both_total) {
      bw.both_total = total;
      bw.both_h2d = bh;
      bw.both_d2h = bd;
    }
  }
  for (auto& e : ev) PIPESWAP_CUDA_LOG(cudaEventDestroy(e));
  b.wait_event(b.current_stream(), b.record_event(down));
  b.synchronize(b.record_event(b.current_stream()));
  b.deallocate_device(d_in, bytes, b.current_stream());
  b.deallocate_device(d_out, bytes, b.current_stream());
  b.deallocate_host(h_src, bytes);
  b.deallocate_host(h_dst, bytes);
  return bw;
}

// ----- 3./4. optimizer steps ---------------------------------------------------------------------

/// The copy-bound step time in ms: max(H2D bytes / H2D rate, D2H bytes / D2H rate), rates in GB/s.
double bound_ms(std::size_t h2d_bytes, std::size_t d2h_bytes, double h2d_gbps, double d2h_gbps) {
  if (h2d_gbps <= 0 || d2h_gbps <= 0) return 0;
  return std::max(static_cast<double>(h2d_bytes) / h2d_gbps, static_cast<double>(d2h_bytes) / d2h_gbps) / 1e6;
}

json describe(run_result const& r, bandwidth const& bw, double no_swap_ms) {
  double const gpu = minimum(r.gpu_ms);
  double const ideal = bound_ms(r.swappable_bytes, r.swappable_bytes, bw.h2d, bw.d2h);
  double const ideal_duplex = bound_ms(r.swappable_bytes, r.swappable_bytes, bw.both_h2d, bw.both_d2h);
  json j;
  j.str("pipeline", r.spec.pipeline).integer("swap_times", r.spec.swap_times).integer("batches", r.batches);
  j.num("step_ms_min", gpu).num("step_ms_median", median(r.gpu_ms)).num("host_ms_median", median(r.host_ms));
  if (r.mock_ms > 0) j.num("mock_ms", r.mock_ms);
  j.integer("h2d_bytes", r.swappable_bytes).integer("d2h_bytes", r.swappable_bytes);
  j.integer("max_batch_bytes", r.max_batch_bytes).integer("arena_bytes", r.arena_bytes);
  if (r.spec.pipeline != "none") {
    j.num("ideal_ms", ideal).num("ideal_duplex_ms", ideal_duplex);
    j.num("efficiency", gpu > 0 ? ideal / gpu : 0);
    j.num("over_no_swap_ms", gpu - no_swap_ms);
  }
  if (r.bit_exact) j.boolean("bit_exact", *r.bit_exact);
  return j;
}

struct section {
  json figures;
  std::vector<run_result> runs;
  double no_swap_ms = 0;
};

/// The no-swap run, then every (pipeline, swap_times) run compared with it.
section bench_steps(cuda::backend& b, ps::transfer_engine<cuda::backend>& x, std::vector<param_spec> const& specs,
                    std::vector<std::size_t> const& swap_times, int warm, int timed, double budget_s,
                    std::vector<std::string>& skipped, char const* name) {
  section sec;
  model m(b, specs, 7);
  auto const acfg = bench_config();
  snapshot ref;
  std::printf("%s: no swap ...\n", name);
  std::fflush(stdout);
  auto base = run_any(false, b, x, m, acfg, run_spec{"none", 1, false}, warm, timed, nullptr, &ref);
  base.mock_ms = predict_ms(specs, base.spec);
  sec.no_swap_ms = minimum(base.gpu_ms);
  sec.runs.push_back(base);
  for (char const* pipeline : {"per_tensor", "packed"}) {
    for (auto k : swap_times) {
      if (elapsed_s() > budget_s) {
        skipped.push_back(std::string(name) + " " + pipeline + " swap_times " + std::to_string(k));
        continue;
      }
      std::printf("%s: %s swap_times %zu ...\n", name, pipeline, k);
      std::fflush(stdout);
      auto r = run_any(false, b, x, m, acfg, run_spec{pipeline, k, false}, warm, timed, &ref, nullptr);
      r.mock_ms = predict_ms(specs, r.spec);
      if (!r.bit_exact.value_or(false))
        fail(std::string(name) + ": " + pipeline + " swap_times " + std::to_string(k) +
             " differs from the no-swap run");
      sec.runs.push_back(r);
    }
    x.pool().trim(); // the other pipeline's host memory has another shape
  }
  std::size_t n = 0;
  for (auto const& s : specs) n += s.numel;
  sec.figures.integer("params", n)
      .integer("tensors", specs.size())
      .integer("steps_warm", static_cast<std::uint64_t>(warm))
      .integer("steps_timed", static_cast<std::uint64_t>(timed));
  return sec;
}

std::string mock_text(double ms) {
  if (ms <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ms);
  return buf;
}

void print_table(char const* title, section const& sec, bandwidth const& bw) {
  std::printf("\n### %s\n\n", title);
  std::printf("| pipeline | swap_times | step ms (min) | host ms | ideal ms | ideal ms (duplex) | efficiency | over "
              "no-swap ms | mock ms | bit-exact |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto const& r : sec.runs) {
    double const gpu = minimum(r.gpu_ms);
    double const ideal = bound_ms(r.swappable_bytes, r.swappable_bytes, bw.h2d, bw.d2h);
    double const duplex = bound_ms(r.swappable_bytes, r.swappable_bytes, bw.both_h2d, bw.both_d2h);
    if (r.spec.pipeline == "none") {
      std::printf("| none | - | %.2f | %.2f | - | - | - | - | %s | reference |\n", gpu, median(r.host_ms),
                  mock_text(r.mock_ms).c_str());
    } else {
      std::printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f | %.0f%% | %+.2f | %s | %s |\n", r.spec.pipeline.c_str(),
                  r.spec.swap_times, gpu, median(r.host_ms), ideal, duplex, gpu > 0 ? 100 * ideal / gpu : 0,
                  gpu - sec.no_swap_ms, mock_text(r.mock_ms).c_str(), r.bit_exact.value_or(false) ? "yes" : "NO");
    }
  }
}

int usage(char const* why) {
  std::fprintf(stderr,
               "gpu_check: %s\nusage: gpu_check [--quick] [--out FILE] [--budget SECONDS] "
               "[--selftest-only] [--params N] [--small-tensors N] | --predict | --probe | --version\n",
               why);
  return 2;
}

/// The configurations of the step benchmarks: {large model, small tensors}.
std::vector<param_spec> large_model(options const& o) {
  std::size_t const per = std::min<std::size_t>(o.params, std::size_t{1} << 24); // 64 MiB tensors
  return std::vector<param_spec>(std::max<std::size_t>(1, o.params / per), param_spec{per});
}
std::vector<param_spec> small_model(options const& o) {
  return std::vector<param_spec>(o.small_tensors, param_spec{16384});
}
std::vector<std::size_t> const large_swap_times{4, 8, 16, 32};
std::vector<std::size_t> const small_swap_times{4, 16};

/// --predict: the mock's step times for every configuration, as a Markdown table.
int predict_only(options const& o) {
  for (auto const& [title, specs, ks] : {std::tuple{"large model", large_model(o), large_swap_times},
                                         std::tuple{"small tensors", small_model(o), small_swap_times}}) {
    std::size_t n = 0;
    for (auto const& s : specs) n += s.numel;
    if (specs.size() > max_predicted_tensors) {
      std::printf("\n(%s: %zu tensors, more than the %zu the simulator predicts in reasonable time)\n", title,
                  specs.size(), max_predicted_tensors);
      continue;
    }
    std::printf("\n### mock prediction (timing_model::h200_pcie), %s: %zu fp32 parameters in %zu tensors\n\n", title, n,
                specs.size());
    std::printf("| pipeline | swap_times | mock ms |\n|---|---|---|\n");
    std::printf("| none | - | %.2f |\n", predict_ms(specs, run_spec{"none", 1, false}));
    for (char const* pipeline : {"per_tensor", "packed"}) {
      for (auto k : ks)
        std::printf("| %s | %zu | %.2f |\n", pipeline, k, predict_ms(specs, run_spec{pipeline, k, false}));
    }
    std::fflush(stdout);
  }
  return 0;
}

int run(options const& o) {
  if (o.predict) return predict_only(o);
  int devices = 0; // cudaGetDeviceCount leaves it untouched when there is no driver
  cudaError_t const st = cudaGetDeviceCount(&devices);
  if (st != cudaSuccess || devices == 0) {
    std::printf("gpu_check: no CUDA device: %s\n", st != cudaSuccess
                                                       ? (std::string("cudaGetDeviceCount returned ") +
                                                          cudaGetErrorName(st) + " (" + cudaGetErrorString(st) + ")")
                                                             .c_str()
                                                       : "cudaGetDeviceCount found 0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  PIPESWAP_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  PIPESWAP_CUDA_TRY(cudaDriverGetVersion(&driver));
  PIPESWAP_CUDA_TRY(cudaRuntimeGetVersion(&runtime));
  std::printf("gpu_check: %s (sm_%d%d, %.1f GiB), driver %d, runtime %d\n", prop.name, prop.major, prop.minor,
              static_cast<double>(prop.totalGlobalMem) / (1u << 30), driver, runtime);
  if (o.probe) return 0;
  std::printf("gpu_check: %s mode, budget %.0f s\n", o.quick ? "quick" : "full", o.budget_s);

  cuda::backend b(0);
  cuda::stream compute(0);
  b.set_current_stream(compute.ref());
  ps::transfer_engine<cuda::backend> x(b);
  std::vector<std::string> skipped;

  json dev;
  dev.str("name", prop.name).str("cc", std::to_string(prop.major) + "." + std::to_string(prop.minor));
  dev.num("memory_gib", static_cast<double>(prop.totalGlobalMem) / (1u << 30))
      .integer("driver", static_cast<std::uint64_t>(driver))
      .integer("runtime", static_cast<std::uint64_t>(runtime));
  json out;
  out.obj("device", dev).str("mode", o.quick ? "quick" : "full");

  std::printf("\n== self-test ==\n");
  std::fflush(stdout);
  auto const t_self = elapsed_s();
  std::size_t const kbad = selftest_kernels(b);
  std::size_t const sbad = selftest_swap(b, x);
  if (kbad) fail("fused kernels differ from the host loop");
  if (sbad) fail("optimizer_swap on the device is not bit-exact");
  x.pool().trim();
  json self;
  self.integer("kernel_mismatches", kbad).integer("swap_mismatches", sbad).boolean("passed", kbad == 0 && sbad == 0);
  self.num("seconds", elapsed_s() - t_self);
  out.obj("selftest", self);

  if (!o.selftest_only) {
    std::printf("\n== bandwidth ==\n");
    std::fflush(stdout);
    auto const bw = measure_bandwidth(b, o.quick ? (std::size_t{256} << 20) : (std::size_t{2} << 30), o.quick ? 3 : 5);
    std::printf("  pinned, %zu MiB, best of %d: H2D %.1f GB/s, D2H %.1f GB/s, both at once %.1f + %.1f = %.1f GB/s\n",
                bw.bytes >> 20, bw.reps, bw.h2d, bw.d2h, bw.both_h2d, bw.both_d2h, bw.both_total);
    json jb;
    jb.num("h2d", bw.h2d).num("d2h", bw.d2h).num("both_h2d", bw.both_h2d).num("both_d2h", bw.both_d2h);
    jb.num("both_total", bw.both_total).integer("bytes", bw.bytes).integer("reps", static_cast<std::uint64_t>(bw.reps));
    out.obj("bandwidth_gbps", jb);

    auto const big = large_model(o);
    std::size_t const big_n = big.size() * big.front().numel;
    std::printf("\n== adam step, %zu fp32 parameters in %zu tensors ==\n", big_n, big.size());
    auto s1 = bench_steps(b, x, big, large_swap_times, 1, o.quick ? 2 : 3, o.budget_s, skipped, "large");
    std::vector<json> r1;
    for (auto const& r : s1.runs) r1.push_back(describe(r, bw, s1.no_swap_ms));
    s1.figures.num("no_swap_ms", s1.no_swap_ms).arr("runs", r1);
    out.obj("adam_large", s1.figures);
    x.pool().trim();

    std::printf("\n== adam step, %zu tensors of 64 KiB ==\n", o.small_tensors);
    section s2;
    if (elapsed_s() < o.budget_s) {
      s2 = bench_steps(b, x, small_model(o), small_swap_times, 1, 2, o.budget_s, skipped, "small");
      std::vector<json> r2;
      for (auto const& r : s2.runs) r2.push_back(describe(r, bw, s2.no_swap_ms));
      s2.figures.num("no_swap_ms", s2.no_swap_ms).arr("runs", r2);
      out.obj("small_tensors", s2.figures);
    } else {
      skipped.push_back("small tensors");
    }

    std::printf("\n## GPU figures (%s)\n\n", prop.name);
    std::printf("Bandwidth, pinned, best of %d: H2D %.1f GB/s, D2H %.1f GB/s, both at once %.1f + %.1f GB/s.\n",
                bw.reps, bw.h2d, bw.d2h, bw.both_h2d, bw.both_d2h);
    char title[128];
    std::snprintf(title, sizeof title, "Adam step, %zu fp32 parameters (%.1f GiB of state swapped)", big_n,
                  static_cast<double>(big_n * 8) / (1u << 30));
    print_table(title, s1, bw);
    if (!s2.runs.empty()) {
      std::snprintf(title, sizeof title, "Adam step, %zu tensors of 64 KiB", o.small_tensors);
      print_table(title, s2, bw);
    }
  }
  std::vector<json> sk;
  for (auto const& s : skipped) sk.push_back(json().str("what", s));
  out.arr("skipped", sk).integer("failures", static_cast<std::uint64_t>(failures)).num("elapsed_s", elapsed_s());
  std::ofstream f(o.out);
  f << out.text() << "\n";
  if (!f) {
    std::fprintf(stderr, "gpu_check: cannot write %s\n", o.out.c_str());
    return 2;
  }
  std::printf("\ngpu_check: %s, %zu skipped for the time budget, %.0f s; figures in %s\n",
              failures == 0 ? "all checks passed" : "CHECKS FAILED", skipped.size(), elapsed_s(), o.out.c_str());
  return failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto value = [&]() -> char const* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--quick") {
      o.quick = true;
      o.params = std::size_t{1} << 26;
      o.small_tensors = 2000;
    } else if (a == "--version") {
      std::printf("gpu_check (pipeswap %d.%d.%d)\n", PIPESWAP_VERSION_MAJOR, PIPESWAP_VERSION_MINOR,
                  PIPESWAP_VERSION_PATCH);
      return 0;
    } else if (a == "--predict") {
      o.predict = true;
    } else if (a == "--probe") {
      o.probe = true;
    } else if (a == "--selftest-only") {
      o.selftest_only = true;
    } else if (a == "--out" || a == "--budget" || a == "--params" || a == "--small-tensors") {
      char const* v = value();
      if (v == nullptr) return usage((a + " needs a value").c_str());
      if (a == "--out") o.out = v;
      if (a == "--budget") o.budget_s = std::atof(v);
      if (a == "--params") o.params = std::strtoull(v, nullptr, 10);
      if (a == "--small-tensors") o.small_tensors = std::strtoull(v, nullptr, 10);
    } else {
      return usage(("unknown argument " + a).c_str());
    }
  }
  if (o.params == 0 || o.small_tensors == 0) return usage("sizes must be positive");
  try {
    return run(o);
  } catch (std::exception const& e) {
    std::printf("gpu_check: error: %s\n", e.what());
    return 2;
  }
}
