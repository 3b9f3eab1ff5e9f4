// clipped_swiglu beyond the conformance driver (ops_fused.md §8): every validation rule (status, message, outputs
// untouched), gradients against float64 central differences (both layouts, GPT-OSS and DeepSeek constants,
// probs), the exact clamp-boundary gradients of the spec (A == limit passes, B == +-limit passes, beyond: 0),
// determinism (repeated runs, 1 vs 2 threads; CUDA backward run to run), and the C++ wrapper.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/testkit.h"
#include "test_support.h"

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, kCpu, poisoned, all_poison, ... (test_support.h)

using atk::HostTensor;

struct Consts {
  float alpha = 1.702f, limit = 7.f, bias = 1.f;
  int32_t interleaved = 1;
};

strata_status fwd(const HostTensor& x, const HostTensor* probs, HostTensor& y, const Consts& c) {
  strata_plan plan = nullptr;
  strata_status s = strata_clipped_swiglu_fwd_plan(&x.desc, dsc(probs), &y.desc, c.alpha, c.limit, c.bias,
                                                   c.interleaved, &plan);
  if (s != STRATA_SUCCESS) return s;
  void* t[] = {dat(&x), dat(probs), dat(&y)};
  s = strata_plan_run(plan, t, 3, nullptr, 0, nullptr);
  strata_plan_destroy(plan);
  return s;
}
strata_status bwd(const HostTensor& x, const HostTensor* probs, const HostTensor& dy, HostTensor& dx, HostTensor* dp,
                  const Consts& c) {
  strata_plan plan = nullptr;
  strata_status s = strata_clipped_swiglu_bwd_plan(&x.desc, dsc(probs), &dy.desc, &dx.desc, dsc(dp), c.alpha, c.limit,
                                                   c.bias, c.interleaved, &plan);
  if (s != STRATA_SUCCESS) return s;
  void* t[] = {dat(&x), dat(probs), dat(&dy), dat(&dx), dat(dp)};
  s = strata_plan_run(plan, t, 5, nullptr, 0, nullptr);
  strata_plan_destroy(plan);
  return s;
}

// ---------------------------------------------------------------------------------------------- validation

struct V {
  HostTensor x = rnd(STRATA_DTYPE_F32, {4, 16}, 1), p = rnd(STRATA_DTYPE_F32, {4}, 2);
  HostTensor y = poisoned(STRATA_DTYPE_F32, {4, 8});
  void expect(strata_status got, strata_status st, const std::string& needle) {
    const std::string msg = strata_get_last_error_message();
    EXPECT_EQ(got, st) << strata_status_name(got) << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    EXPECT_TRUE(all_poison(y)) << "y written by a rejected call: " << needle;
  }
};

TEST(ClippedSwigluValidation, NullRule) {
  V v;
  strata_plan plan = nullptr;
  v.expect(strata_clipped_swiglu_fwd_plan(&v.x.desc, nullptr, nullptr, 1.702f, 7.f, 1.f, 1, &plan),
           STRATA_ERROR_NULL_POINTER, "clipped_swiglu_fwd: y must not be NULL");
}

TEST(ClippedSwigluValidation, DeviceRule) {
  V v;
  HostTensor p2 = v.p;
  p2.desc.device = {STRATA_DEVICE_CPU, 2};
  v.expect(fwd(v.x, &p2, v.y, {}), STRATA_ERROR_INVALID_DEVICE, "probs");
}

TEST(ClippedSwigluValidation, WrongDtypes) {
  V v;
  HostTensor xi = HostTensor::make(STRATA_DTYPE_I32, {4, 16});
  v.expect(fwd(xi, nullptr, v.y, {}), STRATA_ERROR_INVALID_DTYPE, "x has dtype i32");
  HostTensor yb = poisoned(STRATA_DTYPE_BF16, {4, 8});
  EXPECT_EQ(fwd(v.x, nullptr, yb, {}), STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y has dtype bf16, expected one of f32"),
            std::string::npos);
  EXPECT_TRUE(all_poison(yb));
  HostTensor pi = HostTensor::make(STRATA_DTYPE_I64, {4});
  v.expect(fwd(v.x, &pi, v.y, {}), STRATA_ERROR_INVALID_DTYPE, "probs has dtype i64");
}

TEST(ClippedSwigluValidation, OddLastDimension) {
  V v;
  HostTensor x5 = rnd(STRATA_DTYPE_F32, {4, 15}, 1);
  v.expect(fwd(x5, nullptr, v.y, {}), STRATA_ERROR_INVALID_SHAPE, "x.shape[-1] must be even");
}

TEST(ClippedSwigluValidation, MismatchedShapes) {
  V v;
  HostTensor y2 = poisoned(STRATA_DTYPE_F32, {4, 16});
  EXPECT_EQ(fwd(v.x, nullptr, y2, {}), STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y must have shape [4, 8]"), std::string::npos)
      << strata_get_last_error_message();
  EXPECT_TRUE(all_poison(y2));
  HostTensor p5 = rnd(STRATA_DTYPE_F32, {5}, 2);
  v.expect(fwd(v.x, &p5, v.y, {}), STRATA_ERROR_INVALID_SHAPE, "probs must have shape [4]");
}

TEST(ClippedSwigluValidation, OutputsMustNotAlias) {
  V v;
  HostTensor y0 = v.y;
  y0.desc.strides[0] = 0;
  EXPECT_EQ(fwd(v.x, nullptr, y0, {}), STRATA_ERROR_INVALID_STRIDE);
  EXPECT_TRUE(all_poison(y0));
}

TEST(ClippedSwigluValidation, AttributeRules) {
  V v;
  v.expect(fwd(v.x, nullptr, v.y, {1.702f, 0.f, 1.f, 1}), STRATA_ERROR_INVALID_ATTRIBUTE, "limit must be > 0");
  v.expect(fwd(v.x, nullptr, v.y, {1.702f, std::nanf(""), 1.f, 1}), STRATA_ERROR_INVALID_ATTRIBUTE, "limit must be > 0");
  v.expect(fwd(v.x, nullptr, v.y, {INFINITY, 7.f, 1.f, 1}), STRATA_ERROR_INVALID_ATTRIBUTE, "alpha must be finite");
  v.expect(fwd(v.x, nullptr, v.y, {1.702f, 7.f, std::nanf(""), 1}), STRATA_ERROR_INVALID_ATTRIBUTE, "bias must be finite");
  v.expect(fwd(v.x, nullptr, v.y, {1.702f, 7.f, 1.f, 3}), STRATA_ERROR_INVALID_ATTRIBUTE, "interleaved must be 0 or 1");
}

TEST(ClippedSwigluValidation, DprobsNeedsProbs) {
  V v;
  HostTensor dy = rnd(STRATA_DTYPE_F32, {4, 8}, 3), dx = poisoned(STRATA_DTYPE_F32, {4, 16});
  HostTensor dp = poisoned(STRATA_DTYPE_F32, {4});
  EXPECT_EQ(bwd(v.x, nullptr, dy, dx, &dp, {}), STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("dprobs must be NULL when probs is NULL"),
            std::string::npos);
  EXPECT_TRUE(all_poison(dx) && all_poison(dp));
}

// ---------------------------------------------------------------------------------------------- gradients

void fd_check(const Consts& c, bool probs) {
  const int32_t f64 = STRATA_DTYPE_F64;
  const int64_t rows = 3, I = 10;
  HostTensor x = rnd(f64, {rows, 2 * I}, 31, 0.0, 4.0), p = rnd(f64, {rows}, 32, 0.5, 0.2);
  HostTensor R = rnd(f64, {rows, I}, 33);
  // Keep finite differences away from the kinks at +-limit.
  for (int64_t e = 0; e < x.numel(); ++e)
    if (std::fabs(std::fabs(x.get(e)) - c.limit) < 1e-3) x.set(e, x.get(e) + 0.01);
  auto loss = [&]() {
    HostTensor y = HostTensor::make(f64, {rows, I});
    EXPECT_EQ(fwd(x, probs ? &p : nullptr, y, c), STRATA_SUCCESS) << strata_get_last_error_message();
    double l = 0;
    for (int64_t e = 0; e < rows * I; ++e) l += y.get(e) * R.get(e);
    return l;
  };
  HostTensor dx = HostTensor::make(f64, {rows, 2 * I}), dp = HostTensor::make(f64, {rows});
  ASSERT_EQ(bwd(x, probs ? &p : nullptr, R, dx, probs ? &dp : nullptr, c), STRATA_SUCCESS)
      << strata_get_last_error_message();
  auto check = [&](HostTensor& in, const HostTensor& grad, const char* name) {
    double num = 0, den = 0;
    for (int64_t e = 0; e < in.numel(); ++e) {
      const double v0 = in.get(e), h = 1e-6 * std::max(1.0, std::fabs(v0));
      in.set(e, v0 + h);
      const double lp = loss();
      in.set(e, v0 - h);
      const double lm = loss();
      in.set(e, v0);
      const double fd = (lp - lm) / (2 * h);
      num += (fd - grad.get(e)) * (fd - grad.get(e));
      den += fd * fd;
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-7) << name << " interleaved=" << c.interleaved;
  };
  check(x, dx, "dx");
  if (probs) check(p, dp, "dprobs");
}

TEST(ClippedSwigluGradients, GptOssInterleavedMatchesFiniteDifferences) { fd_check({1.702f, 7.f, 1.f, 1}, false); }
TEST(ClippedSwigluGradients, GptOssSplitWithProbsMatchesFiniteDifferences) { fd_check({1.702f, 7.f, 1.f, 0}, true); }
TEST(ClippedSwigluGradients, DeepSeekSplitMatchesFiniteDifferences) { fd_check({1.f, 10.f, 0.f, 0}, true); }
TEST(ClippedSwigluGradients, CustomInterleavedWithProbsMatchesFiniteDifferences) { fd_check({0.5f, 3.f, -0.5f, 1}, true); }

// The spec's boundary conventions, on every CPU implementation and dtype: the clamp gradients pass at the
// boundary (A == limit, B == +-limit) and are zero beyond it.
TEST(ClippedSwiglu, ClampBoundaryGradients) {
  for (int32_t dt : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F64})
    for (const std::string& impl : atk::impls_for("clipped_swiglu_bwd", kCpu)) {
      if (dt == STRATA_DTYPE_F64 && impl != "reference") continue;
      ForceImpl force(impl.c_str());
      // 20 pairs (interleaved) so the vector path and the tail both see every case; pairs cycle through:
      // A = 7 (passes), A = 7.5 (blocked), B = 7 (passes), B = -7 (passes), B = 8 / -8 (blocked), interior.
      const int64_t I = 20;
      const double As[] = {7, 7.5, 1, 1, 1, 1, 1};
      const double Bs[] = {0.5, 0.5, 7, -7, 8, -8, 0.5};
      HostTensor x = HostTensor::make(dt, {1, 2 * I}), dy = HostTensor::make(dt, {1, I});
      HostTensor dx = poisoned(dt, {1, 2 * I});
      for (int64_t i = 0; i < I; ++i) {
        x.set(2 * i, As[i % 7]);
        x.set(2 * i + 1, Bs[i % 7]);
        dy.set(i, 1.0);
      }
      ASSERT_EQ(bwd(x, nullptr, dy, dx, nullptr, {}), STRATA_SUCCESS) << strata_get_last_error_message();
      for (int64_t i = 0; i < I; ++i) {
        const double A = As[i % 7], B = Bs[i % 7];
        const double a = std::min(A, 7.0), b = std::clamp(B, -7.0, 7.0), s = 1 / (1 + std::exp(-1.702 * a));
        const double dA = A <= 7 ? (b + 1) * s * (1 + 1.702 * a * (1 - s)) : 0.0;
        const double dB = (B >= -7 && B <= 7) ? a * s : 0.0;
        const double tol = dt == STRATA_DTYPE_BF16 ? 1e-2 : 1e-5;
        EXPECT_NEAR(dx.get(2 * i), dA, tol * std::max(1.0, std::fabs(dA))) << impl << " pair " << i;
        EXPECT_NEAR(dx.get(2 * i + 1), dB, tol * std::max(1.0, std::fabs(dB))) << impl << " pair " << i;
        if (dA == 0.0) EXPECT_EQ(dx.get(2 * i), 0.0) << impl << " pair " << i << ": blocked gate must be exactly 0";
        if (dB == 0.0) EXPECT_EQ(dx.get(2 * i + 1), 0.0) << impl << " pair " << i << ": blocked linear must be 0";
      }
    }
}

// ---------------------------------------------------------------------------------------------- determinism

std::vector<std::vector<uint8_t>> bits(int32_t dt, int64_t rows, int64_t I, int32_t inter) {
  HostTensor x = rnd(dt, {rows, 2 * I}, 41, 0.0, 4.0), p = rnd(STRATA_DTYPE_F32, {rows}, 42, 0.5, 0.2);
  HostTensor dy = rnd(dt, {rows, I}, 43), y = poisoned(dt, {rows, I}), dx = poisoned(dt, {rows, 2 * I});
  HostTensor dp = poisoned(STRATA_DTYPE_F32, {rows});
  const Consts c{1.702f, 7.f, 1.f, inter};
  EXPECT_EQ(fwd(x, &p, y, c), STRATA_SUCCESS) << strata_get_last_error_message();
  EXPECT_EQ(bwd(x, &p, dy, dx, &dp, c), STRATA_SUCCESS) << strata_get_last_error_message();
  return {y.storage, dx.storage, dp.storage};
}

TEST(ClippedSwigluDeterminism, BitwiseAcrossRunsAndThreadCounts) {
  const int32_t before = strata_get_num_threads();
  for (const std::string& impl : atk::impls_for("clipped_swiglu_bwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (int32_t inter : {0, 1}) {
      ASSERT_EQ(strata_set_num_threads(2), STRATA_SUCCESS);
      const auto first = bits(STRATA_DTYPE_BF16, 600, 360, inter);
      EXPECT_EQ(bits(STRATA_DTYPE_BF16, 600, 360, inter), first) << impl << ": repeated run differs";
      ASSERT_EQ(strata_set_num_threads(1), STRATA_SUCCESS);
      EXPECT_EQ(bits(STRATA_DTYPE_BF16, 600, 360, inter), first) << impl << ": 1 vs 2 threads differ";
    }
  }
  strata_set_num_threads(before);
}

// CUDA backward run to run: every CUDA implementation forced, bf16 and f32, both layouts, with probs (dprobs is
// a per-row reduction over I, the part an unordered sum would make vary): dx and dprobs the same bits on every
// run. Rows = 2100 (several waves of the persistent kernels), I = 2880 (GPT-OSS's 2I = 5760).
TEST(ClippedSwigluDeterminism, CudaBackwardBitsRunToRun) {
  int32_t ndev = 0;
  if (strata_device_count(STRATA_DEVICE_CUDA, &ndev) != STRATA_SUCCESS || ndev == 0) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  const int64_t rows = 2100, I = 2880;
  int ran = 0;
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F32}) {
    const HostTensor x = rnd(dt, {rows, 2 * I}, 51, 0.0, 4.0), p = rnd(STRATA_DTYPE_F32, {rows}, 52, 0.5, 0.2);
    const HostTensor dy = rnd(dt, {rows, I}, 53), dx = poisoned(dt, {rows, 2 * I});
    const HostTensor dp = poisoned(STRATA_DTYPE_F32, {rows});
    const atk::DeviceTensor xd(x, dev), pd(p, dev), dyd(dy, dev);
    for (const std::string& impl : atk::impls_for("clipped_swiglu_bwd", dev))
      for (int32_t inter : {0, 1}) {
        strata_plan plan = nullptr;
        strata_status ps;
        {
          ForceImpl force(impl.c_str());
          ps = strata_clipped_swiglu_bwd_plan(&xd.desc(), &pd.desc(), &dyd.desc(), &xd.desc(), &pd.desc(), 1.702f, 7.f,
                                              1.f, inter, &plan);
        }
        if (ps == STRATA_ERROR_NO_IMPLEMENTATION) continue;  // a form whose plan rule leaves this problem out
        ASSERT_EQ(ps, STRATA_SUCCESS) << impl << ": " << strata_get_last_error_message();
        ++ran;
        std::vector<uint8_t> first_dx, first_dp;
        for (int run = 0; run < 3; ++run) {
          atk::DeviceTensor dxd(dx, dev), dpd(dp, dev);  // poisoned every run
          void* t[] = {xd.data(), pd.data(), dyd.data(), dxd.data(), dpd.data()};
          ASSERT_EQ(strata_plan_run(plan, t, 5, nullptr, 0, nullptr), STRATA_SUCCESS)
              << strata_get_last_error_message();
          strata_device_synchronize(dev);
          HostTensor gx = dx, gp = dp;
          dxd.download(gx), dpd.download(gp);
          EXPECT_FALSE(all_poison(gx) || all_poison(gp)) << impl << ": nothing written";
          if (run == 0) {
            first_dx = gx.storage, first_dp = gp.storage;
            continue;
          }
          EXPECT_EQ(gx.storage, first_dx) << impl << " dtype " << dt << " interleaved " << inter << ": dx differs";
          EXPECT_EQ(gp.storage, first_dp) << impl << " dtype " << dt << " interleaved " << inter << ": dprobs differs";
        }
        strata_plan_destroy(plan);
      }
  }
  EXPECT_GE(ran, 4) << "the dispatched implementation takes all four dtype x layout problems";
}

TEST(ClippedSwiglu, CppWrapper) {
  Tensor x = Tensor::empty(STRATA_DTYPE_F32, {3, 8});
  for (int i = 0; i < 24; ++i) static_cast<float*>(x.data())[i] = 0.7f * static_cast<float>(i % 13) - 4.f;
  ClippedSwigluOptions o;
  o.interleaved = false;
  Tensor y = clipped_swiglu_fwd(x, nullptr, o);
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{3, 4}));
  const float* xs = static_cast<const float*>(x.data());
  const double A = xs[8 + 1], B = xs[8 + 4 + 1];  // row 1 (8 elements), pair 1 (split: B at I + 1)
  const double a = std::min(A, 7.0), b = std::clamp(B, -7.0, 7.0);
  EXPECT_NEAR(static_cast<float*>(y.data())[5], a / (1 + std::exp(-1.702 * a)) * (b + 1), 1e-5);
  auto [dx, dp] = clipped_swiglu_bwd(x, nullptr, y, o);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(dp.data(), nullptr);
}

}  // namespace
}  // namespace strata
