// pipeswap — the torch backend: pipeswap::torch::backend models pipeswap::backend over PyTorch's
// runtime (c10/ATen), for one device, CPU or CUDA. It is what pipeswap.torch runs on, and a C++
// engine that embeds libtorch can instantiate the runtimes with it the same way. docs/pytorch.md and
// docs/backend.md ("The torch backend") are the guide.
//
// Not part of <pipeswap/pipeswap.hpp>: it needs torch's headers (and libtorch, libc10 at link time),
// which a plain user of pipeswap does not have.
//
// CUDA device (compiled in when PIPESWAP_TORCH_CUDA is 1: c10's CUDA headers and the CUDA Toolkit's
// runtime header are on the include path; define it to 0 to leave the CUDA path out):
//   Streams.  stream_type is c10::Stream. current_stream() is torch's current stream of the device at
//             the time of the call (c10::cuda::getCurrentCUDAStream), so the runtime's compute work
//             follows whatever stream the training loop runs on. new_stream() takes a stream from
//             torch's stream pool (c10::cuda::getStreamFromPool) and keeps it for the backend's life;
//             pool streams are never destroyed (torch shares them round-robin with its other users).
//   Events.   event_type is a shared handle to a c10::Event recorded on the stream: copies name the
//             same point and stay waitable after the backend is gone. wait_event is a stream wait on
//             the device, synchronize a host wait: the only call that blocks (with pinned allocation).
//   Device memory. Through torch's CUDA caching allocator, with the given stream current, so the
//             block belongs to that stream's pool and torch.cuda.memory_allocated / memory_stats count
//             it. A release on another stream than the allocation's records that stream on the block
//             first (recordStream): the allocator reuses the block only after the work enqueued on it
//             so far, which makes deallocate_device stream-ordered as the concept asks.
//   Pinned memory. pipeswap's exact-size host allocation (pipeswap::cuda::pinned_allocator,
//             cudaHostAlloc), not torch's caching host allocator, which rounds every request up to a
//             power of two.
//   Copies.   cudaMemcpyAsync on the given stream.
//
// Storages. Every device block the backend holds is a c10::Storage: the ones it allocates, and the
// ones it adopts from tensors (adopt(), for the activation swap: pipeswap takes a reference to the
// storage a saved tensor lives in, and releasing the block drops that reference). storage() hands
// a block out as a Storage for tensors to be built on; shared() says whether anyone but the backend
// still references a block, so releasing it would free nothing.
//
// CPU device: the same concept with synchronous semantics. Device memory is CPU memory from torch's
// CPU allocator; every stream is the CPU (new_stream() gives distinct ids for tracing); events are
// complete when recorded; copies are memcpy at the call. So every behaviour above the backend runs
// and can be tested on a machine without a GPU.
//
// Errors. A failing call throws error_type (pipeswap::error): torch's errors (c10::Error, out of
// memory included) are rethrown as pipeswap::torch::torch_error naming the backend's device, the
// operation and its size; CUDA runtime errors as pipeswap::cuda::cuda_error. Nothing is enqueued by
// a call that throws; the backend stays usable. Destructors never throw.
//
// Zero sizes. allocate_device(0, s) and allocate_host(0) return null; releasing null is a no-op; a
// copy of 0 bytes is a no-op.
//
// Threads. One host thread at a time, like every backend. current_stream() reads the calling
// thread's current stream: call the runtime from the thread whose stream the compute work is on.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>

#if !defined(PIPESWAP_TORCH_CUDA)
#  if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<cuda_runtime_api.h>)
#    define PIPESWAP_TORCH_CUDA 1
#  else
#    define PIPESWAP_TORCH_CUDA 0
#  endif
#endif

#if PIPESWAP_TORCH_CUDA
#  include <cuda_runtime_api.h>
#  include <c10/cuda/CUDACachingAllocator.h>
#  include <c10/cuda/CUDAFunctions.h>
#  include <c10/cuda/CUDAGuard.h>
#  include <c10/cuda/CUDAStream.h>
#  include <pipeswap/backend/cuda/error.hpp>
#  include <pipeswap/backend/cuda/memory.hpp>
#endif

namespace pipeswap::torch {

/// A call into torch failed (allocation, event, stream): what torch said, with the backend's device
/// and the operation.
class torch_error : public pipeswap::error {
public:
  using pipeswap::error::error;
};

/// A recorded point on a stream; copies share it. Default-constructed (or recorded on a CPU backend):
/// complete.
class event {
public:
  event() = default;
  [[nodiscard]] bool recorded() const noexcept { return static_cast<bool>(e_); }
  /// The c10 event (null for CPU and for a default-constructed event).
  [[nodiscard]] c10::Event const* get() const noexcept { return e_.get(); }

private:
  friend class backend;
  explicit event(std::shared_ptr<c10::Event> e) noexcept : e_(std::move(e)) {}
  std::shared_ptr<c10::Event> e_;
};

/// The torch backend for one device (see the header comment). Not copyable or movable: streams and
/// memory it hands out refer to it.
class backend {
public:
  using backend_concept = backend_tag;
  using error_type = pipeswap::error;
  using stream_type = c10::Stream;
  using event_type = event;
  using device_pointer = device_ptr;

  /// A backend for `device` (kCPU, or kCUDA with an index; an unindexed CUDA device means torch's
  /// current one). Throws torch_error for another device type or a CUDA device this build or this
  /// machine lacks.
  explicit backend(c10::Device device) : device_(normalize(device)) {}
  backend(backend const&) = delete;
  backend& operator=(backend const&) = delete;
  ~backend() = default; // device blocks return to torch's allocator, pinned memory is freed

  [[nodiscard]] c10::Device device() const noexcept { return device_; }
  [[nodiscard]] bool is_cuda() const noexcept { return device_.is_cuda(); }

  // ----- streams -----------------------------------------------------------------------------------

  /// torch's current stream of the device, now (CPU: the CPU's default stream).
  [[nodiscard]] stream_type current_stream() const {
#if PIPESWAP_TORCH_CUDA
    if (is_cuda()) return c10::cuda::getCurrentCUDAStream(device_.index()).unwrap();
#endif
    return c10::Stream(c10::Stream::DEFAULT, device_);
  }

  /// A stream from torch's pool, kept for the backend's life (CPU: a new id, no asynchrony).
  [[nodiscard]] stream_type new_stream() {
#if PIPESWAP_TORCH_CUDA
    if (is_cuda()) {
      return guarded("new_stream", 0, [&] { return c10::cuda::getStreamFromPool(false, device_.index()).unwrap(); });
    }
#endif
    return c10::Stream(c10::Stream::UNSAFE, device_, static_cast<c10::StreamId>(++streams_));
  }

  // ----- events ------------------------------------------------------------------------------------

  [[nodiscard]] event_type record_event(stream_type s) {
    check_stream(s, "record_event");
    if (!is_cuda()) return event{};
    return guarded("record_event", 0, [&] {
      auto e = std::make_shared<c10::Event>(device_.type(), c10::EventFlag::PYTORCH_DEFAULT);
      e->record(s);
      return event(std::move(e));
    });
  }

  void wait_event(stream_type s, event_type const& e) {
    check_stream(s, "wait_event");
    if (!is_cuda()) return;
    require_recorded(e, "wait_event");
    guarded("wait_event", 0, [&] { e.e_->block(s); });
  }

  void synchronize(event_type const& e) {
    if (!is_cuda()) return;
    require_recorded(e, "synchronize");
    guarded("synchronize", 0, [&] { e.e_->synchronize(); });
  }

  // ----- device memory -----------------------------------------------------------------------------

  /// `n` bytes from torch's allocator for the device, usable by work on `s` (CUDA: the block belongs
  /// to `s`). Null for 0.
  [[nodiscard]] device_pointer allocate_device(std::size_t n, stream_type s) {
    check_stream(s, "allocate_device");
    if (n == 0) return {};
    return guarded("allocate_device", n, [&] {
      c10::DataPtr dp;
#if PIPESWAP_TORCH_CUDA
      if (is_cuda()) {
        c10::cuda::CUDAStreamGuard const g(c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s));
        dp = c10::cuda::CUDACachingAllocator::get()->allocate(n);
      } else
#endif
      {
        dp = c10::GetCPUAllocator()->allocate(n);
      }
      void* const p = dp.get();
      device_blocks_.emplace(p, block{c10::Storage(c10::Storage::use_byte_size_t(), n, std::move(dp)), s});
      return device_ptr(p);
    });
  }

  /// Releases `d` behind the work enqueued on `s` so far (see the header comment). Null: no-op.
  void deallocate_device(device_pointer d, std::size_t n, stream_type s) {
    if (!d) return;
    check_stream(s, "deallocate_device");
    auto const& blk = block_at(d, "deallocate_device", n);
    guarded("deallocate_device", n, [&] {
#if PIPESWAP_TORCH_CUDA
      if (is_cuda() && s != blk.owner) {
        c10::cuda::CUDACachingAllocator::recordStream(blk.data.data_ptr(),
                                                      c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s));
      }
#endif
    });
    device_blocks_.erase(d.get()); // the last reference returns the block to torch's allocator
  }

  /// Takes a reference to `storage` (a tensor's, on the backend's device) and holds it as a device
  /// block from now on: deallocate_device() drops the reference, and storage() hands it out again.
  /// `s` is the stream the storage's last writes were enqueued on (CUDA: a release on another stream
  /// records that one on the block, as for the backend's own allocations). Throws torch_error,
  /// changing nothing, for a storage of another device, one without memory, or one the backend
  /// already holds.
  [[nodiscard]] device_pointer adopt(c10::Storage storage, stream_type s) {
    check_stream(s, "adopt");
    auto const n = storage.nbytes();
    if (storage.device() != device_) {
      throw torch_error(describe("adopt", n) + ": the storage is on " + storage.device().str());
    }
    void* const p = storage.data_ptr().get();
    if (!p || n == 0) throw torch_error(describe("adopt", n) + ": the storage has no memory");
    if (device_blocks_.count(p)) {
      throw torch_error(describe("adopt", n) + ": the backend already holds this storage");
    }
    device_blocks_.emplace(p, block{std::move(storage), s});
    return device_ptr(p);
  }

  /// The storage of a device block the backend holds (allocated or adopted), for a tensor to be
  /// built on; the block stays held. Throws torch_error for any other address.
  [[nodiscard]] c10::Storage storage(device_pointer d) const { return block_at(d, "storage", 0).data; }

  /// Whether anything besides the backend (a tensor, autograd, a Python object) references the
  /// storage of block `d`: releasing it would then free no memory. Throws as storage().
  [[nodiscard]] bool shared(device_pointer d) const { return block_at(d, "shared", 0).data.use_count() > 1; }

  /// Device blocks this backend holds from torch's allocator (allocated, not yet released).
  [[nodiscard]] std::size_t device_blocks() const noexcept { return device_blocks_.size(); }

  // ----- pinned host memory ------------------------------------------------------------------------

  /// Exactly `n` bytes of pinned host memory (CPU: plain, 64-byte aligned). Null for 0. May block.
  [[nodiscard]] std::byte* allocate_host(std::size_t n) {
    if (n == 0) return nullptr;
#if PIPESWAP_TORCH_CUDA
    if (is_cuda()) return pinned().allocate(n);
#endif
    void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) throw torch_error(describe("allocate_host", n) + ": out of host memory");
    return static_cast<std::byte*>(p);
  }

  void deallocate_host(std::byte* h, std::size_t n) {
    if (!h) return;
#if PIPESWAP_TORCH_CUDA
    if (is_cuda()) return pinned().deallocate(h, n);
#endif
    std::free(h);
  }

  // ----- copies ------------------------------------------------------------------------------------

  void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, stream_type s) {
    check_stream(s, "copy_h2d");
    if (n == 0) return;
#if PIPESWAP_TORCH_CUDA
    if (is_cuda()) {
      PIPESWAP_CUDA_TRY_WHAT(cudaMemcpyAsync(d.get(), h, n, cudaMemcpyHostToDevice, native(s)),
                             describe("copy_h2d", n));
      return;
    }
#endif
    std::memcpy(d.get(), h, n);
  }

  void copy_d2h(std::byte* h, device_pointer d, std::size_t n, stream_type s) {
    check_stream(s, "copy_d2h");
    if (n == 0) return;
#if PIPESWAP_TORCH_CUDA
    if (is_cuda()) {
      PIPESWAP_CUDA_TRY_WHAT(cudaMemcpyAsync(h, d.get(), n, cudaMemcpyDeviceToHost, native(s)),
                             describe("copy_d2h", n));
      return;
    }
#endif
    std::memcpy(h, d.get<void const>(), n);
  }

  // ----- optional capabilities ---------------------------------------------------------------------

  /// Blocks until all work on all streams of the device is complete.
  void synchronize_device() {
#if PIPESWAP_TORCH_CUDA
    if (is_cuda()) guarded("synchronize_device", 0, [&] { c10::cuda::device_synchronize(); });
#endif
  }

private:
  struct block {
    c10::Storage data;
    c10::Stream owner;
  };

  static c10::Device normalize(c10::Device d) {
    if (d.is_cpu()) return c10::Device(c10::kCPU);
    if (d.is_cuda()) {
#if PIPESWAP_TORCH_CUDA
      try {
        auto const count = c10::cuda::device_count();
        auto const index = d.has_index() ? d.index() : c10::cuda::current_device();
        if (index < 0 || index >= count) {
          throw torch_error(pipeswap::detail::message(
              {"pipeswap::torch::backend(", d.str(), "): this machine has ", count, " CUDA device(s)"}));
        }
        return c10::Device(c10::kCUDA, index);
      } catch (c10::Error const& e) {
        throw torch_error("pipeswap::torch::backend(" + d.str() + "): " + e.what_without_backtrace());
      }
#else
      throw torch_error("pipeswap::torch::backend(" + d.str() +
                        "): this build has no CUDA path (PIPESWAP_TORCH_CUDA is 0: c10/cuda or the CUDA "
                        "Toolkit's headers were not found when it was compiled)");
#endif
    }
    throw torch_error("pipeswap::torch::backend(" + d.str() + "): only CPU and CUDA devices are supported");
  }

  [[nodiscard]] std::string describe(char const* op, std::size_t n) const {
    auto s = pipeswap::detail::message({"pipeswap::torch::backend(", device_.str(), ")::", op});
    if (n) pipeswap::detail::append(s, {"(", n, " bytes)"});
    return s;
  }

  /// The block the backend holds at `d`; throws torch_error naming `op` for any other address.
  block const& block_at(device_pointer d, char const* op, std::size_t n) const {
    auto it = device_blocks_.find(d.get());
    if (it == device_blocks_.end()) {
      throw torch_error(describe(op, n) + ": the address is not a block this backend holds (never allocated or "
                                          "adopted here, or released already)");
    }
    return it->second;
  }

  void check_stream(stream_type const& s, char const* op) const {
    if (s.device() != device_) {
      throw torch_error(describe(op, 0) + ": the stream belongs to " + s.device().str() +
                        "; pass streams of the backend's own device");
    }
  }

  void require_recorded(event_type const& e, char const* op) const {
    if (!e.recorded()) throw torch_error(describe(op, 0) + ": the event was never recorded");
  }

  /// Runs f, rethrowing torch's errors as torch_error with the operation named.
  template <class F>
  auto guarded(char const* op, std::size_t n, F&& f) const -> std::invoke_result_t<F> {
    try {
      return std::forward<F>(f)();
    } catch (c10::Error const& e) {
      throw torch_error(describe(op, n) + ": " + e.what_without_backtrace());
    }
  }

#if PIPESWAP_TORCH_CUDA
  static cudaStream_t native(stream_type s) {
    return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream();
  }
  cuda::pinned_allocator& pinned() {
    if (!pinned_) pinned_ = std::make_unique<cuda::pinned_allocator>(device_.index(), cuda::host_placement::any);
    return *pinned_;
  }
  std::unique_ptr<cuda::pinned_allocator> pinned_;
#endif

  c10::Device device_;
  std::size_t streams_ = 0;
  std::unordered_map<void*, block> device_blocks_;
};

static_assert(pipeswap::backend<backend>);

} // namespace pipeswap::torch
