// The hazard checker: every kind fires on a broken pattern (and the broken pattern really corrupts
// data when allowed to run), and stays silent on the corrected twin.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>

#include <pipeswap/backend/mock.hpp>

namespace mock = pipeswap::mock;
using mock::hazard_kind;

namespace {

/// Two streams, a 256-byte device buffer and a 256-byte pinned buffer. `fixed` selects the correct
/// twin of each pattern.
struct rig {
  explicit rig(mock::hazard_policy p = mock::hazard_policy::record) {
    mock::options o;
    o.hazards = p;
    b.emplace(o);
    cs = b->current_stream();
    cp = b->new_stream("copy");
    h = b->allocate_host(n);
    d = b->allocate_device(n, cs);
    b->wait_event(cp, b->record_event(cs));
  }
  ~rig() {
    b->set_hazard_policy(mock::hazard_policy::ignore);
    b->synchronize_device();
    if (d_live) b->deallocate_device(d, n, cs);
    b->deallocate_host(h, n);
  }
  void fill_host(unsigned char v) { std::memset(h, v, n); }
  void fill_device(unsigned char v) {
    std::vector<std::byte> bytes(n, std::byte{v});
    b->write_device(d, bytes);
  }
  [[nodiscard]] std::vector<hazard_kind> kinds() const {
    std::vector<hazard_kind> k;
    for (auto const& x : b->hazards()) k.push_back(x.kind);
    return k;
  }

  static constexpr std::size_t n = 256;
  std::optional<mock::backend> b;
  mock::stream cs, cp;
  std::byte* h = nullptr;
  pipeswap::device_ptr d;
  bool d_live = true;
};

/// H2D on the copy stream, then a kernel on the compute stream that copies the buffer into `out`.
void prefetch_then_use(rig& r, pipeswap::device_ptr out, bool fixed) {
  r.b->copy_h2d(r.d, r.h, rig::n, r.cp);
  if (fixed) r.b->wait_event(r.cs, r.b->record_event(r.cp));
  r.b->launch(r.cs, {"use", {{r.d, rig::n}}, {{out, rig::n}}, 10}, [d = r.d, out](mock::kernel_context const& k) {
    auto in = k.read<std::byte>(d, rig::n);
    auto o = k.write<std::byte>(out, rig::n);
    std::copy(in.begin(), in.end(), o.begin());
  });
}

} // namespace

BOOST_AUTO_TEST_SUITE(mock_hazards)

BOOST_AUTO_TEST_CASE(read_before_write_fires_and_reads_stale_bytes) {
  for (bool fixed : {false, true}) {
    rig r;
    auto out = r.b->allocate_device(rig::n, r.cs);
    r.fill_device(0x11);
    r.fill_host(0x22);
    prefetch_then_use(r, out, fixed);
    auto bytes = r.b->read_device(out, rig::n);
    if (fixed) {
      BOOST_TEST(r.b->hazards().empty());
      BOOST_TEST(static_cast<int>(bytes[0]) == 0x22);
    } else {
      BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
      BOOST_TEST((r.kinds()[0] == hazard_kind::read_before_write));
      BOOST_TEST(static_cast<int>(bytes[0]) == 0x11); // the kernel saw the old bytes
      auto const& hz = r.b->hazards()[0];
      BOOST_TEST(r.b->ops()[hz.op].kind == mock::op_kind::kernel);
      BOOST_TEST(r.b->ops()[hz.conflicting_op].kind == mock::op_kind::h2d);
      BOOST_TEST(hz.message.find("on copy") != std::string::npos, hz.message);
      BOOST_TEST(hz.message.find("op trace") != std::string::npos);
      BOOST_TEST(hz.message.find("<-- offending operation") != std::string::npos);
    }
    r.b->set_hazard_policy(mock::hazard_policy::ignore);
    r.b->deallocate_device(out, rig::n, r.cs);
  }
}

BOOST_AUTO_TEST_CASE(write_while_in_use_fires_and_corrupts_the_snapshot) {
  for (bool fixed : {false, true}) {
    rig r;
    r.fill_device(0x33);
    r.fill_host(0x00);
    r.b->wait_event(r.cp, r.b->record_event(r.cs));
    r.b->copy_d2h(r.h, r.d, rig::n, r.cp); // snapshot of 0x33
    if (fixed) r.b->wait_event(r.cs, r.b->record_event(r.cp));
    r.b->launch(r.cs, {"overwrite", {}, {{r.d, rig::n}}, 10}, [d = r.d](mock::kernel_context const& k) {
      for (auto& v : k.write<unsigned char>(d, rig::n)) v = 0x44;
    });
    r.b->synchronize_device();
    if (fixed) {
      BOOST_TEST(r.b->hazards().empty());
      BOOST_TEST(static_cast<int>(r.h[7]) == 0x33);
    } else {
      BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
      // The kernel reads-then-writes the buffer the D2H still reads.
      BOOST_TEST((r.kinds()[0] == hazard_kind::write_while_in_use));
      BOOST_TEST(static_cast<int>(r.h[7]) == 0x44); // the snapshot holds the later value
    }
  }
}

BOOST_AUTO_TEST_CASE(copy_into_bytes_a_kernel_still_reads_is_write_while_in_use) {
  for (bool fixed : {false, true}) {
    rig r;
    auto out = r.b->allocate_device(rig::n, r.cs);
    r.b->launch(r.cs, {"reader", {{r.d, rig::n}}, {{out, rig::n}}, 1000});
    if (fixed) r.b->wait_event(r.cp, r.b->record_event(r.cs));
    r.b->copy_h2d(r.d, r.h, rig::n, r.cp);
    BOOST_TEST(r.b->hazards().size() == (fixed ? 0u : 1u));
    if (!fixed) BOOST_TEST((r.kinds()[0] == hazard_kind::write_while_in_use));
    r.b->set_hazard_policy(mock::hazard_policy::ignore);
    r.b->synchronize_device();
    r.b->deallocate_device(out, rig::n, r.cs);
  }
}

BOOST_AUTO_TEST_CASE(release_while_in_use_fires_and_loses_the_offload) {
  for (bool fixed : {false, true}) {
    rig r;
    r.fill_device(0x55);
    r.fill_host(0x00);
    r.b->wait_event(r.cp, r.b->record_event(r.cs));
    r.b->copy_d2h(r.h, r.d, rig::n, r.cp);
    auto copied = r.b->record_event(r.cp);
    if (fixed) r.b->wait_event(r.cs, copied);
    r.b->deallocate_device(r.d, rig::n, r.cs); // stream-ordered release on the compute stream
    r.d_live = false;
    r.b->synchronize(copied);
    if (fixed) {
      BOOST_TEST(r.b->hazards().empty());
      BOOST_TEST(static_cast<int>(r.h[0]) == 0x55);
    } else {
      BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
      BOOST_TEST((r.kinds()[0] == hazard_kind::release_while_in_use));
      BOOST_TEST(static_cast<int>(r.h[0]) == 0x00); // storage gone before the copy finished
    }
  }
}

BOOST_AUTO_TEST_CASE(unsynchronized_host_read_fires_and_sees_old_bytes) {
  for (bool fixed : {false, true}) {
    rig r;
    r.fill_device(0x66);
    r.fill_host(0x01);
    r.b->wait_event(r.cp, r.b->record_event(r.cs));
    r.b->copy_d2h(r.h, r.d, rig::n, r.cp);
    auto copied = r.b->record_event(r.cp);
    if (fixed) r.b->synchronize(copied);
    r.b->note_host_read(r.h, rig::n);
    if (fixed) {
      BOOST_TEST(r.b->hazards().empty());
      BOOST_TEST(static_cast<int>(r.h[0]) == 0x66);
    } else {
      BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
      BOOST_TEST((r.kinds()[0] == hazard_kind::unsynchronized_host_read));
      BOOST_TEST(static_cast<int>(r.h[0]) == 0x01);
      BOOST_TEST(r.b->hazards()[0].message.find("synchronize") != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_stream_wait_is_not_a_host_synchronization) {
  // The compute stream waited the D2H, but the host did not: reading the mirror is still a race.
  rig r;
  r.b->wait_event(r.cp, r.b->record_event(r.cs));
  r.b->copy_d2h(r.h, r.d, rig::n, r.cp);
  r.b->wait_event(r.cs, r.b->record_event(r.cp));
  r.b->note_host_read(r.h, rig::n);
  BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
  BOOST_TEST((r.kinds()[0] == hazard_kind::unsynchronized_host_read));
}

BOOST_AUTO_TEST_CASE(host_write_while_h2d_in_flight) {
  for (bool fixed : {false, true}) {
    rig r;
    r.fill_host(0x77);
    r.b->copy_h2d(r.d, r.h, rig::n, r.cp);
    if (fixed) r.b->synchronize(r.b->record_event(r.cp));
    r.b->note_host_write(r.h, rig::n);
    std::memset(r.h, 0x78, rig::n);
    auto bytes = r.b->read_device(r.d, rig::n);
    if (fixed) {
      BOOST_TEST(r.b->hazards().empty());
      BOOST_TEST(static_cast<int>(bytes[0]) == 0x77);
    } else {
      BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
      BOOST_TEST((r.kinds()[0] == hazard_kind::write_while_in_use));
      BOOST_TEST(static_cast<int>(bytes[0]) == 0x78); // the copy picked up the later host write
    }
  }
}

BOOST_AUTO_TEST_CASE(use_after_release_fires) {
  rig r;
  r.b->deallocate_device(r.d, rig::n, r.cs);
  r.d_live = false;
  r.b->copy_h2d(r.d, r.h, rig::n, r.cs);
  BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
  BOOST_TEST((r.kinds()[0] == hazard_kind::use_after_release));
}

BOOST_AUTO_TEST_CASE(stream_ordered_allocation_must_be_ordered_before_use) {
  for (bool fixed : {false, true}) {
    rig r;
    auto fresh = r.b->allocate_device(64, r.cs);
    if (fixed) r.b->wait_event(r.cp, r.b->record_event(r.cs));
    r.b->copy_h2d(fresh, r.h, 64, r.cp);
    BOOST_TEST(r.b->hazards().size() == (fixed ? 0u : 1u));
    if (!fixed) BOOST_TEST(r.b->hazards()[0].message.find("allocated by") != std::string::npos);
    r.b->set_hazard_policy(mock::hazard_policy::ignore);
    r.b->wait_event(r.cs, r.b->record_event(r.cp));
    r.b->deallocate_device(fresh, 64, r.cs);
  }
}

BOOST_AUTO_TEST_CASE(disjoint_ranges_do_not_conflict) {
  // Offloading one half of a pinned buffer while the host reads the other, synchronized half, and
  // a kernel writes a device range next to a copy's range: no false positives.
  rig r;
  r.b->wait_event(r.cp, r.b->record_event(r.cs));
  r.b->copy_d2h(r.h, r.d, 128, r.cp);
  r.b->synchronize(r.b->record_event(r.cp));
  r.b->copy_d2h(r.h + 128, r.d + 128, 128, r.cp); // in flight
  r.b->note_host_read(r.h, 128);
  r.b->launch(r.cs, {"neighbour", {}, {{r.d, 128}}, 5});
  r.b->note_host_read(r.h + 64, 64);
  BOOST_TEST(r.b->hazards().empty());
  r.b->note_host_read(r.h + 100, 40); // straddles into the in-flight half
  BOOST_TEST(r.kinds().size() == 1u);
}

BOOST_AUTO_TEST_CASE(raise_policy_throws_before_the_operation_takes_effect) {
  rig r{mock::hazard_policy::raise};
  r.fill_device(0x10);
  auto const ops_before = r.b->ops().size();
  auto const t_before = r.b->makespan();
  r.b->copy_h2d(r.d, r.h, rig::n, r.cp);
  auto out = r.b->allocate_device(rig::n, r.cs);
  auto const ops_mid = r.b->ops().size();
  try {
    r.b->launch(r.cs, {"early", {{r.d, rig::n}}, {{out, rig::n}}, 10});
    BOOST_ERROR("no hazard_error");
  } catch (mock::hazard_error const& e) {
    BOOST_TEST((e.report().kind == hazard_kind::read_before_write));
    BOOST_TEST(std::string(e.what()).find("'early'") != std::string::npos, e.what());
  }
  BOOST_TEST(r.b->ops().size() == ops_mid); // not logged, not scheduled
  BOOST_TEST(ops_mid > ops_before);
  BOOST_TEST(r.b->hazards().empty());
  // The backend is still usable and the corrected call goes through.
  r.b->wait_event(r.cs, r.b->record_event(r.cp));
  r.b->launch(r.cs, {"late", {{r.d, rig::n}}, {{out, rig::n}}, 10});
  BOOST_TEST(r.b->makespan() > t_before);
  r.b->synchronize_device();
  r.b->deallocate_device(out, rig::n, r.cs);
}

// Under `ignore` nothing is checked nor recorded for later checks; checking again afterwards starts
// every allocation's record afresh: what ran unchecked does not count, what runs next does.
BOOST_AUTO_TEST_CASE(checking_resumes_afresh_after_ignore) {
  rig r{mock::hazard_policy::record};
  auto out = r.b->allocate_device(rig::n, r.cs);
  r.b->wait_event(r.cp, r.b->record_event(r.cs)); // the copy stream sees `out` allocated
  r.b->set_hazard_policy(mock::hazard_policy::ignore);
  r.b->copy_h2d(r.d, r.h, rig::n, r.cp); // unordered with the kernel below: not checked
  r.b->launch(r.cs, {"unchecked", {{r.d, rig::n}}, {{out, rig::n}}, 10});
  BOOST_TEST(r.b->hazards().empty());
  r.b->set_hazard_policy(mock::hazard_policy::record);
  r.b->launch(r.cs, {"after", {{r.d, rig::n}}, {{out, rig::n}}, 10}); // the ignored copy does not count
  BOOST_TEST(r.b->hazards().empty());
  r.b->wait_event(r.cp, r.b->record_event(r.cs)); // the copy below comes after the kernel's read
  r.b->copy_h2d(r.d, r.h, rig::n, r.cp);          // but the next kernel does not wait for it
  r.b->launch(r.cs, {"racing", {{r.d, rig::n}}, {{out, rig::n}}, 10});
  BOOST_TEST_REQUIRE(r.kinds().size() == 1u);
  BOOST_TEST((r.kinds()[0] == hazard_kind::read_before_write));
  BOOST_TEST(r.b->hazards()[0].message.find("'racing'") != std::string::npos, r.b->hazards()[0].message);
  r.b->set_hazard_policy(mock::hazard_policy::ignore);
  r.b->synchronize_device();
  r.b->deallocate_device(out, rig::n, r.cs);
}

BOOST_AUTO_TEST_CASE(host_release_while_copy_pending) {
  for (bool fixed : {false, true}) {
    mock::options o;
    o.hazards = mock::hazard_policy::record;
    mock::backend b{o};
    auto s = b.current_stream();
    auto* h = b.allocate_host(64);
    auto d = b.allocate_device(64, s);
    b.copy_d2h(h, d, 64, s);
    if (fixed) b.synchronize(b.record_event(s));
    b.deallocate_host(h, 64);
    BOOST_TEST(b.hazards().size() == (fixed ? 0u : 1u));
    if (!fixed) BOOST_TEST((b.hazards()[0].kind == hazard_kind::release_while_in_use));
    b.synchronize_device(); // the racing copy lands nowhere, safely
    b.deallocate_device(d, 64, s);
  }
}

BOOST_AUTO_TEST_SUITE_END() // mock_hazards
