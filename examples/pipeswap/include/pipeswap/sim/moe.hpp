// pipeswap — the simulator's mixture-of-experts layer (Megatron-Core's MoELayer): its parameters on
// one device, the tokens its experts see, what its forward saves for the backward, its FLOPs and the
// all-to-all dispatch and combine of its tokens. sim/model.hpp calls these for a model with
// model.moe.experts > 0; docs/simulator.md ("Mixture of experts") states every formula.
//
// Parallelism (Megatron's "MoE parallel folding"): a pipeline rank's tp × dp devices run the
// attention as tp × dp and the experts as etp × ep × edp, with etp = parallel.expert_tp (unset: tp),
// ep = parallel.ep and the expert data-parallel degree edp = tp·dp / (etp·ep). A device holds E/ep
// of each layer's routed experts, each split over etp; the router (h×E) and the shared expert
// (split over tp, like a dense MLP) are dense parameters. With tp > 1 Megatron requires sequence
// parallelism with MoE, so a device routes T' = T/tp tokens of each micro-batch; with balanced
// routing its experts process P = top_k·T'·etp (token, expert) pairs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <pipeswap/core/dtype.hpp>
#include <pipeswap/sim/scenario.hpp>

namespace pipeswap::sim {

/// The expert tensor-parallel degree: parallel.expert_tp, else tp.
inline std::uint32_t expert_tp_of(parallel_spec const& p) { return p.expert_tp.value_or(p.tp); }

/// The expert data-parallel degree edp = tp·dp / (expert_tp·ep): the group over which an expert's
/// gradients are reduced and its optimizer state is sharded (validate() checks the division).
inline std::uint64_t expert_dp_of(parallel_spec const& p) {
  return std::uint64_t{p.tp} * p.dp / (std::uint64_t{expert_tp_of(p)} * p.ep);
}

/// Matrices per expert: 3 (SwiGLU: gate, up, down) or 2 (GeLU: fc1, fc2).
inline std::uint64_t expert_matrices(model_spec const& m) { return m.mlp == mlp_kind::gelu ? 2 : 3; }

/// The MLP tensors of one MoE layer on one device (attention and norms are the dense layer's):
/// the router h×E (whole on every device), the device's E/ep routed experts, each matrices·h·f_e/etp
/// (one tensor, `expert`), and the shared expert matrices·h·f_s/tp.
inline std::vector<tensor_spec> moe_layer_tensors(model_spec const& m, parallel_spec const& p,
                                                  std::string const& prefix) {
  auto const& e = m.moe;
  auto const h = m.hidden, n = expert_matrices(m);
  std::vector<tensor_spec> out;
  out.push_back({prefix + "mlp.router", h * e.experts, false});
  out.push_back(
      {prefix + "mlp.experts", e.experts / p.ep * n * h * (e.expert_ffn_hidden / expert_tp_of(p)), false, true});
  if (e.shared_expert_ffn_hidden > 0)
    out.push_back({prefix + "mlp.shared_expert", n * h * (e.shared_expert_ffn_hidden / p.tp)});
  return out;
}

/// Tokens of a micro-batch one device routes (T' = s·b/tp; sequence parallelism with tp > 1).
inline std::uint64_t moe_tokens_routed(model_spec const& m, parallel_spec const& p) {
  return m.seq_len * m.micro_batch_size / p.tp;
}

/// (token, expert) pairs a device's experts process per micro-batch with balanced routing:
/// P = top_k·T'·etp. The model FLOPs count these.
inline std::uint64_t moe_pairs(model_spec const& m, parallel_spec const& p) {
  return m.moe.top_k * moe_tokens_routed(m, p) * expert_tp_of(p);
}

/// The busiest device's processed pairs over P: dropless, moe.load_imbalance; with a capacity
/// factor c, c when padded to capacity, else min(c, load_imbalance) (an expert takes at most c × its
/// share).
inline double moe_load_factor(moe_spec const& e) {
  if (!e.capacity_factor) return e.load_imbalance;
  return e.pad_to_capacity ? *e.capacity_factor : std::min(*e.capacity_factor, e.load_imbalance);
}

/// (token, expert) pairs the busiest device's experts process per micro-batch: P ·
/// moe_load_factor, rounded up. Its experts' time, their activations and the all-to-alls scale with it.
inline std::uint64_t moe_pairs_processed(model_spec const& m, parallel_spec const& p) {
  return static_cast<std::uint64_t>(std::ceil(static_cast<double>(moe_pairs(m, p)) * moe_load_factor(m.moe)));
}

/// What the MoE MLP of one layer saves for its backward per micro-batch on one device, after
/// mlp_norm (whose input the dense table keeps), derived op by op as the dense table is (the method
/// of Korthikanti et al. 2022, §4: every tensor an operation keeps for its backward), for
/// Megatron-Core's MoE layer (router, token permutation, grouped experts, unpermutation), with x the
/// bytes per element a GEMM keeps of its input (gemm_saved_input_bytes: e, or 1 for Transformer
/// Engine's FP8 copy):
///   router: its input, the norm's output, e·T'·h (also the shared expert's first GEMM's input, which
///     Megatron-Core has keep that 16-bit tensor), and its fp32 routing probabilities 4·T'·E
///   experts (after the dispatch all-to-all): their input x·P·h; SwiGLU: gate and up outputs
///     2·e·P·f_e/etp, the permuted routing probabilities 4·P, down's input x·P·f_e/etp; GeLU: its
///     input and its output e·P·f_e/etp each, the probabilities 4·P, fc2's input x·P·f_e/etp
///   unpermutation: nothing. Since Megatron-Core 0.13 ("memory efficient token permutation") the
///     experts' activation multiplies by the routing probabilities (the fused weighted SwiGLU keeps
///     its input and the probabilities; GeLU's product keeps the GeLU's output), so unpermuting is a
///     pure permutation whose backward needs only indices
///   shared expert (SwiGLU): gate and up outputs 2·e·T·f_s/t, down's input x·T·f_s/t (GeLU: its
///     input e·T·f_s/t and fc2's input x·T·f_s/t)
///   with eager kernels (model.fused_kernels false), each SwiGLU's SiLU output as well (e·P·f_e/etp,
///     e·T·f_s/t), and the experts' product before the probabilities (e·P·f_e/etp)
/// No published closed form for MoE activations is used; this table is the model.
inline std::vector<saved_tensor> moe_layer_activations(model_spec const& m, parallel_spec const& p) {
  std::uint64_t const e = size_of(m.param_dtype), h = m.hidden, Tr = moe_tokens_routed(m, p),
                      P = moe_pairs_processed(m, p), x = gemm_saved_input_bytes(m);
  std::uint64_t const fe = m.moe.expert_ffn_hidden / expert_tp_of(p), T = m.seq_len * m.micro_batch_size;
  bool const eager = !m.fused_kernels;
  std::vector<saved_tensor> out{
      {"moe.router", "input (the norm's output)", e * Tr * h},
      {"moe.router", "routing probabilities (fp32)", 4 * Tr * m.moe.experts},
      {"moe.experts", "input (permuted tokens)", x * P * h},
  };
  if (m.mlp == mlp_kind::gelu) {
    out.push_back({"moe.experts", "GeLU input", e * P * fe});
    out.push_back({"moe.experts", "GeLU output (times the probabilities)", e * P * fe});
  } else {
    out.push_back({"moe.experts", "gate and up outputs", 2 * e * P * fe});
    if (eager) {
      out.push_back({"moe.experts", "SiLU output (eager)", e * P * fe});
      out.push_back({"moe.experts", "SwiGLU output before the probabilities (eager)", e * P * fe});
    }
  }
  out.push_back({"moe.experts", "routing probabilities, permuted (fp32)", 4 * P});
  out.push_back({"moe.experts", m.mlp == mlp_kind::gelu ? "fc2 input" : "down input", x * P * fe});
  if (auto const fs = m.moe.shared_expert_ffn_hidden / p.tp; fs > 0) {
    if (m.mlp == mlp_kind::gelu) {
      out.push_back({"moe.shared_expert", "GeLU input", e * T * fs});
      out.push_back({"moe.shared_expert", "fc2 input", x * T * fs});
    } else {
      out.push_back({"moe.shared_expert", "gate and up outputs", 2 * e * T * fs});
      if (eager) out.push_back({"moe.shared_expert", "SiLU output (eager)", e * T * fs});
      out.push_back({"moe.shared_expert", "down input", x * T * fs});
    }
  }
  return out;
}

/// Forward FLOPs of one MoE layer's router and routed experts per micro-batch on one device (the
/// shared expert is a dense matmul, counted with the layer's matrices): 2·T'·h·E for the router and
/// 2·P·matrices·h·f_e/etp = 2·top_k·T'·matrices·h·f_e for the experts.
inline double moe_layer_fwd_flops(model_spec const& m, parallel_spec const& p) {
  double const h = static_cast<double>(m.hidden), Tr = static_cast<double>(moe_tokens_routed(m, p));
  double const router = 2.0 * Tr * h * static_cast<double>(m.moe.experts);
  double const experts = 2.0 * static_cast<double>(moe_pairs(m, p)) * static_cast<double>(expert_matrices(m)) * h *
                         static_cast<double>(m.moe.expert_ffn_hidden / expert_tp_of(p));
  return router + experts;
}

/// Bytes of one all-to-all of a layer (dispatch or combine) at the busiest device: its top_k·T'
/// routed token copies of h elements, times moe_load_factor (what it receives beyond its share, or
/// the padding to capacity).
inline double moe_a2a_bytes(model_spec const& m, parallel_spec const& p) {
  return static_cast<double>(size_of(m.param_dtype) * m.moe.top_k * moe_tokens_routed(m, p) * m.hidden) *
         moe_load_factor(m.moe);
}

} // namespace pipeswap::sim
