// causal_conv1d, CUDA builds: the run-time check of the cu_seqlens values (cuda_check.cu), called by every CUDA
// implementation's entry (causal_conv1d.cpp) before anything is written. The N + 1 offsets are copied to the host
// (one small copy and a stream synchronisation, only in cu_seqlens mode) and checked by check_cu_seqlens_values,
// the CPU path's rule and messages. Skipped while the stream is captured into a CUDA graph (no synchronisation
// allowed there; the kernels clamp every offset into [0, T], cu_at).
#pragma once

#include "ops/conv/causal_conv1d/causal_conv1d.h"

namespace strata::conv {

strata_status causal_conv1d_cuda_check_cu_seqlens(const Conv1dParams& p, const char* op, void* stream);

}  // namespace strata::conv
