// CPU kernels of the row norms (row_norm.h), written once with Highway and compiled for every target in
// tile::cpu_isas(). Rows are split into fixed blocks (tile/cpu/parallel.h); each row is reduced in a fixed
// order by one thread, so results do not depend on the thread count or on the other rows.
//
// Build layout (build time is a budget, STYLE.md 12): the kernel bodies live only here. Each
// row_norm_cpu_{fwd,bwd}_<dtype>.cpp unit includes this file for every target (tile/cpu/foreach_isa.h) and
// instantiates one dtype family: the forward units one x dtype (with every y dtype), the backward units one
// dx dtype (with every src and dout dtype). row_norm_cpu.cpp declares the units' entry points, dispatches on
// the run-time dtype to them, and owns the one HWY_EXPORT table per entry point that the implementation lists
// read. So the 9 forward and 27 backward dtype combinations (the plan accepts any mix of f32/bf16/f16)
// compile in parallel translation units instead of one.
//
// The "native bf16" instances (cpu.avx512_bf16: AVX512-BF16 instructions on the AVX3 target) exist only where
// they differ from the portable ones: on AVX3 (STRATA_NATIVE_BF16), and only for the forward combinations with
// bf16 x or y and the backward ones with bf16 dx. They reduce bf16 rows with vdpbf16ps (the forward's sum of
// squares of bf16 x; the backward's dot of bf16 dy and src when dx is bf16: other bits than the portable
// reductions) and write bf16 outputs 32 elements at a time in whole 64-byte lines with vcvtne2ps2bf16 (the same
// bits as the portable stores). Every other combination of a native entry point runs the portable instance.

// Per-target include guard (Highway's convention for -inl.h files).
#if defined(STRATA_OPS_NORM_ROW_NORM_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_OPS_NORM_ROW_NORM_CPU_INL_H_
#undef STRATA_OPS_NORM_ROW_NORM_CPU_INL_H_
#else
#define STRATA_OPS_NORM_ROW_NORM_CPU_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/norm/common/row_norm.h"
#include "tile/cpu/parallel.h"
#define STRATA_WANT_AVX512_BF16  // the "cpu.avx512_bf16" instances (tile/cpu/vec-inl.h)
#include "tile/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // as in tile/cpu/vec-inl.h: lets the native-bf16 instances use AVX512-BF16
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
namespace tv = strata::tile::HWY_NAMESPACE;
namespace hn = hwy::HWY_NAMESPACE;

// ---- the units' entry points (defined in row_norm_cpu_{fwd,bwd}_<dtype>.cpp, called by row_norm_cpu.cpp) ----
// Forward, by x dtype (any y dtype).
void RowNormFwdXF32(const RowNormFwdParams& p);
void RowNormFwdXBf16(const RowNormFwdParams& p);
void RowNormFwdXF16(const RowNormFwdParams& p);
// Backward, by dx dtype (any src and dout dtype).
void RowNormBwdDxF32(const RowNormBwdParams& p);
void RowNormBwdDxBf16(const RowNormBwdParams& p);
void RowNormBwdDxF16(const RowNormBwdParams& p);
#if STRATA_NATIVE_BF16
// The AVX512-BF16 instances (AVX3 only): forward for each x dtype (the combinations with bf16 x or y), backward
// for bf16 dx.
void RowNormFwdXF32Native(const RowNormFwdParams& p);
void RowNormFwdXBf16Native(const RowNormFwdParams& p);
void RowNormFwdXF16Native(const RowNormFwdParams& p);
void RowNormBwdDxBf16Native(const RowNormBwdParams& p);
#endif

// Outputs at least this large are written with non-temporal stores (they would not stay in cache anyway).
constexpr int64_t kStreamBytes = 4 << 20;
// Most rows reduced before any is scaled (see FwdRows).
constexpr int64_t kGroup = 64;

// A short contiguous row of exactly NV vectors, held in registers: one load and one conversion per element
// (the general path reads each row twice). Sum of squares in vector order, then one reduction.
template <int NV, bool kStream, bool kNative, class TX, class TY>
HWY_INLINE float ShortRow(const TX* HWY_RESTRICT xr, TY* HWY_RESTRICT yr, float inv_n, float eps) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<decltype(df)> v[NV];
  // Rows follow each other in memory in the common layouts: the lines 4 KiB ahead are a later row's.
  tv::PrefetchAhead<static_cast<int64_t>(NV * hn::MaxLanes(df) * sizeof(TX))>(xr);
#pragma GCC unroll 16
  for (int k = 0; k < NV; ++k) v[k] = tv::LoadF32(df, xr + k * N);
  auto a0 = hn::Mul(v[0], v[0]);
  auto a1 = NV > 1 ? hn::Mul(v[NV > 1 ? 1 : 0], v[NV > 1 ? 1 : 0]) : hn::Zero(df);
#pragma GCC unroll 16
  for (int k = 2; k < NV; k += 2) {
    a0 = hn::MulAdd(v[k], v[k], a0);
    if (k + 1 < NV) a1 = hn::MulAdd(v[k + 1], v[k + 1], a1);
  }
  const float ss = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
  const float rstd = 1.0f / std::sqrt(ss * inv_n + eps);
  if (yr) {
    const auto vs = hn::Set(df, rstd);
#pragma GCC unroll 16
    for (int k = 0; k < NV; ++k) tv::StoreOut<kStream, kNative>(df, hn::Mul(v[k], vs), yr + k * N);
  }
  return rstd;
}

// Rows of 1, 2, 4 or 8 whole vectors: ShortRow for every row of [r0, r1). Returns false if D is not such a size.
template <bool kNative, class TX, class TY>
bool ShortRows(const RowNormFwdParams& p, const TX* x, TY* y, int64_t r0, int64_t r1, bool stream, float inv_n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (p.D % N != 0) return false;
  // Streaming stores need every row start aligned to the stored vector.
  if (y && stream && !tv::StreamRowsAligned(df, y + p.y_rows.row_offset(r0), p.y_rows.row_stride())) stream = false;
  return tv::VisitShortRow(p.D / N, stream, [&](auto nv_tag, auto stream_tag) {
    constexpr int NV = decltype(nv_tag)::value;
    constexpr bool S = decltype(stream_tag)::value;
    for (int64_t r = r0; r < r1; ++r) {
      const float rstd = ShortRow<NV, S, kNative>(x + p.x_rows.row_offset(r), y ? y + p.y_rows.row_offset(r) : nullptr,
                                                  inv_n, p.eps);
      store_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r), rstd);
    }
  });
}

#if STRATA_NATIVE_BF16
// Sum of squares of a bf16 row with AVX512-BF16's vdpbf16ps: 32 elements per instruction, read as they are
// stored (no widening to f32 first: that took two instructions per 16 elements, and the bf16 forward is
// instruction-bound when the two cores are shared). Each lane adds its two exact products (bf16 x bf16 fits in
// f32) in turn with round-to-nearest, like two FMAs; subnormal bf16 inputs count as 0 (their squares
// underflow f32 anyway). Four accumulators over 128-element steps, then 32-element steps into the first, the
// lane sum and the scalar tail: a fixed order, so a row's result depends only on the row.
HWY_INLINE float SumSquaresBf16Dp(const bf16_t* x, int64_t n) {
  const hn::ScalableTag<float> df;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  auto ld = [&](int64_t i) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i)); };
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    tv::PrefetchAhead<256>(x + i);
    const __m512bh v0 = ld(i), v1 = ld(i + 32), v2 = ld(i + 64), v3 = ld(i + 96);
    a0 = _mm512_dpbf16_ps(a0, v0, v0);
    a1 = _mm512_dpbf16_ps(a1, v1, v1);
    a2 = _mm512_dpbf16_ps(a2, v2, v2);
    a3 = _mm512_dpbf16_ps(a3, v3, v3);
  }
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = ld(i);
    a0 = _mm512_dpbf16_ps(a0, v, v);
  }
  const hn::Vec<decltype(df)> acc{_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))};
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) {
    const float v = to_f32(x[i]);
    s += v * v;
  }
  return s;
}

// dot(a, b) of two bf16 rows with vdpbf16ps, as SumSquaresBf16Dp (the same order and rounding; the backward's
// reduction pass): 32 products per instruction instead of two widenings and an FMA per 16.
HWY_INLINE float DotBf16Dp(const bf16_t* a, const bf16_t* b, int64_t n) {
  const hn::ScalableTag<float> df;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  auto ld = [](const bf16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); };
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    tv::PrefetchAhead<256>(a + i);
    tv::PrefetchAhead<256>(b + i);
    a0 = _mm512_dpbf16_ps(a0, ld(a + i), ld(b + i));
    a1 = _mm512_dpbf16_ps(a1, ld(a + i + 32), ld(b + i + 32));
    a2 = _mm512_dpbf16_ps(a2, ld(a + i + 64), ld(b + i + 64));
    a3 = _mm512_dpbf16_ps(a3, ld(a + i + 96), ld(b + i + 96));
  }
  for (; i + 32 <= n; i += 32) a0 = _mm512_dpbf16_ps(a0, ld(a + i), ld(b + i));
  const hn::Vec<decltype(df)> acc{_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))};
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += to_f32(a[i]) * to_f32(b[i]);
  return s;
}

// ---- bf16 outputs in whole 64-byte lines (the scaling passes of the native instances) ----
// The portable passes convert and store 16 elements at a time: per 16 bf16 inputs a widening load and a shift,
// and per 16 outputs a vcvtneps2bf16 and a 32-byte store (two per cache line, a half-line non-temporal write
// each). Here 32 elements go per step: bf16 inputs are one 64-byte load split into the even elements (shift
// left 16) and the odd ones (mask of the high halves), no widening shuffles; the results are rounded by one
// vcvtne2ps2bf16 (round to nearest even, as vcvtneps2bf16), put back in element order by one vpermw, and stored
// as one 64-byte line. Each element is computed exactly as in the portable pass, so the bits are the same.

// 32 elements of T at p as two f32 vectors: kEvenOdd (T = bf16) the even elements in `a` and the odd ones in
// `b`; otherwise elements 0-15 in `a` and 16-31 in `b`.
template <bool kEvenOdd, class T>
HWY_INLINE void Load32(const T* p, __m512& a, __m512& b) {
  if constexpr (kEvenOdd) {
    static_assert(std::is_same_v<T, bf16_t>, "the even/odd split reads bf16");
    const __m512i v = _mm512_loadu_si512(p);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    const hn::ScalableTag<float> df;
    a = tv::LoadF32(df, p).raw;
    b = tv::LoadF32(df, p + 16).raw;
  }
}
// Rounds the 32 values of Load32's layout `kEvenOdd` to bf16 and stores them in element order at p (64 bytes;
// kStream: a non-temporal store, p 64-byte aligned).
template <bool kEvenOdd, bool kStream>
HWY_INLINE void Store32Bf16(bf16_t* p, __m512 a, __m512 b) {
  __m512i v = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // words 0-15 from a, 16-31 from b
  if constexpr (kEvenOdd) {
    // Word j of the result is word j / 2 (j even, from a) or 16 + j / 2 (j odd, from b).
    alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                            21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                            11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    v = _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), v);
  }
  if constexpr (kStream) _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
  else _mm512_storeu_si512(p, v);
}

// The element loop of the two passes below: the 32-element steps `step(i, stream_tag)`, then single 16-element
// vectors `vec(i, stream_tag)` and scalar elements `scalar(i)` for the tail. Non-temporal stores (kStream) need
// 64-byte aligned lines: a row starting 32 bytes into a line (common for odd row lengths) first takes one
// 16-element vector with a 32-byte non-temporal store; a row not 32-byte aligned is stored normally.
template <bool kStream, class Step, class Vec, class Scalar>
HWY_INLINE void Bf16OutLoop(const bf16_t* y, int64_t n, Step&& step, Vec&& vec, Scalar&& scalar) {
  int64_t i = 0;
  auto body = [&](auto stream_tag) {
    for (; i + 32 <= n; i += 32) step(i, stream_tag);
    for (; i + 16 <= n; i += 16) vec(i, stream_tag);
  };
  const uintptr_t a = reinterpret_cast<uintptr_t>(y);
  if (kStream && a % 32 == 0) {
    if (a % 64 != 0 && n >= 16) {
      vec(0, std::true_type{});
      i = 16;
    }
    body(std::true_type{});
  } else {
    body(std::false_type{});
  }
  for (; i < n; ++i) scalar(i);
}

// y[i] = x[i] * s to bf16 (tv::Scale's values). next: a row read after this one, prefetched alongside (see
// tv::Scale); kPrefetch: x streams from memory, prefetch ahead of it.
template <bool kStream, bool kPrefetch = false, class TX>
HWY_INLINE void ScaleToBf16(const TX* HWY_RESTRICT x, float s, bf16_t* HWY_RESTRICT y, int64_t n,
                            const TX* next = nullptr) {
  constexpr bool kEO = std::is_same_v<TX, bf16_t>;
  constexpr int64_t kStep = 32 * static_cast<int64_t>(sizeof(TX));
  const hn::ScalableTag<float> df;
  const __m512 vs = _mm512_set1_ps(s);
  Bf16OutLoop<kStream>(
      y, n,
      [&](int64_t i, auto stream_tag) {
        if (next) tv::PrefetchAhead<kStep, 0>(next + i);
        if constexpr (kPrefetch) tv::PrefetchAhead<kStep>(x + i);
        __m512 a, b;
        Load32<kEO>(x + i, a, b);
        Store32Bf16<kEO, decltype(stream_tag)::value>(y + i, _mm512_mul_ps(a, vs), _mm512_mul_ps(b, vs));
      },
      [&](int64_t i, auto stream_tag) {
        tv::StoreOut<decltype(stream_tag)::value, true>(df, hn::Mul(tv::LoadF32(df, x + i), hn::Set(df, s)), y + i);
      },
      [&](int64_t i) { y[i] = from_f32<bf16_t>(to_f32(x[i]) * s); });
}

// out[i] = s * (a[i] - c * b[i]) to bf16 (tv::ScaledSubScaled's values); next_a / next_b as there.
template <bool kStream, class TA, class TB>
HWY_INLINE void ScaledSubScaledToBf16(const TA* HWY_RESTRICT a, const TB* HWY_RESTRICT b, float c, float s,
                                      bf16_t* HWY_RESTRICT out, int64_t n, const TA* next_a, const TB* next_b) {
  constexpr bool kEO = std::is_same_v<TA, bf16_t> && std::is_same_v<TB, bf16_t>;
  constexpr int64_t kStepA = 32 * static_cast<int64_t>(sizeof(TA));
  constexpr int64_t kStepB = 32 * static_cast<int64_t>(sizeof(TB));
  const hn::ScalableTag<float> df;
  const __m512 vc = _mm512_set1_ps(c), vs = _mm512_set1_ps(s);
  Bf16OutLoop<kStream>(
      out, n,
      [&](int64_t i, auto stream_tag) {
        if (next_a) {
          tv::PrefetchAhead<kStepA, 0>(next_a + i);
          tv::PrefetchAhead<kStepB, 0>(next_b + i);
        }
        __m512 a0, a1, b0, b1;
        Load32<kEO>(a + i, a0, a1);
        Load32<kEO>(b + i, b0, b1);
        Store32Bf16<kEO, decltype(stream_tag)::value>(out + i, _mm512_mul_ps(vs, _mm512_fnmadd_ps(vc, b0, a0)),
                                                      _mm512_mul_ps(vs, _mm512_fnmadd_ps(vc, b1, a1)));
      },
      [&](int64_t i, auto stream_tag) {
        tv::StoreOut<decltype(stream_tag)::value, true>(
            df, hn::Mul(hn::Set(df, s), hn::NegMulAdd(hn::Set(df, c), tv::LoadF32(df, b + i), tv::LoadF32(df, a + i))),
            out + i);
      },
      [&](int64_t i) { out[i] = from_f32<bf16_t>(s * (to_f32(a[i]) - c * to_f32(b[i]))); });
}

// ---- the bf16 -> bf16 forward of long rows, skewed (cpu.avx512_bf16) ----
// The grouped passes of FwdRows read a group's rows from memory during the previous group's scaling pass
// (prefetch) and then reduce them from L1, so the memory idles while a group is reduced. Skewed, one loop
// scales row r (read a moment ago, now in L1) while it reduces row r + 1 from memory: reads and writes stream
// without a pause (a single-thread microbenchmark: about 10 % more bandwidth than the grouped passes). A row's
// sum of squares has one order whether it is reduced alone (the first row of a block) or beside the scaling
// of the row before (SumSquaresBf16Skew's: two vdpbf16ps accumulators over 64-element steps, one 32-element
// step into the first, the lane sum, the scalar tail), so results stay batch- and thread-invariant.
HWY_INLINE float SumSquaresBf16Skew(const bf16_t* x, int64_t n) {
  auto ld = [](const bf16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); };
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    tv::PrefetchAhead<128>(x + i);
    a0 = _mm512_dpbf16_ps(a0, ld(x + i), ld(x + i));
    a1 = _mm512_dpbf16_ps(a1, ld(x + i + 32), ld(x + i + 32));
  }
  if (i + 32 <= n) {
    a0 = _mm512_dpbf16_ps(a0, ld(x + i), ld(x + i));
    i += 32;
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  for (; i < n; ++i) s = std::fma(to_f32(x[i]), to_f32(x[i]), s);  // as in ScaleBf16AndSumSquaresNext
  return s;
}

// y = x * s (x re-read from L1) and, in the same loop, the sum of squares of xn (the next row, from memory) in
// SumSquaresBf16Skew's order, returned. kStream: non-temporal stores, y 64-byte aligned.
template <bool kStream>
HWY_INLINE float ScaleBf16AndSumSquaresNext(const bf16_t* HWY_RESTRICT x, float s, bf16_t* HWY_RESTRICT y,
                                            const bf16_t* HWY_RESTRICT xn, int64_t n) {
  auto ld = [](const bf16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); };
  const __m512 vs = _mm512_set1_ps(s);
  auto scale32 = [&](int64_t i) {
    __m512 a, b;
    Load32<true>(x + i, a, b);
    Store32Bf16<true, kStream>(y + i, _mm512_mul_ps(a, vs), _mm512_mul_ps(b, vs));
  };
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    tv::PrefetchAhead<128>(xn + i);
    a0 = _mm512_dpbf16_ps(a0, ld(xn + i), ld(xn + i));
    a1 = _mm512_dpbf16_ps(a1, ld(xn + i + 32), ld(xn + i + 32));
    scale32(i);
    scale32(i + 32);
  }
  if (i + 32 <= n) {
    a0 = _mm512_dpbf16_ps(a0, ld(xn + i), ld(xn + i));
    scale32(i);
    i += 32;
  }
  float ss = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  for (int64_t k = i; k < n; ++k) ss = std::fma(to_f32(xn[k]), to_f32(xn[k]), ss);
  const hn::ScalableTag<float> df;
  if (i + 16 <= n) {  // y + i is 64-byte aligned here when kStream
    tv::StoreOut<kStream, true>(df, hn::Mul(tv::LoadF32(df, x + i), hn::Set(df, s)), y + i);
    i += 16;
  }
  for (; i < n; ++i) y[i] = from_f32<bf16_t>(to_f32(x[i]) * s);
  return ss;
}

// The rows [r0, r1) of a bf16 -> bf16 forward, skewed. kStream: every y row 64-byte aligned (the caller checked).
template <bool kStream>
HWY_INLINE void SkewedRowsBf16(const RowNormFwdParams& p, int64_t r0, int64_t r1, float inv_n) {
  const bf16_t* x = static_cast<const bf16_t*>(p.x);
  bf16_t* y = static_cast<bf16_t*>(p.y);
  float ss = SumSquaresBf16Skew(x + p.x_rows.row_offset(r0), p.D);
  for (int64_t r = r0; r < r1; ++r) {
    const float rstd = 1.0f / std::sqrt(ss * inv_n + p.eps);
    store_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r), rstd);
    const bf16_t* xr = x + p.x_rows.row_offset(r);
    bf16_t* yr = y + p.y_rows.row_offset(r);
    if (r + 1 < r1) {
      ss = ScaleBf16AndSumSquaresNext<kStream>(xr, rstd, yr, x + p.x_rows.row_offset(r + 1), p.D);
    } else {
      // The next block's first row (the same thread's under the static split) is prefetched meanwhile.
      ScaleToBf16<kStream>(xr, rstd, yr, p.D, r + 1 < p.rows ? x + p.x_rows.row_offset(r + 1) : nullptr);
    }
  }
}

#endif

// Per-row kernels on typed pointers; strided rows (col_stride != 1) take the scalar loop.
template <class TX, class TY, bool kNative>
void FwdRows(const RowNormFwdParams& p) {
  const TX* x = static_cast<const TX*>(p.x);
  TY* y = static_cast<TY*>(p.y);
  const float inv_n = 1.0f / static_cast<float>(p.n_div);
  const bool unit = p.x_rows.col_stride == 1 && (!y || p.y_rows.col_stride == 1);
  const int64_t block = tile::block_for_bytes(p.D * static_cast<int64_t>(sizeof(TX) + (y ? sizeof(TY) : 0)));
  const bool stream = p.rows * p.D * static_cast<int64_t>(sizeof(TY)) >= kStreamBytes;
  // Rows go in groups that fit in L1: first every row's reduction (independent rows, so their latency chains
  // of reduce -> sqrt -> divide overlap), then every row's scaling, reading x again from L1.
  const int64_t group = std::clamp<int64_t>(16384 / std::max<int64_t>(p.D * sizeof(TX), 1), 1, kGroup);
  // Evenly spaced rows of whole vectors stay in registers (ShortRows).
  const bool short_ok = unit && p.x_rows.uniform() && (!y || p.y_rows.uniform());
  // bf16 -> bf16 rows of at least 64 elements take the skewed loop (cpu.avx512_bf16), whatever the batch size
  // and alignment, so a row's reduction order depends only on D (batch invariance); its non-temporal stores
  // need every y row 64-byte aligned, else it stores normally.
  [[maybe_unused]] const bool skew =
      kNative && std::is_same_v<TX, bf16_t> && std::is_same_v<TY, bf16_t> && unit && y && p.D >= 64;
  [[maybe_unused]] const bool skew_stream =
      skew && stream && p.y_rows.uniform() && reinterpret_cast<uintptr_t>(y + p.y_rows.row_offset(0)) % 64 == 0 &&
      (p.y_rows.row_stride() * static_cast<int64_t>(sizeof(TY))) % 64 == 0;
  tile::parallel_blocks(p.rows, block, [&](int64_t r0, int64_t r1) {
    if (short_ok && ShortRows<kNative>(p, x, y, r0, r1, stream, inv_n)) {
      if (stream) hwy::FlushStream();
      return;
    }
#if STRATA_NATIVE_BF16
    if constexpr (kNative && std::is_same_v<TX, bf16_t> && std::is_same_v<TY, bf16_t>) {
      if (skew) {
        if (skew_stream) SkewedRowsBf16<true>(p, r0, r1, inv_n);
        else SkewedRowsBf16<false>(p, r0, r1, inv_n);
        if (skew_stream) hwy::FlushStream();
        return;
      }
    }
#endif
    float rs[kGroup];
    for (int64_t g0 = r0; g0 < r1; g0 += group) {
      const int64_t g1 = std::min(r1, g0 + group);
      for (int64_t r = g0; r < g1; ++r) {
        const TX* xr = x + p.x_rows.row_offset(r);
        float ss;
        if (unit) {
#if STRATA_NATIVE_BF16
          if constexpr (kNative && std::is_same_v<TX, bf16_t>) ss = SumSquaresBf16Dp(xr, p.D);
          else ss = tv::SumSquares(xr, p.D);
#else
          ss = tv::SumSquares(xr, p.D);
#endif
        } else {
          ss = 0.f;
          for (int64_t j = 0; j < p.D; ++j) {
            const float v = to_f32(xr[j * p.x_rows.col_stride]);
            ss += v * v;
          }
        }
        rs[r - g0] = 1.0f / std::sqrt(ss * inv_n + p.eps);
        store_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r), rs[r - g0]);
      }
      if (!y) continue;
      for (int64_t r = g0; r < g1; ++r) {
        const TX* xr = x + p.x_rows.row_offset(r);
        TY* yr = y + p.y_rows.row_offset(r);
        const float rstd = rs[r - g0];
        // This pass reads x from L1: prefetch the row at the same place in the next group meanwhile.
        const TX* next = r + group < p.rows ? x + p.x_rows.row_offset(r + group) : nullptr;
#if STRATA_NATIVE_BF16
        if constexpr (kNative && std::is_same_v<TY, bf16_t>) {
          if (unit) {
            if (stream) ScaleToBf16<true>(xr, rstd, yr, p.D, next);
            else ScaleToBf16<false>(xr, rstd, yr, p.D, next);
            continue;
          }
        }
#endif
        if (unit && stream) {
          tv::Scale<true, kNative>(xr, rstd, yr, p.D, next);
        } else if (unit) {
          tv::Scale<false, kNative>(xr, rstd, yr, p.D, next);
        } else {
          for (int64_t j = 0; j < p.D; ++j)
            yr[j * p.y_rows.col_stride] = from_f32<TY>(to_f32(xr[j * p.x_rows.col_stride]) * rstd);
        }
      }
    }
    if (stream) hwy::FlushStream();  // order this thread's non-temporal stores before the results are used
  });
}

template <class TS, class TG, class TD, bool kNative>
void BwdRows(const RowNormBwdParams& p) {
  const TS* src = static_cast<const TS*>(p.src);
  const TG* dout = static_cast<const TG*>(p.dout);
  TD* dx = static_cast<TD*>(p.dx);
  const float inv_n = 1.0f / static_cast<float>(p.n_div);
  const bool unit = p.src_rows.col_stride == 1 && p.dx_rows.col_stride == 1 &&
                    (p.kind == RowNormBwdKind::kFactor || p.dout_rows.col_stride == 1);
  const int64_t block = tile::block_for_bytes(p.D * static_cast<int64_t>(sizeof(TS) + sizeof(TG) + sizeof(TD)));
  const bool stream = p.rows * p.D * static_cast<int64_t>(sizeof(TD)) >= kStreamBytes;
  tile::parallel_blocks(p.rows, block, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const TS* sr = src + p.src_rows.row_offset(r);
      const TG* gr = dout + p.dout_rows.row_offset(r);
      TD* xr = dx + p.dx_rows.row_offset(r);
      const float rstd = static_cast<float>(load_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r)));
      float c, s;
      if (p.kind == RowNormBwdKind::kFactor) {
        // dx = x * (-dr * rstd^3 / n): written as s * (0*x - c*x) would waste a load; use Scale.
        const float k = -to_f32(gr[0]) * rstd * rstd * rstd * inv_n;
#if STRATA_NATIVE_BF16
        if constexpr (kNative && std::is_same_v<TD, bf16_t>) {
          if (unit) {
            if (stream) ScaleToBf16<true, true>(sr, k, xr, p.D);
            else ScaleToBf16<false, true>(sr, k, xr, p.D);
            continue;
          }
        }
#endif
        if (unit && stream) {
          tv::Scale<true, kNative, true>(sr, k, xr, p.D);
        } else if (unit) {
          tv::Scale<false, kNative, true>(sr, k, xr, p.D);
        } else {
          for (int64_t j = 0; j < p.D; ++j)
            xr[j * p.dx_rows.col_stride] = from_f32<TD>(to_f32(sr[j * p.src_rows.col_stride]) * k);
        }
        continue;
      }
      float dot;
      if (unit) {
#if STRATA_NATIVE_BF16
        if constexpr (kNative && std::is_same_v<TS, bf16_t> && std::is_same_v<TG, bf16_t>) dot = DotBf16Dp(gr, sr, p.D);
        else dot = tv::Dot(gr, sr, p.D);
#else
        dot = tv::Dot(gr, sr, p.D);
#endif
      } else {
        dot = 0.f;
        for (int64_t j = 0; j < p.D; ++j)
          dot += to_f32(gr[j * p.dout_rows.col_stride]) * to_f32(sr[j * p.src_rows.col_stride]);
      }
      c = p.kind == RowNormBwdKind::kNormalizedSrc ? dot * inv_n : dot * rstd * rstd * inv_n;
      s = rstd;
      // This pass re-reads the row from L1: prefetch the next row meanwhile.
      const bool pf = r + 1 < p.rows;
      const TG* ng = pf ? dout + p.dout_rows.row_offset(r + 1) : nullptr;
      const TS* ns = pf ? src + p.src_rows.row_offset(r + 1) : nullptr;
#if STRATA_NATIVE_BF16
      if constexpr (kNative && std::is_same_v<TD, bf16_t>) {
        if (unit) {
          if (stream) ScaledSubScaledToBf16<true>(gr, sr, c, s, xr, p.D, ng, ns);
          else ScaledSubScaledToBf16<false>(gr, sr, c, s, xr, p.D, ng, ns);
          continue;
        }
      }
#endif
      if (unit && stream) {
        tv::ScaledSubScaled<true, kNative>(gr, sr, c, s, xr, p.D, ng, ns);
      } else if (unit) {
        tv::ScaledSubScaled<false, kNative>(gr, sr, c, s, xr, p.D, ng, ns);
      } else {
        for (int64_t j = 0; j < p.D; ++j)
          xr[j * p.dx_rows.col_stride] = from_f32<TD>(
              s * (to_f32(gr[j * p.dout_rows.col_stride]) - c * to_f32(sr[j * p.src_rows.col_stride])));
      }
    }
    if (stream) hwy::FlushStream();
  });
}

// Run-time dtype -> template instance (f32, bf16, f16 for every tensor; validated by the plan).
template <class Fn>
void VisitHalfOrF32(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case STRATA_DTYPE_F32: fn(float{}); break;
    case STRATA_DTYPE_BF16: fn(bf16_t{}); break;
    default: fn(f16_t{}); break;
  }
}

// What the units instantiate. kNative is kept only where it changes the code (see the top of the file).
template <class TX, bool kNative>
void FwdForX(const RowNormFwdParams& p) {
  VisitHalfOrF32(p.y ? p.y_dtype : p.x_dtype, [&](auto ty) {
    using TY = decltype(ty);
    constexpr bool kN = kNative && STRATA_NATIVE_BF16 && (std::is_same_v<TX, bf16_t> || std::is_same_v<TY, bf16_t>);
    FwdRows<TX, TY, kN>(p);
  });
}
template <class TD, bool kNative>
void BwdForDx(const RowNormBwdParams& p) {
  constexpr bool kN = kNative && STRATA_NATIVE_BF16 && std::is_same_v<TD, bf16_t>;
  VisitHalfOrF32(p.src_dtype, [&](auto ts) {
    VisitHalfOrF32(p.dout_dtype, [&](auto tg) { BwdRows<decltype(ts), decltype(tg), TD, kN>(p); });
  });
}

}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
