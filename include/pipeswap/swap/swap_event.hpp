// pipeswap — one operation of the optimizer-swap runtime, as its listener receives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <pipeswap/detail/message.hpp>

namespace pipeswap {

/// An operation the runtime issues, in issue order (optimizer_swap::set_event_listener): `op` says
/// which (docs/optimizer.md, "Listening"). Event kinds name operations inside the runtime; none is
/// named after a public call (prefetch() issues "load" events, finish_offload() "finish_deferred").
struct swap_event {
  /// The kinds of operation, named apart from the public calls that issue them.
  enum class kind : std::uint8_t {
    begin,           ///< a step begins (`batch`: the number of batches it runs)
    load,            ///< the H2D of a batch (in a step, or by prefetch())
    wait_load,       ///< the compute stream waits a batch's H2D
    activate,        ///< a batch loaded into its own storage becomes the step's
    update,          ///< the optimizer updates a batch
    chain,           ///< the D2H of a batch out of its staging arena, and the H2D of `next` behind it
    offload,         ///< the D2H of a batch
    wait_offload,    ///< a stream waits a batch's D2H
    free_staging,    ///< packed: the staging arena of a batch is free again (its D2H was waited)
    keep,            ///< a batch stays on the device (the resident share)
    defer,           ///< a batch's D2H is left in flight when the step returns (defer_offload)
    finish_deferred, ///< a deferred offload is finished (by finish_offload(), prefetch() or step())
    end,             ///< the step's operations end
  };

  /// Where the batch's device storage is, for the operations that say so.
  enum class storage : std::uint8_t {
    unspecified, ///< per-tensor storage, or not part of the operation
    staging,     ///< staging arena `arena` (0 or 1) of the packed pipeline
    own,         ///< an arena of its own (resident share, prefetched batches, relay)
    early,       ///< its own arena, offloaded as soon as it is updated (the relay)
  };

  kind op{};
  std::optional<std::size_t> batch{}; ///< the batch (for "begin": the number of batches to run)
  std::optional<std::size_t> next{};  ///< "chain": the batch that loads into the arena behind the offload
  storage where = storage::unspecified;
  std::size_t arena = 0; ///< where == staging: which arena
  bool chained = false;  ///< "chain" events: `next` is meaningful (none when no load follows)

  friend bool operator==(swap_event const&, swap_event const&) = default;
};

/// The name of an event kind: "begin", "load", "wait_load", "activate", "update", "chain", "offload",
/// "wait_offload", "free_staging", "keep", "defer", "finish_deferred", "end".
constexpr std::string_view to_string(swap_event::kind k) noexcept {
  switch (k) {
  case swap_event::kind::begin: return "begin";
  case swap_event::kind::load: return "load";
  case swap_event::kind::wait_load: return "wait_load";
  case swap_event::kind::activate: return "activate";
  case swap_event::kind::update: return "update";
  case swap_event::kind::chain: return "chain";
  case swap_event::kind::offload: return "offload";
  case swap_event::kind::wait_offload: return "wait_offload";
  case swap_event::kind::free_staging: return "free_staging";
  case swap_event::kind::keep: return "keep";
  case swap_event::kind::defer: return "defer";
  case swap_event::kind::finish_deferred: return "finish_deferred";
  case swap_event::kind::end: return "end";
  }
  return "?";
}

/// "op", "op:batch", "op:batch:arena", "op:batch:own", "op:batch:early", and for a chain
/// "chain:batch:next:arena", with next "-" when no load follows the offload.
inline std::string to_string(swap_event const& e) {
  std::string s(to_string(e.op));
  if (!e.batch) return s;
  detail::append(s, {":", *e.batch});
  if (e.chained && e.next) detail::append(s, {":", *e.next});
  if (e.chained && !e.next) s += ":-";
  switch (e.where) {
  case swap_event::storage::staging: detail::append(s, {":", e.arena}); break;
  case swap_event::storage::own: s += ":own"; break;
  case swap_event::storage::early: s += ":early"; break;
  case swap_event::storage::unspecified: break;
  }
  return s;
}

} // namespace pipeswap
