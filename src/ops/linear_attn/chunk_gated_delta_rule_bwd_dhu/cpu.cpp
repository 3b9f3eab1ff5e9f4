// CPU kernels of chunk_gated_delta_rule_bwd_dhu, written once and compiled for every Highway target.
//
// Work item = (sequence n, value head hv, V-tile of up to kVT = 128 columns): the recurrence is independent per
// column of dS (K x V), so V is split for parallelism. dS stays in an f32 buffer [K, VT] across the chunks.
// Per chunk (reverse order), with Kc, Qc, Wc the chunk's rows:
//   dh[c] = dS;  dVn = dv + diag(exp(γ_last - γ)) Kc dS          (GEMM L x VT x K)
//   dS    = exp(γ_last) dS + [scale diag(E) Qc ; Wc]^T [dO ; -dVn] (one GEMM K x VT over 2L: the two updates
//                                                                   share the contraction)
// Fixed work split: every output comes from one item in chunk order (same bits for any thread count).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/gdn_bwd_common/cpu-inl.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::HWY_NAMESPACE {
namespace gb = gdn_bwd::HWY_NAMESPACE;
using gdn_bwd::Seq;

// V columns per item: 128 amortises the per-chunk loads of q and w (K x L each) over more columns of dS while
// keeping dS (K x 128 f32 = 128 KiB at K = 256) in L2.
constexpr int64_t kVT = 128;

void Dhu(const DhuParams& p) {
  const gdn_bwd::Dims& d = p.d;
  const std::vector<Seq> seqs = gdn_bwd::host_sequences(d);
  const int64_t K = d.K, V = d.V, BT = d.BT;
  const int64_t vtiles = V > 0 ? (V + kVT - 1) / kVT : 1;
  const int64_t items = static_cast<int64_t>(seqs.size()) * d.HV * vtiles;
  const gb::Gemm gemm;
  tile::parallel_blocks(items, 1, [&](int64_t i0, int64_t i1) {
    gb::Arena ar(gb::ArenaSize({K * kVT, BT * K, 2 * BT * K, 2 * BT * kVT, BT * kVT, BT}));
    float *dS = ar.take(K * kVT), *kcb = ar.take(BT * K), *ab = ar.take(2 * BT * K), *bb = ar.take(2 * BT * kVT);
    float *dvn = ar.take(BT * kVT), *gam = ar.take(BT);
    for (int64_t it = i0; it < i1; ++it) {
      const Seq& s = seqs[it / (d.HV * vtiles)];
      const int64_t hv = it / vtiles % d.HV, v0 = it % vtiles * kVT, VT = std::min(kVT, V - v0);
      const int64_t h = hv / d.G;
      if (VT <= 0) continue;
      if (p.dht.present()) gb::LoadRows(p.dht, p.dht.off(s.n, hv, 0) + v0, p.dht.s[2], K, VT, dS, VT);
      else std::fill(dS, dS + K * VT, 0.f);
      const int64_t nc = (s.eos - s.bos + BT - 1) / BT;
      for (int64_t c = nc - 1; c >= 0; --c) {
        const int64_t t0 = s.bos + c * BT, L = std::min(BT, s.eos - t0);
        gb::StoreRows(p.dh, p.dh.off(s.b, s.hc0 + c, hv, 0) + v0, p.dh.s[3], K, VT, dS, VT);
        gb::LoadScalars(p.g, s.b, t0, hv, L, gam);
        const float gl = gam[L - 1];
        // dVn = dv + diag(exp(γ_last - γ)) Kc dS
        int64_t ldk;
        const float* kc = gb::TokF32(p.k, s.b, t0, h, L, K, kcb, ldk);
        gemm(false, false, L, VT, K, 1.f, kc, ldk, dS, VT, 0.f, dvn, VT);
        gb::LoadRows(p.dv, p.dv.off(s.b, t0, hv) + v0, p.dv.s[1], L, VT, bb + L * VT, VT);  // dv rows
        for (int64_t i = 0; i < L; ++i) {
          const float f = std::exp(gl - gam[i]);
          float* row = dvn + i * VT;
          float* neg = bb + (L + i) * VT;
          for (int64_t e = 0; e < VT; ++e) {
            row[e] = neg[e] + f * row[e];
            neg[e] = -row[e];
          }
        }
        gb::StoreRows(p.dv2, p.dv2.off(s.b, t0, hv) + v0, p.dv2.s[1], L, VT, dvn, VT);
        // dS = exp(γ_last) dS + [scale E Q ; W]^T [dO ; -dVn]
        gb::LoadTok(p.q, s.b, t0, h, L, K, ab, K);
        for (int64_t i = 0; i < L; ++i) {
          const float f = p.scale * std::exp(gam[i]);
          for (int64_t x = 0; x < K; ++x) ab[i * K + x] *= f;
        }
        gb::LoadTok(p.w, s.b, t0, hv, L, K, ab + L * K, K);
        gb::LoadRows(p.dout, p.dout.off(s.b, t0, hv) + v0, p.dout.s[1], L, VT, bb, VT);
        gemm(true, false, K, VT, 2 * L, 1.f, ab, K, bb, VT, std::exp(gl), dS, VT);
      }
      if (p.dh0.present()) gb::StoreRows(p.dh0, p.dh0.off(s.n, hv, 0) + v0, p.dh0.s[2], K, VT, dS, VT);
    }
  });
}

}  // namespace strata::linear_attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::linear_attn {
HWY_EXPORT(Dhu);
DhuCpuFn chunk_gated_delta_rule_bwd_dhu_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(Dhu, hwy_target); }
}  // namespace strata::linear_attn
#endif
