// Linked into a test program built with PIPESWAP_MUTATION_TESTING: PIPESWAP_MUTATE_SITE=NAME (a
// wait_site, core/detail/mutation.hpp) switches that ordering point off for the whole run, so
// tests/support/hazard_checks_fire.py can show that the program's hazard checks fire.
#ifndef PIPESWAP_MUTATION_TESTING
#  error "mutate_from_env.cpp belongs to a program built with PIPESWAP_MUTATION_TESTING"
#endif
#include <cstdlib>
#include <iostream>
#include <string_view>

#include <boost/test/unit_test.hpp>

#include <pipeswap/core/detail/mutation.hpp>

namespace {

struct mutate_from_env {
  mutate_from_env() {
    char const* name = std::getenv("PIPESWAP_MUTATE_SITE");
    if (name == nullptr || *name == '\0') return;
    namespace d = pipeswap::detail;
    for (unsigned i = 0; i < static_cast<unsigned>(d::wait_site::count); ++i) {
      if (d::to_string(static_cast<d::wait_site>(i)) == std::string_view(name)) {
        d::mutated_sites = 1u << i;
        std::cerr << "mutation: the waits at " << name << " are skipped\n";
        return;
      }
    }
    std::cerr << "PIPESWAP_MUTATE_SITE=" << name << " names no wait site\n";
    std::exit(2);
  }
};

} // namespace

BOOST_TEST_GLOBAL_FIXTURE(mutate_from_env);
