// Strata operators: chunk_gated_delta_rule (C++ API). Included by strata/strata.hpp, inside nothing: opens
// namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp. The math is documented
// in strata/ops/chunk_gated_delta_rule.h.
#pragma once

#include <cmath>
#include <optional>

#include "strata/strata.hpp"  // Tensor, Plan, Stream, check (a no-op when strata.hpp includes this file)

namespace strata {

struct GdnOutputs {
  Tensor o;                          // [B, T, HV, V], q's dtype
  std::optional<Tensor> final_state;  // [N, HV, K, V] f32 when asked for
};

// scale <= 0 means K^-0.5. initial_state / cu_seqlens may be null. saved: null, or a uint8 buffer of
// strata_chunk_gated_delta_rule_saved_bytes that the forward fills for chunk_gated_delta_rule_bwd (CUDA).
inline GdnOutputs chunk_gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                         const Tensor& beta, float scale = 0.f,
                                         const Tensor* initial_state = nullptr, bool output_final_state = false,
                                         const Tensor* cu_seqlens = nullptr, bool use_qk_l2norm_in_kernel = false,
                                         const Stream* s = nullptr, const Tensor* saved = nullptr) {
  if (scale <= 0.f) scale = 1.f / std::sqrt(static_cast<float>(q.size(3)));
  GdnOutputs out{Tensor::empty(q.dtype(), {q.size(0), q.size(1), v.size(2), v.size(3)}, q.device()), std::nullopt};
  const int64_t N = cu_seqlens ? cu_seqlens->size(0) - 1 : q.size(0);
  if (output_final_state)
    out.final_state = Tensor::empty(STRATA_DTYPE_F32, {N, v.size(2), q.size(3), v.size(3)}, q.device());
  strata_plan p = nullptr;
  check(strata_chunk_gated_delta_rule_fwd_plan(
      &q.desc(), &k.desc(), &v.desc(), &g.desc(), &beta.desc(), initial_state ? &initial_state->desc() : nullptr,
      cu_seqlens ? &cu_seqlens->desc() : nullptr, &out.o.desc(),
      out.final_state ? &out.final_state->desc() : nullptr, saved ? &saved->desc() : nullptr, scale,
      use_qk_l2norm_in_kernel ? 1 : 0, &p));
  Plan(p).run({q.data(), k.data(), v.data(), g.data(), beta.data(), initial_state ? initial_state->data() : nullptr,
               cu_seqlens ? cu_seqlens->data() : nullptr, out.o.data(),
               out.final_state ? out.final_state->data() : nullptr, saved ? saved->data() : nullptr},
              q.device(), s);
  return out;
}

struct GdnGrads {
  Tensor dq, dk, dv, dg, dbeta;  // like q, k, v, g, beta
  std::optional<Tensor> dh0;     // [N, HV, K, V] f32 when initial_state was given
};

// Gradients of chunk_gated_delta_rule given do (like o) and dht (like final_state; null = 0). saved: null (the
// forward is re-run), or the buffer the forward filled with the same inputs.
inline GdnGrads chunk_gated_delta_rule_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                           const Tensor& beta, const Tensor& d_o, const Tensor* dht = nullptr,
                                           float scale = 0.f, const Tensor* initial_state = nullptr,
                                           const Tensor* cu_seqlens = nullptr,
                                           bool use_qk_l2norm_in_kernel = false, const Stream* s = nullptr,
                                           const Tensor* saved = nullptr) {
  if (scale <= 0.f) scale = 1.f / std::sqrt(static_cast<float>(q.size(3)));
  GdnGrads r{Tensor::empty(q.dtype(), q.shape(), q.device()), Tensor::empty(k.dtype(), k.shape(), k.device()),
             Tensor::empty(v.dtype(), v.shape(), v.device()), Tensor::empty(g.dtype(), g.shape(), g.device()),
             Tensor::empty(beta.dtype(), beta.shape(), beta.device()), std::nullopt};
  if (initial_state) r.dh0 = Tensor::empty(STRATA_DTYPE_F32, initial_state->shape(), q.device());
  strata_plan p = nullptr;
  check(strata_chunk_gated_delta_rule_bwd_plan(
      &q.desc(), &k.desc(), &v.desc(), &g.desc(), &beta.desc(), initial_state ? &initial_state->desc() : nullptr,
      cu_seqlens ? &cu_seqlens->desc() : nullptr, &d_o.desc(), dht ? &dht->desc() : nullptr, &r.dq.desc(),
      &r.dk.desc(), &r.dv.desc(), &r.dg.desc(), &r.dbeta.desc(), r.dh0 ? &r.dh0->desc() : nullptr,
      saved ? &saved->desc() : nullptr, scale, use_qk_l2norm_in_kernel ? 1 : 0, &p));
  Plan(p).run({q.data(), k.data(), v.data(), g.data(), beta.data(), initial_state ? initial_state->data() : nullptr,
               cu_seqlens ? cu_seqlens->data() : nullptr, d_o.data(), dht ? dht->data() : nullptr, r.dq.data(),
               r.dk.data(), r.dv.data(), r.dg.data(), r.dbeta.data(), r.dh0 ? r.dh0->data() : nullptr,
               saved ? saved->data() : nullptr},
              q.device(), s);
  return r;
}

}  // namespace strata
