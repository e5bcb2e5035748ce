// The optimizer-state swap runtime with a user-written optimizer: bit-exact against no swap, the
// reference call traces, the memory bound, resumable failure at every copy and allocation, the
// synchronous user backend as a second oracle, and ownership of the state across runtimes (rebuilt
// runtimes continue bit-exactly, a second live runtime and add_param under a runtime are refused).
// The bit-exact sweeps, the rebuilt runtimes and the gradient-less parameters run on every backend of
// support/backend_list.hpp (the mock and the threaded backend; CUDA in cuda_optimizer_swap); call
// traces, the memory bound and
// fault injection need the mock's records and faults and run on it alone. Hazards are recorded
// (hazard_policy::record) wherever a test asserts that there are none.
#define BOOST_TEST_MODULE optimizer_swap
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/backend_list.hpp"
#include "support/sanitized.hpp"
#include "support/step_error_check.hpp"
#include "support/toy_optimizer.hpp"
#include "support/world.hpp"
#include "support/no_hazards.hpp"

#if defined(PIPESWAP_TEST_CUDA)
// cuda_optimizer_swap (tests/cuda/meson.build) runs the cases over test_backends on the device (the
// toy optimizer's kernels as host math in stream order); without a device the program skips.
using gate = pipeswap::test::skip_unless_available<pipeswap::test::test_backends>;
BOOST_TEST_GLOBAL_FIXTURE(gate);
#endif

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::test::toy_optimizer;

namespace {

using mock_model = ps::test::model<mock::backend, toy_optimizer<mock::backend>>;
using ps::test::download;
using ps::test::is_mock;
using ps::test::options_for;
using ps::test::test_backends;

/// Under sanitizers (ThreadSanitizer runs the threaded cases) the threaded backend's sweeps take a
/// sample: every pipeline, partition and master setting, half the swap_times.
template <class B>
constexpr bool sampling = ps::test::sanitized_build && !is_mock<B>;
template <class B>
bool sampled_out(std::size_t swap_times) {
  return sampling<B> && (swap_times == 2 || swap_times == 16 || swap_times == 100);
}

/// Small pinned chunks keep the many tiny worlds of these tests cheap.
ps::pinned_pool_options small_pool() { return {1 << 20, 1 << 18, 512}; }

/// A mock that records hazards instead of throwing, so that PIPESWAP_CHECK_NO_HAZARDS can fail.
mock::options recording(mock::timing_model t = mock::timing_model::unit()) {
  mock::options o{t};
  o.hazards = mock::hazard_policy::record;
  return o;
}

using ps::test::throws_step_error;

using ps::test::no_swap;

ps::swap_config swap(std::size_t times, bool packed, std::size_t min_swap_numel = 0) {
  ps::swap_config c;
  c.swap_times = times;
  c.packed = packed;
  c.min_swap_numel = min_swap_numel;
  return c;
}

/// Runs `steps` steps on a B and returns every parameter and state byte.
template <class B = mock::backend, class P = ps::balanced_partition>
std::vector<std::vector<std::byte>> train(std::vector<std::size_t> const& sizes, ps::swap_config cfg, int steps,
                                          bool masters, P policy = {}) {
  B b{options_for<B>()};
  ps::transfer_engine<B> x(b, small_pool());
  ps::test::model<B, toy_optimizer<B>> m(b, sizes, 7, masters);
  ps::optimizer_swap<toy_optimizer<B>, P> rt(x, m.opt, cfg, policy);
  for (int s = 0; s < steps; ++s) {
    m.set_grads(static_cast<std::uint64_t>(s));
    rt.step();
  }
  PIPESWAP_CHECK_NO_HAZARDS(b);
  return m.snapshot(rt);
}

std::vector<std::size_t> const mixed_sizes{5000, 1, 0, 3, 2048, 1024, 777, 4096, 64, 1500, 2, 9000};

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(bit_exact_against_no_swap_for_both_pipelines, B, test_backends) {
  for (bool masters : {false, true}) {
    auto const ref = train<B>(mixed_sizes, no_swap(), 3, masters);
    for (bool packed : {false, true}) {
      for (std::size_t k : {1u, 2u, 3u, 7u, 16u, 100u}) {
        for (std::size_t min_swap_numel : {0u, 1024u}) {
          if (sampled_out<B>(k) || (sampling<B> && min_swap_numel != (k == 3 ? 1024u : 0u))) continue;
          BOOST_TEST_CONTEXT("packed " << packed << " swap_times " << k << " min_swap_numel " << min_swap_numel
                                       << " masters " << masters) {
            auto const got = train<B>(mixed_sizes, swap(k, packed, min_swap_numel), 3, masters);
            BOOST_TEST_REQUIRE(got.size() == ref.size());
            for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST((got[i] == ref[i]), "tensor " << i);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bit_exact_with_element_splitting, B, test_backends) {
  auto const ref = train<B>(mixed_sizes, no_swap(), 3, true);
  for (bool packed : {false, true}) {
    for (std::size_t k : {1u, 2u, 3u, 7u, 16u, 100u}) {
      if (sampled_out<B>(k)) continue;
      BOOST_TEST_CONTEXT("packed " << packed << " swap_times " << k) {
        auto const got = train<B>(mixed_sizes, swap(k, packed), 3, true, ps::split_partition{});
        BOOST_TEST_REQUIRE(got.size() == ref.size());
        for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST((got[i] == ref[i]), "tensor " << i);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(user_backend_gives_the_same_bits_as_the_mock) {
  auto const ref = train(mixed_sizes, swap(3, true), 2, true);
  ps::test::sync_host_backend b;
  ps::transfer_engine<ps::test::sync_host_backend> x(b, small_pool());
  ps::test::model<ps::test::sync_host_backend, toy_optimizer<ps::test::sync_host_backend>> m(b, mixed_sizes, 7, true);
  {
    ps::optimizer_swap<toy_optimizer<ps::test::sync_host_backend>> rt(x, m.opt, swap(3, false));
    for (int s = 0; s < 2; ++s) {
      m.set_grads(static_cast<std::uint64_t>(s));
      rt.step();
    }
    auto const got = m.snapshot(rt);
    for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST((got[i] == ref[i]), "tensor " << i);
  }
  x.pool().trim();
}

BOOST_AUTO_TEST_CASE(reference_call_traces) {
  // One single-slot unit per batch, as in the reference tests.
  std::vector<std::string> const per_tensor3{"load:0",    "wait_load:0", "load:1",         "update:0",
                                             "offload:0", "wait_load:1", "wait_offload:0", "load:2",
                                             "update:1",  "offload:1",   "wait_load:2",    "wait_offload:1",
                                             "update:2",  "offload:2",   "wait_offload:2"};
  std::vector<std::string> const packed3{"begin:3",        "load:0:0",
                                         "load:1:1",       "wait_load:0:0",
                                         "activate:0:0",   "update:0",
                                         "chain:0:2:0",    "wait_load:1:1",
                                         "activate:1:1",   "update:1",
                                         "chain:1:-:1",    "wait_load:2:0",
                                         "wait_offload:0", "free_staging:0",
                                         "activate:2:0",   "update:2",
                                         "chain:2:-:0",    "wait_offload:1",
                                         "free_staging:1", "wait_offload:2",
                                         "free_staging:2", "end"};
  std::vector<std::string> const per_tensor1{"load:0", "wait_load:0", "update:0", "offload:0", "wait_offload:0"};
  std::vector<std::string> const packed1{"begin:1",     "load:0:0",       "wait_load:0:0",  "activate:0:0", "update:0",
                                         "chain:0:-:0", "wait_offload:0", "free_staging:0", "end"};
  for (bool packed : {false, true}) {
    for (std::size_t n : {0u, 1u, 2u, 3u}) {
      mock::backend b;
      ps::transfer_engine<mock::backend> x(b, small_pool());
      mock_model m(b, std::vector<std::size_t>(n, 16), 1, false);
      ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(n ? n : 1, packed));
      std::vector<std::string> trace;
      std::vector<ps::swap_event> events;
      rt.set_listener([&](std::string_view s) { trace.emplace_back(s); });
      rt.set_event_listener([&](ps::swap_event const& e) { events.push_back(e); });
      m.set_grads(0);
      rt.step();
      BOOST_TEST_CONTEXT("packed " << packed << " batches " << n) {
        // The typed events are the same operations, and their string form is the listener's.
        BOOST_TEST_REQUIRE(events.size() == trace.size());
        for (std::size_t i = 0; i < events.size(); ++i) BOOST_TEST(ps::to_string(events[i]) == trace[i]);
        if (n == 3 && packed) {
          using st = ps::swap_event::storage;
          auto const chain = [&](std::size_t batch) {
            return *std::find_if(events.begin(), events.end(), [&](auto const& e) {
              return e.op == ps::swap_event::kind::chain && e.batch == batch;
            });
          };
          BOOST_TEST((chain(0) == ps::swap_event{ps::swap_event::kind::chain, 0, 2, st::staging, 0, true}));
          BOOST_TEST((chain(1) == ps::swap_event{ps::swap_event::kind::chain, 1, std::nullopt, st::staging, 1, true}));
          BOOST_TEST((events.front() ==
                      ps::swap_event{ps::swap_event::kind::begin, 3, std::nullopt, st::unspecified, 0, false}));
        }
        if (n == 0) BOOST_TEST(trace.empty());
        if (n == 1) BOOST_TEST((trace == (packed ? packed1 : per_tensor1)));
        if (n == 3) BOOST_TEST((trace == (packed ? packed3 : per_tensor3)));
        if (n == 2 && !packed) {
          std::vector<std::string> const two{"load:0",    "wait_load:0",   "load:1",         "update:0",
                                             "offload:0", "wait_load:1",   "wait_offload:0", "update:1",
                                             "offload:1", "wait_offload:1"};
          BOOST_TEST((trace == two));
        }
        if (n == 2 && packed) {
          std::vector<std::string> const two{"begin:2",        "load:0:0",       "load:1:1",       "wait_load:0:0",
                                             "activate:0:0",   "update:0",       "chain:0:-:0",    "wait_load:1:1",
                                             "activate:1:1",   "update:1",       "chain:1:-:1",    "wait_offload:0",
                                             "free_staging:0", "wait_offload:1", "free_staging:1", "end"};
          BOOST_TEST((trace == two));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(device_memory_stays_within_resident_plus_two_batches) {
  std::size_t params_bytes = 0;
  for (auto n : mixed_sizes) params_bytes += 8 * n; // parameters and gradients
  for (bool packed : {false, true}) {
    for (std::size_t k : {2u, 3u, 5u, 12u}) {
      mock::backend b{recording()};
      ps::transfer_engine<mock::backend> x(b, small_pool());
      mock_model m(b, mixed_sizes, 3, true);
      ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(k, packed, 100));
      for (int s = 0; s < 2; ++s) {
        m.set_grads(static_cast<std::uint64_t>(s));
        rt.step();
      }
      auto const window = packed ? 2 * rt.arena_bytes() : 2 * rt.max_batch_bytes();
      BOOST_TEST_CONTEXT("packed " << packed << " swap_times " << k) {
        BOOST_TEST(rt.swappable_bytes() > 0u);
        BOOST_TEST(rt.unswappable_bytes() > 0u); // small slots stay (min_swap_numel 100)
        BOOST_TEST(b.peak_device_bytes() <= params_bytes + rt.unswappable_bytes() + window);
        // With three batches or more, swapping saves memory: the window is smaller than the state.
        if (k >= 3) BOOST_TEST(window < rt.swappable_bytes());
        BOOST_TEST(b.device_bytes_in_use() == params_bytes + rt.unswappable_bytes());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(fault_at_every_copy_and_allocation_is_resumable_and_exact) {
  std::vector<std::size_t> const sizes{3000, 64, 5000, 2048, 1};
  // The uninterrupted run: 3 steps.
  auto const ref = train(sizes, no_swap(), 3, true);
  for (bool packed : {false, true}) {
    for (auto site : {mock::fault_site::copy, mock::fault_site::allocation}) {
      // Count the operations of this class in step 2 of a clean run.
      std::size_t count = 0;
      {
        mock::backend b;
        ps::transfer_engine<mock::backend> x(b, small_pool());
        mock_model m(b, sizes, 7, true);
        ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(3, packed));
        m.set_grads(0);
        rt.step();
        m.set_grads(1);
        auto const before = b.attempts(site);
        rt.step();
        count = b.attempts(site) - before;
      }
      BOOST_TEST(count > 0u);
      for (std::size_t i = 0; i < count; ++i) {
        BOOST_TEST_CONTEXT("packed " << packed << " site " << static_cast<int>(site) << " index " << i) {
          mock::backend b{recording()};
          ps::transfer_engine<mock::backend> x(b, small_pool());
          mock_model m(b, sizes, 7, true);
          ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(3, packed));
          m.set_grads(0);
          rt.step();
          m.set_grads(1);
          b.fail_after(site, i);
          auto const what = throws_step_error<mock::mock_error>([&] { rt.step(); });
          BOOST_TEST(what.find("optimizer_swap::step: ") == 0u, what);
          BOOST_TEST(what.find("step() resumes it") != std::string::npos, what);
          BOOST_TEST(rt.has_interrupted_step());
          // Nothing is in flight and nothing was lost: every piece is at rest.
          BOOST_TEST(rt.at_rest());
          rt.step(); // resumes the interrupted step
          BOOST_TEST(!rt.has_interrupted_step());
          BOOST_TEST(m.opt.steps() == 2u);
          m.set_grads(2);
          rt.step();
          auto const got = m.snapshot(rt);
          PIPESWAP_CHECK_NO_HAZARDS(b);
          for (std::size_t t = 0; t < ref.size(); ++t) BOOST_TEST((got[t] == ref[t]), "tensor " << t);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_failing_copy_back_strands_the_arena_and_the_next_step_recovers) {
  // Packed: the chain's D2H fails, and so does the first copy of the recovery: the pieces stay in
  // their arena, which is kept until the next step brings them home.
  std::vector<std::size_t> const sizes{3000, 5000, 2048};
  auto const ref = train(sizes, no_swap(), 2, false);
  mock::backend b{recording()};
  ps::transfer_engine<mock::backend> x(b, small_pool());
  mock_model m(b, sizes, 7, false);
  ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(3, true));
  m.set_grads(0);
  bool armed = false;
  rt.set_listener([&](std::string_view op) {
    if (op == "chain:0:2:0") b.fail_after(mock::fault_site::copy, 0);
    if (op == "end" && !armed) {
      armed = true;
      b.fail_after(mock::fault_site::copy, 0); // the copy-back fails too
    }
  });
  auto const what = throws_step_error<mock::mock_error>([&] { rt.step(); });
  BOOST_TEST(what.find("chain of batch 0 (parameter 0)") != std::string::npos, what);
  BOOST_TEST(armed);
  std::size_t const params_bytes = 8 * (3000 + 5000 + 2048);
  BOOST_TEST(b.device_bytes_in_use() == params_bytes + 2 * rt.arena_bytes()); // both arenas kept
  rt.set_listener({});
  rt.step();
  BOOST_TEST(b.device_bytes_in_use() == params_bytes);
  m.set_grads(1);
  rt.step();
  auto const got = m.snapshot(rt);
  PIPESWAP_CHECK_NO_HAZARDS(b);
  for (std::size_t t = 0; t < ref.size(); ++t) BOOST_TEST((got[t] == ref[t]), "tensor " << t);
}

BOOST_AUTO_TEST_CASE(bad_configuration_is_rejected_with_clear_messages) {
  mock::backend b;
  ps::transfer_engine<mock::backend> x(b, small_pool());
  mock_model m(b, {16, 16}, 1, false);
  auto cfg = swap(0, true);
  BOOST_CHECK_EXCEPTION(
      (ps::optimizer_swap<toy_optimizer<mock::backend>>(x, m.opt, cfg)), ps::invalid_argument,
      [](auto const& e) { return std::string(e.what()) == "swap_config::swap_times must be positive."; });
  cfg = swap(2, true);
  cfg.state_keys = std::vector<std::string>{"exp_avg", "momentum", "bogus", "momentum"};
  BOOST_CHECK_EXCEPTION(
      (ps::optimizer_swap<toy_optimizer<mock::backend>>(x, m.opt, cfg)), ps::invalid_argument, [](auto const& e) {
        return std::string(e.what()) == "swap_config::state_keys only supports Adam/AdamW logical slots "
                                        "('exp_avg', 'exp_avg_sq', 'max_exp_avg_sq', 'master_param'), but got "
                                        "['bogus', 'momentum'].";
      });
  cfg.state_keys = std::vector<std::string>{"exp_avg", "exp_avg_sq", "exp_avg"};
  BOOST_CHECK_EXCEPTION(
      (ps::optimizer_swap<toy_optimizer<mock::backend>>(x, m.opt, cfg)), ps::invalid_argument, [](auto const& e) {
        return std::string(e.what()) == "swap_config::state_keys names 'exp_avg' twice; give each state key once";
      });
  // Nothing was lost: a valid runtime still builds and steps over the same optimizer.
  cfg.state_keys = std::vector<std::string>{"exp_avg"};
  ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, cfg);
  m.set_grads(0);
  rt.step();
  std::size_t swapped = 0;
  for (std::size_t i = 0; i < m.opt.slots().size(); ++i) swapped += rt.is_swappable(i);
  BOOST_TEST(swapped == 2u); // exp_avg of both parameters only
}

BOOST_AUTO_TEST_CASE_TEMPLATE(parameters_without_gradients_are_skipped_and_slots_stay_home, B, test_backends) {
  for (bool packed : {false, true}) {
    B b{options_for<B>()};
    ps::transfer_engine<B> x(b, small_pool());
    ps::test::model<B, toy_optimizer<B>> m(b, {100, 200, 300, 400}, 5, false);
    ps::optimizer_swap<toy_optimizer<B>> rt(x, m.opt, swap(2, packed));
    m.opt.set_has_grad(1, false);
    m.set_grads(0);
    auto const before = download(b, m.params[1], 800);
    rt.step();
    BOOST_TEST((download(b, m.params[1], 800) == before));
    for (auto const& batch : rt.last_plan()) {
      for (auto const& r : batch) BOOST_TEST(r.end - r.begin != 200u);
    }
    for (std::size_t i = 0; i < m.opt.slots().size(); ++i) BOOST_TEST(rt.slot_in(i, ps::residency::host));
    PIPESWAP_CHECK_NO_HAZARDS(b);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(plans_follow_the_parameters_that_have_gradients, B, test_backends) {
  // Equal sizes, so only the identity of the units distinguishes the steps' plans.
  auto run = [](ps::swap_config cfg) {
    B b{options_for<B>()};
    ps::transfer_engine<B> x(b, small_pool());
    ps::test::model<B, toy_optimizer<B>> m(b, {500, 500, 500, 500}, 9, false); // no masters: every unit looks the same
    ps::optimizer_swap<toy_optimizer<B>> rt(x, m.opt, cfg);
    std::vector<std::vector<bool>> const grads{{1, 1, 1, 1}, {0, 1, 1, 1}, {1, 0, 1, 1}, {1, 1, 1, 1}, {1, 1, 0, 0}};
    for (std::size_t s = 0; s < grads.size(); ++s) {
      for (std::size_t i = 0; i < 4; ++i) m.opt.set_has_grad(i, grads[s][i]);
      m.set_grads(s);
      rt.step();
    }
    PIPESWAP_CHECK_NO_HAZARDS(b);
    return m.snapshot(rt);
  };
  auto const ref = run(no_swap());
  for (bool packed : {false, true}) {
    auto const got = run(swap(2, packed));
    for (std::size_t t = 0; t < ref.size(); ++t) BOOST_TEST((got[t] == ref[t]), "packed " << packed << " tensor " << t);
  }
}

// ----- ownership of the state across runtimes ---------------------------------------------------------

namespace {

/// `before` steps under one runtime, then `after` steps under a second one built over the same
/// optimizer, on a B; every byte of the result.
template <class B>
std::vector<std::vector<std::byte>> rebuilt(ps::swap_config first, ps::swap_config second, int before, int after,
                                            bool split = false) {
  B b{options_for<B>()};
  ps::transfer_engine<B> x(b, small_pool());
  ps::test::model<B, toy_optimizer<B>> m(b, mixed_sizes, 7, true);
  std::size_t params_bytes = 0;
  for (auto n : mixed_sizes) params_bytes += 8 * n;
  int s = 0;
  {
    ps::optimizer_swap<toy_optimizer<B>> rt(x, m.opt, first);
    for (; s < before; ++s) {
      m.set_grads(static_cast<std::uint64_t>(s));
      rt.step();
    }
  }
  BOOST_TEST(!m.opt.swap_state().attached());
  // Between runtimes the unswappable state keeps its device storage, nothing else is on the device
  // (the mock counts device bytes).
  if constexpr (is_mock<B>) BOOST_TEST(b.device_bytes_in_use() >= params_bytes);
  std::vector<std::vector<std::byte>> out;
  auto run_second = [&](auto policy) {
    ps::optimizer_swap<toy_optimizer<B>, decltype(policy)> rt(x, m.opt, second, policy);
    for (; s < before + after; ++s) {
      m.set_grads(static_cast<std::uint64_t>(s));
      rt.step();
    }
    out = m.snapshot(rt);
  };
  if (split) {
    run_second(ps::split_partition{});
  } else {
    run_second(ps::balanced_partition{});
  }
  PIPESWAP_CHECK_NO_HAZARDS(b);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(a_rebuilt_runtime_continues_bit_exactly, B, test_backends) {
  auto const ref = train<B>(mixed_sizes, no_swap(), 4, true);
  struct change {
    char const* what;
    ps::swap_config first, second;
    bool split;
  };
  auto keys = [](ps::swap_config c, std::vector<std::string> k) {
    c.state_keys = std::move(k);
    return c;
  };
  std::vector<change> const changes{
      {"swap_times 3 to 7, packed", swap(3, true), swap(7, true), false},
      {"swap_times 2 to 5, per tensor", swap(2, false), swap(5, false), false},
      {"packed to per tensor", swap(4, true), swap(4, false), false},
      {"per tensor to packed", swap(4, false), swap(4, true), false},
      {"swap to no swap", swap(3, true), no_swap(), false},
      {"no swap to swap", no_swap(), swap(3, true), false},
      {"min_swap_numel 0 to 2048", swap(3, true), swap(3, true, 2048), false},
      {"exp_avg only to every key", keys(swap(3, false), {"exp_avg"}), swap(3, true), false},
      {"whole units to split units", swap(3, true), swap(5, true), true},
  };
  for (auto const& c : changes) {
    BOOST_TEST_CONTEXT(c.what) {
      auto const got = rebuilt<B>(c.first, c.second, 2, 2, c.split);
      BOOST_TEST_REQUIRE(got.size() == ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST((got[i] == ref[i]), "tensor " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_second_live_runtime_is_refused_and_nothing_leaks) {
  ps::test::sync_host_backend b;
  {
    ps::transfer_engine<ps::test::sync_host_backend> x(b, small_pool());
    ps::test::model<ps::test::sync_host_backend, toy_optimizer<ps::test::sync_host_backend>> m(b, mixed_sizes, 7, true);
    auto const base = b.device_bytes();
    {
      ps::optimizer_swap<toy_optimizer<ps::test::sync_host_backend>> rt(x, m.opt, swap(3, false, 1024));
      BOOST_CHECK_EXCEPTION((ps::optimizer_swap<toy_optimizer<ps::test::sync_host_backend>>(x, m.opt, swap(2, true))),
                            ps::state_error, [](auto const& e) {
                              return std::string(e.what()).find("already managed by another live optimizer_swap") !=
                                     std::string::npos;
                            });
      BOOST_TEST(m.opt.swap_state().attached()); // the refused one did not detach the live one
      m.set_grads(0);
      rt.step();
      BOOST_TEST(b.device_bytes() == base + rt.unswappable_bytes());
    }
    BOOST_TEST(!m.opt.swap_state().attached());
    {
      ps::optimizer_swap<toy_optimizer<ps::test::sync_host_backend>> rt(x, m.opt, swap(2, true));
      m.set_grads(1);
      rt.step();
    }
    x.pool().trim();
  }
  // Parameters, gradients, parked state, pinned memory: everything went back.
  BOOST_TEST(b.device_bytes() == 0u);
  BOOST_TEST(b.live_allocations() == 0u);
}

BOOST_AUTO_TEST_CASE(add_param_under_a_runtime_is_refused_and_works_after_it) {
  mock::backend b{recording()};
  ps::transfer_engine<mock::backend> x(b, small_pool());
  mock_model m(b, {3000, 5000}, 7, false);
  auto extra_p = b.allocate_device(2000 * 4, b.current_stream());
  auto extra_g = b.allocate_device(2000 * 4, b.current_stream());
  auto const slots_before = m.opt.slots().size();
  {
    ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(2, true));
    BOOST_CHECK_EXCEPTION(m.opt.add_param(extra_p, extra_g, 2000), ps::state_error, [](auto const& e) {
      return std::string(e.what()).find("toy_optimizer::add_param: an optimizer_swap runtime manages") == 0;
    });
    BOOST_TEST(m.opt.slots().size() == slots_before); // nothing changed
    m.set_grads(0);
    rt.step();
  }
  // Without a runtime the parameter is added; the next runtime adopts the old state and creates the
  // new parameter's.
  auto const i = m.opt.add_param(extra_p, extra_g, 2000);
  std::vector<float> g(2000, 0.5f);
  b.write_device(extra_g, {reinterpret_cast<std::byte const*>(g.data()), g.size() * 4});
  std::vector<float> p0(2000, 1.0f);
  b.write_device(extra_p, {reinterpret_cast<std::byte const*>(p0.data()), p0.size() * 4});
  {
    ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(3, true));
    m.set_grads(1);
    rt.step();
    rt.synchronize_host_mirrors();
    // The new parameter's moments started at zero: m = g, v = g², p = 1 - lr·g / (1 + g²).
    auto const mirror = rt.host_mirror(m.opt.slots().size() - 2); // its exp_avg
    std::vector<float> ea(2000);
    ps::detail::note_host_read(b, mirror.data(), mirror.size());
    std::memcpy(ea.data(), mirror.data(), mirror.size());
    BOOST_TEST(ea[0] == 0.5f);
    BOOST_TEST(i == 2u);
    float p = 0;
    auto const pbytes = b.read_device(extra_p, 4);
    std::memcpy(&p, pbytes.data(), 4);
    BOOST_TEST(p == 1.0f - 0.125f * 0.5f / (1.0f + 0.25f));
  }
  PIPESWAP_CHECK_NO_HAZARDS(b);
  b.deallocate_device(extra_p, 2000 * 4, b.current_stream());
  b.deallocate_device(extra_g, 2000 * 4, b.current_stream());
}

BOOST_AUTO_TEST_CASE(a_failing_listener_arrives_wrapped_and_the_step_resumes) {
  auto const ref = train(mixed_sizes, no_swap(), 2, false);
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      mock::backend b{recording()};
      ps::transfer_engine<mock::backend> x(b, small_pool());
      mock_model m(b, mixed_sizes, 7, false);
      ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(3, packed));
      bool thrown = false;
      rt.set_listener([&](std::string_view op) {
        if (op == "update:1" && !thrown) {
          thrown = true;
          throw std::runtime_error("listener failed");
        }
      });
      m.set_grads(0);
      auto const what = throws_step_error<std::runtime_error>([&] { rt.step(); });
      BOOST_TEST(what.find("update of batch 1") != std::string::npos, what);
      BOOST_TEST(what.find("listener failed") != std::string::npos, what);
      BOOST_TEST(rt.at_rest());
      rt.step(); // resumes from batch 1
      m.set_grads(1);
      rt.step();
      auto const got = m.snapshot(rt);
      PIPESWAP_CHECK_NO_HAZARDS(b);
      for (std::size_t t = 0; t < ref.size(); ++t) BOOST_TEST((got[t] == ref[t]), "tensor " << t);
    }
  }
}

BOOST_AUTO_TEST_CASE(synchronize_host_mirrors_brings_the_runtime_to_rest) {
  mock::backend b;
  ps::transfer_engine<mock::backend> x(b, small_pool());
  mock_model m(b, mixed_sizes, 7, false);
  ps::optimizer_swap<toy_optimizer<mock::backend>> rt(x, m.opt, swap(3, false, 100));
  m.set_grads(0);
  rt.step();
  rt.synchronize_host_mirrors();
  BOOST_TEST(rt.unswappable_bytes() > 0u);
  BOOST_TEST(ps::schedule::stage_layout(2, 3).stages_per_rank() == 3);
  BOOST_TEST(rt.at_rest());
}

BOOST_AUTO_TEST_CASE(a_buffer_without_storage_is_empty_not_host) {
  // "host" means the bytes are in the host mirror; a buffer with no storage is "empty".
  mock::backend b;
  ps::transfer_engine<mock::backend> x(b, small_pool());
  ps::swap_buffer<mock::backend> buf(64);
  BOOST_TEST((buf.state() == ps::residency::empty));
  BOOST_TEST(buf.at_rest());
  ps::swap_buffer<mock::backend>* one[] = {&buf};
  BOOST_CHECK_EXCEPTION(x.launch_load(one), ps::state_error, [](auto const& e) {
    return std::string(e.what()).find("is empty and has no host mirror") != std::string::npos;
  });
  x.allocate(buf, x.compute());
  BOOST_TEST((buf.state() == ps::residency::device));
  auto const d = x.take_device(buf);
  BOOST_TEST((buf.state() == ps::residency::empty));
  x.adopt_device(buf, d);
  x.discard_device(buf, x.compute()); // no mirror: nothing left
  BOOST_TEST((buf.state() == ps::residency::empty));
  auto blk = x.pool().allocate_for_host(64);
  x.set_mirror(buf, blk.ptr); // the mirror's bytes are its contents
  BOOST_TEST((buf.state() == ps::residency::host));
  x.launch_load(one);
  x.wait_load(one, x.compute());
  BOOST_TEST((buf.state() == ps::residency::device));
  x.discard_device(buf, x.compute()); // back to the mirror's bytes
  BOOST_TEST((buf.state() == ps::residency::host));
  x.release_mirror(buf); // a view: the block stays the test's
  x.pool().deallocate(blk, ps::record(b, x.h2d()));
}
