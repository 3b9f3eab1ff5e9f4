// Host checks of the column-block tiles that the copy engine fills for the TMA-fed wgmma passes (session 10:
// tile/cuda/wgmma_layout.h cb_off / cb_desc / cb_ld_trans_off, used by bwd_dhu's kDhuWgmmaTma kernel and, until
// session 11, by the GDN forward's state_tma_wgmma): a box of 8 columns x kRows rows lands as kRows contiguous
// 16-byte rows; the descriptor addresses the tile by the PTX ISA's canonical K-major no-swizzle layout;
// ldmatrix.trans of the A fragment of Kᵀ reads the same elements as from a tile_off tile. The kernels need a GPU;
// these run everywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "tile/cuda/wgmma_layout.h"

namespace strata::cuda::wgmma {
namespace {

TEST(GdnPassLayout, ColumnBlockTileIsTheBoxLayout) {
  constexpr int kRows = 64, kCols = 128;
  std::set<int> seen;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) {
      const int o = cb_off<kRows>(r, c);
      // Box q = c / 8 starts at q x 8 kRows elements; its row r is the 16 bytes at 8 r.
      EXPECT_EQ(o, (c / 8) * 8 * kRows + 8 * r + c % 8);
      seen.insert(o);
    }
  EXPECT_EQ(static_cast<int>(seen.size()), kRows * kCols);
}

// wgmma's reads of K step ks (rows x 16 K columns) by the canonical layout ((8, m), (T, 2k)) : ((1T, SBO), (1, LBO))
// decoded from cb_desc's bits equal the tile's (row, 16 ks + kc) elements: the A operands (W, Q, K: M = 64 rows) and
// the B operand K of Q Kᵀ (N = 64).
TEST(GdnPassLayout, DescriptorAddressesTheTileByTheCanonicalLayout) {
  constexpr int kRows = 64;
  const uint32_t base = 0x0c400;
  for (int ks = 0; ks < 8; ++ks) {
    const uint64_t d = cb_desc<kRows>(base, ks);
    const uint32_t start = static_cast<uint32_t>(d & 0x3FFF) << 4;
    const uint32_t lbo = static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4;
    const uint32_t sbo = static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4;
    EXPECT_EQ((d >> 62) & 3, 0u) << "no swizzle";
    for (int r = 0; r < kRows; ++r)
      for (int kc = 0; kc < 16; ++kc) {
        const uint32_t canon = start + (r % 8) * 16 + (r / 8) * sbo + (kc % 8) * 2 + (kc / 8) * lbo;
        const uint32_t mine = base + 2u * static_cast<uint32_t>(cb_off<kRows>(r, 16 * ks + kc));
        ASSERT_EQ(canon, mine) << "ks " << ks << " r " << r << " kc " << kc;
      }
  }
}

// ldmatrix.x4.trans: lane l addresses row l % 8 of matrix l / 8; cb_ld_trans_off must point at the same tile element
// (t, key) as ld_trans_off does in a tile_off tile, and each of those rows is 16 contiguous bytes in the cb tile.
TEST(GdnPassLayout, LdmatrixTransRowsMatchTheCoreMatrixTile) {
  for (int t0 = 0; t0 < 64; t0 += 16)
    for (int kb = 0; kb < 128; kb += 16)
      for (int lane = 0; lane < 32; ++lane) {
        const int i = lane >> 3, r = lane & 7, t = t0 + 8 * (i >> 1) + r, key = kb + 8 * (i & 1);
        EXPECT_EQ(cb_ld_trans_off<64>(lane, t0, kb), cb_off<64>(t, key));
        EXPECT_EQ(ld_trans_off<128>(lane, t0, kb), tile_off<128>(t, key));
        for (int e = 1; e < 8; ++e) EXPECT_EQ(cb_off<64>(t, key + e), cb_off<64>(t, key) + e);
      }
}

}  // namespace
}  // namespace strata::cuda::wgmma
