// pipeswap — 16-bit floating-point storage types: bf16 (bfloat16) and f16 (IEEE binary16).
//
// These are storage types, not arithmetic types: a value is loaded with to_float, computed on in
// float, and stored with to_bf16 / to_f16 (or from_float<T>). The conversions are pure integer bit
// manipulation, constexpr and PIPESWAP_HOST_DEVICE, so g++, clang and nvcc (host and device) produce
// the same bits without <cuda_bf16.h> / <cuda_fp16.h> and independently of the FPU's modes
// (flush-to-zero, rounding direction).
//
// Conversion rules
// - to_float(bf16), to_float(f16): exact (every 16-bit value is a float). Subnormal f16 values become
//   normal floats; bf16 subnormals stay float subnormals.
// - to_bf16(float), to_f16(float): round to nearest, ties to even (IEEE roundTiesToEven). Finite values
//   beyond the largest finite half value round to ±infinity exactly when IEEE says so (f16: |x| >=
//   65520; bf16: |x| >= 0x1.ffp127 rounded up); values below half the smallest subnormal round to
//   ±0; f16 subnormals (2^-24 .. 2^-14) are produced with correct rounding. Signs of zeros and
//   infinities are kept.
// - NaN: to_bfxx keeps the sign and the top payload bits (the quiet bit included); when those bits
//   are all zero the lowest payload bit is set so the result is still a NaN. Hence
//   half -> float -> half is the identity on all 65536 patterns of either type, NaNs included. (Other
//   libraries return one canonical NaN instead — PyTorch 0x7FC0 / 0x7E00, CUDA cvt 0x7FFF — so NaN
//   payloads are not portable across implementations; NaN-ness and sign are.)
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include <pipeswap/config.hpp>
#include <pipeswap/core/dtype.hpp>

namespace pipeswap {

/// bfloat16 storage: 1 sign, 8 exponent, 7 mantissa bits (the top half of a float). `bits` is the
/// raw pattern; the type is trivially copyable and has the size and alignment of std::uint16_t.
struct bf16 {
  std::uint16_t bits;
};

/// IEEE 754 binary16 storage: 1 sign, 5 exponent, 10 mantissa bits.
struct f16 {
  std::uint16_t bits;
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == alignof(std::uint16_t));
static_assert(sizeof(f16) == 2 && alignof(f16) == alignof(std::uint16_t));
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);
static_assert(std::is_trivially_copyable_v<f16> && std::is_standard_layout_v<f16>);

namespace detail {

// __builtin_bit_cast is constexpr and usable in device code with g++ >= 11, clang >= 9 and nvcc
// (CUDA >= 11.x); std::bit_cast would need --expt-relaxed-constexpr in kernels.
PIPESWAP_HOST_DEVICE constexpr std::uint32_t float_bits(float f) noexcept {
  return __builtin_bit_cast(std::uint32_t, f);
}
PIPESWAP_HOST_DEVICE constexpr float bits_float(std::uint32_t u) noexcept { return __builtin_bit_cast(float, u); }

} // namespace detail

/// Exact widening of a bfloat16 to float.
PIPESWAP_HOST_DEVICE constexpr float to_float(bf16 h) noexcept {
  return detail::bits_float(std::uint32_t{h.bits} << 16);
}

/// Exact widening of a binary16 to float.
PIPESWAP_HOST_DEVICE constexpr float to_float(f16 h) noexcept {
  std::uint32_t const sign = std::uint32_t{h.bits & 0x8000u} << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) // inf / NaN: payload moves up unchanged (quiet bit 9 -> float quiet bit 22)
    return detail::bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return detail::bits_float(sign);
    // Subnormal: man * 2^-24. Normalize so the leading one lands on bit 10.
    exp = 1;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    man &= 0x3ffu;
    // Stored exponent in float: (exp - 15) + 127 with exp possibly <= 0; 112 + exp >= 103 > 0.
  }
  return detail::bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

/// Identity, so generic code can call to_float on any storage type.
PIPESWAP_HOST_DEVICE constexpr float to_float(float x) noexcept { return x; }

/// float -> bfloat16, round to nearest even (see the file comment for NaN).
PIPESWAP_HOST_DEVICE constexpr bf16 to_bf16(float x) noexcept {
  std::uint32_t const u = detail::float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { // NaN
    std::uint32_t const kept = u >> 16;
    return bf16{static_cast<std::uint16_t>((kept & 0x7fu) != 0 ? kept : (kept | 1u))};
  }
  // Add just under half an output ulp, plus one when the kept lsb is odd: ties go to even. A carry
  // out of the mantissa bumps the exponent, which is the correct result, up to +infinity.
  std::uint32_t const rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(rounded >> 16)};
}

/// float -> IEEE binary16, round to nearest even, with f16 subnormals (see the file comment).
PIPESWAP_HOST_DEVICE constexpr f16 to_f16(float x) noexcept {
  std::uint32_t const u = detail::float_bits(x);
  std::uint32_t const sign = (u >> 16) & 0x8000u;
  std::uint32_t const a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { // NaN: keep the top 10 payload bits
    std::uint32_t const man = (a >> 13) & 0x3ffu;
    return f16{static_cast<std::uint16_t>(sign | 0x7c00u | (man != 0 ? man : 1u))};
  }
  if (a >= 0x477ff000u) // >= 65520 = 65504 + half an ulp: the tie goes to the even neighbour, inf
    return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (a >= 0x38800000u) { // >= 2^-14: normal result. Rebias the exponent (127 -> 15), then round.
    std::uint32_t const r = a - 0x38000000u;
    std::uint32_t const rounded = r + 0xfffu + ((r >> 13) & 1u);
    return f16{static_cast<std::uint16_t>(sign | (rounded >> 13))};
  }
  if (a <= 0x33000000u) // <= 2^-25, half the smallest subnormal: the tie goes to even, zero
    return f16{static_cast<std::uint16_t>(sign)};
  // Subnormal result: value = M * 2^(e - 150) with M the 24-bit significand; in units of 2^-24 that
  // is M >> (126 - e). 102 <= e <= 112 here, so the shift is 14..24.
  std::uint32_t const e = a >> 23;
  std::uint32_t const m = (a & 0x7fffffu) | 0x800000u;
  std::uint32_t const shift = 126u - e;
  std::uint32_t const halfway = 1u << (shift - 1);
  std::uint32_t const rest = m & ((1u << shift) - 1u);
  std::uint32_t q = m >> shift;
  if (rest > halfway || (rest == halfway && (q & 1u) != 0)) ++q; // may become 0x400: the min normal
  return f16{static_cast<std::uint16_t>(sign | q)};
}

/// The element types the optimizer math stores: float, bf16, f16.
template <class T>
concept storage_float = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, f16>;

/// float -> T for any storage_float T: identity for float, to_bf16 / to_f16 otherwise.
template <storage_float T>
PIPESWAP_HOST_DEVICE constexpr T from_float(float x) noexcept {
  if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(x);
  else if constexpr (std::is_same_v<T, f16>)
    return to_f16(x);
  else
    return x;
}

/// The dtype tag of a storage_float type.
template <storage_float T>
inline constexpr dtype dtype_of = std::is_same_v<T, bf16>  ? dtype::bf16
                                  : std::is_same_v<T, f16> ? dtype::f16
                                                           : dtype::f32;

} // namespace pipeswap
