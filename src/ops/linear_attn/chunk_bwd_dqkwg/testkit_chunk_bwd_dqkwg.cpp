// ATK harness of chunk_bwd_dqkwg: conformance cases (gdn_bwd_kit::sweep plus dw / dg presence), the float64
// comparison through the op's reference, benchmark cases. Extra case keys: dw=0|1 (dv given, dw requested),
// dg=0|1 (dg requested; only with a gate).
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/testkit_gdn_bwd.h"

namespace strata::atk {
namespace {
using namespace gdn_bwd_kit;

constexpr const char* kOp = "chunk_bwd_dqkwg";

class DqkwgHarness final : public OpHarness {
 public:
  std::string op() const override { return kOp; }

  std::vector<Case> conformance_cases() const override {
    return sweep(kOp, [](Case& c, int64_t i) {
      c.set("dw", i % 4 != 3 ? 1 : 0);
      c.set("dg", i % 5 != 2 ? 1 : 0);
    });
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const GdnCase g = parse_case(c);
    const bool want_dw = c.get_int("dw", 1) != 0, want_dg = g.gate && c.get_int("dg", 1) != 0;
    CaseResult r;
    if (g.dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    std::mt19937_64 rng(g.seed);
    const int32_t gdt = g.dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    const int64_t NT = g.cu.empty() ? (g.T + g.BT - 1) / g.BT : total_chunks(g);
    HostTensor q = HostTensor::make(g.dt, {g.B, g.T, g.H, g.K}, g.layout());
    HostTensor k = HostTensor::make(g.dt, {g.B, g.T, g.H, g.K}, g.layout());
    HostTensor v = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor dO = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor h = HostTensor::make(g.dt, {g.B, NT, g.HV, g.K, g.V}, g.layout());
    HostTensor dh = HostTensor::make(g.dt, {g.B, NT, g.HV, g.K, g.V}, g.layout());
    HostTensor dv = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor gam = HostTensor::make(gdt, {g.B, g.T, g.HV}, g.layout());
    fill_unit_rows(q, rng);
    fill_unit_rows(k, rng);
    v.fill_normal(rng);
    dO.fill_normal(rng);
    h.fill_normal(rng, 0.0, 0.5);
    dh.fill_normal(rng, 0.0, 0.5);
    dv.fill_normal(rng);
    fill_gamma(gam, g, rng);
    HostTensor cu = cu_tensor(g.cu);
    Out dq(g.dt, {g.B, g.T, g.H, g.K}, g.layout()), dk(g.dt, {g.B, g.T, g.H, g.K}, g.layout()),
        dw(g.dt, {g.B, g.T, g.HV, g.K}, g.layout()), dg(gdt, {g.B, g.T, g.HV}, g.layout());
    std::vector<HostTensor*> ts = {&q,      &k,      &v,
                                   &dO,     &h,      &dh,
                                   want_dw ? &dv : nullptr, g.gate ? &gam : nullptr, g.cu.empty() ? nullptr : &cu,
                                   &dq.got, &dk.got, want_dw ? &dw.got : nullptr,
                                   want_dg ? &dg.got : nullptr};
    const Descs ds(ts, device);
    strata_plan plan = nullptr;
    check(strata_chunk_bwd_dqkwg_plan(ds.p[0], ds.p[1], ds.p[2], ds.p[3], ds.p[4], ds.p[5], ds.p[6], ds.p[7], ds.p[8],
                                      ds.p[9], ds.p[10], ds.p[11], ds.p[12], g.scale, g.BT, &plan),
          "plan");
    r.impl = strata_plan_impl_name(plan);
    const PrecisionModel pm = precision_of(plan);  // (how its outputs are judged)
    try {
      run_plan(plan, device, ts, {9, 10, 11, 12});
    } catch (...) {
      strata_plan_destroy(plan);
      throw;
    }
    strata_plan_destroy(plan);

    linear_attn::DqkwgParams p;
    p.d = dims_of(g, NT);
    p.d.cu = g.cu.empty() ? nullptr : reinterpret_cast<const int64_t*>(cu.storage.data());
    p.q = host_view(q), p.k = host_view(k), p.v = host_view(v), p.dout = host_view(dO);
    p.h = host_view(h), p.dh = host_view(dh);
    if (want_dw) p.dv = host_view(dv);
    if (g.gate) p.g = host_view(gam);
    p.scale = g.scale;
    auto outs = [&](bool ref) {
      p.dq = host_view(ref ? dq.ref : dq.naive);
      p.dk = host_view(ref ? dk.ref : dk.naive);
      if (want_dw) p.dw = host_view(ref ? dw.ref : dw.naive);
      if (want_dg) p.dg = host_view(ref ? dg.ref : dg.naive);
    };
    outs(true);
    linear_attn::chunk_bwd_dqkwg_reference(p);
    outs(false);
    linear_attn::chunk_bwd_dqkwg_reference_naive(p);
    const double len = static_cast<double>(g.V + g.BT);
    r.compares.push_back(compare_out("dq", dq, len, g.dt, pm));
    r.compares.push_back(compare_out("dk", dk, len, g.dt, pm));
    if (want_dw) r.compares.push_back(compare_out("dw", dw, len, g.dt, pm));
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
      // Per chunk and value head: dO Vn^T (2L^2V), dO S^T, Vn dS^T, dV S^T (3 x 2LKV), Ds K, Ds^T Q (2 x 2L^2K).
      const double flops = chunks * g.HV * (2 * L * L * V + 6 * L * K * V + 4 * L * L * K);
      const int64_t NT = (g.T + g.BT - 1) / g.BT;
      const double bytes = es * (g.B * g.T * (4.0 * g.H * K + 3.0 * g.HV * V + g.HV * K) +
                                 2.0 * g.B * NT * g.HV * K * V) +
                           4.0 * 2.0 * g.B * g.T * g.HV;
      auto make = [g, NT, dt] {
        std::mt19937_64 rng(7);
        std::vector<std::optional<HostTensor>> t;
        HostTensor q = as_dtype(randn({g.B, g.T, g.H, g.K}, rng, 1.0 / std::sqrt(static_cast<double>(g.K))), dt);
        HostTensor gm = HostTensor::make(STRATA_DTYPE_F32, {g.B, g.T, g.HV});
        fill_gamma(gm, g, rng);
        HostTensor v = as_dtype(randn({g.B, g.T, g.HV, g.V}, rng), dt);
        HostTensor s = as_dtype(randn({g.B, NT, g.HV, g.K, g.V}, rng, 0.5), dt);
        t.emplace_back(q), t.emplace_back(q), t.emplace_back(v), t.emplace_back(v), t.emplace_back(s);
        t.emplace_back(s), t.emplace_back(v), t.emplace_back(gm), t.emplace_back(std::nullopt);
        t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.H, g.K}));
        t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.H, g.K}));
        t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.HV, g.K}));
        t.emplace_back(HostTensor::make(STRATA_DTYPE_F32, {g.B, g.T, g.HV}));
        return t;
      };
      auto plan = [g](const std::vector<const strata_tensor_desc*>& d, strata_plan* p) {
        return strata_chunk_bwd_dqkwg_plan(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11],
                                           d[12], g.scale, g.BT, p);
      };
      out.push_back(bench_from(device, bench_label(kOp, g), flops, bytes, make, plan));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<OpHarness> make_chunk_bwd_dqkwg_harness() { return std::make_unique<DqkwgHarness>(); }

}  // namespace strata::atk
