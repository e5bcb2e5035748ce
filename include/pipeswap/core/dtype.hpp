// pipeswap — element types of swapped tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <pipeswap/config.hpp>

namespace pipeswap {

/// Element type of a tensor the library moves or updates. The names are the safetensors spellings.
enum class dtype : std::uint8_t { f32, f16, bf16, f64, i64, u8 };

/// Size in bytes of one element of `t`.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
  case dtype::f64:
  case dtype::i64: return 8;
  case dtype::f32: return 4;
  case dtype::f16:
  case dtype::bf16: return 2;
  case dtype::u8: return 1;
  }
  return 0;
}

/// The safetensors name of `t` ("F32", "BF16", ...).
constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
  case dtype::f32: return "F32";
  case dtype::f16: return "F16";
  case dtype::bf16: return "BF16";
  case dtype::f64: return "F64";
  case dtype::i64: return "I64";
  case dtype::u8: return "U8";
  }
  return "?";
}

/// Inverse of name_of; returns false when `s` names no supported type.
constexpr bool parse_dtype(std::string_view s, dtype& out) noexcept {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::f64, dtype::i64, dtype::u8}) {
    if (name_of(t) == s) {
      out = t;
      return true;
    }
  }
  return false;
}

} // namespace pipeswap
