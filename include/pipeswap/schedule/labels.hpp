// pipeswap — hyper-parallel's P2P label check, ported with its exact outputs
// (docs/conformance.md).
//
// Every send and receive becomes a label `Send_Receive_({src})->({dst})_micro{m}_{k}th` on its rank,
// `k` counting the earlier labels of the same (src, dst, micro) on that rank. Consecutive labels of a
// rank are edges of one graph; a cycle in it means the two ends of some message see the messages
// between them in different orders, which under rendezvous send/recv is a deadlock.
//
// check_schedule() (validate.hpp) is the richer check — pairing, dataflow, and a simulation whose
// deadlock report names steps and positions; this port exists so that tools and tests written against
// hyper-parallel keep their exact paths and edge strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::schedule {

/// Rank name → that rank's labels, in insertion order (an insertion-ordered map).
using label_map = std::vector<std::pair<std::string, std::vector<std::string>>>;

/// A cycle: its nodes (the first repeated at the end) and its edges as "{rank} {u} -> {v}", where
/// {rank} is the last rank (in label_map order) whose labels contain that edge.
struct label_cycle {
  std::vector<std::string> path;
  std::vector<std::string> edges;
  friend bool operator==(label_cycle const&, label_cycle const&) = default;
};

/// generate_operations: labels of the top-level sends and receives of each rank
/// (`orders[r]` is rank r, named "r"; there are orders.size() * stages_per_rank stages placed by `style`).
/// A send's target (receive's source) stage is s±1; messages to or from a stage outside the layout are
/// dropped. Ranks without labels are absent. Bubbles and composites carry no labels.
inline label_map p2p_labels(rank_orders const& orders, index_type stages_per_rank, placement style = placement::loop) {
  label_map out;
  if (orders.empty()) return out;
  stage_layout const layout(index_type(orders.size()), stages_per_rank, style);
  for (std::size_t r = 0; r < orders.size(); ++r) {
    std::map<std::tuple<index_type, index_type, index_type>, int> count;
    std::vector<std::string> labels;
    for (entry const& e : orders[r]) {
      if (!e || !is_p2p(e->kind) || !layout.has_stage(e->stage)) continue;
      bool const send = is_send(e->kind);
      bool const up = e->kind == step_kind::fwd_send || e->kind == step_kind::bwd_recv;
      index_type const other = up ? e->stage + 1 : e->stage - 1;
      if (!layout.has_stage(other)) continue;
      index_type const src = send ? index_type(r) : layout.rank_of(other);
      index_type const dst = send ? layout.rank_of(other) : index_type(r);
      int const k = ++count[{src, dst, e->micro}];
      labels.push_back(
          pipeswap::detail::message({"Send_Receive_(", src, ")->(", dst, ")_micro", e->micro, "_", k, "th"}));
    }
    if (!labels.empty()) out.emplace_back(std::to_string(r), std::move(labels));
  }
  return out;
}

/// detect_cycle_in_graph, with its exact traversal: roots are edge sources in order of
/// first appearance, an iterative depth-first search visits neighbours in insertion order (parallel
/// edges kept), and the first node found on the current path closes the reported cycle. nullopt when
/// the graph is acyclic.
inline std::optional<label_cycle> find_label_cycle(label_map const& ranks) {
  std::unordered_map<std::string, std::size_t> id;
  std::vector<std::string const*> name;
  std::vector<std::vector<std::size_t>> next;
  std::vector<std::size_t> roots;
  std::vector<bool> is_root;
  std::unordered_map<std::uint64_t, std::size_t> edge_rank; // (u, v) → index into `ranks`
  auto node = [&](std::string const& s) {
    auto [it, fresh] = id.try_emplace(s, name.size());
    if (fresh) {
      name.push_back(&it->first);
      next.emplace_back();
      is_root.push_back(false);
    }
    return it->second;
  };
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    auto const& labels = ranks[r].second;
    for (std::size_t i = 0; i + 1 < labels.size(); ++i) {
      std::size_t const u = node(labels[i]);
      std::size_t const v = node(labels[i + 1]);
      next[u].push_back(v);
      if (!is_root[u]) {
        is_root[u] = true;
        roots.push_back(u);
      }
      edge_rank[(std::uint64_t(u) << 32) | v] = r;
    }
  }

  constexpr std::size_t off_path = SIZE_MAX;
  std::vector<bool> visited(name.size(), false);
  std::vector<std::size_t> path_index(name.size(), off_path);
  std::vector<std::size_t> path;
  std::vector<std::pair<std::size_t, bool>> stack; // (node, leaving)
  for (std::size_t root : roots) {
    if (visited[root]) continue;
    stack.emplace_back(root, false);
    while (!stack.empty()) {
      auto const [n, leaving] = stack.back();
      stack.pop_back();
      if (leaving) {
        path.pop_back();
        path_index[n] = off_path;
        continue;
      }
      if (path_index[n] != off_path) {
        label_cycle c;
        for (std::size_t i = path_index[n]; i < path.size(); ++i) {
          std::size_t const u = path[i];
          std::size_t const v = i + 1 < path.size() ? path[i + 1] : n;
          c.path.push_back(*name[u]);
          c.edges.push_back(ranks[edge_rank.at((std::uint64_t(u) << 32) | v)].first + " " + *name[u] + " -> " +
                            *name[v]);
        }
        c.path.push_back(*name[n]);
        return c;
      }
      if (visited[n]) continue;
      visited[n] = true;
      path_index[n] = path.size();
      path.push_back(n);
      stack.emplace_back(n, true);
      for (auto it = next[n].rbegin(); it != next[n].rend(); ++it) stack.emplace_back(*it, false);
    }
  }
  return std::nullopt;
}

/// validate_pipeline_execution: the labels and their first cycle.
struct execution_report {
  label_map operations;
  std::optional<label_cycle> cycle;
  bool has_cycle() const noexcept { return cycle.has_value(); }
};

inline execution_report validate_pipeline_execution(rank_orders const& orders, index_type stages_per_rank,
                                                    placement style = placement::loop) {
  execution_report out{p2p_labels(orders, stages_per_rank, style), std::nullopt};
  out.cycle = find_label_cycle(out.operations);
  return out;
}

} // namespace pipeswap::schedule
