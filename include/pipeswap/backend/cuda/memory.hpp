// pipeswap — CUDA memory: stream-ordered pools, pinned host memory, host-range registration.
//
//   memory_pool         a cudaMemPool_t, owned (destroyed with the handle) or borrowed.
//                       allocate() is cudaMallocFromPoolAsync, deallocate() is cudaFreeAsync: both
//                       are ordered on a stream and never block the host. Memory freed on a stream
//                       is reused by later allocations ordered after the free (same stream, or
//                       across an event). A pool keeps up to its release threshold of freed memory
//                       reserved when the device, a stream or an event is synchronized; above it,
//                       the excess goes back to the driver. CUDA's default threshold is 0 (give
//                       back everything at each synchronization), which makes a swap loop re-map
//                       its buffers every step; create_device() takes the threshold explicitly.
//   pinned_allocator    exact-size pinned (page-locked) host memory for one device. The caller sees
//                       exactly n bytes; nothing is rounded to a power of two. Placement:
//                       * host_placement::any: cudaHostAlloc(cudaHostAllocPortable); the driver
//                         places the pages (usually on the NUMA node of the calling thread's CPU).
//                       * host_placement::near_device: on the host NUMA node closest to the device
//                         (cudaDevAttrHostNumaId), from a host NUMA memory pool
//                         (cudaMemLocationTypeHostNuma) made readable and writable by the device.
//                         Falls back to `any`, silently, when the system reports no NUMA node (-1),
//                         the device does not support host NUMA pools
//                         (cudaDevAttrHostNumaMemoryPoolsSupported), the pool cannot be created, or
//                         the toolkit is older than CUDA 13. numa_node() tells which is in effect.
//                       Both allocate and deallocate may block (pinning and unpinning pages does);
//                       keep them out of hot loops.
//   register_host       page-locks an existing host range (cudaHostRegister, portable), for
//   unregister_host     memory the caller already owns (an mmap'd checkpoint, a framework's
//                       tensor storage).
//
// Zero sizes: allocate(0) returns nullptr without calling CUDA; releasing nullptr is a no-op;
// register_host(p, 0) is a no-op. Failures throw cuda_error; destructors never throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/cuda/detail/runtime.hpp>
#include <pipeswap/backend/cuda/device.hpp>
#include <pipeswap/backend/cuda/error.hpp>
#include <pipeswap/backend/cuda/stream.hpp>

namespace pipeswap::cuda {

/// A CUDA memory pool, owned or borrowed (see the header comment). Move-only; a moved-from pool may
/// only be destroyed or assigned to.
class memory_pool {
public:
  /// Creates a pool of device memory on `device` that keeps up to `release_threshold` freed bytes
  /// reserved across synchronizations (UINT64_MAX: all of them, until trim_to()).
  [[nodiscard]] static memory_pool create_device(int device, std::uint64_t release_threshold) {
    memory_pool pool = create(cudaMemLocationTypeDevice, device, "create_device");
    pool.set_release_threshold(release_threshold);
    return pool;
  }

  /// Creates a pool of pinned host memory on host NUMA node `numa_node`, readable and writable by
  /// `device`, with release threshold 0 (freed memory is unpinned at the next synchronization).
  [[nodiscard]] static memory_pool create_host_numa(int numa_node, int device) {
    memory_pool pool = create(cudaMemLocationTypeHostNuma, numa_node, "create_host_numa");
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = device;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    PIPESWAP_CUDA_TRY_WHAT(cudaMemPoolSetAccess(pool.get(), &access, 1), describe("create_host_numa", numa_node));
    return pool;
  }

  /// The current default pool of `device` (cudaDeviceGetDefaultMemPool), borrowed.
  [[nodiscard]] static memory_pool device_default(int device) {
    cudaMemPool_t p = nullptr;
    PIPESWAP_CUDA_TRY_WHAT(cudaDeviceGetDefaultMemPool(&p, device), describe("device_default", device));
    return memory_pool(p, false);
  }

  /// A pool this handle does not own; the caller keeps it alive while the handle is used.
  [[nodiscard]] static memory_pool borrow(cudaMemPool_t pool) noexcept { return memory_pool(pool, false); }

  memory_pool(memory_pool&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), owning_(std::exchange(o.owning_, false)) {}
  memory_pool& operator=(memory_pool&& o) noexcept {
    if (this != &o) {
      destroy();
      pool_ = std::exchange(o.pool_, nullptr);
      owning_ = std::exchange(o.owning_, false);
    }
    return *this;
  }
  memory_pool(memory_pool const&) = delete;
  memory_pool& operator=(memory_pool const&) = delete;
  ~memory_pool() { destroy(); }

  [[nodiscard]] cudaMemPool_t get() const noexcept { return pool_; }
  [[nodiscard]] bool owning() const noexcept { return owning_; }

  /// Stream-ordered allocation of `n` bytes, usable by work ordered after it on `s`. nullptr for 0.
  [[nodiscard]] void* allocate(std::size_t n, stream_ref s) {
    if (n == 0) return nullptr;
    void* p = nullptr;
    PIPESWAP_CUDA_TRY_WHAT(cudaMallocFromPoolAsync(&p, n, pool_, s.get()),
                           pipeswap::detail::message({"pipeswap::cuda::memory_pool::allocate(", n, " bytes)"}));
    return p;
  }

  /// Stream-ordered release (of memory from any pool): reused only after the work enqueued on `s`
  /// before this call. nullptr is a no-op.
  static void deallocate(void* p, stream_ref s) {
    if (p == nullptr) return;
    PIPESWAP_CUDA_TRY_WHAT(cudaFreeAsync(p, s.get()), "pipeswap::cuda::memory_pool::deallocate");
  }

  /// Gives reserved but unused memory back to the driver until at most `keep` bytes stay reserved.
  void trim_to(std::size_t keep) {
    PIPESWAP_CUDA_TRY_WHAT(cudaMemPoolTrimTo(pool_, keep), "pipeswap::cuda::memory_pool::trim_to");
  }

  /// Bytes the pool holds from the driver, in use or not (cudaMemPoolAttrReservedMemCurrent).
  [[nodiscard]] std::uint64_t reserved_bytes() const { return attribute(cudaMemPoolAttrReservedMemCurrent); }
  /// Bytes handed out and not yet freed (cudaMemPoolAttrUsedMemCurrent).
  [[nodiscard]] std::uint64_t used_bytes() const { return attribute(cudaMemPoolAttrUsedMemCurrent); }
  [[nodiscard]] std::uint64_t release_threshold() const { return attribute(cudaMemPoolAttrReleaseThreshold); }
  void set_release_threshold(std::uint64_t bytes) {
    PIPESWAP_CUDA_TRY_WHAT(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &bytes),
                           "pipeswap::cuda::memory_pool::set_release_threshold");
  }

private:
  memory_pool(cudaMemPool_t p, bool owning) noexcept : pool_(p), owning_(owning) {}

  /// A new, owned pool of pinned memory at `location`, not shareable with other processes.
  static memory_pool create(cudaMemLocationType type, int location, char const* op) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = type;
    props.location.id = location;
    cudaMemPool_t p = nullptr;
    PIPESWAP_CUDA_TRY_WHAT(cudaMemPoolCreate(&p, &props), describe(op, location));
    return memory_pool(p, true);
  }

  static std::string describe(char const* op, int where) {
    return pipeswap::detail::message({"pipeswap::cuda::memory_pool::", op, "(", where, ")"});
  }

  [[nodiscard]] std::uint64_t attribute(cudaMemPoolAttr a) const {
    std::uint64_t v = 0;
    PIPESWAP_CUDA_TRY_WHAT(cudaMemPoolGetAttribute(pool_, a, &v), "pipeswap::cuda::memory_pool");
    return v;
  }

  void destroy() noexcept {
    // Outstanding allocations and pending frees keep the memory alive; CUDA releases it after them.
    if (owning_ && pool_ != nullptr) PIPESWAP_CUDA_LOG(cudaMemPoolDestroy(pool_));
    pool_ = nullptr;
    owning_ = false;
  }

  cudaMemPool_t pool_ = nullptr;
  bool owning_ = false;
};

/// Where pinned_allocator places host memory (see the header comment).
enum class host_placement : std::uint8_t {
  any,         ///< cudaHostAlloc; the driver chooses the pages
  near_device, ///< the device's closest host NUMA node when supported, else as `any`
};

/// Exact-size pinned host memory for one device (see the header comment). Not copyable or movable.
class pinned_allocator {
public:
  pinned_allocator(int device, host_placement placement) : device_(device) {
    if (placement == host_placement::near_device) try_numa_pool();
  }
  pinned_allocator(pinned_allocator const&) = delete;
  pinned_allocator& operator=(pinned_allocator const&) = delete;
  ~pinned_allocator() = default;

  /// `n` bytes of pinned host memory, exactly; nullptr for 0. May block.
  [[nodiscard]] std::byte* allocate(std::size_t n) {
    if (n == 0) return nullptr;
    if (numa_) {
      void* p = numa_->pool.allocate(n, numa_->order);
      // Stream-ordered on a private stream: wait, so the host and every stream may use it at once.
      try {
        numa_->order.sync();
      } catch (...) {
        PIPESWAP_CUDA_LOG(cudaFreeAsync(p, numa_->order.get()));
        throw;
      }
      return static_cast<std::byte*>(p);
    }
    device_guard const g(device_);
    void* p = nullptr;
    PIPESWAP_CUDA_TRY_WHAT(cudaHostAlloc(&p, n, cudaHostAllocPortable),
                           pipeswap::detail::message({"pipeswap::cuda::pinned_allocator::allocate(", n, " bytes)"}));
    return static_cast<std::byte*>(p);
  }

  /// Returns memory from allocate(p's size). The caller has synchronized with every copy using it.
  /// nullptr is a no-op. May block.
  void deallocate(std::byte* p, std::size_t /*n*/) {
    if (p == nullptr) return;
    if (numa_) {
      memory_pool::deallocate(p, numa_->order);
      numa_->order.sync(); // the pool unpins at synchronization (threshold 0): make it happen now
      return;
    }
    device_guard const g(device_); // so no other device's context is created on the way
    PIPESWAP_CUDA_TRY_WHAT(cudaFreeHost(p), "pipeswap::cuda::pinned_allocator::deallocate");
  }

  /// The host NUMA node allocations are placed on; -1 when the driver chooses (placement `any`, or
  /// the fallback from `near_device`).
  [[nodiscard]] int numa_node() const noexcept { return numa_ ? numa_->node : -1; }
  [[nodiscard]] int device() const noexcept { return device_; }

private:
  struct numa_pool {
    memory_pool pool;
    stream order; ///< orders pool allocations and frees; synchronized after each
    int node;
  };

  void try_numa_pool() {
#if CUDART_VERSION >= 13000 // the attributes and host NUMA pools as checked here; older: `any`
    int node = -1;
    int supported = 0;
    if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device_) != cudaSuccess) {
      (void)cudaGetLastError();
      node = -1;
    }
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrHostNumaMemoryPoolsSupported, device_) != cudaSuccess) {
      (void)cudaGetLastError();
      supported = 0;
    }
    if (node < 0 || supported == 0) return;
    try {
      numa_.emplace(numa_pool{memory_pool::create_host_numa(node, device_), stream(device_), node});
    } catch (cuda_error const&) { // unsupported here after all: fall back to cudaHostAlloc
      numa_.reset();
    }
#endif
  }

  int device_;
  std::optional<numa_pool> numa_;
};

/// Page-locks the `n` bytes at `p` for asynchronous copies with every device (cudaHostRegister,
/// cudaHostRegisterPortable). n == 0 is a no-op. Unregister before freeing the range.
inline void register_host(void* p, std::size_t n) {
  if (n == 0) return;
  PIPESWAP_CUDA_TRY_WHAT(cudaHostRegister(p, n, cudaHostRegisterPortable),
                         pipeswap::detail::message({"pipeswap::cuda::register_host(", n, " bytes)"}));
}

/// Undoes register_host(p, n). nullptr is a no-op. The caller has synchronized with every copy
/// using the range.
inline void unregister_host(void* p) {
  if (p == nullptr) return;
  PIPESWAP_CUDA_TRY_WHAT(cudaHostUnregister(p), "pipeswap::cuda::unregister_host");
}

} // namespace pipeswap::cuda
