// chunk_loss (docs/reference/ops_fused.md §2; README.md beside this file): fused LM head + cross entropy
// without materialising the [N, V] logits. Kernel params, the strategy / tile planning, and the kernel entry
// points; the per-row cross-entropy math is loss/common/ce_row.h's (STRATA_HD, shared with fused_cross_entropy).
//
//   hidden [N, D], weight [V, D], bias [V] (optional), target [N] int64
//   z = hidden . weight^T + bias                          [N, V], never stored whole
//   per row i (ops_fused.md §1.3): u = s*z, c = cap*tanh(u/cap) (softcap) or u, lse = logsumexp(c),
//     loss_i = lse - (1-eps) c_y - (eps/V) sum_j c_j + lambda lse^2;   ignored rows (y == ignore_index): 0
//   L = sum_i a_i loss_i, a_i = 1/#valid (mean) or 1 (sum), 0 for ignored rows
//   dZ[i, j] = G a_i s (p_j (1 + 2 lambda lse) - eps/V - (1-eps)[j == y]) (1 - (c_j/cap)^2 with softcap)
//   dhidden = dZ . weight [N, D], dweight = dZ^T . hidden [V, D], dbias = colsum(dZ) [V]
//
// Two strategies (README.md "Strategy heuristic"), run by the same driver (driver.h) over the backends:
//   token_chunked: per chunk of C full rows: Z[C, V] = H_c W^T, row stats, dZ in place, dH_c = dZ W,
//                  dW += dZ^T H_c (f32, in chunk order), db += colsum(dZ). 3 GEMMs, gradients in forward.
//   vocab_tiled:   forward: 2-D tiles [Nb, vt], online (max, sum-exp) merge per row over the vocabulary tiles.
//                  backward (recompute): per vocab tile, per token block: Z, dZ from the saved lse,
//                  dW_tile (+)= dZ^T H_b, dH_b += dZ W_tile (f32, in tile order). 4 GEMMs.
#pragma once

#include <cmath>
#include <cstdint>

#include "opbase/dtype.h"  // storage types, STRATA_HD; strata_status comes with it
#include "ops/loss/common/ce_row.h"  // the per-row cross-entropy math (shared with fused_cross_entropy)

namespace strata::loss {

enum ChunkLossReduction : int32_t { kReduceMean = 0, kReduceSum = 1 };
enum ChunkLossStrategy : int32_t { kStrategyAuto = 0, kStrategyTokenChunked = 1, kStrategyVocabTiled = 2 };

// Extra memory (besides inputs and the gradient outputs) the plan aims to stay within: chunk and tile sizes
// are chosen from it (README.md).
constexpr int64_t kChunkLossBudgetBytes = int64_t{64} << 20;

struct ChunkLossParams {
  // inputs (descriptor offsets applied)
  const void* hidden = nullptr;   // [N, D], row stride ld_h
  const void* weight = nullptr;   // [V, D], row stride ld_w
  const void* bias = nullptr;     // [V] (stride bias_stride) or nullptr; dtype = w_dtype
  const int64_t* target = nullptr;  // [N] (stride target_stride)
  const void* dloss = nullptr;    // backward op: the upstream gradient G (scalar in device memory) or nullptr (1)
  const void* lse_in = nullptr;   // backward op: the saved lse [N] (stride lse_stride)
  // outputs (any may be nullptr except loss in the forward op)
  void* loss = nullptr;           // scalar
  void* lse = nullptr;            // [N] (stride lse_stride)
  void* dhidden = nullptr;        // [N, D] (row stride ld_dh)
  void* dweight = nullptr;        // [V, D] (row stride ld_dw)
  void* dbias = nullptr;          // [V] (stride db_stride)
  int32_t h_dtype = 0, w_dtype = 0, dh_dtype = 0, dw_dtype = 0, db_dtype = 0;
  int32_t stat_dtype = STRATA_DTYPE_F32;  // loss, lse, dloss: f32 (f64 with f64 inputs, reference only)
  int64_t N = 0, D = 0, V = 0;
  int64_t ld_h = 0, ld_w = 0, ld_dh = 0, ld_dw = 0;
  int64_t bias_stride = 1, target_stride = 1, lse_stride = 1, db_stride = 1;
  CeConsts ce;                    // ce_consts(options, V): the per-row math's constants
  int32_t reduction = kReduceMean;
  float grad_scale = 1.f;         // gradients are those of grad_scale * G * L
  bool backward_op = false;       // chunk_loss_bwd: recompute from lse_in, no loss output
  // resolved by the plan (chunk_loss_choose)
  int32_t strategy = kStrategyTokenChunked;
  int64_t rows = 0;               // token_chunked: chunk C; vocab_tiled: token block Nb
  int64_t vtile = 0;              // vocab_tiled: vocab tile vt; token_chunked: the W slice of the CPU GEMMs
  bool wants_grad() const { return dhidden || dweight || dbias; }
};

// What a backend does differently (the workspace layout depends on it).
struct BackendTraits {
  bool convert_operands = false;  // CPU: 16-bit GEMM operands are converted to f32 per block (dnnl_sgemm)
  bool separate_dz = false;       // CUDA: 16-bit inputs take dZ in their dtype (tensor-core GEMMs)
  bool gemm_stores_any = false;   // the GEMM can store its result in a 16-bit dtype (cuBLAS)
  int64_t min_chunk_rows = 64;    // token_chunked is chosen only with chunks at least this tall
  bool bf16_tile = false;         // CUDA: bf16 inputs keep the logits tile in bf16 (the GEMM rounds its f32
                                  // accumulators once) and dZ overwrites it in place: 2 bytes per element
  bool overlap_stats = false;     // CUDA with STRATA_CHUNK_LOSS_OVERLAP=1 (off by default: slower on the H200):
                                  // stats() runs beside the next GEMM (a second stream), so the vocab_tiled
                                  // forward alternates the tiles it does not keep between two buffers, and the
                                  // backward computes a kept tile's gradient beside the previous tile's GEMMs
  // Session 14 (CUDA; README.md "CUDA (H200)"), read per call like overlap_stats:
  bool dh_batch2 = false;         // CUDA (two GEMMs with STRATA_CHUNK_LOSS_DH=pair): the split dH accumulator's two
                                  // GEMMs per tile (rows [0, N/2) and [N/2, N)) as one strided batch (gemm_batch2)
  // Session 15 (CUDA; STRATA_CHUNK_LOSS_KEEP=dw forces the session-14 layout): vocab_tiled with kept tiles keeps
  // tile 0 in the workspace tile from the forward to the backward and sends the forward's other tiles to dhidden's
  // storage (driver.h): one logits tile more kept, one recompute fewer (18 of 39 kept at the H200 shape).
  bool keep_first_in_ws = false;
  int32_t row_block = 1;          // CUDA: 2 rows per block of the 16-byte row_stats (cuda_sm90.cu row_stats_v8r, the
                                  // same bits); STRATA_CHUNK_LOSS_ROWS=1 forces one row per block
};

// Workspace layout (byte offsets; every piece 256-byte aligned).
struct ChunkLossLayout {
  size_t rowloss = 0, lse = 0, stat = 0, counts = 0, z = 0, dz = 0, dw_acc = 0, dh_acc = 0, db_acc = 0,
         h_conv = 0, w_conv = 0, bias_conv = 0, total = 0;
  bool dw_in_place = false, dh_in_place = false, db_in_place = false;
  bool dw_direct = false;  // vocab_tiled with one token block: each dW tile is one GEMM (K = N) stored straight
                           // into dweight in its dtype (no f32 tile accumulator)
  int32_t z_dtype = STRATA_DTYPE_F32;  // the logits tile's dtype (f32, or bf16 with BackendTraits::bf16_tile)
  // vocab_tiled with dw_direct and a 16-bit dhidden: the f32 dH accumulator [N, D] lives in dweight's own
  // storage, in its last rows [dh_dw_row, V) (contiguous dweight), which hold no dW until the end: the
  // vocabulary tiles that reach those rows ("deferred") add their dH and db in the main loop, dH is converted
  // into dhidden, then they are recomputed (one more logits GEMM each) and their dW stored. So no [N, D] f32
  // buffer is workspace. The accumulator's address (the last N D 4 bytes of dweight, rounded down to 256
  // bytes) is taken at run time from the dweight pointer.
  bool dh_in_dw = false;
};

// Picks the strategy (unless forced), the chunk / tile sizes (unless given) and lays out the workspace.
// Returns the layout; p.strategy, p.rows, p.vtile are set.
ChunkLossLayout chunk_loss_choose(ChunkLossParams& p, const BackendTraits& traits, int32_t forced_strategy,
                                  int64_t chunk_rows, int64_t vocab_tile);

// float64 reference: materialises Z in double for the whole problem (small shapes only).
strata_status chunk_loss_reference(const ChunkLossParams& p);

// Host check of the targets (CPU paths, before writing anything): every target is ignore_index or in
// [0, V). Sets the last error and returns STRATA_ERROR_INVALID_VALUE otherwise; counts valid rows.
strata_status check_targets(const ChunkLossParams& p, int64_t* valid);
// The error of a bad target y in row i (INVALID_VALUE; the CPU check's and the CUDA check's message).
strata_status chunk_loss_bad_target(const ChunkLossParams& p, int64_t i, int64_t y);

// CPU implementation per Highway target (nullptr when not compiled): oneDNN GEMMs + Highway epilogues.
using ChunkLossCpuFn = strata_status (*)(const ChunkLossParams&, const ChunkLossLayout&, void* workspace);
ChunkLossCpuFn chunk_loss_cpu(int64_t hwy_target);
BackendTraits chunk_loss_cpu_traits();

#if STRATA_WITH_CUDA
// CUDA (sm_90): cuBLAS GEMMs + fused epilogue kernels. Returns a strata_status.
int chunk_loss_cuda(const ChunkLossParams& p, const ChunkLossLayout& layout, void* workspace, void* stream);
BackendTraits chunk_loss_cuda_traits();
// Session 13: one call of chunk_loss_cuda split into its steps on the GPU (ChunkLoss.CudaStepBreakdown; README.md
// "CUDA (H200)"): a CUDA event before and after every backend call of the driver; per step kind the summed time,
// the number of calls and the GEMM FLOPs; total_ms from the first event to the last, so total_ms minus the sum of
// the steps is the time between them (launch gaps). The default path only (STRATA_CHUNK_LOSS_OVERLAP unset: an
// error otherwise). Synchronises the stream. Returns a strata_status.
enum ChunkLossStep : int {
  kStepCountTargets,
  kStepLogitsFwd,
  kStepLogitsRecompute,
  kStepDhGemm,
  kStepDwGemm,
  kStepStats,
  kStepGrad,
  kStepColsum,
  kStepConvert,
  kStepLossSum,
  kChunkLossSteps
};
struct ChunkLossCudaSteps {
  double ms[kChunkLossSteps] = {};
  int64_t calls[kChunkLossSteps] = {};
  double flop[kChunkLossSteps] = {};
  double total_ms = 0.0;
};
const char* chunk_loss_step_name(int step);
int chunk_loss_cuda_steps(const ChunkLossParams& p, const ChunkLossLayout& layout, void* workspace, void* stream,
                          ChunkLossCudaSteps* out);
#endif

}  // namespace strata::loss
