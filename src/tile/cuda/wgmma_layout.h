// Shared-memory layouts and matrix descriptors of Hopper warpgroup MMA operands (wgmma.h's products), host +
// device so that tests check them on the CPU (tests/cpp/test_gdn_fwd_wgmma_layout.cpp) against the PTX ISA's
// canonical layout (§9.7.15.5.1.2, "K-major, no swizzling"):
//   ((8, m), (T, 2k)) : ((1T, SBO), (1, LBO))   (T = 8 16-bit elements = 16 bytes)
// i.e. element (row r, col c) of an operand whose K (contraction) index is the column lies at
//   (r % 8) * 8 + (r / 8) * SBO + (c % 8) + (c / 8) * LBO   elements from the start address.
// The tiles here use LBO = 64 elements (the 8 x 8 "core matrices" of a row of core matrices adjacent, 128 bytes
// each) and SBO = 8 * kCols elements (one row of core matrices):
//   tile_off<kCols>(r, c) = (r / 8) * 8 kCols + (c / 8) * 64 + (r % 8) * 8 + c % 8.
// A 16-byte segment (row r, columns 8q..8q+7) is contiguous (one cp.async / ldmatrix / stmatrix row), and a core
// matrix is 128 contiguous bytes, so ldmatrix / stmatrix of an 8 x 8 block and the wgmma reads touch 32 distinct
// banks.
#pragma once

#include <cstdint>

#include "opbase/dtype.h"  // STRATA_HD

namespace strata::cuda::wgmma {

// Element offset of (r, c) in a K-major core-matrix tile with kCols columns (kCols % 8 == 0).
template <int kCols>
STRATA_HD constexpr int tile_off(int r, int c) {
  static_assert(kCols % 8 == 0, "whole core matrices");
  return (r >> 3) * (kCols * 8) + (c >> 3) * 64 + (r & 7) * 8 + (c & 7);
}

// wgmma shared-memory matrix descriptor (no swizzle: layout type 0 in bits 62-63, base offset 0): start address,
// leading (K direction) and stride (M / N direction) byte offsets, each encoded as (x & 0x3FFFF) >> 4.
STRATA_HD constexpr uint64_t make_desc(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo_bytes & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo_bytes & 0x3FFFFu) >> 4) << 32);
}
// Descriptor of a kCols-column tile_off tile at byte address `base` (16-bit elements), advanced to the 16-column
// K step ks: the K step moves the start address by two core matrices (256 bytes = 16 in the encoded field).
template <int kCols>
STRATA_HD constexpr uint64_t tile_desc(uint32_t base, int ks) {
  return make_desc(base + static_cast<uint32_t>(ks) * 256u, 64u * 2u, static_cast<uint32_t>(kCols) * 8u * 2u);
}

// Accumulator (and register A) fragment coordinates of wgmma m64nNk16 inside the 64-row tile: warp w of the
// warpgroup owns rows 16w..16w+15; lane l holds, for every 8-column block j, the elements
//   e = 0, 1: (16w + l/4,     8j + 2(l%4) + e),   e = 2, 3: (16w + l/4 + 8, 8j + 2(l%4) + e − 2)
// at accumulator index 4j + e (the layout of mma.m16n8k16's C per 16 x 8 block).
STRATA_HD constexpr int acc_row(int w, int lane, int e) { return 16 * w + (lane >> 2) + 8 * (e >> 1); }
STRATA_HD constexpr int acc_col(int lane, int j, int e) { return 8 * j + 2 * (lane & 3) + (e & 1); }

// stmatrix.x4.trans of the accumulator blocks (rows rb..rb+15, columns of 8-column blocks 2jp, 2jp+1) into the
// transposed K-major tile X [col][row] (kRowsLd = X's column count = the accumulator's row extent): matrix
// i = lane / 8 is block (h = i % 2, j = 2jp + i / 2) holding pack(acc[4j + 2h], acc[4j + 2h + 1]); .trans stores
// its column c (accumulator column 8j + c) as X's row 8j + c, columns rb + 8h..+7, whose 16 bytes lane 8i + c
// addresses. Returns that lane's element offset.
template <int kRowsLd>
STRATA_HD constexpr int st_trans_off(int lane, int rb, int jp) {
  const int i = lane >> 3, c = lane & 7;
  return tile_off<kRowsLd>(8 * (2 * jp + (i >> 1)) + c, rb + 8 * (i & 1));
}

// ldmatrix.x4.trans of the A fragment (rows kb..kb+15 = columns of the [t][key] tile Y (kCols columns), K columns
// t0..t0+15 = Y's rows): register i = block (rows kb + 8 (i % 2), K columns t0 + 8 (i / 2)), read as Y's rows
// t0 + 8 (i / 2) + r (r = lane % 8), columns kb + 8 (i % 2)..+7. Returns lane's element offset.
template <int kCols>
STRATA_HD constexpr int ld_trans_off(int lane, int t0, int kb) {
  const int i = lane >> 3, r = lane & 7;
  return tile_off<kCols>(t0 + 8 * (i >> 1) + r, kb + 8 * (i & 1));
}

// Column-block tiles (session 10): the layout a copy-engine box of 8 columns x kRows rows writes (tma_tile.cuh):
// the 16-byte rows of one 8-column block adjacent, element (r, c) at (c / 8) * 8 kRows + 8 r + c % 8. It is the
// canonical K-major layout with SBO = 128 bytes (the next 8 rows: core matrices adjacent) and LBO = 16 kRows bytes
// (the next 8 columns). ldmatrix / stmatrix rows and a 32-bit pair per lane at rows 8 apart stay conflict-free.
template <int kRows>
STRATA_HD constexpr int cb_off(int r, int c) {
  return (c >> 3) * (kRows * 8) + r * 8 + (c & 7);
}
// Descriptor of a kRows-row cb_off tile at byte address `base`, advanced to the 16-column K step ks (2 blocks).
template <int kRows>
STRATA_HD constexpr uint64_t cb_desc(uint32_t base, int ks) {
  return make_desc(base + static_cast<uint32_t>(ks) * (2u * kRows * 16u), static_cast<uint32_t>(kRows) * 16u, 128u);
}
// ld_trans_off for a cb_off<kRows> [t][key] tile (the A fragment of rows kb.. = keys, K columns t0.. = tile rows).
template <int kRows>
STRATA_HD constexpr int cb_ld_trans_off(int lane, int t0, int kb) {
  const int i = lane >> 3, r = lane & 7;
  return cb_off<kRows>(t0 + 8 * (i >> 1) + r, kb + 8 * (i & 1));
}

}  // namespace strata::cuda::wgmma
