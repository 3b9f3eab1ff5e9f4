// Device-side helpers shared by the CUDA tests of the GDN kernels (test_gdn_fwd_cuda_variants.cpp,
// test_gdn_bwd_cuda_variants.cpp, test_gdn_prep_fold.cpp): random token tensors uploaded to the GPU, contiguous
// gdn_bwd::View descriptors, the relative RMS of two buffers and the median launch time.
#pragma once

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "opbase/dtype.h"
#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"
#include "ops/linear_attn/gdn_common/gdn_common.h"

namespace strata::linear_attn::gdn_test {

// n random values in dtype dt (bf16 / f16 bits, or f32), N(0, sd) (uniform in [lo, 0] for gates when lo < 0).
inline std::vector<uint8_t> random_bytes(int64_t n, int32_t dt, std::mt19937_64& rng, double sd, double lo = 0) {
  std::normal_distribution<float> nd(0.f, static_cast<float>(sd));
  std::uniform_real_distribution<float> ud(static_cast<float>(lo), 0.f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * dtype_size(dt));
  for (int64_t i = 0; i < n; ++i) {
    const float x = lo < 0 ? ud(rng) : nd(rng);
    if (dt == STRATA_DTYPE_F32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t b = dt == STRATA_DTYPE_BF16 ? f32_to_bf16_bits(x) : f32_to_f16_bits(x);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

inline std::unique_ptr<test::Dev> upload(const std::vector<uint8_t>& h) {
  auto d = std::make_unique<test::Dev>(h.size());
  if (!h.empty()) EXPECT_EQ(cudaMemcpy(d->p, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
inline std::unique_ptr<test::Dev> upload(const void* h, size_t bytes) {
  auto d = std::make_unique<test::Dev>(bytes);
  if (bytes) EXPECT_EQ(cudaMemcpy(d->p, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// A contiguous forward-op view [B, T, heads, D] (D = 0: [B, T, heads]).
inline gdn::GdnTensor fwd_tok(void* p, int32_t dt, int64_t T, int64_t heads, int64_t D) {
  gdn::GdnTensor t;
  t.data = p, t.dtype = dt;
  if (D > 0) t.st[0] = T * heads * D, t.st[1] = heads * D, t.st[2] = D, t.st[3] = 1;
  else t.st[0] = T * heads, t.st[1] = heads, t.st[2] = 1;
  return t;
}

// The same for the full operator's tensors (chunk_gated_delta_rule's GdnParams).
inline GdnTensor op_tok(void* p, int32_t dt, int64_t T, int64_t heads, int64_t D) {
  GdnTensor t;
  t.data = p, t.dtype = dt;
  if (D > 0) t.st[0] = T * heads * D, t.st[1] = heads * D, t.st[2] = D, t.st[3] = 1;
  else t.st[0] = T * heads, t.st[1] = heads, t.st[2] = 1;
  return t;
}

// Contiguous views: [B, T, heads, D] (D = 0: [B, T, heads]) and the chunk states [B, NT, HV, K, V].
inline gdn_bwd::View tok(void* p, int32_t dt, int64_t T, int64_t heads, int64_t D) {
  gdn_bwd::View v;
  v.p = p, v.dtype = dt;
  if (D > 0) v.s[0] = T * heads * D, v.s[1] = heads * D, v.s[2] = D;
  else v.s[0] = T * heads, v.s[1] = heads, v.s[2] = 1;
  return v;
}
inline gdn_bwd::View states(void* p, int32_t dt, int64_t NT, int64_t HV, int64_t K, int64_t V) {
  gdn_bwd::View v;
  v.p = p, v.dtype = dt;
  v.s[0] = NT * HV * K * V, v.s[1] = HV * K * V, v.s[2] = K * V, v.s[3] = V;
  return v;
}

// The forward params' shape and chunk enumeration of a problem with chunk size BT (cu empty: B fixed-length rows;
// else cu_seqlens of a pack, uploaded with its chunk offsets), and the sequences' token bounds (b T + t order).
struct FwdChunks {
  std::unique_ptr<test::Dev> cu, offs;
  std::vector<int64_t> bounds;
};
inline FwdChunks set_fwd_shape(gdn::GdnFwdParams& p, int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V,
                               int64_t BT, const std::vector<int64_t>& cu) {
  FwdChunks r;
  gdn::GdnShape& d = p.shape;
  d.B = B, d.T = T, d.H = H, d.HV = HV, d.G = HV / H, d.K = K, d.V = V, d.BT = BT;
  d.N = cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1;
  d.NTr = d.NT = (T + BT - 1) / BT;
  gdn::GdnChunks& m = p.chunks;
  m.B = B, m.T = T, m.N = d.N, m.BT = BT, m.NTr = d.NTr;
  if (cu.empty()) {
    for (int64_t b = 0; b <= B; ++b) r.bounds.push_back(b * T);
    return r;
  }
  r.bounds = cu;
  std::vector<int64_t> off(cu.size());
  gdn::GdnChunks hm = m;
  hm.cu = cu.data();
  d.NT = gdn::fill_chunk_offsets(hm, off.data());
  r.cu = std::make_unique<test::Dev>(cu.size() * 8);
  r.offs = std::make_unique<test::Dev>(off.size() * 8);
  EXPECT_EQ(cudaMemcpy(r.cu->p, cu.data(), cu.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.offs->p, off.data(), off.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
  m.cu = static_cast<const int64_t*>(r.cu->p);
  m.offsets = static_cast<const int64_t*>(r.offs->p);
  return r;
}

// Counts 16-bit words 0xffff (the poison: a NaN in bf16 / f16) in the bytes of a buffer.
inline size_t poisoned(const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i + 1 < b.size(); i += 2) n += (b[i] == 0xff && b[i + 1] == 0xff);
  return n;
}

// Relative RMS difference of two 16-bit (dt) or f32 buffers of n elements.
inline double rel_rms(const std::vector<uint8_t>& a, const std::vector<uint8_t>& r, int32_t dt) {
  const size_t es = dtype_size(dt), n = r.size() / es;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    float x = 0, y = 0;
    if (dt == STRATA_DTYPE_F32) {
      std::memcpy(&x, a.data() + 4 * i, 4), std::memcpy(&y, r.data() + 4 * i, 4);
    } else {
      uint16_t bx, by;
      std::memcpy(&bx, a.data() + 2 * i, 2), std::memcpy(&by, r.data() + 2 * i, 2);
      x = dt == STRATA_DTYPE_BF16 ? bf16_bits_to_f32(bx) : f16_bits_to_f32(bx);
      y = dt == STRATA_DTYPE_BF16 ? bf16_bits_to_f32(by) : f16_bits_to_f32(by);
    }
    num += (double(x) - y) * (double(x) - y), den += double(y) * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Median of 7 timed runs (after one warm-up) of fn, in ms; -1 if a launch failed.
template <class Fn>
double time_ms(Fn fn) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  std::vector<double> t;
  bool ok = fn() == STRATA_SUCCESS;
  for (int i = 0; i < 7 && ok; ++i) {
    cudaEventRecord(e0);
    ok = fn() == STRATA_SUCCESS;
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  if (!ok) return -1.0;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// `reps` timed calls of each fn (CUDA events, after one warm-up call each), interleaved (f0 f1 f2 f0 f1 f2 ...) so
// that clock or load drift hits every fn alike; the samples of each fn, sorted, in ms.
inline std::vector<std::vector<double>> time_interleaved_ms(const std::vector<std::function<void()>>& fns, int reps) {
  for (const auto& f : fns) f();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < fns.size(); ++i) {
      cudaEventRecord(e0);
      fns[i]();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0.f;
      cudaEventElapsedTime(&ms, e0, e1);
      t[i].push_back(ms);
    }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  for (auto& v : t) std::sort(v.begin(), v.end());
  return t;
}
// The fastest of each fn's calls (what a test sharing the GPU with other ctest jobs can trust) ...
inline std::vector<double> time_min_ms(const std::vector<std::function<void()>>& fns, int reps = 7) {
  std::vector<double> r;
  for (const auto& v : time_interleaved_ms(fns, reps)) r.push_back(v.front());
  return r;
}
// ... and the median (for runs with the GPU to themselves).
inline std::vector<double> time_median_ms(const std::vector<std::function<void()>>& fns, int reps) {
  std::vector<double> r;
  for (const auto& v : time_interleaved_ms(fns, reps)) r.push_back(v[v.size() / 2]);
  return r;
}

// Per-step times of a composite call (gdn_cuda_bwd, gdn_cuda_fused_fwd): `call` passes the probe on, which records an
// event after each step's launches (GdnStepProbe, at most 8 steps); the fastest of `reps` calls per step, in ms,
// with the steps' names (session 13: shared by the forward's and the backward's step timings).
struct StepTimes {
  std::vector<std::string> names;
  std::vector<double> ms;
};
inline StepTimes time_steps(const std::function<void(const GdnStepProbe*)>& call, int reps) {
  struct Ctx {
    std::vector<cudaEvent_t> ev;
    std::vector<std::string> names;
    size_t n = 0;
  } ctx;
  ctx.ev.resize(9);
  for (cudaEvent_t& e : ctx.ev) EXPECT_EQ(cudaEventCreate(&e), cudaSuccess);
  GdnStepProbe probe;
  probe.ctx = &ctx;
  probe.fn = [](void* c, const char* step) {
    Ctx& x = *static_cast<Ctx*>(c);
    if (x.n + 1 >= x.ev.size()) return;
    ++x.n;
    cudaEventRecord(x.ev[x.n]);
    x.names.resize(x.n + 1);
    x.names[x.n] = step;
  };
  StepTimes r;
  for (int rep = 0; rep < reps; ++rep) {
    ctx.n = 0;
    EXPECT_EQ(cudaEventRecord(ctx.ev[0]), cudaSuccess);
    call(&probe);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    r.ms.resize(ctx.n, 1e30);
    for (size_t i = 1; i <= ctx.n; ++i) {
      float t = 0.f;
      cudaEventElapsedTime(&t, ctx.ev[i - 1], ctx.ev[i]);
      r.ms[i - 1] = std::min(r.ms[i - 1], static_cast<double>(t));
    }
  }
  r.names.assign(ctx.names.begin() + (ctx.names.empty() ? 0 : 1), ctx.names.end());
  for (cudaEvent_t e : ctx.ev) cudaEventDestroy(e);
  return r;
}

// The composed GDN backward's problem at a benchmark shape on the device (the timing tests' call): bf16 q, k [B, T,
// H, K], v, do [B, T, HV, V], g, β [B, T, HV] filled by cudaMemset (0x3c: ≈ 0.0115; g 0xbc: ≈ −0.0115), outputs dq,
// dk, dv, dg, dβ; l2norm, scale 0.0884. With `saved`, p.saved is filled by the default forward first (o into a
// scratch tensor), so that gdn_cuda_bwd(p, ...) reads the residuals instead of re-running the forward. fwd(): the
// forward's params (o, no gradients, no saved residuals).
struct GdnBenchProblem {
  std::vector<std::unique_ptr<test::Dev>> bufs;
  GdnParams p;
  GdnTensor o;
  GdnBenchProblem(int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, bool saved) {
    const int32_t bf = STRATA_DTYPE_BF16;
    auto tt = [&](int64_t heads, int64_t D, int fill) {
      bufs.push_back(std::make_unique<test::Dev>(B * T * heads * std::max<int64_t>(D, 1) * 2));
      if (fill >= 0) EXPECT_EQ(cudaMemset(bufs.back()->p, fill, bufs.back()->bytes), cudaSuccess);
      return op_tok(bufs.back()->p, bf, T, heads, D);
    };
    p.q = tt(H, K, 0x3c), p.k = tt(H, K, 0x3c), p.v = tt(HV, V, 0x3c), p.g = tt(HV, 0, 0xbc);
    p.beta = tt(HV, 0, 0x3c);
    p.B = B, p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V, p.N = B;
    p.scale = 0.0884f;
    p.l2norm = true;
    o = tt(HV, V, -1);
    if (saved) {
      p.o = o;
      bufs.push_back(std::make_unique<test::Dev>(gdn_cuda_saved_bytes(p)));
      p.saved.data = bufs.back()->p, p.saved.dtype = STRATA_DTYPE_U8;
      test::Dev ws(gdn_cuda_fwd_workspace(p));
      EXPECT_EQ(gdn_cuda_fwd(p, ws.p, nullptr), STRATA_SUCCESS);
      p.o = GdnTensor{};
    }
    p.do_ = tt(HV, V, 0x3c), p.dq = tt(H, K, -1), p.dk = tt(H, K, -1), p.dv = tt(HV, V, -1), p.dg = tt(HV, 0, -1);
    p.dbeta = tt(HV, 0, -1);
  }
  GdnParams fwd() const {
    GdnParams f = p;
    f.do_ = f.dq = f.dk = f.dv = f.dg = f.dbeta = GdnTensor{};
    f.saved = decltype(f.saved){};
    f.o = o;
    return f;
  }
};

}  // namespace strata::linear_attn::gdn_test
#endif  // STRATA_WITH_CUDA
