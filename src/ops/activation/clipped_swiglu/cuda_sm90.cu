// CUDA kernels of clipped_swiglu (clipped_swiglu.h). Memory-bound and element-wise; arithmetic in f32.
//
// Forward, `pairs_vec`: one thread per 8 outputs of a row (I % 8 == 0, 16-byte aligned rows): it reads the 8
// pairs with 16-byte loads (interleaved: 16 consecutive elements; split: 8 gates at i and 8 linear values at
// I + i) and writes the 8 outputs with one 16-byte store (bf16/f16; two for f32). Threads are numbered over
// (row, chunk) flat, so rows of any width fill the grid. `pairs_scalar`: one thread per output, any layout.
// Backward, `rows_block`: a block per row (grid-stride over rows), threads stride the row's chunks of 8 pairs
// (vector or element-wise accesses); dprobs = sum y0 dy is a fixed-order block sum: the same bits every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/activation/clipped_swiglu/clipped_swiglu.h"
#include "runtime/error.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::activation {
namespace {

using cuda::load_one;
using cuda::load_vec;
using cuda::store_one;
using cuda::store_vec;

constexpr int kV = 8;
constexpr int kBlock = 256;

// The 8 pairs starting at pair i of the row at xo: vector (aligned, unit stride) or element-wise.
__device__ __forceinline__ void load_pairs(const void* x, int32_t dt, int64_t xo, int64_t xc, int64_t I, int64_t i,
                                           bool interleaved, bool vec, float (&A)[kV], float (&B)[kV]) {
  if (vec) {
    if (interleaved) {
      float v[2 * kV];
      load_vec<2 * kV>(x, dt, xo + 2 * i, v);
#pragma unroll
      for (int e = 0; e < kV; ++e) A[e] = v[2 * e], B[e] = v[2 * e + 1];
    } else {
      load_vec<kV>(x, dt, xo + i, A);
      load_vec<kV>(x, dt, xo + I + i, B);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) {
    A[e] = i + e < I ? load_one(x, dt, xo + csw_gate_col(interleaved, I, i + e) * xc) : 0.f;
    B[e] = i + e < I ? load_one(x, dt, xo + csw_lin_col(interleaved, I, i + e) * xc) : 0.f;
  }
}

__global__ void __launch_bounds__(kBlock) fwd_pairs_vec(const ClippedSwigluFwdParams p) {
  const int64_t cpr = p.I / kV;  // chunks per row
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (tid >= p.rows * cpr) return;
  const int64_t row = tid / cpr, i = (tid - row * cpr) * kV;
  float A[kV], B[kV], y[kV];
  load_pairs(p.x, p.x_dtype, p.x_rows.row_offset(row), 1, p.I, i, p.interleaved, true, A, B);
  const float pr = p.probs ? load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(row)) : 1.f;
#pragma unroll
  for (int e = 0; e < kV; ++e) y[e] = csw_fwd<float>(A[e], B[e], p.alpha, p.limit, p.bias) * pr;
  store_vec<kV>(p.y, p.x_dtype, p.y_rows.row_offset(row) + i, y);
}

__global__ void __launch_bounds__(kBlock) fwd_pairs_scalar(const ClippedSwigluFwdParams p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (tid >= p.rows * p.I) return;
  const int64_t row = tid / p.I, i = tid - row * p.I;
  const int64_t xo = p.x_rows.row_offset(row), xc = p.x_rows.col_stride;
  const float A = load_one(p.x, p.x_dtype, xo + csw_gate_col(p.interleaved, p.I, i) * xc);
  const float B = load_one(p.x, p.x_dtype, xo + csw_lin_col(p.interleaved, p.I, i) * xc);
  const float pr = p.probs ? load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(row)) : 1.f;
  store_one(p.y, p.x_dtype, p.y_rows.row_offset(row) + i * p.y_rows.col_stride,
            csw_fwd<float>(A, B, p.alpha, p.limit, p.bias) * pr);
}

__global__ void __launch_bounds__(kBlock) bwd_rows_block(const ClippedSwigluBwdParams p, bool vec) {
  __shared__ float scratch[32];
  const int64_t nch = (p.I + kV - 1) / kV;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t xo = p.x_rows.row_offset(row), go = p.dy_rows.row_offset(row), dxo = p.dx_rows.row_offset(row);
    const int64_t xc = p.x_rows.col_stride, gc = p.dy_rows.col_stride, dc = p.dx_rows.col_stride;
    const float pr = p.probs ? load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(row)) : 1.f;
    float dp = 0.f;
    for (int64_t ch = threadIdx.x; ch < nch; ch += blockDim.x) {
      const int64_t i = ch * kV;
      float A[kV], B[kV], g[kV], dA[kV], dB[kV];
      load_pairs(p.x, p.x_dtype, xo, xc, p.I, i, p.interleaved, vec, A, B);
      if (vec) {
        load_vec<kV>(p.dy, p.x_dtype, go + i, g);
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) g[e] = i + e < p.I ? load_one(p.dy, p.x_dtype, go + (i + e) * gc) : 0.f;
      }
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float y0 = csw_bwd<float>(A[e], B[e], g[e] * pr, p.alpha, p.limit, p.bias, &dA[e], &dB[e]);
        dp = fmaf(y0, g[e], dp);
      }
      if (vec) {
        if (p.interleaved) {
          float v[2 * kV];
#pragma unroll
          for (int e = 0; e < kV; ++e) v[2 * e] = dA[e], v[2 * e + 1] = dB[e];
          store_vec<2 * kV>(p.dx, p.x_dtype, dxo + 2 * i, v);
        } else {
          store_vec<kV>(p.dx, p.x_dtype, dxo + i, dA);
          store_vec<kV>(p.dx, p.x_dtype, dxo + p.I + i, dB);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          if (i + e >= p.I) break;
          store_one(p.dx, p.x_dtype, dxo + csw_gate_col(p.interleaved, p.I, i + e) * dc, dA[e]);
          store_one(p.dx, p.x_dtype, dxo + csw_lin_col(p.interleaved, p.I, i + e) * dc, dB[e]);
        }
      }
    }
    if (p.dprobs) {
      dp = cuda::block_sum(dp, scratch);
      if (threadIdx.x == 0) store_one(p.dprobs, p.dprobs_dtype, p.dprobs_rows.row_offset(row), dp);
    }
  }
}

bool aligned16(const void* base, int32_t dtype, int64_t off) {
  return (reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(off) * dtype_size(dtype)) % 16 == 0;
}
bool rows_vec_ok(const void* base, int32_t dtype, const RowLayout& l) {
  if (l.col_stride != 1 || !aligned16(base, dtype, l.base)) return false;
  for (int i = 0; i < l.nd; ++i)
    if (l.sizes[i] > 1 && (l.strides[i] * static_cast<int64_t>(dtype_size(dtype))) % 16 != 0) return false;
  return true;
}

}  // namespace

int clipped_swiglu_fwd_cuda(const ClippedSwigluFwdParams& p, void* stream) {
  if (p.rows == 0 || p.I == 0) return STRATA_SUCCESS;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool vec = p.I % kV == 0 && rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.y, p.x_dtype, p.y_rows);
  const int64_t threads = vec ? p.rows * (p.I / kV) : p.rows * p.I;
  const int64_t blocks = (threads + kBlock - 1) / kBlock;
  if (blocks > 0x7fffffffLL)
    return fail(STRATA_ERROR_UNSUPPORTED, "clipped_swiglu_fwd: {} elements exceed one CUDA grid", threads);
  if (vec) {
    fwd_pairs_vec<<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p);
    return cuda::check_launch("clipped_swiglu fwd_pairs_vec");
  }
  fwd_pairs_scalar<<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p);
  return cuda::check_launch("clipped_swiglu fwd_pairs_scalar");
}

int clipped_swiglu_bwd_cuda(const ClippedSwigluBwdParams& p, void* stream) {
  if (p.rows == 0) return STRATA_SUCCESS;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool vec = p.I % kV == 0 && rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.dy, p.x_dtype, p.dy_rows) &&
                   rows_vec_ok(p.dx, p.x_dtype, p.dx_rows);
  // Threads per row: enough for the row's chunks, a multiple of 32 (block_sum), at most kBlock.
  const int64_t nch = (p.I + kV - 1) / kV;
  const int threads = static_cast<int>(std::clamp<int64_t>((nch + 31) / 32 * 32, 32, kBlock));
  const int64_t blocks = std::min<int64_t>(p.rows, int64_t{1} << 30);
  bwd_rows_block<<<static_cast<unsigned>(blocks), threads, 0, s>>>(p, vec);
  return cuda::check_launch("clipped_swiglu bwd_rows_block");
}

}  // namespace strata::activation
