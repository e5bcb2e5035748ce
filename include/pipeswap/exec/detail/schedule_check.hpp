// pipeswap — the pipeline executor's schedule check (executor_options::check_schedule).
//
// Every step, each rank sends every other rank a fixed header (layout, micro-batches, sizes, the
// digest of its label and order) on the comm's largest tag, posted at begin_step; the executor
// completes the exchange before its first entry (blocking under its watchdog, or by test() in
// advance()). Every rank then holds every digest and decides alike: when one differs from the
// digests of the last passed check (always at the first step), each rank sends every other its label
// and order as text, and every rank reaches the same verdict on them (layout, micro-batch count,
// label, then schedule::check_schedule over all orders). So a change on some ranks only is checked
// too. For comms that take host memory only (the executor decides). Not public API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/comm.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/schedule/validate.hpp>

namespace pipeswap::exec::detail {

template <comm C>
class schedule_check {
public:
  [[nodiscard]] bool pending() const noexcept { return pending_; }
  /// Forgets an exchange in flight (after an abort: its requests never complete).
  void drop() noexcept { x_ = {}, pending_ = false; }

  /// Posts this step's header to every other rank and the receives of theirs.
  void start(C& c, schedule::stage_layout const& layout, schedule::order const& order, std::string const& label) {
    auto text = schedule::to_text(order);
    auto const digest = fnv1a(text, fnv1a(label));
    auto const n = static_cast<std::size_t>(c.size());
    auto const me = static_cast<std::size_t>(c.rank());
    drop();
    auto& k = x_;
    k.header = {header_magic,
                c.rank(),
                layout.stages(),
                layout.ranks(),
                layout.stages_per_rank(),
                micro_count(order),
                static_cast<std::int64_t>(label.size()),
                static_cast<std::int64_t>(text.size()),
                static_cast<std::int64_t>(digest)};
    k.body = label + text + "."; // never empty
    k.headers.assign(n, std::vector<std::int64_t>(h_count));
    k.headers[me] = k.header;
    k.bodies.assign(n, std::string());
    k.bodies[me] = k.body;
    k.recvs.resize(n);
    k.done.assign(n, 0);
    k.done[me] = 1;
    pending_ = true;
    k.round = 1;
    std::size_t const header_bytes = h_count * sizeof(std::int64_t);
    for (std::size_t p = 0; p < n; ++p) {
      if (p == me) continue;
      int const peer = static_cast<int>(p);
      k.sends.push_back(c.isend(k.header.data(), header_bytes, peer, c.max_tag()));
      k.recvs[p] = c.irecv(k.headers[p].data(), header_bytes, peer, c.max_tag());
    }
  }

  /// Advances the exchange; true when it is over and the ranks run one schedule. Non-blocking: false
  /// while a message has not arrived. Blocking: `await(request, what)` waits (under the watchdog).
  /// Throws invalid_argument naming the ranks and the first difference on a mismatch.
  template <class Await>
  bool progress(C& c, schedule::stage_layout const& layout, bool blocking, Await&& await) {
    auto& k = x_;
    auto const n = static_cast<std::size_t>(c.size());
    auto const me = static_cast<std::size_t>(c.rank());
    if (k.round == 1) {
      if (!complete(c, k.recvs, blocking, await, "header")) return false;
      for (std::size_t p = 0; p < n; ++p) {
        auto const& h = k.headers[p];
        if (h[h_magic] != header_magic || h[h_rank] != static_cast<std::int64_t>(p) || h[h_label] < 0 ||
            h[h_text] < 0 || h[h_label] + h[h_text] > (std::int64_t{1} << 32)) {
          throw invalid_argument(
              pipeswap::detail::message({"pipeline_executor: schedule check: rank ", p,
                                         " sent no schedule header (is its executor_options::check_schedule on?)"}));
        }
      }
      // Every rank holds the same digests and the same record of the last check: all decide alike.
      k.full = checked_.size() != n;
      for (std::size_t p = 0; p < n && !k.full; ++p)
        k.full = checked_[p] != static_cast<std::uint64_t>(k.headers[p][h_digest]);
      if (k.full) {
        k.done.assign(n, 0);
        k.done[me] = 1;
        for (std::size_t p = 0; p < n; ++p) {
          if (p == me) continue;
          int const peer = static_cast<int>(p);
          k.sends.push_back(c.isend(k.body.data(), k.body.size(), peer, c.max_tag()));
          k.bodies[p].assign(static_cast<std::size_t>(k.headers[p][h_label] + k.headers[p][h_text]) + 1, '\0');
          k.recvs[p] = c.irecv(k.bodies[p].data(), k.bodies[p].size(), peer, c.max_tag());
        }
        k.round = 2;
      } else {
        k.done.assign(k.sends.size(), 0);
        k.round = 3;
      }
    }
    if (k.round == 2) {
      if (!complete(c, k.recvs, blocking, await, "order")) return false;
      k.done.assign(k.sends.size(), 0);
      k.round = 3;
    }
    if (!complete(c, k.sends, blocking, await, "own header and order sent to every")) return false;
    if (k.full) {
      compare(layout);
      checked_.assign(n, 0);
      for (std::size_t p = 0; p < n; ++p) checked_[p] = static_cast<std::uint64_t>(k.headers[p][h_digest]);
    }
    drop();
    return true;
  }

private:
  /// Header fields, in order.
  enum header_field : std::size_t {
    h_magic,
    h_rank,
    h_stages,
    h_ranks,
    h_stages_per_rank,
    h_micro,
    h_label,
    h_text,
    h_digest,
    h_count
  };
  static constexpr std::int64_t header_magic = 0x7073636865636b31; // "pscheck1"

  struct exchange {
    int round = 0;     // 1: headers awaited, 2: orders awaited, 3: sends awaited
    bool full = false; // the orders are exchanged and compared
    std::vector<std::int64_t> header;
    std::string body;                               // label, then the order's text
    std::vector<std::vector<std::int64_t>> headers; // per rank (this rank's too)
    std::vector<std::string> bodies;
    std::vector<request_t<C>> recvs, sends;
    std::vector<char> done;
  };

  static std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 1469598103934665603ull) noexcept {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
  }

  static std::int64_t micro_count(schedule::order const& o) {
    schedule::index_type m = -1;
    for (auto const& e : o) {
      if (!e) continue;
      m = std::max(m, e->micro);
      for (auto const& l : e->sub) m = std::max(m, l.micro);
    }
    return m + 1;
  }

  /// Completes the requests in `rs` not done yet; false when one is not complete (non-blocking).
  template <class Await>
  bool complete(C& c, std::vector<request_t<C>>& rs, bool blocking, Await& await, char const* what) {
    for (std::size_t p = 0; p < rs.size(); ++p) {
      if (x_.done[p]) continue;
      if (blocking) {
        await(rs[p], pipeswap::detail::message({"the schedule check's ", what, " of rank ", p}));
      } else if (!c.test(rs[p])) {
        return false;
      }
      x_.done[p] = 1;
    }
    return true;
  }

  /// Throws invalid_argument naming the ranks and the first difference unless every rank's header
  /// agrees with rank 0's and the orders form one schedule.
  void compare(schedule::stage_layout const& layout) const {
    auto const& k = x_;
    auto const n = k.headers.size();
    auto label = [&](std::size_t r) { return k.bodies[r].substr(0, static_cast<std::size_t>(k.headers[r][h_label])); };
    auto fail = [&](std::size_t r, std::string const& what) {
      throw invalid_argument(pipeswap::detail::message(
          {"pipeline_executor: schedule check: ranks 0 and ", r, " do not run the same schedule: ", what}));
    };
    for (std::size_t r = 1; r < n; ++r) {
      auto const &a = k.headers[0], &h = k.headers[r];
      if (a[h_stages] != h[h_stages] || a[h_ranks] != h[h_ranks] || a[h_stages_per_rank] != h[h_stages_per_rank]) {
        fail(r, pipeswap::detail::message({"layouts of ", a[h_stages], " stages on ", a[h_ranks], " ranks against ",
                                           h[h_stages], " stages on ", h[h_ranks], " ranks"}));
      }
      if (a[h_micro] != h[h_micro]) {
        fail(r, pipeswap::detail::message({a[h_micro], " against ", h[h_micro], " micro-batches"}));
      }
      if (label(0) != label(r)) fail(r, "schedule_label '" + label(0) + "' against '" + label(r) + "'");
    }
    schedule::rank_orders orders;
    for (std::size_t r = 0; r < n; ++r) {
      auto const from = static_cast<std::size_t>(k.headers[r][h_label]);
      orders.push_back(schedule::order_from_text(
          std::string_view(k.bodies[r]).substr(from, static_cast<std::size_t>(k.headers[r][h_text]))));
    }
    auto const report = schedule::check_schedule(orders, layout);
    if (!report.problems.empty() || !report.deadlock.empty()) {
      std::string digests;
      for (std::size_t r = 0; r < n; ++r) {
        char hex[20];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(k.headers[r][h_digest]));
        pipeswap::detail::append(digests, {(r ? ", rank " : "rank "), r, " ", hex});
      }
      throw invalid_argument(pipeswap::detail::message({"pipeline_executor: schedule check: the orders of the ", n,
                                                        " ranks do not form one schedule (order digests: ", digests,
                                                        "): ", schedule::to_string(report)}));
    }
  }

  exchange x_;
  bool pending_ = false;
  std::vector<std::uint64_t> checked_; // every rank's digest at the last passed check
};

} // namespace pipeswap::exec::detail
