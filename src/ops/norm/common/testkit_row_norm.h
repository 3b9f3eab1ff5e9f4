// ATK harness shared by the row norms (l2norm, rmsnorm_without_weight): cases, float64 comparison, benchmarks.
#pragma once

#include <memory>

#include "ops/norm/common/row_norm.h"
#include "testkit/testkit.h"

namespace strata::norm {

struct RowNormSpec {
  const char* op;          // "l2norm_fwd"
  bool bwd;                // backward op?
  bool mean;               // n_div = D (rmsnorm) instead of 1 (l2norm)
  bool has_factor_mode;    // rmsnorm: cases also run mode=factor (fwd writes only r [..., 1]; bwd takes dr)
  // Plan creation through the public C API. fwd: (x, y or NULL, r, eps, mode); bwd: (src, r, dout, dx, mode).
  // mode is strata_rmsnorm_mode (l2norm ignores it).
  strata_status (*plan_fwd)(const strata_tensor_desc*, const strata_tensor_desc*, const strata_tensor_desc*, float,
                            int32_t, strata_plan*);
  strata_status (*plan_bwd)(const strata_tensor_desc*, const strata_tensor_desc*, const strata_tensor_desc*,
                            const strata_tensor_desc*, int32_t, strata_plan*);
  // Benchmark shapes: {rows, D} on CPU and on CUDA.
  int64_t cpu_rows, cpu_d, cuda_rows, cuda_d;
};

std::unique_ptr<atk::OpHarness> make_row_norm_harness(const RowNormSpec& spec);

}  // namespace strata::norm
