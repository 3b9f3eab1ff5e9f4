// causal_conv1d backward for f32 activations, for every target of tile::cpu_isas(): one of the translation
// units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/conv/causal_conv1d/cpu_bwd_f32.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/conv/causal_conv1d/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::conv::HWY_NAMESPACE {
void CausalConv1dBwdF32(const Conv1dParams& p, float* partials) { Backward<float, false>(p, partials); }
}  // namespace strata::conv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
