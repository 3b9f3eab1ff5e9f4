// Device and host helpers shared by the CUDA kernels of rms_norm_gated (cuda_sm90.cu: the register paths;
// cuda_sm90_ring.cu: the bulk-copy ring). Included by .cu files only; everything sits in namespace rng_cuda,
// which each .cu brings into its anonymous namespace.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/norm/rms_norm_gated/rms_norm_gated.h"
#include "tile/cuda/fast_math.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm::rng_cuda {

using cuda::load_any;
using cuda::load_vec;

constexpr int kV = 8;
constexpr int kBlock = 256;
constexpr unsigned kFull = 0xffffffffu;

// Which row tensors may use 16-byte accesses (host-checked: unit column stride, aligned row starts).
struct VecFlags {
  bool w = false, b = false;
};

// ---- per-group totals of per-chunk partials of a team of TPR <= 32 lanes (see the file comment) ----
template <int TPR, int NV>
__device__ __forceinline__ void group_totals(const float (&part)[NV], float (&tot)[NV], int64_t G, int64_t D, int t,
                                             float* /*red*/) {
  static_assert(TPR <= 32, "block teams use block_group_totals");
#pragma unroll
  for (int k = 0; k < NV; ++k) tot[k] = 0.f;
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
  (void)t;
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

// act(z) (and, below, act'(z)) on the vector paths. 16-bit activations use the approximate exp and reciprocal
// in their ftz forms (cuda::sigmoid_fast: 4 instructions; a few f32 ulps, far below one bf16/f16 rounding; the
// precise expf and IEEE divide are ~30 instructions per element, __expf / __fdividef ~10 with their denormal
// handling); f32 keeps the precise versions of rms_norm_gated.h.
__device__ __forceinline__ float vact(int32_t act, bool fast, float v) {
  if (!fast) return rng_act(act, v);
  const float s = cuda::sigmoid_fast(v);
  return act == kActSilu ? v * s : s;
}

// act(z) and act'(z) from one sigmoid.
__device__ __forceinline__ void vact_both(int32_t act, bool fast, float v, float& a, float& ag) {
  const float s = fast ? cuda::sigmoid_fast(v) : rng_sigmoid(v);
  if (act == kActSilu) {
    a = v * s;
    ag = s * (1.f + v * (1.f - s));
  } else {
    a = s;
    ag = s * (1.f - s);
  }
}

// Row offsets of equally spaced rows (RowLayout::uniform(), host-checked by the kernels that use it): no 64-bit
// division (RowLayout::row_offset's general path) and none of its registers.
__device__ __forceinline__ int64_t row_off(const RowLayout& l, int64_t r) { return l.base + r * l.strides[0]; }
// A row's y and rstd offsets (team_fwd_row's offs()).
struct YsOffs {
  int64_t yo, so;
};

// ---- per-element row math shared by every vector kernel (team, block, ring; see rms_norm_gated.h) ----
// Forward output of one element: u = h (norm_before_gate) or h (not yet gated, gate_before_norm), rs = r.
__device__ __forceinline__ float fwd_out(int32_t act, bool fast, bool nbg, float u, float z, float rs, float w,
                                         float b) {
  const float a = vact(act, fast, z);
  const float o = fmaf((nbg ? u : u * a) * rs, w, b);
  return nbg ? o * a : o;
}
// Backward, norm_before_gate, phase 1 of one element: dz, and the terms of dweight (dov xh), dbias (dov) and
// of the group sum (dn xh, dn = dov w).
__device__ __forceinline__ void bwd_nbg_terms(int32_t act, bool fast, float h, float z, float dy, float rr, float w,
                                              float b, float& dz, float& xh, float& dov) {
  float a, ag;
  vact_both(act, fast, z, a, ag);
  xh = h * rr;
  dov = dy * a;
  dz = dy * fmaf(xh, w, b) * ag;
}
// Backward, gate_before_norm, phase 1: the normalised gated value uh (dweight term dy uh, group term dy w uh).
__device__ __forceinline__ float bwd_gbn_uh(int32_t act, bool fast, float h, float z, float rr) {
  return h * vact(act, fast, z) * rr;
}
// Backward phase 2, norm_before_gate: dx from dn and the group mean of dn xh.
__device__ __forceinline__ float bwd_nbg_dx(float h, float rr, float mean, float dn) {
  return rr * fmaf(-(h * rr), mean, dn);
}
// Backward phase 2, gate_before_norm: dz and dx.
__device__ __forceinline__ void bwd_gbn_dxdz(int32_t act, bool fast, float h, float z, float dy, float rr, float mean,
                                             float w, float& dx, float& dz) {
  float a, ag;
  vact_both(act, fast, z, a, ag);
  const float uh = h * a * rr;
  const float du = rr * fmaf(-uh, mean, dy * w);
  dz = du * h * ag;
  dx = du * a;
}

// dweight / dbias of a block of lane teams into its two partial rows (p.partial rows blockIdx.x and
// num_partials + blockIdx.x): the teams' per-thread sums go to colbuf (nteams x TPR NV kV floats of shared
// memory) and are added in team order (fixed), one thread per feature. Call from every thread of the block.
template <int TPR, int NV>
__device__ __forceinline__ void write_team_partials(const RmsNormGatedBwdParams& p, float* colbuf, int nteams,
                                                    const float (&dw)[NV][kV], const float (&db)[NV][kV]) {
  constexpr int kCols = TPR * NV * kV;  // features a team covers (>= D)
  const int t = threadIdx.x % TPR, team = threadIdx.x / TPR;
  float* out_w = p.partial + static_cast<int64_t>(blockIdx.x) * p.D;
  float* out_b = p.partial + (static_cast<int64_t>(p.num_partials) + blockIdx.x) * p.D;
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
    for (int c = threadIdx.x; c < p.D; c += blockDim.x) {
      float sum = 0.f;
      for (int q = 0; q < nteams; ++q) sum += colbuf[q * kCols + c];
      out[c] = sum;
    }
  }
}

// Group sums of a block-per-row team (TPR = blockDim.x = kBlock): the NV * kBlock chunk partials go to
// shared memory in feature order, warp w sums groups w, w + 8, ... (lane l adds chunks l, l + 32, ... of the
// group in order, then a fixed shuffle tree), and every thread reads its chunks' group totals. Fixed order:
// the same bits every run. red: kMaxChunks floats, gsum: kMaxChunks floats (D <= 8192).
constexpr int kMaxChunks = 4 * kBlock;
template <int NV>
__device__ __forceinline__ void block_group_totals(const float (&part)[NV], float (&tot)[NV], int nc, int gc,
                                                   const int (&gidx)[NV], float* red, float* gsum) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  __syncthreads();  // red / gsum may still be read from the previous row
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (t + k * kBlock < nc) red[t + k * kBlock] = part[k];
  __syncthreads();
  const int ng = nc / gc;
  for (int g = warp; g < ng; g += kBlock / 32) {
    float acc = 0.f;
    for (int j = lane; j < gc; j += 32) acc += red[g * gc + j];
    acc = cuda::group_sum<32>(acc);
    if (lane == 0) gsum[g] = acc;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < NV; ++k) tot[k] = gidx[k] >= 0 ? gsum[gidx[k]] : 0.f;
}

// ------------------------------------------------------------------------------------------------------
// Host side: path choice.

inline bool aligned16(const void* base, int32_t dtype, int64_t off) {
  return (reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(off) * dtype_size(dtype)) % 16 == 0;
}
// Every row start of `l` 16-byte aligned and unit column stride (or D <= 1).
inline bool rows_vec_ok(const void* base, int32_t dtype, const RowLayout& l) {
  if (!base) return true;
  if (l.col_stride != 1) return false;
  if (!aligned16(base, dtype, l.base)) return false;
  for (int i = 0; i < l.nd; ++i)
    if (l.sizes[i] > 1 && (l.strides[i] * static_cast<int64_t>(dtype_size(dtype))) % 16 != 0) return false;
  return true;
}
inline bool param_vec_ok(const void* base, int32_t dtype, const RowLayout& l) {
  return base && l.col_stride == 1 && aligned16(base, dtype, l.base) && dtype != STRATA_DTYPE_F64;
}

struct Config {
  int tpr = 0, nv = 0;  // tpr 0: looped
};

// Calls f(tpr, nv) (std::integral_constant values) for a lane-team Config of choose(): tpr 4 / 8 / 16 with one
// chunk per lane, 32 with 1 / 2 / 4 chunks per lane (every lane-team kernel is instantiated for these).
template <class F>
auto visit_team(const Config& c, F&& f) {
  using std::integral_constant;
  switch (c.tpr) {
    case 4: return f(integral_constant<int, 4>{}, integral_constant<int, 1>{});
    case 8: return f(integral_constant<int, 8>{}, integral_constant<int, 1>{});
    case 16: return f(integral_constant<int, 16>{}, integral_constant<int, 1>{});
    default:
      if (c.nv == 1) return f(integral_constant<int, 32>{}, integral_constant<int, 1>{});
      if (c.nv == 2) return f(integral_constant<int, 32>{}, integral_constant<int, 2>{});
      return f(integral_constant<int, 32>{}, integral_constant<int, 4>{});
  }
}

inline int pow2ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The vector path for D, G (given vector-capable layouts), or looped.
inline Config choose(int64_t D, int64_t G, bool layouts_ok) {
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

inline bool fwd_layouts_ok(const RmsNormGatedFwdParams& p) {
  return rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.z, p.x_dtype, p.z_rows) &&
         rows_vec_ok(p.y, p.x_dtype, p.y_rows) && rows_vec_ok(p.residual, p.res_dtype, p.res_rows) &&
         rows_vec_ok(p.residual_out, p.res_out_dtype, p.res_out_rows);
}
inline bool bwd_layouts_ok(const RmsNormGatedBwdParams& p) {
  return rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.z, p.x_dtype, p.z_rows) &&
         rows_vec_ok(p.dy, p.x_dtype, p.dy_rows) && rows_vec_ok(p.dx, p.x_dtype, p.dx_rows) &&
         rows_vec_ok(p.dz, p.x_dtype, p.dz_rows) && rows_vec_ok(p.residual, p.res_dtype, p.res_rows) &&
         rows_vec_ok(p.dres_out, p.dres_out_dtype, p.dres_out_rows);
}

// Backward config from the problem only (the plan's workspace is sized before any pointer is known, so the
// pointer alignment cannot change the number of partial rows: the vector and looped paths use the same
// count, and `layouts_ok` only picks the kernel).
inline Config bwd_config(const RmsNormGatedBwdParams& p, bool layouts_ok) { return choose(p.D, p.group, layouts_ok); }

inline int64_t bwd_partials(const RmsNormGatedBwdParams& p) {
  if (p.rows == 0 || p.D == 0) return 0;
  // Enough blocks for many waves, few enough that the partial rows stay small next to the tensors.
  // At least 4 blocks per SM of an H200 (132 SMs): wide rows reduce through shared memory with block-wide
  // syncs, and 2 resident blocks per SM left the memory idle during them.
  const int64_t cap = std::clamp<int64_t>((int64_t{1} << 21) / p.D, 528, 4096);
  return std::min<int64_t>(p.rows, cap);
}

// Phase 1 of the lane-team backward for one live chunk of kV elements (bwd_stream_rows in cuda_sm90.cu, bwd_ring
// in cuda_sm90_ring.cu): adds the chunk's dweight / dbias terms to dw / db and returns its partial of the group
// sum of dn * (normalised value); norm_before_gate also gives dz (to store) and dn = dov w (kept for phase 2).
__device__ __forceinline__ float bwd_team_phase1(int32_t act, bool fast, bool nbg, const float (&h)[kV],
                                                 const float (&z)[kV], const float (&dy)[kV], float rr,
                                                 const float (&w)[kV], const float (&b)[kV], float (&dw)[kV],
                                                 float (&db)[kV], float (&dn)[kV], float (&dz)[kV]) {
  float part = 0.f;
  if (nbg) {
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      float xh, dov;
      bwd_nbg_terms(act, fast, h[e], z[e], dy[e], rr, w[e], b[e], dz[e], xh, dov);
      dw[e] = fmaf(dov, xh, dw[e]);
      db[e] += dov;
      dn[e] = dov * w[e];
      part = fmaf(dn[e], xh, part);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      const float uh = bwd_gbn_uh(act, fast, h[e], z[e], rr);
      dw[e] = fmaf(dy[e], uh, dw[e]);
      db[e] += dy[e];
      part = fmaf(dy[e] * w[e], uh, part);
    }
  }
  return part;
}

// One row of the lane-team forward, shared by fwd_team_packed (cuda_sm90.cu) and fwd_ring (cuda_sm90_ring.cu):
// lane t of a team of TPR lanes holds chunks ci = t + k TPR (k < NV) of the row's x and z, packed (zeros for a
// dead row and for chunks past D: they add nothing to the sums, as x = 0 gives u = 0 in both gate orders). The
// group sums run over the team with every lane of the warp (live or not); then a live row writes rstd at each
// group start and y = fwd_out(...) chunk by chunk through store(yo, col, o). offs() gives the row's y and rstd
// offsets {yo, so} (asked only for a live row). wh: the lane's weight chunk when hoisted (kHoistW: one chunk
// per lane), else the weight is loaded per chunk.
template <int TPR, int NV, bool kHoistW, class Offs, class Store>
__device__ __forceinline__ void team_fwd_row(const RmsNormGatedFwdParams& p, const VecFlags& vf, float inv_g,
                                             const uint4 (&xv)[NV], const uint4 (&zv)[NV], int t, bool live,
                                             const float (&wh)[kHoistW ? kV : 1], Offs&& offs, Store&& store) {
  const int32_t xdt = p.x_dtype;  // bf16 or f16 (host-checked)
  const bool nbg = p.norm_before_gate;
  const int nc = static_cast<int>(p.D / kV), gc = static_cast<int>(p.group / kV);
  float part[NV], tot[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    float u[kV];
    cuda::unpack8(xv[k], xdt, u);
    if (!nbg) {
      float z[kV];
      cuda::unpack8(zv[k], xdt, z);
#pragma unroll
      for (int e = 0; e < kV; ++e) u[e] *= vact(p.act, true, z[e]);
    }
    part[k] = 0.f;
#pragma unroll
    for (int e = 0; e < kV; ++e) part[k] = fmaf(u[e], u[e], part[k]);
  }
  group_totals<TPR, NV>(part, tot, p.group, p.D, t, nullptr);
  if (!live) return;
  const auto [yo, so] = offs();
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int ci = t + k * TPR;
    if (ci >= nc) continue;
    const int64_t col = static_cast<int64_t>(ci) * kV;
    const float rs = rsqrtf(tot[k] * inv_g + p.eps);
    if (ci % gc == 0)
      cuda::store_one(p.rstd, p.rstd_dtype, so + static_cast<int64_t>(ci / gc) * p.rstd_rows.col_stride, rs);
    float u[kV], z[kV], b[kV], o[kV], wl[kHoistW ? 1 : kV];
    cuda::unpack8(xv[k], xdt, u);
    cuda::unpack8(zv[k], xdt, z);
    if constexpr (!kHoistW) load_param(p.weight, p.w_dtype, p.w_row, col, vf.w, 1.f, wl);
    const float* w = kHoistW ? wh : wl;
    load_param(p.bias, p.b_dtype, p.b_row, col, vf.b, 0.f, b);
#pragma unroll
    for (int e = 0; e < kV; ++e) o[e] = fwd_out(p.act, true, nbg, u[e], z[e], rs, w[e], b[e]);
    store(yo, col, o);
  }
}

}  // namespace strata::norm::rng_cuda
