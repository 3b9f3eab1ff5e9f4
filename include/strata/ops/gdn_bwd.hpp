// Strata operators: gdn_bwd (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
// The Gated DeltaNet backward chunk operators (strata/ops/gdn_bwd.h documents the math and layouts). Optional
// tensors are pointers (nullptr = absent); outputs are allocated on q's (k's) device in the dtype noted.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/strata.hpp"  // Tensor, Plan, check (a no-op when strata.hpp includes this file)

namespace strata {

namespace gdn_bwd_detail {
// Number of chunks of a pack: Σ ceil(L_n / chunk_size) (reads cu_seqlens on the host; a sync for device
// tensors), or B * ceil(T / chunk_size)'s per-row count ceil(T / chunk_size) without cu_seqlens.
inline int64_t num_chunks(const Tensor* cu_seqlens, int64_t T, int chunk_size) {
  if (!cu_seqlens) return (T + chunk_size - 1) / chunk_size;
  std::vector<int64_t> cu(static_cast<size_t>(cu_seqlens->numel()));
  check(strata_memcpy(cu.data(), cu_seqlens->data(), cu.size() * sizeof(int64_t), STRATA_MEMCPY_DEFAULT));
  int64_t nt = 0;
  for (size_t n = 0; n + 1 < cu.size(); ++n) nt += (cu[n + 1] - cu[n] + chunk_size - 1) / chunk_size;
  return nt;
}
inline const strata_tensor_desc* d(const Tensor* t) { return t ? &t->desc() : nullptr; }
inline void* p(const Tensor* t) { return t ? t->data() : nullptr; }
}  // namespace gdn_bwd_detail

// dv [B, T, HV, V] (do's dtype).
inline Tensor chunk_bwd_dv_local(const Tensor& q, const Tensor& k, const Tensor& dout, const Tensor* g, float scale,
                                 int chunk_size = 64, const Tensor* cu_seqlens = nullptr, const Stream* s = nullptr) {
  using namespace gdn_bwd_detail;
  Tensor dv = Tensor::empty(dout.dtype(), dout.shape(), dout.device());
  strata_plan pl = nullptr;
  check(strata_chunk_bwd_dv_local_plan(&q.desc(), &k.desc(), &dout.desc(), d(g), d(cu_seqlens), &dv.desc(), scale,
                                       chunk_size, &pl));
  Plan(pl).run({q.data(), k.data(), dout.data(), p(g), p(cu_seqlens), dv.data()}, q.device(), s);
  return dv;
}

struct GdnBwdDhuResult {
  Tensor dh;   // [B, NT, HV, K, V], q's dtype
  Tensor dh0;  // [N, HV, K, V] f32 (empty unless want_dh0)
  Tensor dv2;  // [B, T, HV, V], dv's dtype
};
inline GdnBwdDhuResult chunk_gated_delta_rule_bwd_dhu(const Tensor& q, const Tensor& k, const Tensor& w,
                                                      const Tensor& dout, const Tensor& dv, const Tensor* g,
                                                      const Tensor* dht, bool want_dh0, float scale,
                                                      int chunk_size = 64, const Tensor* cu_seqlens = nullptr,
                                                      const Stream* s = nullptr) {
  using namespace gdn_bwd_detail;
  const int64_t B = q.size(0), T = q.size(1), HV = dout.size(2), K = q.size(3), V = dout.size(3);
  const int64_t N = cu_seqlens ? cu_seqlens->size(0) - 1 : B;
  GdnBwdDhuResult r;
  r.dh = Tensor::empty(q.dtype(), {B, num_chunks(cu_seqlens, T, chunk_size), HV, K, V}, q.device());
  if (want_dh0) r.dh0 = Tensor::empty(STRATA_DTYPE_F32, {N, HV, K, V}, q.device());
  r.dv2 = Tensor::empty(dv.dtype(), dv.shape(), q.device());
  strata_plan pl = nullptr;
  check(strata_chunk_gated_delta_rule_bwd_dhu_plan(&q.desc(), &k.desc(), &w.desc(), &dout.desc(), &dv.desc(), d(g),
                                                   d(dht), d(cu_seqlens), &r.dh.desc(),
                                                   want_dh0 ? &r.dh0.desc() : nullptr, &r.dv2.desc(), scale,
                                                   chunk_size, &pl));
  Plan(pl).run({q.data(), k.data(), w.data(), dout.data(), dv.data(), p(g), p(dht), p(cu_seqlens), r.dh.data(),
                want_dh0 ? r.dh0.data() : nullptr, r.dv2.data()},
               q.device(), s);
  return r;
}

struct GdnBwdDqkwgResult {
  Tensor dq, dk;  // [B, T, H, K], q's / k's dtype
  Tensor dw;      // [B, T, HV, K] (empty without dv)
  Tensor dg;      // [B, T, HV] f32 (empty without g)
};
inline GdnBwdDqkwgResult chunk_bwd_dqkwg(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                         const Tensor& h, const Tensor& dh, const Tensor* dv, const Tensor* g,
                                         float scale, int chunk_size = 64, const Tensor* cu_seqlens = nullptr,
                                         const Stream* s = nullptr) {
  using namespace gdn_bwd_detail;
  const int64_t B = q.size(0), T = q.size(1), HV = v.size(2), K = q.size(3);
  GdnBwdDqkwgResult r;
  r.dq = Tensor::empty(q.dtype(), q.shape(), q.device());
  r.dk = Tensor::empty(k.dtype(), k.shape(), q.device());
  if (dv) r.dw = Tensor::empty(q.dtype(), {B, T, HV, K}, q.device());
  if (g) r.dg = Tensor::empty(STRATA_DTYPE_F32, {B, T, HV}, q.device());
  strata_plan pl = nullptr;
  check(strata_chunk_bwd_dqkwg_plan(&q.desc(), &k.desc(), &v.desc(), &dout.desc(), &h.desc(), &dh.desc(), d(dv),
                                    d(g), d(cu_seqlens), &r.dq.desc(), &r.dk.desc(), dv ? &r.dw.desc() : nullptr,
                                    g ? &r.dg.desc() : nullptr, scale, chunk_size, &pl));
  Plan(pl).run({q.data(), k.data(), v.data(), dout.data(), h.data(), dh.data(), p(dv), p(g), p(cu_seqlens),
                r.dq.data(), r.dk.data(), dv ? r.dw.data() : nullptr, g ? r.dg.data() : nullptr},
               q.device(), s);
  return r;
}

struct GdnBwdWyResult {
  Tensor dk;     // [B, T, H, K], k's dtype
  Tensor dv;     // [B, T, HV, V], v's dtype
  Tensor dbeta;  // [B, T, HV], beta's dtype
  Tensor dg;     // [B, T, HV] f32 (empty without g)
};
inline GdnBwdWyResult prepare_wy_repr_bwd(const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& A,
                                          const Tensor& dw, const Tensor& du, const Tensor* g,
                                          const Tensor* cu_seqlens = nullptr, const Stream* s = nullptr) {
  using namespace gdn_bwd_detail;
  GdnBwdWyResult r;
  r.dk = Tensor::empty(k.dtype(), k.shape(), k.device());
  r.dv = Tensor::empty(v.dtype(), v.shape(), k.device());
  r.dbeta = Tensor::empty(beta.dtype(), beta.shape(), k.device());
  if (g) r.dg = Tensor::empty(STRATA_DTYPE_F32, beta.shape(), k.device());
  strata_plan pl = nullptr;
  check(strata_prepare_wy_repr_bwd_plan(&k.desc(), &v.desc(), &beta.desc(), &A.desc(), &dw.desc(), &du.desc(), d(g),
                                        d(cu_seqlens), &r.dk.desc(), &r.dv.desc(), &r.dbeta.desc(),
                                        g ? &r.dg.desc() : nullptr, &pl));
  Plan(pl).run({k.data(), v.data(), beta.data(), A.data(), dw.data(), du.data(), p(g), p(cu_seqlens), r.dk.data(),
                r.dv.data(), r.dbeta.data(), g ? r.dg.data() : nullptr},
               k.device(), s);
  return r;
}

}  // namespace strata
