// Array forms of the exponentials of tile/cpu/math-inl.h for the targets without AVX-512 (tv::ExpSum: ExpSumN; since
// session 17 also tv::FastExp: FastExpN and tv::ScaledExpLp: ScaledExpLpN, for fused_cross_entropy's gradient sweep):
// ExpSumN<U> takes U vectors in place and writes every step as a loop over them (unrolled), so the out-of-order
// core overlaps U independent dependency chains, as the sigmoids of tile/cpu/sigmoid_nodiv-inl.h (session 16
// found on the AMD EPYC Zen 3 CI machine that loops handling one vector per step keep the FP scheduler full at
// ~1.6 instructions per cycle). On x86 without AVX-512 (AVX2, SSE4) it is FastExpNonPos with the same bits and
// four vector operations fewer: n = round(t) comes from a = t + 1.5 2^23 (round to nearest even, as vroundps,
// for |t| < 2^22; here t = x log2 e in [-150.1, 0.x] after the clamp at -104), n = a - 1.5 2^23 as a float
// (exact) and the integer n as the bit difference of a and 1.5 2^23 (one integer subtract; Highway's ConvertTo
// costs five operations on AVX2 with its overflow fix-up). So every lane gets exactly FastExpNonPos's n, r, p and
// scaling: the same bits. NaN: the clamp keeps it (x86 max returns its second operand), p is NaN, the result NaN.
// AVX-512 and the scalar / EMU128 / non-x86 targets: tv::ExpSum per vector, unchanged.
// Include inside HWY_NAMESPACE users compiled with hwy/foreach_target.h (per-target include guard).
#if defined(STRATA_TILE_CPU_EXP_N_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_TILE_CPU_EXP_N_INL_H_
#undef STRATA_TILE_CPU_EXP_N_INL_H_
#else
#define STRATA_TILE_CPU_EXP_N_INL_H_
#endif

#include <hwy/highway.h>

#include "tile/cpu/math-inl.h"

#undef STRATA_EXP_N_MAGIC
#define STRATA_EXP_N_MAGIC \
  (HWY_ARCH_X86 && !STRATA_HWY_IS_AVX512 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128)

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if STRATA_EXP_N_MAGIC
// ExpClamped (tile/cpu/math-inl.h) for U vectors xc already in [-104, 89], each result e_u given to sink(u, e_u): n = round(xc log2 e) by the
// magic-number add, the Cody-Waite reduction, the degree-7 Taylor polynomial and 2^n. Session 17: when every n of
// the U vectors lies in [-126, 127] (for softmax terms: every x above about -87.3, all of a real row), 2^n is a
// normal float and p 2^n is one multiply by it (3 operations per vector instead of ExpClamped's 8 for its two
// factors 2^(n/2) 2^(n - n/2)): the same bits, since either way the exact p 2^n is rounded once (p 2^(n/2) is exact,
// p being in [0.7, 1.5]). The check costs U - 1 integer minima (and maxima unless kNonPos: the caller's arguments
// are <= 0 up to rounding, so n <= 1), a compare and a mask test per U vectors. The sink is called in both branches
// so that what it does with e_u compiles as it did after ExpClamped (GCC contracts e_u + acc into one FMA there, in
// both forms the one rounding of p 2^n + acc).
template <int U, bool kNonPos, class DF, class Sink>
HWY_INLINE void ExpClampedN(DF df, const hn::Vec<DF> (&xc)[U], Sink&& sink) {
  const hn::RebindToSigned<DF> di;
  const auto magic = hn::Set(df, 12582912.f);  // 1.5 * 2^23
  hn::Vec<DF> n[U], r[U], p[U];
  hn::Vec<decltype(di)> ni[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    auto t = hn::Mul(xc[u], hn::Set(df, 1.44269504088896341f));
    // t must be rounded before the add (GCC contracts vector mul + add into an FMA by default, which would round
    // the exact product instead and change n in rare lanes): an empty asm makes t opaque, at no cost.
    asm("" : "+x"(t.raw));
    const auto a = hn::Add(t, magic);
    n[u] = hn::Sub(a, magic);
    ni[u] = hn::Sub(hn::BitCast(di, a), hn::BitCast(di, magic));
    r[u] = hn::MulAdd(n[u], hn::Set(df, -0.693359375f), xc[u]);  // ExpClamped's Cody-Waite reduction
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) r[u] = hn::MulAdd(n[u], hn::Set(df, 2.12194440e-4f), r[u]);
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) p[u] = hn::MulAdd(hn::Set(df, 1.f / 5040), r[u], hn::Set(df, 1.f / 720));
  constexpr float kC[6] = {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
#pragma GCC unroll 8
  for (int k = 0; k < 6; ++k) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = hn::MulAdd(p[u], r[u], hn::Set(df, kC[k]));
  }
  const auto bias = hn::Set(di, 127);
  auto lo = ni[0], hi = ni[0];
#pragma GCC unroll 8
  for (int u = 1; u < U; ++u) {
    lo = hn::Min(lo, ni[u]);
    if constexpr (!kNonPos) hi = hn::Max(hi, ni[u]);
  }
  auto normal = hn::Gt(lo, hn::Set(di, -127));  // n >= -126 (this Highway has no integer Ge / Le)
  if constexpr (!kNonPos) normal = hn::And(normal, hn::Gt(hn::Set(di, 128), hi));  // n <= 127
  if (hn::AllTrue(di, normal)) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) sink(u, hn::Mul(p[u], hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(ni[u], bias)))));
    return;
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const auto n1 = hn::ShiftRight<1>(ni[u]);
    const auto s1 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(n1, bias)));
    const auto s2 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni[u], n1), bias)));
    sink(u, hn::Mul(hn::Mul(p[u], s1), s2));
  }
}
#endif

// e^x for U vectors of softmax terms (x <= 0 up to rounding, or NaN): tv::ExpSum's bits, e_u given to sink(u, e_u)
// (in place: ExpSumN below).
template <int U, class DF, class Sink>
HWY_INLINE void ExpSumN(DF df, const hn::Vec<DF> (&v)[U], Sink&& sink) {
#if STRATA_EXP_N_MAGIC
  hn::Vec<DF> xc[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) xc[u] = hn::Max(hn::Set(df, -104.0f), v[u]);  // FastExpNonPos's clamp (keeps NaN)
  ExpClampedN<U, true>(df, xc, sink);
#else
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) sink(u, ExpSum(df, v[u]));
#endif
}
template <int U, class DF>
HWY_INLINE void ExpSumN(DF df, hn::Vec<DF> (&v)[U]) {
  ExpSumN(df, v, [&](int u, hn::Vec<DF> e) { v[u] = e; });
}

// e^x for U vectors, in place: tv::FastExp's bits (the whole float range; NaN blended back). Session 17: the
// backward's gradient sweep (fused_cross_entropy RowGrad).
template <int U, class DF>
HWY_INLINE void FastExpN(DF df, hn::Vec<DF> (&v)[U]) {
#if STRATA_EXP_N_MAGIC
  hn::Vec<DF> xc[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) xc[u] = hn::Min(hn::Max(v[u], hn::Set(df, -104.0f)), hn::Set(df, 89.0f));  // FastExp's
  ExpClampedN<U, false>(df, xc, [&](int u, hn::Vec<DF> e) { v[u] = hn::IfThenElse(hn::IsNaN(v[u]), v[u], e); });
#else
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) v[u] = FastExp(df, v[u]);
#endif
}

// f.a e^x for U vectors (f = ScaledExpLp(df, a)), in place: ScaledExpLp's bits (on x86 without AVX-512: a times
// ExpLp, whose x is clamped to [-87, 88], t = x log2 e rounded once, f = t - n exact, a degree-5 polynomial in f, and
// 2^n through the exponent field).
template <int U, class DF>
HWY_INLINE void ScaledExpLpN(DF df, const ScaledExpLp<DF>& f, hn::Vec<DF> (&v)[U]) {
#if STRATA_EXP_N_MAGIC
  const hn::RebindToSigned<DF> di;
  const auto magic = hn::Set(df, 12582912.f);  // 1.5 * 2^23
  hn::Vec<DF> fr[U], p[U];
  hn::Vec<decltype(di)> ni[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const auto xc = hn::Min(hn::Set(df, 88.0f), hn::Max(hn::Set(df, -87.0f), v[u]));  // ExpLp's clamp
    auto t = hn::Mul(xc, hn::Set(df, 1.44269504088896341f));
    asm("" : "+x"(t.raw));  // t rounded once, used by the add and the subtract (no FMA contraction)
    const auto a = hn::Add(t, magic);
    fr[u] = hn::Sub(t, hn::Sub(a, magic));
    ni[u] = hn::Sub(hn::BitCast(di, a), hn::BitCast(di, magic));
    p[u] = hn::MulAdd(hn::Set(df, 1.327647129073739e-3f), fr[u], hn::Set(df, 9.675541892647743e-3f));
  }
  constexpr float kC[4] = {5.550713092088699e-2f, 2.4022120237350464e-1f, 6.931469440460205e-1f, 1.0000001192092896f};
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = hn::MulAdd(p[u], fr[u], hn::Set(df, kC[k]));
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const auto s = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(ni[u], hn::Set(di, 127))));
    v[u] = hn::Mul(f.a, hn::Mul(p[u], s));
  }
#else
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) v[u] = f(df, v[u]);
#endif
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
