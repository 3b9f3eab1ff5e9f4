// Bulk global -> shared copies by the copy engine (cp.async.bulk, sm_90) completing on an mbarrier, for
// streaming kernels that keep a ring of shared-memory stages in flight: no registers are held by loads in
// flight, so a CTA can have tens of KiB outstanding while its threads compute on an earlier stage.
//
// Protocol of one stage (one mbarrier initialised with an arrival count of 1):
//   issuing thread: fence_proxy_async() (orders earlier generic reads of the stage before the async write),
//                   mbar_arrive_expect_tx(bar, total bytes of the stage), then bulk_g2s(...) per piece;
//   every thread:   mbar_wait(bar, parity) with parity = (number of earlier completions of bar) & 1.
// A bulk copy needs 16-byte aligned global and shared addresses and a size that is a multiple of 16; the
// bytes of one phase must stay below 2^20. Every issued copy must be waited for before the CTA exits.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "runtime/error.h"
#include "tile/cuda/check.cuh"

namespace strata::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread, before a __syncthreads that precedes any use of the barrier.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Generic-proxy accesses of shared memory by this thread (and, after a __syncthreads, by the CTA) ordered
// before later async-proxy (bulk copy) writes.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The issuing thread's arrival on `bar`, announcing `bytes` of copies that complete on it in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Copies `bytes` (a multiple of 16) from global `src` to shared `dst`; completes `bytes` of `bar`'s tx count.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n"
      "selp.u32 %0, 1, 0, P1;\n"
      "}\n"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// Waits until the phase of `bar` with the given parity has completed (its copies' bytes are visible).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// L2 policy "evict first" (for data touched once), for the *_hint copies below.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// bulk_g2s with an L2 cache policy (l2_evict_first()).
__device__ __forceinline__ void bulk_g2s_hint(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
      : "memory");
}

// Bulk shared -> global copies (bulk groups). Protocol: every thread that wrote the shared source runs
// fence_proxy_async() (its generic writes ordered before the async read), then a __syncthreads; one thread
// issues bulk_s2g(...) per piece and bulk_commit(); before the source is overwritten or the CTA exits, that
// thread runs bulk_wait_read() (the copy engine has read the source; the global writes complete on their own
// and are visible to later kernels).
__device__ __forceinline__ void bulk_s2g(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_s2g_hint(void* dst, const void* src, uint32_t bytes, uint64_t pol) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(dst),
               "r"(smem_u32(src)), "r"(bytes), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until every committed bulk group of this thread has finished reading its shared-memory source.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// 16-byte shared-memory load (the stage data after mbar_wait).
__device__ __forceinline__ uint4 lds16(const void* p) { return *static_cast<const uint4*>(p); }

// 16-byte global store with the streaming (evict-first) hint: outputs are not read again by this kernel.
__device__ __forceinline__ void st_stream16(void* p, const uint4& v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Host: resident CTAs per SM of a ring kernel with `block` threads and `smem` bytes of dynamic shared memory.
// The kernel is opted into `smem_cap` >= smem bytes (one fixed value per kernel, so host threads launching it
// with different smem never undo each other's opt-in). The two runtime calls cost microseconds, so the answer
// is cached per (device, smem) in `cache` (one per kernel instance; a race only repeats the calls). *occ >= 1.
struct RingLaunchCache {
  std::atomic<uint64_t> key{0};  // device + 1 in bits 40.., smem in bits 8..39, occupancy in bits 0..7
};
template <class Kern>
strata_status ring_occupancy(Kern kernel, int block, size_t smem, size_t smem_cap, RingLaunchCache& cache, int* occ) {
  if (smem > smem_cap) return fail(STRATA_ERROR_INTERNAL, "ring kernel: {} bytes of shared memory exceed its cap {}", smem, smem_cap);
  int dev = 0;
  STRATA_RETURN_IF_ERROR(check(cudaGetDevice(&dev), "cudaGetDevice"));
  const uint64_t want = (static_cast<uint64_t>(dev + 1) << 40) | (static_cast<uint64_t>(smem) << 8);
  const uint64_t have = cache.key.load(std::memory_order_relaxed);
  if ((have & ~uint64_t{0xff}) == want) {
    *occ = static_cast<int>(have & 0xff);
    return STRATA_SUCCESS;
  }
  STRATA_RETURN_IF_ERROR(check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(smem_cap)),
                               "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)"));
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block, smem) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    n = 1;
  }
  n = n > 255 ? 255 : n;
  cache.key.store(want | static_cast<uint64_t>(n), std::memory_order_relaxed);
  *occ = n;
  return STRATA_SUCCESS;
}

}  // namespace strata::cuda
