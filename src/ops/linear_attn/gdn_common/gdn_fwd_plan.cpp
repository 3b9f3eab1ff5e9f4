// Plan builder of the GDN forward operators (gdn_fwd_plan.h).
#include "ops/linear_attn/gdn_common/gdn_fwd_plan.h"

#include <fmt/format.h>

#include <cmath>

#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::linear_attn::gdn {
namespace {

struct FwdProblem {
  FwdOp op{};
  GdnFwdParams params;                    // shape and chunk geometry; tensors bound at run time
  std::vector<strata_tensor_desc> descs;  // in tensor order (rank 0 / absent marked by present[i])
  std::vector<bool> present;
  std::vector<Slot> slots;
  bool has_h = false;
  bool varlen = false;  // cu_seqlens given: the workspace holds the chunk offsets [N + 1]
  strata_device device{};
};

GdnTensor* slot_field(GdnFwdParams& p, Slot s) {
  switch (s) {
    case Slot::kQ: return &p.q;
    case Slot::kK: return &p.k;
    case Slot::kV: return &p.v;
    case Slot::kG: return &p.g;
    case Slot::kBeta: return &p.beta;
    case Slot::kAkk: return &p.Akk;
    case Slot::kA: return &p.A;
    case Slot::kW: return &p.w;
    case Slot::kU: return &p.u;
    case Slot::kH: return &p.h;
    case Slot::kH0: return &p.h0;
    case Slot::kHt: return &p.ht;
    case Slot::kVNew: return &p.v_new;
    case Slot::kO: return &p.o;
    default: return nullptr;
  }
}

// Binds the run-time pointers; the chunk offsets (varlen) go to the start of the workspace.
GdnFwdParams bind(const FwdProblem& pr, const Launch& l) {
  GdnFwdParams p = pr.params;
  for (size_t i = 0; i < pr.descs.size(); ++i) {
    if (!pr.present[i]) continue;
    if (pr.slots[i] == Slot::kCu) {
      p.chunks.cu = static_cast<const int64_t*>(l.ptrs[i]) + pr.descs[i].offset;
      p.chunks.cu_stride = pr.descs[i].strides[0];
    } else {
      *slot_field(p, pr.slots[i]) = bind_tensor(&pr.descs[i], l.ptrs[i]);
    }
  }
  p.chunks.offsets = p.chunks.cu ? static_cast<const int64_t*>(l.workspace) : nullptr;
  return p;
}

#if STRATA_WITH_CUDA
// The plan-time view of the params that fwd_cuda_mma_reject reads: dtypes and presence of the tensors (data
// points at a marker and is never dereferenced; run-time pointers are bound by bind()).
GdnFwdParams dtype_probe(const FwdProblem& pr) {
  static char marker;
  GdnFwdParams p = pr.params;
  for (size_t i = 0; i < pr.descs.size(); ++i) {
    if (!pr.present[i] || pr.slots[i] == Slot::kCu) continue;
    GdnTensor* t = slot_field(p, pr.slots[i]);
    t->dtype = pr.descs[i].dtype;
    t->data = &marker;
  }
  return p;
}

// CUDA implementations: binds, computes the chunk offsets of a varlen pack on the device (no host copy of
// cu_seqlens), then runs kernel(params, stream).
template <class Kernel>
strata_status run_cuda(const FwdProblem& pr, const Launch& launch, Kernel kernel) {
  GdnFwdParams p = bind(pr, launch);
  if (p.chunks.varlen()) {
    const int st = gdn_chunk_offsets_cuda(p.chunks, static_cast<int64_t*>(launch.workspace), launch.cuda_stream);
    if (st != STRATA_SUCCESS) return static_cast<strata_status>(st);
  }
  return static_cast<strata_status>(kernel(p, launch.cuda_stream));
}
#endif

size_t offsets_workspace(const FwdProblem& pr) {
  return pr.varlen ? static_cast<size_t>(pr.params.chunks.N + 1) * sizeof(int64_t) : 0;
}

#if STRATA_WITH_CUDA
// A CUDA implementation on sm_90: `reject_params` (the kernel's own rule, "" when it can run) sees the plan-time
// dtype probe; `kernel(params, stream)` runs through run_cuda. `pm`: PrecisionModel::kInputDtype for the
// tensor-core kernels (16-bit products with intermediates rounded to the token dtype: fla's model, README.md
// "Numerics"), which the conformance harness reads to judge their f32 final state at the token dtype.
template <class RejectParams, class Kernel>
Implementation<FwdProblem> cuda_impl(std::string name, RejectParams reject_params, Kernel kernel,
                                     PrecisionModel pm = PrecisionModel::kOutputDtype) {
  return {std::move(name),
          [reject_params](const FwdProblem& p) {
            std::string r = reject_unless_cuda(p.device, 90);
            if (r.empty()) r = reject_params(p);
            return r;
          },
          offsets_workspace,
          [kernel](const FwdProblem& pr, const Launch& launch) { return run_cuda(pr, launch, kernel); }, pm};
}
#endif

// CPU implementations read cu_seqlens on the host: check the values, then fill the offsets.
template <class Kernel>
Implementation<FwdProblem> cpu_impl(std::string name, std::function<std::string(const FwdProblem&)> reject,
                                    Kernel kernel) {
  return {std::move(name), std::move(reject), offsets_workspace, [kernel](const FwdProblem& pr, const Launch& l) {
            GdnFwdParams p = bind(pr, l);
            if (p.chunks.varlen()) {
              STRATA_RETURN_IF_ERROR(
                  check_cu_seqlens_host(fwd_op_name(pr.op), p.chunks, pr.has_h ? p.shape.NT : -1));
              fill_chunk_offsets(p.chunks, static_cast<int64_t*>(l.workspace));
            }
            kernel(pr.op, p);
            return STRATA_SUCCESS;
          }};
}

[[maybe_unused]] const char* cuda_kernel_name(FwdOp op) {  // (CUDA builds only)
  switch (op) {
    case FwdOp::kKkt: return "cuda.sm90.kkt_tile";
    case FwdOp::kSolveTril: return "cuda.sm90.forward_subst";
    case FwdOp::kRecomputeWU: return "cuda.sm90.wy_tile";
    case FwdOp::kPrepareWY: return "cuda.sm90.fused_wy";
    case FwdOp::kFwdH: return "cuda.sm90.state_scan";
    case FwdOp::kFwdO: return "cuda.sm90.chunk_tile";
    default: return "cuda.sm90.?";
  }
}

const ImplList<FwdProblem>& impls(FwdOp op) {
  static const std::vector<ImplList<FwdProblem>> lists = [] {
    std::vector<ImplList<FwdProblem>> all;
    for (int o = 0; o < static_cast<int>(FwdOp::kCount); ++o) {
      [[maybe_unused]] const FwdOp fop = static_cast<FwdOp>(o);
      ImplList<FwdProblem> l;
#if STRATA_WITH_CUDA
      // prepare_wy_repr_fwd: the pre-state kernel on warpgroup MMA first (prep_wgmma, session 10; bf16, K <= 128;
      // GPU run s10run1: w, u 0.466 against 0.587 ms for cuda.sm90.mma at B = 4 T = 8192 H = 16 HV = 32 K = V = 128).
      if (fop == FwdOp::kPrepareWY)
        l.push_back(cuda_impl(
            "cuda.sm90.prep", [](const FwdProblem& p) { return fwd_cuda_prep_reject(dtype_probe(p)); },
            [](const GdnFwdParams& p, void* stream) { return fwd_cuda_prep(p, stream); }, PrecisionModel::kInputDtype));
      // Tensor-core kernels first (bf16 / f16 tokens), then the f32 FMA kernels (any float dtype).
      l.push_back(cuda_impl(
          "cuda.sm90.mma", [](const FwdProblem& p) { return fwd_cuda_mma_reject(p.op, dtype_probe(p)); },
          [fop](const GdnFwdParams& p, void* stream) { return fwd_cuda(fop, p, FwdCudaKernels::kMma, stream); },
          PrecisionModel::kInputDtype));
      l.push_back(cuda_impl(
          cuda_kernel_name(fop), [](const FwdProblem&) { return std::string(); },
          [fop](const GdnFwdParams& p, void* stream) { return fwd_cuda(fop, p, FwdCudaKernels::kFma, stream); }));
      // chunk_gated_delta_rule_fwd_h: the recurrence warpgroups of the split wgmma pass (session 9; bf16, K = 128).
      // Last in the op's list, so reached at the op level by forcing; gdn::fwd_cuda(kFwdH)'s automatic choice,
      // which the GDN backward calls, runs it wherever it applies.
      if (fop == FwdOp::kFwdH)
        l.push_back(cuda_impl(
            "cuda.sm90.wgmma", [](const FwdProblem& p) { return fwd_cuda_fwd_h_wgmma_reject(dtype_probe(p)); },
            [](const GdnFwdParams& p, void* stream) { return fwd_cuda_fwd_h_wgmma(p, 0, stream); },
            PrecisionModel::kInputDtype));
#endif
      for (const tile::CpuIsa& isa : tile::cpu_isas()) {
        const GdnFwdCpuFn fn = fwd_cpu_for(isa.hwy_target);
        if (!fn) continue;
        l.push_back(cpu_impl(
            isa.impl,
            [isa](const FwdProblem& p) {
              std::string r = reject_unless_cpu(p.device);
              if (r.empty()) r = tile::reject_cpu_isa(isa);
              if (r.empty()) {
                for (size_t i = 0; i < p.descs.size(); ++i)
                  if (p.present[i] && p.descs[i].dtype == STRATA_DTYPE_F64)
                    return std::string("f64 tensors run on the reference only");
              }
              return r;
            },
            fn));
      }
      l.push_back(cpu_impl("reference", [](const FwdProblem& p) { return reject_unless_cpu(p.device); },
                           [](FwdOp op, const GdnFwdParams& p) { fwd_reference<double>(op, p); }));
      all.push_back(std::move(l));
    }
    return all;
  }();
  return lists[static_cast<size_t>(op)];
}

}  // namespace

std::vector<std::string> fwd_impl_names(FwdOp op) { return impl_names_of(impls(op)); }

strata_status make_fwd_plan(FwdOp op, const std::vector<FwdTensor>& tensors, int64_t chunk_size,
                            std::initializer_list<int64_t> chunk_sizes, float scale, strata_plan* plan) {
  const char* name = fwd_op_name(op);
  PlanKey key(name);
  for (const FwdTensor& t : tensors) key.add(t.spec.desc);
  key.add_attr(chunk_size).add_attr(scale);
  return plan_cached(
      key,
      [&](std::shared_ptr<Plan>& result) {
        std::vector<TensorSpec> specs;
        for (const FwdTensor& t : tensors) specs.push_back(t.spec);
        GdnValidated v;
        STRATA_RETURN_IF_ERROR(validate_gdn(name, specs, chunk_size, chunk_sizes, v));
        if (op == FwdOp::kFwdO && !std::isfinite(scale))
          return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: scale must be finite, got {}", name, scale);
        FwdProblem pr;
        pr.op = op;
        pr.device = v.device;
        pr.params.shape = v.shape;
        pr.params.shape.scale = scale;
        GdnChunks& m = pr.params.chunks;
        m.B = v.shape.B;
        m.T = v.shape.T;
        m.N = v.shape.N;
        m.BT = v.shape.BT;
        m.NTr = v.shape.NTr;
        std::vector<const strata_tensor_desc*> given;
        for (const FwdTensor& t : tensors) {
          pr.present.push_back(t.spec.desc != nullptr);
          pr.descs.push_back(t.spec.desc ? *t.spec.desc : strata_tensor_desc{});
          pr.slots.push_back(t.slot);
          given.push_back(t.spec.desc);
          if (t.slot == Slot::kH && t.spec.desc) pr.has_h = true;
        }
        pr.varlen = v.varlen;
        const std::string summary = specs_summary(specs) + fmt::format(" chunk_size={}", chunk_size) +
                                    (op == FwdOp::kFwdO ? fmt::format(" scale={}", scale) : std::string());
        const PlanInfo info{name, given, given_mask_of(given), v.device, summary, v.empty};
        return dispatch(info, std::move(pr), impls(op), result);
      },
      plan);
}

}  // namespace strata::linear_attn::gdn
