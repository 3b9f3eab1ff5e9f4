// fused_cross_entropy for bf16 logits, for every target of tile::cpu_isas(): one of the translation units the
// CPU kernels are split into (kernels and build layout: cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/loss/fused_cross_entropy/cpu_bf16.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/loss/fused_cross_entropy/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instance (cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::loss::HWY_NAMESPACE {
void FusedCrossEntropyBf16(const CeParams& p, int64_t count) { RunDtype<false, bf16_t>(p, count); }
#if STRATA_NATIVE_BF16
void FusedCrossEntropyBf16Native(const CeParams& p, int64_t count) { RunDtype<true, bf16_t>(p, count); }
#endif
}  // namespace strata::loss::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
