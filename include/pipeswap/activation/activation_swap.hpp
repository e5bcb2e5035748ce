// pipeswap — the activation swap manager for pipeline parallelism.
//
// A pipeline stage saves activations in forward and needs them again only in backward. The manager
// keeps them in groups, one per (stage, micro-batch) of a run, and moves each group through the same
// life cycle as optimizer state (transfer_engine): launch_offload after the forward, wait_offload,
// launch_load before the backward, wait_load right before it. The injected pipeline order
// (schedule/inject.hpp) says when.
//
// What it fixes relative to the reference SwapManager (reference.md §3, §5):
//  * Registration is scoped, not process-wide: saved buffers go to the group of the forward_scope
//    that is open, and scopes nest and restore on exit (also on exceptions). In an OVERLAP_B_F step
//    only the forward leaf runs inside its scope, so the backward's buffers cannot land in the
//    forward's group.
//  * Groups are named per run (generation, stage, micro): names are never reused across runs, and
//    abort()/end_run() release everything a group holds.
//  * Alias protection compares live device ranges only: a released buffer has no range and can
//    never be matched, so protecting one tensor cannot pin every released tensor of the group.
//  * Device storage is released on the d2h stream behind its D2H; the compute stream waits the
//    offload (wait_offload) only so the memory is reusable by the next forward.
//
// Ownership: save() takes ownership of device memory allocated with the backend; the manager frees
// it in release() (after the backward used it), abort() or end_run(). Pointers change across a swap:
// read them with ptr() after wait_load().
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap {

/// A pipeline chunk: stage index and micro-batch index.
struct chunk_id {
  int stage = 0;
  int micro = 0;
  friend constexpr auto operator<=>(chunk_id, chunk_id) = default;
};

/// A saved activation: which group, which buffer in it.
struct activation_handle {
  std::uint64_t run = 0;
  chunk_id chunk;
  std::size_t index = 0;
  bool swapped = false; ///< false: saved outside any forward scope, not managed
};

/// Life cycle of a group.
enum class group_state : std::uint8_t { collecting, offloading, offloaded, loading, loaded };

template <backend B>
class activation_swap {
public:
  using buffer = swap_buffer<B>;

  explicit activation_swap(transfer_engine<B>& x) : x_(x) {}
  activation_swap(activation_swap const&) = delete;
  activation_swap& operator=(activation_swap const&) = delete;
  /// Releases everything still held (as abort() of every group). Never throws.
  ~activation_swap() {
    try {
      end_run();
    } catch (...) {
    }
  }

  // ----- runs and scopes ----------------------------------------------------------------------------

  /// Starts a new run (one pipeline schedule execution): groups of earlier runs are released first.
  void begin_run() {
    end_run();
    ++run_;
  }
  /// Releases every group of the current run (normal end, or cleanup after a failure).
  void end_run() {
    while (!groups_.empty()) abort(groups_.begin()->first);
  }
  [[nodiscard]] std::uint64_t run() const noexcept { return run_; }

  /// The reference-compatible name of a chunk's group in this run: "pp_swap_run{g}_s{s}_m{m}".
  [[nodiscard]] std::string group_name(chunk_id c) const {
    return "pp_swap_run" + std::to_string(run_) + "_s" + std::to_string(c.stage) + "_m" +
           std::to_string(c.micro);
  }

  /// While alive, save() registers into the group of `c`. Scopes nest; the previous one is restored
  /// when this one ends, also by an exception.
  class forward_scope {
  public:
    forward_scope(forward_scope const&) = delete;
    forward_scope& operator=(forward_scope const&) = delete;
    ~forward_scope() { m_.current_ = prev_; }

  private:
    friend class activation_swap;
    forward_scope(activation_swap& m, chunk_id c) : m_(m), prev_(m.current_) { m_.current_ = c; }
    activation_swap& m_;
    std::optional<chunk_id> prev_;
  };

  /// Opens the forward scope of chunk `c`, creating its group. A group that is past collecting
  /// (already offloaded) cannot take more buffers.
  [[nodiscard]] forward_scope forward(chunk_id c) {
    auto& g = groups_[c];
    if (g.state != group_state::collecting) {
      throw state_error("SwapGroup '" + group_name(c) + "' is " + std::string(to_string(g.state)) +
                        " and cannot take saved activations");
    }
    return forward_scope(*this, c);
  }

  [[nodiscard]] std::optional<chunk_id> current() const noexcept { return current_; }

  // ----- registration -----------------------------------------------------------------------------

  /// Saves `bytes` of device memory at `d` (allocated with the backend; ownership passes to the
  /// manager) into the current forward scope's group. Outside a scope the buffer is not managed: the
  /// handle says swapped = false and the caller keeps ownership.
  activation_handle save(device_pointer_t<B> d, std::size_t bytes) {
    if (!current_) return activation_handle{run_, {}, 0, false};
    auto& g = get(*current_, "save");
    if (g.state != group_state::collecting) {
      throw state_error("SwapGroup '" + group_name(*current_) + "' already launched its offload");
    }
    auto& e = g.entries.emplace_back();
    e.buf = std::make_unique<buffer>();
    e.buf->bytes = bytes;
    e.buf->device = d;
    e.buf->state = residency::device;
    return activation_handle{run_, *current_, g.entries.size() - 1, true};
  }

  /// Keeps on the device every buffer of `c`'s group that overlaps device bytes [d, d + bytes): the
  /// pipeline still holds them (stage inputs, received buffers, last-stage outputs).
  void protect(chunk_id c, device_pointer_t<B> d, std::size_t bytes) {
    auto& g = get(c, "protect");
    if (bytes == 0 || !d) return;
    for (auto& e : g.entries) {
      auto const& x = *e.buf;
      if (x.state != residency::device || !x.device || x.bytes == 0) continue; // released: no range
      if (x.device < d + bytes && d < x.device + x.bytes) e.keep = true;
    }
  }

  /// The current device address of a saved activation; it must be on the device.
  [[nodiscard]] device_pointer_t<B> ptr(activation_handle const& h) const {
    if (!h.swapped) throw invalid_argument("activation handle was not saved in a forward scope");
    auto const& e = entry(h);
    if (e.buf->state != residency::device) {
      throw state_error("activation " + std::to_string(h.index) + " of SwapGroup '" + group_name(h.chunk) +
                        "' is " + std::string(pipeswap::to_string(e.buf->state)) + "; wait_load first");
    }
    return e.buf->device;
  }

  // ----- the life cycle ---------------------------------------------------------------------------

  void launch_offload(chunk_id c) {
    auto& g = get(c, "launch_offload");
    if (g.state != group_state::collecting) {
      throw state_error("SwapGroup '" + group_name(c) + "' launch_offload() called twice");
    }
    if (current_ && *current_ == c) current_.reset(); // the forward that filled it is over
    auto bufs = movable(g);
    x_.launch_offload(bufs, ("offload " + group_name(c)).c_str());
    g.state = group_state::offloading;
    for (auto* x : bufs) offloaded_bytes_ += x->bytes;
  }

  void wait_offload(chunk_id c) {
    auto& g = get(c, "wait_offload");
    if (g.state != group_state::offloading) {
      throw state_error("SwapGroup '" + group_name(c) + "' wait_offload() called before launch_offload().");
    }
    x_.wait_offload(movable(g), x_.compute());
    g.state = group_state::offloaded;
  }

  void launch_load(chunk_id c) {
    auto& g = get(c, "launch_load");
    if (g.state != group_state::offloaded) {
      throw state_error("SwapGroup '" + group_name(c) + "' launch_load() called before wait_offload().");
    }
    x_.launch_load(movable(g), ("load " + group_name(c)).c_str());
    g.state = group_state::loading;
  }

  /// The compute stream waits the loads; the mirrors go back to the pool behind them.
  void wait_load(chunk_id c) {
    auto& g = get(c, "wait_load");
    if (g.state != group_state::loading) {
      throw state_error("SwapGroup '" + group_name(c) + "' wait_load() called before launch_load().");
    }
    auto bufs = movable(g);
    std::vector<event_handle<B>> used(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) used[i] = bufs[i]->event;
    x_.wait_load(bufs, x_.compute());
    for (std::size_t i = 0; i < bufs.size(); ++i) x_.release_mirror(*bufs[i], used[i]);
    g.state = group_state::loaded;
  }

  /// After the backward consumed the group: frees its device storage (stream-ordered behind the
  /// compute stream's work) and forgets it. Valid in collecting (never swapped) and loaded states.
  void release(chunk_id c) {
    auto& g = get(c, "release");
    if (g.state != group_state::collecting && g.state != group_state::loaded) {
      throw state_error("SwapGroup '" + group_name(c) + "' is " + std::string(to_string(g.state)) +
                        "; release() needs it collecting or loaded");
    }
    abort(c);
  }

  /// Releases everything a group holds, whatever its state (cleanup after a failure): transfers in
  /// flight are settled first, so no copy outlives the memory it touches.
  void abort(chunk_id c) {
    auto it = groups_.find(c);
    if (it == groups_.end()) return;
    auto& g = it->second;
    std::vector<buffer*> all;
    for (auto& e : g.entries) all.push_back(e.buf.get());
    x_.settle(all);
    for (auto* x : all) {
      x_.release_device(*x, x_.compute());
      x_.release_mirror(*x, x->event);
      x->event = nullptr;
    }
    if (current_ && *current_ == c) current_.reset();
    groups_.erase(it);
  }

  [[nodiscard]] bool has_group(chunk_id c) const { return groups_.count(c) != 0; }
  [[nodiscard]] group_state state(chunk_id c) const { return cget(c, "state").state; }
  [[nodiscard]] std::size_t active_groups() const noexcept { return groups_.size(); }
  [[nodiscard]] std::size_t group_bytes(chunk_id c) const {
    std::size_t n = 0;
    for (auto const& e : cget(c, "group_bytes").entries) n += e.buf->bytes;
    return n;
  }
  /// Bytes of buffers that stay on the device because they are protected.
  [[nodiscard]] std::size_t kept_bytes(chunk_id c) const {
    std::size_t n = 0;
    for (auto const& e : cget(c, "kept_bytes").entries) n += e.keep ? e.buf->bytes : 0;
    return n;
  }
  [[nodiscard]] std::size_t offloaded_bytes() const noexcept { return offloaded_bytes_; }

  static constexpr std::string_view to_string(group_state s) noexcept {
    switch (s) {
    case group_state::collecting: return "collecting";
    case group_state::offloading: return "offloading";
    case group_state::offloaded: return "offloaded";
    case group_state::loading: return "loading";
    case group_state::loaded: return "loaded";
    }
    return "?";
  }

private:
  struct entry_t {
    std::unique_ptr<buffer> buf;
    bool keep = false;
  };
  struct group {
    group_state state = group_state::collecting;
    std::vector<entry_t> entries;
  };

  group& get(chunk_id c, char const*) {
    auto it = groups_.find(c);
    if (it == groups_.end()) throw state_error("Group " + group_name(c) + " does not exist.");
    return it->second;
  }
  group const& cget(chunk_id c, char const*) const {
    auto it = groups_.find(c);
    if (it == groups_.end()) throw state_error("Group " + group_name(c) + " does not exist.");
    return it->second;
  }
  entry_t const& entry(activation_handle const& h) const {
    if (h.run != run_) {
      throw state_error("activation handle of run " + std::to_string(h.run) + " used in run " +
                        std::to_string(run_));
    }
    auto const& g = cget(h.chunk, "ptr");
    if (h.index >= g.entries.size()) throw invalid_argument("activation handle index out of range");
    return g.entries[h.index];
  }
  static std::vector<buffer*> movable(group& g) {
    std::vector<buffer*> out;
    for (auto& e : g.entries) {
      if (!e.keep) out.push_back(e.buf.get());
    }
    return out;
  }

  transfer_engine<B>& x_;
  std::uint64_t run_ = 0;
  std::map<chunk_id, group> groups_;
  std::optional<chunk_id> current_;
  std::size_t offloaded_bytes_ = 0;
};

} // namespace pipeswap
