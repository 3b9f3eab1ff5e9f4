// CPU kernels of chunk_local_cumsum, written once with Highway and compiled for every target in
// tile::cpu_isas() (one implementation "cpu.<isa>" each).
//
// The scan runs along t; the H * S lanes of a token are independent, so when they are contiguous (unit lane
// stride in g and out) they are the vector dimension: a chunk of [len <= C tokens, up to kLaneTile lanes] is
// swept row by row, each row read and written with full-width loads/stores while the running sums stay in
// an L1-resident f32 buffer. Other layouts take a scalar loop per lane. Both add in t order with one f32
// rounding per step and multiply by scale after the sum, so every layout and every ISA gives the same bits
// (tests/cpp/test_chunk_local_cumsum.cpp checks it, f16 stores included).
//
// Work split: items = (window, lane tile) pairs (chunk_local_cumsum.h), cut into fixed blocks
// (tile/cpu/parallel.h). Every output is computed by one thread in the same order whatever the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/chunk_local_cumsum/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>

#include "ops/linear_attn/chunk_local_cumsum/chunk_local_cumsum.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace tv = strata::tile::HWY_NAMESPACE;

// Lanes per work item: the running sums (2 KiB of f32) stay in L1 while a chunk is swept.
constexpr int64_t kLaneTile = 512;

// Contiguous lanes [l0, l0 + nl) of chunk [t0, t1) of row b; acc: kLaneTile aligned floats.
template <class TG, class TO>
void ScanChunkLanes(const ChunkCumsumParams& p, int64_t b, int64_t t0, int64_t t1, int64_t l0, int64_t nl,
                    float* HWY_RESTRICT acc) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const TG* gb = static_cast<const TG*>(p.g) + b * p.g_strides[0] + l0;
  TO* ob = static_cast<TO*>(p.out) + b * p.out_strides[0] + l0;
  const auto vscale = hn::Set(df, p.scale);
  std::fill(acc, acc + nl, 0.f);
  for (int64_t i = 0; i < t1 - t0; ++i) {
    const int64_t t = p.reverse ? t1 - 1 - i : t0 + i;
    const TG* gr = gb + t * p.g_strides[1];
    TO* orow = ob + t * p.out_strides[1];
    int64_t j = 0;
    for (; j + N <= nl; j += N) {
      const auto a = hn::Add(hn::Load(df, acc + j), tv::LoadF32(df, gr + j));
      hn::Store(a, df, acc + j);
      tv::StoreF32(df, hn::Mul(a, vscale), orow + j);
    }
    for (; j < nl; ++j) {
      acc[j] += to_f32(gr[j]);
      orow[j] = from_f32<TO>(acc[j] * p.scale);
    }
  }
}

// Any layout: lanes [l0, l1) one at a time, strided accesses.
template <class TG, class TO>
void ScanChunkStrided(const ChunkCumsumParams& p, int64_t b, int64_t t0, int64_t t1, int64_t l0, int64_t l1) {
  const TG* g = static_cast<const TG*>(p.g);
  TO* out = static_cast<TO*>(p.out);
  for (int64_t l = l0; l < l1; ++l) {
    const int64_t gl = b * p.g_strides[0] + lane_offset(p.g_strides, p.S, l);
    const int64_t ol = b * p.out_strides[0] + lane_offset(p.out_strides, p.S, l);
    float acc = 0.f;
    for (int64_t i = 0; i < t1 - t0; ++i) {
      const int64_t t = p.reverse ? t1 - 1 - i : t0 + i;
      acc += to_f32(g[gl + t * p.g_strides[1]]);
      out[ol + t * p.out_strides[1]] = from_f32<TO>(acc * p.scale);
    }
  }
}

template <class TG, class TO>
void ScanAll(const ChunkCumsumParams& p) {
  const int64_t tiles = (p.lanes + kLaneTile - 1) / kLaneTile;
  const int64_t tile_lanes = std::min(p.lanes, kLaneTile);
  const int64_t block =
      tile::block_for_bytes(p.chunk_size * tile_lanes * static_cast<int64_t>(sizeof(TG) + sizeof(TO)));
  tile::parallel_blocks(num_windows(p) * tiles, block, [&](int64_t i0, int64_t i1) {
    HWY_ALIGN float acc[kLaneTile];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t w = i / tiles, l0 = (i - w * tiles) * kLaneTile, l1 = std::min(l0 + kLaneTile, p.lanes);
      for_each_chunk_in_window(p, w, [&](int64_t b, int64_t t0, int64_t t1) {
        if (p.lanes_contiguous) ScanChunkLanes<TG, TO>(p, b, t0, t1, l0, l1 - l0, acc);
        else ScanChunkStrided<TG, TO>(p, b, t0, t1, l0, l1);
      });
    }
  });
}

void ChunkLocalCumsum(const ChunkCumsumParams& p) {
  // The plan gives these implementations f32/bf16/f16 only (f64 goes to the reference), so the f64
  // instances are never reached and not compiled.
  visit_float_dtype(p.g_dtype, [&](auto tg) {
    visit_float_dtype(p.out_dtype, [&](auto to) {
      using TG = decltype(tg);
      using TO = decltype(to);
      if constexpr (!std::is_same_v<TG, double> && !std::is_same_v<TO, double>) ScanAll<TG, TO>(p);
    });
  });
}

}  // namespace strata::linear_attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::linear_attn {
HWY_EXPORT(ChunkLocalCumsum);

ChunkCumsumCpuFn chunk_local_cumsum_cpu(int64_t hwy_target) {
  return STRATA_HWY_FOR_TARGET(ChunkLocalCumsum, hwy_target);
}
}  // namespace strata::linear_attn
#endif
