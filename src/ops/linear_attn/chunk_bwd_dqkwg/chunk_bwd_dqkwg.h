// chunk_bwd_dqkwg (ops_gdn_kda.md §4.11; README.md beside this file): per-chunk gradients of q, k, w and the
// gate (everything but the WY-internal part).
//
//   q, k [B, T, H, K]; v = v_new, do [B, T, HV, V]; h, dh [B, NT, HV, K, V]; dv = dv2 [B, T, HV, V] or absent;
//   g = γ [B, T, HV] or absent;  outputs dq, dk [B, T, H, K] (summed over the G value heads of each q/k head in
//   increasing hv order), dw [B, T, HV, K] (needs dv), dg [B, T, HV] f32 (needs g; chunk-local dγ, not yet
//   reverse-cumsummed).  Per chunk, value head hv, S = h[c], dS = dh[c], E = exp(γ):
//     Ds     = scale Lower((dO Vn^T) ⊙ Γ)                         (diagonal included)
//     dQ     = scale diag(E) dO S^T + Ds K
//     dK_int = diag(exp(γ_last - γ)) Vn dS^T ;   dK = dK_int + Ds^T Q
//     dW     = -dV S^T
//     dγ_i   = q_i·dQ_i - k_i·dK_i ;  dγ_last += exp(γ_last) <S, dS> + Σ_i k_i·dK_int_i
//   Without a gate Γ = 1, E = 1 and there is no dγ.
//
// Internal entry points: DqkwgParams and chunk_bwd_dqkwg_reference(p), chunk_bwd_dqkwg_cpu(hwy_target)(p),
//   chunk_bwd_dqkwg_cuda(p, workspace, stream) (workspace: chunk_bwd_dqkwg_cuda_workspace(d)).
#pragma once

#include <string>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

namespace strata::linear_attn {

struct DqkwgParams {
  gdn_bwd::Dims d;                          // d.NT: chunk dimension of h and dh
  gdn_bwd::View q, k, v, dout, h, dh, dv, g;  // dv, g optional
  gdn_bwd::View dq, dk, dw, dg;             // outputs; dw (needs dv) and dg (needs g) optional
  float scale = 1.f;
  // Launch configuration of the tensor-core kernel: kDqkwgAuto (the default: kDqkwgTwoPerSm), kDqkwgPipelined
  // (8 warps, two cp.async stages, one block per SM), kDqkwgTwoPerSm (8 warps, one stage, the dq / dk sums over
  // the value heads in shared memory, two blocks per SM; the same bits) or kDqkwgWarps16 (16 warps, two stages;
  // the same dq, dk, dw bits, dγ summed in another order) or kDqkwgWgmma (the warpgroup-MMA kernel of
  // cuda_sm90_wgmma.cu where chunk_bwd_dqkwg_cuda_wgmma_reject accepts p, else kDqkwgTwoPerSm; its copy-engine
  // form where that applies: dO, Vn, dV, S, dS by 128-byte-swizzled tensor-map boxes; kDqkwgWgmmaTma the same),
  // or kDqkwgWgmmaCpAsync (that kernel's cp.async form, the automatic one before session 12), or
  // kDqkwgWgmmaUnboundedWait (session 14: the copy-engine form with plain mbarrier waits in the ds group, no trap
  // after 2^24 polls; the same bits; since s14run2 what the copy-engine form runs anyway) or kDqkwgWgmmaBoundedWait
  // (the copy-engine form with the ds group's trap-after-2^24-polls waits, the automatic one until session 14: a
  // debugging aid for hangs). Tests and timing force them.
  int mma_variant = 0;
};
inline constexpr int kDqkwgAuto = 0, kDqkwgPipelined = 1, kDqkwgTwoPerSm = 2, kDqkwgWarps16 = 3, kDqkwgWgmma = 4,
                     kDqkwgWgmmaTma = 5, kDqkwgWgmmaCpAsync = 6, kDqkwgWgmmaUnboundedWait = 7,
                     kDqkwgWgmmaBoundedWait = 8;

void chunk_bwd_dqkwg_reference(const DqkwgParams& p);
// The same loops with f32 arithmetic: the straightforward same-precision computation (ATK acceptance rule).
void chunk_bwd_dqkwg_reference_naive(const DqkwgParams& p);
using DqkwgCpuFn = void (*)(const DqkwgParams&);
DqkwgCpuFn chunk_bwd_dqkwg_cpu(int64_t hwy_target);

#if STRATA_WITH_CUDA
// The automatic choice (what other operators call): the warpgroup-MMA kernel where it applies
// (chunk_bwd_dqkwg_cuda_wgmma_reject(p) is empty), else the mma.sync kernel when chunk_bwd_dqkwg_cuda_mma_reject(p)
// is empty (16-bit token tensors), else the f32 FMA kernel. Its workspace size covers all three.
size_t chunk_bwd_dqkwg_cuda_workspace(const gdn_bwd::Dims& d);
int chunk_bwd_dqkwg_cuda(const DqkwgParams& p, void* workspace, void* stream);
// The two kernels, each callable on its own (the implementation list exposes both).
size_t chunk_bwd_dqkwg_cuda_fma_workspace(const gdn_bwd::Dims& d);
int chunk_bwd_dqkwg_cuda_fma(const DqkwgParams& p, void* workspace, void* stream);
// "" when the tensor-core kernel applies to p (dtypes of the views; run-time pointers are not needed), else why not.
std::string chunk_bwd_dqkwg_cuda_mma_reject(const DqkwgParams& p);
size_t chunk_bwd_dqkwg_cuda_mma_workspace(const gdn_bwd::Dims& d);
int chunk_bwd_dqkwg_cuda_mma(const DqkwgParams& p, void* workspace, void* stream);
// Hopper warpgroup-MMA kernel ("cuda.sm90.wgmma", cuda_sm90_wgmma.cu): bf16 q, k, v, do, h, dh (dv), K = V = 128,
// chunk size 64, strides multiples of 8 elements (the reject says why not); tensors that are not 16-byte aligned
// run the mma.sync kernel instead (hence its workspace size).
std::string chunk_bwd_dqkwg_cuda_wgmma_reject(const DqkwgParams& p);
size_t chunk_bwd_dqkwg_cuda_wgmma_workspace(const gdn_bwd::Dims& d);
// True when chunk_bwd_dqkwg_cuda_wgmma runs its copy-engine form for p (tests: that the form they time runs).
bool chunk_bwd_dqkwg_cuda_wgmma_copy_engine(const DqkwgParams& p);
int chunk_bwd_dqkwg_cuda_wgmma(const DqkwgParams& p, void* workspace, void* stream);
// Session 16: the same kernel (its copy-engine form, unbounded waits) writing dq through the l2norm backward,
//   dq = rstd (dq − q (q · dq))   (q: the kernel's q input, the normalized q; rstd = dq_rstd, f32 [B, T, H]),
// in bf16 (p.dq must be bf16), instead of the f32 head sum that row_norm_bwd (kNormalizedSrc) would read back;
// dk, dw, dγ the same bits as chunk_bwd_dqkwg_cuda_wgmma. The rows are staged in shared memory at each item's end
// (a separate kernel instantiation: the plain one is unchanged). The reject says why it cannot run p from dtypes,
// shapes and strides ("" if it can; plan time); _runs also checks the run-time conditions (pointers aligned, the
// copy-engine form's tensor maps made). Where it does not run, the caller runs chunk_bwd_dqkwg_cuda and
// row_norm_bwd. Workspace: chunk_bwd_dqkwg_cuda_wgmma_workspace.
std::string chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(const DqkwgParams& p, const gdn_bwd::View& dq_rstd);
bool chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs(const DqkwgParams& p, const gdn_bwd::View& dq_rstd);
int chunk_bwd_dqkwg_cuda_wgmma_dq_norm(const DqkwgParams& p, const gdn_bwd::View& dq_rstd, void* workspace,
                                       void* stream);
#endif

}  // namespace strata::linear_attn
