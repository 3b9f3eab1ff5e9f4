// Sigmoids for bf16/f16 kernels on the targets without AVX-512 (AVX2, SSE4, scalar), where math-inl.h's SigmoidLp
// costs ~21 vector operations and a vdivps: ExpLp's float-to-int conversion is Highway's ConvertTo (vcvttps2dq and
// four fix-up operations for out-of-range lanes that cannot occur after its clamp), 2^n is built and multiplied in
// separately, and 1 / (1 + e) is a division. Here (session 16, causal_conv1d's CPU kernels; include inside
// HWY_NAMESPACE of a per-target file, as math-inl.h):
//   t = -v log2 e, clamped to [-125, 125] (max(lo, t), min(hi, .): NaN stays NaN on x86);
//   r = t + 1.5 2^23 rounds t to the nearest integer n in the low mantissa bits of r (|t| < 2^22), so
//   n = r - 1.5 2^23 and f = t - n in [-1/2, 1/2] are exact, and the bits of r shifted left by 23 are n << 23
//   (1.5 2^23 contributes nothing to the low 9 bits);
//   e^-v = p(f) 2^n by adding n << 23 to the bits of p(f) in [0.70, 1.42] (|n| <= 125: the result stays normal);
//   1 / (1 + e^-v) by the reciprocal estimate (12 bits on x86, relative error < 1.5 2^-12) and one Newton step
//   (relative error < 3 2^-24 after it).
// 16 vector operations (SigmoidLpRcp) and 14 (SigmoidOut16Rcp) on AVX2, no division. NaN: the lanes of a NaN v
// give some value, not NaN, when the NaN's payload has any of its low 9 bits set; the callers multiply the sigmoid
// by v itself (SiLU and its derivative), which keeps the NaN. The clamp at 125: for v > 86.6 e^-v is 2^-125
// (sigmoid 1 either way), for v < -86.6 it is 2^125 p (sigmoid below 6e-38 instead of smaller: an absolute
// error below FLT_MIN's 1e-38 x 6). On AVX-512 both are math-inl.h's SigmoidLp / SigmoidOut16 (vreduceps,
// vscalefps and the 14-bit estimate already), the same bits as before.
// Measured against float64 by tests/cpp/test_tile_sigmoid_rcp.cpp on every ISA of the host.
#if defined(STRATA_TILE_CPU_SIGMOID_RCP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_TILE_CPU_SIGMOID_RCP_INL_H_
#undef STRATA_TILE_CPU_SIGMOID_RCP_INL_H_
#else
#define STRATA_TILE_CPU_SIGMOID_RCP_INL_H_
#endif

#include <hwy/highway.h>

#include "tile/cpu/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if !STRATA_HWY_IS_AVX512
// 1 / (1 + e^-v) with e^-v = p(f) 2^n as described above, p from the coefficients c (highest degree first).
template <int kDeg, class DF>
HWY_INLINE hn::Vec<DF> SigmoidRcpForm(DF df, hn::Vec<DF> v, const float (&c)[kDeg + 1]) {
  const hn::RebindToSigned<DF> di;
  auto t = hn::Mul(v, hn::Set(df, -1.44269504088896341f));
  t = hn::Min(hn::Set(df, 125.0f), hn::Max(hn::Set(df, -125.0f), t));
  const auto magic = hn::Set(df, 12582912.0f);  // 1.5 2^23
  const auto r = hn::Add(t, magic);
  const auto f = hn::Sub(t, hn::Sub(r, magic));
  auto p = hn::Set(df, c[0]);
  for (int k = 1; k <= kDeg; ++k) p = hn::MulAdd(p, f, hn::Set(df, c[k]));
  const auto e = hn::BitCast(df, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, r))));
  const auto d = hn::Add(hn::Set(df, 1.f), e);
  const auto est = hn::ApproximateReciprocal(d);  // and one Newton step
  return hn::Mul(est, hn::NegMulAdd(d, est, hn::Set(df, 2.f)));
}
// ExpLp's degree-5 polynomial for 2^f on [-1/2, 1/2] (relative error 1.5e-7), and a degree-3 one fitted for the
// minimax relative error there (7.5e-5; SigmoidOut16's on AVX-512 is fitted for [0, 1)).
inline constexpr float kSigmoidRcpC5[6] = {1.327647129073739e-3f, 9.675541892647743e-3f, 5.550713092088699e-2f,
                                           2.4022120237350464e-1f, 6.931469440460205e-1f, 1.0000001192092896f};
inline constexpr float kSigmoidRcpC3[4] = {5.5171433836221695e-2f, 2.4261081218719482e-1f, 6.932609677314758e-1f,
                                           9.999281167984009e-1f};
#endif

// SigmoidLpRcp: sigma(v) for kernels whose sigmoid also feeds f32 sums (a backward's dweight): relative error below
// 1e-6 + 7.5e-8 |v| over the float range (measured 2.9e-7: tests/cpp/test_tile_sigmoid_rcp.cpp).
// SigmoidOut16Rcp: sigma(v) for a value rounded straight to bf16 / f16 (a forward's y = v sigma(v)): relative error
// below 1.4e-4 + 7.5e-8 |v| as SigmoidOut16's (measured 7.5e-5): 0.04 of a bf16 and 0.15 of an f16 half-ulp.
// AVX-512: SigmoidLp and SigmoidOut16.
#if STRATA_HWY_IS_AVX512
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidLpRcp(DF df, hn::Vec<DF> v) { return SigmoidLp(df, v); }
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidOut16Rcp(DF df, hn::Vec<DF> v) { return SigmoidOut16(df, v); }
#else
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidLpRcp(DF df, hn::Vec<DF> v) { return SigmoidRcpForm<5>(df, v, kSigmoidRcpC5); }
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidOut16Rcp(DF df, hn::Vec<DF> v) { return SigmoidRcpForm<3>(df, v, kSigmoidRcpC3); }
#endif

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
