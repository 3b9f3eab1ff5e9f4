// chunk_bwd_dv_local: definition, validation, implementation list and plans (ops_gdn_kda.md §4.9;
// chunk_bwd_dv_local.h, README.md beside this file).
// Tensors {q, k, do, g (or NULL), cu_seqlens (or NULL), dv}; attributes scale, chunk_size.
// Implementations: cuda.sm90.mma (bf16/f16), cuda.sm90.chunk_tile, cpu.<isa>, reference.
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"

#include <fmt/format.h>

#include "ops/linear_attn/gdn_bwd_common/dims.h"
#include "ops/linear_attn/gdn_bwd_common/impl_list.h"
#include "opbase/plan.h"
#include "runtime/runtime_internal.h"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;

constexpr const char* kOp = "chunk_bwd_dv_local";
enum { kQ, kK, kDo, kG, kCu, kDv, kNumTensors };

struct Problem {
  DvLocalParams params;
  int64_t offs[kNumTensors] = {};
  bool has_cu = false;
  bool any_f64 = false;
  strata_device device{};
};

DvLocalParams bind(const Problem& pr, const Launch& l) {
  DvLocalParams p = pr.params;
  p.q = bind_view(p.q, pr.offs[kQ], l.ptrs[kQ]);
  p.k = bind_view(p.k, pr.offs[kK], l.ptrs[kK]);
  p.dout = bind_view(p.dout, pr.offs[kDo], l.ptrs[kDo]);
  p.g = bind_view(p.g, pr.offs[kG], l.ptrs[kG]);
  p.dv = bind_view(p.dv, pr.offs[kDv], l.ptrs[kDv]);
  bind_cu(p.d, pr.has_cu, l.ptrs[kCu], pr.offs[kCu]);
  return p;
}

strata_status host_checks(const DvLocalParams& p) { return check_cu_values(kOp, p.d); }

const ImplList<Problem>& impls() {
  static const ImplList<Problem> list = make_impls<Problem, DvLocalParams>({
      bind, chunk_bwd_dv_local_cpu, chunk_bwd_dv_local_reference, host_checks,
#if STRATA_WITH_CUDA
      "cuda.sm90.chunk_tile", chunk_bwd_dv_local_cuda_fma_workspace, chunk_bwd_dv_local_cuda_fma,
      "cuda.sm90.mma", chunk_bwd_dv_local_cuda_mma_reject, chunk_bwd_dv_local_cuda_mma_workspace, chunk_bwd_dv_local_cuda_mma,
#endif
  });
  return list;
}

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc q = make_desc(STRATA_DTYPE_BF16, {1, 4096, 16, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 32, 128}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {1, 4096, 32}, device);
  return strata_chunk_bwd_dv_local_plan(&q, &q, &v, &g, nullptr, &v, 0.088f, 64, plan);
}

const OpRegistrar kRegister({kOp, [] { return impl_names_of(impls()); }, probe});

}  // namespace
}  // namespace strata::linear_attn

using namespace strata;
using namespace strata::linear_attn;
using namespace strata::linear_attn::gdn_bwd;

extern "C" strata_status strata_chunk_bwd_dv_local_plan(const strata_tensor_desc* q, const strata_tensor_desc* k,
                                                        const strata_tensor_desc* dout, const strata_tensor_desc* g,
                                                        const strata_tensor_desc* cu_seqlens,
                                                        const strata_tensor_desc* dv, float scale,
                                                        int32_t chunk_size, strata_plan* plan) {
  PlanKey key(kOp);
  key.add(q).add(k).add(dout).add(g).add(cu_seqlens).add(dv).add_attr(scale).add_attr(chunk_size);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    std::vector<Arg> args = {{"q", q, true, false, kFloatDtypes},         {"k", k, true, false, kFloatDtypes},
                             {"do", dout, true, false, kFloatDtypes},     {"g", g, false, false, kGateDtypes},
                             {"cu_seqlens", cu_seqlens, false, false, {STRATA_DTYPE_I64}},
                             {"dv", dv, true, true, kFloatDtypes}};
    STRATA_RETURN_IF_ERROR(check_args_null_device_dtype(kOp, args));
    Problem pr;
    Dims& d = pr.params.d;
    STRATA_RETURN_IF_ERROR(derive_dims(kOp, "q", *q, "do", *dout, cu_seqlens, chunk_size, d));
    const std::vector<int64_t> qk = {d.B, d.T, d.H, d.K}, vs = {d.B, d.T, d.HV, d.V}, gs = {d.B, d.T, d.HV};
    args[0].shape = args[1].shape = qk;
    args[0].how = args[1].how = "B, T, H, K";
    args[2].shape = args[5].shape = vs;
    args[2].how = args[5].how = "B, T, HV, V";
    args[3].shape = gs;
    args[3].how = "B, T, HV";
    args[3].unit_last = false;
    if (cu_seqlens) args[4].shape = {d.N + 1}, args[4].how = "N + 1";
    args[4].unit_last = false;
    STRATA_RETURN_IF_ERROR(check_args_shape_stride(kOp, args));
    STRATA_RETURN_IF_ERROR(check_chunk_size(kOp, chunk_size));
    STRATA_RETURN_IF_ERROR(check_scale(kOp, scale));

    DvLocalParams& p = pr.params;
    p.q = view_template(q);
    p.k = view_template(k);
    p.dout = view_template(dout);
    p.g = view_template(g);
    p.dv = view_template(dv);
    p.scale = scale;
    const std::vector<const strata_tensor_desc*> ts{q, k, dout, g, cu_seqlens, dv};
    for (int i = 0; i < kNumTensors; ++i) pr.offs[i] = ts[i] ? ts[i]->offset : 0;
    pr.has_cu = cu_seqlens != nullptr;
    d.cu_stride = cu_seqlens ? cu_seqlens->strides[0] : 1;
    pr.any_f64 = any_f64({q, k, dout, g, dv});
    pr.device = q->device;
    const std::string summary = fmt::format("q:{} k:{} do:{} g:{} cu_seqlens:{} dv:{} scale={} chunk_size={}",
                                            desc_str(*q), desc_str(*k), desc_str(*dout), g ? desc_str(*g) : "none",
                                            cu_seqlens ? desc_str(*cu_seqlens) : "none", desc_str(*dv), scale,
                                            chunk_size);
    const PlanInfo info{kOp, ts, given_mask_of(ts), q->device, summary, numel(*dv) == 0};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}
