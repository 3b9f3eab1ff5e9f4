// Entry points of the clipped_swiglu CPU kernels: per target, the activation dtype picks the instance compiled in
// one of the units cpu_<dtype>.cpp (kernels and build layout: cpu-inl.h); this file owns the HWY_EXPORT tables
// the implementation lists read (clipped_swiglu.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/clipped_swiglu/cpu.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep (the cpu_isas() targets only)
#include "ops/activation/clipped_swiglu/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::activation::HWY_NAMESPACE {

// f32/bf16/f16 activations (the plan sends f64 to the reference; any other dtype runs as f32, as
// visit_kernel_dtype does).
void CswFwd(const ClippedSwigluFwdParams& p) {
  if (p.rows == 0 || p.I == 0) return;
  switch (p.x_dtype) {
    case STRATA_DTYPE_BF16: CswFwdBf16(p); break;
    case STRATA_DTYPE_F16: CswFwdF16(p); break;
    default: CswFwdF32(p); break;
  }
}
void CswBwd(const ClippedSwigluBwdParams& p) {
  if (p.rows == 0) return;
  switch (p.x_dtype) {
    case STRATA_DTYPE_BF16: CswBwdBf16(p); break;
    case STRATA_DTYPE_F16: CswBwdF16(p); break;
    default: CswBwdF32(p); break;
  }
}
// "cpu.avx512_bf16" (only the AVX3 entries are ever dispatched, on CPUs with AVX512-BF16): bf16 through the native
// instances; f32/f16, and every other target, through the portable ones (the same code there).
void CswFwdNativeBf16(const ClippedSwigluFwdParams& p) {
#if STRATA_NATIVE_BF16
  if (p.x_dtype == STRATA_DTYPE_BF16 && p.rows != 0 && p.I != 0) {
    CswFwdBf16Native(p);
    return;
  }
#endif
  CswFwd(p);
}
void CswBwdNativeBf16(const ClippedSwigluBwdParams& p) {
#if STRATA_NATIVE_BF16
  if (p.x_dtype == STRATA_DTYPE_BF16 && p.rows != 0) {
    CswBwdBf16Native(p);
    return;
  }
#endif
  CswBwd(p);
}

}  // namespace strata::activation::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::activation {
HWY_EXPORT(CswFwd);
HWY_EXPORT(CswBwd);
HWY_EXPORT(CswFwdNativeBf16);
HWY_EXPORT(CswBwdNativeBf16);
ClippedSwigluFwdFn clipped_swiglu_fwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(CswFwd, hwy_target); }
ClippedSwigluBwdFn clipped_swiglu_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(CswBwd, hwy_target); }
ClippedSwigluFwdFn clipped_swiglu_fwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(CswFwdNativeBf16, HWY_AVX3); }
ClippedSwigluBwdFn clipped_swiglu_bwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(CswBwdNativeBf16, HWY_AVX3); }
}  // namespace strata::activation
#endif
