// pipeswap — the mock backend's hazard checker: the rules an operation is checked against and the
// report it produces.
//
// The checker keeps a happens-before relation (vector clocks over the host thread and the streams)
// and, per allocation, a shadow map of the last write and the reads since (detail/shadow.hpp). An
// operation about to be committed is checked touch by touch; the report names the operation, the
// rule it broke, the conflicting operation with its stream and times, the storage, and the op trace
// that led to it.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/mock/detail/op_log.hpp>
#include <pipeswap/backend/mock/detail/shadow.hpp>
#include <pipeswap/backend/mock/detail/storage.hpp>
#include <pipeswap/backend/mock/hazard.hpp>
#include <pipeswap/backend/mock/types.hpp>

namespace pipeswap::mock::detail {

inline std::string storage_text(allocation const& a, std::size_t lo, std::size_t hi) {
  return pipeswap::detail::message(
      {a.device ? "device" : "pinned host", " allocation #", a.id, " bytes [", lo, ", ", hi, ")"});
}

/// The hazard, if any, of one touch of operation `op` (not yet logged) of kind `k` named `name`.
/// The report's text is formatted only once a hazard is found: a clean touch costs the check alone.
inline std::optional<hazard> find_hazard(touches::one const& x, planned const& p, std::uint64_t op, op_kind k,
                                         std::string const& name, op_log const& log) {
  auto const self = [&] { return log.op_text(op, k, name, p.agent, p.start, p.end); };
  if (x.a->released) {
    return hazard{hazard_kind::use_after_release,
                  op,
                  x.a->release_op,
                  x.a->id,
                  x.lo,
                  x.hi - x.lo,
                  self() + " uses " + storage_text(*x.a, x.lo, x.hi) + " after " + log.op_text(x.a->release_op) +
                      " released it"};
  }
  auto const c = x.a->shadow->check(x.lo, x.hi, x.mode, p.clock);
  if (!c) return std::nullopt;
  auto const& r = log.at(c->other.op);
  auto const other = log.op_text(c->other.op);
  hazard_kind kind{};
  std::string rule;
  if (x.mode == access_mode::release) {
    kind = hazard_kind::release_while_in_use;
    rule = pipeswap::detail::message({" releases ", storage_text(*x.a, 0, x.a->size), " while ", other,
                                      " still uses bytes [", c->lo, ", ", c->hi,
                                      ") and is not ordered before the release"});
  } else if (r.kind == op_kind::allocate) {
    kind = hazard_kind::read_before_write;
    rule = " uses " + storage_text(*x.a, c->lo, c->hi) + " allocated by " + other +
           ", which is not ordered before it (stream-ordered memory is usable only by work "
           "ordered after its allocation)";
  } else if (c->other_wrote && x.mode != access_mode::write) {
    bool const host_after_d2h = p.agent == 0 && r.kind == op_kind::d2h;
    kind = host_after_d2h ? hazard_kind::unsynchronized_host_read : hazard_kind::read_before_write;
    rule = " reads " + storage_text(*x.a, c->lo, c->hi) + " written by " + other +
           (host_after_d2h ? ", which the host has not synchronized with (synchronize an event "
                             "recorded after the copy first)"
                           : ", which is not ordered before it (missing wait_event?)");
  } else {
    kind = hazard_kind::write_while_in_use;
    rule = " writes " + storage_text(*x.a, c->lo, c->hi) + " while " + other + " still " +
           (c->other_wrote ? "writes" : "reads") + " it and is not ordered before the write";
  }
  return hazard{kind, op, c->other.op, x.a->id, c->lo, c->hi - c->lo, self() + rule};
}

/// Checks every touch of operation `op` (the next to be logged). Under hazard_policy::raise throws
/// hazard_error at the first hazard, before any state changes; under `record` appends one report per
/// conflicting touch to `out`; under `ignore` checks nothing.
inline void check_touches(touches const& t, planned const& p, op_kind k, std::string const& name, op_log const& log,
                          options const& opts, std::vector<hazard>& out) {
  if (opts.hazards == hazard_policy::ignore) return;
  auto const op = log.size();
  for (auto const& x : t.list) {
    auto h = find_hazard(x, p, op, k, name, log);
    if (!h) continue;
    std::ostringstream last;
    last << "  #" << op << " " << to_string(k) << " '" << name << "' on " << log.lane(p.agent) << " t=[" << p.start
         << "," << p.end << ")   <-- offending operation\n";
    h->message = "pipeswap mock: " + std::string(to_string(h->kind)) + ": " + h->message +
                 "\nop trace (oldest first):\n" +
                 (op == 0 ? std::string{} : log.format_trace(op - 1, opts.trace_context)) + last.str();
    if (opts.hazards == hazard_policy::raise) throw hazard_error(std::move(*h));
    out.push_back(std::move(*h));
  }
}

/// Records every touch of a committed operation in the shadow maps.
inline void record_touches(touches const& t, planned const& p, std::uint64_t op) {
  for (auto const& x : t.list) {
    if (x.a->released) continue;
    x.a->shadow->record(x.lo, x.hi, x.mode, {p.agent, p.seq, op}, p.clock);
  }
}

} // namespace pipeswap::mock::detail
