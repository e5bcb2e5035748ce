// The one way a test asserts that a run left no hazard: PIPESWAP_CHECK_NO_HAZARDS(b).
//
// Such a check can only fail if the mock records hazards: under the default hazard_policy::raise the
// first hazard throws, the test fails there, and an empty hazards() at the end says nothing. So the
// check fails first if `b` does not record (hazard_policy::record). On a hazard it prints the first
// report and a line `hazard check fired at FILE:LINE`, which tests/support/hazard_checks_fire.py
// collects when it runs a program with one ordering point removed (PIPESWAP_MUTATION_TESTING,
// tests/support/mutate_from_env.cpp) to show that every check in it fires. On a backend without a
// hazard checker the check is a no-op.
#pragma once

#include <iostream>

#include <boost/test/unit_test.hpp>

#include <pipeswap/backend/mock.hpp>

namespace pipeswap::test {

template <class B>
void check_no_hazards(B const& b, char const* file, int line) {
  if constexpr (requires { b.hazards(); }) {
    BOOST_TEST((b.config().hazards == mock::hazard_policy::record),
               "the hazard check at " << file << ":" << line
                                      << " cannot fail: its mock throws on a hazard instead of recording it");
    BOOST_TEST(b.hazards().empty(), "hazards at " << file << ":" << line);
    if (!b.hazards().empty()) {
      std::cerr << "hazard check fired at " << file << ":" << line << "\n" << b.hazards().front().message << "\n";
    }
  }
}

} // namespace pipeswap::test

#define PIPESWAP_CHECK_NO_HAZARDS(b) ::pipeswap::test::check_no_hazards((b), __FILE__, __LINE__)
