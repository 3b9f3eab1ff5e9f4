// causal_conv1d backward for bf16 activations, for every target of tile::cpu_isas(): one of the translation
// units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/conv/causal_conv1d/cpu_bwd_bf16.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/conv/causal_conv1d/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::conv::HWY_NAMESPACE {
void CausalConv1dBwdBf16(const Conv1dParams& p, float* partials) { Backward<bf16_t, false>(p, partials); }
#if STRATA_NATIVE_BF16
void CausalConv1dBwdBf16Native(const Conv1dParams& p, float* partials) { Backward<bf16_t, true>(p, partials); }
#endif
}  // namespace strata::conv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
