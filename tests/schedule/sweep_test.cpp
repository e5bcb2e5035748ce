// Sweeps: GPipe and 1F1B for 1..8 ranks x 1..32 micro-batches, interleaved 1F1B also for 1..4 stages per rank,
// with and without OVERLAP_B_F composites. Every schedule must be fully paired, deadlock-free and free
// of label cycles; every injected order well-formed, with the original entries in their
// order, exactly five swap steps per swapped chunk, each swapped chunk's backward at least four compute
// slots after its forward, and the whole injected schedule still valid. The totals are pinned to the
// values hyper-parallel's scheduler produces for the same sweep.
#include <boost/test/unit_test.hpp>

#include "support/sanitized.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/json.hpp>
#include <pipeswap/schedule/labels.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/schedule/validate.hpp>

namespace ps = pipeswap::schedule;
using ps::step_kind;

namespace {

struct totals {
  std::size_t entries = 0, swapped = 0, bubbles = 0, p2p = 0;
  friend bool operator==(totals const&, totals const&) = default;
  friend std::ostream& operator<<(std::ostream& os, totals const& t) {
    return os << "{entries " << t.entries << ", swapped " << t.swapped << ", bubbles " << t.bubbles << ", p2p " << t.p2p
              << "}";
  }
};

// Checks one swapped order against its original without using the validators: per chunk, the five
// swap steps once each, in life-cycle order around the chunk's FWD and BWD entries, with a gap of at
// least min_swap_gap compute slots, and the load launched before compute slot max(bwd − lookahead,
// fwd + 2) (lookahead 1: the reference's last slot in between); the entries other than swap steps are
// the original ones. Counts the swapped chunks into `swapped`.
std::string independent_check(ps::order const& original, ps::order const& injected, int stages, int micros,
                              std::size_t& swapped, std::size_t lookahead = 1, std::size_t delay = 1) {
  ps::order kept;
  kept.reserve(original.size());
  // Per chunk: positions of SG, F, LO, WO, LL, WL, B; swap-step counts; compute slots of F and B.
  struct life {
    std::array<long, 7> at{-1, -1, -1, -1, -1, -1, -1};
    std::array<int, 5> count{};
    long fwd_slot = -1, bwd_slot = -1;
    long load_slot = -1; // the compute slot LAUNCH_LOAD precedes
    long wait_slot = -1; // the compute slot WAIT_OFFLOAD precedes
  };
  std::vector<life> lives(std::size_t(stages * micros));
  auto life_of = [&](ps::step const& s) -> life& { return lives[std::size_t(s.stage * micros + s.micro)]; };
  long slot = 0;
  for (std::size_t i = 0; i < injected.size(); ++i) {
    ps::entry const& e = injected[i];
    if (e && ps::is_swap(e->kind)) {
      auto& l = life_of(*e);
      int const k = int(e->kind) - int(step_kind::swap_set_group);
      ++l.count[std::size_t(k)];
      static constexpr int where[] = {0, 2, 3, 4, 5};
      l.at[std::size_t(where[k])] = long(i);
      if (e->kind == step_kind::swap_launch_load) l.load_slot = slot;
      if (e->kind == step_kind::swap_wait_offload) l.wait_slot = slot;
      continue;
    }
    kept.push_back(e);
    if (!e) continue;
    bool compute = false;
    for (ps::step const& leaf : ps::leaves_of(*e)) {
      if (!ps::is_compute(leaf.kind)) continue;
      compute = true;
      auto& l = life_of(leaf);
      if (leaf.kind == step_kind::fwd)
        l.at[1] = long(i), l.fwd_slot = slot;
      else
        l.at[6] = long(i), l.bwd_slot = slot;
    }
    if (compute) ++slot;
  }
  if (!(kept == original)) return "original entries changed";
  for (std::size_t k = 0; k < lives.size(); ++k) {
    life const& l = lives[k];
    int const steps = l.count[0] + l.count[1] + l.count[2] + l.count[3] + l.count[4];
    if (steps == 0) continue;
    ++swapped;
    std::string const name =
        "chunk (" + std::to_string(k / std::size_t(micros)) + "," + std::to_string(k % std::size_t(micros)) + ")";
    for (int c : l.count) {
      if (c != 1) return name + ": not exactly one of each swap step";
    }
    for (std::size_t j = 0; j + 1 < l.at.size(); ++j) {
      if (!(l.at[j] < l.at[j + 1])) return name + ": life cycle out of order";
    }
    if (l.bwd_slot - l.fwd_slot < long(ps::min_swap_gap)) return name + ": gap below min_swap_gap";
    // The wait follows the entry of slot w (and its P2P run), so it precedes slot w + 1.
    long const w = std::max(l.fwd_slot + 1, std::min(l.fwd_slot + long(delay), l.bwd_slot - long(lookahead) - 1));
    if (l.wait_slot != w + 1)
      return name + ": offload waited before slot " + std::to_string(l.wait_slot) + ", not " + std::to_string(w + 1) +
             " (delay " + std::to_string(delay) + ")";
    if (l.load_slot != std::max(l.bwd_slot - long(lookahead), w + 1))
      return name + ": load launched before slot " + std::to_string(l.load_slot) + ", not " +
             std::to_string(lookahead) + " slot(s) ahead of its backward at " + std::to_string(l.bwd_slot);
  }
  return {};
}

// Text and JSON round trips, the reference's label check and the whole-schedule check of the injected
// orders run on a sample of micro-batch counts that still covers M < R, M = R, M > R and uneven rounds
// (they are the slow part under ASan); everything else runs on every combination.
bool sampled(int micro) { return micro == 1 || micro == 3 || micro == 8 || micro == 13 || micro == 32; }

void check_family(std::string const& family, std::function<ps::rank_orders(int, int)> const& make, int stages_per_rank,
                  totals& sum, bool round_trip) {
  for (int ranks = 1; ranks <= 8; ++ranks) {
    for (int micro = 1; micro <= 32; ++micro) {
      if (pipeswap::test::sanitized_build && !sampled(micro)) continue; // the sample, under sanitizers
      auto const where = [&] {
        return family + " ranks=" + std::to_string(ranks) + " micro=" + std::to_string(micro) +
               " stages_per_rank=" + std::to_string(stages_per_rank);
      };
      auto const orders = make(ranks, micro);
      ps::stage_layout const layout(ranks, stages_per_rank);
      auto const report = ps::check_schedule(orders, layout);
      if (!report.ok()) BOOST_ERROR(where() << ": " << to_string(report));
      if (sampled(micro) && ps::find_label_cycle(ps::p2p_labels(orders, stages_per_rank)))
        BOOST_ERROR(where() << ": label cycle");

      ps::rank_orders injected;
      for (std::size_t r = 0; r < orders.size(); ++r) {
        ps::order const& o = orders[r];
        injected.push_back(ps::inject_swap_steps(o));
        ps::order const& in = injected.back();
        if (auto const problems = ps::check_order(in); !problems.empty())
          BOOST_ERROR(where() << " rank " << r << ": " << to_string(problems.front()));
        std::size_t swapped = 0;
        if (auto const why = independent_check(o, in, ranks * stages_per_rank, micro, swapped); !why.empty())
          BOOST_ERROR(where() << " rank " << r << ": " << why);
        if (in.size() != o.size() + 5 * swapped) BOOST_ERROR(where() << " rank " << r << ": not 5 steps per chunk");
        sum.entries += o.size();
        sum.swapped += swapped;
        for (ps::entry const& e : o) {
          if (!e)
            ++sum.bubbles;
          else if (ps::is_p2p(e->kind))
            ++sum.p2p;
        }
        if (round_trip && sampled(micro)) {
          if (!(ps::order_from_text(ps::to_text(in)) == in)) BOOST_ERROR(where() << ": text round trip");
          if (!(ps::order_from_json_text(ps::to_json(in).dump()) == in)) BOOST_ERROR(where() << ": JSON round trip");
        }
      }
      // Swap steps are neither P2P nor compute, so the injected schedule pairs and flows as the original
      // does; the whole-schedule check confirms it on the sample.
      if (sampled(micro)) {
        auto const after = ps::check_schedule(injected, layout);
        if (!after.ok()) BOOST_ERROR(where() << " injected: " << to_string(after));
      }
    }
  }
}

} // namespace

// The expected totals are what the reference implementation produces for the same sweeps; the
// sample run under sanitizers checks everything but these sums.
bool const full_sweep = !pipeswap::test::sanitized_build;
BOOST_AUTO_TEST_SUITE(schedule_sweep)

BOOST_AUTO_TEST_CASE(gpipe_sweep) {
  totals t;
  check_family(
      "gpipe", [](int r, int m) { return ps::gpipe(r, m); }, 1, t, true);
  if (full_sweep) BOOST_TEST(t == (totals{97152, 18792, 0, 59136}));
}

BOOST_AUTO_TEST_CASE(one_f_one_b_sweep) {
  totals t;
  check_family(
      "1f1b", [](int r, int m) { return ps::one_f_one_b(r, m); }, 1, t, true);
  if (full_sweep) BOOST_TEST(t == (totals{97152, 10614, 0, 59136}));
}

BOOST_AUTO_TEST_CASE(interleaved_sweep) {
  totals t;
  for (int v = 1; v <= 4; ++v)
    check_family(
        "interleaved",
        [v](int r, int m) {
          return ps::interleaved_1f1b({r, v, m, false});
        },
        v, t, v == 2);
  if (full_sweep) BOOST_TEST(t == (totals{1161432, 173334, 101208, 680064}));
}

BOOST_AUTO_TEST_CASE(interleaved_overlap_b_f_sweep) {
  totals t;
  for (int v = 1; v <= 4; ++v)
    check_family(
        "interleaved overlap",
        [v](int r, int m) {
          return ps::interleaved_1f1b({r, v, m, true});
        },
        v, t, v == 3);
  if (full_sweep) BOOST_TEST(t == (totals{1038444, 160943, 101208, 680064}));
}

// inject_options::load_lookahead over the sampled sweep of every family: only LAUNCH_LOAD moves (the
// order without it equals the reference injection's), it lands exactly max(bwd − k, fwd + 2), the order
// stays well-formed and the whole injected schedule stays valid and deadlock-free.
BOOST_AUTO_TEST_CASE(load_lookahead_sweep) {
  auto const without_loads = [](ps::order o) {
    std::erase_if(o, [](ps::entry const& e) { return e && e->kind == step_kind::swap_launch_load; });
    return o;
  };
  struct family {
    char const* name;
    int stages_per_rank;
    std::function<ps::rank_orders(int, int)> make;
  };
  std::vector<family> const families{
      {"gpipe", 1, [](int r, int m) { return ps::gpipe(r, m); }},
      {"1f1b", 1, [](int r, int m) { return ps::one_f_one_b(r, m); }},
      {"interleaved", 2,
       [](int r, int m) {
         return ps::interleaved_1f1b({r, 2, m, false});
       }},
      {"interleaved overlap", 2,
       [](int r, int m) {
         return ps::interleaved_1f1b({r, 2, m, true});
       }},
  };
  std::size_t moved = 0;
  for (auto const& f : families) {
    for (int ranks = 1; ranks <= 8; ++ranks) {
      for (int micro : {1, 3, 8, 13, 32}) {
        auto const orders = f.make(ranks, micro);
        for (std::size_t k : {2u, 3u, 6u}) {
          auto const where = [&] {
            return std::string(f.name) + " ranks=" + std::to_string(ranks) + " micro=" + std::to_string(micro) +
                   " lookahead=" + std::to_string(k);
          };
          ps::rank_orders injected;
          for (std::size_t r = 0; r < orders.size(); ++r) {
            ps::order const reference = ps::inject_swap_steps(orders[r]);
            injected.push_back(ps::inject_swap_steps(orders[r], ps::inject_options{k}));
            ps::order const& in = injected.back();
            if (auto const problems = ps::check_order(in); !problems.empty())
              BOOST_ERROR(where() << " rank " << r << ": " << to_string(problems.front()));
            std::size_t swapped = 0;
            if (auto const why = independent_check(orders[r], in, ranks * f.stages_per_rank, micro, swapped, k);
                !why.empty())
              BOOST_ERROR(where() << " rank " << r << ": " << why);
            if (!(without_loads(in) == without_loads(reference)))
              BOOST_ERROR(where() << " rank " << r << ": a step other than LAUNCH_LOAD moved");
            if (!(in == reference)) ++moved;
          }
          auto const after = ps::check_schedule(injected, ps::stage_layout(ranks, f.stages_per_rank));
          if (!after.ok()) BOOST_ERROR(where() << " injected: " << to_string(after));
        }
      }
    }
  }
  BOOST_TEST(moved > 0); // the option changes placements somewhere in the sweep
}

// inject_options::offload_wait_delay (with and without a load lookahead) over a sample of every
// family: only WAIT_OFFLOAD and LAUNCH_LOAD move, each lands where the header comment says (checked
// independently above), the order stays well-formed and the injected schedule valid. Delay 1 is the
// reference placement exactly.
BOOST_AUTO_TEST_CASE(offload_wait_delay_sweep) {
  auto const without_moved = [](ps::order o) {
    std::erase_if(o, [](ps::entry const& e) {
      return e && (e->kind == step_kind::swap_launch_load || e->kind == step_kind::swap_wait_offload);
    });
    return o;
  };
  std::vector<std::pair<char const*, std::function<ps::rank_orders(int, int)>>> const families{
      {"gpipe", [](int r, int m) { return ps::gpipe(r, m); }},
      {"1f1b", [](int r, int m) { return ps::one_f_one_b(r, m); }},
      {"interleaved",
       [](int r, int m) {
         return ps::interleaved_1f1b({r, 2, m, false});
       }},
      {"interleaved overlap",
       [](int r, int m) {
         return ps::interleaved_1f1b({r, 2, m, true});
       }},
  };
  std::size_t moved = 0;
  for (std::size_t f = 0; f < families.size(); ++f) {
    int const stages_per_rank = f < 2 ? 1 : 2;
    for (int ranks : {1, 2, 3, 4, 8}) {
      for (int micro : {3, 8, 13, 32}) {
        auto const orders = families[f].second(ranks, micro);
        for (auto const& kd : {std::pair<std::size_t, std::size_t>{1, 1}, {1, 2}, {3, 3}, {2, 7}}) {
          auto const k = kd.first, d = kd.second; // named: clang 14 cannot capture structured bindings
          auto const where = [&] {
            return std::string(families[f].first) + " ranks=" + std::to_string(ranks) +
                   " micro=" + std::to_string(micro) + " lookahead=" + std::to_string(k) +
                   " delay=" + std::to_string(d);
          };
          ps::rank_orders injected;
          for (std::size_t r = 0; r < orders.size(); ++r) {
            ps::order const reference = ps::inject_swap_steps(orders[r]);
            injected.push_back(ps::inject_swap_steps(orders[r], ps::inject_options{k, d}));
            ps::order const& in = injected.back();
            if (auto const problems = ps::check_order(in); !problems.empty())
              BOOST_ERROR(where() << " rank " << r << ": " << to_string(problems.front()));
            std::size_t swapped = 0;
            if (auto const why = independent_check(orders[r], in, ranks * stages_per_rank, micro, swapped, k, d);
                !why.empty())
              BOOST_ERROR(where() << " rank " << r << ": " << why);
            if (!(without_moved(in) == without_moved(reference)))
              BOOST_ERROR(where() << " rank " << r << ": a step other than WAIT_OFFLOAD and LAUNCH_LOAD moved");
            if (k == 1 && d == 1 && !(in == reference)) BOOST_ERROR(where() << " rank " << r << ": not the reference");
            if (d > 1 && !(in == ps::inject_swap_steps(orders[r], ps::inject_options{k}))) ++moved;
          }
          if (pipeswap::test::sanitized_build && micro != 13) continue; // the whole-schedule check: a sample
          auto const after = ps::check_schedule(injected, ps::stage_layout(ranks, stages_per_rank));
          if (!after.ok()) BOOST_ERROR(where() << " injected: " << to_string(after));
        }
      }
    }
  }
  BOOST_TEST(moved > 0); // the delay changes placements somewhere in the sweep
}

BOOST_AUTO_TEST_SUITE_END() // schedule_sweep
