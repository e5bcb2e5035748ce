// Uses the library the way an embedding engine would: include, instantiate over a backend, run. Built
// three ways against this checkout: as a Meson subproject (build.sh), and against an installed tree
// through CMake's find_package and through pkg-config (installed.sh).
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/pipeswap.hpp>
#include <pipeswap/schedule/json.hpp>

#include <cstdio>
#include <thread>

int main() {
  pipeswap::mock::backend b;
  auto s = b.current_stream();
  auto d = b.allocate_device(1024, s);
  b.deallocate_device(d, 1024, s);
  // JSON (nlohmann-json) and a thread: the dependencies the package must carry.
  auto const order = pipeswap::schedule::order_from_json_text(R"([{"type": "FWD", "stage": 0, "micro": 0}])");
  std::size_t steps = 0;
  std::thread([&] { steps = order.size(); }).join();
  std::printf("consumer: peak %zu bytes, %zu step\n", b.peak_device_bytes(), steps);
  return b.peak_device_bytes() == 1024 && steps == 1 ? 0 : 1;
}
