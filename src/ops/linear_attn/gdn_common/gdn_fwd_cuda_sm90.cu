// CUDA (sm_90) FMA kernels of the GDN forward chunk operators (gdn_fwd_kernels.h: fwd_cuda_fma; the tensor-core
// kernels for bf16/f16 are in gdn_fwd_cuda_mma.cu, which also holds the dispatching fwd_cuda). f32 SIMT math (FMA) on
// shared-memory tiles: every chunk-level product is a 64 x 64 output tile computed by 256 threads, each owning
// a 4 x 4 register micro-tile, with the contraction dimension staged through shared memory in 64-wide slices
// (K up to 256 = four slices). Tensors are read through their strides with a run-time dtype (f32/bf16/f16;
// the switch is warp-uniform), states and accumulation are f32. No atomics: each output element is written
// by one thread of one block, so results are bitwise reproducible.
//
//   kernel           grid.x (1-D, so N*HV > 65535 fits)   block work
//   kkt_tile         chunk slot x q/k head                 K Kᵀ once, then the gated Akk of the G value heads
//   forward_subst    chunk slot x value head               (I + M)^-1 by forward substitution, row by row
//   wy_tile          chunk slot x value head x col tile    u / w = A · (β [e^γ] X) for one 64-column tile
//   fused_wy         chunk slot x value head               kkt + forward_subst + all w / u column tiles
//   state_scan       sequence x value head x 16-col tile   S [K x 16] in shared memory across the chunks
//   chunk_tile       chunk slot x value head x 64-col tile o = scale (diag(e^γ) Q S + Lower(Q Kᵀ ⊙ Γ) Vn)
//
// Chunk slots past the last chunk of a varlen pack exit at once (gdn_common.h); cu_seqlens values are
// clamped, so invalid values cannot cause out-of-bounds accesses. Gate exponentials only ever see
// non-positive arguments (γ_i − γ_j for i >= j, γ_last − γ_i, γ) and masked entries are selected, not
// multiplied, so strong decays (γ down to −4400 in a chunk) stay finite.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "tile/cuda/check.cuh"

namespace strata::linear_attn::gdn {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;        // rows (chunk positions) and contraction slice width
constexpr int kLd = kTile + 1;   // padded leading dim of a 64 x 64 shared tile
constexpr int kTileFloats = kTile * kLd;
// state_scan: columns of S per block. 16 (not 32) doubles the blocks of this latency-bound sequential kernel
// (H200 run 1: 32 columns gave 128 blocks for B = 4, HV = 8, V = 128 and ran at ~3 TFLOP/s).
constexpr int kStateCols = 16;
constexpr int kCPT = kStateCols / 4;  // columns per thread: 256 threads = 64 rows x 4 column groups
constexpr int kSLd = kStateCols + 1;

__device__ __forceinline__ int64_t off_tok(const GdnTensor& t, int64_t b, int64_t tok, int64_t head) {
  return b * t.st[0] + tok * t.st[1] + head * t.st[2];
}

// One element of a tensor of dtype kDt (f32 / bf16 / f16: the dtypes the CUDA plans admit) as f32.
template <int kDt>
__device__ __forceinline__ float load_as(const void* base, int64_t i) {
  if constexpr (kDt == STRATA_DTYPE_F32) return static_cast<const float*>(base)[i];
  else if constexpr (kDt == STRATA_DTYPE_BF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
  else return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
}

// dst[r][c] (ld kLd) = element (row r, col c0 + c) of a [rows x cols] strided matrix, 0 outside
// (r >= rows or c0 + c >= cols). 64 x 64 tile; consecutive threads take consecutive columns. Each thread
// issues all of its kPer global loads before the first shared store (typed, unrolled), so they are in flight
// together: with a load-then-store loop the loads were serialised (H200 run 1: the sequential state scan
// spent most of its time waiting on them).
template <int kDt>
__device__ __forceinline__ void load_tile_t(float* dst, const void* data, int64_t base, int64_t rs, int64_t cs,
                                            int rows, int64_t c0, int64_t cols) {
  static_assert(kThreads % kTile == 0, "a thread keeps one column of the tile");
  constexpr int kRowStep = kThreads / kTile;      // rows between a thread's elements
  constexpr int kPer = kTile / kRowStep;          // elements per thread
  const int c = static_cast<int>(threadIdx.x) % kTile, r0 = static_cast<int>(threadIdx.x) / kTile;
  const bool col_ok = c0 + c < cols;
  const int64_t off0 = base + r0 * rs + (c0 + c) * cs, step = kRowStep * rs;
  float v[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    v[u] = (col_ok && r0 + u * kRowStep < rows) ? load_as<kDt>(data, off0 + u * step) : 0.f;
#pragma unroll
  for (int u = 0; u < kPer; ++u) dst[(r0 + u * kRowStep) * kLd + c] = v[u];
}
__device__ void load_tile(float* dst, const GdnTensor& t, int64_t base, int64_t rs, int64_t cs, int rows, int64_t c0,
                          int64_t cols) {
  switch (t.dtype) {
    case STRATA_DTYPE_F32: load_tile_t<STRATA_DTYPE_F32>(dst, t.data, base, rs, cs, rows, c0, cols); break;
    case STRATA_DTYPE_BF16: load_tile_t<STRATA_DTYPE_BF16>(dst, t.data, base, rs, cs, rows, c0, cols); break;
    default: load_tile_t<STRATA_DTYPE_F16>(dst, t.data, base, rs, cs, rows, c0, cols); break;
  }
}

// acc[a][b] += Σ_d X[r0+a][d] · Y[c0+b][d] over d < 64 (X, Y row-major 64 x 64 tiles: "X Yᵀ").
__device__ __forceinline__ void mma_nt(float (&acc)[4][4], const float* X, const float* Y, int r0, int c0) {
#pragma unroll 8
  for (int d = 0; d < kTile; ++d) {
    float x[4], y[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) x[a] = X[(r0 + a) * kLd + d];
#pragma unroll
    for (int b = 0; b < 4; ++b) y[b] = Y[(c0 + b) * kLd + d];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(x[a], y[b], acc[a][b]);
  }
}
// acc[a][b] += Σ_d X[r0+a][d] · Y[d][c0+b] ("X Y"), d < n.
__device__ __forceinline__ void mma_nn(float (&acc)[4][4], const float* X, const float* Y, int r0, int c0, int n) {
  for (int d = 0; d < n; ++d) {
    float x[4], y[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) x[a] = X[(r0 + a) * kLd + d];
#pragma unroll
    for (int b = 0; b < 4; ++b) y[b] = Y[d * kLd + c0 + b];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(x[a], y[b], acc[a][b]);
  }
}

__device__ __forceinline__ void zero(float (&acc)[4][4]) {
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] = 0.f;
}

// Thread's micro-tile origin in a 64 x 64 tile.
__device__ __forceinline__ int row0() { return (threadIdx.x / 16) * 4; }
__device__ __forceinline__ int col0() { return (threadIdx.x % 16) * 4; }

// P = K_c K_cᵀ (or Q_c K_cᵀ) of chunk rows [s, s + L), q/k head h, into the thread's micro-tile.
// Uses two 64 x 64 shared tiles.
__device__ void gram(float (&acc)[4][4], const GdnTensor& x, const GdnTensor& k, int64_t b, int64_t s, int L, int64_t h,
                     int64_t K, float* xs, float* ks) {
  zero(acc);
  for (int64_t d0 = 0; d0 < K; d0 += kTile) {
    __syncthreads();
    load_tile(ks, k, off_tok(k, b, s, h), k.st[1], k.st[3], L, d0, K);
    if (xs != ks) load_tile(xs, x, off_tok(x, b, s, h), x.st[1], x.st[3], L, d0, K);
    __syncthreads();
    mma_nt(acc, xs, ks, row0(), col0());
  }
}

// gam[i], beta[i] for i < L (0 / 1 past L or without the tensor).
__device__ void load_gates(float* gam, float* bet, const GdnFwdParams& p, const ChunkPos& c, int64_t hv, int L) {
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    float gv = 0.f, bv = 1.f;
    if (i < L) {
      if (p.g.present()) gv = load_f(p.g, off_tok(p.g, c.b, c.s + i, hv));
      if (bet && p.beta.present()) bv = load_f(p.beta, off_tok(p.beta, c.b, c.s + i, hv));
    }
    gam[i] = gv;
    if (bet) bet[i] = bv;
  }
}

// M[i][j] (shared, ld kLd) = β_i P_ij exp(γ_i − γ_j) for j < i < L, else 0, from the thread's micro-tile.
__device__ void gate_kkt_tile(float* M, const float (&P)[4][4], const float* gam, const float* bet, int L) {
  const int r0 = row0(), c0 = col0();
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = r0 + a, j = c0 + b;
      M[i * kLd + j] = (j < i && i < L) ? bet[i] * P[a][b] * expf(gam[i] - gam[j]) : 0.f;
    }
}

// Rows [0, L) of a chunk matrix (cols < BT) from shared X into rows s.. of t (cols >= L written as 0).
__device__ void store_chunk_mat(const GdnTensor& t, const ChunkPos& c, int64_t hv, int L, int BT, const float* X) {
  for (int idx = threadIdx.x; idx < L * BT; idx += kThreads) {
    const int i = idx / BT, j = idx % BT;
    store_f(t, off_tok(t, c.b, c.s + i, hv) + j * t.st[3], j < L ? X[i * kLd + j] : 0.f);
  }
}

// X = (I + M)^-1 for strictly lower M (shared, L x L valid, zeros elsewhere); X zero outside [L x L] lower.
// Row i = e_i − Σ_{m<i} M[i][m] X[m][:]; thread j < 64 computes column j of row i. One barrier per row.
__device__ void forward_subst(const float* M, float* X, int L) {
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += kThreads) X[(idx / kTile) * kLd + idx % kTile] = 0.f;
  __syncthreads();
  const int j = threadIdx.x;
  for (int i = 0; i < L; ++i) {
    if (j < kTile) {
      float v = 0.f;
      if (j < i) {
        float acc = 0.f;
        for (int m = j; m < i; ++m) acc = fmaf(M[i * kLd + m], X[m * kLd + j], acc);
        v = -acc;
      } else if (j == i) {
        v = 1.f;
      }
      X[i * kLd + j] = v;
    }
    __syncthreads();
  }
}

// One 64-column tile of w (tile < nk: columns of K) or u (columns of V) from the inverse A (shared, lower):
// out = A · (f_j X_j), f_j = β_j e^{γ_j} for w, β_j for u. Uses one 64 x 64 shared tile xs.
__device__ void wy_column_tile(const GdnFwdParams& p, const ChunkPos& c, int64_t hv, int L, const float* A,
                               const float* gam, const float* bet, int64_t tile, int64_t nk, float* xs) {
  const bool is_w = tile < nk;
  const GdnTensor& src = is_w ? p.k : p.v;
  const GdnTensor& dst = is_w ? p.w : p.u;
  const int64_t head = is_w ? hv / p.shape.G : hv;
  const int64_t D = is_w ? p.shape.K : p.shape.V;
  const int64_t c0 = (is_w ? tile : tile - nk) * kTile;
  __syncthreads();
  load_tile(xs, src, off_tok(src, c.b, c.s, head), src.st[1], src.st[3], L, c0, D);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += kThreads) {
    const int j = idx / kTile;
    const float f = j < L ? (is_w ? bet[j] * expf(gam[j]) : bet[j]) : 0.f;
    xs[j * kLd + idx % kTile] *= f;
  }
  __syncthreads();
  float acc[4][4];
  zero(acc);
  mma_nn(acc, A, xs, row0(), col0(), L);
  const int r0 = row0(), cc = col0();
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = r0 + a;
      const int64_t col = c0 + cc + b;
      if (i < L && col < D) store_f(dst, off_tok(dst, c.b, c.s + i, hv) + col * dst.st[3], acc[a][b]);
    }
}

// ---------------------------------------------------------------- kernels
__global__ void __launch_bounds__(kThreads) kkt_tile(const GdnFwdParams p) {
  extern __shared__ float sm[];
  float* ks = sm;
  float* M = sm + kTileFloats;
  float* gam = sm + 2 * kTileFloats;
  float* bet = gam + kTile;
  const int64_t H = p.shape.H;
  const int64_t slot = blockIdx.x / H, h = blockIdx.x % H;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  float P[4][4];
  gram(P, p.k, p.k, c.b, c.s, L, h, p.shape.K, ks, ks);
  for (int64_t hv = h * p.shape.G; hv < (h + 1) * p.shape.G; ++hv) {
    __syncthreads();
    load_gates(gam, bet, p, c, hv, L);
    __syncthreads();
    gate_kkt_tile(M, P, gam, bet, L);
    __syncthreads();
    store_chunk_mat(p.Akk, c, hv, L, static_cast<int>(p.shape.BT), M);
  }
}

__global__ void __launch_bounds__(kThreads) forward_subst_kernel(const GdnFwdParams p) {
  extern __shared__ float sm[];
  float* M = sm;
  float* X = sm + kTileFloats;
  const int64_t HV = p.shape.HV;
  const int64_t slot = blockIdx.x / HV, hv = blockIdx.x % HV;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += kThreads) {
    const int i = idx / kTile, j = idx % kTile;
    M[i * kLd + j] = (j < i && i < L) ? load_f(p.Akk, off_tok(p.Akk, c.b, c.s + i, hv) + j * p.Akk.st[3]) : 0.f;
  }
  __syncthreads();
  forward_subst(M, X, L);
  store_chunk_mat(p.A, c, hv, L, static_cast<int>(p.shape.BT), X);
}

__global__ void __launch_bounds__(kThreads) wy_tile(const GdnFwdParams p, int64_t ntiles) {
  extern __shared__ float sm[];
  float* A = sm;
  float* xs = sm + kTileFloats;
  float* gam = sm + 2 * kTileFloats;
  float* bet = gam + kTile;
  const int64_t HV = p.shape.HV;
  const int64_t tile = blockIdx.x % ntiles, rest = blockIdx.x / ntiles;
  const int64_t slot = rest / HV, hv = rest % HV;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += kThreads) {
    const int i = idx / kTile, j = idx % kTile;
    A[i * kLd + j] = (j <= i && i < L) ? load_f(p.A, off_tok(p.A, c.b, c.s + i, hv) + j * p.A.st[3]) : 0.f;
  }
  load_gates(gam, bet, p, c, hv, L);
  wy_column_tile(p, c, hv, L, A, gam, bet, tile, cdiv(p.shape.K, kTile), xs);
}

__global__ void __launch_bounds__(kThreads) fused_wy(const GdnFwdParams p) {
  extern __shared__ float sm[];
  float* ks = sm;                    // K slices, then the w/u column tiles
  float* M = sm + kTileFloats;
  float* X = sm + 2 * kTileFloats;   // the inverse
  float* gam = sm + 3 * kTileFloats;
  float* bet = gam + kTile;
  const int64_t HV = p.shape.HV;
  const int64_t slot = blockIdx.x / HV, hv = blockIdx.x % HV;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  float P[4][4];
  gram(P, p.k, p.k, c.b, c.s, L, hv / p.shape.G, p.shape.K, ks, ks);
  load_gates(gam, bet, p, c, hv, L);
  __syncthreads();
  gate_kkt_tile(M, P, gam, bet, L);
  __syncthreads();
  forward_subst(M, X, L);
  store_chunk_mat(p.A, c, hv, L, static_cast<int>(p.shape.BT), X);
  const int64_t nk = cdiv(p.shape.K, kTile), nt = nk + cdiv(p.shape.V, kTile);
  for (int64_t t = 0; t < nt; ++t) wy_column_tile(p, c, hv, L, X, gam, bet, t, nk, ks);
}

// S [K x kStateCols] for columns [v0, v0 + kStateCols) of one (sequence, value head), carried across the chunks
// in shared memory.
__global__ void __launch_bounds__(kThreads, 2) state_scan(const GdnFwdParams p, int64_t nvt) {
  extern __shared__ float sm[];
  float* S = sm;                                  // [K][kSLd]
  float* xs = S + kMaxK * kSLd;                   // W or K slice [64][kLd]
  float* vn = xs + kTileFloats;                   // Vn [64][kSLd]
  float* gam = vn + kTile * kSLd;                 // [64]
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V, BT = p.shape.BT;
  const int64_t vt = blockIdx.x % nvt, rest = blockIdx.x / nvt;
  const int64_t n = rest / HV, hv = rest % HV, h = hv / p.shape.G;
  const int64_t v0 = vt * kStateCols;
  const SeqPos sq = locate_sequence(p.chunks, n);
  const int tid = threadIdx.x;
  // S = h0 (or 0)
  for (int idx = tid; idx < K * kStateCols; idx += kThreads) {
    const int a = idx / kStateCols, cc = idx % kStateCols;
    float v = 0.f;
    if (p.h0.present() && v0 + cc < V)
      v = load_f(p.h0, n * p.h0.st[0] + hv * p.h0.st[1] + a * p.h0.st[2] + (v0 + cc) * p.h0.st[3]);
    S[a * kSLd + cc] = v;
  }
  int64_t cidx = sq.chunk0;
  for (int64_t t0 = sq.bos; t0 < sq.eos; t0 += BT, ++cidx) {
    const int L = static_cast<int>(t0 + BT < sq.eos ? BT : sq.eos - t0);
    __syncthreads();
    if (p.h.present() && (!p.chunks.varlen() || cidx < p.shape.NT)) {
      const int64_t hb = h_base(p.h, p.chunks, sq.b, cidx) + hv * p.h.st[2];
      for (int idx = tid; idx < K * kStateCols; idx += kThreads) {
        const int a = idx / kStateCols, cc = idx % kStateCols;
        if (v0 + cc < V) store_f(p.h, hb + a * p.h.st[3] + (v0 + cc) * p.h.st[4], S[a * kSLd + cc]);
      }
    }
    for (int i = tid; i < kTile; i += kThreads)
      gam[i] = (i < L && p.g.present()) ? load_f(p.g, off_tok(p.g, sq.b, t0 + i, hv)) : 0.f;
    __syncthreads();
    // Vn = U − W S: thread owns rows i = tid / 4 (0..63), columns (tid % 4) * kCPT .. + kCPT.
    const int i = tid / 4, cb = (tid % 4) * kCPT;
    float acc[kCPT];
#pragma unroll
    for (int q = 0; q < kCPT; ++q) acc[q] = 0.f;
    for (int64_t d0 = 0; d0 < K; d0 += kTile) {
      __syncthreads();
      load_tile(xs, p.w, off_tok(p.w, sq.b, t0, hv), p.w.st[1], p.w.st[3], L, d0, K);
      __syncthreads();
      const int dn = static_cast<int>(K - d0 < kTile ? K - d0 : kTile);
      for (int d = 0; d < dn; ++d) {
        const float wv = xs[i * kLd + d];
        const float* srow = S + (d0 + d) * kSLd + cb;
#pragma unroll
        for (int q = 0; q < kCPT; ++q) acc[q] = fmaf(wv, srow[q], acc[q]);
      }
    }
    const float glast = gam[L - 1];
#pragma unroll
    for (int q = 0; q < kCPT; ++q) {
      const int64_t col = v0 + cb + q;
      float v = 0.f;
      if (i < L && col < V) {
        v = load_f(p.u, off_tok(p.u, sq.b, t0 + i, hv) + col * p.u.st[3]) - acc[q];
        if (p.v_new.present()) store_f(p.v_new, off_tok(p.v_new, sq.b, t0 + i, hv) + col * p.v_new.st[3], v);
        v *= expf(glast - gam[i]);
      }
      vn[i * kSLd + cb + q] = v;
    }
    // S = e^{γ_last} S + Kᵀ Vd, one 64-row slice of S at a time: thread owns S row d0 + tid / 4, kCPT columns.
    const float decay = expf(glast);
    for (int64_t d0 = 0; d0 < K; d0 += kTile) {
      __syncthreads();
      load_tile(xs, p.k, off_tok(p.k, sq.b, t0, h), p.k.st[1], p.k.st[3], L, d0, K);
      __syncthreads();
      const int a = tid / 4;
      if (d0 + a < K) {
        float s[kCPT];
#pragma unroll
        for (int q = 0; q < kCPT; ++q) s[q] = decay * S[(d0 + a) * kSLd + cb + q];
        for (int r = 0; r < L; ++r) {
          const float kv = xs[r * kLd + a];
#pragma unroll
          for (int q = 0; q < kCPT; ++q) s[q] = fmaf(kv, vn[r * kSLd + cb + q], s[q]);
        }
#pragma unroll
        for (int q = 0; q < kCPT; ++q) S[(d0 + a) * kSLd + cb + q] = s[q];
      }
    }
  }
  __syncthreads();
  if (p.ht.present())
    for (int idx = tid; idx < K * kStateCols; idx += kThreads) {
      const int a = idx / kStateCols, cc = idx % kStateCols;
      if (v0 + cc < V)
        store_f(p.ht, n * p.ht.st[0] + hv * p.ht.st[1] + a * p.ht.st[2] + (v0 + cc) * p.ht.st[3], S[a * kSLd + cc]);
    }
}

__global__ void __launch_bounds__(kThreads, 2) chunk_tile(const GdnFwdParams p, int64_t nvt) {
  extern __shared__ float sm[];
  float* qs = sm;
  float* ks = sm + kTileFloats;
  float* ss = sm + 2 * kTileFloats;   // S slice [64 (k)][64 (v)], later Vn [64 (j)][64 (v)]
  float* P = sm + 3 * kTileFloats;
  float* gam = sm + 4 * kTileFloats;
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V;
  const int64_t vt = blockIdx.x % nvt, rest = blockIdx.x / nvt;
  const int64_t slot = rest / HV, hv = rest % HV, h = hv / p.shape.G;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid || (p.chunks.varlen() && c.idx >= p.shape.NT)) return;
  const int L = static_cast<int>(c.e - c.s);
  const int64_t v0 = vt * kTile;
  const int64_t hb = h_base(p.h, p.chunks, c.b, c.idx) + hv * p.h.st[2];
  float pacc[4][4], oacc[4][4];
  zero(pacc);
  zero(oacc);
  for (int64_t d0 = 0; d0 < K; d0 += kTile) {
    __syncthreads();
    load_tile(qs, p.q, off_tok(p.q, c.b, c.s, h), p.q.st[1], p.q.st[3], L, d0, K);
    load_tile(ks, p.k, off_tok(p.k, c.b, c.s, h), p.k.st[1], p.k.st[3], L, d0, K);
    // S rows d0.., columns v0..: a [min(64, K - d0) x 64] slice (zero past K / V)
    load_tile(ss, p.h, hb + d0 * p.h.st[3], p.h.st[3], p.h.st[4], static_cast<int>(K - d0 < kTile ? K - d0 : kTile),
              v0, V);
    __syncthreads();
    mma_nt(pacc, qs, ks, row0(), col0());
    mma_nn(oacc, qs, ss, row0(), col0(), kTile);
  }
  load_gates(gam, nullptr, p, c, hv, L);
  __syncthreads();
  const int r0 = row0(), cc0 = col0();
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = r0 + a, j = cc0 + b;
      P[i * kLd + j] = (j <= i && i < L) ? pacc[a][b] * expf(gam[i] - gam[j]) : 0.f;
    }
  load_tile(ss, p.v, off_tok(p.v, c.b, c.s, hv), p.v.st[1], p.v.st[3], L, v0, V);
  __syncthreads();
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const float e = r0 + a < L ? expf(gam[r0 + a]) : 0.f;
#pragma unroll
    for (int b = 0; b < 4; ++b) oacc[a][b] *= e;
  }
  mma_nn(oacc, P, ss, r0, cc0, L);
  const float scale = p.shape.scale;
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = r0 + a;
      const int64_t col = v0 + cc0 + b;
      if (i < L && col < V) store_f(p.o, off_tok(p.o, c.b, c.s + i, hv) + col * p.o.st[3], scale * oacc[a][b]);
    }
}

// Launch with `smem` bytes of dynamic shared memory (opted in above 48 KiB) over `blocks` 1-D blocks.
template <class Kernel, class... Args>
int launch(Kernel kernel, const char* name, int64_t blocks, size_t smem, cudaStream_t stream, Args... args) {
  if (blocks <= 0) return STRATA_SUCCESS;
  if (blocks > 0x7fffffffLL)
    return fail(STRATA_ERROR_UNSUPPORTED, "{}: {} blocks exceed the CUDA grid limit", name, blocks);
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(args...);
  return cuda::check_launch(name);
}

}  // namespace

int fwd_cuda_fma(FwdOp op, const GdnFwdParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t slots = chunk_slots(p.chunks);
  const size_t tile = kTileFloats * sizeof(float);
  const int64_t nk = cdiv(p.shape.K, kTile), nv = cdiv(p.shape.V, kTile);
  switch (op) {
    case FwdOp::kKkt:
      return launch(kkt_tile, "chunk_scaled_dot_kkt (kkt_tile)", slots * p.shape.H, 2 * tile + 2 * kTile * 4, stream,
                    p);
    case FwdOp::kSolveTril:
      return launch(forward_subst_kernel, "solve_tril (forward_subst)", slots * p.shape.HV, 2 * tile, stream, p);
    case FwdOp::kRecomputeWU:
      return launch(wy_tile, "recompute_w_u_fwd (wy_tile)", slots * p.shape.HV * (nk + nv), 2 * tile + 2 * kTile * 4,
                    stream, p, nk + nv);
    case FwdOp::kPrepareWY:
      return launch(fused_wy, "prepare_wy_repr_fwd (fused_wy)", slots * p.shape.HV, 3 * tile + 2 * kTile * 4, stream,
                    p);
    case FwdOp::kFwdH: {
      const int64_t nvt = cdiv(p.shape.V, kStateCols);
      const size_t smem = (kMaxK * kSLd + kTileFloats + kTile * kSLd + kTile) * sizeof(float);
      return launch(state_scan, "chunk_gated_delta_rule_fwd_h (state_scan)", p.shape.N * p.shape.HV * nvt, smem,
                    stream, p, nvt);
    }
    case FwdOp::kFwdO:
      return launch(chunk_tile, "chunk_fwd_o (chunk_tile)", slots * p.shape.HV * nv, 4 * tile + kTile * 4, stream, p,
                    nv);
    default: return fail(STRATA_ERROR_INTERNAL, "gdn fwd_cuda: unknown op {}", static_cast<int>(op));
  }
}

}  // namespace strata::linear_attn::gdn
