// Per-target array wrappers of tile/cpu/sigmoid_nodiv-inl.h (see sigmoid_nodiv.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tile/cpu/sigmoid_nodiv.cpp"
#include "tile/cpu/foreach_isa.h"  // IWYU pragma: keep
#include <hwy/highway.h>

#include "tile/cpu/isa.h"
#include "tile/cpu/sigmoid_nodiv.h"
#include "tile/cpu/sigmoid_nodiv-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// U vectors per step through the array form; the rest one vector at a time, the last partial one padded.
template <bool kOut16, int U>
HWY_INLINE void ApplyNoDiv(const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto step = [&](auto& v) {
    if constexpr (kOut16) SigmoidOut16NoDivN(df, v);
    else SigmoidLpNoDivN(df, v);
  };
  int64_t i = 0;
  for (; i + U * N <= n; i += U * N) {
    V v[U];
    for (int u = 0; u < U; ++u) v[u] = hn::LoadU(df, x + i + u * N);
    step(v);
    for (int u = 0; u < U; ++u) hn::StoreU(v[u], df, y + i + u * N);
  }
  alignas(64) float buf[hn::MaxLanes(df)];
  for (; i < n; i += N) {
    const int64_t m = n - i < N ? n - i : N;
    for (int64_t j = 0; j < N; ++j) buf[j] = j < m ? x[i + j] : 0.f;
    V v[1] = {hn::Load(df, buf)};
    step(v);
    hn::Store(v[0], df, buf);
    for (int64_t j = 0; j < m; ++j) y[i + j] = buf[j];
  }
}
void SigmoidLpNoDiv1(const float* x, float* y, int64_t n) { ApplyNoDiv<false, 1>(x, y, n); }
void SigmoidLpNoDiv4(const float* x, float* y, int64_t n) { ApplyNoDiv<false, 4>(x, y, n); }
void SigmoidOut16NoDiv1(const float* x, float* y, int64_t n) { ApplyNoDiv<true, 1>(x, y, n); }
void SigmoidOut16NoDiv4(const float* x, float* y, int64_t n) { ApplyNoDiv<true, 4>(x, y, n); }

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::tile {
HWY_EXPORT(SigmoidLpNoDiv1);
HWY_EXPORT(SigmoidLpNoDiv4);
HWY_EXPORT(SigmoidOut16NoDiv1);
HWY_EXPORT(SigmoidOut16NoDiv4);
FastMathArrayFn sigmoid_nodiv_for(int64_t hwy_target, bool out16, bool four) {
  if (out16) return four ? STRATA_HWY_FOR_TARGET(SigmoidOut16NoDiv4, hwy_target) : STRATA_HWY_FOR_TARGET(SigmoidOut16NoDiv1, hwy_target);
  return four ? STRATA_HWY_FOR_TARGET(SigmoidLpNoDiv4, hwy_target) : STRATA_HWY_FOR_TARGET(SigmoidLpNoDiv1, hwy_target);
}
}  // namespace strata::tile
#endif
