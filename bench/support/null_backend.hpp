// A backend whose every operation is free: it measures what the runtimes themselves cost on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/optim/adam.hpp>

// Every operation is an opaque call: `noinline` alone lets the compiler see that an empty function
// has no effect and drop the call, and then a loop "issuing" those calls issues almost none of them.
#if defined(__clang__)
#  define PIPESWAP_BENCH_OPAQUE __attribute__((noinline, optnone))
#else
#  define PIPESWAP_BENCH_OPAQUE __attribute__((noipa))
#endif

namespace pipeswap::bench {

class null_backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = std::runtime_error;
  using stream_type = int;
  struct event_type {};
  using device_pointer = pipeswap::device_ptr;

  PIPESWAP_BENCH_OPAQUE int current_stream() { return 0; }
  PIPESWAP_BENCH_OPAQUE int new_stream() { return ++streams_; }
  PIPESWAP_BENCH_OPAQUE event_type record_event(int) { return {}; }
  PIPESWAP_BENCH_OPAQUE void wait_event(int, event_type const&) {}
  PIPESWAP_BENCH_OPAQUE void synchronize(event_type const&) {}
  PIPESWAP_BENCH_OPAQUE device_pointer allocate_device(std::size_t n, int) { return device_pointer(next(n)); }
  PIPESWAP_BENCH_OPAQUE void deallocate_device(device_pointer, std::size_t, int) {}
  PIPESWAP_BENCH_OPAQUE std::byte* allocate_host(std::size_t n) { return reinterpret_cast<std::byte*>(next(n)); }
  PIPESWAP_BENCH_OPAQUE void deallocate_host(std::byte*, std::size_t) {}
  PIPESWAP_BENCH_OPAQUE void copy_h2d(device_pointer, std::byte const*, std::size_t, int) {}
  PIPESWAP_BENCH_OPAQUE void copy_d2h(std::byte*, device_pointer, std::size_t, int) {}
  /// Host memory is addresses only: the runtimes must not touch it.
  [[nodiscard]] bool holds_bytes() const noexcept { return false; }

private:
  std::uintptr_t next(std::size_t n) {
    auto const a = address_;
    address_ += (n + 511) / 512 * 512 + 512;
    return a;
  }
  std::uintptr_t address_ = std::uintptr_t{1} << 40;
  int streams_ = 0;
};

/// Adam kernels that enqueue nothing.
struct null_adam_kernels {
  void update(null_backend&, int, std::span<adam_tensor<null_backend> const>,
              std::span<adam_step_scalars const>) const {}
  void init_master(null_backend&, int, device_ptr, device_ptr, std::size_t, dtype) const {}
};

static_assert(pipeswap::backend<null_backend>);

} // namespace pipeswap::bench
