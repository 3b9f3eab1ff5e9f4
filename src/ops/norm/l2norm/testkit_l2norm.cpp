// ATK registration of l2norm (the harness is shared with rmsnorm_without_weight).
#include "ops/norm/common/testkit_row_norm.h"

namespace strata::atk {
namespace {
strata_status plan_fwd(const strata_tensor_desc* x, const strata_tensor_desc* y, const strata_tensor_desc* r,
                       float eps, int32_t, strata_plan* plan) {
  return strata_l2norm_fwd_plan(x, y, r, eps, plan);
}
strata_status plan_bwd(const strata_tensor_desc* y, const strata_tensor_desc* r, const strata_tensor_desc* dy,
                       const strata_tensor_desc* dx, int32_t, strata_plan* plan) {
  return strata_l2norm_bwd_plan(y, r, dy, dx, plan);
}
}  // namespace

// Benchmark shapes: CUDA [524288, 128] (PERF_TARGETS.md); CPU [1048576, 128], 256 MiB of bf16 in, beyond caches.
std::unique_ptr<OpHarness> make_l2norm_fwd_harness() {
  return norm::make_row_norm_harness({"l2norm_fwd", false, false, false, plan_fwd, nullptr, 1048576, 128, 524288, 128});
}
std::unique_ptr<OpHarness> make_l2norm_bwd_harness() {
  return norm::make_row_norm_harness({"l2norm_bwd", true, false, false, nullptr, plan_bwd, 1048576, 128, 524288, 128});
}

}  // namespace strata::atk
