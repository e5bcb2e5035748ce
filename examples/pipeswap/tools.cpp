// pipeswap schedule, inject, validate and partition: JSON in, JSON out, for scripts.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/json.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/validate.hpp>
#include <pipeswap/swap/partition.hpp>

#include "commands.hpp"

namespace pipeswap_cli {

namespace ps = pipeswap::schedule;
using ojson = nlohmann::ordered_json;

namespace {

void print(ojson const& j, int indent) { std::cout << j.dump(indent) << "\n"; }

ps::index_type index_arg(char const* name, std::int64_t v) {
  if (v < 1 || v > std::numeric_limits<ps::index_type>::max())
    throw bad_input(std::string("--") + name + " must be between 1 and " +
                    std::to_string(std::numeric_limits<ps::index_type>::max()) + ", got " + std::to_string(v));
  return static_cast<ps::index_type>(v);
}

// The input of inject and validate: one order, or {"ranks": [order, ...]}.
struct orders_input {
  bool several = false;
  ps::rank_orders orders;
};

orders_input read_orders(std::string const& path, bool allow_several) {
  auto const j = parse_json(read_input(path), "input");
  orders_input in;
  if (j.is_object()) {
    if (!allow_several) throw bad_input("input: expected one order (a JSON array), got an object");
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "ranks") throw bad_input("input: unknown key '" + it.key() + "' (expected only 'ranks')");
    auto const r = j.find("ranks");
    if (r == j.end()) throw bad_input("input: missing 'ranks'");
    in.several = true;
    in.orders = ps::rank_orders_from_json(*r);
  } else if (j.is_array()) {
    in.orders.push_back(ps::order_from_json(j));
  } else {
    throw bad_input(std::string("input: expected ") + (allow_several ? "{\"ranks\": [...]} or " : "") +
                    "an order (a JSON array), got " + j.type_name());
  }
  return in;
}

ojson problem_json(ps::problem const& p) {
  ojson j = ojson::object();
  j["rule"] = ps::rule_name(p.broken);
  j["rank"] = p.rank == ps::no_index ? ojson(nullptr) : ojson(p.rank);
  j["position"] = p.position;
  j["step"] = p.step;
  j["message"] = p.message;
  return j;
}

} // namespace

int run_schedule(schedule_args const& a) {
  auto const ranks = index_arg("ranks", a.ranks);
  auto const micro = index_arg("micro", a.micro);
  auto const stages_per_rank = index_arg("stages_per_rank", a.stages_per_rank);
  bool const interleaved = a.kind == "interleaved";
  if (!interleaved && stages_per_rank != 1)
    throw bad_input("--stages-per-rank " + std::to_string(stages_per_rank) + " needs --kind interleaved");
  if (!interleaved && a.overlap_b_f) throw bad_input("--overlap-b-f needs --kind interleaved");
  ps::rank_orders orders;
  if (a.kind == "gpipe")
    orders = ps::gpipe(ranks, micro);
  else if (a.kind == "1f1b")
    orders = ps::one_f_one_b(ranks, micro);
  else if (interleaved)
    orders = ps::interleaved_1f1b({ranks, stages_per_rank, micro, a.overlap_b_f});
  else
    throw bad_input("--kind must be gpipe, 1f1b or interleaved, got '" + a.kind + "'");
  ojson j = ojson::object();
  j["ranks"] = ps::to_json(orders);
  print(j, a.indent);
  return exit_ok;
}

int run_inject(inject_args const& a) {
  auto const in = read_orders(a.input, false);
  auto const& o = in.orders.front();
  auto const gap = a.min_gap.value_or(0);
  std::map<ps::chunk, std::size_t> gaps;
  for (auto const& c : ps::swap_candidates(o)) gaps[c.key] = c.gap();
  auto out = ps::inject_swap_steps(o, [&](ps::chunk c) {
    if (gap <= ps::min_swap_gap) return true;
    auto const it = gaps.find(c);
    return it != gaps.end() && it->second >= gap;
  });
  print(ps::to_json(out), a.indent);
  return exit_ok;
}

int run_validate(validate_args const& a) {
  auto const in = read_orders(a.input, true);
  ojson j = ojson::object();
  ojson problems = ojson::array();
  ojson deadlock = ojson::array();
  std::size_t count = 0;
  if (!in.several) {
    for (auto const& p : ps::check_order(in.orders.front())) problems.push_back(problem_json(p)), ++count;
  } else {
    if (in.orders.empty()) throw bad_input("input: 'ranks' holds no order");
    auto const ranks = index_arg("ranks", static_cast<std::int64_t>(in.orders.size()));
    std::int64_t stages_per_rank = 1;
    if (a.stages_per_rank) {
      stages_per_rank = *a.stages_per_rank;
    } else { // as many stages per rank as the highest stage needs
      ps::index_type top = 0;
      for (auto const& o : in.orders)
        for (auto const& e : o)
          if (e)
            for (auto const& l : ps::leaves_of(*e)) top = std::max(top, l.stage);
      stages_per_rank = std::max<std::int64_t>(1, (std::int64_t(top) + ranks) / ranks);
    }
    ps::stage_layout const layout(ranks, index_arg("stages_per_rank", stages_per_rank),
                                  a.placement == "v" ? ps::placement::v : ps::placement::loop);
    auto const report = ps::check_schedule(in.orders, layout);
    for (auto const& p : report.problems) problems.push_back(problem_json(p)), ++count;
    for (auto const& b : report.deadlock) {
      ojson d = ojson::object();
      d["rank"] = b.rank;
      d["position"] = b.position;
      d["step"] = b.step;
      d["peer_rank"] = b.peer_rank;
      d["peer_position"] = b.peer_position;
      d["peer_step"] = b.peer_step;
      deadlock.push_back(std::move(d));
    }
    j["stages_per_rank"] = stages_per_rank;
    j["placement"] = a.placement;
  }
  bool const ok = problems.empty() && deadlock.empty();
  j["valid"] = ok;
  j["problems"] = std::move(problems);
  j["deadlock"] = std::move(deadlock);
  print(j, a.indent);
  if (!ok) {
    std::cerr << "pipeswap validate: " << count << (count == 1 ? " problem" : " problems")
              << (j["deadlock"].empty() ? "" : " and a deadlock") << "\n";
    return exit_failed;
  }
  return exit_ok;
}

int run_partition(partition_args const& a) {
  auto const j = parse_json(read_input(a.input), "input");
  if (!j.is_object())
    throw bad_input(std::string("input: expected an object {\"costs\": [...], \"swap_times\": K}, got ") +
                    j.type_name());
  bool const split = a.policy == "split";
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "costs" || it.key() == "swap_times" || (split && it.key() == "granularity")) continue;
    throw bad_input("input: unknown key '" + it.key() + "'" +
                    (it.key() == "granularity" ? " (only with --policy split)" : ""));
  }
  auto uint_field = [&](nlohmann::json const& v, std::string const& what) -> std::uint64_t {
    if (!v.is_number_unsigned()) throw bad_input("input: " + what + " must be a non-negative integer, got " + v.dump());
    return v.get<std::uint64_t>();
  };
  auto const costs_it = j.find("costs");
  if (costs_it == j.end()) throw bad_input("input: missing 'costs'");
  if (!costs_it->is_array())
    throw bad_input("input: 'costs' must be an array, got " + std::string(costs_it->type_name()));
  auto const k_it = j.find("swap_times");
  if (k_it == j.end()) throw bad_input("input: missing 'swap_times'");
  auto const k = uint_field(*k_it, "'swap_times'");
  std::vector<std::uint64_t> costs;
  costs.reserve(costs_it->size());
  for (std::size_t i = 0; i < costs_it->size(); ++i)
    costs.push_back(uint_field((*costs_it)[i], "'costs' element " + std::to_string(i)));

  ojson out = ojson::object();
  ojson sizes = ojson::array(), batch_costs = ojson::array();
  if (!split) {
    auto const s = pipeswap::partition_sizes(costs, static_cast<std::size_t>(k));
    std::size_t u = 0;
    for (auto n : s) {
      std::uint64_t total = 0;
      for (std::size_t e = 0; e < n; ++e, ++u) total += costs[u];
      sizes.push_back(n);
      batch_costs.push_back(total);
    }
    out["sizes"] = std::move(sizes);
    out["batch_costs"] = std::move(batch_costs);
  } else {
    pipeswap::split_partition policy;
    if (auto const g = j.find("granularity"); g != j.end()) policy.granularity = uint_field(*g, "'granularity'");
    std::vector<pipeswap::partition_item> items;
    items.reserve(costs.size());
    for (auto c : costs) items.push_back({c, 1});
    auto const plan = policy(items, static_cast<std::size_t>(k));
    ojson batches = ojson::array();
    for (auto const& batch : plan) {
      std::uint64_t total = 0;
      ojson ranges = ojson::array();
      for (auto const& r : batch) {
        total += r.end - r.begin;
        ranges.push_back({{"unit", r.unit}, {"begin", r.begin}, {"end", r.end}});
      }
      sizes.push_back(batch.size());
      batch_costs.push_back(total);
      batches.push_back(std::move(ranges));
    }
    out["sizes"] = std::move(sizes);
    out["batch_costs"] = std::move(batch_costs);
    out["batches"] = std::move(batches);
  }
  print(out, a.indent);
  return exit_ok;
}

} // namespace pipeswap_cli
