// pipeswap — the swap runtime's side of a state slot: its pieces and its host mirror.
//
// The optimizer describes a slot (slot_desc, <pipeswap/optim/state.hpp>); optimizer_swap owns how it
// is stored while the runtime lives: the slot's bytes are tiled by pieces (usually one; several when
// a partition splits the parameter across batches), each a swap_buffer that moves through the life
// cycle on its own. All pieces of a swappable slot view one host mirror, a range of the pinned host
// arena of its dtype. A slot that is not swappable keeps one piece on the device for good.
#pragma once

#include <algorithm>
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
    if (piece_begin.size() == 1) return 0; // an unsplit slot: its one piece starts at 0
    auto it = std::upper_bound(piece_begin.begin(), piece_begin.end(), e);
    return static_cast<std::size_t>(it - piece_begin.begin()) - 1;
  }

  /// True when every piece is in `r`.
  [[nodiscard]] bool all(residency r) const noexcept {
    return std::all_of(pieces.begin(), pieces.end(), [r](auto const& p) { return p.state() == r; });
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
