// The phases around the optimizer step (docs/optimizer.md, "Phases") on the mock: prefetch during a
// stand-in backward, the resident share, the deferred offload and the device budget, on both
// pipelines. Bit-exact against no swap over several steps with every phase in play; the hazard
// checker silent over sweeps of budgets, resident shares and swap_times; the budget's accounting
// against the mock's device timeline; a fault at every copy and allocation of every phase and at
// every phase boundary leaves nothing lost; lifetime misuse fails at the call.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/swap/checkpoint.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/sanitized.hpp"
#include "support/toy_optimizer.hpp"
#include "support/world.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::test::toy_optimizer;

namespace {

using toy = toy_optimizer<mock::backend>;
using mock_model = ps::test::model<mock::backend, toy>;
using runtime = ps::optimizer_swap<toy>;

ps::pinned_pool_options small_pool() { return {1 << 20, 1 << 18, 512}; }

mock::options recording(mock::timing_model t = mock::timing_model::unit()) {
  mock::options o{t};
  o.hazards = mock::hazard_policy::record;
  return o;
}

std::vector<std::size_t> const sizes{5000, 1, 0, 3, 2048, 1024, 777, 4096, 64, 1500, 2, 9000};
std::size_t params_bytes(std::vector<std::size_t> const& s) {
  std::size_t n = 0;
  for (auto x : s) n += 8 * x; // parameters and gradients
  return n;
}

/// How a training loop drives the phases.
struct phases {
  std::size_t resident_share = 0;
  bool defer = false;
  /// prefetch(max) after each backward; nullopt = never called.
  std::optional<std::size_t> prefetch;
  /// The budget's capacity; nullopt = no budget.
  std::optional<std::uint64_t> budget;
  /// How the loop ends a deferred offload before the next forward: 0 = leave it to prefetch()/step(),
  /// 1 = finish_offload() right after the step, 2 = a checkpoint save after the step.
  int finish = 0;
};

ps::swap_config config(std::size_t times, bool packed, phases const& p) {
  ps::swap_config c;
  c.swap_times = times;
  c.packed = packed;
  c.min_numel = 0;
  c.resident_share = p.resident_share;
  c.defer_offload = p.defer;
  return c;
}

ps::swap_config no_swap() {
  ps::swap_config c;
  c.state_keys = std::vector<std::string>{};
  c.packed = false;
  return c;
}

/// A stand-in forward or backward: a kernel on the compute stream that reads the parameters.
void stand_in(mock::backend& b, mock_model& m, char const* name, mock::sim_time cost) {
  mock::kernel_desc k{name, {}, {}, cost};
  for (std::size_t i = 0; i < m.sizes.size(); ++i) {
    if (m.sizes[i]) k.reads.push_back({m.params[i], m.sizes[i] * 4});
  }
  b.launch(b.current_stream(), k);
}

struct result {
  std::vector<std::vector<std::byte>> bytes;
  std::size_t hazards = 0;
  std::uint64_t high_water = 0;
  std::uint64_t over_budget = 0;
  std::size_t swap_peak = 0; ///< the mock's device peak above parameters, gradients and resident state
  std::size_t prefetched = 0; ///< the largest prefetch() result
  std::size_t resident = 0;   ///< resident_share_bytes()
  std::size_t window = 0;     ///< the streaming window: two arenas (packed) or two batches
};

/// `steps` steps of forward, backward (gradients written, prefetch() in its middle), step(): every
/// parameter and state byte at the end.
result train(std::vector<std::size_t> const& sz, ps::swap_config cfg, phases const& p, int steps,
             bool masters = true) {
  mock::backend b{recording()};
  ps::transfer_engine<mock::backend> x(b, small_pool());
  std::optional<ps::device_budget> budget;
  if (p.budget) {
    budget.emplace(*p.budget);
    x.set_budget(&*budget);
  }
  mock_model m(b, sz, 7, masters);
  result r;
  {
    runtime rt(x, m.opt, cfg);
    auto const base = b.device_bytes_in_use();
    for (int s = 0; s < steps; ++s) {
      stand_in(b, m, "forward", 20000);
      m.set_grads(static_cast<std::uint64_t>(s));
      stand_in(b, m, "backward", 20000);
      if (p.prefetch) r.prefetched = std::max(r.prefetched, rt.prefetch(*p.prefetch));
      stand_in(b, m, "backward tail", 20000);
      rt.step();
      if (p.defer && cfg.state_keys != std::vector<std::string>{}) {
        BOOST_TEST(rt.offload_pending() == (rt.swappable_bytes() > rt.resident_share_bytes()));
      }
      if (p.finish == 1) rt.finish_offload();
      if (p.finish == 2) (void)ps::checkpoint_to_bytes(rt);
      if (p.finish) BOOST_TEST(!rt.offload_pending());
    }
    std::size_t peak = 0;
    for (auto const& [t, live] : b.device_memory_timeline()) peak = std::max(peak, live);
    r.swap_peak = peak > base ? peak - base : 0;
    r.resident = rt.resident_share_bytes();
    r.window = 2 * (cfg.packed ? rt.arena_bytes() : rt.max_batch_bytes());
    r.bytes = m.snapshot(rt);
    BOOST_TEST(!rt.offload_pending());
    BOOST_TEST(rt.prefetched_batches() == 0u); // the snapshot brought everything home
  }
  r.hazards = b.hazards().size();
  if (budget) {
    r.high_water = budget->high_water();
    r.over_budget = budget->over_budget_count();
    BOOST_TEST(budget->used() == 0u); // every reserved byte came back
  }
  return r;
}

void check_equal(std::vector<std::vector<std::byte>> const& got, std::vector<std::vector<std::byte>> const& ref) {
  BOOST_TEST_REQUIRE(got.size() == ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST((got[i] == ref[i]), "tensor " << i);
}

} // namespace

BOOST_AUTO_TEST_SUITE(phased)

BOOST_AUTO_TEST_CASE(every_phase_is_bit_exact_against_no_swap) {
  auto const ref = train(sizes, no_swap(), {}, 4);
  BOOST_TEST(ref.hazards == 0u);
  std::vector<phases> const ps_list{
      {0, false, 0, std::nullopt, 0},          // prefetch(0): nothing
      {0, false, std::size_t{1}, std::nullopt, 0},
      {0, true, std::nullopt, std::nullopt, 0}, // deferred, finished by the next step
      {0, true, std::size_t{2}, std::nullopt, 0},
      {0, true, std::nullopt, std::nullopt, 1},
      {0, true, std::nullopt, std::nullopt, 2},
      {20000, false, std::nullopt, std::nullopt, 0},
      {20000, true, ~std::size_t{0}, std::nullopt, 0},
      {1 << 30, true, ~std::size_t{0}, std::nullopt, 0}, // everything resident
      {0, true, ~std::size_t{0}, std::nullopt, 0},       // everything prefetched
      {30000, true, ~std::size_t{0}, std::uint64_t{90000}, 0},
  };
  for (bool packed : {false, true}) {
    for (std::size_t k : {1u, 3u, 7u}) {
      for (std::size_t i = 0; i < ps_list.size(); ++i) {
        BOOST_TEST_CONTEXT("packed " << packed << " swap_times " << k << " phases #" << i) {
          auto const got = train(sizes, config(k, packed, ps_list[i]), ps_list[i], 4);
          BOOST_TEST(got.hazards == 0u);
          check_equal(got.bytes, ref.bytes);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(phased)

BOOST_AUTO_TEST_CASE(the_budget_bounds_prefetch_and_matches_the_device_timeline) {
  auto const ref = train(sizes, no_swap(), {}, 3);
  std::vector<std::uint64_t> const capacities{0, 12000, 30000, 60000, 120000, 1u << 30};
  for (bool packed : {false, true}) {
    for (std::size_t k : {3u, 7u}) {
      for (std::size_t share : {0u, 16000u}) {
        for (bool defer : {false, true}) {
          for (auto cap : capacities) {
            if (ps::test::sanitized_build && (k == 7 || cap == 12000 || cap == 60000)) continue; // sampled
            BOOST_TEST_CONTEXT("packed " << packed << " swap_times " << k << " share " << share << " defer "
                                         << defer << " capacity " << cap) {
              phases p{share, defer, ~std::size_t{0}, cap, 0};
              auto const got = train(sizes, config(k, packed, p), p, 3);
              BOOST_TEST(got.hazards == 0u);
              check_equal(got.bytes, ref.bytes);
              // What the budget counted bounds what the device held at every simulated instant.
              BOOST_TEST(got.swap_peak <= got.high_water);
              if (cap >= got.resident + got.window) { // the required part fits: so does everything
                BOOST_TEST(got.over_budget == 0u);
                BOOST_TEST(got.high_water <= cap);
              }
              if (cap == 0) { // nothing optional starts; what is required proceeds and is counted
                BOOST_TEST(got.prefetched == 0u);
                BOOST_TEST(got.over_budget > 0u);
                BOOST_TEST(got.high_water >= got.resident + got.window / 2);
              }
              if (cap == (1u << 30)) BOOST_TEST(got.prefetched == k); // everything when it fits
            }
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(phased_call_traces) {
  for (bool packed : {false, true}) {
    mock::backend b;
    ps::transfer_engine<mock::backend> x(b, small_pool());
    mock_model m(b, std::vector<std::size_t>(4, 16), 1, false);
    phases p;
    p.resident_share = packed ? 1024 : 128; // the first batch (two 64-byte slots; 512-byte arena)
    p.defer = true;
    runtime rt(x, m.opt, config(4, packed, p));
    std::vector<std::string> trace;
    rt.set_listener([&](std::string_view s) { trace.emplace_back(s); });
    for (int s = 0; s < 2; ++s) {
      m.set_grads(static_cast<std::uint64_t>(s));
      auto const n = rt.prefetch(1);
      trace.push_back("=> " + std::to_string(n));
      rt.step();
      trace.push_back("--");
    }
    std::string all;
    for (auto& t : trace) all += t + " ";
    // Step 1: no plan yet, nothing prefetched; the resident share is loaded into its own storage and
    // kept, the last offloads are deferred. Step 2: prefetch() finishes the deferred offload and
    // loads the first batch after the resident share; the step takes both first.
    std::string const per_tensor =
        "=> 0 prefetch:0 wait_prefetch:0 prefetch:1 update:0 keep:0 wait_prefetch:1 wait_offload:0 prefetch:2 "
        "update:1 offload:1 wait_prefetch:2 wait_offload:1 prefetch:3 update:2 offload:2 wait_prefetch:3 "
        "wait_offload:2 update:3 offload:3 defer:3 -- finish_deferred prefetch:1 => 2 wait_prefetch:0 update:0 "
        "keep:0 wait_prefetch:1 wait_offload:0 prefetch:2 update:1 offload:1 wait_prefetch:2 wait_offload:1 "
        "prefetch:3 update:2 offload:2 wait_prefetch:3 wait_offload:2 update:3 offload:3 defer:3 -- ";
    std::string const packed_trace =
        "=> 0 begin:4 prefetch:0:own prefetch:1:own prefetch:2:0 prefetch:3:1 wait_prefetch:0:own activate:0:own "
        "update:0 keep:0:own wait_prefetch:1:own activate:1:own update:1 keep:1:own wait_prefetch:2:0 "
        "activate:2:0 update:2 chain:2:None:0 wait_prefetch:3:1 activate:3:1 update:3 chain:3:None:1 defer:2 "
        "defer:3 end -- finish_deferred prefetch:2:own => 3 begin:4 prefetch:3:1 wait_prefetch:0:own "
        "activate:0:own update:0 keep:0:own wait_prefetch:1:own activate:1:own update:1 keep:1:own "
        "wait_prefetch:2:own activate:2:own update:2 offload:2:own wait_prefetch:3:1 activate:3:1 update:3 "
        "chain:3:None:1 defer:2 defer:3 end -- ";
    BOOST_TEST(all == (packed ? packed_trace : per_tensor));
    // A 16-element slot is 64 bytes: per tensor a batch is 128 bytes, packed a 512-byte arena.
    BOOST_TEST(rt.resident_share_bytes() == (packed ? 1024u : 128u));
    BOOST_TEST(rt.resident_batches() == (packed ? 2u : 1u));
  }
}

BOOST_AUTO_TEST_SUITE_END()
