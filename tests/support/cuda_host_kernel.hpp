// Host math as a kernel on a CUDA stream, for the test models whose kernels are host code (the
// pipeline example's MLP stage): the bytes a body reads and writes are copied into pinned host
// staging (cudaMemcpyAsync, device to host), the body runs over the staging in a host function on the
// stream (cudaLaunchHostFunc), and the bytes it wrote are copied back (host to device). All three are
// enqueued at once on the stream, so the body runs after the stream's earlier work and the stream's
// later work sees its writes: it orders like any kernel, and the runtimes' events order it against the
// copy streams. Written regions are copied in as well, since a body may accumulate into them.
//
// A body may touch only the regions it declares (the rule of mock::kernel_desc): reading or writing
// other bytes aborts with the offending range, because a host function cannot throw. A launch's
// staging goes back to a pool once an event behind its copies completed, checked at every launch
// (page-locking memory costs far more than these kernels); the pool lives as long as the process. A
// launch that fails to enqueue waits its stream, then gives its staging back, and rethrows.
// Only for executables that link libcudart (tests/cuda/).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include <pipeswap/backend/cuda.hpp>
#include <pipeswap/backend/mock/types.hpp>

namespace pipeswap::test {

class cuda_host_kernels {
public:
  /// What a body sees: read<T>(p, n) and write<T>(p, n), as mock::kernel_context, over the staging.
  class view {
  public:
    template <class T>
    [[nodiscard]] std::span<T const> read(device_ptr p, std::size_t n) const {
      return {reinterpret_cast<T const*>(find(p, n * sizeof(T), false)), n};
    }
    template <class T>
    [[nodiscard]] std::span<T> write(device_ptr p, std::size_t n) const {
      return {reinterpret_cast<T*>(find(p, n * sizeof(T), true)), n};
    }

  private:
    friend class cuda_host_kernels;
    struct placed {
      mock::region r;
      std::size_t offset;
      bool writable;
    };
    std::byte* find(device_ptr p, std::size_t bytes, bool write) const {
      auto const* a = p.get<std::byte const>();
      for (auto const& x : regions) {
        auto const* lo = x.r.ptr.get<std::byte const>();
        if (a >= lo && a + bytes <= lo + x.r.bytes && (x.writable || !write))
          return staging + x.offset + static_cast<std::size_t>(a - lo);
      }
      std::fprintf(stderr, "cuda_host_kernels: a host kernel %s %zu undeclared bytes at %p\n",
                   write ? "writes" : "reads", bytes, static_cast<void const*>(a));
      std::abort();
    }
    std::vector<placed> regions;
    std::byte* staging = nullptr;
  };

  /// Enqueues `body(view)` on stream `s` of `b` as one kernel over `reads` and `writes`.
  template <class F>
  static void run(cuda::backend& b, cuda::stream_ref s, std::vector<mock::region> reads,
                  std::vector<mock::region> writes, F body) {
    reap();
    cuda::device_guard const g(b.device());
    auto job = std::make_unique<launch<F>>(std::move(body));
    std::size_t total = 0;
    for (auto const& r : reads) job->v.regions.push_back({r, std::exchange(total, total + round(r.bytes)), false});
    for (auto const& r : writes) job->v.regions.push_back({r, std::exchange(total, total + round(r.bytes)), true});
    job->bytes = total == 0 ? 256 : total;
    job->v.staging = take(job->bytes);
    cudaEvent_t done = nullptr;
    try {
      for (auto const& x : job->v.regions) {
        if (x.r.bytes == 0) continue;
        PIPESWAP_CUDA_TRY(
            cudaMemcpyAsync(job->v.staging + x.offset, x.r.ptr.get(), x.r.bytes, cudaMemcpyDeviceToHost, s.get()));
      }
      PIPESWAP_CUDA_TRY(cudaLaunchHostFunc(s.get(), &launch<F>::call, job.get()));
      for (auto const& x : job->v.regions) {
        if (!x.writable || x.r.bytes == 0) continue;
        PIPESWAP_CUDA_TRY(
            cudaMemcpyAsync(x.r.ptr.get(), job->v.staging + x.offset, x.r.bytes, cudaMemcpyHostToDevice, s.get()));
      }
      PIPESWAP_CUDA_TRY(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      PIPESWAP_CUDA_TRY(cudaEventRecord(done, s.get()));
    } catch (...) {
      // What was enqueued before the failure may still copy into the staging or call the body with
      // the job: both stay until the stream has run it. The stream's own error, if any, is not the
      // one reported.
      cudaStreamSynchronize(s.get());
      if (done != nullptr) cudaEventDestroy(done);
      give_back(job->bytes, job->v.staging);
      throw;
    }
    std::lock_guard lk(pending_mutex());
    pending().push_back({done, std::move(job)});
  }

private:
  struct job_base {
    view v;
    std::size_t bytes = 0;
    virtual ~job_base() = default;
  };
  template <class F>
  struct launch : job_base {
    explicit launch(F f) : body(std::move(f)) {}
    static void CUDART_CB call(void* self) {
      auto* j = static_cast<launch*>(self);
      j->body(std::as_const(j->v));
    }
    F body;
  };
  struct in_flight {
    cudaEvent_t done;
    std::unique_ptr<job_base> job;
  };

  static std::size_t round(std::size_t n) { return (n + 255) / 256 * 256; }
  static std::mutex& pending_mutex() {
    static std::mutex m;
    return m;
  }
  static std::deque<in_flight>& pending() {
    static std::deque<in_flight> d;
    return d;
  }
  /// Pinned blocks not in use, by size.
  static std::multimap<std::size_t, std::byte*>& pool() {
    static std::multimap<std::size_t, std::byte*> m;
    return m;
  }
  /// The smallest pooled block of at least n bytes, or a new one.
  static std::byte* take(std::size_t n) {
    {
      std::lock_guard lk(pending_mutex());
      if (auto it = pool().lower_bound(n); it != pool().end()) {
        auto* p = it->second;
        pool().erase(it);
        return p;
      }
    }
    void* host = nullptr;
    PIPESWAP_CUDA_TRY(cudaMallocHost(&host, n));
    return static_cast<std::byte*>(host);
  }
  /// Returns a staging block to the pool.
  static void give_back(std::size_t n, std::byte* p) {
    std::lock_guard lk(pending_mutex());
    pool().emplace(n, p);
  }
  /// Returns the staging of the launches that completed to the pool.
  static void reap() {
    std::lock_guard lk(pending_mutex());
    auto& d = pending();
    for (auto it = d.begin(); it != d.end();) {
      cudaError_t const e = cudaEventQuery(it->done);
      if (e == cudaErrorNotReady) {
        ++it;
        continue;
      }
      PIPESWAP_CUDA_TRY(e);
      cudaEventDestroy(it->done);
      pool().emplace(it->job->bytes, it->job->v.staging);
      it = d.erase(it);
    }
  }
};

} // namespace pipeswap::test
