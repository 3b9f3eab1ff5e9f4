// float64 reference of chunk_bwd_dqkwg: plain loops straight from the definition (chunk_bwd_dqkwg.h). dq and
// dk are summed over the value heads of a group in float64 and rounded once.
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/reference_util.h"

namespace strata::linear_attn {
using namespace gdn_bwd;

namespace {
// Acc = double: the reference; Acc = float: the same loops in f32 (the "naive" computation of the acceptance
// rule, ARCHITECTURE.md §6).
template <class Acc>
void run(const DqkwgParams& p) {
  const Dims& d = p.d;
  const int64_t K = d.K, V = d.V;
  for (const Chunk& c : host_chunks(d)) {
    const int64_t L = c.t1 - c.t0;
    for (int64_t h = 0; h < d.H; ++h) {
      std::vector<Acc> dq_sum(static_cast<size_t>(L * K), 0.0), dk_sum(static_cast<size_t>(L * K), 0.0);
      auto Q = [&](int64_t i, int64_t x) { return ldA<Acc>(p.q, p.q.off(c.b, c.t0 + i, h) + x); };
      auto Kx = [&](int64_t i, int64_t x) { return ldA<Acc>(p.k, p.k.off(c.b, c.t0 + i, h) + x); };
      for (int64_t hv = h * d.G; hv < (h + 1) * d.G; ++hv) {
        const std::vector<Acc> gam = chunk_gamma<Acc>(p.g, c.b, c.t0, c.t1, hv);
        const Acc gl = gam[L - 1];
        auto S = [&](int64_t x, int64_t e) { return ldA<Acc>(p.h, p.h.off(c.b, c.hc, hv, x) + e); };
        auto dS = [&](int64_t x, int64_t e) { return ldA<Acc>(p.dh, p.dh.off(c.b, c.hc, hv, x) + e); };
        auto Vn = [&](int64_t i, int64_t e) { return ldA<Acc>(p.v, p.v.off(c.b, c.t0 + i, hv) + e); };
        auto dO = [&](int64_t i, int64_t e) { return ldA<Acc>(p.dout, p.dout.off(c.b, c.t0 + i, hv) + e); };
        // Ds = scale Lower((dO Vn^T) ⊙ Γ)
        std::vector<Acc> Ds(static_cast<size_t>(L * L), 0.0);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            Acc a = 0.0;
            for (int64_t e = 0; e < V; ++e) a += dO(i, e) * Vn(j, e);
            Ds[i * L + j] = p.scale * a * std::exp(gam[i] - gam[j]);
          }
        std::vector<Acc> dg(static_cast<size_t>(L), 0.0);
        Acc last_extra = 0.0;
        for (int64_t i = 0; i < L; ++i)
          for (int64_t x = 0; x < K; ++x) {
            Acc dos = 0.0, vds = 0.0, dvs = 0.0;
            for (int64_t e = 0; e < V; ++e) {
              dos += dO(i, e) * S(x, e);
              vds += Vn(i, e) * dS(x, e);
              if (p.dv.present()) dvs += ldA<Acc>(p.dv, p.dv.off(c.b, c.t0 + i, hv) + e) * S(x, e);
            }
            Acc dq = p.scale * std::exp(gam[i]) * dos, dk_int = std::exp(gl - gam[i]) * vds, dk = dk_int;
            for (int64_t j = 0; j < L; ++j) {
              dq += Ds[i * L + j] * Kx(j, x);
              dk += Ds[j * L + i] * Q(j, x);
            }
            dq_sum[i * K + x] += dq;
            dk_sum[i * K + x] += dk;
            dg[i] += Q(i, x) * dq - Kx(i, x) * dk;
            last_extra += Kx(i, x) * dk_int;
            if (p.dw.present()) st(p.dw, p.dw.off(c.b, c.t0 + i, hv) + x, -dvs);
          }
        if (p.dg.present()) {
          Acc sds = 0.0;
          for (int64_t x = 0; x < K; ++x)
            for (int64_t e = 0; e < V; ++e) sds += S(x, e) * dS(x, e);
          dg[L - 1] += std::exp(gl) * sds + last_extra;
          for (int64_t i = 0; i < L; ++i) st(p.dg, p.dg.off(c.b, c.t0 + i, hv), dg[i]);
        }
      }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < K; ++x) {
          st(p.dq, p.dq.off(c.b, c.t0 + i, h) + x, dq_sum[i * K + x]);
          st(p.dk, p.dk.off(c.b, c.t0 + i, h) + x, dk_sum[i * K + x]);
        }
    }
  }
}

}  // namespace

void chunk_bwd_dqkwg_reference(const DqkwgParams& p) { run<double>(p); }
void chunk_bwd_dqkwg_reference_naive(const DqkwgParams& p) { run<float>(p); }

}  // namespace strata::linear_attn
