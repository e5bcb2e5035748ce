// pipeswap — the pipeline executor: one rank's order of a pipeline schedule, driven over any Backend
// and any Comm, calling the engine's own stages.
//
// pipeline_executor<B, C, S> runs the entries of one rank's order (schedule/generate.hpp, with swap
// steps injected by schedule/inject.hpp or not) for one training step:
//
//   start    every receive of the order is posted at once (so no neighbour ever waits on a late
//            post), into pinned host staging memory when the comm cannot read device memory;
//   FWD      stages[s].forward() on the compute stream, with the input received or handed over by the
//            previous stage on this rank and an output buffer the executor owns; what it saves goes
//            into the group of activation_swap when SWAP_SET_GROUP of that chunk came first;
//   BWD      stages[s].backward() with the input, the incoming gradient, the saved activations at
//            their current addresses, and a gradient buffer for the previous stage;
//   *_SEND   the send stream waits the compute work that wrote the boundary, then (staged) copies it
//            to pinned memory, releases the device buffer behind the copy and posts the send;
//   *_RECV   waits the posted receive (a watchdog bounds the wait), copies it to the device on the
//            receive stream; the consumer waits that copy;
//   SWAP_*   activation_swap's life-cycle call for the chunk;
//   OVERLAP_B_F / OVERLAP_F_B  their leaves in order (only the FWD leaf in its group's scope);
//   end      every send completes, the host synchronizes the compute stream (the gradient-norm
//            reduction of mixed precision), then `finish` runs: the optimizer-swap runtime's step().
//
// Ordering rules the executor guarantees (docs/executor.md):
//  * a stage call sees its input and incoming gradient complete (stream waits, never host waits);
//  * a boundary leaves the device only after the forward or backward that wrote it, and its device
//    memory is released stream-ordered behind the copy that read it;
//  * every buffer the executor lends is released only behind the compute work that used it;
//  * receives are posted before any entry runs; sends are posted at their SEND entry, as soon as the
//    data is on the host; the executor never blocks on a send before the end of the step.
//
// Failures. Any exception inside run_step (a stage, the backend, the comm, an injected fault, a wait
// past the watchdog) becomes rank_failure naming the rank, the position and the entry; the executor
// aborts the comm with that message, so every other rank's next wait throws comm_aborted (rethrown
// as rank_failure naming where that rank stopped and why), and releases everything the step held.
// Nothing hangs: every wait is bounded by executor_options::wait_timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/comm.hpp>
#include <pipeswap/exec/stage.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>

namespace pipeswap::exec {

/// A rank's step failed (or stopped because another rank failed).
class rank_failure : public error {
public:
  rank_failure(std::string what, int rank, std::size_t position, std::string entry, bool aborted_by_peer)
      : error(std::move(what)), rank_(rank), position_(position), entry_(std::move(entry)),
        by_peer_(aborted_by_peer) {}
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Position in the order; order.size() for the optimizer step.
  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  [[nodiscard]] std::string const& entry() const noexcept { return entry_; }
  /// True when this rank stopped because another rank aborted the comm.
  [[nodiscard]] bool aborted_by_peer() const noexcept { return by_peer_; }

private:
  int rank_;
  std::size_t position_;
  std::string entry_;
  bool by_peer_;
};

/// The executor threw at an injected fault site (executor_options::fail_at).
class injected_fault : public error {
public:
  using error::error;
};

struct executor_options {
  /// Bound on every wait for a message; a wait past it fails the step with comm_timeout's message
  /// (which rank waited, at which entry, for what).
  std::chrono::milliseconds wait_timeout{60000};
  /// Injected fault site: run_step throws injected_fault before the entry at this position (the
  /// order's size: before the optimizer step).
  std::optional<std::size_t> fail_at;
  /// The host issues each compute entry (FWD, BWD, composite) only when the previous one finished on
  /// the device: one entry of lookahead, so the swap steps between two compute entries go out while
  /// the first runs, and allocations never run ahead of the offloads that free memory for them.
  /// Off: the host enqueues as fast as it can (peak memory then depends on host speed).
  bool host_paced = true;
};

/// What the last run_step did.
struct step_stats {
  std::size_t swapped_chunks = 0; ///< chunks whose activations went through activation_swap
  std::size_t sends = 0, receives = 0;
  std::size_t bytes_sent = 0, bytes_received = 0;
};

namespace detail {

/// The optimizer-swap runtime's step (or any callable): the one call the executor makes into it.
template <class F>
void finish_step(F& f) {
  if constexpr (std::is_invocable_v<F&>) f();
  else f.step();
}

template <class P>
void* raw_address(P p) {
  if constexpr (requires { p.template get<void>(); }) return p.template get<void>();
  else return reinterpret_cast<void*>(p);
}

} // namespace detail

template <backend B, comm C, class S>
  requires stage<S, B>
class pipeline_executor {
public:
  using index_type = schedule::index_type;
  using buffer = device_buffer<B>;

  /// `stages` maps each stage this rank runs to the engine's stage object (not owned). Throws
  /// invalid_argument when the layout's rank count is not the comm's size, or when `stages` misses a
  /// stage of this rank or holds one of another rank.
  pipeline_executor(transfer_engine<B>& x, C& c, schedule::stage_layout layout, std::map<index_type, S*> stages,
                    executor_options o = {})
      : b_(x.backend()), c_(c), layout_(layout), stages_(std::move(stages)), o_(o), acts_(x),
        send_(b_.new_stream()), recv_(b_.new_stream()) {
    if (layout_.ranks() != c_.size()) {
      throw invalid_argument("pipeline_executor: the layout has " + std::to_string(layout_.ranks()) +
                             " ranks, the comm " + std::to_string(c_.size()));
    }
    for (index_type s = 0; s < layout_.stages(); ++s) {
      bool const mine = layout_.rank_of(s) == c_.rank();
      auto it = stages_.find(s);
      if (mine && (it == stages_.end() || !it->second)) {
        throw invalid_argument("pipeline_executor: rank " + std::to_string(c_.rank()) + " runs stage " +
                               std::to_string(s) + " but was given no stage object for it");
      }
      if (!mine && it != stages_.end()) {
        throw invalid_argument("pipeline_executor: stage " + std::to_string(s) + " runs on rank " +
                               std::to_string(layout_.rank_of(s)) + ", not on rank " + std::to_string(c_.rank()));
      }
    }
    if (stages_.size() != static_cast<std::size_t>(layout_.chunks()) || (!stages_.empty() && stages_.rbegin()->first >= layout_.stages())) {
      throw invalid_argument("pipeline_executor: rank " + std::to_string(c_.rank()) + " was given " +
                             std::to_string(stages_.size()) + " stages for " + std::to_string(layout_.chunks()) +
                             " chunks of the layout");
    }
  }

  pipeline_executor(pipeline_executor const&) = delete;
  pipeline_executor& operator=(pipeline_executor const&) = delete;
  ~pipeline_executor() {
    try {
      release_all();
    } catch (...) {
    }
  }

  [[nodiscard]] activation_swap<B>& activations() noexcept { return acts_; }
  [[nodiscard]] step_stats const& last_stats() const noexcept { return stats_; }
  [[nodiscard]] int rank() const { return c_.rank(); }

  /// Runs one training step of this rank's order `o`, then `finish()` (a callable, or an object with
  /// step(): the optimizer-swap runtime). Throws rank_failure (see the header comment).
  template <class Finish>
  void run_step(schedule::order const& o, Finish&& finish) {
    if (o_.fail_at && *o_.fail_at > o.size()) {
      throw invalid_argument("pipeline_executor: fail_at " + std::to_string(*o_.fail_at) + " is past the order's " +
                             std::to_string(o.size()) + " entries and its optimizer step");
    }
    pc_ = 0;
    size_ = o.size();
    last_compute_.reset();
    current_ = "posting receives";
    stats_ = {};
    try {
      acts_.begin_run();
      for (auto& [s, st] : stages_) {
        if constexpr (stage_with_begin<S, B>) st->begin_step(b_, b_.current_stream());
      }
      post_receives(o);
      for (pc_ = 0; pc_ < o.size(); ++pc_) {
        current_ = o[pc_] ? schedule::to_text(*o[pc_]) : std::string("bubble");
        fault_site();
        if (o[pc_]) run(*o[pc_]);
      }
      current_ = "end of step";
      finish_sends();
      check_drained();
      current_ = "optimizer step";
      fault_site();
      b_.synchronize(b_.record_event(b_.current_stream())); // the gradient-norm reduction point
      detail::finish_step(finish);
      b_.synchronize_device();
      free_staging();
      acts_.end_run();
    } catch (comm_aborted const& e) {
      auto const pos = pc_;
      auto const entry = current_;
      cleanup();
      throw rank_failure("rank " + std::to_string(c_.rank()) + " stopped at " + place(pos, entry) + ": " + e.what(),
                         c_.rank(), pos, entry, true);
    } catch (std::exception const& e) {
      auto const pos = pc_;
      auto const entry = current_;
      std::string const msg = "rank " + std::to_string(c_.rank()) + " failed at " + place(pos, entry) + ": " + e.what();
      try {
        c_.abort(msg);
      } catch (...) {
      }
      cleanup();
      throw rank_failure(msg, c_.rank(), pos, entry, false);
    }
  }

private:
  struct ready_buffer {
    buffer buf;
    std::optional<event_t<B>> ready;
  };
  struct saved_chunk {
    bool swapped = false;
    buffer input;
    std::vector<activation_handle> handles; // swapped
    std::vector<std::size_t> bytes;         // swapped
    std::vector<buffer> raw;                // not swapped
  };
  struct posted_recv {
    request_t<C> req;
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
    std::string entry;
  };
  using key = std::pair<index_type, index_type>;        // stage, micro
  using mkey = std::tuple<int, index_type, index_type>; // direction, stage, micro

  static std::string place(std::size_t pos, std::string const& entry) {
    if (entry == "posting receives" || entry == "end of step" || entry == "optimizer step") return entry;
    return "position " + std::to_string(pos) + " (" + entry + ")";
  }
  std::string where() const { return "rank " + std::to_string(c_.rank()) + ", " + place(pc_, current_); }

  void fault_site() {
    if (!o_.fail_at) return;
    auto const at = current_ == "optimizer step" ? size_ : pc_;
    if (*o_.fail_at == at && (current_ != "end of step")) {
      throw injected_fault("injected fault at " + place(pc_, current_));
    }
  }

  S& stage_of(index_type s) const {
    auto it = stages_.find(s);
    if (it == stages_.end()) {
      throw invalid_argument("pipeline_executor: " + where() + ": stage " + std::to_string(s) +
                             (layout_.has_stage(s) ? " runs on rank " + std::to_string(layout_.rank_of(s))
                                                   : std::string(" is outside the layout")));
    }
    return *it->second;
  }
  bool local(index_type s) const { return stages_.count(s) != 0; }
  bool last(index_type s) const { return s + 1 == layout_.stages(); }

  int tag_of(int dir, index_type stage, index_type micro) const {
    auto const t = (static_cast<long long>(micro) * layout_.stages() + stage) * 2 + dir;
    if (t > c_.max_tag()) {
      throw invalid_argument("pipeline_executor: message tag " + std::to_string(t) + " (stage " +
                             std::to_string(stage) + ", micro " + std::to_string(micro) +
                             ") exceeds the comm's largest tag " + std::to_string(c_.max_tag()));
    }
    return static_cast<int>(t);
  }

  device_pointer_t<B> alloc(std::size_t n, stream_t<B> s) { return n ? b_.allocate_device(n, s) : device_pointer_t<B>{}; }
  void free_dev(buffer& d, stream_t<B> s) {
    if (d.bytes && d.ptr) b_.deallocate_device(d.ptr, d.bytes, s);
    d = {};
  }

  void post_receives(schedule::order const& o) {
    for (auto const& e : o) {
      if (!e || (e->kind != schedule::step_kind::fwd_recv && e->kind != schedule::step_kind::bwd_recv)) continue;
      int const dir = e->kind == schedule::step_kind::fwd_recv ? 0 : 1;
      auto& st = stage_of(e->stage);
      index_type const from = dir == 0 ? e->stage - 1 : e->stage + 1;
      if (!layout_.has_stage(from)) {
        throw invalid_argument("pipeline_executor: rank " + std::to_string(c_.rank()) + ": " +
                               schedule::to_text(*e) + " has no peer stage " + std::to_string(from));
      }
      mkey const k{dir, e->stage, e->micro};
      if (posted_.count(k)) {
        throw invalid_argument("pipeline_executor: rank " + std::to_string(c_.rank()) + ": " +
                               schedule::to_text(*e) + " appears twice in the order");
      }
      posted_recv p;
      p.bytes = dir == 0 ? st.input_bytes() : st.output_bytes();
      p.peer = layout_.rank_of(from);
      p.tag = tag_of(dir, e->stage, e->micro);
      if constexpr (C::reads_device_memory) {
        p.dev = {alloc(p.bytes, b_.current_stream()), p.bytes};
        b_.synchronize(b_.record_event(b_.current_stream()));
        p.req = c_.irecv(detail::raw_address(p.dev.ptr), p.bytes, p.peer, p.tag);
      } else {
        p.host = p.bytes ? b_.allocate_host(p.bytes) : nullptr;
        staging_.push_back({p.host, p.bytes});
        pipeswap::detail::note_host_write(b_, p.host, p.bytes);
        p.req = c_.irecv(p.host, p.bytes, p.peer, p.tag);
      }
      posted_.emplace(k, std::move(p));
    }
  }

  void await(request_t<C>& r, std::string const& what) {
    if (!c_.wait_for(r, o_.wait_timeout)) {
      throw comm_timeout("rank " + std::to_string(c_.rank()) + " waited " + std::to_string(o_.wait_timeout.count()) +
                         " ms at " + place(pc_, current_) + " for " + what);
    }
  }

  void run(schedule::step const& e) {
    using schedule::step_kind;
    switch (e.kind) {
    case step_kind::fwd:
    case step_kind::bwd:
    case step_kind::overlap_f_b:
    case step_kind::overlap_b_f:
      if (o_.host_paced && last_compute_) b_.synchronize(*last_compute_);
      if (e.kind == step_kind::fwd) {
        forward(e);
      } else if (e.kind == step_kind::bwd) {
        backward(e);
      } else {
        for (auto const& l : e.sub) {
          if (l.kind == step_kind::fwd) forward(l);
          else if (l.kind == step_kind::bwd) backward(l);
          else throw invalid_argument("pipeline_executor: " + where() + ": a composite may hold only FWD and BWD");
        }
      }
      last_compute_ = b_.record_event(b_.current_stream());
      return;
    case step_kind::fwd_send: send(e, 0); return;
    case step_kind::bwd_send: send(e, 1); return;
    case step_kind::fwd_recv: receive(e, 0); return;
    case step_kind::bwd_recv: receive(e, 1); return;
    case step_kind::swap_set_group: group_ = chunk_id{e.stage, e.micro}; return;
    case step_kind::swap_launch_offload: acts_.launch_offload({e.stage, e.micro}); return;
    case step_kind::swap_wait_offload: acts_.wait_offload({e.stage, e.micro}); return;
    case step_kind::swap_launch_load: acts_.launch_load({e.stage, e.micro}); return;
    case step_kind::swap_wait_load: acts_.wait_load({e.stage, e.micro}); return;
    default:
      throw invalid_argument("pipeline_executor: " + where() + ": the executor does not run " +
                             std::string(schedule::step_kind_name(e.kind)) + " steps");
    }
  }

  void wait_ready(stream_t<B> s, ready_buffer const& r, pipeswap::detail::wait_site site) {
    if (r.ready) pipeswap::detail::wait_at(site, b_, s, *r.ready);
  }

  void forward(schedule::step const& e) {
    auto& st = stage_of(e.stage);
    auto const cs = b_.current_stream();
    key const k{e.stage, e.micro};
    if (saved_.count(k)) throw invalid_argument("pipeline_executor: " + where() + ": this forward already ran");
    bool const swapped = group_ && group_->stage == e.stage && group_->micro == e.micro;
    buffer in{};
    if (e.stage > 0) {
      auto it = inputs_.find(k);
      if (it == inputs_.end()) {
        throw invalid_argument("pipeline_executor: " + where() +
                               ": no input (the FWD_RECV or the previous stage's FWD did not come first)");
      }
      auto const r = it->second;
      inputs_.erase(it);
      in = r.buf;
      saved_[k].input = in; // owned by the chunk from here, also if the stage throws
      wait_ready(cs, r, pipeswap::detail::wait_site::exec_use_after_receive);
    }
    auto& sc = saved_[k];
    sc.swapped = swapped;
    buffer out{};
    if (!last(e.stage)) out = {alloc(st.output_bytes(), cs), st.output_bytes()};
    forward_args<B> f{b_, cs, e.stage, e.micro, in, out, [&](device_pointer_t<B> p, std::size_t n) {
                        if (sc.swapped) {
                          sc.handles.push_back(acts_.save(p, n));
                          sc.bytes.push_back(n);
                        } else {
                          sc.raw.push_back({p, n});
                        }
                      }};
    try {
      if (swapped) {
        group_.reset();
        auto const scope = acts_.forward({e.stage, e.micro});
        ++stats_.swapped_chunks;
        st.forward(f);
      } else {
        st.forward(f);
      }
    } catch (...) {
      free_dev(out, cs);
      throw;
    }
    if (!last(e.stage)) hand_over(0, e.stage, e.micro, out);
  }

  void hand_over(int dir, index_type st, index_type m, buffer out) {
    auto const next = dir == 0 ? st + 1 : st - 1;
    ready_buffer r{out, b_.record_event(b_.current_stream())};
    if (local(next)) (dir == 0 ? inputs_ : grads_in_)[{next, m}] = r;
    else outbox_[{dir, st, m}] = r;
  }

  void backward(schedule::step const& e) {
    auto& st = stage_of(e.stage);
    auto const cs = b_.current_stream();
    key const k{e.stage, e.micro};
    auto it = saved_.find(k);
    if (it == saved_.end()) throw invalid_argument("pipeline_executor: " + where() + ": its forward did not run");
    auto& sc = it->second;
    std::vector<buffer> bufs; // first: a group that was not loaded fails before anything moves
    if (sc.swapped) {
      for (std::size_t i = 0; i < sc.handles.size(); ++i) bufs.push_back({acts_.ptr(sc.handles[i]), sc.bytes[i]});
    } else {
      bufs = sc.raw;
    }
    std::optional<ready_buffer> gin;
    if (!last(e.stage)) {
      auto g = grads_in_.find(k);
      if (g == grads_in_.end()) {
        throw invalid_argument("pipeline_executor: " + where() +
                               ": no incoming gradient (the BWD_RECV or the next stage's BWD did not come first)");
      }
      gin = g->second;
      grads_in_.erase(g);
      wait_ready(cs, *gin, pipeswap::detail::wait_site::exec_use_after_receive);
    }
    buffer gout{};
    if (e.stage > 0) gout = {alloc(st.input_bytes(), cs), st.input_bytes()};
    backward_args<B> g{b_, cs, e.stage, e.micro, sc.input, gin ? gin->buf : buffer{}, gout, bufs};
    try {
      st.backward(g);
    } catch (...) {
      free_dev(gout, cs);
      if (gin) free_dev(gin->buf, cs);
      throw;
    }
    if (sc.swapped) {
      acts_.release({e.stage, e.micro});
    } else {
      for (auto& r : sc.raw) free_dev(r, cs);
    }
    free_dev(sc.input, cs);
    if (gin) free_dev(gin->buf, cs);
    saved_.erase(it);
    if (e.stage > 0) hand_over(1, e.stage, e.micro, gout);
  }

  void send(schedule::step const& e, int dir) {
    auto it = outbox_.find({dir, e.stage, e.micro});
    if (it == outbox_.end()) {
      throw invalid_argument("pipeline_executor: " + where() + ": nothing to send (its " + (dir ? "BWD" : "FWD") +
                             " did not run on this rank first)");
    }
    auto r = it->second;
    outbox_.erase(it);
    index_type const to = dir == 0 ? e.stage + 1 : e.stage - 1;
    pending_send p;
    p.bytes = r.buf.bytes;
    p.peer = layout_.rank_of(to);
    p.tag = tag_of(dir, to, e.micro);
    p.entry = schedule::to_text(e);
    if constexpr (C::reads_device_memory) {
      if (r.ready) b_.synchronize(*r.ready);
      p.dev = r.buf;
      p.req = c_.isend(detail::raw_address(p.dev.ptr), p.bytes, p.peer, p.tag);
    } else {
      p.host = p.bytes ? b_.allocate_host(p.bytes) : nullptr;
      staging_.push_back({p.host, p.bytes});
      wait_ready(send_, r, pipeswap::detail::wait_site::exec_send_after_compute);
      if (p.bytes) b_.copy_d2h(p.host, r.buf.ptr, p.bytes, send_);
      auto const copied = b_.record_event(send_);
      free_dev(r.buf, send_);
      b_.synchronize(copied);
      pipeswap::detail::note_host_read(b_, p.host, p.bytes);
      p.req = c_.isend(p.host, p.bytes, p.peer, p.tag);
    }
    ++stats_.sends;
    stats_.bytes_sent += p.bytes;
    sends_.push_back(std::move(p));
  }

  void receive(schedule::step const& e, int dir) {
    auto it = posted_.find({dir, e.stage, e.micro});
    if (it == posted_.end()) throw state_error("pipeline_executor: " + where() + ": received twice");
    auto& p = it->second;
    await(p.req, std::to_string(p.bytes) + " bytes from rank " + std::to_string(p.peer) + " (tag " +
                     std::to_string(p.tag) + ")");
    ready_buffer r;
    if constexpr (C::reads_device_memory) {
      r.buf = p.dev;
    } else {
      pipeswap::detail::note_host_write(b_, p.host, p.bytes); // the comm wrote these bytes
      r.buf = {alloc(p.bytes, recv_), p.bytes};
      if (p.bytes) b_.copy_h2d(r.buf.ptr, p.host, p.bytes, recv_);
      r.ready = b_.record_event(recv_);
    }
    ++stats_.receives;
    stats_.bytes_received += p.bytes;
    posted_.erase(it);
    auto& into = dir == 0 ? inputs_ : grads_in_;
    into[{e.stage, e.micro}] = r;
  }

  void finish_sends() {
    for (auto& s : sends_) {
      await(s.req, "the send " + s.entry + " of " + std::to_string(s.bytes) + " bytes to rank " + std::to_string(s.peer) +
                       " to complete (tag " + std::to_string(s.tag) + ")");
      if constexpr (C::reads_device_memory) free_dev(s.dev, b_.current_stream());
    }
    sends_.clear();
  }

  void check_drained() {
    auto const left = inputs_.size() + grads_in_.size() + outbox_.size() + saved_.size() + posted_.size();
    if (left) {
      throw invalid_argument("pipeline_executor: rank " + std::to_string(c_.rank()) + " ended its order with " +
                             std::to_string(left) +
                             " boundaries or saved chunks not consumed (an unmatched send, receive, forward or backward)");
    }
  }

  void free_staging() {
    for (auto& [h, n] : staging_) {
      if (h) b_.deallocate_host(h, n);
    }
    staging_.clear();
  }

  /// After a failure: settle the device, release everything the step held. Never throws.
  void cleanup() noexcept {
    try {
      release_all();
    } catch (...) {
    }
  }

  void release_all() {
    group_.reset();
    try {
      acts_.end_run();
    } catch (...) {
    }
    try {
      b_.synchronize_device();
    } catch (...) {
    }
    auto const cs = b_.current_stream();
    for (auto& [_, sc] : saved_) {
      for (auto& r : sc.raw) free_dev(r, cs);
      free_dev(sc.input, cs);
    }
    saved_.clear();
    for (auto* m : {&inputs_, &grads_in_}) {
      for (auto& [_, r] : *m) free_dev(r.buf, cs);
      m->clear();
    }
    for (auto& [_, r] : outbox_) free_dev(r.buf, cs);
    outbox_.clear();
    // Requests still posted belong to a comm that was aborted (or a step that threw before its
    // waits): their buffers are released; an aborted comm never completes them.
    for (auto& [_, p] : posted_) free_dev(p.dev, cs);
    posted_.clear();
    for (auto& s : sends_) free_dev(s.dev, cs);
    sends_.clear();
    try {
      b_.synchronize_device();
    } catch (...) {
    }
    free_staging();
  }

  B& b_;
  C& c_;
  schedule::stage_layout layout_;
  std::map<index_type, S*> stages_;
  executor_options o_;
  activation_swap<B> acts_;
  stream_t<B> send_, recv_;
  std::map<key, ready_buffer> inputs_, grads_in_;
  std::map<mkey, ready_buffer> outbox_;
  std::map<key, saved_chunk> saved_;
  std::map<mkey, posted_recv> posted_;
  std::vector<pending_send> sends_;
  std::vector<std::pair<std::byte*, std::size_t>> staging_;
  std::optional<chunk_id> group_;
  std::optional<event_t<B>> last_compute_;
  std::size_t pc_ = 0, size_ = 0;
  std::string current_;
  step_stats stats_;
};

} // namespace pipeswap::exec
