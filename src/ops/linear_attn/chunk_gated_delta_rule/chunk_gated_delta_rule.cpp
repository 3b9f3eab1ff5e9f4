// chunk_gated_delta_rule: definition, validation, implementation lists and the two plans (forward, backward)
// of the full Gated DeltaNet operator (ops_gdn_kda.md §4.12; README.md beside this file).
//   forward  tensors {q, k, v, g, beta, initial_state, cu_seqlens, o, final_state, saved}
//   backward tensors {q, k, v, g, beta, initial_state, cu_seqlens, do, dht, dq, dk, dv, dg, dbeta, dh0, saved}
// `saved` (optional, uint8 [strata_chunk_gated_delta_rule_saved_bytes]): the forward's residuals, written by the
// forward and read by the backward, which then skips re-running the forward (CUDA; 0 bytes on the CPU, whose
// implementations save nothing and re-compute). Without it the backward re-computes everything it needs from the
// forward's inputs.
// Implementations, in dispatch order: cuda.sm90.fused (forward only: prepare_wy_repr_fwd, then one pass that
// computes o inside the state recurrence, never materialising h; bf16 / f16 tokens, K <= 128, cuda_sm90.cu; the
// gated Q Kᵀ formed inside the pass or, when the pass splits V into several blocks per head, chunk-parallel
// before it), cuda.sm90.fused_inline, cuda.sm90.fused_pqk, cuda.sm90.fused_w16 and cuda.sm90.fused_prep (the same
// with a form forced: inline P, pre-computed P, inline P with 16-warp pass blocks, w / u / P from one kernel; same
// bits; reached only by STRATA_FORCE_IMPL, for the tests and benchmarks), cuda.sm90.fused_wgmma_split (session 9:
// the warp-specialised pass on Hopper warpgroup MMA, bf16 K = 128; what cuda.sm90.fused runs where it applies),
// cuda.sm90.chunked (the sub-operators' CUDA kernels composed, cuda_sm90.cu),
// cpu.<isa> (chunked WY form in f32, one per compiled GEMM ISA),
// reference (float64 token recurrence and its exact reverse-mode derivative).
#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "opbase/plan.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::linear_attn {
namespace {

constexpr const char* kFwd = "chunk_gated_delta_rule_fwd";
constexpr const char* kBwd = "chunk_gated_delta_rule_bwd";
constexpr int kFwdTensors = 10, kBwdTensors = 16;

struct GdnProblem {
  GdnParams params;  // pointers bound at run time
  bool bwd = false;
  int64_t offsets[kBwdTensors] = {};
  strata_device device{};
#if STRATA_WITH_CUDA
  // What cuda.sm90.fused (GdnFusedForm::kAuto) runs, resolved once when the plan is made (forward on a CUDA device:
  // gdn_cuda_fused_fwd_auto_form with the plan device's SM count), so that its runs do not re-run the rule's host
  // work; kAuto (the run resolves it) where the device's properties could not be read.
  GdnFusedForm fused_form = GdnFusedForm::kAuto;
#endif
};

// Tensor slots of GdnParams in each op's tensor order (nullptr: cu_seqlens, bound separately).
std::vector<GdnTensor GdnParams::*> slots_of(bool bwd) {
  if (!bwd)
    return {&GdnParams::q, &GdnParams::k, &GdnParams::v,  &GdnParams::g,     &GdnParams::beta,
            &GdnParams::h0, nullptr,      &GdnParams::o, &GdnParams::ht, &GdnParams::saved};
  return {&GdnParams::q,   &GdnParams::k,  &GdnParams::v,  &GdnParams::g,  &GdnParams::beta,
          &GdnParams::h0,  nullptr,        &GdnParams::do_, &GdnParams::dht, &GdnParams::dq,
          &GdnParams::dk,  &GdnParams::dv, &GdnParams::dg, &GdnParams::dbeta, &GdnParams::dh0, &GdnParams::saved};
}

GdnParams bind(const GdnProblem& pr, const Launch& l) {
  GdnParams p = pr.params;
  const auto slots = slots_of(pr.bwd);
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i]) {
      p.cu_seqlens = pr.params.cu_seqlens ? static_cast<const int64_t*>(l.ptrs[i]) + pr.offsets[i] : nullptr;
      continue;
    }
    GdnTensor& t = p.*slots[i];
    if (!t.data) continue;  // absent (the plan marks present tensors with a non-null sentinel)
    t.data = l.ptrs[i] ? static_cast<char*>(l.ptrs[i]) + pr.offsets[i] * static_cast<int64_t>(dtype_size(t.dtype))
                       : nullptr;
  }
  return p;
}

bool any_f64(const GdnProblem& pr) {
  for (auto s : slots_of(pr.bwd))
    if (s && (pr.params.*s).data && (pr.params.*s).dtype == STRATA_DTYPE_F64) return true;
  return false;
}

// The bytes `saved` must have: the CUDA implementation's residuals (gdn_cuda_saved_bytes) on a CUDA device, 0 on
// the CPU (its implementations save nothing: an empty `saved` is accepted there and ignored). Shape fields of p
// only (B, T, H, HV, K, V, N, cu_seqlens present, l2norm, the dtypes of q, k, v).
size_t saved_bytes_on(strata_device device, const GdnParams& p) {
  return device.type == STRATA_DEVICE_CUDA ? gdn_cuda_saved_bytes(p) : 0;
}

const ImplList<GdnProblem>& impls() {
  static const ImplList<GdnProblem> list = [] {
    ImplList<GdnProblem> l;
#if STRATA_WITH_CUDA
    // The fused forward: the automatic form first, then the forced ones (STRATA_FORCE_IMPL only: tests, benches).
    const std::pair<const char*, GdnFusedForm> fused[] = {{"cuda.sm90.fused", GdnFusedForm::kAuto},
                                                          {"cuda.sm90.fused_inline", GdnFusedForm::kInline},
                                                          {"cuda.sm90.fused_pqk", GdnFusedForm::kPrecomputedP},
                                                          {"cuda.sm90.fused_w16", GdnFusedForm::kInline16},
                                                          {"cuda.sm90.fused_prep", GdnFusedForm::kPrep},
                                                          {"cuda.sm90.fused_wgmma_split", GdnFusedForm::kWgmmaSplit},
                                                          {"cuda.sm90.fused_fold", GdnFusedForm::kFold},
                                                          {"cuda.sm90.fused_norm", GdnFusedForm::kNorm},
                                                          {"cuda.sm90.fused_norm_r", GdnFusedForm::kNormR},
                                                          {"cuda.sm90.fused_norm_cl", GdnFusedForm::kNormCluster}};
    for (const auto& [name, form] : fused)
      l.push_back({name,
                   [form](const GdnProblem& p) {
                     std::string r = reject_unless_cuda(p.device, 90);
                     if (r.empty() && p.bwd) r = "forward only (the backward needs the chunk states)";
                     if (r.empty()) r = gdn_cuda_fused_fwd_reject(p.params, form);
                     return r;
                   },
                   [](const GdnProblem& p) { return gdn_cuda_fused_fwd_workspace(p.params); },
                   [form](const GdnProblem& pr, const Launch& launch) {
                     return gdn_cuda_fused_fwd(bind(pr, launch), form == GdnFusedForm::kAuto ? pr.fused_form : form,
                                               launch.workspace, launch.cuda_stream);
                   }});
    l.push_back({"cuda.sm90.chunked", [](const GdnProblem& p) { return reject_unless_cuda(p.device, 90); },
                 [](const GdnProblem& p) {
                   return p.bwd ? gdn_cuda_bwd_workspace(p.params) : gdn_cuda_fwd_workspace(p.params);
                 },
                 [](const GdnProblem& pr, const Launch& launch) {
                   const GdnParams p = bind(pr, launch);
                   return pr.bwd ? gdn_cuda_bwd(p, launch.workspace, launch.cuda_stream)
                                 : gdn_cuda_fwd(p, launch.workspace, launch.cuda_stream);
                 }});
    // Forced only (STRATA_FORCE_IMPL: tests, benches): the backward without the session-17 defaults' l2norm folds —
    // dq's and dk's l2norm backward as row_norm_bwd passes in the tail over chunk_bwd_dqkwg's f32 dq head sums
    // (GdnBwdDq::kPlain) and prepare_wy_repr_bwd's f32 dk (kWyTrimmed), what `cuda.sm90.chunked` ran until session 16.
    // Kept as the baseline of the fold timings and so that the conformance suite still covers those kernels.
    l.push_back({"cuda.sm90.chunked_unfolded",
                 [](const GdnProblem& p) {
                   std::string r = reject_unless_cuda(p.device, 90);
                   if (r.empty() && !p.bwd) r = "backward only";
                   return r;
                 },
                 [](const GdnProblem& p) { return gdn_cuda_bwd_workspace(p.params); },
                 [](const GdnProblem& pr, const Launch& launch) {
                   GdnParams p = bind(pr, launch);
                   p.bwd_dq = GdnBwdDq::kPlain;
                   return gdn_cuda_bwd(p, launch.workspace, launch.cuda_stream, nullptr, 0, kWyTrimmed);
                 }});
#endif
    for (const tile::CpuIsa& isa : tile::cpu_isas()) {
      if (!gdn_cpu_chunked_available(isa.hwy_target)) continue;  // GEMM not compiled for this target
      const int64_t target = isa.hwy_target;
      l.push_back({isa.impl,
                   [isa](const GdnProblem& p) {
                     std::string r = reject_unless_cpu(p.device);
                     if (r.empty()) r = tile::reject_cpu_isa(isa);
                     if (r.empty() && any_f64(p)) r = "computes in f32; f64 tensors go to the reference";
                     return r;
                   },
                   [](const GdnProblem& p) {
                     return p.bwd ? gdn_cpu_bwd_workspace(p.params) : gdn_cpu_fwd_workspace(p.params);
                   },
                   [target](const GdnProblem& pr, const Launch& launch) {
                     const GdnParams p = bind(pr, launch);
                     STRATA_RETURN_IF_ERROR(gdn_check_cu_seqlens(pr.bwd ? kBwd : kFwd, p));
                     if (pr.bwd)
                       gdn_cpu_chunked_bwd(p, target, launch.workspace);
                     else
                       gdn_cpu_chunked_fwd(p, target, launch.workspace);
                     return STRATA_SUCCESS;
                   }});
    }
    l.push_back({"reference", [](const GdnProblem& p) { return reject_unless_cpu(p.device); },
                 [](const GdnProblem& p) { return p.bwd ? gdn_recurrent_bwd_workspace<double>(p.params) : size_t{0}; },
                 [](const GdnProblem& pr, const Launch& launch) {
                   const GdnParams p = bind(pr, launch);
                   STRATA_RETURN_IF_ERROR(gdn_check_cu_seqlens(pr.bwd ? kBwd : kFwd, p));
                   if (pr.bwd)
                     gdn_recurrent_bwd<double>(p, launch.workspace);
                   else
                     gdn_recurrent_fwd<double>(p);
                   return STRATA_SUCCESS;
                 }});
    return l;
  }();
  return list;
}

// The shape fields of GdnParams from validated descriptors (q [B, T, H, K], v [B, T, HV, V], cu_seqlens [N + 1]
// or NULL); tensors absent except the dtypes of q, k, v (cu_seqlens: a non-null stand-in when given).
GdnParams shape_params(const strata_tensor_desc& q, const strata_tensor_desc& k, const strata_tensor_desc& v,
                       const strata_tensor_desc* cu, int32_t l2norm) {
  GdnParams p;
  p.q.dtype = q.dtype, p.k.dtype = k.dtype, p.v.dtype = v.dtype;
  p.B = q.shape[0], p.T = q.shape[1], p.H = q.shape[2], p.K = q.shape[3];
  p.HV = v.shape[2], p.V = v.shape[3];
  p.N = cu ? cu->shape[0] - 1 : p.B;
  if (cu) p.cu_seqlens = reinterpret_cast<const int64_t*>(uintptr_t{1});
  p.l2norm = l2norm != 0;
  return p;
}

// ---- validation (null -> device -> dtype -> shape -> strides -> attributes, ARCHITECTURE.md §3) ----

struct Arg {
  const char* name;
  const strata_tensor_desc* d;
  bool required;
  enum Kind { kToken, kState, kCu, kSaved } kind;
  bool output;
};

strata_status validate(const char* op, const std::vector<Arg>& args, float scale, int32_t l2norm) {
  for (const Arg& a : args) {
    if (a.required && !a.d) return fail(STRATA_ERROR_NULL_POINTER, "{}: {} must not be NULL", op, a.name);
    if (a.d) STRATA_RETURN_IF_ERROR(check_desc(op, a.name, a.d));
  }
  const strata_tensor_desc& q = *args[0].d;
  for (const Arg& a : args)
    if (a.d) STRATA_RETURN_IF_ERROR(check_same_device(op, a.name, *a.d, q, "q"));
  for (const Arg& a : args) {
    if (!a.d) continue;
    if (a.kind == Arg::kCu) {
      STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.d, {STRATA_DTYPE_I64}));
    } else if (a.kind == Arg::kSaved) {
      STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.d, {STRATA_DTYPE_U8}));
      continue;
    } else if (a.kind == Arg::kState) {
      STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.d, {STRATA_DTYPE_F32, STRATA_DTYPE_F64}));
    } else {
      STRATA_RETURN_IF_ERROR(
          check_dtype_in(op, a.name, *a.d, {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16, STRATA_DTYPE_F64}));
    }
    if (a.kind != Arg::kCu) STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, a.name, *a.d));
  }
  // shapes: q [B, T, H, K] fixes B, T, H, K; v [B, T, HV, V] fixes HV, V
  STRATA_RETURN_IF_ERROR(check_rank_in(op, "q", q, 4, 4));
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], K = q.shape[3];
  const strata_tensor_desc& v = *args[2].d;
  STRATA_RETURN_IF_ERROR(check_rank_in(op, "v", v, 4, 4));
  const int64_t HV = v.shape[2], V = v.shape[3];
  const strata_tensor_desc* cu = nullptr;
  for (const Arg& a : args)
    if (a.kind == Arg::kCu) cu = a.d;
  const int64_t N = cu ? cu->shape[0] - 1 : B;
  const int64_t tok4_q[] = {B, T, H, K}, tok4_v[] = {B, T, HV, V}, tok3[] = {B, T, HV}, st4[] = {N, HV, K, V};
  for (const Arg& a : args) {
    if (!a.d || a.d == &q) continue;
    const std::string nm = a.name;
    if (a.kind == Arg::kCu) {
      STRATA_RETURN_IF_ERROR(check_rank_in(op, a.name, *a.d, 1, 1));
      if (a.d->shape[0] < 1)
        return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens must have N + 1 >= 1 entries, got shape {}", op,
                    shape_str(*a.d));
      if (B != 1)
        return fail(STRATA_ERROR_INVALID_SHAPE,
                    "{}: with cu_seqlens (a variable-length pack) q must have B = 1 (q.shape[0]), got q {}", op,
                    shape_str(q));
      continue;
    }
    if (a.kind == Arg::kState) {
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, st4, "[N, HV, K, V]"));
      continue;
    }
    if (a.kind == Arg::kSaved) continue;  // its size once the shapes are known (below)
    if (nm == "k" || nm == "dq" || nm == "dk") {
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, tok4_q, "[B, T, H, K] (the shape of q)"));
    } else if (nm == "g" || nm == "beta" || nm == "dg" || nm == "dbeta") {
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, tok3, "[B, T, HV] (B, T of q, HV = v.shape[2])"));
    } else if (nm != "v") {
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.d, tok4_v, "[B, T, HV, V] (B, T of q; HV, V of v)"));
    }
  }
  if (v.shape[0] != B || v.shape[1] != T)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: v must have shape [B, T, HV, V] with B, T = {}, {} of q, got {}",
                op, B, T, shape_str(v));
  if (H < 1 || HV % H != 0)
    return fail(STRATA_ERROR_INVALID_SHAPE,
                "{}: the value heads HV = {} (v.shape[2]) must be a positive multiple of the q/k heads H = {} "
                "(q.shape[2])",
                op, HV, H);
  if (K < 1 || K > kGdnMaxK)
    return fail(STRATA_ERROR_UNSUPPORTED, "{}: the key head dim K = q.shape[3] must be in [1, {}], got {}", op,
                kGdnMaxK, K);
  if (V < 1)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: the value head dim V = v.shape[3] must be >= 1, got {}", op, V);
  if (cu && cu->shape[0] == 1 && T > 0)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens {} holds no sequence (N = 0) but q has T = {} tokens",
                op, shape_str(*cu), T);
  for (const Arg& a : args) {
    if (!a.d || a.kind != Arg::kSaved) continue;
    STRATA_RETURN_IF_ERROR(check_rank_in(op, a.name, *a.d, 1, 1));
    const size_t want = saved_bytes_on(q.device, shape_params(q, *args[1].d, v, cu, l2norm));
    if (static_cast<size_t>(a.d->shape[0]) != want)
      return fail(STRATA_ERROR_INVALID_SHAPE,
                  "{}: saved must hold strata_chunk_gated_delta_rule_saved_bytes = {} bytes for these shapes, dtypes "
                  "and options on this device{}, got {}",
                  op, want, want == 0 ? " (the CPU implementations save nothing: pass NULL or an empty tensor)" : "",
                  shape_str(*a.d));
  }
  for (const Arg& a : args)
    if (a.d) STRATA_RETURN_IF_ERROR(check_strides(op, a.name, *a.d, a.output, a.kind != Arg::kCu));
  if (!std::isfinite(scale))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: scale must be finite, got {}", op, scale);
  if (l2norm != 0 && l2norm != 1)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: use_qk_l2norm_in_kernel must be 0 or 1, got {}", op, l2norm);
  return STRATA_SUCCESS;
}

void fill(GdnTensor& t, const strata_tensor_desc* d, int64_t& offset) {
  if (!d) return;
  t.data = reinterpret_cast<void*>(uintptr_t{1});  // present; the real pointer is bound at run time
  t.dtype = d->dtype;
  for (int i = 0; i < 4; ++i) t.st[i] = i < d->rank ? d->strides[i] : 0;
  offset = d->offset;
}

int32_t scratch_slots() { return std::clamp(std::max(rt::num_threads(), omp_get_num_procs()), 1, 256); }

strata_status make_plan(bool bwd, const std::vector<Arg>& args, float scale, int32_t l2norm, strata_plan* plan) {
  const char* op = bwd ? kBwd : kFwd;
  PlanKey key(op);
  for (const Arg& a : args) key.add(a.d);
  key.add_attr(scale).add_attr(l2norm);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    STRATA_RETURN_IF_ERROR(validate(op, args, scale, l2norm));
    GdnProblem pr;
    pr.bwd = bwd;
    GdnParams& p = pr.params;
    p = shape_params(*args[0].d, *args[1].d, *args[2].d, args[6].d, l2norm);
    p.cu_seqlens = nullptr;  // bound below
    const auto slots = slots_of(bwd);
    std::vector<const strata_tensor_desc*> descs;
    std::string summary;
    for (size_t i = 0; i < args.size(); ++i) {
      descs.push_back(args[i].d);
      if (args[i].d)
        summary += fmt::format("{}{}:{}", summary.empty() ? "" : " ", args[i].name, desc_str(*args[i].d));
      if (args[i].kind == Arg::kSaved && args[i].d && numel(*args[i].d) == 0) {
        continue;  // nothing saved (the CPU, or an empty problem): absent for the implementations
      } else if (slots[i]) {
        fill(p.*slots[i], args[i].d, pr.offsets[i]);
      } else if (args[i].d) {
        p.cu_seqlens = reinterpret_cast<const int64_t*>(uintptr_t{1});
        p.cu_stride = args[i].d->strides[0];
        pr.offsets[i] = args[i].d->offset;
      }
    }
    const strata_tensor_desc& q = *args[0].d;
    p.scale = scale;
    p.slots = scratch_slots();
    pr.device = q.device;
#if STRATA_WITH_CUDA
    strata_device_properties props{};
    if (!bwd && q.device.type == STRATA_DEVICE_CUDA && strata_device_get_properties(q.device, &props) == STRATA_SUCCESS)
      pr.fused_form = gdn_cuda_fused_fwd_auto_form(p, props.multiprocessor_count);
#endif
    summary += fmt::format(" scale={} use_qk_l2norm_in_kernel={}", scale, l2norm);
    // Nothing to write when every output is empty (zero-length sequences still write final_state / dh0).
    bool empty = true;
    for (const Arg& a : args)
      if (a.output && a.d && numel(*a.d) > 0) empty = false;
    // An empty tensor may come with a NULL pointer.
    const PlanInfo info{op, descs, nonempty_mask_of(descs), q.device, summary, empty};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc q = make_desc(STRATA_DTYPE_BF16, {1, 4096, 4, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 128}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {1, 4096, 8}, device);
  return strata_chunk_gated_delta_rule_fwd_plan(&q, &q, &v, &g, &g, nullptr, nullptr, &v, nullptr, nullptr, 0.088f, 1,
                                                plan);
}

// The backward's probe: the same problem (bf16 B=1 T=4096 H=4 HV=8 K=V=128, l2norm), do given, gradients of q, k,
// v, g, beta, nothing saved (so `strata info` shows the backward's own verdicts, not the forward's).
strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc q = make_desc(STRATA_DTYPE_BF16, {1, 4096, 4, 128}, device);
  const strata_tensor_desc v = make_desc(STRATA_DTYPE_BF16, {1, 4096, 8, 128}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {1, 4096, 8}, device);
  return strata_chunk_gated_delta_rule_bwd_plan(&q, &q, &v, &g, &g, nullptr, nullptr, &v, nullptr, &q, &q, &v, &g, &g,
                                                nullptr, nullptr, 0.088f, 1, plan);
}

// The names each direction lists (strata_op_impl_names, what the conformance suite forces one by one): the shared list
// without the implementations of the other direction only, which reject every problem of this one: the fused
// forward forms (cuda.sm90.fused*, "forward only") and the forced backward forms of cuda.sm90.chunked
// (cuda.sm90.chunked_<form>: chunked_unfolded and the like, "backward only"). A new form follows the naming.
std::vector<std::string> names_for(bool bwd) {
  std::vector<std::string> out;
  for (const std::string& n : impl_names_of(impls())) {
    const bool fwd_only = n.rfind("cuda.sm90.fused", 0) == 0, bwd_only = n.rfind("cuda.sm90.chunked_", 0) == 0;
    if (!(bwd ? fwd_only : bwd_only)) out.push_back(n);
  }
  return out;
}

const OpRegistrar kRegisterFwd({kFwd, [] { return names_for(false); }, probe});
const OpRegistrar kRegisterBwd({kBwd, [] { return names_for(true); }, probe_bwd});

}  // namespace

strata_status gdn_check_cu_seqlens(const char* op, const GdnParams& p) {
  if (!p.cu_seqlens) return STRATA_SUCCESS;
  auto cu = [&](int64_t i) { return p.cu_seqlens[i * p.cu_stride]; };
  if (cu(0) != 0) return fail(STRATA_ERROR_INVALID_VALUE, "{}: cu_seqlens[0] must be 0, got {}", op, cu(0));
  for (int64_t n = 0; n < p.N; ++n)
    if (cu(n + 1) < cu(n))
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "{}: cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} after cu_seqlens[{}] = {}", op,
                  n + 1, cu(n + 1), n, cu(n));
  if (cu(p.N) != p.T)
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: the last entry cu_seqlens[{}] must equal T = {} (q.shape[1]), got {}",
                op, p.N, p.T, cu(p.N));
  return STRATA_SUCCESS;
}

int32_t gdn_inter_dtype(const GdnParams& p, bool bwd) {
  const int32_t t = p.q.dtype;
  const bool same = p.k.dtype == t && p.v.dtype == t && (!bwd || p.do_.dtype == t);
  return same && (t == STRATA_DTYPE_BF16 || t == STRATA_DTYPE_F16) ? t : STRATA_DTYPE_F32;
}

int64_t gdn_state_chunks(const GdnParams& p) {
  const int64_t per_row = (p.T + kGdnChunk - 1) / kGdnChunk;
  return p.cu_seqlens ? per_row + p.N : per_row;
}

GdnSavedLayout gdn_cuda_saved_layout(const GdnParams& p) {
  const size_t es = gdn_inter_dtype(p, false) == STRATA_DTYPE_F32 ? 4 : 2;
  const size_t bt = static_cast<size_t>(std::max<int64_t>(p.B * p.T, 0));
  const size_t H = static_cast<size_t>(p.H), HV = static_cast<size_t>(p.HV), K = static_cast<size_t>(p.K),
               V = static_cast<size_t>(p.V);
  const size_t rows_h = static_cast<size_t>(p.cu_seqlens ? 1 : std::max<int64_t>(p.B, 0));
  const size_t nth = static_cast<size_t>(std::max<int64_t>(gdn_state_chunks(p), 0));
  GdnSavedLayout L;
  if (bt == 0) return L;  // no token: nothing to save (0 bytes)
  auto take = [&L](size_t bytes) {
    const size_t o = L.bytes;
    L.bytes += (bytes + 255) / 256 * 256;
    if (o + bytes < L.bytes) L.pad_begin[L.pads] = o + bytes, L.pad_end[L.pads++] = L.bytes;
    return o;
  };
  if (p.l2norm) {
    L.qn = take(bt * H * K * es);
    L.kn = take(bt * H * K * es);
    L.rq = take(bt * H * 4);
    L.rk = take(bt * H * 4);
  }
  L.gam = take(bt * HV * 4);
  L.A = take(bt * HV * static_cast<size_t>(kGdnChunk) * es);
  L.w = take(bt * HV * K * es);
  L.vnew = take(bt * HV * V * es);
  L.h = take(rows_h * nth * HV * K * V * es);
  L.h_end = L.h + rows_h * nth * HV * K * V * es;
  return L;
}

}  // namespace strata::linear_attn

using namespace strata;
using namespace strata::linear_attn;
using Arg = strata::linear_attn::Arg;

extern "C" strata_status strata_chunk_gated_delta_rule_fwd_plan(
    const strata_tensor_desc* q, const strata_tensor_desc* k, const strata_tensor_desc* v,
    const strata_tensor_desc* g, const strata_tensor_desc* beta, const strata_tensor_desc* initial_state,
    const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* o, const strata_tensor_desc* final_state,
    const strata_tensor_desc* saved, float scale, int32_t use_qk_l2norm_in_kernel, strata_plan* plan) {
  const std::vector<Arg> args = {{"q", q, true, Arg::kToken, false},
                                 {"k", k, true, Arg::kToken, false},
                                 {"v", v, true, Arg::kToken, false},
                                 {"g", g, true, Arg::kToken, false},
                                 {"beta", beta, true, Arg::kToken, false},
                                 {"initial_state", initial_state, false, Arg::kState, false},
                                 {"cu_seqlens", cu_seqlens, false, Arg::kCu, false},
                                 {"o", o, true, Arg::kToken, true},
                                 {"final_state", final_state, false, Arg::kState, true},
                                 {"saved", saved, false, Arg::kSaved, true}};
  return make_plan(false, args, scale, use_qk_l2norm_in_kernel, plan);
}

extern "C" strata_status strata_chunk_gated_delta_rule_bwd_plan(
    const strata_tensor_desc* q, const strata_tensor_desc* k, const strata_tensor_desc* v,
    const strata_tensor_desc* g, const strata_tensor_desc* beta, const strata_tensor_desc* initial_state,
    const strata_tensor_desc* cu_seqlens, const strata_tensor_desc* d_o, const strata_tensor_desc* dht,
    const strata_tensor_desc* dq, const strata_tensor_desc* dk, const strata_tensor_desc* dv,
    const strata_tensor_desc* dg, const strata_tensor_desc* dbeta, const strata_tensor_desc* dh0,
    const strata_tensor_desc* saved, float scale, int32_t use_qk_l2norm_in_kernel, strata_plan* plan) {
  const std::vector<Arg> args = {{"q", q, true, Arg::kToken, false},
                                 {"k", k, true, Arg::kToken, false},
                                 {"v", v, true, Arg::kToken, false},
                                 {"g", g, true, Arg::kToken, false},
                                 {"beta", beta, true, Arg::kToken, false},
                                 {"initial_state", initial_state, false, Arg::kState, false},
                                 {"cu_seqlens", cu_seqlens, false, Arg::kCu, false},
                                 {"do", d_o, true, Arg::kToken, false},
                                 {"dht", dht, false, Arg::kState, false},
                                 {"dq", dq, true, Arg::kToken, true},
                                 {"dk", dk, true, Arg::kToken, true},
                                 {"dv", dv, true, Arg::kToken, true},
                                 {"dg", dg, true, Arg::kToken, true},
                                 {"dbeta", dbeta, true, Arg::kToken, true},
                                 {"dh0", dh0, false, Arg::kState, true},
                                 {"saved", saved, false, Arg::kSaved, false}};
  return make_plan(true, args, scale, use_qk_l2norm_in_kernel, plan);
}

extern "C" strata_status strata_chunk_gated_delta_rule_saved_bytes(const strata_tensor_desc* q,
                                                                   const strata_tensor_desc* k,
                                                                   const strata_tensor_desc* v,
                                                                   const strata_tensor_desc* cu_seqlens,
                                                                   int32_t use_qk_l2norm_in_kernel, uint64_t* bytes) {
  constexpr const char* op = "strata_chunk_gated_delta_rule_saved_bytes";
  if (!bytes) return fail(STRATA_ERROR_NULL_POINTER, "{}: bytes must not be NULL", op);
  const std::pair<const char*, const strata_tensor_desc*> need[] = {{"q", q}, {"k", k}, {"v", v}};
  for (const auto& [name, d] : need) {
    if (!d) return fail(STRATA_ERROR_NULL_POINTER, "{}: {} must not be NULL", op, name);
    STRATA_RETURN_IF_ERROR(check_desc(op, name, d));
    STRATA_RETURN_IF_ERROR(check_rank_in(op, name, *d, 4, 4));
  }
  if (cu_seqlens) {
    STRATA_RETURN_IF_ERROR(check_desc(op, "cu_seqlens", cu_seqlens));
    STRATA_RETURN_IF_ERROR(check_rank_in(op, "cu_seqlens", *cu_seqlens, 1, 1));
    if (cu_seqlens->shape[0] < 1)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens must have N + 1 >= 1 entries, got shape {}", op,
                  shape_str(*cu_seqlens));
  }
  *bytes = saved_bytes_on(q->device, shape_params(*q, *k, *v, cu_seqlens, use_qk_l2norm_in_kernel));
  return STRATA_SUCCESS;
}
