// rms_norm_gated backward on the CPU, for every target of tile::cpu_isas() (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/rms_norm_gated/cpu_bwd.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/rms_norm_gated/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::norm::HWY_NAMESPACE {

void RngBwd(const RmsNormGatedBwdParams& p) {
  if (p.D == 0) return;
  Visit(p.x_dtype, [&](auto t) { BwdRows<decltype(t)>(p); });
}

}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::norm {
HWY_EXPORT(RngBwd);

RmsNormGatedBwdFn rms_norm_gated_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RngBwd, hwy_target); }
int64_t rms_norm_gated_cpu_partials(const RmsNormGatedBwdParams& p) {
  if (p.rows == 0 || p.D == 0) return 0;
  return (p.rows + rng_rows_per_block(p.D) - 1) / rng_rows_per_block(p.D);
}
}  // namespace strata::norm
#endif
