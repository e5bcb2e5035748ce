// pipeswap — errors of the CUDA backend.
//
//   cuda_error                what every failing CUDA runtime call made by pipeswap throws: the
//                             cudaError_t status, the call as written and the source location.
//   PIPESWAP_CUDA_TRY(expr)   evaluates `expr` (a cudaError_t); on failure clears the calling
//                             thread's last error and throws cuda_error naming `expr`.
//   PIPESWAP_CUDA_LOG(expr)   the same for destructors and other noexcept paths: never throws; on
//                             failure clears the last error, prints one line to stderr and counts
//                             it (logged_error_count()). Failures while the runtime unloads at
//                             process exit (cudaErrorCudartUnloading) are neither printed nor
//                             counted.
//
// Clearing matters because the runtime keeps the last failure of each thread and reports it again
// from cudaGetLastError/cudaPeekAtLastError: a failure pipeswap has already turned into an
// exception must not be misread by the caller's next kernel-launch check. Sticky errors (a kernel
// fault that corrupts the context) cannot be cleared; every later call reports them and throws
// again.
//
// Messages read "<what>: <call> failed: <cudaErrorName>: <description> (at <file>:<line>)", where
// <what> names the object and operation, e.g.
//   pipeswap::cuda::backend(device 0)::allocate_device(1073741824 bytes): cudaMallocFromPoolAsync(
//   &p, n, device_pool_.get(), s.get()) failed: cudaErrorMemoryAllocation: out of memory (at ...)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <source_location>
#include <string>
#include <string_view>

#include <pipeswap/backend/cuda/detail/runtime.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap::cuda {

/// A CUDA runtime call failed. Copying never throws (the text lives in the std::runtime_error
/// base).
class cuda_error : public pipeswap::error {
public:
  /// `call` is the failing call as written; `what` names the object and the operation ("" for
  /// none).
  cuda_error(cudaError_t status, std::string_view call, std::string_view what = "pipeswap::cuda",
             std::source_location where = std::source_location::current())
      : error(format(status, call, what, where)), status_(status), where_(where),
        call_offset_(what.empty() ? 0 : what.size() + 2), call_size_(call.size()) {}

  /// The status the runtime returned.
  [[nodiscard]] cudaError_t status() const noexcept { return status_; }
  /// The failing call as written, e.g. "cudaSetDevice(device)".
  [[nodiscard]] std::string_view call() const noexcept {
    return std::string_view(what()).substr(call_offset_, call_size_);
  }
  /// Where the call was made.
  [[nodiscard]] std::source_location const& where() const noexcept { return where_; }

private:
  static std::string format(cudaError_t status, std::string_view call, std::string_view what,
                            std::source_location const& where) {
    std::string m;
    if (!what.empty()) m.append(what).append(": ");
    m.append(call).append(" failed: ");
    m.append(cudaGetErrorName(status)).append(": ").append(cudaGetErrorString(status));
    m.append(" (at ").append(pipeswap::detail::where(where)).append(")");
    return m;
  }

  cudaError_t status_;
  std::source_location where_;
  std::size_t call_offset_;
  std::size_t call_size_;
};

namespace detail {

inline std::atomic<std::size_t> logged_errors{0};

[[noreturn]] inline void raise(cudaError_t status, std::string_view call, std::string_view what,
                               std::source_location where) {
  (void)cudaGetLastError();
  throw cuda_error(status, call, what, where);
}

inline cudaError_t log_failure(cudaError_t status, char const* call, std::source_location where) noexcept {
  if (status == cudaSuccess) return status;
  (void)cudaGetLastError();
  if (status == cudaErrorCudartUnloading) return status; // the driver tears everything down anyway
  logged_errors.fetch_add(1, std::memory_order_relaxed);
  std::fprintf(stderr, "pipeswap::cuda: %s failed in a cleanup path (ignored): %s: %s (at %s:%u)\n", call,
               cudaGetErrorName(status), cudaGetErrorString(status), where.file_name(),
               static_cast<unsigned>(where.line()));
  return status;
}

} // namespace detail

/// Number of failures PIPESWAP_CUDA_LOG has reported in this process.
[[nodiscard]] inline std::size_t logged_error_count() noexcept {
  return detail::logged_errors.load(std::memory_order_relaxed);
}

} // namespace pipeswap::cuda

/// Checks a cudaError_t expression; on failure clears the last error and throws
/// pipeswap::cuda::cuda_error naming the expression.
#define PIPESWAP_CUDA_TRY(expr) PIPESWAP_CUDA_TRY_WHAT(expr, "pipeswap::cuda")

/// PIPESWAP_CUDA_TRY with a description of the object and operation; `...` is an expression
/// convertible to std::string_view, evaluated only when the call failed.
#define PIPESWAP_CUDA_TRY_WHAT(expr, ...)                                                                              \
  do {                                                                                                                 \
    if (::cudaError_t pipeswap_cuda_status_ = (expr); pipeswap_cuda_status_ != ::cudaSuccess) [[unlikely]] {           \
      ::pipeswap::cuda::detail::raise(pipeswap_cuda_status_, #expr, (__VA_ARGS__), ::std::source_location::current()); \
    }                                                                                                                  \
  } while (false)

/// Checks a cudaError_t expression without throwing: on failure clears the last error, prints one
/// line to stderr and counts it. Yields the status. For destructors and other noexcept paths.
#define PIPESWAP_CUDA_LOG(expr) ::pipeswap::cuda::detail::log_failure((expr), #expr, ::std::source_location::current())
