// CUDA kernels of clipped_swiglu (clipped_swiglu.h). Memory-bound and element-wise; arithmetic in f32.
//
// Forward, `pairs_vec`: one thread per chunk of 8 outputs (I % 8 == 0, 16-byte aligned rows): it reads the
// pairs with 16-byte loads (interleaved: 16 consecutive elements; split: 8 gates at i and 8 linear values at
// I + i) and writes 8 outputs with one 16-byte store (bf16/f16; two for f32).
// Chunks are numbered over (row, chunk) flat, so rows of any width fill the grid; 32-bit index math when the
// grid allows. 16-bit x uses the hardware exp / approximate divide for the sigmoid. `pairs_scalar`: one thread
// per output, any layout.
// Backward, `rows_block`: a block per row (grid-stride over rows), threads stride the row's chunks of 8 pairs
// (vector or element-wise accesses); dprobs = sum y0 dy is a fixed-order block sum: the same bits every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/activation/clipped_swiglu/clipped_swiglu.h"
#include "runtime/error.h"
#include "tile/cuda/bulk_copy.cuh"
#include "tile/cuda/check.cuh"
#include "tile/cuda/fast_math.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::activation {
namespace {

using cuda::load_one;
using cuda::load_vec;
using cuda::store_one;
using cuda::store_vec;

constexpr int kV = 8;
constexpr int kBlock = 256;

// The 8 pairs starting at pair i of the row at xo: vector (aligned, unit stride) or element-wise.
__device__ __forceinline__ void load_pairs(const void* x, int32_t dt, int64_t xo, int64_t xc, int64_t I, int64_t i,
                                           bool interleaved, bool vec, float (&A)[kV], float (&B)[kV]) {
  if (vec) {
    if (interleaved) {
      float v[2 * kV];
      load_vec<2 * kV>(x, dt, xo + 2 * i, v);
#pragma unroll
      for (int e = 0; e < kV; ++e) A[e] = v[2 * e], B[e] = v[2 * e + 1];
    } else {
      load_vec<kV>(x, dt, xo + i, A);
      load_vec<kV>(x, dt, xo + I + i, B);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) {
    A[e] = i + e < I ? load_one(x, dt, xo + csw_gate_col(interleaved, I, i + e) * xc) : 0.f;
    B[e] = i + e < I ? load_one(x, dt, xo + csw_lin_col(interleaved, I, i + e) * xc) : 0.f;
  }
}

// Per-pair math on the vector paths. 16-bit x uses the approximate exp and reciprocal for the sigmoid (a few
// f32 ulps, far below one bf16/f16 rounding): sigmoid(alpha a) = rcp(1 + ex2(a * (-alpha log2 e))), where the
// factor in parentheses is loop-invariant (hoisted), so 4 instructions (FMUL, MUFU.EX2, FADD, MUFU.RCP) in the
// ftz forms against ~10 for __expf / __fdividef with their denormal handling. f32 keeps the precise csw_fwd /
// csw_bwd of the header.
constexpr float kNegLog2e = -1.4426950408889634f;
__device__ __forceinline__ float vsig_fast(float a, float alpha) {
  return cuda::rcp_ftz(1.f + cuda::ex2_ftz(a * (alpha * kNegLog2e)));
}
// The clamps of csw_fwd as NaN-propagating min / max (one instruction each instead of a compare and a select;
// the same values, NaN inputs included).
__device__ __forceinline__ float vfwd(bool fast, float A, float B, float alpha, float limit, float bias) {
  if (!fast) return csw_fwd<float>(A, B, alpha, limit, bias);
  const float a = cuda::fmin_nan(A, limit);
  const float b = cuda::fmin_nan(cuda::fmax_nan(B, -limit), limit);
  return a * vsig_fast(a, alpha) * (b + bias);
}
__device__ __forceinline__ float vbwd(bool fast, float A, float B, float g, float alpha, float limit, float bias,
                                      float* dA, float* dB) {
  if (!fast) return csw_bwd<float>(A, B, g, alpha, limit, bias, dA, dB);
  const float a = cuda::fmin_nan(A, limit);
  const float b = cuda::fmin_nan(cuda::fmax_nan(B, -limit), limit);
  const float s = vsig_fast(a, alpha);
  *dA = A <= limit ? g * (b + bias) * s * (1.f + alpha * a * (1.f - s)) : 0.f;
  *dB = (B >= -limit && B <= limit) ? g * a * s : 0.f;
  return a * s * (b + bias);
}

// (row, chunk) of flat chunk index tid: 32-bit division when the grid allows it (the 64-bit division is a
// ~70-instruction subroutine, a visible share of a kernel that moves 48 bytes per thread).
template <bool Narrow>
__device__ __forceinline__ void split_index(int64_t tid, int64_t cpr, int64_t& row, int64_t& chunk) {
  if constexpr (Narrow) {
    const uint32_t r = static_cast<uint32_t>(tid) / static_cast<uint32_t>(cpr);
    row = r;
    chunk = static_cast<uint32_t>(tid) - r * static_cast<uint32_t>(cpr);
  } else {
    row = tid / cpr;
    chunk = tid - row * cpr;
  }
}

// Thread tid takes flat chunks kCpt * tid + j (j < kCpt; consecutive, possibly across a row end), all their
// loads issued before any math. kCpt = 1: with 2 (lanes 64 bytes apart per load, 70 registers) the H200 ran
// the forward 14 % slower than one chunk per thread (2544 vs 2965 GB/s, session 3 run 1).
constexpr int kCpt = 1;
template <bool Narrow>
__global__ void __launch_bounds__(kBlock) fwd_pairs_vec(const ClippedSwigluFwdParams p) {
  const int64_t cpr = p.I / kV;  // chunks per row
  const int64_t total = p.rows * cpr;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) * kCpt;
  if (first >= total) return;
  const bool fast = p.x_dtype != STRATA_DTYPE_F32;
  float A[kCpt][kV], B[kCpt][kV];
  int64_t row[kCpt], col[kCpt];
#pragma unroll
  for (int j = 0; j < kCpt; ++j) {
    row[j] = -1;
    if (first + j >= total) continue;
    int64_t ch;
    split_index<Narrow>(first + j, cpr, row[j], ch);
    col[j] = ch * kV;
    load_pairs(p.x, p.x_dtype, p.x_rows.row_offset(row[j]), 1, p.I, col[j], p.interleaved, true, A[j], B[j]);
  }
#pragma unroll
  for (int j = 0; j < kCpt; ++j) {
    if (row[j] < 0) continue;
    const float pr = p.probs ? load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(row[j])) : 1.f;
    float y[kV];
#pragma unroll
    for (int e = 0; e < kV; ++e) y[e] = vfwd(fast, A[j][e], B[j][e], p.alpha, p.limit, p.bias) * pr;
    store_vec<kV>(p.y, p.x_dtype, p.y_rows.row_offset(row[j]) + col[j], y);
  }
}

// Streaming forward of dense interleaved rows (x rows exactly 2I apart, y rows I apart, unit column strides,
// I % 8 == 0, aligned bases: the GPT-OSS expert activation). x and y are then flat arrays, so a 16-byte
// vector v of x (8 bf16/f16 or 4 f32 elements: 4 or 2 pairs) gives the outputs at 4v (2v): no row / chunk
// split at all (the chunk kernel spent a division and lanes 32 bytes apart per load; it ran at 1.33 x floor,
// s3run2). Consecutive lanes take consecutive vectors (512 contiguous bytes per warp load, 256 per store);
// each thread keeps kStreamU vectors in flight and issues the loads of its next tile before computing the
// current one; a one-wave persistent grid walks the tiles. probs: row = v / (vectors per row), 32-bit.
constexpr int kStreamU = 4;  // vectors per thread per tile (a tile: kStreamU * kBlock vectors)

// The outputs of 16-byte vector v of x (held in u) into y: 4 (16-bit x) or 2 (f32) pairs -> 8 bytes of y.
template <bool F32, bool PROBS>
__device__ __forceinline__ void stream_vec_out(const ClippedSwigluFwdParams& p, const uint4& u, int64_t v, uint32_t vpr,
                                               int32_t dt, char* y) {
  float pr = 1.f;
  if constexpr (PROBS) pr = load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(static_cast<uint32_t>(v) / vpr));
  if constexpr (F32) {
    const float o0 = vfwd(false, __uint_as_float(u.x), __uint_as_float(u.y), p.alpha, p.limit, p.bias) * pr;
    const float o1 = vfwd(false, __uint_as_float(u.z), __uint_as_float(u.w), p.alpha, p.limit, p.bias) * pr;
    *reinterpret_cast<float2*>(y + v * 8) = make_float2(o0, o1);
  } else {
    float f[8], o[4];
    cuda::unpack8(u, dt, f);
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = vfwd(true, f[2 * e], f[2 * e + 1], p.alpha, p.limit, p.bias) * pr;
    *reinterpret_cast<uint2*>(y + v * 8) = make_uint2(cuda::pack_half2(dt, o[0], o[1]), cuda::pack_half2(dt, o[2], o[3]));
  }
}

// Session 12 (ClippedSwigluStreamTile): HINTS = ld_stream's hinted loads (the form since session 4) or plain
// ld.global.v4; U vectors per thread per tile; PERSIST = the one-wave grid above, else a grid that covers the tiles
// once (one tile per block, torch's element-wise shape) with no next-tile buffer.
template <bool F32, bool PROBS, bool HINTS = true, int U = kStreamU, bool PERSIST = true>
__global__ void __launch_bounds__(kBlock) fwd_interleaved_stream(const ClippedSwigluFwdParams p, int64_t nvec,
                                                                 uint32_t vpr) {
  const int32_t dt = F32 ? STRATA_DTYPE_F32 : (p.x_dtype == STRATA_DTYPE_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16);
  const char* x = static_cast<const char*>(p.x) + p.x_rows.base * (F32 ? 4 : 2);
  char* y = static_cast<char*>(p.y) + p.y_rows.base * (F32 ? 4 : 2);
  const int64_t tile = static_cast<int64_t>(U) * kBlock;
  const int64_t ntiles = (nvec + tile - 1) / tile;
  int64_t it = blockIdx.x;
  if (it >= ntiles) return;
  uint4 cur[U], nxt[PERSIST ? U : 1];
  auto load = [&](int64_t ti, auto& buf) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = ti * tile + u * kBlock + threadIdx.x;
      if (v < nvec) buf[u] = cuda::ld_vec16(x + v * 16, HINTS);
    }
  };
  auto out = [&](int64_t ti) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = ti * tile + u * kBlock + threadIdx.x;
      if (v < nvec) stream_vec_out<F32, PROBS>(p, cur[u], v, vpr, dt, y);
    }
  };
  load(it, cur);
  if constexpr (!PERSIST) {
    out(it);
  } else {
    for (;;) {
      const int64_t nit = it + gridDim.x;
      const bool more = nit < ntiles;
      if (more) load(nit, nxt);
      out(it);
      if (!more) break;
#pragma unroll
      for (int u = 0; u < U; ++u) cur[u] = nxt[u];
      it = nit;
    }
  }
}

// Bulk-copy ring forward (implementation cuda.sm90.bulk_ring): equally spaced rows (x rows of 2I, y rows of
// I elements, unit column strides, 16-byte aligned row starts, I % 8 == 0), either layout. The flat streaming
// kernel above keeps kStreamU x 16 bytes per thread in flight and ran the GPT-OSS shape at 1.23 x floor
// (s6run1); here a persistent CTA (two per SM) owns a ring of `stages` shared-memory tiles of `tr` whole x
// rows, filled by thread 0 with cp.async.bulk copies (one per tile for dense rows, else one per row) that
// complete on the stage's mbarrier (the k-th wait on a stage uses parity (k / stages) & 1), and refilled as
// soon as the CTA's __syncthreads says every thread has read it: ~96 KiB per CTA in flight, no registers
// held by loads. Threads take chunks of 8 outputs, flat over (tile row, chunk), read their pairs from shared
// memory (interleaved: 16 consecutive elements; split: 8 gates and the 8 linear values I later) and write
// one 16-byte store (two for f32) with the streaming hint.
constexpr int kRingMaxStages = 8;
constexpr size_t kRingBudget = 96 * 1024;     // ring bytes per CTA
constexpr size_t kRingTileTarget = 24 * 1024;  // bytes of x per tile (whole rows, at least one)
constexpr int64_t kRingMaxRowBytes = 48 * 1024;  // two stages of one row fit the budget
constexpr size_t kRingSmemCap = 100 * 1024;      // the kernels' shared-memory opt-in (>= stages x stage)

struct RingGeom {
  int64_t ntiles = 0;
  int tr = 0, stages = 0;
  uint32_t rb = 0;  // bytes of one x row (2I elements)
  bool dense = false;
};

__device__ __forceinline__ int64_t ring_row_off(const RowLayout& l, int64_t r) { return l.base + r * l.strides[0]; }

// 8 outputs of chunk c of a row staged at `row` (shared memory) as floats in a[], b[] (gates, linear values).
template <bool F32, bool INTER>
__device__ __forceinline__ void ring_pairs(const unsigned char* row, uint32_t I, uint32_t c, int32_t dt, float (&A)[kV],
                                           float (&B)[kV]) {
  constexpr uint32_t es = F32 ? 4 : 2;
  if constexpr (INTER) {
    float v[2 * kV];
    const unsigned char* src = row + c * (2 * kV * es);
    if constexpr (F32) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 u = cuda::lds16(src + 16 * q);
        v[4 * q] = __uint_as_float(u.x), v[4 * q + 1] = __uint_as_float(u.y);
        v[4 * q + 2] = __uint_as_float(u.z), v[4 * q + 3] = __uint_as_float(u.w);
      }
    } else {
      float lo[8], hi[8];
      cuda::unpack8(cuda::lds16(src), dt, lo);
      cuda::unpack8(cuda::lds16(src + 16), dt, hi);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = lo[e], v[8 + e] = hi[e];
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) A[e] = v[2 * e], B[e] = v[2 * e + 1];
  } else {
    const unsigned char* ga = row + c * (kV * es);
    const unsigned char* lb = ga + I * es;
    if constexpr (F32) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint4 u = cuda::lds16(ga + 16 * q), w = cuda::lds16(lb + 16 * q);
        A[4 * q] = __uint_as_float(u.x), A[4 * q + 1] = __uint_as_float(u.y);
        A[4 * q + 2] = __uint_as_float(u.z), A[4 * q + 3] = __uint_as_float(u.w);
        B[4 * q] = __uint_as_float(w.x), B[4 * q + 1] = __uint_as_float(w.y);
        B[4 * q + 2] = __uint_as_float(w.z), B[4 * q + 3] = __uint_as_float(w.w);
      }
    } else {
      cuda::unpack8(cuda::lds16(ga), dt, A);
      cuda::unpack8(cuda::lds16(lb), dt, B);
    }
  }
}

// DT: x's dtype as a template value (a run-time one made every unpack and pack a branch per 32-bit word).
// (Session 8's barrier-free variant, where the last thread out of a stage refilled it, ran at the same time as
// this kernel in s8run2's ncu, 147.0 against 147.4 us: the block barrier per stage is not what holds the ring;
// removed in session 9.)
template <int32_t DT, bool INTER, bool PROBS>
__global__ void __launch_bounds__(kBlock, 1) fwd_ring(const ClippedSwigluFwdParams p, const RingGeom g) {
  constexpr bool F32 = DT == STRATA_DTYPE_F32;
  constexpr uint32_t es = F32 ? 4 : 2;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[kRingMaxStages];
  constexpr int32_t dt = DT;
  const uint32_t I = static_cast<uint32_t>(p.I), cpr = I / kV;  // chunks of 8 outputs per row
  // Thread t takes the tile's chunks t, t + kBlock, ... (flat over (tile row, chunk)); their (row, chunk) are
  // stepped by (kBlock / cpr, kBlock % cpr) with one carry instead of a division per chunk.
  const uint32_t row0 = threadIdx.x / cpr, c0 = threadIdx.x - row0 * cpr;
  const uint32_t dr = kBlock / cpr, dc = kBlock - dr * cpr;
  const uint32_t stage_bytes = static_cast<uint32_t>(g.tr) * g.rb;
  const int64_t my_n = g.ntiles > blockIdx.x ? (g.ntiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const char* xb = static_cast<const char*>(p.x);
  char* yb = static_cast<char*>(p.y);
  if (threadIdx.x == 0)
    for (int s = 0; s < g.stages; ++s) cuda::mbar_init(&full[s], 1);
  __syncthreads();
  auto rows_of_tile = [&](int64_t r0) { return p.rows - r0 < g.tr ? static_cast<int>(p.rows - r0) : g.tr; };
  auto issue = [&](int64_t k) {  // thread 0
    const int s = static_cast<int>(k % g.stages);
    const int64_t r0 = (blockIdx.x + k * gridDim.x) * g.tr;
    const int n = rows_of_tile(r0);
    unsigned char* dst = ring + static_cast<size_t>(s) * stage_bytes;
    cuda::fence_proxy_async();
    cuda::mbar_arrive_expect_tx(&full[s], static_cast<uint32_t>(n) * g.rb);
    if (g.dense) {
      cuda::bulk_g2s(dst, xb + ring_row_off(p.x_rows, r0) * es, static_cast<uint32_t>(n) * g.rb, &full[s]);
    } else {
      for (int i = 0; i < n; ++i) cuda::bulk_g2s(dst + i * g.rb, xb + ring_row_off(p.x_rows, r0 + i) * es, g.rb, &full[s]);
    }
  };
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < my_n && k < g.stages; ++k) issue(k);
  for (int64_t k = 0; k < my_n; ++k) {
    const int s = static_cast<int>(k % g.stages);
    const int64_t r0 = (blockIdx.x + k * gridDim.x) * g.tr;
    const uint32_t nch = static_cast<uint32_t>(rows_of_tile(r0)) * cpr;
    cuda::mbar_wait(&full[s], static_cast<uint32_t>((k / g.stages) & 1));
    const unsigned char* st = ring + static_cast<size_t>(s) * stage_bytes;
    uint32_t rr = row0, c = c0;
    for (uint32_t j = threadIdx.x; j < nch; j += kBlock) {
      const int64_t row = r0 + rr;
      float A[kV], B[kV], o[kV];
      ring_pairs<F32, INTER>(st + rr * g.rb, I, c, dt, A, B);
#pragma unroll
      for (int e = 0; e < kV; ++e) o[e] = vfwd(!F32, A[e], B[e], p.alpha, p.limit, p.bias);
      if constexpr (PROBS) {
        const float pr = load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(row));
#pragma unroll
        for (int e = 0; e < kV; ++e) o[e] *= pr;
      }
      char* dst = yb + (ring_row_off(p.y_rows, row) + static_cast<int64_t>(c) * kV) * es;
      if constexpr (F32) {
        cuda::st_stream16(dst, make_uint4(__float_as_uint(o[0]), __float_as_uint(o[1]), __float_as_uint(o[2]),
                                          __float_as_uint(o[3])));
        cuda::st_stream16(dst + 16, make_uint4(__float_as_uint(o[4]), __float_as_uint(o[5]), __float_as_uint(o[6]),
                                               __float_as_uint(o[7])));
      } else {
        cuda::st_stream16(dst, make_uint4(cuda::pack_half2(dt, o[0], o[1]), cuda::pack_half2(dt, o[2], o[3]),
                                          cuda::pack_half2(dt, o[4], o[5]), cuda::pack_half2(dt, o[6], o[7])));
      }
      c += dc, rr += dr;
      if (c >= cpr) c -= cpr, ++rr;
    }
    __syncthreads();  // every thread is done reading stage s
    if (threadIdx.x == 0 && k + g.stages < my_n) issue(k + g.stages);
  }
}

__global__ void __launch_bounds__(kBlock) fwd_pairs_scalar(const ClippedSwigluFwdParams p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (tid >= p.rows * p.I) return;
  const int64_t row = tid / p.I, i = tid - row * p.I;
  const int64_t xo = p.x_rows.row_offset(row), xc = p.x_rows.col_stride;
  const float A = load_one(p.x, p.x_dtype, xo + csw_gate_col(p.interleaved, p.I, i) * xc);
  const float B = load_one(p.x, p.x_dtype, xo + csw_lin_col(p.interleaved, p.I, i) * xc);
  const float pr = p.probs ? load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(row)) : 1.f;
  store_one(p.y, p.x_dtype, p.y_rows.row_offset(row) + i * p.y_rows.col_stride,
            csw_fwd<float>(A, B, p.alpha, p.limit, p.bias) * pr);
}

// Backward: a block per row (grid-stride over rows); thread t takes chunks t, t + blockDim.x, ... (blockDim.x
// from the host: the fewest 32-multiples that cover the row in as few rounds as kBlock would, so no round
// runs half-empty). One chunk per round: loading two before computing either took 76 registers and ran
// 10 % slower on the H200 (session 3 run 1).
__device__ __forceinline__ void bwd_chunk(const ClippedSwigluBwdParams& p, bool fast, bool vec, int64_t dxo,
                                          int64_t i, const float (&A)[kV],
                                          const float (&B)[kV], const float (&g)[kV], float pr, float& dp) {
  float dA[kV], dB[kV];
#pragma unroll
  for (int e = 0; e < kV; ++e) {
    const float y0 = vbwd(fast, A[e], B[e], g[e] * pr, p.alpha, p.limit, p.bias, &dA[e], &dB[e]);
    if (vec || i + e < p.I) dp = fmaf(y0, g[e], dp);
  }
  if (vec) {
    if (p.interleaved) {
      float v[2 * kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) v[2 * e] = dA[e], v[2 * e + 1] = dB[e];
      store_vec<2 * kV>(p.dx, p.x_dtype, dxo + 2 * i, v);
    } else {
      store_vec<kV>(p.dx, p.x_dtype, dxo + i, dA);
      store_vec<kV>(p.dx, p.x_dtype, dxo + p.I + i, dB);
    }
  } else {
    const int64_t dc = p.dx_rows.col_stride;
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      if (i + e >= p.I) break;
      store_one(p.dx, p.x_dtype, dxo + csw_gate_col(p.interleaved, p.I, i + e) * dc, dA[e]);
      store_one(p.dx, p.x_dtype, dxo + csw_lin_col(p.interleaved, p.I, i + e) * dc, dB[e]);
    }
  }
}

__global__ void __launch_bounds__(kBlock) bwd_rows_block(const ClippedSwigluBwdParams p, bool vec) {
  __shared__ float scratch[32];
  const int64_t nch = (p.I + kV - 1) / kV;
  const bool fast = vec && p.x_dtype != STRATA_DTYPE_F32;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t xo = p.x_rows.row_offset(row), go = p.dy_rows.row_offset(row), dxo = p.dx_rows.row_offset(row);
    const int64_t xc = p.x_rows.col_stride, gc = p.dy_rows.col_stride;
    const float pr = p.probs ? load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(row)) : 1.f;
    float dp = 0.f;
    for (int64_t ch = threadIdx.x; ch < nch; ch += blockDim.x) {
      const int64_t i = ch * kV;
      float A[kV], B[kV], g[kV];
      load_pairs(p.x, p.x_dtype, xo, xc, p.I, i, p.interleaved, vec, A, B);
      if (vec) {
        load_vec<kV>(p.dy, p.x_dtype, go + i, g);
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) g[e] = i + e < p.I ? load_one(p.dy, p.x_dtype, go + (i + e) * gc) : 0.f;
      }
      bwd_chunk(p, fast, vec, dxo, i, A, B, g, pr, dp);
    }
    if (p.dprobs) {
      dp = cuda::block_sum(dp, scratch);
      if (threadIdx.x == 0) store_one(p.dprobs, p.dprobs_dtype, p.dprobs_rows.row_offset(row), dp);
    }
  }
}

bool aligned16(const void* base, int32_t dtype, int64_t off) {
  return (reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(off) * dtype_size(dtype)) % 16 == 0;
}
bool rows_vec_ok(const void* base, int32_t dtype, const RowLayout& l) {
  if (l.col_stride != 1 || !aligned16(base, dtype, l.base)) return false;
  for (int i = 0; i < l.nd; ++i)
    if (l.sizes[i] > 1 && (l.strides[i] * static_cast<int64_t>(dtype_size(dtype))) % 16 != 0) return false;
  return true;
}

// Rows exactly `width` elements apart (or a single row), unit column stride.
bool dense_rows(const RowLayout& l, int64_t width) {
  return l.col_stride == 1 && (l.nd == 0 || (l.nd == 1 && (l.sizes[0] <= 1 || l.strides[0] == width)));
}

template <bool F32, bool PROBS, bool HINTS, int U, bool PERSIST>
strata_status launch_fwd_stream_inst(const ClippedSwigluFwdParams& p, int64_t nvec, uint32_t vpr, cudaStream_t s) {
  const auto kernel = fwd_interleaved_stream<F32, PROBS, HINTS, U, PERSIST>;
  const int64_t tile = static_cast<int64_t>(U) * kBlock;
  const int64_t need = (nvec + tile - 1) / tile;
  int64_t grid = need;
  if constexpr (PERSIST) {
    static const int occ = cuda::occupancy_blocks_per_sm(kernel, kBlock);
    const int64_t slots = static_cast<int64_t>(cuda::current_sm_count()) * occ;
    const int64_t iters = (need + slots - 1) / slots;
    grid = (need + iters - 1) / iters;  // every block walks `iters` tiles (the last ones fewer)
  } else if (need > 0x7fffffffLL) {
    return fail(STRATA_ERROR_UNSUPPORTED, "clipped_swiglu_fwd: {} tiles exceed one CUDA grid", need);
  }
  kernel<<<static_cast<unsigned>(grid), kBlock, 0, s>>>(p, nvec, vpr);
  return cuda::check_launch("clipped_swiglu fwd_interleaved_stream");
}

template <bool F32, bool PROBS, bool HINTS>
strata_status launch_fwd_stream_u(const ClippedSwigluFwdParams& p, int64_t nvec, uint32_t vpr, ClippedSwigluStreamTile t,
                                  cudaStream_t s) {
  if (t.persistent) return launch_fwd_stream_inst<F32, PROBS, HINTS, kStreamU, true>(p, nvec, vpr, s);
  if (t.vectors == 8) return launch_fwd_stream_inst<F32, PROBS, HINTS, 8, false>(p, nvec, vpr, s);
  return launch_fwd_stream_inst<F32, PROBS, HINTS, kStreamU, false>(p, nvec, vpr, s);
}

template <bool F32, bool PROBS>
strata_status launch_fwd_stream(const ClippedSwigluFwdParams& p, int64_t nvec, uint32_t vpr, ClippedSwigluStreamTile t,
                                cudaStream_t s) {
  return t.l2_hint_loads ? launch_fwd_stream_u<F32, PROBS, true>(p, nvec, vpr, t, s)
                         : launch_fwd_stream_u<F32, PROBS, false>(p, nvec, vpr, t, s);
}

// Plan-time part of the ring's conditions ("" if it applies).
std::string ring_reject(const ClippedSwigluFwdParams& p) {
  if (p.x_dtype != STRATA_DTYPE_F32 && p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16)
    return "handles f32/bf16/f16 x only";
  if (p.I % kV != 0) return "needs I % 8 == 0";
  if (!p.x_rows.uniform() || !p.y_rows.uniform() || p.x_rows.col_stride != 1 || p.y_rows.col_stride != 1)
    return "needs equally spaced x and y rows with unit column strides";
  if (2 * p.I * static_cast<int64_t>(dtype_size(p.x_dtype)) > kRingMaxRowBytes)
    return "needs x rows of at most 48 KiB";
  return {};
}

template <int32_t DT, bool INTER, bool PROBS>
strata_status launch_fwd_ring(const ClippedSwigluFwdParams& p, cudaStream_t s) {
  constexpr bool F32 = DT == STRATA_DTYPE_F32;
  RingGeom g;
  g.rb = static_cast<uint32_t>(2 * p.I * (F32 ? 4 : 2));
  g.tr = static_cast<int>(std::max<size_t>(1, kRingTileTarget / g.rb));
  g.ntiles = (p.rows + g.tr - 1) / g.tr;
  const size_t stage = static_cast<size_t>(g.tr) * g.rb;
  g.stages = static_cast<int>(std::clamp<size_t>(kRingBudget / stage, 2, kRingMaxStages));
  g.dense = p.x_rows.nd == 0 || p.x_rows.sizes[0] <= 1 || p.x_rows.strides[0] == 2 * p.I;
  const size_t smem = stage * g.stages;
  const auto kernel = fwd_ring<DT, INTER, PROBS>;
  static cuda::RingLaunchCache cache;
  int occ = 1;
  STRATA_RETURN_IF_ERROR(cuda::ring_occupancy(kernel, kBlock, smem, kRingSmemCap, cache, &occ));
  const int64_t slots = static_cast<int64_t>(cuda::current_sm_count()) * occ;
  const int64_t iters = (g.ntiles + slots - 1) / slots;
  const int64_t grid = std::max<int64_t>(1, (g.ntiles + iters - 1) / iters);  // balanced, one wave
  kernel<<<static_cast<unsigned>(grid), kBlock, smem, s>>>(p, g);
  return cuda::check_launch("clipped_swiglu fwd_ring");
}

template <int32_t DT>
strata_status launch_fwd_ring_dt(const ClippedSwigluFwdParams& p, cudaStream_t s) {
  if (p.probs) return p.interleaved ? launch_fwd_ring<DT, true, true>(p, s) : launch_fwd_ring<DT, false, true>(p, s);
  return p.interleaved ? launch_fwd_ring<DT, true, false>(p, s) : launch_fwd_ring<DT, false, false>(p, s);
}

// Tiled bulk-copy forward (cuda.sm90.tile_tma, session 9): the ring's per-chunk math in short-lived blocks, with
// both directions of the traffic on the copy engine (the scheme of the row norms' TMA forward, which met
// l2norm's 1.10 x target where persistent grids had lost; s8run2's ncu had every persistent kernel of this op
// streaming at 77-79 % of the DRAM peak). Block b owns rows [b tr, b tr + n): thread 0 bulk-loads their x rows
// (one copy for dense rows, else one per row) into shared memory, the threads compute chunks of 8 outputs flat
// over (tile row, chunk) into a shared y tile, and thread 0 bulk-stores it (one copy for dense y rows, else one
// per row). No registers hold loads in flight; the block scheduler refills each SM as blocks finish (GPT-OSS
// [32768, 2 x 2880] bf16: one 11.25 KiB row per block, 5.6 KiB of y, ~12 blocks per SM).
// Session 10: with tile flag 4 (the default since) each thread writes its 8 outputs straight from registers
// (16-byte stores) instead of into the y tile: no y tile (11.25 KiB of shared memory per block, 16 blocks per SM),
// no bulk store and no wait for the copy engine to read it before the block exits (s10run1: 0.1452 ms against
// 0.1479 at the GPT-OSS shape; x still arrives by the copy engine).
constexpr int64_t kTmaMaxSmem = 48 * 1024;       // no opt-in
constexpr int64_t kTmaMaxRowBytes = 30 * 1024;   // x row + y row (1.5 x) + header within kTmaMaxSmem
constexpr int kTmaMaxSparseRows = 32;            // rows per tile when x or y rows are not dense (a copy per row)

template <int32_t DT, bool INTER, bool PROBS>
__global__ void __launch_bounds__(kBlock) fwd_tile_tma(const ClippedSwigluFwdParams p, int tr, bool xdense,
                                                       bool ydense, int flags) {
#if __CUDA_ARCH__ >= 900
  constexpr bool F32 = DT == STRATA_DTYPE_F32;
  constexpr uint32_t es = F32 ? 4 : 2;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  const uint32_t I = static_cast<uint32_t>(p.I), cpr = I / kV;
  const uint32_t rb = 2 * I * es, yrb = I * es;  // bytes of an x row, a y row
  unsigned char* xt = smem + 16;
  unsigned char* yt = xt + static_cast<size_t>(tr) * rb;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * tr;
  const int n = static_cast<int>(min(static_cast<int64_t>(tr), p.rows - r0));
  const char* xb = static_cast<const char*>(p.x);
  char* yb = static_cast<char*>(p.y);
  if (threadIdx.x == 0) {
    cuda::mbar_init(bar, 1);
    cuda::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(n) * rb);
    const uint64_t pol = (flags & 2) ? cuda::l2_evict_first() : 0;
    auto load = [&](unsigned char* dst, const char* src, uint32_t bytes) {
      if (flags & 2) cuda::bulk_g2s_hint(dst, src, bytes, bar, pol);
      else cuda::bulk_g2s(dst, src, bytes, bar);
    };
    if (xdense) {
      load(xt, xb + ring_row_off(p.x_rows, r0) * es, static_cast<uint32_t>(n) * rb);
    } else {
      for (int i = 0; i < n; ++i) load(xt + i * rb, xb + ring_row_off(p.x_rows, r0 + i) * es, rb);
    }
  }
  // Thread t takes the tile's chunks t, t + blockDim.x, ... (flat over (tile row, chunk)), (row, chunk) stepped
  // by (blockDim.x / cpr, blockDim.x % cpr) with one carry.
  const uint32_t nthr = blockDim.x;
  const uint32_t row0 = threadIdx.x / cpr, c0 = threadIdx.x - row0 * cpr;
  const uint32_t dr = nthr / cpr, dc = nthr - dr * cpr;
  const uint32_t nch = static_cast<uint32_t>(n) * cpr;
  __syncthreads();  // the barrier is initialised before anyone waits on it
  cuda::mbar_wait(bar, 0);
  uint32_t rr = row0, c = c0;
  for (uint32_t j = threadIdx.x; j < nch; j += nthr) {
    float A[kV], B[kV], o[kV];
    ring_pairs<F32, INTER>(xt + rr * rb, I, c, DT, A, B);
#pragma unroll
    for (int e = 0; e < kV; ++e) o[e] = vfwd(!F32, A[e], B[e], p.alpha, p.limit, p.bias);
    if constexpr (PROBS) {
      const float pr = load_one(p.probs, p.probs_dtype, p.probs_rows.row_offset(r0 + rr));
#pragma unroll
      for (int e = 0; e < kV; ++e) o[e] *= pr;
    }
    // flags & 4: straight to global memory from registers (no y tile); else into the y tile.
    unsigned char* dst = (flags & 4) ? reinterpret_cast<unsigned char*>(yb + (ring_row_off(p.y_rows, r0 + rr) + c * kV) * es)
                                     : yt + rr * yrb + c * (kV * es);
    if constexpr (F32) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(__float_as_uint(o[0]), __float_as_uint(o[1]), __float_as_uint(o[2]),
                                                  __float_as_uint(o[3]));
      *reinterpret_cast<uint4*>(dst + 16) = make_uint4(__float_as_uint(o[4]), __float_as_uint(o[5]),
                                                       __float_as_uint(o[6]), __float_as_uint(o[7]));
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(cuda::pack_half2(DT, o[0], o[1]), cuda::pack_half2(DT, o[2], o[3]),
                                                  cuda::pack_half2(DT, o[4], o[5]), cuda::pack_half2(DT, o[6], o[7]));
    }
    c += dc, rr += dr;
    if (c >= cpr) c -= cpr, ++rr;
  }
  if (flags & 4) return;       // y went out from registers: no tile to store
  cuda::fence_proxy_async();  // this thread's writes of the y tile before the copy engine reads it
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t pol = (flags & 1) ? cuda::l2_evict_first() : 0;
    auto store = [&](char* dst, const unsigned char* src, uint32_t bytes) {
      if (flags & 1) cuda::bulk_s2g_hint(dst, src, bytes, pol);
      else cuda::bulk_s2g(dst, src, bytes);
    };
    if (ydense) {
      store(yb + ring_row_off(p.y_rows, r0) * es, yt, static_cast<uint32_t>(n) * yrb);
    } else {
      for (int i = 0; i < n; ++i) store(yb + ring_row_off(p.y_rows, r0 + i) * es, yt + i * yrb, yrb);
    }
    cuda::bulk_commit();
    cuda::bulk_wait_read();  // the stores have read the tile before the block's shared memory is freed
  }
#else
  __trap();  // sm_90 only (the plan requires it)
#endif
}

template <int32_t DT, bool INTER, bool PROBS>
strata_status launch_fwd_tma(const ClippedSwigluFwdParams& p, ClippedSwigluTmaTile tile, cudaStream_t s) {
  constexpr int64_t es = DT == STRATA_DTYPE_F32 ? 4 : 2;
  const int64_t rb = 2 * p.I * es, yrb = p.I * es;
  const bool xdense = p.x_rows.nd == 0 || p.x_rows.sizes[0] <= 1 || p.x_rows.strides[0] == 2 * p.I;
  const bool ydense = p.y_rows.nd == 0 || p.y_rows.sizes[0] <= 1 || p.y_rows.strides[0] == p.I;
  const int64_t ytile = (tile.flags & 4) ? 0 : yrb;  // flags & 4: no y tile
  int64_t tr = std::max<int64_t>(1, tile.x_bytes / rb);
  tr = std::min<int64_t>(tr, (kTmaMaxSmem - 16) / (rb + ytile));  // >= 1: kTmaMaxRowBytes
  if (!xdense || !ydense) tr = std::min<int64_t>(tr, kTmaMaxSparseRows);
  tr = std::min<int64_t>(tr, p.rows);
  const int64_t blocks = (p.rows + tr - 1) / tr;
  if (blocks > 0x7fffffffLL) return fail(STRATA_ERROR_UNSUPPORTED, "clipped_swiglu_fwd: {} tiles exceed one CUDA grid", blocks);
  // Threads: whole warps, at most kBlock, as few as keep the rounds over the tile's chunks balanced.
  const int64_t nch = tr * (p.I / kV), cap = std::min<int64_t>(tile.threads, kBlock);
  const int64_t rounds = (nch + cap - 1) / cap;
  const int threads = static_cast<int>(((nch + rounds - 1) / rounds + 31) / 32 * 32);
  const size_t smem = static_cast<size_t>(16 + tr * (rb + ytile));
  fwd_tile_tma<DT, INTER, PROBS><<<static_cast<unsigned>(blocks), threads, smem, s>>>(p, static_cast<int>(tr), xdense,
                                                                                     ydense, tile.flags);
  return cuda::check_launch("clipped_swiglu fwd_tile_tma");
}

template <int32_t DT>
strata_status launch_fwd_tma_dt(const ClippedSwigluFwdParams& p, ClippedSwigluTmaTile tile, cudaStream_t s) {
  if (p.probs)
    return p.interleaved ? launch_fwd_tma<DT, true, true>(p, tile, s) : launch_fwd_tma<DT, false, true>(p, tile, s);
  return p.interleaved ? launch_fwd_tma<DT, true, false>(p, tile, s) : launch_fwd_tma<DT, false, false>(p, tile, s);
}
}  // namespace

int clipped_swiglu_fwd_cuda(const ClippedSwigluFwdParams& p, void* stream) {
  return clipped_swiglu_fwd_cuda_stream(p, stream, ClippedSwigluStreamTile{});
}

int clipped_swiglu_fwd_cuda_stream(const ClippedSwigluFwdParams& p, void* stream, ClippedSwigluStreamTile t) {
  if (p.rows == 0 || p.I == 0) return STRATA_SUCCESS;
  if (t.vectors != kStreamU && (t.vectors != 8 || t.persistent)) return STRATA_ERROR_INVALID_VALUE;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Dense interleaved rows: the streaming kernel (flat vectors of x, no per-chunk row arithmetic).
  if (p.interleaved && p.I % kV == 0 && rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.y, p.x_dtype, p.y_rows) &&
      dense_rows(p.x_rows, 2 * p.I) && dense_rows(p.y_rows, p.I)) {
    const bool f32 = p.x_dtype == STRATA_DTYPE_F32;
    const int64_t vpr = 2 * p.I / (f32 ? 4 : 8), nvec = p.rows * vpr;
    if (!p.probs || nvec <= 0xffffffffLL) {
      if (f32) return p.probs ? launch_fwd_stream<true, true>(p, nvec, static_cast<uint32_t>(vpr), t, s)
                              : launch_fwd_stream<true, false>(p, nvec, 1, t, s);
      return p.probs ? launch_fwd_stream<false, true>(p, nvec, static_cast<uint32_t>(vpr), t, s)
                     : launch_fwd_stream<false, false>(p, nvec, 1, t, s);
    }
  }
  const bool vec = p.I % kV == 0 && rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.y, p.x_dtype, p.y_rows);
  const int64_t threads = vec ? (p.rows * (p.I / kV) + kCpt - 1) / kCpt : p.rows * p.I;
  const int64_t blocks = (threads + kBlock - 1) / kBlock;
  if (blocks > 0x7fffffffLL)
    return fail(STRATA_ERROR_UNSUPPORTED, "clipped_swiglu_fwd: {} elements exceed one CUDA grid", threads);
  if (vec) {
    if (blocks * kBlock * kCpt <= 0x7fffffffLL) fwd_pairs_vec<true><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p);
    else fwd_pairs_vec<false><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p);
    return cuda::check_launch("clipped_swiglu fwd_pairs_vec");
  }
  fwd_pairs_scalar<<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(p);
  return cuda::check_launch("clipped_swiglu fwd_pairs_scalar");
}

int clipped_swiglu_bwd_cuda(const ClippedSwigluBwdParams& p, void* stream) {
  if (p.rows == 0) return STRATA_SUCCESS;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool vec = p.I % kV == 0 && rows_vec_ok(p.x, p.x_dtype, p.x_rows) && rows_vec_ok(p.dy, p.x_dtype, p.dy_rows) &&
                   rows_vec_ok(p.dx, p.x_dtype, p.dx_rows);
  // Threads per row: enough for the row's chunks, a multiple of 32 (block_sum), at most kBlock.
  const int64_t nch = (p.I + kV - 1) / kV;
  const int64_t rounds = std::max<int64_t>(1, (nch + kBlock - 1) / kBlock);
  const int threads = static_cast<int>(std::clamp<int64_t>((nch + rounds - 1) / rounds, 32, kBlock) + 31) / 32 * 32;
  const int64_t blocks = std::min<int64_t>(p.rows, int64_t{1} << 30);
  bwd_rows_block<<<static_cast<unsigned>(blocks), threads, 0, s>>>(p, vec);
  return cuda::check_launch("clipped_swiglu bwd_rows_block");
}

std::string clipped_swiglu_fwd_cuda_ring_reject(const ClippedSwigluFwdParams& p) { return ring_reject(p); }

int clipped_swiglu_fwd_cuda_ring(const ClippedSwigluFwdParams& p, void* stream) {
  if (p.rows == 0 || p.I == 0) return STRATA_SUCCESS;
  // Pointers are known only now: rows that are not 16-byte aligned take clipped_swiglu_fwd_cuda's kernels.
  if (!ring_reject(p).empty() || !rows_vec_ok(p.x, p.x_dtype, p.x_rows) || !rows_vec_ok(p.y, p.x_dtype, p.y_rows))
    return clipped_swiglu_fwd_cuda(p, stream);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.x_dtype) {
    case STRATA_DTYPE_F32: return launch_fwd_ring_dt<STRATA_DTYPE_F32>(p, s);
    case STRATA_DTYPE_BF16: return launch_fwd_ring_dt<STRATA_DTYPE_BF16>(p, s);
    default: return launch_fwd_ring_dt<STRATA_DTYPE_F16>(p, s);  // ring_reject: f32 / bf16 / f16 only
  }
}

std::string clipped_swiglu_fwd_cuda_stream_reject(const ClippedSwigluFwdParams& p) {
  if (p.x_dtype != STRATA_DTYPE_F32 && p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16)
    return "handles f32/bf16/f16 x only";
  if (!p.interleaved) return "needs interleaved pairs";
  if (p.I % kV != 0) return "needs I % 8 == 0";
  if (!dense_rows(p.x_rows, 2 * p.I) || !dense_rows(p.y_rows, p.I)) return "needs dense x and y rows";
  return {};
}

std::string clipped_swiglu_fwd_cuda_tma_reject(const ClippedSwigluFwdParams& p) {
  std::string r = ring_reject(p);
  if (!r.empty()) return r;
  if (2 * p.I * static_cast<int64_t>(dtype_size(p.x_dtype)) > kTmaMaxRowBytes) return "needs x rows of at most 30 KiB";
  return {};
}

int clipped_swiglu_fwd_cuda_tma(const ClippedSwigluFwdParams& p, void* stream, ClippedSwigluTmaTile tile) {
  if (p.rows == 0 || p.I == 0) return STRATA_SUCCESS;
  if (tile.x_bytes < 1 || tile.threads < 32 || tile.flags < 0 || tile.flags > 7) return STRATA_ERROR_INVALID_VALUE;
  if (!clipped_swiglu_fwd_cuda_tma_reject(p).empty() || !rows_vec_ok(p.x, p.x_dtype, p.x_rows) ||
      !rows_vec_ok(p.y, p.x_dtype, p.y_rows))
    return clipped_swiglu_fwd_cuda(p, stream);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.x_dtype) {
    case STRATA_DTYPE_F32: return launch_fwd_tma_dt<STRATA_DTYPE_F32>(p, tile, s);
    case STRATA_DTYPE_BF16: return launch_fwd_tma_dt<STRATA_DTYPE_BF16>(p, tile, s);
    default: return launch_fwd_tma_dt<STRATA_DTYPE_F16>(p, tile, s);
  }
}

}  // namespace strata::activation
