/* Strata operators: fused_cross_entropy (C API). Included by strata/ops.h; compiles alone.
 *
 * Token-level cross entropy of logits [N, V] against targets [N] (ops_fused.md §1), with label smoothing,
 * z-loss (lse_square_scale), logit scaling and soft-capping, ignore_index and the reductions none/mean/sum.
 * Per row i with target y != ignore_index (s = logit_scale, eps = label_smoothing, lambda = lse_square_scale):
 *   c_j = cap * tanh(s z_j / cap) (softcap > 0) or s z_j;  lse = log sum_j exp(c_j)
 *   loss_i = lse - (1 - eps) c_y - (eps / V) sum_j c_j + lambda lse^2;   z_loss_i = lambda lse^2
 *   dz_j = g_i s (1 - t_j^2) (p_j (1 + 2 lambda lse) - eps / V - (1 - eps)[j == y]),  p_j = exp(c_j - lse)
 * Ignored rows: loss 0, z_loss 0, gradient 0 (lse is still computed). mean divides by the number of
 * non-ignored rows and gives 0 (loss and gradient) when there is none. Deterministic: per-row values are
 * summed in row order with f64 accumulation (same bits every run, any thread count).
 */
#ifndef STRATA_OPS_FUSED_CROSS_ENTROPY_H_
#define STRATA_OPS_FUSED_CROSS_ENTROPY_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reduction of per-row losses (also usable by other loss ops). */
typedef enum strata_loss_reduction {
  STRATA_LOSS_REDUCTION_NONE = 0, /* loss [N] */
  STRATA_LOSS_REDUCTION_MEAN = 1, /* loss [] = sum / #non-ignored rows (0 when none) */
  STRATA_LOSS_REDUCTION_SUM = 2   /* loss [] = sum */
} strata_loss_reduction;

/* Forward, optionally fused with the backward.
 *   logits  [N, V] f32/bf16/f16 (f64 on CPU); last dimension contiguous, any row stride; V >= 1.
 *   target  [N] int64 or int32; every value in [0, V) or == ignore_index, checked before anything is written
 *           (both ops; INVALID_VALUE naming the first bad row; CUDA: a count kernel and one stream sync per call;
 *           under CUDA graph capture no check: a bad row gets a NaN loss, never an out-of-bounds access, and a
 *           forward with dlogits writes no gradient at all, so in place the logits keep their values).
 *   loss    [N] (reduction NONE) or [] (MEAN, SUM), f32 (f64 with f64 logits).
 *   lse     [N] like loss, or NULL.       z_loss: like loss (the reduced lambda lse^2, for logging), or NULL.
 *   dlogits NULL, or [N, V] of logits' dtype, last dimension contiguous: the gradient of grad_scale * loss
 *           (G = grad_scale per row for NONE, G / #valid for MEAN). It may be the logits buffer itself (same
 *           pointer, same descriptor): then the logits are overwritten by their gradient ("in place"); any
 *           other overlap is rejected at run time.
 * Attributes: reduction (strata_loss_reduction); ignore_index; label_smoothing in [0, 1]; logit_scale finite;
 *   lse_square_scale >= 0; softcap >= 0 (0: off); grad_scale finite (ignored without dlogits). All finite.
 * Workspace: CUDA 32 B + (reduced loss) 2 N floats; CPU 2 N doubles. Tensors: {logits, target, loss, lse, z_loss, dlogits}. */
STRATA_API strata_status strata_fused_cross_entropy_fwd_plan(
    const strata_tensor_desc* logits, const strata_tensor_desc* target, const strata_tensor_desc* loss,
    const strata_tensor_desc* lse, const strata_tensor_desc* z_loss, const strata_tensor_desc* dlogits,
    int32_t reduction, int64_t ignore_index, float label_smoothing, float logit_scale, float lse_square_scale,
    float softcap, float grad_scale, strata_plan* plan);

/* Backward from the saved lse: dlogits = d(loss)/d(logits) * dloss.
 *   logits, target as in the forward; lse [N] f32 (f64 with f64 logits) from the forward;
 *   dloss [] (MEAN, SUM) or [N] (NONE), dtype of lse; dlogits [N, V] of logits' dtype (may be the logits
 *   buffer: in place). As the forward: attributes, target check. CUDA workspace 32 B. Tensors: {logits, target, lse, dloss, dlogits}.
 * Scale mode (lse NULL), the backward of a forward that wrote its gradient in place with grad_scale 1: the
 *   logits buffer holds that gradient and dlogits must be that buffer (same pointer and strides; checked at
 *   run time); each non-ignored row is multiplied in place by dloss (row i by dloss[i] for NONE), in f32 and
 *   rounded to the logits' dtype (f64 for f64). dloss is read where the op runs (no device-to-host copy), and
 *   rows whose factor is exactly 1 and ignored rows are neither read nor written. No workspace. */
STRATA_API strata_status strata_fused_cross_entropy_bwd_plan(
    const strata_tensor_desc* logits, const strata_tensor_desc* target, const strata_tensor_desc* lse,
    const strata_tensor_desc* dloss, const strata_tensor_desc* dlogits, int32_t reduction, int64_t ignore_index,
    float label_smoothing, float logit_scale, float lse_square_scale, float softcap, strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_FUSED_CROSS_ENTROPY_H_ */
