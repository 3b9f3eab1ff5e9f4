// Warp-level tensor-core helpers for sm_80+ (used on sm_90): mma.sync.aligned.m16n8k16 with bf16 or f16
// inputs and f32 accumulators, ldmatrix loads of fragments from shared memory (plain and transposed), the
// conversion of an f32 accumulator tile into a bf16/f16 A fragment (so a product can feed the next GEMM
// without a trip through shared memory), and accumulator element coordinates for stores.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"); lane = threadIdx.x % 32,
// g = lane / 4 ("group", 0..7), t = lane % 4 ("thread in group", 0..3):
//   A  16 x 16 (m x k), 4 x 32-bit registers, each holding 2 consecutive-k elements (low half = lower k):
//        a[0]: row g,     k 2t, 2t+1        a[1]: row g + 8, k 2t, 2t+1
//        a[2]: row g,     k 2t+8, 2t+9      a[3]: row g + 8, k 2t+8, 2t+9
//   B  16 x 8 (k x n), 2 registers:
//        b[0]: k 2t, 2t+1, col g            b[1]: k 2t+8, 2t+9, col g
//   C/D 16 x 8 (m x n), 4 floats:
//        c[0], c[1]: row g, cols 2t, 2t+1   c[2], c[3]: row g + 8, cols 2t, 2t+1
//
// Shared-memory tiles read by ldmatrix are row-major arrays of 16-bit elements; every 8-element (16-byte)
// row segment must be 16-byte aligned, so the leading dimension (in elements) must be a multiple of 8.
// Padding it to (multiple of 64) + 8 elements makes the 8 row addresses of one 8 x 8 matrix fall in
// distinct bank groups (no conflicts); see kPadLd.
//
// Which load for which operand (the storage orientation decides plain vs .trans):
//   A stored [m][k] (row-major, e.g. Q or K rows of a chunk)         -> load_a        (ldmatrix.x4)
//   A stored [k][m] (e.g. K of a chunk used as Kᵀ in Kᵀ V)            -> load_a_trans  (ldmatrix.x4.trans)
//   B stored [n][k] (e.g. K rows used as Kᵀ in Q Kᵀ: "col" operand)    -> load_b2       (ldmatrix.x4, 2 n-tiles)
//   B stored [k][n] (e.g. V rows in P V, the state S [K][V] in Q S)   -> load_b2_trans (ldmatrix.x4.trans)
// Each load_b2* returns the B fragments of two adjacent 8-column tiles (n0..n0+7 and n0+8..n0+15).
//
// Every function here is warp-collective: all 32 lanes of the warp must call it with the same tile origin.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace strata::cuda::mma {

// Element types the helpers accept: __nv_bfloat16 and __half.
template <class T>
inline constexpr bool kIsMmaType = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// Leading dimension (elements) of a padded shared tile of `cols` 16-bit columns: conflict-free ldmatrix.
template <int kCols>
inline constexpr int kPadLd = kCols + 8;

struct FragA {
  uint32_t x[4];
};
struct FragB {
  uint32_t x[2];
};
struct FragC {
  float x[4];
  __device__ __forceinline__ void zero() { x[0] = x[1] = x[2] = x[3] = 0.f; }
};

// Two floats rounded to nearest even into one register (low half = a, the lower k / column index).
template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  static_assert(kIsMmaType<T>, "bf16 or f16");
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    r = *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    r = *reinterpret_cast<const uint32_t*>(&h);
  }
  return r;
}

// The two halves of a register as floats (inverse of pack2, exact).
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
  static_assert(kIsMmaType<T>, "bf16 or f16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&r));
  }
}

// d += a · b on the tensor cores (16 x 8 x 16), f32 accumulation.
template <class T>
__device__ __forceinline__ void mma16816(FragC& d, const FragA& a, const FragB& b) {
  static_assert(kIsMmaType<T>, "bf16 or f16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 matrices of 16-bit elements; lane l supplies the address of row (l % 8) of matrix (l / 8);
// register i of every lane receives its two elements of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr)));
}

// A fragment of the 16 x 16 block at (row m0, col k0) of a row-major [m][k] tile (leading dim ld).
// Matrices: 0 = rows m0..+7 / cols k0..+7, 1 = rows m0+8.. / cols k0.., 2 = rows m0.. / cols k0+8..,
// 3 = rows m0+8.. / cols k0+8.. (= a[0..3]).
template <class T>
__device__ __forceinline__ FragA load_a(const T* tile, int ld, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  FragA f;
  ldmatrix_x4(f.x, tile + (m0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
  return f;
}

// A fragment of the 16 x 16 block (m0.., k0..) of A where the tile stores Aᵀ: [k][m] row-major.
// Matrix i is read from rows k0 + 8·(i / 2) and cols m0 + 8·(i % 2) of the stored tile, transposed.
template <class T>
__device__ __forceinline__ FragA load_a_trans(const T* tile, int ld, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  FragA f;
  ldmatrix_x4_trans(f.x, tile + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + (((lane >> 3) & 1) << 3));
  return f;
}

// B fragments of the two 16 x 8 blocks (k0.., n0..+7) and (k0.., n0+8..+15) where the tile stores Bᵀ:
// [n][k] row-major ("col" B, e.g. the K rows of Q Kᵀ). Matrices: 0 = n0..+7 / k0..+7, 1 = n0.. / k0+8..,
// 2 = n0+8.. / k0.., 3 = n0+8.. / k0+8..
template <class T>
__device__ __forceinline__ void load_b2(FragB& b0, FragB& b1, const T* tile, int ld, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  uint32_t r[4];
  ldmatrix_x4(r, tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
  b0.x[0] = r[0], b0.x[1] = r[1], b1.x[0] = r[2], b1.x[1] = r[3];
}

// B fragments of the blocks (k0.., n0..+7) and (k0.., n0+8..+15) of B stored [k][n] row-major (e.g. V rows
// of P V, or a state S [K][V]). Matrices: 0 = k0..+7 / n0..+7, 1 = k0+8.. / n0.., 2 = k0.. / n0+8..,
// 3 = k0+8.. / n0+8.., each transposed by ldmatrix.
template <class T>
__device__ __forceinline__ void load_b2_trans(FragB& b0, FragB& b1, const T* tile, int ld, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  uint32_t r[4];
  ldmatrix_x4_trans(r, tile + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + ((lane >> 4) << 3));
  b0.x[0] = r[0], b0.x[1] = r[1], b1.x[0] = r[2], b1.x[1] = r[3];
}

// The A fragment (16 x 16, rows of c0/c1, k = their 16 columns) made of two f32 accumulator tiles that are
// adjacent along n: c0 = columns 0..7, c1 = columns 8..15, each element rounded to T (nearest even). The
// C layout of a 16 x 8 tile matches half of the A layout, so no data moves between lanes.
template <class T>
__device__ __forceinline__ FragA c_to_a(const FragC& c0, const FragC& c1) {
  FragA a;
  a.x[0] = pack2<T>(c0.x[0], c0.x[1]);
  a.x[1] = pack2<T>(c0.x[2], c0.x[3]);
  a.x[2] = pack2<T>(c1.x[0], c1.x[1]);
  a.x[3] = pack2<T>(c1.x[2], c1.x[3]);
  return a;
}

// Coordinates of accumulator element i (0..3) of this lane inside its 16 x 8 tile.
__device__ __forceinline__ int c_row(int i) { return ((threadIdx.x & 31) >> 2) + ((i >> 1) << 3); }
__device__ __forceinline__ int c_col(int i) { return (((threadIdx.x & 31) & 3) << 1) + (i & 1); }

// Stores a 16 x 8 accumulator tile at (m0, n0) of a row-major tile of f32 (ld in elements).
__device__ __forceinline__ void store_c(float* tile, int ld, int m0, int n0, const FragC& c) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  *reinterpret_cast<float2*>(tile + (m0 + g) * ld + n0 + 2 * t) = make_float2(c.x[0], c.x[1]);
  *reinterpret_cast<float2*>(tile + (m0 + g + 8) * ld + n0 + 2 * t) = make_float2(c.x[2], c.x[3]);
}
// The same, rounded to T (nearest even), into a row-major 16-bit tile (ld even).
template <class T>
__device__ __forceinline__ void store_c(T* tile, int ld, int m0, int n0, const FragC& c) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  *reinterpret_cast<uint32_t*>(tile + (m0 + g) * ld + n0 + 2 * t) = pack2<T>(c.x[0], c.x[1]);
  *reinterpret_cast<uint32_t*>(tile + (m0 + g + 8) * ld + n0 + 2 * t) = pack2<T>(c.x[2], c.x[3]);
}

}  // namespace strata::cuda::mma
