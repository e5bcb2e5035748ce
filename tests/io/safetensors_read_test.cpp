// The safetensors reader: every rule of the format is enforced, with its message, before anything is
// returned; valid files from other writers (unsorted, unaligned, padded) are accepted.
#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "io_support.hpp"

#include <pipeswap/io/safetensors.hpp>

namespace io = pipeswap::io;
using pipeswap::dtype;
using namespace io_test;

namespace {

std::string parse_error(bytes const& file, io::read_options const& o = {}) {
  return thrown_message<io::format_error>([&] { (void)io::safetensors_view::parse(file, o); });
}

/// The message for a file made of `header` (length field included) and `data` data bytes.
std::string header_error(std::string_view header, std::size_t data = 0) { return parse_error(make_file(header, data)); }

/// Checks the invariants every successfully parsed view must satisfy.
void check_consistent(io::safetensors_view const& v, std::span<std::byte const> file) {
  BOOST_TEST(v.total_size() == file.size());
  BOOST_TEST(v.header_size() + io::header_length_bytes + v.data_size() == file.size());
  std::uint64_t pos = 0;
  for (auto const& t : v.tensors()) {
    BOOST_TEST(t.begin == pos);
    BOOST_TEST(t.end - t.begin == t.numel() * pipeswap::size_of(t.type));
    BOOST_TEST(t.bytes.size() == t.end - t.begin);
    BOOST_TEST((t.bytes.data() == file.data() + 8 + v.header_size() + t.begin));
    BOOST_TEST(v.find(t.name) == &t);
    pos = t.end;
  }
  BOOST_TEST(pos == v.data_size());
}

/// A small valid file: metadata, three dtypes, a scalar and an empty tensor.
bytes small_valid_file() {
  static std::vector<float> const a{1.f, -2.f, 3.5f};
  static std::vector<std::int64_t> const s{42};
  static std::vector<std::uint8_t> const u{7, 8};
  std::vector<io::tensor_source> ts{
      {"w.a", dtype::f32, {3}, as_bytes_of(a)},
      {"step", dtype::i64, {}, as_bytes_of(s)},
      {"empty", dtype::f16, {2, 0}, {}},
      {"u", dtype::u8, {1, 2}, as_bytes_of(u)},
  };
  return io::serialize(ts, {{"format", "pt"}, {"lr", "0.001"}});
}

io::open_options with_mode(io::load_mode m) {
  io::open_options o;
  o.mode = m;
  return o;
}

std::string const f32x4 = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";

} // namespace

BOOST_AUTO_TEST_SUITE(io_safetensors_read)

BOOST_AUTO_TEST_CASE(accepts_the_small_file_and_exposes_everything) {
  auto const file = small_valid_file();
  auto const v = io::safetensors_view::parse(file);
  check_consistent(v, file);
  BOOST_TEST(v.size() == 4u);
  BOOST_TEST(v.metadata().at("lr") == "0.001");
  BOOST_TEST(v.metadata().size() == 2u);
  auto const& a = v.at("w.a");
  BOOST_TEST((a.type == dtype::f32));
  BOOST_TEST(a.shape == std::vector<std::uint64_t>{3}, boost::test_tools::per_element());
  float x[3];
  std::memcpy(x, a.bytes.data(), sizeof x);
  BOOST_TEST(x[1] == -2.f);
  BOOST_TEST(v.at("step").numel() == 1u);
  BOOST_TEST(v.at("step").shape.empty());
  BOOST_TEST(v.at("empty").numel() == 0u);
  BOOST_TEST(v.at("empty").bytes.empty());
  BOOST_TEST(!v.contains("missing"));
  BOOST_TEST(v.find("missing") == nullptr);
  BOOST_TEST(thrown_message<pipeswap::invalid_argument>([&] { (void)v.at("zz"); }) == "safetensors: no tensor \"zz\"");
}

BOOST_AUTO_TEST_CASE(accepts_valid_files_from_other_writers) {
  // Entries out of offset order, unaligned offsets, whitespace around the JSON, padding, empty
  // tensors sharing an offset, an empty metadata object, escapes and non-ASCII names.
  std::string const h = "  {\"z\":{\"data_offsets\":[0,3],\"shape\":[3],\"dtype\":\"U8\"},"
                        "\"\\u00e9t\\u00e9\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[3,7]},"
                        "\"e1\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[3,3]},"
                        "\"e0\":{\"dtype\":\"I64\",\"shape\":[0,4],\"data_offsets\":[3,3]},"
                        "\"__metadata__\":{}}   \n\t ";
  auto const file = make_file(h, 7);
  auto const v = io::safetensors_view::parse(file);
  check_consistent(v, file);
  std::vector<std::string> names;
  for (auto const& t : v.tensors()) names.push_back(t.name);
  std::vector<std::string> const expected{"z", "e0", "e1", "\xC3\xA9t\xC3\xA9"};
  BOOST_TEST(names == expected, boost::test_tools::per_element());
  BOOST_TEST(v.at("\xC3\xA9t\xC3\xA9").begin == 3u);
  BOOST_TEST(v.metadata().empty());

  auto const empty = make_file("{}");
  auto const ev = io::safetensors_view::parse(empty);
  BOOST_TEST(ev.empty());
  BOOST_TEST(ev.data_size() == 0u);
}

BOOST_AUTO_TEST_CASE(rejects_files_shorter_than_the_length_field) {
  for (std::size_t n = 0; n < 8; ++n) {
    BOOST_TEST(parse_error(bytes(n)) ==
               "safetensors: header: file is " + std::to_string(n) + " bytes, shorter than the 8-byte header length");
  }
}

BOOST_AUTO_TEST_CASE(rejects_header_lengths_over_the_limit_or_past_the_end) {
  auto f = length_field(100'000'001);
  BOOST_TEST(parse_error(f) == "safetensors: header: length 100000001 exceeds the limit of 100000000 bytes");
  f = length_field(~std::uint64_t{0});
  BOOST_TEST(parse_error(f) == "safetensors: header: length 18446744073709551615 exceeds the limit "
                               "of 100000000 bytes");
  f = length_field(100);
  f.resize(18);
  BOOST_TEST(parse_error(f) == "safetensors: header: length 100 runs past the end of the file (10 "
                               "bytes follow the length field)");
  // A configurable limit.
  auto const ok = make_file(f32x4, 16);
  auto const n = f32x4.size();
  BOOST_TEST(parse_error(ok, io::read_options{n - 1}) == "safetensors: header: length " + std::to_string(n) +
                                                             " exceeds the limit of " + std::to_string(n - 1) +
                                                             " bytes");
  BOOST_CHECK_NO_THROW((void)io::safetensors_view::parse(ok, io::read_options{n}));
}

BOOST_AUTO_TEST_CASE(rejects_headers_that_are_not_utf8_json_objects) {
  BOOST_TEST(header_error("{\"a\xFF\":1}") == "safetensors: header: not valid UTF-8 at header offset 3");
  BOOST_TEST(header_error("{\"\xC0\x80\":1}") == "safetensors: header: not valid UTF-8 at header offset 2");
  BOOST_TEST(header_error("{\"\xED\xA0\x80\":1}") == "safetensors: header: not valid UTF-8 at header offset 2");
  BOOST_TEST(header_error("{\"\xF4\x90\x80\x80\":1}") == "safetensors: header: not valid UTF-8 at header offset 2");
  BOOST_TEST(header_error("{\"\xE2\x82\":1}") == "safetensors: header: not valid UTF-8 at header offset 2");
  // nlohmann would stop at the NUL and ignore the rest.
  BOOST_TEST(header_error(std::string("{}\0garbage", 10)) == "safetensors: header: NUL byte at header offset 2");
  BOOST_TEST(header_error("{\"a\":").starts_with("safetensors: header: not valid JSON: parse error"));
  BOOST_TEST(header_error("").starts_with("safetensors: header: not valid JSON: "));
  BOOST_TEST(header_error("{} x").starts_with("safetensors: header: not valid JSON: "));
  BOOST_TEST(header_error("{\"a\":1,}").starts_with("safetensors: header: not valid JSON: "));
  BOOST_TEST(header_error("{\"\\ud800\":1}").starts_with("safetensors: header: not valid JSON: "));
  BOOST_TEST(header_error("{/*c*/}").starts_with("safetensors: header: not valid JSON: "));
  BOOST_TEST(header_error("[]") == "safetensors: header: JSON is an array, not an object");
  BOOST_TEST(header_error("\"x\"") == "safetensors: header: JSON is a string, not an object");
  BOOST_TEST(header_error("12") == "safetensors: header: JSON is the number 12, not an object");
  BOOST_TEST(header_error("null") == "safetensors: header: JSON is null, not an object");
  BOOST_TEST(header_error(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})") ==
             "safetensors: header: JSON nests containers deeper than a safetensors header has (3 levels)");
  BOOST_TEST(header_error(std::string(1000, '[') + std::string(1000, ']')) ==
             "safetensors: header: JSON nests containers deeper than a safetensors header has (3 levels)");
}

BOOST_AUTO_TEST_CASE(rejects_duplicate_keys_at_every_level) {
  BOOST_TEST(header_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                          2) == "safetensors: header: duplicate key \"a\"");
  BOOST_TEST(header_error(R"({"a":{"dtype":"U8","shape":[1],"dtype":"U8","data_offsets":[0,1]}})", 1) ==
             "safetensors: tensor \"a\": duplicate field \"dtype\"");
  BOOST_TEST(header_error(R"({"__metadata__":{"k":"1","k":"2"}})") ==
             "safetensors: header: duplicate metadata key \"k\"");
  BOOST_TEST(header_error(R"({"__metadata__":{},"__metadata__":{}})") ==
             "safetensors: header: duplicate key \"__metadata__\"");
  // Equal after unescaping is a duplicate too.
  BOOST_TEST(header_error(R"({"__metadata__":{"k":"1","\u006b":"2"}})") ==
             "safetensors: header: duplicate metadata key \"k\"");
}

BOOST_AUTO_TEST_CASE(rejects_malformed_tensor_entries) {
  auto entry = [](std::string_view body, std::size_t data = 0) {
    return header_error("{\"t\":" + std::string(body) + "}", data);
  };
  std::string const p = "safetensors: tensor \"t\": ";
  BOOST_TEST(entry("[1]") == p + "entry is an array, not an object");
  BOOST_TEST(entry("\"x\"") == p + "entry is a string, not an object");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1})", 1) == p + "unknown field \"extra\"");
  BOOST_TEST(entry(R"({"shape":[1],"data_offsets":[0,1]})", 1) == p + "missing field \"dtype\"");
  BOOST_TEST(entry(R"({"dtype":"U8","data_offsets":[0,1]})", 1) == p + "missing field \"shape\"");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1]})", 1) == p + "missing field \"data_offsets\"");
  BOOST_TEST(entry(R"({"dtype":3,"shape":[1],"data_offsets":[0,1]})", 1) ==
             p + "\"dtype\" is the number 3, not a string");
  BOOST_TEST(entry(R"({"dtype":"Q7","shape":[1],"data_offsets":[0,1]})", 1) == p + "unknown dtype \"Q7\"");
  BOOST_TEST(entry(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})", 4) == p + "unknown dtype \"f32\"");
  BOOST_TEST(entry(R"({"dtype":"I32","shape":[1],"data_offsets":[0,4]})", 4) ==
             p + "dtype \"I32\" is not supported (supported: F64, I64, F32, BF16, F16, U8)");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":{},"data_offsets":[0,1]})", 1) ==
             p + "\"shape\" is an object, not an array");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1,-1],"data_offsets":[0,1]})", 1) ==
             p + "shape[1] is the number -1, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1.5],"data_offsets":[0,1]})", 1) ==
             p + "shape[0] is the number 1.5, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1.0],"data_offsets":[0,1]})", 1) ==
             p + "shape[0] is the number 1.0, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":["1"],"data_offsets":[0,1]})", 1) ==
             p + "shape[0] is a string, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[true],"data_offsets":[0,1]})", 1) ==
             p + "shape[0] is true, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]})", 1) ==
             p + "shape[0] is the number 1.8446744073709552e+19, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]})", 1) ==
             p + "shape [4294967296, 4294967296] has more than 2^64 - 1 elements");
  BOOST_TEST(entry(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,1]})", 1) ==
             p + "F32 [4611686018427387904] needs more than 2^64 - 1 bytes");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1],"data_offsets":"0,1"})", 1) ==
             p + "\"data_offsets\" is a string, not [begin, end]");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", 1) ==
             p + "\"data_offsets\" is an array of 1, not [begin, end]");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})", 1) ==
             p + "\"data_offsets\" is an array of 3, not [begin, end]");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,-1]})", 1) ==
             p + "data_offsets[1] is the number -1, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[null,1]})", 1) ==
             p + "data_offsets[0] is null, not a non-negative integer");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[0],"data_offsets":[8,4]})", 8) ==
             p + "data_offsets [8, 4] end before they begin");
  BOOST_TEST(entry(R"({"dtype":"U8","shape":[16],"data_offsets":[0,16]})", 12) ==
             p + "data_offsets [0, 16] end past the data section, which holds 12 bytes");
  BOOST_TEST(header_error(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1) ==
             "safetensors: header: a tensor has an empty name");
}

BOOST_AUTO_TEST_CASE(rejects_byte_counts_that_do_not_match_dtype_and_shape) {
  BOOST_TEST(header_error(R"({"exp_avg.3":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 12) ==
             "safetensors: tensor \"exp_avg.3\": data_offsets [0, 12] hold 12 bytes but F32 [4] needs 16");
  BOOST_TEST(header_error(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,0]}})") ==
             "safetensors: tensor \"s\": data_offsets [0, 0] hold 0 bytes but F64 [] needs 8");
  BOOST_TEST(header_error(R"({"e":{"dtype":"BF16","shape":[3,0],"data_offsets":[0,2]}})", 2) ==
             "safetensors: tensor \"e\": data_offsets [0, 2] hold 2 bytes but BF16 [3, 0] needs 0");
}

BOOST_AUTO_TEST_CASE(rejects_ranges_that_do_not_tile_the_data_section) {
  std::string const a04 = R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  BOOST_TEST(header_error("{" + a04 + R"(,"b":{"dtype":"U8","shape":[8],"data_offsets":[2,10]}})", 10) ==
             "safetensors: tensor \"b\": data_offsets [2, 10] overlap tensor \"a\" at [0, 4]");
  BOOST_TEST(header_error("{" + a04 + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4) ==
             "safetensors: tensor \"b\": data_offsets [0, 4] overlap tensor \"a\" at [0, 4]");
  BOOST_TEST(header_error("{" + a04 + R"(,"b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})", 4) ==
             "safetensors: tensor \"b\": data_offsets [2, 2] overlap tensor \"a\" at [0, 4]");
  BOOST_TEST(header_error("{" + a04 + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})", 12) ==
             "safetensors: tensor \"b\": data_offsets [8, 12] leave bytes [4, 8) unused after tensor "
             "\"a\"; the tensors must tile the data section");
  BOOST_TEST(header_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8) ==
             "safetensors: tensor \"a\": data_offsets [4, 8] leave bytes [0, 4) unused at the start "
             "of the data section; the tensors must tile the data section");
  BOOST_TEST(header_error("{" + a04 + "}", 6) ==
             "safetensors: header: the tensors cover 4 bytes but the data section holds 6 (2 trailing bytes)");
  BOOST_TEST(header_error("{}", 3) ==
             "safetensors: header: the tensors cover 0 bytes but the data section holds 3 (3 trailing bytes)");
}

BOOST_AUTO_TEST_CASE(rejects_bad_metadata) {
  BOOST_TEST(header_error(R"({"__metadata__":{"k":1}})") ==
             "safetensors: header: metadata \"k\" is the number 1, not a string");
  BOOST_TEST(header_error(R"({"__metadata__":{"k":["v"]}})") ==
             "safetensors: header: metadata \"k\" is an array, not a string");
  BOOST_TEST(header_error(R"({"__metadata__":["k"]})") ==
             "safetensors: header: \"__metadata__\" is an array, not an object of strings");
  BOOST_TEST(header_error(R"({"__metadata__":"k"})") ==
             "safetensors: header: \"__metadata__\" is a string, not an object of strings");
  BOOST_TEST(header_error(R"({"__metadata__":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1) ==
             "safetensors: header: \"__metadata__\" is reserved for the metadata and cannot name a tensor");
}

BOOST_AUTO_TEST_CASE(messages_quote_names_safely) {
  std::string const long_name(200, 'x');
  BOOST_TEST(header_error("{\"" + long_name + "\":[]}") ==
             "safetensors: tensor \"" + std::string(80, 'x') + "\"...: entry is an array, not an object");
  BOOST_TEST(header_error(R"({"a\"b\n\u0001":[]})") ==
             "safetensors: tensor \"a\\\"b\\x0a\\x01\": entry is an array, not an object");
}

BOOST_AUTO_TEST_CASE(every_prefix_of_a_valid_file_is_rejected_cleanly) {
  auto const file = small_valid_file();
  auto const n = io::safetensors_view::parse(file).header_size();
  for (std::size_t k = 0; k < file.size(); ++k) {
    bytes const prefix(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(k));
    std::string const msg = parse_error(prefix);
    BOOST_TEST_CONTEXT("prefix of " << k << " bytes") {
      if (k < 8) {
        BOOST_TEST(msg.find("shorter than the 8-byte header length") != std::string::npos, msg);
      } else if (k < 8 + n) {
        BOOST_TEST(msg.find("runs past the end of the file") != std::string::npos, msg);
      } else {
        BOOST_TEST(msg.find("end past the data section") != std::string::npos, msg);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(flipped_header_bytes_are_rejected_or_parse_consistently) {
  auto const file = small_valid_file();
  auto const n = io::safetensors_view::parse(file).header_size();
  std::size_t rejected = 0;
  std::size_t accepted = 0;
  for (std::size_t i = 0; i < 8 + n; ++i) {
    for (unsigned mask : {0x01u, 0x02u, 0x20u, 0x80u, 0xFFu}) {
      bytes f = file;
      f[i] ^= static_cast<std::byte>(mask);
      try {
        auto const v = io::safetensors_view::parse(f);
        check_consistent(v, f);
        ++accepted;
      } catch (io::format_error const& e) {
        BOOST_TEST(std::string_view(e.what()).starts_with("safetensors: "));
        ++rejected;
      }
    }
  }
  BOOST_TEST_MESSAGE("header flips: " << rejected << " rejected, " << accepted << " accepted");
  BOOST_TEST(rejected > 10 * accepted); // a few flips only touch padding or a letter of a name
  // Data bytes are not validated: a flip there parses and shows up in the tensor.
  for (std::size_t i = 8 + n; i < file.size(); ++i) {
    bytes f = file;
    f[i] ^= std::byte{0x5A};
    auto const v = io::safetensors_view::parse(f);
    check_consistent(v, f);
  }
}

BOOST_AUTO_TEST_CASE(oversized_header_is_rejected_before_it_is_read) {
  // A length near the limit with a short file: rejected without reading or allocating N bytes.
  auto f = length_field(99'999'999);
  f.resize(64, std::byte{'{'});
  BOOST_TEST(parse_error(f).find("runs past the end of the file") != std::string::npos);
  // A real header just over a small limit, and a large one within the default limit.
  std::string big = "{\"__metadata__\":{\"pad\":\"" + std::string(1 << 20, 'p') + "\"}}";
  auto const bf = make_file(big);
  BOOST_TEST(parse_error(bf, io::read_options{1 << 20}) ==
             "safetensors: header: length " + std::to_string(big.size()) + " exceeds the limit of 1048576 bytes");
  BOOST_TEST(io::safetensors_view::parse(bf).metadata().at("pad").size() == std::size_t{1} << 20);
}

BOOST_AUTO_TEST_CASE(open_maps_or_reads_a_file) {
  scratch_dir dir;
  auto const file = small_valid_file();
  write_file(dir / "ok.safetensors", file);
  for (auto mode : {io::load_mode::mmap, io::load_mode::read}) {
    auto f = io::safetensors_file::open(dir / "ok.safetensors", with_mode(mode));
    check_consistent(f.view(), f.view().bytes());
    BOOST_TEST(f.total_size() == file.size());
    BOOST_TEST(f.metadata().at("format") == "pt");
    BOOST_TEST(to_string(f.at("u").bytes) == "\x07\x08");
    // Moving the file object keeps the views it handed out valid.
    auto const* before = f.at("w.a").bytes.data();
    auto moved = std::move(f);
    BOOST_TEST((moved.at("w.a").bytes.data() == before));
    BOOST_TEST(moved.path() == dir / "ok.safetensors");
  }
}

BOOST_AUTO_TEST_CASE(open_reports_the_path_and_the_failing_call) {
  scratch_dir dir;
  auto const missing = dir / "missing.safetensors";
  try {
    (void)io::safetensors_file::open(missing);
    BOOST_FAIL("no exception");
  } catch (io::io_error const& e) {
    BOOST_TEST(std::string(e.what()) == "safetensors: open(\"" + missing.string() + "\"): No such file or directory");
    BOOST_TEST(e.call() == "open");
    BOOST_TEST(e.code() == ENOENT);
    BOOST_TEST(e.path() == missing);
  }
  BOOST_TEST(thrown_message<pipeswap::invalid_argument>([&] { (void)io::safetensors_file::open(dir.path()); }) ==
             "safetensors: \"" + dir.path().string() + "\" is not a regular file");

  auto file = small_valid_file();
  file.pop_back();
  write_file(dir / "short.safetensors", file);
  write_file(dir / "empty.safetensors", {});
  for (auto mode : {io::load_mode::mmap, io::load_mode::read}) {
    BOOST_TEST(thrown_message<io::format_error>([&] {
                 (void)io::safetensors_file::open(dir / "short.safetensors", with_mode(mode));
               }).starts_with("safetensors: " + (dir / "short.safetensors").string() + ": tensor \""));
    BOOST_TEST(thrown_message<io::format_error>([&] {
                 (void)io::safetensors_file::open(dir / "empty.safetensors", with_mode(mode));
               }) == "safetensors: " + (dir / "empty.safetensors").string() +
                         ": header: file is 0 bytes, shorter than the 8-byte header length");
  }
  // Lookup failures on a file name it too.
  auto const ok = small_valid_file();
  write_file(dir / "ok.safetensors", ok);
  auto const f = io::safetensors_file::open(dir / "ok.safetensors");
  BOOST_TEST(thrown_message<pipeswap::invalid_argument>([&] { (void)f.at("nope"); }) ==
             "safetensors: " + (dir / "ok.safetensors").string() + ": no tensor \"nope\"");
}

BOOST_AUTO_TEST_SUITE_END() // io_safetensors_read
