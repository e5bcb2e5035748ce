// pipeswap — thread_comm: the Comm concept for N ranks that are threads of one process.
//
// A thread_world holds the mailboxes of `size` ranks; world.comm(r) is rank r's handle, used by one
// thread. Messages are host memory (reads_device_memory = false: a device buffer is staged through
// pinned host memory by the executor). A send completes when its receive is matched (rendezvous): the
// bytes are copied once, from the sender's buffer into the receiver's, under the world's lock, so a
// buffer freed or rewritten before its request completed is a bug that shows, and ThreadSanitizer
// sees every hand-over as ordered. abort() wakes every waiting rank at once.
//
// The world must outlive every comm and request made from it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/comm.hpp>

namespace pipeswap::exec {

class thread_comm;

/// The shared state of the ranks of one process.
class thread_world {
public:
  /// `size` ranks; throws invalid_argument unless size >= 1.
  explicit thread_world(int size) : size_(size) {
    if (size < 1) throw invalid_argument(pipeswap::detail::message({"thread_world: size must be >= 1, got ", size}));
  }
  thread_world(thread_world const&) = delete;
  thread_world& operator=(thread_world const&) = delete;

  [[nodiscard]] int size() const noexcept { return size_; }
  /// Rank r's handle; throws invalid_argument for a rank outside [0, size).
  [[nodiscard]] thread_comm comm(int rank);

  /// Whether some rank aborted, and why.
  [[nodiscard]] std::optional<std::string> aborted() const {
    std::lock_guard lk(m_);
    return abort_;
  }

private:
  friend class thread_comm;
  struct op {
    void* dst = nullptr;       // receive
    void const* src = nullptr; // send
    std::size_t bytes = 0;
    bool done = false;
    std::optional<std::string> failure;
  };
  using key = std::tuple<int, int, int>; // source, destination, tag

  int size_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<key, std::deque<std::shared_ptr<op>>> sends_, recvs_;
  std::optional<std::string> abort_;
};

/// One rank of a thread_world. Copyable handle; the world owns the state.
class thread_comm {
public:
  using comm_concept = comm_tag;
  static constexpr bool reads_device_memory = false;

  class request_type {
  public:
    request_type() = default;

  private:
    friend class thread_comm;
    explicit request_type(std::shared_ptr<thread_world::op> o) : op_(std::move(o)) {}
    std::shared_ptr<thread_world::op> op_;
  };

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return w_->size_; }
  [[nodiscard]] int max_tag() const noexcept { return 1 << 30; }

  request_type isend(void const* src, std::size_t n, int peer, int tag) {
    check(peer, tag, "isend");
    auto o = std::make_shared<thread_world::op>();
    o->src = src;
    o->bytes = n;
    std::lock_guard lk(w_->m_);
    throw_if_aborted();
    auto& q = w_->recvs_[{rank_, peer, tag}];
    if (!q.empty()) {
      auto r = q.front();
      q.pop_front();
      match(*o, *r, peer, tag);
      w_->cv_.notify_all();
    } else {
      w_->sends_[{rank_, peer, tag}].push_back(o);
    }
    return request_type(std::move(o));
  }

  request_type irecv(void* dst, std::size_t n, int peer, int tag) {
    check(peer, tag, "irecv");
    auto o = std::make_shared<thread_world::op>();
    o->dst = dst;
    o->bytes = n;
    std::lock_guard lk(w_->m_);
    throw_if_aborted();
    auto& q = w_->sends_[{peer, rank_, tag}];
    if (!q.empty()) {
      auto s = q.front();
      q.pop_front();
      match(*s, *o, rank_, tag);
      w_->cv_.notify_all();
    } else {
      w_->recvs_[{peer, rank_, tag}].push_back(o);
    }
    return request_type(std::move(o));
  }

  bool test(request_type& r) {
    std::lock_guard lk(w_->m_);
    return settled(r);
  }

  bool wait_for(request_type& r, std::chrono::milliseconds t) {
    std::unique_lock lk(w_->m_);
    auto const deadline = std::chrono::steady_clock::now() + t;
    while (!settled(r)) {
      if (w_->cv_.wait_until(lk, deadline) == std::cv_status::timeout) return settled(r);
    }
    return true;
  }

  void abort(std::string_view why) {
    std::lock_guard lk(w_->m_);
    if (!w_->abort_) w_->abort_ = std::string(why);
    w_->cv_.notify_all();
  }

private:
  friend class thread_world;
  thread_comm(thread_world& w, int rank) : w_(&w), rank_(rank) {}

  void check(int peer, int tag, char const* what) const {
    if (peer < 0 || peer >= w_->size_ || peer == rank_) {
      throw comm_error(
          pipeswap::detail::message({"thread_comm rank ", rank_, ": ", what, " to peer ", peer, " (ranks are 0..",
                                     w_->size_ - 1, ", and a rank does not message itself)"}));
    }
    if (tag < 0 || tag > max_tag()) {
      throw comm_error(pipeswap::detail::message(
          {"thread_comm rank ", rank_, ": ", what, " with tag ", tag, " outside 0..", max_tag()}));
    }
  }

  void throw_if_aborted() const {
    if (w_->abort_) throw comm_aborted(*w_->abort_);
  }

  // Called with the lock held. `to` names the receiving rank for the size-mismatch message.
  static void match(thread_world::op& s, thread_world::op& r, int to, int tag) {
    if (s.bytes != r.bytes) {
      auto const what = pipeswap::detail::message({"thread_comm: a send of ", s.bytes, " bytes to rank ", to,
                                                   " with tag ", tag, " met a receive of ", r.bytes, " bytes"});
      s.failure = r.failure = what;
    } else if (s.bytes) {
      std::memcpy(r.dst, s.src, s.bytes);
    }
    s.done = r.done = true;
  }

  // Called with the lock held.
  bool settled(request_type& r) const {
    if (!r.op_) throw comm_error("thread_comm: test or wait on a request that was never posted");
    throw_if_aborted();
    if (r.op_->done && r.op_->failure) throw comm_error(*r.op_->failure);
    return r.op_->done;
  }

  thread_world* w_;
  int rank_;
};

inline thread_comm thread_world::comm(int rank) {
  if (rank < 0 || rank >= size_) {
    throw invalid_argument(pipeswap::detail::message({"thread_world: rank ", rank, " outside 0..", size_ - 1}));
  }
  return thread_comm(*this, rank);
}

static_assert(comm<thread_comm>);

} // namespace pipeswap::exec
