// CPU kernels of clipped_swiglu (clipped_swiglu.h), written once with Highway and compiled for every target in
// tile::cpu_isas(). Rows go in fixed blocks (tile/cpu/parallel.h). A row of x (2I elements) is converted to an
// f32 scratch row, the pairs are taken as vectors (LoadInterleaved2 for the interleaved layout, two plain loads
// for the split one), and the outputs are rounded into place (non-temporal stores for large outputs). dprobs is
// a per-row sum in a fixed order (vector lanes, lane sum, tail): independent of the thread count.
// kNative instances ("cpu.avx512_bf16"): the AVX3 build whose bf16 outputs are rounded by AVX512-BF16's
// vcvtneps2bf16 (one instruction per 16 outputs instead of about ten integer ones; the same bits: both round to
// nearest even).
//
// Build layout (build time is a budget, STYLE.md 12): the kernels live only in this file. The units
// cpu_{f32,bf16,f16}.cpp (forward and backward of one activation dtype; until session 18 all three were one unit,
// 110-123 s on the H200 host, the longest compile of the build with rms_norm_gated/cpu_bwd.cpp) include it for
// every target (tile/cpu/foreach_isa.h) and instantiate their dtype, so they compile in parallel; cpu.cpp
// dispatches on the dtype and owns the HWY_EXPORT tables. The native instances exist only on AVX3
// (STRATA_NATIVE_BF16) and only for bf16: every other native entry runs the portable instance, whose code is
// the same there (kNative changes only bf16 stores on AVX3).
//
// Per-target include guard (Highway's convention for -inl.h files).
#if defined(STRATA_OPS_ACTIVATION_CLIPPED_SWIGLU_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_OPS_ACTIVATION_CLIPPED_SWIGLU_CPU_INL_H_
#undef STRATA_OPS_ACTIVATION_CLIPPED_SWIGLU_CPU_INL_H_
#else
#define STRATA_OPS_ACTIVATION_CLIPPED_SWIGLU_CPU_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/activation/clipped_swiglu/clipped_swiglu.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/stream_policy.h"
#include "tile/cpu/math-inl.h"
#include "tile/cpu/sigmoid_nodiv-inl.h"
#define STRATA_WANT_AVX512_BF16  // the "cpu.avx512_bf16" instances (tile/cpu/vec-inl.h)
#include "tile/cpu/vec-inl.h"
#include "tile/cpu/vec_pair-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // as in tile/cpu/vec-inl.h: lets the native-bf16 instances use AVX512-BF16
#pragma GCC target("avx512bf16")
#endif
namespace strata::activation::HWY_NAMESPACE {
namespace tv = strata::tile::HWY_NAMESPACE;
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// ---- the units' entry points (defined in cpu_<dtype>.cpp; called by cpu.cpp, which returns early on empty
// problems) ----
void CswFwdF32(const ClippedSwigluFwdParams& p);
void CswFwdBf16(const ClippedSwigluFwdParams& p);
void CswFwdF16(const ClippedSwigluFwdParams& p);
void CswBwdF32(const ClippedSwigluBwdParams& p);
void CswBwdBf16(const ClippedSwigluBwdParams& p);
void CswBwdF16(const ClippedSwigluBwdParams& p);
#if STRATA_NATIVE_BF16
void CswFwdBf16Native(const ClippedSwigluFwdParams& p);
void CswBwdBf16Native(const ClippedSwigluBwdParams& p);
#endif

constexpr int64_t kStreamBytes = 4 << 20;

// Clamped pair -> (a, b + bias, s). NaN inputs stay NaN (IfThenElse on comparisons, which are false for NaN).
struct PairV {
  VF a, bb, s;
};
// Vectors of pairs per step of the direct rows' main loops. Every step of the pair math below is written as a loop
// over the U vectors (PairN, GradN, tv::SigmoidLpNoDivN), so their instructions interleave and the out-of-order
// core overlaps U independent dependency chains of ~60 cycles (session 16: on the Zen 3 CI machine the backward
// written vector after vector kept the FP scheduler full at ~1.6 instructions per cycle). The same operations per
// vector for any U (the remainder and the scratch rows take U = 1): the same bits.
constexpr int kU = 4;
// T: the activations' dtype; bf16/f16 rows take the reduced-precision sigmoid (tile/cpu/sigmoid_nodiv-inl.h:
// SigmoidLp's accuracy, relative error < 5e-6, far below their rounding, without a division on AVX2 / SSE4),
// which halves the row's arithmetic (the kernel is compute-bound).
template <class T, bool kOut16, int U>
HWY_INLINE void PairN(DF df, const VF (&A)[U], const VF (&B)[U], VF alpha, VF limit, VF bias, PairV (&r)[U]) {
  const VF nlimit = hn::Neg(limit);
  VF s[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
#if !HWY_ARCH_X86 || HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
    r[u].a = hn::IfThenElse(hn::Gt(A[u], limit), limit, A[u]);
    const VF b = hn::IfThenElse(hn::Gt(B[u], limit), limit, hn::IfThenElse(hn::Lt(B[u], nlimit), nlimit, B[u]));
#else
    // min(limit, A) and max(-limit, .): the x86 instructions return their second operand when one is NaN (and
    // when both are zeros), so NaN stays NaN and the values are those of the compare-and-blend form above, in
    // 3 vector operations instead of 6 (the scalar / EMU128 targets, whose Min / Max drop a NaN, and non-x86 ones
    // keep that form).
    r[u].a = hn::Min(limit, A[u]);
    const VF b = hn::Max(nlimit, hn::Min(limit, B[u]));
#endif
    r[u].bb = hn::Add(b, bias);
    s[u] = hn::Mul(alpha, r[u].a);
  }
  // s = sigmoid(alpha a) over the whole float range; kOut16: the forward of bf16/f16 rows, whose
  // y = a s (b + bias) is rounded straight to 16 bits, takes SigmoidOut16's accuracy (relative error < 1.4e-4,
  // 0.07 of a bf16 half-ulp; fewer operations).
  if constexpr (kOut16 && sizeof(T) == 2) {
    tv::SigmoidOut16NoDivN(df, s);
  } else if constexpr (sizeof(T) == 2) {
    tv::SigmoidLpNoDivN(df, s);
  } else {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) s[u] = tv::FastSigmoid(df, s[u]);
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) r[u].s = s[u];
}
template <class T, bool kOut16 = false>
HWY_INLINE PairV Pair(DF df, VF A, VF B, VF alpha, VF limit, VF bias) {
  const VF a[1] = {A}, b[1] = {B};
  PairV r[1];
  PairN<T, kOut16>(df, a, b, alpha, limit, bias, r);
  return r[0];
}

template <class T>
HWY_INLINE void RowToF32(const T* src, int64_t col, float* dst, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (col != 1) {
    for (int64_t j = 0; j < n; ++j) dst[j] = to_f32(src[j * col]);
    return;
  }
  int64_t j = 0;
  for (; j + N <= n; j += N) hn::StoreU(tv::LoadF32(df, src + j), df, dst + j);
  for (; j < n; ++j) dst[j] = to_f32(src[j]);
}
template <bool kStream, bool kNative, class T>
HWY_INLINE void RowFromF32(const float* src, T* dst, int64_t col, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (col != 1) {
    for (int64_t j = 0; j < n; ++j) dst[j * col] = from_f32<T>(src[j]);
    return;
  }
  int64_t j = 0;
  // Non-temporal stores only of whole 16-byte vectors (see rms_norm_gated/cpu-inl.h).
  if (kStream && hn::Lanes(df) * sizeof(T) >= 16 && tv::StreamAligned(df, dst))
    for (; j + N <= n; j += N) tv::StoreOut<true, kNative>(df, hn::LoadU(df, src + j), dst + j);
  for (; j + N <= n; j += N) tv::StoreOut<false, kNative>(df, hn::LoadU(df, src + j), dst + j);
  for (; j < n; ++j) dst[j] = from_f32<T>(src[j]);
}

// Gate and linear value of pair i from the f32 row xs (2I elements).
HWY_INLINE void PairsAt(DF df, const float* xs, int64_t I, int64_t i, bool interleaved, VF& A, VF& B) {
  if (interleaved) {
    hn::LoadInterleaved2(df, xs + 2 * i, A, B);
  } else {
    A = hn::LoadU(df, xs + i);
    B = hn::LoadU(df, xs + I + i);
  }
}

// Direct rows: unit column stride and a layout the pairs can be taken from without a scratch row (split: two
// plain loads; interleaved: f32 de-interleaving loads, or for bf16 one u32 load per pair, whose low half is
// the gate and high half the linear value, so the conversion is a shift and a mask). Same math and order as
// the scratch path, so the results are the same bits; the scratch path stays for strided rows and
// interleaved f16.
template <class T>
HWY_INLINE bool DirectRows(bool interleaved, const RowLayout& in, const RowLayout& out) {
  return in.col_stride == 1 && out.col_stride == 1 && (!interleaved || !std::is_same_v<T, f16_t>);
}
template <bool kInter, class T>
HWY_INLINE void PairsDirect(DF df, const T* xr, int64_t I, int64_t i, VF& A, VF& B) {
  if constexpr (!kInter) {
    A = tv::LoadF32(df, xr + i);
    B = tv::LoadF32(df, xr + I + i);
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    const hn::RebindToUnsigned<DF> du;
    const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(xr + 2 * i));
    A = hn::BitCast(df, hn::ShiftLeft<16>(w));
    B = hn::BitCast(df, hn::And(w, hn::Set(du, 0xffff0000u)));
  } else if constexpr (std::is_same_v<T, float>) {
    hn::LoadInterleaved2(df, xr + 2 * i, A, B);
  } else {  // f16 interleaved: not a direct layout (DirectRows), never called
    A = B = hn::Zero(df);
  }
}
// Stores dA (gate column) and dB (linear column) of pairs [i, i + N) of a direct dx row.
template <bool kStream, bool kNative, bool kInter, class T>
HWY_INLINE void StorePairsDirect(DF df, T* dxr, int64_t I, int64_t i, VF dA, VF dB) {
  if constexpr (!kInter) {
    tv::StoreOut<kStream, kNative>(df, dA, dxr + i);
    tv::StoreOut<kStream, kNative>(df, dB, dxr + I + i);
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    const hn::RebindToUnsigned<DF> du;
#if STRATA_NATIVE_BF16
    if constexpr (kNative) {
      // (dA_i, dB_i) pairs: each vector rounded to 16 bf16 by vcvtneps2bf16, widened to u32 lanes, dB shifted
      // into the high halves.
      const auto a = hn::Vec<decltype(du)>{_mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(dA.raw)))};
      const auto b = hn::Vec<decltype(du)>{_mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(dB.raw)))};
      hn::StoreU(hn::Or(a, hn::ShiftLeft<16>(b)), du, reinterpret_cast<uint32_t*>(dxr + 2 * i));
      return;
    }
#endif
    const auto w = hn::Or(tv::Bf16Bits(df, dA), hn::ShiftLeft<16>(tv::Bf16Bits(df, dB)));
    hn::StoreU(w, du, reinterpret_cast<uint32_t*>(dxr + 2 * i));
  } else if constexpr (std::is_same_v<T, float>) {
    hn::StoreInterleaved2(dA, dB, df, dxr + 2 * i);
  }
}
// Prefetch (tile/cpu/vec-inl.h) ahead of the loads (and the backward's plain dx stores) of one main-loop step of a
// direct row: U vectors of pairs (U N pairs: at least one 64-byte line per stream on every vector target, so no
// per-vector branch).
template <bool kInter, int U, class T>
HWY_INLINE void PrefetchStep(const T* xr, int64_t I, int64_t i) {
  constexpr int64_t kV = static_cast<int64_t>(U * hn::MaxLanes(DF()) * sizeof(T));
  if constexpr (kInter) {
    tv::PrefetchAhead<2 * kV>(xr + 2 * i);
  } else {
    tv::PrefetchAhead<kV>(xr + i);
    tv::PrefetchAhead<kV>(xr + I + i);
  }
}

// U vectors of pairs starting at pair i: y = a s (b + bias) p (p = 1 without probs: an exact product, so the
// same bits as leaving it out).
template <bool kStream, bool kNative, bool kInter, int U, class T>
HWY_INLINE void FwdStep(DF df, const T* xr, T* yr, int64_t I, int64_t i, VF alpha, VF limit, VF bias, VF vp) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF A[U], B[U];
  PairV q[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) PairsDirect<kInter>(df, xr, I, i + u * N, A[u], B[u]);
  PairN<T, true>(df, A, B, alpha, limit, bias, q);
  VF y[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) y[u] = hn::Mul(hn::Mul(hn::Mul(q[u].a, q[u].s), q[u].bb), vp);
  if constexpr (U % 2 == 0) {
#pragma GCC unroll 8
    for (int u = 0; u < U; u += 2) tv::StoreOut2<kStream, kNative>(df, y[u], y[u + 1], yr + i + u * N);
  } else {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) tv::StoreOut<kStream, kNative>(df, y[u], yr + i + u * N);
  }
}

template <bool kStream, bool kNative, bool kInter, class T>
void FwdRowDirect(const ClippedSwigluFwdParams& p, const T* xr, T* yr, float pr) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), I = p.I;
  const VF alpha = hn::Set(df, p.alpha), limit = hn::Set(df, p.limit), bias = hn::Set(df, p.bias);
  const VF vp = hn::Set(df, pr);
  int64_t i = 0;
  for (; i + kU * N <= I; i += kU * N) {
    PrefetchStep<kInter, kU>(xr, I, i);
    FwdStep<kStream, kNative, kInter, kU>(df, xr, yr, I, i, alpha, limit, bias, vp);
  }
  for (; i + N <= I; i += N) FwdStep<kStream, kNative, kInter, 1>(df, xr, yr, I, i, alpha, limit, bias, vp);
  for (; i < I; ++i) {
    const float y0 = csw_fwd<float>(to_f32(xr[csw_gate_col(kInter, I, i)]), to_f32(xr[csw_lin_col(kInter, I, i)]),
                                    p.alpha, p.limit, p.bias);
    yr[i] = from_f32<T>(p.probs ? y0 * pr : y0);
  }
}

template <bool kNative, class T>
void FwdRows(const ClippedSwigluFwdParams& p) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t I = p.I;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const bool stream = p.rows * I * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
  const VF alpha = hn::Set(df, p.alpha), limit = hn::Set(df, p.limit), bias = hn::Set(df, p.bias);
  // Flags as locals: stores through float pointers would otherwise make the compiler reload them from p.
  const bool inter = p.interleaved, has_p = p.probs != nullptr;
  const bool direct = DirectRows<T>(inter, p.x_rows, p.y_rows);
  tile::parallel_blocks(p.rows, tile::block_for_bytes(3 * I * static_cast<int64_t>(sizeof(T))), [&](int64_t r0, int64_t r1) {
    if (direct) {
      for (int64_t r = r0; r < r1; ++r) {
        const float pr = p.probs ? static_cast<float>(load_elem(p.probs, p.probs_dtype, p.probs_rows.row_offset(r))) : 1.f;
        T* yr = y + p.y_rows.row_offset(r);
        // Non-temporal stores only of whole 16-byte vectors at aligned row starts.
        const T* xr = x + p.x_rows.row_offset(r);
        if (stream && hn::Lanes(df) * sizeof(T) >= 16 && tv::StreamAligned(df, yr)) {
          if (inter) FwdRowDirect<true, kNative, true>(p, xr, yr, pr);
          else FwdRowDirect<true, kNative, false>(p, xr, yr, pr);
        } else {
          if (inter) FwdRowDirect<false, kNative, true>(p, xr, yr, pr);
          else FwdRowDirect<false, kNative, false>(p, xr, yr, pr);
        }
      }
      if (stream) hwy::FlushStream();
      return;
    }
    std::vector<float> xs(static_cast<size_t>(2 * I)), ys(static_cast<size_t>(I));
    for (int64_t r = r0; r < r1; ++r) {
      RowToF32(x + p.x_rows.row_offset(r), p.x_rows.col_stride, xs.data(), 2 * I);
      const float pr = p.probs ? static_cast<float>(load_elem(p.probs, p.probs_dtype, p.probs_rows.row_offset(r))) : 1.f;
      const VF vp = hn::Set(df, pr);
      int64_t i = 0;
      for (; i + N <= I; i += N) {
        VF A, B;
        PairsAt(df, xs.data(), I, i, inter, A, B);
        const PairV q = Pair<T, true>(df, A, B, alpha, limit, bias);
        VF out = hn::Mul(hn::Mul(q.a, q.s), q.bb);
        if (has_p) out = hn::Mul(out, vp);
        hn::StoreU(out, df, ys.data() + i);
      }
      for (; i < I; ++i) {
        const float y0 = csw_fwd<float>(xs[csw_gate_col(p.interleaved, I, i)], xs[csw_lin_col(p.interleaved, I, i)],
                                        p.alpha, p.limit, p.bias);
        ys[i] = p.probs ? y0 * pr : y0;
      }
      T* yr = y + p.y_rows.row_offset(r);
      if (stream) RowFromF32<true, kNative>(ys.data(), yr, p.y_rows.col_stride, I);
      else RowFromF32<false, kNative>(ys.data(), yr, p.y_rows.col_stride, I);
    }
    if (stream) hwy::FlushStream();
  });
}

// Gradients of U vectors of pairs: dA = g (b + bias) s (1 + alpha a (1 - s)) [A <= limit],
// dB = g a s [-limit <= B <= limit] with g = dy * p (p = 1 without probs: exact); acc += y0 * dy in vector order
// (the dprobs sum).
struct GradV {
  VF dA, dB;
};
template <class T, int U>
HWY_INLINE void GradN(DF df, const VF (&A)[U], const VF (&B)[U], const VF (&gy)[U], VF vp, VF alpha, VF limit,
                      VF bias, VF& acc, GradV (&d)[U]) {
  const VF one = hn::Set(df, 1.f);
  PairV q[U];
  PairN<T, false>(df, A, B, alpha, limit, bias, q);
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    const VF g = hn::Mul(gy[u], vp);
    const VF as = hn::Mul(q[u].a, q[u].s);
    acc = hn::MulAdd(hn::Mul(as, q[u].bb), gy[u], acc);
    const VF dA0 =
        hn::Mul(hn::Mul(g, hn::Mul(q[u].bb, q[u].s)), hn::MulAdd(hn::Mul(alpha, q[u].a), hn::Sub(one, q[u].s), one));
    d[u].dA = hn::IfThenElseZero(hn::Le(A[u], limit), dA0);
    d[u].dB = hn::IfThenElseZero(hn::And(hn::Ge(B[u], hn::Neg(limit)), hn::Le(B[u], limit)), hn::Mul(g, as));
  }
}

// U vectors of pairs of a direct row starting at pair i.
template <bool kStream, bool kNative, bool kInter, int U, class T>
HWY_INLINE void BwdStep(DF df, const T* xr, const T* dyr, T* dxr, int64_t I, int64_t i, VF alpha, VF limit, VF bias,
                        VF vp, VF& acc) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF A[U], B[U], gy[U];
  GradV d[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    PairsDirect<kInter>(df, xr, I, i + u * N, A[u], B[u]);
    gy[u] = tv::LoadF32(df, dyr + i + u * N);
  }
  GradN<T>(df, A, B, gy, vp, alpha, limit, bias, acc, d);
  if constexpr (!kInter && U % 2 == 0) {
    // The split layout's dA and dB halves: two vectors at a time into each (tile/cpu/vec_pair-inl.h).
#pragma GCC unroll 8
    for (int u = 0; u < U; u += 2) {
      tv::StoreOut2<kStream, kNative>(df, d[u].dA, d[u + 1].dA, dxr + i + u * N);
      tv::StoreOut2<kStream, kNative>(df, d[u].dB, d[u + 1].dB, dxr + I + i + u * N);
    }
  } else {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) StorePairsDirect<kStream, kNative, kInter>(df, dxr, I, i + u * N, d[u].dA, d[u].dB);
  }
}

// One direct row (DirectRows): returns the row's dprobs sum.
template <bool kStream, bool kNative, bool kInter, class T>
float BwdRowDirect(const ClippedSwigluBwdParams& p, const T* xr, const T* dyr, T* dxr, float pr) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), I = p.I;
  const VF alpha = hn::Set(df, p.alpha), limit = hn::Set(df, p.limit), bias = hn::Set(df, p.bias);
  const VF vp = hn::Set(df, pr);
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + kU * N <= I; i += kU * N) {
    PrefetchStep<kInter, kU>(xr, I, i);
    tv::PrefetchAhead<static_cast<int64_t>(kU * hn::MaxLanes(DF()) * sizeof(T))>(dyr + i);
    // dx's lines too, when written with plain stores (the split layout on AMD CPUs, tile/cpu/stream_policy.h; rows
    // below the streaming size): the read-for-ownership of each new line then does not stall the stores (session
    // 17, EPYC, [1024, 4096] split bf16 from memory, 1 thread: +13-15 %). Not before non-temporal stores, which
    // skip that read.
    if constexpr (!kStream) PrefetchStep<kInter, kU>(dxr, I, i);
    BwdStep<kStream, kNative, kInter, kU>(df, xr, dyr, dxr, I, i, alpha, limit, bias, vp, acc);
  }
  for (; i + N <= I; i += N) BwdStep<kStream, kNative, kInter, 1>(df, xr, dyr, dxr, I, i, alpha, limit, bias, vp, acc);
  float dp = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < I; ++i) {
    const int64_t ga = csw_gate_col(kInter, I, i), lb = csw_lin_col(kInter, I, i);
    const float gy = to_f32(dyr[i]);
    float dA, dB;
    dp += csw_bwd<float>(to_f32(xr[ga]), to_f32(xr[lb]), gy * pr, p.alpha, p.limit, p.bias, &dA, &dB) * gy;
    dxr[ga] = from_f32<T>(dA), dxr[lb] = from_f32<T>(dB);
  }
  return dp;
}

template <bool kNative, class T>
void BwdRows(const ClippedSwigluBwdParams& p) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t I = p.I;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  // The split layout writes two interleaved output streams (the dA and dB halves of a row): non-temporal only where
  // the CPU takes those well (tile/cpu/stream_policy.h: plain stores on AMD Zen, 3.1 x faster there).
  const bool stream = p.rows * 2 * I * static_cast<int64_t>(sizeof(T)) >= kStreamBytes &&
                      (p.interleaved || tile::cpu_streams_two_outputs());
  const VF alpha = hn::Set(df, p.alpha), limit = hn::Set(df, p.limit), bias = hn::Set(df, p.bias);
  const bool inter = p.interleaved;  // a local: see FwdRows
  const bool direct = DirectRows<T>(inter, p.x_rows, p.dx_rows) && p.dy_rows.col_stride == 1;
  tile::parallel_blocks(p.rows, tile::block_for_bytes(5 * I * static_cast<int64_t>(sizeof(T)) + 1), [&](int64_t r0, int64_t r1) {
    std::vector<float> xs, gs, ds;
    if (!direct) xs.resize(2 * I), gs.resize(I), ds.resize(2 * I);
    for (int64_t r = r0; r < r1; ++r) {
      const float pr = p.probs ? static_cast<float>(load_elem(p.probs, p.probs_dtype, p.probs_rows.row_offset(r))) : 1.f;
      T* dxr = dx + p.dx_rows.row_offset(r);
      float dp;
      if (direct) {
        const T* xr = x + p.x_rows.row_offset(r);
        const T* dyr = dy + p.dy_rows.row_offset(r);
        // Non-temporal stores only of whole 16-byte vectors at aligned row starts (and 2I-element rows of
        // whole vectors for the split layout's second half).
        if (stream && hn::Lanes(df) * sizeof(T) >= 16 && tv::StreamAligned(df, dxr) &&
            (inter || tv::StreamAligned(df, dxr + I))) {
          dp = inter ? BwdRowDirect<true, kNative, true>(p, xr, dyr, dxr, pr)
                     : BwdRowDirect<true, kNative, false>(p, xr, dyr, dxr, pr);
        } else {
          dp = inter ? BwdRowDirect<false, kNative, true>(p, xr, dyr, dxr, pr)
                     : BwdRowDirect<false, kNative, false>(p, xr, dyr, dxr, pr);
        }
      } else {
        RowToF32(x + p.x_rows.row_offset(r), p.x_rows.col_stride, xs.data(), 2 * I);
        RowToF32(dy + p.dy_rows.row_offset(r), p.dy_rows.col_stride, gs.data(), I);
        const VF vp = hn::Set(df, pr);
        VF acc = hn::Zero(df);
        int64_t i = 0;
        for (; i + N <= I; i += N) {
          VF A, B;
          PairsAt(df, xs.data(), I, i, inter, A, B);
          const VF a[1] = {A}, b[1] = {B}, g[1] = {hn::LoadU(df, gs.data() + i)};
          GradV d[1];
          GradN<T>(df, a, b, g, vp, alpha, limit, bias, acc, d);
          if (inter) {
            hn::StoreInterleaved2(d[0].dA, d[0].dB, df, ds.data() + 2 * i);
          } else {
            hn::StoreU(d[0].dA, df, ds.data() + i);
            hn::StoreU(d[0].dB, df, ds.data() + I + i);
          }
        }
        dp = hn::GetLane(hn::SumOfLanes(df, acc));
        for (; i < I; ++i) {
          const int64_t ga = csw_gate_col(inter, I, i), lb = csw_lin_col(inter, I, i);
          float dA, dB;
          dp += csw_bwd<float>(xs[ga], xs[lb], gs[i] * pr, p.alpha, p.limit, p.bias, &dA, &dB) * gs[i];
          ds[ga] = dA, ds[lb] = dB;
        }
        if (stream) RowFromF32<true, kNative>(ds.data(), dxr, p.dx_rows.col_stride, 2 * I);
        else RowFromF32<false, kNative>(ds.data(), dxr, p.dx_rows.col_stride, 2 * I);
      }
      if (p.dprobs) store_elem(p.dprobs, p.dprobs_dtype, p.dprobs_rows.row_offset(r), dp);
    }
    if (stream) hwy::FlushStream();
  });
}

}  // namespace strata::activation::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
