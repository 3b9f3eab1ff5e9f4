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

// Row i of the M-path terms, vectorised over j (lanes j >= i are selected to 0, never multiplied by a mask):
//   dP_ij = dM_ij Γ_ij ;  dβ_i += Σ_j dP_ij KK_ij ;  m_ij = dM_ij M_ij = dP_ij β_i KK_ij ;
//   dγ_i += Σ_j m_ij ;  dγ_j -= m_ij.
HWY_INLINE void DpRow(const float* HWY_RESTRICT dm, const float* HWY_RESTRICT gate, const float* HWY_RESTRICT kk,
                      float beta_i, int64_t i, int64_t L, float* HWY_RESTRICT dp_out, float* HWY_RESTRICT dg,
                      float& db_i, float& dg_i) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto vb = hn::Set(df, beta_i);
  auto sdb = hn::Zero(df), sdg = hn::Zero(df);
  int64_t j = 0;
  for (; j + N <= i; j += N) {  // all lanes j < i
    const auto dp = hn::Mul(hn::LoadU(df, dm + j), hn::LoadU(df, gate + j));
    const auto kkv = hn::LoadU(df, kk + j);
    const auto m = hn::Mul(hn::Mul(dp, vb), kkv);
    sdb = hn::MulAdd(dp, kkv, sdb);
    sdg = hn::Add(sdg, m);
    hn::StoreU(dp, df, dp_out + j);
    hn::StoreU(hn::Sub(hn::LoadU(df, dg + j), m), df, dg + j);
  }
  float db = hn::GetLane(hn::SumOfLanes(df, sdb)), rs = hn::GetLane(hn::SumOfLanes(df, sdg));
  for (; j < i; ++j) {
    const float dp = dm[j] * gate[j], m = dp * beta_i * kk[j];
    db += dp * kk[j];
    rs += m;
    dg[j] -= m;
    dp_out[j] = dp;
  }
  for (; j < L; ++j) dp_out[j] = 0.f;
  db_i += db;
  dg_i += rs;
}

void WyBwd(const WyBwdParams& p) {
  const gdn_bwd::Dims& d = p.d;
  const std::vector<Chunk> chunks = gdn_bwd::host_chunks(d);
  const int64_t K = d.K, V = d.V, BT = d.BT, KV = K + V, items = static_cast<int64_t>(chunks.size()) * d.H;
  const gb::Gemm gemm;
  tile::parallel_blocks(items, 1, [&](int64_t i0, int64_t i1) {
    // lhs = [dW | dU] (L x (K + V)); rhs = [diag(βE) K | diag(β) V]; X = A^T dW, Y = A^T dU share one GEMM.
    gb::Arena ar(gb::ArenaSize({BT * K, BT * K, BT * BT, BT * BT, BT * KV, BT * KV, BT * KV, BT * K, BT * K, BT * K,
                                BT * BT, BT * BT, BT * BT, BT * BT, BT * V, BT, BT, BT, BT, BT}));
    float *kbuf = ar.take(BT * K), *kb = ar.take(BT * K), *kk = ar.take(BT * BT), *Ab = ar.take(BT * BT);
    float *lhs = ar.take(BT * KV), *rhs = ar.take(BT * KV), *xy = ar.take(BT * KV);
    float *dk = ar.take(BT * K), *dks = ar.take(BT * K), *dpk = ar.take(BT * K);
    float *dA = ar.take(BT * BT), *tmp = ar.take(BT * BT), *dM = ar.take(BT * BT), *gate = ar.take(BT * BT);
    float *vvb = ar.take(BT * V), *gam = ar.take(BT), *beta = ar.take(BT), *E = ar.take(BT), *db = ar.take(BT);
    float* dg = ar.take(BT);
    for (int64_t it = i0; it < i1; ++it) {
      const Chunk& c = chunks[it / d.H];
      const int64_t h = it % d.H, L = c.t1 - c.t0;
      int64_t ldk, lda, ldv;
      const float* k = gb::TokF32(p.k, c.b, c.t0, h, L, K, kbuf, ldk);
      gemm(false, true, L, L, K, 1.f, k, ldk, k, ldk, 0.f, kk, L);
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        gb::LoadScalars(p.g, c.b, c.t0, hv, L, gam);
        gb::LoadScalars(p.beta, c.b, c.t0, hv, L, beta);
        for (int64_t i = 0; i < L; ++i) E[i] = std::exp(gam[i]);
        const float* A = gb::TokF32(p.A, c.b, c.t0, hv, L, L, Ab, lda);
        gb::LoadTok(p.dw, c.b, c.t0, hv, L, K, lhs, KV);
        gb::LoadTok(p.du, c.b, c.t0, hv, L, V, lhs + K, KV);
        const float* vv = gb::TokF32(p.v, c.b, c.t0, hv, L, V, vvb, ldv);
        // rhs^T [(K + V) x L]: column j = [β_j E_j k_j ; β_j v_j] (built transposed so that dA below is a plain GEMM)
        for (int64_t i = 0; i < L; ++i) {
          const float fk = beta[i] * E[i];
          for (int64_t x = 0; x < K; ++x) rhs[x * L + i] = fk * k[i * ldk + x];
          for (int64_t e = 0; e < V; ++e) rhs[(K + e) * L + i] = beta[i] * vv[i * ldv + e];
        }
        // [X | Y] = A^T [dW | dU]
        gemm(true, false, L, KV, L, 1.f, A, lda, lhs, KV, 0.f, xy, KV);
        for (int64_t i = 0; i < L; ++i) {
          const float* x = xy + i * KV;
          const float xk = gb::RowDot(x, k + i * ldk, K);
          const float yv = gb::RowDot(x + K, vv + i * ldv, V);
          db[i] = E[i] * xk + yv;
          dg[i] = beta[i] * E[i] * xk;
          for (int64_t xi = 0; xi < K; ++xi) dk[i * K + xi] = beta[i] * E[i] * x[xi];
          for (int64_t e = 0; e < V; ++e) xy[i * KV + K + e] *= beta[i];  // dv = diag(β) Y
        }
        gb::StoreTok(p.dv, c.b, c.t0, hv, L, V, xy + K, KV);
        // dA = StrictLower([dW | dU] [diag(βE) K | diag(β) V]^T)
        gemm(false, false, L, L, KV, 1.f, lhs, KV, rhs, L, 0.f, dA, L);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = i; j < L; ++j) dA[i * L + j] = 0.f;
        // dM = -StrictLower((A^T dA) A^T)
        gemm(true, false, L, L, L, 1.f, A, lda, dA, L, 0.f, tmp, L);
        gemm(false, true, L, L, L, -1.f, tmp, L, A, lda, 0.f, dM, L);
        // dP = dM ⊙ Γ (stored in dA), gate and beta terms; kb = diag(β) K
        gb::GateMatrix<gb::Gate::kStrictLower>(gam, L, gate, L);
        for (int64_t i = 0; i < L; ++i) {
          DpRow(dM + i * L, gate + i * L, kk + i * L, beta[i], i, L, dA + i * L, dg, db[i], dg[i]);
          for (int64_t x = 0; x < K; ++x) kb[i * K + x] = beta[i] * k[i * ldk + x];
        }
        // dk += diag(β) dP K + dP^T diag(β) K
        gemm(false, false, L, K, L, 1.f, dA, L, k, ldk, 0.f, dpk, K);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t x = 0; x < K; ++x) dk[i * K + x] += beta[i] * dpk[i * K + x];
        gemm(true, false, L, K, L, 1.f, dA, L, kb, K, 1.f, dk, K);
        gb::StoreScalars(p.dbeta, c.b, c.t0, hv, L, db);
        if (p.dg.present()) gb::StoreScalars(p.dg, c.b, c.t0, hv, L, dg);
        const bool first = hv == h * d.G;
        for (int64_t e = 0; e < L * K; ++e) dks[e] = first ? dk[e] : dks[e] + dk[e];
      }
      gb::StoreTok(p.dk, c.b, c.t0, h, L, K, dks, K);
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
