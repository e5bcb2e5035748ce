// pipeswap — the mock backend: a deterministic, hazard-checking simulator of one accelerator.
//
// pipeswap::mock::backend models the Backend concept on the host, with simulated time:
//  * streams are FIFOs; events are points on them; wait_event orders one stream behind another;
//  * one copy engine per direction (same-direction copies serialize, opposite directions overlap) and
//    one compute engine, with durations from a timing_model;
//  * device and pinned host allocations hold real bytes; every data effect (copy, kernel body,
//    release) is applied in simulated-time order when the host's clock passes its end, so a missing
//    wait shows up as stale data, exactly as on hardware;
//  * a hazard checker tracks a happens-before relation (vector clocks over the host thread and the
//    streams) and a shadow map per allocation, and reports every read of bytes whose write is not
//    ordered before it, every write while an unordered copy or kernel still uses the bytes, every
//    release of storage still in use, every host read of a D2H target that was not synchronized, and
//    every use of released storage — with the offending op, its stream and the op trace;
//  * it accounts device and pinned bytes over simulated time (peak, timeline);
//  * it injects faults (the n-th copy, allocation or kernel throws mock_error);
//  * it exports the whole timeline as Chrome trace JSON (one lane per stream and per engine).
//
// The backend is single-threaded: calls must not overlap. Kernels are host callables that declare the
// device bytes they read and write; their bodies run when the simulation reaches their end time.
// Set options::materialize = false for timing-only runs with sizes that do not fit host memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <queue>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock/detail/shadow.hpp>
#include <pipeswap/backend/mock/detail/vector_clock.hpp>
#include <pipeswap/backend/mock/hazard.hpp>
#include <pipeswap/backend/mock/timing.hpp>

namespace pipeswap::mock {

/// A stream of the mock backend. Stream 0 is the compute stream the backend starts with.
struct stream {
  std::uint32_t id = 0;
  friend constexpr bool operator==(stream, stream) noexcept = default;
};

/// A recorded point on a stream. A default-constructed event was never recorded; waiting on it is an
/// error.
struct event {
  std::uint64_t id = 0;
  std::uint32_t stream = 0;
  sim_time time = 0;
  detail::vector_clock clock;
  [[nodiscard]] bool recorded() const noexcept { return id != 0; }
};

/// A range of device bytes a kernel reads or writes.
struct region {
  device_ptr ptr;
  std::size_t bytes = 0;
};

/// What a kernel launch declares: its name (for traces and reports), the device bytes it only reads,
/// the bytes it writes (possibly reading them first), and an optional explicit duration.
struct kernel_desc {
  std::string name;
  std::vector<region> reads;
  std::vector<region> writes;
  std::optional<sim_time> cost;
};

/// Operation classes that fault injection can target.
enum class fault_site : std::uint8_t { copy, allocation, kernel };

/// Kinds of logged operation.
enum class op_kind : std::uint8_t {
  allocate, release, h2d, d2h, kernel, record, wait, host_sync, host_read, host_write,
  host_allocate, host_release
};

constexpr std::string_view to_string(op_kind k) noexcept {
  constexpr std::string_view names[] = {"allocate", "release", "h2d", "d2h", "kernel", "record",
                                        "wait", "host-sync", "host-read", "host-write",
                                        "host-allocate", "host-release"};
  return names[static_cast<int>(k)];
}

inline std::ostream& operator<<(std::ostream& os, op_kind k) { return os << to_string(k); }

/// Execution resources a timed operation occupies.
enum class engine : std::uint8_t { none, h2d, d2h, compute };

/// One entry of the operation log (and of the exported trace).
struct op_record {
  op_kind kind{};
  std::uint32_t agent = 0; ///< 0 = host thread, i + 1 = stream i
  std::uint64_t seq = 0;   ///< index of this op among its agent's ops (1-based)
  sim_time start = 0;
  sim_time end = 0;
  std::size_t bytes = 0;
  engine eng = engine::none;
  std::string name;
};

struct options {
  timing_model timing = timing_model::unit();
  hazard_policy hazards = hazard_policy::raise;
  /// Hold real bytes and run kernel bodies. Off: timing, accounting and hazards only.
  bool materialize = true;
  /// Device allocations that would make live bytes exceed this at their time throw mock_error.
  std::size_t device_capacity = std::numeric_limits<std::size_t>::max();
  /// Number of preceding operations quoted in a hazard report.
  std::size_t trace_context = 12;
};

class backend;

/// What a kernel body sees: typed views of the regions its launch declared. Asking for bytes outside
/// the declared regions throws mock_error (the launch must declare everything it touches).
class kernel_context {
public:
  template <class T>
  [[nodiscard]] std::span<T const> read(device_ptr p, std::size_t count) const {
    static_assert(std::is_trivially_copyable_v<T>);
    return {reinterpret_cast<T const*>(bytes(p, count * sizeof(T), false)), count};
  }
  template <class T>
  [[nodiscard]] std::span<T> write(device_ptr p, std::size_t count) const {
    static_assert(std::is_trivially_copyable_v<T>);
    return {reinterpret_cast<T*>(bytes(p, count * sizeof(T), true)), count};
  }

private:
  friend class backend;
  struct bound {
    device_ptr ptr;
    std::size_t bytes;
    bool writable;
    std::byte* data;
  };
  std::byte* bytes(device_ptr p, std::size_t n, bool writable) const;
  std::string name_;
  std::vector<bound> regions_;
};

/// The mock backend. See the header comment.
class backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = mock_error;
  using stream_type = stream;
  using event_type = event;
  using device_pointer = device_ptr;

  explicit backend(options opts = {}) : opts_(opts) {
    streams_.push_back(stream_state{"stream 0 (compute)"});
  }
  backend(backend const&) = delete;
  backend& operator=(backend const&) = delete;
  ~backend() {
    for (;;) { // a throwing kernel body must not escape a destructor: skip it and go on
      try {
        drain(std::numeric_limits<sim_time>::max());
        return;
      } catch (...) {
      }
    }
  }

  // ----- Backend concept ---------------------------------------------------------------------------

  [[nodiscard]] stream current_stream() const noexcept { return current_; }

  stream new_stream() { return new_stream("stream " + std::to_string(streams_.size())); }

  event record_event(stream s) {
    auto& st = state_of(s, "record_event");
    event e;
    e.id = ++event_ids_;
    e.stream = s.id;
    e.time = std::max(st.ready, host_now_);
    e.clock = st.clock;
    e.clock.join(host_clock_);
    log_op(op_kind::record, agent_of(s), st.seq, e.time, e.time, 0, engine::none,
           "record event " + std::to_string(e.id));
    return e;
  }

  void wait_event(stream s, event const& e) {
    auto& st = state_of(s, "wait_event");
    if (!e.recorded()) throw mock_error("mock::backend::wait_event: the event was never recorded");
    st.ready = std::max(st.ready, e.time);
    st.clock.join(e.clock);
    log_op(op_kind::wait, agent_of(s), st.seq, std::max(st.ready, host_now_),
           std::max(st.ready, host_now_), 0, engine::none,
           "wait event " + std::to_string(e.id) + " (" + streams_[e.stream].name + ")");
  }

  void synchronize(event const& e) {
    if (!e.recorded()) throw mock_error("mock::backend::synchronize: the event was never recorded");
    host_wait(e.time, e.clock, "synchronize event " + std::to_string(e.id));
  }

  device_ptr allocate_device(std::size_t n, stream s) {
    state_of(s, "allocate_device");
    if (n == 0) return device_ptr{};
    take_fault(fault_site::allocation, "allocate_device", n);
    auto const p = plan(s, 0, engine::none);
    if (opts_.device_capacity != std::numeric_limits<std::size_t>::max()) {
      auto const live = device_bytes_at(p.start);
      if (live + n > opts_.device_capacity) {
        throw mock_error("mock::backend::allocate_device: out of device memory allocating " +
                         std::to_string(n) + " bytes on " + streams_[s.id].name + " (" +
                         std::to_string(live) + " of " + std::to_string(opts_.device_capacity) +
                         " bytes live)");
      }
    }
    auto a = std::make_shared<allocation>();
    a->id = ++alloc_ids_;
    a->device = true;
    a->size = n;
    a->base = next_device_address_;
    next_device_address_ += round_up(n, 256) + 256; // a gap catches off-by-one neighbours
    if (opts_.materialize) a->fill_poison();
    auto const op = commit(s, p, op_kind::allocate, n, engine::none, label("allocate"));
    a->shadow.emplace(n, detail::access_ref{p.agent, p.seq, op});
    device_allocs_.emplace(a->base, a);
    mem_events_.push_back({p.start, static_cast<std::int64_t>(n), op});
    device_live_ += n;
    ++live_device_allocations_;
    return device_ptr(a->base);
  }

  void deallocate_device(device_ptr d, std::size_t n, stream s) {
    state_of(s, "deallocate_device");
    if (!d) return;
    auto a = find_device(d, "deallocate_device");
    if (a->base != d.address() || a->size != n) {
      throw mock_error("mock::backend::deallocate_device: " + describe_ptr(d) + " with " +
                       std::to_string(n) + " bytes does not name a whole allocation (allocation #" +
                       std::to_string(a->id) + " has " + std::to_string(a->size) + " bytes)");
    }
    auto const p = plan(s, 0, engine::none);
    touches t;
    t.add(a, 0, n, detail::access_mode::release);
    check(t, p, op_kind::release, label("release"));
    auto const op = commit(s, p, op_kind::release, n, engine::none, label("release"));
    a->released = true;
    a->release_op = op;
    mem_events_.push_back({p.start, -static_cast<std::int64_t>(n), op});
    device_live_ -= n;
    --live_device_allocations_;
    push_effect(p.end, op, [a] { a->free_storage(); });
  }

  std::byte* allocate_host(std::size_t n) {
    if (n == 0) return nullptr;
    take_fault(fault_site::allocation, "allocate_host", n);
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
      next_host_address_ += round_up(n, 256) + 256;
    }
    auto const op = host_op(op_kind::host_allocate, n, label("allocate pinned"));
    a->shadow.emplace(n, detail::access_ref{0, host_clock_.get(0), op});
    host_allocs_.emplace(a->base, a);
    host_live_ += n;
    host_peak_ = std::max(host_peak_, host_live_);
    return reinterpret_cast<std::byte*>(a->base);
  }

  void deallocate_host(std::byte* h, std::size_t n) {
    if (h == nullptr) return;
    auto a = find_host(h, "deallocate_host");
    if (a->base != reinterpret_cast<std::uintptr_t>(h) || a->size != n) {
      throw mock_error("mock::backend::deallocate_host: the pointer with " + std::to_string(n) +
                       " bytes does not name a whole pinned allocation (allocation #" +
                       std::to_string(a->id) + " has " + std::to_string(a->size) + " bytes)");
    }
    drain(host_now_);
    auto c = host_clock_;
    c.set(0, host_clock_.get(0) + 1);
    touches t;
    t.add(a, 0, n, detail::access_mode::release);
    planned p{0, c.get(0), host_now_, host_now_, c};
    check(t, p, op_kind::host_release, label("release pinned"));
    host_clock_ = c;
    auto const op = log_op(op_kind::host_release, 0, c.get(0), host_now_, host_now_, n, engine::none,
                           label("release pinned"));
    a->released = true;
    a->release_op = op;
    a->storage_gone = true; // the host frees at once; a racing copy finds nothing to write
    host_allocs_.erase(a->base);
    host_live_ -= n;
    if (a.use_count() > 1) graveyard_.push_back(std::move(a)); // bytes outlive pending effects
  }

  void copy_h2d(device_ptr d, std::byte const* h, std::size_t n, stream s) {
    state_of(s, "copy_h2d");
    if (n == 0) return;
    auto src = find_host(h, "copy_h2d source");
    auto dst = find_device(d, "copy_h2d destination");
    auto const so = range_in(*src, reinterpret_cast<std::uintptr_t>(h), n, "copy_h2d source");
    auto const dof = range_in(*dst, d.address(), n, "copy_h2d destination");
    take_fault(fault_site::copy, "copy_h2d", n);
    auto const p = plan(s, opts_.timing.h2d.duration(n), engine::h2d);
    touches t;
    t.add(src, so, so + n, detail::access_mode::read);
    t.add(dst, dof, dof + n, detail::access_mode::write);
    check(t, p, op_kind::h2d, label("H2D " + bytes_text(n)));
    auto const op = commit(s, p, op_kind::h2d, n, engine::h2d, label("H2D " + bytes_text(n)));
    record(t, p, op);
    bytes_h2d_ += n;
    if (opts_.materialize) {
      push_effect(p.end, op, [src, dst, so, dof, n] {
        if (!src->storage_gone && !dst->storage_gone) std::memcpy(dst->data + dof, src->data + so, n);
      });
    }
  }

  void copy_d2h(std::byte* h, device_ptr d, std::size_t n, stream s) {
    state_of(s, "copy_d2h");
    if (n == 0) return;
    auto src = find_device(d, "copy_d2h source");
    auto dst = find_host(h, "copy_d2h destination");
    auto const so = range_in(*src, d.address(), n, "copy_d2h source");
    auto const dof = range_in(*dst, reinterpret_cast<std::uintptr_t>(h), n, "copy_d2h destination");
    take_fault(fault_site::copy, "copy_d2h", n);
    auto const p = plan(s, opts_.timing.d2h.duration(n), engine::d2h);
    touches t;
    t.add(src, so, so + n, detail::access_mode::read);
    t.add(dst, dof, dof + n, detail::access_mode::write);
    check(t, p, op_kind::d2h, label("D2H " + bytes_text(n)));
    auto const op = commit(s, p, op_kind::d2h, n, engine::d2h, label("D2H " + bytes_text(n)));
    record(t, p, op);
    bytes_d2h_ += n;
    if (opts_.materialize) {
      push_effect(p.end, op, [src, dst, so, dof, n] {
        if (!src->storage_gone && !dst->storage_gone) std::memcpy(dst->data + dof, src->data + so, n);
      });
    }
  }

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
    log_op(op_kind::wait, agent_of(s), st.seq, std::max(st.ready, host_now_), std::max(st.ready, host_now_),
           0, engine::none, std::string(what));
  }

  /// A new stream with a name for traces and reports.
  stream new_stream(std::string name) {
    streams_.push_back(stream_state{std::move(name)});
    return stream{static_cast<std::uint32_t>(streams_.size() - 1)};
  }

  void set_current_stream(stream s) {
    state_of(s, "set_current_stream");
    current_ = s;
  }

  [[nodiscard]] std::string const& stream_name(stream s) const { return streams_.at(s.id).name; }

  /// Enqueues a kernel on `s`. `body` runs when the simulation reaches the kernel's end, with views
  /// of exactly the declared regions. Declared regions are checked like copies: reads must be ordered
  /// after their writes; writes after every unordered use.
  void launch(stream s, kernel_desc desc, std::function<void(kernel_context const&)> body = {}) {
    state_of(s, "launch");
    take_fault(fault_site::kernel, "launch '" + desc.name + "'", 0);
    touches t;
    std::size_t touched = 0;
    kernel_context ctx;
    ctx.name_ = desc.name;
    auto bind = [&](region const& r, bool writable) {
      if (r.bytes == 0) return;
      auto a = find_device(r.ptr, "launch '" + desc.name + "' region");
      auto const off = range_in(*a, r.ptr.address(), r.bytes, "launch '" + desc.name + "' region");
      t.add(a, off, off + r.bytes,
            writable ? detail::access_mode::read_write : detail::access_mode::read);
      ctx.regions_.push_back({r.ptr, r.bytes, writable, nullptr});
      touched += r.bytes;
    };
    for (auto const& r : desc.reads) bind(r, false);
    for (auto const& r : desc.writes) bind(r, true);
    auto const cost = desc.cost ? *desc.cost : opts_.timing.kernel_duration(touched);
    auto const p = plan(s, cost, opts_.timing.concurrent_kernels ? engine::none : engine::compute);
    check(t, p, op_kind::kernel, label(desc.name));
    auto const op = commit(s, p, op_kind::kernel, touched,
                           opts_.timing.concurrent_kernels ? engine::none : engine::compute,
                           label(desc.name));
    record(t, p, op);
    if (opts_.materialize && body) {
      auto allocs = t.allocations();
      push_effect(p.end, op, [allocs = std::move(allocs), ctx = std::move(ctx),
                              body = std::move(body)]() mutable {
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
    log_op(op_kind::host_sync, 0, host_clock_.get(0), start, host_now_, 0, engine::none,
           std::string(what));
  }

  /// Test peek: synchronizes the device, then returns a copy of device bytes.
  [[nodiscard]] std::vector<std::byte> read_device(device_ptr d, std::size_t n) {
    synchronize_device();
    if (n == 0) return {};
    auto a = find_device(d, "read_device");
    auto const off = range_in(*a, d.address(), n, "read_device");
    if (a->released) throw mock_error("mock::backend::read_device: allocation was released");
    if (!opts_.materialize) throw mock_error("mock::backend::read_device: backend holds no bytes");
    return {a->data + off, a->data + off + n};
  }

  /// Test poke: synchronizes the device, then writes device bytes from the host (like a blocking
  /// cudaMemcpy). Later work on any stream is ordered after it.
  void write_device(device_ptr d, std::span<std::byte const> bytes) {
    synchronize_device();
    if (bytes.empty()) return;
    auto a = find_device(d, "write_device");
    auto const off = range_in(*a, d.address(), bytes.size(), "write_device");
    if (a->released) throw mock_error("mock::backend::write_device: allocation was released");
    host_clock_.set(0, host_clock_.get(0) + 1);
    auto const op = log_op(op_kind::host_write, 0, host_clock_.get(0), host_now_, host_now_,
                           bytes.size(), engine::none, label("write_device"));
    a->shadow->record(off, off + bytes.size(), detail::access_mode::write,
                      {0, host_clock_.get(0), op}, host_clock_);
    if (opts_.materialize) std::memcpy(a->data + off, bytes.data(), bytes.size());
  }

  /// Makes the operation of class `site` that comes after the next `n` such operations throw
  /// mock_error, once. The failing call has no effect.
  void fail_after(fault_site site, std::size_t n) {
    faults_[static_cast<int>(site)] = attempts_[static_cast<int>(site)] + n;
  }
  void clear_faults() noexcept {
    for (auto& f : faults_) f.reset();
  }
  /// Number of operations of class `site` attempted so far (including failed ones).
  [[nodiscard]] std::size_t attempts(fault_site site) const noexcept {
    return attempts_[static_cast<int>(site)];
  }

  [[nodiscard]] std::vector<hazard> const& hazards() const noexcept { return hazards_; }
  void clear_hazards() noexcept { hazards_.clear(); }
  void set_hazard_policy(hazard_policy p) noexcept { opts_.hazards = p; }
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

  /// Device bytes allocated and not yet released, counting in enqueue order.
  [[nodiscard]] std::size_t device_bytes_in_use() const noexcept { return device_live_; }
  [[nodiscard]] std::size_t live_device_allocations() const noexcept {
    return live_device_allocations_;
  }
  /// Highest device bytes live at any simulated instant (allocations and releases placed at their
  /// simulated times; at equal times in the order they were enqueued).
  [[nodiscard]] std::size_t peak_device_bytes() const {
    std::int64_t live = 0, peak = 0;
    for (auto const& e : sorted_mem_events()) peak = std::max(peak, live += e.delta);
    return static_cast<std::size_t>(peak);
  }
  /// (time, live bytes) after the changes at each instant, in simulated-time order.
  [[nodiscard]] std::vector<std::pair<sim_time, std::size_t>> device_memory_timeline() const {
    auto ev = sorted_mem_events();
    std::vector<std::pair<sim_time, std::size_t>> out;
    std::int64_t live = 0;
    for (auto const& e : ev) {
      live += e.delta;
      if (!out.empty() && out.back().first == e.time) out.back().second = static_cast<std::size_t>(live);
      else out.emplace_back(e.time, static_cast<std::size_t>(live));
    }
    return out;
  }
  [[nodiscard]] std::size_t host_bytes_in_use() const noexcept { return host_live_; }
  [[nodiscard]] std::size_t peak_host_bytes() const noexcept { return host_peak_; }
  [[nodiscard]] std::size_t bytes_copied_h2d() const noexcept { return bytes_h2d_; }
  [[nodiscard]] std::size_t bytes_copied_d2h() const noexcept { return bytes_d2h_; }

  [[nodiscard]] std::vector<op_record> const& ops() const noexcept { return log_; }

  /// Writes the timeline as Chrome trace JSON (Perfetto and chrome://tracing open it): one lane per
  /// stream, one per copy engine and the compute engine, a host lane, and a device-memory counter.
  /// Output depends only on the sequence of calls, never on host addresses or wall time.
  void write_chrome_trace(std::ostream& os) const;

  /// Writes this device's trace events (no enclosing object) as process `pid` named `name`, so that
  /// several simulated devices can share one trace. `first` is true until an event was written.
  void write_trace_events(std::ostream& os, bool& first, int pid, std::string_view name) const;

  /// The op trace that ends at operation `op` (at most `count` entries), one line per operation.
  [[nodiscard]] std::string format_trace(std::uint64_t op, std::size_t count) const {
    std::ostringstream os;
    std::uint64_t const first = op + 1 > count ? op + 1 - count : 0;
    for (std::uint64_t i = first; i <= op && i < log_.size(); ++i) os << "  " << describe_op(i) << "\n";
    return os.str();
  }

  [[nodiscard]] std::string describe_op(std::uint64_t i) const {
    auto const& r = log_.at(i);
    std::ostringstream os;
    os << "#" << i << " " << to_string(r.kind) << " '" << r.name << "' on "
       << (r.agent == 0 ? std::string("host") : streams_[r.agent - 1].name) << " t=[" << r.start
       << "," << r.end << ")";
    return os.str();
  }

private:
  struct stream_state {
    explicit stream_state(std::string n) : name(std::move(n)) {}
    std::string name;
    sim_time ready = 0;
    std::uint64_t seq = 0;
    detail::vector_clock clock;
  };

  struct allocation {
    std::uint64_t id = 0;
    bool device = true;
    std::uintptr_t base = 0;
    std::size_t size = 0;
    std::byte* data = nullptr;
    bool released = false;
    bool storage_gone = false;
    std::uint64_t release_op = 0;
    std::optional<detail::shadow_map> shadow;

    void fill_poison() {
      data = static_cast<std::byte*>(::operator new(size, std::align_val_t{256}));
      std::memset(data, 0xCD, size);
    }
    void free_storage() noexcept {
      storage_gone = true;
      if (data != nullptr) ::operator delete(data, std::align_val_t{256});
      data = nullptr;
    }
    allocation() = default;
    allocation(allocation const&) = delete;
    allocation& operator=(allocation const&) = delete;
    ~allocation() { free_storage(); }
  };
  using alloc_ptr = std::shared_ptr<allocation>;

  struct planned {
    std::uint32_t agent = 0;
    std::uint64_t seq = 0;
    sim_time start = 0, end = 0;
    detail::vector_clock clock;
  };

  struct touches {
    struct one {
      alloc_ptr a;
      std::size_t lo, hi;
      detail::access_mode mode;
    };
    std::vector<one> list;
    void add(alloc_ptr a, std::size_t lo, std::size_t hi, detail::access_mode m) {
      list.push_back({std::move(a), lo, hi, m});
    }
    [[nodiscard]] std::vector<alloc_ptr> allocations() const {
      std::vector<alloc_ptr> out;
      for (auto const& t : list) out.push_back(t.a);
      return out;
    }
  };

  struct mem_event {
    sim_time time;
    std::int64_t delta;
    std::uint64_t op;
  };

  struct effect {
    sim_time end;
    std::uint64_t op;
    std::function<void()> fn;
  };
  struct effect_later {
    bool operator()(effect const& a, effect const& b) const noexcept {
      return a.end != b.end ? a.end > b.end : a.op > b.op;
    }
  };

  static constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
  static std::uint32_t agent_of(stream s) noexcept { return s.id + 1; }
  static std::string bytes_text(std::size_t n) { return std::to_string(n) + " B"; }

  std::string label(std::string what) const {
    return label_.empty() ? what : what + " · " + label_;
  }

  stream_state& state_of(stream s, char const* call) {
    if (s.id >= streams_.size()) {
      throw mock_error(std::string("mock::backend::") + call + ": unknown stream " +
                       std::to_string(s.id));
    }
    return streams_[s.id];
  }
  stream_state const& state_of(stream s, char const* call) const {
    return const_cast<backend*>(this)->state_of(s, call);
  }

  void take_fault(fault_site site, std::string const& what, std::size_t n) {
    auto const i = static_cast<int>(site);
    auto const index = attempts_[i]++;
    if (faults_[i] && *faults_[i] == index) {
      faults_[i].reset();
      constexpr char const* names[] = {"copy", "allocation", "kernel"};
      throw mock_error("mock::backend: injected fault in " + what + " (" + names[i] + " #" +
                       std::to_string(index) + (n ? ", " + std::to_string(n) + " bytes" : "") + ")");
    }
  }

  planned plan(stream s, sim_time duration, engine e) const {
    auto const& st = streams_[s.id];
    planned p;
    p.agent = agent_of(s);
    p.seq = st.seq + 1;
    p.start = std::max(st.ready, host_now_);
    if (e != engine::none) p.start = std::max(p.start, engine_free_[static_cast<int>(e)]);
    p.end = p.start + duration;
    p.clock = st.clock;
    p.clock.join(host_clock_);
    p.clock.set(p.agent, p.seq);
    return p;
  }

  std::uint64_t commit(stream s, planned const& p, op_kind k, std::size_t bytes, engine e,
                       std::string name) {
    auto& st = streams_[s.id];
    st.seq = p.seq;
    st.ready = p.end;
    st.clock = p.clock;
    if (e != engine::none) engine_free_[static_cast<int>(e)] = p.end;
    return log_op(k, p.agent, p.seq, p.start, p.end, bytes, e, std::move(name));
  }

  std::uint64_t log_op(op_kind k, std::uint32_t agent, std::uint64_t seq, sim_time start,
                       sim_time end, std::size_t bytes, engine e, std::string name) {
    log_.push_back(op_record{k, agent, seq, start, end, bytes, e, std::move(name)});
    return log_.size() - 1;
  }

  std::uint64_t host_op(op_kind k, std::size_t bytes, std::string name) {
    host_clock_.set(0, host_clock_.get(0) + 1);
    return log_op(k, 0, host_clock_.get(0), host_now_, host_now_, bytes, engine::none,
                  std::move(name));
  }

  void host_wait(sim_time t, detail::vector_clock const& c, std::string what) {
    auto const start = host_now_;
    host_now_ = std::max(host_now_, t);
    host_clock_.join(c);
    host_clock_.set(0, host_clock_.get(0) + 1);
    log_op(op_kind::host_sync, 0, host_clock_.get(0), start, host_now_, 0, engine::none,
           std::move(what));
    drain(host_now_);
  }

  void host_access(std::byte const* h, std::size_t n, bool write) {
    if (n == 0) return;
    auto a = find_host(h, write ? "note_host_write" : "note_host_read");
    auto const off = range_in(*a, reinterpret_cast<std::uintptr_t>(h), n,
                              write ? "note_host_write" : "note_host_read");
    drain(host_now_);
    auto c = host_clock_;
    c.set(0, host_clock_.get(0) + 1);
    planned p{0, c.get(0), host_now_, host_now_, c};
    touches t;
    t.add(a, off, off + n, write ? detail::access_mode::write : detail::access_mode::read);
    auto const kind = write ? op_kind::host_write : op_kind::host_read;
    check(t, p, kind, label(write ? "host write" : "host read"));
    host_clock_ = c;
    auto const op = log_op(kind, 0, c.get(0), host_now_, host_now_, n, engine::none,
                           label(write ? "host write" : "host read"));
    record(t, p, op);
  }

  alloc_ptr find_device(device_ptr d, std::string const& what) const {
    auto it = device_allocs_.upper_bound(d.address());
    if (it != device_allocs_.begin()) {
      --it;
      if (d.address() < it->second->base + it->second->size) return it->second;
    }
    throw mock_error("mock::backend::" + what + ": " + describe_ptr(d) +
                     " is not device memory allocated by this backend");
  }

  alloc_ptr find_host(std::byte const* h, std::string const& what) const {
    auto const addr = reinterpret_cast<std::uintptr_t>(h);
    auto it = host_allocs_.upper_bound(addr);
    if (it != host_allocs_.begin()) {
      --it;
      if (addr < it->second->base + it->second->size) return it->second;
    }
    throw mock_error("mock::backend::" + what +
                     ": the host pointer is not pinned memory allocated by this backend (pageable "
                     "memory would make the copy synchronous)");
  }

  static std::string describe_ptr(device_ptr d) {
    std::ostringstream os;
    os << "device address 0x" << std::hex << d.address();
    return os.str();
  }

  std::size_t range_in(allocation const& a, std::uintptr_t addr, std::size_t n,
                       std::string const& what) const {
    auto const off = static_cast<std::size_t>(addr - a.base);
    if (off + n > a.size) {
      throw mock_error("mock::backend::" + what + ": bytes [" + std::to_string(off) + ", " +
                       std::to_string(off + n) + ") exceed " + (a.device ? "device" : "pinned") +
                       " allocation #" + std::to_string(a.id) + " of " + std::to_string(a.size) +
                       " bytes");
    }
    return off;
  }

  std::string storage_text(allocation const& a, std::size_t lo, std::size_t hi) const {
    return std::string(a.device ? "device" : "pinned host") + " allocation #" +
           std::to_string(a.id) + " bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ")";
  }

  std::string op_text(std::uint64_t op, op_kind k, std::string const& name, std::uint32_t agent,
                      sim_time start, sim_time end) const {
    std::ostringstream os;
    os << to_string(k) << " '" << name << "' (op #" << op << " on "
       << (agent == 0 ? std::string("host") : streams_[agent - 1].name) << ", t=[" << start << ","
       << end << "))";
    return os.str();
  }

  /// Checks every touch of an operation about to be committed. Under `raise` throws before any state
  /// changes; under `record` appends one report per conflicting touch.
  void check(touches const& t, planned const& p, op_kind k, std::string const& name) {
    if (opts_.hazards == hazard_policy::ignore) return;
    auto const op = static_cast<std::uint64_t>(log_.size());
    for (auto const& x : t.list) {
      std::optional<hazard> h;
      auto const self = op_text(op, k, name, p.agent, p.start, p.end);
      if (x.a->released) {
        auto const& r = log_[x.a->release_op];
        h = hazard{hazard_kind::use_after_release, op, x.a->release_op, x.a->id, x.lo, x.hi - x.lo,
                   self + " uses " + storage_text(*x.a, x.lo, x.hi) + " after " +
                       op_text(x.a->release_op, r.kind, r.name, r.agent, r.start, r.end) +
                       " released it"};
      } else if (auto c = x.a->shadow->check(x.lo, x.hi, x.mode, p.clock)) {
        auto const& r = log_[c->other.op];
        auto const other = op_text(c->other.op, r.kind, r.name, r.agent, r.start, r.end);
        hazard_kind kind{};
        std::string rule;
        if (x.mode == detail::access_mode::release) {
          kind = hazard_kind::release_while_in_use;
          rule = " releases " + storage_text(*x.a, 0, x.a->size) + " while " + other +
                 " still uses bytes [" + std::to_string(c->lo) + ", " + std::to_string(c->hi) +
                 ") and is not ordered before the release";
        } else if (r.kind == op_kind::allocate) {
          kind = hazard_kind::read_before_write;
          rule = " uses " + storage_text(*x.a, c->lo, c->hi) + " allocated by " + other +
                 ", which is not ordered before it (stream-ordered memory is usable only by work "
                 "ordered after its allocation)";
        } else if (c->other_wrote && x.mode != detail::access_mode::write) {
          bool const host_after_d2h = p.agent == 0 && r.kind == op_kind::d2h;
          kind = host_after_d2h ? hazard_kind::unsynchronized_host_read : hazard_kind::read_before_write;
          rule = " reads " + storage_text(*x.a, c->lo, c->hi) + " written by " + other +
                 (host_after_d2h ? ", which the host has not synchronized with (synchronize an event "
                                   "recorded after the copy first)"
                                 : ", which is not ordered before it (missing wait_event?)");
        } else {
          kind = hazard_kind::write_while_in_use;
          rule = " writes " + storage_text(*x.a, c->lo, c->hi) + " while " + other + " still " +
                 (c->other_wrote ? "writes" : "reads") + " it and is not ordered before the write";
        }
        h = hazard{kind, op, c->other.op, x.a->id, c->lo, c->hi - c->lo, self + rule};
      }
      if (!h) continue;
      h->message = "pipeswap mock: " + std::string(to_string(h->kind)) + ": " + h->message +
                   "\nop trace (oldest first):\n" + format_trace_until(op, k, name, p);
      if (opts_.hazards == hazard_policy::raise) throw hazard_error(std::move(*h));
      hazards_.push_back(std::move(*h));
    }
  }

  std::string format_trace_until(std::uint64_t op, op_kind k, std::string const& name,
                                 planned const& p) const {
    std::string s = op == 0 ? std::string{} : format_trace(op - 1, opts_.trace_context);
    std::ostringstream os;
    os << "  #" << op << " " << to_string(k) << " '" << name << "' on "
       << (p.agent == 0 ? std::string("host") : streams_[p.agent - 1].name) << " t=[" << p.start << ","
       << p.end << ")   <-- offending operation\n";
    return s + os.str();
  }

  void record(touches const& t, planned const& p, std::uint64_t op) {
    for (auto const& x : t.list) {
      if (x.a->released) continue;
      x.a->shadow->record(x.lo, x.hi, x.mode, {p.agent, p.seq, op}, p.clock);
    }
  }

  void push_effect(sim_time end, std::uint64_t op, std::function<void()> fn) {
    effects_.push(effect{end, op, std::move(fn)});
  }

  /// Applies every pending data effect whose end time is at most `t`, in (end, op) order.
  void drain(sim_time t) {
    while (!effects_.empty() && effects_.top().end <= t) {
      auto fn = std::move(const_cast<effect&>(effects_.top()).fn);
      effects_.pop();
      fn();
    }
    std::erase_if(graveyard_, [](alloc_ptr const& a) { return a.use_count() == 1; });
  }

  std::vector<mem_event> sorted_mem_events() const {
    auto ev = mem_events_;
    std::stable_sort(ev.begin(), ev.end(), [](mem_event const& a, mem_event const& b) {
      return a.time != b.time ? a.time < b.time : a.op < b.op;
    });
    return ev;
  }

  std::size_t device_bytes_at(sim_time t) const {
    std::int64_t live = 0;
    for (auto const& e : mem_events_) if (e.time <= t) live += e.delta;
    return static_cast<std::size_t>(std::max<std::int64_t>(live, 0));
  }

  options opts_;
  std::vector<stream_state> streams_;
  stream current_{};
  sim_time host_now_ = 0;
  detail::vector_clock host_clock_;
  sim_time engine_free_[4] = {0, 0, 0, 0};
  std::uint64_t event_ids_ = 0;
  std::uint64_t alloc_ids_ = 0;
  std::uintptr_t next_device_address_ = std::uintptr_t{1} << 40;
  std::uintptr_t next_host_address_ = std::uintptr_t{1} << 46;
  std::map<std::uintptr_t, alloc_ptr> device_allocs_;
  std::map<std::uintptr_t, alloc_ptr> host_allocs_;
  std::vector<alloc_ptr> graveyard_;
  std::vector<op_record> log_;
  std::vector<hazard> hazards_;
  std::vector<mem_event> mem_events_;
  std::priority_queue<effect, std::vector<effect>, effect_later> effects_;
  std::string label_;
  std::size_t device_live_ = 0;
  std::size_t live_device_allocations_ = 0;
  std::size_t host_live_ = 0;
  std::size_t host_peak_ = 0;
  std::size_t bytes_h2d_ = 0;
  std::size_t bytes_d2h_ = 0;
  std::size_t attempts_[3] = {0, 0, 0};
  std::optional<std::size_t> faults_[3];
};

static_assert(pipeswap::backend<backend>);

// ----- out-of-line members -------------------------------------------------------------------------

inline std::byte* kernel_context::bytes(device_ptr p, std::size_t n, bool writable) const {
  if (n == 0) return nullptr;
  for (auto const& r : regions_) {
    if (p.address() >= r.ptr.address() && p.address() + n <= r.ptr.address() + r.bytes) {
      if (writable && !r.writable) {
        throw mock_error("mock kernel '" + name_ + "' writes bytes it declared as read-only");
      }
      return r.data + (p.address() - r.ptr.address());
    }
  }
  throw mock_error("mock kernel '" + name_ + "' touches " + std::to_string(n) +
                   " bytes outside the regions its launch declared");
}

namespace detail {

inline void json_string(std::ostream& os, std::string_view s) {
  os << '"';
  for (char ch : s) {
    auto const c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') os << '\\' << ch;
    else if (c < 0x20) {
      constexpr char hex[] = "0123456789abcdef";
      os << "\\u00" << hex[c >> 4] << hex[c & 15];
    } else os << ch;
  }
  os << '"';
}

/// Nanoseconds as microseconds with exactly three decimals, from integers only.
inline void json_us(std::ostream& os, sim_time ns) {
  auto const neg = ns < 0;
  auto const a = neg ? -ns : ns;
  auto const frac = a % 1000;
  os << (neg ? "-" : "") << a / 1000 << '.' << static_cast<char>('0' + frac / 100)
     << static_cast<char>('0' + frac / 10 % 10) << static_cast<char>('0' + frac % 10);
}

} // namespace detail

inline void backend::write_chrome_trace(std::ostream& os) const {
  bool first = true;
  os << R"({"displayTimeUnit":"ns","traceEvents":[)";
  write_trace_events(os, first, 1, "pipeswap mock device");
  os << "\n]}\n";
}

inline void backend::write_trace_events(std::ostream& os, bool& first, int pid,
                                        std::string_view process) const {
  constexpr int engine_tid_base = 1'000'000;
  constexpr char const* engine_names[] = {"", "H2D copy engine", "D2H copy engine", "compute engine"};
  auto sep = [&] {
    os << (first ? "\n" : ",\n");
    first = false;
  };
  auto lane = [&](int tid, std::string_view name, int order) {
    sep();
    os << R"({"name":"thread_name","ph":"M","pid":)" << pid << R"(,"tid":)" << tid << R"(,"args":{"name":)";
    detail::json_string(os, name);
    os << "}}";
    sep();
    os << R"({"name":"thread_sort_index","ph":"M","pid":)" << pid << R"(,"tid":)" << tid
       << R"(,"args":{"sort_index":)" << order << "}}";
  };
  sep();
  os << R"({"name":"process_name","ph":"M","pid":)" << pid << R"(,"tid":0,"args":{"name":)";
  detail::json_string(os, process);
  os << "}}";
  sep();
  os << R"({"name":"process_sort_index","ph":"M","pid":)" << pid << R"(,"tid":0,"args":{"sort_index":)" << pid
     << "}}";
  lane(0, "host", 0);
  for (std::size_t i = 0; i < streams_.size(); ++i) lane(static_cast<int>(i + 1), streams_[i].name, static_cast<int>(i + 1));
  for (int e = 1; e <= 3; ++e) lane(engine_tid_base + e, engine_names[e], 1000 + e);

  auto event = [&](op_record const& r, std::uint64_t i, int tid) {
    sep();
    os << R"({"name":)";
    detail::json_string(os, r.name);
    os << R"(,"cat":")" << to_string(r.kind) << '"';
    if (r.end > r.start) {
      os << R"(,"ph":"X","ts":)";
      detail::json_us(os, r.start);
      os << R"(,"dur":)";
      detail::json_us(os, r.end - r.start);
    } else {
      os << R"(,"ph":"i","s":"t","ts":)";
      detail::json_us(os, r.start);
    }
    os << R"(,"pid":)" << pid << R"(,"tid":)" << tid << R"(,"args":{"op":)" << i << R"(,"bytes":)" << r.bytes
       << "}}";
  };
  for (std::uint64_t i = 0; i < log_.size(); ++i) {
    auto const& r = log_[i];
    event(r, i, static_cast<int>(r.agent));
    if (r.eng != engine::none) event(r, i, engine_tid_base + static_cast<int>(r.eng));
  }
  std::int64_t live = 0;
  for (auto const& e : sorted_mem_events()) {
    live += e.delta;
    sep();
    os << R"({"name":"device bytes","ph":"C","pid":)" << pid << R"(,"tid":0,"ts":)";
    detail::json_us(os, e.time);
    os << R"(,"args":{"bytes":)" << live << "}}";
  }
}

} // namespace pipeswap::mock
