// ATK harness of prepare_wy_repr_bwd: conformance cases (gdn_bwd_kit::sweep), the float64 comparison through
// the op's reference, benchmark cases. A is a random unit-lower-triangular matrix per chunk (0.1 N(0, 1)
// below the diagonal, fla's kernel test), zero above the diagonal and in the columns past a tail chunk's end.
#include "ops/linear_attn/gdn_bwd_common/testkit_gdn_bwd.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

namespace strata::atk {
namespace {
using namespace gdn_bwd_kit;

constexpr const char* kOp = "prepare_wy_repr_bwd";

void fill_unit_lower(HostTensor& A, const GdnCase& g, std::mt19937_64& rng) {
  std::normal_distribution<double> n01(0.0, 1.0);
  for (int64_t e = 0; e < A.numel(); ++e) A.set(e, 0.0);
  for (const SeqSpan& s : spans(g))
    for (int64_t t0 = s.bos; t0 < s.eos; t0 += g.BT)
      for (int64_t t = t0; t < std::min<int64_t>(t0 + g.BT, s.eos); ++t)
        for (int64_t hv = 0; hv < g.HV; ++hv)
          for (int64_t j = 0; j <= t - t0; ++j)
            A.set(((s.b * g.T + t) * g.HV + hv) * g.BT + j, j == t - t0 ? 1.0 : 0.1 * n01(rng));
}

class WyBwdHarness final : public OpHarness {
 public:
  std::string op() const override { return kOp; }

  std::vector<Case> conformance_cases() const override {
    std::vector<Case> cases = sweep(kOp, [](Case& c, int64_t i) { c.set("dg", i % 5 != 2 ? 1 : 0); });
    // The bench head sizes (bf16, K = V = 128, chunk size 64: the two-per-SM kernels): partial chunks with G = 2, a
    // variable-length pack, G = 1 without gate, a padded layout.
    int64_t seed = 1000;
    auto add = [&](std::vector<int64_t> shape, const std::vector<int64_t>& cu, int gate, const char* layout) {
      Case c = make_case(kOp, "bf16", std::move(shape), 64, cu, gate, 10.0, layout, seed++);
      c.set("dg", gate);
      cases.push_back(std::move(c));
    };
    add({2, 130, 2, 4, 128, 128}, {}, 1, "contiguous");
    add({1, 0, 2, 4, 128, 128}, {0, 63, 127, 129, 192, 200}, 1, "contiguous");
    add({1, 65, 1, 1, 128, 128}, {}, 0, "contiguous");
    add({1, 100, 1, 2, 128, 128}, {}, 1, "padded");
    return cases;
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const GdnCase g = parse_case(c);
    const bool want_dg = g.gate && c.get_int("dg", 1) != 0;
    CaseResult r;
    if (g.dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    std::mt19937_64 rng(g.seed);
    const int32_t gdt = g.dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    HostTensor k = HostTensor::make(g.dt, {g.B, g.T, g.H, g.K}, g.layout());
    HostTensor v = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor beta = HostTensor::make(g.dt, {g.B, g.T, g.HV}, g.layout());
    HostTensor A = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.BT}, g.layout());
    HostTensor dw = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.K}, g.layout());
    HostTensor du = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor gam = HostTensor::make(gdt, {g.B, g.T, g.HV}, g.layout());
    fill_unit_rows(k, rng);
    v.fill_normal(rng);
    fill_sigmoid(beta, rng);
    fill_unit_lower(A, g, rng);
    dw.fill_normal(rng);
    du.fill_normal(rng);
    fill_gamma(gam, g, rng);
    HostTensor cu = cu_tensor(g.cu);
    Out dk(g.dt, {g.B, g.T, g.H, g.K}, g.layout()), dv(g.dt, {g.B, g.T, g.HV, g.V}, g.layout()),
        db(g.dt, {g.B, g.T, g.HV}, g.layout()), dg(gdt, {g.B, g.T, g.HV}, g.layout());
    std::vector<HostTensor*> ts = {&k,      &v,      &beta,   &A, &dw, &du, g.gate ? &gam : nullptr,
                                   g.cu.empty() ? nullptr : &cu, &dk.got, &dv.got, &db.got,
                                   want_dg ? &dg.got : nullptr};
    const Descs ds(ts, device);
    strata_plan plan = nullptr;
    check(strata_prepare_wy_repr_bwd_plan(ds.p[0], ds.p[1], ds.p[2], ds.p[3], ds.p[4], ds.p[5], ds.p[6], ds.p[7],
                                          ds.p[8], ds.p[9], ds.p[10], ds.p[11], &plan),
          "plan");
    r.impl = strata_plan_impl_name(plan);
    const PrecisionModel pm = precision_of(plan);  // (how its outputs are judged)
    try {
      run_plan(plan, device, ts, {8, 9, 10, 11});
    } catch (...) {
      strata_plan_destroy(plan);
      throw;
    }
    strata_plan_destroy(plan);

    linear_attn::WyBwdParams p;
    p.d = dims_of(g);
    p.d.cu = g.cu.empty() ? nullptr : reinterpret_cast<const int64_t*>(cu.storage.data());
    p.k = host_view(k), p.v = host_view(v), p.beta = host_view(beta), p.A = host_view(A);
    p.dw = host_view(dw), p.du = host_view(du);
    if (g.gate) p.g = host_view(gam);
    auto outs = [&](bool ref) {
      p.dk = host_view(ref ? dk.ref : dk.naive);
      p.dv = host_view(ref ? dv.ref : dv.naive);
      p.dbeta = host_view(ref ? db.ref : db.naive);
      if (want_dg) p.dg = host_view(ref ? dg.ref : dg.naive);
    };
    outs(true);
    linear_attn::prepare_wy_repr_bwd_reference(p);
    outs(false);
    linear_attn::prepare_wy_repr_bwd_reference_naive(p);
    const double len = static_cast<double>(g.K + g.V + 2 * g.BT);
    r.compares.push_back(compare_out("dk", dk, len, g.dt, pm));
    r.compares.push_back(compare_out("dv", dv, len, g.dt, pm));
    r.compares.push_back(compare_out("dbeta", db, len * g.K, g.dt, pm));
    if (want_dg) r.compares.push_back(compare_out("dg", dg, len * g.K, g.dt, pm));
    r.pass = true;
    for (const Compare& cmp : r.compares) r.pass = r.pass && cmp.pass;
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    std::vector<BenchCase> out;
    for (const int32_t dt : bench_dtypes()) {
      GdnCase g = bench_shape(device);
      g.dt = dt;
      const double L = g.BT, chunks = static_cast<double>(g.B * g.T) / L, K = g.K, V = g.V;
      const double es = static_cast<double>(dtype_size(dt));
      // Per chunk and value head: A^T [dW|dU] and dA (2 x 2L^2(K+V)), A^T dA A^T (4L^3), dP K and dP^T βK
      // (2 x 2L^2K); plus K K^T per q/k head.
      const double flops =
          chunks * (g.HV * (4 * L * L * (K + V) + 4 * L * L * L + 4 * L * L * K) + g.H * 2 * L * L * K);
      // k, v, A, dw, du, dk, dv, beta, dbeta in the token dtype; γ, dγ in f32.
      const double bytes = es * g.B * g.T * (2.0 * g.H * K + 3.0 * g.HV * V + g.HV * K + g.HV * L + 2.0 * g.HV) +
                           4.0 * g.B * g.T * 2.0 * g.HV;
      auto make = [g, dt] {
        std::mt19937_64 rng(7);
        std::vector<std::optional<HostTensor>> t;
        HostTensor k = as_dtype(randn({g.B, g.T, g.H, g.K}, rng, 1.0 / std::sqrt(static_cast<double>(g.K))), dt);
        HostTensor gm = HostTensor::make(STRATA_DTYPE_F32, {g.B, g.T, g.HV}), beta = gm;
        fill_gamma(gm, g, rng);
        fill_sigmoid(beta, rng);
        HostTensor A = as_dtype(randn({g.B, g.T, g.HV, g.BT}, rng, 0.05), dt);  // timing only: any finite A
        HostTensor v = as_dtype(randn({g.B, g.T, g.HV, g.V}, rng), dt);
        t.emplace_back(k), t.emplace_back(v), t.emplace_back(as_dtype(beta, dt)), t.emplace_back(A);
        t.emplace_back(as_dtype(randn({g.B, g.T, g.HV, g.K}, rng), dt)), t.emplace_back(v), t.emplace_back(gm);
        t.emplace_back(std::nullopt), t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.H, g.K}));
        t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.HV, g.V}));
        t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.HV}));
        t.emplace_back(HostTensor::make(STRATA_DTYPE_F32, {g.B, g.T, g.HV}));
        return t;
      };
      auto plan = [](const std::vector<const strata_tensor_desc*>& d, strata_plan* p) {
        return strata_prepare_wy_repr_bwd_plan(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10],
                                               d[11], p);
      };
      out.push_back(bench_from(device, bench_label(kOp, g), flops, bytes, make, plan));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<OpHarness> make_prepare_wy_repr_bwd_harness() { return std::make_unique<WyBwdHarness>(); }

}  // namespace strata::atk
