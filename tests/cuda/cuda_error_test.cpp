// The CUDA backend's error machinery and handle types, checked without a device: cuda_error's
// fields and message, PIPESWAP_CUDA_TRY / _WHAT / _LOG, stream_ref and event value semantics, and
// the constructor of a backend that cannot open its device. Runs (does not skip) on machines
// without a GPU: none of these needs one.
#define BOOST_TEST_MODULE cuda_errors
#include <boost/test/unit_test.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include <pipeswap/backend/cuda.hpp>

namespace cuda = pipeswap::cuda;

int odr_second_tu(); // odr_second.cpp: the headers included in a second translation unit

namespace {

int evaluated = 0;

cudaError_t returns(cudaError_t s) { return s; }

std::string counted_context() {
  ++evaluated;
  return "context";
}

void try_failing(cudaError_t s) { PIPESWAP_CUDA_TRY(returns(s)); }

} // namespace

// Compile-time properties of the handles and the backend.
static_assert(std::is_base_of_v<pipeswap::error, cuda::cuda_error>);
static_assert(std::is_nothrow_copy_constructible_v<cuda::cuda_error>);
static_assert(std::is_nothrow_destructible_v<cuda::backend>);
static_assert(std::is_nothrow_destructible_v<cuda::stream>);
static_assert(std::is_nothrow_destructible_v<cuda::event>);
static_assert(std::is_nothrow_destructible_v<cuda::event_pool>);
static_assert(std::is_nothrow_destructible_v<cuda::memory_pool>);
static_assert(std::is_nothrow_destructible_v<cuda::device_guard>);
static_assert(!std::is_copy_constructible_v<cuda::stream>);
static_assert(std::is_nothrow_move_constructible_v<cuda::stream>);
static_assert(std::is_nothrow_move_assignable_v<cuda::stream>);
static_assert(std::is_convertible_v<cuda::stream const&, cuda::stream_ref>);
static_assert(std::regular<cuda::event>); // copies name the same point
static_assert(std::copyable<cuda::stream_ref> && std::equality_comparable<cuda::stream_ref>);
static_assert(std::is_convertible_v<cudaStream_t, cuda::stream_ref>);
static_assert(!std::is_constructible_v<cuda::stream_ref, int>, "0 is not a stream: say which");
static_assert(!std::is_constructible_v<cuda::stream_ref, std::nullptr_t>);
static_assert(!std::is_copy_constructible_v<cuda::backend>);
static_assert(!std::is_move_constructible_v<cuda::backend>);
static_assert(pipeswap::backend<cuda::backend>);
static_assert(pipeswap::labelled_backend<cuda::backend>);
static_assert(std::same_as<pipeswap::backend_error_t<cuda::backend>, cuda::cuda_error>);

BOOST_AUTO_TEST_CASE(cuda_error_carries_status_call_and_location) {
  auto const line = std::source_location::current().line() + 1;
  cuda::cuda_error const e(cudaErrorInvalidValue, "cudaFoo(a, b)", "pipeswap::cuda::thing(3)");
  BOOST_TEST(e.status() == cudaErrorInvalidValue);
  BOOST_TEST(e.call() == "cudaFoo(a, b)");
  BOOST_TEST(e.where().line() == line);
  std::string const what = e.what();
  BOOST_TEST(what.starts_with("pipeswap::cuda::thing(3): cudaFoo(a, b) failed: cudaErrorInvalidValue: "));
  BOOST_TEST(what.find("cuda_error_test.cpp:" + std::to_string(line)) != std::string::npos);

  cuda::cuda_error const bare(cudaErrorMemoryAllocation, "cudaBar()", "");
  BOOST_TEST(bare.call() == "cudaBar()");
  BOOST_TEST(std::string(bare.what()).starts_with("cudaBar() failed: cudaErrorMemoryAllocation: "));

  cuda::cuda_error const copy = e; // shares the text
  BOOST_TEST(copy.call() == "cudaFoo(a, b)");
}

BOOST_AUTO_TEST_CASE(try_throws_naming_the_call_and_its_line) {
  BOOST_CHECK_NO_THROW(try_failing(cudaSuccess));
  try {
    try_failing(cudaErrorInvalidValue);
    BOOST_FAIL("no exception");
  } catch (cuda::cuda_error const& e) {
    BOOST_TEST(e.status() == cudaErrorInvalidValue);
    BOOST_TEST(e.call() == "returns(s)");
    BOOST_TEST(std::string_view(e.where().function_name()).find("try_failing") != std::string_view::npos);
  }
  // Caught as the library's base and as std::exception too.
  BOOST_CHECK_THROW(try_failing(cudaErrorNotSupported), pipeswap::error);
  BOOST_CHECK_THROW(try_failing(cudaErrorNotSupported), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(try_what_builds_its_context_only_on_failure) {
  evaluated = 0;
  PIPESWAP_CUDA_TRY_WHAT(returns(cudaSuccess), counted_context());
  BOOST_TEST(evaluated == 0);
  try {
    PIPESWAP_CUDA_TRY_WHAT(returns(cudaErrorInvalidValue), counted_context());
    BOOST_FAIL("no exception");
  } catch (cuda::cuda_error const& e) {
    BOOST_TEST(evaluated == 1);
    BOOST_TEST(std::string(e.what()).starts_with("context: returns(cudaErrorInvalidValue) failed"));
  }
}

BOOST_AUTO_TEST_CASE(log_never_throws_and_counts) {
  auto const before = cuda::logged_error_count();
  cudaError_t s = cudaSuccess;
  BOOST_CHECK_NO_THROW(s = PIPESWAP_CUDA_LOG(returns(cudaErrorInvalidValue)));
  BOOST_TEST(s == cudaErrorInvalidValue);
  BOOST_TEST(cuda::logged_error_count() == before + 1);
  BOOST_TEST(PIPESWAP_CUDA_LOG(returns(cudaSuccess)) == cudaSuccess);
  // Teardown at process exit is not worth a line per handle.
  BOOST_TEST(PIPESWAP_CUDA_LOG(returns(cudaErrorCudartUnloading)) == cudaErrorCudartUnloading);
  BOOST_TEST(cuda::logged_error_count() == before + 1);
  static_assert(noexcept(cuda::detail::log_failure(cudaSuccess, "", std::source_location::current())));
}

BOOST_AUTO_TEST_CASE(stream_refs_are_values) {
  cuda::stream_ref const legacy = cuda::legacy_stream();
  cuda::stream_ref const per_thread = cuda::per_thread_stream();
  BOOST_TEST((legacy == cuda::legacy_stream()));
  BOOST_TEST((legacy != per_thread));
  BOOST_TEST((legacy == cudaStreamLegacy)); // compares with the raw handle
  BOOST_TEST(legacy.is_implicit());
  BOOST_TEST(per_thread.is_implicit());
  BOOST_TEST(cuda::stream_ref(cudaStream_t{}).is_implicit());
  auto* fake = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1000});
  BOOST_TEST(!cuda::stream_ref(fake).is_implicit());
  BOOST_TEST((cuda::stream_ref(fake).get() == fake));
}

BOOST_AUTO_TEST_CASE(unrecorded_events_are_not_waitable) {
  cuda::event const e;
  BOOST_TEST(!e.recorded());
  BOOST_TEST((e.get() == nullptr));
  BOOST_TEST((e == cuda::event{}));
  try {
    e.sync();
    BOOST_FAIL("no exception");
  } catch (cuda::cuda_error const& err) {
    BOOST_TEST(err.status() == cudaErrorInvalidResourceHandle);
    BOOST_TEST(err.call() == "cudaEventSynchronize(an event that was never recorded)");
  }
  BOOST_CHECK_THROW((void)e.is_done(), cuda::cuda_error);
}

BOOST_AUTO_TEST_CASE(a_device_that_does_not_exist_is_an_error) {
  // Without a driver the constructor fails on its first call; with one, cudaSetDevice rejects the
  // ordinal. Either way a cuda_error naming the device.
  int const n = cuda::device_count();
  BOOST_TEST(n >= 0);
  for (int const bad : {n, -1}) {
    try {
      cuda::backend b(bad);
      BOOST_FAIL("no exception for device " << bad);
    } catch (cuda::cuda_error const& e) {
      BOOST_TEST_MESSAGE(e.what());
      BOOST_TEST(std::string(e.what()).starts_with("pipeswap::cuda::backend(device " + std::to_string(bad) + "): "));
      if (n > 0) {
        BOOST_TEST(e.status() == cudaErrorInvalidDevice);
        BOOST_TEST(e.call() == "cudaSetDevice(device)");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(headers_link_from_two_translation_units) { BOOST_TEST(odr_second_tu() == 0); }
