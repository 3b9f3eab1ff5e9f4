// prepare_wy_repr_bwd's dk_add epilogue forms of the two-per-SM kernel against kWyTwoPerSm (dk_add pair by pair), in
// the three call forms (plain; the composed backward's f32 addends with dg_add aliasing dg; dk aliasing dk_add as
// well) and with dv in f32, on shapes with partial chunks, variable-length packs, G = 1, 2, 3, K = V = 64 and 128 (and
// tails), no gate, f16: kWyBatchedTyped (session 13: each fragment row's dk_add values loaded before its first dk
// store, each head's dg_add fetched at its start, dv stored by row pointers when it holds the token dtype; what
// kWyAuto ran until session 14) and kWyTrimmed (session 14, what kWyAuto runs: no dP work in the warp blocks above
// the diagonal, full dv tiles stored without per-pair checks): every output the same bits (the same products and
// additions).
// `GdnWyBwdEpilogue.Timing` times the forms at the benchmark shapes (B = 4, T = 8192 and B = 1, T = 32768, H = 16,
// HV = 32, K = V = 128, bf16), with and without the fused sums, and prints the figures.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"
#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"

namespace strata::linear_attn {
namespace {

using gdn_bwd::Dims;
using gdn_test::random_bytes;
using gdn_test::tok;
using gdn_test::upload;
using test::Dev;
using test::have_gpu;

struct WyShape {
  int64_t B, T, H, HV, K, V;
  std::vector<int64_t> cu;  // empty: fixed length
  int32_t dt;
  bool gate;
};

// Inputs of one shape on the device (chunk size 64) and the views of a call; outputs poisoned per call.
struct WyCase {
  WyShape s;
  Dims d;
  std::unique_ptr<Dev> cu, k, v, beta, A, dw, du, g, dk_add, dg0;
  WyCase(const WyShape& sh, uint64_t seed) : s(sh) {
    std::mt19937_64 rng(seed);
    const int64_t rows = s.B * s.T;
    cu = upload(s.cu.data(), s.cu.size() * 8);
    k = upload(random_bytes(rows * s.H * s.K, s.dt, rng, 1.0 / std::sqrt(static_cast<double>(s.K))));
    v = upload(random_bytes(rows * s.HV * s.V, s.dt, rng, 1.0));
    beta = upload(random_bytes(rows * s.HV, s.dt, rng, 0.5));
    A = upload(random_bytes(rows * s.HV * 64, s.dt, rng, 0.25));
    dw = upload(random_bytes(rows * s.HV * s.K, s.dt, rng, 1.0));
    du = upload(random_bytes(rows * s.HV * s.V, s.dt, rng, 1.0));
    g = upload(random_bytes(rows * s.HV, STRATA_DTYPE_F32, rng, 0, -3.0));
    dk_add = upload(random_bytes(rows * s.H * s.K, STRATA_DTYPE_F32, rng, 1.0));
    dg0 = upload(random_bytes(rows * s.HV, STRATA_DTYPE_F32, rng, 1.0));
    d.B = s.B, d.T = s.T, d.H = s.H, d.HV = s.HV, d.G = s.HV / s.H, d.K = s.K, d.V = s.V, d.BT = 64, d.NT = 0;
    d.N = s.cu.empty() ? s.B : static_cast<int64_t>(s.cu.size()) - 1;
    d.cu = s.cu.empty() ? nullptr : static_cast<const int64_t*>(cu->p);
  }

  // form 0: plain; 1: dk_add (f32) and dg_add aliasing dg (pre-filled); 2: as 1 with dk aliasing dk_add (dk
  // pre-filled with the addend). dv_f32: dv in f32 instead of the token dtype. The bits of dk, dv, dbeta, dg.
  std::vector<std::vector<uint8_t>> run(int variant, int form, bool dv_f32 = false) const {
    const int64_t rows = s.B * s.T;
    const int32_t dv_dt = dv_f32 ? STRATA_DTYPE_F32 : s.dt;
    Dev dk(rows * s.H * s.K * 4), dv(rows * s.HV * s.V * dtype_size(dv_dt)), dbeta(rows * s.HV * 4),
        dg(rows * s.HV * 4);
    dk.poison(), dv.poison(), dbeta.poison(), dg.poison();
    if (form > 0) EXPECT_EQ(cudaMemcpy(dg.p, dg0->p, dg.bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
    if (form == 2) EXPECT_EQ(cudaMemcpy(dk.p, dk_add->p, dk.bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
    WyBwdParams p;
    p.d = d;
    p.k = tok(k->p, s.dt, s.T, s.H, s.K), p.v = tok(v->p, s.dt, s.T, s.HV, s.V);
    p.beta = tok(beta->p, s.dt, s.T, s.HV, 0), p.A = tok(A->p, s.dt, s.T, s.HV, 64);
    p.dw = tok(dw->p, s.dt, s.T, s.HV, s.K), p.du = tok(du->p, s.dt, s.T, s.HV, s.V);
    if (s.gate) p.g = tok(g->p, STRATA_DTYPE_F32, s.T, s.HV, 0), p.dg = tok(dg.p, STRATA_DTYPE_F32, s.T, s.HV, 0);
    p.dk = tok(dk.p, STRATA_DTYPE_F32, s.T, s.H, s.K), p.dv = tok(dv.p, dv_dt, s.T, s.HV, s.V);
    p.dbeta = tok(dbeta.p, STRATA_DTYPE_F32, s.T, s.HV, 0);
    if (form > 0) {
      p.dk_add = form == 2 ? p.dk : tok(dk_add->p, STRATA_DTYPE_F32, s.T, s.H, s.K);
      if (s.gate) p.dg_add = p.dg;
    }
    p.mma_variant = variant;
    Dev ws(prepare_wy_repr_bwd_cuda_mma_workspace(p.d));
    EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(p, ws.p, nullptr), STRATA_SUCCESS) << "variant " << variant;
    return {dk.bits(), dv.bits(), dbeta.bits(), s.gate ? dg.bits() : std::vector<uint8_t>{}};
  }
};

const std::vector<WyShape>& epilogue_shapes() {
  const int32_t bf = STRATA_DTYPE_BF16, f16 = STRATA_DTYPE_F16;
  static const std::vector<WyShape> shapes = {
      {2, 130, 2, 4, 128, 128, {}, bf, true},                       // partial chunk, G = 2
      {1, 200, 2, 6, 128, 128, {0, 63, 127, 129, 192, 200}, bf, true},  // varlen, G = 3
      {1, 65, 1, 1, 128, 128, {}, bf, false},                       // G = 1 (the first head is the last), no gate
      {1, 190, 2, 4, 100, 100, {}, f16, true},                      // K = V = 100 (P = 128, tails), f16
      {2, 100, 1, 2, 64, 64, {}, bf, true},                         // P = 64
      {1, 150, 1, 3, 48, 40, {0, 1, 64, 65, 150}, f16, true},       // P = 64 with tails, varlen
  };
  return shapes;
}

const char* const kOutNames[] = {"dk", "dv", "dbeta", "dg"};

TEST(GdnWyBwdEpilogue, SameBitsAsTwoPerSm) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const char* const* names = kOutNames;
  uint64_t seed = 1201;
  for (const WyShape& s : epilogue_shapes()) {
    const WyCase c(s, seed++);
    for (int form = 0; form < 4; ++form) {  // form 3: form 1 with dv in f32 (the dtype-generic dv stores)
      const bool dv_f32 = form == 3;
      const int call = dv_f32 ? 1 : form;
      const auto a = c.run(kWyTwoPerSm, call, dv_f32);
      for (const int variant : {kWyBatchedTyped, kWyTrimmed, kWyAuto}) {
        const auto b = c.run(variant, call, dv_f32);
        for (size_t i = 0; i < a.size(); ++i)
          EXPECT_TRUE(a[i] == b[i]) << names[i] << " differs: variant " << variant << " form " << form << " B=" << s.B
                                    << " T=" << s.T << " HV=" << s.HV << " K=" << s.K << " V=" << s.V;
      }
    }
  }
}

// The variants at the benchmark shapes with the composed backward's fused sums (dk_add a separate f32 tensor,
// dg_add aliasing dg) and without them: interleaved calls, each timed by its own event pair, median of 9.
TEST(GdnWyBwdEpilogue, Timing) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, rows = B * T;
    const int32_t dt = STRATA_DTYPE_BF16;
    Dev k(rows * H * K * 2), v(rows * HV * V * 2), beta(rows * HV * 2), A(rows * HV * 64 * 2), dw(rows * HV * K * 2),
        du(rows * HV * V * 2), g(rows * HV * 4), dk(rows * H * K * 4), dk_add(rows * H * K * 4),
        dv(rows * HV * V * 2), dbeta(rows * HV * 4), dg(rows * HV * 4);
    for (Dev* x : {&k, &v, &beta, &A, &dw, &du, &dk_add}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(dg.p, 0, dg.bytes), cudaSuccess);
    WyBwdParams p;
    p.d.B = B, p.d.T = T, p.d.H = H, p.d.HV = HV, p.d.G = HV / H, p.d.K = K, p.d.V = V, p.d.N = B, p.d.BT = 64;
    p.k = tok(k.p, dt, T, H, K), p.v = tok(v.p, dt, T, HV, V), p.beta = tok(beta.p, dt, T, HV, 0);
    p.A = tok(A.p, dt, T, HV, 64), p.dw = tok(dw.p, dt, T, HV, K), p.du = tok(du.p, dt, T, HV, V);
    p.g = tok(g.p, STRATA_DTYPE_F32, T, HV, 0);
    p.dk = tok(dk.p, STRATA_DTYPE_F32, T, H, K), p.dv = tok(dv.p, dt, T, HV, V);
    p.dbeta = tok(dbeta.p, STRATA_DTYPE_F32, T, HV, 0), p.dg = tok(dg.p, STRATA_DTYPE_F32, T, HV, 0);
    Dev ws(prepare_wy_repr_bwd_cuda_mma_workspace(p.d));
    const int variants[] = {kWyTwoPerSm, kWyBatchedTyped, kWyTrimmed};
    constexpr int kN = sizeof(variants) / sizeof(variants[0]);
    for (const bool fused : {true, false}) {
      WyBwdParams q = p;
      if (fused) q.dk_add = tok(dk_add.p, STRATA_DTYPE_F32, T, H, K), q.dg_add = q.dg;
      cudaEvent_t e[2];
      cudaEventCreate(&e[0]), cudaEventCreate(&e[1]);
      std::vector<float> ms[kN];
      for (int rep = 0; rep < 10; ++rep)
        for (int vi = 0; vi < kN; ++vi) {
          q.mma_variant = variants[vi];
          cudaEventRecord(e[0]);
          EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(q, ws.p, nullptr), STRATA_SUCCESS);
          cudaEventRecord(e[1]);
          cudaEventSynchronize(e[1]);
          float t = 0.f;
          cudaEventElapsedTime(&t, e[0], e[1]);
          if (rep > 0) ms[vi].push_back(t);  // (the first round warms up)
        }
      cudaEventDestroy(e[0]), cudaEventDestroy(e[1]);
      for (auto& m : ms) std::sort(m.begin(), m.end());
      std::printf("[wy_bwd s14] bf16 B=%lld T=%lld H=16 HV=32 K=V=128 %s: two_per_sm %.3f ms, batched_typed %.3f ms, "
                  "trimmed %.3f ms (median of 9; min %.3f / %.3f / %.3f)\n",
                  static_cast<long long>(B), static_cast<long long>(T), fused ? "fused sums" : "plain", ms[0][4],
                  ms[1][4], ms[2][4], ms[0][0], ms[1][0], ms[2][0]);
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace strata::linear_attn
#endif
