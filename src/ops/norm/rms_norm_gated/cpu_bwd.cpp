// rms_norm_gated backward (every activation dtype), for every target of tile::cpu_isas(): one of the
// translation units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/rms_norm_gated/cpu_bwd.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/rms_norm_gated/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
void RngBwdAny(const RmsNormGatedBwdParams& p) {
  visit_kernel_dtype(p.x_dtype, [&](auto t) { BwdRows<decltype(t)>(p); });
}
void RngBwdNative(const RmsNormGatedBwdParams& p) {
  if (p.x_dtype == STRATA_DTYPE_BF16) BwdRows<bf16_t, true>(p);
  else RngBwdAny(p);
}
}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
