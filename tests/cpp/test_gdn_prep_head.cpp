// (session 11) The forward's head folded into the pre-state kernel (gdn::fwd_cuda_prep_head, gdn_fwd_cuda_prep.cu):
// prep_wgmma reading the raw q, k, g and writing qn, kn (l2norm), γ (chunk-local cumsum) besides w, u (A, Pqk).
// Checked against host l2norm / cumsum (double) and against fwd_cuda_prep run on the host-normalised inputs (the
// unfolded kernel: the same products, so w, u, A, Pqk differ only where qn, kn or γ differ by a rounding); timed
// against fwd_cuda_prep at the benchmark shapes ("[gdn_prep timing] head ...").
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

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
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"

namespace strata::linear_attn::gdn {
namespace {

using gdn_test::poisoned;
using gdn_test::rel_rms;
using gdn_test::time_ms;
using test::Dev;
using test::have_gpu;

constexpr float kEps = 1e-6f;
constexpr int32_t kBf = STRATA_DTYPE_BF16;

constexpr auto& tok = gdn_test::fwd_tok;
using gdn_test::upload;
std::vector<float> bf_to_f(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 2);
  for (size_t i = 0; i < f.size(); ++i) {
    uint16_t x;
    std::memcpy(&x, b.data() + 2 * i, 2);
    f[i] = bf16_bits_to_f32(x);
  }
  return f;
}

struct HeadShape {
  int64_t B, T, H, HV, K, V, BT;
  std::vector<int64_t> cu;  // empty: fixed length
  bool g_bf16;              // raw gates in bf16 (else f32)
};

// A problem with raw q, k ~ N(0, 1) (not normalised), v ~ N(0, 1), raw gates in [-0.1, 0], β in (0.05, 1) f32; the
// host's l2norm (f32 sum of squares in order, 1 / sqrt in double, rounded to bf16) and chunk-local cumsum (double).
struct HeadProblem {
  HeadShape s;
  GdnFwdParams p;  // q, k, g: the host-normalised inputs (the unfolded kernel's)
  GdnFwdHead hd;   // raw q, k, g; rstd outputs
  std::vector<uint8_t> qn_h, kn_h;
  std::vector<float> gam_h, rq_h, rk_h;
  gdn_test::FwdChunks ch;
  std::unique_ptr<Dev> q, k, g, qn, kn, gam, v, beta, w, u, A, P, qo, ko, go, rq, rk;
  HeadProblem(const HeadShape& sh, uint64_t seed) : s(sh) {
    std::mt19937_64 rng(seed);
    const int64_t B = s.B, T = s.T, H = s.H, HV = s.HV, K = s.K, V = s.V, rows = B * T;
    ch = gdn_test::set_fwd_shape(p, B, T, H, HV, K, V, s.BT, s.cu);
    const std::vector<int64_t>& bounds = ch.bounds;  // sequence starts in b T + t order
    // Raw q, k and their normalised rows.
    const auto qr = gdn_test::random_bytes(rows * H * K, kBf, rng, 1.0);
    const auto kr = gdn_test::random_bytes(rows * H * K, kBf, rng, 1.0);
    auto norm = [&](const std::vector<uint8_t>& x, std::vector<uint8_t>& y, std::vector<float>& r) {
      const std::vector<float> f = bf_to_f(x);
      y.resize(x.size()), r.resize(static_cast<size_t>(rows * H));
      for (int64_t row = 0; row < rows * H; ++row) {
        float ss = 0.f;
        for (int64_t c = 0; c < K; ++c) ss += f[row * K + c] * f[row * K + c];
        const float rs = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss) + kEps));
        r[row] = rs;
        for (int64_t c = 0; c < K; ++c) {
          const uint16_t b = f32_to_bf16_bits(f[row * K + c] * rs);
          std::memcpy(y.data() + 2 * (row * K + c), &b, 2);
        }
      }
    };
    norm(qr, qn_h, rq_h);
    norm(kr, kn_h, rk_h);
    // Raw gates and γ = their cumsum restarting at every chunk start of every sequence.
    std::uniform_real_distribution<float> ud(-0.1f, 0.f), ub(0.05f, 1.f);
    std::vector<float> graw(static_cast<size_t>(rows * HV)), bet(graw.size());
    std::vector<uint16_t> graw16(graw.size());
    for (size_t i = 0; i < graw.size(); ++i) {
      graw[i] = ud(rng);
      if (s.g_bf16) graw16[i] = f32_to_bf16_bits(graw[i]), graw[i] = bf16_bits_to_f32(graw16[i]);
    }
    for (float& x : bet) x = ub(rng);
    gam_h.assign(graw.size(), 0.f);
    for (size_t n = 0; n + 1 < bounds.size(); ++n)
      for (int64_t hv = 0; hv < HV; ++hv) {
        double acc = 0;
        for (int64_t t = bounds[n]; t < bounds[n + 1]; ++t) {
          if ((t - bounds[n]) % s.BT == 0) acc = 0;
          acc += graw[static_cast<size_t>(t * HV + hv)];
          gam_h[static_cast<size_t>(t * HV + hv)] = static_cast<float>(acc);
        }
      }
    const auto vb = gdn_test::random_bytes(rows * HV * V, kBf, rng, 1.0);
    q = upload(qr.data(), qr.size()), k = upload(kr.data(), kr.size());
    qn = upload(qn_h.data(), qn_h.size()), kn = upload(kn_h.data(), kn_h.size());
    gam = upload(gam_h.data(), gam_h.size() * 4);
    g = s.g_bf16 ? upload(graw16.data(), graw16.size() * 2) : upload(graw.data(), graw.size() * 4);
    v = upload(vb.data(), vb.size()), beta = upload(bet.data(), bet.size() * 4);
    w = std::make_unique<Dev>(rows * HV * K * 2), u = std::make_unique<Dev>(rows * HV * V * 2);
    A = std::make_unique<Dev>(rows * HV * s.BT * 2), P = std::make_unique<Dev>(rows * HV * s.BT * 2);
    qo = std::make_unique<Dev>(qr.size()), ko = std::make_unique<Dev>(kr.size());
    go = std::make_unique<Dev>(gam_h.size() * 4);
    rq = std::make_unique<Dev>(rows * H * 4), rk = std::make_unique<Dev>(rows * H * 4);
    p.q = tok(qn->p, kBf, T, H, K), p.k = tok(kn->p, kBf, T, H, K), p.v = tok(v->p, kBf, T, HV, V);
    p.g = tok(gam->p, STRATA_DTYPE_F32, T, HV, 0), p.beta = tok(beta->p, STRATA_DTYPE_F32, T, HV, 0);
    p.w = tok(w->p, kBf, T, HV, K), p.u = tok(u->p, kBf, T, HV, V), p.A = tok(A->p, kBf, T, HV, s.BT);
    p.Pqk = tok(P->p, kBf, T, HV, s.BT);
    hd.q_in = tok(q->p, kBf, T, H, K), hd.k_in = tok(k->p, kBf, T, H, K);
    hd.g_in = tok(g->p, s.g_bf16 ? kBf : STRATA_DTYPE_F32, T, HV, 0);
    hd.rq = tok(rq->p, STRATA_DTYPE_F32, T, H, 0), hd.rk = tok(rk->p, STRATA_DTYPE_F32, T, H, 0);
    hd.eps = kEps;
  }
  // The folded call's params: q, k, g are its outputs.
  GdnFwdParams folded() const {
    GdnFwdParams f = p;
    f.q.data = qo->p, f.k.data = ko->p, f.g.data = go->p;
    return f;
  }
  void poison() {
    for (Dev* x : {w.get(), u.get(), A.get(), P.get(), qo.get(), ko.get(), go.get(), rq.get(), rk.get()}) x->poison();
  }
};

const std::vector<HeadShape>& head_shapes() {
  std::vector<int64_t> many = {0};
  for (int64_t n = 0; n < 90; ++n) many.push_back(many.back() + (n * 37 + 5) % 150 + 1);
  static const std::vector<HeadShape> v = {
      {2, 200, 2, 4, 128, 48, 64, {}, false},                       // G = 2, partial chunks, V not a tile multiple
      {1, 300, 1, 3, 96, 200, 64, {0, 0, 1, 64, 129, 300}, true},   // G = 3, K = 96, varlen with empty / 1-token seqs
      {1, 150, 2, 4, 128, 128, 32, {0, 31, 32, 97, 150}, false},   // chunk size 32, varlen
      {2, 130, 1, 4, 64, 64, 64, {}, true},                        // G = 4, K = V = 64 (one panel each)
      {3, 64, 4, 4, 128, 128, 64, {}, false},                      // G = 1: one block writes q and k
      {1, 100, 1, 2, 128, 256, 64, {}, false},                     // V = 256
      {1, many.back(), 2, 4, 128, 128, 64, many, false},           // many short sequences
  };
  return v;
}

// The folded kernel against the host head + the unfolded kernel, with and without A / Pqk.
TEST(GdnFwdCudaPrepHead, MatchesHostHeadAndUnfoldedKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const HeadShape& s : head_shapes()) {
    HeadProblem pr(s, 700 + idx);
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
      const auto w1 = pr.w->bits(), u1 = pr.u->bits(), a1 = pr.A->bits(), p1 = pr.P->bits();
      const auto qo = pr.qo->bits(), ko = pr.ko->bits(), go = pr.go->bits(), rq = pr.rq->bits(), rk = pr.rk->bits();
      // Every element written (q, k rows: one writer block each; γ, rstd: f32 NaN poison).
      for (const auto* b : {&w1, &u1, &qo, &ko}) EXPECT_EQ(poisoned(*b), 0u) << "shape " << idx;
      if (full) EXPECT_EQ(poisoned(a1) + poisoned(p1), 0u) << "shape " << idx;
      const double eq = rel_rms(qo, pr.qn_h, kBf), ek = rel_rms(ko, pr.kn_h, kBf);
      std::vector<uint8_t> gh(pr.gam_h.size() * 4), rqh(pr.rq_h.size() * 4), rkh(pr.rk_h.size() * 4);
      std::memcpy(gh.data(), pr.gam_h.data(), gh.size());
      std::memcpy(rqh.data(), pr.rq_h.data(), rqh.size());
      std::memcpy(rkh.data(), pr.rk_h.data(), rkh.size());
      const double eg = rel_rms(go, gh, STRATA_DTYPE_F32), erq = rel_rms(rq, rqh, STRATA_DTYPE_F32),
                   erk = rel_rms(rk, rkh, STRATA_DTYPE_F32);
      EXPECT_LT(eq, 1e-3) << "shape " << idx << ": qn against the host l2norm";
      EXPECT_LT(ek, 1e-3) << "shape " << idx << ": kn against the host l2norm";
      EXPECT_LT(eg, 1e-6) << "shape " << idx << ": γ against the host cumsum";
      EXPECT_LT(erq, 1e-6) << "shape " << idx << ": rstd of q";
      EXPECT_LT(erk, 1e-6) << "shape " << idx << ": rstd of k";
      const double ew = rel_rms(w1, w0, kBf), eu = rel_rms(u1, u0, kBf);
      EXPECT_LT(ew, 1e-2) << "shape " << idx << ": w against the unfolded kernel";
      EXPECT_LT(eu, 1e-2) << "shape " << idx << ": u against the unfolded kernel";
      double ea = 0, ep = 0;
      if (full) {
        ea = rel_rms(a1, a0, kBf), ep = rel_rms(p1, p0, kBf);
        EXPECT_LT(ea, 1e-2) << "shape " << idx << ": A against the unfolded kernel";
        EXPECT_LT(ep, 1e-2) << "shape " << idx << ": Pqk against the unfolded kernel";
      } else {
        EXPECT_EQ(poisoned(a1), a1.size() / 2) << "shape " << idx << ": A written although absent";
        EXPECT_EQ(poisoned(p1), p1.size() / 2) << "shape " << idx << ": Pqk written although absent";
      }
      std::printf("[gdn_prep head check] shape %d %s: relative RMS qn %.2e kn %.2e γ %.2e rstd %.2e / %.2e; against "
                  "the unfolded kernel w %.2e u %.2e A %.2e P %.2e\n",
                  idx, full ? "w,u,A,P" : "w,u", eq, ek, eg, erq, erk, ew, eu, ea, ep);
      // The same bits twice (the default form again, then the other B-operand form: PrepForm, checked by
      // FormsSameBits).
      const PrepForm other = kPrepDefaultForm == PrepForm::kTransposed ? PrepForm::kMnMajorB : PrepForm::kTransposed;
      for (const PrepForm form : {kPrepDefaultForm, other}) {
        pr.poison();
        ASSERT_EQ(fwd_cuda_prep_form(fo, pr.hd, form, nullptr), STRATA_SUCCESS) << "shape " << idx;
        EXPECT_TRUE(pr.qo->bits() == qo && pr.ko->bits() == ko && pr.go->bits() == go) << "shape " << idx;
        const auto w2 = pr.w->bits(), u2 = pr.u->bits(), a2 = pr.A->bits(), p2 = pr.P->bits();
        if (form == kPrepDefaultForm) {
          EXPECT_TRUE(w2 == w1 && u2 == u1 && a2 == a1 && p2 == p1) << "shape " << idx << ": not the same bits twice";
        } else {
          EXPECT_LT(rel_rms(w2, w1, kBf) + rel_rms(u2, u1, kBf), 1e-5) << "shape " << idx << ": the other form";
        }
      }
    }
    // Gates only (no l2norm): q, k read as given, γ formed; w, u as the unfolded kernel from the same k.
    GdnFwdParams fg = f;
    fg.q = pr.p.q, fg.k = pr.p.k, fg.A = fg.Pqk = GdnTensor{};
    GdnFwdHead hg;
    hg.g_in = pr.hd.g_in;
    GdnFwdParams ref = pr.p;
    ref.A = ref.Pqk = GdnTensor{};
    pr.poison();
    ASSERT_EQ(fwd_cuda_prep(ref, nullptr), STRATA_SUCCESS);
    const auto w0 = pr.w->bits(), u0 = pr.u->bits();
    pr.poison();
    ASSERT_EQ(fwd_cuda_prep_head(fg, hg, nullptr), STRATA_SUCCESS) << "shape " << idx;
    EXPECT_LT(rel_rms(pr.w->bits(), w0, kBf), 1e-2) << "shape " << idx << ": w (gates folded only)";
    EXPECT_LT(rel_rms(pr.u->bits(), u0, kBf), 1e-2) << "shape " << idx << ": u (gates folded only)";
    EXPECT_EQ(poisoned(pr.qo->bits()), pr.qo->bytes / 2) << "shape " << idx << ": q written without l2norm";
    ++idx;
  }
}

// The two B-operand forms of prep_wgmma without the folded head (prepare_wy_repr_fwd's inputs as given) give the
// same bits, also where the head form does not apply (K = 100: element-wise loads and zero-padded panels) and at
// chunk size 16.
TEST(GdnFwdCudaPrepHead, FormsSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<HeadShape> shapes = head_shapes();
  shapes.push_back({1, 300, 1, 3, 100, 200, 64, {0, 0, 1, 64, 129, 300}, false});
  shapes.push_back({3, 64, 4, 4, 128, 128, 16, {}, false});
  int idx = 0;
  for (const HeadShape& s : shapes) {
    HeadProblem pr(s, 900 + idx);
    std::vector<uint8_t> ref[4];
    double e[4] = {};
    bool same = true;
    for (const PrepForm form : {PrepForm::kTransposed, PrepForm::kMnMajorB}) {
      pr.poison();
      ASSERT_EQ(fwd_cuda_prep_form(pr.p, GdnFwdHead{}, form, nullptr), STRATA_SUCCESS) << "shape " << idx;
      const std::vector<uint8_t> b[4] = {pr.w->bits(), pr.u->bits(), pr.A->bits(), pr.P->bits()};
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(poisoned(b[i]), 0u) << "shape " << idx << " output " << i;
        if (form == PrepForm::kTransposed) {
          ref[i] = b[i];
        } else {
          e[i] = rel_rms(b[i], ref[i], kBf);
          same = same && b[i] == ref[i];
          EXPECT_LT(e[i], 1e-5) << "shape " << idx << " output " << i << " (w, u, A, Pqk): forms differ";
        }
      }
    }
    std::printf("[gdn_prep forms] shape %d: MN-major B against transposed: %s (relative RMS w %.1e u %.1e A %.1e P "
                "%.1e)\n", idx, same ? "same bits" : "NOT the same bits", e[0], e[1], e[2], e[3]);
    ++idx;
  }
}

// What the folded form does not take (host rule; runs without a GPU).
TEST(GdnFwdCudaPrepHead, Rule) {
  GdnFwdParams p;
  GdnShape& d = p.shape;
  d.B = 1, d.T = 64, d.H = 1, d.HV = 2, d.G = 2, d.K = 128, d.V = 128, d.BT = 64, d.N = 1, d.NTr = 1, d.NT = 1;
  p.chunks.B = 1, p.chunks.T = 64, p.chunks.N = 1, p.chunks.BT = 64, p.chunks.NTr = 1;
  void* a = reinterpret_cast<void*>(uintptr_t{4096});
  p.q = tok(a, kBf, 64, 1, 128), p.k = tok(a, kBf, 64, 1, 128), p.v = tok(a, kBf, 64, 2, 128);
  p.w = tok(a, kBf, 64, 2, 128), p.u = tok(a, kBf, 64, 2, 128), p.g = tok(a, STRATA_DTYPE_F32, 64, 2, 0);
  GdnFwdHead hd;
  hd.q_in = p.q, hd.k_in = p.k, hd.g_in = p.g, hd.eps = kEps;
  EXPECT_EQ(fwd_cuda_prep_head_reject(p, hd), "");
  GdnFwdHead x = hd;
  x.q_in = GdnTensor{};
  EXPECT_NE(fwd_cuda_prep_head_reject(p, x), "") << "q and k normalised together";
  x = hd;
  x.k_in.data = reinterpret_cast<void*>(uintptr_t{4098});
  EXPECT_NE(fwd_cuda_prep_head_reject(p, x), "") << "misaligned raw k";
  x = hd;
  x.q_in.dtype = STRATA_DTYPE_F16;
  EXPECT_NE(fwd_cuda_prep_head_reject(p, x), "") << "f16 raw q";
  GdnFwdParams y = p;
  y.g.dtype = STRATA_DTYPE_BF16;
  EXPECT_NE(fwd_cuda_prep_head_reject(y, hd), "") << "γ written in f32 only";
  y = p;
  y.shape.K = 100;
  EXPECT_NE(fwd_cuda_prep_head_reject(y, hd), "") << "K a multiple of 8";
}

// At the benchmark shapes (bf16 H = 16 HV = 32 K = V = 128, B = 4 T = 8192 and B = 1 T = 32768; inputs by cudaMemset:
// bf16 0x3c3c ≈ 0.0115, raw gates 0; median of 7): fwd_cuda_prep on normalised inputs (the forward's prep after the
// separate l2norm and cumsum launches) against fwd_cuda_prep_head (raw q, k, g; qn, kn, γ written), for w, u (the
// fused forward) and w, u, A with the rstd (the backward's re-run). Prints "[gdn_prep timing] head ...".
TEST(GdnFwdCudaPrepHead, TimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, rows = B * T;
    Dev q(rows * H * K * 2), k(rows * H * K * 2), qn(rows * H * K * 2), kn(rows * H * K * 2), v(rows * HV * V * 2),
        w(rows * HV * K * 2), u(rows * HV * V * 2), g(rows * HV * 4), gam(rows * HV * 4), beta(rows * HV * 2),
        A(rows * HV * 64 * 2), rq(rows * H * 4), rk(rows * H * 4);
    for (Dev* x : {&q, &k, &qn, &kn, &v, &beta}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    for (Dev* x : {&g, &gam}) EXPECT_EQ(cudaMemset(x->p, 0, x->bytes), cudaSuccess);
    GdnFwdParams p;
    gdn_test::set_fwd_shape(p, B, T, H, HV, K, V, 64, {});
    p.q = tok(qn.p, kBf, T, H, K), p.k = tok(kn.p, kBf, T, H, K), p.v = tok(v.p, kBf, T, HV, V);
    p.g = tok(gam.p, STRATA_DTYPE_F32, T, HV, 0), p.beta = tok(beta.p, kBf, T, HV, 0);
    p.w = tok(w.p, kBf, T, HV, K), p.u = tok(u.p, kBf, T, HV, V);
    GdnFwdHead hd;
    hd.q_in = tok(q.p, kBf, T, H, K), hd.k_in = tok(k.p, kBf, T, H, K), hd.g_in = tok(g.p, STRATA_DTYPE_F32, T, HV, 0);
    hd.eps = kEps;
    GdnFwdHead hg;
    hg.g_in = hd.g_in;
    const double wu = time_ms([&] { return fwd_cuda_prep(p, nullptr); });
    double form_ms[2][2];  // [kTransposed, kMnMajorB][w, u; w, u with the folded head]
    for (int f = 0; f < 2; ++f) {
      const PrepForm form = f ? PrepForm::kMnMajorB : PrepForm::kTransposed;
      form_ms[f][0] = time_ms([&] { return fwd_cuda_prep_form(p, GdnFwdHead{}, form, nullptr); });
      form_ms[f][1] = time_ms([&] { return fwd_cuda_prep_form(p, hd, form, nullptr); });
    }
    const double wu_head = time_ms([&] { return fwd_cuda_prep_head(p, hd, nullptr); });
    const double wu_gates = time_ms([&] { return fwd_cuda_prep_head(p, hg, nullptr); });
    GdnFwdParams pa = p;
    pa.A = tok(A.p, kBf, T, HV, 64);
    GdnFwdHead ha = hd;
    ha.rq = tok(rq.p, STRATA_DTYPE_F32, T, H, 0), ha.rk = tok(rk.p, STRATA_DTYPE_F32, T, H, 0);
    const double wua = time_ms([&] { return fwd_cuda_prep(pa, nullptr); });
    const double wua_head = time_ms([&] { return fwd_cuda_prep_head(pa, ha, nullptr); });
    for (const double t : {wu, wu_head, wu_gates, wua, wua_head, form_ms[0][0], form_ms[0][1], form_ms[1][0],
                           form_ms[1][1]})
      EXPECT_GT(t, 0.0);
    std::printf("[gdn_prep timing] head bf16 B=%lld T=%lld H=16 HV=32 K=V=128: w, u: prep %.3f ms, prep + l2norm + "
                "cumsum folded %.3f ms (cumsum only %.3f ms); w, u, A: prep %.3f ms, folded (+ rstd) %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T), wu, wu_head, wu_gates, wua, wua_head);
    std::printf("[gdn_prep timing] forms bf16 B=%lld T=%lld H=16 HV=32 K=V=128: w, u: transposed %.3f ms, MN-major B "
                "%.3f ms; with the folded head: transposed %.3f ms, MN-major B %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T), form_ms[0][0], form_ms[1][0], form_ms[0][1],
                form_ms[1][1]);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata::linear_attn::gdn

#endif  // STRATA_WITH_CUDA
