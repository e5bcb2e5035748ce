// pipeswap — the mock backend's Adam/AdamW kernel policy (adam_kernels<mock::backend>).
//
// Include this header next to <pipeswap/optim/adam.hpp> to use adam<mock::backend>. It sits under
// optim/ beside <pipeswap/optim/cuda/adam_kernels.hpp> (the optimizer knows its backends, never the
// other way round), in a header of its own so that adam.hpp does not pull the mock into every user's
// translation unit.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/host_adam_kernels.hpp>

namespace pipeswap {

/// Mock backend: one mock kernel per batch, declaring every range it reads and writes, running the
/// host math (so results equal the CUDA kernels' bit for bit — they share adam_element). Checks the
/// batch as the CUDA policy does (validate_adam_batch) before launching.
template <>
struct adam_kernels<mock::backend> {
  void update(mock::backend& b, mock::stream s, std::span<adam_tensor<mock::backend> const> ts,
              std::span<adam_step_scalars const> scalars) const {
    validate_adam_batch(ts, scalars);
    std::vector<mock::region> reads, writes;
    for (auto const& t : ts) {
      if (t.numel == 0) continue;
      reads.push_back({t.grad, t.numel * size_of(t.grad_type)});
      writes.push_back({t.param, t.numel * size_of(t.param_type)});
      writes.push_back({t.exp_avg, t.numel * 4});
      writes.push_back({t.exp_avg_sq, t.numel * 4});
      if (t.max_exp_avg_sq) writes.push_back({t.max_exp_avg_sq, t.numel * 4});
      if (t.master) writes.push_back({t.master, t.numel * 4});
    }
    b.launch(s, {"adam", std::move(reads), std::move(writes), std::nullopt},
             [ts = std::vector(ts.begin(), ts.end()),
              sc = std::vector(scalars.begin(), scalars.end())](mock::kernel_context const& k) {
               for (auto const& t : ts) {
                 if (t.numel != 0) range(k, t, sc[t.scalars]);
               }
             });
  }

  void init_master(mock::backend& b, mock::stream s, device_ptr param, device_ptr master, std::size_t numel,
                   dtype type) const {
    b.launch(s, {"init master", {{param, numel * size_of(type)}}, {{master, numel * 4}}, std::nullopt},
             [=](mock::kernel_context const& k) {
               master_from_param_host(k.read<std::byte>(param, numel * size_of(type)).data(),
                                      k.write<float>(master, numel).data(), numel, type);
             });
  }

private:
  /// The range through the kernel's views (declared regions only).
  static void range(mock::kernel_context const& k, adam_tensor<mock::backend> const& t, adam_step_scalars const& s) {
    auto const n = t.numel;
    auto f32 = [&](device_ptr p) { return k.write<float>(p, n).data(); };
    adam_update_host(s, t.param_type, t.grad_type, k.write<std::byte>(t.param, n * size_of(t.param_type)).data(),
                     k.read<std::byte>(t.grad, n * size_of(t.grad_type)).data(), f32(t.exp_avg), f32(t.exp_avg_sq),
                     s.amsgrad ? f32(t.max_exp_avg_sq) : nullptr, t.master ? f32(t.master) : nullptr, n);
  }
};

} // namespace pipeswap
