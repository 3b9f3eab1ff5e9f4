// Per-row cross-entropy math shared by fused_cross_entropy and chunk_loss (ops_fused.md §1.3, §1.4), host and
// device (STRATA_HD): the logit transform (scale, softcap), the online log-sum-exp, the row loss with label
// smoothing and z-loss, and the closed-form gradient. Kernels vectorise the element loops themselves but take
// every per-row formula from here, so the CPU, CUDA and fused-linear kernels agree on the math.
//
// One row i of logits z [V] with target y (not ignored):
//   u_j = s * z_j                               s = logit_scale
//   c_j = cap * tanh(u_j / cap)  (softcap > 0)  or  c_j = u_j
//   m = max_j c_j,  S = sum_j exp(c_j - m),  lse = m + log S
//   loss = lse - (1 - eps) c_y - (eps / V) sum_j c_j + lambda lse^2        eps = label_smoothing
//   z_loss = lambda lse^2                                                  lambda = lse_square_scale
//   dz_j = g * s * (1 - t_j^2) * (p_j (1 + 2 lambda lse) - eps / V - (1 - eps) [j == y]),
//          p_j = exp(c_j - lse), t_j = tanh(u_j / cap) (the (1 - t_j^2) factor only with softcap)
// g = dL/dloss_i (mean: G / #valid, sum: G, none: G_i). Ignored rows have loss 0, z_loss 0 and dz 0.
//
// Numerics: everything in f32. The loss is formed as (1 - eps)((m - c_y) + log S) + eps((m - mean c) + log S)
// + lambda lse^2 rather than lse - c_y: m - c_y is exact when the two are close (Sterbenz), so rows of huge
// logits (+-1e4, where lse and c_y agree in most of their digits) keep their accuracy. exp never sees a
// positive argument (c - m <= 0, c - lse <= 0), so nothing overflows; S >= 1 always (the max term).
//
// Interface stability: chunk_loss builds on these names; change them only additively.
#pragma once

#include <cmath>
#include <cstdint>

#include "opbase/dtype.h"

namespace strata::loss {

// Attributes of the per-row cross entropy, as the ops take them.
struct CeOptions {
  float logit_scale = 1.f;       // s (finite, non-zero)
  float softcap = 0.f;           // cap > 0, or 0: no soft-capping
  float label_smoothing = 0.f;   // eps in [0, 1]
  float lse_square_scale = 0.f;  // lambda >= 0 (z-loss)
  int64_t ignore_index = -100;   // rows whose target equals it have loss 0 and gradient 0
};

// Constants derived once per problem from CeOptions and the vocabulary size V (the smoothing denominator).
struct CeConsts {
  float scale = 1.f;        // s
  float cap = 0.f;          // softcap, 0 = off
  float inv_cap = 0.f;      // 1 / cap (0 when off)
  float eps = 0.f;          // label smoothing
  float one_minus_eps = 1.f;
  float eps_over_v = 0.f;   // eps / V
  float lambda = 0.f;       // z-loss coefficient
  int64_t ignore_index = -100;
  bool softcap_on = false;
};

STRATA_HD CeConsts ce_consts(const CeOptions& o, int64_t V) {
  CeConsts k;
  k.scale = o.logit_scale;
  k.softcap_on = o.softcap > 0.f;
  k.cap = k.softcap_on ? o.softcap : 0.f;
  k.inv_cap = k.softcap_on ? 1.f / o.softcap : 0.f;
  k.eps = o.label_smoothing;
  k.one_minus_eps = 1.f - o.label_smoothing;
  k.eps_over_v = V > 0 ? o.label_smoothing / static_cast<float>(V) : 0.f;
  k.lambda = o.lse_square_scale;
  k.ignore_index = o.ignore_index;
  return k;
}

STRATA_HD float ce_exp(float x) { return expf(x); }
STRATA_HD float ce_log(float x) { return logf(x); }
STRATA_HD float ce_tanh(float x) { return tanhf(x); }

// c = transformed logit of the raw logit z.
STRATA_HD float ce_logit(const CeConsts& k, float z) {
  const float u = k.scale * z;
  return k.softcap_on ? k.cap * ce_tanh(u * k.inv_cap) : u;
}

// dc/dz = s * (1 - t^2) with softcap, s without.
STRATA_HD float ce_logit_deriv(const CeConsts& k, float z) {
  if (!k.softcap_on) return k.scale;
  const float t = ce_tanh(k.scale * z * k.inv_cap);
  return k.scale * (1.f - t * t);
}

// Running maximum and rescaled sum of exponentials (Milakov & Gimelshein). m = -inf, s = 0 is the empty
// state; merging is exact up to one rounding of the rescaled sum.
struct OnlineLse {
  float m = -INFINITY;
  float s = 0.f;
};

STRATA_HD void lse_add(OnlineLse& a, float x) {
  if (x > a.m) {
    a.s = a.s * ce_exp(a.m - x) + 1.f;  // exp(-inf) = 0 for the empty state
    a.m = x;
  } else {
    a.s += ce_exp(x - a.m);
  }
}

// Adds a block of values whose maximum bm and sum of exp(x - bm) = bs are known (bs = 0: empty block).
STRATA_HD void lse_add_block(OnlineLse& a, float bm, float bs) {
  if (bs == 0.f) return;
  if (bm > a.m) {
    a.s = a.s * ce_exp(a.m - bm) + bs;
    a.m = bm;
  } else {
    a.s += bs * ce_exp(bm - a.m);
  }
}

STRATA_HD OnlineLse lse_merge(OnlineLse a, const OnlineLse& b) {
  lse_add_block(a, b.m, b.s);
  return a;
}

// Statistics of one row that the loss needs: m, S (OnlineLse), sum_j c_j and the target's c_y.
struct CeRowStats {
  OnlineLse lse;
  float sum_c = 0.f;
  float c_y = 0.f;
};

// Adds one transformed logit c to a row's statistics (is_target: c is the target's, c_y).
STRATA_HD void ce_stats_add(CeRowStats& st, float c, bool is_target) {
  lse_add(st.lse, c);
  st.sum_c += c;
  if (is_target) st.c_y = c;
}

// Merges the statistics of two disjoint column ranges of one row (a vocabulary tile into the running row,
// or two threads' partials): the target lies in at most one of them, the other's c_y is 0.
STRATA_HD CeRowStats ce_stats_merge(CeRowStats a, const CeRowStats& b) {
  a.lse = lse_merge(a.lse, b.lse);
  a.sum_c += b.sum_c;
  a.c_y += b.c_y;
  return a;
}

STRATA_HD float ce_lse(const OnlineLse& a) { return a.m + ce_log(a.s); }

// Loss of a non-ignored row (see the file comment for the cancellation-free form). V = vocabulary size.
STRATA_HD float ce_row_loss(const CeConsts& k, const CeRowStats& st, int64_t V) {
  const float log_s = ce_log(st.lse.s);
  const float lse = st.lse.m + log_s;
  float loss = k.one_minus_eps * ((st.lse.m - st.c_y) + log_s);
  if (k.eps != 0.f) loss += k.eps * ((st.lse.m - st.sum_c / static_cast<float>(V)) + log_s);
  if (k.lambda != 0.f) loss += k.lambda * lse * lse;
  return loss;
}

STRATA_HD float ce_row_z_loss(const CeConsts& k, float lse) { return k.lambda * lse * lse; }

// Per-row constants of the gradient, given g = dL/dloss_i and the row's lse:
//   dz_j = f_j * (p_coef * exp(c_j - lse) - uniform - [j == y] * target),  f_j = (1 - t_j^2) or 1,
// with p_coef = g s (1 + 2 lambda lse), uniform = g s eps / V, target = g s (1 - eps).
struct CeGradRow {
  float lse = 0.f;
  float p_coef = 0.f;
  float uniform = 0.f;
  float target = 0.f;
};

STRATA_HD CeGradRow ce_grad_row(const CeConsts& k, float lse, float g) {
  CeGradRow r;
  const float gs = g * k.scale;
  r.lse = lse;
  r.p_coef = gs * (1.f + 2.f * k.lambda * lse);
  r.uniform = gs * k.eps_over_v;
  r.target = gs * k.one_minus_eps;
  return r;
}

// dz_j of one element from its raw logit z (is_target: j == y).
STRATA_HD float ce_grad_elem(const CeConsts& k, const CeGradRow& r, float z, bool is_target) {
  const float u = k.scale * z;
  float c = u, f = 1.f;
  if (k.softcap_on) {
    const float t = ce_tanh(u * k.inv_cap);
    c = k.cap * t;
    f = 1.f - t * t;
  }
  float d = r.p_coef * ce_exp(c - r.lse) - r.uniform;
  if (is_target) d -= r.target;
  return f * d;
}

// dz_j of one element from its transformed logit c = ce_logit(k, z) (kernels that hold c already; with softcap
// t = c / cap is tanh(u / cap) up to one rounding). exp_fn: the exponential (ce_exp, or a device-fast one where
// the result is rounded to 16 bits).
template <class ExpFn>
STRATA_HD float ce_grad_from_logit(const CeConsts& k, const CeGradRow& r, float c, bool is_target, ExpFn exp_fn) {
  float d = r.p_coef * exp_fn(c - r.lse) - r.uniform;
  if (is_target) d -= r.target;
  if (k.softcap_on) {
    const float t = c * k.inv_cap;
    d *= 1.f - t * t;
  }
  return d;
}
struct CeExp {
  STRATA_HD float operator()(float x) const { return ce_exp(x); }
};
STRATA_HD float ce_grad_from_logit(const CeConsts& k, const CeGradRow& r, float c, bool is_target) {
  return ce_grad_from_logit(k, r, c, is_target, CeExp{});
}

// Scalar row loops (tails, single-thread users, tests): statistics of z[0..V) and the gradient row.
// T is a storage type (float, double, bf16_t, f16_t). y outside [0, V) contributes no c_y (0).
template <class T>
STRATA_HD CeRowStats ce_row_stats(const CeConsts& k, const T* z, int64_t V, int64_t y) {
  CeRowStats st;
  for (int64_t j = 0; j < V; ++j) {
    const float c = ce_logit(k, to_f32(z[j]));
    lse_add(st.lse, c);
    st.sum_c += c;
  }
  if (y >= 0 && y < V) st.c_y = ce_logit(k, to_f32(z[y]));
  return st;
}

// Writes dz[0..V) (dz may alias z: each element is read before it is written).
template <class T, class TD>
STRATA_HD void ce_row_grad(const CeConsts& k, const CeGradRow& r, const T* z, TD* dz, int64_t V, int64_t y) {
  for (int64_t j = 0; j < V; ++j) dz[j] = from_f32<TD>(ce_grad_elem(k, r, to_f32(z[j]), j == y));
}

}  // namespace strata::loss
