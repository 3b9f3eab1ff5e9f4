// Entry points of the fused_cross_entropy CPU kernels: per target, the logits dtype picks the instance compiled in
// one of the units cpu_<dtype>.cpp (kernels and build layout: cpu-inl.h); this file owns the HWY_EXPORT tables the
// implementation lists read (fused_cross_entropy.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/loss/fused_cross_entropy/cpu.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/loss/fused_cross_entropy/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instance (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::loss::HWY_NAMESPACE {

// f32/bf16/f16 logits only (the plan sends f64 to the reference).
void FusedCrossEntropy(const CeParams& p, int64_t count) {
  switch (p.dtype) {
    case STRATA_DTYPE_F32: FusedCrossEntropyF32(p, count); break;
    case STRATA_DTYPE_BF16: FusedCrossEntropyBf16(p, count); break;
    default: FusedCrossEntropyF16(p, count); break;
  }
}
// "cpu.avx512_bf16": bf16 gradients rounded by vcvtneps2bf16 (one instruction per 16 instead of about ten integer
// ones; both round to nearest even); the portable instance for f32/f16 and on other targets (only the AVX3 entry is
// ever dispatched, on CPUs with AVX512-BF16).
void FusedCrossEntropyNativeBf16(const CeParams& p, int64_t count) {
#if STRATA_NATIVE_BF16
  if (p.dtype == STRATA_DTYPE_BF16) {
    FusedCrossEntropyBf16Native(p, count);
    return;
  }
#endif
  FusedCrossEntropy(p, count);
}

}  // namespace strata::loss::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::loss {
HWY_EXPORT(FusedCrossEntropy);
HWY_EXPORT(FusedCrossEntropyNativeBf16);

CeCpuFn fused_cross_entropy_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(FusedCrossEntropy, hwy_target); }
CeCpuFn fused_cross_entropy_cpu_native_bf16() {
  return STRATA_HWY_FOR_TARGET(FusedCrossEntropyNativeBf16, HWY_AVX3);
}
}  // namespace strata::loss
#endif
