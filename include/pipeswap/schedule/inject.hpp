// pipeswap — activation-swap step injection into one rank's order (docs/schedules.md, "Swap-step injection").
//
// A chunk (stage, micro) whose backward runs at least min_swap_gap compute slots after its forward
// gets five steps, one life cycle:
//
//   SWAP_SET_GROUP → FWD → SWAP_LAUNCH_OFFLOAD → SWAP_WAIT_OFFLOAD → SWAP_LAUNCH_LOAD → SWAP_WAIT_LOAD → BWD
//
// Compute slots: every entry that holds a FWD or BWD leaf is one slot, a composite counting once.
// Placement, with `between` the entries of the slots strictly between the FWD and the BWD slot:
//
// | step           | where                                              | priority |
// |----------------|----------------------------------------------------|----------|
// | SET_GROUP      | before the entry holding the FWD                   | 10       |
// | LAUNCH_OFFLOAD | after post_anchor(FWD entry, FWD leaf)             | 20       |
// | WAIT_OFFLOAD   | after post_anchor(first of between)                | 10       |
// | LAUNCH_LOAD    | before the last of between                         | 30       |
// | WAIT_LOAD      | before the entry holding the BWD                   | 20       |
//
// post_anchor(i, probe): the run of P2P steps right after entry i ends at `end` (a bubble, compute,
// composite, swap or opaque step ends it). If the probe — the given leaf, else the entry itself — is a
// FWD (BWD), the first FWD_SEND (BWD_SEND) of the same stage and micro-batch in (i, end] is the anchor,
// else `end`; a composite entry as its own probe always falls back to `end`.
//
// Steps placed at the same entry come out by descending priority, ties in registration order, which
// is chunk order: chunks are taken in the order of their first FWD; a chunk with two FWD (BWD) leaves
// uses the last of each (a later entry of a key wins, as in the ported implementation). The original entries keep their order.
//
// inject_options::load_lookahead moves LAUNCH_LOAD earlier (an option beyond the default placement; its
// default, 1, is the placement above): with lookahead k the load goes out before the entry of compute
// slot max(bwd_slot − k, fwd_slot + 2) — k slots ahead of the backward, but never before the slot that
// follows the one whose P2P run holds WAIT_OFFLOAD, so the life cycle stays in order. A load launched
// earlier has more compute to hide behind and keeps its bytes resident longer.
//
// inject_options::offload_wait_delay moves WAIT_OFFLOAD later (also beyond the default placement; its default,
// 1, is the placement above): with delay d the wait goes after post_anchor(entry of compute slot w,
// that entry), w = max(fwd_slot + 1, min(fwd_slot + d, bwd_slot − k − 1)) for load lookahead k, and
// the load goes out before slot max(bwd_slot − k, w + 1): the load's lookahead comes first (a late
// load stalls a backward), the wait as late as d asks before it. An offload then has d compute slots
// to finish before the host waits for it, so a run of forwards whose offloads are slower than the
// forwards (the pipeline fill) does not hold the forward d + 1 slots later; the chunk's device
// storage is released at the wait, so it stays on the device longer. With d = 1 both placements are
// the ones above, exactly.
//
// Cost: linear in the order's length (a direct implementation is quadratic: it materialises every `between`).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/detail/slots.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::schedule {

/// Compute slots a chunk's backward must trail its forward by to be swapped.
inline constexpr std::size_t min_swap_gap = 4;

/// A chunk that injection would swap.
struct swap_candidate {
  chunk key;
  /// Entry positions holding the chunk's FWD and BWD leaves.
  std::size_t fwd_position = 0;
  std::size_t bwd_position = 0;
  /// Compute slots of those entries; bwd_slot - fwd_slot >= min_swap_gap.
  std::size_t fwd_slot = 0;
  std::size_t bwd_slot = 0;

  std::size_t gap() const noexcept { return bwd_slot - fwd_slot; }
  friend bool operator==(swap_candidate const&, swap_candidate const&) = default;
};

/// Options of inject_swap_steps() beyond the default placement.
struct inject_options {
  /// Compute slots between LAUNCH_LOAD and the chunk's backward slot: 1 is the default placement
  /// (before the last slot in between); larger values launch the load earlier, clamped so it never
  /// precedes the slot after the one that waits for the offload (see the header comment). Must be ≥ 1.
  std::size_t load_lookahead = 1;
  /// Compute slots after the chunk's forward slot whose entry WAIT_OFFLOAD follows: 1 is the
  /// default placement (after the first slot in between); larger values wait later, clamped to
  /// two slots before the backward (see the header comment). Must be ≥ 1.
  std::size_t offload_wait_delay = 1;

  /// Throws invalid_argument naming the field if an option is out of range.
  void validate() const {
    if (load_lookahead == 0)
      throw invalid_argument("inject_options.load_lookahead must be at least 1 (1 is the default placement)");
    if (offload_wait_delay == 0)
      throw invalid_argument("inject_options.offload_wait_delay must be at least 1 (1 is the default placement)");
  }
  friend bool operator==(inject_options const&, inject_options const&) = default;
};

namespace detail {

inline std::vector<swap_candidate> candidates_of(slot_index const& idx) {
  std::vector<swap_candidate> out;
  for (auto const& [key, f] : idx.fwd) {
    compute_leaf const b = idx.bwd.get(key);
    if (!b.leaf || b.slot < f.slot + min_swap_gap) continue;
    out.push_back({key, f.position, b.position, f.slot, b.slot});
  }
  return out;
}

// post_anchor (docs/schedules.md). Each P2P run is scanned by at most four queries (two FWD
// leaves of a composite and two first-of-between probes), so all anchors together cost O(n).
inline std::size_t post_anchor(order const& o, std::size_t i, step const& probe) {
  step_kind const send = probe.kind == step_kind::fwd   ? step_kind::fwd_send
                         : probe.kind == step_kind::bwd ? step_kind::bwd_send
                                                        : probe.kind;
  std::size_t end = i;
  std::size_t found = 0;
  for (std::size_t j = i + 1; j < o.size() && o[j] && is_p2p(o[j]->kind); ++j) {
    end = j;
    if (found == 0 && is_send(send) && o[j]->kind == send && o[j]->stage == probe.stage && o[j]->micro == probe.micro)
      found = j;
  }
  return found ? found : end;
}

} // namespace detail

/// The chunks of `o` that inject_swap_steps() swaps when every chunk is eligible, in injection order.
/// Throws invalid_argument (naming the entry) if an entry breaks the shape rules of detail/shape.hpp.
inline std::vector<swap_candidate> swap_candidates(order const& o) {
  detail::require_shapes(o, "swap_candidates");
  return detail::candidates_of(detail::index_slots(o));
}

/// `o` with the five swap steps of every candidate chunk for which `eligible(chunk)` holds (a planner
/// picks which micro-batches to swap this way; the others keep their activations on the device), placed
/// as the header comment says for `opts`. Throws invalid_argument (naming the entry) if an entry breaks
/// the shape rules, or naming the option if `opts` is out of range; `o` is not modified.
template <class Eligible>
requires std::predicate<Eligible&, chunk> order inject_swap_steps(order const& o, Eligible eligible,
                                                                  inject_options const& opts) {
  opts.validate();
  detail::require_shapes(o, "inject_swap_steps");
  detail::slot_index const idx = detail::index_slots(o);

  // Injected steps, bucketed per entry: 0..2 go before it (LAUNCH_LOAD, WAIT_LOAD, SET_GROUP — the
  // descending priorities), 3..4 after it (LAUNCH_OFFLOAD, WAIT_OFFLOAD).
  struct action {
    std::size_t position;
    std::uint8_t bucket;
    chunk key;
  };
  static constexpr step_kind bucket_kind[] = {step_kind::swap_launch_load, step_kind::swap_wait_load,
                                              step_kind::swap_set_group, step_kind::swap_launch_offload,
                                              step_kind::swap_wait_offload};
  std::vector<swap_candidate> const candidates = detail::candidates_of(idx);
  std::vector<action> actions;
  actions.reserve(5 * candidates.size());
  for (swap_candidate const& c : candidates) {
    if (!eligible(c.key)) continue;
    // The load's slot first (a late load stalls a backward), then the wait as late as the delay asks
    // but before the load's slot and never before fwd_slot + 1 (delay 1: after the first of between).
    // gap >= min_swap_gap >= 3 keeps fwd_slot + 1 <= wait_slot < load_slot < bwd_slot, so both lie
    // strictly between.
    std::size_t const lookahead = std::min(opts.load_lookahead, c.bwd_slot);
    std::size_t const wait_slot =
        std::max(c.fwd_slot + 1, std::min(c.fwd_slot + std::min(opts.offload_wait_delay, c.gap()),
                                          c.bwd_slot - std::min(lookahead + 1, c.bwd_slot)));
    std::size_t const wait_at = idx.position_of_slot[wait_slot];
    std::size_t const load_slot = std::max(c.bwd_slot - lookahead, wait_slot + 1);
    std::size_t const load_at = idx.position_of_slot[load_slot];
    actions.push_back({c.fwd_position, 2, c.key});
    actions.push_back({detail::post_anchor(o, c.fwd_position, fwd(c.key.stage, c.key.micro)), 3, c.key});
    actions.push_back({detail::post_anchor(o, wait_at, *o[wait_at]), 4, c.key});
    actions.push_back({load_at, 0, c.key});
    actions.push_back({c.bwd_position, 1, c.key});
  }

  // Two stable counting sorts (by bucket, then by entry) order the actions by (entry, bucket) and keep
  // registration order among equals.
  std::vector<std::size_t> by_bucket(actions.size()), sorted(actions.size());
  {
    std::size_t start[6] = {};
    for (action const& a : actions) ++start[a.bucket + 1];
    for (std::size_t b = 0; b < 5; ++b) start[b + 1] += start[b];
    for (std::size_t k = 0; k < actions.size(); ++k) by_bucket[start[actions[k].bucket]++] = k;
    std::vector<std::size_t> at(o.size() + 1, 0);
    for (action const& a : actions) ++at[a.position + 1];
    for (std::size_t i = 0; i < o.size(); ++i) at[i + 1] += at[i];
    for (std::size_t k : by_bucket) sorted[at[actions[k].position]++] = k;
  }

  order out;
  out.reserve(o.size() + actions.size());
  std::size_t k = 0;
  auto emit_while = [&](std::size_t i, std::uint8_t below) {
    for (; k < sorted.size() && actions[sorted[k]].position == i && actions[sorted[k]].bucket < below; ++k) {
      action const& a = actions[sorted[k]];
      out.push_back(leaf(bucket_kind[a.bucket], a.key.stage, a.key.micro));
    }
  };
  for (std::size_t i = 0; i < o.size(); ++i) {
    emit_while(i, 3);
    out.push_back(o[i]);
    emit_while(i, 5);
  }
  return out;
}

/// inject_swap_steps() with the default placement.
template <class Eligible>
requires std::predicate<Eligible&, chunk> order inject_swap_steps(order const& o, Eligible eligible) {
  return inject_swap_steps(o, std::move(eligible), inject_options{});
}

/// inject_swap_steps() with every candidate chunk eligible, placed as `opts` says.
inline order inject_swap_steps(order const& o, inject_options const& opts) {
  return inject_swap_steps(
      o, [](chunk) { return true; }, opts);
}

/// inject_swap_steps() with every candidate chunk eligible: hyper-parallel's inject_pipeline_swap_steps.
inline order inject_swap_steps(order const& o) {
  return inject_swap_steps(
      o, [](chunk) { return true; }, inject_options{});
}

/// A copy of `orders` in which only `rank`'s order has its swap steps: each rank swaps its own
/// activations, so a rank builds the whole schedule and injects into its own order (as hyper-parallel's
/// _inject_local_pp_swap_actions). Throws invalid_argument if `rank` has no order.
inline rank_orders inject_swap_steps_for_rank(rank_orders const& orders, index_type rank) {
  if (rank < 0 || std::size_t(rank) >= orders.size())
    throw invalid_argument(
        pipeswap::detail::message({"inject_swap_steps_for_rank: no order for rank ", rank, " among ", orders.size()}));
  rank_orders out = orders;
  out[std::size_t(rank)] = inject_swap_steps(orders[std::size_t(rank)]);
  return out;
}

} // namespace pipeswap::schedule
