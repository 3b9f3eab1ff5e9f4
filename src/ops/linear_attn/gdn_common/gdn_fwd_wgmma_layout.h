// Shared-memory slots of the fused GDN state + output pass on Hopper warpgroup MMA (gdn_fwd_cuda_wgmma.cu), on
// top of the generic K-major core-matrix tiles and descriptors of tile/cuda/wgmma_layout.h (re-exported here as
// wgl::). Host + device so that tests/cpp/test_gdn_fwd_wgmma_layout.cpp checks them on the CPU. Only K-major
// operands are used (no transposed wgmma): tiles whose contraction index is the row (Kᵀ in the state update) are
// read into registers with ldmatrix.trans, and the operands the pass forms from accumulators (S, v_new, Vd) are
// written transposed with stmatrix.trans.
#pragma once

#include <cstdint>

#include "ops/linear_attn/gdn_common/gdn_common.h"  // STRATA_HD
#include "tile/cuda/wgmma_layout.h"

namespace strata::linear_attn::gdn::wgl {

// The generic K-major tile layout, descriptors and fragment coordinates (tile/cuda/wgmma_layout.h).
using strata::cuda::wgmma::acc_col;
using strata::cuda::wgmma::acc_row;
using strata::cuda::wgmma::cb_desc;
using strata::cuda::wgmma::cb_ld_trans_off;
using strata::cuda::wgmma::cb_off;
using strata::cuda::wgmma::ld_trans_off;
using strata::cuda::wgmma::make_desc;
using strata::cuda::wgmma::st_trans_off;
using strata::cuda::wgmma::tile_desc;
using strata::cuda::wgmma::tile_off;

// cp.async slots of the 256 threads of a block: 16-byte segment q (columns 8q..8q+7) of row r. The 8 threads of
// one 128-byte shared-memory wavefront take 8 consecutive rows of one core-matrix column (distinct banks), and a
// thread's rows differ by whole rows of core matrices (16 for the 128-column K / W / Q tiles, 4 passes; 32 for the
// 64-column P tile, 2 passes), so its destination moves by a constant per pass.
STRATA_HD constexpr int kwq_row(int tid, int it) { return (tid & 7) + 8 * (tid >> 7) + 16 * it; }
STRATA_HD constexpr int kwq_seg(int tid) { return (tid >> 3) & 15; }
STRATA_HD constexpr int p_row(int tid, int it) { return (tid & 7) + 8 * (tid >> 6) + 32 * it; }
STRATA_HD constexpr int p_seg(int tid) { return (tid >> 3) & 7; }

#if defined(__CUDACC__)
// (Session 13, GdnFwdParams::qk_norm) acc + Σ x² over the 8 bf16 values of a 16-byte segment of a row (low half of
// each word first, f32 FMA in that order): the row norms of the folded l2norm (prep_wgmma's K rows from its panels,
// the wgmma pass's Q rows from its Q tile).
__device__ __forceinline__ float sum_sq_bf16x8(uint4 v, float acc) {
  const uint32_t x4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float lo = __uint_as_float(x4[e] << 16), hi = __uint_as_float(x4[e] & 0xffff0000u);
    acc = fmaf(lo, lo, acc);
    acc = fmaf(hi, hi, acc);
  }
  return acc;
}
#endif

}  // namespace strata::linear_attn::gdn::wgl
