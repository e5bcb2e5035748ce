// Fault injection and Chrome trace export of the mock backend.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/backend/mock.hpp>
#include "support/no_hazards.hpp"

namespace mock = pipeswap::mock;

namespace {

/// A small program with copies both ways, a kernel and stream-ordered memory; returns the trace.
std::string run_program(mock::backend& b) {
  auto cs = b.current_stream();
  auto cp = b.new_stream("copy");
  auto* h = b.allocate_host(4096);
  std::memset(h, 3, 4096);
  auto d = b.allocate_device(4096, cs);
  b.wait_event(cp, b.record_event(cs));
  b.set_label("prefetch \"a\"");
  b.copy_h2d(d, h, 4096, cp);
  b.set_label("");
  b.wait_event(cs, b.record_event(cp));
  b.launch(cs, {"scale", {}, {{d, 4096}}, 700}, [d](mock::kernel_context const& k) {
    for (auto& v : k.write<unsigned char>(d, 4096)) v = static_cast<unsigned char>(v * 2);
  });
  b.wait_event(cp, b.record_event(cs));
  b.copy_d2h(h, d, 4096, cp);
  auto done = b.record_event(cp);
  b.wait_event(cs, done);
  b.deallocate_device(d, 4096, cs);
  b.synchronize(done);
  b.note_host_read(h, 4096);
  b.deallocate_host(h, 4096);
  std::ostringstream os;
  b.write_chrome_trace(os);
  return os.str();
}

} // namespace

BOOST_AUTO_TEST_SUITE(mock_faults_trace)

BOOST_AUTO_TEST_CASE(injected_copy_fault_throws_and_leaves_the_backend_usable) {
  mock::backend b;
  auto s = b.current_stream();
  auto* h = b.allocate_host(100);
  std::memset(h, 9, 100);
  auto d = b.allocate_device(100, s);
  b.fail_after(mock::fault_site::copy, 1);
  b.copy_h2d(d, h, 50, s); // copy #0 succeeds
  auto const ops = b.ops().size();
  auto const t = b.makespan();
  try {
    b.copy_h2d(d + 50, h + 50, 50, s); // copy #1 fails
    BOOST_ERROR("no injected fault");
  } catch (mock::mock_error const& e) {
    BOOST_TEST(std::string(e.what()).find("injected fault in copy_h2d (copy #1") != std::string::npos, e.what());
  }
  BOOST_TEST(b.ops().size() == ops);
  BOOST_TEST(b.makespan() == t);
  BOOST_TEST(b.bytes_copied_h2d() == 50u);
  // Once only: the retry succeeds and the data is right.
  b.copy_h2d(d + 50, h + 50, 50, s);
  auto bytes = b.read_device(d, 100);
  BOOST_TEST(static_cast<int>(bytes[99]) == 9);
  BOOST_TEST(b.attempts(mock::fault_site::copy) == 3u);
  b.deallocate_device(d, 100, s);
  b.deallocate_host(h, 100);
}

BOOST_AUTO_TEST_CASE(injected_allocation_and_kernel_faults) {
  mock::backend b;
  auto s = b.current_stream();
  b.fail_after(mock::fault_site::allocation, 0);
  BOOST_CHECK_THROW((void)b.allocate_device(64, s), mock::mock_error);
  BOOST_TEST(b.device_bytes_in_use() == 0u);
  BOOST_TEST(b.live_device_allocations() == 0u);
  auto d = b.allocate_device(64, s);
  b.fail_after(mock::fault_site::allocation, 0);
  BOOST_CHECK_THROW((void)b.allocate_host(64), mock::mock_error);
  BOOST_TEST(b.host_bytes_in_use() == 0u);
  bool ran = false;
  b.fail_after(mock::fault_site::kernel, 0);
  BOOST_CHECK_THROW(b.launch(s, {"k", {}, {{d, 64}}, 1}, [&](mock::kernel_context const&) { ran = true; }),
                    mock::mock_error);
  b.synchronize_device();
  BOOST_TEST(!ran);
  b.launch(s, {"k", {}, {{d, 64}}, 1}, [&](mock::kernel_context const&) { ran = true; });
  b.synchronize_device();
  BOOST_TEST(ran);
  b.clear_faults();
  b.deallocate_device(d, 64, s);
}

BOOST_AUTO_TEST_CASE(traces_are_byte_identical_across_runs) {
  // Hazards recorded, not raised: the program's own ordering is checked by hazards() below.
  mock::options rec;
  rec.hazards = mock::hazard_policy::record;
  mock::backend a{rec};
  auto const first = run_program(a);
  // Disturb the host heap between runs: no host address may leak into the trace.
  std::vector<std::vector<char>> junk;
  for (int i = 0; i < 100; ++i) junk.emplace_back(static_cast<std::size_t>(i * 37 + 1));
  mock::backend b{rec};
  auto const second = run_program(b);
  BOOST_TEST(first == second);
  PIPESWAP_CHECK_NO_HAZARDS(a);
  PIPESWAP_CHECK_NO_HAZARDS(b);
  BOOST_TEST(first.find("prefetch") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(without_the_op_log_the_times_and_bytes_are_the_same) {
  // keep_op_log off, hazards ignored (as the planner's candidates run; the program writes its
  // pinned bytes, so they are held): operations are counted, not recorded, and every time, byte
  // count and peak is the logged run's.
  mock::options on;
  on.hazards = mock::hazard_policy::ignore;
  auto off = on;
  off.keep_op_log = false;
  mock::backend a{on}, b{off};
  auto const ta = run_program(a);
  auto const tb = run_program(b);
  BOOST_TEST(!a.ops().empty());
  BOOST_TEST(b.ops().empty());
  BOOST_TEST(a.makespan() == b.makespan());
  BOOST_TEST(a.now() == b.now());
  BOOST_TEST(a.peak_device_bytes() == b.peak_device_bytes());
  BOOST_TEST(a.bytes_copied_h2d() == b.bytes_copied_h2d());
  BOOST_TEST(a.bytes_copied_d2h() == b.bytes_copied_d2h());
  BOOST_TEST(a.device_memory_timeline() == b.device_memory_timeline());
  // The trace keeps its lanes and the memory counters, and no operation.
  auto const j = nlohmann::json::parse(tb);
  std::size_t slices = 0, counters = 0;
  for (auto const& e : j.at("traceEvents")) {
    if (e.at("ph") == "X" || e.at("ph") == "i") ++slices;
    if (e.at("ph") == "C") ++counters;
  }
  BOOST_TEST(slices == 0u);
  BOOST_TEST(counters == 2u);
  // A bad pointer is still named.
  auto const s = b.current_stream();
  BOOST_CHECK_THROW(b.launch(s, {"stray", {{pipeswap::device_ptr(std::uintptr_t{1} << 20), 64}}, {}, 10}),
                    mock::mock_error);
}

BOOST_AUTO_TEST_CASE(trace_is_valid_chrome_json_with_a_lane_per_stream_and_engine) {
  mock::backend b;
  auto const text = run_program(b);
  auto const j = nlohmann::json::parse(text);
  auto const& ev = j.at("traceEvents");
  std::set<std::string> lanes;
  std::size_t slices = 0, counters = 0;
  bool escaped_label = false;
  for (auto const& e : ev) {
    auto const ph = e.at("ph").get<std::string>();
    if (ph == "M" && e.at("name") == "thread_name") lanes.insert(e.at("args").at("name"));
    if (ph == "X") {
      ++slices;
      BOOST_TEST(e.at("dur").get<double>() > 0.0);
      if (e.at("name").get<std::string>().find("prefetch \"a\"") != std::string::npos) escaped_label = true;
    }
    if (ph == "C") ++counters;
  }
  for (auto const* lane :
       {"host", "stream 0 (compute)", "copy", "H2D copy engine", "D2H copy engine", "compute engine"}) {
    BOOST_TEST(lanes.count(lane) == 1u, lane);
  }
  // H2D, kernel and D2H on their stream lanes plus once more on their engine lanes, and the host's
  // synchronize (which waited 4096 + 700 + 4096 ns).
  BOOST_TEST(slices == 7u);
  BOOST_TEST(counters == 2u); // one allocation, one release
  BOOST_TEST(escaped_label);
  // The D2H slice ends where the whole program ends.
  double end = 0;
  for (auto const& e : ev) {
    if (e.at("ph") == "X") end = std::max(end, e.at("ts").get<double>() + e.at("dur").get<double>());
  }
  BOOST_TEST(end == (4096 + 700 + 4096) / 1000.0, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(the_program_computes_the_right_bytes) {
  // The same program with every wait, then with the kernel's wait for the H2D dropped: hazards are
  // recorded (not raised), so hazards() is silent on the first and names the race in the second.
  for (bool wait : {true, false}) {
    mock::options rec;
    rec.hazards = mock::hazard_policy::record;
    mock::backend b{rec};
    auto cs = b.current_stream();
    auto cp = b.new_stream();
    auto* h = b.allocate_host(16);
    std::memset(h, 3, 16);
    auto d = b.allocate_device(16, cs);
    b.wait_event(cp, b.record_event(cs));
    b.copy_h2d(d, h, 16, cp);
    if (wait) b.wait_event(cs, b.record_event(cp));
    b.launch(cs, {"scale", {}, {{d, 16}}, 7}, [d](mock::kernel_context const& k) {
      for (auto& v : k.write<unsigned char>(d, 16)) v = static_cast<unsigned char>(v * 2);
    });
    b.wait_event(cp, b.record_event(cs));
    b.copy_d2h(h, d, 16, cp);
    b.synchronize(b.record_event(cp));
    b.note_host_read(h, 16);
    if (wait) {
      BOOST_TEST(static_cast<int>(h[15]) == 6);
      PIPESWAP_CHECK_NO_HAZARDS(b);
    } else {
      BOOST_TEST_REQUIRE(!b.hazards().empty());
      BOOST_TEST(b.hazards().front().message.find("scale") != std::string::npos, b.hazards().front().message);
    }
    b.wait_event(cs, b.record_event(cp));
    b.deallocate_device(d, 16, cs);
    b.deallocate_host(h, 16);
  }
}

BOOST_AUTO_TEST_SUITE_END() // mock_faults_trace
