// clipped_swiglu forward and backward for f32 activations, for every target of tile::cpu_isas(): one of the
// translation units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/clipped_swiglu/cpu_f32.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/activation/clipped_swiglu/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::activation::HWY_NAMESPACE {
void CswFwdF32(const ClippedSwigluFwdParams& p) { FwdRows<false, float>(p); }
void CswBwdF32(const ClippedSwigluBwdParams& p) { BwdRows<false, float>(p); }
}  // namespace strata::activation::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
