// pipeswap — staging arenas: one device region a batch of swap buffers is copied through.
//
// The packed optimizer pipeline stages each batch in a staging_arena, at the offsets of a
// staging_layout; copies of buffers adjacent in host memory and in the arena are merged into one copy
// per run (core/transfer.hpp, arena_storage), and a load into an arena waits the last D2H out of it.
#pragma once

#include <cstring>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/detail/round.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/swap_buffer.hpp>

namespace pipeswap {

/// A device region that batches are staged in (arena_storage). Allocated and released by the engine.
template <backend B>
struct staging_arena {
  device_pointer_t<B> base{};
  std::size_t bytes = 0;
  /// The last D2H out of the arena: a load into it waits this (wait_site::arena_reuse).
  event_handle<B> fence;
  /// Bytes reserved for it in the engine's budget (0 when it has none).
  std::uint64_t reserved = 0;
};

class staging_layout;

/// Lays out `bufs` (host mirrors set) for an arena: sorted by (region, mirror address), each region
/// starting `align`-aligned, buffers adjacent in host memory merged into one run. `region[i]` groups
/// buffer i (e.g. by dtype, so every dtype region is aligned).
template <backend B>
staging_layout make_staging_layout(std::span<swap_buffer<B>* const> bufs, std::span<std::size_t const> region,
                                   std::size_t align = 512);

/// Where the buffers of one batch sit in a staging arena, and the merged copies that move them.
/// Read element by element: accessors that return std::span would instantiate its constrained
/// constructors for each element type in every translation unit that includes this header
/// (docs/compile-times.md). Indices must be below the corresponding count (checked under
/// PIPESWAP_ASSERTIONS).
class staging_layout {
public:
  struct run {
    std::size_t first = 0;  ///< index (into the batch's buffer list) of the run's first buffer
    std::size_t offset = 0; ///< byte offset in the arena
    std::size_t bytes = 0;
  };
  std::size_t bytes = 0; ///< arena bytes the batch needs

  /// The number of buffers laid out.
  [[nodiscard]] std::size_t size() const noexcept { return offset_.size(); }
  /// Buffer i's byte offset in the arena.
  [[nodiscard]] std::size_t offset(std::size_t i) const noexcept { return offset_[i]; }
  /// The buffer at position k of the arena order (ascending offset).
  [[nodiscard]] std::size_t buffer_at(std::size_t k) const noexcept { return order_[k]; }
  /// The number of copies.
  [[nodiscard]] std::size_t run_count() const noexcept { return runs_.size(); }
  /// Copy r: host bytes from buffers[first].mirror(), contiguous in host memory and in the arena.
  [[nodiscard]] run const& run_at(std::size_t r) const noexcept { return runs_[r]; }

private:
  template <backend B>
  friend staging_layout make_staging_layout(std::span<swap_buffer<B>* const>, std::span<std::size_t const>,
                                            std::size_t);
  detail::lean_vector<std::size_t> offset_;
  detail::lean_vector<std::size_t> order_;
  detail::lean_vector<run> runs_;
};

template <backend B>
staging_layout make_staging_layout(std::span<swap_buffer<B>* const> bufs, std::span<std::size_t const> region,
                                   std::size_t align) {
  staging_layout l;
  // The buffers in (region, host address) order, ties in list order: a bottom-up merge sort of their
  // indices (not std::sort: docs/compile-times.md, "Rules").
  auto const n = bufs.size();
  detail::lean_vector<std::size_t> order(n), spare(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  auto const before = [&](std::size_t a, std::size_t c) {
    return region[a] != region[c] ? region[a] < region[c] : bufs[a]->mirror() < bufs[c]->mirror();
  };
  std::size_t* from = order.data();
  std::size_t* to = spare.data();
  for (std::size_t w = 1; w < n; w *= 2) {
    for (std::size_t lo = 0; lo < n; lo += 2 * w) {
      auto const mid = lo + w < n ? lo + w : n;
      auto const hi = mid + w < n ? mid + w : n;
      auto i = lo, j = mid, k = lo;
      while (i < mid && j < hi) to[k++] = before(from[j], from[i]) ? from[j++] : from[i++];
      while (i < mid) to[k++] = from[i++];
      while (j < hi) to[k++] = from[j++];
    }
    auto* const t = from;
    from = to;
    to = t;
  }
  if (from != order.data()) std::memcpy(order.data(), from, n * sizeof(std::size_t));
  l.offset_.assign(bufs.size(), 0);
  std::size_t off = 0;
  std::size_t cur = ~std::size_t{0};
  std::byte const* host_end = nullptr;
  for (auto i : order) {
    auto const* p = bufs[i];
    if (region[i] != cur) {
      off = detail::round_up(off, align);
      cur = region[i];
      l.runs_.push_back({i, off, 0});
    } else if (host_end != p->mirror()) {
      l.runs_.push_back({i, off, 0});
    }
    l.offset_[i] = off;
    l.runs_.back().bytes += p->bytes();
    off += p->bytes();
    host_end = p->mirror() + p->bytes();
  }
  l.bytes = detail::round_up(off, align);
  l.order_ = std::move(order);
  return l;
}

/// Storage policy: the batch lives in `arena` at `layout` (made for exactly this buffer list).
template <backend B>
struct arena_storage {
  staging_arena<B>& arena;
  staging_layout const& layout;
};

} // namespace pipeswap
