// Token-tensor tiles loaded by the tensor-memory accelerator (cp.async.bulk.tensor, sm_90) into the column-block
// K-major layout of wgmma_layout.h (cb_off / cb_desc), for chunk-sequential passes that feed warpgroup MMA from a
// producer warp: one 16-byte-wide box per 8-column block of a [rows][cols] tile, completing on an mbarrier
// (bulk_copy.cuh's protocol: mbar_arrive_expect_tx by one thread, the copies, mbar_wait by the readers).
//
// A token tensor [B, T, heads, D] (16-bit elements, unit stride in D, the other strides in elements) is described
// by a 4-D tensor map with dims (D, heads, T, B) and box (8, 1, rows, 1): the box of (column 8 q, head, token t,
// batch row b) is the 16-byte segment q of rows t .. t + rows − 1, written as rows x 16 contiguous bytes, i.e.
// 8-column block q of a cb_off<rows> tile. Rows past T are zero-filled by the copy engine (and counted in the
// transaction bytes like the others).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <cstdint>

#include "tile/cuda/bulk_copy.cuh"

namespace strata::cuda::tma {

// The driver's cuTensorMapEncodeTiled (fetched once; nullptr where the driver lacks it).
using TiledEncode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline TiledEncode tiled_encoder() {
  static const TiledEncode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<TiledEncode>(fn);
  }();
  return encode;
}

// cuTensorMapEncodeTiled of a 16-bit tensor at data (rank dims, byte strides of dims 1.., box, no swizzle, zero fill
// out of bounds); false where the driver lacks it, data is not 16-byte aligned, a stride is out of the copy engine's
// range or the driver refuses the map.
inline bool encode_u16(CUtensorMap* m, const void* data, cuuint32_t rank, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* box) {
  const TiledEncode encode = tiled_encoder();
  if (encode == nullptr || (reinterpret_cast<uintptr_t>(data) & 15u) != 0) return false;
  for (cuuint32_t i = 0; i + 1 < rank; ++i)
    if (strides[i] >= (cuuint64_t{1} << 40)) return false;
  const cuuint32_t estr[5] = {1, 1, 1, 1, 1};
  return encode(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, rank, const_cast<void*>(data), dims, strides, box, estr,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// A [B, T, heads, D] view the maps below take: positive sizes, strides non-negative multiples of 8 elements.
inline bool rows_view_ok(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t st_b, int64_t st_t, int64_t st_h) {
  return B > 0 && T > 0 && heads > 0 && D > 0 && ((st_b | st_t | st_h) & 7) == 0 && st_b >= 0 && st_t >= 0 &&
         st_h >= 0;
}
// Byte stride of a dimension; a stride of 0 (a dimension of size 1 in a broadcast view) is given as 16.
inline cuuint64_t byte_stride(int64_t s) { return static_cast<cuuint64_t>(s > 0 ? 2 * s : 16); }

// Host: fills *m for the [B, T, heads, D] tensor at data (16-bit elements; strides in elements) with a box of
// `rows` tokens x 8 columns. False if the view does not qualify (data not 16-byte aligned, a stride not a multiple
// of 8 elements, a size or stride out of the copy engine's range) or the driver refuses it; the caller then takes a
// path without tensor maps.
inline bool encode_rows_map(CUtensorMap* m, const void* data, int64_t B, int64_t T, int64_t heads, int64_t D,
                            int64_t st_b, int64_t st_t, int64_t st_h, int rows) {
  if (!rows_view_ok(B, T, heads, D, st_b, st_t, st_h)) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(T),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {byte_stride(st_h), byte_stride(st_t), byte_stride(st_b)};
  const cuuint32_t box[4] = {8, 1, static_cast<cuuint32_t>(rows), 1};
  return encode_u16(m, data, 4, dims, strides, box);
}

// Device: the box (column col, head, token t, batch row b) of map into shared byte address dst (16-byte aligned;
// rows x 16 bytes), completing its bytes on the mbarrier at shared byte address bar.
__device__ __forceinline__ void load_box(uint32_t dst, const CUtensorMap* map, int col, int head, int t, int b,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(t), "r"(b), "r"(bar)
      : "memory");
}

// A plain arrival on the mbarrier (release: this thread's earlier shared-memory writes are visible to the threads
// that then observe the phase complete with mbar_wait).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// ---- session 12 (chunk_gated_delta_rule_bwd_dhu): a whole cb_off tile in one box ----
// The same [B, T, heads, D] tensor as a 5-D map with dims (8, T, D / 8, heads, B) (byte strides 2 st_t, 16, 2 st_h,
// 2 st_b: the 8-column blocks as a dimension of their own) and box (8, rows, blocks, 1, 1): the box of (token t,
// 8-column block q, head, batch row b) is `blocks` consecutive 8-column blocks q.. of rows t .., written in box order
// (8 elements, then the rows, then the blocks), i.e. a cb_off<rows> tile of `blocks` 8-column blocks in one copy instead
// of one box per block. D % 8 == 0. Same qualification and zero fill past T as encode_rows_map.
inline bool encode_blocks_map(CUtensorMap* m, const void* data, int64_t B, int64_t T, int64_t heads, int64_t D,
                              int64_t st_b, int64_t st_t, int64_t st_h, int rows, int blocks) {
  if (!rows_view_ok(B, T, heads, D, st_b, st_t, st_h) || D % 8 != 0 || blocks < 1 || blocks > D / 8 || blocks > 256)
    return false;
  const cuuint64_t dims[5] = {8, static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(D / 8),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[4] = {byte_stride(st_t), 16, byte_stride(st_h), byte_stride(st_b)};
  const cuuint32_t box[5] = {8, static_cast<cuuint32_t>(rows), static_cast<cuuint32_t>(blocks), 1, 1};
  return encode_u16(m, data, 5, dims, strides, box);
}
// Device: the box (token t, 8-column block q, head, batch row b) of an encode_blocks_map map into dst.
__device__ __forceinline__ void load_blocks(uint32_t dst, const CUtensorMap* map, int t, int q, int head, int b,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
      "%6}], [%7];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(t), "r"(q), "r"(head), "r"(b), "r"(bar)
      : "memory");
}


// ---- session 12 (chunk_bwd_dqkwg's copy-engine form): 128-byte-swizzled boxes of 64 columns ----
// Host: fills *m for a tensor of 16-bit elements at data with `rank` (2..5) dimensions dims[0..rank-1] (dims[0]
// innermost, unit stride) and element strides st[0..rank-2] of dims 1..rank-1, box `box` (box[0] = 64: one
// 128-byte row segment), CU_TENSOR_MAP_SWIZZLE_128B: the box lands as box rows of 128 bytes, 16-byte chunk c of
// row r at chunk c ^ (r % 8) (shared destination 1024-byte aligned), the K-major layout that wgmma.cuh's
// sw128_desc describes. Elements past dims are zero-filled. False where tma::encode_rows_map would be (the
// caller then takes a path without tensor maps).
inline bool encode_sw128_map(CUtensorMap* m, const void* data, int rank, const int64_t* dims, const int64_t* st,
                             const uint32_t* box) {
  const TiledEncode encode = tiled_encoder();
  if (encode == nullptr || rank < 2 || rank > 5 || (reinterpret_cast<uintptr_t>(data) & 15u) != 0 || box[0] != 64)
    return false;
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], e[5];
  for (int i = 0; i < rank; ++i) {
    if (dims[i] <= 0 || dims[i] > (int64_t{1} << 32) || box[i] == 0 || box[i] > 256) return false;
    d[i] = static_cast<cuuint64_t>(dims[i]), b[i] = box[i], e[i] = 1;
  }
  for (int i = 0; i + 1 < rank; ++i) {
    if (st[i] < 0 || (st[i] & 7) != 0 || (st[i] == 0 && dims[i + 1] > 1)) return false;
    s[i] = static_cast<cuuint64_t>(st[i] > 0 ? 2 * st[i] : 16);  // (stride 0 of a dimension of size 1: any)
    if (s[i] >= (cuuint64_t{1} << 40)) return false;
  }
  return encode(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, static_cast<cuuint32_t>(rank), const_cast<void*>(data), d, s, b, e,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Device: the box at coordinates (c0, .., c4) of a 5-D map into shared byte address dst, completing on bar.
__device__ __forceinline__ void load_box5(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, int c4,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
      "%6}], [%7];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}

// mbar_wait (bulk_copy.cuh) as one PTX loop: the compiler sees no loop around it, so that a kernel that waits
// between warpgroup-MMA products keeps its accumulators in place (the C++ loop raised spills there). kBounded: a
// phase that does not complete within 2^24 polls (a byte count that never arrives: a bug) traps instead of hanging
// (one more register while it waits).
template <bool kBounded>
__device__ __forceinline__ void mbar_wait_ptx(uint32_t bar, uint32_t parity) {
  if constexpr (kBounded)
    asm volatile(
        "{\n.reg .pred P1;\n.reg .u32 n;\nmov.u32 n, 0;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra DONE;\nadd.u32 n, n, 1;\nsetp.lt.u32 P1, n, 16777216;\n@P1 bra WAIT;\ntrap;\nDONE:\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
  else
    asm volatile(
        "{\n.reg .pred P1;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@!P1 bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

}  // namespace strata::cuda::tma
