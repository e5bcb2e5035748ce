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
//       the user waits the     storage allocated on the h2d stream,
//       load event             H2D behind the mirror's last D2H
//
// Every transfer is guarded by one event per batch; every release is stream-ordered behind the copy
// that reads the storage, so no host thread ever frees memory a copy may still touch. The compute
// stream never waits for a copy it does not need: an offload orders only the D2H behind the compute
// work (one event), and the D2H stream releases the storage itself.
//
// A transfer_engine owns the copy-stream pair (one stream per direction, so offloads and loads
// overlap on full-duplex links) and the pinned pool; the optimizer runtime and the activation manager
// share one engine per device. All calls are made from one host thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/pinned_pool.hpp>

namespace pipeswap {

/// Where a swap_buffer's bytes are.
enum class residency : std::uint8_t {
  device, ///< on the device; no copy in flight
  d2h,    ///< offload in flight; device storage already released behind the copy (stream-ordered)
  host,   ///< in the host mirror; no device storage
  h2d,    ///< load in flight into fresh device storage
};

constexpr std::string_view to_string(residency r) noexcept {
  switch (r) {
  case residency::device: return "device";
  case residency::d2h: return "d2h";
  case residency::host: return "host";
  case residency::h2d: return "h2d";
  }
  return "?";
}

/// One swappable piece of device memory and its host mirror.
template <backend B>
struct swap_buffer {
  std::size_t bytes = 0;
  device_pointer_t<B> device{};
  /// Host bytes. A pool block when owns_mirror, else a view into memory owned elsewhere (the packed
  /// host arena). Null until the first offload of a pool-backed buffer.
  std::byte* mirror = nullptr;
  bool owns_mirror = false;
  residency state = residency::device;
  /// d2h/h2d: the event that completes the copy in flight. host: the D2H that filled the mirror,
  /// until the mirror is host-synchronized or reloaded (the next H2D waits it). device: null.
  event_handle<B> event;
};

template <backend B>
class transfer_engine {
public:
  using buffer = swap_buffer<B>;
  using stream_type = stream_t<B>;

  explicit transfer_engine(B& b, pinned_pool_options pool = {})
      : b_(b), pool_(b, pool), h2d_(b.new_stream()), d2h_(b.new_stream()) {}
  transfer_engine(transfer_engine const&) = delete;
  transfer_engine& operator=(transfer_engine const&) = delete;

  [[nodiscard]] B& backend() const noexcept { return b_; }
  [[nodiscard]] pinned_pool<B>& pool() noexcept { return pool_; }
  [[nodiscard]] stream_type compute() const { return b_.current_stream(); }
  [[nodiscard]] stream_type h2d() const noexcept { return h2d_; }
  [[nodiscard]] stream_type d2h() const noexcept { return d2h_; }

  /// device → d2h for the buffers in `device` state (others are skipped): the d2h stream waits the
  /// compute stream's work so far, copies each buffer into its mirror (allocated from the pool on
  /// first use), and releases its device storage behind the copy. One event guards the batch.
  /// If a call throws, buffers already enqueued are in d2h (covered by the next event recorded on
  /// the d2h stream) and the rest are untouched in `device`.
  void launch_offload(std::span<buffer* const> bufs, char const* label = "offload") {
    auto targets = select(bufs, residency::device, residency::host);
    if (targets.empty()) return;
    detail::scoped_label<B> l(b_, label);
    detail::wait_at(detail::wait_site::offload_after_compute, b_, d2h_, b_.record_event(compute()));
    std::size_t done = 0;
    try {
      for (auto* x : targets) {
        if (x->mirror == nullptr) {
          auto blk = pool_.allocate(x->bytes, d2h_);
          x->mirror = blk.ptr;
          x->owns_mirror = true;
        }
        b_.copy_d2h(x->mirror, x->device, x->bytes, d2h_);
        x->state = residency::d2h;
        x->event = nullptr;
        ++done;
        release_device(*x, d2h_);
      }
    } catch (...) {
      guard(std::span<buffer* const>(targets).first(done), d2h_);
      throw;
    }
    guard(targets, d2h_);
  }

  /// d2h → host for the buffers in `d2h` state: `next_user` (the stream that will allocate the freed
  /// memory next) waits the offload events. The events stay on the buffers to guard their mirrors.
  void wait_offload(std::span<buffer* const> bufs, stream_type next_user) {
    std::vector<buffer*> targets;
    std::vector<event_handle<B>> events;
    for (auto* x : bufs) {
      if (x->state != residency::d2h) continue;
      if (!x->event) guard_one(*x, d2h_);
      if (x->device) release_device(*x, d2h_); // a release that failed at launch
      detail::add_unique<B>(events, x->event);
      targets.push_back(x);
    }
    for (auto const& e : events) detail::wait_at(detail::wait_site::gate_after_offload, b_, next_user, *e);
    for (auto* x : targets) x->state = residency::host;
  }

  /// host → h2d for the buffers in `host` state: device storage is allocated on the h2d stream, which
  /// waits the D2H that last filled each mirror and copies it back. One event guards the batch. If a
  /// call throws, enqueued buffers are in h2d and the rest are back in `host` with no storage.
  void launch_load(std::span<buffer* const> bufs, char const* label = "load") {
    auto targets = select(bufs, residency::host, residency::device);
    if (targets.empty()) return;
    detail::scoped_label<B> l(b_, label);
    std::size_t allocated = 0, done = 0;
    try {
      for (auto* x : targets) {
        if (x->mirror == nullptr) {
          throw state_error("swap buffer of " + std::to_string(x->bytes) +
                            " bytes is host-resident but has no host mirror");
        }
        x->device = b_.allocate_device(x->bytes, h2d_);
        ++allocated;
      }
      std::vector<event_handle<B>> events;
      for (auto* x : targets) detail::add_unique<B>(events, x->event);
      for (auto const& e : events) detail::wait_at(detail::wait_site::load_after_mirror, b_, h2d_, *e);
      for (auto* x : targets) {
        b_.copy_h2d(x->device, x->mirror, x->bytes, h2d_);
        x->state = residency::h2d;
        x->event = nullptr;
        ++done;
      }
    } catch (...) {
      for (std::size_t i = done; i < allocated; ++i) release_device(*targets[i], h2d_);
      guard(std::span<buffer* const>(targets).first(done), h2d_);
      throw;
    }
    guard(targets, h2d_);
  }

  /// h2d → device for the buffers in `h2d` state: `user` waits the load events.
  void wait_load(std::span<buffer* const> bufs, stream_type user) {
    std::vector<buffer*> targets;
    std::vector<event_handle<B>> events;
    for (auto* x : bufs) {
      if (x->state != residency::h2d) continue;
      if (!x->event) guard_one(*x, h2d_);
      detail::add_unique<B>(events, x->event);
      targets.push_back(x);
    }
    for (auto const& e : events) detail::wait_at(detail::wait_site::use_after_load, b_, user, *e);
    for (auto* x : targets) {
      x->state = residency::device;
      x->event = nullptr;
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
    std::vector<event_handle<B>> events;
    for (auto* x : bufs) detail::add_unique<B>(events, x->event);
    for (auto const& e : events) b_.synchronize(*e);
    for (auto* x : bufs) {
      x->event = nullptr;
      if (x->mirror != nullptr) detail::note_host_read(b_, x->mirror, x->bytes);
    }
  }

  /// Gives a pool-owned mirror back to the pool; its bytes may be reused after `last_use`.
  void release_mirror(buffer& x, event_handle<B> last_use = {}) {
    if (x.owns_mirror && x.mirror != nullptr) pool_.deallocate({x.mirror, x.bytes}, std::move(last_use));
    x.mirror = nullptr;
    x.owns_mirror = false;
  }

  /// Releases device storage on `s` (stream-ordered: behind the work enqueued on `s`).
  void release_device(buffer& x, stream_type s) {
    if (!x.device) return;
    auto const d = x.device;
    x.device = {};
    try {
      b_.deallocate_device(d, x.bytes, s);
    } catch (...) {
      x.device = d;
      throw;
    }
  }

private:
  /// Buffers in `from` state; zero-byte ones move straight to `to` (nothing to copy).
  std::vector<buffer*> select(std::span<buffer* const> bufs, residency from, residency to) {
    std::vector<buffer*> out;
    for (auto* x : bufs) {
      if (x->state != from) continue;
      if (x->bytes == 0) {
        x->state = to;
        continue;
      }
      out.push_back(x);
    }
    return out;
  }

  void guard(std::span<buffer* const> done, stream_type s) {
    if (done.empty()) return;
    event_handle<B> e;
    try {
      e = record(b_, s);
    } catch (...) {
      return; // left null: the next wait records a covering event on the same stream
    }
    for (auto* x : done) x->event = e;
  }

  void guard_one(buffer& x, stream_type s) { x.event = record(b_, s); }

  B& b_;
  pinned_pool<B> pool_;
  stream_type h2d_;
  stream_type d2h_;
};

} // namespace pipeswap
