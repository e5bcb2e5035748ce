// pipeswap — the definitions of adam_kernels<cuda::backend>'s members. Include this in exactly one
// .cu file of a program (see <pipeswap/optim/cuda/adam_kernels.hpp>); it defines two non-inline
// functions, so a second inclusion fails the link with "multiple definition". Nothing else.
#pragma once

#if !defined(__CUDACC__)
#  error "<pipeswap/optim/cuda/adam_kernels.cuh> defines CUDA kernels: include it from exactly one \
.cu file compiled by nvcc. Host code uses <pipeswap/optim/cuda/adam_kernels.hpp>."
#endif

#include <pipeswap/optim/cuda/adam.cuh>
#include <pipeswap/optim/cuda/adam_kernels.hpp>

namespace pipeswap {

void adam_kernels<cuda::backend>::update(cuda::backend& b, cuda::stream_ref s,
                                         std::span<adam_tensor<cuda::backend> const> tensors,
                                         std::span<adam_step_scalars const> scalars) const {
  cuda::enqueue_adam(b, s, tensors, scalars);
}

void adam_kernels<cuda::backend>::init_master(cuda::backend& b, cuda::stream_ref s, device_ptr param, device_ptr master,
                                              std::size_t numel, dtype type) const {
  cuda::enqueue_init_master(b, s, param, master, numel, type);
}

} // namespace pipeswap
