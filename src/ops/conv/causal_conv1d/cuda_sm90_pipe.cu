// causal_conv1d on CUDA: the entry points of "cuda.sm90.pipe" (16-bit activations staged in shared memory by cp.async).
// Kernels, launchers and the build layout: cuda_kernels.cuh.
#include "ops/conv/causal_conv1d/cuda_kernels.cuh"

namespace strata::conv {

// (The plan takes 16-bit activations only; launch_*_pipe sends f32 to the vec entry points.)
int causal_conv1d_fwd_cuda_pipe(const Conv1dParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  return by_dtype(p.x_dtype, [&](auto t) { return launch_fwd_pipe<decltype(t)>(p, stream); });
}

int causal_conv1d_bwd_cuda_pipe(const Conv1dParams& p, void* workspace, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  float* partials = static_cast<float*>(workspace);
  return by_dtype(p.x_dtype, [&](auto t) { return launch_bwd_pipe<decltype(t)>(p, partials, stream); });
}

}  // namespace strata::conv
