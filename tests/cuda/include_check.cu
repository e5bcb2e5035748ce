// The CUDA backend compiles under nvcc next to device code, and does not pull range-v3 in (nvcc 13
// cannot compile it).
#include <pipeswap/backend/cuda.hpp>

#ifdef RANGE_V3_VERSION
#  error "range-v3 is reachable from <pipeswap/backend/cuda.hpp>; nvcc 13 cannot compile it"
#endif

static_assert(pipeswap::backend<pipeswap::cuda::backend>);
static_assert(PIPESWAP_CUDA_COMPILER);

namespace {
__global__ void touch(unsigned char* p, unsigned long n) {
  unsigned long const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = static_cast<unsigned char>(i);
}
} // namespace

// A kernel launched on a stream the backend hands out: the way a .cu user combines the two.
void pipeswap_cuda_include_check_cu(pipeswap::cuda::backend& b, pipeswap::device_ptr d, unsigned long n) {
  touch<<<static_cast<unsigned>((n + 255) / 256), 256, 0, b.current_stream().get()>>>(d.get<unsigned char>(), n);
  PIPESWAP_CUDA_TRY(cudaGetLastError());
}
