// CUDA kernels of fused_cross_entropy ("cuda.sm90.block_per_row", and the count / reduction kernels that every
// CUDA implementation launches around its row kernel). Memory-bound: the forward reads the
// logits once; fused with the backward it also writes the gradient once (in place or to dlogits).
//
// Kernels, in launch order:
//   count        the target check (loss/common/cuda_targets.h, every call with rows): the number of non-ignored
//                targets and of bad ones -> workspace (int64), read back to the host (one stream
//                synchronisation); a bad target fails the call here, before anything is written.
//   ce_rows      one block per row. Pass 1 (forward): each thread sweeps its share of the row with 16-byte
//                loads (8 bf16/f16 or 4 f32), keeping an online (max, rescaled sum of exp) and the sum of the
//                transformed logits; one exponential per element plus one rescale per vector whose maximum is
//                a new maximum. A fixed shuffle tree and a fixed cross-warp order merge the thread states
//                (same bits every run). Thread 0 forms lse and the loss (ce_row.h). Pass 2 (gradient): the row
//                is read again (from L2 when it is still there) and dz written with 16-byte stores; the
//                target element is recognised by its index, so dz may be the logits buffer. Rows whose start
//                is not 16-byte aligned take scalar heads and tails.
//   ce_reduce    (1 block; mean/sum): sums the per-row losses and z-losses in row order per thread and in a
//                fixed tree across threads, in f64, and divides by the count for mean.
// The gradient is produced in the same kernel as the loss: for mean its scale 1/count comes from the count,
// which only reads the N targets (a few microseconds for N = 8192).
//
// A target outside [0, V) that is not ignore_index fails the call in the count step. Only while a CUDA graph is
// captured (no read-back possible) do the row kernels meet one: it never leads to an out-of-bounds access; its
// row gets a NaN loss (and in the backward a NaN gradient; the fused forward then writes no gradient at all).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "opbase/dtype.h"
#include "ops/loss/fused_cross_entropy/cuda_common.cuh"
#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"
#include "tile/cuda/check.cuh"

namespace strata::loss {
namespace {

// Exponentials of the element loops: ex2.approx of x log2(e) (relative error ~1e-7 near the maximum, where the
// terms that matter are); the per-row formulas (ce_row.h) keep the accurate expf/logf.
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }

__device__ __forceinline__ float ld1(const float* p) { return *p; }
__device__ __forceinline__ float ld1(const bf16_t* p) { return bf16_bits_to_f32(p->bits); }
__device__ __forceinline__ float ld1(const f16_t* p) { return __half2float(__ushort_as_half(p->bits)); }

__device__ __forceinline__ void st1(float* p, float v) { *p = v; }
__device__ __forceinline__ void st1(bf16_t* p, float v) { p->bits = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ void st1(f16_t* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }

// 16 bytes at p (16-byte aligned) <-> kVec<T> floats, as one 16-byte load / store instruction
// (ce_cuda::ld_global16 / st_global16: plain dereferences of a uint4 were split into four 32-bit accesses).
template <class T>
__device__ __forceinline__ void ldv(const T* p, float (&v)[ce_cuda::kVec<T>]) {
  ce_cuda::unpack<T>(ce_cuda::ld_global16(p), v);
}
template <class T>
__device__ __forceinline__ void stv(T* p, const float (&v)[ce_cuda::kVec<T>]) {
  ce_cuda::st_global16(p, ce_cuda::pack<T>(v));
}

// Thread-local statistics of pass 1 (a plain struct: it also lives in shared memory). Empty: {-inf, 0, 0}.
struct Acc {
  float m, s, sum_c;
};

// Adds n transformed logits c[0..n) (one vector) to a.
template <int n>
__device__ __forceinline__ void acc_add(Acc& a, const float (&c)[n]) {
  // (uses fast_exp for the n terms; the rescale keeps expf)
  float mv = c[0];
#pragma unroll
  for (int k = 1; k < n; ++k) mv = fmaxf(mv, c[k]);
  if (mv > a.m) {
    a.s *= ce_exp(a.m - mv);  // exp(-inf) = 0 on the first vector
    a.m = mv;
  }
  if (a.m == -INFINITY) return;  // every value so far is -inf: they add nothing (and -inf - -inf is NaN)
  float e = 0.f, sc = 0.f;
#pragma unroll
  for (int k = 0; k < n; ++k) {
    e += fast_exp(c[k] - a.m);
    sc += c[k];
  }
  a.s += e;
  a.sum_c += sc;
}

__device__ __forceinline__ void acc_add1(Acc& a, float c) {
  float cc[1] = {c};
  acc_add<1>(a, cc);
}

__device__ __forceinline__ Acc acc_merge(Acc a, const Acc& b) {
  OnlineLse x{a.m, a.s};
  lse_add_block(x, b.m, b.s);
  a.m = x.m;
  a.s = x.s;
  a.sum_c += b.sum_c;
  return a;
}

// Block-wide merge of the thread states (fixed order); every thread gets the result.
template <int kWarps>
__device__ __forceinline__ Acc block_merge(Acc a, Acc* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Acc b{};
    b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
    b.sum_c = __shfl_xor_sync(0xffffffffu, a.sum_c, o);
    a = acc_merge(a, b);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  Acc r = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = acc_merge(r, scratch[w]);
  return r;
}

__device__ __forceinline__ int64_t* count_slot(const CeParams& p) { return ce_count_slot(p); }

// Scale mode (CeParams::scale_only): row i of dlogits (the logits buffer, holding the gradient for an upstream
// gradient of 1) *= g_i = dloss[i] (none) or dloss[0] (mean, sum), in f32, rounded to T. dloss is read here, so
// the host never waits for it; g == 1 (the usual loss.backward()) exits at once (mean/sum: every block after
// one load). Ignored rows keep their 0 (as the full backward gives 0 for any dloss). Rows are grid-strided;
// 16-byte vectors between scalar heads and tails as in ce_rows.
template <class T, int kThreads>
__global__ void __launch_bounds__(kThreads) ce_scale(const CeParams p) {
  constexpr int kVec = ce_cuda::kVec<T>;
  const float* dl = static_cast<const float*>(p.dloss);
  const bool per_row = p.reduction == kCeNone;
  if (!per_row && dl[0] == 1.f) return;
  for (int64_t i = blockIdx.x; i < p.N; i += gridDim.x) {
    const float g = per_row ? dl[i * p.dloss_stride] : dl[0];
    if (g == 1.f || ce_target(p, i) == p.k.ignore_index) continue;  // uniform across the block
    T* z = static_cast<T*>(p.dlogits) + i * p.dlogits_rs;
    const int64_t V = p.V;
    const int64_t mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(z) / sizeof(T)) % kVec);
    const int64_t head = mis == 0 ? 0 : (kVec - mis < V ? kVec - mis : V);
    const int64_t nvec = (V - head) / kVec;
    const int64_t tail0 = head + nvec * kVec;
    for (int64_t e = threadIdx.x; e < head; e += kThreads) st1(z + e, ld1(z + e) * g);
    T* zv = z + head;
    for (int64_t v = threadIdx.x; v < nvec; v += kThreads) {
      float x[kVec];
      ldv(zv + v * kVec, x);
#pragma unroll
      for (int q = 0; q < kVec; ++q) x[q] *= g;
      stv(zv + v * kVec, x);
    }
    for (int64_t e = tail0 + threadIdx.x; e < V; e += kThreads) st1(z + e, ld1(z + e) * g);
  }
}

template <class T>
strata_status launch_scale(const CeParams& p, cudaStream_t stream) {
  // 8 blocks of 256 threads per SM on 132 SMs (H200), each looping over rows: enough to stream the rows when
  // g != 1, few enough that the g == 1 exit costs one short launch.
  constexpr int kThreads = 256;
  const unsigned grid = static_cast<unsigned>(p.N < 1056 ? p.N : 1056);
  ce_scale<T, kThreads><<<grid, kThreads, 0, stream>>>(p);
  return STRATA_SUCCESS;
}

// dz of one element (ce_grad_elem with the fast exponential).
__device__ __forceinline__ float grad_elem(const CeConsts& k, const CeGradRow& r, float z, bool is_target) {
  const float u = k.scale * z;
  float c = u, f = 1.f;
  if (k.softcap_on) {
    const float t = ce_tanh(u * k.inv_cap);
    c = k.cap * t;
    f = 1.f - t * t;
  }
  float d = r.p_coef * fast_exp(c - r.lse) - r.uniform;
  if (is_target) d -= r.target;
  return f * d;
}

// The row's outputs from its merged statistics r and c_y (ce_cuda::row_epilogue). Returns lse.
__device__ __forceinline__ float write_row(const CeParams& p, int64_t i, const Acc& r, float c_y, bool ignored,
                                           bool bad) {
  CeRowStats st;
  st.lse.m = r.m;
  st.lse.s = r.s;
  st.sum_c = r.sum_c;
  st.c_y = c_y;
  return ce_cuda::row_epilogue(p, i, st, ignored, bad, true);
}

// kThreads threads per row.
template <class T, bool kGrad, int kThreads>
__global__ void __launch_bounds__(kThreads) ce_rows(const CeParams p) {
  constexpr int kVec = ce_cuda::kVec<T>;
  constexpr int kWarps = kThreads / 32;
  __shared__ Acc scratch[kWarps];
  __shared__ float row_lse;
  const CeConsts& k = p.k;
  const int64_t count = (kGrad && p.reduction == kCeMean) ? *count_slot(p) : 0;
  // The fused forward writes no gradient when any target is bad (the count's bad count; met only while a CUDA
  // graph is captured, otherwise the call failed before this launch; the loss rows still go).
  const bool grad = kGrad && (p.backward || *ce_bad_slot(p) == 0);
  for (int64_t i = blockIdx.x; i < p.N; i += gridDim.x) {
    const T* z = static_cast<const T*>(p.logits) + i * p.logits_rs;
    const int64_t y = ce_target(p, i);
    const bool ignored = y == k.ignore_index;
    const bool bad = !ignored && (y < 0 || y >= p.V);
    const int64_t V = p.V;
    // Scalar head up to the first 16-byte boundary, whole vectors, scalar tail.
    const int64_t mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(z) / sizeof(T)) % kVec);
    const int64_t head = mis == 0 ? 0 : (kVec - mis < V ? kVec - mis : V);
    const int64_t nvec = (V - head) / kVec;
    const int64_t tail0 = head + nvec * kVec;
    float lse;
    if (!p.backward) {
      Acc a{-INFINITY, 0.f, 0.f};
      for (int64_t e = threadIdx.x; e < head; e += kThreads) acc_add1(a, ce_logit(k, ld1(z + e)));
      const T* zv = z + head;
      int64_t v = threadIdx.x;
      // Two 16-byte loads in flight per thread per iteration.
      for (; v + kThreads < nvec; v += 2 * kThreads) {
        float x0[kVec], x1[kVec];
        ldv(zv + v * kVec, x0);
        ldv(zv + (v + kThreads) * kVec, x1);
#pragma unroll
        for (int q = 0; q < kVec; ++q) x0[q] = ce_logit(k, x0[q]), x1[q] = ce_logit(k, x1[q]);
        acc_add(a, x0);
        acc_add(a, x1);
      }
      if (v < nvec) {
        float x0[kVec];
        ldv(zv + v * kVec, x0);
#pragma unroll
        for (int q = 0; q < kVec; ++q) x0[q] = ce_logit(k, x0[q]);
        acc_add(a, x0);
      }
      for (int64_t e = tail0 + threadIdx.x; e < V; e += kThreads) acc_add1(a, ce_logit(k, ld1(z + e)));
      // c_y is read before the barrier inside block_merge, so before any thread overwrites the row.
      const float c_y = (threadIdx.x == 0 && !ignored && !bad) ? ce_logit(k, ld1(z + y)) : 0.f;
      const Acc r = block_merge<kWarps>(a, scratch);
      if (threadIdx.x == 0) row_lse = write_row(p, i, r, c_y, ignored, bad);
      __syncthreads();
      lse = row_lse;
    } else {
      lse = static_cast<const float*>(p.lse_in)[i * p.lse_in_stride];
    }
    if (grad) {
      T* dz = static_cast<T*>(p.dlogits) + i * p.dlogits_rs;
      const int64_t dmis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(dz) / sizeof(T)) % kVec);
      const float g = (ignored || bad) ? 0.f : ce_upstream(p, i, count);
      const CeGradRow gr = ce_grad_row(k, lse, g);
      const float fill = bad ? ce_cuda::quiet_nan() : 0.f;
      if (ignored || bad) {
        for (int64_t e = threadIdx.x; e < V; e += kThreads) st1(dz + e, fill);
      } else if (dmis == mis) {
        // Same alignment as the logits (always so in place): vector loads and stores.
        for (int64_t e = threadIdx.x; e < head; e += kThreads) st1(dz + e, grad_elem(k, gr, ld1(z + e), e == y));
        const T* zv = z + head;
        T* dv = dz + head;
        for (int64_t v = threadIdx.x; v < nvec; v += kThreads) {
          float x[kVec];
          ldv(zv + v * kVec, x);
          const int64_t e0 = head + v * kVec;
#pragma unroll
          for (int q = 0; q < kVec; ++q) x[q] = grad_elem(k, gr, x[q], e0 + q == y);
          stv(dv + v * kVec, x);
        }
        for (int64_t e = tail0 + threadIdx.x; e < V; e += kThreads)
          st1(dz + e, grad_elem(k, gr, ld1(z + e), e == y));
      } else {
        for (int64_t e = threadIdx.x; e < V; e += kThreads) st1(dz + e, grad_elem(k, gr, ld1(z + e), e == y));
      }
    }
    __syncthreads();  // scratch and row_lse are reused by the next row of this block
  }
}

// Fixed-order f64 sum of the per-row losses and z-losses; mean divides by the count (0 when it is 0).
__global__ void __launch_bounds__(1024) ce_reduce(const CeParams p) {
  const float* rows = static_cast<const float*>(p.workspace);
  double l = 0.0, zl = 0.0;
  for (int64_t i = threadIdx.x; i < p.N; i += blockDim.x) l += rows[i], zl += rows[p.N + i];
  __shared__ double sl[1024], sz[1024];
  sl[threadIdx.x] = l;
  sz[threadIdx.x] = zl;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) sl[threadIdx.x] += sl[threadIdx.x + w], sz[threadIdx.x] += sz[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double L = sl[0], Z = sz[0];
    if (p.reduction == kCeMean) {
      const int64_t n = *count_slot(p);
      L = n > 0 ? L / static_cast<double>(n) : 0.0;
      Z = n > 0 ? Z / static_cast<double>(n) : 0.0;
    }
    *static_cast<float*>(p.loss) = static_cast<float>(L);
    if (p.z_loss) *static_cast<float*>(p.z_loss) = static_cast<float>(Z);
  }
}

template <class T, int kThreads>
strata_status launch_rows(const CeParams& p, unsigned grid, cudaStream_t stream) {
  if (p.dlogits) ce_rows<T, true, kThreads><<<grid, kThreads, 0, stream>>>(p);
  else ce_rows<T, false, kThreads><<<grid, kThreads, 0, stream>>>(p);
  return STRATA_SUCCESS;
}

}  // namespace

strata_status ce_launch_count(const CeParams& p, void* stream_ptr) {
  // Every call with rows (both ops): the target check before anything is written; its counts stay in the
  // workspace for the row kernels (the count for mean, the bad count while a CUDA graph is captured).
  TargetCounts c;
  STRATA_RETURN_IF_ERROR(cuda_count_targets(p.target, p.target_dtype, p.target_stride, p.N, p.V, p.k.ignore_index,
                                            ce_count_slot(p), stream_ptr, &c));
  return c.bad > 0 ? ce_bad_target(p, c.first_bad, c.first_value) : STRATA_SUCCESS;
}

strata_status ce_launch_reduce(const CeParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (p.backward || p.reduction == kCeNone) return STRATA_SUCCESS;
  ce_reduce<<<1, 1024, 0, stream>>>(p);
  return cuda::check_launch("fused_cross_entropy (ce_reduce)");
}

strata_status ce_launch_scale(const CeParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (p.N == 0) return STRATA_SUCCESS;
  switch (p.dtype) {
    case STRATA_DTYPE_F32: STRATA_RETURN_IF_ERROR(launch_scale<float>(p, stream)); break;
    case STRATA_DTYPE_BF16: STRATA_RETURN_IF_ERROR(launch_scale<bf16_t>(p, stream)); break;
    default: STRATA_RETURN_IF_ERROR(launch_scale<f16_t>(p, stream)); break;
  }
  return cuda::check_launch("fused_cross_entropy (ce_scale)");
}

int fused_cross_entropy_cuda(const CeParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  STRATA_RETURN_IF_ERROR(ce_launch_count(p, stream_ptr));
  if (p.N > 0 && (!p.backward || p.dlogits)) {
    // One block of 512 threads per row; beyond 2^30 rows each block loops (never reached in practice).
    constexpr int kThreads = 512;
    const unsigned grid = static_cast<unsigned>(p.N < (int64_t{1} << 30) ? p.N : (int64_t{1} << 30));
    switch (p.dtype) {
      case STRATA_DTYPE_F32: STRATA_RETURN_IF_ERROR((launch_rows<float, kThreads>(p, grid, stream))); break;
      case STRATA_DTYPE_BF16: STRATA_RETURN_IF_ERROR((launch_rows<bf16_t, kThreads>(p, grid, stream))); break;
      default: STRATA_RETURN_IF_ERROR((launch_rows<f16_t, kThreads>(p, grid, stream))); break;
    }
    STRATA_RETURN_IF_ERROR(cuda::check_launch("fused_cross_entropy (ce_rows)"));
  }
  return ce_launch_reduce(p, stream_ptr);
}

}  // namespace strata::loss
