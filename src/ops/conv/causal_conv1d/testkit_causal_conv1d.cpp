// ATK harnesses of causal_conv1d_fwd and causal_conv1d_bwd: conformance cases, the float64 comparison,
// benchmark cases.
//
// A case line: "causal_conv1d_fwd dtype=bf16 wdtype=f32 sdtype=f32 shape=2x65x67 W=4 act=1 bias=1 res=1 h0=1
// hT=1 cu=none seq=none wl=0 layout=padded seed=7". shape is [B, T, D]; cu is "none" or the cu_seqlens values
// joined by '-' (then B = 1); seq is "none" or a pattern name (seq_ids() below); wl is the weight layout
// (0 [D, W], 1 [W, D]). Layouts of the activation tensors (x, y, residual, dy, dx):
//   contiguous  row-major;
//   padded      atk::Layout::kPaddedRows (every dimension padded, offset 5: unit channel stride);
//   strided     atk::Layout::kStridedCols (channel stride 2: the element-wise paths);
//   tpad        token stride D + 8, batch padding, offset 4: the vector paths on a slice of a wider tensor;
//   chfirst     stored [B, D, T] (Dao-AILab's channel-first x) and viewed as [B, T, D]; outputs contiguous.
// Expected values: the float64 reference (reference.cpp) on the rounded inputs; the "naive" result is the
// same reference rounded once to each output's dtype (the best a same-dtype implementation can do), and
// every reduction output (dweight, dbias, dinitial_state) gets the roundoff floor of its length.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ops/conv/causal_conv1d/causal_conv1d.h"
#include "testkit/testkit.h"

namespace strata::atk {
namespace {

using conv::Conv1dParams;

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  if (s.empty() || s == "none") return v;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-')) v.push_back(std::stoll(part));
  return v;
}
std::string list_arg(const std::vector<int64_t>& v) { return v.empty() ? "none" : fmt::format("{}", fmt::join(v, "-")); }

// seq_idx patterns over [B, T]: "blocks" (ids 0, 1, 2, ... in runs of 1, 2, 3, ... tokens), "pad" (two
// sequences then trailing padding -1), "one" (all 0).
std::vector<int64_t> seq_ids(const std::string& pattern, int64_t B, int64_t T) {
  std::vector<int64_t> v(static_cast<size_t>(B * T), 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t id = b, run = 1, left = 1 + b;
    for (int64_t t = 0; t < T; ++t) {
      int64_t& e = v[static_cast<size_t>(b * T + t)];
      if (pattern == "blocks") {
        e = id;
        if (--left == 0) ++id, left = ++run;
      } else if (pattern == "pad") {
        e = t < T / 3 ? 0 : (t < 3 * T / 4 ? 1 : -1);
      }
    }
  }
  return v;
}

HostTensor make_view(int32_t dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                     int64_t offset) {
  HostTensor t;
  t.desc.dtype = dtype;
  t.desc.rank = static_cast<int32_t>(shape.size());
  t.desc.device = {STRATA_DEVICE_CPU, 0};
  t.desc.offset = offset;
  int64_t span = offset + 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    t.desc.shape[i] = shape[i];
    t.desc.strides[i] = strides[i];
    if (shape[i] == 0) span = 0;
    if (span) span += (shape[i] - 1) * strides[i];
  }
  if (span == 0) span = offset + 1;
  t.storage.assign(static_cast<size_t>(span) * dtype_size(dtype), 0);
  return t;
}

// An activation tensor [B, T, D] in the case's layout (chfirst applies to inputs only).
HostTensor make_act(int32_t dtype, const std::vector<int64_t>& shape, const std::string& layout, bool input) {
  const int64_t B = shape[0], T = shape[1], D = shape[2];
  if (layout == "tpad") return make_view(dtype, shape, {T * (D + 8) + 4, D + 8, 1}, 4);
  if (layout == "chfirst" && input) return make_view(dtype, shape, {D * T, 1, T}, 0);
  if (layout == "padded" || layout == "strided") return HostTensor::make(dtype, shape, layout_from_name(layout));
  return HostTensor::make(dtype, shape);
}

HostTensor make_ints(int32_t dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& v) {
  HostTensor t = HostTensor::make(dtype, shape);
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(v[i]));
  return t;
}

// Contiguous f64 copy of a host tensor's values (the reference's inputs).
struct F64 {
  std::vector<double> v;
  std::vector<int64_t> shape;
  explicit F64(const HostTensor& h) : v(h.values()), shape(shape_of(h.desc)) {}
  F64(std::vector<int64_t> s) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    v.assign(static_cast<size_t>(n), 0.0);
  }
  void strides(int64_t* st) const {
    int64_t s = 1;
    for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) st[i] = s, s *= std::max<int64_t>(shape[i], 1);
  }
};

// Everything one case needs: parsed attributes, host inputs (rounded to their dtypes), outputs.
struct Problem {
  int32_t dt, wdt, sdt;
  std::vector<int64_t> shape, cu;
  std::string seq_pattern, layout;
  int64_t B, T, D, W, N;
  int act, wl;
  bool has_bias, has_res, has_h0, has_hT, has_dhT, has_dh0;
  std::vector<int64_t> seq;

  explicit Problem(const Case& c) {
    dt = dtype_from_name(c.get("dtype"));
    wdt = dtype_from_name(c.get("wdtype", "f32"));
    sdt = dtype_from_name(c.get("sdtype", "f32"));
    shape = c.get_shape("shape");
    cu = parse_list(c.get("cu"));
    seq_pattern = c.get("seq", "none");
    layout = c.get("layout", "contiguous");
    B = shape[0], T = shape[1], D = shape[2];
    W = c.get_int("W", 4);
    act = static_cast<int>(c.get_int("act", 1));
    wl = static_cast<int>(c.get_int("wl", 0));
    has_bias = c.get_int("bias", 1) != 0;
    has_res = c.get_int("res", 0) != 0;
    has_h0 = c.get_int("h0", 0) != 0;
    has_hT = c.get_int("hT", 0) != 0;
    has_dhT = c.get_int("dhT", 0) != 0;
    has_dh0 = c.get_int("dh0", 0) != 0 && has_h0;
    N = cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1;
    if (seq_pattern != "none") seq = seq_ids(seq_pattern, B, T);
  }
  std::vector<int64_t> wshape() const { return wl == 0 ? std::vector<int64_t>{D, W} : std::vector<int64_t>{W, D}; }
  std::vector<int64_t> sshape() const { return {N, D, W - 1}; }

  // f64 params over contiguous f64 arrays (weight always as [D, W]).
  Conv1dParams ref_params(const F64& x, const F64& w, const F64* bias, const F64* res, const F64* h0,
                          const HostTensor* cu_t, const HostTensor* seq_t) const {
    Conv1dParams p;
    p.B = B, p.T = T, p.D = D, p.W = W, p.N = N;
    p.x_dtype = p.w_dtype = p.b_dtype = p.h0_dtype = p.hT_dtype = p.dhT_dtype = p.dh0_dtype = STRATA_DTYPE_F64;
    p.activation = act;
    p.x = x.v.data();
    x.strides(p.xs);
    std::copy(p.xs, p.xs + 3, p.ys);
    std::copy(p.xs, p.xs + 3, p.rs);
    std::copy(p.xs, p.xs + 3, p.dys);
    std::copy(p.xs, p.xs + 3, p.dxs);
    p.weight = w.v.data();
    p.ws[0] = p.dws[0] = W, p.ws[1] = p.dws[1] = 1;
    p.bias = bias ? bias->v.data() : nullptr;
    p.bs = p.dbs = 1;
    p.residual = res ? res->v.data() : nullptr;
    p.h0 = h0 ? h0->v.data() : nullptr;
    F64 st(sshape());
    st.strides(p.h0s);
    std::copy(p.h0s, p.h0s + 3, p.hTs);
    std::copy(p.h0s, p.h0s + 3, p.dhTs);
    std::copy(p.h0s, p.h0s + 3, p.dh0s);
    p.mode = cu_t ? conv::kModeCuSeqlens : (seq_t ? conv::kModeSeqIdx : conv::kModeRows);
    if (cu_t) p.cu_seqlens = cu_t->storage.data(), p.cu_dtype = STRATA_DTYPE_I64, p.cus = 1;
    if (seq_t) p.seq_idx = seq_t->storage.data(), p.seq_dtype = STRATA_DTYPE_I32, p.seqs[0] = T, p.seqs[1] = 1;
    return p;
  }
};

// Weight [D, W] values of a weight tensor in either layout.
F64 weight_dw(const Problem& pb, const HostTensor& w) {
  F64 out(std::vector<int64_t>{pb.D, pb.W});
  const std::vector<double> v = w.values();
  for (int64_t d = 0; d < pb.D; ++d)
    for (int64_t k = 0; k < pb.W; ++k)
      out.v[static_cast<size_t>(d * pb.W + k)] = v[static_cast<size_t>(pb.wl == 0 ? d * pb.W + k : k * pb.D + d)];
  return out;
}

std::vector<double> rounded(const std::vector<double>& v, int32_t dtype) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(dtype, v[i]);
  return r;
}

// Common inputs of both directions.
struct Inputs {
  HostTensor x, w, bias, res, h0, cu, seq;
  Inputs(const Problem& pb, std::mt19937_64& rng) {
    x = make_act(pb.dt, pb.shape, pb.layout, true);
    x.fill_normal(rng, 0.0, 1.0);
    w = HostTensor::make(pb.wdt, pb.wshape());
    w.fill_uniform(rng, -0.8, 0.8);
    if (pb.has_bias) {
      bias = HostTensor::make(pb.wdt, {pb.D});
      bias.fill_uniform(rng, -0.5, 0.5);
    }
    if (pb.has_res) {
      res = make_act(pb.dt, pb.shape, pb.layout, true);
      res.fill_normal(rng, 0.0, 1.0);
    }
    if (pb.has_h0) {
      h0 = HostTensor::make(pb.sdt, pb.sshape());
      h0.fill_normal(rng, 0.0, 1.0);
    }
    if (!pb.cu.empty()) cu = make_ints(STRATA_DTYPE_I64, {static_cast<int64_t>(pb.cu.size())}, pb.cu);
    if (!pb.seq.empty()) seq = make_ints(STRATA_DTYPE_I32, {pb.B, pb.T}, pb.seq);
  }
};

template <class T>
const strata_tensor_desc* desc_or_null(const std::unique_ptr<T>& t) {
  return t ? &t->desc() : nullptr;
}
template <class T>
void* data_or_null(const std::unique_ptr<T>& t) {
  return t ? t->data() : nullptr;
}
std::unique_ptr<DeviceTensor> upload(bool present, const HostTensor& h, strata_device device) {
  return present ? std::make_unique<DeviceTensor>(h, device) : nullptr;
}

bool f64_on_gpu(const Problem& pb, strata_device device) {
  return device.type != STRATA_DEVICE_CPU &&
         (pb.dt == STRATA_DTYPE_F64 || pb.wdt == STRATA_DTYPE_F64 || pb.sdt == STRATA_DTYPE_F64);
}

// A case marked gpu_only (spec-size channels, make_cases) on the CPU: skipped with its reason (true).
bool gpu_only_on_cpu(const Case& c, strata_device device, CaseResult& r) {
  if (c.get_int("gpu_only", 0) == 0 || device.type != STRATA_DEVICE_CPU) return false;
  r.skipped = true;
  r.message = "a CUDA-only case (spec-size D: the CPU paths are covered by the D <= 2048 ones)";
  return true;
}

// Workspace of a plan on `device` (freed with the returned holder).
struct Workspace {
  void* ptr = nullptr;
  size_t size = 0;
  strata_device device{};
  Workspace(strata_plan plan, strata_device d) : device(d) {
    check(strata_plan_workspace_size(plan, &size), "workspace size");
    if (size) check(strata_malloc(device, size, nullptr, &ptr), "workspace malloc");
  }
  ~Workspace() {
    if (ptr) strata_free(ptr);
  }
};

// Conformance cases shared by both directions; `bwd` adds the gradient flags.
std::vector<Case> make_cases(const char* op, bool bwd) {
  std::vector<Case> cases;
  int64_t seed = 1;
  auto add = [&](const char* dt, const char* wdt, const std::vector<int64_t>& shape, int64_t W, int act, int bias,
                 int res, int h0, int hT, const std::vector<int64_t>& cu, const char* seq, int wl,
                 const char* layout, const char* sdt = "f32") {
    Case c(op);
    c.set("dtype", dt).set("wdtype", wdt).set("sdtype", sdt).set("shape", shape_arg(shape)).set("W", W);
    c.set("act", act).set("bias", bias);
    if (!bwd) c.set("res", res).set("h0", h0).set("hT", hT);
    else c.set("h0", h0).set("dhT", hT).set("dh0", h0);
    c.set("cu", list_arg(cu)).set("seq", seq).set("wl", wl).set("layout", layout).set("seed", seed++);
    cases.push_back(c);
  };
  const char* layouts[] = {"contiguous", "padded", "tpad", "strided", "chfirst"};
  int rot = 0;
  // Every dtype x the bug-catching lengths x widths; features rotate so their combinations are met.
  for (const char* dt : {"f32", "bf16", "f16", "f64"})
    for (int64_t T : {1, 2, 63, 65, 97, 1025})
      for (int64_t W : {2, 3, 4, 5}) {
        const int64_t D = rot % 3 == 0 ? 67 : (rot % 3 == 1 ? 64 : 36);
        const char* wdt = std::string(dt) == "f64" ? "f64" : (rot % 4 == 3 ? dt : "f32");
        add(dt, wdt, {2, T, D}, W, rot % 5 != 4, rot % 3 != 2, rot % 2, (rot / 2) % 2, (rot / 3) % 2 == 0, {}, "none",
            rot % 7 == 6, layouts[rot % 5], std::string(dt) == "f64" ? "f64" : (rot % 2 ? "f32" : dt));
        ++rot;
      }
  // Widths beyond the unrolled ones, T < W - 1 with an initial state (the final state keeps its tail).
  for (int64_t W : {6, 8, 16}) add("f32", "f32", {2, 40, 20}, W, 1, 1, 1, 1, 1, {}, "none", 0, "contiguous");
  add("bf16", "f32", {3, 2, 40}, 4, 1, 1, 0, 1, 1, {}, "none", 0, "contiguous");
  add("f32", "f32", {2, 1, 9}, 5, 1, 0, 1, 1, 1, {}, "none", 1, "padded");
  // Variable-length packs: empty sequences (leading, inner, trailing), single tokens, sequences shorter than
  // W - 1, starts misaligned with the time tiles; with and without initial states.
  const std::vector<std::vector<int64_t>> packs = {{0, 0, 1, 3, 3, 40, 41, 100},
                                                   {0, 5},
                                                   {0, 2, 2, 70, 130, 200},
                                                   {0, 64, 128, 129, 300, 300},
                                                   {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}};
  for (const auto& cu : packs)
    for (int h0 : {0, 1})
      for (const char* dt : {"f32", "bf16"}) {
        add(dt, "f32", {1, cu.back(), rot % 2 ? 36 : 19}, rot % 3 + 2, 1, 1, rot % 2, h0, 1, cu, "none", rot % 2,
            layouts[rot % 5]);
        ++rot;
      }
  add("f16", "f16", {1, 100, 12}, 5, 0, 1, 1, 1, 1, {0, 0, 1, 3, 3, 40, 41, 100}, "none", 0, "contiguous", "f16");
  add("f64", "f64", {1, 100, 7}, 3, 1, 1, 1, 1, 1, {0, 0, 1, 3, 3, 40, 41, 100}, "none", 0, "contiguous", "f64");
  // seq_idx: sequence changes inside rows, padding tokens, initial state of the first sequence.
  for (const char* pattern : {"blocks", "pad", "one"})
    for (int h0 : {0, 1}) {
      add(rot % 2 ? "bf16" : "f32", "f32", {2, 90, 20}, rot % 3 + 2, 1, 1, rot % 2, h0, 1, {}, pattern, 0,
          layouts[rot % 5]);
      ++rot;
    }
  add("f64", "f64", {2, 33, 5}, 4, 1, 1, 1, 1, 1, {}, "blocks", 1, "contiguous", "f64");
  add("f32", "f32", {2, 70, 9}, 7, 1, 1, 1, 1, 1, {}, "pad", 0, "strided");
  // Long rows (several tiles and chunks) on the vector paths.
  add("bf16", "f32", {2, 300, 1100}, 4, 1, 1, 1, 1, 1, {}, "none", 0, "contiguous", "bf16");
  add("f32", "f32", {1, 520, 600}, 3, 0, 1, 0, 1, 1, {0, 100, 101, 333, 520}, "none", 1, "tpad");
  // The cuda.sm90.vec kernels (rows, W <= 4, D % 8 == 0): several time tiles and channel blocks, with and
  // without residual / states / bias, each dtype and width.
  add("bf16", "f32", {2, 300, 1024}, 4, 1, 1, 1, 1, 1, {}, "none", 0, "contiguous", "f32");
  add("f16", "f16", {3, 200, 264}, 2, 1, 0, 0, 1, 1, {}, "none", 1, "padded", "f16");
  add("f32", "f32", {2, 150, 520}, 3, 0, 1, 1, 0, 1, {}, "none", 0, "contiguous");
  add("bf16", "bf16", {1, 129, 136}, 3, 1, 1, 0, 0, 0, {}, "none", 0, "tpad", "bf16");
  // ... and with cu_seqlens packs (empty and 1-token sequences, sequences shorter than W - 1, starts inside
  // and across the 64 / 128-token tiles).
  add("bf16", "f32", {1, 300, 64}, 4, 1, 1, 1, 1, 1, {0, 0, 1, 3, 3, 40, 41, 100, 230, 300}, "none", 0,
      "contiguous");
  add("f32", "f32", {1, 200, 128}, 2, 1, 0, 0, 1, 1, {0, 2, 2, 70, 130, 200}, "none", 1, "contiguous");
  add("f16", "f16", {1, 260, 72}, 3, 0, 1, 1, 0, 1, {0, 64, 128, 129, 260}, "none", 0, "contiguous", "f16");
  add("bf16", "f32", {1, 11, 16}, 4, 1, 1, 0, 1, 1, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, "none", 0,
      "contiguous");
  // Outputs of 4 MiB and more: the CPU's non-temporal stores (rows of 1100 bf16: only some 32-byte aligned).
  add("bf16", "f32", {1, 2000, 1100}, 4, 1, 1, 1, 1, 1, {}, "none", 0, "contiguous", "bf16");
  // ... with 64-byte aligned rows: the CPU column sweeps' whole-line streamed y / dx (L1 line buffers), first and
  // last tiles (short) on the split sweeps' column path, with and without the final state's gradient.
  add("bf16", "f32", {1, 1030, 2048}, 4, 1, 1, 1, 1, 0, {}, "none", 0, "contiguous", "bf16");
  add("f16", "f32", {2, 520, 2048}, 3, 1, 0, 0, 0, 1, {}, "none", 1, "contiguous");
  // CUDA only, the spec's channel count (ops_fused.md: D = 8192, Qwen3-Next's conv over q, k, v) in float64:
  // bf16 [1, 600, 8192] W = 4 SiLU with a 4-document pack (one 1-token document, starts off the time tiles),
  // initial and final states; and D = 5376 in fixed-length rows.
  add("bf16", "f32", {1, 600, 8192}, 4, 1, 1, 0, 1, 1, {0, 100, 250, 251, 600}, "none", 0, "contiguous", "bf16");
  cases.back().set("gpu_only", 1);
  add("bf16", "bf16", {2, 300, 5376}, 4, 1, 1, 1, 0, 1, {}, "none", 0, "contiguous", "bf16");
  cases.back().set("gpu_only", 1);
  // Empty tensors: no tokens (final state = initial state), no channels, no batch, empty packs.
  add("f32", "f32", {2, 0, 5}, 4, 1, 1, 1, 1, 1, {}, "none", 0, "contiguous");
  add("bf16", "f32", {2, 0, 5}, 4, 1, 1, 0, 0, 1, {}, "none", 0, "contiguous");
  add("f32", "f32", {2, 7, 0}, 4, 1, 1, 1, 1, 1, {}, "none", 0, "contiguous");
  add("f32", "f32", {0, 7, 5}, 3, 1, 1, 1, 1, 1, {}, "none", 0, "contiguous");
  add("f32", "f32", {1, 0, 4}, 4, 1, 1, 0, 1, 1, {0}, "none", 0, "contiguous");
  add("f32", "f32", {1, 0, 4}, 4, 1, 1, 0, 1, 1, {0, 0, 0}, "none", 0, "contiguous");
  return cases;
}

class Conv1dFwdHarness final : public OpHarness {
 public:
  std::string op() const override { return "causal_conv1d_fwd"; }
  std::vector<Case> conformance_cases() const override { return make_cases("causal_conv1d_fwd", false); }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const Problem pb(c);
    CaseResult r;
    if (f64_on_gpu(pb, device)) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    if (gpu_only_on_cpu(c, device, r)) return r;
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));
    Inputs in(pb, rng);
    HostTensor y = make_act(pb.dt, pb.shape, pb.layout, false);
    y.poison();
    HostTensor hT = HostTensor::make(pb.sdt, pb.sshape());
    hT.poison();

    // float64 reference on the rounded inputs.
    const F64 x64(in.x), w64 = weight_dw(pb, in.w);
    std::unique_ptr<F64> b64, r64, h64;
    if (pb.has_bias) b64 = std::make_unique<F64>(in.bias);
    if (pb.has_res) r64 = std::make_unique<F64>(in.res);
    if (pb.has_h0) h64 = std::make_unique<F64>(in.h0);
    F64 y64(pb.shape), hT64(pb.sshape());
    Conv1dParams rp = pb.ref_params(x64, w64, b64.get(), r64.get(), h64.get(), pb.cu.empty() ? nullptr : &in.cu,
                                    pb.seq.empty() ? nullptr : &in.seq);
    rp.y = y64.v.data();
    rp.hT = pb.has_hT ? hT64.v.data() : nullptr;
    conv::causal_conv1d_fwd_reference(rp);

    DeviceTensor d_x(in.x, device), d_w(in.w, device), d_y(y, device);
    auto d_b = upload(pb.has_bias, in.bias, device);
    auto d_r = upload(pb.has_res, in.res, device);
    auto d_h0 = upload(pb.has_h0, in.h0, device);
    auto d_hT = upload(pb.has_hT, hT, device);
    auto d_cu = upload(!pb.cu.empty(), in.cu, device);
    auto d_seq = upload(!pb.seq.empty(), in.seq, device);
    strata_plan plan = nullptr;
    check(strata_causal_conv1d_fwd_plan(&d_x.desc(), &d_w.desc(), desc_or_null(d_b), desc_or_null(d_r),
                                        desc_or_null(d_h0), desc_or_null(d_cu), desc_or_null(d_seq), &d_y.desc(),
                                        desc_or_null(d_hT), pb.act, pb.wl, &plan),
          "plan");
    r.impl = strata_plan_impl_name(plan);
    void* t[] = {d_x.data(),        d_w.data(),          data_or_null(d_b), data_or_null(d_r), data_or_null(d_h0),
                 data_or_null(d_cu), data_or_null(d_seq), d_y.data(),        data_or_null(d_hT)};
    strata_status st;
    {
      Workspace ws(plan, device);
      st = strata_plan_run(plan, t, 9, ws.ptr, ws.size, nullptr);
      if (st == STRATA_SUCCESS && device.type == STRATA_DEVICE_CUDA) st = strata_device_synchronize(device);
    }
    strata_plan_destroy(plan);
    check(st, "run");
    d_y.download(y);
    r.compares.push_back(compare("y", y.values(), y64.v, rounded(y64.v, pb.dt), pb.dt, static_cast<double>(pb.W)));
    if (pb.has_hT) {
      d_hT->download(hT);
      r.compares.push_back(compare("final_state", hT.values(), hT64.v, rounded(hT64.v, pb.sdt), pb.sdt));
    }
    r.pass = true;
    for (const Compare& cmp : r.compares) r.pass = r.pass && cmp.pass;
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override;
};

class Conv1dBwdHarness final : public OpHarness {
 public:
  std::string op() const override { return "causal_conv1d_bwd"; }
  std::vector<Case> conformance_cases() const override { return make_cases("causal_conv1d_bwd", true); }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const Problem pb(c);
    CaseResult r;
    if (f64_on_gpu(pb, device)) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    if (gpu_only_on_cpu(c, device, r)) return r;
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));
    Inputs in(pb, rng);
    HostTensor dy = make_act(pb.dt, pb.shape, pb.layout, true);
    dy.fill_normal(rng, 0.0, 1.0);
    HostTensor dhT = HostTensor::make(pb.sdt, pb.sshape());
    if (pb.has_dhT) dhT.fill_normal(rng, 0.0, 1.0);
    HostTensor dx = make_act(pb.dt, pb.shape, pb.layout, false);
    HostTensor dw = HostTensor::make(pb.wdt, pb.wshape());
    HostTensor db = HostTensor::make(pb.wdt, {pb.D});
    HostTensor dh0 = HostTensor::make(pb.sdt, pb.sshape());
    dx.poison();
    dw.poison();
    db.poison();
    dh0.poison();

    const F64 x64(in.x), w64 = weight_dw(pb, in.w), dy64(dy);
    std::unique_ptr<F64> b64, h64, dhT64;
    if (pb.has_bias) b64 = std::make_unique<F64>(in.bias);
    if (pb.has_h0) h64 = std::make_unique<F64>(in.h0);
    if (pb.has_dhT) dhT64 = std::make_unique<F64>(dhT);
    F64 dx64(pb.shape), dw64(std::vector<int64_t>{pb.D, pb.W}), db64(std::vector<int64_t>{pb.D}), dh064(pb.sshape());
    Conv1dParams rp = pb.ref_params(x64, w64, b64.get(), nullptr, h64.get(), pb.cu.empty() ? nullptr : &in.cu,
                                    pb.seq.empty() ? nullptr : &in.seq);
    rp.dy = dy64.v.data();
    rp.dhT = dhT64 ? dhT64->v.data() : nullptr;
    rp.dx = dx64.v.data();
    rp.dw = dw64.v.data();
    rp.db = db64.v.data();
    rp.dh0 = pb.has_dh0 ? dh064.v.data() : nullptr;
    conv::causal_conv1d_bwd_reference(rp);

    DeviceTensor d_x(in.x, device), d_w(in.w, device), d_dy(dy, device), d_dx(dx, device), d_dw(dw, device);
    auto d_b = upload(pb.has_bias, in.bias, device);
    auto d_h0 = upload(pb.has_h0, in.h0, device);
    auto d_cu = upload(!pb.cu.empty(), in.cu, device);
    auto d_seq = upload(!pb.seq.empty(), in.seq, device);
    auto d_dhT = upload(pb.has_dhT, dhT, device);
    auto d_db = upload(true, db, device);
    auto d_dh0 = upload(pb.has_dh0, dh0, device);
    strata_plan plan = nullptr;
    check(strata_causal_conv1d_bwd_plan(&d_x.desc(), &d_w.desc(), desc_or_null(d_b), desc_or_null(d_h0),
                                        desc_or_null(d_cu), desc_or_null(d_seq), &d_dy.desc(), desc_or_null(d_dhT),
                                        &d_dx.desc(), &d_dw.desc(), desc_or_null(d_db), desc_or_null(d_dh0), pb.act,
                                        pb.wl, &plan),
          "plan");
    r.impl = strata_plan_impl_name(plan);
    void* t[] = {d_x.data(),          d_w.data(),         data_or_null(d_b),   data_or_null(d_h0),
                 data_or_null(d_cu),  data_or_null(d_seq), d_dy.data(),        data_or_null(d_dhT),
                 d_dx.data(),         d_dw.data(),        data_or_null(d_db),  data_or_null(d_dh0)};
    strata_status st;
    {
      Workspace ws(plan, device);
      st = strata_plan_run(plan, t, 12, ws.ptr, ws.size, nullptr);
      if (st == STRATA_SUCCESS && device.type == STRATA_DEVICE_CUDA) st = strata_device_synchronize(device);
    }
    strata_plan_destroy(plan);
    check(st, "run");
    d_dx.download(dx);
    d_dw.download(dw);
    d_db->download(db);
    // dweight in the [D, W] order of the reference.
    std::vector<double> dw_dk(static_cast<size_t>(pb.D * pb.W));
    {
      const std::vector<double> v = dw.values();
      for (int64_t d = 0; d < pb.D; ++d)
        for (int64_t k = 0; k < pb.W; ++k)
          dw_dk[static_cast<size_t>(d * pb.W + k)] = v[static_cast<size_t>(pb.wl == 0 ? d * pb.W + k : k * pb.D + d)];
    }
    const double tokens = static_cast<double>(std::max<int64_t>(pb.B * pb.T, 1));
    r.compares.push_back(compare("dx", dx.values(), dx64.v, rounded(dx64.v, pb.dt), pb.dt, 2.0 * pb.W));
    r.compares.push_back(compare("dweight", dw_dk, dw64.v, rounded(dw64.v, pb.wdt), pb.wdt, 2.0 * tokens));
    r.compares.push_back(compare("dbias", db.values(), db64.v, rounded(db64.v, pb.wdt), pb.wdt, 2.0 * tokens));
    if (pb.has_dh0) {
      d_dh0->download(dh0);
      r.compares.push_back(compare("dinitial_state", dh0.values(), dh064.v, rounded(dh064.v, pb.sdt), pb.sdt,
                                   2.0 * pb.W));
    }
    r.pass = true;
    for (const Compare& cmp : r.compares) r.pass = r.pass && cmp.pass;
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override;
};

// ---- benchmarks ----
// PERF_TARGETS shape on CUDA (bf16 B=4 T=8192 D=8192 W=4 SiLU, f32 weights) plus a packed Qwen3-Next-like
// case; on the CPU a 128 MiB x (far beyond the caches) and the same packed case, smaller.
struct BenchShape {
  std::vector<int64_t> shape;
  std::vector<int64_t> cu;
};
std::vector<BenchShape> bench_shapes(strata_device device) {
  const bool cuda = device.type == STRATA_DEVICE_CUDA;
  std::vector<BenchShape> out;
  out.push_back({cuda ? std::vector<int64_t>{4, 8192, 8192} : std::vector<int64_t>{1, 8192, 8192}, {}});
  const int64_t Tp = cuda ? 32768 : 8192;
  out.push_back({{1, Tp, cuda ? 8192 : 4096}, {0, Tp / 16 + 5, Tp / 4 - 3, Tp / 4 + 1, Tp / 2 + 17, 7 * Tp / 8, Tp}});
  return out;
}

// Several copies of the activations rotate so that a timed run never finds its inputs in the caches.
constexpr double kRotateBytes = 512.0 * 1024 * 1024;

struct BenchState {
  std::vector<std::unique_ptr<DeviceTensor>> x, y, dy;
  std::unique_ptr<DeviceTensor> w, b, cu, dw, db;
  strata_plan plan = nullptr;
  void* ws = nullptr;
  size_t ws_size = 0;
  size_t next = 0;
};

// impl: forced implementation for the plan ("": the dispatcher's choice).
BenchCase make_bench(strata_device device, const BenchShape& bs, bool bwd, const std::string& impl = "") {
  const int32_t dt = STRATA_DTYPE_BF16;
  const int64_t W = 4;
  auto state = std::make_shared<BenchState>();
  int64_t n = 1;
  for (int64_t s : bs.shape) n *= s;
  const double act_bytes = static_cast<double>(n) * static_cast<double>(dtype_size(dt));
  const int64_t D = bs.shape[2];
  BenchCase b;
  b.label = fmt::format("causal_conv1d_{} bf16 [{}] W=4 silu{}", bwd ? "bwd" : "fwd", fmt::join(bs.shape, ", "),
                        bs.cu.empty() ? "" : fmt::format(" varlen N={}", bs.cu.size() - 1)) +
            (impl.empty() ? "" : " [" + impl + "]");
  // fwd: read x, write y; bwd: read x and dy, write dx (dweight/dbias and weights are negligible).
  b.bytes = (bwd ? 3.0 : 2.0) * act_bytes + static_cast<double>(D * (W + 1) * 4 * (bwd ? 2 : 1));
  b.flops = static_cast<double>(n) * (bwd ? 4.0 * W + 12 : 2.0 * W + 6);
  const int copies = static_cast<int>(std::clamp(std::ceil(kRotateBytes / ((bwd ? 3 : 2) * act_bytes)), 1.0, 16.0));
  b.setup = [=] {
    // Random values for the first 509 tokens, repeated over the rest (drawing 2^28 normals on the host would
    // take longer than the whole benchmark).
    HostTensor x = HostTensor::make(dt, bs.shape);
    std::mt19937_64 rng(7);
    {
      const int64_t rows = std::min<int64_t>(509, bs.shape[0] * bs.shape[1]);
      HostTensor head = HostTensor::make(dt, {rows, D});
      head.fill_normal(rng, 0.0, 1.0);
      const size_t chunk = head.storage.size();
      for (size_t off = 0; off < x.storage.size(); off += chunk)
        std::copy_n(head.storage.begin(), std::min(chunk, x.storage.size() - off), x.storage.begin() + off);
    }
    HostTensor w = HostTensor::make(STRATA_DTYPE_F32, {D, W});
    w.fill_uniform(rng, -0.5, 0.5);
    HostTensor bias = HostTensor::make(STRATA_DTYPE_F32, {D});
    bias.fill_uniform(rng, -0.5, 0.5);
    for (int i = 0; i < copies; ++i) {
      state->x.push_back(std::make_unique<DeviceTensor>(x, device));
      state->y.push_back(std::make_unique<DeviceTensor>(x, device));
      if (bwd) state->dy.push_back(std::make_unique<DeviceTensor>(x, device));
    }
    state->w = std::make_unique<DeviceTensor>(w, device);
    state->b = std::make_unique<DeviceTensor>(bias, device);
    if (bwd) {
      state->dw = std::make_unique<DeviceTensor>(w, device);
      state->db = std::make_unique<DeviceTensor>(bias, device);
    }
    if (!bs.cu.empty())
      state->cu = std::make_unique<DeviceTensor>(
          make_ints(STRATA_DTYPE_I64, {static_cast<int64_t>(bs.cu.size())}, bs.cu), device);
    const strata_tensor_desc* cu = state->cu ? &state->cu->desc() : nullptr;
    if (!impl.empty()) strata_set_force_impl(impl.c_str());  // for the plan only
    if (!bwd) {
      check(strata_causal_conv1d_fwd_plan(&state->x[0]->desc(), &state->w->desc(), &state->b->desc(), nullptr,
                                          nullptr, cu, nullptr, &state->y[0]->desc(), nullptr, 1, 0, &state->plan),
            "bench plan");
    } else {
      check(strata_causal_conv1d_bwd_plan(&state->x[0]->desc(), &state->w->desc(), &state->b->desc(), nullptr, cu,
                                          nullptr, &state->dy[0]->desc(), nullptr, &state->y[0]->desc(),
                                          &state->dw->desc(), &state->db->desc(), nullptr, 1, 0, &state->plan),
            "bench plan");
    }
    if (!impl.empty()) strata_set_force_impl(nullptr);
    check(strata_plan_workspace_size(state->plan, &state->ws_size), "bench workspace");
    if (state->ws_size) check(strata_malloc(device, state->ws_size, nullptr, &state->ws), "bench workspace");
  };
  b.run = [state, bwd] {
    const size_t i = state->next++ % state->x.size();
    void* cu = state->cu ? state->cu->data() : nullptr;
    if (!bwd) {
      void* t[] = {state->x[i]->data(), state->w->data(), state->b->data(), nullptr, nullptr, cu, nullptr,
                   state->y[i]->data(), nullptr};
      check(strata_plan_run(state->plan, t, 9, state->ws, state->ws_size, nullptr), "bench run");
    } else {
      void* t[] = {state->x[i]->data(), state->w->data(),  state->b->data(), nullptr,
                   cu,                  nullptr,           state->dy[i]->data(), nullptr,
                   state->y[i]->data(), state->dw->data(), state->db->data(), nullptr};
      check(strata_plan_run(state->plan, t, 12, state->ws, state->ws_size, nullptr), "bench run");
    }
  };
  b.teardown = [state] {
    strata_plan_destroy(state->plan);
    if (state->ws) strata_free(state->ws);
    state->x.clear();
    state->y.clear();
    state->dy.clear();
  };
  return b;
}

// CUDA: the dispatched implementation, then the other 16-bit kernels forced to compare them in one run
// (forward: vec dispatched, pipe forced; backward: lean dispatched for rows (pipe for the varlen shape), pipe
// and vec forced).
std::vector<BenchCase> conv_bench_cases(strata_device device, bool bwd) {
  std::vector<BenchCase> out;
  for (const BenchShape& s : bench_shapes(device)) out.push_back(make_bench(device, s, bwd));
  if (device.type == STRATA_DEVICE_CUDA)
    for (const char* impl : bwd ? std::vector<const char*>{"cuda.sm90.pipe", "cuda.sm90.vec"}
                                : std::vector<const char*>{"cuda.sm90.pipe"})
      for (const BenchShape& s : bench_shapes(device)) out.push_back(make_bench(device, s, bwd, impl));
  return out;
}
std::vector<BenchCase> Conv1dFwdHarness::bench_cases(strata_device device) const { return conv_bench_cases(device, false); }
std::vector<BenchCase> Conv1dBwdHarness::bench_cases(strata_device device) const { return conv_bench_cases(device, true); }

}  // namespace

std::unique_ptr<OpHarness> make_causal_conv1d_fwd_harness() { return std::make_unique<Conv1dFwdHarness>(); }
std::unique_ptr<OpHarness> make_causal_conv1d_bwd_harness() { return std::make_unique<Conv1dBwdHarness>(); }

}  // namespace strata::atk
