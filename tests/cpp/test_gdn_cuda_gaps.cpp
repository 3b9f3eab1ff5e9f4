// chunk_gated_delta_rule on CUDA where the session-18 audit of issue 3 found no test (AUDIT_ISSUE3.md rows 14, 27):
//   * many short documents (N * HV > 65535, ops_gdn_kda.md §6.4) in bf16 with K = V = 128 and the in-kernel
//     l2norm, so that the default forward (the fused / wgmma pass), the forward filling `saved`, and the
//     tensor-core backward with and without `saved` see a grid over more than 65535 sequence-heads
//     (ChunkGatedDeltaRuleCuda.ManyShortDocuments runs f32 K = V = 8: the FMA kernels only);
//   * a CPU tensor among CUDA tensors: the device error naming the argument, nothing written (these two are
//     skipped without a GPU);
//   * (host arithmetic, every build) no part of the `saved` residuals larger than the chunk states h (row 33).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "strata/ops.h"
#include "testkit/testkit.h"
#include "test_support.h"

namespace strata {
namespace {

using atk::DeviceTensor;
using atk::HostTensor;
using linear_attn::GdnParams;
using linear_attn::GdnTensor;
using namespace strata::test;  // poisoned, all_poison (test_support.h)

constexpr strata_device kGpu = {STRATA_DEVICE_CUDA, 0};

bool gpu_present() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS && n > 0;
}

GdnTensor view(HostTensor* t) {
  GdnTensor r;
  if (!t) return r;
  r.data = t->storage.data();
  r.dtype = t->desc.dtype;
  for (int i = 0; i < 4; ++i) r.st[i] = i < t->desc.rank ? t->desc.strides[i] : 0;
  return r;
}

// A packed problem (B = 1, cu_seqlens) on the host: random q, k (normalised by the kernel: l2norm), v, do,
// log-space gates, sigmoid betas; with `states`, h0 and dht too (and the final state and dh0 as outputs).
struct Packed {
  int64_t T, H, HV, K, V, N;
  std::vector<int64_t> cu;
  int32_t dt;
  bool states;
  HostTensor q, k, v, g, beta, h0, cu_t, d_o, dht;

  Packed(int32_t dtype, std::vector<int64_t> cu_, int64_t H_, int64_t HV_, int64_t K_, int64_t V_, bool states_)
      : T(cu_.back()), H(H_), HV(HV_), K(K_), V(V_), N(static_cast<int64_t>(cu_.size()) - 1), cu(std::move(cu_)),
        dt(dtype), states(states_) {
    q = HostTensor::make(dt, {1, T, H, K});
    k = HostTensor::make(dt, {1, T, H, K});
    v = HostTensor::make(dt, {1, T, HV, V});
    g = HostTensor::make(STRATA_DTYPE_F32, {1, T, HV});
    beta = HostTensor::make(dt, {1, T, HV});
    d_o = HostTensor::make(dt, {1, T, HV, V});
    if (states) {
      h0 = HostTensor::make(STRATA_DTYPE_F32, {N, HV, K, V});
      dht = HostTensor::make(STRATA_DTYPE_F32, {N, HV, K, V});
    }
    cu_t = HostTensor::make(STRATA_DTYPE_I64, {N + 1});
    for (int64_t i = 0; i <= N; ++i) cu_t.set(i, static_cast<double>(cu[static_cast<size_t>(i)]));
  }
  void fill(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> U(0.05, 1.0);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    for (int64_t i = 0; i < g.numel(); ++i) g.set(i, std::log(1.0 / (1.0 + std::exp(-U(rng)))));
    for (int64_t i = 0; i < beta.numel(); ++i) beta.set(i, 1.0 / (1.0 + std::exp(-2.0 * U(rng) + 1.0)));
    d_o.fill_normal(rng);
    if (states) {
      h0.fill_normal(rng, 0, 0.5);
      dht.fill_normal(rng);
    }
  }
  // The documents `docs` of this pack as a pack of their own (the same values: sequences are independent).
  Packed subset(const std::vector<int64_t>& docs) const {
    std::vector<int64_t> c = {0};
    for (int64_t n : docs) c.push_back(c.back() + cu[static_cast<size_t>(n + 1)] - cu[static_cast<size_t>(n)]);
    Packed s(dt, c, H, HV, K, V, states);
    for (size_t j = 0; j < docs.size(); ++j) {
      const int64_t n = docs[j], t0 = cu[static_cast<size_t>(n)], L = cu[static_cast<size_t>(n + 1)] - t0,
                    s0 = c[j];
      auto tok = [&](HostTensor& dst, const HostTensor& src, int64_t per) {
        for (int64_t i = 0; i < L * per; ++i) dst.set(s0 * per + i, src.get(t0 * per + i));
      };
      auto state = [&](HostTensor& dst, const HostTensor& src) {
        const int64_t per = HV * K * V;
        for (int64_t i = 0; i < per; ++i) dst.set(static_cast<int64_t>(j) * per + i, src.get(n * per + i));
      };
      tok(s.q, q, H * K), tok(s.k, k, H * K), tok(s.v, v, HV * V), tok(s.g, g, HV), tok(s.beta, beta, HV);
      tok(s.d_o, d_o, HV * V);
      if (states) state(s.h0, h0), state(s.dht, dht);
    }
    return s;
  }
  GdnParams params() {
    GdnParams p;
    p.q = view(&q), p.k = view(&k), p.v = view(&v), p.g = view(&g), p.beta = view(&beta);
    p.h0 = view(states ? &h0 : nullptr), p.do_ = view(&d_o), p.dht = view(states ? &dht : nullptr);
    p.cu_seqlens = reinterpret_cast<const int64_t*>(cu_t.storage.data());
    p.B = 1, p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V, p.N = N;
    return p;
  }
};

// Outputs of a forward and a backward (host copies, NaN-poisoned before the call): o, final state, dq, dk, dv, dg,
// dbeta, dh0 (the states only for a problem with states; empty tensors otherwise).
struct Outs {
  HostTensor o, ht, dq, dk, dv, dg, dbeta, dh0;
  Outs(const Packed& p, int32_t dt) {
    o = poisoned(dt, {1, p.T, p.HV, p.V});
    dq = poisoned(dt, {1, p.T, p.H, p.K});
    dk = poisoned(dt, {1, p.T, p.H, p.K});
    dv = poisoned(dt, {1, p.T, p.HV, p.V});
    dg = poisoned(STRATA_DTYPE_F32, {1, p.T, p.HV});
    dbeta = poisoned(dt, {1, p.T, p.HV});
    if (p.states) {
      ht = poisoned(STRATA_DTYPE_F32, {p.N, p.HV, p.K, p.V});
      dh0 = poisoned(STRATA_DTYPE_F32, {p.N, p.HV, p.K, p.V});
    }
  }
  std::vector<HostTensor*> all() { return {&o, &ht, &dq, &dk, &dv, &dg, &dbeta, &dh0}; }
};

// Runs a plan with a device workspace (sizes from the plan), then destroys it.
strata_status run_on_gpu(strata_plan plan, std::vector<void*> t) {
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  void* w = nullptr;
  if (ws) atk::check(strata_malloc(kGpu, ws, nullptr, &w), "workspace");
  const strata_status s = strata_plan_run(plan, t.data(), static_cast<int32_t>(t.size()), w, ws, nullptr);
  if (w) strata_free(w);
  strata_plan_destroy(plan);
  return s;
}

// The forward (o, final state; filling `saved` when asked) and then the backward (reading it) on the GPU, nothing
// forced: what a training step runs. Returns the implementations the plans picked.
std::string run_gpu(Packed& p, Outs& out, float scale, bool use_saved) {
  using Dev = std::unique_ptr<DeviceTensor>;
  auto up = [](const HostTensor& h) -> Dev {
    return h.storage.empty() ? nullptr : std::make_unique<DeviceTensor>(h, kGpu);
  };
  auto d = [](const Dev& t) -> const strata_tensor_desc* { return t ? &t->desc() : nullptr; };
  auto a = [](const Dev& t) -> void* { return t ? t->data() : nullptr; };
  Dev q = up(p.q), k = up(p.k), v = up(p.v), g = up(p.g), be = up(p.beta), h0 = up(p.h0), cu = up(p.cu_t),
      dO = up(p.d_o), dht = up(p.dht);
  std::vector<Dev> o;
  for (HostTensor* t : out.all()) o.push_back(up(*t));
  Dev saved;
  if (use_saved) {
    uint64_t bytes = 0;
    atk::check(strata_chunk_gated_delta_rule_saved_bytes(d(q), d(k), d(v), d(cu), 1, &bytes), "saved bytes");
    saved = up(HostTensor::make(STRATA_DTYPE_U8, {static_cast<int64_t>(bytes)}));
  }
  strata_plan fplan = nullptr, bplan = nullptr;
  atk::check(strata_chunk_gated_delta_rule_fwd_plan(d(q), d(k), d(v), d(g), d(be), d(h0), d(cu), d(o[0]), d(o[1]),
                                                    d(saved), scale, 1, &fplan),
             "forward plan");
  std::string impls = strata_plan_impl_name(fplan);
  atk::check(run_on_gpu(fplan, {a(q), a(k), a(v), a(g), a(be), a(h0), a(cu), a(o[0]), a(o[1]), a(saved)}),
             "forward run");
  atk::check(strata_chunk_gated_delta_rule_bwd_plan(d(q), d(k), d(v), d(g), d(be), d(h0), d(cu), d(dO), d(dht),
                                                    d(o[2]), d(o[3]), d(o[4]), d(o[5]), d(o[6]), d(o[7]), d(saved),
                                                    scale, 1, &bplan),
             "backward plan");
  impls += std::string(" + ") + strata_plan_impl_name(bplan);
  atk::check(run_on_gpu(bplan, {a(q), a(k), a(v), a(g), a(be), a(h0), a(cu), a(dO), a(dht), a(o[2]), a(o[3]), a(o[4]),
                                a(o[5]), a(o[6]), a(o[7]), a(saved)}),
             "backward run");
  const std::vector<HostTensor*> hs = out.all();
  for (size_t i = 0; i < hs.size(); ++i)
    if (o[i]) o[i]->download(*hs[i]);
  return impls;
}

// Relative RMS error over the documents `docs` of the packed token output `got` (`per` values per token) against
// `ref`, the same documents packed on their own.
double rel_over(const HostTensor& got, const HostTensor& ref, const Packed& p, const std::vector<int64_t>& docs,
                int64_t per) {
  double num = 0, den = 0;
  int64_t s0 = 0;
  for (const int64_t n : docs) {
    const int64_t t0 = p.cu[static_cast<size_t>(n)], L = p.cu[static_cast<size_t>(n + 1)] - t0;
    for (int64_t i = 0; i < L * per; ++i) {
      const double a = got.get(t0 * per + i), r = ref.get(s0 * per + i);
      num += (a - r) * (a - r);
      den += r * r;
    }
    s0 += L;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

bool any_nan(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(t.get(i))) return true;
  return false;
}

// 16 500 documents of 0..3 tokens (bf16, H = 2, HV = 4: N * HV = 66 000 > 65535, K = V = 128, l2norm), forward and
// backward with nothing forced, without and with `saved`. No initial or final states (at K = V = 128 they would take
// 4.3 GB each; the states' grid is covered by the f32 K = V = 8 test ChunkGatedDeltaRuleCuda.ManyShortDocuments).
// Every output element must be written (no poison left) and 400 documents spread over the pack (the last ones,
// past sequence-head 65535, included) must match the float64 token recurrence run on them alone (sequences are
// independent), which keeps the host time to about a second.
TEST(ChunkGatedDeltaRuleCudaGaps, ManyShortDocumentsBf16K128) {
  if (!gpu_present()) GTEST_SKIP() << "no CUDA device";
  std::vector<int64_t> cu = {0};
  for (int64_t n = 0; n < 16500; ++n) cu.push_back(cu.back() + (n * 7 + 3) % 4);
  Packed p(STRATA_DTYPE_BF16, cu, 2, 4, 128, 128, /*states=*/false);
  ASSERT_GT(p.N * p.HV, 65535);
  p.fill(21);
  const float scale = 1.f / std::sqrt(128.f);
  std::vector<int64_t> docs;
  for (int64_t n = 0; n < p.N; n += 43) docs.push_back(n);     // 384 spread over the pack
  for (int64_t n = p.N - 16; n < p.N; ++n) docs.push_back(n);  // the last ones (sequence-heads up to 65 999)
  Packed s = p.subset(docs);
  HostTensor o_ref = HostTensor::make(STRATA_DTYPE_F64, {1, s.T, s.HV, s.V}),
             dq = HostTensor::make(STRATA_DTYPE_F64, {1, s.T, s.H, s.K}),
             dk = HostTensor::make(STRATA_DTYPE_F64, {1, s.T, s.H, s.K}),
             dv = HostTensor::make(STRATA_DTYPE_F64, {1, s.T, s.HV, s.V}),
             dg = HostTensor::make(STRATA_DTYPE_F64, {1, s.T, s.HV}),
             db = HostTensor::make(STRATA_DTYPE_F64, {1, s.T, s.HV});
  GdnParams rp = s.params();
  rp.scale = scale, rp.l2norm = true;
  rp.o = view(&o_ref);
  linear_attn::gdn_recurrent_fwd<double>(rp);
  rp.dq = view(&dq), rp.dk = view(&dk), rp.dv = view(&dv), rp.dg = view(&dg), rp.dbeta = view(&db);
  std::vector<uint8_t> ws(linear_attn::gdn_recurrent_bwd_workspace<double>(rp));
  linear_attn::gdn_recurrent_bwd<double>(rp, ws.data());

  for (bool use_saved : {false, true}) {
    Outs out(p, p.dt);
    const std::string impls = run_gpu(p, out, scale, use_saved);
    const char* names[] = {"o", "dq", "dk", "dv", "dg", "dbeta"};
    const HostTensor* got[] = {&out.o, &out.dq, &out.dk, &out.dv, &out.dg, &out.dbeta};
    const HostTensor* ref[] = {&o_ref, &dq, &dk, &dv, &dg, &db};
    const int64_t per[] = {p.HV * p.V, p.H * p.K, p.H * p.K, p.HV * p.V, p.HV, p.HV};
    double err[6];
    for (int i = 0; i < 6; ++i) {
      EXPECT_FALSE(any_nan(*got[i])) << names[i] << " saved " << use_saved << ": an element not written";
      err[i] = rel_over(*got[i], *ref[i], p, docs, per[i]);
      // bf16 tokens: the tensor-core kernels round products' operands to bf16 (ops_gdn_kda.md §6.3); dg is formed
      // by cancellation (the conformance harness's dg magnitude).
      EXPECT_LT(err[i], i == 4 ? 1e-1 : 2e-2) << names[i] << " saved " << use_saved << " (" << impls << ")";
    }
    std::printf("[gdn many-docs bf16] N=%lld HV=%lld K=V=128 saved=%d (%s): rel RMS vs f64 over %zu docs: o %.2e dq "
                "%.2e dk %.2e dv %.2e dg %.2e dbeta %.2e\n",
                static_cast<long long>(p.N), static_cast<long long>(p.HV), use_saved ? 1 : 0, impls.c_str(),
                docs.size(), err[0], err[1], err[2], err[3], err[4], err[5]);
  }
}

// What a plan call with `arg` on the host (the other tensors on cuda:0) must give: STRATA_ERROR_INVALID_DEVICE, no
// plan, and a message naming the op, the argument and both devices.
void expect_device_error(const char* op, const std::string& arg, strata_status s, strata_plan plan) {
  const std::string msg = strata_get_last_error_message();
  EXPECT_EQ(s, STRATA_ERROR_INVALID_DEVICE) << arg << ": " << strata_status_name(s) << " " << msg;
  EXPECT_EQ(plan, nullptr) << arg;
  if (plan) strata_plan_destroy(plan);
  EXPECT_NE(msg.find(op), std::string::npos) << msg;
  EXPECT_NE(msg.find(arg + " is on cpu, expected cuda:0 (the device of q)"), std::string::npos) << msg;
}

// A CPU tensor among CUDA tensors (the mistake a caller makes: one tensor left on the host): the forward and the
// backward plans fail with STRATA_ERROR_INVALID_DEVICE naming the argument, and nothing is written.
TEST(ChunkGatedDeltaRuleCudaGaps, CpuTensorAmongCudaTensorsIsAnError) {
  if (!gpu_present()) GTEST_SKIP() << "no CUDA device";
  Packed p(STRATA_DTYPE_BF16, {0, 30, 70}, 1, 2, 64, 64, /*states=*/true);
  p.fill(3);
  Outs out(p, p.dt);
  auto up = [](const HostTensor& h) { return std::make_unique<DeviceTensor>(h, kGpu); };
  auto q = up(p.q), k = up(p.k), v = up(p.v), g = up(p.g), be = up(p.beta), h0 = up(p.h0), cu = up(p.cu_t),
       dO = up(p.d_o), dht = up(p.dht);
  std::vector<std::unique_ptr<DeviceTensor>> o;
  for (HostTensor* t : out.all()) o.push_back(up(*t));
  // Each argument in turn on the host (k, g, h0, cu_seqlens; o for the forward; dq for the backward).
  struct Mix {
    const char* arg;
    const strata_tensor_desc* host;
  };
  const Mix fwd_mix[] = {{"k", &p.k.desc}, {"g", &p.g.desc}, {"initial_state", &p.h0.desc},
                         {"cu_seqlens", &p.cu_t.desc}, {"o", &out.o.desc}};
  std::string arg;  // the argument on the host now, and its host descriptor
  const strata_tensor_desc* host = nullptr;
  auto pick = [&](const char* name, const std::unique_ptr<DeviceTensor>& d) {
    return arg == name ? host : &d->desc();
  };
  for (const Mix& m : fwd_mix) {
    arg = m.arg, host = m.host;
    strata_plan plan = nullptr;
    const strata_status s = strata_chunk_gated_delta_rule_fwd_plan(
        &q->desc(), pick("k", k), &v->desc(), pick("g", g), &be->desc(), pick("initial_state", h0),
        pick("cu_seqlens", cu), pick("o", o[0]), &o[1]->desc(), nullptr, 0.125f, 1, &plan);
    expect_device_error("chunk_gated_delta_rule_fwd", arg, s, plan);
  }
  const Mix bwd_mix[] = {{"v", &p.v.desc}, {"do", &p.d_o.desc}, {"dht", &p.dht.desc}, {"dq", &out.dq.desc}};
  for (const Mix& m : bwd_mix) {
    arg = m.arg, host = m.host;
    strata_plan plan = nullptr;
    const strata_status s = strata_chunk_gated_delta_rule_bwd_plan(
        &q->desc(), &k->desc(), pick("v", v), &g->desc(), &be->desc(), &h0->desc(), &cu->desc(), pick("do", dO),
        pick("dht", dht), pick("dq", o[2]), &o[3]->desc(), &o[4]->desc(), &o[5]->desc(), &o[6]->desc(),
        &o[7]->desc(), nullptr, 0.125f, 1, &plan);
    expect_device_error("chunk_gated_delta_rule_bwd", arg, s, plan);
  }
  // Nothing written: the device outputs and the host ones still hold the poison.
  const std::vector<HostTensor*> hs = out.all();
  for (size_t i = 0; i < hs.size(); ++i) {
    HostTensor back = HostTensor::make(hs[i]->desc.dtype, std::vector<int64_t>(hs[i]->desc.shape,
                                                                               hs[i]->desc.shape + hs[i]->desc.rank));
    o[i]->download(back);
    EXPECT_TRUE(all_poison(back)) << "device output " << i;
    EXPECT_TRUE(all_poison(*hs[i])) << "host output " << i;
  }
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The bound on intermediates for what the CUDA forward keeps for the backward (`saved`, gdn_cuda_saved_layout;
// AUDIT_ISSUE3.md row 33, host arithmetic only, every build): with q, k, v of one 16-bit dtype and K, V in
// {64, 128, 256}, no part (qn, kn, rq, rk, γ, A, w, v_new) is larger than the chunk states h, fixed length and varlen
// (short documents: N extra chunk states), with and without l2norm, G = 1, 2, 4. (The backward's own workspace carve
// lives in cuda_sm90.cu; with f32 tokens or V < 64 the bound does not hold: chunk_gated_delta_rule/README.md.)
TEST(ChunkGatedDeltaRuleCudaGaps, SavedPartsNoLargerThanTheChunkStates) {
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F16})
    for (int64_t K : {64, 128, 256})
      for (int64_t V : {64, 128, 256})
        for (int64_t G : {1, 2, 4})
          for (bool l2 : {false, true})
            for (int varlen = 0; varlen < 2; ++varlen) {
              GdnParams p;
              p.q.dtype = p.k.dtype = p.v.dtype = dt;
              p.B = varlen ? 1 : 3, p.T = varlen ? 5000 : 1000, p.H = 2, p.HV = 2 * G, p.K = K, p.V = V;
              static const int64_t cu[] = {0, 1, 2, 3, 70, 4000, 5000};
              p.cu_seqlens = varlen ? cu : nullptr;
              p.N = varlen ? 6 : p.B;
              p.l2norm = l2;
              const linear_attn::GdnSavedLayout L = linear_attn::gdn_cuda_saved_layout(p);
              const size_t h_bytes = L.h_end - L.h;
              // Each part's span up to the next part's offset (its bytes plus < 256 bytes of alignment padding).
              const std::pair<const char*, size_t> parts[] = {{"qn", L.kn - L.qn}, {"kn", L.rq - L.kn},
                                                              {"rq", L.rk - L.rq},  {"rk", L.gam - L.rk},
                                                              {"gamma", L.A - L.gam}, {"A", L.w - L.A},
                                                              {"w", L.vnew - L.w},  {"v_new", L.h - L.vnew}};
              for (const auto& [name, span] : parts)
                EXPECT_LE(span, h_bytes + 255) << name << " " << dtype_name(dt) << " K " << K << " V " << V << " G "
                                               << G << " l2norm " << l2 << " varlen " << varlen;
            }
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The acceptance rule's absolute floor (atk::compare): a reference below the smallest normal number of the dtype it
// is judged at (f16: 2^-14) is measured against that number. The case that needs it: dh0 of the §7.3 case f16
// 2x75x4x4x64x64 with strong gates (about -70 per token) is ~1e-17; on CUDA the backward's f16 product operands
// (exp(γ) q and w, ops_gdn_kda.md §6.3) flush it to 0, and dh0 (f32) is judged at f16. A zero answer passes there,
// fails at f32 (which resolves 1e-17), and fails against a reference of ~1e-3 at f16.
TEST(ChunkGatedDeltaRuleCudaGaps, AcceptanceFloorBelowTheDtypeRange) {
  std::vector<double> ref(1000), naive(1000), zero(1000, 0.0), big(1000), big_naive(1000);
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = 1e-17 * std::sin(static_cast<double>(i) + 1.0);
    naive[i] = ref[i] * (1.0 + 1e-7);
    big[i] = ref[i] * 1e14, big_naive[i] = naive[i] * 1e14;
  }
  EXPECT_TRUE(atk::compare("dh0", zero, ref, naive, STRATA_DTYPE_F16, 64).pass);
  EXPECT_FALSE(atk::compare("dh0", zero, ref, naive, STRATA_DTYPE_F32, 64).pass);
  EXPECT_FALSE(atk::compare("dh0", zero, big, big_naive, STRATA_DTYPE_F16, 64).pass);
  EXPECT_TRUE(atk::compare("dh0", big_naive, big, big_naive, STRATA_DTYPE_F16, 64).pass);
}

}  // namespace
}  // namespace strata
