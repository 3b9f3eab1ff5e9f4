// l2norm: definition and registration (docs/reference/ops_gdn_kda.md §4.1; README.md beside this file).
//   fwd: x [..., D] -> y [..., D] = x * rstd, rstd [...] = 1 / sqrt(sum(x^2) + eps)     tensors {x, y, rstd}
//   bwd: dx = rstd * (dy - dot(dy, y) * y)                                            tensors {y, rstd, dy, dx}
// Validation, plans and kernels are the shared row-norm ones (ops/norm/common) with n_div = 1.
#include "opbase/plan.h"
#include "ops/norm/common/row_norm_impls.h"
#include "ops/norm/common/row_norm_plan.h"

namespace strata::norm {
namespace {

constexpr RowNormFwdSig kFwd{"l2norm_fwd", {"x", "y", "rstd"}, false, false};
constexpr RowNormBwdSig kBwd{"l2norm_bwd", {"y", "rstd", "dy", "dx"}, false, RowNormBwdKind::kNormalizedSrc};

// `strata info` probes a bf16 [4096, 128] problem (a q/k head batch).
strata_status probe_fwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4096, 128}, device);
  const strata_tensor_desc rstd = make_desc(STRATA_DTYPE_F32, {4096}, device);
  return strata_l2norm_fwd_plan(&x, &x, &rstd, 1e-6f, plan);
}
strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc y = make_desc(STRATA_DTYPE_BF16, {4096, 128}, device);
  const strata_tensor_desc rstd = make_desc(STRATA_DTYPE_F32, {4096}, device);
  return strata_l2norm_bwd_plan(&y, &rstd, &y, &y, plan);
}

const OpRegistrar kRegisterFwd({kFwd.op, [] { return impl_names_of(row_norm_fwd_impls()); }, probe_fwd});
const OpRegistrar kRegisterBwd({kBwd.op, [] { return impl_names_of(row_norm_bwd_impls()); }, probe_bwd});

}  // namespace
}  // namespace strata::norm

extern "C" strata_status strata_l2norm_fwd_plan(const strata_tensor_desc* x, const strata_tensor_desc* y,
                                                const strata_tensor_desc* rstd, float eps, strata_plan* plan) {
  return strata::norm::plan_row_norm_fwd(strata::norm::kFwd, x, y, rstd, eps, plan);
}

extern "C" strata_status strata_l2norm_bwd_plan(const strata_tensor_desc* y, const strata_tensor_desc* rstd,
                                                const strata_tensor_desc* dy, const strata_tensor_desc* dx,
                                                strata_plan* plan) {
  return strata::norm::plan_row_norm_bwd(strata::norm::kBwd, y, rstd, dy, dx, plan);
}
