// pipeswap — CUDA events as shared, recorded points: event and event_pool.
//
//   event_pool   hands out recorded events on one device. Native events are created with
//                cudaEventDisableTiming (timing makes recording and waiting slower and pipeswap
//                never reads elapsed times) and recycled: a native event returns to the pool when
//                the last event naming its point is destroyed, so a steady-state swap loop creates
//                none.
//   event        a recorded point on a stream, or "not recorded" when default-constructed.
//                Copies are cheap (a reference count) and name the same point; the native event
//                stays recorded, and waitable, as long as any copy lives — including after the
//                original, the pool and the backend that made it are destroyed. A native event is
//                re-recorded only once no copy names its old point, so a wait can never observe a
//                later recording.
//
// Thread safety: events may be copied and destroyed on any thread (the pool's free list is locked);
// recording goes through the pool's owner, one thread at a time like every backend call.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/cuda/detail/runtime.hpp>
#include <pipeswap/backend/cuda/device.hpp>
#include <pipeswap/backend/cuda/error.hpp>
#include <pipeswap/backend/cuda/stream.hpp>

namespace pipeswap::cuda {

namespace detail {

/// Idle native events of one device. Shared by the pool and by every live event point, so it lives
/// until the last of them.
struct event_cache {
  explicit event_cache(int d) noexcept : device(d) {}
  event_cache(event_cache const&) = delete;
  event_cache& operator=(event_cache const&) = delete;
  ~event_cache() {
    for (cudaEvent_t e : idle) PIPESWAP_CUDA_LOG(cudaEventDestroy(e));
  }

  cudaEvent_t take() {
    {
      std::lock_guard const lock(mutex);
      if (!idle.empty()) {
        cudaEvent_t e = idle.back();
        idle.pop_back();
        return e;
      }
    }
    device_guard const g(device);
    cudaEvent_t e = nullptr;
    PIPESWAP_CUDA_TRY_WHAT(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                           pipeswap::detail::message({"pipeswap::cuda::event_pool(device ", device, ")"}));
    std::lock_guard const lock(mutex);
    ++created;
    return e;
  }

  void give_back(cudaEvent_t e) noexcept {
    try {
      std::lock_guard const lock(mutex);
      idle.push_back(e);
      return;
    } catch (...) { // no memory to keep it: destroy it instead
    }
    PIPESWAP_CUDA_LOG(cudaEventDestroy(e));
  }

  int const device;
  std::mutex mutex;
  std::vector<cudaEvent_t> idle;
  std::size_t created = 0;
};

/// One recorded point: a native event on loan from a cache until the last copy of the point dies.
struct event_point {
  event_point(cudaEvent_t e, std::shared_ptr<event_cache> c) noexcept : native(e), cache(std::move(c)) {}
  event_point(event_point const&) = delete;
  event_point& operator=(event_point const&) = delete;
  ~event_point() { cache->give_back(native); }

  cudaEvent_t const native;
  std::shared_ptr<event_cache> const cache;
};

} // namespace detail

/// A recorded point on a CUDA stream (see the header comment). The backend's event_type.
class event {
public:
  /// An event that was never recorded. Waiting on it is an error.
  event() noexcept = default;

  [[nodiscard]] bool recorded() const noexcept { return point_ != nullptr; }
  /// The native event; nullptr when not recorded. Valid while this event (or a copy) lives.
  [[nodiscard]] cudaEvent_t get() const noexcept { return point_ ? point_->native : nullptr; }

  /// Blocks the calling thread until the point is complete. Throws cuda_error if not recorded.
  void sync() const {
    PIPESWAP_CUDA_TRY_WHAT(cudaEventSynchronize(native("cudaEventSynchronize", "pipeswap::cuda::event::sync")),
                           "pipeswap::cuda::event::sync");
  }

  /// True when the point is complete. Never blocks. Throws cuda_error if not recorded.
  [[nodiscard]] bool is_done() const {
    cudaError_t const s = cudaEventQuery(native("cudaEventQuery", "pipeswap::cuda::event::is_done"));
    if (s == cudaErrorNotReady) return false; // not a failure: the runtime does not record it
    PIPESWAP_CUDA_TRY_WHAT(s, "pipeswap::cuda::event::is_done");
    return true;
  }

  /// The native event, for passing to `call` on behalf of `what`; when this event was never
  /// recorded, throws cuda_error(cudaErrorInvalidResourceHandle) instead, as if `call` had failed
  /// on it.
  [[nodiscard]] cudaEvent_t native(std::string_view call, std::string_view what) const {
    if (point_ == nullptr) [[unlikely]] {
      throw cuda_error(cudaErrorInvalidResourceHandle, std::string(call) + "(an event that was never recorded)", what);
    }
    return point_->native;
  }

  /// Same recorded point (or both not recorded).
  friend bool operator==(event const& a, event const& b) noexcept { return a.point_ == b.point_; }

private:
  friend class event_pool;
  explicit event(std::shared_ptr<detail::event_point const> p) noexcept : point_(std::move(p)) {}

  std::shared_ptr<detail::event_point const> point_;
};

/// Records recycled native events on one device (see the header comment). Move-only; a moved-from
/// pool may only be destroyed or assigned to. Events it recorded stay valid after it is destroyed.
class event_pool {
public:
  explicit event_pool(int device) : cache_(std::make_shared<detail::event_cache>(device)) {}
  event_pool(event_pool&&) noexcept = default;
  event_pool& operator=(event_pool&&) noexcept = default;
  event_pool(event_pool const&) = delete;
  event_pool& operator=(event_pool const&) = delete;
  ~event_pool() = default;

  /// Records a point after all work enqueued on `s` so far. `s` must belong to this pool's device;
  /// an implicit default-stream handle (stream_ref::is_implicit) is taken as this device's.
  [[nodiscard]] event record(stream_ref s) {
    cudaEvent_t const e = cache_->take();
    auto point = std::shared_ptr<detail::event_point const>();
    try {
      point = std::make_shared<detail::event_point>(e, cache_);
    } catch (...) {
      cache_->give_back(e);
      throw;
    }
    // From here the point owns the native event; an exception below returns it to the cache.
    device_guard_if const g(s.is_implicit(), cache_->device);
    PIPESWAP_CUDA_TRY_WHAT(cudaEventRecord(e, s.get()), "pipeswap::cuda::event_pool::record");
    return event(std::move(point));
  }

  [[nodiscard]] int device() const noexcept { return cache_->device; }

  /// Native events waiting for reuse.
  [[nodiscard]] std::size_t idle() const {
    std::lock_guard const lock(cache_->mutex);
    return cache_->idle.size();
  }
  /// Native events created so far.
  [[nodiscard]] std::size_t created() const {
    std::lock_guard const lock(cache_->mutex);
    return cache_->created;
  }

private:
  std::shared_ptr<detail::event_cache> cache_;
};

} // namespace pipeswap::cuda
