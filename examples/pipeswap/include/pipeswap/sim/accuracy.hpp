// pipeswap — what a simulated step time is worth: the model's error on published runs that were held
// out of its fit (docs/simulator.md, "Calibration"), printed beside every step time by `pipeswap
// simulate` and `pipeswap plan`, so that a verdict whose margin is inside it says so; and, for a
// mixture of experts, whether its layers run at the host's pace rather than the device's.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>

#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/scenario.hpp>

namespace pipeswap::sim {

/// Predicted / published tokens/s per GPU over the held-out runs of examples/calibration of one kind
/// of model (dense, or mixture of experts): the lowest and the highest ratio, and how many runs.
/// tests/cli/cli_test.py (`Calibration`) recomputes the ratios and checks that these are their
/// extremes, so the figures cannot drift from the runs.
struct model_error {
  char const* kind = "";
  double low = 0;
  double high = 0;
  int runs = 0;
  /// The device preset the runs ran on, where the band is one device's (else null: every device's).
  char const* device = nullptr;
  /// What the same runs say of the simulated peaks, where they disagree with the runs (else null).
  char const* memory = nullptr;

  /// How far a simulated step time may be from the real one, as a fraction of it: a throughput
  /// ratio r is a step time 1/r of the real one.
  [[nodiscard]] double step_error() const noexcept { return std::max(1.0 / low - 1.0, 1.0 - 1.0 / high); }
};

/// The per-operation compute model's (device.compute "roofline"), measured apart on dense models and
/// on mixtures of experts, whose errors differ; the one-efficiency model has no measured error.
inline constexpr model_error held_out_error{"dense", 0.86, 1.37, 17};
inline constexpr model_error moe_held_out_error{"mixture-of-experts", 0.97, 2.09, 15};
/// The mixture-of-experts runs on the B200 preset, a band of their own: every one is over-predicted
/// (the H100 runs span the whole band above).
inline constexpr model_error moe_b200_held_out_error{"mixture-of-experts", 1.09, 1.82, 6, "B200"};

/// The error that applies to `s`'s figures, if one was measured for its compute model: the one of
/// its kind of model; for a mixture of experts on the B200 preset (device.name "B200"), the B200
/// runs'. Any other device, a renamed B200 included, gets every MoE run's band, which holds theirs.
inline model_error const* error_of(scenario const& s) noexcept {
  if (s.device.compute != compute_kind::roofline) return nullptr;
  if (!s.model.moe.enabled()) return &held_out_error;
  return s.device.name == moe_b200_held_out_error.device ? &moe_b200_held_out_error : &moe_held_out_error;
}

/// The line the reports print under the scenario, and a second one where the runs disagree with the
/// simulated peaks.
inline std::string error_line(scenario const& s) {
  auto const* e = error_of(s);
  if (!e) return "model error: not measured for device.compute \"flops\" (docs/simulator.md, Calibration)";
  std::string const on = e->device ? std::string(" on ") + e->device + "s" : std::string();
  char buf[280];
  std::snprintf(buf, sizeof buf,
                "model error: on %d published %s runs%s held out of the fit, predicted tokens/s %.2f-%.2fx the "
                "published: a step time may be off by up to %.0f %% (docs/simulator.md, Calibration)",
                e->runs, e->kind, on.c_str(), e->low, e->high, e->step_error() * 100);
  std::string line = buf;
  if (e->memory) line += std::string("\nmodel memory: ") + e->memory + " (docs/simulator.md, Calibration)";
  return line;
}

/// The line the reports print under the error where the host sets the MoE layers' pace (moe_pace):
/// the step then follows the host, not the device, and a larger micro-batch or a whole-layer CUDA
/// graph would change it more than the device would.
inline std::string pace_line(scenario const& s) {
  auto const p = moe_pace(s);
  if (!p || !p->host_bound()) return {};
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "host: the host issues each MoE layer's kernels in %.1f ms (forward and "
                "backward, per micro-batch), the device runs them in %.1f ms: the layers run at the host's pace "
                "(model.moe.host_layer_ms; docs/simulator.md, Mixture of experts)",
                p->host_ms, p->device_ms);
  return buf;
}

/// The pace as JSON: {"host_layer_ms", "device_layer_ms", "host_bound"}, or null where the host does
/// not bound the MoE layers at all (a dense model, or host_layer_ms 0).
template <class Json>
Json pace_json(scenario const& s) {
  auto const p = moe_pace(s);
  if (!p) return Json(nullptr);
  Json j = Json::object();
  j["host_layer_ms"] = p->host_ms;
  j["device_layer_ms"] = p->device_ms;
  j["host_bound"] = p->host_bound();
  return j;
}

/// The error as JSON: {"held_out_kind", "throughput_low", "throughput_high", "held_out_runs",
/// "step_time_error", "memory" (a string, or null)}, or null when none was measured.
template <class Json>
Json error_json(scenario const& s) {
  auto const* e = error_of(s);
  if (!e) return Json(nullptr);
  Json j = Json::object();
  j["held_out_kind"] = e->kind;
  j["throughput_low"] = e->low;
  j["throughput_high"] = e->high;
  j["held_out_runs"] = e->runs;
  j["held_out_device"] = e->device ? Json(e->device) : Json(nullptr);
  j["step_time_error"] = e->step_error();
  j["memory"] = e->memory ? Json(e->memory) : Json(nullptr);
  return j;
}

} // namespace pipeswap::sim
