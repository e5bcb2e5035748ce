// pipeswap — the Comm concept: point-to-point messages between the ranks of a pipeline.
//
// A comm moves the stage boundaries (activations forward, gradients backward) between ranks for the
// pipeline executor (exec/pipeline_executor.hpp). It is deliberately small: post a send or a receive
// of a buffer to or from a peer rank with a tag, complete them, know the rank and the world size, and
// bring every rank down. A type is a comm only if it opts in, so a look-alike is never accepted by
// accident. docs/executor.md is the full specification.
//
// Required expressions (c is an lvalue of type C; cc a const C; r a C::request_type lvalue; src a
// void const*; dst a void*; n a std::size_t; peer and tag ints; t a std::chrono::milliseconds;
// why a std::string_view):
//
//   typename C::comm_concept      derived from pipeswap::exec::comm_tag (or enable_comm<C> = true)
//   typename C::request_type      std::movable, std::default_initializable; one posted operation
//   C::reads_device_memory        a constant bool: true when buffers are device memory the library
//                                 reads directly (NCCL); false when they must be host memory, so a
//                                 device buffer is staged through pinned host memory by the caller
//   cc.rank()          -> int     this rank, 0 <= rank < size
//   cc.size()          -> int     the number of ranks
//   cc.max_tag()       -> int     the largest tag the library accepts (MPI guarantees >= 32767)
//   c.isend(src, n, peer, tag) -> request_type   posts a send of n bytes; returns at once
//   c.irecv(dst, n, peer, tag) -> request_type   posts a receive of n bytes; returns at once
//   c.test(r)          -> bool    true once r completed (a receive's bytes are in dst; a send's
//                                 buffer may be reused); never blocks
//   c.wait_for(r, t)   -> bool    blocks at most t; true once r completed
//   c.abort(why)       -> void    brings every rank down (see below); on this rank later operations
//                                 throw comm_aborted
//
// Semantic rules the compiler cannot check:
//  * Matching. A send from rank a to rank b with tag t matches a receive posted on b from a with tag
//    t; messages with the same (a, b, t) match in the order they were posted (no overtaking), whether
//    the send or the receive was posted first. Sizes must agree: a mismatch completes both requests
//    with comm_error naming the ranks, the tag and both sizes.
//  * Buffers. A send's bytes must stay unchanged, and a receive's buffer untouched, until the request
//    completed; the comm reads or writes them at any time in between.
//  * Progress. Posting never blocks. A posted send completes once the peer posts its receive, without
//    further calls on the sender (or, for libraries that need calls to progress, during any test or
//    wait_for on this comm); so ranks that pre-post their receives never deadlock on each other.
//  * Abort. abort(why) makes every rank's pending and later test/wait_for throw comm_aborted whose
//    message carries `why`, within a bounded time (thread_comm: at once; mpi_comm: a control message,
//    then MPI_Abort if a peer does not stop). A comm is dead after an abort.
//  * Errors derive from pipeswap::error (comm_error). Threads: one rank's comm is used by one host
//    thread at a time; thread_comm's ranks are used from different threads at once.
//
// Optional capability, stream-ordered operations (stream_ordered_comm<C, Stream>; NCCL's model):
//
//   C::stream_ordered  a constant bool, true
//   c.isend(src, n, peer, tag, s) -> request_type   enqueues a send of device bytes on stream s
//   c.irecv(dst, n, peer, tag, s) -> request_type   enqueues a receive into device bytes on stream s
//
//  * A stream-ordered send reads its bytes when s reaches it: work enqueued on s after the call may
//    release or reuse the buffer. Its request completes once it is enqueued (at once).
//  * A stream-ordered receive's request completes (test or wait_for true) once the receive is on s:
//    work enqueued on s after completion sees its bytes in dst. A comm may enqueue it only when the
//    matching send was posted (a simulated link knows the arrival time only then), so the caller
//    enqueues nothing on s between posting and completion.
//  * C::reads_device_memory is then true: the buffers are device memory.
//
// Models: thread_comm (exec/thread_comm.hpp, ranks as threads of one process, host memory),
// mpi_comm (exec/mpi_comm.hpp, Open MPI, host memory), nccl_comm (exec/nccl_comm.hpp, device memory,
// compiled when <nccl.h> and the CUDA Toolkit are found).
//
// A minimal model (one rank that talks to itself):
// @code
//   struct self_comm {
//     using comm_concept = pipeswap::exec::comm_tag;
//     struct request_type { bool done = false; };
//     static constexpr bool reads_device_memory = false;
//     int rank() const { return 0; }
//     int size() const { return 1; }
//     int max_tag() const { return 32767; }
//     request_type isend(void const*, std::size_t, int, int) { return {true}; }
//     request_type irecv(void*, std::size_t, int, int) { return {true}; }
//     bool test(request_type& r) { return r.done; }
//     bool wait_for(request_type& r, std::chrono::milliseconds) { return r.done; }
//     void abort(std::string_view) {}
//   };
//   static_assert(pipeswap::exec::comm<self_comm>);
// @endcode
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include <pipeswap/error.hpp>

namespace pipeswap::exec {

/// A comm call failed (a size mismatch, a bad peer or tag, the library's own error).
class comm_error : public error {
public:
  using error::error;
};

/// A rank called abort(): every rank's comm operations throw this, with the reason.
class comm_aborted : public comm_error {
public:
  using comm_error::comm_error;
};

/// A wait ran past its watchdog: the message says which rank waited on what.
class comm_timeout : public comm_error {
public:
  using comm_error::comm_error;
};

/// Opt-in tag: a comm declares `using comm_concept = pipeswap::exec::comm_tag;`.
struct comm_tag {};

template <class C>
inline constexpr bool enable_comm = requires {
  typename C::comm_concept;
  requires std::derived_from<typename C::comm_concept, comm_tag>;
};

/// Rank, size and tag range.
template <class C>
concept comm_world = requires(C const& cc) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  { cc.max_tag() } -> std::same_as<int>;
};

/// Posting point-to-point operations that return a request.
template <class C>
concept comm_post = requires(C& c, void const* src, void* dst, std::size_t n, int peer, int tag) {
  typename C::request_type;
  requires std::movable<typename C::request_type>;
  requires std::default_initializable<typename C::request_type>;
  { c.isend(src, n, peer, tag) } -> std::same_as<typename C::request_type>;
  { c.irecv(dst, n, peer, tag) } -> std::same_as<typename C::request_type>;
};

/// Completing requests, without blocking or with a bound.
template <class C>
concept comm_complete = comm_post<C> && requires(C& c, typename C::request_type& r, std::chrono::milliseconds t) {
  { c.test(r) } -> std::same_as<bool>;
  { c.wait_for(r, t) } -> std::same_as<bool>;
};

/// Everything the executor needs. See the header comment and docs/executor.md for the rules.
template <class C>
concept comm = enable_comm<C> && comm_world<C> && comm_post<C> && comm_complete<C> &&
    requires(C& c, std::string_view why) {
  { c.abort(why) } -> std::same_as<void>;
  { C::reads_device_memory } -> std::convertible_to<bool>;
  requires std::is_same_v < std::remove_cv_t<decltype(C::reads_device_memory)>,
  bool > ;
};

template <comm C>
using request_t = typename C::request_type;

/// The optional stream-ordered capability (see the header comment): sends and receives are
/// enqueued on a device stream of type `Stream` instead of being completed by the host.
template <class C, class Stream>
concept stream_ordered_comm = comm<C> && requires {
  { C::stream_ordered } -> std::convertible_to<bool>;
  requires std::is_same_v < std::remove_cv_t<decltype(C::stream_ordered)>,
  bool > ;
  requires C::stream_ordered;
} && requires(C& c, void const* src, void* dst, std::size_t n, int peer, int tag, Stream s) {
  { c.isend(src, n, peer, tag, s) } -> std::same_as<typename C::request_type>;
  { c.irecv(dst, n, peer, tag, s) } -> std::same_as<typename C::request_type>;
};

namespace detail {

/// wait_for() of a comm whose completion can only be tested (MPI_Test, cudaEventQuery): polls
/// `done()` until it holds or `t` has passed, backing off from 5 µs to 0.5 ms between polls.
template <class Done>
bool poll_for(std::chrono::milliseconds t, Done&& done) {
  auto const deadline = std::chrono::steady_clock::now() + t;
  auto pause = std::chrono::microseconds(5);
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(500)) pause *= 2;
  }
}

} // namespace detail

} // namespace pipeswap::exec
