// pipeswap — the simulator's report: one scenario under the four swap configurations (no swap,
// activation swap, optimizer-state swap, both), per rank, as a text table, as JSON and as a memory
// chart. What `pipeswap simulate` prints; docs/simulator.md explains the columns.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/error.hpp>
#include <pipeswap/sim/accuracy.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/pipeline.hpp>
#include <pipeswap/sim/sized.hpp>
#include <pipeswap/sim/scenario_json.hpp>
#include <pipeswap/sim/svg.hpp>

namespace pipeswap::sim {

/// What is swapped in each of the four configurations a report compares, in report order.
enum class swapping : std::uint8_t { none, activations, optimizer, both };

inline constexpr std::array<swapping, 4> all_swappings = {swapping::none, swapping::activations, swapping::optimizer,
                                                          swapping::both};

/// The JSON key of a configuration: "none", "activations", "optimizer", "both".
constexpr std::string_view config_key(swapping c) noexcept {
  switch (c) {
  case swapping::none: return "none";
  case swapping::activations: return "activations";
  case swapping::optimizer: return "optimizer";
  case swapping::both: return "both";
  }
  return "?";
}

/// The name people read: "no swap", "activation swap", "optimizer swap", "both".
constexpr std::string_view config_title(swapping c) noexcept {
  switch (c) {
  case swapping::none: return "no swap";
  case swapping::activations: return "activation swap";
  case swapping::optimizer: return "optimizer swap";
  case swapping::both: return "both";
  }
  return "?";
}

/// The simulator options of a configuration: activation swap of every eligible group, optimizer swap
/// with the scenario's swap_times and packing.
/// With swap.overlap, each rank's activation loads go out load_lookahead_for() slots ahead (the
/// link rate taken as when every rank swaps), and simulate_sized() sizes the resident shares.
inline sim_options options_for(swapping c, scenario const& s) {
  sim_options o;
  o.swap_activations = c == swapping::activations || c == swapping::both;
  o.swap_optimizer = c == swapping::optimizer || c == swapping::both;
  o.swap_times = s.swap.swap_times;
  o.packed = s.swap.packed;
  o.overlap = s.swap.overlap;
  if (o.overlap && o.swap_activations) set_load_lookaheads(o, s);
  return o;
}

inline scenario calibrated(scenario s);

/// A scenario simulated under the four configurations.
struct report {
  scenario setup;
  std::array<sim_result, 4> results; ///< indexed by swapping

  sim_result const& operator[](swapping c) const noexcept { return results[static_cast<std::size_t>(c)]; }
};

/// Runs the four simulations. `progress(fraction)` is called now and then with the fraction of the
/// whole work done; the trace is recorded for `trace_config` only (none when it is nullopt).
inline report run_report(scenario const& given, std::function<void(double)> const& progress = {},
                         std::optional<swapping> trace_config = swapping::both) {
  auto const s = calibrated(given);
  report r{s, {}};
  for (std::size_t i = 0; i < all_swappings.size(); ++i) {
    auto o = options_for(all_swappings[i], s);
    o.record_trace = trace_config == all_swappings[i];
    if (progress) o.progress = [&progress, i](double f) { progress((static_cast<double>(i) + f) / 4.0); };
    r.results[i] = simulate_sized(s, o);
    if (r.results[i].ranks.size() != s.pipeline.ranks)
      throw error("simulate returned " + std::to_string(r.results[i].ranks.size()) + " ranks for a scenario of " +
                  std::to_string(s.pipeline.ranks));
    if (progress) progress(static_cast<double>(i + 1) / 4.0);
  }
  return r;
}

/// The rank whose peak is highest in `r` (the lowest such rank).
inline std::uint32_t highest_peak_rank(sim_result const& r) {
  std::uint32_t best = 0;
  for (std::uint32_t i = 0; i < r.ranks.size(); ++i)
    if (r.ranks[i].peak_bytes > r.ranks[best].peak_bytes) best = i;
  return best;
}

/// Relative step-time overhead of `t` against `base` (0.05 = 5 % slower); 0 when base is 0.
inline double overhead(mock::sim_time t, mock::sim_time base) noexcept {
  return base > 0 ? static_cast<double>(t - base) / static_cast<double>(base) : 0.0;
}

namespace detail {

inline std::string fmt(char const* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline std::string gb(std::uint64_t bytes) { return fmt("%.1f GB", static_cast<double>(bytes) / 1e9); }
inline std::string secs(mock::sim_time ns) { return fmt("%.3f s", static_cast<double>(ns) / 1e9); }
inline std::string percent(double f) { return fmt("%+.2f %%", f * 100.0); }

inline std::string pad(std::string s, std::size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

inline std::uint64_t sum_h2d(sim_result const& r) {
  std::uint64_t t = 0;
  for (auto const& x : r.ranks) t += x.h2d_bytes;
  return t;
}
inline std::uint64_t sum_d2h(sim_result const& r) {
  std::uint64_t t = 0;
  for (auto const& x : r.ranks) t += x.d2h_bytes;
  return t;
}

} // namespace detail

/// `s` with device.kernel_efficiency derived from device.end_to_end_mfu (unchanged when that is
/// unset): the efficiency at which the simulated no-swap step reaches the published MFU. The step is
/// A/e + B in the efficiency e (compute scales with 1/e; collectives, sends and latencies do not):
/// two simulations give A and B, a third checks; secant steps refine it to 0.1 %. Throws
/// invalid_argument when the MFU cannot be reached even at e = 1 (the fixed costs alone are too slow).
inline scenario calibrated(scenario s) {
  if (!s.device.end_to_end_mfu) return s;
  double const target = *s.device.end_to_end_mfu;
  auto mfu_at = [&](double e) {
    auto t = s;
    t.device.kernel_efficiency = e;
    t.device.end_to_end_mfu.reset();
    return end_to_end_mfu(t, simulate(t, sim_options{}).step_ns);
  };
  double const at_one = mfu_at(1.0);
  if (at_one < target)
    throw invalid_argument("scenario: device.end_to_end_mfu (" + detail::fmt("%.3f", target) +
                           ") is out of reach: even with kernel_efficiency 1 the simulated no-swap step reaches " +
                           detail::fmt("%.3f", at_one) + " (communication and the pipeline bubble cost more)");
  // step ∝ 1/mfu: 1/mfu(e) = a/e + c.
  double const e1 = 1.0, e2 = 0.5;
  double const y1 = 1.0 / at_one, y2 = 1.0 / mfu_at(e2);
  double const a = (y2 - y1) / (1 / e2 - 1 / e1), c = y1 - a / e1;
  double e = a > 0 ? a / (1.0 / target - c) : target;
  for (int i = 0; i < 4; ++i) {
    e = std::clamp(e, 1e-4, 1.0);
    double const got = mfu_at(e);
    if (std::abs(got - target) <= 1e-3 * target) break;
    e *= target / got; // mfu is nearly proportional to e when compute dominates
  }
  s.device.kernel_efficiency = std::clamp(e, 1e-4, 1.0);
  s.device.end_to_end_mfu.reset();
  return s;
}

/// One line describing the scenario: model, pipeline, device.
inline std::string describe(scenario const& s) {
  using detail::gb;
  std::uint64_t params = 0; // the whole model's, not one device's shard
  auto whole = s;
  whole.parallel = {};
  for (auto const& st : plan_stages(whole)) params += st.params;
  auto const& p = s.pipeline;
  std::string out =
      s.model.name + " (" + std::to_string(s.model.layers) + " layers, " +
      detail::fmt("%.1f", static_cast<double>(params) / 1e9) + " B parameters, " +
      (s.model.moe.enabled()
           ? std::to_string(s.model.moe.experts) + " experts, top " + std::to_string(s.model.moe.top_k) + ", "
           : std::string()) +
      std::string(name_of(s.model.param_dtype)) +
      (!s.model.fp32_master ? ""
       : s.parallel.fsdp    ? " + fp32 master (the FSDP shard)"
                            : " + fp32 master") +
      ", " + std::string(name_of(grad_dtype_of(s.model))) + " gradients" +
      (s.model.recompute == recompute_kind::none ? std::string()
                                                 : std::string(", ") + recompute_title(s.model.recompute)) +
      "), " + std::to_string(p.ranks) + " pipeline ranks" +
      (s.parallel.tp > 1
           ? " x tp " + std::to_string(s.parallel.tp) + (s.parallel.sequence_parallel ? " (sequence parallel)" : "")
           : std::string()) +
      (s.parallel.dp > 1 ? " x dp " + std::to_string(s.parallel.dp) +
                               (s.parallel.fsdp                    ? " (FSDP)"
                                : s.parallel.distributed_optimizer ? " (distributed optimizer)"
                                                                   : "")
                         : std::string()) +
      (s.parallel.ep > 1 ? ", experts over ep " + std::to_string(s.parallel.ep) : std::string()) + " = " +
      std::to_string(devices_of(s)) + " devices, " +
      (p.schedule == schedule_kind::gpipe ? std::string("GPipe")
       : p.schedule == schedule_kind::one_f_one_b
           ? std::string("1F1B")
           : "interleaved 1F1B (" + std::to_string(p.stages_per_rank) + " stages per rank)") +
      ", " + std::to_string(p.micro_batches) + " micro-batches of " + std::to_string(s.model.micro_batch_size) + " x " +
      std::to_string(s.model.seq_len) + " tokens\ndevice: " + s.device.name + ", " + gb(s.device.memory_bytes) + " (" +
      gb(s.device.reserved_bytes) + " reserved), " +
      (s.device.compute == compute_kind::flops
           ? "kernels at " + detail::fmt("%.0f", s.device.kernel_efficiency * 100) + " % of " +
                 detail::fmt("%g", s.device.bf16_tflops) + " TFLOP/s"
           : "GEMMs up to " + detail::fmt("%.0f", s.device.kernel_efficiency * 100) + " % of " +
                 detail::fmt("%g", s.model.precision == precision::fp8 ? s.device.fp8_tflops : s.device.bf16_tflops) +
                 " TFLOP/s (" + (s.model.precision == precision::fp8 ? "FP8" : "BF16") + "), HBM " +
                 detail::fmt("%g", s.device.hbm_tbps) + " TB/s" +
                 (s.model.fused_kernels ? "" : ", eager elementwise kernels")) +
      ", host link " + detail::fmt("%g", s.device.h2d_gbps) + " GB/s to the device, " +
      detail::fmt("%g", s.device.d2h_gbps) + " GB/s back (x" + detail::fmt("%g", s.device.duplex_factor) +
      " both ways at once; " + std::to_string(s.node.gpus) + " devices share " + detail::fmt("%g", s.node.host_gbps) +
      " GB/s per node); optimizer swap in " + std::to_string(s.swap.swap_times) + " batches, " +
      (s.swap.packed ? "packed" : "per tensor") +
      (s.swap.overlap ? "; overlapped (the steady-state step is reported)" : "; not overlapped");
  return out;
}

/// The report as the text `pipeswap simulate` prints: a summary per configuration, then every rank.
inline std::string format_table(report const& r) {
  using detail::gb;
  using detail::pad;
  using detail::secs;
  std::string o = "scenario: " + describe(r.setup) + "\n" + error_line(r.setup) + "\n";
  if (auto const pace = pace_line(r.setup); !pace.empty()) o += pace + "\n";
  o += "\n";
  auto const& base = r[swapping::none];
  o += pad("configuration", 17) + pad("step time", 12, true) + pad("overhead", 11, true) + pad("MFU", 8, true) +
       pad("peak", 11, true) + "  " + pad("on rank", 8) + pad("fits", 18) + pad("H2D, sum", 11, true) +
       pad("D2H, sum", 11, true) + "\n";
  for (auto c : all_swappings) {
    auto const& x = r[c];
    std::size_t over = 0;
    for (auto const& rr : x.ranks) over += rr.fits ? 0 : 1;
    std::string const fits =
        x.fits ? "yes" : "no (" + std::to_string(over) + " of " + std::to_string(x.ranks.size()) + " over)";
    o += pad(std::string(config_title(c)), 17) + pad(secs(x.step_ns), 12, true) +
         pad(c == swapping::none ? "-" : detail::percent(overhead(x.step_ns, base.step_ns)), 11, true) +
         pad(detail::fmt("%.1f %%", end_to_end_mfu(r.setup, x.step_ns) * 100), 8, true) +
         pad(gb(x.peak_bytes), 11, true) + "  " + pad(std::to_string(highest_peak_rank(x)), 8) + pad(fits, 18) +
         pad(gb(detail::sum_h2d(x)), 11, true) + pad(gb(detail::sum_d2h(x)), 11, true) + "\n";
  }
  o += "\nH2D, sum / D2H, sum: bytes per step over the host link, summed over the " +
       std::to_string(r.setup.pipeline.ranks) +
       " pipeline ranks (one device of each; the per-rank table gives each rank's)";
  o += "\nMFU: end-to-end model FLOPs utilization (Narayanan et al.'s FLOPs, recomputation not counted, over step "
       "time x peak x " +
       std::to_string(devices_of(r.setup)) + " devices)\n";
  o += "\nper rank (device capacity " + gb(r.setup.device.memory_bytes) +
       "; H2D/D2H: bytes one device of the rank moves per step; link: its host-link rate each way while both "
       "directions copy, one alone gets its full rate):\n";
  o += pad("rank", 6) + pad("configuration", 17) + pad("peak", 11, true) + "  " + pad("fits", 6) +
       pad("step time", 11, true) + pad("overhead", 11, true) + pad("H2D", 11, true) + pad("D2H", 11, true) +
       pad("swapped groups", 16, true) + pad("link", 11, true) + "\n";
  for (std::size_t k = 0; k < base.ranks.size(); ++k) {
    for (auto c : all_swappings) {
      auto const& rr = r[c].ranks[k];
      o += pad(c == swapping::none ? std::to_string(rr.rank) : "", 6) + pad(std::string(config_title(c)), 17) +
           pad(gb(rr.peak_bytes), 11, true) + "  " + pad(rr.fits ? "yes" : "no", 6) + pad(secs(rr.step_ns), 11, true) +
           pad(c == swapping::none ? "-" : detail::percent(overhead(rr.step_ns, base.ranks[k].step_ns)), 11, true) +
           pad(gb(rr.h2d_bytes), 11, true) + pad(gb(rr.d2h_bytes), 11, true) +
           pad(std::to_string(rr.swapped_chunks), 16, true) +
           pad(rr.h2d_bytes + rr.d2h_bytes ? detail::fmt("%.1f GB/s", rr.link.h2d_gbps) : std::string("-"), 11, true) +
           "\n";
    }
  }
  return o;
}

/// The report as JSON: {"scenario": ..., "model_error": ..., "moe_pace": ... (sim/accuracy.hpp), "configurations": [{"name", "title", "step_ns", "overhead",
/// "peak_bytes", "peak_rank", "fits", "h2d_bytes", "d2h_bytes", "ranks": [...]}]} (docs/cli.md).
template <class Json = nlohmann::ordered_json>
Json to_json(report const& r) {
  Json j = Json::object();
  j["scenario"] = to_json<Json>(r.setup);
  j["model_error"] = error_json<Json>(r.setup);
  j["moe_pace"] = pace_json<Json>(r.setup);
  Json& configs = j["configurations"] = Json::array();
  auto const& base = r[swapping::none];
  for (auto c : all_swappings) {
    auto const& x = r[c];
    Json jc = Json::object();
    jc["name"] = config_key(c);
    jc["title"] = config_title(c);
    jc["step_ns"] = x.step_ns;
    jc["overhead"] = overhead(x.step_ns, base.step_ns);
    jc["mfu"] = end_to_end_mfu(r.setup, x.step_ns);
    jc["peak_bytes"] = x.peak_bytes;
    jc["peak_rank"] = highest_peak_rank(x);
    jc["fits"] = x.fits;
    jc["h2d_bytes"] = detail::sum_h2d(x);
    jc["d2h_bytes"] = detail::sum_d2h(x);
    jc["overlap"] = r.setup.swap.overlap;
    Json& ranks = jc["ranks"] = Json::array();
    for (std::size_t k = 0; k < x.ranks.size(); ++k) {
      auto const& rr = x.ranks[k];
      Json jr = Json::object();
      jr["rank"] = rr.rank;
      jr["peak_bytes"] = rr.peak_bytes;
      jr["fits"] = rr.fits;
      jr["step_ns"] = rr.step_ns;
      jr["pipeline_ns"] = rr.pipeline_ns;
      jr["overhead"] = overhead(rr.step_ns, base.ranks[k].step_ns);
      jr["h2d_bytes"] = rr.h2d_bytes;
      jr["d2h_bytes"] = rr.d2h_bytes;
      jr["swapped_chunks"] = rr.swapped_chunks;
      jr["resident_param_bytes"] = rr.resident_param_bytes;
      jr["optimizer_state_bytes"] = rr.optimizer_state_bytes;
      jr["h2d_gbps"] = rr.link.h2d_gbps;
      jr["d2h_gbps"] = rr.link.d2h_gbps;
      jr["link_sharing"] = rr.link.sharing;
      jr["resident_share_bytes"] = rr.resident_share_bytes;
      jr["prefetched_batches"] = rr.prefetched_batches;
      jr["optimizer_batches"] = rr.optimizer_batches;
      jr["load_lookahead"] = rr.load_lookahead;
      jr["budget_high_water_bytes"] = rr.budget_high_water;
      ranks.push_back(std::move(jr));
    }
    configs.push_back(std::move(jc));
  }
  return j;
}

/// Device memory over time on `rank` under the four configurations (GB against seconds), with the
/// device's capacity as a dashed level.
inline svg::chart memory_chart(report const& r, std::uint32_t rank) {
  if (rank >= r[swapping::none].ranks.size())
    throw invalid_argument("memory chart: no rank " + std::to_string(rank) + " among " +
                           std::to_string(r[swapping::none].ranks.size()));
  svg::chart c;
  c.title = "Device memory of rank " + std::to_string(rank) + " over one step: " + r.setup.model.name + ", " +
            std::to_string(r.setup.pipeline.ranks) + " ranks";
  c.x_label = "time (s)";
  c.y_label = "device memory (GB)";
  for (std::size_t i = 0; i < all_swappings.size(); ++i) {
    auto const c4 = all_swappings[i];
    auto const& rr = r[c4].ranks[rank];
    svg::series s;
    s.name = std::string(config_title(c4)) + " (peak " + detail::gb(rr.peak_bytes) + ")";
    s.color = std::string(svg::palette[i]);
    s.points.reserve(rr.memory.size());
    for (auto const& [t, bytes] : rr.memory)
      s.points.push_back({static_cast<double>(t) / 1e9, static_cast<double>(bytes) / 1e9});
    c.lines.push_back(std::move(s));
  }
  c.levels.push_back({"device capacity " + detail::gb(r.setup.device.memory_bytes),
                      static_cast<double>(r.setup.device.memory_bytes) / 1e9, "#d55e00"});
  return c;
}

} // namespace pipeswap::sim
