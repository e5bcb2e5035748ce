// pipeswap — the pipeline simulator: one training step of a scenario (sim/model.hpp) executed on one
// mock device per pipeline rank, with the library's own schedule generators, swap-step injection,
// activation swap manager, AdamW and optimizer-state swap runtime.
//
// Each rank's engine is the pipeline executor (exec/pipeline_executor.hpp, resumable form): its
// stages are the mock kernels below, its comm the scenario's P2P link on the mock's virtual clock
// (detail::link_comm, stream-ordered), the optimizer step with its collectives its finish (with
// overlap and optimizer swap, the runtime's phases driven by the executor). simulate_orders()
// advances every rank on one thread until a receive finds no message yet, and names what every rank
// waits for when none can go on.
//
// What runs, per rank:
//  * setup: the rank's weights and gradients (the parameter type), AdamW's state (fp32 moments and,
//    for 16-bit weights, an fp32 master copy) on the device — or, with optimizer swap, in pinned
//    host memory; then every rank's clock is aligned to a common start T0;
//  * the rank's order of the generated schedule (with swap steps injected when activations swap):
//    FWD is one kernel that reads the stage's weights and input and writes the saved activations
//    (one buffer per layer plus the stage input) and the output; BWD reads them and the incoming
//    gradient and writes the weight gradients and the outgoing gradient; sends and receives move
//    the stage boundary over a link with the scenario's P2P bandwidth and latency; the host waits
//    for every receive (as pipeline runtimes do) and issues each compute entry when the previous
//    one has finished, so swap steps go out one compute entry ahead of their use;
//  * after the rank's last backward: the data-parallel gradient reduce-scatter (or all-reduce) as a
//    kernel of its own duration, a host synchronization (the global gradient-norm reduction of
//    mixed-precision training), the optimizer step on the rank's optimizer shard, and with the
//    distributed optimizer the all-gather of the updated weights.
// Costs and sizes come from sim/model.hpp: tensor-parallel shards, gradient type, recomputation (a
// full-recomputation backward holds one layer's activations while it runs), the host-link rate each
// rank gets when its node's devices copy at once (host_link_rates).
// Reported per rank: the step's peak device memory (including the scenario's reserved bytes), its
// time from T0, the bytes each way over the host link, and the memory over time.
//
// Every operation goes through the mock backend's hazard checker (raising), so a simulated step is
// also a proof that the swap code orders its copies correctly for that schedule. With
// sim_options::materialize the mock holds real bytes: the forward writes a pattern into each saved
// activation and the backward checks it (rank_result::corrupt_buffers), which is how the tests show
// that data survives the round trip through host memory. docs/simulator.md states the model.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/pipeline_executor.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/schedule/validate.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

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

  /// The overlapped swap (docs/simulator.md, "Overlap"): two consecutive steps run and the second is
  /// reported (the steady state); with optimizer swap, each rank's runtime keeps its resident share
  /// on the device, prefetches the next step's first batches during the rank's backward tail as its
  /// device budget allows, and leaves the last offloads to drain into the next step's forward.
  /// false: one step, every copy of the optimizer state inside the step (the reference behaviour).
  bool overlap = false;
  /// Steps to run (the last one is reported); 0: two with overlap, one without.
  std::uint32_t steps = 0;
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
    return rank < ranks.size() && ranks[rank].offload_wait_delay ? *ranks[rank].offload_wait_delay
                                                                 : offload_wait_delay;
  }
  [[nodiscard]] schedule::inject_options inject_options_of(std::uint32_t rank) const {
    return {load_lookahead_of(rank), offload_wait_delay_of(rank)};
  }
  [[nodiscard]] std::uint64_t resident_share_of(std::uint32_t rank) const {
    return rank < ranks.size() && ranks[rank].resident_share ? *ranks[rank].resident_share : resident_share;
  }
  [[nodiscard]] std::uint32_t steps_to_run() const { return steps ? steps : overlap ? 2u : 1u; }
};

struct rank_result {
  std::uint32_t rank = 0;
  mock::sim_time step_ns = 0;     ///< T0 → the end of the rank's optimizer step
  mock::sim_time pipeline_ns = 0; ///< T0 → the end of the rank's last schedule entry
  std::uint64_t peak_bytes = 0;   ///< peak device bytes during the step, reserved bytes included
  bool fits = false;              ///< peak_bytes <= device.memory_bytes
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
  mock::sim_time step_ns = 0;   ///< the slowest rank's
  std::uint64_t peak_bytes = 0; ///< the largest rank's
  bool fits = false;            ///< every rank fits
  std::string trace_json;       ///< when sim_options::record_trace
};

/// How the scenario's stages map to ranks.
inline schedule::stage_layout layout_of(scenario const& s) {
  return schedule::stage_layout(static_cast<schedule::index_type>(s.pipeline.ranks),
                                static_cast<schedule::index_type>(s.pipeline.chunks), schedule::placement::loop);
}

/// The scenario's schedule with its send/receive steps, one order per rank (no swap steps).
inline schedule::rank_orders schedule_of(scenario const& s) {
  validate(s);
  auto const R = static_cast<schedule::index_type>(s.pipeline.ranks);
  auto const M = static_cast<schedule::index_type>(s.pipeline.micro_batches);
  switch (s.pipeline.schedule) {
  case schedule_kind::gpipe: return schedule::gpipe(R, M);
  case schedule_kind::one_f_one_b: return schedule::one_f_one_b(R, M);
  case schedule_kind::interleaved:
    return schedule::interleaved_1f1b(
        {R, static_cast<schedule::index_type>(s.pipeline.chunks), M, s.pipeline.overlap_b_f});
  }
  throw invalid_argument("scenario: unknown pipeline.schedule");
}

/// Injects swap steps into every rank's own order, for the chunks `filter` accepts (all when empty),
/// each rank's loads `lookahead(rank)` compute slots ahead of their backward (the reference placement
/// when `lookahead` is empty).
inline schedule::rank_orders inject_all(schedule::rank_orders orders,
                                        std::function<bool(std::uint32_t, schedule::chunk)> const& filter,
                                        std::function<std::size_t(std::uint32_t)> const& lookahead = {}) {
  for (std::size_t r = 0; r < orders.size(); ++r) {
    auto const rank = static_cast<std::uint32_t>(r);
    auto const eligible = [&](schedule::chunk c) { return !filter || filter(rank, c); };
    orders[r] = lookahead ? schedule::inject_swap_steps(orders[r], eligible, schedule::inject_options{lookahead(rank)})
                          : schedule::inject_swap_steps(orders[r], eligible);
  }
  return orders;
}

/// inject_all() with each rank's own injection options (`options(rank)`).
inline schedule::rank_orders inject_all(schedule::rank_orders orders,
                                        std::function<bool(std::uint32_t, schedule::chunk)> const& filter,
                                        std::function<schedule::inject_options(std::uint32_t)> const& options) {
  for (std::size_t r = 0; r < orders.size(); ++r) {
    auto const rank = static_cast<std::uint32_t>(r);
    auto const eligible = [&](schedule::chunk c) { return !filter || filter(rank, c); };
    orders[r] = schedule::inject_swap_steps(orders[r], eligible, options(rank));
  }
  return orders;
}

/// The load lookahead (inject_options::load_lookahead) that gives each activation load of `rank`
/// the time it needs: the fewest compute slots whose duration covers the copy of the rank's largest
/// swapped chunk over its host link, counting each slot as the rank's shortest forward (the slot
/// just before a backward in the 1F1B steady state is a forward). 1 (the reference) when one slot is
/// enough; at most half the rank's shortest forward-to-backward gap, so that a swapped chunk still
/// spends at least half of its life off the device (a link too slow for that cannot hide the load
/// by launching it earlier; it only gives the memory back). A setting derived from the model's
/// sizes; the simulation then shows what it gives.
namespace detail {
/// The fewest compute slots (each counted as `rank`'s shortest forward) that cover the copy of its
/// largest swapped chunk at `gbps`, within [1, max(1, its shortest swap gap / 2)].
inline std::size_t slots_covering_copy(scenario const& s, std::vector<stage_spec> const& stages, std::uint32_t rank,
                                       double gbps);
} // namespace detail

inline std::size_t load_lookahead_for(scenario const& s, std::vector<stage_spec> const& stages, std::uint32_t rank,
                                      link_rates const& link) {
  return detail::slots_covering_copy(s, stages, rank, link.h2d_gbps);
}

/// The offload wait delay (inject_options::offload_wait_delay) that gives each activation offload of
/// `rank` the time it needs before the host waits for it: as load_lookahead_for(), over the rank's
/// device-to-host rate. It matters in the pipeline fill, where forwards follow forwards: a delay of
/// 1 (the reference) there waits each offload one forward after its own.
inline std::size_t offload_wait_delay_for(scenario const& s, std::vector<stage_spec> const& stages,
                                          std::uint32_t rank, link_rates const& link) {
  return detail::slots_covering_copy(s, stages, rank, link.d2h_gbps);
}

inline std::size_t detail::slots_covering_copy(scenario const& s, std::vector<stage_spec> const& stages,
                                               std::uint32_t rank, double gbps) {
  auto const layout = layout_of(s);
  std::uint64_t bytes = 0;
  mock::sim_time slot = 0;
  for (auto const& st : stages) {
    if (layout.rank_of(static_cast<schedule::index_type>(st.stage)) != static_cast<schedule::index_type>(rank)) continue;
    bytes = std::max(bytes, st.activation_bytes - st.boundary_bytes);
    slot = slot == 0 ? st.fwd_ns : std::min(slot, st.fwd_ns);
  }
  auto const orders = schedule_of(s);
  std::size_t gap = 0;
  for (auto const& c : schedule::swap_candidates(orders.at(rank))) gap = gap == 0 ? c.gap() : std::min(gap, c.gap());
  if (bytes == 0 || slot <= 0 || !(gbps > 0) || gap == 0) return 1;
  double const copy_ns = s.device.copy_latency_us * 1e3 + static_cast<double>(bytes) / gbps;
  auto const k = static_cast<std::size_t>(std::ceil(copy_ns / static_cast<double>(slot)));
  return std::clamp<std::size_t>(k, 1, std::max<std::size_t>(1, gap / 2));
}

/// Sets every rank's load lookahead and offload wait delay that `o` leaves unset to
/// load_lookahead_for() and offload_wait_delay_for() (the link rates taken as when every rank swaps).
inline void set_load_lookaheads(sim_options& o, scenario const& s) {
  auto const stages = plan_stages(s, o.recompute.empty() ? std::vector<recompute_kind>{} : [&] {
    auto const layout = layout_of(s);
    std::vector<recompute_kind> per_stage;
    for (std::uint32_t st = 0; st < s.pipeline.ranks * s.pipeline.chunks; ++st)
      per_stage.push_back(o.recompute.at(static_cast<std::size_t>(layout.rank_of(static_cast<schedule::index_type>(st)))));
    return per_stage;
  }());
  auto const links = host_link_rates(s, std::vector<bool>(s.pipeline.ranks, true));
  if (o.ranks.empty()) o.ranks.resize(s.pipeline.ranks);
  for (std::uint32_t r = 0; r < s.pipeline.ranks && r < o.ranks.size(); ++r) {
    if (!o.ranks[r].load_lookahead) o.ranks[r].load_lookahead = load_lookahead_for(s, stages, r, links[r]);
    if (!o.ranks[r].offload_wait_delay) o.ranks[r].offload_wait_delay = offload_wait_delay_for(s, stages, r, links[r]);
  }
}

namespace detail {

using mock::sim_time;
using schedule::index_type;
using schedule::step;
using schedule::step_kind;

/// Messages in flight between ranks: arrival times on the receiver's clock by (sender, receiver,
/// tag).
struct mailbox {
  std::map<std::tuple<int, int, int>, sim_time> arrivals;
};

/// The scenario's P2P link between the simulated ranks, as a stream-ordered comm
/// (exec::stream_ordered_comm) on the mock devices' virtual clocks: a send enqueued on a stream
/// leaves when that stream reaches it and arrives one link time later (latency plus bytes over the
/// P2P bandwidth); a receive completes once its message was sent, and then makes its stream wait
/// the arrival. Every rank runs on one thread (simulate_orders advances each until a receive has no
/// message yet), so a wait that cannot complete now never will: wait_for() does not block.
class link_comm {
public:
  using comm_concept = exec::comm_tag;
  static constexpr bool reads_device_memory = true;
  static constexpr bool stream_ordered = true;
  struct request_type {
    bool done = false;
    int peer = 0, tag = 0;
    mock::stream stream{};
  };

  link_comm(mock::backend& b, mailbox& mb, int rank, int size, index_type stages, device_spec const& d)
      : b_(b), mb_(mb), rank_(rank), size_(size), stages_(stages), latency_us_(d.p2p_latency_us), gbps_(d.p2p_gbps) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  int max_tag() const { return std::numeric_limits<int>::max(); }

  request_type isend(void const*, std::size_t, int, int) { throw exec::comm_error("link_comm: operations are stream-ordered"); }
  request_type irecv(void*, std::size_t, int, int) { throw exec::comm_error("link_comm: operations are stream-ordered"); }

  request_type isend(void const*, std::size_t n, int peer, int tag, mock::stream s) {
    auto const start = std::max(b_.ready_time(s), b_.now());
    auto const arrival = start + link_time(n);
    auto const m = exec::boundary_of_tag(tag, stages_);
    b_.wait_until(s, arrival, schedule::to_text(schedule::leaf(m.dir ? step_kind::bwd_send : step_kind::fwd_send,
                                                               m.dir ? m.stage + 1 : m.stage - 1, m.micro)));
    mb_.arrivals[{rank_, peer, tag}] = arrival;
    return {true, peer, tag, s};
  }
  request_type irecv(void*, std::size_t, int peer, int tag, mock::stream s) { return {false, peer, tag, s}; }

  bool test(request_type& r) {
    if (r.done) return true;
    auto it = mb_.arrivals.find({r.peer, rank_, r.tag});
    if (it == mb_.arrivals.end()) return false;
    auto const arrival = it->second;
    mb_.arrivals.erase(it);
    auto const m = exec::boundary_of_tag(r.tag, stages_);
    b_.wait_until(r.stream, arrival,
                  schedule::to_text(schedule::leaf(m.dir ? step_kind::bwd_recv : step_kind::fwd_recv, m.stage, m.micro)));
    r.done = true;
    return true;
  }
  bool wait_for(request_type& r, std::chrono::milliseconds) { return test(r); }
  void abort(std::string_view) {}

private:
  sim_time link_time(std::size_t bytes) const {
    return static_cast<sim_time>(latency_us_ * 1e3 + static_cast<double>(bytes) / (gbps_ * 1e9) * 1e9);
  }

  mock::backend& b_;
  mailbox& mb_;
  int rank_, size_;
  index_type stages_;
  double latency_us_, gbps_;
};

static_assert(exec::stream_ordered_comm<link_comm, mock::stream>);

inline std::byte pattern_of(index_type stage, index_type micro, std::size_t index) {
  auto const h = (static_cast<std::uint64_t>(stage) * 1000003u + static_cast<std::uint64_t>(micro)) * 131u + index;
  return static_cast<std::byte>(1 + h % 251);
}

/// Runs `f`; a rank's failure in the executor surfaces as what caused it (a hazard, the optimizer
/// step's step_error, a bad order).
template <class F>
decltype(auto) unwrapped(F&& f) {
  try {
    return f();
  } catch (exec::rank_failure const& e) {
    std::rethrow_if_nested(e);
    throw;
  }
}

/// One rank: its mock device, runtimes and parameters, and the pipeline executor that runs its order
/// with the stages below (mock kernels) over link_comm.
class rank_sim {
public:
  using opt_type = adamw<mock::backend>;

  rank_sim(scenario const& s, std::vector<stage_spec> const& stages, schedule::stage_layout const& layout,
           std::uint32_t rank, schedule::order ord, sim_options const& o, link_rates const& link, mailbox& mb)
      : s_(s), stages_(stages), layout_(layout), rank_(rank), order_(std::move(ord)),
        link_(link), b_(mock_options(s, o, link)), budget_(room_of(s)), engine_(b_, pool_options(o)), opt_(b_),
        comm_(b_, mb, static_cast<int>(rank), static_cast<int>(s.pipeline.ranks), layout.stages(), s.device) {
    overlap_ = o.overlap;
    declare_weights_ = o.check_hazards || o.materialize;
    // With overlap one budget governs both swap jobs of the device; it is attached before any
    // runtime allocates, and its capacity follows the room the rest of the step leaves.
    if (overlap_) engine_.set_budget(&budget_);
    std::map<index_type, stage_model*> models;
    for (auto const& st : stages_) {
      if (layout_.rank_of(static_cast<index_type>(st.stage)) != static_cast<index_type>(rank_)) continue;
      auto const i = static_cast<index_type>(st.stage);
      models[i] = &models_.emplace(i, stage_model{this, &st}).first->second;
    }
    swap_config cfg;
    // Without optimizer swap the step is one batch: one fused update of every parameter.
    bool const swap_opt = o.swaps_optimizer(rank);
    cfg.swap_times = swap_opt ? o.swap_times_of(rank) : 1;
    cfg.packed = o.packed;
    if (!swap_opt) cfg.state_keys = std::vector<std::string>{};
    phased_ = overlap_ && swap_opt && !(rank < o.ranks.size() && o.ranks[rank].phased == false);
    batches_ = cfg.swap_times;
    if (phased_) {
      cfg.resident_share = static_cast<std::size_t>(o.resident_share_of(rank));
      cfg.defer_offload = true;
    }
    // The executor: its p2p streams, receives posted at their entries (the link's), the host waiting
    // each receive and pacing compute entries; the end of the step is end_of_step below.
    exec::executor_options eo;
    eo.host_waits_receives = true;
    eo.optimizer_phases = phased_;
    eo.sync_before_finish = false;
    eo.settle_device = !overlap_;
    ex_.emplace(engine_, comm_, layout_, std::move(models), eo);
    auto const cs = b_.current_stream();
    auto const es = size_of(s.model.param_dtype);
    auto const gtype = grad_dtype_of(s.model);
    auto const gs = size_of(gtype);
    bool const master = s.model.fp32_master;
    for (auto const& st : stages_) {
      if (layout_.rank_of(static_cast<index_type>(st.stage)) != static_cast<index_type>(rank_)) continue;
      auto& w = weights_[st.stage];
      for (auto const& t : st.tensors) {
        if (t.numel == 0) continue;
        w.params.push_back({b_.allocate_device(t.numel * es, cs), t.numel * es});
        w.grads.push_back({b_.allocate_device(t.numel * gs, cs), t.numel * gs});
        // The distributed optimizer updates this rank's 1/dp share of every tensor (a prefix here).
        auto const shard = optimizer_shard(t.numel, s.parallel, t.expert);
        opt_.add_param({w.params.back().ptr, w.grads.back().ptr, shard, s.model.param_dtype, gtype, master});
        resident_param_bytes_ += t.numel * (es + gs);
        optimizer_state_bytes_ += shard * (master ? 12 : 8);
        stage_params_ += t.numel;
        if (t.expert) expert_params_ += t.numel;
      }
    }
    for (auto const& st : stages_) {
      if (layout_.rank_of(static_cast<index_type>(st.stage)) != static_cast<index_type>(rank_)) continue;
      // What one compute entry may still allocate outside the budget: a backward's outgoing gradient,
      // its workspace, a received gradient and a forward's output, twice over (two entries in flight).
      transient_ = std::max<std::uint64_t>(transient_, 2 * (st.boundary_bytes + st.backward_workspace_bytes + 2 * st.p2p_bytes));
    }
    // The runtime materializes every slot (zeroed moments, master copies) at construction; with
    // nothing swappable it keeps them all on the device.
    osw_.emplace(engine_, opt_, cfg);
  }

  rank_sim(rank_sim const&) = delete;
  rank_sim& operator=(rank_sim const&) = delete;

  ~rank_sim() {
    try {
      ex_.reset();
      osw_.reset();
      auto const cs = b_.current_stream();
      for (auto& [_, w] : weights_) {
        for (auto& p : w.params) b_.deallocate_device(p.ptr, p.bytes, cs);
        for (auto& g : w.grads) b_.deallocate_device(g.ptr, g.bytes, cs);
      }
    } catch (...) {
    }
  }

  mock::backend& backend() noexcept { return b_; }
  bool done() const noexcept { return ex_->entries_done(); }

  /// Settles setup work; returns the rank's clock after it.
  sim_time finish_setup() {
    b_.synchronize_device();
    return b_.now();
  }

  /// Starts a step at `t0` (the host idles until then if it is earlier than now). The first step
  /// starts at the common T0; without overlap every later one at the time the previous step ended on
  /// every rank, with overlap each rank's host goes on as soon as its own previous step returned.
  /// With the phases, the executor finishes the previous step's deferred offload behind the h2d
  /// stream: it drains into this step's forward.
  void start(sim_time t0) {
    if (t0 > b_.now()) b_.host_compute(t0 - b_.now(), "wait for the other ranks");
    start_ = b_.now();
    h2d0_ = b_.bytes_copied_h2d();
    d2h0_ = b_.bytes_copied_d2h();
    unwrapped([&] { ex_->begin_step(order_, end_); });
  }

  /// Runs entries until the order ends or a receive waits for data not sent yet. Returns the number
  /// of entries run.
  std::size_t advance() {
    return unwrapped([&] { return ex_->advance(); });
  }

  /// After the order: the executor's end of the step (end_of_step). Returns the time the step
  /// ended: without overlap when every copy has finished, with overlap when the host returns from
  /// the step (the deferred offloads still in flight drain into the next step's forward).
  sim_time end_step() {
    unwrapped([&] { ex_->end_step(end_); });
    end_time_ = overlap_ ? b_.now() : b_.makespan();
    return end_time_;
  }

  /// The last step's result, its times from `t0` (the time every rank's previous step had ended, or
  /// T0). Its memory is the rank's from its own start of the step (never later than `t0`).
  rank_result finish(sim_time t0) {
    rank_result r;
    r.rank = rank_;
    r.pipeline_ns = pipeline_end_ - t0;
    r.step_ns = end_time_ - t0;
    r.h2d_bytes = b_.bytes_copied_h2d() - h2d0_;
    r.d2h_bytes = b_.bytes_copied_d2h() - d2h0_;
    r.swapped_chunks = static_cast<std::uint32_t>(ex_->last_stats().swapped_chunks);
    r.resident_param_bytes = resident_param_bytes_;
    r.optimizer_state_bytes = optimizer_state_bytes_;
    r.peak_host_bytes = b_.peak_host_bytes();
    r.link = link_;
    r.corrupt_buffers = corrupt_;
    if (phased_) {
      r.prefetched_batches = prefetched_;
      r.optimizer_batches = batches_;
      r.resident_share_bytes = osw_->resident_share_bytes();
      r.budget_high_water = budget_.high_water();
      r.over_budget = budget_.over_budget_count();
    }
    auto const reserved = s_.device.reserved_bytes;
    auto const timeline = b_.device_memory_timeline();
    auto const from = std::min(start_, t0);
    auto it = std::lower_bound(timeline.begin(), timeline.end(), from,
                               [](auto const& p, sim_time t) { return p.first < t; });
    std::uint64_t const at_from = it == timeline.begin() ? 0 : std::prev(it)->second;
    std::uint64_t peak = at_from;
    r.memory.emplace_back(0, at_from + reserved);
    std::uint64_t before_tail = at_from;
    for (; it != timeline.end() && it->first <= end_time_; ++it) {
      r.memory.emplace_back(std::max<sim_time>(it->first - t0, 0), it->second + reserved);
      peak = std::max<std::uint64_t>(peak, it->second);
      if (it->first <= tail_from_) before_tail = std::max<std::uint64_t>(before_tail, it->second);
    }
    r.peak_before_tail = before_tail + reserved;
    r.memory.emplace_back(r.step_ns, r.memory.back().second);
    r.peak_bytes = peak + reserved;
    r.fits = r.peak_bytes <= s_.device.memory_bytes;
    return r;
  }

  /// What this rank waits for, for deadlock reports.
  std::string waiting_for() const {
    if (done()) return "nothing";
    auto const pc = ex_->position();
    return schedule::to_text(*order_[pc]) + " at position " + std::to_string(pc);
  }

private:
  struct owned {
    device_ptr ptr;
    std::size_t bytes = 0;
  };
  struct stage_weights {
    std::vector<owned> params, grads;
  };

  /// A stage of the scenario as the executor's Stage: its forward and backward are mock kernels of
  /// the model's durations over the stage's weights, gradients and activations (one saved buffer per
  /// layer; stage 0 also saves its input, the embedding output it writes, kept on the device); with
  /// materialize the forward writes a pattern into every saved activation and the backward checks it.
  /// A full-recomputation backward holds one layer's activations (its workspace) while it runs.
  struct stage_model {
    using stage_concept = exec::stage_tag;
    rank_sim* r;
    stage_spec const* st;

    std::size_t input_bytes() const { return st->boundary_bytes; }
    std::size_t output_bytes() const { return st->p2p_bytes; }

    void forward(exec::forward_args<mock::backend>& f) {
      auto& b = r->b_;
      auto const cs = f.stream;
      bool const first = f.stage == 0;
      bool const last = static_cast<std::size_t>(f.stage) + 1 == r->stages_.size();
      // The stage input: received (or handed over by the previous stage on this rank), or for stage
      // 0 the embedding output this forward writes.
      owned in = first ? owned{b.allocate_device(st->boundary_bytes, cs), st->boundary_bytes}
                       : owned{f.input.ptr, f.input.bytes};
      auto const layer_total = st->activation_bytes - st->boundary_bytes;
      auto const layers = std::max<std::uint32_t>(st->layers, 1);
      std::vector<owned> acts;
      for (std::uint32_t l = 0; l < layers; ++l) {
        auto const n = layer_total / layers + (l + 1 == layers ? layer_total % layers : 0);
        acts.push_back({n ? b.allocate_device(n, cs) : device_ptr{}, n});
      }
      mock::kernel_desc d{name_of("FWD", f.stage, f.micro), {}, {}, st->fwd_ns};
      if (r->declare_weights_)
        for (auto const& p : r->weights_.at(st->stage).params) d.reads.push_back({p.ptr, p.bytes});
      (first ? d.writes : d.reads).push_back({in.ptr, in.bytes});
      for (auto const& a : acts) d.writes.push_back({a.ptr, a.bytes});
      if (!last) d.writes.push_back({f.output.ptr, f.output.bytes});
      std::vector<owned> written = acts;
      if (first) written.insert(written.begin(), owned{in.ptr, in.bytes});
      b.launch(cs, std::move(d), [written, st_ = f.stage, m = f.micro, first](mock::kernel_context const& ctx) {
        for (std::size_t i = 0; i < written.size(); ++i) {
          auto const idx = first ? i : i + 1;
          auto span = ctx.write<std::byte>(written[i].ptr, written[i].bytes);
          std::fill(span.begin(), span.end(), pattern_of(st_, m, idx));
        }
      });
      // The pipeline owns the stage input until the backward: it stays on the device.
      if (first) f.keep(in.ptr, in.bytes);
      for (auto const& a : acts) f.save(a.ptr, a.bytes);
      if (r->ex_->forwards_left() == 1) r->tail_from_ = b.ready_time(cs); // the last forward: the backward tail begins
    }

    void backward(exec::backward_args<mock::backend>& g) {
      auto& b = r->b_;
      auto const cs = g.stream;
      bool const first = g.stage == 0;
      bool const last = static_cast<std::size_t>(g.stage) + 1 == r->stages_.size();
      // The forward's buffers as the model sees them: the input, then one per layer.
      std::vector<owned> bufs;
      if (!first) bufs.push_back({g.input.ptr, g.input.bytes});
      for (auto const& x : g.saved) bufs.push_back({x.ptr, x.bytes});
      // Full recomputation rebuilds one layer's activations at a time while the backward runs.
      owned work{};
      if (st->backward_workspace_bytes) work = {b.allocate_device(st->backward_workspace_bytes, cs), st->backward_workspace_bytes};
      mock::kernel_desc d{name_of("BWD", g.stage, g.micro), {}, {}, st->bwd_ns};
      if (work.bytes) d.writes.push_back({work.ptr, work.bytes});
      auto const& w = r->weights_.at(st->stage);
      if (r->declare_weights_)
        for (auto const& p : w.params) d.reads.push_back({p.ptr, p.bytes});
      for (auto const& x : bufs) {
        if (x.bytes) d.reads.push_back({x.ptr, x.bytes});
      }
      if (!last) d.reads.push_back({g.grad_output.ptr, g.grad_output.bytes});
      if (r->declare_weights_)
        for (auto const& x : w.grads) d.writes.push_back({x.ptr, x.bytes});
      if (g.grad_input.bytes) d.writes.push_back({g.grad_input.ptr, g.grad_input.bytes});
      // A received input's bytes are the sender's; what the forward wrote is checked.
      b.launch(cs, std::move(d),
               [bufs, first, st_ = g.stage, m = g.micro, bad = &r->corrupt_](mock::kernel_context const& ctx) {
                 for (std::size_t i = first ? 0 : 1; i < bufs.size(); ++i) {
                   auto span = ctx.read<std::byte>(bufs[i].ptr, bufs[i].bytes);
                   auto const want = pattern_of(st_, m, i);
                   if (std::any_of(span.begin(), span.end(), [&](std::byte v) { return v != want; })) ++*bad;
                 }
               });
      if (work.bytes) g.release_after(work.ptr, work.bytes);
    }
  };

  /// The executor's end of the step: the optimizer step and the collectives around it, and with the
  /// phases the runtime's prefetch (the budget's capacity first set to the room the step leaves).
  struct end_of_step {
    rank_sim* r;
    void prefetch(std::size_t n) {
      r->update_budget();
      r->osw_->prefetch(n);
    }
    bool offload_pending() const { return r->osw_->offload_pending(); }
    void finish_offload(mock::stream s) { r->osw_->finish_offload(s); }
    /// After the rank's last backward: the data-parallel gradient reduce-scatter (or all-reduce) as
    /// a kernel of its own duration, the host synchronization (the global gradient-norm reduction of
    /// mixed-precision training), the optimizer step, the weights' all-gather.
    void step() { r->optimizer_step(); }
  };

  void optimizer_step() {
    auto const cs = b_.current_stream();
    pipeline_end_ = overlap_ ? std::max({b_.ready_time(cs), b_.ready_time(ex_->send_stream()), b_.ready_time(ex_->recv_stream())})
                             : b_.makespan();
    // Data parallelism: the gradients are reduced (scattered) before the step, on their own link.
    if (auto const ns = dp_grad_sync_ns(s_, stage_params_, expert_params_); ns > 0) collective_kernel("DP grad sync", ns, false);
    b_.synchronize(b_.record_event(cs)); // the gradient-norm reduction before the step
    if (phased_) prefetch_now();         // the room the last backward gave back
    prefetched_ = phased_ ? osw_->prefetched_batches() : 0;
    osw_->step();
    if (auto const ns = dp_param_gather_ns(s_, stage_params_, expert_params_); ns > 0) collective_kernel("DP param all-gather", ns, true);
    // The executor then synchronizes the compute stream (overlap) or the device.
  }

  static mock::options mock_options(scenario const& s, sim_options const& o, link_rates const& link) {
    mock::options m;
    m.timing = timing_of(s.device, link);
    m.hazards = o.check_hazards ? mock::hazard_policy::raise : mock::hazard_policy::ignore;
    m.materialize = o.materialize;
    return m;
  }

  /// Materialized runs are small: small pinned chunks keep them cheap on the real host.
  static pinned_pool_options pool_options(sim_options const& o) {
    if (o.materialize) return {std::size_t{1} << 20, std::size_t{256} << 10, 512};
    return {};
  }

  /// A collective over the rank's weights (`params`) or gradients, as a kernel of duration `ns`.
  void collective_kernel(char const* name, sim_time ns, bool params) {
    mock::kernel_desc d{name, {}, {}, ns};
    if (declare_weights_)
      for (auto& [_, w] : weights_)
        for (auto const& x : params ? w.params : w.grads) {
          d.reads.push_back({x.ptr, x.bytes});
          d.writes.push_back({x.ptr, x.bytes});
        }
    b_.launch(b_.current_stream(), std::move(d));
  }

  static std::string name_of(char const* what, index_type st, index_type m) {
    return std::string(what) + " s" + std::to_string(st) + " m" + std::to_string(m);
  }

  /// The budget's capacity: the device's room for the job less what lives outside the budget now
  /// (weights, gradients, state that never swaps, activations not swapped, pipeline buffers) and the
  /// transient bytes the next compute entries may allocate outside it.
  void update_budget() {
    auto const outside = b_.device_bytes_in_use() - std::min<std::uint64_t>(b_.device_bytes_in_use(), budget_.used());
    auto const room = room_of(s_);
    budget_.set_capacity(room > outside + transient_ ? room - outside - transient_ : 0);
  }

  void prefetch_now() {
    update_budget();
    osw_->prefetch();
  }

  static std::uint64_t room_of(scenario const& s) {
    return s.device.memory_bytes > s.device.reserved_bytes ? s.device.memory_bytes - s.device.reserved_bytes : 0;
  }

  using executor_type = exec::pipeline_executor<mock::backend, link_comm, stage_model>;

  scenario const& s_;
  std::vector<stage_spec> const& stages_;
  schedule::stage_layout layout_;
  std::uint32_t rank_;
  schedule::order order_;
  link_rates link_;
  mock::backend b_;
  device_budget budget_; ///< with overlap: the swap runtimes' share of the device (update_budget)
  transfer_engine<mock::backend> engine_;
  opt_type opt_;
  link_comm comm_;
  std::map<index_type, stage_model> models_;
  std::optional<executor_type> ex_;
  end_of_step end_{this};
  std::optional<optimizer_swap<opt_type>> osw_;
  std::map<std::uint32_t, stage_weights> weights_;
  bool overlap_ = false, phased_ = false;
  /// The stage kernels and collectives declare the weights and gradients they touch: for the hazard
  /// checker (and materialized bytes) only, their durations are the model's.
  bool declare_weights_ = true;
  std::uint64_t transient_ = 0;
  std::size_t prefetched_ = 0, batches_ = 0;
  sim_time start_ = 0, pipeline_end_ = 0, end_time_ = 0, tail_from_ = 0;
  std::size_t h2d0_ = 0, d2h0_ = 0;
  std::uint64_t resident_param_bytes_ = 0, optimizer_state_bytes_ = 0, corrupt_ = 0, stage_params_ = 0, expert_params_ = 0;
};

/// A per-rank input of simulate() has one entry per pipeline rank (or none, where `empty_ok`).
inline void require_per_rank(scenario const& s, std::size_t n, char const* what, bool empty_ok = true) {
  if (n == s.pipeline.ranks || (empty_ok && n == 0)) return;
  throw invalid_argument("simulate: " + std::to_string(n) + " " + what + " for " + std::to_string(s.pipeline.ranks) +
                         " ranks");
}

} // namespace detail

/// Runs one training step of `s` with the given per-rank orders (send/receive steps included; swap
/// steps only where activations should swap) and reports it. The orders are checked first
/// (schedule::check_schedule): invalid_argument names the problems. A deadlock found while running
/// throws state_error naming what every rank waits for.
inline sim_result simulate_orders(scenario const& s, schedule::rank_orders const& orders, sim_options const& o) {
  auto const layout = layout_of(s);
  detail::require_per_rank(s, orders.size(), "orders", false);
  detail::require_per_rank(s, o.ranks.size(), "rank settings");
  detail::require_per_rank(s, o.recompute.size(), "recomputation settings");
  std::vector<recompute_kind> per_stage;
  if (!o.recompute.empty()) {
    for (std::uint32_t st = 0; st < s.pipeline.ranks * s.pipeline.chunks; ++st)
      per_stage.push_back(o.recompute[static_cast<std::size_t>(layout.rank_of(static_cast<schedule::index_type>(st)))]);
  }
  auto const stages = plan_stages(s, per_stage);
  // The ranks that copy to or from the host share their node's host bandwidth.
  std::vector<bool> swaps(s.pipeline.ranks);
  for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r)
    swaps[r] = o.swaps_optimizer(r) || std::any_of(orders[r].begin(), orders[r].end(), [](auto const& e) {
                 return e && e->kind == schedule::step_kind::swap_launch_offload;
               });
  auto const links = host_link_rates(s, swaps);
  if (auto const report = schedule::check_schedule(orders, layout); !report.ok()) {
    throw invalid_argument("simulate: the schedule is not valid: " + schedule::to_string(report));
  }
  detail::mailbox mb; // before the ranks, whose links post into it
  std::vector<std::unique_ptr<detail::rank_sim>> ranks;
  mock::sim_time t0 = 0;
  for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r) {
    ranks.push_back(std::make_unique<detail::rank_sim>(s, stages, layout, r, orders[r], o, links[r], mb));
    t0 = std::max(t0, ranks.back()->finish_setup());
  }
  auto const steps = o.steps_to_run();
  std::size_t total = 0, done = 0, reported = 0;
  for (auto const& r : orders) total += r.size();
  total *= steps;
  mock::sim_time t_report = t0; // when every rank's previous step had ended (T0 for the first)
  for (std::uint32_t k = 0; k < steps; ++k) {
    for (auto& r : ranks) r->start(k == 0 || !o.overlap ? t_report : mock::sim_time{0});
    mb.arrivals.clear();
    for (;;) {
      std::size_t progressed = 0;
      bool all_done = true;
      for (auto& r : ranks) {
        progressed += r->advance();
        all_done = all_done && r->done();
      }
      done += progressed;
      if (o.progress && (done - reported) * 100 >= total) {
        o.progress(total ? static_cast<double>(done) / static_cast<double>(total) : 1.0);
        reported = done;
      }
      if (all_done) break;
      if (progressed == 0) {
        std::string what = "simulate: deadlock" + (steps > 1 ? " in step " + std::to_string(k + 1) : std::string()) + ": ";
        for (std::uint32_t r = 0; r < ranks.size(); ++r) {
          if (ranks[r]->done()) continue;
          what += "rank " + std::to_string(r) + " waits at " + ranks[r]->waiting_for() + "; ";
        }
        throw state_error(what.substr(0, what.size() - 2));
      }
    }
    mock::sim_time ended = 0;
    for (auto& r : ranks) ended = std::max(ended, r->end_step());
    if (k + 1 < steps) t_report = ended;
  }
  sim_result out;
  out.fits = true;
  for (auto& r : ranks) {
    out.ranks.push_back(r->finish(t_report));
    auto const& rr = out.ranks.back();
    out.step_ns = std::max(out.step_ns, rr.step_ns);
    out.peak_bytes = std::max(out.peak_bytes, rr.peak_bytes);
    out.fits = out.fits && rr.fits;
  }
  if (o.record_trace) {
    std::ostringstream os;
    bool first = true;
    os << R"({"displayTimeUnit":"ns","traceEvents":[)";
    for (std::uint32_t r = 0; r < ranks.size(); ++r) {
      ranks[r]->backend().write_trace_events(os, first, static_cast<int>(r + 1), "rank " + std::to_string(r));
    }
    os << "\n]}\n";
    out.trace_json = std::move(os).str();
  }
  if (o.progress) o.progress(1.0);
  return out;
}

/// Runs one training step of `s`: its schedule (schedule_of), with swap steps injected into every
/// rank's order when o.swap_activations (for the chunks o.activation_filter accepts).
inline sim_result simulate(scenario const& s, sim_options const& o) {
  auto orders = schedule_of(s);
  if (o.swap_activations) {
    bool reference = true; // every rank at the reference placement: inject exactly as the reference does
    for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r)
      reference = reference && o.inject_options_of(r) == schedule::inject_options{};
    orders = reference ? inject_all(std::move(orders), o.activation_filter)
                       : inject_all(std::move(orders), o.activation_filter,
                                    std::function<schedule::inject_options(std::uint32_t)>(
                                        [&o](std::uint32_t r) { return o.inject_options_of(r); }));
  }
  auto res = simulate_orders(s, orders, o);
  if (o.swap_activations)
    for (auto& r : res.ranks)
      if (r.swapped_chunks > 0) {
        r.load_lookahead = o.load_lookahead_of(r.rank);
        r.offload_wait_delay = o.offload_wait_delay_of(r.rank);
      }
  return res;
}

} // namespace pipeswap::sim

// simulate_sized(), the overlapped run sized per rank, lives in its own header.
#include <pipeswap/sim/sized.hpp>
