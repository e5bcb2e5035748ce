// pipeswap — saved_tensors: the activation swap manager (activation/activation_swap.hpp) over the
// torch backend, for what autograd saves. pipeswap.torch installs pack() and unpack() as
// torch.autograd.graph.saved_tensors_hooks around each (stage, micro-batch) forward; the pipeline
// order, with pipeswap's injected swap steps, calls the life cycle (docs/pytorch.md, "Activations").
//
//   saved_tensors st(engine, {.min_bytes = 1 << 16});
//   st.begin_run();
//   { auto scope = st.forward({stage, micro}); /* forward under the hooks: pack() */ }
//   st.close(c);
//   st.launch_offload(c); st.wait_offload(c); st.launch_load(c); st.wait_load(c);
//   /* backward under the hooks: unpack() */ st.release(c);
//   st.end_run();
//
// What pack() takes. A saved tensor is taken by its storage: pack() hands autograd a saved_tensor
// (the group's entry and the view's offset, sizes and strides) instead of the tensor. Until the
// group's offload, the storage stays autograd's: every saved_tensor of it shares one saved_storage
// that holds it, so it is freed when autograd drops its last saved_tensor of it, at the same point
// of the backward as without the hooks. The manager takes a reference (backend::adopt) only at
// launch_offload, and only to the storages it moves; it holds what it moves until release(). pack()
// returns the tensor itself — it stays where it is — when
//   * no forward scope is open, or it is on another device than the manager's;
//   * its storage is smaller than min_bytes (a copy that small costs more in launch overhead than
//     the memory it frees, as swap_config::min_swap_numel keeps small optimizer tensors resident);
//   * it is a parameter, or a view of one (its base is a leaf that requires grad);
//   * its storage was marked with keep() (inputs the pipeline holds for the backward, for example);
//   * its storage was saved in another group that still holds it (that group then sees it shared).
// A storage saved twice in one group, or through several views, is registered once: every view's
// saved_tensor names the same entry. A storage anyone besides autograd still references (a stage
// output being sent, an input kept for the backward, a tensor the user holds) is never moved: moving
// it would free nothing, and loading it back would double it. close() decides this at the end of
// the forward, launch_offload() again for what changed since. A group whose offload never comes
// (the order does not swap it, or offload is off) thus costs nothing beyond torch's own lifetimes.
//
// Safety. unpack() of a moved storage whose group is not on the device (its load not waited, or
// never launched) throws state_error naming the group, and so does one of a released group or an
// earlier run: a backward that runs out of order fails at the tensor, never on stale or freed
// memory. abort() releases everything the manager moved behind its copies (a failed step is over,
// as in torch: its graphs then fail at their moved tensors); parameters, gradients and the manager
// stay usable.
//
// Accounting. saved_bytes() follows the groups through the order, not the allocator: each swappable
// storage (one not found referenced elsewhere) counts from its save until its offload is waited,
// again from its load until release(), and, in a group never offloaded, until release();
// saved_bytes().peak is the most of that in the run. So offload=false gives the figure of the same
// order without swap. moved_alive() counts the storages of offloaded groups that are still
// referenced somewhere: zero when every offload really released its memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/intrusive_ptr.h>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/torch/backend.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap::torch {

/// A saved storage while autograd owns it: every saved_tensor of the storage shares one, so the
/// storage lives as long as autograd keeps one of them. launch_offload() empties it when the
/// manager takes the storage to move it.
struct saved_storage {
  c10::Storage storage;
};

/// What pack() leaves autograd in place of a tensor: the storage (while not moved), its entry in the
/// group and the view on it.
struct saved_tensor {
  activation_handle handle; ///< run, group and the entry's index in saved_tensors' group
  std::shared_ptr<saved_storage> held;
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

struct saved_tensors_options {
  /// Storages smaller than this stay on the device (bytes; 0 moves everything).
  std::size_t min_bytes = 0;
};

class saved_tensors {
public:
  using manager = activation_swap<backend>;
  using packed = std::variant<at::Tensor, saved_tensor>;

  saved_tensors(transfer_engine<backend>& engine, saved_tensors_options opts = {})
      : engine_(engine), mgr_(engine), opts_(opts) {}
  saved_tensors(saved_tensors const&) = delete;
  saved_tensors& operator=(saved_tensors const&) = delete;

  [[nodiscard]] saved_tensors_options const& options() const noexcept { return opts_; }

  // ----- runs and scopes ----------------------------------------------------------------------------

  /// A new run (one pipeline step): whatever the last one left is released first.
  void begin_run() {
    end_run();
    mgr_.begin_run();
    log_.clear();
    kept_.clear();
    resident_.clear();
    max_group_bytes_ = 0;
  }
  /// Releases every group of the run (after the last backward, or after a failure).
  void end_run() {
    for (auto it = groups_.begin(); it != groups_.end();) abort((it++)->first);
    mgr_.end_run();
  }

  /// While alive, pack() saves into the group of `c`.
  [[nodiscard]] manager::forward_scope forward(schedule::chunk c) {
    auto const [it, fresh] = groups_.try_emplace(c);
    try {
      return mgr_.forward(c);
    } catch (...) {
      if (fresh) groups_.erase(it);
      throw;
    }
  }

  /// Marks `t`'s storage as one that never moves, while it lives.
  void keep(at::Tensor const& t) {
    if (!t.defined() || !t.has_storage()) return;
    std::erase_if(marked_, [](auto const& w) { return w.expired(); });
    marked_.push_back(t.storage().getWeakStorageImpl());
  }

  // ----- the hooks --------------------------------------------------------------------------------

  /// The pack hook: a saved_tensor for a storage the group takes, else the tensor itself.
  [[nodiscard]] packed pack(at::Tensor const& t) {
    auto const c = mgr_.current();
    if (!c || !stays_eligible(t)) return t;
    auto& g = groups_.at(*c);
    auto* impl = t.storage().unsafeGetStorageImpl();
    if (auto it = by_storage_.find(impl); it != by_storage_.end()) {
      if (auto held = it->second.held.lock()) {         // still autograd's, so `impl` is this very storage
        if (!(it->second.handle.chunk == *c)) return t; // another group's: this reference pins it there
        return view_of(t, it->second.handle, std::move(held));
      }
      by_storage_.erase(it); // an earlier storage at the same address, freed since
    }
    auto held = std::make_shared<saved_storage>(saved_storage{t.storage()});
    activation_handle const h{mgr_.run(), *c, g.entries.size()};
    auto const uid = next_uid_++;
    g.entries.push_back({t.storage().nbytes(), uid, impl, held, t.storage().getWeakStorageImpl()});
    by_storage_.insert_or_assign(impl, registered{h, held});
    note(uid, static_cast<std::int64_t>(t.storage().nbytes()));
    return view_of(t, h, std::move(held));
  }

  /// The unpack hook: the tensor over its storage, or over a moved storage's current device copy.
  [[nodiscard]] at::Tensor unpack(saved_tensor const& s) const {
    if (s.held && s.held->storage) return view(s.held->storage, s);
    auto const g = groups_.find(s.handle.chunk);
    if (s.handle.run != mgr_.run() || g == groups_.end() || s.handle.index >= g->second.entries.size() ||
        !g->second.entries[s.handle.index].moved) {
      (void)mgr_.ptr(s.handle); // throws, naming why: another run, a released group
      throw state_error("saved_tensors::unpack: a saved tensor of group '" + mgr_.group_name(s.handle.chunk) +
                        "' whose storage is gone");
    }
    auto const st = mgr_.state(s.handle.chunk);
    if (st != group_state::collecting && st != group_state::loaded) {
      throw state_error("saved_tensors::unpack: the backward needs a tensor of group '" +
                        mgr_.group_name(s.handle.chunk) + "', which is " + std::string(manager::to_string(st)) +
                        "; its SWAP_WAIT_LOAD must come before the backward");
    }
    return view(engine_.backend().storage(mgr_.ptr(g->second.entries[s.handle.index].at)), s);
  }

  // ----- the life cycle ---------------------------------------------------------------------------

  /// The end of `c`'s forward: storages that something besides autograd references now (the stage's
  /// output, an input kept for the backward, a tensor the user holds) are the pipeline's and stay on
  /// the device; the rest are the group's swappable bytes.
  void close(schedule::chunk c) { classify(group_of(c, "close")); }

  /// Offloads group `c` (closing it first if close() was not called): the manager takes its
  /// swappable storages from autograd, moves them, and releases their device memory behind the copy.
  void launch_offload(schedule::chunk c) {
    auto& g = group_of(c, "launch_offload");
    if (mgr_.state(c) != group_state::collecting) return mgr_.launch_offload(c); // the manager's error
    classify(g);
    {
      auto const scope = mgr_.forward(c);
      auto const s = engine_.compute();
      for (auto& e : g.entries) {
        if (kept_.count(e.uid) || e.moved) continue;
        auto held = e.held.lock();
        if (!held || !held->storage) continue; // classify() kept those autograd dropped
        auto const d = engine_.backend().adopt(held->storage, s);
        try {
          e.at = mgr_.save(d, e.bytes);
        } catch (...) {
          engine_.backend().deallocate_device(d, e.bytes, s); // drops the reference again
          throw;
        }
        e.moved = true;
        held->storage = {};        // the manager's alone now
        by_storage_.erase(e.impl); // released behind the copy: the address may be reused
      }
    }
    mgr_.launch_offload(c);
  }

  void wait_offload(schedule::chunk c) {
    auto& g = group_of(c, "wait_offload");
    mgr_.wait_offload(c);
    for (auto const& e : g.entries) {
      if (e.moved) note(e.uid, -static_cast<std::int64_t>(e.bytes));
    }
  }

  void launch_load(schedule::chunk c) {
    auto& g = group_of(c, "launch_load");
    mgr_.launch_load(c);
    for (auto const& e : g.entries) {
      if (e.moved) note(e.uid, static_cast<std::int64_t>(e.bytes));
    }
  }

  void wait_load(schedule::chunk c) {
    group_of(c, "wait_load");
    mgr_.wait_load(c);
  }

  /// After the backward of `c`: the moved storages' device copies are released (tensors autograd
  /// still holds keep theirs alive); the group is forgotten.
  void release(schedule::chunk c) {
    group_of(c, "release");
    mgr_.release(c);
    forget(c);
  }

  /// Releases everything group `c` holds, whatever its state (copies in flight are settled first).
  void abort(schedule::chunk c) {
    mgr_.abort(c);
    forget(c);
  }

  // ----- what it did ------------------------------------------------------------------------------

  [[nodiscard]] manager const& groups() const noexcept { return mgr_; }
  [[nodiscard]] bool has_group(schedule::chunk c) const { return groups_.count(c) != 0; }

  /// Storages moved by group `c`'s offload (so far in this run).
  [[nodiscard]] std::size_t moved_storages(schedule::chunk c) const {
    std::size_t n = 0;
    for (auto const& e : group_of(c, "moved_storages").entries) n += e.moved;
    return n;
  }
  /// Storages moved by offloads of groups now offloading or offloaded that something still
  /// references (0: every offload released its memory).
  [[nodiscard]] std::size_t moved_alive() const {
    std::size_t n = 0;
    for (auto const& [c, g] : groups_) {
      auto const st = mgr_.state(c);
      if (st != group_state::offloading && st != group_state::offloaded) continue;
      for (auto const& e : g.entries) n += e.moved && !e.weak.expired();
    }
    return n;
  }
  /// Storages saved in group `c` that autograd still holds and the manager has not moved (they are
  /// freed as autograd frees them).
  [[nodiscard]] std::size_t autograd_held(schedule::chunk c) const {
    std::size_t n = 0;
    for (auto const& e : group_of(c, "autograd_held").entries) {
      auto const held = e.held.lock();
      n += held && held->storage;
    }
    return n;
  }

  /// Bytes of swappable saved storages the groups hold on the device now, and the most in this run.
  struct saved_bytes_figures {
    std::int64_t now = 0;
    std::int64_t peak = 0;
  };
  /// Replays the run's log without the storages found kept (which moved nothing).
  [[nodiscard]] saved_bytes_figures saved_bytes() const {
    saved_bytes_figures f;
    for (auto const& [uid, delta] : log_) {
      if (kept_.count(uid)) continue;
      f.now += delta;
      f.peak = std::max(f.peak, f.now);
    }
    return f;
  }
  [[nodiscard]] std::size_t offloaded_bytes() const noexcept { return mgr_.offloaded_bytes(); }
  /// The largest group's swappable bytes in this run (as close() or launch_offload() found them).
  [[nodiscard]] std::size_t max_group_bytes() const noexcept { return max_group_bytes_; }

private:
  struct entry {
    std::size_t bytes = 0;
    std::size_t uid = 0;
    c10::StorageImpl* impl = nullptr; ///< identity only (by_storage_), never dereferenced
    std::weak_ptr<saved_storage> held;
    c10::weak_intrusive_ptr<c10::StorageImpl> weak;
    bool moved = false;
    activation_handle at{}; ///< the manager's handle, once moved
  };
  struct group {
    std::vector<entry> entries;
  };
  struct registered {
    activation_handle handle;
    std::weak_ptr<saved_storage> held;
  };

  [[nodiscard]] bool stays_eligible(at::Tensor const& t) const {
    if (!t.defined() || !t.has_storage() || t.device() != engine_.backend().device()) return false;
    if (t.storage().nbytes() == 0 || t.storage().nbytes() < opts_.min_bytes) return false;
    auto const root = t.is_view() ? t._base() : t;
    if (root.is_leaf() && root.requires_grad()) return false; // a parameter, or a view of one
    auto* impl = t.storage().unsafeGetStorageImpl();
    for (auto const& w : marked_) {
      if (auto p = w.lock(); p && p.get() == impl) return false;
    }
    return true;
  }

  static saved_tensor view_of(at::Tensor const& t, activation_handle h, std::shared_ptr<saved_storage> held) {
    return saved_tensor{h, std::move(held), t.storage_offset(), t.sizes().vec(), t.strides().vec(), t.scalar_type()};
  }
  at::Tensor view(c10::Storage const& storage, saved_tensor const& s) const {
    return at::empty({0}, c10::TensorOptions().dtype(s.dtype).device(engine_.backend().device()))
        .set_(storage, s.offset, s.sizes, s.strides);
  }

  group& group_of(schedule::chunk c, char const* op) {
    return const_cast<group&>(std::as_const(*this).group_of(c, op));
  }
  group const& group_of(schedule::chunk c, char const* op) const {
    auto it = groups_.find(c);
    if (it == groups_.end()) {
      throw state_error("saved_tensors::" + std::string(op) + ": group '" + mgr_.group_name(c) +
                        "' does not exist (its forward did not run in this run, or it was released)");
    }
    return it->second;
  }

  /// Storages referenced besides their saved_storage are kept (for good: the pipeline holds them),
  /// and so are those autograd no longer holds.
  void classify(group& g) {
    std::size_t swappable = 0;
    for (auto const& e : g.entries) {
      if (!kept_.count(e.uid) && !e.moved) {
        auto const held = e.held.lock(); // none: autograd dropped it already, there is nothing to move
        if (!held || !held->storage || held->storage.use_count() > 1) kept_.insert(e.uid);
      }
      if (!kept_.count(e.uid)) swappable += e.bytes;
    }
    max_group_bytes_ = std::max(max_group_bytes_, swappable);
  }

  void forget(schedule::chunk c) {
    auto it = groups_.find(c);
    if (it == groups_.end()) return;
    for (auto const& e : it->second.entries) {
      auto o = by_storage_.find(e.impl);
      if (o != by_storage_.end() && o->second.handle.chunk == c) by_storage_.erase(o);
      if (resident_.count(e.uid)) note(e.uid, -static_cast<std::int64_t>(e.bytes)); // its device copy goes
    }
    groups_.erase(it);
  }

  void note(std::size_t uid, std::int64_t delta) {
    log_.emplace_back(uid, delta);
    if (delta > 0) {
      resident_.insert(uid);
    } else {
      resident_.erase(uid);
    }
  }

  transfer_engine<backend>& engine_;
  manager mgr_;
  saved_tensors_options opts_;
  std::map<schedule::chunk, group> groups_;
  std::map<c10::StorageImpl*, registered> by_storage_; ///< storages autograd holds for a group, by identity
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> marked_;
  std::vector<std::pair<std::size_t, std::int64_t>> log_;
  std::set<std::size_t> kept_;
  std::set<std::size_t> resident_;
  std::size_t next_uid_ = 0;
  std::size_t max_group_bytes_ = 0;
};

} // namespace pipeswap::torch
