// Warp and block reductions for CUDA kernels. The shuffle tree is fixed, so a sum over the same values in
// the same lanes gives the same bits every run (determinism level 1).
#pragma once

#include <cuda_runtime.h>

namespace strata::cuda {

// Sum over groups of `Width` consecutive lanes (Width a power of two <= 32); every lane of a group gets it.
template <int Width = 32>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, Width);
  return v;
}

template <int Width = 32>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, Width));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats of shared memory.
// blockDim.x must be a multiple of 32. Contains __syncthreads(): call from all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = group_sum<32>(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return group_sum<32>(v);
}

}  // namespace strata::cuda

namespace strata::cuda {

// N block sums at once (one pair of __syncthreads for all N); every thread gets the results. `scratch`
// holds N * 32 floats of shared memory; blockDim.x a multiple of 32. Call from all threads. The tree is fixed
// (the same bits every run) and, per value, the same as block_sum's.
template <int N>
__device__ __forceinline__ void block_sum_n(float (&v)[N], float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = group_sum<32>(v[i]);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < N; ++i) scratch[i * 32 + warp] = v[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = group_sum<32>(lane < nwarps ? scratch[i * 32 + lane] : 0.f);
}

}  // namespace strata::cuda
