// The multi-row forward kernels of the row norms (config.stream = 4; row_norm_cuda_multi.cu), called by the
// launcher in row_norm_cuda.cu. Internal to src/ops/norm/common.
#pragma once

#if STRATA_WITH_CUDA
#include <vector>

#include "ops/norm/common/row_norm.h"

namespace strata::norm {

// Whether a multi-row kernel instance exists for (tpr, nv, rpg) (hints and blocks_per_sm are run-time values).
bool row_norm_multi_known(const RowNormCudaConfig& c);
// One configuration per instance (stream 4, hints 0, blocks_per_sm 0).
std::vector<RowNormCudaConfig> row_norm_multi_instances();
// The multi-row configuration the forward default takes for rows of D elements of `dtype` (measured on the
// H200: see the table in row_norm_cuda_multi.cu), or stream 0 where the packed/classic choice stays.
RowNormCudaConfig row_norm_multi_default(int64_t D, int32_t dtype);
// Launches the instance of `c` (row_norm_multi_known(c), the layout checked by the caller: one dtype, whole
// aligned 16-byte vectors, equally spaced rows, tpr * nv vectors cover the row) on `stream` (a cudaStream_t).
// Returns a strata_status.
int row_norm_fwd_multi_launch(const RowNormFwdParams& p, const RowNormCudaConfig& c, void* stream);

}  // namespace strata::norm
#endif
