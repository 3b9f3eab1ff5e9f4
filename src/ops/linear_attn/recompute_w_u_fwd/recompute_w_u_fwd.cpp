// recompute_w_u_fwd (ops_gdn_kda.md §4.5; README.md beside this file): definition and plan.
//   k [B,T,H,K], v [B,T,HV,V], beta [B,T,HV], A [B,T,HV,BT] (the inverse), g optional, cu_seqlens optional
//   -> w = A diag(β e^γ) K [B,T,HV,K], u = A diag(β) V [B,T,HV,V].   BT = A.shape[3].
// Kernels, reference and validation are shared by the GDN forward ops (../gdn_common/). Implementations:
// cuda.sm90.wy_tile, cpu.<isa>, reference.
#include "ops/linear_attn/gdn_common/gdn_fwd_plan.h"

namespace strata::linear_attn::gdn {
namespace {
constexpr FwdOp kOp = FwdOp::kRecomputeWU;
strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc k = make_desc(STRATA_DTYPE_BF16, {1, 4096, 4, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 128}, device);
  const strata_tensor_desc gb = make_desc(STRATA_DTYPE_F32, {1, 4096, 8}, device);
  const strata_tensor_desc A = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 64}, device);
  return strata_recompute_w_u_fwd_plan(&k, &v, &gb, &A, &gb, nullptr, &v, &v, plan);
}
const OpRegistrar kRegister({fwd_op_name(kOp), [] { return fwd_impl_names(kOp); }, probe});
}  // namespace
}  // namespace strata::linear_attn::gdn

using namespace strata::linear_attn::gdn;

extern "C" strata_status strata_recompute_w_u_fwd_plan(const strata_tensor_desc* k, const strata_tensor_desc* v,
                                                       const strata_tensor_desc* beta, const strata_tensor_desc* A,
                                                       const strata_tensor_desc* g,
                                                       const strata_tensor_desc* cu_seqlens,
                                                       const strata_tensor_desc* w, const strata_tensor_desc* u,
                                                       strata_plan* plan) {
  const int64_t bt = A && A->rank == 4 ? A->shape[3] : 0;
  return make_fwd_plan(FwdOp::kRecomputeWU,
                       {{{"k", k, Role::kQK}, Slot::kK},
                        {{"v", v, Role::kVV}, Slot::kV},
                        {{"beta", beta, Role::kGate}, Slot::kBeta},
                        {{"A", A, Role::kChunkMat}, Slot::kA},
                        {{"g", g, Role::kGate, true}, Slot::kG},
                        {{"cu_seqlens", cu_seqlens, Role::kCu, true}, Slot::kCu},
                        {{"w", w, Role::kWK, false, true}, Slot::kW},
                        {{"u", u, Role::kVV, false, true}, Slot::kU}},
                       bt, {16, 32, 64}, 1.f, plan);
}
