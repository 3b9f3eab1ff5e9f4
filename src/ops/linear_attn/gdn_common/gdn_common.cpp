// Host side of the GDN shared infrastructure: chunk offsets, validation, binding (gdn_common.h,
// gdn_validate.h).
#include "ops/linear_attn/gdn_common/gdn_common.h"

#include <fmt/format.h>

#include <algorithm>

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "ops/linear_attn/gdn_common/gdn_validate.h"
#include "runtime/error.h"

namespace strata::linear_attn::gdn {

const char* fwd_op_name(FwdOp op) {
  static const char* const names[] = {"chunk_scaled_dot_kkt", "solve_tril",
                                      "recompute_w_u_fwd",    "prepare_wy_repr_fwd",
                                      "chunk_gated_delta_rule_fwd_h", "chunk_fwd_o"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(FwdOp::kCount));
  const int i = static_cast<int>(op);
  return i >= 0 && i < static_cast<int>(FwdOp::kCount) ? names[i] : "?";
}

int64_t fill_chunk_offsets(const GdnChunks& m, int64_t* offsets) {
  int64_t acc = 0;
  for (int64_t n = 0; n < m.N; ++n) {
    offsets[n] = acc;
    const int64_t bos = cu_at(m, n), eos = cu_at(m, n + 1);
    acc += eos > bos ? cdiv(eos - bos, m.BT) : 0;
  }
  offsets[m.N] = acc;
  return acc;
}

int64_t count_chunks(const int64_t* cu, int64_t cu_stride, int64_t N, int64_t T, int64_t BT) {
  if (!cu) return N * cdiv(T, BT);
  GdnChunks m;
  m.cu = cu;
  m.cu_stride = cu_stride;
  m.N = N;
  m.T = T;
  m.BT = BT;
  int64_t acc = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t bos = cu_at(m, n), eos = cu_at(m, n + 1);
    acc += eos > bos ? cdiv(eos - bos, BT) : 0;
  }
  return acc;
}

namespace {

bool has_bt_dims(Role r) { return r != Role::kCu && r != Role::kState0 && r != Role::kStates; }

const char* dims_text(Role r) {
  switch (r) {
    case Role::kQK: return "B, T, H, K";
    case Role::kWK: return "B, T, HV, K";
    case Role::kVV: return "B, T, HV, V";
    case Role::kGate: return "B, T, HV";
    case Role::kChunkMat: return "B, T, HV, BT";
    case Role::kStates: return "B, NT, HV, K, V";
    case Role::kState0: return "N, HV, K, V";
    default: return "N + 1";
  }
}

int rank_of(Role r) {
  switch (r) {
    case Role::kGate: return 3;
    case Role::kStates: return 5;
    case Role::kCu: return 1;
    default: return 4;
  }
}

}  // namespace

strata_status validate_gdn(const char* op, std::span<const TensorSpec> specs, int64_t chunk_size,
                           std::initializer_list<int64_t> chunk_sizes, GdnValidated& out) {
  // ---- null ----
  const strata_tensor_desc* first = nullptr;
  const char* first_name = "";
  for (const TensorSpec& s : specs) {
    if (!s.desc) {
      if (s.optional) continue;
      return fail(STRATA_ERROR_NULL_POINTER, "{}: {} must not be NULL", op, s.name);
    }
    STRATA_RETURN_IF_ERROR(check_desc(op, s.name, s.desc));
    if (!first) {
      first = s.desc;
      first_name = s.name;
    }
  }
  if (!first) return fail(STRATA_ERROR_NULL_POINTER, "{}: no tensor given", op);
  // ---- device ----
  for (const TensorSpec& s : specs)
    if (s.desc) STRATA_RETURN_IF_ERROR(check_same_device(op, s.name, *s.desc, *first, first_name));
  // ---- dtype ----
  for (const TensorSpec& s : specs) {
    if (!s.desc) continue;
    if (s.role == Role::kCu) {
      STRATA_RETURN_IF_ERROR(check_dtype_in(op, s.name, *s.desc, {STRATA_DTYPE_I64}));
    } else if (s.role == Role::kState0) {
      STRATA_RETURN_IF_ERROR(check_dtype_in(op, s.name, *s.desc, {STRATA_DTYPE_F32, STRATA_DTYPE_F64}));
    } else {
      STRATA_RETURN_IF_ERROR(check_dtype_in(
          op, s.name, *s.desc, {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16, STRATA_DTYPE_F64}));
    }
    STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, s.name, *s.desc));
  }
  // ---- shape ----
  for (const TensorSpec& s : specs)
    if (s.desc) STRATA_RETURN_IF_ERROR(check_rank_in(op, s.name, *s.desc, rank_of(s.role), rank_of(s.role)));
  GdnShape sh;
  sh.BT = chunk_size;
  const TensorSpec* cu = nullptr;
  const TensorSpec* anchor = nullptr;  // defines B, T
  const TensorSpec *qk = nullptr, *hv_src = nullptr, *k_src = nullptr, *v_src = nullptr, *h_src = nullptr;
  for (const TensorSpec& s : specs) {
    if (!s.desc) continue;
    const strata_tensor_desc& d = *s.desc;
    if (s.role == Role::kCu) cu = &s;
    if (!anchor && has_bt_dims(s.role)) anchor = &s;
    if (!qk && s.role == Role::kQK) qk = &s;
    if (!hv_src && s.role != Role::kQK && s.role != Role::kCu) hv_src = &s;
    if (!k_src && (s.role == Role::kQK || s.role == Role::kWK || s.role == Role::kStates || s.role == Role::kState0))
      k_src = &s;
    if (!v_src && (s.role == Role::kVV || s.role == Role::kStates || s.role == Role::kState0)) v_src = &s;
    if (!h_src && s.role == Role::kStates) h_src = &s;
    (void)d;
  }
  if (anchor) {
    sh.B = anchor->desc->shape[0];
    sh.T = anchor->desc->shape[1];
  } else if (h_src) {
    sh.B = h_src->desc->shape[0];
  }
  if (qk) sh.H = qk->desc->shape[2];
  if (hv_src) {
    const strata_tensor_desc& d = *hv_src->desc;
    sh.HV = (hv_src->role == Role::kState0) ? d.shape[1] : d.shape[2];
  }
  if (!qk) sh.H = sh.HV;
  if (k_src) {
    const strata_tensor_desc& d = *k_src->desc;
    sh.K = k_src->role == Role::kStates ? d.shape[3] : (k_src->role == Role::kState0 ? d.shape[2] : d.shape[3]);
  }
  if (v_src) {
    const strata_tensor_desc& d = *v_src->desc;
    sh.V = v_src->role == Role::kStates ? d.shape[4] : d.shape[3];
  }
  if (cu) {
    const strata_tensor_desc& d = *cu->desc;
    if (d.shape[0] < 1)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} must have N + 1 >= 1 entries, got shape {}", op, cu->name,
                  shape_str(d));
    if (sh.B != 1)
      return fail(STRATA_ERROR_INVALID_SHAPE,
                  "{}: with cu_seqlens (a variable-length pack) the batch size B must be 1, got {} = {} ({})", op,
                  anchor ? anchor->name : "B", sh.B, anchor ? shape_str(*anchor->desc) : std::string("?"));
    sh.N = d.shape[0] - 1;
    if (sh.N == 0 && sh.T > 0)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} {} holds no sequence (N = 0) but there are T = {} tokens", op,
                  cu->name, shape_str(d), sh.T);
  } else {
    sh.N = sh.B;
  }
  if (sh.H > 0 && sh.HV % sh.H != 0)
    return fail(STRATA_ERROR_INVALID_SHAPE,
                "{}: the value heads HV = {} ({}) must be a multiple of the q/k heads H = {} ({}.shape[2])", op, sh.HV,
                hv_src ? hv_src->name : "?", sh.H, qk ? qk->name : "k");
  sh.G = sh.H > 0 ? sh.HV / sh.H : 1;
  if (sh.K > kMaxK)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: the key head dim K must be <= {}, got K = {} ({})", op, kMaxK, sh.K,
                k_src ? k_src->name : "?");
  // chunk size before NT (it is an attribute, but NT depends on it)
  bool bt_ok = false;
  for (int64_t c : chunk_sizes) bt_ok = bt_ok || c == chunk_size;
  if (!bt_ok) {
    std::vector<int64_t> allowed(chunk_sizes);
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: chunk_size must be one of {{{}}}, got {}", op,
                fmt::join(allowed, ", "), chunk_size);
  }
  sh.NTr = cdiv(sh.T, sh.BT);
  sh.NT = cu ? (h_src ? h_src->desc->shape[1] : 0) : sh.NTr;
  for (const TensorSpec& s : specs) {
    if (!s.desc) continue;
    std::vector<int64_t> e;
    switch (s.role) {
      case Role::kQK: e = {sh.B, sh.T, sh.H, sh.K}; break;
      case Role::kWK: e = {sh.B, sh.T, sh.HV, sh.K}; break;
      case Role::kVV: e = {sh.B, sh.T, sh.HV, sh.V}; break;
      case Role::kGate: e = {sh.B, sh.T, sh.HV}; break;
      case Role::kChunkMat: e = {sh.B, sh.T, sh.HV, sh.BT}; break;
      case Role::kStates: e = {sh.B, sh.NT, sh.HV, sh.K, sh.V}; break;
      case Role::kState0: e = {sh.N, sh.HV, sh.K, sh.V}; break;
      case Role::kCu: e = {sh.N + 1}; break;
    }
    STRATA_RETURN_IF_ERROR(check_shape_eq(op, s.name, *s.desc, e, dims_text(s.role)));
  }
  // ---- strides ----
  for (const TensorSpec& s : specs)
    if (s.desc) STRATA_RETURN_IF_ERROR(check_strides(op, s.name, *s.desc, s.output, false));
  out.shape = sh;
  out.varlen = cu != nullptr;
  out.device = first->device;
  bool any_out = false;
  for (const TensorSpec& s : specs)
    if (s.desc && s.output && numel(*s.desc) > 0) any_out = true;
  out.empty = !any_out;
  return STRATA_SUCCESS;
}

GdnTensor bind_tensor(const strata_tensor_desc* d, void* base) {
  GdnTensor t;
  if (!d || !base) return t;
  t.dtype = d->dtype;
  t.data = static_cast<char*>(base) + d->offset * static_cast<int64_t>(dtype_size(d->dtype));
  for (int i = 0; i < d->rank && i < 5; ++i) t.st[i] = d->strides[i];
  return t;
}

strata_status check_cu_seqlens_host(const char* op, const GdnChunks& m, int64_t h_chunks) {
  if (!m.varlen()) return STRATA_SUCCESS;
  auto cu = [&](int64_t i) { return m.cu[i * m.cu_stride]; };
  if (cu(0) != 0) return fail(STRATA_ERROR_INVALID_VALUE, "{}: cu_seqlens[0] must be 0, got {}", op, cu(0));
  for (int64_t n = 0; n < m.N; ++n)
    if (cu(n + 1) < cu(n))
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "{}: cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} after cu_seqlens[{}] = {}", op, n + 1,
                  cu(n + 1), n, cu(n));
  if (cu(m.N) != m.T)
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: the last entry cu_seqlens[{}] must equal T = {}, got {}", op, m.N,
                m.T, cu(m.N));
  if (h_chunks >= 0) {
    const int64_t nt = count_chunks(m.cu, m.cu_stride, m.N, m.T, m.BT);
    if (nt != h_chunks)
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "{}: h must have shape[1] = NT = {} (the chunks of cu_seqlens at chunk_size {}), got {}", op, nt,
                  m.BT, h_chunks);
  }
  return STRATA_SUCCESS;
}

std::string specs_summary(std::span<const TensorSpec> specs) {
  std::string s;
  for (const TensorSpec& t : specs) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{}:{}", t.name, t.desc ? desc_str(*t.desc) : std::string("none"));
  }
  return s;
}

}  // namespace strata::linear_attn::gdn
