// Validation and plan creation shared by the row norms. l2norm and rmsnorm_without_weight differ only in
// n_div (1 or D), the shape of the saved factor ([...] or [..., 1]), the argument names and, for rmsnorm,
// the factor mode; this keeps one copy of the validation rules.
#pragma once

#include "ops/norm/common/row_norm.h"
#include "strata/ops.h"

namespace strata::norm {

struct RowNormFwdSig {
  const char* op;       // "l2norm_fwd"
  const char* names[3];  // argument names {x, y, r}
  bool mean;            // n_div = D, r shape [..., 1]
  bool factor;          // y absent; r any float dtype
};
struct RowNormBwdSig {
  const char* op;
  const char* names[4];  // {src, r, dout, dx}
  bool mean;
  RowNormBwdKind kind;
};

strata_status plan_row_norm_fwd(const RowNormFwdSig& sig, const strata_tensor_desc* x, const strata_tensor_desc* y,
                                const strata_tensor_desc* r, float eps, strata_plan* plan);
strata_status plan_row_norm_bwd(const RowNormBwdSig& sig, const strata_tensor_desc* src,
                                const strata_tensor_desc* r, const strata_tensor_desc* dout,
                                const strata_tensor_desc* dx, strata_plan* plan);

}  // namespace strata::norm
