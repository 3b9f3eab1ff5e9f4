/* Strata operators: rms_norm_gated (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_RMS_NORM_GATED_H_
#define STRATA_OPS_RMS_NORM_GATED_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* rms_norm_gated (ops_fused.md §4): group-wise RMS norm combined with a SiLU or sigmoid gate z.
 * Rows are x's leading dimensions; each row of D = x.shape[-1] features is cut into D / G groups of
 * G = group_size consecutive features (group_size 0 means G = D), normalised with their own
 * r = 1 / sqrt(mean_group(h^2) + eps), where h = x (+ residual) in f32 and residual_out = h.
 *   norm_before_gate = 1 (fla FusedRMSNormGated, GDN): y = (h r w + b) * act(z)
 *   norm_before_gate = 0 (Mamba2 RMSNormGated):        u = h act(z), y = u r w + b   (r from u)
 * act: STRATA_GATE_SILU (silu = swish) or STRATA_GATE_SIGMOID.
 * x, z, y: [..., D], one dtype f32/bf16/f16 (f64 on CPU). weight, bias: [D] any float dtype, or NULL
 * (w = 1, b = 0). residual, residual_out: [..., D] in x's dtype or f32, or NULL. rstd: [..., D / G] f32
 * (f64 with f64 x), saved for the backward. group_size must divide D; eps finite and >= 0.
 * Tensors: {x, z, weight, bias, residual, y, residual_out, rstd}. No workspace. */
typedef enum strata_gate_act { STRATA_GATE_SILU = 0, STRATA_GATE_SIGMOID = 1 } strata_gate_act;
STRATA_API strata_status strata_rms_norm_gated_fwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* z, const strata_tensor_desc* weight,
    const strata_tensor_desc* bias, const strata_tensor_desc* residual, const strata_tensor_desc* y,
    const strata_tensor_desc* residual_out, const strata_tensor_desc* rstd, float eps, int64_t group_size,
    int32_t norm_before_gate, int32_t activation, strata_plan* plan);

/* Backward from the saved rstd (h, the gate and the normalised values are recomputed):
 * dx, dz [..., D] in x's dtype; dweight [D] (needs weight) and dbias [D] (needs bias) in any float dtype,
 * or NULL when not wanted: column sums over all rows, reduced deterministically through the workspace
 * (f32 partial sums per fixed block of rows). dresidual_out [..., D] (the incoming gradient of
 * residual_out, x's dtype or f32) is added to dx, or NULL. The gradient of residual equals dx.
 * x, z, weight, bias, residual, rstd as in the forward; dy [..., D] in x's dtype.
 * Tensors: {x, z, weight, bias, residual, rstd, dy, dresidual_out, dx, dz, dweight, dbias}.
 * Workspace: strata_plan_workspace_size (zero unless dweight or dbias is requested). */
STRATA_API strata_status strata_rms_norm_gated_bwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* z, const strata_tensor_desc* weight,
    const strata_tensor_desc* bias, const strata_tensor_desc* residual, const strata_tensor_desc* rstd,
    const strata_tensor_desc* dy, const strata_tensor_desc* dresidual_out, const strata_tensor_desc* dx,
    const strata_tensor_desc* dz, const strata_tensor_desc* dweight, const strata_tensor_desc* dbias,
    int64_t group_size, int32_t norm_before_gate, int32_t activation, strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_RMS_NORM_GATED_H_ */
