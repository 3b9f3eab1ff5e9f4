// Per-target array wrappers of tile/cpu/sigmoid_rcp-inl.h (see sigmoid_rcp.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tile/cpu/sigmoid_rcp.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include <hwy/highway.h>

#include "tile/cpu/isa.h"
#include "tile/cpu/sigmoid_rcp-inl.h"
#include "tile/cpu/sigmoid_rcp.h"

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kOut16: SigmoidOut16Rcp, else SigmoidLpRcp. The tail goes through a padded vector, so it takes the same code.
template <bool kOut16>
HWY_INLINE void ApplySigmoidRcp(const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto f = [&](auto v) {
    if constexpr (kOut16) return SigmoidOut16Rcp(df, v);
    else return SigmoidLpRcp(df, v);
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(f(hn::LoadU(df, x + i)), df, y + i);
  if (i < n) {
    alignas(64) float buf[hn::MaxLanes(df)] = {};
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    hn::Store(f(hn::Load(df, buf)), df, buf);
    for (int64_t j = i; j < n; ++j) y[j] = buf[j - i];
  }
}
void SigmoidLpRcpArray(const float* x, float* y, int64_t n) { ApplySigmoidRcp<false>(x, y, n); }
void SigmoidOut16RcpArray(const float* x, float* y, int64_t n) { ApplySigmoidRcp<true>(x, y, n); }

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::tile {
HWY_EXPORT(SigmoidLpRcpArray);
HWY_EXPORT(SigmoidOut16RcpArray);
FastMathArrayFn sigmoid_lp_rcp_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(SigmoidLpRcpArray, hwy_target); }
FastMathArrayFn sigmoid_out16_rcp_for(int64_t hwy_target) {
  return STRATA_HWY_FOR_TARGET(SigmoidOut16RcpArray, hwy_target);
}
}  // namespace strata::tile
#endif
