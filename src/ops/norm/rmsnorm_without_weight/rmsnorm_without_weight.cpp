// rmsnorm_without_weight: definition and registration (docs/reference/ops_fused.md §3; README.md beside this).
//   r [..., 1] = 1 / sqrt(mean(x^2) + eps)
//   NORMALIZE  fwd: y = x * r (y [..., D]), r saved (f32)        bwd: dx = r * (dy - x * r^2 * mean(dy * x))
//   FACTOR     fwd: only r (any float dtype)                       bwd: dx = -dr * r^3 * x / D
// Tensors: fwd {x, y (NULL in FACTOR), r}; bwd {x, r, dy or dr, dx}. Validation, plans and kernels are the
// shared row-norm ones (ops/norm/common) with n_div = D.
#include "opbase/plan.h"
#include "ops/norm/common/row_norm_impls.h"
#include "ops/norm/common/row_norm_plan.h"

namespace strata::norm {
namespace {

constexpr const char* kFwdName = "rmsnorm_without_weight_fwd";
constexpr const char* kBwdName = "rmsnorm_without_weight_bwd";

strata_status check_mode(const char* op, int32_t mode) {
  if (mode != STRATA_RMSNORM_NORMALIZE && mode != STRATA_RMSNORM_FACTOR)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE,
                "{}: mode must be STRATA_RMSNORM_NORMALIZE (0) or STRATA_RMSNORM_FACTOR (1), got {}", op, mode);
  return STRATA_SUCCESS;
}

// `strata info` probes the DeepSeek-V4 q-norm shape: bf16 [4096, 512].
strata_status probe_fwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4096, 512}, device);
  const strata_tensor_desc r = make_desc(STRATA_DTYPE_F32, {4096, 1}, device);
  return strata_rmsnorm_without_weight_fwd_plan(&x, &x, &r, 1e-6f, STRATA_RMSNORM_NORMALIZE, plan);
}
strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4096, 512}, device);
  const strata_tensor_desc r = make_desc(STRATA_DTYPE_F32, {4096, 1}, device);
  return strata_rmsnorm_without_weight_bwd_plan(&x, &r, &x, &x, STRATA_RMSNORM_NORMALIZE, plan);
}

const OpRegistrar kRegisterFwd({kFwdName, [] { return impl_names_of(row_norm_fwd_impls()); }, probe_fwd});
const OpRegistrar kRegisterBwd({kBwdName, [] { return impl_names_of(row_norm_bwd_impls()); }, probe_bwd});

}  // namespace
}  // namespace strata::norm

using namespace strata::norm;

extern "C" strata_status strata_rmsnorm_without_weight_fwd_plan(const strata_tensor_desc* x,
                                                                const strata_tensor_desc* y,
                                                                const strata_tensor_desc* r, float eps, int32_t mode,
                                                                strata_plan* plan) {
  // The mode selects the signature (whether y exists), so it is checked before the tensors.
  STRATA_RETURN_IF_ERROR(check_mode(kFwdName, mode));
  const bool factor = mode == STRATA_RMSNORM_FACTOR;
  const RowNormFwdSig sig{kFwdName, {"x", "y", "r"}, true, factor};
  return plan_row_norm_fwd(sig, x, y, r, eps, plan);
}

extern "C" strata_status strata_rmsnorm_without_weight_bwd_plan(const strata_tensor_desc* x,
                                                                const strata_tensor_desc* r,
                                                                const strata_tensor_desc* dout,
                                                                const strata_tensor_desc* dx, int32_t mode,
                                                                strata_plan* plan) {
  STRATA_RETURN_IF_ERROR(check_mode(kBwdName, mode));
  const bool factor = mode == STRATA_RMSNORM_FACTOR;
  const RowNormBwdSig sig{kBwdName, {"x", "r", factor ? "dr" : "dy", "dx"}, true,
                          factor ? RowNormBwdKind::kFactor : RowNormBwdKind::kRawSrc};
  return plan_row_norm_bwd(sig, x, r, dout, dx, plan);
}
