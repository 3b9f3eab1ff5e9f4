// (Session 13) chunk_gated_delta_rule's fused forward without grad (gdn_cuda_fused_fwd: what Python's forward runs
// when nothing needs the saved residuals) at the benchmark shapes, whole and per step: the automatic form (l2norm
// launches, γ, prep_wgmma, the wgmma pass) against cuda.sm90.fused_norm (GdnFusedForm::kNorm: the l2norm of q, k folded
// into prep and the pass, gdn::GdnFwdParams::qk_norm). Prints "[gdn_fwd steps] ..."; fails only if a launch fails.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"
#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"

namespace strata::linear_attn {
namespace {

using gdn_test::StepTimes;
using gdn_test::time_median_ms;
using gdn_test::time_steps;
using test::Dev;
using test::have_gpu;

// bf16 B = 4 T = 8192 and B = 1 T = 32768, H = 16, HV = 32, K = V = 128, l2norm in the kernel, final state out
// (gdn_peers' forward); inputs by cudaMemset (q, k, v, β ≈ 0.0115 bf16, g ≈ −0.0115 bf16).
TEST(GdnFwdSteps, FusedForwardTimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, rows = B * T;
    const int32_t bf = STRATA_DTYPE_BF16;
    Dev q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * V * 2), g(rows * HV * 2), beta(rows * HV * 2),
        o(rows * HV * V * 2), ht(B * HV * K * V * 4);
    for (Dev* x : {&q, &k, &v, &beta}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0xbc, g.bytes), cudaSuccess);
    auto tt = [&](Dev& x, int32_t dt, int64_t heads, int64_t D) { return gdn_test::op_tok(x.p, dt, T, heads, D); };
    GdnParams p;
    p.q = tt(q, bf, H, K), p.k = tt(k, bf, H, K), p.v = tt(v, bf, HV, V), p.g = tt(g, bf, HV, 0);
    p.beta = tt(beta, bf, HV, 0), p.o = tt(o, bf, HV, V);
    p.ht.data = ht.p, p.ht.dtype = STRATA_DTYPE_F32;
    p.ht.st[0] = HV * K * V, p.ht.st[1] = K * V, p.ht.st[2] = V, p.ht.st[3] = 1;
    p.B = B, p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V, p.N = B;
    p.scale = 0.0884f;
    p.l2norm = true;
    ASSERT_EQ(gdn_cuda_fused_fwd_reject(p, GdnFusedForm::kNorm), "");
    Dev ws(gdn_cuda_fused_fwd_workspace(p));
    auto call = [&](GdnFusedForm form) {
      return std::function<void()>([&, form] {
        EXPECT_EQ(gdn_cuda_fused_fwd(p, form, ws.p, nullptr), STRATA_SUCCESS);
      });
    };
    const std::vector<double> whole = time_median_ms({call(GdnFusedForm::kAuto), call(GdnFusedForm::kNorm)}, 9);
    std::printf("[gdn_fwd steps] fused forward bf16 B=%lld T=%lld H=16 HV=32 K=V=128 l2norm, median of 9: automatic "
                "%.3f ms, norm-folded %.3f ms\n", static_cast<long long>(B), static_cast<long long>(T), whole[0],
                whole[1]);
    for (const GdnFusedForm form : {GdnFusedForm::kAuto, GdnFusedForm::kNorm}) {
      const StepTimes st = time_steps(
          [&](const GdnStepProbe* probe) { EXPECT_EQ(gdn_cuda_fused_fwd(p, form, ws.p, nullptr, probe), STRATA_SUCCESS); },
          5);
      std::string line = "[gdn_fwd steps] " + std::string(form == GdnFusedForm::kAuto ? "automatic" : "norm-folded") +
                         " B=" + std::to_string(B) + ", fastest of 5 per step:";
      double sum = 0;
      for (size_t i = 0; i < st.ms.size() && i < st.names.size(); ++i) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " %s %.3f ms,", st.names[i].c_str(), st.ms[i]);
        line += buf;
        sum += st.ms[i];
      }
      char buf[48];
      std::snprintf(buf, sizeof buf, " sum %.3f ms", sum);
      std::printf("%s%s\n", line.c_str(), buf);
      EXPECT_GT(sum, 0.0);
    }
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata::linear_attn

#endif  // STRATA_WITH_CUDA
