// Host checks of the shared-memory layouts, wgmma descriptors and ldmatrix / stmatrix address maps of the
// wgmma fused GDN pass (gdn_fwd_wgmma_layout.h, used by gdn_fwd_cuda_wgmma.cu), against the PTX ISA's rules:
// the K-major no-swizzle canonical layout ((8, m), (T, 2k)) : ((1T, SBO), (1, LBO)) decoded from the descriptor
// bits, the m64nNk16 accumulator / A fragment layout, and the lane → element maps of ldmatrix / stmatrix .trans.
// The kernel itself needs a GPU (tests/cpp/test_gdn_fwd_cuda_variants.cpp); these run everywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "ops/linear_attn/gdn_common/gdn_fwd_wgmma_layout.h"

namespace strata::linear_attn::gdn::wgl {
namespace {

template <int kCols>
void expect_bijection(int rows) {
  std::set<int> seen;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < kCols; ++c) {
      const int o = tile_off<kCols>(r, c);
      EXPECT_GE(o, 0);
      EXPECT_LT(o, rows * kCols);
      seen.insert(o);
    }
  EXPECT_EQ(static_cast<int>(seen.size()), rows * kCols);
  // A 16-byte row segment is contiguous (one cp.async / ldmatrix row).
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < kCols; c += 8)
      for (int e = 1; e < 8; ++e) EXPECT_EQ(tile_off<kCols>(r, c + e), tile_off<kCols>(r, c) + e);
}

TEST(GdnFwdWgmmaLayout, TileOffsetIsABijectionWithContiguousSegments) {
  expect_bijection<128>(64);
  expect_bijection<128>(128);
  expect_bijection<64>(64);
  expect_bijection<64>(16);
}

// The operand rows x 16 K columns that wgmma reads for K step ks of a tile_desc<kCols> descriptor, by the
// canonical K-major no-swizzle layout of the PTX ISA, equals the tile's (row, 16 ks + kc) elements.
template <int kCols>
void expect_desc_matches(int rows) {
  const uint32_t base = 0x1a400;  // any 16-byte aligned shared address below 2^18
  for (int ks = 0; ks < kCols / 16; ++ks) {
    const uint64_t d = tile_desc<kCols>(base, ks);
    const uint32_t start = static_cast<uint32_t>(d & 0x3FFF) << 4;
    const uint32_t lbo = static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4;
    const uint32_t sbo = static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4;
    EXPECT_EQ((d >> 62) & 3, 0u) << "no swizzle";
    EXPECT_EQ((d >> 49) & 7, 0u) << "base offset";
    for (int r = 0; r < rows; ++r)
      for (int kc = 0; kc < 16; ++kc) {
        // ((8, m), (T, 2k)) : ((1T, SBO), (1, LBO)), T = 8 16-bit elements, in bytes:
        const uint32_t canon = start + (r % 8) * 16 + (r / 8) * sbo + (kc % 8) * 2 + (kc / 8) * lbo;
        const uint32_t mine = base + 2u * static_cast<uint32_t>(tile_off<kCols>(r, 16 * ks + kc));
        ASSERT_EQ(canon, mine) << "kCols " << kCols << " ks " << ks << " r " << r << " kc " << kc;
      }
  }
}

TEST(GdnFwdWgmmaLayout, DescriptorsAddressTheTilesByTheCanonicalLayout) {
  expect_desc_matches<128>(64);  // W, Q (A, M = 64 chunk rows), K (B of Q Kᵀ, N = 64)
  expect_desc_matches<128>(16);  // the S copy (B, N = kN = 16 / 32 / 64 value columns)
  expect_desc_matches<128>(64);
  expect_desc_matches<64>(64);   // pre-computed P (A, M = 64)
  expect_desc_matches<64>(16);   // Vn, Vd (B, N = kN)
  expect_desc_matches<64>(32);
  // The 14-bit address field holds every shared address of a 227 KB block.
  EXPECT_EQ(make_desc(227 * 1024 - 16, 128, 2048) & 0x3FFF, (227u * 1024 - 16) >> 4);
}

// stmatrix.x4.trans: register i of lane l' holds fragment (row l' / 4, columns 2 (l' % 4) + e) of matrix i; .trans
// stores fragment column b as memory row b (address from lane 8 i + b), the row index a as the position in it.
// With register i = pack(acc[4 j + 2 h], acc[4 j + 2 h + 1]), j = 2 jp + i / 2, h = i % 2, every accumulator
// element (row, col) must land at the transposed tile's (col, row).
template <int kRowsLd, int kN>
void expect_store_trans(int row0) {
  for (int w = 0; w < 4; ++w)
    for (int jp = 0; jp < kN / 16; ++jp)
      for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i)
          for (int e = 0; e < 2; ++e) {
            const int j = 2 * jp + (i >> 1), h = i & 1;
            const int row = row0 + acc_row(w, l, 2 * h + e), col = acc_col(l, j, 2 * h + e);
            const int a = l >> 2, b = 2 * (l & 3) + e;
            const int stored = st_trans_off<kRowsLd>(8 * i + b, row0 + 16 * w, jp) + a;
            ASSERT_EQ(stored, tile_off<kRowsLd>(col, row)) << "w " << w << " jp " << jp << " lane " << l;
          }
}

TEST(GdnFwdWgmmaLayout, StmatrixTransWritesTheTransposedAccumulator) {
  expect_store_trans<128, 64>(0);   // S copy, keys 0..63
  expect_store_trans<128, 64>(64);  // keys 64..127
  expect_store_trans<128, 16>(64);
  expect_store_trans<64, 32>(0);    // Vn, Vd
  expect_store_trans<64, 16>(0);
}

// ldmatrix.x4.trans: lane l' receives in register i the memory elements (row 2 (l' % 4) + e, column l' / 4) of
// matrix i (row r at the address of lane 8 i + r). The A fragment of m64nNk16 (= m16n8k16's per warp) wants in
// register i the element (row l' / 4 + 8 (i % 2), K column 2 (l' % 4) + e + 8 (i / 2)): row = key, K = chunk row
// of the [t][key] tile.
TEST(GdnFwdWgmmaLayout, LdmatrixTransReadsKTransposedAsAFragments) {
  for (int kb = 0; kb < 128; kb += 16)
    for (int t0 = 0; t0 < 64; t0 += 16)
      for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i)
          for (int e = 0; e < 2; ++e) {
            const int got = ld_trans_off<128>(8 * i + 2 * (l & 3) + e, t0, kb) + (l >> 2);
            const int key = kb + (l >> 2) + 8 * (i & 1), t = t0 + 2 * (l & 3) + e + 8 * (i >> 1);
            ASSERT_EQ(got, tile_off<128>(t, key)) << "kb " << kb << " t0 " << t0 << " lane " << l;
          }
}

// The cp.async slots of the 256 threads cover every (row, segment) of the K / W / Q (64 x 16 segments, 4 passes) and
// P (64 x 8, 2 passes) tiles once; a pass moves a thread's destination by a constant; the 8 threads of each
// 128-byte wavefront write distinct 16-byte bank groups.
TEST(GdnFwdWgmmaLayout, CpAsyncSlotsCoverTheTilesConflictFree) {
  std::set<int> kwq, pt;
  for (int tid = 0; tid < 256; ++tid) {
    for (int it = 0; it < 4; ++it) {
      const int r = kwq_row(tid, it), q = kwq_seg(tid);
      ASSERT_LT(r, 64);
      kwq.insert(r * 16 + q);
      EXPECT_EQ(tile_off<128>(r, 8 * q), tile_off<128>(kwq_row(tid, 0), 8 * q) + it * 2 * 8 * 128);
    }
    for (int it = 0; it < 2; ++it) {
      const int r = p_row(tid, it), q = p_seg(tid);
      ASSERT_LT(r, 64);
      pt.insert(r * 8 + q);
      EXPECT_EQ(tile_off<64>(r, 8 * q), tile_off<64>(p_row(tid, 0), 8 * q) + it * 4 * 8 * 64);
    }
  }
  EXPECT_EQ(kwq.size(), 64u * 16u);
  EXPECT_EQ(pt.size(), 64u * 8u);
  for (int g = 0; g < 256; g += 8) {
    std::set<int> banks_kwq, banks_p;
    for (int tid = g; tid < g + 8; ++tid) {
      banks_kwq.insert((2 * tile_off<128>(kwq_row(tid, 0), 8 * kwq_seg(tid)) % 128) / 16);
      banks_p.insert((2 * tile_off<64>(p_row(tid, 0), 8 * p_seg(tid)) % 128) / 16);
    }
    EXPECT_EQ(banks_kwq.size(), 8u) << "threads " << g << "..";
    EXPECT_EQ(banks_p.size(), 8u) << "threads " << g << "..";
  }
}

// The accumulator map covers the m64 x N tile once.
// The split pass (session 9) reads the two state warpgroups' S copies ([kN][128] each, adjacent) as one [2 kN][128]
// B tile, and their Vn tiles ([kN][64]) as one [2 kN][64] tile: row kN + r of the combined tile must be row r of the
// second warpgroup's tile, i.e. lie kN x kCols elements (the second tile's offset) further on, for kN = 16, 32, 64.
template <int kCols>
void expect_stacked(int kn) {
  for (int r = 0; r < kn; ++r)
    for (int c = 0; c < kCols; ++c) EXPECT_EQ(tile_off<kCols>(kn + r, c), kn * kCols + tile_off<kCols>(r, c));
}
TEST(GdnFwdWgmmaLayout, SplitPassStacksTheWarpgroupTiles) {
  for (const int kn : {16, 32, 64}) {
    expect_stacked<128>(kn);
    expect_stacked<64>(kn);
  }
}

TEST(GdnFwdWgmmaLayout, AccumulatorFragmentCoversTheTile) {
  constexpr int kN = 64;
  std::set<int> seen;
  for (int w = 0; w < 4; ++w)
    for (int l = 0; l < 32; ++l)
      for (int x = 0; x < kN / 2; ++x) {
        const int r = acc_row(w, l, x & 3), c = acc_col(l, x >> 2, x & 3);
        ASSERT_LT(r, 64);
        ASSERT_LT(c, kN);
        seen.insert(r * kN + c);
      }
  EXPECT_EQ(static_cast<int>(seen.size()), 64 * kN);
}

}  // namespace
}  // namespace strata::linear_attn::gdn::wgl
