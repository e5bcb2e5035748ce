// pipeswap — float/double arithmetic with exactly one IEEE round-to-nearest-even rounding per operation, the
// same bits on the host and on a CUDA device, whatever the compiler's contraction flags.
//
// Why: a compiler may fuse a*b+c into one fma (a single rounding) when contraction is allowed — g++
// does so under -ffp-contract=fast (its default in GNU modes), clang under -ffp-contract=fast even
// inside `#pragma STDC FP_CONTRACT OFF`, nvcc by default (--fmad=true). The optimizer's result must
// not depend on that, so every operation it performs goes through these functions:
//
// - Device (__CUDA_ARCH__): inline PTX add/sub/mul/div/sqrt.rn.f32 without .ftz — the instructions
//   the __fadd_rn / __fmul_rn / __fdiv_rn / __fsqrt_rn intrinsics compile to, but spelled out so that
//   no nvcc flag can change them: PTX never fuses an add or mul that has an explicit rounding
//   modifier, div.rn / sqrt.rn are IEEE correctly rounded, and -ftz=true / --use_fast_math (which
//   turn the intrinsics into .ftz variants that flush subnormals) do not apply to inline PTX.
// - Host: plain operators, with every product passed through an empty asm statement that the compiler
//   must treat as an unknown transformation of the value. A product the optimizer cannot see cannot be
//   contracted into a following add or subtract, at any -O level and after any inlining. (Checked by
//   tests/optim: a TU built with -O2 -march=haswell -ffp-contract=fast gives the same bytes as one
//   built with -ffp-contract=off, with g++ and clang.) The asm also keeps the host loop from being
//   auto-vectorized; the host loop is the oracle, not the fast path.
//
// Requirements (checked where possible): float evaluation without excess precision
// (FLT_EVAL_METHOD == 0: x86-64 SSE, AArch64, CUDA); no -ffast-math family (-fassociative-math,
// -freciprocal-math, -ffinite-math-only reorder or drop operations; the header refuses __FAST_MATH__
// unless PIPESWAP_ALLOW_FAST_MATH is defined); subnormals not flushed (host MXCSR FTZ/DAZ off, which is
// the default; the device side is immune, see above).
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include <pipeswap/config.hpp>

#if defined(__FAST_MATH__) && !defined(PIPESWAP_ALLOW_FAST_MATH)
#  error "pipeswap/core/ieee_ops.hpp: -ffast-math changes float results; the optimizer math would not \
be bit-exact. Compile without it, or define PIPESWAP_ALLOW_FAST_MATH to accept that."
#endif
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0 && __FLT_EVAL_METHOD__ != -1
#  error "pipeswap/core/ieee_ops.hpp: float expressions are evaluated in excess precision \
(FLT_EVAL_METHOD != 0, e.g. x87); use SSE (-mfpmath=sse) so each operation rounds to float."
#endif

namespace pipeswap::ieee {

namespace detail {

/// Hides `x` from the optimizer without generating code (the value stays in its vector/FP register).
template <class T>
inline void opaque(T& x) noexcept {
#if defined(__GNUC__) || defined(__clang__)
#  if defined(__SSE2__) || defined(__x86_64__)
  __asm__("" : "+x"(x));
#  elif defined(__aarch64__)
  __asm__("" : "+w"(x));
#  else
  __asm__("" : "+m"(x));
#  endif
#else
  T volatile v = x;
  x = v;
#endif
}

} // namespace detail

/// float or double: the types these operations are defined for. Both operands must have the same
/// type (no silent promotion of a float expression to double).
template <class T>
concept ieee_float = std::same_as<T, float> || std::same_as<T, double>;

// Device, float: inline PTX with an explicit .rn and without .ftz. PTX never contracts an add or
// mul that carries an explicit rounding modifier, and spelling the instruction pins it against nvcc
// flags: the __fadd_rn-style intrinsics become add.rn.ftz.f32 under -ftz=true or --use_fast_math and
// flush subnormals, which the host does not do. Device, double: the __d*_rn intrinsics (.ftz does
// not exist for f64).
#if defined(__CUDA_ARCH__)
#  define PIPESWAP_DETAIL_DEVICE_OP(f32_ptx, f64_intrinsic, ...)                                                       \
    if constexpr (std::is_same_v<T, float>) {                                                                          \
      float r;                                                                                                         \
      asm(f32_ptx : "=f"(r) : __VA_ARGS__);                                                                            \
      return r;                                                                                                        \
    } else {                                                                                                           \
      return f64_intrinsic;                                                                                            \
    }
#endif

/// a + b, rounded once to nearest even.
template <ieee_float T>
PIPESWAP_HOST_DEVICE inline T add_rn(T a, T b) noexcept {
#if defined(__CUDA_ARCH__)
  PIPESWAP_DETAIL_DEVICE_OP("add.rn.f32 %0, %1, %2;", __dadd_rn(a, b), "f"(a), "f"(b))
#else
  return a + b;
#endif
}

/// a - b, rounded once to nearest even.
template <ieee_float T>
PIPESWAP_HOST_DEVICE inline T sub_rn(T a, T b) noexcept {
#if defined(__CUDA_ARCH__)
  PIPESWAP_DETAIL_DEVICE_OP("sub.rn.f32 %0, %1, %2;", __dsub_rn(a, b), "f"(a), "f"(b))
#else
  return a - b;
#endif
}

/// a * b, rounded once to nearest even; never fused with a later add or subtract.
template <ieee_float T>
PIPESWAP_HOST_DEVICE inline T mul_rn(T a, T b) noexcept {
#if defined(__CUDA_ARCH__)
  PIPESWAP_DETAIL_DEVICE_OP("mul.rn.f32 %0, %1, %2;", __dmul_rn(a, b), "f"(a), "f"(b))
#else
  T p = a * b;
  detail::opaque(p);
  return p;
#endif
}

/// a / b, correctly rounded to nearest even.
template <ieee_float T>
PIPESWAP_HOST_DEVICE inline T div_rn(T a, T b) noexcept {
#if defined(__CUDA_ARCH__)
  PIPESWAP_DETAIL_DEVICE_OP("div.rn.f32 %0, %1, %2;", __ddiv_rn(a, b), "f"(a), "f"(b))
#else
  return a / b;
#endif
}

/// sqrt(a), correctly rounded to nearest even (NaN for a < 0).
template <ieee_float T>
PIPESWAP_HOST_DEVICE inline T sqrt_rn(T a) noexcept {
#if defined(__CUDA_ARCH__)
  PIPESWAP_DETAIL_DEVICE_OP("sqrt.rn.f32 %0, %1;", __dsqrt_rn(a), "f"(a))
#else
  return std::sqrt(a);
#endif
}

#if defined(__CUDA_ARCH__)
#  undef PIPESWAP_DETAIL_DEVICE_OP
#endif

/// -a, exact: flips the sign bit (also of NaN, zero and subnormals, which a flush-to-zero negation
/// would lose).
PIPESWAP_HOST_DEVICE constexpr float neg(float a) noexcept {
  return __builtin_bit_cast(float, __builtin_bit_cast(std::uint32_t, a) ^ 0x80000000u);
}

/// The larger of a and b; a NaN in either operand is returned (like torch.maximum, which propagates
/// NaN). Exact; subnormals compare exactly on the device too. Equal operands (+0 / -0 included)
/// return b.
PIPESWAP_HOST_DEVICE inline float max_nan(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  float r;
  asm("{\n\t.reg .pred gt, un;\n\t"
      "setp.gt.f32 gt, %1, %2;\n\t"
      "setp.nan.f32 un, %1, %1;\n\t"
      "or.pred gt, gt, un;\n\t"
      "selp.f32 %0, %1, %2, gt;\n\t}"
      : "=f"(r)
      : "f"(a), "f"(b));
  return r;
#else
  return (a > b || a != a) ? a : b;
#endif
}

} // namespace pipeswap::ieee
