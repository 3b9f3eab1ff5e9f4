/* Strata operators: causal_conv1d (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_CAUSAL_CONV1D_H_
#define STRATA_OPS_CAUSAL_CONV1D_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* causal_conv1d (docs/reference/ops_fused.md §5): depthwise causal convolution along time, W taps per channel,
 *   u[t] = bias + sum_{k<W} w[d, k] * xs[t - (W-1) + k],   y[t] = act(u[t]) (+ residual[t])
 * (tap W-1 multiplies the current token; positions before a sequence start read initial_state or zeros).
 *
 * Tensors (any strides; unit channel stride is the fast path):
 *   x, y, residual, dy, dx: [B, T, D], one dtype: f32/bf16/f16 (f64 on CPU).
 *   weight, dweight: [D, W] (weight_layout 0, Dao-AILab/fla) or [W, D] (weight_layout 1, MindSpeed callers),
 *     W in [2, 16]; any float dtype (f32 in the public tests); dweight has weight's dtype.
 *   bias, dbias: [D] or NULL; any float dtype (dbias has bias's dtype).
 *   initial_state, final_state, dinitial_state, dfinal_state: [N, D, W-1] or NULL, any float dtype; slot j is
 *     position j - (W-1) before the sequence start (oldest first; Dao-AILab's W-1 convention, not fla's W).
 *   cu_seqlens: int32/int64 [N+1] with B == 1 (variable-length pack; 0 first, non-decreasing, T last), or
 *   seq_idx: int32/int64 [B, T] sequence ids (a tap counts only when its id equals the token's; the initial
 *     state belongs to the row's first sequence; a token with a negative id is padding: act(u) is 0 there).
 *   At most one of cu_seqlens and seq_idx. N = number of cu_seqlens spans, else B.
 * activation: 0 none, 1 silu.  weight_layout: 0 [D, W], 1 [W, D].
 *
 * Forward tensors: {x, weight, bias, residual, initial_state, cu_seqlens, seq_idx, y, final_state}.
 * final_state (NULL = not computed) holds the last W-1 sources of each sequence (the next chunk's state). */
STRATA_API strata_status strata_causal_conv1d_fwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* weight, const strata_tensor_desc* bias,
    const strata_tensor_desc* residual, const strata_tensor_desc* initial_state, const strata_tensor_desc* cu_seqlens,
    const strata_tensor_desc* seq_idx, const strata_tensor_desc* y, const strata_tensor_desc* final_state,
    int32_t activation, int32_t weight_layout, strata_plan* plan);

/* Backward: g = dy * act'(u) (u recomputed from x), dx[p] = sum_k w[k] g[p + W-1 - k] (+ dfinal_state),
 * dweight[d, k] = sum_t g[t] xs[t - (W-1) + k], dbias = sum_t g[t], dinitial_state from the taps that read it.
 * dresidual is dy itself (no kernel). dweight/dbias are sums over B*T tokens: f32 partial sums per time tile
 * in the workspace (strata_plan_workspace_size), reduced in a fixed order (same bits every run and for any
 * CPU thread count). dbias / dinitial_state may be NULL (not computed); dinitial_state needs initial_state.
 * Tensors: {x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal_state, dx, dweight, dbias,
 *           dinitial_state}. */
STRATA_API strata_status strata_causal_conv1d_bwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* weight, const strata_tensor_desc* bias,
    const strata_tensor_desc* initial_state, const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* seq_idx,
    const strata_tensor_desc* dy, const strata_tensor_desc* dfinal_state, const strata_tensor_desc* dx,
    const strata_tensor_desc* dweight, const strata_tensor_desc* dbias, const strata_tensor_desc* dinitial_state,
    int32_t activation, int32_t weight_layout, strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CAUSAL_CONV1D_H_ */
