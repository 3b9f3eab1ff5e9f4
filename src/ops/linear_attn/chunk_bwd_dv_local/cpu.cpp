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
    std::vector<float> q(BT * K), k(BT * K), P(BT * BT), Bm(BT * BT), dO(BT * V), dv(BT * V), gam(BT);
    for (int64_t it = i0; it < i1; ++it) {
      const Chunk& c = chunks[it / d.H];
      const int64_t h = it % d.H, L = c.t1 - c.t0;
      gb::LoadTok(p.q, c.b, c.t0, h, L, K, q.data(), K);
      gb::LoadTok(p.k, c.b, c.t0, h, L, K, k.data(), K);
      gemm(false, true, L, L, K, 1.f, k.data(), K, q.data(), K, 0.f, P.data(), L);  // P[j][i] = k_j . q_i
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        gb::LoadScalars(p.g, c.b, c.t0, hv, L, gam.data());
        for (int64_t j = 0; j < L; ++j)
          for (int64_t i = 0; i < L; ++i)
            Bm[j * L + i] = i >= j ? p.scale * P[j * L + i] * std::exp(gam[i] - gam[j]) : 0.f;
        gb::LoadTok(p.dout, c.b, c.t0, hv, L, V, dO.data(), V);
        gemm(false, false, L, V, L, 1.f, Bm.data(), L, dO.data(), V, 0.f, dv.data(), V);
        gb::StoreTok(p.dv, c.b, c.t0, hv, L, V, dv.data(), V);
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
