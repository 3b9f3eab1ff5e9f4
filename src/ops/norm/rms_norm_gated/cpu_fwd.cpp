// rms_norm_gated forward on the CPU, for every target of tile::cpu_isas() (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/rms_norm_gated/cpu_fwd.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/rms_norm_gated/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::norm::HWY_NAMESPACE {

void RngFwd(const RmsNormGatedFwdParams& p) {
  if (p.rows == 0 || p.D == 0) return;
  Visit(p.x_dtype, [&](auto t) { FwdRows<decltype(t)>(p); });
}

}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::norm {
HWY_EXPORT(RngFwd);

RmsNormGatedFwdFn rms_norm_gated_fwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RngFwd, hwy_target); }
}  // namespace strata::norm
#endif
