// pipeswap — the mock backend's model of one accelerator: the Backend concept, its optional
// capabilities, kernels, peek and poke for tests, accounting. Its parts: the hazard checker
// (checker.hpp), the trace export (trace.hpp), fault injection (faults.hpp), kernel bodies' views
// (kernel_context.hpp), the effect queue (detail/storage.hpp), the memory timeline
// (detail/memory_timeline.hpp) and the allocations by address (detail/allocation_table.hpp);
// <pipeswap/backend/mock.hpp> describes the whole.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock/checker.hpp>
#include <pipeswap/backend/mock/detail/allocation_table.hpp>
#include <pipeswap/backend/mock/detail/memory_timeline.hpp>
#include <pipeswap/backend/mock/detail/op_log.hpp>
#include <pipeswap/backend/mock/detail/storage.hpp>
#include <pipeswap/backend/mock/detail/vector_clock.hpp>
#include <pipeswap/backend/mock/faults.hpp>
#include <pipeswap/backend/mock/hazard.hpp>
#include <pipeswap/backend/mock/kernel_context.hpp>
#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/backend/mock/trace.hpp>
#include <pipeswap/backend/mock/types.hpp>
#include <pipeswap/detail/round.hpp>

namespace pipeswap::mock {

/// The mock backend. See the header comment.
class backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = mock_error;
  using stream_type = stream;
  using event_type = event;
  using device_pointer = device_ptr;

  explicit backend(options opts = {}) : opts_(opts) {
    log_.keep(opts_.keep_op_log);
    new_stream("stream 0 (compute)");
  }
  backend(backend const&) = delete;
  backend& operator=(backend const&) = delete;
  ~backend() {
    for (;;) { // a throwing kernel body must not escape a destructor: skip it and go on
      try {
        effects_.drain(std::numeric_limits<sim_time>::max());
        return;
      } catch (...) {}
    }
  }

  // ----- Backend concept ---------------------------------------------------------------------------

  [[nodiscard]] stream current_stream() const noexcept { return current_; }

  stream new_stream() { return new_stream(pipeswap::detail::message({"stream ", streams_.size()})); }

  event record_event(stream s) {
    auto& st = state_of(s, "record_event");
    event e;
    e.id = ++event_ids_;
    e.stream = s.id;
    e.time = std::max(st.ready, host_now_);
    e.clock = st.clock;
    e.clock.join(host_clock_);
    log_op(op_kind::record, agent_of(s), st.seq, e.time, e.time, 0, engine::none, named([&] {
             return pipeswap::detail::message({"record event ", e.id});
           }));
    return e;
  }

  void wait_event(stream s, event const& e) {
    auto& st = state_of(s, "wait_event");
    if (!e.recorded()) throw mock_error("mock::backend::wait_event: the event was never recorded");
    st.ready = std::max(st.ready, e.time);
    st.clock.join(e.clock);
    log_op(op_kind::wait, agent_of(s), st.seq, std::max(st.ready, host_now_), std::max(st.ready, host_now_), 0,
           engine::none, named([&] {
             return pipeswap::detail::message({"wait event ", e.id, " (", log_.stream_lane(e.stream), ")"});
           }));
  }

  void synchronize(event const& e) {
    if (!e.recorded()) throw mock_error("mock::backend::synchronize: the event was never recorded");
    host_wait(e.time, e.clock, named([&] { return pipeswap::detail::message({"synchronize event ", e.id}); }));
  }

  device_ptr allocate_device(std::size_t n, stream s) {
    state_of(s, "allocate_device");
    if (n == 0) return device_ptr{};
    faults_.attempt(fault_site::allocation, "allocate_device", n);
    auto const p = plan(s, 0, engine::none);
    if (opts_.device_capacity != std::numeric_limits<std::size_t>::max()) {
      auto const live = memory_.live_at(p.start);
      if (live + n > opts_.device_capacity) {
        throw mock_error(pipeswap::detail::message({"mock::backend::allocate_device: out of device memory allocating ",
                                                    n, " bytes on ", log_.stream_lane(s.id), " (", live, " of ",
                                                    opts_.device_capacity, " bytes live)"}));
      }
    }
    auto a = std::make_shared<allocation>();
    a->id = ++alloc_ids_;
    a->device = true;
    a->size = n;
    a->base = next_device_address_;
    // A gap of one alignment unit catches off-by-one neighbours.
    next_device_address_ += pipeswap::detail::round_up(n, detail::allocation_alignment) + detail::allocation_alignment;
    if (opts_.materialize) a->fill_poison();
    auto const op = commit(s, p, op_kind::allocate, n, engine::none, named([&] { return label("allocate"); }));
    new_shadow(*a, detail::access_ref{p.agent, p.seq, op});
    auto const base = a->base;
    allocs_.add_device(std::move(a));
    memory_.add({p.start, static_cast<std::int64_t>(n), op});
    device_live_ += n;
    ++live_device_allocations_;
    return device_ptr(base);
  }

  void deallocate_device(device_ptr d, std::size_t n, stream s) {
    state_of(s, "deallocate_device");
    if (!d) return;
    auto const& a = allocs_.find_device_ref(d, "deallocate_device");
    if (a->base != d.address() || a->size != n) {
      throw mock_error(pipeswap::detail::message({"mock::backend::deallocate_device: ", detail::describe_ptr(d),
                                                  " with ", n, " bytes does not name a whole allocation (allocation #",
                                                  a->id, " has ", a->size, " bytes)"}));
    }
    auto const p = plan(s, 0, engine::none);
    auto name = named([&] { return label("release"); });
    if (tracks_touches()) {
      touches t;
      t.add(a, 0, n, detail::access_mode::release);
      detail::check_touches(t, p, op_kind::release, name, log_, opts_, hazards_);
    }
    auto const op = commit(s, p, op_kind::release, n, engine::none, std::move(name));
    a->released = true;
    a->release_op = op;
    allocs_.device_released();
    memory_.add({p.start, -static_cast<std::int64_t>(n), op});
    device_live_ -= n;
    --live_device_allocations_;
    // Without bytes nothing reads storage_gone (only the data effects of a materialized run do).
    if (opts_.materialize)
      effects_.push(p.end, op, [a] { a->free_storage(); });
    else
      a->free_storage();
  }

  std::byte* allocate_host(std::size_t n) {
    if (n == 0) return nullptr;
    faults_.attempt(fault_site::allocation, "allocate_host", n);
    auto a = std::make_shared<allocation>();
    a->id = ++alloc_ids_;
    a->device = false;
    a->size = n;
    if (opts_.materialize) {
      a->fill_poison();
      a->base = reinterpret_cast<std::uintptr_t>(a->data);
    } else {
      // Timing-only: a unique address range with no bytes behind it (never dereferenced).
      a->base = next_host_address_;
      next_host_address_ += pipeswap::detail::round_up(n, detail::allocation_alignment) + detail::allocation_alignment;
    }
    auto const op = host_op(op_kind::host_allocate, n, label("allocate pinned"));
    new_shadow(*a, detail::access_ref{0, host_clock_.get(0), op});
    allocs_.add_host(a);
    host_live_ += n;
    host_peak_ = std::max(host_peak_, host_live_);
    return reinterpret_cast<std::byte*>(a->base);
  }

  void deallocate_host(std::byte* h, std::size_t n) {
    if (h == nullptr) return;
    auto a = allocs_.find_host(h, "deallocate_host");
    if (a->base != reinterpret_cast<std::uintptr_t>(h) || a->size != n) {
      throw mock_error(pipeswap::detail::message({"mock::backend::deallocate_host: the pointer with ", n,
                                                  " bytes does not name a whole pinned allocation (allocation #", a->id,
                                                  " has ", a->size, " bytes)"}));
    }
    effects_.drain(host_now_);
    auto c = host_clock_;
    c.set(0, host_clock_.get(0) + 1);
    touches t;
    t.add(a, 0, n, detail::access_mode::release);
    planned p{0, c.get(0), host_now_, host_now_, c};
    auto name = label("release pinned");
    detail::check_touches(t, p, op_kind::host_release, name, log_, opts_, hazards_);
    host_clock_ = c;
    auto const op = log_op(op_kind::host_release, 0, c.get(0), host_now_, host_now_, n, engine::none, std::move(name));
    a->released = true;
    a->release_op = op;
    a->storage_gone = true; // the host frees at once; a racing copy finds nothing to write
    allocs_.erase_host(a->base);
    host_live_ -= n;
    effects_.keep_until_drained(std::move(a)); // bytes outlive pending effects
  }

  void copy_h2d(device_ptr d, std::byte const* h, std::size_t n, stream s) { copy(op_kind::h2d, d, h, n, s); }

  void copy_d2h(std::byte* h, device_ptr d, std::size_t n, stream s) { copy(op_kind::d2h, d, h, n, s); }

  // ----- Optional capabilities ---------------------------------------------------------------------

  /// Names the operations enqueued next (until the next call). An empty label clears it.
  void set_label(std::string_view l) { label_.assign(l); }

  /// Declares that the host is about to read pinned bytes: brings the simulation up to the host's
  /// clock and checks that every write to them is ordered before (synchronized with) the host.
  void note_host_read(std::byte const* h, std::size_t n) { host_access(h, n, false); }

  /// Declares that the host is about to write pinned bytes: checks that no unsynchronized copy still
  /// reads or writes them.
  void note_host_write(std::byte const* h, std::size_t n) { host_access(h, n, true); }

  /// Blocks the host until all work on all streams is complete.
  void synchronize_device() {
    sim_time t = host_now_;
    detail::vector_clock c;
    for (auto const& st : streams_) {
      t = std::max(t, st.ready);
      c.join(st.clock);
    }
    host_wait(t, c, "synchronize device");
  }

  /// False in timing-only runs: pinned allocations are then addresses with no bytes behind them.
  [[nodiscard]] bool holds_bytes() const noexcept { return opts_.materialize; }

  // ----- Mock-specific -----------------------------------------------------------------------------

  /// Work enqueued on `s` after this call starts no earlier than simulated time `t`: data arriving
  /// from outside this device (a receive from another pipeline rank) at `t`.
  void wait_until(stream s, sim_time t, std::string_view what = "wait for input") {
    auto& st = state_of(s, "wait_until");
    st.ready = std::max(st.ready, t);
    log_op(op_kind::wait, agent_of(s), st.seq, std::max(st.ready, host_now_), std::max(st.ready, host_now_), 0,
           engine::none, named([&] { return std::string(what); }));
  }

  /// A new stream with a name for traces and reports.
  stream new_stream(std::string name) {
    streams_.emplace_back();
    return stream{log_.add_stream(std::move(name))};
  }

  void set_current_stream(stream s) {
    state_of(s, "set_current_stream");
    current_ = s;
  }

  /// Enqueues a kernel on `s`. `body` runs when the simulation reaches the kernel's end, with views
  /// of exactly the declared regions. Declared regions are checked like copies: reads must be ordered
  /// after their writes; writes after every unordered use.
  void launch(stream s, kernel_desc desc, std::function<void(kernel_context const&)> body = {}) {
    state_of(s, "launch");
    faults_.attempt(
        fault_site::kernel, [&] { return "launch '" + desc.name + "'"; }, 0);
    touches t;
    std::size_t touched = 0;
    kernel_context ctx;
    if (opts_.materialize && body) ctx.name_ = desc.name; // the body's view names its kernel
    auto bind = [&](region const& r, bool writable) {
      if (r.bytes == 0) return;
      detail::call_site const where{"launch '", desc.name, "' region"};
      auto const& a = allocs_.find_device_ref(r.ptr, where);
      auto const off = detail::range_in(*a, r.ptr.address(), r.bytes, where);
      touched += r.bytes;
      if (!tracks_touches()) return; // the region is checked; nothing reads the touch
      t.add(a, off, off + r.bytes, writable ? detail::access_mode::read_write : detail::access_mode::read);
      ctx.regions_.push_back({r.ptr, r.bytes, writable, nullptr});
    };
    for (auto const& r : desc.reads) bind(r, false);
    for (auto const& r : desc.writes) bind(r, true);
    auto const cost = desc.cost ? *desc.cost : opts_.timing.kernel_duration(touched);
    auto const p = plan(s, cost, opts_.timing.concurrent_kernels ? engine::none : engine::compute);
    auto name = log_.keeps() ? label(desc.name) : std::string();
    detail::check_touches(t, p, op_kind::kernel, name, log_, opts_, hazards_);
    auto const op = commit(s, p, op_kind::kernel, touched,
                           opts_.timing.concurrent_kernels ? engine::none : engine::compute, std::move(name));
    record_touches(t, p, op);
    if (opts_.materialize && body) {
      auto allocs = t.allocations();
      effects_.push(p.end, op, [allocs = std::move(allocs), ctx = std::move(ctx), body = std::move(body)]() mutable {
        for (std::size_t i = 0; i < allocs.size(); ++i) {
          if (allocs[i]->storage_gone) return; // a hazard already reported this; nothing to run on
          ctx.regions_[i].data = allocs[i]->data + (ctx.regions_[i].ptr.address() - allocs[i]->base);
        }
        body(ctx);
      });
    }
  }

  /// Advances the host clock by `ns` of host-side work.
  void host_compute(sim_time ns, std::string_view what = "host work") {
    auto const start = host_now_;
    host_now_ += ns;
    host_clock_.set(0, host_clock_.get(0) + 1);
    log_op(op_kind::host_sync, 0, host_clock_.get(0), start, host_now_, 0, engine::none, std::string(what));
  }

  /// Test peek: synchronizes the device, then returns a copy of device bytes.
  [[nodiscard]] std::vector<std::byte> read_device(device_ptr d, std::size_t n) {
    synchronize_device();
    if (n == 0) return {};
    auto a = allocs_.find_device(d, "read_device");
    auto const off = detail::range_in(*a, d.address(), n, "read_device");
    if (a->released) throw mock_error("mock::backend::read_device: allocation was released");
    if (!opts_.materialize) throw mock_error("mock::backend::read_device: backend holds no bytes");
    return {a->data + off, a->data + off + n};
  }

  /// Test poke: synchronizes the device, then writes device bytes from the host (like a blocking
  /// cudaMemcpy). Later work on any stream is ordered after it.
  void write_device(device_ptr d, std::span<std::byte const> bytes) {
    synchronize_device();
    if (bytes.empty()) return;
    auto a = allocs_.find_device(d, "write_device");
    auto const off = detail::range_in(*a, d.address(), bytes.size(), "write_device");
    if (a->released) throw mock_error("mock::backend::write_device: allocation was released");
    host_clock_.set(0, host_clock_.get(0) + 1);
    auto const op = log_op(op_kind::host_write, 0, host_clock_.get(0), host_now_, host_now_, bytes.size(), engine::none,
                           label("write_device"));
    if (opts_.hazards == hazard_policy::ignore)
      shadows_behind_ = true;
    else
      a->shadow->record(off, off + bytes.size(), detail::access_mode::write, {0, host_clock_.get(0), op}, host_clock_);
    if (opts_.materialize) std::memcpy(a->data + off, bytes.data(), bytes.size());
  }

  /// Makes the operation of class `site` that comes after the next `n` such operations throw
  /// mock_error, once. The failing call has no effect.
  void fail_after(fault_site site, std::size_t n) noexcept { faults_.fail_after(site, n); }
  void clear_faults() noexcept { faults_.clear(); }
  /// Number of operations of class `site` attempted so far (including failed ones).
  [[nodiscard]] std::size_t attempts(fault_site site) const noexcept { return faults_.attempts(site); }

  [[nodiscard]] std::vector<hazard> const& hazards() const noexcept { return hazards_; }
  void clear_hazards() noexcept { hazards_.clear(); }
  /// Operations that ran under `ignore` are not recorded for the checker: when checking resumes after
  /// them, every allocation's record starts afresh (no earlier access counts as unordered).
  void set_hazard_policy(hazard_policy p) {
    if (p != hazard_policy::ignore && shadows_behind_) {
      allocs_.for_each([](allocation& a) { a.shadow.emplace(a.size, std::nullopt); });
      shadows_behind_ = false;
    }
    opts_.hazards = p;
  }
  [[nodiscard]] options const& config() const noexcept { return opts_; }

  /// The host thread's simulated clock.
  [[nodiscard]] sim_time now() const noexcept { return host_now_; }
  /// When everything enqueued on `s` so far is complete (the start of its next operation, unless
  /// the host is later).
  [[nodiscard]] sim_time ready_time(stream s) const { return state_of(s, "ready_time").ready; }
  /// When everything enqueued so far is complete.
  [[nodiscard]] sim_time makespan() const noexcept {
    sim_time t = host_now_;
    for (auto const& st : streams_) t = std::max(t, st.ready);
    return t;
  }
  /// When everything enqueued so far is complete, but for what `skip` still has to run.
  [[nodiscard]] sim_time makespan_except(stream skip) const noexcept {
    sim_time t = host_now_;
    for (std::size_t i = 0; i < streams_.size(); ++i)
      if (i != skip.id) t = std::max(t, streams_[i].ready);
    return t;
  }

  /// Device bytes allocated and not yet released, counting in enqueue order.
  [[nodiscard]] std::size_t device_bytes_in_use() const noexcept { return device_live_; }
  /// The highest device bytes live at any simulated instant from `t` on, as enqueued so far: what an
  /// allocation at `t` lies beside. A release still queued behind work on its stream counts until
  /// its stream reaches it (device_bytes_in_use() has it gone already).
  [[nodiscard]] std::size_t device_bytes_live_from(sim_time t) const { return memory_.peak_from(t, device_live_); }
  [[nodiscard]] std::size_t live_device_allocations() const noexcept { return live_device_allocations_; }
  /// Highest device bytes live at any simulated instant (allocations and releases placed at their
  /// simulated times; at equal times in the order they were enqueued).
  [[nodiscard]] std::size_t peak_device_bytes() const { return memory_.peak(); }
  /// (time, live bytes) after the changes at each instant, in simulated-time order.
  [[nodiscard]] std::vector<std::pair<sim_time, std::size_t>> device_memory_timeline() const {
    return memory_.timeline();
  }
  [[nodiscard]] std::size_t host_bytes_in_use() const noexcept { return host_live_; }
  [[nodiscard]] std::size_t peak_host_bytes() const noexcept { return host_peak_; }
  [[nodiscard]] std::size_t bytes_copied_h2d() const noexcept { return bytes_h2d_; }
  [[nodiscard]] std::size_t bytes_copied_d2h() const noexcept { return bytes_d2h_; }

  [[nodiscard]] std::vector<op_record> const& ops() const noexcept { return log_.ops(); }

  /// Writes the timeline as Chrome trace JSON (Perfetto and chrome://tracing open it): one lane per
  /// stream, one per copy engine and the compute engine, a host lane, and a device-memory counter.
  /// Output depends only on the sequence of calls, never on host addresses or wall time.
  void write_chrome_trace(std::ostream& os) const { detail::write_chrome_trace(os, log_, memory_.sorted()); }

  /// Writes this device's trace events (no enclosing object) as process `pid` named `name`, so that
  /// several simulated devices can share one trace. `first` is true until an event was written.
  void write_trace_events(std::ostream& os, bool& first, int pid, std::string_view name) const {
    detail::write_trace_events(os, log_, memory_.sorted(), first, pid, name);
  }

  /// The op trace that ends at operation `op` (at most `count` entries), one line per operation.
  [[nodiscard]] std::string format_trace(std::uint64_t op, std::size_t count) const {
    return log_.format_trace(op, count);
  }

  /// One operation of the log: `#i kind 'name' on lane t=[start,end)`.
  [[nodiscard]] std::string describe_op(std::uint64_t i) const { return log_.describe(i); }

private:
  struct stream_state {
    sim_time ready = 0;
    std::uint64_t seq = 0;
    detail::vector_clock clock;
  };
  using allocation = detail::allocation;
  using alloc_ptr = detail::alloc_ptr;
  using planned = detail::planned;
  using touches = detail::touches;
  using mem_event = detail::mem_event;

  static std::uint32_t agent_of(stream s) noexcept { return s.id + 1; }
  static std::string bytes_text(std::size_t n) { return pipeswap::detail::message({n, " B"}); }

  std::string label(std::string what) const { return label_.empty() ? what : what + " · " + label_; }
  /// An operation's name, formatted only when the log records it (options::keep_op_log).
  template <class F>
  std::string named(F&& f) const {
    return log_.keeps() ? std::string(f()) : std::string();
  }

  stream_state& state_of(stream s, char const* call) {
    if (s.id >= streams_.size()) {
      throw mock_error(pipeswap::detail::message({"mock::backend::", call, ": unknown stream ", s.id}));
    }
    return streams_[s.id];
  }
  stream_state const& state_of(stream s, char const* call) const {
    return const_cast<backend*>(this)->state_of(s, call);
  }

  /// copy_h2d and copy_d2h: `dir` says which side is the source.
  template <class HostPtr>
  void copy(op_kind dir, device_ptr d, HostPtr h, std::size_t n, stream s) {
    bool const up = dir == op_kind::h2d;
    char const* const call = up ? "copy_h2d" : "copy_d2h";
    state_of(s, call);
    if (n == 0) return;
    auto const host = reinterpret_cast<std::uintptr_t>(h);
    detail::call_site const source{call, " source"}, destination{call, " destination"};
    // References into the table: nothing below adds or removes an allocation.
    auto const& src = up ? allocs_.find_host(h, source) : allocs_.find_device_ref(d, source);
    auto const& dst = up ? allocs_.find_device_ref(d, destination) : allocs_.find_host(h, destination);
    auto const so = detail::range_in(*src, up ? host : d.address(), n, source);
    auto const dof = detail::range_in(*dst, up ? d.address() : host, n, destination);
    faults_.attempt(fault_site::copy, call, n);
    auto const eng = up ? engine::h2d : engine::d2h;
    auto const& link = up ? opts_.timing.h2d : opts_.timing.d2h;
    auto p = plan(s, link.duration(n), eng);
    std::vector<detail::rate_timeline::segment> shares;
    if (opts_.timing.duplex_factor < 1) { // the two directions share the link while they overlap
      for (auto& t : planned_) t.forget_before(host_now_);
      p.end = detail::shared_copy_end(link, opts_.timing.duplex_factor, p.start, n, planned_[up ? 1 : 0], shares);
    }
    touches t;
    if (tracks_touches()) {
      t.add(src, so, so + n, detail::access_mode::read);
      t.add(dst, dof, dof + n, detail::access_mode::write);
    }
    auto const name = log_.keeps() ? label((up ? "H2D " : "D2H ") + bytes_text(n)) : std::string();
    detail::check_touches(t, p, dir, name, log_, opts_, hazards_);
    auto const op = commit(s, p, dir, n, eng, name);
    planned_[up ? 0 : 1].append(shares);
    record_touches(t, p, op);
    (up ? bytes_h2d_ : bytes_d2h_) += n;
    if (opts_.materialize) {
      effects_.push(p.end, op, [src, dst, so, dof, n] {
        if (!src->storage_gone && !dst->storage_gone) std::memcpy(dst->data + dof, src->data + so, n);
      });
    }
  }

  planned plan(stream s, sim_time duration, engine e) const {
    auto const& st = streams_[s.id];
    auto start = std::max(st.ready, host_now_);
    if (e != engine::none) start = std::max(start, engine_free_[static_cast<int>(e)]);
    planned p{agent_of(s), st.seq + 1, start, start + duration, st.clock}; // the clock copied, not zeroed first
    p.clock.join(host_clock_);
    p.clock.set(p.agent, p.seq);
    return p;
  }

  std::uint64_t commit(stream s, planned const& p, op_kind k, std::size_t bytes, engine e, std::string name) {
    auto& st = streams_[s.id];
    st.seq = p.seq;
    st.ready = p.end;
    st.clock = p.clock;
    if (e != engine::none) engine_free_[static_cast<int>(e)] = p.end;
    return log_op(k, p.agent, p.seq, p.start, p.end, bytes, e, std::move(name));
  }

  std::uint64_t log_op(op_kind k, std::uint32_t agent, std::uint64_t seq, sim_time start, sim_time end,
                       std::size_t bytes, engine e, std::string name) {
    if (!log_.keeps()) return log_.count();
    return log_.push(op_record{k, agent, seq, start, end, bytes, e, std::move(name)});
  }

  std::uint64_t host_op(op_kind k, std::size_t bytes, std::string name) {
    host_clock_.set(0, host_clock_.get(0) + 1);
    return log_op(k, 0, host_clock_.get(0), host_now_, host_now_, bytes, engine::none, std::move(name));
  }

  void host_wait(sim_time t, detail::vector_clock const& c, std::string what) {
    auto const start = host_now_;
    host_now_ = std::max(host_now_, t);
    host_clock_.join(c);
    host_clock_.set(0, host_clock_.get(0) + 1);
    log_op(op_kind::host_sync, 0, host_clock_.get(0), start, host_now_, 0, engine::none, std::move(what));
    effects_.drain(host_now_);
  }

  void host_access(std::byte const* h, std::size_t n, bool write) {
    if (n == 0) return;
    auto a = allocs_.find_host(h, write ? "note_host_write" : "note_host_read");
    auto const off =
        detail::range_in(*a, reinterpret_cast<std::uintptr_t>(h), n, write ? "note_host_write" : "note_host_read");
    effects_.drain(host_now_);
    auto c = host_clock_;
    c.set(0, host_clock_.get(0) + 1);
    planned p{0, c.get(0), host_now_, host_now_, c};
    touches t;
    t.add(a, off, off + n, write ? detail::access_mode::write : detail::access_mode::read);
    auto const kind = write ? op_kind::host_write : op_kind::host_read;
    auto name = label(write ? "host write" : "host read");
    detail::check_touches(t, p, kind, name, log_, opts_, hazards_);
    host_clock_ = c;
    auto const op = log_op(kind, 0, c.get(0), host_now_, host_now_, n, engine::none, std::move(name));
    record_touches(t, p, op);
  }

  /// Whether operations list their touches: for the checker, or for the data effects of a
  /// materialized run. Neither under hazard_policy::ignore without bytes: then the regions and
  /// copies are only checked against their allocations.
  [[nodiscard]] bool tracks_touches() const noexcept {
    return opts_.hazards != hazard_policy::ignore || opts_.materialize;
  }

  /// A new allocation's shadow map, written by `by`; none under hazard_policy::ignore (nothing reads
  /// it until set_hazard_policy gives every allocation a fresh one).
  void new_shadow(allocation& a, detail::access_ref by) {
    if (opts_.hazards == hazard_policy::ignore) {
      shadows_behind_ = true;
      return;
    }
    a.shadow.emplace(a.size, by);
  }

  /// Records a committed operation's touches for the checker (not under hazard_policy::ignore: then
  /// nothing reads them until set_hazard_policy starts the records afresh).
  void record_touches(touches const& t, planned const& p, std::uint64_t op) {
    if (opts_.hazards == hazard_policy::ignore) {
      shadows_behind_ = true;
      return;
    }
    detail::record_touches(t, p, op);
  }

  options opts_;
  std::vector<stream_state> streams_;
  stream current_{};
  sim_time host_now_ = 0;
  detail::vector_clock host_clock_;
  sim_time engine_free_[4] = {0, 0, 0, 0};
  detail::rate_timeline planned_[2]; ///< the shares planned on the H2D and the D2H engine (duplex)
  std::uint64_t event_ids_ = 0;
  std::uint64_t alloc_ids_ = 0;
  std::uintptr_t next_device_address_ = std::uintptr_t{1} << 40;
  std::uintptr_t next_host_address_ = std::uintptr_t{1} << 46;
  /// Every device allocation (released ones too, for use-after-release reports), by base address.
  detail::allocation_table allocs_;
  detail::op_log log_;
  std::vector<hazard> hazards_;
  detail::memory_timeline memory_; ///< every allocation and release, at its simulated time
  detail::effect_queue effects_;
  std::string label_;
  bool shadows_behind_ = false; ///< operations ran under hazard_policy::ignore without being recorded
  std::size_t device_live_ = 0;
  std::size_t live_device_allocations_ = 0;
  std::size_t host_live_ = 0;
  std::size_t host_peak_ = 0;
  std::size_t bytes_h2d_ = 0;
  std::size_t bytes_d2h_ = 0;
  detail::fault_injector faults_;
};

static_assert(pipeswap::backend<backend>);

} // namespace pipeswap::mock
