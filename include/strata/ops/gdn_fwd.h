/* Strata operators: gdn_fwd (C API). Included by strata/ops.h; compiles alone.
 *
 * The Gated DeltaNet forward chunk operators (docs/reference/ops_gdn_kda.md §4.3-§4.8; fla's layouts, sequence
 * first). Shapes: q, k [B,T,H,K]; v, u, w, v_new, o [B,T,HV,V|K]; g (= γ, the chunk-local cumsum of the log
 * gates, <= 0 per token before the cumsum), beta [B,T,HV]; A [B,T,HV,BT]; h [B,NT,HV,K,V]; initial_state and
 * final_state [N,HV,K,V]. HV = G*H (GVA: value head hv reads q/k head hv/G), K <= 256, BT = chunk_size in
 * {16, 32, 64}. Variable-length packs: cu_seqlens int64 [N+1] (then B = 1); chunks restart at each sequence;
 * h then has NT = sum ceil(L_n/BT) chunks in sequence order. Float tensors may be f32, bf16 or f16 (f64 on the
 * CPU) independently, with any non-negative element strides; initial_state / final_state are f32 (f64 on the
 * CPU). All math in f32. Optional tensors are NULL descriptors / pointers. Tensor order at run time = the
 * order of the descriptors below. Varlen plans need a workspace of (N+1)*8 bytes (strata_plan_workspace_size).
 */
#ifndef STRATA_OPS_GDN_FWD_H_
#define STRATA_OPS_GDN_FWD_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* chunk_scaled_dot_kkt (§4.3). Tensors {k, g (optional), beta, cu_seqlens (optional), A (out)}:
 *   A[s+i, hv, j] = beta_i (k_i . k_j) exp(g_i - g_j) for j < i inside the chunk, 0 for every other j < BT.
 * Rows past a sequence end do not exist (chunks never straddle sequences). */
STRATA_API strata_status strata_chunk_scaled_dot_kkt_plan(const strata_tensor_desc* k, const strata_tensor_desc* g,
                                                          const strata_tensor_desc* beta,
                                                          const strata_tensor_desc* cu_seqlens,
                                                          const strata_tensor_desc* A, int32_t chunk_size,
                                                          strata_plan* plan);

/* solve_tril (§4.4). Tensors {A, cu_seqlens (optional), Ai (out)}, both [B,T,H,BT] with BT = A.shape[3] in
 * {16,32,64}: Ai = (I + StrictLower(A))^-1 per chunk (A's diagonal and upper part are ignored); Ai is unit
 * lower triangular, 0 above the diagonal and in columns past a partial chunk. */
STRATA_API strata_status strata_solve_tril_plan(const strata_tensor_desc* A, const strata_tensor_desc* cu_seqlens,
                                                const strata_tensor_desc* Ai, strata_plan* plan);

/* recompute_w_u_fwd (§4.5). Tensors {k, v, beta, A, g (optional), cu_seqlens (optional), w (out), u (out)};
 * BT = A.shape[3]: u = A diag(beta) V, w = A diag(beta exp(g)) K per chunk (A's lower part incl. diagonal). */
STRATA_API strata_status strata_recompute_w_u_fwd_plan(const strata_tensor_desc* k, const strata_tensor_desc* v,
                                                       const strata_tensor_desc* beta, const strata_tensor_desc* A,
                                                       const strata_tensor_desc* g,
                                                       const strata_tensor_desc* cu_seqlens,
                                                       const strata_tensor_desc* w, const strata_tensor_desc* u,
                                                       strata_plan* plan);

/* prepare_wy_repr_fwd (§4.6, the forward of wy_fast): kkt + solve_tril + recompute_w_u_fwd fused per chunk.
 * Tensors {k, v, g (optional), beta, cu_seqlens (optional), w (out), u (out), A (out, the inverse)}. */
STRATA_API strata_status strata_prepare_wy_repr_fwd_plan(const strata_tensor_desc* k, const strata_tensor_desc* v,
                                                         const strata_tensor_desc* g, const strata_tensor_desc* beta,
                                                         const strata_tensor_desc* cu_seqlens,
                                                         const strata_tensor_desc* w, const strata_tensor_desc* u,
                                                         const strata_tensor_desc* A, int32_t chunk_size,
                                                         strata_plan* plan);

/* chunk_gated_delta_rule_fwd_h (§4.7). Tensors {k, w, u, g (optional), initial_state (optional),
 * cu_seqlens (optional), h (out), v_new (out, optional), final_state (out, optional)}. Per sequence and value
 * head, S = initial_state (or 0); per chunk: h[c] = S; Vn = U - W S (-> v_new);
 * S = exp(g_last) S + K^T diag(exp(g_last - g)) Vn; final_state = S (= initial_state for an empty sequence). */
STRATA_API strata_status strata_chunk_gated_delta_rule_fwd_h_plan(
    const strata_tensor_desc* k, const strata_tensor_desc* w, const strata_tensor_desc* u,
    const strata_tensor_desc* g, const strata_tensor_desc* initial_state, const strata_tensor_desc* cu_seqlens,
    const strata_tensor_desc* h, const strata_tensor_desc* v_new, const strata_tensor_desc* final_state,
    int32_t chunk_size, strata_plan* plan);

/* chunk_fwd_o (§4.8). Tensors {q, k, v (= v_new), h, g (optional), cu_seqlens (optional), o (out)}:
 * o = scale (diag(exp(g)) Q h[c] + Lower((Q K^T) .* exp(g_i - g_j)) Vn) per chunk (diagonal included). */
STRATA_API strata_status strata_chunk_fwd_o_plan(const strata_tensor_desc* q, const strata_tensor_desc* k,
                                                 const strata_tensor_desc* v, const strata_tensor_desc* h,
                                                 const strata_tensor_desc* g, const strata_tensor_desc* cu_seqlens,
                                                 const strata_tensor_desc* o, float scale, int32_t chunk_size,
                                                 strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_GDN_FWD_H_ */
