// CUDA launch and error-check helpers: every runtime call and every launch is checked, and a failure becomes
// a strata_status with the CUDA error text in the last-error message.
#pragma once

#include <cuda_runtime.h>

#include "runtime/error.h"

namespace strata::cuda {

inline strata_status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_RUNTIME, "{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

// Call right after a <<<...>>> launch: reports configuration errors (and earlier sticky errors).
inline strata_status check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_LAUNCH_FAILED, "launch of {} failed: {} ({})", kernel, cudaGetErrorString(e),
              cudaGetErrorName(e));
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Resident blocks per SM of `kernel` launched with `block` threads and no dynamic shared memory, for one-wave
// persistent grids (1 if the query fails; the error is cleared, it is not sticky, so that the next
// check_launch does not report it).
template <class Kern>
inline int occupancy_blocks_per_sm(Kern kernel, int block) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block, 0) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    n = 1;
  }
  return n;
}

// Multiprocessors of the current device (132, the H200's, if the query fails; the error is cleared).
inline int current_sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      n < 1) {
    (void)cudaGetLastError();
    return 132;
  }
  return n;
}

}  // namespace strata::cuda

#define STRATA_CUDA_TRY(expr) STRATA_RETURN_IF_ERROR(::strata::cuda::check((expr), #expr))
