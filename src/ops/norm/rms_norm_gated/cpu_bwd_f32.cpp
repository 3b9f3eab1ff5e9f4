// rms_norm_gated backward for f32 activations, for every target of tile::cpu_isas(): one of the translation
// units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/rms_norm_gated/cpu_bwd_f32.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/rms_norm_gated/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
void RngBwdF32(const RmsNormGatedBwdParams& p) { BwdRows<float>(p); }
}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
