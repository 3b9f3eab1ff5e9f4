// tile::SigmoidOut16 (tile/cpu/math-inl.h: the sigmoid of values rounded straight to bf16 / f16, in the forward
// kernels of clipped_swiglu and causal_conv1d) on every ISA this host runs, against 1 / (1 + exp(-x)) in double:
// a sweep of bit patterns from -inf to +inf (every 509th float, about 8.4 million values), the edges where
// e^-x overflows, signed zeros, infinities and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tile/cpu/fast_math.h"
#include "tile/cpu/isa.h"

namespace strata::tile {
namespace {

std::vector<float> sweep() {
  std::vector<float> x;
  for (uint64_t u = 0; u < 0x7f800000u; u += 509) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t b = static_cast<uint32_t>(u) | sign;
      float f;
      std::memcpy(&f, &b, 4);
      x.push_back(f);
    }
  }
  for (float e : {0.f, -0.f, 1e-45f, -1e-45f, -87.3f, -88.7f, -88.8f, -89.f, -104.f, 88.8f, 0.5f, -0.5f,
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()})
    x.push_back(e);
  return x;
}

// Relative error below 1.4e-4 + 7.5e-8 |x| (degree-3 2^f: 7.5e-5, the 14-bit reciprocal: 6.1e-5, and the
// rounding of t = -x log2 e) where the result is above FLT_MIN; below it an absolute error under FLT_MIN.
// 1.4e-4 is 0.07 of a bf16 and 0.3 of an f16 half-ulp.
TEST(CpuFusedSigmoidOut16, Within1p4em4RelativeOnEveryIsa) {
  const std::vector<float> x = sweep();
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const FastMathArrayFn fn = sigmoid_out16_for(isa.hwy_target);
    ASSERT_NE(fn, nullptr) << isa.name;
    std::vector<float> y(x.size());
    fn(x.data(), y.data(), static_cast<int64_t>(x.size()));
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double xd = static_cast<double>(x[i]);
      ASSERT_TRUE(std::isfinite(y[i]) && y[i] >= 0.f && y[i] <= 1.f) << isa.name << " sigmoid(" << x[i] << ") = " << y[i];
      const double ref = 1.0 / (1.0 + std::exp(-xd));
      if (std::fabs(static_cast<double>(y[i]) - ref) <= std::numeric_limits<float>::min()) continue;
      const double e = std::fabs(static_cast<double>(y[i]) - ref) / ref - 7.5e-8 * std::fabs(xd);
      if (e > worst) worst = e, worst_x = x[i];
    }
    EXPECT_LE(worst, 1.4e-4) << isa.name << ": worst at x = " << worst_x;
    std::printf("[          ] %s: sigmoid_out16 max relative error %.3g (at x = %.9g)\n", isa.name, worst, worst_x);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const float sp[4] = {nan, -nan, inf, -inf};
    float sy[4];
    fn(sp, sy, 4);
    EXPECT_TRUE(std::isnan(sy[0]) && std::isnan(sy[1])) << isa.name;
    EXPECT_EQ(sy[2], 1.f) << isa.name;
    EXPECT_LE(sy[3], std::numeric_limits<float>::min()) << isa.name;
  }
}

}  // namespace
}  // namespace strata::tile
