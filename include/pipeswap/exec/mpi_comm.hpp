// pipeswap — mpi_comm: the Comm concept over MPI (Open MPI 4.1 is what CI runs).
//
// Available when <mpi.h> is on the include path (PIPESWAP_HAS_MPI is then 1); build with Meson's
// dependency('mpi', language: 'cpp'). Messages are host memory (reads_device_memory = false): the
// executor stages device buffers through pinned host memory, so the mock and any backend work.
//
// mpi_comm works on its own duplicate of the communicator it is given (so its tags never meet the
// application's) with MPI_ERRORS_RETURN, so MPI failures become comm_error instead of killing the
// job. One tag, the communicator's largest, is reserved for abort notices: max_tag() is one less.
//
// abort(why) sends `why` to every other rank; each rank's next test or wait_for throws comm_aborted
// with it. A process that cannot continue should then end the job with mpi_session::abort_job(),
// which calls MPI_Abort after a short grace period, so that no rank is left waiting in
// MPI_Finalize. The calling thread must be the one that initialized MPI (MPI_THREAD_SINGLE suffices).
#pragma once

// A build can force the answer with -DPIPESWAP_HAS_MPI=0 (or 1).
#ifndef PIPESWAP_HAS_MPI
#  if defined(__has_include)
#    if __has_include(<mpi.h>)
#      define PIPESWAP_HAS_MPI 1
#    else
#      define PIPESWAP_HAS_MPI 0
#    endif
#  else
#    define PIPESWAP_HAS_MPI 0
#  endif
#endif

#if PIPESWAP_HAS_MPI

#  ifndef OMPI_SKIP_MPICXX
#    define OMPI_SKIP_MPICXX 1 // the C API only: no deprecated C++ bindings
#  endif
#  ifndef MPICH_SKIP_MPICXX
#    define MPICH_SKIP_MPICXX 1
#  endif
#  include <mpi.h>

#  include <chrono>
#  include <climits>
#  include <cstdlib>
#  include <optional>
#  include <cstddef>
#  include <string>
#  include <string_view>
#  include <thread>
#  include <vector>

#  include <pipeswap/detail/message.hpp>
#  include <pipeswap/error.hpp>
#  include <pipeswap/exec/comm.hpp>

namespace pipeswap::exec {

namespace detail {
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return pipeswap::detail::message({"MPI error ", code});
  return std::string(text, static_cast<std::size_t>(len));
}
} // namespace detail

/// MPI_Init / MPI_Finalize for the lifetime of the object (when MPI was not initialized already).
class mpi_session {
public:
  mpi_session(int* argc, char*** argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      if (int rc = MPI_Init(argc, argv); rc != MPI_SUCCESS) {
        throw comm_error("MPI_Init failed: " + detail::mpi_error_text(rc));
      }
      owner_ = true;
    }
  }
  mpi_session(mpi_session const&) = delete;
  mpi_session& operator=(mpi_session const&) = delete;
  ~mpi_session() {
    if (!owner_) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
  /// Ends the whole job with `code` after `grace` (so abort notices and messages get out). Does not
  /// return.
  [[noreturn]] static void abort_job(int code, std::chrono::milliseconds grace = std::chrono::milliseconds(500)) {
    std::this_thread::sleep_for(grace);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();
  }

private:
  bool owner_ = false;
};

class mpi_comm {
public:
  using comm_concept = comm_tag;
  static constexpr bool reads_device_memory = false;

  class request_type {
  public:
    request_type() = default;
    request_type(request_type&& o) noexcept { *this = std::move(o); }
    request_type& operator=(request_type&& o) noexcept {
      r_ = o.r_;
      done_ = o.done_;
      recv_ = o.recv_;
      bytes_ = o.bytes_;
      peer_ = o.peer_;
      tag_ = o.tag_;
      o.r_ = MPI_REQUEST_NULL;
      return *this;
    }
    ~request_type() {
      // A request still in flight is cancelled (a receive) or left to complete (a send) so that
      // MPI never writes into memory its owner already freed.
      if (r_ != MPI_REQUEST_NULL) {
        if (recv_) MPI_Cancel(&r_);
        MPI_Request_free(&r_);
      }
    }

  private:
    friend class mpi_comm;
    MPI_Request r_ = MPI_REQUEST_NULL;
    bool done_ = false, recv_ = false;
    std::size_t bytes_ = 0;
    int peer_ = 0, tag_ = 0;
  };

  /// Works on a duplicate of `parent` (MPI_COMM_WORLD by default). MPI must be initialized.
  explicit mpi_comm(MPI_Comm parent = MPI_COMM_WORLD) {
    check(MPI_Comm_dup(parent, &c_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(c_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c_, &rank_);
    MPI_Comm_size(c_, &size_);
    void* v = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(c_, MPI_TAG_UB, &v, &flag);
    ctrl_tag_ = flag ? *static_cast<int*>(v) : 32767;
  }
  mpi_comm(mpi_comm const&) = delete;
  mpi_comm& operator=(mpi_comm const&) = delete;
  ~mpi_comm() {
    for (auto& r : notices_) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    if (c_ != MPI_COMM_NULL) MPI_Comm_free(&c_);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int max_tag() const noexcept { return ctrl_tag_ - 1; }

  request_type isend(void const* src, std::size_t n, int peer, int tag) {
    auto r = prepare(n, peer, tag, false, "isend");
    check(MPI_Isend(src, static_cast<int>(n), MPI_BYTE, peer, tag, c_, &r.r_), "MPI_Isend");
    return r;
  }

  request_type irecv(void* dst, std::size_t n, int peer, int tag) {
    auto r = prepare(n, peer, tag, true, "irecv");
    check(MPI_Irecv(dst, static_cast<int>(n), MPI_BYTE, peer, tag, c_, &r.r_), "MPI_Irecv");
    return r;
  }

  bool test(request_type& r) {
    poll_abort();
    if (r.done_) return true;
    if (r.r_ == MPI_REQUEST_NULL) throw comm_error("mpi_comm: test or wait on a request that was never posted");
    int flag = 0;
    MPI_Status st;
    int const rc = MPI_Test(&r.r_, &flag, &st);
    if (rc != MPI_SUCCESS) {
      throw comm_error(pipeswap::detail::message({"mpi_comm rank ", rank_, ": ", (r.recv_ ? "receive of " : "send of "),
                                                  r.bytes_, " bytes ", (r.recv_ ? "from" : "to"), " rank ", r.peer_,
                                                  " with tag ", r.tag_, " failed: ", detail::mpi_error_text(rc)}));
    }
    if (!flag) return false;
    r.done_ = true;
    if (r.recv_) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      if (static_cast<std::size_t>(count) != r.bytes_) {
        throw comm_error(
            pipeswap::detail::message({"mpi_comm rank ", rank_, ": a receive of ", r.bytes_, " bytes from rank ",
                                       r.peer_, " with tag ", r.tag_, " got ", count, " bytes"}));
      }
    }
    return true;
  }

  bool wait_for(request_type& r, std::chrono::milliseconds t) {
    return detail::poll_for(t, [&] { return test(r); });
  }

  /// Tells every other rank `why` and waits up to a second for the notices to leave.
  void abort(std::string_view why) {
    if (aborted_) return;
    aborted_ = std::string(why);
    text_ = *aborted_;
    notices_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Isend(text_.data(), static_cast<int>(text_.size()), MPI_CHAR, p, ctrl_tag_, c_,
                &notices_[static_cast<std::size_t>(p)]);
    }
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (;;) {
      int all = 0;
      MPI_Testall(static_cast<int>(notices_.size()), notices_.data(), &all, MPI_STATUSES_IGNORE);
      if (all || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

private:
  static void check(int rc, char const* what) {
    if (rc != MPI_SUCCESS)
      throw comm_error(std::string("mpi_comm: ") + what + " failed: " + detail::mpi_error_text(rc));
  }

  request_type prepare(std::size_t n, int peer, int tag, bool recv, char const* what) {
    poll_abort();
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw comm_error(
          pipeswap::detail::message({"mpi_comm rank ", rank_, ": ", what, " to peer ", peer, " (ranks are 0..",
                                     size_ - 1, ", and a rank does not message itself)"}));
    }
    if (tag < 0 || tag > max_tag()) {
      throw comm_error(pipeswap::detail::message(
          {"mpi_comm rank ", rank_, ": ", what, " with tag ", tag, " outside 0..", max_tag()}));
    }
    if (n > static_cast<std::size_t>(INT_MAX)) {
      throw comm_error(pipeswap::detail::message(
          {"mpi_comm rank ", rank_, ": ", what, " of ", n, " bytes exceeds MPI's int count"}));
    }
    request_type r;
    r.recv_ = recv;
    r.bytes_ = n;
    r.peer_ = peer;
    r.tag_ = tag;
    return r;
  }

  void poll_abort() {
    if (aborted_) throw comm_aborted(*aborted_);
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, ctrl_tag_, c_, &flag, &st);
    if (!flag) return;
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    std::string why(static_cast<std::size_t>(count), '\0');
    MPI_Recv(why.data(), count, MPI_CHAR, st.MPI_SOURCE, ctrl_tag_, c_, MPI_STATUS_IGNORE);
    aborted_ = why;
    throw comm_aborted(why);
  }

  MPI_Comm c_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, ctrl_tag_ = 32767;
  std::optional<std::string> aborted_;
  std::string text_;
  std::vector<MPI_Request> notices_;
};

static_assert(comm<mpi_comm>);

} // namespace pipeswap::exec

#endif // PIPESWAP_HAS_MPI
