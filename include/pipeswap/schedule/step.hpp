// pipeswap — the pipeline step model: step kinds, steps, bubbles, per-rank orders.
//
// An *order* is what one rank executes, entry by entry. An entry is a step or a bubble (an empty time
// slot, kept so that the orders of all ranks stay aligned column by column; it does nothing at run
// time). A step is a leaf (a kind with its stage and micro-batch) or a composite (OVERLAP_F_B,
// OVERLAP_B_F) that carries its leaves and has no stage or micro-batch of its own.
//
// The model is plain data: building a step never throws, and a malformed step (a negative stage, a
// composite without leaves) is representable so that it can be reported with its position.
// shape_error() (detail/shape.hpp) and check_order() (validate.hpp) say what is wrong with one.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace pipeswap::schedule {

/// Stage and micro-batch numbers. Valid values are >= 0; no_index marks "absent" (no value).
using index_type = std::int32_t;
inline constexpr index_type no_index = -1;

/// What a step does. The enumerators and their names (step_kind_name) follow hyper-parallel's
/// MetaStepType; the names are the JSON spelling.
///
///   group      kinds                                         stage  micro  leaves
///   compute    fwd, bwd                                      yes    yes    -
///   p2p        fwd_recv, fwd_send, bwd_recv, bwd_send        yes    yes    -
///   composite  overlap_f_b (fwd then bwd), overlap_b_f       null   null   1 or 2
///   swap       swap_set_group ... swap_wait_load             yes    yes    -
///   opaque     bwd_input, bwd_weight                         yes    yes    -
///   opaque     fsdp_unshard, fsdp_reshard, fsdp_reduce_grad,
///              fsdp_wait_reduce_grad                         yes    null   -
///
/// Opaque kinds are carried through every pass untouched: they are neither compute slots nor P2P, and
/// they end a run of P2P steps (docs/schedules.md). Names outside this table are rejected by the parsers,
/// FSDP_* ones included: a kind this library cannot classify cannot be placed safely around swaps.
enum class step_kind : std::uint8_t {
  fwd,
  bwd,
  fwd_recv,
  fwd_send,
  bwd_recv,
  bwd_send,
  overlap_f_b,
  overlap_b_f,
  swap_set_group,
  swap_launch_offload,
  swap_wait_offload,
  swap_launch_load,
  swap_wait_load,
  bwd_input,
  bwd_weight,
  fsdp_unshard,
  fsdp_reshard,
  fsdp_reduce_grad,
  fsdp_wait_reduce_grad,
};

/// Every step kind, in declaration order.
inline constexpr step_kind all_step_kinds[] = {
    step_kind::fwd,
    step_kind::bwd,
    step_kind::fwd_recv,
    step_kind::fwd_send,
    step_kind::bwd_recv,
    step_kind::bwd_send,
    step_kind::overlap_f_b,
    step_kind::overlap_b_f,
    step_kind::swap_set_group,
    step_kind::swap_launch_offload,
    step_kind::swap_wait_offload,
    step_kind::swap_launch_load,
    step_kind::swap_wait_load,
    step_kind::bwd_input,
    step_kind::bwd_weight,
    step_kind::fsdp_unshard,
    step_kind::fsdp_reshard,
    step_kind::fsdp_reduce_grad,
    step_kind::fsdp_wait_reduce_grad,
};

/// The canonical name of `k` ("FWD", "SWAP_LAUNCH_OFFLOAD", ...): the JSON "type" value.
constexpr std::string_view step_kind_name(step_kind k) noexcept {
  switch (k) {
  case step_kind::fwd: return "FWD";
  case step_kind::bwd: return "BWD";
  case step_kind::fwd_recv: return "FWD_RECV";
  case step_kind::fwd_send: return "FWD_SEND";
  case step_kind::bwd_recv: return "BWD_RECV";
  case step_kind::bwd_send: return "BWD_SEND";
  case step_kind::overlap_f_b: return "OVERLAP_F_B";
  case step_kind::overlap_b_f: return "OVERLAP_B_F";
  case step_kind::swap_set_group: return "SWAP_SET_GROUP";
  case step_kind::swap_launch_offload: return "SWAP_LAUNCH_OFFLOAD";
  case step_kind::swap_wait_offload: return "SWAP_WAIT_OFFLOAD";
  case step_kind::swap_launch_load: return "SWAP_LAUNCH_LOAD";
  case step_kind::swap_wait_load: return "SWAP_WAIT_LOAD";
  case step_kind::bwd_input: return "BWD_INPUT";
  case step_kind::bwd_weight: return "BWD_WEIGHT";
  case step_kind::fsdp_unshard: return "FSDP_UNSHARD";
  case step_kind::fsdp_reshard: return "FSDP_RESHARD";
  case step_kind::fsdp_reduce_grad: return "FSDP_REDUCE_GRAD";
  case step_kind::fsdp_wait_reduce_grad: return "FSDP_WAIT_REDUCE_GRAD";
  }
  return "?";
}

/// Inverse of step_kind_name (exact, case-sensitive); nullopt for any other name.
constexpr std::optional<step_kind> step_kind_from_name(std::string_view name) noexcept {
  for (step_kind k : all_step_kinds) {
    if (step_kind_name(k) == name) return k;
  }
  return std::nullopt;
}

/// FWD or BWD: the steps that form compute slots and own activations.
constexpr bool is_compute(step_kind k) noexcept { return k == step_kind::fwd || k == step_kind::bwd; }
/// The four point-to-point kinds.
constexpr bool is_p2p(step_kind k) noexcept {
  return k == step_kind::fwd_recv || k == step_kind::fwd_send || k == step_kind::bwd_recv || k == step_kind::bwd_send;
}
constexpr bool is_send(step_kind k) noexcept { return k == step_kind::fwd_send || k == step_kind::bwd_send; }
constexpr bool is_recv(step_kind k) noexcept { return k == step_kind::fwd_recv || k == step_kind::bwd_recv; }
constexpr bool is_composite(step_kind k) noexcept { return k == step_kind::overlap_f_b || k == step_kind::overlap_b_f; }
/// The five SWAP_* kinds that injection adds.
constexpr bool is_swap(step_kind k) noexcept {
  return k >= step_kind::swap_set_group && k <= step_kind::swap_wait_load;
}
constexpr bool is_fsdp(step_kind k) noexcept { return k >= step_kind::fsdp_unshard; }
/// Whether a leaf of kind `k` carries a micro-batch (every leaf carries a stage; FSDP steps act on a
/// whole stage and carry none).
constexpr bool has_micro(step_kind k) noexcept { return !is_fsdp(k) && !is_composite(k); }

/// One entry of an order that is not a bubble.
///
/// Leaves have `sub` empty. A composite has `stage == micro == no_index` and its leaves in `sub`, in
/// the order a sequential run executes them. Equality compares kind, stage, micro and
/// leaves; step_hash hashes kind, stage and micro only, which is consistent with it.
struct step {
  step_kind kind{};
  index_type stage = no_index;
  index_type micro = no_index;
  std::vector<step> sub;

  friend bool operator==(step const&, step const&) = default;
};

/// A leaf step.
inline step leaf(step_kind kind, index_type stage, index_type micro = no_index) { return step{kind, stage, micro, {}}; }
inline step fwd(index_type stage, index_type micro) { return leaf(step_kind::fwd, stage, micro); }
inline step bwd(index_type stage, index_type micro) { return leaf(step_kind::bwd, stage, micro); }
/// A composite of `kind` holding `leaves` (no stage, no micro-batch).
inline step composite(step_kind kind, std::vector<step> leaves) {
  return step{kind, no_index, no_index, std::move(leaves)};
}

/// The leaves of `s`: its sub-steps if it has any, else `s` itself.
inline std::span<step const> leaves_of(step const& s) noexcept {
  return s.sub.empty() ? std::span<step const>(&s, 1) : std::span<step const>(s.sub);
}

/// A bubble is an empty optional.
using entry = std::optional<step>;
/// One rank's sequence of entries.
using order = std::vector<entry>;
/// The orders of all ranks, indexed by rank.
using rank_orders = std::vector<order>;

/// The unit of activation swap: one micro-batch of one stage (the `(stage, micro)` key).
struct chunk {
  index_type stage = no_index;
  index_type micro = no_index;
  friend auto operator<=>(chunk const&, chunk const&) = default;
};

struct chunk_hash {
  std::size_t operator()(chunk c) const noexcept {
    auto const bits = (std::uint64_t(std::uint32_t(c.stage)) << 32) | std::uint32_t(c.micro);
    return std::hash<std::uint64_t>{}(bits);
  }
};

struct step_hash {
  std::size_t operator()(step const& s) const noexcept {
    return chunk_hash{}(chunk{s.stage, s.micro}) * 31 + std::size_t(s.kind);
  }
};

} // namespace pipeswap::schedule
