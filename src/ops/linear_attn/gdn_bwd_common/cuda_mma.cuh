// Tensor-core building blocks of the gdn_bwd "cuda.sm90.mma" kernels (sm_90, warp-level mma.sync m16n8k16 with
// bf16 or f16 operands and f32 accumulators): operand tiles in shared memory as 16-bit bits (uint16_t), loaded
// from global memory with cp.async (16-byte segments, zero-filled outside the valid rows/columns) or, for
// unaligned views and other dtypes, converted element by element; fragment loads and mma.sync from
// tile/cuda/mma.cuh (cp.async from tile/cuda/cp_async.cuh); one warp GEMM that covers the four operand layouts
// the backward needs.
//
// Precision model (fla's, ops_gdn_kda.md §6.3): GEMM operands are bf16/f16 (the token tensors as given;
// intermediates such as Ds, dVn, the scaled dO and the state gradient dS are rounded to the token dtype before
// a product), every accumulator, carried state and row reduction is f32, reductions run in a fixed order.
//
// Fragment layout of mma.m16n8k16 (PTX ISA): lane = 4 g + t. C/D (16 x 8 f32): c[0], c[1] at row g, columns
// 2t, 2t+1; c[2], c[3] at row g + 8. `frag_row` / `frag_col` give them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/linear_attn/gdn_bwd_common/cuda_common.cuh"
#include "tile/cuda/cp_async.cuh"
#include "tile/cuda/mma.cuh"

namespace strata::linear_attn::gdn_bwd::tc {

// ---- element types: bf16_t / f16_t tags (opbase/dtype.h); shared memory holds their 16-bit patterns ----
template <class T>
struct Elem;
template <>
struct Elem<bf16_t> {
  static constexpr int32_t kDtype = STRATA_DTYPE_BF16;
  // The hardware conversion (cvt.rn.bf16.f32, one instruction): round to nearest even as f32_to_bf16_bits, the
  // same bits for every non-NaN value (a NaN stays a NaN, with the canonical payload).
  __device__ __forceinline__ static uint16_t from(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
  __device__ __forceinline__ static float to(uint16_t b) { return bf16_bits_to_f32(b); }
};
template <>
struct Elem<f16_t> {
  static constexpr int32_t kDtype = STRATA_DTYPE_F16;
  __device__ __forceinline__ static uint16_t from(float x) { return __half_as_ushort(__float2half_rn(x)); }
  __device__ __forceinline__ static float to(uint16_t b) { return __half2float(__ushort_as_half(b)); }
};

// ---- PTX wrappers: tile/cuda/mma.cuh (mma.sync, ldmatrix) and tile/cuda/cp_async.cuh ----
template <class T>
using MmaT = std::conditional_t<std::is_same_v<T, bf16_t>, __nv_bfloat16, __half>;

template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const ::strata::cuda::mma::FragA& a, const ::strata::cuda::mma::FragB& b) {
  ::strata::cuda::mma::FragC f;
  f.x[0] = c[0], f.x[1] = c[1], f.x[2] = c[2], f.x[3] = c[3];
  ::strata::cuda::mma::mma16816<MmaT<T>>(f, a, b);
  c[0] = f.x[0], c[1] = f.x[1], c[2] = f.x[2], c[3] = f.x[3];
}
// Completes this thread's outstanding cp.async copies (a barrier must follow before other threads read them).
__device__ __forceinline__ void cp_async_wait_all() {
  ::strata::cuda::cp_async_commit();
  ::strata::cuda::cp_async_wait<0>();
}

// ---- accumulator fragments ----
__device__ __forceinline__ int frag_row(int mt, int e) { return mt * 16 + (threadIdx.x & 31) / 4 + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int frag_col(int nt, int e) { return nt * 8 + (threadIdx.x & 3) * 2 + (e & 1); }
template <int MT, int NT>
__device__ __forceinline__ void zero(float (&c)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[i][j][e] = 0.f;
}

// ---- global -> shared tiles ----
// s[r * ld + c] = T(v[base + r * row_stride + c]) for r < rows, c < cols; 0 for the rest of the R x C tile
// (C % 8 == 0, ld % 8 == 0, s 16-byte aligned). 16-byte cp.async segments when the view holds T, its rows are
// 16-byte aligned and the segment is fully valid; element-wise conversion otherwise. Never reads outside the
// valid rows/columns. Call cp_async_wait_all() and __syncthreads() before reading the tile. kLean = false keeps
// whole tiles on the general loop too (for kernels at their register limit, where the lean path's live pointers
// add spills: chunk_bwd_dqkwg's two-per-SM variant).
template <class T, int NTHREADS, bool kLean = true>
__device__ __forceinline__ void load_tile_async(uint16_t* s, int ld, int R, int C, const View& v, int64_t base,
                                                int64_t row_stride, int rows, int cols) {
  const uint16_t* src16 = static_cast<const uint16_t*>(v.p) + base;
  const bool vec = v.dtype == Elem<T>::kDtype && (reinterpret_cast<uintptr_t>(src16) & 15) == 0 &&
                   (row_stride & 7) == 0;
  const int segs = C / 8;
  // The common case (full chunk, K / V columns filling the tile, 16-byte copyable view): every segment is valid and
  // this thread's segments sit at one column and every NTHREADS / segs rows, so their addresses advance by constant
  // strides instead of being formed per segment from the element index (64-bit multiply-adds and the branch below:
  // session 5's SASS study counted ~30 integer instructions per 16-byte copy). The same bytes land in the same
  // places as the general loop.
  if (kLean && vec && rows >= R && cols >= C && segs > 0 && NTHREADS % segs == 0) {
    const int step = NTHREADS / segs;
    const int r0 = static_cast<int>(threadIdx.x) / segs, c = (static_cast<int>(threadIdx.x) - r0 * segs) * 8;
    const int64_t src_step = static_cast<int64_t>(step) * row_stride;
    const uint16_t* src = src16 + static_cast<int64_t>(r0) * row_stride + c;
    uint16_t* dst = s + r0 * ld + c;
    for (int r = r0; r < R; r += step, src += src_step, dst += step * ld) ::strata::cuda::cp_async16(dst, src, true);
    return;
  }
  for (int e = threadIdx.x; e < R * segs; e += NTHREADS) {
    const int r = e / segs, c = (e - r * segs) * 8;
    uint16_t* dst = s + r * ld + c;
    if (vec && r < rows && c + 8 <= cols) {
      ::strata::cuda::cp_async16(dst, src16 + static_cast<int64_t>(r) * row_stride + c, true);
    } else {
      uint16_t x[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        x[i] = (r < rows && c + i < cols) ? Elem<T>::from(cu::ld_f32(v, base + static_cast<int64_t>(r) * row_stride + c + i))
                                          : uint16_t{0};
      uint4 u;
      u.x = x[0] | (uint32_t{x[1]} << 16);
      u.y = x[2] | (uint32_t{x[3]} << 16);
      u.z = x[4] | (uint32_t{x[5]} << 16);
      u.w = x[6] | (uint32_t{x[7]} << 16);
      *reinterpret_cast<uint4*>(dst) = u;
    }
  }
}

// ---- warp GEMM ----
// c[MT x 16 rows][NT x 8 columns] += A · B over kdim (a multiple of 16), operands in shared memory:
//   A(m, k) = ARow ? a[m * lda + k] : a[k * lda + m]      (a points at the warp's row origin m = 0)
//   B(k, n) = BKN  ? b[k * ldb + n] : b[n * ldb + k]      (b points at the warp's column origin n = 0)
// lda, ldb multiples of 8 (16-byte ldmatrix rows); NT even (B fragments are loaded two n-tiles at a time).
template <class T, bool ARow, bool BKN, int MT, int NT>
__device__ __forceinline__ void warp_gemm(float (&c)[MT][NT][4], const uint16_t* a, int lda, const uint16_t* b,
                                          int ldb, int kdim) {
  static_assert(NT % 2 == 0, "B fragments come in pairs of n-tiles");
  using M = MmaT<T>;
  const M* am = reinterpret_cast<const M*>(a);
  const M* bm = reinterpret_cast<const M*>(b);
  for (int k0 = 0; k0 < kdim; k0 += 16) {
    ::strata::cuda::mma::FragA af[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      af[mt] = ARow ? ::strata::cuda::mma::load_a(am, lda, mt * 16, k0) : ::strata::cuda::mma::load_a_trans(am, lda, mt * 16, k0);
    ::strata::cuda::mma::FragB bf[NT];
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      if (BKN)
        ::strata::cuda::mma::load_b2_trans(bf[2 * np], bf[2 * np + 1], bm, ldb, k0, np * 16);
      else
        ::strata::cuda::mma::load_b2(bf[2 * np], bf[2 * np + 1], bm, ldb, k0, np * 16);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma16816<T>(c[mt][nt], af[mt], bf[nt]);
  }
}

// v[o] = a and, when `both`, v[o + 1] = b (an accumulator fragment's two adjacent columns): one 32-bit store for
// 16-bit dtypes or one 64-bit store for f32 when the pair's address is aligned, element stores otherwise.
__device__ __forceinline__ void st_pair(const View& v, int64_t o, float a, float b, bool both) {
  if (both) {
    if (v.dtype == STRATA_DTYPE_F32) {
      float* q = static_cast<float*>(v.p) + o;
      if ((reinterpret_cast<uintptr_t>(q) & 7) == 0) {
        *reinterpret_cast<float2*>(q) = make_float2(a, b);
        return;
      }
    } else {
      uint16_t* q = static_cast<uint16_t*>(v.p) + o;
      if ((reinterpret_cast<uintptr_t>(q) & 3) == 0) {
        const uint32_t lo = v.dtype == STRATA_DTYPE_BF16 ? Elem<bf16_t>::from(a) : Elem<f16_t>::from(a);
        const uint32_t hi = v.dtype == STRATA_DTYPE_BF16 ? Elem<bf16_t>::from(b) : Elem<f16_t>::from(b);
        *reinterpret_cast<uint32_t*>(q) = lo | (hi << 16);
        return;
      }
    }
    cu::st_f32(v, o + 1, b);
  }
  cu::st_f32(v, o, a);
}

// Sums of two values per thread over a block of NTHREADS (a multiple of 32) in a fixed order: an xor butterfly in
// each warp (both partners add the same two numbers, so every lane holds the same bits), then every thread adds
// the warp partials in warp order. red: float[2 * NTHREADS / 32] scratch. Barriers inside (ends with one).
template <int NTHREADS>
__device__ __forceinline__ float2 block_sum2(float a, float b, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  constexpr int kW = NTHREADS / 32;
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = a, red[kW + threadIdx.x / 32] = b;
  __syncthreads();
  float2 s = make_float2(0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kW; ++w) s.x += red[w], s.y += red[kW + w];
  __syncthreads();
  return s;
}

// The tensor-core path applies when every listed view holds the same 16-bit dtype (bf16 or f16): returns it, or
// 0 when the views disagree / hold f32 (those run the FMA kernels: their 1e-5 ceiling rules out 16-bit products).
inline int32_t common_16bit_dtype(std::initializer_list<const View*> vs) {
  int32_t dt = 0;
  for (const View* v : vs) {
    if (v->dtype != STRATA_DTYPE_BF16 && v->dtype != STRATA_DTYPE_F16) return 0;
    if (dt == 0) dt = v->dtype;
    else if (dt != v->dtype) return 0;
  }
  return dt;
}

}  // namespace strata::linear_attn::gdn_bwd::tc
