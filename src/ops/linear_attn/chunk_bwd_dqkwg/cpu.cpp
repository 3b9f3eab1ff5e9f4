// CPU kernels of chunk_bwd_dqkwg, written once and compiled for every Highway target ("cpu.<isa>").
//
// Work item = (chunk, q/k head h). Per value head hv of the group, in increasing hv order (f32 GEMMs of the
// fp32 micro-kernel; Sᵀ operands are packed by it):
//   Ds  = dO Vn^T ⊙ scale Γ (lower, diagonal included; the exponent is formed only there)     L x L x V
//   dQ  = diag(scale E) dO S^T  + Ds K                                                           L x K x (V, L)
//   dKi = diag(exp(γ_last - γ)) Vn dS^T ;  dK = dKi + Ds^T Q                                     L x K x (V, L)
//   dW  = -dV S^T                                                                                L x K x V
//   dγ  = rowdot(Q, dQ) - rowdot(K, dK) ;  dγ_last += exp(γ_last) <S, dS> + Σ rowdot(K, dKi)
// and dQ, dK are added into the group's f32 sums (the GVA reduction, fixed order), written once at the end.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/chunk_bwd_dqkwg/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/cpu-inl.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::HWY_NAMESPACE {
namespace gb = gdn_bwd::HWY_NAMESPACE;
using gdn_bwd::Chunk;

void Dqkwg(const DqkwgParams& p) {
  const gdn_bwd::Dims& d = p.d;
  const std::vector<Chunk> chunks = gdn_bwd::host_chunks(d);
  const int64_t K = d.K, V = d.V, BT = d.BT, items = static_cast<int64_t>(chunks.size()) * d.H;
  const gb::Gemm gemm;
  tile::parallel_blocks(items, 1, [&](int64_t i0, int64_t i1) {
    gb::Arena ar(gb::ArenaSize({BT * K, BT * K, BT * K, BT * K, BT * K, BT * K, BT * K, BT * V, BT * V, BT * V, K * V,
                                K * V, K * V, K * V, BT * BT, BT * BT, BT, BT}));
    float *qb = ar.take(BT * K), *kb = ar.take(BT * K), *dq = ar.take(BT * K), *dk = ar.take(BT * K);
    float *dqs = ar.take(BT * K), *dks = ar.take(BT * K), *tmp = ar.take(BT * K);
    float *dOb = ar.take(BT * V), *vnb = ar.take(BT * V), *dvb = ar.take(BT * V);
    float *Sb = ar.take(K * V), *dSb = ar.take(K * V), *St = ar.take(K * V), *dSt = ar.take(K * V);
    float *Ds = ar.take(BT * BT), *gate = ar.take(BT * BT), *gam = ar.take(BT), *dg = ar.take(BT);
    for (int64_t it = i0; it < i1; ++it) {
      const Chunk& c = chunks[it / d.H];
      const int64_t h = it % d.H, L = c.t1 - c.t0;
      int64_t ldq, ldk, ldo, ldv, lds, ldds, lddv;
      const float* q = gb::TokF32(p.q, c.b, c.t0, h, L, K, qb, ldq);
      const float* k = gb::TokF32(p.k, c.b, c.t0, h, L, K, kb, ldk);
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        gb::LoadScalars(p.g, c.b, c.t0, hv, L, gam);
        const float gl = gam[L - 1];
        const float* dO = gb::TokF32(p.dout, c.b, c.t0, hv, L, V, dOb, ldo);
        const float* vn = gb::TokF32(p.v, c.b, c.t0, hv, L, V, vnb, ldv);
        const float* S = gb::RowsF32(p.h, p.h.off(c.b, c.hc, hv, 0), p.h.s[3], K, V, Sb, lds);
        const float* dS = gb::RowsF32(p.dh, p.dh.off(c.b, c.hc, hv, 0), p.dh.s[3], K, V, dSb, ldds);
        // Ds = scale Lower(dO Vn^T ⊙ Γ)
        gemm(false, true, L, L, V, 1.f, dO, ldo, vn, ldv, 0.f, Ds, L);
        gb::GateMatrix<gb::Gate::kLower>(gam, L, gate, L);
        for (int64_t e = 0; e < L * L; ++e) Ds[e] *= p.scale * gate[e];
        // S^T and dS^T once ([V, K]): the three products with them become plain row-major GEMMs.
        gb::Transpose(S, lds, K, V, St);
        gb::Transpose(dS, ldds, K, V, dSt);
        // dQ = diag(scale E) dO S^T + Ds K
        gemm(false, false, L, K, V, 1.f, dO, ldo, St, K, 0.f, dq, K);
        for (int64_t i = 0; i < L; ++i) {
          const float f = p.scale * std::exp(gam[i]);
          for (int64_t x = 0; x < K; ++x) dq[i * K + x] *= f;
        }
        gemm(false, false, L, K, L, 1.f, Ds, L, k, ldk, 1.f, dq, K);
        // dK_int = diag(exp(γ_last - γ)) Vn dS^T ; dK = dK_int + Ds^T Q
        gemm(false, false, L, K, V, 1.f, vn, ldv, dSt, K, 0.f, dk, K);
        float kdki = 0.f;
        for (int64_t i = 0; i < L; ++i) {
          const float f = std::exp(gl - gam[i]);
          for (int64_t x = 0; x < K; ++x) dk[i * K + x] *= f;
          kdki += gb::RowDot(k + i * ldk, dk + i * K, K);
        }
        gemm(true, false, L, K, L, 1.f, Ds, L, q, ldq, 1.f, dk, K);
        if (p.dw.present()) {  // dW = -dV S^T
          const float* dv = gb::TokF32(p.dv, c.b, c.t0, hv, L, V, dvb, lddv);
          gemm(false, false, L, K, V, -1.f, dv, lddv, St, K, 0.f, tmp, K);
          gb::StoreTok(p.dw, c.b, c.t0, hv, L, K, tmp, K);
        }
        if (p.dg.present()) {
          for (int64_t i = 0; i < L; ++i)
            dg[i] = gb::RowDot(q + i * ldq, dq + i * K, K) - gb::RowDot(k + i * ldk, dk + i * K, K);
          float sds = 0.f;  // <S, dS>, row by row in a fixed order
          for (int64_t x = 0; x < K; ++x) sds += gb::RowDot(S + x * lds, dS + x * ldds, V);
          dg[L - 1] += std::exp(gl) * sds + kdki;
          gb::StoreScalars(p.dg, c.b, c.t0, hv, L, dg);
        }
        const bool first = hv == h * d.G;
        for (int64_t e = 0; e < L * K; ++e) {
          dqs[e] = first ? dq[e] : dqs[e] + dq[e];
          dks[e] = first ? dk[e] : dks[e] + dk[e];
        }
      }
      gb::StoreTok(p.dq, c.b, c.t0, h, L, K, dqs, K);
      gb::StoreTok(p.dk, c.b, c.t0, h, L, K, dks, K);
    }
  });
}

}  // namespace strata::linear_attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::linear_attn {
HWY_EXPORT(Dqkwg);
DqkwgCpuFn chunk_bwd_dqkwg_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(Dqkwg, hwy_target); }
}  // namespace strata::linear_attn
#endif
