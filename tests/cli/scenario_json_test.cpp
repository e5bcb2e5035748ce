// Scenario files: every field read into its member and written back, `{}` as the default scenario,
// and every class of bad input rejected with a message that names the field.
#define BOOST_TEST_MODULE sim_scenario_json
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/error.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/scenario_json.hpp>

namespace sim = pipeswap::sim;
using nlohmann::json;

namespace {

/// Runs `f`, which must throw pipeswap::invalid_argument with exactly `message`.
template <class F>
void expect_error(F&& f, std::string_view message) {
  try {
    f();
    BOOST_ERROR("no exception; expected: " << message);
  } catch (pipeswap::invalid_argument const& e) {
    BOOST_TEST(std::string_view(e.what()) == message);
  }
}

void expect_rejected(std::string_view text, std::string_view message) {
  expect_error([&] { (void)sim::scenario_from_json_text(text); }, message);
}

/// Every field, each set to a value other than its default (and valid together).
json every_field() {
  return json::parse(R"({
    "comment": "every field",
    "model": {"name": "tiny", "layers": 12, "hidden": 512, "ffn_hidden": 1536, "heads": 8, "kv_heads": 4,
              "vocab": 1000, "seq_len": 256, "micro_batch_size": 3, "param_dtype": "F16", "grad_dtype": "BF16",
              "fp32_master": false, "flash_attention": false, "mlp": "gelu", "dropout": true,
              "recompute": "selective", "activation_bytes_per_layer": 123456, "head_dim": 32, "precision": "FP8",
              "fp8_library": "torchao", "fused_kernels": false, "loss": "pytorch",
              "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 256, "shared_expert_ffn_hidden": 512,
                      "capacity_factor": 1.25, "pad_to_capacity": true, "load_imbalance": 1.5,
                      "host_layer_ms": 3.5, "dispatch": "per_node"}},
    "device": {"name": "toy", "memory_bytes": 8000000000, "reserved_bytes": 500000000, "h2d_gbps": 12.5,
               "d2h_gbps": 11, "duplex_factor": 0.8, "copy_latency_us": 3.5, "bf16_tflops": 100,
               "fp8_tflops": 180, "compute": "flops", "kernel_efficiency": 0.3, "end_to_end_mfu": 0.25, "hbm_tbps": 1.5, "p2p_gbps": 25,
               "p2p_latency_us": 7, "nvlink_gbps": 200, "network_gbps": 20, "nvlink_latency_us": 5,
               "network_latency_us": 9},
    "node": {"gpus": 4, "host_gbps": 100, "cpu_adam_gbps": 50},
    "parallel": {"tp": 2, "sequence_parallel": true, "save_gathered_inputs": false, "dp": 4, "distributed_optimizer": true, "fsdp": true, "ep": 2,
                 "expert_tp": 1,
                 "overlap_grad_reduce": false, "overlap_param_gather": false, "tp_comm_overlap": false,
                 "overlap_moe_expert_parallel_comm": false},
    "pipeline": {"schedule": "interleaved", "ranks": 3, "micro_batches": 6, "stages_per_rank": 2, "overlap_b_f": true},
    "swap": {"swap_times": 5, "packed": false, "overlap": false},
    "plan": {"tolerance": 0.01}
  })");
}

/// A small scenario that validates, for the negative cases to start from.
json small() {
  return json::parse(R"({"model": {"layers": 4, "hidden": 256, "ffn_hidden": 512, "heads": 4, "kv_heads": 2,
                                   "vocab": 100, "seq_len": 64},
                         "device": {"memory_bytes": 4000000000, "reserved_bytes": 0},
                         "pipeline": {"ranks": 2, "micro_batches": 4}})");
}

} // namespace

BOOST_AUTO_TEST_CASE(every_field_is_read_into_its_member) {
  auto const s = sim::scenario_from_json(every_field());
  auto const& m = s.model;
  BOOST_TEST(m.name == "tiny");
  BOOST_TEST(m.layers == 12u);
  BOOST_TEST(m.hidden == 512u);
  BOOST_TEST(m.ffn_hidden == 1536u);
  BOOST_TEST(m.heads == 8u);
  BOOST_TEST(m.kv_heads == 4u);
  BOOST_TEST(m.vocab == 1000u);
  BOOST_TEST(m.seq_len == 256u);
  BOOST_TEST(m.micro_batch_size == 3u);
  BOOST_TEST((m.param_dtype == pipeswap::dtype::f16));
  BOOST_TEST(!m.fp32_master);
  BOOST_TEST(!m.flash_attention);
  BOOST_TEST(m.activation_bytes_per_layer.value_or(0) == 123456u);
  BOOST_TEST((m.grad_dtype == pipeswap::dtype::bf16));
  BOOST_TEST((m.mlp == sim::mlp_kind::gelu));
  BOOST_TEST(m.dropout);
  BOOST_TEST((m.recompute == sim::recompute_kind::selective));
  BOOST_TEST(s.node.gpus == 4u);
  BOOST_TEST(s.node.host_gbps == 100.0);
  BOOST_TEST(s.parallel.tp == 2u);
  BOOST_TEST(s.parallel.sequence_parallel);
  BOOST_TEST(s.parallel.dp == 4u);
  BOOST_TEST(s.parallel.distributed_optimizer);
  BOOST_TEST(s.parallel.fsdp);
  auto const& d = s.device;
  BOOST_TEST(d.name == "toy");
  BOOST_TEST(d.memory_bytes == 8'000'000'000u);
  BOOST_TEST(d.reserved_bytes == 500'000'000u);
  BOOST_TEST(d.h2d_gbps == 12.5);
  BOOST_TEST(d.d2h_gbps == 11.0);
  BOOST_TEST(d.copy_latency_us == 3.5);
  BOOST_TEST(d.bf16_tflops == 100.0);
  BOOST_TEST(d.fp8_tflops == 180.0);
  BOOST_TEST((d.compute == sim::compute_kind::flops));
  BOOST_TEST((m.precision == sim::precision::fp8));
  BOOST_TEST(!m.fused_kernels);
  BOOST_TEST((m.loss == sim::loss_kind::pytorch));
  BOOST_TEST(d.kernel_efficiency == 0.3);
  BOOST_TEST(d.end_to_end_mfu.value_or(0) == 0.25);
  BOOST_TEST(d.duplex_factor == 0.8);
  BOOST_TEST(d.nvlink_gbps == 200.0);
  BOOST_TEST(d.network_gbps == 20.0);
  BOOST_TEST(d.nvlink_latency_us == 5.0);
  BOOST_TEST(d.network_latency_us == 9.0);
  BOOST_TEST(!s.parallel.overlap_grad_reduce);
  BOOST_TEST(!s.parallel.overlap_param_gather);
  BOOST_TEST(!s.parallel.tp_comm_overlap);
  BOOST_TEST(!s.parallel.overlap_moe_expert_parallel_comm);
  BOOST_TEST(d.hbm_tbps == 1.5);
  BOOST_TEST(d.p2p_gbps == 25.0);
  BOOST_TEST(d.p2p_latency_us == 7.0);
  auto const& p = s.pipeline;
  BOOST_TEST((p.schedule == sim::schedule_kind::interleaved));
  BOOST_TEST(p.ranks == 3u);
  BOOST_TEST(p.micro_batches == 6u);
  BOOST_TEST(p.stages_per_rank == 2u);
  BOOST_TEST(p.overlap_b_f);
  BOOST_TEST(s.swap.swap_times == 5u);
  BOOST_TEST(!s.swap.packed);
  BOOST_TEST(!s.swap.overlap);
  BOOST_TEST(s.comment == "every field");
  BOOST_TEST(m.head_dim.value_or(0) == 32u);
  BOOST_TEST(m.moe.experts == 8u);
  BOOST_TEST(m.moe.top_k == 2u);
  BOOST_TEST(m.moe.expert_ffn_hidden == 256u);
  BOOST_TEST(m.moe.shared_expert_ffn_hidden == 512u);
  BOOST_TEST(m.moe.capacity_factor.value_or(0) == 1.25);
  BOOST_TEST(m.moe.pad_to_capacity);
  BOOST_TEST(m.moe.host_layer_ms.value_or(0) == 3.5);
  BOOST_TEST((m.moe.dispatch == sim::moe_dispatch::per_node));
  BOOST_TEST(m.moe.load_imbalance == 1.5);
  BOOST_TEST(s.parallel.ep == 2u);
  BOOST_TEST(s.parallel.expert_tp.value_or(0) == 1u);
  BOOST_TEST(s.plan.tolerance == 0.01);
  BOOST_TEST(s.node.cpu_adam_gbps == 50.0);
}

BOOST_AUTO_TEST_CASE(written_json_has_every_field_and_reads_back) {
  auto const in = every_field();
  auto const s = sim::scenario_from_json(in);
  auto const out = sim::to_json<json>(s);
  BOOST_TEST(out == in); // exactly the fields given, with the same values (key order aside)
  BOOST_TEST(sim::to_json<json>(sim::scenario_from_json(out)) == out);
  // The default scenario writes every field too, with the override as null.
  auto const d = sim::to_json<json>(sim::scenario{});
  BOOST_TEST(d["model"].size() == in["model"].size());
  BOOST_TEST(d["device"].size() == in["device"].size());
  BOOST_TEST(d["pipeline"].size() == in["pipeline"].size());
  BOOST_TEST(d["swap"].size() == in["swap"].size());
  BOOST_TEST(d["node"].size() == in["node"].size());
  BOOST_TEST(d["parallel"].size() == in["parallel"].size());
  BOOST_TEST(d["plan"].size() == in["plan"].size());
  BOOST_TEST(!d.contains("comment")); // written only when not empty
  BOOST_TEST(d["model"]["head_dim"].is_null());
  BOOST_TEST(d["parallel"]["expert_tp"].is_null());
  BOOST_TEST(d["model"]["grad_dtype"].is_null());
  BOOST_TEST(d["device"]["end_to_end_mfu"].is_null());
  // "FP32" is the spelling of an explicit fp32 gradient, read and written.
  auto const fp32 = sim::scenario_from_json_text(R"({"model": {"grad_dtype": "FP32"}})");
  BOOST_TEST((fp32.model.grad_dtype == pipeswap::dtype::f32));
  BOOST_TEST(sim::to_json<json>(fp32)["model"]["grad_dtype"] == "FP32");
  // torchtitan's per-operation recomputation policy is "op", read and written.
  auto const op = sim::scenario_from_json_text(R"({"model": {"recompute": "op"}})");
  BOOST_TEST((op.model.recompute == sim::recompute_kind::op));
  BOOST_TEST(sim::to_json<json>(op)["model"]["recompute"] == "op");
  // Eager kernels are "fused_kernels": false, read and written; fused is the default.
  BOOST_TEST(d["model"]["fused_kernels"] == true);
  BOOST_TEST(d["model"]["loss"] == "fused");
  auto const eager = sim::scenario_from_json_text(R"({"model": {"fused_kernels": false}})");
  BOOST_TEST(!eager.model.fused_kernels);
  BOOST_TEST(sim::to_json<json>(eager)["model"]["fused_kernels"] == false);
  // DTensor's saved gathered inputs are "save_gathered_inputs": true, read and written; off by default.
  BOOST_TEST(d["parallel"]["save_gathered_inputs"] == false);
  auto const gathered = sim::scenario_from_json_text(
      R"({"parallel": {"tp": 2, "sequence_parallel": true, "save_gathered_inputs": true}})");
  BOOST_TEST(gathered.parallel.save_gathered_inputs);
  BOOST_TEST(sim::to_json<json>(gathered)["parallel"]["save_gathered_inputs"] == true);
  BOOST_TEST(d["model"]["activation_bytes_per_layer"].is_null());
  BOOST_TEST(d["model"]["param_dtype"] == "BF16");
  BOOST_TEST(d["pipeline"]["schedule"] == "1f1b");
  BOOST_TEST(d["model"]["precision"] == "BF16");
  BOOST_TEST(d["device"]["compute"] == "roofline");
  // The ordered form (what the command prints) keeps the section order of the documentation.
  auto const ordered = sim::to_json(sim::scenario{});
  BOOST_TEST(ordered.begin().key() == "model");
  BOOST_TEST((ordered.dump().find("\"device\"") < ordered.dump().find("\"pipeline\"")));
}

BOOST_AUTO_TEST_CASE(absent_fields_keep_the_defaults) {
  auto const d = sim::to_json<json>(sim::scenario{});
  BOOST_TEST(sim::to_json<json>(sim::scenario_from_json_text("{}")) == d);
  BOOST_TEST(sim::to_json<json>(sim::scenario_from_json_text(R"({"model": {}, "swap": {}})")) == d);
  auto const s = sim::scenario_from_json_text(R"({"pipeline": {"micro_batches": 16}, "device": {"h2d_gbps": 25}})");
  auto expect = d;
  expect["pipeline"]["micro_batches"] = 16;
  expect["device"]["h2d_gbps"] = 25.0;
  BOOST_TEST(sim::to_json<json>(s) == expect);
  // The override goes back to the formula with null.
  auto const back = sim::scenario_from_json(json::parse(R"({"model": {"activation_bytes_per_layer": null}})"),
                                            sim::scenario_from_json(every_field()));
  BOOST_TEST(!back.model.activation_bytes_per_layer.has_value());
  BOOST_TEST(back.model.name == "tiny"); // the base's other fields stay
  // swap.overlap defaults to true; false is the reference step, for comparison.
  BOOST_TEST(sim::scenario{}.swap.overlap);
  BOOST_TEST(d["swap"]["overlap"] == true);
  BOOST_TEST(!sim::scenario_from_json_text(R"({"swap": {"overlap": false}})").swap.overlap);
  BOOST_TEST(sim::scenario_from_json_text(R"({"swap": {"overlap": true}})").swap.overlap);
}

BOOST_AUTO_TEST_CASE(integer_fields_accept_integral_floats_and_signed_numbers) {
  auto const s = sim::scenario_from_json_text(R"({"device": {"memory_bytes": 141e9, "reserved_bytes": 6.0e9},
                                                  "pipeline": {"ranks": 8.0}})");
  BOOST_TEST(s.device.memory_bytes == 141'000'000'000u);
  BOOST_TEST(s.device.reserved_bytes == 6'000'000'000u);
  BOOST_TEST(s.pipeline.ranks == 8u);
  // Built in code, non-negative integers are signed JSON numbers: accepted as well.
  json j = json::object();
  j["pipeline"]["ranks"] = 4;
  j["device"]["reserved_bytes"] = std::int64_t{0};
  auto const t = sim::scenario_from_json(j);
  BOOST_TEST(t.pipeline.ranks == 4u);
  BOOST_TEST(t.device.reserved_bytes == 0u);
}

BOOST_AUTO_TEST_CASE(unknown_keys_are_rejected_with_their_path) {
  expect_rejected(R"({"modle": {}})", "scenario: top level: unknown key 'modle' (did you mean 'model'?)");
  expect_rejected(R"({"model": {"layrs": 3}})", "scenario: model: unknown key 'layrs' (did you mean 'layers'?)");
  expect_rejected(R"({"device": {"memory": 3}})", "scenario: device: unknown key 'memory'");
  expect_rejected(R"({"pipeline": {"micro": 3}})", "scenario: pipeline: unknown key 'micro'");
  expect_rejected(R"({"swap": {"swap_time": 3}})",
                  "scenario: swap: unknown key 'swap_time' (did you mean 'swap_times'?)");
  expect_rejected(R"({"extra": 1})", "scenario: top level: unknown key 'extra'");
  expect_rejected(R"({"swap": {"overlaps": true}})",
                  "scenario: swap: unknown key 'overlaps' (did you mean 'overlap'?)");
  // "chunks" meant stages per rank here; the word now means one (stage, micro-batch) pair only.
  expect_rejected(R"({"pipeline": {"chunks": 2}})",
                  "scenario: pipeline: unknown key 'chunks' (did you mean 'stages_per_rank'?)");
}

BOOST_AUTO_TEST_CASE(negative_and_fractional_sizes_are_rejected) {
  expect_rejected(R"({"model": {"layers": -1}})", "scenario: model.layers: must not be negative, got -1");
  expect_rejected(R"({"model": {"hidden": -8192.0}})", "scenario: model.hidden: must not be negative, got -8192.0");
  expect_rejected(R"({"device": {"memory_bytes": -5}})", "scenario: device.memory_bytes: must not be negative, got -5");
  expect_rejected(R"({"device": {"reserved_bytes": -1}})",
                  "scenario: device.reserved_bytes: must not be negative, got -1");
  expect_rejected(R"({"pipeline": {"ranks": -2}})", "scenario: pipeline.ranks: must not be negative, got -2");
  expect_rejected(R"({"model": {"activation_bytes_per_layer": -3}})",
                  "scenario: model.activation_bytes_per_layer: must not be negative, got -3");
  expect_rejected(R"({"model": {"seq_len": 2.5}})", "scenario: model.seq_len: must be an integer, got 2.5");
  expect_rejected(R"({"pipeline": {"micro_batches": 4294967296}})",
                  "scenario: pipeline.micro_batches: is out of range (at most 4294967295), got 4294967296");
  // Rates are real numbers; sim::validate() rejects the ones that are not positive.
  expect_rejected(R"({"device": {"h2d_gbps": -55}})", "scenario: device.h2d_gbps must be positive");
  expect_rejected(R"({"device": {"kernel_efficiency": 1.5}})", "scenario: device.kernel_efficiency must be in (0, 1]");
  expect_rejected(R"({"device": {"end_to_end_mfu": 0}})", "scenario: device.end_to_end_mfu must be in (0, 1]");
  expect_rejected(R"({"device": {"duplex_factor": 0.4}})",
                  "scenario: device.duplex_factor must be in [0.5, 1] (0.5: the two directions share one rate; 1: "
                  "full duplex)");
  expect_rejected(R"({"device": {"nvlink_gbps": 0}})", "scenario: device.nvlink_gbps must be positive");
  expect_rejected(R"({"device": {"network_gbps": -1}})", "scenario: device.network_gbps must be positive");
  expect_rejected(R"({"node": {"host_gbps": 0}})", "scenario: node.host_gbps must be positive");
  expect_rejected(R"({"node": {"gpus": 0}})", "scenario: node.gpus must be at least 1");
  expect_rejected(R"({"parallel": {"tp": -2}})", "scenario: parallel.tp: must not be negative, got -2");
  expect_rejected(R"({"parallel": {"dp": 0}})", "scenario: parallel.dp must be at least 1");
  expect_rejected(R"({"device": {"network_latency_us": -1}})",
                  "scenario: device.network_latency_us must not be negative");
  // The old name is refused with what replaced it.
  expect_rejected(R"({"device": {"mfu": 0.45}})",
                  "scenario: device.mfu: was renamed: device.kernel_efficiency is the fraction of the peak the "
                  "kernels reach (bubble excluded); device.end_to_end_mfu takes a published MFU (bubble included)");
  expect_rejected(R"({"device": {"copy_latency_us": -1}})", "scenario: device.copy_latency_us must not be negative");
}

BOOST_AUTO_TEST_CASE(wrong_types_are_rejected) {
  expect_rejected(R"([])", "scenario: top level: expected an object, got array []");
  expect_rejected(R"({"model": 3})", "scenario: model: expected an object, got number 3");
  expect_rejected(R"({"model": {"layers": "80"}})",
                  "scenario: model.layers: expected a non-negative integer, got string \"80\"");
  expect_rejected(R"({"model": {"name": 7}})", "scenario: model.name: expected a string, got number 7");
  expect_rejected(R"({"model": {"fp32_master": 1}})",
                  "scenario: model.fp32_master: expected true or false, got number 1");
  expect_rejected(R"({"device": {"h2d_gbps": "fast"}})",
                  "scenario: device.h2d_gbps: expected a number, got string \"fast\"");
  expect_rejected(R"({"model": {"param_dtype": "I8"}})",
                  "scenario: model.param_dtype: expected \"BF16\", \"F16\" or \"F32\", got string \"I8\"");
  expect_rejected(R"({"pipeline": {"schedule": "zb"}})",
                  "scenario: pipeline.schedule: expected \"gpipe\", \"1f1b\" or \"interleaved\", got string \"zb\"");
  expect_rejected(R"({"model": {"mlp": "relu"}})",
                  "scenario: model.mlp: expected one of \"swiglu\", \"gelu\", got string \"relu\"");
  expect_rejected(R"({"model": {"recompute": true}})",
                  "scenario: model.recompute: expected one of \"none\", \"selective\", \"full\", \"op\", got boolean "
                  "true");
  expect_rejected(R"({"parallel": {"dp": 2, "fsdp": true}})",
                  "scenario: parallel.fsdp needs parallel.distributed_optimizer (FSDP shards the optimizer state as it "
                  "does, and the weights and gradients too)");
  expect_rejected(R"({"model": {"recompute": "op", "mlp": "gelu"}})",
                  "scenario: model.recompute \"op\" (torchtitan's per-operation policy) is modelled for dense SwiGLU "
                  "layers with flash attention (no model.moe, model.mlp \"swiglu\", model.flash_attention)");
  expect_rejected(R"({"model": {"grad_dtype": "I8"}})",
                  "scenario: model.grad_dtype: expected \"FP32\", \"BF16\", \"F16\" or null, got string \"I8\"");
  expect_rejected(R"({"model": {"dropout": "no"}})",
                  "scenario: model.dropout: expected true or false, got string \"no\"");
  expect_rejected(R"({"model": {"loss": "torch"}})",
                  "scenario: model.loss: expected one of \"fused\", \"pytorch\", got string \"torch\"");
  expect_rejected(R"({"model": {"fused_kernels": 0}})",
                  "scenario: model.fused_kernels: expected true or false, got number 0");
  expect_rejected(R"({"swap": {"overlap": 1}})", "scenario: swap.overlap: expected true or false, got number 1");
  expect_rejected(R"({"swap": {"overlap": "yes"}})",
                  "scenario: swap.overlap: expected true or false, got string \"yes\"");
  expect_rejected(R"({"parallel": {"sequence_parallel": 1}})",
                  "scenario: parallel.sequence_parallel: expected true or false, got number 1");
  expect_rejected(R"({"parallel": {"pp": 2}})", "scenario: parallel: unknown key 'pp' (did you mean 'tp'?)");
  expect_rejected(R"({"node": {"gpu": 2}})", "scenario: node: unknown key 'gpu' (did you mean 'gpus'?)");
  expect_rejected(R"({"model": {"layers": null}})",
                  "scenario: model.layers: expected a non-negative integer, got null null");
}

BOOST_AUTO_TEST_CASE(malformed_json_names_the_byte) {
  try {
    (void)sim::scenario_from_json_text(R"({"model": {"layers": 3,}})");
    BOOST_ERROR("no exception");
  } catch (pipeswap::invalid_argument const& e) {
    std::string const what = e.what();
    BOOST_TEST(what.rfind("scenario: malformed JSON at byte 24: ", 0) == 0, what);
  }
}

BOOST_AUTO_TEST_CASE(inconsistent_scenarios_are_rejected) {
  auto with = [](json patch) {
    auto j = small();
    j.merge_patch(patch);
    return j.dump();
  };
  BOOST_TEST(sim::scenario_from_json_text(with(json::object())).pipeline.ranks == 2u); // the base is valid
  expect_rejected(with({{"model", {{"layers", 0}}}}), "scenario: model.layers must be at least 1");
  expect_rejected(with({{"model", {{"kv_heads", 3}}}}),
                  "scenario: model.heads (4) must be a multiple of model.kv_heads (3)");
  expect_rejected(with({{"model", {{"layers", 1}}}}),
                  "scenario: model.layers (1) must be at least the number of stages (pipeline.ranks × "
                  "pipeline.stages_per_rank = 2)");
  expect_rejected(with({{"pipeline", {{"stages_per_rank", 2}}}}),
                  "scenario: pipeline.stages_per_rank > 1 needs the interleaved schedule");
  expect_rejected(with({{"pipeline", {{"micro_batches", 0}}}}), "scenario: pipeline.micro_batches must be at least 1");
  expect_rejected(with({{"swap", {{"swap_times", 0}}}}), "scenario: swap.swap_times must be positive");
  expect_rejected(with({{"model", {{"param_dtype", "F32"}}}}), "scenario: model.fp32_master needs BF16 or F16 weights");
  expect_rejected(with({{"device", {{"memory_bytes", 1000}, {"reserved_bytes", 1000}}}}),
                  "scenario: device.memory_bytes must exceed device.reserved_bytes");
  expect_rejected(with({{"pipeline", {{"ranks", 2000}}}, {"model", {{"layers", 4000}}}}),
                  "scenario: pipeline.ranks (2000) is above the limit of 1024");
  expect_rejected(with({{"parallel", {{"tp", 3}}}}), "scenario: model.heads (4) must be a multiple of parallel.tp (3)");
  expect_rejected(with({{"parallel", {{"tp", 4}}}}),
                  "scenario: model.kv_heads (2) must be a multiple of parallel.tp (4)");
  expect_rejected(with({{"parallel", {{"sequence_parallel", true}}}}),
                  "scenario: parallel.sequence_parallel needs parallel.tp > 1");
  expect_rejected(with({{"parallel", {{"tp", 2}, {"save_gathered_inputs", true}}}}),
                  "scenario: parallel.save_gathered_inputs needs parallel.sequence_parallel (without it every "
                  "input is whole already)");
  expect_rejected(with({{"parallel", {{"distributed_optimizer", true}}}}),
                  "scenario: parallel.distributed_optimizer needs parallel.dp > 1");
  expect_rejected(with({{"parallel", {{"tp", 2}}}, {"node", {{"gpus", 1}}}}),
                  "scenario: parallel.tp (2) must not exceed node.gpus (1): tensor parallelism runs over NVLink "
                  "inside a node");
  expect_rejected(with({{"parallel", {{"dp", 70000}}}}), "scenario: parallel.dp (70000) is above the limit of 65536");
  expect_rejected(with({{"model", {{"hidden", 1ull << 40}, {"heads", 1}, {"kv_heads", 1}}}}),
                  "scenario: the model's size overflows byte counts (about 1.93e+25 parameters); check "
                  "model.layers, model.hidden, model.ffn_hidden and model.vocab");
}

BOOST_AUTO_TEST_CASE(impossible_fits_are_rejected) {
  // small(): 4 layers on 2 ranks. Rank 0 holds the embedding and layers 0-1; rank 1 layers 2-3, the
  // final norm and the head. Per layer: q, o 256² each, k, v 256·128 each, gate, up, down 256·512 each,
  // two norms of 256.
  std::uint64_t const layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512 + 2 * 256;
  std::uint64_t const rank0 = 100 * 256 + 2 * layer, rank1 = 2 * layer + 256 + 100 * 256;
  auto s = sim::scenario_from_json(small());
  // BF16 weights and F32 gradients (2 + 4 bytes per parameter) never leave the device.
  BOOST_TEST(sim::unswappable_bytes(s, 0) == 6 * rank0);
  BOOST_TEST(sim::unswappable_bytes(s, 1) == 6 * rank1);
  s.device.reserved_bytes = 1000;
  BOOST_TEST(sim::unswappable_bytes(s, 1) == 1000 + 6 * rank1);
  s.model.grad_dtype = pipeswap::dtype::bf16; // 2 + 2
  BOOST_TEST(sim::unswappable_bytes(s, 1) == 1000 + 4 * rank1);

  auto j = small();
  j["device"]["memory_bytes"] = 6 * rank1 + 999; // enough for rank 0, one byte short for rank 1
  j["device"]["reserved_bytes"] = 1000;
  expect_rejected(j.dump(), "scenario: device.memory_bytes (" + std::to_string(6 * rank1 + 999) +
                                ") cannot fit rank 1 whatever is swapped: its weights and gradients plus "
                                "device.reserved_bytes need " +
                                std::to_string(6 * rank1 + 1000) +
                                " bytes (use more pipeline.ranks or a larger device)");
  j["device"]["memory_bytes"] = 6 * rank1 + 1000; // exactly enough
  BOOST_TEST(sim::scenario_from_json(j).device.memory_bytes == 6 * rank1 + 1000);
}

BOOST_AUTO_TEST_CASE(the_default_scenario_is_valid_and_named_in_json) {
  sim::scenario const s;
  BOOST_CHECK_NO_THROW(sim::validate(s));
  BOOST_CHECK_NO_THROW(sim::check_limits(s));
  BOOST_CHECK_NO_THROW(sim::check_fits(s));
  for (auto k : {sim::schedule_kind::gpipe, sim::schedule_kind::one_f_one_b, sim::schedule_kind::interleaved})
    BOOST_TEST((sim::schedule_kind_from_name(sim::schedule_kind_name(k)) == k));
  BOOST_TEST(!sim::schedule_kind_from_name("1F1B").has_value());
}

namespace {

/// The dotted path of every number in `j` (every numeric field of the schema when `j` sets them all).
void numeric_paths(json const& j, std::string const& at, std::vector<std::string>& out) {
  for (auto const& [k, v] : j.items()) {
    auto const path = at.empty() ? k : at + "." + k;
    if (v.is_object())
      numeric_paths(v, path, out);
    else if (v.is_number())
      out.push_back(path);
  }
}

json& at_path(json& j, std::string const& path) {
  json* p = &j;
  std::size_t from = 0;
  for (;;) {
    auto const dot = path.find('.', from);
    p = &(*p)[path.substr(from, dot == std::string::npos ? std::string::npos : dot - from)];
    if (dot == std::string::npos) return *p;
    from = dot + 1;
  }
}

} // namespace

// Every numeric field of the schema (every_field() sets them all), set to 0, to a negative value and
// to a string: each is either accepted (0 where the field allows it, listed below) or rejected with a
// message that names the field.
BOOST_AUTO_TEST_CASE(every_numeric_field_error_names_its_field) {
  std::vector<std::string> paths;
  numeric_paths(every_field(), "", paths);
  BOOST_TEST(paths.size() == 46u); // every number of the schema (a new field is swept here too)
  std::vector<std::string> zero_ok;
  for (auto const& path : paths) {
    for (json const& bad : {json(0), json(-1), json(-2.5), json("8")}) {
      auto j = every_field();
      at_path(j, path) = bad;
      BOOST_TEST_CONTEXT(path << " = " << bad.dump()) {
        try {
          (void)sim::scenario_from_json(j);
          BOOST_TEST(bad == json(0)); // only a 0 can be valid
          zero_ok.push_back(path);
        } catch (pipeswap::invalid_argument const& e) {
          std::string const what = e.what();
          BOOST_TEST(what.find(path) != std::string::npos, "the message names " << path << ": " << what);
        }
      }
    }
  }
  // In the order of the sweep (nlohmann::json sorts keys); an activation override of 0 models a
  // stage that saves nothing, a MoE host time of 0 a layer the host issues ahead.
  std::vector<std::string> const allowed{"device.copy_latency_us",
                                         "device.network_latency_us",
                                         "device.nvlink_latency_us",
                                         "device.p2p_latency_us",
                                         "device.reserved_bytes",
                                         "model.activation_bytes_per_layer",
                                         "model.moe.host_layer_ms",
                                         "model.moe.shared_expert_ffn_hidden",
                                         "plan.tolerance"};
  BOOST_TEST(zero_ok == allowed, boost::test_tools::per_element());
  // The case the sweep was written for.
  expect_rejected(R"({"model": {"vocab": 0}})", "scenario: model.vocab must be at least 1");
}

// A device named from the table takes its published figures; the section's other fields override
// them, whatever their order; an unknown name is refused with the table's names.
BOOST_AUTO_TEST_CASE(a_device_preset_sets_the_published_figures) {
  for (auto const& x : sim::device_presets) {
    auto const s = sim::scenario_from_json(
        json{{"device", {{"preset", std::string(x.name)}}}, {"model", {{"layers", 8}}}, {"pipeline", {{"ranks", 8}}}});
    BOOST_TEST(s.device.name == std::string(x.name));
    BOOST_TEST(s.device.bf16_tflops == x.bf16_tflops);
    BOOST_TEST(s.device.fp8_tflops == x.fp8_tflops);
    BOOST_TEST(s.device.hbm_tbps == x.hbm_tbps);
    BOOST_TEST(s.device.memory_bytes == x.memory_bytes);
    BOOST_TEST(s.device.nvlink_gbps == x.nvlink_gbps);
  }
  auto const h100 = sim::scenario_from_json_text(
      R"({"device": {"hbm_tbps": 2.4, "preset": "H100 SXM", "name": "H100 96 GB", "memory_bytes": 96000000000},
          "model": {"layers": 8}, "pipeline": {"ranks": 8}})");
  BOOST_TEST(h100.device.hbm_tbps == 2.4);
  BOOST_TEST(h100.device.name == "H100 96 GB");
  BOOST_TEST(h100.device.memory_bytes == 96'000'000'000u);
  BOOST_TEST(h100.device.fp8_tflops == 1979.0);
  expect_rejected(R"({"device": {"preset": "A100"}})",
                  "scenario: device.preset: expected one of \"H100 SXM\", \"H200\", \"B200\", got string \"A100\"");
  expect_rejected(R"({"device": {"preset": 100}})",
                  "scenario: device.preset: expected one of \"H100 SXM\", \"H200\", \"B200\", got number 100");
}

// The precision and the compute model are names; anything else is refused naming the field.
BOOST_AUTO_TEST_CASE(precision_and_compute_errors_name_their_field) {
  expect_rejected(R"({"model": {"precision": "FP16"}})",
                  "scenario: model.precision: expected one of \"BF16\", \"FP8\", got string \"FP16\"");
  expect_rejected(R"({"model": {"precision": 8}})",
                  "scenario: model.precision: expected one of \"BF16\", \"FP8\", got number 8");
  expect_rejected(R"({"device": {"compute": "measured"}})",
                  "scenario: device.compute: expected one of \"roofline\", \"flops\", got string \"measured\"");
  expect_rejected(R"({"device": {"fp8_tflops": 0}})", "scenario: device.fp8_tflops must be positive");
  auto const fp8 = sim::scenario_from_json_text(R"({"model": {"precision": "FP8"}})");
  BOOST_TEST((fp8.model.precision == sim::precision::fp8));
  BOOST_TEST((fp8.model.fp8_library == sim::fp8_library_kind::transformer_engine));
  expect_rejected(
      R"({"model": {"fp8_library": "te"}})",
      "scenario: model.fp8_library: expected one of \"transformer_engine\", \"torchao\", got string \"te\"");
  expect_rejected(R"({"model": {"moe": {"experts": 8, "dispatch": "deepep"}}})",
                  "scenario: model.moe.dispatch: expected one of \"all_to_all\", \"per_node\", got string \"deepep\"");
  auto const ao = sim::scenario_from_json_text(R"({"model": {"precision": "FP8", "fp8_library": "torchao"}})");
  BOOST_TEST((ao.model.fp8_library == sim::fp8_library_kind::torchao));
}
