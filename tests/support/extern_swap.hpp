// A user's backend and its Adam policy, with the swap runtime over it declared extern
// (<pipeswap/swap/instantiate.hpp>): what an engine's shared header would hold. The test TU that
// includes it compiles no member of optimizer_swap<adamw<B>>, transfer_engine<B>, pinned_pool<B>,
// optimizer_state<B>, state_view<B>, adam<B> or adamw<B>; swap/extern_swap_instantiate.cpp defines
// them once (PIPESWAP_INSTANTIATE_*), and the program does not link without it.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/host_adam_kernels.hpp>
#include <pipeswap/swap/instantiate.hpp>

namespace pipeswap::test {

/// Device memory is host memory; every call completes at once.
struct extern_backend {
  using backend_concept = pipeswap::backend_tag;
  using error_type = std::runtime_error;
  using stream_type = int;
  struct event_type {};
  using device_pointer = pipeswap::device_ptr;

  int current_stream() { return 0; }
  int new_stream() { return 1; }
  event_type record_event(int) { return {}; }
  void wait_event(int, event_type const&) {}
  void synchronize(event_type const&) {}
  device_pointer allocate_device(std::size_t n, int) { return device_pointer(std::malloc(n ? n : 1)); }
  void deallocate_device(device_pointer d, std::size_t, int) { std::free(d.get()); }
  std::byte* allocate_host(std::size_t n) { return static_cast<std::byte*>(std::malloc(n ? n : 1)); }
  void deallocate_host(std::byte* h, std::size_t) { std::free(h); }
  void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, int) { std::memcpy(d.get(), h, n); }
  void copy_d2h(std::byte* h, device_pointer d, std::size_t n, int) { std::memcpy(h, d.get(), n); }
};

} // namespace pipeswap::test

template <>
struct pipeswap::adam_kernels<pipeswap::test::extern_backend>
    : pipeswap::host_adam_kernels<pipeswap::test::extern_backend> {};

PIPESWAP_EXTERN_ADAM(pipeswap::test::extern_backend);
PIPESWAP_EXTERN_OPTIMIZER_SWAP(pipeswap::adamw<pipeswap::test::extern_backend>);
