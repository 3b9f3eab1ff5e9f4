// Shared pieces of the four Gated DeltaNet backward chunk operators (ops_gdn_kda.md §4.6 bwd, §4.9-§4.11):
// the strided tensor view the kernels read, the problem dimensions, the host-side chunk/sequence
// enumeration (CPU kernels and references), the run-time cu_seqlens / chunk-count checks, and the
// validation helpers of the four plan functions.
//
// Layouts (fla's, §1.2): q, k [B, T, H, K]; v-like [B, T, HV, V]; w-like [B, T, HV, K]; gates, beta
// [B, T, HV]; A [B, T, HV, BT]; chunk states h, dh [B, NT, HV, K, V]; h0, dht, dh0 [N, HV, K, V]. The last
// dimension is contiguous; the outer dimensions may have any non-negative strides. GVA: value head hv reads
// q/k head hv / G (G = HV / H, repeat_interleave order).
//
// Chunks (§1.3): chunks of BT tokens restart at every sequence start; fixed length: sequences are the batch
// rows and chunk c of row b is h[b, c]; variable length (B = 1): sequence n's chunk c is
// h[0, chunk_offsets[n] + c] with chunk_offsets the exclusive prefix sum of ceil(L_n / BT).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "strata/ops.h"

namespace strata::linear_attn::gdn_bwd {

// A tensor as the kernels see it: base pointer with the descriptor offset applied, dtype, and the element
// strides of up to four outer dimensions (the last dimension has unit stride and is not listed).
struct View {
  void* p = nullptr;  // nullptr: the tensor is absent (optional inputs / outputs)
  int32_t dtype = STRATA_DTYPE_F32;
  int64_t s[4] = {0, 0, 0, 0};
  STRATA_HD bool present() const { return p != nullptr; }
  STRATA_HD int64_t off(int64_t a, int64_t b, int64_t c) const { return a * s[0] + b * s[1] + c * s[2]; }
  STRATA_HD int64_t off(int64_t a, int64_t b, int64_t c, int64_t d) const {
    return a * s[0] + b * s[1] + c * s[2] + d * s[3];
  }
};

// Problem dimensions shared by the four operators.
struct Dims {
  int64_t B = 0, T = 0, H = 0, HV = 0, G = 1, K = 0, V = 0;
  int64_t N = 0;         // sequences: B (fixed length) or len(cu_seqlens) - 1
  int64_t NT = 0;        // size of the chunk dimension of h / dh (0 when the op has no chunk-state tensor)
  int32_t BT = 64;       // chunk size: 16, 32 or 64
  const int64_t* cu = nullptr;  // cu_seqlens element 0, nullptr in fixed-length mode
  int64_t cu_stride = 1;
  STRATA_HD bool varlen() const { return cu != nullptr; }
  STRATA_HD int64_t cu_at(int64_t i) const {  // clamped to [0, T]: kernels may assume nothing about values
    const int64_t x = cu[i * cu_stride];
    return x < 0 ? 0 : (x > T ? T : x);
  }
  STRATA_HD int64_t chunks_per_row() const { return (T + BT - 1) / BT; }
};

// One chunk [t0, t1) of batch row b; hc is its index along the chunk dimension of h / dh.
struct Chunk {
  int64_t b, t0, t1, hc, n;
};
// One sequence [bos, eos) of batch row b; its chunks are hc0, hc0 + 1, ... along h's chunk dimension.
struct Seq {
  int64_t b, bos, eos, hc0, n;
};

// ---- the chunk walk of the CUDA kernels (host-callable too, so the CPU tests check it) ----
struct DevChunk {
  int64_t b, t0, t1, hc, n;
};

// The sequence holding token t: last n with cu[n] <= t (values clamped; zero-length sequences skipped).
STRATA_HD int64_t find_seq(const Dims& d, int64_t t) {
  int64_t lo = 0, hi = d.N - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (d.cu_at(mid) <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Windows: fixed length, one per (row, chunk); variable length, the token range [w BT, (w+1) BT) of the single
// row, owning the chunks that start inside it (each chunk is owned by exactly one window).
STRATA_HD int64_t num_windows(const Dims& d) {
  return (d.varlen() ? 1 : d.B) * ((d.T + d.BT - 1) / d.BT);
}

// Calls fn(DevChunk) for the chunks window w owns, in increasing t0. `offs` (varlen): chunk_offsets[N + 1].
// Invalid cu_seqlens can only make the walk skip chunks: every emitted range lies in [0, T) with length <= BT.
template <class Fn>
STRATA_HD void for_each_chunk(const Dims& d, const int64_t* offs, int64_t w, Fn&& fn) {
  const int64_t BT = d.BT;
  if (!d.varlen()) {
    const int64_t per_row = (d.T + BT - 1) / BT, b = w / per_row, c = w - b * per_row;
    const int64_t t0 = c * BT;
    fn(DevChunk{b, t0, t0 + BT < d.T ? t0 + BT : d.T, c, b});
    return;
  }
  const int64_t w0 = w * BT, w1 = w0 + BT < d.T ? w0 + BT : d.T;
  int64_t n = find_seq(d, w0);
  int64_t bos = d.cu_at(n), eos = d.cu_at(n + 1);
  if (bos > w0 || eos <= w0) return;
  int64_t t = bos + (w0 - bos) / BT * BT;
  if (t < w0) t = t + BT < eos ? t + BT : eos;
  for (int guard = 0; t < w1 && guard < 2 * 64 + 2; ++guard) {
    if (t >= eos) {
      n = find_seq(d, t);
      bos = d.cu_at(n), eos = d.cu_at(n + 1);
      if (bos > t || eos <= t) return;
    }
    const int64_t t1 = t + BT < eos ? t + BT : eos;
    fn(DevChunk{0, t, t1, offs[n] + (t - bos) / BT, n});
    t = t1;
  }
}

// Host enumeration (valid cu_seqlens assumed: checked by check_cu_values first), in sequence-then-chunk
// order, which is also the order of the chunk dimension of h.
std::vector<Seq> host_sequences(const Dims& d);
std::vector<Chunk> host_chunks(const Dims& d);
// Total chunks Σ ceil(L_n / BT) (B * ceil(T / BT) in fixed-length mode).
int64_t host_total_chunks(const Dims& d);

// Run-time checks of the CPU implementations (before anything is written): cu_seqlens[0] == 0,
// non-decreasing, cu_seqlens[N] == T; and, when the op has a chunk-state tensor (d.NT > 0 or `nt_name`
// given), that its chunk dimension equals the number of chunks. Set the last error naming `op`.
strata_status check_cu_values(const char* op, const Dims& d);
strata_status check_chunk_count(const char* op, const char* arg, const Dims& d);

}  // namespace strata::linear_attn::gdn_bwd

namespace strata::linear_attn::gdn_bwd {

// ---- plan-side helpers (host only) ----

// One tensor argument of a plan function. `shape` is filled by the op once the dimensions are known.
struct Arg {
  const char* name;
  const strata_tensor_desc* t;  // may be NULL when !required
  bool required;
  bool output;
  std::initializer_list<int32_t> dtypes;
  std::vector<int64_t> shape{};
  std::string how{};  // "(B, T, HV, V)": how the expected shape is formed, for messages
  bool unit_last = true;  // rank-3 gate tensors may have any last stride
};

// Phase 1 of ARCHITECTURE.md §3 over all arguments: null, then device (same as args[0]), then dtype (f64 only
// on the CPU).
strata_status check_args_null_device_dtype(const char* op, std::vector<Arg>& args);
// Phase 2: shapes (each present argument against its `shape`), then strides.
strata_status check_args_shape_stride(const char* op, std::vector<Arg>& args);
// The View of a descriptor (pointer bound later by bind_view); `unit_last`: rank-4/5 feature tensors (strides
// of all but the last dimension) or rank-3 gate tensors (all three strides).
View view_template(const strata_tensor_desc* t);
// Applies the descriptor offset to a run-time base pointer (nullptr stays nullptr).
View bind_view(View tmpl, int64_t offset, void* base);

// The float dtypes a backward tensor may have (f64 on the CPU only).
inline constexpr std::initializer_list<int32_t> kFloatDtypes = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16,
                                                                STRATA_DTYPE_F16, STRATA_DTYPE_F64};
inline constexpr std::initializer_list<int32_t> kGateDtypes = {STRATA_DTYPE_F32, STRATA_DTYPE_F64};

// Shared attribute rules: chunk_size in {16, 32, 64}; scale finite; K <= 256 (the state kernels).
strata_status check_chunk_size(const char* op, int32_t chunk_size);
strata_status check_scale(const char* op, float scale);

}  // namespace strata::linear_attn::gdn_bwd
