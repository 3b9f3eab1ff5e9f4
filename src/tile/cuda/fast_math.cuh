// Approximate single-instruction math for kernels whose outputs are bf16 / f16: the results differ from the
// precise forms by a few f32 ulps, far below one 16-bit rounding. The flush-to-zero forms are one MUFU
// instruction each (ex2_ftz adds nothing; the caller's scale by log2(e) is one FMUL), where __expf / rsqrtf /
// __fdividef carry compares and predicated multiplies to keep denormal inputs and results; denormals change
// nothing in these uses (1 + e rounds to 1 either way; rsqrt's input is >= eps).
#pragma once

#include <cuda_runtime.h>

namespace strata::cuda {

__device__ __forceinline__ float ex2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float rsqrt_ftz(float x) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// 1 / (1 + e^-v): FMUL, MUFU.EX2, FADD, MUFU.RCP. v -> -inf: e^-v = +inf, 1 / inf = 0; v -> +inf: 1.
__device__ __forceinline__ float sigmoid_fast(float v) {
  return rcp_ftz(1.f + ex2_ftz(v * -1.4426950408889634f));
}

// min / max that return NaN when either input is NaN (sm_80+: one FMNMX each), i.e. the clamp
// `v > hi ? hi : v` of a NaN v stays NaN as it does with the compare-and-select form (2 instructions), where
// fminf / fmaxf would return the other operand.
__device__ __forceinline__ float fmin_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

}  // namespace strata::cuda
