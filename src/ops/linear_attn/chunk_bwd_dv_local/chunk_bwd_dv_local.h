// chunk_bwd_dv_local (ops_gdn_kda.md §4.9; README.md beside this file): the intra-chunk part of dL/dv_new.
//
//   q, k [B, T, H, K]; do [B, T, HV, V]; g = γ [B, T, HV] (chunk-local cumsum of the log gates) or absent;
//   dv [B, T, HV, V] (output).  Per chunk [s, e), L = e - s, value head hv, q/k head hv / G:
//     dv_j = scale * Σ_{i = j .. L-1} (q_i · k_j) exp(γ_i - γ_j) do_i        (γ = 0 without a gate)
//
// Internal entry points (callable directly, e.g. by the full chunk_gated_delta_rule backward): fill a
// DvLocalParams (views with offsets applied; gdn_bwd_common.h) and call
//   chunk_bwd_dv_local_reference(p)                    float64 loops, any dtype
//   chunk_bwd_dv_local_cpu(hwy_target)(p)              CPU kernel of one Highway target (f32/bf16/f16)
//   chunk_bwd_dv_local_cuda(p, workspace, stream)      CUDA sm_90 (workspace: chunk_bwd_dv_local_cuda_workspace)
// The CPU kernels assume valid cu_seqlens (check_cu_values first).
#pragma once

#include <string>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

namespace strata::linear_attn {

struct DvLocalParams {
  gdn_bwd::Dims d;
  gdn_bwd::View q, k, dout, g;  // g absent (p == nullptr): no gate
  gdn_bwd::View dv;             // output
  float scale = 1.f;
};

void chunk_bwd_dv_local_reference(const DvLocalParams& p);
// The same loops with f32 arithmetic: the straightforward same-precision computation (ATK acceptance rule).
void chunk_bwd_dv_local_reference_naive(const DvLocalParams& p);
using DvLocalCpuFn = void (*)(const DvLocalParams&);
DvLocalCpuFn chunk_bwd_dv_local_cpu(int64_t hwy_target);

#if STRATA_WITH_CUDA
// The automatic choice (what other operators call): the tensor-core kernel when it applies
// (chunk_bwd_dv_local_cuda_mma_reject(p) is empty: 16-bit token tensors), the f32 FMA kernel otherwise. Its workspace size
// covers both.
size_t chunk_bwd_dv_local_cuda_workspace(const gdn_bwd::Dims& d);
int chunk_bwd_dv_local_cuda(const DvLocalParams& p, void* workspace, void* stream);
// The two kernels, each callable on its own (the implementation list exposes both).
size_t chunk_bwd_dv_local_cuda_fma_workspace(const gdn_bwd::Dims& d);
int chunk_bwd_dv_local_cuda_fma(const DvLocalParams& p, void* workspace, void* stream);
// "" when the tensor-core kernel applies to p (dtypes of the views; run-time pointers are not needed), else why not.
std::string chunk_bwd_dv_local_cuda_mma_reject(const DvLocalParams& p);
size_t chunk_bwd_dv_local_cuda_mma_workspace(const gdn_bwd::Dims& d);
int chunk_bwd_dv_local_cuda_mma(const DvLocalParams& p, void* workspace, void* stream);
#endif

}  // namespace strata::linear_attn
