// chunk_gated_delta_rule_fwd_h (ops_gdn_kda.md §4.7; README.md beside this file): definition and plan.
//   k [B,T,H,K], w [B,T,HV,K], u [B,T,HV,V], g optional, initial_state [N,HV,K,V] optional, cu_seqlens optional
//   -> h [B,NT,HV,K,V] (chunk-start states), v_new [B,T,HV,V] optional, final_state [N,HV,K,V] optional.
// Kernels, reference and validation are shared by the GDN forward ops (../gdn_common/). Implementations:
// cuda.sm90.state_scan, cpu.<isa>, reference.
#include "ops/linear_attn/gdn_common/gdn_fwd_plan.h"

namespace strata::linear_attn::gdn {
namespace {
constexpr FwdOp kOp = FwdOp::kFwdH;
strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc k = make_desc(STRATA_DTYPE_BF16, {1, 4096, 4, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 128}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {1, 4096, 8}, device);
  const strata_tensor_desc h = make_desc(STRATA_DTYPE_BF16, {1, 64, 8, 128, 128}, device);
  return strata_chunk_gated_delta_rule_fwd_h_plan(&k, &v, &v, &g, nullptr, nullptr, &h, &v, nullptr, 64, plan);
}
const OpRegistrar kRegister({fwd_op_name(kOp), [] { return fwd_impl_names(kOp); }, probe});
}  // namespace
}  // namespace strata::linear_attn::gdn

using namespace strata::linear_attn::gdn;

extern "C" strata_status strata_chunk_gated_delta_rule_fwd_h_plan(
    const strata_tensor_desc* k, const strata_tensor_desc* w, const strata_tensor_desc* u,
    const strata_tensor_desc* g, const strata_tensor_desc* initial_state, const strata_tensor_desc* cu_seqlens,
    const strata_tensor_desc* h, const strata_tensor_desc* v_new, const strata_tensor_desc* final_state,
    int32_t chunk_size, strata_plan* plan) {
  return make_fwd_plan(FwdOp::kFwdH,
                       {{{"k", k, Role::kQK}, Slot::kK},
                        {{"w", w, Role::kWK}, Slot::kW},
                        {{"u", u, Role::kVV}, Slot::kU},
                        {{"g", g, Role::kGate, true}, Slot::kG},
                        {{"initial_state", initial_state, Role::kState0, true}, Slot::kH0},
                        {{"cu_seqlens", cu_seqlens, Role::kCu, true}, Slot::kCu},
                        {{"h", h, Role::kStates, false, true}, Slot::kH},
                        {{"v_new", v_new, Role::kVV, true, true}, Slot::kVNew},
                        {{"final_state", final_state, Role::kState0, true, true}, Slot::kHt}},
                       chunk_size, {16, 32, 64}, 1.f, plan);
}
