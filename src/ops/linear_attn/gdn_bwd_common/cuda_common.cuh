// CUDA building blocks of the gdn_bwd kernels (sm_90): dtype-generic element access through a View, the
// chunk walk over token windows (fixed length and variable length, no host sync), the per-sequence chunk
// offsets (a one-block integer scan into the workspace), shared-memory 64 x 64 tiles and the block GEMM that
// multiplies them, fixed-order block reductions, and the GVA head reduction.
//
// Block GEMM: 256 threads own a 64 x 64 f32 accumulator tile, 4 x 4 elements each at rows ty + 16 i and columns
// tx + 16 j (ty = tid / 16, tx = tid % 16), summing over k in increasing order (f32 FMA, deterministic).
// Operands are shared-memory tiles with leading dimension kLd = 65 (odd: transposed reads do not conflict).
// Tiles hold rows past a chunk's end and columns past K or V as zeros, so every product runs over a full
// 64-deep contraction; chunk sizes 16 and 32 use the same tiles.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"
#include "tile/cuda/check.cuh"

namespace strata::linear_attn::gdn_bwd::cu {

constexpr int kThreads = 256;
constexpr int kTile = 64;
constexpr int kLd = 65;
constexpr int kTileFloats = kTile * kLd;

__device__ __forceinline__ float ld_f32(const View& v, int64_t i) {
  switch (v.dtype) {
    case STRATA_DTYPE_BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(v.p)[i]);
    case STRATA_DTYPE_F16: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(v.p)[i]));
    default: return static_cast<const float*>(v.p)[i];
  }
}
__device__ __forceinline__ void st_f32(const View& v, int64_t i, float x) {
  switch (v.dtype) {
    case STRATA_DTYPE_BF16: static_cast<uint16_t*>(v.p)[i] = f32_to_bf16_bits(x); break;
    case STRATA_DTYPE_F16: static_cast<uint16_t*>(v.p)[i] = __half_as_ushort(__float2half_rn(x)); break;
    default: static_cast<float*>(v.p)[i] = x; break;
  }
}

// ---- chunks: DevChunk, find_seq, num_windows, for_each_chunk are in gdn_bwd_common.h (host-testable) ----

// Workspace bytes of the chunk offsets (N + 1 int64; the plan does not know yet whether cu_seqlens is bound, so
// fixed-length problems reserve it too: B + 1 entries).
inline size_t chunk_offsets_bytes(const Dims& d) { return static_cast<size_t>(d.N + 1) * sizeof(int64_t); }
// chunk_offsets[n] = Σ_{m < n} ceil(L_m / BT), n = 0..N, by one block (integer: exact and deterministic);
// nothing to do in fixed-length mode.
strata_status launch_chunk_offsets(const Dims& d, int64_t* offs, cudaStream_t stream);

// ---- shared-memory tiles ----
// tile[r][c] = scale_r * v[base + r * row_stride + col0 + c] for r < rows, c < cols (zero elsewhere), with
// scale_r = rs ? rs[r] : 1.
__device__ __forceinline__ void load_tile(float* tile, const View& v, int64_t base, int64_t row_stride, int rows,
                                          int cols, const float* rs = nullptr) {
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    float x = 0.f;
    if (r < rows && c < cols) {
      x = ld_f32(v, base + r * row_stride + c);
      if (rs) x *= rs[r];
    }
    tile[r * kLd + c] = x;
  }
}

// acc[i][j] (+)= Σ_k A(ty + 16 i, k) B(k, tx + 16 j), k < kdim. A(r, k) = a[r kLd + k] (TA: a[k kLd + r]);
// B(k, c) = b[k kLd + c] (TB: b[c kLd + k]).
template <bool TA, bool TB>
__device__ __forceinline__ void mma(float (&acc)[4][4], const float* a, const float* b, int kdim = kTile) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  for (int k = 0; k < kdim; ++k) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = TA ? a[k * kLd + ty + 16 * i] : a[(ty + 16 * i) * kLd + k];
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = TB ? b[(tx + 16 * j) * kLd + k] : b[k * kLd + tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

__device__ __forceinline__ void zero(float (&acc)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
}
__device__ __forceinline__ int row_of(int i) { return threadIdx.x / 16 + 16 * i; }
__device__ __forceinline__ int col_of(int j) { return threadIdx.x % 16 + 16 * j; }

// Row sums of a per-thread 4 x 4 contribution, in a fixed order: red is a [64][16] scratch; out[r] += Σ over
// the 16 column groups (in tx order) for r < 64. Ends with a barrier.
__device__ __forceinline__ void add_row_sums(const float (&part)[4], float* red, float* out) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) red[(ty + 16 * i) * 16 + tx] = part[i];
  __syncthreads();
  if (threadIdx.x < kTile) {
    float s = 0.f;
    for (int c = 0; c < 16; ++c) s += red[threadIdx.x * 16 + c];
    out[threadIdx.x] += s;
  }
  __syncthreads();
}

// Sum of one value per thread in a fixed order (thread 0 adds the 256 partials in index order); every thread
// gets the result. Ends with a barrier.
__device__ __forceinline__ float block_sum(float x, float* red) {
  red[threadIdx.x] = x;
  __syncthreads();
  __shared__ float total;
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int i = 0; i < kThreads; ++i) s += red[i];
    total = s;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

// out[b, t, h, x] = Σ_{g < G} ws[((b T + t) HV + h G + g) K + x] in increasing g (the GVA reduction of
// per-value-head gradients in a fixed order), for every token (B T rows), h < H, x < K.
strata_status launch_reduce_heads(const float* ws, const Dims& d, const View& out, cudaStream_t stream);

// out[b, t, hv] = Σ_{i < tiles} part[((i B + b) T + t) HV + hv] in increasing i (per-tile partial sums of a
// [B, T, HV] gradient, e.g. dγ over the K tiles), for every token and value head.
strata_status launch_reduce_tiles(const float* part, int64_t tiles, const Dims& d, const View& out,
                                  cudaStream_t stream);

}  // namespace strata::linear_attn::gdn_bwd::cu
