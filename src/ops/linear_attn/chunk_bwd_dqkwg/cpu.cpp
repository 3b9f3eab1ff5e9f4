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
    std::vector<float> q(BT * K), k(BT * K), dq(BT * K), dk(BT * K), dqs(BT * K), dks(BT * K), tmp(BT * K);
    std::vector<float> dO(BT * V), vn(BT * V), dv(BT * V), S(K * V), dS(K * V), Ds(BT * BT), gam(BT), dg(BT);
    for (int64_t it = i0; it < i1; ++it) {
      const Chunk& c = chunks[it / d.H];
      const int64_t h = it % d.H, L = c.t1 - c.t0;
      gb::LoadTok(p.q, c.b, c.t0, h, L, K, q.data(), K);
      gb::LoadTok(p.k, c.b, c.t0, h, L, K, k.data(), K);
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        gb::LoadScalars(p.g, c.b, c.t0, hv, L, gam.data());
        const float gl = gam[L - 1];
        gb::LoadTok(p.dout, c.b, c.t0, hv, L, V, dO.data(), V);
        gb::LoadTok(p.v, c.b, c.t0, hv, L, V, vn.data(), V);
        gb::LoadState(p.h, p.h.off(c.b, c.hc, hv, 0), p.h.s[3], K, V, S.data());
        gb::LoadState(p.dh, p.dh.off(c.b, c.hc, hv, 0), p.dh.s[3], K, V, dS.data());
        // Ds = scale Lower(dO Vn^T ⊙ Γ)
        gemm(false, true, L, L, V, 1.f, dO.data(), V, vn.data(), V, 0.f, Ds.data(), L);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < L; ++j)
            Ds[i * L + j] = j <= i ? p.scale * Ds[i * L + j] * std::exp(gam[i] - gam[j]) : 0.f;
        // dQ = diag(scale E) dO S^T + Ds K
        gemm(false, true, L, K, V, 1.f, dO.data(), V, S.data(), V, 0.f, dq.data(), K);
        for (int64_t i = 0; i < L; ++i) {
          const float f = p.scale * std::exp(gam[i]);
          for (int64_t x = 0; x < K; ++x) dq[i * K + x] *= f;
        }
        gemm(false, false, L, K, L, 1.f, Ds.data(), L, k.data(), K, 1.f, dq.data(), K);
        // dK_int = diag(exp(γ_last - γ)) Vn dS^T ; dK = dK_int + Ds^T Q
        gemm(false, true, L, K, V, 1.f, vn.data(), V, dS.data(), V, 0.f, dk.data(), K);
        float kdki = 0.f;
        for (int64_t i = 0; i < L; ++i) {
          const float f = std::exp(gl - gam[i]);
          for (int64_t x = 0; x < K; ++x) dk[i * K + x] *= f;
          kdki += gb::RowDot(k.data() + i * K, dk.data() + i * K, K);
        }
        gemm(true, false, L, K, L, 1.f, Ds.data(), L, q.data(), K, 1.f, dk.data(), K);
        if (p.dw.present()) {  // dW = -dV S^T
          gb::LoadTok(p.dv, c.b, c.t0, hv, L, V, dv.data(), V);
          gemm(false, true, L, K, V, -1.f, dv.data(), V, S.data(), V, 0.f, tmp.data(), K);
          gb::StoreTok(p.dw, c.b, c.t0, hv, L, K, tmp.data(), K);
        }
        if (p.dg.present()) {
          for (int64_t i = 0; i < L; ++i)
            dg[i] = gb::RowDot(q.data() + i * K, dq.data() + i * K, K) -
                    gb::RowDot(k.data() + i * K, dk.data() + i * K, K);
          dg[L - 1] += std::exp(gl) * gb::RowDot(S.data(), dS.data(), K * V) + kdki;
          gb::StoreScalars(p.dg, c.b, c.t0, hv, L, dg.data());
        }
        const bool first = hv == h * d.G;
        for (int64_t e = 0; e < L * K; ++e) {
          dqs[e] = first ? dq[e] : dqs[e] + dq[e];
          dks[e] = first ? dk[e] : dks[e] + dk[e];
        }
      }
      gb::StoreTok(p.dq, c.b, c.t0, h, L, K, dqs.data(), K);
      gb::StoreTok(p.dk, c.b, c.t0, h, L, K, dks.data(), K);
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
