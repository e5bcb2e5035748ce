// pipeswap — what the optimizer-swap runtime carries from one step to the next.
//
// Between two steps the runtime may hold kept batches of one plan. Their life cycle is one state,
// carry_over::keep_state:
//   none       nothing is kept; plan() is null.
//   kept       batches [0, kept()) of plan() are on the device (or loading) in their own storage:
//              the resident share, and what prefetch() brought in (kept() may be 0). A step or a
//              prefetch enters it; evict() leaves it.
//   evicting   an eviction threw part-way: what it did not bring home stays kept, and every entry
//              point retries it first (eviction_failed()).
// Beside the kept batches, and not a state of theirs, a deferred offload may drain: step() returned
// with D2Hs in flight (defer_offload), their storage held until finish_deferred() orders the next
// user behind them and releases it (offload_pending()). It is a resource with its own state because
// it overlaps every keep_state on purpose: prefetch() loads the next step's batches, or evicts a
// plan that changed, while the offload still drains, so both directions of the link stay busy.
//
// carry_over is what both pipelines share; what a batch's own storage is, and how a deferred offload
// holds it, is the pipeline's: packed_carry (packed_pipeline.hpp) keeps each batch in its own arena
// and holds staging arenas, per_tensor_carry (per_tensor_pipeline.hpp) keeps the pieces' own storage
// and counts it by budget holds. Depends on the backend only, not on the optimizer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/swap/detail/step_plan.hpp>
#include <pipeswap/swap/detail/step_trace.hpp>
#include <pipeswap/swap/slot.hpp>

namespace pipeswap::detail {

/// What both pipelines carry over (kept batches in their keep_state, a deferred offload draining
/// beside them) and how it is prefetched, finished and evicted. What a batch's own storage is belongs
/// to the pipeline: packed_carry (packed_pipeline.hpp) keeps own arenas, per_tensor_carry
/// (per_tensor_pipeline.hpp) budget holds; they supply it through the hooks below.
template <backend B>
class carry_over : public room_source<B> {
public:
  using plan_ptr = plan_ref<B>;

  carry_over(carry_over const&) = delete;
  carry_over& operator=(carry_over const&) = delete;

  /// The kept batches' life cycle (the header comment).
  enum class keep_state : std::uint8_t { none, kept, evicting };

  [[nodiscard]] std::size_t kept() const noexcept { return kept_; }
  [[nodiscard]] bool offload_pending() const noexcept { return drain_.pending; }
  [[nodiscard]] bool eviction_failed() const noexcept { return state_ == keep_state::evicting; }
  /// The plan the kept batches (and own storage) belong to; null when none.
  [[nodiscard]] plan_ptr const& plan() const noexcept { return plan_; }

  // ----- used by a step --------------------------------------------------------------------------

  /// A step of `d` begins: the kept batches, own storage and holds from now on belong to it.
  void begin_step(plan_ptr const& d) {
    plan_ = d;
    state_ = keep_state::kept;
    fit_to(*d);
  }
  /// Batch n of the step's plan is loading into its own storage, counted before its copies so that a
  /// failure brings it home.
  void keep(std::size_t n) noexcept { kept_ = n + 1; }
  /// The step offloaded its non-resident own batches: only the resident share stays kept.
  void keep_only(std::size_t resident) noexcept { kept_ = resident; }

  /// The step returns with D2Hs in flight; what they read stays held until finish_deferred().
  void defer() noexcept { drain_ = {true, engine_.releases_issued()}; }

  // ----- between steps ---------------------------------------------------------------------------

  /// Loads the next step's first batches of `d` that are neither kept nor in flight, in step order,
  /// at most `max_batches`, each while the engine's budget admits it as an optional reservation.
  ///
  /// With a deferred offload pending, its storage is still counted in the budget (held) and every
  /// release of the step before it is already ordered before the h2d stream, so batches that fit
  /// next to it are loaded without waiting its D2Hs: the two directions of the link stay busy at
  /// once. The deferred offload is finished (the h2d stream waits its D2Hs) only when the next batch
  /// needs its room or is one of its batches.
  void prefetch(plan_ptr const& plan, std::size_t max_batches) {
    auto const& d = *plan;
    auto const N = d.size();
    auto const unit = window_unit(d);
    // Releases issued since the step deferred (activation offloads of a step the deferred offload
    // drained into, batches it gave back) are not ordered before the h2d stream yet: then the
    // prefetch waits them like any other.
    bool gated = drain_.pending && engine_.releases_issued() == drain_.releases_at_defer;
    for (std::size_t launched = 0; kept_ < N && launched < max_batches; ++launched) {
      auto const n = kept_;
      auto const rest = N - n - 1;
      if (drain_.pending) {
        bool in_flight = false;
        for (auto* p : d.batch(n)) in_flight = in_flight || p->state() == residency::d2h;
        if (in_flight) finish_deferred_batch(d, n); // the rest of the deferred offload keeps running
      }
      before_prefetch(d, n);
      // Own storage the deferred offload left for this batch is reused (its bytes are counted), and
      // the staging it holds is the step's window (released before the step allocates).
      auto const held_window = deferred_window();
      auto const full_window = std::min<std::size_t>(2, rest) * unit;
      auto const window = full_window > held_window ? full_window - held_window : 0;
      auto need = own_need(d, n) + window;
      if (drain_.pending && !engine_.fits_optional(need)) { // the room the deferred offload holds is needed
        finish_deferred(engine_.h2d());
        need = own_need(d, n) + full_window;
      }
      if (!engine_.admits_optional(need)) break;
      if (!gated) { // the storage it takes may be what the d2h stream just released
        wait_at(wait_site::prefetch_after_release, b_, engine_.h2d(), b_.record_event(engine_.d2h()));
        gated = true;
      }
      plan_ = plan;
      state_ = keep_state::kept;
      fit_to(d);
      keep(n);
      load_kept(d, n);
    }
  }

  /// Finishes a deferred offload with `next_user` ordered behind its D2Hs, and releases what it
  /// held. Returns whether there was one.
  bool finish_deferred(stream_t<B> next_user) {
    if (!drain_.pending) return false;
    trace_.emit(swap_event::kind::finish_deferred);
    auto all = pieces_of(slots_, true); // only the pieces in d2h are touched
    engine_.wait_offload(detail::view(all), next_user, wait_site::finish_deferred);
    release_deferred(next_user);
    drain_.pending = false;
    return true;
  }

  /// transfer_engine::make_room: the deferred offload gives its storage back behind `user`, batch by
  /// batch in step order (`user` waits each batch's D2H, then the batch's own storage is released
  /// behind it), until `bytes` fit in the budget; the staging it holds goes last, with the whole
  /// offload finished (finish_deferred). Returns the budget bytes given back.
  std::uint64_t give_room(std::uint64_t bytes, stream_t<B> user) override {
    if (!drain_.pending || state_ == keep_state::none) return 0; // its batches are found through plan()
    auto const before = engine_.reserved_bytes(budget_client::optimizer);
    auto const& d = *plan_;
    for (std::size_t n = 0; n < d.size() && !engine_.fits_required(bytes); ++n) {
      bool in_flight = false;
      for (auto* p : d.batch(n)) in_flight = in_flight || p->state() == residency::d2h;
      if (!in_flight) continue;
      trace_.emit(swap_event::kind::finish_deferred, n);
      engine_.wait_offload(d.batch(n), user, wait_site::finish_deferred);
      give_batch(n, user);
    }
    if (!engine_.fits_required(bytes)) finish_deferred(user);
    auto const after = engine_.reserved_bytes(budget_client::optimizer);
    return before > after ? before - after : 0;
  }

  /// Brings every kept batch home and releases its own storage. Idempotent: if a copy fails, what is
  /// left stays kept and the next call (every entry point retries) finishes.
  void evict() {
    if (state_ == keep_state::none) return;
    state_ = keep_state::evicting;
    auto const saved = trace_.where();
    trace_.note("evict");
    auto const& d = *plan_;
    auto const upto = std::max(kept_, own_extent());
    for (std::size_t n = 0; n < upto && n < d.size(); ++n) evict_batch(d, n);
    forget_own();
    kept_ = 0;
    plan_.reset();
    state_ = keep_state::none;
    trace_.restore(saved);
  }

  /// Hand-back after a failure: releases all own storage and every hold without copying.
  virtual void release_all() = 0;

protected:
  carry_over(transfer_engine<B>& engine, step_trace& trace, lean_vector<slot_storage<B>>& slots)
      : engine_(engine), b_(engine.backend()), trace_(trace), slots_(slots) {}
  ~carry_over() = default;

  /// One batch of a deferred offload finished: the h2d stream waits its D2H only.
  void finish_deferred_batch(step_plan<B> const& d, std::size_t n) {
    trace_.emit(swap_event::kind::finish_deferred, n);
    engine_.wait_offload(d.batch(n), engine_.h2d(), wait_site::finish_deferred);
    batch_finished(n);
  }

  // ----- what the pipeline's own storage is --------------------------------------------------------

  /// The bookkeeping of own storage is sized for the batches of `d`.
  virtual void fit_to(step_plan<B> const& d) = 0;
  /// Bytes of the window a step of `d` streams through, per batch.
  [[nodiscard]] virtual std::size_t window_unit(step_plan<B> const& d) const = 0;
  /// Before batch n is prefetched (it may take storage the deferred offload left).
  virtual void before_prefetch(step_plan<B> const& d, std::size_t n) = 0;
  /// Bytes of the step's window the deferred offload already holds.
  [[nodiscard]] virtual std::size_t deferred_window() const noexcept = 0;
  /// Bytes batch n's own storage still needs from the budget.
  [[nodiscard]] virtual std::size_t own_need(step_plan<B> const& d, std::size_t n) const = 0;
  /// The H2D of kept batch n into its own storage.
  virtual void load_kept(step_plan<B> const& d, std::size_t n) = 0;
  /// Batch n of the deferred offload finished (its D2H is waited).
  virtual void batch_finished(std::size_t n) noexcept = 0;
  /// Batch n of the deferred offload finished with `user` waiting its D2H (make_room): its own
  /// storage is released behind `user`.
  virtual void give_batch(std::size_t n, stream_t<B> user) = 0;
  /// The whole deferred offload finished: what it held is released behind `next_user`.
  virtual void release_deferred(stream_t<B> next_user) = 0;
  /// Batches [0, own_extent()) may have own storage besides the kept ones.
  [[nodiscard]] virtual std::size_t own_extent() const noexcept = 0;
  /// Brings kept batch n home and releases its own storage.
  virtual void evict_batch(step_plan<B> const& d, std::size_t n) = 0;
  /// Every kept batch is home.
  virtual void forget_own() noexcept = 0;

  transfer_engine<B>& engine_;
  B& b_;
  step_trace& trace_;

private:
  lean_vector<slot_storage<B>>& slots_;
  /// The deferred offload (the header comment): pending from defer() to finish_deferred().
  struct drain {
    bool pending = false;
    std::uint64_t releases_at_defer = 0; ///< engine_.releases_issued() when the offload was deferred
  };

  keep_state state_ = keep_state::none;
  plan_ptr plan_; ///< null exactly in keep_state::none
  std::size_t kept_ = 0;
  drain drain_;
};

} // namespace pipeswap::detail
