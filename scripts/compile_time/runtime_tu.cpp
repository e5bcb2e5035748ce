// The runtime translation unit of scripts/compile_times.py: what an engine that swaps AdamW over its
// own backend compiles. A synchronous host backend, its Adam kernel policy, optimizer_swap over
// adamw, one step. Built with -DRUNTIME_TU_EXTERN it declares the runtime's classes extern
// (PIPESWAP_EXTERN_OPTIMIZER_SWAP, PIPESWAP_EXTERN_ADAM), as an engine's other TUs would; with
// -DRUNTIME_TU_INSTANTIATE it is the one TU that instantiates them (no main).
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#if defined(RUNTIME_TU_EXTERN) || defined(RUNTIME_TU_INSTANTIATE)
#  include <pipeswap/swap/instantiate.hpp>
#endif

struct host_backend {
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
  device_pointer allocate_device(std::size_t n, int) { return device_pointer(std::malloc(n)); }
  void deallocate_device(device_pointer d, std::size_t, int) { std::free(d.get()); }
  std::byte* allocate_host(std::size_t n) { return static_cast<std::byte*>(std::malloc(n)); }
  void deallocate_host(std::byte* h, std::size_t) { std::free(h); }
  void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, int) { std::memcpy(d.get(), h, n); }
  void copy_d2h(std::byte* h, device_pointer d, std::size_t n, int) { std::memcpy(h, d.get(), n); }
};

// The library's host policy: the backend's device pointers are host-addressable and synchronous.
template <>
struct pipeswap::adam_kernels<host_backend> : pipeswap::host_adam_kernels<host_backend> {};

#if defined(RUNTIME_TU_EXTERN)
PIPESWAP_EXTERN_ADAM(host_backend);
PIPESWAP_EXTERN_OPTIMIZER_SWAP(pipeswap::adamw<host_backend>);
#endif

#if defined(RUNTIME_TU_INSTANTIATE)
PIPESWAP_INSTANTIATE_ADAM(host_backend);
PIPESWAP_INSTANTIATE_OPTIMIZER_SWAP(pipeswap::adamw<host_backend>);
#else
int main() {
  host_backend b;
  pipeswap::transfer_engine<host_backend> x(b);
  pipeswap::adamw<host_backend> opt(b);
  auto p = b.allocate_device(64 * sizeof(float), 0);
  auto g = b.allocate_device(64 * sizeof(float), 0);
  std::memset(p.get(), 0, 64 * sizeof(float));
  std::memset(g.get(), 0, 64 * sizeof(float));
  opt.add_param({p, g, 64, pipeswap::dtype::f32, pipeswap::dtype::f32, false});
  {
    pipeswap::optimizer_swap<pipeswap::adamw<host_backend>> rt(x, opt, pipeswap::swap_config{});
    rt.step();
  }
  b.deallocate_device(g, 64 * sizeof(float), 0);
  b.deallocate_device(p, 64 * sizeof(float), 0);
}
#endif
