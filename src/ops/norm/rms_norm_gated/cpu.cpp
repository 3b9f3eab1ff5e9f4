// Entry points of the rms_norm_gated CPU kernels: per target, the activation dtype picks the instance compiled
// in one of the units cpu_fwd_<dtype>.cpp / cpu_bwd_<dtype>.cpp (kernels and build layout: cpu-inl.h); this file owns
// the HWY_EXPORT tables the implementation lists read (rms_norm_gated.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/rms_norm_gated/cpu.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/rms_norm_gated/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {

void RngFwd(const RmsNormGatedFwdParams& p) {
  if (p.rows == 0 || p.D == 0) return;
  switch (p.x_dtype) {
    case STRATA_DTYPE_F32: RngFwdF32(p); break;
    case STRATA_DTYPE_BF16: RngFwdBf16(p); break;
    default: RngFwdF16(p); break;
  }
}
// Any dtype other than bf16 / f16 runs as f32 (visit_kernel_dtype's rule; the plan sends f64 to the reference).
void RngBwd(const RmsNormGatedBwdParams& p) {
  if (p.D == 0) return;
  switch (p.x_dtype) {
    case STRATA_DTYPE_BF16: RngBwdBf16(p); break;
    case STRATA_DTYPE_F16: RngBwdF16(p); break;
    default: RngBwdF32(p); break;
  }
}
// The "cpu.avx512_bf16" entries (taken from the AVX3 table only): bf16 through the native-rounding kernels,
// f32 / f16 (and every other target) through the portable ones.
void RngFwdNative(const RmsNormGatedFwdParams& p) {
#if STRATA_NATIVE_BF16
  if (p.x_dtype == STRATA_DTYPE_BF16 && p.rows != 0 && p.D != 0) {
    RngFwdBf16Native(p);
    return;
  }
#endif
  RngFwd(p);
}
void RngBwdNativeEntry(const RmsNormGatedBwdParams& p) {
#if STRATA_NATIVE_BF16
  if (p.x_dtype == STRATA_DTYPE_BF16 && p.D != 0) {
    RngBwdBf16Native(p);
    return;
  }
#endif
  RngBwd(p);
}

}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::norm {
HWY_EXPORT(RngFwd);
HWY_EXPORT(RngBwd);
HWY_EXPORT(RngFwdNative);
HWY_EXPORT(RngBwdNativeEntry);

RmsNormGatedFwdFn rms_norm_gated_fwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RngFwd, hwy_target); }
RmsNormGatedBwdFn rms_norm_gated_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RngBwd, hwy_target); }
RmsNormGatedFwdFn rms_norm_gated_fwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(RngFwdNative, HWY_AVX3); }
RmsNormGatedBwdFn rms_norm_gated_bwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(RngBwdNativeEntry, HWY_AVX3); }
int64_t rms_norm_gated_cpu_partials(const RmsNormGatedBwdParams& p) {
  if (p.rows == 0 || p.D == 0) return 0;
  return (p.rows + rng_rows_per_block(p.D) - 1) / rng_rows_per_block(p.D);
}
}  // namespace strata::norm
#endif
