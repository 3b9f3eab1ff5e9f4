// The implementation list every gdn_bwd operator uses (ARCHITECTURE.md §3), built from its kernel entry
// points: cuda.sm90.mma (tensor cores, 16-bit token tensors; PrecisionModel::kInputDtype, README.md) and cuda.sm90.<fma name> (f32 FMA, any dtype) in
// CUDA builds, cpu.<isa> for each compiled Highway target, reference.
//   Problem: { Params params; strata_device device; bool any_f64; ... } plus bind(problem, launch) -> Params.
//   The CPU implementations run `host_checks(params)` (cu_seqlens values, chunk counts) before writing.
#pragma once

#include <string>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

#include "opbase/plan.h"
#include "tile/cpu/isa.h"

namespace strata::linear_attn::gdn_bwd {

template <class Problem, class Params>
struct OpKernels {
  Params (*bind)(const Problem&, const Launch&);
  void (*(*cpu_for)(int64_t))(const Params&);  // chunk_..._cpu(hwy_target)
  void (*reference)(const Params&);
  strata_status (*host_checks)(const Params&);
#if STRATA_WITH_CUDA
  const char* cuda_name;  // the f32 FMA kernel
  size_t (*cuda_workspace)(const Dims&);
  int (*cuda)(const Params&, void*, void*);
  const char* cuda_mma_name;  // the tensor-core kernel (listed first), nullptr: none
  std::string (*cuda_mma_reject)(const Params&);
  size_t (*cuda_mma_workspace)(const Dims&);
  int (*cuda_mma)(const Params&, void*, void*);
#endif
};

template <class Problem, class Params>
ImplList<Problem> make_impls(const OpKernels<Problem, Params>& k) {
  ImplList<Problem> l;
  auto f64_reason = [](const Problem& p) -> std::string {
    return p.any_f64 ? "takes f32/bf16/f16 tensors (f64 runs on the reference)" : "";
  };
#if STRATA_WITH_CUDA
  if (k.cuda_mma_name)
    l.push_back({k.cuda_mma_name,
                 [k, f64_reason](const Problem& p) {
                   std::string r = reject_unless_cuda(p.device, 90);
                   if (r.empty()) r = f64_reason(p);
                   return r.empty() ? k.cuda_mma_reject(p.params) : r;
                 },
                 [k](const Problem& p) { return k.cuda_mma_workspace(p.params.d); },
                 [k](const Problem& p, const Launch& launch) {
                   const Params params = k.bind(p, launch);
                   return static_cast<strata_status>(k.cuda_mma(params, launch.workspace, launch.cuda_stream));
                 },
                 PrecisionModel::kInputDtype});
  l.push_back({k.cuda_name,
               [f64_reason](const Problem& p) {
                 std::string r = reject_unless_cuda(p.device, 90);
                 return r.empty() ? f64_reason(p) : r;
               },
               [k](const Problem& p) { return k.cuda_workspace(p.params.d); },
               [k](const Problem& p, const Launch& launch) {
                 const Params params = k.bind(p, launch);
                 return static_cast<strata_status>(k.cuda(params, launch.workspace, launch.cuda_stream));
               }});
#endif
  for (const tile::CpuIsa& isa : tile::cpu_isas()) {
    const auto fn = k.cpu_for(isa.hwy_target);
    if (!fn) continue;
    l.push_back({isa.impl,
                 [isa, f64_reason](const Problem& p) {
                   std::string r = reject_unless_cpu(p.device);
                   if (r.empty()) r = tile::reject_cpu_isa(isa);
                   return r.empty() ? f64_reason(p) : r;
                 },
                 {},
                 [k, fn](const Problem& p, const Launch& launch) {
                   const Params params = k.bind(p, launch);
                   STRATA_RETURN_IF_ERROR(k.host_checks(params));
                   fn(params);
                   return STRATA_SUCCESS;
                 }});
  }
  l.push_back({"reference", [](const Problem& p) { return reject_unless_cpu(p.device); }, {},
               [k](const Problem& p, const Launch& launch) {
                 const Params params = k.bind(p, launch);
                 STRATA_RETURN_IF_ERROR(k.host_checks(params));
                 k.reference(params);
                 return STRATA_SUCCESS;
               }});
  return l;
}

}  // namespace strata::linear_attn::gdn_bwd
