// float64 reference of rms_norm_gated (rms_norm_gated.h): plain loops per row and group, any float dtypes,
// any strides. The ground truth every kernel is tested against. The same loops in f32 arithmetic are the
// "naive same-dtype computation" of the acceptance rule (ATK harness).
#include <cmath>
#include <vector>

#include "ops/norm/rms_norm_gated/rms_norm_gated.h"

namespace strata::norm {
namespace {

template <class T>
void fwd_loops(const RmsNormGatedFwdParams& p) {
  const int64_t D = p.D, G = p.group, ng = G > 0 ? D / G : 0;
  std::vector<T> h(D), u(D);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t xo = p.x_rows.row_offset(r), zo = p.z_rows.row_offset(r), yo = p.y_rows.row_offset(r);
    for (int64_t j = 0; j < D; ++j) {
      h[j] = load_elem(p.x, p.x_dtype, xo + j * p.x_rows.col_stride);
      if (p.residual)
        h[j] += load_elem(p.residual, p.res_dtype, p.res_rows.row_offset(r) + j * p.res_rows.col_stride);
      if (p.residual_out)
        store_elem(p.residual_out, p.res_out_dtype, p.res_out_rows.row_offset(r) + j * p.res_out_rows.col_stride,
                   h[j]);
      const T zv = load_elem(p.z, p.x_dtype, zo + j * p.z_rows.col_stride);
      u[j] = p.norm_before_gate ? h[j] : h[j] * rng_act(p.act, zv);
    }
    for (int64_t g = 0; g < ng; ++g) {
      T ss = 0;
      for (int64_t j = g * G; j < (g + 1) * G; ++j) ss += u[j] * u[j];
      const T rstd = T(1) / std::sqrt(ss / static_cast<T>(G) + static_cast<T>(p.eps));
      store_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r) + g * p.rstd_rows.col_stride, rstd);
      for (int64_t j = g * G; j < (g + 1) * G; ++j) {
        const T w = p.weight ? load_elem(p.weight, p.w_dtype, p.w_row.row_offset(0) + j * p.w_row.col_stride) : T(1);
        const T b = p.bias ? load_elem(p.bias, p.b_dtype, p.b_row.row_offset(0) + j * p.b_row.col_stride) : T(0);
        T o = u[j] * rstd * w + b;
        if (p.norm_before_gate) o *= rng_act(p.act, load_elem(p.z, p.x_dtype, zo + j * p.z_rows.col_stride));
        store_elem(p.y, p.x_dtype, yo + j * p.y_rows.col_stride, o);
      }
    }
  }
}

template <class T>
void bwd_loops(const RmsNormGatedBwdParams& p, RmsNormGatedBwdMagnitudes* mag) {
  const int64_t D = p.D, G = p.group, ng = G > 0 ? D / G : 0;
  std::vector<T> dw(D, T(0)), db(D, T(0)), h(D), zv(D), nrm(D), dn(D);
  if (mag) {
    mag->dx.assign(static_cast<size_t>(p.rows * D), 0.0);
    mag->dz.assign(static_cast<size_t>(p.rows * D), 0.0);
    mag->dw.assign(static_cast<size_t>(D), 0.0);
    mag->db.assign(static_cast<size_t>(D), 0.0);
  }
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t j = 0; j < D; ++j) {
      h[j] = load_elem(p.x, p.x_dtype, p.x_rows.row_offset(r) + j * p.x_rows.col_stride);
      if (p.residual)
        h[j] += load_elem(p.residual, p.res_dtype, p.res_rows.row_offset(r) + j * p.res_rows.col_stride);
      zv[j] = load_elem(p.z, p.x_dtype, p.z_rows.row_offset(r) + j * p.z_rows.col_stride);
    }
    for (int64_t g = 0; g < ng; ++g) {
      const T rstd = load_elem(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(r) + g * p.rstd_rows.col_stride);
      T dot = 0;
      // nrm = the normalised value (xh or uh); dn = its gradient (dxh or duh).
      for (int64_t j = g * G; j < (g + 1) * G; ++j) {
        const T w = p.weight ? load_elem(p.weight, p.w_dtype, p.w_row.row_offset(0) + j * p.w_row.col_stride) : T(1);
        const T b = p.bias ? load_elem(p.bias, p.b_dtype, p.b_row.row_offset(0) + j * p.b_row.col_stride) : T(0);
        const T dyv = load_elem(p.dy, p.x_dtype, p.dy_rows.row_offset(r) + j * p.dy_rows.col_stride);
        if (p.norm_before_gate) {
          nrm[j] = h[j] * rstd;
          const T o = nrm[j] * w + b, a = rng_act(p.act, zv[j]);
          const T dov = dyv * a;
          store_elem(p.dz, p.x_dtype, p.dz_rows.row_offset(r) + j * p.dz_rows.col_stride,
                     dyv * o * rng_act_grad(p.act, zv[j]));
          dw[j] += dov * nrm[j];
          db[j] += dov;
          dn[j] = dov * w;
          if (mag) {
            mag->dz[r * D + j] = std::fabs(static_cast<double>(dyv * o * rng_act_grad(p.act, zv[j])));
            mag->dw[j] += std::fabs(static_cast<double>(dov * nrm[j]));
            mag->db[j] += std::fabs(static_cast<double>(dov));
          }
        } else {
          nrm[j] = h[j] * rng_act(p.act, zv[j]) * rstd;
          dw[j] += dyv * nrm[j];
          db[j] += dyv;
          dn[j] = dyv * w;
          if (mag) {
            mag->dw[j] += std::fabs(static_cast<double>(dyv * nrm[j]));
            mag->db[j] += std::fabs(static_cast<double>(dyv));
          }
        }
        dot += dn[j] * nrm[j];
      }
      const T mean = dot / static_cast<T>(G);
      for (int64_t j = g * G; j < (g + 1) * G; ++j) {
        const T dnorm_in = rstd * (dn[j] - nrm[j] * mean);  // gradient of h (nbg) or u (gbn)
        T dh = dnorm_in;
        // The cancelling terms of r (dn - nrm mean), carried through the factors that follow.
        const double cancel = std::fabs(static_cast<double>(rstd * dn[j])) + std::fabs(static_cast<double>(rstd * nrm[j] * mean));
        if (mag) mag->dx[r * D + j] = cancel;
        if (!p.norm_before_gate) {
          dh = dnorm_in * rng_act(p.act, zv[j]);
          if (mag) {
            mag->dx[r * D + j] = cancel * std::fabs(static_cast<double>(rng_act(p.act, zv[j])));
            mag->dz[r * D + j] = cancel * std::fabs(static_cast<double>(h[j] * rng_act_grad(p.act, zv[j])));
          }
          store_elem(p.dz, p.x_dtype, p.dz_rows.row_offset(r) + j * p.dz_rows.col_stride,
                     dnorm_in * h[j] * rng_act_grad(p.act, zv[j]));
        }
        if (p.dres_out && mag)
          mag->dx[r * D + j] += std::fabs(load_elem(p.dres_out, p.dres_out_dtype, p.dres_out_rows.row_offset(r) + j * p.dres_out_rows.col_stride));
        if (p.dres_out)
          dh += load_elem(p.dres_out, p.dres_out_dtype, p.dres_out_rows.row_offset(r) + j * p.dres_out_rows.col_stride);
        store_elem(p.dx, p.x_dtype, p.dx_rows.row_offset(r) + j * p.dx_rows.col_stride, dh);
      }
    }
  }
  for (int64_t j = 0; j < D; ++j) {
    if (p.dweight) store_elem(p.dweight, p.dw_dtype, p.dw_row.row_offset(0) + j * p.dw_row.col_stride, dw[j]);
    if (p.dbias) store_elem(p.dbias, p.db_dtype, p.db_row.row_offset(0) + j * p.db_row.col_stride, db[j]);
  }
}

}  // namespace

void rms_norm_gated_fwd_reference(const RmsNormGatedFwdParams& p) { fwd_loops<double>(p); }
void rms_norm_gated_bwd_reference(const RmsNormGatedBwdParams& p) { bwd_loops<double>(p, nullptr); }
void rms_norm_gated_bwd_magnitudes(const RmsNormGatedBwdParams& p, RmsNormGatedBwdMagnitudes& mag) {
  bwd_loops<double>(p, &mag);
}
void rms_norm_gated_fwd_naive_f32(const RmsNormGatedFwdParams& p) { fwd_loops<float>(p); }
void rms_norm_gated_bwd_naive_f32(const RmsNormGatedBwdParams& p) { bwd_loops<float>(p, nullptr); }

}  // namespace strata::norm
