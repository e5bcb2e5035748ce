// pipeswap — what the pipeline executor is told and what it reports: its options, its errors, the
// statistics of a step, the tags of boundary messages, and the concept of a finish with phases.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::exec {

/// A rank's step failed (or stopped because another rank failed).
class rank_failure : public error {
public:
  rank_failure(std::string what, int rank, std::size_t position, std::string entry, bool aborted_by_peer)
      : error(std::move(what)), rank_(rank), position_(position), entry_(std::move(entry)), by_peer_(aborted_by_peer) {}
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Position in the order; order.size() for the optimizer step.
  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  [[nodiscard]] std::string const& entry() const noexcept { return entry_; }
  /// True when this rank stopped because another rank aborted the comm.
  [[nodiscard]] bool aborted_by_peer() const noexcept { return by_peer_; }

private:
  int rank_;
  std::size_t position_;
  std::string entry_;
  bool by_peer_;
};

/// The executor threw at an injected fault site (executor_options::fail_at).
class injected_fault : public error {
public:
  using error::error;
};

struct executor_options {
  /// Bound on every wait for a message; a wait past it fails the step with comm_timeout's message
  /// (which rank waited, at which entry, for what).
  std::chrono::milliseconds wait_timeout{60000};
  /// Injected fault site: run_step throws injected_fault before the entry at this position (the
  /// order's size: before the optimizer step).
  std::optional<std::size_t> fail_at;
  /// The host issues each compute entry (FWD, BWD, composite) only when the previous one finished on
  /// the device: one entry of lookahead, so the swap steps between two compute entries go out while
  /// the first runs, and allocations never run ahead of the offloads that free memory for them.
  /// Off: the host enqueues as fast as it can (peak memory then depends on host speed).
  bool host_paced = true;
  /// The host waits each received boundary on the device before it goes on (blocking receives, as
  /// pipeline runtimes issue them). Off: only the consumer's stream waits it.
  bool host_waits_receives = false;
  /// Drive the optimizer-swap runtime's phases (docs/optimizer.md): `finish` is then a phased
  /// runtime (prefetch(n), offload_pending(), finish_offload(stream), step()). A deferred offload
  /// still pending from the previous step is finished at the start of the step behind the transfer
  /// engine's h2d stream (its storage returns behind the D2Hs; the forward does not wait them); from
  /// the rank's last forward on, each compute entry is preceded by prefetch(prefetch_batches) (the
  /// backward tail gives memory back); step() ends the step. Pair it with settle_device = false.
  bool optimizer_phases = false;
  /// With optimizer_phases: the deferred offload still pending at the start of a step is finished
  /// there behind the h2d stream (true, as above), or left pending (false), still counted in the
  /// device budget: then it is finished, batch by batch as room is needed, by whatever allocates
  /// under the budget next on the stream that allocates (transfer_engine::make_room: activation loads
  /// on the h2d stream, and forwards that ask before allocating), by the prefetch, or by step().
  bool finish_offload_at_start = true;
  /// With optimizer_phases: the batches one prefetch() call may start.
  std::size_t prefetch_batches = std::numeric_limits<std::size_t>::max();
  /// The host synchronizes the compute stream before `finish` (the gradient-norm reduction of mixed
  /// precision). Off: `finish` synchronizes itself (e.g. after enqueuing gradient collectives).
  bool sync_before_finish = true;
  /// After `finish` the host waits every stream of the device. Off: it waits the compute stream only
  /// (and the receive and send streams where the comm's staging memory needs them), so that device
  /// work `finish` left in flight (a deferred optimizer offload) runs into the next step.
  bool settle_device = true;
  /// The schedule check: every step begins with the ranks exchanging a digest of their label and
  /// order through the comm (on the comm's largest tag, which boundary messages then never use); at
  /// the first step, and whenever a digest changed on any rank, they exchange the orders too and
  /// every rank verifies that they form one schedule: the same layout, the same micro-batch count,
  /// the same schedule_label, and orders that pair every send with its receive and cannot deadlock
  /// (schedule::check_schedule). A mismatch fails the step on every rank before any entry runs
  /// (invalid_argument naming the ranks and the first difference). Every rank must use the same
  /// setting. Done for comms that take host memory (thread_comm, mpi_comm); a comm that reads device
  /// memory (NCCL) skips it. Off: a mismatch shows as a wait past wait_timeout.
  bool check_schedule = true;
  /// The schedule's parameters as the engine names them (e.g. "1f1b micro=8"), compared verbatim
  /// across ranks by the schedule check: orders from different generators that happen to pair up
  /// are then refused too. Empty on every rank: only the orders are compared.
  std::string schedule_label{};
};

/// What the last run_step did.
struct step_stats {
  std::size_t swapped_chunks = 0; ///< chunks whose activations went through activation_swap
  std::size_t sends = 0, receives = 0;
  std::size_t bytes_sent = 0, bytes_received = 0;
};

/// The boundary a message carries: its direction (0: activations forward, 1: gradients backward),
/// the stage that receives it and the micro-batch.
struct boundary_message {
  int dir = 0;
  schedule::index_type stage = 0;
  schedule::index_type micro = 0;
  friend bool operator==(boundary_message const&, boundary_message const&) = default;
};

/// The tag of a boundary message in a pipeline of `stages` stages: (micro * stages + stage) * 2 + dir.
inline long long boundary_tag(boundary_message m, schedule::index_type stages) {
  return (static_cast<long long>(m.micro) * stages + m.stage) * 2 + m.dir;
}

/// The boundary message of a tag (boundary_tag's inverse).
inline boundary_message boundary_of_tag(long long tag, schedule::index_type stages) {
  auto const k = tag / 2;
  return {static_cast<int>(tag % 2), static_cast<schedule::index_type>(k % stages),
          static_cast<schedule::index_type>(k / stages)};
}

namespace detail {

/// The optimizer-swap runtime's step (or any callable): the one call the executor makes into it.
template <class F>
void finish_step(F& f) {
  if constexpr (std::is_invocable_v<F&>)
    f();
  else
    f.step();
}

template <class P>
void* raw_address(P p) {
  if constexpr (requires { p.template get<void>(); })
    return p.template get<void>();
  else
    return reinterpret_cast<void*>(p);
}

} // namespace detail

/// Whether `F` offers the optimizer-swap runtime's phases (executor_options::optimizer_phases).
template <class F, class B>
concept phased_finish = requires(F& f, std::size_t n, stream_t<B> s) {
  f.prefetch(n);
  { f.offload_pending() } -> std::convertible_to<bool>;
  f.finish_offload(s);
  f.step();
};

} // namespace pipeswap::exec
