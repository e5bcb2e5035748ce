// Drives the mock backend through a double-buffered prefetch → update → offload loop over eight
// blocks of state, checks the result, and writes the timeline as a Chrome trace (open it in
// https://ui.perfetto.dev).
//
//   mock_trace [trace.json]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include <pipeswap/backend/mock.hpp>

namespace mock = pipeswap::mock;

int main(int argc, char** argv) {
  char const* path = argc > 1 ? argv[1] : "mock_trace.json";
  mock::backend b{mock::options{mock::timing_model::h200_pcie()}};
  auto compute = b.current_stream();
  auto h2d = b.new_stream("h2d copies");
  auto d2h = b.new_stream("d2h copies");

  constexpr std::size_t blocks = 8, bytes = std::size_t{64} << 20; // 8 × 64 MiB of state
  std::vector<std::byte*> host(blocks);
  for (std::size_t i = 0; i < blocks; ++i) {
    host[i] = b.allocate_host(bytes);
    std::memset(host[i], static_cast<int>(i), bytes);
  }
  std::vector<pipeswap::device_ptr> dev(blocks);
  std::vector<mock::event> loaded(blocks), offloaded(blocks);

  auto prefetch = [&](std::size_t i) {
    dev[i] = b.allocate_device(bytes, compute);
    b.wait_event(h2d, b.record_event(compute));
    b.set_label("prefetch " + std::to_string(i));
    b.copy_h2d(dev[i], host[i], bytes, h2d);
    loaded[i] = b.record_event(h2d);
  };
  prefetch(0);
  for (std::size_t i = 0; i < blocks; ++i) {
    b.wait_event(compute, loaded[i]);
    if (i > 0) { // release the previous block behind its offload, before the next prefetch grows
      b.wait_event(compute, offloaded[i - 1]);
      b.deallocate_device(dev[i - 1], bytes, compute);
    }
    if (i + 1 < blocks) prefetch(i + 1);
    b.set_label("update " + std::to_string(i));
    b.launch(compute, {"update " + std::to_string(i), {}, {{dev[i], bytes}}, std::nullopt},
             [d = dev[i]](mock::kernel_context const& k) {
               for (auto& v : k.write<unsigned char>(d, bytes)) v = static_cast<unsigned char>(v + 1);
             });
    b.wait_event(d2h, b.record_event(compute));
    b.set_label("offload " + std::to_string(i));
    b.copy_d2h(host[i], dev[i], bytes, d2h);
    offloaded[i] = b.record_event(d2h);
  }
  b.wait_event(compute, offloaded[blocks - 1]);
  b.deallocate_device(dev[blocks - 1], bytes, compute);
  b.synchronize_device();

  bool ok = b.hazards().empty();
  for (std::size_t i = 0; i < blocks; ++i) {
    b.note_host_read(host[i], bytes);
    ok = ok && static_cast<unsigned char>(host[i][bytes - 1]) == i + 1;
    b.deallocate_host(host[i], bytes);
  }
  std::ofstream(path) << [&] {
    std::ostringstream os;
    b.write_chrome_trace(os);
    return os.str();
  }();
  double const ms = static_cast<double>(b.makespan()) / 1e6;
  double const ideal = static_cast<double>(blocks * bytes) / 55e9 * 1e3;
  std::printf("%zu blocks of %zu MiB: simulated %.3f ms (one-way link bound %.3f ms), peak device "
              "%zu MiB of %zu MiB total state, data %s, trace %s\n",
              blocks, bytes >> 20, ms, ideal, b.peak_device_bytes() >> 20, (blocks * bytes) >> 20,
              ok ? "correct" : "WRONG", path);
  return ok ? 0 : 1;
}
