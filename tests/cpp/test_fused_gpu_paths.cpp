// The CUDA paths of three memory-bound ops of issue 4 that the conformance driver cannot compare bit for bit:
// rms_norm_gated's register tiles (cuda.sm90.team_regs, the default since session 10; plain loads since session
// 11, the session-10 hinted loads kept for the sweep) and clipped_swiglu's tile_tma with y stored from registers
// (tile flag 4, the default since session 10); fused_cross_entropy's default is timed beside them (the session-10
// thread-count variants and the session-11/12/13 kernel candidates that lost to it were removed: README.md):
//   * bits: the register paths against the kernels whose per-element math they share (every output byte equal),
//     on more rows than one wave holds (Ops/Conformance.* checks every implementation against float64);
//   * FusedGpuPaths.CandidatesTiming: each op's default against the candidates at the bench shape, queued
//     (8 calls back to back between CUDA events), 25 rounds with every candidate and a device-to-device copy of
//     the op's bytes taken in turn, medians; floor = the op's bytes at the copy's rate in the same process.
//   * session 12: the kernels that loaded with ld_stream's hints (L1::no_allocate.L2::256B) against plain
//     ld.global.v4 (rms_norm_gated team_stream / team_packed / the streaming backward, clipped_swiglu's streaming
//     kernel on its persistent and flat grids, the row norms' streaming and packed kernels): the same bits
//     (*LoadsBits), and a same-run A/B of each (*Timing).
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
#include "ops/norm/common/row_norm.h"
#include "ops/norm/common/row_norm_cuda_multi.h"
#include "ops/norm/common/row_norm_cuda_tma.h"
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
        // Session 12: team_stream with the hinted loads (persistent and flat grids; plain is the default above);
        // team_packed both ways.
        for (const bool persistent : {true, false}) {
          y.poison(), rstd.poison();
          ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_stream(p, nullptr, persistent, true), 0);
          EXPECT_TRUE(y.bits() == y_ref && rstd.bits() == r_ref)
              << "team_stream hinted loads: D " << D << " G " << G << " nbg " << nbg << " persistent " << persistent;
        }
        y.poison(), rstd.poison();
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_packed(p, nullptr, true), 0);
        const std::vector<uint8_t> yp = y.bits(), rp = rstd.bits();
        y.poison(), rstd.poison();
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_packed(p, nullptr, false), 0);
        EXPECT_TRUE(y.bits() == yp && rstd.bits() == rp) << "team_packed plain loads: D " << D << " G " << G << " nbg " << nbg;
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
      // Session 12: the streaming kernel's loads and grids (split rows run the chunk kernel whatever the tile).
      for (const bool hints : {true, false}) {
        for (const activation::ClippedSwigluStreamTile t :
             {activation::ClippedSwigluStreamTile{hints, true, 4}, activation::ClippedSwigluStreamTile{hints, false, 4},
              activation::ClippedSwigluStreamTile{hints, false, 8}}) {
          y.poison();
          ASSERT_EQ(activation::clipped_swiglu_fwd_cuda_stream(p, nullptr, t), 0);
          EXPECT_TRUE(y.bits() == ref) << what << " stream hints " << t.l2_hint_loads << " persistent " << t.persistent
                                       << " vectors " << t.vectors;
        }
      }
    }
  }
}

// ---- session 12: plain against hinted loads, the same bits ----

// n bf16 values as bytes, an N(0, sd) pattern of 1 << 20 values repeated (large buffers without a long host loop).
std::vector<uint8_t> bf16_normal_tiled(size_t n, uint32_t seed, float sd) {
  const std::vector<uint8_t> pat = bf16_normal(std::min<size_t>(n, size_t{1} << 20), seed, sd);
  std::vector<uint8_t> b(2 * n);
  for (size_t o = 0; o < b.size(); o += pat.size()) std::memcpy(b.data() + o, pat.data(), std::min(pat.size(), b.size() - o));
  return b;
}

// rms_norm_gated's backward on the GDN layout: group_rows' streaming kernel (bwd_stream_rows) both ways.
struct RngBwdBufs {
  int64_t rows, D, G;
  Dev x, z, dy, rstd, w, dx, dz, dw, db;
  std::unique_ptr<Dev> ws;  // the partial rows of dweight / dbias (sized from the params)
  norm::RmsNormGatedBwdParams p;
  RngBwdBufs(int64_t r, int64_t d, int64_t g, int32_t dt)
      : rows(r), D(d), G(g), x(r * d * dtype_size(dt)), z(x.bytes), dy(x.bytes), rstd(r * (d / g) * 4), w(d * 4),
        dx(x.bytes), dz(x.bytes), dw(d * 4), db(d * 4) {
    p.x = x.p, p.z = z.p, p.dy = dy.p, p.rstd = rstd.p, p.weight = w.p, p.dx = dx.p, p.dz = dz.p, p.dweight = dw.p,
    p.dbias = db.p;
    p.x_dtype = dt, p.w_dtype = p.rstd_dtype = p.dw_dtype = p.db_dtype = STRATA_DTYPE_F32, p.b_dtype = STRATA_DTYPE_F32;
    p.rows = r, p.D = d, p.group = g, p.norm_before_gate = true, p.act = norm::kActSilu;
    p.x_rows = p.z_rows = p.dy_rows = p.dx_rows = p.dz_rows = dense_rows(r, d);
    p.rstd_rows = dense_rows(r, d / g);
    const int64_t np = norm::rms_norm_gated_cuda_partials(p);
    ws = std::make_unique<Dev>(static_cast<size_t>(2 * np * d * 4));
    p.partial = static_cast<float*>(ws->p);
    uint32_t seed = 5;
    for (Dev* t : {&x, &z, &dy}) {
      const std::vector<uint8_t> h = bf16_normal_tiled(r * d, seed++, t == &z ? 2.f : 1.f);
      if (dt == STRATA_DTYPE_BF16) {
        put(*t, h);
      } else {  // f32: the bf16 values widened (high halves)
        std::vector<uint8_t> f(4 * r * d, 0);
        for (int64_t i = 0; i < r * d; ++i) std::memcpy(f.data() + 4 * i + 2, h.data() + 2 * i, 2);
        put(*t, f);
      }
    }
    std::vector<float> rh(r * (d / g)), wh(d);
    for (size_t i = 0; i < rh.size(); ++i) rh[i] = 0.5f + 0.001f * static_cast<float>(i % 1000);
    for (int64_t i = 0; i < d; ++i) wh[i] = 0.5f + 0.01f * static_cast<float>(i);
    EXPECT_EQ(cudaMemcpy(rstd.p, rh.data(), rh.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(w.p, wh.data(), d * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
};

TEST(FusedGpuPaths, RmsNormGatedBwdLoadsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  struct Shape {
    int64_t rows, D, G;
    int32_t dt;
  };
  for (const Shape sh : {Shape{60001, 128, 128, STRATA_DTYPE_BF16}, Shape{30001, 256, 64, STRATA_DTYPE_F32},
                         Shape{20001, 64, 16, STRATA_DTYPE_BF16}}) {
    RngBwdBufs b(sh.rows, sh.D, sh.G, sh.dt);
    for (const bool nbg : {true, false}) {
      b.p.norm_before_gate = nbg;
      std::vector<uint8_t> ref[4];
      for (const bool hints : {true, false}) {
        b.dx.poison(), b.dz.poison(), b.dw.poison(), b.db.poison();
        ASSERT_EQ(norm::rms_norm_gated_bwd_cuda(b.p, nullptr, hints), 0);
        EXPECT_EQ(cudaGetLastError(), cudaSuccess);
        const std::vector<uint8_t> got[4] = {b.dx.bits(), b.dz.bits(), b.dw.bits(), b.db.bits()};
        for (int i = 0; i < 4; ++i) {
          if (hints) ref[i] = got[i];
          else EXPECT_TRUE(got[i] == ref[i]) << "output " << i << ": D " << sh.D << " G " << sh.G << " nbg " << nbg;
        }
      }
    }
  }
}

// The row norms' streaming (stream 1) and packed (stream 2) kernels give the same bits with plain loads (the default)
// and with kHintedLoads.
TEST(FusedGpuPaths, RowNormLoadsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  struct Shape {
    int64_t rows, D;
    int32_t dt;
    int tpr, nv;
  };
  for (const Shape sh : {Shape{60001, 128, STRATA_DTYPE_BF16, 16, 1}, Shape{3001, 4096, STRATA_DTYPE_BF16, 128, 4},
                         Shape{20001, 256, STRATA_DTYPE_F32, 32, 2}}) {
    const size_t es = dtype_size(sh.dt), n = static_cast<size_t>(sh.rows * sh.D);
    Dev x(n * es), y(n * es), rstd(sh.rows * 4), dy(n * es), dx(n * es);
    if (sh.dt == STRATA_DTYPE_BF16) {
      put(x, bf16_normal_tiled(n, 8, 1.f)), put(dy, bf16_normal_tiled(n, 9, 1.f));
    } else {
      std::vector<float> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 500.f;
      EXPECT_EQ(cudaMemcpy(x.p, h.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(dy.p, h.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    norm::RowNormFwdParams f;
    f.x = x.p, f.y = y.p, f.rstd = rstd.p, f.x_dtype = f.y_dtype = sh.dt, f.rstd_dtype = STRATA_DTYPE_F32;
    f.rows = sh.rows, f.D = sh.D, f.x_rows = f.y_rows = dense_rows(sh.rows, sh.D), f.rstd_rows = dense_rows(sh.rows, 1);
    f.n_div = sh.D, f.eps = 1e-6f;
    for (const int stream : {1, 2}) {
      norm::RowNormCudaConfig c{16, sh.tpr, sh.nv, 1, stream, 0, 0};
      ASSERT_EQ(norm::row_norm_fwd_cuda_config_reject(f, c), "") << "D " << sh.D << " stream " << stream;
      y.poison(), rstd.poison();
      ASSERT_EQ(norm::row_norm_fwd_cuda(f, nullptr, &c), 0);
      const std::vector<uint8_t> yr = y.bits(), rr = rstd.bits();
      c.hints = norm::kHintedLoads;
      y.poison(), rstd.poison();
      ASSERT_EQ(norm::row_norm_fwd_cuda(f, nullptr, &c), 0);
      EXPECT_TRUE(y.bits() == yr && rstd.bits() == rr) << "fwd D " << sh.D << " stream " << stream;
      for (const norm::RowNormBwdKind kind :
           {norm::RowNormBwdKind::kNormalizedSrc, norm::RowNormBwdKind::kRawSrc, norm::RowNormBwdKind::kFactor}) {
        norm::RowNormBwdParams b;
        const bool factor = kind == norm::RowNormBwdKind::kFactor;
        b.src = kind == norm::RowNormBwdKind::kNormalizedSrc ? y.p : x.p, b.rstd = rstd.p, b.dout = factor ? rstd.p : dy.p;
        b.dx = dx.p, b.src_dtype = b.dx_dtype = sh.dt, b.rstd_dtype = STRATA_DTYPE_F32;
        b.dout_dtype = factor ? STRATA_DTYPE_F32 : sh.dt;
        b.rows = sh.rows, b.D = sh.D, b.kind = kind, b.n_div = sh.D;
        b.src_rows = b.dx_rows = dense_rows(sh.rows, sh.D), b.rstd_rows = dense_rows(sh.rows, 1);
        b.dout_rows = factor ? dense_rows(sh.rows, 1) : dense_rows(sh.rows, sh.D);
        norm::RowNormCudaConfig cb{16, sh.tpr, sh.nv, 1, stream, 0, 0};
        if (!norm::row_norm_bwd_cuda_config_reject(b, cb).empty()) continue;
        dx.poison();
        ASSERT_EQ(norm::row_norm_bwd_cuda(b, nullptr, &cb), 0);
        const std::vector<uint8_t> dr = dx.bits();
        cb.hints = norm::kHintedLoads;
        dx.poison();
        ASSERT_EQ(norm::row_norm_bwd_cuda(b, nullptr, &cb), 0);
        EXPECT_TRUE(dx.bits() == dr) << "bwd D " << sh.D << " stream " << stream << " kind " << static_cast<int>(kind);
      }
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
// Kinds (session 12, to split the fused kernel's time): the fused forward in place (the bench case), the forward
// without a gradient (loss only: the logits read once) and the backward op from lse in place (read + write, no
// statistics; dloss = the loss buffer).
enum class CeKind { kFused, kLossOnly, kBackward };
struct CePlan {
  CeBufs& b;
  CeKind kind;
  strata_plan plan = nullptr;
  CePlan(CeBufs& bufs, const char* impl, CeKind k = CeKind::kFused) : b(bufs), kind(k) {
    test::ForceImpl force(impl);
    if (kind == CeKind::kBackward)
      EXPECT_EQ(strata_fused_cross_entropy_bwd_plan(&b.dl, &b.dt, &b.dlse, &b.dloss, &b.dl, STRATA_LOSS_REDUCTION_MEAN,
                                                    -100, 0.f, 1.f, 0.f, 0.f, &plan),
                STRATA_SUCCESS)
          << strata_get_last_error_message();
    else
      EXPECT_EQ(strata_fused_cross_entropy_fwd_plan(&b.dl, &b.dt, &b.dloss, &b.dlse, nullptr,
                                                    kind == CeKind::kFused ? &b.dl : nullptr, STRATA_LOSS_REDUCTION_MEAN,
                                                    -100, 0.f, 1.f, 0.f, 0.f, 1.f, &plan),
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
    if (kind == CeKind::kBackward) {
      void* t[] = {b.logits.p, b.target.p, b.lse.p, b.loss.p, b.logits.p};
      return strata_plan_run(plan, t, 5, b.ws.p, b.ws.bytes, nullptr);
    }
    void* t[] = {b.logits.p, b.target.p, b.loss.p, b.lse.p, nullptr, kind == CeKind::kFused ? b.logits.p : nullptr};
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
    c.push_back({"team_stream (plain loads)", [&] { return norm::rms_norm_gated_fwd_cuda_stream(p, nullptr); }, {}});
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
    // Session 12: plain loads in team_stream and team_packed.
    c.push_back({"team_stream, hinted loads", [&] { return norm::rms_norm_gated_fwd_cuda_stream(p, nullptr, true, true); }, {}});
    c.push_back({"team_packed, hinted loads", [&] { return norm::rms_norm_gated_fwd_cuda_packed(p, nullptr, true); }, {}});
    c.push_back({"team_packed, plain loads", [&] { return norm::rms_norm_gated_fwd_cuda_packed(p, nullptr, false); }, {}});
    time_candidates("rms_norm_gated fwd bf16 [1048576, 128]", 3.0 * rows * D * 2 + rows * 4.0, c);
  }
  {  // rms_norm_gated backward bf16 [1048576, 128] G = 128 norm_before_gate silu, weight f32, dweight (f32)
    const int64_t rows = 1048576, D = 128;
    RngBwdBufs b(rows, D, D, STRATA_DTYPE_BF16);
    std::vector<Candidate> c;
    c.push_back({"bulk_ring (the default)", [&] { return norm::rms_norm_gated_bwd_cuda_ring(b.p, nullptr); }, {}});
    c.push_back({"group_rows streaming, hinted loads", [&] { return norm::rms_norm_gated_bwd_cuda(b.p, nullptr, true); }, {}});
    c.push_back({"group_rows streaming, plain loads", [&] { return norm::rms_norm_gated_bwd_cuda(b.p, nullptr, false); }, {}});
    time_candidates("rms_norm_gated bwd bf16 [1048576, 128]", 5.0 * rows * D * 2 + rows * 4.0, c);
  }
  {  // clipped_swiglu forward bf16 [32768, 2 x 2880] interleaved, GPT-OSS constants
    const int64_t rows = 32768, I = 2880;
    Dev x(rows * 2 * I * 2), y(rows * I * 2);
    cudaMemset(x.p, 0x3c, x.bytes);
    activation::ClippedSwigluFwdParams p;
    p.x = x.p, p.y = y.p, p.x_dtype = STRATA_DTYPE_BF16, p.rows = rows, p.I = I;
    p.x_rows = dense_rows(rows, 2 * I), p.y_rows = dense_rows(rows, I);
    std::vector<Candidate> c;
    c.push_back({"stream_regs: plain loads, flat grid, 4 vec (default)",
                 [&] { return activation::clipped_swiglu_fwd_cuda_stream(p, nullptr, activation::ClippedSwigluStreamTile{}); }, {}});
    c.push_back({"tile_tma 8 KiB x 128 flags 4", [&] { return activation::clipped_swiglu_fwd_cuda_tma(p, nullptr); }, {}});
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
    // Session 12: pairwise' streaming kernel, hinted / plain loads, persistent / flat grids, 4 / 8 vectors.
    struct St {
      bool hints, persistent;
      int vectors;
    };
    for (const St t : {St{true, true, 4}, St{false, true, 4}, St{true, false, 4}, St{false, false, 4}, St{true, false, 8},
                       St{false, false, 8}})
      c.push_back({std::string("stream ") + (t.hints ? "hinted" : "plain") + (t.persistent ? " persistent " : " flat ") +
                       std::to_string(t.vectors) + " vec",
                   [&p, t] {
                     return activation::clipped_swiglu_fwd_cuda_stream(
                         p, nullptr, activation::ClippedSwigluStreamTile{t.hints, t.persistent, t.vectors});
                   },
                   {}});
    // The default on N(0, 4) data (fused_peers' inputs) instead of the constant 0x3c3c pattern.
    Dev xr(x.bytes);
    put(xr, bf16_normal_tiled(rows * 2 * I, 11, 4.f));
    activation::ClippedSwigluFwdParams pr = p;
    pr.x = xr.p;
    c.push_back({"tile_tma, N(0, 4) data", [&] { return activation::clipped_swiglu_fwd_cuda_tma(pr, nullptr); }, {}});
    c.push_back({"stream plain flat 4 vec, N(0, 4) data",
                 [&] {
                   return activation::clipped_swiglu_fwd_cuda_stream(pr, nullptr,
                                                                     activation::ClippedSwigluStreamTile{false, false, 4});
                 },
                 {}});
    time_candidates("clipped_swiglu fwd bf16 [32768, 2 x 2880]", 3.0 * rows * I * 2, c);
  }
}

// The row norms at their bench shapes: the defaults, and the streaming / packed kernels with hinted and plain loads.
TEST(FusedGpuPaths, RowNormLoadsTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  struct Case {
    const char* what;
    int64_t rows, D, n_div;
    norm::RowNormBwdKind kind;
    int tpr, nv;  // the packed / streaming configuration timed both ways
  };
  for (const Case k : {Case{"l2norm bf16 [524288, 128]", 524288, 128, 1, norm::RowNormBwdKind::kNormalizedSrc, 16, 1},
                       Case{"rmsnorm bf16 [32768, 4096]", 32768, 4096, 4096, norm::RowNormBwdKind::kRawSrc, 128, 4}}) {
    const size_t n = static_cast<size_t>(k.rows * k.D);
    Dev x(n * 2), y(n * 2), rstd(k.rows * 4), dy(n * 2), dx(n * 2);
    put(x, bf16_normal_tiled(n, 12, 1.f)), put(dy, bf16_normal_tiled(n, 13, 1.f));
    norm::RowNormFwdParams f;
    f.x = x.p, f.y = y.p, f.rstd = rstd.p, f.x_dtype = f.y_dtype = STRATA_DTYPE_BF16, f.rstd_dtype = STRATA_DTYPE_F32;
    f.rows = k.rows, f.D = k.D, f.x_rows = f.y_rows = dense_rows(k.rows, k.D), f.rstd_rows = dense_rows(k.rows, 1);
    f.n_div = k.n_div, f.eps = 1e-6f;
    ASSERT_EQ(norm::row_norm_fwd_cuda(f, nullptr), 0);
    norm::RowNormBwdParams b;
    b.src = k.kind == norm::RowNormBwdKind::kNormalizedSrc ? y.p : x.p, b.rstd = rstd.p, b.dout = dy.p, b.dx = dx.p;
    b.src_dtype = b.dx_dtype = b.dout_dtype = STRATA_DTYPE_BF16, b.rstd_dtype = STRATA_DTYPE_F32;
    b.rows = k.rows, b.D = k.D, b.kind = k.kind, b.n_div = k.n_div;
    b.src_rows = b.dx_rows = b.dout_rows = dense_rows(k.rows, k.D), b.rstd_rows = dense_rows(k.rows, 1);
    auto configs = [&](auto& params, auto run, auto deflt) {
      std::vector<Candidate> c;
      const norm::RowNormCudaConfig d = deflt(params);
      c.push_back({"default (stream " + std::to_string(d.stream) + ", tpr " + std::to_string(d.tpr) + " x " +
                       std::to_string(d.nv) + ", hints " + std::to_string(d.hints) + ")",
                   [&params, run] { return run(params, nullptr); }, {}});
      for (const int stream : {2, 1}) {
        for (const int hints : {0, norm::kHintedLoads}) {
          const norm::RowNormCudaConfig cfg{16, k.tpr, k.nv, 1, stream, 0, hints};
          c.push_back({std::string(stream == 2 ? "packed " : "streaming ") + std::to_string(k.tpr) + " x " +
                           std::to_string(k.nv) + (hints ? ", hinted loads" : ", plain loads"),
                       [&params, cfg, run] { return run(params, &cfg); }, {}});
        }
      }
      return c;
    };
    std::vector<Candidate> cf = configs(
        f, [](const norm::RowNormFwdParams& q, const norm::RowNormCudaConfig* c) { return norm::row_norm_fwd_cuda(q, nullptr, c); },
        [](const norm::RowNormFwdParams& q) { return norm::row_norm_fwd_cuda_config(q); });
    // Session 13: the multi-row kernel's table entry (what the forward takes without the sm_90 rules) and the TMA
    // tile (the rmsnorm forward's default until session 13), beside.
    const norm::RowNormCudaConfig multi = norm::row_norm_multi_default(k.D, STRATA_DTYPE_BF16);
    if (multi.stream == 4)
      cf.push_back({"multi-row default (" + std::to_string(multi.tpr) + " x " + std::to_string(multi.nv) + ", " +
                        std::to_string(multi.rpg) + " rows, hints " + std::to_string(multi.hints) + ")",
                    [&f, multi] { return norm::row_norm_fwd_cuda(f, nullptr, &multi); }, {}});
    const norm::RowNormCudaConfig tma = norm::row_norm_tma_pick(k.D / 8);
    if (tma.stream == 5)
      cf.push_back({"TMA tile (" + std::to_string(tma.tpr) + " x " + std::to_string(tma.nv) + ", " +
                        std::to_string(tma.rpg) + " rows)",
                    [&f, tma] { return norm::row_norm_fwd_cuda(f, nullptr, &tma); }, {}});
    time_candidates((std::string(k.what) + " fwd").c_str(), 2.0 * n * 2 + k.rows * 4.0, cf);
    std::vector<Candidate> cb = configs(
        b, [](const norm::RowNormBwdParams& q, const norm::RowNormCudaConfig* c) { return norm::row_norm_bwd_cuda(q, nullptr, c); },
        [](const norm::RowNormBwdParams& q) { return norm::row_norm_bwd_cuda_config(q); });
    time_candidates((std::string(k.what) + " bwd").c_str(), 3.0 * n * 2 + k.rows * 4.0, cb);
  }
}

TEST(FusedGpuPaths, CrossEntropyTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  {  // fused_cross_entropy, the fused forward with the gradient in place, bf16 [8192, 151936] mean (each call
     // overwrites the logits with their gradient, as fused_peers' in-place calls do; the values do not change the work)
    const int64_t N = 8192, V = 151936;
    CeBufs bufs(N, V);
    cudaMemset(bufs.logits.p, 0x3c, bufs.logits.bytes);
    CePlan plan(bufs, "cuda.sm90.cluster_stored_exp_pf16");
    std::vector<Candidate> c;
    c.push_back({"cuda.sm90.cluster_stored_exp_pf16 (default)", [&] { return plan.run(); }, {}});
    // Its parts (session 12): the loss alone (read only: floor / 2 at best) and the backward op from lse
    // (cluster_smem's copy + gradient, no statistics, no cluster barriers).
    CePlan loss_only(bufs, "cuda.sm90.cluster_stored_exp_pf16", CeKind::kLossOnly);
    CePlan bwd(bufs, "cuda.sm90.cluster_stored_exp_pf16", CeKind::kBackward);
    c.push_back({"loss only (no gradient; reads half the bytes)", [&] { return loss_only.run(); }, {}});
    c.push_back({"backward op from lse, in place (no statistics)", [&] { return bwd.run(); }, {}});
    time_candidates("fused_cross_entropy fused in place bf16 [8192, 151936] mean", 2.0 * N * V * 2, c);
  }
}

// Two calls of the default fused forward in place at the bench shape, for Nsight Compute (the GPU script profiles
// the second call's row kernel: ncu --launch-skip 1 --launch-count 1 -k regex:ce_smem_rows).
TEST(FusedGpuPaths, CrossEntropyProfileTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  const int64_t N = 8192, V = 151936;
  CeBufs bufs(N, V);
  cudaMemset(bufs.logits.p, 0x3c, bufs.logits.bytes);  // as CrossEntropyTiming (the values do not change the work)
  CePlan plan(bufs, "cuda.sm90.cluster_stored_exp_pf16");
  for (int i = 0; i < 2; ++i) ASSERT_EQ(plan.run(), 0);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace strata
#endif  // STRATA_WITH_CUDA
