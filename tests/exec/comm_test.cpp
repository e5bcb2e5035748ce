// The Comm and Stage concepts (one minimal model and one near-miss per requirement) and thread_comm:
// matching, ordering, sizes, rendezvous, bounded waits, abort, bad input, and a threaded ring.
#define BOOST_TEST_MODULE exec_comm
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/exec/comm.hpp>
#include <pipeswap/exec/mpi_comm.hpp>
#include <pipeswap/exec/stage.hpp>
#include <pipeswap/exec/thread_comm.hpp>

#include "support/sanitized.hpp"

namespace ex = pipeswap::exec;
using namespace std::chrono_literals;

namespace {

// ----- Comm: a minimal model and one near-miss per requirement --------------------------------------
struct self_comm {
  using comm_concept = ex::comm_tag;
  struct request_type {
    bool done = false;
  };
  static constexpr bool reads_device_memory = false;
  int rank() const { return 0; }
  int size() const { return 1; }
  int max_tag() const { return 32767; }
  request_type isend(void const*, std::size_t, int, int) { return {true}; }
  request_type irecv(void*, std::size_t, int, int) { return {true}; }
  bool test(request_type& r) { return r.done; }
  bool wait_for(request_type& r, std::chrono::milliseconds) { return r.done; }
  void abort(std::string_view) {}
};
static_assert(ex::comm<self_comm>);
static_assert(ex::comm<ex::thread_comm>);
#if PIPESWAP_HAS_MPI
static_assert(ex::comm<ex::mpi_comm>);
#endif

struct no_opt_in : self_comm {
  using comm_concept = void;
};
static_assert(!ex::comm<no_opt_in>);

struct opted_in_by_trait : no_opt_in {};
} // namespace
template <>
inline constexpr bool pipeswap::exec::enable_comm<opted_in_by_trait> = true;
namespace {
static_assert(ex::comm<opted_in_by_trait>);

struct long_rank : self_comm {
  long rank() const { return 0; }
};
static_assert(!ex::comm<long_rank>);
struct no_size : self_comm {
  void size() const {}
};
static_assert(!ex::comm<no_size>);
struct no_max_tag : self_comm {
  unsigned max_tag() const { return 1; }
};
static_assert(!ex::comm<no_max_tag>);
struct immovable_request : self_comm {
  struct request_type {
    request_type() = default;
    request_type(request_type&&) = delete;
  };
};
static_assert(!ex::comm<immovable_request>);
struct send_returns_void : self_comm {
  void isend(void const*, std::size_t, int, int) {}
};
static_assert(!ex::comm<send_returns_void>);
struct recv_from_const : self_comm {
  request_type irecv(int*, std::size_t, int, int) { return {}; }
};
static_assert(!ex::comm<recv_from_const>);
struct test_returns_int : self_comm {
  int test(request_type&) { return 1; }
};
static_assert(!ex::comm<test_returns_int>);
struct no_wait_for : self_comm {
  void wait_for(request_type&, std::chrono::milliseconds) {}
};
static_assert(!ex::comm<no_wait_for>);
struct abort_takes_int : self_comm {
  void abort(int) {}
};
static_assert(!ex::comm<abort_takes_int>);
struct device_flag_int : self_comm {
  static constexpr int reads_device_memory = 0;
};
static_assert(!ex::comm<device_flag_int>);

// The optional stream-ordered capability: a model and one near-miss per requirement.
struct stream_comm : self_comm {
  static constexpr bool reads_device_memory = true;
  static constexpr bool stream_ordered = true;
  using self_comm::irecv;
  using self_comm::isend;
  request_type isend(void const*, std::size_t, int, int, pipeswap::mock::stream) { return {true}; }
  request_type irecv(void*, std::size_t, int, int, pipeswap::mock::stream) { return {true}; }
};
static_assert(ex::stream_ordered_comm<stream_comm, pipeswap::mock::stream>);
static_assert(!ex::stream_ordered_comm<self_comm, pipeswap::mock::stream>);
static_assert(!ex::stream_ordered_comm<ex::thread_comm, pipeswap::mock::stream>);
struct stream_flag_false : stream_comm {
  static constexpr bool stream_ordered = false;
};
static_assert(!ex::stream_ordered_comm<stream_flag_false, pipeswap::mock::stream>);
struct stream_flag_int : stream_comm {
  static constexpr int stream_ordered = 1;
};
static_assert(!ex::stream_ordered_comm<stream_flag_int, pipeswap::mock::stream>);
struct stream_no_irecv : self_comm {
  static constexpr bool reads_device_memory = true;
  static constexpr bool stream_ordered = true;
  using self_comm::isend;
  request_type isend(void const*, std::size_t, int, int, pipeswap::mock::stream) { return {true}; }
};
static_assert(!ex::stream_ordered_comm<stream_no_irecv, pipeswap::mock::stream>);
static_assert(!ex::stream_ordered_comm<stream_comm, int*>); // another backend's stream

// ----- Stage: a minimal model and near-misses ------------------------------------------------------
using mb = pipeswap::mock::backend;
struct min_stage {
  using stage_concept = ex::stage_tag;
  std::size_t input_bytes() const { return 4; }
  std::size_t output_bytes() const { return 4; }
  void forward(ex::forward_args<mb>&) {}
  void backward(ex::backward_args<mb>&) {}
};
static_assert(ex::stage<min_stage, mb>);
static_assert(!ex::stage_with_begin<min_stage, mb>);
struct stage_no_tag : min_stage {
  using stage_concept = int;
};
static_assert(!ex::stage<stage_no_tag, mb>);
struct stage_int_bytes : min_stage {
  int input_bytes() const { return 4; }
};
static_assert(!ex::stage<stage_int_bytes, mb>);
struct stage_nonconst_bytes : min_stage {
  std::size_t output_bytes() { return 4; }
};
static_assert(!ex::stage<stage_nonconst_bytes, mb>);
struct stage_fwd_by_value : min_stage {
  void forward(int) {}
};
static_assert(!ex::stage<stage_fwd_by_value, mb>);
struct stage_no_backward : min_stage {
  void backward() {}
};
static_assert(!ex::stage<stage_no_backward, mb>);
struct stage_with_begin_step : min_stage {
  void begin_step(mb&, pipeswap::mock::stream) {}
};
static_assert(ex::stage_with_begin<stage_with_begin_step, mb>);

std::vector<int> iota_vec(int n, int from) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

} // namespace

BOOST_AUTO_TEST_SUITE(thread_comm_rules)

BOOST_AUTO_TEST_CASE(send_first_or_receive_first_delivers_the_bytes) {
  ex::thread_world w(2);
  auto a = w.comm(0), b = w.comm(1);
  BOOST_TEST(a.rank() == 0);
  BOOST_TEST(b.size() == 2);
  auto src = iota_vec(64, 7);
  std::vector<int> dst(64, 0);
  auto s = a.isend(src.data(), 256, 1, 3);
  BOOST_TEST(!a.test(s)); // rendezvous: no receive yet
  auto r = b.irecv(dst.data(), 256, 0, 3);
  BOOST_TEST(b.test(r));
  BOOST_TEST(a.test(s));
  BOOST_TEST(dst == src);

  std::vector<int> dst2(64, 0);
  auto r2 = a.irecv(dst2.data(), 256, 1, 9); // receive first
  BOOST_TEST(!a.test(r2));
  auto s2 = b.isend(src.data(), 256, 0, 9);
  BOOST_TEST(b.wait_for(s2, 1s));
  BOOST_TEST(a.wait_for(r2, 1s));
  BOOST_TEST(dst2 == src);
}

BOOST_AUTO_TEST_CASE(same_tag_in_posting_order_other_tags_by_tag) {
  ex::thread_world w(2);
  auto a = w.comm(0), b = w.comm(1);
  int v[3] = {10, 20, 30}, t5 = 55;
  std::vector<ex::thread_comm::request_type> sends;
  for (int& x : v) sends.push_back(a.isend(&x, sizeof x, 1, 1));
  sends.push_back(a.isend(&t5, sizeof t5, 1, 5));
  int got5 = 0, got[3] = {};
  auto r5 = b.irecv(&got5, sizeof got5, 0, 5); // posted first, matches only tag 5
  for (int& g : got) {
    auto r = b.irecv(&g, sizeof g, 0, 1);
    BOOST_TEST(b.test(r));
  }
  BOOST_TEST(b.test(r5));
  BOOST_TEST(got5 == 55);
  BOOST_TEST(got[0] == 10);
  BOOST_TEST(got[1] == 20);
  BOOST_TEST(got[2] == 30);
  for (auto& s : sends) BOOST_TEST(a.test(s));
}

BOOST_AUTO_TEST_CASE(size_mismatch_fails_both_sides_naming_sizes) {
  ex::thread_world w(2);
  auto a = w.comm(0), b = w.comm(1);
  char buf[16] = {};
  auto s = a.isend(buf, 8, 1, 2);
  auto r = b.irecv(buf, 16, 0, 2);
  auto names_sizes = [](ex::comm_error const& e) {
    std::string const m = e.what();
    return m.find("8 bytes") != std::string::npos && m.find("16 bytes") != std::string::npos &&
           m.find("tag 2") != std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(b.test(r), ex::comm_error, names_sizes);
  BOOST_CHECK_EXCEPTION(a.test(s), ex::comm_error, names_sizes);
}

BOOST_AUTO_TEST_CASE(wait_for_is_bounded_and_abort_wakes_waiters) {
  ex::thread_world w(3);
  auto a = w.comm(0);
  int x = 0;
  auto r = a.irecv(&x, sizeof x, 1, 0);
  auto const t0 = std::chrono::steady_clock::now();
  BOOST_TEST(!a.wait_for(r, 50ms));
  BOOST_TEST((std::chrono::steady_clock::now() - t0 >= 50ms));

  std::atomic<bool> woke{false};
  std::string what;
  std::thread waiter([&] {
    auto c = w.comm(2);
    int y = 0;
    auto q = c.irecv(&y, sizeof y, 1, 4);
    try {
      (void)c.wait_for(q, 60s);
    } catch (ex::comm_aborted const& e) {
      what = e.what();
      woke = true;
    }
  });
  std::this_thread::sleep_for(20ms);
  w.comm(1).abort("rank 1 failed at position 3 (F1.0): boom");
  waiter.join(); // would take 60 s without the wake-up
  BOOST_TEST(woke.load());
  BOOST_TEST(what == "rank 1 failed at position 3 (F1.0): boom");
  BOOST_TEST(w.aborted().value() == what);
  // Every later operation on every rank throws the first reason.
  BOOST_CHECK_THROW(a.test(r), ex::comm_aborted);
  BOOST_CHECK_THROW(a.isend(&x, 4, 2, 0), ex::comm_aborted);
  w.comm(2).abort("a second reason");
  BOOST_TEST(w.aborted().value() == what);
}

BOOST_AUTO_TEST_CASE(bad_peers_tags_and_ranks_are_rejected) {
  BOOST_CHECK_THROW(ex::thread_world(0), pipeswap::invalid_argument);
  ex::thread_world w(2);
  BOOST_CHECK_THROW((void)w.comm(2), pipeswap::invalid_argument);
  auto a = w.comm(0);
  int x = 0;
  BOOST_CHECK_THROW(a.isend(&x, 4, 0, 0), ex::comm_error); // itself
  BOOST_CHECK_THROW(a.isend(&x, 4, 5, 0), ex::comm_error);
  BOOST_CHECK_THROW(a.irecv(&x, 4, 1, -1), ex::comm_error);
  ex::thread_comm::request_type never;
  BOOST_CHECK_THROW(a.test(never), ex::comm_error);
  // Nothing was lost: the comm still works.
  auto b = w.comm(1);
  int y = 5;
  auto s = b.isend(&y, 4, 0, 0);
  auto r = a.irecv(&x, 4, 1, 0);
  BOOST_TEST(a.test(r));
  BOOST_TEST(b.test(s));
  BOOST_TEST(x == 5);
}

BOOST_AUTO_TEST_CASE(threaded_ring_delivers_every_message_in_order) {
  int const ranks = 4, rounds = pipeswap::test::sanitized_build ? 50 : 400;
  ex::thread_world w(ranks);
  std::vector<long> sums(ranks, 0);
  std::vector<int> in_order(ranks, 1);
  std::vector<std::thread> ts;
  for (int k = 0; k < ranks; ++k) {
    ts.emplace_back([&, k] {
      auto c = w.comm(k);
      int const next = (k + 1) % ranks, prev = (k + ranks - 1) % ranks;
      std::vector<int> out(static_cast<std::size_t>(rounds)), got(static_cast<std::size_t>(rounds), -1);
      std::vector<ex::thread_comm::request_type> rs, ss;
      for (int i = 0; i < rounds; ++i) rs.push_back(c.irecv(&got[std::size_t(i)], sizeof(int), prev, i % 3));
      for (int i = 0; i < rounds; ++i) {
        out[std::size_t(i)] = k * 100000 + i;
        ss.push_back(c.isend(&out[std::size_t(i)], sizeof(int), next, i % 3));
      }
      for (auto& r : rs) {
        if (!c.wait_for(r, 30s)) return;
      }
      for (auto& s : ss) {
        if (!c.wait_for(s, 30s)) return;
      }
      for (int i = 0; i < rounds; ++i) {
        sums[std::size_t(k)] += got[std::size_t(i)];
        if (got[std::size_t(i)] != prev * 100000 + i) in_order[std::size_t(k)] = 0;
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int k = 0; k < ranks; ++k) {
    long const prev = (k + ranks - 1) % ranks;
    BOOST_TEST(in_order[std::size_t(k)] == 1);
    BOOST_TEST(sums[std::size_t(k)] == prev * 100000 * rounds + long(rounds) * (rounds - 1) / 2);
  }
}

BOOST_AUTO_TEST_SUITE_END()
