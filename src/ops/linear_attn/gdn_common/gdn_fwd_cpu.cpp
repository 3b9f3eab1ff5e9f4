// CPU kernels of the GDN forward chunk operators (gdn_fwd_kernels.h), compiled once per Highway target
// (implementations "cpu.<isa>"). Each chunk's tiles are gathered into f32 row-major scratch (any dtype, any
// strides; f32 unit-stride tensors are used in place), and every dense product runs through the register-
// blocked fp32 GEMM micro-kernel of tile/cpu/gemm.h compiled for the same target; the element-wise parts
// (gates, masks, β scaling) are plain loops the compiler vectorises for the target.
//
// Work items (fixed split, tile/cpu/parallel.h; every output is written by one item in a fixed order, so the
// bits do not depend on the thread count):
//   kkt, prepare_wy, fwd_o : (chunk, q/k head h): the Gram matrices K Kᵀ / Q Kᵀ [L x L] are formed once and
//                            reused by the G value heads of the group (GVA);
//   solve_tril, recompute  : (chunk, value head);
//   fwd_h                  : (sequence, value head, column block of V: 64, or up to 256 when N·HV >= 8):
//                            columns of the state are independent (Vn = U − W S and S' = e^{γ_last} S + Kᵀ Vd act
//                            column-wise), which gives parallelism even for one sequence; the block stays in L2.
// Numerics: f32 throughout; exp only of non-positive arguments γ_i − γ_j (i >= j), γ_last − γ_i, γ (g <= 0),
// and masked entries are selected to 0, never multiplied by a mask.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/gdn_common/gdn_fwd_cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "tile/cpu/gemm.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"


HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::gdn::HWY_NAMESPACE {
// Helpers are compiled per target too (the dtype conversions and copies vectorise for it).

// Scratch per thread, reused across items (host memory; grows to the largest chunk once).
struct Scratch {
  std::vector<float> buf[10];
  float* get(int i, int64_t n) {
    if (static_cast<int64_t>(buf[i].size()) < n) buf[i].resize(static_cast<size_t>(n));
    return buf[i].data();
  }
};

// rows x cols of a strided tensor (element offset `base`, strides rs/cs) as f32 row-major with leading dim ld.
inline void gather(const GdnTensor& t, int64_t base, int64_t rs, int64_t cs, int64_t rows, int64_t cols, float* dst,
                   int64_t ld) {
  switch (t.dtype) {
    case STRATA_DTYPE_F32: {
      const float* s = static_cast<const float*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r) {
        if (cs == 1) std::memcpy(dst + r * ld, s + r * rs, static_cast<size_t>(cols) * sizeof(float));
        else
          for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = s[r * rs + c * cs];
      }
      break;
    }
    case STRATA_DTYPE_BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = bf16_bits_to_f32(s[r * rs + c * cs]);
      break;
    }
    case STRATA_DTYPE_F16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = f16_bits_to_f32(s[r * rs + c * cs]);
      break;
    }
    default: {
      const double* s = static_cast<const double*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = static_cast<float>(s[r * rs + c * cs]);
    }
  }
}

inline void scatter(const GdnTensor& t, int64_t base, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                    const float* src, int64_t ld) {
  switch (t.dtype) {
    case STRATA_DTYPE_F32: {
      float* d = static_cast<float*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r) {
        if (cs == 1) std::memcpy(d + r * rs, src + r * ld, static_cast<size_t>(cols) * sizeof(float));
        else
          for (int64_t c = 0; c < cols; ++c) d[r * rs + c * cs] = src[r * ld + c];
      }
      break;
    }
    case STRATA_DTYPE_BF16: {
      uint16_t* d = static_cast<uint16_t*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) d[r * rs + c * cs] = f32_to_bf16_bits(src[r * ld + c]);
      break;
    }
    case STRATA_DTYPE_F16: {
      uint16_t* d = static_cast<uint16_t*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) d[r * rs + c * cs] = f32_to_f16_bits(src[r * ld + c]);
      break;
    }
    default: {
      double* d = static_cast<double*>(t.data) + base;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) d[r * rs + c * cs] = src[r * ld + c];
    }
  }
}

// The tile in place when it already is f32 with unit column stride (ld = row stride), else gathered.
inline const float* view(const GdnTensor& t, int64_t base, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                         float* scratch, int64_t& ld) {
  if (t.dtype == STRATA_DTYPE_F32 && (cs == 1 || cols == 1) && rs >= cols) {
    ld = rs;
    return static_cast<const float*>(t.data) + base;
  }
  gather(t, base, rs, cs, rows, cols, scratch, cols);
  ld = cols;
  return scratch;
}

inline int64_t off4(const GdnTensor& t, int64_t b, int64_t tok, int64_t h) {
  return b * t.st[0] + tok * t.st[1] + h * t.st[2];
}




struct Ctx {
  const GdnFwdParams& p;
  tile::GemmF32Fn gemm;
  void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
    tile::GemmF32Args g;
    g.trans_a = ta;
    g.trans_b = tb;
    g.M = M;
    g.N = N;
    g.K = K;
    g.alpha = alpha;
    g.A = A;
    g.lda = lda;
    g.B = B;
    g.ldb = ldb;
    g.beta = beta;
    g.C = C;
    g.ldc = ldc;
    gemm(g);
  }
};

namespace hn = hwy::HWY_NAMESPACE;

// Lp = L rounded up to whole vectors: the leading dim of the inverse's scratch (columns past L are 0).
HWY_INLINE int64_t padded(int64_t L) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  return (L + N - 1) / N * N;
}

// X = (I + M)^-1 for strictly lower M (L x L, ld L) by forward substitution, X[i, :] = e_i − Σ_{m<i} M[i, m]
// X[m, :], into X (L x Lp, ld Lp = padded(L), zero above the diagonal and past column L). Column block jb of
// row i only needs rows m >= jb·N (earlier rows are 0 there); two accumulators (even / odd m) halve the
// dependency chain. Fixed order per target: deterministic.
HWY_INLINE void invert_unit_lower(const float* HWY_RESTRICT M, float* HWY_RESTRICT X, int64_t L) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), Lp = padded(L);
  for (int64_t i = 0; i < L; ++i) {
    float* xi = X + i * Lp;
    const float* mi = M + i * L;
    for (int64_t j0 = 0; j0 < Lp; j0 += N) {
      auto a0 = hn::Zero(d), a1 = hn::Zero(d);
      int64_t m = j0;
      for (; m + 1 < i; m += 2) {
        a0 = hn::MulAdd(hn::Set(d, mi[m]), hn::LoadU(d, X + m * Lp + j0), a0);
        a1 = hn::MulAdd(hn::Set(d, mi[m + 1]), hn::LoadU(d, X + (m + 1) * Lp + j0), a1);
      }
      if (m < i) a0 = hn::MulAdd(hn::Set(d, mi[m]), hn::LoadU(d, X + m * Lp + j0), a0);
      hn::StoreU(hn::Neg(hn::Add(a0, a1)), d, xi + j0);
    }
    for (int64_t j = i; j < Lp; ++j) xi[j] = 0.f;  // −0 and rows' own garbage above the diagonal
    xi[i] = 1.f;
  }
}

// out[j] = mul · P[j] · exp(gi − gam[j]) for j < n (callers pass n <= i + 1, so every exponent is
// gi − gam[j] <= 0 for a non-increasing γ); out[j] = 0 for n <= j < len. Vector exp of the target.
HWY_INLINE void gated_row(const float* HWY_RESTRICT P, const float* HWY_RESTRICT gam, float gi, float mul, int64_t n,
                          int64_t len, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vg = hn::Set(d, gi), vm = hn::Set(d, mul);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const auto e = hn::Exp(d, hn::Sub(vg, hn::LoadU(d, gam + j)));
    hn::StoreU(hn::Mul(hn::Mul(e, vm), hn::LoadU(d, P + j)), d, out + j);
  }
  if (j < n) {  // tail through a zero-padded vector (same exp as the body)
    HWY_ALIGN float gt[HWY_MAX_BYTES / sizeof(float)] = {}, pt[HWY_MAX_BYTES / sizeof(float)] = {},
                    ot[HWY_MAX_BYTES / sizeof(float)];
    for (int64_t t = j; t < n; ++t) {
      gt[t - j] = gam[t];
      pt[t - j] = P[t];
    }
    for (int64_t t = n - j; t < N; ++t) gt[t] = gi;  // exp(0): finite, discarded
    const auto e = hn::Exp(d, hn::Sub(vg, hn::Load(d, gt)));
    hn::Store(hn::Mul(hn::Mul(e, vm), hn::Load(d, pt)), d, ot);
    for (int64_t t = j; t < n; ++t) out[t] = ot[t - j];
  }
  for (j = n; j < len; ++j) out[j] = 0.f;
}

// Per-chunk helpers: gate γ (0 without g) and β of the L rows of chunk c, value head hv.
HWY_INLINE void load_gate(const GdnTensor& t, const ChunkPos& c, int64_t hv, int64_t L, float* out, float dflt) {
  if (!t.present()) {
    for (int64_t i = 0; i < L; ++i) out[i] = dflt;
    return;
  }
  gather(t, off4(t, c.b, c.s, hv), t.st[1], 1, L, 1, out, 1);
}

// Akk of one value head from the Gram matrix P = K Kᵀ (L x L, ld L): β_i P_ij exp(γ_i − γ_j), j < i, into
// M (L x L, ld L; 0 on and above the diagonal).
HWY_INLINE void gate_kkt(const float* P, const float* gam, const float* beta, int64_t L, float* M) {
  for (int64_t i = 0; i < L; ++i) gated_row(P + i * L, gam, gam[i], beta[i], i, L, M + i * L);
}

// Writes the L x L matrix X (ld L) into rows [s, s + L) of a [.., BT] chunk matrix, zero-filling columns L..BT.
HWY_INLINE void store_chunk_mat(const GdnTensor& t, const ChunkPos& c, int64_t hv, int64_t BT, const float* X,
                                int64_t L, int64_t ldx, float* row) {
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = 0; j < BT; ++j) row[j] = j < L ? X[i * ldx + j] : 0.f;
    scatter(t, off4(t, c.b, c.s + i, hv), 0, t.st[3], 1, BT, row, BT);
  }
}

// u = A diag(β) V and w = A diag(β e^γ) K for one chunk and value head; A is L x L (ld L), lower.
HWY_INLINE void wy_apply(const Ctx& x, const ChunkPos& c, int64_t hv, const float* A, int64_t lda, int64_t L,
                         const float* Kc,
                         const float* gam, const float* beta, Scratch& s) {
  const GdnFwdParams& p = x.p;
  const int64_t K = p.shape.K, V = p.shape.V;
  float* bx = s.get(6, L * std::max(K, V));
  float* out = s.get(7, L * std::max(K, V));
  // u
  gather(p.v, off4(p.v, c.b, c.s, hv), p.v.st[1], p.v.st[3], L, V, bx, V);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t d = 0; d < V; ++d) bx[i * V + d] *= beta[i];
  x.mm(false, false, L, V, L, 1.f, A, lda, bx, V, 0.f, out, V);
  scatter(p.u, off4(p.u, c.b, c.s, hv), p.u.st[1], p.u.st[3], L, V, out, V);
  // w
  for (int64_t i = 0; i < L; ++i) {
    const float f = beta[i] * std::exp(gam[i]);
    for (int64_t d = 0; d < K; ++d) bx[i * K + d] = f * Kc[i * K + d];
  }
  x.mm(false, false, L, K, L, 1.f, A, lda, bx, K, 0.f, out, K);
  scatter(p.w, off4(p.w, c.b, c.s, hv), p.w.st[1], p.w.st[3], L, K, out, K);
}

// Runs fn(chunk) for every chunk slot item i of [0, slots) x heads, in parallel with a fixed split.
template <class Fn>
void for_chunks(const GdnFwdParams& p, int64_t heads, Fn&& fn) {
  const int64_t slots = chunk_slots(p.chunks);
  tile::parallel_blocks(slots * heads, 1, [&](int64_t i0, int64_t i1) {
    thread_local Scratch s;
    for (int64_t i = i0; i < i1; ++i) {
      const ChunkPos c = locate_chunk(p.chunks, i / heads);
      if (c.valid) fn(c, i % heads, s);
    }
  });
}

void Kkt(const Ctx& x) {
  const GdnFwdParams& p = x.p;
  const int64_t K = p.shape.K, G = p.shape.G, BT = p.shape.BT;
  for_chunks(p, p.shape.H, [&](const ChunkPos& c, int64_t h, Scratch& s) {
    const int64_t L = c.e - c.s;
    int64_t ldk;
    const float* Kc = view(p.k, off4(p.k, c.b, c.s, h), p.k.st[1], p.k.st[3], L, K, s.get(0, L * K), ldk);
    float* P = s.get(1, L * L);
    x.mm(false, true, L, L, K, 1.f, Kc, ldk, Kc, ldk, 0.f, P, L);
    float* gam = s.get(2, L);
    float* beta = s.get(3, L);
    float* M = s.get(4, L * L);
    float* row = s.get(5, BT);
    for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
      load_gate(p.g, c, hv, L, gam, 0.f);
      load_gate(p.beta, c, hv, L, beta, 1.f);
      gate_kkt(P, gam, beta, L, M);
      store_chunk_mat(p.Akk, c, hv, BT, M, L, L, row);
    }
  });
}

void SolveTril(const Ctx& x) {
  const GdnFwdParams& p = x.p;
  const int64_t BT = p.shape.BT;
  for_chunks(p, p.shape.HV, [&](const ChunkPos& c, int64_t hv, Scratch& s) {
    const int64_t L = c.e - c.s;
    float* M = s.get(0, L * L);
    gather(p.Akk, off4(p.Akk, c.b, c.s, hv), p.Akk.st[1], p.Akk.st[3], L, L, M, L);
    float* X = s.get(1, L * padded(L));
    invert_unit_lower(M, X, L);
    store_chunk_mat(p.A, c, hv, BT, X, L, padded(L), s.get(2, BT));
  });
}

void RecomputeWU(const Ctx& x) {
  const GdnFwdParams& p = x.p;
  const int64_t K = p.shape.K;
  for_chunks(p, p.shape.HV, [&](const ChunkPos& c, int64_t hv, Scratch& s) {
    const int64_t L = c.e - c.s;
    float* A = s.get(0, L * L);
    gather(p.A, off4(p.A, c.b, c.s, hv), p.A.st[1], p.A.st[3], L, L, A, L);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = i + 1; j < L; ++j) A[i * L + j] = 0.f;  // lower part only
    float* Kc = s.get(1, L * K);
    gather(p.k, off4(p.k, c.b, c.s, hv / p.shape.G), p.k.st[1], p.k.st[3], L, K, Kc, K);
    float* gam = s.get(2, L);
    float* beta = s.get(3, L);
    load_gate(p.g, c, hv, L, gam, 0.f);
    load_gate(p.beta, c, hv, L, beta, 1.f);
    wy_apply(x, c, hv, A, L, L, Kc, gam, beta, s);
  });
}

void PrepareWY(const Ctx& x) {
  const GdnFwdParams& p = x.p;
  const int64_t K = p.shape.K, G = p.shape.G, BT = p.shape.BT;
  for_chunks(p, p.shape.H, [&](const ChunkPos& c, int64_t h, Scratch& s) {
    const int64_t L = c.e - c.s;
    float* Kc = s.get(0, L * K);
    gather(p.k, off4(p.k, c.b, c.s, h), p.k.st[1], p.k.st[3], L, K, Kc, K);
    float* P = s.get(1, L * L);
    x.mm(false, true, L, L, K, 1.f, Kc, K, Kc, K, 0.f, P, L);
    float* gam = s.get(2, L);
    float* beta = s.get(3, L);
    float* M = s.get(4, L * L);
    float* A = s.get(5, L * padded(L));
    float* row = s.get(8, BT);
    for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
      load_gate(p.g, c, hv, L, gam, 0.f);
      load_gate(p.beta, c, hv, L, beta, 1.f);
      gate_kkt(P, gam, beta, L, M);
      invert_unit_lower(M, A, L);
      store_chunk_mat(p.A, c, hv, BT, A, L, padded(L), row);
      wy_apply(x, c, hv, A, padded(L), L, Kc, gam, beta, s);
    }
  });
}

// State recurrence over the chunks of one sequence, one value head, columns [v0, v0 + VB) of the state.
void FwdH(const Ctx& x) {
  const GdnFwdParams& p = x.p;
  const int64_t K = p.shape.K, V = p.shape.V, BT = p.shape.BT, HV = p.shape.HV;
  // Column block of the state per item: 64 columns when (sequences x heads) alone give too few items for the
  // threads, else up to 256 (fewer, wider GEMMs; W and K read once per chunk). Chosen from the problem only,
  // never from the thread count, so the bits do not depend on it.
  const int64_t kVB = p.shape.N * HV >= 8 ? std::min<int64_t>(V, 256) : 64;
  const int64_t nvb = cdiv(V, kVB);
  const int64_t items = p.shape.N * HV * nvb;
  tile::parallel_blocks(items, 1, [&](int64_t i0, int64_t i1) {
    thread_local Scratch s;
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t n = it / (HV * nvb), hv = (it / nvb) % HV, vb = it % nvb;
      const int64_t v0 = vb * kVB, VB = std::min(kVB, V - v0);
      const int64_t h = hv / p.shape.G;
      const SeqPos sq = locate_sequence(p.chunks, n);
      float* S = s.get(0, K * VB);
      if (p.h0.present())
        gather(p.h0, n * p.h0.st[0] + hv * p.h0.st[1] + v0 * p.h0.st[3], p.h0.st[2], p.h0.st[3], K, VB, S, VB);
      else
        std::fill(S, S + K * VB, 0.f);
      float* Vn = s.get(1, BT * VB);
      float* gam = s.get(2, BT);
      float* Kc = s.get(3, BT * K);
      float* Wc = s.get(4, BT * K);
      int64_t cidx = sq.chunk0;
      for (int64_t t0 = sq.bos; t0 < sq.eos; t0 += BT, ++cidx) {
        const int64_t L = std::min(BT, sq.eos - t0);
        ChunkPos c;
        c.b = sq.b;
        c.s = t0;
        c.e = t0 + L;
        if (p.h.present() && (p.chunks.varlen() ? cidx < p.shape.NT : true))
          scatter(p.h, h_base(p.h, p.chunks, sq.b, cidx) + hv * p.h.st[2] + v0 * p.h.st[4], p.h.st[3], p.h.st[4],
                  K, VB, S, VB);
        // Vn = U − W S
        gather(p.u, off4(p.u, c.b, t0, hv) + v0 * p.u.st[3], p.u.st[1], p.u.st[3], L, VB, Vn, VB);
        int64_t ldw;
        const float* W = view(p.w, off4(p.w, c.b, t0, hv), p.w.st[1], p.w.st[3], L, K, Wc, ldw);
        x.mm(false, false, L, VB, K, -1.f, W, ldw, S, VB, 1.f, Vn, VB);
        if (p.v_new.present())
          scatter(p.v_new, off4(p.v_new, c.b, t0, hv) + v0 * p.v_new.st[3], p.v_new.st[1], p.v_new.st[3], L, VB,
                  Vn, VB);
        // S = e^{γ_last} S + Kᵀ diag(e^{γ_last − γ}) Vn
        load_gate(p.g, c, hv, L, gam, 0.f);
        const float glast = gam[L - 1];
        for (int64_t i = 0; i < L; ++i) {
          const float f = std::exp(glast - gam[i]);
          for (int64_t d = 0; d < VB; ++d) Vn[i * VB + d] *= f;
        }
        int64_t ldk;
        const float* Kt = view(p.k, off4(p.k, c.b, t0, h), p.k.st[1], p.k.st[3], L, K, Kc, ldk);
        x.mm(true, false, K, VB, L, 1.f, Kt, ldk, Vn, VB, std::exp(glast), S, VB);
      }
      if (p.ht.present())
        scatter(p.ht, n * p.ht.st[0] + hv * p.ht.st[1] + v0 * p.ht.st[3], p.ht.st[2], p.ht.st[3], K, VB, S, VB);
    }
  });
}

void FwdO(const Ctx& x) {
  const GdnFwdParams& p = x.p;
  const int64_t K = p.shape.K, V = p.shape.V, G = p.shape.G;
  const float scale = p.shape.scale;
  for_chunks(p, p.shape.H, [&](const ChunkPos& c, int64_t h, Scratch& s) {
    const int64_t L = c.e - c.s;
    if (p.chunks.varlen() && c.idx >= p.shape.NT) return;  // h has fewer chunks than cu_seqlens (CPU checks it)
    int64_t ldq, ldk;
    const float* Qc = view(p.q, off4(p.q, c.b, c.s, h), p.q.st[1], p.q.st[3], L, K, s.get(0, L * K), ldq);
    const float* Kc = view(p.k, off4(p.k, c.b, c.s, h), p.k.st[1], p.k.st[3], L, K, s.get(1, L * K), ldk);
    float* P = s.get(2, L * L);
    x.mm(false, true, L, L, K, 1.f, Qc, ldq, Kc, ldk, 0.f, P, L);
    float* gam = s.get(3, L);
    float* Pg = s.get(4, L * L);
    float* O = s.get(5, L * V);
    float* Sb = s.get(6, K * V);
    float* Vb = s.get(7, L * V);
    for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
      load_gate(p.g, c, hv, L, gam, 0.f);
      for (int64_t i = 0; i < L; ++i) gated_row(P + i * L, gam, gam[i], 1.f, i + 1, L, Pg + i * L);
      int64_t lds, ldv;
      const float* S = view(p.h, h_base(p.h, p.chunks, c.b, c.idx) + hv * p.h.st[2], p.h.st[3], p.h.st[4], K, V, Sb,
                            lds);
      const float* Vn = view(p.v, off4(p.v, c.b, c.s, hv), p.v.st[1], p.v.st[3], L, V, Vb, ldv);
      // O = diag(e^γ) Q S, then O += Pg Vn, then O *= scale
      x.mm(false, false, L, V, K, 1.f, Qc, ldq, S, lds, 0.f, O, V);
      for (int64_t i = 0; i < L; ++i) {
        const float f = std::exp(gam[i]);
        for (int64_t d = 0; d < V; ++d) O[i * V + d] *= f;
      }
      x.mm(false, false, L, V, L, 1.f, Pg, L, Vn, ldv, 1.f, O, V);
      for (int64_t i = 0; i < L * V; ++i) O[i] *= scale;
      scatter(p.o, off4(p.o, c.b, c.s, hv), p.o.st[1], p.o.st[3], L, V, O, V);
    }
  });
}

void GdnFwdCpu(FwdOp op, const GdnFwdParams& p) {
  static const tile::GemmF32Fn gemm = tile::gemm_f32_for(HWY_TARGET);
  const Ctx x{p, gemm ? gemm : &tile::gemm_f32};
  switch (op) {
    case FwdOp::kKkt: Kkt(x); break;
    case FwdOp::kSolveTril: SolveTril(x); break;
    case FwdOp::kRecomputeWU: RecomputeWU(x); break;
    case FwdOp::kPrepareWY: PrepareWY(x); break;
    case FwdOp::kFwdH: FwdH(x); break;
    case FwdOp::kFwdO: FwdO(x); break;
    default: break;
  }
}

}  // namespace strata::linear_attn::gdn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::linear_attn::gdn {
HWY_EXPORT(GdnFwdCpu);

GdnFwdCpuFn fwd_cpu_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(GdnFwdCpu, hwy_target); }
void fwd_cpu(FwdOp op, const GdnFwdParams& p) { HWY_DYNAMIC_DISPATCH(GdnFwdCpu)(op, p); }
}  // namespace strata::linear_attn::gdn
#endif
