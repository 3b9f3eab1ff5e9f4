// Vector loads and stores of f32 / bf16 / f16 rows as f32 registers, with the dtype read at run time (a
// uniform branch; it keeps the number of kernel instances small). N elements per call: N/8 16-byte accesses
// of bf16/f16 or N/4 of f32 (the address must be aligned to 16 bytes). bf16/f16 results are rounded to nearest
// even by the hardware's paired conversions (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32), like the CPU kernels.
// load_one / store_one are the element-wise fallbacks for strided or misaligned tensors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "opbase/dtype.h"

namespace strata::cuda {

template <int N>
__device__ __forceinline__ void load_vec(const void* base, int32_t dtype, int64_t i, float (&v)[N]) {
  static_assert(N % 8 == 0, "whole 16-byte accesses of 2-byte types");
  if (dtype == STRATA_DTYPE_F32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      const float4 a = p[k];
      v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
    }
    return;
  }
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i);
#pragma unroll
  for (int q = 0; q < N / 8; ++q) {
    const uint4 u = p[q];
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float* o = v + 8 * q + 2 * k;
      if (dtype == STRATA_DTYPE_BF16) {
        o[0] = __uint_as_float(w[k] << 16), o[1] = __uint_as_float(w[k] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
        o[0] = f.x, o[1] = f.y;
      }
    }
  }
}

// Two floats rounded to nearest even into one 32-bit word of bf16 or f16 (low half = first element).
__device__ __forceinline__ uint32_t pack_half2(int32_t dtype, float a, float b) {
  if (dtype == STRATA_DTYPE_BF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <int N>
__device__ __forceinline__ void store_vec(void* base, int32_t dtype, int64_t i, const float (&v)[N]) {
  static_assert(N % 8 == 0, "whole 16-byte accesses of 2-byte types");
  if (dtype == STRATA_DTYPE_F32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(base) + i);
#pragma unroll
    for (int k = 0; k < N / 4; ++k) p[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    return;
  }
  uint4* p = reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + i);
#pragma unroll
  for (int q = 0; q < N / 8; ++q) {
    const float* f = v + 8 * q;
    p[q] = make_uint4(pack_half2(dtype, f[0], f[1]), pack_half2(dtype, f[2], f[3]), pack_half2(dtype, f[4], f[5]),
                      pack_half2(dtype, f[6], f[7]));
  }
}

__device__ __forceinline__ float load_one(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case STRATA_DTYPE_F32: return static_cast<const float*>(base)[i];
    case STRATA_DTYPE_BF16: return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16);
    default: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(base)[i]));
  }
}
__device__ __forceinline__ void store_one(void* base, int32_t dtype, int64_t i, float v) {
  if (dtype == STRATA_DTYPE_F32)
    static_cast<float*>(base)[i] = v;
  else
    static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(pack_half2(dtype, v, 0.f) & 0xffffu);
}

// N elements starting at element i with element stride `stride`; vector accesses when `vec` (stride 1 and
// 16-byte aligned, checked by the caller on the host).
template <int N>
__device__ __forceinline__ void load_any(const void* base, int32_t dtype, int64_t i, int64_t stride, bool vec,
                                         float (&v)[N]) {
  if (vec) {
    load_vec<N>(base, dtype, i, v);
    return;
  }
#pragma unroll
  for (int e = 0; e < N; ++e) v[e] = load_one(base, dtype, i + e * stride);
}

}  // namespace strata::cuda

// ------------------------------------------------------------------------------------------------------
// Packed 16-byte vectors (uint4) of f32 (4 elements) or bf16/f16 (8 elements), for streaming kernels that
// keep their loads packed until used (half the registers of floats for 16-bit data) and convert on the fly.
// The dtype is a run-time value (a uniform branch). Results are rounded like store_vec (nearest even).
namespace strata::cuda {

// Elements per 16-byte vector of dtype (4 for f32, 8 for bf16/f16).
__host__ __device__ constexpr int vec16_elems(int32_t dtype) { return dtype == STRATA_DTYPE_F32 ? 4 : 8; }

// A 16-byte load that bypasses L1 (every byte is used once) and asks L2 to fetch the whole 256-byte block
// (consecutive lanes read consecutive vectors, so the neighbours are read next). The address must be 16-byte
// aligned. Not `.nc`: an output may alias the input (in-place use), and each element is loaded before the
// same thread stores it.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ void st_vec16(void* p, const uint4& v) { *static_cast<uint4*>(p) = v; }
// A plain 16-byte load (ld.global.v4, no cache hints), as Triton and torch's element-wise kernels issue them.
// Session 11 measured ld_stream's hints ~8 % slower in rms_norm_gated's register-tile forward on the H200
// (0.2054 against 0.1893 ms at bf16 [1048576, 128]); the kernels that used ld_stream pick either form with
// ld_vec16 (session 12: a same-run A/B per kernel). Same alignment and aliasing rules as ld_stream.
__device__ __forceinline__ uint4 ld_plain(const void* p) {
  uint4 v;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// ld_stream when `hinted`, else ld_plain (a compile-time or uniform run-time choice).
__device__ __forceinline__ uint4 ld_vec16(const void* p, bool hinted) { return hinted ? ld_stream(p) : ld_plain(p); }

// The 8 elements of a 16-bit vector as floats (low half of each word first).
__device__ __forceinline__ void unpack8(const uint4& u, int32_t dtype, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (dtype == STRATA_DTYPE_BF16) {
      f[2 * k] = __uint_as_float(w[k] << 16), f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    } else {
      const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
      f[2 * k] = h.x, f[2 * k + 1] = h.y;
    }
  }
}

// sum over the vector of a[e] * b[e], in element order (one fma chain).
__device__ __forceinline__ float vec16_dot(const uint4& a, const uint4& b, int32_t dtype, float acc) {
  if (dtype == STRATA_DTYPE_F32) {
    acc = fmaf(__uint_as_float(a.x), __uint_as_float(b.x), acc);
    acc = fmaf(__uint_as_float(a.y), __uint_as_float(b.y), acc);
    acc = fmaf(__uint_as_float(a.z), __uint_as_float(b.z), acc);
    return fmaf(__uint_as_float(a.w), __uint_as_float(b.w), acc);
  }
  float fa[8], fb[8];
  unpack8(a, dtype, fa);
  unpack8(b, dtype, fb);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(fa[e], fb[e], acc);
  return acc;
}

// out[e] = f(a[e], b[e]) for every element, repacked in dtype (f: float(float, float)).
template <class F>
__device__ __forceinline__ uint4 vec16_map(const uint4& a, const uint4& b, int32_t dtype, F f) {
  if (dtype == STRATA_DTYPE_F32)
    return make_uint4(__float_as_uint(f(__uint_as_float(a.x), __uint_as_float(b.x))),
                      __float_as_uint(f(__uint_as_float(a.y), __uint_as_float(b.y))),
                      __float_as_uint(f(__uint_as_float(a.z), __uint_as_float(b.z))),
                      __float_as_uint(f(__uint_as_float(a.w), __uint_as_float(b.w))));
  float fa[8], fb[8], o[8];
  unpack8(a, dtype, fa);
  unpack8(b, dtype, fb);
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = f(fa[e], fb[e]);
  return make_uint4(pack_half2(dtype, o[0], o[1]), pack_half2(dtype, o[2], o[3]), pack_half2(dtype, o[4], o[5]),
                    pack_half2(dtype, o[6], o[7]));
}

}  // namespace strata::cuda
