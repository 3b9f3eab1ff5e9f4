// clipped_swiglu (ops_fused.md §8; README.md beside this file): kernel params, the per-pair math shared by
// every implementation (STRATA_HD), and the kernel entry points.
//
//   x [..., 2I] -> y [..., I] (x's dtype); probs [...] (optional per-row multiplier, any float dtype).
//   Pair i of a row: gate A and linear B at (2i, 2i + 1) (interleaved, GPT-OSS) or (i, I + i) (split,
//   Megatron / DeepSeek).
//     a = min(A, limit), b = clamp(B, -limit, limit), s = sigmoid(alpha a), y0 = a s (b + bias), y = y0 p
//   GPT-OSS: alpha 1.702, limit 7, bias 1; DeepSeek-V4: alpha 1 (plain SiLU), limit 10, bias 0.
//   Backward (g = dy p; clamp gradients pass on the closed interval, as torch.clamp):
//     dA = g (b + bias) s (1 + alpha a (1 - s)) [A <= limit],   dB = g a s [-limit <= B <= limit],
//     dprobs[row] = sum_i y0_i dy_i (fixed-order row reduction).
#pragma once

#include <cstdint>
#include <string>

#include "opbase/dtype.h"
#include "opbase/row_layout.h"

#ifdef __CUDACC__
#define STRATA_CSW_EXP expf
#else
#include <cmath>
#define STRATA_CSW_EXP std::exp
#endif

namespace strata::activation {

struct ClippedSwigluFwdParams {
  const void* x = nullptr;
  const void* probs = nullptr;  // nullptr: p = 1
  void* y = nullptr;
  int32_t x_dtype = 0;          // x and y
  int32_t probs_dtype = 0;
  int64_t rows = 0, I = 0;      // x rows hold 2I elements, y rows I
  RowLayout x_rows, y_rows, probs_rows;  // probs_rows: one element per row
  float alpha = 1.702f, limit = 7.f, bias = 1.f;
  bool interleaved = true;
};

struct ClippedSwigluBwdParams {
  const void* x = nullptr;
  const void* probs = nullptr;
  const void* dy = nullptr;
  void* dx = nullptr;
  void* dprobs = nullptr;       // nullptr: not computed (needs probs)
  int32_t x_dtype = 0;          // x, dy, dx
  int32_t probs_dtype = 0, dprobs_dtype = 0;
  int64_t rows = 0, I = 0;
  RowLayout x_rows, dy_rows, dx_rows, probs_rows, dprobs_rows;
  float alpha = 1.702f, limit = 7.f, bias = 1.f;
  bool interleaved = true;
};

// Element offsets of gate and linear value of pair i inside a row (times the column stride).
STRATA_HD int64_t csw_gate_col(bool interleaved, int64_t I, int64_t i) { return interleaved ? 2 * i : i; }
STRATA_HD int64_t csw_lin_col(bool interleaved, int64_t I, int64_t i) { return interleaved ? 2 * i + 1 : I + i; }

// Forward of one pair (unscaled y0). NaN inputs stay NaN (comparisons, not fmin/fmax).
template <class T>
STRATA_HD T csw_fwd(T A, T B, T alpha, T limit, T bias) {
  const T a = A > limit ? limit : A;
  const T b = B > limit ? limit : (B < -limit ? -limit : B);
  const T s = T(1) / (T(1) + STRATA_CSW_EXP(-alpha * a));
  return a * s * (b + bias);
}
// Backward of one pair given g = dy * p: writes dA, dB; returns y0 (for dprobs).
template <class T>
STRATA_HD T csw_bwd(T A, T B, T g, T alpha, T limit, T bias, T* dA, T* dB) {
  const T a = A > limit ? limit : A;
  const T b = B > limit ? limit : (B < -limit ? -limit : B);
  const T s = T(1) / (T(1) + STRATA_CSW_EXP(-alpha * a));
  *dA = A <= limit ? g * (b + bias) * s * (T(1) + alpha * a * (T(1) - s)) : T(0);
  *dB = (B >= -limit && B <= limit) ? g * a * s : T(0);
  return a * s * (b + bias);
}

// float64 reference (any float dtypes, any strides) and the same loops in f32 arithmetic (the naive result of
// the acceptance rule, for the ATK harness).
void clipped_swiglu_fwd_reference(const ClippedSwigluFwdParams& p);
void clipped_swiglu_bwd_reference(const ClippedSwigluBwdParams& p);
void clipped_swiglu_fwd_naive_f32(const ClippedSwigluFwdParams& p);
void clipped_swiglu_bwd_naive_f32(const ClippedSwigluBwdParams& p);

// CPU kernels per Highway target (nullptr when not compiled): f32/bf16/f16 x, any float probs.
using ClippedSwigluFwdFn = void (*)(const ClippedSwigluFwdParams&);
using ClippedSwigluBwdFn = void (*)(const ClippedSwigluBwdParams&);
ClippedSwigluFwdFn clipped_swiglu_fwd_cpu(int64_t hwy_target);
ClippedSwigluBwdFn clipped_swiglu_bwd_cpu(int64_t hwy_target);
// The AVX3 kernels with bf16 outputs rounded by AVX512-BF16 ("cpu.avx512_bf16"; nullptr when AVX3 was not
// compiled). Only offered on CPUs with the feature.
ClippedSwigluFwdFn clipped_swiglu_fwd_cpu_native_bf16();
ClippedSwigluBwdFn clipped_swiglu_bwd_cpu_native_bf16();

#if STRATA_WITH_CUDA
// CUDA (sm_90): forward one thread per 8 outputs (16-byte accesses) or element-wise; backward a block per
// row (dprobs by a fixed block reduction). Returns a strata_status.
int clipped_swiglu_fwd_cuda(const ClippedSwigluFwdParams& p, void* stream);
int clipped_swiglu_bwd_cuda(const ClippedSwigluBwdParams& p, void* stream);
// clipped_swiglu_fwd_cuda with a choice of its streaming kernel (dense interleaved rows, I % 8 == 0, aligned; other
// layouts run the chunk kernels as there). Session 12 default (s12run1, C++ queued, bf16 [32768, 2 x 2880]): plain
// ld.global.v4 loads, 4 16-byte vectors per thread, a grid that covers the tiles once: 0.1333 ms = 0.986 x the copy
// floor, against 0.1465 with ld_stream's hints (L1::no_allocate.L2::256B) on that grid, 0.1509 / 0.1612 (plain /
// hinted) on the session-4 one-wave persistent grid (next tile's loads before the current one's math), 0.1341 with
// 8 vectors, and tile_tma's 0.1455. `vectors` 8 only with persistent = false.
struct ClippedSwigluStreamTile {
  bool l2_hint_loads = false;
  bool persistent = false;
  int vectors = 4;
};
int clipped_swiglu_fwd_cuda_stream(const ClippedSwigluFwdParams& p, void* stream, ClippedSwigluStreamTile tile);
// The implementation cuda.sm90.stream_regs (session 12, first in dispatch since s12run1): the streaming kernel with
// the default tile above (plain loads, a grid that covers the tiles once); "" if a plan may take it
// (f32/bf16/f16, interleaved, I % 8 == 0, dense x and y rows), else why not. Rows that turn out unaligned at run
// time take the chunk kernels (clipped_swiglu_fwd_cuda_stream's fallback).
std::string clipped_swiglu_fwd_cuda_stream_reject(const ClippedSwigluFwdParams& p);
// The bulk-copy ring forward (cuda.sm90.bulk_ring): f32/bf16/f16, I % 8 == 0, equally spaced x and y rows
// with unit column strides, x rows of at most 48 KiB, either layout; "" if a plan with these params may take
// it, else why not. At run time rows that are not 16-byte aligned go to clipped_swiglu_fwd_cuda.
std::string clipped_swiglu_fwd_cuda_ring_reject(const ClippedSwigluFwdParams& p);
int clipped_swiglu_fwd_cuda_ring(const ClippedSwigluFwdParams& p, void* stream);
// The tiled bulk-copy forward (cuda.sm90.tile_tma, session 9): short-lived blocks, each owning whole x rows of
// about `x_bytes` that the copy engine loads, and the y tile it stores, `threads` threads at most. "" if a plan
// may take it (the ring's conditions and x rows of at most 30 KiB), else why not; at run time rows that are not
// 16-byte aligned run clipped_swiglu_fwd_cuda. The default tile is the impl's.
// flags: bit 0 stores y with an L2 evict-first policy, bit 1 loads x with it, bit 2 (session 10) writes y from the
// threads' registers straight to global memory (no y tile in shared memory: 11.25 KiB instead of 17 per block at
// the GPT-OSS shape, no bulk store, no wait for it before the block exits; bit 0 then does nothing). The default,
// flags 4 since session 10 (s10run1, C++ queued, [32768, 2 x 2880]: 0.1452 ms = 1.075 x the copy floor against
// 0.1479 with the bulk-stored y tile).
struct ClippedSwigluTmaTile {
  int64_t x_bytes = 8 * 1024;
  int threads = 128;
  int flags = 4;
};
std::string clipped_swiglu_fwd_cuda_tma_reject(const ClippedSwigluFwdParams& p);
int clipped_swiglu_fwd_cuda_tma(const ClippedSwigluFwdParams& p, void* stream, ClippedSwigluTmaTile tile = {});
#endif

}  // namespace strata::activation
