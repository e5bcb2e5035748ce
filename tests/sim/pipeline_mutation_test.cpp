// The simulator as a checker of the swap runtimes and of the pipeline executor it runs on: with any
// one of their data-ordering waits removed, a simulated step on a real schedule is caught by the mock
// backend's hazard checker.
#define PIPESWAP_MUTATION_TESTING
#include <boost/test/unit_test.hpp>

#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/sim/pipeline.hpp>

#include "sim/tiny_scenario.hpp"

namespace ps = pipeswap;
namespace sim = pipeswap::sim;
using ps::detail::wait_site;

namespace {

sim::scenario small() {
  auto s = ps::test::tiny(2, 8);
  s.model.layers = 4;
  s.model.activation_bytes_per_layer = 8192;
  s.pipeline.schedule = sim::schedule_kind::one_f_one_b;
  return s;
}

/// Runs the 1F1B step with activations and optimizer state swapped; true when a hazard stopped it.
bool caught(unsigned sites) {
  ps::detail::mutated_sites = sites;
  sim::sim_options o;
  o.swap_activations = o.swap_optimizer = true;
  o.swap_times = 4;
  o.materialize = true;
  bool hazard = false;
  try {
    (void)sim::simulate(small(), o);
  } catch (ps::mock::hazard_error const& e) {
    BOOST_TEST_MESSAGE(e.what());
    hazard = true;
  } catch (ps::step_error const& e) { // the optimizer step wraps the backend's error
    BOOST_TEST_MESSAGE(e.what());
    try {
      std::rethrow_if_nested(e);
    } catch (ps::mock::hazard_error const&) {
      hazard = true;
    } catch (...) {}
  }
  ps::detail::mutated_sites = 0;
  return hazard;
}

} // namespace

BOOST_AUTO_TEST_SUITE(sim_pipeline_mutation)

BOOST_AUTO_TEST_CASE(the_correct_runtime_passes) { BOOST_TEST(!caught(0)); }

// load_after_mirror is not in the list: in a simulated step the host issues every load after it
// waited for a compute entry that itself waited the offload, which orders the copies as well (in CUDA
// too). tests/swap/mutation_test.cpp shows that wait necessary where nothing else orders the copies.
// The same holds for the executor's exec_use_after_receive: the simulated host waits every receive
// (executor_options::host_waits_receives) before it issues the consumer; tests/exec/executor_test.cpp
// shows it necessary where the host does not. exec_send_after_compute is the simulated send's.
BOOST_AUTO_TEST_CASE(each_data_wait_is_necessary) {
  for (auto site : {wait_site::offload_after_compute, wait_site::use_after_load, wait_site::arena_reuse,
                    wait_site::exec_send_after_compute}) {
    BOOST_TEST(caught(1u << static_cast<unsigned>(site)), ps::detail::to_string(site));
  }
}

BOOST_AUTO_TEST_SUITE_END() // sim_pipeline_mutation
