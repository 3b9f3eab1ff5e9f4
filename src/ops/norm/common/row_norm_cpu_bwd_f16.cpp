// Row-norm backward for f16 dx (every src and dout dtype), for every target of tile::cpu_isas(): one of the
// translation units the row-norm CPU kernels are split into (kernels and build layout: row_norm_cpu-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/common/row_norm_cpu_bwd_f16.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "ops/norm/common/row_norm_cpu-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // the AVX512-BF16 instances (row_norm_cpu-inl.h)
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
void RowNormBwdDxF16(const RowNormBwdParams& p) { BwdForDx<f16_t, false>(p); }
}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
