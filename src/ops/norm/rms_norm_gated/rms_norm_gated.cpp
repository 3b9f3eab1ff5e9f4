// rms_norm_gated: definition, validation, implementation lists and plans (ops_fused.md §4; README.md).
// Forward tensors {x, z, weight, bias, residual, y, residual_out, rstd}; backward tensors
// {x, z, weight, bias, residual, rstd, dy, dresidual_out, dx, dz, dweight, dbias}.
// Implementations, in dispatch order: forward cuda.sm90.team_regs, cuda.sm90.team_tma, cuda.sm90.team_stream (the
// last two forced only in effect: team_regs takes every shape they take), cuda.sm90.team_packed (where it applies),
// cuda.sm90.group_rows, then forced only cuda.sm90.bulk_ring, cuda.sm90.team_stream_flat;
// backward cuda.sm90.bulk_ring (where it applies), cuda.sm90.group_rows, cuda.sm90.bulk_ring_wide (forced only); then
// cpu.avx512_bf16 (on CPUs that have it), cpu.<isa> per compiled Highway target, reference.
#include "ops/norm/rms_norm_gated/rms_norm_gated.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "opbase/plan.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::norm {
namespace {

constexpr const char* kFwd = "rms_norm_gated_fwd";
constexpr const char* kBwd = "rms_norm_gated_bwd";
constexpr const char* kCudaImpl = "cuda.sm90.group_rows";
constexpr const char* kCudaPackedImpl = "cuda.sm90.team_packed";
constexpr const char* kCudaStreamImpl = "cuda.sm90.team_stream";
constexpr const char* kCudaStreamFlatImpl = "cuda.sm90.team_stream_flat";
constexpr const char* kCudaTmaImpl = "cuda.sm90.team_tma";
constexpr const char* kCudaRegsImpl = "cuda.sm90.team_regs";
constexpr const char* kCudaRingImpl = "cuda.sm90.bulk_ring";
constexpr const char* kCudaRingWideImpl = "cuda.sm90.bulk_ring_wide";

const std::initializer_list<int32_t> kAct = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16,
                                             STRATA_DTYPE_F64};

struct FwdProblem {
  RmsNormGatedFwdParams params;
  strata_device device{};
  bool residual = false;  // residual or residual_out given (params hold no pointers at plan time)
};
struct BwdProblem {
  RmsNormGatedBwdParams params;
  strata_device device{};
  bool residual = false;  // residual or dresidual_out given
};

RmsNormGatedFwdParams bind(const FwdProblem& pr, const Launch& l) {
  RmsNormGatedFwdParams p = pr.params;
  p.x = l.ptrs[0];
  p.z = l.ptrs[1];
  p.weight = l.ptrs[2];
  p.bias = l.ptrs[3];
  p.residual = l.ptrs[4];
  p.y = l.ptrs[5];
  p.residual_out = l.ptrs[6];
  p.rstd = l.ptrs[7];
  return p;
}
RmsNormGatedBwdParams bind(const BwdProblem& pr, const Launch& l) {
  RmsNormGatedBwdParams p = pr.params;
  p.x = l.ptrs[0];
  p.z = l.ptrs[1];
  p.weight = l.ptrs[2];
  p.bias = l.ptrs[3];
  p.residual = l.ptrs[4];
  p.rstd = l.ptrs[5];
  p.dy = l.ptrs[6];
  p.dres_out = l.ptrs[7];
  p.dx = l.ptrs[8];
  p.dz = l.ptrs[9];
  p.dweight = l.ptrs[10];
  p.dbias = l.ptrs[11];
  p.partial = static_cast<float*>(l.workspace);
  return p;
}

// The presence of optional tensors is part of the plan (the cache key marks absent descriptors), so the
// bound pointers agree with the params built at plan time; run() rejects a NULL where a descriptor was given.
std::string f64_reason(int32_t x_dtype) {
  return x_dtype == STRATA_DTYPE_F64 ? "f64 runs on the reference only" : "";
}

template <class Problem>
Implementation<Problem> cpu_impl(std::string name, std::function<std::string(const Problem&)> reject,
                                 void (*kernel)(const decltype(Problem::params)&),
                                 std::function<size_t(const Problem&)> workspace) {
  return {std::move(name), std::move(reject), std::move(workspace), [kernel](const Problem& pr, const Launch& l) {
            kernel(bind(pr, l));
            return STRATA_SUCCESS;
          }};
}

#if STRATA_WITH_CUDA
// A CUDA entry: sm_90, then (residual_rule given) no residual tensors, then the kernels' own plan-time
// conditions (`reject`, "" if they apply); `run` launches on the plan's stream.
template <class Problem>
Implementation<Problem> cuda_impl(std::string name, const char* residual_rule,
                                  std::function<std::string(const decltype(Problem::params)&)> reject,
                                  std::function<int(const decltype(Problem::params)&, void*)> run,
                                  std::function<size_t(const Problem&)> workspace = {}) {
  return {std::move(name),
          [residual_rule, reject](const Problem& p) {
            std::string r = reject_unless_cuda(p.device, 90);
            if (r.empty() && residual_rule && p.residual) r = residual_rule;
            return r.empty() ? reject(p.params) : r;
          },
          std::move(workspace),
          [run](const Problem& p, const Launch& launch) {
            return static_cast<strata_status>(run(bind(p, launch), launch.cuda_stream));
          }};
}
constexpr const char* kFwdNoResidual = "handles no residual / residual_out";
constexpr const char* kBwdNoResidual = "handles no residual / dresidual_out";
template <class Params>
std::string x_f64_reason(const Params& p) {
  return f64_reason(p.x_dtype);
}
// Every CUDA backward sizes the workspace for rms_norm_gated_cuda_partials partial rows (the ring's grid is at
// most that many CTAs).
size_t cuda_bwd_workspace(const BwdProblem& p) {
  return rms_norm_gated_bwd_workspace(p.params, rms_norm_gated_cuda_partials(p.params));
}
#endif

const ImplList<FwdProblem>& fwd_impls() {
  static const ImplList<FwdProblem> list = [] {
    ImplList<FwdProblem> l;
#if STRATA_WITH_CUDA
    // The tiled bulk-copy forward (below), then the streaming team forward (16-bit rows of D <= 256 without
    // residual: the GDN output gate, D = 128), then the packed team forward (D <= 1024; it ran [1048576, 128] at 1.33 x floor, instruction-
    // bound in the s7run1 ncu), else group_rows (every layout). Forced only: the bulk-copy ring (it ran the
    // [1048576, 128] forward at 1.46 x floor in s6run2) and team_stream's kernel on a grid that covers the rows
    // once (no row loop, no prefetch).
    // Session 9, first since s9run1 (bf16 [1048576, 128]: 0.2105 ms against team_stream's 0.2156, queued, C++;
    // 0.2151 against 0.2181 through Python with 64-thread blocks): team_stream's row math in short-lived blocks whose
    // tiles of dense rows the copy engine loads and stores (cuda_sm90_stream.cu); other layouts run team_stream's
    // kernel. Same plan-time conditions as team_stream.
    // Session 10, first since s10run1 (bf16 [1048576, 128], C++ queued: 0.2037 ms = 1.057 x the copy floor against
    // team_tma's 0.2084): team_stream's row math in short-lived register tiles (fla's forward shape: every load of a
    // team's 2 rows issued before the math); any equally spaced rows, so team_tma and team_stream are forced only
    // now (same conditions).
    l.push_back(cuda_impl<FwdProblem>(kCudaRegsImpl, kFwdNoResidual, rms_norm_gated_fwd_cuda_stream_reject,
                                      [](const RmsNormGatedFwdParams& q, void* s) {
                                        return rms_norm_gated_fwd_cuda_regs(q, s);
                                      }));
    l.push_back(cuda_impl<FwdProblem>(kCudaTmaImpl, kFwdNoResidual, rms_norm_gated_fwd_cuda_stream_reject,
                                      [](const RmsNormGatedFwdParams& q, void* s) {
                                        return rms_norm_gated_fwd_cuda_tma(q, s);
                                      }));
    l.push_back(cuda_impl<FwdProblem>(kCudaStreamImpl, kFwdNoResidual, rms_norm_gated_fwd_cuda_stream_reject,
                                      [](const RmsNormGatedFwdParams& q, void* s) {
                                        return rms_norm_gated_fwd_cuda_stream(q, s);
                                      }));
    l.push_back(cuda_impl<FwdProblem>(kCudaPackedImpl, kFwdNoResidual, rms_norm_gated_fwd_cuda_packed_reject,
                                      [](const RmsNormGatedFwdParams& q, void* s) {
                                        return rms_norm_gated_fwd_cuda_packed(q, s);
                                      }));
    l.push_back(cuda_impl<FwdProblem>(kCudaImpl, nullptr, x_f64_reason<RmsNormGatedFwdParams>, rms_norm_gated_fwd_cuda));
    l.push_back(cuda_impl<FwdProblem>(kCudaRingImpl, kFwdNoResidual, rms_norm_gated_fwd_cuda_ring_reject,
                                      rms_norm_gated_fwd_cuda_ring));
    l.push_back(cuda_impl<FwdProblem>(kCudaStreamFlatImpl, kFwdNoResidual, rms_norm_gated_fwd_cuda_stream_reject,
                                      [](const RmsNormGatedFwdParams& q, void* s) {
                                        return rms_norm_gated_fwd_cuda_stream(q, s, false);
                                      }));
#endif
    // AVX512-BF16 first: the AVX3 kernels with native rounding of bf16 outputs (the same bits).
    if (const RmsNormGatedFwdFn fn = rms_norm_gated_fwd_cpu_native_bf16())
      l.push_back(cpu_impl<FwdProblem>(
          tile::kAvx512Bf16Impl,
          [](const FwdProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty() && !tile::cpu_has_avx512_bf16()) r = "this CPU lacks avx512_bf16";
            return r.empty() ? f64_reason(p.params.x_dtype) : r;
          },
          fn, {}));
    for (const tile::CpuIsa& isa : tile::cpu_isas()) {
      const RmsNormGatedFwdFn fn = rms_norm_gated_fwd_cpu(isa.hwy_target);
      if (!fn) continue;
      l.push_back(cpu_impl<FwdProblem>(
          isa.impl,
          [isa](const FwdProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty()) r = tile::reject_cpu_isa(isa);
            return r.empty() ? f64_reason(p.params.x_dtype) : r;
          },
          fn, {}));
    }
    l.push_back(cpu_impl<FwdProblem>(
        "reference", [](const FwdProblem& p) { return reject_unless_cpu(p.device); }, rms_norm_gated_fwd_reference,
        {}));
    return l;
  }();
  return list;
}

const ImplList<BwdProblem>& bwd_impls() {
  static const ImplList<BwdProblem> list = [] {
    ImplList<BwdProblem> l;
#if STRATA_WITH_CUDA
    // The bulk-copy ring where it won in s6run2 (lane-team rows: [1048576, 128] 0.3966 ms against group_rows'
    // 0.4697; wide rows of D > 6144), else group_rows. Forced only (after group_rows): the ring's wide-row
    // kernels for every D <= 8192 (the dispatched bulk_ring entry takes them only for D > 6144).
    l.push_back(cuda_impl<BwdProblem>(
        kCudaRingImpl, kBwdNoResidual,
        [](const RmsNormGatedBwdParams& q) { return rms_norm_gated_bwd_cuda_ring_reject(q); },
        rms_norm_gated_bwd_cuda_ring, cuda_bwd_workspace));
    l.push_back(cuda_impl<BwdProblem>(
        kCudaImpl, nullptr, x_f64_reason<RmsNormGatedBwdParams>,
        [](const RmsNormGatedBwdParams& q, void* s) { return rms_norm_gated_bwd_cuda(q, s); }, cuda_bwd_workspace));
    l.push_back(cuda_impl<BwdProblem>(
        kCudaRingWideImpl, kBwdNoResidual,
        [](const RmsNormGatedBwdParams& q) { return rms_norm_gated_bwd_cuda_ring_reject(q, true); },
        rms_norm_gated_bwd_cuda_ring, cuda_bwd_workspace));
#endif
    if (const RmsNormGatedBwdFn fn = rms_norm_gated_bwd_cpu_native_bf16())
      l.push_back(cpu_impl<BwdProblem>(
          tile::kAvx512Bf16Impl,
          [](const BwdProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty() && !tile::cpu_has_avx512_bf16()) r = "this CPU lacks avx512_bf16";
            return r.empty() ? f64_reason(p.params.x_dtype) : r;
          },
          fn,
          [](const BwdProblem& p) {
            return rms_norm_gated_bwd_workspace(p.params, rms_norm_gated_cpu_partials(p.params));
          }));
    for (const tile::CpuIsa& isa : tile::cpu_isas()) {
      const RmsNormGatedBwdFn fn = rms_norm_gated_bwd_cpu(isa.hwy_target);
      if (!fn) continue;
      l.push_back(cpu_impl<BwdProblem>(
          isa.impl,
          [isa](const BwdProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty()) r = tile::reject_cpu_isa(isa);
            return r.empty() ? f64_reason(p.params.x_dtype) : r;
          },
          fn,
          [](const BwdProblem& p) {
            return rms_norm_gated_bwd_workspace(p.params, rms_norm_gated_cpu_partials(p.params));
          }));
    }
    l.push_back(cpu_impl<BwdProblem>(
        "reference", [](const BwdProblem& p) { return reject_unless_cpu(p.device); }, rms_norm_gated_bwd_reference,
        {}));
    return l;
  }();
  return list;
}

// ---- validation: null -> device -> dtype -> shape -> strides -> attributes (ARCHITECTURE.md §3) ----

struct Arg {
  const char* name;
  const strata_tensor_desc* t;
  bool required;
};

strata_status check_nulls(const char* op, std::initializer_list<Arg> args) {
  for (const Arg& a : args) {
    if (!a.t && !a.required) continue;
    STRATA_RETURN_IF_ERROR(check_desc(op, a.name, a.t));
  }
  return STRATA_SUCCESS;
}
strata_status check_devices(const char* op, const strata_tensor_desc& x, std::initializer_list<Arg> args) {
  for (const Arg& a : args)
    if (a.t) STRATA_RETURN_IF_ERROR(check_same_device(op, a.name, *a.t, x, "x"));
  return STRATA_SUCCESS;
}

// Activations share x's dtype; residual streams are x's dtype or f32; parameters and their gradients any
// float dtype (f64 only with f64 x, which runs on the CPU).
strata_status check_dtypes(const char* op, const strata_tensor_desc& x, std::initializer_list<Arg> same,
                           std::initializer_list<Arg> stream, std::initializer_list<Arg> param,
                           const strata_tensor_desc* rstd) {
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "x", x, kAct));
  const bool f64 = x.dtype == STRATA_DTYPE_F64;
  for (const Arg& a : same)
    if (a.t) STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.t, {x.dtype}));
  for (const Arg& a : stream)
    if (a.t) STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.t, {x.dtype, STRATA_DTYPE_F32}));
  for (const Arg& a : param)
    if (a.t)
      STRATA_RETURN_IF_ERROR(check_dtype_in(
          op, a.name, *a.t,
          f64 ? std::initializer_list<int32_t>{STRATA_DTYPE_F64, STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16}
              : std::initializer_list<int32_t>{STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16}));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "rstd", *rstd, {f64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32}));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, "x", x));
  return STRATA_SUCCESS;
}

// G from group_size (0 = D); fails unless it divides D.
strata_status group_of(const char* op, const strata_tensor_desc& x, int64_t group_size, int64_t* G) {
  const int64_t D = x.rank > 0 ? x.shape[x.rank - 1] : 0;
  if (group_size < 0)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: group_size must be >= 0 (0 means D = {}), got {}", op, D,
                group_size);
  *G = group_size == 0 ? D : group_size;
  if (D > 0 && (*G == 0 || D % *G != 0))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: group_size must divide D = {} (x.shape[-1]), got {}", op, D,
                group_size);
  return STRATA_SUCCESS;
}

std::vector<int64_t> rstd_shape(const strata_tensor_desc& x, int64_t G) {
  std::vector<int64_t> s(x.shape, x.shape + x.rank - 1);
  const int64_t D = x.shape[x.rank - 1];
  s.push_back(G > 0 ? D / G : 0);
  return s;
}

strata_status check_shapes(const char* op, const strata_tensor_desc& x, std::initializer_list<Arg> like_x,
                           std::initializer_list<Arg> vec_d, const strata_tensor_desc& rstd, int64_t group_size) {
  STRATA_RETURN_IF_ERROR(check_rank_in(op, "x", x, 1, STRATA_MAX_RANK));
  const std::vector<int64_t> xs = shape_of(x);
  for (const Arg& a : like_x)
    if (a.t) STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.t, xs, "the shape of x"));
  const std::vector<int64_t> d = {xs.back()};
  for (const Arg& a : vec_d)
    if (a.t) STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.t, d, "[D] with D = x.shape[-1]"));
  // group_size is an attribute but the rstd shape depends on it: an invalid one is reported first.
  int64_t G = 0;
  const int64_t D = xs.back();
  if (group_size >= 0 && (group_size == 0 || D % group_size == 0)) {
    G = group_size == 0 ? D : group_size;
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, "rstd", rstd, rstd_shape(x, G),
                                          "x's shape with its last dimension D / group_size"));
  }
  return STRATA_SUCCESS;
}

strata_status check_all_strides(const char* op, std::initializer_list<Arg> inputs, std::initializer_list<Arg> outputs) {
  for (const Arg& a : inputs)
    if (a.t) STRATA_RETURN_IF_ERROR(check_strides(op, a.name, *a.t, false, false));
  for (const Arg& a : outputs)
    if (a.t) STRATA_RETURN_IF_ERROR(check_strides(op, a.name, *a.t, true, false));
  return STRATA_SUCCESS;
}

strata_status check_mode(const char* op, int32_t norm_before_gate, int32_t activation) {
  if (norm_before_gate != 0 && norm_before_gate != 1)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: norm_before_gate must be 0 or 1, got {}", op, norm_before_gate);
  if (activation != STRATA_GATE_SILU && activation != STRATA_GATE_SIGMOID)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE,
                "{}: activation must be STRATA_GATE_SILU (0) or STRATA_GATE_SIGMOID (1), got {}", op, activation);
  return STRATA_SUCCESS;
}

RowLayout rows_of(const strata_tensor_desc* t) { return t ? make_row_layout(*t, 1) : RowLayout{}; }

std::string opt_str(const char* name, const strata_tensor_desc* t) {
  return t ? fmt::format(" {}:{}", name, desc_str(*t)) : std::string();
}

strata_status probe_fwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4096, 32, 128}, device);
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_F32, {128}, device);
  const strata_tensor_desc r = make_desc(STRATA_DTYPE_F32, {4096, 32, 1}, device);
  return strata_rms_norm_gated_fwd_plan(&x, &x, &w, nullptr, nullptr, &x, nullptr, &r, 1e-6f, 0, 1, 0, plan);
}
strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4096, 32, 128}, device);
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_F32, {128}, device);
  const strata_tensor_desc r = make_desc(STRATA_DTYPE_F32, {4096, 32, 1}, device);
  return strata_rms_norm_gated_bwd_plan(&x, &x, &w, nullptr, nullptr, &r, &x, nullptr, &x, &x, &w, nullptr, 0, 1, 0,
                                        plan);
}

const OpRegistrar kRegisterFwd({kFwd, [] { return impl_names_of(fwd_impls()); }, probe_fwd});
const OpRegistrar kRegisterBwd({kBwd, [] { return impl_names_of(bwd_impls()); }, probe_bwd});

}  // namespace
}  // namespace strata::norm

using namespace strata;
using namespace strata::norm;

extern "C" strata_status strata_rms_norm_gated_fwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* z, const strata_tensor_desc* weight,
    const strata_tensor_desc* bias, const strata_tensor_desc* residual, const strata_tensor_desc* y,
    const strata_tensor_desc* residual_out, const strata_tensor_desc* rstd, float eps, int64_t group_size,
    int32_t norm_before_gate, int32_t activation, strata_plan* plan) {
  PlanKey key(kFwd);
  key.add(x).add(z).add(weight).add(bias).add(residual).add(y).add(residual_out).add(rstd);
  key.add_attr(eps).add_attr(group_size).add_attr(norm_before_gate).add_attr(activation);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    const char* op = kFwd;
    STRATA_RETURN_IF_ERROR(check_nulls(op, {{"x", x, true}, {"z", z, true}, {"weight", weight, false},
                                            {"bias", bias, false}, {"residual", residual, false}, {"y", y, true},
                                            {"residual_out", residual_out, false}, {"rstd", rstd, true}}));
    STRATA_RETURN_IF_ERROR(check_devices(op, *x, {{"x", x, true}, {"z", z, true}, {"weight", weight, false},
                                                  {"bias", bias, false}, {"residual", residual, false},
                                                  {"y", y, true}, {"residual_out", residual_out, false},
                                                  {"rstd", rstd, true}}));
    STRATA_RETURN_IF_ERROR(check_dtypes(op, *x, {{"z", z, true}, {"y", y, true}},
                                        {{"residual", residual, false}, {"residual_out", residual_out, false}},
                                        {{"weight", weight, false}, {"bias", bias, false}}, rstd));
    STRATA_RETURN_IF_ERROR(check_shapes(op, *x, {{"z", z, true}, {"residual", residual, false}, {"y", y, true},
                                                 {"residual_out", residual_out, false}},
                                        {{"weight", weight, false}, {"bias", bias, false}}, *rstd, group_size));
    STRATA_RETURN_IF_ERROR(check_all_strides(
        op, {{"x", x, true}, {"z", z, true}, {"weight", weight, false}, {"bias", bias, false},
             {"residual", residual, false}},
        {{"y", y, true}, {"residual_out", residual_out, false}, {"rstd", rstd, true}}));
    int64_t G = 0;
    STRATA_RETURN_IF_ERROR(group_of(op, *x, group_size, &G));
    STRATA_RETURN_IF_ERROR(check_mode(op, norm_before_gate, activation));
    if (!std::isfinite(eps) || eps < 0.f)
      return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: eps must be finite and >= 0, got {}", op, eps);

    FwdProblem pr;
    RmsNormGatedFwdParams& k = pr.params;
    k.x_dtype = x->dtype;
    k.w_dtype = weight ? weight->dtype : STRATA_DTYPE_F32;
    k.b_dtype = bias ? bias->dtype : STRATA_DTYPE_F32;
    k.res_dtype = residual ? residual->dtype : x->dtype;
    k.res_out_dtype = residual_out ? residual_out->dtype : x->dtype;
    k.rstd_dtype = rstd->dtype;
    k.D = x->shape[x->rank - 1];
    k.rows = numel(*x) / std::max<int64_t>(k.D, 1);
    if (k.D == 0) k.rows = 0;
    k.group = G;
    k.x_rows = rows_of(x);
    k.z_rows = rows_of(z);
    k.y_rows = rows_of(y);
    k.res_rows = rows_of(residual);
    k.res_out_rows = rows_of(residual_out);
    k.rstd_rows = rows_of(rstd);
    k.w_row = rows_of(weight);
    k.b_row = rows_of(bias);
    k.eps = eps;
    k.norm_before_gate = norm_before_gate != 0;
    k.act = activation;
    pr.device = x->device;
    pr.residual = residual || residual_out;
    const std::vector<const strata_tensor_desc*> tensors{x, z, weight, bias, residual, y, residual_out, rstd};
    const PlanInfo info{op, tensors, given_mask_of(tensors), x->device,
                        fmt::format("x:{} z:{}{}{}{} y:{}{} rstd:{} eps={} group={} norm_before_gate={} act={}",
                                    desc_str(*x), desc_str(*z), opt_str("weight", weight), opt_str("bias", bias),
                                    opt_str("residual", residual), desc_str(*y),
                                    opt_str("residual_out", residual_out), desc_str(*rstd), eps, G,
                                    norm_before_gate, activation == STRATA_GATE_SILU ? "silu" : "sigmoid"),
                        k.rows == 0};
    return dispatch(info, std::move(pr), fwd_impls(), out);
  }, plan);
}

extern "C" strata_status strata_rms_norm_gated_bwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* z, const strata_tensor_desc* weight,
    const strata_tensor_desc* bias, const strata_tensor_desc* residual, const strata_tensor_desc* rstd,
    const strata_tensor_desc* dy, const strata_tensor_desc* dresidual_out, const strata_tensor_desc* dx,
    const strata_tensor_desc* dz, const strata_tensor_desc* dweight, const strata_tensor_desc* dbias,
    int64_t group_size, int32_t norm_before_gate, int32_t activation, strata_plan* plan) {
  PlanKey key(kBwd);
  key.add(x).add(z).add(weight).add(bias).add(residual).add(rstd).add(dy).add(dresidual_out).add(dx).add(dz);
  key.add(dweight).add(dbias).add_attr(group_size).add_attr(norm_before_gate).add_attr(activation);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    const char* op = kBwd;
    STRATA_RETURN_IF_ERROR(check_nulls(
        op, {{"x", x, true}, {"z", z, true}, {"weight", weight, false}, {"bias", bias, false},
             {"residual", residual, false}, {"rstd", rstd, true}, {"dy", dy, true},
             {"dresidual_out", dresidual_out, false}, {"dx", dx, true}, {"dz", dz, true},
             {"dweight", dweight, false}, {"dbias", dbias, false}}));
    if (dweight && !weight)
      return fail(STRATA_ERROR_INVALID_VALUE, "{}: dweight must be NULL when weight is NULL", op);
    if (dbias && !bias) return fail(STRATA_ERROR_INVALID_VALUE, "{}: dbias must be NULL when bias is NULL", op);
    STRATA_RETURN_IF_ERROR(check_devices(
        op, *x, {{"x", x, true}, {"z", z, true}, {"weight", weight, false}, {"bias", bias, false},
                 {"residual", residual, false}, {"rstd", rstd, true}, {"dy", dy, true},
                 {"dresidual_out", dresidual_out, false}, {"dx", dx, true}, {"dz", dz, true},
                 {"dweight", dweight, false}, {"dbias", dbias, false}}));
    STRATA_RETURN_IF_ERROR(check_dtypes(op, *x, {{"z", z, true}, {"dy", dy, true}, {"dx", dx, true}, {"dz", dz, true}},
                                        {{"residual", residual, false}, {"dresidual_out", dresidual_out, false}},
                                        {{"weight", weight, false}, {"bias", bias, false}, {"dweight", dweight, false},
                                         {"dbias", dbias, false}},
                                        rstd));
    STRATA_RETURN_IF_ERROR(check_shapes(op, *x,
                                        {{"z", z, true}, {"residual", residual, false}, {"dy", dy, true},
                                         {"dresidual_out", dresidual_out, false}, {"dx", dx, true}, {"dz", dz, true}},
                                        {{"weight", weight, false}, {"bias", bias, false}, {"dweight", dweight, false},
                                         {"dbias", dbias, false}},
                                        *rstd, group_size));
    STRATA_RETURN_IF_ERROR(check_all_strides(
        op, {{"x", x, true}, {"z", z, true}, {"weight", weight, false}, {"bias", bias, false},
             {"residual", residual, false}, {"rstd", rstd, true}, {"dy", dy, true},
             {"dresidual_out", dresidual_out, false}},
        {{"dx", dx, true}, {"dz", dz, true}, {"dweight", dweight, false}, {"dbias", dbias, false}}));
    int64_t G = 0;
    STRATA_RETURN_IF_ERROR(group_of(op, *x, group_size, &G));
    STRATA_RETURN_IF_ERROR(check_mode(op, norm_before_gate, activation));

    BwdProblem pr;
    RmsNormGatedBwdParams& k = pr.params;
    k.x_dtype = x->dtype;
    k.w_dtype = weight ? weight->dtype : STRATA_DTYPE_F32;
    k.b_dtype = bias ? bias->dtype : STRATA_DTYPE_F32;
    k.res_dtype = residual ? residual->dtype : x->dtype;
    k.dres_out_dtype = dresidual_out ? dresidual_out->dtype : x->dtype;
    k.rstd_dtype = rstd->dtype;
    k.dw_dtype = dweight ? dweight->dtype : STRATA_DTYPE_F32;
    k.db_dtype = dbias ? dbias->dtype : STRATA_DTYPE_F32;
    k.D = x->shape[x->rank - 1];
    k.rows = k.D == 0 ? 0 : numel(*x) / k.D;
    k.group = G;
    k.x_rows = rows_of(x);
    k.z_rows = rows_of(z);
    k.res_rows = rows_of(residual);
    k.rstd_rows = rows_of(rstd);
    k.dy_rows = rows_of(dy);
    k.dres_out_rows = rows_of(dresidual_out);
    k.dx_rows = rows_of(dx);
    k.dz_rows = rows_of(dz);
    k.w_row = rows_of(weight);
    k.b_row = rows_of(bias);
    k.dw_row = rows_of(dweight);
    k.db_row = rows_of(dbias);
    k.norm_before_gate = norm_before_gate != 0;
    k.act = activation;
    // Kernels test these pointers for presence before binding; mark them present for the params copy.
    k.dweight = dweight ? reinterpret_cast<void*>(1) : nullptr;
    k.dbias = dbias ? reinterpret_cast<void*>(1) : nullptr;
    pr.device = x->device;
    pr.residual = residual || dresidual_out;
    const std::vector<const strata_tensor_desc*> tensors{x,  z,  weight, bias, residual, rstd, dy, dresidual_out,
                                                         dx, dz, dweight, dbias};
    const PlanInfo info{
        op, tensors, given_mask_of(tensors), x->device,
        fmt::format("x:{} z:{}{}{}{} rstd:{} dy:{}{} dx:{} dz:{}{}{} group={} norm_before_gate={} act={}",
                    desc_str(*x), desc_str(*z), opt_str("weight", weight), opt_str("bias", bias),
                    opt_str("residual", residual), desc_str(*rstd), desc_str(*dy),
                    opt_str("dresidual_out", dresidual_out), desc_str(*dx), desc_str(*dz), opt_str("dweight", dweight),
                    opt_str("dbias", dbias), G, norm_before_gate, activation == STRATA_GATE_SILU ? "silu" : "sigmoid"),
        // Nothing to write only when D == 0: with rows == 0 the kernels still zero dweight / dbias.
        k.D == 0};
    return dispatch(info, std::move(pr), bwd_impls(), out);
  }, plan);
}
