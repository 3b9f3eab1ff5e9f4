// fused_cross_entropy (ops_fused.md §1; README.md beside this file): the kernel params struct and the entry
// points of the forward (loss, lse, z-loss, and optionally the gradient in the same pass) and the backward.
//
//   logits [N, V] (last dim contiguous, any row stride), target [N] int64/int32,
//   loss/z_loss [N] (reduction none) or [] (mean, sum), lse [N], dlogits [N, V] (may be the logits buffer).
// Per-row math: src/ops/loss/common/ce_row.h. Ignored rows (target == ignore_index): loss 0, z_loss 0,
// dlogits row 0; lse is still computed. mean = sum(loss_i) / #{i: target_i != ignore_index}, and 0 when
// every target is ignored (instead of PyTorch's 0/0 = NaN); the gradient is then 0 too.
//
// Work decomposition: a row is one unit of work (a CPU thread's item, a CUDA block); per-row results go to
// the workspace and are summed in row order afterwards (f64 accumulation, one thread), so the reduced loss
// has the same bits for any thread count and every run.
#pragma once

#include <cstdint>
#include <string>

#include "opbase/dtype.h"
#include "ops/loss/common/ce_row.h"
#include "ops/loss/common/cuda_targets.h"

namespace strata::loss {

enum CeReduction : int32_t { kCeNone = 0, kCeMean = 1, kCeSum = 2 };

struct CeParams {
  // Inputs (element [0, 0] / [0]; descriptor offsets applied at bind time).
  const void* logits = nullptr;
  const void* target = nullptr;
  const void* lse_in = nullptr;  // backward: the saved lse [N]
  const void* dloss = nullptr;   // backward: upstream gradient, [] (mean/sum) or [N] (none), out_dtype
  // Outputs (nullptr when not requested).
  void* loss = nullptr;
  void* lse = nullptr;     // forward
  void* z_loss = nullptr;  // forward
  void* dlogits = nullptr;
  void* workspace = nullptr;

  int32_t dtype = STRATA_DTYPE_F32;         // logits and dlogits
  int32_t target_dtype = STRATA_DTYPE_I64;  // i64 or i32
  int32_t out_dtype = STRATA_DTYPE_F32;     // loss, lse, z_loss, dloss: f32 (f64 with f64 logits)
  int64_t N = 0, V = 0;
  int64_t logits_rs = 0, dlogits_rs = 0;    // row strides (elements); columns are contiguous
  int64_t target_stride = 1, loss_stride = 1, lse_stride = 1, z_stride = 1, lse_in_stride = 1, dloss_stride = 1;
  int32_t reduction = kCeMean;
  CeConsts k;
  float grad_scale = 1.f;  // forward with dlogits: the upstream gradient G assumed for the loss
  bool backward = false;
  // Backward without lse ("scale mode", for the gradient-in-forward path): dlogits (the logits buffer) already
  // holds the gradient for an upstream gradient of 1, written by the fused forward with grad_scale 1; it is
  // multiplied in place by dloss (row i by dloss[i] for none). dloss is read where the kernel runs (no host
  // read): rows whose factor is exactly 1 and ignored rows (their gradient is 0 whatever dloss is, as in the
  // full backward) are neither read nor written, so dloss == 1 costs one small launch.
  bool scale_only = false;
};

// Workspace: per-row losses and z-losses (f64 on the CPU, f32 on CUDA) when the loss is reduced; on CUDA then
// the target counts (kTargetScratchBytes = 32: the count of non-ignored rows, the bad count, the first bad row).
STRATA_HD size_t ce_workspace_bytes(const CeParams& p, bool cuda) {
  if (p.scale_only) return 0;
  const size_t row = cuda ? sizeof(float) : sizeof(double);
  const size_t rows = (!p.backward && p.reduction != kCeNone) ? 2 * static_cast<size_t>(p.N) * row : 0;
  if (!cuda) return rows;  // the CPU counts the targets while checking them
  return ((rows + 15) / 16) * 16 + kTargetScratchBytes;  // + the target counts (int64), 16-byte aligned
}

// CUDA: the count of non-ignored rows (int64) in the last 32 bytes of the workspace, after it (ce_bad_slot) the
// count of targets outside [0, V) that are not ignore_index, then the first bad row (cuda_targets.h's scratch).
// ce_launch_count writes them before the row kernel and reads them back: a bad target fails the call before
// anything is written. While a CUDA graph is captured the read-back is skipped; the kernels then still see the
// bad count: a fused forward with a bad target writes no gradient (in place the logits keep their values) and the
// bad rows get a NaN loss.
STRATA_HD int64_t* ce_count_slot(const CeParams& p) {
  return reinterpret_cast<int64_t*>(static_cast<char*>(p.workspace) + ce_workspace_bytes(p, true) -
                                    kTargetScratchBytes);
}
STRATA_HD int64_t* ce_bad_slot(const CeParams& p) { return ce_count_slot(p) + 1; }

// Target of row i as int64 (i64 or i32 storage).
STRATA_HD int64_t ce_target(const CeParams& p, int64_t i) {
  return p.target_dtype == STRATA_DTYPE_I64 ? static_cast<const int64_t*>(p.target)[i * p.target_stride]
                                            : static_cast<const int32_t*>(p.target)[i * p.target_stride];
}

// Upstream gradient g_i of a non-ignored row i: backward: dloss[i] (none), dloss[0] / count (mean), dloss[0]
// (sum); fused forward: grad_scale (none, sum), grad_scale / count (mean). Mean over zero rows: 0.
STRATA_HD float ce_upstream(const CeParams& p, int64_t i, int64_t count) {
  float G = p.grad_scale;
  if (p.backward) {
    const float* dl = static_cast<const float*>(p.dloss);
    G = p.reduction == kCeNone ? dl[i * p.dloss_stride] : dl[0];
  }
  if (p.reduction != kCeMean) return G;
  return count > 0 ? G / static_cast<float>(count) : 0.f;
}

// Host check of the target values (CPU implementations, before anything is written): every target is in
// [0, V) or equals ignore_index. Returns the count of non-ignored rows through `count`.
strata_status ce_check_targets(const CeParams& p, int64_t* count);
// The error of a bad target y in row i (INVALID_VALUE; the CPU check's and the CUDA check's message).
strata_status ce_bad_target(const CeParams& p, int64_t i, int64_t y);

// float64 reference: plain loops (the ground truth; runs every float dtype by converting).
strata_status fused_cross_entropy_reference(const CeParams& p);

// CPU kernels compiled per Highway target (nullptr when `hwy_target` was not compiled): f32/bf16/f16 logits.
// The targets were checked and counted by the caller (count = #non-ignored rows).
using CeCpuFn = void (*)(const CeParams&, int64_t count);
CeCpuFn fused_cross_entropy_cpu(int64_t hwy_target);
// The AVX3 build whose bf16 gradients are rounded by AVX512-BF16 ("cpu.avx512_bf16"; nullptr if AVX3 was not
// compiled); the caller offers it only on CPUs that have the feature (tile::cpu_has_avx512_bf16).
CeCpuFn fused_cross_entropy_cpu_native_bf16();
// Scale mode on the host (CeParams::scale_only): f32 products (the CPU implementations, rows split over the
// threads in fixed blocks) or f64 (the reference); the targets were checked by the caller.
void ce_scale_host(const CeParams& p, bool f64);

#if STRATA_WITH_CUDA
// cuda.sm90.block_per_row (cuda_sm90.cu): one block of 512 threads per row, any V, strides and alignment.
// Returns the launch status.
int fused_cross_entropy_cuda(const CeParams& p, void* stream);
// The shared-memory cluster kernels (cuda_sm90_smem.cu): a row per thread-block cluster of <= 8 CTAs of 256
// threads, each CTA's slice staged once in shared memory by the bulk copy engine (one read of the logits, one
// write of the gradient). ce_smem_reject: "" when the shape suits them (plan time: V and row strides multiples
// of 16 bytes, row <= 800 KiB); ce_smem_aligned: the base pointers are 16-byte aligned (run time; otherwise
// the caller runs block_per_row).
//   kSmem:    cuda.sm90.cluster_smem (one bulk copy per CTA slice, then the statistics sweeps);
//   kChunked: cuda.sm90.cluster_chunked (the slice copied in pieces, one mbarrier each; the statistics are
//             taken piece by piece as they land, online, overlapping the copy).
// Same conditions and math (another summation order, each deterministic).
//   kStoredExp: cuda.sm90.cluster_stored_exp (session 7): cluster_smem whose statistics sweep writes
//             e = exp(c - m_thread) over the logits in shared memory (f16 for bf16 logits, f32 for f32), so the
//             gradient sweep has no exponential; only the fused forward without softcap of bf16/f32 logits,
//             everything else runs cluster_smem's kernel.
//   kStoredExpPf16: cuda.sm90.cluster_stored_exp_pf16 (the default since session 13): kStoredExp with ~80 KiB
//             slices instead of ~40 KiB (half the CTAs per cluster; session 7's cluster_stored_exp_wide, the default
//             s7run2-s12) whose CTAs also prefetch into L2 their slice of the row 16 rows ahead
//             (cp.async.bulk.prefetch.L2), where the stored-exp kernel runs; everything else is cluster_smem
//             exactly (kernel and slices, no prefetch).
enum class CeSmemKind { kSmem, kChunked, kStoredExp, kStoredExpPf16 };
std::string ce_smem_reject(const CeParams& p, CeSmemKind kind);
bool ce_smem_aligned(const CeParams& p);
int fused_cross_entropy_cuda_smem(const CeParams& p, void* stream, CeSmemKind kind);
// Scale mode (CeParams::scale_only) on CUDA: one launch whatever the implementation (cuda_sm90.cu).
strata_status ce_launch_scale(const CeParams& p, void* stream);
// The small kernels around the row kernels (cuda_sm90.cu): the target check (cuda_targets.h: the counts into
// ce_count_slot, read back; a bad target fails here, before anything is written; every call with N > 0) and the
// fixed-order reduction of the per-row losses (mean, sum; only when needed).
strata_status ce_launch_count(const CeParams& p, void* stream);
strata_status ce_launch_reduce(const CeParams& p, void* stream);
#endif

}  // namespace strata::loss
