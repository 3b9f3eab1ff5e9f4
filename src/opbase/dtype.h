// dtypes: sizes, names, and the f16/bf16 <-> f32 conversions (round to nearest even), usable on the host
// and in CUDA device code. The conversions are tested over all 65536 bit patterns (tests/cpp/test_dtype.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "strata/ops.h"

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif

namespace strata {

enum class DType : int32_t {
  f64 = STRATA_DTYPE_F64,
  f32 = STRATA_DTYPE_F32,
  f16 = STRATA_DTYPE_F16,
  bf16 = STRATA_DTYPE_BF16,
  i64 = STRATA_DTYPE_I64,
  i32 = STRATA_DTYPE_I32,
  i16 = STRATA_DTYPE_I16,
  i8 = STRATA_DTYPE_I8,
  u8 = STRATA_DTYPE_U8,
  boolean = STRATA_DTYPE_BOOL,
};

inline constexpr size_t kDTypeSize[STRATA_DTYPE_COUNT] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1};
inline constexpr const char* kDTypeName[STRATA_DTYPE_COUNT] = {"f64", "f32", "f16", "bf16", "i64",
                                                                "i32", "i16", "i8",  "u8",   "bool"};
static_assert(sizeof(kDTypeSize) / sizeof(kDTypeSize[0]) == STRATA_DTYPE_COUNT);
static_assert(sizeof(kDTypeName) / sizeof(kDTypeName[0]) == STRATA_DTYPE_COUNT);

inline bool valid_dtype(int32_t d) { return d >= 0 && d < STRATA_DTYPE_COUNT; }
inline size_t dtype_size(int32_t d) { return valid_dtype(d) ? kDTypeSize[d] : 0; }
inline const char* dtype_name(int32_t d) { return valid_dtype(d) ? kDTypeName[d] : "?"; }
inline bool is_float(int32_t d) {
  return d == STRATA_DTYPE_F64 || d == STRATA_DTYPE_F32 || d == STRATA_DTYPE_F16 || d == STRATA_DTYPE_BF16;
}
// Unit roundoff (half an ulp at 1) of a float dtype: the error of one rounding to it.
inline double unit_roundoff(int32_t d) {
  switch (d) {
    case STRATA_DTYPE_F64: return 0x1p-53;
    case STRATA_DTYPE_F32: return 0x1p-24;
    case STRATA_DTYPE_F16: return 0x1p-11;
    case STRATA_DTYPE_BF16: return 0x1p-8;
    default: return 0.0;
  }
}

STRATA_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
STRATA_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// bf16 is the top half of an f32. Rounding adds 0x7fff plus the lowest kept bit (ties to even); NaN is kept
// quiet explicitly because the addition could carry a NaN payload into Inf.
STRATA_HD uint16_t f32_to_bf16_bits(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
STRATA_HD float bf16_bits_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
STRATA_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));  // Inf / NaN (payload kept)
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24 is exact in f32.
  const float v = static_cast<float>(man) * 0x1p-24f;
  return sign ? -v : v;
}

STRATA_HD uint16_t f32_to_f16_bits(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quiet
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (a >= 0x38800000u) {                                             // normal f16 (>= 2^-14)
    uint32_t r = a - 0x38000000u;                                    // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);                                  // round to nearest even on bit 13
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal f16: value = m * 2^-24 with m < 1024. Shift the full 24-bit mantissa into place and round.
  const uint32_t e = a >> 23;                       // f32 biased exponent, 102..112
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;                  // 14..24
  uint32_t m = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return static_cast<uint16_t>(sign | m);
}

// Storage types for kernels. Plain 16-bit wrappers; math always happens in f32.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

STRATA_HD float to_f32(float x) { return x; }
STRATA_HD float to_f32(double x) { return static_cast<float>(x); }
STRATA_HD float to_f32(bf16_t x) { return bf16_bits_to_f32(x.bits); }
STRATA_HD float to_f32(f16_t x) { return f16_bits_to_f32(x.bits); }

template <class T>
STRATA_HD T from_f32(float x);
template <>
STRATA_HD float from_f32<float>(float x) { return x; }
template <>
STRATA_HD double from_f32<double>(float x) { return x; }
template <>
STRATA_HD bf16_t from_f32<bf16_t>(float x) { return bf16_t{f32_to_bf16_bits(x)}; }
template <>
STRATA_HD f16_t from_f32<f16_t>(float x) { return f16_t{f32_to_f16_bits(x)}; }

// Rounds a value to what a dtype can hold (for references that model storage rounding).
inline double round_to(int32_t dtype, double v) {
  switch (dtype) {
    case STRATA_DTYPE_F32: return static_cast<float>(v);
    case STRATA_DTYPE_BF16: return bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(v)));
    case STRATA_DTYPE_F16: return f16_bits_to_f32(f32_to_f16_bits(static_cast<float>(v)));
    default: return v;
  }
}

// Calls fn(T{}) with T the storage type of a float dtype (double, float, bf16_t, f16_t).
template <class Fn>
decltype(auto) visit_float_dtype(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case STRATA_DTYPE_F64: return fn(double{});
    case STRATA_DTYPE_F32: return fn(float{});
    case STRATA_DTYPE_BF16: return fn(bf16_t{});
    default: return fn(f16_t{});
  }
}

}  // namespace strata

namespace strata {

// Host-side element access by run-time dtype (for references and tests; kernels use typed pointers).
inline double load_elem(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case STRATA_DTYPE_F64: return static_cast<const double*>(base)[i];
    case STRATA_DTYPE_F32: return static_cast<const float*>(base)[i];
    case STRATA_DTYPE_BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case STRATA_DTYPE_F16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case STRATA_DTYPE_I64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case STRATA_DTYPE_I32: return static_cast<const int32_t*>(base)[i];
    case STRATA_DTYPE_I16: return static_cast<const int16_t*>(base)[i];
    case STRATA_DTYPE_I8: return static_cast<const int8_t*>(base)[i];
    case STRATA_DTYPE_U8: return static_cast<const uint8_t*>(base)[i];
    case STRATA_DTYPE_BOOL: return static_cast<const uint8_t*>(base)[i] != 0;
    default: return 0.0;
  }
}
// Stores v rounded to nearest even (floats) or truncated toward zero (integers).
inline void store_elem(void* base, int32_t dtype, int64_t i, double v) {
  switch (dtype) {
    case STRATA_DTYPE_F64: static_cast<double*>(base)[i] = v; break;
    case STRATA_DTYPE_F32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case STRATA_DTYPE_BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(static_cast<float>(v)); break;
    case STRATA_DTYPE_F16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(static_cast<float>(v)); break;
    case STRATA_DTYPE_I64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case STRATA_DTYPE_I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case STRATA_DTYPE_I16: static_cast<int16_t*>(base)[i] = static_cast<int16_t>(v); break;
    case STRATA_DTYPE_I8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v); break;
    case STRATA_DTYPE_U8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    case STRATA_DTYPE_BOOL: static_cast<uint8_t*>(base)[i] = v != 0.0; break;
    default: break;
  }
}

}  // namespace strata
