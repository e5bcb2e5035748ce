// Validators: every rule of check_order and check_schedule with its exact report, deadlock cycles,
// and the label-cycle check ported from hyper-parallel (its own two label tests).
#include <boost/test/unit_test.hpp>

#include "support.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/labels.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/schedule/validate.hpp>

namespace ps = pipeswap::schedule;
using ps::step_kind;
using schedule_test::expect_error;

namespace {

std::vector<std::string> lines(std::vector<ps::problem> const& ps_) {
  std::vector<std::string> out;
  for (auto const& p : ps_) out.push_back(to_string(p));
  return out;
}

std::vector<std::string> check(std::string_view text) { return lines(ps::check_order(ps::order_from_text(text))); }

ps::rank_orders parse(std::vector<std::string_view> const& texts) {
  ps::rank_orders out;
  for (auto t : texts) out.push_back(ps::order_from_text(t));
  return out;
}

std::vector<std::string> check_all(std::vector<std::string_view> const& texts, ps::stage_layout const& layout) {
  return lines(ps::check_schedule(parse(texts), layout).problems);
}

using strings = std::vector<std::string>;

} // namespace

BOOST_AUTO_TEST_SUITE(schedule_validate)

BOOST_AUTO_TEST_SUITE(order_rules)

BOOST_AUTO_TEST_CASE(generated_and_injected_orders_are_well_formed) {
  for (auto const& o : ps::interleaved_1f1b({4, 2, 8, true})) {
    BOOST_TEST(ps::check_order(o).empty());
    BOOST_TEST(ps::check_order(ps::inject_swap_steps(o)).empty());
  }
  BOOST_TEST(check("F0.0 F0.1 _ US0 RS0").empty()); // forward-only orders are fine
}

BOOST_AUTO_TEST_CASE(shape) {
  ps::order const o{ps::fwd(0, 0), ps::leaf(step_kind::bwd, -2, 0), ps::composite(step_kind::overlap_f_b, {})};
  BOOST_TEST(lines(ps::check_order(o)) == (strings{"position 1 (B-2.0): shape: BWD has a negative stage (-2)",
                                                   "position 2 (FB[]): shape: OVERLAP_F_B has no leaves"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(composite) {
  BOOST_TEST(check("BF[F0.1|B0.0] FB[F0.2] [F0.3|BI1.0] [BI1.1|F0.4] [B1.2|LO0.5]") ==
                 (strings{"position 0 (BF[F0.1|B0.0]): composite: OVERLAP_B_F must hold a backward leaf (BWD or "
                          "BWD_INPUT) then a FWD leaf",
                          "position 0 (B0.0): backward-before-forward: BWD of chunk (0,0) has no FWD",
                          "position 1 ([F0.2]): composite: OVERLAP_F_B must hold a FWD leaf then a backward leaf (BWD "
                          "or BWD_INPUT)",
                          "position 4 ([B1.2|LO0.5]): composite: OVERLAP_B_F must hold a backward leaf (BWD or "
                          "BWD_INPUT) then a FWD leaf",
                          "position 4 (LO0.5): swap-lifecycle: SWAP_LAUNCH_OFFLOAD of chunk (0,5) comes before "
                          "SWAP_SET_GROUP, FWD",
                          "position 4 (B1.2): backward-before-forward: BWD of chunk (1,2) has no FWD",
                          "position 4 (LO0.5): swap-lifecycle: swap life cycle of chunk (0,5) is incomplete: missing "
                          "SWAP_WAIT_OFFLOAD, SWAP_LAUNCH_LOAD, SWAP_WAIT_LOAD, BWD"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(duplicates_and_backward_before_forward) {
  BOOST_TEST(check("F0.0 B0.1 F0.0 B0.0 B0.0 F0.1 B2.2") ==
                 (strings{"position 1 (B0.1): backward-before-forward: BWD of chunk (0,1) runs before its FWD "
                          "(position 5)",
                          "position 2 (F0.0): duplicate: second FWD of chunk (0,0); the first is at position 0",
                          "position 4 (B0.0): duplicate: second BWD of chunk (0,0); the first is at position 3",
                          "position 6 (B2.2): backward-before-forward: BWD of chunk (2,2) has no FWD"}),
             boost::test_tools::per_element());
  // Inside one OVERLAP_B_F the backward leaf runs first.
  BOOST_TEST(
      check("[B0.0|F0.0]") ==
          strings{"position 0 (B0.0): backward-before-forward: BWD of chunk (0,0) runs before its FWD (position 0)"},
      boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(swap_lifecycle) {
  BOOST_TEST(check("SG0.0 F0.0 LO0.0 WO0.0 LL0.0 WL0.0 B0.0").empty());
  // Missing SET_GROUP, a repeated LAUNCH_OFFLOAD, a WAIT_OFFLOAD before its LAUNCH_OFFLOAD, and a chunk
  // that stops before its backward.
  BOOST_TEST(
      check("F0.0 LO0.0 WO0.0 LO0.0 LL0.0 WL0.0 B0.0 SG0.1 F0.1 WO0.1 LO0.1 SG0.2 F0.2 LO0.2") ==
          (strings{"position 0 (F0.0): swap-lifecycle: FWD of chunk (0,0) comes before SWAP_SET_GROUP",
                   "position 3 (LO0.0): swap-lifecycle: SWAP_LAUNCH_OFFLOAD of chunk (0,0) is out of order: its "
                   "life cycle already reached SWAP_WAIT_OFFLOAD at position 2",
                   "position 9 (WO0.1): swap-lifecycle: SWAP_WAIT_OFFLOAD of chunk (0,1) comes before "
                   "SWAP_LAUNCH_OFFLOAD",
                   "position 9 (WO0.1): swap-lifecycle: swap life cycle of chunk (0,1) is incomplete: missing "
                   "SWAP_LAUNCH_LOAD, SWAP_WAIT_LOAD, BWD",
                   "position 10 (LO0.1): swap-lifecycle: SWAP_LAUNCH_OFFLOAD of chunk (0,1) is out of order: its "
                   "life cycle already reached SWAP_WAIT_OFFLOAD at position 9",
                   "position 13 (LO0.2): swap-lifecycle: swap life cycle of chunk (0,2) is incomplete: missing "
                   "SWAP_WAIT_OFFLOAD, SWAP_LAUNCH_LOAD, SWAP_WAIT_LOAD, BWD"}),
      boost::test_tools::per_element());
  BOOST_TEST(check("SG0.0 SG0.0 F0.0 LO0.0 WO0.0 LL0.0 WL0.0 B0.0") ==
                 strings{"position 1 (SG0.0): swap-lifecycle: SWAP_SET_GROUP of chunk (0,0) is repeated: its life "
                         "cycle already reached SWAP_SET_GROUP at position 0"},
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(throwing_variant_lists_the_problems) {
  BOOST_CHECK_NO_THROW(ps::require_well_formed(ps::order_from_text("F0.0 B0.0")));
  expect_error([] { ps::require_well_formed(ps::order_from_text("B0.0 F0.0 F0.0")); },
               "order is not well-formed (2 problems):\n"
               "  position 0 (B0.0): backward-before-forward: BWD of chunk (0,0) runs before its FWD (position 1)\n"
               "  position 2 (F0.0): duplicate: second FWD of chunk (0,0); the first is at position 1");
}

BOOST_AUTO_TEST_CASE(throwing_variant_lists_the_first_twenty_problems) {
  // 22 backwards without forwards: the message names positions 0..19 and counts the other two.
  ps::order o;
  for (ps::index_type m = 0; m < 22; ++m) o.push_back(ps::bwd(0, m));
  std::string const expected_last = "\n  position 19 (B0.19): backward-before-forward: BWD of chunk (0,19) has no FWD"
                                    "\n  ... and 2 more";
  try {
    ps::require_well_formed(o);
    BOOST_FAIL("no exception");
  } catch (pipeswap::invalid_argument const& e) {
    std::string const what = e.what();
    BOOST_TEST(what.starts_with("order is not well-formed (22 problems):\n  position 0 (B0.0): "));
    BOOST_TEST(what.ends_with(expected_last));
    std::size_t listed = 0;
    for (std::size_t at = what.find("\n  position "); at != std::string::npos; at = what.find("\n  position ", at + 1))
      ++listed;
    BOOST_TEST(listed == 20u);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(schedule_rules)

BOOST_AUTO_TEST_CASE(generated_schedules_are_valid) {
  BOOST_TEST(ps::check_schedule(ps::gpipe(4, 8), ps::stage_layout(4)).ok());
  BOOST_TEST(ps::check_schedule(ps::one_f_one_b(4, 8), ps::stage_layout(4)).ok());
  auto orders = ps::interleaved_1f1b({4, 2, 8, true});
  for (auto& o : orders) o = ps::inject_swap_steps(o);
  auto const report = ps::check_schedule(orders, ps::stage_layout(4, 2));
  BOOST_TEST(report.ok());
  BOOST_TEST(to_string(report) == "schedule is valid");
  BOOST_CHECK_NO_THROW(ps::require_valid_schedule(orders, ps::stage_layout(4, 2)));
}

BOOST_AUTO_TEST_CASE(placement_and_missing_peers) {
  BOOST_TEST(check_all({"F1.0 FS0.0 FR0.0 F4.0", "BS1.0 BR1.0 FS1.0"}, ps::stage_layout(2)) ==
                 (strings{"rank 0, position 0 (F1.0): placement: stage 1 runs on rank 1",
                          "rank 0, position 1 (FS0.0): dataflow: FWD_SEND sends an output not yet computed: no F0.0 "
                          "before it on rank 0",
                          "rank 0, position 1 (FS0.0): unpaired: FWD_SEND has no matching FR1.0 on rank 1",
                          "rank 0, position 2 (FR0.0): no-peer: FWD_RECV from stage -1, which does not exist",
                          "rank 0, position 3 (F4.0): placement: stage 4 is outside the layout's 2 stages",
                          "rank 1, position 0 (BS1.0): dataflow: BWD_SEND sends a gradient not yet computed: no B1.0 "
                          "before it on rank 1",
                          "rank 1, position 0 (BS1.0): unpaired: BWD_SEND has no matching BR0.0 on rank 0",
                          "rank 1, position 1 (BR1.0): no-peer: BWD_RECV from stage 2, which does not exist",
                          "rank 1, position 2 (FS1.0): dataflow: FWD_SEND sends an output not yet computed: no F1.0 "
                          "before it on rank 1",
                          "rank 1, position 2 (FS1.0): no-peer: FWD_SEND to stage 2, which does not exist"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(unpaired_messages) {
  auto orders = ps::one_f_one_b(2, 2);
  BOOST_TEST(ps::to_text(orders[1]) == "FR1.0 F1.0 B1.0 BS1.0 FR1.1 F1.1 B1.1 BS1.1");
  orders[1].erase(orders[1].begin() + 4); // drop FR1.1
  auto const report = ps::check_schedule(orders, ps::stage_layout(2));
  BOOST_TEST(
      lines(report.problems) ==
          (strings{"rank 0, position 4 (FS0.1): unpaired: FWD_SEND has no matching FR1.1 on rank 1",
                   "rank 1, position 4 (F1.1): dataflow: FWD runs before its input arrives: no FR1.1 before it on "
                   "rank 1"}),
      boost::test_tools::per_element());
  BOOST_TEST(report.deadlock.empty());
}

BOOST_AUTO_TEST_CASE(dataflow_within_a_rank_and_across_composites) {
  // Stages 0 and 1 on one rank: F1.0 needs F0.0 earlier on the rank, B0.0 needs B1.0; leaves of one
  // composite do not feed each other.
  BOOST_TEST(check_all({"F1.0 F0.0 [B1.0|F1.1] B0.0 F0.1 B1.1 B0.1"}, ps::stage_layout(1, 2)) ==
                 (strings{"rank 0, position 0 (F1.0): dataflow: FWD runs before its input is computed: no F0.0 before "
                          "it on rank 0",
                          "rank 0, position 2 (F1.1): dataflow: FWD runs before its input is computed: no F0.1 before "
                          "it on rank 0"}),
             boost::test_tools::per_element());
  BOOST_TEST(check_all({"F0.0 F1.0 B0.0 B1.0"}, ps::stage_layout(1, 2)) ==
                 strings{"rank 0, position 2 (B0.0): dataflow: backward runs before its gradient is computed: no B1.0 "
                         "before it on rank 0"},
             boost::test_tools::per_element());
  // BWD_INPUT stands for the backward: it consumes the gradient and produces what BWD_SEND sends.
  BOOST_TEST(check_all({"F0.0 FS0.0 BR0.0 BI0.0 BW0.0", "FR1.0 F1.0 BI1.0 BS1.0 BW1.0"}, ps::stage_layout(2)).empty());
}

BOOST_AUTO_TEST_CASE(two_rank_deadlock_is_reported_as_a_cycle) {
  auto const orders = parse({"F0.0 BR0.0 FS0.0 B0.0", "FR1.0 F1.0 B1.0 BS1.0"});
  auto const report = ps::check_schedule(orders, ps::stage_layout(2));
  BOOST_TEST(report.problems.empty());
  BOOST_TEST((report.deadlock ==
              std::vector<ps::blocked_receive>{{0, 1, "BR0.0", 1, 3, "BS1.0"}, {1, 0, "FR1.0", 0, 2, "FS0.0"}}));
  expect_error([&] { ps::require_valid_schedule(orders, ps::stage_layout(2)); },
               "schedule has 0 problems and deadlocks:\n"
               "  deadlock:\n"
               "    rank 0 blocks at position 1 (BR0.0) waiting for rank 1 position 3 (BS1.0)\n"
               "    rank 1 blocks at position 0 (FR1.0) waiting for rank 0 position 2 (FS0.0)");
}

BOOST_AUTO_TEST_CASE(a_ring_of_four_ranks) {
  // Micro-batch 0 through 8 stages on 4 ranks; rank 3 waits for stage 7's input before stage 3's, so
  // every rank waits for the next one round the ring.
  auto const orders = parse({"F0.0 FS0.0 FR4.0 F4.0 FS4.0", "FR1.0 F1.0 FS1.0 FR5.0 F5.0 FS5.0",
                             "FR2.0 F2.0 FS2.0 FR6.0 F6.0 FS6.0", "FR7.0 F7.0 FR3.0 F3.0 FS3.0"});
  auto const report = ps::check_schedule(orders, ps::stage_layout(4, 2));
  BOOST_TEST(report.problems.empty());
  BOOST_TEST((report.deadlock == std::vector<ps::blocked_receive>{{0, 2, "FR4.0", 3, 4, "FS3.0"},
                                                                  {3, 0, "FR7.0", 2, 5, "FS6.0"},
                                                                  {2, 3, "FR6.0", 1, 5, "FS5.0"},
                                                                  {1, 3, "FR5.0", 0, 4, "FS4.0"}}));
}

BOOST_AUTO_TEST_CASE(a_blocked_bystander_is_not_part_of_the_cycle) {
  // Ranks 1 and 2 wait for each other; rank 0 waits for rank 1 and is blocked too, outside the cycle.
  auto const orders = parse({"F0.0 FS0.0 BR0.0 B0.0", "FR1.0 F1.0 BR1.0 FS1.0 B1.0 BS1.0", "FR2.0 F2.0 B2.0 BS2.0"});
  auto const report = ps::check_schedule(orders, ps::stage_layout(3));
  BOOST_TEST(report.problems.empty());
  BOOST_TEST((report.deadlock ==
              std::vector<ps::blocked_receive>{{1, 2, "BR1.0", 2, 3, "BS2.0"}, {2, 0, "FR2.0", 1, 3, "FS1.0"}}));
}

BOOST_AUTO_TEST_CASE(a_finished_rank_zero_is_skipped) {
  // Rank 0 runs to its end; the search for the cycle starts at rank 1, the lowest blocked rank.
  auto const report = ps::check_schedule(parse({"F0.0 FS0.0", "FR1.0 F1.0 BR1.0 FS1.0 B1.0", "FR2.0 F2.0 B2.0 BS2.0"}),
                                         ps::stage_layout(3));
  BOOST_TEST((report.deadlock ==
              std::vector<ps::blocked_receive>{{1, 2, "BR1.0", 2, 3, "BS2.0"}, {2, 0, "FR2.0", 1, 3, "FS1.0"}}));
}

BOOST_AUTO_TEST_CASE(a_cycle_entered_above_its_lowest_rank_starts_at_its_lowest_rank) {
  // Rank 0 (stages 0, 3) waits for stage 2's output on rank 2; ranks 1 and 2 wait for each other.
  // Following the waits from rank 0 enters the cycle at rank 2; the report starts it at rank 1.
  auto const report =
      ps::check_schedule(parse({"F0.0 FS0.0 FR3.0 F3.0", "FR1.0 F1.0 BR1.0 FS1.0 B1.0", "FR2.0 F2.0 FS2.0 B2.0 BS2.0"}),
                         ps::stage_layout(3, 2));
  BOOST_TEST((report.deadlock ==
              std::vector<ps::blocked_receive>{{1, 2, "BR1.0", 2, 4, "BS2.0"}, {2, 0, "FR2.0", 1, 3, "FS1.0"}}));
}

BOOST_AUTO_TEST_CASE(a_rank_can_deadlock_on_itself) {
  // One rank runs stages 0 and 1 and receives from itself before it sends.
  auto const report = ps::check_schedule(parse({"FR1.0 F0.0 FS0.0 F1.0"}), ps::stage_layout(1, 2));
  BOOST_TEST((report.deadlock == std::vector<ps::blocked_receive>{{0, 0, "FR1.0", 0, 2, "FS0.0"}}));
}

BOOST_AUTO_TEST_CASE(sends_do_not_block) {
  // Both ranks send first and receive later: fine with posted sends (the label check of the reference,
  // which assumes rendezvous, calls this a cycle; see below).
  auto const orders = parse({"F0.0 FS0.0 BR0.0 B0.0", "FR1.0 F1.0 B1.0 BS1.0"});
  BOOST_TEST(ps::check_schedule(orders, ps::stage_layout(2)).ok());
}

BOOST_AUTO_TEST_CASE(layout_must_match) {
  expect_error([] { ps::check_schedule(ps::gpipe(2, 2), ps::stage_layout(3)); },
               "check_schedule: 2 orders for a layout of 3 ranks");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(reference_labels)

using lm = ps::label_map;

std::optional<ps::label_cycle> cycle(lm const& m) { return ps::find_label_cycle(m); }

// Reference §4.1 item 9 (TestDetectCycleInGraph), case by case.
BOOST_AUTO_TEST_CASE(detect_cycle_in_graph) {
  BOOST_TEST((cycle({{"1", {"A", "B", "C", "A"}}}) ==
              ps::label_cycle{{"A", "B", "C", "A"}, {"1 A -> B", "1 B -> C", "1 C -> A"}}));
  BOOST_TEST(!cycle({{"r1", {"A", "B", "C"}}, {"r2", {"D", "E"}}}).has_value());
  auto const multiple = cycle({{"1", {"A", "B", "C", "A"}}, {"2", {"D", "E", "D"}}});
  BOOST_TEST((multiple == ps::label_cycle{{"A", "B", "C", "A"}, {"1 A -> B", "1 B -> C", "1 C -> A"}} ||
              multiple == ps::label_cycle{{"D", "E", "D"}, {"2 D -> E", "2 E -> D"}}));
  BOOST_TEST(!cycle({}).has_value());
  BOOST_TEST(!cycle({{"rank1", {"A", "B"}}}).has_value());
  BOOST_TEST(
      (cycle({{"1", {"A", "B", "C"}}, {"2", {"C", "D", "E"}}, {"3", {"E", "A"}}}) ==
       ps::label_cycle{{"A", "B", "C", "D", "E", "A"}, {"1 A -> B", "1 B -> C", "2 C -> D", "2 D -> E", "3 E -> A"}}));
  BOOST_TEST((cycle({{"1", {"A", "B", "C"}}, {"2", {"D", "E", "D"}}}) ==
              ps::label_cycle{{"D", "E", "D"}, {"2 D -> E", "2 E -> D"}}));
  BOOST_TEST(
      (cycle({{"1", {"A", "B"}}, {"2", {"B", "A"}}}) == ps::label_cycle{{"A", "B", "A"}, {"1 A -> B", "2 B -> A"}}));
  BOOST_TEST((cycle({{"1", {"A", "B"}}, {"2", {"B", "C"}}, {"3", {"C", "A"}}}) ==
              ps::label_cycle{{"A", "B", "C", "A"}, {"1 A -> B", "2 B -> C", "3 C -> A"}}));
  BOOST_TEST(!cycle({{"1", {"A", "B"}}, {"2", {"B", "C"}}, {"3", {"C", "D"}}}).has_value());
  BOOST_TEST((cycle({{"1", {"A", "A"}}}) == ps::label_cycle{{"A", "A"}, {"1 A -> A"}}));
  BOOST_TEST((cycle({{"1", {"A", "B"}}, {"2", {"B", "C"}}, {"3", {"C", "B"}}}) ==
              ps::label_cycle{{"B", "C", "B"}, {"2 B -> C", "3 C -> B"}}));
  BOOST_TEST(!cycle({{"1", {"A"}}}).has_value());
  lm chains;
  for (int r = 1; r <= 8; ++r) chains.push_back({std::to_string(r), {"A", "B", "C", "D", "E", "F", "G", "H", "I"}});
  BOOST_TEST(!cycle(chains).has_value());
}

// Reference §4.1 item 10 (TestPipelineValidation).
BOOST_AUTO_TEST_CASE(validate_pipeline_execution) {
  auto const pair = ps::validate_pipeline_execution(parse({"FS0.0", "FR1.0"}), 1);
  BOOST_TEST((pair.operations ==
              lm{{"0", {"Send_Receive_(0)->(1)_micro0_1th"}}, {"1", {"Send_Receive_(0)->(1)_micro0_1th"}}}));
  BOOST_TEST(!pair.has_cycle());
  // A full 3-rank x 3-chunk x 6-micro interleaved order has no cycle.
  auto const full = ps::validate_pipeline_execution(ps::interleaved_1f1b({3, 3, 6, false}), 3);
  BOOST_TEST(full.operations.size() == 3u);
  BOOST_TEST(!full.has_cycle());
}

BOOST_AUTO_TEST_CASE(labels_count_per_peer_and_micro_batch) {
  // Two ranks, two stages_per_rank: the forward message 0->1 (stage 0->1) and the backward one 0->1 (stage 2->1)
  // of micro-batch 0 share a counter.
  auto const ops = ps::p2p_labels(parse({"FS0.0 BS2.0 FR2.0 F9.0 _", "FR1.0 BR1.0 FS1.0 FS3.0"}), 2);
  BOOST_TEST((ops == lm{{"0",
                         {"Send_Receive_(0)->(1)_micro0_1th", "Send_Receive_(0)->(1)_micro0_2th",
                          "Send_Receive_(1)->(0)_micro0_1th"}},
                        {"1",
                         {"Send_Receive_(0)->(1)_micro0_1th", "Send_Receive_(0)->(1)_micro0_2th",
                          "Send_Receive_(1)->(0)_micro0_1th"}}}));
}

BOOST_AUTO_TEST_CASE(label_cycles_assume_rendezvous_sends) {
  // Rank 0 sends both forwards before it receives a gradient; rank 1 sends the first gradient before it
  // receives the second forward. With rendezvous sends both block (a label cycle); with posted sends
  // the schedule runs.
  auto const orders =
      parse({"F0.0 FS0.0 F0.1 FS0.1 BR0.0 B0.0 BR0.1 B0.1", "FR1.0 F1.0 B1.0 BS1.0 FR1.1 F1.1 B1.1 BS1.1"});
  BOOST_TEST(ps::check_schedule(orders, ps::stage_layout(2)).ok());
  std::string const a1 = "Send_Receive_(0)->(1)_micro1_1th", b0 = "Send_Receive_(1)->(0)_micro0_1th";
  BOOST_TEST((ps::validate_pipeline_execution(orders, 1).cycle ==
              ps::label_cycle{{a1, b0, a1}, {"0 " + a1 + " -> " + b0, "1 " + b0 + " -> " + a1}}));
  // Receiving before sending on both ends is a cycle for both checks.
  auto const crossed = parse({"F0.0 BR0.0 FS0.0 B0.0", "FR1.0 F1.0 B1.0 BS1.0"});
  BOOST_TEST(ps::check_schedule(crossed, ps::stage_layout(2)).deadlock.size() == 2u);
  std::string const a0 = "Send_Receive_(0)->(1)_micro0_1th";
  BOOST_TEST((ps::validate_pipeline_execution(crossed, 1).cycle ==
              ps::label_cycle{{b0, a0, b0}, {"0 " + b0 + " -> " + a0, "1 " + a0 + " -> " + b0}}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE_END() // schedule_validate
