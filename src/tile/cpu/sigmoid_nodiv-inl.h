// Sigmoids without a division for bf16 / f16 results on the x86 targets without AVX-512 (AVX2, SSE4): the
// reduced-precision SigmoidLp / SigmoidOut16 of tile/cpu/math-inl.h end in a vdivps there (RecipGe1's note: the
// 12-bit reciprocal estimate alone is too coarse), and their ExpLp converts n = round(t) to an integer through
// Highway's ConvertTo (five operations with its overflow fix-up). Session 16 (h16/cpu_norm) found both in the
// AVX2 row kernels of rms_norm_gated and clipped_swiglu on the AMD EPYC (Zen 3) CI machine: the samples pile up
// behind the vdivps (one per 8 lanes, 3.5-5 cycles each), and the SiLU row kernels ran at 16-31 % of a one-core
// copy in cache. Here:
//   t = -v log2 e clamped to [-126, 127]; a = t + (1.5 2^23 + 127) rounds t to the integer n (nearest even)
//   and holds n + 127 in its low mantissa bits, so 2^n is a << 23 (one shift) and f = t - (a - M) is exact in
//   [-1/2, 1/2]; e^-v = p(f) 2^n, d = 1 + e^-v in [1, 2^128); 1 / d by the 12-bit rcpps estimate and one
//   Newton step (relative error below 1.4e-7 + two roundings).
// SigmoidLpNoDiv: p of degree 5 (ExpLp's coefficients, minimax relative 1.5e-7 on [-1/2, 1/2]); relative
// error below 5e-6 + 7.5e-8 |v| (the bar of SigmoidLp; the 7.5e-8 |v| from rounding t, as SigmoidLp on AVX-512).
// 16 vector operations instead of SigmoidLp's 20 and a vdivps. SigmoidOut16NoDiv: degree 3 (7.5e-5 on
// [-1/2, 1/2], fitted here), below 1.4e-4 + 7.5e-8 |v| (SigmoidOut16's bar), 14 operations.
// Ends: v -> +inf gives 1 or 1 - 2^-24 (the Newton step approaches 1 from below: the test allows 1 ulp); v < -87.3
// gives 0 or a value below FLT_MIN where the true one is below 2^-126 (as SigmoidOut16); NaN gives NaN (the
// clamps are written min(hi, t), max(lo, .): the x86 instructions return their second operand for NaN).
// AVX-512 (vscalefps, 14-bit rcp14ps): SigmoidLp / SigmoidOut16 themselves (the same bits). Scalar / EMU128 and
// non-x86 targets: SigmoidLp (their Min / Max drop a NaN). Tested on every ISA by tests/cpp/test_tile_sigmoid_nodiv.cpp.
#if defined(STRATA_TILE_CPU_SIGMOID_NODIV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_TILE_CPU_SIGMOID_NODIV_INL_H_
#undef STRATA_TILE_CPU_SIGMOID_NODIV_INL_H_
#else
#define STRATA_TILE_CPU_SIGMOID_NODIV_INL_H_
#endif

#include <hwy/highway.h>

#include "tile/cpu/math-inl.h"

// Evaluated where used, so per target (HWY_TARGET changes from one pass over this file to the next).
#ifndef STRATA_SIGMOID_NODIV_RCP
#define STRATA_SIGMOID_NODIV_RCP \
  (HWY_ARCH_X86 && !STRATA_HWY_IS_AVX512 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128)
#endif

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The array forms (SigmoidLpNoDivN / SigmoidOut16NoDivN) take U vectors in place and write every step as a loop
// over them (unrolled): the instructions of U independent vectors interleave, so the out-of-order core overlaps
// their ~60-cycle dependency chains (exp split, polynomial, estimate, Newton step). On the Zen 3 CI machine a
// clipped_swiglu backward loop written vector after vector kept the FP scheduler full (llvm-mca -mcpu=znver3: 97 %
// of dispatch stalls) at ~1.6 instructions per cycle; four vectors step by step ran 15 % faster (L1-resident
// microbenchmark, session 16). The same operations per vector either way: the same bits for any U.
#if STRATA_SIGMOID_NODIV_RCP
// 1 / (1 + e^-v) for U vectors with 2^f by the polynomial c[0] + c[1] f + ... (Horner; kDeg + 1 coefficients).
template <int kDeg, int U, class DF>
HWY_INLINE void SigmoidRcpN(DF df, hn::Vec<DF> (&v)[U], const float (&c)[kDeg + 1]) {
  const hn::RebindToUnsigned<DF> du;
  const auto magic = hn::Set(df, 12583039.f);  // 1.5 * 2^23 + 127: bits 0x4B40007F
  hn::Vec<DF> f[U], pow2n[U], p[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const auto t = hn::Max(hn::Set(df, -126.f), hn::Min(hn::Set(df, 127.f), hn::Mul(v[u], hn::Set(df, -1.44269504088896341f))));
    const auto a = hn::Add(t, magic);
    f[u] = hn::Sub(t, hn::Sub(a, magic));
    pow2n[u] = hn::BitCast(df, hn::ShiftLeft<23>(hn::BitCast(du, a)));
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) p[u] = hn::MulAdd(hn::Set(df, c[kDeg]), f[u], hn::Set(df, c[kDeg - 1]));
#pragma GCC unroll 8
  for (int k = kDeg - 2; k >= 0; --k) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = hn::MulAdd(p[u], f[u], hn::Set(df, c[k]));
  }
  // 1 / d, d = p 2^n + 1 in [1, 2^128): the rcpps estimate and one Newton step.
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) p[u] = hn::MulAdd(p[u], pow2n[u], hn::Set(df, 1.f));
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) f[u] = hn::ApproximateReciprocal(p[u]);
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) v[u] = hn::Mul(f[u], hn::NegMulAdd(p[u], f[u], hn::Set(df, 2.f)));
}
// ExpLp's degree-5 coefficients (minimax relative 1.5e-7 on [-1/2, 1/2]) and a degree-3 fit (7.5e-5).
inline constexpr float kExp2Deg5[6] = {1.0000001192092896f, 6.931469440460205e-1f, 2.4022120237350464e-1f,
                                       5.550713092088699e-2f, 9.675541892647743e-3f, 1.327647129073739e-3f};
inline constexpr float kExp2Deg3[4] = {9.999280571937561e-1f, 6.932609677314758e-1f, 2.426111251115799e-1f,
                                       5.51716685295105e-2f};
#endif

// kOut16: SigmoidOut16's accuracy (degree 3), else SigmoidLp's (degree 5).
template <bool kOut16, int U, class DF>
HWY_INLINE void SigmoidNoDivN(DF df, hn::Vec<DF> (&v)[U]) {
#if STRATA_SIGMOID_NODIV_RCP
  if constexpr (kOut16) SigmoidRcpN<3>(df, v, kExp2Deg3);
  else SigmoidRcpN<5>(df, v, kExp2Deg5);
#else
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) v[u] = kOut16 ? SigmoidOut16(df, v[u]) : SigmoidLp(df, v[u]);
#endif
}
template <int U, class DF>
HWY_INLINE void SigmoidLpNoDivN(DF df, hn::Vec<DF> (&v)[U]) {
  SigmoidNoDivN<false>(df, v);
}
template <int U, class DF>
HWY_INLINE void SigmoidOut16NoDivN(DF df, hn::Vec<DF> (&v)[U]) {
  SigmoidNoDivN<true>(df, v);
}
// One vector.
template <bool kOut16, class DF>
HWY_INLINE hn::Vec<DF> SigmoidNoDiv1(DF df, hn::Vec<DF> v) {
  hn::Vec<DF> a[1] = {v};
  SigmoidNoDivN<kOut16>(df, a);
  return a[0];
}
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidLpNoDiv(DF df, hn::Vec<DF> v) {
  return SigmoidNoDiv1<false>(df, v);
}
template <class DF>
HWY_INLINE hn::Vec<DF> SigmoidOut16NoDiv(DF df, hn::Vec<DF> v) {
  return SigmoidNoDiv1<true>(df, v);
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
