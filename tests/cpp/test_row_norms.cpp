// l2norm and rmsnorm_without_weight beyond the conformance driver: every validation rule (status, message,
// nothing written), gradients against float64 finite differences, determinism (repeated runs and thread
// counts), plan reuse with new pointers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "opbase/tensor.h"
#include "strata/ops.h"

namespace strata {
namespace {

strata_tensor_desc desc(int32_t dt, std::vector<int64_t> shape) { return make_desc(dt, shape); }

// Creates a plan, expects `status` and a message containing `needle`.
template <class F>
void expect_plan_error(F&& make, strata_status status, const std::string& needle) {
  strata_plan plan = nullptr;
  const strata_status s = make(&plan);
  EXPECT_EQ(s, status) << strata_get_last_error_message();
  EXPECT_NE(std::string(strata_get_last_error_message()).find(needle), std::string::npos)
      << "message: " << strata_get_last_error_message() << "\nexpected to contain: " << needle;
  EXPECT_EQ(plan, nullptr);
}

TEST(RowNormValidation, L2normFwdRules) {
  const auto x = desc(STRATA_DTYPE_F32, {4, 8}), y = desc(STRATA_DTYPE_F32, {4, 8}), r = desc(STRATA_DTYPE_F32, {4});
  auto plan = [&](const strata_tensor_desc* a, const strata_tensor_desc* b, const strata_tensor_desc* c, float eps) {
    return [=](strata_plan* p) { return strata_l2norm_fwd_plan(a, b, c, eps, p); };
  };
  // null
  expect_plan_error(plan(nullptr, &y, &r, 1e-6f), STRATA_ERROR_NULL_POINTER, "l2norm_fwd: x must not be NULL");
  expect_plan_error(plan(&x, nullptr, &r, 1e-6f), STRATA_ERROR_NULL_POINTER, "y must not be NULL");
  expect_plan_error(plan(&x, &y, nullptr, 1e-6f), STRATA_ERROR_NULL_POINTER, "rstd must not be NULL");
  EXPECT_EQ(strata_l2norm_fwd_plan(&x, &y, &r, 1e-6f, nullptr), STRATA_ERROR_NULL_POINTER);
  // device
  auto ycuda = y;
  ycuda.device = {STRATA_DEVICE_CUDA, 0};
  strata_plan p = nullptr;
  const strata_status s = strata_l2norm_fwd_plan(&x, &ycuda, &r, 1e-6f, &p);
  EXPECT_TRUE(s == STRATA_ERROR_INVALID_DEVICE || s == STRATA_ERROR_DEVICE_UNAVAILABLE) << strata_status_name(s);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y"), std::string::npos);
  auto xbad = x;
  xbad.device = {7, 0};
  expect_plan_error(plan(&xbad, &y, &r, 1e-6f), STRATA_ERROR_INVALID_DEVICE, "x");
  // dtype
  const auto xi = desc(STRATA_DTYPE_I32, {4, 8});
  expect_plan_error(plan(&xi, &y, &r, 1e-6f), STRATA_ERROR_INVALID_DTYPE, "x has dtype i32, expected one of f32");
  const auto rb = desc(STRATA_DTYPE_BF16, {4});
  expect_plan_error(plan(&x, &y, &rb, 1e-6f), STRATA_ERROR_INVALID_DTYPE, "rstd has dtype bf16, expected one of f32");
  // shape
  const auto y2 = desc(STRATA_DTYPE_F32, {4, 9});
  expect_plan_error(plan(&x, &y2, &r, 1e-6f), STRATA_ERROR_INVALID_SHAPE, "y must have shape [4, 8] (the shape of x), got [4, 9]");
  const auto r2 = desc(STRATA_DTYPE_F32, {5});
  expect_plan_error(plan(&x, &y, &r2, 1e-6f), STRATA_ERROR_INVALID_SHAPE, "rstd must have shape [4]");
  const auto x0 = desc(STRATA_DTYPE_F32, {});
  expect_plan_error(plan(&x0, &y, &r, 1e-6f), STRATA_ERROR_INVALID_SHAPE, "x must have rank 1..8");
  auto xneg = x;
  xneg.shape[0] = -1;
  expect_plan_error(plan(&xneg, &y, &r, 1e-6f), STRATA_ERROR_INVALID_SHAPE, "negative size");
  // strides
  auto xs = x;
  xs.strides[0] = -8;
  expect_plan_error(plan(&xs, &y, &r, 1e-6f), STRATA_ERROR_INVALID_STRIDE, "x has a negative stride");
  auto ys = y;
  ys.strides[0] = 0;
  expect_plan_error(plan(&x, &ys, &r, 1e-6f), STRATA_ERROR_INVALID_STRIDE, "output y has stride 0");
  // attributes
  expect_plan_error(plan(&x, &y, &r, NAN), STRATA_ERROR_INVALID_ATTRIBUTE, "eps must be finite and >= 0, got nan");
  expect_plan_error(plan(&x, &y, &r, -1.f), STRATA_ERROR_INVALID_ATTRIBUTE, "eps must be finite and >= 0");
}

TEST(RowNormValidation, RmsnormRules) {
  const auto x = desc(STRATA_DTYPE_BF16, {4, 8}), r = desc(STRATA_DTYPE_F32, {4, 1});
  strata_plan p = nullptr;
  EXPECT_EQ(strata_rmsnorm_without_weight_fwd_plan(&x, &x, &r, 1e-6f, 7, &p), STRATA_ERROR_INVALID_ATTRIBUTE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("mode must be"), std::string::npos);
  EXPECT_EQ(strata_rmsnorm_without_weight_fwd_plan(&x, &x, &r, 1e-6f, STRATA_RMSNORM_FACTOR, &p),
            STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y must be NULL in factor mode"), std::string::npos);
  const auto r_wrong = desc(STRATA_DTYPE_F32, {4});
  EXPECT_EQ(strata_rmsnorm_without_weight_fwd_plan(&x, &x, &r_wrong, 1e-6f, STRATA_RMSNORM_NORMALIZE, &p),
            STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("r must have shape [4, 1]"), std::string::npos);
  // factor mode: r may be bf16 (a result), normalize mode: r is the saved f32 factor.
  const auto rb = desc(STRATA_DTYPE_BF16, {4, 1});
  ASSERT_EQ(strata_rmsnorm_without_weight_fwd_plan(&x, nullptr, &rb, 1e-6f, STRATA_RMSNORM_FACTOR, &p), STRATA_SUCCESS);
  strata_plan_destroy(p);
  EXPECT_EQ(strata_rmsnorm_without_weight_fwd_plan(&x, &x, &rb, 1e-6f, STRATA_RMSNORM_NORMALIZE, &p),
            STRATA_ERROR_INVALID_DTYPE);
  // bwd factor: dr has r's shape
  const auto dr_wrong = desc(STRATA_DTYPE_BF16, {4, 8});
  EXPECT_EQ(strata_rmsnorm_without_weight_bwd_plan(&x, &r, &dr_wrong, &x, STRATA_RMSNORM_FACTOR, &p),
            STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("dr must have shape [4, 1]"), std::string::npos);
}

// Run-time checks: wrong tensor count, NULL tensor, workspace, and nothing written on failure.
TEST(RowNormValidation, RunRulesWriteNothing) {
  const auto x = desc(STRATA_DTYPE_F32, {2, 4}), r = desc(STRATA_DTYPE_F32, {2});
  strata_plan p = nullptr;
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-6f, &p), STRATA_SUCCESS);
  std::vector<float> xv(8, 1.f), yv(8, -7.f), rv(2, -7.f);
  void* t[] = {xv.data(), yv.data(), rv.data()};
  EXPECT_EQ(strata_plan_run(p, t, 2, nullptr, 0, nullptr), STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("takes 3 tensors, got num_tensors = 2"), std::string::npos);
  void* tn[] = {xv.data(), nullptr, rv.data()};
  EXPECT_EQ(strata_plan_run(p, tn, 3, nullptr, 0, nullptr), STRATA_ERROR_NULL_POINTER);
  EXPECT_EQ(strata_plan_run(nullptr, t, 3, nullptr, 0, nullptr), STRATA_ERROR_INVALID_HANDLE);
  for (float v : yv) EXPECT_EQ(v, -7.f);
  for (float v : rv) EXPECT_EQ(v, -7.f);
  ASSERT_EQ(strata_plan_run(p, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
  EXPECT_FLOAT_EQ(yv[0], 0.5f);
  strata_plan_destroy(p);
}

// Central finite differences of the float64 forward against the backward, for L = sum(w * out).
void fd_check(bool l2, int32_t mode) {
  const int64_t rows = 3, D = 5;
  std::mt19937_64 rng(11);
  std::normal_distribution<double> nd;
  std::vector<double> x(rows * D), w(rows * (mode == STRATA_RMSNORM_FACTOR ? 1 : D));
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  const auto xd = desc(STRATA_DTYPE_F64, {rows, D});
  const auto rd = l2 ? desc(STRATA_DTYPE_F64, {rows}) : desc(STRATA_DTYPE_F64, {rows, 1});
  const bool factor = mode == STRATA_RMSNORM_FACTOR;
  const float eps = 1e-3f;
  auto forward = [&](const std::vector<double>& in, std::vector<double>& y, std::vector<double>& r) {
    strata_plan p = nullptr;
    y.assign(rows * D, 0);
    r.assign(rows, 0);
    const strata_status s = l2 ? strata_l2norm_fwd_plan(&xd, &xd, &rd, eps, &p)
                               : strata_rmsnorm_without_weight_fwd_plan(&xd, factor ? nullptr : &xd, &rd, eps, mode, &p);
    ASSERT_EQ(s, STRATA_SUCCESS) << strata_get_last_error_message();
    void* t[] = {const_cast<double*>(in.data()), factor ? nullptr : y.data(), r.data()};
    ASSERT_EQ(strata_plan_run(p, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
    strata_plan_destroy(p);
  };
  auto loss = [&](const std::vector<double>& in) {
    std::vector<double> y, r;
    forward(in, y, r);
    double L = 0;
    for (size_t i = 0; i < w.size(); ++i) L += w[i] * (factor ? r[i] : y[i]);
    return L;
  };
  std::vector<double> y, r;
  forward(x, y, r);
  std::vector<double> dx(rows * D);
  strata_plan p = nullptr;
  const auto gd = factor ? rd : xd;
  const strata_status s = l2 ? strata_l2norm_bwd_plan(&xd, &rd, &xd, &xd, &p)
                             : strata_rmsnorm_without_weight_bwd_plan(&xd, &rd, &gd, &xd, mode, &p);
  ASSERT_EQ(s, STRATA_SUCCESS) << strata_get_last_error_message();
  void* t[] = {l2 ? y.data() : x.data(), r.data(), w.data(), dx.data()};
  ASSERT_EQ(strata_plan_run(p, t, 4, nullptr, 0, nullptr), STRATA_SUCCESS);
  strata_plan_destroy(p);
  const double h = 1e-6;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (loss(xp) - loss(xm)) / (2 * h);
    num += (fd - dx[i]) * (fd - dx[i]);
    den += fd * fd;
  }
  // l2norm's backward drops an O(eps * rstd^2) term (spec §4.1), so it is compared with a matching tolerance.
  EXPECT_LT(std::sqrt(num / den), l2 ? 1e-3 : 1e-7);
}

TEST(RowNormGradients, L2normMatchesFiniteDifferences) { fd_check(true, 0); }
TEST(RowNormGradients, RmsnormNormalizeMatchesFiniteDifferences) { fd_check(false, STRATA_RMSNORM_NORMALIZE); }
TEST(RowNormGradients, RmsnormFactorMatchesFiniteDifferences) { fd_check(false, STRATA_RMSNORM_FACTOR); }

// Same inputs, same bits: repeated runs, and 1 vs 2 threads, on every CPU implementation.
TEST(RowNormDeterminism, BitwiseAcrossRunsAndThreads) {
  const int64_t rows = 4099, D = 384;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(rows * D);
  for (auto& v : x) v = nd(rng);
  const auto xd = desc(STRATA_DTYPE_F32, {rows, D}), rd = desc(STRATA_DTYPE_F32, {rows});
  const char* names[16];
  const int n = strata_op_impl_names("l2norm_fwd", names, 16);
  ASSERT_GT(n, 0);
  for (int i = 0; i < n; ++i) {
    if (std::strncmp(names[i], "cuda", 4) == 0) continue;
    strata_set_force_impl(names[i]);
    strata_plan p = nullptr;
    if (strata_l2norm_fwd_plan(&xd, &xd, &rd, 1e-6f, &p) != STRATA_SUCCESS) continue;  // ISA absent here
    std::vector<std::vector<float>> ys;
    for (int threads : {1, 2, 2, 1}) {
      ASSERT_EQ(strata_set_num_threads(threads), STRATA_SUCCESS);
      std::vector<float> y(rows * D), r(rows);
      void* t[] = {x.data(), y.data(), r.data()};
      ASSERT_EQ(strata_plan_run(p, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
      y.insert(y.end(), r.begin(), r.end());
      ys.push_back(std::move(y));
    }
    for (size_t k = 1; k < ys.size(); ++k)
      EXPECT_EQ(std::memcmp(ys[0].data(), ys[k].data(), ys[0].size() * sizeof(float)), 0) << names[i];
    strata_plan_destroy(p);
  }
  strata_set_force_impl(nullptr);
  strata_set_num_threads(0);
}

// Outputs above the streaming threshold (4 MiB) take non-temporal stores. On SSE4 a bf16/f16 result of one f32
// vector is half a vector, which Highway's x86 Stream would write as a full 16-byte movntdq (8 bytes past the
// data, and a fault on an address that is 8 but not 16 bytes aligned). Every CPU implementation, an output
// that starts 8 bytes off 16-byte alignment, and a canary after its end.
TEST(RowNormCpu, StreamingStoresStayInsideTheOutputOnEveryIsa) {
  const int64_t rows = 8192, D = 264;  // 4.1 MiB of bf16; D * 2 bytes = 528: every row start 16-byte aligned + 0
  const char* names[32];
  const int32_t n = strata_op_impl_names("l2norm_fwd", names, 32);
  ASSERT_GT(n, 0);
  std::vector<uint16_t> x(rows * D), ybuf(rows * D + 4 + 64, 0x5a5a);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = f32_to_bf16_bits(nd(rng));
  uint16_t* y = ybuf.data() + 4;  // 8 bytes past the vector's (16-byte aligned) start
  std::vector<float> rstd(rows);
  int ran = 0;
  for (int32_t i = 0; i < n; ++i) {
    const std::string impl = names[i];
    if (impl.rfind("cpu.", 0) != 0) continue;
    ASSERT_EQ(strata_set_force_impl(impl.c_str()), STRATA_SUCCESS);
    const auto xd = desc(STRATA_DTYPE_BF16, {rows, D}), yd = desc(STRATA_DTYPE_BF16, {rows, D});
    const auto rd = desc(STRATA_DTYPE_F32, {rows});
    strata_plan plan = nullptr;
    const strata_status st = strata_l2norm_fwd_plan(&xd, &yd, &rd, 1e-6f, &plan);
    if (st != STRATA_SUCCESS) continue;  // an ISA this host lacks
    std::fill(ybuf.begin(), ybuf.end(), uint16_t{0x5a5a});
    void* t[3] = {x.data(), y, rstd.data()};
    ASSERT_EQ(strata_plan_run(plan, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS) << impl;
    strata_plan_destroy(plan);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(ybuf[k], 0x5a5a) << impl << ": wrote before the output";
    for (size_t k = 4 + rows * D; k < ybuf.size(); ++k) ASSERT_EQ(ybuf[k], 0x5a5a) << impl << ": wrote past the output";
    // Spot check a row: |y| = 1.
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += std::pow(bf16_bits_to_f32(y[(rows - 1) * D + j]), 2);
    EXPECT_NEAR(ss, 1.0, 2e-2) << impl;
    ++ran;
  }
  strata_set_force_impl(nullptr);
  EXPECT_GT(ran, 0);
}

}  // namespace
}  // namespace strata
