// The GPU check programs' input data: deterministic values computed from the index alone, so every
// thread and every run agrees on them without storing them.
#pragma once

#include <cstdint>

namespace pipeswap::bench {

/// A value in [-1, 1) for element `i` of the data set `seed` (a splitmix-style mix of both).
inline float value_at(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 40) / 16777216.0 * 2.0 - 1.0);
}

} // namespace pipeswap::bench
