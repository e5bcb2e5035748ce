// The CUDA backend on a device: what the shared rule tests (backend/backend_rules_test.cpp) cannot
// say through the concept alone — copy overlap, event pooling and lifetime, pool reuse, pinned and
// registered memory, NUMA placement, error paths, the engine's own stream, and destruction with
// work in flight. Exits 77 (SKIP) without a device.
#define BOOST_TEST_MODULE cuda_backend
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <pipeswap/backend/cuda.hpp>

#include "support/backend_fixture.hpp"
#include "support/cuda_backend.hpp"

namespace cuda = pipeswap::cuda;
using pipeswap::device_ptr;
using pipeswap::test::fill_pattern;
using pipeswap::test::first_mismatch;

using gate = pipeswap::test::skip_unless_available<std::tuple<cuda::backend>>;
BOOST_TEST_GLOBAL_FIXTURE(gate);

namespace {

int device() { return pipeswap::test::cuda_test_device(); }

/// Uploads pattern `seed` through `n` bytes of device memory and back on `s`; true when it
/// survives.
bool round_trip(cuda::backend& b, cuda::stream_ref s, std::size_t n, std::uint32_t seed) {
  std::byte* src = b.allocate_host(n);
  std::byte* dst = b.allocate_host(n);
  fill_pattern(src, n, seed);
  std::memset(dst, 0, n);
  device_ptr d = b.allocate_device(n, s);
  b.copy_h2d(d, src, n, s);
  b.copy_d2h(dst, d, n, s);
  b.deallocate_device(d, n, s);
  b.synchronize(b.record_event(s));
  bool const ok = first_mismatch(dst, n, seed) == n;
  b.deallocate_host(src, n);
  b.deallocate_host(dst, n);
  return ok;
}

bool contains(std::string const& text, std::string const& part) { return text.find(part) != std::string::npos; }

} // namespace

BOOST_AUTO_TEST_CASE(round_trips_on_every_kind_of_stream) {
  cuda::backend b(device());
  cuda::stream_ref const own = b.new_stream();
  std::uint32_t seed = 0;
  for (std::size_t const n : {std::size_t{1}, std::size_t{4097}, (std::size_t{64} << 20) + 13}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      BOOST_TEST(round_trip(b, b.current_stream(), n, ++seed)); // the legacy default stream
      BOOST_TEST(round_trip(b, own, n, ++seed));
      BOOST_TEST(round_trip(b, cuda::per_thread_stream(), n, ++seed));
    }
  }
}

BOOST_AUTO_TEST_CASE(new_streams_are_non_blocking_with_the_configured_priority) {
  int least = 0;
  int greatest = 0;
  {
    cuda::device_guard const g(device());
    PIPESWAP_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  }
  cuda::backend_options o;
  o.stream_priority = greatest;
  cuda::backend b(device(), o);
  cuda::stream_ref const s = b.new_stream();
  unsigned flags = 0;
  PIPESWAP_CUDA_TRY(cudaStreamGetFlags(s.get(), &flags));
  BOOST_TEST((flags & cudaStreamNonBlocking) != 0U);
  int priority = 0;
  PIPESWAP_CUDA_TRY(cudaStreamGetPriority(s.get(), &priority));
  BOOST_TEST(priority == greatest);
  int on = -1;
  PIPESWAP_CUDA_TRY(cudaStreamGetDevice(s.get(), &on));
  BOOST_TEST(on == device());
}

BOOST_AUTO_TEST_CASE(the_engine_passes_its_own_stream_without_ownership) {
  cudaStream_t engine = nullptr;
  {
    cuda::device_guard const g(device());
    PIPESWAP_CUDA_TRY(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking));
  }
  {
    cuda::backend b(device());
    BOOST_TEST((b.current_stream() == cuda::legacy_stream()));
    b.set_current_stream(engine);
    BOOST_TEST((b.current_stream() == engine));
    BOOST_TEST(round_trip(b, b.current_stream(), 1 << 20, 5));
  } // the backend is gone; the engine's stream is not
  BOOST_TEST(cudaStreamQuery(engine) == cudaSuccess);
  PIPESWAP_CUDA_TRY(cudaStreamDestroy(engine));
}

// H2D and D2H use separate copy engines: together they take clearly less than one after the other.
// The bound is loose (85% of the serial time); the numbers are reported either way.
BOOST_AUTO_TEST_CASE(copies_in_opposite_directions_overlap) {
  cuda::backend b(device());
  std::size_t const n = std::size_t{256} << 20;
  std::byte* up_src = b.allocate_host(n);
  std::byte* down_dst = b.allocate_host(n);
  std::memset(up_src, 1, n);
  std::memset(down_dst, 0, n);
  cuda::stream_ref const s_up = b.new_stream();
  cuda::stream_ref const s_down = b.new_stream();
  device_ptr const d_up = b.allocate_device(n, s_up);
  device_ptr const d_down = b.allocate_device(n, s_down);
  b.synchronize_device();

  auto best_of = [&](auto&& enqueue) {
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) { // the first run warms up; the minimum filters noise
      auto const t0 = std::chrono::steady_clock::now();
      enqueue();
      b.synchronize_device();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  double const h2d = best_of([&] { b.copy_h2d(d_up, up_src, n, s_up); });
  double const d2h = best_of([&] { b.copy_d2h(down_dst, d_down, n, s_down); });
  double const both = best_of([&] {
    b.copy_h2d(d_up, up_src, n, s_up);
    b.copy_d2h(down_dst, d_down, n, s_down);
  });
  auto gbps = [n](double s) { return static_cast<double>(n) / s / 1e9; };
  BOOST_TEST_MESSAGE("H2D " << gbps(h2d) << " GB/s, D2H " << gbps(d2h) << " GB/s, both at once " << both * 1e3
                            << " ms vs " << (h2d + d2h) * 1e3 << " ms one after the other");
  BOOST_TEST(both < 0.85 * (h2d + d2h));

  b.deallocate_device(d_up, n, s_up);
  b.deallocate_device(d_down, n, s_down);
  b.synchronize_device();
  b.deallocate_host(up_src, n);
  b.deallocate_host(down_dst, n);
}

BOOST_AUTO_TEST_CASE(native_events_are_pooled) {
  cuda::backend b(device());
  cuda::stream_ref const s = b.new_stream();
  for (int i = 0; i < 1000; ++i) {
    cuda::event const e = b.record_event(s); // dropped at once: its native event is reused
    b.wait_event(b.current_stream(), e);
  }
  BOOST_TEST(b.events().created() <= 2U);
  std::vector<cuda::event> held;
  for (int i = 0; i < 16; ++i) held.push_back(b.record_event(s));
  BOOST_TEST(b.events().created() >= 16U);
  for (std::size_t i = 1; i < held.size(); ++i) BOOST_TEST((held[i].get() != held[i - 1].get()));
  std::vector<cuda::event> copies = held; // copies hold the native events too
  held.clear();
  BOOST_TEST(b.events().idle() == b.events().created() - 16U);
  copies.clear();
  BOOST_TEST(b.events().idle() == b.events().created());
  b.synchronize_device();

  // Events are created without timing.
  cuda::event const e = b.record_event(s);
  e.sync();
  float ms = 0;
  cudaError_t const st = cudaEventElapsedTime(&ms, e.get(), e.get());
  (void)cudaGetLastError();
  BOOST_TEST(st == cudaErrorInvalidResourceHandle);
}

BOOST_AUTO_TEST_CASE(an_event_outlives_the_backend_that_recorded_it) {
  auto const logged = cuda::logged_error_count();
  cuda::backend outer(device()); // owns the pinned memory the inner backend's copy reads
  std::size_t const n = std::size_t{64} << 20;
  std::byte* h = outer.allocate_host(n);
  fill_pattern(h, n, 9);
  cuda::event survivor;
  {
    cuda::backend inner(device());
    cuda::stream_ref const s = inner.new_stream();
    device_ptr const d = inner.allocate_device(n, s);
    inner.copy_h2d(d, h, n, s);
    survivor = inner.record_event(s);
    inner.set_label("in flight");
    // `d` is never released and the copy may still run: destruction must cope, and not throw.
  }
  BOOST_TEST(survivor.recorded());
  BOOST_CHECK_NO_THROW(survivor.sync());
  BOOST_TEST(survivor.is_done());
  cuda::event const copy = survivor;
  outer.wait_event(outer.current_stream(), copy);
  outer.synchronize(outer.record_event(outer.current_stream()));
  outer.deallocate_host(h, n);
  BOOST_TEST(cuda::logged_error_count() == logged);
}

BOOST_AUTO_TEST_CASE(stream_ordered_release_reuses_memory) {
  cuda::backend b(device()); // dedicated pool, release threshold: keep everything
  cuda::memory_pool const& pool = b.device_pool();
  BOOST_TEST(pool.owning());
  BOOST_TEST(pool.release_threshold() == std::numeric_limits<std::uint64_t>::max());
  cuda::stream_ref const s = b.new_stream();
  std::size_t const n = std::size_t{64} << 20;

  device_ptr const d1 = b.allocate_device(n, s);
  auto const reserved = pool.reserved_bytes();
  BOOST_TEST(reserved >= n);
  b.deallocate_device(d1, n, s);
  device_ptr const d2 = b.allocate_device(n, s); // same stream: reuse is immediate
  BOOST_TEST(pool.reserved_bytes() == reserved);
  BOOST_TEST_MESSAGE("same-stream reuse " << (d1 == d2 ? "returned the same address" : "moved"));
  b.deallocate_device(d2, n, s);

  b.synchronize_device(); // a synchronization does not give the memory back to the driver
  BOOST_TEST(pool.used_bytes() == 0U);
  BOOST_TEST(pool.reserved_bytes() >= n);

  cuda::stream_ref const s2 = b.new_stream();
  device_ptr const d3 = b.allocate_device(n, s);
  auto const reserved3 = pool.reserved_bytes();
  b.deallocate_device(d3, n, s);
  b.wait_event(s2, b.record_event(s));
  device_ptr const d4 = b.allocate_device(n, s2); // another stream, ordered after the free
  BOOST_WARN(pool.reserved_bytes() == reserved3);
  BOOST_TEST_MESSAGE("cross-stream reuse after an event " << (d3 == d4 ? "returned the same address" : "moved"));
  b.deallocate_device(d4, n, s2);
  b.synchronize_device();

  b.trim_device_pool(0);
  BOOST_TEST(pool.reserved_bytes() == 0U);
}

BOOST_AUTO_TEST_CASE(a_borrowed_pool_is_used_and_left_alone) {
  cudaMemPool_t def = nullptr;
  PIPESWAP_CUDA_TRY(cudaDeviceGetDefaultMemPool(&def, device()));
  std::uint64_t before = 0;
  PIPESWAP_CUDA_TRY(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &before));
  {
    cuda::backend_options o;
    o.device_pool = def;
    cuda::backend b(device(), o);
    BOOST_TEST(!b.device_pool().owning());
    BOOST_TEST((b.device_pool().get() == def));
    BOOST_TEST(round_trip(b, b.new_stream(), 1 << 20, 17));
  }
  std::uint64_t after = 1;
  PIPESWAP_CUDA_TRY(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &after));
  BOOST_TEST(after == before);
}

BOOST_AUTO_TEST_CASE(pinned_memory_is_exact_and_page_locked) {
  cuda::backend b(device());
  BOOST_TEST(b.host_numa_node() == -1); // placement `any` is the default
  for (std::size_t const n : {std::size_t{1}, std::size_t{4097}, (std::size_t{3} << 20) + 1}) {
    std::byte* h = b.allocate_host(n);
    cudaPointerAttributes a{};
    PIPESWAP_CUDA_TRY(cudaPointerGetAttributes(&a, h));
    BOOST_TEST(a.type == cudaMemoryTypeHost);
    b.deallocate_host(h, n);
  }
}

BOOST_AUTO_TEST_CASE(registered_host_ranges_are_page_locked) {
  cuda::backend b(device());
  std::size_t const n = (std::size_t{1} << 20) + 3; // copied; the registration covers whole pages
  std::size_t const page = 4096;
  std::size_t const pages = (n + page - 1) / page * page;
  void* raw = std::aligned_alloc(page, pages);
  BOOST_REQUIRE(raw != nullptr);
  auto* h = static_cast<std::byte*>(raw);
  b.register_host(raw, pages);
  cudaPointerAttributes a{};
  PIPESWAP_CUDA_TRY(cudaPointerGetAttributes(&a, raw));
  BOOST_TEST(a.type == cudaMemoryTypeHost);

  fill_pattern(h, n, 31);
  cuda::stream_ref const s = b.new_stream();
  device_ptr const d = b.allocate_device(n, s);
  b.copy_h2d(d, h, n, s);
  b.synchronize(b.record_event(s));
  std::memset(h, 0, n);
  b.copy_d2h(h, d, n, s);
  b.deallocate_device(d, n, s);
  b.synchronize(b.record_event(s));
  BOOST_TEST(first_mismatch(h, n, 31) == n);

  BOOST_CHECK_THROW(b.register_host(raw, pages), cuda::cuda_error); // already registered
  BOOST_TEST(cudaGetLastError() == cudaSuccess);
  b.unregister_host(raw);
  BOOST_CHECK_THROW(b.unregister_host(raw), cuda::cuda_error); // no longer registered
  b.register_host(raw, 0);                                     // no-op
  b.unregister_host(nullptr);                                  // no-op
  std::free(raw);
}

BOOST_AUTO_TEST_CASE(host_memory_near_the_device) {
  int reported = -1;
  if (cudaDeviceGetAttribute(&reported, cudaDevAttrHostNumaId, device()) != cudaSuccess) {
    (void)cudaGetLastError();
    reported = -1;
  }
  cuda::backend_options o;
  o.host_memory = cuda::host_placement::near_device;
  cuda::backend b(device(), o);
  BOOST_TEST_MESSAGE("device reports host NUMA node " << reported << "; allocate_host places on "
                                                      << b.host_numa_node());
  BOOST_TEST((b.host_numa_node() == -1 || b.host_numa_node() == reported));
  std::uint32_t seed = 40;
  for (std::size_t const n : {std::size_t{1}, std::size_t{4097}, (std::size_t{8} << 20) + 5}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      BOOST_TEST(round_trip(b, b.new_stream(), n, ++seed));
      std::byte* h = b.allocate_host(n);
      cudaPointerAttributes a{};
      PIPESWAP_CUDA_TRY(cudaPointerGetAttributes(&a, h));
      BOOST_TEST(a.type != cudaMemoryTypeUnregistered);
      b.deallocate_host(h, n);
    }
  }
}

BOOST_AUTO_TEST_CASE(failed_calls_throw_clear_the_last_error_and_leave_the_backend_usable) {
  cuda::backend b(device());
  cuda::stream_ref const s = b.new_stream();
  std::size_t const n = 4096;
  std::byte* h = b.allocate_host(n);
  device_ptr const d = b.allocate_device(n, s);
  b.synchronize(b.record_event(s));
  std::string const who = "pipeswap::cuda::backend(device " + std::to_string(device()) + ")::";

  b.set_label("offload batch 3");
  try {
    b.copy_d2h(nullptr, d, n, s);
    BOOST_FAIL("copy to a null host pointer did not throw");
  } catch (cuda::cuda_error const& e) {
    BOOST_TEST_MESSAGE(e.what());
    BOOST_TEST(e.call().starts_with("cudaMemcpyAsync("));
    BOOST_WARN(e.status() == cudaErrorInvalidValue);
    BOOST_TEST(contains(e.what(), who + "copy_d2h(4096 bytes) during 'offload batch 3': "));
  }
  BOOST_TEST(cudaGetLastError() == cudaSuccess);
  BOOST_CHECK_THROW(b.copy_h2d(device_ptr{}, h, n, s), cuda::cuda_error);
  BOOST_TEST(cudaPeekAtLastError() == cudaSuccess);
  b.set_label("");

  try {
    (void)b.allocate_device(std::size_t{1} << 50, s);
    BOOST_FAIL("a 1 PiB allocation did not throw");
  } catch (cuda::cuda_error const& e) {
    BOOST_TEST_MESSAGE(e.what());
    BOOST_TEST(e.call().starts_with("cudaMallocFromPoolAsync("));
    BOOST_TEST(contains(e.what(), who + "allocate_device(1125899906842624 bytes): "));
  }
  BOOST_TEST(cudaGetLastError() == cudaSuccess);

  try {
    b.wait_event(s, cuda::event{});
    BOOST_FAIL("waiting on an unrecorded event did not throw");
  } catch (cuda::cuda_error const& e) {
    BOOST_TEST(e.status() == cudaErrorInvalidResourceHandle);
    BOOST_TEST(e.call() == "cudaStreamWaitEvent(an event that was never recorded)");
    BOOST_TEST(contains(e.what(), who + "wait_event: "));
  }
  BOOST_CHECK_THROW(b.synchronize(cuda::event{}), cuda::cuda_error);

  // Everything obtained before the failures still works.
  fill_pattern(h, n, 51);
  b.copy_h2d(d, h, n, s);
  b.synchronize(b.record_event(s));
  std::memset(h, 0, n);
  b.copy_d2h(h, d, n, s);
  b.synchronize(b.record_event(s));
  BOOST_TEST(first_mismatch(h, n, 51) == n);
  BOOST_TEST(round_trip(b, b.new_stream(), n, 52));
  b.deallocate_device(d, n, s);
  b.synchronize_device();
  b.deallocate_host(h, n);
}

BOOST_AUTO_TEST_CASE(the_callers_current_device_is_restored) {
  int const count = cuda::device_count();
  int before = -1;
  PIPESWAP_CUDA_TRY(cudaGetDevice(&before));
  for (int dev = 0; dev < count; ++dev) {
    BOOST_TEST_CONTEXT("device " << dev) {
      cuda::backend b(dev);
      // The legacy stream means "the current device's": the backend makes its device current for
      // the call, so this works from any current device.
      BOOST_TEST(round_trip(b, b.current_stream(), 1 << 16, static_cast<std::uint32_t>(60 + dev)));
      (void)b.new_stream();
      b.register_host(nullptr, 0);
      b.synchronize_device();
      int now = -1;
      PIPESWAP_CUDA_TRY(cudaGetDevice(&now));
      BOOST_TEST(now == before);
    }
  }
  if (count < 2) BOOST_TEST_MESSAGE("one device: restoring is exercised, a switch is not");
}

BOOST_AUTO_TEST_CASE(labels_and_handles) {
  cuda::backend b(device());
  b.set_label("prefetch batch 7");
  BOOST_TEST(b.label() == "prefetch batch 7");
  BOOST_TEST(round_trip(b, b.new_stream(), 1024, 70));
  b.set_label("");
  BOOST_TEST(b.label().empty());

  auto const logged = cuda::logged_error_count();
  cuda::stream a(device());
  cuda::stream moved = std::move(a);
  BOOST_TEST((a.get() == nullptr));
  BOOST_TEST(moved.is_done());
  cudaStream_t const raw = moved.release();
  cuda::stream adopted = cuda::stream::from_native_handle(raw, device());
  adopted.sync();
  BOOST_TEST(cuda::logged_error_count() == logged);
}
