// The target count of the CUDA losses (cuda_targets.h): one block, integer counts (exact in any order, so the
// same verdict every run), the first bad row by an integer atomicMin.
#include "ops/loss/common/cuda_targets.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "opbase/dtype.h"
#include "tile/cuda/check.cuh"

namespace strata::loss {
namespace {

__global__ void __launch_bounds__(1024) count_targets_kernel(const void* target, bool i64, int64_t stride, int64_t n,
                                                             int64_t V, int64_t ignore, int64_t* scratch) {
  unsigned long long valid = 0, bad = 0;
  long long first = INT64_MAX;
#pragma unroll 8  // independent loads in flight together (N = 8192: 8 per thread)
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t y = i64 ? static_cast<const int64_t*>(target)[i * stride]
                          : static_cast<int64_t>(static_cast<const int32_t*>(target)[i * stride]);
    const bool v = y != ignore;
    const bool b = v && (y < 0 || y >= V);
    valid += v;
    bad += b;
    if (b && i < first) first = i;
  }
  // A warp sum / minimum first, so that 32 (not 1024) atomics meet on the shared totals.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    valid += __shfl_xor_sync(0xffffffffu, valid, o);
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
    const long long f = __shfl_xor_sync(0xffffffffu, first, o);
    first = f < first ? f : first;
  }
  __shared__ unsigned long long total, total_bad;
  __shared__ long long first_bad;
  if (threadIdx.x == 0) total = 0, total_bad = 0, first_bad = INT64_MAX;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) atomicAdd(&total, valid), atomicAdd(&total_bad, bad), atomicMin(&first_bad, first);
  __syncthreads();
  if (threadIdx.x == 0) {
    scratch[0] = static_cast<int64_t>(total);
    scratch[1] = static_cast<int64_t>(total_bad);
    scratch[2] = first_bad;
  }
}

// 32 bytes of pinned host memory per calling host thread, allocated on its first call and kept for the process
// (each call is synchronous on its thread, so one slot per thread is never shared by two calls in flight).
strata_status pinned_slot(int64_t** slot) {
  thread_local int64_t* p = nullptr;
  if (!p) STRATA_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&p), kTargetScratchBytes, cudaHostAllocPortable));
  *slot = p;
  return STRATA_SUCCESS;
}

}  // namespace

strata_status cuda_count_targets(const void* target, int32_t target_dtype, int64_t stride, int64_t n, int64_t V,
                                 int64_t ignore_index, int64_t* scratch, void* stream_ptr, TargetCounts* out) {
  *out = TargetCounts{};
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  // Launched for n = 0 too: the zero counts are what a mean over no rows divides by (on the device).
  count_targets_kernel<<<1, 1024, 0, stream>>>(target, target_dtype == STRATA_DTYPE_I64, stride, n, V, ignore_index,
                                               scratch);
  STRATA_RETURN_IF_ERROR(cuda::check_launch("count_targets (loss target check)"));
  if (n == 0) return STRATA_SUCCESS;  // nothing can be bad: no read-back
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  STRATA_CUDA_TRY(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) {
    out->captured = true;  // no synchronisation inside a capture
    return STRATA_SUCCESS;
  }
  int64_t* host = nullptr;
  STRATA_RETURN_IF_ERROR(pinned_slot(&host));
  STRATA_CUDA_TRY(cudaMemcpyAsync(host, scratch, 3 * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  out->valid = host[0];
  out->bad = host[1];
  if (out->bad == 0) return STRATA_SUCCESS;
  out->first_bad = host[2];
  // Error path only: the bad row's value, for the message.
  const size_t es = target_dtype == STRATA_DTYPE_I64 ? 8 : 4;
  const char* src = static_cast<const char*>(target) + out->first_bad * stride * static_cast<int64_t>(es);
  int64_t v64 = 0;
  int32_t v32 = 0;
  STRATA_CUDA_TRY(cudaMemcpy(es == 8 ? static_cast<void*>(&v64) : static_cast<void*>(&v32), src, es,
                             cudaMemcpyDeviceToHost));
  out->first_value = es == 8 ? v64 : v32;
  return STRATA_SUCCESS;
}

}  // namespace strata::loss
