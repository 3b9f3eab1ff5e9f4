/* Strata operators: gdn_bwd (C API). Included by strata/ops.h; compiles alone.
 *
 * The Gated DeltaNet backward chunk operators (docs/reference/ops_gdn_kda.md §3.2, §4.6, §4.9-§4.11), with
 * fla's layouts: q, k [B, T, H, K]; value-like [B, T, HV, V]; w-like [B, T, HV, K]; gates and beta
 * [B, T, HV]; chunk states [B, NT, HV, K, V]; initial/final states [N, HV, K, V]. HV = G * H (GVA: value
 * head hv reads q/k head hv / G). K <= 256. g is γ, the chunk-local cumsum of the log gates (f32), or NULL
 * (no gate). cu_seqlens: NULL, or int64 [N + 1] on the tensors' device with B == 1 (variable-length packs;
 * chunks restart at every sequence start, chunk c of sequence n is entry chunk_offsets[n] + c of NT).
 * chunk_size: 16, 32 or 64. Float tensors: f32/bf16/f16 (f64 on the CPU), any mix; the last dimension must
 * be contiguous, outer strides are free. Computation in f32 (f64 on the reference); deterministic (fixed
 * reduction orders, no atomics; the same bits for any CPU thread count). */
#ifndef STRATA_OPS_GDN_BWD_H_
#define STRATA_OPS_GDN_BWD_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* chunk_bwd_dv_local (§4.9): dv_j = scale * sum_{i >= j in the chunk} (q_i . k_j) exp(γ_i - γ_j) do_i.
 * Tensors: {q, k, do [B, T, HV, V], g [B, T, HV] or NULL, cu_seqlens or NULL, dv [B, T, HV, V]}. */
STRATA_API strata_status strata_chunk_bwd_dv_local_plan(const strata_tensor_desc* q, const strata_tensor_desc* k,
                                                        const strata_tensor_desc* dout, const strata_tensor_desc* g,
                                                        const strata_tensor_desc* cu_seqlens,
                                                        const strata_tensor_desc* dv, float scale,
                                                        int32_t chunk_size, strata_plan* plan);

/* chunk_gated_delta_rule_bwd_dhu (§4.10): reverse-time state gradient. dS = dht (or 0); per chunk from the
 * last: dh[c] = dS; dv2 = dv + diag(exp(γ_last - γ)) K dS; dS = exp(γ_last) dS + scale (diag(exp γ) Q)^T dO
 * - W^T dv2; dh0 = dS. dh0 is written when given (fla: when h0 exists).
 * Tensors: {q, k, w [B, T, HV, K], do [B, T, HV, V], dv (dv_local) [B, T, HV, V], g or NULL,
 *           dht [N, HV, K, V] or NULL, cu_seqlens or NULL, dh [B, NT, HV, K, V], dh0 [N, HV, K, V] f32 or NULL,
 *           dv2 [B, T, HV, V]}. NT = ceil(T / chunk_size) (fixed length) or the total chunk count (varlen). */
STRATA_API strata_status strata_chunk_gated_delta_rule_bwd_dhu_plan(
    const strata_tensor_desc* q, const strata_tensor_desc* k, const strata_tensor_desc* w,
    const strata_tensor_desc* dout, const strata_tensor_desc* dv, const strata_tensor_desc* g,
    const strata_tensor_desc* dht, const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* dh,
    const strata_tensor_desc* dh0, const strata_tensor_desc* dv2, float scale, int32_t chunk_size,
    strata_plan* plan);

/* chunk_bwd_dqkwg (§4.11): dq, dk (summed over the G value heads of each q/k head, in increasing hv order),
 * dw = -dv h^T (needs dv), dg = the chunk-local dγ (needs g; not reverse-cumsummed).
 * Tensors: {q, k, v (v_new) [B, T, HV, V], do, h [B, NT, HV, K, V], dh [B, NT, HV, K, V], dv (dv2) or NULL,
 *           g or NULL, cu_seqlens or NULL, dq [B, T, H, K], dk [B, T, H, K], dw [B, T, HV, K] or NULL,
 *           dg [B, T, HV] f32 or NULL}. */
STRATA_API strata_status strata_chunk_bwd_dqkwg_plan(
    const strata_tensor_desc* q, const strata_tensor_desc* k, const strata_tensor_desc* v,
    const strata_tensor_desc* dout, const strata_tensor_desc* h, const strata_tensor_desc* dh,
    const strata_tensor_desc* dv, const strata_tensor_desc* g, const strata_tensor_desc* cu_seqlens,
    const strata_tensor_desc* dq, const strata_tensor_desc* dk, const strata_tensor_desc* dw,
    const strata_tensor_desc* dg, float scale, int32_t chunk_size, strata_plan* plan);

/* prepare_wy_repr_bwd (§4.6): backward of w = A diag(β exp γ) K, u = A diag(β) V with A = (I + M)^-1,
 * M = StrictLower(diag(β) K K^T ⊙ Γ). The chunk size is A.shape[3] (16, 32 or 64).
 * Tensors: {k [B, T, H, K], v [B, T, HV, V], beta [B, T, HV], A [B, T, HV, BT], dw [B, T, HV, K],
 *           du [B, T, HV, V], g or NULL, cu_seqlens or NULL, dk [B, T, H, K] (summed over the G value heads),
 *           dv [B, T, HV, V], dbeta [B, T, HV], dg [B, T, HV] f32 or NULL (needs g)}. */
STRATA_API strata_status strata_prepare_wy_repr_bwd_plan(
    const strata_tensor_desc* k, const strata_tensor_desc* v, const strata_tensor_desc* beta,
    const strata_tensor_desc* A, const strata_tensor_desc* dw, const strata_tensor_desc* du,
    const strata_tensor_desc* g, const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* dk,
    const strata_tensor_desc* dv, const strata_tensor_desc* dbeta, const strata_tensor_desc* dg,
    strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_GDN_BWD_H_ */
