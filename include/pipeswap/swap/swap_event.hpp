// pipeswap — one operation of the optimizer-swap runtime, as its listener receives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pipeswap {

/// An operation the runtime issues, in issue order (optimizer_swap::set_event_listener). `op` is one of
/// "begin", "prefetch", "wait_prefetch", "activate", "update", "chain", "offload", "wait_offload",
/// "finish_offload", "keep", "defer", "finish_deferred", "end" (docs/optimizer.md, "Listening").
struct swap_event {
  /// Where the batch's device storage is, for the operations that say so.
  enum class storage : std::uint8_t {
    unspecified, ///< per-tensor storage, or not part of the operation
    staging,     ///< staging arena `arena` (0 or 1) of the packed pipeline
    own,         ///< an arena of its own (resident share, prefetch, relay)
    early,       ///< its own arena, offloaded as soon as it is updated (the relay)
  };

  std::string_view op{};
  std::optional<std::size_t> batch{}; ///< the batch (for "begin": the number of batches to run)
  std::optional<std::size_t> next{};  ///< "chain": the batch that loads into the arena behind the offload
  storage where = storage::unspecified;
  std::size_t arena = 0; ///< where == staging: which arena
  bool chained = false;  ///< "chain" events: `next` is meaningful (none when no load follows)

  friend bool operator==(swap_event const&, swap_event const&) = default;
};

/// "op", "op:batch", "op:batch:arena", "op:batch:own", "op:batch:early", and for a chain
/// "chain:batch:next:arena", with next "-" when no load follows the offload.
inline std::string to_string(swap_event const& e) {
  std::string s(e.op);
  if (!e.batch) return s;
  s += ':' + std::to_string(*e.batch);
  if (e.chained) s += ':' + (e.next ? std::to_string(*e.next) : std::string("-"));
  switch (e.where) {
  case swap_event::storage::staging: s += ':' + std::to_string(e.arena); break;
  case swap_event::storage::own: s += ":own"; break;
  case swap_event::storage::early: s += ":early"; break;
  case swap_event::storage::unspecified: break;
  }
  return s;
}

} // namespace pipeswap
