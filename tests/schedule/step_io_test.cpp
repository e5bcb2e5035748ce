// The step model and its two external forms: the compact text form and JSON. Round trips, the exact
// spellings, and every class of bad input with the message it must carry.
#include <boost/test/unit_test.hpp>

#include "support.hpp"

#include <string>
#include <string_view>

#include <pipeswap/schedule/json.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>

namespace ps = pipeswap::schedule;
using ps::step_kind;
using schedule_test::expect_error;

namespace {

ps::order sample_order() {
  return {ps::fwd(0, 3),
          ps::leaf(step_kind::fwd_send, 0, 3),
          ps::composite(step_kind::overlap_b_f, {ps::bwd(4, 0), ps::fwd(0, 7)}),
          ps::entry{},
          ps::leaf(step_kind::swap_launch_offload, 0, 3),
          ps::leaf(step_kind::fsdp_unshard, 1),
          ps::composite(step_kind::overlap_f_b, {ps::fwd(2, 1), ps::leaf(step_kind::bwd_input, 6, 0)}),
          ps::leaf(step_kind::bwd_weight, 6, 0)};
}

} // namespace

BOOST_AUTO_TEST_SUITE(schedule_step_io)

BOOST_AUTO_TEST_CASE(kind_names_round_trip_and_classify) {
  for (step_kind k : ps::all_step_kinds) BOOST_TEST((ps::step_kind_from_name(ps::step_kind_name(k)) == k));
  BOOST_TEST(ps::step_kind_name(step_kind::swap_wait_offload) == "SWAP_WAIT_OFFLOAD");
  BOOST_TEST(!ps::step_kind_from_name("fwd").has_value()); // case-sensitive
  BOOST_TEST(!ps::step_kind_from_name("BATCH_SEND_RECV").has_value());
  BOOST_TEST(!ps::step_kind_from_name("FSDP_PREFETCH").has_value()); // unknown FSDP_* names are rejected
  BOOST_TEST(ps::is_compute(step_kind::fwd));
  BOOST_TEST(!ps::is_compute(step_kind::bwd_input)); // opaque: never a compute slot
  BOOST_TEST(ps::is_p2p(step_kind::bwd_recv));
  BOOST_TEST(ps::is_swap(step_kind::swap_set_group));
  BOOST_TEST(ps::is_swap(step_kind::swap_wait_load));
  BOOST_TEST(!ps::is_swap(step_kind::bwd_input));
  BOOST_TEST(ps::is_fsdp(step_kind::fsdp_wait_reduce_grad));
  BOOST_TEST(!ps::has_micro(step_kind::fsdp_unshard));
  BOOST_TEST(!ps::has_micro(step_kind::overlap_b_f));
}

BOOST_AUTO_TEST_CASE(equality_compares_leaves_and_hash_ignores_them) {
  auto a = ps::composite(step_kind::overlap_b_f, {ps::bwd(4, 0), ps::fwd(0, 7)});
  auto b = ps::composite(step_kind::overlap_b_f, {ps::bwd(4, 0), ps::fwd(0, 6)});
  BOOST_TEST(!(a == b));
  BOOST_TEST(ps::step_hash{}(a) == ps::step_hash{}(b));
  BOOST_TEST((ps::fwd(1, 2) == ps::leaf(step_kind::fwd, 1, 2)));
  BOOST_TEST(!(ps::fwd(1, 2) == ps::bwd(1, 2)));
}

BOOST_AUTO_TEST_CASE(text_form_prints_and_parses_exactly) {
  auto const o = sample_order();
  std::string const text = "F0.3 FS0.3 [B4.0|F0.7] _ LO0.3 US1 [F2.1|BI6.0] BW6.0";
  BOOST_TEST(ps::to_text(o) == text);
  BOOST_TEST((ps::order_from_text(text) == o));
  // Extra white space and explicit composite prefixes are accepted.
  BOOST_TEST((ps::order_from_text("  F0.3\tFS0.3\n BF[ B4.0 | F0.7 ] _ LO0.3 US1 FB[F2.1|BI6.0] BW6.0 ") == o));
  BOOST_TEST(ps::order_from_text("").empty());
  BOOST_TEST(ps::to_text(ps::order{}).empty());
}

BOOST_AUTO_TEST_CASE(text_form_names_every_kind) {
  ps::order o;
  for (step_kind k : ps::all_step_kinds) {
    if (ps::is_composite(k)) continue;
    o.push_back(ps::leaf(k, 2, ps::has_micro(k) ? 5 : ps::no_index));
  }
  std::string const text =
      "F2.5 B2.5 FR2.5 FS2.5 BR2.5 BS2.5 SG2.5 LO2.5 WO2.5 LL2.5 WL2.5 BI2.5 BW2.5 US2 RS2 RG2 WG2";
  BOOST_TEST(ps::to_text(o) == text);
  BOOST_TEST((ps::order_from_text(text) == o));
}

BOOST_AUTO_TEST_CASE(composite_prefix_is_printed_only_when_inference_differs) {
  auto const fb_backward_first = ps::composite(step_kind::overlap_f_b, {ps::bwd(1, 0), ps::fwd(0, 2)});
  BOOST_TEST(ps::to_text(fb_backward_first) == "FB[B1.0|F0.2]");
  BOOST_TEST((ps::entry_from_text("FB[B1.0|F0.2]") == ps::entry(fb_backward_first)));
  auto const bf_send_first = ps::composite(step_kind::overlap_b_f, {ps::leaf(step_kind::fwd_send, 0, 1)});
  BOOST_TEST(ps::to_text(bf_send_first) == "BF[FS0.1]");
  BOOST_TEST((ps::entry_from_text("BF[FS0.1]") == ps::entry(bf_send_first)));
  BOOST_TEST(ps::to_text(ps::composite(step_kind::overlap_b_f, {})) == "BF[]");
}

BOOST_AUTO_TEST_CASE(text_printing_shows_malformed_steps) {
  BOOST_TEST(ps::to_text(ps::leaf(step_kind::fwd, ps::no_index, -7)) == "F?.-7");
  BOOST_TEST(ps::to_text(ps::leaf(step_kind::fsdp_reshard, 3, 2)) == "RS3.2");
  BOOST_TEST(ps::to_text(ps::entry{}) == "_");
}

BOOST_AUTO_TEST_CASE(bad_text_is_rejected_with_entry_and_column) {
  expect_error([] { ps::order_from_text("F0.1 X0.1"); }, "order text: entry 1 (column 7): unknown step code 'X'");
  expect_error([] { ps::order_from_text("F0"); },
               "order text: entry 0 (column 3): expected '.' and the micro-batch after the stage");
  expect_error([] { ps::order_from_text("F.1"); }, "order text: entry 0 (column 2): expected the stage (digits)");
  expect_error([] { ps::order_from_text("F0.-1"); },
               "order text: entry 0 (column 4): expected the micro-batch (digits)");
  expect_error([] { ps::order_from_text("F0.99999999999"); },
               "order text: entry 0 (column 14): the micro-batch is out of range");
  expect_error([] { ps::order_from_text("US1.2"); },
               "order text: entry 0 (column 4): FSDP_UNSHARD takes no micro-batch");
  expect_error([] { ps::order_from_text("F0.1,F0.2"); },
               "order text: entry 0 (column 5): expected white space after the entry, got ','");
  expect_error([] { ps::order_from_text("_ []"); }, "order text: entry 1 (column 5): a composite needs leaves");
  expect_error([] { ps::order_from_text("FB[]"); }, "order text: entry 0 (column 5): OVERLAP_F_B has no leaves");
  expect_error([] { ps::order_from_text("[F0.1|B0.1|F0.2]"); },
               "order text: entry 0 (column 17): OVERLAP_F_B has 3 leaves; a composite holds one or two");
  expect_error([] { ps::order_from_text("[F0.1 B0.1]"); },
               "order text: entry 0 (column 7): expected '|' or ']' in the composite");
  expect_error([] { ps::order_from_text("[F0.1|[B0.1]]"); },
               "order text: entry 0 (column 7): a composite cannot hold a composite");
  expect_error([] { ps::order_from_text("[F0.1"); }, "order text: entry 0 (column 6): unterminated composite");
  expect_error([] { ps::order_from_text("[LO0.1|F0.1]"); },
               "order text: entry 0 (column 13): cannot tell the composite's kind from its first leaf; write FB[...] "
               "or BF[...]");
  expect_error([] { ps::order_from_text("XY[F0.1]"); },
               "order text: entry 0 (column 3): unknown composite prefix 'XY' (FB or BF)");
  expect_error([] { ps::entry_from_text("F0.1 F0.2"); },
               "order text: entry 0 (column 6): unexpected text after the step");
  expect_error([] { ps::entry_from_text(" "); }, "order text: entry 0 (column 2): no step");
}

BOOST_AUTO_TEST_CASE(json_has_the_documented_shape) {
  auto const j = ps::to_json(sample_order());
  BOOST_TEST(j.dump() ==
             R"([{"type":"FWD","stage":0,"micro":3},{"type":"FWD_SEND","stage":0,"micro":3},)"
             R"({"type":"OVERLAP_B_F","stage":null,"micro":null,"sub":[{"type":"BWD","stage":4,"micro":0},)"
             R"({"type":"FWD","stage":0,"micro":7}]},null,{"type":"SWAP_LAUNCH_OFFLOAD","stage":0,"micro":3},)"
             R"({"type":"FSDP_UNSHARD","stage":1,"micro":null},)"
             R"({"type":"OVERLAP_F_B","stage":null,"micro":null,"sub":[{"type":"FWD","stage":2,"micro":1},)"
             R"({"type":"BWD_INPUT","stage":6,"micro":0}]},{"type":"BWD_WEIGHT","stage":6,"micro":0}])");
}

BOOST_AUTO_TEST_CASE(json_round_trips_through_text_and_both_json_flavours) {
  auto const o = sample_order();
  BOOST_TEST((ps::order_from_json_text(ps::to_json(o).dump()) == o));
  BOOST_TEST((ps::order_from_json(ps::to_json<nlohmann::json>(o)) == o));
  BOOST_TEST((ps::order_from_json(ps::to_json<nlohmann::ordered_json>(o)) == o));
  ps::rank_orders const two{o, ps::order_from_text("_ B1.0 _")};
  BOOST_TEST((ps::rank_orders_from_json_text(ps::to_json(two).dump(2)) == two));
  // Absent stage/micro on composites and absent micro on FSDP steps read as null; an empty "sub" on a
  // leaf is accepted.
  auto const loose = ps::order_from_json_text(
      R"([{"type":"OVERLAP_B_F","sub":[{"type":"BWD","stage":4,"micro":0},{"type":"FWD","stage":0,"micro":7}]},)"
      R"({"type":"FSDP_UNSHARD","stage":1},{"type":"FWD","stage":0,"micro":3,"sub":[]}])");
  BOOST_TEST(ps::to_text(loose) == "[B4.0|F0.7] US1 F0.3");
}

BOOST_AUTO_TEST_CASE(bad_json_is_rejected_with_entry_and_reason) {
  auto bad = [](char const* text, std::string_view message) {
    expect_error([&] { ps::order_from_json_text(text); }, message);
  };
  bad(R"({"type":"FWD"})", "order JSON: top level: an order must be an array, got object");
  bad(R"([1])", "order JSON: entry 0: expected an object or null, got number");
  bad(R"([null, {"type":"FOO","stage":0,"micro":0}])", "order JSON: entry 1: unknown step type 'FOO'");
  bad(R"([{"type":"FSDP_PREFETCH","stage":0}])", "order JSON: entry 0: unknown step type 'FSDP_PREFETCH'");
  bad(R"([{"stage":0,"micro":0}])", "order JSON: entry 0: missing 'type'");
  bad(R"([{"type":3,"stage":0,"micro":0}])", "order JSON: entry 0: 'type' must be a string, got 3");
  bad(R"([{"type":"FWD","stage":0,"micor":1}])", "order JSON: entry 0: unknown key 'micor'");
  bad(R"([{"type":"FWD","stage":-1,"micro":0}])",
      "order JSON: entry 0: 'stage' must be a non-negative integer, got -1");
  bad(R"([{"type":"FWD","stage":0,"micro":1.5}])",
      "order JSON: entry 0: 'micro' must be a non-negative integer or null, got 1.5");
  bad(R"([{"type":"FWD","stage":0,"micro":"3"}])",
      "order JSON: entry 0: 'micro' must be a non-negative integer or null, got \"3\"");
  bad(R"([{"type":"FWD","stage":4294967296,"micro":0}])", "order JSON: entry 0: 'stage' is out of range (4294967296)");
  bad(R"([{"type":"FWD","stage":0}])", "order JSON: entry 0: FWD has no micro-batch");
  bad(R"([{"type":"FWD","stage":null,"micro":0}])", "order JSON: entry 0: FWD has no stage");
  bad(R"([{"type":"FSDP_RESHARD","stage":1,"micro":2}])",
      "order JSON: entry 0: FSDP_RESHARD carries a micro-batch (2); FSDP steps act on a whole stage");
  bad(R"([{"type":"OVERLAP_B_F","stage":null,"micro":null}])", "order JSON: entry 0: OVERLAP_B_F has no leaves");
  bad(R"([{"type":"OVERLAP_B_F","stage":null,"micro":null,"sub":[]}])",
      "order JSON: entry 0: OVERLAP_B_F has no leaves");
  bad(R"([{"type":"OVERLAP_F_B","stage":2,"micro":null,"sub":[{"type":"FWD","stage":0,"micro":0}]}])",
      "order JSON: entry 0: OVERLAP_F_B carries a stage or micro-batch; a composite's stages and micro-batches belong "
      "to its leaves");
  bad(R"([{"type":"FWD","stage":0,"micro":0,"sub":[{"type":"BWD","stage":0,"micro":0}]}])",
      "order JSON: entry 0: FWD is not a composite but has 1 leaves");
  bad(R"([{"type":"OVERLAP_F_B","sub":{"type":"FWD"}}])",
      R"(order JSON: entry 0: 'sub' must be an array, got {"type":"FWD"})");
  bad(R"([{"type":"OVERLAP_F_B","sub":[null]}])",
      "order JSON: entry 0: sub-step 0: a bubble cannot be a leaf of a composite");
  bad(R"([{"type":"OVERLAP_F_B","sub":[{"type":"OVERLAP_B_F","sub":[]}]}])",
      "order JSON: entry 0: sub-step 0: a composite cannot be a leaf of a composite");
  bad(R"([{"type":"OVERLAP_F_B","sub":[{"type":"FWD","stage":0,"micro":-2}]}])",
      "order JSON: entry 0: sub-step 0: 'micro' must be a non-negative integer, got -2");
  expect_error([] { ps::rank_orders_from_json_text(R"([[], [null, {"type":"BWD","stage":1}]])"); },
               "order JSON: rank 1: entry 1: BWD has no micro-batch");
  expect_error([] { ps::rank_orders_from_json_text(R"([[], 7])"); },
               "order JSON: rank 1: an order must be an array, got number");
  expect_error([] { ps::order_from_json_text(R"([{"type":"FWD",])"); },
               "order JSON: malformed at byte 16: [json.exception.parse_error.101] parse error at line 1, column 16: "
               "syntax error while parsing object key - unexpected ']'; expected string literal");
}

BOOST_AUTO_TEST_SUITE_END() // schedule_step_io
