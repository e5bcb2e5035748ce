// Mutation tests: the runtimes with any one of their ordering waits removed must be caught — by the
// mock backend's hazard checker for data races, or by the memory bound for the wait that only orders
// a reuse of freed memory. Every wait site is reached by both optimizer pipelines (or by the one it
// belongs to), by checkpoints and by the activation manager, and each is shown necessary or, where
// it backs up another wait, shown to be the only guard in the case it exists for.
#define PIPESWAP_MUTATION_TESTING
#define BOOST_TEST_MODULE mutation
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <iterator>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/detail/mutation.hpp>
#include <pipeswap/swap/checkpoint.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/toy_optimizer.hpp"
#include "support/world.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::detail::wait_site;

namespace {

using toy = ps::test::toy_optimizer<mock::backend>;

struct outcome {
  std::size_t hazards = 0;
  std::size_t peak = 0;
  std::size_t bound = 0;
};

void mutate(std::initializer_list<wait_site> mutated) {
  ps::detail::mutated_sites = 0;
  for (auto m : mutated) ps::detail::mutated_sites |= 1u << static_cast<unsigned>(m);
}

void reset_hits() { std::fill(std::begin(ps::detail::site_hits), std::end(ps::detail::site_hits), 0ul); }
unsigned long hits(wait_site s) { return ps::detail::site_hits[static_cast<unsigned>(s)]; }

mock::backend recording_backend() {
  mock::options o;
  o.hazards = mock::hazard_policy::record;
  return mock::backend{o};
}

/// Three steps of four parameters in four batches. Gradients are uploaded once, so no host
/// synchronization between steps hides a missing stream wait.
outcome run(bool packed, std::initializer_list<wait_site> mutated) {
  mutate(mutated);
  auto b = recording_backend();
  ps::transfer_engine<mock::backend> x(b, {1 << 20, 1 << 18, 512});
  std::vector<std::size_t> const sizes{4000, 4000, 4000, 4000};
  ps::test::model<mock::backend, toy> m(b, sizes, 3, true);
  ps::swap_config cfg;
  cfg.swap_times = 4;
  cfg.packed = packed;
  cfg.min_swap_numel = 0;
  outcome r;
  m.set_grads(0); // before the runtime: nothing synchronizes the host after construction
  {
    ps::optimizer_swap<toy> rt(x, m.opt, cfg);
    for (int s = 0; s < 3; ++s) rt.step();
    r.bound = 8 * 16000 + (packed ? 2 * rt.arena_bytes() : 2 * rt.max_batch_bytes());
    r.hazards = b.hazards().size();
    r.peak = b.peak_device_bytes();
    b.set_hazard_policy(mock::hazard_policy::ignore); // teardown of a broken run
  }
  ps::detail::mutated_sites = 0;
  return r;
}

/// A packed step whose first prefetch copy fails: the staging arenas were allocated on the h2d
/// stream, and the failed step releases them with no copy in between.
std::size_t failed_prefetch(std::initializer_list<wait_site> mutated) {
  mutate(mutated);
  auto b = recording_backend();
  ps::transfer_engine<mock::backend> x(b, {1 << 20, 1 << 18, 512});
  ps::test::model<mock::backend, toy> m(b, {4000, 4000, 4000, 4000}, 3, false);
  ps::swap_config cfg;
  cfg.swap_times = 4;
  cfg.min_swap_numel = 0;
  m.set_grads(0);
  std::size_t hazards = 0;
  {
    ps::optimizer_swap<toy> rt(x, m.opt, cfg);
    b.fail_after(mock::fault_site::copy, 0);
    BOOST_CHECK_THROW(rt.step(), ps::step_error);
    hazards = b.hazards().size();
    b.set_hazard_policy(mock::hazard_policy::ignore);
  }
  ps::detail::mutated_sites = 0;
  return hazards;
}

/// A checkpoint round trip of state that stays on the device (min_swap_numel above every size): a save
/// right after a step (its D2H must wait the step's updates) and a load followed by a step (the step
/// must wait the H2D of the loaded bytes).
std::size_t checkpoint_round_trip(std::initializer_list<wait_site> mutated) {
  auto b = recording_backend();
  ps::transfer_engine<mock::backend> x(b, {1 << 20, 1 << 18, 512});
  ps::test::model<mock::backend, toy> m(b, {4000, 4000}, 3, false);
  ps::swap_config cfg;
  cfg.min_swap_numel = 1 << 20; // nothing swaps: every slot is resident
  std::size_t hazards = 0;
  {
    ps::optimizer_swap<toy> rt(x, m.opt, cfg);
    m.set_grads(0);
    mutate(mutated);
    rt.step();
    auto const file = ps::checkpoint_to_bytes(rt);
    ps::load_checkpoint_from_bytes(rt, file);
    rt.step();
    ps::detail::mutated_sites = 0;
    hazards = b.hazards().size();
    b.set_hazard_policy(mock::hazard_policy::ignore);
  }
  return hazards;
}

} // namespace

BOOST_AUTO_TEST_CASE(the_unmutated_runtimes_are_clean_and_reach_every_wait) {
  for (bool packed : {false, true}) {
    reset_hits();
    auto const r = run(packed, {});
    BOOST_TEST_MESSAGE("packed " << packed << " peak " << r.peak << " bound " << r.bound);
    BOOST_TEST(r.hazards == 0u);
    BOOST_TEST(r.peak <= r.bound);
    BOOST_TEST_CONTEXT("packed " << packed) {
      for (auto site : {wait_site::offload_after_compute, wait_site::gate_after_offload, wait_site::load_after_mirror,
                        wait_site::use_after_load}) {
        BOOST_TEST(hits(site) > 0u, ps::detail::to_string(site));
      }
      BOOST_TEST((hits(wait_site::arena_reuse) > 0u) == packed);
      BOOST_TEST((hits(wait_site::arena_release) > 0u) == packed);
    }
  }
  reset_hits();
  BOOST_TEST(checkpoint_round_trip({}) == 0u);
  BOOST_TEST(hits(wait_site::offload_after_compute) > 0u); // the save's D2H of unswappable state
  BOOST_TEST(hits(wait_site::use_after_load) > 0u);        // the load's H2D into fresh storage
  BOOST_TEST(failed_prefetch({}) == 0u);
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

BOOST_AUTO_TEST_CASE(the_arena_release_wait_guards_an_interrupted_step) {
  // In a complete step every arena is released behind a D2H out of it, which is behind the compute
  // work, which waited the H2Ds: the release wait is a second line. When a step fails before any
  // copy, it is the only thing ordering the release behind the arenas' allocation.
  BOOST_TEST(run(true, {wait_site::arena_release}).hazards == 0u);
  BOOST_TEST(failed_prefetch({wait_site::arena_release}) > 0u);
}

BOOST_AUTO_TEST_CASE(checkpoint_copies_need_their_waits) {
  BOOST_TEST(checkpoint_round_trip({wait_site::offload_after_compute}) > 0u);
  BOOST_TEST(checkpoint_round_trip({wait_site::use_after_load}) > 0u);
}

BOOST_AUTO_TEST_CASE(activation_loads_rely_on_the_mirror_wait) {
  // offload → wait_offload (compute waits) → launch_load: the h2d stream is ordered behind the D2H
  // only by the mirror wait.
  for (bool mutated : {false, true}) {
    reset_hits();
    ps::detail::mutated_sites = mutated ? 1u << static_cast<unsigned>(wait_site::load_after_mirror) : 0u;
    auto b = recording_backend();
    ps::transfer_engine<mock::backend> x(b, {1 << 20, 1 << 18, 512});
    ps::activation_swap<mock::backend> m(x);
    m.begin_run();
    ps::schedule::chunk const c{0, 0};
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
    // The manager reaches the four waits of the life cycle.
    for (auto site : {wait_site::offload_after_compute, wait_site::gate_after_offload, wait_site::load_after_mirror,
                      wait_site::use_after_load}) {
      BOOST_TEST(hits(site) > 0u, ps::detail::to_string(site));
    }
  }
}

BOOST_AUTO_TEST_CASE(activation_data_waits_are_necessary) {
  // Without the offload's wait the D2H reads bytes the forward is still writing; without the load's
  // wait the backward reads bytes the H2D is still writing.
  for (auto site : {wait_site::offload_after_compute, wait_site::use_after_load}) {
    BOOST_TEST_CONTEXT("without " << ps::detail::to_string(site)) {
      mutate({site});
      auto b = recording_backend();
      ps::transfer_engine<mock::backend> x(b, {1 << 20, 1 << 18, 512});
      ps::activation_swap<mock::backend> m(x);
      m.begin_run();
      ps::schedule::chunk const c{0, 0};
      auto const d = b.allocate_device(4096, b.current_stream());
      b.launch(b.current_stream(), {"forward", {}, {{d, 4096}}, std::nullopt});
      ps::activation_handle h;
      {
        auto scope = m.forward(c);
        h = m.save(d, 4096);
      }
      m.launch_offload(c);
      m.wait_offload(c);
      m.launch_load(c);
      m.wait_load(c);
      b.launch(b.current_stream(), {"backward", {{m.ptr(h), 4096}}, {}, std::nullopt});
      BOOST_TEST(b.hazards().size() > 0u);
      b.set_hazard_policy(mock::hazard_policy::ignore);
      m.release(c);
      ps::detail::mutated_sites = 0;
    }
  }
}

// ----- the phases around the step: prefetch, resident share, deferred offload, budget -------------

namespace {

/// The runtime's world for the phased and make_room cases: a recording mock whose offloads are ten
/// times slower than its loads (a release on the d2h stream lands long after the h2d stream could
/// allocate again, so a missing order shows in the device timeline), an engine with a budget large
/// enough to count everything and refuse nothing, four parameters with their gradients uploaded
/// once, and swap in four batches.
struct slow_offload_rig {
  mock::backend b;
  ps::transfer_engine<mock::backend> x;
  ps::device_budget budget;
  ps::test::model<mock::backend, toy> m;
  ps::swap_config cfg;

  slow_offload_rig(bool packed, bool defer, std::size_t resident)
      : b(options()), x(b, {1 << 20, 1 << 18, 512}), budget(1u << 30), m(b, {4000, 4000, 4000, 4000}, 3, true) {
    x.set_budget(&budget);
    cfg.swap_times = 4;
    cfg.packed = packed;
    cfg.min_swap_numel = 0;
    cfg.defer_offload = defer;
    cfg.resident_share = resident;
    m.set_grads(0);
  }

private:
  static mock::options options() {
    auto t = mock::timing_model::unit();
    t.d2h = {100'000'000, 0};
    mock::options o{t};
    o.hazards = mock::hazard_policy::record;
    return o;
  }
};

struct phased_outcome {
  std::size_t hazards = 0;
  std::size_t swap_peak = 0; ///< the mock's device peak above parameters and gradients
  std::uint64_t counted = 0; ///< the budget's high-water mark
};

/// Three steps, each preceded by prefetch() of every batch, with a budget large enough to count
/// everything and refuse nothing. The gradients are uploaded once, as in run().
phased_outcome run_phased(bool packed, bool defer, std::size_t resident, std::initializer_list<wait_site> mutated) {
  mutate(mutated);
  slow_offload_rig rig(packed, defer, resident);
  auto& [b, x, budget, m, cfg] = rig;
  phased_outcome r;
  {
    ps::optimizer_swap<toy> rt(x, m.opt, cfg);
    auto const base = b.device_bytes_in_use();
    for (int s = 0; s < 3; ++s) {
      (void)rt.prefetch();
      rt.step();
    }
    rt.finish_offload();
    std::size_t peak = 0;
    for (auto const& [t, live] : b.device_memory_timeline()) peak = std::max(peak, live);
    r.swap_peak = peak - base;
    r.counted = budget.high_water();
    r.hazards = b.hazards().size();
    b.set_hazard_policy(mock::hazard_policy::ignore);
  }
  ps::detail::mutated_sites = 0;
  return r;
}

} // namespace

BOOST_AUTO_TEST_CASE(the_phased_runtimes_are_clean_and_reach_the_new_waits) {
  for (bool packed : {false, true}) {
    for (bool defer : {false, true}) {
      for (std::size_t resident : {0u, 40000u}) {
        BOOST_TEST_CONTEXT("packed " << packed << " defer " << defer << " resident " << resident) {
          reset_hits();
          auto const r = run_phased(packed, defer, resident, {});
          BOOST_TEST(r.hazards == 0u);
          BOOST_TEST(r.swap_peak <= r.counted);
          BOOST_TEST(r.counted > 0u);
          // Deferred: prefetch() finishes the offload (finish_deferred orders the h2d stream).
          // Not deferred: prefetch() orders the h2d stream behind the d2h stream's releases.
          BOOST_TEST((hits(wait_site::finish_deferred) > 0u) == defer);
          BOOST_TEST((hits(wait_site::prefetch_after_release) > 0u) == !defer);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_prefetch_gate_keeps_the_device_within_what_the_budget_counted) {
  // Without it the first prefetched allocation lands on the device before the step's last releases
  // (the staging arenas, or the last batch's storage) complete on the d2h stream: the device holds
  // more than the budget counted. It carries no data: no hazard.
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      auto const r = run_phased(packed, false, 0, {wait_site::prefetch_after_release});
      BOOST_TEST(r.hazards == 0u);
      BOOST_TEST(r.swap_peak > r.counted);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_deferred_finish_orders_the_reuse_of_the_deferred_storage) {
  // Per tensor, the deferred batch's storage is released on the d2h stream behind its D2H; the
  // finish_deferred wait is the only thing ordering the next prefetch's allocations behind it.
  auto const r = run_phased(false, true, 0, {wait_site::finish_deferred});
  BOOST_TEST(r.hazards == 0u);
  BOOST_TEST(r.swap_peak > r.counted);
  // Packed, a prefetch loads each batch into the own arena its deferred D2H leaves, so the load
  // also waits that D2H out of the arena (arena_reuse): the finish wait is a second line there;
  // without both, the load overwrites bytes the D2H is still reading.
  auto const packed = run_phased(true, true, 0, {wait_site::finish_deferred});
  BOOST_TEST(packed.hazards == 0u);
  BOOST_TEST(packed.swap_peak <= packed.counted);
  BOOST_TEST(run_phased(true, true, 0, {wait_site::finish_deferred, wait_site::arena_reuse}).hazards > 0u);
}

namespace {

struct room_outcome {
  std::size_t hazards = 0;
  std::uint64_t capacity = 0;   ///< the budget's capacity: what the deferred offload held
  std::uint64_t given = 0;      ///< make_room's answer
  std::uint64_t used_after = 0; ///< the budget's count after make_room
  std::size_t peak = 0;         ///< the device's peak above the state that never leaves it, from the forward on
  unsigned long finish_waits = 0;
  mock::sim_time resume = 0;  ///< when the compute stream may run the forward (after make_room's waits)
  mock::sim_time drained = 0; ///< when the deferred offload's last D2H ends
};

/// What asks for room in run_make_room, and what follows it.
enum class asker {
  forward,      ///< the compute stream asks, then allocates the bytes, writes them and frees them
  busy_compute, ///< the compute stream, busy with a long kernel, asks; prefetch() follows at once
};

/// One deferred step (every batch prefetched first, offloads slow), the budget's capacity then set to
/// what the deferred offload holds; the compute stream asks for room for `bytes` and `then` follows.
/// The peak is the device's from what follows on (the step before it had its own, larger, peak).
room_outcome run_make_room(bool packed, std::uint64_t bytes, std::initializer_list<wait_site> mutated,
                           asker then = asker::forward) {
  mutate(mutated);
  slow_offload_rig rig(packed, true, 0);
  auto& [b, x, budget, m, cfg] = rig;
  room_outcome r;
  {
    ps::optimizer_swap<toy> rt(x, m.opt, cfg);
    auto const base = b.device_bytes_in_use();
    (void)rt.prefetch();
    rt.step();
    (void)rt.prefetch(); // one step in, so the plan is known: every batch is prefetched
    rt.step();           // and offloaded from its own storage, deferred
    BOOST_TEST(rt.offload_pending());
    r.capacity = budget.used();
    budget.set_capacity(r.capacity);
    reset_hits();
    auto const cs = b.current_stream();
    if (then == asker::busy_compute) // the releases make_room enqueues on it land late
      b.launch(cs, mock::kernel_desc{"busy", {}, {}, mock::sim_time{1'000'000'000'000}});
    auto const prefetch_from = b.ready_time(x.h2d());
    r.given = x.make_room(bytes, cs);
    r.used_after = budget.used();
    r.finish_waits = hits(wait_site::finish_deferred);
    r.resume = b.ready_time(cs);
    r.drained = b.ready_time(x.d2h());
    auto from = r.resume; // the forward allocates from here on
    if (then == asker::forward) {
      auto const p = b.allocate_device(bytes, cs);
      b.launch(cs, mock::kernel_desc{"forward", {}, {{p, bytes}}, 10});
      b.deallocate_device(p, bytes, cs);
    } else {
      from = prefetch_from;
      BOOST_TEST(rt.prefetch() == 1u); // into the room given, the rest of the offload still draining
    }
    rt.finish_offload();
    b.synchronize_device();
    std::size_t peak = 0, level = 0;
    for (auto const& [at, live] : b.device_memory_timeline()) {
      if (at < from)
        level = live;
      else
        peak = std::max(peak, live);
    }
    // The forward's allocation counts beside what was live when it began; the prefetch's beside
    // what lands from its start on.
    r.peak = (then == asker::forward ? std::max(peak, level) : peak) - base;
    r.hazards = b.hazards().size();
    b.set_hazard_policy(mock::hazard_policy::ignore);
  }
  ps::detail::mutated_sites = 0;
  return r;
}

} // namespace

BOOST_AUTO_TEST_CASE(make_room_waits_the_deferred_offload_instead_of_exceeding_the_budget) {
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      // Nothing asked: nothing given, nothing waited.
      auto const none = run_make_room(packed, 0, {});
      BOOST_TEST(none.given == 0u);
      BOOST_TEST(none.finish_waits == 0u);
      BOOST_TEST(none.used_after == none.capacity);
      // Half the held storage asked for: the forward waits as many deferred batches as free it, in
      // step order, and the device never holds more than the budget's capacity.
      auto const half = run_make_room(packed, none.capacity / 2, {});
      // Four batches of 4 x 4000 elements, 10 bytes each (packed: each own arena rounded up to 256).
      std::uint64_t const held = packed ? 4 * 40192 : 4 * 40000;
      BOOST_TEST(none.capacity == held);
      BOOST_TEST(half.hazards == 0u);
      BOOST_TEST(half.given == held / 2); // two batches, the first two in step order
      BOOST_TEST(half.used_after == held / 2);
      BOOST_TEST(half.finish_waits == 2u);
      BOOST_TEST(half.peak == held); // the forward's bytes exactly where the given batches were
      BOOST_TEST(half.used_after + half.capacity / 2 <= half.capacity);
      // The forward resumes when the two batches it needs have left, not behind the rest of the
      // offload (packed: their arenas are released on the compute stream, not queued on the d2h
      // stream behind the later D2Hs).
      BOOST_TEST(half.resume < half.drained);
      BOOST_TEST(half.given < half.capacity); // part of it: the rest keeps draining
      BOOST_TEST(half.finish_waits >= 1u);
      BOOST_TEST(half.peak <= half.capacity);
      // All of it asked for: the whole offload is finished behind the compute stream.
      auto const all = run_make_room(packed, none.capacity, {});
      BOOST_TEST(all.hazards == 0u);
      BOOST_TEST(all.given == all.capacity);
      BOOST_TEST(all.used_after == 0u);
      BOOST_TEST(all.peak <= all.capacity);
      BOOST_TEST(all.resume >= all.drained);
      BOOST_TEST(half.resume < all.resume);
    }
  }
}

BOOST_AUTO_TEST_CASE(make_room_needs_its_waits) {
  // Per tensor, the deferred storage was released on the d2h stream behind its D2H: the compute
  // stream's finish_deferred wait is the only order between that release and the forward's
  // allocation. Without it the device holds the forward's bytes beside storage still draining.
  auto const per_tensor = run_make_room(false, 0, {});
  auto const r = run_make_room(false, per_tensor.capacity / 2, {wait_site::finish_deferred});
  BOOST_TEST(r.hazards == 0u);
  BOOST_TEST(r.peak > r.capacity);
  // Packed, each own arena is released on the compute stream itself, behind the wait of its D2H, so
  // it does not queue behind the d2h stream's later offloads: without finish_deferred the release
  // lands while the D2H still reads the arena.
  auto const packed = run_make_room(true, 0, {});
  auto const p1 = run_make_room(true, packed.capacity / 2, {wait_site::finish_deferred});
  BOOST_TEST(p1.hazards > 0u);
}

BOOST_AUTO_TEST_CASE(a_prefetch_after_make_room_waits_the_releases_on_the_asking_stream) {
  // Packed, make_room releases the arenas it gives (three of the four batches) on the stream that
  // asked (here a busy compute stream), and the d2h stream waits that release (room_release): the
  // prefetch's gate waits the d2h stream, so its allocations land behind it. Without that wait they
  // land first and the device holds the prefetched batches beside storage the budget no longer counts.
  auto const none = run_make_room(true, 0, {});
  auto const ok = run_make_room(true, none.capacity / 4 * 3, {}, asker::busy_compute);
  BOOST_TEST(ok.hazards == 0u);
  BOOST_TEST(ok.given > 0u);
  BOOST_TEST(ok.peak <= ok.capacity);
  auto const broken = run_make_room(true, none.capacity / 4 * 3, {wait_site::room_release}, asker::busy_compute);
  BOOST_TEST(broken.hazards == 0u);
  BOOST_TEST(broken.peak > broken.capacity);
}

BOOST_AUTO_TEST_CASE(every_data_wait_is_necessary_with_the_phases_on) {
  // Prefetched and resident batches are consumed through the same waits: without any one of them
  // the hazard checker fires.
  for (bool packed : {false, true}) {
    for (auto site : {wait_site::offload_after_compute, wait_site::use_after_load}) {
      BOOST_TEST_CONTEXT("packed " << packed << " without " << ps::detail::to_string(site)) {
        BOOST_TEST(run_phased(packed, true, 40000, {site}).hazards > 0u);
      }
    }
  }
}
