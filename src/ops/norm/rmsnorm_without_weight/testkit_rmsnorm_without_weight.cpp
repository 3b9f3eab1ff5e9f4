// ATK registration of rmsnorm_without_weight: both modes (normalize, factor) run as cases of one harness.
#include "ops/norm/common/testkit_row_norm.h"

namespace strata::atk {

// Benchmark shapes: [32768, 4096] on CUDA and CPU (PERF_TARGETS.md); on the CPU 256 MiB of bf16 in, beyond the
// caches (300 MiB LLC on the development VM, shared by the whole host).
std::unique_ptr<OpHarness> make_rmsnorm_without_weight_fwd_harness() {
  return norm::make_row_norm_harness({"rmsnorm_without_weight_fwd", false, true, true,
                                      strata_rmsnorm_without_weight_fwd_plan, nullptr, 32768, 4096, 32768, 4096});
}
std::unique_ptr<OpHarness> make_rmsnorm_without_weight_bwd_harness() {
  return norm::make_row_norm_harness({"rmsnorm_without_weight_bwd", true, true, true, nullptr,
                                      strata_rmsnorm_without_weight_bwd_plan, 32768, 4096, 32768, 4096});
}

}  // namespace strata::atk
