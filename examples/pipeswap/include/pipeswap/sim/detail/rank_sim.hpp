// pipeswap — one rank of the pipeline simulator (internal to sim/pipeline.hpp): its mock device, swap
// runtimes, AdamW and parameters, and the pipeline executor that runs its order with the stages as
// mock kernels over the simulated P2P link (detail/link_comm.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/pipeline_executor.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/sim/detail/link_comm.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/sim_options.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

namespace pipeswap::sim::detail {

using mock::sim_time;
using schedule::index_type;
using schedule::step;
using schedule::step_kind;

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
      : s_(s), stages_(stages), layout_(layout), rank_(rank), order_(std::move(ord)), link_(link),
        b_(mock_options(s, o, link)), budget_(room_of(s)), engine_(b_, pool_options(o)), opt_(b_),
        comm_(b_, mb, static_cast<int>(rank), static_cast<int>(s.pipeline.ranks), layout.stages(), s), mb_(mb) {
    overlap_ = o.overlap;
    swapped_tenths_ = o.swapped_tenths_of(rank);
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
    // The previous step's deferred offload stays counted in the budget into this step: the forwards
    // ask the engine for room before they allocate (make_room), so they wait (part of) it where the
    // device would not hold both.
    eo.finish_offload_at_start = false;
    eo.sync_before_finish = false;
    eo.settle_device = !overlap_;
    ex_.emplace(engine_, comm_, layout_, std::move(models), eo);
    auto const cs = b_.current_stream();
    // With FSDP and an fp32 master the rank's weight shard is the fp32 master itself, which AdamW
    // updates in place (held_weight_dtype()): registered as an fp32 weight without a master.
    auto const wtype = held_weight_dtype(s.model, s.parallel);
    auto const es = size_of(wtype);
    auto const gtype = grad_dtype_of(s.model);
    auto const gs = size_of(gtype);
    bool const master = optimizer_keeps_master(s.model, s.parallel);
    auto const state_per_element = optimizer_state_bytes_per_element(s.model, s.parallel);
    std::vector<stage_spec> mine;
    for (auto const& st : stages_) {
      if (layout_.rank_of(static_cast<index_type>(st.stage)) != static_cast<index_type>(rank_)) continue;
      if (s.parallel.fsdp) mine.push_back(st); // what fsdp_gathered_bytes() reads
      auto& w = weights_[st.stage];
      for (auto const& t : st.tensors) {
        if (t.numel == 0) continue;
        // The distributed optimizer updates this rank's 1/dp share of every tensor (a prefix here);
        // with FSDP the weights and gradients are that share too, and what FSDP gathers is below.
        auto const shard = optimizer_shard(t.numel, s.parallel, t.expert);
        auto const held = held_elements(t, s.parallel);
        w.params.push_back({b_.allocate_device(held * es, cs), held * es});
        w.grads.push_back({b_.allocate_device(held * gs, cs), held * gs});
        opt_.add_param({w.params.back().ptr, w.grads.back().ptr, shard, wtype, gtype, master});
        resident_param_bytes_ += held * (es + gs);
        optimizer_state_bytes_ += shard * state_per_element;
        stage_params_ += t.numel;
        if (t.expert) expert_params_ += t.numel;
        w.param_count += t.numel;
        if (t.expert) w.expert_param_count += t.numel;
      }
    }
    // What FSDP holds gathered (weights and gradients unsharded), counted as held through the step.
    if (auto const gathered = fsdp_gathered_bytes(s, mine); gathered > 0) {
      (void)b_.allocate_device(gathered, cs);
      resident_param_bytes_ += gathered;
    }
    if (s.parallel.overlap_grad_reduce && !fsdp_per_layer(s) && dp_grad_sync_ns(s_, stage_params_, expert_params_) > 0)
      dp_stream_ = b_.new_stream("stream (data-parallel collectives)");
    if (fsdp_per_layer(s))
      for (auto const& st : mine) root_params_ += root_params(st);
    for (auto const& st : stages_) {
      if (layout_.rank_of(static_cast<index_type>(st.stage)) != static_cast<index_type>(rank_)) continue;
      // What one compute entry may still allocate outside the budget: a backward's outgoing gradient,
      // its workspace, a received gradient and a forward's output, twice over (two entries in flight).
      transient_ =
          std::max<std::uint64_t>(transient_, 2 * (st.boundary_bytes + st.backward_workspace_bytes + 2 * st.p2p_bytes));
    }
    // The runtime materializes every slot (zeroed moments, master copies) at construction; with
    // nothing swappable it keeps them all on the device.
    osw_.emplace(engine_, opt_, cfg);
  }

  rank_sim(rank_sim const&) = delete;
  rank_sim& operator=(rank_sim const&) = delete;

  /// The runtimes give their memory back; the weights and gradients go with the mock device, whose
  /// results are taken by then (releasing them one by one, each a logged operation, is work no
  /// figure reads).
  ~rank_sim() {
    try {
      ex_.reset();
      osw_.reset();
    } catch (...) {}
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
    deferred_waited_ = 0;
    h2d0_ = b_.bytes_copied_h2d();
    d2h0_ = b_.bytes_copied_d2h();
    blocked_since_.reset();
    unwrapped([&] { ex_->begin_step(order_, end_); });
  }

  /// Runs entries until the order ends or a receive waits for data not sent yet. Returns the number
  /// of entries run.
  /// A rank that stopped at a receive is not run again until a message was posted to it since it
  /// started that run (the receive could not complete otherwise, and finding that has no effect).
  std::size_t advance() {
    auto const posted = mb_.posted(static_cast<int>(rank_));
    if (blocked_since_ && *blocked_since_ == posted) return 0;
    auto const n = unwrapped([&] { return ex_->advance(); });
    blocked_since_ = done() ? std::nullopt : std::optional(posted);
    return n;
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
    auto it =
        std::lower_bound(timeline.begin(), timeline.end(), from, [](auto const& p, sim_time t) { return p.first < t; });
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
    r.deferred_waited_bytes = deferred_waited_;
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
    std::uint64_t param_count = 0, expert_param_count = 0;
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
      auto const layer_total = st->activation_bytes - st->boundary_bytes;
      r->make_room(layer_total + (first ? st->boundary_bytes : 0), cs);
      owned in = first ? owned{b.allocate_device(st->boundary_bytes, cs), st->boundary_bytes}
                       : owned{f.input.ptr, f.input.bytes};
      auto const layers = std::max<std::uint32_t>(st->layers, 1);
      std::vector<owned> acts;
      for (std::uint32_t l = 0; l < layers; ++l) {
        auto const n = layer_total / layers + (l + 1 == layers ? layer_total % layers : 0);
        acts.push_back({n ? b.allocate_device(n, cs) : device_ptr{}, n});
      }
      mock::kernel_desc d{r->name_of("FWD", f.stage, f.micro), {}, {}, r->compute_ns(*st, true)};
      if (r->declare_weights_) {
        for (auto const& p : r->weights_.at(st->stage).params) d.reads.push_back({p.ptr, p.bytes});
        (first ? d.writes : d.reads).push_back({in.ptr, in.bytes});
        for (auto const& a : acts) d.writes.push_back({a.ptr, a.bytes});
        if (!last) d.writes.push_back({f.output.ptr, f.output.bytes});
      }
      if (b.holds_bytes()) { // the body runs only on materialized bytes
        std::vector<owned> written = acts;
        if (first) written.insert(written.begin(), owned{in.ptr, in.bytes});
        b.launch(cs, std::move(d), [written, st_ = f.stage, m = f.micro, first](mock::kernel_context const& ctx) {
          for (std::size_t i = 0; i < written.size(); ++i) {
            auto const idx = first ? i : i + 1;
            auto span = ctx.write<std::byte>(written[i].ptr, written[i].bytes);
            std::fill(span.begin(), span.end(), pattern_of(st_, m, idx));
          }
        });
      } else {
        b.launch(cs, std::move(d));
      }
      // The pipeline owns the stage input until the backward: it stays on the device.
      if (first) f.keep(in.ptr, in.bytes);
      // The first layers' activations swap with the group (sim_options::rank_settings::swapped_tenths),
      // the others stay on the device.
      auto const swapped = sim_options::swapped_layers(r->swapped_tenths_, layers);
      for (std::uint32_t l = 0; l < layers; ++l) {
        if (l < swapped)
          f.save(acts[l].ptr, acts[l].bytes);
        else
          f.keep(acts[l].ptr, acts[l].bytes);
      }
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
      if (st->backward_workspace_bytes) r->make_room(st->backward_workspace_bytes, cs);
      if (st->backward_workspace_bytes)
        work = {b.allocate_device(st->backward_workspace_bytes, cs), st->backward_workspace_bytes};
      mock::kernel_desc d{r->name_of("BWD", g.stage, g.micro), {}, {}, r->compute_ns(*st, false)};
      // The stage's last backward completes its gradients: with overlap_grad_reduce their
      // reduce-scatter starts with it (grad_reduce_around).
      bool const reduce = r->dp_stream_ && g.micro + 1 == static_cast<index_type>(r->s_.pipeline.micro_batches);
      auto const before = reduce ? std::optional(b.record_event(cs)) : std::nullopt;
      if (r->declare_weights_) {
        auto const& w = r->weights_.at(st->stage);
        if (work.bytes) d.writes.push_back({work.ptr, work.bytes});
        for (auto const& p : w.params) d.reads.push_back({p.ptr, p.bytes});
        for (auto const& x : bufs) {
          if (x.bytes) d.reads.push_back({x.ptr, x.bytes});
        }
        if (!last) d.reads.push_back({g.grad_output.ptr, g.grad_output.bytes});
        for (auto const& x : w.grads) d.writes.push_back({x.ptr, x.bytes});
        if (g.grad_input.bytes) d.writes.push_back({g.grad_input.ptr, g.grad_input.bytes});
      }
      // A received input's bytes are the sender's; what the forward wrote is checked.
      if (b.holds_bytes())
        b.launch(cs, std::move(d),
                 [bufs, first, st_ = g.stage, m = g.micro, bad = &r->corrupt_](mock::kernel_context const& ctx) {
                   for (std::size_t i = first ? 0 : 1; i < bufs.size(); ++i) {
                     auto span = ctx.read<std::byte>(bufs[i].ptr, bufs[i].bytes);
                     auto const want = pattern_of(st_, m, i);
                     if (std::any_of(span.begin(), span.end(), [&](std::byte v) { return v != want; })) ++*bad;
                   }
                 });
      else
        b.launch(cs, std::move(d));
      if (before) r->grad_reduce_around(st->stage, *before, b.record_event(cs));
      if (work.bytes) g.release_after(work.ptr, work.bytes);
    }
  };

  /// The kernel time of a stage's forward (or backward) in the current entry. In a combined slot
  /// (pipeline.overlap_b_f) with overlap_moe_expert_parallel_comm, its expert all-to-alls run under
  /// the other half's compute (its time less its communication): only what exceeds that is exposed.
  sim_time compute_ns(stage_spec const& st, bool fwd) const {
    sim_time const full = fwd ? st.fwd_ns : st.bwd_ns, a2a = fwd ? st.fwd_a2a_ns : st.bwd_a2a_ns;
    if (a2a == 0 || !s_.parallel.overlap_moe_expert_parallel_comm) return full;
    auto const pc = ex_->position();
    if (pc >= order_.size() || !order_[pc] || !schedule::is_composite(order_[pc]->kind)) return full;
    for (auto const& leaf : order_[pc]->sub) {
      if (leaf.kind != (fwd ? step_kind::bwd : step_kind::fwd)) continue;
      auto const& other = stages_.at(static_cast<std::size_t>(leaf.stage));
      sim_time const busy = fwd ? other.bwd_ns - other.bwd_comm_ns : other.fwd_ns - other.fwd_comm_ns;
      // Hiding the all-to-alls never takes the half below what its host needs to issue it.
      return std::max(full - a2a + (a2a > busy ? a2a - busy : 0), fwd ? st.fwd_host_ns : st.bwd_host_ns);
    }
    return full;
  }

  /// overlap_grad_reduce: the stage's gradient reduce-scatter (all-reduce) on the data-parallel
  /// stream, bucket by bucket as its last backward (between `before` and `after`) produces them: all
  /// buckets but the last from the backward's start, the last once it has ended (Megatron-Core's
  /// buckets, dp_buckets), after what that stream still had to reduce. The collective occupies the
  /// network and NVLink, not the compute engine: the stream waits until it is done.
  void grad_reduce_around(std::uint32_t stage, mock::event const& before, mock::event const& after) {
    auto const& w = weights_.at(stage);
    auto const ns = dp_grad_sync_ns(s_, w.param_count, w.expert_param_count);
    if (ns == 0) return;
    auto const last = ns / static_cast<sim_time>(dp_buckets(s_, w.param_count));
    auto const start = std::max(b_.ready_time(*dp_stream_), before.time);
    auto const end = std::max(start + (ns - last), after.time) + last;
    b_.wait_event(*dp_stream_, after);
    b_.wait_until(*dp_stream_, end, "DP grad sync s" + std::to_string(stage));
  }

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
    pipeline_end_ =
        overlap_ ? std::max({b_.ready_time(cs), b_.ready_time(ex_->send_stream()), b_.ready_time(ex_->recv_stream())})
                 : (dp_stream_ ? b_.makespan_except(*dp_stream_) : b_.makespan());
    // Data parallelism: the gradients are reduced (scattered) before the step, on their own link:
    // with overlap_grad_reduce already under way on the data-parallel stream since each stage's last
    // backward (grad_reduce_around), the step waits for it; else after the last backward.
    // FSDP per layer: the layers' reductions ran in their backwards (plan_stages); the root unit's
    // gradients are reduced after the last backward, exposed.
    if (fsdp_per_layer(s_)) {
      if (auto const ns = dp_grad_sync_ns(s_, root_params_); ns > 0)
        collective_kernel("FSDP root reduce-scatter", ns, false);
    } else if (dp_stream_) {
      b_.wait_event(cs, b_.record_event(*dp_stream_));
    } else if (auto const ns = dp_grad_sync_ns(s_, stage_params_, expert_params_); ns > 0) {
      collective_kernel("DP grad sync", ns, false);
    }
    b_.synchronize(b_.record_event(cs)); // the gradient-norm reduction before the step
    if (phased_) prefetch_now();         // the room the last backward gave back
    prefetched_ = phased_ ? osw_->prefetched_batches() : 0;
    osw_->step();
    if (fsdp_per_layer(s_)) { // the root unit's gather before the next step's first forward, exposed
      if (auto const ns = dp_param_gather_ns(s_, root_params_); ns > 0)
        collective_kernel("FSDP root all-gather", ns, true);
    } else if (auto const ns = param_gather_exposed_ns(); ns > 0) {
      collective_kernel("DP param all-gather", ns, true);
    }
    // The executor then synchronizes the compute stream (overlap) or the device.
  }

  /// The weights' all-gather after the step as it delays the rank. With overlap_param_gather it
  /// runs bucket by bucket under the next step's first forward: exposed are one bucket, or what
  /// exceeds the first forward's compute (the rank's first stage), whichever is more; the simulator
  /// charges that at the end of the step (as a kernel of that duration).
  sim_time param_gather_exposed_ns() const {
    auto const ns = dp_param_gather_ns(s_, stage_params_, expert_params_);
    if (ns == 0 || !s_.parallel.overlap_param_gather) return ns;
    auto const& first = stages_.at(weights_.begin()->first);
    auto const busy = first.fwd_ns - first.fwd_comm_ns;
    auto const bucket = ns / static_cast<sim_time>(dp_buckets(s_, stage_params_));
    return std::max(bucket, ns > busy ? ns - busy : 0);
  }

  static mock::options mock_options(scenario const& s, sim_options const& o, link_rates const& link) {
    mock::options m;
    m.timing = timing_of(s.device, link);
    m.hazards = o.check_hazards ? mock::hazard_policy::raise : mock::hazard_policy::ignore;
    m.materialize = o.materialize;
    // The operations' records are read only by the hazard reports and the trace.
    m.keep_op_log = o.check_hazards || o.record_trace;
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

  /// A stage kernel's name: read by the op log and by the errors that name a declared region, so
  /// formatted only for them.
  std::string name_of(char const* what, index_type st, index_type m) const {
    if (!declare_weights_ && !b_.config().keep_op_log) return {};
    return std::string(what) + " s" + std::to_string(st) + " m" + std::to_string(m);
  }

  /// The budget's capacity: the device's room for the job less what lives outside the budget (weights,
  /// gradients, state that never swaps, activations not swapped, pipeline buffers) and the transient
  /// bytes the next compute entries may allocate outside it. What lives is counted in enqueue order
  /// (a release counts as soon as it is enqueued), or with `at` the device's bytes from the time
  /// `at` reaches on: storage whose release is still queued behind a copy (a swapped activation's,
  /// behind its offload) is still there for an allocation on `at`.
  void update_budget(std::optional<mock::stream> at = std::nullopt) {
    auto const live = at ? b_.device_bytes_live_from(b_.ready_time(*at)) : b_.device_bytes_in_use();
    auto const outside = live - std::min<std::uint64_t>(live, budget_.used());
    auto const room = room_of(s_);
    budget_.set_capacity(room > outside + transient_ ? room - outside - transient_ : 0);
  }

  /// Before a compute entry allocates `bytes` outside the budget on `s`: with a deferred offload
  /// still in flight, `s` waits as much of it as the device needs to hold them beside the rest
  /// (transfer_engine::make_room, the budget's capacity first set to the room the step leaves).
  void make_room(std::uint64_t bytes, mock::stream s) {
    if (!phased_ || !osw_->offload_pending()) return;
    update_budget(s);
    deferred_waited_ += engine_.make_room(bytes, s);
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
  mailbox& mb_;
  /// The mailbox's count of messages to this rank when the run that stopped at a receive began.
  std::optional<std::uint64_t> blocked_since_;
  std::map<index_type, stage_model> models_;
  std::optional<executor_type> ex_;
  end_of_step end_{this};
  std::optional<optimizer_swap<opt_type>> osw_;
  std::map<std::uint32_t, stage_weights> weights_;
  bool overlap_ = false, phased_ = false;
  std::uint32_t swapped_tenths_ = 10;     ///< sim_options::rank_settings::swapped_tenths
  std::optional<mock::stream> dp_stream_; ///< overlap_grad_reduce: the data-parallel collectives' stream
  std::uint64_t root_params_ = 0;         ///< fsdp_per_layer: the root unit's parameters on this rank
  /// The stage kernels and collectives declare the regions they touch (weights, gradients,
  /// activations, stage boundaries): for the hazard checker (and materialized bytes) only, their
  /// durations are the model's.
  bool declare_weights_ = true;
  std::uint64_t transient_ = 0;
  std::uint64_t deferred_waited_ = 0; ///< this step: bytes make_room gave the forwards
  std::size_t prefetched_ = 0, batches_ = 0;
  sim_time start_ = 0, pipeline_end_ = 0, end_time_ = 0, tail_from_ = 0;
  std::size_t h2d0_ = 0, d2h0_ = 0;
  std::uint64_t resident_param_bytes_ = 0, optimizer_state_bytes_ = 0, corrupt_ = 0, stage_params_ = 0,
                expert_params_ = 0;
};

} // namespace pipeswap::sim::detail
