// CUDA kernels of chunk_bwd_dqkwg ("cuda.sm90.chunk_tile"). Main kernel: one 256-thread block per
// (window, value head, 64-column tile of K) on grid.x (grid-stride). Per chunk of the window:
//   Ds     = scale Lower((dO Vn^T) ⊙ Γ)                       (contraction over V in 64-column tiles)
//   dQ     = diag(scale E) dO S^T + Ds K          [:, tile]
//   dK_int = diag(exp(γ_last - γ)) Vn dS^T ;  dK = dK_int + Ds^T Q   [:, tile]
//   dW     = -dV S^T                              [:, tile]  (written directly)
//   dγ partial over the tile's K columns (+ exp(γ_last) <S, dS> and Σ k·dK_int over them on the last row)
// dQ, dK go per value head to an f32 workspace [B, T, HV, K] and dγ partials to [K tiles, B, T, HV]; two
// reduction kernels then sum dq/dk over the G value heads of each q/k head and dγ over the K tiles, both in
// increasing index order (deterministic, no atomics; launch_reduce_heads / launch_reduce_tiles of cuda_common). f32 SIMT FMA block GEMMs (cuda_common.cuh).
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_common.cuh"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;

// Shared memory: sA, sB operand tiles, sDs, γ, row factors, row-sum scratch [64][16], dγ rows, block scratch.
constexpr size_t kSmem = (3 * kTileFloats + 4 * kTile + kTile * 16 + kThreads) * sizeof(float);

struct Ws {
  int64_t* offs;
  float *dq, *dk, *dg;
};

inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }

Ws carve(void* base, const Dims& d) {
  char* p = static_cast<char*>(base);
  Ws w;
  w.offs = reinterpret_cast<int64_t*>(p);
  p += align256(chunk_offsets_bytes(d));
  const size_t per = static_cast<size_t>(d.B * d.T * d.HV * d.K) * sizeof(float);
  w.dq = reinterpret_cast<float*>(p);
  p += align256(per);
  w.dk = reinterpret_cast<float*>(p);
  p += align256(per);
  w.dg = reinterpret_cast<float*>(p);
  return w;
}

int64_t k_tiles(const Dims& d) { return d.K > 0 ? (d.K + kTile - 1) / kTile : 1; }

__global__ void __launch_bounds__(kThreads) dqkwg_kernel(DqkwgParams p, Ws ws, int64_t items, int64_t ktiles) {
  extern __shared__ float smem[];
  float* sA = smem;
  float* sB = sA + kTileFloats;
  float* sDs = sB + kTileFloats;
  float* sG = sDs + kTileFloats;
  float* sE = sG + kTile;   // scale exp(γ)
  float* sF = sE + kTile;   // exp(γ_last - γ)
  float* sDg = sF + kTile;  // dγ partial per row
  float* red = sDg + kTile;
  float* red2 = red + kTile * 16;
  const Dims& d = p.d;
  const bool want_dg = p.dg.present();
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t kt = item % ktiles, hv = item / ktiles % d.HV, w = item / (ktiles * d.HV), h = hv / d.G;
    const int64_t x0 = kt * kTile;
    const int kc = static_cast<int>(d.K - x0 < kTile ? (d.K - x0 > 0 ? d.K - x0 : 0) : kTile);
    for_each_chunk(d, ws.offs, w, [&](const DevChunk& c) {
      if (c.hc >= d.NT) return;  // only with invalid cu_seqlens (uniform across the block)
      const int L = static_cast<int>(c.t1 - c.t0);
      const int64_t hbase = p.h.off(c.b, c.hc, hv, x0), dhbase = p.dh.off(c.b, c.hc, hv, x0);
      __syncthreads();
      if (threadIdx.x < kTile) {
        sG[threadIdx.x] = p.g.present() && threadIdx.x < L ? ld_f32(p.g, p.g.off(c.b, c.t0 + threadIdx.x, hv)) : 0.f;
        sDg[threadIdx.x] = 0.f;
      }
      __syncthreads();
      const float gl = sG[L - 1];
      if (threadIdx.x < kTile) {
        sE[threadIdx.x] = threadIdx.x < L ? p.scale * expf(sG[threadIdx.x]) : 0.f;
        sF[threadIdx.x] = threadIdx.x < L ? expf(gl - sG[threadIdx.x]) : 0.f;
      }
      // Ds = scale Lower(dO Vn^T ⊙ Γ); dQ1 = dO S^T; dKi = Vn dS^T; dW = -dV S^T (all over V tiles)
      float ds[4][4], dq[4][4], dk[4][4], dw[4][4];
      zero(ds), zero(dq), zero(dk), zero(dw);
      for (int64_t e0 = 0; e0 < d.V; e0 += kTile) {
        const int vc = static_cast<int>(d.V - e0 < kTile ? d.V - e0 : kTile);
        __syncthreads();
        load_tile(sA, p.dout, p.dout.off(c.b, c.t0, hv) + e0, p.dout.s[1], L, vc);
        load_tile(sB, p.v, p.v.off(c.b, c.t0, hv) + e0, p.v.s[1], L, vc);
        load_tile(sDs, p.h, hbase + e0, p.h.s[3], kc, vc);  // S[x][e] (sDs is free until Ds is stored)
        __syncthreads();
        mma<false, true>(ds, sA, sB);   // dO Vn^T
        mma<false, true>(dq, sA, sDs);  // dO S^T
        __syncthreads();
        load_tile(sA, p.dh, dhbase + e0, p.dh.s[3], kc, vc);  // dS[x][e]
        __syncthreads();
        mma<false, true>(dk, sB, sA);  // Vn dS^T
        if (p.dw.present()) {
          __syncthreads();
          load_tile(sB, p.dv, p.dv.off(c.b, c.t0, hv) + e0, p.dv.s[1], L, vc);
          __syncthreads();
          mma<false, true>(dw, sB, sDs);  // dV S^T
        }
      }
      __syncthreads();
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int i = row_of(a), j = col_of(b);
          sDs[i * kLd + j] = (j <= i && i < L) ? p.scale * ds[a][b] * expf(sG[i] - sG[j]) : 0.f;
          dq[a][b] *= sE[i];
          dk[a][b] *= sF[i];
          if (p.dw.present() && i < L && j < kc) st_f32(p.dw, p.dw.off(c.b, c.t0 + i, hv) + x0 + j, -dw[a][b]);
        }
      // Σ k·dK_int over this tile's columns (for the last row's dγ), and <S, dS> over the tile's rows.
      __syncthreads();
      load_tile(sA, p.k, p.k.off(c.b, c.t0, h) + x0, p.k.s[1], L, kc);
      load_tile(sB, p.q, p.q.off(c.b, c.t0, h) + x0, p.q.s[1], L, kc);
      __syncthreads();
      float kdki = 0.f;
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) kdki += sA[row_of(a) * kLd + col_of(b)] * dk[a][b];
      float sds = 0.f;
      if (want_dg)
        for (int e = threadIdx.x; e < kc * d.V; e += kThreads) {
          const int x = static_cast<int>(e / d.V);
          const int64_t col = e - static_cast<int64_t>(x) * d.V;
          sds += ld_f32(p.h, p.h.off(c.b, c.hc, hv, x0 + x) + col) * ld_f32(p.dh, p.dh.off(c.b, c.hc, hv, x0 + x) + col);
        }
      const float kdki_sum = want_dg ? block_sum(kdki, red2) : 0.f;
      const float sds_sum = want_dg ? block_sum(sds, red2) : 0.f;
      // dQ += Ds K ; dK += Ds^T Q
      mma<false, false>(dq, sDs, sA);
      mma<true, false>(dk, sDs, sB);
      float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int i = row_of(a), x = col_of(b);
          part[a] += sB[i * kLd + x] * dq[a][b] - sA[i * kLd + x] * dk[a][b];
          if (i < L && x < kc) {
            const int64_t o = ((((c.b * d.T) + c.t0 + i) * d.HV) + hv) * d.K + x0 + x;
            ws.dq[o] = dq[a][b];
            ws.dk[o] = dk[a][b];
          }
        }
      if (want_dg) {
        add_row_sums(part, red, sDg);
        if (threadIdx.x < L) {
          float v = sDg[threadIdx.x];
          if (threadIdx.x == L - 1) v += expf(gl) * sds_sum + kdki_sum;
          ws.dg[(kt * d.B * d.T + c.b * d.T + c.t0 + threadIdx.x) * d.HV + hv] = v;
        }
      }
      __syncthreads();
    });
  }
}

}  // namespace

size_t chunk_bwd_dqkwg_cuda_fma_workspace(const Dims& d) {
  const size_t per = static_cast<size_t>(d.B * d.T * d.HV * d.K) * sizeof(float);
  return align256(chunk_offsets_bytes(d)) + 2 * align256(per) +
         static_cast<size_t>(k_tiles(d) * d.B * d.T * d.HV) * sizeof(float);
}

int chunk_bwd_dqkwg_cuda_fma(const DqkwgParams& p, void* workspace, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  const Ws ws = carve(workspace, d);
  const int64_t ktiles = k_tiles(d), items = num_windows(d) * d.HV * ktiles;
  if (items > 0) {
    STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, ws.offs, stream));
    STRATA_CUDA_TRY(
        cudaFuncSetAttribute(dqkwg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
    const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
    dqkwg_kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(p, ws, items, ktiles);
    STRATA_RETURN_IF_ERROR(cuda::check_launch("chunk_bwd_dqkwg (chunk_tile)"));
  }
  STRATA_RETURN_IF_ERROR(launch_reduce_heads(ws.dq, d, p.dq, stream));
  STRATA_RETURN_IF_ERROR(launch_reduce_heads(ws.dk, d, p.dk, stream));
  if (p.dg.present()) STRATA_RETURN_IF_ERROR(launch_reduce_tiles(ws.dg, ktiles, d, p.dg, stream));
  return STRATA_SUCCESS;
}

}  // namespace strata::linear_attn
