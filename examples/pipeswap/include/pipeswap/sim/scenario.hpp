// pipeswap — the simulator's scenario: the model, its mixture-of-experts layers, the device, the node,
// the parallelism, the pipeline, the swap and planner settings, and the per-stage figures derived
// from them (stage_spec). Types only; sim/model.hpp derives the figures, docs/simulator.md states them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/core/dtype.hpp>

namespace pipeswap::sim {

/// The MLP of each layer.
enum class mlp_kind : std::uint8_t {
  swiglu, ///< Llama: gate and up (h×f each), SiLU(gate)·up, down (f×h)
  gelu,   ///< GPT: fc1 (h×f), GeLU, fc2 (f×h); f = 4h for GPT
};

/// Activation recomputation (Korthikanti et al. 2022).
/// The loss over the logits, as it holds memory.
enum class loss_kind : std::uint8_t {
  fused,   ///< Megatron's vocabulary-parallel cross entropy: the fp32 softmax saved, its gradient in place
  pytorch, ///< torch.nn.functional.cross_entropy on the logits cast to fp32 (torchtitan, Hugging Face)
};

enum class recompute_kind : std::uint8_t {
  none,
  selective, ///< the attention core (scores, softmax, dropout, attention over V) is recomputed
  full,      ///< only each layer's input is kept; the backward re-runs the layer's forward
  /// torchtitan's per-operation selective checkpointing (its "op" policy): each layer keeps its
  /// input, the outputs of every other matmul in forward order (q, v, gate, down) and the attention
  /// core's; the backward re-runs the rest of the layer's forward (the k, output and up projections,
  /// the norms, the rotary embedding, the activation). Dense SwiGLU layers with flash attention.
  op,
};

/// How the reports name a recomputation setting: "selective recomputation", "full recomputation",
/// "per-operation recomputation" (empty for none).
inline std::string recompute_title(recompute_kind k) {
  switch (k) {
  case recompute_kind::none: return {};
  case recompute_kind::selective: return "selective recomputation";
  case recompute_kind::full: return "full recomputation";
  case recompute_kind::op: return "per-operation recomputation";
  }
  return {};
}

/// The precision of the layers' GEMMs (model.precision). FP8 (Transformer Engine's recipe) covers the
/// attention projections and the MLP or experts, forward and backward; the output layer, the router,
/// the attention core and the memory-bound kernels stay 16-bit.
enum class precision : std::uint8_t { bf16, fp8 };

/// The library that runs the FP8 GEMMs (model.fp8_library), as it decides what each keeps for its
/// backward (model.hpp, gemm_saved_input_bytes).
enum class fp8_library_kind : std::uint8_t {
  /// Megatron-Core's: each FP8 GEMM keeps its input's FP8 copy, 1 byte per element (Transformer
  /// Engine's Linear, LayerNormLinear and GroupedLinear keep the column-wise FP8 data their weight
  /// gradient reads); Megatron-Core has the output projection and the shared expert's first GEMM keep
  /// their 16-bit input instead, which the attention core and the router keep anyway.
  transformer_engine,
  /// torchtitan's: torchao's Float8Linear keeps the 16-bit input and casts it again in the backward;
  /// an input that arrives already in FP8 (gathered in FP8 under tensor parallelism) it keeps as is.
  torchao,
};

/// How the simulator times compute (device.compute).
enum class compute_kind : std::uint8_t {
  roofline, ///< per operation: GEMMs by shape, attention and memory-bound kernels (sim/compute.hpp)
  flops,    ///< FLOPs / (bf16 peak · kernel_efficiency) for every kernel: the one-efficiency model
};

/// How a MoE layer's tokens travel to their experts' devices and back (model.moe.dispatch).
enum class moe_dispatch : std::uint8_t {
  /// Every routed copy of a token is its own message to its expert's device, over NVLink inside the
  /// node and over the network to other nodes (Megatron-Core's alltoall dispatcher, NCCL all-to-all).
  all_to_all,
  /// A token crosses the network once per node that holds any of its experts and is forwarded inside
  /// that node over NVLink (DeepEP and HybridEP, Megatron-Core's flex dispatcher: "removes redundant
  /// tokens during cross-node communication"; DeepSeek-V3 technical report, §3.2.2).
  per_node,
};

/// Mixture-of-experts MLPs (Megatron-Core's MoE layer): every layer's MLP is `experts` routed experts
/// of width `expert_ffn_hidden`, each token sent to `top_k` of them by a router (an h×E matrix), plus
/// optionally a shared expert of width `shared_expert_ffn_hidden` that every token passes.
struct moe_spec {
  std::uint64_t experts = 0; ///< 0: a dense MLP (model.ffn_hidden)
  std::uint64_t top_k = 1;
  std::uint64_t expert_ffn_hidden = 0;
  std::uint64_t shared_expert_ffn_hidden = 0; ///< 0: no shared expert
  /// Routing (docs/simulator.md, "Mixture of experts"). Unset: dropless (Megatron-Core's default),
  /// every routed token processed; set: each expert takes at most capacity_factor × its balanced
  /// share (Fedus et al. 2022, Switch Transformers, §2.2), the rest dropped.
  std::optional<double> capacity_factor;
  /// With a capacity factor: every expert's input padded to its capacity (Megatron's
  /// --moe-pad-expert-input-to-capacity), so the experts always process capacity_factor × the share.
  bool pad_to_capacity = false;
  /// The busiest device's routed (token, expert) pairs over the balanced share (1: balanced); the
  /// pipeline waits for the busiest device, whose experts' time and activations this scales.
  double load_imbalance = 1;
  /// The host's time to issue one layer's forward and backward for a micro-batch (ms), which bounds
  /// the layer's time from below (moe_host_floor_s, sim/compute.hpp). Unset: the fitted
  /// moe_host_layer_ms; set, this value (0: a layer the host does not issue kernel by kernel, as
  /// under a whole-layer CUDA graph, which needs every expert's input padded to its capacity).
  std::optional<double> host_layer_ms;
  /// How the tokens travel (moe_dispatch); it changes only what crosses the network.
  moe_dispatch dispatch = moe_dispatch::all_to_all;
  [[nodiscard]] bool enabled() const noexcept { return experts > 0; }
};

/// A decoder-only transformer (Llama-style by default: grouped-query attention, SwiGLU MLP, RMSNorm,
/// untied input and output embeddings, no biases).
struct model_spec {
  std::string name = "70B-class decoder";
  std::uint64_t layers = 80;
  std::uint64_t hidden = 8192;
  std::uint64_t ffn_hidden = 28672;
  std::uint64_t heads = 64;
  std::uint64_t kv_heads = 8;
  /// Width of one attention head; unset: hidden / heads (Qwen3 sets it apart: 32 heads of 128 on h 2048).
  std::optional<std::uint64_t> head_dim;
  std::uint64_t vocab = 32000;
  std::uint64_t seq_len = 4096;
  std::uint64_t micro_batch_size = 1;
  dtype param_dtype = dtype::bf16; ///< weights, and the 16-bit activations
  /// Gradient type; unset: F32 with fp32_master (Megatron's fp32 gradient accumulation), else the
  /// parameter type.
  std::optional<dtype> grad_dtype;
  /// AdamW with an fp32 master copy of each low-precision weight and fp32 moments.
  bool fp32_master = true;
  /// Attention without materialized score matrices (no 5·a·s/h term in the activation formula).
  bool flash_attention = true;
  mlp_kind mlp = mlp_kind::swiglu;
  /// Dropout after attention, after the MLP and on the embedding (1-byte masks are saved), and on the
  /// attention probabilities.
  bool dropout = false;
  recompute_kind recompute = recompute_kind::none;
  /// The GEMMs' precision: BF16, or FP8 for the layers' projections and MLPs (at device.fp8_tflops).
  sim::precision precision = sim::precision::bf16;
  /// With FP8, the library whose GEMMs keep their inputs for the backward: Transformer Engine's keep
  /// the FP8 copy, torchao's the input as it arrived (gemm_saved_input_bytes).
  fp8_library_kind fp8_library = fp8_library_kind::transformer_engine;
  /// The norms, the rotary embedding and SwiGLU's activation each run as one fused kernel (Transformer
  /// Engine, torch.compile). false: as eager PyTorch's separate elementwise kernels, which cast to fp32
  /// and back and save more for the backward (sim/compute.hpp, elementwise_bytes_of).
  bool fused_kernels = true;
  /// The loss: both keep 4 bytes per logit element for the backward; PyTorch's cross entropy holds 8
  /// more per element in its backward, 12 with tensor parallelism (DTensor's loss_parallel;
  /// model.hpp, head_backward_bytes).
  loss_kind loss = loss_kind::fused;
  /// Overrides the derived activations: saved bytes per layer per micro-batch (per device).
  std::optional<std::uint64_t> activation_bytes_per_layer;
  moe_spec moe;
};

/// Tensor, sequence and data parallelism. Every pipeline rank stands for tp × dp devices that run
/// the same stage on different shards; the simulator runs one of them.
struct parallel_spec {
  std::uint32_t tp = 1;           ///< tensor-parallel degree (Megatron column/row-parallel layers)
  bool sequence_parallel = false; ///< norms and dropout split along the sequence over the tp ranks
  /// With sequence parallelism, each column-parallel linear (q/k/v, gate/up or fc1, the output layer)
  /// keeps the all-gathered full-sequence input for its weight gradient, e·T·h, as PyTorch's DTensor
  /// tensor parallelism does (torchtitan); false (Megatron): it keeps its sequence shard e·T'·h and
  /// gathers it again in the backward, under the input gradient's GEMM. Dense layers only.
  bool save_gathered_inputs = false;
  std::uint32_t dp = 1; ///< data-parallel degree
  /// Megatron's distributed optimizer (ZeRO-1): master weights and moments sharded over dp.
  bool distributed_optimizer = false;
  /// FSDP (ZeRO-3, as torchtitan applies PyTorch's fully_shard): the weights and gradients sharded
  /// over dp as well, each gathered while it is used (weight_and_gradient_bytes() in sim/model.hpp).
  /// Needs distributed_optimizer, whose sharding of the optimizer state (and of the experts' over
  /// their data-parallel group) it shares.
  bool fsdp = false;
  /// Expert parallelism (MoE): the routed experts of a layer are split over `ep` devices. With
  /// `expert_tp` (unset: tp) they regroup the tp × dp devices of a pipeline rank as expert_tp × ep ×
  /// the expert data-parallel degree (Megatron's "MoE parallel folding"), over which the distributed
  /// optimizer shards the expert parameters' state.
  std::uint32_t ep = 1;
  std::optional<std::uint32_t> expert_tp;
  /// Communication overlapped with compute (Megatron's flags of the same names; docs/simulator.md,
  /// "Topology and communication"). Each is on by default, as in the recipes of the published runs.
  /// The gradients' reduce-scatter (all-reduce) of each stage starts with its last backward, bucket
  /// by bucket; off: it runs after the rank's last backward.
  bool overlap_grad_reduce = true;
  /// With the distributed optimizer, the weights' all-gather overlaps the next step's first forward,
  /// bucket by bucket; off: it runs after the optimizer step.
  bool overlap_param_gather = true;
  /// With sequence parallelism, each tensor-parallel all-gather or reduce-scatter overlaps the GEMM
  /// it feeds or follows (Transformer Engine's userbuffers); off, or without sequence parallelism,
  /// every tensor-parallel collective is exposed.
  bool tp_comm_overlap = true;
  /// In a combined forward-and-backward slot (pipeline.overlap_b_f), each half's expert all-to-alls
  /// run under the other half's compute; elsewhere they are exposed.
  bool overlap_moe_expert_parallel_comm = true;
};

/// One accelerator and its links.
struct device_spec {
  std::string name = "H200";
  std::uint64_t memory_bytes = 141'000'000'000;
  /// Memory the job cannot use: CUDA context, library workspaces, allocator fragmentation.
  std::uint64_t reserved_bytes = 6'000'000'000;
  double h2d_gbps = 55; ///< GB/s host → device (pinned), one GPU copying alone
  double d2h_gbps = 55; ///< GB/s device → host (pinned), one GPU copying alone
  /// Share of each direction's rate left when both directions copy at once.
  double duplex_factor = 0.7;
  double copy_latency_us = 2;
  double bf16_tflops = 989; ///< dense peak, 16-bit
  double fp8_tflops = 1979; ///< dense peak, FP8
  /// The compute model: per operation (roofline, the default) or FLOPs at one efficiency.
  compute_kind compute = compute_kind::roofline;
  /// The GEMM efficiency ceiling: the fraction of the peak the largest GEMMs reach while they run
  /// (smaller ones reach less, gemm_efficiency() in sim/compute.hpp); with compute "flops", the
  /// fraction every kernel reaches. Excludes the pipeline bubble, communication and swap stalls,
  /// which the simulator adds: this is not an end-to-end MFU. The default is fitted on the
  /// Megatron-Core runs of docs/simulator.md's calibration set; torchtitan's stack fits 0.47 there.
  double kernel_efficiency = 0.58;
  /// A published end-to-end MFU (model FLOPs over step time and peak, bubble included). When set,
  /// kernel_efficiency is derived so that the simulated no-swap step reaches it (calibrated()).
  std::optional<double> end_to_end_mfu;
  double hbm_tbps = 4.8; ///< memory bandwidth (optimizer kernels are bandwidth-bound)
  /// Pipeline send/recv bandwidth between neighbouring ranks in one node (one direction of one pair
  /// over NVLink); neighbours on two nodes use network_gbps and network_latency_us.
  double p2p_gbps = 100;
  double p2p_latency_us = 10;
  /// Bus bandwidth (NCCL's convention) of a collective among devices of one node: NVLink.
  double nvlink_gbps = 360;
  /// Each device's own network link (one NIC per GPU, as in a DGX or HGX node), one way.
  double network_gbps = 40;
  double nvlink_latency_us = 10;  ///< per collective inside a node
  double network_latency_us = 15; ///< added per collective (or send) that leaves the node
};

/// The host side of a node (or socket): its GPUs share its host bandwidth when they copy at once.
struct node_spec {
  std::uint32_t gpus = 8;
  double host_gbps = 278; ///< GB/s each way, all of the node's GPUs together
  /// GB/s of optimizer state the node's CPUs stream through a CPU Adam step (the CPU-step offload
  /// alternative, sim/alternatives.hpp), all of its GPUs' shares together.
  double cpu_adam_gbps = 59;
};

enum class schedule_kind : std::uint8_t { gpipe, one_f_one_b, interleaved };

struct pipeline_spec {
  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::uint32_t ranks = 8;           ///< pipeline ranks
  std::uint32_t micro_batches = 32;  ///< per optimizer step (per data-parallel replica)
  std::uint32_t stages_per_rank = 1; ///< stages per rank (interleaved only)
  bool overlap_b_f = false;          ///< interleaved: OVERLAP_B_F composites in the steady state
};

/// What the swapped configurations do.
struct swap_spec {
  std::uint32_t swap_times = 16; ///< optimizer batches per step
  bool packed = true;            ///< packed optimizer pipeline
  /// Overlapped swap (sim_options::overlap): steps simulated until periodic, the period reported; optimizer
  /// prefetch in the backward tail, offloads drained into the next forward, a resident share sized
  /// per rank from its free memory, activation loads launched early enough. false: the reference
  /// step, every optimizer copy inside it.
  bool overlap = true;
};

/// What the planner weighs besides the candidates' figures.
struct plan_spec {
  /// Plans whose step is within this fraction of the fastest count as equally fast; among them the
  /// planner takes the fewest host-link bytes, then (peaks within 0.05 GB counting as equal) the
  /// fewest changes of the scenario's own settings, then the lowest peak.
  double tolerance = 0.005;
};

struct scenario {
  /// Free text: where the configuration comes from (scenario files of published deployments cite
  /// their source here).
  std::string comment;
  model_spec model;
  device_spec device;
  node_spec node;
  parallel_spec parallel;
  pipeline_spec pipeline;
  swap_spec swap;
  plan_spec plan;
};

/// One parameter tensor of a stage, as one device holds it (its tensor-parallel shard).
struct tensor_spec {
  std::string name;
  std::uint64_t numel = 0;
  bool matmul = true; ///< a weight matrix (2 FLOPs per element per token); false: norms, embedding
  /// Routed experts (MoE): their optimizer state shards over the expert data-parallel group, and a
  /// token passes top_k of the layer's experts, not all.
  bool expert = false;
};

/// One tensor a forward saves for its backward (or a transient the backward needs).
struct saved_tensor {
  std::string op;   ///< the operation that saves it
  std::string what; ///< what it is
  std::uint64_t bytes = 0;
};

/// Everything the simulator needs about one pipeline stage.
struct stage_spec {
  std::uint32_t stage = 0;
  std::uint32_t first_layer = 0, layers = 0;
  bool embedding = false, head = false;
  recompute_kind recompute = recompute_kind::none;
  std::vector<tensor_spec> tensors;
  std::uint64_t params = 0;
  /// Bytes a micro-batch's forward saves for its backward on this stage.
  std::uint64_t activation_bytes = 0;
  /// Of those, the stage's input (received from the previous stage or the batch): the pipeline owns
  /// it until the backward, so it is never swapped.
  std::uint64_t boundary_bytes = 0;
  /// Bytes sent to the next stage per micro-batch (and gradients back).
  std::uint64_t p2p_bytes = 0;
  /// Full recomputation: one layer's activations, rebuilt in the backward while it runs.
  std::uint64_t backward_workspace_bytes = 0;
  mock::sim_time fwd_ns = 0, bwd_ns = 0; ///< per micro-batch, tensor-parallel collectives included
  double fwd_flops = 0, bwd_flops = 0;   ///< per micro-batch on one device (bwd: recomputation included)
  /// Of fwd_ns, bwd_ns: the exposed tensor-parallel collectives and the expert all-to-alls.
  mock::sim_time fwd_comm_ns = 0, bwd_comm_ns = 0;
  mock::sim_time fwd_a2a_ns = 0, bwd_a2a_ns = 0; ///< of fwd_comm_ns, bwd_comm_ns: the expert all-to-alls
  /// The host's time to issue the stage's forward (backward), below which fwd_ns (bwd_ns) never falls:
  /// 0 but for a mixture of experts, whose host issues each layer kernel by kernel (moe_host_floor_s).
  mock::sim_time fwd_host_ns = 0, bwd_host_ns = 0;
};

/// The gradient type: model.grad_dtype, else F32 with an fp32 master, else the parameter type.
inline dtype grad_dtype_of(model_spec const& m) {
  if (m.grad_dtype) return *m.grad_dtype;
  return m.fp32_master ? dtype::f32 : m.param_dtype;
}

/// The width of one attention head: model.head_dim, else hidden / heads.
inline std::uint64_t head_dim_of(model_spec const& m) { return m.head_dim.value_or(m.hidden / m.heads); }

/// The query (and attention output) width, heads × head_dim: the hidden size unless head_dim is set.
inline std::uint64_t attention_width(model_spec const& m) { return m.heads * head_dim_of(m); }

/// Bytes per element of the input a layer's GEMM keeps for its backward: with FP8 GEMMs, 1 (the FP8
/// copy) under Transformer Engine, and under torchao for a column-parallel linear's input with
/// tensor parallelism (`column_parallel_tp`: torchtitan's PrepareFloat8ModuleInput casts it to FP8
/// before the all-gather, and torchao keeps an input that arrives in FP8 as it came); else the
/// 16-bit activation's size (torchao keeps its 16-bit inputs; BF16 GEMMs keep theirs).
inline std::uint64_t gemm_saved_input_bytes(model_spec const& m, bool column_parallel_tp = false) {
  if (m.precision != precision::fp8) return size_of(m.param_dtype);
  return m.fp8_library == fp8_library_kind::transformer_engine || column_parallel_tp ? 1 : size_of(m.param_dtype);
}

/// Devices of the job: pipeline ranks × tp × dp.
inline std::uint64_t devices_of(scenario const& s) {
  return std::uint64_t{s.pipeline.ranks} * s.parallel.tp * s.parallel.dp;
}

} // namespace pipeswap::sim
