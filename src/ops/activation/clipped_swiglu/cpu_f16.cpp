// clipped_swiglu forward and backward for f16 activations, for every target of tile::cpu_isas(): one of the
// translation units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/clipped_swiglu/cpu_f16.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/activation/clipped_swiglu/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::activation::HWY_NAMESPACE {
void CswFwdF16(const ClippedSwigluFwdParams& p) { FwdRows<false, f16_t>(p); }
void CswBwdF16(const ClippedSwigluBwdParams& p) { BwdRows<false, f16_t>(p); }
}  // namespace strata::activation::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
