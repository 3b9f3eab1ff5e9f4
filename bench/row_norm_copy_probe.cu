// Device copy kernels for bench/row_norm_cuda_sweep: the ceiling a row-norm forward of the same byte count can
// reach on this machine with SM loads and stores (cudaMemcpyAsync is timed beside them). Same access forms as
// the row-norm kernels: 16-byte loads that bypass L1 with a 256-byte L2 fetch (optionally with an L2
// evict-first policy), 16-byte stores (optionally st.global.cs). A 256-thread block copies U x 256 consecutive
// vectors per step (every load of the step issued before the first store); the grid is one step per block or
// persistent (blocks_per_sm x SMs blocks, balanced steps) walking the steps with a grid stride.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint4 ld16(const void* p, bool ef, uint64_t pol) {
  uint4 v;
  if (ef)
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
  else
    asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}
__device__ __forceinline__ void st16(void* p, const uint4& v, bool cs) {
  if (cs)
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  else
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

template <int U>
__global__ void __launch_bounds__(kThreads) copy16(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                   int64_t nvec, int hints) {
  const bool cs = (hints & 1) != 0, ef = (hints & 2) != 0;
  uint64_t pol = 0;
  if (ef) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  const int64_t per = static_cast<int64_t>(U) * kThreads;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * per; b < nvec; b += static_cast<int64_t>(gridDim.x) * per) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = b + u * kThreads + threadIdx.x;
      if (i < nvec) v[u] = ld16(src + i, ef, pol);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = b + u * kThreads + threadIdx.x;
      if (i < nvec) st16(dst + i, v[u], cs);
    }
  }
}

template <int U>
cudaError_t launch(const void* src, void* dst, int64_t bytes, int blocks_per_sm, int hints, cudaStream_t s) {
  const int64_t nvec = bytes / 16;
  if (nvec == 0) return cudaSuccess;
  const int64_t steps = (nvec + int64_t{U} * kThreads - 1) / (int64_t{U} * kThreads);
  int64_t grid = std::min<int64_t>(steps, 0x7fffffff);
  if (blocks_per_sm > 0) {
    int dev = 0, sms = 0, occ = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, copy16<U>, kThreads, 0);
    const int64_t slots = int64_t{std::max(sms, 1)} * std::max(1, std::min(blocks_per_sm, occ));
    if (grid > slots) grid = (steps + (steps + slots - 1) / slots - 1) / ((steps + slots - 1) / slots);
  }
  copy16<U><<<static_cast<unsigned>(grid), kThreads, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                                             nvec, hints);
  return cudaGetLastError();
}

}  // namespace

// bytes: a multiple of 16, both pointers 16-byte aligned. u: 1, 2, 4 or 8 vectors per thread per step.
int row_norm_copy_probe(const void* src, void* dst, int64_t bytes, int u, int blocks_per_sm, int hints,
                        cudaStream_t s) {
  switch (u) {
    case 1: return launch<1>(src, dst, bytes, blocks_per_sm, hints, s);
    case 2: return launch<2>(src, dst, bytes, blocks_per_sm, hints, s);
    case 4: return launch<4>(src, dst, bytes, blocks_per_sm, hints, s);
    case 8: return launch<8>(src, dst, bytes, blocks_per_sm, hints, s);
    default: return cudaErrorInvalidValue;
  }
}
