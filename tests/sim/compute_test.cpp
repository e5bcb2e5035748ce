// The simulator's compute model (sim/compute.hpp) against its formulas in docs/simulator.md
// ("Compute"): the GEMM efficiency and roofline, FP8's rate and casts, flash attention with its
// backward's recomputation, the memory-bound kernels, recomputation's added forward, narrow experts,
// the one-efficiency model that the hand-checked tests use, and the device table.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <pipeswap/sim/compute.hpp>
#include <pipeswap/sim/model.hpp>

namespace sim = pipeswap::sim;
namespace tt = boost::test_tools;
using sim::precision;

BOOST_AUTO_TEST_SUITE(sim_compute)

// gemm_efficiency = ceiling · Π x/(x + 64): a 64-wide dimension halves it, large ones approach it.
BOOST_AUTO_TEST_CASE(gemm_efficiency_rises_with_each_dimension_toward_the_ceiling) {
  BOOST_TEST(sim::gemm_efficiency(64, 64, 64, 0.8) == 0.1, tt::tolerance(1e-12));
  BOOST_TEST(sim::gemm_efficiency(128, 8192, 8192, 1.0) == (2.0 / 3) * (128.0 / 129) * (128.0 / 129),
             tt::tolerance(1e-12));
  double last = 0;
  for (double x : {16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0}) {
    double const e = sim::gemm_efficiency(x, x, x, 0.66);
    BOOST_TEST(e > last);
    BOOST_TEST(e < 0.66);
    last = e;
  }
  BOOST_TEST(sim::gemm_efficiency(16384, 16384, 16384, 0.66) > 0.66 * 0.988);
}

// The roofline: a large GEMM is compute-bound at the efficiency above; a GEMM of one row is
// memory-bound (its weight read dominates) at HBM · 0.8.
BOOST_AUTO_TEST_CASE(a_gemm_is_the_slower_of_its_flops_and_its_bytes) {
  sim::device_spec d; // H200: 989 / 1979 TFLOP/s, 4.8 TB/s, ceiling 0.58
  double const n = 8192;
  double const big = sim::gemm_seconds(d, n, n, n, precision::bf16);
  BOOST_TEST(big == 2 * n * n * n / (989e12 * sim::gemm_efficiency(n, n, n, d.kernel_efficiency)),
             tt::tolerance(1e-12));
  double const row = sim::gemm_seconds(d, 1, n, n, precision::bf16);
  double const bytes = 2 * (n + n * n) + 2 * n;
  BOOST_TEST(row == bytes / (4.8e12 * 0.8), tt::tolerance(1e-12));
  BOOST_TEST(row > 2 * n * n / (989e12 * sim::gemm_efficiency(1, n, n, d.kernel_efficiency)));
  // FP8: the FP8 rate for compute-bound GEMMs, one-byte operands for memory-bound ones.
  BOOST_TEST(big / sim::gemm_seconds(d, n, n, n, precision::fp8) == 1979.0 / 989.0, tt::tolerance(1e-12));
  BOOST_TEST(sim::gemm_seconds(d, 1, n, n, precision::fp8) == (n + n * n + 2 * n) / (4.8e12 * 0.8),
             tt::tolerance(1e-12));
  // The backward: the input gradient (m, k, n) and the weight gradient (k, n, m).
  BOOST_TEST(sim::gemm_bwd_seconds(d, 1, n, n, precision::bf16) ==
                 sim::gemm_seconds(d, 1, n, n, precision::bf16) + sim::gemm_seconds(d, n, n, 1, precision::bf16),
             tt::tolerance(1e-12));
  BOOST_TEST(sim::gemm_seconds(d, 0, n, n, precision::bf16) == 0.0);
}

// One dense layer of the built-in model (h 8192, f 28672, 64 heads, 8 KV heads, 4096 tokens), term
// by term as docs/simulator.md writes it.
BOOST_AUTO_TEST_CASE(a_dense_layer_is_its_gemms_attention_and_memory_bound_kernels) {
  sim::scenario s;
  auto const& d = s.device;
  double const T = 4096, h = 8192, f = 28672, kv = 1024, e = 2;
  auto const o = sim::layer_op_times(s.model, s.parallel, d);
  auto const g = [&](double m, double n, double k) { return sim::gemm_seconds(d, m, n, k, precision::bf16); };
  BOOST_TEST(o.gemm_fwd == g(T, h + 2 * kv, h) + g(T, h, h) + g(T, 2 * f, h) + g(T, h, f), tt::tolerance(1e-12));
  BOOST_TEST(o.gemm_bwd == g(T, h, h + 2 * kv) + g(h, h + 2 * kv, T) + g(T, h, h) + g(h, h, T) + g(T, h, 2 * f) +
                               g(h, 2 * f, T) + g(T, f, h) + g(f, h, T),
             tt::tolerance(1e-12));
  // Causal flash attention: 2·s²·h FLOPs forward at 0.45 of the 16-bit peak, 2.5× that backward.
  double const attn = 2 * T * T * h / (989e12 * 0.45);
  BOOST_TEST(o.attention_fwd == attn, tt::tolerance(1e-12));
  BOOST_TEST(o.attention_bwd == 2.5 * attn, tt::tolerance(1e-12));
  // Norms 2·2, residual adds 2·3 of e·T·h; rotary on q and k; SwiGLU 3·e·T·f. The backward twice.
  double const mem = 4 * e * T * h + 6 * e * T * h + 2 * e * T * (h + kv) + 3 * e * T * f;
  BOOST_TEST(o.memory_fwd == mem / (4.8e12 * 0.8), tt::tolerance(1e-12));
  BOOST_TEST(o.memory_bwd == 2 * o.memory_fwd, tt::tolerance(1e-12));
  // The layer runs below the ceiling (attention and memory-bound kernels), above the old 0.45.
  double const flops = 2 * T * (2 * h * h + 2 * h * kv + 3 * h * f) + 4 * T * T * h;
  BOOST_TEST(flops / o.fwd() / 989e12 < d.kernel_efficiency);
  BOOST_TEST(flops / o.fwd() / 989e12 > 0.45);
}

// Eager kernels (model.fused_kernels false): each norm moves 4e + 28 bytes per element instead of 2e,
// the rotary embedding 2e + 16 instead of 2e, SwiGLU 5e instead of 3e; the GEMMs, the attention and
// the residual adds are the same kernels. With tp 4 and sequence parallelism the norms run on T/4
// tokens, the rotary embedding and SwiGLU on a quarter of the heads and of the width.
BOOST_AUTO_TEST_CASE(eager_kernels_move_the_bytes_of_their_separate_passes) {
  for (std::uint32_t tp : {1u, 4u}) {
    sim::scenario s;
    s.parallel.tp = tp;
    s.parallel.sequence_parallel = tp > 1;
    double const T = 4096, Tr = T / tp, h = 8192, hs = h / tp, kv = 1024.0 / tp, f = 28672.0 / tp, e = 2;
    auto const fused = sim::layer_op_times(s.model, s.parallel, s.device);
    auto const fused_head = sim::head_op_times(s.model, s.parallel, s.device);
    s.model.fused_kernels = false;
    auto const eager = sim::layer_op_times(s.model, s.parallel, s.device);
    auto const eager_head = sim::head_op_times(s.model, s.parallel, s.device);
    BOOST_TEST_CONTEXT("tp " << tp) {
      double const more =
          2 * (4 * e + 28 - 2 * e) * Tr * h + (2 * e + 16 - 2 * e) * T * (hs + kv) + (5 * e - 3 * e) * T * f;
      BOOST_TEST(eager.memory_fwd - fused.memory_fwd == more / (4.8e12 * 0.8), tt::tolerance(1e-9));
      BOOST_TEST(eager.memory_bwd == 2 * eager.memory_fwd, tt::tolerance(1e-12));
      BOOST_TEST(eager.gemm_fwd == fused.gemm_fwd);
      BOOST_TEST(eager.gemm_bwd == fused.gemm_bwd);
      BOOST_TEST(eager.attention_fwd == fused.attention_fwd);
      BOOST_TEST(eager_head.memory_fwd - fused_head.memory_fwd == (4 * e + 28 - 2 * e) * Tr * h / (4.8e12 * 0.8),
                 tt::tolerance(1e-9));
      // torchtitan's "op" policy re-runs the eager kernels too.
      BOOST_TEST(eager.op_recompute_fwd - fused.op_recompute_fwd == eager.memory_fwd - fused.memory_fwd,
                 tt::tolerance(1e-9));
    }
  }
  // GeLU is one kernel either way: only the norms and the rotary embedding differ.
  sim::scenario g;
  g.model.mlp = sim::mlp_kind::gelu;
  auto const fused = sim::layer_op_times(g.model, g.parallel, g.device);
  g.model.fused_kernels = false;
  auto const eager = sim::layer_op_times(g.model, g.parallel, g.device);
  double const more = 2 * 32 * 4096.0 * 8192 + 16 * 4096.0 * (8192 + 1024);
  BOOST_TEST(eager.memory_fwd - fused.memory_fwd == more / (4.8e12 * 0.8), tt::tolerance(1e-9));
}

// FP8 covers the layer's GEMMs (faster) and adds the cast-transposes (memory-bound); attention stays
// 16-bit; the output layer stays BF16.
BOOST_AUTO_TEST_CASE(fp8_speeds_the_gemms_and_adds_their_casts) {
  sim::scenario s;
  auto const bf = sim::layer_op_times(s.model, s.parallel, s.device);
  s.model.precision = precision::fp8;
  auto const f8 = sim::layer_op_times(s.model, s.parallel, s.device);
  BOOST_TEST(f8.gemm_fwd < 0.6 * bf.gemm_fwd);
  BOOST_TEST(f8.gemm_fwd > 0.45 * bf.gemm_fwd);
  BOOST_TEST(f8.attention_fwd == bf.attention_fwd);
  BOOST_TEST(f8.attention_bwd == bf.attention_bwd);
  double const T = 4096, h = 8192, f = 28672, kv = 1024, cast = 4; // e + 2 bytes per element
  double const fwd_casts = cast * T * (h + h + h + f), bwd_casts = cast * T * ((h + 2 * kv) + h + 2 * f + h);
  BOOST_TEST(f8.memory_fwd - bf.memory_fwd == fwd_casts / (4.8e12 * 0.8), tt::tolerance(1e-9));
  BOOST_TEST(f8.memory_bwd - bf.memory_bwd == bwd_casts / (4.8e12 * 0.8), tt::tolerance(1e-9));
  BOOST_TEST(sim::head_op_times(s.model, s.parallel, s.device).gemm_fwd ==
             sim::gemm_seconds(s.device, T, 32000, h, precision::bf16));
  // A stage of FP8 layers is faster, and its FLOPs (what an MFU divides by) are the same.
  sim::scenario b;
  BOOST_TEST(sim::plan_stages(s)[1].fwd_ns < sim::plan_stages(b)[1].fwd_ns);
  BOOST_TEST(sim::plan_stages(s)[1].fwd_flops == sim::plan_stages(b)[1].fwd_flops);
}

// Recomputation adds forward time to the backward: the attention's forward (selective) or the whole
// layer's (full); the head is not recomputed.
BOOST_AUTO_TEST_CASE(recomputation_adds_the_recomputed_forward_to_the_backward) {
  sim::scenario s;
  auto const o = sim::layer_op_times(s.model, s.parallel, s.device);
  auto const none = sim::plan_stages(s);
  s.model.recompute = sim::recompute_kind::selective;
  auto const sel = sim::plan_stages(s);
  s.model.recompute = sim::recompute_kind::full;
  auto const full = sim::plan_stages(s);
  for (std::size_t i = 0; i < none.size(); ++i) {
    auto const L = none[i].layers;
    BOOST_TEST(std::abs(sel[i].bwd_ns - none[i].bwd_ns - std::llround(L * o.attention_fwd * 1e9)) <= 1);
    BOOST_TEST(std::abs((full[i].bwd_ns - full[i].bwd_comm_ns) - (none[i].bwd_ns - none[i].bwd_comm_ns) -
                        std::llround(L * o.fwd() * 1e9)) <= 1);
    BOOST_TEST(full[i].fwd_ns == none[i].fwd_ns);
  }
}

// Narrow experts: a MoE layer whose experts see few tokens each runs its expert GEMMs at a lower
// efficiency than one dense MLP of the same FLOPs.
BOOST_AUTO_TEST_CASE(narrow_experts_run_below_a_dense_mlp_of_the_same_flops) {
  sim::scenario s;
  s.model.layers = 8;
  s.pipeline.ranks = 8;
  s.model.hidden = 2048;
  s.model.heads = 32;
  s.model.kv_heads = 4;
  s.model.ffn_hidden = 8 * 768; // dense: one MLP of 8 experts' width
  auto const dense = sim::layer_op_times(s.model, s.parallel, s.device);
  s.model.moe.experts = 128; // Qwen3-30B-A3B's experts: 128 of 768, top 8: 256 tokens each
  s.model.moe.top_k = 8;
  s.model.moe.expert_ffn_hidden = 768; // Qwen3-30B-A3B's experts: 128 of 768, top 8: 256 tokens each
  auto const moe = sim::layer_op_times(s.model, s.parallel, s.device);
  // The same expert FLOPs (top_k · 3·h·f_e per token = 3·h·8·768) plus the router's.
  double const router = sim::gemm_fwd_seconds(s.device, 4096, 128, 2048, precision::bf16);
  double const experts = 128 * (sim::gemm_seconds(s.device, 256, 2 * 768, 2048, precision::bf16) +
                                sim::gemm_seconds(s.device, 256, 2048, 768, precision::bf16));
  double const attention = sim::gemm_seconds(s.device, 4096, 2048 + 2 * 256, 2048, precision::bf16) +
                           sim::gemm_seconds(s.device, 4096, 2048, 2048, precision::bf16);
  BOOST_TEST(moe.gemm_fwd == attention + router + experts, tt::tolerance(1e-12));
  BOOST_TEST(moe.gemm_fwd - router - attention > 1.15 * (dense.gemm_fwd - attention));
}

// device.compute "flops": every kernel at FLOPs / (bf16 peak · kernel_efficiency), no memory-bound
// kernels: a stage's time is its FLOPs at that rate (what the hand-checked tests use).
BOOST_AUTO_TEST_CASE(the_flops_model_times_every_kernel_at_one_efficiency) {
  sim::scenario s;
  s.device.compute = sim::compute_kind::flops;
  s.device.kernel_efficiency = 0.45;
  for (auto const& st : sim::plan_stages(s)) {
    double const rate = 989e12 * 0.45;
    BOOST_TEST(std::abs(st.fwd_ns - std::llround(st.fwd_flops / rate * 1e9)) <= 1);
    BOOST_TEST(std::abs(st.bwd_ns - std::llround(st.bwd_flops / rate * 1e9)) <= 1);
  }
}

// The device table: the datasheets' dense peaks, memory and bandwidth (docs/simulator.md, "Devices").
BOOST_AUTO_TEST_CASE(the_device_table_holds_the_published_figures) {
  auto const h100 = sim::find_device_preset("H100 SXM").value();
  BOOST_TEST(h100.bf16_tflops == 989.0);
  BOOST_TEST(h100.fp8_tflops == 1979.0);
  BOOST_TEST(h100.hbm_tbps == 3.35);
  BOOST_TEST(h100.memory_bytes == 80'000'000'000u);
  auto const h200 = sim::find_device_preset("H200").value();
  BOOST_TEST(h200.bf16_tflops == 989.0);
  BOOST_TEST(h200.hbm_tbps == 4.8);
  BOOST_TEST(h200.memory_bytes == 141'000'000'000u);
  auto const b200 = sim::find_device_preset("B200").value();
  BOOST_TEST(b200.bf16_tflops == 2250.0);
  BOOST_TEST(b200.fp8_tflops == 4500.0);
  BOOST_TEST(b200.hbm_tbps == 7.7);
  BOOST_TEST(b200.memory_bytes == 180'000'000'000u);
  BOOST_TEST(!sim::find_device_preset("A100").has_value());
  // The default device is the table's H200.
  sim::device_spec d;
  auto const t = sim::with_preset(d, h200);
  BOOST_TEST(t.name == d.name);
  BOOST_TEST(t.bf16_tflops == d.bf16_tflops);
  BOOST_TEST(t.fp8_tflops == d.fp8_tflops);
  BOOST_TEST(t.hbm_tbps == d.hbm_tbps);
  BOOST_TEST(t.memory_bytes == d.memory_bytes);
  BOOST_TEST(t.nvlink_gbps == d.nvlink_gbps);
}

BOOST_AUTO_TEST_SUITE_END() // sim_compute
