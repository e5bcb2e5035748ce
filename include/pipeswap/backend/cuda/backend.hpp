// pipeswap — the CUDA backend: pipeswap::cuda::backend models pipeswap::backend over the CUDA
// runtime API, for one device. It needs libcudart and the toolkit's headers, not nvcc. docs/cuda.md
// is the guide.
//
// Construction. backend(device, options) opens device `device` (cudaSetDevice validates the ordinal
// and initializes its primary context; an invalid one throws cuda_error naming cudaSetDevice) and
// restores the caller's current device before returning.
//
// Streams. stream_type is stream_ref (non-owning). current_stream() is the stream the caller's
// compute work runs on: the legacy default stream (cudaStreamLegacy) of the backend's device until
// set_current_stream() names another, e.g. the engine's own compute stream — the backend never owns
// or destroys it. new_stream() creates a non-blocking stream, owned by the backend and destroyed
// with it; non-blocking streams never synchronize implicitly with the legacy default stream, so
// copies on them overlap compute on it.
//
// Events. event_type is event: recorded with cudaEventRecord on a pooled native event created with
// cudaEventDisableTiming; copies share the point and stay waitable after the original, and the
// backend, are destroyed. wait_event is cudaStreamWaitEvent; synchronize is cudaEventSynchronize,
// the only call that blocks (besides pinned allocation and synchronize_device). Waiting on an event
// that was never recorded throws cuda_error.
//
// Device memory. allocate_device/deallocate_device are cudaMallocFromPoolAsync/cudaFreeAsync on one
// pool: by default a dedicated pool on the device, created with the backend and destroyed with it,
// whose release threshold (options::release_threshold, default: keep everything) keeps freed memory
// reserved for the next allocation instead of handing it back to the driver at every
// synchronization; trim_device_pool() gives it back. options::device_pool borrows a pool instead
// (the device's default pool, or one the engine shares); its attributes are left alone. The `n`
// passed to deallocate_device is not checked (CUDA knows the size).
//
// Pinned memory. allocate_host returns exactly n pinned bytes (cudaHostAlloc, portable), or, with
// options::host_memory = host_placement::near_device, bytes from a pool on the host NUMA node
// closest to the device when the platform supports it (host_numa_node() says which). register_host
// pins a range the caller already owns.
//
// Copies. copy_h2d/copy_d2h are cudaMemcpyAsync on the given stream. They stay asynchronous only
// for pinned (or registered) host memory; the runtimes only pass pinned memory.
//
// Current device. Calls on an explicit stream do not touch the current device (the stream carries
// it). Creating streams and events, pinned allocation and registration, synchronize_device, and any
// call given an implicit stream handle (legacy, per-thread or null: "the current device's default
// stream") make the backend's device current for the duration of the call and restore the caller's.
// A stream passed to the backend must belong to its device.
//
// Zero sizes. allocate_device(0, s) and allocate_host(0) return null without calling CUDA;
// releasing null is a no-op; copies of 0 bytes are no-ops (even with null pointers).
//
// Errors. Every failing call throws cuda_error (status, call, location; the message names the
// backend's device, the operation, its size and the current label) before anything is enqueued, and
// clears the thread's last CUDA error. Streams, events and memory obtained before stay valid; the
// backend stays usable unless the error is sticky (a faulted context). Destructors never throw.
//
// Threads. One host thread at a time, like every backend. Events may be copied and destroyed on any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/cuda/detail/nvtx.hpp>
#include <pipeswap/backend/cuda/detail/runtime.hpp>
#include <pipeswap/backend/cuda/device.hpp>
#include <pipeswap/backend/cuda/error.hpp>
#include <pipeswap/backend/cuda/event.hpp>
#include <pipeswap/backend/cuda/memory.hpp>
#include <pipeswap/backend/cuda/stream.hpp>
#include <pipeswap/backend/device_ptr.hpp>

namespace pipeswap::cuda {

/// Runtime knobs of a backend (see the header comment).
struct backend_options {
  /// Pool that allocate_device draws from, borrowed. Null: a dedicated pool owned by the backend.
  cudaMemPool_t device_pool = nullptr;
  /// Release threshold of the dedicated pool: freed bytes kept reserved across synchronizations.
  std::uint64_t release_threshold = std::numeric_limits<std::uint64_t>::max();
  /// Placement of allocate_host memory.
  host_placement host_memory = host_placement::any;
  /// Priority of the streams new_stream() creates (lower is higher; 0 is CUDA's default).
  int stream_priority = 0;
};

/// The CUDA backend for one device (see the header comment). Not copyable or movable.
class backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = cuda_error;
  using stream_type = stream_ref;
  using event_type = event;
  using device_pointer = pipeswap::device_ptr;

  explicit backend(int device = 0, backend_options const& options = {})
      : device_(device), setup_(device, pipeswap::detail::message({"pipeswap::cuda::backend(device ", device, ")"})),
        device_pool_(options.device_pool != nullptr ? memory_pool::borrow(options.device_pool)
                                                    : memory_pool::create_device(device_, options.release_threshold)),
        host_(device_, options.host_memory), events_(device_), priority_(options.stream_priority) {
    setup_.restore();
  }

  backend(backend const&) = delete;
  backend& operator=(backend const&) = delete;
  ~backend() = default;

  // ----- Backend concept -------------------------------------------------------------------------

  /// The stream the caller's compute work runs on; cudaStreamLegacy until set_current_stream().
  [[nodiscard]] stream_ref current_stream() const noexcept { return current_; }

  /// A new non-blocking stream owned by the backend, valid until the backend is destroyed.
  [[nodiscard]] stream_ref new_stream() {
    return streams_.emplace_back(device_, priority_).ref(); // strong guarantee: no stream leaks
  }

  /// The point after all work enqueued on `s` so far.
  [[nodiscard]] event record_event(stream_ref s) { return events_.record(s); }

  /// Work enqueued on `s` after this call starts after `e` completes.
  void wait_event(stream_ref s, event const& e) {
    cudaEvent_t const native = checked(e, "cudaStreamWaitEvent", "wait_event");
    device_guard_if const g(s.is_implicit(), device_);
    PIPESWAP_CUDA_TRY_WHAT(cudaStreamWaitEvent(s.get(), native, 0), describe("wait_event"));
  }

  /// Blocks the calling thread until `e` completes.
  void synchronize(event const& e) {
    cudaEvent_t const native = checked(e, "cudaEventSynchronize", "synchronize");
    PIPESWAP_CUDA_TRY_WHAT(cudaEventSynchronize(native), describe("synchronize"));
  }

  /// Stream-ordered allocation of `n` bytes of device memory; null for 0.
  [[nodiscard]] device_ptr allocate_device(std::size_t n, stream_ref s) {
    if (n == 0) return {};
    device_guard_if const g(s.is_implicit(), device_);
    void* p = nullptr;
    PIPESWAP_CUDA_TRY_WHAT(cudaMallocFromPoolAsync(&p, n, device_pool_.get(), s.get()), describe("allocate_device", n));
    return device_ptr(p);
  }

  /// Stream-ordered release: the memory is reused only after the work enqueued on `s` before this.
  void deallocate_device(device_ptr d, std::size_t n, stream_ref s) {
    if (!d) return;
    device_guard_if const g(s.is_implicit(), device_);
    PIPESWAP_CUDA_TRY_WHAT(cudaFreeAsync(d.get(), s.get()), describe("deallocate_device", n));
  }

  /// Exactly `n` bytes of pinned host memory; null for 0. May block.
  [[nodiscard]] std::byte* allocate_host(std::size_t n) { return host_.allocate(n); }

  /// Returns pinned memory from allocate_host at once. The caller synchronized with its copies
  /// first.
  void deallocate_host(std::byte* h, std::size_t n) { host_.deallocate(h, n); }

  /// Enqueues a copy of `n` bytes from pinned host memory to device memory on `s`.
  void copy_h2d(device_ptr d, std::byte const* h, std::size_t n, stream_ref s) {
    if (n == 0) return;
    device_guard_if const g(s.is_implicit(), device_);
    PIPESWAP_CUDA_TRY_WHAT(cudaMemcpyAsync(d.get(), h, n, cudaMemcpyHostToDevice, s.get()), describe("copy_h2d", n));
  }

  /// Enqueues a copy of `n` bytes from device memory to pinned host memory on `s`.
  void copy_d2h(std::byte* h, device_ptr d, std::size_t n, stream_ref s) {
    if (n == 0) return;
    device_guard_if const g(s.is_implicit(), device_);
    PIPESWAP_CUDA_TRY_WHAT(cudaMemcpyAsync(h, d.get(), n, cudaMemcpyDeviceToHost, s.get()), describe("copy_d2h", n));
  }

  // ----- Optional capabilities -------------------------------------------------------------------

  /// Names the work enqueued from now on: an NVTX range in the "pipeswap" domain, open until the
  /// next label ("" closes it). Also quoted in error messages.
  void set_label(std::string_view label) { label_.set(label); }

  /// Blocks until all work on all streams of the device is complete (cudaDeviceSynchronize).
  void synchronize_device() {
    device_guard const g(device_);
    PIPESWAP_CUDA_TRY_WHAT(cudaDeviceSynchronize(), describe("synchronize_device"));
  }

  // ----- CUDA specifics --------------------------------------------------------------------------

  [[nodiscard]] int device() const noexcept { return device_; }

  /// Makes `s` (e.g. the engine's compute stream, not owned) the current stream. It must belong to
  /// this backend's device and outlive its use as the current stream.
  void set_current_stream(stream_ref s) noexcept { current_ = s; }

  /// Pins `n` bytes at `h` that the caller owns (cudaHostRegister, portable). n == 0: no-op.
  void register_host(void* h, std::size_t n) {
    device_guard const g(device_);
    cuda::register_host(h, n);
  }
  /// Undoes register_host. nullptr: no-op. The caller synchronized with the range's copies first.
  void unregister_host(void* h) {
    device_guard const g(device_);
    cuda::unregister_host(h);
  }

  /// The pool allocate_device draws from.
  [[nodiscard]] memory_pool& device_pool() noexcept { return device_pool_; }
  [[nodiscard]] memory_pool const& device_pool() const noexcept { return device_pool_; }
  /// Gives reserved, unused device memory back to the driver until at most `keep` bytes stay.
  void trim_device_pool(std::size_t keep = 0) { device_pool_.trim_to(keep); }

  /// The host NUMA node allocate_host places memory on; -1 when the driver chooses.
  [[nodiscard]] int host_numa_node() const noexcept { return host_.numa_node(); }

  /// The event pool (native events created and idle), for diagnostics.
  [[nodiscard]] event_pool const& events() const noexcept { return events_; }

  /// The current label ("" for none).
  [[nodiscard]] std::string const& label() const noexcept { return label_.text(); }

private:
  [[nodiscard]] std::string describe(char const* op) const {
    std::string m = pipeswap::detail::message({"pipeswap::cuda::backend(device ", device_, ")::", op});
    if (!label_.text().empty()) m.append(" during '").append(label_.text()).append("'");
    return m;
  }
  [[nodiscard]] std::string describe(char const* op, std::size_t n) const {
    return describe((pipeswap::detail::message({op, "(", n, " bytes)"})).c_str());
  }

  [[nodiscard]] cudaEvent_t checked(event const& e, char const* call, char const* op) const {
    if (!e.recorded()) [[unlikely]]
      return e.native(call, describe(op));
    return e.get();
  }

  int device_;
  /// Validates the ordinal and keeps the device current while the members below are built (pool
  /// and stream creation read it); restored at the end of the constructor, or by unwinding.
  device_guard setup_;
  memory_pool device_pool_;
  pinned_allocator host_;
  event_pool events_;
  int priority_;
  std::vector<stream> streams_;
  stream_ref current_ = legacy_stream();
  detail::label_range label_;
};

static_assert(pipeswap::backend<backend>);
static_assert(pipeswap::labelled_backend<backend>);

} // namespace pipeswap::cuda
