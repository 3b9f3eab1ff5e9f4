/* Strata operators: clipped_swiglu (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_CLIPPED_SWIGLU_H_
#define STRATA_OPS_CLIPPED_SWIGLU_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* clipped_swiglu (ops_fused.md §8): the clamped SwiGLU of GPT-OSS / DeepSeek-V4 MoE experts.
 * x [..., 2I] holds pairs (A gate, B linear): interleaved = 1: A = x[..., 0::2], B = x[..., 1::2] (GPT-OSS);
 * interleaved = 0: A = x[..., :I], B = x[..., I:] (Megatron, DeepSeek split layout).
 *   a = min(A, limit), b = clamp(B, -limit, limit), y = a * sigmoid(alpha * a) * (b + bias) [* probs]
 * GPT-OSS: alpha 1.702, limit 7, bias 1; DeepSeek-V4 swiglu_with_limit: alpha 1, limit 10, bias 0.
 * x, y: f32/bf16/f16 (f64 on CPU), one dtype; y [..., I]. probs: NULL or [...] (x's shape without its last
 * dimension), any float dtype: a per-row (per-token) multiplier, e.g. the router probability.
 * limit > 0 (may be +inf: no clipping); alpha, bias finite. Tensors: {x, probs, y}. No workspace. */
STRATA_API strata_status strata_clipped_swiglu_fwd_plan(const strata_tensor_desc* x, const strata_tensor_desc* probs,
                                                        const strata_tensor_desc* y, float alpha, float limit,
                                                        float bias, int32_t interleaved, strata_plan* plan);

/* Backward: dA = dy p (b + bias) s (1 + alpha a (1 - s)) [A <= limit], dB = dy p a s [-limit <= B <= limit]
 * (the clamp gradients pass on the closed interval, boundary included, as torch.clamp), written to the
 * positions of A and B in dx [..., 2I]; dprobs[row] = sum_i y0_i dy_i with y0 the unscaled output (NULL when
 * not wanted; needs probs; any float dtype). dy [..., I] and dx in x's dtype.
 * Tensors: {x, probs, dy, dx, dprobs}. No workspace. */
STRATA_API strata_status strata_clipped_swiglu_bwd_plan(const strata_tensor_desc* x, const strata_tensor_desc* probs,
                                                        const strata_tensor_desc* dy, const strata_tensor_desc* dx,
                                                        const strata_tensor_desc* dprobs, float alpha, float limit,
                                                        float bias, int32_t interleaved, strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CLIPPED_SWIGLU_H_ */
