// prepare_wy_repr_bwd's dk_add epilogue forms of the two-per-SM kernel against kWyTwoPerSm (dk_add pair by pair), in
// the three call forms (plain; the composed backward's f32 addends with dg_add aliasing dg; dk aliasing dk_add as
// well) and with dv in f32, on shapes with partial chunks, variable-length packs, G = 1, 2, 3, K = V = 64 and 128 (and
// tails), no gate, f16: kWyBatchedTyped (session 13: each fragment row's dk_add values loaded before its first dk
// store, each head's dg_add fetched at its start, dv stored by row pointers when it holds the token dtype; what
// kWyAuto ran until session 14) and kWyTrimmed (session 14, what kWyAuto runs: no dP work in the warp blocks above
// the diagonal, full dv tiles stored without per-pair checks): every output the same bits (the same products and
// additions).
// `GdnWyBwdEpilogue.NormFold` (session 15's kWyFinStaged, restored in session 16): kWyFinStaged with
// WyBwdParams::dk_rstd (dk through the l2norm backward after the head loop) against the plain kWyTrimmed call's f32 dk
// put through the l2norm backward in float64 on the host; `ComposedDkFold`: the composed chunk_gated_delta_rule
// backward with the fold (gdn_cuda_bwd's wy_variant kWyFinStaged) against its row_norm_bwd tail.
// `GdnWyBwdEpilogue.Timing` times the forms at the benchmark shapes (B = 4, T = 8192 and B = 1, T = 32768, H = 16,
// HV = 32, K = V = 128, bf16), with and without the fused sums, the fold against kWyTrimmed + row_norm_bwd, and
// `ComposedDkFoldTiming` the composed backward reading `saved` with and without the fold; they print the figures.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"
#include "ops/norm/common/row_norm.h"
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
  std::vector<uint8_t> k_host;  // k's bits (the host reference of the folded l2norm backward)
  WyCase(const WyShape& sh, uint64_t seed) : s(sh) {
    std::mt19937_64 rng(seed);
    const int64_t rows = s.B * s.T;
    cu = upload(s.cu.data(), s.cu.size() * 8);
    k_host = random_bytes(rows * s.H * s.K, s.dt, rng, 1.0 / std::sqrt(static_cast<double>(s.K)));
    k = upload(k_host);
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
  // pre-filled with the addend). dv_f32: dv in f32 instead of the token dtype. rstd (f32 [B, T, H]): dk through the
  // folded l2norm backward (WyBwdParams::dk_rstd), in dtype dk_dt. The bits of dk, dv, dbeta, dg.
  std::vector<std::vector<uint8_t>> run(int variant, int form, bool dv_f32 = false, const Dev* rstd = nullptr,
                                        int32_t dk_dt = STRATA_DTYPE_F32) const {
    const int64_t rows = s.B * s.T;
    const int32_t dv_dt = dv_f32 ? STRATA_DTYPE_F32 : s.dt;
    Dev dk(rows * s.H * s.K * dtype_size(dk_dt)), dv(rows * s.HV * s.V * dtype_size(dv_dt)), dbeta(rows * s.HV * 4),
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
    p.dk = tok(dk.p, dk_dt, s.T, s.H, s.K), p.dv = tok(dv.p, dv_dt, s.T, s.HV, s.V);
    if (rstd) p.dk_rstd = tok(rstd->p, STRATA_DTYPE_F32, s.T, s.H, 0);
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
      for (const int variant : {kWyBatchedTyped, kWyTrimmed, kWyFinStaged, kWyAuto}) {
        const auto b = c.run(variant, call, dv_f32);
        for (size_t i = 0; i < a.size(); ++i)
          EXPECT_TRUE(a[i] == b[i]) << names[i] << " differs: variant " << variant << " form " << form << " B=" << s.B
                                    << " T=" << s.T << " HV=" << s.HV << " K=" << s.K << " V=" << s.V;
      }
    }
  }
}

// kWyFinStaged with dk_rstd (the l2norm backward folded into the dk epilogue) against the plain kWyTrimmed call's f32
// dk y put through dk = r (y − (y · k) k) in float64 on the host (k the token-dtype keys the kernel reads, r a random
// rstd in [0.5, 2]), plain and with the fused sums (form 0, 1), dk in f32 and in the token dtype; dv, dβ, dγ the same
// bits as the plain call. Bound per element: 4e-6 of the row's scale r (max |y| + Σ |y k| max |k|) (the f32 sums
// in another order), plus half an ulp of the 16-bit output (at most 2^-8 or 2^-11 of |ref|, with slack).
TEST(GdnWyBwdEpilogue, NormFold) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1501;
  for (const WyShape& s : epilogue_shapes()) {
    const WyCase c(s, seed++);
    const int64_t rows = s.B * s.T * s.H;
    std::mt19937_64 rng(seed + 77);
    std::uniform_real_distribution<float> ud(0.5f, 2.f);
    std::vector<float> r(rows);
    for (float& x : r) x = ud(rng);
    const auto rstd = upload(r.data(), r.size() * 4);
    std::vector<double> kd(rows * s.K);
    for (int64_t i = 0; i < rows * s.K; ++i) {
      uint16_t b;
      std::memcpy(&b, c.k_host.data() + 2 * i, 2);
      kd[i] = s.dt == STRATA_DTYPE_BF16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
    }
    for (int form = 0; form < 2; ++form) {
      const auto plain = c.run(kWyTrimmed, form);
      std::vector<float> y(rows * s.K);
      std::memcpy(y.data(), plain[0].data(), y.size() * 4);
      std::vector<double> ref(rows * s.K), tol(rows);
      for (int64_t row = 0; row < rows; ++row) {
        double dot = 0, ymax = 0, kmax = 0, yk = 0;
        for (int64_t x = 0; x < s.K; ++x) {
          dot += static_cast<double>(y[row * s.K + x]) * kd[row * s.K + x];
          yk += std::fabs(static_cast<double>(y[row * s.K + x]) * kd[row * s.K + x]);
          ymax = std::max(ymax, std::fabs(static_cast<double>(y[row * s.K + x])));
          kmax = std::max(kmax, std::fabs(kd[row * s.K + x]));
        }
        for (int64_t x = 0; x < s.K; ++x) ref[row * s.K + x] = r[row] * (y[row * s.K + x] - dot * kd[row * s.K + x]);
        tol[row] = 4e-6 * r[row] * (ymax + yk * kmax);
      }
      for (const int32_t dk_dt : {int32_t{STRATA_DTYPE_F32}, s.dt}) {
        const auto got = c.run(kWyFinStaged, form, false, rstd.get(), dk_dt);
        for (size_t i = 1; i < got.size(); ++i)
          EXPECT_TRUE(got[i] == plain[i]) << kOutNames[i] << " differs: form " << form << " B=" << s.B << " T=" << s.T
                                          << " HV=" << s.HV << " K=" << s.K;
        // half an ulp of the 16-bit output: at most 2^-8 (bf16) or 2^-11 (f16) of |ref|
        const double ulp = dk_dt == STRATA_DTYPE_F32 ? 0 : dk_dt == STRATA_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048;
        int bad = 0;
        for (int64_t i = 0; i < rows * s.K; ++i) {
          double v;
          if (dk_dt == STRATA_DTYPE_F32) {
            float f;
            std::memcpy(&f, got[0].data() + 4 * i, 4);
            v = f;
          } else {
            uint16_t b;
            std::memcpy(&b, got[0].data() + 2 * i, 2);
            v = dk_dt == STRATA_DTYPE_BF16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
          }
          const double bound = tol[i / s.K] + ulp * 1.01 * std::fabs(ref[i]);
          if (!(std::fabs(v - ref[i]) <= bound) && bad++ < 5)
            ADD_FAILURE() << "dk[" << i << "] = " << v << ", float64 " << ref[i] << " (bound " << bound << "): form "
                          << form << " dk dtype " << dk_dt << " B=" << s.B << " T=" << s.T << " HV=" << s.HV
                          << " K=" << s.K;
        }
      }
    }
  }
}

// dk_rstd is taken by the two-per-SM kernel in the kWyFinStaged form only (kWyAuto: only if the automatic form is
// kWyFinStaged); other variants, shapes, an rstd not in f32 and the FMA kernel refuse it with a reason (host checks:
// run without a GPU).
TEST(GdnWyBwdEpilogue, NormFoldRejects) {
  float x = 0.f;
  WyBwdParams w;
  w.d.K = 128, w.d.V = 128;
  w.k.dtype = w.v.dtype = w.A.dtype = w.dw.dtype = w.du.dtype = STRATA_DTYPE_BF16;
  w.dk_rstd.p = &x;
  w.mma_variant = kWyFinStaged;
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma_reject(w), "");
  for (const int variant : {kWyPipelined, kWyTwoPerSm, kWyBatchedTyped, kWyTrimmed}) {
    w.mma_variant = variant;
    EXPECT_NE(prepare_wy_repr_bwd_cuda_mma_reject(w), "") << variant;
  }
  w.mma_variant = kWyAuto;
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma_reject(w).empty(), prepare_wy_repr_bwd_auto_variant() == kWyFinStaged);
  w.mma_variant = kWyFinStaged;
  w.d.V = 192;
  EXPECT_NE(prepare_wy_repr_bwd_cuda_mma_reject(w), "");
  w.d.K = w.d.V = 256;
  EXPECT_NE(prepare_wy_repr_bwd_cuda_mma_reject(w), "");
  w.d.K = w.d.V = 64;
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma_reject(w), "");
  w.dk_rstd.dtype = STRATA_DTYPE_BF16;
  EXPECT_NE(prepare_wy_repr_bwd_cuda_mma_reject(w), "");
  EXPECT_EQ(prepare_wy_repr_bwd_cuda_fma(w, nullptr, nullptr), STRATA_ERROR_UNSUPPORTED);
}

// A chunk_gated_delta_rule problem on the device (l2norm; the backward re-computing the forward): random q, k, v,
// do and β in the token dtype dt, log-space gates in f32, no h0 / dht; gdn_cuda_bwd's outputs (dq, dk, dv, dβ in dt;
// dg f32) poisoned before each call.
struct GdnCase {
  GdnParams p;
  std::unique_ptr<Dev> cu, q, k, v, g, beta, dout, dq, dk, dv, dg, dbeta;
  GdnCase(int32_t dt, int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, std::vector<int64_t> cus,
          uint64_t seed) {
    std::mt19937_64 rng(seed);
    const int64_t rows = B * T;
    const int32_t f32 = STRATA_DTYPE_F32;
    cu = upload(cus.data(), cus.size() * 8);
    q = upload(random_bytes(rows * H * K, dt, rng, 1.0)), k = upload(random_bytes(rows * H * K, dt, rng, 1.0));
    v = upload(random_bytes(rows * HV * V, dt, rng, 1.0)), dout = upload(random_bytes(rows * HV * V, dt, rng, 1.0));
    g = upload(random_bytes(rows * HV, f32, rng, 0, -0.5));
    std::vector<uint16_t> b(rows * HV);  // β in (0.1, 0.9), token dtype
    std::uniform_real_distribution<float> ub(0.1f, 0.9f);
    for (uint16_t& x : b) x = dt == STRATA_DTYPE_BF16 ? f32_to_bf16_bits(ub(rng)) : f32_to_f16_bits(ub(rng));
    beta = upload(b.data(), b.size() * 2);
    dq = std::make_unique<Dev>(rows * H * K * dtype_size(dt)), dk = std::make_unique<Dev>(rows * H * K * dtype_size(dt));
    dv = std::make_unique<Dev>(rows * HV * V * dtype_size(dt));
    dg = std::make_unique<Dev>(rows * HV * 4), dbeta = std::make_unique<Dev>(rows * HV * dtype_size(dt));
    auto t = [&](Dev& x, int32_t xt, int64_t heads, int64_t D) { return gdn_test::op_tok(x.p, xt, T, heads, D); };
    p.q = t(*q, dt, H, K), p.k = t(*k, dt, H, K), p.v = t(*v, dt, HV, V), p.do_ = t(*dout, dt, HV, V);
    p.g = t(*g, f32, HV, 0), p.beta = t(*beta, dt, HV, 0);
    p.dq = t(*dq, dt, H, K), p.dk = t(*dk, dt, H, K), p.dv = t(*dv, dt, HV, V);
    p.dg = t(*dg, f32, HV, 0), p.dbeta = t(*dbeta, dt, HV, 0);
    p.cu_seqlens = cus.empty() ? nullptr : static_cast<const int64_t*>(cu->p);
    p.B = B, p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V;
    p.N = cus.empty() ? B : static_cast<int64_t>(cus.size()) - 1;
    p.scale = 0.3f;
    p.l2norm = true;
  }
  // The bits of dq, dk, dv, dg, dβ after gdn_cuda_bwd with prepare_wy_repr_bwd form wy_variant.
  std::vector<std::vector<uint8_t>> bwd(int wy_variant) const {
    for (Dev* x : {dq.get(), dk.get(), dv.get(), dg.get(), dbeta.get()}) x->poison();
    Dev ws(gdn_cuda_bwd_workspace(p));
    EXPECT_EQ(gdn_cuda_bwd(p, ws.p, nullptr, nullptr, 0, wy_variant), STRATA_SUCCESS);
    return {dq->bits(), dk->bits(), dv->bits(), dg->bits(), dbeta->bits()};
  }
};

// The composed backward with dk's l2norm backward folded into prepare_wy_repr_bwd (wy_variant kWyFinStaged) against
// its row_norm_bwd tail (kWyTrimmed): dq, dv, dg, dβ the same bits (the same kernels), dk within one ulp of the
// 16-bit output plus 1e-5 of the row's largest |dk| (both round the same f32 formula, summed in another order),
// on shapes with partial chunks, varlen, G = 1-3, K = V = 64 / 100 / 128, bf16 and f16; and a shape the fold does not
// take (V = 64 with K = 128: gdn_cuda_bwd_dk_fold_reject says why) giving the same bits as the tail.
TEST(GdnWyBwdEpilogue, ComposedDkFold) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int32_t bf = STRATA_DTYPE_BF16, f16 = STRATA_DTYPE_F16;
  struct Shape {
    int32_t dt;
    int64_t B, T, H, HV, K, V;
    std::vector<int64_t> cu;
  };
  const std::vector<Shape> shapes = {{bf, 2, 130, 2, 4, 128, 128, {}},
                                     {f16, 1, 200, 1, 3, 64, 64, {0, 63, 129, 200}},
                                     {bf, 1, 100, 2, 2, 100, 100, {}},
                                     {bf, 1, 90, 1, 2, 128, 64, {}}};
  const char* const names[] = {"dq", "dk", "dv", "dg", "dbeta"};
  uint64_t seed = 1601;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "dt=" << s.dt << " B=" << s.B << " T=" << s.T << " HV=" << s.HV
                                      << " K=" << s.K << " V=" << s.V);
    const GdnCase c(s.dt, s.B, s.T, s.H, s.HV, s.K, s.V, s.cu, seed++);
    const bool folds = gdn_cuda_bwd_dk_fold_reject(c.p).empty();
    EXPECT_EQ(folds, s.K == s.V) << gdn_cuda_bwd_dk_fold_reject(c.p);
    const auto a = c.bwd(kWyTrimmed), b = c.bwd(kWyFinStaged);
    for (size_t i = 0; i < a.size(); ++i)
      if (i != 1 || !folds) EXPECT_TRUE(a[i] == b[i]) << names[i] << " differs";
    if (!folds) continue;
    const double ulp = s.dt == bf ? 1.0 / 128 : 1.0 / 1024;  // one ulp of the output: at most this much of |x|
    const int64_t n = s.B * s.T * s.H * s.K;
    auto at = [&](const std::vector<uint8_t>& x, int64_t i) {
      uint16_t h;
      std::memcpy(&h, x.data() + 2 * i, 2);
      return static_cast<double>(s.dt == bf ? bf16_bits_to_f32(h) : f16_bits_to_f32(h));
    };
    int bad = 0;
    for (int64_t row = 0; row < n / s.K; ++row) {
      double rmax = 0;
      for (int64_t x = 0; x < s.K; ++x) rmax = std::max(rmax, std::fabs(at(a[1], row * s.K + x)));
      for (int64_t x = 0; x < s.K; ++x) {
        const double u = at(a[1], row * s.K + x), w = at(b[1], row * s.K + x);
        const double bound = ulp * std::max(std::fabs(u), std::fabs(w)) + 1e-5 * rmax;
        if (!(std::fabs(u - w) <= bound) && bad++ < 5)
          ADD_FAILURE() << "dk[" << row * s.K + x << "]: folded " << w << ", row_norm_bwd tail " << u;
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
      std::printf("[wy_bwd s16] bf16 B=%lld T=%lld H=16 HV=32 K=V=128 %s: two_per_sm %.3f ms, batched_typed %.3f ms, "
                  "trimmed %.3f ms (median of 9; min %.3f / %.3f / %.3f)\n",
                  static_cast<long long>(B), static_cast<long long>(T), fused ? "fused sums" : "plain", ms[0][4],
                  ms[1][4], ms[2][4], ms[0][0], ms[1][0], ms[2][0]);
      std::fflush(stdout);
    }
    // dk's l2norm backward, with the fused sums: (0) kWyTrimmed writing f32 dk, then row_norm_bwd (rstd, k, f32 dk →
    // bf16 dk: the composed backward's tail step for dk); (1) kWyFinStaged with dk_rstd writing bf16 dk
    // (wy_store_dk_norm_staged). Each side timed by one event pair around its launches, interleaved, median of 9.
    {
      Dev rk(rows * H * 4), dk16(rows * H * K * 2);
      EXPECT_EQ(cudaMemset(rk.p, 0x3f, rk.bytes), cudaSuccess);
      WyBwdParams q = p;
      q.dk_add = tok(dk_add.p, STRATA_DTYPE_F32, T, H, K), q.dg_add = q.dg;
      q.mma_variant = kWyTrimmed;
      WyBwdParams qs = q;
      qs.dk_rstd = tok(rk.p, STRATA_DTYPE_F32, T, H, 0);
      qs.dk = tok(dk16.p, dt, T, H, K);
      qs.mma_variant = kWyFinStaged;
      norm::RowNormBwdParams a;
      a.src = k.p, a.rstd = rk.p, a.dout = dk.p, a.dx = dk16.p;
      a.src_dtype = a.dx_dtype = dt;
      a.rstd_dtype = a.dout_dtype = STRATA_DTYPE_F32;
      a.rows = rows * H, a.D = K;
      a.src_rows = a.dout_rows = a.dx_rows = test::dense_rows(rows * H, K);
      a.rstd_rows = test::dense_rows(rows * H, 1);
      a.n_div = 1;
      a.kind = norm::RowNormBwdKind::kNormalizedSrc;
      const std::vector<double> ms = gdn_test::time_median_ms(
          {[&] {
             EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(q, ws.p, nullptr), STRATA_SUCCESS);
             EXPECT_EQ(norm::row_norm_bwd_cuda(a, nullptr), 0);
           },
           [&] { EXPECT_EQ(prepare_wy_repr_bwd_cuda_mma(qs, ws.p, nullptr), STRATA_SUCCESS); }},
          9);
      std::printf("[wy_bwd s16] bf16 B=%lld T=%lld H=16 HV=32 K=V=128 fused sums + dk l2norm bwd: kWyTrimmed + "
                  "row_norm_bwd %.3f ms, kWyFinStaged (dk_rstd) %.3f ms (median of 9 interleaved)\n",
                  static_cast<long long>(B), static_cast<long long>(T), ms[0], ms[1]);
      std::fflush(stdout);
    }
  }
}

// The composed backward reading the forward's `saved` residuals (GdnSave.SavedTiming's call) at the benchmark shapes
// (bf16, H = 16, HV = 32, K = V = 128, l2norm, cudaMemset inputs), prepare_wy_repr_bwd as kWyTrimmed with the tail's
// dk row_norm_bwd against kWyFinStaged with dk's l2norm backward folded (and kWyAuto, the library's call): median of
// 9 interleaved calls, then per step (the fastest of 5). Fails only if a call fails.
TEST(GdnWyBwdEpilogue, ComposedDkFoldTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B;
    const gdn_test::GdnBenchProblem bench(B, T, 16, 32, 128, 128, /*saved=*/true);  // the forward fills saved
    const GdnParams p = bench.p;
    EXPECT_EQ(gdn_cuda_bwd_dk_fold_reject(p), "");
    Dev ws(gdn_cuda_bwd_workspace(p));
    const int forms[] = {kWyTrimmed, kWyFinStaged, kWyAuto};
    std::vector<std::function<void()>> calls;
    for (const int f : forms)
      calls.push_back([&, f] { EXPECT_EQ(gdn_cuda_bwd(p, ws.p, nullptr, nullptr, 0, f), STRATA_SUCCESS); });
    const std::vector<double> ms = gdn_test::time_median_ms(calls, 9);
    std::printf("[wy_bwd s16] composed backward reading saved, bf16 B=%lld T=%lld H=16 HV=32 K=V=128 l2norm: "
                "kWyTrimmed + dk row_norm_bwd %.3f ms, kWyFinStaged (dk folded) %.3f ms, kWyAuto %.3f ms (median of 9 "
                "interleaved)\n",
                static_cast<long long>(B), static_cast<long long>(T), ms[0], ms[1], ms[2]);
    for (const int f : {kWyTrimmed, kWyFinStaged}) {
      const gdn_test::StepTimes st = gdn_test::time_steps(
          [&](const GdnStepProbe* probe) { EXPECT_EQ(gdn_cuda_bwd(p, ws.p, nullptr, probe, 0, f), STRATA_SUCCESS); },
          5);
      std::printf("[wy_bwd s16] composed backward steps B=%lld (%s):", static_cast<long long>(B),
                  f == kWyTrimmed ? "kWyTrimmed" : "kWyFinStaged");
      for (size_t i = 0; i < st.ms.size() && i < st.names.size(); ++i)
        std::printf(" %s %.3f ms%s", st.names[i].c_str(), st.ms[i], i + 1 < st.ms.size() ? "," : "\n");
    }
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata::linear_attn
#endif
