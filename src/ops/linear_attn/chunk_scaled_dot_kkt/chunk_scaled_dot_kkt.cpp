// chunk_scaled_dot_kkt (ops_gdn_kda.md §4.3; README.md beside this file): definition and plan.
//   k [B,T,H,K], g (= γ) [B,T,HV] optional, beta [B,T,HV], cu_seqlens [N+1] optional -> A [B,T,HV,BT]
//   A[s+i, hv, j] = β_i (k_i·k_j) exp(γ_i − γ_j) for j < i in the chunk, else 0.
// Kernels, reference and validation are shared by the GDN forward ops (../gdn_common/). Implementations:
// cuda.sm90.kkt_tile, cpu.<isa>, reference.
#include "ops/linear_attn/gdn_common/gdn_fwd_plan.h"

namespace strata::linear_attn::gdn {
namespace {
constexpr FwdOp kOp = FwdOp::kKkt;
strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc k = make_desc(STRATA_DTYPE_BF16, {1, 4096, 4, 128}, device);
  const strata_tensor_desc gb = make_desc(STRATA_DTYPE_F32, {1, 4096, 8}, device);
  const strata_tensor_desc A = make_desc(STRATA_DTYPE_F32, {1, 4096, 8, 64}, device);
  return strata_chunk_scaled_dot_kkt_plan(&k, &gb, &gb, nullptr, &A, 64, plan);
}
const OpRegistrar kRegister({fwd_op_name(kOp), [] { return fwd_impl_names(kOp); }, probe});
}  // namespace
}  // namespace strata::linear_attn::gdn

using namespace strata::linear_attn::gdn;

extern "C" strata_status strata_chunk_scaled_dot_kkt_plan(const strata_tensor_desc* k, const strata_tensor_desc* g,
                                                          const strata_tensor_desc* beta,
                                                          const strata_tensor_desc* cu_seqlens,
                                                          const strata_tensor_desc* A, int32_t chunk_size,
                                                          strata_plan* plan) {
  return make_fwd_plan(FwdOp::kKkt,
                       {{{"k", k, Role::kQK}, Slot::kK},
                        {{"g", g, Role::kGate, true}, Slot::kG},
                        {{"beta", beta, Role::kGate}, Slot::kBeta},
                        {{"cu_seqlens", cu_seqlens, Role::kCu, true}, Slot::kCu},
                        {{"A", A, Role::kChunkMat, false, true}, Slot::kAkk}},
                       chunk_size, {16, 32, 64}, 1.f, plan);
}
