// The pipeline simulator (sim/pipeline.hpp): a hand-computed case pinned exactly (peak memory with
// and without activation and optimizer swap, time, bytes moved), saved activations intact after
// their round trip through host memory across a sweep of schedules, and clear errors for orders it
// cannot run.
#include <boost/test/unit_test.hpp>

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include <pipeswap/schedule/text.hpp>
#include <pipeswap/sim/pipeline.hpp>

#include "sim/tiny_scenario.hpp"
#include "support/sanitized.hpp"

namespace ps = pipeswap;
namespace sim = pipeswap::sim;
namespace sched = pipeswap::schedule;

namespace {

using ps::test::A;
using ps::test::D;
using ps::test::f;
using ps::test::H;
using ps::test::norms;
using ps::test::P;
using ps::test::tiny;

sim::sim_options opts(bool acts, bool optimizer) {
  sim::sim_options o;
  o.swap_activations = acts;
  o.swap_optimizer = optimizer;
  o.materialize = true;
  return o;
}

} // namespace

BOOST_AUTO_TEST_SUITE(sim_pipeline)

BOOST_AUTO_TEST_CASE(the_model_of_the_hand_computed_case_is_what_the_comment_says) {
  auto const st = sim::plan_stages(tiny());
  BOOST_TEST_REQUIRE(st.size() == 1u);
  BOOST_TEST(st[0].params == P);
  BOOST_TEST(st[0].boundary_bytes == D);
  BOOST_TEST(st[0].activation_bytes == (A + H) + D);
  BOOST_TEST(st[0].fwd_ns == f);
  BOOST_TEST(st[0].bwd_ns == 2 * f);
}

// GPipe on one rank, eight micro-batches: F0..F7 then B0..B7, every micro-batch swapped (the injected
// order is F0 LO0 F1 LO1 WO0 ... F6 LO6 WO5 LL0 F7 LO7 WO6 LL1 WL0 B0 WO7 LL2 WL1 B1 ...).
//
// Without swap all eight micro-batches' activations are live after F7: peak = 8(A + H + D) (H: the head's saved tensors, kept with the last layer's buffer).
// With swap, F_k's layer buffer goes to the host as F_k+1 runs (freed about 20 µs after F_k ends);
// loads are issued one compute entry ahead, so LL0 goes out as F6 starts and LL1 as F7 starts. At
// the start of F7 the device holds A6 (still copying out), A7, A0 and A1: peak = 8D + 4(A + H). Loads
// finish long before their backward, so the pipeline takes 8f + 16f either way.
BOOST_AUTO_TEST_CASE(gpipe_on_one_rank_saves_exactly_four_layer_buffers) {
  auto const s = tiny();
  std::uint64_t const base = s.device.reserved_bytes + 18 * P; // bf16 weights, fp32 grads, master and moments
  auto const plain = sim::simulate(s, opts(false, false));
  auto const swapped = sim::simulate(s, opts(true, false));
  BOOST_TEST_REQUIRE(plain.ranks.size() == 1u);
  BOOST_TEST_REQUIRE(swapped.ranks.size() == 1u);
  auto const& p = plain.ranks[0];
  auto const& w = swapped.ranks[0];
  BOOST_TEST(p.peak_bytes == base + 8 * (A + H + D));
  BOOST_TEST(w.peak_bytes == base + 8 * D + 4 * (A + H));
  BOOST_TEST(p.pipeline_ns == 24 * f);
  BOOST_TEST(w.pipeline_ns == 24 * f);
  BOOST_TEST(p.swapped_chunks == 0u);
  BOOST_TEST(w.swapped_chunks == 8u);
  BOOST_TEST(p.h2d_bytes == 0u);
  BOOST_TEST(p.d2h_bytes == 0u);
  BOOST_TEST(w.h2d_bytes == 8 * (A + H));
  BOOST_TEST(w.d2h_bytes == 8 * (A + H));
  BOOST_TEST(p.resident_param_bytes == 6 * P);
  BOOST_TEST(p.optimizer_state_bytes == 12 * P);
  BOOST_TEST(p.corrupt_buffers == 0u);
  BOOST_TEST(w.corrupt_buffers == 0u);
  // The memory curve starts at the resident bytes and ends with the activations gone.
  BOOST_TEST(w.memory.front().second == base);
  BOOST_TEST(w.memory.back().second == base);
  BOOST_TEST(w.memory.back().first == w.step_ns);
}

// Optimizer swap: between steps the device holds weights and gradients (6P) and the state of the
// norms only (12 bytes each); every other state byte crosses the link once each way in the step.
BOOST_AUTO_TEST_CASE(optimizer_swap_keeps_only_small_slots_on_the_device) {
  auto const s = tiny();
  auto const r = sim::simulate(s, opts(false, true)).ranks.at(0);
  BOOST_TEST(r.peak_bytes == s.device.reserved_bytes + 6 * P + 12 * norms + 8 * (A + H + D));
  BOOST_TEST(r.h2d_bytes == 12 * (P - norms));
  BOOST_TEST(r.d2h_bytes == 12 * (P - norms));
  BOOST_TEST(r.step_ns > r.pipeline_ns);
  auto const both = sim::simulate(s, opts(true, true)).ranks.at(0);
  BOOST_TEST(both.peak_bytes == s.device.reserved_bytes + 6 * P + 12 * norms + 8 * D + 4 * (A + H));
  BOOST_TEST(both.h2d_bytes == 12 * (P - norms) + 8 * (A + H));
}

BOOST_AUTO_TEST_CASE(the_filter_chooses_the_swapped_micro_batches) {
  auto o = opts(true, false);
  o.activation_filter = [](std::uint32_t, sched::chunk c) { return c.micro % 2 == 0; };
  auto const r = sim::simulate(tiny(), o).ranks.at(0);
  BOOST_TEST(r.swapped_chunks == 4u);
  BOOST_TEST(r.d2h_bytes == 4 * (A + H));
  BOOST_TEST(r.corrupt_buffers == 0u);
}

// A share of each group's layers (rank_settings::swapped_tenths): on ten layers, 3 tenths swap the
// first three layers' buffers of every micro-batch and keep the other seven on the device, which
// raises the peak by seven buffers per micro-batch held off the device at the peak; the data comes
// back intact, 10 tenths is every layer, and a share rounds up to whole layers.
BOOST_AUTO_TEST_CASE(a_share_of_the_layers_swaps_the_first_layers_and_keeps_the_rest) {
  auto s = tiny();
  s.model.layers = 10;
  auto const st = sim::plan_stages(s);
  BOOST_TEST_REQUIRE(st.size() == 1u);
  auto const layers = st[0].activation_bytes - st[0].boundary_bytes;
  auto const per = layers / 10; // one layer's buffer (the last also holds the remainder)
  auto const all = sim::simulate(s, opts(true, false)).ranks.at(0);
  auto o = opts(true, false);
  o.ranks.resize(1);
  o.ranks[0].swapped_tenths = 3;
  auto const part = sim::simulate(s, o).ranks.at(0);
  BOOST_TEST(part.swapped_chunks == 8u);
  BOOST_TEST(part.d2h_bytes == 8 * 3 * per);
  BOOST_TEST(part.h2d_bytes == 8 * 3 * per);
  BOOST_TEST(part.corrupt_buffers == 0u);
  BOOST_TEST(all.d2h_bytes == 8 * layers);
  // GPipe holds four groups' buffers at the peak with every layer swapping (above); the other
  // four groups now keep their last seven layers each.
  BOOST_TEST(part.peak_bytes == all.peak_bytes + 4 * (layers - 3 * per));
  o.ranks[0].swapped_tenths = 10;
  auto const ten = sim::simulate(s, o).ranks.at(0);
  BOOST_TEST(ten.d2h_bytes == all.d2h_bytes);
  BOOST_TEST(ten.peak_bytes == all.peak_bytes);
  BOOST_TEST(ten.step_ns == all.step_ns);
  BOOST_TEST(sim::sim_options::swapped_layers(1, 4) == 1u);
  BOOST_TEST(sim::sim_options::swapped_layers(5, 3) == 2u);
  BOOST_TEST(sim::sim_options::swapped_layers(9, 10) == 9u);
  BOOST_TEST(sim::sim_options::swapped_layers(10, 0) == 0u);
  for (std::uint32_t bad : {0u, 11u}) {
    o.ranks[0].swapped_tenths = bad;
    BOOST_CHECK_EXCEPTION(sim::simulate(s, o), ps::invalid_argument, [&](ps::invalid_argument const& e) {
      return std::string(e.what()) == "simulate: rank 0's swapped_tenths is " + std::to_string(bad) +
                                          "; a share of each group's layers is 1 to 10 tenths";
    });
  }
}

BOOST_AUTO_TEST_CASE(slow_copies_stall_the_pipeline_and_free_less) {
  auto s = tiny();
  s.device.h2d_gbps = s.device.d2h_gbps = 0.05; // a copy of A takes 20 ms, five forwards
  auto const plain = sim::simulate(s, opts(false, false)).ranks.at(0);
  auto const slow = sim::simulate(s, opts(true, false)).ranks.at(0);
  BOOST_TEST(slow.pipeline_ns > plain.pipeline_ns);
  BOOST_TEST(slow.corrupt_buffers == 0u);
  BOOST_TEST(slow.peak_bytes <= plain.peak_bytes);
}

// Every schedule kind over a sweep of shapes, activations and optimizer state swapped, the mock
// holding real bytes: no hazard (the simulator would throw), every saved activation comes back with
// the bytes its forward wrote, swapping never raises a rank's peak, and the sends all arrive.
BOOST_AUTO_TEST_CASE(sweep_every_schedule_hazard_free_with_data_intact) {
  // Under sanitizers a sample that still has M < R, M = R and M > R for every kind.
  bool const all = !ps::test::sanitized_build;
  auto const rank_list = all ? std::vector<std::uint32_t>{1, 2, 3, 4, 8} : std::vector<std::uint32_t>{1, 3, 8};
  auto const micro_list = all ? std::vector<std::uint32_t>{1, 2, 3, 5, 8, 13, 32} : std::vector<std::uint32_t>{1, 3, 8};
  auto const chunk_list = all ? std::vector<std::uint32_t>{1, 2, 3, 4} : std::vector<std::uint32_t>{1, 2, 3};
  std::size_t runs = 0, swapped_runs = 0;
  for (auto kind : {sim::schedule_kind::gpipe, sim::schedule_kind::one_f_one_b, sim::schedule_kind::interleaved}) {
    for (std::uint32_t ranks : rank_list) {
      for (std::uint32_t micro : micro_list) {
        for (std::uint32_t stages_per_rank : chunk_list) {
          for (bool overlap : {false, true}) {
            bool const inter = kind == sim::schedule_kind::interleaved;
            if (!inter && (stages_per_rank > 1 || overlap)) continue;
            if (micro == 32 && ranks < 8) continue;
            auto s = tiny(ranks, micro);
            s.model.layers = ranks * stages_per_rank;
            s.model.activation_bytes_per_layer = 4096;
            s.pipeline.schedule = kind;
            s.pipeline.stages_per_rank = stages_per_rank;
            s.pipeline.overlap_b_f = overlap;
            BOOST_TEST_CONTEXT("kind " << int(kind) << " ranks " << ranks << " micro " << micro << " stages_per_rank "
                                       << stages_per_rank << " overlap " << overlap) {
              auto const plain = sim::simulate(s, opts(false, false));
              auto const both = sim::simulate(s, opts(true, true));
              ++runs;
              std::uint32_t swapped = 0;
              for (std::uint32_t r = 0; r < ranks; ++r) {
                BOOST_TEST(both.ranks[r].corrupt_buffers == 0u);
                BOOST_TEST(both.ranks[r].peak_bytes <= plain.ranks[r].peak_bytes);
                BOOST_TEST(both.ranks[r].h2d_bytes == both.ranks[r].d2h_bytes);
                swapped += both.ranks[r].swapped_chunks;
              }
              swapped_runs += swapped > 0;
            }
          }
        }
      }
    }
  }
  BOOST_TEST(runs > (all ? 100u : 40u));
  BOOST_TEST(swapped_runs > runs / 2);
}

BOOST_AUTO_TEST_CASE(the_trace_has_one_process_per_rank) {
  auto o = opts(true, true);
  o.record_trace = true;
  auto s = tiny(2, 4);
  s.model.layers = 2;
  auto const r = sim::simulate(s, o);
  auto const j = nlohmann::json::parse(r.trace_json);
  std::set<std::string> processes;
  std::size_t complete = 0;
  for (auto const& e : j.at("traceEvents")) {
    if (e.at("name") == "process_name") processes.insert(e.at("args").at("name").get<std::string>());
    if (e.at("ph") == "X") ++complete;
  }
  BOOST_TEST((processes == std::set<std::string>{"rank 0", "rank 1"}));
  BOOST_TEST(complete > 16u); // at least the eight forwards and eight backwards
}

BOOST_AUTO_TEST_CASE(progress_reaches_one) {
  auto o = opts(false, false);
  std::vector<double> seen;
  o.progress = [&](double d) { seen.push_back(d); };
  (void)sim::simulate(tiny(), o);
  BOOST_TEST_REQUIRE(!seen.empty());
  BOOST_TEST(seen.back() == 1.0);
  BOOST_TEST(std::is_sorted(seen.begin(), seen.end()));
}

BOOST_AUTO_TEST_CASE(orders_it_cannot_run_are_rejected_with_the_reason) {
  auto const s = tiny(1, 2);
  auto run = [&](std::string const& text) {
    return sim::simulate_orders(s, {sched::order_from_text(text)}, opts(false, false));
  };
  auto says = [](std::string part) {
    return [part](std::exception const& e) {
      BOOST_TEST_MESSAGE(e.what());
      return std::string(e.what()).find(part) != std::string::npos;
    };
  };
  BOOST_CHECK_EXCEPTION(run("B0.0 F0.0 F0.1 B0.1"), ps::invalid_argument, says("not valid"));
  BOOST_CHECK_EXCEPTION(sim::simulate_orders(s, {}, opts(false, false)), ps::invalid_argument,
                        says("0 orders for 1 ranks"));
  // Still usable: a good order runs.
  BOOST_TEST(run("F0.0 F0.1 B0.0 B0.1").ranks.at(0).corrupt_buffers == 0u);
}

BOOST_AUTO_TEST_CASE(the_default_scenario_needs_swap_and_fits_with_it) {
  sim::scenario const s;
  auto const plain = sim::simulate(s, {});
  sim::sim_options both;
  both.swap_activations = both.swap_optimizer = true;
  auto const swapped = sim::simulate(s, both);
  BOOST_TEST(!plain.fits);
  BOOST_TEST(swapped.fits);
  BOOST_TEST(swapped.peak_bytes < plain.peak_bytes);
  BOOST_TEST(swapped.step_ns >= plain.step_ns);
  // All eight ranks share one node's host bandwidth: min(55, 278 / 8) GB/s × 0.7 each way.
  for (auto const& r : swapped.ranks) {
    BOOST_TEST(r.link.sharing == 8u);
    BOOST_TEST(r.link.h2d_gbps == 278.0 / 8 * 0.7, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(r.link.d2h_gbps == 278.0 / 8 * 0.7, boost::test_tools::tolerance(1e-12));
  }
  // Rank 0 keeps the most micro-batches in flight: its saving is the largest.
  BOOST_TEST(plain.ranks[0].peak_bytes - swapped.ranks[0].peak_bytes >
             plain.ranks[7].peak_bytes - swapped.ranks[7].peak_bytes);
}

BOOST_AUTO_TEST_SUITE_END() // sim_pipeline
