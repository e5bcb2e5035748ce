// pipeswap — the activation swap manager for pipeline parallelism.
//
// A pipeline stage saves activations in forward and needs them again only in backward. The manager
// keeps them in groups, one per (stage, micro-batch) of a run, and moves each group through the same
// life cycle as optimizer state (transfer_engine): launch_offload after the forward, wait_offload,
// launch_load before the backward, wait_load right before it. The injected pipeline order
// (schedule/inject.hpp) says when.
//
// What it fixes relative to hyper-parallel's SwapManager (docs/activation.md):
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
// Device budget (core/budget.hpp, docs/activation.md): the storage a load brings back is a required
// reservation of the engine's budget (client activation), returned when the group is released. From
// launch_offload until its launch_load (or release), a group's bytes are reload demand: an optional
// reservation (an optimizer prefetch) leaves them free, so activation loads take precedence.
//
// Ownership: save() takes ownership of device memory allocated with the backend; the manager frees
// it in release() (after the backward used it), abort() or end_run(). Pointers change across a swap:
// read them with ptr() after wait_load(). The manager enforces this on every backend, at the call:
// save() needs an open forward scope, and a range that overlaps a buffer the manager already holds
// (the same buffer twice, in one group or two, or a sub-range of one) is rejected, so nothing is
// ever freed twice.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap {

/// A saved activation: which group (the chunk, schedule/step.hpp: stage and micro-batch), which buffer
/// in it.
struct activation_handle {
  std::uint64_t run = 0;
  schedule::chunk chunk;
  std::size_t index = 0;
};

/// Life cycle of a group.
enum class group_state : std::uint8_t { collecting, offloading, offloaded, loading, loaded };

template <backend B>
class activation_swap {
public:
  using buffer = swap_buffer<B>;

  explicit activation_swap(transfer_engine<B>& engine) : engine_(engine) {}
  activation_swap(activation_swap const&) = delete;
  activation_swap& operator=(activation_swap const&) = delete;
  /// Releases everything still held (as abort() of every group). Never throws.
  ~activation_swap() {
    try {
      end_run();
    } catch (...) {}
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

  /// The hyper-parallel-compatible name of a chunk's group in this run: "pp_swap_run{g}_s{s}_m{m}".
  [[nodiscard]] std::string group_name(schedule::chunk c) const {
    return detail::message({"pp_swap_run", run_, "_s", c.stage, "_m", c.micro});
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
    forward_scope(activation_swap& m, schedule::chunk c) : m_(m), prev_(m.current_) { m_.current_ = c; }
    activation_swap& m_;
    std::optional<schedule::chunk> prev_;
  };

  /// Opens the forward scope of chunk `c`, creating its group. A group that is past collecting
  /// (already offloaded) cannot take more buffers.
  [[nodiscard]] forward_scope forward(schedule::chunk c) {
    auto& g = groups_[c];
    if (g.state != group_state::collecting) {
      throw state_error("activation_swap::forward: group '" + group_name(c) + "' is " +
                        std::string(to_string(g.state)) + " and cannot take saved activations");
    }
    return forward_scope(*this, c);
  }

  [[nodiscard]] std::optional<schedule::chunk> current() const noexcept { return current_; }

  // ----- registration -----------------------------------------------------------------------------

  /// Saves `bytes` of device memory at `d` (allocated with the backend; ownership passes to the
  /// manager) into the current forward scope's group. Throws state_error, changing nothing, when no
  /// forward scope is open, or when [d, d + bytes) overlaps a buffer the manager holds on the device
  /// (saved before, in this group or another, or the whole of which this is a part).
  activation_handle save(device_pointer_t<B> d, std::size_t bytes) {
    if (!current_) {
      throw state_error("activation_swap::save: no forward scope is open; open one with forward({stage, "
                        "micro}) around the forward (the manager owns what it saves, so it must know the group)");
    }
    auto& g = get(*current_, "save");
    if (g.state != group_state::collecting) {
      throw state_error("activation_swap::save: group '" + group_name(*current_) + "' already launched its offload");
    }
    if (bytes > 0 && d) {
      if (auto const* o = overlapping(d, bytes)) {
        throw state_error(detail::message({"activation_swap::save: ", bytes, " bytes at device address ", describe(d),
                                           " overlap activation ", o->index, " of group '", group_name(o->chunk), "' (",
                                           o->bytes, " bytes at ", describe(o->at),
                                           "), which the manager already owns; save each buffer once, whole"}));
      }
    }
    auto& e = g.entries.emplace_back();
    e.buf = std::make_unique<buffer>(bytes);
    try {
      engine_.set_client(*e.buf, budget_client::activation);
      engine_.adopt_device(*e.buf, d);
      e.keep = covered(g, d, bytes);
      if (bytes > 0 && d) live_.emplace(d, live_range{d, bytes, *current_, g.entries.size() - 1});
    } catch (...) {
      g.entries.pop_back();
      throw;
    }
    return activation_handle{run_, *current_, g.entries.size() - 1};
  }

  /// Keeps on the device every buffer of `c`'s group that overlaps device bytes [d, d + bytes), saved
  /// before or after this call: the pipeline still holds them (stage inputs, received buffers,
  /// last-stage outputs). The group must still be collecting.
  void protect(schedule::chunk c, device_pointer_t<B> d, std::size_t bytes) {
    auto& g = get(c, "protect");
    if (g.state != group_state::collecting) {
      throw state_error("activation_swap::protect: group '" + group_name(c) + "' already launched its offload");
    }
    if (bytes == 0 || !d) return;
    g.guarded.push_back({d, bytes});
    for (auto& e : g.entries) {
      auto const& x = *e.buf;
      if (x.state() != residency::device || !x.device() || x.bytes() == 0) continue; // released: no range
      if (x.device() < d + bytes && d < x.device() + x.bytes()) e.keep = true;
    }
  }

  /// The current device address of a saved activation; it must be on the device.
  [[nodiscard]] device_pointer_t<B> ptr(activation_handle const& h) const {
    auto const& e = entry(h);
    if (e.buf->state() != residency::device) {
      throw state_error(
          detail::message({"activation_swap::ptr: activation ", h.index, " of group '", group_name(h.chunk), "' is ",
                           pipeswap::to_string(e.buf->state()), "; wait_load first"}));
    }
    return e.buf->device();
  }

  // ----- the life cycle ---------------------------------------------------------------------------

  void launch_offload(schedule::chunk c) {
    auto& g = get(c, "launch_offload");
    if (g.state != group_state::collecting) {
      throw state_error("activation_swap::launch_offload: group '" + group_name(c) + "' is " +
                        std::string(to_string(g.state)) + "; launch_offload() is called once, after the forward");
    }
    if (current_ && *current_ == c) current_.reset(); // the forward that filled it is over
    auto bufs = movable(g);
    forget_ranges(c, g, false);
    engine_.launch_offload(bufs, ("offload " + group_name(c)).c_str());
    g.state = group_state::offloading;
    std::uint64_t n = 0;
    for (auto* x : bufs) n += x->bytes();
    offloaded_bytes_ += n;
    try {
      engine_.add_reload_demand(n);
      g.demand = n;
    } catch (...) { // the offload is launched; only the precedence bookkeeping failed (orphaned budget)
    }
  }

  void wait_offload(schedule::chunk c) {
    auto& g = get(c, "wait_offload");
    if (g.state != group_state::offloading) {
      throw state_error("activation_swap::wait_offload: group '" + group_name(c) + "' is " +
                        std::string(to_string(g.state)) + "; call launch_offload() first");
    }
    engine_.wait_offload(movable(g), engine_.compute());
    g.state = group_state::offloaded;
  }

  void launch_load(schedule::chunk c) {
    auto& g = get(c, "launch_load");
    if (g.state != group_state::offloaded) {
      throw state_error("activation_swap::launch_load: group '" + group_name(c) + "' is " +
                        std::string(to_string(g.state)) + "; call wait_offload() first");
    }
    engine_.launch_load(movable(g), ("load " + group_name(c)).c_str());
    g.state = group_state::loading;
    engine_.drop_reload_demand(g.demand); // the load's storage is reserved now
    g.demand = 0;
  }

  /// The compute stream waits the loads; the mirrors go back to the pool behind them.
  void wait_load(schedule::chunk c) {
    auto& g = get(c, "wait_load");
    if (g.state != group_state::loading) {
      throw state_error("activation_swap::wait_load: group '" + group_name(c) + "' is " +
                        std::string(to_string(g.state)) + "; call launch_load() first");
    }
    auto bufs = movable(g);
    std::vector<event_handle<B>> used(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) used[i] = bufs[i]->event();
    engine_.wait_load(bufs, engine_.compute());
    for (std::size_t i = 0; i < bufs.size(); ++i) engine_.release_mirror(*bufs[i], used[i]);
    g.state = group_state::loaded;
    for (std::size_t i = 0; i < g.entries.size(); ++i) { // the manager owns the new storage too
      auto const& x = *g.entries[i].buf;
      if (!g.entries[i].keep && x.bytes() > 0 && x.device())
        live_.emplace(x.device(), live_range{x.device(), x.bytes(), c, i});
    }
  }

  /// After the backward consumed the group: frees its device storage (stream-ordered behind the
  /// compute stream's work) and forgets it. Valid in collecting (never swapped) and loaded states.
  void release(schedule::chunk c) {
    auto& g = get(c, "release");
    if (g.state != group_state::collecting && g.state != group_state::loaded) {
      throw state_error("activation_swap::release: group '" + group_name(c) + "' is " +
                        std::string(to_string(g.state)) + "; release() needs it collecting or loaded");
    }
    abort(c);
  }

  /// Releases everything a group holds, whatever its state (cleanup after a failure): transfers in
  /// flight are settled first, so no copy outlives the memory it touches.
  void abort(schedule::chunk c) {
    auto it = groups_.find(c);
    if (it == groups_.end()) return;
    auto& g = it->second;
    std::vector<buffer*> all;
    for (auto& e : g.entries) all.push_back(e.buf.get());
    forget_ranges(c, g, true);
    engine_.settle(all);
    for (auto* x : all) {
      auto const last = x->event();
      engine_.discard_device(*x, engine_.compute());
      engine_.release_mirror(*x, last);
    }
    if (current_ && *current_ == c) current_.reset();
    engine_.drop_reload_demand(g.demand);
    groups_.erase(it);
  }

  [[nodiscard]] bool has_group(schedule::chunk c) const { return groups_.count(c) != 0; }
  [[nodiscard]] group_state state(schedule::chunk c) const { return cget(c, "state").state; }
  [[nodiscard]] std::size_t active_groups() const noexcept { return groups_.size(); }
  [[nodiscard]] std::size_t group_bytes(schedule::chunk c) const {
    std::size_t n = 0;
    for (auto const& e : cget(c, "group_bytes").entries) n += e.buf->bytes();
    return n;
  }
  /// Bytes of buffers that stay on the device because they are protected.
  [[nodiscard]] std::size_t kept_bytes(schedule::chunk c) const {
    std::size_t n = 0;
    for (auto const& e : cget(c, "kept_bytes").entries) n += e.keep ? e.buf->bytes() : 0;
    return n;
  }
  [[nodiscard]] std::size_t offloaded_bytes() const noexcept { return offloaded_bytes_; }
  /// Bytes of this manager's offloaded groups that will be loaded again (the budget's reload demand).
  [[nodiscard]] std::uint64_t reload_demand() const noexcept {
    std::uint64_t n = 0;
    for (auto const& [c, g] : groups_) n += g.demand;
    return n;
  }

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
  struct range {
    device_pointer_t<B> at{};
    std::size_t bytes = 0;
  };
  struct group {
    group_state state = group_state::collecting;
    std::vector<entry_t> entries;
    std::vector<range> guarded; ///< protect()ed ranges
    std::uint64_t demand = 0;   ///< reload demand reported to the budget (offloading/offloaded)
  };
  /// A device range the manager owns, keyed by its address.
  struct live_range {
    device_pointer_t<B> at{};
    std::size_t bytes = 0;
    schedule::chunk chunk;
    std::size_t index = 0;
  };

  group& get(schedule::chunk c, char const* op) { return const_cast<group&>(std::as_const(*this).cget(c, op)); }
  group const& cget(schedule::chunk c, char const* op) const {
    auto it = groups_.find(c);
    if (it == groups_.end()) {
      throw state_error("activation_swap::" + std::string(op) + ": group '" + group_name(c) +
                        "' does not exist (open it with forward() in this run)");
    }
    return it->second;
  }
  entry_t const& entry(activation_handle const& h) const {
    if (h.run != run_) {
      throw state_error(detail::message({"activation_swap::ptr: a handle of run ", h.run, " used in run ", run_}));
    }
    auto const& g = cget(h.chunk, "ptr");
    if (h.index >= g.entries.size()) {
      throw invalid_argument(
          detail::message({"activation_swap::ptr: handle index ", h.index, " is out of range for group '",
                           group_name(h.chunk), "' (", g.entries.size(), " activations)"}));
    }
    return g.entries[h.index];
  }
  /// The live range overlapping [d, d + bytes), if any.
  live_range const* overlapping(device_pointer_t<B> d, std::size_t bytes) const {
    auto it = live_.lower_bound(d);
    if (it != live_.end() && it->second.at < d + bytes) return &it->second;
    if (it != live_.begin()) {
      auto const& prev = std::prev(it)->second;
      if (d < prev.at + prev.bytes) return &prev;
    }
    return nullptr;
  }
  static bool covered(group const& g, device_pointer_t<B> d, std::size_t bytes) {
    if (bytes == 0 || !d) return false;
    for (auto const& r : g.guarded) {
      if (d < r.at + r.bytes && r.at < d + bytes) return true;
    }
    return false;
  }
  /// Drops the live ranges of group `c` whose storage is about to move (`all`: or be freed).
  void forget_ranges(schedule::chunk c, group const& g, bool all) {
    for (auto const& e : g.entries) {
      if (e.keep && !all) continue;
      auto const& x = *e.buf;
      if (!x.device()) continue;
      auto it = live_.find(x.device());
      if (it != live_.end() && it->second.chunk == c) live_.erase(it);
    }
  }
  static std::string describe(device_pointer_t<B> d) {
    if constexpr (requires { d.address(); }) {
      return std::to_string(d.address());
    } else {
      return "?";
    }
  }
  static std::vector<buffer*> movable(group& g) {
    std::vector<buffer*> out;
    for (auto& e : g.entries) {
      if (!e.keep) out.push_back(e.buf.get());
    }
    return out;
  }

  transfer_engine<B>& engine_;
  std::uint64_t run_ = 0;
  std::map<schedule::chunk, group> groups_;
  std::map<device_pointer_t<B>, live_range> live_;
  std::optional<schedule::chunk> current_;
  std::size_t offloaded_bytes_ = 0;
};

} // namespace pipeswap
