// ATK harness of rms_norm_gated (forward and backward): conformance cases, the float64 comparison, benchmark
// cases.
//
// A case line: "rms_norm_gated_fwd dtype=bf16 shape=65x64 group=16 nbg=1 act=silu weight=f32 bias=1
// residual=f32 res_out=1 layout=rowpad seed=3". weight: none | f32 | same (x's dtype); residual: none | same |
// f32 (residual_out takes the residual's dtype, x's without a residual); group 0 means D. Layouts of the
// [..., D] tensors: contiguous; padded / strided (atk::Layout: offset 5, padded dimensions, column stride 2 for
// strided: the element-wise paths); rowpad (rows padded by 8 elements, offset 8: non-contiguous but 16-byte
// aligned, the vector paths). Expected values: the float64 loops of reference.cpp on the rounded inputs; the
// naive result: the same loops in f32 arithmetic.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "testkit/testkit.h"

namespace strata::atk {
namespace {

using norm::RmsNormGatedBwdParams;
using norm::RmsNormGatedFwdParams;

HostTensor make_t(int32_t dtype, const std::vector<int64_t>& shape, const std::string& layout) {
  if (layout != "rowpad" || shape.size() < 2) {
    if (layout == "rowpad") return HostTensor::make(dtype, shape);
    return HostTensor::make(dtype, shape, layout_from_name(layout));
  }
  HostTensor t;
  t.desc.dtype = dtype;
  t.desc.rank = static_cast<int32_t>(shape.size());
  t.desc.device = {STRATA_DEVICE_CPU, 0};
  t.desc.offset = 8;
  int64_t stride = 1;
  for (int i = t.desc.rank - 1; i >= 0; --i) {
    t.desc.shape[i] = shape[i];
    t.desc.strides[i] = stride;
    stride *= i == t.desc.rank - 1 ? shape[i] + 8 : shape[i];
  }
  int64_t span = t.desc.offset + 1;
  bool empty = false;
  for (int i = 0; i < t.desc.rank; ++i) {
    if (shape[i] == 0) empty = true;
    span += (shape[i] - 1) * t.desc.strides[i];
  }
  t.storage.assign(static_cast<size_t>(empty ? 1 : span) * dtype_size(dtype), 0);
  return t;
}

const HostTensor* opt(const std::unique_ptr<HostTensor>& t) { return t.get(); }
RowLayout rows_of(const HostTensor* t) { return t ? make_row_layout(t->desc, 1) : RowLayout{}; }
void* ptr(HostTensor* t) { return t ? t->storage.data() : nullptr; }
const void* ptr(const HostTensor* t) { return t ? t->storage.data() : nullptr; }
std::vector<double> vals(const HostTensor* t) { return t ? t->values() : std::vector<double>{}; }

// A contiguous f64 copy of a tensor's values (nullptr for an absent tensor): the reference's inputs.
std::unique_ptr<HostTensor> widen(const HostTensor* t) {
  if (!t) return nullptr;
  auto o = std::make_unique<HostTensor>(HostTensor::make(STRATA_DTYPE_F64, shape_of(t->desc)));
  const std::vector<double> v = t->values();
  for (int64_t e = 0; e < t->numel(); ++e) o->set(e, v[e]);
  return o;
}

// Device copies with the optional ones absent.
struct Dev {
  std::vector<std::unique_ptr<DeviceTensor>> t;
  const strata_tensor_desc* d(size_t i) const { return t[i] ? &t[i]->desc() : nullptr; }
  void* p(size_t i) const { return t[i] ? t[i]->data() : nullptr; }
};

class RmsNormGatedHarness final : public OpHarness {
 public:
  explicit RmsNormGatedHarness(bool bwd) : bwd_(bwd) {}
  std::string op() const override { return bwd_ ? "rms_norm_gated_bwd" : "rms_norm_gated_fwd"; }

  std::vector<Case> conformance_cases() const override {
    std::vector<Case> cases;
    int64_t seed = 1;
    auto add = [&](const char* dt, const std::vector<int64_t>& shape, int64_t group, int nbg, const char* act,
                   const char* weight, int bias, const char* residual, int res_out, const char* layout) {
      cases.push_back(Case(op())
                          .set("dtype", dt)
                          .set("shape", shape_arg(shape))
                          .set("group", group)
                          .set("nbg", nbg)
                          .set("act", act)
                          .set("weight", weight)
                          .set("bias", bias)
                          .set("residual", residual)
                          .set("res_out", res_out)
                          .set("layout", layout)
                          .set("seed", seed++));
    };
    // Every option combination on one small grouped shape (both vector-path group kinds on CUDA) per dtype.
    for (const char* dt : {"f32", "bf16"})
      for (int nbg : {1, 0})
        for (const char* act : {"silu", "sigmoid"})
          for (const char* weight : {"f32", "same", "none"})
            for (int bias : {0, 1})
              for (const char* residual : {"none", "same", "f32"})
                for (int res_out : {0, 1})
                  add(dt, {65, 64}, (nbg + bias) % 2 ? 16 : 64, nbg, act, weight, bias, residual, res_out,
                      (bias + res_out) % 2 ? "rowpad" : "contiguous");
    // Sizes x groups x dtypes x layouts, options rotating. Each CUDA path appears: lane teams of 4..32 lanes
    // (D <= 1024), a block per row (D <= 8192), looped (odd D or G, strides, misalignment, D > 8192).
    struct SG {
      std::vector<int64_t> shape;
      int64_t group;
    };
    const std::vector<SG> sgs = {
        {{1, 8}, 0},      {{63, 128}, 0},    {{97, 96}, 32},   {{3, 5, 128}, 64}, {{1025, 40}, 8},
        {{7, 1200}, 0},   {{5, 1024}, 256},  {{3, 5120}, 0},   {{2, 8192}, 1024}, {{2, 63}, 21},
        {{4, 65}, 13},    {{3, 97}, 97},     {{2, 1025}, 205}, {{9, 50}, 0},      {{2, 10000}, 2000},
        {{5, 256}, 8},    {{1, 1}, 1},       {{33, 24}, 24},   {{0, 128}, 0},     {{4, 0}, 0},
        {{2, 3, 0}, 5}};
    const char* acts[] = {"silu", "sigmoid"};
    const char* weights[] = {"f32", "same", "none"};
    const char* residuals[] = {"none", "same", "f32"};
    int rot = 0;
    for (const char* dt : {"f32", "bf16", "f16", "f64"})
      for (const SG& sg : sgs)
        for (const char* layout : {"contiguous", "rowpad", "padded", "strided"}) {
          if (sg.shape.back() > 2000 && std::string(layout) != "contiguous" && std::string(layout) != "rowpad")
            continue;
          add(dt, sg.shape, sg.group, rot % 2, acts[(rot / 2) % 2], weights[rot % 3], (rot / 3) % 2,
              residuals[(rot / 5) % 3], (rot / 7) % 2, layout);
          ++rot;
        }
    // CUDA only (big): enough rows that every CTA of the persistent bulk-copy ring takes more tiles than the
    // ring has stages (the stage reuse and mbarrier parity flips), dense rows (one copy per tensor and tile)
    // and padded rows (one copy per row), both gate orders, both activations, lane teams and wide rows. Sized
    // just past that point (s6run2's atk of the forward, which also runs these, hit its 25 s cap with cases
    // 3-5 x larger): e.g. 60000 x 128 gives 1875 tiles of 32 rows over 264 CTAs with 6 (forward) / 4 stages.
    add("bf16", {60000, 128}, 0, 1, "silu", "f32", 0, "none", 0, "contiguous");
    cases.back().set("gpu_only", 1);
    add("bf16", {110000, 64}, 16, 0, "sigmoid", "same", 1, "none", 0, "rowpad");
    cases.back().set("gpu_only", 1);
    add("f16", {4000, 1024}, 256, 1, "sigmoid", "f32", 1, "none", 0, "contiguous");
    cases.back().set("gpu_only", 1);
    // Wide rows (a block per row, one row per ring tile).
    add("bf16", {1200, 5120}, 0, 0, "silu", "f32", 0, "none", 0, "contiguous");
    cases.back().set("gpu_only", 1);
    add("bf16", {900, 8192}, 1024, 1, "silu", "same", 1, "none", 0, "rowpad");
    cases.back().set("gpu_only", 1);
    add("f16", {2400, 1200}, 40, 0, "sigmoid", "none", 1, "none", 0, "contiguous");
    cases.back().set("gpu_only", 1);
    return cases;
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const int32_t dt = dtype_from_name(c.get("dtype"));
    CaseResult res;
    if (dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      res.skipped = true;
      res.message = "f64 runs on the CPU only";
      return res;
    }
    if (c.get_int("gpu_only", 0) != 0 && device.type == STRATA_DEVICE_CPU) {
      res.skipped = true;
      res.message = "a CUDA-only case (big: the CPU paths are covered by the small ones)";
      return res;
    }
    const std::vector<int64_t> shape = c.get_shape("shape");
    const int64_t D = shape.back();
    int64_t group = c.get_int("group", 0);
    const int64_t G = group == 0 ? D : group;
    const int nbg = static_cast<int>(c.get_int("nbg", 1));
    const int32_t act = c.get("act", "silu") == "sigmoid" ? STRATA_GATE_SIGMOID : STRATA_GATE_SILU;
    const std::string wopt = c.get("weight", "f32"), ropt = c.get("residual", "none"), layout = c.get("layout");
    const bool has_b = c.get_int("bias", 0) != 0, has_ro = c.get_int("res_out", 0) != 0;
    const float eps = static_cast<float>(c.get_double("eps", 1e-5));
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));

    const int32_t stat = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    const int32_t pdt = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    const int32_t wdt = wopt == "same" ? dt : pdt;
    const int32_t rdt = ropt == "f32" ? pdt : dt;
    std::vector<int64_t> rshape(shape.begin(), shape.end() - 1);
    rshape.push_back(G > 0 ? D / G : 0);

    HostTensor x = make_t(dt, shape, layout), z = make_t(dt, shape, layout);
    x.fill_normal(rng, 0.3, 1.0);
    z.fill_normal(rng, 0.0, 2.0);
    std::unique_ptr<HostTensor> w, b, r;
    if (wopt != "none") {
      w = std::make_unique<HostTensor>(HostTensor::make(wdt, {D}));
      w->fill_normal(rng, 1.0, 0.2);
    }
    if (has_b) {
      b = std::make_unique<HostTensor>(HostTensor::make(wdt, {D}));
      b->fill_normal(rng, 0.0, 0.2);
    }
    if (ropt != "none") {
      r = std::make_unique<HostTensor>(make_t(rdt, shape, layout));
      r->fill_normal(rng, 0.0, 1.0);
    }
    const int64_t rows = D > 0 ? x.numel() / D : 0;

    // Forward params on host tensors; `out` holds y, residual_out, rstd of the chosen dtypes.
    auto fwd_params = [&](HostTensor& y, HostTensor* ro, HostTensor& rs) {
      RmsNormGatedFwdParams p;
      p.x = ptr(&x), p.z = ptr(&z), p.weight = ptr(opt(w)), p.bias = ptr(opt(b)), p.residual = ptr(opt(r));
      p.y = ptr(&y), p.residual_out = ptr(ro), p.rstd = ptr(&rs);
      p.x_dtype = dt, p.w_dtype = wdt, p.b_dtype = wdt, p.res_dtype = rdt;
      p.res_out_dtype = ro ? ro->desc.dtype : dt, p.rstd_dtype = rs.desc.dtype;
      p.rows = rows, p.D = D, p.group = G;
      p.x_rows = rows_of(&x), p.z_rows = rows_of(&z), p.y_rows = rows_of(&y), p.res_rows = rows_of(opt(r));
      p.res_out_rows = rows_of(ro), p.rstd_rows = rows_of(&rs), p.w_row = rows_of(opt(w)), p.b_row = rows_of(opt(b));
      p.eps = eps, p.norm_before_gate = nbg != 0, p.act = act;
      return p;
    };

    if (!bwd_) {
      HostTensor y = make_t(dt, shape, layout), rs = make_t(stat, rshape, layout);
      std::unique_ptr<HostTensor> ro;
      if (has_ro) ro = std::make_unique<HostTensor>(make_t(r ? rdt : dt, shape, layout));
      y.poison();
      rs.poison();
      if (ro) ro->poison();
      // Naive f32 result on the host; the float64 expectation from f64 copies of the rounded inputs.
      HostTensor yn = HostTensor::make(dt, shape), rsn = HostTensor::make(stat, rshape);
      std::unique_ptr<HostTensor> ron;
      if (ro) ron = std::make_unique<HostTensor>(HostTensor::make(ro->desc.dtype, shape));
      norm::rms_norm_gated_fwd_naive_f32(fwd_params(yn, ron.get(), rsn));
      std::vector<double> y_ref, rs_ref, ro_ref;
      {
        auto X = widen(&x), Z = widen(&z), W = widen(w.get()), B = widen(b.get()), R = widen(r.get());
        HostTensor Y = HostTensor::make(STRATA_DTYPE_F64, shape), RO = Y, RS = HostTensor::make(STRATA_DTYPE_F64, rshape);
        RmsNormGatedFwdParams p;
        p.x = ptr(X.get()), p.z = ptr(Z.get()), p.weight = ptr(W.get()), p.bias = ptr(B.get()), p.residual = ptr(R.get());
        p.y = ptr(&Y), p.residual_out = ptr(&RO), p.rstd = ptr(&RS);
        p.x_dtype = p.w_dtype = p.b_dtype = p.res_dtype = p.res_out_dtype = p.rstd_dtype = STRATA_DTYPE_F64;
        p.rows = rows, p.D = D, p.group = G;
        p.x_rows = rows_of(X.get()), p.z_rows = rows_of(Z.get()), p.y_rows = rows_of(&Y), p.res_rows = rows_of(R.get());
        p.res_out_rows = rows_of(&RO), p.rstd_rows = rows_of(&RS), p.w_row = rows_of(W.get()), p.b_row = rows_of(B.get());
        p.eps = eps, p.norm_before_gate = nbg != 0, p.act = act;
        norm::rms_norm_gated_fwd_reference(p);
        y_ref = Y.values(), rs_ref = RS.values(), ro_ref = RO.values();
      }
      Dev dv;
      for (HostTensor* t : {&x, &z, w.get(), b.get(), r.get(), &y, ro.get(), &rs})
        dv.t.push_back(t ? std::make_unique<DeviceTensor>(*t, device) : nullptr);
      strata_plan plan = nullptr;
      check(strata_rms_norm_gated_fwd_plan(dv.d(0), dv.d(1), dv.d(2), dv.d(3), dv.d(4), dv.d(5), dv.d(6), dv.d(7),
                                           eps, group, nbg, act, &plan),
            "plan");
      res.impl = strata_plan_impl_name(plan);
      void* t[8];
      for (size_t i = 0; i < 8; ++i) t[i] = dv.p(i);
      const strata_status st = strata_plan_run(plan, t, 8, nullptr, 0, nullptr);
      strata_plan_destroy(plan);
      check(st, "run");
      dv.t[5]->download(y);
      dv.t[7]->download(rs);
      const double len = static_cast<double>(std::max<int64_t>(G, 1));
      res.compares.push_back(compare("y", y.values(), y_ref, yn.values(), dt, len));
      res.compares.push_back(compare("rstd", rs.values(), rs_ref, rsn.values(), stat, len));
      if (ro) {
        dv.t[6]->download(*ro);
        res.compares.push_back(compare("residual_out", ro->values(), ro_ref, ron->values(), ro->desc.dtype));
      }
    } else {
      // Saved rstd as the forward stores it (f32), from the float64 forward.
      HostTensor rs = make_t(stat, rshape, layout);
      {
        HostTensor ys = HostTensor::make(dt, shape);
        norm::rms_norm_gated_fwd_reference(fwd_params(ys, nullptr, rs));
      }
      HostTensor dy = make_t(dt, shape, layout);
      dy.fill_normal(rng, 0.0, 1.0);
      std::unique_ptr<HostTensor> dro;
      if (has_ro) {
        dro = std::make_unique<HostTensor>(make_t(r ? rdt : dt, shape, layout));
        dro->fill_normal(rng, 0.0, 1.0);
      }
      HostTensor dx = make_t(dt, shape, layout), dz = make_t(dt, shape, layout);
      dx.poison();
      dz.poison();
      std::unique_ptr<HostTensor> dw, db;
      if (w) dw = std::make_unique<HostTensor>(HostTensor::make(wdt, {D}));
      if (b) db = std::make_unique<HostTensor>(HostTensor::make(wdt, {D}));
      if (dw) dw->poison();
      if (db) db->poison();
      auto bwd_params = [&](HostTensor& ddx, HostTensor& ddz, HostTensor* ddw, HostTensor* ddb) {
        RmsNormGatedBwdParams p;
        p.x = ptr(&x), p.z = ptr(&z), p.weight = ptr(opt(w)), p.bias = ptr(opt(b)), p.residual = ptr(opt(r));
        p.rstd = ptr(&rs), p.dy = ptr(&dy), p.dres_out = ptr(opt(dro));
        p.dx = ptr(&ddx), p.dz = ptr(&ddz), p.dweight = ptr(ddw), p.dbias = ptr(ddb);
        p.x_dtype = dt, p.w_dtype = wdt, p.b_dtype = wdt, p.res_dtype = rdt;
        p.dres_out_dtype = dro ? dro->desc.dtype : dt, p.rstd_dtype = stat;
        p.dw_dtype = ddw ? ddw->desc.dtype : wdt, p.db_dtype = ddb ? ddb->desc.dtype : wdt;
        p.rows = rows, p.D = D, p.group = G;
        p.x_rows = rows_of(&x), p.z_rows = rows_of(&z), p.res_rows = rows_of(opt(r)), p.rstd_rows = rows_of(&rs);
        p.dy_rows = rows_of(&dy), p.dres_out_rows = rows_of(opt(dro)), p.dx_rows = rows_of(&ddx);
        p.dz_rows = rows_of(&ddz), p.w_row = rows_of(opt(w)), p.b_row = rows_of(opt(b));
        p.dw_row = rows_of(ddw), p.db_row = rows_of(ddb);
        p.norm_before_gate = nbg != 0, p.act = act;
        return p;
      };
      HostTensor dxn = HostTensor::make(dt, shape), dzn = HostTensor::make(dt, shape);
      std::unique_ptr<HostTensor> dwn, dbn;
      if (dw) dwn = std::make_unique<HostTensor>(HostTensor::make(wdt, {D}));
      if (db) dbn = std::make_unique<HostTensor>(HostTensor::make(wdt, {D}));
      norm::rms_norm_gated_bwd_naive_f32(bwd_params(dxn, dzn, dwn.get(), dbn.get()));
      // The float64 expectations (and error scales) from f64 copies of the rounded inputs.
      std::vector<double> dx_ref, dz_ref, dw_ref, db_ref;
      norm::RmsNormGatedBwdMagnitudes mag;
      f64_backward(x, z, w.get(), b.get(), r.get(), rs, dy, dro.get(), rows, D, G, nbg, act, dx_ref, dz_ref, dw_ref,
                   db_ref, mag);

      Dev dv;
      for (HostTensor* t : {&x, &z, w.get(), b.get(), r.get(), &rs, &dy, dro.get(), &dx, &dz, dw.get(), db.get()})
        dv.t.push_back(t ? std::make_unique<DeviceTensor>(*t, device) : nullptr);
      strata_plan plan = nullptr;
      check(strata_rms_norm_gated_bwd_plan(dv.d(0), dv.d(1), dv.d(2), dv.d(3), dv.d(4), dv.d(5), dv.d(6), dv.d(7),
                                           dv.d(8), dv.d(9), dv.d(10), dv.d(11), group, nbg, act, &plan),
            "plan");
      res.impl = strata_plan_impl_name(plan);
      size_t ws = 0;
      strata_plan_workspace_size(plan, &ws);
      std::unique_ptr<DeviceTensor> wsbuf;
      if (ws > 0) {
        HostTensor h = HostTensor::make(STRATA_DTYPE_U8, {static_cast<int64_t>(ws)});
        h.poison();
        wsbuf = std::make_unique<DeviceTensor>(h, device);
      }
      void* t[12];
      for (size_t i = 0; i < 12; ++i) t[i] = dv.p(i);
      const strata_status st = strata_plan_run(plan, t, 12, wsbuf ? wsbuf->data() : nullptr, ws, nullptr);
      strata_plan_destroy(plan);
      check(st, "run");
      dv.t[8]->download(dx);
      dv.t[9]->download(dz);
      const double len = static_cast<double>(std::max<int64_t>(G, 1));
      res.compares.push_back(compare("dx", dx.values(), dx_ref, dxn.values(), dt, len, &mag.dx));
      res.compares.push_back(compare("dz", dz.values(), dz_ref, dzn.values(), dt, len, &mag.dz));
      const double rl = static_cast<double>(std::max<int64_t>(rows, 1));
      if (dw) {
        dv.t[10]->download(*dw);
        res.compares.push_back(compare("dweight", dw->values(), dw_ref, dwn->values(), wdt, rl, &mag.dw));
      }
      if (db) {
        dv.t[11]->download(*db);
        res.compares.push_back(compare("dbias", db->values(), db_ref, dbn->values(), wdt, rl, &mag.db));
      }
    }
    for (const auto& cmp : res.compares) res.pass = res.pass && cmp.pass;
    return res;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    const bool cuda = device.type == STRATA_DEVICE_CUDA;
    std::vector<BenchCase> out;
    // GDN output norm [T * 32 heads, 128] (PERF_TARGETS: [1048576, 128] on the H200), Mamba2-2.7B [T, 5120]
    // one group, grouped [T, 8192] G = 1024.
    out.push_back(bench(device, {cuda ? 1048576 : 262144, 128}, 128, 1));
    out.push_back(bench(device, {cuda ? 16384 : 4096, 5120}, 5120, 0));
    out.push_back(bench(device, {cuda ? 16384 : 4096, 8192}, 1024, 0));
    // CUDA: the GDN shape in gate_before_norm order, and the shapes once more with the implementations that
    // dispatch does not pick forced (compared in one run): forward the bulk-copy ring (forced only since
    // s6run2), the packed team forward (the default before team_stream), team_stream's one-pass grid and the
    // tiled bulk-copy forward (session 9),
    // backward group_rows where the ring is the default and the ring's wide rows at D = 5120.
    if (cuda) out.push_back(bench(device, {1048576, 128}, 128, 0));
    if (cuda && !bwd_) {
      out.push_back(bench(device, {1048576, 128}, 128, 1, "cuda.sm90.team_packed"));
      out.push_back(bench(device, {1048576, 128}, 128, 0, "cuda.sm90.team_packed"));
      out.push_back(bench(device, {1048576, 128}, 128, 1, "cuda.sm90.team_stream_flat"));
      out.push_back(bench(device, {1048576, 128}, 128, 1, "cuda.sm90.team_tma"));
      out.push_back(bench(device, {1048576, 128}, 128, 0, "cuda.sm90.team_tma"));
      out.push_back(bench(device, {1048576, 128}, 128, 1, "cuda.sm90.bulk_ring"));
      out.push_back(bench(device, {16384, 5120}, 5120, 0, "cuda.sm90.bulk_ring"));
      out.push_back(bench(device, {16384, 8192}, 1024, 0, "cuda.sm90.bulk_ring"));
    }
    if (cuda && bwd_) {
      out.push_back(bench(device, {1048576, 128}, 128, 1, "cuda.sm90.group_rows"));
      out.push_back(bench(device, {16384, 5120}, 5120, 0, "cuda.sm90.bulk_ring_wide"));
      out.push_back(bench(device, {16384, 8192}, 1024, 0, "cuda.sm90.group_rows"));
    }
    return out;
  }

 private:
  // float64 backward on f64 copies of the (rounded) inputs, so dx/dz/dw/db come back unrounded.
  static void f64_backward(const HostTensor& x, const HostTensor& z, const HostTensor* w,
                           const HostTensor* b, const HostTensor* r, const HostTensor& rs, const HostTensor& dy,
                           const HostTensor* dro, int64_t rows, int64_t D, int64_t G, int nbg, int32_t act,
                           std::vector<double>& dx, std::vector<double>& dz, std::vector<double>& dw,
                           std::vector<double>& db, norm::RmsNormGatedBwdMagnitudes& mag) {
    auto X = widen(&x), Z = widen(&z), W = widen(w), B = widen(b), R = widen(r), RS = widen(&rs), DY = widen(&dy),
         DRO = widen(dro);
    HostTensor DX = HostTensor::make(STRATA_DTYPE_F64, shape_of(x.desc)), DZ = DX;
    std::unique_ptr<HostTensor> DW, DB;
    if (w) DW = std::make_unique<HostTensor>(HostTensor::make(STRATA_DTYPE_F64, {D}));
    if (b) DB = std::make_unique<HostTensor>(HostTensor::make(STRATA_DTYPE_F64, {D}));
    RmsNormGatedBwdParams p;
    p.x = ptr(X.get()), p.z = ptr(Z.get()), p.weight = ptr(W.get()), p.bias = ptr(B.get()), p.residual = ptr(R.get());
    p.rstd = ptr(RS.get()), p.dy = ptr(DY.get()), p.dres_out = ptr(DRO.get());
    p.dx = ptr(&DX), p.dz = ptr(&DZ), p.dweight = ptr(DW.get()), p.dbias = ptr(DB.get());
    p.x_dtype = p.w_dtype = p.b_dtype = p.res_dtype = p.dres_out_dtype = p.rstd_dtype = p.dw_dtype = p.db_dtype =
        STRATA_DTYPE_F64;
    p.rows = rows, p.D = D, p.group = G;
    p.x_rows = rows_of(X.get()), p.z_rows = rows_of(Z.get()), p.res_rows = rows_of(R.get());
    p.rstd_rows = rows_of(RS.get()), p.dy_rows = rows_of(DY.get()), p.dres_out_rows = rows_of(DRO.get());
    p.dx_rows = rows_of(&DX), p.dz_rows = rows_of(&DZ), p.w_row = rows_of(W.get()), p.b_row = rows_of(B.get());
    p.dw_row = rows_of(DW.get()), p.db_row = rows_of(DB.get());
    p.norm_before_gate = nbg != 0, p.act = act;
    norm::rms_norm_gated_bwd_magnitudes(p, mag);
    dx = DX.values(), dz = DZ.values();
    dw = DW ? DW->values() : std::vector<double>{};
    db = DB ? DB->values() : std::vector<double>{};
  }

  struct BenchState {
    std::vector<std::unique_ptr<DeviceTensor>> t;
    std::unique_ptr<DeviceTensor> ws;
    size_t ws_size = 0;
    strata_plan plan = nullptr;
  };

  // impl: an implementation forced for the plan ("" the dispatched one).
  BenchCase bench(strata_device device, const std::vector<int64_t>& shape, int64_t G, int nbg,
                  const std::string& impl = "") const {
    const int32_t dt = STRATA_DTYPE_BF16;
    const int64_t rows = shape[0], D = shape[1], ng = D / G;
    auto state = std::make_shared<BenchState>();
    BenchCase bc;
    bc.label = fmt::format("{} bf16 [{}, {}] group={} {} weight=f32", op(), rows, D, G,
                           nbg ? "norm_before_gate" : "gate_before_norm") +
               (impl.empty() ? "" : " [" + impl + "]");
    const double n = static_cast<double>(rows * D) * 2.0, rbytes = static_cast<double>(rows * ng) * 4.0;
    // fwd: read x, z, write y, rstd; bwd: read x, z, dy, rstd, write dx, dz (dweight's partials not counted).
    bc.bytes = bwd_ ? 5 * n + rbytes : 3 * n + rbytes;
    const bool bwd = bwd_;
    bc.setup = [=] {
      HostTensor a = HostTensor::make(dt, shape), w = HostTensor::make(STRATA_DTYPE_F32, {D}),
                 rs = HostTensor::make(STRATA_DTYPE_F32, {rows, ng});
      std::mt19937_64 rng(7);
      a.fill_normal(rng, 0.0, 1.0);
      w.fill_normal(rng, 1.0, 0.1);
      rs.fill_uniform(rng, 0.5, 2.0);
      // fwd {x, z, w, y, rstd}; bwd {x, z, w, rstd, dy, dx, dz, dw}
      const int n_act = bwd ? 5 : 3;
      for (int i = 0; i < n_act; ++i) state->t.push_back(std::make_unique<DeviceTensor>(a, device));
      state->t.push_back(std::make_unique<DeviceTensor>(w, device));
      state->t.push_back(std::make_unique<DeviceTensor>(rs, device));
      if (bwd) state->t.push_back(std::make_unique<DeviceTensor>(w, device));
      auto d = [&](int i) { return &state->t[static_cast<size_t>(i)]->desc(); };
      ScopedForceImpl force(impl);  // for the plan only
      if (!bwd)
        check(strata_rms_norm_gated_fwd_plan(d(0), d(1), d(3), nullptr, nullptr, d(2), nullptr, d(4), 1e-6f, G, nbg,
                                             STRATA_GATE_SILU, &state->plan),
              "bench plan");
      else
        check(strata_rms_norm_gated_bwd_plan(d(0), d(1), d(5), nullptr, nullptr, d(6), d(2), nullptr, d(3), d(4),
                                             d(7), nullptr, G, nbg, STRATA_GATE_SILU, &state->plan),
              "bench plan");
      strata_plan_workspace_size(state->plan, &state->ws_size);
      if (state->ws_size) {
        HostTensor h = HostTensor::make(STRATA_DTYPE_U8, {static_cast<int64_t>(state->ws_size)});
        state->ws = std::make_unique<DeviceTensor>(h, device);
      }
    };
    bc.run = [=] {
      auto p = [&](int i) { return state->t[static_cast<size_t>(i)]->data(); };
      void* ws = state->ws ? state->ws->data() : nullptr;
      if (!bwd) {
        void* t[] = {p(0), p(1), p(3), nullptr, nullptr, p(2), nullptr, p(4)};
        check(strata_plan_run(state->plan, t, 8, ws, state->ws_size, nullptr), "bench run");
      } else {
        void* t[] = {p(0), p(1), p(5), nullptr, nullptr, p(6), p(2), nullptr, p(3), p(4), p(7), nullptr};
        check(strata_plan_run(state->plan, t, 12, ws, state->ws_size, nullptr), "bench run");
      }
    };
    bc.teardown = [state] {
      strata_plan_destroy(state->plan);
      state->t.clear();
      state->ws.reset();
    };
    return bc;
  }

  bool bwd_;
};

}  // namespace

std::unique_ptr<OpHarness> make_rms_norm_gated_fwd_harness() { return std::make_unique<RmsNormGatedHarness>(false); }
std::unique_ptr<OpHarness> make_rms_norm_gated_bwd_harness() { return std::make_unique<RmsNormGatedHarness>(true); }

}  // namespace strata::atk
