// Tensor-core CUDA kernel of prepare_wy_repr_bwd ("cuda.sm90.mma", bf16/f16 k, v, A, dw, du): one 256-thread
// block (8 warps) per (token window, q/k head h) on grid.x (grid-stride), walking the G value heads
// hv = h G + g in increasing g and summing dk over them in f32 registers (no per-head workspace, no reduction
// pass). Per chunk: KK = K Kᵀ once (f32, shared); per value head (64 × 64 products, warp w owns rows
// 16 (w % 4).., columns 32 (w / 4)..):
//   dA  = StrictLower(dW Kᵀ diag(βE) + dU Vᵀ diag(β))  → T        (contractions over K and V)
//   tmp = Aᵀ dA → T ;  dM = −StrictLower(tmp Aᵀ)        (f32, shared)
//   dP = dM ⊙ Γ (f32, shared) ; Sym = diag(β) dP + (diag(β) dP)ᵀ → T ; dβ, dγ from row and column sums of
//   dP ⊙ KK (one thread per row / column, index order)
//   per K tile: X = Aᵀ dW ; dk += diag(βE) X + Sym K ; rowdot(X, K)
//   per V tile: Y = Aᵀ dU ; dv = diag(β) Y ; rowdot(Y, V)
// K is a template parameter rounded up to 64 (KP), V a run-time one (VP); tiles are zero-filled past the chunk
// end and past K, V. Fixed-order sums everywhere: same bits every run, no atomics.
//
// The kernels and their launch code, included by the three units of cuda.sm90.mma (session 16: one unit took 132 s to
// compile on the GPU host): cuda_sm90_mma_bf16.cu and cuda_sm90_mma_f16.cu instantiate every kernel of one token
// dtype (launch_bf16 / launch_f16, compiled in parallel), cuda_sm90_mma.cu holds the host entry points (reject rules,
// dispatch) and instantiates none. The templates are in an anonymous namespace (internal linkage in each unit: there
// is no device linking between the .cu files), inside wy_mma, which only this header opens: its using-directives
// reach no other code.
#pragma once

#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"
#include "ops/linear_attn/prepare_wy_repr_bwd/cuda_wy_bwd.cuh"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

#include <fmt/format.h>

#include <algorithm>

namespace strata::linear_attn::wy_mma {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
using namespace gdn_bwd::tc;
namespace {


constexpr int kThr = 256;  // the dβ / dγ row sums use four threads per row of 64
constexpr int kL64 = 72;  // row pitch of the 16-bit 64 × 64 tiles
constexpr int kLdF = 65;  // row pitch of the f32 64 × 64 tiles (column walks do not conflict)

inline int64_t round64(int64_t x) { return std::max<int64_t>((x + 63) / 64 * 64, 64); }

// Shared memory layout (bytes) for KP (compile time), VP (run time) and 1 or 2 stages of the per-head tiles
// (dw, v, du, A: with two, head g + 1 loads while head g computes).
struct WySmem {
  size_t k, stage0, dw, v, du, a, stage_bytes, x, sym, kk, dm, vec, bytes;
  __host__ __device__ WySmem(int KP, int VP, int stages) {
    const size_t ldk = KP + 8, ldv = VP + 8;
    k = 0;
    stage0 = k + 64 * ldk * 2;
    dw = 0;  // offsets inside a stage
    v = dw + 64 * ldk * 2;
    du = v + 64 * ldv * 2;
    a = du + 64 * ldv * 2;
    stage_bytes = a + 64 * kL64 * 2;
    x = stage0 + stages * stage_bytes;
    sym = x + 64 * kL64 * 2;
    kk = sym + 64 * kL64 * 2;
    dm = kk + 64 * kLdF * 4;
    vec = dm + 64 * kLdF * 4;  // γ, β, E, dβ, dγ, Σ X k, Σ Y v [64] and the row partials [2][64], f32
    bytes = vec + 9 * 64 * 4;
  }
};
constexpr size_t kMaxSmem = 227 * 1024;
inline int wy_stages(int KP, int VP) { return WySmem(KP, VP, 2).bytes <= kMaxSmem ? 2 : 1; }

// Row sums of a 64 × 64 product spread over the 8 warps: part[s] is this thread's sum over its columns for row
// r0 + g + 8 s. Sums the quad (xor 1, then 2), then the two column-half warps through red[2][64] in order:
// out[i] = red[i] + red[64 + i] for i < 64 (written by threads < 64). Barriers before and after.
__device__ __forceinline__ void rows_to(float (&part)[2], float* red, float* out, int r0, int wn) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    part[s] += __shfl_xor_sync(0xffffffffu, part[s], 1);
    part[s] += __shfl_xor_sync(0xffffffffu, part[s], 2);
  }
  __syncthreads();
  if ((threadIdx.x & 3) == 0) {
    const int i = r0 + (threadIdx.x & 31) / 4;
    red[wn * 64 + i] = part[0];
    red[wn * 64 + i + 8] = part[1];
  }
  __syncthreads();
  if (threadIdx.x < 64) out[threadIdx.x] = red[threadIdx.x] + red[64 + threadIdx.x];
  __syncthreads();
}

// ---- the per-head steps both kernels share (wy_bwd_mma_kernel: K, V in tiles of ldk / ldv pitch; wy_bwd_lean_kernel:
// one pitch for both) ----

// dA = StrictLower(dW Kᵀ diag(βE) + dU Vᵀ diag(β)) → sX (T), for the warp's 16 x 32 block (rows r0.., columns c0..),
// stored as 32-bit pairs of adjacent columns.
// kDots (the lean kernel): the warp's block is dAᵀ instead (K dWᵀ and V dUᵀ: rows i = r0.., columns j = c0.., each
// stored at sX[j][i]), so that a fragment row i also gives the dβ / dγ row dots Σ_x X_ix k_ix = Σ_j A_ji (K dWᵀ)_ij
// and Σ_v Y_iv v_iv = Σ_j A_ji (V dUᵀ)_ij (X = Aᵀ dW, Y = Aᵀ dU; no K / V element reads next to X and Y): the
// warp's partial sums over its 32 columns j go to dots[m][i] (m = 0: X k, 1: Y v) at dots + m * dots_ld + i.
template <class T, bool kDots = false>
__device__ __forceinline__ void wy_form_dA(uint16_t* sX, const uint16_t* sDw, const uint16_t* sK, int ldk, int kdim,
                                           const uint16_t* sDu, const uint16_t* sV, int ldv, int vdim,
                                           const float* sBeta, const float* sE, int r0, int c0,
                                           const uint16_t* sA = nullptr, float* dots = nullptr, int dots_ld = 0) {
  float wk[1][4][4], uv[1][4][4];
  zero(wk), zero(uv);
  if constexpr (kDots) {
    warp_gemm<T, true, false, 1, 4>(wk, sK + r0 * ldk, ldk, sDw + c0 * ldk, ldk, kdim);
    warp_gemm<T, true, false, 1, 4>(uv, sV + r0 * ldv, ldv, sDu + c0 * ldv, ldv, vdim);
    float dt[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // [m][s]: row r0 + lane / 4 + 8 s
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int i = r0 + frag_row(0, 2 * s);
      const float b = sBeta[i], e_i = sE[i];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 2 * s; e < 2 * s + 2; ++e) {
          const int j = c0 + frag_col(nt, e);
          const float a = Elem<T>::to(sA[j * kL64 + i]);
          dt[0][s] += a * wk[0][nt][e];
          dt[1][s] += a * uv[0][nt][e];
          // dA_ji = β_i (E_i (dW Kᵀ)_ji + (dU Vᵀ)_ji) for i < j (the same operations as below, rows and columns swapped)
          sX[j * kL64 + i] = Elem<T>::from(i < j ? b * (e_i * wk[0][nt][e] + uv[0][nt][e]) : 0.f);
        }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int s = 0; s < 2; ++s) {  // the quad: fixed-order butterflies
        dt[m][s] += __shfl_xor_sync(0xffffffffu, dt[m][s], 1);
        dt[m][s] += __shfl_xor_sync(0xffffffffu, dt[m][s], 2);
      }
    if ((threadIdx.x & 3) == 0) {
      const int i = r0 + (threadIdx.x & 31) / 4;
      dots[i] = dt[0][0], dots[i + 8] = dt[0][1];
      dots[dots_ld + i] = dt[1][0], dots[dots_ld + i + 8] = dt[1][1];
    }
  } else {
    warp_gemm<T, true, false, 1, 4>(wk, sDw + r0 * ldk, ldk, sK + c0 * ldk, ldk, kdim);
    warp_gemm<T, true, false, 1, 4>(uv, sDu + r0 * ldv, ldv, sV + c0 * ldv, ldv, vdim);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {  // the two adjacent columns j, j + 1 of a fragment row together
        const int i = r0 + frag_row(0, e), j = c0 + frag_col(nt, e);
        const uint32_t lo = Elem<T>::from(j < i ? sBeta[j] * (sE[j] * wk[0][nt][e] + uv[0][nt][e]) : 0.f);
        const uint32_t hi =
            Elem<T>::from(j + 1 < i ? sBeta[j + 1] * (sE[j + 1] * wk[0][nt][e + 1] + uv[0][nt][e + 1]) : 0.f);
        *reinterpret_cast<uint32_t*>(sX + i * kL64 + j) = lo | (hi << 16);
      }
  }
}

// Per K tile: X = Aᵀ dW ; dk_sum += diag(βE) X + Sym K ; part[s] += Σ X k over the warp's columns of row
// r0 + lane / 4 + 8 s (not kLean: the lean kernel has these sums from wy_form_dA).
template <class T, int KT, bool kLean = false>
__device__ __forceinline__ void wy_dk_tiles(float (&dk_sum)[KT][1][4][4], float (&part)[2], const uint16_t* sA,
                                            const uint16_t* sDw, const uint16_t* sSym, const uint16_t* sK, int ldk,
                                            const float* sBeta, const float* sE, int r0, int c0) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
    float X[1][4][4], sk[1][4][4];
    zero(X), zero(sk);
    warp_gemm<T, false, true, 1, 4>(X, sA + r0, kL64, sDw + kt * 64 + c0, ldk, 64);
    warp_gemm<T, true, true, 1, 4>(sk, sSym + r0 * kL64, kL64, sK + kt * 64 + c0, ldk, 64);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + frag_row(0, e), x = kt * 64 + c0 + frag_col(nt, e);
        if constexpr (!kLean) part[e >> 1] += X[0][nt][e] * Elem<T>::to(sK[i * ldk + x]);
        dk_sum[kt][0][nt][e] += sBeta[i] * sE[i] * X[0][nt][e] + sk[0][nt][e];
      }
  }
}

// dv can take wy_dv_tile's typed stores: it holds T, and every pair of adjacent even columns is 4-byte aligned.
template <class T>
__device__ __forceinline__ bool wy_dv_typed(const WyBwdParams& p) {
  return p.dv.dtype == Elem<T>::kDtype && (reinterpret_cast<uintptr_t>(p.dv.p) & 3) == 0 &&
         ((p.dv.s[0] | p.dv.s[1] | p.dv.s[2]) & 1) == 0;
}

// Per 64-column V tile e0 < vdim: Y = Aᵀ dU ; dv = diag(β) Y (stored) ; part[s] += Σ Y v as in wy_dk_tiles (not
// kLean). typed (wy_dv_typed(p), kTyped kernels only): one row pointer per fragment row and 32-bit stores of the two
// T values (the same bits as st_pair's dtype-generic path, without its per-pair offset, dtype and alignment work).
// kFull (kWyTrimmed): when the whole tile is in range (L = 64, e0 + 64 ≤ vc) the typed stores skip the per-pair
// column checks (a branch pair each in the SASS).
template <class T, bool kLean = false, bool kTyped = false, bool kFull = false>
__device__ __forceinline__ void wy_dv_tile(float (&part)[2], const WyBwdParams& p, const DevChunk& c, int64_t hv, int L,
                                           int vc, int e0, const uint16_t* sA, const uint16_t* sDu, const uint16_t* sV,
                                           int ldv, const float* sBeta, int r0, int c0, bool typed = false) {
  float Y[1][4][4];
  zero(Y);
  warp_gemm<T, false, true, 1, 4>(Y, sA + r0, kL64, sDu + e0 + c0, ldv, 64);
  if (kTyped && typed) {
    if (kFull && L == 64 && e0 + 64 <= vc) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = r0 + frag_row(0, e);
        uint16_t* row = static_cast<uint16_t*>(p.dv.p) + p.dv.off(c.b, c.t0 + i, hv) + e0 + c0;
        const float b = sBeta[i];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          *reinterpret_cast<uint32_t*>(row + frag_col(nt, e)) =
              Elem<T>::from(b * Y[0][nt][e]) | (uint32_t{Elem<T>::from(b * Y[0][nt][e + 1])} << 16);
      }
      return;
    }
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // the fragment rows r0 + lane / 4 (e = 0) and + 8 (e = 2)
      const int i = r0 + frag_row(0, e);
      if (i >= L) continue;
      uint16_t* row = static_cast<uint16_t*>(p.dv.p) + p.dv.off(c.b, c.t0 + i, hv);
      const float b = sBeta[i];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = e0 + c0 + frag_col(nt, e);
        const uint32_t lo = Elem<T>::from(b * Y[0][nt][e]);
        if (col + 1 < vc)
          *reinterpret_cast<uint32_t*>(row + col) = lo | (uint32_t{Elem<T>::from(b * Y[0][nt][e + 1])} << 16);
        else if (col < vc)
          row[col] = static_cast<uint16_t>(lo);
      }
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // the two adjacent columns of a fragment row together
      const int i = r0 + frag_row(0, e), col = e0 + c0 + frag_col(nt, e);
      if constexpr (!kLean) {
        part[e >> 1] += Y[0][nt][e] * Elem<T>::to(sV[i * ldv + col]);
        part[e >> 1] += Y[0][nt][e + 1] * Elem<T>::to(sV[i * ldv + col + 1]);
      }
      if (i < L && col < vc)
        st_pair(p.dv, p.dv.off(c.b, c.t0 + i, hv) + col, sBeta[i] * Y[0][nt][e], sBeta[i] * Y[0][nt][e + 1],
                col + 1 < vc);
    }
}

// How the dk epilogue adds dk_add (the composed backward's f32 addend; dk_add may alias dk only element for element,
// as the composed backward passes it: a thread reads each of its elements before writing it, and no element of
// another thread):
//  * kDkAddPairs (kWyTwoPerSm, the pipelined kernel): dk = dk_add + Σ_g, each pair loaded right before its store
//    (16 dependent global round trips per thread and chunk at K = 128: no load moves above an earlier store);
//  * kDkAddBatchedTyped (kWyBatchedTyped): the same additions, the 4 pairs of one fragment row of a K tile loaded
//    before its first store (4 round trips per chunk at K = 128); each head's dg_add fetched at its start and dv
//    stored through wy_dv_tile's typed path (kLatency).
// (Sessions 12-14 also tried the batched loads alone, an L1 or L2 prefetch of dk_add and the head sums starting from
// dk_add: slower, README.md.)
enum DkAdd { kDkAddPairs, kDkAddBatchedTyped };

// dk (+ dk_add, as kAdd says) of the chunk from the head sums, rows < L, columns < kc.
template <int KT, DkAdd kAdd = kDkAddPairs>
__device__ __forceinline__ void wy_store_dk(const WyBwdParams& p, const DevChunk& c, int64_t h, int L, int kc,
                                            const float (&dk_sum)[KT][1][4][4], int r0, int c0) {
  constexpr bool kBatched = kAdd == kDkAddBatchedTyped;
  const bool add = p.dk_add.present();
#pragma unroll
  for (int kt = 0; kt < KT; ++kt)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // the fragment rows r0 + lane / 4 (e = 0) and + 8 (e = 2)
      const int i = r0 + frag_row(0, e);
      if (i >= L) continue;
      float ad[4][2] = {};  // kBatched: [nt][column] dk_add of this row (f32: the kernel's reject rule)
      if (kBatched && add) {
        const float* row = static_cast<const float*>(p.dk_add.p) + p.dk_add.off(c.b, c.t0 + i, h);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int x = kt * 64 + c0 + frag_col(nt, 0);
          if (x < kc) ad[nt][0] = row[x];
          if (x + 1 < kc) ad[nt][1] = row[x + 1];
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {  // the two adjacent columns of a fragment row together
        const int x = kt * 64 + c0 + frag_col(nt, e);
        if (x < kc) {
          float a0 = dk_sum[kt][0][nt][e], a1 = dk_sum[kt][0][nt][e + 1];
          if (kBatched && add) {
            a0 = ad[nt][0] + a0;
            a1 = ad[nt][1] + a1;
          } else if (add) {  // dk = dk_add + dk (read before the store: dk_add may alias dk)
            const int64_t o = p.dk_add.off(c.b, c.t0 + i, h) + x;
            a0 = ld_f32(p.dk_add, o) + a0;
            if (x + 1 < kc) a1 = ld_f32(p.dk_add, o + 1) + a1;
          }
          st_pair(p.dk, p.dk.off(c.b, c.t0 + i, h) + x, a0, a1, x + 1 < kc);
        }
      }
    }
}

// kNorm (kWyFinStaged with WyBwdParams::dk_rstd; the composed backward with l2norm): dk leaves through the l2norm
// backward, dk = r (y − (y · k) k) with y = dk_add + Σ_g (the unfused f32 sum), k the chunk's k tile in shared
// memory (the normalised keys there; sK, row pitch ld) and r the row's rstd, stored once in dk's dtype. That replaces
// the composed backward's row_norm_bwd pass over dk (f32 y written and read back: 2 × 268 MB at B = 4, T = 8192,
// H = 16, K = 128). After a block barrier (the last head's readers of the dW and V tiles are done) the head sums go to
// shared memory (f32 [64][P + 8] over those two tiles, sF), so that no dk_add load is in flight while dk_sum is live
// (the in-register form, session 15, spilled dk_sum in the head loop at the 128-register cap and lost); after a
// second barrier four threads per row (row t / 4, float4 columns 4 (t % 4) + 16 m: 64 bytes of a row per 4 threads)
// add dk_add, sum the dot over the quad (fixed-order butterflies: no third barrier) and store.
template <class T, int P>
__device__ __forceinline__ void wy_store_dk_norm_staged(const WyBwdParams& p, const DevChunk& c, int64_t h, int L,
                                                        int kc, const float (&dk_sum)[P / 64][1][4][4],
                                                        const uint16_t* sK, int ld, float* sF, int r0, int c0) {
  constexpr int KT = P / 64, ldf = P + 8, M = P / 16;
  __syncthreads();  // every warp is past its reads of the dW and V tiles
#pragma unroll
  for (int kt = 0; kt < KT; ++kt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        *reinterpret_cast<float2*>(sF + (r0 + frag_row(0, e)) * ldf + kt * 64 + c0 + frag_col(nt, e)) =
            make_float2(dk_sum[kt][0][nt][e], dk_sum[kt][0][nt][e + 1]);
  __syncthreads();
  const int i = threadIdx.x / 4, q = threadIdx.x & 3;
  if (i >= L) return;  // (whole quads: no shuffle partner leaves)
  const bool add = p.dk_add.present();
  const float* arow = add ? static_cast<const float*>(p.dk_add.p) + p.dk_add.off(c.b, c.t0 + i, h) : nullptr;
  const bool vec = add && (reinterpret_cast<uintptr_t>(arow) & 15) == 0;
  const float r = ld_f32(p.dk_rstd, p.dk_rstd.off(c.b, c.t0 + i, h));
  float y[M][4];
  float dot = 0.f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int x = 4 * q + 16 * m;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (vec && x + 3 < kc) {
      a = *reinterpret_cast<const float4*>(arow + x);
    } else if (add) {
      a.x = x < kc ? arow[x] : 0.f, a.y = x + 1 < kc ? arow[x + 1] : 0.f;
      a.z = x + 2 < kc ? arow[x + 2] : 0.f, a.w = x + 3 < kc ? arow[x + 3] : 0.f;
    }
    const float4 sum = *reinterpret_cast<const float4*>(sF + i * ldf + x);
    y[m][0] = a.x + sum.x, y[m][1] = a.y + sum.y, y[m][2] = a.z + sum.z, y[m][3] = a.w + sum.w;
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const uint2 kp = *reinterpret_cast<const uint2*>(sK + i * ld + 4 * q + 16 * m);  // k (zero past kc)
    dot += y[m][0] * Elem<T>::to(static_cast<uint16_t>(kp.x & 0xffffu));
    dot += y[m][1] * Elem<T>::to(static_cast<uint16_t>(kp.x >> 16));
    dot += y[m][2] * Elem<T>::to(static_cast<uint16_t>(kp.y & 0xffffu));
    dot += y[m][3] * Elem<T>::to(static_cast<uint16_t>(kp.y >> 16));
  }
  const unsigned quad = 0xfu << (threadIdx.x & 28);
  dot += __shfl_xor_sync(quad, dot, 1);
  dot += __shfl_xor_sync(quad, dot, 2);
  const int64_t o = p.dk.off(c.b, c.t0 + i, h);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int x = 4 * q + 16 * m;
    if (x >= kc) continue;
    const uint2 kp = *reinterpret_cast<const uint2*>(sK + i * ld + x);
    const float k0 = Elem<T>::to(static_cast<uint16_t>(kp.x & 0xffffu)), k1 = Elem<T>::to(static_cast<uint16_t>(kp.x >> 16));
    const float k2 = Elem<T>::to(static_cast<uint16_t>(kp.y & 0xffffu)), k3 = Elem<T>::to(static_cast<uint16_t>(kp.y >> 16));
    st_pair(p.dk, o + x, r * (y[m][0] - dot * k0), r * (y[m][1] - dot * k1), x + 1 < kc);
    if (x + 2 < kc) st_pair(p.dk, o + x + 2, r * (y[m][2] - dot * k2), r * (y[m][3] - dot * k3), x + 3 < kc);
  }
}

template <class T, int KP>
__global__ void __launch_bounds__(kThr) wy_bwd_mma_kernel(WyBwdParams p, const int64_t* offs, int64_t items,
                                                          int VP, int stages) {
  constexpr int KT = KP / 64;
  constexpr int ldk = KP + 8;
  const int ldv = VP + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const WySmem S(KP, VP, stages);
  uint16_t* sK = reinterpret_cast<uint16_t*>(smem + S.k);
  uint16_t* sX = reinterpret_cast<uint16_t*>(smem + S.x);
  uint16_t* sSym = reinterpret_cast<uint16_t*>(smem + S.sym);
  float* sKK = reinterpret_cast<float*>(smem + S.kk);
  float* sDM = reinterpret_cast<float*>(smem + S.dm);
  float* sG = reinterpret_cast<float*>(smem + S.vec);
  float* sBeta = sG + 64;
  float* sE = sBeta + 64;
  float* sDb = sE + 64;  // Σ_j dP_ij KK_ij
  float* sDg = sDb + 64;  // Σ_r β_r dP_ri KK_ri
  float* sXk = sDg + 64;
  float* sYv = sXk + 64;
  float* sRed = sYv + 64;  // [2][64]
  const Dims& d = p.d;
  const int warp = threadIdx.x / 32, wn = warp / 4, r0 = (warp % 4) * 16, c0 = wn * 32;
  const int kc = static_cast<int>(d.K), vc = static_cast<int>(d.V);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t w = item / d.H, h = item % d.H;
    for_each_chunk(d, offs, w, [&](const DevChunk& c) {
      const int L = static_cast<int>(c.t1 - c.t0);
      // Per-head tiles of head g in stage g % stages. issue(g) also returns this thread's γ and β of head g
      // (threads < L < 64; 0 elsewhere), fetched with the tiles so that their latency overlaps the previous head.
      auto stage = [&](int64_t g) { return smem + S.stage0 + (stages == 2 ? (g & 1) : 0) * S.stage_bytes; };
      auto issue = [&](int64_t g) -> float2 {
        const int64_t hv = h * d.G + g;
        unsigned char* st = stage(g);
        load_tile_async<T, kThr>(reinterpret_cast<uint16_t*>(st + S.dw), ldk, 64, KP, p.dw, p.dw.off(c.b, c.t0, hv),
                                 p.dw.s[1], L, kc);
        load_tile_async<T, kThr>(reinterpret_cast<uint16_t*>(st + S.v), ldv, 64, VP, p.v, p.v.off(c.b, c.t0, hv),
                                 p.v.s[1], L, vc);
        load_tile_async<T, kThr>(reinterpret_cast<uint16_t*>(st + S.du), ldv, 64, VP, p.du, p.du.off(c.b, c.t0, hv),
                                 p.du.s[1], L, vc);
        load_tile_async<T, kThr>(reinterpret_cast<uint16_t*>(st + S.a), kL64, 64, 64, p.A, p.A.off(c.b, c.t0, hv),
                                 p.A.s[1], L, L);
        ::strata::cuda::cp_async_commit();
        const bool ok = static_cast<int>(threadIdx.x) < L;
        return make_float2(ok && p.g.present() ? ld_f32(p.g, p.g.off(c.b, c.t0 + threadIdx.x, hv)) : 0.f,
                           ok ? ld_f32(p.beta, p.beta.off(c.b, c.t0 + threadIdx.x, hv)) : 0.f);
      };
      __syncthreads();  // the previous chunk's readers are done
      load_tile_async<T, kThr>(sK, ldk, 64, KP, p.k, p.k.off(c.b, c.t0, h), p.k.s[1], L, kc);
      float2 gb = issue(0);  // (the k tile joins head 0's group)
      float dk_sum[KT][1][4][4];
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) zero(dk_sum[kt]);
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t hv = h * d.G + g;
        if (g > 0) {
          __syncthreads();  // the previous head's readers (γ, β, E; its stage with one stage) are done
          if (stages == 1) gb = issue(g);
        }
        float2 gb_next = make_float2(0.f, 0.f);
        if (stages == 2 && g + 1 < d.G) {
          gb_next = issue(g + 1);  // into the stage head g − 1 used
          ::strata::cuda::cp_async_wait<1>();
        } else {
          ::strata::cuda::cp_async_wait<0>();
        }
        uint16_t* sDw = reinterpret_cast<uint16_t*>(stage(g) + S.dw);
        uint16_t* sV = reinterpret_cast<uint16_t*>(stage(g) + S.v);
        uint16_t* sDu = reinterpret_cast<uint16_t*>(stage(g) + S.du);
        uint16_t* sA = reinterpret_cast<uint16_t*>(stage(g) + S.a);
        if (threadIdx.x < 64) {
          const int i = threadIdx.x;
          sG[i] = gb.x;
          sBeta[i] = gb.y;
          sE[i] = i < L ? expf(gb.x) : 0.f;
        }
        gb = gb_next;  // (two stages: head g + 1's values; one stage: replaced by issue(g + 1))
        __syncthreads();
        if (g == 0) {  // KK = K Kᵀ (f32), read after the barriers below
          float kk[1][4][4];
          zero(kk);
          warp_gemm<T, true, false, 1, 4>(kk, sK + r0 * ldk, ldk, sK + c0 * ldk, ldk, KP);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) sKK[(r0 + frag_row(0, e)) * kLdF + c0 + frag_col(nt, e)] = kk[0][nt][e];
        }
        wy_form_dA<T>(sX, sDw, sK, ldk, KP, sDu, sV, ldv, VP, sBeta, sE, r0, c0);
        __syncthreads();
        float t[1][4][4];
        zero(t);
        warp_gemm<T, false, true, 1, 4>(t, sA + r0, kL64, sX + c0, kL64, 64);  // tmp = Aᵀ dA
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sX[(r0 + frag_row(0, e)) * kL64 + c0 + frag_col(nt, e)] = Elem<T>::from(t[0][nt][e]);
        __syncthreads();
        zero(t);
        warp_gemm<T, true, false, 1, 4>(t, sX + r0 * kL64, kL64, sA + c0 * kL64, kL64, 64);  // tmp Aᵀ
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = r0 + frag_row(0, e), j = c0 + frag_col(nt, e);
            // dP = dM ⊙ Γ, dM = −StrictLower(tmp Aᵀ) (the exponent is formed only below the diagonal: ≤ 0)
            sDM[i * kLdF + j] = (j < i && i < L) ? -t[0][nt][e] * expf(sG[i] - sG[j]) : 0.f;
          }
        __syncthreads();
        // dβ_i = Σ_j dP_ij KK_ij (row i) and c_i = Σ_r β_r dP_ri KK_ri (column i); dγ_i = Σ_j dM_ij M_ij −
        // Σ_r dM_ri M_ri = β_i dβ_i − c_i (M = diag(β) KK ⊙ Γ). Four threads per i (i = tid / 4), each summing the
        // 16 indices 16 (tid % 4) .. + 15 in increasing order, then the quad by an xor butterfly (both partners add
        // the same two numbers: every lane of the quad holds the same bits): a fixed order, and a 16-long chain
        // instead of one thread walking all 64.
        {
          const int i = threadIdx.x / 4, j0 = (threadIdx.x % 4) * 16;
          float db = 0.f, cs = 0.f;
#pragma unroll
          for (int jj = 0; jj < 16; ++jj) {
            const int j = j0 + jj;
            db += sDM[i * kLdF + j] * sKK[i * kLdF + j];
            cs += sBeta[j] * sDM[j * kLdF + i] * sKK[j * kLdF + i];
          }
#pragma unroll
          for (int o = 1; o <= 2; o <<= 1) {
            db += __shfl_xor_sync(0xffffffffu, db, o);
            cs += __shfl_xor_sync(0xffffffffu, cs, o);
          }
          if ((threadIdx.x & 3) == 0) sDb[i] = db, sDg[i] = cs;
        }
        for (int e = threadIdx.x; e < 64 * 64; e += kThr) {  // Sym = diag(β) dP + (diag(β) dP)ᵀ → T
          const int i = e / 64, j = e % 64;
          sSym[i * kL64 + j] = Elem<T>::from(sBeta[i] * sDM[i * kLdF + j] + sBeta[j] * sDM[j * kLdF + i]);
        }
        __syncthreads();
        // Per K tile: X = Aᵀ dW ; dk += diag(βE) X + Sym K ; Σ X k per row.
        float part[2] = {0.f, 0.f};
        wy_dk_tiles<T, KT>(dk_sum, part, sA, sDw, sSym, sK, ldk, sBeta, sE, r0, c0);
        rows_to(part, sRed, sXk, r0, wn);
        // Per V tile: Y = Aᵀ dU ; dv = diag(β) Y ; Σ Y v per row.
        part[0] = part[1] = 0.f;
        for (int e0 = 0; e0 < VP; e0 += 64) wy_dv_tile<T>(part, p, c, hv, L, vc, e0, sA, sDu, sV, ldv, sBeta, r0, c0);
        rows_to(part, sRed, sYv, r0, wn);
        if (static_cast<int>(threadIdx.x) < L) {
          const int i = threadIdx.x;
          wy_bwd_cu::store_dbeta_dg(p, c, hv, i, sE[i], sBeta[i], sXk[i], sYv[i], sDb[i], sDg[i],
                                    wy_bwd_cu::dg_addend(p, c, hv, i));
        }
      }
      wy_store_dk<KT>(p, c, h, L, kc, dk_sum, r0, c0);
    });
  }
}

template <class T, int KP>
strata_status launch(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  const int VP = static_cast<int>(round64(p.d.V));
  const int stages = wy_stages(KP, VP);
  const size_t smem = WySmem(KP, VP, stages).bytes;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(wy_bwd_mma_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  wy_bwd_mma_kernel<T, KP><<<static_cast<unsigned>(blocks), kThr, smem, stream>>>(p, offs, items, VP, stages);
  return cuda::check_launch("prepare_wy_repr_bwd (mma)");
}

template <class T>
strata_status launch_k(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  const int64_t K = p.d.K;
  if (K <= 64) return launch<T, 64>(p, offs, items, stream);
  if (K <= 128) return launch<T, 128>(p, offs, items, stream);
  if (K <= 192) return launch<T, 192>(p, offs, items, stream);
  return launch<T, 256>(p, offs, items, stream);
}

// ---- kWyTwoPerSm: one stage, at most 128 registers, two blocks per SM at K = V = 128 ----
// The same products as wy_bwd_mma_kernel (dk, dv the same bits) with less state, so that a second block on the SM
// computes while this one waits for its tiles (the pipelined kernel, at 194 KiB and 239 registers, runs one block
// of 8 warps per SM and exposes every barrier and load latency):
//  * one stage of per-head tiles (loaded when the previous head's readers are done);
//  * K Kᵀ recomputed per value head into registers next to tmp Aᵀ (the same warp block, so dP ⊙ KK is formed in
//    registers) instead of a 16 KiB f32 tile kept for the chunk: dβ's row sums Σ_j dP_ij KK_ij and dγ's column
//    sums Σ_r β_r dP_ri KK_ri are reduced from the fragments (quad / column shuffles, then the warps in order);
// and, since session 11 (five block barriers per head instead of the thirteen of session 6's form):
//  * Σ_x X_ix k_ix and Σ_v Y_iv v_iv (the dβ / dγ row dots) as row sums of Aᵀ ⊙ (K dWᵀ) and Aᵀ ⊙ (V dUᵀ) in
//    wy_form_dA's epilogue (Σ_x X_ix k_ix = Σ_j A_ji (dW Kᵀ)_ji; dA formed transposed for it), so no K / V element
//    reads next to X and Y and no rows_to reductions (six barriers);
//  * Sym from the dP fragments: Bm = diag(β) dP is strictly lower, so Sym = Bm + Bmᵀ is Bm_ij at [i][j] and at
//    [j][i] (j < i) and 0 on the diagonal, stored as T straight from the registers (no f32 dP tile, no element walk
//    over it: the same T values, as one addend of each sum is 0, so dk is the same as well);
//  * tmp in a tile of its own (no barrier between the tmp product and its store);
//  * the tiles load through load_tile_async's lean path (no spills here at the 128-register cap).
// P = KP = VP (K and V rounded up to 64, equal): every tile loop has a compile-time trip count.
// Shared memory (bytes): K, dW, V, dU [64][P + 8] T; A, dA then Sym, tmp [64][72] T; f32 γ, β, E [64]; Σ X k and
// Σ Y v partials [2][2 column halves][64]; Σ_j dP KK row partials [2 column halves][64]; Σ_r β dP KK column partials
// [4 row blocks][64]; dg_add [64] (kLatency: fetched at the head's start). P = 128: 100 864 bytes.
template <int P>
struct WyLeanSmem {
  static constexpr int ld = P + 8;
  static constexpr size_t tile = size_t{64} * ld * 2, small = size_t{64} * kL64 * 2;
  static constexpr size_t k = 0, dw = k + tile, v = dw + tile, du = v + tile, a = du + tile, x = a + small,
                          t = x + small, vec = t + small;
  static constexpr size_t bytes = vec + (3 + 4 + 2 + 4 + 1) * 64 * 4;
};

// kTrim (kWyTrimmed; session 14): no dP work in the warp blocks wholly above the diagonal, and
// wy_dv_tile's kFull stores. kNorm (kWyFinStaged with dk_rstd; kTrim only): dk through the l2norm backward
// (wy_store_dk_norm_staged).
template <class T, int P, DkAdd kAdd, bool kTrim, bool kNorm = false>
__global__ void __launch_bounds__(kThr, 2) wy_bwd_lean_kernel(WyBwdParams p, const int64_t* offs, int64_t items) {
  using S = WyLeanSmem<P>;
  constexpr int KT = P / 64, ld = S::ld;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* sK = reinterpret_cast<uint16_t*>(smem + S::k);
  uint16_t* sDw = reinterpret_cast<uint16_t*>(smem + S::dw);
  uint16_t* sV = reinterpret_cast<uint16_t*>(smem + S::v);
  uint16_t* sDu = reinterpret_cast<uint16_t*>(smem + S::du);
  uint16_t* sA = reinterpret_cast<uint16_t*>(smem + S::a);
  uint16_t* sX = reinterpret_cast<uint16_t*>(smem + S::x);  // dA, then Sym
  uint16_t* sT = reinterpret_cast<uint16_t*>(smem + S::t);  // tmp = Aᵀ dA
  float* sG = reinterpret_cast<float*>(smem + S::vec);
  float* sBeta = sG + 64;
  float* sE = sG + 128;
  float* sDots = sG + 192;   // [2][2][64]: Σ X k (0), Σ Y v (1) over the columns j of column-half warp wn
  float* sDbRow = sG + 448;  // [2][64]: Σ_j dP_ij KK_ij over the columns of column-half warp wn
  float* sCol = sG + 576;    // [4][64]: Σ_r β_r dP_ri KK_ri over the rows of row-block warp wm
  float* sDgAdd = sG + 832;  // [64]: kLatency's dg_add of the head
  const Dims& d = p.d;
  const int warp = threadIdx.x / 32, wm = warp % 4, wn = warp / 4, r0 = wm * 16, c0 = wn * 32;
  const int lane = threadIdx.x & 31;
  const int kc = static_cast<int>(d.K), vc = static_cast<int>(d.V);
  // kDkAddBatchedTyped: dg_add fetched at the head's start, typed dv stores.
  constexpr bool kLatency = kAdd == kDkAddBatchedTyped;
  static_assert(!kNorm || (kLatency && kTrim), "kNorm is an instantiation of the kWyTrimmed form");
  const bool dv_typed = kLatency && wy_dv_typed<T>(p);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t w = item / d.H, h = item % d.H;
    for_each_chunk(d, offs, w, [&](const DevChunk& c) {
      const int L = static_cast<int>(c.t1 - c.t0);
      float dk_sum[KT][1][4][4];
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) zero(dk_sum[kt]);
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t hv = h * d.G + g;
        __syncthreads();  // the previous head's (or chunk's) readers of every tile and row vector are done
        if (g == 0) load_tile_async<T, kThr>(sK, ld, 64, P, p.k, p.k.off(c.b, c.t0, h), p.k.s[1], L, kc);
        load_tile_async<T, kThr>(sDw, ld, 64, P, p.dw, p.dw.off(c.b, c.t0, hv), p.dw.s[1], L, kc);
        load_tile_async<T, kThr>(sV, ld, 64, P, p.v, p.v.off(c.b, c.t0, hv), p.v.s[1], L, vc);
        load_tile_async<T, kThr>(sDu, ld, 64, P, p.du, p.du.off(c.b, c.t0, hv), p.du.s[1], L, vc);
        load_tile_async<T, kThr>(sA, kL64, 64, 64, p.A, p.A.off(c.b, c.t0, hv), p.A.s[1], L, L);
        {
          const bool ok = static_cast<int>(threadIdx.x) < L;  // (γ, β fetched while the tiles are in flight)
          const float gi = ok && p.g.present() ? ld_f32(p.g, p.g.off(c.b, c.t0 + threadIdx.x, hv)) : 0.f;
          const float bi = ok ? ld_f32(p.beta, p.beta.off(c.b, c.t0 + threadIdx.x, hv)) : 0.f;
          // kLatency: dg_add of this head's row too (parked in shared memory: no register held through the head),
          // so that its latency is not exposed before the dγ store.
          const float dga = kLatency && ok ? wy_bwd_cu::dg_addend(p, c, hv, threadIdx.x) : 0.f;
          cp_async_wait_all();
          if (threadIdx.x < 64) {
            const int i = threadIdx.x;
            if (kLatency) sDgAdd[i] = dga;
            sG[i] = gi;
            sBeta[i] = bi;
            sE[i] = i < L ? expf(gi) : 0.f;
          }
        }
        __syncthreads();
        // dA → sX; the Σ X k, Σ Y v partials of this warp's rows
        wy_form_dA<T, true>(sX, sDw, sK, ld, P, sDu, sV, ld, P, sBeta, sE, r0, c0, sA, sDots + wn * 64, 2 * 64);
        __syncthreads();
        {  // tmp = Aᵀ dA → sT (pairs of adjacent columns)
          float t[1][4][4];
          zero(t);
          warp_gemm<T, false, true, 1, 4>(t, sA + r0, kL64, sX + c0, kL64, 64);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; e += 2)
              *reinterpret_cast<uint32_t*>(sT + (r0 + frag_row(0, e)) * kL64 + c0 + frag_col(nt, e)) =
                  Elem<T>::from(t[0][nt][e]) | (uint32_t{Elem<T>::from(t[0][nt][e + 1])} << 16);
        }
        __syncthreads();  // tmp complete; every warp is past its reads of dA
        {  // dP = dM ⊙ Γ, dM = −StrictLower(tmp Aᵀ); KK = K Kᵀ in the same fragments; Sym → sX; dβ / dγ partials
          // rp[s]: row r0 + lane / 4 + 8 s over this thread's 8 columns; cp[2 nt + b]: column c0 + 8 nt + 2 (lane % 4)
          // + b over this thread's 2 rows (β_r dP_ri KK_ri).
          float rp[2] = {0.f, 0.f}, cp[8];
#pragma unroll
          for (int q = 0; q < 8; ++q) cp[q] = 0.f;
          // kTrim: the warp blocks wholly above the diagonal (c0 ≥ r0 + 16: warps (0, 1) and (1, 1)) have dP = 0 and
          // store no Sym element (their [i][j > i] entries are the lower blocks' transposes): they skip both products
          // and the element work; their partials stay +0, the sum their ±0 terms give (the same bits).
          if (!kTrim || c0 < r0 + 16) {
            float t[1][4][4], kk[1][4][4];
            zero(t), zero(kk);
            warp_gemm<T, true, false, 1, 4>(t, sT + r0 * kL64, kL64, sA + c0 * kL64, kL64, 64);
            warp_gemm<T, true, false, 1, 4>(kk, sK + r0 * ld, ld, sK + c0 * ld, ld, P);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int i = r0 + frag_row(0, e), j = c0 + frag_col(nt, e);
                // (the exponent is formed only below the diagonal: ≤ 0)
                const float dp = (j < i && i < L) ? -t[0][nt][e] * expf(sG[i] - sG[j]) : 0.f;
                const float pk = dp * kk[0][nt][e];
                rp[e >> 1] += pk;
                cp[2 * nt + (e & 1)] += sBeta[i] * pk;
                // Sym: Bm_ij at [i][j] and [j][i] for j < i, 0 at [i][i]; [i][j > i] is another thread's transpose.
                const uint16_t bm = Elem<T>::from(sBeta[i] * dp);
                if (j < i) {
                  sX[i * kL64 + j] = bm;
                  sX[j * kL64 + i] = bm;
                } else if (j == i) {
                  sX[i * kL64 + i] = 0;
                }
              }
          }
#pragma unroll
          for (int s = 0; s < 2; ++s) {  // the quad: fixed-order butterflies
            rp[s] += __shfl_xor_sync(0xffffffffu, rp[s], 1);
            rp[s] += __shfl_xor_sync(0xffffffffu, rp[s], 2);
          }
#pragma unroll
          for (int q = 0; q < 8; ++q)  // the 8 row groups (xor 4, 8, 16) for the columns
#pragma unroll
            for (int o = 4; o <= 16; o <<= 1) cp[q] += __shfl_xor_sync(0xffffffffu, cp[q], o);
          if ((lane & 3) == 0) {
            sDbRow[wn * 64 + r0 + lane / 4] = rp[0];
            sDbRow[wn * 64 + r0 + lane / 4 + 8] = rp[1];
          }
          if (lane < 4) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
              *reinterpret_cast<float2*>(sCol + wm * 64 + c0 + nt * 8 + 2 * lane) = make_float2(cp[2 * nt], cp[2 * nt + 1]);
          }
        }
        __syncthreads();  // Sym, the dβ / dγ partials complete
        if (static_cast<int>(threadIdx.x) < L) {
          const int i = threadIdx.x;
          const float xk = sDots[i] + sDots[64 + i], yv = sDots[128 + i] + sDots[192 + i];
          const float db = sDbRow[i] + sDbRow[64 + i];
          const float cs = ((sCol[i] + sCol[64 + i]) + sCol[128 + i]) + sCol[192 + i];
          wy_bwd_cu::store_dbeta_dg(p, c, hv, i, sE[i], sBeta[i], xk, yv, db, cs,
                                    kLatency ? sDgAdd[i] : wy_bwd_cu::dg_addend(p, c, hv, i));
        }
        // Per K tile: X = Aᵀ dW ; dk += diag(βE) X + Sym K. Per V tile: Y = Aᵀ dU ; dv = diag(β) Y.
        float part[2];
        wy_dk_tiles<T, KT, true>(dk_sum, part, sA, sDw, sX, sK, ld, sBeta, sE, r0, c0);
#pragma unroll
        for (int e0 = 0; e0 < P; e0 += 64)
          wy_dv_tile<T, true, kLatency, kTrim>(part, p, c, hv, L, vc, e0, sA, sDu, sV, ld, sBeta, r0, c0, dv_typed);
      }
      if constexpr (kNorm)
        wy_store_dk_norm_staged<T, P>(p, c, h, L, kc, dk_sum, sK, ld, reinterpret_cast<float*>(smem + S::dw), r0, c0);
      else
        wy_store_dk<KT, kAdd>(p, c, h, L, kc, dk_sum, r0, c0);
    });
  }
}

template <class T, int P, DkAdd kAdd, bool kTrim = false, bool kNorm = false>
strata_status launch_lean(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  constexpr size_t smem = WyLeanSmem<P>::bytes;
  static_assert(P != 128 || 2 * (smem + 1024) <= 228 * 1024, "two blocks per SM at K = V = 128");
  // (kNorm stages the f32 head sums [64][P + 8] over the dW and V tiles)
  static_assert(!kNorm || WyLeanSmem<P>::v + WyLeanSmem<P>::tile - WyLeanSmem<P>::dw >= size_t{64} * (P + 8) * 4);
  const auto kernel = wy_bwd_lean_kernel<T, P, kAdd, kTrim, kNorm>;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  kernel<<<static_cast<unsigned>(blocks), kThr, smem, stream>>>(p, offs, items);
  return cuda::check_launch("prepare_wy_repr_bwd (mma, two per SM)");
}

template <class T, int P>
strata_status launch_lean(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  if (p.dk_rstd.present())  // (kWyFinStaged only: prepare_wy_repr_bwd_cuda_mma_reject)
    return launch_lean<T, P, kDkAddBatchedTyped, true, true>(p, offs, items, stream);
  switch (p.mma_variant == kWyAuto ? prepare_wy_repr_bwd_auto_variant() : p.mma_variant) {
    case kWyBatchedTyped:
      return launch_lean<T, P, kDkAddBatchedTyped>(p, offs, items, stream);
    case kWyTrimmed:
    case kWyFinStaged:  // (its own form only with dk_rstd)
      return launch_lean<T, P, kDkAddBatchedTyped, true>(p, offs, items, stream);
    default:
      return launch_lean<T, P, kDkAddPairs>(p, offs, items, stream);
  }
}

// The two-per-SM kernel when the shape has it (K, V rounding up to the same 64 multiple, at most 128), in the dk_add
// epilogue form the variant names (kWyAuto: the one prepare_wy_repr_bwd_auto_variant names; kWyTwoPerSm: pair by pair;
// kWyBatchedTyped: a row's dk_add loads before its stores, typed dv, dg_add fetched early; kWyTrimmed: kWyBatchedTyped
// without the dP work of the warp blocks above the diagonal, dv stored without per-pair checks; kWyFinStaged:
// kWyTrimmed, with dk_rstd through wy_store_dk_norm_staged); the pipelined kernel
// otherwise (two-per-SM 1.221 ms against pipelined ~2.16 in GPU runs s11run1 / s7run2: H200, bf16, B = 4, T = 8192,
// H = 16, HV = 32, K = V = 128, fused sums).
template <class T>
strata_status launch_variant(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  const int64_t KP = round64(p.d.K), VP = round64(p.d.V);
  if (p.mma_variant != kWyPipelined && KP == VP && KP <= 128)
    return KP == 64 ? launch_lean<T, 64>(p, offs, items, stream) : launch_lean<T, 128>(p, offs, items, stream);
  return launch_k<T>(p, offs, items, stream);
}

}  // namespace

// The kernel for bf16 / f16 token tensors in the form p.mma_variant names (launch_variant), one unit each.
strata_status launch_bf16(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream);
strata_status launch_f16(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream);

}  // namespace strata::linear_attn::wy_mma
