// causal_conv1d on CUDA: the entry points of "cuda.sm90.time_tile" (the general kernels: any layout, W 2-16)
// and the backward workspace size.
// Kernels, launchers and the build layout: cuda_kernels.cuh.
#include "ops/conv/causal_conv1d/cuda_kernels.cuh"

namespace strata::conv {

size_t causal_conv1d_cuda_bwd_workspace(const Conv1dParams& p) {
  const int64_t tiles = p.B * tiles_per_row(p, kBwdTile);
  return static_cast<size_t>(tiles * (p.W + 1) * p.D) * sizeof(float);
}

int causal_conv1d_fwd_cuda(const Conv1dParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  return by_dtype(p.x_dtype, [&](auto t) { return launch_fwd<decltype(t)>(p, stream); });
}

int causal_conv1d_bwd_cuda(const Conv1dParams& p, void* workspace, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  float* partials = static_cast<float*>(workspace);
  return by_dtype(p.x_dtype, [&](auto t) { return launch_bwd<decltype(t)>(p, partials, stream); });
}

}  // namespace strata::conv
