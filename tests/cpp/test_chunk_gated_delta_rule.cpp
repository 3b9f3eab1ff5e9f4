// chunk_gated_delta_rule beyond the conformance driver (ops_gdn_kda.md §4.12, §7.4): every validation rule
// (status, message, outputs untouched), the run-time cu_seqlens checks, the float64 backward against float64
// finite differences of the float64 forward, determinism (repeated runs, 1 vs 2 threads, every CPU ISA),
// packed-vs-separate equality, zero-length sequences, plan reuse, workspace checks and the C++ wrappers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/testkit.h"
#include "test_support.h"

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, kCpu, poisoned, all_poison, ... (test_support.h)

using atk::HostTensor;

HostTensor randn(int32_t dt, const std::vector<int64_t>& shape, std::mt19937_64& rng, double mean = 0, double sd = 1) {
  HostTensor t = HostTensor::make(dt, shape);
  t.fill_normal(rng, mean, sd);
  return t;
}
HostTensor make_cu(const std::vector<int64_t>& values) {
  HostTensor cu = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) cu.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
  return cu;
}
void* data(HostTensor* t) { return t ? t->storage.data() : nullptr; }
const strata_tensor_desc* desc(const HostTensor* t) { return t ? &t->desc : nullptr; }

// A problem on the host: inputs with unit-norm keys, gates in log space, sigmoid betas.
struct Problem {
  int64_t B, T, H, HV, K, V, N;
  std::vector<int64_t> cu_values;
  int32_t dt;
  HostTensor q, k, v, g, beta, h0, cu, d_o, dht;
  bool has_h0, has_dht;
  Problem(int32_t dtype, int64_t B_, int64_t T_, int64_t H_, int64_t HV_, int64_t K_, int64_t V_,
          std::vector<int64_t> cu_ = {}, bool h0_ = true, bool dht_ = true, uint64_t seed = 1)
      : B(B_), T(T_), H(H_), HV(HV_), K(K_), V(V_), cu_values(std::move(cu_)), dt(dtype), has_h0(h0_), has_dht(dht_) {
    N = cu_values.empty() ? B : static_cast<int64_t>(cu_values.size()) - 1;
    const int32_t sdt = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    std::mt19937_64 rng(seed);
    q = randn(dt, {B, T, H, K}, rng);
    k = randn(dt, {B, T, H, K}, rng);
    v = randn(dt, {B, T, HV, V}, rng);
    g = HostTensor::make(sdt, {B, T, HV});
    std::uniform_real_distribution<double> U(0.05, 1.0);
    for (int64_t i = 0; i < g.numel(); ++i) g.set(i, std::log(1.0 / (1.0 + std::exp(-U(rng)))));
    beta = HostTensor::make(dt, {B, T, HV});
    for (int64_t i = 0; i < beta.numel(); ++i) beta.set(i, 1.0 / (1.0 + std::exp(-2.0 * U(rng) + 1.0)));
    h0 = randn(sdt, {N, HV, K, V}, rng, 0, 0.5);
    d_o = randn(dt, {B, T, HV, V}, rng);
    dht = randn(sdt, {N, HV, K, V}, rng);
    if (!cu_values.empty()) cu = make_cu(cu_values);
  }
  HostTensor* cu_ptr() { return cu_values.empty() ? nullptr : &cu; }
  HostTensor* h0_ptr() { return has_h0 ? &h0 : nullptr; }
  HostTensor* dht_ptr() { return has_dht ? &dht : nullptr; }
  int32_t sdt() const { return g.desc.dtype; }
};

std::vector<uint8_t> g_ws;

strata_status run_fwd(Problem& p, HostTensor& o, HostTensor* ht, float scale, bool l2, std::string* impl = nullptr) {
  strata_plan plan = nullptr;
  strata_status s = strata_chunk_gated_delta_rule_fwd_plan(&p.q.desc, &p.k.desc, &p.v.desc, &p.g.desc, &p.beta.desc,
                                                           desc(p.h0_ptr()), desc(p.cu_ptr()), &o.desc, desc(ht),
                                                           nullptr, scale, l2 ? 1 : 0, &plan);
  if (s != STRATA_SUCCESS) return s;
  if (impl) *impl = strata_plan_impl_name(plan);
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  g_ws.assign(ws, 0);
  void* t[] = {data(&p.q), data(&p.k), data(&p.v), data(&p.g), data(&p.beta), data(p.h0_ptr()), data(p.cu_ptr()),
               data(&o), data(ht), nullptr};
  s = strata_plan_run(plan, t, 10, g_ws.data(), ws, nullptr);
  strata_plan_destroy(plan);
  return s;
}

struct Grads {
  HostTensor dq, dk, dv, dg, dbeta, dh0;
  explicit Grads(const Problem& p)
      : dq(poisoned(p.dt, {p.B, p.T, p.H, p.K})),
        dk(poisoned(p.dt, {p.B, p.T, p.H, p.K})),
        dv(poisoned(p.dt, {p.B, p.T, p.HV, p.V})),
        dg(poisoned(p.sdt(), {p.B, p.T, p.HV})),
        dbeta(poisoned(p.dt, {p.B, p.T, p.HV})),
        dh0(poisoned(p.sdt(), {p.N, p.HV, p.K, p.V})) {}
  bool untouched() const {
    return all_poison(dq) && all_poison(dk) && all_poison(dv) && all_poison(dg) && all_poison(dbeta) && all_poison(dh0);
  }
};

strata_status run_bwd(Problem& p, Grads& gr, float scale, bool l2, std::string* impl = nullptr) {
  strata_plan plan = nullptr;
  HostTensor* dh0 = p.has_h0 ? &gr.dh0 : nullptr;
  strata_status s = strata_chunk_gated_delta_rule_bwd_plan(
      &p.q.desc, &p.k.desc, &p.v.desc, &p.g.desc, &p.beta.desc, desc(p.h0_ptr()), desc(p.cu_ptr()), &p.d_o.desc,
      desc(p.dht_ptr()), &gr.dq.desc, &gr.dk.desc, &gr.dv.desc, &gr.dg.desc, &gr.dbeta.desc, desc(dh0), nullptr,
      scale, l2 ? 1 : 0, &plan);
  if (s != STRATA_SUCCESS) return s;
  if (impl) *impl = strata_plan_impl_name(plan);
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  g_ws.assign(ws, 0);
  void* t[] = {data(&p.q),       data(&p.k),         data(&p.v),       data(&p.g),       data(&p.beta),
               data(p.h0_ptr()), data(p.cu_ptr()),   data(&p.d_o),     data(p.dht_ptr()), data(&gr.dq),
               data(&gr.dk),     data(&gr.dv),       data(&gr.dg),     data(&gr.dbeta),  data(dh0),
               nullptr};
  s = strata_plan_run(plan, t, 16, g_ws.data(), ws, nullptr);
  strata_plan_destroy(plan);
  return s;
}

std::vector<std::string> cpu_impls() { return atk::impls_for("chunk_gated_delta_rule_fwd", kCpu); }

// ---------------------------------------------------------------------------------------------- validation

// q [1, 8, 2, 4], v [1, 8, 4, 3], cu [0, 3, 8]; each rule mutates one descriptor of a valid call.
struct V {
  Problem p{STRATA_DTYPE_F32, 1, 8, 2, 4, 4, 3, {0, 3, 8}};
  HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 8, 4, 3});
  HostTensor ht = poisoned(STRATA_DTYPE_F32, {2, 4, 4, 3});
  struct D {
    strata_tensor_desc q, k, v, g, beta, h0, cu, o, ht;
  };
  D valid() const {
    return {p.q.desc, p.k.desc, p.v.desc, p.g.desc, p.beta.desc, p.h0.desc, p.cu.desc, o.desc, ht.desc};
  }
  void expect(const D& d, strata_status status, const std::string& needle, bool null_h0 = false) {
    strata_plan plan = nullptr;
    strata_status s = strata_chunk_gated_delta_rule_fwd_plan(&d.q, &d.k, &d.v, &d.g, &d.beta,
                                                             null_h0 ? nullptr : &d.h0, &d.cu, &d.o, &d.ht, nullptr,
                                                             0.5f, 0, &plan);
    if (s == STRATA_SUCCESS) {
      size_t ws = 0;
      strata_plan_workspace_size(plan, &ws);
      std::vector<uint8_t> w(ws);
      void* t[] = {data(&p.q), data(&p.k), data(&p.v), data(&p.g), data(&p.beta), data(&p.h0), data(&p.cu),
                   data(&o), data(&ht), nullptr};
      s = strata_plan_run(plan, t, 10, w.data(), ws, nullptr);
      strata_plan_destroy(plan);
    }
    const std::string msg = strata_get_last_error_message();
    EXPECT_EQ(s, status) << strata_status_name(s) << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
    EXPECT_TRUE(all_poison(o) && all_poison(ht)) << "outputs written by a rejected call: " << needle;
  }
};

TEST(ChunkGatedDeltaRule, ValidCallSucceeds) {
  V v;
  std::string impl;
  EXPECT_EQ(run_fwd(v.p, v.o, &v.ht, 0.5f, false, &impl), STRATA_SUCCESS) << strata_get_last_error_message();
  EXPECT_FALSE(all_poison(v.o));
}

TEST(ChunkGatedDeltaRule, NullRules) {
  V v;
  auto d = v.valid();
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_plan(nullptr, &d.k, &d.v, &d.g, &d.beta, nullptr, nullptr, &d.o,
                                                   nullptr, nullptr, 0.5f, 0, &plan),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("chunk_gated_delta_rule_fwd: q must not be NULL"),
            std::string::npos);
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&d.q, &d.k, &d.v, nullptr, &d.beta, nullptr, nullptr, &d.o,
                                                   nullptr, nullptr, 0.5f, 0, &plan),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("g must not be NULL"), std::string::npos);
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&d.q, &d.k, &d.v, &d.g, &d.beta, nullptr, &d.cu, nullptr,
                                                   nullptr, nullptr, 0.5f, 0, &plan),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("o must not be NULL"), std::string::npos);
  // the backward's required gradients
  Grads gr(v.p);
  EXPECT_EQ(strata_chunk_gated_delta_rule_bwd_plan(&d.q, &d.k, &d.v, &d.g, &d.beta, nullptr, &d.cu, &v.p.d_o.desc,
                                                   nullptr, &gr.dq.desc, &gr.dk.desc, &gr.dv.desc, nullptr,
                                                   &gr.dbeta.desc, nullptr, nullptr, 0.5f, 0, &plan),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("chunk_gated_delta_rule_bwd: dg must not be NULL"),
            std::string::npos);
  // a plan made with cu_seqlens needs its pointer at run time
  ASSERT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&d.q, &d.k, &d.v, &d.g, &d.beta, nullptr, &d.cu, &d.o, nullptr,
                                                   nullptr, 0.5f, 0, &plan),
            STRATA_SUCCESS);
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  std::vector<uint8_t> w(ws);
  void* t[] = {data(&v.p.q), data(&v.p.k), data(&v.p.v), data(&v.p.g), data(&v.p.beta), nullptr, nullptr,
               data(&v.o), nullptr, nullptr};
  EXPECT_EQ(strata_plan_run(plan, t, 10, w.data(), ws, nullptr), STRATA_ERROR_NULL_POINTER);
  strata_plan_destroy(plan);
  EXPECT_TRUE(all_poison(v.o));
}

TEST(ChunkGatedDeltaRule, DeviceRules) {
  V v;
  auto d = v.valid();
  d.k.device = {7, 0};
  v.expect(d, STRATA_ERROR_INVALID_DEVICE, "k");
  d = v.valid();
  d.h0.device = {STRATA_DEVICE_CPU, 1};
  v.expect(d, STRATA_ERROR_INVALID_DEVICE, "initial_state: device cpu:1 does not exist");
}

TEST(ChunkGatedDeltaRule, DtypeRules) {
  V v;
  auto d = v.valid();
  d.q.dtype = STRATA_DTYPE_I32;
  v.expect(d, STRATA_ERROR_INVALID_DTYPE, "q has dtype i32, expected one of f32, bf16, f16, f64");
  d = v.valid();
  d.h0.dtype = STRATA_DTYPE_BF16;
  v.expect(d, STRATA_ERROR_INVALID_DTYPE, "initial_state has dtype bf16, expected one of f32, f64");
  d = v.valid();
  d.ht.dtype = STRATA_DTYPE_F16;
  v.expect(d, STRATA_ERROR_INVALID_DTYPE, "final_state has dtype f16");
  d = v.valid();
  d.cu.dtype = STRATA_DTYPE_I32;
  v.expect(d, STRATA_ERROR_INVALID_DTYPE, "cu_seqlens has dtype i32, expected one of i64");
  d = v.valid();
  d.beta.dtype = STRATA_DTYPE_BOOL;
  v.expect(d, STRATA_ERROR_INVALID_DTYPE, "beta has dtype bool");
}

TEST(ChunkGatedDeltaRule, MismatchedHeadsRule) {
  V v;
  auto d = v.valid();
  d.k = make_desc(STRATA_DTYPE_F32, {1, 8, 1, 4});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "k must have shape [1, 8, 2, 4]");
}

TEST(ChunkGatedDeltaRule, ValueHeadsMustBeAMultipleOfQkHeads) {
  V v;
  auto d = v.valid();
  d.v = make_desc(STRATA_DTYPE_F32, {1, 8, 3, 3});
  d.g = make_desc(STRATA_DTYPE_F32, {1, 8, 3});
  d.beta = make_desc(STRATA_DTYPE_F32, {1, 8, 3});
  d.o = make_desc(STRATA_DTYPE_F32, {1, 8, 3, 3});
  d.h0 = make_desc(STRATA_DTYPE_F32, {2, 3, 4, 3});
  d.ht = d.h0;
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "HV = 3 (v.shape[2]) must be a positive multiple of the q/k heads H = 2");
}

TEST(ChunkGatedDeltaRule, ShapeRules) {
  V v;
  auto d = v.valid();
  d.q = make_desc(STRATA_DTYPE_F32, {8, 2, 4});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "q must have rank 4, got rank 3");
  d = v.valid();
  d.g = make_desc(STRATA_DTYPE_F32, {1, 8, 2});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "g must have shape [1, 8, 4]");
  d = v.valid();
  d.beta = make_desc(STRATA_DTYPE_F32, {1, 8, 4, 1});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "beta must have shape [1, 8, 4]");
  d = v.valid();
  d.o = make_desc(STRATA_DTYPE_F32, {1, 8, 4, 4});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "o must have shape [1, 8, 4, 3]");
  d = v.valid();
  d.v = make_desc(STRATA_DTYPE_F32, {1, 7, 4, 3});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "v must have shape [B, T, HV, V] with B, T = 1, 8 of q");
  d = v.valid();
  d.h0 = make_desc(STRATA_DTYPE_F32, {1, 4, 4, 3});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "initial_state must have shape [2, 4, 4, 3]");
  d = v.valid();
  d.ht = make_desc(STRATA_DTYPE_F32, {2, 4, 3, 4});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "final_state must have shape [2, 4, 4, 3]");
  d = v.valid();
  d.cu = make_desc(STRATA_DTYPE_I64, {3, 1});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "cu_seqlens must have rank 1, got rank 2");
}

TEST(ChunkGatedDeltaRule, VarlenNeedsOneBatchRow) {
  V v;
  auto d = v.valid();
  for (auto* x : {&d.q, &d.k}) *x = make_desc(STRATA_DTYPE_F32, {2, 4, 2, 4});
  for (auto* x : {&d.v, &d.o}) *x = make_desc(STRATA_DTYPE_F32, {2, 4, 4, 3});
  for (auto* x : {&d.g, &d.beta}) *x = make_desc(STRATA_DTYPE_F32, {2, 4, 4});
  v.expect(d, STRATA_ERROR_INVALID_SHAPE, "with cu_seqlens (a variable-length pack) q must have B = 1");
}

TEST(ChunkGatedDeltaRule, KeyDimLimit) {
  V v;
  auto d = v.valid();
  d.q = d.k = make_desc(STRATA_DTYPE_F32, {1, 8, 2, 257});
  d.h0 = d.ht = make_desc(STRATA_DTYPE_F32, {2, 4, 257, 3});
  v.expect(d, STRATA_ERROR_UNSUPPORTED, "K = q.shape[3] must be in [1, 256], got 257");
}

TEST(ChunkGatedDeltaRule, StrideRules) {
  V v;
  auto d = v.valid();
  d.v.strides[3] = 2;
  v.expect(d, STRATA_ERROR_INVALID_STRIDE, "v");
  d = v.valid();
  d.o.strides[1] = 0;  // two tokens would alias
  v.expect(d, STRATA_ERROR_INVALID_STRIDE, "o");
}

TEST(ChunkGatedDeltaRule, AttributeRules) {
  V v;
  auto d = v.valid();
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&d.q, &d.k, &d.v, &d.g, &d.beta, nullptr, &d.cu, &d.o, nullptr,
                                                   nullptr, NAN, 0, &plan),
            STRATA_ERROR_INVALID_ATTRIBUTE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("scale must be finite"), std::string::npos);
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&d.q, &d.k, &d.v, &d.g, &d.beta, nullptr, &d.cu, &d.o, nullptr,
                                                   nullptr, 0.5f, 2, &plan),
            STRATA_ERROR_INVALID_ATTRIBUTE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("use_qk_l2norm_in_kernel must be 0 or 1, got 2"),
            std::string::npos);
}

TEST(ChunkGatedDeltaRule, CuSeqlensValuesCheckedOnEveryCpuImpl) {
  for (const std::string& impl : cpu_impls()) {
    ForceImpl f(impl.c_str());
    for (const auto& [vals, needle] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
             {{1, 3, 8}, "cu_seqlens[0] must be 0, got 1"},
             {{0, 5, 3}, "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 3 after cu_seqlens[1] = 5"},
             {{0, 3, 7}, "the last entry cu_seqlens[2] must equal T = 8 (q.shape[1]), got 7"}}) {
      Problem p(STRATA_DTYPE_F32, 1, 8, 2, 4, 4, 3, vals);
      HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 8, 4, 3}), ht = poisoned(STRATA_DTYPE_F32, {2, 4, 4, 3});
      EXPECT_EQ(run_fwd(p, o, &ht, 0.5f, false), STRATA_ERROR_INVALID_VALUE) << impl;
      EXPECT_NE(std::string(strata_get_last_error_message()).find(needle), std::string::npos)
          << impl << ": " << strata_get_last_error_message();
      EXPECT_TRUE(all_poison(o) && all_poison(ht)) << impl;
      Grads gr(p);
      EXPECT_EQ(run_bwd(p, gr, 0.5f, false), STRATA_ERROR_INVALID_VALUE) << impl;
      EXPECT_TRUE(gr.untouched()) << impl;
    }
  }
}

TEST(ChunkGatedDeltaRule, CpuImplsRejectF64WithAReason) {
  for (const std::string& impl : cpu_impls()) {
    if (impl == "reference") continue;
    ForceImpl f(impl.c_str());
    Problem p(STRATA_DTYPE_F64, 1, 8, 1, 1, 4, 3);
    HostTensor o = poisoned(STRATA_DTYPE_F64, {1, 8, 1, 3});
    EXPECT_EQ(run_fwd(p, o, nullptr, 0.5f, false), STRATA_ERROR_NO_IMPLEMENTATION) << impl;
    EXPECT_NE(std::string(strata_get_last_error_message()).find("f64 tensors go to the reference"), std::string::npos)
        << strata_get_last_error_message();
  }
}

TEST(ChunkGatedDeltaRule, WorkspaceTooSmallIsAnError) {
  for (const std::string& impl : cpu_impls()) {
    if (impl == "reference") continue;
    ForceImpl f(impl.c_str());
    Problem p(STRATA_DTYPE_F32, 1, 8, 1, 1, 4, 3);
    HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 8, 1, 3});
    strata_plan plan = nullptr;
    ASSERT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&p.q.desc, &p.k.desc, &p.v.desc, &p.g.desc, &p.beta.desc,
                                                     nullptr, nullptr, &o.desc, nullptr, nullptr, 0.5f, 0, &plan),
              STRATA_SUCCESS);
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    EXPECT_GT(ws, 0u);
    std::vector<uint8_t> w(ws);
    void* t[] = {data(&p.q), data(&p.k), data(&p.v), data(&p.g), data(&p.beta), nullptr, nullptr, data(&o), nullptr,
                 nullptr};
    EXPECT_EQ(strata_plan_run(plan, t, 10, w.data(), ws - 1, nullptr), STRATA_ERROR_WORKSPACE_TOO_SMALL);
    strata_plan_destroy(plan);
    EXPECT_TRUE(all_poison(o));
  }
}

// ---------------------------------------------------------------------------------------------- gradients

// Loss = <o, do> + <final_state, dht> in float64 through the reference forward.
double loss(Problem& p, bool l2, float scale) {
  HostTensor o = HostTensor::make(STRATA_DTYPE_F64, {p.B, p.T, p.HV, p.V});
  HostTensor ht = HostTensor::make(STRATA_DTYPE_F64, {p.N, p.HV, p.K, p.V});
  ForceImpl f("reference");
  EXPECT_EQ(run_fwd(p, o, &ht, scale, l2), STRATA_SUCCESS) << strata_get_last_error_message();
  double L = 0;
  for (int64_t i = 0; i < o.numel(); ++i) L += o.get(i) * p.d_o.get(i);
  if (p.has_dht)
    for (int64_t i = 0; i < ht.numel(); ++i) L += ht.get(i) * p.dht.get(i);
  return L;
}

// Every gradient of the float64 reference backward against central differences of the float64 forward.
void check_fd(Problem& p, bool l2, float scale) {
  Grads gr(p);
  {
    ForceImpl f("reference");
    ASSERT_EQ(run_bwd(p, gr, scale, l2), STRATA_SUCCESS) << strata_get_last_error_message();
  }
  struct In {
    const char* name;
    HostTensor* x;
    HostTensor* dx;
  };
  std::vector<In> ins = {{"q", &p.q, &gr.dq}, {"k", &p.k, &gr.dk}, {"v", &p.v, &gr.dv},
                         {"g", &p.g, &gr.dg}, {"beta", &p.beta, &gr.dbeta}};
  if (p.has_h0) ins.push_back({"h0", &p.h0, &gr.dh0});
  std::mt19937_64 rng(99);
  for (const In& in : ins) {
    const int64_t n = in.x->numel();
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < std::min<int64_t>(n, 12); ++i) idx.push_back(n <= 12 ? i : static_cast<int64_t>(rng() % n));
    for (int64_t i : idx) {
      const double x0 = in.x->get(i), h = 1e-6 * std::max(1.0, std::abs(x0));
      in.x->set(i, x0 + h);
      const double lp = loss(p, l2, scale);
      in.x->set(i, x0 - h);
      const double lm = loss(p, l2, scale);
      in.x->set(i, x0);
      const double fd = (lp - lm) / (2 * h), an = in.dx->get(i);
      EXPECT_NEAR(an, fd, 1e-6 * std::max(1.0, std::abs(fd))) << in.name << "[" << i << "]";
    }
  }
}

TEST(ChunkGatedDeltaRule, ReferenceGradientsMatchFloat64FiniteDifferences) {
  {
    Problem p(STRATA_DTYPE_F64, 2, 70, 1, 2, 5, 3);  // two rows, a tail chunk, h0 and dht
    check_fd(p, false, 0.4f);
  }
  {
    Problem p(STRATA_DTYPE_F64, 1, 75, 2, 6, 4, 3, {0, 1, 1, 66, 75});  // GVA G = 3, varlen, l2norm
    check_fd(p, true, 0.5f);
  }
  {
    Problem p(STRATA_DTYPE_F64, 1, 9, 1, 1, 3, 2, {}, false, false);  // no h0, no dht
    check_fd(p, true, 1.0f);
  }
}

// ---------------------------------------------------------------------------------------------- determinism

TEST(ChunkGatedDeltaRule, BitwiseAcrossRunsThreadCountsAndIsas) {
  const int32_t before = strata_get_num_threads();
  // Problem 0: varlen, GVA G = 2 (8 tasks of two value heads). Problem 1: one q/k head with G = 3 value heads and
  // one sequence: a single grouped task with 1 thread, three one-value-head tasks with 2 threads (task_group in
  // cpu_chunked.cpp), so grouped and ungrouped chunk loops are compared bit for bit.
  for (int prob = 0; prob < 2; ++prob) {
    const int64_t T = prob == 0 ? 300 : 200, H = prob == 0 ? 2 : 1, HV = prob == 0 ? 4 : 3, K = 64, V = 32;
    const int64_t N = prob == 0 ? 4 : 1;
    const int32_t dt = prob == 0 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F32;
    for (const std::string& impl : cpu_impls()) {
      if (impl == "reference") continue;
      ForceImpl f(impl.c_str());
      std::vector<uint8_t> first_fwd, first_bwd;
      for (int threads : {1, 2, 2, 1}) {
        ASSERT_EQ(strata_set_num_threads(threads), STRATA_SUCCESS);
        Problem p = prob == 0 ? Problem(dt, 1, T, H, HV, K, V, {0, 100, 101, 230, 300}, true, true, 3)
                              : Problem(dt, 1, T, H, HV, K, V, {}, true, true, 5);
        HostTensor o = poisoned(dt, {1, T, HV, V}), ht = poisoned(STRATA_DTYPE_F32, {N, HV, K, V});
        ASSERT_EQ(run_fwd(p, o, &ht, 0.125f, true), STRATA_SUCCESS);
        Grads gr(p);
        ASSERT_EQ(run_bwd(p, gr, 0.125f, true), STRATA_SUCCESS);
        std::vector<uint8_t> fw = o.storage, bw = gr.dq.storage;
        fw.insert(fw.end(), ht.storage.begin(), ht.storage.end());
        for (HostTensor* t : {&gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.dh0})
          bw.insert(bw.end(), t->storage.begin(), t->storage.end());
        if (first_fwd.empty()) {
          first_fwd = fw;
          first_bwd = bw;
        } else {
          EXPECT_EQ(fw, first_fwd) << impl << " forward, problem " << prob << ", " << threads << " threads";
          EXPECT_EQ(bw, first_bwd) << impl << " backward, problem " << prob << ", " << threads << " threads";
        }
      }
    }
  }
  strata_set_num_threads(before);
}

// ---------------------------------------------------------------------------------------------- semantics

TEST(ChunkGatedDeltaRule, PackedEqualsSeparateOnEveryCpuImpl) {
  const std::vector<int64_t> cu = {0, 70, 70, 71, 200};
  for (const std::string& impl : cpu_impls()) {
    ForceImpl f(impl.c_str());
    Problem packed(STRATA_DTYPE_F32, 1, 200, 1, 2, 16, 8, cu);
    HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 200, 2, 8}), ht = poisoned(STRATA_DTYPE_F32, {4, 2, 16, 8});
    ASSERT_EQ(run_fwd(packed, o, &ht, 0.3f, true), STRATA_SUCCESS);
    Grads gp(packed);
    ASSERT_EQ(run_bwd(packed, gp, 0.3f, true), STRATA_SUCCESS);
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      const int64_t L = cu[n + 1] - cu[n];
      Problem one(STRATA_DTYPE_F32, 1, L, 1, 2, 16, 8);
      auto copy_tok = [&](HostTensor& dst, const HostTensor& src, int64_t per_tok) {
        for (int64_t i = 0; i < L * per_tok; ++i) dst.set(i, src.get(cu[n] * per_tok + i));
      };
      auto copy_state = [&](HostTensor& dst, const HostTensor& src) {
        const int64_t per = dst.numel();
        for (int64_t i = 0; i < per; ++i) dst.set(i, src.get(static_cast<int64_t>(n) * per + i));
      };
      copy_tok(one.q, packed.q, 16);
      copy_tok(one.k, packed.k, 16);
      copy_tok(one.v, packed.v, 16);
      copy_tok(one.g, packed.g, 2);
      copy_tok(one.beta, packed.beta, 2);
      copy_tok(one.d_o, packed.d_o, 16);
      copy_state(one.h0, packed.h0);
      copy_state(one.dht, packed.dht);
      HostTensor o1 = poisoned(STRATA_DTYPE_F32, {1, L, 2, 8}), ht1 = poisoned(STRATA_DTYPE_F32, {1, 2, 16, 8});
      ASSERT_EQ(run_fwd(one, o1, &ht1, 0.3f, true), STRATA_SUCCESS);
      Grads g1(one);
      ASSERT_EQ(run_bwd(one, g1, 0.3f, true), STRATA_SUCCESS);
      for (int64_t i = 0; i < L * 16; ++i) ASSERT_EQ(o1.get(i), o.get(cu[n] * 16 + i)) << impl << " o seq " << n;
      for (int64_t i = 0; i < ht1.numel(); ++i)
        ASSERT_EQ(ht1.get(i), ht.get(static_cast<int64_t>(n) * ht1.numel() + i)) << impl << " ht seq " << n;
      for (int64_t i = 0; i < L * 16; ++i) {
        ASSERT_EQ(g1.dq.get(i), gp.dq.get(cu[n] * 16 + i)) << impl << " dq seq " << n;
        ASSERT_EQ(g1.dk.get(i), gp.dk.get(cu[n] * 16 + i)) << impl << " dk seq " << n;
        ASSERT_EQ(g1.dv.get(i), gp.dv.get(cu[n] * 16 + i)) << impl << " dv seq " << n;
      }
      for (int64_t i = 0; i < L * 2; ++i) {
        ASSERT_EQ(g1.dg.get(i), gp.dg.get(cu[n] * 2 + i)) << impl << " dg seq " << n;
        ASSERT_EQ(g1.dbeta.get(i), gp.dbeta.get(cu[n] * 2 + i)) << impl << " dbeta seq " << n;
      }
      for (int64_t i = 0; i < g1.dh0.numel(); ++i)
        ASSERT_EQ(g1.dh0.get(i), gp.dh0.get(static_cast<int64_t>(n) * g1.dh0.numel() + i)) << impl << " dh0 " << n;
    }
  }
}

TEST(ChunkGatedDeltaRule, ZeroLengthSequencesPassStatesThrough) {
  for (const std::string& impl : cpu_impls()) {
    ForceImpl f(impl.c_str());
    Problem p(STRATA_DTYPE_F32, 1, 5, 1, 1, 4, 3, {0, 0, 5, 5});
    HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 5, 1, 3}), ht = poisoned(STRATA_DTYPE_F32, {3, 1, 4, 3});
    ASSERT_EQ(run_fwd(p, o, &ht, 0.5f, false), STRATA_SUCCESS);
    Grads gr(p);
    ASSERT_EQ(run_bwd(p, gr, 0.5f, false), STRATA_SUCCESS);
    for (int64_t i = 0; i < 12; ++i) {
      EXPECT_EQ(ht.get(i), p.h0.get(i)) << impl;            // sequence 0 is empty: final = initial
      EXPECT_EQ(ht.get(24 + i), p.h0.get(24 + i)) << impl;  // sequence 2 too
      EXPECT_EQ(gr.dh0.get(i), p.dht.get(i)) << impl;       // and dh0 = dht
      EXPECT_EQ(gr.dh0.get(24 + i), p.dht.get(24 + i)) << impl;
    }
  }
}

TEST(ChunkGatedDeltaRule, CppWrappers) {
  std::mt19937_64 rng(4);
  auto t = [&](int32_t dt, std::vector<int64_t> shape, double mean = 0, double sd = 1) {
    HostTensor h = randn(dt, shape, rng, mean, sd);
    Tensor x = Tensor::empty(dt, shape);
    std::memcpy(x.data(), h.storage.data(), h.storage.size());
    return x;
  };
  Tensor q = t(STRATA_DTYPE_F32, {1, 20, 1, 8}), k = t(STRATA_DTYPE_F32, {1, 20, 1, 8}),
         v = t(STRATA_DTYPE_F32, {1, 20, 2, 4}), g = t(STRATA_DTYPE_F32, {1, 20, 2}, -0.5, 0.1),
         beta = t(STRATA_DTYPE_F32, {1, 20, 2}, 0.5, 0.1), d_o = t(STRATA_DTYPE_F32, {1, 20, 2, 4});
  GdnOutputs out = chunk_gated_delta_rule(q, k, v, g, beta, 0.f, nullptr, true, nullptr, true);
  ASSERT_TRUE(out.final_state.has_value());
  EXPECT_EQ(out.o.shape(), (std::vector<int64_t>{1, 20, 2, 4}));
  EXPECT_EQ(out.final_state->shape(), (std::vector<int64_t>{1, 2, 8, 4}));
  GdnGrads gr = chunk_gated_delta_rule_bwd(q, k, v, g, beta, d_o, nullptr, 0.f, nullptr, nullptr, true);
  EXPECT_EQ(gr.dq.shape(), q.shape());
  EXPECT_FALSE(gr.dh0.has_value());
  const float* dq = static_cast<const float*>(gr.dq.data());
  for (int64_t i = 0; i < gr.dq.numel(); ++i) EXPECT_TRUE(std::isfinite(dq[i]));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Many short documents (N * HV > 65535, the CUDA grid-limit case of ops_gdn_kda.md §6.4): lengths 0..3 with
// empty ones, the best CPU implementation against the reference, forward and backward.
TEST(ChunkGatedDeltaRule, ManyShortDocuments) {
  std::vector<int64_t> cu = {0};
  for (int64_t n = 0; n < 16500; ++n) cu.push_back(cu.back() + (n * 7 + 3) % 4);
  const int64_t T = cu.back();
  Problem p(STRATA_DTYPE_F32, 1, T, 2, 4, 8, 8, cu, true, true, 5);
  ASSERT_GT(p.N * p.HV, 65535);
  auto rel = [](const HostTensor& a, const HostTensor& r) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      num += (a.get(i) - r.get(i)) * (a.get(i) - r.get(i));
      den += r.get(i) * r.get(i);
    }
    return std::sqrt(num / std::max(den, 1e-300));
  };
  HostTensor o_ref = poisoned(STRATA_DTYPE_F32, {1, T, 4, 8}), ht_ref = poisoned(STRATA_DTYPE_F32, {p.N, 4, 8, 8});
  Grads g_ref(p);
  {
    ForceImpl f("reference");
    ASSERT_EQ(run_fwd(p, o_ref, &ht_ref, 0.35f, true), STRATA_SUCCESS);
    ASSERT_EQ(run_bwd(p, g_ref, 0.35f, true), STRATA_SUCCESS);
  }
  {  // the best CPU implementation (the ISAs share all code but the GEMM micro-kernel, tested elsewhere)
    const std::string impl = cpu_impls().front();
    ASSERT_NE(impl, "reference");
    ForceImpl f(impl.c_str());
    HostTensor o = poisoned(STRATA_DTYPE_F32, {1, T, 4, 8}), ht = poisoned(STRATA_DTYPE_F32, {p.N, 4, 8, 8});
    ASSERT_EQ(run_fwd(p, o, &ht, 0.35f, true), STRATA_SUCCESS);
    Grads gr(p);
    ASSERT_EQ(run_bwd(p, gr, 0.35f, true), STRATA_SUCCESS);
    EXPECT_LT(rel(o, o_ref), 1e-5) << impl;
    EXPECT_LT(rel(ht, ht_ref), 1e-5) << impl;
    EXPECT_LT(rel(gr.dq, g_ref.dq), 1e-5) << impl;
    EXPECT_LT(rel(gr.dk, g_ref.dk), 1e-5) << impl;
    EXPECT_LT(rel(gr.dv, g_ref.dv), 1e-5) << impl;
    EXPECT_LT(rel(gr.dbeta, g_ref.dbeta), 1e-5) << impl;
    EXPECT_LT(rel(gr.dh0, g_ref.dh0), 1e-5) << impl;
    EXPECT_LT(rel(gr.dg, g_ref.dg), 1e-4) << impl;  // cancellation (see the harness's dg magnitude)
  }
}

}  // namespace
}  // namespace strata

// ---------------------------------------------------------------------------------------------- CUDA
// The cuda.sm90.chunked implementation (skipped without a GPU): bitwise determinism, the device-side cu_seqlens
// check (status, message, nothing written), packed-vs-separate equality, and the float64 reference on a GVA /
// K = 100 / varlen problem and on many short documents (N * HV > 65535). Value sweeps are in the conformance
// suite, which runs every case on the GPU too.
namespace strata {
namespace {

using atk::DeviceTensor;
const strata_device kCuda = {STRATA_DEVICE_CUDA, 0};

bool cuda_present() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS && n > 0;
}

// The last error message of a CUDA run (kept before the downloads and the free run).
std::string g_cuda_msg;

using DevPtr = std::unique_ptr<DeviceTensor>;
DevPtr up(const HostTensor* t) { return t ? std::make_unique<DeviceTensor>(*t, kCuda) : nullptr; }
const strata_tensor_desc* dd(const DevPtr& t) { return t ? &t->desc() : nullptr; }
void* dp(const DevPtr& t) { return t ? t->data() : nullptr; }

// Runs a plan with a device workspace; the outputs are downloaded by the caller (after the run, before the free).
strata_status run_plan_cuda(strata_plan plan, void** t, int32_t n, const std::function<void()>& download) {
  // cuda.sm90.fused runs the 16-bit forwards it covers, cuda.sm90.chunked the rest.
  EXPECT_EQ(std::string(strata_plan_impl_name(plan)).rfind("cuda.sm90.", 0), 0u) << strata_plan_impl_name(plan);
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  void* w = nullptr;
  if (ws) atk::check(strata_malloc(kCuda, ws, nullptr, &w), "workspace");
  const strata_status s = strata_plan_run(plan, t, n, w, ws, nullptr);
  g_cuda_msg = strata_get_last_error_message();  // before the copies and the free touch the runtime
  download();  // synchronous copies on the legacy stream the plan ran on
  if (w) strata_free(w);
  strata_plan_destroy(plan);
  return s;
}

strata_status run_fwd_cuda(Problem& p, HostTensor& o, HostTensor* ht, float scale, bool l2) {
  DevPtr q = up(&p.q), k = up(&p.k), v = up(&p.v), g = up(&p.g), be = up(&p.beta), h0 = up(p.h0_ptr()),
         cu = up(p.cu_ptr()), od = up(&o), hd = up(ht);
  strata_plan plan = nullptr;
  const strata_status s = strata_chunk_gated_delta_rule_fwd_plan(dd(q), dd(k), dd(v), dd(g), dd(be), dd(h0), dd(cu),
                                                                 dd(od), dd(hd), nullptr, scale, l2 ? 1 : 0, &plan);
  if (s != STRATA_SUCCESS) {
    g_cuda_msg = strata_get_last_error_message();
    return s;
  }
  void* t[] = {dp(q), dp(k), dp(v), dp(g), dp(be), dp(h0), dp(cu), dp(od), dp(hd), nullptr};
  return run_plan_cuda(plan, t, 10, [&] {
    od->download(o);
    if (ht) hd->download(*ht);
  });
}

strata_status run_bwd_cuda(Problem& p, Grads& gr, float scale, bool l2) {
  HostTensor* dh0h = p.has_h0 ? &gr.dh0 : nullptr;
  DevPtr q = up(&p.q), k = up(&p.k), v = up(&p.v), g = up(&p.g), be = up(&p.beta), h0 = up(p.h0_ptr()),
         cu = up(p.cu_ptr()), dO = up(&p.d_o), dht = up(p.dht_ptr()), dq = up(&gr.dq), dk = up(&gr.dk),
         dv = up(&gr.dv), dg = up(&gr.dg), db = up(&gr.dbeta), dh0 = up(dh0h);
  strata_plan plan = nullptr;
  const strata_status s = strata_chunk_gated_delta_rule_bwd_plan(
      dd(q), dd(k), dd(v), dd(g), dd(be), dd(h0), dd(cu), dd(dO), dd(dht), dd(dq), dd(dk), dd(dv), dd(dg), dd(db),
      dd(dh0), nullptr, scale, l2 ? 1 : 0, &plan);
  if (s != STRATA_SUCCESS) {
    g_cuda_msg = strata_get_last_error_message();
    return s;
  }
  void* t[] = {dp(q),  dp(k),  dp(v),  dp(g),  dp(be), dp(h0), dp(cu), dp(dO),
               dp(dht), dp(dq), dp(dk), dp(dv), dp(dg), dp(db), dp(dh0), nullptr};
  return run_plan_cuda(plan, t, 16, [&] {
    dq->download(gr.dq);
    dk->download(gr.dk);
    dv->download(gr.dv);
    dg->download(gr.dg);
    db->download(gr.dbeta);
    if (dh0h) dh0->download(gr.dh0);
  });
}

double rel_err(const HostTensor& a, const HostTensor& r) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < r.numel(); ++i) {
    num += (a.get(i) - r.get(i)) * (a.get(i) - r.get(i));
    den += r.get(i) * r.get(i);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// CUDA forward and backward against the float64 reference on the same problem.
void expect_cuda_matches_reference(Problem& p, float scale, bool l2, double tol) {
  const int64_t NT = p.B * p.T;
  HostTensor o_ref = poisoned(p.dt, {p.B, p.T, p.HV, p.V}), ht_ref = poisoned(p.sdt(), {p.N, p.HV, p.K, p.V});
  Grads g_ref(p);
  {
    ForceImpl f("reference");
    ASSERT_EQ(run_fwd(p, o_ref, &ht_ref, scale, l2), STRATA_SUCCESS);
    ASSERT_EQ(run_bwd(p, g_ref, scale, l2), STRATA_SUCCESS);
  }
  HostTensor o = poisoned(p.dt, {p.B, p.T, p.HV, p.V}), ht = poisoned(p.sdt(), {p.N, p.HV, p.K, p.V});
  ASSERT_EQ(run_fwd_cuda(p, o, &ht, scale, l2), STRATA_SUCCESS) << g_cuda_msg;
  Grads gr(p);
  ASSERT_EQ(run_bwd_cuda(p, gr, scale, l2), STRATA_SUCCESS) << g_cuda_msg;
  EXPECT_LT(rel_err(o, o_ref), tol) << NT;
  EXPECT_LT(rel_err(ht, ht_ref), tol);
  EXPECT_LT(rel_err(gr.dq, g_ref.dq), tol);
  EXPECT_LT(rel_err(gr.dk, g_ref.dk), tol);
  EXPECT_LT(rel_err(gr.dv, g_ref.dv), tol);
  EXPECT_LT(rel_err(gr.dbeta, g_ref.dbeta), tol);
  if (p.has_h0) EXPECT_LT(rel_err(gr.dh0, g_ref.dh0), tol);
  EXPECT_LT(rel_err(gr.dg, g_ref.dg), 10 * tol);  // cancellation (see the harness's dg magnitude)
}

TEST(ChunkGatedDeltaRuleCuda, MatchesReferenceGvaVarlenL2norm) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  Problem p(STRATA_DTYPE_F32, 1, 300, 2, 6, 100, 48, {0, 0, 1, 64, 64, 129, 200, 300}, true, true, 4);
  expect_cuda_matches_reference(p, 0.1f, true, 1e-4);
  // Without the in-kernel l2norm (dq written straight by chunk_bwd_dqkwg): unit keys and queries, as a model
  // passes them (unnormalised keys make the recurrence expansive).
  Problem fixed(STRATA_DTYPE_F32, 2, 130, 1, 4, 64, 64, {}, false, false, 6);
  for (HostTensor* x : {&fixed.q, &fixed.k})
    for (int64_t r = 0; r < x->numel() / 64; ++r) {
      double ss = 0;
      for (int64_t d = 0; d < 64; ++d) ss += x->get(r * 64 + d) * x->get(r * 64 + d);
      for (int64_t d = 0; d < 64; ++d) x->set(r * 64 + d, x->get(r * 64 + d) / std::sqrt(ss));
    }
  expect_cuda_matches_reference(fixed, 0.125f, false, 1e-4);
}

TEST(ChunkGatedDeltaRuleCuda, ManyShortDocuments) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  std::vector<int64_t> cu = {0};
  for (int64_t n = 0; n < 16500; ++n) cu.push_back(cu.back() + (n * 7 + 3) % 4);
  Problem p(STRATA_DTYPE_F32, 1, cu.back(), 2, 4, 8, 8, cu, true, true, 5);
  ASSERT_GT(p.N * p.HV, 65535);
  expect_cuda_matches_reference(p, 0.35f, true, 1e-4);
}

// The fused forward (cuda.sm90.fused: o inside the state pass, h never materialised) against the composed one
// (cuda.sm90.chunked) and the float64 reference, in bf16 and f16: GVA, fixed length with a partial last chunk,
// varlen with empty, one-token and multi-chunk documents, K = 100 / 128, V = 48 / 200 (column blocks and tails),
// with and without h0 / ht.
TEST(ChunkGatedDeltaRuleCuda, FusedForwardMatchesComposed) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  // The pass takes 32 columns of S per block when N * HV * V / 32 blocks fit in one wave (132 SMs), else 64, else
  // (bf16) 128: the last two cases have 40 and 640 sequence-heads, so every width runs.
  std::vector<int64_t> many = {0};
  for (int64_t n = 0; n < 160; ++n) many.push_back(many.back() + (n * 37 + 5) % 150 + 1);
  const struct {
    int64_t B, T, H, HV, K, V;
    std::vector<int64_t> cu;
    bool h0, ht;
  } cases[] = {{2, 200, 2, 4, 128, 48, {}, true, true},
               {1, 300, 1, 2, 100, 200, {0, 0, 1, 64, 129, 300}, true, false},
               {1, 130, 2, 2, 64, 64, {0, 70, 130}, false, true},
               {10, 100, 2, 4, 128, 128, {}, true, true},
               {1, many.back(), 2, 4, 128, 128, many, true, true}};
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F16}) {
    const double tol = dt == STRATA_DTYPE_BF16 ? 2e-2 : 4e-3;
    for (const auto& c : cases) {
      Problem p(dt, c.B, c.T, c.H, c.HV, c.K, c.V, c.cu, c.h0, true, 7);
      HostTensor o_ref = poisoned(dt, {p.B, p.T, p.HV, p.V}), ht_ref = poisoned(p.sdt(), {p.N, p.HV, p.K, p.V});
      {
        ForceImpl f("reference");
        ASSERT_EQ(run_fwd(p, o_ref, c.ht ? &ht_ref : nullptr, 0.2f, true), STRATA_SUCCESS);
      }
      // The fused forward's forced forms as well (cuda.sm90.fused picks one by shape): the gated Q Kᵀ inline or
      // pre-computed, 16-warp pass blocks: same bits as each other. (fused_prep: bf16 only since session 10, not
      // the same bits: WgmmaFusedForwardMatchesReference and the conformance suite.)
      constexpr int kImpls = 5;
      HostTensor o[kImpls], ht[kImpls];
      for (int i = 0; i < kImpls; ++i)
        o[i] = poisoned(dt, {p.B, p.T, p.HV, p.V}), ht[i] = poisoned(p.sdt(), {p.N, p.HV, p.K, p.V});
      const char* impls[kImpls] = {"cuda.sm90.fused", "cuda.sm90.chunked", "cuda.sm90.fused_inline",
                                   "cuda.sm90.fused_pqk", "cuda.sm90.fused_w16"};
      for (int i = 0; i < kImpls; ++i) {
        ForceImpl f(impls[i]);
        ASSERT_EQ(run_fwd_cuda(p, o[i], c.ht ? &ht[i] : nullptr, 0.2f, true), STRATA_SUCCESS)
            << impls[i] << ": " << g_cuda_msg;
        EXPECT_LT(rel_err(o[i], o_ref), tol) << impls[i] << " " << dtype_name(dt) << " K " << c.K;
        if (c.ht) EXPECT_LT(rel_err(ht[i], ht_ref), tol) << impls[i] << " " << dtype_name(dt) << " K " << c.K;
      }
      EXPECT_LT(rel_err(o[0], o[1]), tol) << dtype_name(dt) << " K " << c.K;
      for (int i = 3; i < kImpls; ++i) {
        EXPECT_TRUE(o[2].storage == o[i].storage) << "fused_inline vs " << impls[i] << " " << dtype_name(dt) << " K "
                                                  << c.K;
        if (c.ht) EXPECT_TRUE(ht[2].storage == ht[i].storage) << "fused_inline vs " << impls[i] << " ht " << dtype_name(dt);
      }
    }
  }
}

// The fused forward with the pass on Hopper warpgroup MMA (fused_wgmma_split, the warp-specialised pass of session 9;
// bf16, K = 128, V a multiple of 32) against the float64 reference and the mma.sync pass (cuda.sm90.fused_inline):
// 8, 10, 40 and 644 sequence-heads, so that every block width runs (32 / 64 / 128 columns on 132 SMs); varlen with
// empty, one-token and partial chunks; with and without h0 / ht; V = 64 and 128. Twice each: the same bits.
// Session 13: also cuda.sm90.fused_norm (the l2norm of the raw, unnormalised q, k folded into prep_wgmma and the
// wgmma pass: gdn::GdnFwdParams::qk_norm) on the same problems, against the reference and the unfolded pass.
// Session 14: also cuda.sm90.fused_norm_r (1 / |q| from an rstd-only launch, read by the pass) likewise, and the
// automatic cuda.sm90.fused, which since session 14 takes fused_norm where the pass runs 128 columns and fused_norm_r
// where it runs 32 (the unfolded split pass at 64): its o, ht must be that form's bits.
// Session 16: also cuda.sm90.fused_norm_cl (the pass's CTAs of a q/k head in clusters sharing K, Q by multicast) where
// it applies (128 and 32 columns): fused_norm's bits at 128 columns, fused_norm_r's at 32.
TEST(ChunkGatedDeltaRuleCuda, WgmmaFusedForwardMatchesReference) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  std::vector<int64_t> many = {0};
  for (int64_t n = 0; n < 160; ++n) many.push_back(many.back() + (n * 37 + 5) % 150 + 1);
  const struct {
    int64_t B, T, H, HV, V;
    std::vector<int64_t> cu;
    bool h0, ht;
  } cases[] = {{2, 200, 2, 4, 128, {}, true, true},
               {1, 300, 1, 2, 64, {0, 0, 1, 64, 129, 300}, true, true},
               {1, 190, 2, 4, 128, {0, 63, 127, 190}, false, true},
               {10, 100, 2, 4, 128, {}, true, true},
               {1, many.back(), 2, 4, 128, many, true, false}};
  const double tol = 2e-2;
  strata_device_properties props{};
  ASSERT_EQ(strata_device_get_properties(kCuda, &props), STRATA_SUCCESS);
  for (const auto& c : cases) {
    Problem p(STRATA_DTYPE_BF16, c.B, c.T, c.H, c.HV, 128, c.V, c.cu, c.h0, true, 11);
    // The pass's width (gdn::fwd_cuda_state_o_wgmma_width): the narrowest of 32 / 64 / 128 dividing V whose
    // sequence-head blocks fit one wave, else the widest; the automatic form by it (gdn_cuda_fused_fwd_auto_form,
    // resolved once by the plan since session 15).
    int width = 0;
    for (const int w : {128, 64, 32})
      if (p.V % w == 0 && (width == 0 || p.N * p.HV * (p.V / w) <= props.multiprocessor_count)) width = w;
    HostTensor o_ref = poisoned(p.dt, {p.B, p.T, p.HV, p.V}), ht_ref = poisoned(p.sdt(), {p.N, p.HV, p.K, p.V});
    {
      ForceImpl f("reference");
      ASSERT_EQ(run_fwd(p, o_ref, c.ht ? &ht_ref : nullptr, 0.2f, true), STRATA_SUCCESS);
    }
    const char* impls[] = {"cuda.sm90.fused_inline", "cuda.sm90.fused_wgmma_split", "cuda.sm90.fused_norm",
                           "cuda.sm90.fused_norm_r", "cuda.sm90.fused", "cuda.sm90.fused_norm_cl"};
    constexpr int kN = 6, kAutoIdx = 4, kClusterIdx = 5;
    const bool cluster = width != 64;  // (no clustered form of the r_q-forming pass at 64 columns)
    HostTensor o[kN], ht[kN];
    for (int i = 0; i < kN; ++i) {
      if (i == kClusterIdx && !cluster) continue;
      o[i] = poisoned(p.dt, {p.B, p.T, p.HV, p.V}), ht[i] = poisoned(p.sdt(), {p.N, p.HV, p.K, p.V});
      ForceImpl f(impls[i]);
      ASSERT_EQ(run_fwd_cuda(p, o[i], c.ht ? &ht[i] : nullptr, 0.2f, true), STRATA_SUCCESS)
          << impls[i] << ": " << g_cuda_msg;
      EXPECT_LT(rel_err(o[i], o_ref), tol) << impls[i] << " N " << p.N << " V " << p.V;
      if (c.ht) EXPECT_LT(rel_err(ht[i], ht_ref), tol) << impls[i] << " ht, N " << p.N << " V " << p.V;
      // Same bits on a second run.
      HostTensor o2 = poisoned(p.dt, {p.B, p.T, p.HV, p.V}), ht2 = poisoned(p.sdt(), {p.N, p.HV, p.K, p.V});
      ASSERT_EQ(run_fwd_cuda(p, o2, c.ht ? &ht2 : nullptr, 0.2f, true), STRATA_SUCCESS) << impls[i];
      EXPECT_TRUE(o2.storage == o[i].storage) << impls[i] << " second run";
      if (c.ht) EXPECT_TRUE(ht2.storage == ht[i].storage) << impls[i] << " ht second run";
    }
    // The wgmma pass differs from the mma.sync pass only by summation order inside the products; the folded l2norm
    // by qn, kn kept in f32 (not rounded to bf16 before the products).
    EXPECT_LT(rel_err(o[1], o[0]), 1e-2) << "wgmma split vs mma.sync, N " << p.N;
    EXPECT_LT(rel_err(o[2], o[1]), 1e-2) << "folded l2norm vs wgmma split, N " << p.N;
    if (c.ht) EXPECT_LT(rel_err(ht[2], ht[1]), 1e-2) << "folded l2norm vs wgmma split ht, N " << p.N;
    EXPECT_LT(rel_err(o[3], o[1]), 1e-2) << "fused_norm_r vs wgmma split, N " << p.N;
    if (c.ht) EXPECT_LT(rel_err(ht[3], ht[1]), 1e-2) << "fused_norm_r vs wgmma split ht, N " << p.N;
    // r_q from the launch's rstd or formed in the pass: the same formula, another f32 summation order.
    EXPECT_LT(rel_err(o[3], o[2]), 1e-3) << "fused_norm_r vs fused_norm, N " << p.N;
    const int auto_is = width == 128 ? 2 : width == 32 ? 3 : 1;
    EXPECT_TRUE(o[kAutoIdx].storage == o[auto_is].storage) << "automatic vs " << impls[auto_is] << ", N " << p.N;
    if (c.ht) EXPECT_TRUE(ht[kAutoIdx].storage == ht[auto_is].storage) << "automatic vs " << impls[auto_is] << " ht";
    if (cluster) {
      const int plain = width == 32 ? 3 : 2;
      EXPECT_TRUE(o[kClusterIdx].storage == o[plain].storage) << "clustered vs " << impls[plain] << ", N " << p.N;
      if (c.ht) EXPECT_TRUE(ht[kClusterIdx].storage == ht[plain].storage) << "clustered vs " << impls[plain] << " ht";
      std::printf("[gdn_fwd s16] N=%lld V=%lld (%d columns): fused_norm_cl against %s: o %s, relative RMS against "
                  "f64 %.2e\n", static_cast<long long>(p.N), static_cast<long long>(p.V), width, impls[plain],
                  o[kClusterIdx].storage == o[plain].storage ? "same bits" : "DIFFERENT BITS",
                  rel_err(o[kClusterIdx], o_ref));
    }
    std::printf("[gdn_fwd norm check] N=%lld V=%lld (%d columns, automatic = %s): relative RMS against f64: o split "
                "%.2e norm-folded %.2e rq-launch %.2e; against split: norm-folded o %.2e, rq-launch %.2e; rq-launch "
                "against norm-folded %.2e\n", static_cast<long long>(p.N), static_cast<long long>(p.V), width,
                impls[auto_is], rel_err(o[1], o_ref), rel_err(o[2], o_ref), rel_err(o[3], o_ref),
                rel_err(o[2], o[1]), rel_err(o[3], o[1]), rel_err(o[3], o[2]));
  }
}

TEST(ChunkGatedDeltaRuleCuda, BitwiseAcrossRuns) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  std::vector<uint8_t> first_fwd, first_bwd;
  for (int run = 0; run < 3; ++run) {
    Problem p(STRATA_DTYPE_BF16, 1, 300, 2, 4, 64, 32, {0, 100, 101, 230, 300}, true, true, 3);
    HostTensor o = poisoned(STRATA_DTYPE_BF16, {1, 300, 4, 32}), ht = poisoned(STRATA_DTYPE_F32, {4, 4, 64, 32});
    ASSERT_EQ(run_fwd_cuda(p, o, &ht, 0.125f, true), STRATA_SUCCESS) << g_cuda_msg;
    Grads gr(p);
    ASSERT_EQ(run_bwd_cuda(p, gr, 0.125f, true), STRATA_SUCCESS) << g_cuda_msg;
    std::vector<uint8_t> fw = o.storage, bw = gr.dq.storage;
    fw.insert(fw.end(), ht.storage.begin(), ht.storage.end());
    for (HostTensor* t : {&gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.dh0})
      bw.insert(bw.end(), t->storage.begin(), t->storage.end());
    if (run == 0) {
      first_fwd = fw;
      first_bwd = bw;
    } else {
      EXPECT_EQ(fw, first_fwd) << "forward, run " << run;
      EXPECT_EQ(bw, first_bwd) << "backward, run " << run;
    }
  }
}

TEST(ChunkGatedDeltaRuleCuda, BadCuSeqlensIsAnErrorAndWritesNothing) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  const struct {
    std::vector<int64_t> cu;
    const char* needle;
  } bad[] = {{{1, 3, 8}, "cu_seqlens[0] must be 0, got 1"},
             {{0, 9, 8}, "non-decreasing, got cu_seqlens[2] = 8 after cu_seqlens[1] = 9"},
             {{0, 3, 7}, "cu_seqlens[2] must equal T = 8"}};
  for (const auto& b : bad) {
    Problem p(STRATA_DTYPE_F32, 1, 8, 2, 4, 4, 3, b.cu);
    HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 8, 4, 3}), ht = poisoned(STRATA_DTYPE_F32, {2, 4, 4, 3});
    EXPECT_EQ(run_fwd_cuda(p, o, &ht, 0.5f, true), STRATA_ERROR_INVALID_VALUE) << b.needle;
    std::string msg = g_cuda_msg;
    EXPECT_NE(msg.find(b.needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("chunk_gated_delta_rule_fwd"), std::string::npos) << msg;
    EXPECT_TRUE(all_poison(o) && all_poison(ht)) << b.needle;
    Grads gr(p);
    EXPECT_EQ(run_bwd_cuda(p, gr, 0.5f, true), STRATA_ERROR_INVALID_VALUE) << b.needle;
    msg = g_cuda_msg;
    EXPECT_NE(msg.find(b.needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("chunk_gated_delta_rule_bwd"), std::string::npos) << msg;
    EXPECT_TRUE(gr.untouched()) << b.needle;
  }
}

TEST(ChunkGatedDeltaRuleCuda, PackedEqualsSeparate) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> cu = {0, 70, 70, 71, 200};
  Problem packed(STRATA_DTYPE_F32, 1, 200, 1, 2, 16, 8, cu);
  HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 200, 2, 8}), ht = poisoned(STRATA_DTYPE_F32, {4, 2, 16, 8});
  ASSERT_EQ(run_fwd_cuda(packed, o, &ht, 0.3f, true), STRATA_SUCCESS) << g_cuda_msg;
  Grads gp(packed);
  ASSERT_EQ(run_bwd_cuda(packed, gp, 0.3f, true), STRATA_SUCCESS) << g_cuda_msg;
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    const int64_t L = cu[n + 1] - cu[n];
    Problem one(STRATA_DTYPE_F32, 1, L, 1, 2, 16, 8);
    auto copy_tok = [&](HostTensor& dst, const HostTensor& src, int64_t per_tok) {
      for (int64_t i = 0; i < L * per_tok; ++i) dst.set(i, src.get(cu[n] * per_tok + i));
    };
    auto copy_state = [&](HostTensor& dst, const HostTensor& src) {
      const int64_t per = dst.numel();
      for (int64_t i = 0; i < per; ++i) dst.set(i, src.get(static_cast<int64_t>(n) * per + i));
    };
    copy_tok(one.q, packed.q, 16);
    copy_tok(one.k, packed.k, 16);
    copy_tok(one.v, packed.v, 16);
    copy_tok(one.g, packed.g, 2);
    copy_tok(one.beta, packed.beta, 2);
    copy_tok(one.d_o, packed.d_o, 16);
    copy_state(one.h0, packed.h0);
    copy_state(one.dht, packed.dht);
    HostTensor o1 = poisoned(STRATA_DTYPE_F32, {1, L, 2, 8}), ht1 = poisoned(STRATA_DTYPE_F32, {1, 2, 16, 8});
    ASSERT_EQ(run_fwd_cuda(one, o1, &ht1, 0.3f, true), STRATA_SUCCESS) << g_cuda_msg;
    Grads g1(one);
    ASSERT_EQ(run_bwd_cuda(one, g1, 0.3f, true), STRATA_SUCCESS) << g_cuda_msg;
    for (int64_t i = 0; i < L * 16; ++i) ASSERT_EQ(o1.get(i), o.get(cu[n] * 16 + i)) << "o seq " << n;
    for (int64_t i = 0; i < ht1.numel(); ++i)
      ASSERT_EQ(ht1.get(i), ht.get(static_cast<int64_t>(n) * ht1.numel() + i)) << "ht seq " << n;
    for (int64_t i = 0; i < L * 16; ++i) {
      ASSERT_EQ(g1.dq.get(i), gp.dq.get(cu[n] * 16 + i)) << "dq seq " << n;
      ASSERT_EQ(g1.dk.get(i), gp.dk.get(cu[n] * 16 + i)) << "dk seq " << n;
      ASSERT_EQ(g1.dv.get(i), gp.dv.get(cu[n] * 16 + i)) << "dv seq " << n;
    }
    for (int64_t i = 0; i < L * 2; ++i) {
      ASSERT_EQ(g1.dg.get(i), gp.dg.get(cu[n] * 2 + i)) << "dg seq " << n;
      ASSERT_EQ(g1.dbeta.get(i), gp.dbeta.get(cu[n] * 2 + i)) << "dbeta seq " << n;
    }
    for (int64_t i = 0; i < g1.dh0.numel(); ++i)
      ASSERT_EQ(g1.dh0.get(i), gp.dh0.get(static_cast<int64_t>(n) * g1.dh0.numel() + i)) << "dh0 seq " << n;
  }
}

}  // namespace
}  // namespace strata

#if STRATA_WITH_CUDA
// Which sub-operator kernels the CUDA composition runs (host only: no GPU needed): with q, k, v, do and o of one
// 16-bit dtype every call takes the tensor-core (mma) kernels, with or without the fused l2norm; f32 tokens or
// mixed 16-bit dtypes take the FMA kernels.
namespace strata {
namespace {

linear_attn::GdnParams tc_params(int32_t dt, int32_t v_dt, bool l2) {
  linear_attn::GdnParams p;
  p.B = 1, p.T = 300, p.H = 2, p.HV = 4, p.K = 128, p.V = 128, p.N = 3;
  static int64_t cu[4] = {0, 100, 130, 300};  // present (never read by the report)
  p.cu_seqlens = cu;
  auto tok = [](int32_t d, int64_t heads, int64_t D, int64_t T) {
    linear_attn::GdnTensor t;
    t.data = reinterpret_cast<void*>(uintptr_t{4096});
    t.dtype = d;
    t.st[0] = T * heads * D, t.st[1] = heads * D, t.st[2] = D > 1 ? D : 1, t.st[3] = 1;
    return t;
  };
  p.q = p.k = p.dq = p.dk = tok(dt, p.H, p.K, p.T);
  p.v = p.o = p.do_ = p.dv = tok(v_dt, p.HV, p.V, p.T);
  p.beta = p.dbeta = tok(dt, p.HV, 1, p.T);
  p.g = p.dg = tok(STRATA_DTYPE_F32, p.HV, 1, p.T);
  p.h0 = p.ht = p.dht = p.dh0 = tok(STRATA_DTYPE_F32, p.HV, p.K * p.V, p.N);
  p.scale = 0.1f;
  p.l2norm = l2;
  return p;
}

TEST(ChunkGatedDeltaRuleCuda, SixteenBitTokensRunTheTensorCoreKernels) {
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F16})
    for (bool l2 : {false, true})
      for (bool bwd : {false, true})
        EXPECT_EQ(linear_attn::gdn_cuda_tensor_core_report(tc_params(dt, dt, l2), bwd), "")
            << dtype_name(dt) << " l2norm " << l2 << (bwd ? " backward" : " forward");
  // The fused forward takes 16-bit tokens with K <= 128.
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F16})
    for (bool l2 : {false, true}) EXPECT_EQ(linear_attn::gdn_cuda_fused_fwd_reject(tc_params(dt, dt, l2)), "");
  EXPECT_NE(linear_attn::gdn_cuda_fused_fwd_reject(tc_params(STRATA_DTYPE_F32, STRATA_DTYPE_F32, true)), "");
  EXPECT_NE(linear_attn::gdn_cuda_fused_fwd_reject(tc_params(STRATA_DTYPE_BF16, STRATA_DTYPE_F16, true)), "");
  linear_attn::GdnParams wide = tc_params(STRATA_DTYPE_BF16, STRATA_DTYPE_BF16, true);
  wide.K = 256;
  EXPECT_NE(linear_attn::gdn_cuda_fused_fwd_reject(wide).find("K <= 128"), std::string::npos);
  for (bool bwd : {false, true}) {
    EXPECT_NE(linear_attn::gdn_cuda_tensor_core_report(tc_params(STRATA_DTYPE_F32, STRATA_DTYPE_F32, true), bwd), "");
    EXPECT_NE(linear_attn::gdn_cuda_tensor_core_report(tc_params(STRATA_DTYPE_BF16, STRATA_DTYPE_F16, true), bwd),
              "");
  }
}

}  // namespace
}  // namespace strata
#endif
