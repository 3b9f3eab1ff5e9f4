// Array forms of the gradient exponentials of tile/cpu/math-inl.h (session 17, h17/cpu_fce2), as tv::ExpSumN
// (tile/cpu/exp_n-inl.h) is of tv::ExpSum: U vectors in place, every step written as a loop over them, so the
// out-of-order core overlaps U independent dependency chains (one exponential after another kept the Zen 3 CI
// machine's FP scheduler full). On x86 without AVX-512 (AVX2, SSE4) n = round(t) comes from a = t + 1.5 2^23 (round
// to nearest even, as vroundps, for |t| < 2^22; here |t| <= 151) and the integer n is the bit difference of a and
// 1.5 2^23 (one subtract instead of Highway's five-operation ConvertTo): the same n, r / f, polynomial and scaling per
// lane as the one-vector function, so the same bits. AVX-512 and the scalar / EMU128 / non-x86 targets: the
// one-vector function per vector, unchanged.
//   FastExpN:      tv::FastExp (f32-accurate, the whole float range, NaN kept).
//   ScaledExpLpN:  tv::ScaledExpLp's a e^x (results rounded to bf16 / f16).
// Include inside HWY_NAMESPACE users compiled with hwy/foreach_target.h (per-target include guard).
#if defined(STRATA_TILE_CPU_EXP_GRAD_N_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_TILE_CPU_EXP_GRAD_N_INL_H_
#undef STRATA_TILE_CPU_EXP_GRAD_N_INL_H_
#else
#define STRATA_TILE_CPU_EXP_GRAD_N_INL_H_
#endif

#include <hwy/highway.h>

#include "tile/cpu/exp_n-inl.h"  // STRATA_EXP_N_MAGIC
#include "tile/cpu/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// e^x for U vectors, in place: tv::FastExp's bits (clamp to [-104, 89], Cody-Waite reduction, degree-7 Taylor
// polynomial, two exact power-of-two factors; NaN blended back).
template <int U, class DF>
HWY_INLINE void FastExpN(DF df, hn::Vec<DF> (&v)[U]) {
#if STRATA_EXP_N_MAGIC
  const hn::RebindToSigned<DF> di;
  const auto magic = hn::Set(df, 12582912.f);  // 1.5 * 2^23
  hn::Vec<DF> xc[U], n[U], r[U], p[U];
  hn::Vec<decltype(di)> ni[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    xc[u] = hn::Min(hn::Max(v[u], hn::Set(df, -104.0f)), hn::Set(df, 89.0f));  // FastExp's clamp, same operand order
    auto t = hn::Mul(xc[u], hn::Set(df, 1.44269504088896341f));
    asm("" : "+x"(t.raw));  // t rounded before the add (no FMA contraction; see exp_n-inl.h)
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
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const auto n1 = hn::ShiftRight<1>(ni[u]);
    const auto s1 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(n1, bias)));
    const auto s2 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni[u], n1), bias)));
    v[u] = hn::IfThenElse(hn::IsNaN(v[u]), v[u], hn::Mul(hn::Mul(p[u], s1), s2));
  }
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
