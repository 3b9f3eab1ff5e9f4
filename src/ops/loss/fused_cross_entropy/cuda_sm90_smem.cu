// CUDA kernels of fused_cross_entropy "cuda.sm90.cluster_smem" and "cuda.sm90.cluster_chunked": a row per
// thread-block cluster of C <= 8 CTAs (sm_90), each CTA's slice of the row staged once in shared memory by the
// bulk copy engine, so the logits are read from device memory exactly once and the gradient is written once:
// 2 x N x V x sizeof(T) bytes of traffic for the fused forward + gradient (the floor), N x V x sizeof(T) for
// the loss alone.
//
//   grid: N x C CTAs of 256 threads (row loop beyond 2^31 - 1 CTAs), cluster (C, 1, 1); CTA rank r of the
//   cluster owning row i holds elements [r S, min((r + 1) S, V)) of the row (S = slice, a multiple of the
//   16-byte vector; S x sizeof(T) <= kMaxSliceBytes of dynamic shared memory).
//   1. Thread 0 issues the bulk copies of the slice (global -> shared, completion on mbarriers): one copy
//      (cluster_smem) or kChunks copies of consecutive pieces, one mbarrier each (cluster_chunked). No
//      registers are spent on loads in flight, so ~40 KB per CTA and 4-5 CTAs per SM keep ~190 KB per SM in
//      flight while the other CTAs of the SM compute.
//   2. Statistics (forward), per piece as it lands (cluster_smem: the one piece, after the whole copy): sweep A
//      takes the thread's maximum of the piece's raw logits (packed bf16x2 / f16x2 max for 16-bit types; c is
//      non-decreasing in s z, so max c = c(max z), min z for s < 0); the thread's running (m, S) is rescaled
//      once when the piece raises m; sweep B adds exp(c - m) (one FFMA c - m = fma(s, z, -m), one ex2.approx;
//      cluster_chunked uses its flush-to-zero form, 2 instructions instead of 6: piece_exp) and, with label
//      smoothing only, the sum of c. Thread states merge in a fixed shuffle tree and a fixed warp order; the
//      CTA's (m, S, sum c, c_y) goes to shared memory; after a cluster barrier every CTA merges the C partials
//      in rank order through distributed shared memory (the same lse bits in every CTA); rank 0 writes lse and
//      the row loss. The second cluster barrier ("done reading the partials") is split:
//      its arrive comes right after the reads, its wait only before the partial is overwritten by the next row
//      or the CTA exits, so the gradient sweep does not wait for it.
//   3. Gradient: dz = f (p_coef exp(c - lse) - uniform - [j == y] target) from shared memory, 16-byte stores
//      (in place or to dlogits). Each CTA writes only its own slice, after its own bulk copies completed, and
//      c_y comes from the shared copy of the CTA that owns it, so in place is safe.
//   The backward op (lse given) runs steps 1 and 3 only (no cluster barriers; cluster_chunked starts each
//   piece's gradient as soon as that piece has landed).
// Why cluster_chunked (session 6): the backward op, which is copy + gradient, streams at 93 % of the copy
// bandwidth, while the fused forward + gradient reached 68 %: in cluster_smem a CTA holds its shared memory
// through copy -> sweeps -> cluster barrier -> gradient back to back, and its statistics sweeps start only once
// its whole slice has landed. Pieces let the sweeps of the first pieces run under the copy of the later ones.
// Conditions (ce_smem_reject, at plan time; else the dispatch takes the next implementation): V and the row
// strides multiples of 16 bytes, the row (V x sizeof(T)) at most 8 x kMaxSliceBytes. At run time the base
// pointers must be 16-byte aligned (ce_smem_aligned; else the caller runs block_per_row: the same math).
// ce_count / ce_reduce (cuda_sm90.cu) run before and after as for the other kernels.
// Removed in session 6 (slower on the H200 at every shape timed; README.md): cluster_pipe (persistent clusters,
// two slice buffers per CTA) and cluster_wide (16-CTA clusters of 128 threads).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "opbase/dtype.h"
#include "ops/loss/fused_cross_entropy/cuda_common.cuh"
#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/fast_math.cuh"

namespace cg = cooperative_groups;

namespace strata::loss {
namespace {

constexpr int kThreads = 256;                    // 4-5 CTAs per SM
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 8;                   // portable cluster size
constexpr int64_t kTargetSliceBytes = 40 << 10;  // 5 CTAs per SM (228 KiB of shared memory per SM)
// cluster_stored_exp_wide (session 7, the default s7run2-s12: 1.426 ms fused in place bf16 [8192, 151936]
// against 1.578 with 40 KiB slices and cluster_smem's 1.716): twice the slice, half the CTAs per row (bf16
// V = 151936: clusters of 4, 74 KiB slices, 3 CTAs per SM), half the cluster barriers and CTA launches. Its split
// is the default's (cluster_stored_exp_pf16) since session 13.
constexpr int64_t kWideSliceBytes = 80 << 10;
// cluster_stored_exp_pf16 (session 13, the default): each CTA also prefetches into L2 its slice of the row this many
// rows ahead. s13run1 (H200, bf16 [8192, 151936] fused in place, same run): 16 rows ahead 1.3934 ms, none (the
// session-7 kernel) 1.4277, 48 rows ahead 1.5092 (the prefetched rows no longer fit beside the rows in flight).
constexpr int kPrefetchRows = 16;
constexpr int64_t kMaxSliceBytes = 100 << 10;    // 2 CTAs per SM: rows up to 800 KiB (bf16 V <= 409600)
constexpr int kChunks = 4;                       // cluster_chunked: pieces per slice (~9 KiB at V = 151936 bf16)

using ce_cuda::pack;
using ce_cuda::unpack;

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
    ce_cuda::unpack<T>(make_uint4(e.w[0], e.w[1], e.w[2], e.w[3]), v);
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

__device__ __forceinline__ Part shfl_xor(const Part& a, int o) {
  return {__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o),
          __shfl_xor_sync(0xffffffffu, a.sum_c, o), __shfl_xor_sync(0xffffffffu, a.c_y, o)};
}

__device__ __forceinline__ Part shfl(const Part& a, int lane) {
  return {__shfl_sync(0xffffffffu, a.m, lane), __shfl_sync(0xffffffffu, a.s, lane),
          __shfl_sync(0xffffffffu, a.sum_c, lane), __shfl_sync(0xffffffffu, a.c_y, lane)};
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

// Thread 0: ask the L2 for `bytes` (a multiple of 16) of global memory from src (no completion to wait for).
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
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

// exp(d) of the element sweeps (d <= 0). kFtz = false: __expf (ex2.approx of d log2 e with the four extra
// instructions that keep results below 2^-126 as denormals: cluster_smem). kFtz = true: ex2.approx.ftz, two
// instructions (FMUL, MUFU.EX2; cluster_chunked): results below 2^-126 flush to 0, which changes nothing that
// matters (S >= 1 is a sum of such terms; a gradient element below 1e-38 rounds to 0 or a denormal either way).
template <bool kFtz>
__device__ __forceinline__ float piece_exp(float d) {
  if constexpr (kFtz) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d * 1.4426950408889634f));
    return r;
  } else {
    return __expf(d);
  }
}

// Sweep B over the thread's vectors of a piece, [v0 + threadIdx.x, v1) in steps of kThreads: adds
// sum exp(c - m) to s and, with kSum (label smoothing), sum c to sc (raw z without softcap: scaled once by the
// caller). Two partial sums each (even / odd elements) for instruction-level parallelism.
template <class T, bool kCap, bool kSum, bool kFtz>
__device__ __forceinline__ void sum_piece(const uint4* buf, int v0, int v1, const CeConsts& k, float m, float& s,
                                          float& sc) {
  constexpr int kVec = ce_cuda::kVec<T>;
  float s0 = 0.f, s1 = 0.f, c0 = 0.f, c1 = 0.f;
  for (int v = v0 + static_cast<int>(threadIdx.x); v < v1; v += kThreads) {
    float x[kVec];
    unpack<T>(buf[v], x);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      float c, d;
      if constexpr (kCap) {
        c = ce_logit(k, x[e]);
        d = c - m;
      } else {
        c = x[e];                     // raw logits summed; scaled once by the caller
        d = fmaf(k.scale, x[e], -m);  // one rounding of s z - m
      }
      if (e & 1) {
        s1 += piece_exp<kFtz>(d);
        if constexpr (kSum) c1 += c;
      } else {
        s0 += piece_exp<kFtz>(d);
        if constexpr (kSum) c0 += c;
      }
    }
  }
  s += s0 + s1;
  sc += c0 + c1;
}

// cluster_stored_exp: the storage type of e = exp(c - m_t) in the slice: f16 for bf16 logits (e <= 1; 11
// significant bits, 3 more than the bf16 gradient keeps), f32 for f32 logits (f16 logits do not use it).
template <class T>
using StoredExp = std::conditional_t<std::is_same_v<T, float>, float, f16_t>;

// Sweep B of cluster_stored_exp (one piece, no softcap): as sum_piece<kFtz = true>, and each vector's
// e = exp(s z - m_t) (m_t: this thread's maximum) is written back over the logits it came from, as
// StoredExp<T>. The vectors are the ones this thread sweeps in the gradient too, so no other thread reads
// them. The thread that owns the target's vector (yv: the target's index in the slice, or out of range) takes
// c_y = s z_y before overwriting it.
template <class T, bool kSum>
__device__ __forceinline__ void sum_store(uint4* buf, int nv, const CeConsts& k, float m, int64_t yv, float& s,
                                          float& sc, float& c_y) {
  constexpr int kVec = ce_cuda::kVec<T>;
  float s0 = 0.f, s1 = 0.f, c0 = 0.f, c1 = 0.f;
  for (int v = static_cast<int>(threadIdx.x); v < nv; v += kThreads) {
    float x[kVec];
    unpack<T>(buf[v], x);
    const int64_t off = yv - static_cast<int64_t>(v) * kVec;
    if (off >= 0 && off < kVec) {
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (e == off) c_y = k.scale * x[e];
    }
    float ex[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      ex[e] = piece_exp<true>(fmaf(k.scale, x[e], -m));
      if (e & 1) {
        s1 += ex[e];
        if constexpr (kSum) c1 += x[e];
      } else {
        s0 += ex[e];
        if constexpr (kSum) c0 += x[e];
      }
    }
    buf[v] = pack<StoredExp<T>>(ex);
  }
  s += s0 + s1;
  sc += c0 + c1;
}

// One row per cluster (grid = N clusters up to 2^31 - 1 CTAs; beyond, clusters loop over rows). kPieces = 1:
// cluster_smem (bit-identical to its session-5 form); kPieces = kChunks: cluster_chunked. kStore (kPieces = 1,
// no softcap, bf16/f32, the fused forward): cluster_stored_exp, the exponentials of the statistics sweep kept
// in the slice (sum_store) so that the gradient sweep computes none: per element one conversion, one FFMA and
// half a pack instead of an FFMA, an FMUL, an ex2 and the pack (session 7; the backward op, which has no
// statistics sweep, runs the kPieces = 1 gradient). (Session 9's cluster_stored_exp_bulk, whose gradient was
// written over the slice and stored by one bulk copy per CTA, ran 1.513 ms against 1.436 in s9run2: removed.)
// (Session 12 removed after s12run1: the first bulk copy issued before the block barrier, 1.4487 ms, and the
// gradient stored with st.global.cs, 1.4352, against the default's 1.4234; README.md.)
// prefetch > 0 (cluster_stored_exp_pf16: kPrefetchRows): thread 0 also asks the L2 for this CTA's slice of row
// i + prefetch (cp.async.bulk.prefetch.L2), so that the DRAM reads run ahead of the 3 slots per SM (which each hold
// their slice through statistics, cluster barrier and gradient) and a later CTA's copy lands from L2. It only reads:
// in place, a prefetch that comes after that row's gradient was written caches the gradient, changing nothing.
// (Session 13 removed after s13run1: cluster_stored_exp_merge, the cluster merge without block barriers, 1.4242 ms
// against 1.4277: within noise; the LoadBalancing / Spread cluster scheduling policies, 1.4474 / 1.4272; 48 rows
// ahead, 1.5092. README.md.)
template <class T, bool kGrad, bool kCap, int kPieces, bool kStore = false>
__global__ void __launch_bounds__(kThreads) ce_smem_rows(const CeParams p, int C, int64_t slice, int prefetch) {
  static_assert(!kStore || (kGrad && !kCap && kPieces == 1 && !std::is_same_v<T, f16_t>),
                "cluster_stored_exp: fused gradient, no softcap, one piece, bf16/f32");
  constexpr int kVec = ce_cuda::kVec<T>;
  constexpr bool kFtz = kPieces > 1 || kStore;  // the two-instruction exponential (piece_exp)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[kPieces];
  __shared__ Part warp_part[kWarps];
  __shared__ Part cta_part;  // read by the other CTAs of the cluster
  __shared__ float row_lse;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const CeConsts& k = p.k;
  const int64_t V = p.V;
  const bool fwd = !p.backward;
  const bool neg = k.scale < 0.f;
  const bool smooth = k.eps != 0.f;  // sum c only enters the loss with label smoothing (ce_row_loss)
  const int64_t lo = rank * slice, hi = lo + slice < V ? lo + slice : V;
  const int64_t n = hi > lo ? hi - lo : 0;  // elements of this CTA's slice (a multiple of kVec)
  const int nv = static_cast<int>(n / kVec);
  // Piece q holds vectors [q pv, min((q + 1) pv, nv)); pieces past nv are empty (no copy, no wait).
  const int pv = (nv + kPieces - 1) / kPieces;
  const int pieces = pv > 0 ? (nv + pv - 1) / pv : 0;
  const int64_t count = (kGrad && p.reduction == kCeMean) ? *ce_count_slot(p) : 0;
  // The fused forward writes no gradient when any target is bad (the count's bad count, met only under CUDA graph
  // capture; in place the logits stay as they were). The forward waits for every piece in its statistics, so
  // skipping the gradient sweep keeps the barrier phases balanced; the backward op (which waits in the gradient
  // sweep) is never skipped.
  const bool grad = kGrad && (!fwd || *ce_bad_slot(p) == 0);
  const uint4* buf = reinterpret_cast<const uint4*>(smem_raw);
  uint4* wbuf = reinterpret_cast<uint4*>(smem_raw);  // kStore: the exponentials written over the logits
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < kPieces; ++q) mbar_init(&bars[q]);
  }
  __syncthreads();
  uint32_t phase = 0;    // the parity the next wait on every piece's barrier expects (one phase per row)
  bool pending = false;  // the cluster barrier "partials read" was arrived at but not yet waited for
  const int64_t clusters = gridDim.x / C;
  for (int64_t i = blockIdx.x / C; i < p.N; i += clusters) {
    const int64_t y = ce_target(p, i);
    const bool ignored = y == k.ignore_index;
    const bool bad = !ignored && (y < 0 || y >= V);
    if (threadIdx.x == 0) {
      // The buffer was last read by the previous row, finished at the __syncthreads ending it.
      const T* src = static_cast<const T*>(p.logits) + i * p.logits_rs + lo;
      for (int q = 0; q < pieces; ++q) {
        const int v0 = q * pv, v1 = v0 + pv < nv ? v0 + pv : nv;
        bulk_load(smem_raw + static_cast<int64_t>(v0) * 16, src + static_cast<int64_t>(v0) * kVec,
                  static_cast<uint32_t>(v1 - v0) * 16u, &bars[q]);
      }
      if (prefetch > 0 && i + prefetch < p.N && nv > 0)
        bulk_prefetch_l2(src + prefetch * p.logits_rs, static_cast<uint32_t>(nv) * 16u);
    }
    float lse;
    float m_t = -INFINITY;  // kStore: this thread's maximum, the reference of its stored exponentials
    if (fwd) {
      // Per piece: wait for it, sweep A (the thread's extreme raw logit -> the piece's m_q = c(extreme)),
      // rescale the running sum when m_q raises m, sweep B (sum exp(c - m), and sum c with smoothing).
      // Empty pieces and slices: zext = -inf (s > 0) or +inf (s < 0), so m_q = -inf. NaN logits are skipped
      // by the max (as fmaxf does) and reach the sum once the thread has any other element (a thread whose
      // elements so far are all NaN adds nothing for them, as in cluster_smem). Threads whose elements so far
      // are all -inf in c add nothing (as in block_per_row: -inf - -inf would be NaN).
      float m = -INFINITY, s = 0.f, sc = 0.f;
      float c_y_own = 0.f;  // kStore: c_y, taken by the thread that owns the target's vector
      for (int q = 0; q < pieces; ++q) {
        const int v0 = q * pv, v1 = v0 + pv < nv ? v0 + pv : nv;
        mbar_wait(&bars[q], phase);
        RawExt<T> ext;
        ext_init(ext, neg);
        for (int v = v0 + threadIdx.x; v < v1; v += kThreads) ext_add(ext, buf[v], neg);
        const float mq = ce_logit(k, ext_result(ext, neg));
        if (mq > m) {
          s *= ce_exp(m - mq);  // exp(-inf) = 0 while the sum is still empty
          m = mq;
        }
        if constexpr (kStore) {
          // The single piece: store e. A thread whose elements are all -inf or NaN (the max skips NaN) stores 0
          // for -inf (p = 0) and NaN for NaN, so its gradient is what cluster_smem gives (-uniform, NaN).
          if (m == -INFINITY) {
            for (int v = static_cast<int>(threadIdx.x); v < nv; v += kThreads) {
              float x[kVec];
              unpack<T>(buf[v], x);
#pragma unroll
              for (int e = 0; e < kVec; ++e) x[e] = x[e] != x[e] ? x[e] : 0.f;
              wbuf[v] = pack<StoredExp<T>>(x);
            }
            continue;
          }
          const int64_t yv = (ignored || bad) ? int64_t{-(1 << 30)} : y - lo;
          if (smooth) sum_store<T, true>(wbuf, nv, k, m, yv, s, sc, c_y_own);
          else sum_store<T, false>(wbuf, nv, k, m, yv, s, sc, c_y_own);
          continue;
        }
        if (m == -INFINITY) continue;
        if (smooth) sum_piece<T, kCap, true, kFtz>(buf, v0, v1, k, m, s, sc);
        else sum_piece<T, kCap, false, kFtz>(buf, v0, v1, k, m, s, sc);
      }
      m_t = m;
      Part a{m, s, kCap ? sc : k.scale * sc, c_y_own};
      if (!kStore && threadIdx.x == 0 && !ignored && !bad && y >= lo && y < hi) {
        const T* row = reinterpret_cast<const T*>(smem_raw);
        a.c_y = ce_logit(k, to_f32(row[y - lo]));  // thread 0 waited for every piece above
      }
      // Merge: warps (fixed tree), CTA (fixed order), cluster (rank order).
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a = merge(a, shfl_xor(a, o));
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
        Part r = shfl(mine, 0);
        for (int q = 1; q < C; ++q) r = merge(r, shfl(mine, q));
        if (lane == 0) {
          CeRowStats st;
          st.lse.m = r.m;
          st.lse.s = r.s;
          st.sum_c = r.sum_c;
          st.c_y = r.c_y;
          row_lse = ce_cuda::row_epilogue(p, i, st, ignored, bad, rank == 0);
        }
      }
      __cluster_barrier_arrive();  // this CTA is done reading the partials (its wait comes later)
      pending = true;
      __syncthreads();
      lse = row_lse;
    } else {
      lse = static_cast<const float*>(p.lse_in)[i * p.lse_in_stride];
    }
    if (grad) {
      uint4* dz = reinterpret_cast<uint4*>(static_cast<T*>(p.dlogits) + i * p.dlogits_rs + lo);
      const float g = ce_upstream(p, i, count);
      const CeGradRow gr = ce_grad_row(k, lse, g);
      const int64_t yv = y - lo;  // the target's index in this slice (outside [0, n) if elsewhere)
      float nan[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) nan[e] = ce_cuda::quiet_nan();
      const uint4 fill = bad ? pack<T>(nan) : make_uint4(0u, 0u, 0u, 0u);
      for (int q = 0; q < pieces; ++q) {
        const int v0 = q * pv, v1 = v0 + pv < nv ? v0 + pv : nv;
        if (!fwd) mbar_wait(&bars[q], phase);  // the forward waited for every piece in its statistics
        if (ignored || bad) {
          for (int v = v0 + threadIdx.x; v < v1; v += kThreads) dz[v] = fill;
          continue;
        }
        if constexpr (kStore) {
          if (fwd) {
            // dz = p_coef exp(c - lse) - uniform - [j == y] target, with exp(c - lse) = e exp(m_t - lse).
            const float pc = gr.p_coef * ce_exp(m_t - gr.lse);  // 0 for a thread whose elements are all -inf
            for (int v = v0 + threadIdx.x; v < v1; v += kThreads) {
              float x[kVec];
              unpack<StoredExp<T>>(buf[v], x);
#pragma unroll
              for (int e = 0; e < kVec; ++e) x[e] = fmaf(pc, x[e], -gr.uniform);
              const int64_t off = yv - static_cast<int64_t>(v) * kVec;
              if (off >= 0 && off < kVec) {
#pragma unroll
                for (int e = 0; e < kVec; ++e)
                  if (e == off) x[e] -= gr.target;
              }
              dz[v] = pack<T>(x);
            }
            continue;
          }
        }
        for (int v = v0 + threadIdx.x; v < v1; v += kThreads) {
          float x[kVec];
          unpack<T>(buf[v], x);
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            float d, f = 1.f;
            if constexpr (kCap) {
              const float t = ce_tanh(k.scale * x[e] * k.inv_cap);
              d = k.cap * t - gr.lse;
              f = 1.f - t * t;
            } else {
              d = fmaf(k.scale, x[e], -gr.lse);
            }
            x[e] = f * fmaf(gr.p_coef, piece_exp<kFtz>(d), -gr.uniform);
          }
          const int64_t off = yv - static_cast<int64_t>(v) * kVec;
          if (off >= 0 && off < kVec) {  // the target's vector: subtract f_y (1 - eps) g s
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              if (e == off) {
                float f = 1.f;
                if constexpr (kCap) {
                  const float t = ce_tanh(k.scale * to_f32(reinterpret_cast<const T*>(smem_raw)[yv]) * k.inv_cap);
                  f = 1.f - t * t;
                }
                x[e] -= f * gr.target;
              }
            }
          }
          dz[v] = pack<T>(x);
        }
      }
    } else if (!fwd) {
      // (not reached: the backward op always writes dlogits) keep the barrier phases balanced
      for (int q = 0; q < pieces; ++q) mbar_wait(&bars[q], phase);
    }
    if (pieces > 0) phase ^= 1u;
    __syncthreads();  // the buffer and row_lse are reused by a later row of this CTA
  }
  if (pending) __cluster_barrier_wait();  // no CTA leaves while another may still read its partial
}

// Smallest cluster whose slices fit kTargetSliceBytes (with 8 CTAs: up to kMaxSliceBytes, ce_smem_reject).
struct Split {
  int C = 0;
  int64_t slice = 0;  // elements, a multiple of the 16-byte vector
};

Split split_of(int64_t V, int32_t dtype, int64_t target_bytes = kTargetSliceBytes) {
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  const int64_t vec = 16 / es;
  const int64_t nvec = V / vec;
  const int64_t bytes = V * es;
  int64_t C = 1;  // 1, 2, 4, 8
  while (C < kMaxCluster && C * target_bytes < bytes) C *= 2;
  Split s;
  s.C = static_cast<int>(C);
  s.slice = ((nvec + C - 1) / C) * vec;
  return s;
}

// prefetch: rows ahead whose slices each CTA prefetches into L2 (0: none).
template <class T, bool kGrad, bool kCap, int kPieces, bool kStore = false>
strata_status launch(const CeParams& p, const Split& sp, cudaStream_t stream, int prefetch = 0) {
  const size_t smem = static_cast<size_t>(sp.slice) * sizeof(T);
  auto* kernel = ce_smem_rows<T, kGrad, kCap, kPieces, kStore>;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // One cluster per row up to 2^31 - 1 CTAs in all (the row loop covers the rest).
  const int64_t max_clusters = ((int64_t{1} << 31) - 1) / sp.C;
  const int64_t clusters = p.N < max_clusters ? p.N : max_clusters;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * sp.C), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(sp.C);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  STRATA_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, p, sp.C, sp.slice, prefetch));
  return STRATA_SUCCESS;
}

template <class T, int kPieces>
strata_status launch_t(const CeParams& p, const Split& sp, cudaStream_t stream) {
  const bool grad = p.dlogits != nullptr, cap = p.k.softcap_on;
  if (grad) return cap ? launch<T, true, true, kPieces>(p, sp, stream) : launch<T, true, false, kPieces>(p, sp, stream);
  return cap ? launch<T, false, true, kPieces>(p, sp, stream) : launch<T, false, false, kPieces>(p, sp, stream);
}

// The stored-exponential kernel runs for the fused forward without softcap of bf16/f32 logits (kStore's
// static_assert); for everything else the stored-exp kinds run cluster_smem's kernel and split.
bool wide_kind(CeSmemKind kind) { return kind == CeSmemKind::kStoredExpPf16; }
bool stored_exp_runs(const CeParams& p, CeSmemKind kind) {
  return (kind == CeSmemKind::kStoredExp || wide_kind(kind)) && p.dlogits != nullptr && !p.backward &&
         !p.k.softcap_on && p.dtype != STRATA_DTYPE_F16;
}

template <class T>
strata_status launch_kind(const CeParams& p, const Split& sp, CeSmemKind kind, cudaStream_t stream) {
  if (kind == CeSmemKind::kChunked) return launch_t<T, kChunks>(p, sp, stream);
  if constexpr (!std::is_same_v<T, f16_t>) {
    if (stored_exp_runs(p, kind))
      return launch<T, true, false, 1, true>(p, sp, stream, wide_kind(kind) ? kPrefetchRows : 0);
  }
  return launch_t<T, 1>(p, sp, stream);
}

}  // namespace

std::string ce_smem_reject(const CeParams& p, CeSmemKind /*kind: both kinds take the same shapes*/) {
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(p.dtype));
  if (p.V == 0) return "V = 0 (nothing to stage)";
  if (p.V % vec != 0 || p.logits_rs % vec != 0 || p.dlogits_rs % vec != 0)
    return "needs V and the row strides to be multiples of 16 bytes";
  if (p.V * static_cast<int64_t>(dtype_size(p.dtype)) > int64_t{kMaxCluster} * kMaxSliceBytes)
    return "rows longer than 8 CTAs x 100 KiB of shared memory";
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
    // Wide slices only where the stored-exp kernel runs (timed there: s7run2); elsewhere cluster_smem exactly.
    const bool wide = wide_kind(kind) && stored_exp_runs(p, kind);
    const Split sp = split_of(p.V, p.dtype, wide ? kWideSliceBytes : kTargetSliceBytes);
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
