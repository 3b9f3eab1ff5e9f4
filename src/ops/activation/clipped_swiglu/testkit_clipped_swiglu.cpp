// ATK harness of clipped_swiglu (forward and backward): conformance cases, the float64 comparison, benchmark
// cases.
//
// A case line: "clipped_swiglu_fwd dtype=bf16 shape=65x256 variant=gptoss layout=interleaved probs=f32
// view=rowpad seed=3". variant: gptoss (alpha 1.702, limit 7, bias 1) | deepseek (alpha 1, limit 10, bias 0) |
// custom (alpha 0.5, limit 3, bias -0.5); layout: interleaved | split; probs: none | f32 | same. Views of x,
// y, dx, dy: contiguous, rowpad (rows padded by 8, 16-byte aligned: the CUDA vector path), padded / strided
// (atk::Layout: element-wise paths). Inputs: N(0, 4) with some values set exactly to +-limit (the clamp
// boundaries, where the gradient passes) and some far beyond (saturated, zero gradient).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ops/activation/clipped_swiglu/clipped_swiglu.h"
#include "testkit/testkit.h"

namespace strata::atk {
namespace {

using activation::ClippedSwigluBwdParams;
using activation::ClippedSwigluFwdParams;

HostTensor make_v(int32_t dtype, const std::vector<int64_t>& shape, const std::string& view) {
  if (view != "rowpad") return HostTensor::make(dtype, shape, layout_from_name(view));
  HostTensor t;
  t.desc.dtype = dtype;
  t.desc.rank = static_cast<int32_t>(shape.size());
  t.desc.device = {STRATA_DEVICE_CPU, 0};
  t.desc.offset = 8;
  int64_t stride = 1;
  bool empty = false;
  for (int i = t.desc.rank - 1; i >= 0; --i) {
    t.desc.shape[i] = shape[i];
    t.desc.strides[i] = stride;
    stride *= i == t.desc.rank - 1 ? shape[i] + 8 : shape[i];
    if (shape[i] == 0) empty = true;
  }
  int64_t span = t.desc.offset + 1;
  for (int i = 0; i < t.desc.rank; ++i) span += (shape[i] - 1) * t.desc.strides[i];
  t.storage.assign(static_cast<size_t>(empty ? 1 : span) * dtype_size(dtype), 0);
  return t;
}

std::unique_ptr<HostTensor> widen(const HostTensor* t) {
  if (!t) return nullptr;
  auto o = std::make_unique<HostTensor>(HostTensor::make(STRATA_DTYPE_F64, shape_of(t->desc)));
  const std::vector<double> v = t->values();
  for (int64_t e = 0; e < t->numel(); ++e) o->set(e, v[e]);
  return o;
}
RowLayout rows_of(const HostTensor* t, int inner) { return t ? make_row_layout(t->desc, inner) : RowLayout{}; }
void* ptr(HostTensor* t) { return t ? t->storage.data() : nullptr; }

struct Variant {
  float alpha, limit, bias;
};
Variant variant_of(const std::string& v) {
  if (v == "deepseek") return {1.f, 10.f, 0.f};
  if (v == "custom") return {0.5f, 3.f, -0.5f};
  return {1.702f, 7.f, 1.f};
}

class ClippedSwigluHarness final : public OpHarness {
 public:
  explicit ClippedSwigluHarness(bool bwd) : bwd_(bwd) {}
  std::string op() const override { return bwd_ ? "clipped_swiglu_bwd" : "clipped_swiglu_fwd"; }

  std::vector<Case> conformance_cases() const override {
    std::vector<Case> cases;
    int64_t seed = 1;
    auto add = [&](const char* dt, const std::vector<int64_t>& shape, const char* variant, const char* layout,
                   const char* probs, const char* view) {
      cases.push_back(Case(op())
                          .set("dtype", dt)
                          .set("shape", shape_arg(shape))
                          .set("variant", variant)
                          .set("layout", layout)
                          .set("probs", probs)
                          .set("view", view)
                          .set("seed", seed++));
    };
    // Every option combination on one shape per dtype.
    for (const char* dt : {"f32", "bf16", "f16", "f64"})
      for (const char* variant : {"gptoss", "deepseek", "custom"})
        for (const char* layout : {"interleaved", "split"})
          for (const char* probs : {"none", "f32", "same"})
            for (const char* view : {"contiguous", "rowpad", "strided"}) add(dt, {33, 96}, variant, layout, probs, view);
    // Sizes: 2I in {2, 126, 130, 194, 2050} (I = 1, 63, 65, 97, 1025), GPT-OSS and DeepSeek widths, 3-D inputs,
    // empty tensors.
    const std::vector<std::vector<int64_t>> shapes = {{1, 2},    {63, 126}, {65, 130}, {97, 194}, {3, 2050},
                                                      {5, 5760}, {4, 4096}, {2, 3, 16}, {1025, 16}, {7, 2},
                                                      {0, 64},   {4, 0},    {2, 0, 8}};
    const char* variants[] = {"gptoss", "deepseek", "custom"};
    const char* probs[] = {"none", "f32", "same"};
    int rot = 0;
    for (const char* dt : {"f32", "bf16", "f16", "f64"})
      for (const auto& shape : shapes)
        for (const char* layout : {"interleaved", "split"})
          for (const char* view : {"contiguous", "rowpad", "padded"}) {
            add(dt, shape, variants[rot % 3], layout, probs[(rot / 3) % 3], view);
            ++rot;
          }
    // CUDA only (big): enough rows that every CTA of the persistent bulk-copy ring takes more tiles than the
    // ring has stages (the stage reuse and mbarrier parity flips), dense rows (one copy per tile) and padded
    // rows (one copy per row), both layouts, 16-bit and f32. Sized just past that point (~1250 tiles over 264
    // CTAs with 4 stages; s6run2's atk of the forward, which also runs these, hit its 25 s cap with larger ones).
    add("bf16", {120000, 128}, "gptoss", "interleaved", "none", "contiguous");
    cases.back().set("gpu_only", 1);
    add("bf16", {60000, 256}, "deepseek", "split", "f32", "rowpad");
    cases.back().set("gpu_only", 1);
    add("f32", {30000, 256}, "custom", "interleaved", "same", "contiguous");
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
    const Variant v = variant_of(c.get("variant", "gptoss"));
    const bool inter = c.get("layout", "interleaved") == "interleaved";
    const std::string popt = c.get("probs", "none"), view = c.get("view", "contiguous");
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));
    std::vector<int64_t> half = shape, lead(shape.begin(), shape.end() - 1);
    half.back() /= 2;
    const int64_t I = half.back();
    int64_t rows = 1;
    for (int64_t d : lead) rows *= d;
    const int32_t pdt = popt == "same" ? dt : (dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32);

    HostTensor x = make_v(dt, shape, view);
    x.fill_normal(rng, 0.0, 4.0);
    // Clamp boundaries and saturation: every 7th value exactly +-limit, every 11th far beyond.
    for (int64_t e = 0; e < x.numel(); ++e) {
      if (e % 7 == 3) x.set(e, (e % 2 ? -1.0 : 1.0) * v.limit);
      if (e % 11 == 5) x.set(e, (e % 2 ? -3.0 : 3.0) * v.limit);
    }
    std::unique_ptr<HostTensor> pr;
    if (popt != "none") {
      pr = std::make_unique<HostTensor>(HostTensor::make(pdt, lead));
      pr->fill_uniform(rng, 0.05, 1.0);
    }

    if (!bwd_) {
      HostTensor y = make_v(dt, half, view);
      y.poison();
      HostTensor yn = HostTensor::make(dt, half), Y = HostTensor::make(STRATA_DTYPE_F64, half);
      auto params = [&](HostTensor& xx, HostTensor* pp, HostTensor& yy) {
        ClippedSwigluFwdParams p;
        p.x = ptr(&xx), p.probs = ptr(pp), p.y = ptr(&yy);
        p.x_dtype = xx.desc.dtype, p.probs_dtype = pp ? pp->desc.dtype : STRATA_DTYPE_F32;
        p.rows = rows, p.I = I;
        p.x_rows = rows_of(&xx, 1), p.y_rows = rows_of(&yy, 1), p.probs_rows = rows_of(pp, 0);
        p.alpha = v.alpha, p.limit = v.limit, p.bias = v.bias, p.interleaved = inter;
        return p;
      };
      activation::clipped_swiglu_fwd_naive_f32(params(x, pr.get(), yn));
      auto X = widen(&x), P = widen(pr.get());
      activation::clipped_swiglu_fwd_reference(params(*X, P.get(), Y));
      DeviceTensor dxt(x, device), dyt(y, device);
      std::unique_ptr<DeviceTensor> dp = pr ? std::make_unique<DeviceTensor>(*pr, device) : nullptr;
      strata_plan plan = nullptr;
      check(strata_clipped_swiglu_fwd_plan(&dxt.desc(), dp ? &dp->desc() : nullptr, &dyt.desc(), v.alpha, v.limit,
                                           v.bias, inter ? 1 : 0, &plan),
            "plan");
      res.impl = strata_plan_impl_name(plan);
      void* t[] = {dxt.data(), dp ? dp->data() : nullptr, dyt.data()};
      const strata_status st = strata_plan_run(plan, t, 3, nullptr, 0, nullptr);
      strata_plan_destroy(plan);
      check(st, "run");
      dyt.download(y);
      res.compares.push_back(compare("y", y.values(), Y.values(), yn.values(), dt));
    } else {
      HostTensor dy = make_v(dt, half, view);
      dy.fill_normal(rng, 0.0, 1.0);
      HostTensor dx = make_v(dt, shape, view);
      dx.poison();
      std::unique_ptr<HostTensor> dpr;
      if (pr) {
        dpr = std::make_unique<HostTensor>(HostTensor::make(pdt, lead));
        dpr->poison();
      }
      auto params = [&](HostTensor& xx, HostTensor* pp, HostTensor& gg, HostTensor& ddx, HostTensor* ddp) {
        ClippedSwigluBwdParams p;
        p.x = ptr(&xx), p.probs = ptr(pp), p.dy = ptr(&gg), p.dx = ptr(&ddx), p.dprobs = ptr(ddp);
        p.x_dtype = xx.desc.dtype, p.probs_dtype = pp ? pp->desc.dtype : STRATA_DTYPE_F32;
        p.dprobs_dtype = ddp ? ddp->desc.dtype : STRATA_DTYPE_F32;
        p.rows = rows, p.I = I;
        p.x_rows = rows_of(&xx, 1), p.dy_rows = rows_of(&gg, 1), p.dx_rows = rows_of(&ddx, 1);
        p.probs_rows = rows_of(pp, 0), p.dprobs_rows = rows_of(ddp, 0);
        p.alpha = v.alpha, p.limit = v.limit, p.bias = v.bias, p.interleaved = inter;
        return p;
      };
      HostTensor dxn = HostTensor::make(dt, shape), DX = HostTensor::make(STRATA_DTYPE_F64, shape);
      std::unique_ptr<HostTensor> dpn, DP;
      if (pr) {
        dpn = std::make_unique<HostTensor>(HostTensor::make(pdt, lead));
        DP = std::make_unique<HostTensor>(HostTensor::make(STRATA_DTYPE_F64, lead));
      }
      activation::clipped_swiglu_bwd_naive_f32(params(x, pr.get(), dy, dxn, dpn.get()));
      auto X = widen(&x), P = widen(pr.get()), G = widen(&dy);
      activation::clipped_swiglu_bwd_reference(params(*X, P.get(), *G, DX, DP.get()));
      DeviceTensor d_x(x, device), d_dy(dy, device), d_dx(dx, device);
      std::unique_ptr<DeviceTensor> d_p = pr ? std::make_unique<DeviceTensor>(*pr, device) : nullptr;
      std::unique_ptr<DeviceTensor> d_dp = dpr ? std::make_unique<DeviceTensor>(*dpr, device) : nullptr;
      strata_plan plan = nullptr;
      check(strata_clipped_swiglu_bwd_plan(&d_x.desc(), d_p ? &d_p->desc() : nullptr, &d_dy.desc(), &d_dx.desc(),
                                           d_dp ? &d_dp->desc() : nullptr, v.alpha, v.limit, v.bias, inter ? 1 : 0,
                                           &plan),
            "plan");
      res.impl = strata_plan_impl_name(plan);
      void* t[] = {d_x.data(), d_p ? d_p->data() : nullptr, d_dy.data(), d_dx.data(), d_dp ? d_dp->data() : nullptr};
      const strata_status st = strata_plan_run(plan, t, 5, nullptr, 0, nullptr);
      strata_plan_destroy(plan);
      check(st, "run");
      d_dx.download(dx);
      res.compares.push_back(compare("dx", dx.values(), DX.values(), dxn.values(), dt));
      if (dpr) {
        d_dp->download(*dpr);
        // A sum of I products of both signs: errors are measured against the sum of their sizes.
        std::vector<double> mag(static_cast<size_t>(rows), 0.0);
        {
          HostTensor Y = HostTensor::make(STRATA_DTYPE_F64, half);
          ClippedSwigluFwdParams f;
          f.x = X->storage.data(), f.y = Y.storage.data(), f.x_dtype = STRATA_DTYPE_F64;
          f.rows = rows, f.I = I, f.x_rows = rows_of(X.get(), 1), f.y_rows = rows_of(&Y, 1);
          f.alpha = v.alpha, f.limit = v.limit, f.bias = v.bias, f.interleaved = inter;
          activation::clipped_swiglu_fwd_reference(f);
          const std::vector<double> yv = Y.values(), gv = G->values();
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < I; ++i) mag[r] += std::fabs(yv[r * I + i] * gv[r * I + i]);
        }
        res.compares.push_back(compare("dprobs", dpr->values(), DP->values(), dpn->values(), pdt,
                                       static_cast<double>(std::max<int64_t>(I, 1)), &mag));
      }
    }
    for (const auto& cmp : res.compares) res.pass = res.pass && cmp.pass;
    return res;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    const bool cuda = device.type == STRATA_DEVICE_CUDA;
    std::vector<BenchCase> out;
    // PERF_TARGETS: GPT-OSS N = 32768 rows, interleaved 2 x 2880; DeepSeek-V4-Flash split [rows, 4096].
    out.push_back(bench(device, cuda ? 32768 : 8192, 2880, true, variant_of("gptoss")));
    out.push_back(bench(device, cuda ? 32768 : 8192, 2048, false, variant_of("deepseek")));
    // CUDA forward: both shapes once more with the previous kernels and session 9's tiled bulk-copy kernel forced
    // (the default is the bulk-copy ring; compared in one run).
    if (cuda && !bwd_) {
      out.push_back(bench(device, 32768, 2880, true, variant_of("gptoss"), "cuda.sm90.pairwise"));
      out.push_back(bench(device, 32768, 2048, false, variant_of("deepseek"), "cuda.sm90.pairwise"));
      out.push_back(bench(device, 32768, 2880, true, variant_of("gptoss"), "cuda.sm90.tile_tma"));
      out.push_back(bench(device, 32768, 2048, false, variant_of("deepseek"), "cuda.sm90.tile_tma"));
    }
    return out;
  }

 private:
  struct BenchState {
    std::vector<std::unique_ptr<DeviceTensor>> t;
    strata_plan plan = nullptr;
  };

  // impl: an implementation forced for the plan ("" the dispatched one).
  BenchCase bench(strata_device device, int64_t rows, int64_t I, bool inter, Variant v,
                  const std::string& impl = "") const {
    const int32_t dt = STRATA_DTYPE_BF16;
    auto state = std::make_shared<BenchState>();
    BenchCase bc;
    bc.label = fmt::format("{} bf16 [{}, {}] -> [{}, {}] {}", op(), rows, 2 * I, rows, I,
                           inter ? "interleaved alpha=1.702 limit=7" : "split alpha=1 limit=10") +
               (impl.empty() ? "" : " [" + impl + "]");
    const double n = static_cast<double>(rows * I) * 2.0;
    // fwd: read x (2n), write y (n); bwd: read x (2n), dy (n), write dx (2n).
    bc.bytes = bwd_ ? 5 * n : 3 * n;
    const bool bwd = bwd_;
    bc.setup = [=] {
      HostTensor x = HostTensor::make(dt, {rows, 2 * I}), y = HostTensor::make(dt, {rows, I});
      std::mt19937_64 rng(7);
      x.fill_normal(rng, 0.0, 4.0);
      y.fill_normal(rng, 0.0, 1.0);
      state->t.push_back(std::make_unique<DeviceTensor>(x, device));
      state->t.push_back(std::make_unique<DeviceTensor>(y, device));
      if (bwd) state->t.push_back(std::make_unique<DeviceTensor>(x, device));
      ScopedForceImpl force(impl);  // for the plan only
      if (!bwd)
        check(strata_clipped_swiglu_fwd_plan(&state->t[0]->desc(), nullptr, &state->t[1]->desc(), v.alpha, v.limit,
                                             v.bias, inter, &state->plan),
              "bench plan");
      else
        check(strata_clipped_swiglu_bwd_plan(&state->t[0]->desc(), nullptr, &state->t[1]->desc(),
                                             &state->t[2]->desc(), nullptr, v.alpha, v.limit, v.bias, inter,
                                             &state->plan),
              "bench plan");
    };
    bc.run = [=] {
      if (!bwd) {
        void* t[] = {state->t[0]->data(), nullptr, state->t[1]->data()};
        check(strata_plan_run(state->plan, t, 3, nullptr, 0, nullptr), "bench run");
      } else {
        void* t[] = {state->t[0]->data(), nullptr, state->t[1]->data(), state->t[2]->data(), nullptr};
        check(strata_plan_run(state->plan, t, 5, nullptr, 0, nullptr), "bench run");
      }
    };
    bc.teardown = [state] {
      strata_plan_destroy(state->plan);
      state->t.clear();
    };
    return bc;
  }

  bool bwd_;
};

}  // namespace

std::unique_ptr<OpHarness> make_clipped_swiglu_fwd_harness() { return std::make_unique<ClippedSwigluHarness>(false); }
std::unique_ptr<OpHarness> make_clipped_swiglu_bwd_harness() { return std::make_unique<ClippedSwigluHarness>(true); }

}  // namespace strata::atk
