// pipeswap — what the optimizer-swap runtime carries from one step to the next.
//
// Between two steps the runtime may hold, for one plan:
//   kept batches      batches [0, kept()) of plan() are on the device (or loading) in their own
//                     storage: the resident share, and what prefetch() brought in. Packed: each in
//                     its own arena (own_arena(n)); per tensor: in its pieces' own storage.
//   a deferred offload   step() returned with D2Hs in flight (defer_offload): their storage is held
//                     (staging arenas in held_arenas_, own arenas of the batches after kept(), and
//                     per-tensor storage counted by budget holds) until finish_deferred() orders the
//                     next user behind them and releases it. After a relayed step, the own arenas it
//                     leaves are handed to the next prefetch in D2H order (take_handoff()).
//   a failed eviction    an eviction that threw part-way; every entry point retries it first.
// kept(), offload_pending() and eviction_failed() say which of these hold. Every budget hold the carry-over takes is released by
// finish_deferred(), by the per-tensor step's own waits (release_holds()), or on hand-back.
// Depends on the backend only, not on the optimizer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

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

template <backend B>
class carry_over {
public:
  using buffer = swap_buffer<B>;
  using plan_ptr = plan_ref<B>;

  carry_over(transfer_engine<B>& engine, step_trace& trace, lean_vector<slot_storage<B>>& slots, bool packed)
      : engine_(engine), b_(engine.backend()), trace_(trace), slots_(slots), packed_(packed) {}

  [[nodiscard]] std::size_t kept() const noexcept { return kept_; }
  [[nodiscard]] bool offload_pending() const noexcept { return deferred_; }
  [[nodiscard]] bool eviction_failed() const noexcept { return must_evict_; }
  /// The plan the kept batches (and own arenas) belong to; null when none.
  [[nodiscard]] plan_ptr const& plan() const noexcept { return plan_; }

  // ----- used by a step --------------------------------------------------------------------------

  /// A step of `d` begins: the kept batches, own arenas and holds from now on belong to it.
  void begin_step(plan_ptr const& d) {
    plan_ = d;
    if (packed_ && own_.size() != d->size()) own_.resize(d->size());
  }
  /// Batch n of the step's plan is loading into its own storage, counted before its copies so that a
  /// failure brings it home.
  void keep(std::size_t n) noexcept { kept_ = n + 1; }
  /// The step offloaded its non-resident own batches: only the resident share stays kept.
  void keep_only(std::size_t resident) noexcept { kept_ = resident; }

  /// Packed: the own arena of batch n of the step's plan.
  [[nodiscard]] staging_arena<B>& own_arena(std::size_t n) { return own_[n]; }
  [[nodiscard]] bool has_own_arena(std::size_t n) const noexcept { return n < own_.size() && own_[n].base; }

  /// Packed: the H2D of batch n into its own arena (allocated if it has none).
  void load_own(step_plan<B> const& d, std::size_t n) {
    trace_.emit(swap_event::kind::load, n, swap_event::storage::own);
    if (!own_[n].base) engine_.allocate_arena(own_[n], d.staging[n].bytes);
    arena_storage<B> s{own_[n], d.staging[n]};
    engine_.launch_load(d.batch(n), s, batch_label("load", n).c_str());
  }

  /// Per tensor: the budget keeps counting batch n's storage (released behind a D2H nothing has
  /// waited yet) until the offload is finished.
  void hold_batch(std::size_t n, std::uint64_t bytes) {
    if (held_.size() <= n) held_.resize(n + 1, 0);
    if (engine_.hold(budget_client::optimizer, bytes)) held_[n] += bytes;
  }
  /// Every hold ends (the D2Hs they cover were waited).
  void release_holds() noexcept {
    for (auto const bytes : held_) {
      if (bytes) engine_.unhold(budget_client::optimizer, bytes);
    }
    held_.clear();
  }

  /// The step returns with D2Hs in flight: `staging` (a staging arena the offload reads) is held
  /// until the offload is finished, and the offload becomes pending.
  void defer(staging_arena<B>& staging) {
    if (!staging.base) return;
    held_arenas_.push_back(std::move(staging));
    staging = staging_arena<B>{};
    deferred_ = true;
  }
  /// The step returns with D2Hs in flight that it holds in no staging arena (own arenas, or
  /// per-tensor storage counted by holds).
  void defer() noexcept { deferred_ = true; }

  /// After a relayed step, the batches whose own arenas the deferred offload leaves, in D2H order.
  void clear_handoff() noexcept { handoff_.clear(); }
  void add_handoff(std::size_t n) { handoff_.push_back(n); }

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
    auto const window_unit = packed_ ? d.arena_size : d.max_batch_bytes;
    bool gated = deferred_;
    for (std::size_t launched = 0; kept_ < N && launched < max_batches; ++launched) {
      auto const n = kept_;
      auto const rest = N - n - 1;
      if (deferred_) {
        bool in_flight = false;
        for (auto* p : d.batch(n)) in_flight = in_flight || p->state() == residency::d2h;
        if (in_flight) finish_deferred_batch(d, n); // the rest of the deferred offload keeps running
      }
      if (packed_ && n < own_.size() && !own_[n].base) take_handoff(d, n);
      // An own arena the deferred offload left for this batch is reused (its bytes are counted), and
      // the staging arenas it holds are the step's window (released before the step allocates).
      std::size_t held_window = 0;
      for (auto const& a : held_arenas_) held_window += a.bytes;
      auto const full_window = std::min<std::size_t>(2, rest) * window_unit;
      auto const window = full_window > held_window ? full_window - held_window : 0;
      bool reuse = packed_ && has_own_arena(n);
      auto need = (reuse ? 0 : d.own_bytes(n, packed_)) + window;
      if (deferred_ && !engine_.fits_optional(need)) { // the room the deferred offload holds is needed
        finish_deferred(engine_.h2d());
        reuse = packed_ && has_own_arena(n);
        need = (reuse ? 0 : d.own_bytes(n, packed_)) + full_window;
      }
      if (!engine_.admits_optional(need)) break;
      if (!gated) { // the storage it takes may be what the d2h stream just released
        wait_at(wait_site::prefetch_after_release, b_, engine_.h2d(), b_.record_event(engine_.d2h()));
        gated = true;
      }
      plan_ = plan;
      if (packed_ && own_.size() != N) own_.resize(N);
      keep(n);
      if (packed_) {
        load_own(d, n);
      } else {
        trace_.emit(swap_event::kind::load, n);
        engine_.launch_load(d.batch(n), batch_label("load", n).c_str());
      }
    }
  }

  /// Finishes a deferred offload with `next_user` ordered behind its D2Hs, and releases what it
  /// held. Returns whether there was one.
  bool finish_deferred(stream_t<B> next_user) {
    if (!deferred_) return false;
    trace_.emit(swap_event::kind::finish_deferred);
    auto all = pieces_of(slots_, true); // only the pieces in d2h are touched
    engine_.wait_offload(detail::view(all), next_user, wait_site::finish_deferred);
    for (auto& a : held_arenas_) engine_.release_arena(a, next_user);
    held_arenas_.clear();
    release_holds();
    // Own arenas the deferred offload left and no prefetch took again.
    for (std::size_t n = kept_; n < own_.size(); ++n) engine_.release_arena(own_[n], next_user);
    handoff_.clear();
    deferred_ = false;
    return true;
  }

  /// Brings every kept batch home and releases its own storage. Idempotent: if a copy fails, what is
  /// left stays kept and the next call (every entry point retries) finishes.
  void evict() {
    if (!plan_) {
      must_evict_ = false;
      return;
    }
    must_evict_ = true;
    auto const saved = trace_.where();
    trace_.note("evict");
    auto const& d = *plan_;
    auto const upto = std::max(kept_, packed_ ? own_.size() : 0);
    for (std::size_t n = 0; n < upto && n < d.size(); ++n) {
      auto bs = d.batch(n);
      if (packed_) {
        if (n >= own_.size() || !own_[n].base) continue;
        engine_.settle(bs);
        arena_storage<B> s{own_[n], d.staging[n]};
        engine_.launch_offload(bs, s, "evict");
        engine_.settle(bs);
        engine_.release_arena(own_[n]);
      } else {
        engine_.settle(bs);
        engine_.launch_offload(bs, "evict");
        engine_.settle(bs);
      }
    }
    own_.clear();
    handoff_.clear();
    kept_ = 0;
    plan_.reset();
    must_evict_ = false;
    trace_.restore(saved);
  }

  /// Hand-back after a failure: releases every arena and hold without copying.
  void release_all() {
    for (auto& a : own_) engine_.release_arena(a);
    for (auto& a : held_arenas_) engine_.release_arena(a);
    release_holds();
  }

private:
  /// One batch of a deferred offload finished: the h2d stream waits its D2H only.
  void finish_deferred_batch(step_plan<B> const& d, std::size_t n) {
    trace_.emit(swap_event::kind::finish_deferred, n);
    engine_.wait_offload(d.batch(n), engine_.h2d(), wait_site::finish_deferred);
    unhold_batch(n); // per tensor: its storage's release is ordered before the h2d stream now
  }

  void unhold_batch(std::size_t n) noexcept {
    if (n >= held_.size() || held_[n] == 0) return;
    engine_.unhold(budget_client::optimizer, held_[n]);
    held_[n] = 0;
  }

  /// After a relayed step, batch n (offloaded early) has no own arena: it takes the first one the
  /// deferred offload left, in the order of its D2Hs, that is large enough and belongs to a batch not
  /// prefetched again yet, behind that batch's D2H only. So each prefetch waits one D2H, in D2H
  /// order, as it does when every batch finds its own arena.
  void take_handoff(step_plan<B> const& d, std::size_t n) {
    for (auto it = handoff_.begin(); it != handoff_.end(); ++it) {
      auto const m = *it;
      if (m < n || m >= own_.size() || !own_[m].base || own_[m].bytes < d.staging[n].bytes) continue;
      finish_deferred_batch(d, m);
      own_[n] = std::move(own_[m]);
      own_[m] = staging_arena<B>{};
      handoff_.erase(it);
      return;
    }
  }

  transfer_engine<B>& engine_;
  B& b_;
  step_trace& trace_;
  lean_vector<slot_storage<B>>& slots_;
  bool packed_;

  plan_ptr plan_;
  std::size_t kept_ = 0;
  lean_vector<staging_arena<B>> own_; ///< packed: per batch of plan_, its own arena (or none)
  bool must_evict_ = false;
  bool deferred_ = false;
  lean_vector<staging_arena<B>> held_arenas_; ///< staging arenas a deferred offload reads
  lean_vector<std::size_t> handoff_;
  lean_vector<std::uint64_t> held_; ///< per batch: budget bytes held (per tensor); 0 = none
};

} // namespace pipeswap::detail
