// Highway building blocks for row kernels: f32 loads from f32/bf16/f16 storage, rounding stores back, and
// fixed-order row reductions (sum of squares, dot). Include inside HWY_NAMESPACE of a file compiled with
// hwy/foreach_target.h (this header has no include guard on purpose: it is compiled once per target).
//
// Rounding: stores to bf16 round to nearest even with integer ops (Highway 1.0's DemoteTo to bf16 truncates);
// stores to f16 use Highway's DemoteTo (F16C's round-to-nearest on x86). Reductions use four vector
// accumulators combined in a fixed order, so a row's result depends only on the row (batch- and
// thread-invariant).

// Per-target include guard (Highway's convention for -inl.h files).
#if defined(STRATA_TILE_CPU_VEC_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_TILE_CPU_VEC_INL_H_
#undef STRATA_TILE_CPU_VEC_INL_H_
#else
#define STRATA_TILE_CPU_VEC_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

#include "opbase/dtype.h"
#include "tile/cpu/isa.h"

HWY_BEFORE_NAMESPACE();
// A kernel file that defines STRATA_WANT_AVX512_BF16 before including this header gets the AVX512-BF16
// stores below on its AVX3 target (and must add the same pragma after its own HWY_BEFORE_NAMESPACE).
#undef STRATA_NATIVE_BF16
#if HWY_TARGET == HWY_AVX3 && defined(STRATA_WANT_AVX512_BF16)
#pragma GCC target("avx512bf16")
#define STRATA_NATIVE_BF16 1
#else
#define STRATA_NATIVE_BF16 0
#endif
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// AVX512-BF16 (Sapphire/Emerald Rapids, Zen 4) rounds 16 floats to bf16 (nearest even, NaN quieted) in one
// vcvtneps2bf16, against about ten integer operations in StoreF32. Highway 1.0 has no target for it, so the
// AVX3 code of files that ask for it (STRATA_WANT_AVX512_BF16) is compiled with the extra feature; the
// instruction only runs in the kernels' "native bf16" instances, which dispatch offers only on CPUs that
// have the feature (tile::cpu_has_avx512_bf16).
#if STRATA_NATIVE_BF16
template <class DF>
HWY_INLINE void StoreBf16Native(DF, hn::Vec<DF> v, bf16_t* p) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v.raw)));
}
template <class DF>
HWY_INLINE void StreamBf16Native(DF, hn::Vec<DF> v, bf16_t* p) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v.raw)));
}
#endif

template <class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const float* p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const bf16_t* p) {
  const hn::Rebind<uint16_t, DF> du16;
  const hn::RebindToUnsigned<DF> du32;
  const auto h = hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p));
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, h)));
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const f16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

template <class DF>
HWY_INLINE void StoreF32(DF df, hn::Vec<DF> v, float* p) {
  hn::StoreU(v, df, p);
}
// The bf16 bits of each lane (round to nearest even), in the low 16 bits of a u32 lane (high bits 0).
// NaNs are made quiet first so the carry cannot turn them into Inf.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> Bf16Bits(DF, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const auto u = hn::BitCast(du32, v);
  const auto is_nan = hn::Ne(v, v);
  const auto bias = hn::Add(hn::Set(du32, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u)));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, bias));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du32, 0x0040u));
  return hn::IfThenElse(hn::RebindMask(du32, is_nan), quiet, rounded);
}
template <class DF>
HWY_INLINE void StoreF32(DF df, hn::Vec<DF> v, bf16_t* p) {
  const hn::RebindToSigned<DF> di32;
  const hn::Rebind<uint16_t, DF> du16;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, Bf16Bits(df, v))), du16, reinterpret_cast<uint16_t*>(p));
}
// f16 stores round to nearest even on every target: F16C's vcvtps2ph on AVX2/AVX3; elsewhere (SSE4, scalar) lane
// by lane with from_f32, because Highway's emulated DemoteTo there truncates the mantissa (x86_128-inl.h:
// `mantissa32 >> 13`), which gave those targets other bits than AVX2/AVX3 in a third of the f16 outputs of a
// cumsum test (2026-11-30).
template <class DF>
HWY_INLINE void StoreF32(DF df, hn::Vec<DF> v, f16_t* p) {
#if HWY_TARGET >= HWY_SSE4 || defined(HWY_DISABLE_F16C)
  alignas(64) float tmp[hn::MaxLanes(df)];
  hn::Store(v, df, tmp);
  for (size_t i = 0; i < hn::Lanes(df); ++i) p[i] = from_f32<f16_t>(tmp[i]);
#else
  const hn::Rebind<hwy::float16_t, DF> dh;
  hn::StoreU(hn::DemoteTo(dh, v), dh, reinterpret_cast<hwy::float16_t*>(p));
#endif
}

// Non-temporal stores of a full vector (p aligned to the stored vector's size): for outputs larger than the
// caches they skip the read-for-ownership of the destination lines, about a third of a row kernel's traffic.
// Callers issue hwy::FlushStream() before the results are used (tile/cpu/parallel.h does at block ends).
template <class DF>
HWY_INLINE void StreamF32(DF df, hn::Vec<DF> v, float* p) {
  hn::Stream(v, df, p);
}
// 2-byte outputs of a 128-bit f32 vector (SSE4) fill only half a vector, and Highway's x86 Stream of a partial
// vector issues a full 16-byte movntdq (16-byte alignment required, 8 bytes written past the data): those
// targets store normally instead.
template <class DF>
inline constexpr bool kStreamFullVector16 = hn::MaxLanes(DF()) * 2 >= 16;
template <class DF>
HWY_INLINE void StreamF32(DF df, hn::Vec<DF> v, bf16_t* p) {
  if constexpr (!kStreamFullVector16<DF>) {
    StoreF32(df, v, p);
  } else {
    const hn::Rebind<uint16_t, DF> du16;
    alignas(64) uint16_t tmp[hn::MaxLanes(df)];
    StoreF32(df, v, reinterpret_cast<bf16_t*>(tmp));
    hn::Stream(hn::Load(du16, tmp), du16, reinterpret_cast<uint16_t*>(p));
  }
}
template <class DF>
HWY_INLINE void StreamF32(DF df, hn::Vec<DF> v, f16_t* p) {
  if constexpr (!kStreamFullVector16<DF>) {
    StoreF32(df, v, p);
  } else {
    const hn::Rebind<hwy::float16_t, DF> dh;
    hn::Stream(hn::DemoteTo(dh, v), dh, reinterpret_cast<hwy::float16_t*>(p));
  }
}

// The store every row kernel ends with: kStream picks non-temporal stores (the caller checked alignment),
// kNative the AVX512-BF16 conversion for bf16 outputs on the AVX3 target.
template <bool kStream, bool kNative, class DF, class T>
HWY_INLINE void StoreOut(DF df, hn::Vec<DF> v, T* p) {
#if STRATA_NATIVE_BF16
  if constexpr (kNative && std::is_same_v<T, bf16_t>) {
    if constexpr (kStream) StreamBf16Native(df, v, p);
    else StoreBf16Native(df, v, p);
    return;
  }
#endif
  if constexpr (kStream) StreamF32(df, v, p);
  else StoreF32(df, v, p);
}

// Whether p can take StreamF32 stores of DF vectors (aligned to the stored vector size).
template <class DF, class T>
HWY_INLINE bool StreamAligned(DF df, const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (hn::Lanes(df) * sizeof(T)) == 0;
}
// Whether every row of evenly spaced rows can take them: the first row aligned and a row stride (elements) of
// whole 64-byte lines, so that every later row start is aligned too.
template <class DF, class T>
HWY_INLINE bool StreamRowsAligned(DF df, const T* first_row, int64_t row_stride) {
  return StreamAligned(df, first_row) && (row_stride * static_cast<int64_t>(sizeof(T))) % 64 == 0;
}

// The dispatch of the short-row kernels (rows of NV whole vectors held in registers: the row norms' and
// rms_norm_gated's ShortRows): calls fn(std::integral_constant<int, NV>{}, std::bool_constant<S>{}) with
// NV = nv and S = stream, and returns true; returns false, calling nothing, unless nv is 1, 2, 4 or 8.
template <class Fn>
HWY_INLINE bool VisitShortRow(int64_t nv, bool stream, Fn&& fn) {
  auto with_stream = [&](auto nv_tag) {
    if (stream) fn(nv_tag, std::true_type{});
    else fn(nv_tag, std::false_type{});
  };
  switch (nv) {
    case 1: with_stream(std::integral_constant<int, 1>{}); return true;
    case 2: with_stream(std::integral_constant<int, 2>{}); return true;
    case 4: with_stream(std::integral_constant<int, 4>{}); return true;
    case 8: with_stream(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}

// Software prefetch distance of the streaming loops. On the development VM (Emerald Rapids under KVM) one
// core's demand misses plus the hardware prefetchers read a streamed bf16 row at about half the copy rate
// (glibc's memcpy prefetches in software); asking for the lines 4 KiB ahead of the loads brings the row
// kernels from ~55 % to ~75-85 % of the copy bandwidth (microbenchmark, 1 and 2 threads). A prefetch never
// faults, so the address may run past the end of the data; it is formed as an integer for that reason.
inline constexpr int64_t kPrefetchBytes = 4096;

// Prefetches the cache lines of [p + kDistance, p + kDistance + kBytes): one per 64-byte line (the loop
// calling it advances p by kBytes per step).
template <int64_t kBytes, int64_t kDistance = kPrefetchBytes, class T>
HWY_INLINE void PrefetchAhead(const T* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(kDistance);
  if constexpr (kBytes < 64) {
    // Steps shorter than a line (narrow targets): one prefetch at the step that enters a new line.
    if ((a & 63u) < static_cast<uintptr_t>(kBytes)) hwy::Prefetch(reinterpret_cast<const uint8_t*>(a));
  } else {
    for (int64_t k = 0; k < kBytes; k += 64)
      hwy::Prefetch(reinterpret_cast<const uint8_t*>(a + static_cast<uintptr_t>(k)));
  }
}

// sum_i x[i]^2 over n elements, f32 accumulation in a fixed order. Prefetches ahead of the loads.
template <class T>
HWY_INLINE float SumSquares(const T* x, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStepBytes = 4 * static_cast<int64_t>(hn::MaxLanes(df) * sizeof(T));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    PrefetchAhead<kStepBytes>(x + i);
    const auto v0 = LoadF32(df, x + i), v1 = LoadF32(df, x + i + N);
    const auto v2 = LoadF32(df, x + i + 2 * N), v3 = LoadF32(df, x + i + 3 * N);
    a0 = hn::MulAdd(v0, v0, a0);
    a1 = hn::MulAdd(v1, v1, a1);
    a2 = hn::MulAdd(v2, v2, a2);
    a3 = hn::MulAdd(v3, v3, a3);
  }
  for (; i + N <= n; i += N) {
    const auto v = LoadF32(df, x + i);
    a0 = hn::MulAdd(v, v, a0);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) {
    const float v = to_f32(x[i]);
    s += v * v;
  }
  return s;
}

// sum_i a[i] * b[i], f32 accumulation in a fixed order. Prefetches ahead of both streams.
template <class TA, class TB>
HWY_INLINE float Dot(const TA* a, const TB* b, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStepA = 4 * static_cast<int64_t>(hn::MaxLanes(df) * sizeof(TA));
  constexpr int64_t kStepB = 4 * static_cast<int64_t>(hn::MaxLanes(df) * sizeof(TB));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    PrefetchAhead<kStepA>(a + i);
    PrefetchAhead<kStepB>(b + i);
    a0 = hn::MulAdd(LoadF32(df, a + i), LoadF32(df, b + i), a0);
    a1 = hn::MulAdd(LoadF32(df, a + i + N), LoadF32(df, b + i + N), a1);
    a2 = hn::MulAdd(LoadF32(df, a + i + 2 * N), LoadF32(df, b + i + 2 * N), a2);
    a3 = hn::MulAdd(LoadF32(df, a + i + 3 * N), LoadF32(df, b + i + 3 * N), a3);
  }
  for (; i + N <= n; i += N) a0 = hn::MulAdd(LoadF32(df, a + i), LoadF32(df, b + i), a0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += to_f32(a[i]) * to_f32(b[i]);
  return s;
}

// y[i] = x[i] * s. kStream: non-temporal stores when y is aligned for them; kNative: see StoreOut;
// kPrefetch: x streams from memory (not re-read from cache), prefetch ahead of it. next (optional): a row of
// the same length read after this one (the second pass re-reads x from L1, so the memory would idle): its
// element i is prefetched with x[i].
template <bool kStream = false, bool kNative = false, bool kPrefetch = false, class TX, class TY>
HWY_INLINE void Scale(const TX* x, float s, TY* y, int64_t n, const TX* next = nullptr) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStepBytes = static_cast<int64_t>(hn::MaxLanes(df) * sizeof(TX));
  const auto vs = hn::Set(df, s);
  int64_t i = 0;
  auto body = [&](auto stream_tag) {
    constexpr bool S = decltype(stream_tag)::value;
    if (next) {
      for (; i + N <= n; i += N) {
        PrefetchAhead<kStepBytes, 0>(next + i);
        StoreOut<S, kNative>(df, hn::Mul(LoadF32(df, x + i), vs), y + i);
      }
    }
    for (; i + N <= n; i += N) {
      if constexpr (kPrefetch) PrefetchAhead<kStepBytes>(x + i);
      StoreOut<S, kNative>(df, hn::Mul(LoadF32(df, x + i), vs), y + i);
    }
  };
  if (kStream && StreamAligned(df, y)) body(std::true_type{});
  else body(std::false_type{});
  for (; i < n; ++i) y[i] = from_f32<TY>(to_f32(x[i]) * s);
}

// out[i] = s * (a[i] - c * b[i])  (the shape of every norm backward: s*(dy - c*y)). kStream as for Scale;
// next_a / next_b (optional, both or neither): the rows read after a and b, prefetched alongside (see Scale).
template <bool kStream = false, bool kNative = false, class TA, class TB, class TO>
HWY_INLINE void ScaledSubScaled(const TA* a, const TB* b, float c, float s, TO* out, int64_t n,
                                const TA* next_a = nullptr, const TB* next_b = nullptr) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStepA = static_cast<int64_t>(hn::MaxLanes(df) * sizeof(TA));
  constexpr int64_t kStepB = static_cast<int64_t>(hn::MaxLanes(df) * sizeof(TB));
  const auto vc = hn::Set(df, c), vs = hn::Set(df, s);
  int64_t i = 0;
  if (kStream && StreamAligned(df, out)) {
    if (next_a) {
      for (; i + N <= n; i += N) {
        PrefetchAhead<kStepA, 0>(next_a + i);
        PrefetchAhead<kStepB, 0>(next_b + i);
        StoreOut<true, kNative>(df, hn::Mul(vs, hn::NegMulAdd(vc, LoadF32(df, b + i), LoadF32(df, a + i))), out + i);
      }
    }
    for (; i + N <= n; i += N)
      StoreOut<true, kNative>(df, hn::Mul(vs, hn::NegMulAdd(vc, LoadF32(df, b + i), LoadF32(df, a + i))), out + i);
  }
  if (next_a) {
    for (; i + N <= n; i += N) {
      PrefetchAhead<kStepA, 0>(next_a + i);
      PrefetchAhead<kStepB, 0>(next_b + i);
      StoreOut<false, kNative>(df, hn::Mul(vs, hn::NegMulAdd(vc, LoadF32(df, b + i), LoadF32(df, a + i))), out + i);
    }
  }
  for (; i + N <= n; i += N)
    StoreOut<false, kNative>(df, hn::Mul(vs, hn::NegMulAdd(vc, LoadF32(df, b + i), LoadF32(df, a + i))), out + i);
  for (; i < n; ++i) out[i] = from_f32<TO>(s * (to_f32(a[i]) - c * to_f32(b[i])));
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
