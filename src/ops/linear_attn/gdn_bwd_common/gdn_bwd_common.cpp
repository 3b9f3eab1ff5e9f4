// Host side of gdn_bwd_common.h: chunk enumeration, run-time checks and argument validation.
#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

#include <fmt/format.h>

#include <cmath>

#include "opbase/tensor.h"
#include "runtime/error.h"

namespace strata::linear_attn::gdn_bwd {

std::vector<Seq> host_sequences(const Dims& d) {
  std::vector<Seq> out;
  int64_t hc = 0;
  if (!d.varlen()) {
    for (int64_t b = 0; b < d.B; ++b) out.push_back({b, 0, d.T, 0, b});
    return out;
  }
  for (int64_t n = 0; n < d.N; ++n) {
    const int64_t bos = d.cu_at(n), eos = d.cu_at(n + 1);
    out.push_back({0, bos, eos, hc, n});
    hc += (eos - bos + d.BT - 1) / d.BT;
  }
  return out;
}

std::vector<Chunk> host_chunks(const Dims& d) {
  std::vector<Chunk> out;
  for (const Seq& s : host_sequences(d))
    for (int64_t t0 = s.bos, c = 0; t0 < s.eos; t0 += d.BT, ++c)
      out.push_back({s.b, t0, std::min<int64_t>(t0 + d.BT, s.eos), s.hc0 + c, s.n});
  return out;
}

int64_t host_total_chunks(const Dims& d) {
  if (!d.varlen()) return d.B * d.chunks_per_row();
  int64_t total = 0;
  for (int64_t n = 0; n < d.N; ++n) total += (d.cu_at(n + 1) - d.cu_at(n) + d.BT - 1) / d.BT;
  return total;
}

strata_status check_cu_values(const char* op, const Dims& d) {
  if (!d.varlen()) return STRATA_SUCCESS;
  auto cu = [&](int64_t i) { return d.cu[i * d.cu_stride]; };
  if (cu(0) != 0) return fail(STRATA_ERROR_INVALID_VALUE, "{}: cu_seqlens[0] must be 0, got {}", op, cu(0));
  for (int64_t n = 0; n < d.N; ++n)
    if (cu(n + 1) < cu(n))
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "{}: cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} after cu_seqlens[{}] = {}", op,
                  n + 1, cu(n + 1), n, cu(n));
  if (cu(d.N) != d.T)
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: the last entry cu_seqlens[{}] must equal T = {}, got {}", op, d.N,
                d.T, cu(d.N));
  return STRATA_SUCCESS;
}

strata_status check_chunk_count(const char* op, const char* arg, const Dims& d) {
  if (!d.varlen()) return STRATA_SUCCESS;  // fixed length: the plan checked NT = ceil(T / BT)
  const int64_t total = host_total_chunks(d);
  if (total != d.NT)
    return fail(STRATA_ERROR_INVALID_VALUE,
                "{}: {} must have NT = {} chunks in dimension 1 (the sum of ceil(L_n / {}) over the sequences of "
                "cu_seqlens), got {}",
                op, arg, total, d.BT, d.NT);
  return STRATA_SUCCESS;
}

strata_status check_args_null_device_dtype(const char* op, std::vector<Arg>& args) {
  for (Arg& a : args) {
    if (a.t || a.required) STRATA_RETURN_IF_ERROR(check_desc(op, a.name, a.t));
  }
  for (Arg& a : args)
    if (a.t) STRATA_RETURN_IF_ERROR(check_same_device(op, a.name, *a.t, *args[0].t, args[0].name));
  for (Arg& a : args) {
    if (!a.t) continue;
    STRATA_RETURN_IF_ERROR(check_dtype_in(op, a.name, *a.t, a.dtypes));
    STRATA_RETURN_IF_ERROR(check_f64_on_cpu(op, a.name, *a.t));
  }
  return STRATA_SUCCESS;
}

strata_status check_args_shape_stride(const char* op, std::vector<Arg>& args) {
  for (Arg& a : args)
    if (a.t) STRATA_RETURN_IF_ERROR(check_shape_eq(op, a.name, *a.t, a.shape, a.how.c_str()));
  for (Arg& a : args)
    if (a.t) STRATA_RETURN_IF_ERROR(check_strides(op, a.name, *a.t, a.output, a.unit_last));
  return STRATA_SUCCESS;
}

View view_template(const strata_tensor_desc* t) {
  View v;
  if (!t) return v;
  v.dtype = t->dtype;
  const int outer = t->rank == 3 ? 3 : t->rank - 1;  // rank-3 gate tensors list all three strides
  for (int i = 0; i < outer && i < 4; ++i) v.s[i] = t->strides[i];
  return v;
}

View bind_view(View v, int64_t offset, void* base) {
  v.p = base ? static_cast<char*>(base) + offset * static_cast<int64_t>(dtype_size(v.dtype)) : nullptr;
  return v;
}

strata_status check_chunk_size(const char* op, int32_t chunk_size) {
  if (chunk_size != 16 && chunk_size != 32 && chunk_size != 64)
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: chunk_size must be 16, 32 or 64, got {}", op, chunk_size);
  return STRATA_SUCCESS;
}

strata_status check_scale(const char* op, float scale) {
  if (!std::isfinite(scale))
    return fail(STRATA_ERROR_INVALID_ATTRIBUTE, "{}: scale must be finite, got {}", op, scale);
  return STRATA_SUCCESS;
}

}  // namespace strata::linear_attn::gdn_bwd
