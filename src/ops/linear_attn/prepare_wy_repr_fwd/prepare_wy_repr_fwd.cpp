// prepare_wy_repr_fwd (ops_gdn_kda.md §4.6, the forward of wy_fast; README.md beside this file): definition
// and plan. chunk_scaled_dot_kkt + solve_tril + recompute_w_u_fwd fused per chunk:
//   k [B,T,H,K], v [B,T,HV,V], g optional, beta [B,T,HV], cu_seqlens optional
//   -> w [B,T,HV,K], u [B,T,HV,V], A = (I + Akk)^-1 [B,T,HV,BT].
// Kernels, reference and validation are shared by the GDN forward ops (../gdn_common/). Implementations:
// cuda.sm90.prep (prep_wgmma in gdn_fwd_cuda_prep.cu; bf16, K <= 128), cuda.sm90.mma, cuda.sm90.fused_wy, cpu.<isa>,
// reference.
#include "ops/linear_attn/gdn_common/gdn_fwd_plan.h"

namespace strata::linear_attn::gdn {
namespace {
constexpr FwdOp kOp = FwdOp::kPrepareWY;
strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc k = make_desc(STRATA_DTYPE_BF16, {1, 4096, 4, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 128}, device);
  const strata_tensor_desc gb = make_desc(STRATA_DTYPE_F32, {1, 4096, 8}, device);
  const strata_tensor_desc A = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 64}, device);
  return strata_prepare_wy_repr_fwd_plan(&k, &v, &gb, &gb, nullptr, &v, &v, &A, 64, plan);
}
const OpRegistrar kRegister({fwd_op_name(kOp), [] { return fwd_impl_names(kOp); }, probe});
}  // namespace
}  // namespace strata::linear_attn::gdn

using namespace strata::linear_attn::gdn;

extern "C" strata_status strata_prepare_wy_repr_fwd_plan(const strata_tensor_desc* k, const strata_tensor_desc* v,
                                                         const strata_tensor_desc* g, const strata_tensor_desc* beta,
                                                         const strata_tensor_desc* cu_seqlens,
                                                         const strata_tensor_desc* w, const strata_tensor_desc* u,
                                                         const strata_tensor_desc* A, int32_t chunk_size,
                                                         strata_plan* plan) {
  return make_fwd_plan(FwdOp::kPrepareWY,
                       {{{"k", k, Role::kQK}, Slot::kK},
                        {{"v", v, Role::kVV}, Slot::kV},
                        {{"g", g, Role::kGate, true}, Slot::kG},
                        {{"beta", beta, Role::kGate}, Slot::kBeta},
                        {{"cu_seqlens", cu_seqlens, Role::kCu, true}, Slot::kCu},
                        {{"w", w, Role::kWK, false, true}, Slot::kW},
                        {{"u", u, Role::kVV, false, true}, Slot::kU},
                        {{"A", A, Role::kChunkMat, false, true}, Slot::kA}},
                       chunk_size, {16, 32, 64}, 1.f, plan);
}
