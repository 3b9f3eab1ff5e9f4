// CPU kernels of chunk_local_cumsum, written once with Highway and compiled for every target in
// tile::cpu_isas() (one implementation "cpu.<isa>" each).
//
// The scan runs along t; the H * S lanes of a token are independent, so when they are contiguous (unit lane
// stride in g and out) they are the vector dimension: a chunk of [len <= C tokens, up to kLaneTile lanes] is
// swept row by row, each row read and written with full-width loads/stores while the running sums stay in
// registers (rows of up to kNarrowVecs vectors) or in an L1-resident f32 buffer (wider rows); large
// outputs are stored non-temporally. Other layouts take a scalar loop per lane. All of them add in t order
// with one f32 rounding per step and multiply by scale after the sum, so every layout and every ISA gives the
// same bits (tests/cpp/test_chunk_local_cumsum.cpp checks it, f16 stores included).
//
// Work split: items = (window, lane tile) pairs (chunk_local_cumsum.h), cut into fixed blocks
// (tile/cpu/parallel.h). Every output is computed by one thread in the same order whatever the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_attn/chunk_local_cumsum/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/linear_attn/chunk_local_cumsum/chunk_local_cumsum.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::linear_attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace tv = strata::tile::HWY_NAMESPACE;

// Lanes per work item: the running sums (16 KiB of f32) stay in L1 while a chunk is swept, and a token row
// of up to 4096 lanes is read and written as one sequential stream (rows split in pieces defeat the
// hardware prefetchers: 2 KiB pieces of 8 KiB rows ran at half the speed).
constexpr int64_t kLaneTile = 4096;

// Outputs of at least this size are written with non-temporal stores: they bypass the caches instead of
// first reading every output line (write-allocate), so the kernel moves 2 bytes per byte of g like a copy
// rather than 3. Smaller outputs stay in the caches, where the next op of the pipeline finds them. bf16/f16
// outputs too (tv::StreamF32: the same rounding, a 32-byte non-temporal store per 16 lanes on AVX-512): with
// ordinary stores the bf16 forward ran at 28 % of the copy bandwidth (bench/results/2026-11-30_cpu_atk_paired.md).
constexpr int64_t kStreamBytes = 4 << 20;

// Contiguous lanes [l0, l0 + nl) of chunk [t0, t1) of row b; acc holds kLaneTile floats. kStream: each output
// row is stored non-temporally from its first vector-aligned lane on (TO elements are naturally aligned).
template <class TG, class TO, bool kStream>
void ScanChunkLanes(const ChunkCumsumParams& p, int64_t b, int64_t t0, int64_t t1, int64_t l0, int64_t nl,
                    float* HWY_RESTRICT acc) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kStepBytes = static_cast<int64_t>(hn::MaxLanes(df) * sizeof(TG));
  const TG* gb = static_cast<const TG*>(p.g) + b * p.g_strides[0] + l0;
  TO* ob = static_cast<TO*>(p.out) + b * p.out_strides[0] + l0;
  const auto vscale = hn::Set(df, p.scale);
  std::fill(acc, acc + nl, 0.f);
  for (int64_t i = 0; i < t1 - t0; ++i) {
    const int64_t t = p.reverse ? t1 - 1 - i : t0 + i;
    const TG* gr = gb + t * p.g_strides[1];
    TO* orow = ob + t * p.out_strides[1];
    // The row the scan reads next (t + 1, or t - 1 in reverse) is prefetched alongside this one, at the same
    // lanes, one row ahead: a fixed distance in either direction (the hardware prefetchers follow forward
    // streams only, and the reverse scan is the backward). The chunk's last row prefetches itself (harmless).
    const TG* gn = i + 1 < t1 - t0 ? gb + (p.reverse ? t - 1 : t + 1) * p.g_strides[1] : gr;
    auto step_one = [&](int64_t k) {
      acc[k] += to_f32(gr[k]);
      orow[k] = from_f32<TO>(acc[k] * p.scale);
    };
    int64_t j = 0;
    if constexpr (kStream) {  // scalar head up to the first vector-aligned output lane (N is a power of two)
      const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(orow) / sizeof(TO)) & (N - 1);
      for (const int64_t head = std::min(nl, (N - misaligned) & (N - 1)); j < head; ++j) step_one(j);
    }
    for (; j + N <= nl; j += N) {
      tv::PrefetchAhead<kStepBytes, 0>(gn + j);
      const auto a = hn::Add(hn::LoadU(df, acc + j), tv::LoadF32(df, gr + j));
      hn::StoreU(a, df, acc + j);
      if constexpr (kStream) tv::StreamF32(df, hn::Mul(a, vscale), orow + j);
      else tv::StoreF32(df, hn::Mul(a, vscale), orow + j);
    }
    for (; j < nl; ++j) step_one(j);
  }
}

// Narrow rows of at most kNarrowVecs vectors (e.g. 32 scalar-gate heads, 128-byte rows): the running sums
// stay in registers. The buffered loop above spends more on per-row bookkeeping than on the row itself there.
constexpr int64_t kNarrowVecs = 4;

// One vector of a narrow row: a += g; out = a * scale (a named function: lambdas do not carry the target's
// attributes that Highway's always-inline ops need).
template <bool kStream, class DF, class V, class TG, class TO>
HWY_INLINE void NarrowStep(DF df, V& a, V vscale, const TG* HWY_RESTRICT g, TO* HWY_RESTRICT out, bool stream) {
  a = hn::Add(a, tv::LoadF32(df, g));
  if constexpr (kStream) {
    if (stream) {
      tv::StreamF32(df, hn::Mul(a, vscale), out);
      return;
    }
  }
  tv::StoreF32(df, hn::Mul(a, vscale), out);
}

template <class TG, class TO, bool kStream>
void ScanChunkNarrow(const ChunkCumsumParams& p, int64_t b, int64_t t0, int64_t t1, int64_t l0, int64_t nl) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t nv = nl / N;  // full vectors (<= kNarrowVecs); the last nl - nv * N lanes one at a time
  const TG* gb = static_cast<const TG*>(p.g) + b * p.g_strides[0] + l0;
  TO* ob = static_cast<TO*>(p.out) + b * p.out_strides[0] + l0;
  const auto vscale = hn::Set(df, p.scale);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  float tail[HWY_MAX_BYTES / sizeof(float)] = {};
  for (int64_t i = 0; i < t1 - t0; ++i) {
    const int64_t t = p.reverse ? t1 - 1 - i : t0 + i;
    const TG* gr = gb + t * p.g_strides[1];
    TO* orow = ob + t * p.out_strides[1];
    // Non-temporal stores need vector-aligned rows; narrow rows are not all aligned.
    const bool stream = kStream && reinterpret_cast<uintptr_t>(orow) % (N * sizeof(TO)) == 0;
    if (nv > 0) NarrowStep<kStream>(df, a0, vscale, gr, orow, stream);
    if (nv > 1) NarrowStep<kStream>(df, a1, vscale, gr + N, orow + N, stream);
    if (nv > 2) NarrowStep<kStream>(df, a2, vscale, gr + 2 * N, orow + 2 * N, stream);
    if (nv > 3) NarrowStep<kStream>(df, a3, vscale, gr + 3 * N, orow + 3 * N, stream);
    for (int64_t k = nv * N; k < nl; ++k) {
      tail[k - nv * N] += to_f32(gr[k]);
      orow[k] = from_f32<TO>(tail[k - nv * N] * p.scale);
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
  const bool stream = p.lanes_contiguous && p.B * p.T * p.lanes * static_cast<int64_t>(sizeof(TO)) >= kStreamBytes;
  const int64_t narrow_lanes = kNarrowVecs * static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  tile::parallel_blocks(num_windows(p) * tiles, block, [&](int64_t i0, int64_t i1) {
    HWY_ALIGN float acc[kLaneTile];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t w = i / tiles, l0 = (i - w * tiles) * kLaneTile, l1 = std::min(l0 + kLaneTile, p.lanes);
      for_each_chunk_in_window(p, w, [&](int64_t b, int64_t t0, int64_t t1) {
        if (!p.lanes_contiguous) ScanChunkStrided<TG, TO>(p, b, t0, t1, l0, l1);
        else if (l1 - l0 <= narrow_lanes && stream) ScanChunkNarrow<TG, TO, true>(p, b, t0, t1, l0, l1 - l0);
        else if (l1 - l0 <= narrow_lanes) ScanChunkNarrow<TG, TO, false>(p, b, t0, t1, l0, l1 - l0);
        else if (stream) ScanChunkLanes<TG, TO, true>(p, b, t0, t1, l0, l1 - l0, acc);
        else ScanChunkLanes<TG, TO, false>(p, b, t0, t1, l0, l1 - l0, acc);
      });
    }
    if (stream) hwy::FlushStream();  // order the non-temporal stores before the results are used
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
