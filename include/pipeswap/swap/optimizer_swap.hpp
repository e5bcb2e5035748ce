// pipeswap — the optimizer-state swap runtime.
//
// optimizer_swap<O, Partition> keeps an optimizer's swappable state in pinned host memory between
// steps and streams it through the device during step(), in batches chosen by the partition policy:
//
// Per-tensor pipeline (the reference order, one batch ahead):
//     prefetch(0)
//     for n: wait_prefetch(n); wait_offload(n-1); prefetch(n+1); update(n); offload(n)
//     wait_offload(last)
//   Each piece gets its own device storage, allocated on the h2d stream behind the offload that
//   freed the batch before (so at most two batches are resident) and released on the d2h stream
//   behind its own D2H. The compute stream waits only for the loads it consumes.
//
// Packed pipeline (two staging arenas, batch n in arena n % 2):
//     begin; prefetch(0, 0); prefetch(1, 1)
//     for n: wait_prefetch(n); [n ≥ 2: wait_offload(n-2); finish_offload(n-2)]; activate(n);
//            update(n); chain(n, n+2): D2H of n out of its arena, then H2D of n+2 into it
//     drain the last two; end
//   Swappable state lives in one exact-size pinned host arena per dtype, in slot order, so a batch is
//   a few large copies (one per contiguous host run). The D2H of n and the H2D of n+2 are chained
//   through an event; the compute stream only ever waits events.
//
// Guarantees (docs/guarantees.md): results are bit-identical to the same optimizer without swap;
// device memory holds at most the resident (non-swappable) state plus two batches (per-tensor) or
// two arenas (packed); every release is stream-ordered behind the copy that reads it. If step()
// throws, transfers in flight are drained, no piece is left in d2h or h2d, every state is intact, and
// the next step() resumes the interrupted step from the batch that failed (the same gradients must
// still be in place) — or discard_interrupted_step() abandons it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/swap/partition.hpp>
#include <pipeswap/swap/slot.hpp>

namespace pipeswap {

/// Runtime knobs of optimizer_swap (the reference's SwapOptimizerConfig).
struct swap_config {
  /// Number of batches a step is split into (clamped to the number of units); must be positive.
  std::size_t swap_times = 16;
  /// State keys eligible for swap, by name; empty optional = every supported key.
  std::optional<std::vector<std::string>> state_keys;
  /// Slots with fewer elements stay on the device.
  std::size_t min_numel = 1024;
  /// Use the packed pipeline (two staging arenas) instead of per-tensor storage.
  bool packed = true;

  void validate() const {
    if (swap_times == 0) throw invalid_argument("SwapOptimizerConfig.swap_times must be positive.");
    if (state_keys) (void)validate_state_keys(*state_keys);
  }
};

/// Which pipeline a runtime runs.
enum class swap_pipeline : std::uint8_t { per_tensor, packed };

template <swap_optimizer O, partition_policy P = balanced_partition>
class optimizer_swap {
public:
  using optimizer_type = O;
  using backend_type = typename O::backend_type;
  using B = backend_type;
  using slot_type = swap_slot<B>;
  using buffer = swap_buffer<B>;
  /// Receives "op:batch[:arena]" for every pipeline operation, in order (tests, tracing, progress).
  using listener = std::function<void(std::string_view)>;

  optimizer_swap(transfer_engine<B>& engine, O& opt, swap_config cfg = {}, P policy = {})
      : x_(engine), b_(engine.backend()), opt_(opt), cfg_(std::move(cfg)), policy_(policy) {
    cfg_.validate();
    opt_.validate();
    if constexpr (P::splits_units) {
      static_assert(O::splittable, "split_partition needs an optimizer whose update is elementwise");
    }
    if (cfg_.state_keys) {
      keys_ = validate_state_keys(*cfg_.state_keys);
    } else {
      keys_.assign(supported_state_keys.begin(), supported_state_keys.end());
    }
    try {
      materialize();
    } catch (...) {
      release_all();
      throw;
    }
  }

  optimizer_swap(optimizer_swap const&) = delete;
  optimizer_swap& operator=(optimizer_swap const&) = delete;

  ~optimizer_swap() { release_all(); }

  /// Runs one optimizer step (or completes an interrupted one). See the header comment.
  void step() {
    evacuate_stranded();
    if (!pending_) pending_.emplace(step_state{opt_.prepare_step(), nullptr, 0});
    auto& st = *pending_;
    if (!st.d) plan_step(st);
    if (cfg_.packed) {
      run_packed(st);
    } else {
      try {
        run_per_tensor(st);
      } catch (...) {
        recover_per_tensor(st);
        throw;
      }
    }
    opt_.finish_step(st.ctx);
    pending_.reset();
  }

  /// True after step() threw: the next step() finishes that step.
  [[nodiscard]] bool has_interrupted_step() const noexcept { return pending_.has_value(); }
  /// Abandons an interrupted step: batches already updated stay updated, the rest are not.
  void discard_interrupted_step() noexcept { pending_.reset(); }

  /// Quiesces for a checkpoint: every swappable piece ends host-resident with its mirror complete and
  /// host-synchronized, device storage released (reference synchronize_cpu_mirrors). Must not be
  /// called from inside a step (it is not reentrant).
  void synchronize_cpu_mirrors() {
    evacuate_stranded();
    auto bufs = swappable_pieces();
    x_.synchronize_to_host(bufs);
  }

  void set_listener(listener l) { listener_ = std::move(l); }

  [[nodiscard]] O& optimizer() noexcept { return opt_; }
  [[nodiscard]] transfer_engine<B>& engine() noexcept { return x_; }
  [[nodiscard]] swap_config const& config() const noexcept { return cfg_; }
  [[nodiscard]] swap_pipeline pipeline() const noexcept {
    return cfg_.packed ? swap_pipeline::packed : swap_pipeline::per_tensor;
  }
  /// The batches of the last step.
  [[nodiscard]] batch_plan const& last_plan() const noexcept { return last_plan_; }
  /// Device bytes of state that never leaves the device.
  [[nodiscard]] std::size_t resident_bytes() const noexcept { return resident_bytes_; }
  /// Bytes of state that is swapped.
  [[nodiscard]] std::size_t swappable_bytes() const noexcept { return swappable_bytes_; }
  /// Bytes of the larger staging arena of the last packed step (0 for per-tensor).
  [[nodiscard]] std::size_t arena_bytes() const noexcept { return arena_bytes_; }
  /// Bytes of the largest batch of the last step.
  [[nodiscard]] std::size_t max_batch_bytes() const noexcept { return max_batch_bytes_; }
  /// Pinned bytes of the packed host arenas (0 for per-tensor).
  [[nodiscard]] std::size_t host_arena_bytes() const noexcept {
    std::size_t n = 0;
    for (auto const& [t, a] : host_arenas_) n += a.bytes;
    return n;
  }

private:
  struct run {
    dtype type;
    std::size_t host_lo, host_hi; ///< byte range in the host arena of `type`
    std::size_t arena_off;        ///< byte offset in the staging arena
  };
  /// Where each piece of a batch sits in the staging arena (packed pipeline).
  struct packed_layout {
    std::vector<run> runs;
    std::vector<std::size_t> piece_run; ///< for bufs[n][i], its run
    std::vector<std::size_t> piece_lo;  ///< for bufs[n][i], its byte offset in its host arena
  };
  /// A step's partition and the pieces it moves. Immutable once built; shared by every step whose
  /// units and slot layout are the same, so a steady training loop plans once.
  struct plan_data {
    batch_plan plan;
    std::vector<std::vector<buffer*>> bufs; // unique swappable pieces per batch
    std::vector<std::vector<dtype>> types;  // the dtype of each of them
    std::vector<packed_layout> packed;      // per batch (packed pipeline only)
    std::size_t arena_size = 0;
    std::size_t max_batch_bytes = 0;
  };
  struct step_state {
    typename O::step_context ctx;
    std::shared_ptr<plan_data const> d; // null until planned
    std::size_t next = 0;               // first batch not yet updated
  };

  // ----- construction and teardown -----------------------------------------------------------------

  [[nodiscard]] bool eligible(slot_type const& s) const {
    return s.numel > 0 && s.numel >= cfg_.min_numel &&
           std::find(keys_.begin(), keys_.end(), s.key) != keys_.end();
  }

  void materialize() {
    auto slots = opt_.slots();
    // Packed host arenas: one per dtype, slots in order, exact size.
    if (cfg_.packed) {
      std::map<dtype, std::size_t> sizes;
      for (auto* s : slots) {
        if (!eligible(*s)) continue;
        s->packed = true;
        s->host_offset = sizes[s->type];
        sizes[s->type] += s->bytes();
      }
      for (auto [t, n] : sizes) {
        auto blk = x_.pool().allocate_for_host(n);
        host_arenas_[t] = blk;
      }
    }
    std::vector<buffer*> cold; // device-initialized swappable pieces to offload before step 1
    for (auto* s : slots) {
      s->swappable = eligible(*s);
      s->pieces.assign(1, buffer{});
      s->piece_begin.assign(1, 0);
      auto& p = s->pieces[0];
      p.bytes = s->bytes();
      if (s->swappable) {
        swappable_bytes_ += s->bytes();
        if (s->packed) {
          s->mirror = {host_arenas_.at(s->type).ptr + s->host_offset, s->bytes()};
          s->owns_mirror = false;
        } else {
          s->mirror = x_.pool().allocate_for_host(s->bytes());
          s->owns_mirror = true;
        }
        p.mirror = s->mirror.ptr;
      } else {
        resident_bytes_ += s->bytes();
      }
      if (s->init == slot_init::zeros && s->swappable) {
        fill_zero(s->mirror);
        p.state = residency::host;
      } else if (s->init == slot_init::zeros) {
        zero_on_device(p);
      } else {
        p.device = b_.allocate_device(p.bytes, x_.compute());
        p.state = residency::device;
        opt_.initialize(*s);
        if (s->swappable) cold.push_back(&p);
      }
    }
    // Cold states leave the device before the first forward (reference offload_initial_slots).
    offload_initial(cold);
  }

  /// Packed mirrors are views of the host arena, so the same D2H lands each piece in its place.
  void offload_initial(std::span<buffer* const> pieces) {
    x_.launch_offload(pieces, "offload initial");
    x_.wait_offload(pieces, x_.compute());
  }

  void fill_zero(pinned_block blk) {
    if (blk.bytes == 0 || !detail::holds_bytes(b_)) return;
    detail::note_host_write(b_, blk.ptr, blk.bytes);
    std::memset(blk.ptr, 0, blk.bytes);
  }

  /// A non-swappable zero state: device storage filled from a zeroed pinned block.
  void zero_on_device(buffer& p) {
    if (p.bytes == 0) {
      p.state = residency::device;
      return;
    }
    auto blk = x_.pool().allocate_for_host(p.bytes);
    fill_zero(blk);
    buffer tmp{p.bytes, {}, blk.ptr, true, residency::host, {}};
    buffer* one[] = {&tmp};
    try {
      x_.launch_load(one, "zero state");
    } catch (...) {
      x_.release_mirror(tmp);
      throw;
    }
    auto const used = tmp.event;
    x_.wait_load(one, x_.compute());
    x_.release_mirror(tmp, used);
    p.device = tmp.device;
    p.state = residency::device;
  }

  /// Releases every device byte and mirror this runtime holds. Never throws.
  void release_all() noexcept {
    try {
      auto all = all_pieces();
      x_.settle(all);
      evacuate_stranded();
      for (auto* s : opt_.slots()) {
        for (auto& p : s->pieces) {
          if (!s->packed) x_.release_device(p, x_.compute());
          if (p.event) b_.synchronize(*p.event);
          p = buffer{p.bytes, {}, nullptr, false, residency::host, {}};
        }
        if (s->owns_mirror) x_.pool().deallocate(s->mirror);
        s->mirror = {};
        s->owns_mirror = false;
      }
      for (auto& [t, blk] : host_arenas_) x_.pool().deallocate(blk);
      host_arenas_.clear();
    } catch (...) { // destructors never throw; what could not be released stays with the backend
    }
  }

  // ----- steps -------------------------------------------------------------------------------------

  void emit(char const* op) {
    if (listener_) listener_(op);
  }
  void emit(char const* op, std::size_t n) {
    if (listener_) listener_(std::string(op) + ":" + std::to_string(n));
  }
  void emit(char const* op, std::size_t n, std::optional<std::size_t> m, std::size_t a) {
    if (listener_) {
      listener_(std::string(op) + ":" + std::to_string(n) + ":" + (m ? std::to_string(*m) : "None") +
                ":" + std::to_string(a));
    }
  }
  void emit(char const* op, std::size_t n, std::size_t a) {
    if (listener_) listener_(std::string(op) + ":" + std::to_string(n) + ":" + std::to_string(a));
  }

  /// Partitions the step and cuts the slots to match. The step context is created first and kept, so
  /// a failure here retries the same step instead of advancing step counts twice. The plan is reused
  /// while the units, their sizes and the slots' piece layout are unchanged.
  void plan_step(step_state& st) {
    auto units = opt_.update_units(st.ctx);
    std::vector<partition_item> items(units.size());
    std::vector<std::size_t> params(units.size());
    std::uint64_t layout = 0;
    for (std::size_t u = 0; u < units.size(); ++u) {
      std::uint64_t bpe = 0;
      for (auto* s : units[u].slots) {
        if (s->swappable) bpe += s->element_bytes();
        layout += s->layout;
      }
      items[u] = {units[u].numel, bpe};
      params[u] = units[u].param;
    }
    if (cached_ && layout == cached_layout_ && params == cached_params_ && items == cached_items_) {
      st.d = cached_;
      return;
    }
    auto d = std::make_shared<plan_data>();
    d->plan = policy_(items, cfg_.swap_times);
    segment(units, d->plan);
    d->bufs.assign(d->plan.size(), {});
    d->types.assign(d->plan.size(), {});
    std::unordered_set<buffer const*> seen; // dedup by piece identity, never by address values
    for (std::size_t n = 0; n < d->plan.size(); ++n) {
      std::size_t bytes = 0;
      seen.clear();
      for (auto const& r : d->plan[n]) {
        for (auto* s : units[r.unit].slots) {
          if (!s->swappable) continue;
          auto* p = &s->pieces[s->piece_of(r.begin)];
          if (seen.insert(p).second) {
            d->bufs[n].push_back(p);
            d->types[n].push_back(s->type);
            bytes += p->bytes;
          }
        }
      }
      d->max_batch_bytes = std::max(d->max_batch_bytes, bytes);
    }
    if (cfg_.packed) layout_packed(*d);
    layout = 0; // segment() may have re-cut slots
    for (auto const& u : units) {
      for (auto* s : u.slots) layout += s->layout;
    }
    cached_ = d;
    cached_items_ = std::move(items);
    cached_params_ = std::move(params);
    cached_layout_ = layout;
    st.d = std::move(d);
    max_batch_bytes_ = st.d->max_batch_bytes;
    last_plan_ = st.d->plan;
  }

  /// Makes every swappable slot's pieces match the cuts of this step's plan. Re-cutting happens only
  /// when the plan changes, on slots at rest on the host (it is bookkeeping over the mirror).
  void segment(std::span<update_unit<B> const> units, batch_plan const& plan) {
    std::vector<std::vector<std::size_t>> cuts(units.size());
    for (auto const& batch : plan) {
      for (auto const& r : batch) cuts[r.unit].push_back(r.begin);
    }
    for (std::size_t u = 0; u < units.size(); ++u) {
      auto& c = cuts[u];
      std::sort(c.begin(), c.end());
      c.erase(std::unique(c.begin(), c.end()), c.end());
      if (c.empty()) c.push_back(0);
      for (auto* s : units[u].slots) {
        if (!s->swappable || s->piece_begin == c) continue;
        recut(*s, c);
      }
    }
  }

  void recut(slot_type& s, std::vector<std::size_t> const& cuts) {
    std::vector<buffer*> ps;
    for (auto& p : s.pieces) ps.push_back(&p);
    if (!s.all(residency::host)) { // bring it home first (rare: after an interrupted offload)
      x_.settle(ps);
      x_.launch_offload(ps, "recut");
      x_.wait_offload(ps, x_.compute());
    }
    for (auto* p : ps) {
      if (p->event) b_.synchronize(*p->event);
    }
    auto const eb = s.element_bytes();
    std::vector<buffer> pieces(cuts.size());
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      auto const end = i + 1 < cuts.size() ? cuts[i + 1] : s.numel;
      pieces[i] = buffer{(end - cuts[i]) * eb, {}, s.mirror.ptr + cuts[i] * eb, false,
                         residency::host, {}};
    }
    s.pieces = std::move(pieces);
    s.piece_begin = cuts;
    ++s.layout;
  }

  void run_per_tensor(step_state& st) {
    auto const N = st.d->plan.size();
    auto const k = st.next;
    if (k >= N) return;
    auto bufs = [&](std::size_t n) { return std::span<buffer* const>(st.d->bufs[n]); };
    gate_step();
    emit("prefetch", k);
    x_.launch_load(bufs(k), label("prefetch", k).c_str());
    for (std::size_t n = k; n < N; ++n) {
      emit("wait_prefetch", n);
      x_.wait_load(bufs(n), x_.compute());
      if (n > k) {
        emit("wait_offload", n - 1);
        x_.wait_offload(bufs(n - 1), x_.h2d());
      }
      if (n + 1 < N) {
        emit("prefetch", n + 1);
        x_.launch_load(bufs(n + 1), label("prefetch", n + 1).c_str());
      }
      emit("update", n);
      {
        detail::scoped_label<B> l(b_, label("update", n).c_str());
        opt_.update(st.d->plan[n], st.ctx);
      }
      st.next = n + 1;
      emit("offload", n);
      x_.launch_offload(bufs(n), label("offload", n).c_str());
    }
    emit("wait_offload", N - 1);
    x_.wait_offload(bufs(N - 1), x_.compute());
  }

  /// Orders the step's first device allocation after the memory the previous step released: that
  /// release was made visible to the compute stream, and the h2d stream starts behind it.
  void gate_step() {
    detail::wait_at(detail::wait_site::gate_after_offload, b_, x_.h2d(), b_.record_event(x_.compute()));
  }

  // ----- packed pipeline ---------------------------------------------------------------------------

  struct packed_batch {
    event_handle<B> ready, offloaded;
  };
  struct packed_state {
    plan_data const* d = nullptr;
    std::vector<packed_batch> batches;
    device_pointer_t<B> arena[2]{};
    std::size_t first = 0; ///< first batch of this run (later batches reuse its arenas)
  };

  static constexpr std::size_t align512(std::size_t n) { return (n + 511) / 512 * 512; }

  void layout_packed(plan_data& d) {
    d.packed.assign(d.plan.size(), {});
    for (std::size_t n = 0; n < d.plan.size(); ++n) {
      auto& pb = d.packed[n];
      auto const count = d.bufs[n].size();
      pb.piece_lo.resize(count);
      for (std::size_t i = 0; i < count; ++i) {
        pb.piece_lo[i] = static_cast<std::size_t>(d.bufs[n][i]->mirror - host_arenas_.at(d.types[n][i]).ptr);
      }
      // Pieces sorted by (dtype, host offset) → contiguous runs per dtype.
      std::vector<std::size_t> order(count);
      for (std::size_t i = 0; i < count; ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](auto a, auto c) {
        return std::pair{d.types[n][a], pb.piece_lo[a]} < std::pair{d.types[n][c], pb.piece_lo[c]};
      });
      pb.piece_run.assign(count, 0);
      std::size_t off = 0;
      std::optional<dtype> cur;
      for (auto i : order) {
        auto const* p = d.bufs[n][i];
        auto const t = d.types[n][i];
        auto const lo = pb.piece_lo[i];
        if (cur != t) {
          off = align512(off); // every dtype region starts 512-byte aligned
          cur = t;
          pb.runs.push_back({t, lo, lo + p->bytes, off});
        } else if (pb.runs.back().host_hi == lo) {
          pb.runs.back().host_hi += p->bytes;
        } else {
          pb.runs.push_back({t, lo, lo + p->bytes, off});
        }
        off += p->bytes;
        pb.piece_run[i] = pb.runs.size() - 1;
      }
      d.arena_size = std::max(d.arena_size, align512(off));
    }
  }

  device_pointer_t<B> piece_view(packed_state const& ps, std::size_t n, std::size_t i,
                                 device_pointer_t<B> arena) const {
    auto const& pb = ps.d->packed[n];
    auto const& r = pb.runs[pb.piece_run[i]];
    return arena + (r.arena_off + (pb.piece_lo[i] - r.host_lo));
  }

  /// H2D of batch n into arena a. `announce` is false inside a chain (the reference traces the chain
  /// as one operation).
  void packed_prefetch(step_state& st, packed_state& ps, std::size_t n, std::size_t a,
                       bool announce = true) {
    if (announce) emit("prefetch", n, a);
    detail::scoped_label<B> l(b_, label("prefetch", n).c_str());
    auto& pb = ps.batches[n];
    auto const& lay = ps.d->packed[n];
    std::vector<event_handle<B>> events;
    for (auto* p : st.d->bufs[n]) detail::add_unique<B>(events, p->event);
    for (auto const& e : events) detail::wait_at(detail::wait_site::load_after_mirror, b_, x_.h2d(), *e);
    if (n >= ps.first + 2) { // arena a last held batch n-2: load behind its D2H
      detail::wait_at(detail::wait_site::arena_reuse, b_, x_.h2d(), *ps.batches[n - 2].offloaded);
    }
    for (auto const& r : lay.runs) {
      b_.copy_h2d(ps.arena[a] + r.arena_off, host_arenas_.at(r.type).ptr + r.host_lo,
                  r.host_hi - r.host_lo, x_.h2d());
    }
    pb.ready = record(b_, x_.h2d());
    for (std::size_t i = 0; i < st.d->bufs[n].size(); ++i) {
      auto* p = st.d->bufs[n][i];
      p->state = residency::h2d;
      p->event = pb.ready;
      p->device = piece_view(ps, n, i, ps.arena[a]);
    }
  }

  void packed_chain(step_state& st, packed_state& ps, std::size_t n, std::optional<std::size_t> next,
                    std::size_t a) {
    emit("chain", n, next, a);
    {
      detail::scoped_label<B> l(b_, label("offload", n).c_str());
      auto& pb = ps.batches[n];
      detail::wait_at(detail::wait_site::offload_after_compute, b_, x_.d2h(),
                      b_.record_event(x_.compute()));
      for (auto const& r : ps.d->packed[n].runs) {
        b_.copy_d2h(host_arenas_.at(r.type).ptr + r.host_lo, ps.arena[a] + r.arena_off,
                    r.host_hi - r.host_lo, x_.d2h());
      }
      pb.offloaded = record(b_, x_.d2h());
      for (auto* p : st.d->bufs[n]) {
        p->state = residency::d2h;
        p->event = pb.offloaded;
        p->device = {};
      }
    }
    if (next) packed_prefetch(st, ps, *next, a, false);
  }

  void run_packed(step_state& st) {
    auto const N = st.d->plan.size();
    auto const k = st.next;
    if (k >= N) return;
    packed_state ps;
    ps.first = k;
    ps.d = st.d.get();
    ps.batches.assign(N, {});
    arena_bytes_ = ps.d->arena_size;
    emit("begin", N - k);
    gate_step();
    try {
      auto const arenas = std::min<std::size_t>(2, N - k);
      for (std::size_t a = 0; a < arenas; ++a) {
        ps.arena[(k + a) % 2] = b_.allocate_device(ps.d->arena_size, x_.h2d());
      }
      packed_prefetch(st, ps, k, k % 2);
      if (k + 1 < N) packed_prefetch(st, ps, k + 1, (k + 1) % 2);
      for (std::size_t n = k; n < N; ++n) {
        auto const a = n % 2;
        emit("wait_prefetch", n, a);
        detail::wait_at(detail::wait_site::use_after_load, b_, x_.compute(), *ps.batches[n].ready);
        if (n >= k + 2) finish_packed_offload(st, ps, n - 2);
        emit("activate", n, a);
        for (auto* p : st.d->bufs[n]) {
          p->state = residency::device;
          p->event = nullptr;
        }
        emit("update", n);
        {
          detail::scoped_label<B> l(b_, label("update", n).c_str());
          opt_.update(st.d->plan[n], st.ctx);
        }
        st.next = n + 1;
        packed_chain(st, ps, n, n + 2 < N ? std::optional<std::size_t>(n + 2) : std::nullopt, a);
      }
      for (std::size_t n = std::max(k, N >= 2 ? N - 2 : 0); n < N; ++n) finish_packed_offload(st, ps, n);
    } catch (...) {
      abort_packed(st, ps);
      throw;
    }
    emit("end");
    release_arenas(ps);
  }

  void finish_packed_offload(step_state& st, packed_state& ps, std::size_t n) {
    emit("wait_offload", n);
    b_.wait_event(x_.compute(), *ps.batches[n].offloaded);
    emit("finish_offload", n);
    for (auto* p : st.d->bufs[n]) {
      if (p->state == residency::d2h) p->state = residency::host;
    }
  }

  /// Releases the staging arenas behind everything that used them; the compute stream is ordered
  /// after the release so the next forward can reuse the memory.
  void release_arenas(packed_state& ps) {
    b_.wait_event(x_.d2h(), b_.record_event(x_.compute()));
    b_.wait_event(x_.d2h(), b_.record_event(x_.h2d()));
    for (auto& a : ps.arena) {
      if (a) b_.deallocate_device(a, ps.d->arena_size, x_.d2h());
      a = {};
    }
    b_.wait_event(x_.compute(), b_.record_event(x_.d2h()));
  }

  /// After a failure inside a packed step: copies every activated batch back out of its arena, lets
  /// loads that were never used fall back to their (unchanged) mirrors, and releases the arenas. If
  /// a copy-back fails too, the arenas are kept (stranded) with the pieces that still live in them,
  /// and evacuate_stranded() finishes the job before the next step.
  void abort_packed(step_state& st, packed_state& ps) noexcept {
    emit("end");
    try {
      for (std::size_t n = 0; n < st.d->plan.size(); ++n) {
        bool active = false;
        for (auto* p : st.d->bufs[n]) active = active || p->state == residency::device;
        if (active) packed_chain(st, ps, n, std::nullopt, n % 2);
      }
    } catch (...) {
      for (auto& a : ps.arena) {
        if (a) stranded_.push_back({a, ps.d->arena_size});
        a = {};
      }
    }
    for (std::size_t n = 0; n < st.d->plan.size(); ++n) {
      for (auto* p : st.d->bufs[n]) {
        if (p->state == residency::h2d) { // loaded but never used: the mirror is still current
          p->state = residency::host;
          p->device = {};
        } else if (p->state == residency::d2h) {
          p->state = residency::host;
        }
      }
    }
    try {
      release_arenas(ps);
    } catch (...) {
      for (auto& a : ps.arena) {
        if (a) stranded_.push_back({a, ps.d->arena_size});
        a = {};
      }
    }
  }

  // ----- recovery ----------------------------------------------------------------------------------

  void recover_per_tensor(step_state& st) noexcept {
    std::vector<buffer*> all;
    for (auto& v : st.d->bufs) all.insert(all.end(), v.begin(), v.end());
    try {
      x_.settle(all);
      try { // best effort: offload what is on the device; if that fails it stays there, intact
        x_.launch_offload(all, "recover");
      } catch (...) {
      }
      x_.settle(all);
    } catch (...) { // every piece is still in a consistent state (see transfer_engine)
    }
  }

  /// Packed pieces that a failed copy-back left in a kept arena go home now; then the arenas go.
  void evacuate_stranded() {
    if (stranded_.empty()) return;
    std::vector<buffer*> home;
    for (auto* s : opt_.slots()) {
      if (!s->packed) continue;
      for (auto& p : s->pieces) {
        if (p.state == residency::device) home.push_back(&p);
      }
    }
    if (!home.empty()) {
      detail::scoped_label<B> l(b_, "evacuate");
      b_.wait_event(x_.d2h(), b_.record_event(x_.compute()));
      for (auto* p : home) b_.copy_d2h(p->mirror, p->device, p->bytes, x_.d2h());
      auto e = record(b_, x_.d2h());
      for (auto* p : home) {
        p->state = residency::host;
        p->device = {};
        p->event = e;
      }
    }
    for (auto& [a, n] : stranded_) b_.deallocate_device(a, n, x_.d2h());
    stranded_.clear();
    b_.wait_event(x_.compute(), b_.record_event(x_.d2h()));
  }

  std::vector<buffer*> swappable_pieces() {
    std::vector<buffer*> out;
    for (auto* s : opt_.slots()) {
      if (!s->swappable) continue;
      for (auto& p : s->pieces) out.push_back(&p);
    }
    return out;
  }
  std::vector<buffer*> all_pieces() {
    std::vector<buffer*> out;
    for (auto* s : opt_.slots()) {
      for (auto& p : s->pieces) out.push_back(&p);
    }
    return out;
  }

  static std::string label(char const* op, std::size_t n) { return std::string(op) + " b" + std::to_string(n); }

  transfer_engine<B>& x_;
  B& b_;
  O& opt_;
  swap_config cfg_;
  P policy_;
  std::vector<state_key> keys_;
  std::map<dtype, pinned_block> host_arenas_;
  std::optional<step_state> pending_;
  batch_plan last_plan_;
  std::shared_ptr<plan_data const> cached_;
  std::vector<partition_item> cached_items_;
  std::vector<std::size_t> cached_params_;
  std::uint64_t cached_layout_ = 0;
  listener listener_;
  std::size_t resident_bytes_ = 0, swappable_bytes_ = 0, arena_bytes_ = 0, max_batch_bytes_ = 0;
  struct stranded_arena {
    device_pointer_t<B> ptr;
    std::size_t bytes;
  };
  std::vector<stranded_arena> stranded_;
};

} // namespace pipeswap
