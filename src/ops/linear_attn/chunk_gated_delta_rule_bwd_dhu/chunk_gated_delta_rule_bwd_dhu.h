// chunk_gated_delta_rule_bwd_dhu (ops_gdn_kda.md §4.10; README.md beside this file): reverse-time propagation
// of the state gradient, completing dL/dv_new.
//
//   q, k [B, T, H, K]; w [B, T, HV, K]; do, dv (= dv_local) [B, T, HV, V]; g = γ [B, T, HV] or absent;
//   dht [N, HV, K, V] or absent (zero);  outputs dh [B, NT, HV, K, V], dh0 [N, HV, K, V] f32 or absent,
//   dv2 [B, T, HV, V].  Per sequence n and value head hv, dS (K x V, f32) = dht[n, hv] or 0; for its chunks
//   c = NT_n - 1 .. 0 (chunk [s, e), γ_last = γ at the last valid row):
//     dh[c]  = dS                                   (gradient of the state at the END of chunk c)
//     dVn    = dv_c + diag(exp(γ_last - γ)) K_c dS
//     dS     = exp(γ_last) dS + scale (diag(exp γ) Q_c)^T dO_c - W_c^T dVn
//     dv2_c  = dVn
//   dh0[n, hv] = dS.
//
// Internal entry points: DhuParams (gdn_bwd_common.h views) and
//   chunk_gated_delta_rule_bwd_dhu_reference(p), chunk_gated_delta_rule_bwd_dhu_cpu(hwy_target)(p),
//   chunk_gated_delta_rule_bwd_dhu_cuda(p, workspace, stream) (workspace: ..._cuda_workspace(d)).
#pragma once

#include <string>

#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

namespace strata::linear_attn {

struct DhuParams {
  gdn_bwd::Dims d;                              // d.NT: chunk dimension of dh
  gdn_bwd::View q, k, w, dout, dv, g, dht;      // g, dht optional
  gdn_bwd::View dh, dh0, dv2;                   // outputs; dh0 optional
  float scale = 1.f;
  // Tile shape of the tensor-core kernel at 64 < K <= 128 (the same bits whichever runs; other K ignore it):
  // kDhuAuto (the default: dhu_narrow_tiles decides), kDhuWide (64-column V tiles, one stage, two blocks per SM)
  // or kDhuNarrow (32-column V tiles, two stages, one block per SM). Tests and timing force the last two.
  // kDhuWgmma: the Hopper warpgroup-MMA kernel (cuda_sm90_wgmma.cu; bf16, K = 128, V % 32 == 0, chunk size 64,
  // 16-byte copyable q, k, w, do, aligned bf16 pairs of dh, dv2, dv), which kDhuAuto takes where it runs;
  // kDhuMmaAuto: the mma.sync kernel with its automatic tile rule (timing comparisons). wgmma_cols forces the
  // warpgroup-MMA kernel's columns per warpgroup (16, 32 or 64; 0: automatic).
  int mma_variant = 0;
  int wgmma_cols = 0;
  // Internal fusion for the composed chunk_gated_delta_rule backward (never set by the public plan): dv is absent
  // and the kernel forms dv_local = chunk_bwd_dv_local(q, k, do, g, scale) per chunk itself from the q, k, do tiles
  // it loads anyway (T(Upper(scale (K Qᵀ) ⊙ exp(γ_i − γ_j))) dO, rounded to the token dtype: the same bits as
  // chunk_bwd_dv_local's tensor-core kernel writes, so dh, dh0, dv2 are the same bits as the two calls). Saves the
  // separate dv_local pass and its [B, T, HV, V] write and read. Only the tensor-core kernel at K <= 128 takes it
  // (chunk_gated_delta_rule_bwd_dhu_fuses_dv_local); the other implementations refuse a call that sets it.
  bool fuse_dv_local = false;
};
// kDhuWgmmaTma (session 10): the warpgroup-MMA kernel with its chunk tiles brought in by the copy engine (tensor-map
// boxes completing on an mbarrier) instead of cp.async by every thread (kDhuWgmma); the same bits.
// kDhuWgmmaAhead (session 11; what kDhuAuto runs with dv read where the warpgroup-MMA kernel applies): the
// copy-engine-fed kernel with the chunk step reordered so that only K dS → dVn → Wᵀ dVn stays on the per-chunk chain
// (dv_local's P = K Qᵀ, the dO transposes and the row factors of chunk c − 1 formed while chunk c's state update
// runs); the same bits. kDhuWgmmaAheadHalfP (session 11): that kernel with P = K Qᵀ
// split between its two warpgroups (each gates half of Bm, shared through shared memory) and dh / dv2 stored as
// 16-byte rows staged through shared memory (16-byte aligned rows; else kDhuWgmmaAhead); dv read runs kDhuWgmmaAhead.
// kDhuWgmmaSplit (session 12; what kDhuAuto runs with the fused dv_local at 16 columns a warpgroup, else as
// kDhuWgmmaAheadHalfPBox5): a third warpgroup forms dv_local (P, gating, Bm dO), the dO transposes and the row factors
// one chunk ahead for both state warpgroups, which keep only the recurrence's chain; the same bits.
// kDhuWgmmaAheadHalfPBox5 (session 13; what kDhuAuto runs with the fused dv_local where kDhuWgmmaSplit does not, i.e.
// at 32 / 64 columns, with 16-byte dh / dv2 rows): kDhuWgmmaAheadHalfP (dv read: kDhuWgmmaAhead) with each chunk tile
// as one 5-D tensor-map box instead of 8-column boxes (kDhuWgmmaAheadHalfP forced keeps those); the same bits.
inline constexpr int kDhuAuto = 0, kDhuWide = 1, kDhuNarrow = 2, kDhuWgmma = 3, kDhuMmaAuto = 4, kDhuWgmmaTma = 5,
                     kDhuWgmmaAhead = 6, kDhuWgmmaAheadHalfP = 7, kDhuWgmmaSplit = 8, kDhuWgmmaAheadHalfPBox5 = 9;
// Whether mma_variant forces one of the warpgroup-MMA kernels.
inline constexpr bool dhu_forces_wgmma(int v) {
  return v == kDhuWgmma || (v >= kDhuWgmmaTma && v <= kDhuWgmmaAheadHalfPBox5);
}

// The sequence n of the CUDA kernels' work items: batch row b, tokens [bos, eos) and its first chunk-state slot hc0
// (offs: the chunk offsets of a pack, read on the device).
struct DhuSeq {
  int64_t b, bos, eos, hc0;
};
STRATA_HD DhuSeq dhu_sequence(const gdn_bwd::Dims& d, const int64_t* offs, int64_t n) {
  if (!d.varlen()) return {n, 0, d.T, 0};
  const int64_t bos = d.cu_at(n), eos = d.cu_at(n + 1);
  return {0, bos, eos < bos ? bos : eos, offs[n]};  // (eos < bos only with invalid cu_seqlens)
}

void chunk_gated_delta_rule_bwd_dhu_reference(const DhuParams& p);
// The same loops with f32 arithmetic: the straightforward same-precision computation (ATK acceptance rule).
void chunk_gated_delta_rule_bwd_dhu_reference_naive(const DhuParams& p);
using DhuCpuFn = void (*)(const DhuParams&);
DhuCpuFn chunk_gated_delta_rule_bwd_dhu_cpu(int64_t hwy_target);

// Tile rule of the tensor-core kernel at 64 < K <= 128 (host logic, unit-tested on the CPU): true when the
// N·HV·ceil(V / 32) items of 32-column V tiles all fit on `sms` multiprocessors at one block each (then the
// kernel runs 32-column tiles with a two-stage pipeline, one block per SM, instead of 64-column single-stage
// tiles two per SM: e.g. B = 1, HV = 32, V = 128 gives 128 items instead of 64 on 132 SMs).
inline bool dhu_narrow_tiles(const gdn_bwd::Dims& d, int64_t sms) {
  if (d.N <= 0 || d.HV <= 0 || d.V <= 0 || sms <= 0) return false;
  const int64_t vtiles = (d.V + 31) / 32;
  // (each factor at most sms first, so the product cannot overflow)
  return d.N <= sms && d.HV <= sms && vtiles <= sms && d.N * d.HV * vtiles <= sms;
}

#if STRATA_WITH_CUDA
// The automatic choice (what other operators call): the tensor-core kernel when it applies
// (chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(p) is empty: 16-bit token tensors), the f32 FMA kernel otherwise. Its workspace size
// covers both.
size_t chunk_gated_delta_rule_bwd_dhu_cuda_workspace(const gdn_bwd::Dims& d);
int chunk_gated_delta_rule_bwd_dhu_cuda(const DhuParams& p, void* workspace, void* stream);
// The two kernels, each callable on its own (the implementation list exposes both).
size_t chunk_gated_delta_rule_bwd_dhu_cuda_fma_workspace(const gdn_bwd::Dims& d);
int chunk_gated_delta_rule_bwd_dhu_cuda_fma(const DhuParams& p, void* workspace, void* stream);
// "" when the tensor-core kernel applies to p (dtypes of the views; run-time pointers are not needed), else why not.
std::string chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(const DhuParams& p);
size_t chunk_gated_delta_rule_bwd_dhu_cuda_mma_workspace(const gdn_bwd::Dims& d);
int chunk_gated_delta_rule_bwd_dhu_cuda_mma(const DhuParams& p, void* workspace, void* stream);
// Whether the tensor-core kernel can take p with fuse_dv_local set (p.dv ignored): q, k, w, do of one 16-bit
// dtype and K <= 128.
bool chunk_gated_delta_rule_bwd_dhu_fuses_dv_local(const DhuParams& p);
// The warpgroup-MMA kernel (variant kDhuWgmma of cuda.sm90.mma): "" when its shape / dtype rules hold;
// _runs adds the run-time rules (16-byte copyable q, k, w, do; 4-byte pairs of dv unless fused). Called by
// chunk_gated_delta_rule_bwd_dhu_cuda_mma after the chunk offsets are in `offs`.
std::string chunk_gated_delta_rule_bwd_dhu_wgmma_reject(const DhuParams& p);
bool chunk_gated_delta_rule_bwd_dhu_wgmma_runs(const DhuParams& p);
int chunk_gated_delta_rule_bwd_dhu_cuda_wgmma(const DhuParams& p, const int64_t* offs, void* stream);
// Whether chunk_gated_delta_rule_bwd_dhu_cuda_mma runs the warpgroup-MMA kernel on p: kDhuWgmma, or kDhuAuto once
// that kernel is the automatic choice, where it runs.
bool chunk_gated_delta_rule_bwd_dhu_takes_wgmma(const DhuParams& p);
#endif
// Columns of dS per warpgroup of the warpgroup-MMA kernel (host rule, unit-tested on the CPU): `forced` (16, 32,
// 64) when it divides V into whole blocks of 2 forced columns (else 0); otherwise the widest of 64, 32 whose
// N·HV·V / (2 kN) blocks fill at least 3/4 of the `sms` multiprocessors (one block each), else 16 (e.g. B = 4,
// HV = 32, V = 128: 64, 128 blocks; B = 1: 16, 128 blocks).
inline int dhu_wgmma_cols(const gdn_bwd::Dims& d, int64_t sms, int forced) {
  if (forced == 16 || forced == 32 || forced == 64) return d.V % (2 * forced) == 0 ? forced : 0;
  for (const int kn : {64, 32})
    if (d.V % (2 * kn) == 0 && d.N * d.HV * (d.V / (2 * kn)) * 4 >= sms * 3) return kn;
  return 16;
}

}  // namespace strata::linear_attn
