// pipeswap — adam_kernels<cuda::backend>: the CUDA kernel policy of pipeswap::adam, for host code.
//
// Declares the specialization, so that `pipeswap::adam<pipeswap::cuda::backend>` compiles in a
// plain .cpp built by g++ or clang++ (the toolkit's headers are needed, nvcc is not). Its two member
// functions are defined in <pipeswap/optim/cuda/adam_kernels.cuh>, which exactly ONE .cu file of the
// program includes (the instantiation translation unit):
//
//   // adam_cuda.cu — compiled by nvcc, linked into the program
//   #include <pipeswap/optim/cuda/adam_kernels.cuh>
//
// Forgetting it fails the link ("undefined reference to pipeswap::adam_kernels<
// pipeswap::cuda::backend>::update"); including it in two .cu files fails it too ("multiple
// definition"), so neither mistake goes unnoticed. Every TU that names adam<cuda::backend> must see
// this header first (the specialization must be declared before use), which including
// <pipeswap/optim/cuda/adam_kernels.hpp> next to <pipeswap/optim/adam.hpp> ensures.
//
//   update(b, s, tensors, scalars)   one fused launch on `s` for the whole batch (cuda::enqueue_adam in
//                                    adam.cuh); throws before enqueueing anything that writes a tensor.
//   init_master(b, s, param, master, numel, type)   one launch: master = float(param).
//
// The device results equal the host math (and the mock backend) bit for bit;
// docs/cuda.md and docs/optimizer-math.md say why.
#pragma once

#include <cstddef>
#include <span>

#include <pipeswap/backend/cuda/backend.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>

namespace pipeswap {

/// The CUDA policy: fused multi-tensor kernels, defined in <pipeswap/optim/cuda/adam_kernels.cuh>.
/// Stateless; default-constructible, copyable.
template <>
struct adam_kernels<cuda::backend> {
  /// Enqueues the update of every range of `tensors` (numel > 0) on `s` in one launch. Throws
  /// invalid_argument for a bad batch, cuda_error when allocating or launching fails; nothing that
  /// writes a tensor is enqueued then.
  void update(cuda::backend& b, cuda::stream_ref s, std::span<adam_tensor<cuda::backend> const> tensors,
              std::span<adam_step_scalars const> scalars) const;

  /// Enqueues master[i] = float(param[i]) for i < numel on `s` (param of `type`: f32, bf16, f16).
  void init_master(cuda::backend& b, cuda::stream_ref s, device_ptr param, device_ptr master, std::size_t numel,
                   dtype type) const;
};

} // namespace pipeswap
