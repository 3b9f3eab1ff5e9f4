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
// team_stream_pf (forced only, session 8): the persistent kernel plus an L2 prefetch: each step, one thread of
// the block asks the copy engine (cp.async.bulk.prefetch.L2) for the x and z bytes of the block's rows kPfSteps
// steps ahead. A thread holds one row in flight in registers (32 bytes of x and z: 32 KiB per SM at 1024
// threads), below what the H200's DRAM needs in flight to stream at full rate (~50 KiB per SM by Little's law at
// ~4.8 TB/s and ~1.4 us); the prefetched rows are in flight without costing registers, and the register loads
// of the next row then hit L2. Only for dense rows (row stride D for x and z: the block's rows are one
// contiguous range); other layouts run the kernel without it.
// Lanes past the row's chunks (D < TPR * 8) and teams past the last row keep running (the group sums shuffle
// over the whole warp) but load zeros and store nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/norm/rms_norm_gated/cuda_common.cuh"
#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "runtime/error.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm {
namespace {

using namespace rng_cuda;

constexpr int kStreamBlock = 256;
// 4 blocks of 256 threads per SM (32 warps, <= 64 registers): w, b (16), two rows of packed x / z (16) and
// the offsets stay in registers.
constexpr int kStreamMinBlocks = 4;

// team_stream_pf: how many row steps ahead of the current one the L2 prefetch runs (the registers hold the
// next step's rows; with 4 blocks of 16 rows per SM, D = 128 bf16, each step prefetches 32 KiB per SM, so
// ~64 KiB per SM are in flight through the prefetch and ~17 MB of the 60 MB L2 hold prefetched rows).
constexpr int kPfSteps = 2;

// Prefetch of `bytes` (a multiple of 16, 16-byte aligned address) from global memory into L2 by the copy
// engine; nothing is written to shared memory or waited for.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// One 16-byte store (a uint4 assignment compiled to four 4-byte stores here, nvcc 13).
__device__ __forceinline__ void st_v4(void* p, const uint32_t (&q)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(q[0]), "r"(q[1]), "r"(q[2]), "r"(q[3])
               : "memory");
}

// PF: team_stream_pf's L2 prefetch (dense rows only: the launch checks x and z have row stride D).
template <int TPR, bool BF16, bool NBG, bool SILU, bool PF>
__global__ void __launch_bounds__(kStreamBlock, kStreamMinBlocks)
    fwd_team_stream(const RmsNormGatedFwdParams p, const VecFlags vf) {
  constexpr int TB = kStreamBlock / TPR;  // rows (teams) per block per step
  constexpr int32_t kDt = BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16;
  constexpr int32_t kAct = SILU ? kActSilu : kActSigmoid;
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const int nc = static_cast<int>(p.D / kV);
  const int W = static_cast<int>(p.group / kV);  // lanes per group: a power of two dividing TPR (host-checked)
  const bool has = t < nc;
  const bool gstart = has && (t & (W - 1)) == 0;
  const float inv_g = 1.f / static_cast<float>(p.group), eps = p.eps;

  // This lane's weight / bias chunk, once (w = 1, b = 0 when absent or past D).
  float w[kV], b[kV];
  if (has) {
    load_param(p.weight, p.w_dtype, p.w_row, static_cast<int64_t>(t) * kV, vf.w, 1.f, w);
    load_param(p.bias, p.b_dtype, p.b_row, static_cast<int64_t>(t) * kV, vf.b, 0.f, b);
  } else {
#pragma unroll
    for (int e = 0; e < kV; ++e) w[e] = 1.f, b[e] = 0.f;
  }

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
  uint4 xv = live && has ? cuda::ld_stream(x + xo) : zero;
  uint4 zv = live && has ? cuda::ld_stream(z + zo) : zero;
  // The loop condition is uniform per block (the shuffles below need every lane of the warp).
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * TB; first < p.rows; first += step) {
    if constexpr (PF) {
      // The block's TB rows kPfSteps steps ahead (fewer at the end): x and z, TB * D contiguous elements each.
      const int64_t pr = first + kPfSteps * step;
      if (threadIdx.x == 0 && pr < p.rows) {
        const int64_t n = p.rows - pr < TB ? p.rows - pr : TB;
        const uint32_t bytes = static_cast<uint32_t>(n * p.D * 2);
        prefetch_l2_bulk(x + p.x_rows.base + pr * p.D, bytes);
        prefetch_l2_bulk(z + p.z_rows.base + pr * p.D, bytes);
      }
    }
    const bool nlive = row + step < p.rows;
    const uint4 xn = nlive && has ? cuda::ld_stream(x + xo + xs) : zero;
    const uint4 zn = nlive && has ? cuda::ld_stream(z + zo + zs) : zero;

    float u[kV], zf[kV];
    cuda::unpack8(xv, kDt, u);
    cuda::unpack8(zv, kDt, zf);
    // Zero chunks (dead rows, lanes past D) add nothing: x = 0 gives u = 0 in both gate orders.
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

    if (live) {
      if (gstart) rstd[so] = rs;
      if (has) {
        uint32_t q[kV / 2];
#pragma unroll
        for (int e = 0; e < kV; e += 2) {
          float o0 = fmaf(u[e] * rs, w[e], b[e]), o1 = fmaf(u[e + 1] * rs, w[e + 1], b[e + 1]);
          if constexpr (NBG) o0 *= vact(kAct, true, zf[e]), o1 *= vact(kAct, true, zf[e + 1]);
          q[e / 2] = cuda::pack_half2(kDt, o0, o1);
        }
        st_v4(y + yo, q);
      }
    }
    xv = xn, zv = zn, live = nlive, row += step;
    xo += xs, zo += zs, yo += ys, so += ss;
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

// How the kernel is launched: persistent (one wave at the kernel's occupancy, each thread walks many rows),
// flat (one row per team, a grid that covers the rows once: the forced-only team_stream_flat), or persistent
// with the L2 prefetch (the forced-only team_stream_pf; dense rows, else plain persistent).
struct StreamGrid {
  bool persistent, prefetch;
};

template <int TPR, bool BF16, bool NBG, bool SILU, bool PF>
strata_status launch_grid(const RmsNormGatedFwdParams& p, const VecFlags& vf, bool persistent, cudaStream_t s) {
  constexpr int TB = kStreamBlock / TPR;
  const auto kernel = fwd_team_stream<TPR, BF16, NBG, SILU, PF>;
  static const int occ = cuda::occupancy_blocks_per_sm(kernel, kStreamBlock);
  const int64_t slots = persistent ? static_cast<int64_t>(cuda::current_sm_count()) * occ : 0x7fffffff;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((p.rows + TB - 1) / TB, slots));
  kernel<<<static_cast<unsigned>(blocks), kStreamBlock, 0, s>>>(p, vf);
  return cuda::check_launch("rms_norm_gated fwd_team_stream");
}

template <int TPR, bool BF16, bool NBG, bool SILU>
strata_status launch_inst(const RmsNormGatedFwdParams& p, const VecFlags& vf, StreamGrid g, cudaStream_t s) {
  // The prefetch reads the block's rows as one range: x and z rows exactly D apart (16-byte aligned rows,
  // checked by fwd_layouts_ok, make every range 16-byte aligned with a size of TB * D * 2, a multiple of 16).
  const bool dense = p.x_rows.strides[0] == p.D && p.z_rows.strides[0] == p.D;
  if (g.persistent && g.prefetch && dense) return launch_grid<TPR, BF16, NBG, SILU, true>(p, vf, true, s);
  return launch_grid<TPR, BF16, NBG, SILU, false>(p, vf, g.persistent, s);
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

}  // namespace

std::string rms_norm_gated_fwd_cuda_stream_reject(const RmsNormGatedFwdParams& p) {
  if (p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16) return "handles bf16/f16 x, z, y only";
  if (p.residual || p.residual_out) return "handles no residual / residual_out";
  if (stream_tpr(p) == 0)
    return "needs equally spaced rows, unit column strides, f32 rstd, D and group multiples of 8, D <= 256 with "
           "one 8-feature chunk per lane and groups of a power-of-two number of lanes";
  return {};
}

int rms_norm_gated_fwd_cuda_stream(const RmsNormGatedFwdParams& p, void* stream, bool persistent, bool l2_prefetch) {
  if (p.rows == 0 || p.D == 0) return STRATA_SUCCESS;
  const int tpr = stream_tpr(p);
  // Pointers are known only now: rows that cannot be read in aligned 16-byte chunks take group_rows' kernels.
  if (tpr == 0 || !fwd_layouts_ok(p)) return rms_norm_gated_fwd_cuda(p, stream);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const VecFlags vf{param_vec_ok(p.weight, p.w_dtype, p.w_row), param_vec_ok(p.bias, p.b_dtype, p.b_row)};
  const StreamGrid g{persistent, l2_prefetch};
  switch (tpr) {
    case 4: return launch_tpr<4>(p, vf, g, s);
    case 8: return launch_tpr<8>(p, vf, g, s);
    case 16: return launch_tpr<16>(p, vf, g, s);
    default: return launch_tpr<32>(p, vf, g, s);
  }
}

}  // namespace strata::norm
