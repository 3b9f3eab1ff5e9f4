// prepare_wy_repr_bwd (ops_gdn_kda.md §4.6, the backward half of wy_fast; README.md beside this file).
//
//   k [B, T, H, K]; v [B, T, HV, V]; beta [B, T, HV]; A [B, T, HV, BT] (the inverse (I + M)^-1, row = token,
//   column = position inside the token's chunk); dw [B, T, HV, K]; du [B, T, HV, V]; g = γ [B, T, HV] or absent.
//   Outputs dk [B, T, H, K] (summed over the G value heads in increasing hv order), dv [B, T, HV, V],
//   dbeta [B, T, HV], dg [B, T, HV] f32 (needs g: the chunk-local dγ contribution).  Per chunk, E = exp(γ),
//   M = StrictLower(diag(β) K K^T ⊙ Γ), A the L x L block of the given A (entries with column < L):
//     X = A^T dw ; Y = A^T du ; dv = diag(β) Y ; dk = diag(βE) X ; dβ = E ⊙ rowdot(X, K) + rowdot(Y, V)
//     dγ = β ⊙ E ⊙ rowdot(X, K)
//     dM = -StrictLower(A^T StrictLower(dw (diag(βE) K)^T + du (diag(β) V)^T) A^T) ;  dP = dM ⊙ Γ
//     dk += diag(β) dP K + dP^T diag(β) K ;  dβ += rowdot(dP K, K) ;  dγ += rowsum(dM ⊙ M) - colsum(dM ⊙ M)
//
// Internal entry points: WyBwdParams and prepare_wy_repr_bwd_reference(p), prepare_wy_repr_bwd_cpu(hwy_target)(p),
//   prepare_wy_repr_bwd_cuda(p, workspace, stream) (workspace: prepare_wy_repr_bwd_cuda_workspace(d)).
#pragma once

#include <string>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

namespace strata::linear_attn {

struct WyBwdParams {
  gdn_bwd::Dims d;
  gdn_bwd::View k, v, beta, A, dw, du, g;  // g optional
  gdn_bwd::View dk, dv, dbeta, dg;         // outputs; dg (needs g) optional
  // Internal fusion for the composed chunk_gated_delta_rule backward (never set by the public plan): f32 addends
  // of the same shapes as dk / dg; when present the outputs are dk = dk_add + (this op's dk) and dg = dg_add +
  // (this op's dg), each one f32 addition per element (the same bits as adding afterwards; dk_add / dg_add may
  // alias dk / dg: each element is read and then written by one thread). Only the tensor-core CUDA kernel takes
  // them; the other implementations refuse a call that sets them.
  gdn_bwd::View dk_add, dg_add;
  // Internal fusion (the composed backward with l2norm; session 15's kWyFinStaged, restored in session 16): rstd of
  // the keys, f32 [B, T, H]. When present dk is written through the l2norm backward, dk = rstd (y − (y · k) k) with
  // y = dk_add + (this op's dk) and k = p.k (the normalised keys), in dk's dtype, instead of y. Only the two-per-SM
  // tensor-core kernel in the kWyFinStaged form takes it (prepare_wy_repr_bwd_cuda_mma_reject says why not
  // otherwise; the other implementations refuse it).
  gdn_bwd::View dk_rstd;
  // Launch configuration of the tensor-core kernel: kWyAuto (the default: the two-per-SM form that
  // prepare_wy_repr_bwd_auto_variant() names where the two-per-SM kernel applies, else kWyPipelined), kWyPipelined
  // (two cp.async stages of the per-head tiles, K Kᵀ in shared memory, one block per SM), kWyTwoPerSm (one stage, K Kᵀ
  // recomputed per value head in registers, the dβ / dγ row dots from dA's fragments, Sym stored from dP's
  // fragments, five block barriers per head, at most 128 registers and ~99 KiB of shared memory at K = V = 128 so
  // that two blocks share an SM; dk, dv the same bits as kWyPipelined, dβ and dγ sum their terms in another fixed
  // order; dk_add added pair by pair). kWyTwoPerSm takes K and V that round up to the same multiple of 64, at most
  // 128; other shapes run kWyPipelined under every variant. kWyBatchedTyped (session 13): the two-per-SM kernel with
  // each fragment row's dk_add values loaded before its dk stores, each head's dg_add fetched at its start and dv
  // stored by row pointers when it holds the token dtype. Session 14: kWyTrimmed (what kWyAuto ran until session 17, with or
  // without dk_add): kWyBatchedTyped where the two warps whose dP block lies wholly above the diagonal skip its products and
  // element work, and full dv tiles are stored without per-pair checks. Every form gives the same bits as
  // kWyTwoPerSm. Tests and timing force the variants. (Forms that lost are removed: README.md.)
  int mma_variant = 0;
};
// kWyFinStaged (what kWyAuto runs since session 17): kWyTrimmed (the same kernel, the same bits) without dk_rstd; with
// it, dk's l2norm backward runs after the head loop from the head sums staged in shared memory, four threads per row
// (wy_store_dk_norm_staged).
inline constexpr int kWyAuto = 0, kWyPipelined = 1, kWyTwoPerSm = 2, kWyBatchedTyped = 3, kWyTrimmed = 4,
                     kWyFinStaged = 5;

void prepare_wy_repr_bwd_reference(const WyBwdParams& p);
// The same loops with f32 arithmetic: the straightforward same-precision computation (ATK acceptance rule).
void prepare_wy_repr_bwd_reference_naive(const WyBwdParams& p);
using WyBwdCpuFn = void (*)(const WyBwdParams&);
WyBwdCpuFn prepare_wy_repr_bwd_cpu(int64_t hwy_target);

#if STRATA_WITH_CUDA
// The automatic choice (what other operators call): the tensor-core kernel when it applies
// (prepare_wy_repr_bwd_cuda_mma_reject(p) is empty: 16-bit token tensors), the f32 FMA kernel otherwise. Its workspace size
// covers both.
size_t prepare_wy_repr_bwd_cuda_workspace(const gdn_bwd::Dims& d);
int prepare_wy_repr_bwd_cuda(const WyBwdParams& p, void* workspace, void* stream);
// The two kernels, each callable on its own (the implementation list exposes both).
size_t prepare_wy_repr_bwd_cuda_fma_workspace(const gdn_bwd::Dims& d);
int prepare_wy_repr_bwd_cuda_fma(const WyBwdParams& p, void* workspace, void* stream);
// "" when the tensor-core kernel applies to p (dtypes of the views; run-time pointers are not needed), else why not.
std::string prepare_wy_repr_bwd_cuda_mma_reject(const WyBwdParams& p);
size_t prepare_wy_repr_bwd_cuda_mma_workspace(const gdn_bwd::Dims& d);
int prepare_wy_repr_bwd_cuda_mma(const WyBwdParams& p, void* workspace, void* stream);
// The two-per-SM form that kWyAuto runs where the two-per-SM kernel applies (since session 17 kWyFinStaged = kWyTrimmed's
// kernel, which also takes dk_rstd; one form for every call), chosen from GPU timings; host code
// (prepare_wy_repr_bwd.cpp), so that the choice is one place.
int prepare_wy_repr_bwd_auto_variant();
#endif

}  // namespace strata::linear_attn
