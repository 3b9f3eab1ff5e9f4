// Per-target CPU helpers of the gdn_bwd kernels: rows of a View converted to / from f32 buffers, gates of a
// chunk, and the fp32 GEMM micro-kernel (tile/cpu/gemm.h) of the same Highway target. Include inside
// HWY_NAMESPACE-compiled files (hwy/foreach_target.h); no include guard on purpose (Highway convention).
#if defined(STRATA_GDN_BWD_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_GDN_BWD_CPU_INL_H_
#undef STRATA_GDN_BWD_CPU_INL_H_
#else
#define STRATA_GDN_BWD_CPU_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "opbase/visit_kernel_dtype.h"  // (storage dtypes of the Views: f64 goes to the reference)
#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"
#include "tile/cpu/gemm.h"
#include "tile/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::gdn_bwd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace tv = strata::tile::HWY_NAMESPACE;

template <class T>
HWY_INLINE void LoadRowT(const T* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(tv::LoadF32(df, src + i), df, dst + i);
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}
template <class T>
HWY_INLINE void StoreRowT(const float* HWY_RESTRICT src, int64_t n, T* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) tv::StoreF32(df, hn::LoadU(df, src + i), dst + i);
  for (; i < n; ++i) dst[i] = from_f32<T>(src[i]);
}

// rows t0 .. t0+L-1 (row r at element offset `base + r * row_stride` of v), n contiguous elements each, to
// dst[r * ld + 0 .. n).
inline void LoadRows(const View& v, int64_t base, int64_t row_stride, int64_t L, int64_t n, float* dst,
                     int64_t ld) {
  visit_kernel_dtype(v.dtype, [&](auto t) {
    using T = decltype(t);
    const T* p = static_cast<const T*>(v.p);
    for (int64_t r = 0; r < L; ++r) LoadRowT(p + base + r * row_stride, n, dst + r * ld);
  });
}
inline void StoreRows(const View& v, int64_t base, int64_t row_stride, int64_t L, int64_t n, const float* src,
                      int64_t ld) {
  visit_kernel_dtype(v.dtype, [&](auto t) {
    using T = decltype(t);
    T* p = static_cast<T*>(v.p);
    for (int64_t r = 0; r < L; ++r) StoreRowT(src + r * ld, n, p + base + r * row_stride);
  });
}
// Rows of a view as an f32 matrix for reading: f32 views are used in place (returns a pointer into the tensor
// and sets ld to its row stride: no copy), other dtypes are converted into buf (ld = n).
inline const float* RowsF32(const View& v, int64_t base, int64_t row_stride, int64_t L, int64_t n, float* buf,
                            int64_t& ld) {
  if (v.dtype == STRATA_DTYPE_F32) {
    ld = row_stride;
    return static_cast<const float*>(v.p) + base;
  }
  LoadRows(v, base, row_stride, L, n, buf, n);
  ld = n;
  return buf;
}
inline const float* TokF32(const View& v, int64_t b, int64_t t0, int64_t head, int64_t L, int64_t n, float* buf,
                           int64_t& ld) {
  return RowsF32(v, v.off(b, t0, head), v.s[1], L, n, buf, ld);
}

// Per-thread f32 scratch, grown once and reused by every work item (no allocation or page fault per item).
struct Arena {
  float* p;
  explicit Arena(size_t floats) {
    thread_local std::vector<float> buf;
    if (buf.size() < floats) buf.resize(floats);
    p = buf.data();
  }
  float* take(int64_t n) {  // 64-byte multiples keep every buffer as aligned as the first
    float* r = p;
    p += (n + 15) / 16 * 16;
    return r;
  }
};
inline size_t ArenaSize(std::initializer_list<int64_t> sizes) {
  size_t total = 0;
  for (int64_t n : sizes) total += static_cast<size_t>((n + 15) / 16 * 16);
  return total;
}

// Token rows [t0, t0 + L) of batch row b and head `head` of a [B, T, heads, n] view.
inline void LoadTok(const View& v, int64_t b, int64_t t0, int64_t head, int64_t L, int64_t n, float* dst,
                    int64_t ld) {
  LoadRows(v, v.off(b, t0, head), v.s[1], L, n, dst, ld);
}
inline void StoreTok(const View& v, int64_t b, int64_t t0, int64_t head, int64_t L, int64_t n, const float* src,
                     int64_t ld) {
  StoreRows(v, v.off(b, t0, head), v.s[1], L, n, src, ld);
}
// A [K, V] state (h[b, c, hv] or h0[n, hv]): rows of V elements with row stride s[3] (5-d) or s[2] (4-d).
inline void LoadState(const View& v, int64_t base, int64_t row_stride, int64_t K, int64_t V, float* dst) {
  LoadRows(v, base, row_stride, K, V, dst, V);
}
// Scalar per-token values ([B, T, HV] f32 view) of L rows; zeros when absent.
inline void LoadScalars(const View& v, int64_t b, int64_t t0, int64_t hv, int64_t L, float* dst) {
  if (!v.present()) {
    for (int64_t i = 0; i < L; ++i) dst[i] = 0.f;
    return;
  }
  visit_kernel_dtype(v.dtype, [&](auto t) {
    using T = decltype(t);
    const T* p = static_cast<const T*>(v.p);
    for (int64_t i = 0; i < L; ++i) dst[i] = to_f32(p[v.off(b, t0 + i, hv)]);
  });
}
inline void StoreScalars(const View& v, int64_t b, int64_t t0, int64_t hv, int64_t L, const float* src) {
  visit_kernel_dtype(v.dtype, [&](auto t) {
    using T = decltype(t);
    T* p = static_cast<T*>(v.p);
    for (int64_t i = 0; i < L; ++i) p[v.off(b, t0 + i, hv)] = from_f32<T>(src[i]);
  });
}

// C[M, N] = alpha * op(A) op(B) + beta * C with the micro-kernel compiled for this target.
struct Gemm {
  tile::GemmF32Fn fn = tile::gemm_f32_for(HWY_TARGET);
  void operator()(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  // an empty contraction: C = beta * C (the micro-kernel would still read nothing)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta != 0.f ? beta * C[i * ldc + j] : 0.f;
      return;
    }
    tile::GemmF32Args a;
    a.trans_a = ta, a.trans_b = tb, a.M = M, a.N = N, a.K = K, a.alpha = alpha, a.A = A, a.lda = lda;
    a.B = B, a.ldb = ldb, a.beta = beta, a.C = C, a.ldc = ldc;
    fn(a);
  }
};

// Gate matrices of a chunk (L <= 64 rows), vectorised over the columns with Highway's Exp:
//   kLower:       out[r][c] = exp(γ_r - γ_c) for c <= r, else 0
//   kStrictLower: out[r][c] = exp(γ_r - γ_c) for c <  r, else 0
//   kUpper:       out[r][c] = exp(γ_c - γ_r) for c >= r, else 0
// The exponent is never positive where it is kept (γ is non-increasing inside a chunk); the other lanes may
// overflow to +Inf and are then *selected* away (never multiplied by a 0 mask: 0 * Inf = NaN).
enum class Gate { kLower, kStrictLower, kUpper };
template <Gate kMode>
HWY_NOINLINE void GateMatrix(const float* HWY_RESTRICT gam, int64_t L, float* HWY_RESTRICT out, int64_t ld) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float g[64 + HWY_MAX_BYTES / sizeof(float)];
  HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
  for (int64_t c = 0; c < L + N; ++c) g[c] = gam[c < L ? c : L - 1];  // pad with a valid value
  for (int64_t r = 0; r < L; ++r) {
    const auto gr = hn::Set(df, g[r]);
    const auto rf = hn::Set(df, static_cast<float>(r));
    for (int64_t c0 = 0; c0 < L; c0 += N) {
      const auto gc = hn::LoadU(df, g + c0);
      const auto cf = hn::Iota(df, static_cast<float>(c0));
      auto keep = kMode == Gate::kLower ? hn::Le(cf, rf) : (kMode == Gate::kStrictLower ? hn::Lt(cf, rf) : hn::Ge(cf, rf));
      const auto arg = kMode == Gate::kUpper ? hn::Sub(gc, gr) : hn::Sub(gr, gc);
      const auto v = hn::IfThenElseZero(keep, hn::Exp(df, arg));
      if (c0 + N <= L) {
        hn::StoreU(v, df, out + r * ld + c0);
      } else {
        hn::Store(v, df, tail);
        std::memcpy(out + r * ld + c0, tail, static_cast<size_t>(L - c0) * sizeof(float));
      }
    }
  }
}

// dst[c][r] = src[r * lds + c] for an R x C block (dst leading dimension R).
inline void Transpose(const float* HWY_RESTRICT src, int64_t lds, int64_t R, int64_t C, float* HWY_RESTRICT dst) {
  constexpr int64_t kB = 16;  // cache blocks
  for (int64_t r0 = 0; r0 < R; r0 += kB)
    for (int64_t c0 = 0; c0 < C; c0 += kB)
      for (int64_t r = r0; r < std::min(r0 + kB, R); ++r)
        for (int64_t c = c0; c < std::min(c0 + kB, C); ++c) dst[c * R + r] = src[r * lds + c];
}

// Row dot product of two f32 rows, in a fixed order.
HWY_INLINE float RowDot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  return tv::Dot(a, b, n);
}

}  // namespace strata::linear_attn::gdn_bwd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
