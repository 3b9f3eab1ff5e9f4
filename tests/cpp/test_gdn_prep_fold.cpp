// (session 11) chunk_gated_delta_rule's gate cumsum folded into the pre-state kernel (gdn::fwd_cuda_prep_head,
// gdn_fwd_cuda_prep.cu): prep_wgmma reading the raw gates and writing γ (the chunk-local cumsum) besides w, u (A,
// Pqk). Checked against a host cumsum (double) and against fwd_cuda_prep run on the host γ (the unfolded kernel: the
// same products, so w, u, A, Pqk differ only where γ differs by a rounding); timed against fwd_cuda_prep at the
// benchmark shapes ("[gdn_prep timing] fold ..."). Session 12: the kernel forms (gdn::PrepForm) on the same problems:
// the persistent form against the chunk form (the same bits), and their timing with the byte floor
// ("[gdn_prep timing] forms ...").
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"
#include "opbase/dtype.h"
#include "ops/linear_attn/gdn_common/gdn_common.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_prep.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"

namespace strata::linear_attn::gdn {
namespace {

using gdn_test::poisoned;
using gdn_test::rel_rms;
using gdn_test::time_ms;
using gdn_test::upload;
using test::Dev;
using test::have_gpu;
constexpr auto& tok = gdn_test::fwd_tok;
constexpr int32_t kBf = STRATA_DTYPE_BF16;

struct FoldShape {
  int64_t B, T, H, HV, K, V, BT;
  std::vector<int64_t> cu;  // empty: fixed length
  bool g_bf16;              // raw gates in bf16 (else f32)
};

// A problem with q, k ~ N(0, K^-1/2), v ~ N(0, 1), raw gates in [-0.1, 0], β in (0.05, 1) f32, and the host's γ (the
// chunk-local cumsum in double, restarting at every chunk start of every sequence).
struct FoldProblem {
  FoldShape s;
  GdnFwdParams p;  // g: the host γ (the unfolded kernel's input)
  GdnFwdHead hd;   // the raw gates
  std::vector<float> gam_h;
  gdn_test::FwdChunks ch;
  std::unique_ptr<Dev> q, k, v, g, gam, beta, w, u, A, P, go;
  FoldProblem(const FoldShape& sh, uint64_t seed) : s(sh) {
    std::mt19937_64 rng(seed);
    const int64_t B = s.B, T = s.T, H = s.H, HV = s.HV, K = s.K, V = s.V, rows = B * T;
    ch = gdn_test::set_fwd_shape(p, B, T, H, HV, K, V, s.BT, s.cu);
    std::uniform_real_distribution<float> ud(-0.1f, 0.f), ub(0.05f, 1.f);
    std::vector<float> graw(static_cast<size_t>(rows * HV)), bet(graw.size());
    std::vector<uint16_t> graw16(graw.size());
    for (size_t i = 0; i < graw.size(); ++i) {
      graw[i] = ud(rng);
      if (s.g_bf16) graw16[i] = f32_to_bf16_bits(graw[i]), graw[i] = bf16_bits_to_f32(graw16[i]);
    }
    for (float& x : bet) x = ub(rng);
    gam_h.assign(graw.size(), 0.f);
    const std::vector<int64_t>& bounds = ch.bounds;
    for (size_t n = 0; n + 1 < bounds.size(); ++n)
      for (int64_t hv = 0; hv < HV; ++hv) {
        double acc = 0;
        for (int64_t t = bounds[n]; t < bounds[n + 1]; ++t) {
          if ((t - bounds[n]) % s.BT == 0) acc = 0;
          acc += graw[static_cast<size_t>(t * HV + hv)];
          gam_h[static_cast<size_t>(t * HV + hv)] = static_cast<float>(acc);
        }
      }
    const double sk = 1.0 / std::sqrt(static_cast<double>(K));
    const auto qb = gdn_test::random_bytes(rows * H * K, kBf, rng, sk);
    const auto kb = gdn_test::random_bytes(rows * H * K, kBf, rng, sk);
    const auto vb = gdn_test::random_bytes(rows * HV * V, kBf, rng, 1.0);
    q = upload(qb), k = upload(kb), v = upload(vb);
    gam = upload(gam_h.data(), gam_h.size() * 4);
    g = s.g_bf16 ? upload(graw16.data(), graw16.size() * 2) : upload(graw.data(), graw.size() * 4);
    beta = upload(bet.data(), bet.size() * 4);
    w = std::make_unique<Dev>(rows * HV * K * 2), u = std::make_unique<Dev>(rows * HV * V * 2);
    A = std::make_unique<Dev>(rows * HV * s.BT * 2), P = std::make_unique<Dev>(rows * HV * s.BT * 2);
    go = std::make_unique<Dev>(gam_h.size() * 4);
    p.q = tok(q->p, kBf, T, H, K), p.k = tok(k->p, kBf, T, H, K), p.v = tok(v->p, kBf, T, HV, V);
    p.g = tok(gam->p, STRATA_DTYPE_F32, T, HV, 0), p.beta = tok(beta->p, STRATA_DTYPE_F32, T, HV, 0);
    p.w = tok(w->p, kBf, T, HV, K), p.u = tok(u->p, kBf, T, HV, V), p.A = tok(A->p, kBf, T, HV, s.BT);
    p.Pqk = tok(P->p, kBf, T, HV, s.BT);
    hd.g_in = tok(g->p, s.g_bf16 ? kBf : STRATA_DTYPE_F32, T, HV, 0);
  }
  // The folded call's params: γ is its output.
  GdnFwdParams folded() const {
    GdnFwdParams f = p;
    f.g.data = go->p;
    return f;
  }
  void poison() {
    for (Dev* x : {w.get(), u.get(), A.get(), P.get(), go.get()}) x->poison();
  }
};

const std::vector<FoldShape>& fold_shapes() {
  std::vector<int64_t> many = {0};
  for (int64_t n = 0; n < 90; ++n) many.push_back(many.back() + (n * 37 + 5) % 150 + 1);
  static const std::vector<FoldShape> v = {
      {2, 200, 2, 4, 128, 48, 64, {}, false},                        // G = 2, partial chunks, V not a tile multiple
      {1, 300, 1, 3, 100, 200, 64, {0, 0, 1, 64, 129, 300}, true},   // G = 3, K = 100, varlen, empty / 1-token seqs
      {1, 150, 2, 4, 128, 128, 32, {0, 31, 32, 97, 150}, false},    // chunk size 32, varlen
      {2, 130, 1, 4, 64, 64, 64, {}, true},                         // G = 4, K = V = 64 (one panel each)
      {3, 64, 4, 4, 128, 128, 16, {}, false},                       // G = 1, chunk size 16
      {1, 100, 1, 2, 128, 256, 64, {}, false},                      // V = 256
      {1, many.back(), 2, 4, 128, 128, 64, many, false},            // many short sequences
  };
  return v;
}

// The folded kernel against the host cumsum and the unfolded kernel, with and without A / Pqk.
TEST(GdnFwdCudaPrepFold, MatchesHostCumsumAndUnfoldedKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const FoldShape& s : fold_shapes()) {
    FoldProblem pr(s, 700 + idx);
    const GdnFwdParams f = pr.folded();
    ASSERT_EQ(fwd_cuda_prep_head_reject(f, pr.hd), "") << "shape " << idx;
    for (const bool full : {true, false}) {  // with A and Pqk (the backward's re-run, the pre-computed P) / w, u only
      GdnFwdParams ref = pr.p, fo = f;
      if (!full) ref.A = ref.Pqk = fo.A = fo.Pqk = GdnTensor{};
      pr.poison();
      ASSERT_EQ(fwd_cuda_prep(ref, nullptr), STRATA_SUCCESS) << "shape " << idx;
      const auto w0 = pr.w->bits(), u0 = pr.u->bits(), a0 = pr.A->bits(), p0 = pr.P->bits();
      pr.poison();
      ASSERT_EQ(fwd_cuda_prep_head(fo, pr.hd, nullptr), STRATA_SUCCESS) << "shape " << idx;
      const auto w1 = pr.w->bits(), u1 = pr.u->bits(), a1 = pr.A->bits(), p1 = pr.P->bits(), go = pr.go->bits();
      EXPECT_EQ(poisoned(w1) + poisoned(u1), 0u) << "shape " << idx;
      if (full) EXPECT_EQ(poisoned(a1) + poisoned(p1), 0u) << "shape " << idx;
      // γ: every row written (f32 NaN poison), against the host's double cumsum.
      std::vector<uint8_t> gh(pr.gam_h.size() * 4);
      std::memcpy(gh.data(), pr.gam_h.data(), gh.size());
      size_t nan = 0;
      for (size_t i = 0; i < pr.gam_h.size(); ++i) {
        float x;
        std::memcpy(&x, go.data() + 4 * i, 4);
        nan += std::isnan(x) ? 1 : 0;
      }
      EXPECT_EQ(nan, 0u) << "shape " << idx << ": γ rows not written";
      const double eg = rel_rms(go, gh, STRATA_DTYPE_F32);
      EXPECT_LT(eg, 1e-6) << "shape " << idx << ": γ against the host cumsum";
      const double ew = rel_rms(w1, w0, kBf), eu = rel_rms(u1, u0, kBf);
      EXPECT_LT(ew, 1e-3) << "shape " << idx << ": w against the unfolded kernel";
      EXPECT_LT(eu, 1e-3) << "shape " << idx << ": u against the unfolded kernel";
      double ea = 0, ep = 0;
      if (full) {
        ea = rel_rms(a1, a0, kBf), ep = rel_rms(p1, p0, kBf);
        EXPECT_LT(ea, 1e-3) << "shape " << idx << ": A against the unfolded kernel";
        EXPECT_LT(ep, 1e-3) << "shape " << idx << ": Pqk against the unfolded kernel";
      } else {
        EXPECT_EQ(poisoned(a1), a1.size() / 2) << "shape " << idx << ": A written although absent";
        EXPECT_EQ(poisoned(p1), p1.size() / 2) << "shape " << idx << ": Pqk written although absent";
      }
      std::printf("[gdn_prep fold check] shape %d %s: relative RMS γ %.2e; against the unfolded kernel w %.2e u %.2e "
                  "A %.2e P %.2e\n", idx, full ? "w,u,A,P" : "w,u", eg, ew, eu, ea, ep);
      pr.poison();
      ASSERT_EQ(fwd_cuda_prep_head(fo, pr.hd, nullptr), STRATA_SUCCESS) << "shape " << idx;
      EXPECT_TRUE(pr.w->bits() == w1 && pr.u->bits() == u1 && pr.go->bits() == go && pr.A->bits() == a1 &&
                  pr.P->bits() == p1)
          << "shape " << idx << ": not the same bits twice";
    }
    ++idx;
  }
}

// What the folded form does not take (host rule; runs without a GPU): γ is written in f32.
TEST(GdnFwdCudaPrepFold, Rule) {
  GdnFwdParams p;
  gdn_test::set_fwd_shape(p, 1, 64, 1, 2, 128, 128, 64, {});
  void* a = reinterpret_cast<void*>(uintptr_t{4096});
  p.q = tok(a, kBf, 64, 1, 128), p.k = tok(a, kBf, 64, 1, 128), p.v = tok(a, kBf, 64, 2, 128);
  p.w = tok(a, kBf, 64, 2, 128), p.u = tok(a, kBf, 64, 2, 128), p.g = tok(a, STRATA_DTYPE_F32, 64, 2, 0);
  GdnFwdHead hd;
  hd.g_in = p.g;
  EXPECT_EQ(fwd_cuda_prep_head_reject(p, hd), "");
  GdnFwdParams y = p;
  y.g.dtype = STRATA_DTYPE_BF16;
  EXPECT_NE(fwd_cuda_prep_head_reject(y, hd), "") << "γ written in f32 only";
  y = p;
  y.g = GdnTensor{};
  EXPECT_NE(fwd_cuda_prep_head_reject(y, hd), "") << "γ needs a destination";
  y = p;
  y.k.dtype = STRATA_DTYPE_F16;
  EXPECT_NE(fwd_cuda_prep_head_reject(y, hd), "") << "prep_wgmma's rule (bf16)";
}

// The benchmark problem (bf16 H = 16 HV = 32 K = V = 128, T = 32768 / B; inputs by cudaMemset: bf16 0x3c3c ≈ 0.0115,
// gates 0): p reads γ and writes w, u; pa also A; hd holds the raw gates (the folded cumsum).
struct BenchProblem {
  int64_t B, T, H = 16, HV = 32, K = 128, V = 128, rows;
  Dev q, k, v, w, u, g, gam, beta, A;
  GdnFwdParams p, pa;
  GdnFwdHead hd;
  explicit BenchProblem(int64_t b)
      : B(b), T(32768 / b), rows(32768), q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * V * 2),
        w(rows * HV * K * 2), u(rows * HV * V * 2), g(rows * HV * 4), gam(rows * HV * 4), beta(rows * HV * 2),
        A(rows * HV * 64 * 2) {
    for (Dev* x : {&q, &k, &v, &beta}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    for (Dev* x : {&g, &gam}) EXPECT_EQ(cudaMemset(x->p, 0, x->bytes), cudaSuccess);
    gdn_test::set_fwd_shape(p, B, T, H, HV, K, V, 64, {});
    p.q = tok(q.p, kBf, T, H, K), p.k = tok(k.p, kBf, T, H, K), p.v = tok(v.p, kBf, T, HV, V);
    p.g = tok(gam.p, STRATA_DTYPE_F32, T, HV, 0), p.beta = tok(beta.p, kBf, T, HV, 0);
    p.w = tok(w.p, kBf, T, HV, K), p.u = tok(u.p, kBf, T, HV, V);
    pa = p;
    pa.A = tok(A.p, kBf, T, HV, 64);
    hd.g_in = tok(g.p, STRATA_DTYPE_F32, T, HV, 0);
  }
};

// At the benchmark shapes (bf16 H = 16 HV = 32 K = V = 128, B = 4 T = 8192 and B = 1 T = 32768; inputs by cudaMemset:
// bf16 0x3c3c ≈ 0.0115, gates 0; median of 7): fwd_cuda_prep reading γ against fwd_cuda_prep_head forming it from
// the raw gates, for w, u (the fused forward) and w, u, A (the backward's re-run). Prints "[gdn_prep timing] fold".
TEST(GdnFwdCudaPrepFold, TimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    BenchProblem bp(B);
    const int64_t T = bp.T;
    const GdnFwdParams& p = bp.p;
    const GdnFwdParams& pa = bp.pa;
    const GdnFwdHead& hd = bp.hd;
    const double wu = time_ms([&] { return fwd_cuda_prep(p, nullptr); });
    const double wu_fold = time_ms([&] { return fwd_cuda_prep_head(p, hd, nullptr); });
    const double wua = time_ms([&] { return fwd_cuda_prep(pa, nullptr); });
    const double wua_fold = time_ms([&] { return fwd_cuda_prep_head(pa, hd, nullptr); });
    for (const double t : {wu, wu_fold, wua, wua_fold}) EXPECT_GT(t, 0.0);
    std::printf("[gdn_prep timing] fold bf16 B=%lld T=%lld H=16 HV=32 K=V=128: w, u: prep %.3f ms, with the gate "
                "cumsum folded %.3f ms; w, u, A: prep %.3f ms, folded %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T), wu, wu_fold, wua, wua_fold);
    std::fflush(stdout);
  }
}

// (Session 12) The persistent form (PrepForm::kPersistent) against the chunk form on every fold shape: w, u (A; γ
// when folded) the same bits, with γ read or folded, with and without A, on the device-filling grid and on a grid of
// 3 blocks (many units per block: the next unit's K and the next item's V, γ, β requested during the current one).
// (Session 15: the chunk form loads K, V by load_panels, the persistent form by the fixed-slot lean loads, so this
// also checks that the two load paths fill the panels alike.)
TEST(GdnFwdCudaPrepForms, PersistentGivesTheChunkFormsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const FoldShape& s : fold_shapes()) {
    FoldProblem pr(s, 900 + idx);
    for (const bool fold : {false, true})
      for (const bool with_a : {true, false}) {
        GdnFwdParams f = fold ? pr.folded() : pr.p;
        f.Pqk = GdnTensor{};
        if (!with_a) f.A = GdnTensor{};
        const GdnFwdHead hd = fold ? pr.hd : GdnFwdHead{};
        pr.poison();
        ASSERT_EQ(fwd_cuda_prep_head(f, hd, PrepForm::kChunk, nullptr), STRATA_SUCCESS) << "shape " << idx;
        const auto w0 = pr.w->bits(), u0 = pr.u->bits(), a0 = pr.A->bits(), g0 = pr.go->bits();
        for (const int cap : {0, 3}) {
          pr.poison();
          ASSERT_EQ(fwd_cuda_prep_head(f, hd, PrepForm::kPersistent, nullptr, cap), STRATA_SUCCESS)
              << "shape " << idx;
          const auto w1 = pr.w->bits(), u1 = pr.u->bits(), a1 = pr.A->bits(), g1 = pr.go->bits();
          const char* what = fold ? (with_a ? "folded w,u,A" : "folded w,u") : (with_a ? "w,u,A" : "w,u");
          EXPECT_EQ(poisoned(w1) + poisoned(u1), 0u) << "shape " << idx << " " << what << " cap " << cap;
          EXPECT_TRUE(w1 == w0) << "shape " << idx << " " << what << " cap " << cap << ": w differs, rel RMS "
                                << rel_rms(w1, w0, kBf);
          EXPECT_TRUE(u1 == u0) << "shape " << idx << " " << what << " cap " << cap << ": u differs, rel RMS "
                                << rel_rms(u1, u0, kBf);
          EXPECT_TRUE(a1 == a0) << "shape " << idx << " " << what << " cap " << cap << ": A differs";
          if (fold) EXPECT_TRUE(g1 == g0) << "shape " << idx << " " << what << " cap " << cap << ": γ differs";
          if (!with_a) EXPECT_EQ(poisoned(a1), a1.size() / 2) << "shape " << idx << ": A written although absent";
        }
      }
    // The tree inverse (kPersistentTree, kChunkTree): another summation order, so within bf16 roundings of the chunk
    // form; the chunk form and the tree forms also against wy_mma<kPrepare> (the mma.sync kernel the conformance
    // suites verified against float64; relative RMS < 1e-2 as GdnFwdCudaPrep.MatchesWyMmaAndQkGate).
    {
      GdnFwdParams f = pr.p;
      f.Pqk = GdnTensor{};
      pr.poison();
      ASSERT_EQ(fwd_cuda(FwdOp::kPrepareWY, f, FwdCudaKernels::kMma, nullptr), STRATA_SUCCESS) << "shape " << idx;
      const auto wm = pr.w->bits(), um = pr.u->bits(), am = pr.A->bits();
      auto near_mma = [&](const char* what) {
        const double ew = rel_rms(pr.w->bits(), wm, kBf), eu = rel_rms(pr.u->bits(), um, kBf),
                     ea = rel_rms(pr.A->bits(), am, kBf);
        EXPECT_LT(ew, 1e-2) << "shape " << idx << " " << what << ": w against wy_mma";
        EXPECT_LT(eu, 1e-2) << "shape " << idx << " " << what << ": u against wy_mma";
        EXPECT_LT(ea, 1e-2) << "shape " << idx << " " << what << ": A against wy_mma";
        std::printf("[gdn_prep forms check] shape %d: %s against wy_mma: relative RMS w %.2e u %.2e A %.2e\n", idx,
                    what, ew, eu, ea);
      };
      pr.poison();
      ASSERT_EQ(fwd_cuda_prep_head(f, GdnFwdHead{}, PrepForm::kChunk, nullptr), STRATA_SUCCESS) << "shape " << idx;
      const auto w0 = pr.w->bits(), u0 = pr.u->bits(), a0 = pr.A->bits();
      near_mma("chunk form");
      for (const int cap : {0, 3, -1}) {  // -1: the chunk form with the tree inverse
        const PrepForm form = cap < 0 ? PrepForm::kChunkTree : PrepForm::kPersistentTree;
        pr.poison();
        ASSERT_EQ(fwd_cuda_prep_head(f, GdnFwdHead{}, form, nullptr, cap), STRATA_SUCCESS) << "shape " << idx;
        const auto w1 = pr.w->bits(), u1 = pr.u->bits(), a1 = pr.A->bits();
        EXPECT_EQ(poisoned(w1) + poisoned(u1) + poisoned(a1), 0u) << "shape " << idx << " cap " << cap;
        if (cap <= 0) near_mma(cap < 0 ? "chunk tree form" : "persistent tree form");
        const double ew = rel_rms(w1, w0, kBf), eu = rel_rms(u1, u0, kBf), ea = rel_rms(a1, a0, kBf);
        EXPECT_LT(ew, 1e-3) << "shape " << idx << " cap " << cap << ": tree w against the chunk form";
        EXPECT_LT(eu, 1e-3) << "shape " << idx << " cap " << cap << ": tree u against the chunk form";
        EXPECT_LT(ea, 1e-3) << "shape " << idx << " cap " << cap << ": tree A against the chunk form";
        if (cap <= 0)
          std::printf("[gdn_prep forms check] shape %d: persistent = chunk form bits (w, u, A, γ); %s tree inverse "
                      "against the chunk form: relative RMS w %.2e u %.2e A %.2e\n", idx,
                      cap < 0 ? "chunk" : "persistent", ew, eu, ea);
        pr.poison();
        ASSERT_EQ(fwd_cuda_prep_head(f, GdnFwdHead{}, form, nullptr, cap), STRATA_SUCCESS);
        EXPECT_TRUE(pr.w->bits() == w1 && pr.u->bits() == u1 && pr.A->bits() == a1)
            << "shape " << idx << ": tree form not the same bits twice";
      }
    }
    ++idx;
  }
}

// (Session 12) The forms at the benchmark shapes (bf16 H = 16 HV = 32 K = V = 128, B = 4 T = 8192 and B = 1
// T = 32768; cudaMemset inputs as above; median of 7): w, u (the fused forward), w, u, A (the forward that saves A),
// folded w, u; with the byte floor: the bytes the kernel must move (k once, v, γ f32, β bf16 read; w, u (A) written)
// over the device-to-device copy rate measured here (cudaMemcpyAsync of 512 MB, read + written). Prints
// "[gdn_prep timing] forms ...".
TEST(GdnFwdCudaPrepForms, TimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  double copy_tbs = 0;
  {
    const size_t n = size_t{512} << 20;
    Dev a(n), b(n);
    const double ms = time_ms([&] {
      return cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice) == cudaSuccess ? STRATA_SUCCESS : -1;
    });
    copy_tbs = 2.0 * n / (ms * 1e-3) / 1e12;
    std::printf("[gdn_prep timing] forms: device-to-device copy of 512 MB %.3f ms = %.2f TB/s (read + written)\n", ms,
                copy_tbs);
  }
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    BenchProblem bp(B);
    const int64_t T = bp.T, H = bp.H, HV = bp.HV, K = bp.K, V = bp.V, rows = bp.rows;
    const GdnFwdParams& p = bp.p;
    const GdnFwdParams& pa = bp.pa;
    const GdnFwdHead& hd = bp.hd;
    auto run = [&](const GdnFwdParams& x, const GdnFwdHead& h, PrepForm form) {
      return time_ms([&] { return fwd_cuda_prep_head(x, h, form, nullptr); });
    };
    const double wu_c = run(p, GdnFwdHead{}, PrepForm::kChunk), wu_p = run(p, GdnFwdHead{}, PrepForm::kPersistent);
    const double wua_c = run(pa, GdnFwdHead{}, PrepForm::kChunk), wua_p = run(pa, GdnFwdHead{}, PrepForm::kPersistent);
    const double f_c = run(p, hd, PrepForm::kChunk), f_p = run(p, hd, PrepForm::kPersistent);
    const double wu_t = run(p, GdnFwdHead{}, PrepForm::kPersistentTree),
                 wua_t = run(pa, GdnFwdHead{}, PrepForm::kPersistentTree);
    const double wu_ct = run(p, GdnFwdHead{}, PrepForm::kChunkTree), wua_ct = run(pa, GdnFwdHead{}, PrepForm::kChunkTree);
    for (const double t : {wu_c, wu_p, wua_c, wua_p, f_c, f_p, wu_t, wua_t, wu_ct, wua_ct}) EXPECT_GT(t, 0.0);
    // Bytes: k, v, γ (f32), β (bf16) read once, w, u (A) written once.
    const double rd = double(rows) * (H * K * 2 + HV * V * 2 + HV * 4 + HV * 2), wr = double(rows) * HV * (K + V) * 2,
                 wa = double(rows) * HV * 64 * 2;
    const double fl_wu = (rd + wr) / (copy_tbs * 1e12) * 1e3, fl_wua = (rd + wr + wa) / (copy_tbs * 1e12) * 1e3;
    std::printf("[gdn_prep timing] forms bf16 B=%lld T=%lld H=16 HV=32 K=V=128: w, u: chunk %.3f chunk-tree %.3f "
                "persistent %.3f persistent-tree %.3f ms (floor %.3f ms: %.0f MB at %.2f TB/s; chunk / floor %.2f); "
                "w, u, A: chunk %.3f chunk-tree %.3f persistent %.3f persistent-tree %.3f ms (floor %.3f, chunk / "
                "floor %.2f); folded w, u: chunk %.3f persistent %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T), wu_c, wu_ct, wu_p, wu_t, fl_wu, (rd + wr) / 1e6,
                copy_tbs, wu_c / fl_wu, wua_c, wua_ct, wua_p, wua_t, fl_wua, wua_c / fl_wua, f_c, f_p);
    std::fflush(stdout);
  }
}

// (Session 13) The folded l2norm (GdnFwdParams::qk_norm, the chunk-tree form): prep on the raw k (k scaled by 3.7
// so that the norms matter) against prep on kn = k / sqrt(|k|² + eps) rounded to bf16 on the host (fla's model: the
// unfolded forward's input), every fold shape: w, u within 1e-2 relative RMS (kn kept in f32 instead of rounded),
// rk (1 / |k| of every row, written once per q/k head) within 1e-5 of the host's; every row written, A untouched, the
// same bits twice.
TEST(GdnFwdCudaPrepForms, NormFoldMatchesNormalisedInputs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const FoldShape& s : fold_shapes()) {
    FoldProblem pr(s, 1300 + idx);
    const int64_t rows = s.B * s.T * s.H, K = s.K;
    const std::vector<uint8_t> kb = pr.k->bits();
    std::vector<uint16_t> raw(static_cast<size_t>(rows * K)), kn(raw.size());
    std::vector<float> r_h(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < K; ++j) {
        uint16_t b;
        std::memcpy(&b, kb.data() + 2 * (i * K + j), 2);
        raw[i * K + j] = f32_to_bf16_bits(3.7f * bf16_bits_to_f32(b));
        const double x = bf16_bits_to_f32(raw[i * K + j]);
        ss += x * x;
      }
      r_h[i] = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
      for (int64_t j = 0; j < K; ++j)
        kn[i * K + j] = f32_to_bf16_bits(static_cast<float>(bf16_bits_to_f32(raw[i * K + j]) * (1.0 / std::sqrt(ss + 1e-6))));
    }
    auto kraw = upload(raw.data(), raw.size() * 2), knd = upload(kn.data(), kn.size() * 2);
    Dev rk(static_cast<size_t>(rows) * 4);
    GdnFwdParams ref = pr.p;
    ref.A = ref.Pqk = GdnTensor{};
    ref.k.data = knd->p;
    pr.poison();
    ASSERT_EQ(fwd_cuda_prep_head(ref, GdnFwdHead{}, PrepForm::kChunkTree, nullptr), STRATA_SUCCESS) << "shape " << idx;
    const auto w0 = pr.w->bits(), u0 = pr.u->bits();
    GdnFwdParams f = ref;
    f.k.data = kraw->p;
    f.qk_norm = true, f.qk_norm_eps = 1e-6f;
    f.rk = tok(rk.p, STRATA_DTYPE_F32, s.T, s.H, 0);
    ASSERT_EQ(fwd_cuda_prep_reject(f), "") << "shape " << idx;
    std::vector<uint8_t> w1, u1, r1;
    for (int rep = 0; rep < 2; ++rep) {
      pr.poison(), rk.poison();
      ASSERT_EQ(fwd_cuda_prep(f, nullptr), STRATA_SUCCESS) << "shape " << idx;
      if (rep == 1) {
        EXPECT_TRUE(pr.w->bits() == w1 && pr.u->bits() == u1 && rk.bits() == r1) << "shape " << idx << ": not the same bits twice";
        break;
      }
      w1 = pr.w->bits(), u1 = pr.u->bits(), r1 = rk.bits();
    }
    EXPECT_EQ(poisoned(w1) + poisoned(u1), 0u) << "shape " << idx;
    EXPECT_EQ(poisoned(pr.A->bits()), pr.A->bytes / 2) << "shape " << idx << ": A written although absent";
    std::vector<uint8_t> rh(r_h.size() * 4);
    std::memcpy(rh.data(), r_h.data(), rh.size());
    const double ew = rel_rms(w1, w0, kBf), eu = rel_rms(u1, u0, kBf), er = rel_rms(r1, rh, STRATA_DTYPE_F32);
    EXPECT_LT(ew, 1e-2) << "shape " << idx << ": w against prep on the host-normalised k";
    EXPECT_LT(eu, 1e-2) << "shape " << idx << ": u against prep on the host-normalised k";
    EXPECT_LT(er, 1e-5) << "shape " << idx << ": rk against the host's 1 / |k| (every row written: NaN poison)";
    std::printf("[gdn_prep norm check] shape %d: relative RMS against prep on host-normalised k: w %.2e u %.2e; rk %.2e\n",
                idx, ew, eu, er);
    // The rules: the chunk-tree form only, w, u only.
    EXPECT_NE(fwd_cuda_prep_head(f, GdnFwdHead{}, PrepForm::kPersistent, nullptr), STRATA_SUCCESS);
    GdnFwdParams y = f;
    y.A = pr.p.A;
    EXPECT_NE(fwd_cuda_prep_reject(y), "") << "qk_norm with A";
    y = f;
    y.qk_norm_eps = 0.f;
    EXPECT_NE(fwd_cuda_prep_reject(y), "") << "qk_norm without eps";
    ++idx;
  }
}

}  // namespace
}  // namespace strata::linear_attn::gdn

#endif  // STRATA_WITH_CUDA
