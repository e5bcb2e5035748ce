// The one Boost.Test main of each test executable: a directory's test files are linked into one
// program, each file's cases in a suite named after its `meson test` entry (--run_test=NAME).
#define BOOST_TEST_MODULE pipeswap
#include <boost/test/unit_test.hpp>
