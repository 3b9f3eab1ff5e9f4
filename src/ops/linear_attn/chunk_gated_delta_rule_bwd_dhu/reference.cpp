// float64 reference of chunk_gated_delta_rule_bwd_dhu: plain loops straight from the definition
// (chunk_gated_delta_rule_bwd_dhu.h); the state gradient dS is kept in float64.
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/gdn_bwd_common/reference_util.h"

namespace strata::linear_attn {
using namespace gdn_bwd;

namespace {
// Acc = double: the reference; Acc = float: the same loops in f32 (the "naive" computation of the acceptance
// rule, ARCHITECTURE.md §6).
template <class Acc>
void run(const DhuParams& p) {
  const Dims& d = p.d;
  const int64_t K = d.K, V = d.V;
  for (const Seq& s : host_sequences(d))
    for (int64_t hv = 0; hv < d.HV; ++hv) {
      const int64_t h = hv / d.G;
      std::vector<Acc> dS(static_cast<size_t>(K * V), 0.0);
      if (p.dht.present())
        for (int64_t x = 0; x < K; ++x)
          for (int64_t e = 0; e < V; ++e) dS[x * V + e] = ldA<Acc>(p.dht, p.dht.off(s.n, hv, x) + e);
      const int64_t nc = (s.eos - s.bos + d.BT - 1) / d.BT;
      for (int64_t c = nc - 1; c >= 0; --c) {
        const int64_t t0 = s.bos + c * d.BT, t1 = std::min<int64_t>(t0 + d.BT, s.eos), L = t1 - t0;
        const std::vector<Acc> gam = chunk_gamma<Acc>(p.g, s.b, t0, t1, hv);
        const Acc gl = gam[L - 1];
        for (int64_t x = 0; x < K; ++x)
          for (int64_t e = 0; e < V; ++e) st(p.dh, p.dh.off(s.b, s.hc0 + c, hv, x) + e, dS[x * V + e]);
        // dVn = dv + diag(exp(γ_last - γ)) K dS
        std::vector<Acc> dvn(static_cast<size_t>(L * V));
        for (int64_t i = 0; i < L; ++i)
          for (int64_t e = 0; e < V; ++e) {
            Acc kd = 0.0;
            for (int64_t x = 0; x < K; ++x) kd += ldA<Acc>(p.k, p.k.off(s.b, t0 + i, h) + x) * dS[x * V + e];
            dvn[i * V + e] = ldA<Acc>(p.dv, p.dv.off(s.b, t0 + i, hv) + e) + std::exp(gl - gam[i]) * kd;
            st(p.dv2, p.dv2.off(s.b, t0 + i, hv) + e, dvn[i * V + e]);
          }
        // dS = exp(γ_last) dS + scale (diag(E) Q)^T dO - W^T dVn
        for (int64_t x = 0; x < K; ++x)
          for (int64_t e = 0; e < V; ++e) {
            Acc acc = std::exp(gl) * dS[x * V + e];
            for (int64_t i = 0; i < L; ++i) {
              acc += p.scale * std::exp(gam[i]) * ldA<Acc>(p.q, p.q.off(s.b, t0 + i, h) + x) *
                     ldA<Acc>(p.dout, p.dout.off(s.b, t0 + i, hv) + e);
              acc -= ldA<Acc>(p.w, p.w.off(s.b, t0 + i, hv) + x) * dvn[i * V + e];
            }
            dS[x * V + e] = acc;
          }
      }
      if (p.dh0.present())
        for (int64_t x = 0; x < K; ++x)
          for (int64_t e = 0; e < V; ++e) st(p.dh0, p.dh0.off(s.n, hv, x) + e, dS[x * V + e]);
    }
}

}  // namespace

void chunk_gated_delta_rule_bwd_dhu_reference(const DhuParams& p) { run<double>(p); }
void chunk_gated_delta_rule_bwd_dhu_reference_naive(const DhuParams& p) { run<float>(p); }

}  // namespace strata::linear_attn
