// Per-target array wrappers of tile/cpu/sigmoid_rcp-inl.h (see sigmoid_rcp.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tile/cpu/sigmoid_rcp.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include "tile/cpu/sigmoid_rcp.h"

#include <algorithm>

#include "tile/cpu/isa.h"
#include "tile/cpu/sigmoid_rcp-inl.h"  // hn: hwy::HWY_NAMESPACE

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {

// kOut16: SigmoidOut16Rcp, else SigmoidLpRcp; each piece of one vector through an aligned buffer (zero-padded at
// the tail), so every element takes the same code.
template <bool kOut16>
HWY_INLINE void ApplySigmoidRcp(const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  alignas(64) float buf[hn::MaxLanes(df)];
  for (int64_t i = 0; i < n; i += N) {
    const int64_t m = std::min(N, n - i);
    std::fill(buf, buf + N, 0.f);
    std::copy(x + i, x + i + m, buf);
    const auto v = hn::Load(df, buf);
    if constexpr (kOut16) hn::Store(SigmoidOut16Rcp(df, v), df, buf);
    else hn::Store(SigmoidLpRcp(df, v), df, buf);
    std::copy(buf, buf + m, y + i);
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
