// pipeswap tests — checks that a call fails with a step_error nesting the expected exception.
#pragma once

#include <boost/test/unit_test.hpp>

#include <exception>
#include <string>

#include <pipeswap/swap/optimizer_swap.hpp>

namespace pipeswap::test {

/// f() throws a step_error whose nested exception is an E; returns the step_error's message.
template <class E, class F>
std::string throws_step_error(F f) {
  try {
    f();
  } catch (pipeswap::step_error const& e) {
    try {
      std::rethrow_if_nested(e);
      BOOST_ERROR("step_error without a nested exception: " << e.what());
    } catch (E const&) {
    } catch (...) {
      BOOST_ERROR("step_error nests an unexpected exception: " << e.what());
    }
    return e.what();
  }
  BOOST_ERROR("no step_error thrown");
  return {};
}

} // namespace pipeswap::test
