#include "ops/norm/common/row_norm_plan.h"

#include <cmath>

#include "opbase/plan.h"
#include "ops/norm/common/row_norm_impls.h"
#include "runtime/runtime_internal.h"

namespace strata::norm {
namespace {

const std::initializer_list<int32_t> kFloat = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16,
                                               STRATA_DTYPE_F64};

// The saved factor: f32 (f64 with f64 inputs); in rmsnorm's factor mode it is a result, any float dtype.
std::initializer_list<int32_t> saved_dtypes(int32_t x_dtype, bool any) {
  static const std::initializer_list<int32_t> f32 = {STRATA_DTYPE_F32}, f64 = {STRATA_DTYPE_F64};
  if (any) return kFloat;
  return x_dtype == STRATA_DTYPE_F64 ? f64 : f32;
}

std::vector<int64_t> saved_shape(const strata_tensor_desc& x, bool keep_one) {
  std::vector<int64_t> s(x.shape, x.shape + x.rank - 1);
  if (keep_one) s.push_back(1);
  return s;
}

strata_status validate_fwd(const RowNormFwdSig& s, const strata_tensor_desc* x, const strata_tensor_desc* y,
                           const strata_tensor_desc* r, float eps) {
  const char *op = s.op, *nx = s.names[0], *ny = s.names[1], *nr = s.names[2];
  STRATA_RETURN_IF_ERROR(check_desc(op, nx, x));
  if (!s.factor) STRATA_RETURN_IF_ERROR(check_desc(op, ny, y));
  if (s.factor && y)
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: {} must be NULL in factor mode (only {} is computed)", op, ny, nr);
  STRATA_RETURN_IF_ERROR(check_desc(op, nr, r));
  STRATA_RETURN_IF_ERROR(check_same_device(op, nx, *x, *x, nx));
  if (y) STRATA_RETURN_IF_ERROR(check_same_device(op, ny, *y, *x, nx));
  STRATA_RETURN_IF_ERROR(check_same_device(op, nr, *r, *x, nx));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, nx, *x, kFloat));
  if (y) STRATA_RETURN_IF_ERROR(check_dtype_in(op, ny, *y, kFloat));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, nr, *r, saved_dtypes(x->dtype, s.factor)));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, nx, *x));
  if (y) STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, ny, *y));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, nr, *r));
  STRATA_RETURN_IF_ERROR(check_rank_in(op, nx, *x, 1, STRATA_MAX_RANK));
  if (y) STRATA_RETURN_IF_ERROR(check_shape_eq(op, ny, *y, shape_of(*x), "the shape of x"));
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, nr, *r, saved_shape(*x, s.mean),
                                        s.mean ? "x's shape with its last dimension 1" : "x's shape without its last dimension"));
  STRATA_RETURN_IF_ERROR(check_strides(op, nx, *x, false, false));
  if (y) STRATA_RETURN_IF_ERROR(check_strides(op, ny, *y, true, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, nr, *r, true, false));
  if (!std::isfinite(eps) || eps < 0.f)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: eps must be finite and >= 0, got {}", op, eps);
  return STRATA_SUCCESS;
}

strata_status validate_bwd(const RowNormBwdSig& s, const strata_tensor_desc* src, const strata_tensor_desc* r,
                           const strata_tensor_desc* dout, const strata_tensor_desc* dx) {
  const char *op = s.op, *ns = s.names[0], *nr = s.names[1], *ng = s.names[2], *nx = s.names[3];
  const bool factor = s.kind == RowNormBwdKind::kFactor;
  STRATA_RETURN_IF_ERROR(check_desc(op, ns, src));
  STRATA_RETURN_IF_ERROR(check_desc(op, nr, r));
  STRATA_RETURN_IF_ERROR(check_desc(op, ng, dout));
  STRATA_RETURN_IF_ERROR(check_desc(op, nx, dx));
  STRATA_RETURN_IF_ERROR(check_same_device(op, ns, *src, *src, ns));
  STRATA_RETURN_IF_ERROR(check_same_device(op, nr, *r, *src, ns));
  STRATA_RETURN_IF_ERROR(check_same_device(op, ng, *dout, *src, ns));
  STRATA_RETURN_IF_ERROR(check_same_device(op, nx, *dx, *src, ns));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, ns, *src, kFloat));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, nr, *r, saved_dtypes(src->dtype, factor)));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, ng, *dout, kFloat));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, nx, *dx, kFloat));
  for (const auto* t : {src, r, dout, dx}) {
    const char* n = t == src ? ns : t == r ? nr : t == dout ? ng : nx;
    STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, n, *t));
  }
  STRATA_RETURN_IF_ERROR(check_rank_in(op, ns, *src, 1, STRATA_MAX_RANK));
  const std::vector<int64_t> rs = saved_shape(*src, s.mean);
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, nr, *r, rs, s.mean ? "the input's shape with its last dimension 1"
                                                               : "the input's shape without its last dimension"));
  if (factor)
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, ng, *dout, rs, "the shape of r"));
  else
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, ng, *dout, shape_of(*src), "the input's shape"));
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, nx, *dx, shape_of(*src), "the input's shape"));
  STRATA_RETURN_IF_ERROR(check_strides(op, ns, *src, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, nr, *r, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, ng, *dout, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, nx, *dx, true, false));
  return STRATA_SUCCESS;
}

}  // namespace

strata_status plan_row_norm_fwd(const RowNormFwdSig& sig, const strata_tensor_desc* x, const strata_tensor_desc* y,
                                const strata_tensor_desc* r, float eps, strata_plan* plan) {
  PlanKey key(sig.op);
  key.add(x).add(y).add(r).add_attr(eps).add_attr(sig.factor);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    STRATA_RETURN_IF_ERROR(validate_fwd(sig, x, y, r, eps));
    RowNormFwdProblem p;
    RowNormFwdParams& k = p.params;
    k.x_dtype = x->dtype;
    k.y_dtype = y ? y->dtype : x->dtype;
    k.rstd_dtype = r->dtype;
    k.D = x->shape[x->rank - 1];
    k.rows = numel(*r);  // one saved value per row (also when D == 0: rstd = 1/sqrt(eps))
    k.x_rows = make_row_layout(*x, 1);
    if (y) k.y_rows = make_row_layout(*y, 1);
    k.rstd_rows = make_row_layout(*r, sig.mean ? 1 : 0);
    k.n_div = sig.mean ? std::max<int64_t>(k.D, 1) : 1;
    k.eps = eps;
    p.device = x->device;
    const std::vector<const strata_tensor_desc*> tensors{x, y, r};
    const PlanInfo info{sig.op, tensors, given_mask_of(tensors), x->device,
                        fmt::format("{}:{} {}:{} {}:{} eps={}", sig.names[0], desc_str(*x), sig.names[1],
                                    y ? desc_str(*y) : std::string("-"), sig.names[2], desc_str(*r), eps),
                        k.rows == 0};
    return dispatch(info, std::move(p), row_norm_fwd_impls(), out);
  }, plan);
}

strata_status plan_row_norm_bwd(const RowNormBwdSig& sig, const strata_tensor_desc* src,
                                const strata_tensor_desc* r, const strata_tensor_desc* dout,
                                const strata_tensor_desc* dx, strata_plan* plan) {
  PlanKey key(sig.op);
  key.add(src).add(r).add(dout).add(dx).add_attr(sig.kind);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    STRATA_RETURN_IF_ERROR(validate_bwd(sig, src, r, dout, dx));
    RowNormBwdProblem p;
    RowNormBwdParams& k = p.params;
    k.src_dtype = src->dtype;
    k.rstd_dtype = r->dtype;
    k.dout_dtype = dout->dtype;
    k.dx_dtype = dx->dtype;
    k.D = src->shape[src->rank - 1];
    k.rows = numel(*r);
    k.src_rows = make_row_layout(*src, 1);
    k.rstd_rows = make_row_layout(*r, sig.mean ? 1 : 0);
    k.dout_rows = make_row_layout(*dout, 1);
    k.dx_rows = make_row_layout(*dx, 1);
    k.n_div = sig.mean ? std::max<int64_t>(k.D, 1) : 1;
    k.kind = sig.kind;
    p.device = src->device;
    const std::vector<const strata_tensor_desc*> tensors{src, r, dout, dx};
    const PlanInfo info{sig.op, tensors, given_mask_of(tensors), src->device,
                        fmt::format("{}:{} {}:{} {}:{} {}:{}", sig.names[0], desc_str(*src), sig.names[1],
                                    desc_str(*r), sig.names[2], desc_str(*dout), sig.names[3], desc_str(*dx)),
                        k.rows == 0 || k.D == 0};
    return dispatch(info, std::move(p), row_norm_bwd_impls(), out);
  }, plan);
}

}  // namespace strata::norm
