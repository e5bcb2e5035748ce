// The backends a template test source runs on, chosen when the executable is built:
//
//   default                std::tuple<mock::backend, sync_host_backend>   (always runs)
//   -DPIPESWAP_TEST_CUDA   std::tuple<cuda::backend>                      (skips without a GPU)
//   -DPIPESWAP_TEST_TORCH       std::tuple<torch_cpu_backend>    (the torch backend on the CPU)
//   -DPIPESWAP_TEST_TORCH_CUDA  std::tuple<torch_cuda_backend>   (on CUDA; skips without a GPU)
//                          (python/meson.build builds both against torch, -Dtorch_backend_tests=true)
//
// test_backends (below) is the list the runtime suites run their bodies on, in every build.
//
// A test source written over backends_under_test is compiled once per list (tests/meson.build and
// tests/cuda/meson.build), so the same bodies run on the oracle, on a user-written backend and on
// the hardware, and the CUDA executable can skip as a whole. Usage:
//
//   #define BOOST_TEST_MODULE my_runtime
//   #include <boost/test/unit_test.hpp>
//   #include "support/backend_list.hpp"
//   using gate = pipeswap::test::skip_unless_available<pipeswap::test::backends_under_test>;
//   BOOST_TEST_GLOBAL_FIXTURE(gate);
//   BOOST_AUTO_TEST_CASE_TEMPLATE(my_case, B, pipeswap::test::backends_under_test) {
//     pipeswap::test::backend_fixture<B> f;  // f.b is the backend
//   }
#pragma once

#include <tuple>
#include <type_traits>

#include "support/backend_fixture.hpp"
#include "support/backends.hpp"
#include "support/threaded_backend.hpp"

#if defined(PIPESWAP_TEST_CUDA)
#  include "support/cuda_backend.hpp"
#elif defined(PIPESWAP_TEST_TORCH) || defined(PIPESWAP_TEST_TORCH_CUDA)
#  include "support/torch_backend.hpp"
#endif

namespace pipeswap::test {

#if defined(PIPESWAP_TEST_CUDA)
using backends_under_test = std::tuple<cuda::backend>;
#elif defined(PIPESWAP_TEST_TORCH_CUDA)
using backends_under_test = std::tuple<torch_cuda_backend>;
#elif defined(PIPESWAP_TEST_TORCH)
using backends_under_test = std::tuple<torch_cpu_backend>;
#else
using backends_under_test = std::tuple<mock::backend, sync_host_backend>;
#endif

/// The backends the runtime suites run their bodies on (BOOST_AUTO_TEST_CASE_TEMPLATE over it): the
/// mock, the oracle with hazards, simulated time and faults, and the threaded backend, whose streams
/// are real threads with random delays (support/threaded_backend.hpp). What only the mock can show
/// sits behind `if constexpr (is_mock<B>)`. Which suites use it: docs/backend.md, "Which tests run on
/// which backend".
#if defined(PIPESWAP_TEST_CUDA)
// The CUDA programs (tests/cuda/meson.build) run the same bodies on the device, each program
// filtered to its CUDA cases; without a GPU they skip.
using test_backends = std::tuple<cuda::backend>;
#elif defined(PIPESWAP_TEST_MOCK_ONLY)
// The mutated builds (support/hazard_checks_fire.py) prove the mock's hazard checks can fire, once
// per wait site: the threaded bodies would only add run time there.
using test_backends = std::tuple<mock::backend>;
#else
using test_backends = std::tuple<mock::backend, threaded_backend>;
#endif

template <class B>
inline constexpr bool is_mock = std::is_same_v<B, mock::backend>;

/// The options a runtime test makes its backend with: the mock records hazards (so that
/// PIPESWAP_CHECK_NO_HAZARDS can fail, support/no_hazards.hpp) on unit time; the threaded backend
/// has its default jitter; CUDA's is the test device.
template <class B>
auto options_for() {
  if constexpr (is_mock<B>) {
    mock::options o{mock::timing_model::unit()};
    o.hazards = mock::hazard_policy::record;
    return o;
#if defined(PIPESWAP_TEST_CUDA)
  } else if constexpr (std::is_same_v<B, cuda::backend>) {
    return cuda_test_device(); // a CUDA backend is made from its device number
#endif
  } else {
    return threaded_backend_options{};
  }
}

} // namespace pipeswap::test
