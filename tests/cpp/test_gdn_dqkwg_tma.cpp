// chunk_bwd_dqkwg's warpgroup-MMA kernel, copy-engine form (kDqkwgWgmmaTma, the automatic choice since session 12):
// dO, Vn, dV and the S, dS rows arrive by 128-byte-swizzled tensor-map boxes on mbarriers instead of cp.async into
// core-matrix tiles. The products, epilogues and summation orders are those of the cp.async form
// (kDqkwgWgmmaCpAsync), so every output must have the same bits: partial last chunks (rows past T zero-filled by
// the copy engine), variable length (rows past a sequence's end zeroed in shared memory), G = 1, 2, 4, with and
// without gate / dv, blocks walking several items (bf16, K = V = 128, chunk size 64). GdnBwdCudaVariants.
// DqkwgTimingWgmma times both forms at the bench shapes.
// Session 16 (StagedDqNorm*, ComposedDqStagedTiming; the composed backward's default since session 17): the kernel
// writing dq through its l2norm backward (chunk_bwd_dqkwg_cuda_wgmma_dq_norm) against the plain kernel + the float64
// l2norm backward; times at the bench shapes. ComposedUnfoldedConformance: the forced unfolded form through the
// conformance cases.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"
#include "opbase/dtype.h"
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "ops/norm/common/row_norm.h"
#include "testkit/testkit.h"

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
    q = upload(random_bytes(rows * c.H * K, bf, rng, 0.088));
    k = upload(random_bytes(rows * c.H * K, bf, rng, 0.088));
    v = upload(random_bytes(rows * c.HV * K, bf, rng, 1.0));
    dout = upload(random_bytes(rows * c.HV * K, bf, rng, 1.0));
    dv = upload(random_bytes(rows * c.HV * K, bf, rng, 1.0));
    g = upload(random_bytes(rows * c.HV, STRATA_DTYPE_F32, rng, 0, -3.0));
    h = upload(random_bytes(c.B * NT * c.HV * K * K, bf, rng, 1.0));
    dh = upload(random_bytes(c.B * NT * c.HV * K * K, bf, rng, 1.0));
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

// ---- Session 16: dq's l2norm backward in the kernel, staged (chunk_bwd_dqkwg_cuda_wgmma_dq_norm) ----

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

// The folded call's dq (bf16, [B, T, H, 128]) and rstd (f32 [B, T, H]) views.
gdn_bwd::View dq16_view(const Problem& pr, const Dev& out) {
  return gdn_test::tok(out.p, STRATA_DTYPE_BF16, pr.c.T, pr.c.H, 128);
}
gdn_bwd::View rstd_view(const Problem& pr, const Dev& rs) {
  return gdn_test::tok(rs.p, STRATA_DTYPE_F32, pr.c.T, pr.c.H, 0);
}

// The staged fold against the plain kernel (the automatic copy-engine form, f32 dq) followed by the float64 l2norm
// backward (norm::row_norm_bwd_reference) with rstd random in [0.5, 3], on the seven form shapes (partial chunks,
// varlen, G = 1, 2, 4, with and without gate / dv, blocks walking several items): dq (bf16) within half a bf16 ulp
// of the float64 value plus 1e-5 of the largest |dq| (the f32 dot in another order), every element written (the
// output poisoned first); dk, dw, dγ the same bits as the plain call.
TEST(GdnDqkwgTma, StagedDqNormMatchesPlainPlusNormBwd) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const char* names[] = {"dq", "dk", "dw", "dg"};
  uint64_t seed = 1601;
  for (const Case& c : form_cases()) {
    const Problem pr(c, seed++);
    const int64_t rows = c.B * c.T * c.H;
    std::mt19937_64 rng(seed + 100);
    std::uniform_real_distribution<float> ur(0.5f, 3.f);
    std::vector<float> r(static_cast<size_t>(rows));
    for (float& x : r) x = ur(rng);
    const auto rs = gdn_test::upload(r.data(), r.size() * 4);
    Dev dq16(rows * 128 * 2);
    const auto plain = pr.run(kDqkwgWgmmaUnboundedWait);
    const std::vector<uint8_t> hq = pr.q->bits();
    std::vector<double> want(static_cast<size_t>(rows * 128));
    norm::row_norm_bwd_reference(
        dq_norm_bwd(hq.data(), r.data(), plain[0].data(), want.data(), STRATA_DTYPE_F64, rows));
    DqkwgParams p = pr.params(kDqkwgWgmmaUnboundedWait);
    p.dq = dq16_view(pr, dq16);
    EXPECT_EQ(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(p, rstd_view(pr, *rs)), "") << case_str(c);
    ASSERT_TRUE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs(p, rstd_view(pr, *rs))) << case_str(c);
    for (Dev* o : {&dq16, pr.dk.get(), pr.dw.get(), pr.dg.get()}) o->poison();
    Dev ws(chunk_bwd_dqkwg_cuda_wgmma_workspace(pr.d));
    ASSERT_EQ(chunk_bwd_dqkwg_cuda_wgmma_dq_norm(p, rstd_view(pr, *rs), ws.p, nullptr), STRATA_SUCCESS) << case_str(c);
    const std::vector<std::vector<uint8_t>> rest = {pr.dk->bits(), c.with_dv ? pr.dw->bits() : std::vector<uint8_t>{},
                                                    c.gate ? pr.dg->bits() : std::vector<uint8_t>{}};
    for (size_t i = 0; i < rest.size(); ++i) EXPECT_TRUE(rest[i] == plain[i + 1]) << names[i + 1] << " " << case_str(c);
    const std::vector<uint8_t> got = dq16.bits();
    double mx = 0, worst = 0;
    for (double x : want) mx = std::max(mx, std::abs(x));
    size_t bad = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      uint16_t u;
      std::memcpy(&u, got.data() + 2 * e, 2);
      const double err = std::abs(static_cast<double>(bf16_bits_to_f32(u)) - want[e]);
      if (!(err <= std::ldexp(std::abs(want[e]), -8) + 1e-5 * mx) && bad++ < 5)
        ADD_FAILURE() << "dq[" << e << "] = " << bf16_bits_to_f32(u) << ", float64 " << want[e] << ": " << case_str(c);
      if (err == err) worst = std::max(worst, err / std::max(mx, 1e-30));
    }
    EXPECT_EQ(bad, 0u) << case_str(c) << ": worst error " << worst << " of max |dq|";
  }
}

// Where the fold does not run (host checks, no GPU needed for the rejects): dq not bf16, rstd not f32 or absent, the
// cp.async or bounded-wait forms forced, K = 64, dq strides not multiples of 4; the entry point then answers
// STRATA_ERROR_UNSUPPORTED (without launching).
TEST(GdnDqkwgTma, StagedDqNormRejects) {
  float x = 0.f;
  DqkwgParams p;
  p.d.K = p.d.V = 128, p.d.BT = 64;
  for (gdn_bwd::View* v : {&p.q, &p.k, &p.v, &p.dout, &p.h, &p.dh}) v->dtype = STRATA_DTYPE_BF16, v->p = &x;
  p.dq.dtype = STRATA_DTYPE_BF16, p.dq.p = &x;
  gdn_bwd::View rs;
  rs.p = &x, rs.dtype = STRATA_DTYPE_F32;
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(p, rs), "");
  for (const int variant : {kDqkwgWgmmaCpAsync, kDqkwgWgmmaBoundedWait, kDqkwgTwoPerSm}) {
    DqkwgParams b = p;
    b.mma_variant = variant;
    EXPECT_NE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(b, rs), "") << variant;
  }
  DqkwgParams b = p;
  b.dq.dtype = STRATA_DTYPE_F32;
  EXPECT_NE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(b, rs), "");
  b = p, b.d.K = 64;
  EXPECT_NE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(b, rs), "");
  b = p, b.dq.s[1] = 130;
  EXPECT_NE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(b, rs), "");
  gdn_bwd::View r2 = rs;
  r2.dtype = STRATA_DTYPE_BF16;
  EXPECT_NE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(p, r2), "");
  EXPECT_NE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(p, gdn_bwd::View{}), "");
  b = p, b.dq.dtype = STRATA_DTYPE_F32;
  EXPECT_FALSE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs(b, rs));
  EXPECT_EQ(chunk_bwd_dqkwg_cuda_wgmma_dq_norm(b, rs, nullptr, nullptr), STRATA_ERROR_UNSUPPORTED);
}

// The kernel alone at the bench shapes (bf16 H = 16 HV = 32 K = V = 128, dv, dw, dγ requested: the composed
// backward's call): (0) plain (f32 dq), (1) plain + dq's row_norm_bwd into bf16 (the composed backward's dq path),
// (2) the staged fold writing bf16 dq; median of 11 interleaved calls, the list run twice.
TEST(GdnDqkwgTma, StagedDqNormTiming) {
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
    pf.dq = tok(dq16.p, bf, T, H, K);
    const gdn_bwd::View r = tok(rs.p, f32, T, H, 0);
    EXPECT_TRUE(chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs(pf, r));
    const norm::RowNormBwdParams nb = dq_norm_bwd(q.p, rs.p, dq.p, dq16.p, bf, rows * H);
    Dev ws(chunk_bwd_dqkwg_cuda_workspace(p.d));
    auto plain = [&] { EXPECT_EQ(chunk_bwd_dqkwg_cuda(p, ws.p, nullptr), STRATA_SUCCESS); };
    auto plain_norm = [&] {
      plain();
      EXPECT_EQ(norm::row_norm_bwd_cuda(nb, nullptr), STRATA_SUCCESS);
    };
    auto staged = [&] { EXPECT_EQ(chunk_bwd_dqkwg_cuda_wgmma_dq_norm(pf, r, ws.p, nullptr), STRATA_SUCCESS); };
    const std::vector<double> ms =
        gdn_test::time_median_ms({plain, plain_norm, staged, plain, plain_norm, staged}, 11);
    std::printf("[dqkwg s16] chunk_bwd_dqkwg bf16 B=%lld T=%lld H=16 HV=32 K=V=128 (dv, dw, dg), median of 11 "
                "interleaved: plain (f32 dq) %.3f / %.3f ms, plain + dq row_norm_bwd (bf16 dq) %.3f / %.3f ms, staged "
                "fold (bf16 dq) %.3f / %.3f ms\n",
                static_cast<long long>(B), static_cast<long long>(T), ms[0], ms[3], ms[1], ms[4], ms[2], ms[5]);
    std::fflush(stdout);
  }
}

// The composed backward's forced form "cuda.sm90.chunked_unfolded" (GdnBwdDq::kPlain, kWyTrimmed: the l2norm
// backward of dq and dk in the tail, what the default ran until session 17) on every conformance case of
// chunk_gated_delta_rule_bwd against float64; the default `cuda.sm90.chunked` (the staged folds) runs in the
// conformance suite itself.
TEST(GdnDqkwgTma, ComposedUnfoldedConformance) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<atk::OpHarness> harness;
  for (auto& h : atk::all_harnesses())
    if (h->op() == "chunk_gated_delta_rule_bwd") harness = std::move(h);
  ASSERT_TRUE(harness);
  int run = 0;
  for (const atk::Case& c : harness->conformance_cases()) {
    const atk::CaseResult r = atk::run_forced(*harness, c, {STRATA_DEVICE_CUDA, 0}, "cuda.sm90.chunked_unfolded");
    if (r.skipped) continue;
    ++run;
    EXPECT_TRUE(r.pass) << c.str() << ": " << r.str();
  }
  std::printf("[dqkwg s17] chunk_gated_delta_rule_bwd conformance, cuda.sm90.chunked_unfolded: %d cases run\n", run);
  EXPECT_GT(run, 0);
}

// The composed backward reading the forward's `saved` residuals (GdnSave.SavedTiming's call) at the bench shapes
// (bf16, H = 16, HV = 32, K = V = 128, l2norm, cudaMemset inputs): dq by the plain kernel + the tail's row_norm_bwd
// (GdnBwdDq::kPlain) against the staged fold (kStaged) and kAuto; median of 9 interleaved calls, then per step.
TEST(GdnDqkwgTma, ComposedDqStagedTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const gdn_test::GdnBenchProblem bp(B, 32768 / B, 16, 32, 128, 128, /*saved=*/true);
    const GdnParams& p = bp.p;
    EXPECT_EQ(gdn_cuda_bwd_dq_fold_reject(p), "");
    Dev ws(gdn_cuda_bwd_workspace(p));
    const GdnBwdDq forms[] = {GdnBwdDq::kPlain, GdnBwdDq::kStaged, GdnBwdDq::kAuto};
    std::vector<std::function<void()>> calls;
    auto with = [&](GdnBwdDq f) {
      GdnParams q = p;
      q.bwd_dq = f;
      return q;
    };
    for (const GdnBwdDq f : forms)
      calls.push_back([&, f] { EXPECT_EQ(gdn_cuda_bwd(with(f), ws.p, nullptr), STRATA_SUCCESS); });
    const std::vector<double> ms = gdn_test::time_median_ms(calls, 9);
    std::printf("[dqkwg s16] composed backward reading saved, bf16 B=%lld T=%lld H=16 HV=32 K=V=128 l2norm: dq plain "
                "+ row_norm_bwd %.3f ms, dq staged fold %.3f ms, auto %.3f ms (median of 9 interleaved)\n",
                static_cast<long long>(B), static_cast<long long>(p.T), ms[0], ms[1], ms[2]);
    for (const GdnBwdDq f : {GdnBwdDq::kPlain, GdnBwdDq::kStaged}) {
      const gdn_test::StepTimes st = gdn_test::time_steps(
          [&](const GdnStepProbe* probe) { EXPECT_EQ(gdn_cuda_bwd(with(f), ws.p, nullptr, probe), STRATA_SUCCESS); },
          5);
      std::printf("[dqkwg s16] composed backward steps B=%lld (%s):", static_cast<long long>(B),
                  f == GdnBwdDq::kPlain ? "dq plain" : "dq staged");
      for (size_t i = 0; i < st.ms.size() && i < st.names.size(); ++i)
        std::printf(" %s %.3f ms%s", st.names[i].c_str(), st.ms[i], i + 1 < st.ms.size() ? "," : "\n");
    }
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata::linear_attn
#endif
