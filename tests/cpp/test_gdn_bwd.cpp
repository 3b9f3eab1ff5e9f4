// The Gated DeltaNet backward chunk operators (chunk_bwd_dv_local, chunk_gated_delta_rule_bwd_dhu,
// chunk_bwd_dqkwg, prepare_wy_repr_bwd) beyond the conformance driver:
//  * their float64 references checked against finite differences of the forward math: a float64 token
//    recurrence (ops_gdn_kda.md §2.1) and a float64 chunked forward (w, u, A, h, v_new; Appendix A) written
//    here; the four ops composed as §3.2 says must give dq, dk, dv, dg, dβ, dh0 of the recurrence (fixed
//    length and packed, GVA G = 1, 2, 3, tail chunks, h0 and dht, chunk sizes 16/32, with and without gate);
//  * prepare_wy_repr_bwd and chunk_bwd_dv_local alone as gradients of their own forward maps;
//  * determinism: repeated runs and 1 vs 2 threads give the same bits for every CPU implementation;
//  * validation rules (status, message, outputs untouched);
//  * the C++ wrappers.
#include <gtest/gtest.h>

#include <ctime>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"
#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/fma_peak.h"
#include "testkit/testkit.h"
#include "test_support.h"

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, kCpu, poisoned, all_poison, ... (test_support.h)

using atk::HostTensor;
using Vec = std::vector<double>;

// ---------------------------------------------------------------------------------------------------------
// Problem: contiguous float64 arrays in fla's layouts.
struct Prob {
  int64_t B = 1, T = 0, H = 1, HV = 1, K = 4, V = 3;
  int BT = 16;
  std::vector<int64_t> cu;  // empty: fixed length
  bool gate = true, has_h0 = true, has_dht = true;
  double scale = 0.7;
  Vec q, k, v, g, beta, h0, dout, dht;  // g: raw per-token log gates
  int64_t G() const { return HV / H; }
  int64_t N() const { return cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1; }
  struct S {
    int64_t b, bos, eos;
  };
  std::vector<S> seqs() const {
    std::vector<S> s;
    if (cu.empty())
      for (int64_t b = 0; b < B; ++b) s.push_back({b, 0, T});
    else
      for (int64_t n = 0; n + 1 < static_cast<int64_t>(cu.size()); ++n) s.push_back({0, cu[n], cu[n + 1]});
    return s;
  }
  size_t iq(int64_t b, int64_t t, int64_t h, int64_t x) const { return ((b * T + t) * H + h) * K + x; }
  size_t iv(int64_t b, int64_t t, int64_t hv, int64_t e) const { return ((b * T + t) * HV + hv) * V + e; }
  size_t iw(int64_t b, int64_t t, int64_t hv, int64_t x) const { return ((b * T + t) * HV + hv) * K + x; }
  size_t ig(int64_t b, int64_t t, int64_t hv) const { return (b * T + t) * HV + hv; }
  size_t is(int64_t n, int64_t hv, int64_t x, int64_t e) const { return ((n * HV + hv) * K + x) * V + e; }
};

Prob make_prob(int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, int BT, std::vector<int64_t> cu,
               uint64_t seed) {
  Prob p;
  p.B = cu.empty() ? B : 1;
  p.T = cu.empty() ? T : cu.back();
  p.H = H, p.HV = HV, p.K = K, p.V = V, p.BT = BT, p.cu = std::move(cu);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0, 1);
  std::uniform_real_distribution<double> u01(0, 1);
  auto fill = [&](Vec& x, size_t n) {
    x.resize(n);
    for (double& e : x) e = n01(rng);
  };
  const size_t nq = p.B * p.T * H * K, nv = p.B * p.T * HV * V, ng = p.B * p.T * HV, ns = p.N() * HV * K * V;
  fill(p.q, nq), fill(p.k, nq), fill(p.v, nv), fill(p.dout, nv), fill(p.h0, ns), fill(p.dht, ns);
  for (size_t r = 0; r < nq / K; ++r) {  // unit keys and queries
    for (Vec* x : {&p.q, &p.k}) {
      double s = 0;
      for (int64_t i = 0; i < K; ++i) s += (*x)[r * K + i] * (*x)[r * K + i];
      for (int64_t i = 0; i < K; ++i) (*x)[r * K + i] /= std::sqrt(s);
    }
  }
  p.g.resize(ng), p.beta.resize(ng);
  for (size_t i = 0; i < ng; ++i) {
    p.g[i] = -std::log1p(std::exp(-u01(rng))) * 0.7;  // logsigmoid < 0
    p.beta[i] = 1 / (1 + std::exp(-n01(rng)));
  }
  return p;
}

// §2.1 token recurrence: loss = <o, do> + <ht, dht>.
double loss_recurrence(const Prob& p) {
  double loss = 0;
  int64_t n = 0;
  for (const auto& s : p.seqs()) {
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      const int64_t h = hv / p.G();
      Vec S(p.K * p.V, 0.0);
      if (p.has_h0)
        for (int64_t i = 0; i < p.K * p.V; ++i) S[i] = p.h0[p.is(n, hv, 0, 0) + i];
      for (int64_t t = s.bos; t < s.eos; ++t) {
        const double decay = p.gate ? std::exp(p.g[p.ig(s.b, t, hv)]) : 1.0;
        for (double& e : S) e *= decay;
        const double bt = p.beta[p.ig(s.b, t, hv)];
        for (int64_t e = 0; e < p.V; ++e) {
          double pred = 0;
          for (int64_t x = 0; x < p.K; ++x) pred += p.k[p.iq(s.b, t, h, x)] * S[x * p.V + e];
          const double delta = bt * (p.v[p.iv(s.b, t, hv, e)] - pred);
          for (int64_t x = 0; x < p.K; ++x) S[x * p.V + e] += p.k[p.iq(s.b, t, h, x)] * delta;
        }
        for (int64_t e = 0; e < p.V; ++e) {
          double o = 0;
          for (int64_t x = 0; x < p.K; ++x) o += p.q[p.iq(s.b, t, h, x)] * S[x * p.V + e];
          loss += p.scale * o * p.dout[p.iv(s.b, t, hv, e)];
        }
      }
      if (p.has_dht)
        for (int64_t i = 0; i < p.K * p.V; ++i) loss += S[i] * p.dht[p.is(n, hv, 0, 0) + i];
    }
    ++n;
  }
  return loss;
}

// Appendix A chunked forward in float64: γ, A = (I + M)^-1, w, u, h (chunk start states), v_new.
struct Fwd {
  Vec gam, A, w, u, h, vn;
  int64_t NT = 0;
};
Fwd chunk_forward(const Prob& p) {
  Fwd f;
  const int64_t T = p.T, BT = p.BT, K = p.K, V = p.V;
  f.gam.assign(p.B * T * p.HV, 0.0), f.A.assign(p.B * T * p.HV * BT, 0.0);
  f.w.assign(p.B * T * p.HV * K, 0.0), f.u.assign(p.B * T * p.HV * V, 0.0), f.vn = f.u;
  int64_t nt = 0;
  for (const auto& s : p.seqs()) nt += (s.eos - s.bos + BT - 1) / BT;
  f.NT = p.cu.empty() ? (T + BT - 1) / BT : nt;
  f.h.assign(p.B * f.NT * p.HV * K * V, 0.0);
  int64_t n = 0, hc0 = 0;
  for (const auto& s : p.seqs()) {
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      const int64_t h = hv / p.G();
      Vec S(K * V, 0.0);
      if (p.has_h0)
        for (int64_t i = 0; i < K * V; ++i) S[i] = p.h0[p.is(n, hv, 0, 0) + i];
      int64_t c = 0;
      for (int64_t t0 = s.bos; t0 < s.eos; t0 += BT, ++c) {
        const int64_t L = std::min(BT, s.eos - t0);
        Vec gm(L);
        double acc = 0;
        for (int64_t i = 0; i < L; ++i) {
          acc += p.gate ? p.g[p.ig(s.b, t0 + i, hv)] : 0.0;
          gm[i] = acc;
          f.gam[p.ig(s.b, t0 + i, hv)] = acc;
        }
        // M strictly lower, A = (I + M)^-1 by forward substitution.
        Vec M(L * L, 0.0), Ai(L * L, 0.0);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < i; ++j) {
            double kk = 0;
            for (int64_t x = 0; x < K; ++x) kk += p.k[p.iq(s.b, t0 + i, h, x)] * p.k[p.iq(s.b, t0 + j, h, x)];
            M[i * L + j] = p.beta[p.ig(s.b, t0 + i, hv)] * kk * std::exp(gm[i] - gm[j]);
          }
        for (int64_t i = 0; i < L; ++i) {
          Ai[i * L + i] = 1;
          for (int64_t j = 0; j < i; ++j) {
            double a = 0;
            for (int64_t m = j; m < i; ++m) a -= M[i * L + m] * Ai[m * L + j];
            Ai[i * L + j] = a;
          }
        }
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < L; ++j) f.A[p.ig(s.b, t0 + i, hv) * BT + j] = Ai[i * L + j];
        const int64_t hc = p.cu.empty() ? c : hc0 + c;
        for (int64_t i = 0; i < K * V; ++i) f.h[(((s.b * f.NT + hc) * p.HV + hv) * K * V) + i] = S[i];
        Vec vn(L * V);
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t x = 0; x < K; ++x) {
            double a = 0;
            for (int64_t j = 0; j < L; ++j)
              a += Ai[i * L + j] * p.beta[p.ig(s.b, t0 + j, hv)] * std::exp(gm[j]) * p.k[p.iq(s.b, t0 + j, h, x)];
            f.w[p.iw(s.b, t0 + i, hv, x)] = a;
          }
          for (int64_t e = 0; e < V; ++e) {
            double a = 0;
            for (int64_t j = 0; j < L; ++j) a += Ai[i * L + j] * p.beta[p.ig(s.b, t0 + j, hv)] * p.v[p.iv(s.b, t0 + j, hv, e)];
            f.u[p.iv(s.b, t0 + i, hv, e)] = a;
            double ws = 0;
            for (int64_t x = 0; x < K; ++x) ws += f.w[p.iw(s.b, t0 + i, hv, x)] * S[x * V + e];
            vn[i * V + e] = a - ws;
            f.vn[p.iv(s.b, t0 + i, hv, e)] = vn[i * V + e];
          }
        }
        const double gl = gm[L - 1];
        for (int64_t x = 0; x < K; ++x)
          for (int64_t e = 0; e < V; ++e) {
            double a = std::exp(gl) * S[x * V + e];
            for (int64_t i = 0; i < L; ++i) a += p.k[p.iq(s.b, t0 + i, h, x)] * std::exp(gl - gm[i]) * vn[i * V + e];
            S[x * V + e] = a;
          }
      }
    }
    hc0 += (s.eos - s.bos + BT - 1) / BT;
    ++n;
  }
  return f;
}

HostTensor tensor(const Vec& x, const std::vector<int64_t>& shape, int32_t dtype = STRATA_DTYPE_F64) {
  HostTensor t = HostTensor::make(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, x[i]);
  return t;
}
HostTensor zeros(const std::vector<int64_t>& shape, int32_t dtype = STRATA_DTYPE_F64) {
  HostTensor t = HostTensor::make(dtype, shape);
  t.poison();
  return t;
}
void* ptr(HostTensor* t) { return t ? t->storage.data() : nullptr; }

strata_status run(strata_plan plan, std::vector<HostTensor*> ts) {
  std::vector<void*> p;
  for (HostTensor* t : ts) p.push_back(ptr(t));
  const strata_status s = strata_plan_run(plan, p.data(), static_cast<int32_t>(p.size()), nullptr, 0, nullptr);
  strata_plan_destroy(plan);
  return s;
}

struct Grads {
  Vec dq, dk, dv, dg, dbeta, dh0;
};

// §3.2 composed from the four ops (float64 tensors: the references), then the reverse chunk-local cumsum.
Grads backward_by_ops(const Prob& p) {
  const Fwd f = chunk_forward(p);
  const int64_t B = p.B, T = p.T, H = p.H, HV = p.HV, K = p.K, V = p.V, N = p.N();
  HostTensor q = tensor(p.q, {B, T, H, K}), k = tensor(p.k, {B, T, H, K}), v = tensor(p.v, {B, T, HV, V});
  HostTensor dO = tensor(p.dout, {B, T, HV, V}), gam = tensor(f.gam, {B, T, HV}), beta = tensor(p.beta, {B, T, HV});
  HostTensor A = tensor(f.A, {B, T, HV, p.BT}), w = tensor(f.w, {B, T, HV, K}), vn = tensor(f.vn, {B, T, HV, V});
  HostTensor h = tensor(f.h, {B, f.NT, HV, K, V}), dht = tensor(p.dht, {N, HV, K, V});
  HostTensor cu = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(p.cu.size())});
  for (size_t i = 0; i < p.cu.size(); ++i) cu.set(static_cast<int64_t>(i), static_cast<double>(p.cu[i]));
  HostTensor* cup = p.cu.empty() ? nullptr : &cu;
  HostTensor* gp = p.gate ? &gam : nullptr;
  const float sc = static_cast<float>(p.scale);
  strata_plan plan = nullptr;
  // dv_local
  HostTensor dvl = zeros({B, T, HV, V});
  EXPECT_EQ(strata_chunk_bwd_dv_local_plan(&q.desc, &k.desc, &dO.desc, dsc(gp), dsc(cup), &dvl.desc, sc, p.BT, &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  EXPECT_EQ(run(plan, {&q, &k, &dO, gp, cup, &dvl}), STRATA_SUCCESS) << strata_get_last_error_message();
  // dhu
  HostTensor dh = zeros({B, f.NT, HV, K, V}), dh0 = zeros({N, HV, K, V}), dv2 = zeros({B, T, HV, V});
  HostTensor* dhtp = p.has_dht ? &dht : nullptr;
  HostTensor* dh0p = p.has_h0 ? &dh0 : nullptr;
  EXPECT_EQ(strata_chunk_gated_delta_rule_bwd_dhu_plan(&q.desc, &k.desc, &w.desc, &dO.desc, &dvl.desc, dsc(gp),
                                                       dsc(dhtp), dsc(cup), &dh.desc, dsc(dh0p), &dv2.desc, sc, p.BT,
                                                       &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  EXPECT_EQ(run(plan, {&q, &k, &w, &dO, &dvl, gp, dhtp, cup, &dh, dh0p, &dv2}), STRATA_SUCCESS)
      << strata_get_last_error_message();
  // dqkwg
  HostTensor dq = zeros({B, T, H, K}), dk = zeros({B, T, H, K}), dw = zeros({B, T, HV, K}), dg = zeros({B, T, HV});
  HostTensor* dgp = p.gate ? &dg : nullptr;
  EXPECT_EQ(strata_chunk_bwd_dqkwg_plan(&q.desc, &k.desc, &vn.desc, &dO.desc, &h.desc, &dh.desc, &dv2.desc, dsc(gp),
                                        dsc(cup), &dq.desc, &dk.desc, &dw.desc, dsc(dgp), sc, p.BT, &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  EXPECT_EQ(run(plan, {&q, &k, &vn, &dO, &h, &dh, &dv2, gp, cup, &dq, &dk, &dw, dgp}), STRATA_SUCCESS)
      << strata_get_last_error_message();
  // wy bwd
  HostTensor dk2 = zeros({B, T, H, K}), dv = zeros({B, T, HV, V}), db = zeros({B, T, HV}), dg2 = zeros({B, T, HV});
  HostTensor* dg2p = p.gate ? &dg2 : nullptr;
  EXPECT_EQ(strata_prepare_wy_repr_bwd_plan(&k.desc, &v.desc, &beta.desc, &A.desc, &dw.desc, &dv2.desc, dsc(gp),
                                            dsc(cup), &dk2.desc, &dv.desc, &db.desc, dsc(dg2p), &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  EXPECT_EQ(run(plan, {&k, &v, &beta, &A, &dw, &dv2, gp, cup, &dk2, &dv, &db, dg2p}), STRATA_SUCCESS)
      << strata_get_last_error_message();
  Grads r;
  r.dq = dq.values(), r.dk = dk.values(), r.dv = dv.values(), r.dbeta = db.values();
  for (size_t i = 0; i < r.dk.size(); ++i) r.dk[i] += dk2.get(static_cast<int64_t>(i));
  if (p.has_h0) r.dh0 = dh0.values();
  if (p.gate) {  // dg = reverse chunk-local cumsum of dγ
    Vec dgam = dg.values();
    for (size_t i = 0; i < dgam.size(); ++i) dgam[i] += dg2.get(static_cast<int64_t>(i));
    r.dg.assign(dgam.size(), 0.0);
    for (const auto& s : p.seqs())
      for (int64_t hv = 0; hv < HV; ++hv)
        for (int64_t t0 = s.bos; t0 < s.eos; t0 += p.BT) {
          double acc = 0;
          for (int64_t t = std::min<int64_t>(t0 + p.BT, s.eos) - 1; t >= t0; --t) {
            acc += dgam[p.ig(s.b, t, hv)];
            r.dg[p.ig(s.b, t, hv)] = acc;
          }
        }
  }
  return r;
}

Vec finite_diff(Prob p, Vec Prob::*field) {
  Vec& x = p.*field;
  Vec grad(x.size());
  const double eps = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss_recurrence(p);
    x[i] = x0 - eps;
    const double lm = loss_recurrence(p);
    x[i] = x0;
    grad[i] = (lp - lm) / (2 * eps);
  }
  return grad;
}

double rel_err(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num) / (std::sqrt(den) + 1e-300);
}

void check_against_fd(const Prob& p) {
  const Grads g = backward_by_ops(p);
  EXPECT_LT(rel_err(g.dq, finite_diff(p, &Prob::q)), 1e-7) << "dq";
  EXPECT_LT(rel_err(g.dk, finite_diff(p, &Prob::k)), 1e-7) << "dk";
  EXPECT_LT(rel_err(g.dv, finite_diff(p, &Prob::v)), 1e-7) << "dv";
  EXPECT_LT(rel_err(g.dbeta, finite_diff(p, &Prob::beta)), 1e-7) << "dbeta";
  if (p.gate) EXPECT_LT(rel_err(g.dg, finite_diff(p, &Prob::g)), 1e-7) << "dg";
  if (p.has_h0) EXPECT_LT(rel_err(g.dh0, finite_diff(p, &Prob::h0)), 1e-7) << "dh0";
}

TEST(GdnBwdReference, ComposedOpsMatchFiniteDifferencesFixedLength) {
  check_against_fd(make_prob(2, 37, 1, 2, 4, 3, 16, {}, 1));  // 3 chunks with a tail, G = 2
}

TEST(GdnBwdReference, ComposedOpsMatchFiniteDifferencesVarlenGva3) {
  check_against_fd(make_prob(1, 0, 1, 3, 5, 3, 16, {0, 5, 5, 21, 40, 41}, 2));  // zero-length, single token
}

TEST(GdnBwdReference, ComposedOpsMatchFiniteDifferencesChunk32NoStateGradients) {
  Prob p = make_prob(1, 70, 2, 2, 3, 4, 32, {}, 3);
  p.has_h0 = false, p.has_dht = false;
  check_against_fd(p);
}

TEST(GdnBwdReference, ComposedOpsMatchFiniteDifferencesWithoutGate) {
  Prob p = make_prob(1, 0, 2, 4, 3, 2, 16, {0, 20, 33}, 4);
  p.gate = false;
  check_against_fd(p);
}

// f64 tensors run on the reference only: a forced CPU kernel rejects them with a reason.
TEST(GdnBwdReference, ForcedKernelsRejectF64) {
  for (const std::string& impl : atk::impls_for("chunk_bwd_dv_local", kCpu)) {
    if (impl == "reference") continue;
    ForceImpl f(impl.c_str());
    HostTensor q = zeros({1, 5, 1, 4});
    strata_plan plan = nullptr;
    EXPECT_EQ(strata_chunk_bwd_dv_local_plan(&q.desc, &q.desc, &q.desc, nullptr, nullptr, &q.desc, 1.f, 16, &plan),
              STRATA_ERROR_NO_IMPLEMENTATION)
        << impl;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Determinism: every CPU implementation gives the same bits on repeated runs and with 1 or 2 threads.

HostTensor rnd(int32_t dt, const std::vector<int64_t>& shape, uint64_t seed, double sd = 1.0) {
  HostTensor t = HostTensor::make(dt, shape);
  std::mt19937_64 rng(seed);
  t.fill_normal(rng, 0.0, sd);
  return t;
}
HostTensor gates(const std::vector<int64_t>& shape, int BT, uint64_t seed) {  // chunk-local cumsums of g < 0
  HostTensor t = HostTensor::make(STRATA_DTYPE_F32, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t B = shape[0], T = shape[1], HV = shape[2];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hv = 0; hv < HV; ++hv) {
      double acc = 0;
      for (int64_t t0 = 0; t0 < T; ++t0) {
        if (t0 % BT == 0) acc = 0;
        acc -= 0.05 * u(rng);
        t.set((b * T + t0) * HV + hv, acc);
      }
    }
  return t;
}

using Runner = std::function<std::vector<uint8_t>()>;

// Runs a plan on `device` over host tensors (uploaded; outputs listed in `outs` downloaded back).
strata_status run_on(strata_plan plan, strata_device device, std::vector<HostTensor*> ts, std::vector<int> outs) {
  if (device.type == STRATA_DEVICE_CPU) return run(plan, ts);
  std::vector<std::unique_ptr<atk::DeviceTensor>> dev(ts.size());
  std::vector<void*> p(ts.size(), nullptr);
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i]) dev[i] = std::make_unique<atk::DeviceTensor>(*ts[i], device), p[i] = dev[i]->data();
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  void* w = nullptr;
  if (ws) EXPECT_EQ(strata_malloc(device, ws, nullptr, &w), STRATA_SUCCESS);
  const strata_status s = strata_plan_run(plan, p.data(), static_cast<int32_t>(p.size()), w, ws, nullptr);
  strata_device_synchronize(device);
  if (w) strata_free(w);
  strata_plan_destroy(plan);
  for (int i : outs) dev[i]->download(*ts[i]);
  return s;
}

// Runs each op once on a multi-chunk GVA problem (B = 2, T = 300, H = 2, HV = 6, K = 64, V = 48) and returns
// all output bytes.
std::vector<uint8_t> run_all_ops(strata_device device = kCpu) {
  const int64_t B = 2, T = 300, H = 2, HV = 6, K = 64, V = 48, BT = 64, NT = 5;
  const int32_t f = STRATA_DTYPE_BF16;
  HostTensor q = rnd(f, {B, T, H, K}, 1, 0.2), k = rnd(f, {B, T, H, K}, 2, 0.2), v = rnd(f, {B, T, HV, V}, 3);
  HostTensor w = rnd(f, {B, T, HV, K}, 4, 0.1), dO = rnd(f, {B, T, HV, V}, 5), g = gates({B, T, HV}, BT, 6);
  HostTensor h = rnd(f, {B, NT, HV, K, V}, 7), dht = rnd(STRATA_DTYPE_F32, {B, HV, K, V}, 8);
  HostTensor beta = rnd(f, {B, T, HV}, 9, 0.3), A = rnd(f, {B, T, HV, BT}, 10, 0.1);
  HostTensor dv = zeros({B, T, HV, V}, f), dh = zeros({B, NT, HV, K, V}, f), dh0 = zeros({B, HV, K, V}, STRATA_DTYPE_F32);
  HostTensor dv2 = zeros({B, T, HV, V}, f), dq = zeros({B, T, H, K}, f), dk = zeros({B, T, H, K}, f);
  HostTensor dw = zeros({B, T, HV, K}, f), dg = zeros({B, T, HV}, STRATA_DTYPE_F32), dk2 = zeros({B, T, H, K}, f);
  HostTensor dvw = zeros({B, T, HV, V}, f), db = zeros({B, T, HV}, f), dg2 = zeros({B, T, HV}, STRATA_DTYPE_F32);
  std::vector<HostTensor*> all = {&q, &k, &v, &w, &dO, &g, &h, &dht, &beta, &A, &dv, &dh, &dh0, &dv2, &dq, &dk, &dw, &dg, &dk2, &dvw, &db, &dg2};
  for (HostTensor* t : all) t->desc.device = device;
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_bwd_dv_local_plan(&q.desc, &k.desc, &dO.desc, &g.desc, nullptr, &dv.desc, 0.1f, 64, &plan),
            STRATA_SUCCESS);
  EXPECT_EQ(run_on(plan, device, {&q, &k, &dO, &g, nullptr, &dv}, {5}), STRATA_SUCCESS);
  EXPECT_EQ(strata_chunk_gated_delta_rule_bwd_dhu_plan(&q.desc, &k.desc, &w.desc, &dO.desc, &dv.desc, &g.desc,
                                                       &dht.desc, nullptr, &dh.desc, &dh0.desc, &dv2.desc, 0.1f, 64,
                                                       &plan),
            STRATA_SUCCESS);
  EXPECT_EQ(run_on(plan, device, {&q, &k, &w, &dO, &dv, &g, &dht, nullptr, &dh, &dh0, &dv2}, {8, 9, 10}), STRATA_SUCCESS);
  EXPECT_EQ(strata_chunk_bwd_dqkwg_plan(&q.desc, &k.desc, &v.desc, &dO.desc, &h.desc, &dh.desc, &dv2.desc, &g.desc,
                                        nullptr, &dq.desc, &dk.desc, &dw.desc, &dg.desc, 0.1f, 64, &plan),
            STRATA_SUCCESS);
  EXPECT_EQ(run_on(plan, device, {&q, &k, &v, &dO, &h, &dh, &dv2, &g, nullptr, &dq, &dk, &dw, &dg}, {9, 10, 11, 12}),
            STRATA_SUCCESS);
  EXPECT_EQ(strata_prepare_wy_repr_bwd_plan(&k.desc, &v.desc, &beta.desc, &A.desc, &dw.desc, &dv2.desc, &g.desc,
                                            nullptr, &dk2.desc, &dvw.desc, &db.desc, &dg2.desc, &plan),
            STRATA_SUCCESS);
  EXPECT_EQ(run_on(plan, device, {&k, &v, &beta, &A, &dw, &dv2, &g, nullptr, &dk2, &dvw, &db, &dg2}, {8, 9, 10, 11}),
            STRATA_SUCCESS);
  std::vector<uint8_t> bytes;
  for (HostTensor* t : {&dv, &dh, &dh0, &dv2, &dq, &dk, &dw, &dg, &dk2, &dvw, &db, &dg2})
    bytes.insert(bytes.end(), t->storage.begin(), t->storage.end());
  return bytes;
}

TEST(GdnBwdDeterminism, SameBitsForRepeatsAndThreadCounts) {
  const int32_t before = strata_get_num_threads();
  for (const std::string& impl : atk::impls_for("chunk_bwd_dqkwg", kCpu)) {
    if (impl == "reference") continue;
    ForceImpl f(impl.c_str());
    ASSERT_EQ(strata_set_num_threads(2), STRATA_SUCCESS);
    const std::vector<uint8_t> first = run_all_ops();
    EXPECT_EQ(run_all_ops(), first) << impl << ": two runs differ";
    ASSERT_EQ(strata_set_num_threads(1), STRATA_SUCCESS);
    EXPECT_EQ(run_all_ops(), first) << impl << ": 1 vs 2 threads differ";
  }
  strata_set_num_threads(before);
}

// CUDA: two runs give the same bits (no atomics; fixed-order reductions over the GVA group and the K tiles), for
// the automatic choice (the tensor-core kernels: the tensors are bf16) and each CUDA implementation forced
// (cuda.sm90.chunk_tile pins the FMA kernels of dv_local, dqkwg and prepare_wy_bwd; bwd_dhu's is state_scan).
TEST(GdnBwdDeterminism, CudaSameBitsForRepeats) {
  int32_t n = 0;
  if (strata_device_count(STRATA_DEVICE_CUDA, &n) != STRATA_SUCCESS || n == 0) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  const std::vector<uint8_t> first = run_all_ops(dev);
  EXPECT_EQ(run_all_ops(dev), first) << "two CUDA runs differ";
  for (const char* impl : {"cuda.sm90.mma", "cuda.sm90.chunk_tile", "cuda.sm90.state_scan"}) {
    ForceImpl f(impl);
    const std::vector<uint8_t> forced = run_all_ops(dev);
    EXPECT_EQ(run_all_ops(dev), forced) << impl << ": two CUDA runs differ";
  }
}

// bwd_dhu's tensor-core kernel takes 32-column V tiles (two stages, one block per SM) when the N·HV·ceil(V / 32)
// items fit on the SMs at one block each, 64-column tiles otherwise (host rule; the kernel picks it at 64 < K <= 128).
TEST(GdnBwdDhu, NarrowTileRule) {
  linear_attn::gdn_bwd::Dims d;
  d.K = 128, d.V = 128, d.HV = 32, d.N = 1;
  EXPECT_TRUE(linear_attn::dhu_narrow_tiles(d, 132));   // B = 1, HV = 32: 128 items of 32 columns
  d.N = 4;
  EXPECT_FALSE(linear_attn::dhu_narrow_tiles(d, 132));  // B = 4: 512 items
  d.N = 1, d.V = 100;                                    // 4 tiles (the last 4 columns wide)
  EXPECT_TRUE(linear_attn::dhu_narrow_tiles(d, 128));
  EXPECT_FALSE(linear_attn::dhu_narrow_tiles(d, 127));
  d.V = 0;
  EXPECT_FALSE(linear_attn::dhu_narrow_tiles(d, 132));  // nothing to run
  d.V = 128, d.N = 0;
  EXPECT_FALSE(linear_attn::dhu_narrow_tiles(d, 132));
  d.N = 1, d.HV = 200;
  EXPECT_FALSE(linear_attn::dhu_narrow_tiles(d, 132));
  d.HV = 1, d.V = int64_t{1} << 62;                      // no overflow in the item count
  EXPECT_FALSE(linear_attn::dhu_narrow_tiles(d, 132));
  d.V = 64;
  EXPECT_FALSE(linear_attn::dhu_narrow_tiles(d, 0));
  EXPECT_TRUE(linear_attn::dhu_narrow_tiles(d, 2));
}

// Columns per warpgroup of the warpgroup-MMA bwd_dhu kernel (one block per SM): the widest whose blocks fill 3/4 of
// the SMs; a forced width only where 2 of it divide V.
TEST(GdnBwdDhu, WgmmaColumnRule) {
  linear_attn::gdn_bwd::Dims d;
  d.K = 128, d.V = 128, d.HV = 32, d.N = 4;
  EXPECT_EQ(linear_attn::dhu_wgmma_cols(d, 132, 0), 64);  // B = 4: 128 blocks of 128 columns
  d.N = 2;
  EXPECT_EQ(linear_attn::dhu_wgmma_cols(d, 132, 0), 32);  // 128 blocks of 64 columns
  d.N = 1;
  EXPECT_EQ(linear_attn::dhu_wgmma_cols(d, 132, 0), 16);  // B = 1: 128 blocks of 32 columns
  d.V = 96;
  EXPECT_EQ(linear_attn::dhu_wgmma_cols(d, 132, 0), 16);  // 96 = 3 x 32
  EXPECT_EQ(linear_attn::dhu_wgmma_cols(d, 132, 64), 0);  // 128 columns do not divide 96
  EXPECT_EQ(linear_attn::dhu_wgmma_cols(d, 132, 16), 16);
}

#if STRATA_WITH_CUDA
// The tensor-core kernels (cuda.sm90.mma) take the required token tensors in one 16-bit dtype; f32 or mixed
// dtypes go to the FMA kernels (the automatic choice of the *_cuda entry points follows the same rule).
TEST(GdnBwdCuda, TensorCorePathNeedsOne16BitDtype) {
  using namespace linear_attn;
  const int32_t bf = STRATA_DTYPE_BF16, hf = STRATA_DTYPE_F16, f32 = STRATA_DTYPE_F32;
  DqkwgParams q;
  q.d.K = 128, q.d.V = 128;
  auto set_q = [&](int32_t dt) { q.q.dtype = q.k.dtype = q.v.dtype = q.dout.dtype = dt; };
  set_q(bf);
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma_reject(q), "");
  set_q(hf);
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma_reject(q), "");
  q.h.dtype = q.dh.dtype = f32;  // chunk states of another dtype are converted on load
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma_reject(q), "");
  set_q(f32);
  EXPECT_NE(chunk_bwd_dqkwg_cuda_mma_reject(q), "");
  set_q(bf);
  q.k.dtype = hf;
  EXPECT_NE(chunk_bwd_dqkwg_cuda_mma_reject(q), "");

  DhuParams h;
  h.d.K = 256, h.d.V = 64;
  h.q.dtype = h.k.dtype = h.w.dtype = h.dout.dtype = h.dv.dtype = bf;
  EXPECT_EQ(chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(h), "");
  h.dv.dtype = f32;
  EXPECT_NE(chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(h), "");

  DvLocalParams v;
  v.d.K = 64, v.d.V = 256;
  v.q.dtype = v.k.dtype = v.dout.dtype = hf;
  EXPECT_EQ(chunk_bwd_dv_local_cuda_mma_reject(v), "");
  v.d.V = 300;  // beyond the kernel's shared-memory tiles: the FMA kernel takes it
  EXPECT_NE(chunk_bwd_dv_local_cuda_mma_reject(v), "");

  WyBwdParams w;
  w.d.K = 100, w.d.V = 100;
  w.k.dtype = w.v.dtype = w.A.dtype = w.dw.dtype = w.du.dtype = bf;
  w.beta.dtype = f32;  // β is read element-wise (any dtype)
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma_reject(w), "");
  w.A.dtype = f32;
  EXPECT_NE(prepare_wy_repr_bwd_cuda_mma_reject(w), "");
}

// The composed backward's fused sums (WyBwdParams::dk_add / dg_add) are taken by the tensor-core kernel only: the
// FMA entry refuses a call that sets them, before it touches the device (so this runs without a GPU).
TEST(GdnBwdCuda, FmaWyBwdRefusesFusedSums) {
  using namespace linear_attn;
  float x = 0.f;
  WyBwdParams w;
  w.dk_add.p = &x;
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_fma(w, nullptr, nullptr), STRATA_ERROR_UNSUPPORTED);
  w.dk_add.p = nullptr;
  w.dg_add.p = &x;
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_fma(w, nullptr, nullptr), STRATA_ERROR_UNSUPPORTED);
}

// Both CUDA kernels of each op are in its implementation list, the tensor-core one first (chunk_bwd_dqkwg: after
// its warpgroup-MMA kernel, the automatic choice since session 10).
TEST(GdnBwdCuda, ImplementationListsHaveBothKernels) {
  for (const char* op : {"chunk_bwd_dv_local", "chunk_gated_delta_rule_bwd_dhu", "chunk_bwd_dqkwg",
                         "prepare_wy_repr_bwd"}) {
    const char* names[64];
    const int32_t n = strata_op_impl_names(op, names, 64);
    const int i = std::string(op) == "chunk_bwd_dqkwg" ? 1 : 0;
    if (i == 1) {
      ASSERT_GE(n, 1) << op;
      EXPECT_STREQ(names[0], "cuda.sm90.wgmma") << op;
    }
    ASSERT_GE(n, i + 2) << op;
    EXPECT_STREQ(names[i], "cuda.sm90.mma") << op;
    EXPECT_EQ(std::string(names[i + 1]).rfind("cuda.sm90.", 0), 0u) << op;
    EXPECT_STRNE(names[i + 1], "cuda.sm90.mma") << op;
  }
}
#endif

// ---------------------------------------------------------------------------------------------------------
// Validation: one test per rule (status, message naming the argument, output untouched).

struct DvCall {
  HostTensor q = rnd(STRATA_DTYPE_F32, {1, 20, 2, 8}, 1), k = rnd(STRATA_DTYPE_F32, {1, 20, 2, 8}, 2);
  HostTensor dO = rnd(STRATA_DTYPE_F32, {1, 20, 4, 6}, 3), g = gates({1, 20, 4}, 16, 4);
  HostTensor dv = zeros({1, 20, 4, 6}, STRATA_DTYPE_F32);
  HostTensor cu = HostTensor::make(STRATA_DTYPE_I64, {3});
  bool use_cu = false;
  float scale = 0.5f;
  int chunk = 16;
  strata_status go() {
    strata_plan plan = nullptr;
    strata_status s = strata_chunk_bwd_dv_local_plan(&q.desc, &k.desc, &dO.desc, &g.desc, use_cu ? &cu.desc : nullptr,
                                                     &dv.desc, scale, chunk, &plan);
    if (s != STRATA_SUCCESS) return s;
    return run(plan, {&q, &k, &dO, &g, use_cu ? &cu : nullptr, &dv});
  }
  bool untouched() const {
    for (uint8_t b : dv.storage)
      if (b != 0xff) return false;
    return true;
  }
};

void expect_error(DvCall& c, strata_status status, const char* text) {
  EXPECT_EQ(c.go(), status);
  EXPECT_NE(std::string(strata_get_last_error_message()).find(text), std::string::npos)
      << strata_get_last_error_message();
  EXPECT_TRUE(c.untouched());
}

TEST(GdnBwdValidation, NullTensor) {
  DvCall c;
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_bwd_dv_local_plan(nullptr, &c.k.desc, &c.dO.desc, nullptr, nullptr, &c.dv.desc, 1.f, 16,
                                           &plan),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("chunk_bwd_dv_local: q must not be NULL"),
            std::string::npos);
}
TEST(GdnBwdValidation, WrongDevice) {
  DvCall c;
  c.k.desc.device = {STRATA_DEVICE_CPU, 7};
  expect_error(c, STRATA_ERROR_INVALID_DEVICE, "chunk_bwd_dv_local: k");
}
TEST(GdnBwdValidation, IntegerInput) {
  DvCall c;
  c.q.desc.dtype = STRATA_DTYPE_I32;
  expect_error(c, STRATA_ERROR_INVALID_DTYPE, "chunk_bwd_dv_local: q");
}
TEST(GdnBwdValidation, HalfPrecisionGate) {
  DvCall c;
  c.g = HostTensor::make(STRATA_DTYPE_BF16, {1, 20, 4});
  expect_error(c, STRATA_ERROR_INVALID_DTYPE, "chunk_bwd_dv_local: g");
}
TEST(GdnBwdValidation, ValueHeadsNotAMultipleOfQkHeads) {
  DvCall c;
  c.dO = rnd(STRATA_DTYPE_F32, {1, 20, 3, 6}, 3);
  c.dv = zeros({1, 20, 3, 6}, STRATA_DTYPE_F32);
  c.g = gates({1, 20, 3}, 16, 4);
  expect_error(c, STRATA_ERROR_INVALID_SHAPE, "must be a multiple of the q/k heads");
}
TEST(GdnBwdValidation, KeyDimAbove256) {
  DvCall c;
  c.q = rnd(STRATA_DTYPE_F32, {1, 20, 2, 257}, 1);
  c.k = rnd(STRATA_DTYPE_F32, {1, 20, 2, 257}, 1);
  expect_error(c, STRATA_ERROR_INVALID_SHAPE, "at most 256");
}
TEST(GdnBwdValidation, OutputShape) {
  DvCall c;
  c.dv = zeros({1, 20, 4, 5}, STRATA_DTYPE_F32);
  expect_error(c, STRATA_ERROR_INVALID_SHAPE, "chunk_bwd_dv_local: dv must have shape [1, 20, 4, 6]");
}
TEST(GdnBwdValidation, PackNeedsOneRow) {
  DvCall c;
  c.q = rnd(STRATA_DTYPE_F32, {2, 10, 2, 8}, 1);
  c.k = rnd(STRATA_DTYPE_F32, {2, 10, 2, 8}, 1);
  c.dO = rnd(STRATA_DTYPE_F32, {2, 10, 4, 6}, 1);
  c.dv = zeros({2, 10, 4, 6}, STRATA_DTYPE_F32);
  c.g = gates({2, 10, 4}, 16, 4);
  c.use_cu = true;
  expect_error(c, STRATA_ERROR_INVALID_SHAPE, "must have B = 1");
}
TEST(GdnBwdValidation, StridedLastDimension) {
  DvCall c;
  c.q = HostTensor::make(STRATA_DTYPE_F32, {1, 20, 2, 8}, atk::Layout::kStridedCols);
  expect_error(c, STRATA_ERROR_INVALID_STRIDE, "chunk_bwd_dv_local: q must be contiguous in its last dimension");
}
TEST(GdnBwdValidation, ChunkSize) {
  DvCall c;
  c.chunk = 48;
  expect_error(c, STRATA_ERROR_INVALID_ATTRIBUTE, "chunk_size must be 16, 32 or 64, got 48");
}
TEST(GdnBwdValidation, Scale) {
  DvCall c;
  c.scale = std::nanf("");
  expect_error(c, STRATA_ERROR_INVALID_ATTRIBUTE, "scale must be finite");
}
TEST(GdnBwdValidation, CuSeqlensValues) {
  DvCall c;
  c.use_cu = true;
  c.cu.set(0, 0), c.cu.set(1, 12), c.cu.set(2, 9);
  expect_error(c, STRATA_ERROR_INVALID_VALUE, "cu_seqlens must be non-decreasing");
  c.cu.set(2, 19);
  expect_error(c, STRATA_ERROR_INVALID_VALUE, "must equal T = 20");
}
TEST(GdnBwdValidation, DqkwgNeedsDvForDwAndGForDg) {
  HostTensor q = rnd(STRATA_DTYPE_F32, {1, 20, 1, 4}, 1), v = rnd(STRATA_DTYPE_F32, {1, 20, 1, 4}, 2);
  HostTensor h = rnd(STRATA_DTYPE_F32, {1, 2, 1, 4, 4}, 3), dq = zeros({1, 20, 1, 4}, STRATA_DTYPE_F32);
  HostTensor dg = zeros({1, 20, 1}, STRATA_DTYPE_F32);
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_bwd_dqkwg_plan(&q.desc, &q.desc, &v.desc, &v.desc, &h.desc, &h.desc, nullptr, nullptr, nullptr,
                                        &dq.desc, &dq.desc, &dq.desc, nullptr, 1.f, 16, &plan),
            STRATA_ERROR_INVALID_ATTRIBUTE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("dw (= -dv h^T) needs dv"), std::string::npos);
  EXPECT_EQ(strata_chunk_bwd_dqkwg_plan(&q.desc, &q.desc, &v.desc, &v.desc, &h.desc, &h.desc, nullptr, nullptr, nullptr,
                                        &dq.desc, &dq.desc, nullptr, &dg.desc, 1.f, 16, &plan),
            STRATA_ERROR_INVALID_ATTRIBUTE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("dg (the gate gradient) needs g"), std::string::npos);
}
TEST(GdnBwdValidation, ChunkStateCount) {
  // Fixed length: h must have ceil(T / BT) chunks (plan); packed: the sum over sequences (CPU run time).
  HostTensor q = rnd(STRATA_DTYPE_F32, {1, 20, 1, 4}, 1), v = rnd(STRATA_DTYPE_F32, {1, 20, 1, 4}, 2);
  HostTensor h = rnd(STRATA_DTYPE_F32, {1, 3, 1, 4, 4}, 3), dq = zeros({1, 20, 1, 4}, STRATA_DTYPE_F32);
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_bwd_dqkwg_plan(&q.desc, &q.desc, &v.desc, &v.desc, &h.desc, &h.desc, nullptr, nullptr, nullptr,
                                        &dq.desc, &dq.desc, nullptr, nullptr, 1.f, 16, &plan),
            STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("chunk_bwd_dqkwg: h must have shape [1, 2, 1, 4, 4]"),
            std::string::npos)
      << strata_get_last_error_message();
  HostTensor cu = HostTensor::make(STRATA_DTYPE_I64, {3});
  cu.set(0, 0), cu.set(1, 10), cu.set(2, 20);  // 1 + 1 chunks of 16, but h holds 3
  ASSERT_EQ(strata_chunk_bwd_dqkwg_plan(&q.desc, &q.desc, &v.desc, &v.desc, &h.desc, &h.desc, nullptr, nullptr,
                                        &cu.desc, &dq.desc, &dq.desc, nullptr, nullptr, 1.f, 16, &plan),
            STRATA_SUCCESS);
  EXPECT_EQ(run(plan, {&q, &q, &v, &v, &h, &h, nullptr, nullptr, &cu, &dq, &dq, nullptr, nullptr}),
            STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("h must have NT = 2 chunks"), std::string::npos)
      << strata_get_last_error_message();
  for (uint8_t b : dq.storage) EXPECT_EQ(b, 0xff);
}
TEST(GdnBwdValidation, WyChunkSizeFromA) {
  HostTensor k = rnd(STRATA_DTYPE_F32, {1, 20, 1, 4}, 1), A = rnd(STRATA_DTYPE_F32, {1, 20, 1, 48}, 2);
  HostTensor b = rnd(STRATA_DTYPE_F32, {1, 20, 1}, 3), dk = zeros({1, 20, 1, 4}, STRATA_DTYPE_F32);
  HostTensor db = zeros({1, 20, 1}, STRATA_DTYPE_F32);
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_prepare_wy_repr_bwd_plan(&k.desc, &k.desc, &b.desc, &A.desc, &k.desc, &k.desc, nullptr, nullptr,
                                            &dk.desc, &dk.desc, &db.desc, nullptr, &plan),
            STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("A.shape[3] must be 16, 32 or 64"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------------
// The C++ wrappers allocate the outputs and agree with the C calls.
TEST(GdnBwdCpp, WrappersRun) {
  const int64_t T = 40;
  HostTensor q = rnd(STRATA_DTYPE_F32, {1, T, 1, 8}, 1), dO = rnd(STRATA_DTYPE_F32, {1, T, 2, 4}, 2);
  HostTensor g = gates({1, T, 2}, 16, 3), cu = HostTensor::make(STRATA_DTYPE_I64, {3});
  cu.set(0, 0), cu.set(1, 17), cu.set(2, T);
  const Tensor tq = Tensor::view(q.storage.data(), q.desc), tdo = Tensor::view(dO.storage.data(), dO.desc);
  const Tensor tg = Tensor::view(g.storage.data(), g.desc), tcu = Tensor::view(cu.storage.data(), cu.desc);
  const Tensor dv = chunk_bwd_dv_local(tq, tq, tdo, &tg, 0.5f, 16, &tcu);
  EXPECT_EQ(dv.shape(), shape_of(dO.desc));
  HostTensor w = rnd(STRATA_DTYPE_F32, {1, T, 2, 8}, 4, 0.1);
  const GdnBwdDhuResult r = chunk_gated_delta_rule_bwd_dhu(tq, tq, Tensor::view(w.storage.data(), w.desc), tdo, dv,
                                                           &tg, nullptr, true, 0.5f, 16, &tcu);
  EXPECT_EQ(r.dh.size(1), 4);  // ceil(17 / 16) + ceil(23 / 16)
  EXPECT_EQ(r.dh0.size(0), 2);
}

// ---------------------------------------------------------------------------------------------------------
// The window walk the CUDA kernels use to find their chunks (no host sync, no chunk table) visits exactly the
// chunks of the host enumeration, each once, with the right chunk-state index — for random packs with
// zero-length and single-token sequences, every chunk size, and fixed-length batches.
TEST(GdnBwdChunkWalk, WindowsCoverEveryChunkOnce) {
  using linear_attn::gdn_bwd::Chunk;
  using linear_attn::gdn_bwd::DevChunk;
  using linear_attn::gdn_bwd::Dims;
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    Dims d;
    d.BT = (trial % 3 == 0) ? 16 : (trial % 3 == 1 ? 32 : 64);
    std::vector<int64_t> cu = {0};
    const bool varlen = trial % 5 != 0;
    if (varlen) {
      const int n = 1 + static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) {
        const uint64_t kind = rng() % 4;  // empty, single token, short, long
        const int64_t len = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? static_cast<int64_t>(rng() % 70) : static_cast<int64_t>(rng() % 300);
        cu.push_back(cu.back() + len);
      }
      d.B = 1, d.T = cu.back(), d.N = static_cast<int64_t>(cu.size()) - 1, d.cu = cu.data();
    } else {
      d.B = 1 + static_cast<int64_t>(rng() % 3), d.T = static_cast<int64_t>(rng() % 200), d.N = d.B;
    }
    std::vector<int64_t> offs(static_cast<size_t>(d.N + 1), 0);
    for (int64_t n = 0; n < d.N && varlen; ++n) offs[n + 1] = offs[n] + (cu[n + 1] - cu[n] + d.BT - 1) / d.BT;
    std::vector<Chunk> walked;
    for (int64_t w = 0; w < linear_attn::gdn_bwd::num_windows(d); ++w)
      linear_attn::gdn_bwd::for_each_chunk(d, offs.data(), w, [&](const DevChunk& c) {
        walked.push_back({c.b, c.t0, c.t1, c.hc, c.n});
      });
    std::vector<Chunk> expect = linear_attn::gdn_bwd::host_chunks(d);
    ASSERT_EQ(walked.size(), expect.size()) << "trial " << trial;
    auto key = [](const Chunk& c) { return std::make_pair(c.b, c.t0); };
    std::sort(walked.begin(), walked.end(), [&](const Chunk& a, const Chunk& b) { return key(a) < key(b); });
    for (size_t i = 0; i < expect.size(); ++i) {
      EXPECT_EQ(walked[i].b, expect[i].b) << "trial " << trial;
      EXPECT_EQ(walked[i].t0, expect[i].t0) << "trial " << trial;
      EXPECT_EQ(walked[i].t1, expect[i].t1) << "trial " << trial;
      EXPECT_EQ(walked[i].hc, expect[i].hc) << "trial " << trial;
      if (varlen) EXPECT_EQ(walked[i].n, expect[i].n) << "trial " << trial;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// CPU throughput at T = 4096, H = 4, HV = 8, K = V = 128, f32, one thread, measured in thread CPU time (the
// development VM is shared, so wall time mostly measures the neighbours) against the fp32 FMA peak of the best
// Highway target, one thread, per thread CPU-second (testkit/fma_peak.h: the probe `strata peak` runs). Disabled
// by default (a measurement, not a check): run with --gtest_also_run_disabled_tests
// --gtest_filter='*GdnBwdPerf*'.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

TEST(GdnBwdPerf, DISABLED_CpuThroughput) {
  const int32_t before = strata_get_num_threads();
  ASSERT_EQ(strata_set_num_threads(1), STRATA_SUCCESS);
  const int64_t B = 1, T = 4096, H = 4, HV = 8, K = 128, V = 128, BT = 64, NT = T / BT;
  const int32_t f = STRATA_DTYPE_F32;
  HostTensor q = rnd(f, {B, T, H, K}, 1, 0.1), k = rnd(f, {B, T, H, K}, 2, 0.1), v = rnd(f, {B, T, HV, V}, 3);
  HostTensor w = rnd(f, {B, T, HV, K}, 4, 0.01), dO = rnd(f, {B, T, HV, V}, 5), g = gates({B, T, HV}, 64, 6);
  HostTensor h = rnd(f, {B, NT, HV, K, V}, 7), beta = rnd(f, {B, T, HV}, 9, 0.3), A = rnd(f, {B, T, HV, BT}, 10, 0.1);
  HostTensor dv = zeros({B, T, HV, V}, f), dh = zeros({B, NT, HV, K, V}, f), dv2 = zeros({B, T, HV, V}, f);
  HostTensor dq = zeros({B, T, H, K}, f), dk = zeros({B, T, H, K}, f), dw = zeros({B, T, HV, K}, f);
  HostTensor dg = zeros({B, T, HV}, f), dvw = zeros({B, T, HV, V}, f), db = zeros({B, T, HV}, f);
  const double L = BT, chunks = static_cast<double>(T) / L;
  struct Op {
    const char* name;
    double flops;
    std::function<void()> run;
  };
  std::vector<Op> ops = {
      {"chunk_bwd_dv_local", chunks * HV * (2 * L * L * K + 2 * L * L * V),
       [&] {
         strata_plan p = nullptr;
         ASSERT_EQ(strata_chunk_bwd_dv_local_plan(&q.desc, &k.desc, &dO.desc, &g.desc, nullptr, &dv.desc, 0.1f, 64, &p), 0);
         ASSERT_EQ(run(p, {&q, &k, &dO, &g, nullptr, &dv}), 0);
       }},
      {"chunk_gated_delta_rule_bwd_dhu", chunks * HV * 6 * L * K * V,
       [&] {
         strata_plan p = nullptr;
         ASSERT_EQ(strata_chunk_gated_delta_rule_bwd_dhu_plan(&q.desc, &k.desc, &w.desc, &dO.desc, &dv.desc, &g.desc,
                                                              nullptr, nullptr, &dh.desc, nullptr, &dv2.desc, 0.1f, 64, &p),
                   0);
         ASSERT_EQ(run(p, {&q, &k, &w, &dO, &dv, &g, nullptr, nullptr, &dh, nullptr, &dv2}), 0);
       }},
      {"chunk_bwd_dqkwg", chunks * HV * (2 * L * L * V + 6 * L * K * V + 4 * L * L * K),
       [&] {
         strata_plan p = nullptr;
         ASSERT_EQ(strata_chunk_bwd_dqkwg_plan(&q.desc, &k.desc, &v.desc, &dO.desc, &h.desc, &h.desc, &dv2.desc, &g.desc,
                                               nullptr, &dq.desc, &dk.desc, &dw.desc, &dg.desc, 0.1f, 64, &p),
                   0);
         ASSERT_EQ(run(p, {&q, &k, &v, &dO, &h, &h, &dv2, &g, nullptr, &dq, &dk, &dw, &dg}), 0);
       }},
      {"prepare_wy_repr_bwd",
       chunks * (HV * (4 * L * L * (K + V) + 4 * L * L * L + 4 * L * L * K) + H * 2 * L * L * K),
       [&] {
         strata_plan p = nullptr;
         ASSERT_EQ(strata_prepare_wy_repr_bwd_plan(&k.desc, &v.desc, &beta.desc, &A.desc, &dw.desc, &dv2.desc, &g.desc,
                                                   nullptr, &dk.desc, &dvw.desc, &db.desc, &dg.desc, &p),
                   0);
         ASSERT_EQ(run(p, {&k, &v, &beta, &A, &dw, &dv2, &g, nullptr, &dk, &dvw, &db, &dg}), 0);
       }},
  };
  const double peak = strata::atk::fp32_fma_peak(1).gflops_per_cpu_second;
  std::printf("fp32 FMA peak (1 thread, per thread CPU-second): %.1f GFLOP/s\n", peak);
  double total_flops = 0, total_s = 0;
  for (const Op& op : ops) {
    op.run();  // warm-up (plan cache, buffers)
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const double t0 = thread_seconds();
      op.run();
      best = std::min(best, thread_seconds() - t0);
    }
    total_flops += op.flops, total_s += best;
    std::printf("%-32s %8.2f ms CPU  %6.1f GFLOP/s  %5.1f %% of the probe\n", op.name, best * 1e3,
                op.flops / best / 1e9, 100.0 * op.flops / best / 1e9 / peak);
  }
  std::printf("%-32s %8.2f ms CPU  %6.1f GFLOP/s  %5.1f %% of the probe\n", "all four", total_s * 1e3,
              total_flops / total_s / 1e9, 100.0 * total_flops / total_s / 1e9 / peak);
  std::printf("fp32 FMA peak again: %.1f GFLOP/s\n", strata::atk::fp32_fma_peak(1).gflops_per_cpu_second);
  strata_set_num_threads(before);
}

}  // namespace
}  // namespace strata
