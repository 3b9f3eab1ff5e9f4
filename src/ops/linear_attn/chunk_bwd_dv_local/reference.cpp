// float64 reference of chunk_bwd_dv_local: plain loops straight from the definition (chunk_bwd_dv_local.h).
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/gdn_bwd_common/reference_util.h"

namespace strata::linear_attn {
using namespace gdn_bwd;

namespace {
// Acc = double: the reference; Acc = float: the same loops in f32 (the "naive" computation of the acceptance
// rule, ARCHITECTURE.md §6).
template <class Acc>
void run(const DvLocalParams& p) {
  const Dims& d = p.d;
  for (const Chunk& c : host_chunks(d))
    for (int64_t hv = 0; hv < d.HV; ++hv) {
      const int64_t h = hv / d.G, L = c.t1 - c.t0;
      const std::vector<Acc> gam = chunk_gamma<Acc>(p.g, c.b, c.t0, c.t1, hv);
      std::vector<Acc> qk(static_cast<size_t>(L * L), Acc(0));  // qk[i][j] = q_i . k_j
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t x = 0; x < d.K; ++x)
            qk[i * L + j] += ldA<Acc>(p.q, p.q.off(c.b, c.t0 + i, h) + x) * ldA<Acc>(p.k, p.k.off(c.b, c.t0 + j, h) + x);
      for (int64_t j = 0; j < L; ++j)
        for (int64_t e = 0; e < d.V; ++e) {
          Acc acc = 0.0;
          for (int64_t i = j; i < L; ++i)
            acc += qk[i * L + j] * std::exp(gam[i] - gam[j]) * ldA<Acc>(p.dout, p.dout.off(c.b, c.t0 + i, hv) + e);
          st(p.dv, p.dv.off(c.b, c.t0 + j, hv) + e, p.scale * acc);
        }
    }
}

}  // namespace

void chunk_bwd_dv_local_reference(const DvLocalParams& p) { run<double>(p); }
void chunk_bwd_dv_local_reference_naive(const DvLocalParams& p) { run<float>(p); }

}  // namespace strata::linear_attn
