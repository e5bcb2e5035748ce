// pipeswap — the pipeline simulator: one training step of a scenario (sim/model.hpp) executed on one
// mock device per pipeline rank, with the library's own schedule generators, swap-step injection,
// activation swap manager, AdamW and optimizer-state swap runtime.
//
// Each rank's engine is the pipeline executor (exec/pipeline_executor.hpp, resumable form): its
// stages are the mock kernels below, its comm the scenario's P2P link on the mock's virtual clock
// (detail::link_comm, stream-ordered), the optimizer step with its collectives its finish (with
// overlap and optimizer swap, the runtime's phases driven by the executor). simulate_orders()
// advances every rank on one thread until a receive finds no message yet, and names what every rank
// waits for when none can go on.
//
// What runs, per rank:
//  * setup: the rank's weights and gradients (the parameter type), AdamW's state (fp32 moments and,
//    for 16-bit weights, an fp32 master copy) on the device — or, with optimizer swap, in pinned
//    host memory; then every rank's clock is aligned to a common start T0;
//  * the rank's order of the generated schedule (with swap steps injected when activations swap):
//    FWD is one kernel that reads the stage's weights and input and writes the saved activations
//    (one buffer per layer plus the stage input) and the output; BWD reads them and the incoming
//    gradient and writes the weight gradients and the outgoing gradient; sends and receives move
//    the stage boundary over a link with the scenario's P2P bandwidth and latency; the host waits
//    for every receive (as pipeline runtimes do) and issues each compute entry when the previous
//    one has finished, so swap steps go out one compute entry ahead of their use;
//  * after the rank's last backward: the data-parallel gradient reduce-scatter (or all-reduce) as a
//    kernel of its own duration, a host synchronization (the global gradient-norm reduction of
//    mixed-precision training), the optimizer step on the rank's optimizer shard, and with the
//    distributed optimizer the all-gather of the updated weights.
// Costs and sizes come from sim/model.hpp: tensor-parallel shards, gradient type, recomputation (a
// full-recomputation backward holds one layer's activations while it runs), the host-link rate each
// rank gets when its node's devices copy at once (host_link_rates).
// Reported per rank: the step's peak device memory (including the scenario's reserved bytes), its
// time from T0, the bytes each way over the host link, and the memory over time.
//
// Every operation goes through the mock backend's hazard checker (raising), so a simulated step is
// also a proof that the swap code orders its copies correctly for that schedule. With
// sim_options::materialize the mock holds real bytes: the forward writes a pattern into each saved
// activation and the backward checks it (rank_result::corrupt_buffers), which is how the tests show
// that data survives the round trip through host memory. docs/simulator.md states the model.
//
// Its parts: sim/sim_options.hpp (what a simulation runs with and reports), sim/orders.hpp (the
// schedule, swap-step injection, load lookaheads), sim/detail/link_comm.hpp (the P2P link) and
// sim/detail/rank_sim.hpp (one rank); simulate_sized() is sim/sized.hpp, which includes this header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/validate.hpp>
#include <pipeswap/sim/detail/link_comm.hpp>
#include <pipeswap/sim/detail/rank_sim.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/orders.hpp>
#include <pipeswap/sim/sim_options.hpp>

namespace pipeswap::sim {

namespace detail {

/// A per-rank input of simulate() has one entry per pipeline rank (or none, where `empty_ok`).
inline void require_per_rank(scenario const& s, std::size_t n, char const* what, bool empty_ok = true) {
  if (n == s.pipeline.ranks || (empty_ok && n == 0)) return;
  throw invalid_argument("simulate: " + std::to_string(n) + " " + what + " for " + std::to_string(s.pipeline.ranks) +
                         " ranks");
}

} // namespace detail

/// Runs one training step of `s` with the given per-rank orders (send/receive steps included; swap
/// steps only where activations should swap) and reports it. The orders are checked first
/// (schedule::check_schedule): invalid_argument names the problems. A deadlock found while running
/// throws state_error naming what every rank waits for.
inline sim_result simulate_orders(scenario const& s, schedule::rank_orders const& orders, sim_options const& o) {
  auto const layout = layout_of(s);
  detail::require_per_rank(s, orders.size(), "orders", false);
  detail::require_per_rank(s, o.ranks.size(), "rank settings");
  detail::require_per_rank(s, o.recompute.size(), "recomputation settings");
  for (std::size_t r = 0; r < o.ranks.size(); ++r)
    if (auto const t = o.ranks[r].swapped_tenths; t && (*t < 1 || *t > 10))
      throw invalid_argument("simulate: rank " + std::to_string(r) + "'s swapped_tenths is " + std::to_string(*t) +
                             "; a share of each group's layers is 1 to 10 tenths");
  std::vector<recompute_kind> per_stage;
  if (!o.recompute.empty()) {
    for (std::uint32_t st = 0; st < s.pipeline.ranks * s.pipeline.stages_per_rank; ++st)
      per_stage.push_back(o.recompute[static_cast<std::size_t>(layout.rank_of(static_cast<schedule::index_type>(st)))]);
  }
  auto const stages = plan_stages(s, per_stage);
  // The ranks that copy to or from the host share their node's host bandwidth.
  std::vector<bool> swaps(s.pipeline.ranks);
  for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r)
    swaps[r] = o.swaps_optimizer(r) || std::any_of(orders[r].begin(), orders[r].end(), [](auto const& e) {
                 return e && e->kind == schedule::step_kind::swap_launch_offload;
               });
  auto const links = host_link_rates(s, swaps);
  if (auto const report = schedule::check_schedule(orders, layout); !report.ok()) {
    throw invalid_argument("simulate: the schedule is not valid: " + schedule::to_string(report));
  }
  detail::mailbox mb; // before the ranks, whose links post into it
  std::vector<std::unique_ptr<detail::rank_sim>> ranks;
  mock::sim_time t0 = 0;
  for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r) {
    ranks.push_back(std::make_unique<detail::rank_sim>(s, stages, layout, r, orders[r], o, links[r], mb));
    t0 = std::max(t0, ranks.back()->finish_setup());
  }
  auto const steps = o.steps_to_run();
  std::size_t total = 0, done = 0, reported = 0;
  for (auto const& r : orders) total += r.size();
  total *= o.until_steady() ? std::min(o.min_steps, steps) : steps;
  mock::sim_time t_report = t0; // when every rank's previous step had ended (T0 for the first)
  std::vector<mock::sim_time> periods;
  auto const agree = [](mock::sim_time a, mock::sim_time b) {
    auto const d = a > b ? a - b : b - a;
    return d <= 1 || static_cast<double>(d) <= sim_options::steady_tolerance * static_cast<double>(std::max(a, b));
  };
  std::uint32_t ran = 0;
  mock::sim_time last_end = t0;
  for (std::uint32_t k = 0; k < steps; ++k) {
    for (auto& r : ranks) r->start(k == 0 || !o.overlap ? t_report : mock::sim_time{0});
    mb.arrivals.clear();
    for (;;) {
      std::size_t progressed = 0;
      bool all_done = true;
      for (auto& r : ranks) {
        progressed += r->advance();
        all_done = all_done && r->done();
      }
      done += progressed;
      if (o.progress && (done - reported) * 100 >= total) {
        o.progress(total ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1.0);
        reported = done;
      }
      if (all_done) break;
      if (progressed == 0) {
        std::string what =
            "simulate: deadlock" + (steps > 1 ? " in step " + std::to_string(k + 1) : std::string()) + ": ";
        for (std::uint32_t r = 0; r < ranks.size(); ++r) {
          if (ranks[r]->done()) continue;
          what += "rank " + std::to_string(r) + " waits at " + ranks[r]->waiting_for() + "; ";
        }
        throw state_error(what.substr(0, what.size() - 2));
      }
    }
    mock::sim_time ended = 0;
    for (auto& r : ranks) ended = std::max(ended, r->end_step());
    ++ran;
    if (k > 0) periods.push_back(ended - last_end);
    // The steady state: the same event (the last rank's return) one period apart twice running.
    bool const settled = periods.size() >= 2 && agree(periods.back(), periods[periods.size() - 2]);
    if (o.until_steady() && ran >= o.min_steps && settled) break;
    if (k + 1 < steps) {
      t_report = ended;
      last_end = ended;
    }
  }
  sim_result out;
  out.fits = true;
  out.periods = periods;
  out.steady = periods.size() < 2 || agree(periods.back(), periods[periods.size() - 2]);
  out.simulated_steps = ran;
  for (auto& r : ranks) {
    out.ranks.push_back(r->finish(t_report));
    auto const& rr = out.ranks.back();
    out.step_ns = std::max(out.step_ns, rr.step_ns);
    out.peak_bytes = std::max(out.peak_bytes, rr.peak_bytes);
    out.fits = out.fits && rr.fits;
  }
  if (o.record_trace) {
    std::ostringstream os;
    bool first = true;
    os << R"({"displayTimeUnit":"ns","traceEvents":[)";
    for (std::uint32_t r = 0; r < ranks.size(); ++r) {
      ranks[r]->backend().write_trace_events(os, first, static_cast<int>(r + 1), "rank " + std::to_string(r));
    }
    os << "\n]}\n";
    out.trace_json = std::move(os).str();
  }
  if (o.progress) o.progress(1.0);
  return out;
}

/// Runs one training step of `s`: its schedule (schedule_of), with swap steps injected into every
/// rank's order when o.swap_activations (for the chunks o.activation_filter accepts).
inline sim_result simulate(scenario const& s, sim_options const& o) {
  auto orders = schedule_of(s);
  if (o.swap_activations) {
    bool reference = true; // every rank at the reference placement: inject exactly as the reference does
    for (std::uint32_t r = 0; r < s.pipeline.ranks; ++r)
      reference = reference && o.inject_options_of(r) == schedule::inject_options{};
    orders = reference ? inject_all(std::move(orders), o.activation_filter)
                       : inject_all(std::move(orders), o.activation_filter,
                                    std::function<schedule::inject_options(std::uint32_t)>(
                                        [&o](std::uint32_t r) { return o.inject_options_of(r); }));
  }
  auto res = simulate_orders(s, orders, o);
  if (o.swap_activations)
    for (auto& r : res.ranks)
      if (r.swapped_chunks > 0) {
        r.load_lookahead = o.load_lookahead_of(r.rank);
        r.offload_wait_delay = o.offload_wait_delay_of(r.rank);
      }
  return res;
}

} // namespace pipeswap::sim
