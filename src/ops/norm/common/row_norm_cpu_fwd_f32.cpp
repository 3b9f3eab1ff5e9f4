// Row-norm forward for f32 x (every y dtype), for every target of tile::cpu_isas(): one of the translation
// units the row-norm CPU kernels are split into (kernels and build layout: row_norm_cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/common/row_norm_cpu_fwd_f32.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/common/row_norm_cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (row_norm_cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
void RowNormFwdXF32(const RowNormFwdParams& p) { FwdForX<float, false>(p); }
#if STRATA_NATIVE_BF16
void RowNormFwdXF32Native(const RowNormFwdParams& p) { FwdForX<float, true>(p); }
#endif
}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
