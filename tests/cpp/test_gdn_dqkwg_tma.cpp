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

}  // namespace
}  // namespace strata::linear_attn
#endif
