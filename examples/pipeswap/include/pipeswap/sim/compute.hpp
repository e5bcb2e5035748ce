// pipeswap — the simulator's compute model: the time of one layer's forward and backward kernels on
// one device, operation by operation. Every GEMM is timed from its shape (m, n, k) by a roofline of
// the device's peak rate at its precision and its HBM bandwidth, at an efficiency that rises with the
// GEMM's dimensions toward a ceiling (gemm_efficiency); flash attention by a roofline of its FLOPs
// (causal, with the backward's recomputation of the scores) and its bytes; norms, activations,
// residual adds, rotary embeddings, the MoE permutation and FP8 casts as memory-bound kernels.
// docs/simulator.md ("Compute") states every formula and constant and the calibration that fixed them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <pipeswap/core/dtype.hpp>
#include <pipeswap/sim/moe.hpp>
#include <pipeswap/sim/scenario.hpp>

namespace pipeswap::sim {

/// The model's constants that are not fitted (docs/simulator.md, "Compute", gives their sources).
/// The one fitted constant is the GEMM ceiling, device.kernel_efficiency (its default).
/// A GEMM dimension of this size runs at half the ceiling on that dimension's account (one tile of
/// 128 at 2/3): gemm_efficiency() = ceiling · Π x/(x + gemm_half_dim) over m, n and k.
inline constexpr double gemm_half_dim = 64;
/// The fraction of the HBM bandwidth streaming kernels (norms, activations, copies) reach.
inline constexpr double memory_efficiency = 0.8;
/// The fraction of the 16-bit peak flash attention reaches, forward and backward.
inline constexpr double attention_efficiency = 0.45;

/// The host's time (ms) to issue one MoE layer's forward and backward for a micro-batch, kernel by
/// kernel: **fitted** on the calibration set's host-bound MoE run (docs/simulator.md, "Calibration").
/// It does not scale with the tokens.
inline constexpr double moe_host_layer_ms = 8.8;

/// The floor that the host's issuing puts under one MoE layer's forward and backward per
/// micro-batch, in seconds: model.moe.host_layer_ms where set (0: a layer captured whole in a CUDA
/// graph), else moe_host_layer_ms. A host that takes longer to issue a layer's many small kernels
/// than the device takes to run them sets the layer's pace, whether or not the routing also makes it
/// wait on the token counts: the device cannot run kernels that have not been issued
/// (docs/simulator.md, "Mixture of experts").
inline double moe_host_floor_s(moe_spec const& e) {
  if (!e.enabled()) return 0;
  return (e.host_layer_ms ? *e.host_layer_ms : moe_host_layer_ms) * 1e-3;
}

/// The efficiency of an m×k by k×n GEMM: device.kernel_efficiency (the ceiling) times
/// x/(x + gemm_half_dim) for each of m, n and k. Large GEMMs approach the ceiling; narrow ones (a
/// small expert's few tokens, a thin projection) fall well below it.
inline double gemm_efficiency(double m, double n, double k, double ceiling) {
  auto g = [](double x) { return x / (x + gemm_half_dim); };
  return ceiling * g(m) * g(n) * g(k);
}

/// Bytes per element that the norms, the rotary embedding and SwiGLU's activation move in the forward,
/// with 16-bit activations of e bytes: fused (model.fused_kernels, one kernel each), or as eager
/// PyTorch's separate kernels, each reading and writing its whole tensor:
/// - RMSNorm: fused, read and write e; eager, cast to fp32 (e + 4), square (4 + 4), mean (read 4),
///   scale (4 + 4), cast back (4 + e), times the weight (e + e): 4e + 28;
/// - rotary embedding (per element of q and k): fused, read and write e; eager, cast to fp32 (e + 4),
///   the complex product (4 + 4), cast back (4 + e): 2e + 16;
/// - SwiGLU (per element of its output): fused, read gate and up, write the product, 3e; eager, SiLU
///   (e + e) then the product (2e + e): 5e.
/// GeLU, the residual adds, dropout and the MoE permutation are one kernel either way.
struct elementwise_bytes {
  double norm, rotary, swiglu;
};
inline constexpr elementwise_bytes elementwise_bytes_of(double e, bool fused) {
  return fused ? elementwise_bytes{2 * e, 2 * e, 3 * e} : elementwise_bytes{4 * e + 28, 2 * e + 16, 5 * e};
}

/// Peak FLOP/s at a precision: device.fp8_tflops for FP8, else device.bf16_tflops.
inline double peak_flops(device_spec const& d, precision p) {
  return (p == precision::fp8 ? d.fp8_tflops : d.bf16_tflops) * 1e12;
}

/// Seconds of an m×k by k×n GEMM at precision p with 16-bit results: the roofline
/// max(2·m·n·k / (peak · gemm_efficiency), bytes / (HBM · memory_efficiency)), bytes = the two
/// operands at the precision's element size (1 for FP8, 2 for BF16) and the 2-byte result.
/// device.compute "flops": 2·m·n·k / (bf16 peak · kernel_efficiency), the one-efficiency model.
inline double gemm_seconds(device_spec const& d, double m, double n, double k, precision p) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  double const flops = 2.0 * m * n * k;
  if (d.compute == compute_kind::flops) return flops / (d.bf16_tflops * 1e12 * d.kernel_efficiency);
  double const in = p == precision::fp8 ? 1.0 : 2.0;
  double const bytes = in * (m * k + k * n) + 2.0 * m * n;
  return std::max(flops / (peak_flops(d, p) * gemm_efficiency(m, n, k, d.kernel_efficiency)),
                  bytes / (d.hbm_tbps * 1e12 * memory_efficiency));
}

/// Seconds of a GEMM's forward (m, n, k), or of its backward: the input gradient (m, k, n) and the
/// weight gradient (k, n, m).
inline double gemm_fwd_seconds(device_spec const& d, double m, double n, double k, precision p) {
  return gemm_seconds(d, m, n, k, p);
}
inline double gemm_bwd_seconds(device_spec const& d, double m, double n, double k, precision p) {
  return gemm_seconds(d, m, k, n, p) + gemm_seconds(d, k, n, m, p);
}

/// Seconds of a memory-bound kernel moving `bytes`: bytes / (HBM · memory_efficiency); 0 with
/// device.compute "flops".
inline double memory_seconds(device_spec const& d, double bytes) {
  if (d.compute == compute_kind::flops || bytes <= 0) return 0;
  return bytes / (d.hbm_tbps * 1e12 * memory_efficiency);
}

/// One layer's (or the head's) kernel time per micro-batch on one device, by kind.
struct op_times {
  double gemm_fwd = 0, gemm_bwd = 0;           ///< the GEMMs
  double attention_fwd = 0, attention_bwd = 0; ///< the attention core (bwd: flash's recomputation included)
  double memory_fwd = 0, memory_bwd = 0;       ///< norms, activations, adds, rotary, permutation, casts
  /// What torchtitan's "op" policy (recompute_kind::op) re-runs in the backward: the k, output and up
  /// projections at model.precision and the forward's memory-bound kernels (dense SwiGLU layers).
  double op_recompute_fwd = 0;
  /// The GEMMs a tensor-parallel collective can hide under (tp_comm_overlap): the q/k/v projection
  /// (after the attention's all-gather), the output projection (before its reduce-scatter), the dense
  /// MLP's first and second GEMM (0 with MoE: the experts' GEMMs are not paired); forward, then the
  /// backward's two gradient GEMMs of each.
  std::array<double, 4> tp_paired_fwd{}, tp_paired_bwd{};
  [[nodiscard]] double fwd() const { return gemm_fwd + attention_fwd + memory_fwd; }
  [[nodiscard]] double bwd() const { return gemm_bwd + attention_bwd + memory_bwd; }
};

namespace detail {
/// Sums a layer's kernels into an op_times: each GEMM's forward and backward at its precision (with
/// an FP8 GEMM's cast-transposes: the forward reads its 16-bit input and writes it in FP8 and
/// transposed, e + 2 bytes per element of m×k; the backward the same for the output gradient, m×n)
/// and the bytes of the memory-bound kernels, which finish() times (the backward twice the forward's).
class kernel_sum {
public:
  kernel_sum(model_spec const& m, device_spec const& d) : m_(m), d_(d) {}

  /// An m×k by k×n GEMM at precision q, `count` times; `paired` >= 0 records it as the GEMM a
  /// tensor-parallel collective can hide under (op_times::tp_paired_fwd, _bwd).
  void gemm(double mm, double nn, double kk, precision q, double count = 1, int paired = -1) {
    double const f = count * gemm_fwd_seconds(d_, mm, nn, kk, q), g = count * gemm_bwd_seconds(d_, mm, nn, kk, q);
    o_.gemm_fwd += f;
    o_.gemm_bwd += g;
    if (paired >= 0)
      o_.tp_paired_fwd[static_cast<std::size_t>(paired)] = f, o_.tp_paired_bwd[static_cast<std::size_t>(paired)] = g;
    if (q == precision::fp8) cast_fwd_ += count * (e + 2) * mm * kk, cast_bwd_ += count * (e + 2) * mm * nn;
  }

  /// The MLP over `tokens` of width `width`, `count` times, at model.precision: SwiGLU (gate and up,
  /// down, the activation's elementwise_bytes_of() per output element) or GeLU (fc1, fc2, the
  /// activation reading and writing e per element); `paired`: the dense MLP, whose two GEMMs take
  /// the tensor-parallel collectives' slots 2 and 3.
  void mlp(double tokens, double width, double count = 1, bool paired = false) {
    double const h = double(m_.hidden);
    if (m_.mlp == mlp_kind::gelu) {
      gemm(tokens, width, h, m_.precision, count, paired ? 2 : -1);
      gemm(tokens, h, width, m_.precision, count, paired ? 3 : -1);
      bytes += count * 2 * e * tokens * width;
    } else {
      gemm(tokens, 2 * width, h, m_.precision, count, paired ? 2 : -1);
      gemm(tokens, h, width, m_.precision, count, paired ? 3 : -1);
      bytes += count * elementwise_bytes_of(e, m_.fused_kernels).swiglu * tokens * width;
    }
  }

  /// The sum, with the memory-bound kernels timed: `bytes` and the casts in the forward, twice
  /// `bytes` and the output gradients' casts in the backward.
  [[nodiscard]] op_times finish() const {
    op_times o = o_;
    o.memory_fwd = memory_seconds(d_, bytes + cast_fwd_);
    o.memory_bwd = memory_seconds(d_, 2 * bytes + cast_bwd_);
    return o;
  }

  static constexpr double e = 2.0; ///< bytes of a 16-bit activation element
  double bytes = 0;                ///< the memory-bound kernels' forward bytes

private:
  model_spec const& m_;
  device_spec const& d_;
  op_times o_;
  double cast_fwd_ = 0, cast_bwd_ = 0;
};
} // namespace detail

/// The MoE MLP of one layer per micro-batch on one device (sim/moe.hpp), without its all-to-alls
/// (moe_layer_a2a_ns): the router (T', E, h) in BF16, each of the device's E/ep experts on its
/// P/(E/ep) tokens at model.precision, the permutation and unpermutation (read and write e·P·h
/// each), the shared expert as a dense MLP over T tokens; the FP8 GEMMs' cast-transposes.
inline op_times moe_mlp_op_times(model_spec const& m, parallel_spec const& p, device_spec const& d) {
  detail::kernel_sum k(m, d);
  double const T = double(m.seq_len) * double(m.micro_batch_size), h = double(m.hidden);
  double const local = double(m.moe.experts / p.ep), P = double(moe_pairs_processed(m, p));
  k.gemm(double(moe_tokens_routed(m, p)), double(m.moe.experts), h, precision::bf16);
  k.mlp(P / local, double(m.moe.expert_ffn_hidden / expert_tp_of(p)), local);
  k.bytes += 2 * 2 * detail::kernel_sum::e * P * h;
  if (m.moe.shared_expert_ffn_hidden > 0) k.mlp(T, double(m.moe.shared_expert_ffn_hidden) / double(p.tp));
  return k.finish();
}

/// The kernels of one transformer layer per micro-batch on one device (T = s·b tokens, T' = T/t with
/// sequence parallelism, h' = a·d/t, kv' = kv_heads·d/t, f' = f/t, e = 2 bytes):
/// - GEMMs at model.precision: the fused q/k/v projection (T, h'+2kv', h), the output projection
///   (T, h, h'), the MLP (SwiGLU: gate and up (T, 2f', h), down (T, h, f'); GeLU: fc1 (T, f', h), fc2
///   (T, h, f')); with MoE the router (T', E, h) in BF16, each of the device's E/ep experts on its
///   P/(E/ep) tokens ((·, 2f_e/etp, h) and (·, h, f_e/etp) for SwiGLU) and the shared expert as a dense
///   MLP. Backward: both gradient GEMMs of each.
/// - Attention (16-bit): flash attention's forward 2·b·s²·h' FLOPs (causal: half of 4·b·s²·h'), its
///   backward 2.5× that (the scores recomputed, then four GEMMs), each against the bytes of Q, K, V, O
///   and their gradients; without flash attention the GEMMs of the scores (4·b·s²·h', none skipped)
///   and the softmax (and dropout) over the b·a'·s² scores as memory-bound kernels.
/// - Memory-bound kernels (16-bit; elementwise_bytes_of() gives the norm's, the rotary embedding's and
///   SwiGLU's bytes per element, fused or eager): two norms (fused: read and write e·T'·h each), two
///   residual adds (three e·T'·h), the rotary embedding of q and k (fused: read and write
///   e·T·(h'+kv')), the MLP's activation (SwiGLU fused: reads 2·e·T·f', writes e·T·f'; GeLU: reads
///   and writes e·T·f'), with dropout two
///   (2e + 1)·T'·h, with MoE the permutation and unpermutation (read and write e·P·h each) and the
///   experts' activation over P tokens. The backward moves twice the forward's bytes (it reads the
///   saved input and the incoming gradient and writes the outgoing one). With FP8, Transformer
///   Engine's cast-transpose of each FP8 GEMM's input in the forward (read e, write 2 bytes per
///   element of m×k) and of its output gradient in the backward (m×n).
/// Selective, full or "op" recomputation adds forward time to the backward in plan_stages().
inline op_times layer_op_times(model_spec const& m, parallel_spec const& p, device_spec const& d) {
  precision const pr = m.precision;
  double const t = p.tp, T = double(m.seq_len) * double(m.micro_batch_size);
  double const Tr = p.sequence_parallel ? T / t : T;
  double const h = double(m.hidden), hs = double(attention_width(m)) / t;
  double const kvs = double(head_dim_of(m)) * double(m.kv_heads) / t;
  double const e = detail::kernel_sum::e, b = double(m.micro_batch_size), s = double(m.seq_len),
               as = double(m.heads) / t;
  detail::kernel_sum k(m, d);
  auto const eb = elementwise_bytes_of(e, m.fused_kernels);
  k.gemm(T, hs + 2 * kvs, h, pr, 1, 0);
  k.gemm(T, h, hs, pr, 1, 1);
  k.bytes += 2 * eb.norm * Tr * h + 2 * 3 * e * Tr * h + eb.rotary * T * (hs + kvs);
  if (m.dropout) k.bytes += 2 * (2 * e + 1) * Tr * h;
  if (!m.moe.enabled()) k.mlp(T, double(m.ffn_hidden) / t, 1, true);
  op_times o = k.finish();
  if (m.moe.enabled()) {
    auto const x = moe_mlp_op_times(m, p, d);
    o.gemm_fwd += x.gemm_fwd, o.gemm_bwd += x.gemm_bwd;
    o.memory_fwd += x.memory_fwd, o.memory_bwd += x.memory_bwd;
  }
  if (!m.moe.enabled() && m.mlp == mlp_kind::swiglu)
    o.op_recompute_fwd = gemm_fwd_seconds(d, T, kvs, h, pr) + gemm_fwd_seconds(d, T, h, hs, pr) +
                         gemm_fwd_seconds(d, T, double(m.ffn_hidden) / t, h, pr) + o.memory_fwd;
  // The attention core.
  double const qkvo = e * T * (2 * hs + 2 * kvs);
  if (d.compute == compute_kind::flops) {
    double const flops = 4.0 * b * s * s * hs;
    o.attention_fwd = flops / (d.bf16_tflops * 1e12 * d.kernel_efficiency);
    o.attention_bwd = 2 * o.attention_fwd;
  } else if (m.flash_attention) {
    double const flops = 2.0 * b * s * s * hs, rate = d.bf16_tflops * 1e12 * attention_efficiency;
    o.attention_fwd = std::max(flops / rate, memory_seconds(d, qkvo));
    o.attention_bwd = std::max(2.5 * flops / rate, memory_seconds(d, 2 * qkvo));
  } else {
    double const scores = b * as * s * s, head_dim = double(head_dim_of(m));
    double const per_head = gemm_seconds(d, s, s, head_dim, precision::bf16) +
                            gemm_seconds(d, s, head_dim, s, precision::bf16); // scores, then over V
    double const smem = scores * (2 * e + (m.dropout ? 2 * e + 1 : 0));       // softmax (and dropout)
    o.attention_fwd = b * as * per_head + memory_seconds(d, smem);
    o.attention_bwd = 2 * b * as * per_head + memory_seconds(d, 2 * smem);
  }
  return o;
}

/// The last stage's head per micro-batch: the final norm (elementwise_bytes_of() per element of
/// e·T'·h), the output layer's GEMM (T, V/t, h) in BF16, the cross entropy over the fp32 logits
/// (write e, read e and write 4, read 4 per element of T·V/t); the backward twice the bytes.
inline op_times head_op_times(model_spec const& m, parallel_spec const& p, device_spec const& d) {
  op_times o;
  double const t = p.tp, T = double(m.seq_len) * double(m.micro_batch_size);
  double const Tr = p.sequence_parallel ? T / t : T, h = double(m.hidden);
  double const V = double((m.vocab + p.tp - 1) / p.tp);
  o.gemm_fwd = gemm_fwd_seconds(d, T, V, h, precision::bf16);
  o.gemm_bwd = gemm_bwd_seconds(d, T, V, h, precision::bf16);
  double const mem = elementwise_bytes_of(2, m.fused_kernels).norm * Tr * h + (2 + 2 + 4 + 4) * T * V;
  o.memory_fwd = memory_seconds(d, mem);
  o.memory_bwd = memory_seconds(d, 2 * mem);
  return o;
}

/// A device of the built-in table: its published dense peaks, memory and bandwidth.
struct device_preset {
  std::string_view name;
  double bf16_tflops, fp8_tflops, hbm_tbps;
  std::uint64_t memory_bytes;
  double nvlink_gbps; ///< NVLink one way at an assumed 80 %
};

/// The device table (docs/simulator.md, "Devices", cites each datasheet).
inline constexpr std::array<device_preset, 3> device_presets{{
    {"H100 SXM", 989, 1979, 3.35, 80'000'000'000, 360},
    {"H200", 989, 1979, 4.8, 141'000'000'000, 360},
    {"B200", 2250, 4500, 7.7, 180'000'000'000, 720},
}};

/// The table's entry named `name`, if any.
inline std::optional<device_preset> find_device_preset(std::string_view name) {
  for (auto const& x : device_presets)
    if (x.name == name) return x;
  return std::nullopt;
}

/// `d` with the preset's name, peaks, memory and NVLink rate.
inline device_spec with_preset(device_spec d, device_preset const& x) {
  d.name = std::string(x.name);
  d.bf16_tflops = x.bf16_tflops;
  d.fp8_tflops = x.fp8_tflops;
  d.hbm_tbps = x.hbm_tbps;
  d.memory_bytes = x.memory_bytes;
  d.nvlink_gbps = x.nvlink_gbps;
  return d;
}

} // namespace pipeswap::sim
