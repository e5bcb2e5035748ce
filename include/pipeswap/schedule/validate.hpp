// pipeswap — validators: one order's well-formedness, and a whole schedule simulated across ranks.
//
// check_order(o) reports, for one rank's order:
//   shape      a step that breaks the structural rules (detail/shape.hpp);
//   composite  OVERLAP_F_B not holding (FWD, BWD|BWD_INPUT), OVERLAP_B_F not (BWD|BWD_INPUT, FWD);
//   duplicate  a second FWD or a second BWD of the same chunk;
//   backward_before_forward  a BWD with no FWD of its chunk before it;
//   swap_lifecycle  for every chunk that has any SWAP_* step: its steps and its FWD/BWD must run as
//              SET_GROUP → FWD → LAUNCH_OFFLOAD → WAIT_OFFLOAD → LAUNCH_LOAD → WAIT_LOAD → BWD, each
//              exactly once (a step early, repeated or missing is reported).
// Leaves of one composite count at the composite's position, in leaf order. An order without
// backwards (forward-only) is well-formed. Opaque kinds are not checked beyond their shape.
//
// check_schedule(orders, layout) runs check_order on every rank and then, across ranks:
//   placement  a step on a rank that does not run its stage, or a stage outside the layout;
//   no_peer    FWD_SEND from the last stage, FWD_RECV into stage 0, BWD_SEND from stage 0, BWD_RECV
//              into the last stage;
//   unpaired   FWD_SEND(s, m) is paired with FWD_RECV(s+1, m), BWD_SEND(s, m) with BWD_RECV(s-1, m):
//              the k-th send of a message with the k-th receive of it; the rest are unpaired;
//   dataflow   a FWD(s, m) with s > 0 needs FWD(s-1, m) earlier on its rank when stage s-1 runs there,
//              else FWD_RECV(s, m) earlier; a BWD(s, m) (or BWD_INPUT) below the last stage likewise
//              needs BWD(s+1, m) or BWD_RECV(s, m); a FWD_SEND(s, m) needs FWD(s, m) earlier, a
//              BWD_SEND(s, m) needs BWD(s, m) or BWD_INPUT(s, m). The leaves of one composite run
//              together, so they cannot feed each other.
// and simulates execution: every rank walks its order; a send never blocks (it is posted and
// completes on its own, like isend, which is also how the label check pairs messages); an entry
// holding a paired receive blocks its rank until the matching send has executed; everything else runs
// at once. Unpaired receives are reported above and do not block. If ranks remain blocked, the
// simulation has deadlocked: report.deadlock is the cycle of blocked receives, each waiting for a send
// that its rank cannot reach, starting at the lowest rank.
//
// Costs are linear in the total number of entries (hash maps keyed by chunk and message).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <range/v3/algorithm/min_element.hpp>
#include <range/v3/algorithm/rotate.hpp>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/detail/chunk_table.hpp>
#include <pipeswap/schedule/detail/shape.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>

namespace pipeswap::schedule {

/// The rule a problem breaks; see the header comment.
enum class rule : std::uint8_t {
  shape,
  composite,
  duplicate,
  backward_before_forward,
  swap_lifecycle,
  placement,
  no_peer,
  unpaired,
  dataflow,
};

constexpr std::string_view rule_name(rule r) noexcept {
  switch (r) {
  case rule::shape: return "shape";
  case rule::composite: return "composite";
  case rule::duplicate: return "duplicate";
  case rule::backward_before_forward: return "backward-before-forward";
  case rule::swap_lifecycle: return "swap-lifecycle";
  case rule::placement: return "placement";
  case rule::no_peer: return "no-peer";
  case rule::unpaired: return "unpaired";
  case rule::dataflow: return "dataflow";
  }
  return "?";
}

/// One reported problem: the rule, where (rank — no_index from check_order —, entry position), the
/// offending step or leaf in text form, and a sentence saying what is wrong.
struct problem {
  rule broken{};
  index_type rank = no_index;
  std::size_t position = 0;
  std::string step;
  std::string message;

  friend bool operator==(problem const&, problem const&) = default;
};

/// "rank 1, position 12 (LO0.3): swap-lifecycle: ..." (no rank part from check_order).
inline std::string to_string(problem const& p) {
  std::string out;
  if (p.rank != no_index) pipeswap::detail::append(out, {"rank ", p.rank, ", "});
  pipeswap::detail::append(out, {"position ", p.position, " (", p.step, "): ", rule_name(p.broken), ": ", p.message});
  return out;
}

namespace detail {

inline std::string chunk_text(chunk c) { return pipeswap::detail::message({"(", c.stage, ",", c.micro, ")"}); }

inline std::string problems_text(std::vector<problem> const& ps, std::size_t most = 20) {
  std::string out;
  for (std::size_t i = 0; i < ps.size() && i < most; ++i) out += "\n  " + to_string(ps[i]);
  if (ps.size() > most) pipeswap::detail::append(out, {"\n  ... and ", ps.size() - most, " more"});
  return out;
}

// The swap life cycle, one event per step; index = position in the cycle.
inline constexpr step_kind lifecycle[] = {step_kind::swap_set_group,
                                          step_kind::fwd,
                                          step_kind::swap_launch_offload,
                                          step_kind::swap_wait_offload,
                                          step_kind::swap_launch_load,
                                          step_kind::swap_wait_load,
                                          step_kind::bwd};

constexpr int lifecycle_index(step_kind k) noexcept {
  for (int i = 0; i < 7; ++i) {
    if (lifecycle[i] == k) return i;
  }
  return -1;
}

constexpr bool is_backward_leaf(step_kind k) noexcept { return k == step_kind::bwd || k == step_kind::bwd_input; }

inline std::optional<std::string> composite_error(step const& s) {
  bool ok = s.sub.size() == 2;
  if (ok && s.kind == step_kind::overlap_f_b) ok = s.sub[0].kind == step_kind::fwd && is_backward_leaf(s.sub[1].kind);
  if (ok && s.kind == step_kind::overlap_b_f) ok = is_backward_leaf(s.sub[0].kind) && s.sub[1].kind == step_kind::fwd;
  if (ok) return std::nullopt;
  return std::string(step_kind_name(s.kind)) + (s.kind == step_kind::overlap_f_b
                                                    ? " must hold a FWD leaf then a backward leaf (BWD or BWD_INPUT)"
                                                    : " must hold a backward leaf (BWD or BWD_INPUT) then a FWD leaf");
}

// One pass over the order after a pass that sizes the tables and finds the swapped chunks.
class order_checker {
public:
  explicit order_checker(order const& o)
      : o_(o), box_(scan(o, swapped_list_)), fwd_(box_, no_position), bwd_(box_, no_position), swapped_(box_, 0),
        cycle_(box_, cycle_state{}) {}

  std::vector<problem> run() {
    std::size_t unique = 0;
    for (chunk key : swapped_list_) {
      std::uint8_t& flag = swapped_[key];
      if (!flag) swapped_list_[unique++] = key;
      flag = 1;
    }
    swapped_list_.resize(unique);
    for (std::size_t i = 0; i < o_.size(); ++i) {
      if (!o_[i]) continue;
      step const& s = *o_[i];
      if (!shape_ok(s)) {
        add(rule::shape, i, s, *shape_error(s));
        continue;
      }
      if (is_composite(s.kind)) {
        if (auto e = composite_error(s)) add(rule::composite, i, s, *e);
      }
      for (step const& l : leaves_of(s)) {
        chunk const key{l.stage, l.micro};
        if (l.kind == step_kind::fwd) first_of(fwd_, key, i, l);
        if (l.kind == step_kind::bwd) {
          first_of(bwd_, key, i, l);
          if (fwd_.get(key) == no_position) early_bwd_.push_back({key, i, &l});
        }
        if (lifecycle_index(l.kind) >= 0 && swapped_.get(key)) advance(key, lifecycle_index(l.kind), i, l);
      }
    }
    for (auto const& [key, pos, bwd_leaf] : early_bwd_) {
      std::size_t const f = fwd_.get(key);
      add(rule::backward_before_forward, pos, *bwd_leaf,
          f == no_position ? "BWD of chunk " + chunk_text(key) + " has no FWD"
                           : pipeswap::detail::message(
                                 {"BWD of chunk ", chunk_text(key), " runs before its FWD (position ", f, ")"}));
    }
    for (chunk key : swapped_list_) {
      cycle_state const st = cycle_.get(key);
      if (st.state == 6) continue;
      add(rule::swap_lifecycle, st.position, *st.leaf,
          "swap life cycle of chunk " + chunk_text(key) + " is incomplete: missing " +
              lifecycle_names(st.state + 1, 7));
    }
    // std::stable_sort, not ranges::stable_sort(problems_, {}, &problem::position): range-v3's own merge
    // sort would be instantiated in every TU including this header (docs/compile-times.md, "Rules").
    std::stable_sort(problems_.begin(), problems_.end(),
                     [](problem const& a, problem const& b) { return a.position < b.position; });
    return std::move(problems_);
  }

private:
  static constexpr std::size_t no_position = SIZE_MAX;
  struct cycle_state {
    int state = -1;           // last life-cycle step reached
    std::size_t position = 0; // where it happened
    step const* leaf = nullptr;
  };
  struct early {
    chunk key;
    std::size_t position;
    step const* leaf;
  };

  // The box of the chunks the life-cycle steps name, and the chunks of the swap steps (with repeats).
  static chunk_box scan(order const& o, std::vector<chunk>& swap_keys) {
    chunk_box box;
    for (entry const& e : o) {
      if (!e || !shape_ok(*e)) continue;
      for (step const& l : leaves_of(*e)) {
        if (lifecycle_index(l.kind) < 0) continue;
        box.add(l.stage, l.micro);
        if (is_swap(l.kind)) swap_keys.push_back({l.stage, l.micro});
      }
    }
    return box;
  }

  static std::string lifecycle_names(int first, int end) {
    std::string out;
    for (int k = first; k < end; ++k) out += (out.empty() ? "" : ", ") + std::string(step_kind_name(lifecycle[k]));
    return out;
  }

  void add(rule r, std::size_t position, step const& s, std::string message) {
    problems_.push_back({r, no_index, position, to_text(s), std::move(message)});
  }

  void first_of(chunk_table<std::size_t>& seen, chunk key, std::size_t i, step const& l) {
    std::size_t& first = seen[key];
    if (first == no_position) {
      first = i;
      return;
    }
    add(rule::duplicate, i, l,
        pipeswap::detail::message(
            {"second ", step_kind_name(l.kind), " of chunk ", chunk_text(key), "; the first is at position ", first}));
  }

  void advance(chunk key, int event, std::size_t i, step const& l) {
    cycle_state& st = cycle_[key];
    std::string const name(step_kind_name(l.kind));
    if (event > st.state + 1) {
      add(rule::swap_lifecycle, i, l,
          name + " of chunk " + chunk_text(key) + " comes before " + lifecycle_names(st.state + 1, event));
    } else if (event <= st.state) {
      add(rule::swap_lifecycle, i, l,
          pipeswap::detail::message({name, " of chunk ", chunk_text(key),
                                     (event == st.state ? " is repeated" : " is out of order"),
                                     ": its life cycle already reached ", step_kind_name(lifecycle[st.state]),
                                     " at position ", st.position}));
      return;
    }
    st = {event, i, &l};
  }

  order const& o_;
  std::vector<chunk> swapped_list_; // filled while box_ is computed, so declared before it
  chunk_box box_;
  chunk_table<std::size_t> fwd_, bwd_;
  chunk_table<std::uint8_t> swapped_;
  chunk_table<cycle_state> cycle_;
  std::vector<early> early_bwd_;
  std::vector<problem> problems_;
};

} // namespace detail

/// The problems of one order (rules shape … swap_lifecycle), sorted by position; empty if it is
/// well-formed.
inline std::vector<problem> check_order(order const& o) { return detail::order_checker(o).run(); }

/// Throws invalid_argument listing the problems of `o` (the first 20) unless it is well-formed.
inline void require_well_formed(order const& o) {
  auto const ps = check_order(o);
  if (!ps.empty())
    throw invalid_argument(
        pipeswap::detail::message({"order is not well-formed (", ps.size(), " problems):", detail::problems_text(ps)}));
}

/// A rank blocked at a receive in a deadlock, and the send it waits for.
struct blocked_receive {
  index_type rank = no_index;
  std::size_t position = 0;
  std::string step;
  index_type peer_rank = no_index;
  std::size_t peer_position = 0;
  std::string peer_step;

  friend bool operator==(blocked_receive const&, blocked_receive const&) = default;
};

/// What check_schedule found.
struct schedule_report {
  /// Problems of every rule, by rank, then position.
  std::vector<problem> problems;
  /// Empty if the simulation ran every order to its end; else the cycle of blocked receives.
  std::vector<blocked_receive> deadlock;

  bool ok() const noexcept { return problems.empty() && deadlock.empty(); }
};

inline std::string to_string(schedule_report const& r) {
  if (r.ok()) return "schedule is valid";
  std::string out =
      pipeswap::detail::message({"schedule has ", r.problems.size(), " problems",
                                 (r.deadlock.empty() ? "" : " and deadlocks"), ":", detail::problems_text(r.problems)});
  if (!r.deadlock.empty()) {
    out += "\n  deadlock:";
    for (blocked_receive const& b : r.deadlock)
      pipeswap::detail::append(out, {"\n    rank ", b.rank, " blocks at position ", b.position, " (", b.step,
                                     ") waiting for rank ", b.peer_rank, " position ", b.peer_position, " (",
                                     b.peer_step, ")"});
  }
  return out;
}

namespace detail {

// Bits of what a rank has done for a chunk, for the dataflow rule (BWD_INPUT counts as BWD).
enum : std::uint8_t { did_fwd = 1, did_fwd_recv = 2, did_bwd = 4, did_bwd_recv = 8 };

constexpr std::uint8_t done_bit(step_kind k) noexcept {
  switch (k) {
  case step_kind::fwd: return did_fwd;
  case step_kind::fwd_recv: return did_fwd_recv;
  case step_kind::bwd:
  case step_kind::bwd_input: return did_bwd;
  case step_kind::bwd_recv: return did_bwd_recv;
  default: return 0;
  }
}

class schedule_checker {
public:
  schedule_checker(rank_orders const& orders, stage_layout const& layout)
      : orders_(orders), layout_(layout), box_(box_of(orders, layout)), done_(box_, 0), forward_ids_(box_, no_id),
        backward_ids_(box_, no_id) {
    if (orders.size() != std::size_t(layout.ranks()))
      throw invalid_argument(pipeswap::detail::message(
          {"check_schedule: ", orders.size(), " orders for a layout of ", layout.ranks(), " ranks"}));
  }

  schedule_report run() {
    for (std::size_t r = 0; r < orders_.size(); ++r) {
      for (problem p : check_order(orders_[r])) {
        p.rank = index_type(r);
        report_.problems.push_back(std::move(p));
      }
      scan_rank(index_type(r));
    }
    pair_messages();
    std::stable_sort(report_.problems.begin(), report_.problems.end(), [](problem const& a, problem const& b) {
      return std::pair(a.rank, a.position) < std::pair(b.rank, b.position);
    });
    simulate();
    return std::move(report_);
  }

private:
  static constexpr std::size_t no_id = SIZE_MAX;

  // A P2P leaf, in rank-major, position order; `next` links the sends (receives) of one message.
  struct p2p_ref {
    index_type rank;
    std::size_t position;
    step const* leaf;
    std::size_t next = no_id;
    std::size_t paired_send = no_id;
  };
  // One message: the receiving stage and micro-batch of a direction, and its sends and receives.
  struct message {
    bool forward;
    chunk to;
    std::size_t first_send = no_id, last_send = no_id, first_recv = no_id, last_recv = no_id;
  };
  struct wait {
    std::size_t position;
    std::size_t recv; // index into refs_
  };

  static chunk_box box_of(rank_orders const& orders, stage_layout const& layout) {
    chunk_box box;
    box.stages = layout.stages();
    for (order const& o : orders) {
      for (entry const& e : o) {
        if (!e) continue;
        for (step const& l : leaves_of(*e)) {
          if (done_bit(l.kind) || is_p2p(l.kind)) box.add(0, l.micro);
        }
      }
    }
    return box;
  }

  void add(rule r, index_type rank, std::size_t position, step const& s, std::string message) {
    report_.problems.push_back({r, rank, position, to_text(s), std::move(message)});
  }

  std::string on_rank_of(index_type stage) const {
    return layout_.has_stage(stage) ? pipeswap::detail::message({" on rank ", layout_.rank_of(stage)}) : std::string();
  }

  // Placement, peers and dataflow of one rank; collects its P2P leaves. Each (stage, micro) of a
  // placement-valid leaf is only ever touched by the rank that runs the stage, so one table of done
  // bits serves all ranks.
  void scan_rank(index_type r) {
    order const& o = orders_[std::size_t(r)];
    std::vector<std::pair<chunk, std::uint8_t>> produced;
    for (std::size_t i = 0; i < o.size(); ++i) {
      if (!o[i] || !shape_ok(*o[i])) continue;
      produced.clear();
      for (step const& l : leaves_of(*o[i])) {
        if (!layout_.has_stage(l.stage)) {
          add(rule::placement, r, i, l,
              pipeswap::detail::message({"stage ", l.stage, " is outside the layout's ", layout_.stages(), " stages"}));
          continue;
        }
        if (layout_.rank_of(l.stage) != r) {
          add(rule::placement, r, i, l,
              pipeswap::detail::message({"stage ", l.stage, " runs on rank ", layout_.rank_of(l.stage)}));
          continue;
        }
        check_dataflow(r, i, l);
        if (is_p2p(l.kind)) register_p2p(r, i, l);
        if (std::uint8_t const bit = done_bit(l.kind)) produced.emplace_back(chunk{l.stage, l.micro}, bit);
      }
      for (auto const& [key, bit] : produced) done_[key] |= bit;
    }
  }

  void check_dataflow(index_type r, std::size_t i, step const& l) {
    index_type const s = l.stage, m = l.micro;
    auto need = [&](std::uint8_t bit, step_kind k, index_type stage, char const* what) {
      if (!(done_.get({stage, m}) & bit))
        add(rule::dataflow, r, i, l,
            pipeswap::detail::message({what, ": no ", to_text(leaf(k, stage, m)), " before it on rank ", r}));
    };
    if (l.kind == step_kind::fwd && s > 0) {
      if (layout_.rank_of(s - 1) == r)
        need(did_fwd, step_kind::fwd, s - 1, "FWD runs before its input is computed");
      else
        need(did_fwd_recv, step_kind::fwd_recv, s, "FWD runs before its input arrives");
    } else if (done_bit(l.kind) == did_bwd && s + 1 < layout_.stages()) {
      if (layout_.rank_of(s + 1) == r)
        need(did_bwd, step_kind::bwd, s + 1, "backward runs before its gradient is computed");
      else
        need(did_bwd_recv, step_kind::bwd_recv, s, "backward runs before its gradient arrives");
    } else if (l.kind == step_kind::fwd_send) {
      need(did_fwd, step_kind::fwd, s, "FWD_SEND sends an output not yet computed");
    } else if (l.kind == step_kind::bwd_send) {
      need(did_bwd, step_kind::bwd, s, "BWD_SEND sends a gradient not yet computed");
    }
  }

  void register_p2p(index_type r, std::size_t i, step const& l) {
    bool const forward = l.kind == step_kind::fwd_send || l.kind == step_kind::fwd_recv;
    // The stage at the other end of the message.
    index_type const peer = l.kind == step_kind::fwd_send || l.kind == step_kind::bwd_recv ? l.stage + 1 : l.stage - 1;
    if (!layout_.has_stage(peer)) {
      add(rule::no_peer, r, i, l,
          pipeswap::detail::message({step_kind_name(l.kind), (is_send(l.kind) ? " to" : " from"), " stage ", peer,
                                     ", which does not exist"}));
      return;
    }
    chunk const to{is_send(l.kind) ? peer : l.stage, l.micro};
    std::size_t& id = (forward ? forward_ids_ : backward_ids_)[to];
    if (id == no_id) {
      id = messages_.size();
      messages_.push_back({forward, to});
    }
    message& msg = messages_[id];
    std::size_t const ref = refs_.size();
    refs_.push_back({r, i, &l});
    std::size_t& first = is_send(l.kind) ? msg.first_send : msg.first_recv;
    std::size_t& last = is_send(l.kind) ? msg.last_send : msg.last_recv;
    (last == no_id ? first : refs_[last].next) = ref;
    last = ref;
  }

  // The k-th send of a message pairs with its k-th receive; the rest are unpaired.
  void pair_messages() {
    for (message const& msg : messages_) {
      std::size_t s = msg.first_send, v = msg.first_recv;
      for (; s != no_id && v != no_id; s = refs_[s].next, v = refs_[v].next) refs_[v].paired_send = s;
      index_type const from = msg.forward ? msg.to.stage - 1 : msg.to.stage + 1;
      for (; s != no_id; s = refs_[s].next) {
        step const want = leaf(msg.forward ? step_kind::fwd_recv : step_kind::bwd_recv, msg.to.stage, msg.to.micro);
        add(rule::unpaired, refs_[s].rank, refs_[s].position, *refs_[s].leaf,
            std::string(step_kind_name(refs_[s].leaf->kind)) + " has no matching " + to_text(want) +
                on_rank_of(msg.to.stage));
      }
      for (; v != no_id; v = refs_[v].next) {
        step const want = leaf(msg.forward ? step_kind::fwd_send : step_kind::bwd_send, from, msg.to.micro);
        add(rule::unpaired, refs_[v].rank, refs_[v].position, *refs_[v].leaf,
            std::string(step_kind_name(refs_[v].leaf->kind)) + " has no matching " + to_text(want) + on_rank_of(from));
      }
    }
  }

  void simulate() {
    std::size_t const n = orders_.size();
    // refs_ is in rank-major, position order, so each rank's waits come out sorted.
    std::vector<std::vector<wait>> waits(n);
    for (std::size_t k = 0; k < refs_.size(); ++k) {
      if (refs_[k].paired_send != no_id) waits[std::size_t(refs_[k].rank)].push_back({refs_[k].position, k});
    }
    std::vector<std::size_t> pc(n, 0), next_wait(n, 0);
    std::vector<std::vector<std::size_t>> waiting_on(n);
    std::vector<std::size_t> work(n);
    for (std::size_t r = 0; r < n; ++r) work[r] = n - 1 - r;
    auto sender = [&](wait const& w) -> p2p_ref const& { return refs_[refs_[w.recv].paired_send]; };
    while (!work.empty()) {
      std::size_t const r = work.back();
      work.pop_back();
      std::size_t const before = pc[r];
      auto const& w = waits[r];
      while (pc[r] < orders_[r].size()) {
        while (next_wait[r] < w.size() && w[next_wait[r]].position == pc[r] &&
               pc[std::size_t(sender(w[next_wait[r]]).rank)] > sender(w[next_wait[r]]).position)
          ++next_wait[r];
        if (next_wait[r] < w.size() && w[next_wait[r]].position == pc[r]) {
          waiting_on[std::size_t(sender(w[next_wait[r]]).rank)].push_back(r);
          break;
        }
        ++pc[r];
      }
      // Only progress can unblock a waiter (a rank blocked on itself stays blocked).
      if (pc[r] != before) {
        work.insert(work.end(), waiting_on[r].begin(), waiting_on[r].end());
        waiting_on[r].clear();
      }
    }
    // Every blocked rank waits for a rank that has not reached its send, hence is blocked too: from the
    // lowest blocked rank, following the waits closes a cycle.
    std::size_t r = 0;
    while (r < n && pc[r] == orders_[r].size()) ++r;
    if (r == n) return;
    std::vector<std::size_t> seen_at(n, no_id);
    std::vector<std::size_t> path;
    while (seen_at[r] == no_id) {
      seen_at[r] = path.size();
      path.push_back(r);
      r = std::size_t(sender(waits[r][next_wait[r]]).rank);
    }
    std::vector<std::size_t> cycle(path.begin() + std::ptrdiff_t(seen_at[r]), path.end());
    ranges::rotate(cycle, ranges::min_element(cycle));
    for (std::size_t b : cycle) {
      wait const& w = waits[b][next_wait[b]];
      p2p_ref const& send = sender(w);
      report_.deadlock.push_back(
          {index_type(b), w.position, to_text(*refs_[w.recv].leaf), send.rank, send.position, to_text(*send.leaf)});
    }
  }

  rank_orders const& orders_;
  stage_layout layout_;
  chunk_box box_;
  chunk_table<std::uint8_t> done_;
  chunk_table<std::size_t> forward_ids_, backward_ids_;
  std::vector<message> messages_;
  std::vector<p2p_ref> refs_;
  schedule_report report_;
};

} // namespace detail

/// Checks every order of `orders` (rank r = orders[r]) and the schedule they form under `layout`:
/// placement, pairing, dataflow and a deadlock simulation (see the header comment). Throws
/// invalid_argument only if orders.size() != layout.ranks().
inline schedule_report check_schedule(rank_orders const& orders, stage_layout const& layout) {
  return detail::schedule_checker(orders, layout).run();
}

/// Throws invalid_argument with to_string(report) unless check_schedule finds nothing.
inline void require_valid_schedule(rank_orders const& orders, stage_layout const& layout) {
  auto const report = check_schedule(orders, layout);
  if (!report.ok()) throw invalid_argument(to_string(report));
}

} // namespace pipeswap::schedule
