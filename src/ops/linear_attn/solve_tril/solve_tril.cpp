// solve_tril (ops_gdn_kda.md §4.4; README.md beside this file): definition and plan.
//   A [B,T,H,BT] (strictly lower part used), cu_seqlens optional -> Ai = (I + StrictLower(A))^-1 per chunk.
// BT = A.shape[3] in {16, 32, 64}. Kernels, reference and validation are shared by the GDN forward ops
// (../gdn_common/). Implementations: cuda.sm90.forward_subst, cpu.<isa>, reference.
#include "ops/linear_attn/gdn_common/gdn_fwd_plan.h"

namespace strata::linear_attn::gdn {
namespace {
constexpr FwdOp kOp = FwdOp::kSolveTril;
strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc A = make_desc(STRATA_DTYPE_F32, {1, 4096, 8, 64}, device);
  return strata_solve_tril_plan(&A, nullptr, &A, plan);
}
const OpRegistrar kRegister({fwd_op_name(kOp), [] { return fwd_impl_names(kOp); }, probe});
}  // namespace
}  // namespace strata::linear_attn::gdn

using namespace strata::linear_attn::gdn;

extern "C" strata_status strata_solve_tril_plan(const strata_tensor_desc* A, const strata_tensor_desc* cu_seqlens,
                                                const strata_tensor_desc* Ai, strata_plan* plan) {
  const int64_t bt = A && A->rank == 4 ? A->shape[3] : 0;
  return make_fwd_plan(FwdOp::kSolveTril,
                       {{{"A", A, Role::kChunkMat}, Slot::kAkk},
                        {{"cu_seqlens", cu_seqlens, Role::kCu, true}, Slot::kCu},
                        {{"Ai", Ai, Role::kChunkMat, false, true}, Slot::kA}},
                       bt, {16, 32, 64}, 1.f, plan);
}
