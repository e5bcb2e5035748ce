// pipeswap — CUDA devices: how many there are, and a scoped current device.
//
//   device_count()       devices visible to the process; 0 when there is no driver or no device.
//   device_guard         makes a device current for the calling thread for its lifetime, then
//                        restores the previous one. Costs one cudaGetDevice (a thread-local read)
//                        and, only when the device differs, two cudaSetDevice calls.
//   device_guard_if      the same, only when a condition holds.
//
// The CUDA backend uses a guard only where the runtime reads the current device: creating streams
// and events, pinned allocation, device-wide synchronization, and enqueueing on a stream handle
// that means "the default stream of the current device" (cudaStreamLegacy, cudaStreamPerThread,
// null). Calls on explicit streams need no guard: the stream carries its device.
#pragma once

#include <optional>
#include <string_view>
#include <utility>

#include <pipeswap/backend/cuda/detail/runtime.hpp>
#include <pipeswap/backend/cuda/error.hpp>

namespace pipeswap::cuda {

/// Number of CUDA devices visible to the process; 0 (never an exception) when the driver is missing
/// or too old or no device is present. The runtime leaves the count untouched on failure, hence the
/// explicit 0.
[[nodiscard]] inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Makes `device` the calling thread's current device until the guard is destroyed or restore() is
/// called. Not copyable or movable. The constructor throws cuda_error (naming cudaSetDevice, with
/// `what` naming the caller) for an invalid ordinal; restore() and the destructor never throw.
class device_guard {
public:
  explicit device_guard(int device, std::string_view what = "pipeswap::cuda::device_guard") {
    PIPESWAP_CUDA_TRY_WHAT(cudaGetDevice(&previous_), what);
    if (previous_ == device) {
      previous_ = -1;
      return;
    }
    int const previous = std::exchange(previous_, -1); // nothing to restore if the switch fails
    PIPESWAP_CUDA_TRY_WHAT(cudaSetDevice(device), what);
    previous_ = previous;
  }
  device_guard(device_guard const&) = delete;
  device_guard& operator=(device_guard const&) = delete;
  ~device_guard() { restore(); }

  /// Makes the previous device current again now; later calls and the destructor do nothing.
  void restore() noexcept {
    if (previous_ >= 0) PIPESWAP_CUDA_LOG(cudaSetDevice(std::exchange(previous_, -1)));
  }

private:
  int previous_ = -1; ///< the device to restore; -1 when nothing was changed
};

/// A device_guard when `needed`, nothing otherwise: for calls that read the current device only in
/// some cases (enqueueing on an implicit default-stream handle).
class device_guard_if {
public:
  device_guard_if(bool needed, int device) {
    if (needed) g_.emplace(device);
  }

private:
  std::optional<device_guard> g_;
};

} // namespace pipeswap::cuda
