// causal_conv1d (docs/reference/ops_fused.md §5; README.md beside this file): the kernel params struct, the
// sequence / tap logic shared by the reference-independent kernels (CPU and CUDA), and the entry points.
//
// Depthwise causal convolution along time, per channel d, W taps (tap W-1 multiplies the current token):
//   u[t] = bias[d] + sum_k w[d, k] * xs[t - (W-1) + k],   y[t] = act(u[t]) (+ residual[t])
// x, y, residual, dy, dx: [B, T, D] (channel-last; any strides, unit channel stride is the fast path).
// A "sequence" is a batch row [0, T) (fixed length), a span [cu[n], cu[n+1]) of the single row (cu_seqlens,
// B = 1), or, with seq_idx [B, T], a batch row whose taps are masked by sequence id (ops_fused.md §5.3 and
// tools/fused_ops_golden.py: a tap at p < t counts only when seq_idx[p] == seq_idx[t]; the initial state
// belongs to the row's first sequence, i.e. counts only when seq_idx[t] == seq_idx[0]; a padding token,
// seq_idx[t] < 0, has act(u) forced to 0 as in Dao-AILab's kernel).
// States: initial_state / final_state / their gradients are [N, D, W-1] (N = sequences: B, or the number of
// cu_seqlens spans), slot j holding position j - (W-1) relative to the sequence start (oldest first).
//
// Sources ("tap k of token t"): p = t - (W-1) + k.  p >= start: x[p] (seq_idx: only if ids match);
// p < start: initial_state[n, d, p - start + W - 1] if given (seq_idx: only if seq_idx[t] == seq_idx[0]),
// else 0. final_state[n, d, j] is the source at p = end - (W-1) + j seen from the sequence's last token.
#pragma once

#include <cmath>
#include <cstdint>

#include "opbase/dtype.h"  // storage types, STRATA_HD; strata_status comes with it

namespace strata::conv {

// Widths: W in [2, kMaxWidth]. 2, 3, 4 take the unrolled fast paths (CPU and CUDA), the others a general path.
inline constexpr int kMaxWidth = 16;

enum Conv1dActivation : int32_t { kActNone = 0, kActSilu = 1 };

// Which way the sequences are given.
enum Conv1dMode : int32_t { kModeRows = 0, kModeCuSeqlens = 1, kModeSeqIdx = 2 };

struct Conv1dParams {
  // Forward inputs (descriptor offsets applied). bias, residual, h0 (initial_state): nullptr when absent.
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;
  const void* h0 = nullptr;
  const void* cu_seqlens = nullptr;  // int32 or int64 [N + 1] (kModeCuSeqlens)
  const void* seq_idx = nullptr;     // int32 or int64 [B, T] (kModeSeqIdx)
  // Forward outputs: y [B, T, D], hT (final_state, nullptr when not asked) [N, D, W-1].
  void* y = nullptr;
  void* hT = nullptr;
  // Backward inputs dy [B, T, D], dhT (gradient of final_state, nullptr = zero) [N, D, W-1]; outputs dx,
  // dw (like weight), db (like bias; nullptr when not asked), dh0 (like h0; nullptr when not asked).
  const void* dy = nullptr;
  const void* dhT = nullptr;
  void* dx = nullptr;
  void* dw = nullptr;
  void* db = nullptr;
  void* dh0 = nullptr;

  int32_t x_dtype = 0;  // x, y, residual, dy, dx (the activation dtype)
  int32_t w_dtype = 0, b_dtype = 0;  // weight and dw; bias and db
  int32_t h0_dtype = 0, hT_dtype = 0, dhT_dtype = 0, dh0_dtype = 0;
  int32_t cu_dtype = 0, seq_dtype = 0;  // STRATA_DTYPE_I32 / I64
  int32_t mode = kModeRows;
  int32_t activation = kActNone;

  int64_t B = 0, T = 0, D = 0, W = 0;
  int64_t N = 0;  // states: B (rows, seq_idx) or cu_seqlens entries - 1

  // Element strides. Activations (b, t, d); weight/dw (d, k) whatever the stored layout ([D, W] or [W, D]);
  // bias/db (d); states (n, d, j); seq_idx (b, t); cu_seqlens (i).
  int64_t xs[3] = {}, ys[3] = {}, rs[3] = {}, dys[3] = {}, dxs[3] = {};
  int64_t ws[2] = {}, dws[2] = {};
  int64_t bs = 0, dbs = 0;
  int64_t h0s[3] = {}, hTs[3] = {}, dhTs[3] = {}, dh0s[3] = {};
  int64_t seqs[2] = {};
  int64_t cus = 1;
  // Every activation tensor of the call has unit channel stride (the vector paths need it).
  bool channels_contiguous = false;
};

STRATA_HD float silu_f(float v) { return v / (1.f + expf(-v)); }
// d silu / dv = sigma(v) * (1 + v * (1 - sigma(v)))
STRATA_HD float dsilu_f(float v) {
  const float s = 1.f / (1.f + expf(-v));
  return s * (1.f + v * (1.f - s));
}

// Any float dtype element as f32 (states, weights, bias: small tensors read element-wise).
STRATA_HD float ld_f32(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case STRATA_DTYPE_F64: return static_cast<float>(static_cast<const double*>(base)[i]);
    case STRATA_DTYPE_F32: return static_cast<const float*>(base)[i];
    case STRATA_DTYPE_BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
}
STRATA_HD void st_f32(void* base, int32_t dtype, int64_t i, float v) {
  switch (dtype) {
    case STRATA_DTYPE_F64: static_cast<double*>(base)[i] = v; break;
    case STRATA_DTYPE_F32: static_cast<float*>(base)[i] = v; break;
    case STRATA_DTYPE_BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(v); break;
    default: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(v); break;
  }
}
STRATA_HD int64_t ld_int(const void* base, int32_t dtype, int64_t i) {
  return dtype == STRATA_DTYPE_I64 ? static_cast<const int64_t*>(base)[i]
                                   : static_cast<int64_t>(static_cast<const int32_t*>(base)[i]);
}

// cu_seqlens[i] clamped to [0, T]: kernels may assume nothing about the values (the CUDA path cannot check
// them without a device-to-host copy), and clamped values keep every access inside [0, T).
STRATA_HD int64_t cu_at(const Conv1dParams& p, int64_t i) {
  const int64_t v = ld_int(p.cu_seqlens, p.cu_dtype, i * p.cus);
  return v < 0 ? 0 : (v > p.T ? p.T : v);
}
STRATA_HD int64_t seq_at(const Conv1dParams& p, int64_t b, int64_t t) {
  return ld_int(p.seq_idx, p.seq_dtype, b * p.seqs[0] + t * p.seqs[1]);
}

// The sequence of token t of row b: state index n, span [start, end). cu_seqlens: the last n in [0, N-1] with
// cu[n] <= t (so zero-length sequences are skipped); rows and seq_idx: n = b, [0, T).
struct SeqSpan {
  int64_t n, start, end;
};
STRATA_HD SeqSpan find_sequence(const Conv1dParams& p, int64_t b, int64_t t) {
  if (p.mode != kModeCuSeqlens) return {b, 0, p.T};
  int64_t lo = 0, hi = p.N - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (cu_at(p, mid) <= t) lo = mid;
    else hi = mid - 1;
  }
  return {lo, cu_at(p, lo), cu_at(p, lo + 1)};
}

// Where tap k of token t (in sequence `s`) reads from: kind 0 zero, 1 x at position pos, 2 initial state slot
// pos of sequence s.n. Element-wise slow paths (sequence starts, masked taps, strided tensors) use it.
struct TapSource {
  int kind;
  int64_t pos;
};
STRATA_HD TapSource tap_source(const Conv1dParams& p, int64_t b, int64_t t, const SeqSpan& s, int64_t k) {
  const int64_t pos = t - (p.W - 1) + k;
  if (pos >= s.start) {
    if (p.mode == kModeSeqIdx && pos != t && seq_at(p, b, pos) != seq_at(p, b, t)) return {0, 0};
    return {1, pos};
  }
  if (!p.h0) return {0, 0};
  if (p.mode == kModeSeqIdx && seq_at(p, b, t) != seq_at(p, b, 0)) return {0, 0};
  return {2, pos - s.start + p.W - 1};
}

// Whether token t is padding (seq_idx < 0): act(u) is 0 there and so is its gradient.
STRATA_HD bool is_padding(const Conv1dParams& p, int64_t b, int64_t t) {
  return p.mode == kModeSeqIdx && seq_at(p, b, t) < 0;
}

STRATA_HD float weight_at(const Conv1dParams& p, int64_t d, int64_t k) {
  return ld_f32(p.weight, p.w_dtype, d * p.ws[0] + k * p.ws[1]);
}
STRATA_HD float bias_at(const Conv1dParams& p, int64_t d) {
  return p.bias ? ld_f32(p.bias, p.b_dtype, d * p.bs) : 0.f;
}
STRATA_HD float h0_at(const Conv1dParams& p, int64_t n, int64_t d, int64_t j) {
  return ld_f32(p.h0, p.h0_dtype, n * p.h0s[0] + d * p.h0s[1] + j * p.h0s[2]);
}

// Value of a tap source for channel d (f32). x is read through its run-time dtype.
STRATA_HD float source_value(const Conv1dParams& p, int64_t b, int64_t n, int64_t d, TapSource src) {
  if (src.kind == 1) return ld_f32(p.x, p.x_dtype, b * p.xs[0] + src.pos * p.xs[1] + d * p.xs[2]);
  if (src.kind == 2) return h0_at(p, n, d, src.pos);
  return 0.f;
}

// Pre-activation u[t] for channel d, element-wise (f32, taps in k order after the bias: the same order as
// every vector path, so slow and fast tokens round alike).
STRATA_HD float pre_activation(const Conv1dParams& p, int64_t b, int64_t t, const SeqSpan& s, int64_t d) {
  float acc = bias_at(p, d);
  for (int64_t k = 0; k < p.W; ++k) {
    const TapSource src = tap_source(p, b, t, s, k);
    if (src.kind != 0) acc = fmaf(weight_at(p, d, k), source_value(p, b, s.n, d, src), acc);
  }
  return acc;
}

// g[t] = dy[t] * act'(u[t]) for channel d (0 for padding tokens).
STRATA_HD float grad_pre(const Conv1dParams& p, int64_t b, int64_t t, const SeqSpan& s, int64_t d) {
  if (is_padding(p, b, t)) return 0.f;
  const float dyv = ld_f32(p.dy, p.x_dtype, b * p.dys[0] + t * p.dys[1] + d * p.dys[2]);
  if (p.activation == kActNone) return dyv;
  return dyv * dsilu_f(pre_activation(p, b, t, s, d));
}

// The row/sequence whose final state is n, as (b, span): rows b = n; cu_seqlens b = 0, [cu[n], cu[n+1]).
STRATA_HD void state_sequence(const Conv1dParams& p, int64_t n, int64_t& b, SeqSpan& s) {
  if (p.mode == kModeCuSeqlens) {
    b = 0;
    s = {n, cu_at(p, n), cu_at(p, n + 1)};
    if (s.end < s.start) s.end = s.start;  // only with invalid cu_seqlens
  } else {
    b = n;
    s = {n, 0, p.T};
  }
}

// final_state[n, d, j] (j < W-1): the source at position end - (W-1) + j as the sequence's last token sees it.
STRATA_HD float final_state_value(const Conv1dParams& p, int64_t n, int64_t d, int64_t j) {
  int64_t b;
  SeqSpan s;
  state_sequence(p, n, b, s);
  const int64_t pos = s.end - (p.W - 1) + j;
  const bool seq = p.mode == kModeSeqIdx && s.end > 0;
  if (pos >= s.start) {
    if (seq && seq_at(p, b, pos) != seq_at(p, b, s.end - 1)) return 0.f;
    return ld_f32(p.x, p.x_dtype, b * p.xs[0] + pos * p.xs[1] + d * p.xs[2]);
  }
  if (!p.h0) return 0.f;
  if (seq && seq_at(p, b, 0) != seq_at(p, b, s.end - 1)) return 0.f;
  return h0_at(p, n, d, pos - s.start + p.W - 1);
}

// The gradient of final_state reaching x[pos] (pos a position of row b in sequence s), 0 if none.
STRATA_HD float dfinal_to_x(const Conv1dParams& p, int64_t b, int64_t pos, const SeqSpan& s, int64_t d) {
  if (!p.dhT) return 0.f;
  const int64_t j = pos - (s.end - (p.W - 1));
  if (j < 0) return 0.f;
  if (p.mode == kModeSeqIdx && seq_at(p, b, pos) != seq_at(p, b, s.end - 1)) return 0.f;
  return ld_f32(p.dhT, p.dhT_dtype, s.n * p.dhTs[0] + d * p.dhTs[1] + j * p.dhTs[2]);
}

// dinitial_state[n, d, j] (j < W-1), element-wise: sum over taps reading slot j (token t = start + j - k) of
// w[k] g[t], plus the final-state gradient when the sequence is shorter than W-1. Used by every
// implementation except the reference (the work is N * D * W^2, negligible next to the main pass).
STRATA_HD float dinitial_value(const Conv1dParams& p, int64_t n, int64_t d, int64_t j) {
  int64_t b;
  SeqSpan s;
  state_sequence(p, n, b, s);
  float acc = 0.f;
  for (int64_t k = 0; k <= j; ++k) {
    const int64_t t = s.start + j - k;
    if (t >= s.end) continue;
    const TapSource src = tap_source(p, b, t, s, k);
    if (src.kind != 2) continue;
    acc = fmaf(weight_at(p, d, k), grad_pre(p, b, t, s, d), acc);
  }
  if (p.dhT) {
    const int64_t jf = j - (s.end - s.start);  // final slot jf reads initial slot len + jf
    const bool seq_ok = p.mode != kModeSeqIdx || s.end == 0 || seq_at(p, b, 0) == seq_at(p, b, s.end - 1);
    if (jf >= 0 && seq_ok) acc += ld_f32(p.dhT, p.dhT_dtype, n * p.dhTs[0] + d * p.dhTs[1] + jf * p.dhTs[2]);
  }
  return acc;
}

// Time tiles: each batch row is cut into tiles of `tile` tokens; tile i of the whole problem is (b, t0).
STRATA_HD int64_t tiles_per_row(const Conv1dParams& p, int64_t tile) { return (p.T + tile - 1) / tile; }

// Host check of the cu_seqlens values (CPU implementations, before writing anything): cu[0] == 0,
// non-decreasing, cu[N] == T. Sets the last error and returns STRATA_ERROR_INVALID_VALUE otherwise.
strata_status check_cu_seqlens_values(const Conv1dParams& p, const char* op);

// float64 references: plain loops written from the definition (not from the helpers above).
void causal_conv1d_fwd_reference(const Conv1dParams& p);
void causal_conv1d_bwd_reference(const Conv1dParams& p);

// CPU kernels per Highway target (nullptr when not compiled). f32/bf16/f16 activations. Backward workspace:
// f32 partial sums [time tiles][W + 1][D] (cpu_bwd_workspace bytes).
using Conv1dCpuFn = void (*)(const Conv1dParams&, void* workspace);
Conv1dCpuFn causal_conv1d_fwd_cpu(int64_t hwy_target);
Conv1dCpuFn causal_conv1d_bwd_cpu(int64_t hwy_target);
// The AVX3 kernels with bf16 outputs rounded by AVX512-BF16 ("cpu.avx512_bf16"; nullptr when AVX3 was not
// compiled). Only offered on CPUs with the feature.
Conv1dCpuFn causal_conv1d_fwd_cpu_native_bf16();
Conv1dCpuFn causal_conv1d_bwd_cpu_native_bf16();
size_t causal_conv1d_cpu_bwd_workspace(const Conv1dParams& p);

// Whether the "cuda.sm90.vec" kernels cover a problem, known at plan time (pointer alignment is checked when
// they run; a misaligned call takes the time_tile kernels): batch rows or cu_seqlens packs as sequences (no
// seq_idx), W <= 4, f32/bf16/f16 activations with unit channel stride, D % 8 == 0 and batch / time strides of
// every activation tensor multiples of 8 elements. Empty string when covered, else the reason.
inline const char* causal_conv1d_vec_reason(const Conv1dParams& p, bool backward) {
  if (p.mode == kModeSeqIdx) return "takes batch rows or cu_seqlens packs (no seq_idx)";
  if (p.W > 4) return "takes W <= 4";
  if (p.x_dtype != STRATA_DTYPE_F32 && p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16)
    return "takes f32/bf16/f16 activations";
  if (!p.channels_contiguous || p.D % 8 != 0) return "needs unit channel stride and D % 8 == 0";
  const int64_t* st[3] = {p.xs, backward ? p.dys : p.ys, backward ? p.dxs : p.rs};
  for (const int64_t* s : st)
    if (s[0] % 8 != 0 || s[1] % 8 != 0) return "needs batch / time strides that are multiples of 8 elements";
  return "";
}

// Whether the "cuda.sm90.pipe" kernels cover a problem (plan time): the vec conditions with bf16/f16
// activations (16-byte cp.async pieces of 8 channels; f32 stays on the vec kernels) and, forward, no residual.
inline const char* causal_conv1d_pipe_reason(const Conv1dParams& p, bool backward) {
  const char* r = causal_conv1d_vec_reason(p, backward);
  if (*r) return r;
  if (p.x_dtype != STRATA_DTYPE_BF16 && p.x_dtype != STRATA_DTYPE_F16) return "takes bf16/f16 activations";
  if (!backward && p.residual) return "forward without a residual (cuda.sm90.vec takes residuals)";
  return "";
}

// Whether the "cuda.sm90.lean" backward covers a problem (plan time): the pipe conditions (batch rows or
// cu_seqlens packs; cu_seqlens since session 8).
inline const char* causal_conv1d_lean_reason(const Conv1dParams& p, bool backward) {
  return causal_conv1d_pipe_reason(p, backward);
}
#if STRATA_WITH_CUDA
// CUDA (sm_90): returns a strata_status. Backward workspace: cuda_bwd_workspace bytes (both kernel sets).
//   *_cuda:     "cuda.sm90.time_tile", every mode, width, stride and alignment.
//   *_cuda_vec: "cuda.sm90.vec", problems with causal_conv1d_vec_reason(p) == "" (else undefined).
//   *_cuda_pipe: "cuda.sm90.pipe", problems with causal_conv1d_pipe_reason(p, backward) == "".
int causal_conv1d_fwd_cuda(const Conv1dParams& p, void* stream);
int causal_conv1d_bwd_cuda(const Conv1dParams& p, void* workspace, void* stream);
int causal_conv1d_fwd_cuda_vec(const Conv1dParams& p, void* stream);
int causal_conv1d_bwd_cuda_vec(const Conv1dParams& p, void* workspace, void* stream);
int causal_conv1d_fwd_cuda_pipe(const Conv1dParams& p, void* stream);
int causal_conv1d_bwd_cuda_pipe(const Conv1dParams& p, void* workspace, void* stream);
//   *_cuda_lean: "cuda.sm90.lean" (backward only), problems with causal_conv1d_lean_reason(p, true) == "".
int causal_conv1d_bwd_cuda_lean(const Conv1dParams& p, void* workspace, void* stream);
size_t causal_conv1d_cuda_bwd_workspace(const Conv1dParams& p);
#endif

}  // namespace strata::conv
