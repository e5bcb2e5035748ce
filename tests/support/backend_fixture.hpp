// The same test body on every backend.
//
//   backend_traits<B>             how a test makes a B (make()) and whether B can run on this
//                                 machine (unavailable(): nullopt, or the reason it cannot).
//                                 Specialise it next to a backend's test support
//                                 (support/cuda_backend.hpp).
//   backend_fixture<B>            holds a B made by its traits; the test body's `f.b`.
//   skip_unless_available<L>      a Boost.Test global fixture for a std::tuple of backends: when
//                                 one of them cannot run here it prints the reason and ends the
//                                 executable with status 77, which `meson test` shows as SKIP.
//                                 Boost.Test cannot skip a single case with 77, so a test source is
//                                 compiled once per backend list (support/backend_list.hpp) and
//                                 each executable skips or runs as a whole. With
//                                 PIPESWAP_REQUIRE_DEVICE=1 in the environment (a GPU CI job) an
//                                 unavailable backend fails instead.
//   fill_pattern/first_mismatch   deterministic bytes to move around and check.
//
// Test bodies go through the Backend concept only (plus `if constexpr` on optional capabilities),
// and announce host reads and writes of pinned memory (pipeswap::detail::note_host_read/write) so
// that the mock's hazard checker also checks the tests' own ordering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/mock.hpp>

#include "support/backends.hpp"

namespace pipeswap::test {

/// Primary template: backends that are default-constructible and run anywhere.
template <class B>
struct backend_traits {
  static B make() { return B(); }
  static std::optional<std::string> unavailable() { return std::nullopt; }
};

/// A backend for one test body.
template <class B>
struct backend_fixture {
  B b = backend_traits<B>::make();
};

/// Ends the process: 77 (skipped) with `why` on stdout, or 1 when PIPESWAP_REQUIRE_DEVICE is set.
[[noreturn]] inline void skip_executable(std::string const& why) {
  std::cout.flush();
  char const* require = std::getenv("PIPESWAP_REQUIRE_DEVICE");
  if (require != nullptr && std::string_view(require) != "" && std::string_view(require) != "0") {
    std::fprintf(stderr, "FAIL: %s (PIPESWAP_REQUIRE_DEVICE is set)\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::printf("SKIP: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

template <class List>
struct skip_unless_available;

/// Global fixture: skips the whole executable when a backend of the list cannot run here.
template <class... Bs>
struct skip_unless_available<std::tuple<Bs...>> {
  skip_unless_available() {
    std::optional<std::string> why;
    ((why = why ? why : backend_traits<Bs>::unavailable()), ...);
    if (why) skip_executable(*why);
  }
};

/// Byte i of pattern `seed` (a cheap hash, so shifted or stale data never matches by accident).
[[nodiscard]] inline std::byte pattern_byte(std::size_t i, std::uint32_t seed) noexcept {
  std::uint64_t x = (static_cast<std::uint64_t>(seed) << 32) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xff);
}

inline void fill_pattern(std::byte* p, std::size_t n, std::uint32_t seed) noexcept {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern_byte(i, seed);
}

/// Index of the first byte that differs from pattern `seed`, or n when all match.
[[nodiscard]] inline std::size_t first_mismatch(std::byte const* p, std::size_t n, std::uint32_t seed) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != pattern_byte(i, seed)) return i;
  }
  return n;
}

} // namespace pipeswap::test
