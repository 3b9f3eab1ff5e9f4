// chunk_gated_delta_rule's `saved` buffer (the forward's residuals read by the backward instead of re-running the
// forward; chunk_gated_delta_rule.h, gdn_cuda_saved_layout): its size function, the validation rules of the C API
// (wrong size, dtype, rank, device; an implementation that does not use it; misalignment: a clear error and
// nothing written), the CPU ignoring an empty buffer, and on CUDA the backward reading the buffer giving the same
// bits as the backward that re-computes (the same kernels on the same data), deterministically, without writing
// into the buffer. The conformance suite (saved=1 cases of testkit_chunk_gated_delta_rule.cpp) checks the results
// against float64; a last test times the steps at the benchmark shapes (`*Timing*`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "strata/ops.h"
#include "testkit/testkit.h"
#include "test_support.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda_test_support.h"
#endif

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, poisoned, all_poison (test_support.h)
using atk::DeviceTensor;
using atk::HostTensor;
using linear_attn::GdnParams;

constexpr strata_device kHost = {STRATA_DEVICE_CPU, 0};
constexpr strata_device kGpu = {STRATA_DEVICE_CUDA, 0};

// The message of the last failing call of an OpRun (kept before the frees touch the runtime).
std::string g_msg;

// A problem on the host: unit-norm-ish keys, log-space gates, sigmoid betas.
struct Prob {
  int64_t B, T, H, HV, K, V, N;
  std::vector<int64_t> cu_values;
  int32_t dt;
  bool l2, has_h0, has_dht;
  HostTensor q, k, v, g, beta, h0, cu, d_o, dht;
  Prob(int32_t dtype, int64_t B_, int64_t T_, int64_t H_, int64_t HV_, int64_t K_, int64_t V_,
       std::vector<int64_t> cu_ = {}, bool l2_ = true, bool h0_ = true, bool dht_ = true, uint64_t seed = 7)
      : B(B_), T(T_), H(H_), HV(HV_), K(K_), V(V_), cu_values(std::move(cu_)), dt(dtype), l2(l2_), has_h0(h0_),
        has_dht(dht_) {
    N = cu_values.empty() ? B : static_cast<int64_t>(cu_values.size()) - 1;
    std::mt19937_64 rng(seed);
    const double sk = 1.0 / std::sqrt(static_cast<double>(K));
    q = HostTensor::make(dt, {B, T, H, K});
    k = HostTensor::make(dt, {B, T, H, K});
    q.fill_normal(rng, 0, sk);
    k.fill_normal(rng, 0, sk);
    v = HostTensor::make(dt, {B, T, HV, V});
    v.fill_normal(rng);
    g = HostTensor::make(STRATA_DTYPE_F32, {B, T, HV});
    std::uniform_real_distribution<double> U(0.05, 1.0);
    for (int64_t i = 0; i < g.numel(); ++i) g.set(i, std::log(1.0 / (1.0 + std::exp(-U(rng)))));
    beta = HostTensor::make(dt, {B, T, HV});
    for (int64_t i = 0; i < beta.numel(); ++i) beta.set(i, 1.0 / (1.0 + std::exp(-2.0 * U(rng) + 1.0)));
    h0 = HostTensor::make(STRATA_DTYPE_F32, {N, HV, K, V});
    h0.fill_normal(rng, 0, 0.5);
    d_o = HostTensor::make(dt, {B, T, HV, V});
    d_o.fill_normal(rng);
    dht = HostTensor::make(STRATA_DTYPE_F32, {N, HV, K, V});
    dht.fill_normal(rng);
    if (!cu_values.empty()) {
      cu = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(cu_values.size())});
      for (size_t i = 0; i < cu_values.size(); ++i) cu.set(static_cast<int64_t>(i), static_cast<double>(cu_values[i]));
    }
  }
  HostTensor* cu_ptr() { return cu_values.empty() ? nullptr : &cu; }
  HostTensor* h0_ptr() { return has_h0 ? &h0 : nullptr; }
  HostTensor* dht_ptr() { return has_dht ? &dht : nullptr; }
};

// The problem's tensors on `device` (host tensors on the CPU, device copies on CUDA) and the outputs of a
// forward (o, final_state) and a backward (dq, dk, dv, dg, dbeta, dh0), all NaN-poisoned before each call.
struct OpRun {
  Prob& p;
  strata_device device;
  std::vector<std::unique_ptr<DeviceTensor>> dev;  // CUDA copies
  struct Arg {
    HostTensor* host = nullptr;
    DeviceTensor* d = nullptr;
    const strata_tensor_desc* desc() const { return d ? &d->desc() : host ? &host->desc : nullptr; }
    void* ptr() const { return d ? d->data() : host ? host->storage.data() : nullptr; }
  };
  HostTensor o, ht, dq, dk, dv, dg, dbeta, dh0;
  Arg q, k, v, g, beta, h0, cu, d_o, dht, to, tht, tdq, tdk, tdv, tdg, tdbeta, tdh0;
  std::string impl;

  OpRun(Prob& prob, strata_device dv_) : p(prob), device(dv_) {
    o = poisoned(p.dt, {p.B, p.T, p.HV, p.V});
    ht = poisoned(STRATA_DTYPE_F32, {p.N, p.HV, p.K, p.V});
    dq = poisoned(p.dt, {p.B, p.T, p.H, p.K});
    dk = poisoned(p.dt, {p.B, p.T, p.H, p.K});
    dv = poisoned(p.dt, {p.B, p.T, p.HV, p.V});
    dg = poisoned(STRATA_DTYPE_F32, {p.B, p.T, p.HV});
    dbeta = poisoned(p.dt, {p.B, p.T, p.HV});
    dh0 = poisoned(STRATA_DTYPE_F32, {p.N, p.HV, p.K, p.V});
    q = bind(&p.q), k = bind(&p.k), v = bind(&p.v), g = bind(&p.g), beta = bind(&p.beta), h0 = bind(p.h0_ptr());
    cu = bind(p.cu_ptr()), d_o = bind(&p.d_o), dht = bind(p.dht_ptr());
    to = bind(&o), tht = bind(&ht), tdq = bind(&dq), tdk = bind(&dk), tdv = bind(&dv), tdg = bind(&dg);
    tdbeta = bind(&dbeta), tdh0 = bind(p.has_h0 ? &dh0 : nullptr);
  }
  Arg bind(HostTensor* h) {
    Arg t;
    t.host = h;
    if (h && device.type == STRATA_DEVICE_CUDA) {
      dev.push_back(std::make_unique<DeviceTensor>(*h, device));
      t.d = dev.back().get();
    }
    return t;
  }
  // The saved buffer's size for this problem on this run's device.
  uint64_t saved_bytes() const {
    uint64_t n = ~uint64_t{0};
    EXPECT_EQ(strata_chunk_gated_delta_rule_saved_bytes(q.desc(), k.desc(), v.desc(), cu.desc(), p.l2 ? 1 : 0, &n),
              STRATA_SUCCESS)
        << g_msg;
    return n;
  }
  strata_status run(strata_plan plan, std::vector<void*> t) {
    impl = strata_plan_impl_name(plan);
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    std::vector<uint8_t> host_ws;
    void* w = nullptr;
    if (ws && device.type == STRATA_DEVICE_CPU) {
      host_ws.resize(ws);
      w = host_ws.data();
    } else if (ws) {
      EXPECT_EQ(strata_malloc(device, ws, nullptr, &w), STRATA_SUCCESS);
    }
    const strata_status s = strata_plan_run(plan, t.data(), static_cast<int32_t>(t.size()), w, ws, nullptr);
    g_msg = strata_get_last_error_message();
    if (w && device.type != STRATA_DEVICE_CPU) strata_free(w);
    strata_plan_destroy(plan);
    return s;
  }
  // Forward (o, final_state) with `saved` (desc and pointer; nullptr: none).
  strata_status fwd(const strata_tensor_desc* sd, void* sp) {
    strata_plan plan = nullptr;
    const strata_status s = strata_chunk_gated_delta_rule_fwd_plan(q.desc(), k.desc(), v.desc(), g.desc(),
                                                                   beta.desc(), h0.desc(), cu.desc(), to.desc(),
                                                                   tht.desc(), sd, 0.3f, p.l2 ? 1 : 0, &plan);
    g_msg = strata_get_last_error_message();
    if (s != STRATA_SUCCESS) return s;
    return run(plan, {q.ptr(), k.ptr(), v.ptr(), g.ptr(), beta.ptr(), h0.ptr(), cu.ptr(), to.ptr(), tht.ptr(), sp});
  }
  strata_status bwd(const strata_tensor_desc* sd, void* sp) {
    strata_plan plan = nullptr;
    const strata_status s = strata_chunk_gated_delta_rule_bwd_plan(
        q.desc(), k.desc(), v.desc(), g.desc(), beta.desc(), h0.desc(), cu.desc(), d_o.desc(), dht.desc(),
        tdq.desc(), tdk.desc(), tdv.desc(), tdg.desc(), tdbeta.desc(), tdh0.desc(), sd, 0.3f, p.l2 ? 1 : 0, &plan);
    g_msg = strata_get_last_error_message();
    if (s != STRATA_SUCCESS) return s;
    return run(plan, {q.ptr(), k.ptr(), v.ptr(), g.ptr(), beta.ptr(), h0.ptr(), cu.ptr(), d_o.ptr(), dht.ptr(),
                      tdq.ptr(), tdk.ptr(), tdv.ptr(), tdg.ptr(), tdbeta.ptr(), tdh0.ptr(), sp});
  }
  // Copies the device outputs back into the host tensors (no-op on the CPU).
  void download() {
    for (const Arg* t : {&to, &tht, &tdq, &tdk, &tdv, &tdg, &tdbeta, &tdh0})
      if (t->d) t->d->download(*t->host);
  }
  std::vector<uint8_t> grads() const {
    std::vector<uint8_t> all;
    for (const HostTensor* t : {&dq, &dk, &dv, &dg, &dbeta, &dh0})
      all.insert(all.end(), t->storage.begin(), t->storage.end());
    return all;
  }
  bool outputs_untouched() const {
    for (const HostTensor* t : {&o, &ht, &dq, &dk, &dv, &dg, &dbeta, &dh0})
      if (!all_poison(*t)) return false;
    return true;
  }
};

strata_tensor_desc bytes_desc(int64_t n, strata_device d, int32_t dtype = STRATA_DTYPE_U8) {
  return make_desc(dtype, {n}, d);
}

// `kept`: the failing call's message (&g_msg after an OpRun call); nullptr: the last error (read here, after the
// call: the arguments are evaluated first).
void expect_error(strata_status s, strata_status want, const std::string& needle,
                  const std::string* kept = nullptr) {
  const std::string msg = kept ? *kept : strata_get_last_error_message();
  EXPECT_EQ(s, want) << strata_status_name(s) << ": " << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
}

// ---- the size function (pure: no device needed) ----

TEST(GdnSave, SizeFunctionFollowsTheLayout) {
  // bf16 B = 4, T = 8192, H = 16, HV = 32, K = V = 128 with l2norm (the benchmark shape), on a CUDA device.
  const strata_tensor_desc q = make_desc(STRATA_DTYPE_BF16, {4, 8192, 16, 128}, kGpu);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {4, 8192, 32, 128}, kGpu);
  uint64_t n = 0;
  ASSERT_EQ(strata_chunk_gated_delta_rule_saved_bytes(&q, &q, &v, nullptr, 1, &n), STRATA_SUCCESS);
  const uint64_t bt = 4 * 8192, qk = bt * 16 * 128 * 2, rows = bt * 16 * 4, gates = bt * 32 * 4,
                 A = bt * 32 * 64 * 2, w = bt * 32 * 128 * 2, vnew = w, h = uint64_t{4} * 128 * 32 * 128 * 128 * 2;
  EXPECT_EQ(n, 2 * qk + 2 * rows + gates + A + w + vnew + h);
  uint64_t no_l2 = 0;
  ASSERT_EQ(strata_chunk_gated_delta_rule_saved_bytes(&q, &q, &v, nullptr, 0, &no_l2), STRATA_SUCCESS);
  EXPECT_EQ(no_l2, n - 2 * qk - 2 * rows);
  // The C++ layout gives the same size and every part fits; h is the largest part.
  GdnParams p;
  p.q.dtype = p.k.dtype = p.v.dtype = STRATA_DTYPE_BF16;
  p.B = 4, p.T = 8192, p.H = 16, p.HV = 32, p.K = 128, p.V = 128, p.N = 4, p.l2norm = true;
  const linear_attn::GdnSavedLayout L = linear_attn::gdn_cuda_saved_layout(p);
  EXPECT_EQ(L.bytes, n);
  EXPECT_EQ(L.h + h, n);
  for (size_t off : {L.qn, L.kn, L.rq, L.rk, L.gam, L.A, L.w, L.vnew, L.h}) EXPECT_EQ(off % 256, 0u);
  // f32 tokens (or mixed dtypes): 4-byte intermediates; varlen: ceil(T / 64) + N chunk states in one row.
  const strata_tensor_desc qf = make_desc(STRATA_DTYPE_F32, {1, 100, 2, 32}, kGpu);
  const strata_tensor_desc vb = make_desc(STRATA_DTYPE_BF16, {1, 100, 4, 16}, kGpu);
  const strata_tensor_desc cu = make_desc(STRATA_DTYPE_I64, {4}, kGpu);
  ASSERT_EQ(strata_chunk_gated_delta_rule_saved_bytes(&qf, &qf, &vb, &cu, 0, &n), STRATA_SUCCESS);
  auto r = [](uint64_t x) { return (x + 255) / 256 * 256; };
  EXPECT_EQ(n, r(100 * 4 * 4) + r(100 * 4 * 64 * 4) + r(100 * 4 * 32 * 4) + r(100 * 4 * 16 * 4) +
                   r(uint64_t{(2 + 3) * 4 * 32 * 16 * 4}));
  // The CPU saves nothing; no tokens: nothing to save.
  const strata_tensor_desc qc = make_desc(STRATA_DTYPE_BF16, {4, 64, 16, 128}, kHost);
  const strata_tensor_desc vc = make_desc(STRATA_DTYPE_BF16, {4, 64, 32, 128}, kHost);
  ASSERT_EQ(strata_chunk_gated_delta_rule_saved_bytes(&qc, &qc, &vc, nullptr, 1, &n), STRATA_SUCCESS);
  EXPECT_EQ(n, 0u);
  const strata_tensor_desc q0 = make_desc(STRATA_DTYPE_BF16, {4, 0, 16, 128}, kGpu);
  const strata_tensor_desc v0 = make_desc(STRATA_DTYPE_BF16, {4, 0, 32, 128}, kGpu);
  ASSERT_EQ(strata_chunk_gated_delta_rule_saved_bytes(&q0, &q0, &v0, nullptr, 1, &n), STRATA_SUCCESS);
  EXPECT_EQ(n, 0u);
  // Its own argument rules.
  expect_error(strata_chunk_gated_delta_rule_saved_bytes(&q, &q, nullptr, nullptr, 1, &n), STRATA_ERROR_NULL_POINTER,
               "v must not be NULL");
  expect_error(strata_chunk_gated_delta_rule_saved_bytes(&q, &q, &v, nullptr, 1, nullptr), STRATA_ERROR_NULL_POINTER,
               "bytes must not be NULL");
  expect_error(strata_chunk_gated_delta_rule_saved_bytes(&cu, &q, &v, nullptr, 1, &n), STRATA_ERROR_INVALID_SHAPE,
               "q");
}

// ---- validation on the CPU (every rule: clear error, nothing written) ----

TEST(GdnSave, CpuIgnoresAnEmptyBufferAndRejectsOthers) {
  Prob p(STRATA_DTYPE_F32, 1, 70, 1, 2, 16, 8, {0, 30, 70});
  OpRun plain(p, kHost), with(p, kHost);
  ASSERT_EQ(plain.saved_bytes(), 0u);
  ASSERT_EQ(plain.fwd(nullptr, nullptr), STRATA_SUCCESS) << g_msg;
  ASSERT_EQ(plain.bwd(nullptr, nullptr), STRATA_SUCCESS) << g_msg;
  // An empty saved buffer: accepted and ignored (the same bits as without).
  const strata_tensor_desc empty = bytes_desc(0, kHost);
  ASSERT_EQ(with.fwd(&empty, nullptr), STRATA_SUCCESS) << g_msg;
  ASSERT_EQ(with.bwd(&empty, nullptr), STRATA_SUCCESS) << g_msg;
  EXPECT_EQ(with.o.storage, plain.o.storage);
  EXPECT_EQ(with.ht.storage, plain.ht.storage);
  EXPECT_EQ(with.grads(), plain.grads());
  // Any other buffer: the CPU saves nothing.
  std::vector<uint8_t> buf(4096, 0);
  OpRun bad(p, kHost);
  const strata_tensor_desc some = bytes_desc(4096, kHost);
  expect_error(bad.fwd(&some, buf.data()), STRATA_ERROR_INVALID_SHAPE, "saved must hold", &g_msg);
  expect_error(bad.bwd(&some, buf.data()), STRATA_ERROR_INVALID_SHAPE, "the CPU implementations save nothing", &g_msg);
  const strata_tensor_desc f32 = bytes_desc(0, kHost, STRATA_DTYPE_F32);
  expect_error(bad.fwd(&f32, nullptr), STRATA_ERROR_INVALID_DTYPE, "saved", &g_msg);
  const strata_tensor_desc rank2 = make_desc(STRATA_DTYPE_U8, {0, 4}, kHost);
  expect_error(bad.bwd(&rank2, nullptr), STRATA_ERROR_INVALID_SHAPE, "saved", &g_msg);
  const strata_tensor_desc on_gpu = bytes_desc(0, kGpu);
  const strata_status s = bad.fwd(&on_gpu, nullptr);
  EXPECT_NE(s, STRATA_SUCCESS);
  EXPECT_NE(g_msg.find("saved"), std::string::npos) << g_msg;
  EXPECT_TRUE(bad.outputs_untouched());
}

#if STRATA_WITH_CUDA

bool gpu() { return test::have_gpu(); }

// One byte buffer on the GPU.
struct Buf {
  std::unique_ptr<test::Dev> d;
  strata_tensor_desc desc{};
  explicit Buf(uint64_t n, int fill = 0)
      : d(std::make_unique<test::Dev>(n + 256)), desc(bytes_desc(static_cast<int64_t>(n), kGpu)) {
    EXPECT_EQ(cudaMemset(d->p, fill, n + 256), cudaSuccess);
  }
  void* p() const { return d->p; }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> h(static_cast<size_t>(desc.shape[0]));
    EXPECT_EQ(cudaMemcpy(h.data(), d->p, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(GdnSave, CudaRulesNothingWritten) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device";
  Prob p(STRATA_DTYPE_BF16, 2, 100, 2, 4, 64, 64);
  OpRun r(p, kGpu);
  const uint64_t n = r.saved_bytes();
  ASSERT_GT(n, 0u);
  Buf buf(n);
  // wrong size
  const strata_tensor_desc small = bytes_desc(static_cast<int64_t>(n) - 1, kGpu);
  expect_error(r.fwd(&small, buf.p()), STRATA_ERROR_INVALID_SHAPE, std::to_string(n) + " bytes", &g_msg);
  expect_error(r.bwd(&small, buf.p()), STRATA_ERROR_INVALID_SHAPE, "saved must hold", &g_msg);
  // wrong dtype, wrong device
  strata_tensor_desc i8 = buf.desc;
  i8.dtype = STRATA_DTYPE_I8;
  expect_error(r.fwd(&i8, buf.p()), STRATA_ERROR_INVALID_DTYPE, "saved", &g_msg);
  strata_tensor_desc host = buf.desc;
  host.device = kHost;
  EXPECT_NE(r.bwd(&host, buf.p()), STRATA_SUCCESS);
  EXPECT_NE(g_msg.find("saved"), std::string::npos) << g_msg;
  // misaligned start (checked at run time, before anything is written)
  expect_error(r.fwd(&buf.desc, static_cast<char*>(buf.p()) + 16), STRATA_ERROR_INVALID_VALUE, "256-byte aligned", &g_msg);
  expect_error(r.bwd(&buf.desc, static_cast<char*>(buf.p()) + 16), STRATA_ERROR_INVALID_VALUE, "256-byte aligned", &g_msg);
  // an implementation that does not store the residuals, forced
  {
    ForceImpl f("cuda.sm90.fused");
    expect_error(r.fwd(&buf.desc, buf.p()), STRATA_ERROR_NO_IMPLEMENTATION, "does not store the saved residuals", &g_msg);
  }
  r.download();
  EXPECT_TRUE(r.outputs_untouched());
  for (uint8_t x : buf.bytes()) ASSERT_EQ(x, 0);
}

// Forward with saved, then the backward reading it: the same bits as the backward that re-computes (the same
// kernels on the same data), the same bits on a repeat, and the buffer unchanged by the backwards.
void expect_saved_backward_same_bits(Prob& p) {
  SCOPED_TRACE(::testing::Message() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " HV=" << p.HV << " K=" << p.K
                                    << " V=" << p.V << " dtype=" << p.dt << " l2=" << p.l2 << " h0=" << p.has_h0
                                    << " dht=" << p.has_dht << " cu=" << p.cu_values.size());
  OpRun ref(p, kGpu), a(p, kGpu), b(p, kGpu);
  const uint64_t n = a.saved_bytes();
  ASSERT_GT(n, 0u);
  Buf buf(n), other(n, 0xff);
  ASSERT_EQ(a.fwd(&buf.desc, buf.p()), STRATA_SUCCESS) << g_msg;
  EXPECT_EQ(a.impl, "cuda.sm90.chunked");
  const std::vector<uint8_t> saved = buf.bytes();
  // Every byte of the buffer is written (or zeroed): a repeat into a buffer of other contents gives the same bits.
  ASSERT_EQ(b.fwd(&other.desc, other.p()), STRATA_SUCCESS) << g_msg;
  EXPECT_EQ(other.bytes(), saved) << "the saved buffer is not the same bits on a repeat";
  ASSERT_EQ(ref.bwd(nullptr, nullptr), STRATA_SUCCESS) << g_msg;
  ASSERT_EQ(a.bwd(&buf.desc, buf.p()), STRATA_SUCCESS) << g_msg;
  ASSERT_EQ(b.bwd(&buf.desc, buf.p()), STRATA_SUCCESS) << g_msg;
  ref.download(), a.download(), b.download();
  EXPECT_EQ(a.grads(), ref.grads()) << "backward with saved differs from the re-computing backward";
  EXPECT_EQ(b.grads(), a.grads()) << "backward with saved not deterministic";
  EXPECT_EQ(buf.bytes(), saved) << "the backward wrote into the saved buffer";
  // The forward with saved (composed kernels) against the default forward (fused pass where it applies): both are
  // checked against float64 by the conformance suite; here only that o and final_state are finite and close.
  OpRun f(p, kGpu);
  ASSERT_EQ(f.fwd(nullptr, nullptr), STRATA_SUCCESS) << g_msg;
  f.download();
  double num = 0, den = 0;
  for (int64_t i = 0; i < f.o.numel(); ++i) {
    const double x = a.o.get(i), y = f.o.get(i);
    ASSERT_TRUE(std::isfinite(x)) << i;
    num += (x - y) * (x - y), den += y * y;
  }
  EXPECT_LT(std::sqrt(num / std::max(den, 1e-300)), p.dt == STRATA_DTYPE_F32 ? 1e-4 : 2e-2);
}

// The op's C++ params of a CUDA OpRun (device pointers of its tensors), for the entry points below the plan.
linear_attn::GdnTensor gdn_tensor(const OpRun::Arg& a) {
  linear_attn::GdnTensor t;
  if (!a.d) return t;
  t.data = a.d->data(), t.dtype = a.d->desc().dtype;
  for (int i = 0; i < 4; ++i) t.st[i] = i < a.d->desc().rank ? a.d->desc().strides[i] : 0;
  return t;
}
GdnParams fwd_params_of(OpRun& r) {
  GdnParams p;
  p.q = gdn_tensor(r.q), p.k = gdn_tensor(r.k), p.v = gdn_tensor(r.v), p.g = gdn_tensor(r.g);
  p.beta = gdn_tensor(r.beta), p.h0 = gdn_tensor(r.h0), p.o = gdn_tensor(r.to), p.ht = gdn_tensor(r.tht);
  p.cu_seqlens = r.cu.d ? static_cast<const int64_t*>(r.cu.d->data()) : nullptr;
  p.B = r.p.B, p.T = r.p.T, p.H = r.p.H, p.HV = r.p.HV, p.K = r.p.K, p.V = r.p.V, p.N = r.p.N;
  p.scale = 0.3f;
  p.l2norm = r.p.l2;
  return p;
}

// The fused pass writing h and v_new (GdnSavedForward::kFusedPass) fills the saved buffer with the same bits as the
// composed forward (h is S rounded once in both; v_new, w, A, γ, qn, kn from the same kernels), at the three block
// widths of the wgmma pass (32 columns: few heads; 64: 40 heads; 128: 72 heads), varlen with empty and one-token
// documents, h0 or not; o and the final state close to the composed forward's (another summation order).
TEST(GdnSave, CudaFusedPassFillsTheSameSaved) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device";
  const int32_t bf = STRATA_DTYPE_BF16;
  std::vector<Prob> probs;
  probs.emplace_back(bf, 2, 130, 2, 4, 128, 128);
  probs.emplace_back(bf, 1, 200, 1, 4, 128, 64, std::vector<int64_t>{0, 0, 1, 64, 129, 200}, true, false, true);
  probs.emplace_back(bf, 10, 100, 2, 4, 128, 128, std::vector<int64_t>{}, false, true, true);
  probs.emplace_back(bf, 18, 70, 1, 4, 128, 128, std::vector<int64_t>{}, true, true, true);
  probs.emplace_back(bf, 1, 300, 1, 1, 128, 128, std::vector<int64_t>{}, false, false, true);
  for (Prob& pb : probs) {
    SCOPED_TRACE(::testing::Message() << "B=" << pb.B << " T=" << pb.T << " HV=" << pb.HV << " V=" << pb.V);
    OpRun a(pb, kGpu), f(pb, kGpu);
    const uint64_t n = a.saved_bytes();
    Buf sa(n), sf(n, 0xff);  // the fused form into a buffer of other contents: every byte written or zeroed
    for (auto [r, buf, form] : {std::tuple{&a, &sa, linear_attn::GdnSavedForward::kComposed},
                                std::tuple{&f, &sf, linear_attn::GdnSavedForward::kFusedPass}}) {
      GdnParams p = fwd_params_of(*r);
      p.saved.data = buf->p(), p.saved.dtype = STRATA_DTYPE_U8;
      test::Dev ws(linear_attn::gdn_cuda_fwd_workspace(p));
      ASSERT_EQ(linear_attn::gdn_cuda_fwd(p, ws.p, nullptr, form), STRATA_SUCCESS) << strata_get_last_error_message();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      r->download();
    }
    EXPECT_EQ(sf.bytes(), sa.bytes()) << "saved buffers differ";
    double num = 0, den = 0;
    for (int64_t i = 0; i < a.o.numel(); ++i) {
      const double x = f.o.get(i), y = a.o.get(i);
      ASSERT_TRUE(std::isfinite(x)) << i;
      num += (x - y) * (x - y), den += y * y;
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-300)), 1e-2);
    for (int64_t i = 0; i < a.ht.numel(); ++i) ASSERT_NEAR(f.ht.get(i), a.ht.get(i), 1e-3 + 1e-3 * std::fabs(a.ht.get(i)));
  }
}

// (Session 18) kFusedPassPair (the fused pass writing h with its CTAs of a q/k head in pairs sharing K, Q and, where a
// pair is one value head's column blocks, W by multicast) fills the saved buffer and writes o and the final state with
// kFusedPass's bits: at 32 columns (G = 1, 2, 4; W shared, and V = 96: pairs across two value heads, W not shared),
// 128 columns (G = 2, 4; partial last chunks; varlen with empty, one-token and chunk-boundary documents) and where no
// pair applies (64 columns: the unpaired pass, gdn_cuda_fwd_pass_cluster = 0). Widths by the H200's 132 SMs.
TEST(GdnSave, CudaFusedPassPairSameSavedBits) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device";
  const int32_t bf = STRATA_DTYPE_BF16;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::vector<Prob> probs;
  probs.emplace_back(bf, 2, 130, 2, 4, 128, 128);                                           // 32 columns, G = 2
  probs.emplace_back(bf, 1, 200, 1, 4, 128, 64, std::vector<int64_t>{0, 0, 1, 64, 129, 200}, true, false, true);
  probs.emplace_back(bf, 1, 300, 1, 1, 128, 128, std::vector<int64_t>{}, false, false, true);  // G = 1
  probs.emplace_back(bf, 1, 150, 2, 4, 128, 96);                                            // pairs across heads
  probs.emplace_back(bf, 10, 100, 2, 4, 128, 128, std::vector<int64_t>{}, false, true, true);  // 64: no pair
  probs.emplace_back(bf, 18, 70, 1, 4, 128, 128, std::vector<int64_t>{}, true, true, true);    // 128, G = 4
  probs.emplace_back(bf, 17, 150, 2, 4, 128, 128, std::vector<int64_t>{}, true, false, true);  // 128, G = 2
  probs.emplace_back(bf, 1, 600, 4, 8, 128, 128,
                     std::vector<int64_t>{0, 0, 1, 63, 64, 128, 129, 200, 260, 333, 600});  // 128, varlen
  const int want[] = {2, 2, 2, 2, 0, 2, 2, 2};  // the pair sizes on 132 SMs (the widths 32, 32, 32, 32, 64, 128 ...)
  int paired = 0, idx = 0;
  for (Prob& pb : probs) {
    SCOPED_TRACE(::testing::Message() << "B=" << pb.B << " T=" << pb.T << " H=" << pb.H << " HV=" << pb.HV
                                      << " V=" << pb.V << " N=" << pb.N);
    OpRun a(pb, kGpu), f(pb, kGpu);
    const uint64_t n = a.saved_bytes();
    Buf sa(n), sf(n, 0xff);  // the paired form into a buffer of other contents: every byte written or zeroed
    int cluster = -1;
    for (auto [r, buf, form] : {std::tuple{&a, &sa, linear_attn::GdnSavedForward::kFusedPass},
                                std::tuple{&f, &sf, linear_attn::GdnSavedForward::kFusedPassPair}}) {
      GdnParams p = fwd_params_of(*r);
      p.saved.data = buf->p(), p.saved.dtype = STRATA_DTYPE_U8;
      if (cluster < 0) cluster = linear_attn::gdn_cuda_fwd_pass_cluster(p, sms);
      test::Dev ws(linear_attn::gdn_cuda_fwd_workspace(p));
      for (int run = 0; run < 2; ++run) {  // twice: the second run over the first's bits (deterministic)
        ASSERT_EQ(linear_attn::gdn_cuda_fwd(p, ws.p, nullptr, form), STRATA_SUCCESS) << strata_get_last_error_message();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      }
      r->download();
    }
    if (sms == 132) EXPECT_EQ(cluster, want[idx]);
    EXPECT_TRUE(cluster == 0 || cluster == 2) << cluster;
    ++idx;
    paired += cluster == 2;
    EXPECT_EQ(sf.bytes(), sa.bytes()) << "saved buffers differ (pair " << cluster << ")";
    EXPECT_EQ(f.o.storage, a.o.storage) << "o differs (pair " << cluster << ")";
    EXPECT_EQ(f.ht.storage, a.ht.storage) << "final state differs (pair " << cluster << ")";
    EXPECT_FALSE(all_poison(f.o));
  }
  std::printf("[gdn_fwdh s18] saved forward, paired pass against unpaired: %d of %zu problems ran in pairs\n", paired,
              probs.size());
  if (sms == 132) EXPECT_EQ(paired, 7);
}

TEST(GdnSave, CudaBackwardWithSavedSameBits) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device";
  const int32_t bf = STRATA_DTYPE_BF16, f16 = STRATA_DTYPE_F16, f32 = STRATA_DTYPE_F32;
  std::vector<Prob> probs;
  probs.emplace_back(bf, 2, 130, 2, 4, 128, 128);                                          // G = 2, h0, dht, l2
  probs.emplace_back(bf, 1, 300, 1, 1, 128, 128, std::vector<int64_t>{}, false, false, false);  // G = 1, none
  probs.emplace_back(bf, 1, 200, 1, 3, 64, 64, std::vector<int64_t>{}, true, true, false);     // G = 3
  probs.emplace_back(bf, 1, 200, 1, 4, 128, 64, std::vector<int64_t>{0, 0, 1, 64, 129, 200});  // G = 4, varlen
  probs.emplace_back(f16, 1, 100, 1, 4, 128, 128, std::vector<int64_t>{}, true, false, true);
  probs.emplace_back(bf, 1, 80, 1, 2, 100, 100);                                           // K, V not tile multiples
  probs.emplace_back(f32, 2, 90, 2, 2, 64, 48, std::vector<int64_t>{}, false, true, true);   // f32 (FMA kernels)
  probs.emplace_back(f32, 1, 163, 2, 4, 32, 32, std::vector<int64_t>{0, 5, 5, 69, 100, 163});
  for (Prob& p : probs) expect_saved_backward_same_bits(p);
}

// Timing at the benchmark shapes (bf16, H = 16, HV = 32, K = V = 128, l2norm; B = 4 T = 8192 and B = 1 T = 32768):
// the default forward (fused pass, nothing saved) against the forward filling `saved` (composed kernels), the
// re-computing backward against the backward reading `saved`, and the latter per step (GdnStepProbe). Median of
// 7 interleaved calls after a warm-up. Information only: fails only if a call fails.
TEST(GdnSave, SavedTiming) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t B : {int64_t{4}, int64_t{1}}) {
    const int64_t T = 32768 / B, H = 16, HV = 32, K = 128, V = 128, rows = B * T;
    const int32_t bf = STRATA_DTYPE_BF16;
    test::Dev q(rows * H * K * 2), k(rows * H * K * 2), v(rows * HV * V * 2), g(rows * HV * 2), beta(rows * HV * 2),
        dout(rows * HV * V * 2), dq(rows * H * K * 2), dk(rows * H * K * 2), dv(rows * HV * V * 2), dg(rows * HV * 2),
        dbeta(rows * HV * 2), o(rows * HV * V * 2);
    for (test::Dev* x : {&q, &k, &v, &beta, &dout}) EXPECT_EQ(cudaMemset(x->p, 0x3c, x->bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(g.p, 0xbc, g.bytes), cudaSuccess);
    auto view = [&](test::Dev& x, int64_t heads, int64_t D) {  // contiguous [B, T, heads, D] (D = 0: [B, T, heads])
      linear_attn::GdnTensor t;
      t.data = x.p, t.dtype = bf;
      t.st[0] = T * heads * std::max<int64_t>(D, 1), t.st[1] = heads * std::max<int64_t>(D, 1);
      t.st[2] = D > 0 ? D : 1, t.st[3] = D > 0 ? 1 : 0;
      return t;
    };
    GdnParams p;
    p.q = view(q, H, K), p.k = view(k, H, K), p.v = view(v, HV, V), p.g = view(g, HV, 0), p.beta = view(beta, HV, 0);
    p.do_ = view(dout, HV, V), p.dq = view(dq, H, K), p.dk = view(dk, H, K), p.dv = view(dv, HV, V);
    p.dg = view(dg, HV, 0), p.dbeta = view(dbeta, HV, 0);
    p.B = B, p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V, p.N = B;
    p.scale = 0.0884f;
    p.l2norm = true;
    GdnParams pf = p;  // the forward's
    pf.do_ = pf.dq = pf.dk = pf.dv = pf.dg = pf.dbeta = linear_attn::GdnTensor{};
    pf.o = view(o, HV, V);
    const size_t saved_bytes = linear_attn::gdn_cuda_saved_bytes(p);
    test::Dev saved(saved_bytes);
    GdnParams ps = p, pfs = pf;
    ps.saved.data = pfs.saved.data = saved.p;
    ps.saved.dtype = pfs.saved.dtype = STRATA_DTYPE_U8;
    test::Dev ws_fused(linear_attn::gdn_cuda_fused_fwd_workspace(pf)), ws_fs(linear_attn::gdn_cuda_fwd_workspace(pfs)),
        ws_b(linear_attn::gdn_cuda_bwd_workspace(p)), ws_bs(linear_attn::gdn_cuda_bwd_workspace(ps));
    using linear_attn::GdnFusedForm;
    const std::vector<std::function<void()>> calls = {
        [&] { EXPECT_EQ(linear_attn::gdn_cuda_fused_fwd(pf, GdnFusedForm::kAuto, ws_fused.p, nullptr), STRATA_SUCCESS); },
        [&] {
          EXPECT_EQ(linear_attn::gdn_cuda_fwd(pfs, ws_fs.p, nullptr, linear_attn::GdnSavedForward::kComposed),
                    STRATA_SUCCESS);
        },
        [&] {
          EXPECT_EQ(linear_attn::gdn_cuda_fwd(pfs, ws_fs.p, nullptr, linear_attn::GdnSavedForward::kFusedPass),
                    STRATA_SUCCESS);
        },
        [&] { EXPECT_EQ(linear_attn::gdn_cuda_bwd(p, ws_b.p, nullptr), STRATA_SUCCESS); },
        [&] { EXPECT_EQ(linear_attn::gdn_cuda_bwd(ps, ws_bs.p, nullptr), STRATA_SUCCESS); }};
    cudaEvent_t ev[2];
    for (cudaEvent_t& e : ev) EXPECT_EQ(cudaEventCreate(&e), cudaSuccess);
    std::vector<std::vector<double>> ms(calls.size());
    for (int rep = 0; rep < 8; ++rep)
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(cudaEventRecord(ev[0]), cudaSuccess);
        calls[i]();
        EXPECT_EQ(cudaEventRecord(ev[1]), cudaSuccess);
        EXPECT_EQ(cudaEventSynchronize(ev[1]), cudaSuccess);
        float t = 0.f;
        cudaEventElapsedTime(&t, ev[0], ev[1]);
        if (rep > 0) ms[i].push_back(t);  // rep 0: warm-up
      }
    auto median = [](std::vector<double> x) {
      std::sort(x.begin(), x.end());
      return x[x.size() / 2];
    };
    const double MiB = 1024.0 * 1024.0;
    std::printf("[gdn_save timing] bf16 B=%lld T=%lld H=16 HV=32 K=V=128 l2norm: forward fused (nothing saved) %.3f ms, "
                "forward filling saved: composed %.3f ms, fused pass %.3f ms; backward re-computing %.3f ms, backward "
                "reading saved %.3f ms\n[gdn_save memory] B=%lld: saved "
                "%.1f MiB (%.1f bytes per token and value head), workspaces: fused forward %.1f MiB, forward with saved "
                "%.1f MiB, backward %.1f MiB, backward with saved %.1f MiB\n",
                static_cast<long long>(B), static_cast<long long>(T), median(ms[0]), median(ms[1]), median(ms[2]),
                median(ms[3]), median(ms[4]), static_cast<long long>(B), saved_bytes / MiB,
                static_cast<double>(saved_bytes) / static_cast<double>(rows * HV),
                ws_fused.bytes / MiB, ws_fs.bytes / MiB, ws_b.bytes / MiB, ws_bs.bytes / MiB);
    // The backward reading saved, per step (an event after each step's launches; median of 5).
    struct Steps {
      std::vector<cudaEvent_t> ev = std::vector<cudaEvent_t>(8);
      std::vector<std::string> names;
    } st;
    for (cudaEvent_t& e : st.ev) EXPECT_EQ(cudaEventCreate(&e), cudaSuccess);
    linear_attn::GdnStepProbe probe;
    probe.ctx = &st;
    probe.fn = [](void* c, const char* step) {
      Steps& x = *static_cast<Steps*>(c);
      if (x.names.size() + 1 >= x.ev.size()) return;
      x.names.push_back(step);
      cudaEventRecord(x.ev[x.names.size()]);
    };
    std::vector<std::vector<double>> step_ms;
    for (int rep = 0; rep < 5; ++rep) {
      st.names.clear();
      EXPECT_EQ(cudaEventRecord(st.ev[0]), cudaSuccess);
      EXPECT_EQ(linear_attn::gdn_cuda_bwd(ps, ws_bs.p, nullptr, &probe), STRATA_SUCCESS);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      step_ms.resize(st.names.size());
      for (size_t i = 0; i < st.names.size(); ++i) {
        float t = 0.f;
        cudaEventElapsedTime(&t, st.ev[i], st.ev[i + 1]);
        step_ms[i].push_back(t);
      }
    }
    std::string line = "[gdn_save timing] backward reading saved, steps bf16 B=" + std::to_string(B) +
                       " T=" + std::to_string(T) + ":";
    for (size_t i = 0; i < step_ms.size(); ++i) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.3f ms%s", st.names[i].c_str(), median(step_ms[i]),
                    i + 1 < step_ms.size() ? "," : "");
      line += buf;
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    for (cudaEvent_t e : st.ev) cudaEventDestroy(e);
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
  }
}

#endif  // STRATA_WITH_CUDA

}  // namespace
}  // namespace strata
