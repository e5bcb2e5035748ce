// A type with every member a backend needs but no opt-in is not a backend: look-alikes are never
// accepted by accident.
#include <cstddef>
#include <stdexcept>

#include <pipeswap/backend/concepts.hpp>

struct look_alike {
#ifdef PIPESWAP_COMPILING_TWIN
  using backend_concept = pipeswap::backend_tag;
#endif
  using error_type = std::runtime_error;
  using stream_type = int;
  struct event_type {};
  using device_pointer = pipeswap::device_ptr;
  int current_stream() { return 0; }
  int new_stream() { return 1; }
  event_type record_event(int) { return {}; }
  void wait_event(int, event_type const&) {}
  void synchronize(event_type const&) {}
  device_pointer allocate_device(std::size_t, int) { return {}; }
  void deallocate_device(device_pointer, std::size_t, int) {}
  std::byte* allocate_host(std::size_t) { return nullptr; }
  void deallocate_host(std::byte*, std::size_t) {}
  void copy_h2d(device_pointer, std::byte const*, std::size_t, int) {}
  void copy_d2h(std::byte*, device_pointer, std::size_t, int) {}
};

template <pipeswap::backend B>
int use(B& b) {
  b.synchronize(b.record_event(b.current_stream()));
  return 0;
}

int main() {
  look_alike b;
  return use(b); // expect: enable_backend
}
