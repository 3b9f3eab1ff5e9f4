// CUDA implementation of chunk_loss ("cuda.sm90.cublas"): the driver's loops (driver.h) with cuBLAS GEMMs
// (cublasGemmEx: bf16/f16 operands on the tensor cores with f32 accumulation, f32 operands in plain f32 — no
// TF32) and the epilogue kernels below:
//   row_stats   one block per row of a logits tile [rows, cols]: bias, scale, softcap, then the row's
//               (max, sum exp, sum c, c_target) by an online pass per thread and a fixed shuffle / shared-memory
//               tree; merged into the row's running statistics; on the last vocabulary tile lse and loss_i.
//   row_grad    one block per row: dZ = G a_i s (p (1 + 2 lambda lse) - eps/V - (1-eps)[j == y]) softcap'
//               stored f32 (f32 inputs, in place) or in the input dtype (16-bit inputs: the next GEMMs' operand).
//   col_sum     one thread per column, rows in order: db (+)= colsum(dZ).
//   convert     f32 accumulators to the output dtype.
//   loss_sum    one block: sum_i loss_i in f64 in a fixed order, times 1/#valid (mean).
// Targets are counted first (count_targets: loss/common/cuda_targets.h, shared with fused_cross_entropy) and the
// counts read back to the host (one stream sync) so an out-of-range target fails the call before anything is
// written. Every launch is checked; cuBLAS GEMMs are
// deterministic for a fixed handle, stream and shape, and nothing uses atomics on floats: the same bits every run.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "opbase/dtype.h"
#include "ops/loss/chunk_loss/chunk_loss.h"
#include "ops/loss/chunk_loss/driver.h"
#include "ops/loss/common/cuda_targets.h"
#include "tile/cuda/check.cuh"

namespace strata::loss {
namespace {

constexpr int kRowThreads = 256;  // threads per row block of row_stats / row_grad

template <class T>
__device__ __forceinline__ float ld(const T* p, int64_t i) {
  return to_f32(p[i]);
}

__device__ __forceinline__ CeRowStats shfl_stat(const CeRowStats& s, int o) {
  CeRowStats r;
  r.lse.m = __shfl_xor_sync(0xffffffffu, s.lse.m, o);
  r.lse.s = __shfl_xor_sync(0xffffffffu, s.lse.s, o);
  r.sum_c = __shfl_xor_sync(0xffffffffu, s.sum_c, o);
  r.c_y = __shfl_xor_sync(0xffffffffu, s.c_y, o);
  return r;
}

// Merge over the block in a fixed tree; thread 0 gets the result.
__device__ CeRowStats block_merge(CeRowStats st) {
  __shared__ CeRowStats warp_stat[kRowThreads / 32];
  // The xor tree merges the same pairs in the same order on every run.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) st = ce_stats_merge(st, shfl_stat(st, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_stat[warp] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    st = warp_stat[0];
    for (int w = 1; w < kRowThreads / 32; ++w) st = ce_stats_merge(st, warp_stat[w]);
  }
  return st;
}

struct RowArgs {
  const void* z;          // tile [rows, cols] (f32 or bf16: the kernels' TZ), row stride ldz
  int64_t ldz, rows, cols, r0, v0;
  const void* bias;       // [V] (stride bias_stride) or nullptr
  int64_t bias_stride;
  const int64_t* target;
  int64_t target_stride;
  CeConsts ce;
  int64_t V;              // vocabulary size (the smoothing denominator of the loss)
};

template <class TB, class TZ>
__device__ __forceinline__ float logit_at(const RowArgs& a, const TZ* zr, int64_t j) {
  float z = to_f32(zr[j]);
  if (a.bias) z += ld(static_cast<const TB*>(a.bias), (a.v0 + j) * a.bias_stride);
  return ce_logit(a.ce, z);
}

// The end of a row block's pass over one vocabulary tile: merge the threads' statistics, merge them into the
// row's running statistics (stat[r]), and on the last tile write lse and the row's loss.
// finish_merged: by the one thread holding the tile's merged statistics of row r.
__device__ __forceinline__ void finish_merged(CeRowStats st, const RowArgs& a, CeRowStats* stat, int64_t r,
                                              bool first, bool last, float* lse, int64_t lse_stride, float* rowloss,
                                              int64_t row, int64_t y) {
  if (!first) st = ce_stats_merge(stat[r], st);
  if (!last) {
    stat[r] = st;
    return;
  }
  lse[row * lse_stride] = ce_lse(st.lse);
  rowloss[row] = y == a.ce.ignore_index ? 0.f : ce_row_loss(a.ce, st, a.V);
}

__device__ __forceinline__ void finish_row(CeRowStats st, const RowArgs& a, CeRowStats* stat, int64_t r,
                                           bool first, bool last, float* lse, int64_t lse_stride, float* rowloss,
                                           int64_t row, int64_t y) {
  st = block_merge(st);
  if (threadIdx.x == 0) finish_merged(st, a, stat, r, first, last, lse, lse_stride, rowloss, row, y);
}

template <class TB, class TZ>
__global__ void __launch_bounds__(kRowThreads)
    row_stats(RowArgs a, CeRowStats* stat, bool first, bool last, float* lse, int64_t lse_stride, float* rowloss) {
  const int64_t r = blockIdx.x;
  const TZ* zr = static_cast<const TZ*>(a.z) + r * a.ldz;
  const int64_t row = a.r0 + r;
  const int64_t y = a.target[row * a.target_stride];
  const int64_t yj = y - a.v0;  // target column inside the tile (any value when outside)
  CeRowStats st;  // empty: m = -inf, s = 0
  for (int64_t j = threadIdx.x; j < a.cols; j += kRowThreads) {
    const float c = logit_at<TB, TZ>(a, zr, j);
    ce_stats_add(st, c, j == yj);
  }
  finish_row(st, a, stat, r, first, last, lse, lse_stride, rowloss, row, y);
}

// 16-byte variants for a bf16 tile whose rows start 16-byte aligned (ldz % 8 == 0, aligned base): 8
// elements per load, the last cols % 8 of a row scalar. The same per-element math as row_stats / row_grad
// (the statistics merge 8 elements per online step instead of 1).
__device__ __forceinline__ void unpack_bf16x8(const uint4& u, float (&c)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    c[2 * k] = __uint_as_float(w[k] << 16);
    c[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

template <class TB>
__device__ __forceinline__ void logits8(const RowArgs& a, int64_t j0, float (&c)[8]) {
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    float z = c[q];
    if (a.bias) z += ld(static_cast<const TB*>(a.bias), (a.v0 + j0 + q) * a.bias_stride);
    c[q] = ce_logit(a.ce, z);
  }
}

// One online step of a thread's row statistics over the 8 bf16 logits of 16-byte vector v of the row (yj: the
// target's column inside the tile).
template <class TB>
__device__ __forceinline__ void stats_add8(CeRowStats& st, const RowArgs& a, const uint4& u, int64_t v, int64_t yj) {
  float c[8];
  unpack_bf16x8(u, c);
  logits8<TB>(a, v * 8, c);
  float mv = c[0];
#pragma unroll
  for (int q = 1; q < 8; ++q) mv = fmaxf(mv, c[q]);
  if (mv > st.lse.m) {
    st.lse.s *= expf(st.lse.m - mv);  // exp(-inf) = 0 on the first vector
    st.lse.m = mv;
  }
  // __expf (ex2.approx of x log2 e): relative error ~1e-7 for the arguments <= 0 that matter here; two
  // partial sums shorten the dependency chain.
  float e0 = 0.f, e1 = 0.f, sc = 0.f;
#pragma unroll
  for (int q = 0; q < 8; q += 2) {
    e0 += __expf(c[q] - st.lse.m);
    e1 += __expf(c[q + 1] - st.lse.m);
    sc += c[q] + c[q + 1];
  }
  const float e = e0 + e1;
  st.lse.s += e;
  st.sum_c += sc;
  const int64_t off = yj - v * 8;
  if (off >= 0 && off < 8) {
#pragma unroll
    for (int q = 0; q < 8; ++q)
      if (q == off) st.c_y = c[q];
  }
}

template <class TB>
__global__ void __launch_bounds__(kRowThreads)
    row_stats_v8(RowArgs a, CeRowStats* stat, bool first, bool last, float* lse, int64_t lse_stride, float* rowloss) {
  const int64_t r = blockIdx.x;
  const bf16_t* zr = static_cast<const bf16_t*>(a.z) + r * a.ldz;
  const int64_t row = a.r0 + r;
  const int64_t y = a.target[row * a.target_stride];
  const int64_t yj = y - a.v0;
  const int64_t nv = a.cols / 8;
  CeRowStats st;  // empty: m = -inf, s = 0
  for (int64_t v = threadIdx.x; v < nv; v += kRowThreads)
    stats_add8<TB>(st, a, reinterpret_cast<const uint4*>(zr)[v], v, yj);
  for (int64_t j = nv * 8 + threadIdx.x; j < a.cols; j += kRowThreads) {
    const float c = logit_at<TB, bf16_t>(a, zr, j);
    ce_stats_add(st, c, j == yj);
  }
  finish_row(st, a, stat, r, first, last, lse, lse_stride, rowloss, row, y);
}

// Session 15 (BackendTraits::row_block = 2, the CUDA default; STRATA_CHUNK_LOSS_ROWS=1 forces row_stats_v8): R rows
// per block. A row_stats_v8<bf16> block lives for two dependent DRAM round trips (its loop's two vectors, one after
// the other) plus the merge tree, and ptxas gives it 61 registers, so 4 blocks (4 rows) are in flight per SM (0.76
// TB/s at the H200 shape, README.md). Here every thread loads its vectors of all R rows (and their targets) before any
// math (40 registers for R = 2: 6 blocks, 12 rows in flight per SM). Rows of at most kRowVecs * kRowThreads 16-byte
// vectors (vt <= 4096 + 7 bf16 columns: 3968 at the H200 shape). Per row the same work in the same order as
// row_stats_v8 (thread t adds vectors t and t + 256, then the scalar tail, then the same merge tree): the same bits.
// s15run1 (H200, stepped, 39 tiles of [8192, 3968]): 2.797 ms against 3.315 for row_stats_v8; R = 4 (64 registers)
// 3.573, and R = 4 with the blocks walking the tile from its last row (the GEMM's last-written rows first) 3.417:
// removed, as was the same scheme for row_grad_v8 (R = 2: 2.744 ms against 2.684).
constexpr int kRowVecs = 2;
// Thread t's 16-byte vectors t and t + 256 (those below nv) of tile rows r_base .. r_base + R - 1 (those below rows),
// all loads issued before any of them is used.
template <int R>
__device__ __forceinline__ void load_rows16(uint4 (&u)[R][kRowVecs], const bf16_t* z, int64_t ldz, int64_t rows,
                                            int64_t r_base, int64_t nv) {
#pragma unroll
  for (int k = 0; k < R; ++k) {
    if (r_base + k >= rows) continue;
    const uint4* zr = reinterpret_cast<const uint4*>(z + (r_base + k) * ldz);
#pragma unroll
    for (int i = 0; i < kRowVecs; ++i) {
      const int64_t v = threadIdx.x + i * kRowThreads;
      if (v < nv) u[k][i] = zr[v];
    }
  }
}

template <class TB, int R>
__global__ void __launch_bounds__(kRowThreads)
    row_stats_v8r(RowArgs a, CeRowStats* stat, bool first, bool last, float* lse, int64_t lse_stride, float* rowloss) {
  const int64_t r_base = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t nv = a.cols / 8;
  uint4 u[R][kRowVecs];
  int64_t y[R];
#pragma unroll
  for (int k = 0; k < R; ++k)
    if (r_base + k < a.rows) y[k] = a.target[(a.r0 + r_base + k) * a.target_stride];
  load_rows16<R>(u, static_cast<const bf16_t*>(a.z), a.ldz, a.rows, r_base, nv);
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t r = r_base + k;
    if (r >= a.rows) break;  // the same for every thread of the block
    const int64_t yj = y[k] - a.v0;
    CeRowStats st;  // empty: m = -inf, s = 0
#pragma unroll
    for (int i = 0; i < kRowVecs; ++i) {
      const int64_t v = threadIdx.x + i * kRowThreads;
      if (v < nv) stats_add8<TB>(st, a, u[k][i], v, yj);
    }
    const bf16_t* zr = static_cast<const bf16_t*>(a.z) + r * a.ldz;
    for (int64_t j = nv * 8 + threadIdx.x; j < a.cols; j += kRowThreads) {
      const float c = logit_at<TB, bf16_t>(a, zr, j);
      ce_stats_add(st, c, j == yj);
    }
    finish_row(st, a, stat, r, first, last, lse, lse_stride, rowloss, a.r0 + r, y[k]);
    __syncthreads();  // block_merge's shared partials are written again by the next row
  }
}

// __expf (ex2.approx) for the 16-byte kernels: the gradient is rounded to bf16, far coarser than its error.
struct FastExp {
  __device__ __forceinline__ float operator()(float x) const { return __expf(x); }
};

// dZ of the 8 bf16 logits of 16-byte vector v of a row (coef 0: an ignored row), packed as 8 bf16.
template <class TB>
__device__ __forceinline__ uint4 grad8(const RowArgs& a, const CeGradRow& g, float coef, const uint4& u, int64_t v,
                                       int64_t yj) {
  float c[8];
  unpack_bf16x8(u, c);
  logits8<TB>(a, v * 8, c);
  const int64_t off = yj - v * 8;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float d0 = coef == 0.f ? 0.f : ce_grad_from_logit(a.ce, g, c[2 * k], off == 2 * k, FastExp{});
    const float d1 = coef == 0.f ? 0.f : ce_grad_from_logit(a.ce, g, c[2 * k + 1], off == 2 * k + 1, FastExp{});
    w[k] = static_cast<uint32_t>(from_f32<bf16_t>(d0).bits) | (static_cast<uint32_t>(from_f32<bf16_t>(d1).bits) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// dZ of element j of a row (the last cols % 8 of the 16-byte kernels), in place.
template <class TB>
__device__ __forceinline__ void grad1(const RowArgs& a, const CeGradRow& g, float coef, bf16_t* zr, int64_t j,
                                      int64_t yj) {
  const float c = logit_at<TB, bf16_t>(a, zr, j);
  zr[j] = from_f32<bf16_t>(coef == 0.f ? 0.f : ce_grad_from_logit(a.ce, g, c, j == yj));
}

// What the 16-byte gradient kernels need of tile row r: its storage, the row's gradient constants (coef 0: an
// ignored row), the target's column inside the tile and the number of whole 16-byte vectors.
struct GradRow16 {
  bf16_t* zr;
  CeGradRow g;
  float coef;
  int64_t yj, nv;
};
__device__ __forceinline__ GradRow16 grad_row16(const RowArgs& a, bf16_t* dz, int64_t r, const float* lse,
                                                int64_t lse_stride, float coef_base, const float* dloss) {
  const int64_t row = a.r0 + r;
  const int64_t y = a.target[row * a.target_stride];
  const float coef = y == a.ce.ignore_index ? 0.f : coef_base * (dloss ? *dloss : 1.f);
  return GradRow16{dz + r * a.ldz, ce_grad_row(a.ce, lse[row * lse_stride], coef), coef, y - a.v0, a.cols / 8};
}

// In place over the bf16 tile (dz = z, same row stride); each thread reads its vector before writing it.
template <class TB>
__global__ void __launch_bounds__(kRowThreads)
    row_grad_v8(RowArgs a, bf16_t* dz, const float* lse, int64_t lse_stride, float coef_base, const float* dloss) {
  const GradRow16 q = grad_row16(a, dz, blockIdx.x, lse, lse_stride, coef_base, dloss);
  for (int64_t v = threadIdx.x; v < q.nv; v += kRowThreads)
    reinterpret_cast<uint4*>(q.zr)[v] = grad8<TB>(a, q.g, q.coef, reinterpret_cast<const uint4*>(q.zr)[v], v, q.yj);
  for (int64_t j = q.nv * 8 + threadIdx.x; j < a.cols; j += kRowThreads) grad1<TB>(a, q.g, q.coef, q.zr, j, q.yj);
}

// dz may be the tile itself (TZ = TD, lddz = ldz): each thread reads an element before writing it.
template <class TB, class TZ, class TD>
__global__ void __launch_bounds__(kRowThreads)
    row_grad(RowArgs a, TD* dz, int64_t lddz, const float* lse, int64_t lse_stride, float coef_base,
             const float* dloss) {
  const int64_t r = blockIdx.x;
  const TZ* zr = static_cast<const TZ*>(a.z) + r * a.ldz;
  TD* dr = dz + r * lddz;
  const int64_t row = a.r0 + r;
  const int64_t y = a.target[row * a.target_stride];
  const float coef = y == a.ce.ignore_index ? 0.f : coef_base * (dloss ? *dloss : 1.f);
  const CeGradRow g = ce_grad_row(a.ce, lse[row * lse_stride], coef);
  const int64_t yj = y - a.v0;
  for (int64_t j = threadIdx.x; j < a.cols; j += kRowThreads) {
    const float c = logit_at<TB, TZ>(a, zr, j);
    dr[j] = from_f32<TD>(coef == 0.f ? 0.f : ce_grad_from_logit(a.ce, g, c, j == yj));
  }
}

// Column sums of a dZ tile [rows, cols]: a 32 x 32 block per 32 columns; thread (x, y) sums column x over
// rows y, y + 32, ... (coalesced 32-column reads, many loads in flight), then row y == 0 adds the 32
// partials in y order. Fixed assignment and order: the same bits every run. (One thread per column walking all
// rows, as before, left a [8192, 3968] tile to 16 blocks.)
constexpr int kColTile = 32;
template <class TD>
__global__ void __launch_bounds__(kColTile* kColTile)
    col_sum(const TD* dz, int64_t lddz, int64_t rows, int64_t cols, float* acc, int64_t acc_stride, bool first,
            float scale) {
  __shared__ float part[kColTile][kColTile + 1];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float s = 0.f;
  if (j < cols) {
#pragma unroll 8
    for (int64_t r = threadIdx.y; r < rows; r += kColTile) s += to_f32(dz[r * lddz + j]);
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  float t = part[0][threadIdx.x];
  for (int y = 1; y < kColTile; ++y) t += part[y][threadIdx.x];
  acc[j * acc_stride] = first ? t * scale : acc[j * acc_stride] + t * scale;
}

// Rows of at least 256 columns (dH [N, D], dW tiles): blockIdx.y walks the rows (grid-stride beyond 65535),
// blockIdx.x / threads the columns, so no 64-bit division per element.
template <class TO>
__global__ void convert_rows_2d(const float* src, int64_t ld_src, TO* dst, int64_t ld_dst, int64_t rows,
                                int64_t cols) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += step)
      dst[r * ld_dst + c] = from_f32<TO>(src[r * ld_src + c]);
}

template <class TO>
__global__ void convert_rows(const float* src, int64_t ld_src, TO* dst, int64_t ld_dst, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * ld_dst + c] = from_f32<TO>(src[r * ld_src + c]);
  }
}

__global__ void loss_sum(const float* rowloss, int64_t n, double scale, float* loss) {
  __shared__ double part[256];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += 256) s += rowloss[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = static_cast<float>(part[0] * scale);
}

cudaDataType_t cuda_type(int32_t dt) {
  switch (dt) {
    case STRATA_DTYPE_BF16: return CUDA_R_16BF;
    case STRATA_DTYPE_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The logits tile: f32, or bf16 (BackendTraits::bf16_tile with bf16 inputs).
template <class Fn>
void visit_tile(int32_t dt, Fn&& fn) {
  if (dt == STRATA_DTYPE_BF16) fn(bf16_t{});
  else fn(float{});
}

template <class Fn>
void visit_storage(int32_t dt, Fn&& fn) {
  switch (dt) {
    case STRATA_DTYPE_BF16: fn(bf16_t{}); break;
    case STRATA_DTYPE_F16: fn(f16_t{}); break;
    default: fn(float{}); break;
  }
}

// One cuBLAS handle per (thread, device), created on first use and kept for the process (destroying it at
// exit could run after the CUDA context is gone).
strata_status cublas_handle(cublasHandle_t* out) {
  int dev = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&dev));
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  auto it = handles.find(dev);
  if (it == handles.end()) {
    cublasHandle_t h = nullptr;
    const cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
      return fail(STRATA_ERROR_RUNTIME, "chunk_loss: cublasCreate failed ({})", cublasGetStatusString(s));
    it = handles.emplace(dev, h).first;
  }
  *out = it->second;
  return STRATA_SUCCESS;
}

// The second stream of the statistics (BackendTraits::overlap_stats) and its events, per (thread, device), created
// on first use and kept for the process like the cuBLAS handle. done[] is a ring: statistics launch k records
// done[k % kSideEvents] (waiting on a re-recorded event waits for a later launch of the same stream: still
// correct, only later).
constexpr int kSideEvents = 8;
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;  // recorded on the caller's stream before each statistics launch
  cudaEvent_t done[kSideEvents] = {};
  cudaEvent_t grad_done = nullptr;  // recorded after each gradient launched ahead (grad_async)
};
strata_status side_stream(SideStream** out) {
  int dev = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&dev));
  thread_local std::unordered_map<int, SideStream> sides;
  auto it = sides.find(dev);
  if (it == sides.end()) {
    SideStream s;
    STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    STRATA_CUDA_TRY(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
    for (cudaEvent_t& e : s.done) STRATA_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    STRATA_CUDA_TRY(cudaEventCreateWithFlags(&s.grad_done, cudaEventDisableTiming));
    it = sides.emplace(dev, s).first;
  }
  *out = &it->second;
  return STRATA_SUCCESS;
}

struct CudaBackend : BackendBase {
  cudaStream_t stream;
  cublasHandle_t handle = nullptr;
  // Statistics beside the GEMMs: stats() launches on side->stream after the caller's stream reaches it (the GEMM
  // that wrote the tile), and records which bytes it reads; a GEMM that writes into those bytes first waits for
  // that launch, and every other operation of the caller's stream (the gradient and column-sum kernels, which read
  // lse / the statistics, converts, copies, the loss sum) first waits for all of the side stream (join). Only the
  // kernels' order changes: the same kernels on the same data, the same bits.
  struct Pending {
    const char *lo, *hi;  // bytes [lo, hi) read by a statistics launch not yet waited for
    cudaEvent_t done;
  };
  SideStream* side = nullptr;
  Pending pending[kSideEvents] = {};
  int n_pending = 0;
  int64_t n_side = 0;  // statistics launches on the side stream
  bool side_open = false;  // side work the caller's stream has not waited for
  cudaEvent_t last_side = nullptr;  // the event recorded last on the side stream (join waits for it)

  const BackendTraits tr = chunk_loss_cuda_traits();  // one reading of the options for the whole call

  CudaBackend(const ChunkLossParams& p_, const ChunkLossLayout& L_, char* ws_, cudaStream_t s)
      : BackendBase(p_, L_, ws_), stream(s) {}
  ~CudaBackend() { join(); }  // no side work outlives the call on the caller's stream

  void join() {
    if (!side_open) return;
    note(cuda::check(cudaStreamWaitEvent(stream, last_side, 0), "chunk_loss: cudaStreamWaitEvent"));
    side_open = false;
    n_pending = 0;
  }
  // The caller's stream waits for the statistics launches that read any of the bytes [lo, hi).
  void before_write(const void* lo_p, size_t bytes) {
    const char* lo = static_cast<const char*>(lo_p);
    const char* hi = lo + bytes;
    int kept = 0;
    for (int i = 0; i < n_pending; ++i) {
      if (pending[i].lo < hi && lo < pending[i].hi)
        note(cuda::check(cudaStreamWaitEvent(stream, pending[i].done, 0), "chunk_loss: cudaStreamWaitEvent"));
      else
        pending[kept++] = pending[i];
    }
    n_pending = kept;
  }

  const BackendTraits& traits() const { return tr; }
  void launched(const char* what) { note(cuda::check_launch(what)); }

  Mat hidden_block(int64_t r0, int64_t) const {
    return {static_cast<const char*>(p.hidden) + r0 * p.ld_h * static_cast<int64_t>(dtype_size(p.h_dtype)), p.h_dtype,
            p.ld_h};
  }
  Mat weight_block(int64_t v0, int64_t) const {
    return {static_cast<const char*>(p.weight) + v0 * p.ld_w * static_cast<int64_t>(dtype_size(p.w_dtype)), p.w_dtype,
            p.ld_w};
  }

  void zero(void* dst, int32_t dt, int64_t ld, int64_t rows, int64_t cols) {
    if (err || rows == 0 || cols == 0) return;
    join();
    const size_t es = dtype_size(dt);
    note(cuda::check(cudaMemset2DAsync(dst, static_cast<size_t>(ld) * es, 0, static_cast<size_t>(cols) * es,
                                       static_cast<size_t>(rows), stream),
                     "chunk_loss: cudaMemset2DAsync"));
  }

  void copy(void* dst, const void* src, size_t bytes) {
    if (err || bytes == 0) return;
    join();
    note(cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "chunk_loss: cudaMemcpyAsync"));
  }

  // Row-major C[M, N] = op(A) op(B) + beta C as the column-major C^T = op(B)^T op(A)^T.
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, Mat A, Mat B, float beta, void* C, int32_t c_dt,
            int64_t ldc, float alpha = 1.f) {
    if (err || M == 0 || N == 0) return;
    if (K == 0) {
      if (beta == 0.f) zero(C, c_dt, ldc, M, N);
      return;
    }
    if (n_pending > 0)
      before_write(C, static_cast<size_t>((M - 1) * ldc + N) * dtype_size(c_dt));
    const cublasStatus_t s = cublasGemmEx(
        handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
        static_cast<int>(M), static_cast<int>(K), &alpha, B.p, cuda_type(B.dt), static_cast<int>(B.ld), A.p,
        cuda_type(A.dt), static_cast<int>(A.ld), &beta, C, cuda_type(c_dt), static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
      note(fail(STRATA_ERROR_RUNTIME, "chunk_loss: cublasGemmEx (M={}, N={}, K={}) failed: {}", M, N, K,
                cublasGetStatusString(s)));
  }

  // Two GEMMs of one shape as one cublasGemmStridedBatchedEx: C_i = alpha op(A_i) op(B_i) + beta C_i, i = 0, 1,
  // with X_i = X + i sX (elements; sA, sC > 0, sB may be 0). The split dH accumulator's halves (driver.h).
  static constexpr bool kGemmBatch2 = true;
  void gemm_batch2(bool ta, bool tb, int64_t M, int64_t N, int64_t K, Mat A, int64_t sa, Mat B, int64_t sb,
                   float beta, void* C, int64_t sc, int32_t c_dt, int64_t ldc, float alpha = 1.f) {
    if (err || M == 0 || N == 0) return;
    const size_t c_bytes = static_cast<size_t>((M - 1) * ldc + N) * dtype_size(c_dt);
    char* const c1 = static_cast<char*>(C) + sc * static_cast<int64_t>(dtype_size(c_dt));
    if (K == 0) {
      if (beta == 0.f) zero(C, c_dt, ldc, M, N), zero(c1, c_dt, ldc, M, N);
      return;
    }
    if (n_pending > 0) before_write(C, c_bytes), before_write(c1, c_bytes);
    const cublasStatus_t s = cublasGemmStridedBatchedEx(
        handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
        static_cast<int>(M), static_cast<int>(K), &alpha, B.p, cuda_type(B.dt), static_cast<int>(B.ld), sb, A.p,
        cuda_type(A.dt), static_cast<int>(A.ld), sa, &beta, C, cuda_type(c_dt), static_cast<int>(ldc), sc, 2,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
      note(fail(STRATA_ERROR_RUNTIME, "chunk_loss: cublasGemmStridedBatchedEx (2 x M={}, N={}, K={}) failed: {}", M, N,
                K, cublasGetStatusString(s)));
  }

  strata_status count_targets_now() {
    STRATA_RETURN_IF_ERROR(cublas_handle(&handle));
    if (traits().overlap_stats) STRATA_RETURN_IF_ERROR(side_stream(&side));
    const cublasStatus_t cs = cublasSetStream(handle, stream);
    if (cs != CUBLAS_STATUS_SUCCESS)
      return fail(STRATA_ERROR_RUNTIME, "chunk_loss: cublasSetStream failed ({})", cublasGetStatusString(cs));
    if (p.N == 0) return STRATA_SUCCESS;
    // The shared target check (loss/common/cuda_targets.h): counts into the workspace, read back, one sync.
    TargetCounts c;
    STRATA_RETURN_IF_ERROR(cuda_count_targets(p.target, STRATA_DTYPE_I64, p.target_stride, p.N, p.V, p.ce.ignore_index,
                                              reinterpret_cast<int64_t*>(ws + L.counts), stream, &c));
    if (c.captured)  // the host needs the count (the mean's 1/count and the row batching)
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "{}: cannot run while its CUDA stream is captured into a graph (the target count is read back to "
                  "the host)",
                  p.backward_op ? "chunk_loss_bwd" : "chunk_loss");
    if (c.bad > 0) return chunk_loss_bad_target(p, c.first_bad, c.first_value);
    n_valid = c.valid;
    return STRATA_SUCCESS;
  }
  strata_status count_targets() { return count_targets_now(); }

  RowArgs row_args(const void* Z, int64_t ldz, int64_t rows, int64_t cols, int64_t r0, int64_t v0) const {
    return RowArgs{Z, ldz, rows, cols, r0, v0, p.bias, p.bias_stride, p.target, p.target_stride, p.ce, p.V};
  }

  // row_stats_v8r (BackendTraits::row_block = 2) takes rows of at most kRowVecs 16-byte vectors per thread.
  bool rows_fit(int64_t cols) const { return tr.row_block == 2 && cols / 8 <= int64_t{kRowVecs} * kRowThreads; }

  // bf16 tile with 16-byte aligned rows: the 16-byte kernels.
  static bool vec8(const void* Z, int32_t z_dt, int64_t ldz) {
    return z_dt == STRATA_DTYPE_BF16 && ldz % 8 == 0 && reinterpret_cast<uintptr_t>(Z) % 16 == 0;
  }

  // One block per row: rows <= N < 2^31 (the plan's tiles), so the grid fits gridDim.x.
  void stats(const void* Z, int32_t z_dt, int64_t ldz, int64_t rows, int64_t cols, int64_t r0, int64_t v0, bool first,
             bool last) {
    if (err || rows == 0) return;
    const RowArgs a = row_args(Z, ldz, rows, cols, r0, v0);
    auto* stat = reinterpret_cast<CeRowStats*>(ws + L.stat);
    auto* rowloss = reinterpret_cast<float*>(ws + L.rowloss);
    const bool v8 = vec8(Z, z_dt, ldz);
    cudaStream_t st = stream;
    if (side) {  // after the caller's stream has written the tile; the ring slot of this launch must be free
      if (n_pending == kSideEvents) join();
      note(cuda::check(cudaEventRecord(side->fork, stream), "chunk_loss: cudaEventRecord"));
      note(cuda::check(cudaStreamWaitEvent(side->stream, side->fork, 0), "chunk_loss: cudaStreamWaitEvent"));
      if (err) return;
      st = side->stream;
    }
    visit_storage(p.w_dtype, [&](auto tb) {
      if (v8 && rows_fit(cols)) {  // two rows per block (session 15)
        const unsigned grid = static_cast<unsigned>(cuda::ceil_div(rows, 2));
        row_stats_v8r<decltype(tb), 2><<<grid, kRowThreads, 0, st>>>(a, stat, first, last, lse_w, lse_w_stride, rowloss);
        return;
      }
      if (v8) {
        row_stats_v8<decltype(tb)><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(a, stat, first, last, lse_w,
                                                                                      lse_w_stride, rowloss);
        return;
      }
      visit_tile(z_dt, [&](auto tz) {
        row_stats<decltype(tb), decltype(tz)><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(
            a, stat, first, last, lse_w, lse_w_stride, rowloss);
      });
    });
    launched("chunk_loss (row_stats)");
    if (side && !err) {
      cudaEvent_t done = side->done[n_side % kSideEvents];
      note(cuda::check(cudaEventRecord(done, side->stream), "chunk_loss: cudaEventRecord"));
      last_side = done;
      ++n_side;
      side_open = true;
      const char* lo = static_cast<const char*>(Z);
      pending[n_pending++] = {lo, lo + static_cast<size_t>((rows - 1) * ldz + cols) * dtype_size(z_dt), done};
    }
  }

  float coef_base() const {
    const double a = p.reduction == kReduceMean ? (n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0) : 1.0;
    return static_cast<float>(a * p.grad_scale);
  }

  // f16 dZ holds G a_i s (...) / coef_base (O(1) instead of O(1/#valid), which f16 would store as subnormals or
  // zero for large N); the GEMMs and column sums multiply coef_base back in f32.
  float dz_scale() const {
    const float cb = coef_base();
    return p.h_dtype == STRATA_DTYPE_F16 && L.dz != L.z && cb != 0.f && std::isfinite(1.f / cb) ? cb : 1.f;
  }

  void grad_on(cudaStream_t st, const void* Z, int32_t z_dt, int64_t ldz, void* dZ, int32_t dz_dt, int64_t lddz,
               int64_t rows, int64_t cols, int64_t r0, int64_t v0) {
    const RowArgs a = row_args(Z, ldz, rows, cols, r0, v0);
    const float* g = p.backward_op ? static_cast<const float*>(p.dloss) : nullptr;
    visit_storage(p.w_dtype, [&](auto tb) {
      visit_tile(z_dt, [&](auto tz) {
        using TZ = decltype(tz);
        if (z_dt == STRATA_DTYPE_BF16) {  // dZ in place over the bf16 tile
          if (dZ == Z && lddz == ldz && vec8(Z, z_dt, ldz))
            row_grad_v8<decltype(tb)><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(
                a, static_cast<bf16_t*>(dZ), lse_r, lse_r_stride, coef_base() / dz_scale(), g);
          else
            row_grad<decltype(tb), TZ, TZ><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(
                a, static_cast<TZ*>(dZ), lddz, lse_r, lse_r_stride, coef_base() / dz_scale(), g);
          return;
        }
        visit_storage(dz_dt, [&](auto td) {
          using TD = decltype(td);
          row_grad<decltype(tb), TZ, TD><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(
              a, static_cast<TD*>(dZ), lddz, lse_r, lse_r_stride, coef_base() / dz_scale(), g);
        });
      });
    });
    launched("chunk_loss (row_grad)");
  }

  void grad(const void* Z, int32_t z_dt, int64_t ldz, void* dZ, int32_t dz_dt, int64_t lddz, int64_t rows,
            int64_t cols, int64_t r0, int64_t v0) {
    if (err || rows == 0) return;
    join();  // lse and the statistics come from the side stream
    grad_on(stream, Z, z_dt, ldz, dZ, dz_dt, lddz, rows, cols, r0, v0);
  }

  // The gradient of a kept tile on the side stream, beside the GEMMs of the previous tile (driver.h: it touches
  // only the tile's own bytes, which those GEMMs do not write); grad_wait() makes the caller's stream wait for it
  // before the tile's GEMMs. After the statistics on the side stream (lse), and after everything the caller's
  // stream has issued so far.
  void grad_async(const void* Z, int32_t z_dt, int64_t ldz, void* dZ, int32_t dz_dt, int64_t lddz, int64_t rows,
                  int64_t cols, int64_t r0, int64_t v0) {
    if (err || rows == 0) return;
    if (!side) {
      grad(Z, z_dt, ldz, dZ, dz_dt, lddz, rows, cols, r0, v0);
      return;
    }
    note(cuda::check(cudaEventRecord(side->fork, stream), "chunk_loss: cudaEventRecord"));
    note(cuda::check(cudaStreamWaitEvent(side->stream, side->fork, 0), "chunk_loss: cudaStreamWaitEvent"));
    if (err) return;
    grad_on(side->stream, Z, z_dt, ldz, dZ, dz_dt, lddz, rows, cols, r0, v0);
    note(cuda::check(cudaEventRecord(side->grad_done, side->stream), "chunk_loss: cudaEventRecord"));
    last_side = side->grad_done;
    side_open = true;
  }
  void grad_wait() {
    if (side && !err)
      note(cuda::check(cudaStreamWaitEvent(stream, side->grad_done, 0), "chunk_loss: cudaStreamWaitEvent"));
  }

  void colsum(const void* dZ, int32_t dz_dt, int64_t lddz, int64_t rows, int64_t cols, float* acc,
              int64_t acc_stride, bool first, float scale = 1.f) {
    if (err || cols == 0) return;
    join();
    const unsigned blocks = static_cast<unsigned>(cuda::ceil_div(cols, kColTile));  // cols <= V < 2^31
    visit_storage(dz_dt, [&](auto td) {
      using TD = decltype(td);
      col_sum<TD><<<blocks, dim3(kColTile, kColTile), 0, stream>>>(static_cast<const TD*>(dZ), lddz, rows, cols, acc,
                                                                    acc_stride, first, scale);
    });
    launched("chunk_loss (col_sum)");
  }

  void convert(const float* src, int64_t ld_src, void* dst, int32_t dt, int64_t ld_dst, int64_t rows, int64_t cols) {
    if (err || rows == 0 || cols == 0) return;
    join();
    const int64_t total = rows * cols;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(cuda::ceil_div(total, 256), 1 << 20));
    visit_storage(dt, [&](auto to) {
      using TO = decltype(to);
      if (cols >= 256) {
        const dim3 grid(static_cast<unsigned>(std::min<int64_t>(cuda::ceil_div(cols, 256), 64)),
                        static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
        convert_rows_2d<TO><<<grid, 256, 0, stream>>>(src, ld_src, static_cast<TO*>(dst), ld_dst, rows, cols);
      } else {
        convert_rows<TO><<<blocks, 256, 0, stream>>>(src, ld_src, static_cast<TO*>(dst), ld_dst, rows, cols);
      }
    });
    launched("chunk_loss (convert)");
  }

  strata_status finish_loss() {
    if (err) return err;
    join();  // the row losses come from the side stream
    const double scale = p.reduction == kReduceMean ? (n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0) : 1.0;
    loss_sum<<<1, 256, 0, stream>>>(reinterpret_cast<const float*>(ws + L.rowloss), p.N, scale,
                                    static_cast<float*>(p.loss));
    launched("chunk_loss (loss_sum)");
    return err;
  }
};

}  // namespace

BackendTraits chunk_loss_cuda_traits() {
  BackendTraits t;
  t.convert_operands = false;
  t.separate_dz = true;
  t.gemm_stores_any = true;
  // Below this chunk height the per-chunk f32 read-modify-write of dW (8 V D bytes) dominates the GEMMs.
  t.min_chunk_rows = 1024;
  // bf16 inputs: the logits tile in bf16 (what F.linear in bf16 gives), dZ in place: 2 bytes per element, so
  // the 64 MiB tile holds [8192, 4096] and vocab_tiled runs with a single token block.
  t.bf16_tile = true;
  // The row statistics of one logits tile beside the GEMM of the next, and the gradient of a kept tile beside the
  // previous tile's GEMMs (a second stream): opt-in with STRATA_CHUNK_LOSS_OVERLAP=1 (the same bits either way).
  // Off by default: it was slower on the H200 (s7run2, bf16 N=8192 D=4096 V=151936 through Python: 60.29 ms on
  // against 59.62 ms off; cuBLAS's GEMM blocks fill every SM, so the side kernels mostly delay the next GEMM).
  // Read per call (a test compares the bits of both paths in one process); CudaBackend keeps one copy per call.
  const char* v = std::getenv("STRATA_CHUNK_LOSS_OVERLAP");
  t.overlap_stats = v && v[0] == '1';
  // Session 14 (README.md "CUDA (H200)"): the split dH accumulator's two GEMMs per tile as one strided batch,
  // faster side by side in s14 run 1 (0.973 x the whole call); STRATA_CHUNK_LOSS_DH=pair forces the two GEMMs
  // (the tests compare both).
  const char* dh = std::getenv("STRATA_CHUNK_LOSS_DH");
  t.dh_batch2 = !(dh && std::string(dh) == "pair");
  // Session 15 (README.md "CUDA (H200)"): two rows per block in the 16-byte row_stats (row_stats_v8r);
  // STRATA_CHUNK_LOSS_ROWS=1 forces the one-row kernel (the tests compare the bits of both).
  const char* rows = std::getenv("STRATA_CHUNK_LOSS_ROWS");
  t.row_block = rows && std::string(rows) == "1" ? 1 : 2;
  // Session 15: tile 0 kept in the workspace tile (driver.h); STRATA_CHUNK_LOSS_KEEP=dw forces the session-14 layout
  // (the tests compare the bits of both).
  const char* keep = std::getenv("STRATA_CHUNK_LOSS_KEEP");
  t.keep_first_in_ws = !(keep && std::string(keep) == "dw");
  return t;
}

int chunk_loss_cuda(const ChunkLossParams& p, const ChunkLossLayout& layout, void* workspace, void* stream) {
  CudaBackend be(p, layout, static_cast<char*>(workspace), static_cast<cudaStream_t>(stream));
  const strata_status st = chunk_loss_drive(p, layout, static_cast<char*>(workspace), be);
  be.join();  // the caller's stream waits for the side stream (an early error return leaves it to the destructor)
  return st != STRATA_SUCCESS ? st : be.status();
}

namespace {

// The CUDA backend with a CUDA event recorded on the caller's stream before and after each call the driver makes
// (the names hide CudaBackend's: chunk_loss_drive is a template over the backend type), so that one call splits
// into its steps. Only on the default path (no side stream: every launch is on the caller's stream, so each
// event pair brackets exactly its own launches).
struct StepBackend : CudaBackend {
  struct Mark {
    int step;
    double flop;
    cudaEvent_t e0, e1;
  };
  std::vector<Mark> marks;
  bool seen_grad = false;  // vocab_tiled: logits GEMMs after the first gradient are recomputations

  using CudaBackend::CudaBackend;
  ~StepBackend() {
    for (const Mark& m : marks) cudaEventDestroy(m.e0), cudaEventDestroy(m.e1);
  }
  template <class Fn>
  void timed(int step, double flop, Fn&& fn) {
    Mark m{step, flop, nullptr, nullptr};
    if (err == STRATA_SUCCESS) {
      note(cuda::check(cudaEventCreate(&m.e0), "chunk_loss: cudaEventCreate"));
      note(cuda::check(cudaEventCreate(&m.e1), "chunk_loss: cudaEventCreate"));
    }
    if (err != STRATA_SUCCESS) {
      if (m.e0) cudaEventDestroy(m.e0);
      if (m.e1) cudaEventDestroy(m.e1);
      fn();  // records the failure path of the call itself (it returns at once)
      return;
    }
    cudaEventRecord(m.e0, stream);
    fn();
    cudaEventRecord(m.e1, stream);
    marks.push_back(m);
  }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, Mat A, Mat B, float beta, void* C, int32_t c_dt,
            int64_t ldc, float alpha = 1.f) {
    // Row-major C = op(A) op(B): logits Z = H W^T (ta = 0, tb = 1), dH = dZ W (0, 0), dW = dZ^T H (1, 0).
    const int step = tb ? (seen_grad && p.strategy == kStrategyVocabTiled ? kStepLogitsRecompute : kStepLogitsFwd)
                        : (ta ? kStepDwGemm : kStepDhGemm);
    timed(step, 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K),
          [&] { CudaBackend::gemm(ta, tb, M, N, K, A, B, beta, C, c_dt, ldc, alpha); });
  }
  void gemm_batch2(bool ta, bool tb, int64_t M, int64_t N, int64_t K, Mat A, int64_t sa, Mat B, int64_t sb,
                   float beta, void* C, int64_t sc, int32_t c_dt, int64_t ldc, float alpha = 1.f) {
    timed(kStepDhGemm, 4.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K),
          [&] { CudaBackend::gemm_batch2(ta, tb, M, N, K, A, sa, B, sb, beta, C, sc, c_dt, ldc, alpha); });
  }
  strata_status count_targets() {
    strata_status r = STRATA_SUCCESS;
    timed(kStepCountTargets, 0.0, [&] { r = CudaBackend::count_targets(); });
    return r;
  }
  void stats(const void* Z, int32_t z_dt, int64_t ldz, int64_t rows, int64_t cols, int64_t r0, int64_t v0, bool first,
             bool last) {
    timed(kStepStats, 0.0, [&] { CudaBackend::stats(Z, z_dt, ldz, rows, cols, r0, v0, first, last); });
  }
  void grad(const void* Z, int32_t z_dt, int64_t ldz, void* dZ, int32_t dz_dt, int64_t lddz, int64_t rows,
            int64_t cols, int64_t r0, int64_t v0) {
    seen_grad = true;
    timed(kStepGrad, 0.0, [&] { CudaBackend::grad(Z, z_dt, ldz, dZ, dz_dt, lddz, rows, cols, r0, v0); });
  }
  void colsum(const void* dZ, int32_t dz_dt, int64_t lddz, int64_t rows, int64_t cols, float* acc, int64_t acc_stride,
              bool first, float scale = 1.f) {
    timed(kStepColsum, 0.0, [&] { CudaBackend::colsum(dZ, dz_dt, lddz, rows, cols, acc, acc_stride, first, scale); });
  }
  void convert(const float* src, int64_t ld_src, void* dst, int32_t dt, int64_t ld_dst, int64_t rows, int64_t cols) {
    timed(kStepConvert, 0.0, [&] { CudaBackend::convert(src, ld_src, dst, dt, ld_dst, rows, cols); });
  }
  void copy(void* dst, const void* src, size_t bytes) {
    timed(kStepConvert, 0.0, [&] { CudaBackend::copy(dst, src, bytes); });
  }
  void zero(void* dst, int32_t dt, int64_t ld, int64_t rows, int64_t cols) {
    timed(kStepConvert, 0.0, [&] { CudaBackend::zero(dst, dt, ld, rows, cols); });
  }
  strata_status finish_loss() {
    strata_status r = STRATA_SUCCESS;
    timed(kStepLossSum, 0.0, [&] { r = CudaBackend::finish_loss(); });
    return r;
  }
};

}  // namespace

const char* chunk_loss_step_name(int step) {
  static const char* const names[kChunkLossSteps] = {
      "count targets (+ host sync)", "logits GEMM, forward", "logits GEMM, recompute", "dH GEMM (f32 accumulate)",
      "dW GEMM", "row_stats", "row_grad", "col_sum", "convert / copy / zero", "loss_sum"};
  return step >= 0 && step < kChunkLossSteps ? names[step] : "?";
}

int chunk_loss_cuda_steps(const ChunkLossParams& p, const ChunkLossLayout& layout, void* workspace, void* stream,
                          ChunkLossCudaSteps* out) {
  if (!out) return fail(STRATA_ERROR_INVALID_VALUE, "chunk_loss_cuda_steps: out is null");
  *out = ChunkLossCudaSteps{};
  StepBackend be(p, layout, static_cast<char*>(workspace), static_cast<cudaStream_t>(stream));
  if (be.traits().overlap_stats)
    return fail(STRATA_ERROR_INVALID_VALUE,
                "chunk_loss_cuda_steps: times the default path only (unset STRATA_CHUNK_LOSS_OVERLAP)");
  strata_status st = chunk_loss_drive(p, layout, static_cast<char*>(workspace), be);
  if (st == STRATA_SUCCESS) st = be.status();
  if (st != STRATA_SUCCESS) return st;
  STRATA_CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  for (const StepBackend::Mark& m : be.marks) {
    float ms = 0.f;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, m.e0, m.e1));
    out->ms[m.step] += ms;
    out->calls[m.step] += 1;
    out->flop[m.step] += m.flop;
  }
  if (!be.marks.empty()) {
    float ms = 0.f;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, be.marks.front().e0, be.marks.back().e1));
    out->total_ms = ms;
  }
  return STRATA_SUCCESS;
}

}  // namespace strata::loss
