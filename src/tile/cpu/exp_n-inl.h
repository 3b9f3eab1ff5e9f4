// Array forms of the softmax-term exponential tv::ExpSum (tile/cpu/math-inl.h) for the targets without AVX-512:
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

// e^x for U vectors of softmax terms (x <= 0 up to rounding, or NaN), in place: tv::ExpSum's bits.
template <int U, class DF>
HWY_INLINE void ExpSumN(DF df, hn::Vec<DF> (&v)[U]) {
#if STRATA_EXP_N_MAGIC
  const hn::RebindToSigned<DF> di;
  const auto magic = hn::Set(df, 12582912.f);  // 1.5 * 2^23
  hn::Vec<DF> n[U], r[U], p[U];
  hn::Vec<decltype(di)> ni[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const auto xc = hn::Max(hn::Set(df, -104.0f), v[u]);  // FastExpNonPos's clamp (keeps NaN)
    auto t = hn::Mul(xc, hn::Set(df, 1.44269504088896341f));
    // t must be rounded before the add (GCC contracts vector mul + add into an FMA by default, which would round
    // the exact product instead and change n in rare lanes): an empty asm makes t opaque, at no cost.
    asm("" : "+x"(t.raw));
    const auto a = hn::Add(t, magic);
    n[u] = hn::Sub(a, magic);
    ni[u] = hn::Sub(hn::BitCast(di, a), hn::BitCast(di, magic));
    r[u] = hn::MulAdd(n[u], hn::Set(df, -0.693359375f), xc);  // ExpClamped's Cody-Waite reduction
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
    v[u] = hn::Mul(hn::Mul(p[u], s1), s2);
  }
#else
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) v[u] = ExpSum(df, v[u]);
#endif
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
