// Device addresses do not convert to host pointers: host code cannot dereference device memory by
// accident.
#include <cstddef>

#include <pipeswap/backend/device_ptr.hpp>

int main() {
  pipeswap::device_ptr d(std::uintptr_t{4096});
#ifdef PIPESWAP_COMPILING_TWIN
  std::byte* p = d.get<std::byte>();
#else
  std::byte* p = d; // expect: cannot convert
#endif
  return p == nullptr;
}
