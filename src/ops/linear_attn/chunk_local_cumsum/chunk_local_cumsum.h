// chunk_local_cumsum (docs/reference/ops_gdn_kda.md §4.2; README.md beside this file): the kernel params
// struct, the chunk enumeration shared by the CPU and CUDA kernels, and the kernel entry points.
//
//   g, out: [B, T, H] (scalar gates, S = 1) or [B, T, H, S] (vector gates), any strides.
//   Chunks of C = chunk_size tokens restart at every sequence start: a sequence is a batch row [0, T)
//   (fixed length) or [cu_seqlens[n], cu_seqlens[n+1]) of the single row (variable length, B = 1).
//   For token t in chunk [s, e):  out[t] = scale * sum(g[s..t])   (reverse: scale * sum(g[t..e-1])),
//   accumulated in f32 (f64 by the reference), scale applied after the sum.
//
// Work decomposition ("windows"). The time axis of each row is cut into windows of C tokens,
// [k*C, (k+1)*C). Window k owns the chunks that *start* inside it. A chunk is at most C long, so it ends
// before (k+2)*C, and every chunk is owned by exactly one window; in fixed-length mode window k owns just
// the chunk [k*C, min((k+1)*C, T)). The owner of a token's chunk is found by a binary search on cu_seqlens,
// so neither the CPU nor the CUDA kernel needs a host-side chunk table (no device-to-host sync). Each
// (window, head lane) pair is independent work: a sequential f32 scan along t in index order, which makes
// every implementation's result independent of the thread count and of the split of the work.
//
// Robustness: kernels read cu_seqlens through cu_at(), which clamps every value to [0, T], and the window
// walk only emits chunks [t0, t1) with 0 <= t0 < t1 <= T and t1 - t0 <= C. So whatever the values (the CUDA
// path cannot check them without a sync), no access leaves g or out. The CPU implementations check the
// values before running (check_cu_seqlens_values) and fail without writing the output.
#pragma once

#include <cstdint>

#include "opbase/dtype.h"  // storage types, STRATA_HD; strata_status comes with it

namespace strata::linear_attn {

struct ChunkCumsumParams {
  const void* g = nullptr;               // element [0, 0, 0(, 0)] of g (descriptor offset applied)
  const int64_t* cu_seqlens = nullptr;   // element 0 of cu_seqlens; nullptr: fixed-length sequences
  void* out = nullptr;                   // element [0, 0, 0(, 0)] of out
  int32_t g_dtype = 0, out_dtype = 0;
  int64_t B = 0, T = 0, H = 0, S = 1;    // S = 1 for scalar gates
  int64_t lanes = 0;                     // H * S: independent scan lanes per token
  int64_t g_strides[4] = {};             // element strides of (b, t, h, s); s stride 0 for scalar gates
  int64_t out_strides[4] = {};
  int64_t cu_stride = 1;                 // element stride of cu_seqlens
  int64_t num_seqs = 0;                  // N (cu_seqlens has N + 1 entries); B in fixed-length mode
  int32_t chunk_size = 64;               // power of two in [1, 1024]
  bool reverse = false;
  float scale = 1.f;
  // Both g and out hold lane l = h * S + s at offset l from the token's lane 0 (unit lane stride): the
  // CPU vector path and coalesced CUDA accesses need it.
  bool lanes_contiguous = false;
};

// Offset of lane l = h * S + s inside a token, for the given (b, t, h, s) strides.
STRATA_HD int64_t lane_offset(const int64_t (&strides)[4], int64_t S, int64_t l) {
  const int64_t h = l / S;
  return h * strides[2] + (l - h * S) * strides[3];
}

// cu_seqlens[i] clamped to [0, T] (kernels may assume nothing about the values; see the file comment).
STRATA_HD int64_t cu_at(const ChunkCumsumParams& p, int64_t i) {
  const int64_t v = p.cu_seqlens[i * p.cu_stride];
  return v < 0 ? 0 : (v > p.T ? p.T : v);
}

// Windows per batch row and in total.
STRATA_HD int64_t windows_per_row(const ChunkCumsumParams& p) { return (p.T + p.chunk_size - 1) / p.chunk_size; }
STRATA_HD int64_t num_windows(const ChunkCumsumParams& p) {
  return (p.cu_seqlens ? 1 : p.B) * windows_per_row(p);
}

// The sequence holding token t (0 <= t < T): [bos, eos) of the last n in [0, N-1] with cu_seqlens[n] <= t.
// Zero-length sequences are skipped by construction. Reads cu_seqlens[0..N] only.
struct SeqSpan {
  int64_t bos, eos;
};
STRATA_HD SeqSpan find_sequence(const ChunkCumsumParams& p, int64_t t) {
  int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (cu_at(p, mid) <= t) lo = mid;
    else hi = mid - 1;
  }
  return {cu_at(p, lo), cu_at(p, lo + 1)};
}

// Calls fn(b, t0, t1) for every chunk [t0, t1) of batch row b that window w (0 <= w < num_windows) owns,
// in increasing t0. Valid cu_seqlens: exactly the chunks starting in the window. Any cu_seqlens: only
// ranges with 0 <= t0 < t1 <= T and t1 - t0 <= C, and the walk ends after at most 2 * C steps.
template <class Fn>
STRATA_HD void for_each_chunk_in_window(const ChunkCumsumParams& p, int64_t w, Fn&& fn) {
  const int64_t C = p.chunk_size;
  if (!p.cu_seqlens) {
    const int64_t wpr = windows_per_row(p);
    const int64_t b = w / wpr, t0 = (w - b * wpr) * C;
    fn(b, t0, t0 + C < p.T ? t0 + C : p.T);
    return;
  }
  const int64_t w0 = w * C, w1 = w0 + C < p.T ? w0 + C : p.T;
  SeqSpan seq = find_sequence(p, w0);
  if (seq.bos > w0 || seq.eos <= w0) return;  // only with invalid cu_seqlens
  // The chunk holding w0 starts at or before it; if before, it belongs to the previous window: skip to the
  // next chunk start (the end of that chunk, which may be the start of the next sequence).
  int64_t t = seq.bos + (w0 - seq.bos) / C * C;
  if (t < w0) t = t + C < seq.eos ? t + C : seq.eos;
  while (t < w1) {
    if (t >= seq.eos) {
      seq = find_sequence(p, t);
      if (seq.bos > t || seq.eos <= t) return;  // only with invalid cu_seqlens
    }
    const int64_t t1 = t + C < seq.eos ? t + C : seq.eos;
    fn(int64_t{0}, t, t1);
    t = t1;
  }
}

// Run-time check of the cu_seqlens values on the host (CPU implementations, before writing anything):
// cu_seqlens[0] == 0, non-decreasing, cu_seqlens[N] == T. Sets the last error and returns
// STRATA_ERROR_INVALID_VALUE otherwise; SUCCESS in fixed-length mode.
strata_status check_cu_seqlens_values(const ChunkCumsumParams& p);

// float64 reference: plain loops over sequences and chunks, any float dtypes, any strides.
void chunk_local_cumsum_reference(const ChunkCumsumParams& p);

// CPU kernels compiled per Highway target (nullptr when `hwy_target` was not compiled): f32/bf16/f16 g and
// out; unit-lane-stride tensors take the vector path (lanes are the vector dimension), others a scalar loop.
using ChunkCumsumCpuFn = void (*)(const ChunkCumsumParams&);
ChunkCumsumCpuFn chunk_local_cumsum_cpu(int64_t hwy_target);

#if STRATA_WITH_CUDA
// CUDA (sm_90): one thread per (window, lane), f32/bf16/f16. Returns the launch status (a strata_status).
int chunk_local_cumsum_cuda(const ChunkCumsumParams& p, void* stream);
#endif

}  // namespace strata::linear_attn
