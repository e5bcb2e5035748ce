// Test support for the torch backend (pipeswap::torch::backend): its backend_traits on the CPU and
// on CUDA. Only for executables built against torch (python/meson.build, -Dtorch_backend_tests=true,
// which scripts/test_python.sh turns on).
//
//   torch_cpu_backend    the backend on the CPU: synchronous, runs anywhere
//   torch_cuda_backend   the backend on CUDA device 0 (PIPESWAP_TEST_DEVICE picks another);
//                        unavailable without the CUDA path or a device
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include <pipeswap/backend/torch.hpp>

#include "support/backend_fixture.hpp"

namespace pipeswap::test {

struct torch_cpu_backend : pipeswap::torch::backend {
  torch_cpu_backend() : backend(c10::Device(c10::kCPU)) {}
};

struct torch_cuda_backend : pipeswap::torch::backend {
  static int ordinal() {
    char const* d = std::getenv("PIPESWAP_TEST_DEVICE");
    return d != nullptr && *d != '\0' ? std::atoi(d) : 0;
  }
  torch_cuda_backend() : backend(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(ordinal()))) {}
};

template <>
struct backend_traits<torch_cuda_backend> {
  static torch_cuda_backend make() { return torch_cuda_backend(); }
  static std::optional<std::string> unavailable() {
#if PIPESWAP_TORCH_CUDA
    auto const n = static_cast<int>(c10::cuda::device_count());
    if (n == 0) return std::string("no CUDA device: torch sees 0 devices");
    if (torch_cuda_backend::ordinal() >= n) return std::string("no CUDA device: PIPESWAP_TEST_DEVICE is out of range");
    return std::nullopt;
#else
    return std::string("the torch backend was compiled without its CUDA path");
#endif
  }
};

} // namespace pipeswap::test
