// fused_cross_entropy beyond the conformance driver (ops_fused.md §1): every validation rule (status, message,
// outputs untouched), the run-time target and aliasing checks, gradients against float64 central finite
// differences (fused forward and backward op, every reduction, every option), determinism (repeated runs, 1 vs
// 2 threads), in place == separate dlogits, the mean over zero rows, CUDA run-to-run bits, CUDA out-of-range
// targets (error, nothing written), the C++ wrapper (host tensors, and CUDA tensors when a GPU is present).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

constexpr int64_t kIg = -100;

struct Opts {
  int32_t reduction = STRATA_LOSS_REDUCTION_MEAN;
  float ls = 0.f, scale = 1.f, lambda = 0.f, cap = 0.f, grad_scale = 1.f;
};

// A forward problem on the host: logits [N, V], targets, outputs poisoned.
struct Fwd {
  HostTensor logits, target, loss, lse, z, dl;
  Fwd(int32_t dtype, int64_t N, int64_t V, int32_t reduction, uint64_t seed, int64_t ignore_every = 3) {
    std::mt19937_64 rng(seed);
    logits = HostTensor::make(dtype, {N, V});
    logits.fill_normal(rng, 0.0, 2.0);
    target = HostTensor::make(STRATA_DTYPE_I64, {N});
    for (int64_t i = 0; i < N; ++i)
      target.set(i, ignore_every > 0 && i % ignore_every == ignore_every - 1 ? kIg : static_cast<double>((i * 7 + 3) % V));
    const int32_t sd = dtype == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    const std::vector<int64_t> ls = reduction == 0 ? std::vector<int64_t>{N} : std::vector<int64_t>{};
    loss = HostTensor::make(sd, ls);
    z = HostTensor::make(sd, ls);
    lse = HostTensor::make(sd, {N});
    dl = HostTensor::make(dtype, {N, V});
    loss.poison(), z.poison(), lse.poison(), dl.poison();
  }
};

void* data(const HostTensor& t) { return const_cast<uint8_t*>(t.storage.data()); }

// mode: 0 no gradient, 1 separate dlogits, 2 in place.
strata_status run_fwd(Fwd& f, const Opts& o, int mode, std::string* impl = nullptr) {
  strata_plan plan = nullptr;
  const strata_tensor_desc* dld = mode == 1 ? &f.dl.desc : (mode == 2 ? &f.logits.desc : nullptr);
  strata_status s = strata_fused_cross_entropy_fwd_plan(&f.logits.desc, &f.target.desc, &f.loss.desc, &f.lse.desc,
                                                        &f.z.desc, dld, o.reduction, kIg, o.ls, o.scale, o.lambda,
                                                        o.cap, o.grad_scale, &plan);
  if (s != STRATA_SUCCESS) return s;
  if (impl) *impl = strata_plan_impl_name(plan);
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  std::vector<uint8_t> w(ws);
  void* t[] = {data(f.logits), data(f.target), data(f.loss), data(f.lse), data(f.z),
               mode == 1 ? data(f.dl) : (mode == 2 ? data(f.logits) : nullptr)};
  s = strata_plan_run(plan, t, 6, w.data(), ws, nullptr);
  strata_plan_destroy(plan);
  return s;
}

void expect_fail(strata_status got, strata_status want, const char* needle) {
  EXPECT_EQ(got, want) << strata_get_last_error_message();
  EXPECT_NE(std::string(strata_get_last_error_message()).find(needle), std::string::npos)
      << "message: " << strata_get_last_error_message() << " (expected to contain: " << needle << ")";
}

strata_status plan_only(const strata_tensor_desc* x, const strata_tensor_desc* y, const strata_tensor_desc* loss,
                        const strata_tensor_desc* lse, const strata_tensor_desc* z, const strata_tensor_desc* dl,
                        int32_t red = 1, float ls = 0.f, float scale = 1.f, float lam = 0.f, float cap = 0.f,
                        float gs = 1.f) {
  strata_plan plan = nullptr;
  const strata_status s =
      strata_fused_cross_entropy_fwd_plan(x, y, loss, lse, z, dl, red, kIg, ls, scale, lam, cap, gs, &plan);
  if (plan) strata_plan_destroy(plan);
  return s;
}

// ---------------------------------------------------------------------------------------------- validation

TEST(FusedCrossEntropy, NullRules) {
  const auto x = make_desc(STRATA_DTYPE_F32, {4, 10}), y = make_desc(STRATA_DTYPE_I64, {4});
  const auto l = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>());
  expect_fail(plan_only(nullptr, &y, &l, nullptr, nullptr, nullptr), STRATA_ERROR_NULL_POINTER, "logits");
  expect_fail(plan_only(&x, nullptr, &l, nullptr, nullptr, nullptr), STRATA_ERROR_NULL_POINTER, "target");
  expect_fail(plan_only(&x, &y, nullptr, nullptr, nullptr, nullptr), STRATA_ERROR_NULL_POINTER, "loss");
  strata_plan plan = nullptr;
  // (lse NULL is the scale mode: ScaleMode* below)
  expect_fail(strata_fused_cross_entropy_bwd_plan(&x, &y, nullptr, nullptr, &x, 1, kIg, 0, 1, 0, 0, &plan),
              STRATA_ERROR_NULL_POINTER, "dloss");
  expect_fail(strata_fused_cross_entropy_bwd_plan(&x, &y, nullptr, &l, nullptr, 1, kIg, 0, 1, 0, 0, &plan),
              STRATA_ERROR_NULL_POINTER, "dlogits");
}

TEST(FusedCrossEntropy, DeviceRules) {
  const auto x = make_desc(STRATA_DTYPE_F32, {4, 10});
  const auto y = make_desc(STRATA_DTYPE_I64, {4}, {STRATA_DEVICE_CUDA, 7});
  const auto l = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>());
  EXPECT_NE(plan_only(&x, &y, &l, nullptr, nullptr, nullptr), STRATA_SUCCESS);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("target"), std::string::npos);
}

TEST(FusedCrossEntropy, DtypeRules) {
  const auto x = make_desc(STRATA_DTYPE_F32, {4, 10}), y = make_desc(STRATA_DTYPE_I64, {4});
  const auto l = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>());
  const auto xi = make_desc(STRATA_DTYPE_I32, {4, 10}), yf = make_desc(STRATA_DTYPE_F32, {4});
  const auto lb = make_desc(STRATA_DTYPE_BF16, std::span<const int64_t>());
  const auto lse64 = make_desc(STRATA_DTYPE_F64, {4}), dlb = make_desc(STRATA_DTYPE_BF16, {4, 10});
  expect_fail(plan_only(&xi, &y, &l, nullptr, nullptr, nullptr), STRATA_ERROR_INVALID_DTYPE, "logits");
  expect_fail(plan_only(&x, &yf, &l, nullptr, nullptr, nullptr), STRATA_ERROR_INVALID_DTYPE, "target");
  expect_fail(plan_only(&x, &y, &lb, nullptr, nullptr, nullptr), STRATA_ERROR_INVALID_DTYPE, "loss must be f32");
  expect_fail(plan_only(&x, &y, &l, &lse64, nullptr, nullptr), STRATA_ERROR_INVALID_DTYPE, "lse must be f32");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, &dlb), STRATA_ERROR_INVALID_DTYPE, "dlogits must have the dtype");
}

TEST(FusedCrossEntropy, ShapeRules) {
  const auto x = make_desc(STRATA_DTYPE_F32, {4, 10}), y = make_desc(STRATA_DTYPE_I64, {4});
  const auto l = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>()), ln = make_desc(STRATA_DTYPE_F32, {4});
  const auto x3 = make_desc(STRATA_DTYPE_F32, {2, 4, 10}), x0 = make_desc(STRATA_DTYPE_F32, {4, 0});
  const auto y5 = make_desc(STRATA_DTYPE_I64, {5}), lse5 = make_desc(STRATA_DTYPE_F32, {5});
  const auto dl = make_desc(STRATA_DTYPE_F32, {4, 11});
  expect_fail(plan_only(&x3, &y, &l, nullptr, nullptr, nullptr), STRATA_ERROR_INVALID_SHAPE, "logits");
  expect_fail(plan_only(&x0, &y, &l, nullptr, nullptr, nullptr), STRATA_ERROR_INVALID_SHAPE, "V >= 1");
  expect_fail(plan_only(&x, &y5, &l, nullptr, nullptr, nullptr), STRATA_ERROR_INVALID_SHAPE, "target must have shape [4]");
  expect_fail(plan_only(&x, &y, &ln, nullptr, nullptr, nullptr, 1), STRATA_ERROR_INVALID_SHAPE, "loss must have shape []");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 0), STRATA_ERROR_INVALID_SHAPE, "loss must have shape [4]");
  expect_fail(plan_only(&x, &y, &l, &lse5, nullptr, nullptr), STRATA_ERROR_INVALID_SHAPE, "lse");
  expect_fail(plan_only(&x, &y, &l, nullptr, &ln, nullptr), STRATA_ERROR_INVALID_SHAPE, "z_loss");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, &dl), STRATA_ERROR_INVALID_SHAPE, "dlogits");
  strata_plan plan = nullptr;
  expect_fail(strata_fused_cross_entropy_bwd_plan(&x, &y, &ln, &ln, &x, 1, kIg, 0, 1, 0, 0, &plan),
              STRATA_ERROR_INVALID_SHAPE, "dloss");
}

TEST(FusedCrossEntropy, StrideRules) {
  const int64_t shape[] = {4, 10}, st[] = {20, 2};
  strata_tensor_desc xs;
  ASSERT_EQ(strata_tensor_desc_init(&xs, STRATA_DTYPE_F32, 2, shape, st, 0, kCpu), STRATA_SUCCESS);
  const auto x = make_desc(STRATA_DTYPE_F32, {4, 10}), y = make_desc(STRATA_DTYPE_I64, {4});
  const auto l = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>());
  expect_fail(plan_only(&xs, &y, &l, nullptr, nullptr, nullptr), STRATA_ERROR_INVALID_STRIDE, "logits");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, &xs), STRATA_ERROR_INVALID_STRIDE, "dlogits");
}

TEST(FusedCrossEntropy, AttributeRules) {
  const auto x = make_desc(STRATA_DTYPE_F32, {4, 10}), y = make_desc(STRATA_DTYPE_I64, {4});
  const auto l = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>());
  const float nan = std::nanf(""), inf = INFINITY;
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 3), STRATA_ERROR_INVALID_ATTRIBUTE, "reduction");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 1, 1.5f), STRATA_ERROR_INVALID_ATTRIBUTE, "label_smoothing");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 1, nan), STRATA_ERROR_INVALID_ATTRIBUTE, "label_smoothing");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 1, 0, nan), STRATA_ERROR_INVALID_ATTRIBUTE, "logit_scale");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 1, 0, 1, -1e-3f), STRATA_ERROR_INVALID_ATTRIBUTE,
              "lse_square_scale");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 1, 0, 1, 0, inf), STRATA_ERROR_INVALID_ATTRIBUTE, "softcap");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 1, 0, 1, 0, -2), STRATA_ERROR_INVALID_ATTRIBUTE, "softcap");
  expect_fail(plan_only(&x, &y, &l, nullptr, nullptr, nullptr, 1, 0, 1, 0, 0, inf), STRATA_ERROR_INVALID_ATTRIBUTE,
              "grad_scale");
}

// Targets outside [0, V) other than ignore_index are rejected at run time by every CPU implementation, before
// anything is written (the logits too, in place).
TEST(FusedCrossEntropy, OutOfRangeTargetsRejectedWithoutWriting) {
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_fwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (double bad : {10.0, -1.0, -101.0, 1e6}) {
      Fwd f(STRATA_DTYPE_F32, 4, 10, 1, 3);
      f.target.set(2, bad);
      const std::vector<uint8_t> before = f.logits.storage;
      expect_fail(run_fwd(f, {}, 2), STRATA_ERROR_INVALID_VALUE, "target[2] must be in [0, 10)");
      EXPECT_TRUE(all_poison(f.loss) && all_poison(f.lse) && all_poison(f.z)) << impl;
      EXPECT_EQ(f.logits.storage, before) << impl;
    }
  }
}

// dlogits overlapping the logits other than exactly (in place) is rejected at run time.
TEST(FusedCrossEntropy, PartialOverlapRejected) {
  Fwd f(STRATA_DTYPE_F32, 4, 10, 1, 3);
  HostTensor big = HostTensor::make(STRATA_DTYPE_F32, {5, 10});
  std::mt19937_64 rng(1);
  big.fill_normal(rng);
  strata_tensor_desc x = f.logits.desc, d = f.logits.desc;
  d.offset = 3;  // same buffer, shifted by 3 elements
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_fused_cross_entropy_fwd_plan(&x, &f.target.desc, &f.loss.desc, nullptr, nullptr, &d, 1, kIg, 0, 1,
                                                0, 0, 1, &plan),
            STRATA_SUCCESS);
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  std::vector<uint8_t> w(ws);
  void* t[] = {data(big), data(f.target), data(f.loss), nullptr, nullptr, data(big)};
  expect_fail(strata_plan_run(plan, t, 6, w.data(), ws, nullptr), STRATA_ERROR_INVALID_VALUE, "partial overlap");
  strata_plan_destroy(plan);
  EXPECT_TRUE(all_poison(f.loss));
}

TEST(FusedCrossEntropy, WorkspaceTooSmall) {
  Fwd f(STRATA_DTYPE_F32, 4, 10, 1, 3);
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_fused_cross_entropy_fwd_plan(&f.logits.desc, &f.target.desc, &f.loss.desc, nullptr, nullptr,
                                                nullptr, 1, kIg, 0, 1, 0, 0, 1, &plan),
            STRATA_SUCCESS);
  void* t[] = {data(f.logits), data(f.target), data(f.loss), nullptr, nullptr, nullptr};
  EXPECT_NE(strata_plan_run(plan, t, 6, nullptr, 0, nullptr), STRATA_SUCCESS);
  strata_plan_destroy(plan);
  EXPECT_TRUE(all_poison(f.loss));
}

// ---------------------------------------------------------------------------------------------- gradients

// Loss of the f64 reference (reduced to a scalar: sum over rows of G_i * loss_i for none).
double loss_f64(Fwd& f, const Opts& o, const std::vector<double>& G) {
  ForceImpl force("reference");
  f.loss.poison();
  EXPECT_EQ(run_fwd(f, o, 0), STRATA_SUCCESS) << strata_get_last_error_message();
  if (o.reduction != 0) return o.grad_scale * f.loss.get(0);
  double s = 0;
  for (int64_t i = 0; i < f.loss.numel(); ++i) s += G[i] * f.loss.get(i);
  return s;
}

// Central differences of the f64 loss vs the fused forward's dlogits and the backward op, with every option
// on, for every reduction (none with a random per-row upstream gradient).
TEST(FusedCrossEntropy, GradientMatchesFloat64FiniteDifferences) {
  const int64_t N = 5, V = 7;
  for (int32_t red : {0, 1, 2}) {
    for (const Opts& o : {Opts{red, 0.f, 1.f, 0.f, 0.f, 1.3f}, Opts{red, 0.1f, 0.7f, 1e-2f, 4.f, 1.3f},
                          Opts{red, 0.2f, 1.f, 0.f, 30.f, -0.6f}}) {
      Fwd f(STRATA_DTYPE_F64, N, V, red, 17, 3);
      std::vector<double> G(N);
      std::mt19937_64 rng(5);
      std::normal_distribution<double> nd(0.5, 1.0);
      for (auto& g : G) g = nd(rng);
      // Analytic: fused forward (none: grad_scale applies to every row, so use the backward op for G_i).
      std::vector<double> fd(N * V);
      const double h = 1e-6;
      for (int64_t e = 0; e < N * V; ++e) {
        const double v = f.logits.get(e);
        f.logits.set(e, v + h);
        const double lp = loss_f64(f, o, G);
        f.logits.set(e, v - h);
        const double lm = loss_f64(f, o, G);
        f.logits.set(e, v);
        fd[e] = (lp - lm) / (2 * h);
      }
      // Backward op with dloss = G (none) or grad_scale (mean/sum), from the forward's lse.
      ASSERT_EQ(loss_f64(f, o, G) == loss_f64(f, o, G), true);
      HostTensor dloss = HostTensor::make(STRATA_DTYPE_F64, red == 0 ? std::vector<int64_t>{N} : std::vector<int64_t>{});
      for (int64_t i = 0; i < dloss.numel(); ++i) dloss.set(i, red == 0 ? G[i] : o.grad_scale);
      HostTensor dl = HostTensor::make(STRATA_DTYPE_F64, {N, V});
      dl.poison();
      strata_plan plan = nullptr;
      ASSERT_EQ(strata_fused_cross_entropy_bwd_plan(&f.logits.desc, &f.target.desc, &f.lse.desc, &dloss.desc,
                                                    &dl.desc, red, kIg, o.ls, o.scale, o.lambda, o.cap, &plan),
                STRATA_SUCCESS)
          << strata_get_last_error_message();
      void* t[] = {data(f.logits), data(f.target), data(f.lse), data(dloss), data(dl)};
      ASSERT_EQ(strata_plan_run(plan, t, 5, nullptr, 0, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
      strata_plan_destroy(plan);
      double num = 0, den = 0;
      for (int64_t e = 0; e < N * V; ++e) num += (dl.get(e) - fd[e]) * (dl.get(e) - fd[e]), den += fd[e] * fd[e];
      EXPECT_LT(std::sqrt(num / den), 1e-7) << "bwd op, reduction " << red << " cap " << o.cap;
      if (red != 0) {  // the fused forward's gradient (grad_scale = G)
        ForceImpl force("reference");
        Fwd g = f;
        ASSERT_EQ(run_fwd(g, o, 1), STRATA_SUCCESS);
        num = 0;
        for (int64_t e = 0; e < N * V; ++e) num += (g.dl.get(e) - fd[e]) * (g.dl.get(e) - fd[e]);
        EXPECT_LT(std::sqrt(num / den), 1e-7) << "fused forward, reduction " << red << " cap " << o.cap;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------- semantics

// Every target ignored: mean is 0 (not 0/0), sum is 0, the gradient is 0, lse is still computed.
TEST(FusedCrossEntropy, AllIgnoredGivesZeroLossAndGradient) {
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_fwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (int32_t red : {0, 1, 2}) {
      Fwd f(STRATA_DTYPE_BF16, 6, 300, red, 4, 1);
      ASSERT_EQ(run_fwd(f, Opts{red, 0.1f, 1.f, 1e-3f, 0.f, 1.f}, 2), STRATA_SUCCESS) << impl;
      for (int64_t i = 0; i < f.loss.numel(); ++i) EXPECT_EQ(f.loss.get(i), 0.0) << impl;
      for (int64_t i = 0; i < f.z.numel(); ++i) EXPECT_EQ(f.z.get(i), 0.0) << impl;
      for (int64_t i = 0; i < f.lse.numel(); ++i) EXPECT_TRUE(std::isfinite(f.lse.get(i)) && f.lse.get(i) > 0) << impl;
      for (int64_t e = 0; e < f.logits.numel(); ++e) ASSERT_EQ(f.logits.get(e), 0.0) << impl;
    }
  }
}

// In place and separate dlogits give the same bits; so do repeated runs and 1 vs 2 threads.
TEST(FusedCrossEntropy, DeterministicAndInPlaceEqualsSeparate) {
  const int32_t threads_before = strata_get_num_threads();
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_fwd", kCpu)) {
    ForceImpl force(impl.c_str());
    auto run_once = [&](int mode, int threads) {
      strata_set_num_threads(threads);
      Fwd f(STRATA_DTYPE_BF16, 37, 3001, 1, 8);
      EXPECT_EQ(run_fwd(f, Opts{1, 0.1f, 1.f, 1e-4f, 0.f, 1.f}, mode), STRATA_SUCCESS) << impl;
      std::vector<uint8_t> out = f.loss.storage;
      const HostTensor& g = mode == 2 ? f.logits : f.dl;
      out.insert(out.end(), g.storage.begin(), g.storage.end());
      out.insert(out.end(), f.lse.storage.begin(), f.lse.storage.end());
      return out;
    };
    const std::vector<uint8_t> a = run_once(1, 2);
    EXPECT_EQ(run_once(1, 2), a) << impl << ": repeated run differs";
    EXPECT_EQ(run_once(1, 1), a) << impl << ": 1 vs 2 threads differ";
    EXPECT_EQ(run_once(2, 2), a) << impl << ": in place differs from separate";
  }
  strata_set_num_threads(threads_before);
}

// The backward op from the forward's lse gives the fused forward's gradient (same upstream gradient).
TEST(FusedCrossEntropy, BackwardOpMatchesFusedForward) {
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_fwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (int32_t red : {0, 1, 2}) {
      Fwd f(STRATA_DTYPE_F32, 11, 999, red, 21);
      const Opts o{red, 0.05f, 0.9f, 1e-3f, 20.f, 0.75f};
      ASSERT_EQ(run_fwd(f, o, 1), STRATA_SUCCESS) << impl;
      HostTensor dloss = HostTensor::make(STRATA_DTYPE_F32, red == 0 ? std::vector<int64_t>{11} : std::vector<int64_t>{});
      for (int64_t i = 0; i < dloss.numel(); ++i) dloss.set(i, 0.75);
      HostTensor dl = HostTensor::make(STRATA_DTYPE_F32, {11, 999});
      dl.poison();
      strata_plan plan = nullptr;
      ASSERT_EQ(strata_fused_cross_entropy_bwd_plan(&f.logits.desc, &f.target.desc, &f.lse.desc, &dloss.desc,
                                                    &dl.desc, red, kIg, o.ls, o.scale, o.lambda, o.cap, &plan),
                STRATA_SUCCESS);
      size_t ws = 0;
      strata_plan_workspace_size(plan, &ws);
      std::vector<uint8_t> w(ws);
      void* t[] = {data(f.logits), data(f.target), data(f.lse), data(dloss), data(dl)};
      ASSERT_EQ(strata_plan_run(plan, t, 5, w.data(), ws, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
      strata_plan_destroy(plan);
      for (int64_t e = 0; e < dl.numel(); ++e) ASSERT_NEAR(dl.get(e), f.dl.get(e), 1e-7) << impl << " " << e;
    }
  }
}

// ---------------------------------------------------------------------------------------------- scale mode

// The backward op without lse (scale mode) on host tensors: dlogits = logits (in place) unless `other` is given.
strata_status run_scale(HostTensor& logits, HostTensor& target, HostTensor& dloss, int32_t red,
                        HostTensor* other = nullptr) {
  HostTensor& out = other ? *other : logits;
  strata_plan plan = nullptr;
  strata_status s = strata_fused_cross_entropy_bwd_plan(&logits.desc, &target.desc, nullptr, &dloss.desc, &out.desc,
                                                        red, kIg, 0.f, 1.f, 0.f, 0.f, &plan);
  if (s != STRATA_SUCCESS) return s;
  size_t ws = 1;
  strata_plan_workspace_size(plan, &ws);
  EXPECT_EQ(ws, 0u);
  void* t[] = {data(logits), data(target), nullptr, data(dloss), data(out)};
  s = strata_plan_run(plan, t, 5, nullptr, 0, nullptr);
  strata_plan_destroy(plan);
  return s;
}

// dloss of a reduction: the scalar g (mean, sum) or rows cycling through {g, 1, -0.5, 0} (none: rows with a
// factor of exactly 1 are skipped by the kernels, so they are part of the test).
HostTensor make_dloss(int32_t red, int64_t N, double g, int32_t dtype = STRATA_DTYPE_F32) {
  HostTensor d = HostTensor::make(dtype, red == 0 ? std::vector<int64_t>{N} : std::vector<int64_t>{});
  const double cyc[4] = {g, 1.0, -0.5, 0.0};
  for (int64_t i = 0; i < d.numel(); ++i) d.set(i, red == 0 ? cyc[i % 4] : g);
  return d;
}

// Fused forward in place (G = 1) then the scale mode with dloss == the backward op with lse and dloss (which
// the finite-difference test above checks), for every CPU implementation, reduction and dtype; dloss == 1
// leaves the gradient bit-identical.
TEST(FusedCrossEntropy, ScaleModeMatchesBackwardOp) {
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_bwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (int32_t dtype : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F64}) {
      if (dtype == STRATA_DTYPE_F64 && impl != "reference") continue;  // f64 logits: the reference only
      for (int32_t red : {0, 1, 2}) {
        for (double g : {0.75, 1.0, -3.0}) {
          const int64_t N = 13, V = 515;
          Fwd f(dtype, N, V, red, 40 + red);
          const HostTensor logits0 = f.logits;
          ASSERT_EQ(run_fwd(f, Opts{red, 0.f, 1.f, 0.f, 0.f, 1.f}, 2), STRATA_SUCCESS) << impl;
          const HostTensor grad1 = f.logits;  // the gradient for an upstream gradient of 1
          HostTensor dloss = make_dloss(red, N, g, dtype == STRATA_DTYPE_F64 ? dtype : STRATA_DTYPE_F32);
          ASSERT_EQ(run_scale(f.logits, f.target, dloss, red), STRATA_SUCCESS)
              << impl << ": " << strata_get_last_error_message();
          // The backward op from the forward's lse, on the original logits.
          HostTensor x = logits0, want = HostTensor::make(dtype, {N, V});
          strata_plan plan = nullptr;
          ASSERT_EQ(strata_fused_cross_entropy_bwd_plan(&x.desc, &f.target.desc, &f.lse.desc, &dloss.desc, &want.desc,
                                                        red, kIg, 0.f, 1.f, 0.f, 0.f, &plan),
                    STRATA_SUCCESS);
          size_t ws = 0;
          strata_plan_workspace_size(plan, &ws);
          std::vector<uint8_t> w(ws);
          void* t[] = {data(x), data(f.target), data(f.lse), data(dloss), data(want)};
          ASSERT_EQ(strata_plan_run(plan, t, 5, w.data(), ws, nullptr), STRATA_SUCCESS);
          strata_plan_destroy(plan);
          // One more rounding to the storage type than the backward op (the G = 1 gradient was stored first), so
          // a relative bound per element, plus an absolute one on the scale of the row's upstream gradient for
          // the target element (p_y - 1 cancels). A wrong factor is off by >= 25 % of the row's elements.
          const double rel = dtype == STRATA_DTYPE_BF16 ? 1.6e-2 : (dtype == STRATA_DTYPE_F32 ? 2e-6 : 1e-14);
          int64_t count = 0;
          for (int64_t i = 0; i < N; ++i) count += f.target.get(i) != kIg;
          for (int64_t i = 0; i < N; ++i) {
            const bool ignored = f.target.get(i) == kIg;
            const double gi = dloss.get(red == 0 ? i : 0);
            const double row_g = std::abs(gi) / (red == 1 ? static_cast<double>(count) : 1.0);
            for (int64_t j = 0; j < V; ++j) {
              const int64_t e = i * V + j;
              const double got = f.logits.get(e), ref = want.get(e);
              if (ignored) ASSERT_EQ(got, 0.0) << impl << " row " << i;
              if (gi == 1.0) ASSERT_EQ(got, grad1.get(e)) << impl << " row " << i << ": a factor of 1 changed it";
              ASSERT_NEAR(got, ref, rel * (std::abs(ref) + 0.1 * row_g))
                  << impl << " dtype " << dtype << " red " << red << " g " << g << " elem " << e;
            }
          }
        }
      }
    }
  }
}

// Scale mode rules: dlogits must be the logits buffer (the forward's gradient is there); nothing written.
TEST(FusedCrossEntropy, ScaleModeNeedsTheLogitsBuffer) {
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_bwd", kCpu)) {
    ForceImpl force(impl.c_str());
    Fwd f(STRATA_DTYPE_F32, 5, 40, 1, 3);
    HostTensor dloss = make_dloss(1, 5, 0.5);
    const std::vector<uint8_t> before = f.dl.storage, logits_before = f.logits.storage;
    expect_fail(run_scale(f.logits, f.target, dloss, 1, &f.dl), STRATA_ERROR_INVALID_VALUE,
                "dlogits must be the logits buffer itself");
    EXPECT_EQ(f.dl.storage, before) << impl;
    EXPECT_EQ(f.logits.storage, logits_before) << impl;
    // and the target check still applies (CPU: before anything is written)
    f.target.set(2, 40.0);
    expect_fail(run_scale(f.logits, f.target, dloss, 1), STRATA_ERROR_INVALID_VALUE, "target[2] must be in [0, 40)");
    EXPECT_EQ(f.logits.storage, logits_before) << impl;
  }
}

// Same bits for 1 and 2 threads in scale mode.
TEST(FusedCrossEntropy, ScaleModeDeterministic) {
  const int32_t threads_before = strata_get_num_threads();
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_bwd", kCpu)) {
    ForceImpl force(impl.c_str());
    auto once = [&](int threads) {
      strata_set_num_threads(threads);
      Fwd f(STRATA_DTYPE_BF16, 37, 3001, 0, 8);
      HostTensor dloss = make_dloss(0, 37, 0.3);
      EXPECT_EQ(run_scale(f.logits, f.target, dloss, 0), STRATA_SUCCESS) << impl;
      return f.logits.storage;
    };
    EXPECT_EQ(once(1), once(2)) << impl;
  }
  strata_set_num_threads(threads_before);
}

// ---------------------------------------------------------------------------------------------- CUDA

bool have_cuda() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS && n > 0;
}

// A forward problem's tensors on a CUDA device, and the fused forward in place (G = 1) on them, synchronised.
struct CudaFwd {
  strata_device dev;
  atk::DeviceTensor x, y, l, s, z;
  CudaFwd(const Fwd& f, strata_device d) : dev(d), x(f.logits, d), y(f.target, d), l(f.loss, d), s(f.lse, d), z(f.z, d) {}
  void run_inplace(int32_t red, float ls, float lambda) {
    strata_plan plan = nullptr;
    ASSERT_EQ(strata_fused_cross_entropy_fwd_plan(&x.desc(), &y.desc(), &l.desc(), &s.desc(), &z.desc(), &x.desc(),
                                                  red, kIg, ls, 1.f, lambda, 0.f, 1.f, &plan),
              STRATA_SUCCESS)
        << strata_get_last_error_message();
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    void* w = nullptr;
    if (ws) strata_malloc(dev, ws, nullptr, &w);
    void* t[] = {x.data(), y.data(), l.data(), s.data(), z.data(), x.data()};
    EXPECT_EQ(strata_plan_run(plan, t, 6, w, ws, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
    strata_device_synchronize(dev);
    if (w) strata_free(w);
    strata_plan_destroy(plan);
  }
};

// On CUDA: same bits run to run (in place, mean), every implementation forced.
TEST(FusedCrossEntropy, CudaBitsRunToRun) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  auto run_cuda = [&](Fwd& f, int32_t red) {
    CudaFwd c(f, dev);
    c.run_inplace(red, 0.1f, 1e-4f);
    c.x.download(f.logits), c.l.download(f.loss), c.s.download(f.lse);
  };
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_fwd", dev)) {
    ForceImpl force(impl.c_str());
    Fwd a(STRATA_DTYPE_BF16, 64, 40000, 1, 3), b = a;
    run_cuda(a, 1);
    run_cuda(b, 1);
    EXPECT_EQ(a.logits.storage, b.logits.storage) << impl;
    EXPECT_EQ(a.loss.storage, b.loss.storage) << impl;
    EXPECT_EQ(a.lse.storage, b.lse.storage) << impl;
  }
}

// Out-of-range targets on CUDA (the C API, every implementation forced, both ops): the call fails with the CPU
// path's message naming the first bad row and its value, and writes nothing: loss, lse and z-loss keep their
// poison, the in-place gradient leaves the logits as they were, a separate dlogits keeps its poison
// (loss/common/cuda_targets.h: the device count is read back before any other launch). i64 and i32 targets;
// V = 1000 is a cluster shape in f32 and bf16, V = 1001 (odd rows) takes block_per_row's scalar path.
TEST(FusedCrossEntropy, CudaTargetsOutOfRangeFailAndWriteNothing) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  const std::string want_fwd = "fused_cross_entropy_fwd: target[1] must be in [0, 1000) (V) or equal ignore_index "
                               "(-100), got 1000";
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_fwd", dev)) {
    for (int32_t dtype : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
      for (int32_t red : {0, 1, 2}) {
        for (int mode : {0, 1, 2}) {  // no gradient, separate dlogits, in place
          for (int32_t tdt : {STRATA_DTYPE_I64, STRATA_DTYPE_I32}) {
            Fwd f(dtype, 4, 1000, red, 7, 0);
            f.target.set(1, 1000.0);
            f.target.set(3, -5.0);
            HostTensor t32 = HostTensor::make(STRATA_DTYPE_I32, {4});
            for (int64_t i = 0; i < 4; ++i) t32.set(i, f.target.get(i));
            const HostTensor& tgt = tdt == STRATA_DTYPE_I64 ? f.target : t32;
            atk::DeviceTensor x(f.logits, dev), y(tgt, dev), l(f.loss, dev), s(f.lse, dev), z(f.z, dev),
                dl(f.dl, dev);
            const strata_tensor_desc* dld = mode == 1 ? &dl.desc() : (mode == 2 ? &x.desc() : nullptr);
            strata_plan plan = nullptr;
            {
              ForceImpl force(impl.c_str());
              ASSERT_EQ(strata_fused_cross_entropy_fwd_plan(&x.desc(), &y.desc(), &l.desc(), &s.desc(), &z.desc(),
                                                            dld, red, kIg, 0.1f, 1.f, 1e-4f, 0.f, 1.f, &plan),
                        STRATA_SUCCESS)
                  << impl << ": " << strata_get_last_error_message();
            }
            size_t ws = 0;
            strata_plan_workspace_size(plan, &ws);
            void* w = nullptr;
            if (ws) ASSERT_EQ(strata_malloc(dev, ws, nullptr, &w), STRATA_SUCCESS);
            void* dlp = mode == 1 ? dl.data() : (mode == 2 ? x.data() : nullptr);
            void* t[] = {x.data(), y.data(), l.data(), s.data(), z.data(), dlp};
            const std::string what = impl + " dtype " + std::to_string(dtype) + " red " + std::to_string(red) +
                                     " mode " + std::to_string(mode) + " target dtype " + std::to_string(tdt);
            EXPECT_EQ(strata_plan_run(plan, t, 6, w, ws, nullptr), STRATA_ERROR_INVALID_VALUE) << what;
            EXPECT_EQ(std::string(strata_get_last_error_message()), want_fwd) << what;
            strata_device_synchronize(dev);
            if (w) strata_free(w);
            strata_plan_destroy(plan);
            HostTensor xl = f.logits, ll = f.loss, sl = f.lse, zl = f.z, dll = f.dl;
            x.download(xl), l.download(ll), s.download(sl), z.download(zl), dl.download(dll);
            EXPECT_EQ(xl.storage, f.logits.storage) << what << ": logits written";
            EXPECT_TRUE(all_poison(ll)) << what << ": loss written";
            EXPECT_TRUE(all_poison(sl)) << what << ": lse written";
            EXPECT_TRUE(all_poison(zl)) << what << ": z_loss written";
            EXPECT_TRUE(all_poison(dll)) << what << ": dlogits written";
          }
        }
      }
    }
  }
  // The backward op (lse given): only row 3 is bad (-5); V = 1001 and 1000.
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_bwd", dev)) {
    for (int64_t V : {1000, 1001}) {
      for (int32_t red : {0, 1}) {
        Fwd f(STRATA_DTYPE_BF16, 4, V, red, 8, 0);
        f.target.set(3, -5.0);
        HostTensor lse = rnd(STRATA_DTYPE_F32, {4}, 9, 5.0);
        HostTensor dloss = make_dloss(red, 4, 0.5);
        atk::DeviceTensor x(f.logits, dev), y(f.target, dev), s(lse, dev), d(dloss, dev), dl(f.dl, dev);
        strata_plan plan = nullptr;
        strata_status ps;
        {
          ForceImpl force(impl.c_str());
          ps = strata_fused_cross_entropy_bwd_plan(&x.desc(), &y.desc(), &s.desc(), &d.desc(), &dl.desc(), red, kIg,
                                                   0.f, 1.f, 0.f, 0.f, &plan);
        }
        if (ps == STRATA_ERROR_NO_IMPLEMENTATION && V == 1001) continue;  // the cluster kernels: 16-byte rows only
        ASSERT_EQ(ps, STRATA_SUCCESS) << impl << ": " << strata_get_last_error_message();
        size_t ws = 0;
        strata_plan_workspace_size(plan, &ws);
        void* w = nullptr;
        if (ws) ASSERT_EQ(strata_malloc(dev, ws, nullptr, &w), STRATA_SUCCESS);
        void* t[] = {x.data(), y.data(), s.data(), d.data(), dl.data()};
        EXPECT_EQ(strata_plan_run(plan, t, 5, w, ws, nullptr), STRATA_ERROR_INVALID_VALUE) << impl << " V " << V;
        EXPECT_EQ(std::string(strata_get_last_error_message()),
                  "fused_cross_entropy_bwd: target[3] must be in [0, " + std::to_string(V) +
                      ") (V) or equal ignore_index (-100), got -5")
            << impl;
        strata_device_synchronize(dev);
        if (w) strata_free(w);
        strata_plan_destroy(plan);
        HostTensor got = f.dl;
        dl.download(got);
        EXPECT_TRUE(all_poison(got)) << impl << " V " << V << ": dlogits written";
      }
    }
  }
}

// Scale mode on CUDA (every implementation: they all launch the same kernel): the fused forward in place, then
// the backward op without lse and with dloss; each element must be the f32 product of the G = 1 gradient and
// its row's factor, rounded to the dtype (the same bits as on the host), rows with factor 1 and ignored rows
// untouched; contiguous and padded rows (scalar heads/tails).
TEST(FusedCrossEntropy, CudaScaleMode) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  for (const std::string& impl : atk::impls_for("fused_cross_entropy_bwd", dev)) {
    for (int32_t dtype : {STRATA_DTYPE_BF16, STRATA_DTYPE_F32, STRATA_DTYPE_F16}) {
      for (int32_t red : {0, 1, 2}) {
        for (double g : {0.75, 1.0}) {
          const int64_t N = 21, V = 1003;  // V odd: no 16-byte rows, heads and tails on every row
          Fwd f(dtype, N, V, red, 50 + red);
          CudaFwd c(f, dev);
          c.run_inplace(red, 0.f, 0.f);
          atk::DeviceTensor& x = c.x;
          atk::DeviceTensor& y = c.y;
          strata_plan plan = nullptr;
          HostTensor grad1 = f.logits;
          x.download(grad1);
          HostTensor dloss = make_dloss(red, N, g);
          atk::DeviceTensor d(dloss, dev);
          plan = nullptr;
          {
            // Forced for the scale call only (the forward above is dispatched: V = 1003 is not a cluster shape,
            // but the scale mode accepts any shape in every implementation).
            ForceImpl force(impl.c_str());
            ASSERT_EQ(strata_fused_cross_entropy_bwd_plan(&x.desc(), &y.desc(), nullptr, &d.desc(), &x.desc(), red,
                                                          kIg, 0.f, 1.f, 0.f, 0.f, &plan),
                      STRATA_SUCCESS)
                << impl << ": " << strata_get_last_error_message();
            EXPECT_EQ(std::string(strata_plan_impl_name(plan)), impl);
          }
          void* t2[] = {x.data(), y.data(), nullptr, d.data(), x.data()};
          ASSERT_EQ(strata_plan_run(plan, t2, 5, nullptr, 0, nullptr), STRATA_SUCCESS)
              << strata_get_last_error_message();
          strata_device_synchronize(dev);
          strata_plan_destroy(plan);
          HostTensor got = f.logits;
          x.download(got);
          for (int64_t i = 0; i < N; ++i) {
            const float gi = static_cast<float>(dloss.get(red == 0 ? i : 0));
            const bool skip = gi == 1.f || f.target.get(i) == kIg;
            for (int64_t j = 0; j < V; ++j) {
              const int64_t e = i * V + j;
              HostTensor one = HostTensor::make(dtype, {1});
              one.set(0, skip ? grad1.get(e) : static_cast<double>(static_cast<float>(grad1.get(e)) * gi));
              ASSERT_EQ(got.get(e), one.get(0)) << impl << " dtype " << dtype << " red " << red << " elem " << e;
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------- C++ API

TEST(FusedCrossEntropy, CppWrapper) {
  Tensor x = Tensor::empty(STRATA_DTYPE_F32, {3, 5});
  Tensor y = Tensor::empty(STRATA_DTYPE_I64, {3});
  float* xp = static_cast<float*>(x.data());
  int64_t* yp = static_cast<int64_t*>(y.data());
  for (int i = 0; i < 15; ++i) xp[i] = 0.1f * static_cast<float>(i % 7) - 0.2f;
  yp[0] = 1, yp[1] = kIg, yp[2] = 4;
  CrossEntropyResult r = fused_cross_entropy_fwd(x, y);
  EXPECT_EQ(r.loss.rank(), 0);
  // Row losses by hand: lse - x[y], mean over the two valid rows.
  double want = 0;
  for (int i : {0, 2}) {
    double m = -1e30, s = 0;
    for (int j = 0; j < 5; ++j) m = std::max(m, static_cast<double>(xp[i * 5 + j]));
    for (int j = 0; j < 5; ++j) s += std::exp(xp[i * 5 + j] - m);
    want += m + std::log(s) - xp[i * 5 + yp[i]];
  }
  EXPECT_NEAR(*static_cast<float*>(r.loss.data()), want / 2, 1e-6);
  Tensor dloss = Tensor::empty(STRATA_DTYPE_F32, {});
  *static_cast<float*>(dloss.data()) = 1.f;
  Tensor g = fused_cross_entropy_bwd(x, y, r.lse, dloss);
  fused_cross_entropy_fwd(x, y, {}, &x);  // in place
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(static_cast<float*>(g.data())[i], xp[i], 1e-7);
  EXPECT_THROW(fused_cross_entropy_fwd(x, x), Error);
}

}  // namespace
}  // namespace strata
