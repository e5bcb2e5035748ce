// pipeswap — the swap runtime's side of a state slot: its pieces and its host mirror.
//
// The optimizer describes a slot (slot_desc, <pipeswap/optim/state.hpp>); optimizer_swap owns how it
// is stored while the runtime lives: the slot's bytes are tiled by pieces (usually one; several when
// a partition splits the parameter across batches), each a swap_buffer that moves through the life
// cycle on its own. All pieces of a swappable slot view one host mirror, a range of the pinned host
// arena of its dtype. A slot that is not swappable keeps one piece on the device for good.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/optim/state.hpp>

namespace pipeswap::detail {

template <backend B>
struct slot_storage {
  bool swappable = false;
  std::byte* mirror = nullptr; ///< whole host mirror (swappable slots), a view of a host store
  std::size_t element_bytes = 0;
  std::size_t numel = 0;
  detail::lean_vector<swap_buffer<B>> pieces;
  detail::lean_vector<std::size_t> piece_begin; ///< first element of each piece, ascending, starts at 0
  /// Bumped whenever `pieces` is rebuilt (their addresses change): plans that point at pieces are
  /// rebuilt then.
  std::uint32_t layout = 0;

  [[nodiscard]] std::size_t bytes() const noexcept { return numel * element_bytes; }

  /// Index of the piece holding element `e`.
  [[nodiscard]] std::size_t piece_of(std::size_t e) const {
    // The last piece that begins at or before e (piece_begin[0] is 0): a binary search.
    std::size_t lo = 0, hi = piece_begin.size();
    while (hi - lo > 1) {
      auto const mid = lo + (hi - lo) / 2;
      (piece_begin[mid] <= e ? lo : hi) = mid;
    }
    return lo;
  }

  /// True when every piece is in `r`.
  [[nodiscard]] bool all(residency r) const noexcept {
    for (auto const& p : pieces) {
      if (p.state() != r) return false;
    }
    return true;
  }
};

/// Every piece of `slots` (only the swappable slots' if `swappable_only`).
template <backend B>
lean_vector<swap_buffer<B>*> pieces_of(lean_vector<slot_storage<B>>& slots, bool swappable_only) {
  lean_vector<swap_buffer<B>*> out;
  for (auto& s : slots) {
    if (swappable_only && !s.swappable) continue;
    for (auto& p : s.pieces) out.push_back(&p);
  }
  return out;
}

/// The label of a batch's operation in backend traces: "op bN".
inline std::string batch_label(char const* op, std::size_t n) { return message({op, " b", n}); }

} // namespace pipeswap::detail
