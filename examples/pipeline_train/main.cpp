// pipeline_train: a small MLP-block model trained with the pipeline executor across ranks, with
// activations and AdamW state swapped or not, checked byte for byte against single-process,
// no-swap training of the same model on the same micro-batches.
//
//   mpirun -np N pipeline_train --schedule gpipe|1f1b|interleaved --stages-per-rank V --micro M
//                               --swap none|activations|optimizer|both [--phases] --steps S [--seed X]
//   pipeline_train --ranks N ...          every rank as a thread of this process (thread_comm)
//
// Each rank labels its schedule ("1f1b micro=4"; executor_options::schedule_label) and the executor
// checks at the first step that every rank runs the same one. --rank-schedule R=KIND makes rank R
// run another kind, to see that check fail on every rank; --no-schedule-check turns it off.
//
// Prints the loss per step, each rank's peak device bytes, and ends with `bit-identical: yes` or
// `bit-identical: no` (exit status 1). A rank that fails brings every rank down; the error names the
// rank and the entry it failed at (exit status 2).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <fstream>
#include <sstream>

#include <pipeswap/schedule/json.hpp>
#include <pipeswap/schedule/validate.hpp>

#include <pipeswap/exec/mpi_comm.hpp>
#include <pipeswap/exec/thread_comm.hpp>

#include "train.hpp"

namespace pt = pipeline_train;
namespace ex = pipeswap::exec;

namespace {

char const* kind_name(pt::schedule_kind k) {
  switch (k) {
  case pt::schedule_kind::gpipe: return "gpipe";
  case pt::schedule_kind::one_f_one_b: return "1f1b";
  case pt::schedule_kind::interleaved: return "interleaved";
  }
  return "?";
}

// ----- an outcome as bytes, to gather on rank 0 --------------------------------------------------
template <class T>
void put(std::vector<std::byte>& v, T const& x) {
  auto const* p = reinterpret_cast<std::byte const*>(&x);
  v.insert(v.end(), p, p + sizeof(T));
}
template <class T>
T get(std::vector<std::byte> const& v, std::size_t& at) {
  T x{};
  if (at + sizeof(T) > v.size()) throw pipeswap::invalid_argument("pipeline_train: truncated rank report");
  std::memcpy(&x, v.data() + at, sizeof(T));
  at += sizeof(T);
  return x;
}
std::vector<std::byte> pack(pt::rank_outcome const& o) {
  std::vector<std::byte> v;
  put(v, o.rank);
  put(v, o.losses.size());
  for (float f : o.losses) put(v, f);
  put(v, o.peak_device_bytes);
  put(v, o.swapped_chunks);
  put(v, o.prefetched_batches);
  put(v, o.hazards);
  put(v, o.stage_params.size());
  for (auto const& [s, bytes] : o.stage_params) {
    put(v, s);
    put(v, bytes.size());
    v.insert(v.end(), bytes.begin(), bytes.end());
  }
  return v;
}
pt::rank_outcome unpack(std::vector<std::byte> const& v) {
  pt::rank_outcome o;
  std::size_t at = 0;
  o.rank = get<int>(v, at);
  auto const nl = get<std::size_t>(v, at);
  for (std::size_t i = 0; i < nl; ++i) o.losses.push_back(get<float>(v, at));
  o.peak_device_bytes = get<std::size_t>(v, at);
  o.swapped_chunks = get<std::size_t>(v, at);
  o.prefetched_batches = get<std::size_t>(v, at);
  o.hazards = get<std::size_t>(v, at);
  auto const ns = get<std::size_t>(v, at);
  for (std::size_t i = 0; i < ns; ++i) {
    auto const s = get<int>(v, at);
    auto const n = get<std::size_t>(v, at);
    if (at + n > v.size()) throw pipeswap::invalid_argument("pipeline_train: truncated rank report");
    o.stage_params[s].assign(v.begin() + static_cast<std::ptrdiff_t>(at),
                             v.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return o;
}

/// Every rank sends its outcome to rank 0 (two messages: size, bytes); rank 0 returns them all.
template <class C>
std::vector<std::optional<pt::rank_outcome>> gather(C& c, pt::rank_outcome const& mine,
                                                    std::chrono::milliseconds timeout) {
  int const tag_size = c.max_tag(), tag_bytes = c.max_tag() - 1;
  auto wait = [&](auto& r, std::string const& what) {
    if (!c.wait_for(r, timeout)) {
      throw ex::comm_timeout("rank " + std::to_string(c.rank()) + " waited " + std::to_string(timeout.count()) +
                             " ms for " + what);
    }
  };
  std::vector<std::optional<pt::rank_outcome>> all(static_cast<std::size_t>(c.size()));
  if (c.rank() != 0) {
    auto const bytes = pack(mine);
    std::size_t const n = bytes.size();
    auto r1 = c.isend(&n, sizeof n, 0, tag_size);
    auto r2 = c.isend(bytes.data(), n, 0, tag_bytes);
    wait(r1, "rank 0 to take its report size");
    wait(r2, "rank 0 to take its report");
    return all;
  }
  all[0] = mine;
  for (int p = 1; p < c.size(); ++p) {
    std::size_t n = 0;
    auto r1 = c.irecv(&n, sizeof n, p, tag_size);
    wait(r1, "the report size of rank " + std::to_string(p));
    std::vector<std::byte> bytes(n);
    auto r2 = c.irecv(bytes.data(), n, p, tag_bytes);
    wait(r2, "the report of rank " + std::to_string(p));
    all[static_cast<std::size_t>(p)] = unpack(bytes);
  }
  return all;
}

/// Rank 0, before training on given orders: what the validator predicts for them.
void print_verdict(pt::train_options const& o) {
  if (!o.orders) return;
  auto const verdict = pipeswap::schedule::check_schedule(*o.orders, pt::layout_of(o));
  std::printf("orders: %s\n", verdict.ok() ? "valid, deadlock-free" : pipeswap::schedule::to_string(verdict).c_str());
  std::fflush(stdout);
}

/// Rank 0's report; returns the exit status.
int report(pt::train_options const& o, std::vector<std::optional<pt::rank_outcome>> const& outs, char const* how) {
  auto const swap =
      o.swap_activations ? (o.swap_optimizer ? "both" : "activations") : (o.swap_optimizer ? "optimizer" : "none");
  std::printf(
      "pipeline_train: %s, %d ranks x %d stages per rank (%d stages of %d MLP blocks), %d micro-batches, swap %s%s, "
      "%d steps, seed %llu (%s)\n",
      kind_name(o.kind), o.ranks, o.stages_per_rank, o.ranks * o.stages_per_rank, o.model.blocks, o.model.micro, swap,
      o.swap_optimizer && o.optimizer_phases ? " (phased)" : "", o.steps, static_cast<unsigned long long>(o.model.seed),
      how);
  std::vector<float> losses;
  std::size_t hazards = 0;
  for (auto const& r : outs) {
    if (r && !r->losses.empty()) losses = r->losses;
    if (r) hazards += r->hazards;
  }
  auto const ref = pt::reference(o);
  for (std::size_t s = 0; s < losses.size(); ++s) {
    std::printf("step %zu loss %.6f (reference %.6f)\n", s + 1, static_cast<double>(losses[s]),
                static_cast<double>(ref.losses.at(s)));
  }
  for (auto const& r : outs) {
    if (!r) continue;
    std::printf("rank %d peak device bytes %zu (activation groups swapped: %zu", r->rank, r->peak_device_bytes,
                r->swapped_chunks);
    if (o.swap_optimizer && o.optimizer_phases)
      std::printf(", optimizer batches prefetched: %zu", r->prefetched_batches);
    std::printf(")\n");
  }
  if (hazards) std::printf("hazards reported: %zu\n", hazards);
  bool const same = pt::bit_identical(outs, ref) && losses == ref.losses && hazards == 0;
  std::printf("bit-identical: %s\n", same ? "yes" : "no");
  std::fflush(stdout);
  return same ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trains a small MLP-block model with the pipeswap pipeline executor and checks it byte for byte"};
  std::string kind = "1f1b", swap = "none";
  pt::train_options o;
  int ranks = 0;
  long long fail_at = -1;
  int fail_rank = -1;
  std::size_t fail_kernel = 0;
  std::string orders_file;
  long long timeout_ms = 60000;
  app.add_option("--schedule", kind, "gpipe, 1f1b or interleaved")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--stages-per-rank", o.stages_per_rank, "stages per rank (interleaved)")->check(CLI::Range(1, 64));
  app.add_option("--micro", o.model.micro, "micro-batches per step")->check(CLI::Range(1, 4096));
  app.add_option("--swap", swap, "none, activations, optimizer or both")
      ->check(CLI::IsMember({"none", "activations", "optimizer", "both"}));
  app.add_flag("--overlap", o.overlap_b_f, "interleaved: OVERLAP_B_F composites in the steady state");
  app.add_flag(
      "--phases", o.optimizer_phases,
      "optimizer swap: the runtime's phases (prefetch in the backward tail, offload deferred into the next step)");
  app.add_option("--steps", o.steps, "training steps")->check(CLI::Range(1, 1000));
  app.add_option("--seed", o.model.seed, "seed of weights and data");
  app.add_option("--ranks", ranks, "run N ranks as threads of this process (thread_comm) instead of MPI")
      ->check(CLI::Range(1, 64));
  app.add_option("--wait-timeout", timeout_ms, "watchdog on every wait for a message, in ms")
      ->check(CLI::Range(1, 3600000));
  app.add_option("--fail-rank", fail_rank, "fault injection: the rank that fails");
  app.add_option("--fail-at", fail_at,
                 "fault injection: the order position it fails at (its length: the optimizer step)");
  app.add_option("--fail-kernel", fail_kernel, "fault injection: fail the rank's (N+1)-th kernel launch instead");
  app.add_option("--orders", orders_file,
                 "run these orders (a JSON array of rank orders, swap steps as given) instead of --schedule");
  std::vector<std::string> rank_schedules;
  app.add_option("--rank-schedule", rank_schedules,
                 "R=KIND: rank R runs schedule KIND (gpipe, 1f1b, interleaved) instead of --schedule");
  bool no_check = false;
  app.add_flag("--no-schedule-check", no_check, "skip the executor's check that every rank runs one schedule");
  CLI11_PARSE(app, argc, argv);
  auto kind_of = [](std::string const& k) {
    return k == "gpipe"  ? pt::schedule_kind::gpipe
           : k == "1f1b" ? pt::schedule_kind::one_f_one_b
                         : pt::schedule_kind::interleaved;
  };
  o.kind = kind_of(kind);
  o.exec.check_schedule = !no_check;
  std::map<int, std::string> kind_of_rank;
  for (auto const& rs : rank_schedules) {
    auto const eq = rs.find('=');
    auto const k = eq == std::string::npos ? std::string() : rs.substr(eq + 1);
    if (eq == std::string::npos || (k != "gpipe" && k != "1f1b" && k != "interleaved")) {
      std::fprintf(stderr, "pipeline_train: --rank-schedule takes R=KIND, got '%s'\n", rs.c_str());
      return 2;
    }
    kind_of_rank[std::stoi(rs.substr(0, eq))] = k;
  }
  // The options rank r trains with: its schedule kind and the label the schedule check compares.
  auto for_rank = [&](pt::train_options r, int rank) {
    auto const it = kind_of_rank.find(rank);
    auto const k = it == kind_of_rank.end() ? kind : it->second;
    r.kind = kind_of(k);
    if (!r.orders) {
      r.exec.schedule_label = k + " micro=" + std::to_string(r.model.micro) +
                              " stages_per_rank=" + std::to_string(r.stages_per_rank) +
                              (r.overlap_b_f ? " overlap" : "");
    }
    return r;
  };
  if (o.kind != pt::schedule_kind::interleaved && (o.stages_per_rank != 1 || o.overlap_b_f)) {
    std::fprintf(stderr, "pipeline_train: --stages-per-rank and --overlap need --schedule interleaved\n");
    return 2;
  }
  o.swap_activations = swap == "activations" || swap == "both";
  o.swap_optimizer = swap == "optimizer" || swap == "both";
  o.exec.wait_timeout = std::chrono::milliseconds(timeout_ms);
  if (fail_rank >= 0) {
    if (fail_at >= 0) {
      o.exec.fail_at = static_cast<std::size_t>(fail_at);
    } else {
      o.fault_rank = fail_rank;
      o.fault_after = fail_kernel;
    }
  }
  auto per_rank = o; // fail_at applies on fail_rank only
  try {
    if (!orders_file.empty()) {
      std::ifstream in(orders_file);
      if (!in) throw pipeswap::invalid_argument("pipeline_train: cannot read --orders file '" + orders_file + "'");
      std::stringstream text;
      text << in.rdbuf();
      o.orders = pipeswap::schedule::rank_orders_from_json_text(text.str());
      int micro = 0;
      for (auto const& r : *o.orders)
        for (auto const& e : r)
          if (e) {
            micro = std::max(micro, e->micro + 1);
            for (auto const& l : e->sub) micro = std::max(micro, l.micro + 1);
          }
      o.model.micro = micro;
      if (ranks == 0 && !PIPESWAP_HAS_MPI) ranks = static_cast<int>(o.orders->size());
    }
    if (ranks > 0 || !PIPESWAP_HAS_MPI) {
      o.ranks = ranks > 0 ? ranks : 1;
      auto run_opts = o;
      print_verdict(o);
      pipeswap::exec::thread_world w(o.ranks);
      pt::threaded_run r;
      r.outcomes.resize(std::size_t(o.ranks));
      r.errors.resize(std::size_t(o.ranks));
      std::vector<std::thread> ts;
      for (int k = 0; k < o.ranks; ++k) {
        ts.emplace_back([&, k] {
          auto mine = for_rank(run_opts, k);
          if (fail_rank != k) mine.exec.fail_at.reset();
          try {
            auto c = w.comm(k);
            r.outcomes[std::size_t(k)] = pt::train_rank(c, mine);
          } catch (std::exception const& e) {
            r.errors[std::size_t(k)] = e.what();
            w.comm(k).abort(std::string("rank ") + std::to_string(k) + " ended with: " + e.what());
          }
        });
      }
      for (auto& t : ts) t.join();
      if (!r.ok()) {
        for (int k = 0; k < o.ranks; ++k) {
          if (!r.errors[std::size_t(k)].empty())
            std::fprintf(stderr, "pipeline_train: %s\n", r.errors[std::size_t(k)].c_str());
        }
        return 2;
      }
      return report(o, r.outcomes, "threads");
    }
#if PIPESWAP_HAS_MPI
    ex::mpi_session session(&argc, &argv);
    int code = 0;
    {
      ex::mpi_comm c;
      o.ranks = c.size();
      per_rank = for_rank(o, c.rank());
      if (fail_rank != c.rank()) per_rank.exec.fail_at.reset();
      if (c.rank() == 0) print_verdict(o);
      try {
        auto const mine = pt::train_rank(c, per_rank);
        auto const all = gather(c, mine, o.exec.wait_timeout);
        if (c.rank() == 0) code = report(o, all, "mpi");
      } catch (std::exception const& e) {
        std::fprintf(stderr, "pipeline_train: %s\n", e.what());
        std::fflush(stderr);
        try {
          c.abort(std::string("rank ") + std::to_string(c.rank()) + " ended with: " + e.what());
        } catch (...) {}
        ex::mpi_session::abort_job(2);
      }
    }
    return code;
#endif
  } catch (std::exception const& e) {
    std::fprintf(stderr, "pipeline_train: %s\n", e.what());
    return 2;
  }
  return 0;
}
