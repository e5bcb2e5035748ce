// pipeswap — the simulator's model of a training job: a decoder-only transformer split into pipeline
// stages, the device it runs on, the pipeline schedule and the swap settings, and the per-stage costs
// derived from them. docs/simulator.md states every formula with its source.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap::sim {

/// A decoder-only transformer (Llama-style: grouped-query attention, SwiGLU MLP, RMSNorm).
struct model_spec {
  std::string name = "70B-class decoder";
  std::uint64_t layers = 80;
  std::uint64_t hidden = 8192;
  std::uint64_t ffn_hidden = 28672;
  std::uint64_t heads = 64;
  std::uint64_t kv_heads = 8;
  std::uint64_t vocab = 32000;
  std::uint64_t seq_len = 4096;
  std::uint64_t micro_batch_size = 1;
  dtype param_dtype = dtype::bf16; ///< weights; gradients have the same type
  /// AdamW with an fp32 master copy of each low-precision weight and fp32 moments.
  bool fp32_master = true;
  /// Attention without materialized score matrices (no 5·a·s/h term in the activation formula).
  bool flash_attention = true;
  /// Overrides the activation formula: saved bytes per layer per micro-batch.
  std::optional<std::uint64_t> activation_bytes_per_layer;
};

/// One accelerator and its host link.
struct device_spec {
  std::string name = "H200";
  std::uint64_t memory_bytes = 141'000'000'000;
  /// Memory the job cannot use: CUDA context, library workspaces, allocator fragmentation.
  std::uint64_t reserved_bytes = 6'000'000'000;
  double h2d_gbps = 55;   ///< GB/s host → device (pinned)
  double d2h_gbps = 55;   ///< GB/s device → host (pinned)
  double copy_latency_us = 2;
  double bf16_tflops = 989; ///< dense peak
  double mfu = 0.45;        ///< achieved fraction of peak on the model's matmuls
  double hbm_tbps = 4.8;    ///< memory bandwidth (optimizer kernels are bandwidth-bound)
  double p2p_gbps = 100;    ///< pipeline send/recv bandwidth between neighbouring ranks
  double p2p_latency_us = 10;
};

enum class schedule_kind : std::uint8_t { gpipe, one_f_one_b, interleaved };

struct pipeline_spec {
  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::uint32_t ranks = 8;          ///< pipeline ranks (one device each)
  std::uint32_t micro_batches = 32; ///< per optimizer step
  std::uint32_t chunks = 1;         ///< model chunks per rank (interleaved only)
  bool overlap_b_f = false;         ///< interleaved: OVERLAP_B_F composites in the steady state
};

/// What the swapped configurations do.
struct swap_spec {
  std::uint32_t swap_times = 16; ///< optimizer batches per step
  bool packed = true;            ///< packed optimizer pipeline
};

struct scenario {
  model_spec model;
  device_spec device;
  pipeline_spec pipeline;
  swap_spec swap;
};

/// One parameter tensor of a stage.
struct tensor_spec {
  std::string name;
  std::uint64_t numel = 0;
};

/// Everything the simulator needs about one pipeline stage (a model chunk).
struct stage_spec {
  std::uint32_t stage = 0;
  std::uint32_t first_layer = 0, layers = 0;
  bool embedding = false, head = false;
  std::vector<tensor_spec> tensors;
  std::uint64_t params = 0;
  /// Bytes a micro-batch's forward saves for its backward on this stage.
  std::uint64_t activation_bytes = 0;
  /// Of those, the stage's input (received from the previous stage or the batch): the pipeline owns
  /// it until the backward, so it is never swapped.
  std::uint64_t boundary_bytes = 0;
  /// Bytes sent to the next stage per micro-batch (and gradients back).
  std::uint64_t p2p_bytes = 0;
  mock::sim_time fwd_ns = 0, bwd_ns = 0; ///< per micro-batch
  double fwd_flops = 0;
};

/// Saved activation bytes per layer per micro-batch: s·b·h·(34 + 5·a·s/h) with 16-bit activations
/// and no tensor or sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
/// Recomputation in Large Transformer Models", eq. 1); flash attention stores no attention matrices,
/// which removes the 5·a·s/h term.
inline std::uint64_t activation_bytes_per_layer(model_spec const& m) {
  if (m.activation_bytes_per_layer) return *m.activation_bytes_per_layer;
  double const sbh = static_cast<double>(m.seq_len * m.micro_batch_size * m.hidden);
  double const attn = m.flash_attention ? 0.0 : 5.0 * static_cast<double>(m.heads * m.seq_len) /
                                                     static_cast<double>(m.hidden);
  return static_cast<std::uint64_t>(std::llround(sbh * (34.0 + attn)));
}

/// Parameters of one transformer layer: attention (q, o: h×h; k, v: h×h·kv/a), SwiGLU MLP (gate, up:
/// h×f; down: f×h) and two norms.
inline std::vector<tensor_spec> layer_tensors(model_spec const& m, std::uint32_t layer) {
  auto const h = m.hidden, f = m.ffn_hidden, kv = m.hidden * m.kv_heads / m.heads;
  std::string const p = "layers." + std::to_string(layer) + ".";
  return {{p + "attn_norm", h},     {p + "attn.q", h * h},   {p + "attn.k", h * kv},
          {p + "attn.v", h * kv},   {p + "attn.o", h * h},   {p + "mlp_norm", h},
          {p + "mlp.gate", h * f},  {p + "mlp.up", h * f},   {p + "mlp.down", f * h}};
}

/// Checks a scenario; throws invalid_argument naming the field and the rule.
inline void validate(scenario const& s) {
  auto need = [](bool ok, std::string const& what) {
    if (!ok) throw invalid_argument("scenario: " + what);
  };
  auto const& m = s.model;
  need(m.layers >= 1, "model.layers must be at least 1");
  need(m.hidden >= 1 && m.ffn_hidden >= 1 && m.vocab >= 1, "model sizes must be positive");
  need(m.heads >= 1 && m.kv_heads >= 1, "model.heads and model.kv_heads must be positive");
  need(m.heads % m.kv_heads == 0, "model.heads (" + std::to_string(m.heads) +
                                      ") must be a multiple of model.kv_heads (" +
                                      std::to_string(m.kv_heads) + ")");
  need(m.hidden % m.heads == 0, "model.hidden must be a multiple of model.heads");
  need(m.seq_len >= 1 && m.micro_batch_size >= 1, "model.seq_len and model.micro_batch_size must be positive");
  need(m.param_dtype == dtype::bf16 || m.param_dtype == dtype::f16 || m.param_dtype == dtype::f32,
       "model.param_dtype must be BF16, F16 or F32");
  need(!(m.fp32_master && m.param_dtype == dtype::f32), "model.fp32_master needs BF16 or F16 weights");
  auto const& d = s.device;
  need(d.memory_bytes > d.reserved_bytes, "device.memory_bytes must exceed device.reserved_bytes");
  for (auto [v, n] : {std::pair{d.h2d_gbps, "h2d_gbps"}, {d.d2h_gbps, "d2h_gbps"}, {d.bf16_tflops, "bf16_tflops"},
                      {d.hbm_tbps, "hbm_tbps"}, {d.p2p_gbps, "p2p_gbps"}}) {
    need(v > 0 && std::isfinite(v), std::string("device.") + n + " must be positive");
  }
  need(d.mfu > 0 && d.mfu <= 1, "device.mfu must be in (0, 1]");
  need(d.copy_latency_us >= 0 && d.p2p_latency_us >= 0, "device latencies must not be negative");
  auto const& p = s.pipeline;
  need(p.ranks >= 1, "pipeline.ranks must be at least 1");
  need(p.micro_batches >= 1, "pipeline.micro_batches must be at least 1");
  need(p.chunks >= 1, "pipeline.chunks must be at least 1");
  need(p.schedule == schedule_kind::interleaved || p.chunks == 1,
       "pipeline.chunks > 1 needs the interleaved schedule");
  need(!p.overlap_b_f || p.schedule == schedule_kind::interleaved,
       "pipeline.overlap_b_f needs the interleaved schedule");
  auto const stages = static_cast<std::uint64_t>(p.ranks) * p.chunks;
  need(m.layers >= stages, "model.layers (" + std::to_string(m.layers) + ") must be at least the number of "
                                "stages (pipeline.ranks × pipeline.chunks = " + std::to_string(stages) + ")");
  need(s.swap.swap_times >= 1, "swap.swap_times must be positive");
}

/// Splits the model into stages (layers as even as possible, the first stages taking the remainder;
/// the embedding on stage 0, the final norm and output head on the last) and derives each stage's
/// parameters, saved activations and compute time per micro-batch.
///
/// Compute: forward FLOPs per micro-batch = 2·P·t (every weight used once per token, a multiply and
/// an add) + 4·b·s²·h per layer (attention scores and weighted sum; halved for the causal mask, then
/// doubled back for the unfused softmax pass — the usual 4bs²h of Narayanan et al. 2021, §3.2);
/// backward = 2 × forward (Kaplan et al. 2020's 6·P FLOPs per token for training); time = FLOPs /
/// (peak · mfu).
inline std::vector<stage_spec> plan_stages(scenario const& s) {
  validate(s);
  auto const& m = s.model;
  auto const stages = s.pipeline.ranks * s.pipeline.chunks;
  auto const base = static_cast<std::uint32_t>(m.layers / stages);
  auto const extra = static_cast<std::uint32_t>(m.layers % stages);
  auto const tokens = static_cast<double>(m.seq_len * m.micro_batch_size);
  auto const act_layer = activation_bytes_per_layer(m);
  auto const act_bytes = size_of(m.param_dtype);
  double const flops_per_s = s.device.bf16_tflops * 1e12 * s.device.mfu;
  std::vector<stage_spec> out(stages);
  std::uint32_t layer = 0;
  for (std::uint32_t st = 0; st < stages; ++st) {
    auto& o = out[st];
    o.stage = st;
    o.first_layer = layer;
    o.layers = base + (st < extra ? 1 : 0);
    o.embedding = st == 0;
    o.head = st + 1 == stages;
    if (o.embedding) o.tensors.push_back({"embed_tokens", m.vocab * m.hidden});
    for (std::uint32_t l = 0; l < o.layers; ++l) {
      for (auto& t : layer_tensors(m, layer + l)) o.tensors.push_back(std::move(t));
    }
    if (o.head) {
      o.tensors.push_back({"norm", m.hidden});
      o.tensors.push_back({"lm_head", m.vocab * m.hidden});
    }
    layer += o.layers;
    for (auto const& t : o.tensors) o.params += t.numel;
    o.boundary_bytes = static_cast<std::uint64_t>(tokens) * m.hidden * act_bytes;
    o.p2p_bytes = o.boundary_bytes;
    o.activation_bytes = act_layer * o.layers + o.boundary_bytes;
    double const attn = 4.0 * static_cast<double>(m.micro_batch_size) * static_cast<double>(m.seq_len) *
                        static_cast<double>(m.seq_len) * static_cast<double>(m.hidden) * o.layers;
    o.fwd_flops = 2.0 * static_cast<double>(o.params) * tokens + attn;
    o.fwd_ns = static_cast<mock::sim_time>(std::llround(o.fwd_flops / flops_per_s * 1e9));
    o.bwd_ns = 2 * o.fwd_ns;
  }
  return out;
}

/// Bytes per parameter kept on the device when nothing is swapped: weights and gradients in the
/// parameter type, plus fp32 master, exp_avg and exp_avg_sq (mixed-precision Adam: 2 + 2 + 12 = 16
/// bytes, Rajbhandari et al. 2020, "ZeRO", §3.1).
inline std::uint64_t state_bytes_per_param(model_spec const& m) {
  return 2 * size_of(m.param_dtype) + (m.fp32_master ? 12 : 8);
}

/// The timing model of the device.
inline mock::timing_model timing_of(device_spec const& d) {
  mock::timing_model t;
  t.h2d = {static_cast<std::uint64_t>(d.h2d_gbps * 1e9), static_cast<mock::sim_time>(d.copy_latency_us * 1e3)};
  t.d2h = {static_cast<std::uint64_t>(d.d2h_gbps * 1e9), static_cast<mock::sim_time>(d.copy_latency_us * 1e3)};
  t.device_bytes_per_second = static_cast<std::uint64_t>(d.hbm_tbps * 1e12);
  t.kernel_launch_ns = 4'000;
  return t;
}

} // namespace pipeswap::sim
