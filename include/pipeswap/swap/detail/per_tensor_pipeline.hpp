// pipeswap — the per-tensor step pipeline of the optimizer-swap runtime (one batch ahead).
//
//     prefetch(0)
//     for n: wait_prefetch(n); wait_offload(n-1); prefetch(n+1); update(n); offload(n)
//     wait_offload(last)
//
// Each piece gets its own device storage, allocated on the h2d stream behind the offload that freed
// the batch before (so at most two batches are resident) and released on the d2h stream behind its
// own D2H. The compute stream waits only for the loads it consumes. Kept batches (resident share,
// prefetch) are taken first, waiting only their loads, and leave after the streamed ones.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/swap/detail/step_pipeline.hpp>

namespace pipeswap::detail {

/// What the per-tensor pipeline carries over: each kept batch in its pieces' own storage, and the
/// budget holds on storage released behind D2Hs nothing has waited yet.
template <backend B>
class per_tensor_carry final : public carry_over<B> {
public:
  per_tensor_carry(transfer_engine<B>& engine, step_trace& trace, lean_vector<slot_storage<B>>& slots)
      : carry_over<B>(engine, trace, slots) {}

  /// The budget keeps counting batch n's storage (released behind a D2H nothing has waited yet)
  /// until the offload is finished.
  void hold_batch(std::size_t n, std::uint64_t bytes) {
    if (held_.size() <= n) held_.resize(n + 1, 0);
    if (this->engine_.hold(budget_client::optimizer, bytes)) held_[n] += bytes;
  }
  /// Every hold ends (the D2Hs they cover were waited).
  void release_holds() noexcept {
    for (auto const bytes : held_) {
      if (bytes) this->engine_.unhold(budget_client::optimizer, bytes);
    }
    held_.clear();
  }

  void release_all() override { release_holds(); }

private:
  void fit_to(step_plan<B> const&) override {}
  [[nodiscard]] std::size_t window_unit(step_plan<B> const& d) const override { return d.max_batch_bytes; }
  void before_prefetch(step_plan<B> const&, std::size_t) override {}
  [[nodiscard]] std::size_t deferred_window() const noexcept override { return 0; }
  [[nodiscard]] std::size_t own_need(step_plan<B> const& d, std::size_t n) const override {
    return d.own_bytes(n, false);
  }
  void load_kept(step_plan<B> const& d, std::size_t n) override {
    this->trace_.emit(swap_event::kind::load, n);
    this->engine_.launch_load(d.batch(n), batch_label("load", n).c_str());
  }
  /// Its storage's release is ordered before the h2d stream now.
  void batch_finished(std::size_t n) noexcept override {
    if (n >= held_.size() || held_[n] == 0) return;
    this->engine_.unhold(budget_client::optimizer, held_[n]);
    held_[n] = 0;
  }
  /// Its storage was released on the d2h stream behind its D2H, which `user` waited: the hold ends.
  void give_batch(std::size_t n, stream_t<B>) override { batch_finished(n); }
  void release_deferred(stream_t<B>) override { release_holds(); }
  [[nodiscard]] std::size_t own_extent() const noexcept override { return 0; }
  void evict_batch(step_plan<B> const& d, std::size_t n) override {
    auto bs = d.batch(n);
    this->engine_.settle(bs);
    this->engine_.launch_offload(bs, "evict");
    this->engine_.settle(bs);
  }
  void forget_own() noexcept override {}

  lean_vector<std::uint64_t> held_; ///< per batch: budget bytes held; 0 = none
};

template <backend B>
class per_tensor_pipeline : step_pipeline<B> {
  using step_pipeline<B>::engine_;
  using step_pipeline<B>::trace_;
  using step_pipeline<B>::defer_offload_;

public:
  using plan_ptr = plan_ref<B>;

  explicit per_tensor_pipeline(pipeline_env<B> const& env)
      : step_pipeline<B>(env), carry_(env.engine, env.trace, env.slots) {}

  /// What this pipeline carries from one step to the next.
  [[nodiscard]] per_tensor_carry<B>& carry() noexcept { return carry_; }
  [[nodiscard]] per_tensor_carry<B> const& carry() const noexcept { return carry_; }

  /// Runs the batches [next, N) of `plan`; `next` advances past each updated batch.
  void run(plan_ptr const& plan, std::size_t& next, update_call update) {
    auto const& d = *plan;
    auto const N = d.plan.size();
    auto const k = next;
    if (k >= N) return;
    auto bufs = [&](std::size_t n) { return d.batch(n); };
    // Own batches [k, own): resident or prefetched, in their own storage; only a whole step keeps any.
    auto const resident = k == 0 ? d.resident : 0;
    auto const own = k == 0 ? std::max(carry_.kept(), resident) : 0;
    this->gate_step();
    carry_.begin_step(plan);
    for (std::size_t n = carry_.kept(); n < own; ++n) { // resident batches not on the device yet
      carry_.keep(n);
      trace_.emit(swap_event::kind::load, n);
      engine_.launch_load(bufs(n), batch_label("load", n).c_str());
    }
    if (k >= own) {
      trace_.emit(swap_event::kind::load, k);
      engine_.launch_load(bufs(k), batch_label("load", k).c_str());
    }
    for (std::size_t n = k; n < N; ++n) {
      trace_.emit(swap_event::kind::wait_load, n);
      engine_.wait_load(bufs(n), engine_.compute());
      if (n > k && n - 1 >= own) { // the window's memory gate; own batches were reserved with the window
        trace_.emit(swap_event::kind::wait_offload, n - 1);
        engine_.wait_offload(bufs(n - 1), engine_.h2d());
      }
      if (n + 1 < N && n + 1 >= own) {
        trace_.emit(swap_event::kind::load, n + 1);
        engine_.launch_load(bufs(n + 1), batch_label("load", n + 1).c_str());
      }
      update(n);
      next = n + 1;
      if (n < resident) {
        trace_.emit(swap_event::kind::keep, n);
        continue;
      }
      if (n < own) continue; // offloaded behind the streamed batches, below
      trace_.emit(swap_event::kind::offload, n);
      engine_.launch_offload(bufs(n), batch_label("offload", n).c_str());
    }
    // The prefetched batches leave after the streamed ones: a streamed load waits the D2H that freed
    // its window, and copies of one direction run in enqueue order. Their storage is released behind
    // their D2Hs, which nothing waits before the step's end: the budget keeps counting it until then.
    for (std::size_t n = resident; n < own; ++n) {
      trace_.emit(swap_event::kind::offload, n);
      engine_.launch_offload(bufs(n), batch_label("offload", n).c_str());
      carry_.hold_batch(n, d.batch_bytes[n]);
    }
    carry_.keep_only(resident);
    // Offloads nothing has waited yet: the own batches after the resident share, and the last batch.
    lean_vector<std::size_t> open;
    for (std::size_t n = resident; n < own; ++n) open.push_back(n);
    if (N - 1 >= std::max(resident, own)) open.insert(open.begin(), N - 1);
    if (open.empty()) return;
    if (defer_offload_) {
      for (auto n : open) trace_.emit(swap_event::kind::defer, n);
      carry_.defer();
      // The last batch's storage was released behind its D2H, before anything orders a reuse: the
      // budget keeps counting it until the deferred offload is finished.
      if (open.front() >= own) {
        carry_.hold_batch(N - 1, d.batch_bytes[N - 1]);
      }
      return;
    }
    for (auto n : open) {
      trace_.emit(swap_event::kind::wait_offload, n);
      engine_.wait_offload(bufs(n), engine_.compute());
    }
    carry_.release_holds();
  }

  /// After a failure inside run(): transfers in flight settle, what is on the device is offloaded
  /// (best effort: what cannot be stays there, intact), and the kept batches go home.
  void abort(step_plan<B> const& d) noexcept {
    auto const all = detail::view(d.pieces);
    auto const failed = trace_.where();
    try {
      engine_.settle(all);
      try { // best effort: offload what is on the device; if that fails it stays there, intact
        engine_.launch_offload(all, "recover");
      } catch (...) {}
      engine_.settle(all);
    } catch (...) { // every piece is still in a consistent state (see transfer_engine)
    }
    carry_.release_holds(); // the compute stream waited every offload
    try {                   // resident and prefetched batches are among them; what stayed on the device goes home next
      carry_.evict();
    } catch (...) {}
    trace_.restore(failed);
  }

private:
  per_tensor_carry<B> carry_;
};

} // namespace pipeswap::detail
