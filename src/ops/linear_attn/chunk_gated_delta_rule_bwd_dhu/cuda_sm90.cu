// CUDA kernel of chunk_gated_delta_rule_bwd_dhu ("cuda.sm90.state_scan"): one 256-thread block per
// (sequence n, value head hv, 64-column tile of V) on grid.x (grid-stride: any N * HV), sequential over the
// sequence's chunks from the last. The recurrence is independent per column of dS, so the V tiles never talk.
// dS [K, 64] stays in shared memory in f32 for the whole sequence (K <= 256: up to 4 row tiles). Per chunk:
//   dh[c] = dS
//   dVn   = dv + diag(exp(γ_last - γ)) Kc dS           (contraction over K, 64-row tiles of dS)
//   dS    = exp(γ_last) dS + (scale diag(E) Qc)^T dO - Wc^T dVn   (per 64-row tile of dS)
// f32 SIMT FMA block GEMMs in a fixed order (gdn_bwd_common/cuda_common.cuh): same bits every run.
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_common.cuh"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;

constexpr int kMaxKTiles = 4;  // K <= 256
// Shared memory: dS (4 row tiles), sA, sB (dO), sDv (dVn), γ and the per-row factors.
constexpr size_t kSmem = ((kMaxKTiles + 3) * kTileFloats + 3 * kTile) * sizeof(float);

__global__ void __launch_bounds__(kThreads) dhu_kernel(DhuParams p, const int64_t* offs, int64_t items,
                                                       int64_t vtiles) {
  extern __shared__ float smem[];
  float* sS = smem;                            // dS rows x (tile x / 64), columns e: [kt][64][kLd]
  float* sA = sS + kMaxKTiles * kTileFloats;
  float* sB = sA + kTileFloats;
  float* sDv = sB + kTileFloats;
  float* sG = sDv + kTileFloats;               // γ
  float* sF = sG + kTile;                      // exp(γ_last - γ)
  float* sQ = sF + kTile;                      // scale exp(γ)
  const Dims& d = p.d;
  const int ktiles = static_cast<int>((d.K + kTile - 1) / kTile);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t vt = item % vtiles, hv = item / vtiles % d.HV, n = item / (vtiles * d.HV), h = hv / d.G;
    const int64_t e0 = vt * kTile;
    const int vc = static_cast<int>(d.V - e0 < kTile ? d.V - e0 : kTile);
    const DhuSeq sq = dhu_sequence(d, offs, n);
    const int64_t b = sq.b, bos = sq.bos, eos = sq.eos, hc0 = sq.hc0;
    __syncthreads();
    for (int kt = 0; kt < ktiles; ++kt) {
      const int kr = static_cast<int>(d.K - kt * kTile < kTile ? d.K - kt * kTile : kTile);
      if (p.dht.present())
        load_tile(sS + kt * kTileFloats, p.dht, p.dht.off(n, hv, kt * kTile) + e0, p.dht.s[2], kr, vc);
      else
        for (int e = threadIdx.x; e < kTileFloats; e += kThreads) sS[kt * kTileFloats + e] = 0.f;
    }
    const int64_t nc = (eos - bos + d.BT - 1) / d.BT;
    for (int64_t c = nc - 1; c >= 0; --c) {
      const int64_t t0 = bos + c * d.BT, hc = hc0 + c;
      const int L = static_cast<int>(eos - t0 < d.BT ? eos - t0 : d.BT);
      const bool write_dh = hc < d.NT;  // invalid cu_seqlens could point past dh
      __syncthreads();
      if (threadIdx.x < kTile) sG[threadIdx.x] = p.g.present() && threadIdx.x < L ? ld_f32(p.g, p.g.off(b, t0 + threadIdx.x, hv)) : 0.f;
      __syncthreads();
      const float gl = sG[L - 1];
      if (threadIdx.x < kTile) {
        sF[threadIdx.x] = threadIdx.x < L ? expf(gl - sG[threadIdx.x]) : 0.f;
        sQ[threadIdx.x] = threadIdx.x < L ? p.scale * expf(sG[threadIdx.x]) : 0.f;
      }
      // dh[c] = dS
      for (int kt = 0; kt < ktiles && write_dh; ++kt)
        for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
          const int r = e / kTile, col = e % kTile;
          if (kt * kTile + r < d.K && col < vc)
            st_f32(p.dh, p.dh.off(b, hc, hv, kt * kTile + r) + e0 + col, sS[kt * kTileFloats + r * kLd + col]);
        }
      // dVn = dv + diag(exp(γ_last - γ)) Kc dS
      float acc[4][4];
      zero(acc);
      for (int kt = 0; kt < ktiles; ++kt) {
        const int kc = static_cast<int>(d.K - kt * kTile < kTile ? d.K - kt * kTile : kTile);
        __syncthreads();
        load_tile(sA, p.k, p.k.off(b, t0, h) + kt * kTile, p.k.s[1], L, kc);
        __syncthreads();
        mma<false, false>(acc, sA, sS + kt * kTileFloats);
      }
      __syncthreads();
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
          const int i = row_of(a), e = col_of(bb);
          float x = 0.f;
          if (i < L && e < vc) {
            x = ld_f32(p.dv, p.dv.off(b, t0 + i, hv) + e0 + e) + sF[i] * acc[a][bb];
            st_f32(p.dv2, p.dv2.off(b, t0 + i, hv) + e0 + e, x);
          }
          sDv[i * kLd + e] = x;
        }
      load_tile(sB, p.dout, p.dout.off(b, t0, hv) + e0, p.dout.s[1], L, vc);
      const float decay = expf(gl);
      // dS = exp(γ_last) dS + (scale E Q)^T dO - W^T dVn, per 64-row tile of dS
      for (int kt = 0; kt < ktiles; ++kt) {
        const int kc = static_cast<int>(d.K - kt * kTile < kTile ? d.K - kt * kTile : kTile);
        float up[4][4], down[4][4];
        zero(up);
        zero(down);
        __syncthreads();
        load_tile(sA, p.q, p.q.off(b, t0, h) + kt * kTile, p.q.s[1], L, kc, sQ);
        __syncthreads();
        mma<true, false>(up, sA, sB);  // (scale E Q)^T dO: A(x, i) = sA[i][x]
        __syncthreads();
        load_tile(sA, p.w, p.w.off(b, t0, hv) + kt * kTile, p.w.s[1], L, kc);
        __syncthreads();
        mma<true, false>(down, sA, sDv);  // W^T dVn
        float* tile = sS + kt * kTileFloats;
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int bb = 0; bb < 4; ++bb) {
            const int x = row_of(a), e = col_of(bb);
            float& s = tile[x * kLd + e];
            s = (x < kc && e < vc) ? decay * s + (up[a][bb] - down[a][bb]) : 0.f;
          }
      }
    }
    __syncthreads();
    if (p.dh0.present())
      for (int kt = 0; kt < ktiles; ++kt)
        for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
          const int r = e / kTile, col = e % kTile;
          if (kt * kTile + r < d.K && col < vc)
            st_f32(p.dh0, p.dh0.off(n, hv, kt * kTile + r) + e0 + col, sS[kt * kTileFloats + r * kLd + col]);
        }
  }
}

}  // namespace

size_t chunk_gated_delta_rule_bwd_dhu_cuda_fma_workspace(const Dims& d) { return chunk_offsets_bytes(d); }

int chunk_gated_delta_rule_bwd_dhu_cuda_fma(const DhuParams& p, void* workspace, void* stream_ptr) {
  if (p.fuse_dv_local)
    return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_bwd_dhu cuda.sm90 (FMA): the fused dv_local (the "
                                          "composed backward's) is taken by the tensor-core kernel only");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  const int64_t vtiles = d.V > 0 ? (d.V + kTile - 1) / kTile : 0;
  const int64_t items = d.N * d.HV * vtiles;
  if (items == 0) return STRATA_SUCCESS;  // V = 0 or no sequence: every output is empty
  int64_t* offs = static_cast<int64_t*>(workspace);
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  STRATA_CUDA_TRY(
      cudaFuncSetAttribute(dhu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  dhu_kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(p, offs, items, vtiles);
  return cuda::check_launch("chunk_gated_delta_rule_bwd_dhu (state_scan)");
}

}  // namespace strata::linear_attn
