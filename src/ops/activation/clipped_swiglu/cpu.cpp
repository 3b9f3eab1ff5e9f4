// CPU kernels of clipped_swiglu (clipped_swiglu.h), written once with Highway and compiled for every target in
// tile::cpu_isas(). Rows go in fixed blocks (tile/cpu/parallel.h). A row of x (2I elements) is converted to an
// f32 scratch row, the pairs are taken as vectors (LoadInterleaved2 for the interleaved layout, two plain loads
// for the split one), and the outputs are rounded into place (non-temporal stores for large outputs). dprobs is
// a per-row sum in a fixed order (vector lanes, lane sum, tail): independent of the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/clipped_swiglu/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/activation/clipped_swiglu/clipped_swiglu.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::activation::HWY_NAMESPACE {
namespace tv = strata::tile::HWY_NAMESPACE;
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kStreamBytes = 4 << 20;

// Clamped pair -> (a, b + bias, s). NaN inputs stay NaN (IfThenElse on comparisons, which are false for NaN).
struct PairV {
  VF a, bb, s;
};
HWY_INLINE PairV Pair(DF df, VF A, VF B, VF alpha, VF limit, VF bias) {
  const VF nlimit = hn::Neg(limit), one = hn::Set(df, 1.f);
  PairV r;
  r.a = hn::IfThenElse(hn::Gt(A, limit), limit, A);
  const VF b = hn::IfThenElse(hn::Gt(B, limit), limit, hn::IfThenElse(hn::Lt(B, nlimit), nlimit, B));
  r.bb = hn::Add(b, bias);
  // exp argument capped at 88 (sigmoid < 1e-38 beyond): exp stays finite.
  // 1 / (1 + e): on AVX-512 the 14-bit estimate and one Newton step (below 1 ulp, much cheaper than vdivps);
  // the 12-bit estimate of the other targets would leave ~2 ulp, so they divide.
  const VF d = hn::Add(one, hn::Exp(df, hn::Min(hn::Neg(hn::Mul(alpha, r.a)), hn::Set(df, 88.f))));
#if HWY_TARGET == HWY_AVX3
  const VF est = hn::ApproximateReciprocal(d);
  r.s = hn::Mul(est, hn::NegMulAdd(d, est, hn::Set(df, 2.f)));
#else
  r.s = hn::Div(one, d);
#endif
  return r;
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
template <bool kStream, class T>
HWY_INLINE void RowFromF32(const float* src, T* dst, int64_t col, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (col != 1) {
    for (int64_t j = 0; j < n; ++j) dst[j * col] = from_f32<T>(src[j]);
    return;
  }
  int64_t j = 0;
  // Non-temporal stores only of whole 16-byte vectors (see rms_norm_gated/cpu.cpp).
  if (kStream && hn::Lanes(df) * sizeof(T) >= 16 && tv::StreamAligned(df, dst))
    for (; j + N <= n; j += N) tv::StoreOut<true, false>(df, hn::LoadU(df, src + j), dst + j);
  for (; j + N <= n; j += N) tv::StoreOut<false, false>(df, hn::LoadU(df, src + j), dst + j);
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

template <class T>
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
  tile::parallel_blocks(p.rows, tile::block_for_bytes(3 * I * static_cast<int64_t>(sizeof(T))), [&](int64_t r0, int64_t r1) {
    std::vector<float> xs(static_cast<size_t>(2 * I)), ys(static_cast<size_t>(I));
    for (int64_t r = r0; r < r1; ++r) {
      RowToF32(x + p.x_rows.row_offset(r), p.x_rows.col_stride, xs.data(), 2 * I);
      const float pr = p.probs ? static_cast<float>(load_elem(p.probs, p.probs_dtype, p.probs_rows.row_offset(r))) : 1.f;
      const VF vp = hn::Set(df, pr);
      int64_t i = 0;
      for (; i + N <= I; i += N) {
        VF A, B;
        PairsAt(df, xs.data(), I, i, inter, A, B);
        const PairV q = Pair(df, A, B, alpha, limit, bias);
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
      if (stream) RowFromF32<true>(ys.data(), yr, p.y_rows.col_stride, I);
      else RowFromF32<false>(ys.data(), yr, p.y_rows.col_stride, I);
    }
    if (stream) hwy::FlushStream();
  });
}

template <class T>
void BwdRows(const ClippedSwigluBwdParams& p) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t I = p.I;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  const bool stream = p.rows * 2 * I * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
  const VF alpha = hn::Set(df, p.alpha), limit = hn::Set(df, p.limit), bias = hn::Set(df, p.bias);
  const VF nlimit = hn::Neg(limit), one = hn::Set(df, 1.f), zero = hn::Zero(df);
  const bool inter = p.interleaved, has_p = p.probs != nullptr;  // locals: see FwdRows
  tile::parallel_blocks(p.rows, tile::block_for_bytes(5 * I * static_cast<int64_t>(sizeof(T)) + 1), [&](int64_t r0, int64_t r1) {
    std::vector<float> xs(static_cast<size_t>(2 * I)), gs(static_cast<size_t>(I)), ds(static_cast<size_t>(2 * I));
    for (int64_t r = r0; r < r1; ++r) {
      RowToF32(x + p.x_rows.row_offset(r), p.x_rows.col_stride, xs.data(), 2 * I);
      RowToF32(dy + p.dy_rows.row_offset(r), p.dy_rows.col_stride, gs.data(), I);
      const float pr = p.probs ? static_cast<float>(load_elem(p.probs, p.probs_dtype, p.probs_rows.row_offset(r))) : 1.f;
      const VF vp = hn::Set(df, pr);
      VF acc = zero;
      int64_t i = 0;
      for (; i + N <= I; i += N) {
        VF A, B;
        PairsAt(df, xs.data(), I, i, inter, A, B);
        const PairV q = Pair(df, A, B, alpha, limit, bias);
        const VF gy = hn::LoadU(df, gs.data() + i);
        const VF g = has_p ? hn::Mul(gy, vp) : gy;
        const VF as = hn::Mul(q.a, q.s);
        acc = hn::MulAdd(hn::Mul(as, q.bb), gy, acc);  // y0 * dy
        // dA = g (b + bias) s (1 + alpha a (1 - s)) [A <= limit]; dB = g a s [-limit <= B <= limit]
        const VF dA0 = hn::Mul(hn::Mul(g, hn::Mul(q.bb, q.s)), hn::MulAdd(hn::Mul(alpha, q.a), hn::Sub(one, q.s), one));
        const VF dA = hn::IfThenElseZero(hn::Le(A, limit), dA0);
        const VF dB = hn::IfThenElseZero(hn::And(hn::Ge(B, nlimit), hn::Le(B, limit)), hn::Mul(g, as));
        if (inter) {
          hn::StoreInterleaved2(dA, dB, df, ds.data() + 2 * i);
        } else {
          hn::StoreU(dA, df, ds.data() + i);
          hn::StoreU(dB, df, ds.data() + I + i);
        }
      }
      float dp = hn::GetLane(hn::SumOfLanes(df, acc));
      for (; i < I; ++i) {
        const int64_t ga = csw_gate_col(p.interleaved, I, i), lb = csw_lin_col(p.interleaved, I, i);
        float dA, dB;
        const float y0 = csw_bwd<float>(xs[ga], xs[lb], gs[i] * pr, p.alpha, p.limit, p.bias, &dA, &dB);
        dp += y0 * gs[i];
        ds[ga] = dA, ds[lb] = dB;
      }
      T* dxr = dx + p.dx_rows.row_offset(r);
      if (stream) RowFromF32<true>(ds.data(), dxr, p.dx_rows.col_stride, 2 * I);
      else RowFromF32<false>(ds.data(), dxr, p.dx_rows.col_stride, 2 * I);
      if (p.dprobs) store_elem(p.dprobs, p.dprobs_dtype, p.dprobs_rows.row_offset(r), dp);
    }
    if (stream) hwy::FlushStream();
  });
}

template <class Fn>
HWY_INLINE void Visit(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case STRATA_DTYPE_F32: fn(float{}); break;
    case STRATA_DTYPE_BF16: fn(bf16_t{}); break;
    default: fn(f16_t{}); break;
  }
}

void CswFwd(const ClippedSwigluFwdParams& p) {
  if (p.rows == 0 || p.I == 0) return;
  Visit(p.x_dtype, [&](auto t) { FwdRows<decltype(t)>(p); });
}
void CswBwd(const ClippedSwigluBwdParams& p) {
  if (p.rows == 0) return;
  Visit(p.x_dtype, [&](auto t) { BwdRows<decltype(t)>(p); });
}

}  // namespace strata::activation::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::activation {
HWY_EXPORT(CswFwd);
HWY_EXPORT(CswBwd);
ClippedSwigluFwdFn clipped_swiglu_fwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(CswFwd, hwy_target); }
ClippedSwigluBwdFn clipped_swiglu_bwd_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(CswBwd, hwy_target); }
}  // namespace strata::activation
#endif
