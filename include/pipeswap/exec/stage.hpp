// pipeswap — the Stage concept: one pipeline stage's forward and backward, supplied by the engine.
//
// The pipeline executor (exec/pipeline_executor.hpp) owns the buffers that cross stage boundaries
// and the schedule; a stage owns its parameters and its math. For each FWD(s, m) of the rank's order
// the executor calls stages[s].forward(args) and for each BWD(s, m) stages[s].backward(args), with
// device buffers it lends for the call. A type is a stage only if it opts in.
//
// Required expressions (s an lvalue of S; cs a const S; f a forward_args<B>&; g a backward_args<B>&):
//
//   typename S::stage_concept   derived from pipeswap::exec::stage_tag (or enable_stage<S> = true)
//   cs.input_bytes()  -> std::size_t   bytes of the stage's input (and of the gradient it returns);
//                                      unused by stage 0, which produces its own input (data loading)
//   cs.output_bytes() -> std::size_t   bytes of its output (and of the gradient it receives); unused
//                                      by the last stage, which ends in the loss
//   s.forward(f)      -> void          enqueues the forward of micro-batch f.micro on f.stream
//   s.backward(g)     -> void          enqueues the backward of g.micro on g.stream
// Optional:
//   s.begin_step(b, stream) -> void    before the first entry of a step (zero the gradients)
//
// Semantic rules the compiler cannot check:
//  * Streams. A stage enqueues all its work on the stream it is given and never synchronizes it: the
//    executor has already made that stream wait for the input, and orders sends, swaps and releases
//    behind it.
//  * Lent buffers. f.input (null for stage 0), f.output (null for the last stage), g.input,
//    g.grad_output (null for the last stage) and g.grad_input (null for stage 0) belong to the
//    executor; the stage reads or writes them only in work enqueued during the call. f.output and
//    g.grad_input must be completely written.
//  * Saved activations. What the backward needs beyond its input the forward allocates with the
//    backend (on f.stream) and hands over with f.save(ptr, bytes), in a fixed order; ownership passes
//    to the executor, which may move the bytes to host memory and back (activation swap) and frees
//    them after the backward. g.saved lists them in save order at their current device addresses.
//    The input itself is always available as g.input and is never swapped; f.keep(ptr, bytes) saves
//    a buffer that must not swap either (stage 0's own input).
//  * Workspace. What a backward allocates for itself it frees on g.stream, or hands to
//    g.release_after(ptr, bytes) to have the executor free it behind the backward.
//  * Gradients. backward accumulates into the stage's gradient buffers; micro-batches of one stage
//    run backward in the schedule's order, so a schedule that keeps that order keeps the bytes.
//  * Errors. An exception from forward or backward fails the rank's step: the executor names the
//    rank and the entry, aborts the comm (every rank stops) and frees what the step held.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::exec {

/// Opt-in tag: a stage declares `using stage_concept = pipeswap::exec::stage_tag;`.
struct stage_tag {};

template <class S>
inline constexpr bool enable_stage = requires {
  typename S::stage_concept;
  requires std::derived_from<typename S::stage_concept, stage_tag>;
};

/// A device buffer and its size.
template <backend B>
struct device_buffer {
  device_pointer_t<B> ptr{};
  std::size_t bytes = 0;
};

/// What a forward call gets.
template <backend B>
struct forward_args {
  B& backend;
  stream_t<B> stream;
  schedule::index_type stage = 0;
  schedule::index_type micro = 0;
  device_buffer<B> input;  ///< lent; null for stage 0
  device_buffer<B> output; ///< lent, to be written; null for the last stage
  /// Hands device memory (allocated with the backend) to the executor as a saved activation.
  std::function<void(device_pointer_t<B>, std::size_t)> save;
  /// As save(), for a saved activation that stays on the device when its group swaps
  /// (activation_swap::protect): what the stage produced itself and the pipeline still reads, such
  /// as stage 0's input from data loading.
  std::function<void(device_pointer_t<B>, std::size_t)> keep;
};

/// What a backward call gets.
template <backend B>
struct backward_args {
  B& backend;
  stream_t<B> stream;
  schedule::index_type stage = 0;
  schedule::index_type micro = 0;
  device_buffer<B> input;                  ///< the forward's input (lent); null for stage 0
  device_buffer<B> grad_output;            ///< lent; null for the last stage
  device_buffer<B> grad_input;             ///< lent, to be written; null for stage 0
  std::span<device_buffer<B> const> saved; ///< the forward's saved activations, in save order
  /// Hands device memory the backward allocated on `stream` (a recomputation workspace) to the
  /// executor, which frees it stream-ordered behind the backward, after the saved activations and
  /// the incoming gradient.
  std::function<void(device_pointer_t<B>, std::size_t)> release_after;
};

/// A pipeline stage over backend B. See the header comment and docs/executor.md.
template <class S, class B>
concept stage = enable_stage<S> && backend<B> && requires(S& s, S const& cs, forward_args<B>& f, backward_args<B>& g) {
  { cs.input_bytes() } -> std::same_as<std::size_t>;
  { cs.output_bytes() } -> std::same_as<std::size_t>;
  { s.forward(f) } -> std::same_as<void>;
  { s.backward(g) } -> std::same_as<void>;
};

/// Whether S has the optional begin_step(b, stream).
template <class S, class B>
concept stage_with_begin = requires(S& s, B& b, stream_t<B> st) {
  s.begin_step(b, st);
};

} // namespace pipeswap::exec
