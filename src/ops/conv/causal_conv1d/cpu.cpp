// Entry points of the causal_conv1d CPU kernels: per target, the activation dtype picks the instance compiled
// in one of the units cpu_fwd_<dtype>.cpp / cpu_bwd_<dtype>.cpp (kernels and build layout: cpu-inl.h); this file owns
// the HWY_EXPORT tables the implementation lists read (causal_conv1d.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/conv/causal_conv1d/cpu.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/conv/causal_conv1d/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::conv::HWY_NAMESPACE {

// f32/bf16/f16 activations only (f64 goes to the reference).
void CausalConv1dFwd(const Conv1dParams& p, void*) {
  switch (p.x_dtype) {
    case STRATA_DTYPE_F32: CausalConv1dFwdF32(p); break;
    case STRATA_DTYPE_BF16: CausalConv1dFwdBf16(p); break;
    default: CausalConv1dFwdF16(p); break;
  }
}
void CausalConv1dBwd(const Conv1dParams& p, void* workspace) {
  float* partials = static_cast<float*>(workspace);
  switch (p.x_dtype) {
    case STRATA_DTYPE_F32: CausalConv1dBwdF32(p, partials); break;
    case STRATA_DTYPE_BF16: CausalConv1dBwdBf16(p, partials); break;
    default: CausalConv1dBwdF16(p, partials); break;
  }
}

// The "cpu.avx512_bf16" entry points: bf16 outputs rounded by AVX512-BF16 on AVX3; the portable instances for
// the other dtypes and targets (only the AVX3 entry is ever dispatched, on CPUs with AVX512-BF16).
void CausalConv1dFwdNativeBf16(const Conv1dParams& p, void* workspace) {
#if STRATA_NATIVE_BF16
  if (p.x_dtype == STRATA_DTYPE_BF16) {
    CausalConv1dFwdBf16Native(p);
    return;
  }
#endif
  CausalConv1dFwd(p, workspace);
}
void CausalConv1dBwdNativeBf16(const Conv1dParams& p, void* workspace) {
#if STRATA_NATIVE_BF16
  if (p.x_dtype == STRATA_DTYPE_BF16) {
    CausalConv1dBwdBf16Native(p, static_cast<float*>(workspace));
    return;
  }
#endif
  CausalConv1dBwd(p, workspace);
}

}  // namespace strata::conv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::conv {
HWY_EXPORT(CausalConv1dFwd);
HWY_EXPORT(CausalConv1dBwd);
HWY_EXPORT(CausalConv1dFwdNativeBf16);
HWY_EXPORT(CausalConv1dBwdNativeBf16);

Conv1dCpuFn causal_conv1d_fwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(CausalConv1dFwd, hwy_target); }
Conv1dCpuFn causal_conv1d_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(CausalConv1dBwd, hwy_target); }
Conv1dCpuFn causal_conv1d_fwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(CausalConv1dFwdNativeBf16, HWY_AVX3); }
Conv1dCpuFn causal_conv1d_bwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(CausalConv1dBwdNativeBf16, HWY_AVX3); }

size_t causal_conv1d_cpu_bwd_workspace(const Conv1dParams& p) {
  return static_cast<size_t>(p.B * tiles_per_row(p, kTimeTile) * (p.W + 1) * p.D) * sizeof(float);
}
}  // namespace strata::conv
#endif
