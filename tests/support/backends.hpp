// Test fakes shared by every test: a minimal archetype that models the Backend concept and nothing
// more, a user-written synchronous host backend, and a counting wrapper around the mock.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/mock.hpp>

namespace pipeswap::test {

/// The smallest type that models pipeswap::backend: every required expression, nothing else. Its
/// members are declared, not defined; it exists to be checked at compile time.
struct archetype_backend {
  using backend_concept = pipeswap::backend_tag;
  using error_type = std::runtime_error;
  struct stream_type {
    friend bool operator==(stream_type, stream_type) = default;
  };
  struct event_type {};
  using device_pointer = pipeswap::device_ptr;

  stream_type current_stream();
  stream_type new_stream();
  event_type record_event(stream_type);
  void wait_event(stream_type, event_type const&);
  void synchronize(event_type const&);
  device_pointer allocate_device(std::size_t, stream_type);
  void deallocate_device(device_pointer, std::size_t, stream_type);
  std::byte* allocate_host(std::size_t);
  void deallocate_host(std::byte*, std::size_t);
  void copy_h2d(device_pointer, std::byte const*, std::size_t, stream_type);
  void copy_d2h(std::byte*, device_pointer, std::size_t, stream_type);
};

/// A backend a user could write in an afternoon: "device" memory is host memory, every call completes
/// before it returns, so streams and events are trivial. It is correct (work is trivially ordered),
/// which makes it a second oracle next to the mock: results over it must equal results over the mock.
class sync_host_backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = std::runtime_error;
  using stream_type = int;
  struct event_type {};
  using device_pointer = pipeswap::device_ptr;

  sync_host_backend() = default;
  sync_host_backend(sync_host_backend const&) = delete;
  sync_host_backend& operator=(sync_host_backend const&) = delete;
  ~sync_host_backend() {
    for (auto& [p, n] : live_) std::free(reinterpret_cast<void*>(p));
  }

  int current_stream() { return 0; }
  int new_stream() { return ++streams_; }
  event_type record_event(int) { return {}; }
  void wait_event(int, event_type const&) {}
  void synchronize(event_type const&) {}

  device_pointer allocate_device(std::size_t n, int) {
    if (n == 0) return {};
    auto* p = std::malloc(n);
    if (p == nullptr) throw std::runtime_error("sync_host_backend: out of memory");
    live_[reinterpret_cast<std::uintptr_t>(p)] = n;
    device_bytes_ += n;
    return device_pointer(p);
  }
  void deallocate_device(device_pointer d, std::size_t n, int) {
    if (!d) return;
    release(d.address(), n);
    device_bytes_ -= n;
  }
  std::byte* allocate_host(std::size_t n) {
    if (n == 0) return nullptr;
    auto* p = static_cast<std::byte*>(std::malloc(n));
    if (p == nullptr) throw std::runtime_error("sync_host_backend: out of memory");
    live_[reinterpret_cast<std::uintptr_t>(p)] = n;
    return p;
  }
  void deallocate_host(std::byte* h, std::size_t n) {
    if (h != nullptr) release(reinterpret_cast<std::uintptr_t>(h), n);
  }
  void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, int) {
    if (n) std::memcpy(d.get(), h, n);
  }
  void copy_d2h(std::byte* h, device_pointer d, std::size_t n, int) {
    if (n) std::memcpy(h, d.get(), n);
  }

  [[nodiscard]] std::size_t device_bytes() const noexcept { return device_bytes_; }
  [[nodiscard]] std::size_t live_allocations() const noexcept { return live_.size(); }

private:
  void release(std::uintptr_t p, std::size_t n) {
    auto it = live_.find(p);
    if (it == live_.end() || it->second != n) {
      throw std::runtime_error("sync_host_backend: release of " + std::to_string(n) +
                               " bytes does not match an allocation");
    }
    std::free(reinterpret_cast<void*>(p));
    live_.erase(it);
  }
  std::map<std::uintptr_t, std::size_t> live_;
  std::size_t device_bytes_ = 0;
  int streams_ = 0;
};

/// Forwards to a mock backend and counts calls by name; for tests that pin how many copies,
/// allocations and waits a runtime issues.
class counting_backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = mock::mock_error;
  using stream_type = mock::stream;
  using event_type = mock::event;
  using device_pointer = pipeswap::device_ptr;

  explicit counting_backend(mock::backend& inner) : inner_(inner) {}

  stream_type current_stream() { return count("current_stream"), inner_.current_stream(); }
  stream_type new_stream() { return count("new_stream"), inner_.new_stream(); }
  event_type record_event(stream_type s) { return count("record_event"), inner_.record_event(s); }
  void wait_event(stream_type s, event_type const& e) { count("wait_event"), inner_.wait_event(s, e); }
  void synchronize(event_type const& e) { count("synchronize"), inner_.synchronize(e); }
  device_pointer allocate_device(std::size_t n, stream_type s) {
    return count("allocate_device"), inner_.allocate_device(n, s);
  }
  void deallocate_device(device_pointer d, std::size_t n, stream_type s) {
    count("deallocate_device"), inner_.deallocate_device(d, n, s);
  }
  std::byte* allocate_host(std::size_t n) { return count("allocate_host"), inner_.allocate_host(n); }
  void deallocate_host(std::byte* h, std::size_t n) { count("deallocate_host"), inner_.deallocate_host(h, n); }
  void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, stream_type s) {
    count("copy_h2d"), inner_.copy_h2d(d, h, n, s);
  }
  void copy_d2h(std::byte* h, device_pointer d, std::size_t n, stream_type s) {
    count("copy_d2h"), inner_.copy_d2h(h, d, n, s);
  }

  [[nodiscard]] std::size_t calls(std::string const& name) const {
    auto it = calls_.find(name);
    return it == calls_.end() ? 0 : it->second;
  }
  mock::backend& inner() noexcept { return inner_; }

private:
  void count(char const* name) { ++calls_[name]; }
  mock::backend& inner_;
  std::map<std::string, std::size_t> calls_;
};

static_assert(pipeswap::backend<archetype_backend>);
static_assert(pipeswap::backend<sync_host_backend>);
static_assert(pipeswap::backend<counting_backend>);

} // namespace pipeswap::test
