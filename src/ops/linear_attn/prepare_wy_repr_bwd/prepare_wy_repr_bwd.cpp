// prepare_wy_repr_bwd: definition, validation, implementation list and plans (ops_gdn_kda.md §4.6;
// prepare_wy_repr_bwd.h, README.md beside this file).
// Tensors {k, v, beta, A, dw, du, g|NULL, cu_seqlens|NULL, dk, dv, dbeta, dg|NULL}; the chunk size is A.shape[3].
// Implementations: cuda.sm90.mma (bf16/f16), cuda.sm90.chunk_tile,
// cpu.<isa>, reference.
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

#include <fmt/format.h>

#include "ops/linear_attn/gdn_bwd_common/dims.h"
#include "ops/linear_attn/gdn_bwd_common/impl_list.h"
#include "opbase/plan.h"
#include "runtime/runtime_internal.h"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;

constexpr const char* kOp = "prepare_wy_repr_bwd";
enum { kK, kV, kBeta, kA, kDw, kDu, kG, kCu, kDk, kDv, kDbeta, kDg, kNumTensors };

struct Problem {
  WyBwdParams params;
  int64_t offs[kNumTensors] = {};
  bool has_cu = false;
  bool any_f64 = false;
  strata_device device{};
};

WyBwdParams bind(const Problem& pr, const Launch& l) {
  WyBwdParams p = pr.params;
  auto b = [&](View& v, int i) { v = bind_view(v, pr.offs[i], l.ptrs[i]); };
  b(p.k, kK), b(p.v, kV), b(p.beta, kBeta), b(p.A, kA), b(p.dw, kDw), b(p.du, kDu), b(p.g, kG);
  b(p.dk, kDk), b(p.dv, kDv), b(p.dbeta, kDbeta), b(p.dg, kDg);
  bind_cu(p.d, pr.has_cu, l.ptrs[kCu], pr.offs[kCu]);
  return p;
}

strata_status host_checks(const WyBwdParams& p) { return check_cu_values(kOp, p.d); }

const ImplList<Problem>& impls() {
  static const ImplList<Problem> list = [] {
    ImplList<Problem> l = make_impls<Problem, WyBwdParams>({
        bind, prepare_wy_repr_bwd_cpu, prepare_wy_repr_bwd_reference, host_checks,
#if STRATA_WITH_CUDA
        "cuda.sm90.chunk_tile", prepare_wy_repr_bwd_cuda_fma_workspace, prepare_wy_repr_bwd_cuda_fma,
        "cuda.sm90.mma", prepare_wy_repr_bwd_cuda_mma_reject, prepare_wy_repr_bwd_cuda_mma_workspace,
        prepare_wy_repr_bwd_cuda_mma,
#endif
    });
    return l;
  }();
  return list;
}

}  // namespace

#if STRATA_WITH_CUDA
// Session 13 final run (H200, 2026-12-01, bf16, B = 4, T = 8192, H = 16, HV = 32, K = V = 128, median of 9
// interleaved calls), kWyTwoPerSm / kWyBatchedAdd / kWyPrefetchAdd / kWyBatchedTyped: with the composed backward's
// fused sums (dk_add, dg_add) 1.262 / 1.122 / 1.145 / 1.046 ms, plain 0.995 / 1.002 / 0.911 / 0.900 ms (the same at
// B = 1, T = 32768); session 14 run 0 (same shape) 1.239 / 1.102 / 1.127 / 1.037 and 0.978 / 0.991 / 0.899 / 0.890.
// Every form gives the same bits; the two losing forms are removed. Session 14 run 1 (same shape, 14:47 UTC),
// kWyTwoPerSm / kWyBatchedTyped / kWyPrefetchL2 / kWyPaired (removed since) / kWyTrimmed: fused sums 1.245 / 1.035 /
// 0.999 / 1.038 / 0.990 ms, plain 0.982 / 0.892 / 0.863 / 0.895 / 0.834 ms (B = 1, T = 32768: 0.991 and 0.835).
// Session 17 (GPU run s17run1, same shape): kWyFinStaged, which is kWyTrimmed's kernel without dk_rstd and folds dk's
// l2norm backward with it: the composed GDN backward reading saved 3.203 -> 3.115 ms (B = 4), 4.204 -> 4.103 ms
// (B = 1, T = 32768) against kWyTrimmed + the tail's dk row_norm_bwd.
int prepare_wy_repr_bwd_auto_variant() { return kWyFinStaged; }
#endif

namespace {

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc k = make_desc(STRATA_DTYPE_BF16, {1, 4096, 16, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 32, 128}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {1, 4096, 32}, device);
  const strata_tensor_desc A = make_desc(STRATA_DTYPE_BF16, {1, 4096, 32, 64}, device);
  return strata_prepare_wy_repr_bwd_plan(&k, &v, &g, &A, &v, &v, &g, nullptr, &k, &v, &g, &g, plan);
}

const OpRegistrar kRegister({kOp, [] { return impl_names_of(impls()); }, probe});

}  // namespace
}  // namespace strata::linear_attn

using namespace strata;
using namespace strata::linear_attn;
using namespace strata::linear_attn::gdn_bwd;

extern "C" strata_status strata_prepare_wy_repr_bwd_plan(
    const strata_tensor_desc* k, const strata_tensor_desc* v, const strata_tensor_desc* beta,
    const strata_tensor_desc* A, const strata_tensor_desc* dw, const strata_tensor_desc* du,
    const strata_tensor_desc* g, const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* dk,
    const strata_tensor_desc* dv, const strata_tensor_desc* dbeta, const strata_tensor_desc* dg,
    strata_plan* plan) {
  PlanKey key(kOp);
  key.add(k).add(v).add(beta).add(A).add(dw).add(du).add(g).add(cu_seqlens).add(dk).add(dv).add(dbeta).add(dg);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    std::vector<Arg> args = {{"k", k, true, false, kFloatDtypes},
                             {"v", v, true, false, kFloatDtypes},
                             {"beta", beta, true, false, kFloatDtypes},
                             {"A", A, true, false, kFloatDtypes},
                             {"dw", dw, true, false, kFloatDtypes},
                             {"du", du, true, false, kFloatDtypes},
                             {"g", g, false, false, kGateDtypes},
                             {"cu_seqlens", cu_seqlens, false, false, {STRATA_DTYPE_I64}},
                             {"dk", dk, true, true, kFloatDtypes},
                             {"dv", dv, true, true, kFloatDtypes},
                             {"dbeta", dbeta, true, true, kFloatDtypes},
                             {"dg", dg, false, true, kGateDtypes}};
    STRATA_RETURN_IF_ERROR(check_args_null_device_dtype(kOp, args));
    STRATA_RETURN_IF_ERROR(check_rank_in(kOp, "A", *A, 4, 4));
    const int32_t chunk_size = static_cast<int32_t>(A->shape[3]);
    Problem pr;
    Dims& d = pr.params.d;
    STRATA_RETURN_IF_ERROR(derive_dims(kOp, "k", *k, "v", *v, cu_seqlens, chunk_size, d));
    const std::vector<int64_t> qk = {d.B, d.T, d.H, d.K}, wk = {d.B, d.T, d.HV, d.K}, vs = {d.B, d.T, d.HV, d.V},
                               gs = {d.B, d.T, d.HV}, as = {d.B, d.T, d.HV, chunk_size};
    auto set = [&](int i, const std::vector<int64_t>& s, const char* how) { args[i].shape = s, args[i].how = how; };
    set(kK, qk, "B, T, H, K"), set(kDk, qk, "B, T, H, K"), set(kDw, wk, "B, T, HV, K");
    set(kV, vs, "B, T, HV, V"), set(kDu, vs, "B, T, HV, V"), set(kDv, vs, "B, T, HV, V");
    set(kBeta, gs, "B, T, HV"), set(kG, gs, "B, T, HV"), set(kDbeta, gs, "B, T, HV"), set(kDg, gs, "B, T, HV");
    set(kA, as, "B, T, HV, BT"), set(kCu, {d.N + 1}, "N + 1");
    args[kBeta].unit_last = args[kG].unit_last = args[kDbeta].unit_last = args[kDg].unit_last = false;
    args[kCu].unit_last = false;
    STRATA_RETURN_IF_ERROR(check_args_shape_stride(kOp, args));
    if (chunk_size != 16 && chunk_size != 32 && chunk_size != 64)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: the chunk size A.shape[3] must be 16, 32 or 64, got A {}", kOp,
                  shape_str(*A));
    if (dg && !g)
      return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: dg (the gate gradient) needs g, got dg {} and g NULL", kOp,
                  desc_str(*dg));

    WyBwdParams& p = pr.params;
    p.k = view_template(k), p.v = view_template(v), p.beta = view_template(beta), p.A = view_template(A);
    p.dw = view_template(dw), p.du = view_template(du), p.g = view_template(g);
    p.dk = view_template(dk), p.dv = view_template(dv), p.dbeta = view_template(dbeta), p.dg = view_template(dg);
    const std::vector<const strata_tensor_desc*> ts{k, v, beta, A, dw, du, g, cu_seqlens, dk, dv, dbeta, dg};
    for (int i = 0; i < kNumTensors; ++i) pr.offs[i] = ts[i] ? ts[i]->offset : 0;
    pr.has_cu = cu_seqlens != nullptr;
    d.cu_stride = cu_seqlens ? cu_seqlens->strides[0] : 1;
    pr.any_f64 = any_f64({k, v, beta, A, dw, du, g, dk, dv, dbeta, dg});
    pr.device = k->device;
    const std::string summary = fmt::format(
        "k:{} v:{} beta:{} A:{} dw:{} du:{} g:{} cu_seqlens:{} dk:{} dv:{} dbeta:{} dg:{}", desc_str(*k),
        desc_str(*v), desc_str(*beta), desc_str(*A), desc_str(*dw), desc_str(*du), g ? desc_str(*g) : "none",
        cu_seqlens ? desc_str(*cu_seqlens) : "none", desc_str(*dk), desc_str(*dv), desc_str(*dbeta),
        dg ? desc_str(*dg) : "none");
    const bool empty = numel(*dk) == 0 && numel(*dv) == 0 && numel(*dbeta) == 0;
    const PlanInfo info{kOp, ts, given_mask_of(ts), k->device, summary, empty};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}
