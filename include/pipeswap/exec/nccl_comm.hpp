// pipeswap — nccl_comm: the Comm concept over NCCL point-to-point (ncclSend / ncclRecv).
//
// Available when <nccl.h> and the CUDA Toolkit's runtime header are on the include path
// (PIPESWAP_HAS_NCCL is then 1; link libnccl and libcudart). Buffers are device memory that NCCL
// reads and writes directly (reads_device_memory = true): the executor passes its device buffers
// without staging. Each request is a CUDA event recorded after the operation on a stream of its own
// (one per peer and direction, so a posted receive never holds up a send behind it); test() queries
// the event, and device_wait(r, stream) makes a compute stream wait it without blocking the host.
//
// What differs from the MPI and thread models, by NCCL's design:
//  * Matching. NCCL has no tags: the k-th send from rank a to rank b meets the k-th receive b posts
//    from a. The tag is checked locally (range) but not sent; a schedule must post, per pair of
//    ranks, its sends and the peer's receives in the same order (the executor posts receives in the
//    order the rank's order lists them, sends in the order of its SEND entries).
//  * Abort. abort() calls ncclCommAbort on this rank's communicator; NCCL carries no reason to the
//    peers, whose pending operations end in an asynchronous error (reported by test() as
//    comm_aborted) or at their executor's watchdog. Pair NCCL with an out-of-band channel (MPI, a
//    store) when every rank must learn the reason.
//
// Checked on a GPU only when the project's CI is lent one; elsewhere it is compiled (tests/exec).
#pragma once

#include <pipeswap/config.hpp>

#ifndef PIPESWAP_HAS_NCCL
#  if defined(__has_include)
#    if __has_include(<nccl.h>) && PIPESWAP_HAS_CTK
#      define PIPESWAP_HAS_NCCL 1
#    else
#      define PIPESWAP_HAS_NCCL 0
#    endif
#  else
#    define PIPESWAP_HAS_NCCL 0
#  endif
#endif

#if PIPESWAP_HAS_NCCL

#  include <cuda_runtime_api.h>
#  include <nccl.h>

#  include <chrono>
#  include <climits>
#  include <cstddef>
#  include <map>
#  include <optional>
#  include <string>
#  include <string_view>
#  include <utility>

#  include <pipeswap/detail/message.hpp>
#  include <pipeswap/exec/comm.hpp>

namespace pipeswap::exec {

class nccl_comm {
public:
  using comm_concept = comm_tag;
  static constexpr bool reads_device_memory = true;

  /// A posted operation: the event after it on its stream. Move-only.
  class request_type {
  public:
    request_type() = default;
    request_type(request_type&& o) noexcept : ev_(std::exchange(o.ev_, nullptr)), done_(o.done_) {}
    request_type& operator=(request_type&& o) noexcept {
      if (this != &o) {
        reset();
        ev_ = std::exchange(o.ev_, nullptr);
        done_ = o.done_;
      }
      return *this;
    }
    ~request_type() { reset(); }

  private:
    friend class nccl_comm;
    void reset() noexcept {
      if (ev_) cudaEventDestroy(ev_);
      ev_ = nullptr;
    }
    cudaEvent_t ev_ = nullptr;
    bool done_ = false;
  };

  /// Uses `c` (not owned; initialized by the caller with ncclCommInitRank) on the current device.
  explicit nccl_comm(ncclComm_t c) : c_(c) {
    check(ncclCommUserRank(c_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(c_, &size_), "ncclCommCount");
  }
  nccl_comm(nccl_comm const&) = delete;
  nccl_comm& operator=(nccl_comm const&) = delete;
  ~nccl_comm() {
    for (auto& [_, s] : streams_) cudaStreamDestroy(s);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int max_tag() const noexcept { return INT_MAX; }

  request_type isend(void const* src, std::size_t n, int peer, int tag) {
    auto const s = prepare(peer, tag, 0, "isend");
    check(ncclSend(src, n, ncclChar, peer, c_, s), "ncclSend");
    return record(s);
  }

  request_type irecv(void* dst, std::size_t n, int peer, int tag) {
    auto const s = prepare(peer, tag, 1, "irecv");
    check(ncclRecv(dst, n, ncclChar, peer, c_, s), "ncclRecv");
    return record(s);
  }

  bool test(request_type& r) {
    poll_abort();
    if (r.done_) return true;
    if (!r.ev_) throw comm_error("nccl_comm: test or wait on a request that was never posted");
    auto const rc = cudaEventQuery(r.ev_);
    if (rc == cudaErrorNotReady) return false;
    if (rc != cudaSuccess) throw comm_error(std::string("nccl_comm: cudaEventQuery: ") + cudaGetErrorString(rc));
    r.done_ = true;
    return true;
  }

  bool wait_for(request_type& r, std::chrono::milliseconds t) {
    return detail::poll_for(t, [&] { return test(r); });
  }

  /// Work enqueued on `s` after this call starts after the operation of `r` (no host wait).
  void device_wait(request_type const& r, cudaStream_t s) {
    if (r.ev_) check_cuda(cudaStreamWaitEvent(s, r.ev_, 0), "cudaStreamWaitEvent");
  }

  void abort(std::string_view why) {
    if (aborted_) return;
    aborted_ = std::string(why);
    ncclCommAbort(c_);
  }

private:
  static void check(ncclResult_t rc, char const* what) {
    if (rc != ncclSuccess) throw comm_error(std::string("nccl_comm: ") + what + ": " + ncclGetErrorString(rc));
  }
  static void check_cuda(cudaError_t rc, char const* what) {
    if (rc != cudaSuccess) throw comm_error(std::string("nccl_comm: ") + what + ": " + cudaGetErrorString(rc));
  }

  cudaStream_t prepare(int peer, int tag, int dir, char const* what) {
    poll_abort();
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw comm_error(
          pipeswap::detail::message({"nccl_comm rank ", rank_, ": ", what, " to peer ", peer, " (ranks are 0..",
                                     size_ - 1, ", and a rank does not message itself)"}));
    }
    if (tag < 0) throw comm_error(pipeswap::detail::message({"nccl_comm rank ", rank_, ": negative tag ", tag}));
    auto& s = streams_[{peer, dir}];
    if (!s) check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }

  request_type record(cudaStream_t s) {
    request_type r;
    check_cuda(cudaEventCreateWithFlags(&r.ev_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(r.ev_, s), "cudaEventRecord");
    return r;
  }

  void poll_abort() {
    if (aborted_) throw comm_aborted(*aborted_);
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(c_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      aborted_ = pipeswap::detail::message({"nccl_comm rank ", rank_, ": the communicator failed (",
                                            ncclGetErrorString(async), "), a peer aborted or died"});
      throw comm_aborted(*aborted_);
    }
  }

  ncclComm_t c_;
  int rank_ = 0, size_ = 1;
  std::map<std::pair<int, int>, cudaStream_t> streams_;
  std::optional<std::string> aborted_;
};

static_assert(comm<nccl_comm>);

} // namespace pipeswap::exec

#endif // PIPESWAP_HAS_NCCL
