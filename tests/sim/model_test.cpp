// The simulator's model (sim/model.hpp) against the published formulas it reduces to: Korthikanti
// et al.'s per-layer activation bytes (every row, two shapes each), the distributed optimizer's
// 6 + 12/d bytes per parameter, Narayanan et al.'s FLOPs per iteration with and without
// recomputation, the 1F1B step (m + p − 1)·(t_f + t_b) on uniform stages; and the collectives and
// host-link sharing the simulator charges, each pinned to its formula in docs/simulator.md.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/pipeline.hpp>
#include <pipeswap/sim/report.hpp>
#include <pipeswap/sim/scenario_json.hpp>

#include "sim/tiny_scenario.hpp"

namespace sim = pipeswap::sim;
using sim::recompute_kind;

namespace {

/// Korthikanti et al.'s shape: GPT (GeLU MLP of width 4h, as many key/value heads as heads, dropout,
/// attention scores materialized, 16-bit activations).
struct gpt_shape {
  std::uint64_t h, a, s, b;
};
// Table 3 of the paper: 22B (h 6144, a 64) and 175B (h 12288, a 96), s = 2048; b differs to check
// that b scales every term.
constexpr gpt_shape shapes[] = {{6144, 64, 2048, 4}, {12288, 96, 2048, 1}, {4096, 32, 4096, 2}};

sim::model_spec gpt(gpt_shape const& g) {
  sim::model_spec m;
  m.hidden = g.h;
  m.ffn_hidden = 4 * g.h;
  m.heads = m.kv_heads = g.a;
  m.seq_len = g.s;
  m.micro_batch_size = g.b;
  m.mlp = sim::mlp_kind::gelu;
  m.dropout = true;
  m.flash_attention = false;
  m.vocab = 51200;
  return m;
}

std::uint64_t bytes(sim::model_spec const& m, std::uint32_t tp, bool sp, recompute_kind rc) {
  sim::parallel_spec p;
  p.tp = tp;
  p.sequence_parallel = sp;
  return sim::activation_bytes_per_layer(m, p, rc);
}

} // namespace

BOOST_AUTO_TEST_SUITE(sim_model)

// Every row of Korthikanti et al. 2022 (eq. 1 and 2, Table 2), in exact integers: s·b·h·k/t and
// 5·a·s²·b/t are whole numbers for these shapes.
BOOST_AUTO_TEST_CASE(activations_reduce_to_korthikanti_et_al) {
  for (auto const& g : shapes) {
    auto const m = gpt(g);
    std::uint64_t const sbh = g.s * g.b * g.h, scores = 5 * g.a * g.s * g.s * g.b;
    BOOST_TEST_CONTEXT("h " << g.h << ", a " << g.a << ", s " << g.s << ", b " << g.b) {
      // No parallelism: s·b·h·(34 + 5·a·s/h).
      BOOST_TEST(bytes(m, 1, false, recompute_kind::none) == 34 * sbh + scores);
      for (std::uint32_t t : {2u, 4u, 8u}) {
        BOOST_TEST_CONTEXT("t " << t) {
          // Tensor parallel: s·b·h·(10 + 24/t + 5·a·s/(h·t)).
          BOOST_TEST(bytes(m, t, false, recompute_kind::none) == 10 * sbh + 24 * sbh / t + scores / t);
          // Tensor and sequence parallel: s·b·h·(34/t + 5·a·s/(h·t)).
          BOOST_TEST(bytes(m, t, true, recompute_kind::none) == 34 * sbh / t + scores / t);
          // Selective recomputation with sequence parallelism: s·b·h·34/t.
          BOOST_TEST(bytes(m, t, true, recompute_kind::selective) == 34 * sbh / t);
          // Full recomputation: the layer input, 2·s·b·h (split along the sequence with sp).
          BOOST_TEST(bytes(m, t, false, recompute_kind::full) == 2 * sbh);
          BOOST_TEST(bytes(m, t, true, recompute_kind::full) == 2 * sbh / t);
        }
      }
      BOOST_TEST(bytes(m, 1, false, recompute_kind::selective) == 34 * sbh);
      BOOST_TEST(bytes(m, 1, false, recompute_kind::full) == 2 * sbh);
      // Flash attention: no score terms; it keeps its fp32 log-sum-exp (4 bytes per head and token).
      auto f = m;
      f.flash_attention = true;
      BOOST_TEST(bytes(f, 1, false, recompute_kind::none) == 34 * sbh + 4 * g.a * g.s * g.b);
      BOOST_TEST(bytes(f, 8, true, recompute_kind::none) == 34 * sbh / 8 + 4 * g.a * g.s * g.b / 8);
      BOOST_TEST(bytes(f, 8, true, recompute_kind::selective) == 34 * sbh / 8);
      // Without dropout the masks (attention 1, MLP 1, scores a·s/h) and the dropout output go.
      auto n = m;
      n.dropout = false;
      BOOST_TEST(bytes(n, 1, false, recompute_kind::none) == 32 * sbh + 2 * g.a * g.s * g.s * g.b);
    }
  }
}

// The Llama shape differs where the formula's 34 assumed GPT: SwiGLU keeps gate, up and their product
// (6·f/h), grouped-query attention keeps narrower K and V (4·kv/a), no dropout.
BOOST_AUTO_TEST_CASE(activations_follow_ffn_hidden_and_kv_heads) {
  sim::model_spec m; // 70B-class: h 8192, f 28672, a 64, kv 8, flash attention, no dropout
  std::uint64_t const T = m.seq_len * m.micro_batch_size, h = m.hidden;
  // 2 (attn_norm) + 2 (qkv input) + 2 (Q) + 2·2·h·kv/a (K, V) + 2 (flash output) + 2 (mlp_norm) + 2 (gate/up
  // input) + 3·2·f (gate, up outputs; down's input), all × T, plus the fp32 log-sum-exp 4·a·T.
  std::uint64_t const want = 2 * T * h * 6 + 4 * T * (h / 8) + 6 * T * m.ffn_hidden + 4 * m.heads * T;
  BOOST_TEST(sim::activation_bytes_per_layer(m) == want);
  BOOST_TEST(want == 1'125'122'048u); // 33.53·s·b·h: near the 34 only by coincidence
  auto g = m;
  g.ffn_hidden = 2 * m.ffn_hidden; // twice the MLP width: +6·T·f
  BOOST_TEST(sim::activation_bytes_per_layer(g) == want + 6 * T * m.ffn_hidden);
  auto k = m;
  k.kv_heads = 64; // full multi-head attention: K and V as wide as Q
  BOOST_TEST(sim::activation_bytes_per_layer(k) == want + 4 * T * (h - h / 8));
  // Every tensor is listed with its operation (docs/simulator.md shows the same table).
  auto const list = sim::layer_activations(m, {}, recompute_kind::none);
  BOOST_TEST(list.size() == 11u);
  for (auto const& x : list) BOOST_TEST(!x.op.empty());
}

// Eager kernels save more: each norm its input in fp32 and its normalized value before the weight,
// (4 + e)·T'·h in place of e·T'·h; SwiGLU its SiLU's output, e·T·f'; the rotary embedding nothing
// that scales with the tokens. Full and "op" recomputation save the same (the elementwise kernels are
// recomputed); a full recomputation's backward holds the eager layer whole.
BOOST_AUTO_TEST_CASE(eager_kernels_save_their_fp32_copies_and_the_silu_output) {
  for (std::uint32_t tp : {1u, 4u}) {
    sim::model_spec m; // 70B-class: h 8192, f 28672, a 64, kv 8
    sim::parallel_spec p;
    p.tp = tp;
    p.sequence_parallel = tp > 1;
    std::uint64_t const T = m.seq_len * m.micro_batch_size, Tr = T / tp, h = m.hidden, f = m.ffn_hidden / tp;
    auto const fused_none = sim::activation_bytes_per_layer(m, p, recompute_kind::none);
    auto const fused_sel = sim::activation_bytes_per_layer(m, p, recompute_kind::selective);
    auto const fused_head = sim::head_activations(m, p);
    auto eager = m;
    eager.fused_kernels = false;
    std::uint64_t const more = 2 * 4 * Tr * h + 2 * T * f;
    BOOST_TEST_CONTEXT("tp " << tp) {
      BOOST_TEST(sim::activation_bytes_per_layer(eager, p, recompute_kind::none) == fused_none + more);
      BOOST_TEST(sim::activation_bytes_per_layer(eager, p, recompute_kind::selective) == fused_sel + more);
      BOOST_TEST(sim::layer_activations(eager, p, recompute_kind::none).size() ==
                 sim::layer_activations(m, p, recompute_kind::none).size() + 1);
      for (auto rc : {recompute_kind::full, recompute_kind::op})
        BOOST_TEST(sim::activation_bytes_per_layer(eager, p, rc) == sim::activation_bytes_per_layer(m, p, rc));
      auto const head = sim::head_activations(eager, p);
      BOOST_TEST(head[0].bytes == fused_head[0].bytes + 4 * Tr * h);
      BOOST_TEST(head[2].bytes == fused_head[2].bytes);
    }
  }
  sim::scenario s;
  s.model.layers = 8;
  s.pipeline.ranks = 2;
  s.model.recompute = recompute_kind::full;
  auto const fused = sim::plan_stages(s);
  auto const fused_layer = sim::activation_bytes_per_layer(s.model, {}, recompute_kind::none);
  s.model.fused_kernels = false;
  auto const eager = sim::plan_stages(s);
  std::uint64_t const T = s.model.seq_len, h = s.model.hidden;
  BOOST_TEST(sim::activation_bytes_per_layer(s.model, {}, recompute_kind::none) - fused_layer ==
             2 * 4 * T * h + 2 * T * s.model.ffn_hidden);
  BOOST_TEST(eager[0].backward_workspace_bytes - fused[0].backward_workspace_bytes ==
             sim::activation_bytes_per_layer(s.model, {}, recompute_kind::none) - fused_layer);
  BOOST_TEST(eager[0].activation_bytes == fused[0].activation_bytes);
  BOOST_TEST(eager[0].bwd_ns > fused[0].bwd_ns);
}

// PyTorch's cross entropy (model.loss "pytorch") keeps the same 4 bytes per logit element as the fused
// one and holds 8 more in its backward, 12 with tensor parallelism (DTensor's loss_parallel on logits
// split over the vocabulary): the last stage's backward workspace is the larger of that and the
// layers' recomputation; the other stages and the saved bytes are unchanged.
BOOST_AUTO_TEST_CASE(pytorch_s_cross_entropy_holds_two_fp32_gradients_in_its_backward) {
  for (auto rc : {recompute_kind::none, recompute_kind::full}) {
    for (std::uint32_t tp : {1u, 4u}) {
      sim::scenario s;
      s.model.layers = 8;
      s.model.recompute = rc;
      s.pipeline.ranks = 2;
      s.parallel.tp = tp;
      auto const fused = sim::plan_stages(s);
      s.model.loss = sim::loss_kind::pytorch;
      auto const torch_loss = sim::plan_stages(s);
      std::uint64_t const logits = s.model.seq_len * (32000 / tp), per_logit = tp > 1 ? 12 : 8;
      BOOST_TEST_CONTEXT("recompute " << int(rc) << ", tp " << tp) {
        BOOST_TEST(sim::head_backward_bytes(s.model, s.parallel) == per_logit * logits);
        BOOST_TEST(torch_loss[1].backward_workspace_bytes ==
                   std::max<std::uint64_t>(fused[1].backward_workspace_bytes, per_logit * logits));
        BOOST_TEST(torch_loss[0].backward_workspace_bytes == fused[0].backward_workspace_bytes);
        BOOST_TEST(torch_loss[1].activation_bytes == fused[1].activation_bytes);
        BOOST_TEST(torch_loss[1].bwd_ns == fused[1].bwd_ns);
      }
    }
  }
  sim::scenario s;
  BOOST_TEST(sim::head_backward_bytes(s.model, s.parallel) == 0u); // Megatron's fused cross entropy
}

// PyTorch's DTensor tensor parallelism (parallel.save_gathered_inputs) keeps the gathered
// full-sequence input of each column-parallel linear: q/k/v and gate/up in a layer kept whole, the
// output layer on the last stage, e·(T − T')·h more each; a fully recomputed layer's backward holds
// the same two; the "op" policy's kept rows and a full recomputation's saved input do not change, and
// neither does the step time (the backward's re-gather is not charged either way).
BOOST_AUTO_TEST_CASE(dtensor_tensor_parallelism_saves_the_gathered_inputs_of_column_parallel_linears) {
  for (auto rc : {recompute_kind::none, recompute_kind::selective, recompute_kind::full, recompute_kind::op}) {
    for (auto mlp : {sim::mlp_kind::swiglu, sim::mlp_kind::gelu}) {
      if (rc == recompute_kind::op && mlp == sim::mlp_kind::gelu) continue;
      sim::scenario s;
      s.model.layers = 8;
      s.model.recompute = rc;
      s.model.mlp = mlp;
      s.pipeline.ranks = 2;
      s.parallel.tp = 4;
      s.parallel.sequence_parallel = true;
      auto const shard = sim::plan_stages(s);
      s.parallel.save_gathered_inputs = true;
      sim::validate(s);
      auto const gathered = sim::plan_stages(s);
      std::uint64_t const T = s.model.seq_len * s.model.micro_batch_size, h = s.model.hidden;
      std::uint64_t const more = 2 * (T - T / 4) * h; // one input, e = 2
      std::uint64_t const per_layer = rc == recompute_kind::none || rc == recompute_kind::selective ? 2 * more : 0;
      std::uint64_t const workspace = rc == recompute_kind::full || rc == recompute_kind::op ? 2 * more : 0;
      BOOST_TEST_CONTEXT("recompute " << int(rc) << ", mlp " << int(mlp)) {
        BOOST_TEST(gathered[0].activation_bytes - shard[0].activation_bytes == 4 * per_layer);
        BOOST_TEST(gathered[1].activation_bytes - shard[1].activation_bytes == 4 * per_layer + more);
        BOOST_TEST(gathered[0].backward_workspace_bytes - shard[0].backward_workspace_bytes == workspace);
        BOOST_TEST(gathered[1].backward_workspace_bytes - shard[1].backward_workspace_bytes == workspace);
        BOOST_TEST(gathered[0].fwd_ns == shard[0].fwd_ns);
        BOOST_TEST(gathered[1].bwd_ns == shard[1].bwd_ns);
      }
    }
  }
  sim::scenario s;
  s.parallel.tp = 4;
  s.parallel.save_gathered_inputs = true;
  BOOST_CHECK_EXCEPTION(sim::validate(s), pipeswap::invalid_argument, [](auto const& x) {
    return std::string_view(x.what()).find("parallel.save_gathered_inputs needs parallel.sequence_parallel") !=
           std::string_view::npos;
  });
  s.parallel.sequence_parallel = true;
  s.model.moe.experts = 8;
  s.model.moe.expert_ffn_hidden = 1024;
  BOOST_CHECK_EXCEPTION(sim::validate(s), pipeswap::invalid_argument, [](auto const& x) {
    return std::string_view(x.what()).find("parallel.save_gathered_inputs is modelled for dense layers") !=
           std::string_view::npos;
  });
}

// What an FP8 GEMM keeps of its input (model.fp8_library): Transformer Engine its FP8 copy, 1 byte
// per element, for q/k/v, gate/up (fc1) and down (fc2), the output projection keeping the flash
// output already counted; torchao its 16-bit input, except a column-parallel linear's under tensor
// parallelism, which torchtitan gathers in FP8. Row by row, e = 2, on both MLPs and with and without
// DTensor's gathered inputs; BF16 keeps 16 bits whatever the library; the step time is the same.
BOOST_AUTO_TEST_CASE(fp8_gemms_keep_their_inputs_as_their_library_does) {
  using lib = sim::fp8_library_kind;
  for (auto mlp : {sim::mlp_kind::swiglu, sim::mlp_kind::gelu}) {
    for (std::uint32_t t : {1u, 4u}) {
      for (bool gathered : {false, true}) {
        if (gathered && t == 1) continue;
        sim::scenario s;
        s.model.mlp = mlp;
        s.parallel.tp = t;
        s.parallel.sequence_parallel = t > 1;
        s.parallel.save_gathered_inputs = gathered;
        sim::validate(s);
        std::uint64_t const T = s.model.seq_len * s.model.micro_batch_size, h = s.model.hidden;
        std::uint64_t const Tg = gathered ? T : T / t, f = s.model.ffn_hidden / t;
        auto const bf16 = sim::activation_bytes_per_layer(s.model, s.parallel);
        auto at = [&](lib l) {
          auto m = s.model;
          m.precision = sim::precision::fp8;
          m.fp8_library = l;
          return sim::activation_bytes_per_layer(m, s.parallel);
        };
        auto with = [&](lib l) {
          auto m = s.model;
          m.fp8_library = l;
          return sim::activation_bytes_per_layer(m, s.parallel);
        };
        BOOST_TEST_CONTEXT("mlp " << int(mlp) << ", tp " << t << ", gathered " << gathered) {
          // the q/k/v and fc1 inputs (Tg·h each) and fc2's (T·f/t) at 1 byte in place of 2
          BOOST_TEST(bf16 - at(lib::transformer_engine) == 2 * Tg * h + T * f);
          BOOST_TEST(bf16 - at(lib::torchao) == (t > 1 ? 2 * Tg * h : 0));
          BOOST_TEST(with(lib::torchao) == bf16);
          BOOST_TEST(with(lib::transformer_engine) == bf16);
        }
        auto te = s;
        te.model.precision = sim::precision::fp8;
        auto ao = te;
        ao.model.fp8_library = lib::torchao;
        BOOST_TEST(sim::plan_stages(te)[0].fwd_ns == sim::plan_stages(ao)[0].fwd_ns);
      }
    }
  }
  // Without flash attention the output projection keeps its input too, as FP8 under Transformer Engine.
  sim::scenario s;
  s.model.flash_attention = false;
  auto fp8 = s.model;
  fp8.precision = sim::precision::fp8;
  std::uint64_t const T = s.model.seq_len * s.model.micro_batch_size, h = s.model.hidden;
  BOOST_TEST(sim::activation_bytes_per_layer(s.model, s.parallel) - sim::activation_bytes_per_layer(fp8, s.parallel) ==
             3 * T * h + T * s.model.ffn_hidden);
}

// torchtitan's per-operation policy ("op"): the layer keeps its input, every other matmul's output
// in forward order (q, v, gate, down) and the attention core's output and log-sum-exp; the backward
// re-runs the k, output and up projections and the memory-bound kernels.
BOOST_AUTO_TEST_CASE(the_per_operation_policy_keeps_every_other_matmul_and_recomputes_the_rest) {
  sim::model_spec m; // 70B-class: h 8192, f 28672, a 64, kv 8 (kv width h/8), flash attention
  std::uint64_t const T = m.seq_len * m.micro_batch_size, h = m.hidden, f = m.ffn_hidden, a = m.heads;
  // input, q, v, attention output, gate, down (16-bit) and the fp32 log-sum-exp
  std::uint64_t const want = 2 * T * (h + h + h / 8 + h + f + h) + 4 * a * T;
  BOOST_TEST(bytes(m, 1, false, recompute_kind::op) == want);
  BOOST_TEST(sim::layer_activations(m, {}, recompute_kind::op).size() == 7u);
  BOOST_TEST(bytes(m, 1, false, recompute_kind::op) < bytes(m, 1, false, recompute_kind::none));
  BOOST_TEST(bytes(m, 1, false, recompute_kind::op) > bytes(m, 1, false, recompute_kind::full));
  // tp 4 with sequence parallelism: the input and the reduce-scatter's output split along the
  // sequence, q, v, the attention and the gate along heads and width, the down projection's output
  // whole (partial sums before the reduction).
  std::uint64_t const want4 = 2 * (T / 4) * h * 2 + 2 * T * (h / 4 + h / 32 + h / 4 + f / 4 + h) + 4 * (a / 4) * T;
  BOOST_TEST(bytes(m, 4, true, recompute_kind::op) == want4);

  sim::scenario s;
  s.model.layers = 8;
  s.pipeline.ranks = 2;
  s.pipeline.micro_batches = 4;
  auto with = [&](recompute_kind rc) {
    auto t = s;
    t.model.recompute = rc;
    return sim::plan_stages(t);
  };
  auto const none = with(recompute_kind::none), op = with(recompute_kind::op);
  double const layers = 4, d = double(h), kv = d / 8, ff = double(f), tokens = double(T);
  // FLOPs: the three recomputed projections, 2·T·(kv·h + h·h + f·h) per layer.
  BOOST_TEST(op[0].bwd_flops - none[0].bwd_flops == 2 * tokens * (kv * d + d * d + ff * d) * layers,
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(op[0].fwd_flops == none[0].fwd_flops);
  // Time: those GEMMs at their shapes, and the forward's memory-bound kernels.
  auto const& dev = s.device;
  auto const lt = sim::layer_op_times(s.model, {}, dev);
  double const gemms = sim::gemm_fwd_seconds(dev, tokens, kv, d, s.model.precision) +
                       sim::gemm_fwd_seconds(dev, tokens, d, d, s.model.precision) +
                       sim::gemm_fwd_seconds(dev, tokens, ff, d, s.model.precision);
  BOOST_TEST(lt.op_recompute_fwd == gemms + lt.memory_fwd, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(lt.op_recompute_fwd < lt.fwd()); // less than a full recomputation
  BOOST_TEST(double(op[0].bwd_ns - none[0].bwd_ns) == (gemms + lt.memory_fwd) * layers * 1e9,
             boost::test_tools::tolerance(1e-6));
  // Its backward holds the tensors it recomputes beside the ones it kept.
  BOOST_TEST(op[0].backward_workspace_bytes ==
             bytes(s.model, 1, false, recompute_kind::none) - bytes(s.model, 1, false, recompute_kind::op));

  // The policy is modelled for dense SwiGLU layers with flash attention: anything else is refused.
  for (auto const& bad : {std::string("gelu"), std::string("no flash"), std::string("moe")}) {
    auto t = s;
    t.model.recompute = recompute_kind::op;
    if (bad == "gelu") t.model.mlp = sim::mlp_kind::gelu;
    if (bad == "no flash") t.model.flash_attention = false;
    if (bad == "moe") {
      t.model.moe.experts = 8;
      t.model.moe.expert_ffn_hidden = 1024;
    }
    BOOST_TEST_CONTEXT(bad) {
      try {
        (void)sim::plan_stages(t);
        BOOST_ERROR("accepted");
      } catch (pipeswap::invalid_argument const& e) {
        BOOST_TEST(std::string(e.what()).find("model.recompute \"op\"") != std::string::npos, e.what());
      }
      // per stage too, as the planner's per-rank mixes give it
      t.model.recompute = recompute_kind::none;
      try {
        (void)sim::plan_stages(t, {recompute_kind::none, recompute_kind::op});
        BOOST_ERROR("accepted per stage");
      } catch (pipeswap::invalid_argument const& e) {
        BOOST_TEST(std::string(e.what()).find("stage 1's recomputation \"op\"") != std::string::npos, e.what());
      }
    }
  }
}

// 2 + 4 + 12/d bytes per parameter for bf16 weights, fp32 gradients, fp32 master and Adam moments
// (Megatron-LM's distributed optimizer table), 4 + 12/d with bf16 gradients.
BOOST_AUTO_TEST_CASE(bytes_per_parameter_follow_the_distributed_optimizer_table) {
  sim::model_spec m;
  for (std::uint32_t d : {1u, 2u, 4u, 8u, 16u, 64u, 128u}) {
    sim::parallel_spec p;
    p.dp = d;
    p.distributed_optimizer = d > 1;
    BOOST_TEST(sim::state_bytes_per_param(m, p) == 6.0 + 12.0 / d);
    auto b = m;
    b.grad_dtype = pipeswap::dtype::bf16;
    BOOST_TEST(sim::state_bytes_per_param(b, p) == 4.0 + 12.0 / d);
    p.distributed_optimizer = false; // plain data parallelism replicates the state
    BOOST_TEST(sim::state_bytes_per_param(m, p) == 18.0);
  }
  BOOST_TEST(sim::state_bytes_per_param(sim::model_spec{}) == 18.0);
}

// The simulator holds exactly that: the tiny scenario with dp 4 and the distributed optimizer keeps
// 6 bytes per parameter plus 12 per element of its shards, and optimizer swap moves only the shards.
BOOST_AUTO_TEST_CASE(the_distributed_optimizer_shards_what_the_rank_holds_and_swaps) {
  auto s = pipeswap::test::tiny();
  s.parallel.dp = 4;
  s.parallel.distributed_optimizer = true;
  std::uint64_t shards = 0, swapped = 0;
  auto const stages = sim::plan_stages(s); // a range-for over a temporary's member would dangle
  for (auto const& t : stages[0].tensors) {
    shards += (t.numel + 3) / 4;
    if (t.numel >= 1024) swapped += (t.numel + 3) / 4; // smaller tensors stay (swap_config::min_swap_numel)
  }
  sim::sim_options o;
  auto const plain = sim::simulate(s, o).ranks.at(0);
  BOOST_TEST(plain.resident_param_bytes == 6 * pipeswap::test::P);
  BOOST_TEST(plain.optimizer_state_bytes == 12 * shards);
  o.swap_optimizer = true;
  auto const sw = sim::simulate(s, o).ranks.at(0);
  BOOST_TEST(sw.h2d_bytes == 12 * swapped);
  BOOST_TEST(sw.d2h_bytes == 12 * swapped);
}

// FSDP (parallel.fsdp) shards the weights and gradients as well, and its fp32 weight shard is the
// master: the tiny scenario with dp 4 holds 4 + 4 bytes per element of its shards and 8 of optimizer
// state (the moments; 12 with the distributed optimizer alone), plus what FSDP gathers: without a
// pipeline the root unit (the embedding, the final norm, the output layer) and two layers,
// unsharded, their gradients in the weights' type (2 + 2 bytes); with a pipeline every tensor of the
// rank's stages, its gradient in fp32 (2 + 4). The peak falls by the difference, byte for byte.
BOOST_AUTO_TEST_CASE(fsdp_shards_the_weights_and_gradients_and_holds_what_it_gathers) {
  auto s = pipeswap::test::tiny();
  s.model.layers = 4;
  s.parallel.dp = 4;
  s.parallel.distributed_optimizer = true;
  auto f = s;
  f.parallel.fsdp = true;
  auto const stages = sim::plan_stages(f);
  std::uint64_t shards = 0, root = 0, layers = 0;
  for (auto const& t : stages[0].tensors) {
    shards += (t.numel + 3) / 4;
    (t.name.starts_with("layers.") ? layers : root) += t.numel;
  }
  BOOST_TEST(root == 128u * 64 + 64 + 128 * 64); // embedding, final norm, output layer
  BOOST_TEST(sim::fsdp_gathered_bytes(f, stages) == 4 * (root + 2 * (layers / 4)));
  BOOST_TEST(sim::fsdp_gathered_bytes(s, stages) == 0u);
  BOOST_TEST(sim::weight_and_gradient_bytes(f, stages) == 8 * shards + 4 * (root + 2 * (layers / 4)));
  BOOST_TEST(sim::weight_and_gradient_bytes(s, stages) == 6 * stages[0].params);
  BOOST_TEST(sim::state_bytes_per_param(f.model, f.parallel) == 16.0 / 4);
  BOOST_TEST(sim::held_weight_bytes(f.model, f.parallel) == 4u);
  BOOST_TEST(sim::optimizer_state_bytes_per_element(f.model, f.parallel) == 8u);

  sim::sim_options o;
  auto const plain = sim::simulate(s, o).ranks.at(0), sharded = sim::simulate(f, o).ranks.at(0);
  BOOST_TEST(sharded.resident_param_bytes == sim::weight_and_gradient_bytes(f, stages));
  BOOST_TEST(plain.optimizer_state_bytes == 12 * shards);
  BOOST_TEST(sharded.optimizer_state_bytes == 8 * shards);
  BOOST_TEST(plain.peak_bytes - sharded.peak_bytes == plain.resident_param_bytes - sharded.resident_param_bytes +
                                                          plain.optimizer_state_bytes - sharded.optimizer_state_bytes);
  // Optimizer swap moves the moments only: the fp32 shard stays, as FSDP gathers it every step.
  o.swap_optimizer = true;
  std::uint64_t swapped = 0;
  for (auto const& t : stages[0].tensors)
    if (t.numel >= 1024) swapped += (t.numel + 3) / 4;
  auto const sw = sim::simulate(f, o).ranks.at(0);
  BOOST_TEST(sw.h2d_bytes == 8 * swapped);
  BOOST_TEST(sw.resident_param_bytes == sharded.resident_param_bytes);
  o.swap_optimizer = false;
  BOOST_TEST(sim::unswappable_bytes(f, 0) == f.device.reserved_bytes + sim::weight_and_gradient_bytes(f, stages));

  // With a pipeline the stage stays gathered through the step: its shards come on top.
  auto pp = f;
  pp.pipeline.ranks = 2;
  auto const two = sim::plan_stages(pp);
  std::uint64_t shards0 = 0;
  for (auto const& t : two[0].tensors) shards0 += (t.numel + 3) / 4;
  BOOST_TEST(sim::fsdp_gathered_bytes(pp, {two[0]}) == 6 * two[0].params);
  BOOST_TEST(sim::simulate(pp, o).ranks.at(0).resident_param_bytes == 6 * two[0].params + 8 * shards0);

  // One pipeline rank with two interleaved stages is FSDP without a pipeline, as its communication
  // (fsdp_per_layer) is: the root unit and two layers gathered, not every tensor.
  auto one = f;
  one.pipeline.schedule = sim::schedule_kind::interleaved;
  one.pipeline.stages_per_rank = 2;
  sim::validate(one);
  BOOST_TEST(sim::fsdp_per_layer(one));
  auto const halves = sim::plan_stages(one);
  BOOST_TEST(sim::fsdp_gathered_bytes(one, halves) == 4 * (root + 2 * (layers / 4)));
}

// Narayanan et al. 2021, eq. 3: FLOPs per iteration 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) with full
// recomputation, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) without; the simulator's stage FLOPs summed
// over stages, tensor-parallel shards and micro-batches give exactly that.
BOOST_AUTO_TEST_CASE(flops_reduce_to_narayanan_et_al) {
  for (auto const& g : shapes) {
    for (std::uint32_t tp : {1u, 4u}) {
      sim::scenario s;
      s.model = gpt(g);
      s.model.layers = 24;
      s.model.vocab = 51200;
      s.parallel.tp = tp;
      s.pipeline.ranks = 4;
      s.pipeline.micro_batches = 8;
      double const B = double(s.pipeline.micro_batches * g.b);
      auto sum = [&](recompute_kind rc) {
        auto t = s;
        t.model.recompute = rc;
        double f = 0;
        for (auto const& st : sim::plan_stages(t)) f += (st.fwd_flops + st.bwd_flops) * tp * s.pipeline.micro_batches;
        return f;
      };
      double const l = 24, V = 51200, h = double(g.h), sq = double(g.s);
      BOOST_TEST_CONTEXT("h " << g.h << ", tp " << tp) {
        BOOST_TEST(sum(recompute_kind::none) == sim::narayanan_flops(B, sq, l, h, V, false),
                   boost::test_tools::tolerance(1e-12));
        BOOST_TEST(sum(recompute_kind::full) == sim::narayanan_flops(B, sq, l, h, V, true),
                   boost::test_tools::tolerance(1e-12));
        // The formulas themselves, expanded: 72Bslh² + 12Bs²lh + 6BshV and 96Bslh² + 16Bs²lh + 6BshV.
        BOOST_TEST(sim::narayanan_flops(B, sq, l, h, V, false) ==
                       72 * B * sq * l * h * h + 12 * B * sq * sq * l * h + 6 * B * sq * h * V,
                   boost::test_tools::tolerance(1e-12));
        BOOST_TEST(sim::model_flops_per_step(s) == sim::narayanan_flops(B, sq, l, h, V, false),
                   boost::test_tools::tolerance(1e-12));
        // Selective recomputation adds the attention core's forward: 4·B·s²·h per layer.
        BOOST_TEST(sum(recompute_kind::selective) - sum(recompute_kind::none) == 4 * B * sq * sq * h * l,
                   boost::test_tools::tolerance(1e-9));
      }
    }
  }
}

// The embedding is a lookup: its size changes no FLOP count; the output layer's does.
BOOST_AUTO_TEST_CASE(the_embedding_is_not_charged_as_a_matmul) {
  sim::scenario s;
  auto const a = sim::plan_stages(s);
  s.model.vocab *= 2;
  auto const b = sim::plan_stages(s);
  BOOST_TEST(a.front().fwd_flops == b.front().fwd_flops);
  BOOST_TEST(b.back().fwd_flops - a.back().fwd_flops == 2.0 * 32000 * 8192 * 4096, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(b.front().params - a.front().params == 32000u * 8192u);
}

// Tensor parallelism splits every matrix (q, k, v, o, the MLP, the vocabulary of the embedding and
// the head) and keeps the norms whole; the last stage keeps the fp32 softmax of its vocabulary shard.
BOOST_AUTO_TEST_CASE(tensor_parallelism_shards_the_matrices_and_the_logits) {
  sim::scenario s;
  s.parallel.tp = 8;
  auto const st = sim::plan_stages(s);
  std::uint64_t const h = 8192, f = 28672, kv = 1024;
  std::uint64_t const layer = (2 * h * h + 2 * h * kv + 3 * h * f) / 8 + 2 * h;
  BOOST_TEST(st.front().params == 32000 / 8 * h + 10 * layer);
  BOOST_TEST(st.back().params == 10 * layer + h + 32000 / 8 * h);
  sim::parallel_spec p;
  p.tp = 8;
  auto const head = sim::head_activations(s.model, p);
  BOOST_TEST(head.back().bytes == 4u * 4096 * 4000);
  // The last stage saves them with its layers.
  BOOST_TEST(st.back().activation_bytes - st.front().activation_bytes == head[0].bytes + head[1].bytes + head[2].bytes);
}

// Tensor-parallel collectives: two all-reduces of e·T·h per layer each way (2·(t−1)/t·bytes over the
// bus bandwidth, plus a latency each); with sequence parallelism two all-gathers and two
// reduce-scatters, the same bytes (the all-gathers half of them with FP8), each hidden under its
// paired GEMM with tp_comm_overlap (what exceeds the GEMM, at least 1/t of it, delays the layer). A
// full recomputation runs the forward's again in the backward.
BOOST_AUTO_TEST_CASE(tensor_parallel_collectives_are_charged_on_nvlink) {
  sim::scenario s;
  s.parallel.tp = 4;
  double const bytes = 2.0 * 4096 * 8192;
  auto const ar = static_cast<std::int64_t>(std::llround(10e3 + 2 * 0.75 * bytes / 360e9 * 1e9));
  auto const tp = sim::tp_span(s);
  BOOST_TEST(tp.in_node());
  BOOST_TEST(sim::collective_ns(sim::collective::all_reduce, bytes, tp, s.device) == ar);
  auto const ops = sim::layer_op_times(s.model, s.parallel, s.device);
  BOOST_TEST(sim::tp_layer_comm(s, ops).fwd == 2 * ar);
  BOOST_TEST(sim::tp_layer_comm(s, ops).bwd == 2 * ar);
  auto const st = sim::plan_stages(s).front();
  BOOST_TEST(st.fwd_comm_ns == 10 * 2 * ar);
  BOOST_TEST(st.bwd_comm_ns == 10 * 2 * ar);
  // The kernels: ten layers' op times (sim/compute.hpp), then the collectives.
  BOOST_TEST(st.fwd_ns == std::llround(10 * ops.fwd() * 1e9) + st.fwd_comm_ns);
  BOOST_TEST(st.bwd_ns == std::llround(10 * ops.bwd() * 1e9) + st.bwd_comm_ns);
  s.parallel.sequence_parallel = true;
  auto const ag = sim::collective_ns(sim::collective::all_gather, bytes, tp, s.device);
  auto const sp_ops = sim::layer_op_times(s.model, s.parallel, s.device);
  auto exposed = [&](std::array<double, 4> const& gemms) {
    std::int64_t t = 0;
    for (double const g : gemms)
      t += std::max<std::int64_t>(ag / 4, ag - std::min<std::int64_t>(ag, std::llround(g * 1e9)));
    return t;
  };
  // Every paired GEMM is there (the dense MLP's too).
  for (double const g : sp_ops.tp_paired_fwd) BOOST_TEST(g > 0);
  auto const hidden = sim::tp_layer_comm(s, sp_ops);
  BOOST_TEST(hidden.fwd == exposed(sp_ops.tp_paired_fwd));
  BOOST_TEST(hidden.bwd == exposed(sp_ops.tp_paired_bwd));
  BOOST_TEST(hidden.fwd < 4 * ag);
  BOOST_TEST(hidden.bwd <= hidden.fwd); // the backward's GEMMs are longer
  s.model.recompute = recompute_kind::full;
  BOOST_TEST(sim::plan_stages(s).front().bwd_comm_ns == 10 * (hidden.fwd + hidden.bwd));
  s.parallel.tp_comm_overlap = false;
  BOOST_TEST(sim::tp_layer_comm(s, sp_ops).fwd == 4 * ag);
  BOOST_TEST(sim::plan_stages(s).front().bwd_comm_ns == 2 * 10 * 4 * ag);
  // With FP8 GEMMs the all-gathers move 1 byte per element (the forward's inputs, the backward's
  // output gradients), the reduce-scatters 2; a MoE layer's all-gather before its router stays 16-bit.
  auto const ag8 = sim::collective_ns(sim::collective::all_gather, bytes / 2, tp, s.device);
  BOOST_TEST(ag8 < ag);
  s.model.precision = sim::precision::fp8;
  auto const fp8_ops = sim::layer_op_times(s.model, s.parallel, s.device);
  BOOST_TEST(sim::tp_layer_comm(s, fp8_ops).fwd == 2 * ag8 + 2 * ag);
  BOOST_TEST(sim::tp_layer_comm(s, fp8_ops).bwd == 2 * ag8 + 2 * ag);
  s.model.moe.experts = 8;
  s.model.moe.expert_ffn_hidden = 1024;
  auto const moe_ops = sim::layer_op_times(s.model, s.parallel, s.device);
  // expert_tp unset is tp: its gather and scatter (tests/sim/moe_test.cpp) come on top, exposed
  auto const etp = sim::moe_expert_tp_comm_ns(s);
  BOOST_TEST(etp > 0);
  BOOST_TEST(sim::tp_layer_comm(s, moe_ops).fwd == ag8 + 3 * ag + etp);
  BOOST_TEST(sim::tp_layer_comm(s, moe_ops).bwd == ag8 + 3 * ag + etp);
  s.model = {};
  s.parallel = {};
  BOOST_TEST(sim::tp_layer_comm(s, ops).fwd == 0);
}

// The topology: devices numbered tp, then dp, then pp, node.gpus to a node. A group's devices on one
// node, the nodes it spans, the ring's bus bandwidth (NVLink inside a node, per_node NICs across) and
// its latency.
BOOST_AUTO_TEST_CASE(groups_are_placed_in_megatron_order) {
  sim::scenario s;
  s.node.gpus = 8;
  s.pipeline.ranks = 4;
  s.parallel.tp = 4;
  s.parallel.dp = 4;
  auto const dp = sim::dp_span(s); // stride 4: two of the four on each of two nodes
  BOOST_TEST(dp.per_node == 2u);
  BOOST_TEST(dp.nodes == 2u);
  BOOST_TEST(sim::ring_gbps(dp, s.device) == 2 * 40.0);
  BOOST_TEST(sim::group_latency_us(dp, s.device) == s.device.network_latency_us);
  auto const pp = sim::pp_span(s); // stride 16: one per node
  BOOST_TEST(pp.per_node == 1u);
  BOOST_TEST(pp.nodes == 4u);
  BOOST_TEST(sim::p2p_crosses_nodes(s, 0, 1));
  s.parallel.tp = 1;
  s.parallel.dp = 2; // stride 2: ranks 0..3 of the pipeline on the first node
  BOOST_TEST(!sim::p2p_crosses_nodes(s, 0, 1));
  BOOST_TEST(!sim::p2p_crosses_nodes(s, 2, 3));
  BOOST_TEST(sim::p2p_crosses_nodes(s, 3, 0) == false);
  s.pipeline.ranks = 8;
  BOOST_TEST(sim::p2p_crosses_nodes(s, 3, 4));
  BOOST_TEST(sim::dp_span(s).in_node());
  BOOST_TEST(sim::ring_gbps(sim::dp_span(s), s.device) == s.device.nvlink_gbps);
  // Eight per node over many nodes: the ring's traffic leaves through eight NICs, NVLink the cap.
  auto const wide = sim::span_of(1, 64, 8);
  BOOST_TEST(wide.per_node == 8u);
  BOOST_TEST(wide.nodes == 8u);
  BOOST_TEST(sim::ring_gbps(wide, s.device) == std::min(360.0, 8 * 40.0));
  s.device.network_gbps = 50;
  BOOST_TEST(sim::ring_gbps(wide, s.device) == 360.0);
  // A ring of n: 2·(n−1)/n·bytes for an all-reduce, (n−1)/n for the others, plus its latency.
  double const bytes = 1e9;
  BOOST_TEST(sim::collective_ns(sim::collective::reduce_scatter, bytes, dp, s.device) ==
             std::llround(s.device.network_latency_us * 1e3 + 0.75 * bytes / (2 * 50e9) * 1e9));
  BOOST_TEST(sim::collective_ns(sim::collective::all_reduce, bytes, sim::span_of(1, 1, 8), s.device) == 0);
}

// Expert parallelism: a device sends 1/ep of its tokens' bytes to each peer, over NVLink to the peers
// of its node and over its NIC to the others at once; the slower of the two decides.
BOOST_AUTO_TEST_CASE(expert_all_to_alls_split_between_nvlink_and_the_network) {
  sim::scenario s;
  s.model.moe.experts = 8;
  s.model.moe.top_k = 2;
  s.model.moe.expert_ffn_hidden = 1024;
  s.model.layers = 8;
  s.pipeline.ranks = 1;
  s.node.gpus = 4;
  s.parallel.dp = 8;
  s.parallel.ep = 8;
  s.parallel.distributed_optimizer = true;
  auto const g = sim::ep_span(s);
  BOOST_TEST(g.per_node == 4u);
  BOOST_TEST(g.nodes == 2u);
  double const bytes = sim::moe_a2a_bytes(s.model, s.parallel);
  auto const one =
      std::llround(s.device.network_latency_us * 1e3 + std::max(3 * bytes / 8 / 360e9, 4 * bytes / 8 / 40e9) * 1e9);
  BOOST_TEST(sim::moe_layer_a2a_ns(s) == 2 * one);
  s.node.gpus = 8; // in one node: NVLink only
  auto const in = std::llround(s.device.nvlink_latency_us * 1e3 + 7 * bytes / 8 / 360e9 * 1e9);
  BOOST_TEST(sim::moe_layer_a2a_ns(s) == 2 * in);
  auto const st = sim::plan_stages(s).front();
  BOOST_TEST(st.fwd_a2a_ns == 8 * 2 * in);
  BOOST_TEST(st.fwd_comm_ns == st.fwd_a2a_ns);
}

// Data parallelism: the gradient all-reduce (or, with the distributed optimizer, reduce-scatter and
// the weights' all-gather after the step) is a kernel of its own duration between the last backward
// and the step: without overlap the step grows by exactly that. NVLink inside a node, the network
// across nodes.
BOOST_AUTO_TEST_CASE(data_parallel_collectives_add_their_time_to_the_step) {
  auto const base = pipeswap::test::tiny();
  auto const one = sim::simulate(base, {}).ranks.at(0);
  auto s = base;
  s.parallel.dp = 4;
  std::uint64_t const P = pipeswap::test::P;
  auto const ar = sim::collective_ns(sim::collective::all_reduce, 4.0 * P, sim::dp_span(s), s.device); // fp32 grads
  BOOST_TEST(ar == std::llround(10e3 + 1.5 * 4.0 * P / 360e9 * 1e9));
  BOOST_TEST(sim::dp_grad_sync_ns(s, P) == ar);
  // One bucket: with overlap_grad_reduce it starts when the last backward ends, as without.
  for (bool const overlap : {false, true}) {
    s.parallel.overlap_grad_reduce = overlap;
    auto const dp = sim::simulate(s, {}).ranks.at(0);
    BOOST_TEST(dp.pipeline_ns == one.pipeline_ns);
    BOOST_TEST(dp.step_ns - one.step_ns == ar);
  }
  s.node.gpus = 2; // tp·dp = 4 devices span two nodes: two per node, two NICs
  auto const net = sim::span_of(1, 4, 2);
  BOOST_TEST(sim::ring_gbps(sim::dp_span(s), s.device) == 80.0);
  BOOST_TEST(sim::dp_grad_sync_ns(s, P) == sim::collective_ns(sim::collective::all_reduce, 4.0 * P, net, s.device));
  s.parallel.distributed_optimizer = true;
  BOOST_TEST(sim::dp_grad_sync_ns(s, P) == sim::collective_ns(sim::collective::reduce_scatter, 4.0 * P, net, s.device));
  BOOST_TEST(sim::dp_param_gather_ns(s, P) == sim::collective_ns(sim::collective::all_gather, 2.0 * P, net, s.device));
}

// With overlap_grad_reduce the gradients' reduce-scatter runs bucket by bucket from the start of the
// stage's last backward, the last bucket after it: it delays the step by last + max(0, ns − last − B)
// (B the backward). With overlap_param_gather the weights' all-gather delays it by one bucket or what
// exceeds the first forward's compute. Both off: by the whole of each.
BOOST_AUTO_TEST_CASE(data_parallel_collectives_overlap_the_backward_by_buckets) {
  auto base = pipeswap::test::tiny();
  base.model.hidden = 2048;
  base.model.ffn_hidden = 16384;
  base.model.heads = 16;
  base.model.kv_heads = 16;
  base.device.memory_bytes = 400'000'000'000;
  base.device.bf16_tflops = 1; // slow enough that the buckets can hide
  auto const st = sim::plan_stages(base).front();
  auto s = base;
  s.parallel.dp = 4;
  s.node.gpus = 1; // one device per node: every collective over the network
  s.parallel.distributed_optimizer = true;
  auto const rs = sim::dp_grad_sync_ns(s, st.params);
  auto const ag = sim::dp_param_gather_ns(s, st.params);
  auto const buckets = sim::dp_buckets(s, st.params);
  BOOST_TEST(buckets == (st.params + 39'999'999) / 40'000'000);
  BOOST_TEST(buckets > 2u);
  auto const last = rs / static_cast<std::int64_t>(buckets);
  auto const bucket_ag = ag / static_cast<std::int64_t>(buckets);
  auto const busy = st.fwd_ns - st.fwd_comm_ns;
  auto const overlapped = sim::simulate(s, {}).ranks.at(0).step_ns;
  s.parallel.overlap_grad_reduce = false;
  s.parallel.overlap_param_gather = false;
  auto const exposed = sim::simulate(s, {}).ranks.at(0).step_ns;
  BOOST_TEST(exposed - overlapped == rs + ag -
                                         (last + std::max<std::int64_t>(0, rs - last - st.bwd_ns) +
                                          std::max<std::int64_t>(bucket_ag, ag - std::min(ag, busy))));
  BOOST_TEST(exposed - overlapped > 0);
}

// FSDP without a pipeline (fsdp_per_layer) gathers each layer's weights before its forward and again
// before its backward and reduces its gradients after it, one layer ahead: a stage's forward shows
// ag + (L − 1)·max(0, ag − f), its backward rs + (L − 1)·max(0, ag + rs − b), per micro-batch; the
// root unit's reduce-scatter and all-gather delay the step once each, whole, in place of the
// distributed optimizer's collectives over the whole stage. With a pipeline, FSDP's time is the
// distributed optimizer's.
BOOST_AUTO_TEST_CASE(fsdp_gathers_and_reduces_layer_by_layer_without_a_pipeline) {
  // Four layers over dp 4 with the distributed optimizer, one device per node: every collective over
  // the network at `gbps`. Without an fp32 master, so that FSDP's optimizer kernel is the distributed
  // optimizer's (with one, FSDP's fp32 shard is the master: held_weight_bytes).
  auto job = [](std::uint32_t ranks, std::uint32_t micro, double gbps) {
    auto s = pipeswap::test::tiny(ranks, micro);
    s.model.fp32_master = false;
    s.model.layers = 4;
    s.parallel.dp = 4;
    s.node.gpus = 1;
    s.device.network_gbps = gbps;
    s.parallel.distributed_optimizer = true;
    return s;
  };
  for (double gbps : {40.0, 0.01}) { // the layers' collectives hidden, then exposed
    auto dist = job(1, 2, gbps);
    dist.device.memory_bytes = 400'000'000'000;
    dist.parallel.overlap_grad_reduce = false; // the distributed optimizer's collectives whole
    dist.parallel.overlap_param_gather = false;
    auto fsdp = dist;
    fsdp.parallel.fsdp = true;
    BOOST_TEST(sim::fsdp_per_layer(fsdp));
    auto const d0 = sim::plan_stages(dist).at(0), f0 = sim::plan_stages(fsdp).at(0);
    std::uint64_t layer = 0;
    for (auto const& t : sim::layer_tensors(fsdp.model, 0, fsdp.parallel)) layer += t.numel;
    auto const ag = sim::dp_param_gather_ns(fsdp, layer), rs = sim::dp_grad_sync_ns(fsdp, layer);
    auto const lt = sim::layer_op_times(fsdp.model, fsdp.parallel, fsdp.device);
    auto const f = std::llround(lt.fwd() * 1e9), b = std::llround(lt.bwd() * 1e9);
    auto const over = [](std::int64_t x, std::int64_t y) { return std::max<std::int64_t>(0, x - y); };
    std::int64_t const fwd = ag + 3 * over(ag, f), bwd = rs + 3 * over(ag + rs, b);
    BOOST_TEST_CONTEXT("network " << gbps << " GB/s") {
      BOOST_TEST((gbps > 1) == (ag < f)); // the two regimes
      BOOST_TEST(f0.fwd_ns - d0.fwd_ns == fwd);
      BOOST_TEST(f0.bwd_ns - d0.bwd_ns == bwd);
      BOOST_TEST(f0.fwd_comm_ns - d0.fwd_comm_ns == fwd);
      // The step: two micro-batches' layer collectives, the root unit's two collectives in place of the
      // whole stage's.
      auto const root = sim::root_params(f0);
      BOOST_TEST(root == f0.params - 4 * layer);
      auto const want = 2 * (fwd + bwd) + sim::dp_grad_sync_ns(fsdp, root) + sim::dp_param_gather_ns(fsdp, root) -
                        sim::dp_grad_sync_ns(dist, d0.params) - sim::dp_param_gather_ns(dist, d0.params);
      BOOST_TEST(sim::simulate(fsdp, {}).ranks.at(0).step_ns - sim::simulate(dist, {}).ranks.at(0).step_ns == want);
    }
  }
  // With a pipeline the stages stay gathered across micro-batches: the same times as without FSDP.
  auto piped = job(2, 4, 0.01);
  auto const d = sim::plan_stages(piped);
  piped.parallel.fsdp = true;
  BOOST_TEST(!sim::fsdp_per_layer(piped));
  auto const fs = sim::plan_stages(piped);
  for (std::size_t i = 0; i < d.size(); ++i) {
    BOOST_TEST(fs[i].fwd_ns == d[i].fwd_ns);
    BOOST_TEST(fs[i].bwd_ns == d[i].bwd_ns);
  }
}

// A node's devices share its host bandwidth when they copy at once, and both directions together
// keep duplex_factor of each (a direction alone keeps its whole rate). Devices are numbered tp, then
// dp, then pp.
BOOST_AUTO_TEST_CASE(host_bandwidth_is_shared_by_the_devices_of_a_node_that_copy) {
  sim::scenario s;
  s.model.layers = 8;
  s.pipeline.ranks = 4;
  s.parallel.tp = 2;
  s.parallel.dp = 2; // 4 devices per rank: ranks 0-1 on node 0, ranks 2-3 on node 1
  auto const r = sim::host_link_rates(s, {true, false, true, true});
  BOOST_TEST(r[0].sharing == 4u);
  BOOST_TEST(r[0].h2d_gbps == 55 * 0.7, boost::test_tools::tolerance(1e-12)); // 278 / 4 > 55: the device's link
  BOOST_TEST(r[2].sharing == 8u);
  BOOST_TEST(r[2].h2d_gbps == 278.0 / 8 * 0.7, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(r[3].d2h_gbps == 278.0 / 8 * 0.7, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(r[2].h2d_alone_gbps == 278.0 / 8, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(r[0].d2h_alone_gbps == 55.0);
  // The timing model runs each direction at its rate alone and shares it while both copy.
  auto const tm = sim::timing_of(s.device, r[2]);
  BOOST_TEST(tm.h2d.bytes_per_second == 34'750'000'000u);
  BOOST_TEST(tm.duplex_factor == 0.7);
  s.device.duplex_factor = 1;
  BOOST_TEST(sim::host_link_rates(s, {false, false, false, true})[3].h2d_gbps == 55.0); // 278 / 4 > 55
  s.node.host_gbps = 100;
  BOOST_TEST(sim::host_link_rates(s, {false, false, false, true})[3].h2d_gbps == 25.0);

  // In the simulator: two ranks on one node halve each other's optimizer copies.
  auto t = pipeswap::test::tiny(2, 4);
  t.model.layers = 2;
  t.node.host_gbps = 0.01; // 10 MB/s: the optimizer copies dominate the step
  sim::sim_options o;
  o.swap_optimizer = true;
  t.node.gpus = 1;
  auto const alone = sim::simulate(t, o).ranks.at(0);
  t.node.gpus = 2;
  auto const shared = sim::simulate(t, o).ranks.at(0);
  BOOST_TEST(alone.link.h2d_gbps == 0.01, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(shared.link.h2d_gbps == 0.005, boost::test_tools::tolerance(1e-12));
  double const ratio = double(shared.step_ns - shared.pipeline_ns) / double(alone.step_ns - alone.pipeline_ns);
  BOOST_TEST(ratio == 2.0, boost::test_tools::tolerance(0.02));
}

// 1F1B on uniform stages takes (m + p − 1)·(t_f + t_b) with free sends. Uniform: L = k·p − 1 layers
// put k on every stage but the last, which has k − 1 and the output layer; a vocabulary of
// 4h + 3f + 2s makes the output layer cost one layer's FLOPs.
BOOST_AUTO_TEST_CASE(one_f_one_b_takes_m_plus_p_minus_1_slots) {
  for (std::uint32_t p : {2u, 4u}) {
    for (std::uint32_t m : {p, 2 * p, 3 * p + 1}) {
      auto s = pipeswap::test::tiny(p, m);
      s.pipeline.schedule = sim::schedule_kind::one_f_one_b;
      s.model.layers = 2 * p - 1;
      s.model.activation_bytes_per_layer.reset();
      s.model.vocab = 4 * 64 + 3 * 128 + 2 * 32;
      s.device.p2p_latency_us = 0;
      s.device.p2p_gbps = 1e12;
      s.device.memory_bytes = 1'000'000'000;
      auto const st = sim::plan_stages(s);
      for (auto const& x : st) {
        BOOST_TEST(x.fwd_ns == st.front().fwd_ns);
        BOOST_TEST(x.bwd_ns == 2 * st.front().fwd_ns);
      }
      auto const r = sim::simulate(s, {});
      std::int64_t const slot = st.front().fwd_ns + st.front().bwd_ns;
      BOOST_TEST_CONTEXT("p " << p << ", m " << m) {
        for (auto const& x : r.ranks) BOOST_TEST(x.pipeline_ns <= std::int64_t(m + p - 1) * slot);
        BOOST_TEST(r.ranks.front().pipeline_ns == std::int64_t(m + p - 1) * slot);
      }
    }
  }
}

// A published end-to-end MFU is turned into the kernel efficiency that reaches it.
BOOST_AUTO_TEST_CASE(an_end_to_end_mfu_calibrates_the_kernel_efficiency) {
  auto s = pipeswap::test::tiny(2, 8);
  s.model.layers = 2;
  s.device.end_to_end_mfu = 0.3;
  auto const c = sim::calibrated(s);
  BOOST_TEST(!c.device.end_to_end_mfu.has_value());
  auto const got = sim::end_to_end_mfu(c, sim::simulate(c, {}).step_ns);
  BOOST_TEST(got == 0.3, boost::test_tools::tolerance(1e-3));
  BOOST_TEST(c.device.kernel_efficiency > 0.3); // the bubble costs the rest
  s.device.end_to_end_mfu = 0.99;               // out of reach with the bubble of 2 ranks, 8 micro-batches
  BOOST_CHECK_THROW((void)sim::calibrated(s), pipeswap::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END() // sim_model
