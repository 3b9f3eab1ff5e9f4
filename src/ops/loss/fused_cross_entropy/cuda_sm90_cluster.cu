// CUDA kernel of fused_cross_entropy "cuda.sm90.cluster_row": each row is split over a thread-block cluster
// of C <= 8 CTAs (sm_90), and every CTA holds its slice of the row in registers, so the logits are read
// from memory exactly once and the gradient written once, with no second pass over global memory or L2.
//
//   grid N * C CTAs of kThreads threads, cluster (C, 1, 1): CTA rank r of cluster i owns the 16-byte vectors
//   [r * S, min((r + 1) * S, V / kVec)) of row i (S = slice, in vectors), at most kMaxVec per thread.
//   1. Each thread loads its vectors (16-byte loads, all issued before any math), takes the maximum of its
//      transformed logits, then sum exp(c - m_thread) and sum c: one exponential per element, no rescale.
//   2. A fixed shuffle tree and cross-warp order merge the threads; thread 0 publishes the CTA's
//      (m, S, sum c, c_y) in shared memory. cluster.sync(); every CTA merges the C partials in rank order
//      through distributed shared memory, so all of them get the same lse bits. Rank 0 writes lse and the
//      row loss. cluster.sync() again, so no CTA leaves (or overwrites its partial) while another reads it.
//   3. Gradient: each thread recomputes c and p = exp(c - lse) from the registers and stores dz with 16-byte
//      stores (in place or to dlogits).
// Conditions (else the plan's run falls back to block_per_row, the same math): V and the row strides are
// multiples of the vector (8 bf16/f16, 4 f32), the row pointers are 16-byte aligned (checked at run time),
// and V / kVec <= 8 * kThreads * kMaxVec (262144 bf16 / 131072 f32 logits per row).
// ce_count / ce_reduce (cuda_sm90.cu) run before and after as for block_per_row.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "opbase/dtype.h"
#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"
#include "tile/cuda/check.cuh"

namespace cg = cooperative_groups;

namespace strata::loss {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxVec = 8;      // 16-byte vectors per thread: 64 bf16 or 32 f32 in 32 registers
constexpr int kMaxCluster = 8;  // portable cluster size

__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }

template <class T>
struct Vec16 {
  static constexpr int n = 16 / static_cast<int>(sizeof(T));
};

// Element q of a 16-byte vector as f32.
template <class T>
__device__ __forceinline__ float elem(const uint4& u, int q) {
  if constexpr (std::is_same_v<T, float>) {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
    return __uint_as_float(words[q]);
  } else {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
    const uint32_t x = words[q >> 1];
    if constexpr (std::is_same_v<T, bf16_t>) {
      return (q & 1) ? __uint_as_float(x & 0xffff0000u) : __uint_as_float(x << 16);
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x));
      return (q & 1) ? f.y : f.x;
    }
  }
}

template <class T>
__device__ __forceinline__ uint4 pack(const float (&v)[16 / sizeof(T)]) {
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


template <class T, bool kGrad>
__global__ void __launch_bounds__(kThreads) ce_cluster_rows(const CeParams p, int C, int64_t slice) {
  constexpr int kVec = Vec16<T>::n;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ Part warp_part[kWarps];
  __shared__ Part cta_part;  // read by the other CTAs of the cluster
  __shared__ float row_lse;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t i = blockIdx.x / C;  // clusters are C consecutive CTAs along x
  const CeConsts& k = p.k;
  const int64_t nvec = p.V / kVec;
  const int64_t v0 = rank * slice, v1 = v0 + slice < nvec ? v0 + slice : nvec;
  const T* z = static_cast<const T*>(p.logits) + i * p.logits_rs;
  const int64_t y = ce_target(p, i);
  const bool ignored = y == k.ignore_index;
  const bool bad = !ignored && (y < 0 || y >= p.V);

  // 1. Load the slice (all loads first), thread max, then the sums.
  uint4 raw[kMaxVec];
#pragma unroll
  for (int q = 0; q < kMaxVec; ++q) {
    const int64_t v = v0 + threadIdx.x + static_cast<int64_t>(q) * kThreads;
    raw[q] = v < v1 ? *reinterpret_cast<const uint4*>(z + v * kVec) : make_uint4(0u, 0u, 0u, 0u);
  }
  float lse;
  if (!p.backward) {
    // c is a non-decreasing function of s z (scale, then tanh), so the thread's maximum of c is c of its
    // largest raw logit (smallest for s < 0): no transform (no tanh) in this sweep.
    float zmax = -INFINITY, zmin = INFINITY;
#pragma unroll
    for (int q = 0; q < kMaxVec; ++q) {
      if (v0 + threadIdx.x + static_cast<int64_t>(q) * kThreads < v1) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float zz = elem<T>(raw[q], e);
          zmax = fmaxf(zmax, zz);
          zmin = fminf(zmin, zz);
        }
      }
    }
    const float zext = k.scale >= 0.f ? zmax : zmin;
    const float m = (zext == -INFINITY || zext == INFINITY) && zmax < zmin ? -INFINITY : ce_logit(k, zext);
    Part a{m, 0.f, 0.f, 0.f};
    if (m != -INFINITY) {
#pragma unroll
      for (int q = 0; q < kMaxVec; ++q) {
        if (v0 + threadIdx.x + static_cast<int64_t>(q) * kThreads < v1) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const float c = ce_logit(k, elem<T>(raw[q], e));
            a.s += fast_exp(c - m);
            a.sum_c += c;
          }
        }
      }
    }
    // c_y by the thread that owns the target's vector (read from its registers: no extra load).
    if (!ignored && !bad) {
      const int64_t vy = y / kVec;
#pragma unroll
      for (int q = 0; q < kMaxVec; ++q)
        if (vy == v0 + threadIdx.x + static_cast<int64_t>(q) * kThreads && vy < v1)
          a.c_y = ce_logit(k, elem<T>(raw[q], static_cast<int>(y - vy * kVec)));
    }
    // 2. Merge: warps (fixed tree), CTA (fixed order), cluster (rank order).
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
    __syncthreads();
    if (threadIdx.x == 0) {
      Part r = warp_part[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) r = merge(r, warp_part[w]);
      cta_part = r;
    }
    cluster.sync();
    if (threadIdx.x == 0) {
      Part r = *cluster.map_shared_rank(&cta_part, 0);
      for (int q = 1; q < C; ++q) r = merge(r, *cluster.map_shared_rank(&cta_part, q));
      CeRowStats st;
      st.lse.m = r.m;
      st.lse.s = r.s;
      st.sum_c = r.sum_c;
      st.c_y = r.c_y;
      const float l = ce_lse(st.lse);
      row_lse = l;
      if (rank == 0) {
        const float loss = ignored ? 0.f : (bad ? __int_as_float(0x7fc00000) : ce_row_loss(k, st, p.V));
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
    cluster.sync();  // the partials have been read by every CTA; row_lse is visible to this CTA
    lse = row_lse;
  } else {
    lse = static_cast<const float*>(p.lse_in)[i * p.lse_in_stride];
  }
  // 3. Gradient from the registers.
  if constexpr (kGrad) {
    const int64_t count = p.reduction == kCeMean ? *ce_count_slot(p) : 0;
    T* dz = static_cast<T*>(p.dlogits) + i * p.dlogits_rs;
    const float g = (ignored || bad) ? 0.f : ce_upstream(p, i, count);
    const CeGradRow gr = ce_grad_row(k, lse, g);
    const float fill = bad ? __int_as_float(0x7fc00000) : 0.f;
#pragma unroll
    for (int q = 0; q < kMaxVec; ++q) {
      const int64_t v = v0 + threadIdx.x + static_cast<int64_t>(q) * kThreads;
      if (v < v1) {
        float d[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          if (ignored || bad) {
            d[e] = fill;
            continue;
          }
          const float zz = elem<T>(raw[q], e);
          const float u = k.scale * zz;
          float c = u, f = 1.f;
          if (k.softcap_on) {
            const float t = ce_tanh(u * k.inv_cap);
            c = k.cap * t;
            f = 1.f - t * t;
          }
          float dd = gr.p_coef * fast_exp(c - gr.lse) - gr.uniform;
          if (v * kVec + e == y) dd -= gr.target;
          d[e] = f * dd;
        }
        *reinterpret_cast<uint4*>(dz + v * kVec) = pack<T>(d);
      }
    }
  }
}

template <class T, bool kGrad>
strata_status launch(const CeParams& p, int C, int64_t slice, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(p.N * C), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(C);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  STRATA_CUDA_TRY(cudaLaunchKernelEx(&cfg, ce_cluster_rows<T, kGrad>, p, C, slice));
  return STRATA_SUCCESS;
}

template <class T>
strata_status launch_t(const CeParams& p, int C, int64_t slice, cudaStream_t stream) {
  return p.dlogits ? launch<T, true>(p, C, slice, stream) : launch<T, false>(p, C, slice, stream);
}

}  // namespace

std::string ce_cluster_reject(const CeParams& p) {
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(p.dtype));
  if (p.V % vec != 0 || p.logits_rs % vec != 0 || (p.dlogits_rs % vec != 0))
    return "needs V and the row strides to be multiples of 16 bytes";
  if (p.V / vec > int64_t{kMaxCluster} * kThreads * kMaxVec)
    return "rows longer than 8 CTAs x 512 threads x 8 vectors of 16 bytes";
  if (p.N * ((p.V / vec + int64_t{kThreads} * kMaxVec - 1) / (int64_t{kThreads} * kMaxVec)) >= (int64_t{1} << 31))
    return "more than 2^31 - 1 CTAs";
  return {};
}

bool ce_cluster_aligned(const CeParams& p) {
  const auto a = reinterpret_cast<uintptr_t>(p.logits) | reinterpret_cast<uintptr_t>(p.dlogits);
  return a % 16 == 0;
}

int fused_cross_entropy_cuda_cluster(const CeParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(p.dtype));
  const int64_t nvec = p.V / vec;
  const int64_t per_cta = int64_t{kThreads} * kMaxVec;
  const int C = static_cast<int>((nvec + per_cta - 1) / per_cta);  // 1..8 (ce_cluster_reject)
  const int64_t slice = (nvec + C - 1) / C;
  STRATA_RETURN_IF_ERROR(ce_launch_count(p, stream_ptr));
  if (p.N > 0 && (!p.backward || p.dlogits)) {
    strata_status s;
    switch (p.dtype) {
      case STRATA_DTYPE_F32: s = launch_t<float>(p, C, slice, stream); break;
      case STRATA_DTYPE_BF16: s = launch_t<bf16_t>(p, C, slice, stream); break;
      default: s = launch_t<f16_t>(p, C, slice, stream); break;
    }
    STRATA_RETURN_IF_ERROR(s);
    STRATA_RETURN_IF_ERROR(cuda::check_launch("fused_cross_entropy (ce_cluster_rows)"));
  }
  return ce_launch_reduce(p, stream_ptr);
}

}  // namespace strata::loss
