// ATK harness of chunk_bwd_dv_local: conformance cases (gdn_bwd_kit::sweep), the float64 comparison through
// the op's reference, benchmark cases. Case keys: see gdn_bwd_common/testkit_gdn_bwd.h.
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/gdn_bwd_common/testkit_gdn_bwd.h"

namespace strata::atk {
namespace {
using namespace gdn_bwd_kit;

constexpr const char* kOp = "chunk_bwd_dv_local";

class DvLocalHarness final : public OpHarness {
 public:
  std::string op() const override { return kOp; }

  std::vector<Case> conformance_cases() const override {
    return sweep(kOp, [](Case& c, int64_t i) {
      if (i % 5 == 4) c.set("scale", "1");
    });
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const GdnCase g = parse_case(c);
    CaseResult r;
    if (g.dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    std::mt19937_64 rng(g.seed);
    const int32_t gdt = g.dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    HostTensor q = HostTensor::make(g.dt, {g.B, g.T, g.H, g.K}, g.layout());
    HostTensor k = HostTensor::make(g.dt, {g.B, g.T, g.H, g.K}, g.layout());
    HostTensor dO = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor gam = HostTensor::make(gdt, {g.B, g.T, g.HV}, g.layout());
    fill_unit_rows(q, rng);
    fill_unit_rows(k, rng);
    dO.fill_normal(rng);
    fill_gamma(gam, g, rng);
    HostTensor cu = cu_tensor(g.cu);
    Out dv(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    std::vector<HostTensor*> ts = {&q, &k, &dO, g.gate ? &gam : nullptr, g.cu.empty() ? nullptr : &cu, &dv.got};
    const Descs ds(ts, device);
    strata_plan plan = nullptr;
    check(strata_chunk_bwd_dv_local_plan(ds.p[0], ds.p[1], ds.p[2], ds.p[3], ds.p[4], ds.p[5], g.scale, g.BT, &plan),
          "plan");
    r.impl = strata_plan_impl_name(plan);
    const PrecisionModel pm = precision_of(plan);  // (how its outputs are judged)
    try {
      run_plan(plan, device, ts, {5});
    } catch (...) {
      strata_plan_destroy(plan);
      throw;
    }
    strata_plan_destroy(plan);

    linear_attn::DvLocalParams p;
    p.d = dims_of(g);
    p.d.cu = g.cu.empty() ? nullptr : reinterpret_cast<const int64_t*>(cu.storage.data());
    p.q = host_view(q), p.k = host_view(k), p.dout = host_view(dO);
    if (g.gate) p.g = host_view(gam);
    p.scale = g.scale;
    p.dv = host_view(dv.ref);
    linear_attn::chunk_bwd_dv_local_reference(p);
    p.dv = host_view(dv.naive);
    linear_attn::chunk_bwd_dv_local_reference_naive(p);
    r.compares.push_back(compare_out("dv", dv, static_cast<double>(g.K + g.BT), g.dt, pm));
    r.pass = r.compares.back().pass;
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    std::vector<BenchCase> out;
    for (const int32_t dt : bench_dtypes()) {
      GdnCase g = bench_shape(device);
      g.dt = dt;
      const double L = g.BT, chunks = static_cast<double>(g.B * g.T) / L, es = static_cast<double>(dtype_size(dt));
      // Per chunk and value head: K Q^T (2 L^2 K) and B dO (2 L^2 V) as the kernels compute them.
      const double flops = chunks * g.HV * (2 * L * L * g.K + 2 * L * L * g.V);
      const double bytes = es * g.B * g.T * (2 * g.H * g.K + 2 * g.HV * g.V) + 4.0 * g.B * g.T * g.HV;
      auto make = [g, dt] {
        std::mt19937_64 rng(7);
        std::vector<std::optional<HostTensor>> t;
        HostTensor q = as_dtype(randn({g.B, g.T, g.H, g.K}, rng, 1.0 / std::sqrt(static_cast<double>(g.K))), dt);
        HostTensor gm = HostTensor::make(STRATA_DTYPE_F32, {g.B, g.T, g.HV});
        fill_gamma(gm, g, rng);
        t.emplace_back(q), t.emplace_back(q), t.emplace_back(as_dtype(randn({g.B, g.T, g.HV, g.V}, rng), dt));
        t.emplace_back(gm), t.emplace_back(std::nullopt), t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.HV, g.V}));
        return t;
      };
      auto plan = [g](const std::vector<const strata_tensor_desc*>& d, strata_plan* p) {
        return strata_chunk_bwd_dv_local_plan(d[0], d[1], d[2], d[3], d[4], d[5], g.scale, g.BT, p);
      };
      out.push_back(bench_from(device, bench_label(kOp, g), flops, bytes, make, plan));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<OpHarness> make_chunk_bwd_dv_local_harness() { return std::make_unique<DvLocalHarness>(); }

}  // namespace strata::atk
