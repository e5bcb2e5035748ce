// pipeswap — the pipeline executor: one rank's order of a pipeline schedule, driven over any Backend
// and any Comm, calling the engine's own stages.
//
// pipeline_executor<B, C, S> runs the entries of one rank's order (schedule/generate.hpp, with swap
// steps injected by schedule/inject.hpp or not) for one training step: FWD and BWD through the
// engine's stages on the compute stream, SEND and RECV through the Comm (receives posted before any
// entry runs; boundaries staged through pinned memory when the comm cannot read device memory),
// SWAP_* through activation_swap, and at the end the optimizer-swap runtime's step (with
// executor_options::optimizer_phases, its prefetch in the backward tail and its deferred offload
// finished behind the h2d stream). What each entry does, the ordering rules it guarantees and the
// failure model are in docs/executor.md; in short: every stage call sees complete inputs (stream
// waits), every boundary leaves the device only after the work that wrote it and is released
// stream-ordered behind its copy or send, no wait is unbounded (executor_options::wait_timeout), and
// any failure becomes rank_failure on this rank and, through the comm's abort, on every other rank.
//
// run_step() does all of it; begin_step(), advance() (runs entries until a receive's message has
// not arrived) and end_step() are the same step resumable, for a caller that interleaves every rank
// on one thread (the simulator, sim/pipeline.hpp). Options, errors and statistics:
// exec/executor_options.hpp; the check that every rank runs the same schedule:
// exec/detail/schedule_check.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
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
#include <pipeswap/exec/detail/schedule_check.hpp>
#include <pipeswap/exec/executor_options.hpp>
#include <pipeswap/exec/stage.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>

namespace pipeswap::exec {

template <backend B, comm C, class S>
  requires stage<S, B>
class pipeline_executor {
public:
  using index_type = schedule::index_type;
  using buffer = device_buffer<B>;
  /// The comm enqueues its operations on the executor's send and receive streams.
  static constexpr bool stream_ordered = stream_ordered_comm<C, stream_t<B>>;

  /// `stages` maps each stage this rank runs to the engine's stage object (not owned). Throws
  /// invalid_argument when the layout's rank count is not the comm's size, or when `stages` misses a
  /// stage of this rank or holds one of another rank.
  pipeline_executor(transfer_engine<B>& x, C& c, schedule::stage_layout layout, std::map<index_type, S*> stages,
                    executor_options o = {})
      : engine_(x), b_(x.backend()), c_(c), layout_(layout), stages_(std::move(stages)), o_(o), acts_(x),
        send_(new_stream("p2p send")), recv_(new_stream("p2p recv")) {
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
  /// The streams sends and receives go out on (a stream-ordered comm enqueues on them).
  [[nodiscard]] stream_t<B> send_stream() const noexcept { return send_; }
  [[nodiscard]] stream_t<B> recv_stream() const noexcept { return recv_; }

  /// Runs one training step of this rank's order `o`, then `finish()` (a callable, or an object with
  /// step(): the optimizer-swap runtime; with executor_options::optimizer_phases, a phased runtime).
  /// Throws rank_failure (see the header comment).
  template <class Finish>
  void run_step(schedule::order const& o, Finish&& finish) {
    begin_step(o, finish);
    guarded([&] { run_entries(true); });
    end_step(finish);
  }

  /// The resumable form of run_step, for a caller that interleaves ranks on one thread (the
  /// simulator): begin_step(), then advance() until entries_done(), then end_step(finish) with the
  /// same `finish`, which must outlive the step. run_step() is exactly this with blocking waits.
  template <class Finish>
  void begin_step(schedule::order const& o, Finish& finish) {
    if (in_step_) throw state_error("pipeline_executor: rank " + std::to_string(c_.rank()) + ": begin_step while a step is running");
    if (o_.fail_at && *o_.fail_at > o.size()) {
      throw invalid_argument("pipeline_executor: fail_at " + std::to_string(*o_.fail_at) + " is past the order's " +
                             std::to_string(o.size()) + " entries and its optimizer step");
    }
    if (o_.optimizer_phases && !phased_finish<std::remove_cvref_t<Finish>, B>) {
      throw invalid_argument("pipeline_executor: executor_options::optimizer_phases needs a finish with prefetch(n), "
                             "offload_pending(), finish_offload(stream) and step() (the optimizer-swap runtime)");
    }
    order_ = o;
    pc_ = 0;
    phase_ = phase::posting;
    stats_ = {};
    prefetch_ = {};
    forwards_left_ = 0;
    for (auto const& e : order_) {
      if (!e) continue;
      forwards_left_ += e->kind == schedule::step_kind::fwd ? 1 : 0;
      for (auto const& l : e->sub) forwards_left_ += l.kind == schedule::step_kind::fwd ? 1 : 0;
    }
    in_step_ = true;
    guarded([&] {
      acts_.begin_run();
      if constexpr (phased_finish<std::remove_cvref_t<Finish>, B>) {
        if (o_.optimizer_phases) {
          // The previous step's deferred offload drains into this step's forward: stream-ordered
          // behind the h2d stream (its storage returns behind the D2Hs), the compute stream goes on.
          if (finish.offload_pending()) finish.finish_offload(engine_.h2d());
          prefetch_ = [&finish, n = o_.prefetch_batches] { finish.prefetch(n); };
        }
      }
      for (auto& [s, st] : stages_) {
        if constexpr (stage_with_begin<S, B>) st->begin_step(b_, b_.current_stream());
      }
      start_schedule_check();
      post_receives(order_);
    });
  }

  /// Runs entries until the order ends or a receive's message has not arrived (c.test() false; no
  /// watchdog: the caller decides how long to go on). Returns the number of entries run (bubbles
  /// included).
  std::size_t advance() {
    if (!in_step_) throw state_error("pipeline_executor: rank " + std::to_string(c_.rank()) + ": advance without begin_step");
    std::size_t n = 0;
    guarded([&] { n = run_entries(false); });
    return n;
  }

  /// True when every entry of the step ran (or no step is running).
  [[nodiscard]] bool entries_done() const noexcept { return !in_step_ || pc_ >= order_.size(); }
  /// The position of the entry the step stands at (the receive advance() stopped at).
  [[nodiscard]] std::size_t position() const noexcept { return pc_; }
  /// The forwards of the step that have not returned yet (a running forward still counts): 0 in
  /// the backward tail.
  [[nodiscard]] std::size_t forwards_left() const noexcept { return forwards_left_; }

  /// Ends a step begun with begin_step: every send completes, leftovers fail the step, then
  /// `finish` (see run_step).
  template <class Finish>
  void end_step(Finish&& finish) {
    if (!in_step_ || pc_ < order_.size()) {
      throw state_error("pipeline_executor: rank " + std::to_string(c_.rank()) +
                        ": end_step before every entry of the step ran");
    }
    guarded([&] {
      phase_ = phase::end;
      finish_sends();
      check_drained();
      phase_ = phase::optimizer;
      fault_site();
      if (o_.sync_before_finish) b_.synchronize(b_.record_event(b_.current_stream())); // the gradient-norm reduction point
      detail::finish_step(finish);
      if (o_.settle_device) {
        settle();
      } else {
        b_.synchronize(b_.record_event(b_.current_stream()));
        if (!staging_.empty()) { // the staging memory's last copies
          b_.synchronize(b_.record_event(recv_));
          b_.synchronize(b_.record_event(send_));
        }
      }
      free_staging();
      acts_.end_run();
    });
    in_step_ = false;
    prefetch_ = {};
  }

private:
  struct ready_buffer {
    buffer buf;
    std::optional<event_t<B>> ready;
  };
  struct saved_chunk {
    bool swapped = false;
    bool input_in_group = false;            // swapped: the input is a protected buffer of the group
    buffer input;
    std::vector<activation_handle> handles; // swapped
    std::vector<std::size_t> bytes;         // swapped
    std::vector<buffer> raw;                // not swapped
  };
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
    std::string entry;
  };
  using key = std::pair<index_type, index_type>;        // stage, micro
  using mkey = std::tuple<int, index_type, index_type>; // direction, stage, micro

  stream_t<B> new_stream(char const* name) {
    if constexpr (named_streams<B>) return b_.new_stream(std::string(name));
    else return b_.new_stream();
  }

  // ----- the schedule check (executor_options::check_schedule; exec/detail/schedule_check.hpp) -----

  [[nodiscard]] bool checks_schedules() const noexcept {
    return !C::reads_device_memory && o_.check_schedule && c_.size() > 1;
  }

  void start_schedule_check() {
    if (!checks_schedules()) return;
    phase_ = phase::checking;
    check_.start(c_, layout_, order_, o_.schedule_label);
    phase_ = phase::posting;
  }

  bool progress_schedule_check(bool blocking) {
    phase_ = phase::checking;
    bool const done = check_.progress(c_, layout_, blocking, [&](request_t<C>& r, std::string const& what) { await(r, what); });
    if (done) phase_ = phase::entries;
    return done;
  }

  /// Runs `f`; a failure becomes rank_failure (the original nested), the comm aborted when this rank
  /// failed, everything the step held released.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (comm_aborted const& e) {
      auto const pos = pc_;
      auto const entry = current();
      cleanup();
      std::throw_with_nested(rank_failure("rank " + std::to_string(c_.rank()) + " stopped at " + place(pos, entry) + ": " + e.what(),
                                          c_.rank(), pos, entry, true));
    } catch (std::exception const& e) {
      auto const pos = pc_;
      auto const entry = current();
      std::string const msg = "rank " + std::to_string(c_.rank()) + " failed at " + place(pos, entry) + ": " + e.what();
      try {
        c_.abort(msg);
      } catch (...) {
      }
      cleanup();
      std::throw_with_nested(rank_failure(msg, c_.rank(), pos, entry, false));
    }
  }

  std::size_t run_entries(bool blocking) {
    if (check_.pending() && !progress_schedule_check(blocking)) return 0;
    std::size_t n = 0;
    for (; pc_ < order_.size(); ++pc_, ++n) {
      auto const& e = order_[pc_];
      phase_ = phase::entries;
      fault_site();
      if (e && !run(*e, blocking)) break;
    }
    return n;
  }

  static std::string place(std::size_t pos, std::string const& entry) {
    if (entry == "posting receives" || entry == "schedule check" || entry == "end of step" || entry == "optimizer step") {
      return entry;
    }
    return "position " + std::to_string(pos) + " (" + entry + ")";
  }
  /// What the step is doing: the entry's text, or the phase around the entries.
  std::string current() const {
    switch (phase_) {
    case phase::posting: return "posting receives";
    case phase::checking: return "schedule check";
    case phase::end: return "end of step";
    case phase::optimizer: return "optimizer step";
    case phase::entries: break;
    }
    return pc_ < order_.size() && order_[pc_] ? schedule::to_text(*order_[pc_]) : std::string("bubble");
  }
  std::string where() const { return "rank " + std::to_string(c_.rank()) + ", " + place(pc_, current()); }

  void fault_site() {
    if (!o_.fail_at) return;
    auto const at = phase_ == phase::optimizer ? order_.size() : pc_;
    if (*o_.fail_at == at && phase_ != phase::end) {
      throw injected_fault("injected fault at " + place(pc_, current()));
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
    auto const t = boundary_tag({dir, stage, micro}, layout_.stages());
    long long const most = checks_schedules() ? c_.max_tag() - 1LL : c_.max_tag(); // the check's tag
    if (t > most) {
      throw invalid_argument("pipeline_executor: message tag " + std::to_string(t) + " (stage " +
                             std::to_string(stage) + ", micro " + std::to_string(micro) +
                             ") exceeds the largest boundary tag " + std::to_string(most) +
                             (checks_schedules() ? " (the comm's largest tag is the schedule check's)" : ""));
    }
    return static_cast<int>(t);
  }

  device_pointer_t<B> alloc(std::size_t n, stream_t<B> s) { return n ? b_.allocate_device(n, s) : device_pointer_t<B>{}; }
  void free_dev(buffer& d, stream_t<B> s) {
    if (d.bytes && d.ptr) b_.deallocate_device(d.ptr, d.bytes, s);
    d = {};
  }

  /// Every receive of the order: checked, and posted now unless the comm is stream-ordered (then
  /// each is posted at its RECV entry, into a device buffer allocated there).
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
      if constexpr (stream_ordered) {
        // posted at its entry
      } else if constexpr (C::reads_device_memory) {
        p.dev = {alloc(p.bytes, b_.current_stream()), p.bytes};
        b_.synchronize(b_.record_event(b_.current_stream()));
        p.req = c_.irecv(detail::raw_address(p.dev.ptr), p.bytes, p.peer, p.tag);
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

  void await(request_t<C>& r, std::string const& what) {
    if (!c_.wait_for(r, o_.wait_timeout)) {
      throw comm_timeout("rank " + std::to_string(c_.rank()) + " waited " + std::to_string(o_.wait_timeout.count()) +
                         " ms at " + place(pc_, current()) + " for " + what);
    }
  }

  /// Runs one entry; false when it is a receive whose message has not arrived (non-blocking only).
  bool run(schedule::step const& e, bool blocking) {
    using schedule::step_kind;
    switch (e.kind) {
    case step_kind::fwd:
    case step_kind::bwd:
    case step_kind::overlap_f_b:
    case step_kind::overlap_b_f:
      if (o_.host_paced && last_compute_) b_.synchronize(*last_compute_);
      // The backward tail: after the rank's last forward every compute entry gives memory back, so
      // each one first starts the next step's optimizer batches the budget has room for.
      if (prefetch_ && forwards_left_ == 0) prefetch_();
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
      return true;
    case step_kind::fwd_send: send(e, 0); return true;
    case step_kind::bwd_send: send(e, 1); return true;
    case step_kind::fwd_recv: return receive(e, 0, blocking);
    case step_kind::bwd_recv: return receive(e, 1, blocking);
    case step_kind::swap_set_group: group_ = schedule::chunk{e.stage, e.micro}; return true;
    case step_kind::swap_launch_offload: acts_.launch_offload({e.stage, e.micro}); return true;
    case step_kind::swap_wait_offload: acts_.wait_offload({e.stage, e.micro}); return true;
    case step_kind::swap_launch_load: acts_.launch_load({e.stage, e.micro}); return true;
    case step_kind::swap_wait_load: acts_.wait_load({e.stage, e.micro}); return true;
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
    schedule::chunk const c{e.stage, e.micro};
    auto const save = [&](device_pointer_t<B> p, std::size_t n, bool keep) {
      if (sc.swapped) {
        sc.handles.push_back(acts_.save(p, n));
        sc.bytes.push_back(n);
        if (keep) acts_.protect(c, p, n);
      } else {
        sc.raw.push_back({p, n});
      }
    };
    forward_args<B> f{b_, cs, e.stage, e.micro, in, out,
                      [&](device_pointer_t<B> p, std::size_t n) { save(p, n, false); },
                      [&](device_pointer_t<B> p, std::size_t n) { save(p, n, true); }};
    try {
      if (swapped) {
        group_.reset();
        auto const scope = acts_.forward(c);
        ++stats_.swapped_chunks;
        if (in.bytes && in.ptr) {
          // The input joins the group as a protected buffer: it stays on the device (the pipeline
          // reads it in the backward) and is counted with the group where a budget is attached.
          (void)acts_.save(in.ptr, in.bytes);
          sc.input_in_group = true; // the group frees it from here
          acts_.protect(c, in.ptr, in.bytes);
        }
        st.forward(f);
      } else {
        st.forward(f);
      }
    } catch (...) {
      free_dev(out, cs);
      throw;
    }
    if (forwards_left_ > 0) --forwards_left_;
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
    std::vector<buffer> scratch;
    backward_args<B> g{b_, cs, e.stage, e.micro, sc.input, gin ? gin->buf : buffer{}, gout, bufs,
                       [&](device_pointer_t<B> p, std::size_t n) { scratch.push_back({p, n}); }};
    try {
      st.backward(g);
    } catch (...) {
      free_dev(gout, cs);
      if (gin) free_dev(gin->buf, cs);
      for (auto& w : scratch) free_dev(w, cs);
      throw;
    }
    // Released behind the backward: the input first, then the saved activations (as a group the
    // input is the group's first buffer), the incoming gradient, the backward's own workspace.
    if (sc.input_in_group) sc.input = {};
    else free_dev(sc.input, cs);
    if (sc.swapped) {
      acts_.release({e.stage, e.micro});
    } else {
      for (auto& r : sc.raw) free_dev(r, cs);
    }
    if (gin) free_dev(gin->buf, cs);
    for (auto& w : scratch) free_dev(w, cs);
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
    if constexpr (stream_ordered) {
      // The send stream waits the compute that wrote the boundary; the send and the buffer's
      // release go out behind it, stream-ordered (the host never waits).
      wait_ready(send_, r, pipeswap::detail::wait_site::exec_send_after_compute);
      p.req = c_.isend(detail::raw_address(r.buf.ptr), p.bytes, p.peer, p.tag, send_);
      free_dev(r.buf, send_);
    } else if constexpr (C::reads_device_memory) {
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

  bool receive(schedule::step const& e, int dir, bool blocking) {
    auto it = posted_.find({dir, e.stage, e.micro});
    if (it == posted_.end()) throw state_error("pipeline_executor: " + where() + ": received twice");
    auto& p = it->second;
    if constexpr (stream_ordered) {
      if (!p.posted) { // posted at its entry, into a device buffer allocated on the receive stream
        p.dev = {alloc(p.bytes, recv_), p.bytes};
        p.req = c_.irecv(detail::raw_address(p.dev.ptr), p.bytes, p.peer, p.tag, recv_);
        p.posted = true;
      }
    }
    if (blocking) {
      await(p.req, std::to_string(p.bytes) + " bytes from rank " + std::to_string(p.peer) + " (tag " +
                       std::to_string(p.tag) + ")");
    } else if (!c_.test(p.req)) {
      return false;
    }
    ready_buffer r;
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
    ++stats_.receives;
    stats_.bytes_received += p.bytes;
    posted_.erase(it);
    auto& into = dir == 0 ? inputs_ : grads_in_;
    into[{e.stage, e.micro}] = r;
    return true;
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

  /// The host waits the whole device: synchronize_device() where the backend has it
  /// (device_synchronizing), else every stream the executor and its transfer engine use (compute,
  /// the p2p streams, the engine's copy streams). Work a stage enqueued on streams of its own is
  /// ordered before the compute stream by the stage (the Stage concept's rule), so it is covered.
  void settle() {
    if constexpr (device_synchronizing<B>) {
      b_.synchronize_device();
    } else {
      for (auto s : {b_.current_stream(), send_, recv_, engine_.h2d(), engine_.d2h()}) b_.synchronize(b_.record_event(s));
    }
  }

  /// After a failure: settle the device, release everything the step held. Never throws.
  void cleanup() noexcept {
    try {
      release_all();
    } catch (...) {
    }
  }

  void release_all() {
    in_step_ = false;
    check_.drop(); // an aborted comm never completes its requests
    prefetch_ = {};
    group_.reset();
    last_compute_.reset();
    try {
      acts_.end_run();
    } catch (...) {
    }
    try {
      settle();
    } catch (...) {
    }
    auto const cs = b_.current_stream();
    for (auto& [_, sc] : saved_) {
      for (auto& r : sc.raw) free_dev(r, cs);
      if (!sc.input_in_group) free_dev(sc.input, cs);
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
      settle();
    } catch (...) {
    }
    free_staging();
  }

  transfer_engine<B>& engine_;
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
  detail::schedule_check<C> check_;
  std::optional<schedule::chunk> group_;
  std::optional<event_t<B>> last_compute_;
  schedule::order order_;
  std::function<void()> prefetch_;
  bool in_step_ = false;
  std::size_t pc_ = 0, forwards_left_ = 0;
  enum class phase { posting, checking, entries, end, optimizer } phase_ = phase::posting;
  step_stats stats_;
};

} // namespace pipeswap::exec
