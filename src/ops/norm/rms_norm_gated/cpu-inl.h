// CPU kernels of rms_norm_gated (rms_norm_gated.h), written once with Highway and compiled for every target in
// tile::cpu_isas().
//
// Rows go in fixed blocks (tile/cpu/parallel.h; block boundaries depend only on the problem). A row is brought
// into f32 scratch rows of the thread (h = x + residual, the gate, dy), then each group of G features is
// reduced in a fixed order (vector accumulators, then one lane sum, then the scalar tail) and written back
// rounded to the output dtype. Backward: each row block adds its rows' dweight / dbias terms, in row order,
// into its own f32 partial row of the workspace; a last pass sums the partial rows in block order. So every
// result depends only on the problem, never on the thread count.
//
// Build layout (build time is a budget, STYLE.md 12): the kernels live only in this file. The units
// cpu_fwd_{f32,bf16,f16}.cpp and cpu_bwd_{f32,bf16,f16}.cpp (the forward / the backward for one activation dtype;
// until session 18 the backward of every dtype was one unit, cpu_bwd.cpp, 109-143 s on the H200 host) each
// include it for every target (tile/cpu/foreach_isa.h) and instantiate their part, so they compile in parallel;
// cpu.cpp dispatches on the dtype and owns the HWY_EXPORT tables.
//
// Per-target include guard (Highway's convention for -inl.h files).
#if defined(STRATA_OPS_NORM_RMS_NORM_GATED_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_OPS_NORM_RMS_NORM_GATED_CPU_INL_H_
#undef STRATA_OPS_NORM_RMS_NORM_GATED_CPU_INL_H_
#else
#define STRATA_OPS_NORM_RMS_NORM_GATED_CPU_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "opbase/visit_kernel_dtype.h"
#include "tile/cpu/cache_size.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/stream_policy.h"
#include "tile/cpu/math-inl.h"
#include "tile/cpu/sigmoid_nodiv-inl.h"
#define STRATA_WANT_AVX512_BF16  // the "cpu.avx512_bf16" instances (tile/cpu/vec-inl.h)
#include "tile/cpu/vec-inl.h"
#include "tile/cpu/vec_pair-inl.h"

#ifndef STRATA_RNG_CPU_ONCE
#define STRATA_RNG_CPU_ONCE
namespace strata::norm {
// Rows per backward block: about 64 KiB of row traffic (fixed by D and the dtype, not by the thread count).
inline int64_t rng_rows_per_block(int64_t D) { return std::max<int64_t>(16, (32 * 1024) / std::max<int64_t>(D, 1)); }
// Outputs at least this large are written with non-temporal stores.
constexpr int64_t kRngStreamBytes = 4 << 20;
}  // namespace strata::norm
#endif

// The step lambdas of the direct rows (U vectors each, session 16) must be inlined into their loops: GCC left the
// four-vector pass A of BwdRowDirect out of line (its arrays then went through memory), 13-21 % slower on AVX2.
#ifndef STRATA_RNG_STEP_INLINE
#define STRATA_RNG_STEP_INLINE __attribute__((always_inline))
#endif

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // as in tile/cpu/vec-inl.h: lets the native-bf16 instances use AVX512-BF16
#pragma GCC target("avx512bf16")
#endif
namespace strata::norm::HWY_NAMESPACE {
namespace tv = strata::tile::HWY_NAMESPACE;
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// ---- the units' entry points (defined in cpu_fwd_<dtype>.cpp and cpu_bwd_<dtype>.cpp, called by cpu.cpp) ----
void RngFwdF32(const RmsNormGatedFwdParams& p);
void RngFwdBf16(const RmsNormGatedFwdParams& p);
void RngFwdF16(const RmsNormGatedFwdParams& p);
void RngBwdF32(const RmsNormGatedBwdParams& p);
void RngBwdBf16(const RmsNormGatedBwdParams& p);
void RngBwdF16(const RmsNormGatedBwdParams& p);
// kNative instances ("cpu.avx512_bf16", session 8): the direct-row kernels with bf16 outputs rounded by
// AVX512-BF16's vcvtneps2bf16 (one instruction per 16 outputs instead of about ten integer ones; both round to
// nearest even, so the same bits). Only on AVX3 (STRATA_NATIVE_BF16): elsewhere kNative changes no instruction,
// so cpu.cpp's native entries run the portable instances there (session 18: not compiled twice).
#if STRATA_NATIVE_BF16
void RngFwdBf16Native(const RmsNormGatedFwdParams& p);
void RngBwdBf16Native(const RmsNormGatedBwdParams& p);
#endif

// act(v) into a and, kGrad, act'(v) into ag, for U vectors step by step (tile/cpu/sigmoid_nodiv-inl.h: the
// instructions of the U vectors interleave, so the core overlaps their dependency chains; the same operations per
// vector for any U, so the same bits). sigmoid(v) = 1 / (1 + exp(-v)) for the activations' dtype T: for bf16/f16
// rows the reduced-precision one (relative error < 5e-6, far below their rounding; the kernels are compute-bound
// on the sigmoid; no division on AVX2 / SSE4), FastSigmoid for f32.
template <class T, bool kGrad, int U>
HWY_INLINE void ActN(DF df, int32_t act, const VF (&v)[U], VF (&a)[U], VF (&ag)[U]) {
  VF s[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) s[u] = v[u];
  if constexpr (sizeof(T) == 2) {
    tv::SigmoidLpNoDivN(df, s);
  } else {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) s[u] = tv::FastSigmoid(df, s[u]);
  }
  const VF one = hn::Set(df, 1.f);
  if (act == kActSilu) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      if constexpr (kGrad) ag[u] = hn::Mul(s[u], hn::MulAdd(v[u], hn::Sub(one, s[u]), one));
      a[u] = hn::Mul(v[u], s[u]);
    }
  } else {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      if constexpr (kGrad) ag[u] = hn::Mul(s[u], hn::Sub(one, s[u]));
      a[u] = s[u];
    }
  }
}
template <class T>
HWY_INLINE VF Act(DF df, int32_t act, VF v, VF* ag) {
  const VF vv[1] = {v};
  VF a[1], g[1];
  if (ag) {
    ActN<T, true>(df, act, vv, a, g);
    *ag = g[0];
  } else {
    ActN<T, false>(df, act, vv, a, g);
  }
  return a[0];
}
// The forward's act(z): norm-before-gate multiplies it only into y, which is rounded straight to T, so for
// bf16/f16 it takes SigmoidOut16's accuracy there (tile/cpu/sigmoid_nodiv-inl.h: relative error < 1.4e-4, 0.07
// of a bf16 half-ulp; fewer operations; session 11). Gate-before-norm's act(z) also feeds the f32 rstd: ActN.
template <class T, int U>
HWY_INLINE void ActFwdN(DF df, int32_t act, const VF (&v)[U], bool nbg, VF (&a)[U]) {
  if constexpr (sizeof(T) == 2) {
    if (nbg) {
      VF s[U];
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) s[u] = v[u];
      tv::SigmoidOut16NoDivN(df, s);
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) a[u] = act == kActSilu ? hn::Mul(v[u], s[u]) : s[u];
      return;
    }
  }
  VF unused[U];
  ActN<T, false>(df, act, v, a, unused);
}
template <class T>
HWY_INLINE VF ActFwd(DF df, int32_t act, VF v, bool nbg) {
  const VF vv[1] = {v};
  VF a[1];
  ActFwdN<T>(df, act, vv, nbg, a);
  return a[0];
}
// Scalar tails, with the same capped exponent as Sigmoid.
HWY_INLINE float SigmoidS(float v) { return 1.f / (1.f + std::exp(std::min(-v, 88.f))); }
HWY_INLINE float ActS(int32_t act, float v) { return act == kActSilu ? v * SigmoidS(v) : SigmoidS(v); }
HWY_INLINE float ActGradS(int32_t act, float v) {
  const float s = SigmoidS(v);
  return act == kActSilu ? s * (1.f + v * (1.f - s)) : s * (1.f - s);
}

// ---- rows of any float dtype <-> f32 scratch (unit column stride) ----
template <class T>
HWY_INLINE void ToF32(const T* HWY_RESTRICT src, float* HWY_RESTRICT dst, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStep = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(T));
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    tv::PrefetchAhead<kStep>(src + j);  // rows stream from memory (tile/cpu/vec-inl.h)
    hn::StoreU(tv::LoadF32(df, src + j), df, dst + j);
  }
  for (; j < n; ++j) dst[j] = to_f32(src[j]);
}
template <class T>
HWY_INLINE void AddF32(const T* HWY_RESTRICT src, float* HWY_RESTRICT dst, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStep = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(T));
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    tv::PrefetchAhead<kStep>(src + j);
    hn::StoreU(hn::Add(hn::LoadU(df, dst + j), tv::LoadF32(df, src + j)), df, dst + j);
  }
  for (; j < n; ++j) dst[j] += to_f32(src[j]);
}
// Stores n floats to T, non-temporal when kStream and the destination is aligned for it.
template <bool kStream, class T>
HWY_INLINE void FromF32(const float* HWY_RESTRICT src, T* HWY_RESTRICT dst, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  // Non-temporal stores only of whole 16-byte vectors (a half-width SSE4 bf16 vector would be streamed
  // with a 16-byte instruction that needs 16-byte alignment).
  if (kStream && hn::Lanes(df) * sizeof(T) >= 16 && tv::StreamAligned(df, dst)) {
    for (; j + N <= n; j += N) tv::StoreOut<true, false>(df, hn::LoadU(df, src + j), dst + j);
  }
  for (; j + N <= n; j += N) tv::StoreOut<false, false>(df, hn::LoadU(df, src + j), dst + j);
  for (; j < n; ++j) dst[j] = from_f32<T>(src[j]);
}

// A row of T (column stride `col`; 1 takes the vector loops) into / added to f32 dst.
template <class T>
HWY_INLINE void LoadRowT(const T* p, int64_t col, float* dst, int64_t n, bool add) {
  if (col == 1) {
    if (add) AddF32(p, dst, n);
    else ToF32(p, dst, n);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = (add ? dst[j] : 0.f) + to_f32(p[j * col]);
  }
}
// f32 src to a row of T (column stride `col`), non-temporal when `stream` and possible.
template <class T>
HWY_INLINE void StoreRowT(const float* src, T* p, int64_t col, int64_t n, bool stream) {
  if (col != 1) {
    for (int64_t j = 0; j < n; ++j) p[j * col] = from_f32<T>(src[j]);
  } else if (stream) {
    FromF32<true>(src, p, n);
  } else {
    FromF32<false>(src, p, n);
  }
}
// The same for the tensors with a dtype of their own (residual, residual_out, dresidual_out): one instance
// per dtype. The activations' tensors (x, z, dy, y, dx, dz) are TX and call the typed ones directly.
HWY_INLINE void LoadRow(const void* base, int32_t dtype, int64_t off, int64_t col, float* dst, int64_t n, bool add) {
  visit_kernel_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    LoadRowT(static_cast<const T*>(base) + off, col, dst, n, add);
  });
}
HWY_INLINE void StoreRow(const float* src, void* base, int32_t dtype, int64_t off, int64_t col, int64_t n,
                         bool stream) {
  visit_kernel_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    StoreRowT(src, static_cast<T*>(base) + off, col, n, stream);
  });
}

// Fixed-order sums over [0, n) of a[i]*b[i] (vector lanes, then lane sum, then tail).
HWY_INLINE float DotF32(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df);
  int64_t j = 0;
  for (; j + 2 * N <= n; j += 2 * N) {
    a0 = hn::MulAdd(hn::LoadU(df, a + j), hn::LoadU(df, b + j), a0);
    a1 = hn::MulAdd(hn::LoadU(df, a + j + N), hn::LoadU(df, b + j + N), a1);
  }
  for (; j + N <= n; j += N) a0 = hn::MulAdd(hn::LoadU(df, a + j), hn::LoadU(df, b + j), a0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

// Per-thread f32 rows of the direct and long-row paths, kept across blocks and calls (grown, never shrunk: at
// most 2 D floats per thread).
HWY_INLINE float* ThreadRows(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

struct Scratch {
  std::vector<float> h, z, g, a, b, c;
  explicit Scratch(int64_t D) : h(D), z(D), g(D), a(D), b(D), c(D) {}
};

// Parameters (weight, bias) as f32 rows (w = 1 / b = 0 when absent).
inline void ParamRow(const void* base, int32_t dtype, const RowLayout& l, int64_t D, float dflt, std::vector<float>& out) {
  out.assign(static_cast<size_t>(D), dflt);
  if (!base) return;
  for (int64_t j = 0; j < D; ++j) out[j] = static_cast<float>(load_elem(base, dtype, l.base + j * l.col_stride));
}

// ------------------------------------------------------------------------------------------------------
// Forward.

// A short row of exactly NV vectors (D = NV * lanes; unit column strides, no residual) held in registers: one
// load and one conversion per element instead of the scratch-row passes. Groups are gv whole vectors, gv a power
// of two dividing NV (G divides D, NV is 1, 2, 4 or 8), so a group ends after vector k when (k + 1) & (gv - 1)
// is 0 (session 10: an integer division per vector found the group ends before; a compile-time gv compiled the
// unit 40 % longer for no measurable gain). rstd is f32 (the only rstd dtype of the non-f64 kernels,
// rms_norm_gated.cpp).
template <int NV, bool kStream, bool kNative, class TX>
HWY_INLINE void ShortRow(const TX* HWY_RESTRICT xr, const TX* HWY_RESTRICT zr, TX* HWY_RESTRICT yr,
                         float* HWY_RESTRICT rstd, int64_t rstd_col, const float* w, const float* b, int gv,
                         float inv_g, float eps, bool nbg, int32_t act) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF h[NV], a[NV];
  // Rows follow each other in the common layouts: the lines 4 KiB ahead are later rows' (vec-inl.h).
  tv::PrefetchAhead<static_cast<int64_t>(NV * hn::MaxLanes(DF()) * sizeof(TX))>(xr);
  tv::PrefetchAhead<static_cast<int64_t>(NV * hn::MaxLanes(DF()) * sizeof(TX))>(zr);
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) {
    h[k] = tv::LoadF32(df, xr + k * N);
    a[k] = ActFwd<TX>(df, act, tv::LoadF32(df, zr + k * N), nbg);
    if (!nbg) h[k] = hn::Mul(h[k], a[k]);
  }
  // Sums of squares: a0 takes the even vectors, a1 the odd ones, so a group of whole vector pairs is summed in
  // DotF32's order (a one-vector group: a0 or a1 alone, and adding the other's zeros changes no bit). At a
  // group's end its rstd goes to the group's entries of rs, which the output loop broadcasts from memory (a
  // load, not a shuffle).
  const int gm = gv - 1;
  float rs[NV] = {};  // every entry is set below; the initializer quiets a false -Wmaybe-uninitialized (scalar target)
  VF a0 = hn::Zero(df), a1 = hn::Zero(df);
  int g = 0;
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) {
    if (k % 2 == 0) a0 = hn::MulAdd(h[k], h[k], a0);
    else a1 = hn::MulAdd(h[k], h[k], a1);
    if (((k + 1) & gm) != 0) continue;
    const float r = 1.f / std::sqrt(hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1))) * inv_g + eps);
    rstd[g * rstd_col] = r;
    ++g;
#pragma GCC unroll 8
    for (int kk = 0; kk < NV; ++kk)
      if (kk <= k && kk > k - gv) rs[kk] = r;
    a0 = a1 = hn::Zero(df);
  }
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) {
    VF o = hn::MulAdd(hn::Mul(h[k], hn::Set(df, rs[k])), hn::LoadU(df, w + k * N), hn::LoadU(df, b + k * N));
    if (nbg) o = hn::Mul(o, a[k]);
    tv::StoreOut<kStream, kNative>(df, o, yr + k * N);
  }
}

// ShortRow for rows [r0, r1) when the problem qualifies; false otherwise.
template <bool kNative, class TX>
bool ShortRows(const RmsNormGatedFwdParams& p, int64_t r0, int64_t r1, const float* w, const float* b, bool stream) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (p.residual || p.residual_out || p.D % N != 0 || p.group % N != 0) return false;
  if (p.x_rows.col_stride != 1 || p.z_rows.col_stride != 1 || p.y_rows.col_stride != 1) return false;
  const TX* x = static_cast<const TX*>(p.x);
  const TX* z = static_cast<const TX*>(p.z);
  TX* y = static_cast<TX*>(p.y);
  float* rstd = static_cast<float*>(p.rstd);
  // Non-temporal stores need every row start aligned to whole 16-byte-or-wider vectors.
  if (stream && (hn::Lanes(df) * sizeof(TX) < 16 || !p.y_rows.uniform() ||
                 !tv::StreamRowsAligned(df, y + p.y_rows.row_offset(r0), p.y_rows.row_stride())))
    stream = false;
  const int gv = static_cast<int>(p.group / N);
  const float inv_g = 1.f / static_cast<float>(p.group);
  const bool nbg = p.norm_before_gate;
  const int32_t act = p.act;
  return tv::VisitShortRow(p.D / N, stream, [&](auto nv_tag, auto stream_tag) {
    constexpr int NV = decltype(nv_tag)::value;
    constexpr bool S = decltype(stream_tag)::value;
    for (int64_t r = r0; r < r1; ++r)
      ShortRow<NV, S, kNative>(x + p.x_rows.row_offset(r), z + p.z_rows.row_offset(r), y + p.y_rows.row_offset(r),
                               rstd + p.rstd_rows.row_offset(r), p.rstd_rows.col_stride, w, b, gv, inv_g, p.eps, nbg,
                               act);
  });
}

// A long row with unit column strides and no residual, straight from its bf16/f16/f32 storage: per group of G
// features, pass A reads x and z once from memory (prefetched), forms h (x, or x act(z) gate-before-norm) and
// its sum of squares, and keeps act(z) (norm-before-gate) or h in the f32 row `sa` (G floats, in L1); pass B
// writes y from it (and from x again, now in L1, norm-before-gate). Two sweeps of a group instead of the
// general path's six over f32 scratch rows (load x, load z, act, sum, normalize, store); the same values in
// the same order (DotF32's accumulation), so the same bits as that path when G is a multiple of the vector
// length (otherwise the scalar tails are per group instead of per row, and a few act(z) round differently).
template <bool kStream, bool kNative, class TX>
HWY_INLINE void LongRowDirect(const TX* HWY_RESTRICT xr, const TX* HWY_RESTRICT zr, TX* HWY_RESTRICT yr, void* rstd,
                              int32_t rstd_dtype, int64_t so, int64_t rstd_col, const float* HWY_RESTRICT w,
                              const float* HWY_RESTRICT b, int64_t D, int64_t G, float inv_g, float eps, bool nbg,
                              int32_t act, float* HWY_RESTRICT sa) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStep = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(TX));
  for (int64_t j0 = 0, g = 0; j0 < D; j0 += G, ++g) {
    const TX* x = xr + j0;
    const TX* z = zr + j0;
    // Pass A. h of vector pairs into a0 / a1, a lone last vector into a0, then the lane sum and the tail. Four
    // vectors (two pairs) per step, step by step (ActFwdN), with one prefetch per 64-byte line and no per-vector
    // branch (session 16); the same sums in the same order as one pair at a time.
    auto vec_h = [&](int64_t k, auto& h) STRATA_RNG_STEP_INLINE {
      constexpr int U = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(h)>>);
      VF zv[U], a[U];
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) zv[u] = tv::LoadF32(df, z + k + u * N);
      ActFwdN<TX>(df, act, zv, nbg, a);
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const VF xv = tv::LoadF32(df, x + k + u * N);
        h[u] = nbg ? xv : hn::Mul(xv, a[u]);
        hn::StoreU(nbg ? a[u] : h[u], df, sa + k + u * N);
      }
    };
    VF a0 = hn::Zero(df), a1 = hn::Zero(df);
    int64_t k = 0;
    for (; k + 4 * N <= G; k += 4 * N) {
      tv::PrefetchAhead<4 * kStep>(x + k);
      tv::PrefetchAhead<4 * kStep>(z + k);
      VF h[4];
      vec_h(k, h);
      a0 = hn::MulAdd(h[0], h[0], a0);
      a1 = hn::MulAdd(h[1], h[1], a1);
      a0 = hn::MulAdd(h[2], h[2], a0);
      a1 = hn::MulAdd(h[3], h[3], a1);
    }
    for (; k + 2 * N <= G; k += 2 * N) {
      VF h[2];
      vec_h(k, h);
      a0 = hn::MulAdd(h[0], h[0], a0);
      a1 = hn::MulAdd(h[1], h[1], a1);
    }
    for (; k + N <= G; k += N) {
      VF h[1];
      vec_h(k, h);
      a0 = hn::MulAdd(h[0], h[0], a0);
    }
    float ss = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
    for (; k < G; ++k) {
      const float a = ActS(act, to_f32(z[k]));
      const float h = nbg ? to_f32(x[k]) : to_f32(x[k]) * a;
      sa[k] = nbg ? a : h;
      ss += h * h;
    }
    const float rs = 1.f / std::sqrt(ss * inv_g + eps);
    store_elem(rstd, rstd_dtype, so + g * rstd_col, rs);
    // Pass B.
    const VF vr = hn::Set(df, rs);
    const float* wg = w + j0;
    const float* bg = b + j0;
    TX* y = yr + j0;
    auto out_at = [&](int64_t k) STRATA_RNG_STEP_INLINE {
      if (nbg)
        return hn::Mul(hn::MulAdd(hn::Mul(tv::LoadF32(df, x + k), vr), hn::LoadU(df, wg + k), hn::LoadU(df, bg + k)),
                       hn::LoadU(df, sa + k));
      return hn::MulAdd(hn::Mul(hn::LoadU(df, sa + k), vr), hn::LoadU(df, wg + k), hn::LoadU(df, bg + k));
    };
    k = 0;
    for (; k + 2 * N <= G; k += 2 * N) tv::StoreOut2<kStream, kNative>(df, out_at(k), out_at(k + N), y + k);
    for (; k + N <= G; k += N) tv::StoreOut<kStream, kNative>(df, out_at(k), y + k);
    for (; k < G; ++k) {
      float o = (nbg ? to_f32(x[k]) : sa[k]) * rs * wg[k] + bg[k];
      if (nbg) o *= sa[k];
      y[k] = from_f32<TX>(o);
    }
  }
}

template <class TX, bool kNative = false>
void FwdRows(const RmsNormGatedFwdParams& p) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t D = p.D, G = p.group, ng = D / G;
  std::vector<float> w, b;
  ParamRow(p.weight, p.w_dtype, p.w_row, D, 1.f, w);
  ParamRow(p.bias, p.b_dtype, p.b_row, D, 0.f, b);
  const bool stream = p.rows * D * static_cast<int64_t>(sizeof(TX)) >= kRngStreamBytes;
  const float inv_g = 1.f / static_cast<float>(G);
  // Flags as locals: the stores through float pointers would otherwise make the compiler reload them from p.
  const bool nbg = p.norm_before_gate;
  const int32_t act = p.act;
  const int64_t block = tile::block_for_bytes(D * static_cast<int64_t>(3 * sizeof(TX)));
  // Rows that LongRowDirect takes (unit column strides, no residual).
  const bool direct = !p.residual && !p.residual_out && p.x_rows.col_stride == 1 && p.z_rows.col_stride == 1 &&
                      p.y_rows.col_stride == 1;
  tile::parallel_blocks(p.rows, block, [&](int64_t r0, int64_t r1) {
    if (ShortRows<kNative, TX>(p, r0, r1, w.data(), b.data(), stream)) {
      if (stream) hwy::FlushStream();
      return;
    }
    if (direct) {
      float* sa = ThreadRows(G);
      for (int64_t r = r0; r < r1; ++r) {
        TX* yr = static_cast<TX*>(p.y) + p.y_rows.row_offset(r);
        const TX* xr = static_cast<const TX*>(p.x) + p.x_rows.row_offset(r);
        const TX* zr = static_cast<const TX*>(p.z) + p.z_rows.row_offset(r);
        // Non-temporal stores need whole 16-byte-or-wider vectors at every group start.
        if (stream && hn::Lanes(df) * sizeof(TX) >= 16 && G % N == 0 && tv::StreamAligned(df, yr))
          LongRowDirect<true, kNative>(xr, zr, yr, p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r), p.rstd_rows.col_stride,
                              w.data(), b.data(), D, G, inv_g, p.eps, nbg, act, sa);
        else
          LongRowDirect<false, kNative>(xr, zr, yr, p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r), p.rstd_rows.col_stride,
                               w.data(), b.data(), D, G, inv_g, p.eps, nbg, act, sa);
      }
      if (stream) hwy::FlushStream();
      return;
    }
    // Blocks of long rows are one or two rows: a fresh zeroed Scratch (six D-float rows) per block was work of
    // the order of the row itself. The two rows used here live per thread, fully overwritten per row.
    float* h = ThreadRows(2 * D);
    float* z = h + D;
    for (int64_t r = r0; r < r1; ++r) {
      LoadRowT(static_cast<const TX*>(p.x) + p.x_rows.row_offset(r), p.x_rows.col_stride, h, D, false);
      if (p.residual) LoadRow(p.residual, p.res_dtype, p.res_rows.row_offset(r), p.res_rows.col_stride, h, D, true);
      if (p.residual_out)
        StoreRow(h, p.residual_out, p.res_out_dtype, p.res_out_rows.row_offset(r), p.res_out_rows.col_stride, D, stream);
      LoadRowT(static_cast<const TX*>(p.z) + p.z_rows.row_offset(r), p.z_rows.col_stride, z, D, false);
      // z <- act(z); gate_before_norm: h <- h * act(z).
      int64_t j = 0;
      for (; j + N <= D; j += N) {
        const VF a = ActFwd<TX>(df, act, hn::LoadU(df, z + j), nbg);
        hn::StoreU(a, df, z + j);
        if (!nbg) hn::StoreU(hn::Mul(hn::LoadU(df, h + j), a), df, h + j);
      }
      for (; j < D; ++j) {
        z[j] = ActS(act, z[j]);
        if (!nbg) h[j] *= z[j];
      }
      const int64_t so = p.rstd_rows.row_offset(r);
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t j0 = g * G, j1 = j0 + G;
        const float rs = 1.f / std::sqrt(DotF32(h + j0, h + j0, G) * inv_g + p.eps);
        store_elem(p.rstd, p.rstd_dtype, so + g * p.rstd_rows.col_stride, rs);
        const VF vr = hn::Set(df, rs);
        int64_t k = j0;
        for (; k + N <= j1; k += N) {
          VF o = hn::MulAdd(hn::Mul(hn::LoadU(df, h + k), vr), hn::LoadU(df, w.data() + k), hn::LoadU(df, b.data() + k));
          if (nbg) o = hn::Mul(o, hn::LoadU(df, z + k));
          hn::StoreU(o, df, h + k);
        }
        for (; k < j1; ++k) {
          float o = h[k] * rs * w[k] + b[k];
          if (nbg) o *= z[k];
          h[k] = o;
        }
      }
      StoreRowT(h, static_cast<TX*>(p.y) + p.y_rows.row_offset(r), p.y_rows.col_stride, D, stream);
    }
    if (stream) hwy::FlushStream();
  });
}

// ------------------------------------------------------------------------------------------------------
// Backward.

// U adjacent output vectors from p: two at a time (tile/cpu/vec_pair-inl.h), a lone last one alone.
template <bool kStream, bool kNative, int U, class T>
HWY_INLINE void StoreOutN(DF df, const VF (&v)[U], T* p) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int u = 0;
#pragma GCC unroll 8
  for (; u + 1 < U; u += 2) tv::StoreOut2<kStream, kNative>(df, v[u], v[u + 1], p + u * N);
  if constexpr (U % 2 == 1) tv::StoreOut<kStream, kNative>(df, v[U - 1], p + (U - 1) * N);
}

// Pass A's loop over the vectors of [k0, k1) in DotF32's order (vector pairs into a0 / a1, a lone last vector into
// a0): pass(k, nv, dn) forms the dot product's factors of the U vectors from k (nv, dn: arrays VF[U]), U = 4
// (two pairs, step by step: session 16, see ActN), 2 or 1 for the rest of the group. One prefetch of x, z and dy per
// 64-byte line per step (a whole line for bf16 / f16 on AVX2 and AVX-512; session 10's per-pair prefetch of half a
// line needed a test and a branch each on AVX2). Returns the lane sum of sum_k dn nv and sets *kend to the first
// element after the whole vectors.
template <class TX, class PassA>
HWY_INLINE float PassADot(const TX* x, const TX* z, const TX* dy, int64_t k0, int64_t k1, int64_t* kend, PassA&& pass) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStep4 = static_cast<int64_t>(4 * hn::MaxLanes(DF()) * sizeof(TX));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df);
  int64_t k = k0;
  for (; k + 4 * N <= k1; k += 4 * N) {
    tv::PrefetchAhead<kStep4>(x + k);
    tv::PrefetchAhead<kStep4>(z + k);
    tv::PrefetchAhead<kStep4>(dy + k);
    VF nv[4], dn[4];
    pass(k, nv, dn);
    a0 = hn::MulAdd(dn[0], nv[0], a0);
    a1 = hn::MulAdd(dn[1], nv[1], a1);
    a0 = hn::MulAdd(dn[2], nv[2], a0);
    a1 = hn::MulAdd(dn[3], nv[3], a1);
  }
  for (; k + 2 * N <= k1; k += 2 * N) {
    VF nv[2], dn[2];
    pass(k, nv, dn);
    a0 = hn::MulAdd(dn[0], nv[0], a0);
    a1 = hn::MulAdd(dn[1], nv[1], a1);
  }
  for (; k + N <= k1; k += N) {
    VF nv[1], dn[1];
    pass(k, nv, dn);
    a0 = hn::MulAdd(dn[0], nv[0], a0);
  }
  *kend = k;
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
}
// The vector count U of pass A's arrays (see PassADot).
template <class Arr>
inline constexpr int kArrU = static_cast<int>(std::extent_v<std::remove_reference_t<Arr>>);

// One backward row with unit column strides, no residual and no dresidual_out, straight from storage. Per
// group: pass A reads x, z, dy once from memory (prefetched), forms act(z), act'(z), the normalized value nrm,
// dn = d(loss)/d(nrm), their dot product, the dweight / dbias terms (into the block's partial rows bw / bb)
// and norm-before-gate's dz; pass B writes dx (and gate-before-norm's dz) from d = rs (dn - nrm mean).
// Norm-before-gate keeps nrm and dn in two f32 rows of the thread (s0, s1) for pass B (session 10: pass B
// used to re-read and re-widen x and dy and recompute them, ~11 of ~50 vector operations per vector; +10 %
// at D = 128). Gate-before-norm keeps act(z) and act'(z) there instead, and pass B re-reads x and dy from L1 and
// recomputes nrm and dn: keeping nrm, dn and x too (five rows) was ~30 % slower at G = 1024 and 5120, the
// extra stores costing more than the operations they save. The values and their order are the same either
// way (DotF32's accumulation), so the bits are the general path's when G is a multiple of the vector length
// (see LongRowDirect). rstd is f32 (see ShortRow).
template <bool kStream, bool kNative, class TX>
HWY_INLINE void BwdRowDirect(const TX* HWY_RESTRICT xr, const TX* HWY_RESTRICT zr, const TX* HWY_RESTRICT dyr,
                             TX* HWY_RESTRICT dxr, TX* HWY_RESTRICT dzr, const float* HWY_RESTRICT rstd,
                             int64_t rstd_col, const float* HWY_RESTRICT w, const float* HWY_RESTRICT bias, int64_t D,
                             int64_t G, float inv_g, bool nbg, int32_t act, float* HWY_RESTRICT bw,
                             float* HWY_RESTRICT bb, float* HWY_RESTRICT scratch) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const bool want_wb = bw != nullptr;
  float* HWY_RESTRICT s0 = scratch;      // nrm (norm-before-gate) or act(z)
  float* HWY_RESTRICT s1 = scratch + G;  // dn (norm-before-gate) or act'(z)
  for (int64_t j0 = 0, g = 0; j0 < D; j0 += G, ++g) {
    const TX* x = xr + j0;
    const TX* z = zr + j0;
    const TX* dy = dyr + j0;
    const float* wg = w + j0;
    const float* bg = bias + j0;
    const float rs = rstd[g * rstd_col];
    const VF vr = hn::Set(df, rs);
    // Pass A for the U vectors from k: nrm and dn (the dot product's factors) into nv / dn and the scratch rows;
    // each step as a loop over the U vectors, the gate order and dweight tests once per step.
    // z first (the sigmoid's U chains), x, dy and weight after it: fewer live vectors (AVX2 has 16 registers).
    auto pass_a = [&](int64_t k, auto& nv, auto& dn) STRATA_RNG_STEP_INLINE {
      constexpr int U = kArrU<decltype(nv)>;
      VF zv[U], av[U], ag[U], dterm[U];
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) zv[u] = tv::LoadF32(df, z + k + u * N);
      ActN<TX, true>(df, act, zv, av, ag);
      if (nbg) {
        VF dz[U];
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) {
          const VF xv = tv::LoadF32(df, x + k + u * N), dyv = tv::LoadF32(df, dy + k + u * N);
          const VF wv = hn::LoadU(df, wg + k + u * N);
          nv[u] = hn::Mul(xv, vr);
          dterm[u] = hn::Mul(dyv, av[u]);
          const VF o = hn::MulAdd(nv[u], wv, hn::LoadU(df, bg + k + u * N));
          dz[u] = hn::Mul(hn::Mul(dyv, o), ag[u]);
          dn[u] = hn::Mul(dterm[u], wv);
          hn::StoreU(nv[u], df, s0 + k + u * N);
          hn::StoreU(dn[u], df, s1 + k + u * N);
        }
        StoreOutN<kStream, kNative>(df, dz, dzr + j0 + k);
      } else {
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) {
          const VF xv = tv::LoadF32(df, x + k + u * N), dyv = tv::LoadF32(df, dy + k + u * N);
          nv[u] = hn::Mul(hn::Mul(xv, av[u]), vr);
          dterm[u] = dyv;
          hn::StoreU(av[u], df, s0 + k + u * N);
          hn::StoreU(ag[u], df, s1 + k + u * N);
          dn[u] = hn::Mul(dterm[u], hn::LoadU(df, wg + k + u * N));
        }
      }
      if (want_wb) {
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) {
          float* pw = bw + j0 + k + u * N;
          float* pb = bb + j0 + k + u * N;
          hn::StoreU(hn::MulAdd(dterm[u], nv[u], hn::LoadU(df, pw)), df, pw);
          hn::StoreU(hn::Add(hn::LoadU(df, pb), dterm[u]), df, pb);
        }
      }
    };
    int64_t k;
    float dot = PassADot(x, z, dy, 0, G, &k, pass_a);
    for (; k < G; ++k) {
      const float zk = to_f32(z[k]), xk = to_f32(x[k]), gk = to_f32(dy[k]);
      const float a = ActS(act, zk), ag = ActGradS(act, zk);
      float nv, dterm;
      if (nbg) {
        nv = xk * rs;
        dterm = gk * a;
        dzr[j0 + k] = from_f32<TX>(gk * (nv * wg[k] + bg[k]) * ag);
      } else {
        nv = xk * a * rs;
        dterm = gk;
      }
      const float dn = dterm * wg[k];
      s0[k] = nbg ? nv : a;
      s1[k] = nbg ? dn : ag;
      if (want_wb) bw[j0 + k] += dterm * nv, bb[j0 + k] += dterm;
      dot += dn * nv;
    }
    const float mean = dot * inv_g;
    // Pass B: d = rs (dn - nrm mean) -> dx (norm-before-gate), or dx = d act(z), dz = d x act'(z).
    const VF vm = hn::Set(df, mean);
    // U vectors from k: dx (and dz) into the output rows, two vectors per store where U allows.
    auto pass_b = [&](int64_t k, auto u_tag) STRATA_RNG_STEP_INLINE {
      constexpr int U = decltype(u_tag)::value;
      VF dxv[U], dzv[U];
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const int64_t ku = k + u * N;
        if (nbg) {
          dxv[u] = hn::Mul(vr, hn::NegMulAdd(hn::LoadU(df, s0 + ku), vm, hn::LoadU(df, s1 + ku)));
        } else {
          const VF av = hn::LoadU(df, s0 + ku), xv = tv::LoadF32(df, x + ku);
          const VF nv = hn::Mul(hn::Mul(xv, av), vr);
          const VF d = hn::Mul(vr, hn::NegMulAdd(nv, vm, hn::Mul(tv::LoadF32(df, dy + ku), hn::LoadU(df, wg + ku))));
          dxv[u] = hn::Mul(d, av);
          dzv[u] = hn::Mul(hn::Mul(d, xv), hn::LoadU(df, s1 + ku));
        }
      }
      StoreOutN<kStream, kNative>(df, dxv, dxr + j0 + k);
      if (!nbg) StoreOutN<kStream, kNative>(df, dzv, dzr + j0 + k);
    };
    k = 0;
    for (; k + 2 * N <= G; k += 2 * N) pass_b(k, std::integral_constant<int, 2>{});
    for (; k + N <= G; k += N) pass_b(k, std::integral_constant<int, 1>{});
    for (; k < G; ++k) {
      if (nbg) {
        dxr[j0 + k] = from_f32<TX>(rs * (s1[k] - s0[k] * mean));
      } else {
        const float xk = to_f32(x[k]), a = s0[k];
        const float d = rs * (to_f32(dy[k]) * wg[k] - xk * a * rs * mean);
        dxr[j0 + k] = from_f32<TX>(d * a);
        dzr[j0 + k] = from_f32<TX>(d * xk * s1[k]);
      }
    }
  }
}

// Gate-before-norm backward with dweight / dbias over rows [r0, r1) of one block (direct rows: unit column
// strides, no residual, no dresidual_out; groups of whole 64-byte lines of TX, G % LineElems == 0). BwdRowDirect
// read-modified-wrote the block's two f32 partial rows (dweight, dbias: 2 D floats) once per row; at D = 5120 they,
// the two f32 scratch rows of act(z) / act'(z) and the row's inputs (~100 KiB a row) do not stay in L1, so every
// vector of the partial rows went to L2 and back with each row. Here the rows go in sub-blocks of `sub` rows:
// phase A (per row, BwdRowDirect's pass A without the partial rows) keeps act(z), act'(z) of every row of the
// sub-block (f32 rows, ~0.4 MiB in all: in L2) and each group's mean; phase B walks the columns one 64-byte line
// of TX at a time down the sub-block's rows, writing dx / dz (whole lines, as the non-temporal stores want) and
// adding the dweight / dbias terms in registers, read from and written to the partial rows once per sub-block.
// The same operations in the same order (the partial rows still add the rows' terms in row order; pass B's
// formulas are BwdRowDirect's), so the same bits as BwdRowDirect. rows: scratch of 2 sub D floats; means: sub ng.
// The most rows per sub-block (BwdRows clamps the sub-block to it; rows per block are at most 32 for D >= 1024).
constexpr int64_t kGbnMaxSub = 32;
template <bool kStream, bool kNative, class TX>
void BwdRowsGbnBlocked(const RmsNormGatedBwdParams& p, int64_t r0, int64_t r1, int64_t sub, const float* HWY_RESTRICT w,
                       float inv_g, float* HWY_RESTRICT bw, float* HWY_RESTRICT bb, float* HWY_RESTRICT rows,
                       float* HWY_RESTRICT means) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  // Vectors per 64-byte line of TX (the phase-B column step): 2 for bf16 on AVX-512, 4 on AVX2.
  constexpr int64_t kV = std::max<int64_t>(1, 64 / static_cast<int64_t>(sizeof(TX) * hn::MaxLanes(DF())));
  const int64_t D = p.D, G = p.group, ng = D / G;
  const int32_t act = p.act;
  const float* rstd = static_cast<const float*>(p.rstd);
  auto x_of = [&](int64_t r) { return static_cast<const TX*>(p.x) + p.x_rows.row_offset(r); };
  auto dy_of = [&](int64_t r) { return static_cast<const TX*>(p.dy) + p.dy_rows.row_offset(r); };
  for (int64_t s0r = r0; s0r < r1; s0r += sub) {
    const int64_t nr = std::min(sub, r1 - s0r);
    // Phase A: act(z), act'(z) into the rows' scratch, the groups' means (DotF32's order, as BwdRowDirect).
    for (int64_t i = 0; i < nr; ++i) {
      const int64_t r = s0r + i;
      const TX* xr = x_of(r);
      const TX* zr = static_cast<const TX*>(p.z) + p.z_rows.row_offset(r);
      const TX* dyr = dy_of(r);
      const float* rsr = rstd + p.rstd_rows.row_offset(r);
      float* HWY_RESTRICT sa = rows + 2 * i * D;
      float* HWY_RESTRICT sg = sa + D;
      for (int64_t j0 = 0, g = 0; j0 < D; j0 += G, ++g) {
        const VF vr = hn::Set(df, rsr[g * p.rstd_rows.col_stride]);
        auto pass_a = [&](int64_t k, auto& nv, auto& dn) STRATA_RNG_STEP_INLINE {
          constexpr int U = kArrU<decltype(nv)>;
          VF zv[U], av[U], ag[U];
#pragma GCC unroll 8
          for (int u = 0; u < U; ++u) zv[u] = tv::LoadF32(df, zr + k + u * N);
          ActN<TX, true>(df, act, zv, av, ag);
#pragma GCC unroll 8
          for (int u = 0; u < U; ++u) {
            const VF xv = tv::LoadF32(df, xr + k + u * N), dyv = tv::LoadF32(df, dyr + k + u * N);
            nv[u] = hn::Mul(hn::Mul(xv, av[u]), vr);
            dn[u] = hn::Mul(dyv, hn::LoadU(df, w + k + u * N));
            hn::StoreU(av[u], df, sa + k + u * N);
            hn::StoreU(ag[u], df, sg + k + u * N);
          }
        };
        int64_t kend;  // == j0 + G (G is a multiple of the vector length here)
        means[i * ng + g] = PassADot(xr, zr, dyr, j0, j0 + G, &kend, pass_a) * inv_g;
      }
    }
    // Phase B: one line of columns down the sub-block's rows (G == D: each row's one rstd and mean). The rows'
    // pointers and factors are taken once per sub-block (not per row and line). Each step also prefetches the dx /
    // dz lines kOutAhead lines further on: the stores walk 2 nr lines per step across the rows, a pattern the
    // hardware prefetchers do not follow, so without it every new output line was a read-for-ownership miss to
    // memory with the core waiting (session 17, EPYC, [1024, 5120] bf16, 1 thread: phase B was 73 % of the
    // kernel's samples against 27 % for phase A and its sigmoids).
    constexpr int64_t kOutAhead = 4 * 64;  // bytes: 4 steps ahead
    const TX* xs[kGbnMaxSub];
    const TX* dys[kGbnMaxSub];
    TX* dxs[kGbnMaxSub];
    TX* dzs[kGbnMaxSub];
    float rss[kGbnMaxSub];
    for (int64_t i = 0; i < nr; ++i) {
      const int64_t r = s0r + i;
      xs[i] = x_of(r);
      dys[i] = dy_of(r);
      dxs[i] = static_cast<TX*>(p.dx) + p.dx_rows.row_offset(r);
      dzs[i] = static_cast<TX*>(p.dz) + p.dz_rows.row_offset(r);
      rss[i] = rstd[p.rstd_rows.row_offset(r)];
    }
    // The block's first sub-block starts the partial rows from zero (+0, as the zero-filled rows it replaces: the
    // same sums), so they need no fill beforehand; every column is written (D is whole lines).
    const bool first = s0r == r0;
    for (int64_t c = 0; c < D; c += kV * N) {
      VF aw[kV], ab[kV], wv[kV];
      for (int64_t v = 0; v < kV; ++v) {
        aw[v] = first ? hn::Zero(df) : hn::LoadU(df, bw + c + v * N);
        ab[v] = first ? hn::Zero(df) : hn::LoadU(df, bb + c + v * N);
        wv[v] = hn::LoadU(df, w + c + v * N);
      }
      for (int64_t i = 0; i < nr; ++i) {
        const VF vr = hn::Set(df, rss[i]), vm = hn::Set(df, means[i]);
        const TX* x = xs[i] + c;
        const TX* dy = dys[i] + c;
        const float* sa = rows + 2 * i * D + c;
        const float* sg = sa + D;
        TX* dx = dxs[i] + c;
        TX* dz = dzs[i] + c;
        if constexpr (!kStream) {  // non-temporal stores skip the read-for-ownership the prefetch would bring back
          tv::PrefetchAhead<64, kOutAhead>(dx);
          tv::PrefetchAhead<64, kOutAhead>(dz);
        }
        VF dxv[kV], dzv[kV];
        for (int64_t v = 0; v < kV; ++v) {
          const VF av = hn::LoadU(df, sa + v * N), xv = tv::LoadF32(df, x + v * N), dyv = tv::LoadF32(df, dy + v * N);
          const VF nv = hn::Mul(hn::Mul(xv, av), vr);
          const VF d = hn::Mul(vr, hn::NegMulAdd(nv, vm, hn::Mul(dyv, wv[v])));
          dxv[v] = hn::Mul(d, av);
          dzv[v] = hn::Mul(hn::Mul(d, xv), hn::LoadU(df, sg + v * N));
          aw[v] = hn::MulAdd(dyv, nv, aw[v]);
          ab[v] = hn::Add(ab[v], dyv);
        }
        StoreOutN<kStream, kNative>(df, dxv, dx);
        StoreOutN<kStream, kNative>(df, dzv, dz);
      }
      for (int64_t v = 0; v < kV; ++v) {
        hn::StoreU(aw[v], df, bw + c + v * N);
        hn::StoreU(ab[v], df, bb + c + v * N);
      }
    }
  }
}

template <class TX, bool kNative = false>
void BwdRows(const RmsNormGatedBwdParams& p) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t D = p.D, G = p.group, ng = G > 0 ? D / G : 0;
  const bool want_wb = p.dweight || p.dbias;
  const int64_t block = rng_rows_per_block(D);
  const int64_t nb = (p.rows + block - 1) / block;
  float* pw = p.partial;
  float* pb = p.partial ? p.partial + nb * D : nullptr;
  std::vector<float> w, bias;
  ParamRow(p.weight, p.w_dtype, p.w_row, D, 1.f, w);
  ParamRow(p.bias, p.b_dtype, p.b_row, D, 0.f, bias);
  // dx and dz are two interleaved output streams: non-temporal only where the CPU takes those well
  // (tile/cpu/stream_policy.h: plain stores on AMD Zen, where the streamed rows ran 1.2-2.7 x slower).
  const bool stream = p.rows * D * static_cast<int64_t>(sizeof(TX)) >= kRngStreamBytes && tile::cpu_streams_two_outputs();
  const float inv_g = G > 0 ? 1.f / static_cast<float>(G) : 0.f;
  const bool nbg = p.norm_before_gate;  // locals: see FwdRows
  const int32_t act = p.act;
  // Rows that BwdRowDirect takes (unit column strides, no residual, no dresidual_out).
  const bool direct = !p.residual && !p.dres_out && p.x_rows.col_stride == 1 && p.z_rows.col_stride == 1 &&
                      p.dy_rows.col_stride == 1 && p.dx_rows.col_stride == 1 && p.dz_rows.col_stride == 1;
  // BwdRowsGbnBlocked: gate-before-norm with dweight / dbias, one group per row (G = D) of at least 1024 features
  // in whole lines. Sub-blocks of rows whose scratch and inputs (2 f32 rows + 2 rows of TX re-read in phase B) take
  // 3/8 of the L2 per core, 128-384 KiB. Measured on the H200 host's Xeon (2 pinned threads, bf16, session 13 run 1,
  // 384 KiB, which its 2 MiB L2 keeps): D = 5120 +23 % in L2 ([64, 5120]), +1 % from memory ([1024, 5120]); rows of
  // several groups (D = 8192, G = 1024) 15-19 % slower, so they stay on BwdRowDirect. Session 17, the 512 KiB L2 of a
  // Zen 3 core (the EPYC CI machine): with 384 KiB (6 rows at D = 5120) the sub-block's inputs, scratch, partial rows
  // and the output lines being written (~540 KiB) overflowed it and phase B re-read from L3; 192 KiB (3 rows) ran
  // [1024, 5120] from memory 1.32 x faster (1 thread, no output prefetch), 2 rows the same as 3. 192 KiB when the
  // L2 size is unknown. Any sub-block size gives the same bits.
  constexpr int64_t kLineElems = 64 / static_cast<int64_t>(sizeof(TX));
  const bool blocked = direct && !nbg && want_wb && D >= 1024 && G == D && G % kLineElems == 0 && G % N == 0;
  const int64_t l2 = tile::cpu_l2_bytes();
  const int64_t budget = l2 > 0 ? std::clamp<int64_t>(l2 / 8 * 3, 128 << 10, 384 << 10) : (192 << 10);
  const int64_t sub = blocked ? std::clamp<int64_t>(budget / (D * static_cast<int64_t>(8 + 2 * sizeof(TX))), 1,
                                                    std::min(block, kGbnMaxSub))
                              : 1;
  tile::parallel_blocks(p.rows, block, [&](int64_t r0, int64_t r1) {
    if (blocked) {
      float* bw = pw + (r0 / block) * D;
      float* bb = pb + (r0 / block) * D;  // written from zero by the first sub-block (BwdRowsGbnBlocked)
      float* rows = ThreadRows(2 * sub * D + sub * ng);
      float* means = rows + 2 * sub * D;
      // Non-temporal stores need whole 16-byte-or-wider vectors at every row start of both outputs.
      bool st = stream && hn::Lanes(df) * sizeof(TX) >= 16;
      for (int64_t r = r0; r < r1 && st; ++r)
        st = tv::StreamAligned(df, static_cast<TX*>(p.dx) + p.dx_rows.row_offset(r)) &&
             tv::StreamAligned(df, static_cast<TX*>(p.dz) + p.dz_rows.row_offset(r));
      if (st) {
        BwdRowsGbnBlocked<true, kNative, TX>(p, r0, r1, sub, w.data(), inv_g, bw, bb, rows, means);
        hwy::FlushStream();
      } else {
        BwdRowsGbnBlocked<false, kNative, TX>(p, r0, r1, sub, w.data(), inv_g, bw, bb, rows, means);
      }
      return;
    }
    if (direct) {
      float* scratch = ThreadRows(2 * G);
      const float* rstd = static_cast<const float*>(p.rstd);
      float* bw = want_wb ? pw + (r0 / block) * D : nullptr;
      float* bb = want_wb ? pb + (r0 / block) * D : nullptr;
      if (want_wb) std::fill(bw, bw + D, 0.f), std::fill(bb, bb + D, 0.f);
      for (int64_t r = r0; r < r1; ++r) {
        const TX* xr = static_cast<const TX*>(p.x) + p.x_rows.row_offset(r);
        const TX* zr = static_cast<const TX*>(p.z) + p.z_rows.row_offset(r);
        const TX* dyr = static_cast<const TX*>(p.dy) + p.dy_rows.row_offset(r);
        TX* dxr = static_cast<TX*>(p.dx) + p.dx_rows.row_offset(r);
        TX* dzr = static_cast<TX*>(p.dz) + p.dz_rows.row_offset(r);
        const float* rsr = rstd + p.rstd_rows.row_offset(r);
        // Non-temporal stores need whole 16-byte-or-wider vectors at every group start of both outputs.
        if (stream && hn::Lanes(df) * sizeof(TX) >= 16 && G % N == 0 && tv::StreamAligned(df, dxr) &&
            tv::StreamAligned(df, dzr))
          BwdRowDirect<true, kNative>(xr, zr, dyr, dxr, dzr, rsr, p.rstd_rows.col_stride, w.data(), bias.data(), D, G,
                                      inv_g, nbg, act, bw, bb, scratch);
        else
          BwdRowDirect<false, kNative>(xr, zr, dyr, dxr, dzr, rsr, p.rstd_rows.col_stride, w.data(), bias.data(), D, G,
                                       inv_g, nbg, act, bw, bb, scratch);
      }
      if (stream) hwy::FlushStream();
      return;
    }
    Scratch s(D);
    float *h = s.h.data(), *z = s.z.data(), *gy = s.g.data(), *nrm = s.a.data(), *dn = s.b.data(), *ag = s.c.data();
    float* bw = want_wb ? pw + (r0 / block) * D : nullptr;
    float* bb = want_wb ? pb + (r0 / block) * D : nullptr;
    if (want_wb) std::fill(bw, bw + D, 0.f), std::fill(bb, bb + D, 0.f);
    for (int64_t r = r0; r < r1; ++r) {
      LoadRowT(static_cast<const TX*>(p.x) + p.x_rows.row_offset(r), p.x_rows.col_stride, h, D, false);
      if (p.residual) LoadRow(p.residual, p.res_dtype, p.res_rows.row_offset(r), p.res_rows.col_stride, h, D, true);
      LoadRowT(static_cast<const TX*>(p.z) + p.z_rows.row_offset(r), p.z_rows.col_stride, z, D, false);
      LoadRowT(static_cast<const TX*>(p.dy) + p.dy_rows.row_offset(r), p.dy_rows.col_stride, gy, D, false);
      // z <- act(z), ag <- act'(z).
      int64_t j = 0;
      for (; j + N <= D; j += N) {
        VF vg;
        const VF a = Act<TX>(df, act, hn::LoadU(df, z + j), &vg);
        hn::StoreU(a, df, z + j);
        hn::StoreU(vg, df, ag + j);
      }
      for (; j < D; ++j) {
        ag[j] = ActGradS(act, z[j]);
        z[j] = ActS(act, z[j]);
      }
      const int64_t so = p.rstd_rows.row_offset(r);
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t j0 = g * G, j1 = j0 + G;
        const float rs = static_cast<float>(load_elem(p.rstd, p.rstd_dtype, so + g * p.rstd_rows.col_stride));
        const VF vr = hn::Set(df, rs);
        // Pass 1: nrm (xh or uh), dn (dxh or duh), dw/db terms; norm_before_gate also dz (into ag).
        int64_t k = j0;
        for (; k + N <= j1; k += N) {
          const VF hv = hn::LoadU(df, h + k), av = hn::LoadU(df, z + k), dyv = hn::LoadU(df, gy + k);
          const VF wv = hn::LoadU(df, w.data() + k);
          VF nv, dterm;
          if (nbg) {
            nv = hn::Mul(hv, vr);
            const VF o = hn::MulAdd(nv, wv, hn::LoadU(df, bias.data() + k));
            dterm = hn::Mul(dyv, av);  // do
            hn::StoreU(hn::Mul(hn::Mul(dyv, o), hn::LoadU(df, ag + k)), df, ag + k);  // dz
          } else {
            nv = hn::Mul(hn::Mul(hv, av), vr);
            dterm = dyv;
          }
          if (want_wb) {
            hn::StoreU(hn::MulAdd(dterm, nv, hn::LoadU(df, bw + k)), df, bw + k);
            hn::StoreU(hn::Add(hn::LoadU(df, bb + k), dterm), df, bb + k);
          }
          hn::StoreU(nv, df, nrm + k);
          hn::StoreU(hn::Mul(dterm, wv), df, dn + k);
        }
        for (; k < j1; ++k) {
          float nv, dterm;
          if (nbg) {
            nv = h[k] * rs;
            const float o = nv * w[k] + bias[k];
            dterm = gy[k] * z[k];
            ag[k] = gy[k] * o * ag[k];
          } else {
            nv = h[k] * z[k] * rs;
            dterm = gy[k];
          }
          if (want_wb) bw[k] += dterm * nv, bb[k] += dterm;
          nrm[k] = nv;
          dn[k] = dterm * w[k];
        }
        const float mean = DotF32(dn + j0, nrm + j0, G) * inv_g;
        // Pass 2: r (dn - nrm mean) -> dx (norm_before_gate) or du -> dx = du act(z), dz = du h act'(z).
        const VF vm = hn::Set(df, mean);
        k = j0;
        for (; k + N <= j1; k += N) {
          const VF d = hn::Mul(vr, hn::NegMulAdd(hn::LoadU(df, nrm + k), vm, hn::LoadU(df, dn + k)));
          if (nbg) {
            hn::StoreU(d, df, gy + k);
          } else {
            hn::StoreU(hn::Mul(d, hn::LoadU(df, z + k)), df, gy + k);
            hn::StoreU(hn::Mul(hn::Mul(d, hn::LoadU(df, h + k)), hn::LoadU(df, ag + k)), df, ag + k);
          }
        }
        for (; k < j1; ++k) {
          const float d = rs * (dn[k] - nrm[k] * mean);
          if (nbg) {
            gy[k] = d;
          } else {
            gy[k] = d * z[k];
            ag[k] = d * h[k] * ag[k];
          }
        }
      }
      if (p.dres_out)
        LoadRow(p.dres_out, p.dres_out_dtype, p.dres_out_rows.row_offset(r), p.dres_out_rows.col_stride, gy, D, true);
      StoreRowT(gy, static_cast<TX*>(p.dx) + p.dx_rows.row_offset(r), p.dx_rows.col_stride, D, stream);
      StoreRowT(ag, static_cast<TX*>(p.dz) + p.dz_rows.row_offset(r), p.dz_rows.col_stride, D, stream);
    }
    if (stream) hwy::FlushStream();
  });
  if (!want_wb) return;
  // Block partial rows summed in block order; columns split in fixed chunks.
  // Session 16: a vector of columns at a time (each lane adds its column's partial rows in block order from 0, as
  // the scalar loop: the same bits); the scalar form read nb partial rows per column one float at a time, ~5-10 %
  // of a [4096, 5120] backward on the EPYC (nb = 256).
  tile::parallel_blocks(D, 256, [&](int64_t c0, int64_t c1) {
    auto put = [&](int64_t c, float sw, float sb) {
      if (p.dweight) store_elem(p.dweight, p.dw_dtype, p.dw_row.base + c * p.dw_row.col_stride, sw);
      if (p.dbias) store_elem(p.dbias, p.db_dtype, p.db_row.base + c * p.db_row.col_stride, sb);
    };
    alignas(64) float tw[hn::MaxLanes(DF())], tb[hn::MaxLanes(DF())];
    int64_t c = c0;
    // Session 17: kC column vectors (two 64-byte lines on AVX2) per walk down the partial rows, the lines kAhead
    // rows further down prefetched: the walk steps D floats at a time (20 KiB at D = 5120, a new page each step, which
    // the hardware prefetchers do not follow), so each partial row's lines were demand misses; ~10 % of a
    // [1024, 5120] backward from memory on the EPYC (perf). Each lane still adds its column's partial rows in block
    // order from 0: the same bits.
    constexpr int64_t kC = 4, kAhead = 8;
    constexpr int64_t kStepBytes = static_cast<int64_t>(kC * hn::MaxLanes(DF()) * sizeof(float));
    const uintptr_t ahead = static_cast<uintptr_t>(kAhead * D) * sizeof(float);
    for (; c + kC * N <= c1; c += kC * N) {
      VF sw[kC], sb[kC];
      for (int64_t u = 0; u < kC; ++u) sw[u] = sb[u] = hn::Zero(df);
      for (int64_t q = 0; q < nb; ++q) {
        const float* rw = pw + q * D + c;
        const float* rb = pb + q * D + c;
        for (int64_t k = 0; k < kStepBytes; k += 64) {
          hwy::Prefetch(reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(rw) + ahead + k));
          hwy::Prefetch(reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(rb) + ahead + k));
        }
        for (int64_t u = 0; u < kC; ++u) {
          sw[u] = hn::Add(sw[u], hn::LoadU(df, rw + u * N));
          sb[u] = hn::Add(sb[u], hn::LoadU(df, rb + u * N));
        }
      }
      for (int64_t u = 0; u < kC; ++u) {
        hn::Store(sw[u], df, tw);
        hn::Store(sb[u], df, tb);
        for (int64_t j = 0; j < N; ++j) put(c + u * N + j, tw[j], tb[j]);
      }
    }
    for (; c + N <= c1; c += N) {
      VF sw = hn::Zero(df), sb = hn::Zero(df);
      for (int64_t q = 0; q < nb; ++q) {
        sw = hn::Add(sw, hn::LoadU(df, pw + q * D + c));
        sb = hn::Add(sb, hn::LoadU(df, pb + q * D + c));
      }
      hn::Store(sw, df, tw);
      hn::Store(sb, df, tb);
      for (int64_t j = 0; j < N; ++j) put(c + j, tw[j], tb[j]);
    }
    for (; c < c1; ++c) {
      float sw = 0.f, sb = 0.f;
      for (int64_t q = 0; q < nb; ++q) sw += pw[q * D + c], sb += pb[q * D + c];
      put(c, sw, sb);
    }
  });
}

}  // namespace strata::norm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
