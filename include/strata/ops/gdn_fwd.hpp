// Strata operators: gdn_fwd (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
//
// The Gated DeltaNet forward chunk operators (C API and shapes: strata/ops/gdn_fwd.h). Optional tensors are
// pointers (nullptr = absent); outputs are allocated on the inputs' device.
#pragma once

#include <cmath>
#include <tuple>
#include <vector>

#include "strata/strata.hpp"  // Tensor, Plan, Stream, check (a no-op when strata.hpp includes this file)

namespace strata {

namespace gdn_detail {
inline const strata_tensor_desc* d(const Tensor* t) { return t ? &t->desc() : nullptr; }
inline void* p(const Tensor* t) { return t ? t->data() : nullptr; }
}  // namespace gdn_detail

// A [B,T,HV,BT] = strictly lower β_i (k_i·k_j) exp(g_i − g_j) per chunk; HV from beta.
inline Tensor chunk_scaled_dot_kkt(const Tensor& k, const Tensor& beta, const Tensor* g = nullptr,
                                   const Tensor* cu_seqlens = nullptr, int chunk_size = 64,
                                   int32_t output_dtype = STRATA_DTYPE_F32, const Stream* s = nullptr) {
  const std::vector<int64_t> bs = beta.shape();
  Tensor A = Tensor::empty(output_dtype, {bs[0], bs[1], bs[2], chunk_size}, k.device());
  strata_plan p = nullptr;
  check(strata_chunk_scaled_dot_kkt_plan(&k.desc(), gdn_detail::d(g), &beta.desc(), gdn_detail::d(cu_seqlens),
                                         &A.desc(), chunk_size, &p));
  Plan(p).run({k.data(), gdn_detail::p(g), beta.data(), gdn_detail::p(cu_seqlens), A.data()}, k.device(), s);
  return A;
}

// (I + StrictLower(A))^-1 per chunk, chunk size A.shape[3].
inline Tensor solve_tril(const Tensor& A, const Tensor* cu_seqlens = nullptr, int32_t output_dtype = -1,
                         const Stream* s = nullptr) {
  Tensor Ai = Tensor::empty(output_dtype < 0 ? A.dtype() : output_dtype, A.shape(), A.device());
  strata_plan p = nullptr;
  check(strata_solve_tril_plan(&A.desc(), gdn_detail::d(cu_seqlens), &Ai.desc(), &p));
  Plan(p).run({A.data(), gdn_detail::p(cu_seqlens), Ai.data()}, A.device(), s);
  return Ai;
}

// (w [B,T,HV,K] in k's dtype, u [B,T,HV,V] in v's dtype).
inline std::pair<Tensor, Tensor> recompute_w_u_fwd(const Tensor& k, const Tensor& v, const Tensor& beta,
                                                   const Tensor& A, const Tensor* g = nullptr,
                                                   const Tensor* cu_seqlens = nullptr, const Stream* s = nullptr) {
  const std::vector<int64_t> ks = k.shape(), vs = v.shape();
  Tensor w = Tensor::empty(k.dtype(), {ks[0], ks[1], vs[2], ks[3]}, k.device());
  Tensor u = Tensor::empty(v.dtype(), vs, k.device());
  strata_plan p = nullptr;
  check(strata_recompute_w_u_fwd_plan(&k.desc(), &v.desc(), &beta.desc(), &A.desc(), gdn_detail::d(g),
                                      gdn_detail::d(cu_seqlens), &w.desc(), &u.desc(), &p));
  Plan(p).run({k.data(), v.data(), beta.data(), A.data(), gdn_detail::p(g), gdn_detail::p(cu_seqlens), w.data(),
               u.data()},
              k.device(), s);
  return {std::move(w), std::move(u)};
}

// (w, u, A): kkt + solve_tril + recompute fused; A (the inverse) in k's dtype unless A_dtype >= 0.
inline std::tuple<Tensor, Tensor, Tensor> prepare_wy_repr_fwd(const Tensor& k, const Tensor& v, const Tensor& beta,
                                                              const Tensor* g = nullptr,
                                                              const Tensor* cu_seqlens = nullptr, int chunk_size = 64,
                                                              int32_t A_dtype = -1, const Stream* s = nullptr) {
  const std::vector<int64_t> ks = k.shape(), vs = v.shape();
  Tensor w = Tensor::empty(k.dtype(), {ks[0], ks[1], vs[2], ks[3]}, k.device());
  Tensor u = Tensor::empty(v.dtype(), vs, k.device());
  Tensor A = Tensor::empty(A_dtype < 0 ? k.dtype() : A_dtype, {ks[0], ks[1], vs[2], chunk_size}, k.device());
  strata_plan p = nullptr;
  check(strata_prepare_wy_repr_fwd_plan(&k.desc(), &v.desc(), gdn_detail::d(g), &beta.desc(),
                                        gdn_detail::d(cu_seqlens), &w.desc(), &u.desc(), &A.desc(), chunk_size, &p));
  Plan(p).run({k.data(), v.data(), gdn_detail::p(g), beta.data(), gdn_detail::p(cu_seqlens), w.data(), u.data(),
               A.data()},
              k.device(), s);
  return {std::move(w), std::move(u), std::move(A)};
}

// (h [B,NT,HV,K,V] in k's dtype, v_new [B,T,HV,V] in u's dtype, final_state [N,HV,K,V] f32 or empty).
// Varlen: num_chunks = NT (the chunks of cu_seqlens; the caller knows it from its host copy).
inline std::tuple<Tensor, Tensor, Tensor> chunk_gated_delta_rule_fwd_h(
    const Tensor& k, const Tensor& w, const Tensor& u, const Tensor* g = nullptr,
    const Tensor* initial_state = nullptr, bool output_final_state = false, int chunk_size = 64,
    const Tensor* cu_seqlens = nullptr, int64_t num_chunks = -1, const Stream* s = nullptr) {
  const std::vector<int64_t> ks = k.shape(), us = u.shape();
  const int64_t B = ks[0], T = ks[1], K = ks[3], HV = us[2], V = us[3];
  const int64_t N = cu_seqlens ? cu_seqlens->shape()[0] - 1 : B;
  const int64_t NT = num_chunks >= 0 ? num_chunks : (T + chunk_size - 1) / chunk_size;
  Tensor h = Tensor::empty(k.dtype(), {B, NT, HV, K, V}, k.device());
  Tensor v_new = Tensor::empty(u.dtype(), us, k.device());
  Tensor ht = output_final_state ? Tensor::empty(STRATA_DTYPE_F32, {N, HV, K, V}, k.device()) : Tensor();
  strata_plan p = nullptr;
  check(strata_chunk_gated_delta_rule_fwd_h_plan(&k.desc(), &w.desc(), &u.desc(), gdn_detail::d(g),
                                                 gdn_detail::d(initial_state), gdn_detail::d(cu_seqlens), &h.desc(),
                                                 &v_new.desc(), output_final_state ? &ht.desc() : nullptr, chunk_size,
                                                 &p));
  Plan(p).run({k.data(), w.data(), u.data(), gdn_detail::p(g), gdn_detail::p(initial_state),
               gdn_detail::p(cu_seqlens), h.data(), v_new.data(), output_final_state ? ht.data() : nullptr},
              k.device(), s);
  return {std::move(h), std::move(v_new), std::move(ht)};
}

// o [B,T,HV,V] in v's dtype; scale < 0 or NaN: K^-0.5.
inline Tensor chunk_fwd_o(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& h,
                          const Tensor* g = nullptr, float scale = -1.f, const Tensor* cu_seqlens = nullptr,
                          int chunk_size = 64, const Stream* s = nullptr) {
  if (!(scale >= 0.f)) scale = 1.f / std::sqrt(static_cast<float>(k.shape()[3]));
  Tensor o = Tensor::empty(v.dtype(), v.shape(), q.device());
  strata_plan p = nullptr;
  check(strata_chunk_fwd_o_plan(&q.desc(), &k.desc(), &v.desc(), &h.desc(), gdn_detail::d(g),
                                gdn_detail::d(cu_seqlens), &o.desc(), scale, chunk_size, &p));
  Plan(p).run({q.data(), k.data(), v.data(), h.data(), gdn_detail::p(g), gdn_detail::p(cu_seqlens), o.data()},
              q.device(), s);
  return o;
}

}  // namespace strata
