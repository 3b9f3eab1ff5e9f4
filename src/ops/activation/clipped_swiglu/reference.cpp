// float64 reference of clipped_swiglu (clipped_swiglu.h): plain loops over rows and pairs, any float dtypes,
// any strides. The same loops in f32 arithmetic give the naive result of the acceptance rule.
#include "ops/activation/clipped_swiglu/clipped_swiglu.h"

namespace strata::activation {
namespace {

template <class T>
void fwd_loops(const ClippedSwigluFwdParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t xo = p.x_rows.row_offset(r), yo = p.y_rows.row_offset(r), xc = p.x_rows.col_stride;
    const T pr = p.probs ? static_cast<T>(load_elem(p.probs, p.probs_dtype, p.probs_rows.row_offset(r))) : T(1);
    for (int64_t i = 0; i < p.I; ++i) {
      const T A = static_cast<T>(load_elem(p.x, p.x_dtype, xo + csw_gate_col(p.interleaved, p.I, i) * xc));
      const T B = static_cast<T>(load_elem(p.x, p.x_dtype, xo + csw_lin_col(p.interleaved, p.I, i) * xc));
      const T y0 = csw_fwd<T>(A, B, static_cast<T>(p.alpha), static_cast<T>(p.limit), static_cast<T>(p.bias));
      store_elem(p.y, p.x_dtype, yo + i * p.y_rows.col_stride, p.probs ? y0 * pr : y0);
    }
  }
}

template <class T>
void bwd_loops(const ClippedSwigluBwdParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t xo = p.x_rows.row_offset(r), go = p.dy_rows.row_offset(r), dxo = p.dx_rows.row_offset(r);
    const int64_t xc = p.x_rows.col_stride, dc = p.dx_rows.col_stride;
    const T pr = p.probs ? static_cast<T>(load_elem(p.probs, p.probs_dtype, p.probs_rows.row_offset(r))) : T(1);
    T dp = 0;
    for (int64_t i = 0; i < p.I; ++i) {
      const int64_t ga = csw_gate_col(p.interleaved, p.I, i), lb = csw_lin_col(p.interleaved, p.I, i);
      const T A = static_cast<T>(load_elem(p.x, p.x_dtype, xo + ga * xc));
      const T B = static_cast<T>(load_elem(p.x, p.x_dtype, xo + lb * xc));
      const T dy = static_cast<T>(load_elem(p.dy, p.x_dtype, go + i * p.dy_rows.col_stride));
      T dA, dB;
      const T y0 = csw_bwd<T>(A, B, p.probs ? dy * pr : dy, static_cast<T>(p.alpha), static_cast<T>(p.limit),
                              static_cast<T>(p.bias), &dA, &dB);
      dp += y0 * dy;
      store_elem(p.dx, p.x_dtype, dxo + ga * dc, dA);
      store_elem(p.dx, p.x_dtype, dxo + lb * dc, dB);
    }
    if (p.dprobs) store_elem(p.dprobs, p.dprobs_dtype, p.dprobs_rows.row_offset(r), dp);
  }
}

}  // namespace

void clipped_swiglu_fwd_reference(const ClippedSwigluFwdParams& p) { fwd_loops<double>(p); }
void clipped_swiglu_bwd_reference(const ClippedSwigluBwdParams& p) { bwd_loops<double>(p); }
void clipped_swiglu_fwd_naive_f32(const ClippedSwigluFwdParams& p) { fwd_loops<float>(p); }
void clipped_swiglu_bwd_naive_f32(const ClippedSwigluBwdParams& p) { bwd_loops<float>(p); }

}  // namespace strata::activation
