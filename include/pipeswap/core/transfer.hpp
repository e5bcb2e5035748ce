// pipeswap — the swap life cycle, written once for both jobs.
//
// A swap_buffer is one piece of device memory that can live in pinned host memory while idle. Its
// life cycle is
//
//            launch_offload                 wait_offload
//   device ─────────────────► d2h ──────────────────────────► host
//     ▲     D2H on the d2h stream,   the next user of the memory
//     │     storage released on the  waits the offload event
//     │     d2h stream behind it                                 │
//     │       wait_load              launch_load                 │
//     └──────────────────── h2d ◄────────────────────────────────┘
//       the user waits the     storage acquired on the h2d stream,
//       load event             H2D behind the mirror's last D2H
//
// Every transfer is guarded by one event per batch; every release is stream-ordered behind the copy
// that reads the storage, so no host thread ever frees memory a copy may still touch. The compute
// stream never waits for a copy it does not need: an offload orders only the D2H behind the compute
// work (one event), and the D2H stream releases the storage itself.
//
// Where a buffer's device bytes live is a storage policy chosen per call: per_buffer_storage (its
// own storage, allocated on the h2d stream by launch_load, released on the d2h stream behind its D2H)
// or arena_storage<B> (views into a staging arena, merged copies: core/staging.hpp and
// core/detail/arena_copy.hpp). The states,
// events and waits are the same for both; the engine is the only writer of a swap_buffer.
//
// A transfer_engine owns the copy-stream pair (one per direction, so offloads and loads overlap)
// and the pinned pool; the optimizer runtime and the activation manager share one engine per device.
// Every wait it issues for correctness is a named site (core/detail/mutation.hpp). All calls are made
// from one host thread.
//
// Every device byte a swap job acquires or gives back passes through the engine (launch_load,
// allocate_arena, allocate_device in; launch_offload, wait_offload, release_arena, discard_device,
// deallocate_device out): there a per-device budget (core/budget.hpp, set_budget) reserves bytes
// before an allocation and gets them back when the stream-ordered release is issued. A load is
// launched as early as the budget allows and waited only by its user. Each buffer is counted for
// its client (set_client; the optimizer unless told otherwise); staging arenas are the optimizer's;
// storage handed in (adopt_device) or allocated for the caller (allocate_device) is never counted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/detail/arena_copy.hpp>
#include <pipeswap/core/detail/engine_budget.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/staging.hpp>
#include <pipeswap/core/swap_buffer.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap {

namespace detail {
/// Something that holds device storage counted in the engine's budget and can give it back behind a
/// stream: a deferred optimizer offload (swap/detail/carry_over.hpp). transfer_engine::make_room
/// asks it for room.
template <backend B>
class room_source {
public:
  /// Gives back storage, `user` ordered behind what still reads it, until `bytes` fit beside what
  /// the budget counts (transfer_engine::fits_required) or nothing is left to give. Returns the bytes
  /// given back.
  virtual std::uint64_t give_room(std::uint64_t bytes, stream_t<B> user) = 0;

protected:
  room_source() = default;
  room_source(room_source const&) = delete; // a registered source is a link of the engine's list
  room_source& operator=(room_source const&) = delete;
  ~room_source() = default;

private:
  friend class pipeswap::transfer_engine<B>;
  room_source* next_room_ = nullptr; ///< the next source registered with the same engine
};
} // namespace detail

/// A device → host copy of bytes that stay on the device (checkpoints of unswappable state).
template <backend B>
struct host_copy {
  std::byte* host = nullptr;
  device_pointer_t<B> device{};
  std::size_t bytes = 0;
};

template <backend B>
class transfer_engine : public detail::engine_budget {
public:
  using buffer = swap_buffer<B>;

  explicit transfer_engine(B& b, pinned_pool_options pool = {});
  transfer_engine(transfer_engine const&) = delete;
  transfer_engine& operator=(transfer_engine const&) = delete;
  ~transfer_engine();

  // The device budget (set_budget(), reserved_bytes(), admits_optional(), hold(), the reload demand,
  // ...) is the engine's base, core/detail/engine_budget.hpp.

  /// Sets the client a buffer without device storage is counted for.
  void set_client(buffer& x, budget_client c) {
    if (x.reserved_) throw state_error("set_client: the swap buffer holds reserved device storage");
    x.client_ = c;
  }

  [[nodiscard]] B& backend() const noexcept { return b_; }
  [[nodiscard]] pinned_pool<B>& pool() noexcept { return pool_; }
  [[nodiscard]] stream_t<B> compute() const { return b_.current_stream(); }
  [[nodiscard]] stream_t<B> h2d() const noexcept { return h2d_; }
  [[nodiscard]] stream_t<B> d2h() const noexcept { return d2h_; }

  // ----- room for the next allocation -------------------------------------------------------------

  /// Before `user` allocates `bytes` of device memory under the budget, or beside it (a forward's
  /// activations, which the budget does not count: the capacity is the room the rest leaves): when
  /// the bytes do not fit beside what the budget counts, storage it counts that can be given back
  /// behind `user` is (a deferred optimizer offload: `user` waits its D2Hs, batch by batch in step
  /// order, each batch's storage released behind them) until they fit or none is left. So the
  /// allocation that follows on `user` waits for (part of) the deferred offload instead of exceeding
  /// the budget. Never blocks the host. Returns the bytes given back (0 without a budget, when the
  /// bytes already fit, or when nothing counted can be given back). launch_load asks it for every
  /// batch it allocates storage for (activation loads); optimizer prefetch finishes the deferred
  /// offload itself.
  std::uint64_t make_room(std::uint64_t bytes, stream_t<B> user) {
    check_budget("transfer_engine::make_room");
    if (fits_required(bytes) || giving_room_) return 0;
    giving_room_ = true;
    std::uint64_t given = 0;
    try {
      for (auto* s = room_sources_; s && !fits_required(bytes); s = s->next_room_) given += s->give_room(bytes, user);
    } catch (...) {
      giving_room_ = false;
      throw;
    }
    giving_room_ = false;
    return given;
  }
  /// Registers `s` with make_room() (the optimizer-swap runtime registers its deferred offload);
  /// unregistered with remove_room_source() before `s` goes away.
  void add_room_source(detail::room_source<B>& s) noexcept {
    auto** at = &room_sources_;
    for (; *at; at = &(*at)->next_room_) {
      if (*at == &s) return;
    }
    *at = &s;
  }
  void remove_room_source(detail::room_source<B>& s) noexcept {
    for (auto** at = &room_sources_; *at; at = &(*at)->next_room_) {
      if (*at == &s) {
        *at = s.next_room_;
        s.next_room_ = nullptr;
        return;
      }
    }
  }
  /// Stream-ordered releases of device storage the engine has issued so far (a count that only
  /// grows): a caller that knows every release up to some count is ordered before a stream tells
  /// whether one was issued since.
  [[nodiscard]] std::uint64_t releases_issued() const noexcept { return releases_; }

  // ----- setting buffers up and down --------------------------------------------------------------

  /// Hands device storage `d` (allocated with the backend) to a buffer without storage: it becomes
  /// device-resident and owns `d`.
  void adopt_device(buffer& x, device_pointer_t<B> d) {
    require_empty(x, "adopt_device");
    x.reserved_ = false;
    x.device_ = d;
    x.state_ = residency::device;
  }

  /// Allocates device storage for a buffer without storage on `s` (contents undefined); it becomes
  /// device-resident.
  void allocate(buffer& x, stream_t<B> s) {
    require_empty(x, "allocate");
    check_budget("transfer_engine::allocate");
    x.reserved_ = false;
    x.device_ = x.bytes_ ? allocate_reserved(x.client_, x.bytes_, s, x.reserved_) : device_pointer_t<B>{};
    x.state_ = residency::device;
  }

  /// Takes a device-resident buffer's storage away (the caller owns it now); the buffer is left
  /// empty, without storage. Its mirror is not current any more.
  device_pointer_t<B> take_device(buffer& x) {
    if (x.state_ != residency::device) {
      throw state_error(detail::message(
          {"take_device: swap buffer of ", x.bytes_, " bytes is ", to_string(x.state_), ", not device"}));
    }
    auto const d = x.device_;
    x.device_ = {};
    x.state_ = residency::empty;
    if (x.reserved_) unreserve(x.client_, x.bytes_);
    x.reserved_ = false;
    return d;
  }

  /// Points a buffer at rest off the device (host or empty) at host bytes owned elsewhere (a view;
  /// never freed here). The bytes there become its contents, so it is in host state; the previous
  /// mirror's last D2H, if any, still guards them.
  void set_mirror(buffer& x, std::byte* view) {
    if (!off_device(x.state_) || x.device_) {
      throw state_error(
          detail::message({"set_mirror: swap buffer of ", x.bytes_, " bytes is not at rest on the host"}));
    }
    release_mirror(x, x.event_);
    x.mirror_ = view;
    x.state_ = residency::host;
  }

  /// Gives a pool-owned mirror back to the pool; its bytes may be reused after `last_use`.
  void release_mirror(buffer& x, event_handle<B> last_use = {}) {
    if (x.owns_mirror_ && x.mirror_ != nullptr) pool_.deallocate({x.mirror_, x.bytes_}, std::move(last_use));
    x.mirror_ = nullptr;
    x.owns_mirror_ = false;
  }

  /// Releases a buffer's own device storage on `s` (stream-ordered: behind the work enqueued on `s`)
  /// and leaves it in host state, its contents the mirror's (empty without a mirror); its device
  /// bytes are discarded. Buffers viewing an arena only drop
  /// the view. Copies in flight must be settled first.
  void discard_device(buffer& x, stream_t<B> s) {
    if (!x.at_rest()) {
      throw state_error(detail::message(
          {"discard_device: swap buffer of ", x.bytes_, " bytes is ", to_string(x.state_), "; settle it first"}));
    }
    if (x.state_ == residency::device) release_storage(x, s);
    if (x.state_ != residency::empty) x.state_ = x.mirror_ ? residency::host : residency::empty;
  }

  /// Forgets a settled buffer's last copy event after the host synchronized with it.
  void forget_event(buffer& x) {
    if (!x.at_rest()) throw state_error("forget_event: a copy of the swap buffer is in flight");
    x.event_ = nullptr;
  }

  // ----- the life cycle ---------------------------------------------------------------------------

  /// device → d2h for the buffers in `device` state (others are skipped): the d2h stream waits the
  /// compute stream's work so far, copies each buffer into its mirror (allocated from the pool on
  /// first use, per-buffer storage only), and releases its storage behind the copy. One event guards
  /// the batch. If a call throws, buffers already enqueued are in d2h (covered by the next event
  /// recorded on the d2h stream) and the rest are untouched in `device`.
  void launch_offload(std::span<buffer* const> bufs, char const* label = "offload") {
    per_buffer_storage s;
    launch_offload(bufs, s, label);
  }

  template <class Storage>
  void launch_offload(std::span<buffer* const> bufs, Storage& storage, char const* label = "offload") {
    auto targets = select(bufs, residency::device, residency::host);
    if (targets.empty()) return;
    detail::scoped_label<B> l(b_, label);
    detail::wait_at(detail::wait_site::offload_after_compute, b_, d2h_, b_.record_event(compute()));
    try {
      if constexpr (is_arena<Storage>) {
        detail::arena_copy<B>::runs(b_, h2d_, d2h_, bufs, targets, storage.arena, storage.layout, false);
      } else {
        for (auto* x : targets) {
          if (x->mirror_ == nullptr) {
            auto blk = pool_.allocate(x->bytes_, d2h_);
            x->mirror_ = blk.ptr;
            x->owns_mirror_ = true;
          }
          b_.copy_d2h(x->mirror_, x->device_, x->bytes_, d2h_);
          x->state_ = residency::d2h;
          x->event_ = nullptr;
          release_storage(*x, d2h_);
        }
      }
    } catch (...) {
      auto const e = guard(detail::view(targets), d2h_); // the buffers enqueued (in d2h) only
      if constexpr (is_arena<Storage>) {
        if (e) storage.arena.fence = e;
      }
      throw;
    }
    auto const e = guard(detail::view(targets), d2h_);
    if constexpr (is_arena<Storage>) storage.arena.fence = e;
  }

  /// d2h → host for the buffers in `d2h` state: `next_user` (the stream that will use the freed
  /// memory next) waits the offload events (at `site`). The events stay on the buffers to guard
  /// their mirrors.
  void wait_offload(std::span<buffer* const> bufs, stream_t<B> next_user,
                    detail::wait_site site = detail::wait_site::gate_after_offload) {
    detail::lean_vector<buffer*> targets;
    targets.reserve(bufs.size());
    detail::lean_vector<event_handle<B>> events;
    for (auto* x : bufs) {
      if (x->state_ != residency::d2h) continue;
      if (!x->event_) x->event_ = record(b_, d2h_);
      if (x->device_) release_storage(*x, d2h_); // a release that failed at launch
      collect(events, x->event_);
      targets.push_back(x);
    }
    for (auto const& e : events) detail::wait_at(site, b_, next_user, *e);
    for (auto* x : targets) x->state_ = residency::host;
  }

  /// host → h2d for the buffers in `host` state (and `empty` ones, which have no mirror to load
  /// from: refused, unless they hold no bytes): device storage is acquired (allocated on the h2d
  /// stream, or the arena views), the h2d stream waits the D2H that last filled each mirror (and,
  /// in an arena, the last D2H out of it) and copies the mirrors in. One event guards the batch. If a
  /// call throws, enqueued buffers are in h2d and the rest are back in `host` with no storage.
  void launch_load(std::span<buffer* const> bufs, char const* label = "load") {
    per_buffer_storage s;
    launch_load(bufs, s, label);
  }

  template <class Storage>
  void launch_load(std::span<buffer* const> bufs, Storage& storage, char const* label = "load") {
    auto targets = select(bufs, residency::empty, residency::device);
    if (targets.empty()) return;
    check_budget("transfer_engine::launch_load");
    detail::scoped_label<B> l(b_, label);
    try {
      for (auto* x : targets) {
        if (x->mirror_ == nullptr) {
          throw state_error(detail::message({"swap buffer of ", x->bytes_, " bytes is ", to_string(x->state_),
                                             " and has no host mirror to load from"}));
        }
      }
      if constexpr (!is_arena<Storage>) {
        if (link_.budget && !targets.empty()) { // a strict budget refuses the batch before any allocation
          std::uint64_t total = 0;
          for (auto* x : targets) total += x->bytes_;
          make_room(total, h2d_); // the h2d stream waits (part of) a deferred offload rather than going over
          link_.budget->require_room(targets.front()->client_, total);
        }
        for (auto* x : targets) x->device_ = allocate_reserved(x->client_, x->bytes_, h2d_, x->reserved_);
      }
      detail::lean_vector<event_handle<B>> events;
      for (auto* x : targets) collect(events, x->event_);
      for (auto const& e : events) detail::wait_at(detail::wait_site::load_after_mirror, b_, h2d_, *e);
      if constexpr (is_arena<Storage>) {
        if (storage.arena.fence) {
          detail::wait_at(detail::wait_site::arena_reuse, b_, h2d_, *storage.arena.fence);
        }
        detail::arena_copy<B>::runs(b_, h2d_, d2h_, bufs, targets, storage.arena, storage.layout, true);
      } else {
        for (auto* x : targets) {
          b_.copy_h2d(x->device_, x->mirror_, x->bytes_, h2d_);
          x->state_ = residency::h2d;
          x->event_ = nullptr;
        }
      }
    } catch (...) {
      for (auto* x : targets) {
        if (x->state_ == residency::h2d) continue;
        if constexpr (is_arena<Storage>) {
          x->device_ = {};
        } else if (x->device_) {
          try {
            release_storage(*x, h2d_);
          } catch (...) { // left with the buffer: the next load or teardown releases it
          }
        }
      }
      guard(detail::view(targets), h2d_); // the buffers enqueued (in h2d) only
      throw;
    }
    guard(detail::view(targets), h2d_);
  }

  /// h2d → device for the buffers in `h2d` state: `user` waits the load events.
  void wait_load(std::span<buffer* const> bufs, stream_t<B> user) {
    detail::lean_vector<buffer*> targets;
    targets.reserve(bufs.size());
    detail::lean_vector<event_handle<B>> events;
    for (auto* x : bufs) {
      if (x->state_ != residency::h2d) continue;
      if (!x->event_) x->event_ = record(b_, h2d_);
      collect(events, x->event_);
      targets.push_back(x);
    }
    for (auto const& e : events) detail::wait_at(detail::wait_site::use_after_load, b_, user, *e);
    for (auto* x : targets) {
      x->state_ = residency::device;
      x->event_ = nullptr;
    }
  }

  /// Brings every buffer to rest: loads in flight finish to `device`, offloads to `host`, the compute
  /// stream ordered behind both. Used to recover from an exception mid-pipeline.
  void settle(std::span<buffer* const> bufs) {
    wait_load(bufs, compute());
    wait_offload(bufs, compute());
  }

  /// Makes every buffer host-resident with its mirror complete and host-synchronized (checkpoints):
  /// settles, offloads what is on the device, and synchronizes the host with every D2H. Afterwards
  /// the host may read the mirrors.
  void synchronize_to_host(std::span<buffer* const> bufs, char const* label = "checkpoint offload") {
    settle(bufs);
    launch_offload(bufs, label);
    wait_offload(bufs, compute());
    host_sync(bufs);
  }

  /// The host waits the last copy of each buffer at rest, so it may read (and write) their mirrors.
  void host_sync(std::span<buffer* const> bufs) {
    detail::lean_vector<event_handle<B>> events;
    for (auto* x : bufs) collect(events, x->event_);
    for (auto const& e : events) b_.synchronize(*e);
    for (auto* x : bufs) {
      x->event_ = nullptr;
      if (x->mirror_ != nullptr && off_device(x->state_)) detail::note_host_read(b_, x->mirror_, x->bytes_);
    }
  }

  // ----- staging arenas ---------------------------------------------------------------------------

  /// Allocates `bytes` for an arena on the h2d stream (its first user).
  void allocate_arena(staging_arena<B>& a, std::size_t bytes) {
    if (a.base) throw state_error("allocate_arena: the staging arena is already allocated");
    check_budget("transfer_engine::allocate_arena");
    bool reserved = false;
    a.base = bytes ? allocate_reserved(budget_client::optimizer, bytes, h2d_, reserved) : device_pointer_t<B>{};
    a.bytes = bytes;
    a.fence = nullptr;
    a.reserved = reserved ? bytes : 0;
  }

  /// Releases an arena, stream-ordered on the d2h stream behind the h2d stream's work so far (the
  /// arena was allocated there, and its loads were enqueued there: wait_site::arena_release), then
  /// orders the compute stream behind the release so the memory is reusable by the next forward.
  /// Precondition: no buffer views the arena any more, every buffer loaded into it having been
  /// offloaded out of it (its D2Hs precede the release on the d2h stream, each behind the compute work
  /// that used the bytes: offload_after_compute).
  void release_arena(staging_arena<B>& a) { release_arena(a, compute()); }
  /// As release_arena(a), with `next_user` (the stream that reuses the memory next) ordered behind
  /// the release instead of the compute stream: a deferred offload finished from prefetch() orders
  /// the h2d stream and leaves the compute stream alone.
  void release_arena(staging_arena<B>& a, stream_t<B> next_user) {
    if (!a.base) return;
    detail::wait_at(detail::wait_site::arena_release, b_, d2h_, b_.record_event(h2d_));
    free_arena(a, next_user);
  }
  /// As release_arena(a, next_user), for an arena the d2h stream is already ordered behind every
  /// load into: the compute stream waited each load (wait_load) before the work whose D2Hs out of
  /// the arena the d2h stream enqueued last (offload_after_compute). The d2h stream does not wait
  /// the h2d stream's later loads, so offloads behind the release keep running beside them.
  void release_offloaded_arena(staging_arena<B>& a, stream_t<B> next_user) {
    if (!a.base) return;
    free_arena(a, next_user);
  }
  /// As release_arena(a, next_user), for an arena whose every access `next_user` is already ordered
  /// behind (it waited the arena's last D2H: make_room): the release is enqueued on `next_user`
  /// itself, so it does not queue behind the offloads the d2h stream runs after that D2H. The d2h
  /// stream then waits it (`room_release`), so every release stays ordered before the d2h stream,
  /// which is what a prefetch waits (prefetch_after_release).
  void release_waited_arena(staging_arena<B>& a, stream_t<B> next_user) {
    if (!a.base) return;
    drop_arena(a, next_user);
    if (next_user != d2h_) detail::wait_at(detail::wait_site::room_release, b_, d2h_, b_.record_event(next_user));
  }

  // ----- copies of bytes that do not move ---------------------------------------------------------

  /// Copies device bytes that stay on the device into pinned host memory and synchronizes the host
  /// with the copies (then the host may read them): the d2h stream waits the compute work first. If
  /// a copy fails, `in_flight` is set to an event covering the copies enqueued before it (the host
  /// bytes may be reused only after it; null when none was enqueued or no event could be recorded).
  void copy_to_host(std::span<host_copy<B> const> copies, event_handle<B>& in_flight,
                    char const* label = "copy to host") {
    if (copies.empty()) return;
    detail::scoped_label<B> l(b_, label);
    detail::wait_at(detail::wait_site::offload_after_compute, b_, d2h_, b_.record_event(compute()));
    std::size_t enqueued = 0;
    try {
      for (auto const& c : copies) {
        if (c.bytes) b_.copy_d2h(c.host, c.device, c.bytes, d2h_);
        ++enqueued;
      }
      b_.synchronize(b_.record_event(d2h_));
    } catch (...) {
      if (enqueued > 0) in_flight = try_record(d2h_);
      throw;
    }
    for (auto const& c : copies) {
      if (c.bytes) detail::note_host_read(b_, c.host, c.bytes);
    }
  }

  /// Copies pinned host bytes into device storage on the h2d stream and orders the compute stream
  /// behind them. `in_flight` is set to the event of the copies: the host bytes may be reused after
  /// it (on failure: covering the copies enqueued, or null).
  void copy_to_device(std::span<host_copy<B> const> copies, event_handle<B>& in_flight,
                      char const* label = "copy to device") {
    if (copies.empty()) return;
    detail::scoped_label<B> l(b_, label);
    std::size_t enqueued = 0;
    try {
      for (auto const& c : copies) {
        if (c.bytes) b_.copy_h2d(c.device, c.host, c.bytes, h2d_);
        ++enqueued;
      }
      in_flight = record(b_, h2d_);
    } catch (...) {
      if (enqueued > 0 && !in_flight) in_flight = try_record(h2d_);
      throw;
    }
    detail::wait_at(detail::wait_site::use_after_load, b_, compute(), *in_flight);
  }

  /// Device storage for the caller, stream-ordered on the h2d stream (its first user).
  [[nodiscard]] device_pointer_t<B> allocate_device(std::size_t bytes) {
    return bytes ? b_.allocate_device(bytes, h2d_) : device_pointer_t<B>{};
  }
  /// Releases storage from allocate_device behind the copies enqueued on the h2d stream.
  void deallocate_device(device_pointer_t<B> d, std::size_t bytes) {
    if (d) b_.deallocate_device(d, bytes, h2d_);
    ++releases_;
  }

  /// Replaces a device-resident buffer's storage with `fresh` (same size); the old storage is
  /// released on the compute stream, behind the work that used it.
  void replace_device(buffer& x, device_pointer_t<B> fresh) {
    if (x.state_ != residency::device) {
      throw state_error(detail::message({"replace_device: swap buffer is ", to_string(x.state_), ", not device"}));
    }
    auto const old = x.device_;
    x.device_ = fresh;
    if (old) b_.deallocate_device(old, x.bytes_, compute());
    ++releases_;
  }

private:
  template <class S>
  static constexpr bool is_arena = !std::is_same_v<S, per_buffer_storage>;

  static void require_empty(buffer const& x, char const* op) {
    if (!off_device(x.state_) || x.device_) {
      throw state_error(detail::message({op, ": swap buffer of ", x.bytes_, " bytes already has device storage"}));
    }
  }

  /// Buffers in `from` state (`empty` stands for both states off the device); zero-byte ones move
  /// straight to `to` (nothing to copy).
  detail::lean_vector<buffer*> select(std::span<buffer* const> bufs, residency from, residency to) {
    detail::lean_vector<buffer*> out;
    out.reserve(bufs.size());
    for (auto* x : bufs) {
      if (from == residency::empty ? !off_device(x->state_) : x->state_ != from) continue;
      if (x->bytes_ == 0) {
        x->state_ = to;
        continue;
      }
      out.push_back(x);
    }
    return out;
  }

  /// Adds `e` to `out` unless null or already there (detail::add_unique), first seen first. The
  /// buffers of a batch share one event, so the last one added is checked before the list.
  static void collect(detail::lean_vector<event_handle<B>>& out, event_handle<B> const& e) {
    if (!e || (!out.empty() && out.back() == e)) return;
    detail::add_unique<B>(out, e);
  }

  event_handle<B> try_record(stream_t<B> s) noexcept {
    try {
      return record(b_, s);
    } catch (...) {
      return {};
    }
  }

  /// Records one event on `s` for the buffers of `bufs` that are in flight.
  event_handle<B> guard(std::span<buffer* const> bufs, stream_t<B> s) {
    if (bufs.empty()) return {};
    event_handle<B> e;
    try {
      e = record(b_, s);
    } catch (...) {
      return {}; // left null: the next wait records a covering event on the same stream
    }
    for (auto* x : bufs) {
      if (!x->at_rest()) x->event_ = e;
    }
    return e;
  }

  /// The release of an arena on the d2h stream, `next_user` ordered behind it.
  void free_arena(staging_arena<B>& a, stream_t<B> next_user) {
    drop_arena(a, d2h_);
    detail::wait_at(detail::wait_site::gate_after_offload, b_, next_user, b_.record_event(d2h_));
  }
  /// Releases an arena's storage on `s` and returns its reservation.
  void drop_arena(staging_arena<B>& a, stream_t<B> s) {
    b_.deallocate_device(a.base, a.bytes, s);
    ++releases_;
    if (a.reserved) unreserve(budget_client::optimizer, a.reserved);
    a = staging_arena<B>{};
  }

  void release_storage(buffer& x, stream_t<B> s) {
    if (!x.device_) return;
    auto const d = x.device_;
    x.device_ = {};
    try {
      b_.deallocate_device(d, x.bytes_, s);
      ++releases_;
    } catch (...) {
      x.device_ = d;
      throw;
    }
    if (x.reserved_) unreserve(x.client_, x.bytes_);
    x.reserved_ = false;
  }

  /// Allocates `n` bytes on `s` (null for 0) and reserves them. Under a strict budget the
  /// reservation comes first, so its refusal allocates nothing, and a failed allocation returns it.
  device_pointer_t<B> allocate_reserved(budget_client c, std::size_t n, stream_t<B> s, bool& reserved) {
    reserved = false;
    if (!link_.budget || link_.budget->policy() != budget_policy::strict) {
      auto const d = b_.allocate_device(n, s);
      reserved = d && link_.budget && reserve(c, n); // no budget: nothing to count (callers checked the link)
      return d;
    }
    bool const r = reserve(c, n);
    try {
      auto const d = b_.allocate_device(n, s);
      reserved = r && d;
      if (r && !d) unreserve(c, n);
      return d;
    } catch (...) {
      if (r) unreserve(c, n);
      throw;
    }
  }

  B& b_;
  pinned_pool<B> pool_;
  stream_t<B> h2d_;
  stream_t<B> d2h_;
  detail::room_source<B>* room_sources_ = nullptr; ///< registered sources, a list in registration order
  bool giving_room_ = false;                       ///< make_room in progress (a source's own loads do not ask again)
  std::uint64_t releases_ = 0;
};

// Defined out of the class, so not inline: a translation unit that declares the engine extern
// (<pipeswap/swap/instantiate.hpp>) neither instantiates nor compiles them, nor the pool's.
template <backend B>
transfer_engine<B>::transfer_engine(B& b, pinned_pool_options pool)
    : b_(b), pool_(b, pool), h2d_(b.new_stream()), d2h_(b.new_stream()) {}

template <backend B>
transfer_engine<B>::~transfer_engine() = default;

} // namespace pipeswap
