// Uses the library the way an embedding engine would: include, instantiate over a backend, run.
#include <pipeswap/pipeswap.hpp>

#include <cstdio>

int main() {
  pipeswap::mock::backend b;
  auto s = b.current_stream();
  auto d = b.allocate_device(1024, s);
  b.deallocate_device(d, 1024, s);
  std::printf("consumer: peak %zu bytes\n", b.peak_device_bytes());
  return b.peak_device_bytes() == 1024 ? 0 : 1;
}
