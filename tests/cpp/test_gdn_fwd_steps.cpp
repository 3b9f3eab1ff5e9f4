// (Session 13) chunk_gated_delta_rule's fused forward without grad (gdn_cuda_fused_fwd: what Python's forward runs
// when nothing needs the saved residuals) at the benchmark shapes, whole and per step: the automatic form against
// the unfolded one (kWgmmaSplit: l2norm launches, γ, prep_wgmma, the wgmma pass), cuda.sm90.fused_norm
// (GdnFusedForm::kNorm: the l2norm of q, k folded into prep and the pass, gdn::GdnFwdParams::qk_norm) and (session 14)
// cuda.sm90.fused_norm_r (kNormR: kNorm with 1 / |q| from an rstd-only launch). Prints "[gdn_fwd s15] ..."; fails
// only if a launch fails. (Session 15) also the host time a call takes to queue its launches with kAuto resolved on
// every call (the plan's run before session 15) and with the form passed in resolved (the plan's run now).
// GdnFwdAutoForm (host): which form the automatic forward takes (gdn_cuda_fused_fwd_auto_form), and the host cost of
// that rule (paid once per plan since session 15).
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"
#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"

namespace strata::linear_attn {
namespace {

using gdn_test::StepTimes;
using gdn_test::time_median_ms;
using gdn_test::time_steps;
using test::Dev;
using test::have_gpu;

// The benchmark problem's params (bf16 H = 16 HV = 32 K = V = 128, l2norm, final state out) on the given buffers.
GdnParams bench_params(int64_t B, int64_t T, void* q, void* k, void* v, void* g, void* beta, void* o, void* ht) {
  const int64_t H = 16, HV = 32, K = 128, V = 128;
  const int32_t bf = STRATA_DTYPE_BF16;
  auto tt = [&](void* x, int32_t dt, int64_t heads, int64_t D) { return gdn_test::op_tok(x, dt, T, heads, D); };
  GdnParams p;
  p.q = tt(q, bf, H, K), p.k = tt(k, bf, H, K), p.v = tt(v, bf, HV, V), p.g = tt(g, bf, HV, 0);
  p.beta = tt(beta, bf, HV, 0), p.o = tt(o, bf, HV, V);
  p.ht.data = ht, p.ht.dtype = STRATA_DTYPE_F32;
  p.ht.st[0] = HV * K * V, p.ht.st[1] = K * V, p.ht.st[2] = V, p.ht.st[3] = 1;
  p.B = B, p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V, p.N = B;
  p.scale = 0.0884f;
  p.l2norm = true;
  return p;
}

// The automatic forward's form (host only; the rule reads shapes and dtypes): kNorm where the wgmma pass runs 128
// columns (B = 4 T = 8192 on 132 or 200 SMs: 128 sequence-heads), kNormR where it runs 32 (B = 1 T = 32768), each as
// kNormCluster (session 17) where a pair of CTAs of one q/k head applies (G = 2 here; where none does, e.g. one CTA a
// q/k head, ClusterSizeRule below), the unfolded path (kAutoUnfolded) where it runs 64 (B = 4 on 264 SMs), without l2norm,
// for f16 tokens (no wgmma pass) and with the saved residuals (the fused forward does not store them). Prints the
// rule's host cost per call.
TEST(GdnFwdAutoForm, NormFoldByThePassWidth) {
  char buf[64];
  void* const x = buf;  // stand-in address: the rule never reads memory
  const GdnParams b4 = bench_params(4, 8192, x, x, x, x, x, x, x), b1 = bench_params(1, 32768, x, x, x, x, x, x, x);
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(b4, 132), GdnFusedForm::kNormCluster);
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(b1, 132), GdnFusedForm::kNormCluster);
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(b4, 528), GdnFusedForm::kNormCluster);  // 32 columns: 512 blocks fit 528 SMs
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(b4, 200), GdnFusedForm::kNormCluster);  // 64 columns: 256 blocks, 2 waves
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(b4, 264), GdnFusedForm::kAutoUnfolded);  // 64 columns: 256 blocks fit 264 SMs
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(bench_params(8, 8192, x, x, x, x, x, x, x), 132), GdnFusedForm::kNormCluster);
  GdnParams plain = b4;
  plain.l2norm = false;
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(plain, 132), GdnFusedForm::kAutoUnfolded);
  GdnParams half = b4;
  for (GdnTensor* t : {&half.q, &half.k, &half.v, &half.beta, &half.o}) t->dtype = STRATA_DTYPE_F16;
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(half, 132), GdnFusedForm::kAutoUnfolded);
  GdnParams saving = b4;
  saving.saved.data = x, saving.saved.dtype = STRATA_DTYPE_U8;
  EXPECT_EQ(gdn_cuda_fused_fwd_auto_form(saving, 132), GdnFusedForm::kAutoUnfolded);
  // What every run of cuda.sm90.fused paid on the host before session 15 (now once per plan).
  constexpr int kCalls = 2000;
  int norm = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) norm += gdn_cuda_fused_fwd_auto_form(i % 2 ? b1 : b4, 132) != GdnFusedForm::kAutoUnfolded;
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCalls;
  EXPECT_EQ(norm, kCalls);
  std::printf("[gdn_fwd s15] host cost of the automatic form's rule (gdn_cuda_fused_fwd_auto_form, B=4 / B=1 bench "
              "shapes): %.2f us a call (paid once per plan since session 15)\n", us);
}

// (Session 16, host) The clustered pass's size rule (gdn::fwd_cuda_state_o_wgmma_cluster: since session 17 pairs only,
// where 2 divides the CTAs of a q/k head, G x V / width, and that form is compiled) and the form's applicability at the
// bench shapes: cuda.sm90.fused_norm_cl applies at B = 4 (128 columns: kNorm's pass by 2) and B = 1 (32 columns:
// kNormR's pass by 2) on 132 SMs (the count this host reports without a device, too).
TEST(GdnFwdAutoForm, ClusterSizeRule) {
  char buf[64];
  void* const x = buf;  // stand-in address: the rules never read memory
  EXPECT_EQ(gdn_cuda_fused_fwd_reject(bench_params(4, 8192, x, x, x, x, x, x, x), GdnFusedForm::kNormCluster), "");
  EXPECT_EQ(gdn_cuda_fused_fwd_reject(bench_params(1, 32768, x, x, x, x, x, x, x), GdnFusedForm::kNormCluster), "");
  GdnParams plain = bench_params(4, 8192, x, x, x, x, x, x, x);
  plain.l2norm = false;
  EXPECT_NE(gdn_cuda_fused_fwd_reject(plain, GdnFusedForm::kNormCluster), "");
  gdn::GdnFwdParams p;
  p.shape.H = 16, p.shape.HV = 32, p.shape.G = 2, p.shape.K = 128, p.shape.V = 128, p.shape.BT = 64;
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 32), 2);   // plain: 8 CTAs a q/k head, in pairs
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 64), 2);   // plain 64 columns: by 2 only
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 128), 2);  // 2 CTAs a q/k head
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 48), 0);   // no such width
  p.qk_norm = true;                                           // kNorm: r_q formed, 128 columns only
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 128), 2);
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 32), 0);
  p.rq.data = x, p.rq.dtype = STRATA_DTYPE_F32;  // kNormR: r_q read, 32 columns only
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 32), 2);
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(p, 128), 0);
  gdn::GdnFwdParams q = p;
  q.shape.V = 96;  // 6 CTAs a q/k head at 32 columns: pairs
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 32), 2);
  q = p;
  q.shape.HV = 16, q.shape.G = 1, q.shape.V = 32;  // one CTA a q/k head
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 32), 0);
  q = p;
  q.h.data = x, q.h.dtype = STRATA_DTYPE_BF16;  // h with the folded l2norm: no such pass (reject), no cluster
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 32), 0);
  q.qk_norm = false, q.rq = gdn::GdnTensor{};  // (session 18) the pass writing h: pairs at 32 and 128 columns
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 32), 2);
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 64), 0);
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 128), 2);
  q.shape.HV = 16, q.shape.G = 1;  // 128 columns: one CTA a q/k head
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 128), 0);
  EXPECT_EQ(gdn::fwd_cuda_state_o_wgmma_cluster(q, 32), 2);
}

// (Session 18, host) The saved forward's pair rule (gdn_cuda_fwd_pass_cluster: GdnSavedForward::kFusedPassPair's
// cluster size) at the bench shapes: pairs at B = 4 T = 8192 (128 columns on 132 SMs) and B = 1 T = 32768 (32
// columns); none where the pass runs 64 columns (B = 4 on 264 SMs: 256 blocks) or a q/k head has one CTA (G = 1 at 128
// columns: B = 8 T = 4096 HV = 16 on 132 SMs).
TEST(GdnFwdAutoForm, SavedForwardPairRule) {
  char buf[64];
  void* const x = buf;  // stand-in address: the rule never reads memory
  auto saving = [&](int64_t B, int64_t T) {
    GdnParams p = bench_params(B, T, x, x, x, x, x, x, x);
    p.saved.data = x, p.saved.dtype = STRATA_DTYPE_U8;
    return p;
  };
  EXPECT_EQ(gdn_cuda_fwd_pass_cluster(saving(4, 8192), 132), 2);
  EXPECT_EQ(gdn_cuda_fwd_pass_cluster(saving(1, 32768), 132), 2);
  EXPECT_EQ(gdn_cuda_fwd_pass_cluster(saving(4, 8192), 264), 0);
  GdnParams g1 = saving(8, 4096);
  g1.HV = 16;  // G = 1
  EXPECT_EQ(gdn_cuda_fwd_pass_cluster(g1, 132), 0);
  EXPECT_EQ(gdn_cuda_fwd_pass_cluster(g1, 528), 2);  // 32 columns: 4 CTAs a q/k head
}

// The benchmark problem's tensors on the device (T = 32768 / B; inputs by cudaMemset: q, k, v, β ≈ 0.0115 bf16,
// g ≈ −0.0115 bf16) and bench_params on them.
struct BenchTensors {
  static constexpr int64_t H = 16, HV = 32, K = 128, V = 128;
  int64_t rows;
  Dev q, k, v, g, beta, o, ht;
  GdnParams p;
  explicit BenchTensors(int64_t B)
      : rows(32768), q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * V * 2), g(rows * HV * 2),
        beta(rows * HV * 2), o(rows * HV * V * 2), ht(B * HV * K * V * 4) {
    for (Dev* x : {&q, &k, &v, &beta}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0xbc, g.bytes), cudaSuccess);
    p = bench_params(B, 32768 / B, q.p, k.p, v.p, g.p, beta.p, o.p, ht.p);
  }
};

// "<what>, fastest of 5 per step: <step> <ms> ms, ... sum <ms> ms" (time_steps' result; 5 calls).
void print_steps(const std::string& what, const StepTimes& st) {
  std::string line = what + ", fastest of 5 per step:";
  double sum = 0;
  for (size_t i = 0; i < st.ms.size() && i < st.names.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s %.3f ms,", st.names[i].c_str(), st.ms[i]);
    line += buf;
    sum += st.ms[i];
  }
  std::printf("%s sum %.3f ms\n", line.c_str(), sum);
  EXPECT_GT(sum, 0.0);
}

// bf16 B = 4 T = 8192, B = 2 T = 16384 and B = 1 T = 32768, H = 16, HV = 32, K = V = 128, l2norm in the kernel,
// final state out (gdn_peers' forward); inputs by cudaMemset (q, k, v, β ≈ 0.0115 bf16, g ≈ −0.0115 bf16).
TEST(GdnFwdSteps, FusedForwardTimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{2}, int64_t{1}}) {  // the pass at 128 / 64 / 32 columns on 132 SMs
    const int64_t T = 32768 / B;
    BenchTensors in(B);
    Dev &o = in.o, &ht = in.ht;
    const GdnParams& p = in.p;
    ASSERT_EQ(gdn_cuda_fused_fwd_reject(p, GdnFusedForm::kNorm), "");
    ASSERT_EQ(gdn_cuda_fused_fwd_reject(p, GdnFusedForm::kNormR), "");
    Dev ws(gdn_cuda_fused_fwd_workspace(p));
    auto call = [&](GdnFusedForm form) {
      return std::function<void()>([&, form] {
        EXPECT_EQ(gdn_cuda_fused_fwd(p, form, ws.p, nullptr), STRATA_SUCCESS);
      });
    };
    const struct {
      GdnFusedForm form;
      const char* name;
    } forms[] = {{GdnFusedForm::kAuto, "automatic"},
                 {GdnFusedForm::kWgmmaSplit, "unfolded"},
                 {GdnFusedForm::kNorm, "norm-folded"},
                 {GdnFusedForm::kNormR, "rq-launch"},
                 {GdnFusedForm::kNormCluster, "cluster"}};  // (session 16; where a cluster applies)
    const bool cl = gdn_cuda_fused_fwd_reject(p, GdnFusedForm::kNormCluster).empty();
    std::vector<std::function<void()>> calls;
    for (const auto& f : forms)
      if (cl || f.form != GdnFusedForm::kNormCluster) calls.push_back(call(f.form));
    const std::vector<double> whole = time_median_ms(calls, 9);
    int dev = 0, sms = 0;
    EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
    EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
    const GdnFusedForm chosen = gdn_cuda_fused_fwd_auto_form(p, sms);
    std::printf("[gdn_fwd s15] fused forward bf16 B=%lld T=%lld H=16 HV=32 K=V=128 l2norm, median of 9 interleaved: "
                "automatic (%s) %.3f ms, unfolded %.3f ms, norm-folded %.3f ms, rq-launch %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T),
                chosen == GdnFusedForm::kNorm          ? "norm-folded"
                : chosen == GdnFusedForm::kNormR       ? "rq-launch"
                : chosen == GdnFusedForm::kNormCluster ? "cluster"
                                                       : "unfolded",
                whole[0], whole[1], whole[2], whole[3]);
    if (cl)
      std::printf("[gdn_fwd s16] fused forward B=%lld T=%lld: clustered pass (cuda.sm90.fused_norm_cl) %.3f ms against "
                  "automatic %.3f ms (same run, median of 9 interleaved)\n",
                  static_cast<long long>(B), static_cast<long long>(T), whole[4], whole[0]);
    for (const auto& f : forms) {
      const GdnFusedForm form = f.form;
      if (!cl && form == GdnFusedForm::kNormCluster) continue;
      const StepTimes st = time_steps(
          [&](const GdnStepProbe* probe) { EXPECT_EQ(gdn_cuda_fused_fwd(p, form, ws.p, nullptr, probe), STRATA_SUCCESS); },
          5);
      print_steps("[gdn_fwd s15] " + std::string(f.name) + " B=" + std::to_string(B), st);
    }
    // Host time to queue one call (mean over 50 calls, the queue drained before and after; the launches' own host
    // cost included): kAuto resolved on every call (what the plan ran before session 15) against the form passed in
    // resolved (what it runs now).
    double host_us[2] = {};
    for (int rep = 0; rep < 2; ++rep)  // the second round counts (the first warms the host caches)
      for (int which = 0; which < 2; ++which) {
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const GdnFusedForm form = which == 0 ? GdnFusedForm::kAuto : chosen;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 50; ++i) EXPECT_EQ(gdn_cuda_fused_fwd(p, form, ws.p, nullptr), STRATA_SUCCESS);
        host_us[which] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50;
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      }
    std::printf("[gdn_fwd s15] host time to queue one call B=%lld: kAuto resolved per call %.1f us, resolved form "
                "passed in %.1f us\n", static_cast<long long>(B), host_us[0], host_us[1]);
    // The resolved form gives kAuto's bits (o and the final state; o poisoned before each call).
    std::vector<std::vector<uint8_t>> bits(2);
    for (int which = 0; which < 2; ++which) {
      EXPECT_EQ(cudaMemset(o.p, 0xff, o.bytes), cudaSuccess);
      EXPECT_EQ(gdn_cuda_fused_fwd(p, which == 0 ? GdnFusedForm::kAuto : chosen, ws.p, nullptr), STRATA_SUCCESS);
      bits[which] = o.bits();
      const std::vector<uint8_t> h = ht.bits();
      bits[which].insert(bits[which].end(), h.begin(), h.end());
    }
    EXPECT_TRUE(bits[0] == bits[1]) << "B=" << B;
    std::printf("[gdn_fwd s15] B=%lld: o, final state of kAuto resolved per call and of the resolved form: %s\n",
                static_cast<long long>(B), bits[0] == bits[1] ? "same bits" : "DIFFERENT BITS");
    if (cl) {  // (session 16) the clustered form gives its folded form's bits (kNormR at 32 columns, else kNorm)
      const GdnFusedForm plain = B == 1 ? GdnFusedForm::kNormR : GdnFusedForm::kNorm;  // 32 columns on 132 SMs: B = 1
      for (int which = 0; which < 2; ++which) {
        EXPECT_EQ(cudaMemset(o.p, 0xff, o.bytes), cudaSuccess);
        EXPECT_EQ(gdn_cuda_fused_fwd(p, which == 0 ? plain : GdnFusedForm::kNormCluster, ws.p, nullptr),
                  STRATA_SUCCESS);
        bits[which] = o.bits();
        const std::vector<uint8_t> h = ht.bits();
        bits[which].insert(bits[which].end(), h.begin(), h.end());
      }
      if (sms == 132) EXPECT_TRUE(bits[0] == bits[1]) << "B=" << B;
      std::printf("[gdn_fwd s16] B=%lld: o, final state of the clustered form against %s: %s\n",
                  static_cast<long long>(B), B == 1 ? "kNormR" : "kNorm",
                  bits[0] == bits[1] ? "same bits" : "DIFFERENT BITS");
    }
    std::fflush(stdout);
  }
}

// (Session 18) The training forward (gdn_cuda_fwd filling the saved residuals, with the fused pass writing h) at the
// bench shapes: the pass's CTAs in pairs (GdnSavedForward::kFusedPassPair) against unpaired (kFusedPass), beside the
// forward without grad (kAuto: nothing saved), median of 9 interleaved; per step (fastest of 5: l2norm launches,
// cumsum, prep = prepare_wy_repr_fwd writing w, u, A, the saved buffer's gaps, the pass); and the paired form's saved
// buffer, o and final state against the unpaired form's bits. Prints "[gdn_fwdh s18] ..."; fails only if a call fails
// or the bits differ.
TEST(GdnFwdSteps, SavedForwardPairTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int dev = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {  // the pass at 128 / 32 columns on 132 SMs
    const int64_t T = 32768 / B;
    BenchTensors in(B);
    Dev &o = in.o, &ht = in.ht;
    const GdnParams& p = in.p;
    Dev saved(gdn_cuda_saved_bytes(p));
    GdnParams ps = p;
    ps.saved.data = saved.p, ps.saved.dtype = STRATA_DTYPE_U8;
    Dev ws(gdn_cuda_fused_fwd_workspace(p)), ws_s(gdn_cuda_fwd_workspace(ps));
    const int cluster = gdn_cuda_fwd_pass_cluster(ps, sms);
    const std::vector<std::function<void()>> calls = {
        [&] { EXPECT_EQ(gdn_cuda_fused_fwd(p, GdnFusedForm::kAuto, ws.p, nullptr), STRATA_SUCCESS); },
        [&] { EXPECT_EQ(gdn_cuda_fwd(ps, ws_s.p, nullptr, GdnSavedForward::kFusedPass), STRATA_SUCCESS); },
        [&] { EXPECT_EQ(gdn_cuda_fwd(ps, ws_s.p, nullptr, GdnSavedForward::kFusedPassPair), STRATA_SUCCESS); }};
    const std::vector<double> ms = time_median_ms(calls, 9);
    std::printf("[gdn_fwdh s18] saved forward bf16 B=%lld T=%lld H=16 HV=32 K=V=128 l2norm, median of 9 interleaved: "
                "unpaired pass %.3f ms, paired pass (cluster %d) %.3f ms; forward without grad %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T), ms[1], cluster, ms[2], ms[0]);
    for (const GdnSavedForward form : {GdnSavedForward::kFusedPass, GdnSavedForward::kFusedPassPair}) {
      const StepTimes st = time_steps(
          [&](const GdnStepProbe* probe) { EXPECT_EQ(gdn_cuda_fwd(ps, ws_s.p, nullptr, form, probe), STRATA_SUCCESS); },
          5);
      print_steps(std::string("[gdn_fwdh s18] saved forward ") +
                      (form == GdnSavedForward::kFusedPass ? "unpaired" : "paired") + " B=" + std::to_string(B),
                  st);
    }
    // The paired form's saved buffer, o and final state against the unpaired form's (saved, o poisoned before each).
    std::vector<std::vector<uint8_t>> bits(2);
    for (int which = 0; which < 2; ++which) {
      saved.poison(), o.poison();
      EXPECT_EQ(gdn_cuda_fwd(ps, ws_s.p, nullptr, which ? GdnSavedForward::kFusedPassPair : GdnSavedForward::kFusedPass),
                STRATA_SUCCESS);
      bits[which] = saved.bits();
      for (const Dev* x : {&o, &ht}) {
        const std::vector<uint8_t> b = x->bits();
        bits[which].insert(bits[which].end(), b.begin(), b.end());
      }
    }
    EXPECT_TRUE(bits[0] == bits[1]) << "B=" << B;
    std::printf("[gdn_fwdh s18] B=%lld: saved buffer (%.1f MiB), o, final state of the paired form against the unpaired: "
                "%s\n", static_cast<long long>(B), saved.bytes / 1048576.0, bits[0] == bits[1] ? "same bits" : "DIFFERENT BITS");
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata::linear_attn

#endif  // STRATA_WITH_CUDA
