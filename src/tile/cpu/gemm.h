// Small fp32 GEMM for the 16..256-sized blocks of chunked linear attention (64x64-class tiles):
//   C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C
// Row-major operands with leading dimensions; op(X) = X or X^T. Large plain GEMMs go to oneDNN/cuBLAS
// (ARCHITECTURE.md §4); this one is for fused per-chunk math, called from inside an op's own OpenMP loop, so it
// is single-threaded. Each C element is accumulated over k in increasing order with a blocking fixed by the
// shape: results are deterministic. beta == 0 does not read C (it may hold NaN).
#pragma once

#include <cstdint>

namespace strata::tile {

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
};

using GemmF32Fn = void (*)(const GemmF32Args&);
// The kernel compiled for one Highway target (tile::cpu_isas()), nullptr if not compiled.
GemmF32Fn gemm_f32_for(int64_t hwy_target);
// The best kernel for this CPU.
void gemm_f32(const GemmF32Args& args);

}  // namespace strata::tile
