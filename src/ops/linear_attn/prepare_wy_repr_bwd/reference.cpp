// float64 reference of prepare_wy_repr_bwd: plain loops straight from the definition (prepare_wy_repr_bwd.h).
// dk is summed over the value heads of a group in float64 and rounded once.
#include "ops/linear_attn/gdn_bwd_common/reference_util.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

namespace strata::linear_attn {
using namespace gdn_bwd;

namespace {
// Acc = double: the reference; Acc = float: the same loops in f32 (the "naive" computation of the acceptance
// rule, ARCHITECTURE.md §6).
template <class Acc>
void run(const WyBwdParams& p) {
  const Dims& d = p.d;
  const int64_t K = d.K, V = d.V;
  for (const Chunk& c : host_chunks(d)) {
    const int64_t L = c.t1 - c.t0;
    for (int64_t h = 0; h < d.H; ++h) {
      auto Kx = [&](int64_t i, int64_t x) { return ldA<Acc>(p.k, p.k.off(c.b, c.t0 + i, h) + x); };
      std::vector<Acc> dk_sum(static_cast<size_t>(L * K), 0.0), kk(static_cast<size_t>(L * L), 0.0);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j)
          for (int64_t x = 0; x < K; ++x) kk[i * L + j] += Kx(i, x) * Kx(j, x);
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        const std::vector<Acc> gam = chunk_gamma<Acc>(p.g, c.b, c.t0, c.t1, hv);
        std::vector<Acc> beta(L), E(L);
        for (int64_t i = 0; i < L; ++i) {
          beta[i] = ldA<Acc>(p.beta, p.beta.off(c.b, c.t0 + i, hv));
          E[i] = std::exp(gam[i]);
        }
        auto A = [&](int64_t i, int64_t j) { return ldA<Acc>(p.A, p.A.off(c.b, c.t0 + i, hv) + j); };
        auto Vv = [&](int64_t i, int64_t e) { return ldA<Acc>(p.v, p.v.off(c.b, c.t0 + i, hv) + e); };
        auto dW = [&](int64_t i, int64_t x) { return ldA<Acc>(p.dw, p.dw.off(c.b, c.t0 + i, hv) + x); };
        auto dU = [&](int64_t i, int64_t e) { return ldA<Acc>(p.du, p.du.off(c.b, c.t0 + i, hv) + e); };
        std::vector<Acc> db(L, 0.0), dgam(L, 0.0), dk(static_cast<size_t>(L * K), 0.0);
        // X = A^T dW (dk, dβ, dγ terms); Y = A^T dU (dv, dβ terms).
        for (int64_t i = 0; i < L; ++i) {
          Acc xk = 0.0;
          for (int64_t x = 0; x < K; ++x) {
            Acc X = 0.0;
            for (int64_t j = 0; j < L; ++j) X += A(j, i) * dW(j, x);
            dk[i * K + x] = beta[i] * E[i] * X;
            xk += X * Kx(i, x);
          }
          Acc yv = 0.0;
          for (int64_t e = 0; e < V; ++e) {
            Acc Y = 0.0;
            for (int64_t j = 0; j < L; ++j) Y += A(j, i) * dU(j, e);
            st(p.dv, p.dv.off(c.b, c.t0 + i, hv) + e, beta[i] * Y);
            yv += Y * Vv(i, e);
          }
          db[i] = E[i] * xk + yv;
          dgam[i] = beta[i] * E[i] * xk;
        }
        // dA = StrictLower(dW (diag(βE) K)^T + dU (diag(β) V)^T); dM = -StrictLower(A^T dA A^T).
        std::vector<Acc> dA(static_cast<size_t>(L * L), 0.0), tmp(static_cast<size_t>(L * L), 0.0),
            dM(static_cast<size_t>(L * L), 0.0);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < i; ++j) {
            Acc a = 0.0;
            for (int64_t x = 0; x < K; ++x) a += dW(i, x) * beta[j] * E[j] * Kx(j, x);
            for (int64_t e = 0; e < V; ++e) a += dU(i, e) * beta[j] * Vv(j, e);
            dA[i * L + j] = a;
          }
        for (int64_t i = 0; i < L; ++i)  // tmp = A^T dA
          for (int64_t j = 0; j < L; ++j)
            for (int64_t m = 0; m < L; ++m) tmp[i * L + j] += A(m, i) * dA[m * L + j];
        for (int64_t i = 0; i < L; ++i)  // dM = -StrictLower(tmp A^T)
          for (int64_t j = 0; j < i; ++j) {
            Acc a = 0.0;
            for (int64_t m = 0; m < L; ++m) a += tmp[i * L + m] * A(j, m);
            dM[i * L + j] = -a;
          }
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < i; ++j) {
            const Acc gam_ij = std::exp(gam[i] - gam[j]);
            const Acc dP = dM[i * L + j] * gam_ij, Mij = beta[i] * kk[i * L + j] * gam_ij;
            for (int64_t x = 0; x < K; ++x) {
              dk[i * K + x] += beta[i] * dP * Kx(j, x);
              dk[j * K + x] += dP * beta[i] * Kx(i, x);
            }
            db[i] += dP * kk[i * L + j];
            dgam[i] += dM[i * L + j] * Mij;
            dgam[j] -= dM[i * L + j] * Mij;
          }
        for (int64_t i = 0; i < L; ++i) {
          st(p.dbeta, p.dbeta.off(c.b, c.t0 + i, hv), db[i]);
          if (p.dg.present()) st(p.dg, p.dg.off(c.b, c.t0 + i, hv), dgam[i]);
          for (int64_t x = 0; x < K; ++x) dk_sum[i * K + x] += dk[i * K + x];
        }
      }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < K; ++x) st(p.dk, p.dk.off(c.b, c.t0 + i, h) + x, dk_sum[i * K + x]);
    }
  }
}

}  // namespace

void prepare_wy_repr_bwd_reference(const WyBwdParams& p) { run<double>(p); }
void prepare_wy_repr_bwd_reference_naive(const WyBwdParams& p) { run<float>(p); }

}  // namespace strata::linear_attn
