// CUDA sm_90 tensor-core kernels of the GDN forward chunk operators (gdn_fwd_kernels.h) for bf16 / f16 token
// tensors: warp-level mma.sync m16n8k16 (tile/cuda/mma.cuh) with T = bf16 or f16 operands and f32 accumulators.
// Blocks have 4 warps (128 threads), except wy_mma<kPrepare> and state_o_mma (8 / 16 warps); a chunk is a 64-row tile
// (BT = 16 / 32 / 64 chunks and tail chunks of L < BT rows are zero-padded to 64 rows) and warp w owns rows
// [16 (w % 4), 16 (w % 4) + 16) of every 64-row product.
//
//   kernel          grid.x (1-D)                         block work
//   wy_mma<kKkt>    chunk slot x value head              Akk = gated β K Kᵀ (the whole K chunk in shared memory)
//   wy_mma<kSolve>  chunk slot x value head              A = (I + Akk)^-1 in f32 (blocked, see invert())
//   wy_mma<kRecompute>  chunk slot x value head          w = A diag(β e^γ) K, u = A diag(β) V
//   wy_mma<kPrepare>    chunk slot x value head          all of the above fused: K Kᵀ, f32 inverse, w, u, A
//                                                        (8 warps: warps 0-3 write w, warps 4-7 u)
//   state_o_mma     sequence x value head x 32/64/128-col  the fused state + output pass (o, ht; no h); 8 or 16
//                                                        warps (16: >= 64 columns, same bits)
//   state_mma       sequence x value head x 16/32-col    S [K x 16/32] in f32 registers across the chunks
//   chunk_o_mma     chunk slot x value head x 64-col tile o = scale (diag(e^γ) Q S + (Q Kᵀ ⊙ Γ) Vn)
// The chunk-parallel kernels request every tile of their chunk at once (cp.async groups) and wait once; the
// state pass double-buffers the next chunk's K and W.
//
// Precision (ARCHITECTURE.md §6; spec §6.3). Token inputs (q, k, v, w, u, A, h, Akk) are already bf16/f16, so
// they enter the products exactly; accumulation is f32. Values computed here in f32 that feed a product are
// rounded to T once: the inverse A scaled by β (e^γ) for w / u, and the gated Q Kᵀ for o — fla's model, well
// inside the 16-bit outputs' ceilings (bf16 1e-2, f16 2e-3). The inverse itself is f32 (SIMT, it is small),
// and so is Akk. The state pass carries S in f32 registers; S (in W S) and Vd (in Kᵀ Vd) enter their products
// as a sum of kTerms T values, x ≈ t0 (+ t1) with t_i = round_T(x − Σ_{j<i} t_j): 1 term for bf16 (fla's
// model: the f32 final state ht then carries bf16-level error and is judged at the token dtype, as the
// backward ops' f32 outputs are), 2 for f16 (residual ≤ 2^-22 |x|: f32-class).
//
// Loads: 16-byte cp.async copies when a tensor has the kernel's dtype, unit column stride and 16-byte aligned
// rows; element-wise loads with conversion otherwise (any strides, misaligned views); zero fill past the
// chunk's rows and past K / V. Gate exponentials only see non-positive arguments and masked entries are
// selected, not multiplied. No atomics: every output element is written once by one thread, in a fixed
// order, so results are bitwise reproducible.
//
// The tile loads, stores, the gated Q Kᵀ block, the inverse and the w / u products live in
// gdn_fwd_cuda_mma_tiles.cuh, shared with gdn_fwd_cuda_prep.cu (prep_mma: w, u and the gated Q Kᵀ in one kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/cp_async.cuh"
#include "tile/cuda/mma.cuh"
#include "tile/cuda/vec_io.cuh"
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_mma_tiles.cuh"

namespace strata::linear_attn::gdn {
namespace {

// Block size of wy_mma: 8 warps for the fused kPrepare (the whole WY head of the forward in one launch: warps 4..
// take the u tiles while warps 0..3 take the w tiles, and twice the warps per SM hide the chunk loads and the
// inverse's barriers of the co-resident blocks), 4 for the single-step modes.
__host__ __device__ constexpr int wy_threads(int mode) { return mode == kWyPrepare ? 256 : kThreads; }
// Blocks per SM the register budget must allow: 3 (the shared-memory limit of kPrepare, 74 KB per block at
// K = V = 128) for kPrepare.
__host__ __device__ constexpr int wy_min_blocks(int mode) { return mode == kWyPrepare ? 3 : 1; }

template <class T, int kMode>
__global__ void __launch_bounds__(wy_threads(kMode), wy_min_blocks(kMode)) wy_mma(const GdnFwdParams p) {
  constexpr int kNThr = wy_threads(kMode);
  constexpr bool kNeedK = kMode != kWySolve;
  constexpr bool kNeedV = kMode == kWyRecompute || kMode == kWyPrepare;
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V;
  const int ldk = round64(K) + 8, ldv = round64(V) + 8;  // conflict-free ldmatrix (row stride 16 mod 128 bytes)
  T* Kt = reinterpret_cast<T*>(smem);                      // [64][ldk] K chunk (kNeedK)
  T* Vt = Kt + (kNeedK ? kRows * ldk : 0);                 // [64][ldv] V chunk (kNeedV)
  float* M = reinterpret_cast<float*>(Vt + (kNeedV ? kRows * ldv : 0));  // [64][kLdF] Akk
  float* X = M + kRows * kLdF;                                           // [64][kLdF] inverse
  float* Yf = X + kRows * kLdF;                                          // [3][16][kLdY] merge scratch
  float* gam = Yf + 3 * 16 * kLdY;                                       // [64] γ (0 without g)
  float* bet = gam + kRows;                                              // [64] β (1 without beta)
  const int64_t slot = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / p.shape.G;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  const int BT = static_cast<int>(p.shape.BT);
  const int tid = threadIdx.x, warp = tid >> 5;
  // Both chunk tiles are requested at once (K, then V as a second group): V arrives while K Kᵀ and the
  // inverse run.
  auto load_rows = [&](T* dst, const GdnTensor& t, int64_t head, int64_t D, int ld) {
    if (D % 64 == 0 && lean_tensor<T>(t)) {
      lean_rows<kNThr>(dst, ld, t, off_tok(t, c.b, c.s, head), L, D);
    } else {
      for (int64_t d0 = 0; d0 < D; d0 += 64)
        load_tile<T, 64, kNThr>(dst + d0, ld, t, off_tok(t, c.b, c.s, head), t.st[1], t.st[3], L, d0, D);
    }
  };
  if constexpr (kNeedK) {
    load_rows(Kt, p.k, h, K, ldk);
    cuda::cp_async_commit();
  }
  if constexpr (kNeedV) {
    load_rows(Vt, p.v, hv, V, ldv);
    cuda::cp_async_commit();
  }
  if (kMode != kWySolve)
    for (int i = tid; i < kRows; i += kNThr) {
      float gv = 0.f, bv = 1.f;
      if (i < L) {
        if (p.g.present()) gv = load_f(p.g, off_tok(p.g, c.b, c.s + i, hv));
        if (p.beta.present()) bv = load_f(p.beta, off_tok(p.beta, c.b, c.s + i, hv));
      }
      gam[i] = gv;
      bet[i] = bv;
    }
  if constexpr (kNeedV) cuda::cp_async_wait<1>();  // the K group is complete (V may still be in flight)
  else cuda::cp_async_wait<0>();
  __syncthreads();

  if constexpr (kMode == kWyKkt || kMode == kWyPrepare) {
    // P = K Kᵀ: warp w takes rows 16 (w % 4).. and, with 8 warps, the 16-column blocks np of parity w / 4 (4
    // warps: every block), only blocks at or left of the diagonal; it writes M for the columns of its blocks
    // (zero right of the diagonal), so the gating's exponentials are split across all warps too.
    constexpr int kGroups = kNThr / kThreads;  // 1 or 2 warps per row block
    const int rw = warp & 3, grp = warp >> 2;
    FragC P[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) P[n].zero();
    for (int64_t d0 = 0; d0 < K; d0 += 64) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const FragA a = mma::load_a(Kt, ldk, 16 * rw, static_cast<int>(d0) + 16 * ks);
#pragma unroll
        for (int np = 0; np < 4; ++np)
          if (np <= rw && np % kGroups == grp) {
            FragB b0, b1;
            mma::load_b2(b0, b1, Kt, ldk, static_cast<int>(d0) + 16 * ks, 16 * np);
            mma::mma16816<T>(P[2 * np], a, b0);
            mma::mma16816<T>(P[2 * np + 1], a, b1);
          }
      }
    }
    // M[i][j] = β_i (k_i·k_j) e^{γ_i − γ_j} for j < i < L, else 0 (selected, so e^{...} never overflows).
#pragma unroll
    for (int n = 0; n < 8; ++n)
      if ((n >> 1) % kGroups == grp)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * rw + mma::c_row(e), j = 8 * n + mma::c_col(e);
          M[i * kLdF + j] = (j < i && i < L) ? bet[i] * P[n].x[e] * expf(gam[i] - gam[j]) : 0.f;
        }
    __syncthreads();
    if constexpr (kMode == kWyKkt) {
      store_chunk_mat<T, kNThr>(p.Akk, c, hv, L, BT, M);
      return;
    }
  }
  if constexpr (kMode == kWySolve) {
    for (int idx = tid; idx < kRows * kRows; idx += kNThr) {
      const int i = idx >> 6, j = idx & 63;
      M[i * kLdF + j] = (j < i && i < L) ? load_f(p.Akk, off_tok(p.Akk, c.b, c.s + i, hv) + j * p.Akk.st[3]) : 0.f;
    }
    __syncthreads();
  }
  if constexpr (kMode == kWySolve || kMode == kWyPrepare) {
    invert<kNThr>(M, X, Yf);
    if (p.A.present()) store_chunk_mat<T, kNThr>(p.A, c, hv, L, BT, X);  // absent: the fused forward needs only w, u
    if constexpr (kMode == kWySolve) return;
  }
  if constexpr (kMode == kWyRecompute) {
    for (int idx = tid; idx < kRows * kRows; idx += kNThr) {
      const int i = idx >> 6, j = idx & 63;
      X[i * kLdF + j] = (j <= i && i < L) ? load_f(p.A, off_tok(p.A, c.b, c.s + i, hv) + j * p.A.st[3]) : 0.f;
    }
  }
  if constexpr (kMode == kWyRecompute || kMode == kWyPrepare) {
    // Column scales (M's storage is free now): fw = β e^γ (w), fu = β (u); 0 past L.
    float* fw = M;
    float* fu = M + kRows;
    __syncthreads();
    for (int j = tid; j < kRows; j += kNThr) {
      fw[j] = j < L ? bet[j] * expf(gam[j]) : 0.f;
      fu[j] = j < L ? bet[j] : 0.f;
    }
    cuda::cp_async_wait<0>();  // the V chunk
    __syncthreads();
    // Warp w: rows 16 (w % 4).. of w (w < 4, or all four warps of a 4-warp block) and u (w >= 4, or all).
    const int rw = warp & 3;
    if (kNThr == 128 || warp < 4) wu_tiles<T>(p.w, Kt, ldk, K, X, fw, rw, c, hv, L);
    if (kNThr == 128 || warp >= 4) wu_tiles<T>(p.u, Vt, ldv, V, X, fu, rw, c, hv, L);
  }
}

// ---------------------------------------------------------------- the state pass
// Stores x (a 16 x 8 accumulator tile at (m0, n0)) as kTerms 16-bit tiles t_0.. (term stride `tstride`
// elements) with x ≈ Σ t_i, t_i = round(x − Σ_{j<i} t_j).
template <class T, int kTerms>
__device__ __forceinline__ void store_terms(T* base, int tstride, int ld, int m0, int n0, const FragC& x) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  float r[4] = {x.x[0], x.x[1], x.x[2], x.x[3]};
#pragma unroll
  for (int term = 0; term < kTerms; ++term) {
    const uint32_t lo = mma::pack2<T>(r[0], r[1]), hi = mma::pack2<T>(r[2], r[3]);
    T* tb = base + term * tstride;
    *reinterpret_cast<uint32_t*>(tb + (m0 + g) * ld + n0 + t2) = lo;
    *reinterpret_cast<uint32_t*>(tb + (m0 + g + 8) * ld + n0 + t2) = hi;
    if (term + 1 < kTerms) {
      const float2 fl = mma::unpack2<T>(lo), fh = mma::unpack2<T>(hi);
      r[0] -= fl.x, r[1] -= fl.y, r[2] -= fh.x, r[3] -= fh.y;
    }
  }
}

// Two stages of K and W [64 x kKB]; the S terms [kTerms][kKB][kLdS], whose storage the Vd terms
// [kTerms][64][kLdS] reuse once W S is done; γ [64].
template <int kKB, int kTerms, int kBV>
constexpr size_t state_smem() {
  return 2 * 2 * kRows * (kKB + 8) * 2 + kTerms * kKB * (kBV + 8) * 2 + kRows * 4;
}

// S [K x kBV] (columns v0..v0+kBV-1, kBV = 16 or 32) of one (sequence, value head) in f32 registers across the chunks; K <= kKB
// (64 / 128 / 256). Warp w owns S rows [w·kKB/4, (w+1)·kKB/4) as kMT x kBV/8 accumulator tiles. Per chunk c:
// the next chunk's K and W [64 x kKB] are requested (cp.async, two stages) before anything else; S's terms go
// to shared, h[c] = S, v_new = u − W S (warp w: rows 16w..), Vd = v_new e^{γ_last − γ} as terms, then
// S = e^{γ_last} S + Kᵀ Vd on the tensor cores. Barriers per chunk: (A) stage and operand reuse, (B) this
// chunk's tiles and S terms visible, (C) W S done (Vd reuses the S terms' storage), (D) Vd terms visible.
template <class T, int kKB, int kTerms, int kBV>
__global__ void __launch_bounds__(kThreads) state_mma(const GdnFwdParams p, int64_t nvt) {
  constexpr int kLdK = kKB + 8;
  constexpr int kMT = kKB / 64;  // 16-row tiles of S per warp
  constexpr int kNT = kBV / 8;   // 8-column accumulator tiles of a kBV-column block
  constexpr int kNP = kBV / 16;  // pairs of them (one ldmatrix.x4 each)
  constexpr int kLdS = kBV + 8;  // leading dim of the kBV-column 16-bit operand tiles (conflict-free)
  constexpr int kStage = 2 * kRows * kLdK;  // elements of one stage (K then W)
  extern __shared__ __align__(16) unsigned char smem[];
  T* stages = reinterpret_cast<T*>(smem);  // [2][K, W][64][kLdK]
  T* Sop = stages + 2 * kStage;            // [kTerms][kKB][kLdS]
  T* Vop = Sop;                            // [kTerms][64][kLdS], after W S
  float* gam = reinterpret_cast<float*>(Sop + kTerms * kKB * kLdS);  // [64]
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V, BT = p.shape.BT;
  const int64_t vt = blockIdx.x % nvt, rest = blockIdx.x / nvt;
  const int64_t n = rest / HV, hv = rest % HV, h = hv / p.shape.G;
  const int64_t v0 = vt * kBV;
  const SeqPos sq = locate_sequence(p.chunks, n);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int srow0 = warp * (kKB / 4);

  FragC S[kMT][kNT];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t a = srow0 + 16 * mt + mma::c_row(e), col = v0 + 8 * nt + mma::c_col(e);
        S[mt][nt].x[e] = (p.h0.present() && a < K && col < V)
                             ? load_f(p.h0, n * p.h0.st[0] + hv * p.h0.st[1] + a * p.h0.st[2] + col * p.h0.st[3])
                             : 0.f;
      }

  // Requests chunk [t, t + BT) of the sequence into stage `st` (one cp.async group).
  auto request = [&](int64_t t, int st) {
    const int Lr = static_cast<int>(t + BT < sq.eos ? BT : sq.eos - t);
    T* Kst = stages + st * kStage;
    load_tile<T, kKB>(Kst, kLdK, p.k, off_tok(p.k, sq.b, t, h), p.k.st[1], p.k.st[3], Lr, 0, K);
    load_tile<T, kKB>(Kst + kRows * kLdK, kLdK, p.w, off_tok(p.w, sq.b, t, hv), p.w.st[1], p.w.st[3], Lr, 0, K);
    cuda::cp_async_commit();
  };
  // γ of row tid of chunk [t, t + BT) (0 past the chunk or without g), fetched one chunk ahead into a register
  // so that its global latency is not on the sequential path.
  auto fetch_gamma = [&](int64_t t) {
    const int64_t Lr = t + BT < sq.eos ? BT : sq.eos - t;
    return (tid < Lr && p.g.present()) ? load_f(p.g, off_tok(p.g, sq.b, t + tid, hv)) : 0.f;
  };
  float g_next = 0.f;
  if (sq.bos < sq.eos) {
    request(sq.bos, 0);
    g_next = fetch_gamma(sq.bos);
  }
  const bool u_vec = pair_vec<T>(p.u), vn_vec = p.v_new.present() && pair_vec<T>(p.v_new);
  int64_t cidx = sq.chunk0;
  int st = 0;
  for (int64_t t0 = sq.bos; t0 < sq.eos; t0 += BT, ++cidx, st ^= 1) {
    const int L = static_cast<int>(t0 + BT < sq.eos ? BT : sq.eos - t0);
    const bool more = t0 + BT < sq.eos;
    const T* Ks = stages + st * kStage;
    const T* Ws = Ks + kRows * kLdK;
    __syncthreads();  // (A) the previous chunk's readers of stage st ^ 1, Vop (= Sop) and gam are done
    if (more) request(t0 + BT, st ^ 1);
    static_assert(kThreads >= kRows, "a thread per chunk row");
    if (tid < kRows) gam[tid] = g_next;
    if (more) g_next = fetch_gamma(t0 + BT);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        store_terms<T, kTerms>(Sop, kKB * kLdS, kLdS, srow0 + 16 * mt, 8 * nt, S[mt][nt]);
    // h[c] = S (chunk start state): from the S terms in shared memory after (B) when h is a unit-stride,
    // 16-byte-aligned T tensor (term 0 is S rounded to T, the same bits as a direct store), else from the f32
    // registers here.
    const bool h_out = p.h.present() && (!p.chunks.varlen() || cidx < p.shape.NT);
    const int64_t hb = h_out ? h_base(p.h, p.chunks, sq.b, cidx) + hv * p.h.st[2] : 0;
    const bool h_vec = h_out && p.h.dtype == dtype_of<T>() && p.h.st[4] == 1 && p.h.st[3] % 8 == 0 &&
                       (reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(p.h.data) + hb + v0) & 15u) == 0;
    if (h_out && !h_vec) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t a = srow0 + 16 * mt + mma::c_row(2 * half);
          if (a >= K) continue;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            store_pair(p.h, hb + a * p.h.st[3], p.h.st[4], v0 + 8 * nt + mma::c_col(0), V, S[mt][nt].x[2 * half],
                       S[mt][nt].x[2 * half + 1]);
        }
    }
    // u in the accumulator layout of v_new (rows 16w.., 32 columns).
    float uv[kNT][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * warp + mma::c_row(2 * half);
      const int64_t ro = off_tok(p.u, sq.b, t0 + (i < L ? i : 0), hv);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        uv[nt][2 * half] = uv[nt][2 * half + 1] = 0.f;
        if (i < L)
          load_pair_v<T>(p.u, u_vec, ro, v0 + 8 * nt + mma::c_col(0), V, uv[nt][2 * half], uv[nt][2 * half + 1]);
      }
    }
    if (more) cuda::cp_async_wait<1>();  // this chunk's group is complete, the next one may be in flight
    else cuda::cp_async_wait<0>();
    __syncthreads();  // (B)
    if (h_vec) {
      // 16-byte rows segments of S's term 0 (rows < K; a segment crossing V is copied element by element).
      constexpr int kSeg = kBV / 8;
      uint16_t* hp = static_cast<uint16_t*>(p.h.data) + hb + v0;  // element (0, v0) of this block's h[c]
      const uint16_t* s0 = reinterpret_cast<const uint16_t*>(Sop);
      for (int idx = tid; idx < kKB * kSeg; idx += kThreads) {
        const int a = idx / kSeg, q = idx - a * kSeg;
        const int64_t col = v0 + 8 * q;
        if (a >= K || col >= V) continue;
        const uint16_t* src = s0 + a * kLdS + 8 * q;
        uint16_t* dst = hp + a * p.h.st[3] + 8 * q;
        if (col + 8 <= V) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; col + e < V; ++e) dst[e] = src[e];
        }
      }
    }
    // W S (warp w: rows 16w.., 32 columns), S as kTerms operands.
    FragC acc[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[nt].zero();
    const int ksteps = static_cast<int>((K + 15) / 16);
#pragma unroll
    for (int ks = 0; ks < kKB / 16; ++ks) {
      if (ks >= ksteps) break;
      const FragA a = mma::load_a(Ws, kLdK, 16 * warp, 16 * ks);
#pragma unroll
      for (int term = 0; term < kTerms; ++term)
#pragma unroll
        for (int np = 0; np < kNP; ++np) {
          FragB b0, b1;
          mma::load_b2_trans(b0, b1, Sop + term * kKB * kLdS, kLdS, 16 * ks, 16 * np);
          mma::mma16816<T>(acc[2 * np], a, b0);
          mma::mma16816<T>(acc[2 * np + 1], a, b1);
        }
    }
    const float glast = gam[L - 1];
    __syncthreads();  // (C) every warp is done with the S terms: Vd's terms take their storage
    FragC vd[kNT];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * warp + mma::c_row(2 * half);
      const float f = i < L ? expf(glast - gam[i]) : 0.f;
      const bool store = p.v_new.present() && i < L;
      const int64_t ro = store ? off_tok(p.v_new, sq.b, t0 + i, hv) : 0;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const float x0 = uv[nt][2 * half] - acc[nt].x[2 * half];
        const float x1 = uv[nt][2 * half + 1] - acc[nt].x[2 * half + 1];
        if (store) store_pair_v<T>(p.v_new, vn_vec, ro, v0 + 8 * nt + mma::c_col(0), V, x0, x1);
        vd[nt].x[2 * half] = x0 * f;
        vd[nt].x[2 * half + 1] = x1 * f;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) store_terms<T, kTerms>(Vop, kRows * kLdS, kLdS, 16 * warp, 8 * nt, vd[nt]);
    __syncthreads();  // (D)
    // S = e^{γ_last} S + Kᵀ Vd: A = Kᵀ (Ks is [t][key]: transposed loads), k = chunk position.
    const float decay = expf(glast);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[mt][nt].x[e] *= decay;
      if (srow0 + 16 * mt >= K) continue;  // rows past K stay 0 (K's columns there are zero-filled)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if (16 * ks >= L) break;
        const FragA a = mma::load_a_trans(Ks, kLdK, srow0 + 16 * mt, 16 * ks);
#pragma unroll
        for (int term = 0; term < kTerms; ++term)
#pragma unroll
          for (int np = 0; np < kNP; ++np) {
            FragB b0, b1;
            mma::load_b2_trans(b0, b1, Vop + term * kRows * kLdS, kLdS, 16 * ks, 16 * np);
            mma::mma16816<T>(S[mt][2 * np], a, b0);
            mma::mma16816<T>(S[mt][2 * np + 1], a, b1);
          }
      }
    }
  }
  if (p.ht.present()) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t a = srow0 + 16 * mt + mma::c_row(e), col = v0 + 8 * nt + mma::c_col(e);
          if (a < K && col < V)
            store_f(p.ht, n * p.ht.st[0] + hv * p.ht.st[1] + a * p.ht.st[2] + col * p.ht.st[3], S[mt][nt].x[e]);
        }
  }
}

// ---------------------------------------------------------------- the fused state + output pass
// chunk_gated_delta_rule's plain forward needs o and the final state, not the chunk states h: this pass
// computes o inside the state recurrence, so h [B, NT, HV, K, V] (0.5 GB at B=4 T=8192 HV=32 K=V=128) is never
// written nor read back and chunk_fwd_o's launch disappears. Per chunk c with start state S_c (f32 registers):
//   v_new = u − W S_c,  o = scale (diag(e^γ) Q S_c + (Q Kᵀ ⊙ Γ, lower incl. diagonal) v_new),
//   S_{c+1} = e^{γ_last} S_c + Kᵀ (v_new ⊙ e^{γ_last − γ}).
// The precision model is that of the unfused path: S enters W S and Q S as kTerms T operands (term 0 = the
// bf16 / f16 h the unfused path writes), v_new enters P v_new rounded to T (the v_new it writes) and P is
// rounded to T (chunk_o_mma's c_to_a); only the f32 summation order differs.
//
// Block: kWarps = 8 or 16 warps, one (sequence, value head, kBV-column block of S); K <= 128. The state S
// [128 x kBV] is split into 8 row tiles x kWarps / 8 column parts: warp w holds rows 16 (w % 8).., columns
// (w / 8) kBV / (kWarps / 8).. as accumulator tiles. The chunk products are split so that every warp has work:
//   warp w: chunk rows rb = w % 4 (16 rows), column part w / 4 (kBV / (kWarps / 4) columns) of W S, Q S, v_new, o;
//   the 10 lower 16 x 16 blocks of P = Q Kᵀ: blocks w, w + kWarps, ... (8 warps: warps 0, 1 take two).
// 16 warps (session 7): the same products with half the columns per warp, so twice the warps per scheduler hide
// the step's dependent mma / ldmatrix chains and P's 10 blocks take one round; every output element sees the
// same products in the same order as with 8 warps, so the two give the same bits. <= 128 registers a thread
// (512 threads, one block per SM); kBV >= 64 (a warp's column part is >= 16 columns).
// K, W, Q [64 x 128] and u [64 x kBV] of chunk c + 1 are requested (cp.async, two stages) right after the
// chunk-c tiles are seen complete, so their latency hides behind chunk c's work. Two barriers per chunk:
//   (B) stage c and the S terms visible (and every reader of the other stage, of P, Vn, Vd done),
//   (D) P, Vn and the Vd terms visible (and every reader of the S terms done).

// kPreP: the gated Q Kᵀ is read from p.Pqk (one more tile per stage) instead of computed into the single P tile.
template <int kTerms, int kBV, int kStages, bool kPreP = false>
constexpr size_t state_o_smem() {
  constexpr int kLdS = kBV + 8;
  return size_t(kStages) * (3 * kRows * kLdKF + kRows * kLdS + (kPreP ? kRows * kLdT : 0)) * 2
         // stages of K, W, Q [64][kLdKF], U [64][kLdS] (kPreP: and P [64][kLdT])
         + size_t(kTerms) * kKF * kLdS * 2                    // S terms [kTerms][128][kLdS]
         + size_t(kRows) * kLdS * 2                           // Vn [64][kLdS] (v_new rounded to T)
         + size_t(kTerms) * kRows * kLdS * 2                  // Vd terms [kTerms][64][kLdS]
         + (kPreP ? 0 : size_t(kRows) * kLdT * 2)             // P [64][kLdT] (gated Q Kᵀ rounded to T)
         + kRows * 4;                                         // γ
}

template <class T, int kTerms, int kBV, int kStages, bool kPreP, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 1) state_o_mma(const GdnFwdParams p, int64_t nvt) {
  static_assert(kStages == 2 || kStages == 3, "two or three chunk stages");
  static_assert(kWarps == 8 || kWarps == 16, "8 or 16 warps");
  constexpr int kNThr = kWarps * 32;
  constexpr int kLdS = kBV + 8;     // leading dim of the kBV-column 16-bit tiles (conflict-free ldmatrix)
  constexpr int kBS = kBV / (kWarps / 8);  // columns of a warp's part of S
  constexpr int kNT = kBS / 8;      // accumulator tiles of a warp's part of S
  constexpr int kNP = kBS / 16;
  constexpr int kPart = kBV / (kWarps / 4);  // columns of a warp's share of W S, Q S, v_new, o
  constexpr int kNTh = kPart / 8;
  constexpr int kNPh = kPart / 16;
  static_assert(kNPh >= 1 && kNP >= 1, "a warp's column parts are >= 16 columns (kBV >= 32 with 8 warps, 64 with 16)");
  constexpr int kTile = kRows * kLdKF;
  constexpr int kStage = 3 * kTile + kRows * kLdS + (kPreP ? kRows * kLdT : 0);  // K, W, Q, U (, P)
  extern __shared__ __align__(16) unsigned char smem[];
  T* stages = reinterpret_cast<T*>(smem);      // [kStages][stage]
  T* Sop = stages + kStages * kStage;          // [kTerms][128][kLdS]
  T* Vn = Sop + kTerms * kKF * kLdS;           // [64][kLdS]
  T* Vd = Vn + kRows * kLdS;                   // [kTerms][64][kLdS]
  T* Ps = Vd + kTerms * kRows * kLdS;          // [64][kLdT] (kInline only; kPreP: P is in each stage)
  float* gam = reinterpret_cast<float*>(Ps + (kPreP ? 0 : kRows * kLdT));  // [64]
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V, BT = p.shape.BT;
  const int64_t vt = blockIdx.x % nvt, rest = blockIdx.x / nvt;
  const int64_t n = rest / HV, hv = rest % HV, h = hv / p.shape.G;
  const int64_t v0 = vt * kBV;
  const SeqPos sq = locate_sequence(p.chunks, n);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int srow0 = 16 * (warp & 7);           // S rows of this warp
  const int scol0 = (warp >> 3) * kBS;         // first S column (inside the block) of this warp
  const int rb = warp & 3, ch = warp >> 2;     // chunk row block and column part of this warp
  const int c0 = ch * kPart;                   // first column (inside the block) of the warp's part
  // Every product runs all 128 / 16 key steps and all 4 chunk-row steps: the K / W / Q tile columns >= K, the
  // S rows >= K and the tile / Vd rows >= L are exact zeros, so the extra steps add +0 and leave the values as
  // they are, and the k-loops stay free of branches (an early exit per step kept the compiler from issuing the
  // next step's ldmatrix before the current step's mma: a dependent chain on the pass's critical path).

  FragC S[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t a = srow0 + mma::c_row(e), col = v0 + scol0 + 8 * nt + mma::c_col(e);
      S[nt].x[e] = (p.h0.present() && a < K && col < V)
                       ? load_f(p.h0, n * p.h0.st[0] + hv * p.h0.st[1] + a * p.h0.st[2] + col * p.h0.st[3])
                       : 0.f;
    }

  // Requests chunk [t, t + BT) into stage `st` (one cp.async group).
  // Lean loads: when K = 128 and k, w, q, u have dtype T, unit column stride, strides that are multiples of 8
  // elements and 16-byte aligned data, and the block's kBV columns lie inside V, every 16-byte segment a thread
  // copies sits at a fixed (row, segment) of its tile: the shared offsets are constants and a chunk costs one
  // 64-bit pointer per tile plus one predicated cp.async per segment (rows >= Lr zero-filled, nothing read),
  // instead of load_tile's per-segment address arithmetic and three-way branch (~30 instructions a segment,
  // ~1/4 of a thread's instructions per chunk step).
  const bool lean = K == kKF && v0 + kBV <= V && lean_tensor<T>(p.k) && lean_tensor<T>(p.w) &&
                    lean_tensor<T>(p.q) && lean_tensor<T>(p.u);
  // kPreP: the P tile by fixed slots too when its rows are 64 16-bit elements of a lean tensor.
  const bool lean_p = kPreP && lean && BT == kRows && lean_tensor<T>(p.Pqk);
  auto request = [&](int64_t t, int st) {
    const int Lr = static_cast<int>(t + BT < sq.eos ? BT : sq.eos - t);
    T* base = stages + st * kStage;
    if (lean) {
      const uint32_t sb = static_cast<uint32_t>(__cvta_generic_to_shared(base));
      constexpr int kSegK = kKF / 8, kRowStepK = kNThr / kSegK;  // 16 segments a row, kNThr / 16 rows a pass
      static_assert(kRows % kRowStepK == 0, "whole passes over the K / W / Q tiles");
      const int qk = tid % kSegK, rk = tid / kSegK;
      const uint16_t* srcs[3] = {
          static_cast<const uint16_t*>(p.k.data) + off_tok(p.k, sq.b, t, h) + qk * 8,
          static_cast<const uint16_t*>(p.w.data) + off_tok(p.w, sq.b, t, hv) + qk * 8,
          static_cast<const uint16_t*>(p.q.data) + off_tok(p.q, sq.b, t, h) + qk * 8};
      const int64_t rss[3] = {p.k.st[1], p.w.st[1], p.q.st[1]};
#pragma unroll
      for (int m = 0; m < 3; ++m)
#pragma unroll
        for (int it = 0; it < kRows / kRowStepK; ++it) {
          const int r = rk + it * kRowStepK;
          const bool ok = r < Lr;
          cp_async16_s(sb + static_cast<uint32_t>((m * kTile + r * kLdKF + qk * 8) * 2),
                       ok ? srcs[m] + r * rss[m] : srcs[m], ok);
        }
      constexpr int kSegU = kBV / 8, kRowStepU = kNThr / kSegU;
      static_assert(kRows % kRowStepU == 0 && kNThr % kSegU == 0, "whole passes over the U tile");
      const int qu = tid % kSegU, ru = tid / kSegU;
      const uint16_t* su = static_cast<const uint16_t*>(p.u.data) + off_tok(p.u, sq.b, t, hv) + v0 + qu * 8;
#pragma unroll
      for (int it = 0; it < kRows / kRowStepU; ++it) {
        const int r = ru + it * kRowStepU;
        const bool ok = r < Lr;
        cp_async16_s(sb + static_cast<uint32_t>((3 * kTile + r * kLdS + qu * 8) * 2), ok ? su + r * p.u.st[1] : su,
                     ok);
      }
      if constexpr (kPreP) {
        if (lean_p) {
          // P [64 x 64]: 8 segments a row, 32 rows a pass, fixed slots as for K / W / Q.
          constexpr int kSegP = kRows / 8, kRowStepP = kNThr / kSegP;
          static_assert(kRows % kRowStepP == 0, "whole passes over the P tile");
          const int qp = tid % kSegP, rp = tid / kSegP;
          const uint16_t* sp = static_cast<const uint16_t*>(p.Pqk.data) + off_tok(p.Pqk, sq.b, t, hv) + qp * 8;
#pragma unroll
          for (int it = 0; it < kRows / kRowStepP; ++it) {
            const int r = rp + it * kRowStepP;
            const bool ok = r < Lr;
            cp_async16_s(sb + static_cast<uint32_t>((3 * kTile + kRows * kLdS + r * kLdT + qp * 8) * 2),
                         ok ? sp + r * p.Pqk.st[1] : sp, ok);
          }
        } else {
          load_tile<T, kRows, kNThr>(base + 3 * kTile + kRows * kLdS, kLdT, p.Pqk, off_tok(p.Pqk, sq.b, t, hv),
                                         p.Pqk.st[1], p.Pqk.st[3], Lr, 0, BT);
        }
      }
      cuda::cp_async_commit();
      return;
    }
    load_tile<T, kKF, kNThr>(base, kLdKF, p.k, off_tok(p.k, sq.b, t, h), p.k.st[1], p.k.st[3], Lr, 0, K);
    load_tile<T, kKF, kNThr>(base + kTile, kLdKF, p.w, off_tok(p.w, sq.b, t, hv), p.w.st[1], p.w.st[3], Lr, 0, K);
    load_tile<T, kKF, kNThr>(base + 2 * kTile, kLdKF, p.q, off_tok(p.q, sq.b, t, h), p.q.st[1], p.q.st[3], Lr, 0,
                                 K);
    load_tile<T, kBV, kNThr>(base + 3 * kTile, kLdS, p.u, off_tok(p.u, sq.b, t, hv), p.u.st[1], p.u.st[3], Lr, v0,
                                 V);
    if constexpr (kPreP)
      load_tile<T, kRows, kNThr>(base + 3 * kTile + kRows * kLdS, kLdT, p.Pqk, off_tok(p.Pqk, sq.b, t, hv),
                                     p.Pqk.st[1], p.Pqk.st[3], Lr, 0, BT);
    cuda::cp_async_commit();
  };
  auto fetch_gamma = [&](int64_t t) {
    const int64_t Lr = t + BT < sq.eos ? BT : sq.eos - t;
    return (tid < Lr && p.g.present()) ? load_f(p.g, off_tok(p.g, sq.b, t + tid, hv)) : 0.f;
  };
  float g_next = 0.f;
  if (sq.bos < sq.eos) {
    request(sq.bos, 0);
    g_next = fetch_gamma(sq.bos);
    // Three stages: chunk c + 2 is requested at chunk c, so a load has two chunk steps to land.
    if (kStages == 3 && sq.bos + BT < sq.eos) request(sq.bos + BT, 1);
  }
  const float scale = p.shape.scale;
  const bool o_vec = pair_vec<T>(p.o), vn_vec = p.v_new.present() && pair_vec<T>(p.v_new);
  const bool o_fast = o_vec && v0 + c0 + kPart <= V;  // pair_vec: v0, c0 and c_col(0) are even
  int st = 0;
  for (int64_t t0 = sq.bos; t0 < sq.eos; t0 += BT, st = st + 1 == kStages ? 0 : st + 1) {
    const int L = static_cast<int>(t0 + BT < sq.eos ? BT : sq.eos - t0);
    const bool more = t0 + BT < sq.eos;
    const T* Ks = stages + st * kStage;
    const T* Ws = Ks + kTile;
    const T* Qs = Ks + 2 * kTile;
    const T* Us = Ks + 3 * kTile;
    const T* Pt = kPreP ? Us + kRows * kLdS : Ps;  // the gated Q Kᵀ of this chunk
    // γ and the S terms: their previous readers finished before the previous chunk's (D).
    static_assert(kNThr >= kRows, "a thread per chunk row");
    if (tid < kRows) gam[tid] = g_next;
    if (more) g_next = fetch_gamma(t0 + BT);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) store_terms<T, kTerms>(Sop, kKF * kLdS, kLdS, srow0, scol0 + 8 * nt, S[nt]);
    if constexpr (kStages == 3) {
      // In flight: this chunk's group and (more) the next one's, committed after it.
      if (more) cuda::cp_async_wait<1>();
      else cuda::cp_async_wait<0>();
      __syncthreads();  // (B)
      // Stage (st + 2) % 3 held chunk c - 1, whose every reader finished before (B).
      if (t0 + 2 * BT < sq.eos) request(t0 + 2 * BT, st == 0 ? 2 : st - 1);
    } else {
      cuda::cp_async_wait<0>();  // this chunk's group (the only one in flight)
      __syncthreads();           // (B)
      if (more) request(t0 + BT, st ^ 1);  // every reader of stage st ^ 1 finished before (B)
    }

    // P = Q Kᵀ on the lower blocks, gated and masked (j <= i < L), rounded to T into Ps (kPreP: qk_gate_mma did
    // exactly this, with the same fragments in the same order, so the bits are the same).
    if constexpr (!kPreP)
      for (int bi = warp; bi < 10; bi += kWarps) {
        int prb, pcb;
        lower_block(bi, prb, pcb);
        FragC pc[2];
        qk_gated_block<T>(Qs, Ks, kLdKF, prb, pcb, gam, L, pc);
#pragma unroll
        for (int hn = 0; hn < 2; ++hn) mma::store_c<T>(Ps, kLdT, 16 * prb, 16 * pcb + 8 * hn, pc[hn]);
      }

    // W S and Q S (rows 16 rb.., columns c0..c0 + kPart), S as kTerms operands shared by both products.
    FragC acc[kNTh], O[kNTh];
#pragma unroll
    for (int nt = 0; nt < kNTh; ++nt) acc[nt].zero(), O[nt].zero();
#pragma unroll
    for (int ks = 0; ks < kKF / 16; ++ks) {
      const FragA aw = mma::load_a(Ws, kLdKF, 16 * rb, 16 * ks);
      const FragA aq = mma::load_a(Qs, kLdKF, 16 * rb, 16 * ks);
#pragma unroll
      for (int term = 0; term < kTerms; ++term)
#pragma unroll
        for (int np = 0; np < kNPh; ++np) {
          FragB b0, b1;
          mma::load_b2_trans(b0, b1, Sop + term * kKF * kLdS, kLdS, 16 * ks, c0 + 16 * np);
          mma::mma16816<T>(acc[2 * np], aw, b0);
          mma::mma16816<T>(acc[2 * np + 1], aw, b1);
          mma::mma16816<T>(O[2 * np], aq, b0);
          mma::mma16816<T>(O[2 * np + 1], aq, b1);
        }
    }
    // v_new = u − W S; Vn = v_new (T), Vd = v_new e^{γ_last − γ_i} (terms); O = e^{γ_i} O (0 for rows >= L).
    const float glast = gam[L - 1];
    float fd[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * rb + mma::c_row(2 * half);
      fd[half] = i < L ? expf(glast - gam[i]) : 0.f;
      const float eo = i < L ? expf(gam[i]) : 0.f;
      const bool store = p.v_new.present() && i < L;
      const int64_t ro = store ? off_tok(p.v_new, sq.b, t0 + i, hv) : 0;
#pragma unroll
      for (int nt = 0; nt < kNTh; ++nt) {
        const int cl = c0 + 8 * nt + mma::c_col(0);
        const float2 uu = mma::unpack2<T>(*reinterpret_cast<const uint32_t*>(Us + i * kLdS + cl));
        const float x0 = uu.x - acc[nt].x[2 * half], x1 = uu.y - acc[nt].x[2 * half + 1];
        if (store) store_pair_v<T>(p.v_new, vn_vec, ro, v0 + cl, V, x0, x1);
        acc[nt].x[2 * half] = x0, acc[nt].x[2 * half + 1] = x1;  // acc holds v_new from here on
        O[nt].x[2 * half] *= eo, O[nt].x[2 * half + 1] *= eo;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNTh; ++nt) {
      mma::store_c<T>(Vn, kLdS, 16 * rb, c0 + 8 * nt, acc[nt]);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt].x[e] *= fd[e >> 1];
      store_terms<T, kTerms>(Vd, kRows * kLdS, kLdS, 16 * rb, c0 + 8 * nt, acc[nt]);
    }
    __syncthreads();  // (D)

    // o = scale (O + P Vn) for rows < L (P's blocks right of the diagonal are never read).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      if (kk <= rb) {
        const FragA a = mma::load_a(Pt, kLdT, 16 * rb, 16 * kk);
#pragma unroll
        for (int np = 0; np < kNPh; ++np) {
          FragB b0, b1;
          mma::load_b2_trans(b0, b1, Vn, kLdS, 16 * kk, c0 + 16 * np);
          mma::mma16816<T>(O[2 * np], a, b0);
          mma::mma16816<T>(O[2 * np + 1], a, b1);
        }
      }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * rb + mma::c_row(2 * half);
      if (i >= L) continue;
      const int64_t ro = off_tok(p.o, sq.b, t0 + i, hv);
      if (o_fast) {
        // The warp's kPart columns lie inside V: one row pointer, aligned 32-bit stores at fixed offsets.
        uint16_t* row = static_cast<uint16_t*>(p.o.data) + ro + v0 + c0 + mma::c_col(0);
#pragma unroll
        for (int nt = 0; nt < kNTh; ++nt)
          *reinterpret_cast<uint32_t*>(row + 8 * nt) =
              mma::pack2<T>(scale * O[nt].x[2 * half], scale * O[nt].x[2 * half + 1]);
      } else {
#pragma unroll
        for (int nt = 0; nt < kNTh; ++nt) {
          const int64_t col = v0 + c0 + 8 * nt + mma::c_col(0);
          const float a = scale * O[nt].x[2 * half], b = scale * O[nt].x[2 * half + 1];
          store_pair_v<T>(p.o, o_vec, ro, col, V, a, b);
        }
      }
    }

    // S = e^{γ_last} S + Kᵀ Vd (A = Kᵀ: transposed loads of the [t][key] K tile, k = chunk position).
    const float decay = expf(glast);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[nt].x[e] *= decay;
    if (srow0 < K) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const FragA a = mma::load_a_trans(Ks, kLdKF, srow0, 16 * ks);
#pragma unroll
        for (int term = 0; term < kTerms; ++term)
#pragma unroll
          for (int np = 0; np < kNP; ++np) {
            FragB b0, b1;
            mma::load_b2_trans(b0, b1, Vd + term * kRows * kLdS, kLdS, 16 * ks, scol0 + 16 * np);
            mma::mma16816<T>(S[2 * np], a, b0);
            mma::mma16816<T>(S[2 * np + 1], a, b1);
          }
      }
    }
  }
  if (p.ht.present()) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t a = srow0 + mma::c_row(e), col = v0 + scol0 + 8 * nt + mma::c_col(e);
        if (a < K && col < V)
          store_f(p.ht, n * p.ht.st[0] + hv * p.ht.st[1] + a * p.ht.st[2] + col * p.ht.st[3], S[nt].x[e]);
      }
  }
}

// ---------------------------------------------------------------- the gated Q Kᵀ, chunk-parallel
// P_hv = (Q Kᵀ ⊙ Γ_hv) of one chunk for every value head hv of q/k head h's group (G of them), written to p.Pqk
// (b, t, hv, j) rows t < L, columns j < BT: (q_t·k_j) e^{γ_t − γ_j} for j <= t, 0 above the diagonal, rounded
// to T. Q Kᵀ is formed once per (chunk, h) on the tensor cores; only the gating is per value head. This is the
// part of the fused state + output pass that does not depend on the state, taken off its sequential chain
// (state_o_mma<kPreP>) and out of its column blocks (each of which formed it again). The fragments, their
// order and the gating expression are those of state_o_mma's inline P (warp w: row block w, all 8 key steps,
// column blocks cb <= w), so the stored values are the same bits. 4 warps; Q, K [64][kLdKF] as one cp.async
// group, γ of the current value head [64]. K <= 128 (kKF), BT <= 64. Up to 4 blocks per SM (<= 128 registers,
// 35 KB of shared memory each): the kernel is a chunk-parallel stream of loads, products and stores.
inline size_t qk_gate_smem() { return size_t(2) * kRows * kLdKF * 2 + kRows * 4; }

template <class T>
__global__ void __launch_bounds__(kThreads, 4) qk_gate_mma(const GdnFwdParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);                        // [64][kLdKF]
  T* ks = qs + kRows * kLdKF;                                // [64][kLdKF]
  float* gam = reinterpret_cast<float*>(ks + kRows * kLdKF);  // [64]
  const int64_t H = p.shape.H, G = p.shape.G, K = p.shape.K, BT = p.shape.BT;
  const int64_t slot = blockIdx.x / H, h = blockIdx.x % H;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  const int tid = threadIdx.x, warp = tid >> 5;
  if (K == kKF && lean_tensor<T>(p.q) && lean_tensor<T>(p.k)) {
    // Fixed (row, segment) slots (lean_rows): every tile column is inside K, rows >= L zero-filled.
    lean_rows<kThreads>(qs, kLdKF, p.q, off_tok(p.q, c.b, c.s, h), L, K);
    lean_rows<kThreads>(ks, kLdKF, p.k, off_tok(p.k, c.b, c.s, h), L, K);
  } else {
    load_tile<T, kKF>(qs, kLdKF, p.q, off_tok(p.q, c.b, c.s, h), p.q.st[1], p.q.st[3], L, 0, K);
    load_tile<T, kKF>(ks, kLdKF, p.k, off_tok(p.k, c.b, c.s, h), p.k.st[1], p.k.st[3], L, 0, K);
  }
  cuda::cp_async_commit();
  cuda::cp_async_wait<0>();
  __syncthreads();
  // Block (warp, cb) in P[2 cb], P[2 cb + 1]: the 8-column halves of state_o_mma's pc[0], pc[1].
  FragC P[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) P[n].zero();
#pragma unroll
  for (int kq = 0; kq < kKF / 16; ++kq) {
    const FragA a = mma::load_a(qs, kLdKF, 16 * warp, 16 * kq);
#pragma unroll
    for (int cb = 0; cb < 4; ++cb)
      if (cb <= warp) {
        FragB b0, b1;
        mma::load_b2(b0, b1, ks, kLdKF, 16 * kq, 16 * cb);
        mma::mma16816<T>(P[2 * cb], a, b0);
        mma::mma16816<T>(P[2 * cb + 1], a, b1);
      }
  }
  const bool vec = pair_vec<T>(p.Pqk);
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t hv = h * G + gi;
    if (tid < kRows) gam[tid] = (tid < L && p.g.present()) ? load_f(p.g, off_tok(p.g, c.b, c.s + tid, hv)) : 0.f;
    __syncthreads();  // γ of hv visible
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * warp + mma::c_row(2 * half);
      if (i >= L) continue;
      const int64_t ro = off_tok(p.Pqk, c.b, c.s + i, hv);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        float x[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = 8 * n + mma::c_col(2 * half + e);
          const float v = P[n].x[2 * half + e];
          x[e] = (j <= i && i < L) ? v * expf(gam[i] - gam[j]) : 0.f;
        }
        store_pair_v<T>(p.Pqk, vec, ro, 8 * n + mma::c_col(0), BT, x[0], x[1]);
      }
    }
    __syncthreads();  // every reader of γ done before the next value head's
  }
}

// ---------------------------------------------------------------- the output
// Shared memory of chunk_o_mma: Q and K chunks [64][Kp + 8], the S slice [Kp][72] (Kp = K rounded up to 64),
// Vn [64][72], γ.
inline size_t o_smem(int64_t K) {
  return size_t(2) * kRows * (round64(K) + 8) * 2 + size_t(round64(K)) * kLdT * 2 + kRows * kLdT * 2 + kRows * 4;
}

// o rows of one chunk, columns v0..v0+63: every tile is requested at once (Q, K, S as one cp.async group, Vn
// as a second), then P = Q Kᵀ and O = Q S on the tensor cores, O = e^{γ_i} O + (P ⊙ Γ, lower incl. diagonal,
// rounded to T) Vn, o = scale O.
template <class T>
__global__ void __launch_bounds__(kThreads) chunk_o_mma(const GdnFwdParams p, int64_t nvt) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V;
  const int kp = round64(K), ldk = kp + 8;
  T* qs = reinterpret_cast<T*>(smem);  // [64][ldk] Q chunk
  T* ks = qs + kRows * ldk;            // [64][ldk] K chunk
  T* ss = ks + kRows * ldk;            // [kp][kLdT] S columns v0.. (rows = key)
  T* vs = ss + kp * kLdT;              // [64][kLdT] Vn columns v0..
  float* gam = reinterpret_cast<float*>(vs + kRows * kLdT);
  const int64_t vt = blockIdx.x % nvt, rest = blockIdx.x / nvt;
  const int64_t slot = rest / HV, hv = rest % HV, h = hv / p.shape.G;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid || (p.chunks.varlen() && c.idx >= p.shape.NT)) return;
  const int L = static_cast<int>(c.e - c.s);
  const int64_t v0 = vt * 64;
  const int64_t hb = h_base(p.h, p.chunks, c.b, c.idx) + hv * p.h.st[2];
  const int tid = threadIdx.x, warp = tid >> 5;
  for (int64_t d0 = 0; d0 < K; d0 += 64) {
    load_tile<T, 64>(qs + d0, ldk, p.q, off_tok(p.q, c.b, c.s, h), p.q.st[1], p.q.st[3], L, d0, K);
    load_tile<T, 64>(ks + d0, ldk, p.k, off_tok(p.k, c.b, c.s, h), p.k.st[1], p.k.st[3], L, d0, K);
    const int srows = static_cast<int>(K - d0 < 64 ? K - d0 : 64);
    load_tile<T, 64>(ss + d0 * kLdT, kLdT, p.h, hb + d0 * p.h.st[3], p.h.st[3], p.h.st[4], srows, v0, V);
  }
  cuda::cp_async_commit();
  load_tile<T, 64>(vs, kLdT, p.v, off_tok(p.v, c.b, c.s, hv), p.v.st[1], p.v.st[3], L, v0, V);
  cuda::cp_async_commit();
  for (int i = tid; i < kRows; i += kThreads)
    gam[i] = (i < L && p.g.present()) ? load_f(p.g, off_tok(p.g, c.b, c.s + i, hv)) : 0.f;
  cuda::cp_async_wait<1>();
  __syncthreads();
  FragC P[8], O[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) P[n].zero(), O[n].zero();
  for (int d0 = 0; d0 < kp; d0 += 64) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const FragA a = mma::load_a(qs, ldk, 16 * warp, d0 + 16 * kk);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        FragB b0, b1;
        if (np <= warp) {
          mma::load_b2(b0, b1, ks, ldk, d0 + 16 * kk, 16 * np);
          mma::mma16816<T>(P[2 * np], a, b0);
          mma::mma16816<T>(P[2 * np + 1], a, b1);
        }
        mma::load_b2_trans(b0, b1, ss, kLdT, d0 + 16 * kk, 16 * np);
        mma::mma16816<T>(O[2 * np], a, b0);
        mma::mma16816<T>(O[2 * np + 1], a, b1);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * warp + mma::c_row(2 * half);
    const float gi = gam[i], eo = i < L ? expf(gi) : 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        const int j = 8 * n + mma::c_col(e);
        P[n].x[e] = (j <= i && i < L) ? P[n].x[e] * expf(gi - gam[j]) : 0.f;
        O[n].x[e] *= eo;
      }
  }
  cuda::cp_async_wait<0>();  // Vn
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    if (kk <= warp) {
      const FragA a = mma::c_to_a<T>(P[2 * kk], P[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        FragB b0, b1;
        mma::load_b2_trans(b0, b1, vs, kLdT, 16 * kk, 16 * np);
        mma::mma16816<T>(O[2 * np], a, b0);
        mma::mma16816<T>(O[2 * np + 1], a, b1);
      }
    }
  const float scale = p.shape.scale;
  const bool o_vec = pair_vec<T>(p.o);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * warp + mma::c_row(2 * half);
    if (i >= L) continue;
    const int64_t ro = off_tok(p.o, c.b, c.s + i, hv);
#pragma unroll
    for (int n = 0; n < 8; ++n)
      store_pair_v<T>(p.o, o_vec, ro, v0 + 8 * n + mma::c_col(0), V, scale * O[n].x[2 * half],
                      scale * O[n].x[2 * half + 1]);
  }
}

// ---------------------------------------------------------------- launch
template <class Kernel, class... Args>
int launch(Kernel kernel, const char* name, int64_t blocks, size_t smem, cudaStream_t stream, Args... args) {
  return launch_n(kernel, name, blocks, kThreads, smem, stream, args...);
}

template <class T, int kKB, int kTerms, int kBV>
int launch_state_cols(const GdnFwdParams& p, cudaStream_t stream) {
  const int64_t nvt = cdiv(p.shape.V, kBV);
  return launch(state_mma<T, kKB, kTerms, kBV>, "chunk_gated_delta_rule_fwd_h (state_mma)", p.shape.N * p.shape.HV * nvt,
                state_smem<kKB, kTerms, kBV>(), stream, p, nvt);
}

// Columns of S per block: the widest of 64 (K <= 128 only: registers), 32, 16 whose blocks still cover every
// SM. The pass is a chain of dependent chunk steps whose time is mostly latency, so one wave of wide blocks
// (each K / W chunk tile loaded once per 64 columns) beats two waves of narrow ones, and narrow blocks help
// when there are few sequences x heads.
template <class T, int kKB>
int launch_state(const GdnFwdParams& p, cudaStream_t stream) {
  // bf16: fla's model, S and Vd rounded once (H200 run 1: 3 terms cost the latency-bound pass ~3x the mma
  // chain); f16: 2 terms (its 2e-3 ceiling is 4 unit roundoffs, and the 2-term product is f32-class).
  constexpr int kTerms = std::is_same_v<T, __nv_bfloat16> ? 1 : 2;
  int dev = 0, sms = 132;
  STRATA_CUDA_TRY(cudaGetDevice(&dev));
  STRATA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t nh = p.shape.N * p.shape.HV;
  if constexpr (kKB <= 128)
    if (nh * cdiv(p.shape.V, 64) >= sms) return launch_state_cols<T, kKB, kTerms, 64>(p, stream);
  if (nh * cdiv(p.shape.V, 32) >= sms) return launch_state_cols<T, kKB, kTerms, 32>(p, stream);
  return launch_state_cols<T, kKB, kTerms, 16>(p, stream);
}

template <class T, int kTerms, int kBV, int kStages, bool kPreP, int kWarps>
int launch_state_o_cols(const GdnFwdParams& p, cudaStream_t stream) {
  const int64_t nvt = cdiv(p.shape.V, kBV), blocks = p.shape.N * p.shape.HV * nvt;
  if (blocks <= 0) return STRATA_SUCCESS;
  const char* name = kPreP ? "chunk_gated_delta_rule_fwd (state_o_mma, pre-computed P)"
                           : "chunk_gated_delta_rule_fwd (state_o_mma)";
  if (blocks > 0x7fffffffLL)
    return fail(STRATA_ERROR_UNSUPPORTED, "{}: {} blocks exceed the CUDA grid limit", name, blocks);
  constexpr size_t smem = state_o_smem<kTerms, kBV, kStages, kPreP>();
  static_assert(smem <= 227 * 1024, "sm_90 shared memory per block");
  auto kernel = state_o_mma<T, kTerms, kBV, kStages, kPreP, kWarps>;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(p, nvt);
  return cuda::check_launch(name);
}

// Columns of S per fused block (one block per SM: 170-218 KB of shared memory). The pass is a chain of dependent
// chunk steps, so the narrowest width whose blocks fit in one wave (less work per step), else the widest (fewest
// waves; K / W / Q tiles loaded once per kBV columns). 128 columns need bf16 (one S term): f16's two terms of
// S and Vd do not fit beside it.
// kPreP (P read from p.Pqk: one more 9 KB tile per stage): the same widths; f16's two S / Vd terms leave no
// room for a third stage at 32 columns (230 KB), so it runs two there.
// 16 warps: the same widths but at least 64 (a warp's part of the chunk products is >= 16 columns).
int state_o_width(const GdnFwdParams& p, bool bf16, int sms, bool w16) {
  const int64_t nh = p.shape.N * p.shape.HV;
  if (!w16 && nh * cdiv(p.shape.V, 32) <= sms) return 32;
  if (bf16 && nh * cdiv(p.shape.V, 64) <= sms) return 64;
  return bf16 ? 128 : 64;
}
int sm_count(int& sms) {
  int dev = 0;
  sms = 132;
  STRATA_CUDA_TRY(cudaGetDevice(&dev));
  STRATA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return STRATA_SUCCESS;
}
template <class T, bool kPreP, int kWarps>
int fwd_state_o(const GdnFwdParams& p, cudaStream_t stream) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kTerms = kBf16 ? 1 : 2;  // as in launch_state
  constexpr int kStages32 = (kBf16 || !kPreP) ? 3 : 2;
  int sms = 132;
  if (const int r = sm_count(sms); r != STRATA_SUCCESS) return r;
  switch (state_o_width(p, kBf16, sms, kWarps == 16)) {
    case 32:
      if constexpr (kWarps == 8) return launch_state_o_cols<T, kTerms, 32, kStages32, kPreP, 8>(p, stream);
      return fail(STRATA_ERROR_INTERNAL, "state_o_mma: 16 warps need >= 64 columns");
    case 64: return launch_state_o_cols<T, kTerms, 64, 2, kPreP, kWarps>(p, stream);
    default:
      if constexpr (kBf16) return launch_state_o_cols<T, kTerms, 128, 2, kPreP, kWarps>(p, stream);
      return fail(STRATA_ERROR_INTERNAL, "state_o_mma: 128 columns need bf16");
  }
}

template <class T>
int fwd_mma(FwdOp op, const GdnFwdParams& p, cudaStream_t stream) {
  const int64_t slots = chunk_slots(p.chunks);
  switch (op) {
    case FwdOp::kKkt:
      return launch(wy_mma<T, kWyKkt>, "chunk_scaled_dot_kkt (wy_mma)", slots * p.shape.HV, wy_smem(kWyKkt, p.shape.K, p.shape.V), stream, p);
    case FwdOp::kSolveTril:
      return launch(wy_mma<T, kWySolve>, "solve_tril (wy_mma)", slots * p.shape.HV, wy_smem(kWySolve, p.shape.K, p.shape.V), stream, p);
    case FwdOp::kRecomputeWU:
      return launch(wy_mma<T, kWyRecompute>, "recompute_w_u_fwd (wy_mma)", slots * p.shape.HV, wy_smem(kWyRecompute, p.shape.K, p.shape.V), stream, p);
    case FwdOp::kPrepareWY:
      return launch_n(wy_mma<T, kWyPrepare>, "prepare_wy_repr_fwd (wy_mma)", slots * p.shape.HV,
                      wy_threads(kWyPrepare), wy_smem(kWyPrepare, p.shape.K, p.shape.V), stream, p);
    case FwdOp::kFwdH:
      if (p.shape.K <= 64) return launch_state<T, 64>(p, stream);
      if (p.shape.K <= 128) return launch_state<T, 128>(p, stream);
      return launch_state<T, 256>(p, stream);
    case FwdOp::kFwdO: {
      const int64_t nvt = cdiv(p.shape.V, 64);
      return launch(chunk_o_mma<T>, "chunk_fwd_o (chunk_o_mma)", slots * p.shape.HV * nvt, o_smem(p.shape.K), stream, p, nvt);
    }
    default: return fail(STRATA_ERROR_INTERNAL, "gdn fwd_cuda_mma: unknown op {}", static_cast<int>(op));
  }
}

}  // namespace

std::string fwd_cuda_mma_reject(FwdOp op, const GdnFwdParams& p) {
  // The token tensors each op reads as product operands, and its token outputs (states h0 / ht and the gates
  // g, beta are f32 or any float dtype and are not listed).
  const GdnTensor* in[4] = {};
  const GdnTensor* out[3] = {};
  switch (op) {
    case FwdOp::kKkt: in[0] = &p.k, out[0] = &p.Akk; break;
    case FwdOp::kSolveTril: in[0] = &p.Akk, out[0] = &p.A; break;
    case FwdOp::kRecomputeWU: in[0] = &p.k, in[1] = &p.v, in[2] = &p.A, out[0] = &p.w, out[1] = &p.u; break;
    case FwdOp::kPrepareWY:
      in[0] = &p.k, in[1] = &p.v, out[0] = &p.w, out[1] = &p.u, out[2] = &p.A;
      break;
    case FwdOp::kFwdH: in[0] = &p.k, in[1] = &p.w, in[2] = &p.u, out[0] = &p.h, out[1] = &p.v_new; break;
    case FwdOp::kFwdO: in[0] = &p.q, in[1] = &p.k, in[2] = &p.v, in[3] = &p.h, out[0] = &p.o; break;
    default: return "unknown op";
  }
  const int32_t dt = in[0]->dtype;
  if (dt != STRATA_DTYPE_BF16 && dt != STRATA_DTYPE_F16)
    return "tensor-core kernels take bf16 or f16 token tensors (f32 needs f32 products: ceiling 1e-5)";
  for (const GdnTensor* t : in)
    if (t && t->dtype != dt) return "tensor-core kernels need every token input in one dtype";
  for (const GdnTensor* t : out)
    if (t && t->present() && t->dtype != dt)
      return fmt::format("tensor-core kernels need the token outputs in the inputs' dtype ({}): an f32 output "
                         "is held to f32 accuracy",
                         dt == STRATA_DTYPE_BF16 ? "bf16" : "f16");
  if (p.shape.K > kMaxK || p.shape.V > kMaxK) return fmt::format("K, V <= {}", kMaxK);
  if (p.shape.BT > 64) return "chunk size <= 64";
  return {};
}

std::string fwd_cuda_state_o_reject(const GdnFwdParams& p) {
  const int32_t dt = p.k.dtype;
  if (dt != STRATA_DTYPE_BF16 && dt != STRATA_DTYPE_F16) return "the fused pass takes bf16 or f16 token tensors";
  for (const GdnTensor* t : {&p.q, &p.w, &p.u})
    if (t->dtype != dt) return "the fused pass needs q, k, w, u in one dtype";
  if (!p.o.present()) return "the fused pass writes o";
  for (const GdnTensor* t : {&p.o, &p.v_new})
    if (t->present() && t->dtype != dt) return "the fused pass needs o (and v_new) in the inputs' dtype";
  if (p.h.present()) return "the fused pass does not write the chunk states h";
  if (p.shape.K > kKF) return fmt::format("the fused pass keeps K <= {} rows of S per block", kKF);
  if (p.shape.BT > 64) return "chunk size <= 64";
  return {};
}

int fwd_cuda_state_o(const GdnFwdParams& p, StateOKernel which, StateOBlock block, void* stream_ptr) {
  std::string why = fwd_cuda_state_o_reject(p);
  if (why.empty() && which == StateOKernel::kPrecomputedP) {
    if (!p.Pqk.present()) why = "the pre-computed-P variant reads p.Pqk (absent)";
    else if (p.Pqk.dtype != p.k.dtype) why = "the pre-computed-P variant needs Pqk in the token dtype";
  }
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_fwd (state_o_mma): {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool bf16 = p.k.dtype == STRATA_DTYPE_BF16;
  const bool pre = which == StateOKernel::kPrecomputedP;
  if (block == StateOBlock::k16Warps) {
    if (pre) return bf16 ? fwd_state_o<__nv_bfloat16, true, 16>(p, stream) : fwd_state_o<__half, true, 16>(p, stream);
    return bf16 ? fwd_state_o<__nv_bfloat16, false, 16>(p, stream) : fwd_state_o<__half, false, 16>(p, stream);
  }
  if (pre) return bf16 ? fwd_state_o<__nv_bfloat16, true, 8>(p, stream) : fwd_state_o<__half, true, 8>(p, stream);
  return bf16 ? fwd_state_o<__nv_bfloat16, false, 8>(p, stream) : fwd_state_o<__half, false, 8>(p, stream);
}

int fwd_cuda_state_o(const GdnFwdParams& p, StateOKernel which, void* stream) {
  return fwd_cuda_state_o(p, which, StateOBlock::k8Warps, stream);
}

int fwd_cuda_state_o(const GdnFwdParams& p, void* stream) {
  return fwd_cuda_state_o(p, StateOKernel::kInline, stream);
}

bool fwd_cuda_state_o_pre_p_pays(const GdnFwdParams& p) {
  int sms = 132;
  if (sm_count(sms) != STRATA_SUCCESS) return false;
  const bool bf16 = p.k.dtype == STRATA_DTYPE_BF16;
  const int width = state_o_width(p, bf16, sms, false);
  // f16 at 32 columns: the pre-computed form has room for 2 cp.async stages only (3 inline); not measured, so
  // the automatic choice keeps the 3-stage inline form there.
  if (!bf16 && width == 32) return false;
  return width < p.shape.V;
}

StateOBlock fwd_cuda_state_o_auto_block(const GdnFwdParams& p) {
  // 16 warps where the 8-warp pass runs 128 columns per block (one block per head). GPU run s7run2 (H200, bf16,
  // HV = 32, K = V = 128, P inline): B = 4 T = 8192 pass 0.918 ms with 8 warps, 0.788 ms with 16. Where the 8-warp
  // pass runs 32 columns (B = 1 T = 32768, P pre-computed: 1.486 ms) the 16-warp one needs 64 (2.039 ms): not there.
  constexpr int kAuto16Width = 128;
  int sms = 132;
  if (sm_count(sms) != STRATA_SUCCESS) return StateOBlock::k8Warps;
  return state_o_width(p, p.k.dtype == STRATA_DTYPE_BF16, sms, false) >= kAuto16Width ? StateOBlock::k16Warps
                                                                                        : StateOBlock::k8Warps;
}

std::string fwd_cuda_qk_gate_reject(const GdnFwdParams& p) {
  const int32_t dt = p.q.dtype;
  if (dt != STRATA_DTYPE_BF16 && dt != STRATA_DTYPE_F16) return "the gated Q Kᵀ kernel takes bf16 or f16 q, k";
  if (p.k.dtype != dt) return "the gated Q Kᵀ kernel needs q and k in one dtype";
  if (!p.Pqk.present()) return "the gated Q Kᵀ kernel writes Pqk (absent)";
  if (p.Pqk.dtype != dt) return "the gated Q Kᵀ kernel needs Pqk in the dtype of q, k";
  if (p.shape.K > kKF) return fmt::format("the gated Q Kᵀ kernel keeps K <= {} columns", kKF);
  if (p.shape.BT > 64) return "chunk size <= 64";
  if (p.shape.G < 1 || p.shape.H * p.shape.G != p.shape.HV) return "HV must be a multiple G of H";
  return {};
}

int fwd_cuda_qk_gate(const GdnFwdParams& p, void* stream_ptr) {
  const std::string why = fwd_cuda_qk_gate_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_fwd (qk_gate_mma): {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t blocks = chunk_slots(p.chunks) * p.shape.H;
  return p.q.dtype == STRATA_DTYPE_BF16
             ? launch(qk_gate_mma<__nv_bfloat16>, "chunk_gated_delta_rule_fwd (qk_gate_mma)", blocks, qk_gate_smem(),
                      stream, p)
             : launch(qk_gate_mma<__half>, "chunk_gated_delta_rule_fwd (qk_gate_mma)", blocks, qk_gate_smem(), stream,
                      p);
}

int fwd_cuda_mma(FwdOp op, const GdnFwdParams& p, void* stream_ptr) {
  const std::string why = fwd_cuda_mma_reject(op, p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "{} (cuda.sm90.mma): {}", fwd_op_name(op), why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int32_t dt = op == FwdOp::kSolveTril ? p.Akk.dtype : (op == FwdOp::kFwdO ? p.q.dtype : p.k.dtype);
  return dt == STRATA_DTYPE_BF16 ? fwd_mma<__nv_bfloat16>(op, p, stream) : fwd_mma<__half>(op, p, stream);
}

int fwd_cuda(FwdOp op, const GdnFwdParams& p, FwdCudaKernels which, void* stream) {
  switch (which) {
    case FwdCudaKernels::kMma: return fwd_cuda_mma(op, p, stream);
    case FwdCudaKernels::kFma: return fwd_cuda_fma(op, p, stream);
    default:
      // chunk_gated_delta_rule_fwd_h (what the backward re-runs): the split wgmma pass where it applies (bf16, K = 128;
      // GPU run s9run1, H200, H = 16 HV = 32 K = V = 128, h + v_new + ht: B = 4 T = 8192 0.714 ms against 1.564 ms
      // for state_mma, B = 1 T = 32768 1.378 against 2.616 ms).
      if (op == FwdOp::kFwdH && fwd_cuda_fwd_h_wgmma_reject(p).empty()) return fwd_cuda_fwd_h_wgmma(p, 0, stream);
      // prepare_wy_repr_fwd (the forward's w, u and the backward's re-run w, u, A): the warpgroup-MMA pre-state kernel
      // where it applies (bf16, K <= 128; GPU run s10run2, H200, H = 16 HV = 32 K = V = 128, B = 4 T = 8192: w, u
      // 0.464 ms against 0.585 ms for wy_mma<kPrepare>; w, u, A 0.512 against 0.637 ms).
      if (op == FwdOp::kPrepareWY && fwd_cuda_prep_reject(p).empty()) return fwd_cuda_prep(p, stream);
      return fwd_cuda_mma_reject(op, p).empty() ? fwd_cuda_mma(op, p, stream) : fwd_cuda_fma(op, p, stream);
  }
}

int fwd_cuda(FwdOp op, const GdnFwdParams& p, void* stream) { return fwd_cuda(op, p, FwdCudaKernels::kAuto, stream); }

}  // namespace strata::linear_attn::gdn
