// ATK support shared by the four gdn_bwd harnesses: case parsing, realistic random inputs (L2-normalised
// q/k rows, chunk-local cumsums of negative log gates, sigmoid betas), host/device tensors, running a plan
// with its workspace, and the float64 / naive expectations through the ops' references.
//
// A case line: "<op> dtype=bf16 shape=2x65x2x4x64x32 bt=32 cu=none gate=1 gnorm=10 scale=0.125 layout=padded
// seed=3 [op flags]". shape = B x T x H x HV x K x V; cu = "none" or the cu_seqlens values joined by '-'
// (then B = 1 and T = the last value); gnorm divides the per-token log gates logsigmoid(U[0,1)) (0.01: very
// strong decay, γ down to about -4400 in a chunk; 10: weak decay); layout contiguous | padded (every
// dimension padded, unit last stride, an offset).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "opbase/plan.h"
#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"
#include "testkit/testkit.h"

namespace strata::atk::gdn_bwd_kit {

using linear_attn::gdn_bwd::Dims;
using linear_attn::gdn_bwd::View;

// "none"; the values joined by '-'; or "shortN": N sequences of lengths 0, 1, 2, 0, 1, 2, ... (many documents:
// N * HV beyond the 65535 limit of gridDim.y/z).
inline std::vector<int64_t> parse_cu(const std::string& s) {
  std::vector<int64_t> v;
  if (s.empty() || s == "none") return v;
  if (s.rfind("short", 0) == 0) {
    const int64_t n = std::stoll(s.substr(5));
    v.push_back(0);
    for (int64_t i = 0; i < n; ++i) v.push_back(v.back() + i % 3);
    return v;
  }
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-')) v.push_back(std::stoll(part));
  return v;
}
inline std::string cu_arg(const std::vector<int64_t>& cu) {
  return cu.empty() ? "none" : fmt::format("{}", fmt::join(cu, "-"));
}

struct GdnCase {
  int32_t dt = STRATA_DTYPE_F32;
  int64_t B = 1, T = 1, H = 1, HV = 1, K = 16, V = 16;
  int32_t BT = 64;
  std::vector<int64_t> cu;
  bool gate = true;
  double gnorm = 10.0;
  float scale = 1.f;
  bool padded = false;
  uint64_t seed = 1;
  int64_t N() const { return cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1; }
  Layout layout() const { return padded ? Layout::kPaddedRows : Layout::kContiguous; }
};

inline GdnCase parse_case(const Case& c) {
  GdnCase g;
  g.dt = dtype_from_name(c.get("dtype", "f32"));
  const std::vector<int64_t> s = c.get_shape("shape");
  g.B = s.at(0), g.T = s.at(1), g.H = s.at(2), g.HV = s.at(3), g.K = s.at(4), g.V = s.at(5);
  g.BT = static_cast<int32_t>(c.get_int("bt", 64));
  g.cu = parse_cu(c.get("cu"));
  g.gate = c.get_int("gate", 1) != 0;
  g.gnorm = c.get_double("gnorm", 10.0);
  g.scale = static_cast<float>(c.get_double("scale", 1.0 / std::sqrt(static_cast<double>(g.K > 0 ? g.K : 1))));
  g.padded = c.get("layout", "contiguous") == "padded";
  g.seed = static_cast<uint64_t>(c.get_int("seed", 1));
  return g;
}

// A case line with the common keys set.
inline Case make_case(const char* op, const char* dt, std::vector<int64_t> shape, int bt,
                      const std::vector<int64_t>& cu, int gate, double gnorm, const char* layout, int64_t seed,
                      const std::string& cu_name = "") {
  if (!cu.empty()) shape[0] = 1, shape[1] = cu.back();
  return Case(op)
      .set("dtype", dt)
      .set("shape", shape_arg(shape))
      .set("bt", bt)
      .set("cu", cu_name.empty() ? cu_arg(cu) : cu_name)
      .set("gate", gate)
      .set("gnorm", fmt::format("{}", gnorm))
      .set("layout", layout)
      .set("seed", seed);
}

inline Dims dims_of(const GdnCase& g, int64_t NT = 0) {
  Dims d;
  d.B = g.B, d.T = g.T, d.H = g.H, d.HV = g.HV, d.G = g.H > 0 ? g.HV / g.H : 1, d.K = g.K, d.V = g.V;
  d.N = g.N(), d.BT = g.BT, d.NT = NT;
  return d;
}

// Total chunks of the case (the NT of varlen chunk-state tensors; ceil(T / BT) per row otherwise).
inline int64_t total_chunks(const GdnCase& g) {
  if (g.cu.empty()) return (g.T + g.BT - 1) / g.BT;
  int64_t nt = 0;
  for (size_t n = 0; n + 1 < g.cu.size(); ++n) nt += (g.cu[n + 1] - g.cu[n] + g.BT - 1) / g.BT;
  return nt;
}

// The sequences [bos, eos) of each batch row, as (b, bos, eos).
struct SeqSpan {
  int64_t b, bos, eos;
};
inline std::vector<SeqSpan> spans(const GdnCase& g) {
  std::vector<SeqSpan> s;
  if (g.cu.empty())
    for (int64_t b = 0; b < g.B; ++b) s.push_back({b, 0, g.T});
  else
    for (size_t n = 0; n + 1 < g.cu.size(); ++n) s.push_back({0, g.cu[n], g.cu[n + 1]});
  return s;
}

inline View host_view(const HostTensor& t) {
  View v;
  v.dtype = t.desc.dtype;
  v.p = const_cast<uint8_t*>(t.storage.data()) + t.desc.offset * static_cast<int64_t>(dtype_size(t.desc.dtype));
  const int outer = t.desc.rank == 3 ? 3 : t.desc.rank - 1;
  for (int i = 0; i < outer && i < 4; ++i) v.s[i] = t.desc.strides[i];
  return v;
}

// Rows of the last dimension drawn from N(0, 1) and L2-normalised (q, k as the models feed them).
inline void fill_unit_rows(HostTensor& t, std::mt19937_64& rng) {
  t.fill_normal(rng);
  const int64_t D = t.desc.shape[t.desc.rank - 1];
  if (D == 0) return;
  for (int64_t r = 0; r < t.numel() / D; ++r) {
    double s = 0;
    for (int64_t x = 0; x < D; ++x) s += t.get(r * D + x) * t.get(r * D + x);
    const double inv = 1.0 / std::sqrt(s + 1e-12);
    for (int64_t x = 0; x < D; ++x) t.set(r * D + x, t.get(r * D + x) * inv);
  }
}

// γ [B, T, HV]: chunk-local inclusive cumsums (chunks restart at each sequence start) of per-token log gates
// logsigmoid(U[0, 1)) / gnorm.
inline void fill_gamma(HostTensor& out, const GdnCase& g, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (const SeqSpan& s : spans(g))
    for (int64_t hv = 0; hv < g.HV; ++hv)
      for (int64_t t0 = s.bos; t0 < s.eos; t0 += g.BT) {
        double acc = 0;
        for (int64_t t = t0; t < std::min<int64_t>(t0 + g.BT, s.eos); ++t) {
          acc += -std::log1p(std::exp(-u(rng))) / g.gnorm;
          out.set((s.b * g.T + t) * g.HV + hv, acc);
        }
      }
}

inline void fill_sigmoid(HostTensor& t, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  for (int64_t e = 0; e < t.numel(); ++e) t.set(e, 1.0 / (1.0 + std::exp(-n(rng))));
}

// The three copies of one output: what the implementation writes (poisoned, the case's layout), the float64
// reference and the naive same-dtype computation (both contiguous).
struct Out {
  HostTensor got, ref, naive;
  int32_t dtype = STRATA_DTYPE_F32;
  Out() = default;
  Out(int32_t dt, const std::vector<int64_t>& shape, Layout layout) : dtype(dt) {
    got = HostTensor::make(dt, shape, layout);
    got.poison();
    ref = HostTensor::make(STRATA_DTYPE_F64, shape);
    naive = HostTensor::make(dt, shape);
  }
};

inline HostTensor cu_tensor(const std::vector<int64_t>& cu) {
  HostTensor t = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(cu.size())});
  for (size_t i = 0; i < cu.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(cu[i]));
  return t;
}

// Runs a built plan on `device` with the given host tensors (uploaded; NULL entries stay NULL) and a workspace
// of the plan's size; downloads the tensors whose index is in `outputs`.
inline void run_plan(strata_plan plan, strata_device device, std::vector<HostTensor*> tensors,
                     const std::vector<int>& outputs) {
  std::vector<std::unique_ptr<DeviceTensor>> dev(tensors.size());
  std::vector<void*> ptrs(tensors.size(), nullptr);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i]) {
      dev[i] = std::make_unique<DeviceTensor>(*tensors[i], device);
      ptrs[i] = dev[i]->data();
    }
  size_t ws = 0;
  check(strata_plan_workspace_size(plan, &ws), "workspace size");
  void* wsp = nullptr;
  if (ws) check(strata_malloc(device, ws, nullptr, &wsp), "workspace");
  const strata_status st = strata_plan_run(plan, ptrs.data(), static_cast<int32_t>(ptrs.size()), wsp, ws, nullptr);
  if (wsp) {
    strata_device_synchronize(device);
    strata_free(wsp);
  }
  check(st, "run");
  for (int i : outputs)
    if (tensors[i]) dev[i]->download(*tensors[i]);
}

// Descriptors of host tensors moved to `device` (what the plan sees), NULL for absent ones.
struct Descs {
  std::vector<strata_tensor_desc> d;
  std::vector<const strata_tensor_desc*> p;
  Descs(const std::vector<HostTensor*>& ts, strata_device device) : d(ts.size()), p(ts.size(), nullptr) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i]) {
        d[i] = ts[i]->desc;
        d[i].device = device;
        p[i] = &d[i];
      }
  }
};

// The precision model of the implementation a plan runs (the flag its registration carries, opbase/plan.h).
inline PrecisionModel precision_of(strata_plan plan) {
  const Plan* p = plan_from_handle(plan);
  return p ? p->precision : PrecisionModel::kOutputDtype;
}

// The dtype an output is judged at. Implementations of PrecisionModel::kInputDtype (the tensor-core kernels) multiply
// operands of the token dtype (bf16/f16) and round intermediates (dS, Ds, dVn, dA) to it before a product, as fla
// does (ops_gdn_kda.md §6.3; §7.4: "bf16 kernels at fla's tolerances"): their f32 outputs (dh0, dg, dbeta) carry
// that rounding and are judged at the token dtype. Every other implementation is judged at each output's own dtype.
inline int32_t judged_dtype(int32_t out_dt, int32_t case_dt, PrecisionModel pm) {
  const bool token16 = case_dt == STRATA_DTYPE_BF16 || case_dt == STRATA_DTYPE_F16;
  return pm == PrecisionModel::kInputDtype && token16 && out_dt == STRATA_DTYPE_F32 ? case_dt : out_dt;
}

inline Compare compare_out(const char* name, const Out& o, double len, int32_t case_dt, PrecisionModel pm) {
  return compare(name, o.got.values(), o.ref.values(), o.naive.values(), judged_dtype(o.dtype, case_dt, pm), len);
}

}  // namespace strata::atk::gdn_bwd_kit

namespace strata::atk::gdn_bwd_kit {

// The conformance sweep shared by the four ops (each op adds its own flags through `decorate`, called with
// a running index): every dtype at the bug-catching lengths 1, 63, 65, 130 with GVA G = 2; chunk sizes
// 16/32/64; GVA G = 1, 3, 4; K = 100, 128, 256; strong and no decay; variable-length packs with zero-length,
// single-token and chunk-straddling sequences; padded layouts; empty problems.
template <class Decorate>
std::vector<Case> sweep(const char* op, Decorate&& decorate) {
  std::vector<Case> cases;
  int64_t seed = 1;
  const char* layouts[] = {"contiguous", "padded"};
  auto add = [&](const char* dt, std::vector<int64_t> shape, int bt, const std::vector<int64_t>& cu, int gate,
                 double gnorm, int li) {
    Case c = make_case(op, dt, shape, bt, cu, gate, gnorm, layouts[li % 2], seed);
    decorate(c, seed);
    ++seed;
    cases.push_back(std::move(c));
  };
  int rot = 0;
  for (const char* dt : {"f32", "bf16", "f16", "f64"})
    for (int64_t T : {1, 63, 65, 130}) {
      add(dt, {2, T, 2, 4, 64, 32}, 64, {}, rot % 3 != 2, 10.0, rot);
      ++rot;
    }
  for (int bt : {16, 32})
    for (const char* dt : {"f32", "bf16"}) {
      add(dt, {1, 100, 1, 3, 32, 48}, bt, {}, 1, 1.0, rot);
      add(dt, {2, 37, 2, 2, 16, 16}, bt, {}, rot % 2, 10.0, rot + 1);
      ++rot;
    }
  add("f32", {1, 70, 2, 2, 128, 128}, 64, {}, 1, 10.0, 0);    // K = V = 128
  add("bf16", {1, 65, 1, 1, 256, 64}, 64, {}, 1, 10.0, 1);    // K = 256
  add("f32", {1, 80, 1, 2, 100, 100}, 32, {}, 1, 10.0, 0);    // K = V = 100 (not a tile multiple)
  add("f16", {1, 64, 2, 8, 32, 24}, 16, {}, 1, 10.0, 1);      // G = 4
  add("f32", {1, 64, 1, 4, 64, 256}, 64, {}, 1, 10.0, 0);     // V = 256
  add("f32", {2, 90, 1, 2, 32, 32}, 64, {}, 1, 0.01, 0);      // strong decay (γ down to about -4000)
  add("bf16", {1, 90, 2, 2, 32, 32}, 32, {}, 1, 1.0, 1);
  add("f32", {1, 33, 1, 1, 8, 8}, 16, {}, 0, 10.0, 1);        // plain delta rule (no gate)
  const std::vector<std::vector<int64_t>> packs = {{0, 5, 5, 69, 100, 163},
                                                   {0, 1, 2, 3, 40, 41, 100},
                                                   {0, 15},
                                                   {0, 0, 0, 64, 64, 130, 130},
                                                   {0, 63, 127, 129, 192, 200}};
  for (const auto& cu : packs)
    for (int bt : {16, 64}) {
      const char* dt = rot % 3 == 0 ? "f32" : (rot % 3 == 1 ? "bf16" : "f64");
      add(dt, {1, 0, 2, 4, 32, 16}, bt, cu, rot % 4 != 3, 10.0, rot);
      ++rot;
    }
  add("f16", {1, 0, 1, 3, 64, 64}, 32, {0, 17, 17, 90, 91}, 1, 1.0, 0);
  {  // many documents: 17000 sequences of 0-2 tokens, N * HV = 68000 > 65535 (grid-dimension limits)
    Case c = make_case(op, "bf16", {1, 0, 1, 4, 16, 8}, 16, parse_cu("short17000"), 1, 1.0, "contiguous", seed,
                       "short17000");
    decorate(c, seed);
    ++seed;
    cases.push_back(std::move(c));
  }
  // Empty problems: no tokens, an empty pack, packs of zero-length sequences.
  add("f32", {2, 0, 1, 2, 16, 16}, 64, {}, 1, 10.0, 0);
  add("f32", {1, 0, 1, 2, 16, 16}, 64, {0}, 1, 10.0, 0);
  add("bf16", {1, 0, 1, 2, 16, 16}, 32, {0, 0, 0}, 1, 10.0, 0);
  // 16-bit cases at the shapes the tensor-core kernels tile differently (cuda.sm90.mma): K = V = 100 (neither a
  // tile multiple), K = V = 128 with GVA, K = V = 256, packs with tails at K = 128, no gate, strong decay.
  add("bf16", {1, 80, 1, 2, 100, 100}, 32, {}, 1, 10.0, 0);
  add("f16", {1, 80, 1, 2, 100, 100}, 64, {}, 1, 10.0, 1);
  add("bf16", {2, 130, 2, 4, 128, 128}, 64, {}, 1, 10.0, 0);
  add("f16", {1, 70, 2, 2, 128, 128}, 64, {}, 1, 10.0, 1);
  add("bf16", {1, 130, 1, 2, 256, 256}, 64, {}, 1, 10.0, 0);
  add("f16", {1, 65, 1, 1, 256, 256}, 32, {}, 1, 10.0, 0);
  add("bf16", {1, 0, 2, 4, 128, 128}, 64, {0, 5, 5, 69, 100, 163}, 1, 10.0, 1);
  add("f16", {1, 0, 2, 4, 128, 64}, 16, {0, 63, 127, 129, 192, 200}, 1, 1.0, 0);
  add("bf16", {1, 100, 1, 3, 128, 128}, 32, {}, 0, 10.0, 1);  // plain delta rule
  add("bf16", {2, 90, 1, 2, 64, 64}, 64, {}, 1, 0.01, 0);     // strong decay
  add("f16", {1, 150, 1, 2, 48, 96}, 64, {}, 1, 1.0, 1);      // K < 64 with V > 64 (bwd_dhu's 128-column V tiles)
  // Many (sequence, head) pairs at K = V = 128: N·HV·ceil(V / 32) = 288 > the SM count, so bwd_dhu keeps its
  // 64-column single-stage tiles (the smaller K = 128 cases above take its 32-column two-stage tiles).
  add("bf16", {2, 100, 2, 36, 128, 128}, 64, {}, 1, 10.0, 1);
  return cases;
}

}  // namespace strata::atk::gdn_bwd_kit

namespace strata::atk::gdn_bwd_kit {

// A benchmark case over host tensors built by `make` (plan order; an empty optional means NULL), uploaded once.
inline BenchCase bench_from(strata_device device, std::string label, double flops, double bytes,
                            std::function<std::vector<std::optional<HostTensor>>()> make,
                            std::function<strata_status(const std::vector<const strata_tensor_desc*>&, strata_plan*)> plan_fn) {
  struct State {
    std::vector<std::unique_ptr<DeviceTensor>> t;
    strata_plan plan = nullptr;
    void* ws = nullptr;
    size_t ws_size = 0;
  };
  auto st = std::make_shared<State>();
  BenchCase b;
  b.label = std::move(label);
  b.flops = flops;
  b.bytes = bytes;
  b.setup = [=] {
    std::vector<const strata_tensor_desc*> descs;
    for (auto& h : make()) {
      st->t.push_back(h ? std::make_unique<DeviceTensor>(*h, device) : nullptr);
      descs.push_back(h ? &st->t.back()->desc() : nullptr);
    }
    check(plan_fn(descs, &st->plan), "bench plan");
    check(strata_plan_workspace_size(st->plan, &st->ws_size), "bench workspace size");
    if (st->ws_size) check(strata_malloc(device, st->ws_size, nullptr, &st->ws), "bench workspace");
  };
  b.run = [st] {
    std::vector<void*> p;
    for (auto& t : st->t) p.push_back(t ? t->data() : nullptr);
    check(strata_plan_run(st->plan, p.data(), static_cast<int32_t>(p.size()), st->ws, st->ws_size, nullptr),
          "bench run");
  };
  b.teardown = [st] {
    strata_plan_destroy(st->plan);
    if (st->ws) strata_free(st->ws);
    st->t.clear();
  };
  return b;
}

// The benchmark shape: T = 4096, H = 4, HV = 8, K = V = 128 on the CPU; B = 4, T = 8192, H = 16, HV = 32 on CUDA.
inline GdnCase bench_shape(strata_device device) {
  const bool cuda = device.type == STRATA_DEVICE_CUDA;
  GdnCase g;
  g.B = cuda ? 4 : 1, g.T = cuda ? 8192 : 4096, g.H = cuda ? 16 : 4, g.HV = cuda ? 32 : 8, g.K = 128, g.V = 128;
  g.BT = 64;
  g.scale = 0.088f;
  return g;
}
inline std::string bench_label(const char* op, const GdnCase& g) {
  return fmt::format("{} {} B={} T={} H={} HV={} K={} V={} BT={}", op, dtype_name(g.dt), g.B, g.T, g.H, g.HV, g.K,
                     g.V, g.BT);
}
// The benchmark dtypes: f32 (the FMA kernels) and bf16 (the tensor-core kernels on CUDA).
inline std::vector<int32_t> bench_dtypes() { return {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}; }
// A contiguous copy of an f32 tensor in dtype dt (bf16 / f16 bits written straight into the storage: the
// benchmark tensors reach 10^8 elements); f32 returns the tensor itself.
inline HostTensor as_dtype(HostTensor t, int32_t dt) {
  if (dt == STRATA_DTYPE_F32) return t;
  HostTensor o = HostTensor::make(dt, std::vector<int64_t>(t.desc.shape, t.desc.shape + t.desc.rank));
  const float* src = reinterpret_cast<const float*>(t.storage.data());
  uint16_t* dst = reinterpret_cast<uint16_t*>(o.storage.data());
  for (int64_t i = 0; i < t.numel(); ++i)
    dst[i] = dt == STRATA_DTYPE_BF16 ? f32_to_bf16_bits(src[i]) : f32_to_f16_bits(src[i]);
  return o;
}
// A contiguous f32 tensor of values uniform in [-sd*sqrt(3), sd*sqrt(3)) (standard deviation sd), written
// straight into the storage with a 64-bit LCG: the benchmark tensors reach 10^8 elements (h, dh at the CUDA
// shape), where per-element HostTensor::set and normal sampling take minutes of host time.
inline HostTensor randn(const std::vector<int64_t>& shape, std::mt19937_64& rng, double sd = 1.0) {
  HostTensor t = HostTensor::make(STRATA_DTYPE_F32, shape);
  float* p = reinterpret_cast<float*>(t.storage.data());
  uint64_t x = rng() | 1;
  const float a = static_cast<float>(sd * std::sqrt(3.0)) * 0x1p-31f;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = a * static_cast<float>(static_cast<int32_t>(x >> 32));
  }
  return t;
}

}  // namespace strata::atk::gdn_bwd_kit
