#include "ops/norm/common/row_norm_impls.h"

#include <fmt/format.h>

#include <functional>

#include "tile/cpu/isa.h"

namespace strata::norm {
namespace {

bool all_half_or_f32(std::initializer_list<int32_t> dtypes) {
  for (int32_t d : dtypes)
    if (d != STRATA_DTYPE_F32 && d != STRATA_DTYPE_BF16 && d != STRATA_DTYPE_F16) return false;
  return true;
}

RowNormFwdParams bind(const RowNormFwdProblem& pr, const Launch& l) {
  RowNormFwdParams p = pr.params;
  p.x = l.ptrs[0];
  p.y = l.ptrs[1];
  p.rstd = l.ptrs[2];
  return p;
}
RowNormBwdParams bind(const RowNormBwdProblem& pr, const Launch& l) {
  RowNormBwdParams p = pr.params;
  p.src = l.ptrs[0];
  p.rstd = l.ptrs[1];
  p.dout = l.ptrs[2];
  p.dx = l.ptrs[3];
  return p;
}

std::string dtypes_reason(const RowNormFwdParams& p) {
  if (!all_half_or_f32({p.x_dtype, p.y ? p.y_dtype : p.x_dtype}) || !is_float(p.rstd_dtype) ||
      p.rstd_dtype == STRATA_DTYPE_F64)
    return fmt::format("handles f32/bf16/f16 tensors, got x {} y {} rstd {}", dtype_name(p.x_dtype),
                       dtype_name(p.y_dtype), dtype_name(p.rstd_dtype));
  return {};
}
std::string dtypes_reason(const RowNormBwdParams& p) {
  if (!all_half_or_f32({p.src_dtype, p.dout_dtype, p.dx_dtype}) || p.rstd_dtype == STRATA_DTYPE_F64)
    return fmt::format("handles f32/bf16/f16 tensors, got src {} rstd {} dout {} dx {}", dtype_name(p.src_dtype),
                       dtype_name(p.rstd_dtype), dtype_name(p.dout_dtype), dtype_name(p.dx_dtype));
  return {};
}

// [cuda, cuda bulk, (forward) cuda tma], cpu.<isa> for each compiled ISA, reference.
// cuda.sm90.row_norm_bulk comes second, so it runs only when forced (STRATA_FORCE_IMPL, the conformance
// driver): the bulk-copy kernels lost to the default in s6run2. cuda.sm90.row_norm_tma (forward only; session
// 8, written without a GPU) comes third, forced-only until a GPU run has timed it.
template <class Problem, class CpuFn>
ImplList<Problem> make_list(CpuFn (*cpu_kernel)(int64_t), CpuFn (*cpu_native_bf16)(),
                            int (*cuda_kernel)(const decltype(Problem::params)&, void*),
                            int (*cuda_bulk)(const decltype(Problem::params)&, void*),
                            std::string (*cuda_bulk_reject)(const decltype(Problem::params)&),
                            int (*cuda_tma)(const decltype(Problem::params)&, void*),
                            std::string (*cuda_tma_reject)(const decltype(Problem::params)&),
                            void (*reference)(const decltype(Problem::params)&)) {
  ImplList<Problem> l;
#if STRATA_WITH_CUDA
  l.push_back({"cuda.sm90.row_norm",
               [](const Problem& p) {
                 std::string r = reject_unless_cuda(p.device, 80);
                 return r.empty() ? dtypes_reason(p.params) : r;
               },
               {},
               [cuda_kernel](const Problem& p, const Launch& launch) {
                 return static_cast<strata_status>(cuda_kernel(bind(p, launch), launch.cuda_stream));
               }});
  l.push_back({"cuda.sm90.row_norm_bulk",
               [cuda_bulk_reject](const Problem& p) {
                 std::string r = reject_unless_cuda(p.device, 90);
                 if (r.empty()) r = dtypes_reason(p.params);
                 return r.empty() ? cuda_bulk_reject(p.params) : r;
               },
               {},
               [cuda_bulk](const Problem& p, const Launch& launch) {
                 return static_cast<strata_status>(cuda_bulk(bind(p, launch), launch.cuda_stream));
               }});
  if (cuda_tma)
    l.push_back({"cuda.sm90.row_norm_tma",
                 [cuda_tma_reject](const Problem& p) {
                   std::string r = reject_unless_cuda(p.device, 90);
                   if (r.empty()) r = dtypes_reason(p.params);
                   return r.empty() ? cuda_tma_reject(p.params) : r;
                 },
                 {},
                 [cuda_tma](const Problem& p, const Launch& launch) {
                   return static_cast<strata_status>(cuda_tma(bind(p, launch), launch.cuda_stream));
                 }});
#else
  (void)cuda_kernel;
  (void)cuda_bulk;
  (void)cuda_bulk_reject;
  (void)cuda_tma;
  (void)cuda_tma_reject;
#endif
  // A CPU entry: device, then the ISA (`isa_reason` says why this host cannot run it, "" if it can), then dtypes.
  auto cpu_entry = [&l](std::string name, std::function<std::string()> isa_reason, CpuFn fn) {
    l.push_back({std::move(name),
                 [isa_reason](const Problem& p) {
                   std::string r = reject_unless_cpu(p.device);
                   if (r.empty()) r = isa_reason();
                   return r.empty() ? dtypes_reason(p.params) : r;
                 },
                 {},
                 [fn](const Problem& p, const Launch& launch) {
                   fn(bind(p, launch));
                   return STRATA_SUCCESS;
                 }});
  };
  // AVX512-BF16 first: the AVX3 kernel with native bf16 rounding of the outputs.
  if (CpuFn fn = cpu_native_bf16())
    cpu_entry(tile::kAvx512Bf16Impl,
              [] { return std::string(tile::cpu_has_avx512_bf16() ? "" : "this CPU lacks avx512_bf16"); }, fn);
  for (const tile::CpuIsa& isa : tile::cpu_isas())
    if (CpuFn fn = cpu_kernel(isa.hwy_target))  // nullptr: target not compiled into this build
      cpu_entry(isa.impl, [isa] { return tile::reject_cpu_isa(isa); }, fn);
  l.push_back({"reference", [](const Problem& p) { return reject_unless_cpu(p.device); }, {},
               [reference](const Problem& p, const Launch& launch) {
                 reference(bind(p, launch));
                 return STRATA_SUCCESS;
               }});
  return l;
}

#if STRATA_WITH_CUDA
constexpr int (*kCudaFwd)(const RowNormFwdParams&, void*) = [](const RowNormFwdParams& p, void* s) {
  return row_norm_fwd_cuda(p, s);
};
constexpr int (*kCudaBwd)(const RowNormBwdParams&, void*) = [](const RowNormBwdParams& p, void* s) {
  return row_norm_bwd_cuda(p, s);
};
constexpr int (*kCudaFwdBulk)(const RowNormFwdParams&, void*) = row_norm_fwd_cuda_bulk;
constexpr int (*kCudaBwdBulk)(const RowNormBwdParams&, void*) = row_norm_bwd_cuda_bulk;
constexpr std::string (*kCudaFwdBulkReject)(const RowNormFwdParams&) = row_norm_fwd_cuda_bulk_reject;
constexpr std::string (*kCudaBwdBulkReject)(const RowNormBwdParams&) = row_norm_bwd_cuda_bulk_reject;
constexpr int (*kCudaFwdTma)(const RowNormFwdParams&, void*) = row_norm_fwd_cuda_tma;
constexpr std::string (*kCudaFwdTmaReject)(const RowNormFwdParams&) = row_norm_fwd_cuda_tma_reject;
#else
constexpr int (*kCudaFwd)(const RowNormFwdParams&, void*) = nullptr;
constexpr int (*kCudaBwd)(const RowNormBwdParams&, void*) = nullptr;
constexpr int (*kCudaFwdBulk)(const RowNormFwdParams&, void*) = nullptr;
constexpr int (*kCudaBwdBulk)(const RowNormBwdParams&, void*) = nullptr;
constexpr std::string (*kCudaFwdBulkReject)(const RowNormFwdParams&) = nullptr;
constexpr std::string (*kCudaBwdBulkReject)(const RowNormBwdParams&) = nullptr;
constexpr int (*kCudaFwdTma)(const RowNormFwdParams&, void*) = nullptr;
constexpr std::string (*kCudaFwdTmaReject)(const RowNormFwdParams&) = nullptr;
#endif

}  // namespace

const ImplList<RowNormFwdProblem>& row_norm_fwd_impls() {
  static const auto impls = make_list<RowNormFwdProblem>(row_norm_fwd_cpu, row_norm_fwd_cpu_native_bf16,
                                                         kCudaFwd, kCudaFwdBulk, kCudaFwdBulkReject, kCudaFwdTma,
                                                         kCudaFwdTmaReject, row_norm_fwd_reference);
  return impls;
}

const ImplList<RowNormBwdProblem>& row_norm_bwd_impls() {
  static const auto impls = make_list<RowNormBwdProblem>(row_norm_bwd_cpu, row_norm_bwd_cpu_native_bf16,
                                                         kCudaBwd, kCudaBwdBulk, kCudaBwdBulkReject, nullptr,
                                                         nullptr, row_norm_bwd_reference);
  return impls;
}

}  // namespace strata::norm
