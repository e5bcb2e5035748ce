// pipeswap — Adam/AdamW on host-addressable memory: the range function and a ready kernel policy.
//
//   adam_update_host(...)        one element range on raw host pointers: the update of the fp32
//                                master then its rounding into the parameter, or the update of the
//                                parameter in place (the same element math as every kernel)
//   master_from_param_host(...)  an fp32 master copy of a bf16/f16/f32 parameter
//   host_adam_kernels<B>         a complete adam_kernels policy for a backend whose device pointers
//                                the host can dereference (device_pointer.get<T>()) and whose calls
//                                complete before they return; a user backend of that kind adopts it
//                                in one line:
// @code
//   template <> struct pipeswap::adam_kernels<my_backend> : pipeswap::host_adam_kernels<my_backend> {};
// @endcode
// A backend that runs work asynchronously writes update() and init_master() as kernels of its own
// that call adam_update_host / master_from_param_host on its stream (the mock's policy,
// <pipeswap/optim/mock/adam_kernels.hpp>, is such a one). docs/optimizer.md has the contract.
#pragma once

#include <cstddef>
#include <span>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>

namespace pipeswap {

namespace detail {

/// Calls f(P{}) with P the storage type of `t` (float, bf16, f16).
template <class F>
decltype(auto) with_storage_type(dtype t, F&& f) {
  switch (t) {
  case dtype::bf16: return f(bf16{});
  case dtype::f16: return f(f16{});
  default: return f(float{});
  }
}

} // namespace detail

/// One range in host-addressable memory, no checks (validate_adam_batch first): with a master, the
/// update of the fp32 master then its rounding into the parameter; without, the update of the
/// parameter in place. `vmax` may be null unless s.amsgrad. Results equal the CUDA kernels' bit for
/// bit (they share adam_element).
inline void adam_update_host(adam_step_scalars const& s, dtype param_type, dtype grad_type, void* param,
                             void const* grad, float* exp_avg, float* exp_avg_sq, float* vmax, float* master,
                             std::size_t n) {
  detail::with_storage_type(grad_type, [&](auto g0) {
    using G = decltype(g0);
    auto const* g = static_cast<G const*>(grad);
    detail::with_storage_type(param_type, [&](auto p0) {
      using P = decltype(p0);
      if (master != nullptr) {
        adam_update_unchecked<float, G>(s, master, g, exp_avg, exp_avg_sq, vmax, n);
        cast_master_to_param_unchecked<P>(master, static_cast<P*>(param), n);
      } else {
        adam_update_unchecked<P, G>(s, static_cast<P*>(param), g, exp_avg, exp_avg_sq, vmax, n);
      }
    });
  });
}

/// master[i] = float(param[i]) for a parameter of `type` (f32, bf16 or f16).
inline void master_from_param_host(void const* param, float* master, std::size_t n, dtype type) {
  detail::with_storage_type(type, [&](auto p0) {
    using P = decltype(p0);
    auto const* in = static_cast<P const*>(param);
    for (std::size_t i = 0; i < n; ++i) master[i] = to_float(in[i]);
  });
}

/// The adam_kernels policy of a backend whose device memory the host can address and whose calls
/// complete at once: the update runs on the calling thread. Checks every batch (validate_adam_batch)
/// before touching a byte.
template <backend B>
struct host_adam_kernels {
  void update(B&, stream_t<B>, std::span<adam_tensor<B> const> ts, std::span<adam_step_scalars const> scalars) const {
    validate_adam_batch(ts, scalars);
    for (auto const& t : ts) {
      if (t.numel == 0) continue;
      auto const& s = scalars[t.scalars];
      adam_update_host(s, t.param_type, t.grad_type, t.param.template get<void>(), t.grad.template get<void const>(),
                       t.exp_avg.template get<float>(), t.exp_avg_sq.template get<float>(),
                       s.amsgrad ? t.max_exp_avg_sq.template get<float>() : nullptr,
                       t.master ? t.master.template get<float>() : nullptr, t.numel);
    }
  }

  void init_master(B&, stream_t<B>, device_pointer_t<B> param, device_pointer_t<B> master, std::size_t numel,
                   dtype type) const {
    if (numel) master_from_param_host(param.template get<void const>(), master.template get<float>(), numel, type);
  }
};

} // namespace pipeswap
