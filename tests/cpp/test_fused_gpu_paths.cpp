// The CUDA paths of three memory-bound ops of issue 4 that the conformance driver cannot compare bit for bit:
// rms_norm_gated's register tiles (cuda.sm90.team_regs, the default since session 10; plain loads since session
// 11, the session-10 hinted loads kept for the sweep) and clipped_swiglu's tile_tma with y stored from registers
// (tile flag 4, the default since session 10); fused_cross_entropy's default is timed beside them (its session-10
// thread-count variants and session-11 kernel candidates all lost to it and were removed: README.md):
//   * bits: the register paths against the kernels whose per-element math they share (every output byte equal),
//     on more rows than one wave holds (Ops/Conformance.* checks every implementation against float64);
//   * FusedGpuPaths.CandidatesTiming: each op's default against the candidates at the bench shape, queued
//     (8 calls back to back between CUDA events), 25 rounds with every candidate and a device-to-device copy of
//     the op's bytes taken in turn, medians; floor = the op's bytes at the copy's rate in the same process.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "ops/activation/clipped_swiglu/clipped_swiglu.h"
#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "strata/ops.h"
#include "cuda_test_support.h"
#include "test_support.h"

namespace strata {
namespace {

using test::Dev;
using test::dense_rows;
using test::have_gpu;

void put(const Dev& d, const std::vector<uint8_t>& h) {
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), std::min(d.bytes, h.size()), cudaMemcpyHostToDevice), cudaSuccess);
}

// n bf16 values N(0, sd) as bytes (with every 13th value +-4 sd: the clamps and the large-activation ends).
std::vector<uint8_t> bf16_normal(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<uint8_t> b(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const float v = i % 13 == 5 ? (i % 2 ? 4.f : -4.f) * sd : nd(rng);
    const uint16_t h = f32_to_bf16_bits(v);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

// ---- rms_norm_gated: team_regs gives team_stream's bits (the same team_row per row) ----
TEST(FusedGpuPaths, RmsNormGatedTeamRegsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  const int64_t rows = 60001;  // not a multiple of any tile: the last block's rows past the end
  struct Shape {
    int64_t D, G;
  };
  for (const Shape sh : {Shape{128, 128}, Shape{128, 64}, Shape{256, 256}, Shape{64, 16}}) {
    const int64_t D = sh.D, G = sh.G, ng = D / G;
    Dev x(rows * D * 2), z(rows * D * 2), y(rows * D * 2), rstd(rows * ng * 4), w(D * 4), b(D * 4);
    put(x, bf16_normal(rows * D, 1, 1.f));
    put(z, bf16_normal(rows * D, 2, 2.f));
    std::vector<float> wh(D), bh(D);
    for (int64_t i = 0; i < D; ++i) wh[i] = 0.5f + 0.01f * static_cast<float>(i), bh[i] = 0.02f * static_cast<float>(i % 7) - 0.05f;
    EXPECT_EQ(cudaMemcpy(w.p, wh.data(), D * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(b.p, bh.data(), D * 4, cudaMemcpyHostToDevice), cudaSuccess);
    for (const bool nbg : {true, false}) {
      for (const int32_t act : {norm::kActSilu, norm::kActSigmoid}) {
        norm::RmsNormGatedFwdParams p;
        p.x = x.p, p.z = z.p, p.y = y.p, p.rstd = rstd.p, p.weight = w.p, p.bias = b.p;
        p.x_dtype = STRATA_DTYPE_BF16, p.w_dtype = p.b_dtype = p.rstd_dtype = STRATA_DTYPE_F32;
        p.rows = rows, p.D = D, p.group = G, p.eps = 1e-6f, p.norm_before_gate = nbg, p.act = act;
        p.x_rows = p.z_rows = p.y_rows = dense_rows(rows, D);
        p.rstd_rows = dense_rows(rows, ng);
        y.poison(), rstd.poison();
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_stream(p, nullptr), 0);
        const std::vector<uint8_t> y_ref = y.bits(), r_ref = rstd.bits();
        // Plain loads (the default) for every tile; the session-10 hinted loads for 2 rows per team.
        for (const bool hints : {false, true}) {
          for (const int rpt : {1, 2, 4}) {
            for (const int threads : {64, 128, 256}) {
              if (hints && rpt != 2) continue;
              y.poison(), rstd.poison();
              ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_regs(p, nullptr, norm::RmsNormGatedRegsTile{rpt, threads, hints}), 0);
              EXPECT_EQ(cudaGetLastError(), cudaSuccess);
              EXPECT_TRUE(y.bits() == y_ref) << "y: D " << D << " G " << G << " nbg " << nbg << " act " << act
                                            << " rows/team " << rpt << " threads " << threads << " hints " << hints;
              EXPECT_TRUE(rstd.bits() == r_ref) << "rstd: D " << D << " G " << G << " nbg " << nbg << " rows/team " << rpt
                                               << " threads " << threads << " hints " << hints;
            }
          }
        }
      }
    }
  }
}

// ---- clipped_swiglu: tile_tma with y from registers (flags 4-7, the default since s10run1) gives the bits of y
// through shared memory (flags 0) and of pairwise' kernels ----
TEST(FusedGpuPaths, ClippedSwigluNewPathsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  const int64_t rows = 8001;  // > the ~1700 tile_tma blocks resident at once at I = 2880
  struct Shape {
    int64_t I;
    bool inter;
  };
  for (const Shape sh : {Shape{2880, true}, Shape{2048, false}, Shape{264, true}}) {
    const int64_t I = sh.I;
    Dev x(rows * 2 * I * 2), y(rows * I * 2), pr(rows * 4);
    put(x, bf16_normal(rows * 2 * I, 3, 4.f));
    std::vector<float> ph(rows);
    for (int64_t r = 0; r < rows; ++r) ph[r] = 0.25f + 0.5f * static_cast<float>(r % 5) / 4.f;
    EXPECT_EQ(cudaMemcpy(pr.p, ph.data(), rows * 4, cudaMemcpyHostToDevice), cudaSuccess);
    for (const bool probs : {false, true}) {
      activation::ClippedSwigluFwdParams p;
      p.x = x.p, p.y = y.p, p.x_dtype = STRATA_DTYPE_BF16, p.rows = rows, p.I = I, p.interleaved = sh.inter;
      p.x_rows = dense_rows(rows, 2 * I), p.y_rows = dense_rows(rows, I);
      if (probs) p.probs = pr.p, p.probs_dtype = STRATA_DTYPE_F32, p.probs_rows = dense_rows(rows, 1);
      const std::string what = "I " + std::to_string(I) + (sh.inter ? " interleaved" : " split") + (probs ? " probs" : "");
      y.poison();  // the session-9 tile: y through shared memory and a bulk store
      ASSERT_EQ(activation::clipped_swiglu_fwd_cuda_tma(p, nullptr, activation::ClippedSwigluTmaTile{8192, 128, 0}), 0);
      const std::vector<uint8_t> ref = y.bits();
      for (const int flags : {4, 5, 6, 7}) {
        for (const int64_t xb : {int64_t{8192}, int64_t{24000}}) {
          y.poison();
          ASSERT_EQ(activation::clipped_swiglu_fwd_cuda_tma(p, nullptr, activation::ClippedSwigluTmaTile{xb, 128, flags}), 0);
          EXPECT_TRUE(y.bits() == ref) << what << " tile_tma flags " << flags << " x_bytes " << xb;
        }
      }
      y.poison();
      ASSERT_EQ(activation::clipped_swiglu_fwd_cuda(p, nullptr), 0);
      EXPECT_TRUE(y.bits() == ref) << what << " pairwise";
    }
  }
}

// ---- fused_cross_entropy: the fused forward in place (mean) on device tensors, through a plan (for the timing) ----
struct CeBufs {
  int64_t N, V;
  Dev logits, target, loss, lse, ws;
  strata_tensor_desc dl{}, dt{}, dloss{}, dlse{};
  CeBufs(int64_t n, int64_t v) : N(n), V(v), logits(n * v * 2), target(n * 8), loss(4), lse(n * 4), ws(n * 8 + 64) {
    const strata_device dev = {STRATA_DEVICE_CUDA, 0};
    const int64_t shape[2] = {N, V};
    strata_tensor_desc_init(&dl, STRATA_DTYPE_BF16, 2, shape, nullptr, 0, dev);
    strata_tensor_desc_init(&dt, STRATA_DTYPE_I64, 1, shape, nullptr, 0, dev);
    strata_tensor_desc_init(&dloss, STRATA_DTYPE_F32, 0, shape, nullptr, 0, dev);
    strata_tensor_desc_init(&dlse, STRATA_DTYPE_F32, 1, shape, nullptr, 0, dev);
    std::vector<int64_t> t(N);
    for (int64_t i = 0; i < N; ++i) t[i] = i % 5 == 4 ? -100 : (i * 7919 + 3) % V;  // every 5th row ignored
    EXPECT_EQ(cudaMemcpy(target.p, t.data(), N * 8, cudaMemcpyHostToDevice), cudaSuccess);
  }
};

// A plan of `impl` (forced while planning: the plan keeps its implementation) on b's tensors, run by CePlan::run.
struct CePlan {
  CeBufs& b;
  strata_plan plan = nullptr;
  CePlan(CeBufs& bufs, const char* impl) : b(bufs) {
    test::ForceImpl force(impl);
    EXPECT_EQ(strata_fused_cross_entropy_fwd_plan(&b.dl, &b.dt, &b.dloss, &b.dlse, nullptr, &b.dl,
                                                  STRATA_LOSS_REDUCTION_MEAN, -100, 0.f, 1.f, 0.f, 0.f, 1.f, &plan),
              STRATA_SUCCESS)
        << strata_get_last_error_message();
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    EXPECT_LE(ws, b.ws.bytes);
    EXPECT_EQ(std::string(strata_plan_impl_name(plan)), impl);
  }
  ~CePlan() { strata_plan_destroy(plan); }
  CePlan(const CePlan&) = delete;
  CePlan& operator=(const CePlan&) = delete;
  int run() const {
    void* t[] = {b.logits.p, b.target.p, b.loss.p, b.lse.p, nullptr, b.logits.p};
    return strata_plan_run(plan, t, 6, b.ws.p, b.ws.bytes, nullptr);
  }
};

// ---- timing ----
struct Candidate {
  std::string name;
  std::function<int()> call;
  std::vector<double> ms;
};

// 25 rounds; in each, every candidate (and the copy) runs 8 calls back to back between two events. Prints the
// medians against the floor bytes / (copy rate of this process).
void time_candidates(const char* what, double bytes, std::vector<Candidate>& cands) {
  constexpr int kRounds = 25, kCalls = 8;
  Dev a(static_cast<size_t>(bytes / 2) / 16 * 16), b(a.bytes);
  cands.insert(cands.begin(), Candidate{"copy probe (D2D, the op's bytes)", [&] {
                                          return static_cast<int>(cudaMemcpyAsync(b.p, a.p, a.bytes, cudaMemcpyDeviceToDevice));
                                        }, {}});
  for (Candidate& c : cands)  // warm up (plans, caches, clocks)
    for (int i = 0; i < 3; ++i) ASSERT_EQ(c.call(), 0) << what << " " << c.name;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  for (int r = 0; r < kRounds; ++r) {
    for (Candidate& c : cands) {
      cudaEventRecord(e0);
      for (int i = 0; i < kCalls; ++i) c.call();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0.f;
      cudaEventElapsedTime(&ms, e0, e1);
      c.ms.push_back(ms / kCalls);
    }
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << what;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double copy_ms = median(cands[0].ms) * (bytes / (2.0 * static_cast<double>(a.bytes)));
  const double tbs = bytes / (copy_ms * 1e-3) / 1e12;
  std::printf("[fused_gpu timing] %s: %.1f MB, copy %.3f TB/s, floor %.4f ms (median of %d rounds x %d queued calls)\n", what,
              bytes / 1e6, tbs, copy_ms, kRounds, kCalls);
  for (size_t i = 1; i < cands.size(); ++i) {
    const double m = median(cands[i].ms);
    std::printf("[fused_gpu timing] %s: %-44s %.4f ms  %.3f x floor  (min %.4f)\n", what, cands[i].name.c_str(), m, m / copy_ms,
                *std::min_element(cands[i].ms.begin(), cands[i].ms.end()));
  }
}

TEST(FusedGpuPaths, CandidatesTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  {  // rms_norm_gated forward bf16 [1048576, 128] G = 128 norm_before_gate silu, weight f32
    const int64_t rows = 1048576, D = 128;
    Dev x(rows * D * 2), z(rows * D * 2), y(rows * D * 2), rstd(rows * 4), w(D * 4);
    cudaMemset(x.p, 0x3c, x.bytes), cudaMemset(z.p, 0x3c, z.bytes), cudaMemset(w.p, 0, w.bytes);
    norm::RmsNormGatedFwdParams p;
    p.x = x.p, p.z = z.p, p.y = y.p, p.rstd = rstd.p, p.weight = w.p;
    p.x_dtype = STRATA_DTYPE_BF16, p.w_dtype = p.b_dtype = p.rstd_dtype = STRATA_DTYPE_F32;
    p.rows = rows, p.D = D, p.group = D, p.eps = 1e-6f, p.norm_before_gate = true, p.act = norm::kActSilu;
    p.x_rows = p.z_rows = p.y_rows = dense_rows(rows, D);
    p.rstd_rows = dense_rows(rows, 1);
    std::vector<Candidate> c;
    c.push_back({"team_regs 2 rows/team, 128 threads, plain loads (default)", [&] { return norm::rms_norm_gated_fwd_cuda_regs(p, nullptr); }, {}});
    c.push_back({"team_tma 16 x 128", [&] { return norm::rms_norm_gated_fwd_cuda_tma(p, nullptr); }, {}});
    c.push_back({"team_stream", [&] { return norm::rms_norm_gated_fwd_cuda_stream(p, nullptr); }, {}});
    struct Regs {
      int rpt, threads;
    };
    for (const Regs r : {Regs{2, 64}, Regs{2, 256}, Regs{1, 128}, Regs{4, 128}})
      c.push_back({"team_regs " + std::to_string(r.rpt) + " rows/team, " + std::to_string(r.threads) + " threads",
                   [&p, r] {
                     return norm::rms_norm_gated_fwd_cuda_regs(p, nullptr, norm::RmsNormGatedRegsTile{r.rpt, r.threads});
                   },
                   {}});
    // The session-10 kernel: the same tile with ld.global.L1::no_allocate.L2::256B loads (the default until s11run1).
    c.push_back({"team_regs 2 x 128, session-10 hinted loads",
                 [&] { return norm::rms_norm_gated_fwd_cuda_regs(p, nullptr, norm::RmsNormGatedRegsTile{2, 128, true}); },
                 {}});
    time_candidates("rms_norm_gated fwd bf16 [1048576, 128]", 3.0 * rows * D * 2 + rows * 4.0, c);
  }
  {  // clipped_swiglu forward bf16 [32768, 2 x 2880] interleaved, GPT-OSS constants
    const int64_t rows = 32768, I = 2880;
    Dev x(rows * 2 * I * 2), y(rows * I * 2);
    cudaMemset(x.p, 0x3c, x.bytes);
    activation::ClippedSwigluFwdParams p;
    p.x = x.p, p.y = y.p, p.x_dtype = STRATA_DTYPE_BF16, p.rows = rows, p.I = I;
    p.x_rows = dense_rows(rows, 2 * I), p.y_rows = dense_rows(rows, I);
    std::vector<Candidate> c;
    c.push_back({"tile_tma 8 KiB x 128 flags 4 (default)", [&] { return activation::clipped_swiglu_fwd_cuda_tma(p, nullptr); }, {}});
    struct Tile {
      int64_t x_bytes;
      int threads, flags;
    };
    for (const Tile t : {Tile{8192, 128, 0}, Tile{8192, 96, 4}, Tile{8192, 64, 4}, Tile{8192, 256, 4}})
      c.push_back({"tile_tma " + std::to_string(t.x_bytes / 1024) + " KiB x " + std::to_string(t.threads) + " flags " +
                       std::to_string(t.flags),
                   [&p, t] {
                     return activation::clipped_swiglu_fwd_cuda_tma(
                         p, nullptr, activation::ClippedSwigluTmaTile{t.x_bytes, t.threads, t.flags});
                   },
                   {}});
    c.push_back({"bulk_ring", [&] { return activation::clipped_swiglu_fwd_cuda_ring(p, nullptr); }, {}});
    time_candidates("clipped_swiglu fwd bf16 [32768, 2 x 2880]", 3.0 * rows * I * 2, c);
  }
  {  // fused_cross_entropy, the fused forward with the gradient in place, bf16 [8192, 151936] mean (each call
     // overwrites the logits with their gradient, as fused_peers' in-place calls do; the values do not change the work)
    const int64_t N = 8192, V = 151936;
    CeBufs bufs(N, V);
    cudaMemset(bufs.logits.p, 0x3c, bufs.logits.bytes);
    CePlan plan(bufs, "cuda.sm90.cluster_stored_exp_wide");
    std::vector<Candidate> c;
    c.push_back({"cuda.sm90.cluster_stored_exp_wide (default)", [&] { return plan.run(); }, {}});
    time_candidates("fused_cross_entropy fused in place bf16 [8192, 151936] mean", 2.0 * N * V * 2, c);
  }
}

}  // namespace
}  // namespace strata
#endif  // STRATA_WITH_CUDA
