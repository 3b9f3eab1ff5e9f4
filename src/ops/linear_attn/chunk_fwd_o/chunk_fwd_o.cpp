// chunk_fwd_o (ops_gdn_kda.md §4.8; README.md beside this file): definition and plan.
//   q, k [B,T,H,K], v (= v_new) [B,T,HV,V], h [B,NT,HV,K,V], g optional, cu_seqlens optional -> o [B,T,HV,V]
//   o = scale (diag(e^γ) Q h[c] + Lower(Q Kᵀ ⊙ Γ) Vn) per chunk.
// Kernels, reference and validation are shared by the GDN forward ops (../gdn_common/). Implementations:
// cuda.sm90.chunk_tile, cpu.<isa>, reference.
#include "ops/linear_attn/gdn_common/gdn_fwd_plan.h"

namespace strata::linear_attn::gdn {
namespace {
constexpr FwdOp kOp = FwdOp::kFwdO;
strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc q = make_desc(STRATA_DTYPE_BF16, {1, 4096, 4, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 128}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {1, 4096, 8}, device);
  const strata_tensor_desc h = make_desc(STRATA_DTYPE_BF16, {1, 64, 8, 128, 128}, device);
  return strata_chunk_fwd_o_plan(&q, &q, &v, &h, &g, nullptr, &v, 0.0883883f, 64, plan);
}
const OpRegistrar kRegister({fwd_op_name(kOp), [] { return fwd_impl_names(kOp); }, probe});
}  // namespace
}  // namespace strata::linear_attn::gdn

using namespace strata::linear_attn::gdn;

extern "C" strata_status strata_chunk_fwd_o_plan(const strata_tensor_desc* q, const strata_tensor_desc* k,
                                                 const strata_tensor_desc* v, const strata_tensor_desc* h,
                                                 const strata_tensor_desc* g, const strata_tensor_desc* cu_seqlens,
                                                 const strata_tensor_desc* o, float scale, int32_t chunk_size,
                                                 strata_plan* plan) {
  return make_fwd_plan(FwdOp::kFwdO,
                       {{{"q", q, Role::kQK}, Slot::kQ},
                        {{"k", k, Role::kQK}, Slot::kK},
                        {{"v", v, Role::kVV}, Slot::kV},
                        {{"h", h, Role::kStates}, Slot::kH},
                        {{"g", g, Role::kGate, true}, Slot::kG},
                        {{"cu_seqlens", cu_seqlens, Role::kCu, true}, Slot::kCu},
                        {{"o", o, Role::kVV, false, true}, Slot::kO}},
                       chunk_size, {16, 32, 64}, scale, plan);
}
