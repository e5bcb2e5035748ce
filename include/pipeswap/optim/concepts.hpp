// pipeswap — the Optimizer concept: what the optimizer-state swap runtime needs from an optimizer.
//
// The runtime owns the movement and the placement of state (partition, pieces, mirrors, prefetch,
// offload, packing, checkpoints); the optimizer describes its state and owns the math of one step.
// The concept is refined in small steps, each checkable on its own (optimizer_description →
// steppable_optimizer, checkpointable_optimizer → swap_optimizer), and a type is an optimizer only if
// it opts in, so a look-alike is never accepted by accident. docs/optimizer.md is the full text.
//
// Required expressions (o an lvalue of O; co a const O; B = O::backend_type; ctx an lvalue of
// O::step_context; batch a std::span<const unit_range>; v a const state_view<B>; i a std::size_t;
// d a device_pointer_t<B>; m a const std::map<std::string, std::string>):
//
//   typename O::optimizer_concept   derived from pipeswap::optimizer_tag (or enable_optimizer<O> = true)
//   typename O::backend_type        a pipeswap::backend
//   O::splittable                   a bool constant expression: updates are elementwise, so a
//                                   partition may cut a parameter into element ranges
//   co.slots()       -> std::span<slot_desc const>   every state slot: parameter, key, dtype, numel,
//                                                    init. Stable while a runtime is attached
//   o.swap_state()   -> optimizer_state<B>&          where the state waits between runtimes
//   o.validate()     -> void        throws pipeswap::invalid_argument on unsupported settings
//   typename O::step_context        what prepare_step hands to the rest of the step
//   o.initialize(i, d)   -> void    writes the initial bytes of slot i (slot_init::from_param) at
//                                   device address d, on the backend's current stream
//   o.prepare_step()     -> step_context   starts a step (e.g. advances step counts)
//   o.update_units(ctx)  -> std::span<update_unit const>   the units this step updates
//   o.update(batch, ctx, v) -> void enqueues the update of the ranges in `batch` (indices into
//                                   update_units(ctx)) on the backend's current stream, reading slot
//                                   addresses through v.device_at(slot, element)
//   o.finish_step(ctx)   -> void
//   co.metadata()        -> std::map<std::string, std::string>   hyper-parameters, step counts
//   o.load_metadata(m)   -> void    validates and applies them, or throws with nothing changed
//
// Semantic rules the compiler cannot check:
//  * Ownership. The optimizer never allocates, copies or frees slot storage; the runtime does. While a
//    runtime is attached (swap_state().attached()), slots() must not change: an optimizer refuses to
//    add parameters then (call swap_state().require_detached(...)).
//  * update() reads and writes only the parameters, gradients and slot bytes of its ranges; every
//    slot byte it touches is on the device when it is called.
//  * update() enqueues the whole batch or throws before enqueueing anything (a failed step is resumed
//    from the failed batch, so a half-enqueued batch would be updated twice).
//  * With splittable == true, updating [a, c) equals updating [a, b) then [b, c) bit for bit.
//
// A minimal model (one zero-initialized state per parameter; the update itself is elided):
// @code
//   template <pipeswap::backend B>
//   struct sgd_momentum {
//     using optimizer_concept = pipeswap::optimizer_tag;
//     using backend_type = B;
//     struct step_context {};
//     static constexpr bool splittable = true;
//     explicit sgd_momentum(B& b) : state(b) {}
//     std::vector<pipeswap::slot_desc> descs;  // {param, state_key::exp_avg, dtype::f32, numel}
//     std::vector<pipeswap::update_unit> units;
//     pipeswap::optimizer_state<B> state;
//     std::span<pipeswap::slot_desc const> slots() const { return descs; }
//     pipeswap::optimizer_state<B>& swap_state() { return state; }
//     void validate() {}
//     void initialize(std::size_t, pipeswap::device_pointer_t<B>) {}
//     step_context prepare_step() { return {}; }
//     std::span<pipeswap::update_unit const> update_units(step_context&) { return units; }
//     void update(std::span<pipeswap::unit_range const>, step_context&, pipeswap::state_view<B> const&) {}
//     void finish_step(step_context&) {}
//     std::map<std::string, std::string> metadata() const { return {}; }
//     void load_metadata(std::map<std::string, std::string> const&) {}
//   };
//   static_assert(pipeswap::swap_optimizer<sgd_momentum<pipeswap::mock::backend>>);
// @endcode
// (tests/optim/optimizer_concept_test.cpp holds this model and one near-miss per requirement.)
#pragma once

#include <concepts>
#include <map>
#include <span>
#include <string>
#include <type_traits>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/optim/state.hpp>

namespace pipeswap {

/// Opt-in tag: an optimizer declares `using optimizer_concept = pipeswap::optimizer_tag;` (or a type
/// derived from it). Types that cannot be edited opt in by specialising enable_optimizer.
struct optimizer_tag {};

template <class O>
inline constexpr bool enable_optimizer = requires {
  typename O::optimizer_concept;
  requires std::derived_from<typename O::optimizer_concept, optimizer_tag>;
};

namespace detail {
template <bool>
struct bool_constant_probe {};
} // namespace detail

/// What the optimizer describes: its backend, whether updates split, its slots, its state's home.
template <class O>
concept optimizer_description = requires {
  typename O::backend_type;
}
&&backend<typename O::backend_type>&& requires { requires std::same_as<decltype(O::splittable), bool const>; }
&&requires { typename detail::bool_constant_probe<O::splittable>; }
&& // a constant expression
    requires(O& o, O const& co) {
  { co.slots() } -> std::same_as<std::span<slot_desc const>>;
  { o.swap_state() } -> std::same_as<optimizer_state<typename O::backend_type>&>;
  { o.validate() } -> std::same_as<void>;
};

/// One step's life cycle: initialize slots, prepare, list units, update batches, finish.
template <class O>
concept steppable_optimizer = optimizer_description<O> && requires {
  typename O::step_context;
} && requires(O& o, typename O::step_context& ctx, std::span<unit_range const> batch,
              state_view<typename O::backend_type> const& v, std::size_t i,
              device_pointer_t<typename O::backend_type> d) {
  { o.initialize(i, d) } -> std::same_as<void>;
  { o.prepare_step() } -> std::same_as<typename O::step_context>;
  { o.update_units(ctx) } -> std::same_as<std::span<update_unit const>>;
  { o.update(batch, ctx, v) } -> std::same_as<void>;
  { o.finish_step(ctx) } -> std::same_as<void>;
};

/// The non-tensor state of a checkpoint.
template <class O>
concept checkpointable_optimizer = requires(O& o, O const& co, std::map<std::string, std::string> const& m) {
  { co.metadata() } -> std::same_as<std::map<std::string, std::string>>;
  { o.load_metadata(m) } -> std::same_as<void>;
};

/// Everything optimizer_swap needs. See the header comment and docs/optimizer.md for the rules.
template <class O>
concept swap_optimizer = enable_optimizer<O> && steppable_optimizer<O> && checkpointable_optimizer<O>;

} // namespace pipeswap
