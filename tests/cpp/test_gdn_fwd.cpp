// The GDN forward chunk operators beyond the conformance driver (ops_gdn_kda.md §4.3-§4.8, §7.4):
// the float64 references composed into the forward pipeline against the token recurrence of §2.1 (fixed and
// varlen, GVA G = 3, tails, initial state, every chunk size); the CPU kernels' pipeline against it too;
// kkt -> solve_tril -> recompute equals prepare_wy_repr_fwd; packed-vs-separate equality; determinism across
// runs and thread counts; chunk-size equivalence; one test per validation rule (status, message, output
// untouched); the C++ wrappers.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/testkit.h"
#include "test_support.h"
#include "tile/cpu/gemm.h"
#include "ops/linear_attn/gdn_common/gdn_common.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include <chrono>
#include <omp.h>

namespace strata::linear_attn::gdn {
std::vector<std::string> fwd_impl_names(FwdOp op);  // gdn_fwd_plan.h (its opbase/plan.h clashes with strata.hpp)
}

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, kCpu, poisoned, all_poison, ... (test_support.h)

using atk::HostTensor;

struct Problem {
  int64_t B, T, H, HV, K, V;
  std::vector<int64_t> cu;  // empty: fixed length
  int64_t N() const { return cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1; }
};

struct Inputs {
  HostTensor q, k, v, g, beta, h0, cu;
  std::vector<double> graw;  // per-token log gates [B*T*HV]
};

int64_t n_chunks(const Problem& p, int64_t BT) {
  if (p.cu.empty()) return (p.T + BT - 1) / BT;
  int64_t n = 0;
  for (size_t i = 0; i + 1 < p.cu.size(); ++i) n += (p.cu[i + 1] - p.cu[i] + BT - 1) / BT;
  return n;
}

// Sequences as (b, bos, eos).
std::vector<std::array<int64_t, 3>> seqs(const Problem& p) {
  std::vector<std::array<int64_t, 3>> s;
  if (p.cu.empty())
    for (int64_t b = 0; b < p.B; ++b) s.push_back({b, 0, p.T});
  else
    for (size_t n = 0; n + 1 < p.cu.size(); ++n) s.push_back({0, p.cu[n], p.cu[n + 1]});
  return s;
}

Inputs make_inputs(const Problem& p, int32_t dt, uint64_t seed, double gate_norm = 1.0) {
  Inputs in;
  std::mt19937_64 rng(seed);
  in.q = HostTensor::make(dt, {p.B, p.T, p.H, p.K});
  in.k = HostTensor::make(dt, {p.B, p.T, p.H, p.K});
  in.v = HostTensor::make(dt, {p.B, p.T, p.HV, p.V});
  in.beta = HostTensor::make(dt == STRATA_DTYPE_F64 ? dt : STRATA_DTYPE_F32, {p.B, p.T, p.HV});
  in.h0 = HostTensor::make(dt == STRATA_DTYPE_F64 ? dt : STRATA_DTYPE_F32, {p.N(), p.HV, p.K, p.V});
  in.q.fill_normal(rng);
  in.k.fill_normal(rng);
  for (HostTensor* t : {&in.q, &in.k})
    for (int64_t r = 0; r < p.B * p.T * p.H; ++r) {
      double s = 0;
      for (int64_t d = 0; d < p.K; ++d) s += t->get(r * p.K + d) * t->get(r * p.K + d);
      for (int64_t d = 0; d < p.K; ++d) t->set(r * p.K + d, t->get(r * p.K + d) / std::sqrt(s + 1e-6));
    }
  in.v.fill_normal(rng);
  in.h0.fill_normal(rng, 0.0, 0.5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t e = 0; e < in.beta.numel(); ++e) in.beta.set(e, 1.0 / (1.0 + std::exp(-u(rng))));
  in.graw.resize(static_cast<size_t>(p.B * p.T * p.HV));
  for (double& x : in.graw) x = -std::log1p(std::exp(-u(rng))) / gate_norm;
  if (!p.cu.empty()) {
    in.cu = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(p.cu.size())});
    for (size_t i = 0; i < p.cu.size(); ++i) in.cu.set(static_cast<int64_t>(i), static_cast<double>(p.cu[i]));
  }
  return in;
}

// γ = chunk-local cumsum of the per-token gates for chunk size BT.
HostTensor gamma_of(const Problem& p, const Inputs& in, int64_t BT, int32_t dt) {
  HostTensor g = HostTensor::make(dt, {p.B, p.T, p.HV});
  for (const auto& s : seqs(p))
    for (int64_t hv = 0; hv < p.HV; ++hv)
      for (int64_t c = s[1]; c < s[2]; c += BT) {
        double acc = 0;
        for (int64_t t = c; t < std::min(c + BT, s[2]); ++t) {
          const int64_t e = (s[0] * p.T + t) * p.HV + hv;
          acc += in.graw[static_cast<size_t>(e)];
          g.set(e, acc);
        }
      }
  return g;
}

// Token recurrence of §2.1 in float64 on the stored inputs: o [B,T,HV,V], ht [N,HV,K,V].
void recurrence(const Problem& p, const Inputs& in, bool use_h0, double scale, std::vector<double>& o,
                std::vector<double>& ht) {
  const int64_t G = p.HV / p.H;
  o.assign(static_cast<size_t>(p.B * p.T * p.HV * p.V), 0.0);
  ht.assign(static_cast<size_t>(p.N() * p.HV * p.K * p.V), 0.0);
  std::vector<double> S(static_cast<size_t>(p.K * p.V));
  int64_t n = 0;
  for (const auto& s : seqs(p)) {
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      const int64_t h = hv / G;
      for (int64_t i = 0; i < p.K * p.V; ++i) S[i] = use_h0 ? in.h0.get((n * p.HV + hv) * p.K * p.V + i) : 0.0;
      for (int64_t t = s[1]; t < s[2]; ++t) {
        const int64_t bt = s[0] * p.T + t;
        const double decay = std::exp(in.graw[static_cast<size_t>(bt * p.HV + hv)]);
        for (double& x : S) x *= decay;
        const double beta = in.beta.get(bt * p.HV + hv);
        std::vector<double> r(static_cast<size_t>(p.V));
        for (int64_t c = 0; c < p.V; ++c) {
          double pred = 0;
          for (int64_t a = 0; a < p.K; ++a) pred += in.k.get((bt * p.H + h) * p.K + a) * S[a * p.V + c];
          r[c] = beta * (in.v.get((bt * p.HV + hv) * p.V + c) - pred);
        }
        for (int64_t a = 0; a < p.K; ++a)
          for (int64_t c = 0; c < p.V; ++c) S[a * p.V + c] += in.k.get((bt * p.H + h) * p.K + a) * r[c];
        for (int64_t c = 0; c < p.V; ++c) {
          double acc = 0;
          for (int64_t a = 0; a < p.K; ++a) acc += in.q.get((bt * p.H + h) * p.K + a) * S[a * p.V + c];
          o[static_cast<size_t>((bt * p.HV + hv) * p.V + c)] = scale * acc;
        }
      }
      for (int64_t i = 0; i < p.K * p.V; ++i) ht[static_cast<size_t>((n * p.HV + hv) * p.K * p.V + i)] = S[i];
    }
    ++n;
  }
}

void* ptr(HostTensor& t) { return t.storage.data(); }
void* ptr(const HostTensor& t) { return const_cast<uint8_t*>(t.storage.data()); }

strata_status run_plan(strata_plan plan, std::vector<void*> ptrs) {
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  std::vector<uint8_t> w(ws + 8);
  const strata_status s = strata_plan_run(plan, ptrs.data(), static_cast<int32_t>(ptrs.size()), ws ? w.data() : nullptr,
                                          ws, nullptr);
  strata_plan_destroy(plan);
  return s;
}

struct Outputs {
  HostTensor w, u, A, h, vnew, ht, o;
};

// The forward pipeline through the C API: prepare_wy_repr_fwd -> fwd_h -> fwd_o (dt for every tensor, states
// in f32 unless dt is f64).
Outputs pipeline(const Problem& p, const Inputs& in, int64_t BT, int32_t dt, bool use_h0, float scale) {
  Outputs out;
  const int32_t sdt = dt == STRATA_DTYPE_F64 ? dt : STRATA_DTYPE_F32;
  const HostTensor g = gamma_of(p, in, BT, sdt);
  const HostTensor* cu = p.cu.empty() ? nullptr : &in.cu;
  out.w = HostTensor::make(dt, {p.B, p.T, p.HV, p.K});
  out.u = HostTensor::make(dt, {p.B, p.T, p.HV, p.V});
  out.A = HostTensor::make(dt, {p.B, p.T, p.HV, BT});
  out.h = HostTensor::make(dt, {p.B, n_chunks(p, BT), p.HV, p.K, p.V});
  out.vnew = HostTensor::make(dt, {p.B, p.T, p.HV, p.V});
  out.ht = HostTensor::make(sdt, {p.N(), p.HV, p.K, p.V});
  out.o = HostTensor::make(dt, {p.B, p.T, p.HV, p.V});
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_prepare_wy_repr_fwd_plan(&in.k.desc, &in.v.desc, &g.desc, &in.beta.desc, cu ? &cu->desc : nullptr,
                                            &out.w.desc, &out.u.desc, &out.A.desc, static_cast<int32_t>(BT), &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  EXPECT_EQ(run_plan(plan, {ptr(in.k), ptr(in.v), ptr(g), ptr(in.beta), cu ? ptr(*cu) : nullptr, ptr(out.w),
                            ptr(out.u), ptr(out.A)}),
            STRATA_SUCCESS);
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_h_plan(&in.k.desc, &out.w.desc, &out.u.desc, &g.desc,
                                                     use_h0 ? &in.h0.desc : nullptr, cu ? &cu->desc : nullptr,
                                                     &out.h.desc, &out.vnew.desc, &out.ht.desc,
                                                     static_cast<int32_t>(BT), &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  EXPECT_EQ(run_plan(plan, {ptr(in.k), ptr(out.w), ptr(out.u), ptr(g), use_h0 ? ptr(in.h0) : nullptr,
                            cu ? ptr(*cu) : nullptr, ptr(out.h), ptr(out.vnew), ptr(out.ht)}),
            STRATA_SUCCESS);
  EXPECT_EQ(strata_chunk_fwd_o_plan(&in.q.desc, &in.k.desc, &out.vnew.desc, &out.h.desc, &g.desc,
                                    cu ? &cu->desc : nullptr, &out.o.desc, scale, static_cast<int32_t>(BT), &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  EXPECT_EQ(run_plan(plan, {ptr(in.q), ptr(in.k), ptr(out.vnew), ptr(out.h), ptr(g), cu ? ptr(*cu) : nullptr,
                            ptr(out.o)}),
            STRATA_SUCCESS);
  return out;
}

double rel_rms(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max<double>(1.0, static_cast<double>(a.size()))) /
         (std::sqrt(den / std::max<double>(1.0, static_cast<double>(a.size()))) + 1e-300);
}
double max_abs(const std::vector<double>& a, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - ref[i]));
  return m;
}

const std::vector<Problem>& problems() {
  static const std::vector<Problem> ps = {
      {2, 75, 1, 3, 16, 12, {}},                          // GVA G = 3, tails
      {1, 0, 2, 4, 12, 8, {0, 1, 17, 17, 80, 145}},       // varlen: single token, zero-length, multi-chunk
      {1, 130, 2, 2, 20, 24, {}},                         // G = 1, two full chunks + tail
  };
  return ps;
}

Problem fix_T(Problem p) {
  if (!p.cu.empty()) p.T = p.cu.back();
  return p;
}

TEST(GdnFwd, Float64ReferencePipelineMatchesTokenRecurrence) {
  ForceImpl force("reference");
  for (Problem p : problems()) {
    p = fix_T(p);
    const Inputs in = make_inputs(p, STRATA_DTYPE_F64, 11);
    for (int64_t BT : {16, 32, 64})
      for (bool use_h0 : {false, true}) {
        const Outputs out = pipeline(p, in, BT, STRATA_DTYPE_F64, use_h0, 0.7f);
        std::vector<double> o, ht;
        recurrence(p, in, use_h0, 0.7f, o, ht);
        EXPECT_LT(max_abs(out.o.values(), o), 1e-11) << "T=" << p.T << " BT=" << BT << " h0=" << use_h0;
        EXPECT_LT(max_abs(out.ht.values(), ht), 1e-11) << "T=" << p.T << " BT=" << BT << " h0=" << use_h0;
      }
  }
}

TEST(GdnFwd, CpuKernelPipelineMatchesTokenRecurrence) {
  for (const std::string& impl : atk::impls_for("chunk_fwd_o", kCpu)) {
    if (impl == "reference") continue;
    ForceImpl force(impl.c_str());
    for (Problem p : problems()) {
      p = fix_T(p);
      const Inputs in = make_inputs(p, STRATA_DTYPE_F32, 12);
      for (int64_t BT : {16, 64}) {
        const Outputs out = pipeline(p, in, BT, STRATA_DTYPE_F32, true, 0.5f);
        std::vector<double> o, ht;
        recurrence(p, in, true, 0.5f, o, ht);
        EXPECT_LT(rel_rms(out.o.values(), o), 2e-5) << impl << " T=" << p.T << " BT=" << BT;
        EXPECT_LT(rel_rms(out.ht.values(), ht), 2e-5) << impl << " T=" << p.T << " BT=" << BT;
      }
    }
  }
}

TEST(GdnFwd, StrongDecayStaysFinite) {
  // g about −70 per token: γ reaches about −4500 inside a chunk; every exp must see a non-positive argument.
  Problem p{1, 150, 1, 2, 16, 16, {}};
  const Inputs in = make_inputs(p, STRATA_DTYPE_F32, 13, 0.01);
  for (const std::string& impl : atk::impls_for("chunk_fwd_o", kCpu)) {
    ForceImpl force(impl.c_str());
    const Outputs out = pipeline(p, in, 64, STRATA_DTYPE_F32, true, 1.f);
    std::vector<double> o, ht;
    recurrence(p, in, true, 1.0, o, ht);
    for (double x : out.o.values()) ASSERT_TRUE(std::isfinite(x)) << impl;
    EXPECT_LT(rel_rms(out.o.values(), o), 1e-5) << impl;
  }
}

TEST(GdnFwd, KktSolveRecomputeEqualsPrepareWY) {
  Problem p = fix_T(problems()[1]);
  const Inputs in = make_inputs(p, STRATA_DTYPE_F64, 14);
  ForceImpl force("reference");
  const int64_t BT = 32;
  const HostTensor g = gamma_of(p, in, BT, STRATA_DTYPE_F64);
  HostTensor Akk = HostTensor::make(STRATA_DTYPE_F64, {1, p.T, p.HV, BT}), Ai = Akk, w = HostTensor::make(STRATA_DTYPE_F64, {1, p.T, p.HV, p.K}),
             u = HostTensor::make(STRATA_DTYPE_F64, {1, p.T, p.HV, p.V});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_scaled_dot_kkt_plan(&in.k.desc, &g.desc, &in.beta.desc, &in.cu.desc, &Akk.desc, BT, &plan),
            STRATA_SUCCESS);
  ASSERT_EQ(run_plan(plan, {ptr(in.k), ptr(g), ptr(in.beta), ptr(in.cu), ptr(Akk)}), STRATA_SUCCESS);
  ASSERT_EQ(strata_solve_tril_plan(&Akk.desc, &in.cu.desc, &Ai.desc, &plan), STRATA_SUCCESS);
  ASSERT_EQ(run_plan(plan, {ptr(Akk), ptr(in.cu), ptr(Ai)}), STRATA_SUCCESS);
  ASSERT_EQ(strata_recompute_w_u_fwd_plan(&in.k.desc, &in.v.desc, &in.beta.desc, &Ai.desc, &g.desc, &in.cu.desc,
                                          &w.desc, &u.desc, &plan),
            STRATA_SUCCESS);
  ASSERT_EQ(run_plan(plan, {ptr(in.k), ptr(in.v), ptr(in.beta), ptr(Ai), ptr(g), ptr(in.cu), ptr(w), ptr(u)}),
            STRATA_SUCCESS);
  const Outputs out = pipeline(p, in, BT, STRATA_DTYPE_F64, false, 1.f);
  EXPECT_LT(max_abs(Ai.values(), out.A.values()), 1e-13);
  EXPECT_LT(max_abs(w.values(), out.w.values()), 1e-13);
  EXPECT_LT(max_abs(u.values(), out.u.values()), 1e-13);
}

TEST(GdnFwd, PackedEqualsSeparateBitwise) {
  const Problem packed{1, 145, 2, 4, 12, 8, {0, 1, 17, 17, 80, 145}};
  const Inputs in = make_inputs(packed, STRATA_DTYPE_F32, 15);
  for (const std::string& impl : atk::impls_for("chunk_fwd_o", kCpu)) {
    ForceImpl force(impl.c_str());
    const Outputs all = pipeline(packed, in, 32, STRATA_DTYPE_F32, true, 0.5f);
    for (size_t n = 0; n + 1 < packed.cu.size(); ++n) {
      const int64_t bos = packed.cu[n], L = packed.cu[n + 1] - bos;
      Problem one{1, L, 2, 4, 12, 8, {}};
      Inputs sep = make_inputs(one, STRATA_DTYPE_F32, 99);
      auto slice = [&](const HostTensor& src, HostTensor& dst, int64_t row) {
        const int64_t per = row;
        for (int64_t e = 0; e < dst.numel(); ++e) dst.set(e, src.get(bos * per + e));
      };
      slice(in.q, sep.q, 2 * 12);
      slice(in.k, sep.k, 2 * 12);
      slice(in.v, sep.v, 4 * 8);
      slice(in.beta, sep.beta, 4);
      for (int64_t e = 0; e < sep.h0.numel(); ++e) sep.h0.set(e, in.h0.get(static_cast<int64_t>(n) * 4 * 12 * 8 + e));
      for (int64_t e = 0; e < L * 4; ++e) sep.graw[static_cast<size_t>(e)] = in.graw[static_cast<size_t>(bos * 4 + e)];
      const Outputs o1 = pipeline(one, sep, 32, STRATA_DTYPE_F32, true, 0.5f);
      const std::vector<double> oa = all.o.values(), ob = o1.o.values();
      for (int64_t e = 0; e < L * 4 * 8; ++e) ASSERT_EQ(oa[static_cast<size_t>(bos * 32 + e)], ob[static_cast<size_t>(e)]) << impl << " n=" << n;
      const std::vector<double> ha = all.ht.values(), hb = o1.ht.values();
      for (int64_t e = 0; e < 4 * 12 * 8; ++e) ASSERT_EQ(ha[static_cast<size_t>(n * 384 + e)], hb[static_cast<size_t>(e)]) << impl;
    }
  }
}

TEST(GdnFwd, DeterministicAcrossRunsAndThreadCounts) {
  const Problem p{2, 200, 2, 4, 64, 64, {}};
  const Inputs in = make_inputs(p, STRATA_DTYPE_BF16, 16);
  const int32_t saved = strata_get_num_threads();
  for (const std::string& impl : atk::impls_for("chunk_fwd_o", kCpu)) {
    if (impl == "reference") continue;
    ForceImpl force(impl.c_str());
    strata_set_num_threads(1);
    const Outputs a = pipeline(p, in, 64, STRATA_DTYPE_BF16, true, 0.3f);
    strata_set_num_threads(2);
    const Outputs b = pipeline(p, in, 64, STRATA_DTYPE_BF16, true, 0.3f);
    const Outputs c = pipeline(p, in, 64, STRATA_DTYPE_BF16, true, 0.3f);
    for (auto m : {&Outputs::w, &Outputs::u, &Outputs::A, &Outputs::h, &Outputs::vnew, &Outputs::ht, &Outputs::o}) {
      EXPECT_EQ((a.*m).storage, (b.*m).storage) << impl;
      EXPECT_EQ((b.*m).storage, (c.*m).storage) << impl;
    }
  }
  strata_set_num_threads(saved);
}

TEST(GdnFwd, ChunkSizesAgree) {
  const Problem p{1, 150, 1, 2, 32, 32, {}};
  const Inputs in = make_inputs(p, STRATA_DTYPE_F32, 17);
  const Outputs o64 = pipeline(p, in, 64, STRATA_DTYPE_F32, true, 0.5f);
  for (int64_t BT : {16, 32}) {
    const Outputs o = pipeline(p, in, BT, STRATA_DTYPE_F32, true, 0.5f);
    EXPECT_LT(rel_rms(o.o.values(), o64.o.values()), 1e-5) << BT;
    EXPECT_LT(rel_rms(o.ht.values(), o64.ht.values()), 1e-5) << BT;
  }
}

// The chunk enumeration every kernel uses (gdn_common.h, host and device code): slots map one-to-one onto the
// chunks of the pack in sequence order, with the flat index offsets[n] + c; slots past the end are invalid;
// any cu_seqlens values (also invalid ones) only give in-bounds chunk ranges.
TEST(GdnCommon, ChunkEnumerationMatchesDirectList) {
  namespace gd = linear_attn::gdn;
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t BT = int64_t{16} << (trial % 3);
    const int64_t N = 1 + static_cast<int64_t>(rng() % 12);
    std::vector<int64_t> cu = {0};
    for (int64_t n = 0; n < N; ++n) cu.push_back(cu.back() + static_cast<int64_t>(rng() % 4 == 0 ? 0 : rng() % 150));
    const int64_t T = cu.back();
    const bool corrupt = trial % 5 == 4;  // invalid values: negative, decreasing, past T
    if (corrupt) {
      cu[1 + rng() % N] = -7;
      cu[rng() % (N + 1)] = T + 100;
    }
    gd::GdnChunks m;
    m.cu = cu.data();
    m.N = N;
    m.T = T;
    m.BT = BT;
    m.B = 1;
    std::vector<int64_t> offsets(static_cast<size_t>(N + 1));
    const int64_t total = gd::fill_chunk_offsets(m, offsets.data());
    m.offsets = offsets.data();
    // The kernels' grid bound holds for valid packs; with invalid values the chunks past it are skipped
    // (their ranges would still be in bounds, as checked below).
    if (!corrupt) EXPECT_LE(total, gd::chunk_slots(m));
    std::vector<std::array<int64_t, 4>> direct;  // (n, c, s, e) from clamped values
    for (int64_t n = 0; n < N; ++n) {
      const int64_t bos = gd::cu_at(m, n), eos = gd::cu_at(m, n + 1);
      int64_t c = 0;
      for (int64_t t = bos; t < eos; t += BT, ++c) direct.push_back({n, c, t, std::min(t + BT, eos)});
    }
    ASSERT_EQ(static_cast<int64_t>(direct.size()), total);
    for (int64_t i = 0; i < std::max(total + 3, gd::chunk_slots(m)); ++i) {
      const gd::ChunkPos p = gd::locate_chunk(m, i);
      if (i >= total) {
        EXPECT_FALSE(p.valid) << i;
        continue;
      }
      ASSERT_TRUE(p.valid) << "slot " << i;
      EXPECT_EQ(p.n, direct[static_cast<size_t>(i)][0]);
      EXPECT_EQ(p.c, direct[static_cast<size_t>(i)][1]);
      EXPECT_EQ(p.s, direct[static_cast<size_t>(i)][2]);
      EXPECT_EQ(p.e, direct[static_cast<size_t>(i)][3]);
      EXPECT_EQ(p.idx, i);
      EXPECT_TRUE(p.s >= 0 && p.s < p.e && p.e <= T && p.e - p.s <= BT);
    }
    for (int64_t n = 0; n < N; ++n) {
      const gd::SeqPos q = gd::locate_sequence(m, n);
      EXPECT_EQ(q.chunk0, offsets[static_cast<size_t>(n)]);
      EXPECT_TRUE(q.bos >= 0 && q.bos <= q.eos && q.eos <= T);
    }
  }
  // fixed length: slot i = (b, c) with i = b * NTr + c
  gd::GdnChunks f;
  f.B = 3;
  f.T = 100;
  f.BT = 32;
  f.N = 3;
  f.NTr = 4;
  for (int64_t i = 0; i < gd::chunk_slots(f); ++i) {
    const gd::ChunkPos p = gd::locate_chunk(f, i);
    ASSERT_TRUE(p.valid);
    EXPECT_EQ(p.b, i / 4);
    EXPECT_EQ(p.s, (i % 4) * 32);
    EXPECT_EQ(p.e, std::min<int64_t>((i % 4) * 32 + 32, 100));
  }
}

// ---- validation rules: status, message, output untouched ----
struct KktCall {
  HostTensor k = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 2, 16});
  HostTensor g = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 4});
  HostTensor beta = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 4});
  HostTensor cu = HostTensor::make(STRATA_DTYPE_I64, {3});
  HostTensor A = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 4, 64});
  bool use_cu = false;
  int32_t bt = 64;
  KktCall() {
    A.poison();
    cu.set(0, 0);
    cu.set(1, 10);
    cu.set(2, 40);
  }
  strata_status run() {
    strata_plan plan = nullptr;
    const strata_status s = strata_chunk_scaled_dot_kkt_plan(&k.desc, &g.desc, &beta.desc, use_cu ? &cu.desc : nullptr,
                                                             &A.desc, bt, &plan);
    if (s != STRATA_SUCCESS) return s;
    return run_plan(plan, {ptr(k), ptr(g), ptr(beta), use_cu ? ptr(cu) : nullptr, ptr(A)});
  }
  bool untouched() const {
    for (uint8_t b : A.storage)
      if (b != 0xff) return false;
    return true;
  }
};

void expect_fail(KktCall& c, strata_status status, const std::string& text) {
  EXPECT_EQ(c.run(), status);
  EXPECT_NE(std::string(strata_get_last_error_message()).find(text), std::string::npos)
      << strata_get_last_error_message();
  EXPECT_TRUE(c.untouched());
}

TEST(GdnFwdValidation, NullTensor) {
  strata_plan plan = nullptr;
  KktCall c;
  EXPECT_EQ(strata_chunk_scaled_dot_kkt_plan(nullptr, &c.g.desc, &c.beta.desc, nullptr, &c.A.desc, 64, &plan),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("chunk_scaled_dot_kkt: k must not be NULL"),
            std::string::npos)
      << strata_get_last_error_message();
}
TEST(GdnFwdValidation, Dtype) {
  KktCall c;
  c.k = HostTensor::make(STRATA_DTYPE_I32, {1, 40, 2, 16});
  expect_fail(c, STRATA_ERROR_INVALID_DTYPE, "k");
}
TEST(GdnFwdValidation, BetaShape) {
  KktCall c;
  c.beta = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 3});
  expect_fail(c, STRATA_ERROR_INVALID_SHAPE, "beta");
}
TEST(GdnFwdValidation, HeadsNotAMultiple) {
  KktCall c;
  c.k = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 3, 16});
  expect_fail(c, STRATA_ERROR_INVALID_SHAPE, "multiple of the q/k heads H = 3");
}
TEST(GdnFwdValidation, KeyDimAbove256) {
  KktCall c;
  c.k = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 2, 257});
  expect_fail(c, STRATA_ERROR_INVALID_SHAPE, "K must be <= 256, got K = 257");
}
TEST(GdnFwdValidation, ChunkSize) {
  KktCall c;
  c.bt = 48;
  expect_fail(c, STRATA_ERROR_INVALID_ATTRIBUTE, "chunk_size must be one of {16, 32, 64}, got 48");
}
TEST(GdnFwdValidation, OutputWrongChunkColumns) {
  KktCall c;
  c.A = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 4, 32});
  c.A.poison();
  expect_fail(c, STRATA_ERROR_INVALID_SHAPE, "A must have shape [1, 40, 4, 64] (B, T, HV, BT)");
}
TEST(GdnFwdValidation, OutputZeroStride) {
  KktCall c;
  c.A.desc.strides[1] = 0;
  expect_fail(c, STRATA_ERROR_INVALID_STRIDE, "output A has stride 0");
}
TEST(GdnFwdValidation, CuSeqlensNeedsBatchOne) {
  KktCall c;
  c.k = HostTensor::make(STRATA_DTYPE_F32, {2, 20, 2, 16});
  c.g = HostTensor::make(STRATA_DTYPE_F32, {2, 20, 4});
  c.beta = c.g;
  c.A = HostTensor::make(STRATA_DTYPE_F32, {2, 20, 4, 64});
  c.A.poison();
  c.use_cu = true;
  expect_fail(c, STRATA_ERROR_INVALID_SHAPE, "batch size B must be 1");
}
TEST(GdnFwdValidation, CuSeqlensDtype) {
  KktCall c;
  c.use_cu = true;
  c.cu = HostTensor::make(STRATA_DTYPE_I32, {3});
  expect_fail(c, STRATA_ERROR_INVALID_DTYPE, "cu_seqlens");
}
TEST(GdnFwdValidation, CuSeqlensValues) {
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{1, 10, 40}, {0, 30, 20}, {0, 10, 39}}) {
    KktCall c;
    c.use_cu = true;
    for (int i = 0; i < 3; ++i) c.cu.set(i, static_cast<double>(bad[static_cast<size_t>(i)]));
    ForceImpl force("reference");
    expect_fail(c, STRATA_ERROR_INVALID_VALUE, "cu_seqlens");
  }
}
TEST(GdnFwdValidation, InitialStateDtypeAndRows) {
  const Problem p{1, 40, 1, 2, 8, 8, {0, 10, 40}};
  Inputs in = make_inputs(p, STRATA_DTYPE_F32, 3);
  HostTensor g = gamma_of(p, in, 64, STRATA_DTYPE_F32);
  HostTensor w = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 2, 8}), u = HostTensor::make(STRATA_DTYPE_F32, {1, 40, 2, 8});
  HostTensor h = HostTensor::make(STRATA_DTYPE_F32, {1, 2, 2, 8, 8});
  strata_plan plan = nullptr;
  HostTensor h0b = HostTensor::make(STRATA_DTYPE_BF16, {2, 2, 8, 8});
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_h_plan(&in.k.desc, &w.desc, &u.desc, &g.desc, &h0b.desc, &in.cu.desc,
                                                     &h.desc, nullptr, nullptr, 64, &plan),
            STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("initial_state"), std::string::npos);
  HostTensor h0n = HostTensor::make(STRATA_DTYPE_F32, {3, 2, 8, 8});
  EXPECT_EQ(strata_chunk_gated_delta_rule_fwd_h_plan(&in.k.desc, &w.desc, &u.desc, &g.desc, &h0n.desc, &in.cu.desc,
                                                     &h.desc, nullptr, nullptr, 64, &plan),
            STRATA_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("initial_state must have shape [2, 2, 8, 8] (N, HV, K, V)"),
            std::string::npos)
      << strata_get_last_error_message();
  // varlen h with the wrong chunk count: caught on the CPU at run time, nothing written
  HostTensor h3 = HostTensor::make(STRATA_DTYPE_F32, {1, 3, 2, 8, 8});
  h3.poison();
  ASSERT_EQ(strata_chunk_gated_delta_rule_fwd_h_plan(&in.k.desc, &w.desc, &u.desc, &g.desc, nullptr, &in.cu.desc,
                                                     &h3.desc, nullptr, nullptr, 64, &plan),
            STRATA_SUCCESS);
  EXPECT_EQ(run_plan(plan, {ptr(in.k), ptr(w), ptr(u), ptr(g), nullptr, ptr(in.cu), ptr(h3), nullptr, nullptr}),
            STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("h must have shape[1] = NT = 2"), std::string::npos)
      << strata_get_last_error_message();
  for (uint8_t b : h3.storage) ASSERT_EQ(b, 0xff);
}
TEST(GdnFwdValidation, ScaleFinite) {
  const Problem p{1, 20, 1, 1, 8, 8, {}};
  Inputs in = make_inputs(p, STRATA_DTYPE_F32, 4);
  HostTensor h = HostTensor::make(STRATA_DTYPE_F32, {1, 1, 1, 8, 8}), o = HostTensor::make(STRATA_DTYPE_F32, {1, 20, 1, 8});
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_fwd_o_plan(&in.q.desc, &in.k.desc, &in.v.desc, &h.desc, nullptr, nullptr, &o.desc, NAN, 64,
                                    &plan),
            STRATA_ERROR_INVALID_ATTRIBUTE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("scale must be finite"), std::string::npos);
}

TEST(GdnFwd, CppWrappers) {
  const Problem p{1, 70, 1, 2, 16, 8, {}};
  const Inputs in = make_inputs(p, STRATA_DTYPE_F32, 5);
  const HostTensor gh = gamma_of(p, in, 64, STRATA_DTYPE_F32);
  auto view = [](const HostTensor& t) { return Tensor::view(const_cast<uint8_t*>(t.storage.data()), t.desc); };
  const Tensor k = view(in.k), v = view(in.v), beta = view(in.beta), g = view(gh), q = view(in.q);
  auto [w, u, A] = prepare_wy_repr_fwd(k, v, beta, &g);
  auto [h, vn, ht] = chunk_gated_delta_rule_fwd_h(k, w, u, &g, nullptr, true);
  const Tensor o = chunk_fwd_o(q, k, vn, h, &g, 0.5f);
  const Outputs ref = pipeline(p, in, 64, STRATA_DTYPE_F32, false, 0.5f);
  EXPECT_EQ(std::memcmp(o.data(), ref.o.storage.data(), ref.o.storage.size()), 0);
  EXPECT_EQ(std::memcmp(ht.data(), ref.ht.storage.data(), ref.ht.storage.size()), 0);
  const Tensor Akk = chunk_scaled_dot_kkt(k, beta, &g);
  const Tensor Ai = solve_tril(Akk);
  auto [w2, u2] = recompute_w_u_fwd(k, v, beta, Ai, &g);
  EXPECT_EQ(Ai.shape(), A.shape());
  EXPECT_EQ(u2.shape(), u.shape());
}

// Throughput of the CPU forward at the target shape (T = 4096, Hq = 4, Hv = 8, K = V = 128, f32, BT = 64) and
// of a large fp32 GEMM through the same micro-kernel on every thread in the same run (the achievable peak).
// Not a correctness test: run with --gtest_also_run_disabled_tests --gtest_filter='*CpuThroughput*'.
TEST(GdnFwdPerf, DISABLED_CpuThroughput) {
  const Problem p{1, 4096, 4, 8, 128, 128, {}};
  const Inputs in = make_inputs(p, STRATA_DTYPE_F32, 21);
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  // GEMM probe: C[M, N] = A[M, K] B[K, N], M split over the threads, 512 x 512 x 512 blocks (L2-resident).
  {
    const int64_t n = 512, reps = 8;
    const int threads = strata_get_num_threads();
    std::vector<std::vector<float>> A(threads, std::vector<float>(n * n, 0.5f)), B = A, C = A;
    double best = 1e30;
    for (int it = 0; it < 3; ++it) {
      const auto t0 = now();
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int t = 0; t < threads; ++t)
        for (int64_t r = 0; r < reps; ++r) {
          tile::GemmF32Args g;
          g.M = g.N = g.K = n;
          g.A = A[t].data();
          g.lda = n;
          g.B = B[t].data();
          g.ldb = n;
          g.C = C[t].data();
          g.ldc = n;
          tile::gemm_f32(g);
        }
      best = std::min(best, ms(t0, now()));
    }
    std::printf("[perf] tile sgemm %d threads: %.1f GFLOP/s\n", threads,
                2.0 * n * n * n * reps * threads / (best * 1e-3) / 1e9);
  }
  // Plans built once; only strata_plan_run is timed (per op and for the three together).
  const HostTensor g = gamma_of(p, in, 64, STRATA_DTYPE_F32);
  Outputs o;
  o.w = HostTensor::make(STRATA_DTYPE_F32, {1, 4096, 8, 128});
  o.u = HostTensor::make(STRATA_DTYPE_F32, {1, 4096, 8, 128});
  o.A = HostTensor::make(STRATA_DTYPE_F32, {1, 4096, 8, 64});
  o.h = HostTensor::make(STRATA_DTYPE_F32, {1, 64, 8, 128, 128});
  o.vnew = HostTensor::make(STRATA_DTYPE_F32, {1, 4096, 8, 128});
  o.ht = HostTensor::make(STRATA_DTYPE_F32, {1, 8, 128, 128});
  o.o = HostTensor::make(STRATA_DTYPE_F32, {1, 4096, 8, 128});
  strata_plan pw = nullptr, ph = nullptr, po = nullptr;
  ASSERT_EQ(strata_prepare_wy_repr_fwd_plan(&in.k.desc, &in.v.desc, &g.desc, &in.beta.desc, nullptr, &o.w.desc,
                                            &o.u.desc, &o.A.desc, 64, &pw),
            STRATA_SUCCESS);
  ASSERT_EQ(strata_chunk_gated_delta_rule_fwd_h_plan(&in.k.desc, &o.w.desc, &o.u.desc, &g.desc, &in.h0.desc, nullptr,
                                                     &o.h.desc, &o.vnew.desc, &o.ht.desc, 64, &ph),
            STRATA_SUCCESS);
  ASSERT_EQ(strata_chunk_fwd_o_plan(&in.q.desc, &in.k.desc, &o.vnew.desc, &o.h.desc, &g.desc, nullptr, &o.o.desc, 0.1f,
                                    64, &po),
            STRATA_SUCCESS);
  std::vector<void*> tw = {ptr(in.k), ptr(in.v), ptr(g), ptr(in.beta), nullptr, ptr(o.w), ptr(o.u), ptr(o.A)};
  std::vector<void*> th = {ptr(in.k), ptr(o.w), ptr(o.u), ptr(g), ptr(in.h0), nullptr, ptr(o.h), ptr(o.vnew), ptr(o.ht)};
  std::vector<void*> to = {ptr(in.q), ptr(in.k), ptr(o.vnew), ptr(o.h), ptr(g), nullptr, ptr(o.o)};
  const double L = 64, K = 128, V = 128, chunks = 4096 / 64, H = 4, HV = 8;
  const double f_wy = chunks * (H * 2 * L * L * K + HV * (L * L * L / 3 + 2 * L * L * (K + V)));
  const double f_h = chunks * HV * 4 * L * K * V;
  const double f_o = chunks * (H * 2 * L * L * K + HV * (2 * L * K * V + 2 * L * L * V));
  struct Item {
    const char* name;
    strata_plan plan;
    std::vector<void*>* ptrs;
    double flops;
  };
  double total = 0;
  for (Item it : {Item{"prepare_wy_repr_fwd", pw, &tw, f_wy}, Item{"chunk_gated_delta_rule_fwd_h", ph, &th, f_h},
                  Item{"chunk_fwd_o", po, &to, f_o}}) {
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = now();
      ASSERT_EQ(strata_plan_run(it.plan, it.ptrs->data(), static_cast<int32_t>(it.ptrs->size()), nullptr, 0, nullptr),
                STRATA_SUCCESS);
      best = std::min(best, ms(t0, now()));
    }
    total += best;
    std::printf("[perf] %s (%s): %.2f ms, %.1f GFLOP/s\n", it.name, strata_plan_impl_name(it.plan), best,
                it.flops / (best * 1e-3) / 1e9);
  }
  std::printf("[perf] forward (3 ops): %.2f ms, %.1f GFLOP/s\n", total, (f_wy + f_h + f_o) / (total * 1e-3) / 1e9);
  strata_plan_destroy(pw);
  strata_plan_destroy(ph);
  strata_plan_destroy(po);
}

#if STRATA_WITH_CUDA
// The CUDA dispatch rule (gdn_fwd_kernels.h): the tensor-core kernels take an op only when its product operands
// and token outputs share one 16-bit dtype, K, V <= 256 and BT <= 64; each op lists them first, then the FMA
// kernel. Host logic only (no GPU needed).
TEST(GdnFwdCuda, TensorCoreKernelsApplyToSixteenBitTokensOnly) {
  namespace gd = linear_attn::gdn;
  static char marker;
  auto set = [](gd::GdnTensor& t, int32_t dt) {
    t.data = &marker;
    t.dtype = dt;
  };
  auto base = [&](int32_t dt) {
    gd::GdnFwdParams p;
    p.shape.K = 128, p.shape.V = 128, p.shape.BT = 64;
    for (gd::GdnTensor* t : {&p.q, &p.k, &p.v, &p.h, &p.o, &p.w, &p.u, &p.v_new, &p.Akk, &p.A}) set(*t, dt);
    set(p.g, STRATA_DTYPE_F32);
    set(p.beta, STRATA_DTYPE_F32);
    set(p.h0, STRATA_DTYPE_F32);
    set(p.ht, STRATA_DTYPE_F32);
    return p;
  };
  for (int o = 0; o < static_cast<int>(gd::FwdOp::kCount); ++o) {
    const gd::FwdOp op = static_cast<gd::FwdOp>(o);
    EXPECT_EQ(gd::fwd_cuda_mma_reject(op, base(STRATA_DTYPE_BF16)), "") << o;
    EXPECT_EQ(gd::fwd_cuda_mma_reject(op, base(STRATA_DTYPE_F16)), "") << o;
    EXPECT_NE(gd::fwd_cuda_mma_reject(op, base(STRATA_DTYPE_F32)), "") << o;
    gd::GdnFwdParams big = base(STRATA_DTYPE_BF16);
    big.shape.K = 257;
    EXPECT_NE(gd::fwd_cuda_mma_reject(op, big), "") << o;
    // prepare_wy_repr_fwd lists its warpgroup-MMA kernel first (PrepKernelRule), then the same pair.
    std::vector<std::string> names = gd::fwd_impl_names(op);
    if (op == gd::FwdOp::kPrepareWY && !names.empty() && names[0] == "cuda.sm90.prep") names.erase(names.begin());
    ASSERT_GE(names.size(), 2u);
    EXPECT_EQ(names[0], "cuda.sm90.mma");
    EXPECT_EQ(names[1].rfind("cuda.sm90.", 0), 0u);
    EXPECT_NE(names[1], "cuda.sm90.mma");
  }
  gd::GdnFwdParams p = base(STRATA_DTYPE_BF16);
  p.o.dtype = STRATA_DTYPE_F32;  // an f32 output is held to the f32 ceiling
  EXPECT_NE(gd::fwd_cuda_mma_reject(gd::FwdOp::kFwdO, p), "");
  p = base(STRATA_DTYPE_BF16);
  p.k.dtype = STRATA_DTYPE_F16;  // mixed 16-bit inputs
  EXPECT_NE(gd::fwd_cuda_mma_reject(gd::FwdOp::kPrepareWY, p), "");
  p = base(STRATA_DTYPE_BF16);
  p.v_new = {};  // absent optional outputs are fine; f32 states (h0, ht) too
  EXPECT_EQ(gd::fwd_cuda_mma_reject(gd::FwdOp::kFwdH, p), "");
  p.v_new = p.h;
  p.v_new.dtype = STRATA_DTYPE_F32;
  EXPECT_NE(gd::fwd_cuda_mma_reject(gd::FwdOp::kFwdH, p), "");
}

// The pre-state kernel's rule (fwd_cuda_prep_reject; prep_wgmma, session 10): prepare_wy_repr_fwd's tensor-core
// rule with bf16 tokens (warpgroup MMA), HV = G H, K <= 128, and with the gated Q Kᵀ (Pqk present) q and Pqk in
// bf16; listed for prepare_wy_repr_fwd only, first (the automatic choice where it applies; session 10). Host logic
// only (no GPU needed).
TEST(GdnFwdCuda, PrepKernelRule) {
  namespace gd = linear_attn::gdn;
  static char marker;
  auto set = [](gd::GdnTensor& t, int32_t dt) {
    t.data = &marker;
    t.dtype = dt;
  };
  auto base = [&](int32_t dt) {
    gd::GdnFwdParams p;
    p.shape.H = 2, p.shape.HV = 4, p.shape.G = 2, p.shape.K = 128, p.shape.V = 128, p.shape.BT = 64;
    for (gd::GdnTensor* t : {&p.k, &p.v, &p.w, &p.u, &p.A}) set(*t, dt);
    set(p.g, STRATA_DTYPE_F32);
    set(p.beta, STRATA_DTYPE_F32);
    return p;
  };
  EXPECT_EQ(gd::fwd_cuda_prep_reject(base(STRATA_DTYPE_BF16)), "");
  EXPECT_NE(gd::fwd_cuda_prep_reject(base(STRATA_DTYPE_F16)), "");  // wgmma wrappers are bf16 only
  EXPECT_NE(gd::fwd_cuda_prep_reject(base(STRATA_DTYPE_F32)), "");
  gd::GdnFwdParams p = base(STRATA_DTYPE_BF16);
  p.A = {};  // A is optional (the fused forward needs only w, u)
  EXPECT_EQ(gd::fwd_cuda_prep_reject(p), "");
  p.shape.V = 256, p.shape.G = 4, p.shape.HV = 8;  // the largest V tiles: 100.75 KB, two blocks per SM
  EXPECT_EQ(gd::fwd_cuda_prep_reject(p), "");
  p.shape.K = 192;  // K <= 128 (two 64-column key panels)
  EXPECT_NE(gd::fwd_cuda_prep_reject(p), "");
  p.shape.K = 128, p.shape.V = 257;
  EXPECT_NE(gd::fwd_cuda_prep_reject(p), "");
  p = base(STRATA_DTYPE_BF16);
  p.shape.HV = 5;  // not a multiple of H
  EXPECT_NE(gd::fwd_cuda_prep_reject(p), "");
  p = base(STRATA_DTYPE_BF16);
  p.u = {};
  EXPECT_NE(gd::fwd_cuda_prep_reject(p), "");
  // With the gated Q Kᵀ.
  p = base(STRATA_DTYPE_BF16);
  set(p.Pqk, STRATA_DTYPE_BF16);
  EXPECT_NE(gd::fwd_cuda_prep_reject(p), "");  // q absent
  set(p.q, STRATA_DTYPE_BF16);
  EXPECT_EQ(gd::fwd_cuda_prep_reject(p), "");
  p.shape.K = 100;
  EXPECT_EQ(gd::fwd_cuda_prep_reject(p), "");
  p.shape.K = 64;
  EXPECT_EQ(gd::fwd_cuda_prep_reject(p), "");
  p.shape.K = 128;
  p.Pqk.dtype = STRATA_DTYPE_F16;
  EXPECT_NE(gd::fwd_cuda_prep_reject(p), "");
  p.Pqk.dtype = STRATA_DTYPE_BF16;
  p.q.dtype = STRATA_DTYPE_F16;
  EXPECT_NE(gd::fwd_cuda_prep_reject(p), "");
  for (int o = 0; o < static_cast<int>(gd::FwdOp::kCount); ++o) {
    const gd::FwdOp op = static_cast<gd::FwdOp>(o);
    const std::vector<std::string> names = gd::fwd_impl_names(op);
    const bool listed = std::find(names.begin(), names.end(), "cuda.sm90.prep") != names.end();
    EXPECT_EQ(listed, op == gd::FwdOp::kPrepareWY) << o;
    if (op == gd::FwdOp::kPrepareWY) {
      ASSERT_GE(names.size(), 3u);
      EXPECT_EQ(names[0], "cuda.sm90.prep");
    }
  }
}
#endif

}  // namespace
}  // namespace strata
