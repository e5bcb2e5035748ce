// pipeswap — scenario files: the simulator's scenario as JSON, read strictly and written in full.
//
// A scenario file is one object with up to seven sections; every field is optional and defaults to
// the built-in scenario (sim::scenario{}), so `{}` is the default scenario:
//
//   {"model":    {"name": "...", "layers": 80, "hidden": 8192, "ffn_hidden": 28672, "heads": 64,
//                 "kv_heads": 8, "vocab": 32000, "seq_len": 4096, "micro_batch_size": 1,
//                 "param_dtype": "BF16", "grad_dtype": null, "fp32_master": true,
//                 "flash_attention": true, "mlp": "swiglu", "dropout": false, "recompute": "none",
//                 "activation_bytes_per_layer": null, "head_dim": null, "precision": "BF16",
//                 "fp8_library": "transformer_engine", "fused_kernels": true, "loss": "fused",
//                 "moe": {"experts": 0, "top_k": 1, "expert_ffn_hidden": 0, "shared_expert_ffn_hidden": 0,
//                         "capacity_factor": null, "pad_to_capacity": false, "load_imbalance": 1,
//                         "host_layer_ms": null, "dispatch": "all_to_all"}},
//    "device":   {"name": "H200", "memory_bytes": 141000000000, "reserved_bytes": 6000000000,
//                 "h2d_gbps": 55, "d2h_gbps": 55, "duplex_factor": 0.7, "copy_latency_us": 2,
//                 "bf16_tflops": 989, "fp8_tflops": 1979, "compute": "roofline",
//                 "kernel_efficiency": 0.58, "end_to_end_mfu": null,
//                 "hbm_tbps": 4.8, "p2p_gbps": 100, "p2p_latency_us": 10, "nvlink_gbps": 360,
//                 "network_gbps": 40, "nvlink_latency_us": 10, "network_latency_us": 15},
//    "node":     {"gpus": 8, "host_gbps": 278, "cpu_adam_gbps": 59},
//    "parallel": {"tp": 1, "sequence_parallel": false, "dp": 1, "distributed_optimizer": false, "fsdp": false, "ep": 1,
//                 "expert_tp": null, "overlap_grad_reduce": true, "overlap_param_gather": true,
//                 "tp_comm_overlap": true, "overlap_moe_expert_parallel_comm": true},
//    "pipeline": {"schedule": "1f1b", "ranks": 8, "micro_batches": 32, "stages_per_rank": 1,
//                 "overlap_b_f": false},
//    "swap":     {"swap_times": 16, "packed": true, "overlap": true},
//    "plan":     {"tolerance": 0.005}}
//
// A top-level "comment" (a string: the configuration's source) is kept and written back first when
// it is not empty.
// grad_dtype null means F32 with fp32_master, else the parameter type.
// "device": {"preset": "H100 SXM"} (or "H200", "B200") starts the device from the table of
// sim/compute.hpp (name, peaks, memory, HBM and NVLink rates); the section's other fields override it.
//
// docs/cli.md describes every field. Reading rejects, naming the field by its path
// ("model.layers"): malformed JSON (with the byte offset), unknown keys (with a close known name when
// there is one), wrong types, negative or fractional counts and sizes, values beyond the field's
// range, then every rule of sim::validate(), the limits below and scenarios that cannot fit their
// device whatever is swapped. Integer fields accept integral numbers written as floats (141e9).
// Errors are pipeswap::invalid_argument starting with "scenario: ".
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/sim/model.hpp>

namespace pipeswap::sim {

/// The JSON spelling of a schedule kind: "gpipe", "1f1b", "interleaved".
constexpr std::string_view schedule_kind_name(schedule_kind k) noexcept {
  switch (k) {
  case schedule_kind::gpipe: return "gpipe";
  case schedule_kind::one_f_one_b: return "1f1b";
  case schedule_kind::interleaved: return "interleaved";
  }
  return "?";
}

/// Inverse of schedule_kind_name; nullopt for any other name.
constexpr std::optional<schedule_kind> schedule_kind_from_name(std::string_view s) noexcept {
  for (auto k : {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::interleaved}) {
    if (schedule_kind_name(k) == s) return k;
  }
  return std::nullopt;
}

/// Limits the command puts on a scenario besides sim::validate(), so that sizes cannot overflow
/// 64-bit byte counts and a simulation stays a matter of seconds.
struct scenario_limits {
  std::uint32_t max_ranks = 1024;
  std::uint32_t max_micro_batches = 65536;
  std::uint32_t max_stages_per_rank = 64;
  std::uint32_t max_tp = 64, max_dp = 65536;
  /// Stage parameters times 16 bytes, and activation bytes times micro-batches, must stay below this.
  double max_bytes = 0x1p62;
};

namespace detail {

[[noreturn]] inline void scenario_fail(std::string const& path, std::string const& what) {
  throw invalid_argument("scenario: " + path + ": " + what);
}

// Levenshtein distance, for "did you mean" on unknown keys (keys are short).
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t const up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// One JSON object of the scenario, read field by field with its path for messages.
template <class Json>
class section_reader {
public:
  section_reader(Json const& j, std::string path, std::initializer_list<std::string_view> known)
      : j_(j), path_(std::move(path)) {
    if (!j.is_object()) scenario_fail(where(), std::string("expected an object, got ") + describe(j));
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string_view const key = it.key();
      bool found = false;
      std::string_view best;
      std::size_t best_d = 3; // suggest names at most two edits away
      for (auto k : known) {
        if (k == key) found = true;
        if (auto const d = edit_distance(key, k); d < best_d) best_d = d, best = k;
      }
      if (!found) {
        std::string msg = "unknown key '" + std::string(key) + "'";
        // A key whose word now means one thing only: say its new spelling, whatever its distance.
        if (key == "chunks" &&
            std::find(known.begin(), known.end(), std::string_view("stages_per_rank")) != known.end())
          best = "stages_per_rank";
        if (!best.empty()) msg += " (did you mean '" + std::string(best) + "'?)";
        scenario_fail(where(), msg);
      }
    }
  }

  std::string field(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  Json const* find(char const* key) const {
    auto const it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

  void u64(char const* key, std::uint64_t& out, std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) const {
    if (auto const* v = find(key)) out = integer(*v, field(key), max);
  }
  void u32(char const* key, std::uint32_t& out) const {
    if (auto const* v = find(key)) out = static_cast<std::uint32_t>(integer(*v, field(key), UINT32_MAX));
  }
  void number(char const* key, double& out) const {
    if (auto const* v = find(key)) {
      if (!v->is_number()) scenario_fail(field(key), "expected a number, got " + describe(*v));
      out = v->template get<double>();
    }
  }
  /// A number or null (null: unset).
  void optional_number(char const* key, std::optional<double>& out) const {
    if (auto const* v = find(key)) {
      if (v->is_null()) {
        out.reset();
      } else {
        double x = 0;
        number(key, x);
        out = x;
      }
    }
  }
  void boolean(char const* key, bool& out) const {
    if (auto const* v = find(key)) {
      if (!v->is_boolean()) scenario_fail(field(key), "expected true or false, got " + describe(*v));
      out = v->template get<bool>();
    }
  }
  void string(char const* key, std::string& out) const {
    if (auto const* v = find(key)) {
      if (!v->is_string()) scenario_fail(field(key), "expected a string, got " + describe(*v));
      out = v->template get<std::string>();
    }
  }

  static std::string describe(Json const& v) {
    auto text = v.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return std::string(v.type_name()) + " " + text;
  }

  static std::uint64_t integer(Json const& v, std::string const& path, std::uint64_t max) {
    std::uint64_t out = 0;
    if (v.is_number_unsigned()) {
      out = v.template get<std::uint64_t>();
    } else if (v.is_number_integer()) { // signed: built in code rather than parsed
      auto const i = v.template get<std::int64_t>();
      if (i < 0) scenario_fail(path, "must not be negative, got " + v.dump());
      out = static_cast<std::uint64_t>(i);
    } else if (v.is_number_float()) {
      double const d = v.template get<double>();
      if (d < 0) scenario_fail(path, "must not be negative, got " + v.dump());
      if (d != std::floor(d)) scenario_fail(path, "must be an integer, got " + v.dump());
      if (d >= 0x1p64) scenario_fail(path, "is out of range, got " + v.dump());
      out = static_cast<std::uint64_t>(d);
    } else {
      scenario_fail(path, "expected a non-negative integer, got " + describe(v));
    }
    if (out > max) scenario_fail(path, "is out of range (at most " + std::to_string(max) + "), got " + v.dump());
    return out;
  }

private:
  std::string where() const { return path_.empty() ? "top level" : path_; }

  Json const& j_;
  std::string path_;
};

} // namespace detail

/// Checks the limits of scenario_limits; throws invalid_argument naming the field. Call after
/// sim::validate() (it relies on positive sizes).
inline void check_limits(scenario const& s, scenario_limits const& lim = {}) {
  auto need = [](bool ok, std::string const& what) {
    if (!ok) throw invalid_argument("scenario: " + what);
  };
  auto const& p = s.pipeline;
  need(p.ranks <= lim.max_ranks,
       "pipeline.ranks (" + std::to_string(p.ranks) + ") is above the limit of " + std::to_string(lim.max_ranks));
  need(p.micro_batches <= lim.max_micro_batches, "pipeline.micro_batches (" + std::to_string(p.micro_batches) +
                                                     ") is above the limit of " +
                                                     std::to_string(lim.max_micro_batches));
  need(p.stages_per_rank <= lim.max_stages_per_rank, "pipeline.stages_per_rank (" + std::to_string(p.stages_per_rank) +
                                                         ") is above the limit of " +
                                                         std::to_string(lim.max_stages_per_rank));
  need(s.parallel.tp <= lim.max_tp,
       "parallel.tp (" + std::to_string(s.parallel.tp) + ") is above the limit of " + std::to_string(lim.max_tp));
  need(s.parallel.dp <= lim.max_dp,
       "parallel.dp (" + std::to_string(s.parallel.dp) + ") is above the limit of " + std::to_string(lim.max_dp));
  // Sizes in floating point first: plan_stages() multiplies them in 64-bit integers.
  auto const& m = s.model;
  double const h = double(m.hidden), f = double(m.ffn_hidden), layers = double(m.layers);
  double const layer_params = 4 * h * h + 3 * h * f + 2 * h;
  double const params = layers * layer_params + 2 * double(m.vocab) * h + h;
  char count[32];
  std::snprintf(count, sizeof count, "%.3g", params);
  need(params * 16 < lim.max_bytes, std::string("the model's size overflows byte counts (about ") + count +
                                        " parameters); check model.layers, model.hidden, model.ffn_hidden "
                                        "and model.vocab");
  double const tokens = double(m.seq_len) * double(m.micro_batch_size);
  // An upper bound of every term of layer_activations() and head_activations() with 4-byte elements
  // (eager kernels' fp32 copies included).
  double const act = m.activation_bytes_per_layer
                         ? double(*m.activation_bytes_per_layer)
                         : 4 * tokens * (16 * h + 4 * f) + 4 * tokens * double(m.heads) * double(m.seq_len) * 4;
  double const head = 4 * tokens * (4 * h + double(m.vocab));
  need((act * (layers + 1) + head) * p.micro_batches < lim.max_bytes,
       "activation bytes overflow (model.seq_len × model.micro_batch_size × model.hidden and "
       "pipeline.micro_batches are too large)");
}

/// The device bytes a rank needs whatever is swapped: the reserved bytes plus the weights and the
/// gradients of its stages (stage s runs on rank s % ranks; weight_and_gradient_bytes()), which stay
/// on the device in every configuration the simulator runs.
inline std::uint64_t unswappable_bytes(scenario const& s, std::uint32_t rank) {
  std::vector<stage_spec> mine;
  for (auto& st : plan_stages(s))
    if (st.stage % s.pipeline.ranks == rank) mine.push_back(std::move(st));
  return s.device.reserved_bytes + weight_and_gradient_bytes(s, mine);
}

namespace detail {

template <class E, std::size_t N>
E enum_field(auto const& v, char const* path, std::array<std::pair<std::string_view, E>, N> const& names) {
  std::string list;
  for (auto const& [n, e] : names) {
    if (v.is_string() && v.template get<std::string>() == n) return e;
    list += (list.empty() ? "\"" : ", \"") + std::string(n) + "\"";
  }
  scenario_fail(path, "expected one of " + list + ", got " + section_reader<std::decay_t<decltype(v)>>::describe(v));
}

inline constexpr std::array<std::pair<std::string_view, mlp_kind>, 2> mlp_names{
    {{"swiglu", mlp_kind::swiglu}, {"gelu", mlp_kind::gelu}}};
inline constexpr std::array<std::pair<std::string_view, precision>, 2> precision_names{
    {{"BF16", precision::bf16}, {"FP8", precision::fp8}}};
inline constexpr std::array<std::pair<std::string_view, fp8_library_kind>, 2> fp8_library_names{
    {{"transformer_engine", fp8_library_kind::transformer_engine}, {"torchao", fp8_library_kind::torchao}}};
inline constexpr std::array<std::pair<std::string_view, loss_kind>, 2> loss_names{
    {{"fused", loss_kind::fused}, {"pytorch", loss_kind::pytorch}}};
inline constexpr std::array<std::pair<std::string_view, moe_dispatch>, 2> dispatch_names{
    {{"all_to_all", moe_dispatch::all_to_all}, {"per_node", moe_dispatch::per_node}}};
inline constexpr std::array<std::pair<std::string_view, compute_kind>, 2> compute_names{
    {{"roofline", compute_kind::roofline}, {"flops", compute_kind::flops}}};
inline constexpr std::array<std::pair<std::string_view, recompute_kind>, 4> recompute_names{
    {{"none", recompute_kind::none},
     {"selective", recompute_kind::selective},
     {"full", recompute_kind::full},
     {"op", recompute_kind::op}}};

template <class E, std::size_t N>
constexpr std::string_view enum_name(E e, std::array<std::pair<std::string_view, E>, N> const& names) {
  for (auto const& [n, x] : names)
    if (x == e) return n;
  return "?";
}

} // namespace detail

/// "none", "selective", "full".
constexpr std::string_view recompute_name(recompute_kind k) { return detail::enum_name(k, detail::recompute_names); }
/// "swiglu", "gelu".
constexpr std::string_view mlp_name(mlp_kind k) { return detail::enum_name(k, detail::mlp_names); }
/// "fused", "pytorch".
constexpr std::string_view loss_name(loss_kind k) { return detail::enum_name(k, detail::loss_names); }
/// "BF16", "FP8".
constexpr std::string_view precision_name(precision k) { return detail::enum_name(k, detail::precision_names); }
/// "transformer_engine", "torchao".
constexpr std::string_view fp8_library_name(fp8_library_kind k) {
  return detail::enum_name(k, detail::fp8_library_names);
}
/// "all_to_all", "per_node".
constexpr std::string_view dispatch_name(moe_dispatch k) { return detail::enum_name(k, detail::dispatch_names); }
/// "roofline", "flops".
constexpr std::string_view compute_name(compute_kind k) { return detail::enum_name(k, detail::compute_names); }

/// Rejects a scenario that cannot fit its device whatever is swapped (unswappable_bytes() of some
/// rank above device.memory_bytes); throws invalid_argument naming the field and the rank.
inline void check_fits(scenario const& s) {
  for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r) {
    auto const need = unswappable_bytes(s, r);
    if (need > s.device.memory_bytes)
      throw invalid_argument("scenario: device.memory_bytes (" + std::to_string(s.device.memory_bytes) +
                             ") cannot fit rank " + std::to_string(r) +
                             " whatever is swapped: its weights and gradients plus device.reserved_bytes need " +
                             std::to_string(need) + " bytes (use more pipeline.ranks or a larger device)");
  }
}

/// The scenario a JSON object describes (see the header comment); absent fields keep `base`'s values.
/// Validates the result (sim::validate(), check_limits(), check_fits()). Throws invalid_argument.
template <class Json>
scenario scenario_from_json(Json const& j, scenario base = {}) {
  using reader = detail::section_reader<Json>;
  reader const top(j, "", {"comment", "model", "device", "node", "parallel", "pipeline", "swap", "plan"});
  scenario s = std::move(base);
  top.string("comment", s.comment);
  if (auto const* v = top.find("model")) {
    reader const r(*v, "model",
                   {"name",
                    "layers",
                    "hidden",
                    "ffn_hidden",
                    "heads",
                    "kv_heads",
                    "vocab",
                    "seq_len",
                    "micro_batch_size",
                    "param_dtype",
                    "grad_dtype",
                    "fp32_master",
                    "flash_attention",
                    "mlp",
                    "dropout",
                    "recompute",
                    "activation_bytes_per_layer",
                    "head_dim",
                    "moe",
                    "precision",
                    "fp8_library",
                    "fused_kernels",
                    "loss"});
    auto& m = s.model;
    r.string("name", m.name);
    r.u64("layers", m.layers);
    r.u64("hidden", m.hidden);
    r.u64("ffn_hidden", m.ffn_hidden);
    r.u64("heads", m.heads);
    r.u64("kv_heads", m.kv_heads);
    if (auto const* d = r.find("head_dim")) {
      if (d->is_null())
        m.head_dim.reset();
      else
        m.head_dim = reader::integer(*d, "model.head_dim", std::numeric_limits<std::uint32_t>::max());
    }
    if (auto const* v2 = r.find("moe")) {
      reader const q(*v2, "model.moe",
                     {"experts", "top_k", "expert_ffn_hidden", "shared_expert_ffn_hidden", "capacity_factor",
                      "pad_to_capacity", "load_imbalance", "host_layer_ms", "dispatch"});
      q.optional_number("capacity_factor", m.moe.capacity_factor);
      q.optional_number("host_layer_ms", m.moe.host_layer_ms);
      q.boolean("pad_to_capacity", m.moe.pad_to_capacity);
      q.number("load_imbalance", m.moe.load_imbalance);
      q.u64("experts", m.moe.experts, 1u << 20);
      q.u64("top_k", m.moe.top_k, 1u << 20);
      q.u64("expert_ffn_hidden", m.moe.expert_ffn_hidden);
      q.u64("shared_expert_ffn_hidden", m.moe.shared_expert_ffn_hidden);
      if (auto const* d = q.find("dispatch"))
        m.moe.dispatch = detail::enum_field(*d, "model.moe.dispatch", detail::dispatch_names);
    }
    r.u64("vocab", m.vocab);
    r.u64("seq_len", m.seq_len);
    r.u64("micro_batch_size", m.micro_batch_size);
    if (auto const* d = r.find("param_dtype")) {
      dtype t{};
      if (!d->is_string() || !parse_dtype(d->template get<std::string>(), t) ||
          !(t == dtype::bf16 || t == dtype::f16 || t == dtype::f32))
        detail::scenario_fail("model.param_dtype",
                              "expected \"BF16\", \"F16\" or \"F32\", got " + reader::describe(*d));
      m.param_dtype = t;
    }
    if (auto const* d = r.find("grad_dtype")) {
      if (d->is_null()) {
        m.grad_dtype.reset();
      } else {
        dtype t{};
        std::string const n = d->is_string() ? d->template get<std::string>() : "";
        if (n == "FP32")
          t = dtype::f32;
        else if (!d->is_string() || !parse_dtype(n, t) || !(t == dtype::bf16 || t == dtype::f16 || t == dtype::f32))
          detail::scenario_fail("model.grad_dtype",
                                "expected \"FP32\", \"BF16\", \"F16\" or null, got " + reader::describe(*d));
        m.grad_dtype = t;
      }
    }
    r.boolean("fp32_master", m.fp32_master);
    r.boolean("flash_attention", m.flash_attention);
    if (auto const* v2 = r.find("mlp")) m.mlp = detail::enum_field(*v2, "model.mlp", detail::mlp_names);
    r.boolean("dropout", m.dropout);
    if (auto const* v2 = r.find("recompute"))
      m.recompute = detail::enum_field(*v2, "model.recompute", detail::recompute_names);
    if (auto const* v2 = r.find("precision"))
      m.precision = detail::enum_field(*v2, "model.precision", detail::precision_names);
    if (auto const* v2 = r.find("fp8_library"))
      m.fp8_library = detail::enum_field(*v2, "model.fp8_library", detail::fp8_library_names);
    r.boolean("fused_kernels", m.fused_kernels);
    if (auto const* v2 = r.find("loss")) m.loss = detail::enum_field(*v2, "model.loss", detail::loss_names);
    if (auto const* a = r.find("activation_bytes_per_layer")) {
      if (a->is_null())
        m.activation_bytes_per_layer.reset();
      else
        m.activation_bytes_per_layer =
            reader::integer(*a, "model.activation_bytes_per_layer", std::numeric_limits<std::uint64_t>::max());
    }
  }
  if (auto const* v = top.find("device")) {
    if (v->is_object() && v->contains("mfu"))
      detail::scenario_fail("device.mfu", "was renamed: device.kernel_efficiency is the fraction of the peak the "
                                          "kernels reach (bubble excluded); device.end_to_end_mfu takes a published "
                                          "MFU (bubble included)");
    reader const r(*v, "device", {"name",         "memory_bytes",      "reserved_bytes",     "h2d_gbps",
                                  "d2h_gbps",     "duplex_factor",     "copy_latency_us",    "bf16_tflops",
                                  "fp8_tflops",   "compute",           "kernel_efficiency",  "end_to_end_mfu",
                                  "hbm_tbps",     "p2p_gbps",          "p2p_latency_us",     "nvlink_gbps",
                                  "network_gbps", "nvlink_latency_us", "network_latency_us", "preset"});
    auto& d = s.device;
    if (auto const* x = r.find("preset")) {
      auto const preset = x->is_string() ? find_device_preset(x->template get<std::string>()) : std::nullopt;
      if (!preset) {
        std::string list;
        for (auto const& p : device_presets) list += (list.empty() ? "\"" : ", \"") + std::string(p.name) + "\"";
        detail::scenario_fail("device.preset", "expected one of " + list + ", got " + reader::describe(*x));
      }
      d = with_preset(d, *preset);
    }
    r.string("name", d.name);
    r.u64("memory_bytes", d.memory_bytes);
    r.u64("reserved_bytes", d.reserved_bytes);
    r.number("h2d_gbps", d.h2d_gbps);
    r.number("d2h_gbps", d.d2h_gbps);
    r.number("copy_latency_us", d.copy_latency_us);
    r.number("bf16_tflops", d.bf16_tflops);
    r.number("fp8_tflops", d.fp8_tflops);
    if (auto const* x = r.find("compute")) d.compute = detail::enum_field(*x, "device.compute", detail::compute_names);
    r.number("duplex_factor", d.duplex_factor);
    r.number("kernel_efficiency", d.kernel_efficiency);
    r.optional_number("end_to_end_mfu", d.end_to_end_mfu);
    r.number("hbm_tbps", d.hbm_tbps);
    r.number("p2p_gbps", d.p2p_gbps);
    r.number("p2p_latency_us", d.p2p_latency_us);
    r.number("nvlink_gbps", d.nvlink_gbps);
    r.number("network_gbps", d.network_gbps);
    r.number("nvlink_latency_us", d.nvlink_latency_us);
    r.number("network_latency_us", d.network_latency_us);
  }
  if (auto const* v = top.find("node")) {
    reader const r(*v, "node", {"gpus", "host_gbps", "cpu_adam_gbps"});
    r.number("cpu_adam_gbps", s.node.cpu_adam_gbps);
    r.u32("gpus", s.node.gpus);
    r.number("host_gbps", s.node.host_gbps);
  }
  if (auto const* v = top.find("parallel")) {
    reader const r(*v, "parallel",
                   {"tp", "sequence_parallel", "save_gathered_inputs", "dp", "distributed_optimizer", "fsdp", "ep",
                    "expert_tp", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                    "overlap_moe_expert_parallel_comm"});
    r.boolean("overlap_grad_reduce", s.parallel.overlap_grad_reduce);
    r.boolean("overlap_param_gather", s.parallel.overlap_param_gather);
    r.boolean("tp_comm_overlap", s.parallel.tp_comm_overlap);
    r.boolean("overlap_moe_expert_parallel_comm", s.parallel.overlap_moe_expert_parallel_comm);
    r.u32("ep", s.parallel.ep);
    if (auto const* x = r.find("expert_tp")) {
      if (x->is_null())
        s.parallel.expert_tp.reset();
      else
        s.parallel.expert_tp = static_cast<std::uint32_t>(reader::integer(*x, "parallel.expert_tp", 64));
    }
    r.u32("tp", s.parallel.tp);
    r.boolean("sequence_parallel", s.parallel.sequence_parallel);
    r.boolean("save_gathered_inputs", s.parallel.save_gathered_inputs);
    r.u32("dp", s.parallel.dp);
    r.boolean("distributed_optimizer", s.parallel.distributed_optimizer);
    r.boolean("fsdp", s.parallel.fsdp);
  }
  if (auto const* v = top.find("pipeline")) {
    reader const r(*v, "pipeline", {"schedule", "ranks", "micro_batches", "stages_per_rank", "overlap_b_f"});
    auto& p = s.pipeline;
    if (auto const* k = r.find("schedule")) {
      auto const kind = k->is_string() ? schedule_kind_from_name(k->template get<std::string>()) : std::nullopt;
      if (!kind)
        detail::scenario_fail("pipeline.schedule",
                              "expected \"gpipe\", \"1f1b\" or \"interleaved\", got " + reader::describe(*k));
      p.schedule = *kind;
    }
    r.u32("ranks", p.ranks);
    r.u32("micro_batches", p.micro_batches);
    r.u32("stages_per_rank", p.stages_per_rank);
    r.boolean("overlap_b_f", p.overlap_b_f);
  }
  if (auto const* v = top.find("swap")) {
    reader const r(*v, "swap", {"swap_times", "packed", "overlap"});
    r.u32("swap_times", s.swap.swap_times);
    r.boolean("packed", s.swap.packed);
    r.boolean("overlap", s.swap.overlap);
  }
  if (auto const* v = top.find("plan")) {
    reader const r(*v, "plan", {"tolerance"});
    r.number("tolerance", s.plan.tolerance);
  }
  validate(s);
  check_limits(s);
  check_fits(s);
  return s;
}

/// Parses JSON text into a scenario; malformed JSON throws invalid_argument with the byte offset.
inline scenario scenario_from_json_text(std::string_view text, scenario base = {}) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (nlohmann::json::parse_error const& e) {
    throw invalid_argument("scenario: malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  }
  return scenario_from_json(j, std::move(base));
}

/// Every field of `s`, in the layout of the header comment (reads back to the same scenario).
template <class Json = nlohmann::ordered_json>
Json to_json(scenario const& s) {
  Json j = Json::object();
  if (!s.comment.empty()) j["comment"] = s.comment;
  auto const& m = s.model;
  Json& jm = j["model"] = Json::object();
  jm["name"] = m.name;
  jm["layers"] = m.layers;
  jm["hidden"] = m.hidden;
  jm["ffn_hidden"] = m.ffn_hidden;
  jm["heads"] = m.heads;
  jm["kv_heads"] = m.kv_heads;
  jm["vocab"] = m.vocab;
  jm["seq_len"] = m.seq_len;
  jm["micro_batch_size"] = m.micro_batch_size;
  jm["param_dtype"] = name_of(m.param_dtype);
  jm["grad_dtype"] =
      m.grad_dtype ? Json(*m.grad_dtype == dtype::f32 ? "FP32" : std::string(name_of(*m.grad_dtype))) : Json(nullptr);
  jm["fp32_master"] = m.fp32_master;
  jm["flash_attention"] = m.flash_attention;
  jm["mlp"] = mlp_name(m.mlp);
  jm["dropout"] = m.dropout;
  jm["recompute"] = recompute_name(m.recompute);
  jm["activation_bytes_per_layer"] = m.activation_bytes_per_layer ? Json(*m.activation_bytes_per_layer) : Json(nullptr);
  jm["head_dim"] = m.head_dim ? Json(*m.head_dim) : Json(nullptr);
  jm["precision"] = precision_name(m.precision);
  jm["fp8_library"] = fp8_library_name(m.fp8_library);
  jm["fused_kernels"] = m.fused_kernels;
  jm["loss"] = loss_name(m.loss);
  Json& je = jm["moe"] = Json::object();
  je["experts"] = m.moe.experts;
  je["top_k"] = m.moe.top_k;
  je["expert_ffn_hidden"] = m.moe.expert_ffn_hidden;
  je["shared_expert_ffn_hidden"] = m.moe.shared_expert_ffn_hidden;
  je["capacity_factor"] = m.moe.capacity_factor ? Json(*m.moe.capacity_factor) : Json(nullptr);
  je["pad_to_capacity"] = m.moe.pad_to_capacity;
  je["load_imbalance"] = m.moe.load_imbalance;
  je["host_layer_ms"] = m.moe.host_layer_ms ? Json(*m.moe.host_layer_ms) : Json(nullptr);
  je["dispatch"] = dispatch_name(m.moe.dispatch);
  auto const& d = s.device;
  Json& jd = j["device"] = Json::object();
  jd["name"] = d.name;
  jd["memory_bytes"] = d.memory_bytes;
  jd["reserved_bytes"] = d.reserved_bytes;
  jd["h2d_gbps"] = d.h2d_gbps;
  jd["d2h_gbps"] = d.d2h_gbps;
  jd["duplex_factor"] = d.duplex_factor;
  jd["copy_latency_us"] = d.copy_latency_us;
  jd["bf16_tflops"] = d.bf16_tflops;
  jd["fp8_tflops"] = d.fp8_tflops;
  jd["compute"] = compute_name(d.compute);
  jd["kernel_efficiency"] = d.kernel_efficiency;
  jd["end_to_end_mfu"] = d.end_to_end_mfu ? Json(*d.end_to_end_mfu) : Json(nullptr);
  jd["hbm_tbps"] = d.hbm_tbps;
  jd["p2p_gbps"] = d.p2p_gbps;
  jd["p2p_latency_us"] = d.p2p_latency_us;
  jd["nvlink_gbps"] = d.nvlink_gbps;
  jd["network_gbps"] = d.network_gbps;
  jd["nvlink_latency_us"] = d.nvlink_latency_us;
  jd["network_latency_us"] = d.network_latency_us;
  Json& jn = j["node"] = Json::object();
  jn["gpus"] = s.node.gpus;
  jn["host_gbps"] = s.node.host_gbps;
  jn["cpu_adam_gbps"] = s.node.cpu_adam_gbps;
  Json& jq = j["parallel"] = Json::object();
  jq["tp"] = s.parallel.tp;
  jq["sequence_parallel"] = s.parallel.sequence_parallel;
  jq["save_gathered_inputs"] = s.parallel.save_gathered_inputs;
  jq["dp"] = s.parallel.dp;
  jq["distributed_optimizer"] = s.parallel.distributed_optimizer;
  jq["fsdp"] = s.parallel.fsdp;
  jq["ep"] = s.parallel.ep;
  jq["expert_tp"] = s.parallel.expert_tp ? Json(*s.parallel.expert_tp) : Json(nullptr);
  jq["overlap_grad_reduce"] = s.parallel.overlap_grad_reduce;
  jq["overlap_param_gather"] = s.parallel.overlap_param_gather;
  jq["tp_comm_overlap"] = s.parallel.tp_comm_overlap;
  jq["overlap_moe_expert_parallel_comm"] = s.parallel.overlap_moe_expert_parallel_comm;
  auto const& p = s.pipeline;
  Json& jp = j["pipeline"] = Json::object();
  jp["schedule"] = schedule_kind_name(p.schedule);
  jp["ranks"] = p.ranks;
  jp["micro_batches"] = p.micro_batches;
  jp["stages_per_rank"] = p.stages_per_rank;
  jp["overlap_b_f"] = p.overlap_b_f;
  Json& js = j["swap"] = Json::object();
  js["swap_times"] = s.swap.swap_times;
  js["packed"] = s.swap.packed;
  js["overlap"] = s.swap.overlap;
  Json& jl = j["plan"] = Json::object();
  jl["tolerance"] = s.plan.tolerance;
  return j;
}

} // namespace pipeswap::sim
