// The safetensors writer: byte-exact output (the reference implementation's own test vectors and
// hand-computed ones), deterministic order and alignment, round trips through the reader, and
// rejection of input that would make an invalid file.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io_support.hpp"

#include <pipeswap/io/safetensors.hpp>

namespace io = pipeswap::io;
using pipeswap::dtype;
using namespace io_test;

namespace {

bytes from_ints(std::initializer_list<int> v) {
  bytes b;
  for (int x : v) b.push_back(static_cast<std::byte>(x));
  return b;
}

std::string write_error(std::vector<io::tensor_source> const& ts, io::metadata_map const& m = {},
                        io::write_options const& o = {}) {
  return thrown_message<pipeswap::invalid_argument>([&] { (void)io::serialize(ts, m, o); });
}

constexpr dtype all_dtypes[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64, dtype::i64, dtype::u8};

/// Reads `file` back and checks it holds exactly `ts` and `m`.
void check_round_trip(bytes const& file, std::vector<io::tensor_source> const& ts, io::metadata_map const& m) {
  auto const v = io::safetensors_view::parse(file);
  BOOST_TEST(v.size() == ts.size());
  BOOST_TEST((v.metadata() == m));
  for (auto const& t : ts) {
    BOOST_TEST_CONTEXT("tensor " << t.name) {
      auto const* r = v.find(t.name);
      BOOST_REQUIRE(r != nullptr);
      BOOST_TEST((r->type == t.type));
      BOOST_TEST(r->shape == t.shape, boost::test_tools::per_element());
      BOOST_TEST(r->bytes.size() == t.bytes.size());
      BOOST_TEST((std::equal(r->bytes.begin(), r->bytes.end(), t.bytes.begin(), t.bytes.end())));
      // The format's alignment: every tensor starts at a file offset that is a multiple of its
      // element size.
      auto const file_offset = static_cast<std::size_t>(r->bytes.data() - file.data());
      BOOST_TEST(file_offset % pipeswap::size_of(r->type) == 0u);
    }
  }
  BOOST_TEST(v.header_size() % 8 == 0u);
}

} // namespace

BOOST_AUTO_TEST_SUITE(io_safetensors_write)

// The reference implementation's test vectors (safetensors/src/tensor.rs: test_serialization,
// test_empty, test_serialization_forced_alignement): the same input gives the same bytes.
BOOST_AUTO_TEST_CASE(matches_the_reference_test_vectors) {
  std::vector<float> const data{0.f, 1.f, 2.f, 3.f, 4.f, 5.f};
  std::vector<io::tensor_source> ts{{"attn.0", dtype::f32, {1, 2, 3}, as_bytes_of(data)}};
  bytes const expected = from_ints(
      {64,  0,  0,   0,  0,   0,  0,   0,   123, 34,  97,  116, 116, 110, 46,  48, 34, 58, 123, 34, 100, 116, 121, 112,
       101, 34, 58,  34, 70,  51, 50,  34,  44,  34,  115, 104, 97,  112, 101, 34, 58, 91, 49,  44, 50,  44,  51,  93,
       44,  34, 100, 97, 116, 97, 95,  111, 102, 102, 115, 101, 116, 115, 34,  58, 91, 48, 44,  50, 52,  93,  125, 125,
       0,   0,  0,   0,  0,   0,  128, 63,  0,   0,   0,   64,  0,   0,   64,  64, 0,  0,  128, 64, 0,   0,   160, 64});
  BOOST_TEST((io::serialize(ts) == expected));

  BOOST_TEST((io::serialize({}) == from_ints({8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32})));
  BOOST_TEST((io::serialize({}, {{"framework", "pt"}}) ==
              from_ints({40,  0,   0,   0,  0,  0,  0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
                         100, 97,  116, 97, 95, 95, 34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
                         111, 114, 107, 34, 58, 34, 112, 116, 34,  125, 125, 32,  32,  32,  32,  32})));

  std::vector<io::tensor_source> ts2{{"attn0", dtype::f32, {1, 1, 2, 3}, as_bytes_of(data)}};
  bytes const expected2 =
      from_ints({72,  0,   0,   0,  0,  0,  0,  0,  123, 34,  97, 116, 116, 110, 48,  34,  58,  123, 34,  100, 116,
                 121, 112, 101, 34, 58, 34, 70, 51, 50,  34,  44, 34,  115, 104, 97,  112, 101, 34,  58,  91,  49,
                 44,  49,  44,  50, 44, 51, 93, 44, 34,  100, 97, 116, 97,  95,  111, 102, 102, 115, 101, 116, 115,
                 34,  58,  91,  48, 44, 50, 52, 93, 125, 125, 32, 32,  32,  32,  32,  32,  32,  0,   0,   0,   0,
                 0,   0,   128, 63, 0,  0,  0,  64, 0,   0,   64, 64,  0,   0,   128, 64,  0,   0,   160, 64});
  BOOST_TEST((io::serialize(ts2) == expected2));
}

BOOST_AUTO_TEST_CASE(byte_exact_output_for_a_hand_computed_file) {
  // F64 sorts before F16 before U8 (descending alignment rank), then names; metadata first.
  std::vector<std::uint8_t> const b{1, 2, 3};
  std::vector<double> const a{1.5};
  std::vector<io::tensor_source> const ts{
      {"b", dtype::u8, {3}, as_bytes_of(b)},
      {"a", dtype::f64, {}, as_bytes_of(a)},
      {"c", dtype::f16, {0}, {}},
  };
  std::string const header = R"({"__metadata__":{"step":"7"},)"
                             R"("a":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                             R"("c":{"dtype":"F16","shape":[0],"data_offsets":[8,8]},)"
                             R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})"
                             "     "; // 187 bytes of JSON + 5 spaces = 192, a multiple of 8
  bytes expected = from_ints({192, 0, 0, 0, 0, 0, 0, 0});
  for (char c : header) expected.push_back(static_cast<std::byte>(c));
  for (int x : {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 1, 2, 3}) {
    expected.push_back(static_cast<std::byte>(x));
  }
  BOOST_REQUIRE_EQUAL(expected.size(), 211u);

  io::safetensors_writer const w(ts, {{"step", "7"}});
  BOOST_TEST(w.header_size() == 192u);
  BOOST_TEST(w.data_size() == 11u);
  BOOST_TEST(w.total_size() == 211u);
  BOOST_TEST(w.header() == header);
  std::vector<std::size_t> const order(w.order().begin(), w.order().end());
  BOOST_TEST(order == (std::vector<std::size_t>{1, 2, 0}), boost::test_tools::per_element());
  BOOST_TEST((w.to_bytes() == expected));
  BOOST_TEST((io::serialize(ts, {{"step", "7"}}) == expected));
  BOOST_TEST(io::serialized_size(ts, {{"step", "7"}}) == 211u);

  bytes buf(211);
  io::serialize_to(buf, ts, {{"step", "7"}});
  BOOST_TEST((buf == expected));
  bytes small(210);
  BOOST_TEST(thrown_message<pipeswap::invalid_argument>([&] {
               io::serialize_to(small, ts, {{"step", "7"}});
             }) == "safetensors: write_to: the buffer holds 210 bytes but the file is 211");
}

BOOST_AUTO_TEST_CASE(round_trips_every_dtype_and_shape_kind) {
  std::vector<std::vector<std::uint64_t>> const shapes{{}, {0}, {1}, {5}, {2, 3}, {3, 0, 2}, {2, 1, 3, 2}};
  std::vector<bytes> storage;
  std::vector<io::tensor_source> ts;
  std::uint32_t seed = 1;
  for (dtype t : all_dtypes) {
    for (auto const& s : shapes) {
      std::uint64_t n = 1;
      for (auto d : s) n *= d;
      storage.push_back(random_bytes(n * pipeswap::size_of(t), seed++));
      ts.push_back({std::string(pipeswap::name_of(t)) + "/" + std::to_string(ts.size()), t, s, {}});
    }
  }
  for (std::size_t i = 0; i < ts.size(); ++i) ts[i].bytes = storage[i];
  io::metadata_map const m{{"step", "1200"},
                           {"betas", "[0.9, 0.999]"},
                           {"quote\"back\\slash", "new\nline\ttab\x01\x1f\x7f"},
                           {"unicode", "\xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80"},
                           {"", "empty key"},
                           {"empty value", ""}};
  auto const file = io::serialize(ts, m);
  check_round_trip(file, ts, m);
  // Input order does not matter.
  auto shuffled = ts;
  std::mt19937 g(7);
  std::shuffle(shuffled.begin(), shuffled.end(), g);
  BOOST_TEST((io::serialize(shuffled, m) == file));
}

BOOST_AUTO_TEST_CASE(random_sets_round_trip_aligned) {
  std::mt19937 g(42);
  for (int round = 0; round < 200; ++round) {
    std::size_t const count = g() % 9;
    std::vector<bytes> storage;
    std::vector<io::tensor_source> ts;
    for (std::size_t i = 0; i < count; ++i) {
      dtype const t = all_dtypes[g() % 6];
      std::vector<std::uint64_t> shape(g() % 4);
      std::uint64_t n = 1;
      for (auto& d : shape) {
        d = g() % 5;
        n *= d;
      }
      storage.push_back(random_bytes(n * pipeswap::size_of(t), static_cast<std::uint32_t>(g())));
      ts.push_back({"t" + std::to_string(g() % 1000) + "_" + std::to_string(i), t, shape, {}});
    }
    for (std::size_t i = 0; i < ts.size(); ++i) ts[i].bytes = storage[i];
    io::metadata_map m;
    if (g() % 2) m["round"] = std::to_string(round);
    BOOST_TEST_CONTEXT("round " << round) {
      auto const file = io::serialize(ts, m);
      BOOST_TEST(file.size() == io::serialized_size(ts, m));
      check_round_trip(file, ts, m);
    }
  }
}

BOOST_AUTO_TEST_CASE(json_strings_are_escaped_as_the_reference_does) {
  // serde_json (the reference) and nlohmann with ensure_ascii=false escape identically: " \ and
  // the control characters; everything else verbatim. Check every byte below 0x80 and some UTF-8.
  std::vector<std::string> names;
  for (int c = 1; c < 0x80; ++c) names.push_back("n" + std::string(1, static_cast<char>(c)));
  names.push_back(std::string("nul\0in", 6));
  names.push_back("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  std::vector<io::tensor_source> ts;
  for (auto const& n : names) ts.push_back({n, dtype::u8, {0}, {}});
  io::safetensors_writer const w(ts);
  std::string expected = "{";
  for (std::size_t i : w.order()) {
    if (expected.size() > 1) expected += ',';
    expected += nlohmann::json(ts[i].name).dump();
    expected += R"(:{"dtype":"U8","shape":[0],"data_offsets":[0,0]})";
  }
  expected += '}';
  std::string header(w.header());
  while (header.ends_with(' ') && header.size() > expected.size()) header.pop_back();
  BOOST_TEST(header == expected);
  check_round_trip(w.to_bytes(), ts, {});
}

BOOST_AUTO_TEST_CASE(rejects_input_that_would_make_an_invalid_file) {
  std::vector<float> const four(4);
  auto const b = as_bytes_of(four);
  std::string const p = "safetensors: cannot write: ";
  BOOST_TEST(write_error({{"", dtype::f32, {4}, b}}) == p + "a tensor has an empty name");
  BOOST_TEST(write_error({{"__metadata__", dtype::f32, {4}, b}}) ==
             p + "tensor name \"__metadata__\" is reserved for the metadata");
  BOOST_TEST(write_error({{"x", dtype::f32, {4}, b}, {"y", dtype::u8, {16}, b}, {"x", dtype::u8, {16}, b}}) ==
             p + "tensor \"x\" appears twice");
  BOOST_TEST(write_error({{"bad\xFF", dtype::f32, {4}, b}}) ==
             p + "tensor \"bad\\xff\": name is not valid UTF-8 (byte 3)");
  BOOST_TEST(write_error({{"x", dtype::f32, {3}, b}}) == p + "tensor \"x\": F32 [3] needs 12 bytes but 16 were given");
  BOOST_TEST(write_error({{"x", dtype::f64, {}, b}}) == p + "tensor \"x\": F64 [] needs 8 bytes but 16 were given");
  BOOST_TEST(write_error({{"x", dtype::bf16, {1ull << 32, 1ull << 32}, b}}) ==
             p + "tensor \"x\": BF16 [4294967296, 4294967296] needs more than 2^64 - 1 bytes");
  BOOST_TEST(write_error({{"x", dtype::i64, {1ull << 61}, b}}) ==
             p + "tensor \"x\": I64 [2305843009213693952] needs more than 2^64 - 1 bytes");
  BOOST_TEST(write_error({}, {{"k\xC3", "v"}}) == p + "metadata key \"k\\xc3\" is not valid UTF-8 (byte 1)");
  BOOST_TEST(write_error({}, {{"k", "\xED\xA0\x80"}}) == p + "metadata \"k\": value is not valid UTF-8 (byte 0)");
  BOOST_TEST(write_error({{"x", dtype::f32, {4}, b}}, {}, io::write_options{16}) ==
             p + "the header would be 56 bytes, over the limit of 16");
  std::vector<io::tensor_source> const ok{{"x", dtype::f32, {4}, b}};
  BOOST_CHECK_NO_THROW((void)io::serialize(ok, {}, io::write_options{56}));
}

BOOST_AUTO_TEST_SUITE_END() // io_safetensors_write
