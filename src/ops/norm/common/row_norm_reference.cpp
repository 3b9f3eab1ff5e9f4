// float64 reference for the row norms: the ground truth every kernel is tested against (STYLE.md 1).
#include <cmath>

#include "ops/norm/common/row_norm.h"
#include "opbase/dtype.h"

namespace strata::norm {

void row_norm_fwd_reference(const RowNormFwdParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t xo = p.x_rows.row_offset(r);
    double ss = 0.0;
    for (int64_t j = 0; j < p.D; ++j) {
      const double v = load_elem(p.x, p.x_dtype, xo + j * p.x_rows.col_stride);
      ss += v * v;
    }
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(p.n_div) + static_cast<double>(p.eps));
    store_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r), rstd);
    if (!p.y) continue;
    const int64_t yo = p.y_rows.row_offset(r);
    for (int64_t j = 0; j < p.D; ++j)
      store_elem(p.y, p.y_dtype, yo + j * p.y_rows.col_stride,
                 load_elem(p.x, p.x_dtype, xo + j * p.x_rows.col_stride) * rstd);
  }
}

void row_norm_bwd_reference(const RowNormBwdParams& p) {
  const double inv_n = 1.0 / static_cast<double>(p.n_div);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t so = p.src_rows.row_offset(r), xo = p.dx_rows.row_offset(r), go = p.dout_rows.row_offset(r);
    const double rstd = load_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r));
    auto src = [&](int64_t j) { return load_elem(p.src, p.src_dtype, so + j * p.src_rows.col_stride); };
    auto dout = [&](int64_t j) { return load_elem(p.dout, p.dout_dtype, go + j * p.dout_rows.col_stride); };
    auto put = [&](int64_t j, double v) { store_elem(p.dx, p.dx_dtype, xo + j * p.dx_rows.col_stride, v); };
    if (p.kind == RowNormBwdKind::kFactor) {
      const double c = -dout(0) * rstd * rstd * rstd * inv_n;
      for (int64_t j = 0; j < p.D; ++j) put(j, src(j) * c);
      continue;
    }
    double dot = 0.0;
    for (int64_t j = 0; j < p.D; ++j) dot += dout(j) * src(j);
    const double c = p.kind == RowNormBwdKind::kNormalizedSrc ? dot * inv_n : dot * rstd * rstd * inv_n;
    for (int64_t j = 0; j < p.D; ++j) put(j, rstd * (dout(j) - c * src(j)));
  }
}

}  // namespace strata::norm
