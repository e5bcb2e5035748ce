// pipeswap — compute slots of an order, indexed once (docs/schedules.md, "Swap-step injection").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/detail/chunk_table.hpp>
#include <pipeswap/schedule/detail/shape.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>

namespace pipeswap::schedule::detail {

/// A FWD or BWD leaf, the entry that holds it and the compute slot of that entry.
struct compute_leaf {
  step const* leaf = nullptr;
  std::size_t position = 0;
  std::size_t slot = 0;
};

struct slot_index {
  /// Entry position of each compute slot.
  std::vector<std::size_t> position_of_slot;
  /// The FWD leaf of each chunk in the order the chunk's first FWD appears; a later FWD of the same
  /// chunk replaces the leaf but keeps the place (a later entry of a key replaces the earlier one but keeps its place).
  std::vector<std::pair<chunk, compute_leaf>> fwd;
  /// The last BWD leaf of each chunk (leaf == nullptr: none).
  chunk_table<compute_leaf> bwd;
};

/// The compute leaves of an entry: itself if it is FWD/BWD, the FWD/BWD leaves of a composite;
/// anything else holds none.
template <class F>
void for_each_compute_leaf(step const& s, F&& f) {
  if (is_compute(s.kind)) {
    f(s);
  } else if (is_composite(s.kind)) {
    for (step const& l : s.sub) {
      if (is_compute(l.kind)) f(l);
    }
  }
}

/// Throws invalid_argument for the first entry of `o` that breaks the shape rules.
inline void require_shapes(order const& o, char const* who) {
  for (std::size_t i = 0; i < o.size(); ++i) {
    if (!o[i]) continue;
    if (auto e = shape_error(*o[i]))
      throw invalid_argument(pipeswap::detail::message({who, ": entry ", i, " (", to_text(*o[i]), "): ", *e}));
  }
}

inline slot_index index_slots(order const& o) {
  chunk_box box;
  for (entry const& e : o) {
    if (e) for_each_compute_leaf(*e, [&](step const& l) { box.add(l.stage, l.micro); });
  }
  slot_index idx{{}, {}, chunk_table<compute_leaf>(box, compute_leaf{})};
  chunk_table<std::size_t> fwd_at(box, SIZE_MAX);
  for (std::size_t i = 0; i < o.size(); ++i) {
    if (!o[i]) continue;
    bool holds_compute = false;
    std::size_t const slot = idx.position_of_slot.size();
    for_each_compute_leaf(*o[i], [&](step const& l) {
      holds_compute = true;
      compute_leaf const ref{&l, i, slot};
      chunk const key{l.stage, l.micro};
      if (l.kind == step_kind::bwd) {
        idx.bwd[key] = ref;
        return;
      }
      std::size_t& at = fwd_at[key];
      if (at == SIZE_MAX) {
        at = idx.fwd.size();
        idx.fwd.emplace_back(key, ref);
      } else {
        idx.fwd[at].second = ref;
      }
    });
    if (holds_compute) idx.position_of_slot.push_back(i);
  }
  return idx;
}

} // namespace pipeswap::schedule::detail
