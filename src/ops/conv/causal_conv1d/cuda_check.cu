// causal_conv1d: the run-time check of the cu_seqlens values on the CUDA path (causal_conv1d.h). The offsets live
// on the device; they are copied to the host (N + 1 integers: 8 bytes per sequence, any element stride) and the
// CPU path's check_cu_seqlens_values runs on the copy, so both devices give the same rule and messages.
#include <cuda_runtime.h>

#include <vector>

#include "ops/conv/causal_conv1d/cuda_check.h"
#include "tile/cuda/check.cuh"

namespace strata::conv {

strata_status causal_conv1d_cuda_check_cu_seqlens(const Conv1dParams& p, const char* op, void* stream_ptr) {
  if (p.mode != kModeCuSeqlens) return STRATA_SUCCESS;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  STRATA_CUDA_TRY(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) return STRATA_SUCCESS;  // no synchronisation inside a capture
  const size_t es = p.cu_dtype == STRATA_DTYPE_I64 ? 8 : 4;
  std::vector<int64_t> host(static_cast<size_t>(p.N) + 1);  // int32 values use the first half
  const size_t pitch = p.N == 0 ? es : static_cast<size_t>(p.cus) * es;  // one entry: its stride is unused
  STRATA_CUDA_TRY(cudaMemcpy2DAsync(host.data(), es, p.cu_seqlens, pitch, es, static_cast<size_t>(p.N) + 1,
                                    cudaMemcpyDeviceToHost, stream));
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  Conv1dParams h = p;
  h.cu_seqlens = host.data();
  h.cus = 1;
  return check_cu_seqlens_values(h, op);
}

}  // namespace strata::conv
