// A backend whose every operation is free: it measures what the runtimes themselves cost on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/optim/adam.hpp>

namespace pipeswap::bench {

class null_backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = std::runtime_error;
  using stream_type = int;
  struct event_type {};
  using device_pointer = pipeswap::device_ptr;

  [[gnu::noinline]] int current_stream() { return 0; }
  [[gnu::noinline]] int new_stream() { return ++streams_; }
  [[gnu::noinline]] event_type record_event(int) { return {}; }
  [[gnu::noinline]] void wait_event(int, event_type const&) {}
  [[gnu::noinline]] void synchronize(event_type const&) {}
  [[gnu::noinline]] device_pointer allocate_device(std::size_t n, int) { return device_pointer(next(n)); }
  [[gnu::noinline]] void deallocate_device(device_pointer, std::size_t, int) {}
  [[gnu::noinline]] std::byte* allocate_host(std::size_t n) { return reinterpret_cast<std::byte*>(next(n)); }
  [[gnu::noinline]] void deallocate_host(std::byte*, std::size_t) {}
  [[gnu::noinline]] void copy_h2d(device_pointer, std::byte const*, std::size_t, int) {}
  [[gnu::noinline]] void copy_d2h(std::byte*, device_pointer, std::size_t, int) {}
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
