// fused_cross_entropy: definition, validation, implementation lists and plans of the forward (optionally
// fused with the backward) and the backward (ops_fused.md §1; README.md beside this file).
//   fwd tensors {logits, target, loss, lse, z_loss, dlogits}; bwd tensors {logits, target, lse, dloss, dlogits}.
// Implementations, in dispatch order: cuda.sm90.cluster_stored_exp_pf16, cuda.sm90.cluster_smem,
// cuda.sm90.cluster_chunked, cuda.sm90.cluster_stored_exp, cuda.sm90.block_per_row,
// cpu.avx512_bf16 (on CPUs that have it), cpu.<isa> for each compiled Highway target, reference.
#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "opbase/plan.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::loss {
namespace {

constexpr const char* kFwd = "fused_cross_entropy_fwd";
constexpr const char* kBwd = "fused_cross_entropy_bwd";

struct CeProblem {
  CeParams params;  // pointers bound at run time
  int64_t offsets[6] = {};
  bool present[6] = {};
  strata_device device{};
};

// Tensor positions of each op.
enum FwdArg { kFLogits = 0, kFTarget, kFLoss, kFLse, kFZ, kFDlogits };
enum BwdArg { kBLogits = 0, kBTarget, kBLse, kBDloss, kBDlogits };

template <class T = void>
T* at(const Launch& l, const CeProblem& pr, int i, int32_t dtype) {
  if (!pr.present[i]) return nullptr;
  return reinterpret_cast<T*>(static_cast<char*>(l.ptrs[i]) +
                              pr.offsets[i] * static_cast<int64_t>(dtype_size(dtype)));
}

CeParams bind(const CeProblem& pr, const Launch& l) {
  CeParams p = pr.params;
  p.workspace = l.workspace;
  if (!p.backward) {
    p.logits = at(l, pr, kFLogits, p.dtype);
    p.target = at(l, pr, kFTarget, p.target_dtype);
    p.loss = at(l, pr, kFLoss, p.out_dtype);
    p.lse = at(l, pr, kFLse, p.out_dtype);
    p.z_loss = at(l, pr, kFZ, p.out_dtype);
    p.dlogits = at(l, pr, kFDlogits, p.dtype);
  } else {
    p.logits = at(l, pr, kBLogits, p.dtype);
    p.target = at(l, pr, kBTarget, p.target_dtype);
    p.lse_in = at(l, pr, kBLse, p.out_dtype);
    p.dloss = at(l, pr, kBDloss, p.out_dtype);
    p.dlogits = at(l, pr, kBDlogits, p.dtype);
  }
  return p;
}

// dlogits may be the logits buffer itself (in place) or disjoint from it; a partial overlap would make the
// gradient depend on the order of the writes.
strata_status check_alias(const CeParams& p, const char* op) {
  if (!p.dlogits || p.N == 0) return STRATA_SUCCESS;
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  const char* a0 = static_cast<const char*>(p.logits);
  const char* a1 = a0 + ((p.N - 1) * p.logits_rs + p.V) * es;
  const char* b0 = static_cast<const char*>(p.dlogits);
  const char* b1 = b0 + ((p.N - 1) * p.dlogits_rs + p.V) * es;
  if (b1 <= a0 || a1 <= b0) return STRATA_SUCCESS;
  if (a0 == b0 && p.logits_rs == p.dlogits_rs) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_INVALID_VALUE,
              "{}: dlogits must be either the logits buffer itself (same pointer and strides: in place) or not "
              "overlap it, got a partial overlap",
              op);
}

// The run-time checks every implementation makes before it writes anything: the aliasing rule above, then the
// workspace the plan reported (ce_workspace_bytes for the CPU or the CUDA layout).
strata_status check_run(const CeParams& p, size_t workspace_size, bool cuda) {
  const char* op = p.backward ? kBwd : kFwd;
  STRATA_RETURN_IF_ERROR(check_alias(p, op));
  const size_t need = ce_workspace_bytes(p, cuda);
  if (workspace_size < need)
    return fail(STRATA_ERROR_WORKSPACE_TOO_SMALL, "{}: workspace must hold {} bytes, got {}", op, need, workspace_size);
  return STRATA_SUCCESS;
}

// Scale mode (lse omitted): the gradient to scale is in the logits buffer, so dlogits must be that buffer.
strata_status check_scale(const CeParams& p) {
  if (!p.scale_only || p.N == 0) return STRATA_SUCCESS;
  if (p.dlogits == p.logits && p.dlogits_rs == p.logits_rs) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_INVALID_VALUE,
              "{}: without lse (scale mode: the forward wrote the gradient for an upstream gradient of 1 into the "
              "logits) dlogits must be the logits buffer itself (same pointer and strides)",
              kBwd);
}

// Sum of the per-row values in the workspace (f64, row order) -> the reduced outputs.
void finish_cpu(const CeParams& p, int64_t count) {
  if (p.backward || p.reduction == kCeNone) return;
  const double* rows = static_cast<const double*>(p.workspace);
  double loss = 0.0, z = 0.0;
  for (int64_t i = 0; i < p.N; ++i) loss += rows[i];
  for (int64_t i = 0; i < p.N; ++i) z += rows[p.N + i];
  if (p.reduction == kCeMean) {
    loss = count > 0 ? loss / static_cast<double>(count) : 0.0;
    z = count > 0 ? z / static_cast<double>(count) : 0.0;
  }
  store_elem(p.loss, p.out_dtype, 0, loss);
  if (p.z_loss) store_elem(p.z_loss, p.out_dtype, 0, z);
}

bool half_or_f32(int32_t d) { return d == STRATA_DTYPE_F32 || d == STRATA_DTYPE_BF16 || d == STRATA_DTYPE_F16; }

std::string dtypes_reason(const CeParams& p) {
  if (half_or_f32(p.dtype)) return {};
  return fmt::format("handles f32/bf16/f16 logits, got {}", dtype_name(p.dtype));
}

Implementation<CeProblem> cpu_impl(std::string name, std::function<std::string(const CeProblem&)> reject,
                                   CeCpuFn fn) {
  return {std::move(name), std::move(reject),
          [](const CeProblem& p) { return ce_workspace_bytes(p.params, false); },
          [fn](const CeProblem& pr, const Launch& l) {
            const CeParams p = bind(pr, l);
            int64_t count = 0;
            STRATA_RETURN_IF_ERROR(ce_check_targets(p, &count));
            STRATA_RETURN_IF_ERROR(check_run(p, l.workspace_size, false));
            if (p.scale_only) {
              STRATA_RETURN_IF_ERROR(check_scale(p));
              ce_scale_host(p, false);
              return STRATA_SUCCESS;
            }
            fn(p, count);
            finish_cpu(p, count);
            return STRATA_SUCCESS;
          }};
}

#if STRATA_WITH_CUDA
// A CUDA entry: at plan time the device (sm_90), the logits dtype (f32/bf16/f16) and then the kernel's own shape
// rule (`shape_reject`, "" when it applies); the CUDA workspace layout; at run time the aliasing and workspace
// checks every implementation makes before it writes anything, then `run`.
Implementation<CeProblem> cuda_impl(std::string name, std::function<std::string(const CeParams&)> shape_reject,
                                    std::function<int(const CeParams&, void*)> run) {
  return {std::move(name),
          [shape_reject](const CeProblem& p) {
            std::string r = reject_unless_cuda(p.device, 90);
            if (r.empty()) r = dtypes_reason(p.params);
            if (r.empty() && shape_reject) r = shape_reject(p.params);
            return r;
          },
          [](const CeProblem& p) { return ce_workspace_bytes(p.params, true); },
          [run](const CeProblem& pr, const Launch& l) {
            const CeParams p = bind(pr, l);
            STRATA_RETURN_IF_ERROR(check_run(p, l.workspace_size, true));
            if (p.scale_only) {  // the same small kernel for every CUDA implementation
              STRATA_RETURN_IF_ERROR(check_scale(p));
              return ce_launch_scale(p, l.cuda_stream);
            }
            return static_cast<strata_status>(run(p, l.cuda_stream));
          }};
}

// The shared-memory cluster kernels: plan-time shape rule of `kind`; base pointers that are not 16-byte aligned
// (the plan cannot see them) run block_per_row at run time, the same math.
Implementation<CeProblem> cuda_smem_impl(std::string name, CeSmemKind kind) {
  return cuda_impl(
      // (the scale mode runs ce_scale, any shape, whichever implementation was chosen)
      std::move(name), [kind](const CeParams& p) { return p.scale_only ? std::string() : ce_smem_reject(p, kind); },
      [kind](const CeParams& p, void* stream) {
        if (!ce_smem_aligned(p)) return fused_cross_entropy_cuda(p, stream);
        return fused_cross_entropy_cuda_smem(p, stream, kind);
      });
}
#endif

const ImplList<CeProblem>& impls() {
  static const ImplList<CeProblem> list = [] {
    ImplList<CeProblem> l;
#if STRATA_WITH_CUDA
    // The default since session 13 (s13run1, H200, bf16 [8192, 151936] fused fwd+bwd in place, same run: 1.3934 ms
    // against 1.4277 without the prefetch): session 7's cluster_stored_exp_wide (the default s7run2-s12: cluster_smem
    // whose statistics sweep keeps its exponentials in shared memory over the logits, so the gradient sweep
    // computes none, with ~80 KiB slices, clusters of 4 at this shape) whose CTAs also prefetch into L2 their slice
    // of the row 16 rows ahead. Only the fused forward without softcap of bf16/f32 logits; everything else (loss
    // only, softcap, f16, the backward op) runs cluster_smem exactly. Same shapes as cluster_smem (ce_smem_reject).
    l.push_back(cuda_smem_impl("cuda.sm90.cluster_stored_exp_pf16", CeSmemKind::kStoredExpPf16));
    // A row per cluster, staged once in shared memory (one read, one write: the floor). Rows whose length or
    // stride is not a multiple of 16 bytes (or longer than 800 KiB) are rejected at plan time and take
    // block_per_row; misaligned base pointers at run time run block_per_row too (the same math).
    l.push_back(cuda_smem_impl("cuda.sm90.cluster_smem", CeSmemKind::kSmem));
    // Session 6: cluster_smem with each CTA's slice copied in kChunks pieces (one mbarrier each) and the row
    // statistics taken chunk by chunk as the pieces land, so the sweeps overlap the copy instead of following
    // it (s7run2: 1.707 ms fused, cluster_smem 1.716; loss only 1.104 vs 1.025): forced only.
    l.push_back(cuda_smem_impl("cuda.sm90.cluster_chunked", CeSmemKind::kChunked));
    // Session 7: the stored-exponential kernel with cluster_smem's ~40 KiB slices (s7run2: 1.578 ms): forced only,
    // kept so that the conformance suite covers the 8-CTA split of that kernel and atk shows the slice effect.
    l.push_back(cuda_smem_impl("cuda.sm90.cluster_stored_exp", CeSmemKind::kStoredExp));
    // (Session 12 removed after s12run1: cluster_stored_exp_early, the first bulk copy issued before the block
    // barrier, 1.4487 ms, and cluster_stored_exp_cs, st.global.cs gradient stores, 1.4352, against 1.4234.)
    // (Session 12's cluster_stored_exp_c6, clusters of 6 CTAs: 1.4992 ms against 1.4233 in the s12 final run, removed.)
    // (Session 13 removed after s13run1, against 1.4277 for cluster_stored_exp_wide in the same run: that kernel
    // itself, now the default's without the prefetch; _merge, the cluster merge without block barriers, 1.4242;
    // _lb / _spread, the cluster scheduling policies, 1.4474 / 1.4272; _pf48, 48 rows ahead, 1.5092.)
    // One block of 512 threads per row, two reads of the row (the second mostly from L2): any V, stride and
    // alignment (H200 s6run1: 2.31 ms fused in place bf16 [8192, 151936], vs cluster_smem 1.70).
    l.push_back(cuda_impl("cuda.sm90.block_per_row", nullptr, [](const CeParams& p, void* stream) {
      return fused_cross_entropy_cuda(p, stream);
    }));
    // Removed in session 6 (slower than cluster_smem at every shape timed, s4run1-s6run1, bf16 [8192, 151936]
    // fused in place: 1.70 ms): cluster_wide (1.99), cluster_pipe (2.09), block_per_row_l2 (2.40; also slower
    // than block_per_row, 2.31), cluster_row (3.10). Removed in session 9: session 8's four cluster_lean kernels
    // (s8run2: 1.456-1.493 ms against the default's 1.424) and cluster_stored_exp_bulk (s9run2: 1.513 against 1.436). README.md keeps their description and figures.
#endif
    // AVX512-BF16 first: the AVX3 kernel with native rounding of bf16 gradients (the same bits).
    if (const CeCpuFn fn = fused_cross_entropy_cpu_native_bf16())
      l.push_back(cpu_impl(
          tile::kAvx512Bf16Impl,
          [](const CeProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty() && !tile::cpu_has_avx512_bf16()) r = "this CPU lacks avx512_bf16";
            return r.empty() ? dtypes_reason(p.params) : r;
          },
          fn));
    for (const tile::CpuIsa& isa : tile::cpu_isas()) {
      const CeCpuFn fn = fused_cross_entropy_cpu(isa.hwy_target);
      if (!fn) continue;  // target not compiled into this build
      l.push_back(cpu_impl(
          isa.impl,
          [isa](const CeProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty()) r = tile::reject_cpu_isa(isa);
            return r.empty() ? dtypes_reason(p.params) : r;
          },
          fn));
    }
    l.push_back({"reference", [](const CeProblem& p) { return reject_unless_cpu(p.device); },
                 [](const CeProblem& p) { return ce_workspace_bytes(p.params, false); },
                 [](const CeProblem& pr, const Launch& l) {
                   const CeParams p = bind(pr, l);
                   int64_t count = 0;
                   STRATA_RETURN_IF_ERROR(ce_check_targets(p, &count));
                   STRATA_RETURN_IF_ERROR(check_alias(p, p.backward ? kBwd : kFwd));
                   if (p.scale_only) {
                     STRATA_RETURN_IF_ERROR(check_scale(p));
                     ce_scale_host(p, true);
                     return STRATA_SUCCESS;
                   }
                   return fused_cross_entropy_reference(p);
                 }});
    return l;
  }();
  return list;
}

const char* reduction_name(int32_t r) {
  return r == kCeNone ? "none" : (r == kCeMean ? "mean" : (r == kCeSum ? "sum" : "?"));
}

// Shared attribute checks (the last step of validation).
strata_status check_attrs(const char* op, float label_smoothing, float logit_scale, float lse_square_scale,
                          float softcap) {
  if (!std::isfinite(label_smoothing) || label_smoothing < 0.f || label_smoothing > 1.f)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: label_smoothing must be in [0, 1], got {}", op,
                label_smoothing);
  if (!std::isfinite(logit_scale))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: logit_scale must be finite, got {}", op, logit_scale);
  if (!std::isfinite(lse_square_scale) || lse_square_scale < 0.f)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: lse_square_scale must be finite and >= 0, got {}", op,
                lse_square_scale);
  if (!std::isfinite(softcap) || softcap < 0.f)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: softcap must be finite and >= 0 (0: off), got {}", op,
                softcap);
  return STRATA_SUCCESS;
}

strata_status check_reduction(const char* op, int32_t reduction) {
  if (reduction < kCeNone || reduction > kCeSum)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: reduction must be 0 (none), 1 (mean) or 2 (sum), got {}", op,
                reduction);
  return STRATA_SUCCESS;
}

// logits and target: null, device, dtype, shape, stride checks common to both ops (in that order, with the
// op's other tensors interleaved by the callers through the `more_*` hooks).
struct Arg {
  const char* name;
  const strata_tensor_desc* t;
};

strata_status check_stat_dtype(const char* op, const char* arg, const strata_tensor_desc& t,
                               const strata_tensor_desc& logits) {
  const int32_t want = logits.dtype == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
  if (t.dtype != want)
    return fail(STRATA_ERROR_INVALID_DTYPE, "{}: {} must be {} (for {} logits), got {}", op, arg, dtype_name(want),
                dtype_name(logits.dtype), dtype_name(t.dtype));
  return STRATA_SUCCESS;
}

std::vector<int64_t> loss_shape(int32_t reduction, int64_t N) {
  return reduction == kCeNone ? std::vector<int64_t>{N} : std::vector<int64_t>{};
}

strata_status validate_fwd(const strata_tensor_desc* logits, const strata_tensor_desc* target,
                           const strata_tensor_desc* loss, const strata_tensor_desc* lse,
                           const strata_tensor_desc* z, const strata_tensor_desc* dl, int32_t reduction,
                           float label_smoothing, float logit_scale, float lse_square_scale, float softcap,
                           float grad_scale) {
  const char* op = kFwd;
  STRATA_RETURN_IF_ERROR(check_desc(op, "logits", logits));
  STRATA_RETURN_IF_ERROR(check_desc(op, "target", target));
  STRATA_RETURN_IF_ERROR(check_desc(op, "loss", loss));
  if (lse) STRATA_RETURN_IF_ERROR(check_desc(op, "lse", lse));
  if (z) STRATA_RETURN_IF_ERROR(check_desc(op, "z_loss", z));
  if (dl) STRATA_RETURN_IF_ERROR(check_desc(op, "dlogits", dl));

  STRATA_RETURN_IF_ERROR(check_same_device(op, "logits", *logits, *logits, "logits"));
  STRATA_RETURN_IF_ERROR(check_same_device(op, "target", *target, *logits, "logits"));
  STRATA_RETURN_IF_ERROR(check_same_device(op, "loss", *loss, *logits, "logits"));
  if (lse) STRATA_RETURN_IF_ERROR(check_same_device(op, "lse", *lse, *logits, "logits"));
  if (z) STRATA_RETURN_IF_ERROR(check_same_device(op, "z_loss", *z, *logits, "logits"));
  if (dl) STRATA_RETURN_IF_ERROR(check_same_device(op, "dlogits", *dl, *logits, "logits"));

  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "logits", *logits,
                                        {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16, STRATA_DTYPE_F64}));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, "logits", *logits));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "target", *target, {STRATA_DTYPE_I64, STRATA_DTYPE_I32}));
  STRATA_RETURN_IF_ERROR(check_stat_dtype(op, "loss", *loss, *logits));
  if (lse) STRATA_RETURN_IF_ERROR(check_stat_dtype(op, "lse", *lse, *logits));
  if (z) STRATA_RETURN_IF_ERROR(check_stat_dtype(op, "z_loss", *z, *logits));
  if (dl && dl->dtype != logits->dtype)
    return fail(STRATA_ERROR_INVALID_DTYPE, "{}: dlogits must have the dtype of logits ({}), got {}", op,
                dtype_name(logits->dtype), dtype_name(dl->dtype));

  STRATA_RETURN_IF_ERROR(check_rank_in(op, "logits", *logits, 2, 2));
  const int64_t N = logits->shape[0], V = logits->shape[1];
  if (V < 1)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: logits must have V >= 1 columns (logits.shape[1]), got {}", op,
                shape_str(*logits));
  const int64_t n1[] = {N};
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, "target", *target, n1, "[N] with N = logits.shape[0]"));
  STRATA_RETURN_IF_ERROR(check_reduction(op, reduction));
  const std::vector<int64_t> ls = loss_shape(reduction, N);
  const char* how = reduction == kCeNone ? "[N] for reduction none" : "[] for reduction mean/sum";
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, "loss", *loss, ls, how));
  if (lse) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "lse", *lse, n1, "[N]"));
  if (z) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "z_loss", *z, ls, "the shape of loss"));
  if (dl) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dlogits", *dl, shape_of(*logits), "the shape of logits"));

  STRATA_RETURN_IF_ERROR(check_strides(op, "logits", *logits, false, true));
  STRATA_RETURN_IF_ERROR(check_strides(op, "target", *target, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, "loss", *loss, true, false));
  if (lse) STRATA_RETURN_IF_ERROR(check_strides(op, "lse", *lse, true, false));
  if (z) STRATA_RETURN_IF_ERROR(check_strides(op, "z_loss", *z, true, false));
  if (dl) STRATA_RETURN_IF_ERROR(check_strides(op, "dlogits", *dl, true, true));

  STRATA_RETURN_IF_ERROR(check_attrs(op, label_smoothing, logit_scale, lse_square_scale, softcap));
  if (!std::isfinite(grad_scale))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: grad_scale must be finite, got {}", op, grad_scale);
  return STRATA_SUCCESS;
}

strata_status validate_bwd(const strata_tensor_desc* logits, const strata_tensor_desc* target,
                           const strata_tensor_desc* lse, const strata_tensor_desc* dloss,
                           const strata_tensor_desc* dl, int32_t reduction, float label_smoothing, float logit_scale,
                           float lse_square_scale, float softcap) {
  const char* op = kBwd;
  STRATA_RETURN_IF_ERROR(check_desc(op, "logits", logits));
  STRATA_RETURN_IF_ERROR(check_desc(op, "target", target));
  if (lse) STRATA_RETURN_IF_ERROR(check_desc(op, "lse", lse));  // NULL: scale mode
  STRATA_RETURN_IF_ERROR(check_desc(op, "dloss", dloss));
  STRATA_RETURN_IF_ERROR(check_desc(op, "dlogits", dl));

  STRATA_RETURN_IF_ERROR(check_same_device(op, "logits", *logits, *logits, "logits"));
  STRATA_RETURN_IF_ERROR(check_same_device(op, "target", *target, *logits, "logits"));
  if (lse) STRATA_RETURN_IF_ERROR(check_same_device(op, "lse", *lse, *logits, "logits"));
  STRATA_RETURN_IF_ERROR(check_same_device(op, "dloss", *dloss, *logits, "logits"));
  STRATA_RETURN_IF_ERROR(check_same_device(op, "dlogits", *dl, *logits, "logits"));

  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "logits", *logits,
                                        {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16, STRATA_DTYPE_F64}));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, "logits", *logits));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "target", *target, {STRATA_DTYPE_I64, STRATA_DTYPE_I32}));
  if (lse) STRATA_RETURN_IF_ERROR(check_stat_dtype(op, "lse", *lse, *logits));
  STRATA_RETURN_IF_ERROR(check_stat_dtype(op, "dloss", *dloss, *logits));
  if (dl->dtype != logits->dtype)
    return fail(STRATA_ERROR_INVALID_DTYPE, "{}: dlogits must have the dtype of logits ({}), got {}", op,
                dtype_name(logits->dtype), dtype_name(dl->dtype));

  STRATA_RETURN_IF_ERROR(check_rank_in(op, "logits", *logits, 2, 2));
  const int64_t N = logits->shape[0], V = logits->shape[1];
  if (V < 1)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: logits must have V >= 1 columns (logits.shape[1]), got {}", op,
                shape_str(*logits));
  const int64_t n1[] = {N};
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, "target", *target, n1, "[N] with N = logits.shape[0]"));
  if (lse) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "lse", *lse, n1, "[N]"));
  STRATA_RETURN_IF_ERROR(check_reduction(op, reduction));
  const char* how = reduction == kCeNone ? "[N] for reduction none" : "[] for reduction mean/sum";
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dloss", *dloss, loss_shape(reduction, N), how));
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dlogits", *dl, shape_of(*logits), "the shape of logits"));

  STRATA_RETURN_IF_ERROR(check_strides(op, "logits", *logits, false, true));
  STRATA_RETURN_IF_ERROR(check_strides(op, "target", *target, false, false));
  if (lse) STRATA_RETURN_IF_ERROR(check_strides(op, "lse", *lse, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, "dloss", *dloss, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, "dlogits", *dl, true, true));

  return check_attrs(op, label_smoothing, logit_scale, lse_square_scale, softcap);
}

int64_t stride0(const strata_tensor_desc* t) { return t && t->rank >= 1 ? t->strides[0] : 1; }

void fill_common(CeProblem& pr, const strata_tensor_desc* logits, const strata_tensor_desc* target,
                 int32_t reduction, int64_t ignore_index, float label_smoothing, float logit_scale,
                 float lse_square_scale, float softcap) {
  CeParams& k = pr.params;
  k.dtype = logits->dtype;
  k.target_dtype = target->dtype;
  k.out_dtype = logits->dtype == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
  k.N = logits->shape[0];
  k.V = logits->shape[1];
  k.logits_rs = logits->strides[0];
  k.target_stride = target->strides[0];
  k.reduction = reduction;
  CeOptions o;
  o.logit_scale = logit_scale;
  o.softcap = softcap;
  o.label_smoothing = label_smoothing;
  o.lse_square_scale = lse_square_scale;
  o.ignore_index = ignore_index;
  k.k = ce_consts(o, k.V);
  pr.device = logits->device;
}

std::string attr_str(int32_t reduction, int64_t ignore_index, float ls, float s, float lam, float cap) {
  return fmt::format("reduction={} ignore_index={} label_smoothing={} logit_scale={} lse_square_scale={} softcap={}",
                     reduction_name(reduction), ignore_index, ls, s, lam, cap);
}

std::string opt_str(const strata_tensor_desc* t) { return t ? desc_str(*t) : std::string("none"); }

strata_status probe_fwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {8192, 151936}, device);
  const strata_tensor_desc y = make_desc(STRATA_DTYPE_I64, {8192}, device);
  const strata_tensor_desc loss = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>(), device);
  const strata_tensor_desc lse = make_desc(STRATA_DTYPE_F32, {8192}, device);
  return strata_fused_cross_entropy_fwd_plan(&x, &y, &loss, &lse, nullptr, &x, kCeMean, -100, 0.f, 1.f, 0.f, 0.f,
                                             1.f, plan);
}

strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {8192, 151936}, device);
  const strata_tensor_desc y = make_desc(STRATA_DTYPE_I64, {8192}, device);
  const strata_tensor_desc dloss = make_desc(STRATA_DTYPE_F32, std::span<const int64_t>(), device);
  const strata_tensor_desc lse = make_desc(STRATA_DTYPE_F32, {8192}, device);
  return strata_fused_cross_entropy_bwd_plan(&x, &y, &lse, &dloss, &x, kCeMean, -100, 0.f, 1.f, 0.f, 0.f, plan);
}

const OpRegistrar kRegisterFwd({kFwd, [] { return impl_names_of(impls()); }, probe_fwd});
const OpRegistrar kRegisterBwd({kBwd, [] { return impl_names_of(impls()); }, probe_bwd});

}  // namespace

strata_status ce_check_targets(const CeParams& p, int64_t* count) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.N; ++i) {
    const int64_t y = ce_target(p, i);
    if (y == p.k.ignore_index) continue;
    if (y < 0 || y >= p.V) return ce_bad_target(p, i, y);
    ++n;
  }
  *count = n;
  return STRATA_SUCCESS;
}

strata_status ce_bad_target(const CeParams& p, int64_t i, int64_t y) {
  return fail(STRATA_ERROR_INVALID_VALUE, "{}: target[{}] must be in [0, {}) (V) or equal ignore_index ({}), got {}",
              p.backward ? kBwd : kFwd, i, p.V, p.k.ignore_index, y);
}

}  // namespace strata::loss

using namespace strata;
using namespace strata::loss;

extern "C" strata_status strata_fused_cross_entropy_fwd_plan(
    const strata_tensor_desc* logits, const strata_tensor_desc* target, const strata_tensor_desc* loss,
    const strata_tensor_desc* lse, const strata_tensor_desc* z_loss, const strata_tensor_desc* dlogits,
    int32_t reduction, int64_t ignore_index, float label_smoothing, float logit_scale, float lse_square_scale,
    float softcap, float grad_scale, strata_plan* plan) {
  PlanKey key(kFwd);
  key.add(logits).add(target).add(loss).add(lse).add(z_loss).add(dlogits);
  key.add_attr(reduction).add_attr(ignore_index).add_attr(label_smoothing).add_attr(logit_scale);
  key.add_attr(lse_square_scale).add_attr(softcap).add_attr(grad_scale);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    STRATA_RETURN_IF_ERROR(validate_fwd(logits, target, loss, lse, z_loss, dlogits, reduction, label_smoothing,
                                        logit_scale, lse_square_scale, softcap, grad_scale));
    CeProblem pr;
    fill_common(pr, logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale,
                softcap);
    CeParams& k = pr.params;
    k.backward = false;
    k.grad_scale = grad_scale;
    k.dlogits_rs = dlogits ? dlogits->strides[0] : 0;
    k.loss_stride = stride0(loss);
    k.lse_stride = stride0(lse);
    k.z_stride = stride0(z_loss);
    const std::vector<const strata_tensor_desc*> ts{logits, target, loss, lse, z_loss, dlogits};
    for (size_t i = 0; i < ts.size(); ++i) {
      pr.present[i] = ts[i] != nullptr;
      pr.offsets[i] = ts[i] ? ts[i]->offset : 0;
    }
    const std::string summary =
        fmt::format("logits:{} target:{} loss:{} lse:{} z_loss:{} dlogits:{} {} grad_scale={}", desc_str(*logits),
                    desc_str(*target), desc_str(*loss), opt_str(lse), opt_str(z_loss), opt_str(dlogits),
                    attr_str(reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap),
                    grad_scale);
    // A reduced loss is written even for N = 0 (mean of nothing is 0), so only `none` with N = 0 is empty.
    const bool empty = k.N == 0 && reduction == kCeNone;
    const PlanInfo info{kFwd, ts, given_mask_of(ts), logits->device, summary, empty};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}

extern "C" strata_status strata_fused_cross_entropy_bwd_plan(
    const strata_tensor_desc* logits, const strata_tensor_desc* target, const strata_tensor_desc* lse,
    const strata_tensor_desc* dloss, const strata_tensor_desc* dlogits, int32_t reduction, int64_t ignore_index,
    float label_smoothing, float logit_scale, float lse_square_scale, float softcap, strata_plan* plan) {
  PlanKey key(kBwd);
  key.add(logits).add(target).add(lse).add(dloss).add(dlogits);
  key.add_attr(reduction).add_attr(ignore_index).add_attr(label_smoothing).add_attr(logit_scale);
  key.add_attr(lse_square_scale).add_attr(softcap);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    STRATA_RETURN_IF_ERROR(validate_bwd(logits, target, lse, dloss, dlogits, reduction, label_smoothing,
                                        logit_scale, lse_square_scale, softcap));
    CeProblem pr;
    fill_common(pr, logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale,
                softcap);
    CeParams& k = pr.params;
    k.backward = true;
    k.scale_only = lse == nullptr;
    k.dlogits_rs = dlogits->strides[0];
    k.lse_in_stride = stride0(lse);
    k.dloss_stride = stride0(dloss);
    const std::vector<const strata_tensor_desc*> ts{logits, target, lse, dloss, dlogits};
    for (size_t i = 0; i < ts.size(); ++i) {
      pr.present[i] = ts[i] != nullptr;
      pr.offsets[i] = ts[i] ? ts[i]->offset : 0;
    }
    const std::string summary =
        fmt::format("logits:{} target:{} lse:{} dloss:{} dlogits:{} {}", desc_str(*logits), desc_str(*target),
                    lse ? desc_str(*lse) : std::string("none (scale the gradient in the logits by dloss)"),
                    desc_str(*dloss), desc_str(*dlogits),
                    attr_str(reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap));
    const PlanInfo info{kBwd, ts, given_mask_of(ts), logits->device, summary, k.N == 0};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}
