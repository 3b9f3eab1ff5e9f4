// ATK harnesses of the six GDN forward chunk operators (one harness per op, sharing input generation).
//
// A case line: "chunk_fwd_o dtype=bf16 odtype=bf16 shape=2x100x2x4x64x32 bt=64 cu=none gate=strong h0=1
// layout=padded seed=3". shape = B x T x H x HV x K x V; cu = "none" or the cu_seqlens values joined by '-'
// (then B = 1, T = last value); gate = none | zero | normal (per-token log gate logsigmoid(U[0,1))) | weak (/10)
// | strong (/0.01, γ down to about −4400 in a chunk: every exp must stay finite); layout = contiguous | padded
// (every tensor padded in every dimension, offset 5).
//
// Inputs are realistic (fla's generators, spec §7.2): q, k L2-normalised per head, v ~ N(0,1), β = σ(U),
// γ = chunk-local cumsum of the per-token gate over the op's own chunks. Inputs that come from an earlier op
// are made by the float64 reference of that op (Akk for solve_tril; w, u for fwd_h; A for recompute), rounded
// to the case dtype, and the entries an op must ignore (diagonal/upper part of Akk and A, columns past a
// partial chunk) are filled with large garbage. Outputs are NaN-poisoned. Expected values: fwd_reference<double>
// on the stored (rounded) inputs; the naive same-precision result: the same loops in f32 (fwd_reference<float>).
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <sstream>

#include "ops/linear_attn/gdn_bwd_common/testkit_gdn_bwd.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "ops/linear_attn/gdn_common/gdn_validate.h"
#include "testkit/testkit.h"

namespace strata::atk {
namespace {

namespace gd = strata::linear_attn::gdn;
using gd::FwdOp;

std::vector<int64_t> parse_cu(const std::string& s) {
  std::vector<int64_t> v;
  if (s.empty() || s == "none") return v;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-')) v.push_back(std::stoll(part));
  return v;
}

struct Dims {
  int64_t B, T, H, HV, K, V, BT, N, NT;
  std::vector<int64_t> cu;
};

// Chunks as (b, s, e) token ranges, sequence order.
std::vector<std::array<int64_t, 3>> chunk_list(const Dims& d) {
  std::vector<std::array<int64_t, 3>> out;
  if (d.cu.empty()) {
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.T; s += d.BT) out.push_back({b, s, std::min(s + d.BT, d.T)});
  } else {
    for (size_t n = 0; n + 1 < d.cu.size(); ++n)
      for (int64_t s = d.cu[n]; s < d.cu[n + 1]; s += d.BT) out.push_back({0, s, std::min(s + d.BT, d.cu[n + 1])});
  }
  return out;
}

enum class T : int { q, k, v, g, beta, Akk, A, w, u, h, h0, ht, vnew, o, cu, count };

struct TensorSet {
  HostTensor t[static_cast<int>(T::count)];
  bool present[static_cast<int>(T::count)] = {};
  HostTensor& operator[](T i) { return t[static_cast<int>(i)]; }
  const HostTensor& operator[](T i) const { return t[static_cast<int>(i)]; }
  bool has(T i) const { return present[static_cast<int>(i)]; }
};

std::vector<int64_t> shape_of_role(T which, const Dims& d) {
  switch (which) {
    case T::q:
    case T::k: return {d.B, d.T, d.H, d.K};
    case T::w: return {d.B, d.T, d.HV, d.K};
    case T::v:
    case T::u:
    case T::vnew:
    case T::o: return {d.B, d.T, d.HV, d.V};
    case T::g:
    case T::beta: return {d.B, d.T, d.HV};
    case T::Akk:
    case T::A: return {d.B, d.T, d.HV, d.BT};
    case T::h: return {d.B, d.NT, d.HV, d.K, d.V};
    case T::h0:
    case T::ht: return {d.N, d.HV, d.K, d.V};
    default: return {d.N + 1};
  }
}

gd::GdnFwdParams host_params(const Dims& d, float scale, TensorSet& ts, const std::vector<int64_t>& cu_host) {
  gd::GdnFwdParams p;
  p.shape.B = d.B;
  p.shape.T = d.T;
  p.shape.H = d.H;
  p.shape.HV = d.HV;
  p.shape.G = d.HV / d.H;
  p.shape.K = d.K;
  p.shape.V = d.V;
  p.shape.BT = d.BT;
  p.shape.N = d.N;
  p.shape.NTr = gd::cdiv(d.T, d.BT);
  p.shape.NT = d.NT;
  p.shape.scale = scale;
  p.chunks.B = d.B;
  p.chunks.T = d.T;
  p.chunks.N = d.N;
  p.chunks.BT = d.BT;
  p.chunks.NTr = p.shape.NTr;
  p.chunks.cu = cu_host.empty() ? nullptr : cu_host.data();
  auto b = [&](T i) {
    return ts.has(i) ? gd::bind_tensor(&ts[i].desc, ts[i].storage.data()) : gd::GdnTensor{};
  };
  p.q = b(T::q);
  p.k = b(T::k);
  p.v = b(T::v);
  p.g = b(T::g);
  p.beta = b(T::beta);
  p.Akk = b(T::Akk);
  p.A = b(T::A);
  p.w = b(T::w);
  p.u = b(T::u);
  p.h = b(T::h);
  p.h0 = b(T::h0);
  p.ht = b(T::ht);
  p.v_new = b(T::vnew);
  p.o = b(T::o);
  return p;
}

// Inputs / outputs of each op.
std::vector<T> inputs_of(FwdOp op, bool gate, bool h0) {
  std::vector<T> in;
  switch (op) {
    case FwdOp::kKkt: in = {T::k, T::beta}; break;
    case FwdOp::kSolveTril: in = {T::Akk}; break;
    case FwdOp::kRecomputeWU: in = {T::k, T::v, T::beta, T::A}; break;
    case FwdOp::kPrepareWY: in = {T::k, T::v, T::beta}; break;
    case FwdOp::kFwdH: in = {T::k, T::w, T::u}; break;
    default: in = {T::q, T::k, T::v, T::h}; break;
  }
  if (gate && op != FwdOp::kSolveTril) in.push_back(T::g);
  if (h0 && op == FwdOp::kFwdH) in.push_back(T::h0);
  return in;
}
std::vector<T> outputs_of(FwdOp op, bool vnew, bool ht) {
  switch (op) {
    case FwdOp::kKkt: return {T::Akk};
    case FwdOp::kSolveTril: return {T::A};
    case FwdOp::kRecomputeWU: return {T::w, T::u};
    case FwdOp::kPrepareWY: return {T::w, T::u, T::A};
    case FwdOp::kFwdH: {
      std::vector<T> o = {T::h};
      if (vnew) o.push_back(T::vnew);
      if (ht) o.push_back(T::ht);
      return o;
    }
    default: return {T::o};
  }
}
const char* tname(T i) {
  static const char* n[] = {"q", "k", "v", "g", "beta", "Akk", "A", "w", "u", "h", "h0", "ht", "v_new", "o", "cu"};
  return n[static_cast<int>(i)];
}

// Plan through the op's C API; descs[i] nullptr when absent.
strata_status plan_op(FwdOp op, const strata_tensor_desc* const* d, float scale, int32_t bt, strata_plan* plan) {
  auto D = [&](T i) { return d[static_cast<int>(i)]; };
  switch (op) {
    case FwdOp::kKkt: return strata_chunk_scaled_dot_kkt_plan(D(T::k), D(T::g), D(T::beta), D(T::cu), D(T::Akk), bt, plan);
    case FwdOp::kSolveTril: return strata_solve_tril_plan(D(T::Akk), D(T::cu), D(T::A), plan);
    case FwdOp::kRecomputeWU:
      return strata_recompute_w_u_fwd_plan(D(T::k), D(T::v), D(T::beta), D(T::A), D(T::g), D(T::cu), D(T::w),
                                           D(T::u), plan);
    case FwdOp::kPrepareWY:
      return strata_prepare_wy_repr_fwd_plan(D(T::k), D(T::v), D(T::g), D(T::beta), D(T::cu), D(T::w), D(T::u),
                                             D(T::A), bt, plan);
    case FwdOp::kFwdH:
      return strata_chunk_gated_delta_rule_fwd_h_plan(D(T::k), D(T::w), D(T::u), D(T::g), D(T::h0), D(T::cu),
                                                      D(T::h), D(T::vnew), D(T::ht), bt, plan);
    default:
      return strata_chunk_fwd_o_plan(D(T::q), D(T::k), D(T::v), D(T::h), D(T::g), D(T::cu), D(T::o), scale, bt, plan);
  }
}
// Run-time pointer order of each op (the C API's tensor order).
std::vector<T> order_of(FwdOp op) {
  switch (op) {
    case FwdOp::kKkt: return {T::k, T::g, T::beta, T::cu, T::Akk};
    case FwdOp::kSolveTril: return {T::Akk, T::cu, T::A};
    case FwdOp::kRecomputeWU: return {T::k, T::v, T::beta, T::A, T::g, T::cu, T::w, T::u};
    case FwdOp::kPrepareWY: return {T::k, T::v, T::g, T::beta, T::cu, T::w, T::u, T::A};
    case FwdOp::kFwdH: return {T::k, T::w, T::u, T::g, T::h0, T::cu, T::h, T::vnew, T::ht};
    default: return {T::q, T::k, T::v, T::h, T::g, T::cu, T::o};
  }
}

void l2_normalise_heads(HostTensor& t, int64_t D) {
  const int64_t n = t.numel() / std::max<int64_t>(D, 1);
  for (int64_t r = 0; r < n; ++r) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += t.get(r * D + d) * t.get(r * D + d);
    const double inv = 1.0 / std::sqrt(s + 1e-6);
    for (int64_t d = 0; d < D; ++d) t.set(r * D + d, t.get(r * D + d) * inv);
  }
}

// Rows of token tok of chunk matrix X: entries j >= (position of tok in its chunk) + (strict ? 0 : 1) and
// columns past the chunk length get garbage (the op must ignore them).
void garbage_outside_lower(HostTensor& X, const Dims& d, bool strict, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 30.0);
  for (const auto& c : chunk_list(d)) {
    const int64_t L = c[2] - c[1];
    for (int64_t i = 0; i < L; ++i)
      for (int64_t hv = 0; hv < d.HV; ++hv)
        for (int64_t j = 0; j < d.BT; ++j)
          if (j > i || (strict && j == i) || j >= L)
            X.set((((c[0] * d.T) + c[1] + i) * d.HV + hv) * d.BT + j, nd(rng));
  }
}

class GdnFwdHarness final : public OpHarness {
 public:
  explicit GdnFwdHarness(FwdOp op) : op_(op) {}
  std::string op() const override { return gd::fwd_op_name(op_); }

  std::vector<Case> conformance_cases() const override {
    std::vector<Case> cases;
    int64_t seed = 1;
    auto add = [&](const char* dt, const char* odt, std::vector<int64_t> shape, int64_t bt,
                   const std::vector<int64_t>& cu, const char* gate, int h0, const char* layout) {
      if (!cu.empty()) {
        shape[0] = 1;
        shape[1] = cu.back();
      }
      cases.push_back(Case(op())
                          .set("dtype", dt)
                          .set("odtype", odt)
                          .set("shape", shape_arg(shape))
                          .set("bt", bt)
                          .set("cu", cu.empty() ? std::string("none") : fmt::format("{}", fmt::join(cu, "-")))
                          .set("gate", gate)
                          .set("h0", h0)
                          .set("layout", layout)
                          .set("seed", seed++));
    };
    const bool kkt_like = op_ == FwdOp::kKkt || op_ == FwdOp::kSolveTril;
    // Main sweep: dtypes x shapes (GVA G = 1..4, K = 100, K = V = 256, tails, BT 16/32/64) x gates.
    const std::vector<std::vector<int64_t>> shapes = {
        {2, 100, 2, 4, 64, 32}, {1, 65, 1, 3, 100, 64}, {2, 63, 2, 2, 32, 128}, {1, 130, 1, 4, 128, 128},
        {1, 70, 1, 1, 256, 256}, {3, 1, 1, 2, 64, 64},  {1, 200, 2, 2, 64, 256}};
    const char* gates[] = {"normal", "strong", "none", "zero", "weak"};
    const char* layouts[] = {"contiguous", "padded"};
    int rot = 0;
    for (const char* dt : {"f32", "bf16", "f16", "f64"})
      for (size_t si = 0; si < shapes.size(); ++si) {
        if (std::string(dt) == "f64" && si > 2) continue;
        const int64_t bt = si % 3 == 0 ? 64 : (si % 3 == 1 ? 32 : 16);
        const char* odt = std::string(dt) == "f64" ? "f64" : (kkt_like && rot % 2 == 0 ? "f32" : dt);
        add(dt, odt, shapes[si], bt, {}, gates[rot % 5], rot % 2, layouts[rot % 2]);
        ++rot;
      }
    // Variable-length packs: zero-length (leading, inner, trailing), single tokens, shorter/longer than a chunk.
    const std::vector<std::vector<int64_t>> packs = {{0, 15, 15, 100, 101, 230},
                                                     {0, 1, 2, 3, 40, 41, 100},
                                                     {0, 0, 64, 128, 128},
                                                     {0, 300},
                                                     {0, 63, 127, 129, 192}};
    for (size_t pi = 0; pi < packs.size(); ++pi)
      for (int64_t bt : {64, 32, 16}) {
        const char* dt = rot % 3 == 0 ? "f32" : (rot % 3 == 1 ? "bf16" : "f16");
        add(dt, rot % 2 ? "f32" : dt, {1, 0, 2, 4, 64, 48}, bt, packs[pi], gates[rot % 5], rot % 2, layouts[rot % 2]);
        ++rot;
      }
    add("f64", "f64", {1, 0, 1, 2, 100, 32}, 64, {0, 15, 15, 100, 101, 230}, "strong", 1, "padded");
    // 16-bit inputs with 16-bit outputs (the CUDA tensor-core kernels run only these): varlen with K = 100 and
    // a tail, K = V = 256 with a strong gate, BT = 32 packs, GVA.
    for (const char* dt : {"bf16", "f16"}) {
      add(dt, dt, {1, 0, 2, 4, 100, 48}, 64, {0, 15, 15, 100, 101, 230}, "normal", 1, "padded");
      add(dt, dt, {2, 130, 1, 2, 256, 256}, 64, {}, "strong", 1, "contiguous");
      add(dt, dt, {1, 0, 1, 2, 64, 96}, 32, {0, 63, 127, 129, 192}, "weak", 0, "contiguous");
      // Enough (sequence, head, column tile) blocks on a 132-SM H200 for the state pass's 32-column tiles
      // (K = 128, K = 256) and 64-column tiles (K = 128).
      add(dt, dt, {3, 100, 4, 12, 128, 128}, 64, {}, "normal", 1, "contiguous");
      add(dt, dt, {3, 100, 4, 24, 128, 128}, 64, {}, "weak", 1, "contiguous");
      add(dt, dt, {2, 70, 2, 36, 256, 64}, 64, {}, "normal", 1, "padded");
    }
    // Many short documents: N * HV > 65535 (grid-dimension limits on CUDA).
    {
      std::vector<int64_t> cu = {0};
      for (int64_t n = 0; n < 17000; ++n) cu.push_back(cu.back() + 1 + n % 3);
      add("bf16", "bf16", {1, 0, 1, 4, 16, 16}, 64, cu, "normal", 1, "contiguous");
    }
    // Empty: no tokens (fixed), an empty pack, only zero-length sequences (final state = initial state).
    add("f32", "f32", {2, 0, 1, 2, 32, 32}, 64, {}, "normal", 1, "contiguous");
    add("f32", "f32", {1, 0, 1, 2, 32, 32}, 64, {0, 0, 0}, "normal", 1, "contiguous");
    add("bf16", "bf16", {1, 0, 2, 2, 32, 16}, 32, {0}, "none", 0, "contiguous");
    return cases;
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    CaseResult r;
    const int32_t dt = dtype_from_name(c.get("dtype"));
    const int32_t odt = dtype_from_name(c.get("odtype", c.get("dtype")));
    if ((dt == STRATA_DTYPE_F64 || odt == STRATA_DTYPE_F64) && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    const std::vector<int64_t> sh = c.get_shape("shape");
    Dims d{sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], c.get_int("bt", 64), 0, 0, parse_cu(c.get("cu"))};
    d.N = d.cu.empty() ? d.B : static_cast<int64_t>(d.cu.size()) - 1;
    d.NT = d.cu.empty() ? gd::cdiv(d.T, d.BT) : static_cast<int64_t>(chunk_list(d).size());
    const std::string gate = c.get("gate", "normal");
    const bool has_gate = gate != "none";
    const bool has_h0 = c.get_int("h0", 0) != 0;
    const Layout layout = layout_from_name(c.get("layout", "contiguous"));
    const float scale = static_cast<float>(c.get_double("scale", 1.0 / std::sqrt(static_cast<double>(d.K))));
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));
    const int32_t gdt = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    const int32_t state_dt = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;

    // ---- generate every input of the pipeline in f64, contiguous ----
    TensorSet gen;  // f64 contiguous
    auto mk = [&](TensorSet& ts, T i, int32_t dtype, Layout lay) {
      ts[i] = HostTensor::make(dtype, shape_of_role(i, d), lay);
      ts.present[static_cast<int>(i)] = true;
    };
    for (T i : {T::q, T::k, T::v, T::g, T::beta, T::h, T::h0}) mk(gen, i, STRATA_DTYPE_F64, Layout::kContiguous);
    gen[T::q].fill_normal(rng);
    gen[T::k].fill_normal(rng);
    l2_normalise_heads(gen[T::q], d.K);
    l2_normalise_heads(gen[T::k], d.K);
    gen[T::v].fill_normal(rng);
    gen[T::h].fill_normal(rng, 0.0, 0.5);
    gen[T::h0].fill_normal(rng, 0.0, 0.5);
    gen[T::beta].fill_uniform(rng, 0.0, 1.0);
    for (int64_t e = 0; e < gen[T::beta].numel(); ++e) gen[T::beta].set(e, 1.0 / (1.0 + std::exp(-gen[T::beta].get(e))));
    {
      HostTensor raw = HostTensor::make(STRATA_DTYPE_F64, shape_of_role(T::g, d));
      raw.fill_uniform(rng, 0.0, 1.0);
      const double norm = gate == "strong" ? 0.01 : (gate == "weak" ? 10.0 : 1.0);
      for (int64_t e = 0; e < raw.numel(); ++e)
        raw.set(e, gate == "zero" ? 0.0 : -std::log1p(std::exp(-raw.get(e))) / norm);  // logsigmoid(x) / norm
      for (const auto& ch : chunk_list(d))
        for (int64_t hv = 0; hv < d.HV; ++hv) {
          double acc = 0;
          for (int64_t t = ch[1]; t < ch[2]; ++t) {
            const int64_t e = (ch[0] * d.T + t) * d.HV + hv;
            acc += raw.get(e);
            gen[T::g].set(e, acc);
          }
        }
    }
    // Round the generated values to the dtypes they will be stored in (the reference sees the same values).
    auto round_all = [&](T i, int32_t dtype) {
      for (int64_t e = 0; e < gen[i].numel(); ++e) gen[i].set(e, round_to(dtype, gen[i].get(e)));
    };
    for (T i : {T::q, T::k, T::v, T::h}) round_all(i, dt);
    round_all(T::g, gdt);
    round_all(T::beta, gdt);
    round_all(T::h0, state_dt);
    const std::vector<int64_t> cu_host = d.cu;
    // Upstream inputs by the f64 reference: Akk (kkt), A, w, u (prepare_wy).
    const bool need_akk = op_ == FwdOp::kSolveTril;
    const bool need_wy = op_ == FwdOp::kRecomputeWU || op_ == FwdOp::kFwdH;
    if (need_akk || need_wy) {
      for (T i : {T::Akk, T::A, T::w, T::u}) mk(gen, i, STRATA_DTYPE_F64, Layout::kContiguous);
      gd::GdnFwdParams p = host_params(d, scale, gen, cu_host);
      if (!has_gate) p.g = {};
      if (need_akk) gd::fwd_reference<double>(FwdOp::kKkt, p);
      if (need_wy) gd::fwd_reference<double>(FwdOp::kPrepareWY, p);
      round_all(T::Akk, dt);
      round_all(T::A, dt);
      round_all(T::w, dt);
      round_all(T::u, dt);
      if (need_akk) garbage_outside_lower(gen[T::Akk], d, true, rng);
      if (op_ == FwdOp::kRecomputeWU) garbage_outside_lower(gen[T::A], d, false, rng);
    }

    // ---- the op's tensors in their dtypes and layout ----
    TensorSet ts;
    const std::vector<T> ins = inputs_of(op_, has_gate, has_h0);
    const std::vector<T> outs = outputs_of(op_, c.get_int("vnew", 1) != 0, c.get_int("ht", 1) != 0);
    for (T i : ins) {
      const int32_t idt = (i == T::g || i == T::beta) ? gdt : (i == T::h0 ? state_dt : dt);
      mk(ts, i, idt, layout);
      for (int64_t e = 0; e < ts[i].numel(); ++e) ts[i].set(e, gen[i].get(e));
    }
    for (T i : outs) {
      mk(ts, i, i == T::ht ? state_dt : odt, layout);
      ts[i].poison();
    }
    if (!d.cu.empty()) {
      mk(ts, T::cu, STRATA_DTYPE_I64, Layout::kContiguous);
      for (size_t i = 0; i < d.cu.size(); ++i) ts[T::cu].set(static_cast<int64_t>(i), static_cast<double>(d.cu[i]));
    }

    // ---- expected (f64) and naive (f32 loops, output dtype) ----
    TensorSet ref = ts, naive = ts;
    for (T i : outs) {
      ref[i] = HostTensor::make(STRATA_DTYPE_F64, shape_of_role(i, d));
      naive[i] = HostTensor::make(i == T::ht ? state_dt : odt, shape_of_role(i, d));
    }
    gd::fwd_reference<double>(op_, host_params(d, scale, ref, cu_host));
    gd::fwd_reference<float>(op_, host_params(d, scale, naive, cu_host));

    // ---- run on the device ----
    std::vector<std::unique_ptr<DeviceTensor>> dev(static_cast<size_t>(T::count));
    const strata_tensor_desc* descs[static_cast<int>(T::count)] = {};
    for (int i = 0; i < static_cast<int>(T::count); ++i)
      if (ts.present[i]) {
        dev[i] = std::make_unique<DeviceTensor>(ts.t[i], device);
        descs[i] = &dev[i]->desc();
      }
    strata_plan plan = nullptr;
    check(plan_op(op_, descs, scale, static_cast<int32_t>(d.BT), &plan), "plan");
    r.impl = strata_plan_impl_name(plan);
    const PrecisionModel pm = gdn_bwd_kit::precision_of(plan);  // (how its outputs are judged)
    size_t ws = 0;
    strata_plan_workspace_size(plan, &ws);
    void* wsp = nullptr;
    if (ws) check(strata_malloc(device, ws, nullptr, &wsp), "workspace");
    std::vector<void*> ptrs;
    for (T i : order_of(op_)) ptrs.push_back(ts.has(i) ? dev[static_cast<int>(i)]->data() : nullptr);
    const strata_status st =
        strata_plan_run(plan, ptrs.data(), static_cast<int32_t>(ptrs.size()), wsp, ws, nullptr);
    strata_plan_destroy(plan);
    if (device.type == STRATA_DEVICE_CUDA) strata_device_synchronize(device);
    if (wsp) strata_free(wsp);
    check(st, "run");
    r.pass = true;
    const double len = static_cast<double>(std::max<int64_t>({d.K, d.V, d.BT}));
    for (T i : outs) {
      dev[static_cast<int>(i)]->download(ts[i]);
      // The tensor-core kernels (PrecisionModel::kInputDtype: cuda.sm90.mma, cuda.sm90.wgmma, cuda.sm90.prep) round S
      // and Vd to the 16-bit token dtype before their products (fla's model, ops_gdn_kda.md §6.3), so the f32 final
      // state carries that rounding: judged at the token dtype, as the backward ops' f32 outputs (judged_dtype).
      const int32_t cdt = i == T::ht ? gdn_bwd_kit::judged_dtype(state_dt, dt, pm) : odt;
      r.compares.push_back(compare(tname(i), ts[i].values(), ref[i].values(), naive[i].values(), cdt, len));
      r.pass = r.pass && r.compares.back().pass;
    }
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    // T = 4096, Hq = 4, Hv = 8, K = V = 128 f32 (the CPU target shape); B = 4 on CUDA.
    const bool cuda = device.type == STRATA_DEVICE_CUDA;
    const int64_t B = cuda ? 4 : 1, Tl = 4096, H = 4, HV = 8, K = 128, V = 128, BT = 64;
    std::vector<BenchCase> out;
    for (int32_t dt : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
      if (!cuda && dt == STRATA_DTYPE_BF16) continue;
      out.push_back(bench_case(device, dt, B, Tl, H, HV, K, V, BT));
    }
    // The full-forward target shape of the GDN op (PERF_TARGETS.md): B = 4, T = 8192, H = 16, HV = 32,
    // K = V = 128, bf16, for the three kernels the composite runs.
    if (cuda && (op_ == FwdOp::kPrepareWY || op_ == FwdOp::kFwdH || op_ == FwdOp::kFwdO))
      out.push_back(bench_case(device, STRATA_DTYPE_BF16, 4, 8192, 16, 32, 128, 128, BT));
    return out;
  }

 private:
  // FLOPs per (chunk, value head) of L = BT rows (dense products only, 2 per FMA; the Gram matrices count
  // once per q/k head). Triangular products are counted as the dense GEMMs they run as.
  double flops(int64_t B, int64_t Tl, int64_t H, int64_t HV, int64_t K, int64_t V, int64_t BT) const {
    const double chunks = static_cast<double>(B) * static_cast<double>(gd::cdiv(Tl, BT));
    const double L = static_cast<double>(BT), k = static_cast<double>(K), v = static_cast<double>(V);
    const double gram = 2 * L * L * k * static_cast<double>(H);
    const double hv = static_cast<double>(HV);
    switch (op_) {
      case FwdOp::kKkt: return chunks * gram;
      case FwdOp::kSolveTril: return chunks * hv * L * L * L / 3;
      case FwdOp::kRecomputeWU: return chunks * hv * 2 * L * L * (k + v);
      case FwdOp::kPrepareWY: return chunks * (gram + hv * (L * L * L / 3 + 2 * L * L * (k + v)));
      case FwdOp::kFwdH: return chunks * hv * 4 * L * k * v;
      default: return chunks * (gram + hv * (2 * L * k * v + 2 * L * L * v));
    }
  }

  BenchCase bench_case(strata_device device, int32_t dt, int64_t B, int64_t Tl, int64_t H, int64_t HV, int64_t K,
                       int64_t V, int64_t BT) const {
    struct State {
      std::vector<std::unique_ptr<DeviceTensor>> t;
      std::vector<void*> ptrs;
      strata_plan plan = nullptr;
      void* ws = nullptr;
    };
    auto state = std::make_shared<State>();
    BenchCase b;
    const Dims d{B, Tl, H, HV, K, V, BT, B, gd::cdiv(Tl, BT), {}};
    b.label = fmt::format("{} {} B={} T={} H={} HV={} K={} V={} BT={}", op(), dtype_name(dt), B, Tl, H, HV, K, V, BT);
    b.flops = flops(B, Tl, H, HV, K, V, BT);
    const std::vector<T> ins = inputs_of(op_, true, op_ == FwdOp::kFwdH);
    const std::vector<T> outs = outputs_of(op_, true, true);
    double bytes = 0;
    for (T i : ins) bytes += static_cast<double>(HostTensor::make(dt, shape_of_role(i, d)).storage.size());
    for (T i : outs) bytes += static_cast<double>(HostTensor::make(dt, shape_of_role(i, d)).storage.size());
    b.bytes = bytes;
    const FwdOp op = op_;
    b.setup = [=] {
      std::mt19937_64 rng(7);
      const strata_tensor_desc* descs[static_cast<int>(T::count)] = {};
      state->t.resize(static_cast<size_t>(T::count));
      for (T i : ins) {
        const int32_t tdt = (i == T::g || i == T::beta || i == T::h0) ? STRATA_DTYPE_F32 : dt;
        HostTensor h = HostTensor::make(tdt, shape_of_role(i, d));
        if (i == T::g) h.fill_uniform(rng, -2.0, -0.1);
        else if (i == T::beta) h.fill_uniform(rng, 0.2, 0.8);
        else if (i == T::A || i == T::Akk) h.fill_normal(rng, 0.0, 0.05);
        else h.fill_normal(rng, 0.0, i == T::w ? 0.01 : 0.1);
        state->t[static_cast<size_t>(i)] = std::make_unique<DeviceTensor>(h, device);
        descs[static_cast<int>(i)] = &state->t[static_cast<size_t>(i)]->desc();
      }
      for (T i : outs) {
        HostTensor h = HostTensor::make(i == T::ht ? STRATA_DTYPE_F32 : dt, shape_of_role(i, d));
        state->t[static_cast<size_t>(i)] = std::make_unique<DeviceTensor>(h, device);
        descs[static_cast<int>(i)] = &state->t[static_cast<size_t>(i)]->desc();
      }
      check(plan_op(op, descs, 0.088f, static_cast<int32_t>(d.BT), &state->plan), "bench plan");
      for (T i : order_of(op))
        state->ptrs.push_back(state->t[static_cast<size_t>(i)] ? state->t[static_cast<size_t>(i)]->data() : nullptr);
    };
    b.run = [state] {
      check(strata_plan_run(state->plan, state->ptrs.data(), static_cast<int32_t>(state->ptrs.size()), nullptr, 0,
                            nullptr),
            "bench run");
    };
    b.teardown = [state] {
      strata_plan_destroy(state->plan);
      state->t.clear();
    };
    return b;
  }

  FwdOp op_;
};

}  // namespace

std::unique_ptr<OpHarness> make_chunk_scaled_dot_kkt_harness() { return std::make_unique<GdnFwdHarness>(FwdOp::kKkt); }
std::unique_ptr<OpHarness> make_solve_tril_harness() { return std::make_unique<GdnFwdHarness>(FwdOp::kSolveTril); }
std::unique_ptr<OpHarness> make_recompute_w_u_fwd_harness() {
  return std::make_unique<GdnFwdHarness>(FwdOp::kRecomputeWU);
}
std::unique_ptr<OpHarness> make_prepare_wy_repr_fwd_harness() {
  return std::make_unique<GdnFwdHarness>(FwdOp::kPrepareWY);
}
std::unique_ptr<OpHarness> make_chunk_gated_delta_rule_fwd_h_harness() {
  return std::make_unique<GdnFwdHarness>(FwdOp::kFwdH);
}
std::unique_ptr<OpHarness> make_chunk_fwd_o_harness() { return std::make_unique<GdnFwdHarness>(FwdOp::kFwdO); }

}  // namespace strata::atk
