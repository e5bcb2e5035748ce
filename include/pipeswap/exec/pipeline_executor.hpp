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
// exec/executor_options.hpp; the sends and receives: exec/detail/boundary_exchange.hpp; the check that
// every rank runs the same schedule: exec/detail/schedule_check.hpp.
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

#include <pipeswap/detail/message.hpp>
#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/comm.hpp>
#include <pipeswap/exec/detail/boundary_exchange.hpp>
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
  static constexpr bool stream_ordered = detail::boundary_exchange<B, C>::stream_ordered;

  /// `stages` maps each stage this rank runs to the engine's stage object (not owned). Throws
  /// invalid_argument when the layout's rank count is not the comm's size, or when `stages` misses a
  /// stage of this rank or holds one of another rank.
  pipeline_executor(transfer_engine<B>& x, C& c, schedule::stage_layout layout, std::map<index_type, S*> stages,
                    executor_options o = {})
      : engine_(x), b_(x.backend()), c_(c), layout_(layout), stages_(std::move(stages)), o_(o), acts_(x),
        io_(b_, c_, layout_, o_, checks_schedules()) {
    if (layout_.ranks() != c_.size()) {
      throw invalid_argument(pipeswap::detail::message(
          {"pipeline_executor: the layout has ", layout_.ranks(), " ranks, the comm ", c_.size()}));
    }
    for (index_type s = 0; s < layout_.stages(); ++s) {
      bool const mine = layout_.rank_of(s) == c_.rank();
      auto it = stages_.find(s);
      if (mine && (it == stages_.end() || !it->second)) {
        throw invalid_argument(pipeswap::detail::message(
            {"pipeline_executor: rank ", c_.rank(), " runs stage ", s, " but was given no stage object for it"}));
      }
      if (!mine && it != stages_.end()) {
        throw invalid_argument(pipeswap::detail::message(
            {"pipeline_executor: stage ", s, " runs on rank ", layout_.rank_of(s), ", not on rank ", c_.rank()}));
      }
    }
    if (stages_.size() != static_cast<std::size_t>(layout_.stages_per_rank()) ||
        (!stages_.empty() && stages_.rbegin()->first >= layout_.stages())) {
      throw invalid_argument(
          pipeswap::detail::message({"pipeline_executor: rank ", c_.rank(), " was given ", stages_.size(),
                                     " stages, the layout has ", layout_.stages_per_rank(), " stages per rank"}));
    }
  }

  pipeline_executor(pipeline_executor const&) = delete;
  pipeline_executor& operator=(pipeline_executor const&) = delete;
  ~pipeline_executor() {
    try {
      release_all();
    } catch (...) {}
  }

  [[nodiscard]] activation_swap<B>& activations() noexcept { return acts_; }
  [[nodiscard]] step_stats const& last_stats() const noexcept { return stats_; }
  [[nodiscard]] int rank() const { return c_.rank(); }
  /// The streams sends and receives go out on (a stream-ordered comm enqueues on them).
  [[nodiscard]] stream_t<B> send_stream() const noexcept { return io_.send_stream(); }
  [[nodiscard]] stream_t<B> recv_stream() const noexcept { return io_.recv_stream(); }

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
    if (in_step_)
      throw state_error(
          pipeswap::detail::message({"pipeline_executor: rank ", c_.rank(), ": begin_step while a step is running"}));
    if (o_.fail_at && *o_.fail_at > o.size()) {
      throw invalid_argument(
          pipeswap::detail::message({"pipeline_executor: fail_at ", *o_.fail_at, " is past the order's ", o.size(),
                                     " entries and its optimizer step"}));
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
      io_.post_receives(order_, [&](int dir, index_type s) {
        auto& st = stage_of(s);
        return dir == 0 ? st.input_bytes() : st.output_bytes();
      });
    });
  }

  /// Runs entries until the order ends or a receive's message has not arrived (c.test() false; no
  /// watchdog: the caller decides how long to go on). Returns the number of entries run (bubbles
  /// included).
  std::size_t advance() {
    if (!in_step_)
      throw state_error(
          pipeswap::detail::message({"pipeline_executor: rank ", c_.rank(), ": advance without begin_step"}));
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
      throw state_error(pipeswap::detail::message(
          {"pipeline_executor: rank ", c_.rank(), ": end_step before every entry of the step ran"}));
    }
    guarded([&] {
      phase_ = phase::end;
      io_.finish_sends(at());
      io_.check_drained(inputs_.size() + grads_in_.size() + saved_.size());
      phase_ = phase::optimizer;
      fault_site();
      if (o_.sync_before_finish)
        b_.synchronize(b_.record_event(b_.current_stream())); // the gradient-norm reduction point
      detail::finish_step(finish);
      if (o_.settle_device) {
        settle();
      } else {
        b_.synchronize(b_.record_event(b_.current_stream()));
        if (io_.staged()) { // the staging memory's last copies
          b_.synchronize(b_.record_event(io_.recv_stream()));
          b_.synchronize(b_.record_event(io_.send_stream()));
        }
      }
      io_.free_staging();
      acts_.end_run();
    });
    in_step_ = false;
    prefetch_ = {};
  }

private:
  using ready_buffer = detail::ready_buffer<B>;
  struct saved_chunk {
    bool swapped = false;
    bool input_in_group = false; // swapped: the input is a protected buffer of the group
    buffer input;
    std::vector<activation_handle> handles; // swapped
    std::vector<std::size_t> bytes;         // swapped
    std::vector<buffer> raw;                // not swapped
  };
  using key = std::pair<index_type, index_type>; // stage, micro

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
    bool const done = check_.progress(c_, layout_, blocking,
                                      [&](request_t<C>& r, std::string const& what) { io_.await(r, what, at()); });
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
      std::throw_with_nested(rank_failure(
          pipeswap::detail::message({"rank ", c_.rank(), " stopped at ", place(pos, entry), ": ", e.what()}), c_.rank(),
          pos, entry, true));
    } catch (std::exception const& e) {
      auto const pos = pc_;
      auto const entry = current();
      std::string const msg =
          pipeswap::detail::message({"rank ", c_.rank(), " failed at ", place(pos, entry), ": ", e.what()});
      try {
        c_.abort(msg);
      } catch (...) {}
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
    if (entry == "posting receives" || entry == "schedule check" || entry == "end of step" ||
        entry == "optimizer step") {
      return entry;
    }
    return pipeswap::detail::message({"position ", pos, " (", entry, ")"});
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
  std::string where() const { return pipeswap::detail::message({"rank ", c_.rank(), ", ", place(pc_, current())}); }
  /// Where the step stands, computed only when a message needs it (for the boundary exchange).
  auto at() const {
    return [this] { return place(pc_, current()); };
  }

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
      if (!layout_.has_stage(s))
        throw invalid_argument(
            pipeswap::detail::message({"pipeline_executor: ", where(), ": stage ", s, " is outside the layout"}));
      throw invalid_argument(pipeswap::detail::message(
          {"pipeline_executor: ", where(), ": stage ", s, " runs on rank ", layout_.rank_of(s)}));
    }
    return *it->second;
  }
  bool local(index_type s) const { return stages_.count(s) != 0; }
  bool last(index_type s) const { return s + 1 == layout_.stages(); }

  device_pointer_t<B> alloc(std::size_t n, stream_t<B> s) { return io_.alloc(n, s); }
  void free_dev(buffer& d, stream_t<B> s) { io_.free_dev(d, s); }

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
          if (l.kind == step_kind::fwd)
            forward(l);
          else if (l.kind == step_kind::bwd)
            backward(l);
          else
            throw invalid_argument("pipeline_executor: " + where() + ": a composite may hold only FWD and BWD");
        }
      }
      last_compute_ = b_.record_event(b_.current_stream());
      return true;
    case step_kind::fwd_send: io_.send(e, 0, stats_, at()); return true;
    case step_kind::bwd_send: io_.send(e, 1, stats_, at()); return true;
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
    detail::wait_ready(b_, s, r, site);
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
    forward_args<B> f{b_,
                      cs,
                      e.stage,
                      e.micro,
                      in,
                      out,
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
    if (local(next))
      (dir == 0 ? inputs_ : grads_in_)[{next, m}] = r;
    else
      io_.hold({dir, st, m}, r);
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
    backward_args<B> g{b_,      cs,       e.stage,
                       e.micro, sc.input, gin ? gin->buf : buffer{},
                       gout,    bufs,     [&](device_pointer_t<B> p, std::size_t n) { scratch.push_back({p, n}); }};
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
    if (sc.input_in_group)
      sc.input = {};
    else
      free_dev(sc.input, cs);
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

  /// A RECV entry: false when its message has not arrived (non-blocking only).
  bool receive(schedule::step const& e, int dir, bool blocking) {
    auto r = io_.receive(e, dir, blocking, stats_, at());
    if (!r) return false;
    auto& into = dir == 0 ? inputs_ : grads_in_;
    into[{e.stage, e.micro}] = *r;
    return true;
  }

  /// The host waits the whole device: synchronize_device() where the backend has it
  /// (device_synchronizing), else every stream the executor and its transfer engine use (compute,
  /// the p2p streams, the engine's copy streams). Work a stage enqueued on streams of its own is
  /// ordered before the compute stream by the stage (the Stage concept's rule), so it is covered.
  void settle() {
    if constexpr (device_synchronizing<B>) {
      b_.synchronize_device();
    } else {
      for (auto s : {b_.current_stream(), io_.send_stream(), io_.recv_stream(), engine_.h2d(), engine_.d2h()}) {
        b_.synchronize(b_.record_event(s));
      }
    }
  }

  /// After a failure: settle the device, release everything the step held. Never throws.
  void cleanup() noexcept {
    try {
      release_all();
    } catch (...) {}
  }

  void release_all() {
    in_step_ = false;
    check_.drop(); // an aborted comm never completes its requests
    prefetch_ = {};
    group_.reset();
    last_compute_.reset();
    try {
      acts_.end_run();
    } catch (...) {}
    try {
      settle();
    } catch (...) {}
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
    io_.release(cs);
    try {
      settle();
    } catch (...) {}
    io_.free_staging();
  }

  transfer_engine<B>& engine_;
  B& b_;
  C& c_;
  schedule::stage_layout layout_;
  std::map<index_type, S*> stages_;
  executor_options o_;
  activation_swap<B> acts_;
  detail::boundary_exchange<B, C> io_;
  std::map<key, ready_buffer> inputs_, grads_in_;
  std::map<key, saved_chunk> saved_;
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
