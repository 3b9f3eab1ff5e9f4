// CUDA kernels of rms_norm_gated (rms_norm_gated.h). Memory-bound: every input is read once and every output
// written once, with 16-byte accesses where the layout allows; arithmetic in f32.
//
// Rows are cut into chunks of kV = 8 features (16 B of bf16/f16, 32 B of f32); chunk k of lane t of a row
// team covers features [(t + k * TPR) * kV, +kV). A chunk never straddles a group (G % kV == 0 on the vector
// paths), so per-group sums are sums of chunk partials:
//   team_rows<TPR, NV>, TPR <= 32: a team of TPR lanes holds one row (NV chunks per lane, several rows per
//        warp for short rows; D <= 32 * 4 * kV = 1024). Group sums by shuffles: a group inside one slice of
//        TPR * kV features is W = G / kV consecutive lanes (xor tree of width W); a group of whole slices
//        adds its slices' partials per lane, then one TPR-wide tree.
//   team_rows<256, NV>: a block per row (D <= 8192, any G % kV == 0): chunk partials go to shared memory in
//        feature order and a pairwise tree inside each group (fixed shape) gives the group sums.
//   looped:  any D, G, stride or alignment: a block per row, warp w takes groups w, w + 8, ...; element-wise.
// Backward: each block owns a fixed set of rows (grid-stride over row teams with a grid that depends only on
// the problem), sums dw / db of its rows in registers in row order, reduces its teams in fixed order into its
// partial row [num_partials, D] of the workspace, and a second kernel sums the partial rows in fixed order.
// No atomics: the same bits every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

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

constexpr int kV = 8;
constexpr int kBlock = 256;
constexpr unsigned kFull = 0xffffffffu;

// Which row tensors may use 16-byte accesses (host-checked: unit column stride, aligned row starts).
struct VecFlags {
  bool w = false, b = false;
};

// ---- per-group totals of per-chunk partials (see the file comment) ----
template <int TPR, int NV>
__device__ __forceinline__ void group_totals(const float (&part)[NV], float (&tot)[NV], int64_t G, int64_t D, int t,
                                             float* red) {
  if constexpr (TPR <= 32) {
    constexpr int64_t kSlice = static_cast<int64_t>(TPR) * kV;
    if (G >= kSlice) {
      const int spg = static_cast<int>(G / kSlice);  // slices per group (G % kSlice == 0 here)
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k * kSlice >= D) break;  // uniform across the warp
        acc += part[k];
        if ((k + 1) % spg == 0) {
          const float s = cuda::group_sum<TPR>(acc);
#pragma unroll
          for (int kk = 0; kk < NV; ++kk)
            if (kk <= k && kk > k - spg) tot[kk] = s;
          acc = 0.f;
        }
      }
    } else {
      const int W = static_cast<int>(G / kV);  // a power of two dividing TPR here
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k * kSlice >= D) break;
        float s = part[k];
        for (int o = W / 2; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
        tot[k] = s;
      }
    }
  } else {
    // Block per row: red holds NV * TPR chunk partials in feature order; pairwise tree inside each group.
    __syncthreads();  // red may still be read from the previous use
#pragma unroll
    for (int k = 0; k < NV; ++k) red[t + k * TPR] = part[k];
    __syncthreads();
    const int64_t gc = G / kV, nc = D / kV;
    for (int64_t s = 1; s < gc; s <<= 1) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int64_t i = t + k * TPR;
        const int64_t local = i % gc;
        if (i < nc && local % (2 * s) == 0 && local + s < gc) red[i] += red[i + s];
      }
      __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t i = t + k * TPR;
      tot[k] = i < nc ? red[i - i % gc] : 0.f;
    }
  }
}

// Parameter chunk (weight / bias): vector when allowed, else element-wise; absent -> dflt.
__device__ __forceinline__ void load_param(const void* base, int32_t dtype, const RowLayout& l, int64_t c, bool vec,
                                           float dflt, float (&v)[kV]) {
  if (!base) {
#pragma unroll
    for (int e = 0; e < kV; ++e) v[e] = dflt;
    return;
  }
  load_any<kV>(base, dtype, l.base + c * l.col_stride, l.col_stride, vec, v);
}

// h = x (+ residual) for one chunk (vector accesses: the caller checked the layouts).
__device__ __forceinline__ void load_h(const void* x, int32_t x_dtype, int64_t xo, const void* res, int32_t res_dtype,
                                       int64_t ro, float (&h)[kV]) {
  load_vec<kV>(x, x_dtype, xo, h);
  if (res) {
    float r[kV];
    load_vec<kV>(res, res_dtype, ro, r);
#pragma unroll
    for (int e = 0; e < kV; ++e) h[e] += r[e];
  }
}

// ------------------------------------------------------------------------------------------------------
// Forward, vector paths.

template <int TPR, int NV>
__global__ void __launch_bounds__(kBlock) fwd_team_rows(const RmsNormGatedFwdParams p, const VecFlags vf) {
  constexpr int TB = kBlock / TPR;  // row teams per block
  __shared__ float red[TPR > 32 ? NV * TPR : 1];
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const float inv_g = 1.f / static_cast<float>(p.group);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * TB; base < p.rows; base += static_cast<int64_t>(gridDim.x) * TB) {
    const int64_t row = base + team;
    const bool live = row < p.rows;  // dead lanes stay for the shuffles and block syncs but touch no memory
    const int64_t xo = live ? p.x_rows.row_offset(row) : 0;
    const int64_t ro = live && p.residual ? p.res_rows.row_offset(row) : 0;
    const int64_t oo = live && p.residual_out ? p.res_out_rows.row_offset(row) : 0;
    const int64_t zo = live ? p.z_rows.row_offset(row) : 0;
    // z is loaded with x (both 16-byte loads in flight before the reduction), also for norm_before_gate.
    float u[NV][kV], zr[NV][kV], part[NV], tot[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = static_cast<int64_t>(t + k * TPR) * kV;
      part[k] = 0.f;
      tot[k] = 0.f;
      if (live && c < p.D) {
        load_h(p.x, p.x_dtype, xo + c, p.residual, p.res_dtype, ro + c, u[k]);
        load_vec<kV>(p.z, p.x_dtype, zo + c, zr[k]);
        if (p.residual_out) store_vec<kV>(p.residual_out, p.res_out_dtype, oo + c, u[k]);
        if (!p.norm_before_gate) {
#pragma unroll
          for (int e = 0; e < kV; ++e) u[k][e] *= rng_act(p.act, zr[k][e]);
        }
#pragma unroll
        for (int e = 0; e < kV; ++e) part[k] = fmaf(u[k][e], u[k][e], part[k]);
      }
    }
    group_totals<TPR, NV>(part, tot, p.group, p.D, t, red);
    if (!live) continue;
    const int64_t yo = p.y_rows.row_offset(row), so = p.rstd_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = static_cast<int64_t>(t + k * TPR) * kV;
      if (c >= p.D) continue;
      const float r = rsqrtf(tot[k] * inv_g + p.eps);
      if (c % p.group == 0) store_one(p.rstd, p.rstd_dtype, so + (c / p.group) * p.rstd_rows.col_stride, r);
      float w[kV], b[kV];
      load_param(p.weight, p.w_dtype, p.w_row, c, vf.w, 1.f, w);
      load_param(p.bias, p.b_dtype, p.b_row, c, vf.b, 0.f, b);
      float o[kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) o[e] = fmaf(u[k][e] * r, w[e], b[e]);
      if (p.norm_before_gate) {
#pragma unroll
        for (int e = 0; e < kV; ++e) o[e] *= rng_act(p.act, zr[k][e]);
      }
      store_vec<kV>(p.y, p.x_dtype, yo + c, o);
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

template <int TPR, int NV>
__global__ void __launch_bounds__(kBlock) bwd_team_rows(const RmsNormGatedBwdParams p, const VecFlags vf) {
  constexpr int TB = kBlock / TPR;
  constexpr int kCols = TPR * NV * kV;  // features a team covers (>= D)
  __shared__ float red[TPR > 32 ? NV * TPR : 1];
  __shared__ float colbuf[TPR > 32 ? 1 : TB * kCols];
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  const float inv_g = 1.f / static_cast<float>(p.group);
  const bool want_wb = p.dweight || p.dbias;
  float dw[NV][kV], db[NV][kV];
#pragma unroll
  for (int k = 0; k < NV; ++k)
#pragma unroll
    for (int e = 0; e < kV; ++e) dw[k][e] = db[k][e] = 0.f;

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * TB; base < p.rows; base += static_cast<int64_t>(gridDim.x) * TB) {
    const int64_t row = base + team;
    const bool live = row < p.rows;
    const int64_t xo = live ? p.x_rows.row_offset(row) : 0;
    const int64_t ro = live && p.residual ? p.res_rows.row_offset(row) : 0;
    const int64_t zo = live ? p.z_rows.row_offset(row) : 0;
    const int64_t so = live ? p.rstd_rows.row_offset(row) : 0;
    float nrm[NV][kV], dn[NV][kV], part[NV], tot[NV], rk[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = static_cast<int64_t>(t + k * TPR) * kV;
      part[k] = 0.f;
      tot[k] = 0.f;
      rk[k] = 0.f;
      if (!(live && c < p.D)) continue;
      const float r = load_one(p.rstd, p.rstd_dtype, so + (c / p.group) * p.rstd_rows.col_stride);
      rk[k] = r;
      float h[kV], zv[kV], dyv[kV], w[kV];
      load_h(p.x, p.x_dtype, xo + c, p.residual, p.res_dtype, ro + c, h);
      load_vec<kV>(p.z, p.x_dtype, zo + c, zv);
      load_vec<kV>(p.dy, p.x_dtype, p.dy_rows.row_offset(row) + c, dyv);
      load_param(p.weight, p.w_dtype, p.w_row, c, vf.w, 1.f, w);
      if (p.norm_before_gate) {
        float b[kV], dz[kV];
        load_param(p.bias, p.b_dtype, p.b_row, c, vf.b, 0.f, b);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float xh = h[e] * r, a = rng_act(p.act, zv[e]);
          const float dov = dyv[e] * a;
          dz[e] = dyv[e] * fmaf(xh, w[e], b[e]) * rng_act_grad(p.act, zv[e]);
          dw[k][e] = fmaf(dov, xh, dw[k][e]);
          db[k][e] += dov;
          nrm[k][e] = xh;
          dn[k][e] = dov * w[e];
          part[k] = fmaf(dn[k][e], xh, part[k]);
        }
        store_vec<kV>(p.dz, p.x_dtype, p.dz_rows.row_offset(row) + c, dz);
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float uh = h[e] * rng_act(p.act, zv[e]) * r;
          dw[k][e] = fmaf(dyv[e], uh, dw[k][e]);
          db[k][e] += dyv[e];
          nrm[k][e] = uh;
          dn[k][e] = dyv[e] * w[e];
          part[k] = fmaf(dn[k][e], uh, part[k]);
        }
      }
    }
    group_totals<TPR, NV>(part, tot, p.group, p.D, t, red);
    if (!live) continue;
    const int64_t dxo = p.dx_rows.row_offset(row);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = static_cast<int64_t>(t + k * TPR) * kV;
      if (c >= p.D) continue;
      const float mean = tot[k] * inv_g, r = rk[k];
      float dx[kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) dx[e] = r * fmaf(-nrm[k][e], mean, dn[k][e]);
      if (!p.norm_before_gate) {
        // dx = du act(z), dz = du h act'(z): h and z are read again (from L1/L2).
        float h[kV], zv[kV], dz[kV];
        load_h(p.x, p.x_dtype, xo + c, p.residual, p.res_dtype, ro + c, h);
        load_vec<kV>(p.z, p.x_dtype, zo + c, zv);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          dz[e] = dx[e] * h[e] * rng_act_grad(p.act, zv[e]);
          dx[e] *= rng_act(p.act, zv[e]);
        }
        store_vec<kV>(p.dz, p.x_dtype, p.dz_rows.row_offset(row) + c, dz);
      }
      if (p.dres_out) {
        float g[kV];
        load_vec<kV>(p.dres_out, p.dres_out_dtype, p.dres_out_rows.row_offset(row) + c, g);
#pragma unroll
        for (int e = 0; e < kV; ++e) dx[e] += g[e];
      }
      store_vec<kV>(p.dx, p.x_dtype, dxo + c, dx);
    }
  }
  if (!want_wb) return;
  // This block's partial row: its teams' sums added in team order (fixed), one thread per feature.
  float* out_w = p.partial + static_cast<int64_t>(blockIdx.x) * p.D;
  float* out_b = p.partial + (static_cast<int64_t>(p.num_partials) + blockIdx.x) * p.D;
  if constexpr (TPR > 32) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t c = static_cast<int64_t>(t + k * TPR) * kV;
      if (c >= p.D) continue;
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        out_w[c + e] = dw[k][e];
        out_b[c + e] = db[k][e];
      }
    }
  } else {
    for (int which = 0; which < 2; ++which) {
      __syncthreads();
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c = (t + k * TPR) * kV;
#pragma unroll
        for (int e = 0; e < kV; ++e) colbuf[team * kCols + c + e] = which == 0 ? dw[k][e] : db[k][e];
      }
      __syncthreads();
      float* out = which == 0 ? out_w : out_b;
      for (int c = threadIdx.x; c < p.D; c += kBlock) {
        float s = 0.f;
        for (int q = 0; q < TB; ++q) s += colbuf[q * kCols + c];
        out[c] = s;
      }
    }
  }
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

// Final fixed-order reduction of the partial rows: blockIdx.y 0 -> dweight, 1 -> dbias. A block covers 32
// features with 8 slices; slice s adds partial rows s, s + 8, ... in order, then slice 0 adds the 8 slices
// in order.
__global__ void __launch_bounds__(kBlock) reduce_partials(const RmsNormGatedBwdParams p) {
  __shared__ float buf[8][33];
  const int col = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + col;
  const bool bias = blockIdx.y == 1;
  void* out = bias ? p.dbias : p.dweight;
  if (!out) return;  // uniform over the block
  const float* part = p.partial + (bias ? p.num_partials * p.D : 0);
  float s = 0.f;
  if (j < p.D)
    for (int64_t b = slice; b < p.num_partials; b += 8) s += part[b * p.D + j];
  buf[slice][col] = s;
  __syncthreads();
  if (slice == 0 && j < p.D) {
    float tsum = 0.f;
    for (int q = 0; q < 8; ++q) tsum += buf[q][col];
    const RowLayout& l = bias ? p.db_row : p.dw_row;
    store_one(out, bias ? p.db_dtype : p.dw_dtype, l.base + j * l.col_stride, tsum);
  }
}

// ------------------------------------------------------------------------------------------------------
// Host side: path choice.

bool aligned16(const void* base, int32_t dtype, int64_t off) {
  return (reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(off) * dtype_size(dtype)) % 16 == 0;
}
// Every row start of `l` 16-byte aligned and unit column stride (or D <= 1).
bool rows_vec_ok(const void* base, int32_t dtype, const RowLayout& l) {
  if (!base) return true;
  if (l.col_stride != 1) return false;
  if (!aligned16(base, dtype, l.base)) return false;
  for (int i = 0; i < l.nd; ++i)
    if (l.sizes[i] > 1 && (l.strides[i] * static_cast<int64_t>(dtype_size(dtype))) % 16 != 0) return false;
  return true;
}
bool param_vec_ok(const void* base, int32_t dtype, const RowLayout& l) {
  return base && l.col_stride == 1 && aligned16(base, dtype, l.base) && dtype != STRATA_DTYPE_F64;
}

struct Config {
  int tpr = 0, nv = 0;  // tpr 0: looped
};

int pow2ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The vector path for D, G (given vector-capable layouts), or looped.
Config choose(int64_t D, int64_t G, bool layouts_ok) {
  Config c;
  if (!layouts_ok || D % kV != 0 || G % kV != 0) return c;
  const int64_t nc = D / kV;
  if (nc <= 32 * 4) {
    const int tpr = std::clamp(pow2ceil(nc), 4, 32);
    const int nv = pow2ceil((nc + tpr - 1) / tpr);
    const int64_t slice = static_cast<int64_t>(tpr) * kV;
    if (G % slice == 0 || slice % G == 0) return {tpr, nv};
  }
  if (nc <= 4 * kBlock) return {kBlock, pow2ceil((nc + kBlock - 1) / kBlock)};
  return c;
}

bool fwd_layouts_ok(const RmsNormGatedFwdParams& p) {
  return rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.z, p.x_dtype, p.z_rows) &&
         rows_vec_ok(p.y, p.x_dtype, p.y_rows) && rows_vec_ok(p.residual, p.res_dtype, p.res_rows) &&
         rows_vec_ok(p.residual_out, p.res_out_dtype, p.res_out_rows);
}
bool bwd_layouts_ok(const RmsNormGatedBwdParams& p) {
  return rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.z, p.x_dtype, p.z_rows) &&
         rows_vec_ok(p.dy, p.x_dtype, p.dy_rows) && rows_vec_ok(p.dx, p.x_dtype, p.dx_rows) &&
         rows_vec_ok(p.dz, p.x_dtype, p.dz_rows) && rows_vec_ok(p.residual, p.res_dtype, p.res_rows) &&
         rows_vec_ok(p.dres_out, p.dres_out_dtype, p.dres_out_rows);
}

// Backward config from the problem only (the plan's workspace is sized before any pointer is known, so the
// pointer alignment cannot change the number of partial rows: the vector and looped paths use the same
// count, and `layouts_ok` only picks the kernel).
Config bwd_config(const RmsNormGatedBwdParams& p, bool layouts_ok) { return choose(p.D, p.group, layouts_ok); }

int64_t bwd_partials(const RmsNormGatedBwdParams& p) {
  if (p.rows == 0 || p.D == 0) return 0;
  // Enough blocks for many waves, few enough that the partial rows stay small next to the tensors.
  const int64_t cap = std::clamp<int64_t>((int64_t{1} << 20) / p.D, 264, 4096);
  return std::min<int64_t>(p.rows, cap);
}

template <int TPR, int NV>
strata_status launch_fwd(const RmsNormGatedFwdParams& p, const VecFlags& vf, cudaStream_t s) {
  constexpr int TB = kBlock / TPR;
  const int64_t blocks = std::min<int64_t>((p.rows + TB - 1) / TB, int64_t{1} << 30);
  fwd_team_rows<TPR, NV><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p, vf);
  return cuda::check_launch("rms_norm_gated fwd_team_rows");
}

template <int TPR, int NV>
strata_status launch_bwd(const RmsNormGatedBwdParams& p, const VecFlags& vf, int64_t blocks, cudaStream_t s) {
  bwd_team_rows<TPR, NV><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p, vf);
  return cuda::check_launch("rms_norm_gated bwd_team_rows");
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

}  // namespace

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
  return fwd_vec(p, c, vf, s);
}

int rms_norm_gated_bwd_cuda(const RmsNormGatedBwdParams& p_in, void* stream) {
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
    } else {
      st = bwd_vec(p, c, vf, blocks, s);
    }
    if (st != STRATA_SUCCESS) return st;
  }
  if ((p.dweight || p.dbias) && p.D > 0) {
    const dim3 grid(static_cast<unsigned>((p.D + 31) / 32), 2);
    reduce_partials<<<grid, kBlock, 0, s>>>(p);
    return cuda::check_launch("rms_norm_gated reduce_partials");
  }
  return STRATA_SUCCESS;
}

}  // namespace strata::norm
