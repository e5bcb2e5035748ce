// pipeswap — CUDA stream handles: a copyable non-owning stream_ref and an owning, move-only stream.
//
//   stream_ref   wraps a cudaStream_t it does not own; regular (copyable, ==). It is the backend's
//                stream_type, so an engine passes its own compute stream without giving up
//                ownership. Built implicitly from a cudaStream_t; construction from 0 or nullptr is
//                deleted so "the default stream" is always spelled out: legacy_stream()
//                (cudaStreamLegacy) or per_thread_stream() (cudaStreamPerThread).
//   stream       creates a non-blocking stream (cudaStreamNonBlocking: it never synchronizes
//                implicitly with the legacy default stream) on a given device and destroys it in
//                its destructor, which never throws. Converts to stream_ref. A moved-from stream
//                holds no handle (get() == nullptr) and may only be destroyed or assigned to.
//
// Both are thin: sync() blocks on cudaStreamSynchronize, is_done() asks cudaStreamQuery. Failures
// throw cuda_error.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/cuda/detail/runtime.hpp>
#include <pipeswap/backend/cuda/device.hpp>
#include <pipeswap/backend/cuda/error.hpp>

namespace pipeswap::cuda {

/// A non-owning handle to a CUDA stream. The stream must outlive every use of the handle.
class stream_ref {
public:
  using value_type = cudaStream_t;

  constexpr stream_ref(cudaStream_t s) noexcept : s_(s) {} // NOLINT: implicit, like the raw handle
  stream_ref(int) = delete;
  stream_ref(std::nullptr_t) = delete;

  [[nodiscard]] constexpr cudaStream_t get() const noexcept { return s_; }

  /// Blocks the calling thread until all work enqueued on the stream so far is complete.
  void sync() const { PIPESWAP_CUDA_TRY(cudaStreamSynchronize(s_)); }

  /// True when all work enqueued on the stream so far is complete. Never blocks.
  [[nodiscard]] bool is_done() const {
    cudaError_t const s = cudaStreamQuery(s_);
    if (s == cudaErrorNotReady) return false; // not a failure: the runtime does not record it
    PIPESWAP_CUDA_TRY(s);
    return true;
  }

  /// True for the handles that mean "a default stream of the calling thread's current device".
  [[nodiscard]] bool is_implicit() const noexcept {
    return s_ == nullptr || s_ == cudaStreamLegacy || s_ == cudaStreamPerThread;
  }

  friend constexpr bool operator==(stream_ref, stream_ref) noexcept = default;

private:
  cudaStream_t s_;
};

/// The legacy default stream (cudaStreamLegacy): implicitly synchronizes with every blocking stream
/// of its device; non-blocking streams (all streams pipeswap creates) are not affected.
[[nodiscard]] inline stream_ref legacy_stream() noexcept { return stream_ref(cudaStreamLegacy); }

/// The calling thread's per-thread default stream (cudaStreamPerThread).
[[nodiscard]] inline stream_ref per_thread_stream() noexcept { return stream_ref(cudaStreamPerThread); }

/// An owning, move-only CUDA stream.
class stream {
public:
  /// Creates a non-blocking stream on `device` with `priority` (lower numbers are higher priority;
  /// 0 is the default; values outside the device's range are clamped by CUDA).
  explicit stream(int device, int priority = 0) : device_(device) {
    device_guard const g(device);
    PIPESWAP_CUDA_TRY_WHAT(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority),
                           pipeswap::detail::message({"pipeswap::cuda::stream(device ", device, ")"}));
  }

  /// Takes ownership of `s`, a stream created on `device`.
  [[nodiscard]] static stream from_native_handle(cudaStream_t s, int device) noexcept { return stream(s, device); }

  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)), device_(o.device_) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      destroy();
      s_ = std::exchange(o.s_, nullptr);
      device_ = o.device_;
    }
    return *this;
  }
  stream(stream const&) = delete;
  stream& operator=(stream const&) = delete;
  ~stream() { destroy(); }

  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] stream_ref ref() const noexcept { return stream_ref(s_); }
  operator stream_ref() const noexcept { return ref(); } // NOLINT: a stream is usable as its ref

  void sync() const { ref().sync(); }
  [[nodiscard]] bool is_done() const { return ref().is_done(); }

  /// Gives up ownership; the caller destroys the returned stream.
  [[nodiscard]] cudaStream_t release() noexcept { return std::exchange(s_, nullptr); }

private:
  stream(cudaStream_t s, int device) noexcept : s_(s), device_(device) {}
  void destroy() noexcept {
    // Work still enqueued completes; CUDA releases the stream afterwards.
    if (s_ != nullptr) PIPESWAP_CUDA_LOG(cudaStreamDestroy(std::exchange(s_, nullptr)));
  }

  cudaStream_t s_ = nullptr;
  int device_ = 0;
};

} // namespace pipeswap::cuda
