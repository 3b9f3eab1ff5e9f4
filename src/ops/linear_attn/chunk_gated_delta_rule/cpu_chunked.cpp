// CPU implementation of chunk_gated_delta_rule: the chunked WY form (ops_gdn_kda.md §2.4, §3.1, §3.2,
// Appendix A) in f32, fused per (sequence, value head). Every chunk is handled as a full 64-row block: rows
// past the end of a sequence are loaded as zeros (k, v, q, beta, do) with gamma held at the last valid value,
// so they contribute nothing and no exponential sees garbage (§6.1); they are never stored. All products are
// 64x64-class fp32 GEMMs of src/tile (one per Highway ISA: the implementation name says which).
//
// Forward, per chunk (S [K, V] the state at the chunk start, kept in f32 across chunks):
//   gamma = cumsum(g);  M = StrictLower(diag(beta) K K^T (.) Gamma);  A = (I + M)^-1 (forward substitution)
//   W = A diag(beta e^gamma) K;  U = A diag(beta) V;  Vn = U - W S  (computed as A (diag(beta) V - diag(beta
//   e^gamma) K S): W itself is formed only by the backward, which keeps it)
//   O = diag(scale e^gamma) Q S + (scale Lower(Q K^T (.) Gamma)) Vn
//   S = e^{gamma_last} S + K^T diag(e^{gamma_last - gamma}) Vn
// Backward, per (n, hv): the forward above re-run to store every chunk's start state (workspace, [NT, HV, K, V]
// f32) and its WY factors (K K^T, A, W, v_new), then the chunks in reverse with dS (Appendix A, "GDN backward");
// dq and dk are summed over the G value heads of a q/k head in increasing hv, then taken through the l2norm
// backward (by the task itself when it holds the whole group, else in a pass afterwards, same bits). With the
// op's l2norm, q and k rows are normalised as the chunks load them (both passes).
// Work items (both passes) are a sequence, a q/k head and up to 4 of its value heads, walked chunk by chunk: the
// q/k part of a chunk (Q, K, K^T, K K^T, Q K^T) is loaded and multiplied once for the group, then each value head
// runs with its own state, in exactly the arithmetic it would have alone. Any thread may take any item, so the
// bits do not depend on the thread count (nor on the grouping). Scratch comes from the workspace, one slot per
// thread (GdnParams::slots, fixed by the plan).
//
// The whole file is compiled once per Highway target (foreach_target): the per-chunk element-wise loops
// (decays, scalings, the forward substitution, row dots) are plain C++ that the compiler vectorizes for the
// implementation's ISA, and `cpu.<isa>` runs that ISA throughout, not only inside the GEMM tile.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/chunk_gated_delta_rule/cpu_chunked.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "opbase/tensor.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/gemm.h"
#include "tile/cpu/isa.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::HWY_NAMESPACE {
namespace {

constexpr int64_t BT = kGdnChunk;
constexpr size_t kAlign = 64;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// ---- row access with dtype conversion (strides in elements; the last dimension is contiguous) ----
void load_row(const GdnTensor& t, int64_t off, float* dst, int64_t n) {
  switch (t.dtype) {
    case STRATA_DTYPE_F32: std::memcpy(dst, static_cast<const float*>(t.data) + off, sizeof(float) * n); break;
    case STRATA_DTYPE_BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(s[i]);
      break;
    }
    case STRATA_DTYPE_F16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_f32(s[i]);
      break;
    }
    default: {
      const double* s = static_cast<const double*>(t.data) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
    }
  }
}
void store_row(const GdnTensor& t, int64_t off, const float* src, int64_t n) {
  switch (t.dtype) {
    case STRATA_DTYPE_F32: std::memcpy(static_cast<float*>(t.data) + off, src, sizeof(float) * n); break;
    case STRATA_DTYPE_BF16: {
      uint16_t* d = static_cast<uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16_bits(src[i]);
      break;
    }
    case STRATA_DTYPE_F16: {
      uint16_t* d = static_cast<uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16_bits(src[i]);
      break;
    }
    default: {
      double* d = static_cast<double*>(t.data) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
    }
  }
}
float load1(const GdnTensor& t, int64_t off) {
  float x;
  load_row(t, off, &x, 1);
  return x;
}
void store1(const GdnTensor& t, int64_t off, float x) { store_row(t, off, &x, 1); }

// q or k row (b, t, h) as stored (the l2norm, when on, is applied by the caller: chunk_load_qk).
void load_qk(const GdnParams& p, const GdnTensor& x, int64_t b, int64_t t, int64_t h, float* dst) {
  load_row(x, b * x.st[0] + t * x.st[1] + h * x.st[2], dst, p.K);
}

using tile::GemmTri;
constexpr GemmTri kNoTri = GemmTri::kNone, kLowerC = GemmTri::kLower;  // kLowerC: only C's lower triangle is wanted
struct Gemm {
  tile::GemmF32Fn fn;
  tile::TransposeF32Fn tr;
  // C[M, N] = alpha op(A) op(B) + beta C_in (C_in = C unless given); `tri`: op(A) is triangular (gemm.h)
  void operator()(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc, GemmTri tri = GemmTri::kNone,
                  const float* C_in = nullptr, int64_t ldc_in = 0, GemmTri tri_c = GemmTri::kNone,
                  const float* row_alpha = nullptr, const float* row_beta = nullptr) const {
    tile::GemmF32Args g;
    g.row_alpha = row_alpha;
    g.row_beta = row_beta;
    g.tri_a = tri;
    g.tri_c = tri_c;
    g.C_in = C_in;
    g.ldc_in = ldc_in;
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
    fn(g);
  }
  // dst [cols, rows] = src [rows, cols]^T (row strides lds, ldd)
  void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) const {
    tr(src, lds, rows, cols, dst, ldd);
  }
};

namespace hn = hwy::HWY_NAMESPACE;

// Row dot product: four vector partial sums (independent FMA chains), combined in a fixed order, then the
// n % lanes tail. The same bits on every run and thread count for a given target.
float dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + L), hn::LoadU(d, b + i + L), s1);
    s2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * L), hn::LoadU(d, b + i + 2 * L), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * L), hn::LoadU(d, b + i + 3 * L), s3);
  }
  for (; i + L <= n; i += L) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float r = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Row stride (floats) of the [K, V] states and their transposes: whole cache lines, and not a multiple of 64
// floats (V = 128 -> 144). A GEMM whose right operand is a state (W S, Q S, K dS, dO S^T, ...) streams a K x 64
// panel of it per tile of rows; at a 512-byte stride its rows fall into a quarter of L1's sets and the panel is
// re-fetched from L2 by every row tile (64x128x128 at ldb 128: ~80 % of the FMA loop, at 144: ~90 %, measured).
int64_t state_ld(int64_t n) {
  const int64_t r = (n + 15) / 16 * 16;
  return r % 64 == 0 ? r + 16 : r;
}

// Value heads per forward task: the G = HV / H value heads of a q/k head share the chunk's Q, K, K^T, K K^T
// and Q K^T (loaded, transposed and multiplied once for up to kFwdGroup of them: at G = 2, 2 of the 8 GEMMs of a
// chunk and half the q/k traffic), each keeping its own state S in the scratch.
constexpr int64_t kFwdGroup = 4;
int64_t fwd_group(const GdnParams& p) {
  return std::max<int64_t>(1, std::min<int64_t>(kFwdGroup, p.HV / std::max<int64_t>(p.H, 1)));
}

// The fused l2norm (ops_gdn_kda.md §4.1; the formulas of the shared row-norm kernels), one row at a time, by
// every pass and path that needs it (so they all see the same bits):
// x /= sqrt(|x|^2 + eps) in place; returns rstd = 1 / sqrt(|x|^2 + eps).
float l2normalise(float* x, int64_t n) {
  const float r = 1.0f / std::sqrt(dot(x, x, n) + static_cast<float>(kGdnL2Eps));
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
  return r;
}
// Its backward: dy -> dx = rstd (dy - (dy . y) y), y the normalised row (in place on dy).
void l2norm_bwd(const float* y, float rstd, float* dy, int64_t n) {
  const float c = dot(dy, y, n);
  for (int64_t i = 0; i < n; ++i) dy[i] = rstd * (dy[i] - c * y[i]);
}

// An output row of f32 values: with f32 destination rows that start on a cache line and fill whole lines, by
// non-temporal stores (o is written once and not read back here: no read-for-ownership of its lines, which are
// 4 KiB apart at HV * V = 1024 and missed the cache on every row); else store_row. FlushStream before the
// task ends.
// dst[0, n) = src[0, n) (f32), non-temporal when dst starts on a cache line and n fills whole lines; false
// (nothing written) otherwise.
bool stream_f32(float* dst, const float* src, int64_t n) {
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> d;
  const int64_t Lv = static_cast<int64_t>(hn::Lanes(d));
  if (n % 16 == 0 && n % Lv == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0) {
    for (int64_t i = 0; i < n; i += Lv) hn::Stream(hn::LoadU(d, src + i), d, dst + i);
    return true;
  }
#endif
  return false;
}
void store_row_stream(const GdnTensor& t, int64_t off, const float* src, int64_t n) {
  if (t.dtype == STRATA_DTYPE_F32 && stream_f32(static_cast<float*>(t.data) + off, src, n)) return;
  store_row(t, off, src, n);
}

// Scratch of one thread: named f32 blocks carved from its workspace slot.
// The products whose right operand is a transpose (X Y^T) read Y^T from a transposed copy made once per chunk
// (KT = Kc^T, VT, ST = S^T, dST = dS^T), so the GEMMs run without packing.
struct Scratch {
  float *Q, *Kc, *Kb, *W, *dQ, *dK, *dW, *TK, *KT;  // [BT, K] (KT: [K, BT])
  float *Vc, *Vb, *Vn, *dO, *dVn, *TV, *VT;        // [BT, V] (VT: [V, BT])
  float *P, *M, *Ai, *Aqk, *Ds, *dA, *TL, *Gm;  // [BT, BT]; Gm = exp(gamma_i - gamma_j) for j <= i, else 0
  // [K, V] (row stride state_ld(V)): S is the first of fwd_group(p) consecutive states (K state_ld(V) floats
  // apart), one per value head of a task (the forward's S; the backward's dS, its S being the stored ones);
  // ST = S^T, dST = dS^T [V, K] (row stride state_ld(K))
  float *S, *ST, *dST;
  float* QK = nullptr;  // [BT, BT]: Q K^T of the chunk, shared by the value heads of a task
  float *alpha, *beta, *E, *eL, *dgam, *dbeta;  // [BT]
  float *rq, *rk;       // [BT]: rstd of the chunk's q, k rows (fused l2norm)
  // [2 BT], [BT]: per-row epilogue scales (tile::GemmF32Args) of the forward's K S and Q S, the backward's dO S^T
  float *ra, *rb;
  float *dQs, *dKs;     // [BT, K]: dq, dk summed over the value heads of a backward task
  int64_t L = 0;                                  // valid rows of the chunk in the scratch
  static size_t floats(const GdnParams& p) {
    return 9 * align_up(BT * p.K) + 7 * align_up(BT * p.V) + 9 * align_up(BT * BT) +
           2 * align_up(p.V * state_ld(p.K)) + fwd_group(p) * align_up(p.K * state_ld(p.V)) + 9 * align_up(BT) + align_up(2 * BT) +
           2 * align_up(BT * p.K);
  }
  Scratch(float* base, const GdnParams& p) {
    float* c = base;
    auto take = [&](size_t n) {
      float* r = c;
      c += align_up(n);
      return r;
    };
    for (float** f : {&Q, &Kc, &Kb, &W, &dQ, &dK, &dW, &TK, &KT}) *f = take(BT * p.K);
    for (float** f : {&Vc, &Vb, &Vn, &dO, &dVn, &TV, &VT}) *f = take(BT * p.V);
    for (float** f : {&P, &M, &Ai, &Aqk, &Ds, &dA, &TL, &Gm, &QK}) *f = take(BT * BT);
    for (float** f : {&ST, &dST}) *f = take(p.V * state_ld(p.K));
    S = take(p.K * state_ld(p.V) * fwd_group(p));
    for (float** f : {&alpha, &beta, &E, &eL, &dgam, &dbeta, &rq, &rk}) *f = take(BT);
    ra = take(2 * BT);
    rb = take(BT);
    for (float** f : {&dQs, &dKs}) *f = take(BT * p.K);
  }
};

// Loads the q/k part of chunk [t0, t0 + L) of sequence row b for q/k head h into the scratch (rows >= L zero):
// Kc (and Q), KT = K^T.
void chunk_load_qk(const GdnParams& p, const Gemm& mm, Scratch& s, int64_t b, int64_t t0, int64_t L, int64_t h,
                   bool load_q) {
  const int64_t K = p.K;
  s.L = L;
  std::memset(s.Kc + L * K, 0, sizeof(float) * (BT - L) * K);  // rows past the sequence end
  if (load_q) std::memset(s.Q + L * K, 0, sizeof(float) * (BT - L) * K);
  for (int64_t i = 0; i < L; ++i) {
    load_qk(p, p.k, b, t0 + i, h, s.Kc + i * K);
    if (load_q) load_qk(p, p.q, b, t0 + i, h, s.Q + i * K);
    if (p.l2norm) {  // the fused l2norm
      s.rk[i] = l2normalise(s.Kc + i * K, K);
      if (load_q) s.rq[i] = l2normalise(s.Q + i * K, K);
    }
  }
  mm.transpose(s.Kc, K, BT, K, s.KT, BT);
}

// Loads the value-head part of the chunk (after chunk_load_qk: reads Kc): v, g, beta of value head hv, and builds
// the decays (Gm, E = e^gamma, eL = e^{gamma_last - gamma}), beta and, with `scaled` (the backward, which keeps
// W = A Kb), Kb = diag(beta E) K, Vb = diag(beta) V.
void chunk_load_hv(const GdnParams& p, Scratch& s, int64_t b, int64_t t0, int64_t L, int64_t hv, bool scaled = true) {
  const int64_t K = p.K, V = p.V;
  std::memset(s.Vc + L * V, 0, sizeof(float) * (BT - L) * V);
  for (int64_t i = 0; i < BT; ++i) {
    if (i < L) {
      const int64_t t = t0 + i;
      load_row(p.v, b * p.v.st[0] + t * p.v.st[1] + hv * p.v.st[2], s.Vc + i * V, V);
      s.alpha[i] = std::exp(load1(p.g, b * p.g.st[0] + t * p.g.st[1] + hv * p.g.st[2]));
      s.beta[i] = load1(p.beta, b * p.beta.st[0] + t * p.beta.st[1] + hv * p.beta.st[2]);
    } else {
      s.alpha[i] = 1.f;  // rows past L: no decay, so their factors equal the last valid row's (and multiply zeros)
      s.beta[i] = 0.f;
    }
  }
  // Decay factors as products of the per-token decays alpha_u = e^{g_u} <= 1 (never an exp of a positive
  // argument, and one exp per token instead of one per pair):
  //   Gm_ij = exp(gamma_i - gamma_j) = prod_{u=j+1..i} alpha_u (j <= i, else 0), built row by row:
  //   row i = alpha_i * row i-1 (j < i), Gm_ii = 1;  E_i = e^{gamma_i} = prod_{u<=i} alpha_u;
  //   eL_i = e^{gamma_last - gamma_i} = Gm_{BT-1, i} (rows past L have alpha = 1).
  {  // restrict locals: through the Scratch fields every Gm store could alias alpha
    float* HWY_RESTRICT Gm = s.Gm;
    const float* HWY_RESTRICT alpha = s.alpha;
    for (int64_t i = 0; i < BT; ++i) {
      float* gi = Gm + i * BT;
      if (i == 0) {
        gi[0] = 1.f;
        for (int64_t j = 1; j < BT; ++j) gi[j] = 0.f;
      } else {
        const float* gp = gi - BT;
        const float a = alpha[i];
        for (int64_t j = 0; j < BT; ++j) gi[j] = a * gp[j];  // 0 above the diagonal stays 0
        gi[i] = 1.f;
      }
      s.E[i] = i == 0 ? alpha[0] : s.E[i - 1] * alpha[i];
    }
  }
  for (int64_t i = 0; i < BT; ++i) s.eL[i] = s.Gm[(BT - 1) * BT + i];
  if (!scaled) return;
  // Kb = diag(beta E) K, Vb = diag(beta) V
  for (int64_t i = 0; i < BT; ++i) {
    const float kb = s.beta[i] * s.E[i];
    for (int64_t d = 0; d < K; ++d) s.Kb[i * K + d] = kb * s.Kc[i * K + d];
    for (int64_t d = 0; d < V; ++d) s.Vb[i * V + d] = s.beta[i] * s.Vc[i * V + d];
  }
}

// Hints the token rows of chunk [t0, t0 + L) of k, v (and q, do) into L2 while the current chunk computes:
// the rows are 0.25-1 KiB pieces one or more pages apart ([B, T, heads, D]), which the hardware prefetchers
// do not follow, so a plain load of a chunk waits on memory row by row.
void prefetch_rows(const GdnTensor& x, int64_t b, int64_t t0, int64_t L, int64_t head, int64_t D) {
  const int64_t es = static_cast<int64_t>(dtype_size(x.dtype));
  const char* base = static_cast<const char*>(x.data) + (b * x.st[0] + head * x.st[2]) * es;
  for (int64_t i = 0; i < L; ++i) {
    const char* r = base + (t0 + i) * x.st[1] * es;
    // One demand load per row first: it walks the page table, so the prefetches of the row find its page in
    // the TLB (the rows are a page or half a page apart; without it the hints gained nothing measurable, session 5;
    // with it the forward gained 1-5 % in paired A/B runs, session 12).
    (void)*reinterpret_cast<const volatile char*>(r);
    for (int64_t off = 0; off < D * es; off += 64) __builtin_prefetch(r + off, 0, 2);
  }
}
// Row i of a masked decay product: y_j = (c x_j) Gm_ij for j < i (kStrict) or j <= i, else 0, j < BT. Explicit
// vectors with a select: written as a conditional multiply the loop does not vectorize below AVX-512 (no masked
// arithmetic; -ftrapping-math), and a triangular bound leaves per-row remainder loops. x_j past the diagonal is
// never written by the products that make x (GemmTri::kLower output, so it may be stale): computed, not used.
// y may equal x (in place).
template <bool kStrict>
HWY_INLINE void masked_decay_row(const float* x, const float* HWY_RESTRICT gm, float c, float* y, int64_t i) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto vc = hn::Set(d, c);
  const auto end = hn::Set(di, static_cast<int32_t>(kStrict ? i : i + 1));  // keep columns j < end
  for (int64_t j = 0; j < BT; j += L) {
    const auto m = hn::Mul(hn::Mul(vc, hn::LoadU(d, x + j)), hn::LoadU(d, gm + j));
    const auto col = hn::Iota(di, static_cast<int32_t>(j));
    const auto keep = hn::RebindMask(d, hn::Lt(col, end));
    hn::StoreU(hn::IfThenElseZero(keep, m), d, y + j);
  }
}

// M = StrictLower(beta_i P_ij Gamma_ij) from P = K K^T.
void build_m(Scratch& s) {
  for (int64_t i = 0; i < BT; ++i) masked_decay_row<true>(s.P + i * BT, s.Gm + i * BT, s.beta[i], s.M + i * BT, i);
}

// Y = diag(r) X, X and Y [BT, n] (row-scaled copies whose scale sits on a product's inner index, where no GEMM
// epilogue can apply it). Restrict locals: through the Scratch fields every store could alias r.
void scale_rows(const float* HWY_RESTRICT r, const float* HWY_RESTRICT X, float* HWY_RESTRICT Y, int64_t n) {
  for (int64_t i = 0; i < BT; ++i) {
    const float ri = r[i];
    for (int64_t d = 0; d < n; ++d) Y[i * n + d] = ri * X[i * n + d];
  }
}

// After chunk_load_qk: P = K K^T (lower triangle; j < i is read).
void chunk_kkt(const GdnParams& p, const Gemm& mm, Scratch& s) {
  mm(false, false, BT, BT, p.K, 1.f, s.Kc, p.K, s.KT, BT, 0.f, s.P, BT, kNoTri, nullptr, 0, kLowerC);
}

#if HWY_TARGET != HWY_SCALAR
// Rows [i0, i1) of A = (I + M)^-1 (unit lower triangular) by forward substitution, row i = e_i - sum_{j<i} M_ij A_j
// (rows j < i are final), for rows whose entries all lie in the first NV vectors (i1 <= NV lanes): row i is
// accumulated in NV registers over j in increasing order; rows past the chunk's L valid rows have M = 0 (zero
// keys), so they are e_i and skip the sum (short documents are cheap). Column i is never touched (j < i): set
// to 1 at the store; the stored zeros past it are read by later rows (their NV may be larger).
template <int NV>
HWY_INLINE void inverse_rows(Scratch& s, int64_t i0, int64_t i1) {
  const hn::ScalableTag<float> d;
  constexpr int64_t kLv = HWY_LANES(float);
  const float* HWY_RESTRICT M = s.M;
  float* HWY_RESTRICT Ai = s.Ai;
  for (int64_t i = i0; i < i1; ++i) {
    hn::Vec<decltype(d)> acc[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[v] = hn::Zero(d);
    const int64_t jn = i < s.L ? i : 0;
    for (int64_t j = 0; j < jn; ++j) {
      const auto vm = hn::Set(d, M[i * BT + j]);
      const float* aj = Ai + j * BT;
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[v] = hn::NegMulAdd(vm, hn::LoadU(d, aj + v * kLv), acc[v]);
    }
    float* ai = Ai + i * BT;
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[v], d, ai + v * kLv);
    for (int64_t c = NV * kLv; c < BT; ++c) ai[c] = 0.f;
    ai[i] = 1.f;
  }
}
template <int... NV>
HWY_INLINE void inverse_blocks(Scratch& s, std::integer_sequence<int, NV...>) {
  constexpr int64_t kLv = HWY_LANES(float);
  (inverse_rows<NV + 1>(s, NV * kLv, (NV + 1) * kLv), ...);  // row block b: its rows' entries fill b + 1 vectors
}
#endif

// After chunk_load_hv and chunk_kkt: M (build_m) and A = (I + M)^-1 into s.Ai.
void chunk_inverse(Scratch& s) {
  build_m(s);
#if HWY_TARGET == HWY_SCALAR
  for (int64_t i = 0; i < BT; ++i) {
    float* ai = s.Ai + i * BT;
    std::memset(ai, 0, sizeof(float) * BT);
    ai[i] = 1.f;
    for (int64_t j = 0; j < (i < s.L ? i : 0); ++j) {
      const float m = s.M[i * BT + j];
      const float* aj = s.Ai + j * BT;
      for (int64_t c = 0; c <= j; ++c) ai[c] -= m * aj[c];
    }
  }
#else
  constexpr int64_t kLv = HWY_LANES(float);
  static_assert(BT % kLv == 0, "chunk rows must be whole vectors");
  inverse_blocks(s, std::make_integer_sequence<int, static_cast<int>(BT / kLv)>{});
#endif
}

// After chunk_load_qk, chunk_load_hv and chunk_kkt: M, A = (I + M)^-1, W = A Kb, U = A Vb (into Vn). The backward
// keeps W (its reverse sweep reads it); the forward forms Vn = A (Vb - Kb S) without W (fwd_task).
void chunk_solve_wy(const GdnParams& p, const Gemm& mm, Scratch& s) {
  const int64_t K = p.K, V = p.V;
  chunk_inverse(s);
  mm(false, false, BT, K, BT, 1.f, s.Ai, BT, s.Kb, K, 0.f, s.W, K, GemmTri::kLower);
  mm(false, false, BT, V, BT, 1.f, s.Ai, BT, s.Vb, V, 0.f, s.Vn, V, GemmTri::kLower);
}

// dst = scale * Lower(src (.) Gamma) (diagonal included), [BT, BT]; dst may equal src (in place).
void mask_lower_gamma_from(const float* src, float* dst, const float* Gm, float scale) {
  for (int64_t i = 0; i < BT; ++i) masked_decay_row<false>(src + i * BT, Gm + i * BT, scale, dst + i * BT, i);
}
void mask_lower_gamma(float* X, const float* Gm, float scale) { mask_lower_gamma_from(X, X, Gm, scale); }

// Chunk starts per sequence: coff[n] = index of sequence n's first chunk (exclusive prefix sum of ceil(L/BT)).
void chunk_offsets(const GdnParams& p, int64_t* coff) {
  coff[0] = 0;
  for (int64_t n = 0; n < p.N; ++n) {
    const GdnSeq s = gdn_seq(p, n);
    coff[n + 1] = coff[n] + (s.eos - s.bos + BT - 1) / BT;
  }
}
int64_t max_chunks(const GdnParams& p) {
  const int64_t per_row = (p.T + BT - 1) / BT;
  return p.cu_seqlens ? per_row + p.N : p.B * per_row;
}

// Runs fn(task, scratch) for task in [0, ntasks) on min(slots, threads) threads; dynamic scheduling is safe
// because each task's result does not depend on which thread computes it.
template <class Fn>
void for_tasks(const GdnParams& p, int64_t ntasks, char* scratch_base, size_t slot_bytes, Fn&& fn) {
  if (ntasks <= 0) return;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({p.slots, rt::num_threads(), ntasks})));
  if (threads == 1) {
    Scratch s(reinterpret_cast<float*>(scratch_base), p);
    for (int64_t i = 0; i < ntasks; ++i) fn(i, s);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    Scratch s(reinterpret_cast<float*>(scratch_base + slot_bytes * static_cast<size_t>(omp_get_thread_num())), p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < ntasks; ++i) fn(i, s);
  }
}

// Tasks of either pass: (sequence, q/k head, group of up to fwd_group value heads of that head); one value head
// per task when grouped tasks would leave threads idle (the bits are the same either way: fwd_task, bwd_task).
int64_t task_group(const GdnParams& p) {
  const int64_t G = p.HV / p.H, gs = fwd_group(p);
  return p.N * p.H * ((G + gs - 1) / gs) < std::min<int64_t>(p.slots, rt::num_threads()) ? 1 : gs;
}

// ---- forward ----

// Value heads hv0 .. hv0 + ng - 1 (all of one q/k head h) of sequence n, chunk by chunk: the q/k part of a chunk
// (Q, K, K^T, K K^T, Q K^T) once, then each value head with its own state (s.S + j K V). Every value head's
// arithmetic is the one it would have alone (same products, same order): the grouping changes no bit.
void fwd_task(const GdnParams& p, const Gemm& mm, Scratch& s, int64_t n, int64_t hv0, int64_t ng) {
  const int64_t K = p.K, V = p.V, ldS = state_ld(V), KV = K * ldS, h = hv0 / (p.HV / p.H);
  const GdnSeq seq = gdn_seq(p, n);
  for (int64_t j = 0; j < ng; ++j) {
    float* S = s.S + j * KV;
    for (int64_t i = 0; i < K; ++i) {
      if (p.h0.present())
        load_row(p.h0, n * p.h0.st[0] + (hv0 + j) * p.h0.st[1] + i * p.h0.st[2], S + i * ldS, V);
      else
        std::memset(S + i * ldS, 0, sizeof(float) * V);
    }
  }
  for (int64_t t0 = seq.bos; t0 < seq.eos; t0 += BT) {
    const int64_t L = std::min(BT, seq.eos - t0);
    chunk_load_qk(p, mm, s, seq.b, t0, L, h, true);
    chunk_kkt(p, mm, s);
    mm(false, false, BT, BT, K, 1.f, s.Q, K, s.KT, BT, 0.f, s.QK, BT, kNoTri, nullptr, 0, kLowerC);
    if (t0 + BT < seq.eos) {  // the next chunk's token rows
      const int64_t Ln = std::min(BT, seq.eos - t0 - BT);
      prefetch_rows(p.k, seq.b, t0 + BT, Ln, h, K);
      prefetch_rows(p.q, seq.b, t0 + BT, Ln, h, K);
      for (int64_t j = 0; j < ng; ++j) prefetch_rows(p.v, seq.b, t0 + BT, Ln, hv0 + j, V);
    }
    for (int64_t j = 0; j < ng; ++j) {
      const int64_t hv = hv0 + j;
      float* S = s.S + j * KV;
      chunk_load_hv(p, s, seq.b, t0, L, hv, false);
      chunk_inverse(s);
      const float elast = s.E[BT - 1];
      // The products with S, the row scalings in their epilogues (no scaled copies of K, V, Q):
      //   X = diag(-beta E) K S + diag(beta) V (in Vb);  O = diag(scale E) Q S (in dO)
      // Vn = U - W S = A (diag(beta) V - diag(beta E) K S) = A X: W = A Kb is never formed. (One stacked
      // [K; Q] S call instead of the two ran at the same speed, session 12.)
      for (int64_t i = 0; i < BT; ++i) {
        s.ra[i] = -s.beta[i] * s.E[i];
        s.rb[i] = s.beta[i];
        s.ra[BT + i] = p.scale * s.E[i];
      }
      mm(false, false, BT, V, K, 1.f, s.Kc, K, S, ldS, 0.f, s.Vb, V, kNoTri, s.Vc, V, kNoTri, s.ra, s.rb);
      mm(false, false, BT, V, K, 1.f, s.Q, K, S, ldS, 0.f, s.dO, V, kNoTri, nullptr, 0, kNoTri, s.ra + BT);
      mm(false, false, BT, V, BT, 1.f, s.Ai, BT, s.Vb, V, 0.f, s.Vn, V, GemmTri::kLower);
      // O += (scale Lower(Q K^T Gamma)) Vn
      mask_lower_gamma_from(s.QK, s.Aqk, s.Gm, p.scale);
      mm(false, false, BT, V, BT, 1.f, s.Aqk, BT, s.Vn, V, 1.f, s.dO, V, GemmTri::kLower);
      for (int64_t i = 0; i < L; ++i)
        store_row_stream(p.o, seq.b * p.o.st[0] + (t0 + i) * p.o.st[1] + hv * p.o.st[2], s.dO + i * V, V);
      // S = e^{gamma_last} S + K^T diag(eL) Vn
      scale_rows(s.eL, s.Vn, s.TV, V);
      mm(true, false, K, V, BT, 1.f, s.Kc, K, s.TV, V, elast, S, ldS);
    }
  }
  if (p.ht.present())
    for (int64_t j = 0; j < ng; ++j)
      for (int64_t i = 0; i < K; ++i)
        store_row(p.ht, n * p.ht.st[0] + (hv0 + j) * p.ht.st[1] + i * p.ht.st[2], s.S + j * KV + i * ldS, V);
  ::hwy::FlushStream();  // the o rows' non-temporal stores are visible before the task is done
}

// ---- backward ----

// One (n, group of value heads hv0 ..): forward states into hs ([chunk, K, V] at row stride state_ld(V) per value
// head, stride hs_stride between chunks), then the reverse sweep. dq/dk: when `summed` (the group is all G value
// heads of the q/k head) summed over the group per chunk (value head 0 stores, the others add, in increasing hv:
// the order of the separate pass in ChunkedBwd), taken through the l2norm backward and stored; else per value
// head into dqh/dkh ([HV, B, T, K] f32: head-major, so that one task writes contiguous rows instead of one
// 512-byte row per 4 KiB page) for that pass.
// wy ([chunk, P | A | W | Vn] with stride wy_stride between chunks) keeps the WY factors of the state pass so
// the reverse sweep does not re-compute them (every chunk but the last; the last is done once, in reverse).
size_t wy_floats(const GdnParams& p) { return static_cast<size_t>(2 * BT * BT + BT * (p.K + p.V)); }
void bwd_task(const GdnParams& p, const Gemm& mm, Scratch& s, int64_t n, int64_t hv0, int64_t ng, float* hs,
              int64_t hs_stride, float* wy, int64_t wy_stride, float* dqh, float* dkh, bool summed) {
  const int64_t K = p.K, V = p.V, ldS = state_ld(V), ldT = state_ld(K), KV = K * ldS, h = hv0 / (p.HV / p.H);
  const GdnSeq seq = gdn_seq(p, n);
  const int64_t nc = (seq.eos - seq.bos + BT - 1) / BT;
  // Value heads hv0 + j (j < ng) of q/k head h, chunk by chunk as in fwd_task: the q/k part of a chunk (Q, K, K^T,
  // K K^T, Q K^T) once, then each value head with its own states (hs + j K V per chunk) and dS (s.S + j K V);
  // the per-value-head arithmetic is the same as alone. forward: state at the start of every chunk
  if (nc > 0)
    for (int64_t j = 0; j < ng; ++j)
      for (int64_t i = 0; i < K; ++i) {
        float* S = hs + j * KV;
        if (p.h0.present())
          load_row(p.h0, n * p.h0.st[0] + (hv0 + j) * p.h0.st[1] + i * p.h0.st[2], S + i * ldS, V);
        else
          std::memset(S + i * ldS, 0, sizeof(float) * V);
      }
  // The WY factors of chunk c are computed in place in its `keep` blocks (the scratch's P, Ai, W, Vn point
  // there), and read from there by the reverse sweep: no copies. P = K K^T does not depend on the value head:
  // it is kept once per chunk, in the group's first block.
  float *const own_P = s.P, *const own_Ai = s.Ai, *const own_W = s.W, *const own_Vn = s.Vn;
  auto use_keep = [&](int64_t c, int64_t j) {
    float* keep = wy + c * wy_stride + j * static_cast<int64_t>(wy_floats(p));
    s.P = wy + c * wy_stride;
    s.Ai = keep + BT * BT;
    s.W = keep + 2 * BT * BT;
    s.Vn = keep + 2 * BT * BT + BT * K;
  };
  auto use_own = [&] {
    s.P = own_P;
    s.Ai = own_Ai;
    s.W = own_W;
    s.Vn = own_Vn;
  };
  for (int64_t c = 0; c + 1 < nc; ++c) {
    const int64_t t0 = seq.bos + c * BT;
    chunk_load_qk(p, mm, s, seq.b, t0, BT, h, false);
    use_keep(c, 0);
    chunk_kkt(p, mm, s);
    if (c + 2 < nc) {  // the state pass's next chunk
      prefetch_rows(p.k, seq.b, t0 + BT, BT, h, K);
      for (int64_t j = 0; j < ng; ++j) prefetch_rows(p.v, seq.b, t0 + BT, BT, hv0 + j, V);
    }
    for (int64_t j = 0; j < ng; ++j) {
      use_keep(c, j);
      chunk_load_hv(p, s, seq.b, t0, BT, hv0 + j);
      chunk_solve_wy(p, mm, s);
      const float elast = s.E[BT - 1];
      const float* Sc = hs + c * hs_stride + j * KV;
      float* Sn = hs + (c + 1) * hs_stride + j * KV;
      mm(false, false, BT, V, K, -1.f, s.W, K, Sc, ldS, 1.f, s.Vn, V);
      scale_rows(s.eL, s.Vn, s.TV, V);
      mm(true, false, K, V, BT, 1.f, s.Kc, K, s.TV, V, elast, Sn, ldS, GemmTri::kNone, Sc, ldS);  // Sn = e^gL Sc + ...
    }
  }
  use_own();
  // reverse sweep
  for (int64_t j = 0; j < ng; ++j)
    for (int64_t i = 0; i < K; ++i) {
      float* dS = s.S + j * KV;
      if (p.dht.present())
        load_row(p.dht, n * p.dht.st[0] + (hv0 + j) * p.dht.st[1] + i * p.dht.st[2], dS + i * ldS, V);
      else
        std::memset(dS + i * ldS, 0, sizeof(float) * V);
    }
  for (int64_t c = nc - 1; c >= 0; --c) {
    const int64_t t0 = seq.bos + c * BT, L = std::min(BT, seq.eos - t0);
    const bool last = c + 1 == nc;
    chunk_load_qk(p, mm, s, seq.b, t0, L, h, true);
    mm(false, false, BT, BT, K, 1.f, s.Q, K, s.KT, BT, 0.f, s.QK, BT, kNoTri, nullptr, 0, kLowerC);
    if (last) {
      use_own();
      chunk_kkt(p, mm, s);  // the last chunk's factors were not kept: P into the own block, for every j
    }
    // K^T (in KT) is not read past this point: the value-head loop below overwrites KT with Kb^T.
    if (c > 0) {  // the reverse sweep's next chunk
      prefetch_rows(p.k, seq.b, t0 - BT, BT, h, K);
      prefetch_rows(p.q, seq.b, t0 - BT, BT, h, K);
      for (int64_t j = 0; j < ng; ++j) {
        prefetch_rows(p.v, seq.b, t0 - BT, BT, hv0 + j, V);
        prefetch_rows(p.do_, seq.b, t0 - BT, BT, hv0 + j, V);
      }
    }
    for (int64_t j = 0; j < ng; ++j) {
      const int64_t hv = hv0 + j;
      const float* Sc = hs + c * hs_stride + j * KV;
      float* dS = s.S + j * KV;
      chunk_load_hv(p, s, seq.b, t0, L, hv);
      const float elast = s.E[BT - 1];
      if (!last) {  // WY factors and Vn kept by the state pass (read in place)
        use_keep(c, j);
        build_m(s);
      } else {
        chunk_solve_wy(p, mm, s);
        mm(false, false, BT, V, K, -1.f, s.W, K, Sc, ldS, 1.f, s.Vn, V);  // Vn = U - W S
      }
      std::memset(s.dO, 0, sizeof(float) * BT * V);
      for (int64_t i = 0; i < L; ++i)
        load_row(p.do_, seq.b * p.do_.st[0] + (t0 + i) * p.do_.st[1] + hv * p.do_.st[2], s.dO + i * V, V);
      // dVn = (scale Lower(Q K^T Gamma))^T dO + diag(eL) K dS (the row scalings diag(eL), diag(scale E) below
      // are the products' epilogue scales: the same single multiply per element as a separate pass, same bits)
      mask_lower_gamma_from(s.QK, s.Aqk, s.Gm, p.scale);
      mm(false, false, BT, V, K, 1.f, s.Kc, K, dS, ldS, 0.f, s.dVn, V, kNoTri, nullptr, 0, kNoTri, s.eL);
      mm(true, false, BT, V, BT, 1.f, s.Aqk, BT, s.dO, V, 1.f, s.dVn, V, GemmTri::kUpper);  // Aqk^T: upper
      // Ds = scale Lower(dO Vn^T Gamma); dQ = scale diag(E) dO S^T + Ds K
      mm.transpose(s.Vn, V, BT, V, s.VT, BT);
      mm(false, false, BT, BT, V, 1.f, s.dO, V, s.VT, BT, 0.f, s.Ds, BT, kNoTri, nullptr, 0, kLowerC);
      mask_lower_gamma(s.Ds, s.Gm, p.scale);
      mm.transpose(Sc, ldS, K, V, s.ST, ldT);  // ST [V, K]
      for (int64_t i = 0; i < BT; ++i) s.ra[i] = p.scale * s.E[i];
      mm(false, false, BT, K, V, 1.f, s.dO, V, s.ST, ldT, 0.f, s.dQ, K, kNoTri, nullptr, 0, kNoTri, s.ra);
      mm(false, false, BT, K, BT, 1.f, s.Ds, BT, s.Kc, K, 1.f, s.dQ, K, GemmTri::kLower);
      // dK_int = diag(eL) Vn dS^T; dK = dK_int + Ds^T Q
      mm.transpose(dS, ldS, K, V, s.dST, ldT);  // dST [V, K]
      mm(false, false, BT, K, V, 1.f, s.Vn, V, s.dST, ldT, 0.f, s.dK, K, kNoTri, nullptr, 0, kNoTri, s.eL);
      float kdk_int = 0.f;
      for (int64_t i = 0; i < BT; ++i) kdk_int += dot(s.Kc + i * K, s.dK + i * K, K);
      mm(true, false, BT, K, BT, 1.f, s.Ds, BT, s.Q, K, 1.f, s.dK, K, GemmTri::kUpper);  // Ds^T: upper
      // dgamma = q.dQ - k.dK; the last valid row also gets e^{gamma_last} <S, dS> + sum k.dK_int
      for (int64_t i = 0; i < BT; ++i)
        s.dgam[i] = dot(s.Q + i * K, s.dQ + i * K, K) - dot(s.Kc + i * K, s.dK + i * K, K);
      float sds = 0.f;  // <S, dS>, row by row in increasing order
      for (int64_t i = 0; i < K; ++i) sds += dot(Sc + i * ldS, dS + i * ldS, V);
      s.dgam[L - 1] += elast * sds + kdk_int;
      // dS <- e^{gamma_last} dS + scale (E Q)^T dO - W^T dVn
      scale_rows(s.E, s.Q, s.TK, K);
      mm(true, false, K, V, BT, p.scale, s.TK, K, s.dO, V, elast, dS, ldS);
      mm(true, false, K, V, BT, -1.f, s.W, K, s.dVn, V, 1.f, dS, ldS);
      // dW = -dVn S^T; X = A^T dW (into TK); Y = A^T dVn (into TV)
      mm(false, false, BT, K, V, -1.f, s.dVn, V, s.ST, ldT, 0.f, s.dW, K);
      mm(true, false, BT, K, BT, 1.f, s.Ai, BT, s.dW, K, 0.f, s.TK, K, GemmTri::kUpper);  // A^T: upper
      mm(true, false, BT, V, BT, 1.f, s.Ai, BT, s.dVn, V, 0.f, s.TV, V, GemmTri::kUpper);
      for (int64_t i = 0; i < BT; ++i) {
        const float xk = dot(s.TK + i * K, s.Kc + i * K, K);
        s.dbeta[i] = s.E[i] * xk + dot(s.TV + i * V, s.Vc + i * V, V);
        s.dgam[i] += s.beta[i] * s.E[i] * xk;
        const float be = s.beta[i] * s.E[i];
        for (int64_t d = 0; d < K; ++d) s.dK[i * K + d] += be * s.TK[i * K + d];
        for (int64_t d = 0; d < V; ++d) s.TV[i * V + d] *= s.beta[i];  // dv = diag(beta) Y
      }
      // dA = StrictLower(dW Kb^T + dVn Vb^T); dM = -StrictLower(A^T dA A^T) (computed transposed, below)
      mm.transpose(s.Kb, K, BT, K, s.KT, BT);  // KT, VT now hold Kb^T, Vb^T
      mm.transpose(s.Vb, V, BT, V, s.VT, BT);
      mm(false, false, BT, BT, K, 1.f, s.dW, K, s.KT, BT, 0.f, s.dA, BT, kNoTri, nullptr, 0, kLowerC);
      mm(false, false, BT, BT, V, 1.f, s.dVn, V, s.VT, BT, 1.f, s.dA, BT, kNoTri, nullptr, 0, kLowerC);
      for (int64_t i = 0; i < BT; ++i)
        for (int64_t j = i; j < BT; ++j) s.dA[i * BT + j] = 0.f;
      // dM^T = -A dA^T A as X = dA^T A (dA^T strictly upper), dM^T = -A X (A lower): both triangular, and no
      // transposed right operand to pack (dM = -A^T dA A^T would need A^T)
      mm(true, false, BT, BT, BT, 1.f, s.dA, BT, s.Ai, BT, 0.f, s.TL, BT, GemmTri::kUpper);
      mm(false, false, BT, BT, BT, -1.f, s.Ai, BT, s.TL, BT, 0.f, s.dA, BT, GemmTri::kLower);  // dA now holds dM^T
      // dP = dM Gamma (strict lower); R = diag(beta) dP; dK += (R + R^T) K; dbeta += rowsum(dP (.) K K^T);
      // dgamma_i += sum_j dM_ij M_ij, dgamma_j -= the same
      for (int64_t i = 0; i < BT; ++i)
        for (int64_t j = 0; j < BT; ++j) {
          if (j < i) {
            const float dm = s.dA[j * BT + i];  // dM_ij
            const float dp = dm * s.Gm[i * BT + j];
            s.dbeta[i] += dp * s.P[i * BT + j];
            const float dmm = dm * s.M[i * BT + j];
            s.dgam[i] += dmm;
            s.dgam[j] -= dmm;
            s.TL[i * BT + j] = s.beta[i] * dp;
          } else {
            s.TL[i * BT + j] = 0.f;
          }
        }
      for (int64_t i = 0; i < BT; ++i)
        for (int64_t j = 0; j < i; ++j) s.TL[j * BT + i] = s.TL[i * BT + j];  // R + R^T (R strictly lower)
      mm(false, false, BT, K, BT, 1.f, s.TL, BT, s.Kc, K, 1.f, s.dK, K);
      // dg = reverse cumsum of dgamma inside the chunk; stores
      float acc = 0.f;
      for (int64_t i = L - 1; i >= 0; --i) {
        acc += s.dgam[i];
        s.dgam[i] = acc;
      }
      for (int64_t i = 0; i < L; ++i) {
        const int64_t t = t0 + i;
        if (summed) {
          float *q = s.dQs + i * K, *k = s.dKs + i * K;
          const float *sq = s.dQ + i * K, *sk = s.dK + i * K;
          if (j == 0) {
            std::memcpy(q, sq, sizeof(float) * K);
            std::memcpy(k, sk, sizeof(float) * K);
          } else {
            for (int64_t d = 0; d < K; ++d) q[d] += sq[d];
            for (int64_t d = 0; d < K; ++d) k[d] += sk[d];
          }
        } else {
          const int64_t tok = (hv * p.B + seq.b) * p.T + t;
          if (!stream_f32(dqh + tok * K, s.dQ + i * K, K)) std::memcpy(dqh + tok * K, s.dQ + i * K, sizeof(float) * K);
          if (!stream_f32(dkh + tok * K, s.dK + i * K, K)) std::memcpy(dkh + tok * K, s.dK + i * K, sizeof(float) * K);
        }
        store_row_stream(p.dv, seq.b * p.dv.st[0] + t * p.dv.st[1] + hv * p.dv.st[2], s.TV + i * V, V);
        store1(p.dbeta, seq.b * p.dbeta.st[0] + t * p.dbeta.st[1] + hv * p.dbeta.st[2], s.dbeta[i]);
        store1(p.dg, seq.b * p.dg.st[0] + t * p.dg.st[1] + hv * p.dg.st[2], s.dgam[i]);
      }
    }  // value heads
    if (summed)  // dq, dk of the chunk's rows are complete: the l2norm backward (y = the loaded Q, K rows) and store
      for (int64_t i = 0; i < L; ++i) {
        const int64_t t = t0 + i;
        float *dq = s.dQs + i * K, *dk = s.dKs + i * K;
        if (p.l2norm) {
          l2norm_bwd(s.Q + i * K, s.rq[i], dq, K);
          l2norm_bwd(s.Kc + i * K, s.rk[i], dk, K);
        }
        store_row(p.dq, seq.b * p.dq.st[0] + t * p.dq.st[1] + h * p.dq.st[2], dq, K);
        store_row(p.dk, seq.b * p.dk.st[0] + t * p.dk.st[1] + h * p.dk.st[2], dk, K);
      }
  }
  use_own();  // the scratch serves the thread's next task
  if (p.dh0.present())
    for (int64_t j = 0; j < ng; ++j)
      for (int64_t i = 0; i < K; ++i)
        store_row(p.dh0, n * p.dh0.st[0] + (hv0 + j) * p.dh0.st[1] + i * p.dh0.st[2], s.S + j * KV + i * ldS, V);
  ::hwy::FlushStream();  // the non-temporal stores of dq, dk (workspace) and dv are visible before the task is done
}

size_t slot_bytes(const GdnParams& p) { return align_up(Scratch::floats(p) * sizeof(float)); }

size_t slots_bytes(const GdnParams& p) { return slot_bytes(p) * static_cast<size_t>(std::max(1, p.slots)); }

}  // namespace

// Layout: scratch slots.
size_t FwdWorkspace(const GdnParams& p) { return slots_bytes(p); }

// Layout: chunk offsets int64 [N + 1] | start states f32 [max chunks, HV, K, state_ld(V)] | WY factors of the
// state pass f32 [max chunks, HV, 2 BT^2 + BT (K + V)] | dq, dk per value head f32 [HV, B, T, K] each (written
// only when a task does not hold all G value heads) | scratch slots.
size_t BwdWorkspace(const GdnParams& p) {
  return align_up(sizeof(int64_t) * static_cast<size_t>(p.N + 1)) +
         align_up(sizeof(float) * static_cast<size_t>(max_chunks(p) * p.HV * p.K * state_ld(p.V))) +
         align_up(sizeof(float) * static_cast<size_t>(max_chunks(p) * p.HV) * wy_floats(p)) +
         2 * align_up(sizeof(float) * static_cast<size_t>(p.B * p.T * p.HV * p.K)) + slots_bytes(p);
}

void ChunkedFwd(const GdnParams& p0, int64_t hwy_target, void* workspace) {
  const Gemm mm{tile::gemm_f32_for(hwy_target), tile::transpose_f32_for(hwy_target)};
  // q, k are l2-normalised row by row as the chunks load them (chunk_load_qk): with the value heads of a q/k head
  // in one task, each row once per task, and no pass over normalised copies.
  char* w = static_cast<char*>(workspace);
  const GdnParams& p = p0;
  const int64_t G = p.HV / p.H, gs = task_group(p), per_h = (G + gs - 1) / gs;
  for_tasks(p, p.N * p.H * per_h, w, slot_bytes(p), [&](int64_t task, Scratch& s) {
    const int64_t n = task / (p.H * per_h), h = task / per_h % p.H, j0 = task % per_h * gs;
    fwd_task(p, mm, s, n, h * G + j0, std::min(gs, G - j0));
  });
}

void ChunkedBwd(const GdnParams& p, int64_t hwy_target, void* workspace) {
  const Gemm mm{tile::gemm_f32_for(hwy_target), tile::transpose_f32_for(hwy_target)};
  char* w = static_cast<char*>(workspace);
  int64_t* coff = reinterpret_cast<int64_t*>(w);
  w += align_up(sizeof(int64_t) * static_cast<size_t>(p.N + 1));
  float* hs = reinterpret_cast<float*>(w);
  w += align_up(sizeof(float) * static_cast<size_t>(max_chunks(p) * p.HV * p.K * state_ld(p.V)));
  float* wy = reinterpret_cast<float*>(w);
  w += align_up(sizeof(float) * static_cast<size_t>(max_chunks(p) * p.HV) * wy_floats(p));
  float* dqh = reinterpret_cast<float*>(w);
  w += align_up(sizeof(float) * static_cast<size_t>(p.B * p.T * p.HV * p.K));
  float* dkh = reinterpret_cast<float*>(w);
  w += align_up(sizeof(float) * static_cast<size_t>(p.B * p.T * p.HV * p.K));
  chunk_offsets(p, coff);
  // q, k are l2-normalised row by row as the chunks load them (chunk_load_qk), as in the forward.
  const int64_t KV = p.K * state_ld(p.V);  // one stored state [K, V] at row stride state_ld(V)
  const int64_t G = p.HV / p.H, gs = task_group(p), per_h = (G + gs - 1) / gs;
  const bool summed = gs == G;  // tasks hold whole groups: they sum dq, dk over the group and finish them
  for_tasks(p, p.N * p.H * per_h, w, slot_bytes(p), [&](int64_t task, Scratch& s) {
    const int64_t n = task / (p.H * per_h), j0 = task % per_h * gs, hv = task / per_h % p.H * G + j0;
    const int64_t wyf = static_cast<int64_t>(wy_floats(p));
    bwd_task(p, mm, s, n, hv, std::min(gs, G - j0), hs + (coff[n] * p.HV + hv) * KV, p.HV * KV,
             wy + (coff[n] * p.HV + hv) * wyf, p.HV * wyf, dqh, dkh, summed);
  });
  if (summed) return;
  // Split groups: dq, dk summed over the G value heads of each q/k head (increasing hv), then the l2norm
  // backward with y and rstd re-computed from the q / k row exactly as chunk_load_qk does (same bits as the
  // tasks that finish their own rows), then stored.
  const int64_t K = p.K, rows = p.B * p.T * p.H;
  for_tasks(p, (rows + 63) / 64, w, slot_bytes(p), [&](int64_t blk, Scratch& s) {
    for (int64_t r = blk * 64; r < std::min(rows, blk * 64 + 64); ++r) {
      const int64_t h = r % p.H, bt = r / p.H, b = bt / p.T, t = bt % p.T;
      for (int which = 0; which < 2; ++which) {
        float* dy = s.TK;
        const float* src = which == 0 ? dqh : dkh;
        const int64_t head_stride = p.B * p.T * K;  // dqh/dkh are [HV, B, T, K]
        const float* x0 = src + h * G * head_stride + bt * K;
        for (int64_t d = 0; d < K; ++d) dy[d] = x0[d];
        for (int64_t j = 1; j < G; ++j) {
          const float* x = x0 + j * head_stride;
          for (int64_t d = 0; d < K; ++d) dy[d] += x[d];
        }
        const GdnTensor& X = which == 0 ? p.q : p.k;
        const GdnTensor& dX = which == 0 ? p.dq : p.dk;
        if (p.l2norm) {
          float* y = s.Q;
          load_qk(p, X, b, t, h, y);
          const float rstd = l2normalise(y, K);
          l2norm_bwd(y, rstd, dy, K);
        }
        store_row(dX, b * dX.st[0] + t * dX.st[1] + h * dX.st[2], dy, K);
      }
    }
  });
}

}  // namespace strata::linear_attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::linear_attn {
HWY_EXPORT(ChunkedFwd);
HWY_EXPORT(ChunkedBwd);
HWY_EXPORT(FwdWorkspace);
HWY_EXPORT(BwdWorkspace);

bool gdn_cpu_chunked_available(int64_t hwy_target) {
  return STRATA_HWY_FOR_TARGET(ChunkedFwd, hwy_target) && tile::gemm_f32_for(hwy_target) &&
         tile::transpose_f32_for(hwy_target);
}
// The layouts do not depend on the target: any compiled one answers.
size_t gdn_cpu_fwd_workspace(const GdnParams& p) { return HWY_STATIC_DISPATCH(FwdWorkspace)(p); }
size_t gdn_cpu_bwd_workspace(const GdnParams& p) { return HWY_STATIC_DISPATCH(BwdWorkspace)(p); }
void gdn_cpu_chunked_fwd(const GdnParams& p, int64_t hwy_target, void* workspace) {
  STRATA_HWY_FOR_TARGET(ChunkedFwd, hwy_target)(p, hwy_target, workspace);
}
void gdn_cpu_chunked_bwd(const GdnParams& p, int64_t hwy_target, void* workspace) {
  STRATA_HWY_FOR_TARGET(ChunkedBwd, hwy_target)(p, hwy_target, workspace);
}
}  // namespace strata::linear_attn
#endif  // HWY_ONCE
