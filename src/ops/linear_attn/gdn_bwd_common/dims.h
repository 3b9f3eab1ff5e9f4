// Dimension derivation shared by the four plan functions: reads B, T, H, K from a [B, T, H, K] q/k-like
// descriptor and HV, V from a [B, T, HV, V] value-like one, N from cu_seqlens, and checks the cross-tensor
// rules (HV % H == 0, K <= 256, B == 1 with cu_seqlens, N >= 1 when T > 0).
#pragma once

#include <fmt/format.h>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"
#include "opbase/tensor.h"
#include "runtime/error.h"

namespace strata::linear_attn::gdn_bwd {

inline constexpr int64_t kMaxK = 256;

inline strata_status derive_dims(const char* op, const char* qk_name, const strata_tensor_desc& qk,
                                 const char* v_name, const strata_tensor_desc& vv, const strata_tensor_desc* cu,
                                 int32_t chunk_size, Dims& d) {
  STRATA_RETURN_IF_ERROR(check_rank_in(op, qk_name, qk, 4, 4));
  STRATA_RETURN_IF_ERROR(check_rank_in(op, v_name, vv, 4, 4));
  d.B = qk.shape[0];
  d.T = qk.shape[1];
  d.H = qk.shape[2];
  d.K = qk.shape[3];
  if (vv.shape[0] != d.B || vv.shape[1] != d.T)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} must have shape [B, T, HV, V] with B, T = {}, {} (from {}), got {}",
                op, v_name, d.B, d.T, qk_name, shape_str(vv));
  d.HV = vv.shape[2];
  d.V = vv.shape[3];
  if (d.H == 0 ? d.HV != 0 : d.HV % d.H != 0)
    return fail(STRATA_ERROR_INVALID_SHAPE,
                "{}: the value heads HV = {} ({}.shape[2]) must be a multiple of the q/k heads H = {} ({}.shape[2])",
                op, d.HV, v_name, d.H, qk_name);
  d.G = d.H > 0 ? d.HV / d.H : 1;
  if (d.K > kMaxK)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: the key head dim K = {} ({}.shape[3]) must be at most {}", op, d.K,
                qk_name, kMaxK);
  d.BT = chunk_size;
  d.N = d.B;
  if (cu) {
    STRATA_RETURN_IF_ERROR(check_rank_in(op, "cu_seqlens", *cu, 1, 1));
    if (cu->shape[0] < 1)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens must have N + 1 >= 1 entries, got shape {}", op,
                  shape_str(*cu));
    if (d.B != 1)
      return fail(STRATA_ERROR_INVALID_SHAPE,
                  "{}: with cu_seqlens (a variable-length pack) {} must have B = 1 ({}.shape[0]), got {}", op, qk_name,
                  qk_name, shape_str(qk));
    d.N = cu->shape[0] - 1;
    if (d.N == 0 && d.T > 0)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: cu_seqlens {} holds no sequence (N = 0) but T = {}", op,
                  shape_str(*cu), d.T);
  }
  return STRATA_SUCCESS;
}

// Binds cu_seqlens at run time.
inline void bind_cu(Dims& d, bool has_cu, void* base, int64_t offset) {
  d.cu = has_cu && base ? static_cast<const int64_t*>(base) + offset : nullptr;
}

inline bool any_f64(std::initializer_list<const strata_tensor_desc*> ts) {
  for (const strata_tensor_desc* t : ts)
    if (t && t->dtype == STRATA_DTYPE_F64) return true;
  return false;
}

}  // namespace strata::linear_attn::gdn_bwd
