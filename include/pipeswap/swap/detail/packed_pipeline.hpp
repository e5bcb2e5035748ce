// pipeswap — the packed step pipeline of the optimizer-swap runtime (two staging arenas).
//
//     begin; prefetch(0, 0); prefetch(1, 1)
//     for n: wait_prefetch(n); [n >= 2: wait_offload(n-2); finish_offload(n-2)]; activate(n);
//            update(n); chain(n, n+2): D2H of n out of its arena, then H2D of n+2 into it
//     drain the last two; end
//
// Batch n is staged in arena n % 2, laid out by its step plan (one large copy per contiguous host
// run). The H2D of n+2 waits the D2H of n out of the same arena (wait_site::arena_reuse); the compute
// stream only ever waits events. Kept batches (resident share, prefetch) are in their own arenas and
// leave after the streamed ones; with the relay, the batches after the first two streamed ones load
// into the storage that prefetched batches, offloaded as soon as they are updated, release.
//
// The staging arenas outlive a failed step (stranded, with the pieces that still live in them) until
// evacuate() brings those home: every entry point of the runtime calls it first.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/swap/detail/step_pipeline.hpp>

namespace pipeswap::detail {

/// What the packed pipeline carries over: each kept batch in its own arena, the staging arenas a
/// deferred offload reads, and after a relayed step the own arenas it leaves to the next prefetch.
template <backend B>
class packed_carry final : public carry_over<B> {
public:
  packed_carry(transfer_engine<B>& engine, step_trace& trace, lean_vector<slot_storage<B>>& slots)
      : carry_over<B>(engine, trace, slots) {}

  /// The own arena of batch n of the step's plan.
  [[nodiscard]] staging_arena<B>& own_arena(std::size_t n) { return own_[n]; }
  [[nodiscard]] bool has_own_arena(std::size_t n) const noexcept { return n < own_.size() && own_[n].base; }

  /// The H2D of batch n into its own arena (allocated if it has none).
  void load_own(step_plan<B> const& d, std::size_t n) {
    this->trace_.emit(swap_event::kind::load, n, swap_event::storage::own);
    if (!own_[n].base) this->engine_.allocate_arena(own_[n], d.staging[n].bytes);
    arena_storage<B> s{own_[n], d.staging[n]};
    this->engine_.launch_load(d.batch(n), s, batch_label("load", n).c_str());
  }

  /// The step returns with D2Hs in flight: `staging` (a staging arena the offload reads) is held
  /// until the offload is finished, and the offload becomes pending.
  void defer(staging_arena<B>& staging) {
    if (!staging.base) return;
    held_arenas_.push_back(std::move(staging));
    staging = staging_arena<B>{};
    carry_over<B>::defer();
  }
  using carry_over<B>::defer;

  /// After a relayed step, the batches whose own arenas the deferred offload leaves, in D2H order.
  void clear_handoff() noexcept { handoff_.clear(); }
  void add_handoff(std::size_t n) { handoff_.push_back(n); }

  void release_all() override {
    for (auto& a : own_) this->engine_.release_arena(a);
    for (auto& a : held_arenas_) this->engine_.release_arena(a);
  }

private:
  void fit_to(step_plan<B> const& d) override {
    if (own_.size() != d.size()) own_.resize(d.size());
  }
  [[nodiscard]] std::size_t window_unit(step_plan<B> const& d) const override { return d.arena_size; }
  void before_prefetch(step_plan<B> const& d, std::size_t n) override {
    if (n < own_.size() && !own_[n].base) take_handoff(d, n);
  }
  [[nodiscard]] std::size_t deferred_window() const noexcept override {
    std::size_t bytes = 0;
    for (auto const& a : held_arenas_) bytes += a.bytes;
    return bytes;
  }
  [[nodiscard]] std::size_t own_need(step_plan<B> const& d, std::size_t n) const override {
    return has_own_arena(n) ? 0 : d.own_bytes(n, true);
  }
  void load_kept(step_plan<B> const& d, std::size_t n) override { load_own(d, n); }
  void batch_finished(std::size_t) noexcept override {}
  /// Its own arena (if it has one, not prefetched again) is released on `user`, which waited the
  /// batch's D2H out of it; a batch the deferred offload reads from staging keeps it until the whole
  /// offload finishes.
  void give_batch(std::size_t n, stream_t<B> user) override {
    if (n < this->kept() || n >= own_.size() || !own_[n].base) return;
    this->engine_.release_waited_arena(own_[n], user);
    for (std::size_t i = handoff_.size(); i-- > 0;) {
      if (handoff_[i] == n) handoff_.erase(handoff_.begin() + i);
    }
  }
  void release_deferred(stream_t<B> next_user) override {
    for (auto& a : held_arenas_) this->engine_.release_arena(a, next_user);
    held_arenas_.clear();
    // Own arenas the deferred offload left and no prefetch took again.
    for (std::size_t n = this->kept(); n < own_.size(); ++n) this->engine_.release_arena(own_[n], next_user);
    handoff_.clear();
  }
  [[nodiscard]] std::size_t own_extent() const noexcept override { return own_.size(); }
  void evict_batch(step_plan<B> const& d, std::size_t n) override {
    if (n >= own_.size() || !own_[n].base) return;
    auto bs = d.batch(n);
    this->engine_.settle(bs);
    arena_storage<B> s{own_[n], d.staging[n]};
    this->engine_.launch_offload(bs, s, "evict");
    this->engine_.settle(bs);
    this->engine_.release_arena(own_[n]);
  }
  void forget_own() noexcept override {
    own_.clear();
    handoff_.clear();
  }

  /// After a relayed step, batch n (offloaded early) has no own arena: it takes the first one the
  /// deferred offload left, in the order of its D2Hs, that is large enough and belongs to a batch not
  /// prefetched again yet, behind that batch's D2H only. So each prefetch waits one D2H, in D2H
  /// order, as it does when every batch finds its own arena.
  void take_handoff(step_plan<B> const& d, std::size_t n) {
    for (auto it = handoff_.begin(); it != handoff_.end(); ++it) {
      auto const m = *it;
      if (m < n || m >= own_.size() || !own_[m].base || own_[m].bytes < d.staging[n].bytes) continue;
      this->finish_deferred_batch(d, m);
      own_[n] = std::move(own_[m]);
      own_[m] = staging_arena<B>{};
      handoff_.erase(it);
      return;
    }
  }

  lean_vector<staging_arena<B>> own_;         ///< per batch of plan(), its own arena (or none)
  lean_vector<staging_arena<B>> held_arenas_; ///< staging arenas a deferred offload reads
  lean_vector<std::size_t> handoff_;
};

template <backend B>
class packed_pipeline : step_pipeline<B> {
  using step_pipeline<B>::engine_;
  using step_pipeline<B>::trace_;
  using step_pipeline<B>::defer_offload_;

public:
  using plan_ptr = plan_ref<B>;

  explicit packed_pipeline(pipeline_env<B> const& env)
      : step_pipeline<B>(env), carry_(env.engine, env.trace, env.slots) {}

  /// What this pipeline carries from one step to the next.
  [[nodiscard]] packed_carry<B>& carry() noexcept { return carry_; }
  [[nodiscard]] packed_carry<B> const& carry() const noexcept { return carry_; }

  /// Bytes of the larger staging arena of the last step (0 before the first).
  [[nodiscard]] std::size_t arena_bytes() const noexcept { return arena_bytes_; }

  /// Runs the batches [next, N) of `plan`; `next` advances past each updated batch.
  void run(plan_ptr const& plan, std::size_t& next, update_call update) {
    auto const& d = *plan;
    auto const N = d.plan.size();
    auto const k = next;
    if (k >= N) return;
    arena_bytes_ = d.arena_size;
    arena_plan_ = plan;
    // Own batches [k, own): resident or prefetched, each in its own arena; only a whole step keeps any.
    auto const resident = k == 0 ? d.resident : 0;
    auto const own = k == 0 ? std::max(carry_.kept(), resident) : 0;
    auto const s0 = std::max(k, own); // the first batch streamed through the two staging arenas
    // Relay: batches [s0 + 2, N) load into the storage that prefetched batches, offloaded as soon as
    // they are updated, give back, instead of each waiting the D2H out of a staging arena.
    auto const relaying = relay_covers(d, resident, own, s0);
    trace_.emit(swap_event::kind::begin, N - k);
    this->gate_step();
    auto bufs = [&](std::size_t n) { return d.batch(n); };
    carry_.begin_step(plan);
    for (std::size_t n = carry_.kept(); n < own; ++n) { // resident batches not on the device yet
      carry_.keep(n);
      carry_.load_own(d, n);
    }
    for (std::size_t a = 0; a < std::min<std::size_t>(2, N - s0); ++a) {
      engine_.allocate_arena(arenas_[(s0 + a) % 2], d.arena_size);
    }
    if (s0 < N) load(d, s0);
    if (s0 + 1 < N) load(d, s0 + 1);
    std::size_t relay = s0 + 2; // the next batch to relay
    std::uint64_t freed = 0;    // bytes the early offloads released and no relayed batch took yet
    // Resident, prefetched or relayed: in an own arena, not a staging one.
    auto const in_own_arena = [&](std::size_t n) { return n < own || (relaying && n >= s0 + 2); };
    for (std::size_t n = k; n < N; ++n) {
      if (in_own_arena(n)) {
        trace_.emit(swap_event::kind::wait_load, n, swap_event::storage::own);
        engine_.wait_load(bufs(n), engine_.compute());
        trace_.emit(swap_event::kind::activate, n, swap_event::storage::own);
        update(n);
        next = n + 1;
        if (n < resident) {
          trace_.emit(swap_event::kind::keep, n,
                      swap_event::storage::own); // others leave behind the streamed batches, below
        } else if (relaying && n < own && relay < N) {
          trace_.emit(swap_event::kind::offload, n, swap_event::storage::early);
          arena_storage<B> s{carry_.own_arena(n), d.staging[n]};
          engine_.launch_offload(bufs(n), s, batch_label("offload", n).c_str());
          freed += d.staging[n].bytes;
          engine_.release_offloaded_arena(carry_.own_arena(n), engine_.h2d());
          for (; relay < N && freed >= d.staging[relay].bytes; ++relay) {
            freed -= d.staging[relay].bytes;
            carry_.load_own(d, relay);
          }
        }
        continue;
      }
      trace_.emit(swap_event::kind::wait_load, n, n % 2);
      engine_.wait_load(bufs(n), engine_.compute());
      if (n >= s0 + 2) drain(d, n - 2);
      trace_.emit(swap_event::kind::activate, n, n % 2);
      update(n);
      next = n + 1;
      chain(d, n, !relaying && n + 2 < N ? std::optional<std::size_t>(n + 2) : std::nullopt);
    }
    // The batches in own arenas leave after the streamed ones: the streamed loads wait the D2Hs out of
    // their arenas, and copies of one direction run in enqueue order.
    auto const away = [&](std::size_t n) { return n >= resident && in_own_arena(n); };
    carry_.clear_handoff();
    for (std::size_t n = resident; n < N; ++n) {
      if (!away(n) || !carry_.has_own_arena(n)) continue; // (not offloaded early)
      if (relaying && defer_offload_) carry_.add_handoff(n);
      trace_.emit(swap_event::kind::offload, n, swap_event::storage::own);
      arena_storage<B> s{carry_.own_arena(n), d.staging[n]};
      engine_.launch_offload(bufs(n), s, batch_label("offload", n).c_str());
    }
    auto const [tail, tail_end] = unwaited_staging(N, s0, relaying);
    if (defer_offload_) {
      for (std::size_t n = resident; n < N; ++n) {
        if (away(n)) trace_.emit(swap_event::kind::defer, n);
      }
      for (std::size_t n = tail; n < tail_end; ++n) trace_.emit(swap_event::kind::defer, n);
      trace_.emit(swap_event::kind::end);
      // Own arenas stay where they are: the next prefetch() loads the same batch into the same arena
      // behind its D2H (arena_reuse), or carry_.finish_deferred() releases them.
      for (auto& a : arenas_) carry_.defer(a);
      if (own > resident) carry_.defer();
      arena_plan_.reset();
      carry_.keep_only(resident);
      return;
    }
    for (std::size_t n = tail; n < tail_end; ++n) drain(d, n);
    for (std::size_t n = resident; n < N; ++n) {
      if (!away(n)) continue;
      trace_.emit(swap_event::kind::wait_offload, n);
      engine_.wait_offload(bufs(n), engine_.compute());
      engine_.release_arena(carry_.own_arena(n));
    }
    carry_.keep_only(resident);
    trace_.emit(swap_event::kind::end);
    release_arenas();
  }

  /// After a failure inside a packed step: loads finish, every batch on the device is copied back out
  /// of its arena, and the arenas are released. If a copy-back fails too, the arenas are kept
  /// (stranded) with the pieces that still live in them, and evacuate() finishes the job before the
  /// next step.
  void abort() noexcept {
    auto const failed = trace_.where(); // the error names what failed, not the clean-up
    trace_.emit_quietly(swap_event::kind::end);
    try {
      carry_.evict(); // own arenas first: evacuate() copies only out of the staging arenas
    } catch (...) {   // kept: carry_.evict() runs again first thing in the next call
    }
    try {
      evacuate();
    } catch (...) { // kept: evacuate() runs again first thing in the next call
    }
    trace_.restore(failed);
  }

  /// Brings home every piece that lives in a staging arena kept by a failed step, and releases the
  /// arenas. A no-op when no arena is held.
  void evacuate() {
    if (!arena_plan_) return;
    auto const saved = trace_.where();
    trace_.note("evacuate");
    auto const& d = *arena_plan_;
    auto const all = detail::view(d.pieces);
    engine_.settle(all);
    for (std::size_t n = 0; n < d.plan.size(); ++n) {
      if (carry_.plan() == arena_plan_ && carry_.has_own_arena(n)) continue; // own arena: carry_.evict()
      bool on_device = false;
      for (auto* p : d.batch(n)) on_device = on_device || p->state() == residency::device;
      if (!on_device) continue;
      auto s = in_arena(d, n);
      engine_.launch_offload(d.batch(n), s, "evacuate");
    }
    engine_.settle(all);
    release_arenas();
    trace_.restore(saved);
  }

private:
  /// The streamed batches [first, last) whose D2H out of a staging arena no later load waited, so
  /// the step's end (or the deferred offload) must: with the relay, the first two streamed ones (the
  /// rest loaded into own arenas); otherwise the last two batches, fewer when fewer were streamed
  /// (from s0 on); none when every batch was in an own arena.
  static std::pair<std::size_t, std::size_t> unwaited_staging(std::size_t N, std::size_t s0, bool relaying) {
    if (relaying) return {s0, s0 + 2};
    if (s0 >= N) return {N, N};
    return {std::max(s0, N >= 2 ? N - 2 : 0), N};
  }

  arena_storage<B> in_arena(step_plan<B> const& d, std::size_t n) { return {arenas_[n % 2], d.staging[n]}; }

  /// The H2D of batch n into its staging arena (announced as the "load" event unless `announce`
  /// is false: a chain announces the load it ends with).
  void load(step_plan<B> const& d, std::size_t n, bool announce = true) {
    if (announce) trace_.emit(swap_event::kind::load, n, n % 2);
    trace_.note("load", n);
    auto s = in_arena(d, n);
    engine_.launch_load(d.batch(n), s, batch_label("load", n).c_str());
  }

  /// D2H of batch n out of its arena, then the H2D of `next` into it (one chain per arena: the load reuses the arena behind the offload).
  void chain(step_plan<B> const& d, std::size_t n, std::optional<std::size_t> next) {
    trace_.emit(swap_event::kind::chain, n, next, n % 2);
    auto s = in_arena(d, n);
    engine_.launch_offload(d.batch(n), s, batch_label("offload", n).c_str());
    if (next) load(d, *next, false);
  }

  /// Whether the prefetched batches of a whole step [resident, own) give back the storage of every
  /// batch after the first two streamed ones [s0 + 2, N), so that these can relay (run()).
  bool relay_covers(step_plan<B> const& d, std::size_t resident, std::size_t own, std::size_t s0) const {
    auto const N = d.plan.size();
    if (own <= resident || s0 + 2 >= N) return false;
    std::uint64_t freed = 0, needed = 0;
    for (std::size_t n = resident; n < own; ++n) freed += d.staging[n].bytes;
    for (std::size_t n = s0 + 2; n < N; ++n) needed += d.staging[n].bytes;
    return freed >= needed;
  }

  /// The compute stream waits the D2H of batch n out of its staging arena, which is then free.
  void drain(step_plan<B> const& d, std::size_t n) {
    trace_.emit(swap_event::kind::wait_offload, n);
    engine_.wait_offload(d.batch(n), engine_.compute());
    trace_.emit(swap_event::kind::free_staging, n);
  }

  void release_arenas() {
    for (auto& a : arenas_) engine_.release_arena(a);
    arena_plan_.reset();
  }

  packed_carry<B> carry_;
  /// The staging arenas of the step in progress (or kept by a failed one) and its plan.
  std::array<staging_arena<B>, 2> arenas_{};
  plan_ptr arena_plan_;
  std::size_t arena_bytes_ = 0;
};

} // namespace pipeswap::detail
