// Test support for the CUDA backend: its backend_traits (made on device 0, or PIPESWAP_TEST_DEVICE;
// unavailable without a driver or a device), the reason string a skipped executable prints, and
// upload/download (blocking, after the whole device is idle — like the mock's write_device and
// read_device) for the runtime test bodies of support/world.hpp. Only for executables that link
// libcudart (tests/cuda/).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/backend/cuda.hpp>

#include "support/backend_fixture.hpp"

namespace pipeswap::test {

/// The device CUDA tests run on: PIPESWAP_TEST_DEVICE, or 0.
[[nodiscard]] inline int cuda_test_device() {
  char const* d = std::getenv("PIPESWAP_TEST_DEVICE");
  return d != nullptr && *d != '\0' ? std::atoi(d) : 0;
}

/// Why CUDA tests cannot run here, or nullopt when a device is present.
[[nodiscard]] inline std::optional<std::string> cuda_unavailable() {
  int n = 0; // the runtime leaves it untouched when it fails
  cudaError_t const s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess) {
    (void)cudaGetLastError();
    return "no CUDA device: cudaGetDeviceCount returned error " + std::to_string(static_cast<int>(s)) + " (" +
           cudaGetErrorName(s) + ": " + cudaGetErrorString(s) + ")";
  }
  if (n == 0) return std::string("no CUDA device: cudaGetDeviceCount found 0 devices");
  if (int const d = cuda_test_device(); d < 0 || d >= n) {
    return "no CUDA device: PIPESWAP_TEST_DEVICE=" + std::to_string(d) + " but only " + std::to_string(n) +
           " device(s) present";
  }
  return std::nullopt;
}

template <>
struct backend_traits<cuda::backend> {
  static cuda::backend make() { return cuda::backend(cuda_test_device()); }
  static std::optional<std::string> unavailable() { return cuda_unavailable(); }
};

/// Copies `n` bytes from host memory to `d` once every stream of the device is idle.
inline void upload(cuda::backend& b, device_ptr d, void const* src, std::size_t n) {
  if (n == 0) return;
  b.synchronize_device();
  cuda::device_guard const g(b.device());
  PIPESWAP_CUDA_TRY(cudaMemcpy(d.get(), src, n, cudaMemcpyHostToDevice));
}

/// `n` bytes at `d`, read once every stream of the device is idle.
inline std::vector<std::byte> download(cuda::backend& b, device_ptr d, std::size_t n) {
  std::vector<std::byte> out(n);
  if (n == 0) return out;
  b.synchronize_device();
  cuda::device_guard const g(b.device());
  PIPESWAP_CUDA_TRY(cudaMemcpy(out.data(), d.get(), n, cudaMemcpyDeviceToHost));
  return out;
}

} // namespace pipeswap::test
