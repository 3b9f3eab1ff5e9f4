// References of the GDN forward chunk operators (gdn_fwd_kernels.h): plain loops over chunks and value heads,
// written directly from the spec formulas (ops_gdn_kda.md §4.3-§4.8, Appendix A), any dtypes and strides.
// Real = double is the float64 ground truth every kernel is compared with; Real = float runs the same loops in
// f32 (the "naive" same-precision computation of the acceptance rule, ARCHITECTURE.md §6).
//
// Per chunk [s, e) of L rows, value head hv, q/k head hv / G, γ = the given chunk-local cumsum g:
//   Akk_ij = β_i (k_i·k_j) exp(γ_i − γ_j)            j < i (0 elsewhere, exp only ever of γ_i − γ_j <= 0)
//   A      = (I + StrictLower(Akk))^-1               forward substitution row by row
//   u      = A diag(β) V,   w = A diag(β e^γ) K       (A's upper part and columns >= L are ignored)
//   Vn     = U − W S,  S' = e^{γ_last} S + Kᵀ diag(e^{γ_last − γ}) Vn,  h[c] = S (chunk start)
//   o      = scale (diag(e^γ) Q S + Lower(Q Kᵀ ⊙ Γ) Vn)
#include <cmath>
#include <vector>

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"

namespace strata::linear_attn::gdn {
namespace {

template <class Real>
struct Ref {
  const GdnFwdParams& p;
  const GdnShape& sh = p.shape;

  Real ld(const GdnTensor& t, int64_t off) const {
    if constexpr (std::is_same_v<Real, double>) return load_elem(t.data, t.dtype, off);
    else return load_f(t, off);
  }
  void st(const GdnTensor& t, int64_t off, Real v) const {
    if constexpr (std::is_same_v<Real, double>) store_elem(t.data, t.dtype, off, v);
    else store_f(t, off, v);
  }
  // element offsets
  static int64_t o4(const GdnTensor& t, int64_t b, int64_t tok, int64_t h, int64_t d) {
    return b * t.st[0] + tok * t.st[1] + h * t.st[2] + d * t.st[3];
  }
  static int64_t o3(const GdnTensor& t, int64_t b, int64_t tok, int64_t h) {
    return b * t.st[0] + tok * t.st[1] + h * t.st[2];
  }
  Real gam(const ChunkPos& c, int64_t hv, int64_t i) const {
    return p.g.present() ? ld(p.g, o3(p.g, c.b, c.s + i, hv)) : Real(0);
  }
  Real beta(const ChunkPos& c, int64_t hv, int64_t i) const { return ld(p.beta, o3(p.beta, c.b, c.s + i, hv)); }
  Real kd(const ChunkPos& c, int64_t hv, int64_t i, int64_t d) const {
    return ld(p.k, o4(p.k, c.b, c.s + i, hv / sh.G, d));
  }

  template <class Fn>
  void for_each_chunk(Fn&& fn) const {
    std::vector<int64_t> offsets;
    GdnChunks m = p.chunks;
    if (m.varlen()) {
      offsets.resize(static_cast<size_t>(m.N + 1));
      fill_chunk_offsets(m, offsets.data());
      m.offsets = offsets.data();
    }
    const int64_t slots = chunk_slots(m);
    for (int64_t i = 0; i < slots; ++i) {
      const ChunkPos c = locate_chunk(m, i);
      if (c.valid) fn(c, m);
    }
  }

  // Akk rows of one chunk and head as an L x L strictly lower matrix.
  std::vector<Real> kkt(const ChunkPos& c, int64_t hv) const {
    const int64_t L = c.e - c.s;
    std::vector<Real> M(static_cast<size_t>(L * L), Real(0));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < i; ++j) {
        Real dot = 0;
        for (int64_t d = 0; d < sh.K; ++d) dot += kd(c, hv, i, d) * kd(c, hv, j, d);
        M[i * L + j] = beta(c, hv, i) * dot * std::exp(gam(c, hv, i) - gam(c, hv, j));
      }
    return M;
  }
  // (I + M)^-1 for strictly lower M (L x L).
  static std::vector<Real> inverse(const std::vector<Real>& M, int64_t L) {
    std::vector<Real> X(static_cast<size_t>(L * L), Real(0));
    for (int64_t i = 0; i < L; ++i) {
      X[i * L + i] = 1;
      for (int64_t j = 0; j < i; ++j) {
        Real acc = 0;
        for (int64_t m = j; m < i; ++m) acc += M[i * L + m] * X[m * L + j];
        X[i * L + j] = -acc;
      }
    }
    return X;
  }
  void store_chunk_mat(const GdnTensor& t, const ChunkPos& c, int64_t hv, const std::vector<Real>& X) const {
    const int64_t L = c.e - c.s;
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < sh.BT; ++j) st(t, o4(t, c.b, c.s + i, hv, j), j < L ? X[i * L + j] : Real(0));
  }
  std::vector<Real> load_chunk_lower(const GdnTensor& t, const ChunkPos& c, int64_t hv, bool strict) const {
    const int64_t L = c.e - c.s;
    std::vector<Real> X(static_cast<size_t>(L * L), Real(0));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < (strict ? i : i + 1); ++j) X[i * L + j] = ld(t, o4(t, c.b, c.s + i, hv, j));
    return X;
  }
  void recompute(const ChunkPos& c, int64_t hv, const std::vector<Real>& A) const {
    const int64_t L = c.e - c.s;
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t d = 0; d < sh.V; ++d) {
        Real acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += A[i * L + j] * beta(c, hv, j) * ld(p.v, o4(p.v, c.b, c.s + j, hv, d));
        st(p.u, o4(p.u, c.b, c.s + i, hv, d), acc);
      }
      for (int64_t d = 0; d < sh.K; ++d) {
        Real acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += A[i * L + j] * beta(c, hv, j) * std::exp(gam(c, hv, j)) * kd(c, hv, j, d);
        st(p.w, o4(p.w, c.b, c.s + i, hv, d), acc);
      }
    }
  }

  void run_kkt() const {
    for_each_chunk([&](const ChunkPos& c, const GdnChunks&) {
      for (int64_t hv = 0; hv < sh.HV; ++hv) store_chunk_mat(p.Akk, c, hv, kkt(c, hv));
    });
  }
  void run_solve() const {
    for_each_chunk([&](const ChunkPos& c, const GdnChunks&) {
      for (int64_t hv = 0; hv < sh.HV; ++hv)
        store_chunk_mat(p.A, c, hv, inverse(load_chunk_lower(p.Akk, c, hv, true), c.e - c.s));
    });
  }
  void run_recompute() const {
    for_each_chunk([&](const ChunkPos& c, const GdnChunks&) {
      for (int64_t hv = 0; hv < sh.HV; ++hv) recompute(c, hv, load_chunk_lower(p.A, c, hv, false));
    });
  }
  void run_prepare() const {
    for_each_chunk([&](const ChunkPos& c, const GdnChunks&) {
      for (int64_t hv = 0; hv < sh.HV; ++hv) {
        const std::vector<Real> A = inverse(kkt(c, hv), c.e - c.s);
        store_chunk_mat(p.A, c, hv, A);
        recompute(c, hv, A);
      }
    });
  }

  void run_fwd_h() const {
    std::vector<int64_t> offsets;
    GdnChunks m = p.chunks;
    if (m.varlen()) {
      offsets.resize(static_cast<size_t>(m.N + 1));
      fill_chunk_offsets(m, offsets.data());
      m.offsets = offsets.data();
    }
    const int64_t K = sh.K, V = sh.V;
    std::vector<Real> S(static_cast<size_t>(K * V)), Vn;
    for (int64_t n = 0; n < sh.N; ++n) {
      const SeqPos sq = locate_sequence(m, n);
      for (int64_t hv = 0; hv < sh.HV; ++hv) {
        const int64_t h = hv / sh.G;
        for (int64_t a = 0; a < K; ++a)
          for (int64_t b = 0; b < V; ++b)
            S[a * V + b] = p.h0.present()
                               ? ld(p.h0, n * p.h0.st[0] + hv * p.h0.st[1] + a * p.h0.st[2] + b * p.h0.st[3])
                               : Real(0);
        int64_t cidx = sq.chunk0;
        for (int64_t s = sq.bos; s < sq.eos; s += sh.BT, ++cidx) {
          const int64_t e = std::min(s + sh.BT, sq.eos), L = e - s;
          if (p.h.present()) {
            const int64_t hb = h_base(p.h, m, sq.b, cidx) + hv * p.h.st[2];
            for (int64_t a = 0; a < K; ++a)
              for (int64_t b = 0; b < V; ++b) st(p.h, hb + a * p.h.st[3] + b * p.h.st[4], S[a * V + b]);
          }
          Vn.assign(static_cast<size_t>(L * V), Real(0));
          for (int64_t i = 0; i < L; ++i)
            for (int64_t b = 0; b < V; ++b) {
              Real acc = ld(p.u, o4(p.u, sq.b, s + i, hv, b));
              for (int64_t a = 0; a < K; ++a) acc -= ld(p.w, o4(p.w, sq.b, s + i, hv, a)) * S[a * V + b];
              Vn[i * V + b] = acc;
              if (p.v_new.present()) st(p.v_new, o4(p.v_new, sq.b, s + i, hv, b), acc);
            }
          const auto gm = [&](int64_t i) {
            return p.g.present() ? ld(p.g, o3(p.g, sq.b, s + i, hv)) : Real(0);
          };
          const Real glast = gm(L - 1);
          for (int64_t a = 0; a < K; ++a)
            for (int64_t b = 0; b < V; ++b) {
              Real acc = std::exp(glast) * S[a * V + b];
              for (int64_t i = 0; i < L; ++i)
                acc += ld(p.k, o4(p.k, sq.b, s + i, h, a)) * std::exp(glast - gm(i)) * Vn[i * V + b];
              S[a * V + b] = acc;
            }
        }
        if (p.ht.present())
          for (int64_t a = 0; a < K; ++a)
            for (int64_t b = 0; b < V; ++b)
              st(p.ht, n * p.ht.st[0] + hv * p.ht.st[1] + a * p.ht.st[2] + b * p.ht.st[3], S[a * V + b]);
      }
    }
  }

  void run_fwd_o() const {
    for_each_chunk([&](const ChunkPos& c, const GdnChunks& m) {
      const int64_t L = c.e - c.s;
      for (int64_t hv = 0; hv < sh.HV; ++hv) {
        const int64_t h = hv / sh.G;
        const int64_t hb = h_base(p.h, m, c.b, c.idx) + hv * p.h.st[2];
        auto q = [&](int64_t i, int64_t d) { return ld(p.q, o4(p.q, c.b, c.s + i, h, d)); };
        for (int64_t i = 0; i < L; ++i) {
          std::vector<Real> P(static_cast<size_t>(i + 1));
          for (int64_t j = 0; j <= i; ++j) {
            Real dot = 0;
            for (int64_t d = 0; d < sh.K; ++d) dot += q(i, d) * kd(c, hv, j, d);
            P[j] = dot * std::exp(gam(c, hv, i) - gam(c, hv, j));
          }
          const Real ei = std::exp(gam(c, hv, i));
          for (int64_t b = 0; b < sh.V; ++b) {
            Real inter = 0;
            for (int64_t a = 0; a < sh.K; ++a) inter += q(i, a) * ld(p.h, hb + a * p.h.st[3] + b * p.h.st[4]);
            Real intra = 0;
            for (int64_t j = 0; j <= i; ++j) intra += P[j] * ld(p.v, o4(p.v, c.b, c.s + j, hv, b));
            st(p.o, o4(p.o, c.b, c.s + i, hv, b), Real(sh.scale) * (ei * inter + intra));
          }
        }
      }
    });
  }
};

}  // namespace

template <class Real>
void fwd_reference(FwdOp op, const GdnFwdParams& p) {
  const Ref<Real> r{p};
  switch (op) {
    case FwdOp::kKkt: r.run_kkt(); break;
    case FwdOp::kSolveTril: r.run_solve(); break;
    case FwdOp::kRecomputeWU: r.run_recompute(); break;
    case FwdOp::kPrepareWY: r.run_prepare(); break;
    case FwdOp::kFwdH: r.run_fwd_h(); break;
    case FwdOp::kFwdO: r.run_fwd_o(); break;
    default: break;
  }
}

template void fwd_reference<double>(FwdOp, const GdnFwdParams&);
template void fwd_reference<float>(FwdOp, const GdnFwdParams&);

}  // namespace strata::linear_attn::gdn
