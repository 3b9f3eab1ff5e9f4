// CPU kernels of the row norms, written once with Highway and compiled for every target in
// tile::cpu_isas(). Rows are split into fixed blocks (tile/cpu/parallel.h); each row is reduced in a fixed
// order by one thread, so results do not depend on the thread count or on the other rows.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/common/row_norm_cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>
#include <cmath>

#include "ops/norm/common/row_norm.h"
#include "tile/cpu/isa.h"
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
  const int64_t N = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  if (p.D % N != 0) return false;
  const int64_t nv = p.D / N;
  if (nv != 1 && nv != 2 && nv != 4 && nv != 8) return false;
  // Streaming stores need every row start aligned to the stored vector: an aligned first row and a row
  // stride of whole cache lines.
  if (y && stream &&
      (!tv::StreamAligned(hn::ScalableTag<float>(), y + p.y_rows.row_offset(r0)) ||
       (p.y_rows.row_stride() * static_cast<int64_t>(sizeof(TY))) % 64 != 0))
    stream = false;
  auto run = [&](auto nv_tag, auto stream_tag) {
    constexpr int NV = decltype(nv_tag)::value;
    constexpr bool S = decltype(stream_tag)::value;
    for (int64_t r = r0; r < r1; ++r) {
      const float rstd = ShortRow<NV, S, kNative>(x + p.x_rows.row_offset(r), y ? y + p.y_rows.row_offset(r) : nullptr,
                                                  inv_n, p.eps);
      store_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r), rstd);
    }
  };
  auto with_stream = [&](auto nv_tag) {
    if (stream) run(nv_tag, std::true_type{});
    else run(nv_tag, std::false_type{});
  };
  switch (nv) {
    case 1: with_stream(std::integral_constant<int, 1>{}); break;
    case 2: with_stream(std::integral_constant<int, 2>{}); break;
    case 4: with_stream(std::integral_constant<int, 4>{}); break;
    default: with_stream(std::integral_constant<int, 8>{}); break;
  }
  return true;
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
  tile::parallel_blocks(p.rows, block, [&](int64_t r0, int64_t r1) {
    if (short_ok && ShortRows<kNative>(p, x, y, r0, r1, stream, inv_n)) {
      if (stream) hwy::FlushStream();
      return;
    }
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
        dot = tv::Dot(gr, sr, p.D);
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

// Run-time dtypes -> template instances (f32, bf16, f16 for every tensor; validated by the plan).
template <class Fn>
void VisitHalfOrF32(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case STRATA_DTYPE_F32: fn(float{}); break;
    case STRATA_DTYPE_BF16: fn(bf16_t{}); break;
    default: fn(f16_t{}); break;
  }
}

template <bool kNative>
void Fwd(const RowNormFwdParams& p) {
  VisitHalfOrF32(p.x_dtype, [&](auto tx) {
    VisitHalfOrF32(p.y ? p.y_dtype : p.x_dtype, [&](auto ty) { FwdRows<decltype(tx), decltype(ty), kNative>(p); });
  });
}
template <bool kNative>
void Bwd(const RowNormBwdParams& p) {
  VisitHalfOrF32(p.src_dtype, [&](auto ts) {
    VisitHalfOrF32(p.dout_dtype, [&](auto tg) {
      VisitHalfOrF32(p.dx_dtype, [&](auto td) { BwdRows<decltype(ts), decltype(tg), decltype(td), kNative>(p); });
    });
  });
}

// Portable instances, and the AVX512-BF16 ones (identical to the portable ones except on the AVX3 target).
void RowNormFwd(const RowNormFwdParams& p) { Fwd<false>(p); }
void RowNormBwd(const RowNormBwdParams& p) { Bwd<false>(p); }
void RowNormFwdNativeBf16(const RowNormFwdParams& p) { Fwd<true>(p); }
void RowNormBwdNativeBf16(const RowNormBwdParams& p) { Bwd<true>(p); }

}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::norm {
HWY_EXPORT(RowNormFwd);
HWY_EXPORT(RowNormBwd);
HWY_EXPORT(RowNormFwdNativeBf16);
HWY_EXPORT(RowNormBwdNativeBf16);

RowNormFwdFn row_norm_fwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RowNormFwd, hwy_target); }
RowNormBwdFn row_norm_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(RowNormBwd, hwy_target); }
RowNormFwdFn row_norm_fwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(RowNormFwdNativeBf16, HWY_AVX3); }
RowNormBwdFn row_norm_bwd_cpu_native_bf16() { return STRATA_HWY_FOR_TARGET(RowNormBwdNativeBf16, HWY_AVX3); }
}  // namespace strata::norm
#endif
