// float64 reference of causal_conv1d, forward and backward: the ground truth every kernel is tested against
// (STYLE.md 1). Plain loops written directly from ops_fused.md §5.3-5.4 (and the seq_idx rules of
// tools/fused_ops_golden.py); it does not use the tap helpers of causal_conv1d.h, so it cross-checks them.
// Any float dtypes, any strides; the backward scatters (dx[p] += w[k] g[t]) where the kernels gather.
#include <cmath>
#include <vector>

#include "ops/conv/causal_conv1d/causal_conv1d.h"

namespace strata::conv {
namespace {

struct Ref {
  const Conv1dParams& p;
  int64_t W1;  // W - 1

  double x(int64_t b, int64_t t, int64_t d) const {
    return load_elem(p.x, p.x_dtype, b * p.xs[0] + t * p.xs[1] + d * p.xs[2]);
  }
  double w(int64_t d, int64_t k) const { return load_elem(p.weight, p.w_dtype, d * p.ws[0] + k * p.ws[1]); }
  double bias(int64_t d) const { return p.bias ? load_elem(p.bias, p.b_dtype, d * p.bs) : 0.0; }
  double h0(int64_t n, int64_t d, int64_t j) const {
    return load_elem(p.h0, p.h0_dtype, n * p.h0s[0] + d * p.h0s[1] + j * p.h0s[2]);
  }
  int64_t seq(int64_t b, int64_t t) const {
    return static_cast<int64_t>(load_elem(p.seq_idx, p.seq_dtype, b * p.seqs[0] + t * p.seqs[1]));
  }
  static double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

  // Calls fn(b, n, start, end) for every sequence (state index n).
  template <class Fn>
  void for_each_sequence(Fn&& fn) const {
    if (p.mode == kModeCuSeqlens) {
      for (int64_t n = 0; n < p.N; ++n)
        fn(int64_t{0}, n, static_cast<int64_t>(load_elem(p.cu_seqlens, p.cu_dtype, n * p.cus)),
           static_cast<int64_t>(load_elem(p.cu_seqlens, p.cu_dtype, (n + 1) * p.cus)));
    } else {
      for (int64_t b = 0; b < p.B; ++b) fn(b, b, int64_t{0}, p.T);
    }
  }

  // Tap k of token t of sequence (b, n, s, e): {weight of the source in dL/d(source) terms}. Calls
  // on_x(pos) or on_state(slot) when the tap reads something, nothing when it reads a zero.
  template <class OnX, class OnState>
  void tap(int64_t b, int64_t s, int64_t t, int64_t k, OnX&& on_x, OnState&& on_state) const {
    const int64_t pos = t - W1 + k;
    if (pos >= s) {
      if (p.mode == kModeSeqIdx && seq(b, pos) != seq(b, t)) return;
      on_x(pos);
    } else if (p.h0) {
      if (p.mode == kModeSeqIdx && seq(b, t) != seq(b, 0)) return;
      on_state(pos - s + W1);
    }
  }
  bool padding(int64_t b, int64_t t) const { return p.mode == kModeSeqIdx && seq(b, t) < 0; }
};

}  // namespace

void causal_conv1d_fwd_reference(const Conv1dParams& p) {
  const Ref r{p, p.W - 1};
  r.for_each_sequence([&](int64_t b, int64_t n, int64_t s, int64_t e) {
    for (int64_t d = 0; d < p.D; ++d) {
      for (int64_t t = s; t < e; ++t) {
        double u = r.bias(d);
        for (int64_t k = 0; k < p.W; ++k)
          r.tap(b, s, t, k, [&](int64_t pos) { u += r.w(d, k) * r.x(b, pos, d); },
                [&](int64_t j) { u += r.w(d, k) * r.h0(n, d, j); });
        double v = p.activation == kActSilu ? u * Ref::sigmoid(u) : u;
        if (r.padding(b, t)) v = 0.0;
        if (p.residual) v += load_elem(p.residual, p.x_dtype, b * p.rs[0] + t * p.rs[1] + d * p.rs[2]);
        store_elem(p.y, p.x_dtype, b * p.ys[0] + t * p.ys[1] + d * p.ys[2], v);
      }
      if (!p.hT) continue;
      // The last W-1 entries of concat(initial state or zeros, the sequence), masked like a tap of the last
      // token in seq_idx mode.
      for (int64_t j = 0; j < r.W1; ++j) {
        const int64_t pos = e - r.W1 + j;
        double v = 0.0;
        const bool seq = p.mode == kModeSeqIdx && e > 0;
        if (pos >= s) {
          if (!seq || r.seq(b, pos) == r.seq(b, e - 1)) v = r.x(b, pos, d);
        } else if (p.h0) {
          if (!seq || r.seq(b, 0) == r.seq(b, e - 1)) v = r.h0(n, d, pos - s + r.W1);
        }
        store_elem(p.hT, p.hT_dtype, n * p.hTs[0] + d * p.hTs[1] + j * p.hTs[2], v);
      }
    }
  });
}

void causal_conv1d_bwd_reference(const Conv1dParams& p) {
  const Ref r{p, p.W - 1};
  std::vector<double> dx(static_cast<size_t>(p.B * p.T), 0.0), dh0(static_cast<size_t>(p.N * (p.W - 1)), 0.0);
  std::vector<double> dw(static_cast<size_t>(p.W)), db(1);
  for (int64_t d = 0; d < p.D; ++d) {
    std::fill(dx.begin(), dx.end(), 0.0);
    std::fill(dh0.begin(), dh0.end(), 0.0);
    std::fill(dw.begin(), dw.end(), 0.0);
    db[0] = 0.0;
    r.for_each_sequence([&](int64_t b, int64_t n, int64_t s, int64_t e) {
      for (int64_t t = s; t < e; ++t) {
        // g[t] = dy[t] act'(u[t]) with u recomputed.
        double u = r.bias(d);
        for (int64_t k = 0; k < p.W; ++k)
          r.tap(b, s, t, k, [&](int64_t pos) { u += r.w(d, k) * r.x(b, pos, d); },
                [&](int64_t j) { u += r.w(d, k) * r.h0(n, d, j); });
        double g = load_elem(p.dy, p.x_dtype, b * p.dys[0] + t * p.dys[1] + d * p.dys[2]);
        if (p.activation == kActSilu) {
          const double sg = Ref::sigmoid(u);
          g *= sg * (1.0 + u * (1.0 - sg));
        }
        if (r.padding(b, t)) g = 0.0;
        db[0] += g;
        for (int64_t k = 0; k < p.W; ++k)
          r.tap(b, s, t, k,
                [&](int64_t pos) {
                  dx[static_cast<size_t>(b * p.T + pos)] += r.w(d, k) * g;
                  dw[static_cast<size_t>(k)] += g * r.x(b, pos, d);
                },
                [&](int64_t j) {
                  dh0[static_cast<size_t>(n * r.W1 + j)] += r.w(d, k) * g;
                  dw[static_cast<size_t>(k)] += g * r.h0(n, d, j);
                });
      }
      // The final state's gradient flows back to the position (or initial slot) it copied.
      if (p.dhT) {
        for (int64_t j = 0; j < r.W1; ++j) {
          const double gf = load_elem(p.dhT, p.dhT_dtype, n * p.dhTs[0] + d * p.dhTs[1] + j * p.dhTs[2]);
          const int64_t pos = e - r.W1 + j;
          const bool seq = p.mode == kModeSeqIdx && e > 0;
          if (pos >= s) {
            if (!seq || r.seq(b, pos) == r.seq(b, e - 1)) dx[static_cast<size_t>(b * p.T + pos)] += gf;
          } else if (p.h0) {
            if (!seq || r.seq(b, 0) == r.seq(b, e - 1)) dh0[static_cast<size_t>(n * r.W1 + pos - s + r.W1)] += gf;
          }
        }
      }
    });
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t t = 0; t < p.T; ++t)
        store_elem(p.dx, p.x_dtype, b * p.dxs[0] + t * p.dxs[1] + d * p.dxs[2], dx[static_cast<size_t>(b * p.T + t)]);
    for (int64_t k = 0; k < p.W; ++k)
      store_elem(p.dw, p.w_dtype, d * p.dws[0] + k * p.dws[1], dw[static_cast<size_t>(k)]);
    if (p.db) store_elem(p.db, p.b_dtype, d * p.dbs, db[0]);
    if (p.dh0)
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t j = 0; j < r.W1; ++j)
          store_elem(p.dh0, p.dh0_dtype, n * p.dh0s[0] + d * p.dh0s[1] + j * p.dh0s[2],
                     dh0[static_cast<size_t>(n * r.W1 + j)]);
  }
}

}  // namespace strata::conv
