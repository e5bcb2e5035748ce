// pipeswap — the pipeline executor's boundary exchange: the activations and gradients that cross
// between ranks (exec/pipeline_executor.hpp).
//
// A boundary that leaves this rank waits in the outbox from its FWD or BWD until its SEND entry;
// every receive of the order is checked and posted before any entry runs (or, on a stream-ordered
// comm, at its RECV entry, into a device buffer allocated there). Three ways through the comm:
// - stream-ordered (the comm enqueues on the executor's send and receive streams): the send stream
//   waits the compute that wrote the boundary, the send and the buffer's release go out behind it;
// - a comm that reads device memory: the host waits the boundary's event, the buffer is released
//   once the send completed;
// - otherwise the boundary is staged through pinned host memory, D2H on the send stream before the
//   send, H2D on the receive stream after the receive; the staging memory is freed at the end of
//   the step, after its last copies.
// No wait is unbounded: await() throws comm_timeout past executor_options::wait_timeout. Not public
// API.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/comm.hpp>
#include <pipeswap/exec/executor_options.hpp>
#include <pipeswap/exec/stage.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>

namespace pipeswap::exec::detail {

/// A boundary buffer and the event its consumer waits first (none: ready now).
template <backend B>
struct ready_buffer {
  device_buffer<B> buf;
  std::optional<event_t<B>> ready;
};

/// Stream `s` waits the boundary's event, if it has one (a named ordering point).
template <backend B>
void wait_ready(B& b, stream_t<B> s, ready_buffer<B> const& r, pipeswap::detail::wait_site site) {
  if (r.ready) pipeswap::detail::wait_at(site, b, s, *r.ready);
}

template <backend B, comm C>
class boundary_exchange {
public:
  using index_type = schedule::index_type;
  using buffer = device_buffer<B>;
  using ready = ready_buffer<B>;
  using mkey = std::tuple<int, index_type, index_type>; // direction, stage, micro
  /// The comm enqueues its operations on the send and receive streams.
  static constexpr bool stream_ordered = stream_ordered_comm<C, stream_t<B>>;

  /// Creates the send and the receive stream. `check_tag`: the comm's largest tag is the schedule
  /// check's (exec/detail/schedule_check.hpp), not a boundary's. `o` must outlive the exchange.
  boundary_exchange(B& b, C& c, schedule::stage_layout layout, executor_options const& o, bool check_tag)
      : b_(b), c_(c), layout_(layout), o_(o), check_tag_(check_tag), send_(new_stream("p2p send")),
        recv_(new_stream("p2p recv")) {}

  [[nodiscard]] stream_t<B> send_stream() const noexcept { return send_; }
  [[nodiscard]] stream_t<B> recv_stream() const noexcept { return recv_; }
  /// True when the step staged boundaries through host memory (its last copies are still to wait).
  [[nodiscard]] bool staged() const noexcept { return !staging_.empty(); }

  device_pointer_t<B> alloc(std::size_t n, stream_t<B> s) {
    return n ? b_.allocate_device(n, s) : device_pointer_t<B>{};
  }
  void free_dev(buffer& d, stream_t<B> s) {
    if (d.bytes && d.ptr) b_.deallocate_device(d.ptr, d.bytes, s);
    d = {};
  }

  /// A boundary of this rank that a SEND entry of it takes later.
  void hold(mkey k, ready r) { outbox_[k] = r; }

  /// Every receive of the order: checked, and posted now unless the comm is stream-ordered (then
  /// each is posted at its RECV entry). `bytes(dir, stage)`: the size of the boundary a stage of this
  /// rank receives (it throws for a stage of another rank).
  template <class Bytes>
  void post_receives(schedule::order const& o, Bytes const& bytes) {
    for (auto const& e : o) {
      if (!e || (e->kind != schedule::step_kind::fwd_recv && e->kind != schedule::step_kind::bwd_recv)) continue;
      int const dir = e->kind == schedule::step_kind::fwd_recv ? 0 : 1;
      std::size_t const n = bytes(dir, e->stage);
      index_type const from = dir == 0 ? e->stage - 1 : e->stage + 1;
      if (!layout_.has_stage(from)) {
        throw invalid_argument(pipeswap::detail::message(
            {"pipeline_executor: rank ", c_.rank(), ": ", schedule::to_text(*e), " has no peer stage ", from}));
      }
      mkey const k{dir, e->stage, e->micro};
      if (posted_.count(k)) {
        throw invalid_argument(pipeswap::detail::message(
            {"pipeline_executor: rank ", c_.rank(), ": ", schedule::to_text(*e), " appears twice in the order"}));
      }
      posted_recv p;
      p.bytes = n;
      p.peer = layout_.rank_of(from);
      p.tag = tag_of(dir, e->stage, e->micro);
      if constexpr (stream_ordered) {
        // posted at its entry
      } else if constexpr (C::reads_device_memory) {
        p.dev = {alloc(p.bytes, b_.current_stream()), p.bytes};
        b_.synchronize(b_.record_event(b_.current_stream()));
        p.req = c_.irecv(raw_address(p.dev.ptr), p.bytes, p.peer, p.tag);
        p.posted = true;
      } else {
        p.host = p.bytes ? b_.allocate_host(p.bytes) : nullptr;
        staging_.push_back({p.host, p.bytes});
        pipeswap::detail::note_host_write(b_, p.host, p.bytes);
        p.req = c_.irecv(p.host, p.bytes, p.peer, p.tag);
        p.posted = true;
      }
      posted_.emplace(k, std::move(p));
    }
  }

  /// Waits `r` at most executor_options::wait_timeout; `at()` names where the step stands, `what`
  /// (a string, or a callable giving one, formatted only for the error) what it waits for.
  template <class What, class At>
  void await(request_t<C>& r, What const& what, At const& at) {
    if (!c_.wait_for(r, o_.wait_timeout)) {
      std::string text;
      if constexpr (std::is_invocable_v<What const&>)
        text = what();
      else
        text = what;
      throw comm_timeout(pipeswap::detail::message(
          {"rank ", c_.rank(), " waited ", o_.wait_timeout.count(), " ms at ", at(), " for ", text}));
    }
  }

  /// The SEND entry `e` (direction `dir`) sends the boundary its FWD or BWD left in the outbox.
  template <class At>
  void send(schedule::step const& e, int dir, step_stats& stats, At const& at) {
    auto it = outbox_.find({dir, e.stage, e.micro});
    if (it == outbox_.end()) {
      throw invalid_argument("pipeline_executor: " + where(at) + ": nothing to send (its " + (dir ? "BWD" : "FWD") +
                             " did not run on this rank first)");
    }
    auto r = it->second;
    outbox_.erase(it);
    index_type const to = dir == 0 ? e.stage + 1 : e.stage - 1;
    pending_send p;
    p.bytes = r.buf.bytes;
    p.peer = layout_.rank_of(to);
    p.tag = tag_of(dir, to, e.micro);
    p.entry = e;
    if constexpr (stream_ordered) {
      // The send stream waits the compute that wrote the boundary; the send and the buffer's
      // release go out behind it, stream-ordered (the host never waits).
      wait_ready(b_, send_, r, pipeswap::detail::wait_site::exec_send_after_compute);
      p.req = c_.isend(raw_address(r.buf.ptr), p.bytes, p.peer, p.tag, send_);
      free_dev(r.buf, send_);
    } else if constexpr (C::reads_device_memory) {
      if (r.ready) b_.synchronize(*r.ready);
      p.dev = r.buf;
      p.req = c_.isend(raw_address(p.dev.ptr), p.bytes, p.peer, p.tag);
    } else {
      p.host = p.bytes ? b_.allocate_host(p.bytes) : nullptr;
      staging_.push_back({p.host, p.bytes});
      wait_ready(b_, send_, r, pipeswap::detail::wait_site::exec_send_after_compute);
      if (p.bytes) b_.copy_d2h(p.host, r.buf.ptr, p.bytes, send_);
      auto const copied = b_.record_event(send_);
      free_dev(r.buf, send_);
      b_.synchronize(copied);
      pipeswap::detail::note_host_read(b_, p.host, p.bytes);
      p.req = c_.isend(p.host, p.bytes, p.peer, p.tag);
    }
    ++stats.sends;
    stats.bytes_sent += p.bytes;
    sends_.push_back(std::move(p));
  }

  /// The RECV entry `e` (direction `dir`): the received boundary, or none when its message has not
  /// arrived (non-blocking only).
  template <class At>
  std::optional<ready> receive(schedule::step const& e, int dir, bool blocking, step_stats& stats, At const& at) {
    auto it = posted_.find({dir, e.stage, e.micro});
    if (it == posted_.end()) throw state_error("pipeline_executor: " + where(at) + ": received twice");
    auto& p = it->second;
    if constexpr (stream_ordered) {
      if (!p.posted) { // posted at its entry, into a device buffer allocated on the receive stream
        p.dev = {alloc(p.bytes, recv_), p.bytes};
        p.req = c_.irecv(raw_address(p.dev.ptr), p.bytes, p.peer, p.tag, recv_);
        p.posted = true;
      }
    }
    if (blocking) {
      await(
          p.req,
          [&] {
            return pipeswap::detail::message({p.bytes, " bytes from rank ", p.peer, " (tag ", p.tag, ")"});
          },
          at);
    } else if (!c_.test(p.req)) {
      return std::nullopt;
    }
    ready r;
    if constexpr (stream_ordered) {
      r.buf = p.dev;
      r.ready = b_.record_event(recv_);
    } else if constexpr (C::reads_device_memory) {
      r.buf = p.dev;
    } else {
      pipeswap::detail::note_host_write(b_, p.host, p.bytes); // the comm wrote these bytes
      r.buf = {alloc(p.bytes, recv_), p.bytes};
      if (p.bytes) b_.copy_h2d(r.buf.ptr, p.host, p.bytes, recv_);
      r.ready = b_.record_event(recv_);
    }
    if (o_.host_waits_receives && r.ready) b_.synchronize(*r.ready);
    ++stats.receives;
    stats.bytes_received += p.bytes;
    posted_.erase(it);
    return r;
  }

  /// Every send of the step completes (a device buffer a send read is released after it).
  template <class At>
  void finish_sends(At const& at) {
    for (auto& s : sends_) {
      await(
          s.req,
          [&] {
            return pipeswap::detail::message({"the send ", schedule::to_text(s.entry), " of ", s.bytes,
                                              " bytes to rank ", s.peer, " to complete (tag ", s.tag, ")"});
          },
          at);
      if constexpr (C::reads_device_memory) free_dev(s.dev, b_.current_stream());
    }
    sends_.clear();
  }

  /// Throws when boundaries are left at the end of the order; `others`: the executor's own leftovers
  /// (inputs, gradients and saved chunks not consumed).
  void check_drained(std::size_t others) const {
    auto const left = others + outbox_.size() + posted_.size();
    if (left) {
      throw invalid_argument(pipeswap::detail::message(
          {"pipeline_executor: rank ", c_.rank(), " ended its order with ", left,
           " boundaries or saved chunks not consumed (an unmatched send, receive, forward or backward)"}));
    }
  }

  void free_staging() {
    for (auto& [h, n] : staging_) {
      if (h) b_.deallocate_host(h, n);
    }
    staging_.clear();
  }

  /// After a failure: the device buffers of the outbox, of receives still posted and of sends, on
  /// `s`. Requests still posted belong to a comm that was aborted (or a step that threw before its
  /// waits): an aborted comm never completes them. The staging memory stays for free_staging().
  void release(stream_t<B> s) {
    for (auto& [_, r] : outbox_) free_dev(r.buf, s);
    outbox_.clear();
    for (auto& [_, p] : posted_) free_dev(p.dev, s);
    posted_.clear();
    for (auto& x : sends_) free_dev(x.dev, s);
    sends_.clear();
  }

private:
  struct posted_recv {
    request_t<C> req;
    bool posted = false;
    std::byte* host = nullptr; // staged
    buffer dev;                // direct
    std::size_t bytes = 0;
    int peer = 0, tag = 0;
  };
  struct pending_send {
    request_t<C> req;
    std::byte* host = nullptr; // staged
    buffer dev;                // direct: released after completion
    std::size_t bytes = 0;
    int peer = 0, tag = 0;
    schedule::step entry; ///< the SEND entry (a leaf), named only in a timeout's message
  };

  stream_t<B> new_stream(char const* name) {
    if constexpr (named_streams<B>)
      return b_.new_stream(std::string(name));
    else
      return b_.new_stream();
  }

  template <class At>
  std::string where(At const& at) const {
    return pipeswap::detail::message({"rank ", c_.rank(), ", ", at()});
  }

  int tag_of(int dir, index_type stage, index_type micro) const {
    auto const t = boundary_tag({dir, stage, micro}, layout_.stages());
    long long const most = check_tag_ ? c_.max_tag() - 1LL : c_.max_tag(); // the check's tag
    if (t > most) {
      throw invalid_argument(
          pipeswap::detail::message({"pipeline_executor: message tag ", t, " (stage ", stage, ", micro ", micro,
                                     ") exceeds the largest boundary tag ", most,
                                     (check_tag_ ? " (the comm's largest tag is the schedule check's)" : "")}));
    }
    return static_cast<int>(t);
  }

  B& b_;
  C& c_;
  schedule::stage_layout layout_;
  executor_options const& o_;
  bool check_tag_;
  stream_t<B> send_, recv_;
  std::map<mkey, ready> outbox_;
  std::map<mkey, posted_recv> posted_;
  std::vector<pending_send> sends_;
  std::vector<std::pair<std::byte*, std::size_t>> staging_;
};

} // namespace pipeswap::exec::detail
