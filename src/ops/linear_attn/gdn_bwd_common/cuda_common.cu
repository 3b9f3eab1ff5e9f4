// Host launchers and kernels of cuda_common.cuh: the chunk-offset scan and the GVA head reduction.
#include "ops/linear_attn/gdn_bwd_common/cuda_common.cuh"

#include <algorithm>

namespace strata::linear_attn::gdn_bwd::cu {
namespace {

constexpr int kScanThreads = 1024;

// ceil(L_n / BT), 0 for empty (or, with invalid cu_seqlens, negative-length) sequences.
__device__ __forceinline__ int64_t chunks_of(const Dims& d, int64_t n) {
  const int64_t len = d.cu_at(n + 1) - d.cu_at(n);
  return len > 0 ? (len + d.BT - 1) / d.BT : 0;
}

// One block: thread i sums the chunk counts of its contiguous segment of sequences, thread 0 scans the 1024
// partial sums, then every thread writes its segment's prefix sums.
__global__ void __launch_bounds__(kScanThreads) chunk_offsets_kernel(Dims d, int64_t* offs) {
  __shared__ int64_t part[kScanThreads];
  const int64_t seg = (d.N + kScanThreads - 1) / kScanThreads;
  const int64_t n0 = threadIdx.x * seg, n1 = n0 + seg < d.N ? n0 + seg : d.N;
  int64_t s = 0;
  for (int64_t n = n0; n < n1; ++n) s += chunks_of(d, n);
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t acc = 0;
    for (int i = 0; i < kScanThreads; ++i) {
      const int64_t x = part[i];
      part[i] = acc;
      acc += x;
    }
    offs[d.N] = acc;
  }
  __syncthreads();
  int64_t acc = part[threadIdx.x];
  for (int64_t n = n0; n < n1; ++n) {
    offs[n] = acc;
    acc += chunks_of(d, n);
  }
}

__global__ void __launch_bounds__(kThreads) reduce_heads_kernel(const float* __restrict__ ws, Dims d, View out,
                                                                 int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    // i = ((row * H) + h) * K + x over rows = B * T tokens.
    const int64_t x = i % d.K, h = i / d.K % d.H, row = i / (d.K * d.H);
    const int64_t b = row / d.T, t = row - b * d.T;
    const float* src = ws + ((row * d.HV) + h * d.G) * d.K + x;
    float s = 0.f;
    for (int64_t g = 0; g < d.G; ++g) s += src[g * d.K];
    st_f32(out, out.off(b, t, h) + x, s);
  }
}

__global__ void __launch_bounds__(kThreads) reduce_tiles_kernel(const float* __restrict__ part, int64_t tiles, Dims d,
                                                                 View out) {
  const int64_t total = d.B * d.T * d.HV;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float s = 0.f;
    for (int64_t t = 0; t < tiles; ++t) s += part[t * total + i];
    const int64_t hv = i % d.HV, tok = i / d.HV % d.T, b = i / (d.HV * d.T);
    st_f32(out, out.off(b, tok, hv), s);
  }
}

}  // namespace

strata_status launch_reduce_tiles(const float* part, int64_t tiles, const Dims& d, const View& out,
                                  cudaStream_t stream) {
  const int64_t total = d.B * d.T * d.HV;
  if (total == 0) return STRATA_SUCCESS;
  const int64_t blocks = std::min<int64_t>(cuda::ceil_div(total, kThreads), int64_t{1} << 20);
  reduce_tiles_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(part, tiles, d, out);
  return cuda::check_launch("gdn_bwd reduce_tiles");
}

strata_status launch_chunk_offsets(const Dims& d, int64_t* offs, cudaStream_t stream) {
  if (!d.varlen()) return STRATA_SUCCESS;
  chunk_offsets_kernel<<<1, kScanThreads, 0, stream>>>(d, offs);
  return cuda::check_launch("gdn_bwd chunk_offsets");
}

strata_status launch_reduce_heads(const float* ws, const Dims& d, const View& out, cudaStream_t stream) {
  const int64_t total = d.B * d.T * d.H * d.K;
  if (total == 0) return STRATA_SUCCESS;
  const int64_t blocks = std::min<int64_t>(cuda::ceil_div(total, kThreads), int64_t{1} << 20);
  reduce_heads_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(ws, d, out, total);
  return cuda::check_launch("gdn_bwd reduce_heads");
}

}  // namespace strata::linear_attn::gdn_bwd::cu
