// The vector exp and sigmoid of tile/cpu/math-inl.h (used by the SiLU / sigmoid / softmax CPU kernels) on
// every ISA this host runs, against std::exp in double over the whole float range: a sweep of bit patterns
// from -inf to +inf (every 509th float, about 8.4 million values), the overflow and underflow edges, signed
// zeros, subnormal inputs and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tile/cpu/fast_math.h"
#include "tile/cpu/isa.h"

namespace strata::tile {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Inputs: the sweep plus the edges (exp overflows above 88.7228, is subnormal below -87.3365 and 0 below
// -103.972).
std::vector<float> inputs() {
  std::vector<float> x;
  for (uint64_t u = 0; u < 0x7f800000u; u += 509) {
    x.push_back(from_bits(static_cast<uint32_t>(u)));
    x.push_back(from_bits(static_cast<uint32_t>(u) | 0x80000000u));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float e : {0.f, -0.f, inf, -inf, 88.72283f, 88.72284f, 88.7f, 89.f, 89.5f, 1e30f, -87.33654f, -87.3366f,
                  -103.97f, -103.98f, -104.f, -104.5f, -1e30f, 1e-45f, -1e-45f, 0.34657f, -0.34657f, 0.5f, -0.5f,
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()})
    x.push_back(e);
  for (int k = -20; k <= 20; ++k) {  // around the range-reduction boundaries (n ln 2 / 2, odd n)
    const float b = static_cast<float>((2 * k + 1) * 0.34657359027997264);
    x.push_back(b);
    x.push_back(std::nextafter(b, inf));
    x.push_back(std::nextafter(b, -inf));
  }
  return x;
}

// |y - ref| in units of the last place of the float nearest ref (2^-149 for subnormal results).
double ulps(float y, double ref) {
  const double a = std::fabs(ref);
  const double ulp = a < static_cast<double>(std::numeric_limits<float>::min())
                         ? std::ldexp(1.0, -149)
                         : std::ldexp(1.0, std::ilogb(static_cast<float>(a)) - 23);
  return std::fabs(static_cast<double>(y) - ref) / ulp;
}

// The worst error of one function against its float64 reference, over inputs() on one ISA.
struct Worst {
  double ulps = 0;
  float x = 0;
};

// Runs fn_for(isa) over `x` and then over the special values `sp` on every ISA the host has; `error(x, y)`
// gives an output's error in ulps (negative: not counted, after asserting what it must) and `expect(sp, y)`
// checks the special values. Prints and bounds the worst error per ISA.
template <class Error, class Expect>
void check_every_isa(const char* what, FastMathArrayFn (*fn_for)(int64_t), double bound, std::vector<float> sp,
                     Error error, Expect expect) {
  const std::vector<float> x = inputs();
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const FastMathArrayFn fn = fn_for(isa.hwy_target);
    ASSERT_NE(fn, nullptr) << isa.name;
    std::vector<float> y(x.size());
    fn(x.data(), y.data(), static_cast<int64_t>(x.size()));
    Worst worst;
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = error(isa.name, x[i], y[i]);
      if (::testing::Test::HasFailure()) return;  // one failing input is enough to report
      if (e > worst.ulps) worst = {e, x[i]};
    }
    EXPECT_LE(worst.ulps, bound) << isa.name << ": worst at x = " << worst.x;
    std::printf("[          ] %s: %s max error %.3f ulp (at x = %.9g)\n", isa.name, what, worst.ulps, worst.x);
    std::vector<float> sy(sp.size());
    fn(sp.data(), sy.data(), static_cast<int64_t>(sp.size()));
    expect(isa.name, sy);
  }
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(TileFastMath, ExpWithinOneAndAHalfUlpOverTheFloatRangeOnEveryIsa) {
  // Measured 0.88 (AVX), 1.17 ulp.
  check_every_isa(
      "exp", fast_exp_for, 1.5, {kNan, -kNan, kInf, -kInf},
      [](const char* isa, float x, float y) -> double {
        const double ref = std::exp(static_cast<double>(x));
        if (std::isinf(static_cast<float>(ref))) {  // inf above the overflow edge (0 below 2^-150 is counted)
          EXPECT_TRUE(std::isinf(y) && y > 0) << isa << " exp(" << x << ") = " << y;
          return -1;
        }
        EXPECT_TRUE(std::isfinite(y) && y >= 0) << isa << " exp(" << x << ") = " << y;
        return ulps(y, ref);
      },
      [](const char* isa, const std::vector<float>& sy) {
        EXPECT_TRUE(std::isnan(sy[0]) && std::isnan(sy[1])) << isa;
        EXPECT_EQ(sy[2], kInf) << isa;
        EXPECT_EQ(sy[3], 0.f) << isa;
      });
}

TEST(TileFastMath, SigmoidWithinThreeUlpOverTheFloatRangeOnEveryIsa) {
  // Measured 2.84 ulp on AVX-512 (reciprocal estimate + one Newton step), 2.12 elsewhere (division): the
  // rounding of 1 + exp(-x) adds up to half an ulp on top of exp's error.
  check_every_isa(
      "sigmoid", fast_sigmoid_for, 3.0, {kNan, kInf, -kInf},
      [](const char* isa, float x, float y) -> double {
        const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
        EXPECT_TRUE(std::isfinite(y) && y >= 0 && y <= 1) << isa << " sigmoid(" << x << ") = " << y;
        // Below x = -88.7 exp(-x) overflows and the result is 0 where the true value is a subnormal < 2^-126:
        // accepted as an absolute error below FLT_MIN.
        if (std::fabs(static_cast<double>(y) - ref) <= std::numeric_limits<float>::min()) return -1;
        return ulps(y, ref);
      },
      [](const char* isa, const std::vector<float>& sy) {
        EXPECT_TRUE(std::isnan(sy[0])) << isa;
        EXPECT_EQ(sy[1], 1.f) << isa;
        EXPECT_EQ(sy[2], 0.f) << isa;
      });
}

// ExpLp / SigmoidLp (results rounded to bf16/f16): relative error below 4e-6 where the result is normal
// (measured 3.9e-6; checked against 5e-6; SigmoidLp 5e-6 + 7.5e-8 |x|); the clamped ends give an absolute error below e^-87 (tiny results)
// and a finite e^88 above x = 88 (ExpLp).
TEST(TileFastMath, LowPrecisionExpAndSigmoidWithin5e6RelativeOnEveryIsa) {
  const std::vector<float> x = inputs();
  const double tiny = std::exp(-87.0);
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    for (int sig = 0; sig < 2; ++sig) {
      const FastMathArrayFn fn = sig ? sigmoid_lp_for(isa.hwy_target) : exp_lp_for(isa.hwy_target);
      ASSERT_NE(fn, nullptr) << isa.name;
      std::vector<float> y(x.size());
      fn(x.data(), y.data(), static_cast<int64_t>(x.size()));
      double worst = 0;
      float worst_x = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double xd = static_cast<double>(x[i]);
        ASSERT_TRUE(std::isfinite(y[i]) && y[i] >= 0) << isa.name << (sig ? " sigmoid_lp(" : " exp_lp(") << x[i]
                                                      << ") = " << y[i];
        if (!sig && xd > 88.0) {
          EXPECT_NEAR(y[i] / std::exp(88.0), 1.0, 4e-6) << isa.name << " exp_lp(" << x[i] << ")";
          continue;
        }
        const double ref = sig ? 1.0 / (1.0 + std::exp(-xd)) : std::exp(xd);
        if (sig ? std::fabs(y[i] - ref) <= std::numeric_limits<float>::min() : (xd < -87.0 && y[i] <= tiny * 1.00001))
          continue;
        // SigmoidLp on AVX-512 forms e^-x from t = -x log2 e: 7.5e-8 |x| more (see ExpSum below).
        const double e = std::fabs(static_cast<double>(y[i]) - ref) / ref - (sig ? 7.5e-8 * std::fabs(xd) : 0.0);
        if (e > worst) worst = e, worst_x = x[i];
      }
      EXPECT_LE(worst, 5e-6) << isa.name << (sig ? " sigmoid_lp" : " exp_lp") << ": worst at x = " << worst_x;
      std::printf("[          ] %s: %s max relative error %.3g (at x = %.9g)\n", isa.name,
                  sig ? "sigmoid_lp" : "exp_lp", worst, worst_x);
      const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
      const float sp[4] = {nan, -nan, inf, -inf};
      float sy[4];
      fn(sp, sy, 4);
      EXPECT_TRUE(std::isnan(sy[0]) && std::isnan(sy[1])) << isa.name;
      if (sig) EXPECT_EQ(sy[2], 1.f) << isa.name;
      else EXPECT_NEAR(sy[2] / std::exp(88.0), 1.0, 4e-6) << isa.name;  // +inf clamps to x = 88
      EXPECT_LE(sy[3], sig ? std::numeric_limits<float>::min() : tiny * 1.00001) << isa.name;
    }
  }
}

// FastExpNonPos: the same bits as FastExp for every argument <= 0 (the sweep's negative half, -inf, -0) and NaN
// for NaN, on every ISA.
TEST(TileFastMath, ExpNonPosIsFastExpOnNonPositiveArgumentsOnEveryIsa) {
  std::vector<float> x;
  for (float v : inputs())
    if (!(v > 0.f)) x.push_back(v);
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const FastMathArrayFn fe = fast_exp_for(isa.hwy_target), fn = exp_nonpos_for(isa.hwy_target);
    ASSERT_NE(fn, nullptr) << isa.name;
    std::vector<float> ye(x.size()), yn(x.size());
    fe(x.data(), ye.data(), static_cast<int64_t>(x.size()));
    fn(x.data(), yn.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &ye[i], 4);
      std::memcpy(&b, &yn[i], 4);
      ASSERT_EQ(a, b) << isa.name << " x = " << x[i];
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float sp[2] = {nan, -nan};
    float sy[2];
    fn(sp, sy, 2);
    EXPECT_TRUE(std::isnan(sy[0]) && std::isnan(sy[1])) << isa.name;
  }
}

// ExpSum (softmax terms) and ScaledExpLp (bf16/f16 gradients) for arguments <= 0: on AVX-512 e^x = 2^f 2^floor(t)
// with t = x log2 e (the f32 constant is 1.3e-8 off, the product rounded once), so the relative error grows
// with |x| (7.3e-8 |x|) on top of the polynomial's (ExpSum: about an ulp; ScaledExpLp: 2.7e-6); elsewhere they
// are FastExpNonPos and ExpLp. Checked down to x = -87 (ExpLp's clamp): ExpSum <= 2^-23 + 7.5e-8 |x|,
// ScaledExpLp <= 4e-6 + 7.5e-8 |x|; below, a result between 0 and e^-87; -inf gives 0, NaN gives NaN.
TEST(TileFastMath, ExpSumAndScaledExpLpBoundedOnNonPositiveArgumentsOnEveryIsa) {
  std::vector<float> x;
  for (float v : inputs())
    if (!(v > 0.f)) x.push_back(v);
  for (int k = 0; k <= 64; ++k) x.push_back(-static_cast<float>(k) / 64);  // near 0, where f = t - floor(t) -> 1
  x.push_back(-1e-30f);
  const double tiny = std::exp(-87.0) * 1.00001;
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    for (int lp = 0; lp < 2; ++lp) {
      const char* what = lp ? "scaled_exp_lp" : "exp_sum";
      const FastMathArrayFn fn = lp ? scaled_exp_lp_for(isa.hwy_target) : exp_sum_for(isa.hwy_target);
      ASSERT_NE(fn, nullptr) << isa.name;
      std::vector<float> y(x.size());
      fn(x.data(), y.data(), static_cast<int64_t>(x.size()));
      double worst = 0;  // relative error over the allowance's |x|-independent part
      float worst_x = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double xd = static_cast<double>(x[i]);
        ASSERT_TRUE(std::isfinite(y[i]) && y[i] >= 0) << isa.name << " " << what << "(" << x[i] << ") = " << y[i];
        if (xd < -87.0) {
          EXPECT_LE(y[i], tiny) << isa.name << " " << what << "(" << x[i] << ")";
          continue;
        }
        const double ref = std::exp(xd);
        const double e = std::fabs(static_cast<double>(y[i]) - ref) / ref - std::fabs(xd) * 7.5e-8;
        if (e > worst) worst = e, worst_x = x[i];
      }
      EXPECT_LE(worst, lp ? 4e-6 : 2 * std::ldexp(1.0, -24)) << isa.name << " " << what << ": worst at x = " << worst_x;
      std::printf("[          ] %s: %s max relative error beyond 7.5e-8 |x|: %.3g (at x = %.9g)\n", isa.name, what,
                  worst, worst_x);
      const float sp[3] = {kNan, -kNan, -kInf};
      float sy[3];
      fn(sp, sy, 3);
      EXPECT_TRUE(std::isnan(sy[0]) && std::isnan(sy[1])) << isa.name << " " << what;
      EXPECT_LE(sy[2], lp ? tiny : 0.0) << isa.name << " " << what;
      EXPECT_GE(sy[2], 0.f) << isa.name << " " << what;
    }
  }
}

// Session 11: SigmoidOut16 (a sigmoid rounded straight to bf16 / f16: the clipped_swiglu, causal_conv1d and
// norm-before-gate rms_norm_gated forwards): relative error below 1.4e-4 + 7.5e-8 |x| (degree-3 2^f 7.5e-5, the
// 14-bit reciprocal 6.1e-5, the rounding of t = -x log2 e), 0.07 of a bf16 and 0.3 of an f16 half-ulp: at most
// 1.4e-4 * 2^24 ulp. Measured 1.11e-4 on AVX-512 (the other ISAs run SigmoidLp).
TEST(TileFastMath, SigmoidOut16Within1p4em4RelativeOnEveryIsa) {
  check_every_isa(
      "sigmoid_out16", sigmoid_out16_for, 1.4e-4 * 0x1p24, {kNan, -kNan, kInf, -kInf},
      [](const char* isa, float x, float y) -> double {
        const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
        EXPECT_TRUE(std::isfinite(y) && y >= 0 && y <= 1) << isa << " sigmoid_out16(" << x << ") = " << y;
        // Below x = -87.3 the result is 0 or subnormal where the true value is below FLT_MIN (as FastSigmoid).
        if (std::fabs(static_cast<double>(y) - ref) <= std::numeric_limits<float>::min()) return -1;
        return ulps(y, ref) - 7.5e-8 * std::fabs(static_cast<double>(x)) * 0x1p24;
      },
      [](const char* isa, const std::vector<float>& sy) {
        EXPECT_TRUE(std::isnan(sy[0]) && std::isnan(sy[1])) << isa;
        EXPECT_EQ(sy[2], 1.f) << isa;
        EXPECT_LE(sy[3], std::numeric_limits<float>::min()) << isa;
      });
}

}  // namespace
}  // namespace strata::tile

namespace strata::tile {
namespace {

// Session 17 (h17/cpu_fce2): the four-vector forms of tile/cpu/exp_n-inl.h give the bits of the one-vector functions
// on every ISA: FastExpN = FastExp (every input), ExpSumN = ExpSum and ScaledExpLpN = ScaledExpLp (arguments <= 0).
// Groups of four vectors whose exponents all lie in [-126, 127] take ExpClampedN's one-factor scaling (the blocks of
// moderate arguments below), the others its two factors (inputs() mixes huge and tiny magnitudes in every group).
TEST(TileFastMath, FourVectorFormsGiveTheOneVectorBitsOnEveryIsa) {
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<float> x;
    for (float v : inputs())
      if (kind == 0 || !(v > 0.f)) x.push_back(v);
    for (int k = 0; k < 4096; ++k) x.push_back(-static_cast<float>(k) * (87.f / 4096));
    if (kind == 0)
      for (int k = 0; k < 4096; ++k) x.push_back(static_cast<float>(k - 2048) * (88.f / 2048));
    for (const CpuIsa& isa : cpu_isas()) {
      if (!reject_cpu_isa(isa).empty()) continue;
      const FastMathArrayFn f1 = kind == 0 ? fast_exp_for(isa.hwy_target)
                                 : kind == 1 ? exp_sum_for(isa.hwy_target)
                                             : scaled_exp_lp_for(isa.hwy_target);
      const FastMathArrayFn f4 = kind == 0 ? fast_exp4_for(isa.hwy_target)
                                 : kind == 1 ? exp_sum4_for(isa.hwy_target)
                                             : scaled_exp_lp4_for(isa.hwy_target);
      ASSERT_NE(f4, nullptr) << isa.name;
      std::vector<float> y1(x.size()), y4(x.size());
      f1(x.data(), y1.data(), static_cast<int64_t>(x.size()));
      f4(x.data(), y4.data(), static_cast<int64_t>(x.size()));
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(y1[i])) {
          ASSERT_TRUE(std::isnan(y4[i])) << isa.name << " kind " << kind << " x = " << x[i];
          continue;
        }
        uint32_t a, b;
        std::memcpy(&a, &y1[i], 4);
        std::memcpy(&b, &y4[i], 4);
        ASSERT_EQ(a, b) << isa.name << " kind " << kind << " x = " << x[i] << ": " << y1[i] << " vs " << y4[i];
      }
    }
  }
}

}  // namespace
}  // namespace strata::tile
