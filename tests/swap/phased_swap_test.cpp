// The phases around the optimizer step (docs/optimizer.md, "Phases"), the bit-exact and budget sweeps
// on every backend of support/backend_list.hpp (CUDA in cuda_optimizer_swap), the rest on the mock:
// prefetch during a stand-in backward, the resident share, the deferred offload and the device
// budget, on both pipelines. Bit-exact against no swap over several steps with every phase in play; the hazard
// checker silent over sweeps of budgets, resident shares and swap_times; the budget's accounting
// against the mock's device timeline; a fault at every copy and allocation of every phase and at
// every phase boundary leaves nothing lost; lifetime misuse fails at the call.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/swap/checkpoint.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/backend_fixture.hpp"
#include "support/backend_list.hpp"
#include "support/sanitized.hpp"
#include "support/step_error_check.hpp"
#include "support/toy_optimizer.hpp"
#include "support/world.hpp"
#include "support/no_hazards.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::test::toy_optimizer;

namespace {

using toy = toy_optimizer<mock::backend>;
using mock_model = ps::test::model<mock::backend, toy>;
using runtime = ps::optimizer_swap<toy>;
using ps::test::is_mock;
using ps::test::test_backends;

ps::pinned_pool_options small_pool() { return {1 << 20, 1 << 18, 512}; }

mock::options recording(mock::timing_model t = mock::timing_model::unit()) {
  mock::options o{t};
  o.hazards = mock::hazard_policy::record;
  return o;
}

std::vector<std::size_t> const sizes{5000, 1, 0, 3, 2048, 1024, 777, 4096, 64, 1500, 2, 9000};

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
  c.min_swap_numel = 0;
  c.resident_share = p.resident_share;
  c.defer_offload = p.defer;
  return c;
}

using ps::test::no_swap;

/// A stand-in forward or backward: a kernel on the compute stream that reads the parameters.
void stand_in(mock::backend& b, mock_model& m, char const* name, mock::sim_time cost) {
  mock::kernel_desc k{name, {}, {}, cost};
  for (std::size_t i = 0; i < m.sizes.size(); ++i) {
    if (m.sizes[i]) k.reads.push_back({m.params[i], m.sizes[i] * 4});
  }
  b.launch(b.current_stream(), k);
}
/// On the threaded backend: work on the compute stream that reads every parameter byte. (Unused in
/// the mutated build, whose backend list is the mock alone.)
[[maybe_unused]] void
stand_in(ps::test::threaded_backend& b,
         ps::test::model<ps::test::threaded_backend, toy_optimizer<ps::test::threaded_backend>>& m, char const*,
         mock::sim_time) {
  std::vector<std::pair<ps::device_ptr, std::size_t>> regions;
  for (std::size_t i = 0; i < m.sizes.size(); ++i) {
    if (m.sizes[i]) regions.emplace_back(m.params[i], m.sizes[i] * 4);
  }
  b.launch(b.current_stream(), [regions] {
    unsigned sum = 0;
    for (auto const& [p, n] : regions) {
      for (auto const* c = p.get<unsigned char const>(); c != p.get<unsigned char const>() + n; ++c) sum += *c;
    }
    static_cast<void>(sum);
  });
}

#if defined(PIPESWAP_TEST_CUDA)
/// On CUDA: a host kernel on the compute stream that reads every parameter byte.
[[maybe_unused]] void stand_in(ps::cuda::backend& b,
                               ps::test::model<ps::cuda::backend, toy_optimizer<ps::cuda::backend>>& m, char const*,
                               mock::sim_time) {
  std::vector<mock::region> reads;
  for (std::size_t i = 0; i < m.sizes.size(); ++i) {
    if (m.sizes[i]) reads.push_back({m.params[i], m.sizes[i] * 4});
  }
  ps::test::cuda_host_kernels::run(b, b.current_stream(), reads, {}, [reads](auto const& k) {
    unsigned sum = 0;
    for (auto const& r : reads) {
      for (auto c : k.template read<unsigned char>(r.ptr, r.bytes)) sum += c;
    }
    static_cast<void>(sum);
  });
}
#endif

struct result {
  std::vector<std::vector<std::byte>> bytes;
  std::uint64_t high_water = 0;
  std::uint64_t over_budget = 0;
  std::size_t swap_peak = 0;  ///< the mock's device peak above parameters, gradients and unswappable state
  std::size_t prefetched = 0; ///< the largest prefetch() result
  std::size_t resident = 0;   ///< resident_share_bytes()
  std::size_t window = 0;     ///< the streaming window: two arenas (packed) or two batches
  std::size_t relayed = 0;    ///< prefetched batches offloaded early to relay a streamed one (packed)
};

/// `steps` steps of forward, backward (gradients written, prefetch() in its middle), step(): every
/// parameter and state byte at the end.
template <class B = mock::backend>
result train(std::vector<std::size_t> const& sz, ps::swap_config cfg, phases const& p, int steps, bool masters = true) {
  B b{ps::test::options_for<B>()};
  ps::transfer_engine<B> x(b, small_pool());
  std::optional<ps::device_budget> budget;
  if (p.budget) {
    budget.emplace(*p.budget);
    x.set_budget(&*budget);
  }
  ps::test::model<B, toy_optimizer<B>> m(b, sz, 7, masters);
  result r;
  {
    ps::optimizer_swap<toy_optimizer<B>> rt(x, m.opt, cfg);
    rt.set_listener([&](std::string_view op) { r.relayed += op.ends_with(":early"); });
    std::size_t base = 0;
    if constexpr (is_mock<B>) base = b.device_bytes_in_use();
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
    if constexpr (is_mock<B>) {
      std::size_t peak = 0;
      for (auto const& [t, live] : b.device_memory_timeline()) peak = std::max(peak, live);
      r.swap_peak = peak > base ? peak - base : 0;
    }
    r.resident = rt.resident_share_bytes();
    r.window = 2 * (cfg.packed ? rt.arena_bytes() : rt.max_batch_bytes());
    r.bytes = m.snapshot(rt);
    BOOST_TEST(!rt.offload_pending());
    BOOST_TEST(rt.prefetched_batches() == 0u); // the snapshot brought everything home
  }
  PIPESWAP_CHECK_NO_HAZARDS(b); // the mock's checker; a no-op on the threaded backend
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

BOOST_AUTO_TEST_CASE_TEMPLATE(every_phase_is_bit_exact_against_no_swap, B, test_backends) {
  auto const ref = train<B>(sizes, no_swap(), {}, 4);
  std::vector<phases> const ps_list{
      {0, false, 0, std::nullopt, 0}, // prefetch(0): nothing
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
      {0, true, std::size_t{4}, std::nullopt, 0}, // most batches prefetched: the rest relay
      {0, false, std::size_t{5}, std::nullopt, 0},
  };
  std::size_t relayed = 0;
  for (bool packed : {false, true}) {
    for (std::size_t k : {1u, 3u, 7u}) {
      for (std::size_t i = 0; i < ps_list.size(); ++i) {
        // Sanitizers, threaded backend: each phase setting with one swap_times, rotating (#11, the
        // relay, gets 7).
        if (ps::test::sanitized_build && !is_mock<B> && k != std::array{1u, 3u, 7u}[i % 3]) continue;
        BOOST_TEST_CONTEXT("packed " << packed << " swap_times " << k << " phases #" << i) {
          auto const got = train<B>(sizes, config(k, packed, ps_list[i]), ps_list[i], 4);
          check_equal(got.bytes, ref.bytes);
          relayed += got.relayed;
        }
      }
    }
  }
  BOOST_TEST(relayed > 0u); // the relay ran, and was bit-exact
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(phased)

BOOST_AUTO_TEST_CASE_TEMPLATE(the_budget_bounds_prefetch_and_matches_the_device_timeline, B, test_backends) {
  auto const ref = train<B>(sizes, no_swap(), {}, 3);
  std::vector<std::uint64_t> const capacities{0, 12000, 30000, 60000, 120000, 1u << 30};
  for (bool packed : {false, true}) {
    for (std::size_t k : {3u, 7u}) {
      for (std::size_t share : {0u, 16000u}) {
        for (bool defer : {false, true}) {
          for (auto cap : capacities) {
            if (ps::test::sanitized_build && (k == 7 || cap == 12000 || cap == 60000)) continue;      // sampled
            if (ps::test::sanitized_build && !is_mock<B> && share != (defer ? 16000u : 0u)) continue; // and more
            BOOST_TEST_CONTEXT("packed " << packed << " swap_times " << k << " share " << share << " defer " << defer
                                         << " capacity " << cap) {
              phases p{share, defer, ~std::size_t{0}, cap, 0};
              auto const got = train<B>(sizes, config(k, packed, p), p, 3);
              check_equal(got.bytes, ref.bytes);
              // What the budget counted bounds what the device held at every simulated instant.
              if constexpr (is_mock<B>) BOOST_TEST(got.swap_peak <= got.high_water);
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

namespace {

using ps::test::throws_step_error;

/// One training world driven through three steps with every phase on; `arm` is called before the
/// second step's prefetch() to inject a fault, and the loop recovers as a user would.
struct fault_world {
  mock::backend b{recording()};
  ps::transfer_engine<mock::backend> x{b, small_pool()};
  ps::device_budget budget{1u << 30};
  /// The model's tensor sizes (the no-swap reference trains the same ones).
  static inline std::vector<std::size_t> const sizes{3000, 64, 5000, 2048, 1, 4000};
  mock_model m{b, sizes, 7, true};
  std::optional<runtime> rt;

  std::size_t prefetches = 2; ///< prefetch() argument
  std::uint64_t warm;         ///< clean steps before the faulty one

  /// Clean steps before the faulty one: with the relay two, so that the faulty step's prefetch hands
  /// the arenas of a relayed step over.
  static std::uint64_t warm_steps(int mode) { return mode == 2 ? 2 : 1; }

  /// mode 0: per tensor, 1: packed, 2: packed with the relay (one batch per tensor, no resident
  /// share, the first three prefetched: batch 5 loads into what their early offloads free).
  explicit fault_world(int mode) : warm(warm_steps(mode)) {
    x.set_budget(&budget);
    phases p{45000, true, std::size_t{2}, std::nullopt, 0};
    if (mode == 2) {
      p.resident_share = 0;
      prefetches = 3;
    }
    rt.emplace(x, m.opt, config(mode == 2 ? sizes.size() : 4, mode != 0, p));
  }
  void one_step(std::uint64_t s) {
    m.set_grads(s);
    (void)rt->prefetch(prefetches);
    rt->step();
  }
  void warm_up() {
    for (std::uint64_t s = 0; s < warm; ++s) one_step(s);
  }
  /// The step after the warm-up with a fault armed: whichever call fails, nothing is lost and the
  /// loop goes on.
  std::string faulty_step() {
    m.set_grads(warm);
    std::string what;
    try {
      (void)rt->prefetch(prefetches);
    } catch (ps::step_error const& e) {
      what = e.what();
      BOOST_TEST(what.find("optimizer_swap::prefetch: ") == 0u, what);
      BOOST_TEST(what.find("nothing was lost") != std::string::npos, what);
      BOOST_TEST(!rt->has_interrupted_step());
      BOOST_TEST(rt->prefetched_batches() == 0u); // everything it kept went home
    }
    try {
      rt->step();
    } catch (ps::step_error const& e) {
      BOOST_TEST(what.empty()); // one fault, one failure
      what = e.what();
      BOOST_TEST(what.find("optimizer_swap::step: ") == 0u, what);
      if (rt->has_interrupted_step()) {
        BOOST_TEST(rt->at_rest()); // nothing in flight
        BOOST_TEST(!rt->offload_pending());
      } else { // it failed finishing the last step's deferred offload, before this step began
        BOOST_TEST(what.find("finish_deferred") != std::string::npos, what);
        BOOST_TEST(what.find("no step is pending") != std::string::npos, what);
        BOOST_TEST(rt->offload_pending());
      }
      rt->step(); // resumes, or runs the step
    }
    BOOST_TEST(!rt->has_interrupted_step());
    return what;
  }
  /// After the fault: the next step leaves every byte as the no-swap run's `ref` (warm + 2 steps),
  /// with no hazard and the budget empty.
  void next_step_is_exact(std::vector<std::vector<std::byte>> const& ref) {
    one_step(warm + 1);
    auto const got = m.snapshot(*rt);
    PIPESWAP_CHECK_NO_HAZARDS(b);
    BOOST_TEST(budget.used() == 0u);
    check_equal(got, ref);
  }
};

} // namespace

BOOST_AUTO_TEST_CASE(a_fault_at_every_copy_and_allocation_of_every_phase_loses_nothing) {
  for (int mode : {0, 1, 2}) {
    auto const ref = train(fault_world::sizes, no_swap(), {}, static_cast<int>(fault_world::warm_steps(mode)) + 2);
    for (auto site : {mock::fault_site::copy, mock::fault_site::allocation}) {
      std::size_t count = 0;
      {
        fault_world w(mode);
        w.warm_up();
        auto const before = w.b.attempts(site);
        w.one_step(w.warm);
        count = w.b.attempts(site) - before;
      }
      BOOST_TEST(count > 0u);
      for (std::size_t i = 0; i < count; ++i) {
        if (ps::test::sanitized_build && i % 3 != 0) continue; // sampled
        BOOST_TEST_CONTEXT("mode " << mode << " site " << static_cast<int>(site) << " index " << i) {
          fault_world w(mode);
          w.warm_up();
          w.b.fail_after(site, i);
          auto const what = w.faulty_step();
          BOOST_TEST(!what.empty());
          w.next_step_is_exact(ref.bytes);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_failure_at_every_phase_boundary_loses_nothing) {
  // The listener fails once at each operation of the second step (the deferred finish, prefetches
  // into own arenas, resident keeps, own offloads, deferrals among them).
  for (int mode : {0, 1, 2}) {
    auto const ref = train(fault_world::sizes, no_swap(), {}, static_cast<int>(fault_world::warm_steps(mode)) + 2);
    std::vector<std::string> ops;
    {
      fault_world w(mode);
      w.warm_up();
      w.rt->set_listener([&](std::string_view op) { ops.emplace_back(op); });
      w.one_step(w.warm);
      w.rt->set_listener({});
    }
    std::vector<std::vector<std::string>> const wanted{
        {"finish_deferred", "keep:0", "defer:3"},
        {"finish_deferred", "load:2:own", "keep:0:own", "offload:2:own", "defer:3"},
        // after a relayed step, batch 0 takes batch 2's arena; the relay: prefetched batch 0 leaves
        // as soon as it is updated, batch 5 loads into the storage it frees; the other prefetched
        // batches and batch 5 leave with the deferred offload
        {"finish_deferred:2", "finish_deferred", "offload:0:early", "load:5:own", "activate:5:own", "offload:1:own",
         "offload:5:own", "defer:5"}};
    for (auto const& want : wanted[static_cast<std::size_t>(mode)]) {
      BOOST_TEST((std::find(ops.begin(), ops.end(), want) != ops.end()), want);
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ps::test::sanitized_build && i % 4 != 0) continue; // sampled
      BOOST_TEST_CONTEXT("mode " << mode << " failing at " << ops[i] << " (#" << i << ")") {
        fault_world w(mode);
        w.warm_up();
        bool thrown = false;
        std::size_t seen = 0;
        w.rt->set_listener([&](std::string_view) {
          if (seen++ == i && !thrown) {
            thrown = true;
            throw std::runtime_error("listener failed");
          }
        });
        auto const what = w.faulty_step();
        BOOST_TEST(thrown);
        BOOST_TEST(what.find("listener failed") != std::string::npos, what);
        w.rt->set_listener({});
        w.next_step_is_exact(ref.bytes);
      }
    }
  }
}

// After a relayed step, a batch offloaded early has no own arena left: the next prefetch hands it the
// first large-enough arena the deferred offload leaves, behind that one batch's D2H, instead of
// finishing the whole deferred offload (which would wait every D2H of it).
BOOST_AUTO_TEST_CASE(a_relayed_step_hands_its_arenas_to_the_next_prefetch) {
  auto const ref = train(fault_world::sizes, no_swap(), {}, 3);
  fault_world w(2);
  w.warm_up(); // step 1 relays: batch 0 offloaded early, batch 5 in the storage it freed
  std::vector<std::string> ops;
  w.m.set_grads(2);
  w.rt->set_listener([&](std::string_view op) { ops.emplace_back(op); });
  BOOST_TEST(w.rt->prefetch(3) == 3u);
  w.rt->set_listener({});
  std::string all;
  for (auto const& op : ops) all += op + " ";
  // Batch 0 waits its own early D2H, then takes batch 2's arena (batch 1's is too small); batch 1
  // reuses its own; batch 2 gets new storage: one D2H waited per batch, none of the whole offload.
  BOOST_TEST(all == "finish_deferred:0 finish_deferred:2 load:0:own finish_deferred:1 load:1:own "
                    "load:2:own ");
  w.rt->step();
  auto const got = w.m.snapshot(*w.rt);
  PIPESWAP_CHECK_NO_HAZARDS(w.b);
  BOOST_TEST(w.budget.used() == 0u);
  check_equal(got, ref.bytes);
}

BOOST_AUTO_TEST_CASE(lifetime_misuse_fails_at_the_call) {
  auto has = [](std::string const& needle) {
    return [needle](ps::error const& e) { return std::string(e.what()).find(needle) != std::string::npos; };
  };
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      mock::backend b{recording()};
      ps::transfer_engine<mock::backend> x(b, small_pool());
      ps::device_budget budget(1u << 30);
      x.set_budget(&budget);
      mock_model m(b, {3000, 5000, 2048}, 7, false);
      phases p{0, true, std::nullopt, std::nullopt, 0};
      runtime rt(x, m.opt, config(3, packed, p));
      BOOST_TEST(rt.prefetch() == 0u); // no batch order before the first step
      m.set_grads(0);
      rt.step();
      BOOST_TEST(rt.offload_pending());
      // Everything fits next to the deferred storage; each batch waits only its own deferred D2H.
      BOOST_TEST(rt.prefetch() == 3u);
      rt.finish_offload();
      BOOST_TEST(!rt.offload_pending());
      // A parameter cannot join while its optimizer's state is managed, prefetched or not.
      auto extra_p = b.allocate_device(400, b.current_stream());
      auto extra_g = b.allocate_device(400, b.current_stream());
      BOOST_CHECK_EXCEPTION(m.opt.add_param(extra_p, extra_g, 100), ps::state_error,
                            has("toy_optimizer::add_param: an optimizer_swap runtime manages"));
      BOOST_TEST(rt.prefetched_batches() == 3u); // nothing changed
      // The budget cannot change while the runtime holds storage reserved in it.
      ps::device_budget other(1u << 30);
      BOOST_CHECK_EXCEPTION(x.set_budget(&other), ps::state_error,
                            has("transfer_engine::set_budget: the engine holds"));
      BOOST_TEST(x.budget() == &budget);
      // From inside a step (a listener) the runtime refuses to be called.
      rt.set_listener([&](std::string_view op) {
        if (op == "update:1") {
          BOOST_CHECK_EXCEPTION(rt.prefetch(), ps::state_error,
                                has("optimizer_swap::prefetch: called from inside step (a listener)"));
          BOOST_CHECK_EXCEPTION(rt.finish_offload(), ps::state_error,
                                has("optimizer_swap::finish_offload: called from inside step"));
        }
      });
      m.set_grads(1);
      rt.step();
      rt.set_listener({});
      // While an interrupted step is pending, prefetch() is refused; finishing the step first works.
      b.fail_after(mock::fault_site::copy, 1);
      BOOST_CHECK_THROW(rt.step(), ps::step_error);
      BOOST_TEST(rt.has_interrupted_step());
      BOOST_CHECK_EXCEPTION(rt.prefetch(), ps::state_error,
                            has("optimizer_swap::prefetch: a step is interrupted; call step() to resume it"));
      rt.step();
      BOOST_TEST(rt.prefetch() == 3u);
      rt.synchronize_host_mirrors();
      BOOST_TEST(rt.prefetched_batches() == 0u);
      BOOST_TEST(budget.used() == 0u);
      PIPESWAP_CHECK_NO_HAZARDS(b);
      b.deallocate_device(extra_p, 400, b.current_stream());
      b.deallocate_device(extra_g, 400, b.current_stream());
    }
  }
}

BOOST_AUTO_TEST_CASE(a_budget_destroyed_under_its_engine_is_detected) {
  mock::backend b{recording()};
  ps::transfer_engine<mock::backend> x(b, small_pool());
  mock_model m(b, {3000, 5000}, 7, false);
  {
    ps::device_budget budget(1u << 20);
    x.set_budget(&budget);
    BOOST_TEST(budget.engines() == 1u);
  } // destroyed while the engine still points at it
  BOOST_TEST(x.budget() == nullptr);
  auto const orphaned = [](ps::state_error const& e) {
    return std::string(e.what()).find("the engine's device_budget was destroyed while the engine still used it") !=
           std::string::npos;
  };
  BOOST_CHECK_EXCEPTION((runtime(x, m.opt, config(2, true, {}))), ps::state_error, orphaned);
  BOOST_TEST(!m.opt.swap_state().attached()); // the refused runtime left nothing behind
  ps::activation_swap<mock::backend> acts(x);
  acts.begin_run();
  {
    auto scope = acts.forward({0, 0});
    (void)acts.save(b.allocate_device(256, b.current_stream()), 256);
  }
  acts.launch_offload({0, 0});
  acts.wait_offload({0, 0});
  BOOST_CHECK_EXCEPTION(acts.launch_load({0, 0}), ps::state_error, orphaned);
  BOOST_TEST((acts.state({0, 0}) == ps::group_state::offloaded)); // nothing changed
  acts.end_run();
  // Setting a budget again (or none) makes the engine usable.
  ps::device_budget fresh(1u << 20);
  x.set_budget(&fresh);
  {
    runtime rt(x, m.opt, config(2, true, {}));
    m.set_grads(0);
    rt.step();
    BOOST_TEST(fresh.high_water() > 0u);
  }
  BOOST_TEST(fresh.used() == 0u);
  PIPESWAP_CHECK_NO_HAZARDS(b);
}

BOOST_AUTO_TEST_CASE(budget_accounting_rules) {
  ps::device_budget d(1000);
  d.reserve(ps::budget_client::activation, 300);
  BOOST_TEST(d.try_reserve(ps::budget_client::optimizer, 700));
  BOOST_TEST(!d.try_reserve(ps::budget_client::optimizer, 1));
  BOOST_TEST(d.refused_count() == 1u);
  d.reserve(ps::budget_client::activation, 100); // required: proceeds, counted
  BOOST_TEST(d.over_budget_count() == 1u);
  BOOST_TEST(d.used() == 1100u);
  BOOST_TEST(d.available() == 0u);
  BOOST_TEST(d.high_water() == 1100u);
  BOOST_CHECK_EXCEPTION(d.release(ps::budget_client::activation, 500), ps::state_error, [](auto const& e) {
    return std::string(e.what()) == "device_budget::release: the activation client returns 500 bytes but holds "
                                    "400; release only what was reserved";
  });
  d.release(ps::budget_client::optimizer, 700);
  d.release(ps::budget_client::activation, 400);
  BOOST_TEST(d.used() == 0u);
  // Reload demand stays free for activation loads: an optional reservation leaves it.
  d.add_reload_demand(600);
  BOOST_TEST(d.optional_room() == 400u);
  BOOST_TEST(!d.try_reserve(ps::budget_client::optimizer, 401));
  BOOST_TEST(d.try_reserve(ps::budget_client::optimizer, 400));
  d.drop_reload_demand(600);
  d.set_capacity(100); // below used(): nothing optional fits
  BOOST_TEST(d.optional_room() == 0u);
  BOOST_TEST(d.high_water() == 1100u);
  d.reset_high_water();
  BOOST_TEST(d.high_water() == 400u);
  BOOST_TEST(d.high_water(ps::budget_client::optimizer) == 400u);
}

BOOST_AUTO_TEST_CASE(strict_budget_rules) {
  ps::device_budget over(1000);
  BOOST_TEST((over.policy() == ps::budget_policy::overshoot)); // today's behaviour stays the default
  ps::device_budget d(1000, ps::budget_policy::strict);
  d.reserve(ps::budget_client::optimizer, 600);
  BOOST_CHECK_EXCEPTION(d.reserve(ps::budget_client::activation, 401), ps::budget_exceeded, [](auto const& e) {
    BOOST_TEST(e.requested() == 401u);
    BOOST_TEST(e.available() == 400u);
    BOOST_TEST((e.client() == ps::budget_client::activation));
    return std::string(e.what()) ==
           "device_budget::reserve: the activation client needs 401 bytes but the strict budget has 400 of 1000 "
           "bytes left; nothing was allocated (raise the capacity or free memory, then retry)";
  });
  BOOST_TEST(d.used() == 600u); // nothing changed
  BOOST_TEST(d.refused_count() == 1u);
  d.reserve(ps::budget_client::activation, 400); // exactly the room: made
  BOOST_TEST(d.used() == 1000u);
  BOOST_TEST(d.over_budget_count() == 0u);
  BOOST_CHECK_THROW(d.require_room(ps::budget_client::optimizer, 1), ps::budget_exceeded);
  d.reserve_unchecked(ps::budget_client::optimizer, 10); // memory already in use: counted, never refused
  BOOST_TEST(d.over_budget_count() == 1u);
  BOOST_TEST(d.high_water() == 1010u);
  d.set_policy(ps::budget_policy::overshoot);
  d.reserve(ps::budget_client::optimizer, 5);
  BOOST_TEST(d.used() == 1015u);
}

BOOST_AUTO_TEST_CASE(a_strict_budget_refuses_before_allocating_and_the_step_resumes) {
  // A budget smaller than one batch: the step's first reservation is refused, before its
  // allocation; no device byte is allocated by the failed call, the step is kept, and with room
  // given it resumes to the bytes of a run that never failed. Per tensor and packed, and through
  // activation_swap's loads.
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      auto const cfg = config(4, packed, {});
      auto const ref = train(sizes, cfg, {}, 2);
      mock::backend b{recording()};
      ps::transfer_engine<mock::backend> x(b, small_pool());
      ps::device_budget budget(std::uint64_t{1} << 30, ps::budget_policy::strict);
      x.set_budget(&budget);
      mock_model m(b, sizes, 7, true);
      std::vector<std::vector<std::byte>> got;
      {
        runtime rt(x, m.opt, cfg); // its masters are written on the device: room for them
        BOOST_TEST(budget.used() == 0u);
        budget.set_capacity(64);
        for (int s = 0; s < 2; ++s) {
          stand_in(b, m, "forward", 20000);
          m.set_grads(static_cast<std::uint64_t>(s));
          stand_in(b, m, "backward", 20000);
          stand_in(b, m, "backward tail", 20000);
          if (s == 0) {
            b.synchronize_device();
            auto const live = b.live_device_allocations();
            auto const bytes = b.device_bytes_in_use();
            auto const what = ps::test::throws_step_error<ps::budget_exceeded>([&] { rt.step(); });
            BOOST_TEST(what.find("strict budget has") != std::string::npos, what);
            BOOST_TEST(rt.has_interrupted_step());
            b.synchronize_device();
            BOOST_TEST(b.live_device_allocations() == live); // nothing allocated by the refused call
            BOOST_TEST(b.device_bytes_in_use() == bytes);
            BOOST_TEST(budget.used() == 0u);
            BOOST_TEST(budget.refused_count() >= 1u);
            budget.set_capacity(std::uint64_t{1} << 30);
          }
          rt.step(); // resumes the interrupted step, then a plain one
        }
        BOOST_TEST(budget.over_budget_count() == 0u);
        BOOST_TEST(budget.high_water() <= budget.capacity());
        got = m.snapshot(rt);
      }
      check_equal(got, ref.bytes);
      PIPESWAP_CHECK_NO_HAZARDS(b);
    }
  }
  // Activation loads: a load the strict budget cannot hold is refused with the group still
  // offloaded; with room it loads the same bytes.
  mock::backend b{recording()};
  ps::transfer_engine<mock::backend> x(b, small_pool());
  ps::device_budget budget(1000, ps::budget_policy::strict);
  x.set_budget(&budget);
  ps::activation_swap<mock::backend> acts(x);
  acts.begin_run();
  ps::schedule::chunk const c{0, 0};
  std::vector<std::byte> data(4096);
  ps::test::fill_pattern(data.data(), data.size(), 3);
  ps::activation_handle h;
  {
    auto scope = acts.forward(c);
    auto d = b.allocate_device(data.size(), b.current_stream());
    b.write_device(d, data);
    h = acts.save(d, data.size());
  }
  acts.launch_offload(c);
  acts.wait_offload(c);
  b.synchronize_device();
  auto const live = b.live_device_allocations();
  BOOST_CHECK_EXCEPTION(acts.launch_load(c), ps::budget_exceeded, [](auto const& e) {
    return std::string(e.what()).find("the activation client needs 4096 bytes but the strict budget has 1000") !=
           std::string::npos;
  });
  BOOST_TEST((acts.state(c) == ps::group_state::offloaded));
  BOOST_TEST(b.live_device_allocations() == live);
  budget.set_capacity(8192);
  acts.launch_load(c);
  acts.wait_load(c);
  // Read back by a copy on the compute stream, so that the hazard check below sees a use of the
  // loaded bytes (it fires when the use does not wait the load).
  auto* back = b.allocate_host(data.size());
  b.copy_d2h(back, acts.ptr(h), data.size(), b.current_stream());
  b.synchronize(b.record_event(b.current_stream()));
  BOOST_TEST((std::vector<std::byte>(back, back + data.size()) == data));
  b.deallocate_host(back, data.size());
  acts.release(c);
  acts.end_run();
  BOOST_TEST(budget.used() == 0u);
  PIPESWAP_CHECK_NO_HAZARDS(b);
}

BOOST_AUTO_TEST_CASE(activation_loads_take_precedence_over_prefetch) {
  // One engine, one budget, both jobs: while an activation group is offloaded, prefetch() leaves its
  // bytes free; once the group is loaded and released, the room comes back.
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      mock::backend b{recording()};
      ps::transfer_engine<mock::backend> x(b, small_pool());
      mock_model m(b, {4000, 4000, 4000, 4000}, 7, false); // 32000 state bytes per batch
      runtime rt(x, m.opt, config(4, packed, {}));
      m.set_grads(0);
      rt.step(); // the batch order is known from here on
      auto const batch = packed ? rt.arena_bytes() : rt.max_batch_bytes();
      // Room for the streaming window and exactly two prefetched batches.
      ps::device_budget budget(2 * batch + 2 * batch + batch / 2);
      x.set_budget(&budget);
      ps::activation_swap<mock::backend> acts(x);
      acts.begin_run();
      ps::schedule::chunk const c{0, 0};
      auto const act_bytes = 2 * batch;
      {
        auto scope = acts.forward(c);
        (void)acts.save(b.allocate_device(act_bytes, b.current_stream()), act_bytes);
      }
      acts.launch_offload(c);
      acts.wait_offload(c);
      BOOST_TEST(budget.reload_demand() == act_bytes);
      BOOST_TEST(acts.reload_demand() == act_bytes);
      // The window (two batches) and the demand leave half a batch: nothing optional starts.
      BOOST_TEST(rt.prefetch() == 0u);
      BOOST_TEST(budget.refused_count() == 1u);
      acts.launch_load(c); // required: reserved now, the demand is gone
      BOOST_TEST(budget.reload_demand() == 0u);
      BOOST_TEST(budget.used(ps::budget_client::activation) == act_bytes);
      acts.wait_load(c);
      BOOST_TEST(rt.prefetch() == 0u); // the loaded activations hold the room now
      acts.release(c);
      BOOST_TEST(budget.used(ps::budget_client::activation) == 0u);
      // Each prefetch leaves the window of the batches still to stream: 1 + 2, 2 + 2, 3 + 1, 4 + 0
      // batches, all within 4.5.
      BOOST_TEST(rt.prefetch() == 4u);
      BOOST_TEST(budget.used(ps::budget_client::optimizer) == 4 * batch);
      m.set_grads(1);
      rt.step();
      BOOST_TEST(budget.over_budget_count() == 0u);
      BOOST_TEST(budget.high_water() <= budget.capacity());
      BOOST_TEST(budget.high_water(ps::budget_client::activation) == act_bytes);
      rt.synchronize_host_mirrors();
      BOOST_TEST(budget.used() == 0u);
      PIPESWAP_CHECK_NO_HAZARDS(b);
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
    // kept, the last offloads are deferred. Step 2: prefetch() loads the first batch after the
    // resident share (packed: into the own arena its deferred D2H leaves, waiting only that D2H); the
    // step finishes the rest of the deferred offload, takes the resident and prefetched batches
    // first, and offloads the prefetched ones behind the streamed ones.
    std::string const per_tensor =
        "=> 0 load:0 wait_load:0 load:1 update:0 keep:0 wait_load:1 load:2 update:1 "
        "offload:1 wait_load:2 wait_offload:1 load:3 update:2 offload:2 wait_load:3 "
        "wait_offload:2 update:3 offload:3 defer:3 -- load:1 => 2 finish_deferred wait_load:0 "
        "update:0 keep:0 wait_load:1 load:2 update:1 wait_load:2 load:3 update:2 offload:2 "
        "wait_load:3 wait_offload:2 update:3 offload:3 offload:1 defer:3 defer:1 -- ";
    std::string const packed_trace =
        "=> 0 begin:4 load:0:own load:1:own load:2:0 load:3:1 wait_load:0:own "
        "activate:0:own update:0 keep:0:own wait_load:1:own activate:1:own update:1 keep:1:own "
        "wait_load:2:0 activate:2:0 update:2 chain:2:-:0 wait_load:3:1 activate:3:1 update:3 "
        "chain:3:-:1 defer:2 defer:3 end -- finish_deferred:2 load:2:own => 3 finish_deferred begin:4 "
        "load:3:1 wait_load:0:own activate:0:own update:0 keep:0:own wait_load:1:own "
        "activate:1:own update:1 keep:1:own wait_load:2:own activate:2:own update:2 wait_load:3:1 "
        "activate:3:1 update:3 chain:3:-:1 offload:2:own defer:2 defer:3 end -- ";
    BOOST_TEST(all == (packed ? packed_trace : per_tensor));
    // A 16-element slot is 64 bytes: per tensor a batch is 128 bytes, packed a 512-byte arena.
    BOOST_TEST(rt.resident_share_bytes() == (packed ? 1024u : 128u));
    BOOST_TEST(rt.resident_batches() == (packed ? 2u : 1u));
  }
}

BOOST_AUTO_TEST_SUITE_END()
