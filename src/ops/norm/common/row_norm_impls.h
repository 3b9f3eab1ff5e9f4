// The implementation lists shared by l2norm and rmsnorm_without_weight (both run the row-norm kernels).
#pragma once

#include "ops/norm/common/row_norm.h"
#include "opbase/plan.h"

namespace strata::norm {

struct RowNormFwdProblem {
  RowNormFwdParams params;  // pointers filled at run time
  strata_device device{};
};
struct RowNormBwdProblem {
  RowNormBwdParams params;
  strata_device device{};
};

// Tensor order: fwd {x, y, rstd}; bwd {src, rstd, dout, dx}.
const ImplList<RowNormFwdProblem>& row_norm_fwd_impls();
const ImplList<RowNormBwdProblem>& row_norm_bwd_impls();

}  // namespace strata::norm
