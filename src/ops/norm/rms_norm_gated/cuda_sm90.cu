// CUDA kernels of rms_norm_gated (rms_norm_gated.h). Memory-bound: every input is read once and every output
// written once, with 16-byte accesses where the layout allows; arithmetic in f32 (16-bit activations use the
// hardware exp and an approximate divide for act(z), see vact).
//
// Rows are cut into chunks of kV = 8 features (16 B of bf16/f16, 32 B of f32); chunk k of lane t of a row
// team covers features [(t + k * TPR) * kV, +kV). A chunk never straddles a group (G % kV == 0 on the vector
// paths), so per-group sums are sums of chunk partials:
//   team_rows<TPR, NV, R>, TPR <= 32: a team of TPR lanes holds one row (NV chunks per lane, several rows per
//        warp for short rows; D <= 32 * 4 * kV = 1024), R rows per team per iteration with all their loads in
//        flight before the first reduction. Group sums by shuffles: a group inside one slice of TPR * kV
//        features is W = G / kV consecutive lanes (xor tree of width W); a group of whole slices adds its
//        slices' partials per lane, then one TPR-wide tree.
//   block_rows<NV>: a block per row (D <= 8192, any G % kV == 0), loads kept packed (one uint4 per 16-bit
//        chunk) and the derived values recomputed after the reduction, to stay near 100 registers: chunk
//        partials go to shared memory in feature order, warp w sums groups w, w + 8, ... in a fixed order
//        (block_group_totals); the backward sums dweight / dbias in shared memory.
//   looped:  any D, G, stride or alignment: a block per row, warp w takes groups w, w + 8, ...; element-wise.
// The vector kernels loop over rows with a grid capped at a few waves, so each thread loads its weight chunks
// and computes its column facts (group index, rstd column) once, not per row.
// Backward: each block owns a fixed set of rows (grid-stride over row teams with a grid that depends only on
// the problem), sums dw / db of its rows in registers in row order, reduces its teams in fixed order into its
// partial row [num_partials, D] of the workspace, and a second kernel sums the partial rows in fixed order.
// No atomics: the same bits every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/norm/rms_norm_gated/cuda_common.cuh"
#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "runtime/error.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm {
namespace {

using cuda::load_any;
using cuda::load_one;
using cuda::load_vec;
using cuda::store_one;
using cuda::store_vec;

using namespace rng_cuda;

// ------------------------------------------------------------------------------------------------------
// Forward, vector paths.

// Packed chunks: 16-bit loads stay one uint4 per 8 features until used (half the registers of floats).
template <bool F32>
struct Packed {
  uint4 q[F32 ? 2 : 1];
};
template <bool F32>
__device__ __forceinline__ Packed<F32> load_packed(const void* base, int64_t i) {
  Packed<F32> r;
  if constexpr (F32) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(base) + i);
    r.q[0] = p[0];
    r.q[1] = p[1];
  } else {
    r.q[0] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i);
  }
  return r;
}
template <bool F32>
__device__ __forceinline__ void unpack(const Packed<F32>& r, int32_t xdt, float (&v)[kV]) {
  if constexpr (F32) {
    const uint32_t w[8] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w, r.q[1].x, r.q[1].y, r.q[1].z, r.q[1].w};
#pragma unroll
    for (int e = 0; e < kV; ++e) v[e] = __uint_as_float(w[e]);
  } else {
    const uint32_t w[4] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (xdt == STRATA_DTYPE_BF16) {
        v[2 * k] = __uint_as_float(w[k] << 16), v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
        v[2 * k] = f.x, v[2 * k + 1] = f.y;
      }
    }
  }
}


// R rows per team per iteration (their loads all in flight before the first reduction); the block loops over
// row batches with a grid-stride (the grid is capped at a few waves), so the per-chunk column facts (group
// index, rstd column) and, for one chunk per lane, the weights are loaded / computed once per thread. The
// loads stay packed and u is recomputed after the reduction: holding them as floats took 128 registers (two
// blocks, 16 warps per SM) and ran the [1M, 128] forward at 2.7 x floor (session 3 run 1); packed, the
// kernel fits five 128-thread blocks per SM (four for f32 or with a residual).
// RES: a residual or residual_out is given (a compile-time flag: the common call has neither, and their code
// paths cost registers).
// Blocks of 128 threads: at ~100 registers (bf16, no residual) five fit an SM (20 warps), two of 256 (16):
// with 256-thread blocks at three per SM (<= 80 registers) the kernel spilled 128 bytes per thread.
constexpr int kTeamBlock = 128;
template <bool F32, bool RES>
constexpr int fwd_team_blocks_per_sm() {
  return F32 || RES ? 4 : 5;
}
template <bool F32, bool RES, int TPR, int NV, int R>
__global__ void __launch_bounds__(kTeamBlock, (fwd_team_blocks_per_sm<F32, RES>()))
    fwd_team_rows(const RmsNormGatedFwdParams p, const VecFlags vf) {
  constexpr int TB = kTeamBlock / TPR;  // row teams per block
  constexpr bool kHoistW = NV == 1;
  static_assert(TPR <= 32, "a block per row: fwd_block_rows");
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const float inv_g = 1.f / static_cast<float>(p.group);
  // The activation dtype as a value the compiler can see: F32 kernels drop the 16-bit paths and vice versa.
  const int32_t xdt = F32 ? STRATA_DTYPE_F32 : (p.x_dtype == STRATA_DTYPE_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16);
  constexpr bool fast = !F32;
  const bool nbg = p.norm_before_gate;
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  // Column facts of this thread's chunks (row independent).
  int64_t col[NV], rcol[NV];
  bool has[NV], gstart[NV];
  float wh[kHoistW ? NV : 1][kV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int ci = t + k * TPR;
    has[k] = ci < nc;
    col[k] = static_cast<int64_t>(ci) * kV;
    gstart[k] = has[k] && ci % gc == 0;
    rcol[k] = has[k] ? static_cast<int64_t>(ci / gc) * p.rstd_rows.col_stride : 0;
    if (kHoistW && has[k]) load_param(p.weight, p.w_dtype, p.w_row, col[k], vf.w, 1.f, wh[0]);
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * TB * R;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * TB * R; base < p.rows; base += step) {
    Packed<F32> xr[R][NV], zr[R][NV];
    float tot[R][NV];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * TB + team;
      const bool live = row < p.rows;  // dead lanes stay for the shuffles but touch no memory
      const int64_t xo = live ? p.x_rows.row_offset(row) : 0;
      const int64_t zo = live ? p.z_rows.row_offset(row) : 0;
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (live && has[k]) {
          xr[r][k] = load_packed<F32>(p.x, xo + col[k]);
          zr[r][k] = load_packed<F32>(p.z, zo + col[k]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * TB + team;
      const bool live = row < p.rows;
      float part[NV];
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        part[k] = 0.f;
        if (!(live && has[k])) continue;
        float u[kV];
        unpack<F32>(xr[r][k], xdt, u);
        if (RES && p.residual) {
          float rv[kV];
          load_vec<kV>(p.residual, p.res_dtype, p.res_rows.row_offset(row) + col[k], rv);
#pragma unroll
          for (int e = 0; e < kV; ++e) u[e] += rv[e];
        }
        if (RES && p.residual_out)
          store_vec<kV>(p.residual_out, p.res_out_dtype, p.res_out_rows.row_offset(row) + col[k], u);
        if (!nbg) {
          float z[kV];
          unpack<F32>(zr[r][k], xdt, z);
#pragma unroll
          for (int e = 0; e < kV; ++e) u[e] *= vact(p.act, fast, z[e]);
        }
#pragma unroll
        for (int e = 0; e < kV; ++e) part[k] = fmaf(u[e], u[e], part[k]);
      }
      group_totals<TPR, NV>(part, tot[r], p.group, p.D, t, nullptr);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * TB + team;
      if (row >= p.rows) continue;
      const int64_t yo = p.y_rows.row_offset(row), so = p.rstd_rows.row_offset(row);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (!has[k]) continue;
        const float rs = rsqrtf(tot[r][k] * inv_g + p.eps);
        if (gstart[k]) store_one(p.rstd, p.rstd_dtype, so + rcol[k], rs);
        float u[kV], z[kV], b[kV], o[kV];
        unpack<F32>(xr[r][k], xdt, u);
        unpack<F32>(zr[r][k], xdt, z);
        if (RES && p.residual) {  // re-read (an L1 / L2 hit: the first phase loaded it)
          float rv[kV];
          load_vec<kV>(p.residual, p.res_dtype, p.res_rows.row_offset(row) + col[k], rv);
#pragma unroll
          for (int e = 0; e < kV; ++e) u[e] += rv[e];
        }
        float wl[kV];
        if (!kHoistW) load_param(p.weight, p.w_dtype, p.w_row, col[k], vf.w, 1.f, wl);
        const float(&w)[kV] = kHoistW ? wh[0] : wl;
        load_param(p.bias, p.b_dtype, p.b_row, col[k], vf.b, 0.f, b);
#pragma unroll
        for (int e = 0; e < kV; ++e) o[e] = fwd_out(p.act, fast, nbg, u[e], z[e], rs, w[e], b[e]);
        store_vec<kV>(p.y, xdt, yo + col[k], o);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------
// Packed team forward (implementation cuda.sm90.team_packed): 16-bit x / z / y, no residual, rows of D <= 1024
// features with a team choice of choose() (tpr <= 32). One row per team per step on a grid of 256-thread
// blocks that covers the rows in one pass (a grid stride only beyond 2^31 - 1 blocks), the x and z chunks
// kept packed (one uint4 each, 16-byte loads that bypass L1), act(z) recomputed after the reduction, and
// registers capped so that 5 blocks (40 warps) share an SM: fwd_team_rows holds 4 rows per team at ~96
// registers, 20 warps per SM, and spends long math phases with no load in flight (session-4 ncu: 2.85 TB/s,
// 30% achieved occupancy for [1048576, 128]); here many more warps are resident, so some are always loading
// while others compute. Activation dtype, gate order and activation are run-time values (few instances).
// 48 / 64 / 80 registers for 1 / 2 / 4 chunks per lane (5 / 4 / 3 blocks per SM); 40 registers for one
// chunk made ptxas spill 152 bytes per thread (sm_90a, nvcc 13).
template <int NV>
constexpr int fwd_packed_min_blocks() {
  return NV == 1 ? 5 : NV == 2 ? 4 : 3;
}
// Row offsets: row_off (cuda_common.cuh), as the packed forward takes only equally spaced rows (host-checked).
template <int TPR, int NV>
__global__ void __launch_bounds__(kBlock, fwd_packed_min_blocks<NV>())
    fwd_team_packed(const RmsNormGatedFwdParams p, const VecFlags vf, const bool hints) {
  constexpr int TB = kBlock / TPR;  // row teams per block
  constexpr bool kHoistW = NV == 1;
  static_assert(TPR <= 32, "teams only");
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const int32_t xdt = p.x_dtype;  // bf16 or f16 (host-checked)
  const float inv_g = 1.f / static_cast<float>(p.group);
  const int nc = static_cast<int>(p.D / kV);
  float wh[kHoistW ? kV : 1];
  if constexpr (kHoistW)
    if (t < nc) load_param(p.weight, p.w_dtype, p.w_row, static_cast<int64_t>(t) * kV, vf.w, 1.f, wh);
  const int64_t step = static_cast<int64_t>(gridDim.x) * TB;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * TB; base < p.rows; base += step) {  // uniform per block
    const int64_t row = base + team;
    const bool live = row < p.rows;  // dead lanes stay for the shuffles but touch no memory
    const char* xr = static_cast<const char*>(p.x) + (live ? row_off(p.x_rows, row) * 2 : 0);
    const char* zr = static_cast<const char*>(p.z) + (live ? row_off(p.z_rows, row) * 2 : 0);
    uint4 xv[NV], zv[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int ci = t + k * TPR;
      const bool in = live && ci < nc;
      xv[k] = in ? cuda::ld_vec16(xr + static_cast<int64_t>(ci) * 16, hints) : make_uint4(0, 0, 0, 0);
      zv[k] = in ? cuda::ld_vec16(zr + static_cast<int64_t>(ci) * 16, hints) : make_uint4(0, 0, 0, 0);
    }
    team_fwd_row<TPR, NV, kHoistW>(
        p, vf, inv_g, xv, zv, t, live, wh, [&] { return YsOffs{row_off(p.y_rows, row), row_off(p.rstd_rows, row)}; },
        [&](int64_t yo, int64_t col, const float (&o)[kV]) { store_vec<kV>(p.y, xdt, yo + col, o); });
  }
}

// ------------------------------------------------------------------------------------------------------
// Packed 16-byte loads for the streaming backward: hints, L1 bypassed and 256-byte L2 fetches (ld_stream, the
// form since session 4); else plain ld.global.v4 (session 12 A/B).
template <bool F32>
__device__ __forceinline__ Packed<F32> load_packed_stream(const void* base, int64_t i, bool hints) {
  Packed<F32> r;
  if constexpr (F32) {
    const float* b = static_cast<const float*>(base) + i;
    r.q[0] = cuda::ld_vec16(b, hints);
    r.q[1] = cuda::ld_vec16(b + 4, hints);
  } else {
    r.q[0] = cuda::ld_vec16(static_cast<const uint16_t*>(base) + i, hints);
  }
  return r;
}

// ------------------------------------------------------------------------------------------------------
// A block per row (1024 < D <= 8192 or groups that do not fit a lane team), kBlock threads, NV <= 4 chunks
// per thread. Holding a row as floats took 160-255 registers (one 256-thread block per SM, ~20 KiB in
// flight), so the loads stay packed (a 16-bit chunk is one uint4) and the derived values are recomputed in
// the second phase from the packed inputs; weights, bias and a residual are re-read per row (L1 / L2 hits).
// The backward keeps its dweight / dbias sums in shared memory (dynamic, 2 x D floats; thread-exclusive
// columns, laid out [e][chunk] so a warp's accesses are conflict-free) instead of 64 registers.

// Column facts of a block-per-row thread (row independent).
template <int NV>
struct BlockCols {
  int64_t col[NV], rcol[NV];
  bool has[NV], gstart[NV];
  int gidx[NV];
  __device__ BlockCols(int64_t D, int64_t G, int64_t rstd_col_stride) {
    const int nc = static_cast<int>(D / kV), gc = static_cast<int>(G / kV);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int ci = threadIdx.x + k * kBlock;
      has[k] = ci < nc;
      col[k] = static_cast<int64_t>(ci) * kV;
      gidx[k] = has[k] ? ci / gc : -1;
      gstart[k] = has[k] && ci % gc == 0;
      rcol[k] = has[k] ? static_cast<int64_t>(gidx[k]) * rstd_col_stride : 0;
    }
  }
};

template <bool F32, int NV>
__global__ void __launch_bounds__(kBlock) fwd_block_rows(const RmsNormGatedFwdParams p, const VecFlags vf) {
  __shared__ float red[kMaxChunks], gsum[kMaxChunks];
  const int32_t xdt = F32 ? STRATA_DTYPE_F32 : (p.x_dtype == STRATA_DTYPE_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16);
  constexpr bool fast = !F32;
  const float inv_g = 1.f / static_cast<float>(p.group);
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  const BlockCols<NV> bc(p.D, p.group, p.rstd_rows.col_stride);
  const bool nbg = p.norm_before_gate;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t xo = p.x_rows.row_offset(row), zo = p.z_rows.row_offset(row);
    const int64_t ro = p.residual ? p.res_rows.row_offset(row) : 0;
    Packed<F32> xr[NV], zr[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (bc.has[k]) {
        xr[k] = load_packed<F32>(p.x, xo + bc.col[k]);
        zr[k] = load_packed<F32>(p.z, zo + bc.col[k]);
      }
    // h = x (+ residual), u = h (norm_before_gate) or h act(z); per-chunk sums of u^2.
    float part[NV], tot[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      part[k] = 0.f;
      if (!bc.has[k]) continue;
      float u[kV];
      unpack<F32>(xr[k], xdt, u);
      if (p.residual) {
        float r[kV];
        load_vec<kV>(p.residual, p.res_dtype, ro + bc.col[k], r);
#pragma unroll
        for (int e = 0; e < kV; ++e) u[e] += r[e];
        if (p.residual_out) store_vec<kV>(p.residual_out, p.res_out_dtype, p.res_out_rows.row_offset(row) + bc.col[k], u);
      } else if (p.residual_out) {
        store_vec<kV>(p.residual_out, p.res_out_dtype, p.res_out_rows.row_offset(row) + bc.col[k], u);
      }
      if (!nbg) {
        float z[kV];
        unpack<F32>(zr[k], xdt, z);
#pragma unroll
        for (int e = 0; e < kV; ++e) u[e] *= vact(p.act, fast, z[e]);
      }
#pragma unroll
      for (int e = 0; e < kV; ++e) part[k] = fmaf(u[e], u[e], part[k]);
    }
    block_group_totals<NV>(part, tot, nc, gc, bc.gidx, red, gsum);
    const int64_t yo = p.y_rows.row_offset(row), so = p.rstd_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (!bc.has[k]) continue;
      const float rs = rsqrtf(tot[k] * inv_g + p.eps);
      if (bc.gstart[k]) store_one(p.rstd, p.rstd_dtype, so + bc.rcol[k], rs);
      float u[kV], z[kV], w[kV], b[kV], o[kV];
      unpack<F32>(xr[k], xdt, u);
      unpack<F32>(zr[k], xdt, z);
      if (p.residual) {  // re-read (the first phase's load of this chunk: an L1 / L2 hit)
        float r[kV];
        load_vec<kV>(p.residual, p.res_dtype, ro + bc.col[k], r);
#pragma unroll
        for (int e = 0; e < kV; ++e) u[e] += r[e];
      }
      load_param(p.weight, p.w_dtype, p.w_row, bc.col[k], vf.w, 1.f, w);
      load_param(p.bias, p.b_dtype, p.b_row, bc.col[k], vf.b, 0.f, b);
#pragma unroll
      for (int e = 0; e < kV; ++e) o[e] = fwd_out(p.act, fast, nbg, u[e], z[e], rs, w[e], b[e]);
      store_vec<kV>(p.y, xdt, yo + bc.col[k], o);
    }
  }
}

// Dynamic shared memory: 2 * D floats (dweight, dbias sums of this block's rows; [e][chunk] layout).
template <bool F32, int NV>
__global__ void __launch_bounds__(kBlock) bwd_block_rows(const RmsNormGatedBwdParams p, const VecFlags vf) {
  __shared__ float red[kMaxChunks], gsum[kMaxChunks];
  extern __shared__ float acc[];  // [2][kV][nc]
  const int32_t xdt = F32 ? STRATA_DTYPE_F32 : (p.x_dtype == STRATA_DTYPE_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16);
  constexpr bool fast = !F32;
  const float inv_g = 1.f / static_cast<float>(p.group);
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  const BlockCols<NV> bc(p.D, p.group, p.rstd_rows.col_stride);
  const bool nbg = p.norm_before_gate, want_wb = p.dweight || p.dbias;
  float* accw = acc;
  float* accb = acc + kV * nc;
  if (want_wb)
    for (int i = threadIdx.x; i < 2 * kV * nc; i += kBlock) acc[i] = 0.f;
  __syncthreads();  // the zeroing strides over other threads' columns
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t xo = p.x_rows.row_offset(row), zo = p.z_rows.row_offset(row), go = p.dy_rows.row_offset(row);
    const int64_t ro = p.residual ? p.res_rows.row_offset(row) : 0;
    const int64_t so = p.rstd_rows.row_offset(row);
    Packed<F32> xr[NV], zr[NV], gr[NV];
    float rk[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      rk[k] = 0.f;
      if (bc.has[k]) {
        xr[k] = load_packed<F32>(p.x, xo + bc.col[k]);
        zr[k] = load_packed<F32>(p.z, zo + bc.col[k]);
        gr[k] = load_packed<F32>(p.dy, go + bc.col[k]);
        rk[k] = load_one(p.rstd, p.rstd_dtype, so + bc.rcol[k]);
      }
    }
    // Phase 1: nrm, dn, dz (norm_before_gate), dweight / dbias, per-chunk sums of dn nrm.
    float part[NV], tot[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      part[k] = 0.f;
      if (!bc.has[k]) continue;
      const float rr = rk[k];
      float h[kV], z[kV], dy[kV], w[kV];
      unpack<F32>(xr[k], xdt, h);
      unpack<F32>(zr[k], xdt, z);
      unpack<F32>(gr[k], xdt, dy);
      if (p.residual) {
        float r[kV];
        load_vec<kV>(p.residual, p.res_dtype, ro + bc.col[k], r);
#pragma unroll
        for (int e = 0; e < kV; ++e) h[e] += r[e];
      }
      load_param(p.weight, p.w_dtype, p.w_row, bc.col[k], vf.w, 1.f, w);
      const int ci = static_cast<int>(bc.col[k] / kV);
      if (nbg) {
        float b[kV], dz[kV];
        load_param(p.bias, p.b_dtype, p.b_row, bc.col[k], vf.b, 0.f, b);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          float xh, dov;
          bwd_nbg_terms(p.act, fast, h[e], z[e], dy[e], rr, w[e], b[e], dz[e], xh, dov);
          if (want_wb) {
            accw[e * nc + ci] = fmaf(dov, xh, accw[e * nc + ci]);
            accb[e * nc + ci] += dov;
          }
          part[k] = fmaf(dov * w[e], xh, part[k]);
        }
        store_vec<kV>(p.dz, xdt, p.dz_rows.row_offset(row) + bc.col[k], dz);
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float uh = bwd_gbn_uh(p.act, fast, h[e], z[e], rr);
          if (want_wb) {
            accw[e * nc + ci] = fmaf(dy[e], uh, accw[e * nc + ci]);
            accb[e * nc + ci] += dy[e];
          }
          part[k] = fmaf(dy[e] * w[e], uh, part[k]);
        }
      }
    }
    block_group_totals<NV>(part, tot, nc, gc, bc.gidx, red, gsum);
    // Phase 2 (recomputed from the packed inputs): dx (+ dresidual_out), dz for gate_before_norm.
    const int64_t dxo = p.dx_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (!bc.has[k]) continue;
      const float mean = tot[k] * inv_g, rr = rk[k];
      float h[kV], z[kV], dy[kV], w[kV], dx[kV];
      unpack<F32>(xr[k], xdt, h);
      unpack<F32>(zr[k], xdt, z);
      unpack<F32>(gr[k], xdt, dy);
      if (p.residual) {
        float r[kV];
        load_vec<kV>(p.residual, p.res_dtype, ro + bc.col[k], r);
#pragma unroll
        for (int e = 0; e < kV; ++e) h[e] += r[e];
      }
      load_param(p.weight, p.w_dtype, p.w_row, bc.col[k], vf.w, 1.f, w);
      if (nbg) {
#pragma unroll
        for (int e = 0; e < kV; ++e) dx[e] = bwd_nbg_dx(h[e], rr, mean, dy[e] * vact(p.act, fast, z[e]) * w[e]);
      } else {
        float dz[kV];
#pragma unroll
        for (int e = 0; e < kV; ++e) bwd_gbn_dxdz(p.act, fast, h[e], z[e], dy[e], rr, mean, w[e], dx[e], dz[e]);
        store_vec<kV>(p.dz, xdt, p.dz_rows.row_offset(row) + bc.col[k], dz);
      }
      if (p.dres_out) {
        float g[kV];
        load_vec<kV>(p.dres_out, p.dres_out_dtype, p.dres_out_rows.row_offset(row) + bc.col[k], g);
#pragma unroll
        for (int e = 0; e < kV; ++e) dx[e] += g[e];
      }
      store_vec<kV>(p.dx, xdt, dxo + bc.col[k], dx);
    }
  }
  if (!want_wb) return;
  // This block's partial rows (each thread its own columns, summed over its rows in row order).
  float* out_w = p.partial + static_cast<int64_t>(blockIdx.x) * p.D;
  float* out_b = p.partial + (static_cast<int64_t>(p.num_partials) + blockIdx.x) * p.D;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    if (!bc.has[k]) continue;
    const int ci = static_cast<int>(bc.col[k] / kV);
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      out_w[bc.col[k] + e] = accw[e * nc + ci];
      out_b[bc.col[k] + e] = accb[e * nc + ci];
    }
  }
}

// ------------------------------------------------------------------------------------------------------
// Forward, looped (any layout): a block per row, warp w takes groups w, w + 8, ...; lanes stride the group.

__device__ __forceinline__ float h_at(const RmsNormGatedFwdParams& p, int64_t row, int64_t j) {
  float h = load_one(p.x, p.x_dtype, p.x_rows.row_offset(row) + j * p.x_rows.col_stride);
  if (p.residual) h += load_one(p.residual, p.res_dtype, p.res_rows.row_offset(row) + j * p.res_rows.col_stride);
  return h;
}

__global__ void __launch_bounds__(kBlock) fwd_looped(const RmsNormGatedFwdParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t ng = p.D / p.group;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t zo = p.z_rows.row_offset(row), zc = p.z_rows.col_stride;
    for (int64_t g = warp; g < ng; g += kBlock / 32) {
      const int64_t j0 = g * p.group, j1 = j0 + p.group;
      float ss = 0.f;
      for (int64_t j = j0 + lane; j < j1; j += 32) {
        const float h = h_at(p, row, j);
        if (p.residual_out)
          store_one(p.residual_out, p.res_out_dtype,
                    p.res_out_rows.row_offset(row) + j * p.res_out_rows.col_stride, h);
        const float u = p.norm_before_gate ? h : h * rng_act(p.act, load_one(p.z, p.x_dtype, zo + j * zc));
        ss = fmaf(u, u, ss);
      }
      ss = cuda::group_sum<32>(ss);
      const float r = rsqrtf(ss / static_cast<float>(p.group) + p.eps);
      if (lane == 0) store_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row) + g * p.rstd_rows.col_stride, r);
      for (int64_t j = j0 + lane; j < j1; j += 32) {
        const float zv = load_one(p.z, p.x_dtype, zo + j * zc);
        const float h = h_at(p, row, j);
        const float u = p.norm_before_gate ? h : h * rng_act(p.act, zv);
        const float w = p.weight ? load_one(p.weight, p.w_dtype, p.w_row.base + j * p.w_row.col_stride) : 1.f;
        const float b = p.bias ? load_one(p.bias, p.b_dtype, p.b_row.base + j * p.b_row.col_stride) : 0.f;
        float o = fmaf(u * r, w, b);
        if (p.norm_before_gate) o *= rng_act(p.act, zv);
        store_one(p.y, p.x_dtype, p.y_rows.row_offset(row) + j * p.y_rows.col_stride, o);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------
// Backward, vector paths.

// Streaming backward of short rows (lane teams, no residual / dresidual_out): a one-wave persistent grid, the
// next rows' x / z / dy / rstd loads issued before the current rows' math, packed loads, weight and bias in
// registers, compile-time activation. bwd_team_rows held h, z and dy as
// floats (R x NV x 24 registers) and ran [1M, 128] at 2.1 x floor with 4096 blocks of 256 threads. dweight /
// dbias: per-thread sums over its rows in row order, then the block's teams added in team order into its
// partial row (the grid, not bwd_partials, sets the partial count: at most bwd_partials rows, which the
// workspace holds); reduce_partials adds the partial rows in fixed order. norm_before_gate keeps dn = dy act(z) w
// as floats for the second phase (act is not evaluated twice); xh is recomputed from the packed h.
template <bool F32, bool SILU, int TPR, int NV, int RPG>
__global__ void __launch_bounds__(kBlock) bwd_stream_rows(const RmsNormGatedBwdParams p, const VecFlags vf,
                                                          const bool hints) {
  static_assert(TPR <= 32, "lane teams only");
  constexpr int GPB = kBlock / TPR;
  constexpr int kCols = TPR * NV * kV;  // features a team covers (>= D)
  __shared__ float colbuf[GPB * kCols];
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const int32_t xdt = F32 ? STRATA_DTYPE_F32 : (p.x_dtype == STRATA_DTYPE_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16);
  constexpr bool fast = !F32;
  constexpr int32_t act = SILU ? kActSilu : kActSigmoid;
  const bool nbg = p.norm_before_gate, want_wb = p.dweight || p.dbias;
  const float inv_g = 1.f / static_cast<float>(p.group);
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  int col[NV], rcol[NV];
  bool has[NV];
  float w[NV][kV], b[NV][kV], dw[NV][kV], db[NV][kV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int ci = t + k * TPR;
    has[k] = ci < nc;
    col[k] = ci * kV;
    rcol[k] = has[k] ? static_cast<int>((ci / gc) * p.rstd_rows.col_stride) : 0;
    load_param(p.weight, p.w_dtype, p.w_row, has[k] ? col[k] : 0, vf.w, 1.f, w[k]);
    load_param(nbg ? p.bias : nullptr, p.b_dtype, p.b_row, has[k] ? col[k] : 0, vf.b, 0.f, b[k]);
#pragma unroll
    for (int e = 0; e < kV; ++e) dw[k][e] = db[k][e] = 0.f;
  }
  const int64_t ngroups = (p.rows + RPG - 1) / RPG;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * GPB;
  struct Buf {
    Packed<F32> x[RPG][NV], z[RPG][NV], g[RPG][NV];
    float rk[RPG][NV];
  };
  auto load = [&](int64_t grp, Buf& bf) {
#pragma unroll
    for (int r = 0; r < RPG; ++r) {
      const int64_t row = grp * RPG + r;
      if (grp >= ngroups || row >= p.rows) continue;
      const int64_t xo = p.x_rows.row_offset(row), zo = p.z_rows.row_offset(row), go = p.dy_rows.row_offset(row);
      const int64_t so = p.rstd_rows.row_offset(row);
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (has[k]) {
          bf.x[r][k] = load_packed_stream<F32>(p.x, xo + col[k], hints);
          bf.z[r][k] = load_packed_stream<F32>(p.z, zo + col[k], hints);
          bf.g[r][k] = load_packed_stream<F32>(p.dy, go + col[k], hints);
          bf.rk[r][k] = load_one(p.rstd, p.rstd_dtype, so + rcol[k]);
        }
    }
  };
  int64_t it = static_cast<int64_t>(blockIdx.x) * GPB;  // uniform across the block
  if (it < ngroups) {
    Buf cur, nxt;
    load(it + team, cur);
    for (;;) {
      const int64_t nit = it + stride;
      const bool more = nit < ngroups;
      if (more) load(nit + team, nxt);
      const int64_t grp = it + team;
      float tot[RPG][NV], dn[RPG][NV][kV];
      // Phase 1: dz (norm_before_gate), dweight / dbias, per-chunk partials of sum(dn * normalised value).
#pragma unroll
      for (int r = 0; r < RPG; ++r) {
        const int64_t row = grp * RPG + r;
        const bool live = grp < ngroups && row < p.rows;  // dead lanes join the shuffles only
        float part[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          part[k] = 0.f;
          if (!(live && has[k])) continue;
          float h[kV], z[kV], dy[kV], dz[kV];
          unpack<F32>(cur.x[r][k], xdt, h);
          unpack<F32>(cur.z[r][k], xdt, z);
          unpack<F32>(cur.g[r][k], xdt, dy);
          part[k] = bwd_team_phase1(act, fast, nbg, h, z, dy, cur.rk[r][k], w[k], b[k], dw[k], db[k], dn[r][k], dz);
          if (nbg) store_vec<kV>(p.dz, xdt, p.dz_rows.row_offset(row) + col[k], dz);
        }
        group_totals<TPR, NV>(part, tot[r], p.group, p.D, t, nullptr);
      }
      // Phase 2: dx, and dz for gate_before_norm.
#pragma unroll
      for (int r = 0; r < RPG; ++r) {
        const int64_t row = grp * RPG + r;
        if (grp >= ngroups || row >= p.rows) continue;
        const int64_t dxo = p.dx_rows.row_offset(row);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          if (!has[k]) continue;
          const float mean = tot[r][k] * inv_g, rr = cur.rk[r][k];
          float h[kV], dx[kV];
          unpack<F32>(cur.x[r][k], xdt, h);
          if (nbg) {
#pragma unroll
            for (int e = 0; e < kV; ++e) dx[e] = bwd_nbg_dx(h[e], rr, mean, dn[r][k][e]);
          } else {
            float z[kV], dy[kV], dz[kV];
            unpack<F32>(cur.z[r][k], xdt, z);
            unpack<F32>(cur.g[r][k], xdt, dy);
#pragma unroll
            for (int e = 0; e < kV; ++e) bwd_gbn_dxdz(act, fast, h[e], z[e], dy[e], rr, mean, w[k][e], dx[e], dz[e]);
            store_vec<kV>(p.dz, xdt, p.dz_rows.row_offset(row) + col[k], dz);
          }
          store_vec<kV>(p.dx, xdt, dxo + col[k], dx);
        }
      }
      if (!more) break;
      cur = nxt;
      it = nit;
    }
  }
  // This block's partial row (a block without rows writes zeros).
  if (want_wb) write_team_partials<TPR, NV>(p, colbuf, GPB, dw, db);  // uniform
}

// R rows per team per iteration (loads of all of them in flight before the reductions); column facts and
// weight chunks loaded once per thread. Everything the second phase needs stays in registers (no reload of h
// and z for gate_before_norm).
template <bool F32, int TPR, int NV, int R>
__global__ void __launch_bounds__(kBlock) bwd_team_rows(const RmsNormGatedBwdParams p, const VecFlags vf) {
  constexpr int TB = kBlock / TPR;
  constexpr int kCols = TPR * NV * kV;  // features a team covers (>= D)
  static_assert(TPR <= 32, "a block per row: bwd_block_rows");
  __shared__ float colbuf[TB * kCols];
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const float inv_g = 1.f / static_cast<float>(p.group);
  const bool want_wb = p.dweight || p.dbias;
  // The activation dtype as a value the compiler can see: F32 kernels drop the 16-bit paths and vice versa.
  const int32_t xdt = F32 ? STRATA_DTYPE_F32 : (p.x_dtype == STRATA_DTYPE_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16);
  constexpr bool fast = !F32;
  const bool nbg = p.norm_before_gate;
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  int64_t col[NV], rcol[NV];
  bool has[NV];
  int gidx[NV];
  float w[NV][kV], dw[NV][kV], db[NV][kV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int ci = t + k * TPR;
    has[k] = ci < nc;
    col[k] = static_cast<int64_t>(ci) * kV;
    gidx[k] = has[k] ? ci / gc : -1;
    rcol[k] = has[k] ? static_cast<int64_t>(gidx[k]) * p.rstd_rows.col_stride : 0;
#pragma unroll
    for (int e = 0; e < kV; ++e) w[k][e] = 1.f, dw[k][e] = db[k][e] = 0.f;
    if (has[k]) load_param(p.weight, p.w_dtype, p.w_row, col[k], vf.w, 1.f, w[k]);
  }

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * TB * R; base < p.rows;
       base += static_cast<int64_t>(gridDim.x) * TB * R) {
    // Phase 1 loads: h (x + residual), z, dy and rstd of R rows.
    float h[R][NV][kV], zv[R][NV][kV], dyv[R][NV][kV], rk[R][NV];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * TB + team;
      const bool live = row < p.rows;
      const int64_t xo = live ? p.x_rows.row_offset(row) : 0;
      const int64_t ro = live && p.residual ? p.res_rows.row_offset(row) : 0;
      const int64_t zo = live ? p.z_rows.row_offset(row) : 0;
      const int64_t go = live ? p.dy_rows.row_offset(row) : 0;
      const int64_t so = live ? p.rstd_rows.row_offset(row) : 0;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (live && has[k]) {
          load_h(p.x, xdt, xo + col[k], p.residual, p.res_dtype, ro + col[k], h[r][k]);
          load_vec<kV>(p.z, xdt, zo + col[k], zv[r][k]);
          load_vec<kV>(p.dy, xdt, go + col[k], dyv[r][k]);
          rk[r][k] = load_one(p.rstd, p.rstd_dtype, so + rcol[k]);
        } else {
#pragma unroll
          for (int e = 0; e < kV; ++e) h[r][k][e] = zv[r][k][e] = dyv[r][k][e] = 0.f;
          rk[r][k] = 0.f;
        }
      }
    }
    // Phase 1 math: nrm (normalised value), dn (its incoming gradient), dz (norm_before_gate), dw / db, and
    // the per-chunk partials of sum(dn nrm); then the group sums.
    float tot[R][NV];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * TB + team;
      const bool live = row < p.rows;
      float part[NV];
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        part[k] = 0.f;
        if (!(live && has[k])) continue;
        const float rr = rk[r][k];
        if (nbg) {
          float b[kV], dz[kV];
          load_param(p.bias, p.b_dtype, p.b_row, col[k], vf.b, 0.f, b);
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            float xh, dov;
            bwd_nbg_terms(p.act, fast, h[r][k][e], zv[r][k][e], dyv[r][k][e], rr, w[k][e], b[e], dz[e], xh, dov);
            dw[k][e] = fmaf(dov, xh, dw[k][e]);
            db[k][e] += dov;
            dyv[r][k][e] = dov * w[k][e];  // dy now holds dn
            part[k] = fmaf(dyv[r][k][e], xh, part[k]);
          }
          store_vec<kV>(p.dz, xdt, p.dz_rows.row_offset(row) + col[k], dz);
        } else {
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            const float uh = bwd_gbn_uh(p.act, fast, h[r][k][e], zv[r][k][e], rr);
            dw[k][e] = fmaf(dyv[r][k][e], uh, dw[k][e]);
            db[k][e] += dyv[r][k][e];
            part[k] = fmaf(dyv[r][k][e] * w[k][e], uh, part[k]);  // h, z and dy stay for phase 2
          }
        }
      }
      group_totals<TPR, NV>(part, tot[r], p.group, p.D, t, nullptr);
    }
    // Phase 2: dx (+ dresidual_out), and dz for gate_before_norm.
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * TB + team;
      if (row >= p.rows) continue;
      const int64_t dxo = p.dx_rows.row_offset(row);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (!has[k]) continue;
        const float mean = tot[r][k] * inv_g, rr = rk[r][k];
        float dx[kV];
        if (nbg) {
#pragma unroll
          for (int e = 0; e < kV; ++e) dx[e] = bwd_nbg_dx(h[r][k][e], rr, mean, dyv[r][k][e]);
        } else {
          float dz[kV];
#pragma unroll
          for (int e = 0; e < kV; ++e)
            bwd_gbn_dxdz(p.act, fast, h[r][k][e], zv[r][k][e], dyv[r][k][e], rr, mean, w[k][e], dx[e], dz[e]);
          store_vec<kV>(p.dz, xdt, p.dz_rows.row_offset(row) + col[k], dz);
        }
        if (p.dres_out) {
          float g[kV];
          load_vec<kV>(p.dres_out, p.dres_out_dtype, p.dres_out_rows.row_offset(row) + col[k], g);
#pragma unroll
          for (int e = 0; e < kV; ++e) dx[e] += g[e];
        }
        store_vec<kV>(p.dx, xdt, dxo + col[k], dx);
      }
    }
  }
  // This block's partial row: its teams' sums added in team order (fixed).
  if (want_wb) write_team_partials<TPR, NV>(p, colbuf, TB, dw, db);
}

// ------------------------------------------------------------------------------------------------------
// Backward, looped (any layout). Feature j of every row is always handled by the same thread (warp
// g mod 8, lane (j - g G) mod 32), which adds into this block's partial row: no other thread touches it.

__device__ __forceinline__ float bh_at(const RmsNormGatedBwdParams& p, int64_t row, int64_t j) {
  float h = load_one(p.x, p.x_dtype, p.x_rows.row_offset(row) + j * p.x_rows.col_stride);
  if (p.residual) h += load_one(p.residual, p.res_dtype, p.res_rows.row_offset(row) + j * p.res_rows.col_stride);
  return h;
}

__global__ void __launch_bounds__(kBlock) bwd_looped(const RmsNormGatedBwdParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t ng = p.D / p.group;
  const bool want_wb = p.dweight || p.dbias;
  float* pw = p.partial + static_cast<int64_t>(blockIdx.x) * p.D;
  float* pb = p.partial + (static_cast<int64_t>(p.num_partials) + blockIdx.x) * p.D;
  if (want_wb)
    for (int64_t g = warp; g < ng; g += kBlock / 32)
      for (int64_t j = g * p.group + lane; j < (g + 1) * p.group; j += 32) pw[j] = pb[j] = 0.f;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t zo = p.z_rows.row_offset(row), zc = p.z_rows.col_stride;
    const int64_t go = p.dy_rows.row_offset(row), gcs = p.dy_rows.col_stride;
    for (int64_t g = warp; g < ng; g += kBlock / 32) {
      const int64_t j0 = g * p.group, j1 = j0 + p.group;
      const float r = load_one(p.rstd, p.rstd_dtype, p.rstd_rows.row_offset(row) + g * p.rstd_rows.col_stride);
      float dot = 0.f;
      // Pass 1: dz (norm_before_gate), dw/db, and the dot product of the group.
      for (int64_t j = j0 + lane; j < j1; j += 32) {
        const float h = bh_at(p, row, j), zv = load_one(p.z, p.x_dtype, zo + j * zc);
        const float dyv = load_one(p.dy, p.x_dtype, go + j * gcs);
        const float w = p.weight ? load_one(p.weight, p.w_dtype, p.w_row.base + j * p.w_row.col_stride) : 1.f;
        float nrm, dn, dwv, dbv;
        if (p.norm_before_gate) {
          const float b = p.bias ? load_one(p.bias, p.b_dtype, p.b_row.base + j * p.b_row.col_stride) : 0.f;
          nrm = h * r;
          const float dov = dyv * rng_act(p.act, zv);
          store_one(p.dz, p.x_dtype, p.dz_rows.row_offset(row) + j * p.dz_rows.col_stride,
                    dyv * fmaf(nrm, w, b) * rng_act_grad(p.act, zv));
          dwv = dov * nrm, dbv = dov, dn = dov * w;
        } else {
          nrm = h * rng_act(p.act, zv) * r;
          dwv = dyv * nrm, dbv = dyv, dn = dyv * w;
        }
        if (want_wb) pw[j] += dwv, pb[j] += dbv;
        dot = fmaf(dn, nrm, dot);
      }
      const float mean = cuda::group_sum<32>(dot) / static_cast<float>(p.group);
      // Pass 2: dx (and dz for gate_before_norm), recomputing the per-element values.
      for (int64_t j = j0 + lane; j < j1; j += 32) {
        const float h = bh_at(p, row, j), zv = load_one(p.z, p.x_dtype, zo + j * zc);
        const float dyv = load_one(p.dy, p.x_dtype, go + j * gcs);
        const float w = p.weight ? load_one(p.weight, p.w_dtype, p.w_row.base + j * p.w_row.col_stride) : 1.f;
        float dx;
        if (p.norm_before_gate) {
          const float nrm = h * r, dn = dyv * rng_act(p.act, zv) * w;
          dx = r * fmaf(-nrm, mean, dn);
        } else {
          const float nrm = h * rng_act(p.act, zv) * r, dn = dyv * w;
          const float du = r * fmaf(-nrm, mean, dn);
          store_one(p.dz, p.x_dtype, p.dz_rows.row_offset(row) + j * p.dz_rows.col_stride,
                    du * h * rng_act_grad(p.act, zv));
          dx = du * rng_act(p.act, zv);
        }
        if (p.dres_out)
          dx += load_one(p.dres_out, p.dres_out_dtype,
                         p.dres_out_rows.row_offset(row) + j * p.dres_out_rows.col_stride);
        store_one(p.dx, p.x_dtype, p.dx_rows.row_offset(row) + j * p.dx_rows.col_stride, dx);
      }
    }
  }
}

// Final fixed-order reduction of the partial rows: blockIdx.y 0 -> dweight, 1 -> dbias. A block of 1024
// threads covers 32 features with 32 slices; slice s adds partial rows s, s + 32, ... into four interleaved
// accumulators (four loads in flight; with one, the 512 dependent L2 loads per thread of a [1M, 128] backward
// cost ~0.1 ms), then slice 0 adds the 32 slices in order. Fixed order: the same bits every run.
constexpr int kRedSlices = 32;
__global__ void __launch_bounds__(32 * kRedSlices) reduce_partials(const RmsNormGatedBwdParams p) {
  __shared__ float buf[kRedSlices][33];
  const int col = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + col;
  const bool bias = blockIdx.y == 1;
  void* out = bias ? p.dbias : p.dweight;
  if (!out) return;  // uniform over the block
  const float* part = p.partial + (bias ? p.num_partials * p.D : 0);
  float s = 0.f;
  if (j < p.D) {
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    int64_t b = slice;
    for (; b + 3 * kRedSlices < p.num_partials; b += 4 * kRedSlices) {
      a0 += part[b * p.D + j];
      a1 += part[(b + kRedSlices) * p.D + j];
      a2 += part[(b + 2 * kRedSlices) * p.D + j];
      a3 += part[(b + 3 * kRedSlices) * p.D + j];
    }
    for (; b < p.num_partials; b += kRedSlices) a0 += part[b * p.D + j];
    s = (a0 + a1) + (a2 + a3);
  }
  buf[slice][col] = s;
  __syncthreads();
  if (slice == 0 && j < p.D) {
    float tsum = 0.f;
    for (int q = 0; q < kRedSlices; ++q) tsum += buf[q][col];
    const RowLayout& l = bias ? p.db_row : p.dw_row;
    store_one(out, bias ? p.db_dtype : p.dw_dtype, l.base + j * l.col_stride, tsum);
  }
}

// Rows per team per iteration of the forward: enough chunks per thread (R * NV = 4) for 4 x 2 16-byte loads
// in flight; a block per row (TPR = kBlock) takes one row at a time.
template <int TPR, int NV>
constexpr int fwd_rows_per_iter() {
  return TPR > 32 || NV >= 4 ? 1 : 4 / NV;
}

// Grid cap of the grid-stride kernels: a few waves of 256-thread blocks (weights and column facts are then
// loaded once per block, and the tail wave is short).
int64_t grid_cap() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0) sms = n;
  }
  return static_cast<int64_t>(sms) * 32;
}

template <int TPR, int NV>
strata_status launch_fwd(const RmsNormGatedFwdParams& p, const VecFlags& vf, cudaStream_t s) {
  if constexpr (TPR > 32) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(p.rows, grid_cap()));
    if (p.x_dtype == STRATA_DTYPE_F32) fwd_block_rows<true, NV><<<blocks, kBlock, 0, s>>>(p, vf);
    else fwd_block_rows<false, NV><<<blocks, kBlock, 0, s>>>(p, vf);
    return cuda::check_launch("rms_norm_gated fwd_block_rows");
  } else {
    constexpr int TB = kTeamBlock / TPR, R = fwd_rows_per_iter<TPR, NV>();
    const int64_t blocks = std::min<int64_t>((p.rows + TB * R - 1) / (TB * R), 2 * grid_cap());
    const unsigned g = static_cast<unsigned>(blocks);
    const bool res = p.residual || p.residual_out;
    if (p.x_dtype == STRATA_DTYPE_F32) {
      if (res) fwd_team_rows<true, true, TPR, NV, R><<<g, kTeamBlock, 0, s>>>(p, vf);
      else fwd_team_rows<true, false, TPR, NV, R><<<g, kTeamBlock, 0, s>>>(p, vf);
    } else {
      if (res) fwd_team_rows<false, true, TPR, NV, R><<<g, kTeamBlock, 0, s>>>(p, vf);
      else fwd_team_rows<false, false, TPR, NV, R><<<g, kTeamBlock, 0, s>>>(p, vf);
    }
    return cuda::check_launch("rms_norm_gated fwd_team_rows");
  }
}

// The streaming backward: a one-wave balanced grid of at most `max_blocks` (= bwd_partials: the workspace's
// partial rows); p.num_partials is set to the grid (the partial rows this launch writes).
template <bool F32, bool SILU, int TPR, int NV>
strata_status launch_bwd_stream_inst(RmsNormGatedBwdParams& p, const VecFlags& vf, int64_t max_blocks, bool hints,
                                     cudaStream_t s) {
  constexpr int RPG = 1, GPB = kBlock / TPR;
  const auto kernel = bwd_stream_rows<F32, SILU, TPR, NV, RPG>;
  static const int occ = cuda::occupancy_blocks_per_sm(kernel, kBlock);
  const int64_t need = (((p.rows + RPG - 1) / RPG) + GPB - 1) / GPB;
  const int64_t slots = grid_cap() / 32 * occ;
  int64_t grid = need <= slots ? need : (need + (need + slots - 1) / slots - 1) / ((need + slots - 1) / slots);
  grid = std::max<int64_t>(1, std::min(grid, max_blocks));
  if (p.dweight || p.dbias) p.num_partials = grid;
  kernel<<<static_cast<unsigned>(grid), kBlock, 0, s>>>(p, vf, hints);
  return cuda::check_launch("rms_norm_gated bwd_stream_rows");
}

template <int TPR, int NV>
strata_status launch_bwd_stream(RmsNormGatedBwdParams& p, const VecFlags& vf, int64_t max_blocks, bool hints,
                                cudaStream_t s) {
  const bool silu = p.act == kActSilu;
  if (p.x_dtype == STRATA_DTYPE_F32)
    return silu ? launch_bwd_stream_inst<true, true, TPR, NV>(p, vf, max_blocks, hints, s)
                : launch_bwd_stream_inst<true, false, TPR, NV>(p, vf, max_blocks, hints, s);
  return silu ? launch_bwd_stream_inst<false, true, TPR, NV>(p, vf, max_blocks, hints, s)
              : launch_bwd_stream_inst<false, false, TPR, NV>(p, vf, max_blocks, hints, s);
}

strata_status bwd_stream(RmsNormGatedBwdParams& p, const Config& c, const VecFlags& vf, int64_t max_blocks, bool hints,
                         cudaStream_t s) {
  return visit_team(c, [&](auto tpr, auto nv) {
    return launch_bwd_stream<decltype(tpr)::value, decltype(nv)::value>(p, vf, max_blocks, hints, s);
  });
}

template <int TPR, int NV>
strata_status launch_bwd(const RmsNormGatedBwdParams& p, const VecFlags& vf, int64_t blocks, cudaStream_t s) {
  if constexpr (TPR > 32) {
    // dweight / dbias sums in dynamic shared memory: 2 * D floats (64 KiB at D = 8192, above the 48 KiB
    // default: opt in once per kernel).
    const size_t smem = (p.dweight || p.dbias) ? 2 * static_cast<size_t>(p.D) * sizeof(float) : 0;
    const auto kernel = p.x_dtype == STRATA_DTYPE_F32 ? bwd_block_rows<true, NV> : bwd_block_rows<false, NV>;
    STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(2 * kMaxChunks * kV * sizeof(float))));
    kernel<<<static_cast<unsigned>(blocks), kBlock, smem, s>>>(p, vf);
    return cuda::check_launch("rms_norm_gated bwd_block_rows");
  } else {
    constexpr int R = NV >= 2 ? 1 : 2;
    if (p.x_dtype == STRATA_DTYPE_F32)
      bwd_team_rows<true, TPR, NV, R><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p, vf);
    else
      bwd_team_rows<false, TPR, NV, R><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p, vf);
    return cuda::check_launch("rms_norm_gated bwd_team_rows");
  }
}

// Expands CALL(TPR, NV) for a config from choose() (a macro: the .cu files are C++17, no template lambdas).
#define STRATA_RNG_WITH_CONFIG(c, CALL)              \
  switch ((c).tpr) {                                 \
    case 4: return CALL(4, 1);                       \
    case 8: return CALL(8, 1);                       \
    case 16: return CALL(16, 1);                     \
    case 32:                                         \
      if ((c).nv == 1) return CALL(32, 1);           \
      if ((c).nv == 2) return CALL(32, 2);           \
      return CALL(32, 4);                            \
    default:                                         \
      if ((c).nv == 1) return CALL(kBlock, 1);       \
      if ((c).nv == 2) return CALL(kBlock, 2);       \
      return CALL(kBlock, 4);                        \
  }

strata_status fwd_vec(const RmsNormGatedFwdParams& p, const Config& c, const VecFlags& vf, cudaStream_t s) {
#define STRATA_RNG_FWD(T, N) launch_fwd<T, N>(p, vf, s)
  STRATA_RNG_WITH_CONFIG(c, STRATA_RNG_FWD)
#undef STRATA_RNG_FWD
}
strata_status bwd_vec(const RmsNormGatedBwdParams& p, const Config& c, const VecFlags& vf, int64_t blocks,
                      cudaStream_t s) {
#define STRATA_RNG_BWD(T, N) launch_bwd<T, N>(p, vf, blocks, s)
  STRATA_RNG_WITH_CONFIG(c, STRATA_RNG_BWD)
#undef STRATA_RNG_BWD
}

template <int TPR, int NV>
strata_status launch_fwd_packed(const RmsNormGatedFwdParams& p, const VecFlags& vf, bool hints, cudaStream_t s) {
  constexpr int TB = kBlock / TPR;
  const int64_t blocks = std::min<int64_t>((p.rows + TB - 1) / TB, 0x7fffffff);
  fwd_team_packed<TPR, NV><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p, vf, hints);
  return cuda::check_launch("rms_norm_gated fwd_team_packed");
}

// The team configuration of the packed forward from what a plan knows (dtypes, optional tensors, D, G, the
// column strides), tpr 0 if it does not apply.
Config fwd_packed_config(const RmsNormGatedFwdParams& p) {
  if (p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16) return {};
  if (p.residual || p.residual_out) return {};
  if (!p.x_rows.uniform() || !p.z_rows.uniform() || !p.y_rows.uniform() || !p.rstd_rows.uniform()) return {};
  const Config c = choose(p.D, p.group, p.x_rows.col_stride == 1 && p.z_rows.col_stride == 1 && p.y_rows.col_stride == 1);
  return c.tpr <= 32 ? c : Config{};
}

}  // namespace

std::string rms_norm_gated_fwd_cuda_packed_reject(const RmsNormGatedFwdParams& p) {
  if (p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16) return "handles bf16/f16 x, z, y only";
  if (p.residual || p.residual_out) return "handles no residual / residual_out";
  if (fwd_packed_config(p).tpr == 0)
    return "needs equally spaced rows, unit column strides, D and group multiples of 8, D <= 1024 and a lane-team "
           "group layout";
  return {};
}

int rms_norm_gated_fwd_cuda_packed(const RmsNormGatedFwdParams& p, void* stream, bool l2_hint_loads) {
  if (p.rows == 0 || p.D == 0) return STRATA_SUCCESS;
  const Config c = fwd_packed_config(p);
  // Pointers are known only now: rows that cannot be read in aligned 16-byte chunks take group_rows' kernels.
  if (c.tpr == 0 || !fwd_layouts_ok(p)) return rms_norm_gated_fwd_cuda(p, stream);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const VecFlags vf{param_vec_ok(p.weight, p.w_dtype, p.w_row), param_vec_ok(p.bias, p.b_dtype, p.b_row)};
  return visit_team(c, [&](auto tpr, auto nv) {
    return launch_fwd_packed<decltype(tpr)::value, decltype(nv)::value>(p, vf, l2_hint_loads, s);
  });
}

int64_t rms_norm_gated_cuda_partials(const RmsNormGatedBwdParams& p) { return bwd_partials(p); }

int rms_norm_gated_fwd_cuda(const RmsNormGatedFwdParams& p, void* stream) {
  if (p.rows == 0 || p.D == 0) return STRATA_SUCCESS;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Config c = choose(p.D, p.group, fwd_layouts_ok(p));
  const VecFlags vf{param_vec_ok(p.weight, p.w_dtype, p.w_row), param_vec_ok(p.bias, p.b_dtype, p.b_row)};
  if (c.tpr == 0) {
    const int64_t blocks = std::min<int64_t>(p.rows, int64_t{1} << 30);
    fwd_looped<<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p);
    return cuda::check_launch("rms_norm_gated fwd_looped");
  }
  // A streaming forward of the backward's design (persistent grid, next rows prefetched) ran bf16 [1M, 128] at
  // 1.46 x floor in s4run2 against 1.42 x for fwd_team_rows (s4run1): the team kernel stays.
  return fwd_vec(p, c, vf, s);
}

int rms_norm_gated_bwd_cuda(const RmsNormGatedBwdParams& p_in, void* stream, bool l2_hint_loads) {
  RmsNormGatedBwdParams p = p_in;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  p.num_partials = (p.dweight || p.dbias) ? bwd_partials(p) : 0;
  const int64_t blocks = bwd_partials(p);  // also the grid of the main kernel
  if (blocks > 0) {
    const Config c = bwd_config(p, bwd_layouts_ok(p));
    const VecFlags vf{param_vec_ok(p.weight, p.w_dtype, p.w_row), param_vec_ok(p.bias, p.b_dtype, p.b_row)};
    strata_status st;
    if (c.tpr == 0) {
      bwd_looped<<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p);
      st = cuda::check_launch("rms_norm_gated bwd_looped");
    } else if (c.tpr <= 32 && !p.residual && !p.dres_out) {
      st = bwd_stream(p, c, vf, blocks, l2_hint_loads, s);  // sets p.num_partials for reduce_partials
    } else {
      st = bwd_vec(p, c, vf, blocks, s);
    }
    if (st != STRATA_SUCCESS) return st;
  }
  return rms_norm_gated_bwd_reduce_cuda(p, stream);
}

int rms_norm_gated_bwd_reduce_cuda(const RmsNormGatedBwdParams& p, void* stream) {
  if ((p.dweight || p.dbias) && p.D > 0) {  // zero partial rows (rows == 0): zeros
    const dim3 grid(static_cast<unsigned>((p.D + 31) / 32), 2);
    reduce_partials<<<grid, 32 * kRedSlices, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return cuda::check_launch("rms_norm_gated reduce_partials");
  }
  return STRATA_SUCCESS;
}

}  // namespace strata::norm
