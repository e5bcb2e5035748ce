// The CUDA backend compiles with the host compiler alone and does not pull range-v3 in.
#include <pipeswap/backend/cuda.hpp>

#ifdef RANGE_V3_VERSION
#  error "range-v3 is reachable from <pipeswap/backend/cuda.hpp>; nvcc 13 cannot compile it"
#endif

static_assert(pipeswap::backend<pipeswap::cuda::backend>);
static_assert(!PIPESWAP_CUDA_COMPILER);

int pipeswap_cuda_include_check_cpp() { return pipeswap::cuda::device_count(); }
