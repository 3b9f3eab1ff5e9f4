// ATK registration of l2norm (the harness is shared with rmsnorm_without_weight).
#include "ops/norm/common/testkit_row_norm.h"

namespace strata::atk {

// Benchmark shapes: CUDA [524288, 128] (PERF_TARGETS.md); CPU 256 MiB of bf16, far beyond the caches.
std::unique_ptr<OpHarness> make_l2norm_fwd_harness() {
  return norm::make_row_norm_harness({"l2norm_fwd", false, false, false, norm::RowNormBwdKind::kNormalizedSrc,
                                      strata_l2norm_fwd_plan, nullptr, 1048576, 128, 524288, 128});
}
std::unique_ptr<OpHarness> make_l2norm_bwd_harness() {
  return norm::make_row_norm_harness({"l2norm_bwd", true, false, false, norm::RowNormBwdKind::kNormalizedSrc, nullptr,
                                      strata_l2norm_bwd_plan, 1048576, 128, 524288, 128});
}

}  // namespace strata::atk
