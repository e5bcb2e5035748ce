// The semantic rules of docs/backend.md, one template body per rule, run on every backend of
// support/backend_list.hpp: the mock and the user-written synchronous backend here, the CUDA
// backend in tests/cuda (same source, built with -DPIPESWAP_TEST_CUDA, skipped without a GPU).
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstring>
#include <optional>
#include <ostream>
#include <sstream>
#include <utility>
#include <vector>

#include <pipeswap/backend/concepts.hpp>

#include "support/backend_list.hpp"
#include "support/no_hazards.hpp"

namespace {

using pipeswap::test::backend_fixture;
using pipeswap::test::backends_under_test;
using pipeswap::test::fill_pattern;
using pipeswap::test::first_mismatch;

/// Pinned bytes filled with pattern `seed` by the host.
template <class B>
std::byte* pinned_pattern(B& b, std::size_t n, std::uint32_t seed) {
  std::byte* p = b.allocate_host(n);
  BOOST_REQUIRE(p != nullptr);
  pipeswap::detail::note_host_write(b, p, n);
  fill_pattern(p, n, seed);
  return p;
}

/// Pinned bytes zeroed by the host.
template <class B>
std::byte* pinned_zero(B& b, std::size_t n) {
  std::byte* p = b.allocate_host(n);
  BOOST_REQUIRE(p != nullptr);
  pipeswap::detail::note_host_write(b, p, n);
  std::memset(p, 0, n);
  return p;
}

/// Index of the first byte of `p` that is not pattern `seed`, after the host announced the read.
template <class B>
std::size_t check_pattern(B& b, std::byte const* p, std::size_t n, std::uint32_t seed) {
  pipeswap::detail::note_host_read(b, p, n);
  return first_mismatch(p, n, seed);
}

} // namespace

using gate = pipeswap::test::skip_unless_available<backends_under_test>;
BOOST_TEST_GLOBAL_FIXTURE(gate);

BOOST_AUTO_TEST_SUITE(backend_rules)

// Ordering across streams: allocate on compute, upload on one stream, download on another, each
// linked by an event; the host reads after synchronizing the last one.
BOOST_AUTO_TEST_CASE_TEMPLATE(round_trip_across_streams, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  std::size_t const n = 4099; // not a multiple of anything
  auto const cs = b.current_stream();
  auto const up = b.new_stream();
  auto const down = b.new_stream();
  std::byte* src = pinned_pattern(b, n, 7);
  std::byte* dst = pinned_zero(b, n);

  auto d = b.allocate_device(n, cs);
  BOOST_REQUIRE(static_cast<bool>(d));
  b.wait_event(up, b.record_event(cs));
  b.copy_h2d(d, src, n, up);
  b.wait_event(down, b.record_event(up));
  b.copy_d2h(dst, d, n, down);
  auto const done = b.record_event(down);
  b.synchronize(done);
  BOOST_TEST(check_pattern(b, dst, n, 7) == n);

  b.wait_event(cs, done);
  b.deallocate_device(d, n, cs);
  b.deallocate_host(src, n);
  b.deallocate_host(dst, n);
}

// An upload and a download on two streams at the same time each move the right bytes.
BOOST_AUTO_TEST_CASE_TEMPLATE(opposite_directions_on_two_streams, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  std::size_t const n = 1 << 16;
  auto const cs = b.current_stream();
  auto const up = b.new_stream();
  auto const down = b.new_stream();
  std::byte* a_src = pinned_pattern(b, n, 1);
  std::byte* b_src = pinned_pattern(b, n, 2);
  std::byte* a_back = pinned_zero(b, n);
  std::byte* b_back = pinned_zero(b, n);
  auto da = b.allocate_device(n, cs);
  auto db = b.allocate_device(n, cs);
  b.copy_h2d(db, b_src, n, cs); // db holds pattern 2 before the overlapping phase
  auto const ready = b.record_event(cs);

  b.wait_event(up, ready);
  b.wait_event(down, ready);
  b.copy_h2d(da, a_src, n, up);    // H2D ...
  b.copy_d2h(b_back, db, n, down); // ... while D2H
  auto const up_done = b.record_event(up);
  auto const down_done = b.record_event(down);
  b.synchronize(down_done);
  BOOST_TEST(check_pattern(b, b_back, n, 2) == n);

  b.wait_event(down, up_done);
  b.copy_d2h(a_back, da, n, down);
  auto const all = b.record_event(down);
  b.synchronize(all);
  BOOST_TEST(check_pattern(b, a_back, n, 1) == n);

  b.wait_event(cs, all);
  b.deallocate_device(da, n, cs);
  b.deallocate_device(db, n, cs);
  for (std::byte* p : {a_src, b_src, a_back, b_back}) b.deallocate_host(p, n);
}

// Events are values: a copy names the same point and stays waitable after the original is gone.
BOOST_AUTO_TEST_CASE_TEMPLATE(event_copies_outlive_the_original, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  std::size_t const n = 8191;
  auto const cs = b.current_stream();
  auto const up = b.new_stream();
  auto const down = b.new_stream();
  std::byte* src = pinned_pattern(b, n, 3);
  std::byte* dst = pinned_zero(b, n);
  auto d = b.allocate_device(n, cs);
  b.wait_event(up, b.record_event(cs));
  b.copy_h2d(d, src, n, up);

  std::optional<pipeswap::event_t<B>> original = b.record_event(up);
  pipeswap::event_t<B> copy = *original;
  pipeswap::event_t<B> assigned = b.record_event(cs);
  assigned = *original;
  original.reset();
  for (int i = 0; i < 8; ++i) (void)b.record_event(up); // unrelated points, recorded and dropped

  b.wait_event(down, copy);
  b.copy_d2h(dst, d, n, down);
  b.synchronize(assigned);
  auto const done = b.record_event(down);
  b.synchronize(done);
  BOOST_TEST(check_pattern(b, dst, n, 3) == n);

  b.wait_event(cs, done);
  b.deallocate_device(d, n, cs);
  b.deallocate_host(src, n);
  b.deallocate_host(dst, n);
}

// A stream-ordered release is ordered behind the work enqueued before it on its stream, and the
// memory can be allocated again on that stream at once, or on another stream after an event.
BOOST_AUTO_TEST_CASE_TEMPLATE(stream_ordered_release_and_reuse, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  std::size_t const n = 1 << 15;
  auto const cs = b.current_stream();
  auto const other = b.new_stream();
  std::byte* p1 = pinned_pattern(b, n, 11);
  std::byte* p2 = pinned_pattern(b, n, 12);
  std::byte* p3 = pinned_pattern(b, n, 13);
  std::byte* back1 = pinned_zero(b, n);
  std::byte* back2 = pinned_zero(b, n);
  std::byte* back3 = pinned_zero(b, n);

  auto d1 = b.allocate_device(n, cs);
  b.copy_h2d(d1, p1, n, cs);
  b.copy_d2h(back1, d1, n, cs);
  b.deallocate_device(d1, n, cs); // behind the D2H on the same stream
  auto d2 = b.allocate_device(n, cs);
  b.copy_h2d(d2, p2, n, cs);
  b.copy_d2h(back2, d2, n, cs);
  b.deallocate_device(d2, n, cs);
  auto const released = b.record_event(cs);

  b.wait_event(other, released);
  auto d3 = b.allocate_device(n, other);
  b.copy_h2d(d3, p3, n, other);
  b.copy_d2h(back3, d3, n, other);
  b.deallocate_device(d3, n, other);
  auto const done = b.record_event(other);
  b.synchronize(done);

  BOOST_TEST(check_pattern(b, back1, n, 11) == n);
  BOOST_TEST(check_pattern(b, back2, n, 12) == n);
  BOOST_TEST(check_pattern(b, back3, n, 13) == n);
  for (std::byte* p : {p1, p2, p3, back1, back2, back3}) b.deallocate_host(p, n);
}

// Pinned memory is exactly the size asked for: every byte of odd sizes is usable and round-trips.
BOOST_AUTO_TEST_CASE_TEMPLATE(pinned_memory_is_exact, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  auto const cs = b.current_stream();
  std::uint32_t seed = 100;
  for (std::size_t const n : {1UL, 3UL, 7UL, 16UL, 99UL, 1000UL, 4097UL, 65537UL}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      std::byte* src = pinned_pattern(b, n, ++seed);
      std::byte* dst = pinned_zero(b, n);
      auto d = b.allocate_device(n, cs);
      b.copy_h2d(d, src, n, cs);
      b.copy_d2h(dst, d, n, cs);
      b.deallocate_device(d, n, cs);
      b.synchronize(b.record_event(cs));
      BOOST_TEST(check_pattern(b, dst, n, seed) == n);
      b.deallocate_host(src, n);
      b.deallocate_host(dst, n);
    }
  }
}

// Zero sizes: allocations of 0 may be null, releasing null is a no-op, copies of 0 bytes are no-ops
// whatever the pointers.
BOOST_AUTO_TEST_CASE_TEMPLATE(zero_sizes_are_no_ops, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  auto const cs = b.current_stream();
  using dptr = pipeswap::device_pointer_t<B>;
  auto d = b.allocate_device(0, cs);
  b.deallocate_device(d, 0, cs);
  b.deallocate_device(dptr{}, 0, cs);
  std::byte* h = b.allocate_host(0);
  b.deallocate_host(h, 0);
  b.deallocate_host(nullptr, 0);
  b.copy_h2d(dptr{}, nullptr, 0, cs);
  b.copy_d2h(nullptr, dptr{}, 0, cs);
  b.synchronize(b.record_event(cs));
}

// Streams: new streams are distinct from the current stream and from each other; handles are
// values.
BOOST_AUTO_TEST_CASE_TEMPLATE(new_streams_are_distinct, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  auto const cs = b.current_stream();
  auto const s1 = b.new_stream();
  auto const s2 = b.new_stream();
  BOOST_TEST((s1 != cs));
  BOOST_TEST((s2 != cs));
  BOOST_TEST((s1 != s2));
  auto copy = s1;
  BOOST_TEST((copy == s1));
  BOOST_TEST((b.current_stream() == cs));
}

// Many points recorded, waited and dropped in a loop (the shape of a swap loop) keep working.
BOOST_AUTO_TEST_CASE_TEMPLATE(events_in_a_loop, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  auto const cs = b.current_stream();
  auto const s = b.new_stream();
  std::size_t const n = 512;
  std::byte* src = pinned_pattern(b, n, 21);
  std::byte* dst = pinned_zero(b, n);
  auto d = b.allocate_device(n, cs);
  b.wait_event(s, b.record_event(cs));
  for (int i = 0; i < 200; ++i) {
    b.copy_h2d(d, src, n, s);
    auto const e = b.record_event(s);
    b.wait_event(cs, e);
    b.wait_event(s, b.record_event(cs));
  }
  b.copy_d2h(dst, d, n, s);
  auto const done = b.record_event(s);
  b.synchronize(done);
  BOOST_TEST(check_pattern(b, dst, n, 21) == n);
  b.wait_event(cs, done);
  b.deallocate_device(d, n, cs);
  b.deallocate_host(src, n);
  b.deallocate_host(dst, n);
}

// Optional capabilities, when present, do what the runtimes rely on: a label names the work
// enqueued next, and synchronize_device() makes every stream's copies visible
// to the host without an event.
BOOST_AUTO_TEST_CASE_TEMPLATE(optional_capabilities, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  // Recorded, so that the hazard check at the end can fail.
  if constexpr (requires { b.set_hazard_policy(pipeswap::mock::hazard_policy::record); }) {
    b.set_hazard_policy(pipeswap::mock::hazard_policy::record);
  }
  std::size_t const n = 512;
  auto* src = pinned_pattern(b, n, 5);
  auto* dst = b.allocate_host(n);
  auto cs = b.current_stream();
  auto s = b.new_stream();
  auto d = b.allocate_device(n, cs);
  b.wait_event(s, b.record_event(cs));
  if constexpr (pipeswap::labelled_backend<B>) b.set_label("prefetch batch 1");
  b.copy_h2d(d, src, n, s);
  if constexpr (pipeswap::labelled_backend<B>) b.set_label("");
  b.copy_d2h(dst, d, n, s);
  if constexpr (pipeswap::device_synchronizing<B>) {
    b.synchronize_device(); // no event: the device-wide wait alone orders the host read
  } else {
    b.synchronize(b.record_event(s));
  }
  BOOST_TEST(check_pattern(b, dst, n, 5) == n);
  if constexpr (requires { b.write_chrome_trace(std::declval<std::ostream&>()); }) {
    std::ostringstream os;
    b.write_chrome_trace(os);
    auto const t = os.str();
    BOOST_TEST(t.find("prefetch batch 1") != std::string::npos); // the labelled copy
  }
  if constexpr (requires { b.hazards(); }) PIPESWAP_CHECK_NO_HAZARDS(b);
  b.wait_event(cs, b.record_event(s));
  b.deallocate_device(d, n, cs);
  b.deallocate_host(src, n);
  b.deallocate_host(dst, n);
}

BOOST_AUTO_TEST_SUITE_END() // backend_rules
