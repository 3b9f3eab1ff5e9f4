// chunk_bwd_dqkwg's warpgroup-MMA kernel, copy-engine form (kDqkwgWgmmaTma, the automatic choice since session 12):
// dO, Vn, dV and the S, dS rows arrive by 128-byte-swizzled tensor-map boxes on mbarriers instead of cp.async into
// core-matrix tiles. The products, epilogues and summation orders are those of the cp.async form
// (kDqkwgWgmmaCpAsync), so every output must have the same bits: partial last chunks (rows past T zero-filled by
// the copy engine), variable length (rows past a sequence's end zeroed in shared memory), G = 1, 2, 4, with and
// without gate / dv, blocks walking several items (bf16, K = V = 128, chunk size 64). GdnBwdCudaVariants.
// DqkwgTimingWgmma times both forms at the bench shapes.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"
#include "opbase/dtype.h"
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/norm/common/row_norm.h"

namespace strata::linear_attn {
namespace {

using gdn_bwd::Dims;
using test::Dev;
using test::have_gpu;

struct Case {
  int64_t B, T, H, HV;
  std::vector<int64_t> cu;  // empty: fixed length
  bool gate, with_dv;
};

std::string case_str(const Case& c) {
  char b[160];
  std::snprintf(b, sizeof b, "B=%lld T=%lld H=%lld HV=%lld%s%s%s", static_cast<long long>(c.B),
                static_cast<long long>(c.T), static_cast<long long>(c.H), static_cast<long long>(c.HV),
                c.cu.empty() ? "" : " varlen", c.gate ? " gate" : "", c.with_dv ? " dv" : "");
  return b;
}

// Device inputs and outputs of one case (bf16 tokens and states, f32 dq, dk, dγ, bf16 dw; K = V = 128, BT = 64).
struct Problem {
  Case c;
  Dims d;
  std::unique_ptr<Dev> cu, q, k, v, dout, dv, g, h, dh, dq, dk, dw, dg;
  // Host copies of the inputs (the float64 reference of the folded dq l2norm backward reads them); rstd f32
  // [B, T, H] in [0.5, 3] and a bf16 dq for that test.
  std::vector<uint8_t> hq, hk, hv, hdout, hdv, hg, hh, hdh, hrs;
  std::unique_ptr<Dev> rs, dq16;
  Problem(const Case& cs, uint64_t seed) : c(cs) {
    using gdn_test::random_bytes;
    using gdn_test::upload;
    std::mt19937_64 rng(seed);
    const int32_t bf = STRATA_DTYPE_BF16;
    int64_t NT = (c.T + 63) / 64;
    if (!c.cu.empty()) {
      NT = 0;
      for (size_t i = 1; i < c.cu.size(); ++i) NT += (c.cu[i] - c.cu[i - 1] + 63) / 64;
    }
    const int64_t rows = c.B * c.T, K = 128;
    cu = upload(c.cu.data(), c.cu.size() * 8);
    q = upload(hq = random_bytes(rows * c.H * K, bf, rng, 0.088));
    k = upload(hk = random_bytes(rows * c.H * K, bf, rng, 0.088));
    v = upload(hv = random_bytes(rows * c.HV * K, bf, rng, 1.0));
    dout = upload(hdout = random_bytes(rows * c.HV * K, bf, rng, 1.0));
    dv = upload(hdv = random_bytes(rows * c.HV * K, bf, rng, 1.0));
    g = upload(hg = random_bytes(rows * c.HV, STRATA_DTYPE_F32, rng, 0, -3.0));
    h = upload(hh = random_bytes(c.B * NT * c.HV * K * K, bf, rng, 1.0));
    dh = upload(hdh = random_bytes(c.B * NT * c.HV * K * K, bf, rng, 1.0));
    std::uniform_real_distribution<float> ur(0.5f, 3.f);
    std::vector<float> r(static_cast<size_t>(rows * c.H));
    for (float& x : r) x = ur(rng);
    hrs.resize(r.size() * 4);
    std::memcpy(hrs.data(), r.data(), hrs.size());
    rs = upload(hrs), dq16 = std::make_unique<Dev>(rows * c.H * K * 2);
    dq = std::make_unique<Dev>(rows * c.H * K * 4), dk = std::make_unique<Dev>(rows * c.H * K * 4);
    dw = std::make_unique<Dev>(rows * c.HV * K * 2), dg = std::make_unique<Dev>(rows * c.HV * 4);
    d.B = c.B, d.T = c.T, d.H = c.H, d.HV = c.HV, d.G = c.HV / c.H, d.K = K, d.V = K, d.BT = 64;
    d.N = c.cu.empty() ? c.B : static_cast<int64_t>(c.cu.size()) - 1;
    d.NT = NT;
    d.cu = c.cu.empty() ? nullptr : static_cast<const int64_t*>(cu->p);
  }
  DqkwgParams params(int variant) const {
    using gdn_test::states;
    using gdn_test::tok;
    const int32_t bf = STRATA_DTYPE_BF16;
    DqkwgParams p;
    p.d = d;
    p.q = tok(q->p, bf, c.T, c.H, 128), p.k = tok(k->p, bf, c.T, c.H, 128);
    p.v = tok(v->p, bf, c.T, c.HV, 128), p.dout = tok(dout->p, bf, c.T, c.HV, 128);
    p.h = states(h->p, bf, d.NT, c.HV, 128, 128), p.dh = states(dh->p, bf, d.NT, c.HV, 128, 128);
    if (c.with_dv) p.dv = tok(dv->p, bf, c.T, c.HV, 128), p.dw = tok(dw->p, bf, c.T, c.HV, 128);
    if (c.gate) p.g = tok(g->p, STRATA_DTYPE_F32, c.T, c.HV, 0), p.dg = tok(dg->p, STRATA_DTYPE_F32, c.T, c.HV, 0);
    p.dq = tok(dq->p, STRATA_DTYPE_F32, c.T, c.H, 128), p.dk = tok(dk->p, STRATA_DTYPE_F32, c.T, c.H, 128);
    p.scale = 0.0884f;
    p.mma_variant = variant;
    return p;
  }
  // The bits of dq, dk, dw, dg after a call with `variant` (outputs poisoned first).
  std::vector<std::vector<uint8_t>> run(int variant) const {
    for (Dev* o : {dq.get(), dk.get(), dw.get(), dg.get()}) o->poison();
    Dev ws(chunk_bwd_dqkwg_cuda_workspace(d));
    EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma(params(variant), ws.p, nullptr), STRATA_SUCCESS) << case_str(c);
    return {dq->bits(), dk->bits(), c.with_dv ? dw->bits() : std::vector<uint8_t>{},
            c.gate ? dg->bits() : std::vector<uint8_t>{}};
  }
};

// f32 NaNs (the poison of the f32 outputs) in a buffer.
size_t nan_count(const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i + 3 < b.size(); i += 4) {
    float x;
    std::memcpy(&x, b.data() + i, 4);
    n += x != x;
  }
  return n;
}

// The shapes on which two forms of the kernel must give the same bits.
const std::vector<Case>& form_cases() {
  static const std::vector<Case> v = {
      {2, 130, 2, 4, {}, true, true},    // partial last chunk (rows past T from the copy engine's zero fill)
      {1, 65, 3, 3, {}, true, true},     // G = 1, one row in the last chunk
      {1, 190, 1, 4, {}, false, false},  // G = 4, no gate, no dv
      {2, 256, 2, 4, {}, true, false},
      {2, 4000, 4, 8, {}, true, true},   // 504 items: every block walks several (the rings across items)
      {1, 300, 1, 2, {0, 1, 64, 65, 300}, true, true},  // variable length: partial chunks zeroed past L
      {1, 200, 2, 4, {0, 63, 127, 129, 192, 200}, true, false},
  };
  return v;
}

TEST(GdnDqkwgTma, SameBitsAsCpAsyncForm) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Case>& cases = form_cases();
  const char* names[] = {"dq", "dk", "dw", "dg"};
  uint64_t seed = 1201;
  for (const Case& c : cases) {
    const Problem pr(c, seed++);
    EXPECT_TRUE(chunk_bwd_dqkwg_cuda_wgmma_copy_engine(pr.params(kDqkwgAuto))) << case_str(c);
    EXPECT_FALSE(chunk_bwd_dqkwg_cuda_wgmma_copy_engine(pr.params(kDqkwgWgmmaCpAsync))) << case_str(c);
    const auto a = pr.run(kDqkwgWgmmaCpAsync), b = pr.run(kDqkwgWgmmaTma);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].size(), b[i].size());
      size_t diff = 0, first = a[i].size();
      for (size_t e = 0; e < a[i].size(); ++e)
        if (a[i][e] != b[i][e]) ++diff, first = std::min(first, e);
      EXPECT_EQ(diff, 0u) << names[i] << " " << case_str(c) << ": " << diff << " bytes differ, first at " << first;
      EXPECT_EQ(i == 2 ? gdn_test::poisoned(a[i]) : nan_count(a[i]), 0u) << names[i] << " " << case_str(c);
    }
    EXPECT_TRUE(b == pr.run(kDqkwgWgmmaTma)) << "repeat " << case_str(c);
  }
}

// Session 14: the ds group's mbarrier waits without the trap counter (kDqkwgWgmmaUnboundedWait, what the automatic
// copy-engine form runs since s14run2) and with it (kDqkwgWgmmaBoundedWait, the automatic form before) run the same
// arithmetic: every output the same bits; the automatic (kDqkwgWgmmaTma) call gives them too.
TEST(GdnDqkwgTma, UnboundedWaitSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const char* names[] = {"dq", "dk", "dw", "dg"};
  uint64_t seed = 1401;
  for (const Case& c : form_cases()) {
    const Problem pr(c, seed++);
    EXPECT_TRUE(chunk_bwd_dqkwg_cuda_wgmma_copy_engine(pr.params(kDqkwgWgmmaUnboundedWait))) << case_str(c);
    EXPECT_TRUE(chunk_bwd_dqkwg_cuda_wgmma_copy_engine(pr.params(kDqkwgWgmmaBoundedWait))) << case_str(c);
    const auto a = pr.run(kDqkwgWgmmaBoundedWait), b = pr.run(kDqkwgWgmmaUnboundedWait), t = pr.run(kDqkwgWgmmaTma);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i] == b[i]) << names[i] << " " << case_str(c);
      EXPECT_TRUE(t[i] == b[i]) << names[i] << " automatic " << case_str(c);
      EXPECT_EQ(i == 2 ? gdn_test::poisoned(b[i]) : nan_count(b[i]), 0u) << names[i] << " " << case_str(c);
    }
  }
}

// ---- Session 15: dq's l2norm backward folded into the epilogue (DqkwgParams::dq_rstd; what the composed backward
// with use_qk_l2norm_in_kernel runs where the kernel applies): dq = rstd (dq - qn (qn . dq)) of the head sum, written
// once in dq's dtype instead of an f32 dq and a row_norm_bwd pass. ----

// row_norm_bwd's params (kNormalizedSrc) over rows of 128 contiguous elements: src = qn (bf16), rstd f32, dout = dq
// f32, dx in dx_dtype; the float64 reference (host pointers) and the CUDA kernel (device pointers) take the same.
norm::RowNormBwdParams dq_norm_bwd(const void* qn, const void* rstd, const void* dq32, void* dx, int32_t dx_dtype,
                                   int64_t rows) {
  norm::RowNormBwdParams a;
  a.src = qn, a.rstd = rstd, a.dout = dq32, a.dx = dx;
  a.src_dtype = STRATA_DTYPE_BF16, a.rstd_dtype = a.dout_dtype = STRATA_DTYPE_F32, a.dx_dtype = dx_dtype;
  a.rows = rows, a.D = 128;
  a.src_rows = a.dout_rows = a.dx_rows = test::dense_rows(rows, 128);
  a.rstd_rows = test::dense_rows(rows, 1);
  a.n_div = 1;
  a.kind = norm::RowNormBwdKind::kNormalizedSrc;
  return a;
}

// The folded call's params: dq (dtype dt) into out, rstd from the problem.
DqkwgParams folded_params(const Problem& pr, int variant, const Dev& out, int32_t dt) {
  DqkwgParams p = pr.params(variant);
  p.dq_rstd = gdn_test::tok(pr.rs->p, STRATA_DTYPE_F32, pr.c.T, pr.c.H, 0);
  p.dq = gdn_test::tok(out.p, dt, pr.c.T, pr.c.H, 128);
  return p;
}

// Elements of got (dtype dt) farther from want than 2^-8 |want| (bf16; 0 for f32) + tol max |want| (NaNs count).
size_t count_bad(const std::vector<uint8_t>& got, int32_t dt, const std::vector<double>& want, double tol,
                 double* worst) {
  double mx = 0;
  for (double x : want) mx = std::max(mx, std::abs(x));
  size_t bad = 0;
  *worst = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    const double err = std::abs(load_elem(got.data(), dt, static_cast<int64_t>(e)) - want[e]);
    const double bound = (dt == STRATA_DTYPE_F32 ? 0.0 : std::ldexp(std::abs(want[e]), -8)) + tol * mx;
    if (!(err <= bound)) ++bad;
    if (err == err) *worst = std::max(*worst, err / std::max(mx, 1e-30));
  }
  return bad;
}

// Against the plain kernel (f32 dq) followed by the float64 l2norm backward (norm::row_norm_bwd_reference), both
// forms, f32 and bf16 dq; dk, dw, dγ the same bits as the plain call.
TEST(GdnDqkwgTma, FoldedL2normDqMatchesPlainPlusNormBwd) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const char* names[] = {"dq", "dk", "dw", "dg"};
  uint64_t seed = 1501;
  for (const Case& c : form_cases()) {
    const Problem pr(c, seed++);
    const int64_t rows = c.B * c.T * c.H;
    for (const int form : {kDqkwgWgmmaTma, kDqkwgWgmmaCpAsync}) {
      const auto plain = pr.run(form);
      std::vector<double> want(static_cast<size_t>(rows * 128));
      norm::row_norm_bwd_reference(dq_norm_bwd(pr.hq.data(), pr.hrs.data(), plain[0].data(), want.data(),
                                               STRATA_DTYPE_F64, rows));
      for (const int32_t dt : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
        Dev& out = dt == STRATA_DTYPE_F32 ? *pr.dq : *pr.dq16;
        const DqkwgParams p = folded_params(pr, form, out, dt);
        const std::string what = case_str(c) + (form == kDqkwgWgmmaTma ? " copy engine" : " cp.async") +
                                 (dt == STRATA_DTYPE_F32 ? " f32 dq" : " bf16 dq");
        EXPECT_TRUE(chunk_bwd_dqkwg_cuda_wgmma_runs(p)) << what;
        EXPECT_EQ(chunk_bwd_dqkwg_cuda_wgmma_copy_engine(p), form == kDqkwgWgmmaTma) << what;
        for (Dev* o : {&out, pr.dk.get(), pr.dw.get(), pr.dg.get()}) o->poison();
        Dev ws(chunk_bwd_dqkwg_cuda_workspace(pr.d));
        ASSERT_EQ(chunk_bwd_dqkwg_cuda_wgmma(p, ws.p, nullptr), STRATA_SUCCESS) << what;
        const std::vector<std::vector<uint8_t>> rest = {pr.dk->bits(), c.with_dv ? pr.dw->bits() : std::vector<uint8_t>{},
                                                        c.gate ? pr.dg->bits() : std::vector<uint8_t>{}};
        for (size_t i = 0; i < rest.size(); ++i) EXPECT_TRUE(rest[i] == plain[i + 1]) << names[i + 1] << " " << what;
        double worst = 0;
        EXPECT_EQ(count_bad(out.bits(), dt, want, 1e-5, &worst), 0u) << what << ": worst error " << worst << " of max";
      }
    }
  }
}

// Against the float64 reference with dq_rstd (chunk_bwd_dqkwg_reference: the fold in float64 after the head sum),
// the bf16 dq of the automatic form, on the small shapes (the reference is plain loops).
TEST(GdnDqkwgTma, FoldedL2normDqMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1521;
  for (const Case& c : form_cases()) {
    if (c.B * c.T > 1000) continue;
    const Problem pr(c, seed++);
    const int64_t rows = c.B * c.T;
    const DqkwgParams p = folded_params(pr, kDqkwgAuto, *pr.dq16, STRATA_DTYPE_BF16);
    pr.dq16->poison();
    Dev ws(chunk_bwd_dqkwg_cuda_workspace(pr.d));
    ASSERT_EQ(chunk_bwd_dqkwg_cuda(p, ws.p, nullptr), STRATA_SUCCESS) << case_str(c);
    // The same problem on host memory, float64 outputs.
    using gdn_test::states;
    using gdn_test::tok;
    const int32_t bf = STRATA_DTYPE_BF16, f64 = STRATA_DTYPE_F64;
    auto hp = [](const std::vector<uint8_t>& b) { return const_cast<uint8_t*>(b.data()); };
    std::vector<double> dq(rows * c.H * 128), dk(rows * c.H * 128), dw(rows * c.HV * 128), dg(rows * c.HV);
    DqkwgParams r;
    r.d = pr.d;
    r.d.cu = c.cu.empty() ? nullptr : c.cu.data();
    r.q = tok(hp(pr.hq), bf, c.T, c.H, 128), r.k = tok(hp(pr.hk), bf, c.T, c.H, 128);
    r.v = tok(hp(pr.hv), bf, c.T, c.HV, 128), r.dout = tok(hp(pr.hdout), bf, c.T, c.HV, 128);
    r.h = states(hp(pr.hh), bf, pr.d.NT, c.HV, 128, 128), r.dh = states(hp(pr.hdh), bf, pr.d.NT, c.HV, 128, 128);
    if (c.with_dv) r.dv = tok(hp(pr.hdv), bf, c.T, c.HV, 128), r.dw = tok(dw.data(), f64, c.T, c.HV, 128);
    if (c.gate) r.g = tok(hp(pr.hg), STRATA_DTYPE_F32, c.T, c.HV, 0), r.dg = tok(dg.data(), f64, c.T, c.HV, 0);
    r.dq = tok(dq.data(), f64, c.T, c.H, 128), r.dk = tok(dk.data(), f64, c.T, c.H, 128);
    r.dq_rstd = tok(hp(pr.hrs), STRATA_DTYPE_F32, c.T, c.H, 0);
    r.scale = p.scale;
    chunk_bwd_dqkwg_reference(r);
    // bf16 tensor-core products (Ds rounded to bf16, the kernel's precision model) and a bf16 output
    double worst = 0;
    EXPECT_EQ(count_bad(pr.dq16->bits(), bf, dq, 5e-3, &worst), 0u) << case_str(c) << ": worst " << worst << " of max";
    EXPECT_GT(worst, 0.0) << case_str(c) << " (a bf16 result equal to float64 everywhere: not the folded call?)";
  }
}

// Where the fold does not run: the mma.sync and FMA kernels refuse dq_rstd; a non-f32 dq_rstd is rejected.
TEST(GdnDqkwgTma, FoldedL2normRefusals) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Problem pr(form_cases()[0], 1541);
  DqkwgParams p = folded_params(pr, kDqkwgTwoPerSm, *pr.dq16, STRATA_DTYPE_BF16);
  Dev ws(chunk_bwd_dqkwg_cuda_workspace(pr.d));
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_mma(p, ws.p, nullptr), STRATA_ERROR_UNSUPPORTED);
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_fma(p, ws.p, nullptr), STRATA_ERROR_UNSUPPORTED);
  p.dq_rstd.dtype = STRATA_DTYPE_BF16;
  EXPECT_FALSE(chunk_bwd_dqkwg_cuda_wgmma_reject(p).empty());
  EXPECT_FALSE(chunk_bwd_dqkwg_cuda_wgmma_runs(p));
}

// Times at the bench shapes (bf16 H = 16 HV = 32 K = V = 128, dv, dw, dγ requested: the composed backward's call):
// the plain kernel with f32 dq followed by dq's row_norm_bwd into bf16 (the composed backward before session 15)
// against the folded kernel writing bf16 dq; median of 11 interleaved calls.
TEST(GdnDqkwgTma, FoldedL2normTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, NT = T / 64, rows = B * T;
    Dev q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * K * 2), dout(rows * HV * K * 2), dv(rows * HV * K * 2),
        g(rows * HV * 4), h(B * NT * HV * K * K * 2), dh(B * NT * HV * K * K * 2), dq(rows * H * K * 4),
        dq16(rows * H * K * 2), dk(rows * H * K * 4), dw(rows * HV * K * 2), dg(rows * HV * 4), rs(rows * H * 4);
    for (Dev* x : {&q, &k, &v, &dout, &dv, &h, &dh}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(rs.p, 0x3f, rs.bytes), cudaSuccess);
    using gdn_test::states;
    using gdn_test::tok;
    const int32_t bf = STRATA_DTYPE_BF16, f32 = STRATA_DTYPE_F32;
    DqkwgParams p;
    p.d.B = B, p.d.T = T, p.d.H = H, p.d.HV = HV, p.d.G = HV / H, p.d.K = K, p.d.V = K, p.d.N = B, p.d.NT = NT;
    p.d.BT = 64;
    p.q = tok(q.p, bf, T, H, K), p.k = tok(k.p, bf, T, H, K), p.v = tok(v.p, bf, T, HV, K);
    p.dout = tok(dout.p, bf, T, HV, K), p.dv = tok(dv.p, bf, T, HV, K), p.g = tok(g.p, f32, T, HV, 0);
    p.h = states(h.p, bf, NT, HV, K, K), p.dh = states(dh.p, bf, NT, HV, K, K);
    p.dq = tok(dq.p, f32, T, H, K), p.dk = tok(dk.p, f32, T, H, K), p.dw = tok(dw.p, bf, T, HV, K);
    p.dg = tok(dg.p, f32, T, HV, 0);
    p.scale = 0.0884f;
    DqkwgParams pf = p;
    pf.dq = tok(dq16.p, bf, T, H, K), pf.dq_rstd = tok(rs.p, f32, T, H, 0);
    EXPECT_TRUE(chunk_bwd_dqkwg_cuda_wgmma_runs(pf));
    const norm::RowNormBwdParams nb = dq_norm_bwd(q.p, rs.p, dq.p, dq16.p, bf, rows * H);
    Dev ws(chunk_bwd_dqkwg_cuda_workspace(p.d));
    auto kernel = [&] { EXPECT_EQ(chunk_bwd_dqkwg_cuda(p, ws.p, nullptr), STRATA_SUCCESS); };
    auto norm_bwd = [&] { EXPECT_EQ(norm::row_norm_bwd_cuda(nb, nullptr), STRATA_SUCCESS); };
    auto folded = [&] { EXPECT_EQ(chunk_bwd_dqkwg_cuda(pf, ws.p, nullptr), STRATA_SUCCESS); };
    const std::vector<double> ms = gdn_test::time_median_ms(
        {[&] { kernel(), norm_bwd(); }, folded, kernel, norm_bwd, [&] { kernel(), norm_bwd(); }, folded}, 11);
    std::printf("[dqkwg s15] chunk_bwd_dqkwg bf16 B=%lld T=%lld H=16 HV=32 K=V=128 (dv, dw, dg): plain f32 dq + dq "
                "l2norm_bwd %.3f ms (kernel %.3f + l2norm_bwd %.3f) against folded (bf16 dq) %.3f ms; again %.3f "
                "against %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T), ms[0], ms[2], ms[3], ms[1], ms[4], ms[5]);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata::linear_attn
#endif
