// prepare_wy_repr_bwd's warpgroup-MMA kernel (cuda.sm90.wgmma, cuda_sm90_wgmma.cu) against its mma.sync kernel
// (cuda.sm90.mma, the automatic variant) on the shapes it takes (bf16, K = V = 128, chunk size 64): fixed and
// variable length, partial chunks, G = 1, 2, 4, with and without gate, and the three call forms (plain; the
// composed chunk_gated_delta_rule backward's fused sums dk = dk_add + dk, dγ = dγ_add + dγ with dγ_add aliasing
// dγ; the same with dk aliasing dk_add, as with l2norm). Both use bf16 operands and f32 accumulators in other
// orders (and bf16-rounded intermediates at the same points: dA, tmp, Sym), so every f32 output must lie within
// 4e-3 of its largest magnitude of the mma.sync result and dv (bf16: one rounding step of its largest value is up
// to 2^-7 of it) within 1e-2 (the float64 conformance suite bounds each against the exact result); a second call
// must give the same bits. A Timing test prints both kernels at the benchmark shapes.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"
#include "opbase/dtype.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

namespace strata::linear_attn {
namespace {

using gdn_bwd::Dims;
using gdn_bwd::View;
using test::Dev;
using test::have_gpu;

constexpr int32_t kBf = STRATA_DTYPE_BF16, kF32 = STRATA_DTYPE_F32;

using gdn_test::tok;

// A device buffer of n values of dtype dt: N(0, sd), or uniform in [lo, 0] when lo < 0.
std::unique_ptr<Dev> random_dev(int64_t n, int32_t dt, std::mt19937_64& rng, double sd, double lo = 0) {
  return gdn_test::upload(gdn_test::random_bytes(n, dt, rng, sd, lo));
}

struct Case {
  int64_t B, T, H, HV;
  std::vector<int64_t> cu;  // empty: fixed length
  bool gate;
};

std::string case_str(const Case& s) {
  std::string r = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                  " HV=" + std::to_string(s.HV) + (s.gate ? " gate" : " no gate");
  if (!s.cu.empty()) r += " varlen";
  return r;
}

// Inputs of one case on the device (K = V = 128, BT = 64, bf16 token tensors, f32 γ).
struct Inputs {
  Case s;
  Dims d;
  std::unique_ptr<Dev> cu, k, v, beta, A, dw, du, g, dk_add, dg0;
  Inputs(const Case& c, uint64_t seed) : s(c) {
    std::mt19937_64 rng(seed);
    const int64_t rows = s.B * s.T, K = 128;
    cu = std::make_unique<Dev>(s.cu.size() * 8);
    if (!s.cu.empty())
      EXPECT_EQ(cudaMemcpy(cu->p, s.cu.data(), s.cu.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
    k = random_dev(rows * s.H * K, kBf, rng, 1.0 / std::sqrt(128.0));
    v = random_dev(rows * s.HV * K, kBf, rng, 1.0);
    beta = random_dev(rows * s.HV, kBf, rng, 0.5);
    A = random_dev(rows * s.HV * 64, kBf, rng, 0.25);  // any values: the kernels read each chunk's L x L block
    dw = random_dev(rows * s.HV * K, kBf, rng, 1.0 / (8 * std::sqrt(128.0)));
    du = random_dev(rows * s.HV * K, kBf, rng, 1.0);
    g = random_dev(rows * s.HV, kF32, rng, 0, -3.0);
    dk_add = random_dev(rows * s.H * K, kF32, rng, 1.0);
    dg0 = random_dev(rows * s.HV, kF32, rng, 1.0);
    d.B = s.B, d.T = s.T, d.H = s.H, d.HV = s.HV, d.G = s.HV / s.H, d.K = K, d.V = K, d.BT = 64;
    d.N = s.cu.empty() ? s.B : static_cast<int64_t>(s.cu.size()) - 1;
    d.cu = s.cu.empty() ? nullptr : static_cast<const int64_t*>(cu->p);
  }
};

// One call (wgmma: the warpgroup-MMA kernel, else the mma.sync kernel's automatic variant) in form `mode` (0: plain,
// 1: fused sums, 2: fused sums with dk aliasing dk_add): the bits of dk, dv, dbeta, dg.
std::vector<std::vector<uint8_t>> run(const Inputs& in, bool wgmma, int mode) {
  const Case& s = in.s;
  const int64_t rows = s.B * s.T, K = 128;
  Dev dk(rows * s.H * K * 4), dv(rows * s.HV * K * 2), dbeta(rows * s.HV * 4), dg(rows * s.HV * 4);
  dk.poison(), dv.poison(), dbeta.poison(), dg.poison();
  WyBwdParams p;
  p.d = in.d;
  p.k = tok(in.k->p, kBf, s.T, s.H, K), p.v = tok(in.v->p, kBf, s.T, s.HV, K);
  p.beta = tok(in.beta->p, kBf, s.T, s.HV, 0), p.A = tok(in.A->p, kBf, s.T, s.HV, 64);
  p.dw = tok(in.dw->p, kBf, s.T, s.HV, K), p.du = tok(in.du->p, kBf, s.T, s.HV, K);
  p.dk = tok(dk.p, kF32, s.T, s.H, K), p.dv = tok(dv.p, kBf, s.T, s.HV, K);
  p.dbeta = tok(dbeta.p, kF32, s.T, s.HV, 0);
  if (s.gate) p.g = tok(in.g->p, kF32, s.T, s.HV, 0), p.dg = tok(dg.p, kF32, s.T, s.HV, 0);
  if (mode > 0) {
    EXPECT_EQ(cudaMemcpy(dg.p, in.dg0->p, dg.bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
    if (s.gate) p.dg_add = p.dg;
    if (mode == 1) {
      p.dk_add = tok(in.dk_add->p, kF32, s.T, s.H, K);
    } else {  // in place: dk starts as dk_add's copy
      EXPECT_EQ(cudaMemcpy(dk.p, in.dk_add->p, dk.bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
      p.dk_add = p.dk;
    }
  }
  Dev ws(std::max(prepare_wy_repr_bwd_cuda_mma_workspace(p.d), prepare_wy_repr_bwd_cuda_wgmma_workspace(p.d)));
  if (wgmma) {
    EXPECT_EQ(prepare_wy_repr_bwd_cuda_wgmma_reject(p), "");
    EXPECT_EQ(prepare_wy_repr_bwd_cuda_wgmma(p, ws.p, nullptr), STRATA_SUCCESS);
  } else {
    EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(p, ws.p, nullptr), STRATA_SUCCESS);
  }
  return {dk.bits(), dv.bits(), dbeta.bits(), s.gate ? dg.bits() : std::vector<uint8_t>{}};
}

std::vector<float> values(const std::vector<uint8_t>& b, bool bf16) {
  std::vector<float> f(b.size() / (bf16 ? 2 : 4));
  for (size_t i = 0; i < f.size(); ++i) {
    if (bf16) f[i] = bf16_bits_to_f32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
    else std::memcpy(&f[i], b.data() + 4 * i, 4);
  }
  return f;
}

TEST(GdnWyBwdWgmma, MatchesMmaKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Case> cases = {
      {2, 130, 2, 4, {}, true},
      {1, 200, 2, 4, {0, 63, 127, 129, 192, 200}, true},
      {1, 65, 3, 3, {}, true},
      {1, 190, 1, 4, {}, false},
      {1, 300, 1, 2, {0, 1, 64, 65, 300}, true},
      {2, 256, 2, 4, {}, true},
  };
  const char* names[] = {"dk", "dv", "dbeta", "dg"};
  uint64_t seed = 7;
  for (const Case& s : cases) {
    const Inputs in(s, seed++);
    for (const int mode : {0, 1, 2}) {
      const std::string what = case_str(s) + " mode " + std::to_string(mode);
      const auto a = run(in, false, mode), b = run(in, true, mode);
      std::string worst;  // worst |diff| / largest |value| per output (information)
      for (size_t i = 0; i < a.size(); ++i) {
        const std::vector<float> x = values(a[i], i == 1), y = values(b[i], i == 1);
        ASSERT_EQ(x.size(), y.size()) << names[i] << " " << what;
        double mx = 0;
        for (const float e : x) mx = std::max(mx, std::fabs(static_cast<double>(e)));
        double wd = 0;
        for (size_t e = 0; e < x.size(); ++e) wd = std::max(wd, std::fabs(static_cast<double>(x[e]) - y[e]));
        char buf[64];
        std::snprintf(buf, sizeof buf, " %s %.2e", names[i], mx > 0 ? wd / mx : wd);
        worst += buf;
        for (size_t e = 0; e < x.size(); ++e) {
          ASSERT_TRUE(std::isfinite(x[e]) && std::isfinite(y[e])) << names[i] << "[" << e << "] " << what;
          ASSERT_LE(std::fabs(static_cast<double>(x[e]) - y[e]), (i == 1 ? 1e-2 : 4e-3) * mx + 1e-30)
              << names[i] << "[" << e << "] " << what << ": " << x[e] << " vs " << y[e];
        }
      }
      std::printf("[wy_bwd wgmma] %s:%s\n", what.c_str(), worst.c_str());
      EXPECT_TRUE(b == run(in, true, mode)) << "repeat " << what;  // fixed summation order, no atomics
    }
  }
}

// Both kernels at the benchmark shapes (bf16, H = 16, HV = 32, K = V = 128, chunk 64; B = 4, T = 8192 and B = 1,
// T = 32768) with the composed backward's fused sums (dk_add f32, dg_add aliasing dg); inputs filled by cudaMemset
// (bf16 0x3c3c ≈ 0.0115, γ = 0). Fastest of 9 interleaved calls (CUDA events). Fails only if a launch fails.
TEST(GdnWyBwdWgmma, TimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, rows = B * T;
    Dev k(rows * H * K * 2), v(rows * HV * K * 2), beta(rows * HV * 2), A(rows * HV * 64 * 2), dw(rows * HV * K * 2),
        du(rows * HV * K * 2), g(rows * HV * 4), dk(rows * H * K * 4), dk_add(rows * H * K * 4), dv(rows * HV * K * 2),
        dbeta(rows * HV * 4), dg(rows * HV * 4);
    for (Dev* x : {&k, &v, &beta, &A, &dw, &du, &dk_add, &dg}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    WyBwdParams p;
    p.d.B = B, p.d.T = T, p.d.H = H, p.d.HV = HV, p.d.G = HV / H, p.d.K = K, p.d.V = K, p.d.N = B, p.d.BT = 64;
    p.k = tok(k.p, kBf, T, H, K), p.v = tok(v.p, kBf, T, HV, K), p.beta = tok(beta.p, kBf, T, HV, 0);
    p.A = tok(A.p, kBf, T, HV, 64), p.dw = tok(dw.p, kBf, T, HV, K), p.du = tok(du.p, kBf, T, HV, K);
    p.g = tok(g.p, kF32, T, HV, 0);
    p.dk = tok(dk.p, kF32, T, H, K), p.dv = tok(dv.p, kBf, T, HV, K), p.dbeta = tok(dbeta.p, kF32, T, HV, 0);
    p.dg = tok(dg.p, kF32, T, HV, 0);
    p.dk_add = tok(dk_add.p, kF32, T, H, K), p.dg_add = p.dg;
    Dev ws(std::max(prepare_wy_repr_bwd_cuda_mma_workspace(p.d), prepare_wy_repr_bwd_cuda_wgmma_workspace(p.d)));
    const std::vector<std::function<void()>> fns = {
        [&] { EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(p, ws.p, nullptr), STRATA_SUCCESS); },
        [&] { EXPECT_EQ(prepare_wy_repr_bwd_cuda_wgmma(p, ws.p, nullptr), STRATA_SUCCESS); }};
    for (const auto& f : fns) f();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::vector<double> best(fns.size(), 1e30);
    for (int r = 0; r < 9; ++r)
      for (size_t i = 0; i < fns.size(); ++i) {
        cudaEventRecord(e0);
        fns[i]();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0.f;
        cudaEventElapsedTime(&ms, e0, e1);
        best[i] = std::min(best[i], static_cast<double>(ms));
      }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    // bytes: k, v, A, dw, du, dv (bf16), β (bf16), γ, dβ, dγ twice (f32), dk_add and dk (f32)
    const double gb = (rows * H * K * 2.0 + 4.0 * rows * HV * K * 2 + rows * HV * 64 * 2.0 + rows * HV * 2.0 +
                       4.0 * rows * HV * 4 + 2.0 * rows * H * K * 4) / 1e9;
    std::printf("[wy_bwd timing] prepare_wy_repr_bwd bf16 B=%lld T=%lld H=16 HV=32 K=V=128 (fused sums): mma.sync "
                "(automatic) %.3f ms, wgmma %.3f ms (%.2f GB: %.0f GB/s)\n",
                static_cast<long long>(B), static_cast<long long>(T), best[0], best[1], gb, gb / (best[1] * 1e-3));
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata::linear_attn

#endif  // STRATA_WITH_CUDA
