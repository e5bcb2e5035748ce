// pipeswap — fused multi-tensor Adam/AdamW kernels for the CUDA backend. nvcc only.
//
//   cuda::enqueue_adam(b, s, tensors, scalars)   one launch on `s` updates every range of a batch:
//                                               any mix of f32/bf16/f16 parameters and gradients,
//                                               fp32 states, optional fp32 master (updated, then
//                                               rounded into the parameter), amsgrad, several step
//                                               counts. Throws before enqueueing anything that
//                                               writes a tensor.
//   cuda::enqueue_init_master(b, s, param, master, numel, type)
//                                               one launch: master[i] = float(param[i]).
//
// Both are inline and the kernels are templates, so this header may be included by any number of
// .cu files. The default policy adam_kernels<cuda::backend> (declared in adam_kernels.hpp for host
// compilers) is defined on top of them in adam_kernels.cuh, which exactly one .cu file includes.
//
// Numerics: each element goes through pipeswap::adam_element with the host-computed
// adam_step_scalars — the function the host reference loop and the mock backend call — in the same
// order (torch's: maximize, weight decay, lerp, second moment, amsgrad max, denominator, addcdiv; see
// adam_element), one IEEE round-to-nearest operation each via inline PTX, no fma, no ftz. Loads and
// stores are exact (bf16/f16 widen exactly; the result is rounded to nearest even by from_float, as
// on the host). So device results equal the host loop's bit for bit, NaN payloads excepted.
//
// How a batch is launched (multi-tensor apply): the host builds a table — a header, the step scalars
// the batch uses, one 64-byte descriptor per range — and the kernel runs ceil(numel / 16384) blocks
// of 256 threads per range; a block finds its range by a parallel search over the descriptors'
// first-block numbers. A table of up to 4 KiB (about 60 ranges) travels as the kernel's parameter
// (__grid_constant__, no copy at all). A larger one is written into stream-ordered device memory by
// small copy kernels whose parameters carry 32 KiB of it each, then read by the one update launch and
// freed behind it on the same stream. Kernel parameters are captured by the launch, so no host
// buffer outlives the call, nothing waits for the device, and the table's device memory cannot be
// reused before the update that reads it has completed (cudaFreeAsync orders the release on `s`).
// Pageable cudaMemcpyAsync could synchronize with the stream and pinned staging would need a ring of
// buffers and events; the copy kernels need neither. Needs 32 KiB kernel parameters (CUDA >= 12.1,
// Volta or newer), which every driver nvcc 13 runs on provides.
//
// Vectorized access: a range whose arrays all sit at the same element offset modulo 4 from a
// 16-byte boundary (8 bytes for bf16/f16) — e.g. whole tensors from cudaMalloc, or packed slices cut
// at multiples of 4 elements — is processed 4 elements per thread (float4 / 8-byte loads) after at
// most 3 leading elements; other ranges element by element. Results do not depend on the path.
//
// Errors: a bad batch throws pipeswap::invalid_argument (validate_adam_batch, plus: each array
// aligned to its element size, at most 2^31 - 1 blocks); a failing allocation or launch throws
// cuda_error; in every case nothing that writes a tensor was enqueued (copy kernels write only the
// private table, which is released). Launch status is the return value of cudaLaunchKernelEx, so an
// earlier, unrelated error pending on the thread is neither reported nor cleared. What can still
// fail after update() returned happens on the device: a range that names memory that is not (or no
// longer) allocated faults, and the fault — sticky, the context is lost — is reported as cuda_error
// by the next CUDA call that synchronizes or enqueues.
#pragma once

#if !defined(__CUDACC__)
#  error "<pipeswap/optim/cuda/adam.cuh> holds CUDA kernels: include it from a .cu file compiled by \
nvcc. Host code uses <pipeswap/optim/cuda/adam_kernels.hpp>."
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include <pipeswap/backend/cuda/backend.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/cuda/device.hpp>
#include <pipeswap/backend/cuda/error.hpp>
#include <pipeswap/detail/round.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/cuda/detail/adam_batch.hpp>

namespace pipeswap::cuda {

namespace adam_detail {

/// Table bytes one copy kernel carries (the 32764-byte parameter limit, less the other arguments).
inline constexpr std::size_t fill_bytes = 32704;

struct param_table {
  alignas(16) unsigned char bytes[param_table_bytes];
};
struct fill_chunk {
  alignas(16) unsigned char bytes[fill_bytes];
};
static_assert(fill_bytes % 16 == 0 && sizeof(fill_chunk) + 16 <= 32764);

// Kernels are templates (never instantiated with other arguments) so that every .cu file including
// this header may define them. One update kernel serves both table locations: its element loops are
// most of the compile time, and the unused 4 KiB parameter of the in-memory case costs nothing
// measurable.
template <int = 0>
__global__ void __launch_bounds__(block_threads)
    adam_kernel(__grid_constant__ param_table const p, unsigned char const* in_memory) {
  unsigned char const* const t = in_memory != nullptr ? in_memory : p.bytes;
  auto const range = locate(t, blockIdx.x, [](auto const& pred) { return __syncthreads_count(pred(threadIdx.x)); });
  update_share(t, range, blockIdx.x, threadIdx.x);
}

template <int = 0>
__global__ void __launch_bounds__(block_threads)
    fill_kernel(uint4* dst, __grid_constant__ fill_chunk const c, unsigned words) {
  auto const* src = reinterpret_cast<uint4 const*>(c.bytes);
  for (unsigned i = threadIdx.x; i < words; i += block_threads) dst[i] = src[i];
}

template <class P>
__global__ void __launch_bounds__(block_threads) init_master_kernel(P const* param, float* master, std::uint64_t n) {
  std::uint64_t const stride = std::uint64_t{gridDim.x} * block_threads;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{block_threads} + threadIdx.x; i < n; i += stride) {
    master[i] = to_float(param[i]);
  }
}

/// cudaLaunchKernelEx returns the status of this launch, not an earlier error pending on the thread.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), unsigned blocks, stream_ref s, std::string const& what, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(block_threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s.get();
  PIPESWAP_CUDA_TRY_WHAT(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

} // namespace adam_detail

/// Enqueues on `s` one update launch for every range of `tensors` with numel > 0 (see the header
/// comment): range r uses scalars[tensors[r].scalars]. Throws invalid_argument (bad batch) or
/// cuda_error (allocation or launch) before enqueueing anything that writes a tensor; returns at
/// once otherwise. `s` must belong to b's device; the call makes that device current while it
/// launches.
inline void enqueue_adam(backend& b, stream_ref s, std::span<adam_tensor<backend> const> tensors,
                         std::span<adam_step_scalars const> scalars) {
  using namespace adam_detail;
  table const t = build_table(tensors, scalars);
  if (t.ranges == 0) return;
  auto const grid = static_cast<unsigned>(t.blocks);
  std::string const what =
      pipeswap::detail::message({"pipeswap::cuda::enqueue_adam(", t.ranges, " ranges, ", t.blocks, " blocks)"});
  device_guard const g(b.device(), what);

  if (t.bytes.size() <= param_table_bytes) {
    param_table p{};
    std::memcpy(p.bytes, t.bytes.data(), t.bytes.size());
    launch(adam_kernel<>, grid, s, what, p, static_cast<unsigned char const*>(nullptr));
    return;
  }
  device_ptr const mem = b.allocate_device(t.bytes.size(), s);
  auto release = [&] { PIPESWAP_CUDA_LOG(cudaFreeAsync(mem.get(), s.get())); };
  try {
    for (std::size_t at = 0; at < t.bytes.size(); at += fill_bytes) {
      std::size_t const n = std::min(fill_bytes, t.bytes.size() - at);
      fill_chunk c{};
      std::memcpy(c.bytes, t.bytes.data() + at, n);
      launch(fill_kernel<>, 1, s, what, (mem + at).get<uint4>(), c, static_cast<unsigned>(n / 16));
    }
    launch(adam_kernel<>, grid, s, what, param_table{}, mem.get<unsigned char const>());
  } catch (...) {
    release();
    throw;
  }
  release(); // ordered on s behind the update that reads the table
}

/// Enqueues on `s` one launch writing master[i] = float(param[i]) for i < numel (param of `type`:
/// f32, bf16 or f16). Throws invalid_argument for another type or a null pointer with numel > 0,
/// cuda_error when the launch fails; nothing is enqueued then.
inline void enqueue_init_master(backend& b, stream_ref s, device_ptr param, device_ptr master, std::size_t numel,
                                dtype type) {
  using namespace adam_detail;
  if (!pipeswap::detail::is_adam_storage(type)) {
    throw invalid_argument("pipeswap::cuda::enqueue_init_master: parameter type " + std::string(name_of(type)) +
                           "; F32, BF16 and F16 are supported");
  }
  if (numel == 0) return;
  if (!param || !master) throw invalid_argument("pipeswap::cuda::enqueue_init_master: null pointer");
  auto const blocks = static_cast<unsigned>(std::min<std::uint64_t>(
      pipeswap::detail::ceil_div(std::uint64_t{numel}, std::uint64_t{block_threads}), std::uint64_t{1} << 16));
  std::string const what = pipeswap::detail::message({"pipeswap::cuda::enqueue_init_master(", numel, " elements)"});
  device_guard const g(b.device(), what);
  std::uint64_t const n = numel;
  float* const out = master.get<float>();
  switch (type) {
  case dtype::bf16: launch(init_master_kernel<bf16>, blocks, s, what, param.get<bf16 const>(), out, n); break;
  case dtype::f16: launch(init_master_kernel<f16>, blocks, s, what, param.get<f16 const>(), out, n); break;
  default: launch(init_master_kernel<float>, blocks, s, what, param.get<float const>(), out, n); break;
  }
}

} // namespace pipeswap::cuda
