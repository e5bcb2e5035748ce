// pipeswap — what an Adam/AdamW kernel policy receives: the element ranges of one batch.
//
//   adam_tensor<B>          one element range of one parameter: device addresses of the parameter,
//                           its gradient, its fp32 states and its optional fp32 master.
//   adam_kernels<B>         the default kernel policy of adam<B>, declared here and specialised per
//                           backend: the mock in <pipeswap/optim/adam.hpp>, CUDA in
//                           <pipeswap/optim/cuda/adam_kernels.hpp>. A policy provides
//                             void update(B&, stream_t<B>, std::span<adam_tensor<B> const>,
//                                         std::span<adam_step_scalars const>) const;
//                             void init_master(B&, stream_t<B>, device_pointer_t<B> param,
//                                              device_pointer_t<B> master, std::size_t numel,
//                                              dtype param_type) const;
//                           update() enqueues the whole batch on the stream or throws before
//                           enqueueing anything that writes a tensor.
//   adam_kernel_policy<K,B> the concept a policy models (adam<B, K> requires it).
//   validate_adam_batch     the checks every policy makes before it enqueues (host only).
//
// Kept apart from adam.hpp so that a CUDA translation unit (nvcc) sees only this, the element math
// and the CUDA backend — not the mock simulator.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/adam_math.hpp>

namespace pipeswap {

/// One element range of one parameter, as the kernels see it. Pointers address element `0` of the
/// range. exp_avg, exp_avg_sq, max_exp_avg_sq and master are fp32; param is param_type; grad is
/// grad_type (each f32, bf16 or f16). max_exp_avg_sq is used only when the range's scalars have
/// amsgrad; master, when set, is updated and then rounded into param (param_type bf16 or f16).
template <backend B>
struct adam_tensor {
  device_pointer_t<B> param{}, grad{}, exp_avg{}, exp_avg_sq{}, max_exp_avg_sq{}, master{};
  std::size_t numel = 0;
  dtype param_type = dtype::f32;
  dtype grad_type = dtype::f32;
  std::uint32_t scalars = 0; ///< index into the step's scalars
};

/// The default kernel policy of adam<B>; specialised per backend (see the header comment).
template <class B>
struct adam_kernels;

/// What adam<B, K> requires of its kernel policy K: a complete type (so adam_kernels<B> must have
/// been specialised for B, or a policy passed) with update() and init_master() as in the header
/// comment, callable on a K lvalue. A missing or incomplete policy is reported at adam<B> by this
/// concept's name.
template <class K, class B>
concept adam_kernel_policy = backend<B> && requires {
  sizeof(K);
} && requires(K& k, B& b, stream_t<B> s, std::span<adam_tensor<B> const> ts, std::span<adam_step_scalars const> scalars,
              device_pointer_t<B> p, std::size_t n, dtype t) {
  { k.update(b, s, ts, scalars) } -> std::same_as<void>;
  { k.init_master(b, s, p, p, n, t) } -> std::same_as<void>;
};

namespace detail {

inline bool is_adam_storage(dtype t) noexcept { return t == dtype::f32 || t == dtype::bf16 || t == dtype::f16; }

} // namespace detail

/// Throws invalid_argument, naming the range's index in the batch and the rule, unless every range
/// with numel > 0 has: a scalars index inside `scalars`; non-null param, grad, exp_avg, exp_avg_sq,
/// and max_exp_avg_sq when its scalars have amsgrad; param and grad types f32, bf16 or f16; a master
/// only for a bf16/f16 parameter; no two of its arrays overlapping. Ranges with numel == 0 are
/// ignored. Host only; O(batch size).
template <backend B>
void validate_adam_batch(std::span<adam_tensor<B> const> ts, std::span<adam_step_scalars const> scalars) {
  using P = device_pointer_t<B>;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    auto const& t = ts[i];
    if (t.numel == 0) continue;
    auto fail = [i](std::initializer_list<detail::message_part> why) {
      auto what = detail::message({"adam kernels: batch range ", i, " "});
      detail::append(what, why);
      throw invalid_argument(what);
    };
    if (t.scalars >= scalars.size()) {
      fail({"uses step scalars ", t.scalars, " but the step has ", scalars.size()});
    }
    if (!detail::is_adam_storage(t.param_type) || !detail::is_adam_storage(t.grad_type)) {
      fail({"has types ", name_of(t.param_type), "/", name_of(t.grad_type), "; F32, BF16 and F16 are supported"});
    }
    if (t.master && t.param_type == dtype::f32) fail({"has an F32 parameter and a master"});
    bool const amsgrad = scalars[t.scalars].amsgrad;
    struct array {
      char const* name;
      P p;
      std::size_t bytes;
    };
    array const arrays[] = {
        {"param", t.param, t.numel * size_of(t.param_type)},
        {"grad", t.grad, t.numel * size_of(t.grad_type)},
        {"exp_avg", t.exp_avg, t.numel * 4},
        {"exp_avg_sq", t.exp_avg_sq, t.numel * 4},
        {"max_exp_avg_sq", amsgrad ? t.max_exp_avg_sq : P{}, t.numel * 4},
        {"master", t.master, t.numel * 4},
    };
    for (std::size_t a = 0; a < 5; ++a) {
      if (a == 4 && !amsgrad) continue;
      if (!arrays[a].p) fail({"has no ", arrays[a].name});
    }
    for (std::size_t a = 0; a < 6; ++a) {
      for (std::size_t c = a + 1; c < 6; ++c) {
        auto const &x = arrays[a], &y = arrays[c];
        if (x.p && y.p && x.p < y.p + y.bytes && y.p < x.p + x.bytes) {
          fail({"has ", x.name, " and ", y.name, " overlapping"});
        }
      }
    }
  }
}

} // namespace pipeswap
