// Conformance of the Backend concept: one minimal model passes; one near-miss per requirement fails.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/mock.hpp>

#include "support/backends.hpp"

namespace {

using pipeswap::backend;
using pipeswap::test::archetype_backend;

// Everything of the archetype except the opt-in.
struct parts {
  using error_type = std::runtime_error;
  using stream_type = archetype_backend::stream_type;
  using event_type = archetype_backend::event_type;
  using device_pointer = pipeswap::device_ptr;
  stream_type current_stream();
  stream_type new_stream();
  event_type record_event(stream_type);
  void wait_event(stream_type, event_type const&);
  void synchronize(event_type const&);
  device_pointer allocate_device(std::size_t, stream_type);
  void deallocate_device(device_pointer, std::size_t, stream_type);
  std::byte* allocate_host(std::size_t);
  void deallocate_host(std::byte*, std::size_t);
  void copy_h2d(device_pointer, std::byte const*, std::size_t, stream_type);
  void copy_d2h(std::byte*, device_pointer, std::size_t, stream_type);
};
struct opted : parts {
  using backend_concept = pipeswap::backend_tag;
};

// The minimal models.
static_assert(backend<opted>);
static_assert(backend<archetype_backend>);
static_assert(backend<pipeswap::mock::backend>);
static_assert(backend<pipeswap::test::sync_host_backend>);

// Opt-in.
static_assert(!backend<parts>, "no backend_concept tag");
struct wrong_tag : parts {
  struct backend_concept {};
};
static_assert(!backend<wrong_tag>, "tag not derived from backend_tag");
struct derived_tag : parts {
  struct backend_concept : pipeswap::backend_tag {};
};
static_assert(backend<derived_tag>, "a tag derived from backend_tag opts in");
struct specialised : parts {};
} // namespace
template <>
inline constexpr bool pipeswap::enable_backend<specialised> = true;
namespace {
static_assert(backend<specialised>, "enable_backend specialisation opts in");

// error_type.
struct no_error : opted {
  using error_type = void;
};
static_assert(!backend<no_error>);
struct error_not_exception : opted {
  using error_type = std::string;
};
static_assert(!backend<error_not_exception>);

// stream_type and the stream source.
struct stream_not_copyable : opted {
  struct stream_type {
    stream_type(stream_type const&) = delete;
    friend bool operator==(stream_type const&, stream_type const&) = default;
  };
  stream_type current_stream();
  stream_type new_stream();
};
static_assert(!pipeswap::stream_source<stream_not_copyable>);
static_assert(!backend<stream_not_copyable>);
struct stream_not_comparable : opted {
  struct stream_type {};
  stream_type current_stream();
  stream_type new_stream();
};
static_assert(!pipeswap::stream_source<stream_not_comparable>);
struct current_stream_wrong_type : opted {
  int current_stream();
};
static_assert(!pipeswap::stream_source<current_stream_wrong_type>);
static_assert(!backend<current_stream_wrong_type>);
struct no_new_stream : opted {
  void new_stream(int);
};
static_assert(!backend<no_new_stream>);

// Events.
struct event_not_copyable : opted {
  struct event_type {
    event_type() = default;
    event_type(event_type const&) = delete;
  };
  event_type record_event(stream_type);
  void wait_event(stream_type, event_type const&);
  void synchronize(event_type const&);
};
static_assert(pipeswap::stream_source<event_not_copyable>);
static_assert(!pipeswap::event_source<event_not_copyable>);
struct record_returns_void : opted {
  void record_event(stream_type);
};
static_assert(!pipeswap::event_source<record_returns_void>);
struct no_wait_event : opted {
  void wait_event() = delete;
};
static_assert(!pipeswap::event_source<no_wait_event>);
struct synchronize_returns_bool : opted {
  bool synchronize(event_type const&);
};
static_assert(!pipeswap::event_source<synchronize_returns_bool>);
static_assert(!backend<synchronize_returns_bool>);

// Device memory.
struct not_offsettable {
  friend auto operator<=>(not_offsettable, not_offsettable) = default;
  explicit operator bool() const;
};
struct pointer_not_offsettable : opted {
  using device_pointer = not_offsettable;
  device_pointer allocate_device(std::size_t, stream_type);
  void deallocate_device(device_pointer, std::size_t, stream_type);
  void copy_h2d(device_pointer, std::byte const*, std::size_t, stream_type);
  void copy_d2h(std::byte*, device_pointer, std::size_t, stream_type);
};
static_assert(!pipeswap::device_pointer_like<not_offsettable>);
static_assert(!pipeswap::device_memory<pointer_not_offsettable>);
struct allocate_returns_void_ptr : opted {
  void* allocate_device(std::size_t, stream_type);
};
static_assert(!pipeswap::device_memory<allocate_returns_void_ptr>);
struct deallocate_not_stream_ordered : opted {
  void deallocate_device(device_pointer, std::size_t);
};
static_assert(!pipeswap::device_memory<deallocate_not_stream_ordered>);
static_assert(!backend<deallocate_not_stream_ordered>);

// Pinned memory.
struct host_returns_void_ptr : opted {
  void* allocate_host(std::size_t);
};
static_assert(!pipeswap::pinned_memory<host_returns_void_ptr>);
struct no_deallocate_host : opted {
  void deallocate_host() = delete;
};
static_assert(!pipeswap::pinned_memory<no_deallocate_host>);
static_assert(!backend<no_deallocate_host>);

// Copies.
struct no_copy_h2d : opted {
  void copy_h2d() = delete;
};
static_assert(!pipeswap::async_copy<no_copy_h2d>);
struct d2h_without_stream : opted {
  void copy_d2h(std::byte*, device_pointer, std::size_t);
};
static_assert(!pipeswap::async_copy<d2h_without_stream>);
static_assert(!backend<d2h_without_stream>);

// Optional capabilities are detected, not required.
static_assert(pipeswap::labelled_backend<pipeswap::mock::backend>);
static_assert(pipeswap::host_access_checked<pipeswap::mock::backend>);
static_assert(!pipeswap::labelled_backend<archetype_backend>);
static_assert(!pipeswap::host_access_checked<archetype_backend>);

} // namespace

BOOST_AUTO_TEST_SUITE(backend_concepts)

BOOST_AUTO_TEST_CASE(device_ptr_arithmetic_and_order) {
  pipeswap::device_ptr const null;
  pipeswap::device_ptr const p(std::uintptr_t{4096});
  BOOST_TEST(!null);
  BOOST_TEST(static_cast<bool>(p));
  BOOST_TEST((p + 16).address() == 4112u);
  BOOST_TEST((p < p + 1));
  BOOST_TEST((p + 0 == p));
}

BOOST_AUTO_TEST_CASE(sync_host_backend_round_trip) {
  // The user-written model also behaves: bytes survive a device round trip.
  pipeswap::test::sync_host_backend b;
  auto s = b.current_stream();
  auto* h = b.allocate_host(8);
  for (int i = 0; i < 8; ++i) h[i] = std::byte(i + 1);
  auto d = b.allocate_device(8, s);
  b.copy_h2d(d, h, 8, s);
  for (int i = 0; i < 8; ++i) h[i] = std::byte{0};
  b.copy_d2h(h, d, 8, s);
  b.synchronize(b.record_event(s));
  for (int i = 0; i < 8; ++i) BOOST_TEST(static_cast<int>(h[i]) == i + 1);
  b.deallocate_device(d, 8, s);
  b.deallocate_host(h, 8);
  BOOST_TEST(b.live_allocations() == 0u);
  BOOST_CHECK_THROW(b.deallocate_host(h, 8), std::runtime_error);
}

BOOST_AUTO_TEST_SUITE_END() // backend_concepts
