// The overlapped swap in the simulator (swap.overlap, sim_options::overlap): without it the step is
// the reference step (and a second step repeats it exactly); with it the second of two steps is
// reported, the phased optimizer swap runs (resident share sized per rank, prefetch in the backward
// tail within the device budget, offload drained into the next forward) and activation loads go out
// early enough. Over a sweep of small scenarios of other shapes (rank counts, interleaved, a wider
// model, slower links) the overlap at least halves the optimizer-swap overhead, and of "both" where
// activation swap alone costs under 5 %, and every configuration that fits without it still fits.
// Every run holds real bytes (materialize): saved activations are checked in every backward, and the
// mock's hazard checker raises on any unordered access.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/sim/report.hpp>

#include "sim/tiny_scenario.hpp"

namespace sim = pipeswap::sim;
namespace sched = pipeswap::schedule;

namespace {

using pipeswap::test::tiny;

/// Small scenarios of other shapes: the link is slow enough that the optimizer step shows without
/// overlap, and the device too small for the run without swap.
std::vector<std::pair<std::string, sim::scenario>> overlap_shapes() {
  std::vector<std::pair<std::string, sim::scenario>> out;
  {
    auto s = tiny(4, 8);
    s.model.layers = 4;
    s.pipeline.schedule = sim::schedule_kind::one_f_one_b;
    s.device.h2d_gbps = s.device.d2h_gbps = 0.5;
    s.device.memory_bytes = 5'400'000;
    out.emplace_back("1F1B, 4 ranks, 8 micro-batches", s);
  }
  {
    auto s = tiny(2, 8);
    s.model.layers = 4;
    s.pipeline.schedule = sim::schedule_kind::interleaved;
    s.pipeline.stages_per_rank = 2;
    s.device.h2d_gbps = s.device.d2h_gbps = 0.5;
    s.device.memory_bytes = 6'000'000;
    out.emplace_back("interleaved, 2 ranks x 2 stages per rank, 8 micro-batches", s);
  }
  {
    auto s = tiny(2, 4);
    s.model.layers = 2;
    s.model.hidden = 128;
    s.model.ffn_hidden = 256;
    s.pipeline.schedule = sim::schedule_kind::one_f_one_b;
    s.device.h2d_gbps = s.device.d2h_gbps = 0.25;
    s.device.memory_bytes = 6'000'000;
    out.emplace_back("wider model, 2 ranks, 4 micro-batches, slower link", s);
  }
  return out;
}

sim::sim_result run(sim::scenario s, sim::swapping c, bool overlap) {
  s.swap.overlap = overlap;
  auto o = sim::options_for(c, s);
  o.materialize = true;
  return sim::simulate_sized(s, o);
}

double overhead(sim::sim_result const& x, sim::sim_result const& base) {
  return sim::overhead(x.step_ns, base.step_ns);
}

} // namespace

BOOST_AUTO_TEST_SUITE(sim_overlap)

BOOST_AUTO_TEST_CASE(without_overlap_a_second_step_repeats_the_first_exactly) {
  auto s = tiny(2, 8);
  s.model.layers = 2;
  s.pipeline.schedule = sim::schedule_kind::one_f_one_b;
  s.device.h2d_gbps = s.device.d2h_gbps = 0.5;
  for (auto c : sim::all_swappings) {
    s.swap.overlap = false;
    auto o = sim::options_for(c, s);
    o.materialize = true;
    BOOST_TEST(o.steps_to_run() == 1u);
    auto const one = sim::simulate(s, o);
    o.steps = 2;
    auto const two = sim::simulate(s, o);
    BOOST_TEST_REQUIRE(one.ranks.size() == two.ranks.size());
    for (std::size_t r = 0; r < one.ranks.size(); ++r) {
      BOOST_TEST_CONTEXT(sim::config_key(c) << ", rank " << r) {
        BOOST_TEST(one.ranks[r].step_ns == two.ranks[r].step_ns);
        BOOST_TEST(one.ranks[r].pipeline_ns == two.ranks[r].pipeline_ns);
        BOOST_TEST(one.ranks[r].peak_bytes == two.ranks[r].peak_bytes);
        BOOST_TEST(one.ranks[r].h2d_bytes == two.ranks[r].h2d_bytes);
        BOOST_TEST(one.ranks[r].d2h_bytes == two.ranks[r].d2h_bytes);
        BOOST_TEST(two.ranks[r].corrupt_buffers == 0u);
        // Nothing of the phases runs without overlap.
        BOOST_TEST(two.ranks[r].prefetched_batches == 0u);
        BOOST_TEST(two.ranks[r].resident_share_bytes == 0u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(with_overlap_the_step_without_swap_is_unchanged) {
  for (auto const& [name, s] : overlap_shapes()) {
    BOOST_TEST_CONTEXT(name) {
      auto const a = run(s, sim::swapping::none, false), b = run(s, sim::swapping::none, true);
      BOOST_TEST(a.step_ns == b.step_ns);
      BOOST_TEST(a.peak_bytes == b.peak_bytes);
    }
  }
}

BOOST_AUTO_TEST_CASE(overlap_halves_the_optimizer_overhead_and_keeps_every_fit) {
  bool prefetched = false, resident = false, streamed = false;
  for (auto const& [name, s] : overlap_shapes()) {
    BOOST_TEST_CONTEXT(name) {
      std::vector<sim::sim_result> off, on;
      for (auto c : sim::all_swappings) {
        off.push_back(run(s, c, false));
        on.push_back(run(s, c, true));
      }
      auto const none = static_cast<std::size_t>(sim::swapping::none);
      auto const acts = static_cast<std::size_t>(sim::swapping::activations);
      auto const opt = static_cast<std::size_t>(sim::swapping::optimizer);
      auto const both = static_cast<std::size_t>(sim::swapping::both);
      BOOST_TEST(!off[none].fits); // each shape needs swap
      for (std::size_t c = 0; c < 4; ++c) {
        BOOST_TEST_CONTEXT(sim::config_key(sim::all_swappings[c])) {
          if (off[c].fits) BOOST_TEST(on[c].fits);
          for (std::size_t r = 0; r < on[c].ranks.size(); ++r) {
            BOOST_TEST(on[c].ranks[r].corrupt_buffers == 0u);
            BOOST_TEST(off[c].ranks[r].corrupt_buffers == 0u);
          }
        }
      }
      // The optimizer step shows without overlap; the overlap hides at least half of it.
      BOOST_TEST(overhead(off[opt], off[none]) > 0.01);
      BOOST_TEST(overhead(on[opt], on[none]) <= overhead(off[opt], off[none]) / 2);
      if (overhead(off[acts], off[none]) < 0.05)
        BOOST_TEST(overhead(on[both], on[none]) <= overhead(off[both], off[none]) / 2);
      for (std::size_t c : {opt, both}) {
        for (auto const& r : on[c].ranks) {
          BOOST_TEST(r.optimizer_batches == s.swap.swap_times);
          BOOST_TEST(r.prefetched_batches <= r.optimizer_batches);
          BOOST_TEST(r.resident_share_bytes <= r.optimizer_state_bytes);
          prefetched = prefetched || (r.prefetched_batches > 0 && r.h2d_bytes > 0);
          resident = resident || (r.resident_share_bytes > 0 && r.h2d_bytes > 0);
          streamed = streamed || r.h2d_bytes > 0;
        }
      }
    }
  }
  // The sweep does exercise the phases: state really crosses the link under overlap, prefetched
  // batches and partial resident shares occur.
  BOOST_TEST(streamed);
  BOOST_TEST(prefetched);
  BOOST_TEST(resident);
}

BOOST_AUTO_TEST_CASE(the_resident_share_is_what_free_memory_allows) {
  auto s = overlap_shapes().back().second; // the wider model: its optimizer swap fits with a share
  s.swap.overlap = true;
  auto o = sim::options_for(sim::swapping::optimizer, s);
  // Without a share: each rank's peak before its backward tail is the room the share must fit beside.
  auto unsized = o;
  unsized.ranks.assign(s.pipeline.ranks, {});
  for (auto& r : unsized.ranks) r.resident_share = 0;
  auto const bare = sim::simulate(s, unsized);
  auto const on = sim::simulate_sized(s, o);
  BOOST_TEST_REQUIRE(on.fits);
  std::uint64_t kept = 0;
  for (std::size_t r = 0; r < on.ranks.size(); ++r) {
    auto const& x = on.ranks[r];
    BOOST_TEST(bare.ranks[r].resident_share_bytes == 0u);
    auto const room = s.device.memory_bytes - bare.ranks[r].peak_before_tail - s.device.memory_bytes / 200;
    BOOST_TEST(x.resident_share_bytes <= room, "rank " << r);
    BOOST_TEST(x.resident_share_bytes <= x.optimizer_state_bytes);
    kept += x.resident_share_bytes;
    // What is resident does not cross the link: the rank moves less than all its state.
    if (x.resident_share_bytes > 0) BOOST_TEST(x.h2d_bytes < bare.ranks[r].h2d_bytes);
  }
  BOOST_TEST(kept > 0u);
}

BOOST_AUTO_TEST_CASE(the_load_lookahead_covers_the_copy_of_a_chunk) {
  sim::scenario const s; // the built-in scenario
  auto const stages = sim::plan_stages(s);
  auto const links = sim::host_link_rates(s, std::vector<bool>(s.pipeline.ranks, true));
  auto const orders = sim::schedule_of(s);
  for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r) {
    auto const& st = stages[r];
    double const copy = s.device.copy_latency_us * 1e3 +
                        static_cast<double>(st.activation_bytes - st.boundary_bytes) / links[r].h2d_gbps;
    std::size_t gap = 0;
    for (auto const& c : sched::swap_candidates(orders[r])) gap = gap == 0 ? c.gap() : std::min(gap, c.gap());
    auto const want =
        gap == 0 ? 1
                 : std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(copy / static_cast<double>(st.fwd_ns))),
                                           1, std::max<std::size_t>(1, gap / 2));
    BOOST_TEST(sim::load_lookahead_for(s, stages, r, links[r]) == want, "rank " << r);
  }
  // Rank 0: 10 layers of 1.125 GB over 278 / 8 × 0.7 GB/s take 0.46 s, between three and four
  // forwards.
  BOOST_TEST(sim::load_lookahead_for(s, stages, 0, links[0]) == 4u);
  // The simulated orders are the injector's with that option.
  auto s2 = tiny(2, 8);
  s2.model.layers = 2;
  s2.pipeline.schedule = sim::schedule_kind::one_f_one_b;
  sim::sim_options o;
  o.swap_activations = true;
  o.load_lookahead = 2;
  auto const a = sim::simulate(s2, o);
  auto const b = sim::simulate_orders(
      s2, sim::inject_all(sim::schedule_of(s2), {}, [](std::uint32_t) { return std::size_t{2}; }), o);
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    BOOST_TEST(a.ranks[r].step_ns == b.ranks[r].step_ns);
    BOOST_TEST(a.ranks[r].peak_bytes == b.ranks[r].peak_bytes);
    BOOST_TEST(a.ranks[r].load_lookahead == (a.ranks[r].swapped_chunks > 0 ? 2u : 1u));
  }
}

// The offload wait delay: sized like the load lookahead, over the device-to-host rate; the
// simulated orders are the injector's with that option; in a pipeline fill whose offloads are slower
// than its forwards the delayed waits stop holding the forwards (the step gets shorter: 224.6 ms
// against 228.8), the data survives the round trip, and the peak does not fall.
BOOST_AUTO_TEST_CASE(the_offload_wait_delay_keeps_the_fill_from_waiting) {
  {
    sim::scenario const s; // the built-in scenario: rank 0's 11.25 GB take 0.46 s, three to four forwards
    auto const stages = sim::plan_stages(s);
    auto const links = sim::host_link_rates(s, std::vector<bool>(s.pipeline.ranks, true));
    BOOST_TEST(sim::offload_wait_delay_for(s, stages, 0, links[0]) == 4u);
    auto slow = links[0];
    slow.d2h_gbps = links[0].d2h_gbps / 8; // 22 forwards, clamped to half the shortest gap (9 slots)
    BOOST_TEST(sim::offload_wait_delay_for(s, stages, 0, slow) == 4u);
    BOOST_TEST(sim::offload_wait_delay_for(s, stages, 7, links[7]) == 1u); // the last rank swaps nothing
  }
  auto s = tiny(8, 16);
  s.model.layers = 8;
  s.pipeline.schedule = sim::schedule_kind::one_f_one_b;
  s.device.h2d_gbps = s.device.d2h_gbps = 0.2; // 1 MB per chunk: 5 ms against a 3.4 ms forward
  s.swap.overlap = true;
  auto o = sim::options_for(sim::swapping::activations, s);
  o.materialize = true;
  BOOST_REQUIRE(o.ranks.size() == 8u);
  BOOST_TEST(*o.ranks[0].offload_wait_delay == 2u);
  auto const delayed = sim::simulate(s, o);
  auto const orders = sim::inject_all(
      sim::schedule_of(s), {},
      std::function<sched::inject_options(std::uint32_t)>([&](std::uint32_t r) { return o.inject_options_of(r); }));
  auto const same = sim::simulate_orders(s, orders, o);
  for (auto& x : o.ranks) x.offload_wait_delay = 1;
  auto const reference = sim::simulate(s, o);
  BOOST_TEST(delayed.step_ns == same.step_ns);
  BOOST_TEST(delayed.step_ns < reference.step_ns);
  BOOST_TEST(delayed.peak_bytes >= reference.peak_bytes); // the later waits keep chunks longer
  for (std::size_t r = 0; r < 8; ++r) {
    BOOST_TEST(delayed.ranks[r].corrupt_buffers == 0u);
    BOOST_TEST(delayed.ranks[r].offload_wait_delay == (delayed.ranks[r].swapped_chunks > 0 ? 2u : 1u));
  }
  BOOST_TEST_MESSAGE("offload wait delay: " << delayed.step_ns << " ns against " << reference.step_ns);
}

BOOST_AUTO_TEST_CASE(rank_settings_must_match_the_ranks) {
  auto s = tiny(2, 4);
  s.model.layers = 2;
  sim::sim_options o;
  o.overlap = true;
  o.swap_optimizer = true;
  o.ranks.resize(3);
  BOOST_CHECK_EXCEPTION(sim::simulate_sized(s, o), pipeswap::invalid_argument, [](auto const& e) {
    return std::string(e.what()).find("3 rank settings for 2 ranks") != std::string::npos;
  });
}

BOOST_AUTO_TEST_SUITE_END() // sim_overlap
