/* Strata operators: chunk_gated_delta_rule (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_CHUNK_GATED_DELTA_RULE_H_
#define STRATA_OPS_CHUNK_GATED_DELTA_RULE_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* chunk_gated_delta_rule (ops_gdn_kda.md §2.1, §4.12): Gated DeltaNet, per sequence n and value head hv
 * (q/k head h = hv / G, G = HV / H), state S [K, V] starting at initial_state[n, hv] (or 0):
 *   S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = scale S^T q_t;  final_state[n, hv] = S.
 * With use_qk_l2norm_in_kernel = 1, q and k are first divided by sqrt(|x|^2 + 1e-6) per head vector.
 *   q, k           [B, T, H, K]   f32/bf16/f16 (f64 on the CPU), 1 <= K <= 256
 *   v, o           [B, T, HV, V]  HV a multiple of H
 *   g, beta        [B, T, HV]     g: log-space decay (<= 0 in practice)
 *   initial_state, final_state  [N, HV, K, V] f32 (f64 on the CPU); both optional (NULL)
 *   cu_seqlens     NULL (N = B rows of T tokens) or int64 [N + 1] with B == 1: sequence n is tokens
 *                  [cu_seqlens[n], cu_seqlens[n+1]) (0 first, non-decreasing, T last; checked before writing)
 * Any element strides with a unit last dimension. Every float tensor may have its own dtype.
 * saved: NULL, or uint8 [strata_chunk_gated_delta_rule_saved_bytes], contiguous, on the tensors' device, its
 * start 256-byte aligned: the forward also writes its residuals there (normalised q, k, gate cumsum, WY factors,
 * the chunk states and corrected values) for the backward below, which then does not re-run the forward. 0 bytes
 * on the CPU (its implementations save nothing; an empty saved is accepted and ignored); a wrong size is an error.
 * Tensors: {q, k, v, g, beta, initial_state, cu_seqlens, o, final_state, saved}. No workspace on the reference;
 * the CPU implementations report scratch in strata_plan_workspace_size. */
STRATA_API strata_status strata_chunk_gated_delta_rule_fwd_plan(
    const strata_tensor_desc* q, const strata_tensor_desc* k, const strata_tensor_desc* v,
    const strata_tensor_desc* g, const strata_tensor_desc* beta, const strata_tensor_desc* initial_state,
    const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* o, const strata_tensor_desc* final_state,
    const strata_tensor_desc* saved, float scale, int32_t use_qk_l2norm_in_kernel, strata_plan* plan);

/* Backward of the forward above, from its inputs: gradients of L(o, final_state) given do = dL/do [B, T, HV, V]
 * and dht = dL/dfinal_state [N, HV, K, V] (NULL = 0). Outputs dq, dk [B, T, H, K] (summed over the G value heads
 * of each q/k head, through the l2norm when on), dv [B, T, HV, V], dg, dbeta [B, T, HV], dh0 [N, HV, K, V] (NULL:
 * not computed). Any float dtypes (states f32 or f64 on the CPU). saved: NULL (everything the backward needs is
 * re-computed from the inputs), or the buffer a forward with the same q, k, v, g, beta, initial_state,
 * cu_seqlens and use_qk_l2norm_in_kernel filled (read only; not checked beyond its size). The workspace holds
 * the per-chunk states and per-value-head dq/dk of the CPU path.
 * Tensors: {q, k, v, g, beta, initial_state, cu_seqlens, do, dht, dq, dk, dv, dg, dbeta, dh0, saved}. */
STRATA_API strata_status strata_chunk_gated_delta_rule_bwd_plan(
    const strata_tensor_desc* q, const strata_tensor_desc* k, const strata_tensor_desc* v,
    const strata_tensor_desc* g, const strata_tensor_desc* beta, const strata_tensor_desc* initial_state,
    const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* d_o, const strata_tensor_desc* dht,
    const strata_tensor_desc* dq, const strata_tensor_desc* dk, const strata_tensor_desc* dv,
    const strata_tensor_desc* dg, const strata_tensor_desc* dbeta, const strata_tensor_desc* dh0,
    const strata_tensor_desc* saved, float scale, int32_t use_qk_l2norm_in_kernel, strata_plan* plan);

/* The byte size of `saved` for these shapes, dtypes and options on q's device (a pure function of them: q, k, v
 * dtypes and shapes, cu_seqlens' length or NULL, use_qk_l2norm_in_kernel; 0 on the CPU and without tokens). On
 * CUDA, per token and value head with dt = 2 bytes when q, k, v share one 16-bit dtype (else 4):
 * (64 + K + V) dt + 4 for A, w, v_new and the gate cumsum, K V dt / 64 for the chunk states, plus with l2norm per
 * token and q/k head 2 (K dt + 4); each part rounded up to 256 bytes. */
STRATA_API strata_status strata_chunk_gated_delta_rule_saved_bytes(const strata_tensor_desc* q,
                                                                   const strata_tensor_desc* k,
                                                                   const strata_tensor_desc* v,
                                                                   const strata_tensor_desc* cu_seqlens,
                                                                   int32_t use_qk_l2norm_in_kernel, uint64_t* bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CHUNK_GATED_DELTA_RULE_H_ */
