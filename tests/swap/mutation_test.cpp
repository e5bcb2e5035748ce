// Mutation tests: the runtime with any one of its ordering waits removed must be caught — by the mock
// backend's hazard checker for data races, or by the memory bound for the wait that only orders a
// reuse of freed memory.
#define PIPESWAP_MUTATION_TESTING
#define BOOST_TEST_MODULE mutation
#include <boost/test/unit_test.hpp>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/toy_optimizer.hpp"
#include "support/world.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::detail::wait_site;

namespace {

struct outcome {
  std::size_t hazards = 0;
  std::size_t peak = 0;
  std::size_t bound = 0;
};

/// Three steps of four parameters in four batches. Gradients are uploaded once, so no host
/// synchronization between steps hides a missing stream wait.
outcome run(bool packed, std::initializer_list<wait_site> mutated) {
  ps::detail::mutated_sites = 0;
  for (auto m : mutated) ps::detail::mutated_sites |= 1u << static_cast<unsigned>(m);
  mock::options o;
  o.hazards = mock::hazard_policy::record;
  mock::backend b{o};
  ps::transfer_engine<mock::backend> x(b, {1 << 20, 1 << 18, 512});
  std::vector<std::size_t> const sizes{4000, 4000, 4000, 4000};
  ps::test::model<mock::backend, ps::test::toy_optimizer<mock::backend>> m(b, sizes, 3, true);
  ps::swap_config cfg;
  cfg.swap_times = 4;
  cfg.packed = packed;
  cfg.min_numel = 0;
  outcome r;
  m.set_grads(0); // before the runtime: nothing synchronizes the host after construction
  {
    ps::optimizer_swap<ps::test::toy_optimizer<mock::backend>> rt(x, m.opt, cfg);
    for (int s = 0; s < 3; ++s) rt.step();
    r.bound = 8 * 16000 + (packed ? 2 * rt.arena_bytes() : 2 * rt.max_batch_bytes());
    r.hazards = b.hazards().size();
    r.peak = b.peak_device_bytes();
    b.set_hazard_policy(mock::hazard_policy::ignore); // teardown of a broken run
  }
  ps::detail::mutated_sites = 0;
  return r;
}

} // namespace

BOOST_AUTO_TEST_CASE(the_unmutated_runtime_is_clean) {
  for (bool packed : {false, true}) {
    auto const r = run(packed, {});
    BOOST_TEST_MESSAGE("packed " << packed << " peak " << r.peak << " bound " << r.bound);
    BOOST_TEST(r.hazards == 0u);
    BOOST_TEST(r.peak <= r.bound);
  }
}

BOOST_AUTO_TEST_CASE(every_data_wait_is_necessary) {
  for (bool packed : {false, true}) {
    for (auto site : {wait_site::offload_after_compute, wait_site::use_after_load, wait_site::arena_reuse}) {
      if (!packed && site == wait_site::arena_reuse) continue; // packed only
      BOOST_TEST_CONTEXT("packed " << packed << " without " << ps::detail::to_string(site)) {
        BOOST_TEST(run(packed, {site}).hazards > 0u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_mirror_wait_backs_up_the_memory_gate) {
  // In the optimizer runtime the memory gate also orders each load behind the offload that filled its
  // mirror, so the mirror wait is a second line; without both, the race is there. (The activation
  // manager has no gate on its load stream and relies on the mirror wait alone.)
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      BOOST_TEST(run(packed, {wait_site::load_after_mirror}).hazards == 0u);
      BOOST_TEST(run(packed, {wait_site::load_after_mirror, wait_site::gate_after_offload}).hazards > 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_memory_gate_bounds_the_window) {
  // Without the gate the prefetch of batch n+1 (per-tensor) or the next step's arenas (packed)
  // allocate before the memory they replace is released.
  for (bool packed : {false, true}) {
    auto const r = run(packed, {wait_site::gate_after_offload});
    BOOST_TEST_CONTEXT("packed " << packed) {
      BOOST_TEST(r.hazards == 0u);
      BOOST_TEST(r.peak > r.bound);
    }
  }
}

BOOST_AUTO_TEST_CASE(activation_loads_rely_on_the_mirror_wait) {
  // offload → wait_offload (compute waits) → launch_load: the h2d stream is ordered behind the D2H
  // only by the mirror wait.
  for (bool mutated : {false, true}) {
    ps::detail::mutated_sites = mutated ? 1u << static_cast<unsigned>(wait_site::load_after_mirror) : 0u;
    mock::options o;
    o.hazards = mock::hazard_policy::record;
    mock::backend b{o};
    ps::transfer_engine<mock::backend> x(b, {1 << 20, 1 << 18, 512});
    ps::activation_swap<mock::backend> m(x);
    m.begin_run();
    ps::chunk_id const c{0, 0};
    {
      auto scope = m.forward(c);
      (void)m.save(b.allocate_device(4096, b.current_stream()), 4096);
    }
    m.launch_offload(c);
    m.wait_offload(c);
    m.launch_load(c);
    BOOST_TEST(b.hazards().size() == (mutated ? 1u : 0u));
    b.set_hazard_policy(mock::hazard_policy::ignore);
    m.wait_load(c);
    m.release(c);
    ps::detail::mutated_sites = 0;
  }
}
