// pipeswap — the simulator's model of a training job: a decoder-only transformer split into pipeline
// stages, the device it runs on, the pipeline schedule and the swap settings, and the per-stage costs
// derived from them: per-device memory tensor by tensor, FLOPs, collectives and host-link sharing.
// docs/simulator.md states every formula with its source.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/detail/round.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>

#include <pipeswap/sim/compute.hpp>
#include <pipeswap/sim/moe.hpp>
#include <pipeswap/sim/scenario.hpp>
namespace pipeswap::sim {

/// What one transformer layer's forward saves for its backward, per micro-batch, on one device of a
/// tensor-parallel group of `p.tp` (docs/simulator.md, "Activations", derives every row). With
/// e = the activation element size (2 for 16-bit), T = s·b tokens, T' = T/t with sequence
/// parallelism (else T), h' = h/t, f' = f/t, a' = a/t, kv the key/value width h·kv_heads/a:
///   attn_norm: its input e·T'·h        qkv matmul: its input e·T'·h
///   core attention: Q e·T·h', K and V e·T·kv/t each; without flash attention the softmax output
///     e·b·a'·s², with dropout its mask b·a'·s² and its output e·b·a'·s²; with flash attention the
///     output and the fp32 log-sum-exp 4·b·a'·s instead
///   output projection: its input e·T·h' (the flash output, counted once)
///   attention dropout: mask T'·h
///   mlp_norm: its input e·T'·h         fc1 (or gate/up): its input e·T'·h
///   GeLU: its input e·T·f' and fc2's input e·T·f'; SwiGLU: gate and up outputs 2·e·T·f' and
///     down's input e·T·f'
///   MLP dropout: mask T'·h
/// With FP8 GEMMs under Transformer Engine (gemm_saved_input_bytes) the q/k/v, fc1 (gate/up) and
/// fc2 (down) inputs are kept as FP8 copies, 1 byte per element in place of e; the output
/// projection keeps the 16-bit flash output the attention core keeps (Megatron-Core's
/// set_save_original_input), counted once; without flash attention it keeps its FP8 copy. Under
/// torchao, only the column-parallel inputs with t > 1 (gathered in FP8) are kept in FP8.
/// With eager kernels (model.fused_kernels false) each norm saves its input cast to fp32 and its
/// normalized value before the weight, (4 + e)·T'·h, in place of its input; SwiGLU saves the SiLU's
/// output e·T·f' as well (the experts' and the shared expert's alike). The rotary embedding saves
/// only its constant frequencies (they need no gradient). tests/python/test_activation_table.py
/// checks these rows and the "op" rows below against what PyTorch's autograd saves.
/// Selective recomputation drops the core-attention tensors that the recomputation rebuilds (scores,
/// mask, dropout output, log-sum-exp); full recomputation keeps the layer input e·T'·h only.
/// torchtitan's "op" policy keeps the input e·T'·h, q e·T·h', v e·T·kv/t, the attention output
/// e·T·h' and log-sum-exp 4·b·a'·s, the gate's output e·T·f' and the down projection's e·T·h (with
/// t > 1 also its reduce-scatter's e·T'·h).
/// With parallel.save_gathered_inputs (PyTorch's DTensor) the q/k/v and gate/up (fc1) inputs are the
/// gathered e·T·h each; the "op" policy gathers them again in the backward instead (it saves no
/// all-gather output), so its rows stay.
/// What a norm over `elements` 16-bit values saves: its input, or with eager kernels its input cast to
/// fp32 and its normalized value before the weight, (4 + e) bytes per element.
inline saved_tensor norm_activation(model_spec const& m, char const* name, std::uint64_t elements) {
  std::uint64_t const e = size_of(m.param_dtype);
  if (!m.fused_kernels) return {name, "input in fp32 and normalized before the weight (eager)", (4 + e) * elements};
  return {name, "input", e * elements};
}

inline std::vector<saved_tensor> layer_activations(model_spec const& m, parallel_spec const& p, recompute_kind rc) {
  std::uint64_t const e = size_of(m.param_dtype), t = p.tp, T = m.seq_len * m.micro_batch_size;
  std::uint64_t const Tr = p.sequence_parallel ? T / t : T;
  std::uint64_t const h = m.hidden, hs = attention_width(m) / t, fs = m.ffn_hidden / t, as = m.heads / t;
  std::uint64_t const kvs = head_dim_of(m) * (m.kv_heads / t);
  std::uint64_t const b = m.micro_batch_size, s = m.seq_len;
  std::uint64_t const Tg = p.save_gathered_inputs ? T : Tr; // what a column-parallel linear saves
  // Bytes per element a GEMM keeps of its input: a column-parallel one's (q/k/v, fc1 or gate/up), the others'.
  std::uint64_t const xc = gemm_saved_input_bytes(m, t > 1), x = gemm_saved_input_bytes(m);
  if (rc == recompute_kind::full) return {{"layer", "input (all that full recomputation keeps)", e * Tr * h}};
  if (rc == recompute_kind::op) {
    // torchtitan's "op" policy keeps the checkpointed layer's input, every other matmul's output
    // (q, v, gate, down; the down projection's before its reduction) and the attention core's
    // output and log-sum-exp; with tensor parallelism, the reduce-scatter's output too.
    std::vector<saved_tensor> op{
        {"layer", "input (the checkpoint's)", e * Tr * h},
        {"attn.q", "output", e * T * hs},
        {"attn.v", "output", e * T * kvs},
        {"core attention", "output", e * T * hs},
        {"core attention", "log-sum-exp (fp32)", 4 * b * as * s},
        {"mlp.gate", "output", e * T * fs},
        {"mlp.down", "output (before its reduction)", e * T * h},
    };
    if (t > 1) op.push_back({"mlp.down", "reduce-scatter output", e * Tr * h});
    return op;
  }
  bool const eager = !m.fused_kernels;
  std::vector<saved_tensor> out{
      norm_activation(m, "attn_norm", Tr * h), {"attn.qkv", "input (the norm's output)", xc * Tg * h},
      {"core attention", "Q", e * T * hs},     {"core attention", "K", e * T * kvs},
      {"core attention", "V", e * T * kvs},
  };
  bool const keep_core = rc == recompute_kind::none;
  if (m.flash_attention) {
    out.push_back({"core attention", "output (flash backward; the output projection's input)", e * T * hs});
    if (keep_core) out.push_back({"core attention", "log-sum-exp (fp32)", 4 * b * as * s});
  } else {
    if (keep_core) {
      out.push_back({"core attention", "softmax output", e * b * as * s * s});
      if (m.dropout) {
        out.push_back({"core attention", "dropout mask", b * as * s * s});
        out.push_back({"core attention", "dropout output", e * b * as * s * s});
      }
    }
    out.push_back({"attn.o", "input", x * T * hs});
  }
  if (m.dropout) out.push_back({"attention dropout", "mask", Tr * h});
  out.push_back(norm_activation(m, "mlp_norm", Tr * h));
  if (m.moe.enabled()) {
    for (auto& row : moe_layer_activations(m, p)) out.push_back(std::move(row));
  } else if (m.mlp == mlp_kind::gelu) {
    out.push_back({"mlp.fc1", "input (the norm's output)", xc * Tg * h});
    out.push_back({"GeLU", "input", e * T * fs});
    out.push_back({"mlp.fc2", "input (the GeLU's output)", x * T * fs});
  } else {
    out.push_back({"mlp.gate/up", "input (the norm's output)", xc * Tg * h});
    out.push_back({"SwiGLU", "gate and up outputs", 2 * e * T * fs});
    if (eager) out.push_back({"SwiGLU", "SiLU output (eager)", e * T * fs});
    out.push_back({"mlp.down", "input (the SwiGLU's output)", x * T * fs});
  }
  if (m.dropout) out.push_back({"MLP dropout", "mask", Tr * h});
  return out;
}

/// Saved activation bytes per layer per micro-batch on one device: the sum of layer_activations(),
/// or model.activation_bytes_per_layer when set. For the GPT shape (GeLU MLP of width 4h, a = kv
/// heads, dropout, no flash attention, 16-bit) this is Korthikanti et al.'s s·b·h·(34 + 5·a·s/h), with
/// tp: s·b·h·(10 + 24/t + 5·a·s/(h·t)), with sequence parallelism s·b·h·(34/t + 5·a·s/(h·t)), and so
/// on (tests/sim/model_test.cpp pins every row).
inline std::uint64_t activation_bytes_per_layer(model_spec const& m, parallel_spec const& p = {},
                                                std::optional<recompute_kind> rc = std::nullopt) {
  if (m.activation_bytes_per_layer) return *m.activation_bytes_per_layer;
  std::uint64_t sum = 0;
  for (auto const& x : layer_activations(m, p, rc.value_or(m.recompute))) sum += x.bytes;
  return sum;
}

/// The last stage's saved tensors besides its layers: the final norm's input, the output layer's
/// input and the cross entropy's fp32 softmax over the device's vocabulary shard (Megatron's
/// vocabulary-parallel cross entropy). With eager kernels the norm saves (4 + e)·T'·h, as a layer's;
/// with parallel.save_gathered_inputs the output layer's input is the gathered e·T·h.
inline std::vector<saved_tensor> head_activations(model_spec const& m, parallel_spec const& p) {
  std::uint64_t const e = size_of(m.param_dtype), t = p.tp, T = m.seq_len * m.micro_batch_size;
  std::uint64_t const Tr = p.sequence_parallel ? T / t : T;
  return {norm_activation(m, "norm", Tr * m.hidden),
          {"lm_head", "input (the norm's output)", e * (p.save_gathered_inputs ? T : Tr) * m.hidden},
          {"cross entropy", "softmax of the logits (fp32)", 4 * T * pipeswap::detail::ceil_div(m.vocab, t)}};
}

/// What the loss's backward holds beside what the head saved, per micro-batch on the last stage, per
/// element of the device's T·V/t logits: PyTorch's cross entropy on fp32 logits (model.loss
/// "pytorch") computes the fp32 gradient of the loss and then of the log-softmax, 8 bytes, while the
/// saved log-softmax is alive (12 at its peak); with t > 1 the logits are split over the vocabulary
/// and PyTorch's cross entropy is DTensor's loss_parallel, whose fused backward of the loss and the
/// log-softmax, (zeros with the targets' −1 + exp(log-softmax)) · grad, holds 12 (16 at its peak).
/// tests/python/test_activation_table.py measures both. Megatron's fused cross entropy writes its
/// gradient in place of the saved softmax (0).
inline std::uint64_t head_backward_bytes(model_spec const& m, parallel_spec const& p) {
  if (m.loss != loss_kind::pytorch) return 0;
  std::uint64_t const per_logit = p.tp > 1 ? 12 : 8;
  return per_logit * m.seq_len * m.micro_batch_size * pipeswap::detail::ceil_div(m.vocab, std::uint64_t{p.tp});
}

/// The embedding's dropout mask on the first stage (with dropout).
inline std::uint64_t embedding_activation_bytes(model_spec const& m, parallel_spec const& p) {
  if (!m.dropout) return 0;
  std::uint64_t const T = m.seq_len * m.micro_batch_size;
  return (p.sequence_parallel ? T / p.tp : T) * m.hidden;
}

/// Parameters of one transformer layer on one device of the tensor-parallel group: attention (q, o:
/// h×h; k, v: h×kv), the MLP (SwiGLU: gate, up h×f, down f×h; GeLU: fc1 h×f, fc2 f×h), every matrix
/// split over tp (column- or row-parallel), and two norms kept whole.
/// With MoE (model.moe.experts > 0) the MLP is moe_layer_tensors().
inline std::vector<tensor_spec> layer_tensors(model_spec const& m, std::uint32_t layer, parallel_spec const& par) {
  auto const tp = par.tp;
  auto const h = m.hidden, f = m.ffn_hidden / tp, kv = head_dim_of(m) * (m.kv_heads / tp), hs = attention_width(m) / tp;
  std::string const p = "layers." + std::to_string(layer) + ".";
  std::vector<tensor_spec> out{{p + "attn_norm", h, false}, {p + "attn.q", h * hs}, {p + "attn.k", h * kv},
                               {p + "attn.v", h * kv},      {p + "attn.o", hs * h}, {p + "mlp_norm", h, false}};
  if (m.moe.enabled()) {
    for (auto& t : moe_layer_tensors(m, par, p)) out.push_back(std::move(t));
  } else if (m.mlp == mlp_kind::gelu) {
    out.push_back({p + "mlp.fc1", h * f});
    out.push_back({p + "mlp.fc2", f * h});
  } else {
    out.push_back({p + "mlp.gate", h * f});
    out.push_back({p + "mlp.up", h * f});
    out.push_back({p + "mlp.down", f * h});
  }
  return out;
}

/// layer_tensors() of a tensor-parallel degree `tp` alone.
inline std::vector<tensor_spec> layer_tensors(model_spec const& m, std::uint32_t layer, std::uint32_t tp = 1) {
  parallel_spec p;
  p.tp = tp;
  return layer_tensors(m, layer, p);
}

/// Where torchtitan's per-operation recomputation (recompute_kind::op) is modelled, and the rule
/// that the errors state.
inline constexpr std::string_view op_recompute_rule =
    "(torchtitan's per-operation policy) is modelled for dense SwiGLU layers with flash attention (no "
    "model.moe, model.mlp \"swiglu\", model.flash_attention)";
inline bool op_recompute_modelled(model_spec const& m) {
  return !m.moe.enabled() && m.mlp == mlp_kind::swiglu && m.flash_attention;
}

/// Checks a scenario; throws invalid_argument naming the field and the rule.
inline void validate(scenario const& s) {
  auto need = [](bool ok, std::string const& what) {
    if (!ok) throw invalid_argument("scenario: " + what);
  };
  auto const& m = s.model;
  need(m.layers >= 1, "model.layers must be at least 1");
  need(m.hidden >= 1, "model.hidden must be at least 1");
  need(m.ffn_hidden >= 1, "model.ffn_hidden must be at least 1");
  need(m.vocab >= 1, "model.vocab must be at least 1");
  need(m.heads >= 1, "model.heads must be at least 1");
  need(m.kv_heads >= 1, "model.kv_heads must be at least 1");
  need(m.heads % m.kv_heads == 0, "model.heads (" + std::to_string(m.heads) +
                                      ") must be a multiple of model.kv_heads (" + std::to_string(m.kv_heads) + ")");
  need(m.head_dim ? *m.head_dim >= 1 : m.hidden % m.heads == 0,
       m.head_dim ? "model.head_dim must be positive"
                  : "model.hidden must be a multiple of model.heads (or set model.head_dim)");
  need(m.seq_len >= 1, "model.seq_len must be at least 1");
  need(m.micro_batch_size >= 1, "model.micro_batch_size must be at least 1");
  need(m.param_dtype == dtype::bf16 || m.param_dtype == dtype::f16 || m.param_dtype == dtype::f32,
       "model.param_dtype must be BF16, F16 or F32");
  need(!(m.fp32_master && m.param_dtype == dtype::f32), "model.fp32_master needs BF16 or F16 weights");
  if (m.grad_dtype)
    need(*m.grad_dtype == dtype::bf16 || *m.grad_dtype == dtype::f16 || *m.grad_dtype == dtype::f32,
         "model.grad_dtype must be F32, BF16 or F16");
  auto const& p = s.parallel;
  auto const tp = std::to_string(p.tp);
  need(p.tp >= 1, "parallel.tp must be at least 1");
  need(p.dp >= 1, "parallel.dp must be at least 1");
  need(m.heads % p.tp == 0,
       "model.heads (" + std::to_string(m.heads) + ") must be a multiple of parallel.tp (" + tp + ")");
  need(m.kv_heads % p.tp == 0,
       "model.kv_heads (" + std::to_string(m.kv_heads) + ") must be a multiple of parallel.tp (" + tp + ")");
  need(m.ffn_hidden % p.tp == 0,
       "model.ffn_hidden (" + std::to_string(m.ffn_hidden) + ") must be a multiple of parallel.tp (" + tp + ")");
  need(!p.sequence_parallel || p.tp > 1, "parallel.sequence_parallel needs parallel.tp > 1");
  need(!p.sequence_parallel || (m.seq_len * m.micro_batch_size) % p.tp == 0,
       "parallel.sequence_parallel needs model.seq_len × model.micro_batch_size to be a multiple of parallel.tp");
  need(!p.save_gathered_inputs || p.sequence_parallel,
       "parallel.save_gathered_inputs needs parallel.sequence_parallel (without it every input is whole already)");
  need(!p.save_gathered_inputs || !m.moe.enabled(),
       "parallel.save_gathered_inputs is modelled for dense layers (model.moe.experts 0)");
  need(!p.distributed_optimizer || p.dp > 1, "parallel.distributed_optimizer needs parallel.dp > 1");
  need(!p.fsdp || p.distributed_optimizer,
       "parallel.fsdp needs parallel.distributed_optimizer (FSDP shards the optimizer state as it does, and the "
       "weights and gradients too)");
  need(m.recompute != recompute_kind::op || op_recompute_modelled(m),
       "model.recompute \"op\" " + std::string(op_recompute_rule));
  auto const& moe = m.moe;
  need(p.ep >= 1, "parallel.ep must be at least 1");
  need(!p.expert_tp || *p.expert_tp >= 1, "parallel.expert_tp must be at least 1");
  need(moe.load_imbalance >= 1 && std::isfinite(moe.load_imbalance),
       "model.moe.load_imbalance must be at least 1 (the busiest device's pairs over the balanced share)");
  if (!moe.enabled()) {
    need(p.ep == 1 && !p.expert_tp, "parallel.ep and parallel.expert_tp need model.moe.experts > 0");
    need(moe.shared_expert_ffn_hidden == 0 && moe.expert_ffn_hidden == 0,
         "model.moe.expert_ffn_hidden and model.moe.shared_expert_ffn_hidden need model.moe.experts > 0");
    need(!moe.host_layer_ms, "model.moe.host_layer_ms needs model.moe.experts > 0");
    need(moe.dispatch == moe_dispatch::all_to_all, "model.moe.dispatch \"per_node\" needs model.moe.experts > 0");
  } else {
    auto const etp = expert_tp_of(p);
    need(moe.top_k >= 1 && moe.top_k <= moe.experts,
         "model.moe.top_k must be in 1..model.moe.experts (" + std::to_string(moe.experts) + ")");
    need(moe.expert_ffn_hidden >= 1, "model.moe.expert_ffn_hidden must be positive with model.moe.experts > 0");
    need(!moe.capacity_factor || (*moe.capacity_factor > 0 && std::isfinite(*moe.capacity_factor)),
         "model.moe.capacity_factor must be positive (null: dropless)");
    need(!moe.pad_to_capacity || moe.capacity_factor, "model.moe.pad_to_capacity needs model.moe.capacity_factor");
    need(!moe.host_layer_ms || (*moe.host_layer_ms >= 0 && std::isfinite(*moe.host_layer_ms)),
         "model.moe.host_layer_ms must be a time of at least 0 (null: the fitted default)");
    need(moe.experts % p.ep == 0, "model.moe.experts (" + std::to_string(moe.experts) +
                                      ") must be a multiple of parallel.ep (" + std::to_string(p.ep) + ")");
    need(moe.expert_ffn_hidden % etp == 0, "model.moe.expert_ffn_hidden must be a multiple of the expert "
                                           "tensor-parallel degree (parallel.expert_tp, else parallel.tp)");
    need(moe.shared_expert_ffn_hidden % p.tp == 0,
         "model.moe.shared_expert_ffn_hidden must be a multiple of parallel.tp");
    need((std::uint64_t{p.tp} * p.dp) % (std::uint64_t{etp} * p.ep) == 0,
         "parallel.expert_tp × parallel.ep (" + std::to_string(std::uint64_t{etp} * p.ep) +
             ") must divide parallel.tp × parallel.dp (" + std::to_string(std::uint64_t{p.tp} * p.dp) +
             "): the experts regroup a pipeline rank's devices");
    need(p.tp == 1 || p.sequence_parallel,
         "model.moe.experts > 0 with parallel.tp > 1 needs parallel.sequence_parallel "
         "(as Megatron-Core requires)");
  }
  need(s.node.gpus >= 1, "node.gpus must be at least 1");
  need(p.tp <= s.node.gpus, "parallel.tp (" + tp + ") must not exceed node.gpus (" + std::to_string(s.node.gpus) +
                                "): tensor parallelism runs over NVLink inside a node");
  need(s.node.host_gbps > 0 && std::isfinite(s.node.host_gbps), "node.host_gbps must be positive");
  need(s.node.cpu_adam_gbps > 0 && std::isfinite(s.node.cpu_adam_gbps), "node.cpu_adam_gbps must be positive");
  auto const& d = s.device;
  need(d.memory_bytes > d.reserved_bytes, "device.memory_bytes must exceed device.reserved_bytes");
  for (auto [v, n] : {std::pair{d.h2d_gbps, "h2d_gbps"},
                      {d.d2h_gbps, "d2h_gbps"},
                      {d.bf16_tflops, "bf16_tflops"},
                      {d.fp8_tflops, "fp8_tflops"},
                      {d.hbm_tbps, "hbm_tbps"},
                      {d.p2p_gbps, "p2p_gbps"},
                      {d.nvlink_gbps, "nvlink_gbps"},
                      {d.network_gbps, "network_gbps"}}) {
    need(v > 0 && std::isfinite(v), std::string("device.") + n + " must be positive");
  }
  need(d.kernel_efficiency > 0 && d.kernel_efficiency <= 1, "device.kernel_efficiency must be in (0, 1]");
  need(!d.end_to_end_mfu || (*d.end_to_end_mfu > 0 && *d.end_to_end_mfu <= 1),
       "device.end_to_end_mfu must be in (0, 1]");
  need(d.duplex_factor >= 0.5 && d.duplex_factor <= 1,
       "device.duplex_factor must be in [0.5, 1] (0.5: the two directions share one rate; 1: full duplex)");
  for (auto [v, n] : {std::pair{d.copy_latency_us, "copy_latency_us"},
                      {d.p2p_latency_us, "p2p_latency_us"},
                      {d.nvlink_latency_us, "nvlink_latency_us"},
                      {d.network_latency_us, "network_latency_us"}}) {
    need(v >= 0 && std::isfinite(v), std::string("device.") + n + " must not be negative");
  }
  auto const& pl = s.pipeline;
  need(pl.ranks >= 1, "pipeline.ranks must be at least 1");
  need(pl.micro_batches >= 1, "pipeline.micro_batches must be at least 1");
  need(pl.stages_per_rank >= 1, "pipeline.stages_per_rank must be at least 1");
  need(pl.schedule == schedule_kind::interleaved || pl.stages_per_rank == 1,
       "pipeline.stages_per_rank > 1 needs the interleaved schedule");
  need(!pl.overlap_b_f || pl.schedule == schedule_kind::interleaved,
       "pipeline.overlap_b_f needs the interleaved schedule");
  auto const stages = static_cast<std::uint64_t>(pl.ranks) * pl.stages_per_rank;
  need(m.layers >= stages, "model.layers (" + std::to_string(m.layers) +
                               ") must be at least the number of "
                               "stages (pipeline.ranks × pipeline.stages_per_rank = " +
                               std::to_string(stages) + ")");
  need(s.swap.swap_times >= 1, "swap.swap_times must be positive");
  need(s.plan.tolerance >= 0 && s.plan.tolerance < 1, "plan.tolerance must be in [0, 1)");
}

/// Where the devices of one parallel group sit. Devices are numbered in Megatron's default order
/// (tp, then cp, ep and dp, then pp: the fastest-varying first; no context parallelism here), node.gpus
/// consecutive devices to a node. A group of `size` devices `stride` apart has
/// per_node = min(size, max(1, node.gpus / stride)) of them on each node it touches, over
/// nodes = ceil(size / per_node) nodes.
struct group_span {
  std::uint32_t size = 1, per_node = 1, nodes = 1;
  [[nodiscard]] bool in_node() const noexcept { return nodes <= 1; }
};

inline group_span span_of(std::uint64_t stride, std::uint32_t size, std::uint32_t gpus_per_node) {
  group_span g;
  g.size = std::max<std::uint32_t>(size, 1);
  auto const fit = stride >= gpus_per_node ? std::uint64_t{1} : std::max<std::uint64_t>(1, gpus_per_node / stride);
  g.per_node = static_cast<std::uint32_t>(std::min<std::uint64_t>(g.size, fit));
  g.nodes = (g.size + g.per_node - 1) / g.per_node;
  return g;
}

/// The groups of a pipeline rank's devices. Dense layers: tp (stride 1), dp (stride tp), pp (stride
/// tp·dp). Expert layers (Megatron's "MoE parallel folding", order expert_tp, ep, expert dp): the
/// expert-parallel group has stride expert_tp, the expert data-parallel group expert_tp·ep.
inline group_span tp_span(scenario const& s) { return span_of(1, s.parallel.tp, s.node.gpus); }
inline group_span dp_span(scenario const& s) { return span_of(s.parallel.tp, s.parallel.dp, s.node.gpus); }
inline group_span pp_span(scenario const& s) {
  return span_of(std::uint64_t{s.parallel.tp} * s.parallel.dp, s.pipeline.ranks, s.node.gpus);
}
inline group_span ep_span(scenario const& s) { return span_of(expert_tp_of(s.parallel), s.parallel.ep, s.node.gpus); }
inline group_span expert_dp_span(scenario const& s) {
  return span_of(std::uint64_t{expert_tp_of(s.parallel)} * s.parallel.ep,
                 static_cast<std::uint32_t>(expert_dp_of(s.parallel)), s.node.gpus);
}

/// The bus bandwidth (NCCL's convention) of a ring over the group: NVLink inside one node; across
/// nodes the ring's traffic leaves each node through the NICs of its per_node members (one NIC per
/// device), so min(NVLink, per_node · network_gbps).
inline double ring_gbps(group_span g, device_spec const& d) {
  return g.in_node() ? d.nvlink_gbps : std::min(d.nvlink_gbps, g.per_node * d.network_gbps);
}

/// The latency of one collective over the group: NVLink's inside a node, the network's across nodes.
inline double group_latency_us(group_span g, device_spec const& d) {
  return g.in_node() ? d.nvlink_latency_us : d.network_latency_us;
}

/// A collective moving `bytes` of data among the group's devices by the ring algorithm: an all-reduce
/// costs 2·(n−1)/n·bytes / ring_gbps, an all-gather or reduce-scatter (n−1)/n·bytes / ring_gbps
/// (NCCL's bus-bandwidth convention), plus group_latency_us. 0 for one device or no bytes.
enum class collective : std::uint8_t { all_reduce, all_gather, reduce_scatter };
inline mock::sim_time collective_ns(collective c, double bytes, group_span g, device_spec const& d) {
  auto const n = g.size;
  if (n <= 1 || bytes <= 0) return 0;
  double const share = (c == collective::all_reduce ? 2.0 : 1.0) * (n - 1) / n;
  return static_cast<mock::sim_time>(
      std::llround(group_latency_us(g, d) * 1e3 + share * bytes / (ring_gbps(g, d) * 1e9) * 1e9));
}

/// The tensor-parallel collectives of one layer per micro-batch, as they delay the layer: its
/// forward and its backward (the conjugate collectives). Megatron runs two all-reduces of the e·T·h
/// activation (after the attention and after the MLP), or with sequence parallelism an all-gather
/// before the q/k/v projection and before the MLP and a reduce-scatter after the output projection
/// and after the MLP; the backward reduce-scatters the two inputs' gradients and all-gathers the two
/// outputs' gradients. With FP8 GEMMs (model.precision) the all-gathers move the tensors already cast
/// to FP8, 1 byte per element: the GEMM inputs in the forward, the output gradients in the backward
/// (Transformer Engine's sequence-parallel LayerNormLinear and Linear; torchao's
/// Float8ColwiseParallel and Float8RowwiseParallel); the reduce-scatters stay 16-bit, and so does
/// the MoE side's all-gather (its router runs in 16 bits). With parallel.tp_comm_overlap and sequence
/// parallelism each of the four hides under the GEMM it feeds or follows (op_times::tp_paired_fwd,
/// _bwd): it delays the layer by max(c / tp, c − gemm), c its time alone; a collective of the MoE side
/// (no paired GEMM) stays exposed. Without sequence parallelism every collective is exposed. With MoE
/// both passes add the expert-TP collectives (moe_expert_tp_comm_ns), exposed.
struct layer_comm {
  mock::sim_time fwd = 0, bwd = 0;
};

/// With expert tensor parallelism (expert_tp > 1), Megatron-Core's token dispatchers all-gather over
/// the expert-TP group the token copies that the expert-parallel all-to-all delivered, so that every
/// shard of an expert sees all of its tokens, and reduce-scatter the experts' outputs over it before
/// the combine (token_dispatcher.py: dispatch_postprocess, combine_preprocess); the backward runs the
/// conjugate collectives. They run on the compute stream between the all-to-alls and the experts, so
/// nothing hides them, combined slots included. Each pass of a layer per micro-batch: an all-gather
/// and a reduce-scatter of e·P·h bytes, P = top_k·T'·expert_tp (× moe_load_factor), over the
/// expert-TP group (the innermost ranks). The reduce-scatter runs in the routing probabilities' type,
/// the activations' unless --moe-router-dtype fp32 makes it 4 bytes; it is charged at e.
inline mock::sim_time moe_expert_tp_comm_ns(scenario const& s) {
  auto const etp = expert_tp_of(s.parallel);
  if (!s.model.moe.enabled() || etp <= 1) return 0;
  double const bytes = moe_a2a_bytes(s.model, s.parallel) * etp; // e·P·h
  auto const g = span_of(1, etp, s.node.gpus);
  return collective_ns(collective::all_gather, bytes, g, s.device) +
         collective_ns(collective::reduce_scatter, bytes, g, s.device);
}

namespace detail {
/// The dense tensor-parallel collectives of tp_layer_comm (without the expert-TP ones).
inline layer_comm dense_tp_layer_comm(scenario const& s, op_times const& ops) {
  auto const& p = s.parallel;
  if (p.tp <= 1) return {};
  double const elements = static_cast<double>(s.model.seq_len * s.model.micro_batch_size * s.model.hidden);
  double const e = static_cast<double>(size_of(s.model.param_dtype));
  auto const& d = s.device;
  auto const g = tp_span(s);
  if (!p.sequence_parallel) {
    auto const ar = 2 * collective_ns(collective::all_reduce, e * elements, g, d);
    return {ar, ar};
  }
  bool const fp8 = s.model.precision == precision::fp8;
  auto const wide = collective_ns(collective::all_gather, e * elements, g, d);
  auto const narrow = fp8 ? collective_ns(collective::all_gather, elements, g, d) : wide;
  auto const mlp_gather = s.model.moe.enabled() ? wide : narrow;
  // In layer order (q/k/v, output projection, the MLP's first and second GEMM): the forward's
  // all-gather, reduce-scatter, all-gather, reduce-scatter; the backward's reduce-scatter, all-gather,
  // reduce-scatter, all-gather (a reduce-scatter takes an all-gather's time over as many bytes).
  std::array<mock::sim_time, 4> const fwd{narrow, wide, mlp_gather, wide}, bwd{wide, narrow, wide, mlp_gather};
  auto exposed = [&](std::array<mock::sim_time, 4> const& c, std::array<double, 4> const& paired) {
    mock::sim_time t = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      auto const hidden = static_cast<mock::sim_time>(std::llround(paired[i] * 1e9));
      t += p.tp_comm_overlap && paired[i] > 0 ? std::max<mock::sim_time>(c[i] / p.tp, c[i] - std::min(c[i], hidden))
                                              : c[i];
    }
    return t;
  };
  return {exposed(fwd, ops.tp_paired_fwd), exposed(bwd, ops.tp_paired_bwd)};
}
} // namespace detail

inline layer_comm tp_layer_comm(scenario const& s, op_times const& ops) {
  auto const dense = detail::dense_tp_layer_comm(s, ops);
  auto const etp = moe_expert_tp_comm_ns(s);
  return {dense.fwd + etp, dense.bwd + etp};
}

/// The expected number of other nodes a token's top_k distinct experts lie on, with the E experts
/// spread evenly over `nodes` nodes and every set of top_k experts equally likely (balanced routing):
/// (nodes − 1)·(1 − q), q = C(E − E/nodes, top_k) / C(E, top_k) the chance that a node holds none.
inline double moe_remote_nodes_per_token(moe_spec const& e, std::uint32_t nodes) {
  if (nodes <= 1) return 0;
  double const E = static_cast<double>(e.experts), others = E - E / nodes;
  double q = 1;
  for (std::uint64_t i = 0; i < e.top_k && q > 0; ++i)
    q *= std::max(0.0, (others - static_cast<double>(i)) / (E - static_cast<double>(i)));
  return (nodes - 1) * (1 - q);
}

/// The bytes one device sends per all-to-all of a layer over NVLink and over its network link.
/// all_to_all: 1/ep of its moe_a2a_bytes to each peer, (per_node − 1)/ep of them over NVLink, the
/// rest, (ep − per_node)/ep, over the network. per_node: each token once to each other node that holds
/// any of its experts (moe_remote_nodes_per_token), and every copy bound for another device of a node
/// over that node's NVLink, (per_node − 1)/per_node of them (forwarded inside the receiving nodes, or
/// sent to the sender's own peers; a device forwards as many as it receives by symmetry). Inside one
/// node the two are the same.
struct a2a_bytes {
  double nvlink = 0, network = 0;
};
inline a2a_bytes moe_a2a_link_bytes(scenario const& s) {
  auto const& p = s.parallel;
  auto const g = ep_span(s);
  double const bytes = moe_a2a_bytes(s.model, p);
  if (s.model.moe.dispatch == moe_dispatch::all_to_all || g.in_node())
    return {bytes * (g.per_node - 1) / p.ep, bytes * (p.ep - g.per_node) / p.ep};
  double const per_copy = bytes / static_cast<double>(s.model.moe.top_k);
  return {bytes * (g.per_node - 1) / g.per_node, per_copy * moe_remote_nodes_per_token(s.model.moe, g.nodes)};
}

/// The all-to-alls of one MoE layer's forward (per micro-batch): the dispatch and the combine of the
/// device's top_k·T' token copies among the ep devices of its expert-parallel group, over NVLink and
/// the network at once (moe_a2a_link_bytes, by model.moe.dispatch); each all-to-all takes the slower
/// of the two plus the group's latency. The backward runs both again (the same time).
inline mock::sim_time moe_layer_a2a_ns(scenario const& s) {
  auto const& p = s.parallel;
  if (!s.model.moe.enabled() || p.ep <= 1) return 0;
  auto const g = ep_span(s);
  auto const& d = s.device;
  auto const b = moe_a2a_link_bytes(s);
  double const secs = std::max(b.nvlink / (d.nvlink_gbps * 1e9), b.network / (d.network_gbps * 1e9));
  return 2 * static_cast<mock::sim_time>(std::llround(group_latency_us(g, d) * 1e3 + secs * 1e9));
}

/// The data-parallel gradient synchronization of `params` parameters (per device), `expert_params`
/// of them routed experts': a reduce-scatter of the gradients with the distributed optimizer, else
/// an all-reduce, over the data-parallel group (the experts' over the expert data-parallel group).
inline mock::sim_time dp_grad_sync_ns(scenario const& s, std::uint64_t params, std::uint64_t expert_params = 0) {
  auto const& p = s.parallel;
  auto const kind = p.distributed_optimizer ? collective::reduce_scatter : collective::all_reduce;
  auto const g = size_of(grad_dtype_of(s.model));
  return collective_ns(kind, static_cast<double>((params - expert_params) * g), dp_span(s), s.device) +
         collective_ns(kind, static_cast<double>(expert_params * g), expert_dp_span(s), s.device);
}

/// With the distributed optimizer, the all-gather of the updated weights after the step.
inline mock::sim_time dp_param_gather_ns(scenario const& s, std::uint64_t params, std::uint64_t expert_params = 0) {
  auto const& p = s.parallel;
  if (!p.distributed_optimizer) return 0;
  auto const e = size_of(s.model.param_dtype);
  return collective_ns(collective::all_gather, static_cast<double>((params - expert_params) * e), dp_span(s),
                       s.device) +
         collective_ns(collective::all_gather, static_cast<double>(expert_params * e), expert_dp_span(s), s.device);
}

/// The data-parallel buckets of `params` parameters: Megatron-Core's default bucket of
/// max(40,000,000, 1,000,000 · dp) parameters (DistributedDataParallelConfig, with overlap).
inline std::uint64_t dp_buckets(scenario const& s, std::uint64_t params) {
  auto const size = std::max<std::uint64_t>(40'000'000, std::uint64_t{1'000'000} * s.parallel.dp);
  return std::max<std::uint64_t>(1, (params + size - 1) / size);
}

/// Whether FSDP gathers each layer per micro-batch: parallel.fsdp without a pipeline (torchtitan's
/// wrapping: every layer its own unit, resharded after its forward, the rest of the model the root's).
/// With a pipeline FSDP keeps the rank's stages gathered across micro-batches (torchtitan sets
/// reshard_after_forward false with a pipeline) and communicates as the distributed optimizer does.
inline bool fsdp_per_layer(scenario const& s) { return s.parallel.fsdp && s.pipeline.ranks == 1; }

/// The parameters of a stage outside its layers: the embedding, the final norm, the output layer (the
/// root unit of FSDP's wrapping).
inline std::uint64_t root_params(stage_spec const& st) {
  std::uint64_t n = 0;
  for (auto const& t : st.tensors)
    if (!t.name.starts_with("layers.")) n += t.numel;
  return n;
}

/// FSDP's per-layer collectives as they show in one micro-batch's forward and backward
/// (fsdp_per_layer), for layers of `params` parameters (`expert_params` of them routed experts')
/// whose forward takes `f` and backward (its recomputation included) `b`: each layer's weights are
/// all-gathered before its forward and again before its backward (ag, dp_param_gather_ns), its
/// gradients reduce-scattered after its backward (rs, dp_grad_sync_ns), prefetched one layer ahead
/// on the data-parallel group:
/// - forward: the first layer's all-gather is exposed (only the embedding runs before it), each
///   later one hides under the previous layer's forward and shows what exceeds it:
///   ag + (L − 1)·max(0, ag − f);
/// - backward: the last layer is still gathered (it is not resharded); under each layer's backward
///   run the next one's all-gather and the previous one's reduce-scatter, which share the link:
///   (L − 1)·max(0, ag + rs − b), and the first layer's reduce-scatter after the last backward, rs.
/// The root unit is gathered once per step and kept (FSDP does not reshard the root after its
/// forward); the rank simulation charges its all-gather and reduce-scatter once per step, exposed.
struct fsdp_comm {
  mock::sim_time fwd = 0, bwd = 0;
};
inline fsdp_comm fsdp_layer_comm(scenario const& s, std::uint64_t params, std::uint64_t expert_params,
                                 std::uint32_t layers, mock::sim_time f, mock::sim_time b) {
  if (!fsdp_per_layer(s) || layers == 0) return {};
  auto const ag = dp_param_gather_ns(s, params, expert_params), rs = dp_grad_sync_ns(s, params, expert_params);
  auto const over = [](mock::sim_time x, mock::sim_time y) { return x > y ? x - y : mock::sim_time{0}; };
  return {ag + (layers - 1) * over(ag, f), rs + (layers - 1) * over(ag + rs, b)};
}

/// The pipeline's send/recv link between pipeline ranks `a` and `b` (neighbours, or the last and the
/// first of an interleaved pipeline): NVLink (device.p2p_gbps, p2p_latency_us) when their devices share
/// a node, else the network (network_gbps, network_latency_us).
inline bool p2p_crosses_nodes(scenario const& s, std::uint32_t a, std::uint32_t b) {
  auto const stride = std::uint64_t{s.parallel.tp} * s.parallel.dp;
  return (a * stride) / s.node.gpus != (b * stride) / s.node.gpus;
}

/// Splits the model into stages (layers as even as possible, the first stages taking the remainder;
/// the embedding on stage 0, the final norm and output head on the last) and derives each stage's
/// parameters, saved activations and compute time per micro-batch on one device. `recompute` gives
/// the recomputation of each stage (empty: model.recompute everywhere).
///
/// FLOPs (Narayanan et al. 2021, §5.1): forward FLOPs per micro-batch = 2·T·(the stage's weight
/// matrices on this device) + 4·b·s²·h/t per layer (attention scores and attention over V). The
/// embedding is a lookup, not a matmul, and norms are not counted. Backward = 2 × forward; full
/// recomputation adds the layers' forward (not the output layer's), selective adds the attention
/// core's 4·b·s²·h/t per layer, the "op" policy the k, output and up projections' 2·T·(kv/t·h + h·h'
/// + f'·h). These are the model FLOPs an MFU divides by.
/// Time (sim/compute.hpp): per layer, layer_op_times() (GEMMs by shape, attention, memory-bound
/// kernels), the head's head_op_times(); the backward adds a full recomputation's layer forward, a
/// selective recomputation's attention forward or the "op" policy's op_recompute_fwd; plus the
/// tensor-parallel collectives (tp_layer_comm per layer, the forward's once more for a full or "op"
/// recomputation) and the MoE all-to-alls.
inline std::vector<stage_spec> plan_stages(scenario const& s, std::vector<recompute_kind> const& recompute = {}) {
  validate(s);
  auto const& m = s.model;
  auto const& par = s.parallel;
  auto const stages = s.pipeline.ranks * s.pipeline.stages_per_rank;
  if (!recompute.empty() && recompute.size() != stages)
    throw invalid_argument("plan_stages: " + std::to_string(recompute.size()) + " recomputation settings for " +
                           std::to_string(stages) + " stages");
  for (std::size_t st = 0; st < recompute.size(); ++st)
    if (recompute[st] == recompute_kind::op && !op_recompute_modelled(s.model))
      throw invalid_argument("plan_stages: stage " + std::to_string(st) + "'s recomputation \"op\" " +
                             std::string(op_recompute_rule));
  auto const base = static_cast<std::uint32_t>(m.layers / stages);
  auto const extra = static_cast<std::uint32_t>(m.layers % stages);
  auto const tokens = static_cast<double>(m.seq_len * m.micro_batch_size);
  std::uint64_t const T = m.seq_len * m.micro_batch_size;
  auto const e = size_of(m.param_dtype);
  auto const layer_t = layer_op_times(m, par, s.device);
  auto const head_t = head_op_times(m, par, s.device);
  auto const tp_comm = tp_layer_comm(s, layer_t);
  auto const a2a = moe_layer_a2a_ns(s);
  double const host_floor = moe_host_floor_s(m.moe);
  auto const head_acts = head_activations(m, par);
  std::vector<stage_spec> out(stages);
  std::uint32_t layer = 0;
  for (std::uint32_t st = 0; st < stages; ++st) {
    auto& o = out[st];
    o.stage = st;
    o.first_layer = layer;
    o.layers = base + (st < extra ? 1 : 0);
    o.embedding = st == 0;
    o.head = st + 1 == stages;
    o.recompute = recompute.empty() ? m.recompute : recompute[st];
    auto const vshard = pipeswap::detail::ceil_div(m.vocab, std::uint64_t{par.tp});
    if (o.embedding) o.tensors.push_back({"embed_tokens", vshard * m.hidden, false});
    for (std::uint32_t l = 0; l < o.layers; ++l) {
      for (auto& t : layer_tensors(m, layer + l, par)) o.tensors.push_back(std::move(t));
    }
    if (o.head) {
      o.tensors.push_back({"norm", m.hidden, false});
      o.tensors.push_back({"lm_head", vshard * m.hidden});
    }
    layer += o.layers;
    double layer_matmul = 0, head_matmul = 0;
    for (auto const& t : o.tensors) {
      o.params += t.numel;
      if (!t.matmul) continue;
      (t.name == "lm_head" ? head_matmul : layer_matmul) += static_cast<double>(t.numel);
    }
    // The stage input: the embedding's output or what the previous stage sent (split along the
    // sequence with sequence parallelism).
    o.boundary_bytes = (par.sequence_parallel ? T / par.tp : T) * m.hidden * e;
    o.p2p_bytes = o.boundary_bytes;
    o.activation_bytes = activation_bytes_per_layer(m, par, o.recompute) * o.layers + o.boundary_bytes;
    if (o.embedding) o.activation_bytes += embedding_activation_bytes(m, par);
    if (o.head)
      for (auto const& x : head_acts) o.activation_bytes += x.bytes;
    if (o.recompute == recompute_kind::full && !m.activation_bytes_per_layer)
      o.backward_workspace_bytes = activation_bytes_per_layer(m, par, recompute_kind::none);
    if (o.recompute == recompute_kind::op) { // the layer's recomputed tensors, beside the ones it kept
      auto const whole = activation_bytes_per_layer(m, par, recompute_kind::none);
      o.backward_workspace_bytes = whole - std::min(whole, activation_bytes_per_layer(m, par, recompute_kind::op));
    }
    // The loss's backward runs first and is done before the layers' recomputation: the larger of the two.
    if (o.head) o.backward_workspace_bytes = std::max(o.backward_workspace_bytes, head_backward_bytes(m, par));
    double const attn = 4.0 * static_cast<double>(m.micro_batch_size) * static_cast<double>(m.seq_len) *
                        static_cast<double>(m.seq_len) * static_cast<double>(attention_width(m) / par.tp) * o.layers;
    double const moe = m.moe.enabled() ? moe_layer_fwd_flops(m, par) * o.layers : 0.0;
    double const layers_fwd = 2.0 * layer_matmul * tokens + attn + moe;
    o.fwd_flops = layers_fwd + 2.0 * head_matmul * tokens;
    // torchtitan's "op" policy recomputes the k, output and up projections: kv/t·h + h·h' + f'·h.
    double const op_matmul =
        static_cast<double>(head_dim_of(m) * (m.kv_heads / par.tp) * m.hidden +
                            m.hidden * (attention_width(m) / par.tp) + (m.ffn_hidden / par.tp) * m.hidden) *
        o.layers;
    o.bwd_flops = 2.0 * o.fwd_flops + (o.recompute == recompute_kind::full        ? layers_fwd
                                       : o.recompute == recompute_kind::selective ? attn
                                       : o.recompute == recompute_kind::op        ? 2.0 * op_matmul * tokens
                                                                                  : 0.0);
    // Full recomputation and the "op" policy re-run the forward's collectives.
    bool const reruns_comm = o.recompute == recompute_kind::full || o.recompute == recompute_kind::op;
    o.fwd_a2a_ns = a2a * o.layers;
    o.bwd_a2a_ns = a2a * o.layers * (reruns_comm ? 2 : 1);
    o.fwd_comm_ns = tp_comm.fwd * o.layers + o.fwd_a2a_ns;
    o.bwd_comm_ns = (tp_comm.bwd + (reruns_comm ? tp_comm.fwd : 0)) * o.layers + o.bwd_a2a_ns;
    double const recomputed = o.recompute == recompute_kind::full        ? layer_t.fwd()
                              : o.recompute == recompute_kind::selective ? layer_t.attention_fwd
                              : o.recompute == recompute_kind::op        ? layer_t.op_recompute_fwd
                                                                         : 0.0;
    double fwd_s = layer_t.fwd() * o.layers, bwd_s = (layer_t.bwd() + recomputed) * o.layers;
    if (fsdp_per_layer(s)) { // FSDP's per-layer gathers and reductions, as far as they show
      std::uint64_t lp = 0, le = 0;
      for (auto const& t : layer_tensors(m, 0, par)) lp += t.numel, le += t.expert ? t.numel : 0;
      auto const per_layer = [&](double secs, mock::sim_time comm) {
        return static_cast<mock::sim_time>(std::llround(secs * 1e9)) + comm;
      };
      auto const fsdp =
          fsdp_layer_comm(s, lp, le, o.layers, per_layer(layer_t.fwd(), tp_comm.fwd + a2a),
                          per_layer(layer_t.bwd() + recomputed,
                                    tp_comm.bwd + (reruns_comm ? tp_comm.fwd : 0) + a2a * (reruns_comm ? 2 : 1)));
      o.fwd_comm_ns += fsdp.fwd;
      o.bwd_comm_ns += fsdp.bwd;
    }
    if (o.head) fwd_s += head_t.fwd(), bwd_s += head_t.bwd();
    o.fwd_ns = static_cast<mock::sim_time>(std::llround(fwd_s * 1e9)) + o.fwd_comm_ns;
    o.bwd_ns = static_cast<mock::sim_time>(std::llround(bwd_s * 1e9)) + o.bwd_comm_ns;
    // The host's issuing, a third of a layer's in the forward and two in the backward (its share of
    // the work), the forward's once more where the backward recomputes it: a floor under both.
    if (host_floor > 0) {
      double const rerun = o.recompute == recompute_kind::full ? 1.0 : 0.0;
      o.fwd_host_ns = static_cast<mock::sim_time>(std::llround(host_floor / 3 * o.layers * 1e9));
      o.bwd_host_ns = static_cast<mock::sim_time>(std::llround(host_floor * (2 + rerun) / 3 * o.layers * 1e9));
      o.fwd_ns = std::max(o.fwd_ns, o.fwd_host_ns);
      o.bwd_ns = std::max(o.bwd_ns, o.bwd_host_ns);
    }
  }
  return out;
}

/// One MoE layer's forward and backward per micro-batch (no recomputation), as the host issues it and
/// as the device runs it: its kernels (layer_op_times), its exposed tensor-parallel collectives and
/// its four expert all-to-alls.
struct moe_layer_pace {
  double host_ms = 0;   ///< moe_host_floor_s
  double device_ms = 0; ///< the kernels and the collectives
  [[nodiscard]] bool host_bound() const noexcept { return host_ms > device_ms; }
};

/// The pace of `s`'s MoE layers where the host bounds them at all (moe_host_floor_s > 0), else none.
inline std::optional<moe_layer_pace> moe_pace(scenario const& s) {
  double const host = moe_host_floor_s(s.model.moe);
  if (host <= 0) return std::nullopt;
  auto const ops = layer_op_times(s.model, s.parallel, s.device);
  auto const tp = tp_layer_comm(s, ops);
  auto const comm_ns = static_cast<double>(tp.fwd + tp.bwd + 2 * moe_layer_a2a_ns(s));
  return moe_layer_pace{host * 1e3, (ops.fwd() + ops.bwd()) * 1e3 + comm_ns * 1e-6};
}

/// The bytes a rank holds per element of its own weights: the parameter type, or 4 with parallel.fsdp
/// and an fp32 master. FSDP2 shards the fp32 parameters themselves, gathers them in the parameter type
/// for compute (MixedPrecisionPolicy's param_dtype) and AdamW updates the shard in place: the master
/// is the shard, with no 16-bit copy beside it (tests/python/dist/fsdp_worker.py checks both).
inline dtype held_weight_dtype(model_spec const& m, parallel_spec const& p) {
  return p.fsdp && m.fp32_master ? dtype::f32 : m.param_dtype;
}
inline std::uint64_t held_weight_bytes(model_spec const& m, parallel_spec const& p) {
  return size_of(held_weight_dtype(m, p));
}

/// Whether AdamW keeps an fp32 master beside the held weights: with fp32_master, unless the held
/// weights are the master (held_weight_dtype()).
inline bool optimizer_keeps_master(model_spec const& m, parallel_spec const& p) {
  return m.fp32_master && held_weight_dtype(m, p) != dtype::f32;
}

/// AdamW's state per element of a rank's shard, which optimizer swap moves: the two fp32 moments, and
/// the master where the optimizer keeps one (optimizer_keeps_master()): 12 or 8.
inline std::uint64_t optimizer_state_bytes_per_element(model_spec const& m, parallel_spec const& p) {
  return optimizer_keeps_master(m, p) ? 12 : 8;
}

/// Bytes per parameter kept on the device when nothing is swapped: weights (parameter type),
/// gradients (grad_dtype_of), and AdamW's fp32 moments and master copy, sharded over dp by the
/// distributed optimizer: 2 + 4 + 12/d for bf16 weights, fp32 gradients and an fp32 master
/// (Megatron-LM's distributed optimizer table; 2 + 2 + 12 = 16 with bf16 gradients, Rajbhandari et
/// al. 2020, "ZeRO", §3.1). Fractional with the distributed optimizer; with parallel.fsdp all of it
/// is sharded, and the fp32 master is the weight shard: (4 + 4 + 8)/d (held_weight_bytes()), with
/// what FSDP gathers (fsdp_gathered_bytes()) on top.
inline double state_bytes_per_param(model_spec const& m, parallel_spec const& p = {}) {
  double const state = static_cast<double>(optimizer_state_bytes_per_element(m, p));
  double const d = p.distributed_optimizer ? static_cast<double>(p.dp) : 1.0;
  double const held = static_cast<double>(held_weight_bytes(m, p) + size_of(grad_dtype_of(m)));
  if (p.fsdp) return (held + state) / d; // the shards; fsdp_gathered_bytes() comes on top
  return held + state / d;
}

/// The bytes FSDP holds gathered on a rank beside the shards (parallel.fsdp; 0 without), weights in
/// the parameter type, unsharded:
/// - without a pipeline (one pipeline rank, as fsdp_per_layer() says), the root unit (the tensors
///   outside the layers: embedding, final norm, output layer), gathered for the whole forward and
///   again for the backward, and two layers
///   (the one computing and the one prefetched), with their gradients in the parameter type as the
///   backward produces them (FSDP reduces each layer's right after its backward);
/// - with a pipeline, every tensor of the rank's stages with its gradient in grad_dtype_of: torchtitan
///   keeps a stage's weights gathered across its micro-batches (reshard_after_forward off) and FSDP
///   accumulates the unsharded gradients in the reduction's type until the last one.
inline std::uint64_t fsdp_gathered_bytes(scenario const& s, std::vector<stage_spec> const& rank_stages) {
  if (!s.parallel.fsdp) return 0;
  bool const pipelined = !fsdp_per_layer(s);
  std::uint64_t const e = size_of(s.model.param_dtype), per = e + (pipelined ? size_of(grad_dtype_of(s.model)) : e);
  std::uint64_t all = 0, root = 0, layer = 0;
  for (auto const& st : rank_stages) {
    auto const outside = root_params(st);
    all += st.params;
    root += outside;
    if (st.layers > 0) layer = std::max<std::uint64_t>(layer, (st.params - outside) / st.layers);
  }
  return per * (pipelined ? all : root + 2 * layer);
}

/// The elements of an `numel`-element tensor whose optimizer state one data-parallel rank holds:
/// numel, or its 1/dp share (rounded up) with the distributed optimizer.
/// A routed expert's tensor (`expert`) shards over the expert data-parallel group instead.
inline std::uint64_t optimizer_shard(std::uint64_t numel, parallel_spec const& p, bool expert = false) {
  if (!p.distributed_optimizer) return numel;
  return pipeswap::detail::ceil_div(numel, expert ? expert_dp_of(p) : std::uint64_t{p.dp});
}

/// The elements of a tensor's weights (and of its gradients) a rank holds apart from what FSDP
/// gathers: all of them, or with parallel.fsdp its optimizer_shard().
inline std::uint64_t held_elements(tensor_spec const& t, parallel_spec const& p) {
  return p.fsdp ? optimizer_shard(t.numel, p, t.expert) : t.numel;
}

/// The device bytes of a rank's weights and gradients, which stay on the device in every
/// configuration the simulator runs: held_elements() of each tensor of its stages and
/// fsdp_gathered_bytes().
inline std::uint64_t weight_and_gradient_bytes(scenario const& s, std::vector<stage_spec> const& rank_stages) {
  std::uint64_t const per = held_weight_bytes(s.model, s.parallel) + size_of(grad_dtype_of(s.model));
  std::uint64_t bytes = fsdp_gathered_bytes(s, rank_stages);
  for (auto const& st : rank_stages)
    for (auto const& t : st.tensors) bytes += per * held_elements(t, s.parallel);
  return bytes;
}

/// Narayanan et al. 2021's FLOPs per iteration (eq. 3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) with full
/// recomputation, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) without. B = global batch in sequences. For the
/// GPT shape; the simulator's FLOPs reduce to it (tests/sim/model_test.cpp).
inline double narayanan_flops(double B, double s, double l, double h, double V, bool recompute) {
  return recompute ? 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
                   : 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

/// Model FLOPs of one step (all devices, no recomputation counted): 3 × the forward FLOPs of every
/// stage on every device, × micro-batches × dp. What an end-to-end MFU divides by.
inline double model_flops_per_step(scenario const& s) {
  auto st = s;
  st.model.recompute = recompute_kind::none;
  double fwd = 0;
  for (auto const& x : plan_stages(st)) fwd += x.fwd_flops;
  return 3.0 * fwd * s.parallel.tp * s.pipeline.micro_batches * s.parallel.dp;
}

/// End-to-end MFU of a step of `step_ns`: model FLOPs / (step time · peak · devices).
inline double end_to_end_mfu(scenario const& s, mock::sim_time step_ns) {
  if (step_ns <= 0) return 0;
  return model_flops_per_step(s) /
         (static_cast<double>(step_ns) * 1e-9 * s.device.bf16_tflops * 1e12 * static_cast<double>(devices_of(s)));
}

/// Per pipeline rank, the host-link rates (GB/s) its copies get when the ranks with `swaps[r]` set
/// copy at once: min(device link, node.host_gbps / k) for a direction alone, that × duplex_factor
/// each way while both directions copy, where k is the number of the node's devices whose rank swaps
/// (devices are numbered tp, then dp, then pp, and node n holds devices n·gpus … n·gpus + gpus − 1; a
/// rank spanning nodes takes its most crowded). The simulated copies switch between the two as the
/// other direction starts and stops (mock::timing_model::duplex_factor).
struct link_rates {
  double h2d_gbps = 0, d2h_gbps = 0;             ///< each way, both directions busy
  double h2d_alone_gbps = 0, d2h_alone_gbps = 0; ///< one direction alone
  std::uint32_t sharing = 1;                     ///< k: devices sharing the node's host bandwidth
};
inline std::vector<link_rates> host_link_rates(scenario const& s, std::vector<bool> const& swaps) {
  auto const R = s.pipeline.ranks;
  std::uint64_t const per_rank = std::uint64_t{s.parallel.tp} * s.parallel.dp, gpus = s.node.gpus;
  std::uint64_t const total = per_rank * R, nodes = pipeswap::detail::ceil_div(total, gpus);
  auto swapping = [&](std::uint64_t g) { return g / per_rank < swaps.size() && swaps[g / per_rank]; };
  std::vector<std::uint32_t> crowd(nodes, 0);
  for (std::uint64_t g = 0; g < total; ++g)
    if (swapping(g)) ++crowd[g / gpus];
  std::vector<link_rates> out(R);
  for (std::uint32_t r = 0; r < R; ++r) {
    std::uint32_t k = 1;
    for (std::uint64_t n = r * per_rank / gpus; n <= ((r + 1) * per_rank - 1) / gpus; ++n) k = std::max(k, crowd[n]);
    double const host = s.node.host_gbps / k;
    auto const up = std::min(s.device.h2d_gbps, host), down = std::min(s.device.d2h_gbps, host);
    out[r] = {up * s.device.duplex_factor, down * s.device.duplex_factor, up, down, k};
  }
  return out;
}

/// The timing model of the device: each direction of the host link at its rate alone, shared by
/// duplex_factor while both copy. `link`: the rank's host-link rates (host_link_rates); unset: the
/// device's own, uncontended.
inline mock::timing_model timing_of(device_spec const& d, std::optional<link_rates> link = std::nullopt) {
  mock::timing_model t;
  double const up = link ? link->h2d_alone_gbps : d.h2d_gbps, down = link ? link->d2h_alone_gbps : d.d2h_gbps;
  t.duplex_factor = d.duplex_factor;
  t.h2d = {static_cast<std::uint64_t>(up * 1e9), static_cast<mock::sim_time>(d.copy_latency_us * 1e3)};
  t.d2h = {static_cast<std::uint64_t>(down * 1e9), static_cast<mock::sim_time>(d.copy_latency_us * 1e3)};
  t.device_bytes_per_second = static_cast<std::uint64_t>(d.hbm_tbps * 1e12);
  t.kernel_launch_ns = 4'000;
  return t;
}

} // namespace pipeswap::sim
