// pipeswap — a scenario from the arguments a Megatron-LM job runs with (`pipeswap scenario
// --megatron FILE`), so that a user starts from the layout they train with, not from a blank file.
//
// The text is either a launch command line (torchrun's flags and pretrain_gpt.py's, with shell
// quotes, backslash-newlines and # comments) or the MODEL_ARGS block of a Megatron-LM test's
// model_config.yaml ("--flag: value" lines; a value "[a, b]" is a list). Every flag is read by
// Megatron's own name and with Megatron's own default where the text leaves it out (the dropouts
// 0.1, top-2 routing, the allgather dispatcher, fp32 weights without --bf16, the overlaps off,
// --ffn-hidden-size 4h or, with --swiglu, 8h/3 rounded down to a multiple of 64, the vocabulary
// padded to a multiple of --make-vocab-size-divisible-by × tp). What the arguments do not hold comes
// from `megatron_launch`: the GPU count (else torchrun's --nnodes × --nproc-per-node), the GPUs per
// node, the device preset and the tokenizer's vocabulary (else --vocab-size).
//
// What the simulator cannot describe is an error naming the flag (context parallelism, multi-latent
// attention, MoE layers not on every layer); what it approximates is a note (the allgather
// dispatcher as an all-to-all, FP8 recipes other than per-tensor, partial recomputation, a custom
// pipeline split), and so is every flag it did not read. The scenario is then read as a scenario
// file is (scenario_from_json), so every scenario rule holds; its errors name the scenario field.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/error.hpp>
#include <pipeswap/sim/scenario.hpp>
#include <pipeswap/sim/scenario_json.hpp>

namespace pipeswap::sim {

/// What a Megatron-LM job's arguments leave to its launcher and its tokenizer.
struct megatron_launch {
  std::optional<std::uint64_t> gpus;          ///< all GPUs; unset: torchrun's --nnodes × --nproc-per-node
  std::optional<std::uint32_t> gpus_per_node; ///< unset: torchrun's --nproc-per-node, else 8
  std::optional<std::string> device;          ///< a device preset ("H100 SXM", "H200", "B200"); unset: the default
  std::optional<std::uint64_t> vocab;         ///< the tokenizer's size; unset: --vocab-size
  std::string name;                           ///< the model's name in reports; empty: "Megatron-LM model"
};

/// The scenario, and what it approximates or left unread, one line each.
struct megatron_scenario {
  scenario s;
  std::vector<std::string> notes;
};

namespace detail::megatron {

[[noreturn]] inline void fail(std::string_view flag, std::string const& what) {
  throw invalid_argument("megatron arguments: " + std::string(flag.empty() ? "" : "--") + std::string(flag) +
                         (flag.empty() ? "" : ": ") + what);
}

/// Shell-like words: whitespace separates, quotes group, a backslash-newline joins lines, and a word
/// starting with # comments out the rest of its line.
inline std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char const c = text[i];
    if (c == '\\' && i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) {
      while (i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) out.push_back(std::exchange(cur, {}));
      in_word = false;
      continue;
    }
    if (!in_word && c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    in_word = true;
    if (c == '"' || c == '\'') {
      auto const end = text.find(c, i + 1);
      if (end == std::string_view::npos) fail("", std::string("a quote (") + c + ") is not closed");
      cur.append(text.substr(i + 1, end - i - 1));
      i = end;
      continue;
    }
    cur.push_back(c);
  }
  if (in_word) out.push_back(cur);
  return out;
}

/// The flags and their values, by Megatron's name (dashes, no leading "--"; torchrun's underscores
/// read as dashes), and which of them were read.
class arguments {
public:
  explicit arguments(std::string_view text) {
    auto const w = words(text);
    std::optional<std::string> flag; // the flag the next values belong to
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::string t = w[i];
      if (t.size() > 2 && t.starts_with("--")) {
        t.erase(0, 2);
        std::optional<std::string> inline_value;
        if (auto const eq = t.find('='); eq != std::string::npos) {
          inline_value = t.substr(eq + 1);
          t.erase(eq);
        }
        if (t.ends_with(':')) t.pop_back(); // YAML: "--flag: value"
        std::replace(t.begin(), t.end(), '_', '-');
        order_.push_back(t);
        auto& v = values_[t];
        v.clear(); // the last occurrence wins, as in argparse
        if (inline_value) v.push_back(*inline_value);
        flag = t;
        continue;
      }
      if (!flag) continue; // the launcher, the script, "MODEL_ARGS:" and the like
      auto& v = values_[*flag];
      if (t.starts_with('[')) { // a YAML list: [a, b, c] over one or more words
        std::string list = t;
        while (!list.ends_with(']') && i + 1 < w.size()) list += " " + w[++i];
        list = list.substr(1, list.ends_with(']') ? list.size() - 2 : list.size() - 1);
        std::size_t start = 0;
        while (start <= list.size()) {
          auto const comma = std::min(list.find(',', start), list.size());
          auto item = list.substr(start, comma - start);
          item.erase(0, item.find_first_not_of(" \"'"));
          item.erase(item.find_last_not_of(" \"'") + 1);
          if (!item.empty()) v.push_back(item);
          start = comma + 1;
        }
        continue;
      }
      v.push_back(t);
    }
  }

  [[nodiscard]] bool has(std::string const& f) const { return values_.contains(f); }

  /// The flag's values (marking it read); empty when absent or given without a value.
  std::vector<std::string> const& values(std::string const& f) {
    read_.insert(f);
    static std::vector<std::string> const none;
    auto const it = values_.find(f);
    return it == values_.end() ? none : it->second;
  }

  /// A store_true flag: present, and not given "false".
  bool flag(std::string const& f) {
    if (!has(f)) return (read_.insert(f), false);
    auto const& v = values(f);
    return v.empty() || (v.front() != "false" && v.front() != "False");
  }

  std::optional<std::string> text(std::string const& f) {
    auto const& v = values(f);
    if (!has(f)) return std::nullopt;
    if (v.empty()) fail(f, "needs a value");
    return v.front();
  }

  std::optional<std::uint64_t> count(std::string const& f) {
    auto const t = text(f);
    if (!t || *t == "None" || *t == "null") return std::nullopt;
    std::uint64_t x = 0;
    auto const [p, ec] = std::from_chars(t->data(), t->data() + t->size(), x);
    if (ec != std::errc{} || p != t->data() + t->size()) fail(f, "expected a whole number, got \"" + *t + "\"");
    return x;
  }

  std::optional<double> number(std::string const& f) {
    auto const t = text(f);
    if (!t || *t == "None" || *t == "null") return std::nullopt;
    char* end = nullptr;
    double const x = std::strtod(t->c_str(), &end);
    if (end != t->c_str() + t->size() || !std::isfinite(x)) fail(f, "expected a number, got \"" + *t + "\"");
    return x;
  }

  /// The flags given and never read, in the order given.
  [[nodiscard]] std::vector<std::string> unread() const {
    std::vector<std::string> out;
    for (auto const& f : order_)
      if (!read_.contains(f) && std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
    return out;
  }

private:
  std::vector<std::string> order_;
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> read_;
};

inline std::string joined(std::vector<std::string> const& v, std::string_view sep = ", ") {
  std::string out;
  for (auto const& x : v) out += (out.empty() ? "" : std::string(sep)) + x;
  return out;
}

} // namespace detail::megatron

/// The scenario a Megatron-LM job's arguments describe (see the header comment). Throws
/// invalid_argument naming the flag (or, from the scenario's own rules, the scenario field).
inline megatron_scenario scenario_from_megatron_args(std::string_view text, megatron_launch const& launch = {}) {
  using detail::megatron::fail;
  detail::megatron::arguments a(text);
  megatron_scenario out;
  auto note = [&](std::string n) { out.notes.push_back(std::move(n)); };
  auto required = [&](char const* f) {
    auto const x = a.count(f);
    if (!x || *x == 0) fail(f, "is required (a positive whole number)");
    return *x;
  };

  // What the simulator cannot describe.
  if (auto const cp = a.count("context-parallel-size"); cp && *cp > 1)
    fail("context-parallel-size", "context parallelism is not modelled");
  if (a.flag("multi-latent-attention")) fail("multi-latent-attention", "multi-latent attention is not modelled");
  if (auto const freq = a.text("moe-layer-freq"); freq && *freq != "1")
    fail("moe-layer-freq", "only every layer an MoE layer (1) is modelled, got \"" + *freq + "\"");

  // The layout.
  std::uint64_t const tp = a.count("tensor-model-parallel-size").value_or(1);
  std::uint64_t const pp = a.count("pipeline-model-parallel-size").value_or(1);
  std::uint64_t const layers = required("num-layers");
  std::optional<std::uint64_t> gpus = launch.gpus;
  auto const nproc = a.count("nproc-per-node");
  auto const nnodes = a.count("nnodes");
  if (!gpus && nproc) gpus = *nproc * nnodes.value_or(1);
  if (!gpus || *gpus == 0)
    fail("", "the number of GPUs: give pipeswap scenario --gpus N, or torchrun's --nnodes and --nproc-per-node");
  if (tp == 0 || pp == 0 || *gpus % (tp * pp) != 0)
    fail("", std::to_string(*gpus) +
                 " GPUs are not a multiple of --tensor-model-parallel-size × "
                 "--pipeline-model-parallel-size (" +
                 std::to_string(tp) + " × " + std::to_string(pp) + ")");
  std::uint64_t const dp = *gpus / (tp * pp);
  std::uint64_t stages = 1;
  if (auto const v = a.count("num-virtual-stages-per-pipeline-rank"))
    stages = *v;
  else if (auto const v2 = a.count("virtual-pipeline-model-parallel-size"))
    stages = *v2;
  else if (auto const per = a.count("num-layers-per-virtual-pipeline-stage")) {
    if (*per == 0 || layers % (pp * *per) != 0)
      fail("num-layers-per-virtual-pipeline-stage", std::to_string(layers) + " layers do not split into " +
                                                        std::to_string(pp) + " ranks of stages of " +
                                                        std::to_string(*per));
    stages = layers / (pp * *per);
  }
  if (stages == 0) stages = 1;
  for (char const* f :
       {"pipeline-model-parallel-layout", "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
        "account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split"})
    if (a.has(f)) {
      a.values(f);
      note(std::string("--") + f + ": the simulator splits the layers over the stages by its own rule");
    }
  std::uint64_t const mbs = a.count("micro-batch-size").value_or(1);
  std::uint64_t const gbs = a.count("global-batch-size").value_or(mbs * dp);
  if (mbs == 0 || gbs % (mbs * dp) != 0)
    fail("global-batch-size", std::to_string(gbs) + " is not a multiple of --micro-batch-size × the data-parallel " +
                                  "degree (" + std::to_string(mbs) + " × " + std::to_string(dp) + ")");

  // The model.
  nlohmann::ordered_json j;
  auto& m = j["model"];
  m["name"] = launch.name.empty() ? std::string("Megatron-LM model") : launch.name;
  m["layers"] = layers;
  std::uint64_t const h = required("hidden-size");
  std::uint64_t const heads = required("num-attention-heads");
  bool const swiglu = a.flag("swiglu");
  m["hidden"] = h;
  m["ffn_hidden"] = a.count("ffn-hidden-size").value_or(swiglu ? (4 * h * 2 / 3) / 64 * 64 : 4 * h);
  m["heads"] = heads;
  m["kv_heads"] = a.flag("group-query-attention") ? a.count("num-query-groups").value_or(1) : heads;
  if (auto const d = a.count("kv-channels")) m["head_dim"] = *d;
  std::optional<std::uint64_t> vocab = launch.vocab;
  if (auto const v = a.count("vocab-size"); v && !vocab) vocab = v;
  if (!vocab)
    fail("", "the vocabulary: give --vocab-size in the arguments or pipeswap scenario --vocab (the tokenizer's size)");
  std::uint64_t const multiple = a.count("make-vocab-size-divisible-by").value_or(128) * tp;
  m["vocab"] = (*vocab + multiple - 1) / multiple * multiple; // Megatron's padded vocabulary
  m["seq_len"] = required("seq-length");
  m["micro_batch_size"] = mbs;
  bool const bf16 = a.flag("bf16"), fp16 = a.flag("fp16");
  m["param_dtype"] = bf16 ? "BF16" : fp16 ? "F16" : "F32";
  if (!bf16 && !fp16) m["fp32_master"] = false;
  if (a.flag("grad-reduce-in-bf16")) m["grad_dtype"] = "BF16";
  auto const backend = a.text("attention-backend");
  m["flash_attention"] = !(backend && (*backend == "unfused" || *backend == "local"));
  a.flag("use-flash-attn");
  m["mlp"] = swiglu ? "swiglu" : "gelu";
  m["dropout"] = a.number("hidden-dropout").value_or(0.1) > 0 || a.number("attention-dropout").value_or(0.1) > 0;
  if (auto const fmt = a.text("fp8-format")) {
    if (*fmt != "e4m3" && *fmt != "hybrid") fail("fp8-format", "expected e4m3 or hybrid, got \"" + *fmt + "\"");
    m["precision"] = "FP8";
    auto const recipe = a.text("fp8-recipe").value_or("delayed");
    if (recipe != "delayed" && recipe != "tensorwise")
      note("--fp8-recipe " + recipe + ": modelled as per-tensor FP8 at the device's FP8 peak");
  } else if (a.has("fp8-recipe")) {
    a.values("fp8-recipe");
    note("--fp8-recipe without --fp8-format: the GEMMs stay 16-bit");
  }
  // Recomputation: Megatron's selective recomputes the attention core unless --recompute-modules
  // says otherwise; full recomputes every layer of a uniform method, the first N of each stage of a
  // block one.
  if (auto const g = a.text("recompute-granularity")) {
    if (*g == "full") {
      m["recompute"] = "full";
      auto const method = a.text("recompute-method").value_or("uniform");
      auto const n = a.count("recompute-num-layers").value_or(1);
      std::uint64_t const per_stage = layers / (pp * stages);
      if (method == "block" && n == 0)
        m["recompute"] = "none";
      else if (method == "block" && n < per_stage)
        note("--recompute-method block --recompute-num-layers " + std::to_string(n) + ": recomputes " +
             std::to_string(n) + " of each stage's " + std::to_string(per_stage) +
             " layers; modelled as every layer (full): the step a bound from above, the peak from below");
    } else if (*g == "selective") {
      auto others = a.values("recompute-modules"); // those besides the attention core, once it is erased
      bool const core = others.empty() || std::erase(others, std::string("core_attn")) > 0;
      m["recompute"] = core ? "selective" : "none";
      if (!others.empty())
        note("--recompute-modules " + detail::megatron::joined(others, " ") +
             ": not modelled (only core_attn, the attention core); those activations are kept");
    } else {
      fail("recompute-granularity", "expected full or selective, got \"" + *g + "\"");
    }
  }
  if (!a.flag("disable-bias-linear")) note("linear biases (Megatron's default) are not counted");

  // Mixture of experts.
  std::uint64_t const experts = a.count("num-experts").value_or(0);
  std::uint64_t const ep = a.count("expert-model-parallel-size").value_or(1);
  if (experts > 0) {
    auto& e = m["moe"];
    e["experts"] = experts;
    e["top_k"] = a.count("moe-router-topk").value_or(2);
    e["expert_ffn_hidden"] = a.count("moe-ffn-hidden-size").value_or(m["ffn_hidden"].get<std::uint64_t>());
    if (auto const s = a.count("moe-shared-expert-intermediate-size")) e["shared_expert_ffn_hidden"] = *s;
    bool const pad = a.flag("moe-pad-expert-input-to-capacity");
    if (auto const c = a.number("moe-expert-capacity-factor")) {
      e["capacity_factor"] = *c;
      e["pad_to_capacity"] = pad;
    }
    auto const dispatcher = a.text("moe-token-dispatcher-type").value_or("allgather");
    if (dispatcher == "flex" || a.flag("moe-enable-deepep")) {
      e["dispatch"] = "per_node";
      a.text("moe-flex-dispatcher-backend");
    } else if (dispatcher == "allgather") {
      note("--moe-token-dispatcher-type allgather (Megatron's default): modelled as the alltoall dispatcher");
    } else if (dispatcher != "alltoall") {
      fail("moe-token-dispatcher-type", "expected allgather, alltoall or flex, got \"" + dispatcher + "\"");
    }
    // A CUDA graph that captures the whole layer (or the whole iteration) leaves the host nothing to
    // issue per layer; Megatron-Core captures an MoE layer whole only with its input padded.
    auto impl = a.text("cuda-graph-impl").value_or("none");
    if (a.flag("enable-cuda-graph")) impl = "local";
    if (a.flag("external-cuda-graph")) impl = "transformer_engine";
    auto const& scope = a.values("cuda-graph-scope");
    bool const whole_layer = impl == "local" && (scope.empty() || scope == std::vector<std::string>{"full"});
    if (impl == "full_iteration" || (whole_layer && pad && e.contains("capacity_factor")))
      e["host_layer_ms"] = 0.0;
    else if (impl != "none")
      note("--cuda-graph-impl " + impl +
           (scope.empty() ? "" : " --cuda-graph-scope " + detail::megatron::joined(scope, " ")) +
           ": a partial CUDA graph is not modelled; the host issues each MoE layer kernel by kernel");
    if (!a.flag("moe-router-force-load-balancing"))
      note("routing taken as balanced (model.moe.load_imbalance 1); the run balances with its auxiliary loss");
    if (!a.flag("moe-grouped-gemm"))
      note("without --moe-grouped-gemm Megatron runs the experts one after another; modelled as grouped");
  } else if (a.has("cuda-graph-impl") || a.has("enable-cuda-graph")) {
    a.text("cuda-graph-impl");
    a.flag("enable-cuda-graph");
  }

  // Parallelism.
  auto& p = j["parallel"];
  p["tp"] = tp;
  // Megatron turns sequence parallelism off without tensor parallelism (arguments.py)
  p["sequence_parallel"] = a.flag("sequence-parallel") && tp > 1;
  p["dp"] = dp;
  p["distributed_optimizer"] = a.flag("use-distributed-optimizer");
  if (a.flag("use-torch-fsdp2") || a.flag("use-megatron-fsdp") || a.flag("use-custom-fsdp")) {
    p["fsdp"] = true;
    p["distributed_optimizer"] = true; // the scenario's FSDP shards the optimizer state as well
    note("FSDP: modelled as FSDP2 shards the weights, gradients and state, with its collectives layer by layer");
  }
  if (experts > 0) {
    p["ep"] = ep;
    auto const etp = a.count("expert-tensor-parallel-size");
    if (etp) p["expert_tp"] = *etp; // unset: tp, as in Megatron
    if (auto const rd = a.text("moe-router-dtype"); rd && *rd != "None" && etp.value_or(tp) > 1)
      note("--moe-router-dtype " + *rd + ": the expert-TP reduce-scatter runs in it; modelled at 16 bits");
  } else if (ep > 1) {
    fail("expert-model-parallel-size", "needs --num-experts");
  }
  p["overlap_grad_reduce"] = a.flag("overlap-grad-reduce");
  p["overlap_param_gather"] = a.flag("overlap-param-gather");
  p["tp_comm_overlap"] = a.flag("tp-comm-overlap");
  bool const a2a_overlap = a.flag("overlap-moe-expert-parallel-comm");
  p["overlap_moe_expert_parallel_comm"] = a2a_overlap;

  // The pipeline.
  auto& pl = j["pipeline"];
  pl["schedule"] = stages > 1 ? "interleaved" : "1f1b";
  pl["ranks"] = pp;
  pl["micro_batches"] = gbs / (mbs * dp);
  pl["stages_per_rank"] = stages;
  if (a2a_overlap && experts > 0) {
    if (stages > 1)
      pl["overlap_b_f"] = true;
    else
      note("--overlap-moe-expert-parallel-comm without an interleaved pipeline: the all-to-alls stay exposed");
  }

  // The machine.
  if (launch.device)
    j["device"]["preset"] = *launch.device;
  else
    note("device: the default (" + device_spec{}.name + "); pipeswap scenario --device names yours");
  j["node"]["gpus"] = launch.gpus_per_node ? *launch.gpus_per_node : nproc ? static_cast<std::uint32_t>(*nproc) : 8u;

  j["comment"] = "From Megatron-LM arguments (pipeswap scenario --megatron) on " + std::to_string(*gpus) + " GPUs" +
                 (out.notes.empty() ? std::string() : "; " + detail::megatron::joined(out.notes, "; "));
  // Flags the model has no field for, whose effect it takes as given (the layers are Megatron-Core's
  // Transformer Engine ones with RMSNorm or LayerNorm and rotary or learned positions, untied output).
  for (char const* f : {"nnodes", "nproc-per-node", "use-mcore-models", "transformer-impl", "normalization",
                        "position-embedding-type", "untie-embeddings-and-output-weights", "max-position-embeddings",
                        "rotary-percent", "moe-router-load-balancing-type", "moe-aux-loss-coeff"})
    a.values(f);
  if (auto const unread = a.unread(); !unread.empty())
    note("not read by the simulator: --" + detail::megatron::joined(unread, ", --"));
  try {
    out.s = scenario_from_json(j);
  } catch (invalid_argument const& e) {
    throw invalid_argument(std::string(e.what()) + " (from the Megatron arguments)");
  }
  return out;
}

} // namespace pipeswap::sim
