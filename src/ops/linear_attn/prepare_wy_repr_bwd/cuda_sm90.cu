// CUDA kernel of prepare_wy_repr_bwd ("cuda.sm90.chunk_tile"): one 256-thread block per (window, value head)
// on grid.x (grid-stride). Per chunk of the window (64 x 64 shared tiles, f32 SIMT FMA block GEMMs):
//   dWK = dW K^T, dUV = dU V^T, KK = K K^T          (contractions over K and V in 64-column tiles)
//   dA  = StrictLower(dWK diag(βE) + dUV diag(β))   (the β_j E_j, β_j factors scale columns: pulled out)
//   dM  = -StrictLower((A^T dA) A^T) ; dP = dM ⊙ Γ ; Sym = diag(β) dP + (diag(β) dP)^T
//   dβ, dγ from dM ⊙ M and dP ⊙ KK (rows and columns summed by fixed threads in index order)
//   per K tile:  X = A^T dW ; dk = diag(βE) X + Sym K ; dβ += E rowdot(X, K) ; dγ += βE rowdot(X, K)
//   per V tile:  Y = A^T dU ; dv = diag(β) Y ; dβ += rowdot(Y, V)
// dk goes per value head to an f32 workspace [B, T, HV, K]; a second kernel sums it over the G value heads of
// each q/k head in increasing order (deterministic, no atomics).
#include "ops/linear_attn/gdn_bwd_common/cuda_common.cuh"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;

// Shared memory: A, dA / dM, tmp, KK, Sym, two operand tiles; γ, β, E, dβ, dγ; row-sum scratch [64][16].
constexpr int kTiles = 7;
constexpr size_t kSmem = (kTiles * kTileFloats + 5 * kTile + kTile * 16) * sizeof(float);

inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }

__global__ void __launch_bounds__(kThreads) wy_bwd_kernel(WyBwdParams p, const int64_t* offs, float* ws_dk,
                                                          int64_t items) {
  extern __shared__ float smem[];
  float* sAm = smem;
  float* sDA = sAm + kTileFloats;
  float* sT = sDA + kTileFloats;
  float* sKK = sT + kTileFloats;
  float* sSym = sKK + kTileFloats;
  float* sB1 = sSym + kTileFloats;
  float* sB2 = sB1 + kTileFloats;
  float* sG = sB2 + kTileFloats;
  float* sBeta = sG + kTile;
  float* sE = sBeta + kTile;
  float* sDb = sE + kTile;
  float* sDg = sDb + kTile;
  float* red = sDg + kTile;
  const Dims& d = p.d;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t w = item / d.HV, hv = item % d.HV, h = hv / d.G;
    for_each_chunk(d, offs, w, [&](const DevChunk& c) {
      const int L = static_cast<int>(c.t1 - c.t0);
      __syncthreads();
      if (threadIdx.x < kTile) {
        const int i = threadIdx.x;
        const bool ok = i < L;
        sG[i] = ok && p.g.present() ? ld_f32(p.g, p.g.off(c.b, c.t0 + i, hv)) : 0.f;
        sBeta[i] = ok ? ld_f32(p.beta, p.beta.off(c.b, c.t0 + i, hv)) : 0.f;
        sE[i] = ok ? expf(sG[i]) : 0.f;
        sDb[i] = 0.f;
        sDg[i] = 0.f;
      }
      load_tile(sAm, p.A, p.A.off(c.b, c.t0, hv), p.A.s[1], L, L);  // A[i][j], j < L
      // dWK = dW K^T ; KK = K K^T ; dUV = dU V^T
      float wk[4][4], kk[4][4], uv[4][4];
      zero(wk), zero(kk), zero(uv);
      for (int64_t x0 = 0; x0 < d.K; x0 += kTile) {
        const int kc = static_cast<int>(d.K - x0 < kTile ? d.K - x0 : kTile);
        __syncthreads();
        load_tile(sB1, p.dw, p.dw.off(c.b, c.t0, hv) + x0, p.dw.s[1], L, kc);
        load_tile(sB2, p.k, p.k.off(c.b, c.t0, h) + x0, p.k.s[1], L, kc);
        __syncthreads();
        mma<false, true>(wk, sB1, sB2);
        mma<false, true>(kk, sB2, sB2);
      }
      for (int64_t e0 = 0; e0 < d.V; e0 += kTile) {
        const int vc = static_cast<int>(d.V - e0 < kTile ? d.V - e0 : kTile);
        __syncthreads();
        load_tile(sB1, p.du, p.du.off(c.b, c.t0, hv) + e0, p.du.s[1], L, vc);
        load_tile(sB2, p.v, p.v.off(c.b, c.t0, hv) + e0, p.v.s[1], L, vc);
        __syncthreads();
        mma<false, true>(uv, sB1, sB2);
      }
      __syncthreads();
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int i = row_of(a), j = col_of(b);
          sDA[i * kLd + j] = j < i ? sBeta[j] * (sE[j] * wk[a][b] + uv[a][b]) : 0.f;
          sKK[i * kLd + j] = kk[a][b];
        }
      __syncthreads();
      // tmp = A^T dA ; dM = -StrictLower(tmp A^T)
      float t[4][4];
      zero(t);
      mma<true, false>(t, sAm, sDA);
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) sT[row_of(a) * kLd + col_of(b)] = t[a][b];
      __syncthreads();
      zero(t);
      mma<false, true>(t, sT, sAm);
      __syncthreads();
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int i = row_of(a), j = col_of(b);
          sDA[i * kLd + j] = (j < i && i < L) ? -t[a][b] : 0.f;  // dM
        }
      __syncthreads();
      // dP = dM ⊙ Γ (i > j); Sym = diag(β) dP + (diag(β) dP)^T; dβ_i += Σ_j dP_ij KK_ij;
      // dγ_i += Σ_j dM_ij M_ij - Σ_j dM_ji M_ji with M_ij = β_i KK_ij Γ_ij. One thread per row, j in order.
      if (threadIdx.x < kTile) {
        const int i = threadIdx.x;
        float db = 0.f, dg = 0.f;
        for (int j = 0; j < kTile; ++j) {
          if (j < i && i < L) {
            const float gij = expf(sG[i] - sG[j]);
            const float dm = sDA[i * kLd + j], dp = dm * gij;
            db += dp * sKK[i * kLd + j];
            dg += dm * sBeta[i] * sKK[i * kLd + j] * gij;
            sT[i * kLd + j] = sBeta[i] * dp;  // diag(β) dP, strictly lower
          } else {
            sT[i * kLd + j] = 0.f;
          }
        }
        for (int r = i + 1; r < L; ++r)  // column i: - Σ_r dM_ri M_ri
          dg -= sDA[r * kLd + i] * sBeta[r] * sKK[r * kLd + i] * expf(sG[r] - sG[i]);
        sDb[i] = db;
        sDg[i] = dg;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
        const int i = e / kTile, j = e % kTile;
        sSym[i * kLd + j] = sT[i * kLd + j] + sT[j * kLd + i];
      }
      float* sXk = sKK;  // KK is no longer needed: per-row Σ_x X k over the K tiles
      if (threadIdx.x < kTile) sXk[threadIdx.x] = 0.f;
      // Per K tile: X = A^T dW ; dk = diag(βE) X + Sym K ; row terms rowdot(X, K).
      for (int64_t x0 = 0; x0 < d.K; x0 += kTile) {
        const int kc = static_cast<int>(d.K - x0 < kTile ? d.K - x0 : kTile);
        __syncthreads();
        load_tile(sB1, p.dw, p.dw.off(c.b, c.t0, hv) + x0, p.dw.s[1], L, kc);
        load_tile(sB2, p.k, p.k.off(c.b, c.t0, h) + x0, p.k.s[1], L, kc);
        __syncthreads();
        float X[4][4], sk[4][4];
        zero(X), zero(sk);
        mma<true, false>(X, sAm, sB1);
        mma<false, false>(sk, sSym, sB2);
        float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int i = row_of(a), x = col_of(b);
            part[a] += X[a][b] * sB2[i * kLd + x];
            if (i < L && x < kc)
              ws_dk[(((c.b * d.T) + c.t0 + i) * d.HV + hv) * d.K + x0 + x] = sBeta[i] * sE[i] * X[a][b] + sk[a][b];
          }
        add_row_sums(part, red, sXk);
      }
      // Per V tile: Y = A^T dU ; dv = diag(β) Y ; Σ Y v.
      float* sYv = sSym;  // Sym is no longer needed
      __syncthreads();
      if (threadIdx.x < kTile) sYv[threadIdx.x] = 0.f;
      for (int64_t e0 = 0; e0 < d.V; e0 += kTile) {
        const int vc = static_cast<int>(d.V - e0 < kTile ? d.V - e0 : kTile);
        __syncthreads();
        load_tile(sB1, p.du, p.du.off(c.b, c.t0, hv) + e0, p.du.s[1], L, vc);
        load_tile(sB2, p.v, p.v.off(c.b, c.t0, hv) + e0, p.v.s[1], L, vc);
        __syncthreads();
        float Y[4][4];
        zero(Y);
        mma<true, false>(Y, sAm, sB1);
        float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int i = row_of(a), e = col_of(b);
            part[a] += Y[a][b] * sB2[i * kLd + e];
            if (i < L && e < vc) st_f32(p.dv, p.dv.off(c.b, c.t0 + i, hv) + e0 + e, sBeta[i] * Y[a][b]);
          }
        add_row_sums(part, red, sYv);
      }
      __syncthreads();
      if (threadIdx.x < L) {
        const int i = threadIdx.x;
        const float xk = sXk[i];
        st_f32(p.dbeta, p.dbeta.off(c.b, c.t0 + i, hv), sE[i] * xk + sYv[i] + sDb[i]);
        if (p.dg.present()) st_f32(p.dg, p.dg.off(c.b, c.t0 + i, hv), sBeta[i] * sE[i] * xk + sDg[i]);
      }
      __syncthreads();
    });
  }
}

}  // namespace

size_t prepare_wy_repr_bwd_cuda_fma_workspace(const Dims& d) {
  return align256(chunk_offsets_bytes(d)) + static_cast<size_t>(d.B * d.T * d.HV * d.K) * sizeof(float);
}

int prepare_wy_repr_bwd_cuda_fma(const WyBwdParams& p, void* workspace, void* stream_ptr) {
  if (p.dk_add.present() || p.dg_add.present() || p.dk_rstd.present())
    return fail(STRATA_ERROR_UNSUPPORTED,
                "prepare_wy_repr_bwd cuda.sm90.chunk_tile: dk_add / dg_add / dk_rstd (the composed backward's fused "
                "sums and folded l2norm backward) are taken by the tensor-core kernel only");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  int64_t* offs = static_cast<int64_t*>(workspace);
  float* ws_dk = reinterpret_cast<float*>(static_cast<char*>(workspace) + align256(chunk_offsets_bytes(d)));
  const int64_t items = num_windows(d) * d.HV;
  if (items > 0) {
    STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
    STRATA_CUDA_TRY(
        cudaFuncSetAttribute(wy_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
    const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
    wy_bwd_kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(p, offs, ws_dk, items);
    STRATA_RETURN_IF_ERROR(cuda::check_launch("prepare_wy_repr_bwd (chunk_tile)"));
  }
  return launch_reduce_heads(ws_dk, d, p.dk, stream);
}

}  // namespace strata::linear_attn
