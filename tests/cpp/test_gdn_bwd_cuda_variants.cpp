// Launch variants of the gdn_bwd tensor-core kernels that the conformance driver does not reach on its own:
// chunk_bwd_dqkwg's kDqkwgPipelined (two cp.async stages, one block per SM) and kDqkwgTwoPerSm (one stage, two
// blocks per SM), chunk_gated_delta_rule_bwd_dhu's 64-column one-stage and 32-column two-stage V tiles. Each
// pair sums every element in the same order, so the test asks for the same bits on shapes with partial chunks,
// GVA, K and V that are not tile multiples, variable-length packs, f16 and optional outputs absent (the
// automatic choice is compared against float64 by the conformance suites). Also: prepare_wy_repr_bwd's kWyTwoPerSm
// against kWyPipelined (dk, dv the same bits; dβ, dγ within 1e-4 of their largest value), and bwd_dhu with the
// fused dv_local (DhuParams::fuse_dv_local) against chunk_bwd_dv_local then bwd_dhu (the same bits). A last test
// times the variants at the benchmark shape (B = 4, T = 8192, H = 16, HV = 32, K = V = 128 and B = 1, T = 32768)
// and prints the figures (information for choosing the automatic variant; it fails only if a launch fails).
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <random>
#include <vector>

#include "opbase/dtype.h"
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"
#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"

namespace strata::linear_attn {
namespace {

using gdn_bwd::Dims;
using gdn_bwd::View;

using test::Dev;
using test::have_gpu;

using gdn_test::random_bytes;
using gdn_test::states;
using gdn_test::time_min_ms;
using gdn_test::tok;
using gdn_test::upload;

struct Shape {
  int64_t B, T, H, HV, K, V;
  int32_t BT;
  std::vector<int64_t> cu;  // empty: fixed length
  int32_t dt;
  bool gate, with_dv;
};

// Total chunks (the NT of h / dh): Σ ceil(L_n / BT) or ceil(T / BT) per row.
int64_t chunks_of(const Shape& s) {
  if (s.cu.empty()) return (s.T + s.BT - 1) / s.BT;
  int64_t n = 0;
  for (size_t i = 1; i < s.cu.size(); ++i) n += (s.cu[i] - s.cu[i - 1] + s.BT - 1) / s.BT;
  return n;
}
Dims dims_of(const Shape& s, const int64_t* cu_dev) {
  Dims d;
  d.B = s.B, d.T = s.T, d.H = s.H, d.HV = s.HV, d.G = s.HV / s.H, d.K = s.K, d.V = s.V, d.BT = s.BT;
  d.N = s.cu.empty() ? s.B : static_cast<int64_t>(s.cu.size()) - 1;
  d.NT = chunks_of(s);
  d.cu = s.cu.empty() ? nullptr : cu_dev;
  return d;
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> v = {
      {2, 130, 2, 4, 128, 128, 64, {}, STRATA_DTYPE_BF16, true, true},
      {1, 100, 1, 3, 100, 100, 32, {}, STRATA_DTYPE_BF16, false, true},
      {1, 200, 2, 4, 64, 128, 64, {0, 63, 127, 129, 192, 200}, STRATA_DTYPE_BF16, true, true},
      {1, 65, 2, 8, 128, 128, 64, {}, STRATA_DTYPE_F16, true, false},
      {1, 163, 2, 4, 128, 96, 16, {0, 5, 5, 69, 100, 163}, STRATA_DTYPE_F16, true, true},
      {3, 90, 1, 2, 48, 32, 64, {}, STRATA_DTYPE_BF16, true, true},
  };
  return v;
}

// The inputs of one shape, on the device.
struct Inputs {
  Shape s;
  Dims d;
  std::unique_ptr<Dev> cu, q, k, w, v, dout, dv, g, h, dh, beta, A;
  explicit Inputs(const Shape& sh, uint64_t seed) : s(sh) {
    std::mt19937_64 rng(seed);
    const int32_t dt = s.dt;
    const int64_t NT = chunks_of(s), rows = s.B * s.T;
    std::vector<uint8_t> cub(s.cu.size() * 8);
    if (!s.cu.empty()) std::memcpy(cub.data(), s.cu.data(), cub.size());
    cu = upload(cub);
    const double isk = 1.0 / std::sqrt(static_cast<double>(s.K));
    q = upload(random_bytes(rows * s.H * s.K, dt, rng, isk));
    k = upload(random_bytes(rows * s.H * s.K, dt, rng, isk));
    w = upload(random_bytes(rows * s.HV * s.K, dt, rng, isk / 8));
    v = upload(random_bytes(rows * s.HV * s.V, dt, rng, 1.0));
    dout = upload(random_bytes(rows * s.HV * s.V, dt, rng, 1.0));
    dv = upload(random_bytes(rows * s.HV * s.V, dt, rng, 1.0));
    g = upload(random_bytes(rows * s.HV, STRATA_DTYPE_F32, rng, 0, -3.0));  // γ in [-3, 0] (any order suffices)
    h = upload(random_bytes(s.B * NT * s.HV * s.K * s.V, dt, rng, 1.0));
    dh = upload(random_bytes(s.B * NT * s.HV * s.K * s.V, dt, rng, 1.0));
    beta = upload(random_bytes(rows * s.HV, dt, rng, 0.5));
    // A: any [B, T, HV, BT] values (prepare_wy_repr_bwd reads the L x L block of each chunk; rows are tokens)
    A = upload(random_bytes(rows * s.HV * s.BT, dt, rng, 0.25));
    d = dims_of(s, static_cast<const int64_t*>(cu->p));
  }
};

// chunk_bwd_dqkwg with `variant`: the bits of dq, dk, dw, dg.
std::vector<std::vector<uint8_t>> run_dqkwg(const Inputs& in, int variant) {
  const Shape& s = in.s;
  const int64_t rows = s.B * s.T;
  Dev dq(rows * s.H * s.K * 4), dk(rows * s.H * s.K * 4), dw(rows * s.HV * s.K * dtype_size(s.dt)),
      dg(rows * s.HV * 4);
  dq.poison(), dk.poison(), dw.poison(), dg.poison();
  DqkwgParams p;
  p.d = in.d;
  p.q = tok(in.q->p, s.dt, s.T, s.H, s.K), p.k = tok(in.k->p, s.dt, s.T, s.H, s.K);
  p.v = tok(in.v->p, s.dt, s.T, s.HV, s.V), p.dout = tok(in.dout->p, s.dt, s.T, s.HV, s.V);
  p.h = states(in.h->p, s.dt, in.d.NT, s.HV, s.K, s.V), p.dh = states(in.dh->p, s.dt, in.d.NT, s.HV, s.K, s.V);
  if (s.with_dv) p.dv = tok(in.dv->p, s.dt, s.T, s.HV, s.V), p.dw = tok(dw.p, s.dt, s.T, s.HV, s.K);
  if (s.gate) p.g = tok(in.g->p, STRATA_DTYPE_F32, s.T, s.HV, 0), p.dg = tok(dg.p, STRATA_DTYPE_F32, s.T, s.HV, 0);
  p.dq = tok(dq.p, STRATA_DTYPE_F32, s.T, s.H, s.K), p.dk = tok(dk.p, STRATA_DTYPE_F32, s.T, s.H, s.K);
  p.scale = 0.125f;
  p.mma_variant = variant;
  Dev ws(chunk_bwd_dqkwg_cuda_mma_workspace(p.d));
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma(p, ws.p, nullptr), STRATA_SUCCESS) << "variant " << variant;
  return {dq.bits(), dk.bits(), s.with_dv ? dw.bits() : std::vector<uint8_t>{},
          s.gate ? dg.bits() : std::vector<uint8_t>{}};
}

// chunk_gated_delta_rule_bwd_dhu with `variant`: the bits of dh, dh0, dv2. dv_mode 0: dv = the random dv input;
// 1: dv = chunk_bwd_dv_local's tensor-core kernel on (q, k, do, g) first (the composed backward's two calls);
// 2: the fused dv_local (DhuParams::fuse_dv_local, dv absent).
std::vector<std::vector<uint8_t>> run_dhu(const Inputs& in, int variant, int dv_mode = 0, int wgmma_cols = 0) {
  const Shape& s = in.s;
  const int64_t rows = s.B * s.T, N = in.d.N;
  Dev dh(s.B * in.d.NT * s.HV * s.K * s.V * dtype_size(s.dt)), dh0(N * s.HV * s.K * s.V * 4),
      dv2(rows * s.HV * s.V * dtype_size(s.dt));
  dh.poison(), dh0.poison(), dv2.poison();
  DhuParams p;
  p.d = in.d;
  p.q = tok(in.q->p, s.dt, s.T, s.H, s.K), p.k = tok(in.k->p, s.dt, s.T, s.H, s.K);
  p.w = tok(in.w->p, s.dt, s.T, s.HV, s.K);
  p.dout = tok(in.dout->p, s.dt, s.T, s.HV, s.V), p.dv = tok(in.dv->p, s.dt, s.T, s.HV, s.V);
  if (s.gate) p.g = tok(in.g->p, STRATA_DTYPE_F32, s.T, s.HV, 0);
  // dht: the first N·HV·K·V values of h (any state will do), [N, HV, K, V]
  p.dht = states(in.h->p, s.dt, 0, s.HV, s.K, s.V);
  p.dht.s[0] = s.HV * s.K * s.V, p.dht.s[1] = s.K * s.V, p.dht.s[2] = s.V;
  p.dh = states(dh.p, s.dt, in.d.NT, s.HV, s.K, s.V);
  p.dh0 = states(dh0.p, STRATA_DTYPE_F32, 0, s.HV, s.K, s.V);
  p.dh0.s[0] = s.HV * s.K * s.V, p.dh0.s[1] = s.K * s.V, p.dh0.s[2] = s.V;
  p.dv2 = tok(dv2.p, s.dt, s.T, s.HV, s.V);
  p.scale = 0.125f;
  p.mma_variant = variant;
  p.wgmma_cols = wgmma_cols;
  Dev dvl(rows * s.HV * s.V * dtype_size(s.dt));
  if (dv_mode == 1) {
    dvl.poison();
    DvLocalParams vp;
    vp.d = in.d;
    vp.d.NT = 0;
    vp.q = p.q, vp.k = p.k, vp.dout = p.dout, vp.g = p.g, vp.dv = tok(dvl.p, s.dt, s.T, s.HV, s.V);
    vp.scale = p.scale;
    Dev ws1(chunk_bwd_dv_local_cuda_mma_workspace(vp.d));
    EXPECT_EQ(chunk_bwd_dv_local_cuda_mma(vp, ws1.p, nullptr), STRATA_SUCCESS);
    p.dv = vp.dv;
  } else if (dv_mode == 2) {
    p.dv = View{};
    p.fuse_dv_local = true;
    EXPECT_TRUE(chunk_gated_delta_rule_bwd_dhu_fuses_dv_local(p));
  }
  Dev ws(chunk_gated_delta_rule_bwd_dhu_cuda_mma_workspace(p.d));
  EXPECT_EQ(chunk_gated_delta_rule_bwd_dhu_cuda_mma(p, ws.p, nullptr), STRATA_SUCCESS) << "variant " << variant;
  return {dh.bits(), dh0.bits(), dv2.bits()};
}

// prepare_wy_repr_bwd with `variant`: the bits of dk, dv, dbeta, dg. dw / du are the w / dv inputs (any values of
// the right shapes); `fused`: with the composed backward's f32 addends (dk_add random f32, dg_add aliasing dg and
// dg pre-filled with random f32, as the composed op calls it).
std::vector<std::vector<uint8_t>> run_wy(const Inputs& in, int variant, bool fused) {
  const Shape& s = in.s;
  const int64_t rows = s.B * s.T;
  Dev dk(rows * s.H * s.K * 4), dv(rows * s.HV * s.V * dtype_size(s.dt)), dbeta(rows * s.HV * 4), dg(rows * s.HV * 4);
  dk.poison(), dv.poison(), dbeta.poison(), dg.poison();
  std::mt19937_64 rng(99);
  std::unique_ptr<Dev> dk_add;
  if (fused) {
    dk_add = upload(random_bytes(rows * s.H * s.K, STRATA_DTYPE_F32, rng, 1.0));
    const std::vector<uint8_t> dg0 = random_bytes(rows * s.HV, STRATA_DTYPE_F32, rng, 1.0);
    EXPECT_EQ(cudaMemcpy(dg.p, dg0.data(), dg0.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  WyBwdParams p;
  p.d = in.d;
  p.d.NT = 0;  // (no chunk-state tensor)
  p.k = tok(in.k->p, s.dt, s.T, s.H, s.K), p.v = tok(in.v->p, s.dt, s.T, s.HV, s.V);
  p.beta = tok(in.beta->p, s.dt, s.T, s.HV, 0), p.A = tok(in.A->p, s.dt, s.T, s.HV, s.BT);
  p.dw = tok(in.w->p, s.dt, s.T, s.HV, s.K), p.du = tok(in.dv->p, s.dt, s.T, s.HV, s.V);
  if (s.gate) p.g = tok(in.g->p, STRATA_DTYPE_F32, s.T, s.HV, 0), p.dg = tok(dg.p, STRATA_DTYPE_F32, s.T, s.HV, 0);
  p.dk = tok(dk.p, STRATA_DTYPE_F32, s.T, s.H, s.K), p.dv = tok(dv.p, s.dt, s.T, s.HV, s.V);
  p.dbeta = tok(dbeta.p, STRATA_DTYPE_F32, s.T, s.HV, 0);
  if (fused) {
    p.dk_add = tok(dk_add->p, STRATA_DTYPE_F32, s.T, s.H, s.K);
    if (s.gate) p.dg_add = p.dg;
  }
  p.mma_variant = variant;
  Dev ws(prepare_wy_repr_bwd_cuda_mma_workspace(p.d));
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(p, ws.p, nullptr), STRATA_SUCCESS) << "variant " << variant;
  return {dk.bits(), dv.bits(), dbeta.bits(), s.gate ? dg.bits() : std::vector<uint8_t>{}};
}

// f32 values of a bits buffer.
std::vector<float> as_f32(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  if (!f.empty()) std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

std::string shape_str(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " HV=" + std::to_string(s.HV) +
         " K=" + std::to_string(s.K) + " V=" + std::to_string(s.V) + " BT=" + std::to_string(s.BT);
}

// Outputs a (the reference variant) and b (another variant) of one call each: output i the same bits, or, when
// close(i), f32 values within 1e-4 of the largest magnitude of a[i] (f32 reassociation), finite everywhere.
void expect_outputs_match(const std::vector<std::vector<uint8_t>>& a, const std::vector<std::vector<uint8_t>>& b,
                          const std::vector<const char*>& names, const std::function<bool(size_t)>& close,
                          const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), names.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!close(i)) {
      EXPECT_TRUE(a[i] == b[i]) << names[i] << " differs in " << what;
      continue;
    }
    const std::vector<float> x = as_f32(a[i]), y = as_f32(b[i]);
    ASSERT_EQ(x.size(), y.size()) << names[i] << " in " << what;
    double mx = 0;
    for (const float e : x) mx = std::max(mx, std::fabs(static_cast<double>(e)));
    for (size_t e = 0; e < x.size(); ++e) {
      ASSERT_TRUE(std::isfinite(x[e]) && std::isfinite(y[e])) << names[i] << "[" << e << "] in " << what;
      ASSERT_LE(std::fabs(static_cast<double>(x[e]) - y[e]), 1e-4 * mx + 1e-30)
          << names[i] << "[" << e << "] in " << what << ": " << x[e] << " vs " << y[e];
    }
  }
}

// kDqkwgTwoPerSm (and kDqkwgAuto, which runs it): every output the same bits as kDqkwgPipelined. kDqkwgWarps16:
// dq, dk, dw the same bits, dγ (its row and block sums add the partials of 16 x 16 warp blocks instead of 16 x 32
// ones) within 1e-4 of its largest magnitude (f32 reassociation of sums of at most 2 x 128 + 64 x 64 terms).
TEST(GdnBwdCudaVariants, DqkwgVariantsSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 11;
  for (const Shape& s : shapes()) {
    const Inputs in(s, seed++);
    const auto a = run_dqkwg(in, kDqkwgPipelined);
    for (const int var : {kDqkwgTwoPerSm, kDqkwgWarps16, kDqkwgAuto}) {
      const bool dg_close = var == kDqkwgWarps16;
      expect_outputs_match(a, run_dqkwg(in, var), {"dq", "dk", "dw", "dg"},
                           [&](size_t i) { return i == 3 && dg_close && s.gate; },
                           "variant " + std::to_string(var) + " " + shape_str(s));
    }
  }
}

// kDqkwgWgmma (the warpgroup-MMA kernel: other f32 summation orders, Ds K and Dsᵀ Q per head on whole 128-column
// blocks, dγ written without the per-K-tile partials) against kDqkwgPipelined on the shapes it takes (bf16,
// K = V = 128, BT = 64): fixed and variable length, G = 1, 2, 4, with and without gate / dv, partial chunks. Every
// output within 2e-3 of its largest magnitude (both use bf16 operands, the same rounded Ds, f32 accumulators;
// the float64 conformance harness bounds each against the exact result), finite, and dw (bf16) compared as values.
TEST(GdnBwdCudaVariants, DqkwgWgmmaMatchesMma) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes = {
      {2, 130, 2, 4, 128, 128, 64, {}, STRATA_DTYPE_BF16, true, true},
      {1, 200, 2, 4, 128, 128, 64, {0, 63, 127, 129, 192, 200}, STRATA_DTYPE_BF16, true, true},
      {1, 65, 3, 3, 128, 128, 64, {}, STRATA_DTYPE_BF16, true, true},
      {1, 190, 1, 4, 128, 128, 64, {}, STRATA_DTYPE_BF16, false, false},
      {1, 300, 1, 2, 128, 128, 64, {0, 1, 64, 65, 300}, STRATA_DTYPE_BF16, true, false},
      {2, 256, 2, 4, 128, 128, 64, {}, STRATA_DTYPE_BF16, true, true},
  };
  auto values = [](const std::vector<uint8_t>& b, bool bf16) {
    if (!bf16) return as_f32(b);
    std::vector<float> f(b.size() / 2);
    for (size_t i = 0; i < f.size(); ++i) {
      const uint32_t x = static_cast<uint32_t>(b[2 * i] | (b[2 * i + 1] << 8)) << 16;
      std::memcpy(&f[i], &x, 4);
    }
    return f;
  };
  const char* names[] = {"dq", "dk", "dw", "dg"};
  uint64_t seed = 101;
  for (const Shape& s : shapes) {
    const Inputs in(s, seed++);
    const auto a = run_dqkwg(in, kDqkwgPipelined), b = run_dqkwg(in, kDqkwgWgmma);
    for (size_t i = 0; i < a.size(); ++i) {
      const std::vector<float> x = values(a[i], i == 2), y = values(b[i], i == 2);
      ASSERT_EQ(x.size(), y.size()) << names[i] << " " << shape_str(s);
      double mx = 0;
      for (const float e : x) mx = std::max(mx, std::fabs(static_cast<double>(e)));
      for (size_t e = 0; e < x.size(); ++e) {
        ASSERT_TRUE(std::isfinite(x[e]) && std::isfinite(y[e])) << names[i] << "[" << e << "] " << shape_str(s);
        ASSERT_LE(std::fabs(static_cast<double>(x[e]) - y[e]), 2e-3 * mx + 1e-30)
            << names[i] << "[" << e << "] " << shape_str(s) << ": " << x[e] << " vs " << y[e];
      }
    }
    // The same bits on a second call (fixed summation order, no atomics).
    EXPECT_TRUE(b == run_dqkwg(in, kDqkwgWgmma)) << "repeat " << shape_str(s);
  }
}

// prepare_wy_repr_bwd kWyTwoPerSm (K Kᵀ per head in registers, dβ / dγ sums reduced from the fragments) against
// kWyPipelined: dk, dv the same bits (the same products, in the same order); dβ, dγ (their Σ dP ⊙ KK row and column
// sums add the terms in another fixed order) within 1e-4 of the largest magnitude of each output, NaN nowhere.
// kWyAuto runs kWyTwoPerSm where it applies (checked the same way). Shapes that kWyTwoPerSm does not take (K, V
// rounding to different 64-multiples) run the pipelined kernel under every variant: the same bits as well.
TEST(GdnBwdCudaVariants, WyBwdVariants) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 31;
  for (const Shape& s : shapes()) {
    const Inputs in(s, seed++);
    for (const bool fused : {false, true}) {
      const auto a = run_wy(in, kWyPipelined, fused);
      for (const int var : {kWyTwoPerSm, kWyAuto})
        expect_outputs_match(a, run_wy(in, var, fused), {"dk", "dv", "dbeta", "dg"}, [](size_t i) { return i >= 2; },
                             "variant " + std::to_string(var) + " fused " + std::to_string(fused) + " " + shape_str(s));
    }
  }
}

// bwd_dhu with the fused dv_local against chunk_bwd_dv_local then bwd_dhu (the composed backward's two calls):
// dh, dh0, dv2 the same bits, for both mma.sync tile shapes at K <= 128 (64-column, 32-column; the warpgroup-MMA
// kernel forms Bm dO in another summation order than chunk_bwd_dv_local: DhuWgmmaMatchesMma covers it).
TEST(GdnBwdCudaVariants, DhuFusedDvLocalSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 41;
  for (const Shape& s : shapes()) {
    const Inputs in(s, seed++);
    for (const int var : {kDhuWide, kDhuNarrow}) {
      const auto a = run_dhu(in, var, 1), b = run_dhu(in, var, 2);
      expect_outputs_match(a, b, {"dh", "dh0", "dv2"}, [](size_t) { return false; },
                           "the fused dv_local, variant " + std::to_string(var) + " " + shape_str(s));
    }
  }
}

TEST(GdnBwdCudaVariants, DhuVariantsSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 21;
  for (const Shape& s : shapes()) {
    if (s.K <= 64 || s.K > 128) continue;  // the two tile shapes exist at 64 < K <= 128
    const Inputs in(s, seed++);
    const auto a = run_dhu(in, kDhuWide), b = run_dhu(in, kDhuNarrow);
    expect_outputs_match(a, b, {"dh", "dh0", "dv2"}, [](size_t) { return false; },
                         "the 32-column tiles " + shape_str(s));
  }
}

// The warpgroup-MMA kernel (kDhuWgmma: bf16, K = 128, V % 32 == 0, chunk size 64) against the mma.sync kernel
// (kDhuWide, checked against float64 by the conformance suite): the same math and rounding points, another f32
// summation order inside the products, so dh, dh0, dv2 agree within a tolerance, not bit for bit: bf16 outputs
// within 1.5e-2 of the largest magnitude (a few bf16 ulps), f32 dh0 within 1e-2 (dS is rounded to bf16 for K dS
// every chunk, so last-bit differences feed through the recurrence). Every column width (16, 32, 64 per
// warpgroup) where it divides V, fused dv_local and dv read, partial chunks, packs with an empty sequence, GVA.
const std::vector<Shape>& wgmma_shapes() {
  static const std::vector<Shape> v = {
      {2, 130, 2, 4, 128, 128, 64, {}, STRATA_DTYPE_BF16, true, true},
      {1, 200, 2, 4, 128, 128, 64, {0, 63, 127, 129, 192, 200}, STRATA_DTYPE_BF16, true, true},
      {1, 300, 1, 2, 128, 96, 64, {0, 0, 64, 300}, STRATA_DTYPE_BF16, false, true},
      {3, 64, 2, 2, 128, 64, 64, {}, STRATA_DTYPE_BF16, true, true},
      {1, 1000, 1, 1, 128, 128, 64, {}, STRATA_DTYPE_BF16, true, true},
  };
  return v;
}
void expect_dhu_close(const std::vector<std::vector<uint8_t>>& a, const std::vector<std::vector<uint8_t>>& b,
                      int32_t dt, const std::string& what) {
  const char* names[3] = {"dh", "dh0", "dv2"};
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t o = 0; o < 3; ++o) {
    const bool f32 = o == 1;
    auto val = [&](const std::vector<uint8_t>& x, size_t e) {
      if (f32) {
        float f;
        std::memcpy(&f, x.data() + 4 * e, 4);
        return static_cast<double>(f);
      }
      uint16_t u;
      std::memcpy(&u, x.data() + 2 * e, 2);
      return static_cast<double>(dt == STRATA_DTYPE_BF16 ? bf16_bits_to_f32(u) : f16_bits_to_f32(u));
    };
    ASSERT_EQ(a[o].size(), b[o].size()) << names[o] << " in " << what;
    const size_t n = a[o].size() / (f32 ? 4 : 2);
    double mx = 0, worst = 0, sum = 0;
    for (size_t e = 0; e < n; ++e) mx = std::max(mx, std::fabs(val(a[o], e)));
    for (size_t e = 0; e < n; ++e) {
      const double x = val(a[o], e), y = val(b[o], e);
      ASSERT_TRUE(std::isfinite(x) && std::isfinite(y)) << names[o] << "[" << e << "] in " << what;
      worst = std::max(worst, std::fabs(x - y));
      sum += std::fabs(x - y);
    }
    const double tol = (f32 ? 1e-2 : 1.5e-2) * mx + 1e-30;
    EXPECT_LE(worst, tol) << names[o] << " in " << what << ": worst |diff| " << worst << ", largest |value| " << mx;
    std::printf("[dhu wgmma] %s %s: worst |diff| / largest |value| %.2e, mean |diff| %.2e\n", what.c_str(), names[o],
                worst / (mx + 1e-30), n ? sum / n : 0.0);
  }
}

TEST(GdnBwdCudaVariants, DhuWgmmaMatchesMma) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 51;
  for (const Shape& s : wgmma_shapes()) {
    const Inputs in(s, seed++);
    for (const int dv_mode : {0, 2}) {
      const auto a = run_dhu(in, kDhuWide, dv_mode);
      for (const int cols : {0, 16, 32, 64}) {
        if (cols > 0 && s.V % (2 * cols) != 0) continue;
        const auto b = run_dhu(in, kDhuWgmma, dv_mode, cols);
        const std::string what = shape_str(s) + (s.cu.empty() ? "" : " varlen") + (dv_mode == 2 ? " fused" : " dv read") +
                                 " cols " + std::to_string(cols);
        expect_dhu_close(a, b, s.dt, what);
        // The copy-engine-fed kernel (kDhuWgmmaTma): the same bits.
        EXPECT_TRUE(run_dhu(in, kDhuWgmmaTma, dv_mode, cols) == b) << what << ": tma differs from cp.async";
        // The reordered chunk step (kDhuWgmmaAhead, session 11): the same products and rounding, the same bits.
        EXPECT_TRUE(run_dhu(in, kDhuWgmmaAhead, dv_mode, cols) == b) << what << ": ahead differs from cp.async";
        // P split between the two warpgroups, Bm dO with Bm from shared memory (kDhuWgmmaAheadHalfP): the same
        // products per element; checked against the mma.sync kernel too, so that a bit difference shows its size.
        const auto hp = run_dhu(in, kDhuWgmmaAheadHalfP, dv_mode, cols);
        expect_dhu_close(a, hp, s.dt, what + " half P");
        EXPECT_TRUE(hp == b) << what << ": half P differs from cp.async";
        // Half P (dv read: ahead) with one 5-D box a chunk tile (kDhuWgmmaAheadHalfPBox5, session 13; kDhuAuto's form
        // at 32 / 64 columns with the fused dv_local): the same bits.
        EXPECT_TRUE(run_dhu(in, kDhuWgmmaAheadHalfPBox5, dv_mode, cols) == b) << what << ": half P, 5-D boxes differs";
        // The warp-specialised form (kDhuWgmmaSplit, session 12; fused at 16 columns, else half P): the same bits.
        if (dv_mode == 2) {
          const auto sp = run_dhu(in, kDhuWgmmaSplit, dv_mode, cols);
          expect_dhu_close(a, sp, s.dt, what + " split");
          EXPECT_TRUE(sp == b) << what << ": split differs from cp.async";
        }
      }
      // Reproducible: a second call gives the same bits.
      EXPECT_TRUE(run_dhu(in, kDhuWgmma, dv_mode) == run_dhu(in, kDhuWgmma, dv_mode)) << shape_str(s);
    }
  }
}

// Prints a timing line and appends it to $OUT/gdn_bwd_timing.txt when OUT is set (the log folder of
// scripts/gpu_check.sh, which comes back from the GPU machine; ctest shows a passing test's output only with -V).
void report(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (const char* out = std::getenv("OUT"); out && *out)
    if (FILE* f = std::fopen((std::string(out) + "/gdn_bwd_timing.txt").c_str(), "a")) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
}
std::string fmt_line(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// chunk_bwd_dqkwg alone at the bench shapes (bf16, H = 16, HV = 32, K = V = 128; B = 4, T = 8192 and B = 1,
// T = 32768): the automatic mma.sync kernel (kDqkwgTwoPerSm) against the warpgroup-MMA kernel (its automatic
// copy-engine form, session 12), that kernel without dv / dw / dγ (0.54 GB less traffic, no dW product, no dγ
// sums): what those parts cost, and its cp.async form (kDqkwgWgmmaCpAsync, the automatic one before session 12);
// session 14: kDqkwgWgmmaBoundedWait (the ds group's mbarrier waits with the trap counter: the default until the
// unbounded waits won in s14run2).
TEST(GdnBwdCudaVariants, DqkwgTimingWgmma) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, NT = T / 64, rows = B * T;
    const int32_t dt = STRATA_DTYPE_BF16;
    Dev q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * V * 2), dout(rows * HV * V * 2),
        dv(rows * HV * V * 2), g(rows * HV * 4), h(B * NT * HV * K * V * 2), dh(B * NT * HV * K * V * 2),
        dq(rows * H * K * 4), dk(rows * H * K * 4), dw(rows * HV * K * 2), dg(rows * HV * 4);
    for (Dev* x : {&q, &k, &v, &dout, &dv, &h, &dh}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    Dims d;
    d.B = B, d.T = T, d.H = H, d.HV = HV, d.G = HV / H, d.K = K, d.V = V, d.N = B, d.NT = NT, d.BT = 64;
    DqkwgParams p;
    p.d = d;
    p.q = tok(q.p, dt, T, H, K), p.k = tok(k.p, dt, T, H, K), p.v = tok(v.p, dt, T, HV, V);
    p.dout = tok(dout.p, dt, T, HV, V), p.dv = tok(dv.p, dt, T, HV, V), p.g = tok(g.p, STRATA_DTYPE_F32, T, HV, 0);
    p.h = states(h.p, dt, NT, HV, K, V), p.dh = states(dh.p, dt, NT, HV, K, V);
    p.dq = tok(dq.p, STRATA_DTYPE_F32, T, H, K), p.dk = tok(dk.p, STRATA_DTYPE_F32, T, H, K);
    p.dw = tok(dw.p, dt, T, HV, K), p.dg = tok(dg.p, STRATA_DTYPE_F32, T, HV, 0);
    p.scale = 0.0884f;
    Dev ws(chunk_bwd_dqkwg_cuda_mma_workspace(d));
    auto call = [&](int var, bool dq_dk_only = false) {
      return std::function<void()>([&, var, dq_dk_only] {
        DqkwgParams pv = p;
        pv.mma_variant = var;
        if (dq_dk_only) pv.dv = View{}, pv.dw = View{}, pv.dg = View{};
        EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma(pv, ws.p, nullptr), STRATA_SUCCESS);
      });
    };
    const std::vector<double> ms =
        time_min_ms({call(kDqkwgTwoPerSm), call(kDqkwgWgmma), call(kDqkwgWgmma, true), call(kDqkwgWgmmaCpAsync),
                     call(kDqkwgWgmmaCpAsync, true), call(kDqkwgWgmmaBoundedWait), call(kDqkwgWgmma),
                     call(kDqkwgWgmmaBoundedWait)},
                    9);
    // bytes read once: q, k, v, do, dv, h, dh (bf16), g; written: dq, dk (f32), dw (bf16), dg
    const double gb = (2.0 * rows * H * K * 2 + 3.0 * rows * HV * V * 2 + 2.0 * B * NT * HV * K * V * 2 +
                       rows * HV * 4 + 2.0 * rows * H * K * 4 + rows * HV * K * 2 + rows * HV * 4) / 1e9;
    report(fmt_line("[gdn_bwd timing] chunk_bwd_dqkwg bf16 B=%lld T=%lld H=16 HV=32 K=V=128: two_per_sm %.3f ms, "
                    "wgmma %.3f ms (%.2f GB moved: %.0f GB/s); wgmma without dv, dw, dg %.3f ms; cp.async form %.3f ms, "
                    "without dv, dw, dg %.3f ms; bounded waits (the default until s14) %.3f ms (again: wgmma %.3f, bounded %.3f ms)",
                    static_cast<long long>(B), static_cast<long long>(T), ms[0], ms[1], gb, gb / (ms[1] * 1e-3),
                    ms[2], ms[3], ms[4], ms[5], ms[6], ms[7]));
  }
}

// chunk_bwd_dqkwg's params on the timing tests' buffers (dims d; bf16 tokens and states, f32 dq, dk, dγ; scale
// 1 / sqrt(128)).
struct DqkwgBufs {
  const Dev *q, *k, *v, *dout, *dv, *g, *h, *dh, *dq, *dk, *dw, *dg;
};
DqkwgParams bench_dqkwg_params(const Dims& d, const DqkwgBufs& b) {
  const int32_t dt = STRATA_DTYPE_BF16;
  const int64_t T = d.T, H = d.H, HV = d.HV, K = d.K, V = d.V, NT = d.NT;
  DqkwgParams p;
  p.d = d;
  p.q = tok(b.q->p, dt, T, H, K), p.k = tok(b.k->p, dt, T, H, K), p.v = tok(b.v->p, dt, T, HV, V);
  p.dout = tok(b.dout->p, dt, T, HV, V), p.dv = tok(b.dv->p, dt, T, HV, V), p.g = tok(b.g->p, STRATA_DTYPE_F32, T, HV, 0);
  p.h = states(b.h->p, dt, NT, HV, K, V), p.dh = states(b.dh->p, dt, NT, HV, K, V);
  p.dq = tok(b.dq->p, STRATA_DTYPE_F32, T, H, K), p.dk = tok(b.dk->p, STRATA_DTYPE_F32, T, H, K);
  p.dw = tok(b.dw->p, dt, T, HV, K), p.dg = tok(b.dg->p, STRATA_DTYPE_F32, T, HV, 0);
  p.scale = 0.0884f;
  return p;
}

// Timing of the variants at the benchmark shapes (inputs filled by cudaMemset: bf16 0x3c3c ≈ 0.0115, γ = 0), and
// of the other two backward sub-operator kernels (chunk_bwd_dv_local, prepare_wy_repr_bwd with the composed op's
// fused dk / dγ sums) for a per-kernel split of the composed backward.
TEST(GdnBwdCudaVariants, TimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, NT = T / 64, rows = B * T;
    const int32_t dt = STRATA_DTYPE_BF16;
    Dev q(rows * H * K * 2), k(rows * H * K * 2), w(rows * HV * K * 2), v(rows * HV * V * 2), dout(rows * HV * V * 2),
        dv(rows * HV * V * 2), g(rows * HV * 4), h(B * NT * HV * K * V * 2), dh(B * NT * HV * K * V * 2),
        dq(rows * H * K * 4), dk(rows * H * K * 4), dw(rows * HV * K * 2), dg(rows * HV * 4), dv2(rows * HV * V * 2),
        dh0(B * HV * K * V * 4), beta(rows * HV * 2), A(rows * HV * 64 * 2), dvo(rows * HV * V * 2),
        dbeta(rows * HV * 4);
    for (Dev* x : {&q, &k, &w, &v, &dout, &dv, &h, &dh, &beta, &A})
      EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    Dims d;
    d.B = B, d.T = T, d.H = H, d.HV = HV, d.G = HV / H, d.K = K, d.V = V, d.N = B, d.NT = NT, d.BT = 64;

    const DqkwgParams p = bench_dqkwg_params(d, {&q, &k, &v, &dout, &dv, &g, &h, &dh, &dq, &dk, &dw, &dg});
    Dev ws(chunk_bwd_dqkwg_cuda_mma_workspace(d));
    auto dq_call = [&](int var) {
      return std::function<void()>([&, var] {
        DqkwgParams pv = p;
        pv.mma_variant = var;
        EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma(pv, ws.p, nullptr), STRATA_SUCCESS);
      });
    };
    const std::vector<double> ms =
        time_min_ms({dq_call(kDqkwgPipelined), dq_call(kDqkwgTwoPerSm), dq_call(kDqkwgWarps16)});
    report(fmt_line("[gdn_bwd timing] chunk_bwd_dqkwg bf16 B=%lld T=%lld H=16 HV=32 K=V=128: pipelined %.3f ms, "
                    "two_per_sm %.3f ms, warps16 %.3f ms", static_cast<long long>(B), static_cast<long long>(T),
                    ms[0], ms[1], ms[2]));

    DhuParams hp;
    hp.d = d;
    hp.q = p.q, hp.k = p.k, hp.w = tok(w.p, dt, T, HV, K), hp.dout = p.dout, hp.dv = p.dv, hp.g = p.g;
    hp.dh = states(dh.p, dt, NT, HV, K, V);
    hp.dh0 = states(dh0.p, STRATA_DTYPE_F32, 0, HV, K, V);
    hp.dh0.s[0] = HV * K * V, hp.dh0.s[1] = K * V, hp.dh0.s[2] = V;
    hp.dv2 = tok(dv2.p, dt, T, HV, V);
    hp.scale = 0.0884f;
    Dev ws2(chunk_gated_delta_rule_bwd_dhu_cuda_mma_workspace(d));
    auto dhu_call = [&](int var) {
      return std::function<void()>([&, var] {
        DhuParams hv = hp;
        hv.mma_variant = var;
        EXPECT_EQ(chunk_gated_delta_rule_bwd_dhu_cuda_mma(hv, ws2.p, nullptr), STRATA_SUCCESS);
      });
    };
    const std::vector<double> hm = time_min_ms({dhu_call(kDhuWide), dhu_call(kDhuNarrow)}, 3);
    report(fmt_line("[gdn_bwd timing] chunk_gated_delta_rule_bwd_dhu bf16 B=%lld T=%lld HV=32 K=V=128: 64-column "
                    "one-stage %.3f ms, 32-column two-stage %.3f ms (automatic: %s)", static_cast<long long>(B),
                    static_cast<long long>(T), hm[0], hm[1], dhu_narrow_tiles(d, 132) ? "32-column" : "64-column"));

    DvLocalParams vp;
    vp.d = d;
    vp.q = p.q, vp.k = p.k, vp.dout = p.dout, vp.g = p.g, vp.dv = tok(dvo.p, dt, T, HV, V);
    vp.scale = 0.0884f;
    Dev ws3(chunk_bwd_dv_local_cuda_mma_workspace(d));

    // The composed backward's dv_local + bwd_dhu (automatic tiles) against bwd_dhu with the fused dv_local, on the
    // mma.sync kernel (DhuWgmmaTiming times the warpgroup-MMA one).
    {
      hp.mma_variant = kDhuMmaAuto;
      DhuParams fp = hp;
      fp.dv = View{};
      fp.fuse_dv_local = true;
      const std::vector<double> fm = time_min_ms(
          {[&] {
             EXPECT_EQ(chunk_bwd_dv_local_cuda_mma(vp, ws3.p, nullptr), STRATA_SUCCESS);
             EXPECT_EQ(chunk_gated_delta_rule_bwd_dhu_cuda_mma(hp, ws2.p, nullptr), STRATA_SUCCESS);
           },
           [&] { EXPECT_EQ(chunk_gated_delta_rule_bwd_dhu_cuda_mma(fp, ws2.p, nullptr), STRATA_SUCCESS); }},
          3);
      report(fmt_line("[gdn_bwd timing] bf16 B=%lld T=%lld: chunk_bwd_dv_local + bwd_dhu (automatic tiles) %.3f ms, "
                      "bwd_dhu with fused dv_local %.3f ms", static_cast<long long>(B), static_cast<long long>(T),
                      fm[0], fm[1]));
    }

    WyBwdParams wp;
    wp.d = d;
    wp.k = p.k, wp.v = p.v, wp.beta = tok(beta.p, dt, T, HV, 0), wp.A = tok(A.p, dt, T, HV, 64);
    wp.dw = p.dw, wp.du = hp.dv2, wp.g = p.g;
    wp.dk = p.dk, wp.dv = tok(dvo.p, dt, T, HV, V), wp.dbeta = tok(dbeta.p, STRATA_DTYPE_F32, T, HV, 0);
    wp.dg = p.dg;
    wp.dk_add = p.dq, wp.dg_add = p.dg;  // as the composed backward (f32 addends; dg_add aliases dg)
    Dev ws4(prepare_wy_repr_bwd_cuda_mma_workspace(d));
    auto wy_call = [&](int var) {
      return std::function<void()>([&, var] {
        WyBwdParams pv = wp;
        pv.mma_variant = var;
        EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(pv, ws4.p, nullptr), STRATA_SUCCESS);
      });
    };
    const std::vector<double> other =
        time_min_ms({[&] { EXPECT_EQ(chunk_bwd_dv_local_cuda_mma(vp, ws3.p, nullptr), STRATA_SUCCESS); },
                     wy_call(kWyPipelined), wy_call(kWyTwoPerSm)});
    report(fmt_line("[gdn_bwd timing] bf16 B=%lld T=%lld: chunk_bwd_dv_local %.3f ms, prepare_wy_repr_bwd (fused sums) "
                    "pipelined %.3f ms, two_per_sm %.3f ms", static_cast<long long>(B), static_cast<long long>(T),
                    other[0], other[1], other[2]));
  }
}

// The whole composed backward (gdn_cuda_bwd: the re-run forward, bwd_dhu, dqkwg, prepare_wy_repr_bwd and the tail)
// at the benchmark shapes, bf16 tensors (cudaMemset fill: q, k, v, do, β ≈ 0.0115, g ≈ −0.0115), l2norm in the
// kernel: bwd_dhu on the mma.sync kernel (kDhuMmaAuto) against the automatic choice (the warpgroup-MMA one where it
// runs), and
// the composed forward (gdn_cuda_fwd: l2norm, γ, WY, the state pass writing h and
// v_new, chunk_fwd_o) as an upper bound of the backward's re-run part. Fails only if a launch fails.
TEST(GdnBwdCudaVariants, WholeBackwardTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B;
    const gdn_test::GdnBenchProblem bench(B, T, 16, 32, 128, 128, /*saved=*/false);
    const GdnParams p = bench.p, pf = bench.fwd();
    Dev ws(gdn_cuda_bwd_workspace(p));
    Dev wsf(gdn_cuda_fwd_workspace(pf));
    const std::vector<double> ms = time_min_ms(
        {[&] { EXPECT_EQ(gdn_cuda_bwd(p, ws.p, nullptr, nullptr, kDhuMmaAuto), STRATA_SUCCESS); },
         [&] { EXPECT_EQ(gdn_cuda_bwd(p, ws.p, nullptr, nullptr, kDhuAuto), STRATA_SUCCESS); },
         [&] { EXPECT_EQ(gdn_cuda_fwd(pf, wsf.p, nullptr), STRATA_SUCCESS); }},
        5);
    report(fmt_line("[gdn_bwd timing] whole backward bf16 B=%lld T=%lld H=16 HV=32 K=V=128 l2norm: bwd_dhu mma.sync "
                    "%.3f ms, bwd_dhu automatic (wgmma where it runs) %.3f ms; composed forward with h, v_new, o %.3f ms",
                    static_cast<long long>(B), static_cast<long long>(T), ms[0], ms[1], ms[2]));
    // Per step (GdnStepProbe: an event after each step's launches; the fastest of 3 calls per step).
    for (const int dhu_variant : {kDhuMmaAuto, kDhuAuto, kDhuWgmmaAhead, kDhuWgmmaAheadHalfP}) {
      const gdn_test::StepTimes st = gdn_test::time_steps(
          [&](const GdnStepProbe* probe) {
            EXPECT_EQ(gdn_cuda_bwd(p, ws.p, nullptr, probe, dhu_variant), STRATA_SUCCESS);
          },
          3);
      std::string line = fmt_line("[gdn_bwd timing] backward steps bf16 B=%lld T=%lld (%s):", static_cast<long long>(B),
                                  static_cast<long long>(T),
                                  dhu_variant == kDhuAuto        ? "bwd_dhu automatic"
                                  : dhu_variant == kDhuWgmmaAhead ? "bwd_dhu wgmma ahead"
                                  : dhu_variant == kDhuWgmmaAheadHalfP ? "bwd_dhu wgmma ahead, half P"
                                                                  : "bwd_dhu mma.sync");
      for (size_t i = 0; i < st.ms.size() && i < st.names.size(); ++i)
        line += fmt_line(" %s %.3f ms%s", st.names[i].c_str(), st.ms[i], i + 1 < st.ms.size() ? "," : "");
      report(line);
    }
  }
}


// The warpgroup-MMA bwd_dhu against the mma.sync kernel at the benchmark shapes (bf16, HV = 32, K = V = 128,
// cudaMemset inputs), fused dv_local (the composed backward's call) and dv read, every column width.
TEST(GdnBwdCudaVariants, DhuWgmmaTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // STRATA_DHU_TIMING_B=1 (or 4): that batch size only (a profiler run of one shape).
  const char* only = std::getenv("STRATA_DHU_TIMING_B");
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    if (only != nullptr && std::atoll(only) != B) continue;
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, NT = T / 64, rows = B * T;
    const int32_t dt = STRATA_DTYPE_BF16;
    Dev q(rows * H * K * 2), k(rows * H * K * 2), w(rows * HV * K * 2), dout(rows * HV * V * 2), dv(rows * HV * V * 2),
        g(rows * HV * 4), dh(B * NT * HV * K * V * 2), dv2(rows * HV * V * 2), dh0(B * HV * K * V * 4);
    for (Dev* x : {&q, &k, &w, &dout, &dv}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    Dims d;
    d.B = B, d.T = T, d.H = H, d.HV = HV, d.G = HV / H, d.K = K, d.V = V, d.N = B, d.NT = NT, d.BT = 64;
    DhuParams hp;
    hp.d = d;
    hp.q = tok(q.p, dt, T, H, K), hp.k = tok(k.p, dt, T, H, K), hp.w = tok(w.p, dt, T, HV, K);
    hp.dout = tok(dout.p, dt, T, HV, V), hp.dv = tok(dv.p, dt, T, HV, V), hp.g = tok(g.p, STRATA_DTYPE_F32, T, HV, 0);
    hp.dh = states(dh.p, dt, NT, HV, K, V);
    hp.dh0 = states(dh0.p, STRATA_DTYPE_F32, 0, HV, K, V);
    hp.dh0.s[0] = HV * K * V, hp.dh0.s[1] = K * V, hp.dh0.s[2] = V;
    hp.dv2 = tok(dv2.p, dt, T, HV, V);
    hp.scale = 0.0884f;
    Dev ws(chunk_gated_delta_rule_bwd_dhu_cuda_mma_workspace(d));
    auto call = [&](int var, bool fuse, int cols) {
      return std::function<void()>([&, var, fuse, cols] {
        DhuParams x = hp;
        x.mma_variant = var, x.wgmma_cols = cols;
        if (fuse) x.dv = View{}, x.fuse_dv_local = true;
        EXPECT_EQ(chunk_gated_delta_rule_bwd_dhu_cuda_mma(x, ws.p, nullptr), STRATA_SUCCESS);
      });
    };
    int sms = 0;
    EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    const int auto_cols = dhu_wgmma_cols(d, sms, 0);
    for (const bool fuse : {true, false}) {
      const std::vector<double> ms =
          time_min_ms({call(kDhuMmaAuto, fuse, 0), call(kDhuWgmma, fuse, 0), call(kDhuWgmma, fuse, 16),
                       call(kDhuWgmma, fuse, 32), call(kDhuWgmma, fuse, 64), call(kDhuWgmmaTma, fuse, 0),
                       call(kDhuWgmmaTma, fuse, 16), call(kDhuWgmmaTma, fuse, 32), call(kDhuWgmmaTma, fuse, 64),
                       call(kDhuWgmmaAhead, fuse, 0), call(kDhuWgmmaAhead, fuse, 16), call(kDhuWgmmaAhead, fuse, 32),
                       call(kDhuWgmmaAhead, fuse, 64), call(kDhuWgmmaAheadHalfP, fuse, 0),
                       call(kDhuWgmmaAheadHalfP, fuse, 16), call(kDhuWgmmaAheadHalfP, fuse, 32),
                       call(kDhuWgmmaAheadHalfP, fuse, 64), call(kDhuWgmmaSplit, fuse, 16),
                       call(kDhuWgmmaAheadHalfPBox5, fuse, 0), call(kDhuWgmmaAheadHalfPBox5, fuse, 16),
                       call(kDhuWgmmaAheadHalfPBox5, fuse, 32), call(kDhuWgmmaAheadHalfPBox5, fuse, 64),
                       call(kDhuAuto, fuse, 0)},
                      5);
      report(fmt_line("[gdn_bwd timing] bwd_dhu %s bf16 B=%lld T=%lld HV=32 K=V=128: mma.sync (automatic tiles) %.3f ms, "
                      "wgmma (automatic: %d columns per warpgroup) %.3f ms; wgmma 16 / 32 / 64 columns %.3f / %.3f / %.3f ms; "
                      "wgmma tma %.3f ms (%.3f / %.3f / %.3f ms); wgmma ahead %.3f ms (%.3f / %.3f / %.3f ms); "
                      "ahead, half P %.3f ms (%.3f / %.3f / %.3f ms); split (16 columns) %.3f ms",
                      fuse ? "with fused dv_local" : "dv read", static_cast<long long>(B), static_cast<long long>(T),
                      ms[0], auto_cols, ms[1], ms[2], ms[3], ms[4], ms[5], ms[6], ms[7], ms[8], ms[9], ms[10], ms[11],
                      ms[12], ms[13], ms[14], ms[15], ms[16], ms[17]));
      report(fmt_line("[gdn_bwd timing] bwd_dhu %s bf16 B=%lld T=%lld HV=32 K=V=128 (session 13): half P %.3f ms, "
                      "half P 5-D boxes %.3f ms (16 / 32 / 64 columns %.3f / %.3f / %.3f ms); split (16 columns) %.3f "
                      "ms; automatic %.3f ms",
                      fuse ? "with fused dv_local" : "dv read", static_cast<long long>(B), static_cast<long long>(T),
                      ms[13], ms[18], ms[19], ms[20], ms[21], ms[17], ms[22]));
    }
  }
}

}  // namespace
}  // namespace strata::linear_attn

#endif  // STRATA_WITH_CUDA
