// causal_conv1d on CUDA: the entry points of "cuda.sm90.vec" (register-streaming kernels, W 2-4, unit channel stride).
// Kernels, launchers and the build layout: cuda_kernels.cuh.
#include "ops/conv/causal_conv1d/cuda_kernels.cuh"

namespace strata::conv {

int causal_conv1d_fwd_cuda_vec(const Conv1dParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  return by_dtype(p.x_dtype, [&](auto t) { return launch_fwd_vec<decltype(t)>(p, stream); });
}

int causal_conv1d_bwd_cuda_vec(const Conv1dParams& p, void* workspace, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  float* partials = static_cast<float*>(workspace);
  return by_dtype(p.x_dtype, [&](auto t) { return launch_bwd_vec<decltype(t)>(p, partials, stream); });
}

}  // namespace strata::conv
