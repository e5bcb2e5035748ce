// pipeswap — per-rank order generators: GPipe, 1F1B, interleaved 1F1B, and the column-scan P2P pass.
//
// The generators reproduce hyper-parallel's scheduler entry for entry (docs/conformance.md), bubbles included,
// so that orders, swap injection and the upstream expectations carry over unchanged. Every generated
// schedule is fully paired, deadlock-free under check_schedule() and free of label cycles (labels.hpp);
// tests/schedule/sweep_test.cpp checks this for 1..8 ranks, 1..32 micro-batches and 1..4 stages per rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <range/v3/algorithm/max_element.hpp>
#include <range/v3/algorithm/upper_bound.hpp>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/detail/shape.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>

namespace pipeswap::schedule {

namespace detail {

inline void require_at_least_one(char const* who, char const* what, index_type v) {
  if (v < 1) throw invalid_argument(pipeswap::detail::message({who, ": ", what, " must be >= 1, got ", v}));
}

// Orders of the schedules with one stage per rank: `fill(s, order)` writes rank s's order.
template <class Fill>
rank_orders stage_per_rank(char const* who, index_type ranks, index_type micro, Fill fill) {
  require_at_least_one(who, "ranks", ranks);
  require_at_least_one(who, "micro", micro);
  rank_orders out(static_cast<std::size_t>(ranks));
  for (index_type s = 0; s < ranks; ++s) {
    out[std::size_t(s)].reserve(std::size_t(micro) * 6);
    fill(s, out[std::size_t(s)]);
  }
  return out;
}

inline void append_bubbles(order& o, std::int64_t n) {
  if (n > 0) o.insert(o.end(), std::size_t(n), entry{});
}

// The P2P steps that the compute leaf `s`, run on `rank`, adds to the schedule (add_send_recv in the ported scheduler).
inline void add_p2p_for(step const& s, index_type rank, stage_layout const& layout, rank_orders& out) {
  if (is_composite(s.kind)) {
    for (step const& l : s.sub) add_p2p_for(l, rank, layout, out);
    return;
  }
  if (s.kind == step_kind::fwd && s.stage + 1 < layout.stages()) {
    index_type const peer = layout.rank_of(s.stage + 1);
    if (peer == layout.rank_of(s.stage)) return;
    out[std::size_t(rank)].push_back(leaf(step_kind::fwd_send, s.stage, s.micro));
    out[std::size_t(peer)].push_back(leaf(step_kind::fwd_recv, s.stage + 1, s.micro));
  } else if (s.kind == step_kind::bwd && s.stage > 0) {
    index_type const peer = layout.rank_of(s.stage - 1);
    if (peer == layout.rank_of(s.stage)) return;
    out[std::size_t(rank)].push_back(leaf(step_kind::bwd_send, s.stage, s.micro));
    out[std::size_t(peer)].push_back(leaf(step_kind::bwd_recv, s.stage - 1, s.micro));
  }
}

} // namespace detail

/// Adds the FWD_SEND/FWD_RECV and BWD_SEND/BWD_RECV steps to per-rank compute orders whose entries are
/// aligned in time slots (bubbles mark idle slots), by a column scan: slot by slot,
/// every rank first appends its own entry, then even ranks and then odd ranks append, for each FWD
/// leaf at stage s whose successor stage runs on another rank, FWD_SEND(s) to themselves and
/// FWD_RECV(s+1) to that rank (BWD: BWD_SEND(s) and BWD_RECV(s-1)). A composite takes one slot per
/// leaf and is emitted once, at its first slot, so a receive triggered by its second leaf lands a
/// slot later. Bubbles are kept.
///
/// Throws invalid_argument if `compute` does not have one order per rank of `layout`, or an entry is
/// malformed or names a stage outside the layout or on another rank.
inline rank_orders insert_p2p(rank_orders const& compute, stage_layout const& layout) {
  if (compute.size() != std::size_t(layout.ranks()))
    throw invalid_argument(
        pipeswap::detail::message({"insert_p2p: ", compute.size(), " orders for ", layout.ranks(), " ranks"}));
  // One virtual slot per plain entry and per composite leaf; `leaf` is -1 for a plain entry.
  struct vslot {
    std::size_t entry;
    int leaf;
  };
  std::vector<std::vector<vslot>> slots(compute.size());
  for (std::size_t r = 0; r < compute.size(); ++r) {
    for (std::size_t i = 0; i < compute[r].size(); ++i) {
      entry const& e = compute[r][i];
      if (e) {
        auto fail = [&](std::string const& what) -> void {
          throw invalid_argument(
              pipeswap::detail::message({"insert_p2p: rank ", r, " entry ", i, " (", to_text(*e), "): ", what}));
        };
        if (auto err = detail::shape_error(*e)) fail(*err);
        for (step const& l : leaves_of(*e)) {
          if (!layout.has_stage(l.stage))
            fail(pipeswap::detail::message(
                {"stage ", l.stage, " is outside the layout's ", layout.stages(), " stages"}));
          if (layout.rank_of(l.stage) != index_type(r))
            fail(pipeswap::detail::message({"stage ", l.stage, " runs on rank ", layout.rank_of(l.stage)}));
        }
      }
      if (e && is_composite(e->kind)) {
        for (std::size_t k = 0; k < e->sub.size(); ++k) slots[r].push_back({i, int(k)});
      } else {
        slots[r].push_back({i, -1});
      }
    }
  }
  // Not empty: the layout has at least one rank.
  std::size_t const columns =
      ranges::max_element(slots, ranges::less{}, [](std::vector<vslot> const& v) { return v.size(); })->size();

  rank_orders out(compute.size());
  for (std::size_t r = 0; r < compute.size(); ++r) out[r].reserve(compute[r].size() * 2);
  auto item = [&](std::size_t r, vslot v) -> step const* {
    entry const& e = compute[r][v.entry];
    if (!e) return nullptr;
    return v.leaf < 0 ? &*e : &e->sub[std::size_t(v.leaf)];
  };
  for (std::size_t t = 0; t < columns; ++t) {
    for (std::size_t r = 0; r < compute.size(); ++r) {
      if (t < slots[r].size() && slots[r][t].leaf <= 0) out[r].push_back(compute[r][slots[r][t].entry]);
    }
    // Within a column: every rank's own entry first, then the P2P of the even ranks, then the odd ones.
    // (A views::concat of two strided iotas would name this order, at a cost in every including TU:
    // docs/compile-times.md, "Rules".)
    for (std::size_t parity = 0; parity < 2; ++parity) {
      for (std::size_t r = parity; r < compute.size(); r += 2) {
        if (t >= slots[r].size()) continue;
        if (step const* s = item(r, slots[r][t])) detail::add_p2p_for(*s, index_type(r), layout, out);
      }
    }
  }
  return out;
}

/// GPipe (ScheduleGPipe): rank s runs stage s; for each micro-batch
/// `[FWD_RECV if s>0] FWD [FWD_SEND if s<R-1]`, then for each micro-batch
/// `[BWD_RECV if s<R-1] BWD [BWD_SEND if s>0]`. Throws invalid_argument unless ranks, micro >= 1.
inline rank_orders gpipe(index_type ranks, index_type micro) {
  return detail::stage_per_rank("gpipe", ranks, micro, [&](index_type s, order& o) {
    for (index_type m = 0; m < micro; ++m) {
      if (s != 0) o.push_back(leaf(step_kind::fwd_recv, s, m));
      o.push_back(fwd(s, m));
      if (s != ranks - 1) o.push_back(leaf(step_kind::fwd_send, s, m));
    }
    for (index_type m = 0; m < micro; ++m) {
      if (s != ranks - 1) o.push_back(leaf(step_kind::bwd_recv, s, m));
      o.push_back(bwd(s, m));
      if (s != 0) o.push_back(leaf(step_kind::bwd_send, s, m));
    }
  });
}

/// 1F1B (Schedule1F1B): rank s runs stage s; `min(R-s, M)` warm-up forwards (even
/// ranks send after each forward but the last, odd ranks send the previous forward's output before
/// the next forward), then `M - warm-up` steady backward/forward pairs, then the remaining backwards,
/// with hand-laid sends and receives. Throws invalid_argument unless ranks,
/// micro >= 1.
inline rank_orders one_f_one_b(index_type ranks, index_type micro) {
  return detail::stage_per_rank("1f1b", ranks, micro, [&](index_type s, order& o) {
    bool const first = s == 0;
    bool const last = s == ranks - 1;
    index_type f = 0;
    index_type b = 0;
    index_type const warm = std::min(ranks - s, micro);
    for (index_type i = 0; i < warm; ++i, ++f) {
      if (!first) o.push_back(leaf(step_kind::fwd_recv, s, f));
      if (s % 2 == 0) {
        o.push_back(fwd(s, f));
        if (f != warm - 1) o.push_back(leaf(step_kind::fwd_send, s, f));
      } else {
        if (f > 0) o.push_back(leaf(step_kind::fwd_send, s, f - 1));
        o.push_back(fwd(s, f));
      }
    }
    if (ranks - s > micro) {
      // The warm-up could not fill the pipeline: send the last forward's output now.
      o.push_back(leaf(step_kind::fwd_send, s, f - 1));
      ++f;
    }
    for (index_type i = 0; i < micro - warm; ++i, ++f, ++b) {
      if (!last) {
        o.push_back(leaf(step_kind::bwd_recv, s, b));
        o.push_back(leaf(step_kind::fwd_send, s, f - 1));
      }
      o.push_back(bwd(s, b));
      if (!first) {
        o.push_back(leaf(step_kind::bwd_send, s, b));
        o.push_back(leaf(step_kind::fwd_recv, s, f));
      }
      o.push_back(fwd(s, f));
    }
    for (index_type i = 0; i < warm; ++i, ++b) {
      if (!last) {
        o.push_back(leaf(step_kind::bwd_recv, s, b));
        if (b == micro - warm && f <= micro) o.push_back(leaf(step_kind::fwd_send, s, f - 1));
      }
      o.push_back(bwd(s, b));
      if (!first) o.push_back(leaf(step_kind::bwd_send, s, b));
    }
  });
}

/// Parameters of interleaved 1F1B: `ranks` ranks each running `stages_per_rank` stages (rank r runs stages
/// r, r+R, ..., `loop` placement), `micro` micro-batches, and whether steady-state backward/forward
/// pairs become OVERLAP_B_F composites.
struct interleaved_options {
  index_type ranks = 1;
  index_type stages_per_rank = 1;
  index_type micro = 1;
  bool overlap_b_f = false;
};

/// Interleaved 1F1B (ScheduleInterleaved1F1B), then insert_p2p.
///
/// Micro-batches are processed in rounds of `R + base (+1)` per local stage; rank s runs
/// `warmup = min((V-1)*count[0] + 2*(R-1-s), M*V)` forwards, then (forward, backward) pairs — with
/// overlap_b_f: `F, OVERLAP_B_F(B_i, F_i+1)..., B` — then `(bubble, backward)` pairs. Bubbles: s
/// leading ones, `max(0, 2(R-s-1)-M) + R-1-s` before the steady state, and with M < R the padding of
/// the missing micro-batches: `R-M` after the last micro-batch's warm-up forward, `2(R-M)` after a last
/// micro-batch's backward in the cool-down (and on the last rank in the steady state). The doubled
/// padding is the ported scheduler's later fix; with single padding a wrapped-around gradient for M < R-1 is
/// consumed before it is received.
///
/// Throws invalid_argument unless ranks, stages_per_rank, micro >= 1 and ranks*stages_per_rank and micro*stages_per_rank fit in
/// index_type.
inline rank_orders interleaved_1f1b(interleaved_options const& opt) {
  detail::require_at_least_one("interleaved 1f1b", "ranks", opt.ranks);
  detail::require_at_least_one("interleaved 1f1b", "stages_per_rank", opt.stages_per_rank);
  detail::require_at_least_one("interleaved 1f1b", "micro", opt.micro);
  stage_layout const layout(opt.ranks, opt.stages_per_rank, placement::loop);
  std::int64_t const R = opt.ranks, V = opt.stages_per_rank, M = opt.micro;
  if (M * V > INT32_MAX)
    throw invalid_argument(
        pipeswap::detail::message({"interleaved 1f1b: micro * stages_per_rank (", M * V, ") exceeds the index range"}));

  std::int64_t const rounds = std::max<std::int64_t>(1, M / R);
  std::int64_t base = 0, rem = 0;
  if (M < R) {
    base = M - R;
  } else {
    base = (M % R) / rounds;
    rem = (M % R) % rounds;
  }
  std::vector<std::int64_t> per_round(static_cast<std::size_t>(rounds));
  std::vector<std::int64_t> accu{0}; // op index at which each round starts
  for (std::int64_t i = 0; i < rounds; ++i) {
    per_round[std::size_t(i)] = R + base + (i < rem ? 1 : 0);
    accu.push_back(accu.back() + per_round[std::size_t(i)] * V);
  }
  auto local_stage = [&](std::int64_t op) {
    auto const round = std::size_t(ranges::upper_bound(accu, op) - accu.begin() - 1);
    return (op - accu[round]) / per_round[round];
  };
  bool const short_micro = M < R;
  std::int64_t const pad = R - M;

  rank_orders compute(static_cast<std::size_t>(R));
  for (std::int64_t s = 0; s < R; ++s) {
    order& o = compute[std::size_t(s)];
    std::int64_t const warmup = std::min((V - 1) * per_round[0] + 2 * (R - 1 - s), M * V);
    std::int64_t const steady = V * M - warmup;
    std::vector<index_type> next_fwd(std::size_t(R * V), 0), next_bwd(std::size_t(R * V), 0);
    auto forward = [&](std::int64_t op) {
      auto const stage = index_type(local_stage(op) * R + s);
      return fwd(stage, next_fwd[std::size_t(stage)]++);
    };
    auto backward = [&](std::int64_t op) {
      auto const stage = index_type((V - 1 - local_stage(op - warmup)) * R + s);
      return bwd(stage, next_bwd[std::size_t(stage)]++);
    };
    auto last_micro = [&](step const& st) { return short_micro && st.micro == M - 1; };

    o.reserve(std::size_t(2 * V * M + 4 * R));
    detail::append_bubbles(o, s);
    for (std::int64_t op = 0; op < warmup; ++op) {
      o.push_back(forward(op));
      if (last_micro(*o.back()) && (op != warmup - 1 || s == R - 1)) detail::append_bubbles(o, pad);
    }
    detail::append_bubbles(o, std::max<std::int64_t>(0, 2 * (R - s - 1) - M));
    detail::append_bubbles(o, R - 1 - s);
    if (!opt.overlap_b_f) {
      for (std::int64_t op = warmup; op < warmup + steady; ++op) {
        o.push_back(forward(op));
        o.push_back(backward(op));
        if (last_micro(*o.back()) && s == R - 1) detail::append_bubbles(o, 2 * pad);
      }
    } else if (steady > 0) {
      o.push_back(forward(warmup));
      for (std::int64_t op = warmup; op + 1 < warmup + steady; ++op) {
        step b = backward(op);
        o.push_back(step{step_kind::overlap_b_f, no_index, no_index, {std::move(b), forward(op + 1)}});
      }
      o.push_back(backward(warmup + steady - 1));
      if (last_micro(*o.back()) && s == R - 1) detail::append_bubbles(o, 2 * pad);
    }
    for (std::int64_t op = warmup + steady; op < 2 * warmup + steady; ++op) {
      o.push_back(entry{});
      o.push_back(backward(op));
      if (last_micro(*o.back())) detail::append_bubbles(o, 2 * pad);
    }
  }
  return insert_p2p(compute, layout);
}

} // namespace pipeswap::schedule
