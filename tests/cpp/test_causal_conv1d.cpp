// causal_conv1d beyond the conformance driver (ops_fused.md §5): every validation rule (status, message,
// outputs untouched), the run-time cu_seqlens checks of the CPU implementations, gradients against float64
// central finite differences (rows with initial state and final-state gradient, packs with empty and short
// sequences, seq_idx with padding, a general width), determinism (repeated runs, 1 vs 2 threads, every CPU
// implementation; on CUDA every implementation run to run, and cuda.sm90.pipe against cuda.sm90.vec bitwise),
// packed-vs-separate equality, streamed (non-temporal) outputs equal to plain stores, the workspace rule, and the
// C++ wrapper.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ops/conv/causal_conv1d/causal_conv1d.h"
#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/testkit.h"
#include "test_support.h"

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, kCpu, poisoned, all_poison, ... (test_support.h)

using atk::HostTensor;

HostTensor ints(int32_t dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& v) {
  HostTensor t = HostTensor::make(dtype, shape);
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(v[i]));
  return t;
}
HostTensor randn(int32_t dtype, const std::vector<int64_t>& shape, uint64_t seed,
                 atk::Layout layout = atk::Layout::kContiguous) {
  HostTensor t = HostTensor::make(dtype, shape, layout);
  std::mt19937_64 rng(seed);
  t.fill_normal(rng, 0.0, 1.0);
  return t;
}
void* ptr(const HostTensor* t) { return t ? const_cast<uint8_t*>(t->storage.data()) : nullptr; }

// Forward on the CPU. Tensors may be nullptr (absent).
struct Fwd {
  const HostTensor *x, *w, *bias = nullptr, *res = nullptr, *h0 = nullptr, *cu = nullptr, *seq = nullptr;
  HostTensor *y, *hT = nullptr;
  int32_t act = 1, wl = 0;
  strata_status run(std::string* impl = nullptr) const {
    strata_plan plan = nullptr;
    strata_status s = strata_causal_conv1d_fwd_plan(dsc(x), dsc(w), dsc(bias), dsc(res), dsc(h0), dsc(cu), dsc(seq),
                                                    dsc(y), dsc(hT), act, wl, &plan);
    if (s != STRATA_SUCCESS) return s;
    if (impl) *impl = strata_plan_impl_name(plan);
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    std::vector<uint8_t> work(ws);
    void* t[] = {ptr(x), ptr(w), ptr(bias), ptr(res), ptr(h0), ptr(cu), ptr(seq), ptr(y), ptr(hT)};
    s = strata_plan_run(plan, t, 9, work.data(), ws, nullptr);
    strata_plan_destroy(plan);
    return s;
  }
};

struct Bwd {
  const HostTensor *x, *w, *bias = nullptr, *h0 = nullptr, *cu = nullptr, *seq = nullptr, *dy, *dhT = nullptr;
  HostTensor *dx, *dw, *db = nullptr, *dh0 = nullptr;
  int32_t act = 1, wl = 0;
  size_t ws_override = SIZE_MAX;
  strata_status run() const {
    strata_plan plan = nullptr;
    strata_status s = strata_causal_conv1d_bwd_plan(dsc(x), dsc(w), dsc(bias), dsc(h0), dsc(cu), dsc(seq), dsc(dy),
                                                    dsc(dhT), dsc(dx), dsc(dw), dsc(db), dsc(dh0), act, wl, &plan);
    if (s != STRATA_SUCCESS) return s;
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    std::vector<uint8_t> work(ws);
    void* t[] = {ptr(x), ptr(w), ptr(bias), ptr(h0), ptr(cu), ptr(seq), ptr(dy), ptr(dhT), ptr(dx), ptr(dw), ptr(db),
                 ptr(dh0)};
    s = strata_plan_run(plan, t, 12, work.data(), ws_override == SIZE_MAX ? ws : ws_override, nullptr);
    strata_plan_destroy(plan);
    return s;
  }
};

// ---------------------------------------------------------------------------------------------- validation

// x [1, 8, 6] f32, weight [6, 4], bias [6], initial/final state [2, 6, 3], cu_seqlens [0, 3, 8].
struct ConvSetup {
  HostTensor x = randn(STRATA_DTYPE_F32, {1, 8, 6}, 1);
  HostTensor w = randn(STRATA_DTYPE_F32, {6, 4}, 2);
  HostTensor bias = randn(STRATA_DTYPE_F32, {6}, 3);
  HostTensor h0 = randn(STRATA_DTYPE_F32, {2, 6, 3}, 4);
  HostTensor cu = ints(STRATA_DTYPE_I64, {3}, {0, 3, 8});
  HostTensor y = poisoned(STRATA_DTYPE_F32, {1, 8, 6});
  HostTensor hT = poisoned(STRATA_DTYPE_F32, {2, 6, 3});

  Fwd fwd() { return Fwd{&x, &w, &bias, nullptr, &h0, &cu, nullptr, &y, &hT}; }
  void expect_rejected(const Fwd& f, strata_status status, const std::string& needle) {
    const strata_status s = f.run();
    const std::string msg = strata_get_last_error_message();
    EXPECT_EQ(s, status) << strata_status_name(s) << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
    EXPECT_TRUE(all_poison(y) && all_poison(hT)) << "an output was written by a rejected call: " << needle;
  }
};

TEST(CausalConv1d, NullRules) {
  ConvSetup v;
  Fwd f = v.fwd();
  f.x = nullptr;
  v.expect_rejected(f, STRATA_ERROR_NULL_POINTER, "causal_conv1d_fwd: x must not be NULL");
  f = v.fwd();
  f.w = nullptr;
  v.expect_rejected(f, STRATA_ERROR_NULL_POINTER, "weight must not be NULL");
  f = v.fwd();
  f.y = nullptr;
  v.expect_rejected(f, STRATA_ERROR_NULL_POINTER, "y must not be NULL");
  // A plan made with an initial state needs its pointer at run time.
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_causal_conv1d_fwd_plan(&v.x.desc, &v.w.desc, nullptr, nullptr, &v.h0.desc, &v.cu.desc, nullptr,
                                          &v.y.desc, nullptr, 1, 0, &plan),
            STRATA_SUCCESS);
  void* t[] = {ptr(&v.x), ptr(&v.w), nullptr, nullptr, nullptr, ptr(&v.cu), nullptr, ptr(&v.y), nullptr};
  EXPECT_EQ(strata_plan_run(plan, t, 9, nullptr, 0, nullptr), STRATA_ERROR_NULL_POINTER);
  strata_plan_destroy(plan);
  EXPECT_TRUE(all_poison(v.y));
}

TEST(CausalConv1d, DeviceRules) {
  ConvSetup v;
  HostTensor w2 = v.w;
  w2.desc.device = {STRATA_DEVICE_CPU, 1};
  Fwd f = v.fwd();
  f.w = &w2;
  v.expect_rejected(f, STRATA_ERROR_INVALID_DEVICE, "weight");
}

TEST(CausalConv1d, DtypeRules) {
  ConvSetup v;
  HostTensor xi = ints(STRATA_DTYPE_I32, {1, 8, 6}, {});
  Fwd f = v.fwd();
  f.x = &xi;
  v.expect_rejected(f, STRATA_ERROR_INVALID_DTYPE, "x has dtype i32");
  HostTensor yb = poisoned(STRATA_DTYPE_BF16, {1, 8, 6});
  f = v.fwd();
  f.y = &yb;
  const strata_status s = f.run();
  EXPECT_EQ(s, STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y must have the dtype of x (f32), got bf16"),
            std::string::npos)
      << strata_get_last_error_message();
  HostTensor wi = ints(STRATA_DTYPE_I64, {6, 4}, {});
  f = v.fwd();
  f.w = &wi;
  v.expect_rejected(f, STRATA_ERROR_INVALID_DTYPE, "weight has dtype i64");
  HostTensor cuf = randn(STRATA_DTYPE_F32, {3}, 5);
  f = v.fwd();
  f.cu = &cuf;
  v.expect_rejected(f, STRATA_ERROR_INVALID_DTYPE, "cu_seqlens has dtype f32");
}

TEST(CausalConv1d, F64OnCudaIsAValidationError) {
  int32_t n = 0;
  if (strata_device_count(STRATA_DEVICE_CUDA, &n) != STRATA_SUCCESS || n == 0) GTEST_SKIP() << "no CUDA device";
  strata_tensor_desc x = make_desc(STRATA_DTYPE_F64, {1, 8, 6}, {STRATA_DEVICE_CUDA, 0});
  strata_tensor_desc w = make_desc(STRATA_DTYPE_F32, {6, 4}, {STRATA_DEVICE_CUDA, 0});
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_causal_conv1d_fwd_plan(&x, &w, nullptr, nullptr, nullptr, nullptr, nullptr, &x, nullptr, 1, 0,
                                          &plan),
            STRATA_ERROR_INVALID_DTYPE);
}

TEST(CausalConv1d, ShapeRules) {
  ConvSetup v;
  HostTensor x2 = randn(STRATA_DTYPE_F32, {8, 6}, 1);
  Fwd f = v.fwd();
  f.x = &x2;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "x must have rank");
  HostTensor ybad = poisoned(STRATA_DTYPE_F32, {1, 8, 5});
  f = v.fwd();
  f.y = &ybad;
  EXPECT_EQ(f.run(), STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y"), std::string::npos);
  HostTensor wbad = randn(STRATA_DTYPE_F32, {5, 4}, 2);
  f = v.fwd();
  f.w = &wbad;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "weight must have shape [6, W]");
  HostTensor w1 = randn(STRATA_DTYPE_F32, {6, 1}, 2);
  f = v.fwd();
  f.w = &w1;
  f.h0 = nullptr, f.hT = nullptr;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "W must be in [2, 16], got W = 1");
  HostTensor w17 = randn(STRATA_DTYPE_F32, {6, 17}, 2);
  f.w = &w17;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "got W = 17");
  HostTensor bbad = randn(STRATA_DTYPE_F32, {7}, 2);
  f = v.fwd();
  f.bias = &bbad;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "bias");
  HostTensor rbad = randn(STRATA_DTYPE_F32, {1, 7, 6}, 2);
  f = v.fwd();
  f.res = &rbad;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "residual");
  HostTensor hbad = randn(STRATA_DTYPE_F32, {1, 6, 3}, 2);  // N = 2 sequences in cu_seqlens
  f = v.fwd();
  f.h0 = &hbad;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "initial_state must have shape [2, 6, 3]");
  HostTensor hTbad = poisoned(STRATA_DTYPE_F32, {2, 6, 4});
  f = v.fwd();
  f.hT = &hTbad;
  EXPECT_EQ(f.run(), STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("final_state"), std::string::npos);
  HostTensor seq = ints(STRATA_DTYPE_I32, {1, 8}, {0, 0, 0, 1, 1, 1, 1, 1});
  f = v.fwd();
  f.seq = &seq;
  v.expect_rejected(f, STRATA_ERROR_INVALID_VALUE, "give cu_seqlens");
  HostTensor x3 = randn(STRATA_DTYPE_F32, {2, 8, 6}, 1);
  HostTensor y3 = poisoned(STRATA_DTYPE_F32, {2, 8, 6});
  f = v.fwd();
  f.x = &x3;
  f.y = &y3;
  f.h0 = nullptr, f.hT = nullptr;
  EXPECT_EQ(f.run(), STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("x must have B = 1"), std::string::npos);
  HostTensor cu0 = ints(STRATA_DTYPE_I64, {1}, {0});
  f = v.fwd();
  f.cu = &cu0;
  f.h0 = nullptr, f.hT = nullptr;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "holds no sequence");
  HostTensor seqbad = ints(STRATA_DTYPE_I32, {1, 7}, {});
  f = v.fwd();
  f.cu = nullptr;
  f.seq = &seqbad;
  f.h0 = nullptr, f.hT = nullptr;
  v.expect_rejected(f, STRATA_ERROR_INVALID_SHAPE, "seq_idx");
}

TEST(CausalConv1d, StrideRules) {
  ConvSetup v;
  HostTensor y = v.y;
  y.desc.strides[1] = 0;  // two tokens would alias
  Fwd f = v.fwd();
  f.y = &y;
  const strata_status s = f.run();
  EXPECT_EQ(s, STRATA_ERROR_INVALID_STRIDE) << strata_get_last_error_message();
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y"), std::string::npos);
  EXPECT_TRUE(all_poison(y));
}

TEST(CausalConv1d, AttributeRules) {
  ConvSetup v;
  Fwd f = v.fwd();
  f.act = 2;
  v.expect_rejected(f, STRATA_ERROR_INVALID_ATTRIBUTE, "activation must be 0 (none) or 1 (silu), got 2");
  f = v.fwd();
  f.wl = 3;
  v.expect_rejected(f, STRATA_ERROR_INVALID_ATTRIBUTE, "weight_layout must be 0 ([D, W]) or 1 ([W, D]), got 3");
}

TEST(CausalConv1d, BackwardRules) {
  ConvSetup v;
  HostTensor dy = randn(STRATA_DTYPE_F32, {1, 8, 6}, 9);
  HostTensor dx = poisoned(STRATA_DTYPE_F32, {1, 8, 6});
  HostTensor dw = poisoned(STRATA_DTYPE_F32, {6, 4});
  HostTensor db = poisoned(STRATA_DTYPE_F32, {6});
  HostTensor dh0 = poisoned(STRATA_DTYPE_F32, {2, 6, 3});
  auto expect = [&](const Bwd& b, strata_status status, const std::string& needle) {
    const strata_status s = b.run();
    const std::string msg = strata_get_last_error_message();
    EXPECT_EQ(s, status) << strata_status_name(s) << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_TRUE(all_poison(dx) && all_poison(dw) && all_poison(db) && all_poison(dh0)) << needle;
  };
  const Bwd ok{&v.x, &v.w, &v.bias, &v.h0, &v.cu, nullptr, &dy, nullptr, &dx, &dw, &db, &dh0};
  Bwd b = ok;
  b.dw = nullptr;
  expect(b, STRATA_ERROR_NULL_POINTER, "dweight must not be NULL");
  b = ok;
  b.h0 = nullptr;
  expect(b, STRATA_ERROR_NULL_POINTER, "initial_state must not be NULL when dinitial_state");
  HostTensor dwb = poisoned(STRATA_DTYPE_BF16, {6, 4});
  b = ok;
  b.dw = &dwb;
  expect(b, STRATA_ERROR_INVALID_DTYPE, "dweight must have the dtype of weight (f32), got bf16");
  HostTensor dbb = poisoned(STRATA_DTYPE_F16, {6});
  b = ok;
  b.db = &dbb;
  expect(b, STRATA_ERROR_INVALID_DTYPE, "dbias must have the dtype of bias (f32), got f16");
  HostTensor dybad = randn(STRATA_DTYPE_F32, {1, 9, 6}, 9);
  b = ok;
  b.dy = &dybad;
  expect(b, STRATA_ERROR_INVALID_SHAPE, "dy");
  // The workspace the plan reports is required.
  b = ok;
  b.ws_override = 0;
  expect(b, STRATA_ERROR_WORKSPACE_TOO_SMALL, "workspace");
}

TEST(CausalConv1d, CuSeqlensValuesCheckedAtRunTimeOnEveryCpuImpl) {
  for (const std::string& impl : atk::impls_for("causal_conv1d_fwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (const auto& [vals, needle] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
             {{1, 3, 8}, "cu_seqlens[0] must be 0, got 1"},
             {{0, 5, 3}, "must be non-decreasing"},
             {{0, 3, 7}, "must equal T = 8"}}) {
      ConvSetup v;
      HostTensor cu = ints(STRATA_DTYPE_I64, {3}, vals);
      Fwd f = v.fwd();
      f.cu = &cu;
      v.expect_rejected(f, STRATA_ERROR_INVALID_VALUE, needle);
    }
  }
}

// ---------------------------------------------------------------------------------------------- gradients

// loss = <y, gy> + <final_state, ghT>, all f64 on the CPU (reference implementation), against central
// differences of the forward op itself.
struct GradCase {
  std::vector<int64_t> shape;
  int64_t W;
  std::vector<int64_t> cu;
  std::vector<int64_t> seq;  // [B, T] ids or empty
  bool h0, bias, silu;
  int32_t wl;
};

void check_gradients(const GradCase& c) {
  const int32_t f64 = STRATA_DTYPE_F64;
  const int64_t B = c.shape[0], T = c.shape[1], D = c.shape[2], W = c.W;
  const int64_t N = c.cu.empty() ? B : static_cast<int64_t>(c.cu.size()) - 1;
  HostTensor x = randn(f64, c.shape, 11);
  HostTensor w = randn(f64, c.wl == 0 ? std::vector<int64_t>{D, W} : std::vector<int64_t>{W, D}, 12);
  HostTensor bias = randn(f64, {D}, 13);
  HostTensor h0 = randn(f64, {N, D, W - 1}, 14);
  HostTensor gy = randn(f64, c.shape, 15);
  HostTensor ghT = randn(f64, {N, D, W - 1}, 16);
  HostTensor cu = ints(STRATA_DTYPE_I64, {static_cast<int64_t>(c.cu.size())}, c.cu);
  HostTensor seq = ints(STRATA_DTYPE_I32, {B, T}, c.seq);
  const HostTensor* cup = c.cu.empty() ? nullptr : &cu;
  const HostTensor* seqp = c.seq.empty() ? nullptr : &seq;
  auto loss = [&]() {
    HostTensor y = poisoned(f64, c.shape), hT = poisoned(f64, {N, D, W - 1});
    Fwd f{&x, &w, c.bias ? &bias : nullptr, nullptr, c.h0 ? &h0 : nullptr, cup, seqp, &y, &hT, c.silu ? 1 : 0, c.wl};
    EXPECT_EQ(f.run(), STRATA_SUCCESS) << strata_get_last_error_message();
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) l += y.get(i) * gy.get(i);
    for (int64_t i = 0; i < hT.numel(); ++i) l += hT.get(i) * ghT.get(i);
    return l;
  };
  HostTensor dx = poisoned(f64, c.shape), dw = poisoned(f64, shape_of(w.desc)), db = poisoned(f64, {D});
  HostTensor dh0 = poisoned(f64, {N, D, W - 1});
  Bwd b{&x, &w, c.bias ? &bias : nullptr, c.h0 ? &h0 : nullptr, cup, seqp, &gy, &ghT, &dx, &dw, &db,
        c.h0 ? &dh0 : nullptr, c.silu ? 1 : 0, c.wl};
  ASSERT_EQ(b.run(), STRATA_SUCCESS) << strata_get_last_error_message();
  auto fd_check = [&](HostTensor& param, const HostTensor& grad, const char* name) {
    const double h = 1e-6;
    for (int64_t i = 0; i < param.numel(); ++i) {
      const double v = param.get(i);
      param.set(i, v + h);
      const double lp = loss();
      param.set(i, v - h);
      const double lm = loss();
      param.set(i, v);
      const double fd = (lp - lm) / (2 * h);
      ASSERT_NEAR(grad.get(i), fd, 1e-6 * std::max(1.0, std::fabs(fd))) << name << "[" << i << "]";
    }
  };
  fd_check(x, dx, "dx");
  fd_check(w, dw, "dweight");
  if (c.bias) fd_check(bias, db, "dbias");
  if (c.h0) fd_check(h0, dh0, "dinitial_state");
}

TEST(CausalConv1d, GradientsMatchFloat64FiniteDifferences) {
  const std::vector<GradCase> cases = {
      {{2, 7, 3}, 4, {}, {}, true, true, true, 0},
      {{2, 7, 3}, 4, {}, {}, false, false, false, 1},
      {{2, 2, 3}, 4, {}, {}, true, true, true, 0},  // T < W - 1: the final state keeps initial-state slots
      {{1, 12, 2}, 3, {0, 0, 1, 3, 3, 9, 12}, {}, true, true, true, 0},
      {{2, 9, 2}, 4, {}, {0, 0, 0, 1, 1, 1, 1, -1, -1, 3, 3, 4, 4, 4, 4, 4, 4, 4}, true, true, true, 0},
      {{1, 9, 2}, 6, {0, 4, 9}, {}, true, true, true, 1},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    check_gradients(cases[i]);
  }
}

// ---------------------------------------------------------------------------------------------- determinism

std::vector<uint8_t> bwd_bits(int32_t dtype, const std::vector<int64_t>& cu, uint64_t seed) {
  const int64_t B = cu.empty() ? 3 : 1, T = cu.empty() ? 300 : cu.back(), D = 520, W = 4;
  const int64_t N = cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1;
  HostTensor x = randn(dtype, {B, T, D}, seed), dy = randn(dtype, {B, T, D}, seed + 1);
  HostTensor w = randn(STRATA_DTYPE_F32, {D, W}, seed + 2), bias = randn(STRATA_DTYPE_F32, {D}, seed + 3);
  HostTensor h0 = randn(STRATA_DTYPE_F32, {N, D, W - 1}, seed + 4), dhT = randn(STRATA_DTYPE_F32, {N, D, W - 1}, 5);
  HostTensor cut = ints(STRATA_DTYPE_I32, {static_cast<int64_t>(cu.size())}, cu);
  HostTensor dx = poisoned(dtype, {B, T, D}), dw = poisoned(STRATA_DTYPE_F32, {D, W});
  HostTensor db = poisoned(STRATA_DTYPE_F32, {D}), dh0 = poisoned(STRATA_DTYPE_F32, {N, D, W - 1});
  Bwd b{&x, &w, &bias, &h0, cu.empty() ? nullptr : &cut, nullptr, &dy, &dhT, &dx, &dw, &db, &dh0};
  EXPECT_EQ(b.run(), STRATA_SUCCESS) << strata_get_last_error_message();
  std::vector<uint8_t> bits = dx.storage;
  for (const HostTensor* t : {&dw, &db, &dh0}) bits.insert(bits.end(), t->storage.begin(), t->storage.end());
  return bits;
}

TEST(CausalConv1d, BackwardBitwiseAcrossRunsAndThreadCounts) {
  const int32_t before = strata_get_num_threads();
  for (const std::string& impl : atk::impls_for("causal_conv1d_bwd", kCpu)) {
    if (impl == "reference") continue;  // single-threaded float64 loops
    ForceImpl force(impl.c_str());
    for (const auto& cu : std::vector<std::vector<int64_t>>{{}, {0, 3, 3, 200, 399, 400}}) {
      for (int32_t dt : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
        ASSERT_EQ(strata_set_num_threads(2), STRATA_SUCCESS);
        const std::vector<uint8_t> first = bwd_bits(dt, cu, 3);
        EXPECT_EQ(bwd_bits(dt, cu, 3), first) << impl << ": repeated run differs";
        ASSERT_EQ(strata_set_num_threads(1), STRATA_SUCCESS);
        EXPECT_EQ(bwd_bits(dt, cu, 3), first) << impl << ": 1 vs 2 threads differ";
      }
    }
  }
  strata_set_num_threads(before);
}

// Outputs of 4 MiB and more are written with non-temporal stores where every row is 64-byte aligned (the column
// sweeps first gather whole 64-byte lines of y / dx in L1: SweepLineGroups in cpu-inl.h); the same call with the
// output 32 bytes further takes plain stores. The arithmetic does not depend on where the rows go, so both give
// the same bits, on every CPU implementation (the conformance cases' outputs are never 64-byte aligned: their
// storage comes from malloc). [1, 1030, 2048]: a short last tile; initial state, residual and bias present.
TEST(CausalConv1d, StreamedOutputsEqualPlainStores) {
  const int64_t T = 1030, D = 2048, W = 4;
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F16}) {
    HostTensor x = randn(dt, {1, T, D}, 21), dy = randn(dt, {1, T, D}, 22), res = randn(dt, {1, T, D}, 23);
    HostTensor w = randn(STRATA_DTYPE_F32, {D, W}, 24), bias = randn(STRATA_DTYPE_F32, {D}, 25);
    HostTensor h0 = randn(STRATA_DTYPE_F32, {1, D, W - 1}, 26);
    const size_t bytes = x.storage.size();
    std::vector<uint8_t> buf(bytes + 128);
    uint8_t* aligned = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
    // y (forward) or dx, dw, db (backward) with the activation output at `out`.
    auto run = [&](bool bwd, uint8_t* out) {
      strata_plan plan = nullptr;
      HostTensor dw = poisoned(STRATA_DTYPE_F32, {D, W}), db = poisoned(STRATA_DTYPE_F32, {D});
      std::fill(out, out + bytes, uint8_t{0xff});
      strata_status s =
          bwd ? strata_causal_conv1d_bwd_plan(dsc(&x), dsc(&w), dsc(&bias), dsc(&h0), nullptr, nullptr, dsc(&dy), nullptr,
                                              dsc(&x), dsc(&dw), dsc(&db), nullptr, 1, 0, &plan)
              : strata_causal_conv1d_fwd_plan(dsc(&x), dsc(&w), dsc(&bias), dsc(&res), dsc(&h0), nullptr, nullptr,
                                              dsc(&x), nullptr, 1, 0, &plan);
      EXPECT_EQ(s, STRATA_SUCCESS) << strata_get_last_error_message();
      size_t ws = 0;
      strata_plan_workspace_size(plan, &ws);
      std::vector<uint8_t> work(ws);
      void* fwd_t[] = {ptr(&x), ptr(&w), ptr(&bias), ptr(&res), ptr(&h0), nullptr, nullptr, out, nullptr};
      void* bwd_t[] = {ptr(&x), ptr(&w), ptr(&bias), ptr(&h0), nullptr, nullptr, ptr(&dy), nullptr, out, ptr(&dw),
                       ptr(&db), nullptr};
      EXPECT_EQ(strata_plan_run(plan, bwd ? bwd_t : fwd_t, bwd ? 12 : 9, work.data(), ws, nullptr), STRATA_SUCCESS)
          << strata_get_last_error_message();
      strata_plan_destroy(plan);
      std::vector<uint8_t> bits(out, out + bytes);
      if (bwd) {
        bits.insert(bits.end(), dw.storage.begin(), dw.storage.end());
        bits.insert(bits.end(), db.storage.begin(), db.storage.end());
      }
      return bits;
    };
    for (bool bwd : {false, true})
      for (const std::string& impl : atk::impls_for(bwd ? "causal_conv1d_bwd" : "causal_conv1d_fwd", kCpu)) {
        if (impl == "reference") continue;
        ForceImpl force(impl.c_str());
        const std::vector<uint8_t> streamed = run(bwd, aligned);
        EXPECT_EQ(run(bwd, aligned + 32), streamed) << impl << (bwd ? " backward" : " forward") << " dtype " << dt;
      }
  }
}

// A pack equals its sequences run one by one (each with its own initial state), bit for bit on every CPU
// implementation (the vector and element-wise paths do the same f32 operations per element).
TEST(CausalConv1d, PackedEqualsSeparate) {
  const std::vector<int64_t> cu = {0, 2, 2, 70, 141};
  const int64_t D = 40, W = 4, T = cu.back(), N = 4;
  for (const std::string& impl : atk::impls_for("causal_conv1d_fwd", kCpu)) {
    ForceImpl force(impl.c_str());
    HostTensor x = randn(STRATA_DTYPE_F32, {1, T, D}, 1), w = randn(STRATA_DTYPE_F32, {D, W}, 2);
    HostTensor h0 = randn(STRATA_DTYPE_F32, {N, D, W - 1}, 3), cut = ints(STRATA_DTYPE_I64, {5}, cu);
    HostTensor y = poisoned(STRATA_DTYPE_F32, {1, T, D}), hT = poisoned(STRATA_DTYPE_F32, {N, D, W - 1});
    Fwd f{&x, &w, nullptr, nullptr, &h0, &cut, nullptr, &y, &hT, 0, 0};
    ASSERT_EQ(f.run(), STRATA_SUCCESS) << strata_get_last_error_message();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t s = cu[n], L = cu[n + 1] - cu[n];
      HostTensor xs = HostTensor::make(STRATA_DTYPE_F32, {1, L, D}), hs = HostTensor::make(STRATA_DTYPE_F32, {1, D, W - 1});
      for (int64_t i = 0; i < L * D; ++i) xs.set(i, x.get(s * D + i));
      for (int64_t i = 0; i < D * (W - 1); ++i) hs.set(i, h0.get(n * D * (W - 1) + i));
      HostTensor ys = poisoned(STRATA_DTYPE_F32, {1, L, D}), hTs = poisoned(STRATA_DTYPE_F32, {1, D, W - 1});
      Fwd g{&xs, &w, nullptr, nullptr, &hs, nullptr, nullptr, &ys, &hTs, 0, 0};
      ASSERT_EQ(g.run(), STRATA_SUCCESS) << strata_get_last_error_message();
      for (int64_t i = 0; i < L * D; ++i) ASSERT_EQ(ys.get(i), y.get(s * D + i)) << impl << " seq " << n << " " << i;
      for (int64_t i = 0; i < D * (W - 1); ++i)
        ASSERT_EQ(hTs.get(i), hT.get(n * D * (W - 1) + i)) << impl << " final state of seq " << n;
    }
  }
}

// ---------------------------------------------------------------------------------------------- C++ API

// ---------------------------------------------------------------------------------------------- CUDA

// Batch rows [2, 100, 64] bf16, W = 4, channels contiguous: the case both 16-bit kernels' plan rules accept.
conv::Conv1dParams dense_bf16_rows() {
  conv::Conv1dParams p;
  p.B = 2, p.T = 100, p.D = 64, p.W = 4, p.N = 2;
  p.x_dtype = STRATA_DTYPE_BF16;
  p.mode = conv::kModeRows;
  p.channels_contiguous = true;
  for (int64_t* st : {p.xs, p.ys, p.rs, p.dys, p.dxs}) st[0] = p.T * p.D, st[1] = p.D, st[2] = 1;
  return p;
}

// The plan-time rule of cuda.sm90.pipe (host logic, checked here without a GPU): the vec conditions, 16-bit
// activations, and no residual in the forward.
TEST(CausalConv1d, PipeReasonCoversBf16F16RowsAndPacksOnly) {
  conv::Conv1dParams p = dense_bf16_rows();
  EXPECT_STREQ(conv::causal_conv1d_pipe_reason(p, false), "");
  EXPECT_STREQ(conv::causal_conv1d_pipe_reason(p, true), "");
  p.x_dtype = STRATA_DTYPE_F16;
  EXPECT_STREQ(conv::causal_conv1d_pipe_reason(p, true), "");
  p.mode = conv::kModeCuSeqlens;
  EXPECT_STREQ(conv::causal_conv1d_pipe_reason(p, false), "");
  p.x_dtype = STRATA_DTYPE_F32;  // the vec kernels take f32
  EXPECT_STRNE(conv::causal_conv1d_pipe_reason(p, false), "");
  EXPECT_STREQ(conv::causal_conv1d_vec_reason(p, false), "");
  p.x_dtype = STRATA_DTYPE_BF16;
  int residual = 0;
  p.residual = &residual;  // forward with a residual: vec
  EXPECT_STRNE(conv::causal_conv1d_pipe_reason(p, false), "");
  EXPECT_STREQ(conv::causal_conv1d_pipe_reason(p, true), "");  // the backward has no residual
  p.residual = nullptr;
  p.mode = conv::kModeSeqIdx;
  EXPECT_STRNE(conv::causal_conv1d_pipe_reason(p, true), "");
  p.mode = conv::kModeRows;
  p.W = 5;
  EXPECT_STRNE(conv::causal_conv1d_pipe_reason(p, true), "");
  p.W = 4;
  p.D = 68;  // D % 8 != 0
  EXPECT_STRNE(conv::causal_conv1d_pipe_reason(p, true), "");
}

// cuda.sm90.lean: the pipe conditions: batch rows and (session 8) cu_seqlens packs, not seq_idx.
TEST(CausalConv1d, LeanReasonCoversBf16F16RowsAndPacks) {
  conv::Conv1dParams p = dense_bf16_rows();
  EXPECT_STREQ(conv::causal_conv1d_lean_reason(p, true), "");
  p.x_dtype = STRATA_DTYPE_F16;
  EXPECT_STREQ(conv::causal_conv1d_lean_reason(p, true), "");
  p.mode = conv::kModeCuSeqlens;
  EXPECT_STREQ(conv::causal_conv1d_lean_reason(p, true), "");
  EXPECT_STREQ(conv::causal_conv1d_pipe_reason(p, true), "");
  p.mode = conv::kModeSeqIdx;
  EXPECT_STRNE(conv::causal_conv1d_lean_reason(p, true), "");
  p.mode = conv::kModeRows;
  p.x_dtype = STRATA_DTYPE_F32;
  EXPECT_STRNE(conv::causal_conv1d_lean_reason(p, true), "");
  p.x_dtype = STRATA_DTYPE_BF16;
  p.W = 5;
  EXPECT_STRNE(conv::causal_conv1d_lean_reason(p, true), "");
}

bool have_cuda() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS && n > 0;
}

// One forward and one backward on the device with the given implementation forced: bf16 x [B, T, D] (rows) or
// [1, T, D] with cu_seqlens, W = 4, SiLU, f32 weight / bias / states. Returns y, then dx, dweight, dbias and
// dinitial_state (bytes), or an empty vector when the implementation does not take the problem.
struct CudaConvBits {
  std::vector<uint8_t> y, dx, rest;
};
CudaConvBits cuda_conv_bits(const std::string& impl, const std::vector<int64_t>& cu) {
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  // T spans several 256-token backward tiles with a tail; D = 1032 is two 512-channel slabs and a partial
  // third (1024-channel forward slabs: one full, one of 8 channels).
  const int64_t B = cu.empty() ? 2 : 1, T = cu.empty() ? 600 : cu.back(), D = 1032, W = 4;
  const int64_t N = cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1;
  const int32_t dt = STRATA_DTYPE_BF16;
  HostTensor x = randn(dt, {B, T, D}, 11), dy = randn(dt, {B, T, D}, 12);
  HostTensor w = randn(STRATA_DTYPE_F32, {D, W}, 13), bias = randn(STRATA_DTYPE_F32, {D}, 14);
  HostTensor h0 = randn(STRATA_DTYPE_F32, {N, D, W - 1}, 15), dhT = randn(STRATA_DTYPE_F32, {N, D, W - 1}, 16);
  HostTensor cut = ints(STRATA_DTYPE_I32, {static_cast<int64_t>(std::max<size_t>(cu.size(), 1))}, cu);
  HostTensor y = poisoned(dt, {B, T, D}), dx = poisoned(dt, {B, T, D}), dw = poisoned(STRATA_DTYPE_F32, {D, W});
  HostTensor db = poisoned(STRATA_DTYPE_F32, {D}), dh0 = poisoned(STRATA_DTYPE_F32, {N, D, W - 1});
  atk::DeviceTensor gx(x, dev), gdy(dy, dev), gw(w, dev), gb(bias, dev), gh0(h0, dev), gdhT(dhT, dev), gcu(cut, dev);
  atk::DeviceTensor gy(y, dev), gdx(dx, dev), gdw(dw, dev), gdb(db, dev), gdh0(dh0, dev);
  const strata_tensor_desc* cud = cu.empty() ? nullptr : &gcu.desc();
  void* cup = cu.empty() ? nullptr : gcu.data();
  CudaConvBits out;
  strata_plan fp = nullptr, bp = nullptr;
  auto fwd_plan = [&] {
    return strata_causal_conv1d_fwd_plan(&gx.desc(), &gw.desc(), &gb.desc(), nullptr, &gh0.desc(), cud, nullptr,
                                         &gy.desc(), nullptr, 1, 0, &fp) == STRATA_SUCCESS;
  };
  bool fwd_ok, bwd_ok;
  {
    ForceImpl force(impl.c_str());
    fwd_ok = fwd_plan();
    bwd_ok = strata_causal_conv1d_bwd_plan(&gx.desc(), &gw.desc(), &gb.desc(), &gh0.desc(), cud, nullptr, &gdy.desc(),
                                           &gdhT.desc(), &gdx.desc(), &gdw.desc(), &gdb.desc(), &gdh0.desc(), 1, 0,
                                           &bp) == STRATA_SUCCESS;
  }
  if (!bwd_ok) {
    strata_plan_destroy(fp);
    return out;  // not taken by this implementation
  }
  if (!fwd_ok && !fwd_plan()) {  // a backward-only implementation (cuda.sm90.lean): the dispatched forward
    strata_plan_destroy(bp);
    ADD_FAILURE() << "no forward plan";
    return out;
  }
  void* ft[] = {gx.data(), gw.data(), gb.data(), nullptr, gh0.data(), cup, nullptr, gy.data(), nullptr};
  EXPECT_EQ(strata_plan_run(fp, ft, 9, nullptr, 0, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
  size_t ws = 0;
  strata_plan_workspace_size(bp, &ws);
  void* work = nullptr;
  if (ws) EXPECT_EQ(strata_malloc(dev, ws, nullptr, &work), STRATA_SUCCESS);
  void* bt[] = {gx.data(), gw.data(), gb.data(), gh0.data(), cup, nullptr, gdy.data(), gdhT.data(), gdx.data(),
                gdw.data(), gdb.data(), gdh0.data()};
  EXPECT_EQ(strata_plan_run(bp, bt, 12, work, ws, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
  strata_device_synchronize(dev);
  if (work) strata_free(work);
  strata_plan_destroy(fp);
  strata_plan_destroy(bp);
  gy.download(y), gdx.download(dx), gdw.download(dw), gdb.download(db), gdh0.download(dh0);
  EXPECT_FALSE(all_poison(y) || all_poison(dx) || all_poison(dw)) << impl;
  out.y = y.storage;
  out.dx = dx.storage;
  for (const HostTensor* t : {&dw, &db, &dh0}) out.rest.insert(out.rest.end(), t->storage.begin(), t->storage.end());
  return out;
}

// Every CUDA implementation gives the same bits run to run (no atomics, fixed-order dweight reduction), and
// the per-element math of cuda.sm90.pipe and cuda.sm90.vec is the same walk (FwdWalk / BwdWalk), so their y
// and dx agree bit for bit (dweight / dbias differ in their tile split: compared by the conformance suite).
TEST(CausalConv1d, CudaBitsRunToRunAndPipeEqualsVec) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  for (const auto& cu : std::vector<std::vector<int64_t>>{{}, {0, 3, 3, 300, 599, 700}}) {
    std::vector<std::pair<std::string, CudaConvBits>> runs;
    for (const std::string& impl : atk::impls_for("causal_conv1d_bwd", {STRATA_DEVICE_CUDA, 0})) {
      if (impl.rfind("cuda.", 0) != 0) continue;
      CudaConvBits a = cuda_conv_bits(impl, cu);
      if (a.y.empty()) continue;
      const CudaConvBits b = cuda_conv_bits(impl, cu);
      EXPECT_EQ(a.y, b.y) << impl << ": forward differs run to run";
      EXPECT_EQ(a.dx, b.dx) << impl << ": dx differs run to run";
      EXPECT_EQ(a.rest, b.rest) << impl << ": dweight / dbias / dinitial_state differ run to run";
      runs.emplace_back(impl, std::move(a));
    }
    const CudaConvBits* pipe = nullptr;
    const CudaConvBits* vec = nullptr;
    const CudaConvBits* lean = nullptr;
    for (const auto& [name, r] : runs) {
      if (name == "cuda.sm90.pipe") pipe = &r;
      if (name == "cuda.sm90.vec") vec = &r;
      if (name == "cuda.sm90.lean") lean = &r;
    }
    ASSERT_TRUE(pipe && vec) << "cuda.sm90.pipe and cuda.sm90.vec both take bf16 rows / packs";
    EXPECT_EQ(pipe->y, vec->y) << "forward: pipe vs vec";
    EXPECT_EQ(pipe->dx, vec->dx) << "dx: pipe vs vec";
    // cuda.sm90.lean takes batch rows and packs; its step_fast is BwdWalk::step's arithmetic without the
    // checks (the pack's sequences of 3, 0, 297, 299 and 101 tokens put sequence starts and ends inside
    // 8-token chunks and 256-token tiles, so both of its token paths run, with dfinal_state terms).
    ASSERT_TRUE(lean != nullptr) << "cuda.sm90.lean takes the rows case and the pack";
    EXPECT_EQ(lean->dx, pipe->dx) << "dx: lean vs pipe";
  }
}

// cu_seqlens values on CUDA (causal_conv1d_cuda_check_cu_seqlens: a host copy checked by the CPU path's rule),
// every CUDA implementation of both ops forced, int64 and int32 offsets: INVALID_VALUE with the CPU messages and
// nothing written (y, final state; dx, dweight, dbias, dinitial_state keep their poison). The valid pack runs.
TEST(CausalConv1d, CudaCuSeqlensValuesCheckedBeforeWriting) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  const int64_t T = 40, D = 16;  // bf16 x [1, 40, 16], W = 4: every CUDA implementation takes the pack
  const HostTensor x = randn(STRATA_DTYPE_BF16, {1, T, D}, 11), w = randn(STRATA_DTYPE_F32, {D, 4}, 12);
  const HostTensor dy = randn(STRATA_DTYPE_BF16, {1, T, D}, 13), h0 = randn(STRATA_DTYPE_F32, {2, D, 3}, 14);
  const std::vector<std::pair<std::vector<int64_t>, std::string>> cases = {
      {{0, 9, 40}, ""},  // valid
      {{1, 9, 40}, "cu_seqlens[0] must be 0, got 1"},
      {{0, 30, 9}, "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 9 after cu_seqlens[1] = 30"},
      {{0, 9, 39}, "the last entry cu_seqlens[2] must equal T = 40 (x.shape[1]), got 39"}};
  for (bool bwd : {false, true})
    for (const std::string& impl : atk::impls_for(bwd ? "causal_conv1d_bwd" : "causal_conv1d_fwd", dev))
      for (int32_t cdt : {STRATA_DTYPE_I64, STRATA_DTYPE_I32})
        for (const auto& [vals, needle] : cases) {
          const HostTensor cu = ints(cdt, {3}, vals);
          HostTensor y = poisoned(STRATA_DTYPE_BF16, {1, T, D}), hT = poisoned(STRATA_DTYPE_F32, {2, D, 3});
          HostTensor dw = poisoned(STRATA_DTYPE_F32, {D, 4}), dh0 = poisoned(STRATA_DTYPE_F32, {2, D, 3});
          atk::DeviceTensor xd(x, dev), wd(w, dev), dyd(dy, dev), h0d(h0, dev), cud(cu, dev), yd(y, dev),
              hTd(hT, dev), dwd(dw, dev), dh0d(dh0, dev);
          strata_plan plan = nullptr;
          {
            ForceImpl force(impl.c_str());
            const strata_status ps =
                bwd ? strata_causal_conv1d_bwd_plan(&xd.desc(), &wd.desc(), nullptr, &h0d.desc(), &cud.desc(), nullptr,
                                                    &dyd.desc(), nullptr, &yd.desc(), &dwd.desc(), nullptr,
                                                    &dh0d.desc(), 1, 0, &plan)
                    : strata_causal_conv1d_fwd_plan(&xd.desc(), &wd.desc(), nullptr, nullptr, &h0d.desc(), &cud.desc(),
                                                    nullptr, &yd.desc(), &hTd.desc(), 1, 0, &plan);
            if (ps == STRATA_ERROR_NO_IMPLEMENTATION) continue;  // (a forced form that does not take packs)
            ASSERT_EQ(ps, STRATA_SUCCESS) << impl << ": " << strata_get_last_error_message();
          }
          size_t ws = 0;
          strata_plan_workspace_size(plan, &ws);
          void* work = nullptr;
          if (ws) ASSERT_EQ(strata_malloc(dev, ws, nullptr, &work), STRATA_SUCCESS);
          // bwd: dx goes to yd's buffer (same shape and dtype).
          std::vector<void*> t = bwd ? std::vector<void*>{xd.data(), wd.data(), nullptr, h0d.data(), cud.data(),
                                                          nullptr, dyd.data(), nullptr, yd.data(), dwd.data(),
                                                          nullptr, dh0d.data()}
                                     : std::vector<void*>{xd.data(), wd.data(), nullptr, nullptr, h0d.data(),
                                                          cud.data(), nullptr, yd.data(), hTd.data()};
          const strata_status s =
              strata_plan_run(plan, t.data(), static_cast<int32_t>(t.size()), work, ws, nullptr);
          const std::string msg = strata_get_last_error_message();
          strata_device_synchronize(dev);
          if (work) strata_free(work);
          strata_plan_destroy(plan);
          const std::string what = impl + (bwd ? " bwd" : " fwd") + (cdt == STRATA_DTYPE_I32 ? " i32" : " i64");
          HostTensor gy = y, ghT = hT, gdw = dw, gdh0 = dh0;
          yd.download(gy), hTd.download(ghT), dwd.download(gdw), dh0d.download(gdh0);
          if (needle.empty()) {
            EXPECT_EQ(s, STRATA_SUCCESS) << what << ": " << msg;
            EXPECT_FALSE(all_poison(gy)) << what << ": the valid pack wrote nothing";
            continue;
          }
          EXPECT_EQ(s, STRATA_ERROR_INVALID_VALUE) << what << ": " << needle;
          EXPECT_EQ(msg, std::string(bwd ? "causal_conv1d_bwd: " : "causal_conv1d_fwd: ") + needle) << what;
          EXPECT_TRUE(all_poison(gy) && all_poison(ghT) && all_poison(gdw) && all_poison(gdh0))
              << what << ": an output was written by a rejected call (" << needle << ")";
        }
}

TEST(CausalConv1d, CppWrapper) {
  const Device cpu = Device::cpu();
  Tensor x = Tensor::empty(STRATA_DTYPE_F32, {2, 20, 8}, cpu);
  Tensor w = Tensor::empty(STRATA_DTYPE_F32, {8, 3}, cpu);
  float* xp = static_cast<float*>(x.data());
  float* wp = static_cast<float*>(w.data());
  for (int64_t i = 0; i < x.numel(); ++i) xp[i] = std::sin(0.1f * static_cast<float>(i));
  for (int64_t i = 0; i < w.numel(); ++i) wp[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
  CausalConv1dOptions o;
  o.output_final_state = true;
  auto [y, hT] = causal_conv1d_fwd(x, w, nullptr, nullptr, nullptr, nullptr, nullptr, o);
  ASSERT_EQ(hT.shape(), (std::vector<int64_t>{2, 8, 2}));
  // y[b, t, d] = silu(sum_k w[d, k] x[b, t - 2 + k, d]).
  const float* yp = static_cast<const float*>(y.data());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 20; ++t)
      for (int64_t d = 0; d < 8; ++d) {
        double u = 0;
        for (int64_t k = 0; k < 3; ++k) {
          const int64_t p = t - 2 + k;
          if (p >= 0) u += wp[d * 3 + k] * xp[(b * 20 + p) * 8 + d];
        }
        ASSERT_NEAR(yp[(b * 20 + t) * 8 + d], u / (1 + std::exp(-u)), 1e-5);
      }
  // The final state is the last two tokens.
  const float* hp = static_cast<const float*>(hT.data());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t d = 0; d < 8; ++d)
      for (int64_t j = 0; j < 2; ++j) ASSERT_EQ(hp[(b * 8 + d) * 2 + j], xp[(b * 20 + 18 + j) * 8 + d]);
  Tensor dy = Tensor::empty(STRATA_DTYPE_F32, {2, 20, 8}, cpu);
  std::fill(static_cast<float*>(dy.data()), static_cast<float*>(dy.data()) + dy.numel(), 1.f);
  auto [dx, dw, db, dh0] = causal_conv1d_bwd(x, w, nullptr, nullptr, nullptr, nullptr, dy, nullptr, o);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(dw.shape(), w.shape());
}

}  // namespace
}  // namespace strata
