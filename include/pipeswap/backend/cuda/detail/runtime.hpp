// pipeswap — internal: the CUDA runtime API, for the CUDA backend's headers only.
//
// The CUDA backend uses the runtime API alone, so it compiles with the host compiler and links
// libcudart; nvcc is not needed. Without the toolkit's headers on the include path it cannot
// compile, and says so here rather than with an unrelated missing-header error.
#pragma once

#include <pipeswap/config.hpp>

#if !PIPESWAP_HAS_CTK
#  error                                                                                                               \
      "pipeswap: <pipeswap/backend/cuda.hpp> needs the CUDA Toolkit: <cuda_runtime_api.h> is not on the include path. Add the toolkit's include directory and link libcudart (Meson: dependency('cuda', modules: ['cudart'])), or do not include the CUDA backend."
#endif

#include <cuda_runtime_api.h>
