// clipped_swiglu forward and backward for bf16 activations, for every target of tile::cpu_isas(): one of the
// translation units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/clipped_swiglu/cpu_bf16.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/activation/clipped_swiglu/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::activation::HWY_NAMESPACE {
void CswFwdBf16(const ClippedSwigluFwdParams& p) { FwdRows<false, bf16_t>(p); }
void CswBwdBf16(const ClippedSwigluBwdParams& p) { BwdRows<false, bf16_t>(p); }
#if STRATA_NATIVE_BF16
void CswFwdBf16Native(const ClippedSwigluFwdParams& p) { FwdRows<true, bf16_t>(p); }
void CswBwdBf16Native(const ClippedSwigluBwdParams& p) { BwdRows<true, bf16_t>(p); }
#endif
}  // namespace strata::activation::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
