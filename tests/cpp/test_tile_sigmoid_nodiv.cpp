// The division-free sigmoids of tile/cpu/sigmoid_nodiv-inl.h (the bf16/f16 rows of the rms_norm_gated and
// clipped_swiglu CPU kernels, session 16) on every ISA this host runs, against 1 / (1 + exp(-x)) in double over
// the whole float range (a sweep of bit patterns, every 383rd float of each sign, and the edges): SigmoidLpNoDiv
// within SigmoidLp's bar (relative 5e-6 + 7.5e-8 |x|), SigmoidOut16NoDiv within SigmoidOut16's (1.4e-4 +
// 7.5e-8 |x|); an absolute error below FLT_MIN accepted for tiny results; NaN stays NaN; +inf gives 1 to within
// an ulp, -inf at most FLT_MIN. And the four-vector array form gives the one-vector form's bits (the kernels
// take either, by position in the row).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tile/cpu/isa.h"
#include "tile/cpu/sigmoid_nodiv.h"

namespace strata::tile {
namespace {

std::vector<float> sweep() {
  std::vector<float> x;
  for (uint32_t u = 0; u < 0x7f800000u; u += 383)
    for (uint32_t sign : {0u, 0x80000000u}) {
      float f;
      const uint32_t b = u | sign;
      std::memcpy(&f, &b, 4);
      x.push_back(f);
    }
  for (float e : {0.f, -0.f, 87.f, -87.f, 87.5f, -87.5f, 88.8f, -88.8f, 126.f * 0.6931472f, -127.f * 0.6931472f, 0.5f,
                  -0.5f, 1e-30f, -1e-30f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()})
    x.push_back(e);
  for (int k = -40; k <= 40; ++k) x.push_back(static_cast<float>((k + 0.5) * 0.6931471805599453));  // f = +-1/2
  return x;
}

TEST(TileSigmoidNoDiv, WithinTheReducedPrecisionBarsAndArrayFormSameBitsOnEveryIsa) {
  const std::vector<float> x = sweep();
  const double tiny = std::numeric_limits<float>::min();
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    for (bool out16 : {false, true}) {
      const char* what = out16 ? "sigmoid_out16_nodiv" : "sigmoid_lp_nodiv";
      const FastMathArrayFn one = sigmoid_nodiv_for(isa.hwy_target, out16, false);
      const FastMathArrayFn four = sigmoid_nodiv_for(isa.hwy_target, out16, true);
      ASSERT_NE(one, nullptr) << isa.name;
      ASSERT_NE(four, nullptr) << isa.name;
      std::vector<float> y(x.size()), y4(x.size());
      one(x.data(), y.data(), static_cast<int64_t>(x.size()));
      four(x.data(), y4.data(), static_cast<int64_t>(x.size()));
      ASSERT_EQ(std::memcmp(y.data(), y4.data(), 4 * y.size()), 0) << isa.name << " " << what;
      double worst = 0;
      float worst_x = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(y[i] >= 0.f && y[i] <= 1.f) << isa.name << " " << what << "(" << x[i] << ") = " << y[i];
        const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
        if (std::fabs(y[i] - ref) <= tiny) continue;
        const double e = std::fabs(y[i] - ref) / ref - 7.5e-8 * std::fabs(static_cast<double>(x[i]));
        if (e > worst) worst = e, worst_x = x[i];
      }
      EXPECT_LE(worst, out16 ? 1.4e-4 : 5e-6) << isa.name << " " << what << ": worst at x = " << worst_x;
      std::printf("[          ] %s: %s max relative error beyond 7.5e-8 |x|: %.3g (at x = %.9g)\n", isa.name, what,
                  worst, worst_x);
      const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
      const float sp[4] = {nan, -nan, inf, -inf};
      float sy[4];
      one(sp, sy, 4);
      EXPECT_TRUE(std::isnan(sy[0]) && std::isnan(sy[1])) << isa.name << " " << what;
      EXPECT_GE(sy[2], 1.f - 0x1p-24f) << isa.name << " " << what;
      EXPECT_LE(sy[2], 1.f) << isa.name << " " << what;
      EXPECT_LE(sy[3], tiny) << isa.name << " " << what;
      EXPECT_GE(sy[3], 0.f) << isa.name << " " << what;
    }
  }
}

}  // namespace
}  // namespace strata::tile
