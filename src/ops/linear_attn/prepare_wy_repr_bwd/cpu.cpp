// CPU kernels of prepare_wy_repr_bwd, written once and compiled for every Highway target ("cpu.<isa>").
//
// Work item = (chunk, q/k head h): KK^T (L x L) once for the group, then per value head hv in increasing
// order (f32 GEMMs of the fp32 micro-kernel):
//   X = A^T dW, Y = A^T dU                        dv = diag(β) Y ; dk = diag(βE) X ; dβ, dγ row dots
//   dA = StrictLower(dW (diag(βE) K)^T + dU (diag(β) V)^T)       (one GEMM over the K + V concatenation)
//   dM = -StrictLower((A^T dA) A^T) ;  dP = dM ⊙ Γ (exponent formed only for i > j)
//   dk += diag(β) dP K + dP^T diag(β) K ;  dβ += rowdot(dP, KK^T) ;  dγ += rowsum(dM ⊙ M) - colsum(dM ⊙ M)
// dk is added into the group's f32 sum (the GVA reduction, fixed order) and written once.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/prepare_wy_repr_bwd/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/linear_attn/gdn_bwd_common/cpu-inl.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::HWY_NAMESPACE {
namespace gb = gdn_bwd::HWY_NAMESPACE;
using gdn_bwd::Chunk;

void WyBwd(const WyBwdParams& p) {
  const gdn_bwd::Dims& d = p.d;
  const std::vector<Chunk> chunks = gdn_bwd::host_chunks(d);
  const int64_t K = d.K, V = d.V, BT = d.BT, KV = K + V, items = static_cast<int64_t>(chunks.size()) * d.H;
  const gb::Gemm gemm;
  tile::parallel_blocks(items, 1, [&](int64_t i0, int64_t i1) {
    // lhs = [dW | dU] (L x (K + V)); rhs = [diag(βE) K | diag(β) V]; X = A^T dW, Y = A^T dU share one GEMM.
    std::vector<float> k(BT * K), kb(BT * K), kk(BT * BT), A(BT * BT), lhs(BT * KV), rhs(BT * KV), xy(BT * KV);
    std::vector<float> dk(BT * K), dks(BT * K), dpk(BT * K), dA(BT * BT), tmp(BT * BT), dM(BT * BT), vv(BT * V);
    std::vector<float> gam(BT), beta(BT), E(BT), db(BT), dg(BT);
    for (int64_t it = i0; it < i1; ++it) {
      const Chunk& c = chunks[it / d.H];
      const int64_t h = it % d.H, L = c.t1 - c.t0;
      gb::LoadTok(p.k, c.b, c.t0, h, L, K, k.data(), K);
      gemm(false, true, L, L, K, 1.f, k.data(), K, k.data(), K, 0.f, kk.data(), L);
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        gb::LoadScalars(p.g, c.b, c.t0, hv, L, gam.data());
        gb::LoadScalars(p.beta, c.b, c.t0, hv, L, beta.data());
        for (int64_t i = 0; i < L; ++i) E[i] = std::exp(gam[i]);
        gb::LoadTok(p.A, c.b, c.t0, hv, L, L, A.data(), L);
        gb::LoadTok(p.dw, c.b, c.t0, hv, L, K, lhs.data(), KV);
        gb::LoadTok(p.du, c.b, c.t0, hv, L, V, lhs.data() + K, KV);
        gb::LoadTok(p.v, c.b, c.t0, hv, L, V, vv.data(), V);
        for (int64_t i = 0; i < L; ++i) {
          const float fk = beta[i] * E[i];
          for (int64_t x = 0; x < K; ++x) rhs[i * KV + x] = fk * k[i * K + x];
          for (int64_t e = 0; e < V; ++e) rhs[i * KV + K + e] = beta[i] * vv[i * V + e];
        }
        // [X | Y] = A^T [dW | dU]
        gemm(true, false, L, KV, L, 1.f, A.data(), L, lhs.data(), KV, 0.f, xy.data(), KV);
        for (int64_t i = 0; i < L; ++i) {
          const float* x = xy.data() + i * KV;
          const float xk = gb::RowDot(x, k.data() + i * K, K);
          const float yv = gb::RowDot(x + K, vv.data() + i * V, V);
          db[i] = E[i] * xk + yv;
          dg[i] = beta[i] * E[i] * xk;
          for (int64_t xi = 0; xi < K; ++xi) dk[i * K + xi] = beta[i] * E[i] * x[xi];
          for (int64_t e = 0; e < V; ++e) xy[i * KV + K + e] *= beta[i];  // dv = diag(β) Y
        }
        gb::StoreTok(p.dv, c.b, c.t0, hv, L, V, xy.data() + K, KV);
        // dA = StrictLower([dW | dU] [diag(βE) K | diag(β) V]^T)
        gemm(false, true, L, L, KV, 1.f, lhs.data(), KV, rhs.data(), KV, 0.f, dA.data(), L);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = i; j < L; ++j) dA[i * L + j] = 0.f;
        // dM = -StrictLower((A^T dA) A^T)
        gemm(true, false, L, L, L, 1.f, A.data(), L, dA.data(), L, 0.f, tmp.data(), L);
        gemm(false, true, L, L, L, -1.f, tmp.data(), L, A.data(), L, 0.f, dM.data(), L);
        // dP = dM ⊙ Γ (stored in dA), gate and beta terms; kb = diag(β) K
        for (int64_t i = 0; i < L; ++i) {
          float dbi = 0.f, rs = 0.f;
          for (int64_t j = 0; j < L; ++j) {
            float dp = 0.f;
            if (j < i) {
              const float gij = std::exp(gam[i] - gam[j]);
              dp = dM[i * L + j] * gij;
              const float dmm = dM[i * L + j] * beta[i] * kk[i * L + j] * gij;  // dM_ij M_ij
              rs += dmm;
              dg[j] -= dmm;
              dbi += dp * kk[i * L + j];
            }
            dA[i * L + j] = dp;
          }
          dg[i] += rs;
          db[i] += dbi;
          for (int64_t x = 0; x < K; ++x) kb[i * K + x] = beta[i] * k[i * K + x];
        }
        // dk += diag(β) dP K + dP^T diag(β) K
        gemm(false, false, L, K, L, 1.f, dA.data(), L, k.data(), K, 0.f, dpk.data(), K);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t x = 0; x < K; ++x) dk[i * K + x] += beta[i] * dpk[i * K + x];
        gemm(true, false, L, K, L, 1.f, dA.data(), L, kb.data(), K, 1.f, dk.data(), K);
        gb::StoreScalars(p.dbeta, c.b, c.t0, hv, L, db.data());
        if (p.dg.present()) gb::StoreScalars(p.dg, c.b, c.t0, hv, L, dg.data());
        const bool first = hv == h * d.G;
        for (int64_t e = 0; e < L * K; ++e) dks[e] = first ? dk[e] : dks[e] + dk[e];
      }
      gb::StoreTok(p.dk, c.b, c.t0, h, L, K, dks.data(), K);
    }
  });
}

}  // namespace strata::linear_attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::linear_attn {
HWY_EXPORT(WyBwd);
WyBwdCpuFn prepare_wy_repr_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(WyBwd, hwy_target); }
}  // namespace strata::linear_attn
#endif
