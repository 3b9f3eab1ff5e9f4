// The streaming team forward of rms_norm_gated (implementation cuda.sm90.team_stream): bf16/f16 x, z, y, no
// residual, rows of D <= 256 features that a team of TPR <= 32 lanes holds with ONE 16-byte chunk per lane
// (choose() gives nv == 1), groups of G = 8 W features with W a power of two dividing TPR.
//
// Why another kernel: team_packed (cuda_sm90.cu) ran [1048576, 128] at 1.33 x floor with the SMs 84 % busy and
// DRAM at 64 % (s7run1 ncu): instruction-bound. Each of its threads handles one 8-feature chunk of one row
// (a grid of 65536 blocks), so its per-thread setup (weight load with the dtype dispatch, column facts, the
// parameter reads) is paid per 8 elements, and its per-element math dispatches the activation, gate order and
// dtype at run time. Here:
//   * a persistent grid (one wave at the kernel's occupancy): each thread walks rows r, r + step, ... with
//     its weight and bias chunk held in registers (loaded once) and 64-bit offsets advanced by constants;
//   * the next row's x / z chunks are loaded before the current row's math (two rows in flight per thread);
//   * dtype, gate order and activation are template parameters: no selects in the element loop;
//   * act(z) = z * rcp(1 + ex2(-z log2 e)) in the ftz forms (FMUL, MUFU.EX2, FADD, MUFU.RCP, FMUL), rsqrt.ftz;
//   * outputs packed with one cvt.rn.{bf16,f16}x2.f32 per pair, one 16-byte store; no per-element bounds.
// By our count ~16 instructions per element (PTX) against ~50 in team_packed.
// team_stream_flat (forced only): the same kernel on a grid that covers the rows once (one row per team, no
// prefetch; session 4's persistent forward had lost to the one-pass team kernel, so both are timed).
// team_tma (session 9): the same row math in short-lived blocks that move their bytes with the copy engine
// (the scheme of the row norms' TMA forward, src/ops/norm/common/row_norm_cuda_tma.cu, which met l2norm's
// 1.10 x target where persistent grids had lost): one tile of `rpt` consecutive dense rows per block; thread 0
// bulk-loads the tile's x and z (cp.async.bulk, one mbarrier), the teams compute their rows from shared memory
// and write y over x in place, and thread 0 bulk-stores y (cp.async.bulk shared -> global). The SM's load/store
// units issue two requests in and one out per block instead of one 16-byte access per chunk, and the bytes in
// flight are the resident blocks' tiles (D = 128 bf16, 16-row tiles: 8 KiB per block, ~24 blocks per SM), not
// registers. Dense rows only (x, z, y rows exactly D apart); other layouts run the persistent kernel.
// (Session 8's team_stream_pf, the persistent kernel with an L2 bulk prefetch two steps ahead, was removed in
// session 9: s8run2 queued it at 0.2204 ms against team_stream's 0.2141 at [1048576, 128], so more bytes in
// flight through L2 was not what the kernel lacked.)
// team_regs (session 10): the same row math in short-lived register blocks, the shape of fla's Triton forward
// (layer_norm_gated_fwd_kernel: a [BT, D] tile per program, plain loads and stores), which ran this op's
// [1048576, 128] bf16 forward at the add probe's rate in s9run2 (0.1889 ms) where both our persistent register
// kernel and the copy-engine tiles stop at 88-90 % of it: a block of `threads` threads (teams of TPR lanes) owns
// R x (threads / TPR) consecutive rows, team k rows k, k + teams, ... (a warp's load covers 32 / TPR adjacent
// rows), and each thread issues all 2R 16-byte loads of its rows before any math (R x 32 bytes in flight per
// thread, no shared memory, no barrier), then computes and stores row by row (st.global.v4, rstd from the
// group's first lane). Dense or not: rows equally spaced (team_stream's conditions). s10run1 (C++ queued,
// [1048576, 128] bf16): R = 2 x 128 threads 0.2037 ms = 1.057 x the copy floor, against team_tma's 0.2084 and
// R = 4 / 8 (79 / 125 registers) 0.2095-0.2119: fewer rows per thread and more blocks per SM won, so R = 2 x 128
// (59 registers) is the default and, since session 10, first in the dispatch order. Session 11: plain ld.global.v4
// loads instead of ld_stream's L1::no_allocate.L2::256B hints, 0.1893 against 0.2054 ms (s11run1; ld_plain).
// Lanes past the row's chunks (D < TPR * 8) and teams past the last row keep running (the group sums shuffle
// over the whole warp) but load zeros and store nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/norm/rms_norm_gated/cuda_common.cuh"
#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "runtime/error.h"
#include "tile/cuda/bulk_copy.cuh"
#include "tile/cuda/check.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm {
namespace {

using namespace rng_cuda;

constexpr int kStreamBlock = 256;
// 4 blocks of 256 threads per SM (32 warps, <= 64 registers): w, b (16), two rows of packed x / z (16) and
// the offsets stay in registers.
constexpr int kStreamMinBlocks = 4;

// team_tma: at most 256 threads per block; the tile (x and z of rpt rows) within 48 KiB of shared memory (no
// opt-in), after a 16-byte header holding the mbarrier.
constexpr int kTmaMaxThreads = 256;
constexpr int kTmaHeader = 16;
constexpr int64_t kTmaMaxSmem = 48 * 1024;

// One 16-byte store (a uint4 assignment compiled to four 4-byte stores here, nvcc 13).
__device__ __forceinline__ void st_v4(void* p, const uint32_t (&q)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(q[0]), "r"(q[1]), "r"(q[2]), "r"(q[3])
               : "memory");
}
__device__ __forceinline__ void sts_v4(void* p, const uint32_t (&q)[4]) {
  *static_cast<uint4*>(p) = make_uint4(q[0], q[1], q[2], q[3]);
}

// The per-row math of both kernels for one lane's 8-feature chunk (packed x / z): the group sum over the W lanes
// of the chunk's group, rs = rstd of the group, and the 8 outputs packed in q. Every lane of the warp runs it
// (the xor tree shuffles over the whole warp); zero chunks (dead rows, lanes past D) add nothing (x = 0 gives
// u = 0 in both gate orders).
template <int TPR, bool BF16, bool NBG, bool SILU>
__device__ __forceinline__ float team_row(const uint4& xv, const uint4& zv, const float (&w)[kV], const float (&b)[kV],
                                          int W, float inv_g, float eps, uint32_t (&q)[kV / 2]) {
  constexpr int32_t kDt = BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16;
  constexpr int32_t kAct = SILU ? kActSilu : kActSigmoid;
  float u[kV], zf[kV];
  cuda::unpack8(xv, kDt, u);
  cuda::unpack8(zv, kDt, zf);
  float part = 0.f;
  if constexpr (NBG) {
#pragma unroll
    for (int e = 0; e < kV; ++e) part = fmaf(u[e], u[e], part);
  } else {
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      u[e] *= vact(kAct, true, zf[e]);
      part = fmaf(u[e], u[e], part);
    }
  }
  // Group sum over W lanes: an xor tree (offsets < W stay inside the group; W divides TPR divides 32).
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1)
    if (o < W) part += __shfl_xor_sync(kFull, part, o);
  const float rs = cuda::rsqrt_ftz(fmaf(part, inv_g, eps));
#pragma unroll
  for (int e = 0; e < kV; e += 2) {
    float o0 = fmaf(u[e] * rs, w[e], b[e]), o1 = fmaf(u[e + 1] * rs, w[e + 1], b[e + 1]);
    if constexpr (NBG) o0 *= vact(kAct, true, zf[e]), o1 *= vact(kAct, true, zf[e + 1]);
    q[e / 2] = cuda::pack_half2(kDt, o0, o1);
  }
  return rs;
}

// This lane's weight / bias chunk (w = 1, b = 0 when absent or past D).
__device__ __forceinline__ void lane_params(const RmsNormGatedFwdParams& p, const VecFlags& vf, int t, bool has,
                                            float (&w)[kV], float (&b)[kV]) {
  if (has) {
    load_param(p.weight, p.w_dtype, p.w_row, static_cast<int64_t>(t) * kV, vf.w, 1.f, w);
    load_param(p.bias, p.b_dtype, p.b_row, static_cast<int64_t>(t) * kV, vf.b, 0.f, b);
  } else {
#pragma unroll
    for (int e = 0; e < kV; ++e) w[e] = 1.f, b[e] = 0.f;
  }
}

// hints: ld_stream's L1::no_allocate.L2::256B loads (session 7) instead of plain ld.global.v4 (session 12 A/B).
template <int TPR, bool BF16, bool NBG, bool SILU>
__global__ void __launch_bounds__(kStreamBlock, kStreamMinBlocks)
    fwd_team_stream(const RmsNormGatedFwdParams p, const VecFlags vf, const bool hints) {
  constexpr int TB = kStreamBlock / TPR;  // rows (teams) per block per step
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const int nc = static_cast<int>(p.D / kV);
  const int W = static_cast<int>(p.group / kV);  // lanes per group: a power of two dividing TPR (host-checked)
  const bool has = t < nc;
  const bool gstart = has && (t & (W - 1)) == 0;
  const float inv_g = 1.f / static_cast<float>(p.group), eps = p.eps;
  float w[kV], b[kV];
  lane_params(p, vf, t, has, w, b);

  // Element offsets of this thread's chunk in row `row`, advanced by fixed steps (rows equally spaced).
  const int64_t step = static_cast<int64_t>(gridDim.x) * TB;
  int64_t row = static_cast<int64_t>(blockIdx.x) * TB + team;
  const int64_t col = static_cast<int64_t>(t) * kV;
  int64_t xo = p.x_rows.base + row * p.x_rows.strides[0] + col;
  int64_t zo = p.z_rows.base + row * p.z_rows.strides[0] + col;
  int64_t yo = p.y_rows.base + row * p.y_rows.strides[0] + col;
  int64_t so = p.rstd_rows.base + row * p.rstd_rows.strides[0] + static_cast<int64_t>(t / W) * p.rstd_rows.col_stride;
  const int64_t xs = step * p.x_rows.strides[0], zs = step * p.z_rows.strides[0], ys = step * p.y_rows.strides[0],
                ss = step * p.rstd_rows.strides[0];
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  const uint16_t* z = static_cast<const uint16_t*>(p.z);
  uint16_t* y = static_cast<uint16_t*>(p.y);
  float* rstd = static_cast<float*>(p.rstd);

  const uint4 zero = make_uint4(0, 0, 0, 0);
  bool live = row < p.rows;
  uint4 xv = live && has ? cuda::ld_vec16(x + xo, hints) : zero;
  uint4 zv = live && has ? cuda::ld_vec16(z + zo, hints) : zero;
  // The loop condition is uniform per block (the shuffles in team_row need every lane of the warp).
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * TB; first < p.rows; first += step) {
    const bool nlive = row + step < p.rows;
    const uint4 xn = nlive && has ? cuda::ld_vec16(x + xo + xs, hints) : zero;
    const uint4 zn = nlive && has ? cuda::ld_vec16(z + zo + zs, hints) : zero;
    uint32_t q[kV / 2];
    const float rs = team_row<TPR, BF16, NBG, SILU>(xv, zv, w, b, W, inv_g, eps, q);
    if (live) {
      if (gstart) rstd[so] = rs;
      if (has) st_v4(y + yo, q);
    }
    xv = xn, zv = zn, live = nlive, row += step;
    xo += xs, zo += zs, yo += ys, so += ss;
  }
}

// team_tma: block b owns rows [b rpt, b rpt + n) (n = rpt but for the last tile). Shared memory: the mbarrier,
// then x's tile, then z's (rpt * D 16-bit elements each, rows D apart: 16-byte aligned as D % 8 == 0).
template <int TPR, bool BF16, bool NBG, bool SILU>
__global__ void __launch_bounds__(kTmaMaxThreads)
    fwd_team_tma(const RmsNormGatedFwdParams p, const VecFlags vf, int rpt, int flags) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  const uint32_t row_bytes = static_cast<uint32_t>(p.D) * 2u;
  unsigned char* xt = smem + kTmaHeader;
  unsigned char* zt = xt + static_cast<size_t>(rpt) * row_bytes;
  float* rs_tile = reinterpret_cast<float*>(zt + static_cast<size_t>(rpt) * row_bytes);  // flags & 4: [rpt][D / G]
  const int ng = static_cast<int>(p.D / p.group);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rpt;
  const int n = static_cast<int>(min(static_cast<int64_t>(rpt), p.rows - r0));
  const uint32_t bytes = static_cast<uint32_t>(n) * row_bytes;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    cuda::mbar_init(bar, 1);
    cuda::mbar_arrive_expect_tx(bar, 2 * bytes);
    const uint16_t* xs = static_cast<const uint16_t*>(p.x) + p.x_rows.base + r0 * p.D;
    const uint16_t* zs = static_cast<const uint16_t*>(p.z) + p.z_rows.base + r0 * p.D;
    if (flags & 2) {
      const uint64_t pol = cuda::l2_evict_first();
      cuda::bulk_g2s_hint(xt, xs, bytes, bar, pol);
      cuda::bulk_g2s_hint(zt, zs, bytes, bar, pol);
    } else {
      cuda::bulk_g2s(xt, xs, bytes, bar);
      cuda::bulk_g2s(zt, zs, bytes, bar);
    }
  }
  // While the copies run: this lane's parameters and column facts.
  const int t = tid % TPR, team = tid / TPR, nteams = static_cast<int>(blockDim.x) / TPR;
  const int nc = static_cast<int>(p.D / kV);
  const int W = static_cast<int>(p.group / kV);
  const bool has = t < nc;
  const bool gstart = has && (t & (W - 1)) == 0;
  const float inv_g = 1.f / static_cast<float>(p.group), eps = p.eps;
  float w[kV], b[kV];
  lane_params(p, vf, t, has, w, b);
  float* rstd = static_cast<float*>(p.rstd);
  const int64_t scol = p.rstd_rows.base + static_cast<int64_t>(t / W) * p.rstd_rows.col_stride;
  __syncthreads();  // the barrier is initialised before anyone waits on it
  cuda::mbar_wait(bar, 0);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // Every team runs the same trip count (the shuffles need whole warps); rows past n read zeros.
  const int trips = (n + nteams - 1) / nteams;
  for (int j = 0; j < trips; ++j) {
    const int r = team + j * nteams;
    const bool live = r < n;
    const size_t off = static_cast<size_t>(live ? r : 0) * row_bytes + static_cast<size_t>(t) * 16;
    const uint4 xv = live && has ? cuda::lds16(xt + off) : zero;
    const uint4 zv = live && has ? cuda::lds16(zt + off) : zero;
    uint32_t q[kV / 2];
    const float rs = team_row<TPR, BF16, NBG, SILU>(xv, zv, w, b, W, inv_g, eps, q);
    if (live) {
      if (gstart) {
        if (flags & 4) rs_tile[r * ng + t / W] = rs;
        else rstd[scol + (r0 + r) * p.rstd_rows.strides[0]] = rs;
      }
      if (has) sts_v4(xt + off, q);  // y over x: this lane's own chunk, read above
    }
  }
  cuda::fence_proxy_async();  // this thread's writes of the tile before the copy engine reads it
  __syncthreads();
  if (tid == 0) {
    uint16_t* yd = static_cast<uint16_t*>(p.y) + p.y_rows.base + r0 * p.D;
    if (flags & 1) cuda::bulk_s2g_hint(yd, xt, bytes, cuda::l2_evict_first());
    else cuda::bulk_s2g(yd, xt, bytes);
    cuda::bulk_commit();
  }
  if (flags & 4) {  // consecutive threads, consecutive rstd values (one coalesced store per warp for dense rstd)
    for (int i = tid; i < n * ng; i += static_cast<int>(blockDim.x)) {
      const int r = i / ng, gi = i - r * ng;
      rstd[p.rstd_rows.base + (r0 + r) * p.rstd_rows.strides[0] + gi * p.rstd_rows.col_stride] = rs_tile[i];
    }
  }
  if (tid == 0) cuda::bulk_wait_read();  // the store has read the tile before the block's shared memory is freed
#else
  __trap();  // sm_90 only (the plan requires it)
#endif
}

// team_regs: block b owns rows [b R T, (b + 1) R T) (T = teams per block); team k of the block takes rows
// b R T + k + j T, j < R. Every lane runs every row's team_row (the shuffles need whole warps); rows past
// p.rows load zeros and store nothing.
template <int TPR, int R, bool BF16, bool NBG, bool SILU, bool HINTS = false>
__global__ void __launch_bounds__(kTmaMaxThreads) fwd_team_regs(const RmsNormGatedFwdParams p, const VecFlags vf) {
  const int t = static_cast<int>(threadIdx.x) % TPR, team = static_cast<int>(threadIdx.x) / TPR;
  const int nteams = static_cast<int>(blockDim.x) / TPR;
  const int nc = static_cast<int>(p.D / kV);
  const int W = static_cast<int>(p.group / kV);
  const bool has = t < nc;
  const bool gstart = has && (t & (W - 1)) == 0;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * R * nteams + team;
  const int64_t col = static_cast<int64_t>(t) * kV;
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  const uint16_t* z = static_cast<const uint16_t*>(p.z);
  uint4 xv[R], zv[R];
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int64_t row = r0 + static_cast<int64_t>(j) * nteams;
    const bool live = has && row < p.rows;
    const uint16_t* xp = x + p.x_rows.base + row * p.x_rows.strides[0] + col;
    const uint16_t* zp = z + p.z_rows.base + row * p.z_rows.strides[0] + col;
    xv[j] = live ? cuda::ld_vec16(xp, HINTS) : zero;
    zv[j] = live ? cuda::ld_vec16(zp, HINTS) : zero;
  }
  const float inv_g = 1.f / static_cast<float>(p.group), eps = p.eps;
  float w[kV], b[kV];
  lane_params(p, vf, t, has, w, b);
  uint16_t* y = static_cast<uint16_t*>(p.y);
  float* rstd = static_cast<float*>(p.rstd);
  const int64_t scol = p.rstd_rows.base + static_cast<int64_t>(t / W) * p.rstd_rows.col_stride;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int64_t row = r0 + static_cast<int64_t>(j) * nteams;
    uint32_t q[kV / 2];
    const float rs = team_row<TPR, BF16, NBG, SILU>(xv[j], zv[j], w, b, W, inv_g, eps, q);
    if (row < p.rows) {
      if (gstart) rstd[scol + row * p.rstd_rows.strides[0]] = rs;
      if (has) st_v4(y + p.y_rows.base + row * p.y_rows.strides[0] + col, q);
    }
  }
}

// Team configuration (TPR) of the streaming forward, 0 if it does not apply.
int stream_tpr(const RmsNormGatedFwdParams& p) {
  if (p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16) return 0;
  if (p.residual || p.residual_out) return 0;
  if (p.rstd_dtype != STRATA_DTYPE_F32) return 0;
  if (!p.x_rows.uniform() || !p.z_rows.uniform() || !p.y_rows.uniform() || !p.rstd_rows.uniform()) return 0;
  if (p.x_rows.col_stride != 1 || p.z_rows.col_stride != 1 || p.y_rows.col_stride != 1) return 0;
  const Config c = choose(p.D, p.group, true);
  if (c.tpr == 0 || c.tpr > 32 || c.nv != 1) return 0;
  const int64_t W = p.group / kV;
  if (W < 1 || W > c.tpr || c.tpr % W != 0 || (W & (W - 1)) != 0) return 0;
  return c.tpr;
}

// How the kernels are launched: persistent (one wave at the kernel's occupancy, each thread walks many rows),
// flat (one row per team, a grid that covers the rows once: the forced-only team_stream_flat), or tiles
// (team_tma; tile.rpt rows per block of tile.threads threads; dense rows, else persistent).
struct StreamGrid {
  bool persistent;
  RmsNormGatedTmaTile tile;  // rpt == 0: the streaming kernel
  RmsNormGatedRegsTile regs{0, 0};  // rows_per_team > 0: team_regs (tile.rpt is 0 then)
  bool hints = false;               // the streaming kernel: ld_stream's hinted loads (else plain ld.global.v4)
};

// team_tma's block for teams of tpr lanes: whole teams, at most kTmaMaxThreads and at least one team.
int tma_threads(int tpr, int want) { return std::max(tpr, std::min(kTmaMaxThreads, want) / tpr * tpr); }

template <int TPR, int R, bool BF16, bool NBG, bool SILU, bool HINTS>
strata_status launch_regs(const RmsNormGatedFwdParams& p, const VecFlags& vf, int threads, cudaStream_t s) {
  const int64_t rows_per_block = int64_t{R} * (threads / TPR);
  const int64_t blocks = (p.rows + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) return STRATA_ERROR_INVALID_VALUE;  // > 2^31 blocks: 2^31 x rows_per_block rows, beyond device memory
  fwd_team_regs<TPR, R, BF16, NBG, SILU, HINTS><<<static_cast<unsigned>(blocks), threads, 0, s>>>(p, vf);
  return cuda::check_launch("rms_norm_gated fwd_team_regs");
}

template <int TPR, bool BF16, bool NBG, bool SILU>
strata_status launch_inst(const RmsNormGatedFwdParams& p, const VecFlags& vf, StreamGrid g, cudaStream_t s) {
  if (g.regs.rows_per_team > 0) {
    const int threads = tma_threads(TPR, g.regs.threads);
    if (g.regs.l2_hint_loads) return launch_regs<TPR, 2, BF16, NBG, SILU, true>(p, vf, threads, s);  // 2 rows only
    switch (g.regs.rows_per_team) {
      case 1: return launch_regs<TPR, 1, BF16, NBG, SILU, false>(p, vf, threads, s);
      case 4: return launch_regs<TPR, 4, BF16, NBG, SILU, false>(p, vf, threads, s);
      default: return launch_regs<TPR, 2, BF16, NBG, SILU, false>(p, vf, threads, s);
    }
  }
  // team_tma copies the tile's rows as one range: x, z, y rows exactly D apart (16-byte aligned rows, checked by
  // fwd_layouts_ok, make every range 16-byte aligned with a size of n * D * 2, a multiple of 16).
  const bool dense = p.x_rows.strides[0] == p.D && p.z_rows.strides[0] == p.D && p.y_rows.strides[0] == p.D;
  const int64_t smem = kTmaHeader + 4 * int64_t{g.tile.rpt} * p.D + 4 * int64_t{g.tile.rpt} * (p.D / p.group);
  if (g.tile.rpt > 0 && dense && smem <= kTmaMaxSmem) {
    const int64_t blocks = (p.rows + g.tile.rpt - 1) / g.tile.rpt;
    if (blocks > 0x7fffffff) return STRATA_ERROR_INVALID_VALUE;  // > 2^31 tiles: not reachable at 16-row tiles
    fwd_team_tma<TPR, BF16, NBG, SILU><<<static_cast<unsigned>(blocks), tma_threads(TPR, g.tile.threads),
                                         static_cast<size_t>(smem), s>>>(p, vf, g.tile.rpt, g.tile.flags);
    return cuda::check_launch("rms_norm_gated fwd_team_tma");
  }
  constexpr int TB = kStreamBlock / TPR;
  const auto kernel = fwd_team_stream<TPR, BF16, NBG, SILU>;
  static const int occ = cuda::occupancy_blocks_per_sm(kernel, kStreamBlock);
  const bool persistent = g.persistent || g.tile.rpt > 0;
  const int64_t slots = persistent ? static_cast<int64_t>(cuda::current_sm_count()) * occ : 0x7fffffff;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((p.rows + TB - 1) / TB, slots));
  kernel<<<static_cast<unsigned>(blocks), kStreamBlock, 0, s>>>(p, vf, g.hints);
  return cuda::check_launch("rms_norm_gated fwd_team_stream");
}

template <int TPR>
strata_status launch_tpr(const RmsNormGatedFwdParams& p, const VecFlags& vf, StreamGrid g, cudaStream_t s) {
  const bool bf16 = p.x_dtype == STRATA_DTYPE_BF16, silu = p.act == kActSilu;
  if (bf16) {
    if (p.norm_before_gate)
      return silu ? launch_inst<TPR, true, true, true>(p, vf, g, s) : launch_inst<TPR, true, true, false>(p, vf, g, s);
    return silu ? launch_inst<TPR, true, false, true>(p, vf, g, s) : launch_inst<TPR, true, false, false>(p, vf, g, s);
  }
  if (p.norm_before_gate)
    return silu ? launch_inst<TPR, false, true, true>(p, vf, g, s) : launch_inst<TPR, false, true, false>(p, vf, g, s);
  return silu ? launch_inst<TPR, false, false, true>(p, vf, g, s) : launch_inst<TPR, false, false, false>(p, vf, g, s);
}

int launch_any(const RmsNormGatedFwdParams& p, StreamGrid g, void* stream) {
  if (p.rows == 0 || p.D == 0) return STRATA_SUCCESS;
  const int tpr = stream_tpr(p);
  // Pointers are known only now: rows that cannot be read in aligned 16-byte chunks take group_rows' kernels.
  if (tpr == 0 || !fwd_layouts_ok(p)) return rms_norm_gated_fwd_cuda(p, stream);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const VecFlags vf{param_vec_ok(p.weight, p.w_dtype, p.w_row), param_vec_ok(p.bias, p.b_dtype, p.b_row)};
  switch (tpr) {
    case 4: return launch_tpr<4>(p, vf, g, s);
    case 8: return launch_tpr<8>(p, vf, g, s);
    case 16: return launch_tpr<16>(p, vf, g, s);
    default: return launch_tpr<32>(p, vf, g, s);
  }
}

}  // namespace

std::string rms_norm_gated_fwd_cuda_stream_reject(const RmsNormGatedFwdParams& p) {
  if (p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16) return "handles bf16/f16 x, z, y only";
  if (p.residual || p.residual_out) return "handles no residual / residual_out";
  if (stream_tpr(p) == 0)
    return "needs equally spaced rows, unit column strides, f32 rstd, D and group multiples of 8, D <= 256 with "
           "one 8-feature chunk per lane and groups of a power-of-two number of lanes";
  return {};
}

int rms_norm_gated_fwd_cuda_stream(const RmsNormGatedFwdParams& p, void* stream, bool persistent, bool l2_hint_loads) {
  return launch_any(p, StreamGrid{persistent, RmsNormGatedTmaTile{0, 0, 0}, RmsNormGatedRegsTile{0, 0}, l2_hint_loads}, stream);
}

int rms_norm_gated_fwd_cuda_tma(const RmsNormGatedFwdParams& p, void* stream, RmsNormGatedTmaTile tile) {
  if (tile.rpt < 1 || tile.threads < 1 || tile.flags < 0 || tile.flags > 7) return STRATA_ERROR_INVALID_VALUE;
  return launch_any(p, StreamGrid{true, tile}, stream);
}

int rms_norm_gated_fwd_cuda_regs(const RmsNormGatedFwdParams& p, void* stream, RmsNormGatedRegsTile tile) {
  if ((tile.rows_per_team != 1 && tile.rows_per_team != 2 && tile.rows_per_team != 4) || tile.threads < 1 ||
      (tile.l2_hint_loads && tile.rows_per_team != 2))
    return STRATA_ERROR_INVALID_VALUE;
  return launch_any(p, StreamGrid{true, RmsNormGatedTmaTile{0, 0, 0}, tile}, stream);
}

}  // namespace strata::norm
