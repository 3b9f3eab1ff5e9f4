// chunk_local_cumsum: definition, validation, implementation list and plans (ops_gdn_kda.md §4.2;
// README.md beside this file).
//   g [B, T, H] or [B, T, H, S], cu_seqlens int64 [N + 1] or NULL, out like g:
//   out[t] = scale * sum of g over [chunk start, t]   (reverse: over [t, chunk end))
// Tensors {g, cu_seqlens (or NULL), out}. Implementations, in dispatch order: cuda.sm90.chunk_scan,
// cpu.<isa> for each compiled Highway target, reference.
#include "ops/linear_attn/chunk_local_cumsum/chunk_local_cumsum.h"

#include <fmt/format.h>

#include <cmath>

#include "opbase/plan.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::linear_attn {
namespace {

constexpr const char* kOp = "chunk_local_cumsum";
constexpr int32_t kMaxChunk = 1024;

struct ChunkCumsumProblem {
  ChunkCumsumParams params;  // pointers bound at run time
  int64_t g_offset = 0, cu_offset = 0, out_offset = 0;
  bool has_cu = false;
  strata_device device{};
};

ChunkCumsumParams bind(const ChunkCumsumProblem& pr, const Launch& l) {
  ChunkCumsumParams p = pr.params;
  p.g = static_cast<const char*>(l.ptrs[0]) + pr.g_offset * static_cast<int64_t>(dtype_size(p.g_dtype));
  p.cu_seqlens = pr.has_cu ? static_cast<const int64_t*>(l.ptrs[1]) + pr.cu_offset : nullptr;
  p.out = static_cast<char*>(l.ptrs[2]) + pr.out_offset * static_cast<int64_t>(dtype_size(p.out_dtype));
  return p;
}

bool half_or_f32(int32_t d) { return d == STRATA_DTYPE_F32 || d == STRATA_DTYPE_BF16 || d == STRATA_DTYPE_F16; }

std::string dtypes_reason(const ChunkCumsumParams& p) {
  if (half_or_f32(p.g_dtype) && half_or_f32(p.out_dtype)) return {};
  return fmt::format("handles f32/bf16/f16 g and out, got g {} out {}", dtype_name(p.g_dtype),
                     dtype_name(p.out_dtype));
}

// The CPU implementations see the cu_seqlens values (host memory) and check them before writing anything.
template <class Kernel>
Implementation<ChunkCumsumProblem> cpu_impl(std::string name,
                                            std::function<std::string(const ChunkCumsumProblem&)> reject,
                                            Kernel kernel) {
  return {std::move(name), std::move(reject), {}, [kernel](const ChunkCumsumProblem& pr, const Launch& l) {
            const ChunkCumsumParams p = bind(pr, l);
            STRATA_RETURN_IF_ERROR(check_cu_seqlens_values(p));
            kernel(p);
            return STRATA_SUCCESS;
          }};
}

const ImplList<ChunkCumsumProblem>& impls() {
  static const ImplList<ChunkCumsumProblem> list = [] {
    ImplList<ChunkCumsumProblem> l;
#if STRATA_WITH_CUDA
    l.push_back({"cuda.sm90.chunk_scan",
                 [](const ChunkCumsumProblem& p) {
                   std::string r = reject_unless_cuda(p.device, 90);
                   return r.empty() ? dtypes_reason(p.params) : r;
                 },
                 {},
                 [](const ChunkCumsumProblem& p, const Launch& launch) {
                   return static_cast<strata_status>(chunk_local_cumsum_cuda(bind(p, launch), launch.cuda_stream));
                 }});
#endif
    for (const tile::CpuIsa& isa : tile::cpu_isas()) {
      const ChunkCumsumCpuFn fn = chunk_local_cumsum_cpu(isa.hwy_target);
      if (!fn) continue;  // target not compiled into this build
      l.push_back(cpu_impl(
          isa.impl,
          [isa](const ChunkCumsumProblem& p) {
            std::string r = reject_unless_cpu(p.device);
            if (r.empty()) r = tile::reject_cpu_isa(isa);
            return r.empty() ? dtypes_reason(p.params) : r;
          },
          fn));
    }
    l.push_back(cpu_impl("reference", [](const ChunkCumsumProblem& p) { return reject_unless_cpu(p.device); },
                         chunk_local_cumsum_reference));
    return l;
  }();
  return list;
}

// null -> device -> dtype -> shape -> strides -> attributes (ARCHITECTURE.md §3).
strata_status validate(const strata_tensor_desc* g, const strata_tensor_desc* cu, const strata_tensor_desc* out,
                       int32_t chunk_size, int32_t reverse, float scale) {
  STRATA_RETURN_IF_ERROR(check_desc(kOp, "g", g));
  if (cu) STRATA_RETURN_IF_ERROR(check_desc(kOp, "cu_seqlens", cu));
  STRATA_RETURN_IF_ERROR(check_desc(kOp, "out", out));

  STRATA_RETURN_IF_ERROR(check_same_device(kOp, "g", *g, *g, "g"));
  if (cu) STRATA_RETURN_IF_ERROR(check_same_device(kOp, "cu_seqlens", *cu, *g, "g"));
  STRATA_RETURN_IF_ERROR(check_same_device(kOp, "out", *out, *g, "g"));

  STRATA_RETURN_IF_ERROR(
      check_dtype_in(kOp, "g", *g, {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16, STRATA_DTYPE_F64}));
  if (cu) STRATA_RETURN_IF_ERROR(check_dtype_in(kOp, "cu_seqlens", *cu, {STRATA_DTYPE_I64}));
  STRATA_RETURN_IF_ERROR(
      check_dtype_in(kOp, "out", *out, {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16, STRATA_DTYPE_F64}));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(kOp, "g", *g));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(kOp, "out", *out));

  STRATA_RETURN_IF_ERROR(check_rank_in(kOp, "g", *g, 3, 4));
  STRATA_RETURN_IF_ERROR(check_shape_eq(kOp, "out", *out, shape_of(*g), "the shape of g"));
  if (cu) {
    STRATA_RETURN_IF_ERROR(check_rank_in(kOp, "cu_seqlens", *cu, 1, 1));
    if (cu->shape[0] < 1)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens must have N + 1 >= 1 entries, got shape {}", kOp,
                  shape_str(*cu));
    if (g->shape[0] != 1)
      return fail(STRATA_ERROR_INVALID_SHAPE,
                  "{}: with cu_seqlens (a variable-length pack) g must have B = 1 (g.shape[0]), got g {}", kOp,
                  shape_str(*g));
    if (cu->shape[0] == 1 && g->shape[1] > 0)
      return fail(STRATA_ERROR_INVALID_SHAPE,
                  "{}: cu_seqlens {} holds no sequence (N = 0) but g has T = {} tokens (g.shape[1])", kOp,
                  shape_str(*cu), g->shape[1]);
  }

  STRATA_RETURN_IF_ERROR(check_strides(kOp, "g", *g, false, false));
  if (cu) STRATA_RETURN_IF_ERROR(check_strides(kOp, "cu_seqlens", *cu, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(kOp, "out", *out, true, false));

  if (chunk_size < 1 || chunk_size > kMaxChunk || (chunk_size & (chunk_size - 1)) != 0)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: chunk_size must be a power of two in [1, {}], got {}", kOp,
                kMaxChunk, chunk_size);
  if (reverse != 0 && reverse != 1)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: reverse must be 0 or 1, got {}", kOp, reverse);
  if (!std::isfinite(scale))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: scale must be finite, got {}", kOp, scale);
  return STRATA_SUCCESS;
}

// Lane l = h * S + s sits at offset l (unit lane stride) when the (H, S) block is dense.
bool dense_lanes(const int64_t (&st)[4], int64_t H, int64_t S) {
  return (S == 1 || st[3] == 1) && (H == 1 || st[2] == S);
}

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {4, 8192, 32}, device);
  return strata_chunk_local_cumsum_plan(&g, nullptr, &g, 64, 0, 1.0f, plan);
}

const OpRegistrar kRegister({kOp, [] { return impl_names_of(impls()); }, probe});

}  // namespace

strata_status check_cu_seqlens_values(const ChunkCumsumParams& p) {
  if (!p.cu_seqlens) return STRATA_SUCCESS;
  const int64_t N = p.num_seqs;
  auto cu = [&](int64_t i) { return p.cu_seqlens[i * p.cu_stride]; };
  if (cu(0) != 0)
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: cu_seqlens[0] must be 0, got {}", kOp, cu(0));
  for (int64_t n = 0; n < N; ++n)
    if (cu(n + 1) < cu(n))
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "{}: cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} after cu_seqlens[{}] = {}", kOp,
                  n + 1, cu(n + 1), n, cu(n));
  if (cu(N) != p.T)
    return fail(STRATA_ERROR_INVALID_VALUE,
                "{}: the last entry cu_seqlens[{}] must equal T = {} (g.shape[1]), got {}", kOp, N, p.T, cu(N));
  return STRATA_SUCCESS;
}

}  // namespace strata::linear_attn

using namespace strata;
using namespace strata::linear_attn;

extern "C" strata_status strata_chunk_local_cumsum_plan(const strata_tensor_desc* g,
                                                        const strata_tensor_desc* cu_seqlens,
                                                        const strata_tensor_desc* out, int32_t chunk_size,
                                                        int32_t reverse, float scale, strata_plan* plan) {
  PlanKey key(kOp);
  key.add(g).add(cu_seqlens).add(out).add_attr(chunk_size).add_attr(reverse).add_attr(scale);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    STRATA_RETURN_IF_ERROR(validate(g, cu_seqlens, out, chunk_size, reverse, scale));
    ChunkCumsumProblem pr;
    ChunkCumsumParams& k = pr.params;
    k.g_dtype = g->dtype;
    k.out_dtype = out->dtype;
    k.B = g->shape[0];
    k.T = g->shape[1];
    k.H = g->shape[2];
    k.S = g->rank == 4 ? g->shape[3] : 1;
    k.lanes = k.H * k.S;
    for (int i = 0; i < 4; ++i) {
      k.g_strides[i] = i < g->rank ? g->strides[i] : 0;
      k.out_strides[i] = i < out->rank ? out->strides[i] : 0;
    }
    k.lanes_contiguous = dense_lanes(k.g_strides, k.H, k.S) && dense_lanes(k.out_strides, k.H, k.S);
    k.num_seqs = cu_seqlens ? cu_seqlens->shape[0] - 1 : k.B;
    k.cu_stride = cu_seqlens ? cu_seqlens->strides[0] : 1;
    k.chunk_size = chunk_size;
    k.reverse = reverse != 0;
    k.scale = scale;
    pr.g_offset = g->offset;
    pr.out_offset = out->offset;
    pr.cu_offset = cu_seqlens ? cu_seqlens->offset : 0;
    pr.has_cu = cu_seqlens != nullptr;
    pr.device = g->device;
    const std::string summary =
        fmt::format("g:{} cu_seqlens:{} out:{} chunk_size={} reverse={} scale={}", desc_str(*g),
                    cu_seqlens ? desc_str(*cu_seqlens) : std::string("none"), desc_str(*out), chunk_size, reverse,
                    scale);
    // Empty g: nothing to write (cu_seqlens values are then not looked at).
    const std::vector<const strata_tensor_desc*> ts{g, cu_seqlens, out};
    const PlanInfo info{kOp, ts, given_mask_of(ts), g->device, summary, numel(*g) == 0};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}
