// Per-target array wrappers of tile/cpu/math-inl.h (see fast_math.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tile/cpu/fast_math.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "tile/cpu/fast_math.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/math-inl.h"
#include "tile/cpu/exp_n-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kind: 0 exp, 1 sigmoid, 2 ExpLp, 3 SigmoidLp, 4 FastExpNonPos, 5 ExpSum, 6 ScaledExpLp with factor 1,
// 7 SigmoidOut16.
template <int kKind>
HWY_INLINE void Apply(const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  auto f = [&](auto v) {
    if constexpr (kKind == 0) return FastExp(df, v);
    else if constexpr (kKind == 1) return FastSigmoid(df, v);
    else if constexpr (kKind == 2) return ExpLp(df, v);
    else if constexpr (kKind == 3) return SigmoidLp(df, v);
    else if constexpr (kKind == 4) return FastExpNonPos(df, v);
    else if constexpr (kKind == 5) return ExpSum(df, v);
    else if constexpr (kKind == 7) return SigmoidOut16(df, v);
    else return ScaledExpLp<decltype(df)>(df, 1.f)(df, v);
  };
  for (; i + N <= n; i += N) hn::StoreU(f(hn::LoadU(df, x + i)), df, y + i);
  if (i < n) {  // the tail through a padded vector, so it takes the same code path
    alignas(64) float buf[hn::MaxLanes(df)] = {};
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    hn::Store(f(hn::Load(df, buf)), df, buf);
    for (int64_t j = i; j < n; ++j) y[j] = buf[j - i];
  }
}
void FastExpArray(const float* x, float* y, int64_t n) { Apply<0>(x, y, n); }
void FastSigmoidArray(const float* x, float* y, int64_t n) { Apply<1>(x, y, n); }
void ExpLpArray(const float* x, float* y, int64_t n) { Apply<2>(x, y, n); }
void SigmoidLpArray(const float* x, float* y, int64_t n) { Apply<3>(x, y, n); }
void ExpNonPosArray(const float* x, float* y, int64_t n) { Apply<4>(x, y, n); }
void ExpSumArray(const float* x, float* y, int64_t n) { Apply<5>(x, y, n); }
void ScaledExpLpArray(const float* x, float* y, int64_t n) { Apply<6>(x, y, n); }
void SigmoidOut16Array(const float* x, float* y, int64_t n) { Apply<7>(x, y, n); }

// Session 17: the four-vector array forms of tile/cpu/exp_n-inl.h (kind 0 FastExpN, 1 ExpSumN, 2 ScaledExpLpN with
// factor 1), over groups of four vectors (the last one padded with zeros), for the same-bits test against the
// one-vector functions.
template <int kKind>
HWY_INLINE void ApplyN(const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  alignas(64) float buf[4 * hn::MaxLanes(df)];
  const ScaledExpLp<hn::ScalableTag<float>> one(df, 1.f);
  for (int64_t i = 0; i < n; i += 4 * N) {
    const int64_t m = std::min<int64_t>(4 * N, n - i);
    for (int64_t j = 0; j < 4 * N; ++j) buf[j] = j < m ? x[i + j] : 0.f;
    hn::Vec<decltype(df)> v[4];
    for (int u = 0; u < 4; ++u) v[u] = hn::Load(df, buf + u * N);
    if constexpr (kKind == 0) FastExpN(df, v);
    else if constexpr (kKind == 1) ExpSumN(df, v);
    else ScaledExpLpN(df, one, v);
    for (int u = 0; u < 4; ++u) hn::Store(v[u], df, buf + u * N);
    for (int64_t j = 0; j < m; ++j) y[i + j] = buf[j];
  }
}
void FastExp4Array(const float* x, float* y, int64_t n) { ApplyN<0>(x, y, n); }
void ExpSum4Array(const float* x, float* y, int64_t n) { ApplyN<1>(x, y, n); }
void ScaledExpLp4Array(const float* x, float* y, int64_t n) { ApplyN<2>(x, y, n); }

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::tile {
HWY_EXPORT(FastExpArray);
HWY_EXPORT(FastSigmoidArray);
HWY_EXPORT(ExpLpArray);
HWY_EXPORT(SigmoidLpArray);
HWY_EXPORT(ExpNonPosArray);
HWY_EXPORT(ExpSumArray);
HWY_EXPORT(ScaledExpLpArray);
HWY_EXPORT(SigmoidOut16Array);
HWY_EXPORT(FastExp4Array);
HWY_EXPORT(ExpSum4Array);
HWY_EXPORT(ScaledExpLp4Array);
FastMathArrayFn fast_exp_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(FastExpArray, hwy_target); }
FastMathArrayFn fast_sigmoid_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(FastSigmoidArray, hwy_target); }
FastMathArrayFn exp_lp_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(ExpLpArray, hwy_target); }
FastMathArrayFn sigmoid_lp_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(SigmoidLpArray, hwy_target); }
FastMathArrayFn exp_nonpos_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(ExpNonPosArray, hwy_target); }
FastMathArrayFn exp_sum_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(ExpSumArray, hwy_target); }
FastMathArrayFn scaled_exp_lp_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(ScaledExpLpArray, hwy_target); }
FastMathArrayFn sigmoid_out16_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(SigmoidOut16Array, hwy_target); }
FastMathArrayFn fast_exp4_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(FastExp4Array, hwy_target); }
FastMathArrayFn exp_sum4_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(ExpSum4Array, hwy_target); }
FastMathArrayFn scaled_exp_lp4_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(ScaledExpLp4Array, hwy_target); }
}  // namespace strata::tile
#endif
