// ATK harnesses of chunk_gated_delta_rule (forward and backward): conformance cases against the float64
// token recurrence, and the benchmark shapes.
//
// A case line: "chunk_gated_delta_rule_fwd dtype=bf16 shape=2x65x2x4x64x64 cu=none h0=1 ht=1 dht=1 l2=1
// gate=normal beta=sig scale=0 layout=contiguous seed=3"; shape is B x T x H x HV x K x V; cu is "none" or
// the cu_seqlens values joined by '-'; gate: normal (logsigmoid(U)/norm with norm 1, zero with probability
// 1/2), zero (g = 0), strong (about -70 per token), weak (logsigmoid(U)/10); beta: sig (sigmoid(randn)) or
// small (1e-4); scale 0 = K^-0.5; layout: contiguous or padded (every tensor padded, a non-zero offset);
// saved=1: the forward fills a `saved` buffer (strata_chunk_gated_delta_rule_saved_bytes: 0 bytes on the CPU, whose
// implementations ignore it) and the backward case runs that forward first, then the backward reading the buffer
// instead of re-running the forward (every non-f64 case is run both ways); large=1: a case at one of fla's test shapes
// (ops_gdn_kda.md §7.3, up to 4 x 1024 tokens at K = V = 128), run only by the implementation the dispatcher picks
// for it (see make_cases).
// The "naive" result of the acceptance rule is the same token recurrence run in f32 (gdn_recurrent_* with
// Real = float) on the same rounded inputs, stored in the output dtypes.
// Precision model of the CUDA implementation: with 16-bit tokens it runs the sub-operators' tensor-core kernels,
// which round product operands and intermediates to the token dtype as fla does (ops_gdn_kda.md §6.3), so its
// f32 outputs (final_state, dh0, and dg with f32 g) are judged at the token dtype: the rule the sub-operators'
// harnesses apply to their cuda.sm90.mma implementations (gdn_bwd_kit::judged_dtype).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "ops/linear_attn/gdn_bwd_common/testkit_gdn_bwd.h"
#include "opbase/plan.h"
#include "testkit/testkit.h"

namespace strata::atk {
namespace {

using linear_attn::GdnParams;
using linear_attn::GdnTensor;

// The dtype an output of dtype out_dt is judged at (see the file comment).
int32_t judged(int32_t out_dt, int32_t case_dt, strata_device device) {
  return device.type == STRATA_DEVICE_CUDA ? gdn_bwd_kit::judged_dtype(out_dt, case_dt, PrecisionModel::kInputDtype) : out_dt;
}

std::vector<int64_t> parse_cu(const std::string& s) {
  std::vector<int64_t> v;
  if (s.empty() || s == "none") return v;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-')) v.push_back(std::stoll(part));
  return v;
}
std::string cu_arg(const std::vector<int64_t>& cu) {
  return cu.empty() ? "none" : fmt::format("{}", fmt::join(cu, "-"));
}

GdnTensor host_ref(HostTensor* t) {
  GdnTensor r;
  if (!t) return r;
  r.data = t->storage.data() + t->desc.offset * static_cast<int64_t>(dtype_size(t->desc.dtype));
  r.dtype = t->desc.dtype;
  for (int i = 0; i < 4; ++i) r.st[i] = i < t->desc.rank ? t->desc.strides[i] : 0;
  return r;
}

// The tensors of one case, on the host.
struct GdnCase {
  int64_t B, T, H, HV, K, V, N;
  std::vector<int64_t> cu;
  int32_t dt;
  float scale;
  bool l2, has_h0, has_ht, has_dht;
  Layout layout;
  bool saved, large, fast;
  bool filled = false;
  uint64_t seed;
  std::string gate, beta_mode;
  HostTensor q, k, v, g, beta, h0, cu_t, d_o, dht;

  // fill = false: the tensors are made (shapes, dtypes, layouts) but their values are not drawn yet (fill_values):
  // enough to make plans, which a large case does before it draws ~10^7 values (large_skip).
  explicit GdnCase(const Case& c, bool fill = true) : seed(static_cast<uint64_t>(c.get_int("seed", 1))) {
    dt = dtype_from_name(c.get("dtype", "f32"));
    const std::vector<int64_t> s = c.get_shape("shape");
    B = s[0], T = s[1], H = s[2], HV = s[3], K = s[4], V = s[5];
    cu = parse_cu(c.get("cu"));
    N = cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1;
    l2 = c.get_int("l2") != 0;
    has_h0 = c.get_int("h0") != 0;
    has_ht = c.get_int("ht", 1) != 0;
    has_dht = c.get_int("dht") != 0;
    const double sc = c.get_double("scale", 0.0);
    scale = static_cast<float>(sc > 0 ? sc : 1.0 / std::sqrt(static_cast<double>(K)));
    layout = c.get("layout", "contiguous") == "padded" ? Layout::kPaddedRows : Layout::kContiguous;
    saved = c.get_int("saved") != 0;
    large = c.get_int("large") != 0;
    gate = c.get("gate", "normal");
    beta_mode = c.get("beta", "sig");
    fast = c.get_int("fast_fill") != 0 && l2 && layout == Layout::kContiguous;
    const int32_t sdt = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    q = HostTensor::make(dt, {B, T, H, K}, layout);
    k = HostTensor::make(dt, {B, T, H, K}, layout);
    v = HostTensor::make(dt, {B, T, HV, V}, layout);
    g = HostTensor::make(sdt, {B, T, HV}, layout);
    beta = HostTensor::make(dt, {B, T, HV}, layout);
    if (has_h0) h0 = HostTensor::make(sdt, {N, HV, K, V}, layout);
    if (!cu.empty()) {
      cu_t = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(cu.size())});
      for (size_t i = 0; i < cu.size(); ++i) cu_t.set(static_cast<int64_t>(i), static_cast<double>(cu[i]));
    }
    d_o = HostTensor::make(dt, {B, T, HV, V}, layout);
    if (has_dht) dht = HostTensor::make(sdt, {N, HV, K, V}, layout);
    if (fill) fill_values();
  }

  // Draws the values (from the case's seed; the same values whenever called).
  void fill_values() {
    filled = true;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> U(0.0, 1.0);
    std::normal_distribution<double> Nrm(0.0, 1.0);
    // Benchmark tensors (fast_fill, contiguous, l2norm in the kernel) reach 4 x 10^8 elements at the CUDA
    // shape, where the per-element sampling below takes a minute of host time: q, k, v and do come from the
    // LCG fill of the GDN bench kits instead (uniform with unit variance; the timing does not depend on it).
    if (fast) {
      q = gdn_bwd_kit::as_dtype(gdn_bwd_kit::randn({B, T, H, K}, rng), dt);
      k = gdn_bwd_kit::as_dtype(gdn_bwd_kit::randn({B, T, H, K}, rng), dt);
      v = gdn_bwd_kit::as_dtype(gdn_bwd_kit::randn({B, T, HV, V}, rng), dt);
    }
    // q, k: random directions; without the in-kernel l2norm they are normalised here (the model does it:
    // unnormalised keys make the delta-rule transitions expansive, ops_gdn_kda.md §6.2).
    for (HostTensor* x : {&q, &k}) {
      if (fast) break;
      std::vector<double> row(static_cast<size_t>(K));
      for (int64_t r = 0; r < B * T * H; ++r) {
        double ss = 0;
        for (auto& e : row) ss += (e = Nrm(rng)) * e;
        const double f = l2 ? 1.0 : 1.0 / std::sqrt(ss + 1e-12);
        for (int64_t d = 0; d < K; ++d) x->set(r * K + d, row[d] * f);
      }
    }
    if (!fast) v.fill_normal(rng);
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double u = std::max(U(rng), 1e-12);
      double gv = std::log(1.0 / (1.0 + std::exp(-u)));  // logsigmoid(U[0,1)) in [-0.69, -0.31]
      if (gate == "zero") gv = 0.0;
      else if (gate == "strong") gv = gv / 0.01;   // about -70 per token
      else if (gate == "weak") gv = gv / 10.0;
      else if (U(rng) < 0.5) gv = 0.0;             // normal: half the tokens do not decay
      g.set(i, gv);
    }
    for (int64_t i = 0; i < beta.numel(); ++i)
      beta.set(i, beta_mode == "small" ? 1e-4 : 1.0 / (1.0 + std::exp(-Nrm(rng))));
    if (has_h0) h0.fill_normal(rng, 0.0, 0.5);
    if (fast)
      d_o = gdn_bwd_kit::as_dtype(gdn_bwd_kit::randn({B, T, HV, V}, rng), dt);
    else
      d_o.fill_normal(rng);
    if (has_dht) dht.fill_normal(rng);
  }

  GdnParams params() {
    GdnParams p;
    p.q = host_ref(&q);
    p.k = host_ref(&k);
    p.v = host_ref(&v);
    p.g = host_ref(&g);
    p.beta = host_ref(&beta);
    p.h0 = host_ref(has_h0 ? &h0 : nullptr);
    p.cu_seqlens = cu.empty() ? nullptr : reinterpret_cast<const int64_t*>(cu_t.storage.data());
    p.do_ = host_ref(&d_o);
    p.dht = host_ref(has_dht ? &dht : nullptr);
    p.B = B, p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V, p.N = N;
    p.scale = scale;
    p.l2norm = l2;
    return p;
  }
};

std::unique_ptr<DeviceTensor> upload(const HostTensor* h, strata_device d) {
  return h ? std::make_unique<DeviceTensor>(*h, d) : nullptr;
}
const strata_tensor_desc* dsc(const std::unique_ptr<DeviceTensor>& t) { return t ? &t->desc() : nullptr; }
void* ptr(const std::unique_ptr<DeviceTensor>& t) { return t ? t->data() : nullptr; }

// Runs `plan` (then destroys it) on `tensors` with the workspace it reports (host memory on the CPU).
strata_status run_plan(strata_plan plan, std::vector<void*> tensors, strata_device device) {
  size_t ws_size = 0;
  strata_plan_workspace_size(plan, &ws_size);
  std::vector<uint8_t> ws_host;
  void* ws = nullptr;
  if (ws_size) {
    if (device.type == STRATA_DEVICE_CPU) {
      ws_host.resize(ws_size);
      ws = ws_host.data();
    } else {
      check(strata_malloc(device, ws_size, nullptr, &ws), "workspace");
    }
  }
  const strata_status st =
      strata_plan_run(plan, tensors.data(), static_cast<int32_t>(tensors.size()), ws, ws_size, nullptr);
  if (ws && device.type != STRATA_DEVICE_CPU) strata_free(ws);
  strata_plan_destroy(plan);
  return st;
}

// The `saved` buffer of a case (saved=1): uint8 [strata_chunk_gated_delta_rule_saved_bytes] on the device (0
// bytes on the CPU), or nullptr (saved=0).
std::unique_ptr<DeviceTensor> saved_buffer(const GdnCase& x, const std::unique_ptr<DeviceTensor>& q,
                                           const std::unique_ptr<DeviceTensor>& k,
                                           const std::unique_ptr<DeviceTensor>& v,
                                           const std::unique_ptr<DeviceTensor>& cu) {
  if (!x.saved) return nullptr;
  uint64_t bytes = 0;
  check(strata_chunk_gated_delta_rule_saved_bytes(dsc(q), dsc(k), dsc(v), dsc(cu), x.l2 ? 1 : 0, &bytes),
        "saved bytes");
  const HostTensor h = HostTensor::make(STRATA_DTYPE_U8, {static_cast<int64_t>(bytes)});
  return std::make_unique<DeviceTensor>(h, q->desc().device);
}

// Runs `f` with nothing forced in-process (STRATA_FORCE_IMPL from the environment still applies), then restores
// what was forced.
strata_status unforced(const std::function<strata_status()>& f) {
  const std::string force_now = forced_impl();
  strata_set_force_impl(nullptr);
  const strata_status st = f();
  strata_set_force_impl(force_now.empty() ? nullptr : force_now.c_str());
  return st;
}

// Why a large=1 case does not run under the implementation forced now (`forced`: the name of the plan made under
// it), "" when it runs: it runs only by the implementation the dispatcher picks for it (a plan made by
// `make_plan` with nothing forced), and only on the path training takes: on the CPU not with saved=1 (the CPU
// ignores `saved`), on CUDA a backward only with saved=1 (the forward runs both ways: without a gradient it saves
// nothing). The float64 token recurrence judging such a case costs seconds of host time (also in `strata atk`,
// which runs every case once), and the other implementations (the other CPU ISAs, which share all code but the
// GEMM micro-kernel; the forced CUDA forms) and paths are covered by the small cases.
std::string large_skip(const GdnCase& x, bool bwd, strata_device device, const std::string& forced,
                       const std::function<strata_status(strata_plan*)>& make_plan) {
  if (!x.large) return "";
  if (device.type == STRATA_DEVICE_CPU && x.saved) return "a large case with saved=1: the CPU ignores saved";
  if (device.type != STRATA_DEVICE_CPU && bwd && !x.saved)
    return "a large backward case without saved on CUDA: its saved=1 twin runs (the training path)";
  if (forced_impl().empty()) return "";  // nothing forced: the dispatcher's pick is running
  strata_plan plan = nullptr;
  const strata_status st = unforced([&] { return make_plan(&plan); });
  const std::string picked = st == STRATA_SUCCESS ? strata_plan_impl_name(plan) : "";
  strata_plan_destroy(plan);
  if (picked.empty() || picked == forced) return "";
  return fmt::format("a large case (§7.3 shape): run by the dispatcher's pick {} only", picked);
}

// The case's plan (make_plan, under what is forced now; its name into r.impl), or nullptr with r marked skipped
// for a large case not run here (large_skip). A large case that runs draws its values now and uploads them into
// the device copies of `inputs` (made from the value-less tensors).
strata_plan plan_case(GdnCase& x, bool bwd, strata_device device,
                      const std::function<strata_status(strata_plan*)>& make_plan,
                      std::initializer_list<std::pair<std::unique_ptr<DeviceTensor>*, const HostTensor*>> inputs,
                      CaseResult& r) {
  strata_plan plan = nullptr;
  check(make_plan(&plan), "plan");
  r.impl = strata_plan_impl_name(plan);
  r.message = large_skip(x, bwd, device, r.impl, make_plan);
  if (!r.message.empty()) {
    strata_plan_destroy(plan);
    r.skipped = true;
    return nullptr;
  }
  if (!x.filled) {
    x.fill_values();
    for (const auto& [d, h] : inputs)
      if (*d) (*d)->upload(*h);
  }
  return plan;
}

std::vector<Case> make_cases(const char* op, bool bwd) {
  std::vector<Case> cases;
  int64_t seed = 1;
  auto add = [&](const char* dt, const std::vector<int64_t>& shape, const std::vector<int64_t>& cu, int h0, int ht,
                 int dht, int l2, const char* gate, const char* beta, double scale, const char* layout) {
    cases.push_back(Case(op)
                        .set("dtype", dt)
                        .set("shape", shape_arg(shape))
                        .set("cu", cu_arg(cu))
                        .set("h0", h0)
                        .set("ht", ht)
                        .set("dht", dht)
                        .set("l2", l2)
                        .set("gate", gate)
                        .set("beta", beta)
                        .set("scale", fmt::format("{}", scale))
                        .set("layout", layout)
                        .set("seed", seed++));
  };
  // T sweep (tails, one token, exact chunks), every dtype, h0 / dht / l2norm rotating.
  int rot = 0;
  for (const char* dt : {"f32", "bf16", "f16", "f64"})
    for (int64_t T : {1, 15, 63, 64, 65, 127}) {
      add(dt, {2, T, 2, 4, 32, 24}, {}, rot % 2, 1, (rot / 2) % 2, (rot / 3) % 2, "normal", "sig", 0, rot % 4 == 3 ? "padded" : "contiguous");
      ++rot;
    }
  add("f32", {1, 1000, 1, 2, 64, 64}, {}, 1, 1, 1, 1, "normal", "sig", 0, "contiguous");
  add("bf16", {1, 300, 2, 2, 64, 64}, {}, 1, 1, 1, 1, "weak", "sig", 0, "contiguous");
  // GVA ratios 1, 2, 3, 4 (and 6 below); K, V in {64, 128, 256} and K = 100; scale 1.
  add("f32", {1, 130, 3, 3, 64, 32}, {}, 1, 1, 1, 0, "normal", "sig", 0, "contiguous");
  add("bf16", {1, 130, 2, 6, 64, 64}, {}, 0, 1, 1, 1, "normal", "sig", 1.0, "contiguous");
  add("f16", {1, 100, 1, 4, 128, 128}, {}, 1, 1, 0, 1, "normal", "sig", 0, "contiguous");
  // bf16 K = 128 (the wgmma pass's shapes, session 8): 8 sequence-heads (32-column blocks), 72 (128-column
  // blocks, partial last chunk, strong decay), varlen with empty and one-token documents.
  add("bf16", {2, 130, 2, 4, 128, 128}, {}, 1, 1, 1, 1, "normal", "sig", 0, "contiguous");
  add("bf16", {18, 70, 1, 4, 128, 128}, {}, 0, 1, 0, 0, "strong", "sig", 0, "contiguous");
  add("bf16", {1, 200, 1, 2, 128, 64}, {0, 0, 1, 64, 129, 200}, 1, 1, 0, 0, "weak", "sig", 0, "contiguous");
  add("f32", {1, 70, 1, 1, 256, 256}, {}, 1, 1, 1, 1, "normal", "sig", 0, "contiguous");
  // 16-bit K = V = 256 (the fused forward takes K <= 128: cuda.sm90.chunked with 16-bit tokens) and f16 V = 256.
  add("bf16", {1, 130, 1, 2, 256, 256}, {}, 1, 1, 1, 1, "normal", "sig", 0, "contiguous");
  add("f16", {2, 70, 1, 1, 128, 256}, {}, 1, 1, 1, 0, "weak", "sig", 0, "contiguous");
  add("bf16", {1, 80, 1, 2, 100, 100}, {}, 1, 1, 1, 1, "normal", "sig", 0, "padded");
  add("f32", {2, 90, 2, 2, 100, 48}, {}, 0, 0, 0, 0, "normal", "sig", 0.1, "contiguous");
  // G = 6: the CPU tasks hold at most 4 value heads of a q/k head (groups of 4 and 2, dq/dk summed afterwards).
  add("f32", {1, 150, 1, 6, 64, 32}, {}, 1, 1, 1, 1, "normal", "sig", 0, "contiguous");
  // Gate and beta extremes: g = 0 (pure delta rule), strong decay (-70 per token), beta -> 0.
  add("f32", {1, 129, 1, 2, 32, 32}, {}, 1, 1, 1, 1, "zero", "sig", 0, "contiguous");
  add("f32", {1, 129, 1, 2, 32, 32}, {}, 1, 1, 1, 1, "strong", "sig", 0, "contiguous");
  add("bf16", {1, 129, 1, 2, 32, 32}, {}, 1, 1, 1, 0, "strong", "sig", 0, "contiguous");
  add("f32", {1, 129, 1, 2, 32, 32}, {}, 1, 1, 1, 1, "normal", "small", 0, "contiguous");
  // Variable-length packs: zero-length sequences, single tokens, shorter and longer than a chunk.
  const std::vector<std::vector<int64_t>> packs = {{0, 15}, {0, 5, 5, 69, 100, 163}, {0, 1, 2, 3, 40, 41, 100},
                                                   {0, 0, 64, 64, 130, 130}, {0, 63, 127, 129, 192, 300}};
  for (const auto& cu : packs)
    for (const char* dt : {"f32", "bf16"}) {
      add(dt, {1, cu.back(), 2, 4, 32, 32}, cu, rot % 2, 1, (rot + 1) % 2, rot % 3 == 0, "normal", "sig", 0,
          rot % 4 == 1 ? "padded" : "contiguous");
      ++rot;
    }
  add("f64", {1, 100, 1, 2, 16, 8}, {0, 1, 2, 3, 40, 41, 100}, 1, 1, 1, 1, "normal", "sig", 0, "contiguous");
  // Empty: no tokens (final state = initial state, dh0 = dht), no batch.
  add("f32", {2, 0, 1, 2, 16, 16}, {}, 1, 1, 1, 0, "normal", "sig", 0, "contiguous");
  add("f32", {1, 0, 1, 1, 16, 16}, {0, 0, 0}, 1, 1, 1, 0, "normal", "sig", 0, "contiguous");
  add("f32", {0, 5, 1, 1, 16, 16}, {}, 0, 0, 0, 0, "normal", "sig", 0, "contiguous");
  // fla's test shapes (ops_gdn_kda.md §7.3; B x T x H x HV x K = V), f16 and bf16, K = 60 / 64 / 100 / 128, scale 0.1
  // and 1 (and K^-0.5), fla's varlen packs; large=1: run by the dispatcher's pick only (large_skip).
  // Fixed length: test_chunk's (2,75,4,4,64) with strong gates (fla's gate norm 0.01), (2,500,3,3,60),
  // (3,1024,4,4,100), (4,1024,4,4,128) with the in-kernel l2norm, GVA (2,512,2,8,64) and (2,1024,4,8,128).
  const size_t s73 = cases.size();
  add("f16", {2, 75, 4, 4, 64, 64}, {}, 1, 1, 1, 0, "strong", "sig", 0.1, "contiguous");
  add("bf16", {2, 500, 3, 3, 60, 60}, {}, 1, 1, 0, 1, "normal", "sig", 1.0, "contiguous");
  add("f16", {3, 1024, 4, 4, 100, 100}, {}, 0, 1, 1, 0, "weak", "sig", 0.1, "contiguous");
  add("bf16", {4, 1024, 4, 4, 128, 128}, {}, 1, 1, 1, 1, "normal", "sig", 0, "contiguous");
  add("f16", {2, 512, 2, 8, 64, 64}, {}, 1, 1, 1, 1, "normal", "sig", 1.0, "contiguous");
  add("f16", {2, 1024, 4, 8, 128, 128}, {}, 1, 1, 0, 0, "normal", "sig", 0.1, "contiguous");
  // test_chunk_varlen's packs [0, 256, 500, 1000] and [0, 15, 100, 300, 1200, 2000] with its (H, HV, K).
  add("f16", {1, 1000, 4, 4, 60, 60}, {0, 256, 500, 1000}, 1, 1, 1, 0, "normal", "sig", 0.1, "contiguous");
  add("bf16", {1, 1000, 2, 8, 64, 64}, {0, 256, 500, 1000}, 0, 1, 1, 1, "normal", "sig", 1.0, "contiguous");
  add("bf16", {1, 2000, 4, 4, 100, 100}, {0, 15, 100, 300, 1200, 2000}, 1, 1, 1, 1, "weak", "sig", 0.1,
      "contiguous");
  add("f16", {1, 2000, 2, 4, 64, 64}, {0, 15, 100, 300, 1200, 2000}, 1, 1, 0, 1, "normal", "sig", 0, "contiguous");
  for (size_t i = s73; i < cases.size(); ++i) cases[i].set("large", 1);
  (void)bwd;
  const size_t plain = cases.size();
  for (size_t i = 0; i < plain; ++i)
    if (cases[i].get("dtype") != "f64") cases.push_back(Case(cases[i]).set("saved", 1).set("seed", seed++));
  return cases;
}

class GdnHarness final : public OpHarness {
 public:
  explicit GdnHarness(bool bwd) : bwd_(bwd) {}
  std::string op() const override { return bwd_ ? "chunk_gated_delta_rule_bwd" : "chunk_gated_delta_rule_fwd"; }
  std::vector<Case> conformance_cases() const override { return make_cases(op().c_str(), bwd_); }

  CaseResult run_case(const Case& c, strata_device device) const override {
    CaseResult r;
    GdnCase x(c, /*fill=*/c.get_int("large") == 0);  // a large case draws its values once it runs (large_skip)
    if (x.dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    return bwd_ ? run_bwd(x, device) : run_fwd(x, device);
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override;

 private:
  bool bwd_;

  CaseResult run_fwd(GdnCase& x, strata_device device) const {
    CaseResult r;
    const int32_t sdt = x.g.desc.dtype;
    HostTensor o = HostTensor::make(x.dt, {x.B, x.T, x.HV, x.V}, x.layout);
    HostTensor ht = HostTensor::make(sdt, {x.N, x.HV, x.K, x.V}, x.layout);
    o.poison();
    ht.poison();
    auto dq = upload(&x.q, device), dk = upload(&x.k, device), dv = upload(&x.v, device), dg = upload(&x.g, device),
         db = upload(&x.beta, device), dh0 = upload(x.has_h0 ? &x.h0 : nullptr, device),
         dcu = upload(x.cu.empty() ? nullptr : &x.cu_t, device), d_out = upload(&o, device),
         d_ht = upload(x.has_ht ? &ht : nullptr, device);
    const auto saved = saved_buffer(x, dq, dk, dv, dcu);
    auto make_plan = [&](strata_plan* out) {
      return strata_chunk_gated_delta_rule_fwd_plan(dsc(dq), dsc(dk), dsc(dv), dsc(dg), dsc(db), dsc(dh0), dsc(dcu),
                                                    dsc(d_out), dsc(d_ht), dsc(saved), x.scale, x.l2 ? 1 : 0, out);
    };
    strata_plan plan = plan_case(x, false, device, make_plan,
                                 {{&dq, &x.q}, {&dk, &x.k}, {&dv, &x.v}, {&dg, &x.g}, {&db, &x.beta}, {&dh0, &x.h0}},
                                 r);
    if (!plan) return r;
    // float64 reference and the naive f32 recurrence, on the same inputs
    HostTensor o_ref = HostTensor::make(STRATA_DTYPE_F64, {x.B, x.T, x.HV, x.V});
    HostTensor ht_ref = HostTensor::make(STRATA_DTYPE_F64, {x.N, x.HV, x.K, x.V});
    HostTensor o_nv = HostTensor::make(x.dt, {x.B, x.T, x.HV, x.V});
    HostTensor ht_nv = HostTensor::make(sdt, {x.N, x.HV, x.K, x.V});
    GdnParams p = x.params();
    p.o = host_ref(&o_ref);
    p.ht = host_ref(&ht_ref);
    linear_attn::gdn_recurrent_fwd<double>(p);
    p.o = host_ref(&o_nv);
    p.ht = host_ref(&ht_nv);
    if (x.dt == STRATA_DTYPE_F64)
      linear_attn::gdn_recurrent_fwd<double>(p);
    else
      linear_attn::gdn_recurrent_fwd<float>(p);

    check(run_plan(plan, {ptr(dq), ptr(dk), ptr(dv), ptr(dg), ptr(db), ptr(dh0), ptr(dcu), ptr(d_out), ptr(d_ht),
                          ptr(saved)},
                   device),
          "run");
    d_out->download(o);
    const double len = static_cast<double>(x.K);
    r.compares.push_back(compare("o", o.values(), o_ref.values(), o_nv.values(), x.dt, len));
    if (x.has_ht) {
      d_ht->download(ht);
      r.compares.push_back(
          compare("final_state", ht.values(), ht_ref.values(), ht_nv.values(), judged(sdt, x.dt, device), len));
    }
    r.pass = true;
    for (const auto& cmp : r.compares) r.pass = r.pass && cmp.pass;
    return r;
  }

  CaseResult run_bwd(GdnCase& x, strata_device device) const {
    CaseResult r;
    const int32_t sdt = x.g.desc.dtype;
    struct Out {
      const char* name;
      HostTensor dev, ref, nv;
      int32_t dtype;
    };
    auto shape_q = std::vector<int64_t>{x.B, x.T, x.H, x.K}, shape_v = std::vector<int64_t>{x.B, x.T, x.HV, x.V},
         shape_g = std::vector<int64_t>{x.B, x.T, x.HV}, shape_s = std::vector<int64_t>{x.N, x.HV, x.K, x.V};
    std::vector<Out> outs;
    auto add = [&](const char* name, int32_t dtype, const std::vector<int64_t>& shape) {
      outs.push_back({name, HostTensor::make(dtype, shape, x.layout), HostTensor::make(STRATA_DTYPE_F64, shape),
                      HostTensor::make(dtype, shape), dtype});
      outs.back().dev.poison();
    };
    add("dq", x.dt, shape_q);
    add("dk", x.dt, shape_q);
    add("dv", x.dt, shape_v);
    add("dg", sdt, shape_g);
    add("dbeta", x.dt, shape_g);
    if (x.has_h0) add("dh0", sdt, shape_s);
    auto dq = upload(&x.q, device), dk = upload(&x.k, device), dv = upload(&x.v, device), dg = upload(&x.g, device),
         db = upload(&x.beta, device), dh0 = upload(x.has_h0 ? &x.h0 : nullptr, device),
         dcu = upload(x.cu.empty() ? nullptr : &x.cu_t, device), ddo = upload(&x.d_o, device),
         ddht = upload(x.has_dht ? &x.dht : nullptr, device);
    std::vector<std::unique_ptr<DeviceTensor>> od;
    for (auto& o : outs) od.push_back(upload(&o.dev, device));
    while (od.size() < 6) od.push_back(nullptr);
    const auto saved = saved_buffer(x, dq, dk, dv, dcu);
    auto make_plan = [&](strata_plan* out) {
      return strata_chunk_gated_delta_rule_bwd_plan(dsc(dq), dsc(dk), dsc(dv), dsc(dg), dsc(db), dsc(dh0), dsc(dcu),
                                                    dsc(ddo), dsc(ddht), dsc(od[0]), dsc(od[1]), dsc(od[2]),
                                                    dsc(od[3]), dsc(od[4]), dsc(od[5]), dsc(saved), x.scale,
                                                    x.l2 ? 1 : 0, out);
    };
    strata_plan plan = plan_case(x, true, device, make_plan,
                                 {{&dq, &x.q}, {&dk, &x.k}, {&dv, &x.v}, {&dg, &x.g}, {&db, &x.beta}, {&dh0, &x.h0},
                                  {&ddo, &x.d_o}, {&ddht, &x.dht}},
                                 r);
    if (!plan) return r;
    GdnParams p = x.params();
    auto bind = [&](int which) {
      HostTensor* o[6] = {};
      for (size_t i = 0; i < outs.size(); ++i) o[i] = which == 0 ? &outs[i].ref : &outs[i].nv;
      p.dq = host_ref(o[0]);
      p.dk = host_ref(o[1]);
      p.dv = host_ref(o[2]);
      p.dg = host_ref(o[3]);
      p.dbeta = host_ref(o[4]);
      p.dh0 = host_ref(o[5]);
    };
    bind(0);
    std::vector<uint8_t> rws(linear_attn::gdn_recurrent_bwd_workspace<double>(p));
    linear_attn::gdn_recurrent_bwd<double>(p, rws.data());
    bind(1);
    if (x.dt == STRATA_DTYPE_F64) {
      linear_attn::gdn_recurrent_bwd<double>(p, rws.data());
    } else {
      std::vector<uint8_t> fws(linear_attn::gdn_recurrent_bwd_workspace<float>(p));
      linear_attn::gdn_recurrent_bwd<float>(p, fws.data());
    }
    // saved=1: the forward (o only) fills the buffer first (the backward's plan, made above, holds no data); for a
    // large case the dispatcher's pick, as in training (the forced implementation's otherwise).
    if (saved) {
      try {
        const auto d_out = upload(&x.d_o, device);  // o: do's shape and dtype
        strata_plan fplan = nullptr;
        auto make_fplan = [&] {
          return strata_chunk_gated_delta_rule_fwd_plan(dsc(dq), dsc(dk), dsc(dv), dsc(dg), dsc(db), dsc(dh0),
                                                        dsc(dcu), dsc(d_out), nullptr, dsc(saved), x.scale,
                                                        x.l2 ? 1 : 0, &fplan);
        };
        check(x.large ? unforced(make_fplan) : make_fplan(), "forward plan");
        check(run_plan(fplan, {ptr(dq), ptr(dk), ptr(dv), ptr(dg), ptr(db), ptr(dh0), ptr(dcu), ptr(d_out), nullptr,
                               ptr(saved)},
                       device),
              "forward run");
      } catch (...) {
        strata_plan_destroy(plan);
        throw;
      }
    }
    check(run_plan(plan, {ptr(dq), ptr(dk), ptr(dv), ptr(dg), ptr(db), ptr(dh0), ptr(dcu), ptr(ddo), ptr(ddht),
                          ptr(od[0]), ptr(od[1]), ptr(od[2]), ptr(od[3]), ptr(od[4]), ptr(od[5]), ptr(saved)},
                   device),
          "run");
    r.pass = true;
    const std::vector<double> dg_mag = dg_magnitude(x, outs[2].ref, outs[4].ref);
    for (size_t i = 0; i < outs.size(); ++i) {
      od[i]->download(outs[i].dev);
      const bool is_dg = i == 3;
      r.compares.push_back(compare(outs[i].name, outs[i].dev.values(), outs[i].ref.values(), outs[i].nv.values(),
                                   judged(outs[i].dtype, x.dt, device),
                                   static_cast<double>(is_dg ? linear_attn::kGdnChunk : x.K),
                                   is_dg ? &dg_mag : nullptr));
      r.pass = r.pass && r.compares.back().pass;
    }
    return r;
  }

  // The gate gradient is formed by cancellation: in the chunked form dg_t is the in-chunk suffix sum of
  // per-position terms (q.dq - k.dk + ... of Appendix A) whose diagonal parts, about |do_u| |o_u|, cancel
  // exactly (with strong decay dg is ~0 while each term is O(1)). Its errors are therefore measured against
  // the size of the summed terms (atk::compare's `magnitude`): for token t of a chunk [s, e),
  //   sum over u in [t, e) of |do_u| |o_u| + |v_u| |dv_u| + |beta_u dbeta_u|   (norms over the V elements),
  // with o from the float64 forward.
  static std::vector<double> dg_magnitude(GdnCase& x, const HostTensor& dv_ref, const HostTensor& dbeta_ref) {
    HostTensor o_ref = HostTensor::make(STRATA_DTYPE_F64, {x.B, x.T, x.HV, x.V});
    GdnParams p = x.params();
    p.o = host_ref(&o_ref);
    linear_attn::gdn_recurrent_fwd<double>(p);
    const std::vector<double> o = o_ref.values(), d_o = x.d_o.values(), v = x.v.values(), dv = dv_ref.values(),
                              beta = x.beta.values(), db = dbeta_ref.values();
    std::vector<double> mag(static_cast<size_t>(x.B * x.T * x.HV), 0.0);
    auto norm = [&](const std::vector<double>& a, int64_t i0) {
      double s = 0;
      for (int64_t j = 0; j < x.V; ++j) s += a[static_cast<size_t>(i0 + j)] * a[static_cast<size_t>(i0 + j)];
      return std::sqrt(s);
    };
    auto seq = [&](int64_t b, int64_t bos, int64_t eos) {
      for (int64_t cs = bos; cs < eos; cs += linear_attn::kGdnChunk) {
        const int64_t ce = std::min(cs + linear_attn::kGdnChunk, eos);
        for (int64_t hv = 0; hv < x.HV; ++hv) {
          double acc = 0;
          for (int64_t t = ce - 1; t >= cs; --t) {
            const int64_t e = (b * x.T + t) * x.HV + hv, ev = e * x.V;
            acc += norm(d_o, ev) * norm(o, ev) + norm(v, ev) * norm(dv, ev) +
                   std::fabs(beta[static_cast<size_t>(e)] * db[static_cast<size_t>(e)]);
            mag[static_cast<size_t>(e)] = acc;
          }
        }
      }
    };
    if (x.cu.empty()) {
      for (int64_t b = 0; b < x.B; ++b) seq(b, 0, x.T);
    } else {
      for (size_t n = 0; n + 1 < x.cu.size(); ++n) seq(0, x.cu[n], x.cu[n + 1]);
    }
    return mag;
  }
};

// Benchmarks (PERF_TARGETS / the issue): H200 B=4 T=8192 H=16 HV=32 K=V=128 bf16; B=1 T=32768 H=16; 256
// documents of random lengths summing to 32768 vs equal lengths; CPU f32 T=4096 H=4 HV=8 K=V=128.
// FLOPs are those of the chunked algorithm the CPU path runs, per 64-token chunk C and value head with K = V = D:
// forward 10 C^2 D + 6 C D^2; backward 26 C^2 D + 16 C D^2 + 4 C^3 (the state pass 6 C^2 D + 4 C D^2, the
// reverse sweep 20 C^2 D + 12 C D^2 + 4 C^3; bench/gdn_peers.py counts the same).
std::vector<BenchCase> GdnHarness::bench_cases(strata_device device) const {
  struct Shape {
    int64_t B, T, H, HV, D;
    int32_t dt;
    int64_t docs;  // 0: fixed length; n: n documents (random lengths when > 0, equal lengths when < 0)
  };
  std::vector<Shape> shapes;
  if (device.type == STRATA_DEVICE_CUDA) {
    shapes = {{4, 8192, 16, 32, 128, STRATA_DTYPE_BF16, 0},
              {1, 32768, 16, 32, 128, STRATA_DTYPE_BF16, 0},
              {1, 32768, 16, 32, 128, STRATA_DTYPE_BF16, 256},
              {1, 32768, 16, 32, 128, STRATA_DTYPE_BF16, -256}};
  } else {
    shapes = {{1, 4096, 4, 8, 128, STRATA_DTYPE_F32, 0}, {1, 4096, 4, 8, 128, STRATA_DTYPE_F32, 16}};
  }
  std::vector<BenchCase> out;
  for (const Shape& s : shapes) {
    std::vector<int64_t> cu;
    if (s.docs != 0) {
      const int64_t n = std::abs(s.docs);
      cu.push_back(0);
      std::mt19937_64 rng(11);
      std::vector<int64_t> cuts;
      if (s.docs > 0) {
        std::uniform_int_distribution<int64_t> U(1, s.T - 1);
        while (static_cast<int64_t>(cuts.size()) < n - 1) cuts.push_back(U(rng));
        std::sort(cuts.begin(), cuts.end());
      } else {
        for (int64_t i = 1; i < n; ++i) cuts.push_back(i * s.T / n);
      }
      for (int64_t c : cuts) cu.push_back(c);
      cu.push_back(s.T);
    }
    const double D = static_cast<double>(s.D), BTc = 64.0;
    const double chunks = static_cast<double>(s.B) * (static_cast<double>(s.T) / BTc + (cu.empty() ? 0 : std::abs(s.docs)));
    const double fwd_flops = chunks * static_cast<double>(s.HV) * (10 * BTc * BTc * D + 6 * BTc * D * D);
    const double bwd_flops =
        chunks * static_cast<double>(s.HV) * (26 * BTc * BTc * D + 16 * BTc * D * D + 4 * BTc * BTc * BTc);
    const double esz = static_cast<double>(dtype_size(s.dt));
    const double io = static_cast<double>(s.B * s.T) * (2.0 * s.H * s.D + 2.0 * s.HV * s.D + 2.0 * s.HV) * esz;
    BenchCase b;
    b.label = fmt::format("{} {} B={} T={} H={} HV={} K=V={}{}", op(), dtype_name(s.dt), s.B, s.T, s.H, s.HV, s.D,
                          s.docs > 0 ? fmt::format(" varlen {} random docs", s.docs)
                                     : (s.docs < 0 ? fmt::format(" varlen {} equal docs", -s.docs) : ""));
    b.flops = bwd_ ? bwd_flops : fwd_flops;
    b.bytes = bwd_ ? 2.0 * io : io;
    struct State {
      std::vector<std::unique_ptr<DeviceTensor>> t;
      strata_plan plan = nullptr;
      void* ws = nullptr;
      size_t ws_size = 0;
      std::vector<void*> ptrs;
    };
    auto st = std::make_shared<State>();
    const bool bwd = bwd_;
    b.setup = [=, this] {
      Case c(op());
      c.set("dtype", dtype_name(s.dt)).set("shape", shape_arg({s.B, s.T, s.H, s.HV, s.D, s.D})).set("cu", cu_arg(cu));
      c.set("h0", 0).set("ht", 1).set("dht", 0).set("l2", 1).set("seed", 5).set("fast_fill", 1);
      GdnCase x(c);
      HostTensor o = HostTensor::make(s.dt, {s.B, s.T, s.HV, s.D});
      HostTensor ht = HostTensor::make(STRATA_DTYPE_F32, {x.N, s.HV, s.D, s.D});
      auto up = [&](const HostTensor* h) {
        st->t.push_back(upload(h, device));
        return st->t.back().get();
      };
      DeviceTensor *q = up(&x.q), *k = up(&x.k), *v = up(&x.v), *g = up(&x.g), *be = up(&x.beta);
      DeviceTensor* cut = cu.empty() ? nullptr : up(&x.cu_t);
      const strata_tensor_desc* cud = cut ? &cut->desc() : nullptr;
      void* cup = cut ? cut->data() : nullptr;
      const float scale = 1.f / std::sqrt(static_cast<float>(s.D));
      if (!bwd) {
        DeviceTensor *od = up(&o), *hd = up(&ht);
        check(strata_chunk_gated_delta_rule_fwd_plan(&q->desc(), &k->desc(), &v->desc(), &g->desc(), &be->desc(),
                                                     nullptr, cud, &od->desc(), &hd->desc(), nullptr, scale, 1,
                                                     &st->plan),
              "bench plan");
        st->ptrs = {q->data(), k->data(), v->data(), g->data(), be->data(), nullptr, cup, od->data(), hd->data(),
                    nullptr};
      } else {
        DeviceTensor *dd = up(&x.d_o), *dqd = up(&x.q), *dkd = up(&x.k), *dvd = up(&x.v), *dgd = up(&x.g),
                     *dbd = up(&x.beta);
        check(strata_chunk_gated_delta_rule_bwd_plan(&q->desc(), &k->desc(), &v->desc(), &g->desc(), &be->desc(),
                                                     nullptr, cud, &dd->desc(), nullptr, &dqd->desc(), &dkd->desc(),
                                                     &dvd->desc(), &dgd->desc(), &dbd->desc(), nullptr, nullptr, scale,
                                                     1, &st->plan),
              "bench plan");
        st->ptrs = {q->data(),   k->data(),   v->data(),   g->data(),   be->data(),  nullptr,    cup,    dd->data(),
                    nullptr,     dqd->data(), dkd->data(), dvd->data(), dgd->data(), dbd->data(), nullptr, nullptr};
      }
      strata_plan_workspace_size(st->plan, &st->ws_size);
      if (st->ws_size) check(strata_malloc(device, st->ws_size, nullptr, &st->ws), "bench workspace");
    };
    b.run = [st] {
      check(strata_plan_run(st->plan, st->ptrs.data(), static_cast<int32_t>(st->ptrs.size()), st->ws, st->ws_size,
                            nullptr),
            "bench run");
    };
    b.teardown = [st] {
      strata_plan_destroy(st->plan);
      if (st->ws) strata_free(st->ws);
      st->t.clear();
    };
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

std::unique_ptr<OpHarness> make_chunk_gated_delta_rule_fwd_harness() { return std::make_unique<GdnHarness>(false); }
std::unique_ptr<OpHarness> make_chunk_gated_delta_rule_bwd_harness() { return std::make_unique<GdnHarness>(true); }

}  // namespace strata::atk
