// Bulk-copy ring kernels of rms_norm_gated (implementation cuda.sm90.bulk_ring): 16-bit x / z / dy, no
// residual, D and G multiples of 8 with D <= 8192 (choose() of cuda_common.cuh: lane teams for D <= 1024 with a
// team group layout, else a block per row), equally spaced rows with unit column stride, 16-byte aligned row
// starts (else the register kernels of cuda_sm90.cu run).
//
// Why: the register kernels keep at most 2 x 16 bytes per thread in flight and stall on every row (load ->
// reduce -> store); the [1048576, 128] forward ran at 3.19 TB/s (1.33 x floor, s6run1) with ~30 KiB per SM
// outstanding. Here a persistent CTA (256 threads, two per SM) owns a ring of `stages` shared-memory stages;
// thread 0 fills a stage with cp.async.bulk copies (one per tensor for dense rows, else one per row),
// completing on the stage's mbarrier, and refills it as soon as the CTA has consumed it, so ~96 KiB per CTA
// (~190 KiB per SM) are in flight while the threads compute on the oldest stage. No registers are held by
// loads in flight.
//
// Tile: tr = TB x RPT rows (TB = 256 / TPR teams per CTA, RPT = 2 rows per team for one chunk per lane, else
// 1), i.e. ~8 KiB per tensor for D = 128. Stage s of the ring holds tile k (k = s mod stages) of this CTA's
// tiles blockIdx.x + k gridDim.x: [x tile | z tile (| dy tile)], each tr rows of D x 2 bytes packed. Its
// mbarrier completes once per fill; the k-th wait uses parity (k / stages) & 1. After the CTA's
// __syncthreads (every thread done reading the stage) thread 0 issues fence.proxy.async and the next fill.
// Team math is that of fwd_team_packed / bwd_stream_rows (group sums by lane shuffles, group_totals), the
// chunks read from shared memory instead of global memory; outputs are stored with st.global.cs.
// Backward: rstd of the next tile is loaded into registers while the current one is processed; dweight /
// dbias are per-thread sums in row order, added per CTA in team order into its partial row (the ring's
// shared memory is reused for that after the last tile), then reduce_partials (cuda_sm90.cu) sums the rows.
// Fixed order everywhere: the same bits every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/norm/rms_norm_gated/cuda_common.cuh"
#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "runtime/error.h"
#include "tile/cuda/bulk_copy.cuh"
#include "tile/cuda/check.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm {
namespace {

using namespace rng_cuda;
using cuda::load_one;
using cuda::store_one;

constexpr int kMaxStages = 8;
constexpr int kRingBudget = 96 * 1024;  // dynamic shared memory of the ring per CTA (two CTAs per SM)
// The kernels' shared-memory opt-in: >= every launch's dynamic shared memory (stages x stage <= the budget as
// a stage is <= 48 KiB; the backward's team sums <= 32 KiB).
constexpr size_t kRingSmemCap = 100 * 1024;

struct RingGeom {
  int64_t ntiles = 0;
  int tr = 0;          // rows per tile (TB * RPT)
  int stages = 0;
  uint32_t rb = 0;     // bytes of one row in shared memory (D * 2)
  bool dense[3] = {};  // x, z, dy: rows exactly D elements apart (a tile is one contiguous copy)
};

// Thread 0: copies rows [r0, r0 + n) of one 16-bit tensor into dst (rows packed rb bytes apart).
__device__ __forceinline__ void copy_tile(unsigned char* dst, const void* base, const RowLayout& l, int64_t r0, int n,
                                          uint32_t rb, bool dense, uint64_t* bar) {
  const char* b = static_cast<const char*>(base);
  if (dense) {
    cuda::bulk_g2s(dst, b + row_off(l, r0) * 2, static_cast<uint32_t>(n) * rb, bar);
  } else {
    for (int i = 0; i < n; ++i) cuda::bulk_g2s(dst + i * rb, b + row_off(l, r0 + i) * 2, rb, bar);
  }
}

// Thread 0: fills the stage at dst with rows [r0, r0 + n) of x and z (NT = 2) or x, z and dy (NT = 3), one tile
// of n rows per tensor, tile_bytes apart, completing on bar. The fence orders the CTA's earlier generic reads of
// the stage (before its __syncthreads) before the copy engine's writes. Wide rows: n = 1, tile_bytes = rb.
template <int NT, class P>
__device__ __forceinline__ void fill_stage(const P& p, const RingGeom& g, unsigned char* dst, uint32_t tile_bytes,
                                           int64_t r0, int n, uint64_t* bar) {
  cuda::fence_proxy_async();
  cuda::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(NT) * static_cast<uint32_t>(n) * g.rb);
  copy_tile(dst, p.x, p.x_rows, r0, n, g.rb, g.dense[0], bar);
  copy_tile(dst + tile_bytes, p.z, p.z_rows, r0, n, g.rb, g.dense[1], bar);
  if constexpr (NT == 3) copy_tile(dst + 2 * tile_bytes, p.dy, p.dy_rows, r0, n, g.rb, g.dense[2], bar);
}

// Start of every ring kernel: thread 0 initialises the stages' mbarriers (one arrival each) and the CTA syncs;
// returns how many tiles this CTA walks (tiles blockIdx.x + k gridDim.x, k < the count).
__device__ __forceinline__ int64_t ring_begin(uint64_t* full, const RingGeom& g) {
  if (threadIdx.x == 0)
    for (int s = 0; s < g.stages; ++s) cuda::mbar_init(&full[s], 1);
  __syncthreads();
  return g.ntiles > blockIdx.x ? (g.ntiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
}

// 8 floats -> one uint4 of bf16 / f16 (nearest even).
__device__ __forceinline__ uint4 pack8(int32_t dt, const float (&o)[kV]) {
  return make_uint4(cuda::pack_half2(dt, o[0], o[1]), cuda::pack_half2(dt, o[2], o[3]), cuda::pack_half2(dt, o[4], o[5]),
                    cuda::pack_half2(dt, o[6], o[7]));
}

template <int TPR, int NV>
constexpr int ring_rows_per_team() {
  return NV == 1 ? 2 : 1;
}
// Two CTAs per SM (the ring budget is sized for it) need <= 128 registers: capped for one chunk per lane (the
// GDN shapes); wider teams hold more chunks and keep one CTA per SM rather than spill.
template <int NV>
constexpr int ring_min_blocks() {
  return NV == 1 ? 2 : 1;
}

// ---- forward ----
template <int TPR, int NV>
__global__ void __launch_bounds__(kBlock, ring_min_blocks<NV>()) fwd_ring(const RmsNormGatedFwdParams p, const VecFlags vf, const RingGeom g) {
  constexpr int TB = kBlock / TPR;
  constexpr int RPT = ring_rows_per_team<TPR, NV>();
  constexpr bool kHoistW = NV == 1;
  static_assert(TPR <= 32, "lane teams only");
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const int32_t xdt = p.x_dtype;  // bf16 or f16 (host-checked)
  const float inv_g = 1.f / static_cast<float>(p.group);
  const int nc = static_cast<int>(p.D / kV);
  const uint32_t tile_bytes = static_cast<uint32_t>(g.tr) * g.rb;
  const uint32_t stage_bytes = 2 * tile_bytes;
  float wh[kHoistW ? kV : 1];
  if constexpr (kHoistW)
    if (t < nc) load_param(p.weight, p.w_dtype, p.w_row, static_cast<int64_t>(t) * kV, vf.w, 1.f, wh);
  const int64_t my_n = ring_begin(full, g);
  auto issue = [&](int64_t k) {  // thread 0
    const int s = static_cast<int>(k % g.stages);
    const int64_t r0 = (blockIdx.x + k * gridDim.x) * g.tr;
    const int n = p.rows - r0 < g.tr ? static_cast<int>(p.rows - r0) : g.tr;
    fill_stage<2>(p, g, ring + static_cast<size_t>(s) * stage_bytes, tile_bytes, r0, n, &full[s]);
  };
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < my_n && k < g.stages; ++k) issue(k);
  char* yb = static_cast<char*>(p.y);
  for (int64_t k = 0; k < my_n; ++k) {
    const int s = static_cast<int>(k % g.stages);
    const int64_t r0 = (blockIdx.x + k * gridDim.x) * g.tr;
    cuda::mbar_wait(&full[s], static_cast<uint32_t>((k / g.stages) & 1));
    const unsigned char* xs = ring + static_cast<size_t>(s) * stage_bytes;
    const unsigned char* zs = xs + tile_bytes;
    // tr == TB * RPT: every team runs every j (the shuffles need whole warps); unrolled, so the rows' shared
    // memory reads and math interleave.
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
      const int rr = team + j * TB;
      const int64_t row = r0 + rr;
      const bool live = row < p.rows;  // dead lanes join the shuffles, read nothing
      uint4 xv[NV], zv[NV];
#pragma unroll
      for (int k2 = 0; k2 < NV; ++k2) {
        const int ci = t + k2 * TPR;
        const bool in = live && ci < nc;
        const uint32_t off = static_cast<uint32_t>(rr) * g.rb + static_cast<uint32_t>(ci) * 16;
        xv[k2] = in ? cuda::lds16(xs + off) : make_uint4(0, 0, 0, 0);
        zv[k2] = in ? cuda::lds16(zs + off) : make_uint4(0, 0, 0, 0);
      }
      team_fwd_row<TPR, NV, kHoistW>(
          p, vf, inv_g, xv, zv, t, live, wh, [&] { return YsOffs{row_off(p.y_rows, row), row_off(p.rstd_rows, row)}; },
          [&](int64_t yo, int64_t col, const float (&o)[kV]) { cuda::st_stream16(yb + (yo + col) * 2, pack8(xdt, o)); });
    }
    __syncthreads();  // every thread is done reading stage s
    if (threadIdx.x == 0 && k + g.stages < my_n) issue(k + g.stages);
  }
}

// ---- backward ----
// BF16: the activation dtype as a template flag (bf16, else f16): a run-time dtype made every unpack and pack a
// uniform branch per 32-bit word, about one extra instruction per element and tensor.
template <bool SILU, bool BF16, int TPR, int NV>
__global__ void __launch_bounds__(kBlock, ring_min_blocks<NV>()) bwd_ring(const RmsNormGatedBwdParams p, const VecFlags vf, const RingGeom g) {
  constexpr int TB = kBlock / TPR;
  constexpr int RPT = ring_rows_per_team<TPR, NV>();
  constexpr int32_t act = SILU ? kActSilu : kActSigmoid;
  static_assert(TPR <= 32, "lane teams only");
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  constexpr int32_t xdt = BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16;  // host-checked: bf16 or f16
  const bool nbg = p.norm_before_gate, want_wb = p.dweight || p.dbias;
  const float inv_g = 1.f / static_cast<float>(p.group);
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  const uint32_t tile_bytes = static_cast<uint32_t>(g.tr) * g.rb;
  const uint32_t stage_bytes = 3 * tile_bytes;
  int64_t rcol[NV];
  bool has[NV];
  float w[NV][kV], b[NV][kV], dw[NV][kV], db[NV][kV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int ci = t + k * TPR;
    has[k] = ci < nc;
    rcol[k] = has[k] ? static_cast<int64_t>(ci / gc) * p.rstd_rows.col_stride : 0;
    load_param(p.weight, p.w_dtype, p.w_row, has[k] ? static_cast<int64_t>(ci) * kV : 0, vf.w, 1.f, w[k]);
    load_param(nbg ? p.bias : nullptr, p.b_dtype, p.b_row, has[k] ? static_cast<int64_t>(ci) * kV : 0, vf.b, 0.f,
               b[k]);
#pragma unroll
    for (int e = 0; e < kV; ++e) dw[k][e] = db[k][e] = 0.f;
  }
  const int64_t my_n = ring_begin(full, g);
  auto issue = [&](int64_t k) {  // thread 0
    const int s = static_cast<int>(k % g.stages);
    const int64_t r0 = (blockIdx.x + k * gridDim.x) * g.tr;
    const int n = p.rows - r0 < g.tr ? static_cast<int>(p.rows - r0) : g.tr;
    fill_stage<3>(p, g, ring + static_cast<size_t>(s) * stage_bytes, tile_bytes, r0, n, &full[s]);
  };
  // rstd of this thread's rows of tile k (row r0 + team + j TB), loaded one tile ahead.
  auto load_rstd = [&](int64_t k, float (&rk)[RPT][NV]) {
    const int64_t r0 = (blockIdx.x + k * gridDim.x) * g.tr;
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
      const int64_t row = r0 + team + j * TB;
      const bool live = k < my_n && row < p.rows;
      const int64_t so = live ? row_off(p.rstd_rows, row) : 0;
#pragma unroll
      for (int q = 0; q < NV; ++q) rk[j][q] = live && has[q] ? load_one(p.rstd, p.rstd_dtype, so + rcol[q]) : 0.f;
    }
  };
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < my_n && k < g.stages; ++k) issue(k);
  float rk_cur[RPT][NV], rk_nxt[RPT][NV];
  load_rstd(0, rk_cur);
  char* dxb = static_cast<char*>(p.dx);
  char* dzb = static_cast<char*>(p.dz);
  for (int64_t k = 0; k < my_n; ++k) {
    const int s = static_cast<int>(k % g.stages);
    const int64_t r0 = (blockIdx.x + k * gridDim.x) * g.tr;
    load_rstd(k + 1, rk_nxt);
    cuda::mbar_wait(&full[s], static_cast<uint32_t>((k / g.stages) & 1));
    const unsigned char* xs = ring + static_cast<size_t>(s) * stage_bytes;
    const unsigned char* zs = xs + tile_bytes;
    const unsigned char* gs = zs + tile_bytes;
#pragma unroll
    for (int j = 0; j < RPT; ++j) {  // tr == TB * RPT: every team runs every j (whole warps for the shuffles)
      const int rr = team + j * TB;
      const int64_t row = r0 + rr;
      const bool live = row < p.rows;
      uint4 xv[NV], zv[NV], gv[NV];
#pragma unroll
      for (int q = 0; q < NV; ++q) {
        const bool in = live && has[q];
        const uint32_t off = static_cast<uint32_t>(rr) * g.rb + static_cast<uint32_t>(t + q * TPR) * 16;
        xv[q] = in ? cuda::lds16(xs + off) : make_uint4(0, 0, 0, 0);
        zv[q] = in ? cuda::lds16(zs + off) : make_uint4(0, 0, 0, 0);
        gv[q] = in ? cuda::lds16(gs + off) : make_uint4(0, 0, 0, 0);
      }
      const int64_t dzo = live ? row_off(p.dz_rows, row) : 0;
      const int64_t dxo = live ? row_off(p.dx_rows, row) : 0;
      // Phase 1: dz (norm_before_gate), dweight / dbias, per-chunk partials of sum(dn * normalised value).
      float part[NV], tot[NV], dn[NV][kV];
#pragma unroll
      for (int q = 0; q < NV; ++q) {
        part[q] = 0.f;
#pragma unroll
        for (int e = 0; e < kV; ++e) dn[q][e] = 0.f;
        if (!(live && has[q])) continue;
        float h[kV], z[kV], dy[kV], dz[kV];
        cuda::unpack8(xv[q], xdt, h);
        cuda::unpack8(zv[q], xdt, z);
        cuda::unpack8(gv[q], xdt, dy);
        part[q] = bwd_team_phase1(act, true, nbg, h, z, dy, rk_cur[j][q], w[q], b[q], dw[q], db[q], dn[q], dz);
        if (nbg) cuda::st_stream16(dzb + (dzo + (t + q * TPR) * kV) * 2, pack8(xdt, dz));
      }
      group_totals<TPR, NV>(part, tot, p.group, p.D, t, nullptr);
      if (!live) continue;
      // Phase 2: dx, and dz for gate_before_norm.
#pragma unroll
      for (int q = 0; q < NV; ++q) {
        if (!has[q]) continue;
        const int64_t col = static_cast<int64_t>(t + q * TPR) * kV;
        const float mean = tot[q] * inv_g, rr_ = rk_cur[j][q];
        float h[kV], dx[kV];
        cuda::unpack8(xv[q], xdt, h);
        if (nbg) {
#pragma unroll
          for (int e = 0; e < kV; ++e) dx[e] = bwd_nbg_dx(h[e], rr_, mean, dn[q][e]);
        } else {
          float z[kV], dy[kV], dz[kV];
          cuda::unpack8(zv[q], xdt, z);
          cuda::unpack8(gv[q], xdt, dy);
#pragma unroll
          for (int e = 0; e < kV; ++e) bwd_gbn_dxdz(act, true, h[e], z[e], dy[e], rr_, mean, w[q][e], dx[e], dz[e]);
          cuda::st_stream16(dzb + (dzo + col) * 2, pack8(xdt, dz));
        }
        cuda::st_stream16(dxb + (dxo + col) * 2, pack8(xdt, dx));
      }
    }
    __syncthreads();  // every thread is done reading stage s
    if (threadIdx.x == 0 && k + g.stages < my_n) issue(k + g.stages);
#pragma unroll
    for (int j = 0; j < RPT; ++j)
#pragma unroll
      for (int q = 0; q < NV; ++q) rk_cur[j][q] = rk_nxt[j][q];
  }
  // This CTA's partial row (team order, fixed). The ring is free now (every fill was waited for and read
  // before the last __syncthreads); the host sized it to hold TB x TPR NV kV floats. A CTA without tiles
  // writes zeros.
  if (want_wb) write_team_partials<TPR, NV>(p, reinterpret_cast<float*>(ring), TB, dw, db);  // uniform
}

// ---- wide rows (a block per row: 1024 < D <= 8192, or groups that do not fit a lane team) ----
// A tile is one row ([x | z (| dy)], D x 2 bytes each). Thread t takes chunks t, t + 256, ... (NV <= 4); group
// sums by block_group_totals (chunk partials through shared memory, one warp per group, fixed order). The
// row stays in the ring until the CTA is done with it, so the second phase re-reads x / z / dy from shared
// memory instead of holding them in registers (the register kernel kept them packed: 103 registers, two
// 256-thread blocks per SM, 2.42 x floor at [16384, 5120], s5run2) and nothing is read twice from memory.
template <int NV>
__global__ void __launch_bounds__(kBlock, 2) fwd_ring_wide(const RmsNormGatedFwdParams p, const VecFlags vf,
                                                           const RingGeom g) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  __shared__ float red[kMaxChunks], gsum[kMaxChunks];
  const int32_t xdt = p.x_dtype;  // bf16 or f16 (host-checked)
  const float inv_g = 1.f / static_cast<float>(p.group);
  const bool nbg = p.norm_before_gate;
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  int gidx[NV];
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    const int ci = threadIdx.x + q * kBlock;
    gidx[q] = ci < nc ? ci / gc : -1;
  }
  const uint32_t stage_bytes = 2 * g.rb;
  const int64_t my_n = ring_begin(full, g);
  auto issue = [&](int64_t k) {  // thread 0; a tile is row blockIdx.x + k gridDim.x
    const int s = static_cast<int>(k % g.stages);
    const int64_t row = blockIdx.x + k * gridDim.x;
    fill_stage<2>(p, g, ring + static_cast<size_t>(s) * stage_bytes, g.rb, row, 1, &full[s]);
  };
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < my_n && k < g.stages; ++k) issue(k);
  char* yb = static_cast<char*>(p.y);
  for (int64_t k = 0; k < my_n; ++k) {
    const int s = static_cast<int>(k % g.stages);
    const int64_t row = blockIdx.x + k * gridDim.x;
    cuda::mbar_wait(&full[s], static_cast<uint32_t>((k / g.stages) & 1));
    const unsigned char* xs = ring + static_cast<size_t>(s) * stage_bytes;
    const unsigned char* zs = xs + g.rb;
    float part[NV], tot[NV];
#pragma unroll
    for (int q = 0; q < NV; ++q) {
      part[q] = 0.f;
      if (gidx[q] < 0) continue;
      const uint32_t off = static_cast<uint32_t>(threadIdx.x + q * kBlock) * 16;
      float u[kV];
      cuda::unpack8(cuda::lds16(xs + off), xdt, u);
      if (!nbg) {
        float z[kV];
        cuda::unpack8(cuda::lds16(zs + off), xdt, z);
#pragma unroll
        for (int e = 0; e < kV; ++e) u[e] *= vact(p.act, true, z[e]);
      }
#pragma unroll
      for (int e = 0; e < kV; ++e) part[q] = fmaf(u[e], u[e], part[q]);
    }
    block_group_totals<NV>(part, tot, nc, gc, gidx, red, gsum);
    const int64_t yo = row_off(p.y_rows, row), so = row_off(p.rstd_rows, row);
#pragma unroll
    for (int q = 0; q < NV; ++q) {
      if (gidx[q] < 0) continue;
      const int ci = threadIdx.x + q * kBlock;
      const uint32_t off = static_cast<uint32_t>(ci) * 16;
      const int64_t col = static_cast<int64_t>(ci) * kV;
      const float rs = rsqrtf(tot[q] * inv_g + p.eps);
      if (ci % gc == 0) store_one(p.rstd, p.rstd_dtype, so + static_cast<int64_t>(gidx[q]) * p.rstd_rows.col_stride, rs);
      float u[kV], z[kV], w[kV], b[kV], o[kV];
      cuda::unpack8(cuda::lds16(xs + off), xdt, u);
      cuda::unpack8(cuda::lds16(zs + off), xdt, z);
      load_param(p.weight, p.w_dtype, p.w_row, col, vf.w, 1.f, w);
      load_param(p.bias, p.b_dtype, p.b_row, col, vf.b, 0.f, b);
#pragma unroll
      for (int e = 0; e < kV; ++e) o[e] = fwd_out(p.act, true, nbg, u[e], z[e], rs, w[e], b[e]);
      cuda::st_stream16(yb + (yo + col) * 2, pack8(xdt, o));
    }
    __syncthreads();  // every thread is done reading stage s
    if (threadIdx.x == 0 && k + g.stages < my_n) issue(k + g.stages);
  }
}

// Backward of wide rows: dweight / dbias summed per thread in registers over its rows in row order (a thread
// owns chunks t, t + 256, ... of every row), written straight to the CTA's partial row at the end.
template <bool SILU, int NV>
__global__ void __launch_bounds__(kBlock, 1) bwd_ring_wide(const RmsNormGatedBwdParams p, const VecFlags vf,
                                                           const RingGeom g) {
  constexpr int32_t act = SILU ? kActSilu : kActSigmoid;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  __shared__ float red[kMaxChunks], gsum[kMaxChunks];
  const int32_t xdt = p.x_dtype;  // bf16 or f16 (host-checked)
  const bool nbg = p.norm_before_gate, want_wb = p.dweight || p.dbias;
  const float inv_g = 1.f / static_cast<float>(p.group);
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  int gidx[NV];
  float dw[NV][kV], db[NV][kV];
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    const int ci = threadIdx.x + q * kBlock;
    gidx[q] = ci < nc ? ci / gc : -1;
#pragma unroll
    for (int e = 0; e < kV; ++e) dw[q][e] = db[q][e] = 0.f;
  }
  const uint32_t stage_bytes = 3 * g.rb;
  const int64_t my_n = ring_begin(full, g);
  auto issue = [&](int64_t k) {  // thread 0
    const int s = static_cast<int>(k % g.stages);
    const int64_t row = blockIdx.x + k * gridDim.x;
    fill_stage<3>(p, g, ring + static_cast<size_t>(s) * stage_bytes, g.rb, row, 1, &full[s]);
  };
  auto load_rstd = [&](int64_t k, float (&rk)[NV]) {  // one tile ahead
    const int64_t row = blockIdx.x + k * gridDim.x;
    const bool live = k < my_n;
    const int64_t so = live ? row_off(p.rstd_rows, row) : 0;
#pragma unroll
    for (int q = 0; q < NV; ++q)
      rk[q] = live && gidx[q] >= 0
                  ? load_one(p.rstd, p.rstd_dtype, so + static_cast<int64_t>(gidx[q]) * p.rstd_rows.col_stride)
                  : 0.f;
  };
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < my_n && k < g.stages; ++k) issue(k);
  float rk_cur[NV], rk_nxt[NV];
  load_rstd(0, rk_cur);
  char* dxb = static_cast<char*>(p.dx);
  char* dzb = static_cast<char*>(p.dz);
  for (int64_t k = 0; k < my_n; ++k) {
    const int s = static_cast<int>(k % g.stages);
    const int64_t row = blockIdx.x + k * gridDim.x;
    load_rstd(k + 1, rk_nxt);
    cuda::mbar_wait(&full[s], static_cast<uint32_t>((k / g.stages) & 1));
    const unsigned char* xs = ring + static_cast<size_t>(s) * stage_bytes;
    const unsigned char* zs = xs + g.rb;
    const unsigned char* gs = zs + g.rb;
    const int64_t dzo = row_off(p.dz_rows, row), dxo = row_off(p.dx_rows, row);
    // Phase 1: dz (norm_before_gate), dweight / dbias, per-chunk partials of sum(dn * normalised value).
    float part[NV], tot[NV];
#pragma unroll
    for (int q = 0; q < NV; ++q) {
      part[q] = 0.f;
      if (gidx[q] < 0) continue;
      const int ci = threadIdx.x + q * kBlock;
      const uint32_t off = static_cast<uint32_t>(ci) * 16;
      const int64_t col = static_cast<int64_t>(ci) * kV;
      const float rr = rk_cur[q];
      float h[kV], z[kV], dy[kV], w[kV];
      cuda::unpack8(cuda::lds16(xs + off), xdt, h);
      cuda::unpack8(cuda::lds16(zs + off), xdt, z);
      cuda::unpack8(cuda::lds16(gs + off), xdt, dy);
      load_param(p.weight, p.w_dtype, p.w_row, col, vf.w, 1.f, w);
      if (nbg) {
        float b[kV], dz[kV];
        load_param(p.bias, p.b_dtype, p.b_row, col, vf.b, 0.f, b);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          float xh, dov;
          bwd_nbg_terms(act, true, h[e], z[e], dy[e], rr, w[e], b[e], dz[e], xh, dov);
          dw[q][e] = fmaf(dov, xh, dw[q][e]);
          db[q][e] += dov;
          part[q] = fmaf(dov * w[e], xh, part[q]);
        }
        cuda::st_stream16(dzb + (dzo + col) * 2, pack8(xdt, dz));
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float uh = bwd_gbn_uh(act, true, h[e], z[e], rr);
          dw[q][e] = fmaf(dy[e], uh, dw[q][e]);
          db[q][e] += dy[e];
          part[q] = fmaf(dy[e] * w[e], uh, part[q]);
        }
      }
    }
    block_group_totals<NV>(part, tot, nc, gc, gidx, red, gsum);
    // Phase 2 (re-read from the ring): dx, and dz for gate_before_norm.
#pragma unroll
    for (int q = 0; q < NV; ++q) {
      if (gidx[q] < 0) continue;
      const int ci = threadIdx.x + q * kBlock;
      const uint32_t off = static_cast<uint32_t>(ci) * 16;
      const int64_t col = static_cast<int64_t>(ci) * kV;
      const float mean = tot[q] * inv_g, rr = rk_cur[q];
      float h[kV], z[kV], dy[kV], w[kV], dx[kV];
      cuda::unpack8(cuda::lds16(xs + off), xdt, h);
      cuda::unpack8(cuda::lds16(zs + off), xdt, z);
      cuda::unpack8(cuda::lds16(gs + off), xdt, dy);
      load_param(p.weight, p.w_dtype, p.w_row, col, vf.w, 1.f, w);
      if (nbg) {
#pragma unroll
        for (int e = 0; e < kV; ++e) dx[e] = bwd_nbg_dx(h[e], rr, mean, dy[e] * vact(act, true, z[e]) * w[e]);
      } else {
        float dz[kV];
#pragma unroll
        for (int e = 0; e < kV; ++e) bwd_gbn_dxdz(act, true, h[e], z[e], dy[e], rr, mean, w[e], dx[e], dz[e]);
        cuda::st_stream16(dzb + (dzo + col) * 2, pack8(xdt, dz));
      }
      cuda::st_stream16(dxb + (dxo + col) * 2, pack8(xdt, dx));
    }
    __syncthreads();  // every thread is done reading stage s
    if (threadIdx.x == 0 && k + g.stages < my_n) issue(k + g.stages);
#pragma unroll
    for (int q = 0; q < NV; ++q) rk_cur[q] = rk_nxt[q];
  }
  if (!want_wb) return;
  // This CTA's partial row: every thread writes its own columns (a CTA without rows writes zeros).
  float* out_w = p.partial + static_cast<int64_t>(blockIdx.x) * p.D;
  float* out_b = p.partial + (static_cast<int64_t>(p.num_partials) + blockIdx.x) * p.D;
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    if (gidx[q] < 0) continue;
    const int64_t col = static_cast<int64_t>(threadIdx.x + q * kBlock) * kV;
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      out_w[col + e] = dw[q][e];
      out_b[col + e] = db[q][e];
    }
  }
}

// ---- host ----

// Rows exactly D elements apart (or a single row): a tile is one contiguous run of bytes.
bool dense_rows(const RowLayout& l, int64_t D) { return l.nd == 0 || l.sizes[0] <= 1 || l.strides[0] == D; }

// Ring geometry: tiles of TB * RPT rows, as many stages (2..kMaxStages) as fit kRingBudget; the dynamic shared
// memory is the ring, at least `min_bytes` (the backward's team sums).
template <int TPR, int NV>
RingGeom ring_geom(int64_t rows, int64_t D, int tensors, size_t min_bytes, size_t& smem) {
  RingGeom g;
  g.tr = (kBlock / TPR) * ring_rows_per_team<TPR, NV>();
  g.rb = static_cast<uint32_t>(D * 2);
  g.ntiles = (rows + g.tr - 1) / g.tr;
  const size_t stage = static_cast<size_t>(tensors) * g.tr * g.rb;
  g.stages = static_cast<int>(std::clamp<size_t>(kRingBudget / stage, 2, kMaxStages));
  smem = std::max(stage * g.stages, min_bytes);
  return g;
}

// A balanced one-wave persistent grid of `occ` CTAs per SM: at most `cap` CTAs, every CTA with the same
// number of tiles (+- 1).
int64_t ring_grid(int occ, int64_t ntiles, int64_t cap) {
  const int64_t slots = std::min<int64_t>(static_cast<int64_t>(cuda::current_sm_count()) * occ, cap);
  const int64_t iters = (ntiles + slots - 1) / slots;
  return std::max<int64_t>(1, (ntiles + iters - 1) / iters);
}

template <int TPR, int NV>
strata_status launch_fwd_ring(const RmsNormGatedFwdParams& p, const VecFlags& vf, cudaStream_t s) {
  size_t smem = 0;
  RingGeom g = ring_geom<TPR, NV>(p.rows, p.D, 2, 0, smem);
  g.dense[0] = dense_rows(p.x_rows, p.D);
  g.dense[1] = dense_rows(p.z_rows, p.D);
  const auto kernel = fwd_ring<TPR, NV>;
  static cuda::RingLaunchCache cache;
  int occ = 1;
  STRATA_RETURN_IF_ERROR(cuda::ring_occupancy(kernel, kBlock, smem, kRingSmemCap, cache, &occ));
  const int64_t grid = ring_grid(occ, g.ntiles, int64_t{1} << 30);
  kernel<<<static_cast<unsigned>(grid), kBlock, smem, s>>>(p, vf, g);
  return cuda::check_launch("rms_norm_gated fwd_ring");
}

template <bool SILU, bool BF16, int TPR, int NV>
strata_status launch_bwd_ring(RmsNormGatedBwdParams& p, const VecFlags& vf, cudaStream_t s) {
  const size_t team_sums = static_cast<size_t>(kBlock / TPR) * TPR * NV * kV * sizeof(float);
  size_t smem = 0;
  RingGeom g = ring_geom<TPR, NV>(p.rows, p.D, 3, team_sums, smem);
  g.dense[0] = dense_rows(p.x_rows, p.D);
  g.dense[1] = dense_rows(p.z_rows, p.D);
  g.dense[2] = dense_rows(p.dy_rows, p.D);
  const auto kernel = bwd_ring<SILU, BF16, TPR, NV>;
  static cuda::RingLaunchCache cache;
  int occ = 1;
  STRATA_RETURN_IF_ERROR(cuda::ring_occupancy(kernel, kBlock, smem, kRingSmemCap, cache, &occ));
  // The workspace holds bwd_partials(p) partial rows: the grid may not exceed it.
  const int64_t grid = ring_grid(occ, g.ntiles, std::max<int64_t>(1, bwd_partials(p)));
  p.num_partials = (p.dweight || p.dbias) ? grid : 0;
  kernel<<<static_cast<unsigned>(grid), kBlock, smem, s>>>(p, vf, g);
  return cuda::check_launch("rms_norm_gated bwd_ring");
}

template <int TPR, int NV>
strata_status launch_bwd_ring_act(RmsNormGatedBwdParams& p, const VecFlags& vf, cudaStream_t s) {
  if (p.x_dtype == STRATA_DTYPE_BF16)
    return p.act == kActSilu ? launch_bwd_ring<true, true, TPR, NV>(p, vf, s) : launch_bwd_ring<false, true, TPR, NV>(p, vf, s);
  return p.act == kActSilu ? launch_bwd_ring<true, false, TPR, NV>(p, vf, s) : launch_bwd_ring<false, false, TPR, NV>(p, vf, s);
}

// Wide rows: one row per tile, as many stages as fit the budget (>= 2: rows of <= 16 KiB per tensor).
RingGeom wide_geom(int64_t rows, int64_t D, int tensors, size_t& smem) {
  RingGeom g;
  g.tr = 1;
  g.rb = static_cast<uint32_t>(D * 2);
  g.ntiles = rows;
  const size_t stage = static_cast<size_t>(tensors) * g.rb;
  g.stages = static_cast<int>(std::clamp<size_t>(kRingBudget / stage, 2, kMaxStages));
  smem = stage * g.stages;
  return g;
}

template <int NV>
strata_status launch_fwd_ring_wide(const RmsNormGatedFwdParams& p, const VecFlags& vf, cudaStream_t s) {
  size_t smem = 0;
  const RingGeom g = wide_geom(p.rows, p.D, 2, smem);
  const auto kernel = fwd_ring_wide<NV>;
  static cuda::RingLaunchCache cache;
  int occ = 1;
  STRATA_RETURN_IF_ERROR(cuda::ring_occupancy(kernel, kBlock, smem, kRingSmemCap, cache, &occ));
  const int64_t grid = ring_grid(occ, g.ntiles, int64_t{1} << 30);
  kernel<<<static_cast<unsigned>(grid), kBlock, smem, s>>>(p, vf, g);
  return cuda::check_launch("rms_norm_gated fwd_ring_wide");
}

template <bool SILU, int NV>
strata_status launch_bwd_ring_wide(RmsNormGatedBwdParams& p, const VecFlags& vf, cudaStream_t s) {
  size_t smem = 0;
  const RingGeom g = wide_geom(p.rows, p.D, 3, smem);
  const auto kernel = bwd_ring_wide<SILU, NV>;
  static cuda::RingLaunchCache cache;
  int occ = 1;
  STRATA_RETURN_IF_ERROR(cuda::ring_occupancy(kernel, kBlock, smem, kRingSmemCap, cache, &occ));
  const int64_t grid = ring_grid(occ, g.ntiles, std::max<int64_t>(1, bwd_partials(p)));
  p.num_partials = (p.dweight || p.dbias) ? grid : 0;
  kernel<<<static_cast<unsigned>(grid), kBlock, smem, s>>>(p, vf, g);
  return cuda::check_launch("rms_norm_gated bwd_ring_wide");
}

template <int NV>
strata_status launch_bwd_ring_wide_act(RmsNormGatedBwdParams& p, const VecFlags& vf, cudaStream_t s) {
  return p.act == kActSilu ? launch_bwd_ring_wide<true, NV>(p, vf, s) : launch_bwd_ring_wide<false, NV>(p, vf, s);
}

// The lane-team config of a ring problem (tpr 0: not a ring problem). Plan-time facts only.
Config ring_config(int32_t x_dtype, bool residual, int64_t D, int64_t G, bool uniform, bool unit_cols) {
  if (x_dtype != STRATA_DTYPE_BF16 && x_dtype != STRATA_DTYPE_F16) return {};
  if (residual || !uniform) return {};
  return choose(D, G, unit_cols);  // lane teams (tpr <= 32) or a block per row (tpr == kBlock), or none
}

Config fwd_ring_config(const RmsNormGatedFwdParams& p) {
  return ring_config(p.x_dtype, p.residual || p.residual_out, p.D, p.group,
                     p.x_rows.uniform() && p.z_rows.uniform() && p.y_rows.uniform() && p.rstd_rows.uniform(),
                     p.x_rows.col_stride == 1 && p.z_rows.col_stride == 1 && p.y_rows.col_stride == 1);
}
Config bwd_ring_config(const RmsNormGatedBwdParams& p) {
  return ring_config(p.x_dtype, p.residual || p.dres_out, p.D, p.group,
                     p.x_rows.uniform() && p.z_rows.uniform() && p.dy_rows.uniform() && p.dx_rows.uniform() &&
                         p.dz_rows.uniform() && p.rstd_rows.uniform(),
                     p.x_rows.col_stride == 1 && p.z_rows.col_stride == 1 && p.dy_rows.col_stride == 1 &&
                         p.dx_rows.col_stride == 1 && p.dz_rows.col_stride == 1);
}

constexpr const char* kRingNeeds =
    "needs bf16/f16 x, no residual, equally spaced rows with unit column strides, D and group multiples of 8, "
    "D <= 8192";

}  // namespace

std::string rms_norm_gated_fwd_cuda_ring_reject(const RmsNormGatedFwdParams& p) {
  return fwd_ring_config(p).tpr == 0 ? kRingNeeds : "";
}
std::string rms_norm_gated_bwd_cuda_ring_reject(const RmsNormGatedBwdParams& p, bool wide_only) {
  const Config c = bwd_ring_config(p);
  if (c.tpr == 0) return kRingNeeds;
  if (wide_only && c.tpr != kBlock) return "wide rows only (a block per row): lane-team rows take cuda.sm90.bulk_ring";
  // s6run2: [16384, 5120] 0.5069 ms against group_rows' 0.4892; [16384, 8192] 0.6640 against 0.8381.
  if (!wide_only && c.tpr == kBlock && p.D <= 6144)
    return "wide rows of D <= 6144 take group_rows (slower here in s6run2; cuda.sm90.bulk_ring_wide forces them)";
  return "";
}

int rms_norm_gated_fwd_cuda_ring(const RmsNormGatedFwdParams& p, void* stream) {
  if (p.rows == 0 || p.D == 0) return STRATA_SUCCESS;
  const Config c = fwd_ring_config(p);
  // Pointers are known only now: rows that are not 16-byte aligned take the register kernels.
  if (c.tpr == 0 || !fwd_layouts_ok(p)) return rms_norm_gated_fwd_cuda(p, stream);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const VecFlags vf{param_vec_ok(p.weight, p.w_dtype, p.w_row), param_vec_ok(p.bias, p.b_dtype, p.b_row)};
  if (c.tpr == kBlock) {
    if (c.nv == 1) return launch_fwd_ring_wide<1>(p, vf, s);
    if (c.nv == 2) return launch_fwd_ring_wide<2>(p, vf, s);
    return launch_fwd_ring_wide<4>(p, vf, s);
  }
  return visit_team(c, [&](auto tpr, auto nv) {
    return launch_fwd_ring<decltype(tpr)::value, decltype(nv)::value>(p, vf, s);
  });
}

int rms_norm_gated_bwd_cuda_ring(const RmsNormGatedBwdParams& p_in, void* stream) {
  const Config c = bwd_ring_config(p_in);
  if (p_in.rows == 0 || p_in.D == 0 || c.tpr == 0 || !bwd_layouts_ok(p_in)) return rms_norm_gated_bwd_cuda(p_in, stream);
  RmsNormGatedBwdParams p = p_in;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const VecFlags vf{param_vec_ok(p.weight, p.w_dtype, p.w_row), param_vec_ok(p.bias, p.b_dtype, p.b_row)};
  strata_status st;
  if (c.tpr == kBlock) {
    if (c.nv == 1) st = launch_bwd_ring_wide_act<1>(p, vf, s);
    else if (c.nv == 2) st = launch_bwd_ring_wide_act<2>(p, vf, s);
    else st = launch_bwd_ring_wide_act<4>(p, vf, s);
  } else {
    st = visit_team(c, [&](auto tpr, auto nv) {
      return launch_bwd_ring_act<decltype(tpr)::value, decltype(nv)::value>(p, vf, s);
    });
  }
  if (st != STRATA_SUCCESS) return st;
  return rms_norm_gated_bwd_reduce_cuda(p, stream);  // sums p.num_partials (= the grid) partial rows
}

}  // namespace strata::norm
