// chunk_loss: definition, validation, strategy choice, implementation list and plans (ops_fused.md §2;
// README.md beside this file).
//   chunk_loss      tensors {hidden, weight, bias, target, loss, lse, dhidden, dweight, dbias}
//   chunk_loss_bwd  tensors {hidden, weight, bias, target, lse, dloss, dhidden, dweight, dbias}
// Implementations, in dispatch order: cuda.sm90.cublas (cuBLAS GEMMs + CUDA epilogues), cpu.<isa> for each
// compiled Highway target (oneDNN sgemm + Highway epilogues), reference (float64 loops).
#include "ops/loss/chunk_loss/chunk_loss.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "opbase/plan.h"
#include "runtime/runtime_internal.h"
#include "strata/ops/chunk_loss.h"
#include "tile/cpu/isa.h"

namespace strata::loss {
namespace {

constexpr const char* kFwd = "chunk_loss";
constexpr const char* kBwd = "chunk_loss_bwd";
constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;  // cuBLAS and the CUDA grids take int sizes

size_t align_up(size_t v) { return (v + 255) & ~size_t{255}; }
bool is16(int32_t d) { return d == STRATA_DTYPE_BF16 || d == STRATA_DTYPE_F16; }

struct ChunkLossProblem {
  ChunkLossParams params;  // pointers bound at run time
  ChunkLossLayout layout;
  int64_t off[9] = {};     // descriptor offsets in tensor order
  bool backward = false;
  strata_device device{};
};

const void* at(const Launch& l, const ChunkLossProblem& pr, int i, int32_t dtype) {
  if (!l.ptrs[i]) return nullptr;
  return static_cast<const char*>(l.ptrs[i]) + pr.off[i] * static_cast<int64_t>(dtype_size(dtype));
}

ChunkLossParams bind(const ChunkLossProblem& pr, const Launch& l) {
  ChunkLossParams p = pr.params;
  auto mut = [&](int i, int32_t dt) { return const_cast<void*>(at(l, pr, i, dt)); };
  p.hidden = at(l, pr, 0, p.h_dtype);
  p.weight = at(l, pr, 1, p.w_dtype);
  p.bias = pr.params.bias ? at(l, pr, 2, p.w_dtype) : nullptr;
  p.target = static_cast<const int64_t*>(at(l, pr, 3, STRATA_DTYPE_I64));
  if (!pr.backward) {
    p.loss = mut(4, p.stat_dtype);
    p.lse = pr.params.lse ? mut(5, p.stat_dtype) : nullptr;
  } else {
    p.lse_in = at(l, pr, 4, p.stat_dtype);
    p.dloss = pr.params.dloss ? at(l, pr, 5, p.stat_dtype) : nullptr;
  }
  p.dhidden = pr.params.dhidden ? mut(6, p.dh_dtype) : nullptr;
  p.dweight = pr.params.dweight ? mut(7, p.dw_dtype) : nullptr;
  p.dbias = pr.params.dbias ? mut(8, p.db_dtype) : nullptr;
  return p;
}

std::string dtypes_reason(const ChunkLossParams& p) {
  if (p.h_dtype == STRATA_DTYPE_F64) return "handles f32/bf16/f16 inputs, got f64 (the reference runs f64)";
  return {};
}

const ImplList<ChunkLossProblem>& impls() {
  static const ImplList<ChunkLossProblem> list = [] {
    ImplList<ChunkLossProblem> l;
    auto ws = [](const ChunkLossProblem& p) { return p.layout.total; };
#if STRATA_WITH_CUDA
    l.push_back({"cuda.sm90.cublas",
                 [](const ChunkLossProblem& p) {
                   std::string r = reject_unless_cuda(p.device, 90);
                   return r.empty() ? dtypes_reason(p.params) : r;
                 },
                 ws,
                 [](const ChunkLossProblem& p, const Launch& launch) {
                   return static_cast<strata_status>(
                       chunk_loss_cuda(bind(p, launch), p.layout, launch.workspace, launch.cuda_stream));
                 }});
#endif
    for (const tile::CpuIsa& isa : tile::cpu_isas()) {
      const ChunkLossCpuFn fn = chunk_loss_cpu(isa.hwy_target);
      if (!fn) continue;
      l.push_back({isa.impl,
                   [isa](const ChunkLossProblem& p) {
                     std::string r = reject_unless_cpu(p.device);
                     if (r.empty()) r = tile::reject_cpu_isa(isa);
                     return r.empty() ? dtypes_reason(p.params) : r;
                   },
                   ws,
                   [fn](const ChunkLossProblem& p, const Launch& launch) {
                     return fn(bind(p, launch), p.layout, launch.workspace);
                   }});
    }
    l.push_back({"reference", [](const ChunkLossProblem& p) { return reject_unless_cpu(p.device); }, {},
                 [](const ChunkLossProblem& p, const Launch& launch) {
                   return chunk_loss_reference(bind(p, launch));
                 }});
    return l;
  }();
  return list;
}

strata_status check_dtype_out(const char* op, const char* arg, const strata_tensor_desc& t, int32_t like) {
  if (t.dtype == STRATA_DTYPE_F32 || t.dtype == like) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_INVALID_DTYPE, "{}: {} must be f32 or {} (the input dtype), got {}", op, arg,
              dtype_name(like), dtype_name(t.dtype));
}

strata_status check_scalar(const char* op, const char* arg, const strata_tensor_desc& t) {
  if (t.rank == 0 || (t.rank == 1 && t.shape[0] == 1)) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} must be a scalar (shape [] or [1]), got {}", op, arg, shape_str(t));
}

// The descriptors in tensor order; index 4/5 are loss/lse (forward) or lse/dloss (backward).
struct Descs {
  const strata_tensor_desc *hidden, *weight, *bias, *target, *t4, *t5, *dhidden, *dweight, *dbias;
};

// null -> device -> dtype -> shape -> strides -> attributes (ARCHITECTURE.md §3).
strata_status validate(const char* op, bool bwd, const Descs& d, const strata_chunk_loss_options& o) {
  const char* n4 = bwd ? "lse" : "loss";
  const char* n5 = bwd ? "dloss" : "lse";
  STRATA_RETURN_IF_ERROR(check_desc(op, "hidden", d.hidden));
  STRATA_RETURN_IF_ERROR(check_desc(op, "weight", d.weight));
  if (d.bias) STRATA_RETURN_IF_ERROR(check_desc(op, "bias", d.bias));
  STRATA_RETURN_IF_ERROR(check_desc(op, "target", d.target));
  STRATA_RETURN_IF_ERROR(check_desc(op, n4, d.t4));
  if (d.t5) STRATA_RETURN_IF_ERROR(check_desc(op, n5, d.t5));
  if (d.dhidden) STRATA_RETURN_IF_ERROR(check_desc(op, "dhidden", d.dhidden));
  if (d.dweight) STRATA_RETURN_IF_ERROR(check_desc(op, "dweight", d.dweight));
  if (d.dbias) STRATA_RETURN_IF_ERROR(check_desc(op, "dbias", d.dbias));
  if (d.dbias && !d.bias)
    return fail(STRATA_ERROR_NULL_POINTER, "{}: dbias is given but bias is NULL (no bias, no bias gradient)", op);
  if (bwd && !d.dhidden && !d.dweight && !d.dbias)
    return fail(STRATA_ERROR_NULL_POINTER, "{}: at least one of dhidden, dweight, dbias must be given", op);

  const strata_tensor_desc& h = *d.hidden;
  STRATA_RETURN_IF_ERROR(check_same_device(op, "hidden", h, h, "hidden"));
  for (auto [t, name] : {std::pair{d.weight, "weight"}, {d.bias, "bias"}, {d.target, "target"}, {d.t4, n4},
                         {d.t5, n5}, {d.dhidden, "dhidden"}, {d.dweight, "dweight"}, {d.dbias, "dbias"}})
    if (t) STRATA_RETURN_IF_ERROR(check_same_device(op, name, *t, h, "hidden"));

  const int32_t hd = h.dtype;
  STRATA_RETURN_IF_ERROR(
      check_dtype_in(op, "hidden", h, {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16, STRATA_DTYPE_F64}));
  STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, "hidden", h));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "weight", *d.weight, {hd}));
  if (d.bias) STRATA_RETURN_IF_ERROR(check_dtype_in(op, "bias", *d.bias, {hd}));
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, "target", *d.target, {STRATA_DTYPE_I64}));
  const int32_t sd = hd == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
  STRATA_RETURN_IF_ERROR(check_dtype_in(op, n4, *d.t4, {sd}));
  if (d.t5) STRATA_RETURN_IF_ERROR(check_dtype_in(op, n5, *d.t5, {sd}));
  if (d.dhidden) STRATA_RETURN_IF_ERROR(check_dtype_out(op, "dhidden", *d.dhidden, hd));
  if (d.dweight) STRATA_RETURN_IF_ERROR(check_dtype_out(op, "dweight", *d.dweight, hd));
  if (d.dbias) STRATA_RETURN_IF_ERROR(check_dtype_out(op, "dbias", *d.dbias, hd));

  STRATA_RETURN_IF_ERROR(check_rank_in(op, "hidden", h, 2, 2));
  const int64_t N = h.shape[0], D = h.shape[1];
  STRATA_RETURN_IF_ERROR(check_rank_in(op, "weight", *d.weight, 2, 2));
  const int64_t V = d.weight->shape[0];
  if (d.weight->shape[1] != D)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: weight must have shape [V, D] with D = {} (hidden.shape[1]), got {}",
                op, D, shape_str(*d.weight));
  if (V < 1) return fail(STRATA_ERROR_INVALID_SHAPE, "{}: weight must have V >= 1 rows, got {}", op, shape_str(*d.weight));
  if (N > kMaxDim || D > kMaxDim || V > kMaxDim)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: N, D and V must be below 2^31, got hidden {} weight {}", op,
                shape_str(h), shape_str(*d.weight));
  const int64_t vshape[1] = {V}, nshape[1] = {N}, ndshape[2] = {N, D}, vdshape[2] = {V, D};
  if (d.bias) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "bias", *d.bias, vshape, "[V] (weight.shape[0])"));
  STRATA_RETURN_IF_ERROR(check_shape_eq(op, "target", *d.target, nshape, "[N] (hidden.shape[0])"));
  if (bwd) {
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, "lse", *d.t4, nshape, "[N] (hidden.shape[0])"));
    if (d.t5) STRATA_RETURN_IF_ERROR(check_scalar(op, "dloss", *d.t5));
  } else {
    STRATA_RETURN_IF_ERROR(check_scalar(op, "loss", *d.t4));
    if (d.t5) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "lse", *d.t5, nshape, "[N] (hidden.shape[0])"));
  }
  if (d.dhidden) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dhidden", *d.dhidden, ndshape, "the shape of hidden"));
  if (d.dweight) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dweight", *d.dweight, vdshape, "the shape of weight"));
  if (d.dbias) STRATA_RETURN_IF_ERROR(check_shape_eq(op, "dbias", *d.dbias, vshape, "the shape of bias"));

  STRATA_RETURN_IF_ERROR(check_strides(op, "hidden", h, false, true));
  STRATA_RETURN_IF_ERROR(check_strides(op, "weight", *d.weight, false, true));
  if (d.bias) STRATA_RETURN_IF_ERROR(check_strides(op, "bias", *d.bias, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, "target", *d.target, false, false));
  STRATA_RETURN_IF_ERROR(check_strides(op, n4, *d.t4, !bwd, false));
  if (d.t5) STRATA_RETURN_IF_ERROR(check_strides(op, n5, *d.t5, bwd ? false : true, false));
  if (d.dhidden) STRATA_RETURN_IF_ERROR(check_strides(op, "dhidden", *d.dhidden, true, true));
  if (d.dweight) STRATA_RETURN_IF_ERROR(check_strides(op, "dweight", *d.dweight, true, true));
  if (d.dbias) STRATA_RETURN_IF_ERROR(check_strides(op, "dbias", *d.dbias, true, false));

  if (o.reduction != STRATA_CHUNK_LOSS_MEAN && o.reduction != STRATA_CHUNK_LOSS_SUM)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: reduction must be 0 (mean) or 1 (sum), got {}", op, o.reduction);
  if (!(o.label_smoothing >= 0.f && o.label_smoothing <= 1.f))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: label_smoothing must be in [0, 1], got {}", op, o.label_smoothing);
  if (!std::isfinite(o.logit_scale))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: logit_scale must be finite, got {}", op, o.logit_scale);
  if (!(std::isfinite(o.softcap) && o.softcap >= 0.f))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: softcap must be 0 (off) or finite and > 0, got {}", op, o.softcap);
  if (!(std::isfinite(o.lse_square_scale) && o.lse_square_scale >= 0.f))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: lse_square_scale must be finite and >= 0, got {}", op,
                o.lse_square_scale);
  if (!std::isfinite(o.grad_scale))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: grad_scale must be finite, got {}", op, o.grad_scale);
  if (o.strategy < STRATA_CHUNK_LOSS_AUTO || o.strategy > STRATA_CHUNK_LOSS_VOCAB_TILED)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE,
                "{}: strategy must be 0 (auto), 1 (token_chunked) or 2 (vocab_tiled), got {}", op, o.strategy);
  if (o.chunk_rows < 0 || o.chunk_rows > kMaxDim)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: chunk_rows must be 0 (auto) or in [1, 2^31), got {}", op,
                o.chunk_rows);
  if (o.vocab_tile < 0 || o.vocab_tile > kMaxDim)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: vocab_tile must be 0 (auto) or in [1, 2^31), got {}", op,
                o.vocab_tile);
  return STRATA_SUCCESS;
}

BackendTraits traits_for(strata_device device, int32_t h_dtype) {
#if STRATA_WITH_CUDA
  if (device.type == STRATA_DEVICE_CUDA) return chunk_loss_cuda_traits();
#endif
  (void)device;
  (void)h_dtype;
  return chunk_loss_cpu_traits();
}

strata_status plan_common(const char* op, bool bwd, const Descs& d, const strata_chunk_loss_options* opts_in,
                          strata_plan* plan) {
  strata_chunk_loss_options o;
  strata_chunk_loss_options_init(&o);
  if (opts_in) o = *opts_in;
  PlanKey key(op);
  key.add(d.hidden).add(d.weight).add(d.bias).add(d.target).add(d.t4).add(d.t5).add(d.dhidden).add(d.dweight).add(
      d.dbias);
  key.add_attr(o.ignore_index).add_attr(o.reduction).add_attr(o.label_smoothing).add_attr(o.logit_scale);
  key.add_attr(o.softcap).add_attr(o.lse_square_scale).add_attr(o.grad_scale).add_attr(o.strategy);
  key.add_attr(o.chunk_rows).add_attr(o.vocab_tile);
  return plan_cached(key, [&](std::shared_ptr<Plan>& result) {
    STRATA_RETURN_IF_ERROR(validate(op, bwd, d, o));
    ChunkLossProblem pr;
    ChunkLossParams& k = pr.params;
    const strata_tensor_desc& h = *d.hidden;
    k.h_dtype = h.dtype;
    k.w_dtype = d.weight->dtype;
    k.stat_dtype = h.dtype == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    k.N = h.shape[0];
    k.D = h.shape[1];
    k.V = d.weight->shape[0];
    k.ld_h = h.strides[0];
    k.ld_w = d.weight->strides[0];
    // Non-null markers: bind() replaces them by the run-time pointers.
    static char marker;
    if (d.bias) {
      k.bias = &marker;
      k.bias_stride = d.bias->strides[0];
    }
    k.target_stride = d.target->strides[0];
    if (bwd) {
      k.lse_in = &marker;
      k.lse_stride = d.t4->strides[0];
      if (d.t5) k.dloss = &marker;
    } else {
      k.loss = &marker;
      if (d.t5) {
        k.lse = &marker;
        k.lse_stride = d.t5->strides[0];
      }
    }
    if (d.dhidden) {
      k.dhidden = &marker;
      k.dh_dtype = d.dhidden->dtype;
      k.ld_dh = d.dhidden->strides[0];
    }
    if (d.dweight) {
      k.dweight = &marker;
      k.dw_dtype = d.dweight->dtype;
      k.ld_dw = d.dweight->strides[0];
    }
    if (d.dbias) {
      k.dbias = &marker;
      k.db_dtype = d.dbias->dtype;
      k.db_stride = d.dbias->strides[0];
    }
    k.ce = ce_consts(CeOptions{o.logit_scale, o.softcap, o.label_smoothing, o.lse_square_scale, o.ignore_index}, k.V);
    k.reduction = o.reduction;
    k.grad_scale = o.grad_scale;
    k.backward_op = bwd;
    pr.backward = bwd;
    pr.device = h.device;
    const Descs& dd = d;
    const std::vector<const strata_tensor_desc*> all{dd.hidden, dd.weight,  dd.bias,    dd.target, dd.t4,
                                                     dd.t5,     dd.dhidden, dd.dweight, dd.dbias};
    for (size_t i = 0; i < all.size(); ++i) pr.off[i] = all[i] ? all[i]->offset : 0;
    pr.layout = chunk_loss_choose(k, traits_for(h.device, h.dtype), o.strategy, o.chunk_rows, o.vocab_tile);
    const char* strat = k.strategy == kStrategyTokenChunked ? "token_chunked" : "vocab_tiled";
    auto ds = [](const strata_tensor_desc* t) { return t ? desc_str(*t) : std::string("none"); };
    const std::string summary = fmt::format(
        "hidden:{} weight:{} bias:{} target:{} {}:{} {}:{} dhidden:{} dweight:{} dbias:{} ignore_index={} "
        "reduction={} label_smoothing={} logit_scale={} softcap={} lse_square_scale={} grad_scale={} "
        "strategy={} rows={} vocab_tile={}",
        ds(d.hidden), ds(d.weight), ds(d.bias), ds(d.target), bwd ? "lse" : "loss", ds(d.t4), bwd ? "dloss" : "lse",
        ds(d.t5), ds(d.dhidden), ds(d.dweight), ds(d.dbias), o.ignore_index, o.reduction == 0 ? "mean" : "sum",
        o.label_smoothing, o.logit_scale, o.softcap, o.lse_square_scale, o.grad_scale, strat, k.rows, k.vtile);
    const PlanInfo info{op, all, given_mask_of(all), h.device, summary, false};
    return dispatch(info, std::move(pr), impls(), result);
  }, plan);
}

strata_status probe(strata_device device, strata_plan* plan) {
  const strata_tensor_desc h = make_desc(STRATA_DTYPE_BF16, {8192, 4096}, device);
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_BF16, {151936, 4096}, device);
  const strata_tensor_desc t = make_desc(STRATA_DTYPE_I64, {8192}, device);
  const strata_tensor_desc loss = make_desc(STRATA_DTYPE_F32, {}, device);
  const strata_tensor_desc lse = make_desc(STRATA_DTYPE_F32, {8192}, device);
  return strata_chunk_loss_plan(&h, &w, nullptr, &t, &loss, &lse, &h, &w, nullptr, nullptr, plan);
}
strata_status probe_bwd(strata_device device, strata_plan* plan) {
  const strata_tensor_desc h = make_desc(STRATA_DTYPE_BF16, {8192, 4096}, device);
  const strata_tensor_desc w = make_desc(STRATA_DTYPE_BF16, {151936, 4096}, device);
  const strata_tensor_desc t = make_desc(STRATA_DTYPE_I64, {8192}, device);
  const strata_tensor_desc g = make_desc(STRATA_DTYPE_F32, {}, device);
  const strata_tensor_desc lse = make_desc(STRATA_DTYPE_F32, {8192}, device);
  return strata_chunk_loss_bwd_plan(&h, &w, nullptr, &t, &lse, &g, &h, &w, nullptr, nullptr, plan);
}

const OpRegistrar kRegister({kFwd, [] { return impl_names_of(impls()); }, probe});
const OpRegistrar kRegisterBwd({kBwd, [] { return impl_names_of(impls()); }, probe_bwd});

}  // namespace

ChunkLossLayout chunk_loss_choose(ChunkLossParams& p, const BackendTraits& tr, int32_t forced, int64_t chunk_rows,
                                  int64_t vocab_tile) {
  const int64_t N = p.N, D = p.D, V = p.V, budget = kChunkLossBudgetBytes;
  const bool grad = p.wants_grad();
  const bool z16 = tr.bf16_tile && p.h_dtype == STRATA_DTYPE_BF16;
  const bool sep = tr.separate_dz && is16(p.h_dtype) && !z16;
  const bool conv = tr.convert_operands && is16(p.h_dtype);
  const int64_t zes = z16 ? 2 : 4;                // bytes per element of the logits tile
  const int64_t zb = zes + (sep ? 2 : 0);         // bytes per logits element of a tile, dZ included
  const bool dw_f32 = p.dweight && p.dw_dtype == STRATA_DTYPE_F32;
  const bool dh_f32 = p.dhidden && p.dh_dtype == STRATA_DTYPE_F32;

  // token_chunked: chunks of C full rows; dW accumulated in f32 over the chunks. Per chunk row: the logits
  // (V zb bytes), and the f32 copy of the hidden row (CPU, 16-bit) and the f32 dH row when dhidden is not f32;
  // fixed: the f32 weight slice (CPU, 16-bit) and the per-row buffers.
  const int64_t w_slice_rows = conv ? std::max<int64_t>(64, (int64_t{8} << 20) / std::max<int64_t>(D * 4, 1)) : V;
  const bool tc_dh_acc = grad && p.dhidden && !dh_f32 && !(tr.gemm_stores_any && w_slice_rows >= V);
  const int64_t per_row = V * zb + (conv ? D * 4 : 0) + (tc_dh_acc ? D * 4 : 0);
  const int64_t fixed = (conv ? std::min(V, w_slice_rows) * D * 4 : 0) + N * 8 + 4096;
  const int64_t c_auto = std::max<int64_t>(1, (budget - std::min(fixed, budget / 2)) / std::max<int64_t>(per_row, 1));
  const int64_t C = chunk_rows > 0 ? std::min(chunk_rows, std::max<int64_t>(N, 1))
                                   : std::min(std::max<int64_t>(N, 1), c_auto >= 16 ? c_auto / 16 * 16 : c_auto);
  const int64_t tc_acc = (grad && p.dweight && !dw_f32) ? V * D * 4 : 0;
  const bool tc_fits = tc_acc <= budget / 2 && C >= std::min<int64_t>(tr.min_chunk_rows, std::max<int64_t>(N, 1));

  int32_t s = forced;
  if (s == kStrategyAuto) s = tc_fits ? kStrategyTokenChunked : kStrategyVocabTiled;
  if (p.backward_op) s = kStrategyVocabTiled;
  p.strategy = s;

  ChunkLossLayout L;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off += align_up(bytes);
    return o;
  };
  if (s == kStrategyTokenChunked) {
    p.rows = C;
    p.vtile = std::min(V, w_slice_rows);
  } else {
    // Token blocks and vocabulary tiles of about equal size: the f32 read-modify-write traffic of dH (once per
    // tile) and of a dW tile (once per block) scales with 1/vt + 1/Nb under Nb * vt * zb <= budget.
    // With a 16-bit logits tile (bf16_tile) and tiles of at least 1024 columns, one block of all N rows
    // instead: every dW tile is then a single GEMM with K = N stored straight into dweight (no f32 dW tile,
    // no read-modify-write of it) and the GEMMs are [N, vt] x K, large enough to fill the GPU.
    // The row buffers (rowloss, lse, stat, counts, db) come out of the budget first in that case, so the
    // whole workspace stays within it.
    const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(budget / zb))) / 128 * 128;
    const int64_t row_bufs = N * 32 + V * 4 + 4096;
    const int64_t tile_budget = z16 ? budget - std::min(row_bufs, budget / 2) : budget;
    const bool one_block = z16 && tile_budget / (std::max<int64_t>(N, 1) * zb) >= 1024;
    p.rows = chunk_rows > 0  ? std::min(chunk_rows, std::max<int64_t>(N, 1))
             : one_block     ? std::max<int64_t>(N, 1)
                             : std::min(std::max<int64_t>(N, 1), side);
    int64_t vt = vocab_tile > 0 ? vocab_tile : tile_budget / std::max<int64_t>(p.rows * zb, 1);
    if (vocab_tile <= 0) vt = vt >= 128 ? vt / 128 * 128 : std::max<int64_t>(vt, 16);
    p.vtile = std::min(V, std::max<int64_t>(vt, 1));
  }
  const int64_t rows = p.rows;
  const int64_t zcols = s == kStrategyTokenChunked ? V : p.vtile;
  if (!p.backward_op) {
    L.rowloss = take(static_cast<size_t>(N) * 4);
    L.lse = take(p.lse ? 0 : static_cast<size_t>(N) * 4);
    L.stat = take(static_cast<size_t>(rows) * sizeof(CeRowStats));
  }
  L.counts = take(64);
  L.z_dtype = z16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F32;
  L.z = take(static_cast<size_t>(rows * zcols * zes));
  L.dz = sep && grad ? take(static_cast<size_t>(rows * zcols) * 2) : L.z;
  L.dw_in_place = dw_f32;
  L.dh_in_place = dh_f32;
  L.db_in_place = p.dbias && p.db_dtype == STRATA_DTYPE_F32 && p.db_stride == 1;
  if (grad) {
    L.dw_direct = s == kStrategyVocabTiled && p.dweight && rows >= N && tr.gemm_stores_any;
    if (p.dweight && !dw_f32 && !L.dw_direct)
      L.dw_acc = take(static_cast<size_t>((s == kStrategyTokenChunked ? V : p.vtile) * D) * 4);
    if (p.dhidden) {
      if (s == kStrategyTokenChunked) {
        if (!dh_f32 && !(tr.gemm_stores_any && p.vtile >= V)) L.dh_acc = take(static_cast<size_t>(rows * D) * 4);
      } else if (!dh_f32) {
        // In dweight's last rows when dweight is contiguous and the accumulator covers at most a quarter of it
        // (so at most a quarter of the logits, plus one tile, is computed a third time); else workspace.
        const int64_t es_dw = static_cast<int64_t>(dtype_size(p.dw_dtype));
        const int64_t dw_bytes = V * D * es_dw, acc_bytes = N * D * 4;
        if (L.dw_direct && p.ld_dw == D && D > 0 && acc_bytes + 256 <= dw_bytes / 4) {
          L.dh_in_dw = true;
        } else {
          L.dh_acc = take(static_cast<size_t>(N * D) * 4);
        }
      }
    }
    if (p.dbias && !L.db_in_place) L.db_acc = take(static_cast<size_t>(V) * 4);
  }
  if (tr.convert_operands && p.bias) L.bias_conv = take(static_cast<size_t>(V) * 4);
  if (conv) {
    L.h_conv = take(static_cast<size_t>(rows * D) * 4);
    L.w_conv = take(static_cast<size_t>(p.vtile * D) * 4);
  }
  L.total = off;
  return L;
}

strata_status check_targets(const ChunkLossParams& p, int64_t* valid) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.N; ++i) {
    const int64_t y = p.target[i * p.target_stride];
    if (y == p.ce.ignore_index) continue;
    if (y < 0 || y >= p.V) return chunk_loss_bad_target(p, i, y);
    ++n;
  }
  *valid = n;
  return STRATA_SUCCESS;
}

strata_status chunk_loss_bad_target(const ChunkLossParams& p, int64_t i, int64_t y) {
  return fail(STRATA_ERROR_INVALID_VALUE,
              "{}: target[{}] = {} is out of range: targets must be in [0, V = {}) or ignore_index = {}",
              p.backward_op ? kBwd : kFwd, i, y, p.V, p.ce.ignore_index);
}

}  // namespace strata::loss

using namespace strata;
using namespace strata::loss;

extern "C" void strata_chunk_loss_options_init(strata_chunk_loss_options* o) {
  if (!o) return;
  *o = strata_chunk_loss_options{};
  o->ignore_index = -100;
  o->reduction = STRATA_CHUNK_LOSS_MEAN;
  o->label_smoothing = 0.f;
  o->logit_scale = 1.f;
  o->softcap = 0.f;
  o->lse_square_scale = 0.f;
  o->grad_scale = 1.f;
  o->strategy = STRATA_CHUNK_LOSS_AUTO;
  o->chunk_rows = 0;
  o->vocab_tile = 0;
}

extern "C" strata_status strata_chunk_loss_plan(const strata_tensor_desc* hidden, const strata_tensor_desc* weight,
                                                const strata_tensor_desc* bias, const strata_tensor_desc* target,
                                                const strata_tensor_desc* loss, const strata_tensor_desc* lse,
                                                const strata_tensor_desc* dhidden,
                                                const strata_tensor_desc* dweight, const strata_tensor_desc* dbias,
                                                const strata_chunk_loss_options* options, strata_plan* plan) {
  return plan_common(kFwd, false, Descs{hidden, weight, bias, target, loss, lse, dhidden, dweight, dbias}, options,
                     plan);
}

extern "C" strata_status strata_chunk_loss_bwd_plan(const strata_tensor_desc* hidden,
                                                    const strata_tensor_desc* weight,
                                                    const strata_tensor_desc* bias, const strata_tensor_desc* target,
                                                    const strata_tensor_desc* lse, const strata_tensor_desc* dloss,
                                                    const strata_tensor_desc* dhidden,
                                                    const strata_tensor_desc* dweight,
                                                    const strata_tensor_desc* dbias,
                                                    const strata_chunk_loss_options* options, strata_plan* plan) {
  return plan_common(kBwd, true, Descs{hidden, weight, bias, target, lse, dloss, dhidden, dweight, dbias}, options,
                     plan);
}
