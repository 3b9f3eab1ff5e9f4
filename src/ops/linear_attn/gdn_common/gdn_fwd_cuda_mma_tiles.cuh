// Device building blocks of the GDN forward tensor-core kernels (gdn_fwd_cuda_mma.cu: wy_mma, state_mma, state_o_mma,
// qk_gate_mma, chunk_o_mma; gdn_fwd_cuda_prep.cu: prep_mma), shared so that every kernel loads tiles, forms the
// gated products, inverts a chunk and stores its results with the same code, hence the same bits:
//   chunk tile loads (load_tile: any dtype / strides, cp.async fast path; lean_rows: fixed-slot cp.async of plain
//   16-bit layouts), 16-bit pair stores / loads, scaled A fragments, the gated Q Kᵀ block (qk_gated_block),
//   the blocked f32 inverse of I + strictly-lower M (invert, with ~f32 split products), the chunk-matrix store
//   (store_chunk_mat), the w / u products of one row block (wu_tiles), and the checked launch (launch_n).
// Everything is in an anonymous namespace (internal linkage in each CUDA translation unit, as before the split:
// there is no device linking between the .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/cp_async.cuh"
#include "tile/cuda/mma.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::linear_attn::gdn {
namespace {

namespace mma = strata::cuda::mma;
using mma::FragA;
using mma::FragB;
using mma::FragC;

constexpr int kThreads = 128;  // 4 warps
constexpr int kRows = 64;      // rows of a chunk tile
constexpr int kLdT = 64 + 8;   // leading dim (elements) of a 64-column 16-bit tile (conflict-free ldmatrix)
constexpr int kLdF = 64 + 4;   // leading dim of a 64 x 64 f32 tile

template <class T>
constexpr int32_t dtype_of() {
  return std::is_same_v<T, __nv_bfloat16> ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16;
}

__device__ __forceinline__ int64_t off_tok(const GdnTensor& t, int64_t b, int64_t tok, int64_t head) {
  return b * t.st[0] + tok * t.st[1] + head * t.st[2];
}

// dst [kRows][ld] (16-bit T) = rows r < kRows of a strided matrix: element (r, c) at t[base + r*rs + (c0+c)*cs]
// for r < rows and c0 + c < cols, 0 elsewhere; columns [0, kCols). Issues cp.async copies (call
// cp_async_commit / cp_async_wait / __syncthreads before reading dst) and plain stores for the rest.
// kNThreads: the block size (every thread of the block calls it). The fast case (T data, unit column stride,
// 16-byte aligned rows: every segment is one cp.async, zero-filling ones past the rows or columns) is a fully
// unrolled loop with compile-time row / segment indices, so a segment costs a few instructions; the element
// path (any dtype, strides, alignment) is the fallback, and also handles a segment that straddles `cols`.
// One 8-element segment (row r, columns col..col+7) element by element with conversion, 0 past rows / cols.
// Not inlined: it is the cold path of every unrolled tile load (scalar arguments only, so that no kernel
// parameter has to be copied to local memory for a reference).
template <class T>
__device__ __noinline__ void element_segment(T* d, const void* data, int32_t dtype, int64_t base, int64_t rs,
                                             int64_t cs, int r, int rows, int64_t col, int64_t cols) {
  float v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    v[e] = (r < rows && col + e < cols) ? load_f(data, dtype, base + r * rs + (col + e) * cs) : 0.f;
  uint4 u;
  u.x = mma::pack2<T>(v[0], v[1]);
  u.y = mma::pack2<T>(v[2], v[3]);
  u.z = mma::pack2<T>(v[4], v[5]);
  u.w = mma::pack2<T>(v[6], v[7]);
  *reinterpret_cast<uint4*>(d) = u;
}

template <class T, int kCols, int kNThreads = kThreads>
__device__ __forceinline__ void load_tile(T* dst, int ld, const GdnTensor& t, int64_t base, int64_t rs, int64_t cs,
                                          int rows, int64_t c0, int64_t cols) {
  static_assert(kCols % 8 == 0, "16-byte row segments");
  constexpr int kSeg = kCols / 8;
  constexpr int kTotal = kRows * kSeg;
  const uint16_t* src = static_cast<const uint16_t*>(t.data) + base;
  const bool fast = t.dtype == dtype_of<T>() && cs == 1 && rs % 8 == 0 &&
                    (reinterpret_cast<uintptr_t>(src + c0) & 15u) == 0;
  if (fast) {
#pragma unroll
    for (int it = 0; it < (kTotal + kNThreads - 1) / kNThreads; ++it) {
      const int idx = static_cast<int>(threadIdx.x) + it * kNThreads;
      if (kTotal % kNThreads != 0 && idx >= kTotal) break;
      const int r = idx / kSeg, q = idx - r * kSeg;
      T* d = dst + r * ld + q * 8;
      const int64_t col = c0 + q * 8;
      if (r < rows && col + 8 <= cols) {
        cuda::cp_async16(d, src + r * rs + col, true);
      } else if (r >= rows || col >= cols) {
        cuda::cp_async16(d, src, false);  // 16 zero bytes, nothing read
      } else {
        element_segment<T>(d, t.data, t.dtype, base, rs, cs, r, rows, col, cols);
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < kTotal; idx += kNThreads) {
      const int r = idx / kSeg, q = idx - r * kSeg;
      element_segment<T>(dst + r * ld + q * 8, t.data, t.dtype, base, rs, cs, r, rows, c0 + q * 8, cols);
    }
  }
}

// cp.async of 16 bytes to a shared-space address (zero fill, nothing read, when !valid).
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// A token tensor [B, T, heads, D] the lean loads (lean_rows, state_o_mma) can copy by 16-byte segments at any
// (b, t, head): dtype T, unit column stride, outer strides multiples of 8 elements, 16-byte aligned data.
template <class T>
__device__ __forceinline__ bool lean_tensor(const GdnTensor& t) {
  return t.dtype == dtype_of<T>() && t.st[3] == 1 && ((t.st[0] | t.st[1] | t.st[2]) & 7) == 0 &&
         (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0;
}

// Lean form of load_tile for a lean_tensor t whose D columns are a multiple of 64 (every segment inside D):
// rows [0, 64) of every 64-column tile of the chunk at element offset `base` into dst [64][ld], rows >= rows
// zero-filled. Each thread copies fixed (row, segment) slots, so a segment costs one 64-bit address and one
// predicated cp.async instead of load_tile's per-segment arithmetic and three-way branch. Caller commits.
template <int kNThr>
__device__ __forceinline__ void lean_rows(void* dst, int ld, const GdnTensor& t, int64_t base, int rows, int64_t D) {
  constexpr int kSeg = 8, kStep = kNThr / kSeg;  // 16-byte segments of a 64-column row; rows per pass
  static_assert(kNThr % kSeg == 0 && kRows % kStep == 0, "whole passes over a 64-row tile");
  const int q = static_cast<int>(threadIdx.x) % kSeg, r0 = static_cast<int>(threadIdx.x) / kSeg;
  const uint16_t* src = static_cast<const uint16_t*>(t.data) + base + q * 8;
  const uint32_t sb =
      static_cast<uint32_t>(__cvta_generic_to_shared(dst)) + static_cast<uint32_t>((r0 * ld + q * 8) * 2);
  const int64_t rs = t.st[1];
  for (int64_t d0 = 0; d0 < D; d0 += 64)
#pragma unroll
    for (int it = 0; it < kRows / kStep; ++it) {
      const int r = r0 + it * kStep;
      const bool ok = r < rows;
      cp_async16_s(sb + static_cast<uint32_t>((it * kStep * ld + d0) * 2), ok ? src + r * rs + d0 : src, ok);
    }
}

// Stores the pair (a, b) at columns col, col + 1 (< D) of a row at element offset `row_off` of t: one 32-bit
// store when t is 16-bit, unit-stride and aligned, element stores otherwise.
__device__ __forceinline__ void store_pair(const GdnTensor& t, int64_t row_off, int64_t cs, int64_t col, int64_t D,
                                           float a, float b) {
  if (col >= D) return;
  const int64_t i = row_off + col * cs;
  if ((t.dtype == STRATA_DTYPE_BF16 || t.dtype == STRATA_DTYPE_F16) && cs == 1 && col + 1 < D &&
      (reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(t.data) + i) & 3u) == 0) {
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(t.data) + i) = cuda::pack_half2(t.dtype, a, b);
    return;
  }
  store_f(t, i, a);
  if (col + 1 < D) store_f(t, i + cs, b);
}

// store_pair with its fast-case test hoisted out of the loops: vec = pair_vec<T>(t) (t is T, unit column stride,
// even outer strides and a 4-byte aligned base, so every (row, even column) pair is one aligned 32-bit word).
template <class T>
__device__ __forceinline__ bool pair_vec(const GdnTensor& t) {
  return t.dtype == dtype_of<T>() && t.st[3] == 1 && ((t.st[0] | t.st[1] | t.st[2]) & 1) == 0 &&
         (reinterpret_cast<uintptr_t>(t.data) & 3u) == 0;
}
template <class T>
__device__ __forceinline__ void store_pair_v(const GdnTensor& t, bool vec, int64_t row_off, int64_t col, int64_t D,
                                             float a, float b) {
  if (vec && col + 1 < D) {
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(t.data) + row_off + col) = mma::pack2<T>(a, b);
    return;
  }
  store_pair(t, row_off, t.st[3], col, D, a, b);
}

// Loads the pair at columns col, col + 1 of a row at element offset `row_off` of t (0 past D): one 32-bit load
// when t is T, unit-stride and aligned, element loads otherwise.
template <class T>
__device__ __forceinline__ void load_pair(const GdnTensor& t, int64_t row_off, int64_t cs, int64_t col, int64_t D,
                                          float& a, float& b) {
  const int64_t i = row_off + col * cs;
  if (t.dtype == dtype_of<T>() && cs == 1 && col + 1 < D &&
      (reinterpret_cast<uintptr_t>(static_cast<const uint16_t*>(t.data) + i) & 3u) == 0) {
    const float2 f = mma::unpack2<T>(*reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(t.data) + i));
    a = f.x, b = f.y;
    return;
  }
  a = col < D ? load_f(t, i) : 0.f;
  b = col + 1 < D ? load_f(t, i + cs) : 0.f;
}

// load_pair with the fast-case test hoisted (vec = pair_vec<T>(t)).
template <class T>
__device__ __forceinline__ void load_pair_v(const GdnTensor& t, bool vec, int64_t row_off, int64_t col, int64_t D,
                                            float& a, float& b) {
  if (vec && col + 1 < D) {
    const uint16_t* src = static_cast<const uint16_t*>(t.data) + row_off + col;
    const float2 f = mma::unpack2<T>(*reinterpret_cast<const uint32_t*>(src));
    a = f.x, b = f.y;
    return;
  }
  load_pair<T>(t, row_off, t.st[3], col, D, a, b);
}

// A fragment (16 x 16 block at rows m0, cols k0) of the f32 tile X (ld kLdF) with column j scaled by f[j],
// rounded to T.
template <class T>
__device__ __forceinline__ FragA frag_a_scaled(const float* X, int m0, int k0, const float* f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const float* r0 = X + (m0 + g) * kLdF + k0 + t2;
  const float* r1 = r0 + 8 * kLdF;
  const float* fc = f + k0 + t2;
  FragA a;
  a.x[0] = mma::pack2<T>(r0[0] * fc[0], r0[1] * fc[1]);
  a.x[1] = mma::pack2<T>(r1[0] * fc[0], r1[1] * fc[1]);
  a.x[2] = mma::pack2<T>(r0[8] * fc[8], r0[9] * fc[9]);
  a.x[3] = mma::pack2<T>(r1[8] * fc[8], r1[9] * fc[9]);
  return a;
}

// ---------------------------------------------------------------- the gated Q Kᵀ of a chunk
constexpr int kKF = 128;        // key columns of the fused pass's K / W / Q tiles (K <= 128; S rows)
constexpr int kLdKF = kKF + 8;  // their leading dim

// The 10 lower 16 x 16 blocks (row block, column block) of a 64 x 64 chunk matrix.
__device__ __forceinline__ void lower_block(int i, int& rb, int& cb) {
  rb = i < 1 ? 0 : (i < 3 ? 1 : (i < 6 ? 2 : 3));
  cb = i - rb * (rb + 1) / 2;
}

// Block (prb, pcb) of the chunk's P = Q Kᵀ ⊙ Γ into pc[0], pc[1] (its 8-column halves): (q_i·k_j) e^{γ_i − γ_j}
// for j <= i < L, 0 elsewhere (selected). Q, K: [64][ld] 16-bit tiles of >= kKF columns, zero past K; all kKF / 16
// key steps run (the zero columns add +0). The fused pass's inline P; qk_gate_mma forms the same products in the
// same order, so the two give the same bits.
template <class T>
__device__ __forceinline__ void qk_gated_block(const T* Qs, const T* Ks, int ld, int prb, int pcb, const float* gam,
                                               int L, FragC (&pc)[2]) {
  pc[0].zero(), pc[1].zero();
#pragma unroll
  for (int ks = 0; ks < kKF / 16; ++ks) {
    const FragA a = mma::load_a(Qs, ld, 16 * prb, 16 * ks);
    FragB b0, b1;
    mma::load_b2(b0, b1, Ks, ld, 16 * ks, 16 * pcb);
    mma::mma16816<T>(pc[0], a, b0);
    mma::mma16816<T>(pc[1], a, b1);
  }
#pragma unroll
  for (int hn = 0; hn < 2; ++hn)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * prb + mma::c_row(e), j = 16 * pcb + 8 * hn + mma::c_col(e);
      pc[hn].x[e] = (j <= i && i < L) ? pc[hn].x[e] * expf(gam[i] - gam[j]) : 0.f;
    }
}

// ---------------------------------------------------------------- the WY kernel family
enum WyMode : int { kWyKkt = 0, kWySolve, kWyRecompute, kWyPrepare };

// ~f32 products on the bf16 tensor cores: x = hi + lo with hi = bf16(x), lo = bf16(x − hi) (|x − hi − lo| <=
// 2^-16 |x|), and A B ≈ Al Bh + Ah Bl + Ah Bh (the dropped Al Bl is 2^-16 smaller): relative error ~2^-15 per
// product, 16 x below the f16 unit roundoff of the stored inverse (bf16: 64 x). bf16 whatever the token dtype:
// entries of the inverse can exceed the f16 range.
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = mma::pack2<__nv_bfloat16>(a, b);
  const float2 h = mma::unpack2<__nv_bfloat16>(hi);
  lo = mma::pack2<__nv_bfloat16>(a - h.x, b - h.y);
}
// A fragment (16 x 16 at rows m0, cols k0) of the row-major f32 tile F (leading dim ld), split.
__device__ __forceinline__ void frag_a_split(const float* F, int ld, int m0, int k0, FragA& hi, FragA& lo) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const float* r0 = F + (m0 + g) * ld + k0 + t2;
  const float* r1 = r0 + 8 * ld;
  split2(r0[0], r0[1], hi.x[0], lo.x[0]);
  split2(r1[0], r1[1], hi.x[1], lo.x[1]);
  split2(r0[8], r0[9], hi.x[2], lo.x[2]);
  split2(r1[8], r1[9], hi.x[3], lo.x[3]);
}
// B fragments of the 16 x 16 block (k0.., n0..n0+15) of the row-major f32 tile F [k][n], split (2 n-tiles).
__device__ __forceinline__ void frag_b_split(const float* F, int ld, int k0, int n0, FragB (&hi)[2], FragB (&lo)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const float* c = F + (k0 + t2) * ld + n0 + 8 * nt + g;
    split2(c[0], c[ld], hi[nt].x[0], lo[nt].x[0]);
    split2(c[8 * ld], c[9 * ld], hi[nt].x[1], lo[nt].x[1]);
  }
}
__device__ __forceinline__ void mma_split(FragC (&acc)[2], const FragA& ah, const FragA& al, const FragB (&bh)[2],
                                          const FragB (&bl)[2]) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    mma::mma16816<__nv_bfloat16>(acc[nt], al, bh[nt]);
    mma::mma16816<__nv_bfloat16>(acc[nt], ah, bl[nt]);
    mma::mma16816<__nv_bfloat16>(acc[nt], ah, bh[nt]);
  }
}

constexpr int kLdY = 16 + 4;  // leading dim of a 16 x 16 f32 merge tile (conflict-free fragment loads)

// The steps of the blocked inverse X = (I + M)^-1 of a strictly lower 64 x 64 f32 M (ld kLdF, zero outside the
// strictly lower part), shared by invert (M and X apart) and prep_group_mma's in-place form (X over M):
//   invert_diag_column: lane j < 16 of a warp: column j of the inverse of the unit lower 16 x 16 block at (r0, r0)
//     by forward substitution in f32 (a column of the inverse depends on that column only), into x[0..15];
//   invert_merge_y: warp c < r: Y = Σ_{k=c}^{r−1} M_rk X_kc (split products) into Yw [16][kLdY];
//   invert_merge_x: the same warp after Yw is visible to it: X_rc = −X_rr Y into X.
// (Session 11) The row entries M_im, m < i, are read as float4 (36 broadcast loads a lane instead of 120; M's rows
// and r0 are 16-byte aligned: kLdF = 68, r0 a multiple of 16, M at a 16-byte aligned tile); the same FMA order.
__device__ __forceinline__ void invert_diag_column(const float* M, int r0, int j, float (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float acc = i == j ? 1.f : 0.f;
    const float4* mrow = reinterpret_cast<const float4*>(M + (r0 + i) * kLdF + r0);
#pragma unroll
    for (int q = 0; 4 * q < i; ++q) {
      const float4 mv = mrow[q];
      const float m4[4] = {mv.x, mv.y, mv.z, mv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (4 * q + e < i) acc = fmaf(-m4[e], x[4 * q + e], acc);
    }
    x[i] = i < j ? 0.f : acc;
  }
}
__device__ __forceinline__ void invert_merge_y(const float* M, const float* X, int r, int c, float* Yw) {
  FragA ah, al;
  FragB bh[2], bl[2];
  FragC y[2];
  y[0].zero(), y[1].zero();
  for (int k = c; k < r; ++k) {
    frag_a_split(M, kLdF, 16 * r, 16 * k, ah, al);
    frag_b_split(X, kLdF, 16 * k, 16 * c, bh, bl);
    mma_split(y, ah, al, bh, bl);
  }
  mma::store_c(Yw, kLdY, 0, 0, y[0]);
  mma::store_c(Yw, kLdY, 0, 8, y[1]);
}
__device__ __forceinline__ void invert_merge_x(float* X, const float* Yw, int r, int c) {
  FragA ah, al;
  FragB bh[2], bl[2];
  FragC x[2];
  x[0].zero(), x[1].zero();
  frag_a_split(X, kLdF, 16 * r, 16 * r, ah, al);
  frag_b_split(Yw, kLdY, 0, 0, bh, bl);
  mma_split(x, ah, al, bh, bl);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nt].x[e] = -x[nt].x[e];
    mma::store_c(X, kLdF, 16 * r, 16 * c + 8 * nt, x[nt]);
  }
}

// X = (I + M)^-1 for strictly lower M (f32 tiles, ld kLdF, zero outside the strictly lower part): the four
// 16 x 16 diagonal blocks by forward substitution in f32 (warp w, lane j < 16 owns column j of block w), then
// block rows r = 1..3 in order, warp c < r computing X_rc = −X_rr Y, Y = Σ_{k=c}^{r−1} M_rk X_kc (Y in
// Yf + c·16·kLdY) with the split products above; one barrier per block row. Fixed order, no atomics. kNThr: the
// block size (4 or 8 warps; warps 4.. only zero X's upper blocks and take the barriers).
template <int kNThr>
__device__ void invert(const float* M, float* X, float* Yf) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int idx = tid; idx < kRows * kRows; idx += kNThr) {
    const int i = idx >> 6, j = idx & 63;
    if ((j >> 4) > (i >> 4)) X[i * kLdF + j] = 0.f;
  }
  if (lane < 16 && warp < 4) {
    const int r0 = 16 * warp, j = lane;
    float x[16];
    invert_diag_column(M, r0, j, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) X[(r0 + i) * kLdF + r0 + j] = x[i];
  }
  for (int r = 1; r < 4; ++r) {
    __syncthreads();  // X_rr and the blocks of rows < r are complete
    if (warp < r) {
      float* Yw = Yf + warp * 16 * kLdY;
      invert_merge_y(M, X, r, warp, Yw);
      __syncwarp();
      invert_merge_x(X, Yw, r, warp);
    }
  }
  __syncthreads();
}

// Rows [0, L) of a chunk matrix (cols < BT) from the f32 tile X into rows s.. of t (cols >= L written as 0).
// Fast case (BT = 64, t of the kernel's dtype T, unit column stride, 16-byte aligned rows): one 16-byte store of
// 8 values per thread and step, read as two float4 from X. kNThr threads with indices tid = 0.. kNThr − 1 (the
// block by default; prep_group_mma passes the thread index inside its 4-warp value-head group).
template <class T, int kNThr>
__device__ void store_chunk_mat(const GdnTensor& t, const ChunkPos& c, int64_t hv, int L, int BT, const float* X,
                                int tid = static_cast<int>(threadIdx.x)) {
  const int64_t row0 = off_tok(t, c.b, c.s, hv);
  if (BT == kRows && t.dtype == dtype_of<T>() && t.st[3] == 1 && t.st[1] % 8 == 0 &&
      (reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(t.data) + row0) & 15u) == 0) {
    for (int idx = tid; idx < L * 8; idx += kNThr) {
      const int i = idx >> 3, j0 = (idx & 7) * 8;
      const float4 a = *reinterpret_cast<const float4*>(X + i * kLdF + j0);
      const float4 b = *reinterpret_cast<const float4*>(X + i * kLdF + j0 + 4);
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      uint32_t w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w[e] = mma::pack2<T>(j0 + 2 * e < L ? v[2 * e] : 0.f, j0 + 2 * e + 1 < L ? v[2 * e + 1] : 0.f);
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(t.data) + row0 + i * t.st[1] + j0) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
    return;
  }
  for (int idx = tid; idx < L * BT; idx += kNThr) {
    const int i = idx / BT, j = idx - i * BT;
    store_f(t, off_tok(t, c.b, c.s + i, hv) + j * t.st[3], j < L ? X[i * kLdF + j] : 0.f);
  }
}

// Shared memory of wy_mma: the whole K chunk [64][Kp + 8] and V chunk [64][Vp + 8] (Kp, Vp = K, V rounded up
// to 64; only the tiles the mode reads), M and X [64][kLdF] f32, the merge scratch and γ, β.
__host__ __device__ inline int round64(int64_t x) { return static_cast<int>((x + 63) / 64 * 64); }
inline size_t wy_smem(int mode, int64_t K, int64_t V) {
  const bool k_tile = mode != kWySolve, v_tile = mode == kWyRecompute || mode == kWyPrepare;
  return (k_tile ? size_t(kRows) * (round64(K) + 8) * 2 : 0) + (v_tile ? size_t(kRows) * (round64(V) + 8) * 2 : 0) +
         2 * kRows * kLdF * 4 + 3 * 16 * kLdY * 4 + 2 * kRows * 4;
}

// Rows 16 rw.. of dst = A diag(f) src for one chunk (dst = w with src = K, f = β e^γ; dst = u with src = V,
// f = β), every 64-column tile of D columns, written for rows < L. A = X (f32 inverse, lower: only column
// blocks ks <= rw are non-zero), rounded to T after the scaling. kNpStep = 2: only the 16-column units np of each
// tile with np % 2 == np0 (two warps share a row block; every product and store is the one of kNpStep = 1).
template <class T, int kNpStep = 1>
__device__ __forceinline__ void wu_tiles(const GdnTensor& dst, const T* src, int lds, int64_t D, const float* X,
                                         const float* f, int rw, const ChunkPos& c, int64_t hv, int L, int np0 = 0) {
  FragA a[4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) a[ks] = frag_a_scaled<T>(X, 16 * rw, 16 * ks, f);
  const bool vec = pair_vec<T>(dst);
  for (int64_t c0 = 0; c0 < D; c0 += 64) {
    FragC acc[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[n].zero();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      if (ks <= rw) {
#pragma unroll
        for (int np = 0; np < 4; ++np)
          if (np % kNpStep == np0) {
            FragB b0, b1;
            mma::load_b2_trans(b0, b1, src, lds, 16 * ks, static_cast<int>(c0) + 16 * np);
            mma::mma16816<T>(acc[2 * np], a[ks], b0);
            mma::mma16816<T>(acc[2 * np + 1], a[ks], b1);
          }
      }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * rw + mma::c_row(2 * half);
      if (i >= L) continue;
      const int64_t ro = off_tok(dst, c.b, c.s + i, hv);
      if (vec && c0 + 64 <= D) {
        // Whole tile inside D: one row pointer, aligned 32-bit stores at fixed offsets (pair_vec: T, unit column
        // stride, even strides, 4-byte aligned base; c0 and c_col(0) are even).
        uint16_t* row = static_cast<uint16_t*>(dst.data) + ro + c0 + mma::c_col(0);
#pragma unroll
        for (int n = 0; n < 8; ++n)
          if ((n >> 1) % kNpStep == np0)
            *reinterpret_cast<uint32_t*>(row + 8 * n) = mma::pack2<T>(acc[n].x[2 * half], acc[n].x[2 * half + 1]);
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n)
          if ((n >> 1) % kNpStep == np0)
            store_pair_v<T>(dst, vec, ro, c0 + 8 * n + mma::c_col(0), D, acc[n].x[2 * half], acc[n].x[2 * half + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------- launch
// Checked launch of `blocks` 1-D blocks of `threads` threads with `smem` bytes of dynamic shared memory.
template <class Kernel, class... Args>
int launch_n(Kernel kernel, const char* name, int64_t blocks, int threads, size_t smem, cudaStream_t stream,
             Args... args) {
  if (blocks <= 0) return STRATA_SUCCESS;
  if (blocks > 0x7fffffffLL)
    return fail(STRATA_ERROR_UNSUPPORTED, "{}: {} blocks exceed the CUDA grid limit", name, blocks);
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(args...);
  return cuda::check_launch(name);
}

}  // namespace
}  // namespace strata::linear_attn::gdn
