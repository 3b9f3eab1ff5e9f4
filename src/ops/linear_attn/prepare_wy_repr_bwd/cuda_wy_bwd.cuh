// Device pieces of prepare_wy_repr_bwd's tensor-core kernels (cuda_sm90_mma.cu).
#pragma once

#include "ops/linear_attn/gdn_bwd_common/cuda_common.cuh"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"

namespace strata::linear_attn::wy_bwd_cu {

// dg_add at row i of the chunk (0 when absent): loaded apart from the store so that a kernel can fetch it early.
__device__ __forceinline__ float dg_addend(const WyBwdParams& p, const gdn_bwd::DevChunk& c, int64_t hv, int i) {
  return p.dg_add.present() ? gdn_bwd::cu::ld_f32(p.dg_add, p.dg_add.off(c.b, c.t0 + i, hv)) : 0.f;
}

// dβ_i = E_i Σ X k + Σ Y v + db_i and dγ_i = β_i E_i Σ X k + (β_i db_i − cs_i) (+ dg_add_i, dg_addend's value), for
// row i < L (db_i = Σ_j dP_ij KK_ij, cs_i = Σ_r β_r dP_ri KK_ri).
__device__ __forceinline__ void store_dbeta_dg(const WyBwdParams& p, const gdn_bwd::DevChunk& c, int64_t hv, int i,
                                               float e_i, float beta_i, float xk, float yv, float db, float cs,
                                               float dg_add_i) {
  using gdn_bwd::cu::st_f32;
  st_f32(p.dbeta, p.dbeta.off(c.b, c.t0 + i, hv), e_i * xk + yv + db);
  if (p.dg.present()) {
    float dgi = beta_i * e_i * xk + (beta_i * db - cs);
    if (p.dg_add.present()) dgi = dg_add_i + dgi;
    st_f32(p.dg, p.dg.off(c.b, c.t0 + i, hv), dgi);
  }
}

}  // namespace strata::linear_attn::wy_bwd_cu
