// bf16 / f16 conversions: every 16-bit pattern round-trips through float; float -> half rounding
// agrees with two independent references (FPU rounding in double, and g++'s _Float16 on x86-64) on
// every rounding boundary of both formats plus a few million sampled floats, and with PyTorch's
// rounding of recorded floats. The sweep over all 2^32 floats runs in optimized builds without
// sanitizers (NDEBUG) or when PIPESWAP_EXHAUSTIVE=1.
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <pipeswap/core/half.hpp>

#include "optim/vectors.hpp"

using pipeswap::bf16;
using pipeswap::f16;
using pipeswap::to_bf16;
using pipeswap::to_f16;
using pipeswap::to_float;

// Compile-time checks: the conversions are constexpr.
static_assert(to_bf16(1.0f).bits == 0x3f80);
static_assert(to_f16(1.0f).bits == 0x3c00);
static_assert(to_float(f16{0x0001}) == 0x1p-24f);
static_assert(to_float(f16{0x7bff}) == 65504.0f);
static_assert(to_float(bf16{0x7f7f}) == 0x1.fep127f);
static_assert(to_f16(65519.0f).bits == 0x7bff && to_f16(65520.0f).bits == 0x7c00);
static_assert(to_f16(0x1p-25f).bits == 0x0000 && to_f16(0x1.000002p-25f).bits == 0x0001);
static_assert(to_f16(-0x1.8p-24f).bits == 0x8002);  // tie 1.5 ulp -> even 2
static_assert(to_bf16(0x1.ffp127f).bits == 0x7f80); // tie above the max -> even, which is inf
static_assert(pipeswap::from_float<float>(0.1f) == 0.1f);
static_assert(pipeswap::dtype_of<bf16> == pipeswap::dtype::bf16);

BOOST_AUTO_TEST_SUITE(optim_half)

namespace {

constexpr float bits_to_float(std::uint32_t u) { return std::bit_cast<float>(u); }
constexpr std::uint32_t float_to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

bool is_nan16(std::uint16_t h, int man_bits) {
  std::uint16_t const exp_mask = static_cast<std::uint16_t>((0x7fffu >> man_bits) << man_bits);
  return (h & exp_mask) == exp_mask && (h & ((1u << man_bits) - 1)) != 0;
}

struct format {
  int man_bits;    // explicit mantissa bits
  int emin;        // exponent of the smallest normal
  double overflow; // 2^(emax+1): results at or above this are infinite
};
constexpr format bf16_format{7, -126, 0x1p128};
constexpr format f16_format{10, -14, 0x1p16};

// Independent reference: scale |x| so that the target format's last mantissa bit is the units digit,
// let the FPU round to nearest even (nearbyint in the default mode), scale back. Exact in double.
double reference_round(float x, format const& f) {
  double const y = std::fabs(static_cast<double>(x));
  if (y == 0 || std::isinf(y)) return std::copysign(y, x);
  int e = 0;
  std::frexp(y, &e); // y = m * 2^e, m in [0.5, 1): the leading bit has weight 2^(e-1)
  int const lead = std::max(e - 1, f.emin);
  double const scale = std::ldexp(1.0, lead - f.man_bits);
  double r = std::nearbyint(y / scale) * scale;
  if (r >= f.overflow) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

// Checks one float against the reference (and _Float16 where available); returns false on mismatch.
bool check_one(std::uint32_t u) {
  float const x = bits_to_float(u);
  bf16 const b = to_bf16(x);
  f16 const h = to_f16(x);
  if (std::isnan(x)) {
    // NaN stays NaN with its sign; top payload bits kept.
    bool ok = is_nan16(b.bits, 7) && is_nan16(h.bits, 10);
    ok = ok && (b.bits >> 15) == (u >> 31) && (h.bits >> 15) == (u >> 31);
    std::uint32_t const pb = (u >> 16) & 0x7f, ph = (u >> 13) & 0x3ff;
    ok = ok && (pb == 0 ? (b.bits & 0x7f) == 1 : (b.bits & 0x7f) == pb);
    ok = ok && (ph == 0 ? (h.bits & 0x3ff) == 1 : (h.bits & 0x3ff) == ph);
    return ok;
  }
  double const rb = reference_round(x, bf16_format);
  double const rh = reference_round(x, f16_format);
  float const fb = to_float(b), fh = to_float(h);
  bool ok = static_cast<double>(fb) == rb && std::signbit(fb) == std::signbit(rb);
  ok = ok && static_cast<double>(fh) == rh && std::signbit(fh) == std::signbit(rh);
#if defined(__FLT16_MAX__) && !defined(__clang__)
  _Float16 const g = static_cast<_Float16>(x);
  ok = ok && std::bit_cast<std::uint16_t>(g) == h.bits;
#endif
  return ok;
}

// Every float where rounding to either format can change: each representable half value, each
// midpoint between neighbours, and their float neighbours. Covers ties, carries into the exponent,
// subnormal/normal transitions, the overflow threshold and the underflow-to-zero threshold.
std::vector<std::uint32_t> boundary_floats() {
  std::vector<std::uint32_t> out;
  auto add_around = [&](double v) {
    if (!(v < 0x1p128)) return;
    std::uint32_t const c = float_to_bits(static_cast<float>(v));
    for (std::uint32_t d : {c - 1, c, c + 1}) {
      out.push_back(d & 0x7fffffffu);
      out.push_back((d & 0x7fffffffu) | 0x80000000u);
    }
  };
  for (std::uint32_t i = 0; i < 0x7c00; ++i) { // f16 finite non-negative values, plus the next one
    double const a = to_float(f16{static_cast<std::uint16_t>(i)});
    double const b = i + 1 < 0x7c00 ? to_float(f16{static_cast<std::uint16_t>(i + 1)}) : 0x1p16;
    add_around(a);
    add_around((a + b) / 2); // exact in double, representable in float
  }
  for (std::uint32_t i = 0; i < 0x7f80; ++i) { // bf16 finite non-negative values
    double const a = to_float(bf16{static_cast<std::uint16_t>(i)});
    double const b = i + 1 < 0x7f80 ? to_float(bf16{static_cast<std::uint16_t>(i + 1)}) : 0x1p128;
    add_around(a);
    add_around((a + b) / 2);
  }
  return out;
}

bool exhaustive_requested() {
  char const* env = std::getenv("PIPESWAP_EXHAUSTIVE");
  if (env != nullptr) return std::string(env) == "1";
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_UNDEFINED__)
  return true;
#else
  return false;
#endif
}

} // namespace

BOOST_AUTO_TEST_CASE(all_bf16_patterns_round_trip) {
  int bad = 0;
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    bf16 const h{static_cast<std::uint16_t>(i)};
    float const f = to_float(h);
    bad += float_to_bits(f) != (i << 16); // widening is the top half, exactly
    bad += to_bf16(f).bits != i;
  }
  BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_CASE(all_f16_patterns_round_trip) {
  int bad = 0;
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    f16 const h{static_cast<std::uint16_t>(i)};
    float const f = to_float(h);
    bad += to_f16(f).bits != i;
    if (is_nan16(h.bits, 10)) {
      bad += !std::isnan(f) || float_to_bits(f) != (((i & 0x8000u) << 16) | 0x7f800000u | ((i & 0x3ffu) << 13));
      continue;
    }
    // Value: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m for subnormals, computed in double.
    int const e = static_cast<int>((i >> 10) & 0x1f);
    double const m = static_cast<double>(i & 0x3ff);
    double v = e == 0    ? std::ldexp(m, -24)
               : e == 31 ? std::numeric_limits<double>::infinity()
                         : std::ldexp(1024 + m, e - 25);
    if (i & 0x8000u) v = -v;
    bad += static_cast<double>(f) != v || std::signbit(f) != std::signbit(v);
#if defined(__FLT16_MAX__) && !defined(__clang__)
    bad += float_to_bits(static_cast<float>(std::bit_cast<_Float16>(h.bits))) != float_to_bits(f);
#endif
  }
  BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_CASE(rounding_boundaries_match_references) {
  auto const floats = boundary_floats();
  BOOST_TEST(floats.size() > 500'000u);
  int bad = 0;
  for (std::uint32_t u : floats) {
    if (!check_one(u) && ++bad <= 10) BOOST_ERROR("mismatch at float bits 0x" << std::hex << u);
  }
  BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_CASE(special_values) {
  float const inf = std::numeric_limits<float>::infinity();
  BOOST_TEST(to_bf16(inf).bits == 0x7f80);
  BOOST_TEST(to_bf16(-inf).bits == 0xff80);
  BOOST_TEST(to_f16(inf).bits == 0x7c00);
  BOOST_TEST(to_f16(-inf).bits == 0xfc00);
  BOOST_TEST(to_bf16(-0.0f).bits == 0x8000);
  BOOST_TEST(to_f16(-0.0f).bits == 0x8000);
  BOOST_TEST(to_f16(-1e-30f).bits == 0x8000);
  BOOST_TEST(to_f16(std::numeric_limits<float>::max()).bits == 0x7c00);
  BOOST_TEST(to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80);
  BOOST_TEST(to_bf16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  BOOST_TEST(to_bf16(0x1p-133f).bits == 0x0001); // smallest bf16 subnormal
  // NaNs: quiet NaN keeps sign and payload top bits; a payload only in the dropped bits stays NaN.
  BOOST_TEST(to_bf16(bits_to_float(0x7fc00000)).bits == 0x7fc0);
  BOOST_TEST(to_bf16(bits_to_float(0xffc12345)).bits == 0xffc1);
  BOOST_TEST(to_bf16(bits_to_float(0x7f800001)).bits == 0x7f81);
  BOOST_TEST(to_f16(bits_to_float(0x7fc00000)).bits == 0x7e00);
  BOOST_TEST(to_f16(bits_to_float(0xff800001)).bits == 0xfc01);
  BOOST_TEST(std::isnan(to_float(to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

BOOST_AUTO_TEST_CASE(sampled_floats_match_references) {
  std::mt19937 rng(12345);
  int bad = 0;
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
  constexpr int samples = 3'000'000;
#else
  constexpr int samples = 1'000'000; // keeps debug + sanitizer builds at a few seconds
#endif
  for (int i = 0; i < samples; ++i) {
    std::uint32_t const u = rng();
    if (!check_one(u) && ++bad <= 10) BOOST_ERROR("mismatch at float bits 0x" << std::hex << u);
  }
  BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_CASE(matches_pytorch_rounding) {
  // Floats and torch's .to(bfloat16) / .to(float16) bits recorded by gen_torch_vectors.py. NaN
  // payloads differ between torch builds (0x7fc0 in the baseline kernels, 0xffff in the AVX2 ones),
  // so for NaN only NaN-ness is compared.
  int files = 0;
  for (auto const& ds : pipeswap::test::load_datasets()) {
    if (!ds.json.contains("conversions")) continue;
    ++files;
    auto const& c = ds.json.at("conversions");
    auto const floats = pipeswap::test::hex_words<std::uint32_t>(c.at("float").get<std::string>());
    auto const bf = pipeswap::test::hex_words<std::uint16_t>(c.at("bf16").get<std::string>());
    auto const hf = pipeswap::test::hex_words<std::uint16_t>(c.at("f16").get<std::string>());
    BOOST_TEST_REQUIRE(floats.size() == bf.size());
    BOOST_TEST_REQUIRE(floats.size() == hf.size());
    int bad = 0;
    for (std::size_t i = 0; i < floats.size(); ++i) {
      float const x = bits_to_float(floats[i]);
      if (std::isnan(x)) {
        bad += !is_nan16(bf[i], 7) || !is_nan16(hf[i], 10);
        continue;
      }
      bad += to_bf16(x).bits != bf[i];
      bad += to_f16(x).bits != hf[i];
    }
    BOOST_TEST(bad == 0, ds.name << ": " << bad << " mismatches in " << floats.size() << " floats");
  }
  BOOST_TEST(files > 0);
}

BOOST_AUTO_TEST_CASE(all_floats_exhaustive) {
  if (!exhaustive_requested()) {
    BOOST_TEST_MESSAGE("skipped: all 2^32 floats run under NDEBUG without sanitizers, or with "
                       "PIPESWAP_EXHAUSTIVE=1");
    return;
  }
  std::uint64_t bad = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffu; ++u) bad += !check_one(static_cast<std::uint32_t>(u));
  BOOST_TEST(bad == 0u);
}

BOOST_AUTO_TEST_SUITE_END() // optim_half
