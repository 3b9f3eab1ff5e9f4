// Launch variants of the fused GDN forward's state + output pass (gdn_fwd_kernels.h, StateOKernel, StateOBlock)
// that the conformance driver reaches only through the op's implementation list: kInline (the gated Q Kᵀ formed
// inside the sequential pass by every column block) and kPrecomputedP (formed chunk-parallel by fwd_cuda_qk_gate,
// read by the pass), each with 8- or 16-warp blocks. All sum every element in the same order, so the first test
// asks for the same bits of o, v_new and the final state on shapes with partial chunks, GVA (G = 2, 3), K and V
// that are not tile multiples, variable-length packs with empty sequences, chunk size 32, bf16 and f16, and each
// column width of the pass (32 / 64 / 128). The third test times the forward's kernels at the benchmark shapes (B = 4, T = 8192 and B = 1, T = 32768, H = 16,
// HV = 32, K = V = 128, bf16) and prints them (information for the automatic choice; it fails only if a launch
// fails). CUDA builds only; skipped without a GPU.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "ops/linear_attn/gdn_common/gdn_common.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "cuda_test_support.h"
#include "gdn_cuda_test_support.h"

namespace strata::linear_attn::gdn {
namespace {

using test::Dev;
using test::have_gpu;
using gdn_test::upload;

using gdn_test::random_bytes;

// Contiguous views: [B, T, heads, D] (D = 0: [B, T, heads]) and states [N, HV, K, V].
constexpr auto& tok = gdn_test::fwd_tok;
GdnTensor states(void* p, int64_t HV, int64_t K, int64_t V) {
  GdnTensor t;
  t.data = p, t.dtype = STRATA_DTYPE_F32;
  t.st[0] = HV * K * V, t.st[1] = K * V, t.st[2] = V, t.st[3] = 1;
  return t;
}

struct Shape {
  int64_t B, T, H, HV, K, V, BT;
  std::vector<int64_t> cu;  // empty: fixed length
  int32_t dt;
  bool h0, ht, vnew;
};

// One problem on the device: q, k, w, u (random), γ = chunk-local cumsum of gates in [-0.1, 0] (f32), h0,
// outputs o, v_new, ht, the gated Q Kᵀ buffer, chunk offsets for varlen.
struct Problem {
  Shape s;
  GdnFwdParams p;
  std::unique_ptr<Dev> cu, offs, q, k, w, u, g, h0, o, vn, ht, P, hs;
  GdnTensor h;  // chunk states [B, NT, HV, K, V] in the token dtype (fwd_h runs: set p.h = h)
  Problem(const Shape& sh, uint64_t seed) : s(sh) {
    std::mt19937_64 rng(seed);
    const int64_t B = s.B, T = s.T, H = s.H, HV = s.HV, K = s.K, V = s.V, rows = B * T, es = 2;
    GdnShape& d = p.shape;
    d.B = B, d.T = T, d.H = H, d.HV = HV, d.G = HV / H, d.K = K, d.V = V, d.BT = s.BT;
    d.N = s.cu.empty() ? B : static_cast<int64_t>(s.cu.size()) - 1;
    d.NTr = (T + s.BT - 1) / s.BT;
    d.scale = 0.125f;
    GdnChunks& m = p.chunks;
    m.B = B, m.T = T, m.N = d.N, m.BT = s.BT, m.NTr = d.NTr;
    // γ per sequence: cumsum restarting at every chunk start (bos + c BT).
    std::vector<float> gam(static_cast<size_t>(rows * HV));
    std::uniform_real_distribution<float> ud(-0.1f, 0.f);
    std::vector<std::pair<int64_t, int64_t>> seqs;  // (b, bos..eos)
    std::vector<int64_t> bounds;
    if (s.cu.empty()) {
      for (int64_t b = 0; b < B; ++b) bounds.push_back(b * T);
      bounds.push_back(B * T);
    } else {
      bounds = s.cu;
    }
    for (size_t n = 0; n + 1 < bounds.size(); ++n)
      for (int64_t hv = 0; hv < HV; ++hv) {
        float acc = 0.f;
        for (int64_t t = bounds[n]; t < bounds[n + 1]; ++t) {
          if ((t - bounds[n]) % s.BT == 0) acc = 0.f;
          acc += ud(rng);
          gam[static_cast<size_t>(t * HV + hv)] = acc;
        }
      }
    if (!s.cu.empty()) {
      std::vector<int64_t> off(s.cu.size());
      GdnChunks hm = m;
      hm.cu = s.cu.data();
      d.NT = fill_chunk_offsets(hm, off.data());
      cu = upload(s.cu.data(), s.cu.size() * 8);
      offs = upload(off.data(), off.size() * 8);
      m.cu = static_cast<const int64_t*>(cu->p);
      m.offsets = static_cast<const int64_t*>(offs->p);
    } else {
      d.NT = d.NTr;
    }
    const double sk = 1.0 / std::sqrt(static_cast<double>(K));
    auto rnd = [&](int64_t n, double sd) {
      const auto b = random_bytes(n, s.dt, rng, sd);
      return upload(b.data(), b.size());
    };
    q = rnd(rows * H * K, sk), k = rnd(rows * H * K, sk), w = rnd(rows * HV * K, sk), u = rnd(rows * HV * V, 1.0);
    g = upload(gam.data(), gam.size() * 4);
    p.q = tok(q->p, s.dt, T, H, K), p.k = tok(k->p, s.dt, T, H, K), p.w = tok(w->p, s.dt, T, HV, K);
    p.u = tok(u->p, s.dt, T, HV, V), p.g = tok(g->p, STRATA_DTYPE_F32, T, HV, 0);
    if (s.h0) {
      const auto b = random_bytes(d.N * HV * K * V, STRATA_DTYPE_F32, rng, 0.5);
      h0 = upload(b.data(), b.size());
      p.h0 = states(h0->p, HV, K, V);
    }
    o = std::make_unique<Dev>(rows * HV * V * es);
    p.o = tok(o->p, s.dt, T, HV, V);
    if (s.vnew) {
      vn = std::make_unique<Dev>(rows * HV * V * es);
      p.v_new = tok(vn->p, s.dt, T, HV, V);
    }
    if (s.ht) {
      ht = std::make_unique<Dev>(d.N * HV * K * V * 4);
      p.ht = states(ht->p, HV, K, V);
    }
    P = std::make_unique<Dev>(rows * HV * s.BT * es);
    p.Pqk = tok(P->p, s.dt, T, HV, s.BT);
    const int64_t hb = (s.cu.empty() ? B : 1) * d.NT;  // chunk slots of h
    hs = std::make_unique<Dev>(hb * HV * K * V * es);
    h.data = hs->p, h.dtype = s.dt;
    h.st[0] = (s.cu.empty() ? d.NT : 0) * HV * K * V, h.st[1] = HV * K * V, h.st[2] = K * V, h.st[3] = V, h.st[4] = 1;
  }
  // The params of chunk_gated_delta_rule_fwd_h on this problem: h written, o and P absent.
  GdnFwdParams fwd_h() const {
    GdnFwdParams f = p;
    f.h = h, f.o = GdnTensor{}, f.Pqk = GdnTensor{};
    return f;
  }
  void poison() {
    for (Dev* x : {o.get(), vn.get(), ht.get(), P.get(), hs.get()})
      if (x) x->poison();
  }
  std::vector<uint8_t> outputs() const {
    std::vector<uint8_t> r = o->bits();
    for (const Dev* x : {vn.get(), ht.get()})
      if (x) {
        const auto b = x->bits();
        r.insert(r.end(), b.begin(), b.end());
      }
    return r;
  }
};

const std::vector<Shape>& shapes() {
  std::vector<int64_t> many = {0};
  for (int64_t n = 0; n < 160; ++n) many.push_back(many.back() + (n * 37 + 5) % 150 + 1);
  static const std::vector<Shape> v = {
      // 32-column blocks (N HV V / 32 <= 132), partial column tile (V = 48), partial chunks.
      {2, 200, 2, 4, 128, 48, 64, {}, STRATA_DTYPE_BF16, true, true, true},
      // G = 3, K = 100 (general loads), varlen with empty and one-token sequences.
      {1, 300, 1, 3, 100, 200, 64, {0, 0, 1, 64, 129, 300}, STRATA_DTYPE_BF16, true, false, false},
      // chunk size 32.
      {1, 150, 2, 4, 128, 128, 32, {0, 31, 32, 97, 150}, STRATA_DTYPE_BF16, false, true, true},
      // 64-column blocks (40 sequence-heads), 128-column blocks (640).
      {10, 100, 2, 4, 128, 128, 64, {}, STRATA_DTYPE_BF16, true, true, false},
      {1, many.back(), 2, 4, 128, 128, 64, many, STRATA_DTYPE_BF16, true, true, false},
      // f16: two S / Vd terms (two stages at 32 columns with P pre-computed), 64 columns.
      {2, 200, 2, 4, 128, 128, 64, {}, STRATA_DTYPE_F16, true, true, true},
      {10, 100, 1, 4, 64, 128, 64, {}, STRATA_DTYPE_F16, false, true, false},
  };
  return v;
}

// The four forms of the pass: P inline / pre-computed, 8 / 16 warps (16 warps run >= 64 columns per block).
struct Form {
  StateOKernel kernel;
  StateOBlock block;
  const char* name;
};
constexpr Form kForms[] = {{StateOKernel::kInline, StateOBlock::k8Warps, "inline 8 warps"},
                           {StateOKernel::kPrecomputedP, StateOBlock::k8Warps, "pre-computed P 8 warps"},
                           {StateOKernel::kInline, StateOBlock::k16Warps, "inline 16 warps"},
                           {StateOKernel::kPrecomputedP, StateOBlock::k16Warps, "pre-computed P 16 warps"}};
int run_form(const GdnFwdParams& p, const Form& f) {
  if (f.kernel == StateOKernel::kPrecomputedP)
    if (const int r = fwd_cuda_qk_gate(p, nullptr); r != STRATA_SUCCESS) return r;
  return fwd_cuda_state_o(p, f.kernel, f.block, nullptr);
}

TEST(GdnFwdCudaVariants, EveryFormSameBitsAsInline) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const Shape& s : shapes()) {
    Problem pr(s, 100 + idx);
    ASSERT_EQ(fwd_cuda_qk_gate_reject(pr.p), "") << "shape " << idx;
    ASSERT_EQ(fwd_cuda_state_o_reject(pr.p), "") << "shape " << idx;
    std::vector<uint8_t> first;
    for (const Form& f : kForms) {
      pr.poison();
      ASSERT_EQ(run_form(pr.p, f), STRATA_SUCCESS) << "shape " << idx << ", " << f.name;
      const std::vector<uint8_t> out = pr.outputs();
      // No NaN left from the poison in o (every row of every sequence written; 0xffff is a NaN in bf16 / f16).
      size_t unwritten = 0;
      for (size_t i = 0; i + 1 < pr.o->bytes; i += 2) unwritten += (out[i] == 0xff && out[i + 1] == 0xff);
      EXPECT_EQ(unwritten, 0u) << "shape " << idx << ", " << f.name;
      if (first.empty()) first = out;
      else EXPECT_TRUE(out == first) << "shape " << idx << ": " << f.name << " differs from " << kForms[0].name;
    }
    ++idx;
  }
}

using gdn_test::rel_rms;

// The wgmma pass's primitives on one warpgroup against host sums (fwd_cuda_wgmma_layout_probe): the K-major
// descriptors of W S / Q S (op 0), the register A fragments read by ldmatrix.trans for the state update (op 2), the
// transposed stmatrix stores of the S / Vn / Vd operand tiles (op 3). Ops 1 (LBO and SBO exchanged) and 4 (register A
// fragments 1 and 2 exchanged) are printed as diagnostics only: if op 0 (2) failed and op 1 (4) matched, the
// descriptors' byte offsets (the A fragment's register order) are the wrong way round.
TEST(GdnFwdCudaVariants, WgmmaLayoutProbe) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(5);
  const std::vector<uint8_t> ab = random_bytes(64 * 128, STRATA_DTYPE_BF16, rng, 1.0);
  const std::vector<uint8_t> bb = random_bytes(16 * 128, STRATA_DTYPE_BF16, rng, 1.0);
  auto val = [](const std::vector<uint8_t>& v, int i) {
    uint16_t b;
    std::memcpy(&b, v.data() + 2 * i, 2);
    return static_cast<double>(bf16_bits_to_f32(b));
  };
  auto A = upload(ab.data(), ab.size()), B = upload(bb.data(), bb.size());
  Dev D(64 * 16 * 4);
  std::vector<float> got[5];
  for (int op = 0; op < 5; ++op) {
    D.poison();
    ASSERT_EQ(fwd_cuda_wgmma_layout_probe(op, A->p, B->p, static_cast<float*>(D.p), nullptr), STRATA_SUCCESS) << op;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "op " << op;
    got[op].resize(64 * 16);
    ASSERT_EQ(cudaMemcpy(got[op].data(), D.p, 64 * 16 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  auto max_err = [&](const std::vector<float>& g, auto expect) {
    double e = 0;
    for (int i = 0; i < 64 * 16; ++i) e = std::max(e, std::fabs(g[i] - expect(i)) / (1.0 + std::fabs(expect(i))));
    return e;
  };
  auto ab_t = [&](int i) {  // (A Bᵀ)[i / 16][i % 16]
    double s = 0;
    for (int k = 0; k < 128; ++k) s += val(ab, (i / 16) * 128 + k) * val(bb, (i % 16) * 128 + k);
    return s;
  };
  auto upd = [&](int i) {  // Σ_t A[t][key] B[v][t], key = i / 16, v = i % 16, B as [16][64]
    double s = 0;
    for (int t = 0; t < 64; ++t) s += val(ab, t * 128 + i / 16) * val(bb, (i % 16) * 64 + t);
    return s;
  };
  auto tr = [&](int i) {  // op 0's GPU value at (t, v) = (i % 64, i / 64), rounded to bf16
    return static_cast<double>(bf16_bits_to_f32(f32_to_bf16_bits(got[0][(i % 64) * 16 + i / 64])));
  };
  const double e0 = max_err(got[0], ab_t), e1 = max_err(got[1], ab_t), e2 = max_err(got[2], upd),
               e3 = max_err(got[3], tr), e4 = max_err(got[4], upd);
  std::printf("[wgmma probe] max rel err: op0 (A Bt, descriptors) %.3g, op1 (LBO/SBO exchanged) %.3g, op2 (register "
              "A by ldmatrix.trans) %.3g, op3 (stmatrix.trans) %.3g, op4 (op2, A registers 1 / 2 exchanged) %.3g\n",
              e0, e1, e2, e3, e4);
  std::fflush(stdout);
  EXPECT_LT(e0, 1e-4) << "wgmma descriptors";
  EXPECT_LT(e2, 1e-4) << "register A fragments";
  EXPECT_EQ(e3, 0.0) << "stmatrix.trans";
}

// The forms of the wgmma pass: the warp-specialised split form (session 9) and its shortened-chain forms (session 11:
// the output warpgroup decoupled by named barriers, staged o / v_new stores; one state warpgroup per block at 32 / 64
// columns). bits: the split form's bits at every width (else within bf16 tolerance).
struct WgmmaForm {
  WgmmaPass pass;
  const char* name;
  bool bits;
};
constexpr WgmmaForm kWgmmaForms[] = {{WgmmaPass::kSplit, "split", true},
                                     {WgmmaPass::kShort, "short", true},
                                     {WgmmaPass::kShortOneWg, "short_1wg", false}};

// The shapes the wgmma passes take (bf16, K = 128, V % 32 == 0, chunk 64) among shapes(), plus V = 96 (32-column
// blocks only) and V = 64 (128 columns refused) with varlen empty / one-token / chunk-boundary documents.
std::vector<Shape> wgmma_shapes() {
  std::vector<Shape> ws;
  for (const Shape& s : shapes())
    if (s.dt == STRATA_DTYPE_BF16 && s.K == 128 && s.V % 32 == 0 && s.BT == 64) ws.push_back(s);
  ws.push_back({3, 333, 2, 4, 128, 96, 64, {}, STRATA_DTYPE_BF16, true, true, true});
  ws.push_back({1, 400, 1, 2, 128, 64, 64, {0, 0, 1, 63, 64, 65, 200, 400}, STRATA_DTYPE_BF16, true, true, true});
  // no h0, ht, v_new; a one-chunk sequence with a partial chunk.
  ws.push_back({2, 37, 1, 2, 128, 128, 64, {}, STRATA_DTYPE_BF16, false, false, false});
  return ws;
}

// The session-11 forms' outputs are the split form's bits (the same products in the same order; only the
// synchronisation and the issue order of independent steps differ); with exact = false (one state warpgroup: other
// N per wgmma) the differing bytes are only reported, the values are held to tolerances by the callers.
void expect_split_bits(const std::string& what, const std::vector<uint8_t>& out, const std::vector<uint8_t>& ref,
                       bool exact = true) {
  size_t diff = out.size() == ref.size() ? 0 : out.size();
  for (size_t i = 0; i < out.size() && i < ref.size(); ++i) diff += out[i] != ref[i];
  std::printf("[wgmma check] %s: %zu of %zu bytes differ from the split form\n", what.c_str(), diff, out.size());
  if (exact) EXPECT_EQ(diff, 0u) << what << ": not the split form's bits";
}

// The wgmma pass (fwd_cuda_state_o_wgmma: P inline / pre-computed, the split form, every block width that divides V) against the
// mma.sync pass (inline, 8 warps) on the shapes it takes (bf16, K = 128, V % 32 == 0, chunk 64), plus one with
// V = 96 (32-column blocks only) and one with V = 64 at 128 columns refused: o, v_new and ht within 1e-2 relative
// RMS (both round S, v_new and P to bf16; only the f32 summation order inside the products differs), every o row
// written, the same bits on a second run.
TEST(GdnFwdCudaVariants, WgmmaMatchesMma) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> ws = wgmma_shapes();
  ASSERT_GE(ws.size(), 5u);
  int idx = 0;
  for (const Shape& s : ws) {
    Problem pr(s, 300 + idx);
    ASSERT_EQ(fwd_cuda_state_o_wgmma_reject(pr.p), "") << "shape " << idx;
    pr.poison();
    ASSERT_EQ(fwd_cuda_state_o(pr.p, StateOKernel::kInline, StateOBlock::k8Warps, nullptr), STRATA_SUCCESS);
    const std::vector<uint8_t> o_ref = pr.o->bits();
    const std::vector<uint8_t> vn_ref = pr.vn ? pr.vn->bits() : std::vector<uint8_t>{};
    const std::vector<uint8_t> ht_ref = pr.ht ? pr.ht->bits() : std::vector<uint8_t>{};
    std::vector<uint8_t> split_out[4], split_o[4];  // the split form's outputs (and o) per width
    for (const WgmmaForm& fm : kWgmmaForms)
      for (const int width : {0, 32, 64, 128}) {
        if (width && s.V % width != 0) {
          EXPECT_NE(fwd_cuda_state_o_wgmma(pr.p, width, fm.pass, nullptr), STRATA_SUCCESS)
              << "V " << s.V << " width " << width;
          continue;
        }
        const std::string what = std::string(fm.name) + ", width " + std::to_string(width) + ", shape " +
                                 std::to_string(idx);
        std::vector<uint8_t> first;
        for (int run = 0; run < 2; ++run) {
          pr.poison();
          ASSERT_EQ(fwd_cuda_state_o_wgmma(pr.p, width, fm.pass, nullptr), STRATA_SUCCESS) << what;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          const std::vector<uint8_t> out = pr.outputs();
          if (run == 1) {
            EXPECT_TRUE(out == first) << what << ": second run differs";
            continue;
          }
          first = out;
          const int wi = width / 32 - (width == 128);
          const std::vector<uint8_t> o = pr.o->bits();
          if (fm.pass == WgmmaPass::kSplit) {
            split_out[wi] = out, split_o[wi] = o;
          } else {
            expect_split_bits(what, out, split_out[wi], fm.bits);
            const double es = rel_rms(o, split_o[wi], s.dt);
            if (!fm.bits) std::printf("[wgmma check] %s: o rel RMS vs the split form %.2e\n", what.c_str(), es);
            EXPECT_LT(es, 1e-3) << what << ": o against the split form";
          }
          size_t unwritten = 0;
          for (size_t i = 0; i + 1 < o.size(); i += 2) unwritten += (o[i] == 0xff && o[i + 1] == 0xff);
          EXPECT_EQ(unwritten, 0u) << what;
          const double eo = rel_rms(o, o_ref, s.dt);
          const double ev = pr.vn ? rel_rms(pr.vn->bits(), vn_ref, s.dt) : 0.0;
          const double eh = pr.ht ? rel_rms(pr.ht->bits(), ht_ref, STRATA_DTYPE_F32) : 0.0;
          std::printf("[wgmma check] %s: rel RMS vs mma.sync o %.2e v_new %.2e ht %.2e, unwritten o %zu\n",
                      what.c_str(), eo, ev, eh, unwritten);
          EXPECT_LT(eo, 1e-2) << what << ": o";
          EXPECT_LT(ev, 1e-2) << what << ": v_new";
          EXPECT_LT(eh, 1e-2) << what << ": ht";
        }
      }
    ++idx;
  }
}

// chunk_gated_delta_rule_fwd_h on the split wgmma pass (fwd_cuda_fwd_h_wgmma, every width dividing V) against the
// mma.sync state_mma (fwd_cuda(kFwdH, kMma)) on the wgmma shapes: h, v_new and ht within 1e-2 relative RMS (both
// round S and Vd to bf16 once; the f32 summation order inside the products differs), every h entry written (the
// poison is a bf16 NaN), the same bits on a second run.
TEST(GdnFwdCudaVariants, WgmmaFwdHMatchesMma) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const Shape& s : wgmma_shapes()) {
    Problem pr(s, 500 + idx);
    const GdnFwdParams f = pr.fwd_h();
    ASSERT_EQ(fwd_cuda_fwd_h_wgmma_reject(f), "") << "shape " << idx;
    pr.poison();
    ASSERT_EQ(fwd_cuda(FwdOp::kFwdH, f, FwdCudaKernels::kMma, nullptr), STRATA_SUCCESS) << "shape " << idx;
    const std::vector<uint8_t> h_ref = pr.hs->bits();
    const std::vector<uint8_t> vn_ref = pr.vn ? pr.vn->bits() : std::vector<uint8_t>{};
    const std::vector<uint8_t> ht_ref = pr.ht ? pr.ht->bits() : std::vector<uint8_t>{};
    std::vector<uint8_t> split_out[4], split_h[4];  // per width (kShort gives the split form's bits)
    for (const WgmmaPass form : {WgmmaPass::kSplit, WgmmaPass::kShort, WgmmaPass::kShortOneWg})
    for (const int width : {0, 32, 64, 128}) {
      if (width && s.V % width != 0) {
        EXPECT_NE(fwd_cuda_fwd_h_wgmma(f, width, form, nullptr), STRATA_SUCCESS) << "V " << s.V << " width " << width;
        continue;
      }
      const char* fn = form == WgmmaPass::kSplit ? "fwd_h split" : form == WgmmaPass::kShort ? "fwd_h short"
                                                                                                : "fwd_h short_1wg";
      const std::string what = std::string(fn) + " width " + std::to_string(width) + ", shape " + std::to_string(idx);
      std::vector<uint8_t> first;
      for (int run = 0; run < 2; ++run) {
        pr.poison();
        ASSERT_EQ(fwd_cuda_fwd_h_wgmma(f, width, form, nullptr), STRATA_SUCCESS) << what;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        std::vector<uint8_t> out = pr.hs->bits();
        for (const Dev* x : {pr.vn.get(), pr.ht.get()})
          if (x) {
            const auto b = x->bits();
            out.insert(out.end(), b.begin(), b.end());
          }
        if (run == 1) {
          EXPECT_TRUE(out == first) << what << ": second run differs";
          continue;
        }
        first = out;
        const int wi = width / 32 - (width == 128);
        const std::vector<uint8_t> hb = pr.hs->bits();
        if (form == WgmmaPass::kSplit) {
          split_out[wi] = out, split_h[wi] = hb;
        } else {
          expect_split_bits(what, out, split_out[wi], form == WgmmaPass::kShort);
          const double es = rel_rms(hb, split_h[wi], s.dt);
          if (form != WgmmaPass::kShort)
            std::printf("[wgmma check] %s: h rel RMS vs the split form %.2e\n", what.c_str(), es);
          EXPECT_LT(es, 1e-3) << what << ": h against the split form";
        }
        size_t unwritten = 0;
        for (size_t i = 0; i + 1 < hb.size(); i += 2) unwritten += (hb[i] == 0xff && hb[i + 1] == 0xff);
        EXPECT_EQ(unwritten, 0u) << what;
        const double eh = rel_rms(hb, h_ref, s.dt);
        const double ev = pr.vn ? rel_rms(pr.vn->bits(), vn_ref, s.dt) : 0.0;
        const double et = pr.ht ? rel_rms(pr.ht->bits(), ht_ref, STRATA_DTYPE_F32) : 0.0;
        std::printf("[wgmma check] %s: rel RMS vs state_mma h %.2e v_new %.2e ht %.2e, unwritten h %zu\n",
                    what.c_str(), eh, ev, et, unwritten);
        EXPECT_LT(eh, 1e-2) << what << ": h";
        EXPECT_LT(ev, 1e-2) << what << ": v_new";
        EXPECT_LT(et, 1e-2) << what << ": ht";
      }
    }
    ++idx;
  }
}

// Relative RMS difference of a 16-bit (dt) or f32 buffer against float64 values.
double rel_rms64(const std::vector<uint8_t>& a, const std::vector<double>& r, int32_t dt) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    float x = 0;
    if (dt == STRATA_DTYPE_F32) {
      std::memcpy(&x, a.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, a.data() + 2 * i, 2);
      x = dt == STRATA_DTYPE_BF16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
    }
    num += (double(x) - r[i]) * (double(x) - r[i]), den += r[i] * r[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The float64 reference (fwd_reference<double>) of the fused forward on a problem's inputs: h, v_new, ht by
// chunk_gated_delta_rule_fwd_h, then o by chunk_fwd_o from that h and v_new.
struct Ref64 {
  std::vector<double> h, vn, ht, o;
};
Ref64 reference64(const Problem& pr) {
  const Shape& s = pr.s;
  GdnFwdParams p = pr.p;
  std::vector<uint8_t> q = pr.q->bits(), k = pr.k->bits(), w = pr.w->bits(), u = pr.u->bits(), g = pr.g->bits();
  std::vector<uint8_t> h0 = pr.h0 ? pr.h0->bits() : std::vector<uint8_t>{};
  std::vector<int64_t> off(s.cu.size());
  if (!s.cu.empty()) {
    p.chunks.cu = s.cu.data();
    fill_chunk_offsets(p.chunks, off.data());
    p.chunks.offsets = off.data();
  }
  p.q.data = q.data(), p.k.data = k.data(), p.w.data = w.data(), p.u.data = u.data(), p.g.data = g.data();
  p.h0.data = pr.h0 ? h0.data() : nullptr;
  const int64_t B = s.B, T = s.T, HV = s.HV, K = s.K, V = s.V, N = p.shape.N;
  const int64_t hb = (s.cu.empty() ? B : 1) * p.shape.NT;
  Ref64 r;
  r.h.assign(static_cast<size_t>(hb * HV * K * V), 0.0), r.vn.assign(static_cast<size_t>(B * T * HV * V), 0.0);
  r.ht.assign(static_cast<size_t>(N * HV * K * V), 0.0), r.o.assign(static_cast<size_t>(B * T * HV * V), 0.0);
  p.h = pr.h, p.h.data = r.h.data(), p.h.dtype = STRATA_DTYPE_F64;
  p.v_new = tok(r.vn.data(), STRATA_DTYPE_F64, T, HV, V);
  p.ht = states(r.ht.data(), HV, K, V), p.ht.dtype = STRATA_DTYPE_F64;
  p.o = GdnTensor{}, p.Pqk = GdnTensor{};
  fwd_reference<double>(FwdOp::kFwdH, p);
  GdnFwdParams po = p;
  po.v = p.v_new, po.v_new = GdnTensor{}, po.ht = GdnTensor{};
  po.o = tok(r.o.data(), STRATA_DTYPE_F64, T, HV, V);
  fwd_reference<double>(FwdOp::kFwdO, po);
  return r;
}

// Both wgmma forms of the fused pass, the wgmma fwd_h and (for scale) the mma.sync passes against the float64
// reference, on the wgmma shapes without the long varlen pack: o, h, v_new, ht within 1e-2 relative RMS (bf16
// outputs; S, Vd and P enter their products rounded to bf16, fla's model).
TEST(GdnFwdCudaVariants, WgmmaMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const Shape& s : wgmma_shapes()) {
    if (s.cu.size() > 20) continue;  // the 160-document pack: covered against mma.sync above
    Problem pr(s, 700 + idx);
    const Ref64 r = reference64(pr);
    auto check = [&](const std::string& what, bool fused) {
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const double e_main = fused ? rel_rms64(pr.o->bits(), r.o, s.dt) : rel_rms64(pr.hs->bits(), r.h, s.dt);
      const double ev = pr.vn ? rel_rms64(pr.vn->bits(), r.vn, s.dt) : 0.0;
      const double et = pr.ht ? rel_rms64(pr.ht->bits(), r.ht, STRATA_DTYPE_F32) : 0.0;
      std::printf("[wgmma ref] shape %d %s: rel RMS vs f64 %s %.2e v_new %.2e ht %.2e\n", idx, what.c_str(),
                  fused ? "o" : "h", e_main, ev, et);
      EXPECT_LT(e_main, 1e-2) << what << ", shape " << idx;
      EXPECT_LT(ev, 1e-2) << what << ", shape " << idx;
      EXPECT_LT(et, 1e-2) << what << ", shape " << idx;
    };
    pr.poison();
    ASSERT_EQ(fwd_cuda_state_o(pr.p, StateOKernel::kInline, StateOBlock::k8Warps, nullptr), STRATA_SUCCESS);
    check("mma.sync state_o", true);
    for (const WgmmaForm& fm : kWgmmaForms) {
      pr.poison();
      ASSERT_EQ(fwd_cuda_state_o_wgmma(pr.p, 0, fm.pass, nullptr), STRATA_SUCCESS) << fm.name;
      check(std::string("wgmma ") + fm.name, true);
    }
    const GdnFwdParams f = pr.fwd_h();
    pr.poison();
    ASSERT_EQ(fwd_cuda(FwdOp::kFwdH, f, FwdCudaKernels::kMma, nullptr), STRATA_SUCCESS);
    check("mma.sync fwd_h", false);
    pr.poison();
    ASSERT_EQ(fwd_cuda_fwd_h_wgmma(f, 0, nullptr), STRATA_SUCCESS);
    check("wgmma fwd_h", false);
    pr.poison();
    ASSERT_EQ(fwd_cuda_fwd_h_wgmma(f, 0, WgmmaPass::kShortOneWg, nullptr), STRATA_SUCCESS);
    check("wgmma fwd_h short_1wg", false);
    ++idx;
  }
}

// (Session 14) The pass with the l2norm folded in and r_q read from p.rq (GdnFwdParams::qk_norm + rq:
// chunk_gated_delta_rule's cuda.sm90.fused_norm_r) scales P's columns and Vd's rows by r_k = p.rk and Q S's and P's
// rows by r_q = p.rq. With r_k = r_q = 1 every one of those products is by 1.0f, so it must give the kShort pass's
// bits (o, v_new, ht) on the plain inputs, at every width that divides V — which checks that the fold changes nothing
// but the scaling (ring slots, stages, staging, the r_q loads a chunk ahead). Its values with real norms are held to
// the float64 reference by ChunkGatedDeltaRuleCuda.WgmmaFusedForwardMatchesReference.
TEST(GdnFwdCudaVariants, WgmmaRqFoldWithUnitNormsGivesShortBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const Shape& s : wgmma_shapes()) {
    Problem pr(s, 900 + idx);
    pr.p.Pqk = GdnTensor{};  // the folded pass reads no pre-computed P
    const int64_t rows = s.B * s.T * s.H;
    const std::vector<float> ones(static_cast<size_t>(rows), 1.f);
    const auto rk = upload(ones.data(), ones.size() * 4), rq = upload(ones.data(), ones.size() * 4);
    GdnFwdParams fr = pr.p;
    fr.qk_norm = true, fr.qk_norm_eps = 1e-6f;
    fr.rk = tok(rk->p, STRATA_DTYPE_F32, s.T, s.H, 0);
    fr.rq = tok(rq->p, STRATA_DTYPE_F32, s.T, s.H, 0);
    ASSERT_EQ(fwd_cuda_state_o_wgmma_reject(fr), "") << "shape " << idx;
    GdnFwdParams bad = fr;
    bad.qk_norm = false;
    EXPECT_NE(fwd_cuda_state_o_wgmma_reject(bad), "") << "rq without qk_norm";
    bad = fr;
    bad.rq.dtype = STRATA_DTYPE_BF16;
    EXPECT_NE(fwd_cuda_state_o_wgmma_reject(bad), "") << "rq not f32";
    for (const int width : {32, 64, 128}) {
      if (s.V % width != 0) continue;
      pr.poison();
      ASSERT_EQ(fwd_cuda_state_o_wgmma(pr.p, width, WgmmaPass::kShort, nullptr), STRATA_SUCCESS) << width;
      const std::vector<uint8_t> ref = pr.outputs();
      const std::string what = "rq-fold, width " + std::to_string(width) + ", shape " + std::to_string(idx);
      for (int run = 0; run < 2; ++run) {
        pr.poison();
        ASSERT_EQ(fwd_cuda_state_o_wgmma(fr, width, WgmmaPass::kShort, nullptr), STRATA_SUCCESS) << what;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        expect_split_bits(what + (run ? " (second run)" : ""), pr.outputs(), ref);
      }
    }
    ++idx;
  }
}

// (Session 16) The clustered pass (GdnFwdParams::pass_cluster: the CTAs of one q/k head share each chunk's K and Q
// tiles by copy-engine multicast, in the column-block layout) runs the kShort pass's products in the same order, so it
// must give that pass's bits (o, v_new, ht) — plain, with the folded l2norm (r_q formed from the Q tile) and with r_q
// read (r_k, r_q random in [0.5, 2]) — at every width and cluster size that divides the CTAs of a q/k head (G x V /
// width), twice, with W shared as well where the cluster is one value head's column blocks (pass_cluster_w) and
// without; sizes that do not divide them are refused. The shapes: partial chunks (T = 37, 200, 333: rows past
// T zero-filled by the copy engine), varlen with empty, one-token and chunk-boundary documents (rows past a document
// zeroed by the kernel), G = 2, V = 64 / 96 / 128.
TEST(GdnFwdCudaVariants, WgmmaClusterGivesShortBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // The compiled clustered forms (gdn_fwd_cuda_wgmma.cu, mc_instance; pairs only since session 17, sizes 4 and 8
  // must be refused): plain 32 / 64 / 128 columns; r_q formed: 128 columns; r_q read: 32 columns.
  auto compiled = [](int width, int variant, int cs) {
    if (cs != 2) return false;
    if (variant == 1) return width == 128;
    if (variant == 2) return width == 32;
    return true;
  };
  const char* vname[3] = {"plain", "r_q formed", "r_q read"};
  int idx = 0, compared = 0;
  for (const Shape& s : wgmma_shapes()) {
    Problem pr(s, 1600 + idx);
    pr.p.Pqk = GdnTensor{};
    std::mt19937_64 rng(77 + idx);
    std::uniform_real_distribution<float> ur(0.5f, 2.f);
    std::vector<float> rkv(static_cast<size_t>(s.B * s.T * s.H)), rqv(rkv.size());
    for (float& x : rkv) x = ur(rng);
    for (float& x : rqv) x = ur(rng);
    const auto rk = upload(rkv.data(), rkv.size() * 4), rq = upload(rqv.data(), rqv.size() * 4);
    for (int variant = 0; variant < 3; ++variant) {
      GdnFwdParams f = pr.p;
      if (variant > 0) f.qk_norm = true, f.qk_norm_eps = 1e-6f, f.rk = tok(rk->p, STRATA_DTYPE_F32, s.T, s.H, 0);
      if (variant == 2) f.rq = tok(rq->p, STRATA_DTYPE_F32, s.T, s.H, 0);
      for (const int width : {32, 64, 128}) {
        if (s.V % width != 0) continue;
        const int64_t ctas = (s.HV / s.H) * (s.V / width);
        pr.poison();
        ASSERT_EQ(fwd_cuda_state_o_wgmma(f, width, WgmmaPass::kShort, nullptr), STRATA_SUCCESS) << width;
        const std::vector<uint8_t> ref = pr.outputs();
        for (const int cs : {2, 4, 8}) {
          GdnFwdParams fc = f;
          fc.pass_cluster = cs;
          const std::string what = std::string(vname[variant]) + ", width " + std::to_string(width) + ", cluster " +
                                   std::to_string(cs) + ", shape " + std::to_string(idx);
          if (ctas % cs != 0 || !compiled(width, variant, cs)) {
            EXPECT_NE(fwd_cuda_state_o_wgmma(fc, width, WgmmaPass::kShort, nullptr), STRATA_SUCCESS) << what;
            continue;
          }
          for (int run = 0; run < 4; ++run) {
            fc.pass_cluster_w = run < 2;  // W shared where the cluster is one value head's column blocks, then not
            const std::string wh = (s.V / width) % cs == 0 ? (run < 2 ? ", W shared" : ", W not shared") : "";
            pr.poison();
            ASSERT_EQ(fwd_cuda_state_o_wgmma(fc, width, WgmmaPass::kShort, nullptr), STRATA_SUCCESS) << what << wh;
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << wh;
            expect_split_bits("cluster: " + what + wh + (run % 2 ? " (second run)" : ""), pr.outputs(), ref);
            ++compared;
          }
        }
      }
    }
    ++idx;
  }
  std::printf("[gdn_fwd s16] clustered pass against kShort: %d comparisons\n", compared);
  EXPECT_GE(compared, 20);
}

TEST(GdnFwdCudaVariants, RejectsWithoutPqk) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Problem pr(shapes()[0], 1);
  pr.p.Pqk = GdnTensor{};
  EXPECT_NE(fwd_cuda_qk_gate_reject(pr.p), "");
  EXPECT_NE(fwd_cuda_state_o(pr.p, StateOKernel::kPrecomputedP, nullptr), STRATA_SUCCESS);
}

// Prints a timing line and appends it to $OUT/gdn_fwd_timing.txt when OUT is set (the log folder of the GPU
// run, which comes back; ctest shows a passing test's output only with -V).
void report(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (const char* out = std::getenv("OUT"); out && *out)
    if (FILE* f = std::fopen((std::string(out) + "/gdn_fwd_timing.txt").c_str(), "a")) {
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

using gdn_test::time_ms;

// The inputs of the timing tests at a benchmark shape (bf16, H = 16, HV = 32, K = V = 128, chunk 64, T = 32768 / B):
// q, k, v, w, u, β by cudaMemset (bf16 0x3c3c ≈ 0.0115), γ = 0, and the params reading them (outputs: the caller's).
struct BenchInputs {
  static constexpr int64_t H = 16, HV = 32, K = 128, V = 128;
  static constexpr int32_t dt = STRATA_DTYPE_BF16;
  int64_t B, T, NT, rows;
  Dev q, k, v, w, u, g, beta;
  GdnFwdParams p;
  explicit BenchInputs(int64_t b)
      : B(b), T(32768 / b), NT(T / 64), rows(B * T), q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * V * 2),
        w(rows * HV * K * 2), u(rows * HV * V * 2), g(rows * HV * 4), beta(rows * HV * 2) {
    for (Dev* x : {&q, &k, &v, &w, &u, &beta}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    GdnShape& d = p.shape;
    d.B = B, d.T = T, d.H = H, d.HV = HV, d.G = HV / H, d.K = K, d.V = V, d.BT = 64, d.N = B, d.NTr = NT;
    d.NT = NT, d.scale = 0.0884f;
    GdnChunks& m = p.chunks;
    m.B = B, m.T = T, m.N = B, m.BT = 64, m.NTr = NT;
    p.q = tok(q.p, dt, T, H, K), p.k = tok(k.p, dt, T, H, K), p.v = tok(v.p, dt, T, HV, V);
    p.g = tok(g.p, STRATA_DTYPE_F32, T, HV, 0), p.beta = tok(beta.p, dt, T, HV, 0);
    p.w = tok(w.p, dt, T, HV, K), p.u = tok(u.p, dt, T, HV, V);
  }
};

// The forward's kernels at the benchmark shapes (inputs by cudaMemset: bf16 0x3c3c ≈ 0.0115, γ = 0, β = 0.0115):
// prepare_wy_repr_fwd (w, u), the gated Q Kᵀ, and the fused pass in its four forms, for a per-kernel split of the
// fused forward (the l2norm and cumsum kernels before them are not included).
TEST(GdnFwdCudaVariants, TimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    BenchInputs in(B);
    const int64_t T = in.T, HV = in.HV, K = in.K, V = in.V, rows = in.rows;
    const int32_t dt = in.dt;
    GdnFwdParams& p = in.p;
    Dev o(rows * HV * V * 2), P(rows * HV * 64 * 2), ht(B * HV * K * V * 4);
    const double wy = time_ms([&] { return fwd_cuda(FwdOp::kPrepareWY, p, FwdCudaKernels::kMma, nullptr); });
    p.o = tok(o.p, dt, T, HV, V), p.ht = states(ht.p, HV, K, V), p.Pqk = tok(P.p, dt, T, HV, 64);
    const double qk = time_ms([&] { return fwd_cuda_qk_gate(p, nullptr); });
    // The pass alone in each form (the pre-computed forms read the P qk_gate left in p.Pqk).
    double pass[4];
    for (int i = 0; i < 4; ++i) {
      pass[i] = time_ms([&] { return fwd_cuda_state_o(p, kForms[i].kernel, kForms[i].block, nullptr); });
      EXPECT_GT(pass[i], 0.0) << kForms[i].name;
    }
    EXPECT_GT(wy, 0.0);
    EXPECT_GT(qk, 0.0);
    report(fmt_line("[gdn_fwd timing] bf16 B=%lld T=%lld H=16 HV=32 K=V=128: prepare_wy_repr_fwd (w, u) %.3f ms, "
                    "qk_gate %.3f ms, state_o inline-P %.3f ms, state_o pre-computed-P %.3f ms, 16 warps: inline-P "
                    "%.3f ms, pre-computed-P %.3f ms (fused forward without l2norm/cumsum: inline %.3f ms, "
                    "pre-computed %.3f ms, 16 warps inline %.3f ms, pre-computed %.3f ms)",
                    static_cast<long long>(B), static_cast<long long>(T), wy, qk, pass[0], pass[1], pass[2], pass[3],
                    wy + pass[0], wy + qk + pass[1], wy + pass[2], wy + qk + pass[3]));
  }
}

// The wgmma passes at the benchmark shapes (bf16, H = 16, HV = 32, K = V = 128; B = 4 T = 8192 and B = 1 T = 32768;
// inputs by cudaMemset as TimingAtBenchShapes; median of 7): the fused state + output pass in its split form
// (session 9) and its shortened-chain forms (session 11) at the automatic and the other widths, the best mma.sync
// passes; and chunk_gated_delta_rule_fwd_h (h, v_new, ht: what the backward re-runs) on state_mma and both wgmma forms.
// Prints "[gdn_pass timing] ..." and appends it to $OUT/gdn_fwd_timing.txt; fails only if a launch fails.
TEST(GdnFwdCudaVariants, WgmmaPassTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    BenchInputs in(B);
    const int64_t T = in.T, HV = in.HV, K = in.K, V = in.V, rows = in.rows, NT = in.NT;
    const int32_t dt = in.dt;
    GdnFwdParams p = in.p;
    p.v = GdnTensor{}, p.beta = GdnTensor{};  // (the pass reads neither)
    Dev o(rows * HV * V * 2), vn(rows * HV * V * 2), P(rows * HV * 64 * 2), ht(B * HV * K * V * 4),
        hs(B * NT * HV * K * V * 2);
    p.o = tok(o.p, dt, T, HV, V), p.ht = states(ht.p, HV, K, V), p.Pqk = tok(P.p, dt, T, HV, 64);
    EXPECT_EQ(fwd_cuda_qk_gate(p, nullptr), STRATA_SUCCESS);
    const double mma16 = time_ms([&] {
      return fwd_cuda_state_o(p, StateOKernel::kInline, StateOBlock::k16Warps, nullptr);
    });
    const double mma8p = time_ms([&] {
      return fwd_cuda_state_o(p, StateOKernel::kPrecomputedP, StateOBlock::k8Warps, nullptr);
    });
    double split[4];  // automatic width, 32, 64, 128 columns
    const int widths[4] = {0, 32, 64, 128};
    for (int i = 0; i < 4; ++i) {
      split[i] = time_ms([&] {
        return fwd_cuda_state_o_wgmma(p, widths[i], WgmmaPass::kSplit, nullptr);
      });
      EXPECT_GT(split[i], 0.0) << widths[i];
    }
    double sh[2][4];  // the session-11 forms (kShort, kShortOneWg), same widths
    const WgmmaPass sh_form[2] = {WgmmaPass::kShort, WgmmaPass::kShortOneWg};
    for (int fm = 0; fm < 2; ++fm)
      for (int i = 0; i < 4; ++i) {
        sh[fm][i] = time_ms([&] { return fwd_cuda_state_o_wgmma(p, widths[i], sh_form[fm], nullptr); });
        EXPECT_GT(sh[fm][i], 0.0) << widths[i];
      }
    report(fmt_line("[gdn_pass timing] fused pass bf16 B=%lld T=%lld H=16 HV=32 K=V=128 (automatic width %d): wgmma "
                    "split %.3f ms (32 / 64 / 128 columns: %.3f / %.3f / %.3f ms); wgmma short %.3f ms (%.3f / %.3f / "
                    "%.3f ms); wgmma short_1wg %.3f ms (%.3f / %.3f / %.3f ms); mma.sync 16 warps inline %.3f ms, "
                    "8 warps pre-computed-P %.3f ms",
                    static_cast<long long>(B), static_cast<long long>(T), fwd_cuda_state_o_wgmma_width(p, 132),
                    split[0], split[1], split[2], split[3], sh[0][0], sh[0][1], sh[0][2], sh[0][3], sh[1][0],
                    sh[1][1], sh[1][2], sh[1][3], mma16, mma8p));
    // chunk_gated_delta_rule_fwd_h as the backward runs it: h, v_new, ht.
    GdnFwdParams f = p;
    f.o = GdnTensor{}, f.Pqk = GdnTensor{}, f.v_new = tok(vn.p, dt, T, HV, V);
    f.h.data = hs.p, f.h.dtype = dt;
    f.h.st[0] = NT * HV * K * V, f.h.st[1] = HV * K * V, f.h.st[2] = K * V, f.h.st[3] = V, f.h.st[4] = 1;
    const double h_mma = time_ms([&] { return fwd_cuda(FwdOp::kFwdH, f, FwdCudaKernels::kMma, nullptr); });
    double h_wg[3][4];  // split, short, short_1wg
    const WgmmaPass h_form[3] = {WgmmaPass::kSplit, WgmmaPass::kShort, WgmmaPass::kShortOneWg};
    for (int fm = 0; fm < 3; ++fm)
      for (int i = 0; i < 4; ++i) {
        h_wg[fm][i] = time_ms([&] { return fwd_cuda_fwd_h_wgmma(f, widths[i], h_form[fm], nullptr); });
        EXPECT_GT(h_wg[fm][i], 0.0) << widths[i];
      }
    EXPECT_GT(h_mma, 0.0);
    report(fmt_line("[gdn_pass timing] fwd_h (h, v_new, ht) bf16 B=%lld T=%lld H=16 HV=32 K=V=128: state_mma %.3f ms; "
                    "wgmma split %.3f ms (32 / 64 / 128 columns: %.3f / %.3f / %.3f ms); wgmma short %.3f ms (%.3f / "
                    "%.3f / %.3f ms); wgmma short_1wg %.3f ms (%.3f / %.3f / %.3f ms)",
                    static_cast<long long>(B), static_cast<long long>(T), h_mma, h_wg[0][0], h_wg[0][1], h_wg[0][2],
                    h_wg[0][3], h_wg[1][0], h_wg[1][1], h_wg[1][2], h_wg[1][3], h_wg[2][0], h_wg[2][1], h_wg[2][2],
                    h_wg[2][3]));
  }
}

// (Session 16) The clustered pass against the kShort pass alone at the benchmark shapes (inputs by cudaMemset; rk, rq
// f32 ≈ 0.0115): plain, with r_q formed (the folded l2norm's 128-column pass) and with r_q read (its 32-column pass),
// at the automatic width, each cluster size that applies; median of 9 interleaved. Prints "[gdn_fwd s16] pass ...".
TEST(GdnFwdCudaVariants, WgmmaClusterPassTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    BenchInputs in(B);
    const int64_t T = in.T, HV = in.HV, K = in.K, V = in.V, rows = in.rows;
    const int32_t dt = in.dt;
    GdnFwdParams p = in.p;
    p.v = GdnTensor{}, p.beta = GdnTensor{};
    Dev o(rows * HV * V * 2), ht(B * HV * K * V * 4), rk(rows * in.H * 4), rq(rows * in.H * 4);
    EXPECT_EQ(cudaMemset(rk.p, 0x3c, rk.bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(rq.p, 0x3c, rq.bytes), cudaSuccess);
    p.o = tok(o.p, dt, T, HV, V), p.ht = states(ht.p, HV, K, V);
    const int width = fwd_cuda_state_o_wgmma_width(p, 132);
    for (int variant = 0; variant < 3; ++variant) {
      GdnFwdParams f = p;
      if (variant > 0) f.qk_norm = true, f.qk_norm_eps = 1e-6f, f.rk = tok(rk.p, STRATA_DTYPE_F32, T, in.H, 0);
      if (variant == 2) f.rq = tok(rq.p, STRATA_DTYPE_F32, T, in.H, 0);
      // sizes: cluster size, negative: the same without W shared (where the cluster is one value head's blocks)
      std::vector<int> sizes = {0};
      for (const int cs : {2, 4, 8}) {
        GdnFwdParams fc = f;
        fc.pass_cluster = cs;
        if (fwd_cuda_state_o_wgmma(fc, width, WgmmaPass::kShort, nullptr) == STRATA_SUCCESS) {
          sizes.push_back(cs);
          if ((V / width) % cs == 0) sizes.push_back(-cs);
        }
      }
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (sizes.size() < 2) continue;
      std::vector<std::function<void()>> calls;
      for (const int cs : sizes)
        calls.push_back([&, cs] {
          GdnFwdParams fc = f;
          fc.pass_cluster = cs < 0 ? -cs : cs, fc.pass_cluster_w = cs > 0;
          EXPECT_EQ(fwd_cuda_state_o_wgmma(fc, width, WgmmaPass::kShort, nullptr), STRATA_SUCCESS);
        });
      const std::vector<double> t = gdn_test::time_median_ms(calls, 9);
      std::string line = fmt_line("[gdn_fwd s16] pass alone bf16 B=%lld T=%lld H=16 HV=32 K=V=128, %d columns, %s, "
                                  "median of 9 interleaved:",
                                  static_cast<long long>(B), static_cast<long long>(T), width,
                                  variant == 0 ? "plain" : variant == 1 ? "r_q formed" : "r_q read");
      for (size_t i = 0; i < sizes.size(); ++i) {
        int occ = 0;
        const int cs = sizes[i] < 0 ? -sizes[i] : sizes[i];
        if (cs) {
          GdnFwdParams fc = f;
          fc.pass_cluster = cs, fc.pass_cluster_w = sizes[i] > 0;
          EXPECT_EQ(fwd_cuda_state_o_wgmma_cluster_occupancy(fc, width, &occ), STRATA_SUCCESS);
        }
        const char* wn = sizes[i] < 0 ? " K, Q only" : (V / width) % (cs ? cs : 1) == 0 ? " K, Q, W" : " K, Q";
        line += cs ? fmt_line(" cluster %d%s %.3f ms (%d of %lld clusters resident)", cs, wn, t[i], occ,
                              static_cast<long long>(B * HV * (V / width) / cs))
                   : fmt_line(" no cluster %.3f ms", t[i]);
        if (i + 1 < sizes.size()) line += ",";
      }
      report(line);
    }
  }
}

// ---------------------------------------------------------------- the pre-state kernel (prep_wgmma, session 10)
// fwd_cuda_prep writes w, u, A (wy_mma<kPrepare>'s outputs) and the gated Q Kᵀ (qk_gate_mma's) in one kernel on
// warpgroup MMA: the same precision model, not the same bits (summation order), so it is compared with them within
// bf16 tolerances. A prepare_wy_repr_fwd problem with q and the Pqk buffer: k, q ~ N(0, K^-1/2), v ~ N(0, 1), β in
// (0.05, 1) (f32 or the token dtype), γ = chunk-local cumsum of gates in [-0.1, 0] (f32; absent with no_gates, then
// β too).
struct PrepShape {
  int64_t B, T, H, HV, K, V, BT;
  std::vector<int64_t> cu;
  int32_t dt;
  bool beta_tok;  // β in the token dtype (else f32)
  bool no_gates;  // neither g nor β
};
struct PrepProblem {
  PrepShape s;
  GdnFwdParams p;
  gdn_test::FwdChunks ch;
  std::unique_ptr<Dev> q, k, v, g, beta, w, u, A, P;
  PrepProblem(const PrepShape& sh, uint64_t seed) : s(sh) {
    std::mt19937_64 rng(seed);
    const int64_t B = s.B, T = s.T, H = s.H, HV = s.HV, K = s.K, V = s.V, rows = B * T, es = 2;
    ch = gdn_test::set_fwd_shape(p, B, T, H, HV, K, V, s.BT, s.cu);
    const std::vector<int64_t>& bounds = ch.bounds;
    std::vector<float> gam(static_cast<size_t>(rows * HV)), bet(static_cast<size_t>(rows * HV));
    std::uniform_real_distribution<float> ud(-0.1f, 0.f), ub(0.05f, 1.f);
    for (size_t n = 0; n + 1 < bounds.size(); ++n)
      for (int64_t hv = 0; hv < HV; ++hv) {
        float acc = 0.f;
        for (int64_t t = bounds[n]; t < bounds[n + 1]; ++t) {
          if ((t - bounds[n]) % s.BT == 0) acc = 0.f;
          acc += ud(rng);
          gam[static_cast<size_t>(t * HV + hv)] = acc;
        }
      }
    for (float& x : bet) x = ub(rng);
    const double sk = 1.0 / std::sqrt(static_cast<double>(K));
    auto rnd = [&](int64_t n, double sd) {
      const auto b = random_bytes(n, s.dt, rng, sd);
      return upload(b.data(), b.size());
    };
    q = rnd(rows * H * K, sk), k = rnd(rows * H * K, sk), v = rnd(rows * HV * V, 1.0);
    p.q = tok(q->p, s.dt, T, H, K), p.k = tok(k->p, s.dt, T, H, K), p.v = tok(v->p, s.dt, T, HV, V);
    if (!s.no_gates) {
      g = upload(gam.data(), gam.size() * 4);
      p.g = tok(g->p, STRATA_DTYPE_F32, T, HV, 0);
      if (s.beta_tok) {
        std::vector<uint16_t> b16(bet.size());
        for (size_t i = 0; i < bet.size(); ++i)
          b16[i] = s.dt == STRATA_DTYPE_BF16 ? f32_to_bf16_bits(bet[i]) : f32_to_f16_bits(bet[i]);
        beta = upload(b16.data(), b16.size() * 2);
        p.beta = tok(beta->p, s.dt, T, HV, 0);
      } else {
        beta = upload(bet.data(), bet.size() * 4);
        p.beta = tok(beta->p, STRATA_DTYPE_F32, T, HV, 0);
      }
    }
    w = std::make_unique<Dev>(rows * HV * K * es), u = std::make_unique<Dev>(rows * HV * V * es);
    A = std::make_unique<Dev>(rows * HV * s.BT * es), P = std::make_unique<Dev>(rows * HV * s.BT * es);
    p.w = tok(w->p, s.dt, T, HV, K), p.u = tok(u->p, s.dt, T, HV, V), p.A = tok(A->p, s.dt, T, HV, s.BT);
    p.Pqk = tok(P->p, s.dt, T, HV, s.BT);
  }
  void poison() {
    for (Dev* x : {w.get(), u.get(), A.get(), P.get()}) x->poison();
  }
};

const std::vector<PrepShape>& prep_shapes() {
  std::vector<int64_t> many = {0};
  for (int64_t n = 0; n < 90; ++n) many.push_back(many.back() + (n * 37 + 5) % 150 + 1);
  static const std::vector<PrepShape> v = {
      // G = 2, partial chunks, V not a tile multiple (element-wise stores of the last u tile).
      {2, 200, 2, 4, 128, 48, 64, {}, STRATA_DTYPE_BF16, false, false},
      // G = 3, K = 100 (element loads and stores), V = 200, varlen with empty / 1-token sequences, β bf16.
      {1, 300, 1, 3, 100, 200, 64, {0, 0, 1, 64, 129, 300}, STRATA_DTYPE_BF16, true, false},
      // chunk size 32, varlen.
      {1, 150, 2, 4, 128, 128, 32, {0, 31, 32, 97, 150}, STRATA_DTYPE_BF16, false, false},
      // G = 4, K = V = 64 (one panel each), β bf16.
      {2, 130, 1, 4, 64, 64, 64, {}, STRATA_DTYPE_BF16, true, false},
      // G = 1, chunk size 16, no gates.
      {3, 64, 4, 4, 128, 128, 16, {}, STRATA_DTYPE_BF16, false, true},
      // V = 256 (four u tiles), G = 2.
      {1, 100, 1, 2, 128, 256, 64, {}, STRATA_DTYPE_BF16, false, false},
      // many short sequences.
      {1, many.back(), 2, 4, 128, 128, 64, many, STRATA_DTYPE_BF16, false, false},
  };
  return v;
}

using gdn_test::poisoned;

TEST(GdnFwdCudaPrep, MatchesWyMmaAndQkGate) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int idx = 0;
  for (const PrepShape& s : prep_shapes()) {
    PrepProblem pr(s, 300 + idx);
    GdnFwdParams old = pr.p;
    old.Pqk = GdnTensor{};
    ASSERT_EQ(fwd_cuda_mma_reject(FwdOp::kPrepareWY, old), "") << "shape " << idx;
    ASSERT_EQ(fwd_cuda_prep_reject(pr.p), "") << "shape " << idx;
    // The kernels it replaces: wy_mma<kPrepare> (w, u, A), qk_gate_mma (Pqk).
    pr.poison();
    ASSERT_EQ(fwd_cuda(FwdOp::kPrepareWY, old, FwdCudaKernels::kMma, nullptr), STRATA_SUCCESS) << "shape " << idx;
    ASSERT_EQ(fwd_cuda_qk_gate(pr.p, nullptr), STRATA_SUCCESS) << "shape " << idx;
    const std::vector<uint8_t> w0 = pr.w->bits(), u0 = pr.u->bits(), a0 = pr.A->bits(), p0 = pr.P->bits();
    // prep_wgmma with A and Pqk: every element written, within bf16 roundings of the old kernels (relative RMS;
    // the products' summation order differs, then one bf16 rounding of w, u, A, P), the same bits twice.
    pr.poison();
    ASSERT_EQ(fwd_cuda_prep(pr.p, nullptr), STRATA_SUCCESS) << "shape " << idx;
    const std::vector<uint8_t> w1 = pr.w->bits(), u1 = pr.u->bits(), a1 = pr.A->bits(), p1 = pr.P->bits();
    EXPECT_EQ(poisoned(w1), 0u) << "shape " << idx;
    EXPECT_EQ(poisoned(u1), 0u) << "shape " << idx;
    EXPECT_EQ(poisoned(a1), 0u) << "shape " << idx;
    EXPECT_EQ(poisoned(p1), 0u) << "shape " << idx;
    const double ew = rel_rms(w1, w0, s.dt), eu = rel_rms(u1, u0, s.dt), ea = rel_rms(a1, a0, s.dt),
                 ep = rel_rms(p1, p0, s.dt);
    EXPECT_LT(ew, 1e-2) << "shape " << idx << ": w against wy_mma";
    EXPECT_LT(eu, 1e-2) << "shape " << idx << ": u against wy_mma";
    EXPECT_LT(ea, 1e-2) << "shape " << idx << ": A against wy_mma";
    EXPECT_LT(ep, 1e-2) << "shape " << idx << ": Pqk against qk_gate_mma";
    std::printf("[gdn_prep check] shape %d: relative RMS against wy_mma / qk_gate_mma: w %.2e u %.2e A %.2e P %.2e\n",
                idx, ew, eu, ea, ep);
    pr.poison();
    ASSERT_EQ(fwd_cuda_prep(pr.p, nullptr), STRATA_SUCCESS) << "shape " << idx;
    EXPECT_TRUE(pr.w->bits() == w1 && pr.u->bits() == u1 && pr.A->bits() == a1 && pr.P->bits() == p1)
        << "shape " << idx << ": not the same bits twice";
    // Without Pqk and A (the fused forward's w, u): the same w, u bits; A and Pqk not written.
    GdnFwdParams lean = pr.p;
    lean.Pqk = GdnTensor{}, lean.A = GdnTensor{};
    pr.poison();
    ASSERT_EQ(fwd_cuda_prep(lean, nullptr), STRATA_SUCCESS) << "shape " << idx;
    EXPECT_TRUE(pr.w->bits() == w1) << "shape " << idx << ": w (no A, no Pqk) differs";
    EXPECT_TRUE(pr.u->bits() == u1) << "shape " << idx << ": u (no A, no Pqk) differs";
    EXPECT_EQ(poisoned(pr.A->bits()), pr.A->bytes / 2) << "shape " << idx << ": A written although absent";
    EXPECT_EQ(poisoned(pr.P->bits()), pr.P->bytes / 2) << "shape " << idx << ": Pqk written although absent";
    ++idx;
  }
  // f16 tokens and K > 128 are not taken (wgmma wrappers are bf16; two key panels at most).
  PrepShape f16 = prep_shapes()[0];
  f16.dt = STRATA_DTYPE_F16;
  EXPECT_NE(fwd_cuda_prep_reject(PrepProblem(f16, 1).p), "");
  PrepShape k256 = prep_shapes()[0];
  k256.K = 256;
  EXPECT_NE(fwd_cuda_prep_reject(PrepProblem(k256, 1).p), "");
}

// Old (wy_mma<kPrepare> for w, u (and A) + qk_gate_mma for Pqk) against new (prep_wgmma for w, u, Pqk; w, u
// only; w, u, A as the backward's re-run forward asks) at the benchmark shapes, inputs by cudaMemset as
// TimingAtBenchShapes. Prints "[gdn_prep timing] ..." and appends it to $OUT/gdn_fwd_timing.txt; fails only if a
// launch fails.
TEST(GdnFwdCudaPrep, TimingAtBenchShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, rows = B * T;
    const int32_t dt = STRATA_DTYPE_BF16;
    Dev q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * V * 2), w(rows * HV * K * 2), u(rows * HV * V * 2),
        g(rows * HV * 4), beta(rows * HV * 2), P(rows * HV * 64 * 2), A(rows * HV * 64 * 2);
    for (Dev* x : {&q, &k, &v, &beta}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0, g.bytes), cudaSuccess);
    GdnFwdParams p;
    gdn_test::set_fwd_shape(p, B, T, H, HV, K, V, 64, {});
    p.q = tok(q.p, dt, T, H, K), p.k = tok(k.p, dt, T, H, K), p.v = tok(v.p, dt, T, HV, V);
    p.g = tok(g.p, STRATA_DTYPE_F32, T, HV, 0), p.beta = tok(beta.p, dt, T, HV, 0);
    p.w = tok(w.p, dt, T, HV, K), p.u = tok(u.p, dt, T, HV, V);
    const double wy = time_ms([&] { return fwd_cuda(FwdOp::kPrepareWY, p, FwdCudaKernels::kMma, nullptr); });
    const double prep_wu = time_ms([&] { return fwd_cuda_prep(p, nullptr); });
    GdnFwdParams pa = p;
    pa.A = tok(A.p, dt, T, HV, 64);
    const double wy_a = time_ms([&] { return fwd_cuda(FwdOp::kPrepareWY, pa, FwdCudaKernels::kMma, nullptr); });
    const double prep_a = time_ms([&] { return fwd_cuda_prep(pa, nullptr); });
    p.Pqk = tok(P.p, dt, T, HV, 64);
    const double qk = time_ms([&] { return fwd_cuda_qk_gate(p, nullptr); });
    const double prep = time_ms([&] { return fwd_cuda_prep(p, nullptr); });
    for (const double t : {wy, prep_wu, wy_a, prep_a, qk, prep}) EXPECT_GT(t, 0.0);
    report(fmt_line("[gdn_prep timing] bf16 B=%lld T=%lld H=16 HV=32 K=V=128: old wy_mma (w, u) %.3f ms + qk_gate %.3f "
                    "ms = %.3f ms, new prep_wgmma (w, u, Pqk) %.3f ms; w, u: old %.3f new %.3f ms; w, u, A: old "
                    "%.3f new %.3f ms",
                    static_cast<long long>(B), static_cast<long long>(T), wy, qk, wy + qk, prep, wy, prep_wu, wy_a,
                    prep_a));
  }
}

}  // namespace
}  // namespace strata::linear_attn::gdn

#endif  // STRATA_WITH_CUDA
