// The activation swap manager on the mock backend (hazard checker raising): data survives a round
// trip, memory leaves and returns, registration is scoped, aliases stay, failures clean up.
#define BOOST_TEST_MODULE activation_swap
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/mock.hpp>

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::chunk_id;

namespace {

struct rig {
  mock::backend b{mock::options{mock::timing_model::unit()}};
  ps::transfer_engine<mock::backend> x{b, {1 << 20, 1 << 18, 512}};
  ps::activation_swap<mock::backend> m{x};

  /// A device buffer of n bytes filled with `v`, as a forward kernel would leave it.
  ps::device_ptr make(std::size_t n, unsigned char v) {
    auto d = b.allocate_device(n, b.current_stream());
    std::vector<std::byte> bytes(n, std::byte{v});
    b.write_device(d, bytes);
    return d;
  }
  bool holds(ps::device_ptr d, std::size_t n, unsigned char v) {
    auto bytes = b.read_device(d, n);
    for (auto x : bytes) {
      if (x != std::byte{v}) return false;
    }
    return true;
  }
};

template <class F>
void throws_with(F f, std::string const& text) {
  try {
    f();
  } catch (ps::error const& e) {
    BOOST_TEST(std::string(e.what()).find(text) != std::string::npos, e.what());
    return;
  }
  BOOST_ERROR("nothing thrown; expected: " + text);
}

} // namespace

BOOST_AUTO_TEST_CASE(round_trip_frees_memory_and_restores_bytes) {
  rig r;
  r.m.begin_run();
  chunk_id const c{1, 2};
  std::vector<ps::activation_handle> h;
  auto const base = r.b.device_bytes_in_use();
  {
    auto scope = r.m.forward(c);
    h.push_back(r.m.save(r.make(1000, 0x11), 1000));
    h.push_back(r.m.save(r.make(3000, 0x22), 3000));
    h.push_back(r.m.save(r.make(500, 0x33), 500));
  }
  BOOST_TEST(r.b.device_bytes_in_use() == base + 4500);
  r.m.launch_offload(c);
  r.m.wait_offload(c);
  BOOST_TEST(r.b.device_bytes_in_use() == base); // gone from the device, stream-ordered
  BOOST_TEST(r.m.offloaded_bytes() == 4500u);
  BOOST_CHECK_THROW((void)r.m.ptr(h[0]), ps::state_error);
  r.m.launch_load(c);
  r.m.wait_load(c);
  BOOST_TEST(r.b.device_bytes_in_use() == base + 4500);
  BOOST_TEST(r.holds(r.m.ptr(h[0]), 1000, 0x11));
  BOOST_TEST(r.holds(r.m.ptr(h[1]), 3000, 0x22));
  BOOST_TEST(r.holds(r.m.ptr(h[2]), 500, 0x33));
  r.m.release(c);
  BOOST_TEST(r.b.device_bytes_in_use() == base);
  BOOST_TEST(r.m.active_groups() == 0u);
  BOOST_TEST(r.b.hazards().empty());
  BOOST_TEST(r.m.group_name(c) == "pp_swap_run1_s1_m2");
}

BOOST_AUTO_TEST_CASE(registration_is_scoped_and_restored) {
  rig r;
  r.m.begin_run();
  BOOST_TEST(!r.m.save(r.make(8, 1), 8).swapped); // no scope: not managed
  chunk_id const f{0, 7}, g{0, 8};
  {
    auto outer = r.m.forward(f);
    {
      auto inner = r.m.forward(g);
      BOOST_TEST((r.m.current() == g));
    }
    BOOST_TEST((r.m.current() == f));
    try {
      auto inner = r.m.forward(g);
      throw std::runtime_error("forward failed");
    } catch (std::runtime_error const&) {
    }
    BOOST_TEST((r.m.current() == f)); // restored by the exception too
  }
  BOOST_TEST(!r.m.current().has_value());
  // OVERLAP_B_F: the backward leaf runs first, outside the forward's scope; only the forward leaf's
  // buffers join the forward's group.
  auto const bwd_saved = r.m.save(r.make(64, 2), 64);
  {
    auto scope = r.m.forward(f);
    (void)r.m.save(r.make(128, 3), 128);
  }
  BOOST_TEST(!bwd_saved.swapped);
  BOOST_TEST(r.m.group_bytes(f) == 128u);
  r.m.end_run();
}

BOOST_AUTO_TEST_CASE(protected_aliases_stay_on_the_device) {
  rig r;
  r.m.begin_run();
  chunk_id const c{3, 0};
  auto const in = r.make(256, 0x44);
  auto const out = r.make(256, 0x55);
  ps::activation_handle hin, hout;
  {
    auto scope = r.m.forward(c);
    hin = r.m.save(in, 256);
    hout = r.m.save(out, 256);
  }
  r.m.protect(c, in + 16, 8); // any overlap pins the buffer
  BOOST_TEST(r.m.kept_bytes(c) == 256u);
  r.m.launch_offload(c);
  r.m.wait_offload(c);
  BOOST_TEST(r.holds(in, 256, 0x44)); // still there, same address
  BOOST_TEST((r.m.ptr(hin) == in));
  // A released buffer has no range: protecting "nothing" after the offload pins nothing.
  r.m.protect(c, ps::device_ptr{}, 0);
  r.m.launch_load(c);
  r.m.wait_load(c);
  BOOST_TEST(r.holds(r.m.ptr(hout), 256, 0x55));
  r.m.release(c);
  BOOST_TEST(r.b.hazards().empty());
}

BOOST_AUTO_TEST_CASE(runs_never_reuse_names_and_clean_up) {
  rig r;
  auto const base = r.b.device_bytes_in_use();
  r.m.begin_run();
  chunk_id const c{0, 0};
  {
    auto scope = r.m.forward(c);
    (void)r.m.save(r.make(100, 1), 100);
  }
  r.m.launch_offload(c);
  auto const first = r.m.group_name(c);
  r.m.begin_run(); // the previous run's group (mid-offload) is settled and released
  BOOST_TEST(r.m.group_name(c) != first);
  BOOST_TEST(!r.m.has_group(c));
  BOOST_TEST(r.b.device_bytes_in_use() == base);
  BOOST_TEST(r.x.pool().stats().used_bytes == 0u);
  BOOST_TEST(r.b.hazards().empty());
}

BOOST_AUTO_TEST_CASE(misuse_is_rejected_and_the_manager_stays_usable) {
  rig r;
  r.m.begin_run();
  chunk_id const c{0, 1};
  throws_with([&] { r.m.launch_offload(c); }, "Group pp_swap_run1_s0_m1 does not exist.");
  {
    auto scope = r.m.forward(c);
    (void)r.m.save(r.make(64, 9), 64);
  }
  throws_with([&] { r.m.wait_offload(c); },
              "SwapGroup 'pp_swap_run1_s0_m1' wait_offload() called before launch_offload().");
  throws_with([&] { r.m.launch_load(c); }, "launch_load() called before wait_offload()");
  r.m.launch_offload(c);
  throws_with([&] { r.m.launch_offload(c); }, "launch_offload() called twice");
  throws_with([&] { (void)r.m.forward(c); }, "cannot take saved activations");
  throws_with([&] { r.m.release(c); }, "release() needs it collecting or loaded");
  r.m.wait_offload(c);
  r.m.launch_load(c);
  r.m.wait_load(c);
  r.m.release(c);
  BOOST_TEST(r.b.hazards().empty());
}

BOOST_AUTO_TEST_CASE(a_failed_offload_can_be_retried_or_aborted) {
  for (bool retry : {true, false}) {
    rig r;
    r.m.begin_run();
    chunk_id const c{0, 0};
    auto const base = r.b.device_bytes_in_use();
    std::vector<ps::activation_handle> h;
    {
      auto scope = r.m.forward(c);
      for (unsigned char v = 1; v <= 4; ++v) h.push_back(r.m.save(r.make(100, v), 100));
    }
    r.b.fail_after(mock::fault_site::copy, 2); // the third D2H fails
    BOOST_CHECK_THROW(r.m.launch_offload(c), mock::mock_error);
    if (retry) {
      r.m.launch_offload(c); // continues with the buffers still on the device
      r.m.wait_offload(c);
      r.m.launch_load(c);
      r.m.wait_load(c);
      for (unsigned char v = 1; v <= 4; ++v) BOOST_TEST(r.holds(r.m.ptr(h[v - 1u]), 100, v));
      r.m.release(c);
    } else {
      r.m.abort(c);
    }
    BOOST_TEST(r.b.device_bytes_in_use() == base);
    BOOST_TEST(r.x.pool().stats().used_bytes == 0u);
    BOOST_TEST(r.b.hazards().empty());
  }
}
