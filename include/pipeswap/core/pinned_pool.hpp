// pipeswap — the pinned host memory pool shared by the optimizer runtime and the activation manager.
//
// Pinned allocations are expensive (a cudaHostAlloc costs milliseconds and may synchronize the device)
// and a training step needs thousands of host mirrors, so the pool carves small blocks out of pinned
// slabs and gives large requests a dedicated allocation of exactly the requested size (no
// power-of-two rounding: on a 70B model that rounding would waste hundreds of gigabytes).
//
// Slabs grow geometrically: the first is first_slab_bytes (1 MiB), each later one as large as all
// slabs so far, up to slab_bytes (64 MiB). Slab memory is thus at most about twice what small blocks
// ever needed at once (plus one first slab), whatever the model's size: a 4 MB model pins a few MiB,
// not 64.
//
// Blocks come back with the event after which their last copy is complete. The next owner of the
// bytes inherits those events: a device-side user makes its stream wait them (allocate), a host-side
// user synchronizes them (allocate_for_host). Returning a block therefore never blocks the host, and
// reusing it is always ordered behind the copy that used it before.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/detail/round.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap {

/// A range of pinned host bytes owned by whoever holds it.
struct pinned_block {
  std::byte* ptr = nullptr;
  std::size_t bytes = 0;
  [[nodiscard]] explicit operator bool() const noexcept { return ptr != nullptr; }
};

/// The pool's runtime knobs. Slabs are the pinned allocations small blocks are carved from.
struct pinned_pool_options {
  /// Largest slab. At least dedicated_threshold, so that every small block fits in one.
  std::size_t slab_bytes = std::size_t{64} << 20;
  /// Requests of at least this size get a dedicated, exact-size allocation instead of slab space.
  std::size_t dedicated_threshold = std::size_t{4} << 20;
  /// Alignment (and granularity) of blocks carved from slabs; a power of two.
  std::size_t alignment = 512;
  /// Size of the first slab; each later slab is as large as all slabs so far (at least the block it
  /// is made for, at most slab_bytes). Capped at slab_bytes.
  std::size_t first_slab_bytes = std::size_t{1} << 20;
};

/// Statistics of a pinned_pool.
struct pinned_pool_stats {
  std::size_t reserved_bytes = 0; ///< pinned bytes obtained from the backend
  std::size_t used_bytes = 0;     ///< bytes in blocks handed out
  std::size_t peak_used_bytes = 0;
  std::size_t slabs = 0;     ///< slabs held
  std::size_t dedicated = 0; ///< dedicated blocks held (in use or parked for reuse)
};

template <backend B>
class pinned_pool {
public:
  explicit pinned_pool(B& b, pinned_pool_options opts = {}) : b_(b), opts_(opts) {
    if (opts_.alignment == 0 || (opts_.alignment & (opts_.alignment - 1)) != 0) {
      throw invalid_argument(detail::message({"pinned_pool: alignment ", opts_.alignment, " is not a power of two"}));
    }
    if (opts_.slab_bytes < opts_.dedicated_threshold) {
      throw invalid_argument(
          detail::message({"pinned_pool: slab_bytes (", opts_.slab_bytes, ") must be at least dedicated_threshold (",
                           opts_.dedicated_threshold, ")"}));
    }
    if (opts_.first_slab_bytes == 0) {
      throw invalid_argument("pinned_pool: first_slab_bytes must be positive");
    }
  }
  pinned_pool(pinned_pool const&) = delete;
  pinned_pool& operator=(pinned_pool const&) = delete;

  /// Returns everything to the backend after synchronizing pending release events.
  ~pinned_pool() {
    try {
      for (auto& d : dedicated_) {
        sync(d.pending);
        b_.deallocate_host(d.base, d.bytes);
      }
      for (auto& c : slabs_) {
        for (auto& r : c->free) sync(r.pending);
        b_.deallocate_host(c->base, c->bytes);
      }
    } catch (...) { // destructors never throw; the backend reports its own failures
    }
  }

  /// A block of at least `n` bytes whose device-side first user is `first_user`: the stream is made
  /// to wait for the block's previous copies. n == 0 gives an empty block.
  pinned_block allocate(std::size_t n, stream_t<B> first_user) {
    detail::lean_vector<event_handle<B>> pending;
    auto blk = take(n, pending);
    for (auto const& e : pending) b_.wait_event(first_user, *e);
    return blk;
  }

  /// A block the host will write first: synchronizes the block's previous copies.
  pinned_block allocate_for_host(std::size_t n) {
    detail::lean_vector<event_handle<B>> pending;
    auto blk = take(n, pending);
    try {
      sync(pending);
    } catch (...) {
      give_back(blk, std::move(pending));
      throw;
    }
    return blk;
  }

  /// Returns a block. `last_use` is an event after which no copy touches the bytes any more (null
  /// when nothing enqueued uses them).
  void deallocate(pinned_block blk, event_handle<B> last_use = {}) {
    if (!blk) return;
    detail::lean_vector<event_handle<B>> pending;
    if (last_use) pending.push_back(std::move(last_use));
    give_back(blk, std::move(pending));
  }

  /// Gives fully free slabs and parked dedicated blocks back to the backend (synchronizing their
  /// pending events).
  void trim() {
    for (auto it = dedicated_.begin(); it != dedicated_.end();) {
      if (it->in_use) {
        ++it;
        continue;
      }
      sync(it->pending);
      b_.deallocate_host(it->base, it->bytes);
      stats_.reserved_bytes -= it->bytes;
      --stats_.dedicated;
      it = dedicated_.erase(it);
    }
    for (auto it = slabs_.begin(); it != slabs_.end();) {
      auto& c = **it;
      if (c.free.size() == 1 && c.free.front().bytes == c.bytes) {
        sync(c.free.front().pending);
        b_.deallocate_host(c.base, c.bytes);
        stats_.reserved_bytes -= c.bytes;
        slab_bytes_held_ -= c.bytes;
        --stats_.slabs;
        it = slabs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  [[nodiscard]] pinned_pool_stats stats() const noexcept { return stats_; }
  [[nodiscard]] pinned_pool_options const& options() const noexcept { return opts_; }

private:
  struct free_range {
    std::size_t offset = 0;
    std::size_t bytes = 0;
    detail::lean_vector<event_handle<B>> pending;
  };
  struct slab {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
    detail::lean_vector<free_range> free; // by ascending offset; neighbours are always coalesced
  };
  struct dedicated_block {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
    detail::lean_vector<event_handle<B>> pending; // kept only while the block is parked for reuse
    bool in_use = true;
  };

  /// Index of the first dedicated block whose base is not below `p`.
  [[nodiscard]] std::size_t dedicated_at(std::byte const* p) const noexcept {
    std::size_t lo = 0, hi = dedicated_.size();
    while (lo < hi) {
      auto const mid = lo + (hi - lo) / 2;
      if (reinterpret_cast<std::uintptr_t>(dedicated_[mid].base) < reinterpret_cast<std::uintptr_t>(p)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  [[nodiscard]] std::size_t round(std::size_t n) const { return detail::round_up(n, opts_.alignment); }

  /// The size of the next slab, made for a block of `need` bytes.
  [[nodiscard]] std::size_t next_slab_size(std::size_t need) const {
    auto const cap = opts_.slab_bytes;
    auto const grown = std::max(std::min(opts_.first_slab_bytes, cap), slab_bytes_held_);
    return round(std::max(std::min(grown, cap), need));
  }

  void sync(detail::lean_vector<event_handle<B>>& pending) {
    for (auto const& e : pending) b_.synchronize(*e);
    pending.clear();
  }

  pinned_block take(std::size_t n, detail::lean_vector<event_handle<B>>& pending) {
    if (n == 0) return {};
    pinned_block blk;
    if (n >= opts_.dedicated_threshold) {
      // Reuse a parked dedicated block of exactly this size, else allocate one.
      for (auto& d : dedicated_) {
        if (!d.in_use && d.bytes == n) {
          d.in_use = true;
          pending = std::move(d.pending);
          d.pending.clear();
          blk = {d.base, n};
          break;
        }
      }
      if (!blk) {
        auto* p = b_.allocate_host(n);
        try {
          dedicated_.insert(dedicated_.begin() + static_cast<std::ptrdiff_t>(dedicated_at(p)),
                            dedicated_block{p, n, {}, true});
        } catch (...) {
          b_.deallocate_host(p, n);
          throw;
        }
        stats_.reserved_bytes += n;
        ++stats_.dedicated;
        blk = {p, n};
      }
    } else {
      auto const need = round(n);
      blk = carve(need, pending);
      if (!blk) {
        auto c = std::make_unique<slab>();
        c->bytes = next_slab_size(need);
        c->base = b_.allocate_host(c->bytes);
        c->free.push_back(free_range{0, c->bytes, {}});
        stats_.reserved_bytes += c->bytes;
        slab_bytes_held_ += c->bytes;
        ++stats_.slabs;
        slabs_.push_back(std::move(c));
        blk = carve(need, pending);
      }
      blk.bytes = n;
    }
    stats_.used_bytes += blk.bytes;
    stats_.peak_used_bytes = std::max(stats_.peak_used_bytes, stats_.used_bytes);
    return blk;
  }

  /// Best fit over all slabs; splits the chosen range.
  pinned_block carve(std::size_t need, detail::lean_vector<event_handle<B>>& pending) {
    slab* best = nullptr;
    std::size_t best_at = 0, best_size = 0;
    for (auto& c : slabs_) {
      for (std::size_t i = 0; i < c->free.size(); ++i) {
        auto const& r = c->free[i];
        if (r.bytes >= need && (best == nullptr || r.bytes < best_size)) {
          best = c.get();
          best_at = i;
          best_size = r.bytes;
        }
      }
    }
    if (best == nullptr) return {};
    auto& r = best->free[best_at];
    auto const off = r.offset;
    pending = r.pending; // the rest of the range keeps the events too
    if (best_size > need) {
      r.offset += need; // still between its neighbours
      r.bytes -= need;
    } else {
      best->free.erase(best->free.begin() + static_cast<std::ptrdiff_t>(best_at));
    }
    return {best->base + off, need};
  }

  void give_back(pinned_block blk, detail::lean_vector<event_handle<B>> pending) {
    if (!blk) return;
    if (auto i = dedicated_at(blk.ptr); i < dedicated_.size() && dedicated_[i].base == blk.ptr) {
      auto& d = dedicated_[i];
      if (!d.in_use || d.bytes != blk.bytes) {
        throw invalid_argument(
            detail::message({"pinned_pool::deallocate: the dedicated block is not in use with ", blk.bytes, " bytes"}));
      }
      stats_.used_bytes -= blk.bytes;
      d.in_use = false;
      d.pending = std::move(pending);
      return;
    }
    for (auto& c : slabs_) {
      if (blk.ptr < c->base || blk.ptr >= c->base + c->bytes) continue;
      auto off = static_cast<std::size_t>(blk.ptr - c->base);
      auto size = round(blk.bytes);
      stats_.used_bytes -= blk.bytes;
      // Coalesce with the free neighbours; the merged range inherits every pending event.
      auto& fr = c->free;
      std::size_t next = 0, hi = fr.size(); // next: the first free range after the block
      while (next < hi) {
        auto const mid = next + (hi - next) / 2;
        if (fr[mid].offset < off) {
          next = mid + 1;
        } else {
          hi = mid;
        }
      }
      if (next < fr.size() && fr[next].offset == off + size) {
        size += fr[next].bytes;
        for (auto& e : fr[next].pending) detail::add_unique<B>(pending, e);
        fr.erase(fr.begin() + static_cast<std::ptrdiff_t>(next));
      }
      if (next > 0 && fr[next - 1].offset + fr[next - 1].bytes == off) {
        --next;
        off = fr[next].offset;
        size += fr[next].bytes;
        for (auto& e : fr[next].pending) detail::add_unique<B>(pending, e);
        fr.erase(fr.begin() + static_cast<std::ptrdiff_t>(next));
      }
      fr.insert(fr.begin() + static_cast<std::ptrdiff_t>(next), free_range{off, size, std::move(pending)});
      return;
    }
    throw invalid_argument("pinned_pool::deallocate: the block was not allocated by this pool");
  }

  B& b_;
  pinned_pool_options opts_;
  detail::lean_vector<std::unique_ptr<slab>> slabs_;
  std::size_t slab_bytes_held_ = 0;
  detail::lean_vector<dedicated_block> dedicated_; ///< by ascending base address
  pinned_pool_stats stats_;
};

} // namespace pipeswap
