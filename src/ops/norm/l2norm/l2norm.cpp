// l2norm: definition, validation and plans (docs/reference/ops_gdn_kda.md §4.1; README.md beside this file).
//   fwd: x [..., D] -> y [..., D] = x * rstd, rstd [...] = 1 / sqrt(sum(x^2) + eps)     tensors {x, y, rstd}
//   bwd: dx = rstd * (dy - dot(dy, y) * y)                                            tensors {y, rstd, dy, dx}
// The kernels are the shared row-norm kernels (ops/norm/common) with n_div = 1.
#include <cmath>

#include "opbase/plan.h"
#include "ops/norm/common/row_norm_impls.h"
#include "runtime/runtime_internal.h"

namespace strata::norm {
namespace {

constexpr const char* kFwd = "l2norm_fwd";
constexpr const char* kBwd = "l2norm_bwd";

const std::initializer_list<int32_t> kFloatIn = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16,
                                                 STRATA_DTYPE_F64};

// f64 tensors are for gradient checks on the CPU; the CUDA kernels are f32/bf16/f16.
strata_status check_f64_on_cpu(const char* op, const char* arg, const strata_tensor_desc& t) {
  if (t.dtype == STRATA_DTYPE_F64 && t.device.type != STRATA_DEVICE_CPU)
    return fail(STRATA_ERROR_INVALID_DTYPE, "{}: {} has dtype f64, which only the CPU supports; {} is {}", op, arg,
                arg, rt::device_str(t.device));
  return STRATA_SUCCESS;
}

// rstd is f32 (f64 when x is f64).
int32_t rstd_dtype_for(int32_t x_dtype) { return x_dtype == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32; }

std::vector<int64_t> leading_shape(const strata_tensor_desc& x) { return {x.shape, x.shape + x.rank - 1}; }

strata_status validate_fwd(const strata_tensor_desc* x, const strata_tensor_desc* y, const strata_tensor_desc* rstd,
                           float eps) {
  STRATA_RETURN_IF_ERROR(check_desc(kFwd, "x", x));
  STRATA_RETURN_IF_ERROR(check_desc(kFwd, "y", y));
  STRATA_RETURN_IF_ERROR(check_desc(kFwd, "rstd", rstd));
  STRATA_RETURN_IF_ERROR(check_same_device(kFwd, "x", *x, *x, "x"));
  STRATA_RETURN_IF_ERROR(check_same_device(kFwd, "y", *y, *x, "x"));
  STRATA_RETURN_IF_ERROR(check_same_device(kFwd, "rstd", *rstd, *x, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype_in(kFwd, "x", *x, kFloatIn));
  STRATA_RETURN_IF_ERROR(check_dtype_in(kFwd, "y", *y, kFloatIn));
  STRATA_RETURN_IF_ERROR(check_dtype_in(kFwd, "rstd", *rstd, {rstd_dtype_for(x->dtype)}));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(kFwd, "x", *x));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(kFwd, "y", *y));
  STRATA_RETURN_IF_ERROR(check_rank_in(kFwd, "x", *x, 1, STRATA_MAX_RANK));
  STRATA_RETURN_IF_ERROR(check_shape_eq(kFwd, "y", *y, shape_of(*x), "the shape of x"));
  STRATA_RETURN_IF_ERROR(check_shape_eq(kFwd, "rstd", *rstd, leading_shape(*x), "x's shape without its last dimension"));
  STRATA_RETURN_IF_ERROR(check_strides(kFwd, "x", *x, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(kFwd, "y", *y, true, false));
  STRATA_RETURN_IF_ERROR(check_strides(kFwd, "rstd", *rstd, true, false));
  if (!std::isfinite(eps) || eps < 0.f)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: eps must be finite and >= 0, got {}", kFwd, eps);
  return STRATA_SUCCESS;
}

strata_status validate_bwd(const strata_tensor_desc* y, const strata_tensor_desc* rstd, const strata_tensor_desc* dy,
                           const strata_tensor_desc* dx) {
  STRATA_RETURN_IF_ERROR(check_desc(kBwd, "y", y));
  STRATA_RETURN_IF_ERROR(check_desc(kBwd, "rstd", rstd));
  STRATA_RETURN_IF_ERROR(check_desc(kBwd, "dy", dy));
  STRATA_RETURN_IF_ERROR(check_desc(kBwd, "dx", dx));
  STRATA_RETURN_IF_ERROR(check_same_device(kBwd, "y", *y, *y, "y"));
  STRATA_RETURN_IF_ERROR(check_same_device(kBwd, "rstd", *rstd, *y, "y"));
  STRATA_RETURN_IF_ERROR(check_same_device(kBwd, "dy", *dy, *y, "y"));
  STRATA_RETURN_IF_ERROR(check_same_device(kBwd, "dx", *dx, *y, "y"));
  STRATA_RETURN_IF_ERROR(check_dtype_in(kBwd, "y", *y, kFloatIn));
  STRATA_RETURN_IF_ERROR(check_dtype_in(kBwd, "rstd", *rstd, {rstd_dtype_for(y->dtype)}));
  STRATA_RETURN_IF_ERROR(check_dtype_in(kBwd, "dy", *dy, kFloatIn));
  STRATA_RETURN_IF_ERROR(check_dtype_in(kBwd, "dx", *dx, kFloatIn));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(kBwd, "y", *y));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(kBwd, "dy", *dy));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(kBwd, "dx", *dx));
  STRATA_RETURN_IF_ERROR(check_rank_in(kBwd, "y", *y, 1, STRATA_MAX_RANK));
  STRATA_RETURN_IF_ERROR(check_shape_eq(kBwd, "rstd", *rstd, leading_shape(*y), "y's shape without its last dimension"));
  STRATA_RETURN_IF_ERROR(check_shape_eq(kBwd, "dy", *dy, shape_of(*y), "the shape of y"));
  STRATA_RETURN_IF_ERROR(check_shape_eq(kBwd, "dx", *dx, shape_of(*y), "the shape of y"));
  STRATA_RETURN_IF_ERROR(check_strides(kBwd, "y", *y, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(kBwd, "rstd", *rstd, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(kBwd, "dy", *dy, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(kBwd, "dx", *dx, true, false));
  return STRATA_SUCCESS;
}

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4096, 128}, device);
  const strata_tensor_desc rstd = make_desc(STRATA_DTYPE_F32, {4096}, device);
  return strata_l2norm_fwd_plan(&x, &x, &rstd, 1e-6f, plan);
}

const OpRegistrar kRegisterFwd({kFwd, [] { return impl_names_of(row_norm_fwd_impls()); }, probe});
const OpRegistrar kRegisterBwd({kBwd, [] { return impl_names_of(row_norm_bwd_impls()); },
                                [](strata_device device, strata_plan* plan) {
                                  const strata_tensor_desc y = make_desc(STRATA_DTYPE_BF16, {4096, 128}, device);
                                  const strata_tensor_desc rstd = make_desc(STRATA_DTYPE_F32, {4096}, device);
                                  return strata_l2norm_bwd_plan(&y, &rstd, &y, &y, plan);
                                }});

}  // namespace
}  // namespace strata::norm

using namespace strata;
using namespace strata::norm;

extern "C" strata_status strata_l2norm_fwd_plan(const strata_tensor_desc* x, const strata_tensor_desc* y,
                                                const strata_tensor_desc* rstd, float eps, strata_plan* plan) {
  PlanKey key(kFwd);
  key.add(x).add(y).add(rstd).add_attr(eps);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    STRATA_RETURN_IF_ERROR(validate_fwd(x, y, rstd, eps));
    RowNormFwdProblem p;
    RowNormFwdParams& k = p.params;
    k.x_dtype = x->dtype;
    k.y_dtype = y->dtype;
    k.rstd_dtype = rstd->dtype;
    k.D = x->shape[x->rank - 1];
    k.rows = numel(*x) / (k.D > 0 ? k.D : 1);
    if (k.D == 0) k.rows = numel(*rstd);
    k.x_rows = make_row_layout(*x, 1);
    k.y_rows = make_row_layout(*y, 1);
    k.rstd_rows = make_row_layout(*rstd, 0);
    k.n_div = 1;
    k.eps = eps;
    p.device = x->device;
    // A row of D == 0 still has an rstd (1/sqrt(eps)); only rows == 0 is empty.
    const PlanInfo info{kFwd, 3, 0b111u, x->device,
                        fmt::format("x:{} y:{} rstd:{} eps={}", desc_str(*x), desc_str(*y), desc_str(*rstd), eps),
                        k.rows == 0};
    return dispatch(info, std::move(p), row_norm_fwd_impls(), out);
  }, plan);
}

extern "C" strata_status strata_l2norm_bwd_plan(const strata_tensor_desc* y, const strata_tensor_desc* rstd,
                                                const strata_tensor_desc* dy, const strata_tensor_desc* dx,
                                                strata_plan* plan) {
  PlanKey key(kBwd);
  key.add(y).add(rstd).add(dy).add(dx);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    STRATA_RETURN_IF_ERROR(validate_bwd(y, rstd, dy, dx));
    RowNormBwdProblem p;
    RowNormBwdParams& k = p.params;
    k.src_dtype = y->dtype;
    k.rstd_dtype = rstd->dtype;
    k.dout_dtype = dy->dtype;
    k.dx_dtype = dx->dtype;
    k.D = y->shape[y->rank - 1];
    k.rows = numel(*rstd);
    k.src_rows = make_row_layout(*y, 1);
    k.rstd_rows = make_row_layout(*rstd, 0);
    k.dout_rows = make_row_layout(*dy, 1);
    k.dx_rows = make_row_layout(*dx, 1);
    k.n_div = 1;
    k.kind = RowNormBwdKind::kNormalizedSrc;
    p.device = y->device;
    const PlanInfo info{kBwd, 4, 0b1111u, y->device,
                        fmt::format("y:{} rstd:{} dy:{} dx:{}", desc_str(*y), desc_str(*rstd), desc_str(*dy),
                                    desc_str(*dx)),
                        k.rows == 0 || k.D == 0};
    return dispatch(info, std::move(p), row_norm_bwd_impls(), out);
  }, plan);
}
