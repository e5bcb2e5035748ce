// pipeswap — what the two step pipelines of the optimizer-swap runtime share.
//
// A pipeline runs the batches of one step plan, from the first batch not yet updated, through the
// transfer engine; the update of a batch is the runtime's (the optimizer's kernels over the batch's
// device views), called back through a plain function pointer so that the pipelines depend on the
// backend only, not on the optimizer.
#pragma once

#include <cstddef>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/function_ref.hpp>
#include <pipeswap/swap/detail/carry_over.hpp>
#include <pipeswap/swap/detail/step_plan.hpp>
#include <pipeswap/swap/detail/step_trace.hpp>

namespace pipeswap::detail {

/// Updates batch n of the step in progress (the optimizer's update over the batch's device views).
using update_call = function_ref<void(std::size_t)>;

/// What the runtime hands both pipelines.
template <backend B>
struct pipeline_env {
  transfer_engine<B>& engine;
  step_trace& trace;
  lean_vector<slot_storage<B>>& slots;
  bool defer_offload = false;
};

/// The base of both pipelines: what they work with, and the gate of a step's first allocation.
template <backend B>
class step_pipeline {
protected:
  explicit step_pipeline(pipeline_env<B> const& env) noexcept
      : engine_(env.engine), trace_(env.trace), defer_offload_(env.defer_offload) {}

  /// Orders the step's first device allocation after the memory the previous step released: that
  /// release was made visible to the compute stream, and the h2d stream starts behind it.
  void gate_step() {
    auto& b = engine_.backend();
    wait_at(wait_site::gate_after_offload, b, engine_.h2d(), b.record_event(engine_.compute()));
  }

  transfer_engine<B>& engine_;
  step_trace& trace_;
  bool defer_offload_; ///< a step returns with its last D2Hs in flight (finished by the carry-over)
};

} // namespace pipeswap::detail
