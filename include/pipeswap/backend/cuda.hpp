// pipeswap — the CUDA backend (umbrella header).
//
// pipeswap::cuda::backend models pipeswap::backend over the CUDA runtime API for one device. It
// compiles with the host compiler (g++, clang++) or nvcc, needs the toolkit's headers and
// libcudart, and never launches kernels. Guide: docs/cuda.md. Components:
//
//   <pipeswap/backend/cuda/error.hpp>    cuda_error, PIPESWAP_CUDA_TRY, PIPESWAP_CUDA_LOG
//   <pipeswap/backend/cuda/device.hpp>   device_count, device_guard
//   <pipeswap/backend/cuda/stream.hpp>   stream_ref, stream, legacy_stream, per_thread_stream
//   <pipeswap/backend/cuda/event.hpp>    event, event_pool
//   <pipeswap/backend/cuda/memory.hpp>   memory_pool, pinned_allocator, host_placement,
//                                        register_host, unregister_host
//   <pipeswap/backend/cuda/backend.hpp>  backend, backend_options
//
// Including it without the CUDA Toolkit on the include path is an error (PIPESWAP_HAS_CTK == 0).
#pragma once

#include <pipeswap/backend/cuda/backend.hpp>
#include <pipeswap/backend/cuda/device.hpp>
#include <pipeswap/backend/cuda/error.hpp>
#include <pipeswap/backend/cuda/event.hpp>
#include <pipeswap/backend/cuda/memory.hpp>
#include <pipeswap/backend/cuda/stream.hpp>
