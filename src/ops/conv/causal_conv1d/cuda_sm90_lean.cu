// causal_conv1d on CUDA: the entry points of "cuda.sm90.lean" (the staged backward for batch rows and cu_seqlens packs).
// Kernels, launchers and the build layout: cuda_kernels.cuh.
#include "ops/conv/causal_conv1d/cuda_kernels.cuh"

namespace strata::conv {

int causal_conv1d_bwd_cuda_lean(const Conv1dParams& p, void* workspace, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  float* partials = static_cast<float*>(workspace);
  return by_dtype(p.x_dtype, [&](auto t) { return launch_bwd_lean<decltype(t)>(p, partials, stream); });
}

}  // namespace strata::conv
