// float64 helpers of the four backward references: element access through a View, and per-chunk gate
// values. Plain and slow on purpose (the ground truth, STYLE.md 1).
#pragma once

#include <cmath>
#include <vector>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

namespace strata::linear_attn::gdn_bwd {

inline double ld(const View& v, int64_t i) { return load_elem(v.p, v.dtype, i); }
inline void st(const View& v, int64_t i, double x) { store_elem(v.p, v.dtype, i, x); }
// An element read in the arithmetic type of the loops (double: reference; float: naive).
template <class Acc>
Acc ldA(const View& v, int64_t i) {
  return static_cast<Acc>(ld(v, i));
}

// γ of rows t0 .. t1-1 of batch row b, value head hv (zeros without a gate).
template <class Acc>
std::vector<Acc> chunk_gamma(const View& g, int64_t b, int64_t t0, int64_t t1, int64_t hv) {
  std::vector<Acc> gam(static_cast<size_t>(t1 - t0), Acc(0));
  if (g.present())
    for (int64_t i = 0; i < t1 - t0; ++i) gam[i] = static_cast<Acc>(ld(g, g.off(b, t0 + i, hv)));
  return gam;
}

}  // namespace strata::linear_attn::gdn_bwd
