// Reference of chunk_gated_delta_rule: the token-by-token recurrence of ops_gdn_kda.md §2.1 and its exact
// reverse-mode derivative, written directly from the definition (no chunking, no WY transform), so it is an
// independent check of the chunked implementations. Real = double is the ground truth ("reference"
// implementation); Real = float is the straightforward same-precision computation that the acceptance rule
// of ARCHITECTURE.md §6 measures against. Any float dtypes and strides.
//
// Backward: per (n, hv) the forward is run once, keeping the state at the start of every 64-token block
// (checkpoints, [NB, K, V]); the reverse sweep then re-computes the states inside one block at a time
// ([64, K, V]) and walks the tokens backwards:
//   dS += scale q do^T;  dq = scale S do;  u = dS^T k;  dbeta = r.u;  dr = beta u;  dv = dr
//   dk += beta dS r - Sd dr;  dSd = dS - k dr^T;  dg = <dSd, Sd>;  dS = exp(g) dSd
// with Sd = exp(g) S_prev, r = v - Sd^T k. dq and dk are summed over the G value heads of a q/k head in
// increasing hv (fixed order), then taken through the l2norm backward when it is on.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"

namespace strata::linear_attn {
namespace {

template <class Real>
struct Access {
  const GdnParams& p;
  Real ld(const GdnTensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3 = 0) const {
    return static_cast<Real>(load_elem(t.data, t.dtype, i0 * t.st[0] + i1 * t.st[1] + i2 * t.st[2] + i3 * t.st[3]));
  }
  void st(const GdnTensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, Real v) const {
    store_elem(t.data, t.dtype, i0 * t.st[0] + i1 * t.st[1] + i2 * t.st[2] + i3 * t.st[3], static_cast<double>(v));
  }
  // q or k of token (b, t), head h, l2-normalised when the op says so; returns rstd (1 when not normalised).
  Real load_qk(const GdnTensor& x, int64_t b, int64_t t, int64_t h, Real* out) const {
    Real ss = 0;
    for (int64_t d = 0; d < p.K; ++d) {
      out[d] = ld(x, b, t, h, d);
      ss += out[d] * out[d];
    }
    if (!p.l2norm) return Real(1);
    const Real rstd = Real(1) / std::sqrt(ss + static_cast<Real>(kGdnL2Eps));
    for (int64_t d = 0; d < p.K; ++d) out[d] *= rstd;
    return rstd;
  }
};

}  // namespace

template <class Real>
void gdn_recurrent_fwd(const GdnParams& p) {
  const Access<Real> a{p};
  const int64_t K = p.K, V = p.V, G = p.HV / p.H;
  const Real scale = static_cast<Real>(p.scale);
  std::vector<Real> S(static_cast<size_t>(K * V)), q(K), k(K), r(V);
  for (int64_t n = 0; n < p.N; ++n) {
    const GdnSeq s = gdn_seq(p, n);
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      const int64_t h = hv / G;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) S[i * V + j] = p.h0.present() ? a.ld(p.h0, n, hv, i, j) : Real(0);
      for (int64_t t = s.bos; t < s.eos; ++t) {
        a.load_qk(p.q, s.b, t, h, q.data());
        a.load_qk(p.k, s.b, t, h, k.data());
        const Real decay = std::exp(a.ld(p.g, s.b, t, hv));
        const Real beta = a.ld(p.beta, s.b, t, hv);
        for (Real& x : S) x *= decay;
        for (int64_t j = 0; j < V; ++j) {
          Real pred = 0;
          for (int64_t i = 0; i < K; ++i) pred += S[i * V + j] * k[i];
          r[j] = beta * (a.ld(p.v, s.b, t, hv, j) - pred);
        }
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) S[i * V + j] += k[i] * r[j];
        for (int64_t j = 0; j < V; ++j) {
          Real acc = 0;
          for (int64_t i = 0; i < K; ++i) acc += S[i * V + j] * q[i];
          a.st(p.o, s.b, t, hv, j, scale * acc);
        }
      }
      if (p.ht.present())
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) a.st(p.ht, n, hv, i, j, S[i * V + j]);
    }
  }
}

// Checkpoints [NB + 1, K, V], block states [64, K, V], and the dq / dk sums [B, T, H, K], all Real.
template <class Real>
size_t gdn_recurrent_bwd_workspace(const GdnParams& p) {
  const int64_t kv = p.K * p.V;
  const int64_t nb = (p.T + kGdnChunk - 1) / kGdnChunk + 1;
  return sizeof(Real) * static_cast<size_t>((nb + kGdnChunk) * kv + 2 * p.B * p.T * p.H * p.K);
}

template <class Real>
void gdn_recurrent_bwd(const GdnParams& p, void* workspace) {
  const Access<Real> a{p};
  const int64_t K = p.K, V = p.V, G = p.HV / p.H, kv = K * V, BT = kGdnChunk;
  const int64_t nb_max = (p.T + BT - 1) / BT + 1;
  const Real scale = static_cast<Real>(p.scale);
  Real* ckpt = static_cast<Real*>(workspace);  // [nb_max, K, V]
  Real* blk = ckpt + nb_max * kv;              // [BT, K, V]: state after each token of the block
  Real* dqs = blk + BT * kv;                   // [B, T, H, K]
  Real* dks = dqs + p.B * p.T * p.H * K;
  std::fill(dqs, dqs + 2 * p.B * p.T * p.H * K, Real(0));
  std::vector<Real> dS(static_cast<size_t>(kv)), Sd(static_cast<size_t>(kv)), q(K), k(K), r(V), u(V), dk(K),
      dO(V);
  auto tok = [&](int64_t b, int64_t t, int64_t h) { return ((b * p.T + t) * p.H + h) * K; };

  // One token of the forward: S = exp(g) S_prev + k (beta r)^T, returning Sd = exp(g) S_prev and r.
  auto step = [&](const Real* Sprev, Real* Snew, int64_t b, int64_t t, int64_t hv, Real* sd, Real* rr) {
    const Real decay = std::exp(a.ld(p.g, b, t, hv));
    const Real beta = a.ld(p.beta, b, t, hv);
    for (int64_t e = 0; e < kv; ++e) sd[e] = decay * Sprev[e];
    for (int64_t j = 0; j < V; ++j) {
      Real pred = 0;
      for (int64_t i = 0; i < K; ++i) pred += sd[i * V + j] * k[i];
      rr[j] = a.ld(p.v, b, t, hv, j) - pred;
    }
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j) Snew[i * V + j] = sd[i * V + j] + k[i] * beta * rr[j];
  };

  for (int64_t n = 0; n < p.N; ++n) {
    const GdnSeq s = gdn_seq(p, n);
    const int64_t L = s.eos - s.bos, nb = (L + BT - 1) / BT;
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      const int64_t h = hv / G;
      // forward: checkpoints at every block start
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) ckpt[i * V + j] = p.h0.present() ? a.ld(p.h0, n, hv, i, j) : Real(0);
      for (int64_t c = 0; c + 1 < nb; ++c) {
        const Real* prev = ckpt + c * kv;
        for (int64_t i = 0; i < BT; ++i) {
          const int64_t t = s.bos + c * BT + i;
          a.load_qk(p.k, s.b, t, h, k.data());
          Real* out = i + 1 == BT ? ckpt + (c + 1) * kv : blk + i * kv;
          step(prev, out, s.b, t, hv, Sd.data(), r.data());
          prev = out;
        }
      }
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) dS[i * V + j] = p.dht.present() ? a.ld(p.dht, n, hv, i, j) : Real(0);
      // reverse sweep, one block at a time
      for (int64_t c = nb - 1; c >= 0; --c) {
        const int64_t t0 = s.bos + c * BT, len = std::min(BT, s.eos - t0);
        for (int64_t i = 0; i < len; ++i) {
          a.load_qk(p.k, s.b, t0 + i, h, k.data());
          step(i == 0 ? ckpt + c * kv : blk + (i - 1) * kv, blk + i * kv, s.b, t0 + i, hv, Sd.data(), r.data());
        }
        for (int64_t i = len - 1; i >= 0; --i) {
          const int64_t t = t0 + i;
          const Real* S = blk + i * kv;
          const Real* Sprev = i == 0 ? ckpt + c * kv : blk + (i - 1) * kv;
          a.load_qk(p.q, s.b, t, h, q.data());
          a.load_qk(p.k, s.b, t, h, k.data());
          const Real decay = std::exp(a.ld(p.g, s.b, t, hv));
          const Real beta = a.ld(p.beta, s.b, t, hv);
          for (int64_t j = 0; j < V; ++j) dO[j] = a.ld(p.do_, s.b, t, hv, j);
          // o = scale S^T q
          Real* dq = dqs + tok(s.b, t, h);
          for (int64_t ii = 0; ii < K; ++ii) {
            Real acc = 0;
            for (int64_t j = 0; j < V; ++j) {
              dS[ii * V + j] += scale * q[ii] * dO[j];
              acc += S[ii * V + j] * dO[j];
            }
            dq[ii] += scale * acc;
          }
          // S = Sd + beta k r^T,  r = v - Sd^T k
          for (int64_t e = 0; e < kv; ++e) Sd[e] = decay * Sprev[e];
          for (int64_t j = 0; j < V; ++j) {
            Real pred = 0, uj = 0;
            for (int64_t ii = 0; ii < K; ++ii) {
              pred += Sd[ii * V + j] * k[ii];
              uj += dS[ii * V + j] * k[ii];
            }
            r[j] = a.ld(p.v, s.b, t, hv, j) - pred;
            u[j] = uj;
          }
          Real dbeta = 0;
          for (int64_t j = 0; j < V; ++j) dbeta += r[j] * u[j];
          for (int64_t ii = 0; ii < K; ++ii) {
            Real acc = 0;
            for (int64_t j = 0; j < V; ++j) acc += dS[ii * V + j] * r[j] - Sd[ii * V + j] * u[j];
            dk[ii] = beta * acc;  // beta dS r - Sd (beta u)
          }
          Real dg = 0;
          for (int64_t ii = 0; ii < K; ++ii)
            for (int64_t j = 0; j < V; ++j) {
              const Real dsd = dS[ii * V + j] - k[ii] * beta * u[j];
              dg += dsd * Sd[ii * V + j];
              dS[ii * V + j] = decay * dsd;
            }
          for (int64_t j = 0; j < V; ++j) a.st(p.dv, s.b, t, hv, j, beta * u[j]);
          a.st(p.dbeta, s.b, t, hv, 0, dbeta);
          a.st(p.dg, s.b, t, hv, 0, dg);
          Real* dks_t = dks + tok(s.b, t, h);
          for (int64_t ii = 0; ii < K; ++ii) dks_t[ii] += dk[ii];
        }
      }
      if (p.dh0.present())
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) a.st(p.dh0, n, hv, i, j, dS[i * V + j]);
    }
  }
  // dq, dk: through the l2norm backward (exact: dx = rstd (dy - (dy.y) y) for y = x rstd), then stored.
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t h = 0; h < p.H; ++h)
        for (int w = 0; w < 2; ++w) {
          const GdnTensor& x = w == 0 ? p.q : p.k;
          const GdnTensor& dx = w == 0 ? p.dq : p.dk;
          const Real* dy = (w == 0 ? dqs : dks) + tok(b, t, h);
          const Real rstd = a.load_qk(x, b, t, h, q.data());
          Real dot = 0;
          if (p.l2norm)
            for (int64_t d = 0; d < K; ++d) dot += dy[d] * q[d];
          for (int64_t d = 0; d < K; ++d) a.st(dx, b, t, h, d, p.l2norm ? rstd * (dy[d] - dot * q[d]) : dy[d]);
        }
}

template size_t gdn_recurrent_bwd_workspace<double>(const GdnParams&);
template size_t gdn_recurrent_bwd_workspace<float>(const GdnParams&);
template void gdn_recurrent_fwd<double>(const GdnParams&);
template void gdn_recurrent_fwd<float>(const GdnParams&);
template void gdn_recurrent_bwd<double>(const GdnParams&, void*);
template void gdn_recurrent_bwd<float>(const GdnParams&, void*);

}  // namespace strata::linear_attn
