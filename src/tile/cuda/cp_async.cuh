// Asynchronous global -> shared copies (cp.async, sm_80+) for software-pipelined tile loads: issue the copies
// of the next tile, commit them as a group, compute on the current tile, then wait for all but the newest
// `kPending` groups and __syncthreads() before reading the copied tile. 16-byte copies need 16-byte aligned
// source and destination addresses; the zero-fill form writes zeros for the bytes past `src_bytes`
// (tails: rows past a chunk end, columns past K or V) without reading them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

// Copies 16 bytes from global `src` to shared `dst`, or writes 16 zero bytes (src not read) when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}

// The same at shared-memory byte address `dst` (a __cvta_generic_to_shared value, e.g. a wgmma tile's slot).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace strata::cuda
