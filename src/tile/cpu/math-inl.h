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

// e^xc for xc already in [-104, 89] (FastExp and FastExpNonPos).
template <class DF>
HWY_INLINE hn::Vec<DF> ExpClamped(DF df, hn::Vec<DF> xc) {
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
  return hn::Vec<DF>{_mm512_scalef_ps(p.raw, n.raw)};
#else
  const hn::RebindToSigned<DF> di;
  const auto ni = hn::ConvertTo(di, n);  // in [-150, 129]
  const auto n1 = hn::ShiftRight<1>(ni);
  const auto bias = hn::Set(di, 127);
  const auto s1 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const auto s2 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni, n1), bias)));
  return hn::Mul(hn::Mul(p, s1), s2);
#endif
}

template <class DF>
HWY_INLINE hn::Vec<DF> FastExp(DF df, hn::Vec<DF> x) {
  const auto y = ExpClamped(df, hn::Min(hn::Max(x, hn::Set(df, -104.0f)), hn::Set(df, 89.0f)));
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

// FastExp for arguments <= 0 (or NaN), such as z - max in a softmax sum: the same bits as FastExp there, three
// vector operations fewer (no upper clamp; NaN is kept by the lower clamp written max(lo, x), whose x86
// instruction returns the second operand when one is NaN, instead of a classify and blend; the scalar / EMU128
// targets, whose Max drops a NaN, blend it back). Positive arguments are not clamped at 89: do not pass them.
template <class DF>
HWY_INLINE hn::Vec<DF> FastExpNonPos(DF df, hn::Vec<DF> x) {
  const auto y = ExpClamped(df, hn::Max(hn::Set(df, -104.0f), x));
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  return hn::IfThenElse(hn::IsNaN(x), x, y);
#else
  return y;
#endif
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

// ---- Reduced-precision exp / sigmoid for results that are rounded to bf16 or f16 ----
// A bf16 result keeps 8 significant bits (half an ulp is 2^-9 = 2e-3 relative), an f16 one 11 (2.4e-4); the
// f32-accurate functions above spend about half of a SiLU / SwiGLU row kernel's instructions on bits that this
// rounding removes (the kernels are compute-bound on 2 AVX-512 cores at about half the copy rate). These keep
// the relative error below 4e-6 over the whole float range (measured by tests/cpp/test_tile_fast_math.cpp):
// 1/60 of an f16 half-ulp, 1/500 of a bf16 one, so a rounded result differs from the f32-accurate one only
// where that lies within 4e-6 of a rounding boundary. Callers use them only for values that go straight into
// a bf16/f16 output; f32 outputs and saved statistics keep FastExp / FastSigmoid.
//
// ExpLp(x) = 2^t, t = x log2 e (one rounding: |error| <= 2^-18 ln 2 = 2.6e-6 relative for |t| < 128), split
// as n = round(t), f = t - n (exact) in [-1/2, 1/2], 2^f by a degree-5 polynomial (relative error 1.5e-7,
// coefficients fitted for the minimax relative error), times 2^n (vscalefps on AVX-512, the exponent field
// elsewhere). x is clamped to [-87, 88] first, so n stays in [-126, 127] and the result is normal and finite:
// ExpLp(x) for x < -87 is e^-87 = 1.6e-38 instead of the (subnormal) true value, and for x > 88 it is e^88 =
// 1.7e38 instead of up to +inf; callers use it only where either is exact after their arithmetic (1 / (1 +
// e), a sum with the row maximum subtracted). The clamp is written max(lo, x), min(hi, .), whose x86
// instructions return the second operand when one is NaN, so NaN stays NaN without a blend; the scalar /
// EMU128 targets (whose Min / Max drop a NaN) blend it back. About 12 vector operations on AVX-512.
template <class DF>
HWY_INLINE hn::Vec<DF> ExpLp(DF df, hn::Vec<DF> x) {
  const auto xc = hn::Min(hn::Set(df, 88.0f), hn::Max(hn::Set(df, -87.0f), x));
  const auto t = hn::Mul(xc, hn::Set(df, 1.44269504088896341f));
  const auto n = hn::Round(t);
  const auto f = hn::Sub(t, n);
  auto p = hn::Set(df, 1.327647129073739e-3f);
  p = hn::MulAdd(p, f, hn::Set(df, 9.675541892647743e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.550713092088699e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.4022120237350464e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931469440460205e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0000001192092896f));
#if STRATA_HWY_IS_AVX512
  const auto y = hn::Vec<DF>{_mm512_scalef_ps(p.raw, n.raw)};
#else
  const hn::RebindToSigned<DF> di;
  // n in [-126, 127]: 2^n is the normal float with exponent field n + 127.
  const auto s = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  const auto y = hn::Mul(p, s);
#endif
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  return hn::IfThenElse(hn::IsNaN(x), x, y);
#else
  return y;
#endif
}

// sigmoid(v) = 1 / (1 + e^-v) for bf16/f16 results: relative error below 4e-6 + 7.5e-8 |v| (the exponential's
// error times e / (1 + e) <= 1, plus the reciprocal's; the exponential is ExpLp, on AVX-512 the vreduceps form
// below with ExpLp's polynomial accuracy). 1 + e^-v is finite (the argument is clamped) and >= 1, so on AVX-512
// the 14-bit reciprocal estimate and one Newton step need no guard for infinity (RecipGe1's blend); for v < -87
// the result is 1 / (1 + e^88) = 6e-39 or less (AVX-512: 1 / (1 + 2^127)) where the true value is smaller still
// (an absolute error below FLT_MIN).
// NaN gives NaN.
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidLp(DF df, hn::Vec<DF> v) {
#if STRATA_HWY_IS_AVX512
  // e^-v = 2^t, t = -v log2 e, through vreduceps / vscalefps (see ExpSum below): 2^f by the degree-5 polynomial
  // fitted for the minimax relative error on [0, 1) (7.7e-8; 1.5e-7 with the f32 Horner FMAs, ExpLp's accuracy:
  // the sigmoid also feeds f32 sums, such as rms_norm_gated's dweight, where a degree-4 polynomial's 2.7e-6 bias
  // showed), 13 vector operations per sigmoid instead of 16; relative error below 2e-7 + 7.5e-8 |v|. t is
  // clamped to 127 (min(hi, t) keeps NaN), so 1 + e^-v <= 2^128 (1 - 2^-24) stays finite; v = +inf gives
  // t = -inf, e^-v = 0 and 1.
  const auto t = hn::Min(hn::Set(df, 127.0f), hn::Mul(v, hn::Set(df, -1.44269504088896341f)));
  const auto f = hn::Vec<DF>{_mm512_reduce_ps(t.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
  auto p = hn::MulAdd(hn::Set(df, 1.8777841469272971e-3f), f, hn::Set(df, 8.989127352833748e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.582617223262787e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.4015381932258606e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931530237197876e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.999999403953552e-1f));
  const auto d = hn::Add(hn::Set(df, 1.f), hn::Vec<DF>{_mm512_scalef_ps(p.raw, t.raw)});
  const auto est = hn::ApproximateReciprocal(d);
  return hn::Mul(est, hn::NegMulAdd(d, est, hn::Set(df, 2.f)));
#else
  const auto d = hn::Add(hn::Set(df, 1.f), ExpLp(df, hn::Neg(v)));
  return hn::Div(hn::Set(df, 1.f), d);
#endif
}

// ---- exp through the fraction of x log2 e (AVX-512: vreduceps + vscalefps) ----
// With t = x log2 e, e^x = 2^floor(t) 2^f, f = t - floor(t) in [0, 1). AVX-512 has both halves as single
// instructions: vreduceps (round down, 0 fraction bits) gives f exactly (0 for +-inf, NaN for NaN) and
// vscalefps(p, t) multiplies by 2^floor(t) itself (gradual underflow to 0, overflow to +inf, no clamp and no
// integer conversion). So e^x is one multiply, one vreduceps, a polynomial p(f) ~ 2^f and one vscalefps: ExpSum
// is 9 vector operations (FastExpNonPos: 13), ScaledExpLp 7 (ExpLp times a factor: 13). The price is the rounding
// of t: e^x gets a relative error up to |t| 2^-24 ln 2 (6e-8 |x|) on top of the polynomial's, where the
// Cody-Waite reduction of FastExp keeps it below an ulp. The callers below are the ones where that is harmless.
// Other targets (no such instructions) keep FastExpNonPos / ExpLp, their bits unchanged.
#if STRATA_HWY_IS_AVX512
template <class DF>
HWY_INLINE hn::Vec<DF> FracFloor(DF, hn::Vec<DF> t) {
  return hn::Vec<DF>{_mm512_reduce_ps(t.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
}
template <class DF>
HWY_INLINE hn::Vec<DF> ScaleByExp2Floor(DF, hn::Vec<DF> p, hn::Vec<DF> t) {
  return hn::Vec<DF>{_mm512_scalef_ps(p.raw, t.raw)};
}
#endif

// e^x for the terms of a softmax sum, x = c - m <= 0 (or slightly above 0 after rounding; -inf gives 0, NaN
// NaN). AVX-512: 2^f by the degree-6 polynomial fitted for the minimax relative error on [0, 1) (1.9e-9; with
// the f32 Horner FMAs 6.2e-8, about an ulp), so a term's relative error is below 2^-23 + 7.5e-8 |x| (the
// second part from t: the f32 log2 e is 1.3e-8 off and the product is rounded, random from term to term): the
// error it brings into S = sum e^x is at most 2^-23 S + 7.5e-8 sum |x| e^x, and |x| e^x <= 1/e, so a sum
// dominated by terms near the maximum keeps about f32 accuracy (tests/cpp/test_tile_fast_math.cpp bounds each
// term; the CE conformance cases bound lse and the loss). Other targets: FastExpNonPos (x <= 0 only).
template <class DF>
HWY_INLINE hn::Vec<DF> ExpSum(DF df, hn::Vec<DF> x) {
#if STRATA_HWY_IS_AVX512
  const auto t = hn::Mul(x, hn::Set(df, 1.44269504088896341f));
  const auto f = FracFloor(df, t);
  auto p = hn::Set(df, 2.1704388200305402e-4f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.243936363607645e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.678835049271584e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.548337101936340e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.4022981524467468e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931470036506653e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  return ScaleByExp2Floor(df, p, t);
#else
  return FastExpNonPos(df, x);
#endif
}

// a e^x for a result rounded to bf16 / f16 (the cross-entropy gradient p_coef exp(c - lse)), x <= 0 up to
// rounding: the factor is folded into the coefficients once (per row), so the element costs the multiply by
// log2 e, vreduceps, four FMAs and vscalefps. AVX-512: degree-4 polynomial fitted for the minimax relative error
// on [0, 1) (2.6e-6, 2.7e-6 with the f32 Horner FMAs), plus 7.5e-8 |x| from t (as ExpSum): below 4.2e-6 for
// |x| < 20 and 9.2e-6 at x = -87 where e^x = 1.6e-38 (1/180 of a bf16 half-ulp, 1/20 of an f16 one, which the
// f16 range cannot show below x = -17). Other targets: a * ExpLp(x), the same error as ExpLp.
template <class DF>
struct ScaledExpLp {
  using V = hn::Vec<DF>;
#if STRATA_HWY_IS_AVX512
  V c0, c1, c2, c3, c4;
  ScaledExpLp(DF df, float a)
      : c0(hn::Set(df, a * 1.0000026226043701f)), c1(hn::Set(df, a * 6.930038332939148e-1f)),
        c2(hn::Set(df, a * 2.414427548646927e-1f)), c3(hn::Set(df, a * 5.2011460065841675e-2f)),
        c4(hn::Set(df, a * 1.3534167781472206e-2f)) {}
  HWY_INLINE V operator()(DF df, V x) const {
    const auto t = hn::Mul(x, hn::Set(df, 1.44269504088896341f));
    const auto f = FracFloor(df, t);
    auto p = hn::MulAdd(c4, f, c3);
    p = hn::MulAdd(p, f, c2);
    p = hn::MulAdd(p, f, c1);
    p = hn::MulAdd(p, f, c0);
    return ScaleByExp2Floor(df, p, t);
  }
#else
  V a;
  ScaledExpLp(DF df, float s) : a(hn::Set(df, s)) {}
  HWY_INLINE V operator()(DF df, V x) const { return hn::Mul(a, ExpLp(df, x)); }
#endif
};

// sigmoid(v) for a value rounded straight to bf16 / f16 and read by nothing else (session 11: the forward outputs
// of clipped_swiglu and causal_conv1d; SigmoidLp wherever the sigmoid also feeds an f32 sum or output, such as a
// dweight or dprobs, where a polynomial's bias shows). AVX-512: e^-v = 2^t as in SigmoidLp with 2^f by a degree-3
// polynomial (minimax relative error on [0, 1) 7.5e-5) and 1 / (1 + e^-v) by the 14-bit reciprocal estimate
// without a Newton step (6.1e-5): relative error below 1.4e-4 + 7.5e-8 |v|, 0.07 of a bf16 and 0.3 of an f16
// half-ulp, in 8 vector operations instead of 13. No clamp is needed: e^-v = +inf (v < -88.7) gives 1 / inf = 0,
// v = +inf gives 1, NaN gives NaN. Other targets: SigmoidLp.
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidOut16(DF df, hn::Vec<DF> v) {
#if STRATA_HWY_IS_AVX512
  const auto t = hn::Mul(v, hn::Set(df, -1.44269504088896341f));
  const auto f = hn::Vec<DF>{_mm512_reduce_ps(t.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
  auto p = hn::MulAdd(hn::Set(df, 7.802435010671616e-2f), f, hn::Set(df, 2.2606730461120605e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.958335041999817e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.999251961708069e-1f));
  return hn::ApproximateReciprocal(hn::Add(hn::Set(df, 1.f), hn::Vec<DF>{_mm512_scalef_ps(p.raw, t.raw)}));
#else
  return SigmoidLp(df, v);
#endif
}

// The sigmoid for a kernel whose values are rounded to T: SigmoidLp for bf16 / f16 (2-byte types), FastSigmoid
// for f32.
template <class T, class DF>
HWY_INLINE hn::Vec<DF> SigmoidFor(DF df, hn::Vec<DF> v) {
  if constexpr (sizeof(T) == 2) return SigmoidLp(df, v);
  else return FastSigmoid(df, v);
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
