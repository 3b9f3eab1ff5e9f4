// chunk_loss beyond the conformance driver (ops_fused.md §2): every validation rule (status, message, nothing
// written), the run-time target check, gradients of the float64 reference against central finite
// differences (forward op and backward op, every option on), determinism (repeated runs, 1 vs 2 threads, both
// strategies), the strategy heuristic and its workspace budget, both strategies agreeing, and the C++ wrapper.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gdn_cuda_test_support.h"  // time_ms: a median of CUDA-event timed calls
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "opbase/plan.h"
#include "ops/loss/chunk_loss/chunk_loss.h"
#include "ops/loss/chunk_loss/driver.h"  // vt_memory: where the vocab_tiled loop keeps what
#include "strata/ops.h"
#include "testkit/testkit.h"
#include "test_support.h"

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, kCpu, poisoned, all_poison, ... (test_support.h)

using atk::HostTensor;

struct ThreadCount {
  explicit ThreadCount(int n) : old(strata_get_num_threads()) { strata_set_num_threads(n); }
  ~ThreadCount() { strata_set_num_threads(old); }
  int old;
};

// A small problem on the host: hidden [N, D], weight [V, D], bias [V], target [N]; outputs poisoned.
struct Problem {
  HostTensor h, w, b, t, loss, lse, dh, dw, db, g;
  Problem(int32_t dt, int64_t N, int64_t D, int64_t V, uint64_t seed, double ignored = 0.2, int32_t gdt = -1) {
    if (gdt < 0) gdt = dt;
    const int32_t sdt = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    std::mt19937_64 rng(seed);
    h = HostTensor::make(dt, {N, D});
    w = HostTensor::make(dt, {V, D});
    b = HostTensor::make(dt, {V});
    h.fill_normal(rng, 0.0, 1.0);
    w.fill_normal(rng, 0.0, 2.0 / std::sqrt(static_cast<double>(D)));
    b.fill_normal(rng, 0.0, 0.5);
    t = HostTensor::make(STRATA_DTYPE_I64, {N});
    std::uniform_int_distribution<int64_t> cls(0, V - 1);
    std::uniform_real_distribution<double> u(0, 1);
    for (int64_t i = 0; i < N; ++i) t.set(i, u(rng) < ignored ? -100.0 : static_cast<double>(cls(rng)));
    loss = HostTensor::make(sdt, {});
    lse = HostTensor::make(sdt, {N});
    dh = HostTensor::make(gdt, {N, D});
    dw = HostTensor::make(gdt, {V, D});
    db = HostTensor::make(gdt, {V});
    g = HostTensor::make(sdt, {});
    g.set(0, 1.0);
    poison();
  }
  void poison() {
    for (HostTensor* x : {&loss, &lse, &dh, &dw, &db}) x->poison();
  }
  static void* ptr(const HostTensor& x) { return const_cast<uint8_t*>(x.storage.data()); }
  strata_status plan_fwd(const strata_chunk_loss_options* o, bool grad, bool bias, strata_plan* p) const {
    return strata_chunk_loss_plan(&h.desc, &w.desc, bias ? &b.desc : nullptr, &t.desc, &loss.desc, &lse.desc,
                                  grad ? &dh.desc : nullptr, grad ? &dw.desc : nullptr, grad && bias ? &db.desc : nullptr,
                                  o, p);
  }
  strata_status run_fwd(const strata_chunk_loss_options* o, bool grad = true, bool bias = true,
                        std::string* impl = nullptr, std::string* summary = nullptr) {
    strata_plan p = nullptr;
    STRATA_RETURN_IF_ERROR(plan_fwd(o, grad, bias, &p));
    if (impl) *impl = strata_plan_impl_name(p);
    if (summary) *summary = plan_from_handle(p)->summary;
    size_t ws = 0;
    strata_plan_workspace_size(p, &ws);
    std::vector<uint8_t> work(ws);
    // Pointers for the planned tensors only (strata_plan_run rejects one for a tensor the plan was made without).
    void* tp[] = {ptr(h),    ptr(w),   bias ? ptr(b) : nullptr,  ptr(t),
                  ptr(loss), ptr(lse), grad ? ptr(dh) : nullptr, grad ? ptr(dw) : nullptr,
                  grad && bias ? ptr(db) : nullptr};
    const strata_status s = strata_plan_run(p, tp, 9, work.data(), ws, nullptr);
    strata_plan_destroy(p);
    return s;
  }
  strata_status run_bwd(const strata_chunk_loss_options* o, bool bias = true) {
    strata_plan p = nullptr;
    STRATA_RETURN_IF_ERROR(strata_chunk_loss_bwd_plan(&h.desc, &w.desc, bias ? &b.desc : nullptr, &t.desc, &lse.desc,
                                                      &g.desc, &dh.desc, &dw.desc, bias ? &db.desc : nullptr, o, &p));
    size_t ws = 0;
    strata_plan_workspace_size(p, &ws);
    std::vector<uint8_t> work(ws);
    void* tp[] = {ptr(h), ptr(w), bias ? ptr(b) : nullptr, ptr(t), ptr(lse), ptr(g), ptr(dh), ptr(dw),
                  bias ? ptr(db) : nullptr};
    const strata_status s = strata_plan_run(p, tp, 9, work.data(), ws, nullptr);
    strata_plan_destroy(p);
    return s;
  }
};

strata_chunk_loss_options defaults() {
  strata_chunk_loss_options o;
  strata_chunk_loss_options_init(&o);
  return o;
}

// Expects a plan failure with `status` and a message containing `text`.
void expect_plan_fails(const Problem& pr, const strata_chunk_loss_options& o, strata_status status, const char* text,
                       const strata_tensor_desc* h = nullptr, const strata_tensor_desc* w = nullptr,
                       const strata_tensor_desc* b = nullptr, const strata_tensor_desc* t = nullptr,
                       const strata_tensor_desc* loss = nullptr, const strata_tensor_desc* lse = nullptr,
                       const strata_tensor_desc* dh = nullptr, const strata_tensor_desc* dw = nullptr,
                       const strata_tensor_desc* db = nullptr) {
  strata_plan p = nullptr;
  const strata_status s = strata_chunk_loss_plan(h ? h : &pr.h.desc, w ? w : &pr.w.desc, b ? b : &pr.b.desc,
                                                 t ? t : &pr.t.desc, loss ? loss : &pr.loss.desc,
                                                 lse ? lse : &pr.lse.desc, dh ? dh : &pr.dh.desc,
                                                 dw ? dw : &pr.dw.desc, db ? db : &pr.db.desc, &o, &p);
  EXPECT_EQ(s, status) << text;
  EXPECT_NE(std::string(strata_get_last_error_message()).find(text), std::string::npos)
      << "message: " << strata_get_last_error_message() << " expected to contain: " << text;
  if (s == STRATA_SUCCESS) strata_plan_destroy(p);
}

TEST(ChunkLoss, NullRules) {
  Problem pr(STRATA_DTYPE_F32, 8, 16, 20, 1);
  const auto o = defaults();
  strata_plan p = nullptr;
  EXPECT_EQ(strata_chunk_loss_plan(nullptr, &pr.w.desc, nullptr, &pr.t.desc, &pr.loss.desc, nullptr, nullptr, nullptr,
                                   nullptr, &o, &p),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("chunk_loss: hidden"), std::string::npos);
  EXPECT_EQ(strata_chunk_loss_plan(&pr.h.desc, &pr.w.desc, nullptr, &pr.t.desc, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, &o, &p),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("loss"), std::string::npos);
  EXPECT_EQ(strata_chunk_loss_plan(&pr.h.desc, &pr.w.desc, nullptr, &pr.t.desc, &pr.loss.desc, nullptr, nullptr,
                                   nullptr, &pr.db.desc, &o, &p),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("dbias is given but bias is NULL"), std::string::npos);
  EXPECT_EQ(strata_chunk_loss_bwd_plan(&pr.h.desc, &pr.w.desc, nullptr, &pr.t.desc, &pr.lse.desc, nullptr, nullptr,
                                       nullptr, nullptr, &o, &p),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("at least one of dhidden, dweight, dbias"),
            std::string::npos);
}

TEST(ChunkLoss, DeviceRules) {
  Problem pr(STRATA_DTYPE_F32, 8, 16, 20, 1);
  strata_tensor_desc w = pr.w.desc;
  w.device = {STRATA_DEVICE_CUDA, 7};
  strata_plan p = nullptr;
  const auto o = defaults();
  const strata_status s = strata_chunk_loss_plan(&pr.h.desc, &w, &pr.b.desc, &pr.t.desc, &pr.loss.desc, &pr.lse.desc,
                                                 &pr.dh.desc, &pr.dw.desc, &pr.db.desc, &o, &p);
  EXPECT_TRUE(s == STRATA_ERROR_INVALID_DEVICE || s == STRATA_ERROR_DEVICE_UNAVAILABLE) << s;
  EXPECT_NE(std::string(strata_get_last_error_message()).find("weight"), std::string::npos);
}

TEST(ChunkLoss, DtypeRules) {
  Problem pr(STRATA_DTYPE_BF16, 8, 16, 20, 1);
  const auto o = defaults();
  strata_tensor_desc x = pr.h.desc;
  x.dtype = STRATA_DTYPE_I32;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_DTYPE, "chunk_loss: hidden", &x);
  strata_tensor_desc w = pr.w.desc;
  w.dtype = STRATA_DTYPE_F32;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_DTYPE, "weight", nullptr, &w);
  strata_tensor_desc b = pr.b.desc;
  b.dtype = STRATA_DTYPE_F16;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_DTYPE, "bias", nullptr, nullptr, &b);
  strata_tensor_desc t = pr.t.desc;
  t.dtype = STRATA_DTYPE_I32;
  t.strides[0] = 1;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_DTYPE, "target", nullptr, nullptr, nullptr, &t);
  strata_tensor_desc loss = pr.loss.desc;
  loss.dtype = STRATA_DTYPE_BF16;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_DTYPE, "loss", nullptr, nullptr, nullptr, nullptr, &loss);
  strata_tensor_desc dh = pr.dh.desc;
  dh.dtype = STRATA_DTYPE_F16;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_DTYPE, "dhidden must be f32 or bf16", nullptr, nullptr, nullptr,
                    nullptr, nullptr, nullptr, &dh);
}

TEST(ChunkLoss, ShapeRules) {
  Problem pr(STRATA_DTYPE_F32, 8, 16, 20, 1);
  const auto o = defaults();
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_F32, {20, 15});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "weight must have shape [V, D] with D = 16", nullptr, &w);
  const strata_tensor_desc w0 = make_desc(STRATA_DTYPE_F32, {0, 16});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "V >= 1", nullptr, &w0);
  const strata_tensor_desc h3 = make_desc(STRATA_DTYPE_F32, {2, 4, 16});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "hidden", &h3);
  const strata_tensor_desc b = make_desc(STRATA_DTYPE_F32, {21});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "bias", nullptr, nullptr, &b);
  const strata_tensor_desc t = make_desc(STRATA_DTYPE_I64, {9});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "target", nullptr, nullptr, nullptr, &t);
  const strata_tensor_desc loss = make_desc(STRATA_DTYPE_F32, {2});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "loss must be a scalar", nullptr, nullptr, nullptr, nullptr,
                    &loss);
  const strata_tensor_desc lse = make_desc(STRATA_DTYPE_F32, {7});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "lse", nullptr, nullptr, nullptr, nullptr, nullptr, &lse);
  const strata_tensor_desc dw = make_desc(STRATA_DTYPE_F32, {20, 17});
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_SHAPE, "dweight", nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, nullptr, &dw);
}

TEST(ChunkLoss, StrideRules) {
  Problem pr(STRATA_DTYPE_F32, 8, 16, 20, 1);
  const auto o = defaults();
  strata_tensor_desc h = pr.h.desc;
  h.strides[1] = 2;
  h.strides[0] = 32;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_STRIDE, "hidden", &h);
  strata_tensor_desc dw = pr.dw.desc;
  dw.strides[0] = 0;
  expect_plan_fails(pr, o, STRATA_ERROR_INVALID_STRIDE, "dweight", nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, nullptr, &dw);
}

TEST(ChunkLoss, AttributeRules) {
  Problem pr(STRATA_DTYPE_F32, 8, 16, 20, 1);
  struct Rule {
    void (*set)(strata_chunk_loss_options&);
    const char* text;
  };
  const Rule rules[] = {
      {[](strata_chunk_loss_options& o) { o.reduction = 2; }, "reduction must be 0 (mean) or 1 (sum), got 2"},
      {[](strata_chunk_loss_options& o) { o.label_smoothing = 1.5f; }, "label_smoothing must be in [0, 1]"},
      {[](strata_chunk_loss_options& o) { o.label_smoothing = NAN; }, "label_smoothing must be in [0, 1]"},
      {[](strata_chunk_loss_options& o) { o.logit_scale = INFINITY; }, "logit_scale must be finite"},
      {[](strata_chunk_loss_options& o) { o.softcap = -1.f; }, "softcap must be 0 (off) or finite and > 0"},
      {[](strata_chunk_loss_options& o) { o.softcap = NAN; }, "softcap must be 0 (off) or finite and > 0"},
      {[](strata_chunk_loss_options& o) { o.lse_square_scale = -0.1f; }, "lse_square_scale must be finite and >= 0"},
      {[](strata_chunk_loss_options& o) { o.grad_scale = NAN; }, "grad_scale must be finite"},
      {[](strata_chunk_loss_options& o) { o.strategy = 3; }, "strategy must be 0 (auto)"},
      {[](strata_chunk_loss_options& o) { o.chunk_rows = -1; }, "chunk_rows must be 0 (auto)"},
      {[](strata_chunk_loss_options& o) { o.vocab_tile = -5; }, "vocab_tile must be 0 (auto)"},
  };
  for (const Rule& r : rules) {
    auto o = defaults();
    r.set(o);
    expect_plan_fails(pr, o, STRATA_ERROR_INVALID_ATTRIBUTE, r.text);
  }
}

// An out-of-range target fails the run on every CPU implementation and writes nothing.
TEST(ChunkLoss, TargetsOutOfRangeFailAndWriteNothing) {
  for (const std::string& impl : atk::impls_for("chunk_loss", kCpu)) {
    ForceImpl force(impl.c_str());
    for (double bad : {20.0, -1.0, 1e6}) {
      Problem pr(STRATA_DTYPE_F32, 8, 16, 20, 2, 0.0);
      pr.t.set(5, bad);
      const auto o = defaults();
      EXPECT_EQ(pr.run_fwd(&o), STRATA_ERROR_INVALID_VALUE) << impl;
      EXPECT_NE(std::string(strata_get_last_error_message()).find("target[5]"), std::string::npos) << impl;
      for (const HostTensor* x : {&pr.loss, &pr.lse, &pr.dh, &pr.dw, &pr.db}) EXPECT_TRUE(all_poison(*x)) << impl;
      EXPECT_EQ(pr.run_bwd(&o), STRATA_ERROR_INVALID_VALUE) << impl;
      for (const HostTensor* x : {&pr.dh, &pr.dw, &pr.db}) EXPECT_TRUE(all_poison(*x)) << impl;
    }
  }
}

// Gradients of the float64 reference against central differences of its loss, every option on.
TEST(ChunkLoss, GradientMatchesFloat64FiniteDifferences) {
  ForceImpl force("reference");
  for (int mode = 0; mode < 2; ++mode) {  // 0: forward op with grad_scale; 1: backward op with dloss
    Problem pr(STRATA_DTYPE_F64, 6, 5, 7, 11 + mode, 0.3);
    pr.t.set(0, 3.0);  // at least one valid row
    auto o = defaults();
    o.label_smoothing = 0.1f;
    o.lse_square_scale = 0.05f;
    o.softcap = 3.f;
    o.logit_scale = 0.8f;
    o.reduction = mode == 0 ? STRATA_CHUNK_LOSS_MEAN : STRATA_CHUNK_LOSS_SUM;
    const double G = mode == 0 ? 0.7 : -1.3;
    if (mode == 0) o.grad_scale = static_cast<float>(G);
    pr.g.set(0, G);
    ASSERT_EQ(pr.run_fwd(&o, mode == 0), STRATA_SUCCESS) << strata_get_last_error_message();
    if (mode == 1) ASSERT_EQ(pr.run_bwd(&o), STRATA_SUCCESS) << strata_get_last_error_message();
    const std::vector<double> dh = pr.dh.values(), dw = pr.dw.values(), db = pr.db.values();
    auto loss_at = [&]() {
      Problem q = pr;
      auto o2 = o;
      EXPECT_EQ(q.run_fwd(&o2, false), STRATA_SUCCESS);
      return q.loss.get(0);
    };
    const double step = 1e-6;
    auto check_fd = [&](HostTensor& x, const std::vector<double>& grad, const char* name) {
      double err = 0, ref = 0;
      for (int64_t e = 0; e < x.numel(); ++e) {
        const double v = x.get(e);
        x.set(e, v + step);
        const double lp = loss_at();
        x.set(e, v - step);
        const double lm = loss_at();
        x.set(e, v);
        const double fd = G * (lp - lm) / (2 * step);
        err = std::max(err, std::fabs(fd - grad[static_cast<size_t>(e)]));
        ref = std::max(ref, std::fabs(fd));
      }
      EXPECT_LT(err, 1e-7 * std::max(ref, 1.0)) << name << " mode " << mode;
      EXPECT_GT(ref, 1e-4) << name;  // the check is not vacuous
    };
    check_fd(pr.h, dh, "dhidden");
    check_fd(pr.w, dw, "dweight");
    check_fd(pr.b, db, "dbias");
  }
}

// Same bits run to run and with 1 or 2 threads, for both strategies and each CPU implementation.
TEST(ChunkLoss, BitwiseAcrossRunsAndThreadCounts) {
  for (const std::string& impl : atk::impls_for("chunk_loss", kCpu)) {
    if (impl == "reference") continue;
    ForceImpl force(impl.c_str());
    for (int32_t strat : {STRATA_CHUNK_LOSS_TOKEN_CHUNKED, STRATA_CHUNK_LOSS_VOCAB_TILED})
      for (int32_t dt : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
        auto o = defaults();
        o.strategy = strat;
        o.chunk_rows = 48;
        o.vocab_tile = 200;
        o.label_smoothing = 0.1f;
        std::vector<std::vector<uint8_t>> outs;
        for (int threads : {1, 2, 2, 1}) {
          ThreadCount tc(threads);
          Problem pr(dt, 150, 96, 700, 5);
          ASSERT_EQ(pr.run_fwd(&o), STRATA_SUCCESS) << strata_get_last_error_message();
          std::vector<uint8_t> all;
          for (const HostTensor* x : {&pr.loss, &pr.lse, &pr.dh, &pr.dw, &pr.db})
            all.insert(all.end(), x->storage.begin(), x->storage.end());
          outs.push_back(all);
        }
        for (size_t i = 1; i < outs.size(); ++i) EXPECT_EQ(outs[i], outs[0]) << impl << " strategy " << strat;
      }
  }
}

// Token-chunked, vocab-tiled and the backward op agree (to f32 rounding) on the same problem.
TEST(ChunkLoss, StrategiesAndBackwardOpAgree) {
  Problem base(STRATA_DTYPE_F32, 70, 64, 333, 9);
  auto o = defaults();
  o.softcap = 10.f;
  o.chunk_rows = 16;
  o.vocab_tile = 100;
  std::vector<std::vector<double>> res;
  for (int k = 0; k < 3; ++k) {
    Problem pr = base;
    o.strategy = k == 0 ? STRATA_CHUNK_LOSS_TOKEN_CHUNKED : STRATA_CHUNK_LOSS_VOCAB_TILED;
    ASSERT_EQ(pr.run_fwd(&o, k < 2), STRATA_SUCCESS) << strata_get_last_error_message();
    if (k == 2) ASSERT_EQ(pr.run_bwd(&o), STRATA_SUCCESS) << strata_get_last_error_message();
    std::vector<double> v = pr.dw.values();
    const std::vector<double> dh = pr.dh.values();
    v.insert(v.end(), dh.begin(), dh.end());
    v.push_back(pr.lse.get(3));
    res.push_back(v);
  }
  for (int k = 1; k < 3; ++k)
    for (size_t i = 0; i < res[0].size(); ++i) ASSERT_NEAR(res[k][i], res[0][i], 1e-5 * (1 + std::fabs(res[0][i]))) << k;
}

std::string plan_summary(int32_t dt, int64_t N, int64_t D, int64_t V, int32_t gdt, int32_t strategy, size_t* ws) {
  const strata_tensor_desc h = make_desc(dt, {N, D}), w = make_desc(dt, {V, D}), t = make_desc(STRATA_DTYPE_I64, {N});
  const strata_tensor_desc loss = make_desc(STRATA_DTYPE_F32, {}), lse = make_desc(STRATA_DTYPE_F32, {N});
  const strata_tensor_desc dh = make_desc(gdt, {N, D}), dw = make_desc(gdt, {V, D});
  auto o = defaults();
  o.strategy = strategy;
  strata_plan p = nullptr;
  EXPECT_EQ(strata_chunk_loss_plan(&h, &w, nullptr, &t, &loss, &lse, &dh, &dw, nullptr, &o, &p), STRATA_SUCCESS);
  strata_plan_workspace_size(p, ws);
  std::string s = plan_from_handle(p)->summary;
  strata_plan_destroy(p);
  return s;
}

// The documented heuristic (README.md): token_chunked when its f32 dW accumulator fits (f32 dweight) and chunks
// are tall enough, vocab_tiled otherwise; forcing works; the workspace of the chosen plan stays in the budget
// where the README says it does.
TEST(ChunkLoss, StrategyHeuristicAndBudget) {
  size_t ws = 0;
  std::string s = plan_summary(STRATA_DTYPE_F32, 1024, 1024, 32000, STRATA_DTYPE_F32, 0, &ws);
  EXPECT_NE(s.find("strategy=token_chunked"), std::string::npos) << s;
  EXPECT_LE(ws, size_t{64} << 20) << s;
  s = plan_summary(STRATA_DTYPE_BF16, 1024, 1024, 32000, STRATA_DTYPE_F32, 0, &ws);  // f32 copies of bf16 operands
  EXPECT_NE(s.find("strategy=token_chunked"), std::string::npos) << s;
  EXPECT_LE(ws, size_t{64} << 20) << s;
  s = plan_summary(STRATA_DTYPE_BF16, 1024, 1024, 32000, STRATA_DTYPE_BF16, 0, &ws);
  EXPECT_NE(s.find("strategy=vocab_tiled"), std::string::npos) << s;  // a bf16 dW would need a 125 MiB f32 copy
  s = plan_summary(STRATA_DTYPE_BF16, 1024, 1024, 32000, STRATA_DTYPE_BF16, STRATA_CHUNK_LOSS_TOKEN_CHUNKED, &ws);
  EXPECT_NE(s.find("strategy=token_chunked"), std::string::npos) << s;
  EXPECT_GE(ws, size_t{32000} * 1024 * 4);  // forced: the f32 accumulator is workspace
  s = plan_summary(STRATA_DTYPE_F32, 1024, 1024, 32000, STRATA_DTYPE_F32, STRATA_CHUNK_LOSS_VOCAB_TILED, &ws);
  EXPECT_NE(s.find("strategy=vocab_tiled"), std::string::npos) << s;
  EXPECT_LE(ws, (size_t{64} << 20) + (size_t{1} << 20)) << s;
}

// The CUDA plan of the H200 target shape (host logic, no device needed): bf16 N=8192 D=4096 V=151936 with
// bf16 and f32 dweight: vocab_tiled with one token block, a bf16 tile of <= 64 MiB in all (so the workspace is
// within the budget), dW tiles stored directly and the f32 dH accumulator in dweight's last rows.
TEST(ChunkLoss, CudaPlanOfTheTargetShapeStaysInBudget) {
  loss::BackendTraits tr;  // what chunk_loss_cuda_traits() says (README.md)
  tr.convert_operands = false;
  tr.separate_dz = true;
  tr.gemm_stores_any = true;
  tr.min_chunk_rows = 1024;
  tr.bf16_tile = true;
  for (int32_t dw_dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F32}) {
    loss::ChunkLossParams p;
    p.N = 8192, p.D = 4096, p.V = 151936;
    p.h_dtype = p.w_dtype = STRATA_DTYPE_BF16;
    p.dh_dtype = STRATA_DTYPE_BF16, p.dw_dtype = dw_dt;
    p.ld_h = p.ld_w = p.ld_dh = p.ld_dw = p.D;
    p.ce = loss::ce_consts(loss::CeOptions{}, p.V);
    int dummy = 0;
    p.dhidden = &dummy, p.dweight = &dummy;  // only their presence matters to the plan
    const loss::ChunkLossLayout L = loss::chunk_loss_choose(p, tr, loss::kStrategyAuto, 0, 0);
    EXPECT_EQ(p.strategy, loss::kStrategyVocabTiled);
    EXPECT_EQ(p.rows, 8192);
    EXPECT_EQ(p.vtile, 3968);
    EXPECT_EQ(L.z_dtype, STRATA_DTYPE_BF16);
    EXPECT_EQ(L.dz, L.z);
    EXPECT_TRUE(L.dw_direct);
    EXPECT_TRUE(L.dh_in_dw);
    EXPECT_LE(L.total, size_t{64} << 20);
    // Without dweight the f32 dH accumulator is workspace again (the README's exception).
    p.dweight = nullptr;
    const loss::ChunkLossLayout L2 = loss::chunk_loss_choose(p, tr, loss::kStrategyAuto, 0, 0);
    EXPECT_FALSE(L2.dh_in_dw);
    EXPECT_GE(L2.total, size_t{128} << 20);
  }
}

// Session 15: where the vocab_tiled loop keeps the logits tiles (driver.h vt_memory; host logic, no device), with
// the CUDA traits and made-up 256-byte aligned addresses (dhidden, then dweight, as an allocator would place the
// gradients). Checked for every tile t: kept tiles lie inside dweight before the dH accumulator (or tile 0 in the
// workspace tile with keep_first_in_ws), pairwise apart, and no dW tile written at step t <= s overlaps kept tile s
// (the backward reads s after writing dW tiles 0..s); the forward's scratch (dhidden's storage) holds a tile. At the
// H200 shape with a bf16 dweight: 18 tiles kept with keep_first_in_ws (tile 0 in the workspace, 1..17 in dweight)
// against 17 without; never fewer at the other shapes.
TEST(ChunkLoss, KeptTilesStayApartFromTheDwTilesAndTheAccumulator) {
  loss::BackendTraits tr;  // what chunk_loss_cuda_traits() says by default (README.md)
  tr.separate_dz = true, tr.gemm_stores_any = true, tr.min_chunk_rows = 1024, tr.bf16_tile = true;
  tr.dh_batch2 = true;
  struct Shape {
    int64_t N, D, V, vtile;
    int32_t dw_dt;
    int64_t keep_old, keep_new;  // -1: only new >= old is checked
  };
  for (const Shape& sh : {Shape{8192, 4096, 151936, 0, STRATA_DTYPE_BF16, 17, 18},
                          Shape{8192, 4096, 151936, 0, STRATA_DTYPE_F32, 36, 36},
                          Shape{256, 128, 4000, 128, STRATA_DTYPE_BF16, 13, 14},
                          Shape{64, 64, 4000, 512, STRATA_DTYPE_BF16, -1, -1},
                          Shape{300, 200, 5000, 160, STRATA_DTYPE_BF16, -1, -1}}) {
    loss::ChunkLossParams p;
    p.N = sh.N, p.D = sh.D, p.V = sh.V;
    p.h_dtype = p.w_dtype = p.dh_dtype = STRATA_DTYPE_BF16;
    p.dw_dtype = sh.dw_dt;
    p.ld_h = p.ld_w = p.ld_dh = p.ld_dw = p.D;
    p.ce = loss::ce_consts(loss::CeOptions{}, p.V);
    const int64_t dh_bytes = p.N * p.D * 2, dw_bytes = p.V * p.D * static_cast<int64_t>(dtype_size(sh.dw_dt));
    const uintptr_t dh_at = uintptr_t{1} << 40, dw_at = dh_at + (static_cast<uintptr_t>(dh_bytes) + 255) / 256 * 256;
    p.dhidden = reinterpret_cast<void*>(dh_at), p.dweight = reinterpret_cast<void*>(dw_at);
    p.loss = p.dhidden;  // a forward with gradients (only the presence matters)
    const loss::ChunkLossLayout L = loss::chunk_loss_choose(p, tr, loss::kStrategyVocabTiled, 0, sh.vtile);
    ASSERT_EQ(p.rows, p.N) << "one token block";
    ASSERT_TRUE(L.dh_in_dw);
    int64_t kept[2] = {0, 0};
    for (bool first_in_ws : {false, true}) {
      tr.keep_first_in_ws = first_in_ws;
      const loss::VtMemory m = loss::vt_memory(p, L, tr, true);
      kept[first_in_ws] = m.n_keep;
      const int64_t vt = p.vtile, n_tiles = (p.V + vt - 1) / vt;
      const int64_t zt = p.N * vt * 2, wt = vt * p.D * static_cast<int64_t>(dtype_size(sh.dw_dt));
      char* const Z = reinterpret_cast<char*>(uintptr_t{1} << 44);  // the workspace tile
      auto at = [&](int64_t s) { return reinterpret_cast<uintptr_t>(m.tile(s, Z)); };
      const uintptr_t acc = reinterpret_cast<uintptr_t>(m.dh_in_dw);
      for (int64_t s = 0; s < m.n_keep; ++s) {
        if (at(s) == reinterpret_cast<uintptr_t>(Z)) {
          EXPECT_TRUE(first_in_ws && s == 0) << "tile " << s << " kept in the workspace tile";
          continue;
        }
        EXPECT_GE(at(s), dw_at) << "tile " << s;
        EXPECT_LE(at(s) + static_cast<uintptr_t>(zt), acc) << "kept tile " << s << " reaches the dH accumulator";
        if (s + 1 < m.n_keep) EXPECT_LE(at(s) + static_cast<uintptr_t>(zt), at(s + 1)) << "tiles " << s << ", " << s + 1;
        for (int64_t t = 0; t <= s; ++t)  // dW tile t: bytes [t wt, (t + 1) wt) of dweight, written at step t
          EXPECT_LE(dw_at + static_cast<uintptr_t>((t + 1) * wt), at(s)) << "dW tile " << t << " over kept tile " << s;
      }
      for (int64_t s = m.n_keep; s < n_tiles; ++s) EXPECT_EQ(m.tile(s, Z), static_cast<void*>(Z)) << "tile " << s;
      if (first_in_ws && m.n_keep < n_tiles && dh_bytes >= zt) {  // dhidden's storage holds a tile: the scratch
        ASSERT_EQ(m.fwd_scratch, static_cast<char*>(p.dhidden)) << "N " << sh.N;
        EXPECT_EQ(m.fwd(m.n_keep, Z), static_cast<void*>(m.fwd_scratch));
        EXPECT_EQ(m.fwd(0, Z), static_cast<void*>(Z));
      } else {
        EXPECT_EQ(m.fwd_scratch, nullptr) << "N " << sh.N;
      }
    }
    EXPECT_GE(kept[1], kept[0]) << "N " << sh.N;
    if (sh.keep_old >= 0) EXPECT_EQ(kept[0], sh.keep_old) << "N " << sh.N << " D " << sh.D;
    if (sh.keep_new >= 0) EXPECT_EQ(kept[1], sh.keep_new) << "N " << sh.N << " D " << sh.D;
  }
}

bool have_cuda() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS && n > 0;
}

// The problem's outputs computed on cuda:0 (forward with gradients, then the backward op into the same
// gradient buffers when `bwd`), as the bytes of loss, lse, dhidden, dweight, dbias.
std::vector<uint8_t> cuda_bits(Problem& pr, const strata_chunk_loss_options& o, bool bwd) {
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  atk::DeviceTensor h(pr.h, dev), w(pr.w, dev), b(pr.b, dev), t(pr.t, dev), loss(pr.loss, dev), lse(pr.lse, dev),
      dh(pr.dh, dev), dw(pr.dw, dev), db(pr.db, dev), g(pr.g, dev);
  auto run = [&](strata_plan p, std::vector<void*> ptrs) {
    size_t ws = 0;
    strata_plan_workspace_size(p, &ws);
    void* work = nullptr;
    if (ws) EXPECT_EQ(strata_malloc(dev, ws, nullptr, &work), STRATA_SUCCESS);
    EXPECT_EQ(strata_plan_run(p, ptrs.data(), 9, work, ws, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
    strata_device_synchronize(dev);
    if (work) strata_free(work);
    strata_plan_destroy(p);
  };
  strata_plan p = nullptr;
  EXPECT_EQ(strata_chunk_loss_plan(&h.desc(), &w.desc(), &b.desc(), &t.desc(), &loss.desc(), &lse.desc(), &dh.desc(),
                                   &dw.desc(), &db.desc(), &o, &p),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  run(p, {h.data(), w.data(), b.data(), t.data(), loss.data(), lse.data(), dh.data(), dw.data(), db.data()});
  if (bwd) {
    EXPECT_EQ(strata_chunk_loss_bwd_plan(&h.desc(), &w.desc(), &b.desc(), &t.desc(), &lse.desc(), &g.desc(),
                                         &dh.desc(), &dw.desc(), &db.desc(), &o, &p),
              STRATA_SUCCESS)
        << strata_get_last_error_message();
    run(p, {h.data(), w.data(), b.data(), t.data(), lse.data(), g.data(), dh.data(), dw.data(), db.data()});
  }
  std::vector<uint8_t> all;
  for (auto [d, x] : {std::pair{&loss, &pr.loss}, {&lse, &pr.lse}, {&dh, &pr.dh}, {&dw, &pr.dw}, {&db, &pr.db}}) {
    d->download(*x);
    all.insert(all.end(), x->storage.begin(), x->storage.end());
  }
  return all;
}

// Determinism level 1 on CUDA: the same bits on every run, both strategies, both ops, 16-bit and f32.
TEST(ChunkLoss, CudaSameBitsRunToRun) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  for (int32_t strat : {STRATA_CHUNK_LOSS_TOKEN_CHUNKED, STRATA_CHUNK_LOSS_VOCAB_TILED})
    for (int32_t dt : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16})
      for (bool bwd : {false, true}) {
        auto o = defaults();
        o.strategy = strat;
        o.chunk_rows = 128;
        o.vocab_tile = 512;
        o.label_smoothing = 0.1f;
        Problem a(dt, 300, 128, 2000, 21), b2(dt, 300, 128, 2000, 21);
        const std::vector<uint8_t> x = cuda_bits(a, o, bwd), y = cuda_bits(b2, o, bwd);
        EXPECT_EQ(x, y) << "strategy " << strat << " dtype " << dtype_name(dt) << " bwd " << bwd;
      }
}

// The CUDA epilogue overlap (STRATA_CHUNK_LOSS_OVERLAP=1: statistics and kept tiles' gradients on a second
// stream, the forward's other tiles alternating between two buffers) runs the same kernels on the same data: the
// same bits as the default path. vocab_tiled with one token block and 512-column tiles: 6 of the 8 tiles kept in
// dweight's storage, the other two alternating, the dH accumulator split; forward with gradients and the
// backward op (with a bias: the column sums wait for the side stream after each tile).
TEST(ChunkLoss, CudaOverlapGivesTheSameBits) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  struct Env {
    explicit Env(const char* v) { setenv("STRATA_CHUNK_LOSS_OVERLAP", v, 1); }
    ~Env() { unsetenv("STRATA_CHUNK_LOSS_OVERLAP"); }
  };
  for (bool bwd : {false, true}) {
    auto o = defaults();
    o.strategy = STRATA_CHUNK_LOSS_VOCAB_TILED;
    o.vocab_tile = 512;
    o.label_smoothing = 0.1f;
    Problem a(STRATA_DTYPE_BF16, 64, 64, 4000, 23), b2(STRATA_DTYPE_BF16, 64, 64, 4000, 23);
    const std::vector<uint8_t> x = cuda_bits(a, o, bwd);
    std::vector<uint8_t> y;
    {
      Env on("1");
      y = cuda_bits(b2, o, bwd);
    }
    EXPECT_EQ(x, y) << "bwd " << bwd;
  }
}

// Out-of-range targets on CUDA: the call fails with the message and writes nothing.
TEST(ChunkLoss, CudaTargetsOutOfRangeFailAndWriteNothing) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  Problem pr(STRATA_DTYPE_BF16, 16, 32, 40, 3, 0.0);
  pr.t.set(7, 40.0);
  atk::DeviceTensor h(pr.h, dev), w(pr.w, dev), t(pr.t, dev), loss(pr.loss, dev), lse(pr.lse, dev), dw(pr.dw, dev);
  const auto o = defaults();
  strata_plan p = nullptr;
  ASSERT_EQ(strata_chunk_loss_plan(&h.desc(), &w.desc(), nullptr, &t.desc(), &loss.desc(), &lse.desc(), nullptr,
                                   &dw.desc(), nullptr, &o, &p),
            STRATA_SUCCESS);
  size_t ws = 0;
  strata_plan_workspace_size(p, &ws);
  void* work = nullptr;
  ASSERT_EQ(strata_malloc(dev, ws, nullptr, &work), STRATA_SUCCESS);
  void* tp[] = {h.data(), w.data(), nullptr, t.data(), loss.data(), lse.data(), nullptr, dw.data(), nullptr};
  EXPECT_EQ(strata_plan_run(p, tp, 9, work, ws, nullptr), STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("out of range"), std::string::npos);
  strata_device_synchronize(dev);
  strata_free(work);
  strata_plan_destroy(p);
  loss.download(pr.loss);
  dw.download(pr.dw);
  EXPECT_TRUE(all_poison(pr.loss));
  EXPECT_TRUE(all_poison(pr.dw));
}

// An environment variable for the scope of the object (the CUDA backend reads its variant switches per call).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

#if STRATA_WITH_CUDA
// Device memory for the direct calls below.
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  char* c() const { return static_cast<char*>(p); }
};

// A bf16 problem on the device for direct chunk_loss_cuda calls: hidden, weight (N(0, 0.25)), targets (row i ignored
// when i % skip == skip_at) and the gradients in one buffer, dhidden first or dweight first (256-byte aligned), so
// that a test can place dweight's tail below or above dhidden.
struct DirectBf16 {
  int64_t N, D, V;
  size_t hb, wb;
  DevBuf h_in, w_in, t, loss, lse, grads;
  DirectBf16(int64_t n, int64_t d, int64_t v, uint64_t seed, int64_t skip, int64_t skip_at)
      : N(n), D(d), V(v), hb(static_cast<size_t>(n * d * 2)), wb(static_cast<size_t>(v * d * 2)), h_in(hb), w_in(wb),
        t(static_cast<size_t>(n * 8)), loss(4), lse(static_cast<size_t>(n * 4)), grads(hb + wb + 4096) {
    std::mt19937_64 rng(seed);
    const HostTensor h = rnd(STRATA_DTYPE_BF16, {N, D}, seed + 1), w = rnd(STRATA_DTYPE_BF16, {V, D}, seed + 2, 0.0, 0.25);
    std::vector<int64_t> th(N);
    for (int64_t i = 0; i < N; ++i) th[i] = i % skip == skip_at ? -100 : static_cast<int64_t>(rng() % V);
    EXPECT_EQ(cudaMemcpy(h_in.p, h.storage.data(), hb, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(w_in.p, w.storage.data(), wb, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(t.p, th.data(), N * 8, cudaMemcpyHostToDevice), cudaSuccess);
  }
  // A forward with bf16 gradients, dhidden at the start of `grads` (dh_first) or after dweight.
  loss::ChunkLossParams params(bool dh_first, const loss::CeOptions& o) const {
    loss::ChunkLossParams p;
    p.hidden = h_in.p, p.weight = w_in.p, p.target = static_cast<const int64_t*>(t.p);
    p.loss = loss.p, p.lse = lse.p;
    p.dhidden = dh_first ? grads.c() : grads.c() + (wb + 255) / 256 * 256;
    p.dweight = dh_first ? grads.c() + (hb + 255) / 256 * 256 : grads.c();
    p.h_dtype = p.w_dtype = p.dh_dtype = p.dw_dtype = p.db_dtype = STRATA_DTYPE_BF16;
    p.N = N, p.D = D, p.V = V;
    p.ld_h = p.ld_w = p.ld_dh = p.ld_dw = D;
    p.ce = loss::ce_consts(o, V);
    return p;
  }
  // One plain call on poisoned gradients and workspace: the bytes of loss, lse, dhidden, dweight.
  std::vector<uint8_t> run(const loss::ChunkLossParams& p, const loss::ChunkLossLayout& L, const DevBuf& ws) {
    EXPECT_EQ(cudaMemset(grads.p, 0xff, hb + wb + 4096), cudaSuccess);
    EXPECT_EQ(cudaMemset(ws.p, 0xff, L.total), cudaSuccess);
    EXPECT_EQ(loss::chunk_loss_cuda(p, L, ws.p, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> bits(4 + N * 4 + hb + wb);
    EXPECT_EQ(cudaMemcpy(bits.data(), loss.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(bits.data() + 4, lse.p, N * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(bits.data() + 4 + N * 4, p.dhidden, hb, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(bits.data() + 4 + N * 4 + hb, p.dweight, wb, cudaMemcpyDeviceToHost), cudaSuccess);
    return bits;
  }
};

// Session 14: the split dH accumulator's two GEMMs per tile as one strided-batched GEMM (the CUDA default; the
// two GEMMs with STRATA_CHUNK_LOSS_DH=pair), with dhidden below dweight (dhidden's storage holds rows [0, N/2))
// and above it (rows [N/2, N): the batch's strides stay positive). bf16 N = 64, D = 64, V = 4000, 512-column tiles, one token block: kept tiles,
// deferred tiles, the split accumulator. Against the two-GEMM path: the same loss, lse and dweight bits (the batch
// changes only the dH GEMMs) and dhidden within one bf16 rounding (plus 1e-3 of its RMS); the batched path runs one
// dH GEMM per tile.
TEST(ChunkLoss, CudaBatchedDhMatchesTwoGemms) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  DirectBf16 pr(64, 64, 4000, 41, 7, 3);
  const int64_t N = pr.N, D = pr.D, V = pr.V;
  struct Out {
    std::vector<uint8_t> bits;  // loss, lse, dhidden, dweight
    int64_t dh_gemms = 0;
  };
  auto run = [&](bool dh_first, bool batched) {
    loss::ChunkLossParams p = pr.params(dh_first, loss::CeOptions{});
    const loss::ChunkLossLayout L =
        loss::chunk_loss_choose(p, loss::chunk_loss_cuda_traits(), loss::kStrategyVocabTiled, 0, 512);
    EXPECT_TRUE(L.dh_in_dw && p.rows == N);
    DevBuf ws(L.total);
    Out o;
    std::unique_ptr<ScopedEnv> env;
    if (!batched) env = std::make_unique<ScopedEnv>("STRATA_CHUNK_LOSS_DH", "pair");
    loss::ChunkLossCudaSteps st;
    EXPECT_EQ(loss::chunk_loss_cuda_steps(p, L, ws.p, nullptr, &st), STRATA_SUCCESS) << strata_get_last_error_message();
    o.dh_gemms = st.calls[loss::kStepDhGemm];
    o.bits = pr.run(p, L, ws);
    return o;
  };
  const int64_t n_tiles = (V + 511) / 512;
  const size_t dh_at0 = 4 + N * 4, dw_at0 = dh_at0 + pr.hb;  // where dhidden and dweight start in Out::bits
  for (bool dh_first : {true, false}) {
    const Out ref = run(dh_first, false), got = run(dh_first, true);
    EXPECT_EQ(ref.dh_gemms, 2 * n_tiles);
    EXPECT_EQ(got.dh_gemms, n_tiles) << "the batched path did not run";
    EXPECT_TRUE(std::equal(ref.bits.begin(), ref.bits.begin() + dh_at0, got.bits.begin())) << "loss, lse; dh_first "
                                                                                            << dh_first;
    EXPECT_TRUE(std::equal(ref.bits.begin() + dw_at0, ref.bits.end(), got.bits.begin() + dw_at0)) << "dweight; dh_first "
                                                                                                  << dh_first;
    auto dh_at = [&](const std::vector<uint8_t>& v, int64_t i) {
      uint16_t b = 0;
      std::memcpy(&b, v.data() + dh_at0 + 2 * i, 2);
      return static_cast<double>(bf16_bits_to_f32(b));
    };
    double ss = 0.0, max_abs = 0.0;
    for (int64_t i = 0; i < N * D; ++i) ss += dh_at(ref.bits, i) * dh_at(ref.bits, i);
    const double rms = std::sqrt(ss / static_cast<double>(N * D));
    ASSERT_GT(rms, 0.0);
    for (int64_t i = 0; i < N * D; ++i) {
      const double x = dh_at(ref.bits, i), y = dh_at(got.bits, i);
      ASSERT_TRUE(std::isfinite(x) && std::isfinite(y)) << "dhidden[" << i << "] dh_first " << dh_first;
      max_abs = std::max(max_abs, std::fabs(x - y));
      // One bf16 rounding of the value, plus 1e-3 of the RMS for f32 sums the batch may order differently.
      EXPECT_LE(std::fabs(x - y), std::ldexp(std::fabs(x), -7) + 1e-3 * rms) << "dhidden[" << i << "] dh_first " << dh_first;
    }
    std::printf("[chunk_loss dh batch] dh_first %d: dhidden max |diff| %.3g (RMS %.3g) vs the two GEMMs\n",
                dh_first ? 1 : 0, max_abs, rms);
  }
}

// Session 15: tile 0 kept in the workspace tile, the forward's other tiles in dhidden's storage (the CUDA default;
// STRATA_CHUNK_LOSS_KEEP=dw forces the session-14 layout). bf16 N = 256, D = 128, V = 4000, 128-column tiles, one
// token block: 14 of 32 tiles kept instead of 13, the split dH accumulator, deferred tiles; the gradients also with
// dhidden below and above dweight. The same work on the same data: the same loss, lse, dhidden and dweight bits,
// with one logits GEMM fewer (counted by chunk_loss_cuda_steps).
TEST(ChunkLoss, CudaTileZeroKeptInTheWorkspaceGivesTheSameBits) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  DirectBf16 pr(256, 128, 4000, 51, 9, 4);
  struct Out {
    std::vector<uint8_t> bits;  // loss, lse, dhidden, dweight
    int64_t recomputes = 0;
  };
  auto run = [&](bool dh_first, bool first_in_ws) {
    loss::ChunkLossParams p = pr.params(dh_first, loss::CeOptions{1.f, 0.f, 0.1f, 0.f, -100});
    std::unique_ptr<ScopedEnv> env;
    if (!first_in_ws) env = std::make_unique<ScopedEnv>("STRATA_CHUNK_LOSS_KEEP", "dw");
    const loss::ChunkLossLayout L =
        loss::chunk_loss_choose(p, loss::chunk_loss_cuda_traits(), loss::kStrategyVocabTiled, 0, 128);
    EXPECT_TRUE(L.dh_in_dw && p.rows == pr.N);
    EXPECT_EQ(loss::vt_memory(p, L, loss::chunk_loss_cuda_traits(), true).n_keep, first_in_ws ? 14 : 13);
    DevBuf ws(L.total);
    Out o;
    loss::ChunkLossCudaSteps st;
    EXPECT_EQ(loss::chunk_loss_cuda_steps(p, L, ws.p, nullptr, &st), STRATA_SUCCESS) << strata_get_last_error_message();
    o.recomputes = st.calls[loss::kStepLogitsRecompute];
    o.bits = pr.run(p, L, ws);
    return o;
  };
  for (bool dh_first : {true, false}) {
    const Out ref = run(dh_first, false), got = run(dh_first, true);
    EXPECT_EQ(got.recomputes, ref.recomputes - 1) << "dh_first " << dh_first;
    EXPECT_TRUE(got.bits == ref.bits) << "dh_first " << dh_first;
    std::printf("[chunk_loss keep] dh_first %d: logits recomputes %lld (keep=dw: %lld), same bits %d\n",
                dh_first ? 1 : 0, static_cast<long long>(got.recomputes), static_cast<long long>(ref.recomputes),
                got.bits == ref.bits ? 1 : 0);
  }
}

// Session 15: the 16-byte row_stats with two rows per block (the CUDA default, row_stats_v8r) gives the bits of the
// one-row kernel (STRATA_CHUNK_LOSS_ROWS=1): bf16 N = 301 (odd: the last block has one row) and 300, D = 96, V = 5000,
// through the plan (forward with gradients, then the backward op) with 1000- and 4096-column tiles (1 and 2 vectors
// of 16 bytes per thread; 4096: the widest tile it takes), a scalar tail (1000 = 125 vectors, 4100: 512 vectors and
// 4 columns), bias and label smoothing; and a tile too wide for it (4200 columns: the one-row kernel runs).
TEST(ChunkLoss, CudaRowBlockKernelsGiveTheSameBits) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t n : {int64_t{301}, int64_t{300}})
    for (const int64_t vt : {int64_t{1000}, int64_t{4096}, int64_t{4100}, int64_t{4200}})
      for (bool bwd : {false, true}) {
        auto o = defaults();
        o.strategy = STRATA_CHUNK_LOSS_VOCAB_TILED;
        o.vocab_tile = vt;
        o.label_smoothing = 0.1f;
        Problem a(STRATA_DTYPE_BF16, n, 96, 5000, 61), b2(STRATA_DTYPE_BF16, n, 96, 5000, 61);
        std::vector<uint8_t> ref;
        {
          ScopedEnv env("STRATA_CHUNK_LOSS_ROWS", "1");
          ref = cuda_bits(a, o, bwd);
        }
        const std::vector<uint8_t> got = cuda_bits(b2, o, bwd);
        EXPECT_TRUE(got == ref) << "N " << n << " vtile " << vt << " bwd " << bwd;
      }
}

// Session 13: where the time of the H200 target call goes. chunk_loss_cuda at bf16 N = 8192, D = 4096,
// V = 151936 with bf16 dhidden and dweight (the in-budget plan: vocab_tiled, one token block, vt = 3968) timed as a
// whole (CUDA events around single calls, median of 7 after a warm-up), then one call split into its steps by
// chunk_loss_cuda_steps (events around every backend call). The stepped call must give the same loss and lse
// bits as a plain call (the events change no work), and its steps must fit inside its span. Prints one line per
// step: calls, ms, share of the plain call, TFLOP/s for the GEMMs (README.md "CUDA (H200)" keeps the figures).
TEST(ChunkLoss, CudaStepBreakdown) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 8192, D = 4096, V = 151936;
  struct Buf {
    void* p = nullptr;
    explicit Buf(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
    ~Buf() { cudaFree(p); }
  };
  Buf h(N * D * 2), w(V * D * 2), t(N * 8), loss(4), lse(N * 4), dh(N * D * 2), dw(V * D * 2);
  // N(0, sd) bf16 values: a 1 Mi-value pattern repeated by doubling device-to-device copies.
  auto fill = [](void* dst, size_t n, float sd, uint32_t seed) {
    const size_t pat = std::min<size_t>(n, size_t{1} << 20);
    std::vector<uint16_t> host(pat);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, sd);
    for (uint16_t& v : host) v = f32_to_bf16_bits(nd(rng));
    char* d = static_cast<char*>(dst);
    EXPECT_EQ(cudaMemcpy(d, host.data(), pat * 2, cudaMemcpyHostToDevice), cudaSuccess);
    for (size_t done = pat; done < n;) {
      const size_t c = std::min(done, n - done);
      EXPECT_EQ(cudaMemcpy(d + done * 2, d, c * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
      done += c;
    }
  };
  fill(h.p, N * D, 1.f, 1);
  fill(w.p, V * D, 2.f / std::sqrt(static_cast<float>(D)), 2);
  std::vector<int64_t> th(N);
  for (int64_t i = 0; i < N; ++i) th[i] = i % 5 == 4 ? -100 : (i * 7919 + 3) % V;  // every 5th row ignored
  ASSERT_EQ(cudaMemcpy(t.p, th.data(), N * 8, cudaMemcpyHostToDevice), cudaSuccess);

  loss::ChunkLossParams p;
  p.hidden = h.p, p.weight = w.p, p.target = static_cast<const int64_t*>(t.p);
  p.loss = loss.p, p.lse = lse.p, p.dhidden = dh.p, p.dweight = dw.p;
  p.h_dtype = p.w_dtype = p.dh_dtype = p.dw_dtype = p.db_dtype = STRATA_DTYPE_BF16;
  p.N = N, p.D = D, p.V = V;
  p.ld_h = p.ld_w = p.ld_dh = p.ld_dw = D;
  p.ce = loss::ce_consts(loss::CeOptions{}, V);
  const loss::ChunkLossLayout L = loss::chunk_loss_choose(p, loss::chunk_loss_cuda_traits(), loss::kStrategyAuto, 0, 0);
  EXPECT_LE(L.total, size_t{64} << 20);
  Buf ws(L.total);
  std::printf("[chunk_loss steps] bf16 N=%lld D=%lld V=%lld, bf16 dhidden/dweight: strategy %s, rows %lld, vtile %lld, "
              "workspace %.1f MiB\n",
              static_cast<long long>(N), static_cast<long long>(D), static_cast<long long>(V),
              p.strategy == loss::kStrategyVocabTiled ? "vocab_tiled" : "token_chunked", static_cast<long long>(p.rows),
              static_cast<long long>(p.vtile), static_cast<double>(L.total) / (1 << 20));

  // The whole call: median of 7 after a warm-up (gdn_cuda_test_support.h's timer).
  const double whole = linear_attn::gdn_test::time_ms([&] { return loss::chunk_loss_cuda(p, L, ws.p, nullptr); });
  ASSERT_GT(whole, 0.0) << strata_get_last_error_message();
  std::vector<uint8_t> ref(4 + N * 4), got(ref.size());
  ASSERT_EQ(cudaMemcpy(ref.data(), loss.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ref.data() + 4, lse.p, N * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  loss::ChunkLossCudaSteps st;
  ASSERT_EQ(loss::chunk_loss_cuda_steps(p, L, ws.p, nullptr, &st), STRATA_SUCCESS) << strata_get_last_error_message();
  ASSERT_EQ(cudaMemcpy(got.data(), loss.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data() + 4, lse.p, N * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(got == ref) << "the stepped call changed the loss or lse bits";
  // One line per step of a stepped call, then the GEMM / element-wise totals; the steps must fit in its span.
  auto print_steps = [&](const loss::ChunkLossCudaSteps& sp, double whole, const char* tag) {
    double sum = 0.0, gemm_ms = 0.0, gemm_flop = 0.0;
    std::printf("[chunk_loss steps]%s whole call %.3f ms (median of 7); stepped call span %.3f ms\n", tag, whole,
                sp.total_ms);
    for (int k = 0; k < loss::kChunkLossSteps; ++k) {
      sum += sp.ms[k];
      if (sp.flop[k] > 0) gemm_ms += sp.ms[k], gemm_flop += sp.flop[k];
      if (sp.calls[k] == 0) continue;
      std::printf("[chunk_loss steps]   %-30s %4lld calls %8.3f ms %5.1f %%", loss::chunk_loss_step_name(k),
                  static_cast<long long>(sp.calls[k]), sp.ms[k], 100.0 * sp.ms[k] / whole);
      if (sp.flop[k] > 0)
        std::printf("  %.2f TFLOP  %.0f TFLOP/s", sp.flop[k] / 1e12, sp.flop[k] / (sp.ms[k] * 1e-3) / 1e12);
      std::printf("\n");
    }
    std::printf("[chunk_loss steps]   GEMMs %.3f ms (%.2f TFLOP, %.0f TFLOP/s; the 3 GEMMs' %.2f TFLOP = %.3f x), "
                "element-wise and the rest %.3f ms, between steps %.3f ms\n",
                gemm_ms, gemm_flop / 1e12, gemm_flop / (gemm_ms * 1e-3) / 1e12, 6.0 * N * D * V / 1e12,
                gemm_flop / (6.0 * N * D * V), sum - gemm_ms, sp.total_ms - sum);
    EXPECT_GT(sp.calls[loss::kStepLogitsFwd], 0);
    EXPECT_GT(sp.calls[loss::kStepDwGemm], 0);
    EXPECT_LE(sum, sp.total_ms * 1.001 + 0.01);
  };
  print_steps(st, whole, "");

  // Session 14: the default (with the batched dH GEMMs, chosen in s14 run 1) side by side with the two dH GEMMs
  // per tile (STRATA_CHUNK_LOSS_DH=pair, the session-13 path), whole calls interleaved (default, each variant, ...: 7 rounds
  // after a warm-up; gdn_cuda_test_support.h), so that clock drift hits all alike. Each must give the default's loss
  // and lse bits (none changes them).
  // Session 15: the session-14 layout of the kept tiles (STRATA_CHUNK_LOSS_KEEP=dw: tile 0 not kept in the workspace),
  // and the one-row row_stats (STRATA_CHUNK_LOSS_ROWS=1, the session-14 kernel); 11 rounds.
  struct Variant {
    const char *name, *dh, *keep, *rows;
  };
  const std::vector<Variant> variants = {{"default", nullptr, nullptr, nullptr},
                                         {"keep=dw (s14)", nullptr, "dw", nullptr},
                                         {"rows=1 (s14)", nullptr, nullptr, "1"},
                                         {"both s14", nullptr, "dw", "1"}};
  auto set_env = [](const Variant& v) {
    v.dh ? setenv("STRATA_CHUNK_LOSS_DH", v.dh, 1) : unsetenv("STRATA_CHUNK_LOSS_DH");
    v.keep ? setenv("STRATA_CHUNK_LOSS_KEEP", v.keep, 1) : unsetenv("STRATA_CHUNK_LOSS_KEEP");
    v.rows ? setenv("STRATA_CHUNK_LOSS_ROWS", v.rows, 1) : unsetenv("STRATA_CHUNK_LOSS_ROWS");
  };
  std::vector<std::function<void()>> fns;
  for (const Variant& v : variants)
    fns.push_back([&, v] {
      set_env(v);
      EXPECT_EQ(loss::chunk_loss_cuda(p, L, ws.p, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
    });
  const std::vector<std::vector<double>> t_v = linear_attn::gdn_test::time_interleaved_ms(fns, 11);
  for (size_t i = 0; i < variants.size(); ++i) {
    fns[i]();
    ASSERT_EQ(cudaMemcpy(got.data(), loss.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got.data() + 4, lse.p, N * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == ref) << variants[i].name << " changed the loss or lse bits";
    const double med = t_v[i][t_v[i].size() / 2];
    std::printf("[chunk_loss variants] %-13s whole call median %.3f ms min %.3f ms (interleaved, 11 rounds; %.3f x the "
                "default's median)\n",
                variants[i].name, med, t_v[i].front(), med / t_v[0][t_v[0].size() / 2]);
  }
  for (size_t i = 1; i < variants.size(); ++i) {  // where the variants' time goes
    set_env(variants[i]);
    loss::ChunkLossCudaSteps sv;
    ASSERT_EQ(loss::chunk_loss_cuda_steps(p, L, ws.p, nullptr, &sv), STRATA_SUCCESS) << strata_get_last_error_message();
    const std::string tag = std::string(" [") + variants[i].name + "]";
    print_steps(sv, t_v[i][t_v[i].size() / 2], tag.c_str());
  }
  set_env(variants[0]);
  EXPECT_EQ(st.calls[loss::kStepDhGemm], (V + p.vtile - 1) / p.vtile);  // the batched dH GEMMs: one per tile
  // 39 tiles: 18 kept (tile 0 in the workspace), 21 recomputed in the loop, 3 deferred recomputed at the end.
  EXPECT_EQ(loss::vt_memory(p, L, loss::chunk_loss_cuda_traits(), true).n_keep, 18);
  EXPECT_EQ(st.calls[loss::kStepLogitsRecompute], 24);



  // The chunk-size lever: the same call with other vocabulary tiles (one token block, within the budget), whole
  // calls side by side with the plan's tile; each must give the plan's loss up to the f32 rounding of its own
  // summation order (the tiles change the order of the online merge).
  float loss_ref = 0.f;
  std::memcpy(&loss_ref, ref.data(), 4);
  for (const int64_t vt : {int64_t{3840}, int64_t{3584}, int64_t{2560}, int64_t{2048}}) {
    loss::ChunkLossParams q = p;
    const loss::ChunkLossLayout Lq = loss::chunk_loss_choose(q, loss::chunk_loss_cuda_traits(), loss::kStrategyAuto, 0, vt);
    ASSERT_LE(Lq.total, L.total);
    const double t_vt = linear_attn::gdn_test::time_ms([&] { return loss::chunk_loss_cuda(q, Lq, ws.p, nullptr); });
    float lv = 0.f;
    ASSERT_EQ(cudaMemcpy(&lv, loss.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_NEAR(lv, loss_ref, 1e-5 * std::fabs(loss_ref)) << "vtile " << vt;
    std::printf("[chunk_loss steps] vtile %lld (strategy %s, rows %lld): whole call %.3f ms (plan's vtile %lld: %.3f ms)\n",
                static_cast<long long>(q.vtile), q.strategy == loss::kStrategyVocabTiled ? "vocab_tiled" : "token_chunked",
                static_cast<long long>(q.rows), t_vt, static_cast<long long>(p.vtile), whole);
  }
}
#endif

}  // namespace
}  // namespace strata
