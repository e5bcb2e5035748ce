// pipeswap — the orders the pipeline simulator (sim/pipeline.hpp) runs: the scenario's stage layout
// and schedule, swap steps injected per rank, and the load lookahead and offload wait delay that give
// each rank's activation copies the time they need.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/scenario.hpp>
#include <pipeswap/sim/sim_options.hpp>

namespace pipeswap::sim {

/// How the scenario's stages map to ranks.
inline schedule::stage_layout layout_of(scenario const& s) {
  return schedule::stage_layout(static_cast<schedule::index_type>(s.pipeline.ranks),
                                static_cast<schedule::index_type>(s.pipeline.stages_per_rank),
                                schedule::placement::loop);
}

/// The scenario's schedule with its send/receive steps, one order per rank (no swap steps).
inline schedule::rank_orders schedule_of(scenario const& s) {
  validate(s);
  auto const R = static_cast<schedule::index_type>(s.pipeline.ranks);
  auto const M = static_cast<schedule::index_type>(s.pipeline.micro_batches);
  switch (s.pipeline.schedule) {
  case schedule_kind::gpipe: return schedule::gpipe(R, M);
  case schedule_kind::one_f_one_b: return schedule::one_f_one_b(R, M);
  case schedule_kind::interleaved:
    return schedule::interleaved_1f1b(
        {R, static_cast<schedule::index_type>(s.pipeline.stages_per_rank), M, s.pipeline.overlap_b_f});
  }
  throw invalid_argument("scenario: unknown pipeline.schedule");
}

/// Injects swap steps into every rank's own order, for the chunks `filter` accepts (all when empty),
/// each rank's loads `lookahead(rank)` compute slots ahead of their backward (the reference placement
/// when `lookahead` is empty).
inline schedule::rank_orders inject_all(schedule::rank_orders orders,
                                        std::function<bool(std::uint32_t, schedule::chunk)> const& filter,
                                        std::function<std::size_t(std::uint32_t)> const& lookahead = {}) {
  for (std::size_t r = 0; r < orders.size(); ++r) {
    auto const rank = static_cast<std::uint32_t>(r);
    auto const eligible = [&](schedule::chunk c) { return !filter || filter(rank, c); };
    orders[r] = lookahead ? schedule::inject_swap_steps(orders[r], eligible, schedule::inject_options{lookahead(rank)})
                          : schedule::inject_swap_steps(orders[r], eligible);
  }
  return orders;
}

/// inject_all() with each rank's own injection options (`options(rank)`).
inline schedule::rank_orders inject_all(schedule::rank_orders orders,
                                        std::function<bool(std::uint32_t, schedule::chunk)> const& filter,
                                        std::function<schedule::inject_options(std::uint32_t)> const& options) {
  for (std::size_t r = 0; r < orders.size(); ++r) {
    auto const rank = static_cast<std::uint32_t>(r);
    auto const eligible = [&](schedule::chunk c) { return !filter || filter(rank, c); };
    orders[r] = schedule::inject_swap_steps(orders[r], eligible, options(rank));
  }
  return orders;
}

/// The load lookahead (inject_options::load_lookahead) that gives each activation load of `rank`
/// the time it needs: the fewest compute slots whose duration covers the copy of the rank's largest
/// swapped chunk over its host link, counting each slot as the rank's shortest forward (the slot
/// just before a backward in the 1F1B steady state is a forward). 1 (the reference) when one slot is
/// enough; at most half the rank's shortest forward-to-backward gap, so that a swapped chunk still
/// spends at least half of its life off the device (a link too slow for that cannot hide the load
/// by launching it earlier; it only gives the memory back). A setting derived from the model's
/// sizes; the simulation then shows what it gives.
namespace detail {
/// The fewest compute slots (each counted as `rank`'s shortest forward) that cover the copy of its
/// largest swapped chunk at `gbps`, within [1, max(1, its shortest swap gap / 2)].
inline std::size_t slots_covering_copy(scenario const& s, std::vector<stage_spec> const& stages, std::uint32_t rank,
                                       double gbps);
} // namespace detail

inline std::size_t load_lookahead_for(scenario const& s, std::vector<stage_spec> const& stages, std::uint32_t rank,
                                      link_rates const& link) {
  return detail::slots_covering_copy(s, stages, rank, link.h2d_gbps);
}

/// The offload wait delay (inject_options::offload_wait_delay) that gives each activation offload of
/// `rank` the time it needs before the host waits for it: as load_lookahead_for(), over the rank's
/// device-to-host rate. It matters in the pipeline fill, where forwards follow forwards: a delay of
/// 1 (the reference) there waits each offload one forward after its own.
inline std::size_t offload_wait_delay_for(scenario const& s, std::vector<stage_spec> const& stages, std::uint32_t rank,
                                          link_rates const& link) {
  return detail::slots_covering_copy(s, stages, rank, link.d2h_gbps);
}

inline std::size_t detail::slots_covering_copy(scenario const& s, std::vector<stage_spec> const& stages,
                                               std::uint32_t rank, double gbps) {
  auto const layout = layout_of(s);
  std::uint64_t bytes = 0;
  mock::sim_time slot = 0;
  for (auto const& st : stages) {
    if (layout.rank_of(static_cast<schedule::index_type>(st.stage)) != static_cast<schedule::index_type>(rank))
      continue;
    bytes = std::max(bytes, st.activation_bytes - st.boundary_bytes);
    slot = slot == 0 ? st.fwd_ns : std::min(slot, st.fwd_ns);
  }
  auto const orders = schedule_of(s);
  std::size_t gap = 0;
  for (auto const& c : schedule::swap_candidates(orders.at(rank))) gap = gap == 0 ? c.gap() : std::min(gap, c.gap());
  if (bytes == 0 || slot <= 0 || !(gbps > 0) || gap == 0) return 1;
  double const copy_ns = s.device.copy_latency_us * 1e3 + static_cast<double>(bytes) / gbps;
  auto const k = static_cast<std::size_t>(std::ceil(copy_ns / static_cast<double>(slot)));
  return std::clamp<std::size_t>(k, 1, std::max<std::size_t>(1, gap / 2));
}

/// Sets every rank's load lookahead and offload wait delay that `o` leaves unset to
/// load_lookahead_for() and offload_wait_delay_for() (the link rates taken as when every rank swaps).
inline void set_load_lookaheads(sim_options& o, scenario const& s) {
  auto const stages = plan_stages(
      s, o.recompute.empty() ? std::vector<recompute_kind>{} : [&] {
        auto const layout = layout_of(s);
        std::vector<recompute_kind> per_stage;
        for (std::uint32_t st = 0; st < s.pipeline.ranks * s.pipeline.stages_per_rank; ++st)
          per_stage.push_back(
              o.recompute.at(static_cast<std::size_t>(layout.rank_of(static_cast<schedule::index_type>(st)))));
        return per_stage;
      }());
  auto const links = host_link_rates(s, std::vector<bool>(s.pipeline.ranks, true));
  if (o.ranks.empty()) o.ranks.resize(s.pipeline.ranks);
  for (std::uint32_t r = 0; r < s.pipeline.ranks && r < o.ranks.size(); ++r) {
    if (!o.ranks[r].load_lookahead) o.ranks[r].load_lookahead = load_lookahead_for(s, stages, r, links[r]);
    if (!o.ranks[r].offload_wait_delay) o.ranks[r].offload_wait_delay = offload_wait_delay_for(s, stages, r, links[r]);
  }
}

} // namespace pipeswap::sim
