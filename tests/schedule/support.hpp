// Helpers shared by the schedule tests.
#pragma once

#include <boost/test/unit_test.hpp>

#include <string_view>

#include <pipeswap/error.hpp>

namespace schedule_test {

/// Runs `f`, which must throw pipeswap::invalid_argument with exactly `message`.
template <class F>
void expect_error(F&& f, std::string_view message) {
  try {
    f();
    BOOST_ERROR("no exception; expected: " << message);
  } catch (pipeswap::invalid_argument const& e) {
    BOOST_TEST(std::string_view(e.what()) == message);
  }
}

} // namespace schedule_test
