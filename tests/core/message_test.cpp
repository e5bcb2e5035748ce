// detail::message, how the runtime's headers compose error messages: the same text as the
// std::string and std::to_string chain it replaces, for text of every kind, every integer type
// (their extremes included) and an empty list; append() extends a string in place.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <pipeswap/detail/message.hpp>

using pipeswap::detail::append;
using pipeswap::detail::message;

BOOST_AUTO_TEST_SUITE(core_message)

BOOST_AUTO_TEST_CASE(text_and_numbers_read_as_the_operator_chain_would) {
  std::string const name = "exp_avg";
  std::string_view const view = "bf16";
  std::size_t const k = 3;
  BOOST_TEST(message({"adam::update: batch range ", k, " of ", name, "/", view, " failed"}) ==
             "adam::update: batch range " + std::to_string(k) + " of " + name + "/" + std::string(view) + " failed");
  BOOST_TEST(message({}) == "");
  BOOST_TEST(message({""}) == "");
  BOOST_TEST(message({std::size_t{0}}) == "0");
}

BOOST_AUTO_TEST_CASE(every_integer_type_prints_as_to_string) {
  BOOST_TEST(message({std::numeric_limits<std::uint64_t>::max()}) ==
             std::to_string(std::numeric_limits<std::uint64_t>::max()));
  BOOST_TEST(message({std::numeric_limits<std::int64_t>::min()}) ==
             std::to_string(std::numeric_limits<std::int64_t>::min()));
  BOOST_TEST(message({std::numeric_limits<std::int64_t>::max()}) ==
             std::to_string(std::numeric_limits<std::int64_t>::max()));
  BOOST_TEST(message({-1}) == "-1");
  BOOST_TEST(message({std::int64_t{-42}, " ", 7u, " ", std::uint8_t{255}, " ", std::int16_t{-300}}) ==
             "-42 7 255 -300");
  BOOST_TEST(message({std::numeric_limits<int>::min()}) == std::to_string(std::numeric_limits<int>::min()));
}

BOOST_AUTO_TEST_CASE(append_extends_in_place) {
  std::string s = "got [";
  for (int i = 0; i < 3; ++i) append(s, {i ? ", '" : "'", i, "'"});
  s += "]";
  BOOST_TEST(s == "got ['0', '1', '2']");
}

BOOST_AUTO_TEST_SUITE_END()
