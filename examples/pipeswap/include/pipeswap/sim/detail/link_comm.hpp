// pipeswap — the pipeline simulator's P2P link between its ranks (internal to sim/pipeline.hpp): a
// stream-ordered comm on the mock devices' virtual clocks, and the mailbox of messages in flight.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/exec/comm.hpp>
#include <pipeswap/exec/executor_options.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/sim/model.hpp>

namespace pipeswap::sim::detail {

using mock::sim_time;
using schedule::index_type;
using schedule::step;
using schedule::step_kind;

/// Messages in flight between ranks: arrival times on the receiver's clock by (sender, receiver,
/// tag).
struct mailbox {
  std::map<std::tuple<int, int, int>, sim_time> arrivals;
  /// Per receiver: messages posted to it so far (a rank whose receive found no message polls again
  /// only once this has grown: nothing else can complete it).
  std::vector<std::uint64_t> posted_to;

  void post(int from, int to, int tag, sim_time arrival) {
    arrivals[{from, to, tag}] = arrival;
    if (static_cast<std::size_t>(to) >= posted_to.size()) posted_to.resize(static_cast<std::size_t>(to) + 1, 0);
    ++posted_to[static_cast<std::size_t>(to)];
  }
  [[nodiscard]] std::uint64_t posted(int to) const {
    return static_cast<std::size_t>(to) < posted_to.size() ? posted_to[static_cast<std::size_t>(to)] : 0;
  }
};

/// The scenario's P2P link between the simulated ranks, as a stream-ordered comm
/// (exec::stream_ordered_comm) on the mock devices' virtual clocks: a send enqueued on a stream
/// leaves when that stream reaches it and arrives one link time later (latency plus bytes over the
/// P2P link of the two ranks, p2p_crosses_nodes); a receive completes once its message was sent, and
/// then makes its stream wait the arrival. Every rank runs on one thread (simulate_orders advances
/// each until a receive has no message yet), so a wait that cannot complete now never will:
/// wait_for() does not block.
class link_comm {
public:
  using comm_concept = exec::comm_tag;
  static constexpr bool reads_device_memory = true;
  static constexpr bool stream_ordered = true;
  struct request_type {
    bool done = false;
    int peer = 0, tag = 0;
    mock::stream stream{};
  };

  link_comm(mock::backend& b, mailbox& mb, int rank, int size, index_type stages, scenario const& s)
      : b_(b), mb_(mb), rank_(rank), size_(size), stages_(stages), s_(s) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  int max_tag() const { return std::numeric_limits<int>::max(); }

  request_type isend(void const*, std::size_t, int, int) {
    throw exec::comm_error("link_comm: operations are stream-ordered");
  }
  request_type irecv(void*, std::size_t, int, int) {
    throw exec::comm_error("link_comm: operations are stream-ordered");
  }

  request_type isend(void const*, std::size_t n, int peer, int tag, mock::stream s) {
    auto const start = std::max(b_.ready_time(s), b_.now());
    auto const arrival = start + link_time(n, peer);
    auto const m = exec::boundary_of_tag(tag, stages_);
    b_.wait_until(s, arrival,
                  named(m.dir ? step_kind::bwd_send : step_kind::fwd_send, m.dir ? m.stage + 1 : m.stage - 1, m.micro));
    mb_.post(rank_, peer, tag, arrival);
    return {true, peer, tag, s};
  }
  request_type irecv(void*, std::size_t, int peer, int tag, mock::stream s) { return {false, peer, tag, s}; }

  bool test(request_type& r) {
    if (r.done) return true;
    auto it = mb_.arrivals.find({r.peer, rank_, r.tag});
    if (it == mb_.arrivals.end()) return false;
    auto const arrival = it->second;
    mb_.arrivals.erase(it);
    auto const m = exec::boundary_of_tag(r.tag, stages_);
    b_.wait_until(r.stream, arrival, named(m.dir ? step_kind::bwd_recv : step_kind::fwd_recv, m.stage, m.micro));
    r.done = true;
    return true;
  }
  bool wait_for(request_type& r, std::chrono::milliseconds) { return test(r); }
  void abort(std::string_view) {}

private:
  /// The entry a wait is for, as the mock's op log names it (nothing when it keeps no log).
  std::string named(step_kind k, index_type stage, index_type micro) const {
    return b_.config().keep_op_log ? schedule::to_text(schedule::leaf(k, stage, micro)) : std::string();
  }

  /// Latency plus bytes over the link to `peer`: NVLink's pair rate inside a node, the network's
  /// across nodes (p2p_crosses_nodes).
  sim_time link_time(std::size_t bytes, int peer) const {
    auto const& d = s_.device;
    bool const remote = p2p_crosses_nodes(s_, static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(peer));
    double const latency_us = remote ? d.network_latency_us : d.p2p_latency_us;
    double const gbps = remote ? d.network_gbps : d.p2p_gbps;
    return static_cast<sim_time>(latency_us * 1e3 + static_cast<double>(bytes) / (gbps * 1e9) * 1e9);
  }

  mock::backend& b_;
  mailbox& mb_;
  int rank_, size_;
  index_type stages_;
  scenario const& s_;
};

static_assert(exec::stream_ordered_comm<link_comm, mock::stream>);

} // namespace pipeswap::sim::detail
