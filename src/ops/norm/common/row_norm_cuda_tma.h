// The TMA forward kernels of the row norms (config.stream = 5; row_norm_cuda_tma.cu), called by the launcher
// in row_norm_cuda.cu. Internal to src/ops/norm/common.
#pragma once

#if STRATA_WITH_CUDA
#include <cstdint>
#include <vector>

#include "ops/norm/common/row_norm.h"

namespace strata::norm {

// Largest rows per tile and shared memory per block (no opt-in above the default 48 KiB).
inline constexpr int kTmaMaxRows = 256;
inline constexpr int64_t kTmaMaxSmem = 48 * 1024;

// Whether a kernel instance exists for c's (tpr, nv; nv 0: a warp walking the row in shared memory, any length)
// and c's run-time values are in range (rows per tile
// 1..kTmaMaxRows, hints 0..3, no persistent grid).
bool row_norm_tma_known(const RowNormCudaConfig& c);
// Dynamic shared memory of a block: header (mbarrier + the tile's rstd values) + rpt rows of nvec 16-byte vectors.
int64_t row_norm_tma_smem_bytes(int64_t nvec, int rpt);
// The configuration the implementation cuda.sm90.row_norm_tma takes for a row of nvec 16-byte vectors (tpr 0 when
// one row does not fit a block's 48 KiB): rows of up to 16 vectors teams of 4 lanes, up to 128 vectors the packed
// kernels' lane layout, longer rows a warp walking the row in shared memory (nv 0); tiles of 16 rows, at most
// 16 KiB (s8run2).
RowNormCudaConfig row_norm_tma_pick(int64_t nvec);
// The forward default's TMA configuration for rows of D elements of `dtype` (measured on the H200, s8run2: see
// row_norm_cuda_tma.cu), or stream 0 where the other kernels stay the default.
RowNormCudaConfig row_norm_tma_default(int64_t D, int32_t dtype);
// Every (tpr, nv) instance (rows per tile 64, hints 0).
std::vector<RowNormCudaConfig> row_norm_tma_instances();
// Launches c (row_norm_tma_known(c), the layout checked by the caller: one dtype, whole aligned 16-byte vectors,
// dense x and y rows, equally spaced rstd, tpr * nv vectors cover the row, smem within kTmaMaxSmem, sm_90) on
// `stream` (a cudaStream_t). Returns a strata_status.
int row_norm_fwd_tma_launch(const RowNormFwdParams& p, const RowNormCudaConfig& c, void* stream);

}  // namespace strata::norm
#endif
