// A scenario from a Megatron-LM job's arguments (sim/megatron_args.hpp): the two forms of text (a
// command line, a test's MODEL_ARGS block) read alike; Megatron's own defaults where a flag is left
// out; the layout derived from the GPU count; what the simulator cannot describe refused, naming
// the flag; what it approximates, and every flag it did not read, said in a note.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <pipeswap/error.hpp>
#include <pipeswap/sim/megatron_args.hpp>
#include <pipeswap/sim/scenario_json.hpp>

namespace sim = pipeswap::sim;

namespace {

// A Mixtral-like layout as a launch command line: torchrun's flags (8 GPUs on each of 8 nodes),
// quotes, a backslash-newline, a comment and --flag=value.
constexpr char const* command_line = R"(torchrun --nproc_per_node 8 --nnodes=8 pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --seq-length 4096 --swiglu \
    --micro-batch-size 1 --global-batch-size 256 --bf16 \
    --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 4 \
    --num-layers-per-virtual-pipeline-stage 1   # eight stages per rank
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --attention-dropout 0.0 --hidden-dropout=0.0 --disable-bias-linear \
    --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 \
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-router-force-load-balancing \
    --tokenizer-type Llama2Tokenizer --lr "1.2e-5" --wandb-exp-name 'a run'
)";

// The same layout as a Megatron-LM test's model_config.yaml.
constexpr char const* yaml = R"(ENV_VARS:
  CUDA_DEVICE_MAX_CONNECTIONS: 1
MODEL_ARGS:
  # Distributed args
  --pipeline-model-parallel-size: 4
  --tensor-model-parallel-size: 2
  --expert-tensor-parallel-size: 1
  --num-layers-per-virtual-pipeline-stage: 1
  --use-distributed-optimizer: true
  --overlap-grad-reduce: true
  --overlap-param-gather: true
  --sequence-parallel: true
  --disable-bias-linear: true
  --micro-batch-size: 1
  --global-batch-size: 256
  --tokenizer-type: Llama2Tokenizer
  --swiglu: true
  --num-layers: 32
  --hidden-size: 4096
  --ffn-hidden-size: 14336
  --num-attention-heads: 32
  --group-query-attention: true
  --num-query-groups: 8
  --seq-length: 4096
  --attention-dropout: 0.0
  --hidden-dropout: 0.0
  --lr: 1.2e-5
  --wandb-exp-name: ${WANDB_EXPERIMENT}
  --expert-model-parallel-size: 8
  --num-experts: 8
  --moe-router-topk: 2
  --moe-grouped-gemm: true
  --moe-router-force-load-balancing: true
  --moe-token-dispatcher-type: alltoall
  --bf16: true
METRICS:
  - "iteration-time"
)";

sim::megatron_launch h100(std::uint64_t gpus = 64) {
  sim::megatron_launch l;
  l.gpus = gpus;
  l.device = "H100 SXM";
  l.vocab = 32000;
  l.name = "Mixtral-8x7B";
  return l;
}

bool has_note(sim::megatron_scenario const& r, std::string const& part) {
  return std::any_of(r.notes.begin(), r.notes.end(), [&](auto const& n) { return n.find(part) != std::string::npos; });
}

void expect_error(std::string const& text, sim::megatron_launch const& l, std::string const& part) {
  try {
    (void)sim::scenario_from_megatron_args(text, l);
    BOOST_ERROR("accepted: " << part);
  } catch (pipeswap::invalid_argument const& e) {
    BOOST_TEST(std::string(e.what()).find(part) != std::string::npos, e.what());
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(sim_megatron_args)

BOOST_AUTO_TEST_CASE(a_command_line_and_a_test_config_give_the_same_scenario) {
  auto launch = h100();
  launch.gpus.reset(); // from torchrun's flags: 8 × 8
  auto const a = sim::scenario_from_megatron_args(command_line, launch);
  auto const b = sim::scenario_from_megatron_args(yaml, h100());
  auto const& s = a.s;
  BOOST_TEST(s.model.layers == 32u);
  BOOST_TEST(s.model.hidden == 4096u);
  BOOST_TEST(s.model.ffn_hidden == 14336u);
  BOOST_TEST(s.model.kv_heads == 8u);
  BOOST_TEST(s.model.vocab == 32000u); // a multiple of 128 × tp already
  BOOST_TEST(!s.model.dropout);
  BOOST_TEST((s.model.mlp == sim::mlp_kind::swiglu));
  BOOST_TEST((s.model.param_dtype == pipeswap::dtype::bf16));
  BOOST_TEST(s.model.moe.experts == 8u);
  BOOST_TEST(s.model.moe.top_k == 2u);
  BOOST_TEST(s.model.moe.expert_ffn_hidden == 14336u);
  BOOST_TEST(s.parallel.tp == 2u);
  BOOST_TEST(s.parallel.sequence_parallel);
  BOOST_TEST(s.parallel.dp == 8u); // 64 / (2 × 4)
  BOOST_TEST(s.parallel.ep == 8u);
  BOOST_TEST((s.parallel.expert_tp == 1u));
  BOOST_TEST(s.parallel.distributed_optimizer);
  BOOST_TEST(s.parallel.overlap_grad_reduce);
  BOOST_TEST(!s.parallel.tp_comm_overlap); // Megatron's default: off
  BOOST_TEST((s.pipeline.schedule == sim::schedule_kind::interleaved));
  BOOST_TEST(s.pipeline.ranks == 4u);
  BOOST_TEST(s.pipeline.stages_per_rank == 8u); // 32 layers / (4 ranks × 1 per stage)
  BOOST_TEST(s.pipeline.micro_batches == 32u);  // 256 / (1 × 8)
  BOOST_TEST(s.node.gpus == 8u);
  BOOST_TEST(s.device.name == "H100 SXM");
  auto const ja = sim::to_json(a.s), jb = sim::to_json(b.s);
  for (char const* sec : {"model", "device", "node", "parallel", "pipeline"}) BOOST_TEST(ja[sec] == jb[sec], sec);
  // every flag it does not read is named, and nothing it reads
  BOOST_TEST(has_note(a, "not read by the simulator: --tokenizer-type, --lr, --wandb-exp-name"));
  BOOST_TEST(has_note(b, "not read by the simulator: --tokenizer-type, --lr, --wandb-exp-name"));
  BOOST_TEST(!has_note(a, "--num-layers,"));
}

BOOST_AUTO_TEST_CASE(left_out_flags_take_megatron_s_defaults) {
  std::string const base = "--num-layers 4 --hidden-size 1000 --num-attention-heads 8 --seq-length 2048 --vocab-size "
                           "50000";
  sim::megatron_launch l;
  l.gpus = 8;
  auto const r = sim::scenario_from_megatron_args(base, l);
  auto const& m = r.s.model;
  BOOST_TEST(m.ffn_hidden == 4000u);                   // 4h
  BOOST_TEST((m.mlp == sim::mlp_kind::gelu));          // no --swiglu
  BOOST_TEST(m.kv_heads == 8u);                        // no grouped-query attention
  BOOST_TEST(m.dropout);                               // 0.1 each
  BOOST_TEST((m.param_dtype == pipeswap::dtype::f32)); // no --bf16 or --fp16
  BOOST_TEST(!m.fp32_master);
  BOOST_TEST(m.vocab == 50048u); // padded to a multiple of 128
  BOOST_TEST(m.micro_batch_size == 1u);
  BOOST_TEST(r.s.parallel.dp == 8u);
  BOOST_TEST(!r.s.parallel.overlap_grad_reduce); // off unless asked
  BOOST_TEST(!r.s.parallel.overlap_param_gather);
  BOOST_TEST(r.s.pipeline.ranks == 1u);
  BOOST_TEST(!sim::scenario_from_megatron_args(base + " --sequence-parallel", l).s.parallel.sequence_parallel);
  auto const fsdp = sim::scenario_from_megatron_args(base + " --use-torch-fsdp2", l);
  BOOST_TEST(fsdp.s.parallel.fsdp);
  BOOST_TEST(fsdp.s.parallel.distributed_optimizer);
  BOOST_TEST(has_note(fsdp, "FSDP: modelled as FSDP2"));
  BOOST_TEST(r.s.pipeline.micro_batches == 1u); // global batch: micro-batch × dp
  BOOST_TEST(r.s.device.name == sim::device_spec{}.name);
  BOOST_TEST(has_note(r, "device: the default"));
  BOOST_TEST(has_note(r, "linear biases"));
  // --swiglu without --ffn-hidden-size: 8h/3 rounded down to a multiple of 64; tp pads the vocabulary
  auto const g = sim::scenario_from_megatron_args(base + " --swiglu --bf16 --tensor-model-parallel-size 4", l);
  BOOST_TEST(g.s.model.ffn_hidden == 2624u); // 2666 → 2624
  BOOST_TEST(g.s.model.vocab == 50176u);     // a multiple of 512
  BOOST_TEST(g.s.parallel.dp == 2u);
  // the launch's vocabulary wins over --vocab-size
  l.vocab = 32000;
  BOOST_TEST(sim::scenario_from_megatron_args(base, l).s.model.vocab == 32000u);
}

BOOST_AUTO_TEST_CASE(recomputation_precision_and_routing_map_to_the_model_s_settings) {
  std::string const base = "--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 "
                           "--vocab-size 32000 --bf16 --pipeline-model-parallel-size 2 --global-batch-size 16 ";
  sim::megatron_launch l;
  l.gpus = 8;
  auto rc = [&](std::string const& extra) { return sim::scenario_from_megatron_args(base + extra, l); };
  BOOST_TEST((rc("").s.model.recompute == sim::recompute_kind::none));
  BOOST_TEST((rc("--recompute-granularity selective").s.model.recompute == sim::recompute_kind::selective));
  BOOST_TEST(
      (rc("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1").s.model.recompute ==
       sim::recompute_kind::full));
  auto const block = rc("--recompute-granularity full --recompute-method block --recompute-num-layers 2");
  BOOST_TEST((block.s.model.recompute == sim::recompute_kind::full)); // 2 of each stage's 4 layers
  BOOST_TEST(has_note(block, "recomputes 2 of each stage's 4 layers"));
  BOOST_TEST(
      !has_note(rc("--recompute-granularity full --recompute-method block --recompute-num-layers 4"), "recomputes"));
  auto const mods = rc("--recompute-granularity selective --recompute-modules core_attn moe_act");
  BOOST_TEST((mods.s.model.recompute == sim::recompute_kind::selective));
  BOOST_TEST(has_note(mods, "--recompute-modules moe_act: not modelled"));
  BOOST_TEST(
      (rc("--recompute-granularity selective --recompute-modules mlp").s.model.recompute == sim::recompute_kind::none));
  // FP8: the format turns it on; a recipe other than per-tensor is an approximation
  BOOST_TEST((rc("--fp8-format hybrid").s.model.precision == sim::precision::fp8));
  BOOST_TEST(!has_note(rc("--fp8-format hybrid --fp8-recipe tensorwise"), "--fp8-recipe"));
  BOOST_TEST(has_note(rc("--fp8-format e4m3 --fp8-recipe mxfp8"), "--fp8-recipe mxfp8: modelled as per-tensor"));
  BOOST_TEST((rc("--fp8-recipe mxfp8").s.model.precision == sim::precision::bf16));
  BOOST_TEST((rc("--grad-reduce-in-bf16").s.model.grad_dtype == pipeswap::dtype::bf16));
  // MoE: the allgather default and the flex dispatcher; CUDA graphs and the host's time
  std::string const moe = "--num-experts 16 --moe-ffn-hidden-size 256 --expert-model-parallel-size 4 "
                          "--moe-grouped-gemm --moe-router-force-load-balancing ";
  auto const allgather = rc(moe);
  BOOST_TEST(allgather.s.model.moe.top_k == 2u);
  BOOST_TEST(has_note(allgather, "allgather (Megatron's default): modelled as the alltoall dispatcher"));
  BOOST_TEST((rc(moe + "--moe-token-dispatcher-type flex").s.model.moe.dispatch == sim::moe_dispatch::per_node));
  BOOST_TEST((rc(moe + "--moe-token-dispatcher-type alltoall").s.model.moe.dispatch == sim::moe_dispatch::all_to_all));
  BOOST_TEST(!rc(moe + "--moe-token-dispatcher-type alltoall").s.model.moe.host_layer_ms.has_value());
  std::string const padded = moe + "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity ";
  BOOST_TEST((rc(padded + "--enable-cuda-graph").s.model.moe.host_layer_ms == 0.0));
  BOOST_TEST((rc(padded + "--cuda-graph-impl local").s.model.moe.host_layer_ms == 0.0));
  BOOST_TEST((rc(moe + "--cuda-graph-impl full_iteration").s.model.moe.host_layer_ms == 0.0));
  auto const partial = rc(padded + "--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router");
  BOOST_TEST(!partial.s.model.moe.host_layer_ms.has_value());
  BOOST_TEST(has_note(partial, "a partial CUDA graph is not modelled"));
  BOOST_TEST(!rc(moe + "--enable-cuda-graph").s.model.moe.host_layer_ms.has_value()); // dropless: not whole
  BOOST_TEST(has_note(rc("--num-experts 16 --expert-model-parallel-size 4"), "routing taken as balanced"));
  BOOST_TEST(has_note(rc(moe + "--moe-router-dtype fp32 --tensor-model-parallel-size 2 --sequence-parallel "
                               "--expert-model-parallel-size 2"),
                      "--moe-router-dtype fp32: the expert-TP reduce-scatter"));
  BOOST_TEST(!has_note(rc(moe + "--moe-router-dtype fp32"), "--moe-router-dtype")); // expert TP 1: no such collective
  BOOST_TEST(has_note(rc("--num-experts 16 --expert-model-parallel-size 4"), "without --moe-grouped-gemm"));
  // the all-to-all overlap: combined slots on an interleaved pipeline
  auto const ov = rc(moe + "--overlap-moe-expert-parallel-comm --num-virtual-stages-per-pipeline-rank 2");
  BOOST_TEST(ov.s.pipeline.overlap_b_f);
  BOOST_TEST(ov.s.pipeline.stages_per_rank == 2u);
  BOOST_TEST(has_note(rc(moe + "--overlap-moe-expert-parallel-comm"), "the all-to-alls stay exposed"));
}

BOOST_AUTO_TEST_CASE(what_the_simulator_cannot_describe_is_refused_naming_the_flag) {
  std::string const base = "--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 "
                           "--vocab-size 32000 --bf16 ";
  sim::megatron_launch l;
  l.gpus = 8;
  expect_error(base + "--context-parallel-size 2", l, "--context-parallel-size: context parallelism is not modelled");
  expect_error(base + "--multi-latent-attention", l, "--multi-latent-attention: multi-latent attention");
  expect_error(base + "--num-experts 8 --moe-layer-freq ([0]*1+[1]*7)", l, "--moe-layer-freq: only every layer");
  expect_error(base + "--tensor-model-parallel-size 3", l, "8 GPUs are not a multiple of");
  expect_error(base + "--global-batch-size 12 --micro-batch-size 1", l,
               "--global-batch-size: 12 is not a multiple of --micro-batch-size × the data-parallel degree (1 × 8)");
  expect_error(base + "--num-layers-per-virtual-pipeline-stage 3 --pipeline-model-parallel-size 2", l,
               "--num-layers-per-virtual-pipeline-stage: 8 layers do not split");
  expect_error(base + "--hidden-size 1k", l, "--hidden-size: expected a whole number, got \"1k\"");
  expect_error(base + "--hidden-dropout high", l, "--hidden-dropout: expected a number");
  expect_error(base + "--fp8-format e5m2", l, "--fp8-format: expected e4m3 or hybrid");
  expect_error(base + "--recompute-granularity some", l, "--recompute-granularity: expected full or selective");
  expect_error(base + "--num-experts 8 --moe-token-dispatcher-type ring", l, "expected allgather, alltoall or flex");
  expect_error(base + "--expert-model-parallel-size 2", l, "--expert-model-parallel-size: needs --num-experts");
  expect_error("--hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --vocab-size 32000", l,
               "--num-layers: is required");
  expect_error(base + "--wandb-exp-name 'unclosed", l, "a quote (') is not closed");
  expect_error(base, {}, "the number of GPUs");
  expect_error("--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024", l, "the vocabulary");
  // the scenario's own rules, naming the scenario field
  expect_error(base + "--num-attention-heads 6", l, "(from the Megatron arguments)");
  // an unknown device preset
  auto bad = l;
  bad.device = "A100";
  expect_error(base, bad, "device.preset");
}

BOOST_AUTO_TEST_SUITE_END()
