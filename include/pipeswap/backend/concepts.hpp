// pipeswap — the Backend concept.
//
// A backend gives the swap runtimes streams, events, stream-ordered device memory, pinned host memory
// and asynchronous copies in both directions. The concept is refined in small steps, each checkable on
// its own (stream_source → event_source → device_memory, pinned_memory, async_copy → backend), and a
// type is a backend only if it opts in, so a look-alike is never accepted by accident.
//
// The full specification, including the semantic rules below with examples, is docs/backend.md.
//
// Required expressions (b is an lvalue of type B; s a B::stream_type; e a const B::event_type;
// d a B::device_pointer; h a std::byte*; ch a const std::byte*; n a std::size_t):
//
//   typename B::backend_concept        derived from pipeswap::backend_tag (or enable_backend<B> = true)
//   typename B::error_type             derived from std::exception; what every failing call throws
//   typename B::stream_type            std::copyable, std::equality_comparable; a non-owning handle
//   typename B::event_type             std::copyable; copies name the same recorded point
//   typename B::device_pointer         device_pointer_like (pipeswap::device_ptr is a model)
//   b.current_stream()   -> stream_type     the stream the caller's compute work is ordered on
//   b.new_stream()       -> stream_type     a new stream, owned by b and valid while b lives
//   b.record_event(s)    -> event_type      marks the point after all work enqueued on s so far
//   b.wait_event(s, e)   -> void            work enqueued on s after this call starts after e
//   b.synchronize(e)     -> void            blocks the calling host thread until e is complete
//   b.allocate_device(n, s)      -> device_pointer   stream-ordered allocation, usable by work on s
//   b.deallocate_device(d, n, s) -> void             stream-ordered release behind work on s
//   b.allocate_host(n)           -> std::byte*       pinned (page-locked) host memory, n bytes exactly
//   b.deallocate_host(h, n)      -> void             returns pinned memory; host-immediate
//   b.copy_h2d(d, ch, n, s)      -> void             asynchronous copy host → device on s
//   b.copy_d2h(h, d, n, s)       -> void             asynchronous copy device → host on s
//
// Semantic rules the compiler cannot check:
//  * Ordering. Work on one stream runs in enqueue order. Work on different streams is unordered unless
//    linked by record_event/wait_event. A copy or kernel is complete when its effect on memory is
//    visible to every later-ordered user; an event is complete when all work enqueued on its stream
//    before record_event is complete.
//  * Host visibility. The host may read bytes written by copy_d2h, or overwrite bytes read by
//    copy_h2d, only after synchronize() on an event that is ordered after that copy.
//  * Ownership. Device memory belongs to the caller from allocate_device until deallocate_device. The
//    release is ordered on its stream: the caller makes that stream wait for every other stream that
//    still uses the memory before releasing it. Pinned host memory may be released only when no
//    enqueued copy still uses it (synchronize first).
//  * Blocking. Only synchronize() (and allocate_host/deallocate_host, which may synchronize the
//    device) may block the host. All other calls enqueue and return.
//  * Zero sizes. allocate_device(0, s) and allocate_host(0) may return a null pointer; releasing a
//    null pointer is a no-op; a copy of 0 bytes is a no-op.
//  * Errors. A call that fails throws error_type (or a type derived from it) and leaves the backend
//    usable; streams, events and memory obtained earlier stay valid.
//  * Threads. A backend object is used by one host thread at a time unless its documentation says more.
//
// A minimal model (synchronous host memory standing in for a device):
// @code
//   struct host_backend {
//     using backend_concept = pipeswap::backend_tag;
//     using error_type = std::runtime_error;
//     using stream_type = int;
//     struct event_type {};
//     using device_pointer = pipeswap::device_ptr;
//     int current_stream() { return 0; }
//     int new_stream() { return 1; }
//     event_type record_event(int) { return {}; }
//     void wait_event(int, event_type const&) {}
//     void synchronize(event_type const&) {}
//     device_pointer allocate_device(std::size_t n, int) { return device_pointer(std::malloc(n)); }
//     void deallocate_device(device_pointer p, std::size_t, int) { std::free(p.get()); }
//     std::byte* allocate_host(std::size_t n) { return static_cast<std::byte*>(std::malloc(n)); }
//     void deallocate_host(std::byte* p, std::size_t) { std::free(p); }
//     void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, int) { std::memcpy(d.get(), h, n); }
//     void copy_d2h(std::byte* h, device_pointer d, std::size_t n, int) { std::memcpy(h, d.get(), n); }
//   };
//   static_assert(pipeswap::backend<host_backend>);
// @endcode
#pragma once

#include <concepts>
#include <cstddef>
#include <exception>
#include <string>
#include <type_traits>

#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/config.hpp>

namespace pipeswap {

/// Opt-in tag: a backend declares `using backend_concept = pipeswap::backend_tag;` (or a type derived
/// from it). Types that cannot be edited opt in by specialising enable_backend.
struct backend_tag {};

template <class B>
inline constexpr bool enable_backend = requires {
  typename B::backend_concept;
  requires std::derived_from<typename B::backend_concept, backend_tag>;
};

/// A device address type: a regular value with a null state, byte offsetting and ordering.
template <class P>
concept device_pointer_like = std::regular<P> && std::totally_ordered<P> && requires(P p, std::size_t n) {
  { p + n } -> std::same_as<P>;
  {static_cast<bool>(p)};
};

/// Streams: a handle to the caller's current compute stream and new streams owned by the backend.
template <class B>
concept stream_source = requires(B& b) {
  typename B::stream_type;
  requires std::copyable<typename B::stream_type>;
  requires std::equality_comparable<typename B::stream_type>;
  { b.current_stream() } -> std::same_as<typename B::stream_type>;
  { b.new_stream() } -> std::same_as<typename B::stream_type>;
};

/// Events: record a point on a stream, make a stream wait for it, make the host wait for it.
template <class B>
concept event_source = stream_source<B> && requires(B& b, typename B::stream_type s, typename B::event_type const& e) {
  requires std::copyable<typename B::event_type>;
  { b.record_event(s) } -> std::same_as<typename B::event_type>;
  { b.wait_event(s, e) } -> std::same_as<void>;
  { b.synchronize(e) } -> std::same_as<void>;
};

/// Stream-ordered device memory.
template <class B>
concept device_memory = stream_source<B> &&
    requires(B& b, typename B::stream_type s, typename B::device_pointer d, std::size_t n) {
  requires device_pointer_like<typename B::device_pointer>;
  { b.allocate_device(n, s) } -> std::same_as<typename B::device_pointer>;
  { b.deallocate_device(d, n, s) } -> std::same_as<void>;
};

/// Pinned (page-locked) host memory, allocated at exactly the requested size.
template <class B>
concept pinned_memory = requires(B& b, std::byte* h, std::size_t n) {
  { b.allocate_host(n) } -> std::same_as<std::byte*>;
  { b.deallocate_host(h, n) } -> std::same_as<void>;
};

/// Asynchronous copies between pinned host memory and device memory, ordered on a stream.
template <class B>
concept async_copy = device_memory<B> && requires(B& b, typename B::stream_type s, typename B::device_pointer d,
                                                  std::byte* h, std::byte const* ch, std::size_t n) {
  { b.copy_h2d(d, ch, n, s) } -> std::same_as<void>;
  { b.copy_d2h(h, d, n, s) } -> std::same_as<void>;
};

/// Everything the swap runtimes need. See the header comment and docs/backend.md for the rules.
template <class B>
concept backend = enable_backend<B> && requires {
  typename B::error_type;
} && std::derived_from<typename B::error_type, std::exception> && stream_source<B> && event_source<B> &&
    device_memory<B> && pinned_memory<B> && async_copy<B>;

template <backend B>
using stream_t = typename B::stream_type;
template <backend B>
using event_t = typename B::event_type;
template <backend B>
using device_pointer_t = typename B::device_pointer;
template <backend B>
using backend_error_t = typename B::error_type;

// ---------------------------------------------------------------------------------------------------
// Optional capabilities, each a named concept. The runtimes test for them with `if constexpr` and
// do without otherwise (docs/backend.md lists what each one changes):
//
//   labelled_backend      b.set_label(std::string_view)           names the work enqueued next
//   host_access_checked   b.note_host_read(const std::byte*, n)   the host is about to read / write
//                         b.note_host_write(const std::byte*, n)  pinned bytes (hazard checking)
//   device_synchronizing  b.synchronize_device() -> void          blocks until every stream is idle
//   named_streams         b.new_stream(std::string) -> stream_type   a new stream with a name
//   bytes_optional        b.holds_bytes() -> bool                 false for a simulator that models
//                                                                 time without data: host mirrors
//                                                                 are then addresses only

template <class B>
concept labelled_backend = requires(B& b, char const* s) {
  b.set_label(s);
};

/// b.synchronize_device(): blocks the calling host thread until all work on all of b's streams is
/// complete. The pipeline executor needs it when executor_options::settle_device is on (it settles
/// the device after the optimizer step and after a failed step); without it the executor waits
/// each of its own streams instead.
template <class B>
concept device_synchronizing = requires(B& b) {
  { b.synchronize_device() } -> std::same_as<void>;
};

template <class B>
concept host_access_checked = requires(B& b, std::byte const* p, std::size_t n) {
  b.note_host_read(p, n);
  b.note_host_write(p, n);
};

/// b.new_stream(name): a new stream as new_stream() makes, named for traces and profilers.
template <class B>
concept named_streams = stream_source<B> && requires(B& b, std::string name) {
  { b.new_stream(name) } -> std::same_as<typename B::stream_type>;
};

template <class B>
concept bytes_optional = requires(B const& b) {
  { b.holds_bytes() } -> std::convertible_to<bool>;
};

namespace detail {

/// Whether the host may read and write pinned memory of `b` (true for every real backend).
template <class B>
bool holds_bytes(B const& b) {
  if constexpr (bytes_optional<B>)
    return b.holds_bytes();
  else
    return true;
}

template <class B>
void annotate(B& b, char const* label) {
  if constexpr (labelled_backend<B>) b.set_label(label);
}

template <class B>
void note_host_read(B& b, std::byte const* p, std::size_t n) {
  if constexpr (host_access_checked<B>) b.note_host_read(p, n);
}

template <class B>
void note_host_write(B& b, std::byte const* p, std::size_t n) {
  if constexpr (host_access_checked<B>) b.note_host_write(p, n);
}

} // namespace detail
} // namespace pipeswap
