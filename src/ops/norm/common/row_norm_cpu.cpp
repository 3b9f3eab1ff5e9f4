// Entry points of the row-norm CPU kernels: per target, the run-time dtype picks the instance compiled in one
// of the row_norm_cpu_{fwd,bwd}_<dtype>.cpp units (kernels and build layout: row_norm_cpu-inl.h); this file
// owns the HWY_EXPORT tables the implementation lists read (row_norm_impls.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/common/row_norm_cpu.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/common/row_norm_cpu-inl.h"
#include "tile/cpu/isa.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (row_norm_cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {

void RowNormFwd(const RowNormFwdParams& p) {
  switch (p.x_dtype) {
    case STRATA_DTYPE_F32: RowNormFwdXF32(p); break;
    case STRATA_DTYPE_BF16: RowNormFwdXBf16(p); break;
    default: RowNormFwdXF16(p); break;
  }
}
void RowNormBwd(const RowNormBwdParams& p) {
  switch (p.dx_dtype) {
    case STRATA_DTYPE_F32: RowNormBwdDxF32(p); break;
    case STRATA_DTYPE_BF16: RowNormBwdDxBf16(p); break;
    default: RowNormBwdDxF16(p); break;
  }
}

// The AVX512-BF16 entry points: the native instances on AVX3, the portable ones elsewhere (the same code there;
// only the AVX3 entry is ever dispatched, on CPUs with AVX512-BF16).
void RowNormFwdNativeBf16(const RowNormFwdParams& p) {
#if STRATA_NATIVE_BF16
  switch (p.x_dtype) {
    case STRATA_DTYPE_F32: RowNormFwdXF32Native(p); break;
    case STRATA_DTYPE_BF16: RowNormFwdXBf16Native(p); break;
    default: RowNormFwdXF16Native(p); break;
  }
#else
  RowNormFwd(p);
#endif
}
void RowNormBwdNativeBf16(const RowNormBwdParams& p) {
#if STRATA_NATIVE_BF16
  if (p.dx_dtype == STRATA_DTYPE_BF16) {
    RowNormBwdDxBf16Native(p);
    return;
  }
#endif
  RowNormBwd(p);
}

}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::norm {
HWY_EXPORT(RowNormFwd);
HWY_EXPORT(RowNormBwd);
HWY_EXPORT(RowNormFwdNativeBf16);
HWY_EXPORT(RowNormBwdNativeBf16);

RowNormFwdFn row_norm_fwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RowNormFwd, hwy_target); }
RowNormBwdFn row_norm_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RowNormBwd, hwy_target); }
RowNormFwdFn row_norm_fwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(RowNormFwdNativeBf16, HWY_AVX3); }
RowNormBwdFn row_norm_bwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(RowNormBwdNativeBf16, HWY_AVX3); }
}  // namespace strata::norm
#endif
