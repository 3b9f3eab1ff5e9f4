#include "ops/norm/common/testkit_row_norm.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace strata::norm {
namespace {

using atk::Case;
using atk::CaseResult;
using atk::HostTensor;
using atk::DeviceTensor;

void ok(strata_status s, const char* what) { atk::check(s, what); }

std::vector<int64_t> leading(const std::vector<int64_t>& shape, bool keep_one) {
  std::vector<int64_t> s(shape.begin(), shape.end() - 1);
  if (keep_one) s.push_back(1);
  return s;
}

int32_t saved_dtype(int32_t x_dtype) { return x_dtype == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32; }

class RowNormHarness final : public atk::OpHarness {
 public:
  explicit RowNormHarness(const RowNormSpec& s) : s_(s) {}
  std::string op() const override { return s_.op; }

  std::vector<Case> conformance_cases() const override {
    // Row lengths cover each CUDA kernel shape (groups of 1..32 lanes, block-in-registers, looped) and the
    // CPU vector tails; 1/63/65/97/1025 are the bug-catching sizes of STYLE.md 10.
    const std::vector<std::vector<int64_t>> shapes = {
        {1, 1},    {63, 128}, {65, 63},  {97, 65},   {3, 5, 97}, {1025, 16}, {2, 1025},
        {9, 256},  {5, 1000}, {3, 4096}, {2, 17000}, {0, 128},   {4, 0},     {7}};
    std::vector<Case> cases;
    int64_t seed = 1;
    for (const char* dt : {"f32", "bf16", "f16", "f64"})
      for (const auto& shape : shapes)
        for (const char* layout : {"contiguous", "padded", "strided"})
          for (const char* mode : {"normalize", "factor"}) {
            if (std::string(layout) == "strided" && shape.size() == 2 && shape[1] > 1000) continue;
            const bool factor = std::string(mode) == "factor";
            if (factor && !s_.has_factor_mode) continue;
            Case c(s_.op);
            c.set("dtype", dt).set("shape", atk::shape_arg(shape)).set("layout", layout);
            if (s_.has_factor_mode) c.set("mode", mode);
            cases.push_back(c.set("seed", seed++));
          }
    return cases;
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const int32_t dt = atk::dtype_from_name(c.get("dtype"));
    CaseResult r;
    if (dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    const std::vector<int64_t> shape = c.get_shape("shape");
    const atk::Layout layout = atk::layout_from_name(c.get("layout"));
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));
    const float eps = static_cast<float>(c.get_double("eps", 1e-6));
    const int64_t D = shape.back();
    const int64_t rows = D > 0 ? HostTensor::make(dt, shape).numel() / D : 0;
    const int64_t n_div = s_.mean ? std::max<int64_t>(D, 1) : 1;
    const bool factor = c.get("mode") == "factor";
    const std::vector<int64_t> rshape = leading(shape, s_.mean);

    // x: 0.5 * randn + 0.3 as in the public tests, rounded to the dtype.
    HostTensor x = HostTensor::make(dt, shape, layout);
    x.fill_normal(rng, 0.3, 0.5);
    const std::vector<double> xv = x.values();

    // float64 forward of the rounded inputs.
    std::vector<double> y64(xv.size()), r64(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < D; ++j) ss += xv[i * D + j] * xv[i * D + j];
      r64[i] = 1.0 / std::sqrt(ss / static_cast<double>(n_div) + static_cast<double>(eps));
      for (int64_t j = 0; j < D; ++j) y64[i * D + j] = xv[i * D + j] * r64[i];
    }
    if (!s_.bwd) return run_fwd(c, device, dt, factor, shape, rshape, layout, eps, x, xv, y64, r64, rows, D, n_div);
    return run_bwd(device, dt, factor, shape, rshape, layout, rng, xv, y64, r64, rows, D, n_div);
  }

  std::vector<atk::BenchCase> bench_cases(strata_device device) const override {
    const bool cuda = device.type == STRATA_DEVICE_CUDA;
    const int64_t rows = cuda ? s_.cuda_rows : s_.cpu_rows, D = cuda ? s_.cuda_d : s_.cpu_d;
    std::vector<atk::BenchCase> out;
    for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F32}) {
      std::vector<Config> alts;
#if STRATA_WITH_CUDA
      // CUDA: the same shape once per alternative kernel configuration (forced), so one run compares the
      // default with the classic, streaming, packed and bulk-copy kernels (rows marked [cfg ...]).
      if (cuda) {
        const Params pr = params(dt, rows, D, nullptr);
        alts = s_.bwd ? row_norm_bwd_cuda_alternatives(pr.b) : row_norm_fwd_cuda_alternatives(pr.f);
      }
#endif
      // The rows of one dtype share their tensors (filled once: filling 2^26 random values on the host costs
      // seconds, timing a row milliseconds); the last row frees them.
      auto data = std::make_shared<BenchState>();
      out.push_back(bench(device, dt, rows, D, nullptr, data, alts.empty()));
      for (size_t i = 0; i < alts.size(); ++i)
        out.push_back(bench(device, dt, rows, D, &alts[i], data, i + 1 == alts.size()));
    }
    return out;
  }

 private:
#if STRATA_WITH_CUDA
  using Config = RowNormCudaConfig;
#else
  struct Config {};  // a CPU-only build has no forced kernel configurations
#endif
  struct BenchState {
    std::unique_ptr<DeviceTensor> a, b, c, r;
  };

#if STRATA_WITH_CUDA
  // Kernel parameters of the normalize-mode bench problem on dense [rows, D] tensors (st nullptr: aligned
  // stand-in pointers, enough to ask which configurations apply). fwd: x = a, y = b, r; bwd: src = a, r,
  // dout = b, dx = c.
  struct Params {
    RowNormFwdParams f;
    RowNormBwdParams b;
  };
  Params params(int32_t dt, int64_t rows, int64_t D, const BenchState* st) const {
    void* stand_in = reinterpret_cast<void*>(uintptr_t{1} << 12);
    auto ptr = [&](const std::unique_ptr<DeviceTensor>& t) { return st ? t->data() : stand_in; };
    RowLayout xl, rl;  // [rows, D] and one value per row ([rows] or [rows, 1]), both dense
    xl.nd = rl.nd = 1;
    xl.sizes[0] = rl.sizes[0] = rows;
    xl.strides[0] = D, rl.strides[0] = 1;
    Params p;
    p.f.x = ptr(st ? st->a : nullptr_tensor()), p.f.y = ptr(st ? st->b : nullptr_tensor());
    p.f.rstd = ptr(st ? st->r : nullptr_tensor());
    p.f.x_dtype = p.f.y_dtype = dt, p.f.rstd_dtype = STRATA_DTYPE_F32;
    p.f.rows = rows, p.f.D = D, p.f.n_div = s_.mean ? D : 1, p.f.eps = 1e-6f;
    p.f.x_rows = p.f.y_rows = xl, p.f.rstd_rows = rl;
    p.b.src = p.f.x, p.b.rstd = p.f.rstd, p.b.dout = p.f.y, p.b.dx = ptr(st ? st->c : nullptr_tensor());
    p.b.src_dtype = p.b.dout_dtype = p.b.dx_dtype = dt, p.b.rstd_dtype = STRATA_DTYPE_F32;
    p.b.rows = rows, p.b.D = D, p.b.n_div = p.f.n_div;
    p.b.kind = s_.mean ? RowNormBwdKind::kRawSrc : RowNormBwdKind::kNormalizedSrc;
    p.b.src_rows = p.b.dout_rows = p.b.dx_rows = xl, p.b.rstd_rows = rl;
    return p;
  }
  static const std::unique_ptr<DeviceTensor>& nullptr_tensor() {
    static const std::unique_ptr<DeviceTensor> none;
    return none;
  }
  static std::string cfg_name(const RowNormCudaConfig& c) {
    if (c.tpr == 0) return "looped";
    if (c.stream == 3)
      return fmt::format("bulk tpr={} stages={} rows/stage={}{}", c.tpr, c.nv, c.rpg,
                         c.hints & 1 ? (c.hints & 2 ? " cs-stores no-load-hint" : " cs-stores")
                                     : (c.hints & 2 ? " no-load-hint" : ""));
    if (c.stream == 5)
      return fmt::format("tma tpr={} nv={} rows/tile={}{}{}", c.tpr, c.nv, c.rpg, c.hints & 1 ? " ef-stores" : "",
                         c.hints & 2 ? " ef-loads" : "");
    if (c.stream == 4)
      return fmt::format("multi tpr={} nv={} rows={}{}{}{}", c.tpr, c.nv, c.rpg, c.hints & 1 ? " cs-stores" : "",
                         c.hints & 2 ? " ef-loads" : "",
                         c.blocks_per_sm ? fmt::format(" persistent x{}", c.blocks_per_sm) : std::string());
    const char* kind = c.stream == 2 ? "packed" : c.stream == 1 ? "stream" : "classic";
    return c.stream ? fmt::format("{} tpr={} nv={} rpg={}", kind, c.tpr, c.nv, c.rpg)
                    : fmt::format("{} ce={} tpr={} nv={} rpg={}", kind, c.chunk_elems, c.tpr, c.nv, c.rpg);
  }
#endif

  // One bench row: normalize mode through the plan (cfg nullptr) or, on CUDA, the kernels with `cfg` forced.
  // `state`: the tensors, allocated by the first row that runs and freed by the row marked `last`.
  atk::BenchCase bench(strata_device device, int32_t dt, int64_t rows, int64_t D, const Config* cfg,
                       std::shared_ptr<BenchState> state, bool last) const {
    const bool forced = cfg != nullptr;
    auto plan = std::make_shared<strata_plan>(nullptr);
    atk::BenchCase b;
    b.label = fmt::format("{} {} [{}, {}]", s_.op, dtype_name(dt), rows, D);
    const double e = static_cast<double>(dtype_size(dt)), n = static_cast<double>(rows * D);
    const double rbytes = static_cast<double>(rows) * 4;
    // Normalize mode. fwd: read x, write y and r; bwd: read src, dout and r, write dx.
    b.bytes = !s_.bwd ? 2 * n * e + rbytes : 3 * n * e + rbytes;
    b.setup = [=, this] {
      if (!state->a) {
        const std::vector<int64_t> shape = {rows, D};
        const std::vector<int64_t> rs = leading(shape, s_.mean);
        HostTensor a = HostTensor::make(dt, shape), r = HostTensor::make(STRATA_DTYPE_F32, rs);
        std::mt19937_64 rng(7);
        a.fill_normal(rng, 0.3, 0.5);
        r.fill_uniform(rng, 0.5, 2.0);
        state->a = std::make_unique<DeviceTensor>(a, device);
        state->b = std::make_unique<DeviceTensor>(a, device);
        state->c = std::make_unique<DeviceTensor>(a, device);
        state->r = std::make_unique<DeviceTensor>(r, device);
      }
      if (forced) return;
      if (!s_.bwd)
        ok(s_.plan_fwd(&state->a->desc(), &state->b->desc(), &state->r->desc(), 1e-6f, STRATA_RMSNORM_NORMALIZE,
                       plan.get()), "bench plan");
      else
        ok(s_.plan_bwd(&state->a->desc(), &state->r->desc(), &state->b->desc(), &state->c->desc(),
                       STRATA_RMSNORM_NORMALIZE, plan.get()), "bench plan");
    };
    if (!cfg) {
      b.run = [=, this] {
        void* fwd[] = {state->a->data(), state->b->data(), state->r->data()};
        void* bwd[] = {state->a->data(), state->r->data(), state->b->data(), state->c->data()};
        ok(s_.bwd ? strata_plan_run(*plan, bwd, 4, nullptr, 0, nullptr)
                  : strata_plan_run(*plan, fwd, 3, nullptr, 0, nullptr), "bench run");
      };
    } else {
#if STRATA_WITH_CUDA
      const RowNormCudaConfig c = *cfg;
      b.label += " [cfg " + cfg_name(c) + "]";
      auto prm = std::make_shared<Params>();
      const bool bwd = s_.bwd;
      b.run = [=, this] {
        if (!prm->f.x) *prm = params(dt, rows, D, state.get());  // the first call, after setup allocated
        const int st = bwd ? row_norm_bwd_cuda(prm->b, nullptr, &c) : row_norm_fwd_cuda(prm->f, nullptr, &c);
        ok(static_cast<strata_status>(st), "bench run (forced configuration)");
      };
#endif
    }
    b.teardown = [state, plan, last] {
      if (*plan) strata_plan_destroy(*plan);
      *plan = nullptr;
      if (last) state->a.reset(), state->b.reset(), state->c.reset(), state->r.reset();
    };
    return b;
  }

  CaseResult run_fwd(const Case& c, strata_device device, int32_t dt, bool factor, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& rshape, atk::Layout layout, float eps, const HostTensor& x,
                     const std::vector<double>& xv, const std::vector<double>& y64, const std::vector<double>& r64,
                     int64_t rows, int64_t D, int64_t n_div) const {
    const int32_t ydt = atk::dtype_from_name(c.get("ydtype", c.get("dtype")));
    HostTensor y = HostTensor::make(ydt, shape, layout), r = HostTensor::make(saved_dtype(dt), rshape, layout);
    y.poison();
    r.poison();
    DeviceTensor dx(x, device), dy(y, device), dr(r, device);
    strata_plan plan = nullptr;
    ok(s_.plan_fwd(&dx.desc(), factor ? nullptr : &dy.desc(), &dr.desc(), eps, factor, &plan), "plan");
    CaseResult res;
    res.impl = strata_plan_impl_name(plan);
    void* t[] = {dx.data(), factor ? nullptr : dy.data(), dr.data()};
    const strata_status st = strata_plan_run(plan, t, 3, nullptr, 0, nullptr);
    strata_plan_destroy(plan);
    ok(st, "run");
    dy.download(y);
    dr.download(r);
    // Naive same-dtype computation: f32 arithmetic in index order, one rounding to the output dtype.
    std::vector<double> yn(xv.size()), rn(r64.size());
    for (int64_t i = 0; i < rows; ++i) {
      float ss = 0.f;
      for (int64_t j = 0; j < D; ++j) ss += static_cast<float>(xv[i * D + j]) * static_cast<float>(xv[i * D + j]);
      const float rs = 1.0f / std::sqrt(ss / static_cast<float>(n_div) + eps);
      rn[i] = round_to(r.desc.dtype, rs);
      for (int64_t j = 0; j < D; ++j) yn[i * D + j] = round_to(ydt, static_cast<float>(xv[i * D + j]) * rs);
    }
    const double len = static_cast<double>(D);  // every output depends on a sum of D squares
    if (!factor) res.compares.push_back(atk::compare("y", y.values(), y64, yn, ydt, len));
    res.compares.push_back(atk::compare(s_.mean ? "r" : "rstd", r.values(), r64, rn, r.desc.dtype, len));
    for (const auto& cmp : res.compares) res.pass = res.pass && cmp.pass;
    return res;
  }

  CaseResult run_bwd(strata_device device, int32_t dt, bool factor, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& rshape, atk::Layout layout, std::mt19937_64& rng,
                     const std::vector<double>& xv, const std::vector<double>& y64, const std::vector<double>& r64,
                     int64_t rows, int64_t D, int64_t n_div) const {
    // Saved tensors as the forward would have stored them: src (y rounded to the dtype, or x) and r (f32).
    HostTensor src = HostTensor::make(dt, shape, layout), r = HostTensor::make(saved_dtype(dt), rshape, layout);
    const bool from_y = !s_.mean;  // l2norm differentiates from the saved y, rmsnorm from x
    for (int64_t e = 0; e < src.numel(); ++e) src.set(e, from_y ? y64[e] : xv[e]);
    for (int64_t i = 0; i < rows; ++i) r.set(i, r64[i]);
    HostTensor dout = HostTensor::make(dt, factor ? rshape : shape, layout);
    dout.fill_normal(rng);
    HostTensor dx = HostTensor::make(dt, shape, layout);
    dx.poison();
    const std::vector<double> sv = src.values(), rv = r.values(), gv = dout.values();
    DeviceTensor d_src(src, device), d_r(r, device), d_dout(dout, device), d_dx(dx, device);
    strata_plan plan = nullptr;
    ok(s_.plan_bwd(&d_src.desc(), &d_r.desc(), &d_dout.desc(), &d_dx.desc(), factor, &plan), "plan");
    CaseResult res;
    res.impl = strata_plan_impl_name(plan);
    void* t[] = {d_src.data(), d_r.data(), d_dout.data(), d_dx.data()};
    const strata_status st = strata_plan_run(plan, t, 4, nullptr, 0, nullptr);
    strata_plan_destroy(plan);
    ok(st, "run");
    d_dx.download(dx);
    // float64 reference and the naive f32 computation of the same formula from the same saved tensors.
    std::vector<double> ref(sv.size()), naive(sv.size()), magnitude(sv.size());
    for (int64_t i = 0; i < rows; ++i) {
      const double rs = rv[i];
      double dot = 0;
      float dotf = 0.f;
      if (!factor)
        for (int64_t j = 0; j < D; ++j) {
          dot += gv[i * D + j] * sv[i * D + j];
          dotf += static_cast<float>(gv[i * D + j]) * static_cast<float>(sv[i * D + j]);
        }
      const double nd = static_cast<double>(n_div);
      for (int64_t j = 0; j < D; ++j) {
        const double s = sv[i * D + j];
        const float sf = static_cast<float>(s), rf = static_cast<float>(rs);
        if (factor) {
          ref[i * D + j] = s * (-gv[i] * rs * rs * rs / nd);
          magnitude[i * D + j] = std::fabs(ref[i * D + j]);
          naive[i * D + j] = round_to(dt, sf * (-static_cast<float>(gv[i]) * rf * rf * rf / static_cast<float>(nd)));
        } else {
          const double c = from_y ? dot / nd : dot * rs * rs / nd;
          const float cf = from_y ? dotf / static_cast<float>(nd) : dotf * rf * rf / static_cast<float>(nd);
          const double g = gv[i * D + j];
          ref[i * D + j] = rs * (g - c * s);
          magnitude[i * D + j] = std::fabs(rs * g) + std::fabs(rs * c * s);  // the cancelling terms
          naive[i * D + j] = round_to(dt, rf * (static_cast<float>(g) - cf * sf));
        }
      }
    }
    res.compares.push_back(atk::compare("dx", dx.values(), ref, naive, dt, static_cast<double>(D), &magnitude));
    res.pass = res.compares.back().pass;
    return res;
  }

  RowNormSpec s_;
};

}  // namespace

std::unique_ptr<atk::OpHarness> make_row_norm_harness(const RowNormSpec& spec) {
  return std::make_unique<RowNormHarness>(spec);
}

}  // namespace strata::norm
