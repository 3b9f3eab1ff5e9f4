// Device helpers shared by the CUDA kernels of fused_cross_entropy (cuda_sm90.cu: block_per_row;
// cuda_sm90_smem.cu: cluster_smem, cluster_chunked): 16-byte vectors of the logits dtype as f32, and the row
// epilogue (lse, the loss and the z-loss of a row from its merged statistics, per row or into the workspace
// for the reduction). The per-row formulas themselves are ce_row.h's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "opbase/dtype.h"
#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"

namespace strata::loss::ce_cuda {

// Elements of T in one 16-byte vector: 4 f32, 8 bf16/f16.
template <class T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// 16 bytes -> kVec<T> floats (exact).
template <class T>
__device__ __forceinline__ void unpack(const uint4& u, float (&v)[kVec<T>]) {
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

// kVec<T> floats -> 16 bytes (round to nearest even for bf16/f16).
template <class T>
__device__ __forceinline__ uint4 pack(const float (&v)[kVec<T>]) {
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

// One 16-byte global load / store (p 16-byte aligned, global memory). Plain weak accesses, as a dereference
// would be; written in PTX because nvcc split `*reinterpret_cast<const uint4*>(element pointer)` into four
// 32-bit accesses in block_per_row (session 6 SASS: no LDG.E.128 / STG.E.128). The load is not volatile (it
// may be scheduled like any load) and not .nc (the row may be overwritten in place later in the kernel).
__device__ __forceinline__ uint4 ld_global16(const void* p) {
  uint4 u;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p) : "memory");
  return u;
}
__device__ __forceinline__ void st_global16(void* p, const uint4& u) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
               : "memory");
}

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// The row epilogue from the merged statistics st of row i: returns lse; when `write`, also stores lse (if
// asked) and the loss and z-loss (reduction none: to the outputs; mean/sum: to the workspace rows that
// ce_reduce sums). Ignored rows: loss 0, z-loss 0; a bad target (outside [0, V), not ignored): loss NaN.
__device__ __forceinline__ float row_epilogue(const CeParams& p, int64_t i, const CeRowStats& st, bool ignored,
                                              bool bad, bool write) {
  const CeConsts& k = p.k;
  const float l = ce_lse(st.lse);
  if (!write) return l;
  const float loss = ignored ? 0.f : (bad ? quiet_nan() : ce_row_loss(k, st, p.V));
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
  return l;
}

}  // namespace strata::loss::ce_cuda
