// Device-side chunk offsets of a variable-length pack (gdn_common.h): offsets[n] = sum over m < n of
// ceil(L_m / BT), offsets[N] = total chunks, computed from device cu_seqlens by one block (no host sync).
// The block scans N in tiles of kThreads sequences: each thread counts one sequence's chunks, a shared-memory
// Hillis-Steele scan turns the tile into prefix sums, and a running carry joins the tiles. Integer math:
// exact and deterministic.
#include <cuda_runtime.h>

#include "ops/linear_attn/gdn_common/gdn_common.h"
#include "tile/cuda/check.cuh"

namespace strata::linear_attn::gdn {
namespace {

constexpr int kThreads = 1024;

__global__ void __launch_bounds__(kThreads) chunk_offsets_kernel(const GdnChunks m, int64_t* offsets) {
  __shared__ int64_t buf[kThreads];
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < m.N; base += kThreads) {
    const int64_t n = base + threadIdx.x;
    int64_t cnt = 0;
    if (n < m.N) {
      const int64_t bos = cu_at(m, n), eos = cu_at(m, n + 1);
      cnt = eos > bos ? cdiv(eos - bos, m.BT) : 0;
    }
    buf[threadIdx.x] = cnt;
    __syncthreads();
    for (int d = 1; d < kThreads; d <<= 1) {
      const int64_t add = threadIdx.x >= d ? buf[threadIdx.x - d] : 0;
      __syncthreads();
      buf[threadIdx.x] += add;
      __syncthreads();
    }
    // buf = inclusive prefix sums of the tile
    if (n < m.N) offsets[n] = carry + buf[threadIdx.x] - cnt;
    __syncthreads();
    if (threadIdx.x == kThreads - 1) carry += buf[kThreads - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[m.N] = carry;
}

}  // namespace

int gdn_chunk_offsets_cuda(const GdnChunks& m, int64_t* offsets, void* stream) {
  if (!m.varlen()) return STRATA_SUCCESS;
  chunk_offsets_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(m, offsets);
  return cuda::check_launch("gdn_chunk_offsets");
}

}  // namespace strata::linear_attn::gdn
