// Test support for the CUDA backend: its backend_traits (made on device 0, or PIPESWAP_TEST_DEVICE;
// unavailable without a driver or a device) and the reason string a skipped executable prints.
// Only for executables that link libcudart (tests/cuda/).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

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
    return "no CUDA device: cudaGetDeviceCount returned error " +
           std::to_string(static_cast<int>(s)) + " (" + cudaGetErrorName(s) + ": " +
           cudaGetErrorString(s) + ")";
  }
  if (n == 0) return std::string("no CUDA device: cudaGetDeviceCount found 0 devices");
  if (int const d = cuda_test_device(); d < 0 || d >= n) {
    return "no CUDA device: PIPESWAP_TEST_DEVICE=" + std::to_string(d) + " but only " +
           std::to_string(n) + " device(s) present";
  }
  return std::nullopt;
}

template <>
struct backend_traits<cuda::backend> {
  static cuda::backend make() { return cuda::backend(cuda_test_device()); }
  static std::optional<std::string> unavailable() { return cuda_unavailable(); }
};

} // namespace pipeswap::test
