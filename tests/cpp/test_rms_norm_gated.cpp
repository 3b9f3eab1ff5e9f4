// rms_norm_gated beyond the conformance driver (ops_fused.md §4): every validation rule (status, message,
// outputs untouched), gradients against float64 central differences (both orders, both gates, groups, weight,
// bias, residual with residual_out's incoming gradient), determinism (repeated runs, 1 vs 2 threads, dweight /
// dbias reductions over several row blocks), the dweight-of-no-rows case, and the C++ wrapper.
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

// ---- forward / backward calls on host tensors ----
struct Fwd {
  const HostTensor *x, *z, *w = nullptr, *b = nullptr, *res = nullptr;
  HostTensor *y, *ro = nullptr, *rstd;
  float eps = 1e-5f;
  int64_t group = 0;
  int32_t nbg = 1, act = STRATA_GATE_SILU;
  strata_status run() const {
    strata_plan plan = nullptr;
    strata_status s = strata_rms_norm_gated_fwd_plan(dsc(x), dsc(z), dsc(w), dsc(b), dsc(res), dsc(y), dsc(ro),
                                                     dsc(rstd), eps, group, nbg, act, &plan);
    if (s != STRATA_SUCCESS) return s;
    void* t[] = {dat(x), dat(z), dat(w), dat(b), dat(res), dat(y), dat(ro), dat(rstd)};
    s = strata_plan_run(plan, t, 8, nullptr, 0, nullptr);
    strata_plan_destroy(plan);
    return s;
  }
};
struct Bwd {
  const HostTensor *x, *z, *w = nullptr, *b = nullptr, *res = nullptr, *rstd, *dy, *dro = nullptr;
  HostTensor *dx, *dz, *dw = nullptr, *db = nullptr;
  int64_t group = 0;
  int32_t nbg = 1, act = STRATA_GATE_SILU;
  strata_status run() const {
    strata_plan plan = nullptr;
    strata_status s = strata_rms_norm_gated_bwd_plan(dsc(x), dsc(z), dsc(w), dsc(b), dsc(res), dsc(rstd), dsc(dy),
                                                     dsc(dro), dsc(dx), dsc(dz), dsc(dw), dsc(db), group, nbg, act,
                                                     &plan);
    if (s != STRATA_SUCCESS) return s;
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    std::vector<uint8_t> wsb(ws);
    void* t[] = {dat(x), dat(z), dat(w), dat(b), dat(res), dat(rstd), dat(dy), dat(dro), dat(dx), dat(dz), dat(dw),
                 dat(db)};
    s = strata_plan_run(plan, t, 12, wsb.data(), ws, nullptr);
    strata_plan_destroy(plan);
    return s;
  }
};

// ---------------------------------------------------------------------------------------------- validation

struct V {
  HostTensor x = rnd(STRATA_DTYPE_F32, {4, 16}, 1), z = rnd(STRATA_DTYPE_F32, {4, 16}, 2);
  HostTensor w = rnd(STRATA_DTYPE_F32, {16}, 3), y = poisoned(STRATA_DTYPE_F32, {4, 16});
  HostTensor rstd = poisoned(STRATA_DTYPE_F32, {4, 2});
  Fwd f() { return Fwd{&x, &z, &w, nullptr, nullptr, &y, nullptr, &rstd, 1e-5f, 8}; }
  void expect(const Fwd& call, strata_status st, const std::string& needle) {
    const strata_status s = call.run();
    const std::string msg = strata_get_last_error_message();
    EXPECT_EQ(s, st) << strata_status_name(s) << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    EXPECT_TRUE(all_poison(y) && all_poison(rstd)) << "outputs written by a rejected call: " << needle;
  }
};

TEST(RmsNormGatedValidation, NullRule) {
  V v;
  Fwd f = v.f();
  f.z = nullptr;
  v.expect(f, STRATA_ERROR_NULL_POINTER, "rms_norm_gated_fwd: z must not be NULL");
}

TEST(RmsNormGatedValidation, DeviceRule) {
  V v;
  HostTensor w2 = v.w;
  w2.desc.device = {STRATA_DEVICE_CPU, 3};
  Fwd f = v.f();
  f.w = &w2;
  v.expect(f, STRATA_ERROR_INVALID_DEVICE, "weight");
}

TEST(RmsNormGatedValidation, ActivationDtypesMustMatchX) {
  V v;
  HostTensor zb = rnd(STRATA_DTYPE_BF16, {4, 16}, 2);
  Fwd f = v.f();
  f.z = &zb;
  v.expect(f, STRATA_ERROR_INVALID_DTYPE, "z has dtype bf16, expected one of f32");
}

TEST(RmsNormGatedValidation, ResidualDtypeIsXsOrF32) {
  HostTensor x = rnd(STRATA_DTYPE_BF16, {4, 16}, 1), z = rnd(STRATA_DTYPE_BF16, {4, 16}, 2);
  HostTensor r = rnd(STRATA_DTYPE_F16, {4, 16}, 3), y = poisoned(STRATA_DTYPE_BF16, {4, 16});
  HostTensor rs = poisoned(STRATA_DTYPE_F32, {4, 1});
  Fwd f{&x, &z, nullptr, nullptr, &r, &y, nullptr, &rs};
  EXPECT_EQ(f.run(), STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("residual has dtype f16, expected one of bf16, f32"),
            std::string::npos)
      << strata_get_last_error_message();
  EXPECT_TRUE(all_poison(y) && all_poison(rs));
}

TEST(RmsNormGatedValidation, RstdMustBeF32) {
  V v;
  HostTensor rb = poisoned(STRATA_DTYPE_BF16, {4, 2});
  Fwd f = v.f();
  f.rstd = &rb;
  const strata_status s = f.run();
  EXPECT_EQ(s, STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("rstd has dtype bf16"), std::string::npos);
  EXPECT_TRUE(all_poison(rb) && all_poison(v.y));
}

TEST(RmsNormGatedValidation, MismatchedShapes) {
  V v;
  HostTensor z2 = rnd(STRATA_DTYPE_F32, {4, 15}, 2);
  Fwd f = v.f();
  f.z = &z2;
  v.expect(f, STRATA_ERROR_INVALID_SHAPE, "z must have shape [4, 16] (the shape of x), got [4, 15]");
}

TEST(RmsNormGatedValidation, WeightMustBeD) {
  V v;
  HostTensor w2 = rnd(STRATA_DTYPE_F32, {17}, 3);
  Fwd f = v.f();
  f.w = &w2;
  v.expect(f, STRATA_ERROR_INVALID_SHAPE, "weight must have shape [16]");
}

TEST(RmsNormGatedValidation, RstdShapeFollowsGroups) {
  V v;
  HostTensor r1 = poisoned(STRATA_DTYPE_F32, {4, 1});
  Fwd f = v.f();
  f.rstd = &r1;  // group 8 -> 2 groups
  const strata_status s = f.run();
  EXPECT_EQ(s, STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("rstd must have shape [4, 2]"), std::string::npos)
      << strata_get_last_error_message();
}

TEST(RmsNormGatedValidation, OutputsMustNotAlias) {
  V v;
  HostTensor y2 = v.y;
  y2.desc.strides[0] = 0;
  Fwd f = v.f();
  f.y = &y2;
  const strata_status s = f.run();
  EXPECT_EQ(s, STRATA_ERROR_INVALID_STRIDE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("y"), std::string::npos);
  EXPECT_TRUE(all_poison(y2));
}

TEST(RmsNormGatedValidation, GroupSizeMustDivideD) {
  V v;
  Fwd f = v.f();
  f.group = 5;
  v.expect(f, STRATA_ERROR_INVALID_ATTRIBUTE, "group_size must divide D = 16 (x.shape[-1]), got 5");
}

TEST(RmsNormGatedValidation, GroupSizeMustBeNonNegative) {
  V v;
  Fwd f = v.f();
  f.group = -8;
  v.expect(f, STRATA_ERROR_INVALID_ATTRIBUTE, "group_size must be >= 0");
}

TEST(RmsNormGatedValidation, EpsMustBeFiniteAndNonNegative) {
  for (float eps : {std::nanf(""), INFINITY, -1e-6f}) {
    V v;
    Fwd f = v.f();
    f.eps = eps;
    v.expect(f, STRATA_ERROR_INVALID_ATTRIBUTE, "eps must be finite and >= 0");
  }
}

TEST(RmsNormGatedValidation, ModeAndActivationCodes) {
  V v;
  Fwd f = v.f();
  f.nbg = 2;
  v.expect(f, STRATA_ERROR_INVALID_ATTRIBUTE, "norm_before_gate must be 0 or 1, got 2");
  f = v.f();
  f.act = 7;
  v.expect(f, STRATA_ERROR_INVALID_ATTRIBUTE, "activation must be STRATA_GATE_SILU (0) or STRATA_GATE_SIGMOID (1)");
}

TEST(RmsNormGatedValidation, BackwardGradientsNeedTheirParameters) {
  V v;
  HostTensor rs = rnd(STRATA_DTYPE_F32, {4, 2}, 5, 1.0, 0.1), dy = rnd(STRATA_DTYPE_F32, {4, 16}, 6);
  HostTensor dx = poisoned(STRATA_DTYPE_F32, {4, 16}), dz = poisoned(STRATA_DTYPE_F32, {4, 16});
  HostTensor db = poisoned(STRATA_DTYPE_F32, {16});
  Bwd b{&v.x, &v.z, &v.w, nullptr, nullptr, &rs, &dy, nullptr, &dx, &dz, nullptr, &db, 8};
  EXPECT_EQ(b.run(), STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("dbias must be NULL when bias is NULL"),
            std::string::npos);
  EXPECT_TRUE(all_poison(dx) && all_poison(dz) && all_poison(db));
}

// The backward of V's x, z, weight (no bias, no residual) planned with or without dweight: its tensors (outputs
// poisoned), the plan, its workspace size and the 12 run-time pointers (dweight's always set).
struct PlannedBwd {
  V v;
  HostTensor rs = rnd(STRATA_DTYPE_F32, {4, 2}, 5, 1.0, 0.1), dy = rnd(STRATA_DTYPE_F32, {4, 16}, 6);
  HostTensor dx = poisoned(STRATA_DTYPE_F32, {4, 16}), dz = poisoned(STRATA_DTYPE_F32, {4, 16});
  HostTensor dw = poisoned(STRATA_DTYPE_F32, {16});
  strata_plan plan = nullptr;
  size_t ws = 0;
  explicit PlannedBwd(bool plan_dweight) {
    EXPECT_EQ(strata_rms_norm_gated_bwd_plan(&v.x.desc, &v.z.desc, &v.w.desc, nullptr, nullptr, &rs.desc, &dy.desc,
                                             nullptr, &dx.desc, &dz.desc, plan_dweight ? &dw.desc : nullptr, nullptr, 8,
                                             1, 0, &plan),
              STRATA_SUCCESS);
    strata_plan_workspace_size(plan, &ws);
  }
  ~PlannedBwd() { strata_plan_destroy(plan); }
  std::vector<void*> ptrs() {
    return {dat(&v.x), dat(&v.z), dat(&v.w), nullptr, nullptr, dat(&rs), dat(&dy), nullptr, dat(&dx), dat(&dz),
            dat(&dw), nullptr};
  }
};

TEST(RmsNormGatedValidation, BackwardWorkspaceTooSmallWritesNothing) {
  PlannedBwd b(true);
  ASSERT_NE(b.plan, nullptr);
  EXPECT_GT(b.ws, 0u);
  std::vector<void*> t = b.ptrs();
  std::vector<uint8_t> small(b.ws - 1);
  EXPECT_EQ(strata_plan_run(b.plan, t.data(), 12, small.data(), b.ws - 1, nullptr), STRATA_ERROR_WORKSPACE_TOO_SMALL);
  EXPECT_TRUE(all_poison(b.dx) && all_poison(b.dz) && all_poison(b.dw));
}

// A pointer for an optional tensor the plan was made without is rejected at run time: the CPU backward would
// otherwise sum dweight partials into a workspace sized for no dweight (a heap overflow found in session 13).
TEST(RmsNormGatedValidation, RunRejectsATensorThePlanWasMadeWithout) {
  PlannedBwd b(false);
  ASSERT_NE(b.plan, nullptr);
  std::vector<uint8_t> wsb(b.ws + 1);
  std::vector<void*> t = b.ptrs();
  EXPECT_EQ(strata_plan_run(b.plan, t.data(), 12, wsb.data(), b.ws, nullptr), STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("tensor 10 was not given when the plan was made"),
            std::string::npos);
  EXPECT_TRUE(all_poison(b.dx) && all_poison(b.dz) && all_poison(b.dw));
  t[10] = nullptr;  // the same call without it runs
  EXPECT_EQ(strata_plan_run(b.plan, t.data(), 12, wsb.data(), b.ws, nullptr), STRATA_SUCCESS);
  EXPECT_FALSE(all_poison(b.dx));
  EXPECT_TRUE(all_poison(b.dw));
}

// ---------------------------------------------------------------------------------------------- gradients

// Loss L = sum(y * R) + sum(residual_out * S); the backward's dx, dz, dw, db (and dresidual = dx) against central
// differences of the forward, all in f64.
void fd_check(int64_t D, int64_t group, int32_t nbg, int32_t act, bool weight, bool bias, bool residual) {
  const int64_t rows = 3;
  const int32_t f64 = STRATA_DTYPE_F64;
  HostTensor x = rnd(f64, {rows, D}, 11, 0.2), z = rnd(f64, {rows, D}, 12, 0.0, 1.5);
  HostTensor w = rnd(f64, {D}, 13, 1.0, 0.3), b = rnd(f64, {D}, 14, 0.0, 0.3), r = rnd(f64, {rows, D}, 15);
  HostTensor R = rnd(f64, {rows, D}, 16), S = rnd(f64, {rows, D}, 17);
  const int64_t G = group ? group : D;
  auto loss = [&]() {
    HostTensor y = HostTensor::make(f64, {rows, D}), ro = HostTensor::make(f64, {rows, D});
    HostTensor rs = HostTensor::make(f64, {rows, D / G});
    Fwd f{&x, &z, weight ? &w : nullptr, bias ? &b : nullptr, residual ? &r : nullptr, &y, residual ? &ro : nullptr,
          &rs, 1e-5f, group, nbg, act};
    EXPECT_EQ(f.run(), STRATA_SUCCESS) << strata_get_last_error_message();
    double l = 0;
    for (int64_t e = 0; e < rows * D; ++e) l += y.get(e) * R.get(e) + (residual ? ro.get(e) * S.get(e) : 0.0);
    return l;
  };
  // Analytic gradients.
  HostTensor y = HostTensor::make(f64, {rows, D}), rs = HostTensor::make(f64, {rows, D / G});
  Fwd f{&x, &z, weight ? &w : nullptr, bias ? &b : nullptr, residual ? &r : nullptr, &y, nullptr, &rs, 1e-5f, group,
        nbg, act};
  ASSERT_EQ(f.run(), STRATA_SUCCESS) << strata_get_last_error_message();
  HostTensor dx = HostTensor::make(f64, {rows, D}), dz = dx, dw = HostTensor::make(f64, {D}), db = dw;
  Bwd bw{&x, &z, weight ? &w : nullptr, bias ? &b : nullptr, residual ? &r : nullptr, &rs, &R, residual ? &S : nullptr,
         &dx, &dz, weight ? &dw : nullptr, bias ? &db : nullptr, group, nbg, act};
  ASSERT_EQ(bw.run(), STRATA_SUCCESS) << strata_get_last_error_message();
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
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-6)
        << name << " D=" << D << " group=" << group << " nbg=" << nbg << " act=" << act;
  };
  check(x, dx, "dx");
  check(z, dz, "dz");
  if (weight) check(w, dw, "dweight");
  if (bias) check(b, db, "dbias");
  if (residual) check(r, dx, "dresidual");
}

TEST(RmsNormGatedGradients, NormBeforeGateSiluMatchesFiniteDifferences) { fd_check(12, 4, 1, STRATA_GATE_SILU, true, true, false); }
TEST(RmsNormGatedGradients, NormBeforeGateSigmoidMatchesFiniteDifferences) { fd_check(10, 0, 1, STRATA_GATE_SIGMOID, true, false, true); }
TEST(RmsNormGatedGradients, GateBeforeNormSiluMatchesFiniteDifferences) { fd_check(12, 3, 0, STRATA_GATE_SILU, true, true, true); }
TEST(RmsNormGatedGradients, GateBeforeNormSigmoidMatchesFiniteDifferences) { fd_check(9, 9, 0, STRATA_GATE_SIGMOID, false, true, false); }
TEST(RmsNormGatedGradients, NoWeightNoBiasMatchesFiniteDifferences) { fd_check(8, 2, 1, STRATA_GATE_SILU, false, false, false); }

// ---------------------------------------------------------------------------------------------- determinism

std::vector<std::vector<uint8_t>> bits(int32_t dt, int64_t rows, int64_t D, int64_t group, int32_t nbg) {
  HostTensor x = rnd(dt, {rows, D}, 21), z = rnd(dt, {rows, D}, 22), w = rnd(STRATA_DTYPE_F32, {D}, 23, 1.0, 0.2);
  HostTensor b = rnd(STRATA_DTYPE_F32, {D}, 24, 0.0, 0.2), r = rnd(dt, {rows, D}, 25), dy = rnd(dt, {rows, D}, 26);
  const int64_t G = group ? group : D;
  HostTensor y = poisoned(dt, {rows, D}), rs = poisoned(STRATA_DTYPE_F32, {rows, D / G}), ro = poisoned(dt, {rows, D});
  Fwd f{&x, &z, &w, &b, &r, &y, &ro, &rs, 1e-6f, group, nbg, STRATA_GATE_SILU};
  EXPECT_EQ(f.run(), STRATA_SUCCESS) << strata_get_last_error_message();
  HostTensor dx = poisoned(dt, {rows, D}), dz = poisoned(dt, {rows, D});
  HostTensor dw = poisoned(STRATA_DTYPE_F32, {D}), db = poisoned(STRATA_DTYPE_F32, {D});
  Bwd bw{&x, &z, &w, &b, &r, &rs, &dy, nullptr, &dx, &dz, &dw, &db, group, nbg, STRATA_GATE_SILU};
  EXPECT_EQ(bw.run(), STRATA_SUCCESS) << strata_get_last_error_message();
  return {y.storage, rs.storage, ro.storage, dx.storage, dz.storage, dw.storage, db.storage};
}

TEST(RmsNormGatedDeterminism, BitwiseAcrossRunsAndThreadCounts) {
  const int32_t before = strata_get_num_threads();
  struct C {
    int32_t dt;
    int64_t rows, D, group;
    int32_t nbg;
  };
  // Several row blocks each (the dweight / dbias partial rows), a large bf16 case on the streaming-store path.
  const std::vector<C> cases = {{STRATA_DTYPE_F32, 3001, 64, 16, 1},
                                {STRATA_DTYPE_BF16, 17000, 128, 0, 1},
                                {STRATA_DTYPE_F16, 777, 96, 24, 0},
                                {STRATA_DTYPE_BF16, 301, 1030, 206, 0}};
  for (const std::string& impl : atk::impls_for("rms_norm_gated_bwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (size_t k = 0; k < cases.size(); ++k) {
      const C& c = cases[k];
      ASSERT_EQ(strata_set_num_threads(2), STRATA_SUCCESS);
      const auto first = bits(c.dt, c.rows, c.D, c.group, c.nbg);
      EXPECT_EQ(bits(c.dt, c.rows, c.D, c.group, c.nbg), first) << impl << " case " << k << ": repeated run differs";
      ASSERT_EQ(strata_set_num_threads(1), STRATA_SUCCESS);
      EXPECT_EQ(bits(c.dt, c.rows, c.D, c.group, c.nbg), first) << impl << " case " << k << ": 1 vs 2 threads differ";
    }
  }
  strata_set_num_threads(before);
}

// The gate-before-norm backward of long one-group rows with dweight / dbias (BwdRowsGbnBlocked in cpu-inl.h:
// sub-blocks of rows, dweight / dbias summed in registers down the columns) against the per-row kernels, bit for bit: a
// residual of zeros (h = x + 0 = x exactly) sends the same problem through the general scratch-row path, and
// dropping dweight / dbias sends dx / dz through BwdRowDirect. Rows > one block (16 rows at D >= 2048) and more
// than one sub-block per block, with a remainder; both activations, bf16 and f32.
TEST(RmsNormGated, BlockedGateBeforeNormBackwardMatchesRowKernels) {
  struct C {
    int32_t dt;
    int64_t rows, D, group;
    int32_t act;
  };
  const std::vector<C> cases = {{STRATA_DTYPE_BF16, 37, 5120, 0, STRATA_GATE_SILU},
                                {STRATA_DTYPE_BF16, 21, 2048, 2048, STRATA_GATE_SIGMOID},
                                {STRATA_DTYPE_F32, 19, 1024, 0, STRATA_GATE_SILU}};
  for (const std::string& impl : atk::impls_for("rms_norm_gated_bwd", kCpu)) {
    ForceImpl force(impl.c_str());
    for (size_t k = 0; k < cases.size(); ++k) {
      const C& c = cases[k];
      const int64_t G = c.group ? c.group : c.D;
      HostTensor x = rnd(c.dt, {c.rows, c.D}, 31), z = rnd(c.dt, {c.rows, c.D}, 32), dy = rnd(c.dt, {c.rows, c.D}, 33);
      HostTensor w = rnd(STRATA_DTYPE_F32, {c.D}, 34, 1.0, 0.2), bias = rnd(STRATA_DTYPE_F32, {c.D}, 35, 0.0, 0.2);
      HostTensor zero = HostTensor::make(c.dt, {c.rows, c.D});  // zero-filled
      HostTensor y = poisoned(c.dt, {c.rows, c.D}), rs = poisoned(STRATA_DTYPE_F32, {c.rows, c.D / G});
      Fwd f{&x, &z, &w, nullptr, nullptr, &y, nullptr, &rs, 1e-6f, c.group, 0, c.act};
      ASSERT_EQ(f.run(), STRATA_SUCCESS) << strata_get_last_error_message();
      auto run = [&](bool residual, bool grads) {
        HostTensor dx = poisoned(c.dt, {c.rows, c.D}), dz = poisoned(c.dt, {c.rows, c.D});
        HostTensor dw = poisoned(STRATA_DTYPE_F32, {c.D}), db = poisoned(STRATA_DTYPE_F32, {c.D});
        Bwd b{&x, &z, &w, grads ? &bias : nullptr, residual ? &zero : nullptr, &rs, &dy, nullptr, &dx, &dz,
              grads ? &dw : nullptr, grads ? &db : nullptr, c.group, 0, c.act};
        EXPECT_EQ(b.run(), STRATA_SUCCESS) << strata_get_last_error_message();
        return std::vector<std::vector<uint8_t>>{dx.storage, dz.storage, dw.storage, db.storage};
      };
      const auto blocked = run(false, true), general = run(true, true), direct = run(false, false);
      EXPECT_EQ(blocked[0], general[0]) << impl << " case " << k << ": dx";
      EXPECT_EQ(blocked[1], general[1]) << impl << " case " << k << ": dz";
      EXPECT_EQ(blocked[2], general[2]) << impl << " case " << k << ": dweight";
      EXPECT_EQ(blocked[3], general[3]) << impl << " case " << k << ": dbias";
      EXPECT_EQ(blocked[0], direct[0]) << impl << " case " << k << ": dx vs the row kernel";
      EXPECT_EQ(blocked[1], direct[1]) << impl << " case " << k << ": dz vs the row kernel";
    }
  }
}

TEST(RmsNormGated, NoRowsGivesZeroWeightGradients) {
  for (const std::string& impl : atk::impls_for("rms_norm_gated_bwd", kCpu)) {
    ForceImpl force(impl.c_str());
    HostTensor x = HostTensor::make(STRATA_DTYPE_F32, {0, 16}), z = x, dy = x, dx = x, dz = x;
    HostTensor w = rnd(STRATA_DTYPE_F32, {16}, 1), b = w, rs = HostTensor::make(STRATA_DTYPE_F32, {0, 1});
    HostTensor dw = poisoned(STRATA_DTYPE_F32, {16}), db = poisoned(STRATA_DTYPE_BF16, {16});
    Bwd bw{&x, &z, &w, &b, nullptr, &rs, &dy, nullptr, &dx, &dz, &dw, &db};
    ASSERT_EQ(bw.run(), STRATA_SUCCESS) << impl << ": " << strata_get_last_error_message();
    for (int64_t j = 0; j < 16; ++j) {
      EXPECT_EQ(dw.get(j), 0.0) << impl;
      EXPECT_EQ(db.get(j), 0.0) << impl;
    }
  }
}

TEST(RmsNormGated, CppWrapper) {
  Tensor x = Tensor::empty(STRATA_DTYPE_F32, {5, 32}), z = Tensor::empty(STRATA_DTYPE_F32, {5, 32});
  Tensor w = Tensor::empty(STRATA_DTYPE_F32, {32});
  for (int64_t i = 0; i < 160; ++i) {
    static_cast<float*>(x.data())[i] = 0.01f * static_cast<float>(i % 37) - 0.2f;
    static_cast<float*>(z.data())[i] = 0.03f * static_cast<float>(i % 11) - 0.15f;
  }
  for (int64_t j = 0; j < 32; ++j) static_cast<float*>(w.data())[j] = 1.f + 0.01f * static_cast<float>(j);
  RmsNormGatedOptions o;
  o.group_size = 16;
  o.prenorm = true;
  auto [y, rstd, ro] = rms_norm_gated_fwd(x, z, &w, nullptr, nullptr, o);
  ASSERT_EQ(rstd.shape(), (std::vector<int64_t>{5, 2}));
  ASSERT_EQ(ro.shape(), (std::vector<int64_t>{5, 32}));
  // Row 0, group 0 by hand.
  double ss = 0;
  for (int j = 0; j < 16; ++j) ss += double(static_cast<float*>(x.data())[j]) * static_cast<float*>(x.data())[j];
  const double r0 = 1.0 / std::sqrt(ss / 16 + 1e-6);
  EXPECT_NEAR(static_cast<float*>(rstd.data())[0], r0, 1e-5 * r0);
  const double z3 = static_cast<float*>(z.data())[3];
  const double y3 = static_cast<float*>(x.data())[3] * r0 * static_cast<float*>(w.data())[3] * z3 / (1 + std::exp(-z3));
  EXPECT_NEAR(static_cast<float*>(y.data())[3], y3, 1e-5);
  EXPECT_EQ(static_cast<float*>(ro.data())[7], static_cast<float*>(x.data())[7]);
  auto [dx, dz, dw, db] = rms_norm_gated_bwd(x, z, &w, nullptr, nullptr, rstd, y, nullptr, o);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(dw.shape(), (std::vector<int64_t>{32}));
  EXPECT_EQ(db.data(), nullptr);
}

}  // namespace
}  // namespace strata
