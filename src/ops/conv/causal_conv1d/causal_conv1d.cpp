// causal_conv1d: definition, validation, implementation lists and plans (ops_fused.md §5; README.md beside
// this file).
//   fwd tensors {x, weight, bias, residual, initial_state, cu_seqlens, seq_idx, y, final_state}
//   bwd tensors {x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal_state,
//                dx, dweight, dbias, dinitial_state}
// Implementations, in dispatch order: cuda.sm90.lean (backward, 16-bit, batch rows and cu_seqlens packs), cuda.sm90.pipe (backward, 16-bit; forced only since lean covers the same problems), cuda.sm90.vec (common case; then pipe for the forward), cuda.sm90.time_tile, cpu.avx512_bf16, cpu.<isa> for each compiled
// Highway target, reference.
#include "ops/conv/causal_conv1d/causal_conv1d.h"

#include <fmt/format.h>

#include <array>

#include "opbase/plan.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"
#if STRATA_WITH_CUDA
#include "ops/conv/causal_conv1d/cuda_check.h"
#endif

namespace strata::conv {
namespace {

constexpr const char* kFwd = "causal_conv1d_fwd";
constexpr const char* kBwd = "causal_conv1d_bwd";

struct Conv1dProblem {
  Conv1dParams params;                  // pointers bound at run time
  std::array<int64_t, 12> offsets{};    // element offset of each tensor (in the op's tensor order)
  std::array<int32_t, 12> dtypes{};     // dtype of each tensor (-1 when absent)
  bool backward = false;
  strata_device device{};
};

const void* at(const Conv1dProblem& pr, const Launch& l, int i) {
  if (pr.dtypes[i] < 0 || !l.ptrs[i]) return nullptr;
  return static_cast<const char*>(l.ptrs[i]) + pr.offsets[i] * static_cast<int64_t>(dtype_size(pr.dtypes[i]));
}
void* at_mut(const Conv1dProblem& pr, const Launch& l, int i) { return const_cast<void*>(at(pr, l, i)); }

Conv1dParams bind(const Conv1dProblem& pr, const Launch& l) {
  Conv1dParams p = pr.params;
  if (!pr.backward) {
    p.x = at(pr, l, 0);
    p.weight = at(pr, l, 1);
    p.bias = at(pr, l, 2);
    p.residual = at(pr, l, 3);
    p.h0 = at(pr, l, 4);
    p.cu_seqlens = at(pr, l, 5);
    p.seq_idx = at(pr, l, 6);
    p.y = at_mut(pr, l, 7);
    p.hT = at_mut(pr, l, 8);
  } else {
    p.x = at(pr, l, 0);
    p.weight = at(pr, l, 1);
    p.bias = at(pr, l, 2);
    p.h0 = at(pr, l, 3);
    p.cu_seqlens = at(pr, l, 4);
    p.seq_idx = at(pr, l, 5);
    p.dy = at(pr, l, 6);
    p.dhT = at(pr, l, 7);
    p.dx = at_mut(pr, l, 8);
    p.dw = at_mut(pr, l, 9);
    p.db = at_mut(pr, l, 10);
    p.dh0 = at_mut(pr, l, 11);
  }
  return p;
}

bool half_or_f32(int32_t d) { return d == STRATA_DTYPE_F32 || d == STRATA_DTYPE_BF16 || d == STRATA_DTYPE_F16; }

// Used by the CUDA entries only (CPU-only builds compile it unused).
[[maybe_unused]] std::string dtypes_reason(const Conv1dProblem& pr) {
  for (int32_t d : pr.dtypes)
    if (d == STRATA_DTYPE_F64)
      return fmt::format("handles f32/bf16/f16 tensors, got an f64 tensor (x {})", dtype_name(pr.params.x_dtype));
  return {};
}

template <class Run>
Implementation<Conv1dProblem> cpu_impl(std::string name, std::function<std::string(const Conv1dProblem&)> reject,
                                       std::function<size_t(const Conv1dProblem&)> workspace, Run run) {
  return {std::move(name), std::move(reject), std::move(workspace),
          [run](const Conv1dProblem& pr, const Launch& l) {
            const Conv1dParams p = bind(pr, l);
            if (p.mode == kModeCuSeqlens)
              STRATA_RETURN_IF_ERROR(check_cu_seqlens_values(p, pr.backward ? kBwd : kFwd));
            run(p, l.workspace);
            return STRATA_SUCCESS;
          }};
}

const ImplList<Conv1dProblem>& impls(bool backward) {
  auto make = [](bool bwd) {
    ImplList<Conv1dProblem> l;
#if STRATA_WITH_CUDA
    // The common case first (rows, W <= 4, contiguous channels); time_tile takes everything. cuda.sm90.pipe
    // (16-bit activations, cp.async staging): first for the backward (H200 s5run2: 0.728 vs 0.966 ms for vec,
    // bf16 B=4 T=8192 D=8192 W=4), after vec for the forward, where it was slower (0.373 vs 0.330 ms; varlen
    // 0.516 vs 0.458), so only STRATA_FORCE_IMPL reaches it there.
    // One CUDA entry: `reason` (nullptr = every problem the dtypes allow) narrows what it takes; the backward
    // kernels share one workspace layout.
    using FwdFn = int (*)(const Conv1dParams&, void*);
    using BwdFn = int (*)(const Conv1dParams&, void*, void*);
    auto cuda_impl = [bwd](const char* name, const char* (*reason)(const Conv1dParams&, bool), FwdFn fwd_fn,
                           BwdFn bwd_fn) {
      return Implementation<Conv1dProblem>{
          name,
          [bwd, reason](const Conv1dProblem& p) {
            std::string r = reject_unless_cuda(p.device, 90);
            if (r.empty()) r = dtypes_reason(p);
            if (r.empty() && reason) r = reason(p.params, bwd);
            return r;
          },
          bwd ? std::function<size_t(const Conv1dProblem&)>(
                    [](const Conv1dProblem& p) { return causal_conv1d_cuda_bwd_workspace(p.params); })
              : std::function<size_t(const Conv1dProblem&)>(),
          [bwd, fwd_fn, bwd_fn](const Conv1dProblem& p, const Launch& launch) {
            const Conv1dParams k = bind(p, launch);
            STRATA_RETURN_IF_ERROR(causal_conv1d_cuda_check_cu_seqlens(k, bwd ? kBwd : kFwd, launch.cuda_stream));
            return static_cast<strata_status>(bwd ? bwd_fn(k, launch.workspace, launch.cuda_stream)
                                                  : fwd_fn(k, launch.cuda_stream));
          }};
    };
    auto pipe = cuda_impl("cuda.sm90.pipe", causal_conv1d_pipe_reason, causal_conv1d_fwd_cuda_pipe,
                          causal_conv1d_bwd_cuda_pipe);
    // cuda.sm90.lean (backward, batch rows and, since session 8, cu_seqlens packs): conv_bwd_pipe's staging with
    // a check-free step for the tokens inside a tile and a sequence (cuda_sm90.cu); first. pipe stays listed for
    // STRATA_FORCE_IMPL and the conformance suite.
    if (bwd)
      l.push_back(cuda_impl("cuda.sm90.lean", causal_conv1d_lean_reason, causal_conv1d_fwd_cuda_pipe,
                            causal_conv1d_bwd_cuda_lean));
    if (bwd) l.push_back(pipe);
    l.push_back(cuda_impl("cuda.sm90.vec", causal_conv1d_vec_reason, causal_conv1d_fwd_cuda_vec,
                          causal_conv1d_bwd_cuda_vec));
    if (!bwd) l.push_back(pipe);
    l.push_back(cuda_impl("cuda.sm90.time_tile", nullptr, causal_conv1d_fwd_cuda, causal_conv1d_bwd_cuda));
#endif
    auto cpu_workspace = [bwd] {
      return bwd ? std::function<size_t(const Conv1dProblem&)>(
                       [](const Conv1dProblem& p) { return causal_conv1d_cpu_bwd_workspace(p.params); })
                 : std::function<size_t(const Conv1dProblem&)>();
    };
    // AVX512-BF16 first: the AVX3 kernels with native rounding of bf16 outputs.
    if (const Conv1dCpuFn fn = bwd ? causal_conv1d_bwd_cpu_native_bf16() : causal_conv1d_fwd_cpu_native_bf16())
      l.push_back(cpu_impl(
          tile::kAvx512Bf16Impl,
          [](const Conv1dProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty() && !tile::cpu_has_avx512_bf16()) r = "this CPU lacks avx512_bf16";
            if (r.empty() && !half_or_f32(p.params.x_dtype))
              r = fmt::format("handles f32/bf16/f16 x, got {}", dtype_name(p.params.x_dtype));
            return r;
          },
          cpu_workspace(), fn));
    for (const tile::CpuIsa& isa : tile::cpu_isas()) {
      const Conv1dCpuFn fn = bwd ? causal_conv1d_bwd_cpu(isa.hwy_target) : causal_conv1d_fwd_cpu(isa.hwy_target);
      if (!fn) continue;  // target not compiled into this build
      l.push_back(cpu_impl(
          isa.impl,
          [isa](const Conv1dProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty()) r = tile::reject_cpu_isa(isa);
            if (r.empty() && !half_or_f32(p.params.x_dtype))
              r = fmt::format("handles f32/bf16/f16 x, got {}", dtype_name(p.params.x_dtype));
            return r;
          },
          cpu_workspace(), fn));
    }
    l.push_back(cpu_impl(
        "reference", [](const Conv1dProblem& p) { return reject_unless_cpu(p.device); }, {},
        bwd ? [](const Conv1dParams& p, void*) { causal_conv1d_bwd_reference(p); }
            : [](const Conv1dParams& p, void*) { causal_conv1d_fwd_reference(p); }));
    return l;
  };
  static const ImplList<Conv1dProblem> fwd = make(false), bwd = make(true);
  return backward ? bwd : fwd;
}

constexpr std::initializer_list<int32_t> kFloats = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16,
                                                    STRATA_DTYPE_F64};
constexpr std::initializer_list<int32_t> kInts = {STRATA_DTYPE_I32, STRATA_DTYPE_I64};

// One tensor argument: its name, descriptor (nullptr when absent) and role.
struct Arg {
  const char* name;
  const strata_tensor_desc* d;
  bool output;
  bool integer;
};

// The shared part of forward and backward validation (ARCHITECTURE.md §3 order: null -> device -> dtype ->
// shape -> strides -> attributes). `args` lists every tensor; x, weight and the outputs that are not optional
// have been checked non-null by the caller's list (required = true).
struct Shapes {
  int64_t B, T, D, W, N;
  int32_t mode;
};

strata_status validate(const char* op, const std::vector<Arg>& args, const std::vector<const char*>& required,
                       const strata_tensor_desc* x, const strata_tensor_desc* weight,
                       const strata_tensor_desc* cu, const strata_tensor_desc* seq, int32_t activation,
                       int32_t weight_layout, Shapes& sh) {
  // null
  for (const Arg& a : args) {
    bool req = false;
    for (const char* r : required) req |= std::string_view(r) == a.name;
    if (req || a.d) STRATA_RETURN_IF_ERROR(check_desc(op, a.name, a.d));
  }
  // device
  for (const Arg& a : args)
    if (a.d) STRATA_RETURN_IF_ERROR(check_same_device(op, a.name, *a.d, *x, "x"));
  // dtype
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "x", *x, kFloats));
  for (const Arg& a : args) {
    if (!a.d || a.d == x) continue;
    const std::string_view n(a.name);
    if (a.integer) {
      STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.d, kInts));
    } else if (n == "y" || n == "residual" || n == "dy" || n == "dx") {
      if (a.d->dtype != x->dtype)
        return fail(STRATA_ERROR_INVALID_DTYPE, "{}: {} must have the dtype of x ({}), got {}", op, a.name,
                    dtype_name(x->dtype), dtype_name(a.d->dtype));
    } else {
      STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.d, kFloats));
    }
    if (!a.integer) STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, a.name, *a.d));
  }
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, "x", *x));
  // shape
  STRATA_RETURN_IF_ERROR(check_rank_in(op, "x", *x, 3, 3));
  STRATA_RETURN_IF_ERROR(check_rank_in(op, "weight", *weight, 2, 2));
  sh.B = x->shape[0];
  sh.T = x->shape[1];
  sh.D = x->shape[2];
  if (weight_layout != 0 && weight_layout != 1)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: weight_layout must be 0 ([D, W]) or 1 ([W, D]), got {}", op,
                weight_layout);
  sh.W = weight->shape[weight_layout == 0 ? 1 : 0];
  const int64_t wd = weight->shape[weight_layout == 0 ? 0 : 1];
  if (wd != sh.D)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: weight must have shape {} ({}, D = {} from x), got {}", op,
                weight_layout == 0 ? fmt::format("[{}, W]", sh.D) : fmt::format("[W, {}]", sh.D),
                weight_layout == 0 ? "[D, W]" : "[W, D]", sh.D, shape_str(*weight));
  if (sh.W < 2 || sh.W > kMaxWidth)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: the kernel width W must be in [2, {}], got W = {} (weight {})", op,
                kMaxWidth, sh.W, shape_str(*weight));
  if (cu && seq)
    return fail(STRATA_ERROR_INVALID_VALUE,
                "{}: give cu_seqlens (packed sequences) or seq_idx (sequence ids per token), not both", op);
  sh.mode = cu ? kModeCuSeqlens : (seq ? kModeSeqIdx : kModeRows);
  sh.N = sh.B;
  if (cu) {
    STRATA_RETURN_IF_ERROR(check_rank_in(op, "cu_seqlens", *cu, 1, 1));
    if (cu->shape[0] < 1)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens must have N + 1 >= 1 entries, got shape {}", op,
                  shape_str(*cu));
    if (sh.B != 1)
      return fail(STRATA_ERROR_INVALID_SHAPE,
                  "{}: with cu_seqlens (a variable-length pack) x must have B = 1 (x.shape[0]), got x {}", op,
                  shape_str(*x));
    sh.N = cu->shape[0] - 1;
    if (sh.N == 0 && sh.T > 0)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens {} holds no sequence (N = 0) but x has T = {} tokens",
                  op, shape_str(*cu), sh.T);
  }
  if (seq) {
    const int64_t e[] = {sh.B, sh.T};
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, "seq_idx", *seq, e, "[B, T] of x"));
  }
  const int64_t act_shape[] = {sh.B, sh.T, sh.D};
  const int64_t state_shape[] = {sh.N, sh.D, sh.W - 1};
  const int64_t vec_shape[] = {sh.D};
  for (const Arg& a : args) {
    if (!a.d || a.d == x || a.integer || a.d == weight) continue;
    const std::string_view n(a.name);
    if (n == "y" || n == "residual" || n == "dy" || n == "dx") {
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, act_shape, "the shape of x [B, T, D]"));
    } else if (n == "bias" || n == "dbias") {
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, vec_shape, "[D]"));
    } else if (n == "dweight") {
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, shape_of(*weight), "the shape of weight"));
    } else {  // states
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, state_shape, "[N, D, W-1] (N sequences)"));
    }
  }
  // strides
  for (const Arg& a : args)
    if (a.d) STRATA_RETURN_IF_ERROR(check_strides(op, a.name, *a.d, a.output, false));
  // attributes
  if (activation != kActNone && activation != kActSilu)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: activation must be 0 (none) or 1 (silu), got {}", op,
                activation);
  return STRATA_SUCCESS;
}

void copy3(int64_t (&dst)[3], const strata_tensor_desc* d) {
  for (int i = 0; i < 3; ++i) dst[i] = d ? d->strides[i] : 0;
}

// Fills the common part of the params and the problem's tensor table.
Conv1dProblem make_problem(const std::vector<Arg>& args, const Shapes& sh, const strata_tensor_desc* weight,
                           int32_t weight_layout, int32_t activation, bool backward) {
  Conv1dProblem pr;
  pr.backward = backward;
  pr.device = args[0].d->device;
  pr.dtypes.fill(-1);
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].d) continue;
    pr.offsets[i] = args[i].d->offset;
    pr.dtypes[i] = args[i].d->dtype;
  }
  Conv1dParams& k = pr.params;
  k.B = sh.B;
  k.T = sh.T;
  k.D = sh.D;
  k.W = sh.W;
  k.N = sh.N;
  k.mode = sh.mode;
  k.activation = activation;
  k.w_dtype = weight->dtype;
  k.ws[0] = weight->strides[weight_layout == 0 ? 0 : 1];
  k.ws[1] = weight->strides[weight_layout == 0 ? 1 : 0];
  return pr;
}

std::string opt_str(const strata_tensor_desc* d) { return d ? desc_str(*d) : std::string("none"); }

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4, 8192, 8192}, device);
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_F32, {8192, 4}, device);
  return strata_causal_conv1d_fwd_plan(&x, &w, nullptr, nullptr, nullptr, nullptr, nullptr, &x, nullptr, 1, 0,
                                       plan);
}
strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {4, 8192, 8192}, device);
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_F32, {8192, 4}, device);
  return strata_causal_conv1d_bwd_plan(&x, &w, nullptr, nullptr, nullptr, nullptr, &x, nullptr, &x, &w, nullptr,
                                       nullptr, 1, 0, plan);
}

const OpRegistrar kRegisterFwd({kFwd, [] { return impl_names_of(impls(false)); }, probe});
const OpRegistrar kRegisterBwd({kBwd, [] { return impl_names_of(impls(true)); }, probe_bwd});

// The descriptors in the op's tensor order (args lists every tensor in that order).
std::vector<const strata_tensor_desc*> descs_of(const std::vector<Arg>& args) {
  std::vector<const strata_tensor_desc*> out;
  for (const Arg& a : args) out.push_back(a.d);
  return out;
}

bool unit_channels(const strata_tensor_desc* d) { return !d || d->shape[2] <= 1 || d->strides[2] == 1; }

}  // namespace

strata_status check_cu_seqlens_values(const Conv1dParams& p, const char* op) {
  const int64_t N = p.N;
  auto cu = [&](int64_t i) { return ld_int(p.cu_seqlens, p.cu_dtype, i * p.cus); };
  if (cu(0) != 0) return fail(STRATA_ERROR_INVALID_VALUE, "{}: cu_seqlens[0] must be 0, got {}", op, cu(0));
  for (int64_t n = 0; n < N; ++n)
    if (cu(n + 1) < cu(n))
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "{}: cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} after cu_seqlens[{}] = {}", op,
                  n + 1, cu(n + 1), n, cu(n));
  if (cu(N) != p.T)
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: the last entry cu_seqlens[{}] must equal T = {} (x.shape[1]), got {}",
                op, N, p.T, cu(N));
  return STRATA_SUCCESS;
}

}  // namespace strata::conv

using namespace strata;
using namespace strata::conv;

extern "C" strata_status strata_causal_conv1d_fwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* weight, const strata_tensor_desc* bias,
    const strata_tensor_desc* residual, const strata_tensor_desc* initial_state, const strata_tensor_desc* cu_seqlens,
    const strata_tensor_desc* seq_idx, const strata_tensor_desc* y, const strata_tensor_desc* final_state,
    int32_t activation, int32_t weight_layout, strata_plan* plan) {
  PlanKey key(kFwd);
  key.add(x).add(weight).add(bias).add(residual).add(initial_state).add(cu_seqlens).add(seq_idx).add(y).add(
      final_state);
  key.add_attr(activation).add_attr(weight_layout);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    const std::vector<Arg> args = {{"x", x, false, false},
                                   {"weight", weight, false, false},
                                   {"bias", bias, false, false},
                                   {"residual", residual, false, false},
                                   {"initial_state", initial_state, false, false},
                                   {"cu_seqlens", cu_seqlens, false, true},
                                   {"seq_idx", seq_idx, false, true},
                                   {"y", y, true, false},
                                   {"final_state", final_state, true, false}};
    Shapes sh{};
    STRATA_RETURN_IF_ERROR(
        validate(kFwd, args, {"x", "weight", "y"}, x, weight, cu_seqlens, seq_idx, activation, weight_layout, sh));
    Conv1dProblem pr = make_problem(args, sh, weight, weight_layout, activation, false);
    Conv1dParams& k = pr.params;
    k.x_dtype = x->dtype;
    k.b_dtype = bias ? bias->dtype : 0;
    k.h0_dtype = initial_state ? initial_state->dtype : 0;
    k.hT_dtype = final_state ? final_state->dtype : 0;
    k.cu_dtype = cu_seqlens ? cu_seqlens->dtype : 0;
    k.seq_dtype = seq_idx ? seq_idx->dtype : 0;
    copy3(k.xs, x);
    copy3(k.ys, y);
    copy3(k.rs, residual);
    copy3(k.h0s, initial_state);
    copy3(k.hTs, final_state);
    k.bs = bias ? bias->strides[0] : 0;
    k.cus = cu_seqlens ? cu_seqlens->strides[0] : 1;
    if (seq_idx) k.seqs[0] = seq_idx->strides[0], k.seqs[1] = seq_idx->strides[1];
    k.channels_contiguous = unit_channels(x) && unit_channels(y) && unit_channels(residual);
    const std::string summary = fmt::format(
        "x:{} weight:{}{} bias:{} residual:{} initial_state:{} cu_seqlens:{} seq_idx:{} y:{} final_state:{} "
        "activation={}",
        desc_str(*x), desc_str(*weight), weight_layout ? " ([W, D])" : "", opt_str(bias), opt_str(residual),
        opt_str(initial_state), opt_str(cu_seqlens), opt_str(seq_idx), desc_str(*y), opt_str(final_state),
        activation ? "silu" : "none");
    // Tensors without elements are never read or written (and frameworks pass NULL for them).
    const std::vector<const strata_tensor_desc*> tensors = descs_of(args);
    // Nothing to write: no token-channel element and no final-state element.
    const bool empty = numel(*y) == 0 && (!final_state || numel(*final_state) == 0);
    const PlanInfo info{kFwd, tensors, nonempty_mask_of(tensors), x->device, summary, empty};
    return dispatch(info, std::move(pr), impls(false), result);
  }, plan);
}

extern "C" strata_status strata_causal_conv1d_bwd_plan(
    const strata_tensor_desc* x, const strata_tensor_desc* weight, const strata_tensor_desc* bias,
    const strata_tensor_desc* initial_state, const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* seq_idx,
    const strata_tensor_desc* dy, const strata_tensor_desc* dfinal_state, const strata_tensor_desc* dx,
    const strata_tensor_desc* dweight, const strata_tensor_desc* dbias, const strata_tensor_desc* dinitial_state,
    int32_t activation, int32_t weight_layout, strata_plan* plan) {
  PlanKey key(kBwd);
  key.add(x).add(weight).add(bias).add(initial_state).add(cu_seqlens).add(seq_idx).add(dy).add(dfinal_state).add(
      dx);
  key.add(dweight).add(dbias).add(dinitial_state).add_attr(activation).add_attr(weight_layout);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    const std::vector<Arg> args = {{"x", x, false, false},
                                   {"weight", weight, false, false},
                                   {"bias", bias, false, false},
                                   {"initial_state", initial_state, false, false},
                                   {"cu_seqlens", cu_seqlens, false, true},
                                   {"seq_idx", seq_idx, false, true},
                                   {"dy", dy, false, false},
                                   {"dfinal_state", dfinal_state, false, false},
                                   {"dx", dx, true, false},
                                   {"dweight", dweight, true, false},
                                   {"dbias", dbias, true, false},
                                   {"dinitial_state", dinitial_state, true, false}};
    if (dinitial_state && !initial_state)
      return fail(STRATA_ERROR_NULL_POINTER,
                  "{}: initial_state must not be NULL when dinitial_state is asked for (its gradient needs the "
                  "forward's initial state)", kBwd);
    Shapes sh{};
    STRATA_RETURN_IF_ERROR(validate(kBwd, args, {"x", "weight", "dy", "dx", "dweight"}, x, weight, cu_seqlens, seq_idx,
                                    activation, weight_layout, sh));
    if (dweight->dtype != weight->dtype)
      return fail(STRATA_ERROR_INVALID_DTYPE, "{}: dweight must have the dtype of weight ({}), got {}", kBwd,
                  dtype_name(weight->dtype), dtype_name(dweight->dtype));
    if (dbias && bias && dbias->dtype != bias->dtype)
      return fail(STRATA_ERROR_INVALID_DTYPE, "{}: dbias must have the dtype of bias ({}), got {}", kBwd,
                  dtype_name(bias->dtype), dtype_name(dbias->dtype));
    Conv1dProblem pr = make_problem(args, sh, weight, weight_layout, activation, true);
    Conv1dParams& k = pr.params;
    k.x_dtype = x->dtype;
    k.b_dtype = bias ? bias->dtype : (dbias ? dbias->dtype : 0);
    k.h0_dtype = initial_state ? initial_state->dtype : 0;
    k.dhT_dtype = dfinal_state ? dfinal_state->dtype : 0;
    k.dh0_dtype = dinitial_state ? dinitial_state->dtype : 0;
    k.cu_dtype = cu_seqlens ? cu_seqlens->dtype : 0;
    k.seq_dtype = seq_idx ? seq_idx->dtype : 0;
    copy3(k.xs, x);
    copy3(k.dys, dy);
    copy3(k.dxs, dx);
    copy3(k.h0s, initial_state);
    copy3(k.dhTs, dfinal_state);
    copy3(k.dh0s, dinitial_state);
    k.bs = bias ? bias->strides[0] : 0;
    k.dbs = dbias ? dbias->strides[0] : 0;
    k.dws[0] = dweight->strides[weight_layout == 0 ? 0 : 1];
    k.dws[1] = dweight->strides[weight_layout == 0 ? 1 : 0];
    k.cus = cu_seqlens ? cu_seqlens->strides[0] : 1;
    if (seq_idx) k.seqs[0] = seq_idx->strides[0], k.seqs[1] = seq_idx->strides[1];
    k.channels_contiguous = unit_channels(x) && unit_channels(dy) && unit_channels(dx);
    const std::string summary = fmt::format(
        "x:{} weight:{}{} bias:{} initial_state:{} cu_seqlens:{} seq_idx:{} dy:{} dfinal_state:{} dx:{} dweight:{} "
        "dbias:{} dinitial_state:{} activation={}",
        desc_str(*x), desc_str(*weight), weight_layout ? " ([W, D])" : "", opt_str(bias), opt_str(initial_state),
        opt_str(cu_seqlens), opt_str(seq_idx), desc_str(*dy), opt_str(dfinal_state), desc_str(*dx),
        desc_str(*dweight), opt_str(dbias), opt_str(dinitial_state), activation ? "silu" : "none");
    // Tensors without elements are never read or written (and frameworks pass NULL for them).
    const std::vector<const strata_tensor_desc*> tensors = descs_of(args);
    // dweight (and dbias) are written even when T = 0 (zeros); only D = 0 leaves nothing to write.
    const bool empty = sh.D == 0;
    const PlanInfo info{kBwd, tensors, nonempty_mask_of(tensors), x->device, summary, empty};
    return dispatch(info, std::move(pr), impls(true), result);
  }, plan);
}
