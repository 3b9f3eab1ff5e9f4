// CPU kernels of chunk_bwd_dv_local, written once and compiled for every Highway target ("cpu.<isa>").
//
// Work item = (chunk, q/k head h): P = K Q^T (L x L, one GEMM shared by the G value heads of the group), then
// per value head hv: B = scale * Upper(P ⊙ exp(γ_i - γ_j)) (B[j][i] for i >= j; the exponent is formed only
// there, so it is never positive: γ is non-increasing) and dv = B dO (L x V GEMM). f32 throughout; inputs
// are converted once per chunk into L1/L2-resident buffers. Items are cut into fixed blocks
// (tile/cpu/parallel.h): every output is written by one item in a fixed order (same bits for any thread count).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/chunk_bwd_dv_local/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/gdn_bwd_common/cpu-inl.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::HWY_NAMESPACE {
namespace gb = gdn_bwd::HWY_NAMESPACE;
using gdn_bwd::Chunk;

void DvLocal(const DvLocalParams& p) {
  const gdn_bwd::Dims& d = p.d;
  const std::vector<Chunk> chunks = gdn_bwd::host_chunks(d);
  const int64_t K = d.K, V = d.V, BT = d.BT, items = static_cast<int64_t>(chunks.size()) * d.H;
  const gb::Gemm gemm;
  tile::parallel_blocks(items, 1, [&](int64_t i0, int64_t i1) {
    gb::Arena ar(gb::ArenaSize({BT * K, BT * K, BT * BT, BT * BT, BT * V, BT * V, BT}));
    float *qb = ar.take(BT * K), *kb = ar.take(BT * K), *P = ar.take(BT * BT), *Bm = ar.take(BT * BT);
    float *dOb = ar.take(BT * V), *dv = ar.take(BT * V), *gam = ar.take(BT);
    for (int64_t it = i0; it < i1; ++it) {
      const Chunk& c = chunks[it / d.H];
      const int64_t h = it % d.H, L = c.t1 - c.t0;
      int64_t ldq, ldk, ldo;
      const float* q = gb::TokF32(p.q, c.b, c.t0, h, L, K, qb, ldq);
      const float* k = gb::TokF32(p.k, c.b, c.t0, h, L, K, kb, ldk);
      gemm(false, true, L, L, K, 1.f, k, ldk, q, ldq, 0.f, P, L);  // P[j][i] = k_j . q_i
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        gb::LoadScalars(p.g, c.b, c.t0, hv, L, gam);
        gb::GateMatrix<gb::Gate::kUpper>(gam, L, Bm, L);  // exp(γ_i - γ_j), i >= j
        for (int64_t e = 0; e < L * L; ++e) Bm[e] *= p.scale * P[e];
        const float* dO = gb::TokF32(p.dout, c.b, c.t0, hv, L, V, dOb, ldo);
        gemm(false, false, L, V, L, 1.f, Bm, L, dO, ldo, 0.f, dv, V);
        gb::StoreTok(p.dv, c.b, c.t0, hv, L, V, dv, V);
      }
    }
  });
}

}  // namespace strata::linear_attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::linear_attn {
HWY_EXPORT(DvLocal);
DvLocalCpuFn chunk_bwd_dv_local_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(DvLocal, hwy_target); }
}  // namespace strata::linear_attn
#endif
