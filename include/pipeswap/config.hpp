// pipeswap — configuration macros shared by every header.
//
// PIPESWAP_HOST_DEVICE  marks functions usable from host and device code; it is empty unless the
//                       translation unit is compiled by nvcc (or clang in CUDA mode).
// PIPESWAP_HAS_CTK      1 when the CUDA Toolkit's runtime header is on the include path, else 0. The
//                       CUDA backend is available exactly when this is 1; it needs libcudart at link
//                       time but not nvcc.
// PIPESWAP_CUDA_COMPILER 1 when compiled by a CUDA compiler (kernels may be launched), else 0.
// PIPESWAP_ASSERTIONS   1 to check the preconditions of the library's internal containers (an index
//                       past the end aborts with a message); on by default when _GLIBCXX_ASSERTIONS
//                       is defined, as libstdc++'s own checks are. Define it to 0 or 1 to choose.
#pragma once

#define PIPESWAP_VERSION_MAJOR 0
#define PIPESWAP_VERSION_MINOR 1
#define PIPESWAP_VERSION_PATCH 0

#if defined(__CUDACC__)
#  define PIPESWAP_HOST_DEVICE __host__ __device__
#  define PIPESWAP_CUDA_COMPILER 1
#else
#  define PIPESWAP_HOST_DEVICE
#  define PIPESWAP_CUDA_COMPILER 0
#endif

#if defined(__has_include)
#  if __has_include(<cuda_runtime_api.h>)
#    define PIPESWAP_HAS_CTK 1
#  else
#    define PIPESWAP_HAS_CTK 0
#  endif
#else
#  define PIPESWAP_HAS_CTK 0
#endif

#ifndef PIPESWAP_ASSERTIONS
#  if defined(_GLIBCXX_ASSERTIONS)
#    define PIPESWAP_ASSERTIONS 1
#  else
#    define PIPESWAP_ASSERTIONS 0
#  endif
#endif

#if __cplusplus < 202002L && !defined(_MSVC_LANG)
#  error "pipeswap requires C++20"
#endif
