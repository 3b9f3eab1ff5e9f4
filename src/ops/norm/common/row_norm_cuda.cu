// CUDA kernels of the row norms (row_norm.h). Memory-bound: each input is read once and each output written
// once, with 16-byte accesses where the layout allows.
//
// Rows are cut into chunks of 16 elements (32 B of bf16/f16, 64 B of f32: two or four 16-byte accesses in
// flight per thread per chunk). Three shapes of kernel:
//   rows_in_group<TPR, NV>: a group of TPR lanes (TPR <= 32) holds one row in registers, NV chunks per lane;
//                           several rows per warp for short rows. D <= 32 * 4 * 16 = 2048.
//   rows_in_block<NV>:      one 256-thread block per row, NV chunks per thread in registers. D <= 16384.
//   rows_looped:            one block per row, two passes over global memory (the second mostly from L2),
//                           any D, any stride or alignment (element-wise accesses).
// dtypes are read at run time inside the kernels (uniform branches), which keeps the number of template
// instances small; arithmetic is f32, and bf16/f16 results are rounded by the hardware's paired conversions
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32: nearest even, like the CPU). Sums use a fixed shuffle tree: same
// bits run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "opbase/dtype.h"
#include "ops/norm/common/row_norm.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/reduce.cuh"

namespace strata::norm {
namespace {

constexpr int kChunk = 16;
constexpr int kBlock = 256;

__device__ __forceinline__ void load_chunk(const void* base, int32_t dtype, int64_t i, float (&v)[kChunk]) {
  if (dtype == STRATA_DTYPE_F32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
#pragma unroll
    for (int k = 0; k < kChunk / 4; ++k) {
      const float4 a = p[k];
      v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
    }
    return;
  }
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i);
#pragma unroll
  for (int q = 0; q < kChunk / 8; ++q) {
    const uint4 u = p[q];
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float* o = v + 8 * q + 2 * k;
      if (dtype == STRATA_DTYPE_BF16) {
        o[0] = __uint_as_float(w[k] << 16), o[1] = __uint_as_float(w[k] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
        o[0] = f.x, o[1] = f.y;
      }
    }
  }
}

// Two floats rounded to nearest even into one 32-bit word of bf16 or f16 (low half = first element).
__device__ __forceinline__ uint32_t pack_half2(int32_t dtype, float a, float b) {
  if (dtype == STRATA_DTYPE_BF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint16_t to_half_bits(int32_t dtype, float x) {
  return static_cast<uint16_t>(pack_half2(dtype, x, 0.f) & 0xffffu);
}

__device__ __forceinline__ void store_chunk(void* base, int32_t dtype, int64_t i, const float (&v)[kChunk]) {
  if (dtype == STRATA_DTYPE_F32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(base) + i);
#pragma unroll
    for (int k = 0; k < kChunk / 4; ++k) p[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    return;
  }
  uint4* p = reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + i);
#pragma unroll
  for (int q = 0; q < kChunk / 8; ++q) {
    const float* f = v + 8 * q;
    p[q] = make_uint4(pack_half2(dtype, f[0], f[1]), pack_half2(dtype, f[2], f[3]), pack_half2(dtype, f[4], f[5]),
                      pack_half2(dtype, f[6], f[7]));
  }
}

__device__ __forceinline__ float load_one(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case STRATA_DTYPE_F32: return static_cast<const float*>(base)[i];
    case STRATA_DTYPE_BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(base)[i]));
  }
}
__device__ __forceinline__ void store_one(void* base, int32_t dtype, int64_t i, float v) {
  if (dtype == STRATA_DTYPE_F32)
    static_cast<float*>(base)[i] = v;
  else
    static_cast<uint16_t*>(base)[i] = to_half_bits(dtype, v);
}

// ------------------------------------------------------------------------------------------------------
// Forward. Each kernel: sum of squares -> rstd -> (optional) y = x * rstd.

template <int TPR, int NV>
__global__ void __launch_bounds__(kBlock) fwd_rows_in_group(const RowNormFwdParams p) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) / TPR;
  const int t = threadIdx.x % TPR;
  // Lanes past the last row stay for the shuffles (full-warp masks) but touch no memory.
  const bool live = row < p.rows;
  const int64_t xo = live ? p.x_rows.row_offset(row) : 0;
  float v[NV][kChunk];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (t + k * TPR) * kChunk;
    if (live && c < p.D) {
      load_chunk(p.x, p.x_dtype, xo + c, v[k]);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) ss = fmaf(v[k][e], v[k][e], ss);
    }
  }
  ss = cuda::group_sum<TPR>(ss);
  if (!live) return;
  const float rstd = rsqrtf(ss / static_cast<float>(p.n_div) + p.eps);
  if (t == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row), rstd);
  if (!p.y) return;
  const int64_t yo = p.y_rows.row_offset(row);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (t + k * TPR) * kChunk;
    if (c < p.D) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[k][e] *= rstd;
      store_chunk(p.y, p.y_dtype, yo + c, v[k]);
    }
  }
}

template <int NV>
__global__ void __launch_bounds__(kBlock) fwd_rows_in_block(const RowNormFwdParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t xo = p.x_rows.row_offset(row);
  float v[NV][kChunk];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (threadIdx.x + k * kBlock) * kChunk;
    if (c < p.D) {
      load_chunk(p.x, p.x_dtype, xo + c, v[k]);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) ss = fmaf(v[k][e], v[k][e], ss);
    }
  }
  ss = cuda::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(p.n_div) + p.eps);
  if (threadIdx.x == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row), rstd);
  if (!p.y) return;
  const int64_t yo = p.y_rows.row_offset(row);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (threadIdx.x + k * kBlock) * kChunk;
    if (c < p.D) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[k][e] *= rstd;
      store_chunk(p.y, p.y_dtype, yo + c, v[k]);
    }
  }
}

__global__ void __launch_bounds__(kBlock) fwd_rows_looped(const RowNormFwdParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t xo = p.x_rows.row_offset(row), cs = p.x_rows.col_stride;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < p.D; j += kBlock) {
    const float v = load_one(p.x, p.x_dtype, xo + j * cs);
    ss = fmaf(v, v, ss);
  }
  ss = cuda::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(p.n_div) + p.eps);
  if (threadIdx.x == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row), rstd);
  if (!p.y) return;
  const int64_t yo = p.y_rows.row_offset(row), ycs = p.y_rows.col_stride;
  for (int64_t j = threadIdx.x; j < p.D; j += kBlock)
    store_one(p.y, p.y_dtype, yo + j * ycs, load_one(p.x, p.x_dtype, xo + j * cs) * rstd);
}

// ------------------------------------------------------------------------------------------------------
// Backward: c = dot(dout, src) scaled per kind; dx = rstd * (dout - c * src) (kFactor: dx = src * k).

struct BwdCoef {
  float rstd, c, k;
};
__device__ __forceinline__ BwdCoef bwd_coef(const RowNormBwdParams& p, int64_t row, float dot, float dr) {
  const float rstd = load_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row));
  const float inv_n = 1.f / static_cast<float>(p.n_div);
  BwdCoef b{rstd, 0.f, 0.f};
  if (p.kind == RowNormBwdKind::kFactor) b.k = -dr * rstd * rstd * rstd * inv_n;
  else if (p.kind == RowNormBwdKind::kNormalizedSrc) b.c = dot * inv_n;
  else b.c = dot * rstd * rstd * inv_n;
  return b;
}
__device__ __forceinline__ float bwd_value(const RowNormBwdParams& p, const BwdCoef& b, float src, float g) {
  return p.kind == RowNormBwdKind::kFactor ? src * b.k : b.rstd * (g - b.c * src);
}

template <int TPR, int NV>
__global__ void __launch_bounds__(kBlock) bwd_rows_in_group(const RowNormBwdParams p) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) / TPR;
  const int t = threadIdx.x % TPR;
  const bool live = row < p.rows;
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  const int64_t so = live ? p.src_rows.row_offset(row) : 0, go = live ? p.dout_rows.row_offset(row) : 0;
  float s[NV][kChunk], g[NV][kChunk];
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (t + k * TPR) * kChunk;
    if (live && c < p.D) {
      load_chunk(p.src, p.src_dtype, so + c, s[k]);
      if (!factor) {
        load_chunk(p.dout, p.dout_dtype, go + c, g[k]);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) dot = fmaf(g[k][e], s[k][e], dot);
      }
    }
  }
  dot = cuda::group_sum<TPR>(dot);
  if (!live) return;
  const BwdCoef b = bwd_coef(p, row, dot, factor ? load_one(p.dout, p.dout_dtype, go) : 0.f);
  const int64_t xo = p.dx_rows.row_offset(row);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (t + k * TPR) * kChunk;
    if (c < p.D) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) s[k][e] = bwd_value(p, b, s[k][e], factor ? 0.f : g[k][e]);
      store_chunk(p.dx, p.dx_dtype, xo + c, s[k]);
    }
  }
}

template <int NV>
__global__ void __launch_bounds__(kBlock) bwd_rows_in_block(const RowNormBwdParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  const int64_t so = p.src_rows.row_offset(row), go = p.dout_rows.row_offset(row);
  float s[NV][kChunk], g[NV][kChunk];
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (threadIdx.x + k * kBlock) * kChunk;
    if (c < p.D) {
      load_chunk(p.src, p.src_dtype, so + c, s[k]);
      if (!factor) {
        load_chunk(p.dout, p.dout_dtype, go + c, g[k]);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) dot = fmaf(g[k][e], s[k][e], dot);
      }
    }
  }
  dot = cuda::block_sum(dot, scratch);
  const BwdCoef b = bwd_coef(p, row, dot, factor ? load_one(p.dout, p.dout_dtype, go) : 0.f);
  const int64_t xo = p.dx_rows.row_offset(row);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t c = (threadIdx.x + k * kBlock) * kChunk;
    if (c < p.D) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) s[k][e] = bwd_value(p, b, s[k][e], factor ? 0.f : g[k][e]);
      store_chunk(p.dx, p.dx_dtype, xo + c, s[k]);
    }
  }
}

__global__ void __launch_bounds__(kBlock) bwd_rows_looped(const RowNormBwdParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  const int64_t so = p.src_rows.row_offset(row), go = p.dout_rows.row_offset(row), xo = p.dx_rows.row_offset(row);
  const int64_t scs = p.src_rows.col_stride, gcs = p.dout_rows.col_stride, xcs = p.dx_rows.col_stride;
  float dot = 0.f;
  if (!factor)
    for (int64_t j = threadIdx.x; j < p.D; j += kBlock)
      dot = fmaf(load_one(p.dout, p.dout_dtype, go + j * gcs), load_one(p.src, p.src_dtype, so + j * scs), dot);
  dot = cuda::block_sum(dot, scratch);
  const BwdCoef b = bwd_coef(p, row, dot, factor ? load_one(p.dout, p.dout_dtype, go) : 0.f);
  for (int64_t j = threadIdx.x; j < p.D; j += kBlock) {
    const float g = factor ? 0.f : load_one(p.dout, p.dout_dtype, go + j * gcs);
    store_one(p.dx, p.dx_dtype, xo + j * xcs, bwd_value(p, b, load_one(p.src, p.src_dtype, so + j * scs), g));
  }
}

// ------------------------------------------------------------------------------------------------------
// Host side: pick the kernel shape.

// Whether a row tensor allows 16-byte chunk accesses: unit column stride, every row start a multiple of
// kChunk elements, base pointer 16-byte aligned.
bool chunkable(const void* ptr, const RowLayout& l) {
  if (l.col_stride != 1 || l.base % kChunk != 0) return false;
  for (int i = 0; i < l.nd; ++i)
    if (l.strides[i] % kChunk != 0 && l.sizes[i] > 1) return false;
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <class Params, class GroupK, class BlockK, class LoopK>
strata_status launch(const Params& p, cudaStream_t stream, bool vec, GroupK group_kernel, BlockK block_kernel,
                     LoopK loop_kernel, const char* name) {
  const int64_t chunks = (p.D + kChunk - 1) / kChunk;
  if (vec && chunks <= 32 * 4) {
    int tpr = 1;
    while (tpr < chunks && tpr < 32) tpr *= 2;
    const int nv = static_cast<int>((chunks + tpr - 1) / tpr);  // 1..4 (only above 1 when tpr == 32)
    const int64_t blocks = cuda::ceil_div(p.rows * tpr, kBlock);
    group_kernel(tpr, nv == 3 ? 4 : nv, static_cast<unsigned>(blocks), stream);
  } else if (vec && chunks <= kBlock * 4) {
    const int nv = static_cast<int>((chunks + kBlock - 1) / kBlock);
    block_kernel(nv <= 1 ? 1 : nv <= 2 ? 2 : 4, static_cast<unsigned>(p.rows), stream);
  } else {
    loop_kernel(static_cast<unsigned>(p.rows), stream);
  }
  return cuda::check_launch(name);
}

}  // namespace

int row_norm_fwd_cuda(const RowNormFwdParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool vec = p.D % kChunk == 0 && chunkable(p.x, p.x_rows) && (!p.y || chunkable(p.y, p.y_rows));
  return launch(
      p, stream, vec,
      [&](int tpr, int nv, unsigned blocks, cudaStream_t s) {
#define STRATA_FWD_GROUP(T, V) fwd_rows_in_group<T, V><<<blocks, kBlock, 0, s>>>(p)
        switch (tpr) {
          case 1: STRATA_FWD_GROUP(1, 1); break;
          case 2: STRATA_FWD_GROUP(2, 1); break;
          case 4: STRATA_FWD_GROUP(4, 1); break;
          case 8: STRATA_FWD_GROUP(8, 1); break;
          case 16: STRATA_FWD_GROUP(16, 1); break;
          default:
            if (nv == 1) STRATA_FWD_GROUP(32, 1);
            else if (nv == 2) STRATA_FWD_GROUP(32, 2);
            else STRATA_FWD_GROUP(32, 4);
        }
#undef STRATA_FWD_GROUP
      },
      [&](int nv, unsigned blocks, cudaStream_t s) {
        switch (nv) {
          case 1: fwd_rows_in_block<1><<<blocks, kBlock, 0, s>>>(p); break;
          case 2: fwd_rows_in_block<2><<<blocks, kBlock, 0, s>>>(p); break;
          default: fwd_rows_in_block<4><<<blocks, kBlock, 0, s>>>(p); break;
        }
      },
      [&](unsigned blocks, cudaStream_t s) { fwd_rows_looped<<<blocks, kBlock, 0, s>>>(p); }, "row_norm_fwd");
}

int row_norm_bwd_cuda(const RowNormBwdParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  const bool vec = p.D % kChunk == 0 && chunkable(p.src, p.src_rows) && chunkable(p.dx, p.dx_rows) &&
                   (factor || chunkable(p.dout, p.dout_rows));
  return launch(
      p, stream, vec,
      [&](int tpr, int nv, unsigned blocks, cudaStream_t s) {
#define STRATA_BWD_GROUP(T, V) bwd_rows_in_group<T, V><<<blocks, kBlock, 0, s>>>(p)
        switch (tpr) {
          case 1: STRATA_BWD_GROUP(1, 1); break;
          case 2: STRATA_BWD_GROUP(2, 1); break;
          case 4: STRATA_BWD_GROUP(4, 1); break;
          case 8: STRATA_BWD_GROUP(8, 1); break;
          case 16: STRATA_BWD_GROUP(16, 1); break;
          default:
            if (nv == 1) STRATA_BWD_GROUP(32, 1);
            else if (nv == 2) STRATA_BWD_GROUP(32, 2);
            else STRATA_BWD_GROUP(32, 4);
        }
#undef STRATA_BWD_GROUP
      },
      [&](int nv, unsigned blocks, cudaStream_t s) {
        switch (nv) {
          case 1: bwd_rows_in_block<1><<<blocks, kBlock, 0, s>>>(p); break;
          case 2: bwd_rows_in_block<2><<<blocks, kBlock, 0, s>>>(p); break;
          default: bwd_rows_in_block<4><<<blocks, kBlock, 0, s>>>(p); break;
        }
      },
      [&](unsigned blocks, cudaStream_t s) { bwd_rows_looped<<<blocks, kBlock, 0, s>>>(p); }, "row_norm_bwd");
}

}  // namespace strata::norm
