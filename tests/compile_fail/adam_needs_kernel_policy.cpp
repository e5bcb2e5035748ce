// adam<B> over a user backend for which no Adam kernel policy exists (adam_kernels<B> not
// specialised, none passed) is refused at adam<B> by the concept's name, not deep inside a step.
// The twin passes the host policy every host-addressable backend can use.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/host_adam_kernels.hpp>

struct user_backend {
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
  void deallocate_device(device_pointer p, std::size_t, int) { std::free(p.get()); }
  std::byte* allocate_host(std::size_t n) { return static_cast<std::byte*>(std::malloc(n)); }
  void deallocate_host(std::byte* p, std::size_t) { std::free(p); }
  void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, int) { std::memcpy(d.get(), h, n); }
  void copy_d2h(std::byte* h, device_pointer d, std::size_t n, int) { std::memcpy(h, d.get(), n); }
};

#ifdef PIPESWAP_COMPILING_TWIN
using policy = pipeswap::host_adam_kernels<user_backend>;
#else
using policy = pipeswap::adam_kernels<user_backend>; // never specialised for user_backend
#endif

int main() {
  user_backend b;
  pipeswap::adamw<user_backend, policy> opt(b); // expect: adam_kernel_policy
  return opt.size() == 0 ? 0 : 1;
}
