// ATK harness of chunk_gated_delta_rule_bwd_dhu: conformance cases (gdn_bwd_kit::sweep plus dht / dh0
// presence), the float64 comparison through the op's reference, benchmark cases.
// Extra case keys: dht=0|1 (final-state gradient given), dh0=0|1 (initial-state gradient requested).
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/gdn_bwd_common/testkit_gdn_bwd.h"

namespace strata::atk {
namespace {
using namespace gdn_bwd_kit;

constexpr const char* kOp = "chunk_gated_delta_rule_bwd_dhu";

class DhuHarness final : public OpHarness {
 public:
  std::string op() const override { return kOp; }

  std::vector<Case> conformance_cases() const override {
    return sweep(kOp, [](Case& c, int64_t i) {
      c.set("dht", i % 3 != 1 ? 1 : 0);
      c.set("dh0", i % 4 != 2 ? 1 : 0);
    });
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const GdnCase g = parse_case(c);
    const bool has_dht = c.get_int("dht", 1) != 0, has_dh0 = c.get_int("dh0", 1) != 0;
    CaseResult r;
    if (g.dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    std::mt19937_64 rng(g.seed);
    const int32_t sdt = g.dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    const int64_t NT = g.cu.empty() ? (g.T + g.BT - 1) / g.BT : total_chunks(g);
    HostTensor q = HostTensor::make(g.dt, {g.B, g.T, g.H, g.K}, g.layout());
    HostTensor k = HostTensor::make(g.dt, {g.B, g.T, g.H, g.K}, g.layout());
    HostTensor w = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.K}, g.layout());
    HostTensor dO = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor dv = HostTensor::make(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    HostTensor gam = HostTensor::make(STRATA_DTYPE_F32, {g.B, g.T, g.HV}, g.layout());
    HostTensor dht = HostTensor::make(g.dt, {g.N(), g.HV, g.K, g.V}, g.layout());
    fill_unit_rows(q, rng);
    fill_unit_rows(k, rng);
    fill_unit_rows(w, rng);  // |w_i| = 1 / sqrt(BT) below: the state gradient stays O(1) over many chunks
    for (int64_t e = 0; e < w.numel(); ++e) w.set(e, w.get(e) / std::sqrt(static_cast<double>(g.BT)));
    dO.fill_normal(rng);
    dv.fill_normal(rng);
    fill_gamma(gam, g, rng);
    dht.fill_normal(rng);
    if (g.dt == STRATA_DTYPE_F64) gam = [&] {  // an all-f64 case (the reference)
      HostTensor t = HostTensor::make(STRATA_DTYPE_F64, {g.B, g.T, g.HV}, g.layout());
      for (int64_t e = 0; e < t.numel(); ++e) t.set(e, gam.get(e));
      return t;
    }();
    HostTensor cu = cu_tensor(g.cu);
    Out dh(g.dt, {g.B, NT, g.HV, g.K, g.V}, g.layout()), dh0(sdt, {g.N(), g.HV, g.K, g.V}, g.layout()),
        dv2(g.dt, {g.B, g.T, g.HV, g.V}, g.layout());
    std::vector<HostTensor*> ts = {&q, &k, &w, &dO, &dv, g.gate ? &gam : nullptr, has_dht ? &dht : nullptr,
                                   g.cu.empty() ? nullptr : &cu, &dh.got, has_dh0 ? &dh0.got : nullptr, &dv2.got};
    const Descs ds(ts, device);
    strata_plan plan = nullptr;
    check(strata_chunk_gated_delta_rule_bwd_dhu_plan(ds.p[0], ds.p[1], ds.p[2], ds.p[3], ds.p[4], ds.p[5], ds.p[6],
                                                     ds.p[7], ds.p[8], ds.p[9], ds.p[10], g.scale, g.BT, &plan),
          "plan");
    r.impl = strata_plan_impl_name(plan);
    const PrecisionModel pm = precision_of(plan);  // (how its outputs are judged)
    try {
      run_plan(plan, device, ts, {8, 9, 10});
    } catch (...) {
      strata_plan_destroy(plan);
      throw;
    }
    strata_plan_destroy(plan);

    linear_attn::DhuParams p;
    p.d = dims_of(g, NT);
    p.d.cu = g.cu.empty() ? nullptr : reinterpret_cast<const int64_t*>(cu.storage.data());
    p.q = host_view(q), p.k = host_view(k), p.w = host_view(w), p.dout = host_view(dO), p.dv = host_view(dv);
    if (g.gate) p.g = host_view(gam);
    if (has_dht) p.dht = host_view(dht);
    p.scale = g.scale;
    auto outs = [&](bool ref) {
      p.dh = host_view(ref ? dh.ref : dh.naive);
      p.dv2 = host_view(ref ? dv2.ref : dv2.naive);
      if (has_dh0) p.dh0 = host_view(ref ? dh0.ref : dh0.naive);
    };
    outs(true);
    linear_attn::chunk_gated_delta_rule_bwd_dhu_reference(p);
    outs(false);
    linear_attn::chunk_gated_delta_rule_bwd_dhu_reference_naive(p);
    const double len = static_cast<double>(g.K + 2 * g.BT);
    r.compares.push_back(compare_out("dh", dh, len, g.dt, pm));
    r.compares.push_back(compare_out("dv2", dv2, len, g.dt, pm));
    if (has_dh0) r.compares.push_back(compare_out("dh0", dh0, len, g.dt, pm));
    r.pass = true;
    for (const Compare& cmp : r.compares) r.pass = r.pass && cmp.pass;
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    std::vector<BenchCase> out;
    for (const int32_t dt : bench_dtypes()) {
      GdnCase g = bench_shape(device);
      g.dt = dt;
      const double L = g.BT, chunks = static_cast<double>(g.B * g.T) / L, es = static_cast<double>(dtype_size(dt));
      // Per chunk and value head: Kc dS (2 L K V) and the 2L-deep state update (4 L K V).
      const double flops = chunks * g.HV * 6 * L * g.K * g.V;
      const int64_t NT = (g.T + g.BT - 1) / g.BT;
      // q, k, w, do, dv, dv2 and dh in the token dtype, γ in f32 (dht, dh0: one state per sequence, not counted).
      const double bytes = es * (g.B * g.T * (2.0 * g.H * g.K + g.HV * g.K + 3.0 * g.HV * g.V) +
                                 static_cast<double>(g.B) * NT * g.HV * g.K * g.V) +
                           4.0 * g.B * g.T * g.HV;
      auto make = [g, NT, dt] {
        std::mt19937_64 rng(7);
        std::vector<std::optional<HostTensor>> t;
        HostTensor q = as_dtype(randn({g.B, g.T, g.H, g.K}, rng, 1.0 / std::sqrt(static_cast<double>(g.K))), dt);
        HostTensor gm = HostTensor::make(STRATA_DTYPE_F32, {g.B, g.T, g.HV});
        fill_gamma(gm, g, rng);
        HostTensor v = as_dtype(randn({g.B, g.T, g.HV, g.V}, rng), dt);
        t.emplace_back(q), t.emplace_back(q), t.emplace_back(as_dtype(randn({g.B, g.T, g.HV, g.K}, rng, 0.01), dt));
        t.emplace_back(v), t.emplace_back(v), t.emplace_back(gm);
        t.emplace_back(as_dtype(randn({g.B, g.HV, g.K, g.V}, rng), dt));
        t.emplace_back(std::nullopt), t.emplace_back(HostTensor::make(dt, {g.B, NT, g.HV, g.K, g.V}));
        t.emplace_back(HostTensor::make(STRATA_DTYPE_F32, {g.B, g.HV, g.K, g.V}));
        t.emplace_back(HostTensor::make(dt, {g.B, g.T, g.HV, g.V}));
        return t;
      };
      auto plan = [g](const std::vector<const strata_tensor_desc*>& d, strata_plan* p) {
        return strata_chunk_gated_delta_rule_bwd_dhu_plan(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9],
                                                          d[10], g.scale, g.BT, p);
      };
      out.push_back(bench_from(device, bench_label(kOp, g), flops, bytes, make, plan));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<OpHarness> make_chunk_gated_delta_rule_bwd_dhu_harness() { return std::make_unique<DhuHarness>(); }

}  // namespace strata::atk
