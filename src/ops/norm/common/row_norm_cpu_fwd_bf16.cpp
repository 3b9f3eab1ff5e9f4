// Row-norm forward for bf16 x (every y dtype), for every target of tile::cpu_isas(): one of the translation
// units the row-norm CPU kernels are split into (kernels and build layout: row_norm_cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/common/row_norm_cpu_fwd_bf16.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/common/row_norm_cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (row_norm_cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
void RowNormFwdXBf16(const RowNormFwdParams& p) { FwdForX<bf16_t, false>(p); }
#if STRATA_NATIVE_BF16
void RowNormFwdXBf16Native(const RowNormFwdParams& p) { FwdForX<bf16_t, true>(p); }
#endif
}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
