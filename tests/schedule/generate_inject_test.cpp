// Order generators and swap injection: exact orders for small pipelines (cross-checked entry by entry
// against hyper-parallel's scheduler), the expectations of hyper-parallel's own injection tests, the
// placement rules of docs/schedules.md one by one, the eligibility predicate and bad input.
#include <boost/test/unit_test.hpp>

#include "support.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <range/v3/algorithm/find_if.hpp>
#include <range/v3/view/filter.hpp>
#include <range/v3/view/transform.hpp>

#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/text.hpp>

namespace ps = pipeswap::schedule;
using ps::step_kind;
using schedule_test::expect_error;

namespace {

// The text of the top-level entries of `o` whose kind is one of `kinds`, space-separated.
std::string only(ps::order const& o, std::initializer_list<step_kind> kinds) {
  std::string out;
  auto wanted = [&](ps::entry const& e) { return e && std::find(kinds.begin(), kinds.end(), e->kind) != kinds.end(); };
  for (std::string const& s :
       o | ranges::views::filter(wanted) | ranges::views::transform([](ps::entry const& e) { return ps::to_text(e); }))
    out += (out.empty() ? "" : " ") + s;
  return out;
}

// "SG2.1 SG2.2 ..." for stage `stage`, micro-batches first..last.
std::string chunks(char const* code, int stage, int first, int last) {
  std::string out;
  for (int m = first; m <= last; ++m)
    out += (out.empty() ? "" : " ") + std::string(code) + std::to_string(stage) + "." + std::to_string(m);
  return out;
}

// Position of the first top-level entry equal to `text` (a leaf or composite in text form).
std::size_t pos(ps::order const& o, std::string_view text) {
  auto const want = ps::entry_from_text(text);
  auto const it = ranges::find_if(o, [&](ps::entry const& e) { return e == want; });
  BOOST_REQUIRE_MESSAGE(it != o.end(), "missing " << text);
  return std::size_t(it - o.begin());
}

// Position of the entry holding leaf `text`, looking inside composites.
std::size_t leaf_pos(ps::order const& o, std::string_view text) {
  auto const want = *ps::entry_from_text(text);
  for (std::size_t i = 0; i < o.size(); ++i) {
    if (!o[i]) continue;
    for (ps::step const& l : ps::leaves_of(*o[i])) {
      if (l == want) return i;
    }
  }
  BOOST_FAIL("missing leaf " << text);
  return 0;
}

std::vector<std::string> texts(ps::rank_orders const& orders) {
  std::vector<std::string> out;
  for (auto const& o : orders) out.push_back(ps::to_text(o));
  return out;
}

ps::rank_orders interleaved_4x2x8(bool overlap) { return ps::interleaved_1f1b({4, 2, 8, overlap}); }

} // namespace

BOOST_AUTO_TEST_SUITE(schedule_generate_inject)

BOOST_AUTO_TEST_SUITE(generators)

BOOST_AUTO_TEST_CASE(gpipe_orders) {
  std::vector<std::string> const want{
      "F0.0 FS0.0 F0.1 FS0.1 BR0.0 B0.0 BR0.1 B0.1",
      "FR1.0 F1.0 FS1.0 FR1.1 F1.1 FS1.1 BR1.0 B1.0 BS1.0 BR1.1 B1.1 BS1.1",
      "FR2.0 F2.0 FR2.1 F2.1 B2.0 BS2.0 B2.1 BS2.1",
  };
  BOOST_TEST(texts(ps::gpipe(3, 2)) == want, boost::test_tools::per_element());
  BOOST_TEST(texts(ps::gpipe(1, 2)) == std::vector<std::string>{"F0.0 F0.1 B0.0 B0.1"},
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(one_f_one_b_orders) {
  std::vector<std::string> const want{
      "F0.0 FS0.0 F0.1 FS0.1 F0.2 FS0.2 BR0.0 B0.0 BR0.1 B0.1 BR0.2 B0.2",
      "FR1.0 F1.0 FR1.1 FS1.0 F1.1 FR1.2 FS1.1 F1.2 BR1.0 FS1.2 B1.0 BS1.0 BR1.1 B1.1 BS1.1 BR1.2 B1.2 BS1.2",
      "FR2.0 F2.0 FS2.0 FR2.1 F2.1 BR2.0 FS2.1 B2.0 BS2.0 FR2.2 F2.2 BR2.1 FS2.2 B2.1 BS2.1 BR2.2 B2.2 BS2.2",
      "FR3.0 F3.0 B3.0 BS3.0 FR3.1 F3.1 B3.1 BS3.1 FR3.2 F3.2 B3.2 BS3.2",
  };
  BOOST_TEST(texts(ps::one_f_one_b(4, 3)) == want, boost::test_tools::per_element());
  std::vector<std::string> const steady{
      "F0.0 FS0.0 F0.1 BR0.0 FS0.1 B0.0 F0.2 BR0.1 FS0.2 B0.1 F0.3 BR0.2 FS0.3 B0.2 BR0.3 B0.3",
      "FR1.0 F1.0 B1.0 BS1.0 FR1.1 F1.1 B1.1 BS1.1 FR1.2 F1.2 B1.2 BS1.2 FR1.3 F1.3 B1.3 BS1.3",
  };
  BOOST_TEST(texts(ps::one_f_one_b(2, 4)) == steady, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(interleaved_orders_keep_bubbles_and_column_scan_p2p) {
  std::vector<std::string> const uneven{
      "F0.0 FS0.0 F0.1 FS0.1 FR2.0 F0.2 FS0.2 FR2.1 F2.0 FS2.0 FR2.2 F2.1 FS2.1 _ BR2.0 F2.2 FS2.2 B2.0 BS2.0 BR2.1 _ "
      "B2.1 BS2.1 BR2.2 _ B2.2 BS2.2 BR0.0 _ B0.0 BR0.1 _ B0.1 BR0.2 _ B0.2",
      "_ FR1.0 F1.0 FR1.1 FS1.0 F1.1 FR1.2 FS1.1 F1.2 FR3.0 FS1.2 F3.0 FR3.1 B3.0 BS3.0 F3.1 FR3.2 B3.1 BR1.0 BS3.1 "
      "F3.2 B3.2 BR1.1 BS3.2 _ B1.0 BR1.2 BS1.0 _ B1.1 BS1.1 _ B1.2 BS1.2",
  };
  BOOST_TEST(texts(ps::interleaved_1f1b({2, 2, 3, false})) == uneven, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(interleaved_overlap_b_f_composites_take_two_column_slots) {
  std::vector<std::string> const want{
      "F0.0 FS0.0 F0.1 FS0.1 FR2.0 F2.0 FS2.0 FR2.1 F2.1 FS2.1 _ BR2.0 F0.2 FS0.2 [B2.0|F0.3] BS2.0 BR2.1 FS0.3 FR2.2 "
      "[B2.1|F2.2] BS2.1 BR0.0 FS2.2 FR2.3 [B0.0|F2.3] BR0.1 FS2.3 B0.1 BR2.2 _ B2.2 BS2.2 BR2.3 _ B2.3 BS2.3 BR0.2 _ "
      "B0.2 BR0.3 _ B0.3",
      "_ FR1.0 F1.0 FR1.1 FS1.0 F1.1 FR3.0 FS1.1 F3.0 FR3.1 [B3.0|F3.1] BS3.0 FR1.2 [B3.1|F1.2] BR1.0 BS3.1 FR1.3 "
      "FS1.2 [B1.0|F1.3] BR1.1 BS1.0 FR3.2 FS1.3 [B1.1|F3.2] BS1.1 FR3.3 [B3.2|F3.3] BS3.2 B3.3 BR1.2 BS3.3 _ B1.2 "
      "BR1.3 BS1.2 _ B1.3 BS1.3",
  };
  BOOST_TEST(texts(ps::interleaved_1f1b({2, 2, 4, true})) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(interleaved_short_micro_pads_the_missing_micro_batches) {
  // M < R: 3 ranks, 2 micro-batches; the cool-down pads twice R-M after each chunk's last micro-batch.
  std::vector<std::string> const want{
      "F0.0 FS0.0 F0.1 FS0.1 _ FR3.0 F3.0 FS3.0 FR3.1 F3.1 FS3.1 _ _ _ _ BR3.0 _ B3.0 BS3.0 BR3.1 _ B3.1 BS3.1 _ _ "
      "BR0.0 _ B0.0 BR0.1 _ B0.1 _ _",
      "_ FR1.0 F1.0 FR1.1 FS1.0 F1.1 FS1.1 _ FR4.0 F4.0 FR4.1 FS4.0 F4.1 FS4.1 _ BR4.0 _ B4.0 BR4.1 BS4.0 _ B4.1 "
      "BS4.1 _ _ BR1.0 _ B1.0 BR1.1 BS1.0 _ B1.1 BS1.1 _ _",
      "_ _ FR2.0 F2.0 FS2.0 FR2.1 F2.1 FS2.1 _ FR5.0 F5.0 FR5.1 B5.0 BS5.0 F5.1 B5.1 BS5.1 _ _ BR2.0 _ B2.0 BR2.1 "
      "BS2.0 _ B2.1 BS2.1 _ _",
  };
  BOOST_TEST(texts(ps::interleaved_1f1b({3, 2, 2, false})) == want, boost::test_tools::per_element());
}

// Reference §4.1 item 3: the compute order of every rank.
BOOST_AUTO_TEST_CASE(interleaved_4_ranks_2_chunks_8_micro_compute_order) {
  auto const orders = interleaved_4x2x8(false);
  std::vector<std::string> const want{
      "F0.0 F0.1 F0.2 F0.3 F4.0 F4.1 F4.2 F4.3 F0.4 F0.5 F0.6 B4.0 F0.7 B4.1 F4.4 B4.2 F4.5 B4.3 F4.6 B0.0 F4.7 B0.1 "
      "B0.2 B0.3 B4.4 B4.5 B4.6 B4.7 B0.4 B0.5 B0.6 B0.7",
      "F1.0 F1.1 F1.2 F1.3 F5.0 F5.1 F5.2 F5.3 F1.4 B5.0 F1.5 B5.1 F1.6 B5.2 F1.7 B5.3 F5.4 B1.0 F5.5 B1.1 F5.6 B1.2 "
      "F5.7 B1.3 B5.4 B5.5 B5.6 B5.7 B1.4 B1.5 B1.6 B1.7",
      "F2.0 F2.1 F2.2 F2.3 F6.0 F6.1 F6.2 B6.0 F6.3 B6.1 F2.4 B6.2 F2.5 B6.3 F2.6 B2.0 F2.7 B2.1 F6.4 B2.2 F6.5 B2.3 "
      "F6.6 B6.4 F6.7 B6.5 B6.6 B6.7 B2.4 B2.5 B2.6 B2.7",
      "F3.0 F3.1 F3.2 F3.3 F7.0 B7.0 F7.1 B7.1 F7.2 B7.2 F7.3 B7.3 F3.4 B3.0 F3.5 B3.1 F3.6 B3.2 F3.7 B3.3 F7.4 B7.4 "
      "F7.5 B7.5 F7.6 B7.6 F7.7 B7.7 B3.4 B3.5 B3.6 B3.7",
  };
  for (std::size_t r = 0; r < 4; ++r) {
    BOOST_TEST(only(orders[r], {step_kind::fwd, step_kind::bwd}) == want[r]);
    // Injection does not move compute.
    BOOST_TEST(only(ps::inject_swap_steps(orders[r]), {step_kind::fwd, step_kind::bwd}) == want[r]);
  }
}

BOOST_AUTO_TEST_CASE(parameters_are_validated) {
  expect_error([] { ps::gpipe(0, 4); }, "gpipe: ranks must be >= 1, got 0");
  expect_error([] { ps::gpipe(2, -1); }, "gpipe: micro must be >= 1, got -1");
  expect_error([] { ps::one_f_one_b(4, 0); }, "1f1b: micro must be >= 1, got 0");
  expect_error([] { ps::interleaved_1f1b({4, 0, 8, false}); }, "interleaved 1f1b: stages_per_rank must be >= 1, got 0");
  expect_error([] { ps::interleaved_1f1b({0, 2, 8, false}); }, "interleaved 1f1b: ranks must be >= 1, got 0");
  expect_error(
      [] {
        ps::interleaved_1f1b({65536, 65536, 1, false});
      },
      "stage layout: ranks * stages_per_rank (4294967296) exceeds the stage index range");
  expect_error(
      [] {
        ps::interleaved_1f1b({1, 4, 1 << 30, false});
      },
      "interleaved 1f1b: micro * stages_per_rank (4294967296) exceeds the index range");
}

BOOST_AUTO_TEST_CASE(insert_p2p_rejects_misplaced_steps) {
  ps::stage_layout const two(2, 2);
  expect_error([&] { ps::insert_p2p({ps::order_from_text("F0.0")}, two); }, "insert_p2p: 1 orders for 2 ranks");
  expect_error(
      [&] {
        ps::insert_p2p({ps::order_from_text("F0.0 F1.0"), {}}, two);
      },
      "insert_p2p: rank 0 entry 1 (F1.0): stage 1 runs on rank 1");
  expect_error(
      [&] {
        ps::insert_p2p({{}, ps::order_from_text("_ F5.0")}, two);
      },
      "insert_p2p: rank 1 entry 1 (F5.0): stage 5 is outside the layout's 4 stages");
  expect_error(
      [&] {
        ps::insert_p2p({{ps::fwd(0, -3)}, {}}, two);
      },
      "insert_p2p: rank 0 entry 0 (F0.-3): FWD has a negative micro-batch (-3)");
  // The v placement: stages 0,1 then 1,0 — rank 1 sends stage 1's output to itself (no P2P).
  ps::stage_layout const v(2, 2, ps::placement::v);
  auto const orders = ps::insert_p2p({ps::order_from_text("F0.0 _ _ F3.0"), ps::order_from_text("_ F1.0 F2.0")}, v);
  BOOST_TEST(texts(orders) == (std::vector<std::string>{"F0.0 FS0.0 _ _ FR3.0 F3.0", "_ FR1.0 F1.0 F2.0 FS2.0"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(stage_layouts) {
  ps::stage_layout const loop(4, 3);
  BOOST_TEST(loop.stages() == 12);
  BOOST_TEST(loop.rank_of(0) == 0);
  BOOST_TEST(loop.rank_of(5) == 1);
  BOOST_TEST(loop.rank_of(11) == 3);
  ps::stage_layout const v(4, 3, ps::placement::v);
  std::vector<int> ranks;
  for (int s = 0; s < 12; ++s) ranks.push_back(v.rank_of(s));
  BOOST_TEST(ranks == (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3}), boost::test_tools::per_element());
  BOOST_TEST(!v.has_stage(12));
  BOOST_TEST(!v.has_stage(-1));
  expect_error([] { ps::stage_layout(0); }, "stage layout: ranks must be >= 1, got 0");
  expect_error([] { ps::stage_layout(2, 0); }, "stage layout: stages_per_rank must be >= 1, got 0");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(injection)

// Reference §4.1 item 1.
BOOST_AUTO_TEST_CASE(gpipe_lifecycle_order) {
  auto const o = ps::inject_swap_steps(ps::order_from_text("F0.0 FS0.0 F0.1 FS0.1 F0.2 FS0.2 F0.3 FS0.3 BR0.0 B0.0 "
                                                           "BS0.0 BR0.1 B0.1 BS0.1 BR0.2 B0.2 BS0.2 BR0.3 B0.3 BS0.3"));
  for (int m = 0; m < 4; ++m) {
    auto p = [&](char const* code) { return pos(o, code + std::string("0.") + std::to_string(m)); };
    BOOST_TEST(p("SG") < p("F"));
    BOOST_TEST(p("F") < p("LO"));
    BOOST_TEST(p("FS") < p("LO"));
    BOOST_TEST(p("LO") < p("WO"));
    BOOST_TEST(p("WO") < p("LL"));
    BOOST_TEST(p("LL") < p("WL"));
    BOOST_TEST(p("BR") < p("WL"));
    BOOST_TEST(p("WL") < p("B"));
  }
  BOOST_TEST(ps::to_text(o) ==
             "SG0.0 F0.0 FS0.0 LO0.0 SG0.1 F0.1 FS0.1 LO0.1 WO0.0 SG0.2 F0.2 FS0.2 LO0.2 WO0.1 LL0.0 SG0.3 F0.3 FS0.3 "
             "LO0.3 WO0.2 BR0.0 LL0.1 WL0.0 B0.0 BS0.0 WO0.3 BR0.1 LL0.2 WL0.1 B0.1 BS0.1 BR0.2 LL0.3 WL0.2 B0.2 BS0.2 "
             "BR0.3 WL0.3 B0.3 BS0.3");
}

// inject_options: inject_options{} is the default placement exactly; a lookahead of 2 moves each load of
// this GPipe order one compute slot earlier, as far as its offload's wait allows (computed by hand: with
// gaps of four slots every chunk is clamped to fwd + 2), and nothing else.
BOOST_AUTO_TEST_CASE(load_lookahead_moves_only_the_load) {
  auto const in = ps::order_from_text("F0.0 FS0.0 F0.1 FS0.1 F0.2 FS0.2 F0.3 FS0.3 BR0.0 B0.0 BS0.0 BR0.1 B0.1 BS0.1 "
                                      "BR0.2 B0.2 BS0.2 BR0.3 B0.3 BS0.3");
  BOOST_TEST((ps::inject_swap_steps(in, ps::inject_options{}) == ps::inject_swap_steps(in)));
  BOOST_TEST((ps::inject_swap_steps(in, ps::inject_options{1}) == ps::inject_swap_steps(in)));
  BOOST_TEST(ps::to_text(ps::inject_swap_steps(in, ps::inject_options{2})) ==
             "SG0.0 F0.0 FS0.0 LO0.0 SG0.1 F0.1 FS0.1 LO0.1 WO0.0 LL0.0 SG0.2 F0.2 FS0.2 LO0.2 WO0.1 LL0.1 SG0.3 F0.3 "
             "FS0.3 LO0.3 WO0.2 BR0.0 LL0.2 WL0.0 B0.0 BS0.0 WO0.3 BR0.1 LL0.3 WL0.1 B0.1 BS0.1 BR0.2 WL0.2 B0.2 BS0.2 "
             "BR0.3 WL0.3 B0.3 BS0.3");
  // Larger lookaheads clamp to the same placement here.
  BOOST_TEST((ps::inject_swap_steps(in, ps::inject_options{9}) == ps::inject_swap_steps(in, ps::inject_options{2})));
  // With eight micro-batches the gaps are eight slots: lookahead 3 puts LL0.0 before F0.5 (slot 8 - 3).
  auto const eight = ps::inject_swap_steps(ps::gpipe(1, 8)[0], ps::inject_options{3});
  BOOST_TEST(pos(eight, "LL0.0") + 2 == pos(eight, "F0.5"));
  BOOST_TEST(pos(eight, "SG0.5") + 1 == pos(eight, "F0.5"));
  expect_error([&] { ps::inject_swap_steps(in, ps::inject_options{0}); },
               "inject_options.load_lookahead must be at least 1 (1 is the default placement)");
}

// inject_options::offload_wait_delay: 1 is the default placement; on GPipe with eight micro-batches
// (gaps of eight slots, one rank: no sends) a delay of 3 waits each offload after the third forward
// behind its own (after that forward's offload launch), and leaves the load where the lookahead puts it; a
// lookahead of 5 leaves room for a wait after slot fwd + 2 only (bwd − 5 − 1), and the load still goes
// five slots ahead. Delays larger than the gap clamp.
BOOST_AUTO_TEST_CASE(offload_wait_delay_moves_only_the_wait) {
  auto const g = ps::gpipe(1, 8)[0];
  BOOST_TEST((ps::inject_swap_steps(g, ps::inject_options{1, 1}) == ps::inject_swap_steps(g)));
  auto const d3 = ps::inject_swap_steps(g, ps::inject_options{1, 3});
  BOOST_TEST(pos(d3, "WO0.0") == pos(d3, "LO0.3") + 1);
  BOOST_TEST(pos(d3, "WO0.0") + 1 == pos(d3, "SG0.4"));
  BOOST_TEST(pos(d3, "WO0.4") == pos(d3, "LO0.7") + 1);
  BOOST_TEST(pos(d3, "LL0.0") + 2 == pos(d3, "F0.7")); // the reference slot, bwd − 1
  auto const k5 = ps::inject_swap_steps(g, ps::inject_options{5, 3});
  BOOST_TEST(pos(k5, "WO0.0") == pos(k5, "LO0.2") + 1);
  BOOST_TEST(pos(k5, "LL0.0") + 2 == pos(k5, "F0.3"));
  BOOST_TEST(
      (ps::inject_swap_steps(g, ps::inject_options{1, 100}) == ps::inject_swap_steps(g, ps::inject_options{1, 6})));
  expect_error(
      [&] {
        ps::inject_swap_steps(g, ps::inject_options{1, 0});
      },
      "inject_options.offload_wait_delay must be at least 1 (1 is the default placement)");
}

// Reference §4.1 item 2.
BOOST_AUTO_TEST_CASE(one_f_one_b_respects_min_gap) {
  auto const orders = ps::one_f_one_b(4, 8);
  std::vector<std::string> const want{chunks("LO", 0, 0, 7), chunks("LO", 1, 1, 6), "", ""};
  for (std::size_t r = 0; r < 4; ++r)
    BOOST_TEST(only(ps::inject_swap_steps(orders[r]), {step_kind::swap_launch_offload}) == want[r]);
  BOOST_TEST(ps::to_text(ps::inject_swap_steps(orders[0])) ==
             "SG0.0 F0.0 FS0.0 LO0.0 SG0.1 F0.1 FS0.1 LO0.1 WO0.0 SG0.2 F0.2 FS0.2 LO0.2 WO0.1 LL0.0 SG0.3 F0.3 BR0.0 "
             "FS0.3 LO0.3 WO0.2 WL0.0 B0.0 WO0.3 LL0.1 SG0.4 F0.4 BR0.1 FS0.4 LO0.4 WL0.1 B0.1 WO0.4 LL0.2 SG0.5 F0.5 "
             "BR0.2 FS0.5 LO0.5 WL0.2 B0.2 WO0.5 LL0.3 SG0.6 F0.6 BR0.3 FS0.6 LO0.6 WL0.3 B0.3 WO0.6 LL0.4 SG0.7 F0.7 "
             "BR0.4 FS0.7 LO0.7 LL0.5 WL0.4 B0.4 BR0.5 WO0.7 LL0.6 WL0.5 B0.5 BR0.6 LL0.7 WL0.6 B0.6 BR0.7 WL0.7 B0.7");
}

// Reference §4.1 item 3: the swapped chunks of every rank, in order.
BOOST_AUTO_TEST_CASE(interleaved_swaps_see_virtual_stages) {
  auto const orders = interleaved_4x2x8(false);
  std::vector<std::string> const want{
      chunks("SG", 0, 0, 3) + " " + chunks("SG", 4, 0, 3) + " " + chunks("SG", 0, 4, 7) + " " + chunks("SG", 4, 4, 7),
      chunks("SG", 1, 0, 3) + " " + chunks("SG", 5, 0, 3) + " " + chunks("SG", 1, 4, 7) + " " + chunks("SG", 5, 4, 7),
      chunks("SG", 2, 0, 3) + " " + chunks("SG", 6, 1, 3) + " " + chunks("SG", 2, 4, 7) + " " + chunks("SG", 6, 4, 6),
      chunks("SG", 3, 0, 7),
  };
  for (std::size_t r = 0; r < 4; ++r) {
    auto const injected = ps::inject_swap_steps(orders[r]);
    BOOST_TEST(only(injected, {step_kind::swap_set_group}) == want[r]);
    std::string lo = want[r];
    for (std::size_t i = 0; (i = lo.find("SG", i)) != std::string::npos;) lo.replace(i, 2, "LO");
    BOOST_TEST(only(injected, {step_kind::swap_launch_offload}) == lo);
  }
}

// Reference §4.1 item 4.
BOOST_AUTO_TEST_CASE(interleaved_overlap_b_f_uses_leaf_steps) {
  auto const orders = interleaved_4x2x8(true);
  for (auto const& o : orders) {
    for (ps::entry const& e : ps::inject_swap_steps(o)) {
      if (e && ps::is_swap(e->kind)) {
        BOOST_TEST(e->stage >= 0);
        BOOST_TEST(e->micro >= 0);
      }
    }
  }
  auto const r0 = ps::inject_swap_steps(orders[0]);
  BOOST_TEST(only(r0, {step_kind::overlap_b_f}).size() > 0);
  std::size_t const overlap = leaf_pos(r0, "B4.0");
  BOOST_TEST(overlap == leaf_pos(r0, "F0.7"));
  BOOST_TEST((r0[overlap]->kind == step_kind::overlap_b_f));
  BOOST_TEST(pos(r0, "LL4.0") < pos(r0, "WL4.0"));
  BOOST_TEST(pos(r0, "WL4.0") < pos(r0, "SG0.7"));
  BOOST_TEST(pos(r0, "SG0.7") < overlap);
  BOOST_TEST(pos(r0, "BR4.0") < pos(r0, "WL4.0"));
  BOOST_TEST(overlap < pos(r0, "LO0.7"));
  BOOST_TEST(pos(r0, "LO0.7") < pos(r0, "WO0.7"));
  // The whole order, as the reference injects it: at the composite the before-steps come out by
  // priority (LL 30, WL 20, SG 10), LO0.7 anchors on the leaf's own FS0.7 inside the P2P run, and
  // WO0.6, whose first in-between entry is the composite, falls back to the end of that run.
  BOOST_TEST(
      ps::to_text(r0) ==
      "SG0.0 F0.0 FS0.0 LO0.0 SG0.1 F0.1 FS0.1 LO0.1 WO0.0 SG0.2 F0.2 FS0.2 LO0.2 WO0.1 SG0.3 F0.3 FS0.3 LO0.3 "
      "WO0.2 FR4.0 SG4.0 F4.0 FS4.0 LO4.0 WO0.3 FR4.1 SG4.1 F4.1 FS4.1 LO4.1 WO4.0 FR4.2 SG4.2 F4.2 FS4.2 LO4.2 "
      "WO4.1 FR4.3 SG4.3 F4.3 FS4.3 LO4.3 WO4.2 SG0.4 F0.4 FS0.4 LO0.4 WO4.3 SG0.5 F0.5 FS0.5 LO0.5 WO0.4 _ _ _ "
      "BR4.0 LL4.0 SG0.6 F0.6 FS0.6 LO0.6 WO0.5 LL4.1 WL4.0 SG0.7 [B4.0|F0.7] BS4.0 BR4.1 FS0.7 LO0.7 FR4.4 WO0.6 "
      "LL4.2 WL4.1 SG4.4 [B4.1|F4.4] BS4.1 BR4.2 FS4.4 LO4.4 FR4.5 WO0.7 LL4.3 WL4.2 SG4.5 [B4.2|F4.5] BS4.2 "
      "BR4.3 FS4.5 LO4.5 FR4.6 WO4.4 LL0.0 WL4.3 SG4.6 [B4.3|F4.6] BS4.3 BR0.0 FS4.6 LO4.6 FR4.7 WO4.5 LL0.1 "
      "WL0.0 SG4.7 [B0.0|F4.7] BR0.1 FS4.7 LO4.7 WO4.6 LL0.2 WL0.1 B0.1 BR0.2 WO4.7 _ LL0.3 WL0.2 B0.2 BR0.3 _ "
      "LL4.4 WL0.3 B0.3 BR4.4 _ LL4.5 WL4.4 B4.4 BS4.4 BR4.5 _ LL4.6 WL4.5 B4.5 BS4.5 BR4.6 _ LL4.7 WL4.6 B4.6 "
      "BS4.6 BR4.7 _ LL0.4 WL4.7 B4.7 BS4.7 BR0.4 _ LL0.5 WL0.4 B0.4 BR0.5 _ LL0.6 WL0.5 B0.5 BR0.6 _ LL0.7 WL0.6 "
      "B0.6 BR0.7 _ WL0.7 B0.7");
}

// Reference §4.1 item 5 (and the newer upstream check of the swapped keys).
BOOST_AUTO_TEST_CASE(injects_current_rank_only) {
  auto eligible = [](int stage) {
    std::string text;
    for (int m = 0; m < 4; ++m) text += chunks("F", stage, m, m) + " " + chunks("FS", stage, m, m) + " ";
    for (int m = 0; m < 4; ++m) text += chunks("BR", stage, m, m) + " " + chunks("B", stage, m, m) + " ";
    return ps::order_from_text(text);
  };
  ps::rank_orders const orders{eligible(0), eligible(1)};
  auto const injected = ps::inject_swap_steps_for_rank(orders, 0);
  BOOST_TEST(only(injected[0], {step_kind::swap_set_group}) == chunks("SG", 0, 0, 3));
  BOOST_TEST(only(injected[1], {step_kind::swap_set_group}).empty());
  BOOST_TEST((injected[1] == orders[1]));
  std::vector<ps::chunk> keys;
  for (auto const& c : ps::swap_candidates(orders[0])) keys.push_back(c.key);
  BOOST_TEST((keys == std::vector<ps::chunk>{{0, 0}, {0, 1}, {0, 2}, {0, 3}}));
  expect_error([&] { ps::inject_swap_steps_for_rank(orders, 2); },
               "inject_swap_steps_for_rank: no order for rank 2 among 2");
}

// Reference §4.1 item 6.
BOOST_AUTO_TEST_CASE(launch_load_covers_previous_compute) {
  auto const o = ps::inject_swap_steps(
      ps::order_from_text("F0.0 FS0.0 F0.1 FS0.1 F0.2 FS0.2 F0.3 FS0.3 BR0.0 B0.0 BR0.1 B0.1 BR0.2 B0.2 BR0.3 B0.3"));
  BOOST_TEST(pos(o, "WO0.0") < pos(o, "LL0.0"));
  BOOST_TEST(pos(o, "LL0.0") < pos(o, "SG0.3"));
  BOOST_TEST(pos(o, "SG0.3") < pos(o, "F0.3"));
  BOOST_TEST(pos(o, "LL0.0") < pos(o, "FS0.3"));
  BOOST_TEST(pos(o, "LL0.0") < pos(o, "WL0.0"));
}

BOOST_AUTO_TEST_CASE(candidates_report_positions_slots_and_gap) {
  auto const o = ps::order_from_text("F0.0 FS0.0 F0.1 _ F0.2 F0.3 B0.0 B0.2 B0.1");
  auto const c = ps::swap_candidates(o);
  BOOST_REQUIRE(c.size() == 2u); // (0,2): gap 3 < 4; (0,3): no backward
  BOOST_TEST((c[0] == ps::swap_candidate{{0, 0}, 0, 6, 0, 4}));
  BOOST_TEST((c[1] == ps::swap_candidate{{0, 1}, 2, 8, 1, 6}));
  BOOST_TEST(c[1].gap() == 5u);
}

BOOST_AUTO_TEST_CASE(duplicate_chunks_follow_dict_semantics) {
  // Chunk (0,0) has two FWD leaves: the last one is swapped, but (0,0) keeps the first place in the
  // iteration, so at position 2 its LAUNCH_OFFLOAD (20) precedes (0,1)'s WAIT_OFFLOAD (10).
  auto const o = ps::inject_swap_steps(ps::order_from_text("F0.0 F0.1 F0.0 F0.2 F0.3 F0.4 B0.0 B0.1 B0.2 B0.3 B0.4"));
  BOOST_TEST(ps::to_text(o) ==
             "F0.0 SG0.1 F0.1 LO0.1 SG0.0 F0.0 LO0.0 WO0.1 SG0.2 F0.2 LO0.2 WO0.0 SG0.3 F0.3 LO0.3 WO0.2 LL0.0 SG0.4 "
             "F0.4 LO0.4 WO0.3 LL0.1 WL0.0 B0.0 WO0.4 LL0.2 WL0.1 B0.1 LL0.3 WL0.2 B0.2 LL0.4 WL0.3 B0.3 WL0.4 B0.4");
}

BOOST_AUTO_TEST_CASE(p2p_runs_end_at_bubbles_and_opaque_steps) {
  // LO0.1 anchors on FS0.1 (the FSDP step after it ends the run); LO0.3 goes right after F0.3 because
  // the bubble ends the run before FS0.3.
  auto const o = ps::inject_swap_steps(
      ps::order_from_text("F0.0 FS0.0 F0.1 FS0.1 RS0 FS0.0 F0.2 FS0.2 F0.3 _ FS0.3 B0.0 B0.1 B0.2 B0.3"));
  BOOST_TEST(ps::to_text(o) ==
             "SG0.0 F0.0 FS0.0 LO0.0 SG0.1 F0.1 FS0.1 LO0.1 WO0.0 RS0 FS0.0 SG0.2 F0.2 FS0.2 LO0.2 WO0.1 LL0.0 SG0.3 "
             "F0.3 LO0.3 WO0.2 _ FS0.3 LL0.1 WL0.0 B0.0 WO0.3 LL0.2 WL0.1 B0.1 LL0.3 WL0.2 B0.2 WL0.3 B0.3");
}

BOOST_AUTO_TEST_CASE(composite_fwd_leaf_anchors_on_its_own_send) {
  auto const o = ps::inject_swap_steps(
      ps::order_from_text("F0.0 F1.0 [B2.0|F0.1] FS0.1 BR0.0 FS0.0 F0.2 F0.3 _ F0.4 FS0.4 B0.0 B0.1 B0.2 B0.3 B0.4"));
  BOOST_TEST(
      ps::to_text(o) ==
      "SG0.0 F0.0 LO0.0 F1.0 WO0.0 SG0.1 [B2.0|F0.1] FS0.1 LO0.1 BR0.0 FS0.0 SG0.2 F0.2 LO0.2 WO0.1 SG0.3 F0.3 "
      "LO0.3 WO0.2 _ LL0.0 SG0.4 F0.4 FS0.4 LO0.4 WO0.3 LL0.1 WL0.0 B0.0 WO0.4 LL0.2 WL0.1 B0.1 LL0.3 WL0.2 B0.2 "
      "LL0.4 WL0.3 B0.3 WL0.4 B0.4");
}

BOOST_AUTO_TEST_CASE(eligibility_predicate_selects_chunks) {
  auto const in = ps::order_from_text("F0.0 F0.1 F0.0 F0.2 F0.3 F0.4 B0.0 B0.1 B0.2 B0.3 B0.4");
  auto const o = ps::inject_swap_steps(in, [](ps::chunk c) { return c.micro % 2 == 0; });
  BOOST_TEST(ps::to_text(o) == "F0.0 F0.1 SG0.0 F0.0 LO0.0 SG0.2 F0.2 LO0.2 WO0.0 F0.3 WO0.2 LL0.0 SG0.4 F0.4 LO0.4 "
                               "WL0.0 B0.0 WO0.4 LL0.2 B0.1 WL0.2 B0.2 LL0.4 B0.3 WL0.4 B0.4");
  BOOST_TEST(ps::to_text(ps::inject_swap_steps(in, [](ps::chunk) { return false; })) == ps::to_text(in));
}

BOOST_AUTO_TEST_CASE(only_chunks_whose_backward_trails_by_four_slots_are_candidates) {
  // (0,0): gap 3. (0,3): gap exactly 4. (0,1), (0,2), (0,4)..(0,6): no backward. (0,7): no forward.
  auto const c = ps::swap_candidates(ps::order_from_text("F0.0 F0.1 F0.2 B0.0 F0.3 F0.4 F0.5 F0.6 B0.3 B0.7"));
  BOOST_REQUIRE(c.size() == 1u);
  BOOST_TEST((c[0].key == ps::chunk{0, 3}));
  BOOST_TEST(c[0].gap() == 4u);
  // A backward before its forward is never a candidate.
  BOOST_TEST(ps::swap_candidates(ps::order_from_text("B0.0 F0.1 F0.2 F0.3 F0.4 F0.0")).empty());
}

BOOST_AUTO_TEST_CASE(malformed_input_is_rejected_and_left_alone) {
  ps::order const in{ps::fwd(0, 0), ps::composite(step_kind::overlap_b_f, {}), ps::bwd(0, 0)};
  ps::order const copy = in;
  expect_error([&] { ps::inject_swap_steps(in); }, "inject_swap_steps: entry 1 (BF[]): OVERLAP_B_F has no leaves");
  expect_error([&] { ps::swap_candidates({ps::fwd(0, ps::no_index)}); },
               "swap_candidates: entry 0 (F0.?): FWD has no micro-batch");
  BOOST_TEST((in == copy));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE_END() // schedule_generate_inject
