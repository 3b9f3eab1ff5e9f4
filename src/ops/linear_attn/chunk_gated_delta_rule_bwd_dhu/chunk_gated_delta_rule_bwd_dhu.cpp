// chunk_gated_delta_rule_bwd_dhu: definition, validation, implementation list and plans (ops_gdn_kda.md §4.10;
// chunk_gated_delta_rule_bwd_dhu.h, README.md beside this file).
// Tensors {q, k, w, do, dv, g|NULL, dht|NULL, cu_seqlens|NULL, dh, dh0|NULL, dv2}; attributes scale, chunk_size.
// Implementations: cuda.sm90.mma (bf16/f16), cuda.sm90.state_scan, cpu.<isa>, reference.
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"

#include <fmt/format.h>

#include "ops/linear_attn/gdn_bwd_common/dims.h"
#include "ops/linear_attn/gdn_bwd_common/impl_list.h"
#include "opbase/plan.h"
#include "runtime/runtime_internal.h"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;

constexpr const char* kOp = "chunk_gated_delta_rule_bwd_dhu";
enum { kQ, kK, kW, kDo, kDv, kG, kDht, kCu, kDh, kDh0, kDv2, kNumTensors };

struct Problem {
  DhuParams params;
  int64_t offs[kNumTensors] = {};
  bool has_cu = false;
  bool any_f64 = false;
  strata_device device{};
};

DhuParams bind(const Problem& pr, const Launch& l) {
  DhuParams p = pr.params;
  auto b = [&](View& v, int i) { v = bind_view(v, pr.offs[i], l.ptrs[i]); };
  b(p.q, kQ), b(p.k, kK), b(p.w, kW), b(p.dout, kDo), b(p.dv, kDv), b(p.g, kG), b(p.dht, kDht);
  b(p.dh, kDh), b(p.dh0, kDh0), b(p.dv2, kDv2);
  bind_cu(p.d, pr.has_cu, l.ptrs[kCu], pr.offs[kCu]);
  return p;
}

strata_status host_checks(const DhuParams& p) {
  STRATA_RETURN_IF_ERROR(check_cu_values(kOp, p.d));
  return check_chunk_count(kOp, "dh", p.d);
}

const ImplList<Problem>& impls() {
  static const ImplList<Problem> list = make_impls<Problem, DhuParams>({
      bind, chunk_gated_delta_rule_bwd_dhu_cpu, chunk_gated_delta_rule_bwd_dhu_reference, host_checks,
#if STRATA_WITH_CUDA
      "cuda.sm90.state_scan", chunk_gated_delta_rule_bwd_dhu_cuda_fma_workspace, chunk_gated_delta_rule_bwd_dhu_cuda_fma,
      "cuda.sm90.mma", chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject, chunk_gated_delta_rule_bwd_dhu_cuda_mma_workspace, chunk_gated_delta_rule_bwd_dhu_cuda_mma,
#endif
  });
  return list;
}

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc q = make_desc(STRATA_DTYPE_BF16, {1, 4096, 16, 128}, device);
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_BF16, {1, 4096, 32, 128}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {1, 4096, 32}, device);
  const strata_tensor_desc dh = make_desc(STRATA_DTYPE_BF16, {1, 64, 32, 128, 128}, device);
  return strata_chunk_gated_delta_rule_bwd_dhu_plan(&q, &q, &w, &w, &w, &g, nullptr, nullptr, &dh, nullptr, &w,
                                                    0.088f, 64, plan);
}

const OpRegistrar kRegister({kOp, [] { return impl_names_of(impls()); }, probe});

}  // namespace
}  // namespace strata::linear_attn

using namespace strata;
using namespace strata::linear_attn;
using namespace strata::linear_attn::gdn_bwd;

extern "C" strata_status strata_chunk_gated_delta_rule_bwd_dhu_plan(
    const strata_tensor_desc* q, const strata_tensor_desc* k, const strata_tensor_desc* w,
    const strata_tensor_desc* dout, const strata_tensor_desc* dv, const strata_tensor_desc* g,
    const strata_tensor_desc* dht, const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* dh,
    const strata_tensor_desc* dh0, const strata_tensor_desc* dv2, float scale, int32_t chunk_size,
    strata_plan* plan) {
  PlanKey key(kOp);
  key.add(q).add(k).add(w).add(dout).add(dv).add(g).add(dht).add(cu_seqlens).add(dh).add(dh0).add(dv2);
  key.add_attr(scale).add_attr(chunk_size);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    std::vector<Arg> args = {{"q", q, true, false, kFloatDtypes},
                             {"k", k, true, false, kFloatDtypes},
                             {"w", w, true, false, kFloatDtypes},
                             {"do", dout, true, false, kFloatDtypes},
                             {"dv", dv, true, false, kFloatDtypes},
                             {"g", g, false, false, kGateDtypes},
                             {"dht", dht, false, false, kFloatDtypes},
                             {"cu_seqlens", cu_seqlens, false, false, {STRATA_DTYPE_I64}},
                             {"dh", dh, true, true, kFloatDtypes},
                             {"dh0", dh0, false, true, kGateDtypes},
                             {"dv2", dv2, true, true, kFloatDtypes}};
    STRATA_RETURN_IF_ERROR(check_args_null_device_dtype(kOp, args));
    Problem pr;
    Dims& d = pr.params.d;
    STRATA_RETURN_IF_ERROR(derive_dims(kOp, "q", *q, "do", *dout, cu_seqlens, chunk_size, d));
    STRATA_RETURN_IF_ERROR(check_rank_in(kOp, "dh", *dh, 5, 5));
    STRATA_RETURN_IF_ERROR(check_chunk_size(kOp, chunk_size));  // NT below divides by it
    d.NT = cu_seqlens ? dh->shape[1] : (d.T + chunk_size - 1) / chunk_size;
    const std::vector<int64_t> qk = {d.B, d.T, d.H, d.K}, wk = {d.B, d.T, d.HV, d.K}, vs = {d.B, d.T, d.HV, d.V},
                               gs = {d.B, d.T, d.HV}, ss = {d.N, d.HV, d.K, d.V},
                               hs = {d.B, d.NT, d.HV, d.K, d.V};
    auto set = [&](int i, const std::vector<int64_t>& s, const char* how) { args[i].shape = s, args[i].how = how; };
    set(kQ, qk, "B, T, H, K"), set(kK, qk, "B, T, H, K"), set(kW, wk, "B, T, HV, K");
    set(kDo, vs, "B, T, HV, V"), set(kDv, vs, "B, T, HV, V"), set(kDv2, vs, "B, T, HV, V");
    set(kG, gs, "B, T, HV"), set(kDht, ss, "N, HV, K, V"), set(kDh0, ss, "N, HV, K, V");
    set(kDh, hs, cu_seqlens ? "1, NT, HV, K, V" : "B, ceil(T / chunk_size), HV, K, V");
    set(kCu, {d.N + 1}, "N + 1");
    args[kG].unit_last = args[kCu].unit_last = false;
    STRATA_RETURN_IF_ERROR(check_args_shape_stride(kOp, args));
    STRATA_RETURN_IF_ERROR(check_scale(kOp, scale));

    DhuParams& p = pr.params;
    p.q = view_template(q), p.k = view_template(k), p.w = view_template(w), p.dout = view_template(dout);
    p.dv = view_template(dv), p.g = view_template(g), p.dht = view_template(dht), p.dh = view_template(dh);
    p.dh0 = view_template(dh0), p.dv2 = view_template(dv2);
    p.scale = scale;
    const std::vector<const strata_tensor_desc*> ts{q, k, w, dout, dv, g, dht, cu_seqlens, dh, dh0, dv2};
    for (int i = 0; i < kNumTensors; ++i) pr.offs[i] = ts[i] ? ts[i]->offset : 0;
    pr.has_cu = cu_seqlens != nullptr;
    d.cu_stride = cu_seqlens ? cu_seqlens->strides[0] : 1;
    pr.any_f64 = any_f64({q, k, w, dout, dv, g, dht, dh, dh0, dv2});
    pr.device = q->device;
    const std::string summary = fmt::format(
        "q:{} k:{} w:{} do:{} dv:{} g:{} dht:{} cu_seqlens:{} dh:{} dh0:{} dv2:{} scale={} chunk_size={}",
        desc_str(*q), desc_str(*k), desc_str(*w), desc_str(*dout), desc_str(*dv), g ? desc_str(*g) : "none",
        dht ? desc_str(*dht) : "none", cu_seqlens ? desc_str(*cu_seqlens) : "none", desc_str(*dh),
        dh0 ? desc_str(*dh0) : "none", desc_str(*dv2), scale, chunk_size);
    // Nothing to compute when there is no value-head element and no state element.
    const bool empty = numel(*dv2) == 0 && numel(*dh) == 0 && (!dh0 || numel(*dh0) == 0);
    const PlanInfo info{kOp, ts, given_mask_of(ts), q->device, summary, empty};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}
