// clipped_swiglu: definition, validation, implementation lists and plans (ops_fused.md §8; README.md).
// Forward tensors {x, probs, y}; backward tensors {x, probs, dy, dx, dprobs}.
// Implementations, in dispatch order: forward cuda.sm90.tile_tma, cuda.sm90.bulk_ring (where they apply), then both
// directions cuda.sm90.pairwise, cpu.avx512_bf16 (the AVX3 kernels
// with native bf16 rounding, on CPUs that have it),
// cpu.<isa> per compiled Highway target, reference.
#include "ops/activation/clipped_swiglu/clipped_swiglu.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "opbase/plan.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::activation {
namespace {

constexpr const char* kFwd = "clipped_swiglu_fwd";
constexpr const char* kBwd = "clipped_swiglu_bwd";
constexpr const char* kCudaImpl = "cuda.sm90.pairwise";
constexpr const char* kCudaRingImpl = "cuda.sm90.bulk_ring";
constexpr const char* kCudaTmaImpl = "cuda.sm90.tile_tma";
constexpr const char* kCudaStreamRegsImpl = "cuda.sm90.stream_regs";

struct FwdProblem {
  ClippedSwigluFwdParams params;
  strata_device device{};
};
struct BwdProblem {
  ClippedSwigluBwdParams params;
  strata_device device{};
};

ClippedSwigluFwdParams bind(const FwdProblem& pr, const Launch& l) {
  ClippedSwigluFwdParams p = pr.params;
  p.x = l.ptrs[0];
  p.probs = l.ptrs[1];
  p.y = l.ptrs[2];
  return p;
}
ClippedSwigluBwdParams bind(const BwdProblem& pr, const Launch& l) {
  ClippedSwigluBwdParams p = pr.params;
  p.x = l.ptrs[0];
  p.probs = l.ptrs[1];
  p.dy = l.ptrs[2];
  p.dx = l.ptrs[3];
  p.dprobs = l.ptrs[4];
  return p;
}

std::string f64_reason(int32_t x_dtype) { return x_dtype == STRATA_DTYPE_F64 ? "f64 runs on the reference only" : ""; }

template <class Problem, class Fn>
ImplList<Problem> make_list(Fn (*cpu)(int64_t), Fn (*cpu_native_bf16)(), int (*cuda)(const decltype(Problem::params)&, void*),
                            void (*reference)(const decltype(Problem::params)&)) {
  ImplList<Problem> l;
#if STRATA_WITH_CUDA
  l.push_back({kCudaImpl,
               [](const Problem& p) {
                 std::string r = reject_unless_cuda(p.device, 90);
                 return r.empty() ? f64_reason(p.params.x_dtype) : r;
               },
               {},
               [cuda](const Problem& p, const Launch& launch) {
                 return static_cast<strata_status>(cuda(bind(p, launch), launch.cuda_stream));
               }});
#else
  (void)cuda;
#endif
  auto cpu_entry = [&l](const char* name, Fn fn, std::function<std::string()> reject_isa) {
    l.push_back({name,
                 [reject_isa](const Problem& p) {
                   std::string r = reject_unless_cpu(p.device);
                   if (r.empty()) r = reject_isa();
                   return r.empty() ? f64_reason(p.params.x_dtype) : r;
                 },
                 {},
                 [fn](const Problem& p, const Launch& launch) {
                   fn(bind(p, launch));
                   return STRATA_SUCCESS;
                 }});
  };
  if (const Fn fn = cpu_native_bf16())
    cpu_entry(tile::kAvx512Bf16Impl, fn,
              [] { return std::string(tile::cpu_has_avx512_bf16() ? "" : "this CPU lacks avx512_bf16"); });
  for (const tile::CpuIsa& isa : tile::cpu_isas())
    if (const Fn fn = cpu(isa.hwy_target)) cpu_entry(isa.impl, fn, [isa] { return tile::reject_cpu_isa(isa); });
  l.push_back({"reference", [](const Problem& p) { return reject_unless_cpu(p.device); }, {},
               [reference](const Problem& p, const Launch& launch) {
                 reference(bind(p, launch));
                 return STRATA_SUCCESS;
               }});
  return l;
}

#if STRATA_WITH_CUDA
constexpr auto kCudaFwd = clipped_swiglu_fwd_cuda;
constexpr auto kCudaBwd = clipped_swiglu_bwd_cuda;
#else
constexpr int (*kCudaFwd)(const ClippedSwigluFwdParams&, void*) = nullptr;
constexpr int (*kCudaBwd)(const ClippedSwigluBwdParams&, void*) = nullptr;
#endif

const ImplList<FwdProblem>& fwd_impls() {
  static const auto l = [] {
    ImplList<FwdProblem> list = make_list<FwdProblem>(clipped_swiglu_fwd_cpu, clipped_swiglu_fwd_cpu_native_bf16,
                                                      kCudaFwd, clipped_swiglu_fwd_reference);
#if STRATA_WITH_CUDA
    // The bulk-copy ring where it applies (equally spaced rows, I % 8 == 0, x rows <= 48 KiB), else pairwise.
    list.insert(list.begin(), {kCudaRingImpl,
                               [](const FwdProblem& p) {
                                 std::string r = reject_unless_cuda(p.device, 90);
                                 return r.empty() ? clipped_swiglu_fwd_cuda_ring_reject(p.params) : r;
                               },
                               {},
                               [](const FwdProblem& p, const Launch& launch) {
                                 return static_cast<strata_status>(
                                     clipped_swiglu_fwd_cuda_ring(bind(p, launch), launch.cuda_stream));
                               }});
    // Session 9, first since s9run2 (bf16 [32768, 2 x 2880] interleaved 0.1489 ms queued through Python against the
    // ring's 0.1547, split [32768, 2 x 2048] 0.1057 against 0.1103 in C++; s9run1: equal, 0.1498 / 0.1491): short-
    // lived blocks whose x rows and y tile the copy engine moves; x rows of 30-48 KiB take the ring. Unaligned rows
    // at run time run pairwise's kernels.
    list.insert(list.begin(), {kCudaTmaImpl,
                                   [](const FwdProblem& p) {
                                     std::string r = reject_unless_cuda(p.device, 90);
                                     return r.empty() ? clipped_swiglu_fwd_cuda_tma_reject(p.params) : r;
                                   },
                                   {},
                                   [](const FwdProblem& p, const Launch& launch) {
                                     return static_cast<strata_status>(
                                         clipped_swiglu_fwd_cuda_tma(bind(p, launch), launch.cuda_stream));
                                   }});
    // Session 12, first since s12run1 (C++ queued, bf16 [32768, 2 x 2880] interleaved: 0.1333 ms = 0.986 x the
    // copy floor against tile_tma's 0.1455): pairwise' streaming kernel with plain loads on a grid that covers the
    // tiles once, for dense interleaved rows; other layouts take tile_tma as before.
    list.insert(list.begin(), {kCudaStreamRegsImpl,
                               [](const FwdProblem& p) {
                                 std::string r = reject_unless_cuda(p.device, 90);
                                 return r.empty() ? clipped_swiglu_fwd_cuda_stream_reject(p.params) : r;
                               },
                               {},
                               [](const FwdProblem& p, const Launch& launch) {
                                 return static_cast<strata_status>(clipped_swiglu_fwd_cuda_stream(
                                     bind(p, launch), launch.cuda_stream, ClippedSwigluStreamTile{}));
                               }});
#endif
    return list;
  }();
  return l;
}
const ImplList<BwdProblem>& bwd_impls() {
  static const auto l = make_list<BwdProblem>(clipped_swiglu_bwd_cpu, clipped_swiglu_bwd_cpu_native_bf16, kCudaBwd, clipped_swiglu_bwd_reference);
  return l;
}

const std::initializer_list<int32_t> kAct = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16,
                                             STRATA_DTYPE_F64};

std::vector<int64_t> lead_shape(const strata_tensor_desc& x) { return {x.shape, x.shape + x.rank - 1}; }
// Rows: the product of x's leading dimensions (also when the last one is 0).
int64_t lead_count(const strata_tensor_desc& x) {
  int64_t n = 1;
  for (int i = 0; i + 1 < x.rank; ++i) n *= x.shape[i];
  return n;
}
std::vector<int64_t> half_shape(const strata_tensor_desc& x) {
  std::vector<int64_t> s = shape_of(x);
  s.back() /= 2;
  return s;
}

// Shape rules shared by both directions: x rank >= 1 with an even last dimension.
strata_status check_x_shape(const char* op, const strata_tensor_desc& x) {
  STRATA_RETURN_IF_ERROR(check_rank_in(op, "x", x, 1, STRATA_MAX_RANK));
  if (x.shape[x.rank - 1] % 2 != 0)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: x.shape[-1] must be even (2I: gate and linear halves), got x {}", op,
                shape_str(x));
  return STRATA_SUCCESS;
}

strata_status check_attrs(const char* op, float alpha, float limit, float bias, int32_t interleaved) {
  if (!std::isfinite(alpha)) return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: alpha must be finite, got {}", op, alpha);
  if (!(limit > 0.f))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: limit must be > 0 (+inf: no clipping), got {}", op, limit);
  if (!std::isfinite(bias)) return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: bias must be finite, got {}", op, bias);
  if (interleaved != 0 && interleaved != 1)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: interleaved must be 0 or 1, got {}", op, interleaved);
  return STRATA_SUCCESS;
}

strata_status check_probs_dtype(const char* op, const char* name, const strata_tensor_desc* t, int32_t x_dtype) {
  if (!t) return STRATA_SUCCESS;
  if (x_dtype == STRATA_DTYPE_F64) return check_dtype_in(op, name, *t, kAct);
  return check_dtype_in(op, name, *t, {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16});
}

std::string opt_str(const char* name, const strata_tensor_desc* t) {
  return t ? fmt::format(" {}:{}", name, desc_str(*t)) : std::string();
}

strata_status probe_fwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {8192, 5760}, device);
  const strata_tensor_desc y = make_desc(STRATA_DTYPE_BF16, {8192, 2880}, device);
  return strata_clipped_swiglu_fwd_plan(&x, nullptr, &y, 1.702f, 7.f, 1.f, 1, plan);
}
strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc x = make_desc(STRATA_DTYPE_BF16, {8192, 5760}, device);
  const strata_tensor_desc y = make_desc(STRATA_DTYPE_BF16, {8192, 2880}, device);
  return strata_clipped_swiglu_bwd_plan(&x, nullptr, &y, &x, nullptr, 1.702f, 7.f, 1.f, 1, plan);
}
const OpRegistrar kRegisterFwd({kFwd, [] { return impl_names_of(fwd_impls()); }, probe_fwd});
const OpRegistrar kRegisterBwd({kBwd, [] { return impl_names_of(bwd_impls()); }, probe_bwd});

RowLayout rows_of(const strata_tensor_desc* t, int inner) { return t ? make_row_layout(*t, inner) : RowLayout{}; }

}  // namespace
}  // namespace strata::activation

using namespace strata;
using namespace strata::activation;

extern "C" strata_status strata_clipped_swiglu_fwd_plan(const strata_tensor_desc* x, const strata_tensor_desc* probs,
                                                        const strata_tensor_desc* y, float alpha, float limit,
                                                        float bias, int32_t interleaved, strata_plan* plan) {
  PlanKey key(kFwd);
  key.add(x).add(probs).add(y).add_attr(alpha).add_attr(limit).add_attr(bias).add_attr(interleaved);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    const char* op = kFwd;
    STRATA_RETURN_IF_ERROR(check_desc(op, "x", x));
    if (probs) STRATA_RETURN_IF_ERROR(check_desc(op, "probs", probs));
    STRATA_RETURN_IF_ERROR(check_desc(op, "y", y));
    STRATA_RETURN_IF_ERROR(check_same_device(op, "x", *x, *x, "x"));
    if (probs) STRATA_RETURN_IF_ERROR(check_same_device(op, "probs", *probs, *x, "x"));
    STRATA_RETURN_IF_ERROR(check_same_device(op, "y", *y, *x, "x"));
    STRATA_RETURN_IF_ERROR(check_dtype_in(op, "x", *x, kAct));
    STRATA_RETURN_IF_ERROR(check_probs_dtype(op, "probs", probs, x->dtype));
    STRATA_RETURN_IF_ERROR(check_dtype_in(op, "y", *y, {x->dtype}));
    STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, "x", *x));
    STRATA_RETURN_IF_ERROR(check_x_shape(op, *x));
    if (probs)
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, "probs", *probs, lead_shape(*x), "x's shape without its last dimension"));
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, "y", *y, half_shape(*x), "x's shape with its last dimension halved"));
    STRATA_RETURN_IF_ERROR(check_strides(op, "x", *x, false, false));
    if (probs) STRATA_RETURN_IF_ERROR(check_strides(op, "probs", *probs, false, false));
    STRATA_RETURN_IF_ERROR(check_strides(op, "y", *y, true, false));
    STRATA_RETURN_IF_ERROR(check_attrs(op, alpha, limit, bias, interleaved));

    FwdProblem pr;
    ClippedSwigluFwdParams& k = pr.params;
    k.x_dtype = x->dtype;
    k.probs_dtype = probs ? probs->dtype : STRATA_DTYPE_F32;
    k.I = x->shape[x->rank - 1] / 2;
    k.rows = lead_count(*x);
    k.x_rows = rows_of(x, 1);
    k.y_rows = rows_of(y, 1);
    k.probs_rows = rows_of(probs, 0);
    k.alpha = alpha, k.limit = limit, k.bias = bias, k.interleaved = interleaved != 0;
    pr.device = x->device;
    const PlanInfo info{op, {x, probs, y}, probs ? 0b111u : 0b101u, x->device,
                        fmt::format("x:{}{} y:{} alpha={} limit={} bias={} {}", desc_str(*x), opt_str("probs", probs),
                                    desc_str(*y), alpha, limit, bias, interleaved ? "interleaved" : "split"),
                        k.rows == 0 || k.I == 0};
    return dispatch(info, std::move(pr), fwd_impls(), out);
  }, plan);
}

extern "C" strata_status strata_clipped_swiglu_bwd_plan(const strata_tensor_desc* x, const strata_tensor_desc* probs,
                                                        const strata_tensor_desc* dy, const strata_tensor_desc* dx,
                                                        const strata_tensor_desc* dprobs, float alpha, float limit,
                                                        float bias, int32_t interleaved, strata_plan* plan) {
  PlanKey key(kBwd);
  key.add(x).add(probs).add(dy).add(dx).add(dprobs).add_attr(alpha).add_attr(limit).add_attr(bias);
  key.add_attr(interleaved);
  return plan_cached(key, [&](std::shared_ptr<Plan>& out) {
    const char* op = kBwd;
    STRATA_RETURN_IF_ERROR(check_desc(op, "x", x));
    if (probs) STRATA_RETURN_IF_ERROR(check_desc(op, "probs", probs));
    STRATA_RETURN_IF_ERROR(check_desc(op, "dy", dy));
    STRATA_RETURN_IF_ERROR(check_desc(op, "dx", dx));
    if (dprobs) STRATA_RETURN_IF_ERROR(check_desc(op, "dprobs", dprobs));
    if (dprobs && !probs) return fail(STRATA_ERROR_INVALID_VALUE, "{}: dprobs must be NULL when probs is NULL", op);
    STRATA_RETURN_IF_ERROR(check_same_device(op, "x", *x, *x, "x"));
    if (probs) STRATA_RETURN_IF_ERROR(check_same_device(op, "probs", *probs, *x, "x"));
    STRATA_RETURN_IF_ERROR(check_same_device(op, "dy", *dy, *x, "x"));
    STRATA_RETURN_IF_ERROR(check_same_device(op, "dx", *dx, *x, "x"));
    if (dprobs) STRATA_RETURN_IF_ERROR(check_same_device(op, "dprobs", *dprobs, *x, "x"));
    STRATA_RETURN_IF_ERROR(check_dtype_in(op, "x", *x, kAct));
    STRATA_RETURN_IF_ERROR(check_probs_dtype(op, "probs", probs, x->dtype));
    STRATA_RETURN_IF_ERROR(check_dtype_in(op, "dy", *dy, {x->dtype}));
    STRATA_RETURN_IF_ERROR(check_dtype_in(op, "dx", *dx, {x->dtype}));
    STRATA_RETURN_IF_ERROR(check_probs_dtype(op, "dprobs", dprobs, x->dtype));
    STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, "x", *x));
    STRATA_RETURN_IF_ERROR(check_x_shape(op, *x));
    if (probs)
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, "probs", *probs, lead_shape(*x), "x's shape without its last dimension"));
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dy", *dy, half_shape(*x), "x's shape with its last dimension halved"));
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dx", *dx, shape_of(*x), "the shape of x"));
    if (dprobs)
      STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dprobs", *dprobs, lead_shape(*x), "x's shape without its last dimension"));
    STRATA_RETURN_IF_ERROR(check_strides(op, "x", *x, false, false));
    if (probs) STRATA_RETURN_IF_ERROR(check_strides(op, "probs", *probs, false, false));
    STRATA_RETURN_IF_ERROR(check_strides(op, "dy", *dy, false, false));
    STRATA_RETURN_IF_ERROR(check_strides(op, "dx", *dx, true, false));
    if (dprobs) STRATA_RETURN_IF_ERROR(check_strides(op, "dprobs", *dprobs, true, false));
    STRATA_RETURN_IF_ERROR(check_attrs(op, alpha, limit, bias, interleaved));

    BwdProblem pr;
    ClippedSwigluBwdParams& k = pr.params;
    k.x_dtype = x->dtype;
    k.probs_dtype = probs ? probs->dtype : STRATA_DTYPE_F32;
    k.dprobs_dtype = dprobs ? dprobs->dtype : STRATA_DTYPE_F32;
    k.I = x->shape[x->rank - 1] / 2;
    k.rows = lead_count(*x);
    k.x_rows = rows_of(x, 1);
    k.dy_rows = rows_of(dy, 1);
    k.dx_rows = rows_of(dx, 1);
    k.probs_rows = rows_of(probs, 0);
    k.dprobs_rows = rows_of(dprobs, 0);
    k.alpha = alpha, k.limit = limit, k.bias = bias, k.interleaved = interleaved != 0;
    pr.device = x->device;
    uint32_t mask = 0b01101u;  // x, dy, dx
    if (probs) mask |= 1u << 1;
    if (dprobs) mask |= 1u << 4;
    const PlanInfo info{op, {x, probs, dy, dx, dprobs}, mask, x->device,
                        fmt::format("x:{}{} dy:{} dx:{}{} alpha={} limit={} bias={} {}", desc_str(*x),
                                    opt_str("probs", probs), desc_str(*dy), desc_str(*dx), opt_str("dprobs", dprobs),
                                    alpha, limit, bias, interleaved ? "interleaved" : "split"),
                        // With I == 0 dprobs (sums of nothing) is still written, as zeros.
                        k.rows == 0 || (k.I == 0 && !dprobs)};
    return dispatch(info, std::move(pr), bwd_impls(), out);
  }, plan);
}
