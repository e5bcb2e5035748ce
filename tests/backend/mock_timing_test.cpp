// The mock backend's timing model: exact simulated times, copy-engine rules, memory accounting and
// data effects applied in simulated-time order.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include <pipeswap/backend/mock.hpp>

namespace mock = pipeswap::mock;
using mock::sim_time;

namespace {

struct fixture {
  mock::backend b{mock::options{mock::timing_model::unit()}};
  mock::stream cs = b.current_stream();
  mock::stream s1 = b.new_stream("s1");
  mock::stream s2 = b.new_stream("s2");

  sim_time done(mock::stream s) { return b.record_event(s).time; }
};

} // namespace

BOOST_AUTO_TEST_SUITE(mock_timing)

BOOST_AUTO_TEST_CASE(link_durations_are_exact) {
  mock::link_model const pcie{55'000'000'000, 2'000};
  BOOST_TEST(pcie.duration(0) == 0);
  BOOST_TEST(pcie.duration(55'000) == 2'000 + 1'000);
  BOOST_TEST(pcie.duration(55'001) == 2'000 + 1'001); // rounds up
  // 1 TB at 55 GB/s: no overflow in the 128-bit product.
  BOOST_TEST(pcie.duration(1'000'000'000'000) == 2'000 + 18'181'818'182);
  BOOST_TEST(mock::timing_model::unit().kernel_duration(4096) == 4096);
}

BOOST_FIXTURE_TEST_CASE(same_direction_copies_serialize_across_streams, fixture) {
  auto* h = b.allocate_host(3000);
  auto d = b.allocate_device(3000, cs);
  auto ready = b.record_event(cs);
  b.wait_event(s1, ready);
  b.wait_event(s2, ready);
  b.copy_h2d(d, h, 1000, s1);
  b.copy_h2d(d + 1000, h + 1000, 2000, s2);
  BOOST_TEST(done(s1) == 1000);
  BOOST_TEST(done(s2) == 3000); // waits for the H2D engine, not for s1
  b.copy_d2h(h, d, 500, s1);
  b.copy_d2h(h + 1000, d + 1000, 500, s2);
  BOOST_TEST(done(s1) == 1500);
  BOOST_TEST(done(s2) == 3500); // D2H engine free at 1500, s2 busy until 3000
  b.synchronize_device();
  b.deallocate_device(d, 3000, cs);
  b.deallocate_host(h, 3000);
}

BOOST_FIXTURE_TEST_CASE(opposite_directions_overlap, fixture) {
  auto* h = b.allocate_host(2000);
  auto d = b.allocate_device(2000, cs);
  auto ready = b.record_event(cs);
  b.wait_event(s1, ready);
  b.wait_event(s2, ready);
  b.copy_h2d(d, h, 1000, s1);
  b.copy_d2h(h + 1000, d + 1000, 1000, s2);
  BOOST_TEST(done(s1) == 1000);
  BOOST_TEST(done(s2) == 1000);
  BOOST_TEST(b.makespan() == 1000);
  b.synchronize_device();
  b.deallocate_device(d, 2000, cs);
  b.deallocate_host(h, 2000);
}

namespace {

/// A unit-timing mock with `duplex_factor` f and two copy streams that start together.
struct duplex_world {
  mock::backend b;
  mock::stream cs = b.current_stream();
  mock::stream s1 = b.new_stream("s1");
  mock::stream s2 = b.new_stream("s2");
  std::byte* h = b.allocate_host(4000);
  pipeswap::device_ptr d = b.allocate_device(4000, cs);

  static mock::options with(double f) {
    auto t = mock::timing_model::unit();
    t.duplex_factor = f;
    return mock::options{t};
  }
  explicit duplex_world(double f) : b(with(f)) {
    auto ready = b.record_event(cs);
    b.wait_event(s1, ready);
    b.wait_event(s2, ready);
  }
  ~duplex_world() {
    b.synchronize_device();
    b.deallocate_device(d, 4000, cs);
    b.deallocate_host(h, 4000);
  }
  sim_time done(mock::stream s) { return b.record_event(s).time; }
};

} // namespace

// duplex_factor 0.75: the two directions together move at most 1.5 of their full rates. A copy
// alone runs at its full rate; one planned beside a copy already planned the other way gets 0.5 of
// its rate while they overlap, and its full rate after.
BOOST_AUTO_TEST_CASE(duplex_factor_shares_the_link_while_both_directions_copy) {
  duplex_world w(0.75);
  w.b.copy_h2d(w.d, w.h, 1000, w.s1);               // alone when planned: [0, 1000) at rate 1
  w.b.copy_d2h(w.h + 1000, w.d + 1000, 1000, w.s2); // 500 bytes by 1000 at rate 0.5, 500 more alone
  BOOST_TEST(w.done(w.s1) == 1000);
  BOOST_TEST(w.done(w.s2) == 1500);
  // Queued behind the first H2D on its engine: from 1000 it meets the D2H's full-rate [1000, 1500)
  // (rate 0.5: 250 bytes), then runs alone (750 bytes): ends at 2250.
  w.b.copy_h2d(w.d + 2000, w.h + 2000, 1000, w.s1);
  BOOST_TEST(w.done(w.s1) == 2250);
  // A copy that meets nothing the other way takes link_model::duration exactly.
  w.b.wait_event(w.s2, w.b.record_event(w.s1));
  w.b.copy_d2h(w.h + 3000, w.d + 3000, 1000, w.s2);
  BOOST_TEST(w.done(w.s2) == 3250);
}

BOOST_AUTO_TEST_CASE(duplex_factor_one_half_shares_one_rate) {
  duplex_world w(0.5);
  w.b.copy_h2d(w.d, w.h, 1000, w.s1);
  w.b.copy_d2h(w.h + 1000, w.d + 1000, 1000, w.s2); // nothing left while the H2D runs: moves from 1000
  BOOST_TEST(w.done(w.s1) == 1000);
  BOOST_TEST(w.done(w.s2) == 2000);
}

// The shared-link arithmetic over a sweep: with a copy of n bytes planned alone and a copy of m
// bytes planned the other way at the same instant, the second ends when the bytes both moved equal
// what the link carries, min(n, m·) at the shared rate 2f - 1 and the rest alone.
BOOST_AUTO_TEST_CASE(shared_copy_end_conserves_the_link_capacity) {
  mock::link_model const unit{1'000'000'000, 0};
  for (double f : {0.5, 0.6, 0.7, 0.75, 0.9}) {
    for (std::size_t n : {1u, 100u, 1000u, 4096u}) {
      for (std::size_t m : {1u, 100u, 1000u, 5000u}) {
        mock::detail::rate_timeline first;
        std::vector<mock::detail::rate_timeline::segment> mine;
        auto const e1 = mock::detail::shared_copy_end(unit, f, 0, n, mock::detail::rate_timeline{}, mine);
        BOOST_TEST(e1 == static_cast<sim_time>(n));
        first.append(mine);
        auto const e2 = mock::detail::shared_copy_end(unit, f, 0, m, first, mine);
        double const shared = 2 * f - 1;
        double const during = shared * static_cast<double>(n); // bytes moved while the first runs
        double const expect = static_cast<double>(m) <= during
                                  ? static_cast<double>(m) / shared
                                  : static_cast<double>(n) + (static_cast<double>(m) - during);
        BOOST_TEST(static_cast<double>(e2) >= expect - 1e-6);
        BOOST_TEST(static_cast<double>(e2) <= expect + 1);
        double moved = 0;
        for (auto const& seg : mine) moved += static_cast<double>(seg.end - seg.begin) * seg.share;
        BOOST_TEST(moved >= static_cast<double>(m) - 1e-6);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(latency_adds_per_copy) {
  auto t = mock::timing_model::unit();
  t.h2d.latency_ns = 7;
  mock::backend b{mock::options{t}};
  auto s = b.current_stream();
  auto* h = b.allocate_host(100);
  auto d = b.allocate_device(100, s);
  b.copy_h2d(d, h, 50, s);
  b.copy_h2d(d + 50, h + 50, 50, s);
  BOOST_TEST(b.record_event(s).time == 2 * (7 + 50));
  b.synchronize_device();
  b.deallocate_device(d, 100, s);
  b.deallocate_host(h, 100);
}

BOOST_FIXTURE_TEST_CASE(kernel_overlaps_copy_on_another_stream, fixture) {
  auto* h = b.allocate_host(1000);
  auto d = b.allocate_device(2000, cs);
  b.wait_event(s1, b.record_event(cs));
  b.copy_h2d(d, h, 1000, s1);
  b.launch(cs, {"k", {}, {{d + 1000, 1000}}, 400});
  BOOST_TEST(done(cs) == 400);
  BOOST_TEST(done(s1) == 1000);
  // A kernel that depends on the copy starts when it ends.
  b.wait_event(cs, b.record_event(s1));
  b.launch(cs, {"k2", {{d, 1000}}, {}, 100});
  BOOST_TEST(done(cs) == 1100);
  auto const& log = b.ops();
  BOOST_TEST(log[log.size() - 2].start == 1000); // the k2 kernel op (before the record)
  b.synchronize_device();
  b.deallocate_device(d, 2000, cs);
  b.deallocate_host(h, 1000);
}

BOOST_FIXTURE_TEST_CASE(kernels_share_one_compute_engine_unless_concurrent, fixture) {
  auto d = b.allocate_device(16, cs);
  b.wait_event(s1, b.record_event(cs));
  b.launch(cs, {"a", {}, {{d, 8}}, 300});
  b.launch(s1, {"b", {}, {{d + 8, 8}}, 300});
  BOOST_TEST(done(s1) == 600);

  auto t = mock::timing_model::unit();
  t.concurrent_kernels = true;
  mock::backend c{mock::options{t}};
  auto cs2 = c.current_stream();
  auto o = c.new_stream();
  auto d2 = c.allocate_device(16, cs2);
  c.wait_event(o, c.record_event(cs2));
  c.launch(cs2, {"a", {}, {{d2, 8}}, 300});
  c.launch(o, {"b", {}, {{d2 + 8, 8}}, 300});
  BOOST_TEST(c.record_event(o).time == 300);
  c.synchronize_device();
  c.deallocate_device(d2, 16, cs2);
  b.synchronize_device();
  b.deallocate_device(d, 16, cs);
}

BOOST_FIXTURE_TEST_CASE(host_synchronize_moves_the_host_clock, fixture) {
  auto* h = b.allocate_host(1000);
  auto d = b.allocate_device(1000, cs);
  b.wait_event(s1, b.record_event(cs));
  b.copy_h2d(d, h, 1000, s1);
  BOOST_TEST(b.now() == 0); // enqueueing does not block
  b.synchronize(b.record_event(s1));
  BOOST_TEST(b.now() == 1000);
  // Work enqueued now cannot start before the host issued it.
  b.launch(cs, {"late", {}, {{d, 10}}, 5});
  BOOST_TEST(done(cs) == 1005);
  b.host_compute(500);
  BOOST_TEST(b.now() == 1500);
  b.synchronize_device();
  b.deallocate_device(d, 1000, cs);
  b.deallocate_host(h, 1000);
}

BOOST_FIXTURE_TEST_CASE(peak_memory_matches_a_hand_computation, fixture) {
  // compute: X(1000) at 0, kernel [0,300), release X at 300, Z(700) at 300, kernel [300,400),
  //          release Z at 400.
  // s1:      Y(500) at 0, H2D [0,500), release Y at 500.
  // Live bytes: [0,300) 1500; at 300 X leaves and Z arrives: 1200; at 400: 500; at 500: 0.
  auto* h = b.allocate_host(500);
  auto x = b.allocate_device(1000, cs);
  b.launch(cs, {"kx", {}, {{x, 1000}}, 300});
  b.deallocate_device(x, 1000, cs);
  auto y = b.allocate_device(500, s1);
  b.copy_h2d(y, h, 500, s1);
  b.deallocate_device(y, 500, s1);
  auto z = b.allocate_device(700, cs);
  b.launch(cs, {"kz", {}, {{z, 700}}, 100});
  b.deallocate_device(z, 700, cs);

  BOOST_TEST(b.peak_device_bytes() == 1500u);
  std::vector<std::pair<sim_time, std::size_t>> const expected{{0, 1500}, {300, 1200}, {400, 500}, {500, 0}};
  BOOST_TEST((b.device_memory_timeline() == expected));
  BOOST_TEST(b.device_bytes_in_use() == 0u);
  // From a simulated time on, the most live at once: every release is enqueued (none is in use), but
  // Z lives until 400 and Y until 500 on the device.
  for (auto const& [t, want] : std::vector<std::pair<sim_time, std::size_t>>{
           {0, 1500}, {299, 1500}, {300, 1200}, {350, 1200}, {400, 500}, {499, 500}, {500, 0}, {10'000, 0}})
    BOOST_TEST(b.device_bytes_live_from(t) == want, "from " << t);
  BOOST_TEST(b.live_device_allocations() == 0u);
  BOOST_TEST(b.peak_host_bytes() == 500u);
  b.synchronize_device();
  b.deallocate_host(h, 500);
  BOOST_TEST(b.host_bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(device_capacity_is_enforced_at_simulated_time) {
  mock::options o;
  o.device_capacity = 1000;
  mock::backend b{o};
  auto s = b.current_stream();
  auto a = b.allocate_device(600, s);
  BOOST_CHECK_THROW((void)b.allocate_device(600, s), mock::mock_error);
  b.deallocate_device(a, 600, s);
  auto c = b.allocate_device(1000, s); // fits after the release
  b.deallocate_device(c, 1000, s);
}

BOOST_FIXTURE_TEST_CASE(data_moves_in_simulated_time_order, fixture) {
  // A correct round trip: host → device → kernel (+1 on every byte) → host.
  auto* h = b.allocate_host(64);
  for (int i = 0; i < 64; ++i) h[i] = std::byte(i);
  auto d = b.allocate_device(64, cs);
  b.wait_event(s1, b.record_event(cs));
  b.copy_h2d(d, h, 64, s1);
  b.wait_event(cs, b.record_event(s1));
  b.launch(cs, {"inc", {}, {{d, 64}}, 10}, [d](mock::kernel_context const& k) {
    for (auto& v : k.write<unsigned char>(d, 64)) ++v;
  });
  b.wait_event(s1, b.record_event(cs));
  b.copy_d2h(h, d, 64, s1);
  auto done_ev = b.record_event(s1);
  // Before the host synchronizes, the bytes have not arrived (simulated time has not passed).
  BOOST_TEST(static_cast<int>(h[3]) == 3);
  b.synchronize(done_ev);
  b.note_host_read(h, 64);
  for (int i = 0; i < 64; ++i) BOOST_TEST(static_cast<int>(h[i]) == i + 1);
  auto bytes = b.read_device(d, 64);
  BOOST_TEST(static_cast<int>(bytes[10]) == 11);
  b.deallocate_device(d, 64, cs);
  b.deallocate_host(h, 64);
  BOOST_TEST(b.bytes_copied_h2d() == 64u);
  BOOST_TEST(b.bytes_copied_d2h() == 64u);
}

BOOST_AUTO_TEST_CASE(invalid_calls_are_rejected_with_what_is_wrong) {
  mock::backend b;
  auto s = b.current_stream();
  auto d = b.allocate_device(100, s);
  auto* h = b.allocate_host(100);
  std::vector<std::byte> pageable(100);
  auto throws_with = [](auto f, std::string const& text) {
    try {
      f();
    } catch (mock::mock_error const& e) {
      BOOST_TEST(std::string(e.what()).find(text) != std::string::npos, e.what());
      return;
    }
    BOOST_ERROR("no mock_error for: " + text);
  };
  throws_with([&] { b.copy_h2d(d, pageable.data(), 10, s); }, "not pinned memory");
  throws_with([&] { b.copy_h2d(d + 50, h, 60, s); }, "bytes [50, 110) exceed device allocation");
  throws_with([&] { b.copy_d2h(h, pipeswap::device_ptr(std::uintptr_t{8}), 10, s); }, "is not device memory");
  throws_with([&] { b.deallocate_device(d, 99, s); }, "does not name a whole allocation");
  throws_with([&] { b.wait_event(s, mock::event{}); }, "never recorded");
  throws_with([&] { b.launch(mock::stream{42}, {"k", {}, {}, 1}); }, "unknown stream 42");
  throws_with(
      [&] {
        b.launch(s, {"sneaky", {{d, 10}}, {}, 1},
                 [d](mock::kernel_context const& k) { (void)k.read<std::byte>(d + 20, 4); });
        b.synchronize_device();
      },
      "outside the regions its launch declared");
  // Nothing was lost: the backend still works.
  b.copy_h2d(d, h, 100, s);
  b.synchronize_device();
  b.deallocate_device(d, 100, s);
  b.deallocate_host(h, 100);
  BOOST_TEST(b.live_device_allocations() == 0u);
}

BOOST_AUTO_TEST_CASE(timing_only_runs_hold_no_bytes) {
  mock::options o;
  o.materialize = false;
  o.timing = mock::timing_model::h200_pcie();
  mock::backend b{o};
  auto s = b.current_stream();
  auto c = b.new_stream();
  std::size_t const huge = std::size_t{200} << 30; // 200 GiB: more than this machine has
  auto d = b.allocate_device(huge, s);
  auto* h = b.allocate_host(huge);
  b.wait_event(c, b.record_event(s));
  b.copy_d2h(h, d, huge, c);
  auto e = b.record_event(c);
  BOOST_TEST(e.time == mock::timing_model::h200_pcie().d2h.duration(huge));
  b.synchronize(e);
  b.deallocate_device(d, huge, s);
  b.deallocate_host(h, huge);
  BOOST_TEST(b.peak_device_bytes() == huge);
}

BOOST_FIXTURE_TEST_CASE(wait_until_models_input_from_another_device, fixture) {
  auto d = b.allocate_device(16, cs);
  b.wait_until(cs, 2500, "recv from rank 0");
  b.launch(cs, {"after recv", {}, {{d, 16}}, 100});
  BOOST_TEST(done(cs) == 2600);
  b.wait_until(cs, 10); // the past changes nothing
  b.launch(cs, {"next", {}, {{d, 16}}, 100});
  BOOST_TEST(done(cs) == 2700);
  BOOST_TEST(b.holds_bytes());
  mock::options o;
  o.materialize = false;
  BOOST_TEST(!mock::backend{o}.holds_bytes());
  b.synchronize_device();
  b.deallocate_device(d, 16, cs);
}

BOOST_AUTO_TEST_SUITE_END() // mock_timing
