// CPU kernels of fused_cross_entropy, written once with Highway and compiled for every target in
// tile::cpu_isas() (one implementation "cpu.<isa>" each; "cpu.avx512_bf16": the AVX3 build with native bf16 stores).
//
// A row of V logits is one work item (rows are cut into fixed blocks, tile/cpu/parallel.h, so every row is
// computed the same way whatever the thread count). Per row:
//   statistics (forward): the row is swept in L1-sized pieces of kPiece elements, each read once from memory.
//     Without softcap (RowStatsPlain): a piece after the first is summed against the row's running maximum in
//     one sweep (its own max taken alongside); the first piece, and any piece that raises the maximum, take two
//     sweeps (the max, then the sum from L1). With softcap: the transformed logits c go to an L1 scratch buffer
//     while the piece's maximum and sum of c are accumulated, and a second sweep adds exp(c - m_piece). Each
//     piece is merged into the row's (m, S) with one rescale (lse_add_block): one exponential per element.
//   gradient (forward with dlogits, or backward): one more sweep, p = exp(c - lse), dz = f (p_coef p -
//     uniform), the target element fixed up afterwards from its saved logit (dz may be the logits buffer). A
//     row of 151936 bf16 logits (297 KiB) is still in L2 from the statistics sweep.
// Every reduction runs in a fixed order (four vector accumulators per piece, pieces in row order), so the
// result depends only on the row: the same bits for any thread count and batch composition.
//
// Build layout (build time is a budget, STYLE.md 12): the kernels live only in this file. The units
// cpu_{f32,bf16,f16}.cpp (one logits dtype each; until session 16 all three were one unit, 172 s on the H200 host,
// the longest compile of the build) include it for every target (tile/cpu/foreach_isa.h) and instantiate their
// dtype, so they compile in parallel; cpu.cpp declares the units' entry points, dispatches on the dtype and owns the
// HWY_EXPORT tables. The "native bf16" instance (cpu.avx512_bf16: bf16 gradients rounded by AVX512-BF16) exists
// only on AVX3 (STRATA_NATIVE_BF16) and only for bf16; every other native entry runs the portable instance.
//
// Per-target include guard (Highway's convention for -inl.h files).
#if defined(STRATA_OPS_LOSS_FUSED_CROSS_ENTROPY_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_OPS_LOSS_FUSED_CROSS_ENTROPY_CPU_INL_H_
#undef STRATA_OPS_LOSS_FUSED_CROSS_ENTROPY_CPU_INL_H_
#else
#define STRATA_OPS_LOSS_FUSED_CROSS_ENTROPY_CPU_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/math-inl.h"
#include "tile/cpu/exp_n-inl.h"
#define STRATA_WANT_AVX512_BF16  // the "cpu.avx512_bf16" instance (tile/cpu/vec-inl.h)
#include "tile/cpu/vec-inl.h"
#include "tile/cpu/vec_pair-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // as in tile/cpu/vec-inl.h: lets the native-bf16 instance use AVX512-BF16
#pragma GCC target("avx512bf16")
#endif
namespace strata::loss::HWY_NAMESPACE {

// ---- the units' entry points (defined in cpu_<dtype>.cpp, called by cpu.cpp) ----
void FusedCrossEntropyF32(const CeParams& p, int64_t count);
void FusedCrossEntropyBf16(const CeParams& p, int64_t count);
void FusedCrossEntropyF16(const CeParams& p, int64_t count);
#if STRATA_NATIVE_BF16
void FusedCrossEntropyBf16Native(const CeParams& p, int64_t count);
#endif

namespace hn = hwy::HWY_NAMESPACE;
namespace tv = strata::tile::HWY_NAMESPACE;

// Elements per piece of the statistics sweep: 8 KiB of f32 scratch, which stays in L1 with the piece's
// input (4-8 KiB) while the exponentials are summed.
constexpr int64_t kPiece = 2048;

using DF = hn::ScalableTag<float>;

// exp(x) of the f32 gradients: the shared f32-accurate vector exp of tile/cpu/math-inl.h (about an ulp over the
// whole float range). A NaN logit gives NaN terms (lse is NaN anyway). The statistics' terms exp(c - m_piece)
// (arguments <= 0) use tv::ExpSum, the bf16/f16 gradients tv::ScaledExpLp (see there).
HWY_INLINE hn::Vec<DF> FastExp(DF df, hn::Vec<DF> x) { return tv::FastExp(df, x); }

// Bytes of T per vector of f32 lanes (the prefetch step of the streaming loops).
template <class T>
inline constexpr int64_t kStepT = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(T));

// tanh(x) of the softcap, about 2 ulp over the whole float range (Highway's Tanh: an expm1 and a division, which
// made the softcap rows ~3x slower than the plain ones). |x| < 0.55: x + x^3 P(x^2), P of degree 3 in x^2 fitted
// for the minimax relative error on [0, 0.55] (1.4e-7 with the f32 Horner FMAs); |x| >= 0.55: (1 - u) / (1 + u)
// with u = e^{-2|x|} in (0, 0.333] from tv::ExpSum (relative error 2^-23 + 1.5e-7 |x|, which the factor
// 2u / (1 + u)^2 <= 0.56 shrinks: below 1.6e-7 relative at 0.55, and vanishing where tanh -> 1) and the
// reciprocal r of 1 + u in [1, 1.34] (tv::RecipGe1). NaN gives NaN (ExpSum's), +-inf gives +-1, -0 gives +0 (below).
// With q: also the gradient's factor 1 - tanh^2, as 4 u r^2 for |x| >= 0.55: 1 - t^2 from a rounded t near +-1
// cancels (an f32 t carries an absolute error of 2^-25 or more there; at huge logits that doubled the f32
// dlogits' error against float64), this keeps q's relative error near u's.
// The small branch is the odd polynomial evaluated on x itself (x^2 < 0.3025 picks it: no |x| and no sign
// restore there; the values are those of |x| with the sign of x, -0 aside, which gives +0). When every lane is small
// (|s z| < 0.55 cap: the bulk of a vocabulary's logits under Gemma-2's cap of 30) the exponential branch is skipped:
// 8 vector operations instead of ~30.
HWY_INLINE hn::Vec<DF> SoftcapTanh(DF df, hn::Vec<DF> x, hn::Vec<DF>* q = nullptr) {
  const auto one = hn::Set(df, 1.f);
  const auto x2 = hn::Mul(x, x);
  auto p = hn::MulAdd(hn::Set(df, 1.6442732885479927e-2f), x2, hn::Set(df, -5.267457664012909e-2f));
  p = hn::MulAdd(p, x2, hn::Set(df, 1.3320769369602203e-1f));
  p = hn::MulAdd(p, x2, hn::Set(df, -3.333294987678528e-1f));
  const auto small = hn::MulAdd(hn::Mul(x2, x), p, x);
  const auto is_small = hn::Lt(x2, hn::Set(df, 0.3025f));  // false for NaN and +-inf
  if (hn::AllTrue(df, is_small)) {
    if (q) *q = hn::NegMulAdd(small, small, one);
    return small;
  }
  const auto ax = hn::Abs(x);
  const auto u = tv::ExpSum(df, hn::Mul(ax, hn::Set(df, -2.f)));
  const auto r = tv::RecipGe1(df, hn::Add(one, u));
  const auto big = hn::CopySignToAbs(hn::Mul(hn::Sub(one, u), r), x);
  if (q) *q = hn::IfThenElse(is_small, hn::NegMulAdd(small, small, one), hn::Mul(hn::Mul(hn::Mul(u, hn::Set(df, 4.f)), r), r));
  return hn::IfThenElse(is_small, small, big);
}

// c = s z, or cap tanh(s z / cap).
template <bool kSoftcap>
HWY_INLINE hn::Vec<DF> Transform(DF df, hn::Vec<DF> z, const CeConsts& k) {
  const auto u = hn::Mul(z, hn::Set(df, k.scale));
  if constexpr (kSoftcap) return hn::Mul(hn::Set(df, k.cap), SoftcapTanh(df, hn::Mul(u, hn::Set(df, k.inv_cap))));
  return u;
}

// One vector of RowStatsPlain's sum terms: t = exp(s z - m) (vnm = -m) added to acc, and stored at e + i when
// kKeep (e is null otherwise, so the offset is applied only then).
template <bool kKeep>
HWY_INLINE void AddExpTerm(DF df, hn::Vec<DF> z, hn::Vec<DF> vs, hn::Vec<DF> vnm, float* HWY_RESTRICT e, int64_t i,
                           hn::Vec<DF>& acc) {
  const auto t = tv::ExpSum(df, hn::MulAdd(z, vs, vnm));
  if constexpr (kKeep) hn::StoreU(t, df, e + i);
  acc = hn::Add(acc, t);
}

// U consecutive vectors (z[u] at i + u NL; U = 4, a multiple of 4) of AddExpTerm, vector u into the accumulator
// acc[u % 4], with the U exponentials interleaved step by step (tv::ExpSumN: the same operations per vector, so the
// same bits as U AddExpTerm calls). On the Zen 3 CI machine (AVX2) the loop of one exponential after another kept the
// FP scheduler full at ~1.6 instructions per cycle (each chain ~60 cycles deep); see tile/cpu/exp_n-inl.h. Session 17
// tried U = 8 on AVX2: the 16 ymm registers spilled (327 instructions per 64 logits) and the loss only ran 11 % slower.
template <bool kKeep, int U>
HWY_INLINE void AddExpTerms(DF df, hn::Vec<DF> (&z)[U], hn::Vec<DF> vs, hn::Vec<DF> vnm, float* HWY_RESTRICT e,
                            int64_t i, hn::Vec<DF> (&acc)[4]) {
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) z[u] = hn::MulAdd(z[u], vs, vnm);
  tv::ExpSumN(df, z, [&](int u, hn::Vec<DF> t) {
    if constexpr (kKeep) hn::StoreU(t, df, e + i + u * NL);
    acc[u % 4] = hn::Add(acc[u % 4], t);
  });
}

// The extreme raw logit of the nv whole vectors at zp (the largest for kMax, else the smallest) and, with kSum, their
// sum (into s0, s1: s0 += v0 + v1, s1 += v2 + v3 per four vectors, the tail vectors into s0); the extreme of each step
// of four vectors as a tree, then into one accumulator (max / min are exact, so the value is that of any order; one
// accumulator instead of four leaves registers to the exponentials). The vectors go by steps of 4, then one by
// one; each step of 4 is also passed to terms(v[4], i) and each single vector to terms(v[1], i) (the online sweep's
// exponentials, or nothing). The one
// load-and-extreme loop of RowStatsPlain's online sweep and its sweep 1 (session 17: they were two copies of the same
// lines); every accumulator takes its operations in the order of the four-vector loop, so the same bits.
template <bool kMax, bool kSum, class T, class Terms>
HWY_INLINE float ExtremeSweep(DF df, const T* HWY_RESTRICT zp, int64_t nv, hn::Vec<DF>& s0, hn::Vec<DF>& s1,
                              Terms&& terms) {
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  auto ext = [](hn::Vec<DF> a, hn::Vec<DF> b) { return kMax ? hn::Max(a, b) : hn::Min(a, b); };
  const auto init = hn::Set(df, kMax ? -INFINITY : INFINITY);
  auto x = init;
  int64_t j = 0;
  auto steps = [&](auto u_tag) {
    constexpr int U = decltype(u_tag)::value;
    for (; j + U * NL <= nv; j += U * NL) {
      if constexpr (U > 1) tv::PrefetchAhead<U * kStepT<T>>(zp + j);  // the logits stream from memory (vec-inl.h)
      hn::Vec<DF> v[U];
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) v[u] = tv::LoadF32(df, zp + j + u * NL);
      if constexpr (U == 1) {
        x = ext(x, v[0]);
      } else {  // a tree, then one chain (max and min are exact: the order does not change the value)
        hn::Vec<DF> t[U / 2];
#pragma GCC unroll 4
        for (int u = 0; u < U / 2; ++u) t[u] = ext(v[2 * u], v[2 * u + 1]);
        for (int w = U / 2; w > 1; w /= 2)
#pragma GCC unroll 4
          for (int u = 0; u < w / 2; ++u) t[u] = ext(t[2 * u], t[2 * u + 1]);
        x = ext(x, t[0]);
      }
      if constexpr (kSum && U == 1) s0 = hn::Add(s0, v[0]);
      if constexpr (kSum && U > 1) {
#pragma GCC unroll 2
        for (int u = 0; u < U; u += 4) {
          s0 = hn::Add(s0, hn::Add(v[u], v[u + 1]));
          s1 = hn::Add(s1, hn::Add(v[u + 2], v[u + 3]));
        }
      }
      terms(v, j);
    }
  };
  steps(std::integral_constant<int, 4>{});
  steps(std::integral_constant<int, 1>{});
  return kMax ? hn::GetLane(hn::MaxOfLanes(df, x)) : hn::GetLane(hn::MinOfLanes(df, x));
}

// f(kMax, kSum) with the two flags as compile-time constants (std::bool_constant).
template <class F>
HWY_INLINE auto WithExtremeAndSum(bool is_max, bool with_sum, F&& f) {
  if (is_max) return with_sum ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
  return with_sum ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
}

// Row statistics without softcap (c = s z), piece by piece. Sweep 1 reads the piece from memory for the extreme raw
// logit only (m = s max z for s > 0, s min z for s < 0: rounding is monotone, so that is max c exactly) and, with
// label smoothing, the sum of z (sum c = s sum z) (ExtremeSweep). Sweep 2 re-reads the piece from L1 and adds
// e = exp(s z - m): the argument is one FMA (one rounding of the exact s z - m, so rows of huge logits keep it exact
// near the maximum), the exponential tv::ExpSum (AVX-512: 9 vector operations, about f32 accuracy for the sum;
// FastExpNonPos elsewhere, four vectors at a time through tv::ExpSumN). The transformed logits are never stored.
// After the first piece an online sweep (below) is tried first, and the two sweeps run only for the pieces that
// raise the row maximum.
// kKeep: e also goes to ebuf (the whole row, V floats) with m in piece_m[q], for RowGradFromExp.
template <bool kKeep, class T>
CeRowStats RowStatsPlain(const CeConsts& k, const T* HWY_RESTRICT z, int64_t V, int64_t y, float* HWY_RESTRICT ebuf,
                         float* HWY_RESTRICT piece_m) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  const bool smooth = k.eps != 0.f;  // ce_row_loss reads sum_c only then
  const bool pos = k.scale > 0.f;    // the plan rejects s = 0
  CeRowStats st;
  auto vsz = hn::Zero(df);
  float tail_sz = 0.f;
  const auto vs = hn::Set(df, k.scale);
  auto no_terms = [](auto&, int64_t) {};
  for (int64_t j0 = 0; j0 < V; j0 += kPiece) {
    const int64_t n = std::min(kPiece, V - j0);
    const int64_t nv = n / NL * NL;
    const T* HWY_RESTRICT zp = z + j0;
    float* HWY_RESTRICT e = kKeep ? ebuf + j0 : nullptr;
    // Online sweep (every whole-vector piece after the first): the sum of exp(s z - ref) against the row's running
    // maximum ref, while taking the piece's extreme raw logit (and sum z). Kept when the piece's maximum does not
    // exceed ref (every argument <= 0 up to rounding, as in the two sweeps below: the same accuracy); otherwise (a
    // new row maximum, for iid logits about ln(pieces) times per row) the piece is redone by the two sweeps. One
    // read of the piece and ~14 vector operations per 16 logits instead of ~16. Still a function of the row only.
    const float ref = st.lse.m;
    if (ref > -INFINITY && nv == n) {
      const bool kept = WithExtremeAndSum(pos, smooth, [&](auto is_max, auto with_sum) -> bool {
        hn::Vec<DF> acc[4] = {hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
        auto q0 = hn::Zero(df), q1 = hn::Zero(df);
        const auto vnr = hn::Set(df, -ref);
        const float zx = ExtremeSweep<decltype(is_max)::value, decltype(with_sum)::value>(
            df, zp, n, q0, q1, [&](auto& v, int64_t i) {
              if constexpr (std::extent_v<std::remove_reference_t<decltype(v)>> == 1) AddExpTerm<kKeep>(df, v[0], vs, vnr, e, i, acc[0]);
              else AddExpTerms<kKeep>(df, v, vs, vnr, e, i, acc);
            });
        if (!(k.scale * zx <= ref)) return false;  // a new maximum (or NaN): the two sweeps below
        vsz = hn::Add(vsz, hn::Add(q0, q1));
        if constexpr (kKeep) piece_m[j0 / kPiece] = ref;
        lse_add_block(st.lse, ref, hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(acc[0], acc[1]), hn::Add(acc[2], acc[3])))));
        return true;
      });
      if (kept) continue;
    }
    // Sweep 1: the extreme raw logit (and sum z).
    auto s0 = hn::Zero(df), s1 = hn::Zero(df);
    const float zext = WithExtremeAndSum(pos, smooth, [&](auto is_max, auto with_sum) {
      return ExtremeSweep<decltype(is_max)::value, decltype(with_sum)::value>(df, zp, nv, s0, s1, no_terms);
    });
    vsz = hn::Add(vsz, hn::Add(s0, s1));
    float m = nv > 0 ? k.scale * zext : -INFINITY;
    for (int64_t j = nv; j < n; ++j) {
      const float zj = to_f32(zp[j]);
      m = std::max(m, k.scale * zj);
      tail_sz += zj;
    }
    // Sweep 2: the sum of exp(s z - m), from L1.
    const auto vnm = hn::Set(df, -m);
    hn::Vec<DF> acc[4] = {hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
    int64_t j = 0;
    auto steps = [&](auto u_tag) {
      constexpr int U = decltype(u_tag)::value;
      for (; j + U * NL <= nv; j += U * NL) {
        hn::Vec<DF> v[U];
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) v[u] = tv::LoadF32(df, zp + j + u * NL);
        AddExpTerms<kKeep>(df, v, vs, vnm, e, j, acc);
      }
    };
    steps(std::integral_constant<int, 4>{});
    for (; j < nv; j += NL) AddExpTerm<kKeep>(df, tv::LoadF32(df, zp + j), vs, vnm, e, j, acc[0]);
    float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(acc[0], acc[1]), hn::Add(acc[2], acc[3]))));
    for (; j < n; ++j) {
      const float ej = ce_exp(std::fma(k.scale, to_f32(zp[j]), -m));
      if constexpr (kKeep) e[j] = ej;
      sum += ej;
    }
    if constexpr (kKeep) piece_m[j0 / kPiece] = m;
    lse_add_block(st.lse, m, sum);
  }
  st.sum_c = k.scale * (hn::GetLane(hn::SumOfLanes(df, vsz)) + tail_sz);
  if (y >= 0 && y < V) st.c_y = ce_logit(k, to_f32(z[y]));
  return st;
}

// A softcap piece after the first (n whole vectors at zp) in one sweep against the row's running maximum ref =
// st.lse.m, as RowStatsPlain's online sweep: t = tanh(s z / cap) and e = exp(cap t - ref) summed (the argument one
// FMA: one rounding of the exact cap t - ref), with the piece's maximum of t (cap > 0, so max c = cap max t
// exactly) and, with label smoothing, the sum of c alongside. kKeep: q = 1 - t^2 to q_out and e to e_out (the
// fused gradient's rows, see RowStats); without label smoothing (!kSum) the product q e to e_out alone. Kept (true: merged into st and vsum_c, piece_m = ref) when the piece's
// maximum does not exceed ref, so every argument is <= 0 up to rounding (the same accuracy as the two sweeps);
// otherwise (a new row maximum, for iid logits about ln(pieces) times per row, or NaN) nothing is merged and the
// caller redoes the piece by its two sweeps. No scratch row of c is written and re-read.
template <bool kKeep, bool kSum, class T>
bool SoftcapPieceOnline(const CeConsts& k, const T* HWY_RESTRICT zp, int64_t n, float* HWY_RESTRICT e_out,
                        float* HWY_RESTRICT q_out, float& piece_m, CeRowStats& st, hn::Vec<DF>& vsum_c) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  const float ref = st.lse.m;
  const auto vscale = hn::Set(df, k.scale), vinv = hn::Set(df, k.inv_cap), vcap = hn::Set(df, k.cap);
  const auto vnr = hn::Set(df, -ref);
  auto m0 = hn::Set(df, -INFINITY), m1 = m0;
  auto a0 = hn::Zero(df), a1 = a0, sc = a0;
  // U consecutive vectors at i (U = 4 or 2: vector u into m_(u % 2) / a_(u % 2), in the order of steps of two; U = 1:
  // the tail, into m0 / a0), the exponentials interleaved step by step (tv::ExpSumN, the same bits as one ExpSum per
  // vector). Session 17: four vectors per step (was two).
  auto terms = [&](auto u_tag, int64_t i) {
    constexpr int U = decltype(u_tag)::value;
    hn::Vec<DF> q[U], e[U];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const auto t =
          SoftcapTanh(df, hn::Mul(hn::Mul(tv::LoadF32(df, zp + i + u * NL), vscale), vinv), kKeep ? &q[u] : nullptr);
      hn::Vec<DF>& tmax = u % 2 == 0 ? m0 : m1;
      tmax = hn::Max(tmax, t);
      if constexpr (kSum) sc = hn::Add(sc, hn::Mul(vcap, t));
      e[u] = hn::MulAdd(vcap, t, vnr);
    }
    tv::ExpSumN(df, e);
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      if constexpr (kKeep && !kSum) {
        hn::StoreU(hn::Mul(q[u], e[u]), df, e_out + i + u * NL);
      } else if constexpr (kKeep) {
        hn::StoreU(q[u], df, q_out + i + u * NL);
        hn::StoreU(e[u], df, e_out + i + u * NL);
      }
      hn::Vec<DF>& acc = u % 2 == 0 ? a0 : a1;
      acc = hn::Add(acc, e[u]);
    }
  };
  int64_t i = 0;
  for (; i + 4 * NL <= n; i += 4 * NL) {
    tv::PrefetchAhead<4 * kStepT<T>>(zp + i);
    terms(std::integral_constant<int, 4>{}, i);
  }
  for (; i + 2 * NL <= n; i += 2 * NL) {
    tv::PrefetchAhead<2 * kStepT<T>>(zp + i);
    terms(std::integral_constant<int, 2>{}, i);
  }
  for (; i < n; i += NL) terms(std::integral_constant<int, 1>{}, i);
  if (!(k.cap * hn::GetLane(hn::MaxOfLanes(df, hn::Max(m0, m1))) <= ref)) return false;
  vsum_c = hn::Add(vsum_c, sc);
  piece_m = ref;
  lse_add_block(st.lse, ref, hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1))));
  return true;
}

// Row statistics with softcap: m, S (merged piece by piece), sum of c, and c_y.
// scratch: kPiece floats (ebuf == nullptr), or ebuf: V floats that receive e_j = exp(c_j - m_piece) for the whole
// row, with m_piece of piece q in piece_m[q] (the fused gradient then needs no second exponential), and q_j =
// 1 - t_j^2 in tbuf (V floats). Without label smoothing (the gradient's uniform term is 0, dz_j = f q_j e_j) ebuf
// receives the product q_j e_j and tbuf is one piece of scratch (kPiece floats): one row of V floats per thread
// instead of two (V = 256000: 1 MB, which stays in a 2 MB L2 with the logits row; two rows did not).
template <bool kSoftcap, class T>
CeRowStats RowStats(const CeConsts& k, const T* HWY_RESTRICT z, int64_t V, int64_t y, float* HWY_RESTRICT scratch,
                    float* HWY_RESTRICT ebuf = nullptr, float* HWY_RESTRICT piece_m = nullptr,
                    float* HWY_RESTRICT tbuf = nullptr) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  const bool smooth = k.eps != 0.f;  // ce_row_loss reads sum_c only then
  CeRowStats st;
  auto vsum_c = hn::Zero(df);
  float tail_sum_c = 0.f;
  for (int64_t j0 = 0; j0 < V; j0 += kPiece) {
    const int64_t n = std::min(kPiece, V - j0);
    if (ebuf) scratch = ebuf + j0;
    const int64_t nv = n / NL * NL;
    if constexpr (kSoftcap) {  // after the first piece: one sweep, kept unless the piece raises the row maximum
      if (st.lse.m > -INFINITY && nv == n) {
        float unused_m;
        float& pm = ebuf ? piece_m[j0 / kPiece] : unused_m;
        const bool kept =
            ebuf ? (smooth ? SoftcapPieceOnline<true, true>(k, z + j0, n, ebuf + j0, tbuf + j0, pm, st, vsum_c)
                           : SoftcapPieceOnline<true, false>(k, z + j0, n, ebuf + j0, nullptr, pm, st, vsum_c))
                 : (smooth ? SoftcapPieceOnline<false, true>(k, z + j0, n, nullptr, nullptr, pm, st, vsum_c)
                           : SoftcapPieceOnline<false, false>(k, z + j0, n, nullptr, nullptr, pm, st, vsum_c));
        if (kept) continue;
      }
    }
    auto vmax = hn::Set(df, -INFINITY);
    int64_t j = 0;
    float* HWY_RESTRICT qp = tbuf ? (smooth ? tbuf + j0 : tbuf) : nullptr;  // this piece's q
    if (kSoftcap && tbuf) {  // also keep the gradient's factor 1 - t^2, t = tanh(s z / cap)
      const auto vscale = hn::Set(df, k.scale), vinv = hn::Set(df, k.inv_cap), vcap = hn::Set(df, k.cap);
      for (; j < nv; j += NL) {
        tv::PrefetchAhead<kStepT<T>>(z + j0 + j);
        hn::Vec<DF> q;
        const auto t = SoftcapTanh(df, hn::Mul(hn::Mul(tv::LoadF32(df, z + j0 + j), vscale), vinv), &q);
        const auto c = hn::Mul(vcap, t);
        hn::StoreU(q, df, qp + j);
        hn::StoreU(c, df, scratch + j);
        vmax = hn::Max(vmax, c);
        vsum_c = hn::Add(vsum_c, c);
      }
    }
    for (; j < nv; j += NL) {
      tv::PrefetchAhead<kStepT<T>>(z + j0 + j);  // the logits stream from memory (tile/cpu/vec-inl.h)
      const auto c = Transform<kSoftcap>(df, tv::LoadF32(df, z + j0 + j), k);
      hn::StoreU(c, df, scratch + j);
      vmax = hn::Max(vmax, c);
      vsum_c = hn::Add(vsum_c, c);
    }
    float m = nv > 0 ? hn::GetLane(hn::MaxOfLanes(df, vmax)) : -INFINITY;
    for (; j < n; ++j) {
      const float c = ce_logit(k, to_f32(z[j0 + j]));
      if (kSoftcap && tbuf) {
        const float t = ce_tanh(k.scale * to_f32(z[j0 + j]) * k.inv_cap);
        qp[j] = 1.f - t * t;
      }
      scratch[j] = c;
      m = std::max(m, c);
      tail_sum_c += c;
    }
    const auto vm = hn::Set(df, m);
    auto a0 = hn::Zero(df), a1 = hn::Zero(df);
    j = 0;
    if (ebuf) {  // keep the exponentials (times q when folded)
      piece_m[j0 / kPiece] = m;
      const bool fold = kSoftcap && !smooth;
      auto keep = [&](int64_t i, hn::Vec<DF>& acc) {
        const auto e = tv::ExpSum(df, hn::Sub(hn::LoadU(df, scratch + i), vm));
        hn::StoreU(fold ? hn::Mul(hn::LoadU(df, qp + i), e) : e, df, scratch + i);
        acc = hn::Add(acc, e);
      };
      for (; j + 2 * NL <= nv; j += 2 * NL) {
        keep(j, a0);
        keep(j + NL, a1);
      }
      for (; j < nv; j += NL) keep(j, a0);
    } else {
      for (; j + 2 * NL <= nv; j += 2 * NL) {
        a0 = hn::Add(a0, tv::ExpSum(df, hn::Sub(hn::LoadU(df, scratch + j), vm)));
        a1 = hn::Add(a1, tv::ExpSum(df, hn::Sub(hn::LoadU(df, scratch + j + NL), vm)));
      }
      for (; j < nv; j += NL) a0 = hn::Add(a0, tv::ExpSum(df, hn::Sub(hn::LoadU(df, scratch + j), vm)));
    }
    float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
    for (; j < n; ++j) {
      const float e = ce_exp(scratch[j] - m);
      if (ebuf) scratch[j] = kSoftcap && !smooth ? qp[j] * e : e;
      s += e;
    }
    lse_add_block(st.lse, m, s);
  }
  st.sum_c = hn::GetLane(hn::SumOfLanes(df, vsum_c)) + tail_sum_c;
  if (y >= 0 && y < V) st.c_y = ce_logit(k, to_f32(z[y]));
  return st;
}

// dz[0..V) for the row constants r (dz may alias z).
// Inlined into Run (as before session 17, when its loops were shorter): the scalar target element and tail go through
// ce_grad_elem, whose FMA contraction GCC decides per inlining context (an f32 target gradient moved by one ulp when
// RowGrad became a function of its own).
template <bool kSoftcap, bool kNative, class T>
HWY_INLINE void RowGrad(const CeConsts& k, const CeGradRow& r, const T* z, T* dz, int64_t V, int64_t y, bool stream) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  // The target element's gradient, from its logit before the sweep can overwrite it.
  const bool has_y = y >= 0 && y < V;
  const float dz_y = has_y ? ce_grad_elem(k, r, to_f32(z[y]), true) : 0.f;
  const auto vscale = hn::Set(df, k.scale), vinv = hn::Set(df, k.inv_cap), vcap = hn::Set(df, k.cap);
  const auto vlse = hn::Set(df, r.lse), vp = hn::Set(df, r.p_coef), vu = hn::Set(df, r.uniform);
  int64_t j = 0;
  if constexpr (!kSoftcap && sizeof(T) == 2) {
    // exp(c - lse) <= 1 goes straight into a dz of T: for bf16/f16 the reduced-precision exponential of
    // tile/cpu/math-inl.h with p_coef folded into its coefficients (relative error < 4e-6 where |c - lse| < 20,
    // far below their rounding; the sweep is compute-bound). The argument s z - lse is one FMA (one rounding).
    const tv::ScaledExpLp<DF> pexp(df, r.p_coef);
    const auto vnl = hn::Set(df, -r.lse);
    constexpr int64_t kStep4 = 4 * kStepT<T>;
    // stream: a separate dz much larger than the caches, vector-aligned: non-temporal stores, which skip the
    // read-for-ownership of every dz line (a third stream of traffic next to reading z and writing dz).
    // Four vectors per step, their exponentials interleaved (tv::ScaledExpLpN: the same bits as pexp per vector).
    auto sweep = [&](auto stream_tag) {
      constexpr bool S = decltype(stream_tag)::value;
      for (; j + 4 * NL <= V; j += 4 * NL) {
        tv::PrefetchAhead<kStep4>(z + j);  // from memory in the backward
        hn::Vec<DF> x[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) x[u] = hn::MulAdd(tv::LoadF32(df, z + j + u * NL), vscale, vnl);
        tv::ScaledExpLpN(df, pexp, x);
        // Two vectors per store (tv::StoreOut2: on AVX2 one pack and one 32-byte store of bf16, the same bits).
        tv::StoreOut2<S, kNative>(df, hn::Sub(x[0], vu), hn::Sub(x[1], vu), dz + j);
        tv::StoreOut2<S, kNative>(df, hn::Sub(x[2], vu), hn::Sub(x[3], vu), dz + j + 2 * NL);
      }
      for (; j + NL <= V; j += NL)
        tv::StoreOut<S, kNative>(df, hn::Sub(pexp(df, hn::MulAdd(tv::LoadF32(df, z + j), vscale, vnl)), vu), dz + j);
      // Order the non-temporal stores before the tail and the target's fix-up write into the same lines.
      if constexpr (S) hwy::FlushStream();
    };
    if (stream && tv::StreamAligned(df, dz)) sweep(std::true_type{});
    else sweep(std::false_type{});
  }
  // f32 dz, and softcap: U vectors per step (4, then 1), the exponentials interleaved (tv::FastExpN: the same bits as
  // FastExp per vector).
  auto steps = [&](auto u_tag) {
    constexpr int U = decltype(u_tag)::value;
    for (; j + U * NL <= V; j += U * NL) {
      tv::PrefetchAhead<U * kStepT<T>>(z + j);  // from memory in the backward, from L2 after the statistics
      hn::Vec<DF> x[U], q[U];
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        const auto s = hn::Mul(tv::LoadF32(df, z + j + u * NL), vscale);
        if constexpr (kSoftcap) x[u] = hn::Sub(hn::Mul(vcap, SoftcapTanh(df, hn::Mul(s, vinv), &q[u])), vlse);
        else x[u] = hn::Sub(s, vlse);
      }
      tv::FastExpN(df, x);
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        hn::Vec<DF> d;
        if constexpr (kSoftcap) d = hn::Mul(q[u], hn::MulSub(vp, x[u], vu));
        else d = hn::MulSub(vp, x[u], vu);  // f32 dz (bf16/f16 took the loop above)
        tv::StoreOut<false, kNative>(df, d, dz + j + u * NL);
      }
    }
  };
  steps(std::integral_constant<int, 4>{});
  steps(std::integral_constant<int, 1>{});
  for (; j < V; ++j) dz[j] = from_f32<T>(ce_grad_elem(k, r, to_f32(z[j]), false));
  if (has_y) dz[y] = from_f32<T>(dz_y);
}

// tv::StoreOut2 of two vectors without NaN lanes (finite or +-inf): on AVX2 the bf16 rounding to nearest even without
// Bf16Bits' NaN quieting (its compare, shift, or and blend: 4 of ~9 integer operations per vector), the same bits for
// every non-NaN value; other dtypes and targets: tv::StoreOut2.
template <bool kNative, class T>
HWY_INLINE void StoreOut2NoNaN(DF df, hn::Vec<DF> v0, hn::Vec<DF> v1, T* p) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<T, bf16_t>) {
    const hn::RebindToUnsigned<DF> du32;
    auto bits = [&](hn::Vec<DF> v) {  // Bf16Bits' rounded lanes: (u + 0x7fff + bit 16 of u) >> 16
      const auto u = hn::BitCast(du32, v);
      return hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du32, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u)))));
    };
    // As tv::StoreOut2: the unsigned 16-bit pack per 128-bit half, vpermq 0xD8 restores the order.
    const __m256i packed = _mm256_packus_epi32(bits(v0).raw, bits(v1).raw);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
    return;
  }
#endif
  tv::StoreOut2<false, kNative>(df, v0, v1, p);
}

// dz[0..V) from the kept exponentials (no softcap): p_j = e_j exp(m_piece - lse), dz = p_coef p_j - uniform;
// dz may alias the logits (they are not read here). dz_y: the target's value, computed by the caller.
// With softcap (tbuf != nullptr, holding 1 - t_j^2): dz = (1 - t_j^2) (p_coef p_j - uniform); without label
// smoothing RowStats kept (1 - t_j^2) e_j in ebuf, and tbuf is null (uniform = 0: the plain sweep).
// Inlined into Run, as RowGrad (the target's ce_grad_elem, computed there, kept its base bits only so).
template <bool kNative, class T>
HWY_INLINE void RowGradFromExp(const CeGradRow& r, const float* HWY_RESTRICT ebuf, const float* HWY_RESTRICT piece_m, T* dz,
                    int64_t V, int64_t y, float dz_y, const float* HWY_RESTRICT tbuf = nullptr) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  const auto vu = hn::Set(df, r.uniform);
  for (int64_t j0 = 0; j0 < V; j0 += kPiece) {
    const int64_t n = std::min(kPiece, V - j0);
    const float sc = r.p_coef * ce_exp(piece_m[j0 / kPiece] - r.lse);
    const auto vs = hn::Set(df, sc);
    const float* e = ebuf + j0;
    T* d = dz + j0;
    int64_t j = 0;
    if (tbuf) {
      const float* q = tbuf + j0;
      auto dq = [&](int64_t i) { return hn::Mul(hn::LoadU(df, q + i), hn::MulSub(vs, hn::LoadU(df, e + i), vu)); };
      for (; j + 2 * NL <= n; j += 2 * NL) tv::StoreOut2<false, kNative>(df, dq(j), dq(j + NL), d + j);
      for (; j + NL <= n; j += NL) tv::StoreOut<false, kNative>(df, dq(j), d + j);
      for (; j < n; ++j) d[j] = from_f32<T>(q[j] * (sc * e[j] - r.uniform));
      continue;
    }
    // Two vectors per store (on AVX2 one pack and one store of bf16, the same bits). When lse, the piece's maximum,
    // sc and the uniform term are finite, every e_j is finite (in [0, 1]) and so is every dz (or +-inf on overflow):
    // no NaN, so bf16 needs no NaN quieting (StoreOut2NoNaN).
    const bool no_nan = std::isfinite(r.lse) && std::isfinite(piece_m[j0 / kPiece]) && std::isfinite(sc) &&
                        std::isfinite(r.uniform);
    auto pairs = [&](auto no_nan_tag) {
      for (; j + 2 * NL <= n; j += 2 * NL) {
        const auto d0 = hn::MulSub(vs, hn::LoadU(df, e + j), vu), d1 = hn::MulSub(vs, hn::LoadU(df, e + j + NL), vu);
        if constexpr (decltype(no_nan_tag)::value) StoreOut2NoNaN<kNative>(df, d0, d1, d + j);
        else tv::StoreOut2<false, kNative>(df, d0, d1, d + j);
      }
    };
    if (no_nan) pairs(std::true_type{});
    else pairs(std::false_type{});
    for (; j + NL <= n; j += NL) tv::StoreOut<false, kNative>(df, hn::MulSub(vs, hn::LoadU(df, e + j), vu), d + j);
    for (; j < n; ++j) d[j] = from_f32<T>(sc * e[j] - r.uniform);
  }
  if (y >= 0 && y < V) dz[y] = from_f32<T>(dz_y);
}

// Row statistics: the plain sweeps without softcap, the transform-and-scratch ones with it.
template <bool kSoftcap, bool kKeep, class T>
CeRowStats Stats(const CeConsts& k, const T* z, int64_t V, int64_t y, float* scratch, float* ebuf, float* piece_m,
                 float* tbuf) {
  if constexpr (kSoftcap) return RowStats<true>(k, z, V, y, scratch, ebuf, piece_m, tbuf);
  else return RowStatsPlain<kKeep>(k, z, V, y, ebuf, piece_m);
}

template <bool kSoftcap, bool kNative, class T>
void Run(const CeParams& p, int64_t count) {
  const T* logits = static_cast<const T*>(p.logits);
  T* dlogits = static_cast<T*>(p.dlogits);
  const CeConsts& k = p.k;
  double* ws = static_cast<double*>(p.workspace);
  const bool reduced = p.reduction != kCeNone;
  const int64_t block = tile::block_for_bytes(p.V * static_cast<int64_t>(sizeof(T)));
  // Non-temporal gradient stores (RowGrad, bf16/f16 without softcap) for a separate dlogits of 4 MiB or more.
  const bool stream_dz = dlogits != nullptr && static_cast<const void*>(dlogits) != static_cast<const void*>(logits) &&
                         p.N * p.V * static_cast<int64_t>(sizeof(T)) >= (int64_t{4} << 20);
  tile::parallel_blocks(p.N, block, [&](int64_t i0, int64_t i1) {
    HWY_ALIGN float scratch[kPiece];
    // Fused forward + gradient without softcap: the row's exponentials are kept (V floats per thread, in L2),
    // so the gradient sweep only scales them: one exponential per element and no second read of the logits.
    // With softcap q = 1 - tanh(s z / cap)^2 is kept as well (another V floats), or, without label smoothing,
    // folded into the kept exponentials (RowStats; tbuf is then the piece scratch of q).
    const bool keep_exp = !p.backward && dlogits != nullptr;
    const bool fold_q = kSoftcap && k.eps == 0.f;
    thread_local std::vector<float> row_buf;
    float* ebuf = nullptr;
    float* piece_m = nullptr;
    float* tbuf = nullptr;
    if (keep_exp) {
      const size_t pieces = static_cast<size_t>((p.V + kPiece - 1) / kPiece);
      const size_t need = static_cast<size_t>(p.V) * (kSoftcap && !fold_q ? 2 : 1) + pieces;
      if (row_buf.size() < need) row_buf.resize(need);
      ebuf = row_buf.data();
      piece_m = ebuf + p.V;
      if (kSoftcap) tbuf = fold_q ? scratch : piece_m + pieces;
    }
    // Row i's lse, loss and z-loss (per-row outputs, or the workspace for mean/sum) from its statistics.
    auto write_row = [&](const CeRowStats& st, int64_t i, bool ignored) {
      const float lse = ce_lse(st.lse);
      const float loss = ignored ? 0.f : ce_row_loss(k, st, p.V);
      const float zl = ignored ? 0.f : ce_row_z_loss(k, lse);
      if (p.lse) static_cast<float*>(p.lse)[i * p.lse_stride] = lse;
      if (reduced) {
        ws[i] = loss;
        ws[p.N + i] = zl;
      } else {
        static_cast<float*>(p.loss)[i * p.loss_stride] = loss;
        if (p.z_loss) static_cast<float*>(p.z_loss)[i * p.z_stride] = zl;
      }
      return lse;
    };
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t y = ce_target(p, i);
      const bool ignored = y == k.ignore_index;
      const T* z = logits + i * p.logits_rs;
      float lse;
      if (keep_exp) {
        const CeRowStats st = Stats<kSoftcap, true>(k, z, p.V, y, scratch, ebuf, piece_m, tbuf);
        lse = write_row(st, i, ignored);
        T* dz = dlogits + i * p.dlogits_rs;
        if (ignored) {
          std::fill(dz, dz + p.V, from_f32<T>(0.f));
          continue;
        }
        const CeGradRow gr = ce_grad_row(k, lse, ce_upstream(p, i, count));
        RowGradFromExp<kNative>(gr, ebuf, piece_m, dz, p.V, y, ce_grad_elem(k, gr, to_f32(z[y]), true),
                                fold_q ? nullptr : tbuf);
        continue;
      }
      if (p.backward) {
        lse = static_cast<const float*>(p.lse_in)[i * p.lse_in_stride];
      } else {
        const CeRowStats st = Stats<kSoftcap, false>(k, z, p.V, y, scratch, nullptr, nullptr, nullptr);
        lse = write_row(st, i, ignored);
      }
      if (!dlogits) continue;
      T* dz = dlogits + i * p.dlogits_rs;
      if (ignored) {
        std::fill(dz, dz + p.V, from_f32<T>(0.f));
        continue;
      }
      RowGrad<kSoftcap, kNative>(k, ce_grad_row(k, lse, ce_upstream(p, i, count)), z, dz, p.V, y, stream_dz);
    }
  });
}

// One logits dtype (the plan gives these implementations f32/bf16/f16 only; f64 goes to the reference).
template <bool kNative, class T>
void RunDtype(const CeParams& p, int64_t count) {
  if (p.k.softcap_on) Run<true, kNative, T>(p, count);
  else Run<false, kNative, T>(p, count);
}

}  // namespace strata::loss::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
