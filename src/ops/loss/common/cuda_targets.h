// Target check of the CUDA losses (fused_cross_entropy, chunk_loss): a target must be ignore_index or in [0, V),
// and a bad one must fail the call before anything is written (ARCHITECTURE.md §3: bad input, clear error). The
// targets live on the device, so the check is one small kernel (cuda_targets.cu: one block of 1024 threads, a
// warp sum then 32 shared atomics; N = 8192 targets: 8 loads per thread) that writes into a 32-byte device scratch
//   scratch[0] = #targets != ignore_index (the count a mean divides by; kernels may read it on the device)
//   scratch[1] = #bad targets (outside [0, V), not ignore_index)
//   scratch[2] = the first bad row (INT64_MAX when none)
// and a read-back of those 24 bytes into pinned host memory with one stream synchronisation, before the caller
// launches anything that writes. While the stream is being captured into a CUDA graph no synchronisation is
// allowed: the kernel still runs (its counts stay usable on the device) and `captured` tells the caller that the
// verdict is unknown on the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/error.h"

namespace strata::loss {

inline constexpr size_t kTargetScratchBytes = 32;  // 4 x int64 (the last one padding), 16-byte aligned

struct TargetCounts {
  int64_t valid = 0;        // targets != ignore_index
  int64_t bad = 0;          // of those, outside [0, V)
  int64_t first_bad = -1;   // the first bad row (-1 when none)
  int64_t first_value = 0;  // its target value (read only when bad > 0)
  bool captured = false;    // the stream is being captured: nothing was read back (the fields above are 0 / -1)
};

#if STRATA_WITH_CUDA
// Counts targets [n] (int64 or int32, element stride `stride`) on `stream` into `scratch` (device, 32 bytes,
// 8-byte aligned), then (unless the stream is capturing) reads the counts back and waits for them. Returns a
// CUDA error status only; a bad target is reported through `out` (the caller formats its own message, the one its
// CPU path gives). n == 0: the kernel writes zero counts, nothing is read back, out = {}.
strata_status cuda_count_targets(const void* target, int32_t target_dtype, int64_t stride, int64_t n, int64_t V,
                                 int64_t ignore_index, int64_t* scratch, void* stream, TargetCounts* out);
#endif

}  // namespace strata::loss
