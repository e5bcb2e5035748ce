// pipeswap — the Optimizer concept: what the optimizer-state swap runtime needs from an optimizer.
//
// The runtime owns the movement of state (partition, prefetch, offload, packing, checkpoints); the
// optimizer owns the math and the bookkeeping of one step. The life cycle mirrors the reference
// adapter's: validate → (per step) prepare_step → update_units → update(batch)… → finish_step, with
// slots() listing every state slot (the runtime materializes and offloads them) and metadata() /
// load_metadata() carrying the non-tensor state of a checkpoint.
//
// Required (o an lvalue of O; B = O::backend_type; ctx an lvalue of O::step_context; batch a
// std::span<const unit_range>; s a swap_slot<B>&; m a std::map<std::string, std::string>):
//
//   typename O::backend_type            a pipeswap::backend
//   typename O::step_context            what prepare_step hands to the rest of the step
//   O::splittable                       bool constant: updates are elementwise, so a partition may
//                                       cut a parameter into element ranges
//   o.validate()            -> void     throws pipeswap::invalid_argument on unsupported settings
//   o.slots()               -> std::span<swap_slot<B>* const>   every state slot, stable addresses
//   o.initialize(s)         -> void     writes a slot_init::from_param slot's device bytes on the
//                                       backend's current stream
//   o.prepare_step()        -> step_context   starts a step (e.g. advances step counts)
//   o.update_units(ctx)     -> std::span<update_unit<B> const>   the units this step updates
//   o.update(batch, ctx)    -> void     enqueues the update of the ranges in `batch` (indices into
//                                       update_units(ctx)) on the backend's current stream
//   o.finish_step(ctx)      -> void
//   o.metadata()            -> std::map<std::string, std::string>   hyper-parameters, step counts
//   o.load_metadata(m)      -> void     validates and applies them, or throws with nothing changed
//
// Semantic rules:
//  * update() reads and writes only the parameters, gradients and slot pieces of its ranges, through
//    swap_slot::device_at(); every swappable piece it touches is on the device when it is called.
//  * update() enqueues the whole batch or throws before enqueueing anything (a failed step is resumed
//    from the failed batch, so a half-enqueued batch would be updated twice).
//  * With splittable == true, updating [a, c) equals updating [a, b) then [b, c) bit for bit.
#pragma once

#include <concepts>
#include <map>
#include <span>
#include <string>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/swap/slot.hpp>

namespace pipeswap {

template <class O>
concept swap_optimizer =
    requires { typename O::backend_type; typename O::step_context; } &&
    backend<typename O::backend_type> &&
    requires(O& o, O const& co, typename O::step_context& ctx, std::span<unit_range const> batch,
             swap_slot<typename O::backend_type>& s, std::map<std::string, std::string> const& m) {
      { O::splittable } -> std::convertible_to<bool>;
      { o.validate() } -> std::same_as<void>;
      { o.slots() } -> std::same_as<std::span<swap_slot<typename O::backend_type>* const>>;
      { o.initialize(s) } -> std::same_as<void>;
      { o.prepare_step() } -> std::same_as<typename O::step_context>;
      { o.update_units(ctx) } -> std::same_as<std::span<update_unit<typename O::backend_type> const>>;
      { o.update(batch, ctx) } -> std::same_as<void>;
      { o.finish_step(ctx) } -> std::same_as<void>;
      { co.metadata() } -> std::same_as<std::map<std::string, std::string>>;
      { o.load_metadata(m) } -> std::same_as<void>;
    };

} // namespace pipeswap
