// dtype conversions, exhaustively: every f16/bf16 bit pattern round-trips through f32, and f32 -> half
// rounding matches the compiler's _Float16 (IEEE round-to-nearest-even) and a bf16 oracle at every
// midpoint between neighbouring half values and on random f32s.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "opbase/dtype.h"

namespace strata {
namespace {

float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t ubits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Oracle for f32 -> bf16: x lies between lo (x truncated to bf16) and the next bf16 of larger magnitude;
// pick the nearer in exact double arithmetic, ties to the even one. Past the largest finite bf16 the "next"
// value is the one the exponent would reach, and reaching it means Inf.
uint16_t bf16_oracle(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const uint16_t lo = static_cast<uint16_t>(ubits(x) >> 16), hi = static_cast<uint16_t>(lo + 1);
  const double d = x, dlo = bits(static_cast<uint32_t>(lo) << 16);
  if (d == dlo) return lo;
  double dhi = bits(static_cast<uint32_t>(hi) << 16);
  if (std::isinf(dhi)) dhi = 2 * dlo - static_cast<double>(bits(static_cast<uint32_t>(lo - 1) << 16));
  const double a = std::fabs(d - dlo), b = std::fabs(dhi - d);
  if (a < b) return lo;
  if (b < a) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(DType, Bf16RoundTripAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_bits_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(f)))) << h;
      continue;
    }
    ASSERT_EQ(f32_to_bf16_bits(f), h) << h;
  }
}

TEST(DType, F16RoundTripAllPatternsMatchesFloat16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 ref;
    const uint16_t hb = static_cast<uint16_t>(h);
    std::memcpy(&ref, &hb, 2);
    const float f = f16_bits_to_f32(hb);
    if (std::isnan(static_cast<float>(ref))) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f)))) << h;
      continue;
    }
    ASSERT_EQ(ubits(f), ubits(static_cast<float>(ref))) << h;
    ASSERT_EQ(f32_to_f16_bits(f), hb) << h;
  }
}

TEST(DType, F16RoundingAtEveryMidpointAndRandom) {
  auto check = [](float x) {
    const _Float16 r = static_cast<_Float16>(x);
    uint16_t rb;
    std::memcpy(&rb, &r, 2);
    ASSERT_EQ(f32_to_f16_bits(x), rb) << x;
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite non-negative f16 and its neighbour
    const float a = f16_bits_to_f32(static_cast<uint16_t>(h)), b = f16_bits_to_f32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);  // exact in f32
    for (float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f)}) {
      check(x);
      check(-x);
    }
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 2000000; ++i) check(bits(rng()));
}

TEST(DType, Bf16RoundingAtEveryMidpointAndRandom) {
  for (uint32_t h = 0; h < 0x7f80; ++h) {
    const uint32_t base = h << 16;
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x0001u, 0xffffu}) {
      const float x = bits(base | low);
      ASSERT_EQ(f32_to_bf16_bits(x), bf16_oracle(x)) << std::hex << (base | low);
      ASSERT_EQ(f32_to_bf16_bits(-x), static_cast<uint16_t>(bf16_oracle(x) | 0x8000u));
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    const float x = bits(rng());
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_bf16_bits(x), bf16_oracle(x)) << std::hex << ubits(x);
  }
}

TEST(DType, NamesAndSizes) {
  EXPECT_STREQ(strata_dtype_name(STRATA_DTYPE_BF16), "bf16");
  EXPECT_EQ(strata_dtype_size(STRATA_DTYPE_F64), 8u);
  EXPECT_EQ(strata_dtype_size(STRATA_DTYPE_BOOL), 1u);
  EXPECT_STREQ(strata_dtype_name(99), "?");
  EXPECT_EQ(strata_dtype_size(-1), 0u);
}

}  // namespace
}  // namespace strata
