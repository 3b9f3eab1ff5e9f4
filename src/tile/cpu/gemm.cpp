// Register-blocked fp32 GEMM micro-kernel written once with Highway (see gemm.h). The C tile is MR rows by
// NV vectors; per k step it loads NV vectors of a B row, broadcasts MR elements of A and issues MR*NV FMAs
// into accumulators that stay in registers. NV = 4 on AVX-512 (32 vector registers: 16 accumulators),
// 2 elsewhere (16 registers). B^T is packed once into a row-major K x N panel so the inner loop always reads
// contiguous B rows (a blocked transpose: both sides stay in L1); A^T needs no packing (its elements are
// broadcast one at a time). A triangular op(A) (gemm.h) shortens each row tile's k range.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tile/cpu/gemm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tile/cpu/gemm.h"
#include "tile/cpu/isa.h"

HWY_BEFORE_NAMESPACE();
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kMR = 6;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3_ZEN4
constexpr int kNV = 4;
#else
constexpr int kNV = 2;
#endif

// k range [k0, k1) that rows [i0, i1) of op(A) can have non-zero (all of [0, K) unless triangular).
HWY_INLINE void KRange(const GemmF32Args& g, int64_t i0, int64_t i1, int64_t& k0, int64_t& k1) {
  k0 = 0;
  k1 = g.K;
  if (g.tri_a == GemmTri::kLower) k1 = std::min(g.K, i1);
  if (g.tri_a == GemmTri::kUpper) k0 = std::min(g.K, i0);
}

// One R x (NV * lanes) tile (R <= MR, NV <= kNV: the bottom edge, narrow or triangular panels instantiate
// fewer). A's layout is a template parameter so the inner loop has no branch; every loop over registers is
// fully unrolled. Each element's sum runs over k in increasing order whatever R and NV are.
template <int R, int NV, bool kTransA>
HWY_INLINE void Tile(const GemmF32Args& g, const float* HWY_RESTRICT B, int64_t ldb, int64_t i0, int64_t j0) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const float* HWY_RESTRICT A = g.A;
  const int64_t lda = g.lda;
  int64_t k_begin, K;
  KRange(g, i0, i0 + R, k_begin, K);
  // A(i0 + r, k): row-major M x K, or stored K x M when transposed.
  const int64_t a_row = kTransA ? 1 : lda, a_k = kTransA ? lda : 1;
  const float* HWY_RESTRICT a0 = A + i0 * a_row;
  hn::Vec<decltype(d)> acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  const float* HWY_RESTRICT brow = B + k_begin * ldb + j0;
  for (int64_t k = k_begin; k < K; ++k, brow += ldb) {
    hn::Vec<decltype(d)> b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = hn::LoadU(d, brow + v * L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const auto va = hn::Set(d, a0[r * a_row + k * a_k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(va, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float alpha = g.row_alpha ? g.row_alpha[i0 + r] : g.alpha, beta = g.row_beta ? g.row_beta[i0 + r] : g.beta;
    const auto valpha = hn::Set(d, alpha), vbeta = hn::Set(d, beta);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* c = g.C + (i0 + r) * g.ldc + j0 + v * L;
      auto out = hn::Mul(valpha, acc[r][v]);
      if (beta != 0.f) out = hn::MulAdd(vbeta, hn::LoadU(d, g.C_in ? g.C_in + (i0 + r) * g.ldc_in + j0 + v * L : c), out);
      hn::StoreU(out, d, c);
    }
  }
}

template <int R, bool kTransA>
HWY_INLINE void TileNV(const GemmF32Args& g, const float* B, int64_t ldb, int64_t i0, int64_t j0, int64_t nv) {
  switch (nv) {
    case 1: Tile<R, 1, kTransA>(g, B, ldb, i0, j0); break;
    case 2: Tile<R, 2, kTransA>(g, B, ldb, i0, j0); break;
    case 3: if constexpr (kNV >= 3) Tile<R, (kNV >= 3 ? 3 : 1), kTransA>(g, B, ldb, i0, j0); break;
    case 4: if constexpr (kNV >= 4) Tile<R, (kNV >= 4 ? 4 : 1), kTransA>(g, B, ldb, i0, j0); break;
    default: break;
  }
}

// Columns [0, n_vec) (whole vectors) in panels of up to NR = kNV vectors, rows in tiles of MR. With a lower
// triangular C only the vectors that reach column i1 - 1 of a row tile [i0, i1) are computed.
template <bool kTransA>
HWY_INLINE void Panels(const GemmF32Args& g, const float* B, int64_t ldb, int64_t n_vec, int64_t L) {
  const int64_t NR = kNV * L;
  for (int64_t j0 = 0; j0 < n_vec; j0 += NR) {
    const int64_t width = std::min(NR, n_vec - j0);
    for (int64_t i0 = 0; i0 < g.M; i0 += kMR) {
      const int64_t R = std::min<int64_t>(kMR, g.M - i0);
      int64_t w = width;
      if (g.tri_c == GemmTri::kLower) {
        if (i0 + R <= j0) continue;  // no column of this panel is on or below the diagonal of these rows
        w = std::min(width, (i0 + R - j0 + L - 1) / L * L);
      }
      const int64_t nv = w / L;
      // The last M % MR rows as one tile (e.g. rows 60..63 of a 64-row chunk: one 4-row tile keeps 16
      // accumulators in flight instead of four latency-bound 1-row passes). Same per-element k order.
      switch (R) {
        case 6: TileNV<6, kTransA>(g, B, ldb, i0, j0, nv); break;
        case 5: TileNV<5, kTransA>(g, B, ldb, i0, j0, nv); break;
        case 4: TileNV<4, kTransA>(g, B, ldb, i0, j0, nv); break;
        case 3: TileNV<3, kTransA>(g, B, ldb, i0, j0, nv); break;
        case 2: TileNV<2, kTransA>(g, B, ldb, i0, j0, nv); break;
        case 1: TileNV<1, kTransA>(g, B, ldb, i0, j0, nv); break;
        default: break;
      }
    }
  }
}

// Columns past the last whole vector (N % lanes of them): plain loops in the same k order.
HWY_INLINE void EdgeColumns(const GemmF32Args& g, const float* B, int64_t ldb, int64_t j0) {
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = j0; j < (g.tri_c == GemmTri::kLower ? std::min(g.N, i + 1) : g.N); ++j) {
      float s = 0.f;
      int64_t k0, k1;
      KRange(g, i, i + 1, k0, k1);
      for (int64_t k = k0; k < k1; ++k) {
        const float a = g.trans_a ? g.A[k * g.lda + i] : g.A[i * g.lda + k];
        s = std::fma(a, B[k * ldb + j], s);
      }
      float* c = g.C + i * g.ldc + j;
      const float alpha = g.row_alpha ? g.row_alpha[i] : g.alpha, beta = g.row_beta ? g.row_beta[i] : g.beta;
      const float cin = beta != 0.f ? (g.C_in ? g.C_in[i * g.ldc_in + j] : *c) : 0.f;
      *c = beta != 0.f ? alpha * s + beta * cin : alpha * s;
    }
}

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: 4 x 4 blocks transposed in 128-bit registers
// (4 loads, 8 shuffles, 4 stores per 16 elements), scalar edges. Column strips of 16 (one source line wide) go
// down all rows: with power-of-two strides (ldd = 128 floats) a row-major sweep would write 128 destination
// lines that share 8 cache sets and miss on every store; a strip writes 16 destination rows, spread over all sets.
void TransposeF32(const float* HWY_RESTRICT src, int64_t lds, int64_t rows, int64_t cols, float* HWY_RESTRICT dst,
                  int64_t ldd) {
  constexpr int64_t kStrip = 16;
  for (int64_t cs = 0; cs < cols; cs += kStrip) {
    const int64_t ce = std::min(cols, cs + kStrip);
    int64_t r0 = 0;
#if HWY_TARGET != HWY_SCALAR
    const hn::Full128<float> d4;
    for (; r0 + 4 <= rows; r0 += 4) {
      const float* s = src + r0 * lds;
      int64_t c0 = cs;
      for (; c0 + 4 <= ce; c0 += 4) {
        const auto a0 = hn::LoadU(d4, s + c0), a1 = hn::LoadU(d4, s + lds + c0);
        const auto a2 = hn::LoadU(d4, s + 2 * lds + c0), a3 = hn::LoadU(d4, s + 3 * lds + c0);
        const auto t0 = hn::InterleaveLower(d4, a0, a1), t1 = hn::InterleaveLower(d4, a2, a3);  // a0[0] a1[0] a0[1] a1[1]
        const auto t2 = hn::InterleaveUpper(d4, a0, a1), t3 = hn::InterleaveUpper(d4, a2, a3);  // a0[2] a1[2] a0[3] a1[3]
        float* o = dst + c0 * ldd + r0;
        hn::StoreU(hn::ConcatLowerLower(d4, t1, t0), d4, o);  // column c0: a0[0] a1[0] a2[0] a3[0]
        hn::StoreU(hn::ConcatUpperUpper(d4, t1, t0), d4, o + ldd);
        hn::StoreU(hn::ConcatLowerLower(d4, t3, t2), d4, o + 2 * ldd);
        hn::StoreU(hn::ConcatUpperUpper(d4, t3, t2), d4, o + 3 * ldd);
      }
      for (; c0 < ce; ++c0)
        for (int64_t r = r0; r < r0 + 4; ++r) dst[c0 * ldd + r] = src[r * lds + c0];
    }
#endif
    for (; r0 < rows; ++r0)
      for (int64_t c = cs; c < ce; ++c) dst[c * ldd + r0] = src[r0 * lds + c];
  }
}

void GemmF32(const GemmF32Args& g) {
  if (g.M <= 0 || g.N <= 0) return;
  const float* B = g.B;
  int64_t ldb = g.ldb;
  thread_local std::vector<float> panel;
  if (g.trans_b) {  // pack B^T (stored N x K) into a K x N row-major panel
    if (panel.size() < static_cast<size_t>(g.K * g.N)) panel.resize(static_cast<size_t>(g.K * g.N));
    TransposeF32(g.B, g.ldb, g.N, g.K, panel.data(), g.N);
    B = panel.data();
    ldb = g.N;
  }
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t n_vec = g.N / L * L;
  if (g.trans_a)
    Panels<true>(g, B, ldb, n_vec, L);
  else
    Panels<false>(g, B, ldb, n_vec, L);
  if (n_vec < g.N) EdgeColumns(g, B, ldb, n_vec);
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::tile {
HWY_EXPORT(GemmF32);
HWY_EXPORT(TransposeF32);

GemmF32Fn gemm_f32_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(GemmF32, hwy_target); }
void gemm_f32(const GemmF32Args& args) { HWY_DYNAMIC_DISPATCH(GemmF32)(args); }
TransposeF32Fn transpose_f32_for(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(TransposeF32, hwy_target); }
}  // namespace strata::tile
#endif
