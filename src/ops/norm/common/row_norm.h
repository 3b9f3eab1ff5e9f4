// Shared kernels of the parameter-free row norms: l2norm and rmsnorm_without_weight.
//
// Both compute, per row of D elements, rstd = 1 / sqrt(sum(x^2) / n_div + eps) (n_div = 1 for l2norm,
// D for rmsnorm) and optionally y = x * rstd. Their backward passes are one formula family:
//   kNormalizedSrc (l2norm, from the saved y):   dx = rstd * (dy - y * dot(dy, y) / n_div)
//   kRawSrc        (rmsnorm normalize, from x):  dx = rstd * (dy - x * rstd^2 * dot(dy, x) / n_div)
//   kFactor        (rmsnorm factor mode):        dx = x * (-dr * rstd^3 / n_div), dr one value per row
// Implementations: float64 reference (any float dtypes), Highway CPU kernels per ISA (f32/bf16/f16), CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opbase/row_layout.h"

namespace strata::norm {

struct RowNormFwdParams {
  const void* x = nullptr;
  void* y = nullptr;  // nullptr: only rstd is written (rmsnorm factor mode)
  void* rstd = nullptr;
  int32_t x_dtype = 0, y_dtype = 0, rstd_dtype = 0;
  int64_t rows = 0, D = 0;
  RowLayout x_rows, y_rows, rstd_rows;  // rstd_rows: one element per row
  int64_t n_div = 1;
  float eps = 0.f;
};

enum class RowNormBwdKind : int32_t { kNormalizedSrc = 0, kRawSrc = 1, kFactor = 2 };

struct RowNormBwdParams {
  const void* src = nullptr;   // y (kNormalizedSrc) or x (kRawSrc, kFactor)
  const void* rstd = nullptr;
  const void* dout = nullptr;  // dy [rows, D], or dr [rows] for kFactor
  void* dx = nullptr;
  int32_t src_dtype = 0, rstd_dtype = 0, dout_dtype = 0, dx_dtype = 0;
  int64_t rows = 0, D = 0;
  RowLayout src_rows, rstd_rows, dout_rows, dx_rows;
  int64_t n_div = 1;
  RowNormBwdKind kind = RowNormBwdKind::kNormalizedSrc;
};

// float64 reference (any float dtypes, any strides): plain loops.
void row_norm_fwd_reference(const RowNormFwdParams& p);
void row_norm_bwd_reference(const RowNormBwdParams& p);

// CPU kernels compiled per Highway target; nullptr when `hwy_target` was not compiled. They need
// col_stride == 1 for the vector path and handle any RowLayout; dtypes f32/bf16/f16 (rstd any float).
using RowNormFwdFn = void (*)(const RowNormFwdParams&);
using RowNormBwdFn = void (*)(const RowNormBwdParams&);
RowNormFwdFn row_norm_fwd_cpu(int64_t hwy_target);
RowNormBwdFn row_norm_bwd_cpu(int64_t hwy_target);
// The AVX3 build whose bf16 outputs use AVX512-BF16 conversion ("cpu.avx512_bf16"); nullptr if AVX3 was not
// compiled. Only for CPUs where tile::cpu_has_avx512_bf16().
RowNormFwdFn row_norm_fwd_cpu_native_bf16();
RowNormBwdFn row_norm_bwd_cpu_native_bf16();

#if STRATA_WITH_CUDA
// CUDA (sm_80 and newer, tuned for sm_90). The vectorised kernels hold a row in registers: `tpr` threads per
// row (1..32: a group inside a warp, several rows per warp for short rows; 128/256/512: one block per row), each
// with `nv` chunks of `chunk_elems` consecutive elements (8 or 16: one or two 16-byte accesses for 2-byte
// dtypes, two or four for f32). Rows that cannot be read in chunks (unit column stride, chunk-aligned row
// starts, 16-byte aligned base) or are too long for registers take a looped kernel (tpr 0).
// `rpg` rows per thread group (or per block): the loads of rpg consecutive rows are issued together before
// the first reduction, so each thread has rpg times the bytes in flight (1, 2 or 4 for groups with nv = 1;
// 1 or 2 for blocks of 128/256 threads with nv <= 2).
// `stream` 1: the streaming kernels (persistent grid, the next rows' loads issued before the current rows'
// reduction): `nv` 16-byte vectors per lane per row, vector k of lane t at k * tpr + t (coalesced per
// instruction), tpr 4..32 (lane teams) or 128/256/512 (a block per row), chunk_elems unused; they need one
// dtype for the row tensors and rows of whole, aligned 16-byte vectors. `max_blocks` > 0 caps the grid
// (tests: forces many iterations of the persistent loop on small inputs).
// `stream` 2: the packed kernels: the streaming kernels' vector layout (tpr 4..32 or 128/256/512, nv 1/2/4,
// rpg 1) on a plain grid, one row per team or block, registers capped for full occupancy (no prefetch).
// `stream` 3: the bulk-copy kernels (sm_90): a persistent grid streams tiles of `rpg` dense rows (1..256) into
// a ring of `nv` shared-memory stages (2..4) with cp.async.bulk and mbarriers; teams of `tpr` lanes (8, 16 or
// 32) reduce and store the oldest stage while the others load. One dtype for the row tensors, whole aligned
// 16-byte vectors, dense rows in the tensors read (x; src and dout), no kFactor backward, and the stage ring
// within 227 KiB of shared memory.
// `stream` 4 (forward only): the multi-row kernels (row_norm_cuda_multi.cu): the packed kernels' vector layout
// with `rpg` consecutive rows per team (tpr 4..32, 256-thread blocks) or per block (tpr 128/256/512), all their
// loads issued before the first use; `blocks_per_sm` > 0 makes the grid persistent (that many blocks per SM, at
// most the occupancy, balanced steps); `hints` bit 0 streaming stores (st.global.cs), bit 1 L2 evict-first loads.
// `stream` 5 (forward only, sm_90): the TMA kernels (row_norm_cuda_tma.cu): one tile of `rpg` consecutive dense
// rows (1..256, at most 48 KiB of shared memory) per block, bulk-loaded into shared memory (cp.async.bulk +
// mbarrier), normalised in place by teams of `tpr` lanes (4..32) with `nv` vectors per lane in registers (1, 2,
// 4; the packed kernels' layout) or, nv 0 (tpr 32), a warp walking the row in shared memory twice, bulk-stored
// whole; `hints` bit 0 stores with an L2 evict-first policy, bit 1 loads with it. One dtype for x and y, whole
// aligned 16-byte vectors, dense x and y rows.
// config.hints of the streaming and packed kernels (stream 1, 2): ld_stream's ld.global.L1::no_allocate.L2::256B
// loads (sessions 4-11) instead of plain ld.global.v4, the form since s12run1 (FusedGpuPaths.RowNormLoadsTiming,
// bf16, packed: rmsnorm [32768, 4096] bwd 0.1887 against 0.2077 ms, fwd 0.1333 against 0.1401, l2norm [524288, 128]
// bwd 0.1039 against 0.1056; streaming equal or faster too).
constexpr int kHintedLoads = 4;
struct RowNormCudaConfig {
  int chunk_elems = 16;
  int tpr = 0;  // 0: looped kernel (chunk_elems, nv and rpg unused)
  int nv = 1;   // bulk: stages
  int rpg = 1;  // bulk: rows per stage
  int stream = 0;  // 0 classic, 1 streaming, 2 packed, 3 bulk copy, 4 multi-row (forward), 5 TMA (forward)
  int max_blocks = 0;
  int hints = 0;  // bulk: bit 0 stores with st.global.cs, bit 1 loads without the L2 evict-first policy;
                  // multi: bit 0 stores with st.global.cs, bit 1 loads with the L2 evict-first policy;
                  // TMA: bit 0 bulk stores with the L2 evict-first policy, bit 1 bulk loads with it;
                  // streaming, packed: kHintedLoads alone (ld_stream's loads) or 0 (plain loads)
  int blocks_per_sm = 0;  // multi only: 0 one step per block, > 0 a persistent grid of that many blocks per SM
};
// The configuration the launchers use when none is given: the packed kernels where the layout allows (two
// 16-byte vectors per lane for rows of up to 64 vectors, a warp x 4 up to 128, a block per row above),
// except f32 rows of up to 128 vectors; else the classic kernels: 32-byte chunks per thread (8 f32 or 16
// bf16/f16 elements), the smallest group that covers the row. The backward (session 6, measured): rows of 8-32
// vectors one vector per lane (f32 too), 16-bit rows of 257-512 vectors a 128-thread block x 4. The forward
// (session 7, s7run2) takes the multi-row kernels (row_norm_multi_default) for 16-bit rows of 9-16 vectors
// (teams of 8 x 2, 2 rows, streaming stores), 16-bit rows of 257-512 vectors (256 x 2, 1 row, streaming stores)
// and f32 rows of 513-1024 vectors (512 x 2, 2 rows). Session 8 (s8run2): on sm_90, 16-bit rows of 9-16 and
// 257-512 vectors with dense, aligned x and y take the TMA kernels first (row_norm_tma_default: teams of 4 x 4 in
// 16-row tiles; a warp per row in 2-4-row tiles); otherwise the rules above. Session 13 (s12run1 + s13run1): of
// those, the rows of 257-512 vectors take the packed kernel 128 x 4 with plain loads instead of the TMA tile.
RowNormCudaConfig row_norm_fwd_cuda_config(const RowNormFwdParams& p);
RowNormCudaConfig row_norm_bwd_cuda_config(const RowNormBwdParams& p);
// The configurations atk times beside the default (bench rows marked [cfg ...]): the classic choice, the
// streaming choice, each packed configuration that covers the row with no idle lane, and on sm_90 the bulk-copy
// choice with a finer (half the rows, 4 stages) and a coarser (twice the rows, 2 stages) stage ring, and the
// choice with streaming stores (hints 1); forward: the multi-row kernels with the packed choice's team or block
// and 2 (teams also 4) rows per step, the multi-row default's configuration itself, and on sm_90 the TMA choice
// with half and twice its rows per tile and with evict-first stores.
std::vector<RowNormCudaConfig> row_norm_fwd_cuda_alternatives(const RowNormFwdParams& p);
std::vector<RowNormCudaConfig> row_norm_bwd_cuda_alternatives(const RowNormBwdParams& p);
// The classic kernels' choice alone (what the default was before the streaming kernels; the sweep compares).
RowNormCudaConfig row_norm_fwd_cuda_config_classic(const RowNormFwdParams& p);
RowNormCudaConfig row_norm_bwd_cuda_config_classic(const RowNormBwdParams& p);
// "" if `c` can run `p`, else why not (a tuning sweep tries every configuration; bench/row_norm_cuda_sweep).
std::string row_norm_fwd_cuda_config_reject(const RowNormFwdParams& p, const RowNormCudaConfig& c);
std::string row_norm_bwd_cuda_config_reject(const RowNormBwdParams& p, const RowNormCudaConfig& c);
// Every launchable configuration (each has a kernel instance; whether it fits a given row is the reject
// functions' answer). The tuning sweep times them all; tests/cpp/test_row_norm_cuda_configs.cpp checks them all.
std::vector<RowNormCudaConfig> row_norm_cuda_all_configs();
// Launches (config nullptr: the default above). Returns the launch status (a strata_status); an invalid
// config returns STRATA_ERROR_INVALID_ATTRIBUTE without launching.
int row_norm_fwd_cuda(const RowNormFwdParams& p, void* stream, const RowNormCudaConfig* config = nullptr);
int row_norm_bwd_cuda(const RowNormBwdParams& p, void* stream, const RowNormCudaConfig* config = nullptr);
// The implementation cuda.sm90.row_norm_bulk: the bulk-copy kernels with the configuration they pick for the
// row (teams of 8/16/32 lanes, stages of about 32 KiB, 3 stages). The reject functions give "" where they apply
// to p's device, shape, dtypes and layouts (at plan time, without pointers), else why not; the launchers fall
// back to the default kernels when a run's pointers are not 16-byte aligned.
std::string row_norm_fwd_cuda_bulk_reject(const RowNormFwdParams& p);
std::string row_norm_bwd_cuda_bulk_reject(const RowNormBwdParams& p);
int row_norm_fwd_cuda_bulk(const RowNormFwdParams& p, void* stream);
int row_norm_bwd_cuda_bulk(const RowNormBwdParams& p, void* stream);
// The implementation cuda.sm90.row_norm_tma (forward only): the TMA kernels with row_norm_tma_pick's
// configuration (teams as the packed kernels, tiles of about 16 KiB). The reject function gives "" where they
// apply to p's shape, dtypes and layouts (plan time, without pointers) and the device is sm_90 or newer; the
// launcher falls back to the default kernels when a run's pointers are not 16-byte aligned.
std::string row_norm_fwd_cuda_tma_reject(const RowNormFwdParams& p);
int row_norm_fwd_cuda_tma(const RowNormFwdParams& p, void* stream);
#endif

}  // namespace strata::norm
