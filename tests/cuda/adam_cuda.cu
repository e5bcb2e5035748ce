// The instantiation translation unit of the CUDA Adam policy: defines adam_kernels<cuda::backend>'s
// members (the fused kernels). Exactly what a program using pipeswap::adam on CUDA compiles once
// with nvcc; the CUDA test executables and bench/gpu/gpu_check link it.
#include <pipeswap/optim/cuda/adam_kernels.cuh>

#ifdef RANGE_V3_VERSION
#  error "range-v3 is reachable from the CUDA Adam kernels; nvcc 13 cannot compile it"
#endif
