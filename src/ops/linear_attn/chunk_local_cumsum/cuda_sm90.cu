// CUDA kernel of chunk_local_cumsum ("cuda.sm90.chunk_scan"). Memory-bound: g is read once and out written
// once; there is one add and one multiply per element.
//
// One thread per (window, lane) pair (windows: chunk_local_cumsum.h). Consecutive threads take consecutive
// lanes of the same window, so with unit lane stride a warp reads and writes whole rows of 32 lanes
// (128 B of f32) per token. A thread scans each chunk its window owns along t in kBatch-token batches:
// all loads of a batch are issued before the sums, which keeps kBatch loads in flight per thread (the
// parallelism the short scalar-gate problems need). The scan is sequential f32 in t order with the scale
// applied after the sum, exactly the CPU kernels' order, and has no atomics or shared memory: the same
// bits every run.
//
// Variable-length packs: each window finds its first sequence by a binary search on cu_seqlens in device
// memory (no host sync); all values are clamped to [0, T] and the walk never leaves [0, T), so invalid
// cu_seqlens cannot cause an out-of-bounds access. The values themselves are validated on the CPU path
// and in the Python layer, which holds the host copy (README.md).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "opbase/dtype.h"
#include "ops/linear_attn/chunk_local_cumsum/chunk_local_cumsum.h"
#include "tile/cuda/check.cuh"

namespace strata::linear_attn {
namespace {

// Measured on the H200 (2026-11-29): 128-thread blocks ran 1-2 % faster than 256 on the large shapes (and
// spread the short scalar-gate grids over more SMs); 64 loads per batch instead of 32 took 128 registers and
// lost 5-10 % on the large shapes.
constexpr int kBlock = 128;
constexpr int kBatch = 32;  // tokens per batch of loads (registers: kBatch floats per thread)

__device__ __forceinline__ float load_f32(const float* p) { return *p; }
__device__ __forceinline__ float load_f32(const bf16_t* p) { return bf16_bits_to_f32(p->bits); }
__device__ __forceinline__ float load_f32(const f16_t* p) { return __half2float(__ushort_as_half(p->bits)); }

__device__ __forceinline__ void store_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f32(bf16_t* p, float v) { p->bits = f32_to_bf16_bits(v); }
__device__ __forceinline__ void store_f32(f16_t* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }

// (q, r) = (i / n, i % n), in 32 bits when both fit (a 64-bit division is a long software routine).
__device__ __forceinline__ void div_mod(int64_t i, int64_t n, int64_t& q, int64_t& r) {
  if (((i | n) >> 31) == 0) {
    q = static_cast<uint32_t>(i) / static_cast<uint32_t>(n);
  } else {
    q = i / n;
  }
  r = i - q * n;
}

// total = num_windows * lanes threads' worth of work, grid-stride so any size fits the grid.
template <class TG, class TO, bool Reverse>
__global__ void __launch_bounds__(kBlock) chunk_scan(const ChunkCumsumParams p, int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const TG* g = static_cast<const TG*>(p.g);
    TO* out = static_cast<TO*>(p.out);
    int64_t w, l;
    div_mod(i, p.lanes, w, l);
    const int64_t gl = p.lanes_contiguous ? l : lane_offset(p.g_strides, p.S, l);
    const int64_t ol = p.lanes_contiguous ? l : lane_offset(p.out_strides, p.S, l);
    // Element offsets walk from the chunk's first token in scan order (backwards for reverse).
    const int64_t gstep = Reverse ? -p.g_strides[1] : p.g_strides[1];
    const int64_t ostep = Reverse ? -p.out_strides[1] : p.out_strides[1];
    for_each_chunk_in_window(p, w, [&](int64_t b, int64_t t0, int64_t t1) {
      const int64_t first = Reverse ? t1 - 1 : t0;
      int64_t go = b * p.g_strides[0] + first * p.g_strides[1] + gl;
      int64_t oo = b * p.out_strides[0] + first * p.out_strides[1] + ol;
      const int len = static_cast<int>(t1 - t0);  // <= chunk_size <= 1024
      float acc = 0.f;
      for (int k0 = 0; k0 < len; k0 += kBatch, go += kBatch * gstep, oo += kBatch * ostep) {
        float v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) v[j] = k0 + j < len ? load_f32(g + go + j * gstep) : 0.f;
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (k0 + j < len) {
            acc += v[j];
            store_f32(out + oo + j * ostep, acc * p.scale);
          }
        }
      }
    });
  }
}

template <class TG, class TO>
void launch_typed(const ChunkCumsumParams& p, int64_t total, unsigned blocks, cudaStream_t stream) {
  if (p.reverse) chunk_scan<TG, TO, true><<<blocks, kBlock, 0, stream>>>(p, total);
  else chunk_scan<TG, TO, false><<<blocks, kBlock, 0, stream>>>(p, total);
}

// Run-time dtype -> storage type (the plan admits f32/bf16/f16 only on CUDA).
template <class Fn>
void visit_half_or_f32(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case STRATA_DTYPE_F32: fn(float{}); break;
    case STRATA_DTYPE_BF16: fn(bf16_t{}); break;
    default: fn(f16_t{}); break;
  }
}

}  // namespace

int chunk_local_cumsum_cuda(const ChunkCumsumParams& p, void* stream_ptr) {
  const int64_t total = num_windows(p) * p.lanes;
  if (total == 0) return STRATA_SUCCESS;
  // Blocks beyond 2^30 would only loop; the grid-stride loop covers the rest.
  const int64_t blocks = cuda::ceil_div(total, kBlock) < (int64_t{1} << 30) ? cuda::ceil_div(total, kBlock)
                                                                           : (int64_t{1} << 30);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  visit_half_or_f32(p.g_dtype, [&](auto tg) {
    visit_half_or_f32(p.out_dtype, [&](auto to) {
      launch_typed<decltype(tg), decltype(to)>(p, total, static_cast<unsigned>(blocks), stream);
    });
  });
  return cuda::check_launch("chunk_local_cumsum (chunk_scan)");
}

}  // namespace strata::linear_attn
