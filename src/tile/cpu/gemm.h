// Small fp32 GEMM for the 16..256-sized blocks of chunked linear attention (64x64-class tiles):
//   C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C
// Row-major operands with leading dimensions; op(X) = X or X^T. Large plain GEMMs go to oneDNN/cuBLAS
// (ARCHITECTURE.md §4); this one is for fused per-chunk math, called from inside an op's own OpenMP loop, so it
// is single-threaded. Each C element is accumulated over k in increasing order with a blocking fixed by the
// shape: results are deterministic. beta == 0 does not read C (it may hold NaN).
//
// Triangular A (the chunk matrices of the WY form: A = (I + M)^-1, masked Q K^T, their transposes): with
// `tri_a` set, the caller promises that op(A)(i, k) == 0 outside the triangle, and the kernel skips, per tile of
// rows [i0, i1), the k range that is zero for every row of the tile (lower: k >= i1; upper: k < i0). Stored
// zeros must still be there (a tile reads the part of the triangle that its own rows cross). About half the
// FLOPs of a 64 x 64 triangular factor, same blocking for a given shape (deterministic). `tri_c` (below) skips the
// vectors of C above the diagonal.
#pragma once

#include <cstdint>

namespace strata::tile {

enum class GemmTri : int8_t { kNone = 0, kLower = 1, kUpper = 2 };

struct GemmF32Args {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.f;
  const float* A = nullptr;
  int64_t lda = 0;  // row stride of A as stored (M x K, or K x M when trans_a)
  const float* B = nullptr;
  int64_t ldb = 0;  // row stride of B as stored (K x N, or N x K when trans_b)
  float beta = 0.f;
  float* C = nullptr;
  int64_t ldc = 0;
  // The beta term's input: C = alpha op(A) op(B) + beta C_in (nullptr: C_in = C, in place). Lets a caller write
  // S_next = e^g S + K^T X into a new buffer without first copying S there. C_in may equal C, no other overlap.
  const float* C_in = nullptr;
  int64_t ldc_in = 0;
  GemmTri tri_a = GemmTri::kNone;  // structure of op(A) (after the transpose), see above
  // kLower: only C(i, j) with j <= i is wanted (the masked chunk products K K^T, Q K^T, dO V^T): whole
  // vectors of a row tile past its last row's diagonal are neither computed nor written (the entries above the
  // diagonal that share a vector with wanted ones are computed and written). kUpper is not supported.
  GemmTri tri_c = GemmTri::kNone;
  // Per-row scales of the epilogue (nullptr: the scalars above): row i of C is row_alpha[i] (op(A) op(B))_i +
  // row_beta[i] C_in_i, with C_in_i not read where row_beta[i] == 0. Lets a product with a row-scaled left
  // operand skip the scaled copy (the GDN forward: diag(-beta e^gamma) K S + diag(beta) V, diag(scale e^gamma) Q S).
  const float* row_alpha = nullptr;
  const float* row_beta = nullptr;
};

using GemmF32Fn = void (*)(const GemmF32Args&);
// The kernel compiled for one Highway target (tile::cpu_isas()), nullptr if not compiled.
GemmF32Fn gemm_f32_for(int64_t hwy_target);
// The best kernel for this CPU.
void gemm_f32(const GemmF32Args& args);


// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (the packing step of trans_b, exposed so that an op
// can transpose an operand once and reuse it across several GEMMs). Same target table as gemm_f32_for.
using TransposeF32Fn = void (*)(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd);
TransposeF32Fn transpose_f32_for(int64_t hwy_target);

}  // namespace strata::tile
