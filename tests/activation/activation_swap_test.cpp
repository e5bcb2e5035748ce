// The activation swap manager: data survives a round trip, memory leaves and returns, registration is
// scoped, aliases stay, failures clean up (on the mock, hazards recorded and checked), and the
// ownership contract is enforced at the call on every backend (mock, the synchronous user backend,
// the counting backend). Each hazard check fires when one wait site of the transfer engine is
// switched off (activation_swap_hazard_checks_fire, tests/activation/meson.build).
#define BOOST_TEST_MODULE activation_swap
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <boost/mpl/list.hpp>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/mock.hpp>

#include "support/backends.hpp"
#include "support/no_hazards.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using chunk_id = ps::schedule::chunk;

namespace {

mock::options recording() {
  mock::options o{mock::timing_model::unit()};
  o.hazards = mock::hazard_policy::record;
  return o;
}

struct rig {
  mock::backend b{recording()};
  ps::transfer_engine<mock::backend> x{b, {1 << 20, 1 << 18, 512}};
  ps::activation_swap<mock::backend> m{x};

  /// A device buffer of n bytes filled with `v` by a forward kernel on the compute stream, still in
  /// flight when the manager takes it: an offload that skipped its wait on the compute stream
  /// (offload_after_compute) reads it too early, and the hazard checks below see it.
  ps::device_ptr make(std::size_t n, unsigned char v) {
    auto d = b.allocate_device(n, b.current_stream());
    b.launch(b.current_stream(), {"forward", {}, {{d, n}}, std::nullopt}, [d, n, v](mock::kernel_context const& k) {
      for (auto& x : k.write<std::byte>(d, n)) x = std::byte{v};
    });
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
  PIPESWAP_CHECK_NO_HAZARDS(r.b);
  BOOST_TEST(r.m.group_name(c) == "pp_swap_run1_s1_m2");
}

BOOST_AUTO_TEST_CASE(registration_is_scoped_and_restored) {
  rig r;
  r.m.begin_run();
  auto const loose = r.make(8, 1);
  throws_with([&] { (void)r.m.save(loose, 8); }, "activation_swap::save: no forward scope is open");
  r.b.deallocate_device(loose, 8, r.b.current_stream()); // not taken: still the caller's
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
    } catch (std::runtime_error const&) {}
    BOOST_TEST((r.m.current() == f)); // restored by the exception too
  }
  BOOST_TEST(!r.m.current().has_value());
  // OVERLAP_B_F: the backward leaf runs first, in the scope of its own chunk; only the forward leaf's
  // buffers join the forward's group.
  {
    auto scope = r.m.forward(g);
    (void)r.m.save(r.make(64, 2), 64);
  }
  {
    auto scope = r.m.forward(f);
    (void)r.m.save(r.make(128, 3), 128);
  }
  BOOST_TEST(r.m.group_bytes(f) == 128u);
  BOOST_TEST(r.m.group_bytes(g) == 64u);
  r.m.end_run();
  // No copy ran: there is nothing for a hazard check to see here.
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
  // The group's offloaded buffer has no range any more: a new buffer, even at its old address, is
  // another group's to save and protect, and nothing of this group is pinned by it.
  chunk_id const d{3, 1};
  auto const fresh = r.make(256, 0x66);
  BOOST_TEST_MESSAGE("the new buffer " << (fresh == out ? "reuses" : "does not reuse") << " the old address");
  {
    auto scope = r.m.forward(d);
    (void)r.m.save(fresh, 256);
  }
  r.m.protect(d, fresh, 256);
  BOOST_TEST(r.m.kept_bytes(d) == 256u);
  BOOST_TEST(r.m.kept_bytes(c) == 256u); // only the input, as before
  throws_with([&] { r.m.protect(c, fresh, 256); }, "already launched its offload");
  r.m.release(d);
  r.m.launch_load(c);
  r.m.wait_load(c);
  BOOST_TEST(r.holds(r.m.ptr(hout), 256, 0x55));
  r.m.release(c);
  PIPESWAP_CHECK_NO_HAZARDS(r.b);
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
  PIPESWAP_CHECK_NO_HAZARDS(r.b);
}

BOOST_AUTO_TEST_CASE(misuse_is_rejected_and_the_manager_stays_usable) {
  rig r;
  r.m.begin_run();
  chunk_id const c{0, 1};
  throws_with([&] { r.m.launch_offload(c); },
              "activation_swap::launch_offload: group 'pp_swap_run1_s0_m1' does not exist");
  {
    auto scope = r.m.forward(c);
    (void)r.m.save(r.make(64, 9), 64);
  }
  throws_with([&] { r.m.wait_offload(c); },
              "activation_swap::wait_offload: group 'pp_swap_run1_s0_m1' is collecting; call launch_offload() first");
  throws_with([&] { r.m.launch_load(c); }, "call wait_offload() first");
  r.m.launch_offload(c);
  throws_with([&] { r.m.launch_offload(c); }, "launch_offload() is called once");
  throws_with([&] { (void)r.m.forward(c); }, "cannot take saved activations");
  throws_with([&] { r.m.release(c); }, "release() needs it collecting or loaded");
  r.m.wait_offload(c);
  r.m.launch_load(c);
  r.m.wait_load(c);
  r.m.release(c);
  PIPESWAP_CHECK_NO_HAZARDS(r.b);
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
    r.b.fail_after(mock::fault_site::copy, 2);                  // the third D2H fails
    BOOST_CHECK_THROW(r.m.launch_offload(c), mock::mock_error); // a direct engine call: unwrapped
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
    PIPESWAP_CHECK_NO_HAZARDS(r.b);
  }
}

// ----- the ownership contract, on every backend ---------------------------------------------------

namespace {

/// A backend for the contract bodies, with a way to allocate and to say whether it stayed clean.
template <class B>
struct world;

template <>
struct world<mock::backend> {
  mock::backend b{recording()};
  /// The backend whose hazards PIPESWAP_CHECK_NO_HAZARDS checks (a no-op where it has no checker).
  mock::backend const& checked() const { return b; }
  std::size_t live() const { return b.device_bytes_in_use(); }
};
template <>
struct world<ps::test::sync_host_backend> {
  ps::test::sync_host_backend b;
  // No hazard checker: frees of unknown memory throw in the backend itself.
  ps::test::sync_host_backend const& checked() const { return b; }
  std::size_t live() const { return b.device_bytes(); }
};
template <>
struct world<ps::test::counting_backend> {
  mock::backend inner{recording()};
  ps::test::counting_backend b{inner};
  mock::backend const& checked() const { return inner; }
  std::size_t live() const { return inner.device_bytes_in_use(); }
};

using contract_backends = boost::mpl::list<mock::backend, ps::test::sync_host_backend, ps::test::counting_backend>;

template <class B>
struct contract_rig {
  world<B> w;
  ps::transfer_engine<B> x{w.b, {1 << 20, 1 << 18, 512}};
  ps::activation_swap<B> m{x};
  ps::device_ptr make(std::size_t n) { return w.b.allocate_device(n, w.b.current_stream()); }
};

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(double_cross_group_and_sub_range_saves_are_rejected_at_save, B, contract_backends) {
  contract_rig<B> r;
  auto const base = r.w.live();
  r.m.begin_run();
  chunk_id const c{0, 0}, d{0, 1};
  auto const buf = r.make(1024);
  {
    auto scope = r.m.forward(c);
    (void)r.m.save(buf, 1024);
    throws_with([&] { (void)r.m.save(buf, 1024); }, "which the manager already owns; save each buffer once");
    throws_with([&] { (void)r.m.save(buf + 256, 128); }, "overlap activation 0 of group 'pp_swap_run1_s0_m0'");
  }
  {
    auto scope = r.m.forward(d);
    throws_with([&] { (void)r.m.save(buf, 1024); }, "of group 'pp_swap_run1_s0_m0'");
    throws_with([&] { (void)r.m.save(buf + 1000, 100); }, "overlap activation 0");
    auto const other = r.make(512);
    (void)r.m.save(other, 512); // a distinct buffer is fine
  }
  BOOST_TEST(r.m.group_bytes(c) == 1024u); // the rejected saves changed nothing
  BOOST_TEST(r.m.group_bytes(d) == 512u);
  // After a round trip the manager owns the new storage: saving it again is rejected too.
  r.m.launch_offload(c);
  r.m.wait_offload(c);
  r.m.launch_load(c);
  r.m.wait_load(c);
  r.m.release(d);
  r.m.release(c);
  BOOST_TEST(r.w.live() == base); // each buffer freed exactly once
  PIPESWAP_CHECK_NO_HAZARDS(r.w.checked());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_loaded_buffer_cannot_be_saved_again, B, contract_backends) {
  contract_rig<B> r;
  r.m.begin_run();
  chunk_id const c{1, 0}, d{1, 1};
  ps::activation_handle h;
  {
    auto scope = r.m.forward(c);
    h = r.m.save(r.make(256), 256);
  }
  r.m.launch_offload(c);
  r.m.wait_offload(c);
  r.m.launch_load(c);
  r.m.wait_load(c);
  {
    auto scope = r.m.forward(d);
    throws_with([&] { (void)r.m.save(r.m.ptr(h), 256); }, "which the manager already owns");
  }
  r.m.end_run();
  PIPESWAP_CHECK_NO_HAZARDS(r.w.checked());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(save_outside_a_scope_is_an_error_that_keeps_nothing, B, contract_backends) {
  contract_rig<B> r;
  auto const base = r.w.live();
  r.m.begin_run();
  auto const buf = r.make(64);
  throws_with([&] { (void)r.m.save(buf, 64); }, "no forward scope is open");
  BOOST_TEST(r.m.active_groups() == 0u);
  r.w.b.deallocate_device(buf, 64, r.w.b.current_stream()); // still the caller's
  BOOST_TEST(r.w.live() == base);                           // (no copy ran: nothing for a hazard check to see)
}

BOOST_AUTO_TEST_CASE_TEMPLATE(protect_before_or_after_save_keeps_the_buffer, B, contract_backends) {
  contract_rig<B> r;
  r.m.begin_run();
  chunk_id const c{2, 0};
  auto const input = r.make(512), act = r.make(2048), late = r.make(128);
  {
    auto scope = r.m.forward(c);
    (void)r.m.save(input, 512);
    (void)r.m.save(act, 2048);
    r.m.protect(c, input, 512); // after its save
    r.m.protect(c, late, 128);  // before its save
    (void)r.m.save(late, 128);
  }
  BOOST_TEST(r.m.kept_bytes(c) == 640u);
  auto const before = r.w.live();
  r.m.launch_offload(c);
  r.m.wait_offload(c);
  BOOST_TEST(r.w.live() == before - 2048); // only the unprotected activation left the device
  r.m.launch_load(c);
  r.m.wait_load(c);
  r.m.release(c);
  PIPESWAP_CHECK_NO_HAZARDS(r.w.checked());
}
