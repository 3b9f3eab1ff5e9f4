// Shared infrastructure of the Gated DeltaNet chunk operators (docs/reference/ops_gdn_kda.md §1, §4): the
// problem shape, the chunk enumeration for fixed-length and variable-length packs (host and device, no
// host sync), strided tensor views with run-time dtype, and the one kernel params struct that every GDN
// forward kernel takes. Usable from .cpp and .cu files (STRATA_HD). Validation helpers are in
// gdn_validate.h, the kernel entry points of the forward ops in gdn_fwd_kernels.h.
//
// Layouts (fla's, sequence first, any element strides):
//   q, k        [B, T, H, K]        v, u, w, v_new, o   [B, T, HV, V or K]
//   g (γ), beta [B, T, HV]          A (kkt / inverse)   [B, T, HV, BT]: row = token, col = position in chunk
//   h           [B, NT, HV, K, V]   h0, ht               [N, HV, K, V]
// GVA: value head hv reads q/k head hv / G (G = HV / H, repeat_interleave order).
//
// Chunks. Fixed length: batch row b has NTr = ceil(T / BT) chunks [c*BT, min((c+1)*BT, T)); chunk (b, c)
// has flat index b * NTr + c (the h index is [b, c]). Variable length (B = 1, cu_seqlens [N + 1]): sequence
// n = [bos, eos) has ceil(L_n / BT) chunks restarting at bos; flat index offsets[n] + c where
// offsets = exclusive prefix sum of ceil(L_n / BT) ("chunk_offsets", N + 1 entries; offsets[N] = total
// chunks). A chunk-parallel kernel runs over chunk_slots() >= total chunks and locate_chunk(i) maps a slot to
// (b, n, c, bos, eos, s, e) by a binary search over offsets (slots past the total are invalid and skipped).
// offsets come from fill_chunk_offsets (host) or gdn_chunk_offsets_cuda (a one-block kernel into workspace),
// so nothing on the device path needs a host copy of cu_seqlens.
//
// Robustness: cu_seqlens values are clamped to [0, T] when read, so invalid values cannot send any access
// outside the tensors; the CPU paths check the values (check_cu_seqlens_host) before writing anything.
#pragma once

#include <cstdint>

#include "opbase/dtype.h"

namespace strata::linear_attn::gdn {

constexpr int64_t kMaxK = 256;  // state kernels keep K <= 256 rows (spec §6.8)

// ---- strided tensor view with a run-time dtype ----
struct GdnTensor {
  void* data = nullptr;   // element 0 of the view (descriptor offset already applied); nullptr: absent
  int32_t dtype = STRATA_DTYPE_F32;
  int64_t st[5] = {};     // element strides, outermost first (unused trailing entries 0)
  STRATA_HD bool present() const { return data != nullptr; }
};

// Loads element i (element offset) of a float tensor as f32 / stores f32 rounded to nearest even.
// The dtype switch is uniform across a warp on CUDA (every lane reads the same tensor).
STRATA_HD float load_f(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case STRATA_DTYPE_F32: return static_cast<const float*>(base)[i];
    case STRATA_DTYPE_BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case STRATA_DTYPE_F16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<float>(static_cast<const double*>(base)[i]);
  }
}
STRATA_HD void store_f(void* base, int32_t dtype, int64_t i, float v) {
  switch (dtype) {
    case STRATA_DTYPE_F32: static_cast<float*>(base)[i] = v; break;
    case STRATA_DTYPE_BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(v); break;
    case STRATA_DTYPE_F16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(v); break;
    default: static_cast<double*>(base)[i] = v; break;
  }
}
STRATA_HD float load_f(const GdnTensor& t, int64_t i) { return load_f(t.data, t.dtype, i); }
STRATA_HD void store_f(const GdnTensor& t, int64_t i, float v) { store_f(t.data, t.dtype, i, v); }

// ---- problem shape ----
struct GdnShape {
  int64_t B = 0, T = 0;    // batch rows, tokens per row (varlen: B = 1, T = packed tokens)
  int64_t H = 0, HV = 0;   // q/k heads, value heads (HV % H == 0)
  int64_t G = 1;           // HV / H
  int64_t K = 0, V = 0;    // key and value head dims (K <= 256)
  int64_t BT = 64;         // chunk size (16, 32, 64)
  int64_t N = 0;           // sequences: B (fixed) or len(cu_seqlens) - 1 (varlen)
  int64_t NTr = 0;         // ceil(T / BT): chunks per batch row (fixed length)
  int64_t NT = 0;          // chunk dimension of h: NTr (fixed) or the total chunk count (varlen)
  float scale = 1.f;       // attention scale (chunk_fwd_o), default K^-0.5
};

// ---- chunk enumeration ----
struct GdnChunks {
  const int64_t* cu = nullptr;       // cu_seqlens [N + 1] (element 0, offset applied); nullptr: fixed length
  int64_t cu_stride = 1;
  const int64_t* offsets = nullptr;  // varlen: chunk_offsets [N + 1] (same memory space as the kernel)
  int64_t B = 0, T = 0, N = 0, BT = 64, NTr = 0;
  STRATA_HD bool varlen() const { return cu != nullptr; }
};

STRATA_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// cu_seqlens[i] clamped to [0, T].
STRATA_HD int64_t cu_at(const GdnChunks& m, int64_t i) {
  const int64_t v = m.cu[i * m.cu_stride];
  return v < 0 ? 0 : (v > m.T ? m.T : v);
}

// An upper bound on the number of chunks (grid size of chunk-parallel kernels): B * NTr fixed;
// ceil(T / BT) + N varlen (sum of ceil(L_n / BT) <= sum (L_n / BT + 1)) for valid cu_seqlens. With invalid
// values (overlapping clamped sequences) chunks past the bound are simply not visited; every visited range
// stays inside [0, T) (tests/cpp/test_gdn_fwd.cpp, GdnCommon.*).
STRATA_HD int64_t chunk_slots(const GdnChunks& m) {
  return m.varlen() ? cdiv(m.T, m.BT) + m.N : m.B * m.NTr;
}

struct ChunkPos {
  bool valid = false;
  int64_t b = 0;        // batch row of the tokens (0 in varlen)
  int64_t n = 0;        // sequence (b in fixed length)
  int64_t c = 0;        // chunk inside the sequence
  int64_t bos = 0, eos = 0;  // sequence token range in row b
  int64_t s = 0, e = 0;      // chunk token range in row b: e - s = L in [1, BT]
  int64_t idx = 0;      // flat chunk index: h[b, c] (fixed: b * NTr + c, with h's b stride NTr rows) / h[0, idx]
};

// Sequence n's token range and first flat chunk index.
struct SeqPos {
  int64_t b, bos, eos, chunk0;
};
STRATA_HD SeqPos locate_sequence(const GdnChunks& m, int64_t n) {
  if (!m.varlen()) return {n, 0, m.T, n * m.NTr};
  const int64_t bos = cu_at(m, n), eos = cu_at(m, n + 1);
  return {0, bos, eos < bos ? bos : eos, m.offsets[n]};
}

// Slot i (0 <= i < chunk_slots) -> chunk, or valid = false for slots past the last chunk.
STRATA_HD ChunkPos locate_chunk(const GdnChunks& m, int64_t i) {
  ChunkPos p;
  if (!m.varlen()) {
    if (m.NTr == 0) return p;
    p.b = i / m.NTr;
    p.n = p.b;
    p.c = i - p.b * m.NTr;
    p.bos = 0;
    p.eos = m.T;
    p.s = p.c * m.BT;
    p.e = p.s + m.BT < m.T ? p.s + m.BT : m.T;
    p.idx = i;
    p.valid = p.b < m.B && p.s < p.e;
    return p;
  }
  if (m.N <= 0 || i >= m.offsets[m.N]) return p;
  // last n in [0, N-1] with offsets[n] <= i (zero-length sequences share their offset with the next one)
  int64_t lo = 0, hi = m.N - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (m.offsets[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  p.n = lo;
  p.c = i - m.offsets[lo];
  p.bos = cu_at(m, lo);
  p.eos = cu_at(m, lo + 1);
  p.s = p.bos + p.c * m.BT;
  p.e = p.s + m.BT < p.eos ? p.s + m.BT : p.eos;
  p.idx = i;
  p.valid = p.s < p.e;
  return p;
}

// Element offset of chunk state h[b, c] (fixed length: flat = b * NTr + c) or h[0, flat] (varlen).
STRATA_HD int64_t h_base(const GdnTensor& h, const GdnChunks& m, int64_t b, int64_t flat) {
  return m.varlen() ? flat * h.st[1] : b * h.st[0] + (flat - b * m.NTr) * h.st[1];
}

// Host: offsets[0..N] = exclusive prefix sum of ceil(L_n / BT) from cu_seqlens values (clamped like cu_at).
// Returns offsets[N], the total number of chunks.
int64_t fill_chunk_offsets(const GdnChunks& m, int64_t* offsets);
// Host: chunks of a fixed-length or varlen problem, from host cu_seqlens values.
int64_t count_chunks(const int64_t* cu, int64_t cu_stride, int64_t N, int64_t T, int64_t BT);

#if STRATA_WITH_CUDA
// CUDA: offsets[0..N] from device cu_seqlens (m.cu) into device memory `offsets` (N + 1 int64), one block,
// stream-ordered, no host sync. Returns a strata_status.
int gdn_chunk_offsets_cuda(const GdnChunks& m, int64_t* offsets, void* stream);
#endif

// ---- the kernel params struct of every GDN forward op ----
// One struct for all forward ops (each op documents which tensors it reads and writes; absent ones have
// data == nullptr). Element strides per tensor, outermost first, in the layouts of the file comment:
//   q, k: (b, t, h, d)   v, u, w, v_new, o: (b, t, hv, d)   g, beta: (b, t, hv)   A, Akk: (b, t, hv, j)
//   h: (b, c, hv, k, v)   h0, ht: (n, hv, k, v)
struct GdnFwdParams {
  GdnShape shape;
  GdnChunks chunks;
  GdnTensor q, k, v, g, beta;
  GdnTensor Akk;   // strictly lower β (k_i·k_j) e^{γ_i-γ_j} (kkt output, solve_tril input)
  GdnTensor A;     // (I + Akk)^-1, unit lower (solve_tril / prepare_wy_repr_fwd output, recompute input)
  GdnTensor w, u;  // WY factors
  GdnTensor h, h0, ht, v_new;
  GdnTensor o;
  // Gated Q Kᵀ of every chunk and value head, (b, t, hv, j): P[t, j] = (q_t·k_j) e^{γ_t − γ_j} for j <= t in the
  // chunk, 0 above the diagonal, rounded to the token dtype (CUDA only: written by fwd_cuda_qk_gate, read by the
  // fused state + output pass's pre-computed-P variant; absent everywhere else).
  GdnTensor Pqk;
  // (Session 13, CUDA) The l2norm of q and k folded into the fused forward's kernels (chunk_gated_delta_rule's
  // cuda.sm90.fused_norm): q, k hold the raw rows, which enter the products as loaded; the products are scaled by
  // r = 1 / sqrt(|x|² + qk_norm_eps) of the rows in f32 (rows of K Kᵀ and columns by r_k, w's factor β e^γ by r_k,
  // the rows of Q S and Q Kᵀ by r_q, the columns of Q Kᵀ and the rows of Vd by r_k). prep_wgmma forms r_k from its
  // K panels and writes it into rk ((b, t, h) f32, by the first value head of each q/k head); the fused pass reads
  // rk and forms r_q from its Q tiles. false / absent everywhere else.
  bool qk_norm = false;
  float qk_norm_eps = 0.f;
  GdnTensor rk;
  // (Session 14, the fused pass with qk_norm only; chunk_gated_delta_rule's cuda.sm90.fused_norm_r) rq present (f32
  // [B, T, H], 1 / |q| of the raw rows from an rstd-only l2norm launch): the pass reads r_q from it instead of forming
  // it from its Q tiles.
  GdnTensor rq;
  // (Session 16, the fused wgmma pass's kShort form with two state warpgroups) pass_cluster = 2 (the only
  // size compiled since session 17: 4 and 8 lost): the pass's blocks run as thread-block clusters of that many CTAs of
  // one q/k head (its G value heads x column blocks), which share each chunk's K and Q tiles by copy-engine multicast
  // (each CTA fetches 1 / pass_cluster of them for all) instead of each reading both; 0: no cluster
  // (fwd_cuda_state_o_wgmma_cluster says where it applies).
  int pass_cluster = 0;
  // With pass_cluster: where a cluster's CTAs are column blocks of one value head (V / width a multiple of the size),
  // they share W's tile the same way (false: K, Q only; for the measurements).
  bool pass_cluster_w = true;
};

}  // namespace strata::linear_attn::gdn
