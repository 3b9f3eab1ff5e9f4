// The sigmoids of tile/cpu/sigmoid_rcp-inl.h (causal_conv1d's CPU SiLU on targets without AVX-512) on every ISA
// this host runs, against 1 / (1 + exp(-x)) in double: a sweep of bit patterns from -inf to +inf (every 509th
// float of each sign), the clamp edges and the special values. The relative error is what matters for a
// result rounded to bf16 / f16 (SigmoidOut16Rcp) or multiplied into f32 sums (SigmoidLpRcp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tile/cpu/isa.h"
#include "tile/cpu/sigmoid_rcp.h"

namespace strata::tile {
namespace {

std::vector<float> sweep() {
  std::vector<float> x;
  for (uint64_t u = 0; u < 0x7f800000u; u += 509) {
    float f;
    const uint32_t b = static_cast<uint32_t>(u);
    std::memcpy(&f, &b, 4);
    x.push_back(f);
    x.push_back(-f);
  }
  for (float e : {0.f, -0.f, 86.5f, 86.7f, -86.5f, -86.7f, 87.f, -87.f, 88.8f, -88.8f, 104.f, -104.f, 1e30f, -1e30f,
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()})
    x.push_back(e);
  for (int k = -40; k <= 40; ++k) {  // around the range-reduction boundaries (t = n + 1/2)
    const float b = static_cast<float>((k + 0.5) * 0.69314718055994531);
    x.push_back(b);
    x.push_back(std::nextafter(b, 1e30f));
    x.push_back(std::nextafter(b, -1e30f));
  }
  return x;
}

// The ISAs of tile::cpu_isas() this host runs.
std::vector<CpuIsa> host_isas() {
  std::vector<CpuIsa> out;
  for (const CpuIsa& isa : cpu_isas())
    if (reject_cpu_isa(isa).empty()) out.push_back(isa);
  return out;
}

// Relative error bound a + b |x| (b: the rounding of t = -x log2 e, 2^-24 ln 2 |t| = 6e-8 |x| relative in e^-x) where
// sigma(x) >= 6e-38 (x >= -85.7); below, an absolute error below 6e-38 (the clamp of e^-x at 2^125). sigma(+inf)
// within a of 1, sigma(-inf) below 6e-38.
void check(const char* what, FastMathArrayFn (*fn_for)(int64_t), double a, double b) {
  const std::vector<float> x = sweep();
  const float inf = std::numeric_limits<float>::infinity();
  for (const CpuIsa& isa : host_isas()) {
    const FastMathArrayFn fn = fn_for(isa.hwy_target);
    ASSERT_NE(fn, nullptr) << isa.name;
    std::vector<float> y(x.size() + 2);
    std::vector<float> in = x;
    in.push_back(inf);
    in.push_back(-inf);
    fn(in.data(), y.data(), static_cast<int64_t>(in.size()));
    double worst = 0, worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
      ASSERT_TRUE(std::isfinite(y[i]) && y[i] >= 0 && y[i] <= 1) << isa.name << " " << what << "(" << x[i] << ") = " << y[i];
      if (x[i] < -85.7f) {
        ASSERT_LE(std::fabs(y[i] - ref), 6e-38) << isa.name << " " << what << "(" << x[i] << ")";
        continue;
      }
      const double excess = std::fabs(y[i] - ref) / ref - b * std::fabs(x[i]);
      if (excess > worst) worst = excess, worst_x = x[i];
    }
    EXPECT_LE(worst, a) << isa.name << " " << what << ": worst at x = " << worst_x;
    std::printf("[          ] %s: %s max relative error %.3g + %.2g |x| (at x = %.9g)\n", isa.name, what, worst, b,
                worst_x);
    EXPECT_NEAR(y[x.size()], 1.f, a) << isa.name << " " << what << "(inf)";  // the reciprocal's error, as elsewhere
    EXPECT_LE(y[x.size() + 1], 6e-38f) << isa.name << " " << what << "(-inf)";
  }
}

TEST(TileSigmoidRcp, SigmoidLpRcpWithin1e6RelativeOnEveryIsa) {
  // AVX-512 is SigmoidLp (below 2e-7 + 7.5e-8 |x|).
  check("sigmoid_lp_rcp", sigmoid_lp_rcp_for, 1e-6, 7.5e-8);
}

TEST(TileSigmoidRcp, SigmoidOut16RcpWithin1p4e4RelativeOnEveryIsa) {
  // AVX-512 is SigmoidOut16 (below 1.4e-4 + 7.5e-8 |x|).
  check("sigmoid_out16_rcp", sigmoid_out16_rcp_for, 1.4e-4, 7.5e-8);
}

}  // namespace
}  // namespace strata::tile
