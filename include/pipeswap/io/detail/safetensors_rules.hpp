// pipeswap — small pieces the safetensors reader and writer share: UTF-8 validation, the
// safetensors package's dtype order, overflow-checked sizes, text for error messages.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <pipeswap/core/dtype.hpp>

namespace pipeswap::io::detail {

inline constexpr std::size_t no_error = static_cast<std::size_t>(-1);

/// Offset of the first byte of `s` that is not part of well-formed UTF-8 (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or no_error.
constexpr std::size_t find_invalid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    auto const b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0; // overlong
      if (b0 == 0xED) hi = 0x9F; // surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90; // overlong
      if (b0 == 0xF4) hi = 0x8F; // above U+10FFFF
    } else {
      return i;
    }
    if (s.size() - i < len) return i;
    for (std::size_t k = 1; k < len; ++k) {
      auto const b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return no_error;
}

/// Position of `t` in the safetensors package's Dtype enum, which is in increasing alignment
/// order; the writer sorts by it (descending) so every tensor starts aligned to its element size.
constexpr int dtype_rank(dtype t) noexcept {
  switch (t) {
  case dtype::u8: return 0;
  case dtype::f16: return 1;
  case dtype::bf16: return 2;
  case dtype::f32: return 3;
  case dtype::f64: return 4;
  case dtype::i64: return 5;
  }
  return -1;
}

/// Every dtype name the safetensors format defines (so the reader can tell "not supported" from
/// "not a dtype at all").
inline constexpr std::array<std::string_view, 22> safetensors_dtype_names = {
    "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
    "I16",  "U16", "F16",     "BF16",    "I32", "U32", "F32",     "C64",     "F64",     "I64",         "U64"};

constexpr bool is_safetensors_dtype_name(std::string_view s) noexcept {
  for (auto n : safetensors_dtype_names) {
    if (n == s) return true;
  }
  return false;
}

/// a * b, or false on overflow.
constexpr bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return !__builtin_mul_overflow(a, b, &out);
}

/// Number of elements of `shape` (1 for a scalar), or false on overflow.
constexpr bool checked_numel(std::span<std::uint64_t const> shape, std::uint64_t& out) noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (!checked_mul(n, d, n)) return false;
  }
  out = n;
  return true;
}

/// `s` in double quotes for a message: quotes, backslashes and control bytes escaped, bytes that
/// are not UTF-8 as \xNN, and cut (with "...") after about 80 bytes.
inline std::string quote(std::string_view s) {
  constexpr std::size_t max_bytes = 80;
  bool const utf8 = find_invalid_utf8(s) == no_error;
  bool cut = false;
  if (s.size() > max_bytes) {
    std::size_t n = max_bytes;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n; // whole characters
    s = s.substr(0, n);
    cut = true;
  }
  std::string out = "\"";
  char const* hex = "0123456789abcdef";
  for (char c : s) {
    auto const b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (b < 0x20 || b == 0x7F || (b >= 0x80 && !utf8)) {
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 15];
    } else {
      out += c;
    }
  }
  out += cut ? "\"..." : "\"";
  return out;
}

/// "[a, b, c]".
inline std::string format_list(std::span<std::uint64_t const> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}

/// "F32 [2, 3]".
inline std::string describe(dtype t, std::span<std::uint64_t const> shape) {
  std::string s(name_of(t));
  s += ' ';
  s += format_list(shape);
  return s;
}

} // namespace pipeswap::io::detail
