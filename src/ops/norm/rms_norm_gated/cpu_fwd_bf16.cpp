// rms_norm_gated forward for bf16 activations, for every target of tile::cpu_isas(): one of the translation
// units the CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/rms_norm_gated/cpu_fwd_bf16.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/rms_norm_gated/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
void RngFwdBf16(const RmsNormGatedFwdParams& p) { FwdRows<bf16_t>(p); }
#if STRATA_NATIVE_BF16
void RngFwdBf16Native(const RmsNormGatedFwdParams& p) { FwdRows<bf16_t, true>(p); }
#endif
}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
