// CUDA kernels of the row norms (row_norm.h). Memory-bound: each input is read once and each output written
// once, with 16-byte accesses where the layout allows.
//
// Rows are cut into chunks of CE consecutive elements per thread (CE = 8 or 16; by default 32 bytes of the
// widest row dtype: 8 f32 or 16 bf16/f16, the best measured on the H200). Three shapes of kernel:
//   rows_in_group<CE, TPR, NV>: a group of TPR lanes (TPR <= 32) holds one row in registers, NV chunks per
//                               lane; several rows per warp for short rows. No __syncthreads.
//   rows_in_block<CE, NV, BT>:  one BT-thread block per row (BT 128/256/512), NV chunks per thread in
//                               registers.
//   rows_looped:                one block per row, two passes over global memory (the second mostly from
//                               L2), any D, any stride or alignment (element-wise accesses).
// dtypes are read at run time inside the kernels (uniform branches), which keeps the number of template
// instances small; arithmetic is f32, and bf16/f16 results are rounded by the hardware's paired conversions
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32: nearest even, like the CPU). Sums use a fixed shuffle tree: same
// bits run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "opbase/dtype.h"
#include "ops/norm/common/row_norm.h"
#include "ops/norm/common/row_norm_cuda_multi.h"
#include "ops/norm/common/row_norm_cuda_tma.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm {
namespace {

constexpr int kBlock = 256;

// Chunk loads/stores (16-byte accesses, run-time dtype, hardware RNE conversions) and the element-wise
// fallbacks come from tile/cuda/vec_io.cuh.
using cuda::load_one;
using cuda::store_one;
template <int N>
__device__ __forceinline__ void load_chunk(const void* base, int32_t dtype, int64_t i, float (&v)[N]) {
  cuda::load_vec<N>(base, dtype, i, v);
}
template <int N>
__device__ __forceinline__ void store_chunk(void* base, int32_t dtype, int64_t i, const float (&v)[N]) {
  cuda::store_vec<N>(base, dtype, i, v);
}

// ------------------------------------------------------------------------------------------------------
// Forward. Each kernel: sum of squares -> rstd -> (optional) y = x * rstd.

template <int kChunk, int TPR, int NV, int RPG>
__global__ void __launch_bounds__(kBlock) fwd_rows_in_group(const RowNormFwdParams p) {
  // Group g holds rows [g * RPG, g * RPG + RPG); all their loads are issued before the first reduction.
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) / TPR * RPG;
  const int t = threadIdx.x % TPR;
  float v[RPG][NV][kChunk];
  float ss[RPG];
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    // Lanes past the last row stay for the shuffles (full-warp masks) but touch no memory.
    const bool live = row0 + r < p.rows;
    const int64_t xo = live ? p.x_rows.row_offset(row0 + r) : 0;
    ss[r] = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (t + k * TPR) * kChunk;
      if (live && c < p.D) {
        load_chunk(p.x, p.x_dtype, xo + c, v[r][k]);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) ss[r] = fmaf(v[r][k][e], v[r][k][e], ss[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPG; ++r) ss[r] = cuda::group_sum<TPR>(ss[r]);
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    const int64_t row = row0 + r;
    if (row >= p.rows) return;
    const float rstd = rsqrtf(ss[r] / static_cast<float>(p.n_div) + p.eps);
    if (t == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row), rstd);
    if (!p.y) continue;
    const int64_t yo = p.y_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (t + k * TPR) * kChunk;
      if (c < p.D) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[r][k][e] *= rstd;
        store_chunk(p.y, p.y_dtype, yo + c, v[r][k]);
      }
    }
  }
}

template <int kChunk, int NV, int BT, int RPG>
__global__ void __launch_bounds__(BT) fwd_rows_in_block(const RowNormFwdParams p) {
  __shared__ float scratch[32];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * RPG;  // rows [row0, row0 + RPG)
  float v[RPG][NV][kChunk];
  float ss[RPG];
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    const bool live = row0 + r < p.rows;
    const int64_t xo = live ? p.x_rows.row_offset(row0 + r) : 0;
    ss[r] = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (threadIdx.x + k * BT) * kChunk;
      if (live && c < p.D) {
        load_chunk(p.x, p.x_dtype, xo + c, v[r][k]);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) ss[r] = fmaf(v[r][k][e], v[r][k][e], ss[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPG; ++r) ss[r] = cuda::block_sum(ss[r], scratch);  // every thread calls it
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    const int64_t row = row0 + r;
    if (row >= p.rows) return;
    const float rstd = rsqrtf(ss[r] / static_cast<float>(p.n_div) + p.eps);
    if (threadIdx.x == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row), rstd);
    if (!p.y) continue;
    const int64_t yo = p.y_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (threadIdx.x + k * BT) * kChunk;
      if (c < p.D) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[r][k][e] *= rstd;
        store_chunk(p.y, p.y_dtype, yo + c, v[r][k]);
      }
    }
  }
}

__global__ void __launch_bounds__(kBlock) fwd_rows_looped(const RowNormFwdParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t xo = p.x_rows.row_offset(row), cs = p.x_rows.col_stride;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < p.D; j += kBlock) {
    const float v = load_one(p.x, p.x_dtype, xo + j * cs);
    ss = fmaf(v, v, ss);
  }
  ss = cuda::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(p.n_div) + p.eps);
  if (threadIdx.x == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row), rstd);
  if (!p.y) return;
  const int64_t yo = p.y_rows.row_offset(row), ycs = p.y_rows.col_stride;
  for (int64_t j = threadIdx.x; j < p.D; j += kBlock)
    store_one(p.y, p.y_dtype, yo + j * ycs, load_one(p.x, p.x_dtype, xo + j * cs) * rstd);
}

// ------------------------------------------------------------------------------------------------------
// Backward: c = dot(dout, src) scaled per kind; dx = rstd * (dout - c * src) (kFactor: dx = src * k).

struct BwdCoef {
  float rstd, c, k;
};
__device__ __forceinline__ BwdCoef bwd_coef(const RowNormBwdParams& p, int64_t row, float dot, float dr) {
  const float rstd = load_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row));
  const float inv_n = 1.f / static_cast<float>(p.n_div);
  BwdCoef b{rstd, 0.f, 0.f};
  if (p.kind == RowNormBwdKind::kFactor) b.k = -dr * rstd * rstd * rstd * inv_n;
  else if (p.kind == RowNormBwdKind::kNormalizedSrc) b.c = dot * inv_n;
  else b.c = dot * rstd * rstd * inv_n;
  return b;
}
__device__ __forceinline__ float bwd_value(const RowNormBwdParams& p, const BwdCoef& b, float src, float g) {
  return p.kind == RowNormBwdKind::kFactor ? src * b.k : b.rstd * (g - b.c * src);
}

template <int kChunk, int TPR, int NV, int RPG>
__global__ void __launch_bounds__(kBlock) bwd_rows_in_group(const RowNormBwdParams p) {
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) / TPR * RPG;
  const int t = threadIdx.x % TPR;
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  float s[RPG][NV][kChunk], g[RPG][NV][kChunk];
  float dot[RPG];
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    const bool live = row0 + r < p.rows;
    const int64_t so = live ? p.src_rows.row_offset(row0 + r) : 0, go = live ? p.dout_rows.row_offset(row0 + r) : 0;
    dot[r] = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (t + k * TPR) * kChunk;
      if (live && c < p.D) {
        load_chunk(p.src, p.src_dtype, so + c, s[r][k]);
        if (!factor) {
          load_chunk(p.dout, p.dout_dtype, go + c, g[r][k]);
#pragma unroll
          for (int e = 0; e < kChunk; ++e) dot[r] = fmaf(g[r][k][e], s[r][k][e], dot[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPG; ++r) dot[r] = cuda::group_sum<TPR>(dot[r]);
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    const int64_t row = row0 + r;
    if (row >= p.rows) return;
    const BwdCoef b =
        bwd_coef(p, row, dot[r], factor ? load_one(p.dout, p.dout_dtype, p.dout_rows.row_offset(row)) : 0.f);
    const int64_t xo = p.dx_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (t + k * TPR) * kChunk;
      if (c < p.D) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) s[r][k][e] = bwd_value(p, b, s[r][k][e], factor ? 0.f : g[r][k][e]);
        store_chunk(p.dx, p.dx_dtype, xo + c, s[r][k]);
      }
    }
  }
}

template <int kChunk, int NV, int BT, int RPG>
__global__ void __launch_bounds__(BT) bwd_rows_in_block(const RowNormBwdParams p) {
  __shared__ float scratch[32];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * RPG;
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  float s[RPG][NV][kChunk], g[RPG][NV][kChunk];
  float dot[RPG];
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    const bool live = row0 + r < p.rows;
    const int64_t so = live ? p.src_rows.row_offset(row0 + r) : 0, go = live ? p.dout_rows.row_offset(row0 + r) : 0;
    dot[r] = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (threadIdx.x + k * BT) * kChunk;
      if (live && c < p.D) {
        load_chunk(p.src, p.src_dtype, so + c, s[r][k]);
        if (!factor) {
          load_chunk(p.dout, p.dout_dtype, go + c, g[r][k]);
#pragma unroll
          for (int e = 0; e < kChunk; ++e) dot[r] = fmaf(g[r][k][e], s[r][k][e], dot[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPG; ++r) dot[r] = cuda::block_sum(dot[r], scratch);
#pragma unroll
  for (int r = 0; r < RPG; ++r) {
    const int64_t row = row0 + r;
    if (row >= p.rows) return;
    const BwdCoef b =
        bwd_coef(p, row, dot[r], factor ? load_one(p.dout, p.dout_dtype, p.dout_rows.row_offset(row)) : 0.f);
    const int64_t xo = p.dx_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = (threadIdx.x + k * BT) * kChunk;
      if (c < p.D) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) s[r][k][e] = bwd_value(p, b, s[r][k][e], factor ? 0.f : g[r][k][e]);
        store_chunk(p.dx, p.dx_dtype, xo + c, s[r][k]);
      }
    }
  }
}

__global__ void __launch_bounds__(kBlock) bwd_rows_looped(const RowNormBwdParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  const int64_t so = p.src_rows.row_offset(row), go = p.dout_rows.row_offset(row), xo = p.dx_rows.row_offset(row);
  const int64_t scs = p.src_rows.col_stride, gcs = p.dout_rows.col_stride, xcs = p.dx_rows.col_stride;
  float dot = 0.f;
  if (!factor)
    for (int64_t j = threadIdx.x; j < p.D; j += kBlock)
      dot = fmaf(load_one(p.dout, p.dout_dtype, go + j * gcs), load_one(p.src, p.src_dtype, so + j * scs), dot);
  dot = cuda::block_sum(dot, scratch);
  const BwdCoef b = bwd_coef(p, row, dot, factor ? load_one(p.dout, p.dout_dtype, go) : 0.f);
  for (int64_t j = threadIdx.x; j < p.D; j += kBlock) {
    const float g = factor ? 0.f : load_one(p.dout, p.dout_dtype, go + j * gcs);
    store_one(p.dx, p.dx_dtype, xo + j * xcs, bwd_value(p, b, load_one(p.src, p.src_dtype, so + j * scs), g));
  }
}

// ------------------------------------------------------------------------------------------------------
// Streaming kernels (config.stream = 1): persistent, 16-byte packed accesses, the next rows prefetched.
//
// A row is cut into 16-byte vectors (4 f32 or 8 bf16/f16 elements); vector k of lane t of a row's team is
// vector k * TPR + t, so the TPR lanes of a team read TPR * 16 contiguous bytes per instruction (whole
// sectors, no half-used ones). Teams of TPR <= 32 lanes (GPB = 256 / TPR teams per block) or a block of TPR
// = 128/256/512 threads per row. A team handles RPG rows per iteration; the grid is at most one wave of
// resident blocks and each block walks the row groups with a grid stride, issuing the loads of its next
// iteration before it reduces the current one (2 x RPG x NV vectors per lane in flight at the peak), so the
// memory system sees a steady stream instead of waves of short-lived blocks. Loads stay packed (uint4) and
// are converted when used; the per-row rstd / dr of the backward are loaded with the rows (not after the
// reduction). One dtype for the row tensors (x, y; src, dout, dx); rstd any float dtype.

template <int TPR>
constexpr int stream_block() { return TPR > 32 ? TPR : kBlock; }

// hints (the streaming and packed kernels; config.hints bit 2, kHintedLoads): ld_stream's L1::no_allocate.L2::256B
// loads, the form of sessions 4-11; else plain ld.global.v4 (the default since s12run1).
template <int TPR, int NV, int RPG>
__global__ void __launch_bounds__(stream_block<TPR>()) fwd_stream(const RowNormFwdParams p, const bool hints) {
  constexpr bool kBlk = TPR > 32;
  constexpr int GPB = kBlk ? 1 : kBlock / TPR;  // row teams per block
  __shared__ float scratch[kBlk ? RPG * 32 : 1];
  const int t = kBlk ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % TPR);
  const int team = kBlk ? 0 : static_cast<int>(threadIdx.x / TPR);
  const int32_t dt = p.x_dtype;
  const int ve = cuda::vec16_elems(dt);
  const int64_t nvec = p.D / ve;
  const int64_t ngroups = (p.rows + RPG - 1) / RPG;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * GPB;
  const char* x = static_cast<const char*>(p.x);
  const int es = ve == 4 ? 4 : 2;
  const float n_div = static_cast<float>(p.n_div);

  // Loads of team group g (rows g * RPG + r) into buf; lanes of dead rows / vectors load nothing.
  auto load = [&](int64_t g, uint4 (&buf)[RPG][NV]) {
#pragma unroll
    for (int r = 0; r < RPG; ++r) {
      const int64_t row = g * RPG + r;
      if (g >= ngroups || row >= p.rows) continue;
      const char* xr = x + p.x_rows.row_offset(row) * es;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int64_t v = static_cast<int64_t>(k) * TPR + t;
        if (v < nvec) buf[r][k] = cuda::ld_vec16(xr + v * 16, hints);
      }
    }
  };

  int64_t it = static_cast<int64_t>(blockIdx.x) * GPB;  // the block's first team group (uniform)
  if (it >= ngroups) return;
  uint4 cur[RPG][NV], nxt[RPG][NV];
  load(it + team, cur);
  for (;;) {
    const int64_t nit = it + stride;
    const bool more = nit < ngroups;  // uniform across the block
    if (more) load(nit + team, nxt);
    const int64_t g = it + team;
    float ss[RPG];
#pragma unroll
    for (int r = 0; r < RPG; ++r) {
      ss[r] = 0.f;
      const int64_t row = g * RPG + r;
      if (g >= ngroups || row >= p.rows) continue;
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (static_cast<int64_t>(k) * TPR + t < nvec) ss[r] = cuda::vec16_dot(cur[r][k], cur[r][k], dt, ss[r]);
    }
    if constexpr (kBlk) {
      cuda::block_sum_n<RPG>(ss, scratch);
    } else {
#pragma unroll
      for (int r = 0; r < RPG; ++r) ss[r] = cuda::group_sum<TPR>(ss[r]);
    }
#pragma unroll
    for (int r = 0; r < RPG; ++r) {
      const int64_t row = g * RPG + r;
      if (g >= ngroups || row >= p.rows) continue;
      const float rstd = rsqrtf(ss[r] / n_div + p.eps);  // a division, as the classic kernels
      if (t == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row), rstd);
      if (!p.y) continue;
      char* yr = static_cast<char*>(p.y) + p.y_rows.row_offset(row) * es;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int64_t v = static_cast<int64_t>(k) * TPR + t;
        if (v < nvec)
          cuda::st_vec16(yr + v * 16, cuda::vec16_map(cur[r][k], cur[r][k], dt, [rstd](float a, float) { return a * rstd; }));
      }
    }
    if (!more) break;
#pragma unroll
    for (int r = 0; r < RPG; ++r)
#pragma unroll
      for (int k = 0; k < NV; ++k) cur[r][k] = nxt[r][k];
    it = nit;
  }
}

template <int TPR, int NV, int RPG>
__global__ void __launch_bounds__(stream_block<TPR>()) bwd_stream(const RowNormBwdParams p, const bool hints) {
  constexpr bool kBlk = TPR > 32;
  constexpr int GPB = kBlk ? 1 : kBlock / TPR;
  __shared__ float scratch[kBlk ? RPG * 32 : 1];
  const int t = kBlk ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % TPR);
  const int team = kBlk ? 0 : static_cast<int>(threadIdx.x / TPR);
  const int32_t dt = p.src_dtype;
  const int ve = cuda::vec16_elems(dt);
  const int64_t nvec = p.D / ve;
  const int64_t ngroups = (p.rows + RPG - 1) / RPG;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * GPB;
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  const int es = ve == 4 ? 4 : 2;

  // One iteration's loads: src (and dout) vectors, the row's rstd (and dr for kFactor).
  struct Buf {
    uint4 s[RPG][NV], g[RPG][NV];
    float rstd[RPG], dr[RPG];
  };
  auto load = [&](int64_t grp, Buf& b) {
#pragma unroll
    for (int r = 0; r < RPG; ++r) {
      const int64_t row = grp * RPG + r;
      b.rstd[r] = 0.f, b.dr[r] = 0.f;
      if (grp >= ngroups || row >= p.rows) continue;
      const char* sr = static_cast<const char*>(p.src) + p.src_rows.row_offset(row) * es;
      const char* gr = static_cast<const char*>(p.dout) + (factor ? 0 : p.dout_rows.row_offset(row) * es);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int64_t v = static_cast<int64_t>(k) * TPR + t;
        if (v < nvec) {
          b.s[r][k] = cuda::ld_vec16(sr + v * 16, hints);
          if (!factor) b.g[r][k] = cuda::ld_vec16(gr + v * 16, hints);
        }
      }
      b.rstd[r] = load_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row));
      if (factor) b.dr[r] = load_one(p.dout, p.dout_dtype, p.dout_rows.row_offset(row));
    }
  };

  int64_t it = static_cast<int64_t>(blockIdx.x) * GPB;
  if (it >= ngroups) return;
  Buf cur, nxt;
  load(it + team, cur);
  const float inv_n = 1.f / static_cast<float>(p.n_div);
  for (;;) {
    const int64_t nit = it + stride;
    const bool more = nit < ngroups;
    if (more) load(nit + team, nxt);
    const int64_t grp = it + team;
    float dot[RPG];
#pragma unroll
    for (int r = 0; r < RPG; ++r) {
      dot[r] = 0.f;
      const int64_t row = grp * RPG + r;
      if (factor || grp >= ngroups || row >= p.rows) continue;
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (static_cast<int64_t>(k) * TPR + t < nvec) dot[r] = cuda::vec16_dot(cur.g[r][k], cur.s[r][k], dt, dot[r]);
    }
    if (!factor) {  // uniform
      if constexpr (kBlk) {
        cuda::block_sum_n<RPG>(dot, scratch);
      } else {
#pragma unroll
        for (int r = 0; r < RPG; ++r) dot[r] = cuda::group_sum<TPR>(dot[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < RPG; ++r) {
      const int64_t row = grp * RPG + r;
      if (grp >= ngroups || row >= p.rows) continue;
      // The coefficients of bwd_coef, from the rstd / dr loaded with the row.
      const float rstd = cur.rstd[r];
      const float c = p.kind == RowNormBwdKind::kNormalizedSrc ? dot[r] * inv_n : dot[r] * rstd * rstd * inv_n;
      const float kf = -cur.dr[r] * rstd * rstd * rstd * inv_n;
      char* xr = static_cast<char*>(p.dx) + p.dx_rows.row_offset(row) * es;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int64_t v = static_cast<int64_t>(k) * TPR + t;
        if (v >= nvec) continue;
        const uint4 o = factor ? cuda::vec16_map(cur.s[r][k], cur.s[r][k], dt, [kf](float s, float) { return s * kf; })
                               : cuda::vec16_map(cur.s[r][k], cur.g[r][k], dt,
                                                 [rstd, c](float s, float g) { return rstd * (g - c * s); });
        cuda::st_vec16(xr + v * 16, o);
      }
    }
    if (!more) break;
    cur = nxt;
    it = nit;
  }
}

// ------------------------------------------------------------------------------------------------------
// Packed kernels (config.stream = 2): the layout of the streaming kernels (16-byte vectors kept packed in
// registers, vector k of lane t of a row at k * TPR + t, so each load instruction of a team covers whole
// sectors) on a plain grid: one row per team (TPR 4..32 lanes, 256 / TPR teams per block) or per block
// (TPR 128/256/512 threads), no persistent loop and no prefetch buffer. Registers are capped (40 for the
// common cases: 1536 threads per SM) so that many warps are resident: some keep loads in flight while others
// reduce and store (session-4 ncu: the classic lane-group kernel of l2norm bf16 D = 128 held 54 registers,
// 41% achieved occupancy, 16 floats per lane per row, and its half-sector loads kept L2 at 91%; here a lane
// holds NV uint4 of x, 4 * NV registers, and each warp load covers whole sectors).
// A grid-stride loop over row slots (uniform per block) keeps the grid within limits for any row count.

// Row offsets of the packed kernels: they take only equally spaced rows (RowLayout::uniform(), nd <= 1: every
// contiguous or row-padded tensor; host-checked), so no 64-bit division (RowLayout::row_offset's general
// path, a subroutine per dimension) and none of its registers are in the kernel. nd == 0 is a single row.
__device__ __forceinline__ int64_t row_off(const RowLayout& l, int64_t r) { return l.base + r * l.strides[0]; }

// Minimum resident blocks per SM asked of ptxas (__launch_bounds__) for at most `regs` registers per thread.
// Forward: 40 (48 with 4 vectors per lane); backward (two row tensors): 40 / 64 / 80 for 1 / 2 / 4 vectors.
// A cap of 32 (the whole SM) made ptxas spill 40-84 bytes per thread in every instance (sm_90a, nvcc 13).
template <int TPR>
constexpr int packed_min_blocks(int regs) {
  return 65536 / (regs * stream_block<TPR>());
}

template <int TPR, int NV>
__global__ void __launch_bounds__(stream_block<TPR>(), packed_min_blocks<TPR>(NV <= 2 ? 40 : 48))
    fwd_packed(const RowNormFwdParams p, const bool hints) {
  constexpr bool kBlk = TPR > 32;
  constexpr int GPB = kBlk ? 1 : kBlock / TPR;  // rows per block per step
  __shared__ float scratch[32];
  const int t = kBlk ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % TPR);
  const int team = kBlk ? 0 : static_cast<int>(threadIdx.x / TPR);
  const int32_t dt = p.x_dtype;
  const int ve = cuda::vec16_elems(dt);
  const int es = ve == 4 ? 4 : 2;
  const int nvec = static_cast<int>(p.D / ve);  // <= 2048 (config_reject)
  const float n_div = static_cast<float>(p.n_div);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * GPB; r0 < p.rows; r0 += static_cast<int64_t>(gridDim.x) * GPB) {
    const int64_t row = r0 + team;
    // Lanes of a team past the last row stay for the shuffles (full-warp masks) but touch no memory.
    const bool live = row < p.rows;
    const char* xr = static_cast<const char*>(p.x) + (live ? row_off(p.x_rows, row) * es : 0);
    uint4 v[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = k * TPR + t;
      v[k] = live && i < nvec ? cuda::ld_vec16(xr + static_cast<int64_t>(i) * 16, hints) : make_uint4(0, 0, 0, 0);
    }
    float ss = 0.f;  // zero vectors add nothing: one fma chain per lane, in k order
#pragma unroll
    for (int k = 0; k < NV; ++k) ss = cuda::vec16_dot(v[k], v[k], dt, ss);
    if constexpr (kBlk) ss = cuda::block_sum(ss, scratch);
    else ss = cuda::group_sum<TPR>(ss);
    if (!live) continue;
    const float rstd = rsqrtf(ss / n_div + p.eps);  // a division, as the other kernels
    if (t == 0) store_one(p.rstd, p.rstd_dtype, row_off(p.rstd_rows, row), rstd);
    if (!p.y) continue;
    char* yr = static_cast<char*>(p.y) + row_off(p.y_rows, row) * es;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = k * TPR + t;
      if (i < nvec)
        cuda::st_vec16(yr + static_cast<int64_t>(i) * 16,
                       cuda::vec16_map(v[k], v[k], dt, [rstd](float a, float) { return a * rstd; }));
    }
  }
}

template <int TPR, int NV>
__global__ void __launch_bounds__(stream_block<TPR>(), packed_min_blocks<TPR>(NV == 1 ? 40 : NV == 2 ? 64 : 80))
    bwd_packed(const RowNormBwdParams p, const bool hints) {
  constexpr bool kBlk = TPR > 32;
  constexpr int GPB = kBlk ? 1 : kBlock / TPR;
  __shared__ float scratch[32];
  const int t = kBlk ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % TPR);
  const int team = kBlk ? 0 : static_cast<int>(threadIdx.x / TPR);
  const int32_t dt = p.src_dtype;
  const int ve = cuda::vec16_elems(dt);
  const int es = ve == 4 ? 4 : 2;
  const int nvec = static_cast<int>(p.D / ve);
  const bool factor = p.kind == RowNormBwdKind::kFactor;
  const float inv_n = 1.f / static_cast<float>(p.n_div);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * GPB; r0 < p.rows; r0 += static_cast<int64_t>(gridDim.x) * GPB) {
    const int64_t row = r0 + team;
    const bool live = row < p.rows;
    const char* sr = static_cast<const char*>(p.src) + (live ? row_off(p.src_rows, row) * es : 0);
    const char* gr = static_cast<const char*>(p.dout) + (live && !factor ? row_off(p.dout_rows, row) * es : 0);
    uint4 s[NV], g[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = k * TPR + t;
      const bool in = live && i < nvec;
      s[k] = in ? cuda::ld_vec16(sr + static_cast<int64_t>(i) * 16, hints) : make_uint4(0, 0, 0, 0);
      g[k] = in && !factor ? cuda::ld_vec16(gr + static_cast<int64_t>(i) * 16, hints) : make_uint4(0, 0, 0, 0);
    }
    // The row's rstd (and dr for kFactor) with the row's loads, not after the reduction.
    const float rstd = live ? load_one(p.rstd, p.rstd_dtype, row_off(p.rstd_rows, row)) : 0.f;
    const float dr = live && factor ? load_one(p.dout, p.dout_dtype, row_off(p.dout_rows, row)) : 0.f;
    float dot = 0.f;
    if (!factor) {  // uniform
#pragma unroll
      for (int k = 0; k < NV; ++k) dot = cuda::vec16_dot(g[k], s[k], dt, dot);
      if constexpr (kBlk) dot = cuda::block_sum(dot, scratch);
      else dot = cuda::group_sum<TPR>(dot);
    }
    if (!live) continue;
    // The coefficients of bwd_coef.
    const float c = p.kind == RowNormBwdKind::kNormalizedSrc ? dot * inv_n : dot * rstd * rstd * inv_n;
    const float kf = -dr * rstd * rstd * rstd * inv_n;
    char* xr = static_cast<char*>(p.dx) + row_off(p.dx_rows, row) * es;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = k * TPR + t;
      if (i >= nvec) continue;
      const uint4 o = factor ? cuda::vec16_map(s[k], s[k], dt, [kf](float a, float) { return a * kf; })
                             : cuda::vec16_map(s[k], g[k], dt, [rstd, c](float a, float b) { return rstd * (b - c * a); });
      cuda::st_vec16(xr + static_cast<int64_t>(i) * 16, o);
    }
  }
}

// ------------------------------------------------------------------------------------------------------
// Bulk-copy kernels (config.stream = 3, sm_90): a persistent grid whose blocks stream tiles of `rps`
// consecutive rows from global into a ring of `ns` shared-memory stages with the Hopper bulk-copy engine
// (cp.async.bulk, completion counted in bytes on one mbarrier per stage), so every SM keeps ns - 1 tiles of
// loads in flight while its threads reduce and store the oldest one; there is no wave tail (each block runs
// the same number of tiles, up to one). A tile of dense rows is one contiguous span: one copy per tensor per
// stage (forward: x; backward: src and dout), issued by thread 0, with an L2 evict-first hint (each byte is
// read once). Teams of TPR lanes (8/16/32, inside a warp) take the tile's rows in turn; lane t of a team
// handles the row's 16-byte vectors t, t + TPR, ... (one fma chain per lane in vector order, then the fixed
// shuffle tree: the packed kernels' order for the same TPR, deterministic), reading them from shared memory
// twice (sum, then scale) so any row length that fits a stage works without register arrays. Results are
// stored from registers (16-byte stores). The backward's per-row rstd of tile i + 1 is loaded into registers
// while tile i is processed and handed over through shared memory at the tile's closing __syncthreads.
// Shapes the host picks for the targets: l2norm D = 128 bf16: teams of 8, 128 rows (32 KiB) per stage,
// 3 stages, 256 threads; rmsnorm D = 4096 bf16: a warp per row, 4 rows per stage, 128 threads.

// Dynamic shared memory: [8 mbarriers (64 B) | pad][2 x 256 floats of rstd (backward)][stages...]
constexpr int kBulkMaxStages = 4;
constexpr int kBulkMaxRows = 256;  // rows per stage (<= threads per block, for the rstd hand-over)
constexpr int kBulkHeader = 128 + 2 * kBulkMaxRows * 4;  // 2176 = 17 x 128: stages stay 128-byte aligned
constexpr int kBulkMaxSmem = 227 * 1024;                 // the sm_90 opt-in limit per block

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bulk_bar_init(uint64_t* bar, uint32_t count) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}
// Makes the initialised barriers visible to the bulk-copy unit (async proxy) and the other threads.
__device__ __forceinline__ void bulk_bar_init_fence() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// One arrival (the barrier counts 1 per phase) that also announces `bytes` of copies completing on it.
__device__ __forceinline__ void bulk_bar_arrive_tx(uint64_t* bar, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
#endif
}
// Spins until the barrier's phase with parity `parity` has completed (every byte of the stage arrived).
__device__ __forceinline__ void bulk_bar_wait(uint64_t* bar, uint32_t parity) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "BULK_WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra BULK_WAIT;\n\t}" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t pol = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
  return pol;
}
// Global -> shared copy of `bytes` (a multiple of 16; both addresses 16-byte aligned), completing on `bar`,
// with the L2 policy `pol` when `hint` (else the default policy).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol,
                                          bool hint) {
#if __CUDA_ARCH__ >= 900
  if (hint)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
        : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}
// A 16-byte store, with the streaming (evict-first) policy st.global.cs when `cs`.
__device__ __forceinline__ void bulk_store16(void* p, const uint4& v, bool cs) {
  if (cs)
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  else
    cuda::st_vec16(p, v);
}
// config.hints of the bulk kernels: bit 0 stores with st.global.cs, bit 1 loads without the evict-first hint.
constexpr int kBulkHintStoreCs = 1, kBulkHintNoLoadPolicy = 2;

template <int TPR>
__global__ void __launch_bounds__(256) fwd_bulk(const RowNormFwdParams p, int rps, int ns, int hints) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char bulk_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(bulk_smem);
  unsigned char* stages = bulk_smem + kBulkHeader;
  const int32_t dt = p.x_dtype;
  const int ve = cuda::vec16_elems(dt), es = ve == 4 ? 4 : 2;
  const int nvec = static_cast<int>(p.D / ve);  // row length in 16-byte vectors (host: a stage holds rps rows)
  const uint32_t row_bytes = static_cast<uint32_t>(nvec) * 16u;
  const uint32_t stage_bytes = row_bytes * static_cast<uint32_t>(rps);
  const int64_t ntiles = (p.rows + rps - 1) / rps;
  const int64_t first = blockIdx.x, stride = gridDim.x;
  const int64_t count = first < ntiles ? (ntiles - 1 - first) / stride + 1 : 0;
  const int t = static_cast<int>(threadIdx.x) % TPR, team = static_cast<int>(threadIdx.x) / TPR;
  const int nteams = static_cast<int>(blockDim.x) / TPR;
  const char* x = static_cast<const char*>(p.x) + p.x_rows.base * es;  // dense rows: row r at x + r * row_bytes
  const float n_div = static_cast<float>(p.n_div);
  const bool cs = hints & kBulkHintStoreCs;

  // Tile i of this block into stage i % ns (thread 0 only).
  auto issue = [&](int64_t i, uint64_t pol) {
    const int64_t r0 = (first + i * stride) * rps;
    const uint32_t n = static_cast<uint32_t>(min(static_cast<int64_t>(rps), p.rows - r0));
    const int s = static_cast<int>(i % ns);
    bulk_bar_arrive_tx(&full[s], n * row_bytes);
    bulk_load(stages + static_cast<size_t>(s) * stage_bytes, x + r0 * row_bytes, n * row_bytes, &full[s], pol,
              !(hints & kBulkHintNoLoadPolicy));
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; ++s) bulk_bar_init(&full[s], 1);
    bulk_bar_init_fence();
    const uint64_t pol = l2_evict_first_policy();
    for (int64_t i = 0; i < min(static_cast<int64_t>(ns), count); ++i) issue(i, pol);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  for (int64_t i = 0; i < count; ++i) {
    const int s = static_cast<int>(i % ns);
    const int64_t r0 = (first + i * stride) * rps;
    const int n = static_cast<int>(min(static_cast<int64_t>(rps), p.rows - r0));
    bulk_bar_wait(&full[s], static_cast<uint32_t>((i / ns) & 1));
    const uint4* tile = reinterpret_cast<const uint4*>(stages + static_cast<size_t>(s) * stage_bytes);
    // Every team of the block runs the same trip count (the shuffles need whole warps).
    const int trips = (n + nteams - 1) / nteams;
    for (int j = 0; j < trips; ++j) {
      const int r = team + j * nteams;
      const bool live = r < n;
      const uint4* xr = tile + static_cast<size_t>(live ? r : 0) * nvec;
      float ss = 0.f;
      if (live)
        for (int v = t; v < nvec; v += TPR) {
          const uint4 a = xr[v];
          ss = cuda::vec16_dot(a, a, dt, ss);
        }
      ss = cuda::group_sum<TPR>(ss);
      if (!live) continue;
      const int64_t row = r0 + r;
      const float rstd = rsqrtf(ss / n_div + p.eps);  // a division, as the other kernels
      if (t == 0) store_one(p.rstd, p.rstd_dtype, row_off(p.rstd_rows, row), rstd);
      if (!p.y) continue;
      char* yr = static_cast<char*>(p.y) + row_off(p.y_rows, row) * es;
      for (int v = t; v < nvec; v += TPR)
        bulk_store16(yr + static_cast<int64_t>(v) * 16,
                     cuda::vec16_map(xr[v], xr[v], dt, [rstd](float a, float) { return a * rstd; }), cs);
    }
    __syncthreads();  // every thread is done reading stage s
    if (threadIdx.x == 0 && i + ns < count) issue(i + ns, l2_evict_first_policy());
  }
#else
  __trap();  // the host rejects the bulk configurations below sm_90
#endif
}

template <int TPR>
__global__ void __launch_bounds__(256) bwd_bulk(const RowNormBwdParams p, int rps, int ns, int hints) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char bulk_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(bulk_smem);
  float* rs = reinterpret_cast<float*>(bulk_smem + 128);  // [2][kBulkMaxRows]: rstd of the current / next tile
  unsigned char* stages = bulk_smem + kBulkHeader;
  const int32_t dt = p.src_dtype;
  const int ve = cuda::vec16_elems(dt), es = ve == 4 ? 4 : 2;
  const int nvec = static_cast<int>(p.D / ve);
  const uint32_t row_bytes = static_cast<uint32_t>(nvec) * 16u;
  const uint32_t half_bytes = row_bytes * static_cast<uint32_t>(rps);  // src rows, then dout rows
  const uint32_t stage_bytes = 2 * half_bytes;
  const int64_t ntiles = (p.rows + rps - 1) / rps;
  const int64_t first = blockIdx.x, stride = gridDim.x;
  const int64_t count = first < ntiles ? (ntiles - 1 - first) / stride + 1 : 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int t = tid % TPR, team = tid / TPR, nteams = static_cast<int>(blockDim.x) / TPR;
  const char* src = static_cast<const char*>(p.src) + p.src_rows.base * es;
  const char* dout = static_cast<const char*>(p.dout) + p.dout_rows.base * es;
  const float inv_n = 1.f / static_cast<float>(p.n_div);
  const bool normalized = p.kind == RowNormBwdKind::kNormalizedSrc;  // else kRawSrc (kFactor: host-rejected)
  const bool cs = hints & kBulkHintStoreCs;

  auto issue = [&](int64_t i, uint64_t pol) {
    const int64_t r0 = (first + i * stride) * rps;
    const uint32_t n = static_cast<uint32_t>(min(static_cast<int64_t>(rps), p.rows - r0));
    const int s = static_cast<int>(i % ns);
    unsigned char* st = stages + static_cast<size_t>(s) * stage_bytes;
    bulk_bar_arrive_tx(&full[s], 2 * n * row_bytes);
    const bool hint = !(hints & kBulkHintNoLoadPolicy);
    bulk_load(st, src + r0 * row_bytes, n * row_bytes, &full[s], pol, hint);
    bulk_load(st + half_bytes, dout + r0 * row_bytes, n * row_bytes, &full[s], pol, hint);
  };
  // rstd of row `tid` of tile i (0 past the end); rps <= blockDim.x (host).
  auto rstd_of = [&](int64_t i) {
    if (i >= count || tid >= rps) return 0.f;
    const int64_t row = (first + i * stride) * rps + tid;
    return row < p.rows ? load_one(p.rstd, p.rstd_dtype, row_off(p.rstd_rows, row)) : 0.f;
  };
  if (tid == 0) {
    for (int s = 0; s < ns; ++s) bulk_bar_init(&full[s], 1);
    bulk_bar_init_fence();
    const uint64_t pol = l2_evict_first_policy();
    for (int64_t i = 0; i < min(static_cast<int64_t>(ns), count); ++i) issue(i, pol);
  }
  if (tid < rps) rs[tid] = rstd_of(0);
  __syncthreads();  // barriers initialised, rstd of the first tile in place

  for (int64_t i = 0; i < count; ++i) {
    const float rs_next = rstd_of(i + 1);  // in flight while this tile is processed
    const int s = static_cast<int>(i % ns);
    const int64_t r0 = (first + i * stride) * rps;
    const int n = static_cast<int>(min(static_cast<int64_t>(rps), p.rows - r0));
    const float* rcur = rs + (i & 1) * kBulkMaxRows;
    bulk_bar_wait(&full[s], static_cast<uint32_t>((i / ns) & 1));
    const uint4* tsrc = reinterpret_cast<const uint4*>(stages + static_cast<size_t>(s) * stage_bytes);
    const uint4* tdout = reinterpret_cast<const uint4*>(stages + static_cast<size_t>(s) * stage_bytes + half_bytes);
    const int trips = (n + nteams - 1) / nteams;
    for (int j = 0; j < trips; ++j) {
      const int r = team + j * nteams;
      const bool live = r < n;
      const size_t ro = static_cast<size_t>(live ? r : 0) * nvec;
      float dot = 0.f;
      if (live)
        for (int v = t; v < nvec; v += TPR) dot = cuda::vec16_dot(tdout[ro + v], tsrc[ro + v], dt, dot);
      dot = cuda::group_sum<TPR>(dot);
      if (!live) continue;
      const int64_t row = r0 + r;
      // The coefficients of bwd_coef.
      const float rstd = rcur[r];
      const float c = normalized ? dot * inv_n : dot * rstd * rstd * inv_n;
      char* xr = static_cast<char*>(p.dx) + row_off(p.dx_rows, row) * es;
      for (int v = t; v < nvec; v += TPR)
        bulk_store16(xr + static_cast<int64_t>(v) * 16,
                     cuda::vec16_map(tsrc[ro + v], tdout[ro + v], dt,
                                     [rstd, c](float a, float b) { return rstd * (b - c * a); }),
                     cs);
    }
    if (tid < rps) rs[((i + 1) & 1) * kBulkMaxRows + tid] = rs_next;  // that half was last read in tile i - 1
    __syncthreads();  // stage s and rs[i & 1] fully read; rs[(i + 1) & 1] written
    if (tid == 0 && i + ns < count) issue(i + ns, l2_evict_first_policy());
  }
#else
  __trap();
#endif
}

// ------------------------------------------------------------------------------------------------------
// Host side: configurations and launches.

// Whether a row tensor allows chunk accesses of ce elements: unit column stride, every row start a multiple
// of ce elements, base pointer 16-byte aligned.
bool chunkable(const void* ptr, const RowLayout& l, int ce) {
  if (l.col_stride != 1 || l.base % ce != 0) return false;
  for (int i = 0; i < l.nd; ++i)
    if (l.strides[i] % ce != 0 && l.sizes[i] > 1) return false;
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

int max_elem_bytes(std::initializer_list<int32_t> dtypes) {
  int b = 2;
  for (int32_t d : dtypes)
    if (d == STRATA_DTYPE_F32) b = 4;
  return b;
}

// The launchable (CE, TPR, NV, RPG) set; kMaxGroupNv bounds the registers a lane holds (bwd keeps two rows).
// The streaming instances: lane teams of 4..32 with 1, 2 or 4 vectors per lane (two rows per iteration for
// 1 or 2), blocks of 128/256/512 threads with 1, 2 or 4 vectors per thread and one row per iteration.
bool stream_known(const RowNormCudaConfig& c) {
  const bool nv_ok = c.nv == 1 || c.nv == 2 || c.nv == 4;
  if (c.tpr == 4 || c.tpr == 8 || c.tpr == 16 || c.tpr == 32) return nv_ok && (c.rpg == 1 || (c.rpg == 2 && c.nv <= 2));
  if (c.tpr == 128 || c.tpr == 256 || c.tpr == 512) return nv_ok && c.rpg == 1;
  return false;
}

// The packed instances: teams of 4..32 lanes or blocks of 128/256/512 threads, 1, 2 or 4 vectors per lane,
// one row per team.
bool packed_known(const RowNormCudaConfig& c) {
  return (c.tpr == 4 || c.tpr == 8 || c.tpr == 16 || c.tpr == 32 || c.tpr == 128 || c.tpr == 256 || c.tpr == 512) &&
         (c.nv == 1 || c.nv == 2 || c.nv == 4) && c.rpg == 1;
}

// The bulk-copy instances: teams of 8/16/32 lanes; nv = 2..4 stages of rpg = 1..256 rows (run-time values).
bool bulk_known(const RowNormCudaConfig& c) {
  return (c.tpr == 8 || c.tpr == 16 || c.tpr == 32) && c.nv >= 2 && c.nv <= kBulkMaxStages && c.rpg >= 1 &&
         c.rpg <= kBulkMaxRows && c.hints >= 0 && c.hints <= 3;
}

bool known_config(const RowNormCudaConfig& c, int max_group_nv) {
  if (c.max_blocks < 0) return false;
  // cache hints: bulk, multi, tma; hinted loads (kHintedLoads): streaming and packed
  if (c.hints != 0 && c.stream != 3 && c.stream != 4 && c.stream != 5 &&
      !((c.stream == 1 || c.stream == 2) && c.hints == kHintedLoads))
    return false;
  if (c.blocks_per_sm != 0 && c.stream != 4) return false;           // persistent grids: multi-row kernels
  if (c.stream == 5) return row_norm_tma_known(c);
  if (c.stream == 4) return row_norm_multi_known(c) && c.hints >= 0 && c.hints <= 3 && c.blocks_per_sm >= 0;
  if (c.stream == 3) return bulk_known(c);
  if (c.stream == 2) return packed_known(c);
  if (c.stream) return c.stream == 1 && stream_known(c);
  if (c.tpr == 0) return true;
  if (c.chunk_elems != 8 && c.chunk_elems != 16) return false;
  if (c.tpr == 128 || c.tpr == 256 || c.tpr == 512) {
    if (c.rpg == 2) return c.tpr != 512 && (c.nv == 1 || c.nv == 2);
    return c.rpg == 1 && (c.nv == 1 || c.nv == 2 || c.nv == 4);
  }
  if (c.tpr < 32)
    return (c.tpr == 1 || c.tpr == 2 || c.tpr == 4 || c.tpr == 8 || c.tpr == 16) && c.nv == 1 &&
           (c.rpg == 1 || c.rpg == 2 || c.rpg == 4);
  return c.tpr == 32 && c.rpg == 1 && (c.nv == 1 || c.nv == 2 || c.nv == 4 || (c.nv == 8 && max_group_nv >= 8));
}

// What a streaming configuration needs of the problem: `dtype` the row tensors' dtype, `same` whether they all
// have it, `vec_ok` whether they allow whole aligned 16-byte vectors (chunkable with that many elements).
struct StreamFacts {
  int32_t dtype = STRATA_DTYPE_F32;
  bool same = false, vec_ok = false;
  bool uniform = false;  // every row tensor (and rstd / dr) has equally spaced rows (the packed kernels need it)
  bool dense = false;    // the row tensors read in tiles (x; src, dout) have row r at base + r * D (bulk kernels)
  bool out_dense = false;  // the forward's y (if any) has row r at base + r * D (TMA kernels: tiles stored whole)
  bool bulk_kind = true;  // the backward kind is one the bulk kernels compute (not kFactor)
  int tensors = 1;       // row tensors read per row (1 forward, 2 backward): a bulk stage holds them all
};

// Threads per block of a bulk configuration: the teams of one stage's rows, at most 256, whole warps.
int bulk_threads(int tpr, int rps) { return static_cast<int>(std::min<int64_t>(256, (int64_t{rps} * tpr + 31) / 32 * 32)); }
// Dynamic shared memory of a bulk configuration: header + ns stages of rps rows of every tensor read.
int64_t bulk_smem_bytes(int64_t D, int32_t dtype, int tensors, int rps, int ns) {
  return kBulkHeader + int64_t{ns} * rps * tensors * (D / cuda::vec16_elems(dtype)) * 16;
}
// Whether the current device has the bulk-copy engine (sm_90 and newer).
bool device_has_bulk_copy() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 9;
}
bool dense_rows(const RowLayout& l, int64_t D) { return l.uniform() && (l.nd == 0 || l.sizes[0] <= 1 || l.strides[0] == D); }

std::string config_reject(const RowNormCudaConfig& c, int64_t D, bool chunk_ok, int max_group_nv,
                          const StreamFacts& sf) {
  if (!known_config(c, max_group_nv))
    return "no kernel instance for chunk_elems=" + std::to_string(c.chunk_elems) + " tpr=" + std::to_string(c.tpr) +
           " nv=" + std::to_string(c.nv) + " rpg=" + std::to_string(c.rpg) + " stream=" + std::to_string(c.stream) +
           " max_blocks=" + std::to_string(c.max_blocks);
  if (c.stream == 2 && !sf.uniform) return "the packed kernels need equally spaced rows (mergeable leading dimensions)";
  if (c.stream == 4) {
    if (sf.tensors != 1) return "the multi-row kernels are forward only";
    if (!sf.uniform) return "the multi-row kernels need equally spaced rows (mergeable leading dimensions)";
  }
  if (c.stream == 5) {
    const int ve = cuda::vec16_elems(sf.dtype);
    if (sf.tensors != 1) return "the TMA kernels are forward only";
    if (!sf.same) return "the TMA kernels need one dtype for x and y";
    if (D == 0 || D % ve != 0 || !sf.vec_ok) return "rows cannot be read in aligned 16-byte vectors";
    if (!sf.uniform || !sf.dense || !sf.out_dense)
      return "the TMA kernels need dense rows (row stride D) in x and y and equally spaced rstd";
    if (c.nv > 0 && static_cast<int64_t>(c.tpr) * c.nv * ve < D) return "the configuration does not cover D";
    const int64_t smem = row_norm_tma_smem_bytes(D / ve, c.rpg);
    if (smem > kTmaMaxSmem)
      return "a tile of " + std::to_string(smem) + " bytes exceeds the " + std::to_string(kTmaMaxSmem) +
             " bytes of shared memory of a TMA block";
    if (!device_has_bulk_copy()) return "the TMA kernels need sm_90 (cp.async.bulk)";
    return {};
  }
  if (c.stream == 3) {
    const int ve = cuda::vec16_elems(sf.dtype);
    if (!sf.same) return "the bulk-copy kernels need one dtype for every row tensor";
    if (D == 0 || D % ve != 0 || !sf.vec_ok) return "rows cannot be read in aligned 16-byte vectors";
    if (!sf.uniform || !sf.dense) return "the bulk-copy kernels need dense rows (row stride D) in the tensors they read";
    if (!sf.bulk_kind) return "the bulk-copy backward computes kNormalizedSrc and kRawSrc only";
    const int64_t smem = bulk_smem_bytes(D, sf.dtype, sf.tensors, c.rpg, c.nv);
    if (smem > kBulkMaxSmem)
      return "a stage ring of " + std::to_string(smem) + " bytes exceeds the " + std::to_string(kBulkMaxSmem) +
             " bytes of shared memory a block may have";
    if (!device_has_bulk_copy()) return "the bulk-copy kernels need sm_90 (cp.async.bulk)";
    return {};
  }
  if (c.stream) {
    const int ve = cuda::vec16_elems(sf.dtype);
    if (!sf.same) return "the streaming kernels need one dtype for every row tensor";
    if (D % ve != 0 || !sf.vec_ok) return "rows cannot be read in aligned 16-byte vectors";
    if (static_cast<int64_t>(c.tpr) * c.nv * ve < D) return "the configuration does not cover D";
    return {};
  }
  if (c.tpr == 0) return {};
  if (D % c.chunk_elems != 0 || !chunk_ok) return "rows cannot be read in chunks of " + std::to_string(c.chunk_elems);
  if (static_cast<int64_t>(c.tpr) * c.nv * c.chunk_elems < D) return "the configuration does not cover D";
  return {};
}

// chunk_ok(ce): whether the tensors allow chunks of ce elements.
template <class ChunkOk>
RowNormCudaConfig pick(int64_t D, int elem_bytes, ChunkOk chunk_ok, int max_group_nv) {
  RowNormCudaConfig c;
  c.chunk_elems = elem_bytes == 4 ? 8 : 16;
  // f32 rows too long for 8-element chunks in one block's registers use 16-element chunks.
  if (c.chunk_elems == 8 && D > 8LL * 512 * 4) c.chunk_elems = 16;
  if (!chunk_ok(c.chunk_elems) || D % c.chunk_elems != 0) return c;  // looped
  const int64_t chunks = D / c.chunk_elems;
  if (chunks <= 32LL * max_group_nv) {
    int tpr = 1;
    while (tpr < chunks && tpr < 32) tpr *= 2;
    int nv = 1;
    while (static_cast<int64_t>(tpr) * nv < chunks) nv *= 2;
    c.tpr = tpr;
    c.nv = nv;
  } else if (chunks <= 512 * 4LL) {
    // One block per row with two chunks per thread where possible: on the H200 (bench/row_norm_cuda_sweep,
    // 2026-11-29) fewer, busier threads per row beat one chunk per thread for D = 4096 (1.30x vs 1.37x floor).
    c.tpr = chunks <= 2 * 128 ? 128 : chunks <= 2 * 256 ? 256 : 512;
    c.nv = static_cast<int>((chunks + c.tpr - 1) / c.tpr);
    c.nv = c.nv <= 1 ? 1 : c.nv <= 2 ? 2 : 4;
  }
  return c;
}

int pow2ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The default streaming configuration, or tpr 0 when the streaming kernels do not apply. Rows of up to 128
// vectors (2 KiB): teams with two vectors per lane where the row allows (two rows per iteration), 4..32
// lanes; longer rows (up to 2048 vectors, 32 KiB): a block per row with up to four vectors per thread (128
// threads x 4 vectors for D = 4096 bf16: the byte count per thread the session-2 sweep found best for the
// classic kernels, now with the next row in flight). Rows of fewer than 4 vectors stay on the classic lane
// groups (a team of 4 would idle).
RowNormCudaConfig pick_stream(int64_t D, const StreamFacts& sf) {
  RowNormCudaConfig c;
  const int ve = cuda::vec16_elems(sf.dtype);
  if (!sf.same || !sf.vec_ok || D % ve != 0) return c;
  const int64_t nvec = D / ve;
  if (nvec < 4 || nvec > 512 * 4) return c;
  c.stream = 1;
  if (nvec <= 32 * 4) {
    c.tpr = std::min(32, std::max(4, pow2ceil(nvec) / 2));
    c.nv = pow2ceil((nvec + c.tpr - 1) / c.tpr);
    c.rpg = c.nv <= 2 ? 2 : 1;
  } else {
    c.tpr = nvec <= 128 * 4 ? 128 : nvec <= 256 * 4 ? 256 : 512;
    c.nv = pow2ceil((nvec + c.tpr - 1) / c.tpr);
    c.rpg = 1;
  }
  return c;
}

// The default packed configuration, or tpr 0 when the packed kernels do not apply (as pick_stream: one
// dtype, whole aligned 16-byte vectors, 4..2048 vectors per row). Two vectors per lane where the row has 8 or
// more (32 bytes in flight per lane, the classic kernels' measured best, at full occupancy): D = 128 bf16 ->
// teams of 8 lanes x 2; rows of 65..128 vectors: a warp x 4; longer rows: a block of 128..512 threads x 2
// (D = 4096 bf16 -> 256 x 2, f32 -> 512 x 2), x 4 above 1024 vectors.
RowNormCudaConfig pick_packed(int64_t D, const StreamFacts& sf) {
  RowNormCudaConfig c;
  const int ve = cuda::vec16_elems(sf.dtype);
  if (!sf.same || !sf.vec_ok || !sf.uniform || D % ve != 0) return c;
  const int64_t nvec = D / ve;
  if (nvec < 4 || nvec > 512 * 4) return c;
  c.stream = 2;
  c.rpg = 1;
  if (nvec < 8) {
    c.tpr = static_cast<int>(std::max<int64_t>(4, pow2ceil(nvec)));
    c.nv = 1;
  } else if (nvec <= 32 * 2) {
    c.tpr = pow2ceil(nvec) / 2;
    c.nv = 2;
  } else if (nvec <= 32 * 4) {
    c.tpr = 32;
    c.nv = 4;
  } else if (nvec <= 512 * 2) {
    c.tpr = std::max(128, pow2ceil(nvec) / 2);
    c.nv = 2;
  } else {
    c.tpr = 512;
    c.nv = 4;
  }
  return c;
}

// The bulk-copy configuration for a row of D elements, or tpr 0 when the bulk kernels do not apply: teams of 8
// lanes for rows of up to 16 vectors (D = 128 bf16: two vectors per lane), 16 up to 32, else a warp per row;
// stages of about 32 KiB (at least 4 rows, at most 64 KiB or 256 rows), 3 of them (about 98 KiB: two blocks
// per SM), fewer where the ring would not fit. Not a default anywhere yet (forced rows of atk and the sweep).
RowNormCudaConfig pick_bulk(int64_t D, const StreamFacts& sf) {
  RowNormCudaConfig c;
  const int ve = cuda::vec16_elems(sf.dtype);
  if (!sf.same || !sf.vec_ok || !sf.uniform || !sf.dense || !sf.bulk_kind || D == 0 || D % ve != 0) return c;
  const int64_t nvec = D / ve, row_bytes = nvec * 16 * sf.tensors;
  if (row_bytes > 65536) return c;
  c.stream = 3;
  c.tpr = nvec <= 16 ? 8 : nvec <= 32 ? 16 : 32;
  int64_t rps = std::clamp<int64_t>(32768 / row_bytes, 4, kBulkMaxRows);
  while (rps > 1 && rps * row_bytes > 65536) --rps;
  c.rpg = static_cast<int>(rps);
  c.nv = 3;
  while (c.nv > 2 && bulk_smem_bytes(D, sf.dtype, sf.tensors, c.rpg, c.nv) > kBulkMaxSmem) --c.nv;
  return c;
}

// One packed instance: a team (or block) per row on a plain grid, capped at 2^31 - 1 blocks (and at
// max_blocks when set); the kernels walk the rest with a grid stride.
template <class K, int TPR, int NV>
strata_status launch_packed_inst(const typename K::Params& p, const RowNormCudaConfig& c, cudaStream_t s) {
  constexpr int BT = stream_block<TPR>(), GPB = TPR > 32 ? 1 : kBlock / TPR;
  if (p.rows == 0) return STRATA_SUCCESS;
  int64_t grid = std::min<int64_t>(cuda::ceil_div(p.rows, GPB), 0x7fffffff);
  if (c.max_blocks > 0) grid = std::min<int64_t>(grid, c.max_blocks);
  K::template packed<TPR, NV>()<<<static_cast<unsigned>(grid), BT, 0, s>>>(p, (c.hints & kHintedLoads) != 0);
  return cuda::check_launch(K::kPackedName);
}

template <class K>
strata_status launch_packed(const typename K::Params& p, const RowNormCudaConfig& c, cudaStream_t s) {
#define STRATA_PACKED_NV(TPR)                                   \
  switch (c.nv) {                                               \
    case 1: return launch_packed_inst<K, TPR, 1>(p, c, s);      \
    case 2: return launch_packed_inst<K, TPR, 2>(p, c, s);      \
    default: return launch_packed_inst<K, TPR, 4>(p, c, s);     \
  }
  switch (c.tpr) {
    case 4: STRATA_PACKED_NV(4)
    case 8: STRATA_PACKED_NV(8)
    case 16: STRATA_PACKED_NV(16)
    case 32: STRATA_PACKED_NV(32)
    case 128: STRATA_PACKED_NV(128)
    case 256: STRATA_PACKED_NV(256)
    default: STRATA_PACKED_NV(512)
  }
#undef STRATA_PACKED_NV
}

// Launches one streaming instance: at most one wave of resident blocks, balanced so that every block runs
// the same number of iterations (up to one).
template <class K, int TPR, int NV, int RPG>
strata_status launch_stream_inst(const typename K::Params& p, const RowNormCudaConfig& c, cudaStream_t s) {
  constexpr int BT = stream_block<TPR>(), GPB = TPR > 32 ? 1 : kBlock / TPR;
  const auto kernel = K::template stream<TPR, NV, RPG>();
  static const int occ = cuda::occupancy_blocks_per_sm(kernel, BT);
  if (p.rows == 0) return STRATA_SUCCESS;
  const int64_t ngroups = cuda::ceil_div(p.rows, RPG);
  const int64_t need = cuda::ceil_div(ngroups, GPB);
  const int64_t slots = static_cast<int64_t>(cuda::current_sm_count()) * occ;
  int64_t grid = need <= slots ? need : cuda::ceil_div(need, cuda::ceil_div(need, slots));
  if (c.max_blocks > 0) grid = std::min<int64_t>(grid, c.max_blocks);
  kernel<<<static_cast<unsigned>(grid), BT, 0, s>>>(p, (c.hints & kHintedLoads) != 0);
  return cuda::check_launch(K::kStreamName);
}

template <class K>
strata_status launch_stream(const typename K::Params& p, const RowNormCudaConfig& c, cudaStream_t s) {
#define STRATA_STREAM_NV(TPR)                                                                  \
  switch (c.nv) {                                                                              \
    case 1: return c.rpg == 2 ? launch_stream_inst<K, TPR, 1, 2>(p, c, s) : launch_stream_inst<K, TPR, 1, 1>(p, c, s); \
    case 2: return c.rpg == 2 ? launch_stream_inst<K, TPR, 2, 2>(p, c, s) : launch_stream_inst<K, TPR, 2, 1>(p, c, s); \
    default: return launch_stream_inst<K, TPR, 4, 1>(p, c, s);                                 \
  }
#define STRATA_STREAM_BLK(TPR)                                 \
  switch (c.nv) {                                              \
    case 1: return launch_stream_inst<K, TPR, 1, 1>(p, c, s);  \
    case 2: return launch_stream_inst<K, TPR, 2, 1>(p, c, s);  \
    default: return launch_stream_inst<K, TPR, 4, 1>(p, c, s); \
  }
  switch (c.tpr) {
    case 4: STRATA_STREAM_NV(4)
    case 8: STRATA_STREAM_NV(8)
    case 16: STRATA_STREAM_NV(16)
    case 32: STRATA_STREAM_NV(32)
    case 128: STRATA_STREAM_BLK(128)
    case 256: STRATA_STREAM_BLK(256)
    default: STRATA_STREAM_BLK(512)
  }
#undef STRATA_STREAM_NV
#undef STRATA_STREAM_BLK
}

// One bulk-copy instance: a persistent grid of at most one wave of resident blocks (occupancy with this
// configuration's shared memory), balanced so that every block runs the same number of tiles (up to one).
template <class K, int TPR>
strata_status launch_bulk_inst(const typename K::Params& p, const RowNormCudaConfig& c, cudaStream_t s) {
  if (p.rows == 0) return STRATA_SUCCESS;
  const auto kernel = K::template bulk<TPR>();
  const int threads = bulk_threads(TPR, c.rpg);
  const int64_t smem = bulk_smem_bytes(p.D, K::row_dtype(p), K::kTensors, c.rpg, c.nv);
  // Per call (cheap), so that every device the kernel runs on gets the opt-in above 48 KiB; always the same
  // value (the most any configuration may use), so calls from several host threads cannot undercut each other.
  STRATA_RETURN_IF_ERROR(cuda::check(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkMaxSmem),
      "cudaFuncSetAttribute (row_norm bulk)"));
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, static_cast<size_t>(smem)) != cudaSuccess ||
      occ < 1) {
    (void)cudaGetLastError();
    occ = 1;
  }
  const int64_t ntiles = cuda::ceil_div(p.rows, c.rpg);
  const int64_t slots = static_cast<int64_t>(cuda::current_sm_count()) * occ;
  int64_t grid = ntiles <= slots ? ntiles : cuda::ceil_div(ntiles, cuda::ceil_div(ntiles, slots));
  if (c.max_blocks > 0) grid = std::min<int64_t>(grid, c.max_blocks);
  kernel<<<static_cast<unsigned>(grid), threads, static_cast<size_t>(smem), s>>>(p, c.rpg, c.nv, c.hints);
  return cuda::check_launch(K::kBulkName);
}

template <class K>
strata_status launch_bulk(const typename K::Params& p, const RowNormCudaConfig& c, cudaStream_t s) {
  switch (c.tpr) {
    case 8: return launch_bulk_inst<K, 8>(p, c, s);
    case 16: return launch_bulk_inst<K, 16>(p, c, s);
    default: return launch_bulk_inst<K, 32>(p, c, s);
  }
}

// One launcher for both directions: K names the kernel family (forward or backward).
template <class K>
strata_status launch(const typename K::Params& p, const RowNormCudaConfig& c, cudaStream_t s) {
  if (c.stream == 3) return launch_bulk<K>(p, c, s);
  if (c.stream == 2) return launch_packed<K>(p, c, s);
  if (c.stream) return launch_stream<K>(p, c, s);
  const dim3 block(kBlock);
  if (c.tpr == 0) {
    K::looped(dim3(static_cast<unsigned>(p.rows)), block, s, p);
  } else if (c.tpr >= 128) {
    const dim3 grid(static_cast<unsigned>(cuda::ceil_div(p.rows, c.rpg)));
#define STRATA_BLOCK_NV(CE, BT)                                                        \
  if (c.rpg == 2) {                                                                    \
    if (c.nv == 1) K::template block<CE, 1, BT, 2>(grid, dim3(BT), s, p);              \
    else K::template block<CE, 2, BT, 2>(grid, dim3(BT), s, p);                        \
  } else {                                                                             \
    switch (c.nv) {                                                                    \
      case 1: K::template block<CE, 1, BT, 1>(grid, dim3(BT), s, p); break;            \
      case 2: K::template block<CE, 2, BT, 1>(grid, dim3(BT), s, p); break;            \
      default: K::template block<CE, 4, BT, 1>(grid, dim3(BT), s, p); break;           \
    }                                                                                  \
  }
#define STRATA_BLOCK512(CE)                                                          \
  switch (c.nv) {                                                                    \
    case 1: K::template block<CE, 1, 512, 1>(grid, dim3(512), s, p); break;          \
    case 2: K::template block<CE, 2, 512, 1>(grid, dim3(512), s, p); break;          \
    default: K::template block<CE, 4, 512, 1>(grid, dim3(512), s, p); break;         \
  }
#define STRATA_BLOCK(CE)                                                     \
  if (c.tpr == 128) { STRATA_BLOCK_NV(CE, 128) }                             \
  else if (c.tpr == 256) { STRATA_BLOCK_NV(CE, 256) }                        \
  else { STRATA_BLOCK512(CE) }  /* 512 threads: rpg 1 only (known_config) */
    if (c.chunk_elems == 8) { STRATA_BLOCK(8) } else { STRATA_BLOCK(16) }
#undef STRATA_BLOCK512
#undef STRATA_BLOCK_NV
#undef STRATA_BLOCK
  } else {
    const int64_t groups = cuda::ceil_div(p.rows, c.rpg);
    const dim3 grid(static_cast<unsigned>(cuda::ceil_div(groups * c.tpr, kBlock)));
#define STRATA_GROUP_RPG(CE, TPR)                                          \
  switch (c.rpg) {                                                         \
    case 1: K::template group<CE, TPR, 1, 1>(grid, block, s, p); break;   \
    case 2: K::template group<CE, TPR, 1, 2>(grid, block, s, p); break;   \
    default: K::template group<CE, TPR, 1, 4>(grid, block, s, p); break;  \
  }
#define STRATA_GROUP(CE)                                                     \
  switch (c.tpr) {                                                           \
    case 1: STRATA_GROUP_RPG(CE, 1) break;                                   \
    case 2: STRATA_GROUP_RPG(CE, 2) break;                                   \
    case 4: STRATA_GROUP_RPG(CE, 4) break;                                   \
    case 8: STRATA_GROUP_RPG(CE, 8) break;                                   \
    case 16: STRATA_GROUP_RPG(CE, 16) break;                                 \
    default:                                                                 \
      if (c.nv == 1) K::template group<CE, 32, 1, 1>(grid, block, s, p);    \
      else if (c.nv == 2) K::template group<CE, 32, 2, 1>(grid, block, s, p); \
      else if (c.nv == 4) K::template group<CE, 32, 4, 1>(grid, block, s, p); \
      else K::template group8<CE>(grid, block, s, p);                        \
  }
    if (c.chunk_elems == 8) { STRATA_GROUP(8) } else { STRATA_GROUP(16) }
#undef STRATA_GROUP
#undef STRATA_GROUP_RPG
  }
  return cuda::check_launch(K::kName);
}

// Forward rows hold one tensor in registers. A warp per row with 8 chunks per lane exists (for the sweep)
// but is not picked: 1.88x floor against 1.30x for a block per row at D = 4096 bf16 on the H200.
struct FwdKernels {
  using Params = RowNormFwdParams;
  static constexpr const char* kName = "row_norm_fwd";
  static constexpr const char* kStreamName = "row_norm_fwd (stream)";
  static constexpr const char* kPackedName = "row_norm_fwd (packed)";
  static constexpr const char* kBulkName = "row_norm_fwd (bulk)";
  static constexpr int kTensors = 1;
  static int32_t row_dtype(const Params& p) { return p.x_dtype; }
  template <int TPR>
  static auto bulk() { return fwd_bulk<TPR>; }
  template <int TPR, int NV, int RPG>
  static auto stream() { return fwd_stream<TPR, NV, RPG>; }
  template <int TPR, int NV>
  static auto packed() { return fwd_packed<TPR, NV>; }
  static constexpr int kMaxGroupNv = 8;   // instances
  static constexpr int kPickGroupNv = 4;  // what the default picks
  template <int CE, int TPR, int NV, int RPG>
  static void group(dim3 g, dim3 b, cudaStream_t s, const Params& p) { fwd_rows_in_group<CE, TPR, NV, RPG><<<g, b, 0, s>>>(p); }
  template <int CE>
  static void group8(dim3 g, dim3 b, cudaStream_t s, const Params& p) { fwd_rows_in_group<CE, 32, 8, 1><<<g, b, 0, s>>>(p); }
  template <int CE, int NV, int BT, int RPG>
  static void block(dim3 g, dim3 b, cudaStream_t s, const Params& p) { fwd_rows_in_block<CE, NV, BT, RPG><<<g, b, 0, s>>>(p); }
  static void looped(dim3 g, dim3 b, cudaStream_t s, const Params& p) { fwd_rows_looped<<<g, b, 0, s>>>(p); }
};

// Backward rows hold two tensors (src and dout): at most 4 chunks per lane (no 8-chunk instance).
struct BwdKernels {
  using Params = RowNormBwdParams;
  static constexpr const char* kName = "row_norm_bwd";
  static constexpr const char* kStreamName = "row_norm_bwd (stream)";
  static constexpr const char* kPackedName = "row_norm_bwd (packed)";
  static constexpr const char* kBulkName = "row_norm_bwd (bulk)";
  static constexpr int kTensors = 2;
  static int32_t row_dtype(const Params& p) { return p.src_dtype; }
  template <int TPR>
  static auto bulk() { return bwd_bulk<TPR>; }
  template <int TPR, int NV, int RPG>
  static auto stream() { return bwd_stream<TPR, NV, RPG>; }
  template <int TPR, int NV>
  static auto packed() { return bwd_packed<TPR, NV>; }
  static constexpr int kMaxGroupNv = 4;
  static constexpr int kPickGroupNv = 4;
  template <int CE, int TPR, int NV, int RPG>
  static void group(dim3 g, dim3 b, cudaStream_t s, const Params& p) { bwd_rows_in_group<CE, TPR, NV, RPG><<<g, b, 0, s>>>(p); }
  template <int CE>
  static void group8(dim3, dim3, cudaStream_t, const Params&) {}  // unreachable: known_config() rejects nv 8
  template <int CE, int NV, int BT, int RPG>
  static void block(dim3 g, dim3 b, cudaStream_t s, const Params& p) { bwd_rows_in_block<CE, NV, BT, RPG><<<g, b, 0, s>>>(p); }
  static void looped(dim3 g, dim3 b, cudaStream_t s, const Params& p) { bwd_rows_looped<<<g, b, 0, s>>>(p); }
};

bool fwd_chunk_ok(const RowNormFwdParams& p, int ce) {
  return chunkable(p.x, p.x_rows, ce) && (!p.y || chunkable(p.y, p.y_rows, ce));
}
bool bwd_chunk_ok(const RowNormBwdParams& p, int ce) {
  return chunkable(p.src, p.src_rows, ce) && chunkable(p.dx, p.dx_rows, ce) &&
         (p.kind == RowNormBwdKind::kFactor || chunkable(p.dout, p.dout_rows, ce));
}
StreamFacts fwd_stream_facts(const RowNormFwdParams& p) {
  StreamFacts f;
  f.dtype = p.x_dtype;
  f.same = !p.y || p.y_dtype == p.x_dtype;
  f.vec_ok = fwd_chunk_ok(p, cuda::vec16_elems(p.x_dtype));
  f.uniform = p.x_rows.uniform() && (!p.y || p.y_rows.uniform()) && p.rstd_rows.uniform();
  f.dense = dense_rows(p.x_rows, p.D);
  f.out_dense = !p.y || dense_rows(p.y_rows, p.D);
  f.tensors = 1;
  return f;
}
StreamFacts bwd_stream_facts(const RowNormBwdParams& p) {
  StreamFacts f;
  f.dtype = p.src_dtype;
  f.same = p.dx_dtype == p.src_dtype && (p.kind == RowNormBwdKind::kFactor || p.dout_dtype == p.src_dtype);
  f.vec_ok = bwd_chunk_ok(p, cuda::vec16_elems(p.src_dtype));
  f.uniform = p.src_rows.uniform() && p.dout_rows.uniform() && p.dx_rows.uniform() && p.rstd_rows.uniform();
  f.dense = dense_rows(p.src_rows, p.D) && dense_rows(p.dout_rows, p.D);
  f.bulk_kind = p.kind != RowNormBwdKind::kFactor;
  f.tensors = 2;
  return f;
}
int fwd_bytes(const RowNormFwdParams& p) { return max_elem_bytes({p.x_dtype, p.y ? p.y_dtype : p.x_dtype}); }
int bwd_bytes(const RowNormBwdParams& p) {
  return max_elem_bytes({p.src_dtype, p.dx_dtype, p.kind == RowNormBwdKind::kFactor ? p.src_dtype : p.dout_dtype});
}

}  // namespace

std::vector<RowNormCudaConfig> row_norm_cuda_all_configs() {
  std::vector<RowNormCudaConfig> v;
  for (int tpr : {4, 8, 16, 32, 128, 256, 512})
    for (int nv : {1, 2, 4})
      for (int rpg : {1, 2}) {
        RowNormCudaConfig c{0, tpr, nv, rpg, 1};
        if (stream_known(c)) v.push_back(c);
      }
  for (int tpr : {4, 8, 16, 32, 128, 256, 512})
    for (int nv : {1, 2, 4}) v.push_back(RowNormCudaConfig{0, tpr, nv, 1, 2});
  // Bulk-copy: teams x stages x rows per stage (1, 2 and 5: many phases of the stage ring and partial last
  // tiles on small row counts; 1..256: the stage sizes the sweep times).
  for (int tpr : {8, 16, 32})
    for (int ns = 2; ns <= kBulkMaxStages; ++ns)
      for (int rps : {1, 2, 4, 5, 8, 16, 32, 64, 128, 256}) v.push_back(RowNormCudaConfig{0, tpr, ns, rps, 3});
  // The cache-hint variants (st.global.cs stores; loads without evict-first; both) of the rings the bulk choice
  // takes for the target shapes (teams of 8 / 16 / a warp, 3 stages) and of a small one (5 rows: partial tiles).
  for (int hints = 1; hints <= 3; ++hints)
    for (const auto& tr : {std::pair{8, 128}, std::pair{8, 64}, std::pair{16, 64}, std::pair{32, 4}, std::pair{32, 2},
                           std::pair{8, 5}})
      v.push_back(RowNormCudaConfig{0, tr.first, 3, tr.second, 3, 0, hints});
  // Multi-row (forward): every instance; the hint variants and persistent grids of the instances that matter
  // (D = 128 bf16: teams of 8 x 2 with 2 and 4 rows; D = 4096 bf16: 256 x 2 with 1 and 2 rows), which include
  // the defaults (row_norm_multi_default).
  for (RowNormCudaConfig c : row_norm_multi_instances()) {
    v.push_back(c);
    const bool key = (c.tpr == 8 && c.nv == 2 && c.rpg >= 2) || (c.tpr == 256 && c.nv == 2);
    if (!key) continue;
    for (int hints = 1; hints <= 3; ++hints) {
      c.hints = hints;
      v.push_back(c);
    }
    c.hints = 0;
    for (int bps : {1, 2, 4}) {
      c.blocks_per_sm = bps;
      v.push_back(c);
    }
    c.blocks_per_sm = 2, c.hints = 3;
    v.push_back(c);
  }
  // TMA (forward): every (tpr, nv) instance with 64-row tiles; the pick's teams with 1, 2, 5, 32 and 128 rows
  // per tile (partial tiles, tiles of one row, the larger tiles the sweep times) and each cache hint.
  for (const RowNormCudaConfig& c : row_norm_tma_instances()) v.push_back(c);
  for (const auto& tn : {std::pair{8, 2}, std::pair{16, 2}, std::pair{32, 4}, std::pair{32, 0}})
    for (int rpt : {1, 2, 5, 32, 128}) {
      RowNormCudaConfig c{0, tn.first, tn.second, rpt, 5};
      v.push_back(c);
    }
  for (int hints = 1; hints <= 3; ++hints) v.push_back(RowNormCudaConfig{0, 8, 2, 64, 5, 0, hints});
  for (int ce : {8, 16})
    for (int tpr : {1, 2, 4, 8, 16, 32, 128, 256, 512})
      for (int nv : {1, 2, 4, 8})
        for (int rpg : {1, 2, 4}) {
          const RowNormCudaConfig c{ce, tpr, nv, rpg};
          if (known_config(c, FwdKernels::kMaxGroupNv)) v.push_back(c);
        }
  v.push_back({16, 0, 1, 1});
  return v;
}

RowNormCudaConfig row_norm_fwd_cuda_config_classic(const RowNormFwdParams& p) {
  return pick(p.D, fwd_bytes(p), [&](int ce) { return fwd_chunk_ok(p, ce); }, FwdKernels::kPickGroupNv);
}
RowNormCudaConfig row_norm_bwd_cuda_config_classic(const RowNormBwdParams& p) {
  return pick(p.D, bwd_bytes(p), [&](int ce) { return bwd_chunk_ok(p, ce); }, BwdKernels::kPickGroupNv);
}
// Defaults. After s4run2 (atk, H200) the streaming kernels were slower than the classic ones for l2norm
// [524288, 128] (bf16 1.26 x floor vs 1.23, f32 1.17 vs 1.05) and rmsnorm bf16 [32768, 4096] (1.23 vs 1.16),
// faster only for rmsnorm f32 [32768, 4096]. s5run2 (atk median of 10, every alternative forced in the same
// run): the packed kernels won for rows of more than 128 vectors (rmsnorm fwd [32768, 4096] bf16 0.1441 ms =
// 1.12 x, classic 1.13 x; f32 0.2772 ms = 1.09 x, streaming 1.17 x, classic 1.24 x), tied for bf16
// [524288, 128] (0.0751 ms = 1.16 x, classic 1.21 x, the same minimum 0.0732 ms) and lost for f32
// [524288, 128] (1.11 x, classic 1.05 x). So the packed kernels are the default except for f32 rows of up
// to 128 vectors (a lane team), which keep the classic kernels; the backward (not timed in s5run2: atk ran out
// of time) follows the forward's rule.
namespace {
bool packed_default(const RowNormCudaConfig& c, int32_t dtype) {
  return c.stream == 2 && !(dtype == STRATA_DTYPE_F32 && c.tpr <= 32);
}
}  // namespace
// Session 7: where the measured table of the multi-row kernels (row_norm_multi_default, row_norm_cuda_multi.cu)
// names a configuration for this row and the layout allows it, the forward takes it.
// Session 8 (s8run2): where the measured table of the TMA kernels (row_norm_tma_default, row_norm_cuda_tma.cu)
// names a configuration and the layout, the pointers and the device allow it, the forward takes it first
// (since session 13 except for 16-bit rows of 257-512 vectors: the packed kernel 128 x 4 there).
RowNormCudaConfig row_norm_fwd_cuda_config(const RowNormFwdParams& p) {
  const StreamFacts sf = fwd_stream_facts(p);
  const RowNormCudaConfig t = row_norm_tma_default(p.D, sf.dtype);
  if (t.stream == 5 && config_reject(t, p.D, false, FwdKernels::kMaxGroupNv, sf).empty()) {
    // Session 13: where the TMA table names a tile for 16-bit rows of 257-512 vectors, the packed kernel with
    // plain loads, a 128-thread block x 4 vectors (the backward's configuration), is faster: rmsnorm fwd bf16
    // [32768, 4096], FusedGpuPaths.RowNormLoadsTiming (H200, C++ queued medians, each run side by side): s12run1
    // 0.1333 against the TMA tile's 0.1360 ms, s13run1 0.1345 against 0.1375 (the multi-row default 0.1337 there,
    // but 0.1423 against 0.1371 under atk's timing in s8run2).
    const int64_t nvec = p.D / cuda::vec16_elems(sf.dtype);
    if (nvec > 256 && nvec <= 512) {
      const RowNormCudaConfig pk{16, 128, 4, 1, 2, 0, 0};
      if (config_reject(pk, p.D, false, FwdKernels::kMaxGroupNv, sf).empty()) return pk;
    }
    return t;
  }
  const RowNormCudaConfig c = pick_packed(p.D, sf);
  if (c.stream == 2) {
    const RowNormCudaConfig m = row_norm_multi_default(p.D, sf.dtype);
    if (m.stream == 4 && config_reject(m, p.D, false, FwdKernels::kMaxGroupNv, sf).empty()) return m;
  }
  return packed_default(c, sf.dtype) ? c : row_norm_fwd_cuda_config_classic(p);
}
// The backward (two row tensors in registers) after s6run1 + s6run2 (atk median of 10, H200, every alternative
// forced in the same run; both runs agree): rows of 8..32 vectors take one vector per lane (a team of
// pow2ceil(vectors) lanes: l2norm bwd [524288, 128] bf16 16 x 1 0.1064 / 0.1067 ms against 8 x 2 0.1073 /
// 0.1075; f32 32 x 1 0.2014 / 0.2012 ms = 1.04 x against the classic kernels' 0.2083 / 0.2072 = 1.08 x, so f32
// takes it too), and 16-bit rows of 257..512 vectors a block of 128 threads x 4 (rmsnorm bwd [32768, 4096] bf16
// 0.2079 / 0.2090 ms against 256 x 2 0.2089 / 0.2107). Other rows follow the forward's rule.
RowNormCudaConfig row_norm_bwd_cuda_config(const RowNormBwdParams& p) {
  const StreamFacts sf = bwd_stream_facts(p);
  RowNormCudaConfig c = pick_packed(p.D, sf);
  if (c.stream == 2) {
    const int64_t nvec = p.D / cuda::vec16_elems(sf.dtype);
    if (nvec >= 8 && nvec <= 32) {
      c.tpr = pow2ceil(nvec), c.nv = 1;
      return c;
    }
    if (nvec > 256 && nvec <= 512 && sf.dtype != STRATA_DTYPE_F32) c.tpr = 128, c.nv = 4;  // measured for bf16
  }
  return packed_default(c, sf.dtype) ? c : row_norm_bwd_cuda_config_classic(p);
}

namespace {
// The classic choice, the streaming choice and every packed configuration that covers the row with no idle
// lane (tpr * nv * vector elements == D rounded up to a power of two), without repeats.
std::vector<RowNormCudaConfig> alternatives(int64_t D, const StreamFacts& sf, const RowNormCudaConfig& classic) {
  std::vector<RowNormCudaConfig> v{classic};
  const RowNormCudaConfig st = pick_stream(D, sf);
  if (st.stream) v.push_back(st);
  const RowNormCudaConfig pk = pick_packed(D, sf);
  if (pk.stream) {
    const int64_t cover = pow2ceil(D / cuda::vec16_elems(sf.dtype));
    for (int tpr : {4, 8, 16, 32, 128, 256, 512})
      for (int nv : {1, 2, 4})
        if (static_cast<int64_t>(tpr) * nv == cover) v.push_back(RowNormCudaConfig{0, tpr, nv, 1, 2});
    // Forward: the multi-row kernels with the packed choice's team or block and 2 (teams: also 4) rows per step.
    if (sf.tensors == 1)
      for (int rows : {2, 4}) {
        RowNormCudaConfig m{0, pk.tpr, pk.nv, rows, 4};
        if (row_norm_multi_known(m)) v.push_back(m);
      }
    // Forward: the multi-row default itself (with its cache hints), so that atk times the forced kernel beside
    // the plan's row (session 8: s7run3's atk read 0.1448 ms for the rmsnorm plan row against 0.132-0.134 ms for
    // this configuration in the sweep and torch_peers).
    if (sf.tensors == 1) {
      const RowNormCudaConfig m = row_norm_multi_default(D, sf.dtype);
      const bool listed = std::any_of(v.begin(), v.end(), [&m](const RowNormCudaConfig& o) {
        return o.stream == m.stream && o.tpr == m.tpr && o.nv == m.nv && o.rpg == m.rpg && o.hints == m.hints &&
               o.blocks_per_sm == m.blocks_per_sm;
      });
      if (m.stream == 4 && !listed && config_reject(m, D, false, FwdKernels::kMaxGroupNv, sf).empty()) v.push_back(m);
    }
  }
  // Forward, sm_90: the TMA choice (tiles of 16 KiB), the same with 32- and 128-row tiles, and with evict-first
  // stores.
  if (sf.tensors == 1 && device_has_bulk_copy()) {
    const int ve = cuda::vec16_elems(sf.dtype);
    const RowNormCudaConfig tm = D % ve == 0 ? row_norm_tma_pick(D / ve) : RowNormCudaConfig{};
    if (tm.stream == 5 && config_reject(tm, D, false, FwdKernels::kMaxGroupNv, sf).empty()) {
      v.push_back(tm);
      for (int rpt : {tm.rpg / 2, tm.rpg * 2}) {
        RowNormCudaConfig o = tm;
        o.rpg = rpt;
        if (rpt >= 1 && config_reject(o, D, false, FwdKernels::kMaxGroupNv, sf).empty()) v.push_back(o);
      }
      RowNormCudaConfig h = tm;
      h.hints = 1;
      v.push_back(h);
    }
  }
  // The bulk-copy choice, the same with half the rows per stage in 4 stages (a finer ring), and with twice the
  // rows in 2 stages (larger copies), where they fit.
  const RowNormCudaConfig bk = pick_bulk(D, sf);
  if (bk.stream && device_has_bulk_copy()) {
    v.push_back(bk);
    const int64_t row_bytes = D / cuda::vec16_elems(sf.dtype) * 16 * sf.tensors;
    RowNormCudaConfig fine = bk;
    fine.rpg = std::max(1, bk.rpg / 2), fine.nv = 4;
    if (fine.rpg != bk.rpg && bulk_smem_bytes(D, sf.dtype, sf.tensors, fine.rpg, fine.nv) <= kBulkMaxSmem) v.push_back(fine);
    RowNormCudaConfig coarse = bk;
    coarse.rpg = std::min(kBulkMaxRows, bk.rpg * 2), coarse.nv = 2;
    if (coarse.rpg != bk.rpg && coarse.rpg * row_bytes <= 2 * 65536 &&
        bulk_smem_bytes(D, sf.dtype, sf.tensors, coarse.rpg, coarse.nv) <= kBulkMaxSmem)
      v.push_back(coarse);
    RowNormCudaConfig cs = bk;  // the choice with streaming (evict-first) stores
    cs.hints = kBulkHintStoreCs;
    v.push_back(cs);
  }
  return v;
}
}  // namespace

std::vector<RowNormCudaConfig> row_norm_fwd_cuda_alternatives(const RowNormFwdParams& p) {
  return alternatives(p.D, fwd_stream_facts(p), row_norm_fwd_cuda_config_classic(p));
}
std::vector<RowNormCudaConfig> row_norm_bwd_cuda_alternatives(const RowNormBwdParams& p) {
  return alternatives(p.D, bwd_stream_facts(p), row_norm_bwd_cuda_config_classic(p));
}
std::string row_norm_fwd_cuda_config_reject(const RowNormFwdParams& p, const RowNormCudaConfig& c) {
  const bool chunk_ok = c.chunk_elems > 0 && fwd_chunk_ok(p, c.chunk_elems);
  return config_reject(c, p.D, chunk_ok, FwdKernels::kMaxGroupNv, fwd_stream_facts(p));
}
std::string row_norm_bwd_cuda_config_reject(const RowNormBwdParams& p, const RowNormCudaConfig& c) {
  const bool chunk_ok = c.chunk_elems > 0 && bwd_chunk_ok(p, c.chunk_elems);
  return config_reject(c, p.D, chunk_ok, BwdKernels::kMaxGroupNv, bwd_stream_facts(p));
}

namespace {
// The bulk configuration of a problem, or why there is none (pick_bulk's conditions, then config_reject's:
// the stage ring's shared memory and the device).
template <class P>
std::string bulk_reject(const P& p, const StreamFacts& sf, RowNormCudaConfig* out) {
  const RowNormCudaConfig c = pick_bulk(p.D, sf);
  if (c.stream != 3) {
    if (!sf.bulk_kind) return "the bulk-copy backward computes kNormalizedSrc and kRawSrc only";
    if (!sf.same) return "the bulk-copy kernels need one dtype for every row tensor";
    if (p.D == 0 || p.D % cuda::vec16_elems(sf.dtype) != 0 || !sf.vec_ok)
      return "rows cannot be read in aligned 16-byte vectors";
    if (!sf.uniform || !sf.dense) return "the bulk-copy kernels need dense rows (row stride D) in the tensors they read";
    return "a row of every tensor read is more than 64 KiB (no stage of whole rows)";
  }
  if (out) *out = c;
  return config_reject(c, p.D, false, 0, sf);
}
}  // namespace

std::string row_norm_fwd_cuda_bulk_reject(const RowNormFwdParams& p) {
  return bulk_reject(p, fwd_stream_facts(p), nullptr);
}
std::string row_norm_bwd_cuda_bulk_reject(const RowNormBwdParams& p) {
  return bulk_reject(p, bwd_stream_facts(p), nullptr);
}
namespace {
// The forward launcher of every kind (the multi-row kernels live in row_norm_cuda_multi.cu).
int launch_fwd(const RowNormFwdParams& p, const RowNormCudaConfig& c, void* stream) {
  if (c.stream == 4) return row_norm_fwd_multi_launch(p, c, stream);
  if (c.stream == 5) return row_norm_fwd_tma_launch(p, c, stream);
  return launch<FwdKernels>(p, c, static_cast<cudaStream_t>(stream));
}
}  // namespace

int row_norm_fwd_cuda_bulk(const RowNormFwdParams& p, void* stream) {
  RowNormCudaConfig c;
  if (!bulk_reject(p, fwd_stream_facts(p), &c).empty()) c = row_norm_fwd_cuda_config(p);  // e.g. misaligned pointers
  return launch_fwd(p, c, stream);
}
// The TMA configuration of a problem, or why there is none.
std::string row_norm_fwd_cuda_tma_reject(const RowNormFwdParams& p) {
  const StreamFacts sf = fwd_stream_facts(p);
  const int ve = cuda::vec16_elems(sf.dtype);
  if (p.D == 0 || p.D % ve != 0) return "rows cannot be read in aligned 16-byte vectors";
  const RowNormCudaConfig c = row_norm_tma_pick(p.D / ve);
  if (c.stream != 5) return "a row is larger than the 48 KiB of shared memory of a TMA block";
  return config_reject(c, p.D, false, FwdKernels::kMaxGroupNv, sf);
}
int row_norm_fwd_cuda_tma(const RowNormFwdParams& p, void* stream) {
  const int ve = cuda::vec16_elems(p.x_dtype);
  RowNormCudaConfig c = p.D > 0 && p.D % ve == 0 ? row_norm_tma_pick(p.D / ve) : RowNormCudaConfig{};
  // Run time (pointers known): misaligned tensors, or rows the TMA kernels do not take, run the default kernels.
  if (c.stream != 5 || !row_norm_fwd_cuda_config_reject(p, c).empty()) c = row_norm_fwd_cuda_config(p);
  return launch_fwd(p, c, stream);
}
int row_norm_bwd_cuda_bulk(const RowNormBwdParams& p, void* stream) {
  RowNormCudaConfig c;
  if (!bulk_reject(p, bwd_stream_facts(p), &c).empty()) c = row_norm_bwd_cuda_config(p);
  return launch<BwdKernels>(p, c, static_cast<cudaStream_t>(stream));
}

int row_norm_fwd_cuda(const RowNormFwdParams& p, void* stream, const RowNormCudaConfig* config) {
  const RowNormCudaConfig c = config ? *config : row_norm_fwd_cuda_config(p);
  if (config && !row_norm_fwd_cuda_config_reject(p, c).empty()) return STRATA_ERROR_INVALID_ATTRIBUTE;
  return launch_fwd(p, c, stream);
}

int row_norm_bwd_cuda(const RowNormBwdParams& p, void* stream, const RowNormCudaConfig* config) {
  const RowNormCudaConfig c = config ? *config : row_norm_bwd_cuda_config(p);
  if (config && !row_norm_bwd_cuda_config_reject(p, c).empty()) return STRATA_ERROR_INVALID_ATTRIBUTE;
  return launch<BwdKernels>(p, c, static_cast<cudaStream_t>(stream));
}

}  // namespace strata::norm
