// pipeswap — what one simulation of the pipeline simulator (sim/pipeline.hpp) runs with and reports:
// sim_options (what swaps, per-rank settings, overlap) and sim_result with one rank_result per rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/sim/model.hpp>

namespace pipeswap::sim {

/// What one simulation swaps and records.
struct sim_options {
  /// Inject swap steps into every rank's order and run them through activation_swap.
  bool swap_activations = false;
  /// Keep AdamW's state in pinned host memory and run the step through optimizer_swap.
  bool swap_optimizer = false;
  /// Which chunks swap when activations swap (all candidates when empty): rank, (stage, micro).
  std::function<bool(std::uint32_t rank, schedule::chunk)> activation_filter;
  std::uint32_t swap_times = 16; ///< optimizer batches per step
  bool packed = true;            ///< packed optimizer pipeline (else per-tensor)
  /// Fill sim_result::trace_json with a Chrome trace of every rank (one process per rank).
  bool record_trace = false;
  /// Called with the fraction of schedule entries executed so far, now and then.
  std::function<void(double done_fraction)> progress;
  /// Hold real bytes on the mock devices and check saved activations in every backward. Meant for
  /// small scenarios (tests): every buffer is really allocated.
  bool materialize = false;
  /// Check every operation with the mock's hazard checker (raising). The planner turns it off for
  /// the candidates it only compares and checks the plan it chooses (sim/plan.hpp); timing and
  /// memory do not depend on it.
  bool check_hazards = true;
  /// Per rank: recomputation (empty: model.recompute everywhere).
  std::vector<recompute_kind> recompute;
  /// Per rank: whether optimizer state swaps (empty: swap_optimizer on every rank).
  std::vector<bool> optimizer_ranks;

  /// The overlapped swap (docs/simulator.md, "Overlap"): consecutive steps run until the step is
  /// periodic, and the period is reported (the steady state, sim_result::periods); with optimizer swap, each rank's runtime keeps its resident share
  /// on the device, prefetches the next step's first batches during the rank's backward tail as its
  /// device budget allows, and leaves the last offloads to drain into the next step's forward.
  /// false: one step, every copy of the optimizer state inside the step (the reference behaviour).
  bool overlap = false;
  /// Steps to run (the last one is reported); 0: one without overlap, and with overlap from
  /// `min_steps` until two consecutive periods agree (steady_tolerance), at most `max_steps`.
  std::uint32_t steps = 0;
  std::uint32_t min_steps = 3, max_steps = 8;
  /// Compute slots between an activation load's launch and its backward (inject_options; 1: the
  /// reference placement).
  std::size_t load_lookahead = 1;
  /// Compute slots after an activation offload's forward that its wait follows (inject_options; 1:
  /// the reference placement).
  std::size_t offload_wait_delay = 1;
  /// With overlap: bytes of each rank's swappable optimizer state that stay on the device.
  std::uint64_t resident_share = 0;

  /// What may differ per rank (unset fields take the uniform values above).
  struct rank_settings {
    std::optional<std::uint32_t> swap_times;
    std::optional<std::size_t> load_lookahead;
    std::optional<std::size_t> offload_wait_delay;
    std::optional<std::uint64_t> resident_share;
    /// With overlap: false runs this rank's optimizer step as without overlap (no prefetch, no
    /// deferred offload, no resident share); unset: true.
    std::optional<bool> phased;
    /// With activation swap: the share of each swapped group's per-layer activations that swaps, in
    /// tenths (1 to 10, else simulate() throws invalid_argument), rounded up to whole layers of the
    /// stage; the stage's first layers swap, the others stay on the device. Unset: every layer.
    std::optional<std::uint32_t> swapped_tenths;
    friend bool operator==(rank_settings const&, rank_settings const&) = default;
  };
  /// Per rank (empty: every rank takes the uniform values; else one entry per rank).
  std::vector<rank_settings> ranks;

  [[nodiscard]] bool swaps_optimizer(std::uint32_t rank) const {
    return optimizer_ranks.empty() ? swap_optimizer : rank < optimizer_ranks.size() && optimizer_ranks[rank];
  }
  [[nodiscard]] std::uint32_t swap_times_of(std::uint32_t rank) const {
    return rank < ranks.size() && ranks[rank].swap_times ? *ranks[rank].swap_times : swap_times;
  }
  [[nodiscard]] std::size_t load_lookahead_of(std::uint32_t rank) const {
    return rank < ranks.size() && ranks[rank].load_lookahead ? *ranks[rank].load_lookahead : load_lookahead;
  }
  [[nodiscard]] std::size_t offload_wait_delay_of(std::uint32_t rank) const {
    return rank < ranks.size() && ranks[rank].offload_wait_delay ? *ranks[rank].offload_wait_delay : offload_wait_delay;
  }
  [[nodiscard]] schedule::inject_options inject_options_of(std::uint32_t rank) const {
    return {load_lookahead_of(rank), offload_wait_delay_of(rank)};
  }
  [[nodiscard]] std::uint32_t swapped_tenths_of(std::uint32_t rank) const {
    return rank < ranks.size() && ranks[rank].swapped_tenths ? *ranks[rank].swapped_tenths : 10;
  }
  /// Of a stage's `layers`, the ones whose activations swap with their group at `tenths`
  /// (rank_settings::swapped_tenths): rounded up, at least one.
  [[nodiscard]] static std::uint32_t swapped_layers(std::uint32_t tenths, std::uint32_t layers) {
    return std::clamp<std::uint32_t>((tenths * layers + 9) / 10, std::min<std::uint32_t>(layers, 1), layers);
  }
  [[nodiscard]] std::uint64_t resident_share_of(std::uint32_t rank) const {
    return rank < ranks.size() && ranks[rank].resident_share ? *ranks[rank].resident_share : resident_share;
  }
  /// The most steps a run takes (steps, else max_steps with overlap, else 1).
  [[nodiscard]] std::uint32_t steps_to_run() const { return steps ? steps : overlap ? std::max(max_steps, 2u) : 1u; }
  /// Whether the run stops as soon as the period settles (steps unset, overlap).
  [[nodiscard]] bool until_steady() const { return steps == 0 && overlap; }
  /// Two consecutive periods agree when they differ by at most this fraction of the later one (or 1 ns).
  static constexpr double steady_tolerance = 1e-5;
};

struct rank_result {
  std::uint32_t rank = 0;
  /// The start of the reported step (T0; with overlap the end of the step before it, when the last
  /// rank returned from it) → the end of the rank's optimizer step
  mock::sim_time step_ns = 0;
  mock::sim_time pipeline_ns = 0;             ///< T0 → the end of the rank's last schedule entry
  std::uint64_t peak_bytes = 0;               ///< peak device bytes during the step, reserved bytes included
  bool fits = false;                          ///< peak_bytes <= device.memory_bytes
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0; ///< moved during the step
  std::uint32_t swapped_chunks = 0;           ///< activation groups swapped
  std::uint64_t resident_param_bytes = 0;     ///< weights + gradients
  std::uint64_t optimizer_state_bytes = 0;    ///< AdamW state (moments, master), wherever it lives
  std::uint64_t peak_host_bytes = 0;          ///< pinned host memory at its peak
  link_rates link;                            ///< the host-link rates this rank's copies got
  std::uint64_t corrupt_buffers = 0;          ///< materialize: saved activations that came back wrong
  /// With overlap and optimizer swap: optimizer batches on the device or in flight when the step
  /// began (resident share and prefetch), of `optimizer_batches`; the resident share's bytes; the
  /// budget's high-water mark over the run and its required reservations that went over it.
  std::size_t prefetched_batches = 0, optimizer_batches = 0;
  /// Peak device bytes (reserved included) from the step's start to the end of the rank's last
  /// forward: what the resident share must fit beside (the backward tail then only gives back).
  std::uint64_t peak_before_tail = 0;
  /// With the phases: bytes of the previous step's deferred offload the step's forwards waited for
  /// (transfer_engine::make_room gave them back behind the compute stream).
  std::uint64_t deferred_waited_bytes = 0;
  /// The compute slots its activation loads went out ahead of their backward (simulate(); 1: the
  /// reference placement).
  std::size_t load_lookahead = 1;
  /// The compute slots after their forward that its activation offloads were waited (simulate(); 1:
  /// the reference placement).
  std::size_t offload_wait_delay = 1;
  std::uint64_t resident_share_bytes = 0, budget_high_water = 0, over_budget = 0;
  /// Device bytes (reserved included) over the step: (time since T0, bytes) after each change.
  std::vector<std::pair<mock::sim_time, std::uint64_t>> memory;
};

struct sim_result {
  std::vector<rank_result> ranks;
  /// The step: without overlap the slowest rank's; with overlap the steady period, the time between
  /// the ends of the last two steps (the return of the rank that returns last), which equals the
  /// period before it when `steady`.
  mock::sim_time step_ns = 0;
  std::uint64_t peak_bytes = 0; ///< the largest rank's
  bool fits = false;            ///< every rank fits
  std::string trace_json;       ///< when sim_options::record_trace
  /// With more than one step: the time from each step's end (its last rank's return) to the next's.
  std::vector<mock::sim_time> periods;
  /// Whether the last two periods agree (sim_options::steady_tolerance); always for a single step.
  bool steady = true;
  /// The work behind this result: simulations run and training steps simulated in them (one run of
  /// simulate(); simulate_sized() counts every run it made).
  std::uint32_t simulations = 1, simulated_steps = 0;
};

} // namespace pipeswap::sim
