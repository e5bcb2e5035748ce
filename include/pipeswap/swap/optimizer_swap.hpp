// pipeswap — the optimizer-state swap runtime.
//
// optimizer_swap<O, Partition> keeps an optimizer's swappable state in pinned host memory between
// steps and streams it through the device during step(), in batches chosen by the partition policy.
// It is a client of transfer_engine: every state change, copy, release and wait of a piece goes
// through the engine's life cycle (core/transfer.hpp). This class orders its parts, each in
// swap/detail/ and each depending on the backend only:
//   attachment.hpp           adopting the optimizer's state, handing it back
//   step_plan.hpp            a step's batches, the pieces each moves, the plan cache
//   per_tensor_pipeline.hpp  the step one batch ahead, each piece in its own storage
//   packed_pipeline.hpp      the step through two staging arenas, the relay
//   carry_over.hpp           what one step leaves the next: the resident share, prefetched batches,
//                            a deferred offload, their budget holds
//   step_trace.hpp           the operation in progress (named by errors) and the listener
//
// Phases around the step (docs/optimizer.md, "Phases") are all optional and off by default; with
// them off the two pipelines run op for op as written in their headers.
//
// Ownership (docs/optimizer.md): the state belongs to the optimizer (O::swap_state()). A runtime
// attaches on construction (a second live runtime over one optimizer is refused), adopts what an
// earlier runtime handed back, and hands everything back on destruction, so a new runtime with other
// settings continues from the same bytes. The optimizer refuses new parameters while attached.
//
// Guarantees (docs/guarantees.md): results are bit-identical to the same optimizer without swap;
// device memory holds at most the unswappable state plus two batches (per-tensor) or
// two arenas (packed), plus the resident share and what prefetch() admits; every release is
// stream-ordered behind the copy that reads it. If step() throws, transfers in flight are drained,
// no piece is left in d2h or h2d, every state is intact, and the next step() resumes the interrupted
// step from the batch that failed (the same gradients must still be in place), or
// discard_interrupted_step() abandons it. The exception is a step_error that names the batch, its
// parameters and the operation, with the original nested.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/optim/state.hpp>
#include <pipeswap/swap/detail/attachment.hpp>
#include <pipeswap/swap/detail/carry_over.hpp>
#include <pipeswap/swap/detail/packed_pipeline.hpp>
#include <pipeswap/swap/detail/per_tensor_pipeline.hpp>
#include <pipeswap/swap/detail/step_plan.hpp>
#include <pipeswap/swap/detail/step_trace.hpp>
#include <pipeswap/swap/partition.hpp>
#include <pipeswap/swap/slot.hpp>
#include <pipeswap/swap/swap_config.hpp>
#include <pipeswap/swap/swap_event.hpp>

namespace pipeswap {

template <swap_optimizer O, partition_policy P = balanced_partition>
class optimizer_swap {
public:
  using optimizer_type = O;
  using backend_type = typename O::backend_type;
  using B = backend_type;
  using buffer = swap_buffer<B>;
  /// Receives every pipeline operation, in issue order, as to_string(swap_event) (tests, tracing).
  using listener = detail::step_trace::listener;
  /// Receives every pipeline operation, in issue order, as a swap_event.
  using event_listener = detail::step_trace::event_listener;

  /// Attaches to `opt`'s state and materializes it: adopts what an earlier runtime handed back,
  /// creates the rest (zeros on the host, masters written and offloaded). Throws state_error when
  /// another runtime is attached to `opt`, or its state was lost; invalid_argument for a bad config.
  optimizer_swap(transfer_engine<B>& engine, O& opt, swap_config cfg = {}, P policy = {});

  optimizer_swap(optimizer_swap const&) = delete;
  optimizer_swap& operator=(optimizer_swap const&) = delete;

  /// Hands the state back to the optimizer (swapped slots in its host stores, unswappable slots with
  /// their device storage) and detaches. An interrupted step is abandoned. Never throws; if the
  /// backend fails here, the state is marked lost (optimizer_state::lost()) and released.
  ~optimizer_swap();

  /// Runs one optimizer step (or completes an interrupted one). See the header comment.
  void step();

  /// True after step() threw: the next step() finishes that step.
  [[nodiscard]] bool has_interrupted_step() const noexcept { return pending_.has_value(); }
  /// Abandons an interrupted step: batches already updated stay updated, the rest are not.
  void discard_interrupted_step() noexcept { pending_.reset(); }

  /// Quiesces for a checkpoint: every swappable piece ends host-resident with its mirror complete and
  /// host-synchronized, device storage released (hyper-parallel calls it synchronize_cpu_mirrors). A
  /// deferred offload is finished first; prefetched and resident-share batches go home too (the next
  /// step brings the resident share back). Must not be called from inside a step (it is not
  /// reentrant).
  void synchronize_host_mirrors();

  // ----- phases around the step (docs/optimizer.md, "Phases") -------------------------------------

  /// Starts the H2D of the next step's first batches that are neither resident nor in flight, in
  /// step order, into their own device storage: at most `max_batches`, each only while the engine's
  /// budget admits it as an optional reservation (its bytes plus the step's streaming window, the
  /// activations' reload demand left free; no budget: no limit). A deferred offload is finished,
  /// stream-ordered, as soon as a batch needs its room or is one of its batches. Never blocks the
  /// host; safe to call after every backward of the cool-down. Returns the batches resident or in
  /// flight for the next step (0 before the first step: no batch order is known yet). Throws
  /// state_error while an interrupted step is pending or from inside step(); a failing copy or
  /// allocation throws step_error (operation "load"), every batch it had kept back on the host.
  std::size_t prefetch(std::size_t max_batches = std::numeric_limits<std::size_t>::max());

  /// Finishes a deferred offload: the compute stream waits its D2Hs and its storage is released
  /// (stream-ordered, behind the copies). No-op when none is pending. Never blocks the host.
  void finish_offload() { finish_offload(engine_.compute()); }
  /// As finish_offload(), with `next_user` waiting the D2Hs instead of the compute stream: e.g. the
  /// engine's h2d stream at a forward boundary, so the storage returns behind the copies while the
  /// compute stream's forward does not wait for them (the next prefetch orders after them anyway).
  void finish_offload(stream_t<B> next_user);
  /// True while a deferred offload is in flight (step() with defer_offload returned).
  [[nodiscard]] bool offload_pending() const noexcept { return carry().offload_pending(); }
  /// Batches resident or in flight for the next step (resident share included).
  [[nodiscard]] std::size_t prefetched_batches() const noexcept { return carry().kept(); }
  /// Bytes of the resident share actually kept by the last plan (rounded down to whole batches).
  [[nodiscard]] std::size_t resident_share_bytes() const noexcept { return planner_.current().resident_share_bytes; }
  /// Batches of the resident share in the last plan.
  [[nodiscard]] std::size_t resident_batches() const noexcept { return planner_.current().resident; }

  void set_listener(listener l) { trace_.set_listener(detail::string_listener(std::move(l))); }
  void set_event_listener(event_listener l) { trace_.set_event_listener(std::move(l)); }

  [[nodiscard]] O& optimizer() noexcept { return opt_; }
  [[nodiscard]] transfer_engine<B>& engine() noexcept { return engine_; }
  [[nodiscard]] swap_config const& config() const noexcept { return cfg_; }
  /// The batches of the last step.
  [[nodiscard]] batch_plan const& last_plan() const noexcept { return planner_.current().plan; }
  /// Device bytes of the state that is never swapped (slots that are not swappable). The resident
  /// share, swappable state kept on the device between steps, is resident_share_bytes().
  [[nodiscard]] std::size_t unswappable_bytes() const noexcept { return attached_.unswappable_bytes(); }
  /// Bytes of state that is swapped.
  [[nodiscard]] std::size_t swappable_bytes() const noexcept { return attached_.swappable_bytes(); }
  /// Bytes of the larger staging arena of the last packed step (0 for per-tensor).
  [[nodiscard]] std::size_t arena_bytes() const noexcept { return packed_.arena_bytes(); }
  /// Bytes of the largest batch of the last step.
  [[nodiscard]] std::size_t max_batch_bytes() const noexcept { return planner_.current().max_batch_bytes; }
  /// Pinned bytes of the host stores that hold the swapped state (one per dtype).
  [[nodiscard]] std::size_t host_store_bytes() const noexcept { return opt_.swap_state().host_bytes(); }

  // ----- the placement of one slot (checkpoints, tests) --------------------------------------------

  /// Whether slot i (an index into the optimizer's slots()) is swapped.
  [[nodiscard]] bool is_swappable(std::size_t i) const { return attached_.slot(i).swappable; }
  /// The host mirror of swappable slot i (its bytes are current after synchronize_host_mirrors()).
  [[nodiscard]] std::span<std::byte> host_mirror(std::size_t i) const { return attached_.host_mirror(i, opt_.slots()); }
  /// The device storage of non-swappable slot i.
  [[nodiscard]] device_pointer_t<B> unswappable_device(std::size_t i) const {
    return attached_.unswappable_device(i, opt_.slots());
  }
  /// True when every piece of slot i is in `r`.
  [[nodiscard]] bool slot_in(std::size_t i, residency r) const { return attached_.slot(i).all(r); }
  /// True when no copy of any piece is in flight.
  [[nodiscard]] bool at_rest() const noexcept { return attached_.at_rest(); }

  /// Checkpoint loads: gives non-swappable slot i the device storage `fresh` (same size, filled and
  /// ordered before the compute stream's next work); the old one is released stream-ordered.
  void replace_unswappable(detail::runtime_access, std::size_t i, device_pointer_t<B> fresh) {
    auto& s = attached_.slots().at(i);
    engine_.replace_device(s.pieces.at(0), fresh);
  }

private:
  using plan_data = detail::step_plan<B>;
  struct step_state {
    typename O::step_context ctx;
    detail::plan_ref<B> d; // null until planned
    std::size_t next = 0;  // first batch not yet updated
  };
  static detail::runtime_access access() noexcept { return detail::runtime_access{}; }

  /// Kept batches, a deferred offload and their own storage, from one step to the next: the
  /// pipeline's in use.
  detail::carry_over<B>& carry() noexcept {
    return cfg_.packed ? static_cast<detail::carry_over<B>&>(packed_.carry()) : per_tensor_.carry();
  }
  detail::carry_over<B> const& carry() const noexcept {
    return cfg_.packed ? static_cast<detail::carry_over<B> const&>(packed_.carry()) : per_tensor_.carry();
  }

  // ----- attaching and handing back ----------------------------------------------------------------

  /// Hands the state back to the optimizer (destructor). Never throws.
  void hand_back() noexcept {
    auto& home = opt_.swap_state();
    pending_.reset();
    trace_.clear_listener(); // nothing to trace any more, and nothing here may throw
    try {
      carry().finish_deferred(engine_.compute());
      carry().evict();
      packed_.evacuate();
      attached_.park(home, opt_.slots());
    } catch (...) {
      home.set_lost(access());
      try {
        carry().release_all();
        attached_.discard();
      } catch (...) { // what could not be released stays with the backend
      }
      attached_.forget(home);
    }
    home.set_attached(access(), false);
  }

  // ----- steps -------------------------------------------------------------------------------------

  [[noreturn]] void rethrow_with_context() {
    rethrow_phase("step", pending_ ? pending_->d.get() : nullptr,
                  pending_ ? "the step is interrupted: step() resumes it, discard_interrupted_step() abandons it"
                           : "no step is pending");
  }

  /// Partitions the step and cuts the slots to match. The step context is created first and kept, so
  /// a failure here retries the same step instead of advancing step counts twice. The plan is reused
  /// while the units, their sizes and the slots' piece layout are unchanged.
  void plan_step(step_state& st) {
    trace_.note("plan");
    auto units = opt_.update_units(st.ctx);
    if (auto hit = planner_.lookup(units, detail::view(attached_.slots()))) {
      st.d = std::move(hit);
      return;
    }
    auto key = planner_.key(units, detail::view(attached_.slots()));
    if (carry().plan()) carry().evict(); // the batch order changed: what was kept goes home first
    auto batches = policy_(detail::view(key.items), cfg_.swap_times);
    st.d = planner_.build(std::move(key), std::move(batches), units, opt_.slots(), attached_.slots(), engine_,
                          cfg_.packed, cfg_.resident_share);
  }

  /// The update of batch n of the step in progress (the pipelines call it through update_call); the
  /// optimizer reads the device address of element e of slot i through its state_view.
  void update_batch(std::size_t n) {
    auto& st = *pending_;
    trace_.emit(swap_event::kind::update, n);
    detail::scoped_label<B> l(b_, detail::batch_label("update", n).c_str());
    auto const resolve = [this](std::size_t i, std::size_t e) { return attached_.device_address(i, e, opt_.slots()); };
    opt_.update(detail::view(st.d->plan[n]), st.ctx, state_view<B>(resolve));
  }

  /// A failed phase: a step_error naming the phase, its batch and what became of it.
  [[noreturn]] void rethrow_phase(char const* phase, plan_data const* d, char const* outcome) {
    detail::rethrow_as_step_error(trace_.where(), phase, d, outcome);
  }

  transfer_engine<B>& engine_;
  B& b_;
  O& opt_;
  swap_config cfg_;
  P policy_;
  detail::attachment<B> attached_{engine_}; ///< the slots and their storage
  std::optional<step_state> pending_;
  detail::step_planner<B> planner_; ///< the last plan, reused while the step's units do not change
  detail::step_trace trace_;        ///< the operation in progress, and the listener
  char const* busy_ = nullptr;      ///< the public call in progress (reentrancy)
  detail::per_tensor_pipeline<B> per_tensor_{{engine_, trace_, attached_.slots(), cfg_.defer_offload}};
  detail::packed_pipeline<B> packed_{{engine_, trace_, attached_.slots(), cfg_.defer_offload}};
};

// The entry points a program calls are defined out of the class: they are not inline, so a
// translation unit that declares the runtime extern (<pipeswap/swap/instantiate.hpp>) neither
// instantiates nor compiles them, nor the private members only they reach.

template <swap_optimizer O, partition_policy P>
optimizer_swap<O, P>::~optimizer_swap() {
  hand_back();
  engine_.remove_room_source(carry());
}

template <swap_optimizer O, partition_policy P>
optimizer_swap<O, P>::optimizer_swap(transfer_engine<B>& engine, O& opt, swap_config cfg, P policy)
    : engine_(engine), b_(engine.backend()), opt_(opt), cfg_(std::move(cfg)), policy_(policy) {
  if constexpr (P::splits_units) {
    static_assert(O::splittable, "split_partition needs an optimizer whose update is elementwise");
  }
  cfg_.validate();
  opt_.validate();
  engine_.check_budget("optimizer_swap::optimizer_swap");
  auto& home = opt_.swap_state();
  if (home.attached()) {
    throw state_error("optimizer_swap: the optimizer is already managed by another live optimizer_swap; "
                      "destroy that runtime first (its state carries over to the next one)");
  }
  if (home.lost()) {
    throw state_error("optimizer_swap: the optimizer's state was lost when an earlier runtime could not "
                      "hand it back (its backend failed during destruction); build a new optimizer");
  }
  unsigned key_mask = 0; // bit k: state_key k is eligible for swap
  if (cfg_.state_keys) {
    for (auto k : validate_state_keys(detail::view(*cfg_.state_keys))) key_mask |= 1u << static_cast<unsigned>(k);
  } else {
    for (auto k : supported_state_keys) key_mask |= 1u << static_cast<unsigned>(k);
  }
  home.set_attached(access(), true);
  try {
    attached_.adopt(home, opt_.slots(), {cfg_.min_swap_numel, key_mask},
                    [this](std::size_t i, device_pointer_t<B> dst) { opt_.initialize(i, dst); });
  } catch (...) {
    home.set_attached(access(), false);
    throw;
  }
  // Allocations under the engine's budget (transfer_engine::make_room) may wait the deferred offload.
  try {
    engine_.add_room_source(carry());
  } catch (...) {
    hand_back();
    throw;
  }
}

template <swap_optimizer O, partition_policy P>
void optimizer_swap<O, P>::step() {
  detail::call_guard guard(busy_, "step");
  engine_.check_budget("optimizer_swap::step");
  trace_.note("step");
  try {
    carry().finish_deferred(engine_.h2d());
    if (carry().eviction_failed()) carry().evict();
    packed_.evacuate();
    if (!pending_) pending_.emplace(step_state{opt_.prepare_step(), {}, 0});
    auto& st = *pending_;
    if (!st.d) plan_step(st);
    auto const update_fn = [this](std::size_t n) { update_batch(n); };
    detail::update_call const update(update_fn);
    try { // each pipeline recovers from its own failures, leaving every state intact
      cfg_.packed ? packed_.run(st.d, st.next, update) : per_tensor_.run(st.d, st.next, update);
    } catch (...) {
      cfg_.packed ? packed_.abort() : per_tensor_.abort(*st.d);
      throw;
    }
    trace_.note("finish_step");
    opt_.finish_step(st.ctx);
    pending_.reset();
  } catch (...) {
    rethrow_with_context();
  }
}

template <swap_optimizer O, partition_policy P>
void optimizer_swap<O, P>::synchronize_host_mirrors() {
  detail::call_guard guard(busy_, "synchronize_host_mirrors");
  carry().finish_deferred(engine_.compute());
  carry().evict();
  packed_.evacuate();
  auto bufs = detail::pieces_of(attached_.slots(), true);
  engine_.synchronize_to_host(bufs);
}

template <swap_optimizer O, partition_policy P>
std::size_t optimizer_swap<O, P>::prefetch(std::size_t max_batches) {
  detail::call_guard guard(busy_, "prefetch");
  if (pending_) {
    throw state_error("optimizer_swap::prefetch: a step is interrupted; call step() to resume it or "
                      "discard_interrupted_step() before prefetching the next one");
  }
  engine_.check_budget("optimizer_swap::prefetch");
  trace_.note("prefetch");
  detail::plan_ref<B> plan;
  try {
    if (carry().eviction_failed()) carry().evict();
    packed_.evacuate();
    if (!planner_.last()) {
      carry().finish_deferred(engine_.h2d());
      return carry().kept();
    }
    plan = planner_.last();
    if (carry().plan() && carry().plan() != plan) carry().evict();
    carry().prefetch(plan, max_batches);
    return carry().kept();
  } catch (...) {
    auto const failed = trace_.where();
    try {
      carry().evict();
    } catch (...) { // kept: retried first thing in the next call
    }
    trace_.restore(failed);
    rethrow_phase("prefetch", plan.get(), "every batch it had kept is back on the host, nothing was lost");
  }
}

template <swap_optimizer O, partition_policy P>
void optimizer_swap<O, P>::finish_offload(stream_t<B> next_user) {
  detail::call_guard guard(busy_, "finish_offload");
  trace_.note("finish_offload");
  try {
    carry().finish_deferred(next_user);
  } catch (...) {
    rethrow_phase("finish_offload", planner_.last().get(), "the offload stays pending; call finish_offload() again");
  }
}

} // namespace pipeswap
