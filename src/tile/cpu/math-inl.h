// Vector exp and sigmoid shared by the CPU kernels (SiLU / sigmoid gates, softmax terms). Include inside
// HWY_NAMESPACE of a file compiled with hwy/foreach_target.h (per-target include guard, as vec-inl.h).
//
// FastExp(x) = 2^n p(r): n = round(x log2 e), r = x - n ln 2 in two FMAs (Cody-Waite: ln 2 = kLn2Hi + kLn2Lo,
// kLn2Hi with 9 significant bits so n * kLn2Hi is exact for |n| < 2^15), |r| <= ln 2 / 2, p the degree-7
// Taylor polynomial of e^r (truncation 0.347^8 / 8! = 5e-9, far below one ulp; the error is the rounding
// of the 7 Horner FMAs and of the final scaling: at most 0.88 ulp with FMA (AVX2, AVX-512), 1.17 ulp
// without, measured against std::exp over the whole float range by tests/cpp/test_tile_fast_math.cpp). 2^n: on AVX-512 one vscalefps, which also makes the
// overflow (+inf), the gradual underflow (subnormals) and 0 exact; elsewhere p * 2^(n/2) * 2^(n - n/2), two
// exact power-of-two factors that stay normal, so the product underflows / overflows with one rounding like
// the real function. x is clamped to [-104, 89] first (exp is 0 below -103.98 and +inf above 88.73 in f32)
// so n stays small; NaN is returned as NaN. About 16 vector operations on AVX-512 (hn::Exp: ~25).
#if defined(STRATA_TILE_CPU_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_TILE_CPU_MATH_INL_H_
#undef STRATA_TILE_CPU_MATH_INL_H_
#else
#define STRATA_TILE_CPU_MATH_INL_H_
#endif

#include <hwy/highway.h>

// The AVX-512 targets of this Highway version (the build compiles HWY_AVX3; AVX3_DL where enabled).
#undef STRATA_HWY_IS_AVX512
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define STRATA_HWY_IS_AVX512 1
#else
#define STRATA_HWY_IS_AVX512 0
#endif

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class DF>
HWY_INLINE hn::Vec<DF> FastExp(DF df, hn::Vec<DF> x) {
  const auto xc = hn::Min(hn::Max(x, hn::Set(df, -104.0f)), hn::Set(df, 89.0f));
  const auto n = hn::Round(hn::Mul(xc, hn::Set(df, 1.44269504088896341f)));
  auto r = hn::MulAdd(n, hn::Set(df, -0.693359375f), xc);  // - n * kLn2Hi (exact product)
  r = hn::MulAdd(n, hn::Set(df, 2.12194440e-4f), r);        // - n * kLn2Lo, kLn2Lo = ln 2 - kLn2Hi < 0
  auto p = hn::Set(df, 1.f / 5040);
  p = hn::MulAdd(p, r, hn::Set(df, 1.f / 720));
  p = hn::MulAdd(p, r, hn::Set(df, 1.f / 120));
  p = hn::MulAdd(p, r, hn::Set(df, 1.f / 24));
  p = hn::MulAdd(p, r, hn::Set(df, 1.f / 6));
  p = hn::MulAdd(p, r, hn::Set(df, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.f));
#if STRATA_HWY_IS_AVX512
  const auto y = hn::Vec<DF>{_mm512_scalef_ps(p.raw, n.raw)};
#else
  const hn::RebindToSigned<DF> di;
  const auto ni = hn::ConvertTo(di, n);  // in [-150, 129]
  const auto n1 = hn::ShiftRight<1>(ni);
  const auto bias = hn::Set(di, 127);
  const auto s1 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const auto s2 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni, n1), bias)));
  const auto y = hn::Mul(hn::Mul(p, s1), s2);
#endif
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

// 1 / d for d >= 1 (the sigmoid denominators): on AVX-512 the 14-bit estimate and one Newton step (below one
// ulp, much cheaper than vdivps); the 12-bit estimate of the other targets would leave ~2 ulp, so they divide.
// d = +inf gives 0, NaN gives NaN.
template <class DF>
HWY_INLINE hn::Vec<DF> RecipGe1(DF df, hn::Vec<DF> d) {
#if STRATA_HWY_IS_AVX512
  const auto est = hn::ApproximateReciprocal(d);
  // est = 0 for d = inf: 0 * (2 - inf * 0) would be NaN, so the Newton step is skipped there.
  const auto nr = hn::Mul(est, hn::NegMulAdd(d, est, hn::Set(df, 2.f)));
  return hn::IfThenElse(hn::Eq(est, hn::Zero(df)), est, nr);
#else
  return hn::Div(hn::Set(df, 1.f), d);
#endif
}

// sigmoid(v) = 1 / (1 + exp(-v)) over the whole float range (1 for large v, NaN for NaN; 0 where exp(-v)
// overflows, v < -88.72, where the true value is below FLT_MIN). At most 2.84 ulp on AVX-512, 2.12 elsewhere
// (tests/cpp/test_tile_fast_math.cpp).
template <class DF>
HWY_INLINE hn::Vec<DF> FastSigmoid(DF df, hn::Vec<DF> v) {
  return RecipGe1(df, hn::Add(hn::Set(df, 1.f), FastExp(df, hn::Neg(v))));
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
