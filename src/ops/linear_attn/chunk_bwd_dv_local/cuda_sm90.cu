// CUDA kernel of chunk_bwd_dv_local ("cuda.sm90.chunk_tile"): one 256-thread block per (window, value head),
// grid-stride over all of them on grid.x (no gridDim.y/z limit; any N * HV). Per chunk of the window:
//   P  = K Q^T                       64 x 64, contraction over K in 64-column tiles (shared memory)
//   Bm = scale Upper(P ⊙ exp(γ_i - γ_j))  (B[j][i], i >= j; the exponent is formed only there: it is <= 0)
//   dv = Bm dO                       per 64-column tile of V
// f32 SIMT FMA block GEMMs (gdn_bwd_common/cuda_common.cuh): every element is summed in a fixed order, no
// atomics, so results are the same bits run to run. Rows past the chunk end are zero in every tile and are
// never written.
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_common.cuh"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;

// Shared memory: sA, sB operand tiles, sP (the masked intra matrix), γ.
constexpr size_t kSmem = (3 * kTileFloats + kTile) * sizeof(float);

__global__ void __launch_bounds__(kThreads) dv_local_kernel(DvLocalParams p, const int64_t* offs, int64_t items) {
  extern __shared__ float smem[];
  float* sA = smem;
  float* sB = sA + kTileFloats;
  float* sP = sB + kTileFloats;
  float* sG = sP + kTileFloats;
  const Dims& d = p.d;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t w = item / d.HV, hv = item % d.HV, h = hv / d.G;
    for_each_chunk(d, offs, w, [&](const DevChunk& c) {
      const int L = static_cast<int>(c.t1 - c.t0);
      if (threadIdx.x < kTile)
        sG[threadIdx.x] = p.g.present() && threadIdx.x < L ? ld_f32(p.g, p.g.off(c.b, c.t0 + threadIdx.x, hv)) : 0.f;
      float acc[4][4];
      zero(acc);
      for (int64_t x0 = 0; x0 < d.K; x0 += kTile) {
        const int kc = static_cast<int>(d.K - x0 < kTile ? d.K - x0 : kTile);
        __syncthreads();
        load_tile(sA, p.k, p.k.off(c.b, c.t0, h) + x0, p.k.s[1], L, kc);
        load_tile(sB, p.q, p.q.off(c.b, c.t0, h) + x0, p.q.s[1], L, kc);
        __syncthreads();
        mma<false, true>(acc, sA, sB);  // P[j][i] = k_j . q_i
      }
      __syncthreads();
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int j = row_of(a), i = col_of(b);
          sP[j * kLd + i] = (i >= j && i < L) ? p.scale * acc[a][b] * expf(sG[i] - sG[j]) : 0.f;
        }
      for (int64_t e0 = 0; e0 < d.V; e0 += kTile) {
        const int vc = static_cast<int>(d.V - e0 < kTile ? d.V - e0 : kTile);
        __syncthreads();
        load_tile(sB, p.dout, p.dout.off(c.b, c.t0, hv) + e0, p.dout.s[1], L, vc);
        __syncthreads();
        float o[4][4];
        zero(o);
        mma<false, false>(o, sP, sB);
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int j = row_of(a), e = col_of(b);
            if (j < L && e < vc) st_f32(p.dv, p.dv.off(c.b, c.t0 + j, hv) + e0 + e, o[a][b]);
          }
      }
      __syncthreads();
    });
  }
}

}  // namespace

size_t chunk_bwd_dv_local_cuda_fma_workspace(const Dims& d) { return chunk_offsets_bytes(d); }

int chunk_bwd_dv_local_cuda_fma(const DvLocalParams& p, void* workspace, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  const int64_t items = num_windows(d) * d.HV;
  if (items == 0) return STRATA_SUCCESS;
  int64_t* offs = static_cast<int64_t*>(workspace);
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  STRATA_CUDA_TRY(cudaFuncSetAttribute(dv_local_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  dv_local_kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(p, offs, items);
  return cuda::check_launch("chunk_bwd_dv_local (chunk_tile)");
}

}  // namespace strata::linear_attn
