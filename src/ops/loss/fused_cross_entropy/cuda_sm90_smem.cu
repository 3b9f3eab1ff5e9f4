// CUDA kernel of fused_cross_entropy "cuda.sm90.cluster_smem": a row per thread-block cluster of C <= 8 CTAs
// (sm_90), each CTA's slice of the row staged once in shared memory by the bulk copy engine, so the logits
// are read from device memory exactly once and the gradient is written once: 2 x N x V x sizeof(T) bytes of
// traffic for the fused forward + gradient (the floor), N x V x sizeof(T) for the loss alone.
//
//   grid: N x C CTAs of kThreads threads (row loop beyond 2^31 - 1 CTAs), cluster (C, 1, 1); CTA rank r of
//   the cluster owning row i holds elements [r S, min((r + 1) S, V)) of the row (S = slice, a multiple of the
//   16-byte vector; S x sizeof(T) <= kMaxSliceBytes of dynamic shared memory).
//   1. Thread 0 issues one cp.async.bulk of the slice (global -> shared, completion on an mbarrier); no
//      registers are spent on loads in flight, so ~40 KB per CTA and 4-5 CTAs per SM keep ~190 KB per SM in
//      flight while the other CTAs of the SM compute.
//   2. Statistics (forward): sweep A takes the thread's maximum of the raw logits (packed bf16x2 / f16x2
//      max for 16-bit types; c is non-decreasing in s z, so max c = c(max z), min z for s < 0); sweep B adds
//      exp(c - m) (one FFMA c - m = fma(s, z, -m), one ex2.approx) and the sum of c. Thread states merge in a
//      fixed shuffle tree and a fixed warp order; the CTA's (m, S, sum c, c_y) goes to shared memory; after a
//      cluster barrier every CTA merges the C partials in rank order through distributed shared memory (the
//      same lse bits in every CTA); rank 0 writes lse and the row loss. The second cluster barrier ("done
//      reading the partials") is split: its arrive comes right after the reads, its wait only before the
//      partial is overwritten by the next row or the CTA exits, so the gradient sweep does not wait for it.
//   3. Gradient: dz = f (p_coef exp(c - lse) - uniform - [j == y] target) from shared memory, 16-byte stores
//      (in place or to dlogits). Each CTA writes only its own slice, after its own bulk copy completed, and
//      c_y comes from the shared copy of the CTA that owns it, so in place is safe.
//   The backward op (lse given) runs steps 1 and 3 only (no cluster barriers).
// "cuda.sm90.cluster_pipe" is the same kernel with kPipe: persistent clusters (as many as are resident) loop
// over rows i, i + clusters, ..., and each CTA has two slice buffers: thread 0 issues the bulk copy of the
// CTA's next row into the other buffer (read by the previous row, finished at its closing __syncthreads)
// before waiting for the current one, so a copy is always in flight while the CTA computes, merges and writes.
// Per buffer b the mbarrier completes one phase per copy; bit b of `phases` is the parity the next wait expects.
// "cuda.sm90.cluster_wide" (session 5) is cluster_smem with clusters of up to 16 CTAs (a non-portable size,
// opted into per kernel) of 128 threads and slices of ~20 KiB (V = 151936 bf16: 16 x 18.6 KiB): twice the rows
// in flight per SM, since the s4 profile showed cluster_smem latency-bound (each CTA's copy, sweeps, cluster
// barrier and gradient run back to back, and the next copy only starts when a new CTA takes the slot).
// Conditions (ce_smem_reject, at plan time; else the dispatch takes the next implementation): V and the row
// strides multiples of 16 bytes, the row (V x sizeof(T)) at most 8 x kMaxSliceBytes. At run time the base
// pointers must be 16-byte aligned (ce_smem_aligned; else the caller runs block_per_row: the same math).
// ce_count / ce_reduce (cuda_sm90.cu) run before and after as for the other kernels.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "opbase/dtype.h"
#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"
#include "tile/cuda/check.cuh"

namespace cg = cooperative_groups;

namespace strata::loss {
namespace {

constexpr int kSmemThreads = 256;   // cluster_smem: 4-5 CTAs per SM
constexpr int kPipeThreads = 512;   // cluster_pipe: 2 CTAs per SM (two slices each)
constexpr int kWideThreads = 128;   // cluster_wide: ~10 CTAs per SM
constexpr int kMaxCluster = 8;                  // portable cluster size
constexpr int kMaxWideCluster = 16;             // non-portable (sm_90 allows 16 with the attribute)
constexpr int64_t kTargetSliceBytes = 40 << 10;  // 5 CTAs per SM (228 KiB of shared memory per SM)
constexpr int64_t kWideTargetSliceBytes = 20 << 10;  // cluster_wide: 10 CTAs per SM
constexpr int64_t kMaxSliceBytes = 100 << 10;    // 2 CTAs per SM: rows up to 800 KiB (bf16 V <= 409600)
constexpr int64_t kMaxWideSliceBytes = 40 << 10;  // cluster_wide: rows up to 640 KiB (5+ CTAs per SM)

template <class T>
struct Vec16 {
  static constexpr int n = 16 / static_cast<int>(sizeof(T));
};

// 16 bytes -> kVec floats.
template <class T>
__device__ __forceinline__ void unpack(const uint4& u, float (&v)[Vec16<T>::n]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __uint_as_float(w[k]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (std::is_same_v<T, bf16_t>) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
        v[2 * k] = f.x, v[2 * k + 1] = f.y;
      }
    }
  }
}

template <class T>
__device__ __forceinline__ uint4 pack(const float (&v)[Vec16<T>::n]) {
  if constexpr (std::is_same_v<T, float>) {
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (std::is_same_v<T, bf16_t>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Running max (neg = false) or min (neg = true) of the raw logits of one 16-byte vector. 16-bit types keep
// four packed pairs (one HMNMX2 per pair; NaN inputs are skipped like fmaxf does); f32 one float.
template <class T>
struct RawExt {
  uint32_t w[4];  // 16-bit types: 4 packed pairs
  float f;        // f32
};

template <class T>
__device__ __forceinline__ void ext_init(RawExt<T>& e, bool neg) {
  if constexpr (std::is_same_v<T, float>) {
    e.f = neg ? INFINITY : -INFINITY;
  } else {
    // +-inf in both halves: bf16 0x7f80 / 0xff80, f16 0x7c00 / 0xfc00.
    const uint32_t h = std::is_same_v<T, bf16_t> ? (neg ? 0x7f80u : 0xff80u) : (neg ? 0x7c00u : 0xfc00u);
#pragma unroll
    for (int k = 0; k < 4; ++k) e.w[k] = h | (h << 16);
  }
}

template <class T>
__device__ __forceinline__ void ext_add(RawExt<T>& e, const uint4& u, bool neg) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) e.f = neg ? fminf(e.f, __uint_as_float(w[k])) : fmaxf(e.f, __uint_as_float(w[k]));
  } else if constexpr (std::is_same_v<T, bf16_t>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&e.w[k]);
      const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&w[k]);
      const __nv_bfloat162 r = neg ? __hmin2(a, b) : __hmax2(a, b);
      e.w[k] = *reinterpret_cast<const uint32_t*>(&r);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __half2 a = *reinterpret_cast<const __half2*>(&e.w[k]);
      const __half2 b = *reinterpret_cast<const __half2*>(&w[k]);
      const __half2 r = neg ? __hmin2(a, b) : __hmax2(a, b);
      e.w[k] = *reinterpret_cast<const uint32_t*>(&r);
    }
  }
}

template <class T>
__device__ __forceinline__ float ext_result(const RawExt<T>& e, bool neg) {
  if constexpr (std::is_same_v<T, float>) {
    return e.f;
  } else {
    float v[8];
    unpack<T>(make_uint4(e.w[0], e.w[1], e.w[2], e.w[3]), v);
    float r = v[0];
#pragma unroll
    for (int q = 1; q < 8; ++q) r = neg ? fminf(r, v[q]) : fmaxf(r, v[q]);
    return r;
  }
}

// Partial statistics of a thread / CTA: running max and rescaled sum of exp, sum of c, c_y (0 except where
// the target element is).
struct Part {
  float m, s, sum_c, c_y;
};

__device__ __forceinline__ Part merge(Part a, const Part& b) {
  OnlineLse x{a.m, a.s};
  lse_add_block(x, b.m, b.s);
  a.m = x.m;
  a.s = x.s;
  a.sum_c += b.sum_c;
  a.c_y += b.c_y;
  return a;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Thread 0: the bulk copy of `bytes` (a multiple of 16, < 2^20) from global src to shared dst, completing on bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  // Earlier generic-proxy reads of dst (the previous row) are ordered before the async-proxy write.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

// kPipe = false (cluster_smem): one slice buffer; a CTA normally owns one row (grid = N clusters) and its
// copy is issued when the row starts. kPipe = true (cluster_pipe): persistent clusters (as many as are
// resident) loop over rows with two slice buffers: the bulk copy of the CTA's next row is issued before the
// current row is processed, so every CTA always has a copy in flight while it computes.
template <class T, bool kGrad, bool kCap, int kThr, bool kPipe>
__global__ void __launch_bounds__(kThr) ce_smem_rows(const CeParams p, int C, int64_t slice) {
  constexpr int kVec = Vec16<T>::n;
  constexpr int kThreads = kThr;
  constexpr int kWarps = kThr / 32;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2];
  __shared__ Part warp_part[kWarps];
  __shared__ Part cta_part;  // read by the other CTAs of the cluster
  __shared__ float row_lse;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const CeConsts& k = p.k;
  const int64_t V = p.V;
  const bool fwd = !p.backward;
  const bool neg = k.scale < 0.f;
  const int64_t lo = rank * slice, hi = lo + slice < V ? lo + slice : V;
  const int64_t n = hi > lo ? hi - lo : 0;  // elements of this CTA's slice (a multiple of kVec)
  const int nv = static_cast<int>(n / kVec);
  const int64_t count = (kGrad && p.reduction == kCeMean) ? *ce_count_slot(p) : 0;
  const uint32_t bytes = static_cast<uint32_t>(n * sizeof(T));
  const int64_t slice_bytes = slice * static_cast<int64_t>(sizeof(T));  // buffer 1 at this offset (16-byte multiple)
  auto row_src = [&](int64_t r) { return static_cast<const T*>(p.logits) + r * p.logits_rs + lo; };
  if (threadIdx.x == 0) {
    mbar_init(&bars[0]);
    if (kPipe) mbar_init(&bars[1]);
  }
  __syncthreads();
  uint32_t phases = 0;   // bit b: the parity the next wait on bars[b] expects
  int b = 0;             // the buffer of the current row (always 0 without kPipe)
  bool pending = false;  // the cluster barrier "partials read" was arrived at but not yet waited for
  const int64_t clusters = gridDim.x / C;
  if (kPipe && n > 0 && threadIdx.x == 0 && blockIdx.x / C < p.N)
    bulk_load(smem_raw, row_src(blockIdx.x / C), bytes, &bars[0]);
  for (int64_t i = blockIdx.x / C; i < p.N; i += clusters) {
    const unsigned char* sbuf = smem_raw + (kPipe ? b * slice_bytes : 0);
    const uint4* buf = reinterpret_cast<const uint4*>(sbuf);
    const int64_t y = ce_target(p, i);
    const bool ignored = y == k.ignore_index;
    const bool bad = !ignored && (y < 0 || y >= V);
    if (n > 0) {
      if (threadIdx.x == 0) {
        if (kPipe) {
          // The other buffer was last read by the previous row, finished at the __syncthreads ending it.
          if (i + clusters < p.N) bulk_load(smem_raw + (b ^ 1) * slice_bytes, row_src(i + clusters), bytes, &bars[b ^ 1]);
        } else {
          bulk_load(smem_raw, row_src(i), bytes, &bars[0]);
        }
      }
      mbar_wait(&bars[b], (phases >> b) & 1u);
      phases ^= 1u << b;
    }
    float lse;
    if (fwd) {
      // Sweep A: the thread's extreme raw logit -> m = c(extreme).
      RawExt<T> ext;
      ext_init(ext, neg);
      for (int v = threadIdx.x; v < nv; v += kThreads) ext_add(ext, buf[v], neg);
      // Empty slice: zext = -inf (s > 0) or +inf (s < 0), so m = -inf. NaN logits are skipped by the max (as
      // fmaxf does) and reach the sum through the thread's other elements (a thread whose elements are all
      // NaN adds nothing).
      const float zext = ext_result(ext, neg);
      Part a{ce_logit(k, zext), 0.f, 0.f, 0.f};
      // Sweep B: sum exp(c - m) and sum c (threads whose elements are all -inf in c add nothing, as in
      // block_per_row: -inf - -inf would be NaN).
      if (a.m != -INFINITY) {
        float s0 = 0.f, s1 = 0.f, c0 = 0.f, c1 = 0.f;
        for (int v = threadIdx.x; v < nv; v += kThreads) {
          float x[kVec];
          unpack<T>(buf[v], x);
#pragma unroll
          for (int q = 0; q < kVec; ++q) {
            float c, d;
            if constexpr (kCap) {
              c = ce_logit(k, x[q]);
              d = c - a.m;
            } else {
              c = x[q];                       // raw logits summed; scaled once below
              d = fmaf(k.scale, x[q], -a.m);  // one rounding of s z - m
            }
            if (q & 1) s1 += __expf(d), c1 += c;
            else s0 += __expf(d), c0 += c;
          }
        }
        a.s = s0 + s1;
        a.sum_c = kCap ? c0 + c1 : k.scale * (c0 + c1);
      }
      if (threadIdx.x == 0 && !ignored && !bad && y >= lo && y < hi) {
        const T* row = reinterpret_cast<const T*>(sbuf);
        a.c_y = ce_logit(k, to_f32(row[y - lo]));
      }
      // Merge: warps (fixed tree), CTA (fixed order), cluster (rank order).
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        Part b;
        b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
        b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
        b.sum_c = __shfl_xor_sync(0xffffffffu, a.sum_c, o);
        b.c_y = __shfl_xor_sync(0xffffffffu, a.c_y, o);
        a = merge(a, b);
      }
      if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x >> 5] = a;
      if (pending) __cluster_barrier_wait();  // every CTA has read the previous row's partial
      __syncthreads();
      if (threadIdx.x == 0) {
        Part r = warp_part[0];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) r = merge(r, warp_part[w]);
        cta_part = r;
      }
      __cluster_barrier_arrive();  // release: cta_part is visible to the cluster
      __cluster_barrier_wait();
      if (threadIdx.x < 32) {
        // Lane q < C reads rank q's partial (the C remote loads in parallel); every lane then merges them in
        // rank order from shuffles, so the result is the same as a sequential merge and the same in every CTA.
        const int lane = static_cast<int>(threadIdx.x);
        Part mine{-INFINITY, 0.f, 0.f, 0.f};
        if (lane < C) mine = *cluster.map_shared_rank(&cta_part, lane);
        Part r;
        r.m = __shfl_sync(0xffffffffu, mine.m, 0);
        r.s = __shfl_sync(0xffffffffu, mine.s, 0);
        r.sum_c = __shfl_sync(0xffffffffu, mine.sum_c, 0);
        r.c_y = __shfl_sync(0xffffffffu, mine.c_y, 0);
        for (int q = 1; q < C; ++q) {
          Part b;
          b.m = __shfl_sync(0xffffffffu, mine.m, q);
          b.s = __shfl_sync(0xffffffffu, mine.s, q);
          b.sum_c = __shfl_sync(0xffffffffu, mine.sum_c, q);
          b.c_y = __shfl_sync(0xffffffffu, mine.c_y, q);
          r = merge(r, b);
        }
        if (lane == 0) {
          CeRowStats st;
          st.lse.m = r.m;
          st.lse.s = r.s;
          st.sum_c = r.sum_c;
          st.c_y = r.c_y;
          const float l = ce_lse(st.lse);
          row_lse = l;
          if (rank == 0) {
            const float loss = ignored ? 0.f : (bad ? __int_as_float(0x7fc00000) : ce_row_loss(k, st, V));
            const float zl = ignored ? 0.f : ce_row_z_loss(k, l);
            if (p.lse) static_cast<float*>(p.lse)[i * p.lse_stride] = l;
            if (p.reduction == kCeNone) {
              static_cast<float*>(p.loss)[i * p.loss_stride] = loss;
              if (p.z_loss) static_cast<float*>(p.z_loss)[i * p.z_stride] = zl;
            } else {
              float* rows = static_cast<float*>(p.workspace);
              rows[i] = loss;
              rows[p.N + i] = zl;
            }
          }
        }
      }
      __cluster_barrier_arrive();  // this CTA is done reading the partials (its wait comes later)
      pending = true;
      __syncthreads();
      lse = row_lse;
    } else {
      lse = static_cast<const float*>(p.lse_in)[i * p.lse_in_stride];
    }
    if constexpr (kGrad) {
      uint4* dz = reinterpret_cast<uint4*>(static_cast<T*>(p.dlogits) + i * p.dlogits_rs + lo);
      if (ignored || bad) {
        float nan[kVec];
#pragma unroll
        for (int q = 0; q < kVec; ++q) nan[q] = __int_as_float(0x7fc00000);
        const uint4 fill = bad ? pack<T>(nan) : make_uint4(0u, 0u, 0u, 0u);
        for (int v = threadIdx.x; v < nv; v += kThreads) dz[v] = fill;
      } else {
        const float g = ce_upstream(p, i, count);
        const CeGradRow gr = ce_grad_row(k, lse, g);
        const int64_t yv = y - lo;  // the target's index in this slice (outside [0, n) if elsewhere)
        for (int v = threadIdx.x; v < nv; v += kThreads) {
          float x[kVec];
          unpack<T>(buf[v], x);
#pragma unroll
          for (int q = 0; q < kVec; ++q) {
            float d, f = 1.f;
            if constexpr (kCap) {
              const float t = ce_tanh(k.scale * x[q] * k.inv_cap);
              d = k.cap * t - gr.lse;
              f = 1.f - t * t;
            } else {
              d = fmaf(k.scale, x[q], -gr.lse);
            }
            x[q] = f * fmaf(gr.p_coef, __expf(d), -gr.uniform);
          }
          const int64_t off = yv - static_cast<int64_t>(v) * kVec;
          if (off >= 0 && off < kVec) {  // the target's vector: subtract f_y (1 - eps) g s
#pragma unroll
            for (int q = 0; q < kVec; ++q) {
              if (q == off) {
                float f = 1.f;
                if constexpr (kCap) {
                  const float t = ce_tanh(k.scale * to_f32(reinterpret_cast<const T*>(sbuf)[yv]) * k.inv_cap);
                  f = 1.f - t * t;
                }
                x[q] -= f * gr.target;
              }
            }
          }
          dz[v] = pack<T>(x);
        }
      }
    }
    __syncthreads();  // the buffer and row_lse are reused by a later row of this CTA
    if (kPipe) b ^= 1;
  }
  if (pending) __cluster_barrier_wait();  // no CTA leaves while another may still read its partial
}

// Smallest cluster whose slices fit kTargetSliceBytes (with 8 CTAs: up to kMaxSliceBytes, ce_smem_reject).
struct Split {
  int C = 0;
  int64_t slice = 0;  // elements, a multiple of the 16-byte vector
};

Split split_of(int64_t V, int32_t dtype, int max_cluster, int64_t target_slice_bytes) {
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  const int64_t vec = 16 / es;
  const int64_t nvec = V / vec;
  const int64_t bytes = V * es;
  // Powers of two (1, 2, 4, 8; 16 for cluster_wide).
  int64_t C = 1;
  while (C < max_cluster && C * target_slice_bytes < bytes) C *= 2;
  Split s;
  s.C = static_cast<int>(C);
  s.slice = ((nvec + C - 1) / C) * vec;
  return s;
}

// cudaOccupancyMaxActiveClusters for (device, kernel, dynamic shared memory, cluster size), cached: the query
// costs host time on every call otherwise. 0 when the query fails (the caller then keeps one cluster per row).
int resident_clusters(const void* kernel, const cudaLaunchConfig_t& cfg, int C) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  using Key = std::tuple<int, const void*, size_t, int>;
  static std::mutex mu;
  static std::map<Key, int> cache;
  const Key key{dev, kernel, cfg.dynamicSmemBytes, C};
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so that the launch check does not report it
    n = 0;
  }
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = n;
  return n;
}

template <class T, bool kGrad, bool kCap, CeSmemKind kKind>
strata_status launch(const CeParams& p, const Split& sp, cudaStream_t stream) {
  constexpr bool kPipe = kKind == CeSmemKind::kPipe;
  constexpr int kThr = kPipe ? kPipeThreads : (kKind == CeSmemKind::kWide ? kWideThreads : kSmemThreads);
  const size_t smem = static_cast<size_t>(sp.slice) * sizeof(T) * (kPipe ? 2 : 1);
  auto* kernel = ce_smem_rows<T, kGrad, kCap, kThr, kPipe>;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  if (sp.C > kMaxCluster)  // 16-CTA clusters (cluster_wide) are a non-portable size: opt in
    STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  // One cluster per row up to 2^31 - 1 CTAs in all (the row loop covers the rest).
  const int64_t max_clusters = ((int64_t{1} << 31) - 1) / sp.C;
  int64_t clusters = p.N < max_clusters ? p.N : max_clusters;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * sp.C), 1, 1);
  cfg.blockDim = dim3(kThr, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(sp.C);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (kPipe) {
    // Persistent: as many clusters as are resident at once (each loops over rows i, i + clusters, ...). The
    // count only sizes the grid: any count gives the same results (rows are independent). The whole shared
    // memory carveout, so that 3 CTAs of 2 x 37 KiB fit per SM at V = 151936 bf16.
    STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         static_cast<int>(cudaSharedmemCarveoutMaxShared)));
    const int resident = resident_clusters(reinterpret_cast<const void*>(kernel), cfg, sp.C);
    if (resident > 0 && resident < clusters) clusters = resident;
    cfg.gridDim = dim3(static_cast<unsigned>(clusters * sp.C), 1, 1);
  }
  STRATA_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, p, sp.C, sp.slice));
  return STRATA_SUCCESS;
}

template <class T, bool kGrad, CeSmemKind kKind>
strata_status launch_cap(const CeParams& p, const Split& sp, cudaStream_t stream) {
  return p.k.softcap_on ? launch<T, kGrad, true, kKind>(p, sp, stream) : launch<T, kGrad, false, kKind>(p, sp, stream);
}

template <class T, CeSmemKind kKind>
strata_status launch_t(const CeParams& p, const Split& sp, cudaStream_t stream) {
  return p.dlogits ? launch_cap<T, true, kKind>(p, sp, stream) : launch_cap<T, false, kKind>(p, sp, stream);
}

template <class T>
strata_status launch_kind(const CeParams& p, const Split& sp, CeSmemKind kind, cudaStream_t stream) {
  switch (kind) {
    case CeSmemKind::kPipe: return launch_t<T, CeSmemKind::kPipe>(p, sp, stream);
    case CeSmemKind::kWide: return launch_t<T, CeSmemKind::kWide>(p, sp, stream);
    default: return launch_t<T, CeSmemKind::kSmem>(p, sp, stream);
  }
}

Split split_for(const CeParams& p, CeSmemKind kind) {
  return kind == CeSmemKind::kWide ? split_of(p.V, p.dtype, kMaxWideCluster, kWideTargetSliceBytes)
                                   : split_of(p.V, p.dtype, kMaxCluster, kTargetSliceBytes);
}

}  // namespace

std::string ce_smem_reject(const CeParams& p, CeSmemKind kind) {
  const bool pipelined = kind == CeSmemKind::kPipe;
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(p.dtype));
  if (p.V == 0) return "V = 0 (nothing to stage)";
  if (p.V % vec != 0 || p.logits_rs % vec != 0 || p.dlogits_rs % vec != 0)
    return "needs V and the row strides to be multiples of 16 bytes";
  if (p.V * static_cast<int64_t>(dtype_size(p.dtype)) > int64_t{kMaxCluster} * kMaxSliceBytes)
    return "rows longer than 8 CTAs x 100 KiB of shared memory";
  if (pipelined && p.V * static_cast<int64_t>(dtype_size(p.dtype)) > int64_t{kMaxCluster} * kTargetSliceBytes)
    return "rows longer than 8 CTAs x 40 KiB (two larger slice buffers would leave 1-2 CTAs per SM; "
           "cuda.sm90.cluster_smem takes them)";
  if (kind == CeSmemKind::kWide &&
      split_for(p, kind).slice * static_cast<int64_t>(dtype_size(p.dtype)) > kMaxWideSliceBytes)
    return "rows longer than 16 CTAs x 40 KiB (cuda.sm90.cluster_smem takes them)";
  return {};
}

bool ce_smem_aligned(const CeParams& p) {
  const auto a = reinterpret_cast<uintptr_t>(p.logits) | reinterpret_cast<uintptr_t>(p.dlogits);
  return a % 16 == 0;
}

int fused_cross_entropy_cuda_smem(const CeParams& p, void* stream_ptr, CeSmemKind kind) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  STRATA_RETURN_IF_ERROR(ce_launch_count(p, stream_ptr));
  if (p.N > 0 && (!p.backward || p.dlogits)) {
    const Split sp = split_for(p, kind);
    strata_status s;
    switch (p.dtype) {
      case STRATA_DTYPE_F32: s = launch_kind<float>(p, sp, kind, stream); break;
      case STRATA_DTYPE_BF16: s = launch_kind<bf16_t>(p, sp, kind, stream); break;
      default: s = launch_kind<f16_t>(p, sp, kind, stream); break;
    }
    STRATA_RETURN_IF_ERROR(s);
    STRATA_RETURN_IF_ERROR(cuda::check_launch("fused_cross_entropy (ce_smem_rows)"));
  }
  return ce_launch_reduce(p, stream_ptr);
}

}  // namespace strata::loss
