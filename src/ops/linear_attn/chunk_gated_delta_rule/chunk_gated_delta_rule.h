// chunk_gated_delta_rule: the full Gated DeltaNet operator, forward and backward (ops_gdn_kda.md §2.1, §3.1,
// §3.2, §4.12; README.md beside this file). Kernel params struct and entry points.
//
// Per sequence n and value head hv (q/k head h = hv / G, G = HV / H), state S [K, V] = h0[n, hv] or 0:
//   S = exp(g_t) S;   r = v_t - S^T k_t;   S += k_t (beta_t r)^T;   o_t = scale S^T q_t
// final_state[n, hv] = S after the sequence. With l2norm, q and k are first divided by sqrt(|x|^2 + 1e-6).
//
// Tensors (element strides, last dimension stride 1):
//   q, k [B, T, H, K]; v, o [B, T, HV, V]; g, beta [B, T, HV]; h0, ht [N, HV, K, V] (f32, or f64 on the CPU)
//   backward: do like o; dht like ht (optional); dq, dk like q; dv like v; dg, dbeta like g; dh0 like h0.
// Sequences: batch rows [0, T) (N = B), or [cu_seqlens[n], cu_seqlens[n+1]) of the single row (B = 1).
//
// Implementations: `reference` runs the token recurrence in float64 (forward) and its exact reverse-mode
// derivative (backward, token by token, with the state re-computed from per-chunk checkpoints); the CPU
// implementations run the chunked WY form of §2.4 / Appendix A in f32 (cpu_chunked.cpp); the CUDA one composes
// the sub-operators' CUDA kernels (cuda_sm90.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "opbase/dtype.h"

namespace strata::linear_attn {

inline constexpr int64_t kGdnChunk = 64;    // BT: chunk length of the chunked implementations
inline constexpr int64_t kGdnMaxK = 256;    // K limit (state kernels keep up to four 64-row blocks of S)
inline constexpr double kGdnL2Eps = 1e-6;   // l2norm eps, inside the sqrt (ops_gdn_kda.md §4.1)

// One tensor of the op: pointer to element [0, ...] (descriptor offset applied; nullptr = absent), its dtype
// and its element strides. Token tensors: (b, t, head, dim) or (b, t, head) for g/beta; states: (n, hv, k, v).
struct GdnTensor {
  void* data = nullptr;
  int32_t dtype = 0;
  int64_t st[4] = {};
  bool present() const { return data != nullptr; }
};

// How the backward forms dq with l2norm (session 16): kPlain, chunk_bwd_dqkwg's f32 head sums and then row_norm_bwd
// in the tail; kStaged, chunk_bwd_dqkwg writing the final dq through its l2norm backward (rows staged in shared
// memory; where chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs, else kPlain); kAuto: kGdnBwdDqAuto (cuda_sm90.cu: kStaged
// since session 17; the forced implementation "cuda.sm90.chunked_unfolded" runs kPlain).
enum class GdnBwdDq : int { kAuto = 0, kPlain, kStaged };
struct GdnParams {
  // forward inputs
  GdnTensor q, k, v, g, beta, h0;
  const int64_t* cu_seqlens = nullptr;  // element 0; nullptr: fixed-length rows
  int64_t cu_stride = 1;
  // forward outputs
  GdnTensor o, ht;
  // backward: inputs do, dht; outputs dq, dk, dv, dg, dbeta, dh0
  GdnTensor do_, dht, dq, dk, dv, dg, dbeta, dh0;
  // The forward's residuals for the backward (CUDA only; uint8 [gdn_cuda_saved_bytes(p)], layout
  // gdn_cuda_saved_layout): an output of the forward, an input of the backward, which then skips the re-run of
  // the forward. Absent (the default, and always on the CPU): the backward re-computes them.
  GdnTensor saved;
  int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  int64_t N = 0;  // sequences: B (fixed length) or cu_seqlens entries - 1
  float scale = 1.f;
  bool l2norm = false;
  int32_t slots = 1;  // per-thread scratch slots the workspace holds (CPU chunked implementations)
  GdnBwdDq bwd_dq = GdnBwdDq::kAuto;  // how the CUDA backward forms dq (tests and forced implementations set it)
};

// Sequence n: batch row b and tokens [bos, eos) of that row.
struct GdnSeq {
  int64_t b, bos, eos;
};
inline GdnSeq gdn_seq(const GdnParams& p, int64_t n) {
  if (!p.cu_seqlens) return {n, 0, p.T};
  return {0, p.cu_seqlens[n * p.cu_stride], p.cu_seqlens[(n + 1) * p.cu_stride]};
}

// Host check of the cu_seqlens values (CPU implementations run it before writing anything):
// cu_seqlens[0] == 0, non-decreasing, cu_seqlens[N] == T. SUCCESS in fixed-length mode.
strata_status gdn_check_cu_seqlens(const char* op, const GdnParams& p);

// ---- reference (float64 token recurrence; Real = float gives the "naive same-dtype" computation that the
// acceptance rule compares against) ----
template <class Real>
size_t gdn_recurrent_bwd_workspace(const GdnParams& p);
// Writes o (and ht when present).
template <class Real>
void gdn_recurrent_fwd(const GdnParams& p);
// Writes dq, dk, dv, dg, dbeta (and dh0 when present); reads do and dht (absent = 0).
template <class Real>
void gdn_recurrent_bwd(const GdnParams& p, void* workspace);

// ---- CPU, chunked WY form in f32 (cpu_chunked.cpp); `hwy_target` picks the GEMM micro-kernel's ISA ----
bool gdn_cpu_chunked_available(int64_t hwy_target);
size_t gdn_cpu_fwd_workspace(const GdnParams& p);
size_t gdn_cpu_bwd_workspace(const GdnParams& p);
void gdn_cpu_chunked_fwd(const GdnParams& p, int64_t hwy_target, void* workspace);
void gdn_cpu_chunked_bwd(const GdnParams& p, int64_t hwy_target, void* workspace);

// ---- the saved residuals of the CUDA implementation (pure functions of the shapes, dtypes and options of p:
// B, T, H, HV, K, V, N, cu_seqlens present or not, l2norm, the dtypes of q, k, v; compiled in every build so that
// the C API and Python can size the buffer without a device) ----
// dtype of the token-shaped intermediates (qn, kn, A, w, u, h, v_new; in the backward also dv_local, dh, dv2,
// dw): the token dtype when q, k, v (and, bwd, do) share one 16-bit dtype, so that the sub-operators'
// tensor-core kernels run (their operands must all be in that dtype; fla stores them so too), else f32.
int32_t gdn_inter_dtype(const GdnParams& p, bool bwd);
// Chunk dimension NTh of the chunk-state buffers h / dh [rows_h, NTh, HV, K, V]: ceil(T / 64) per batch row
// (rows_h = B), or ceil(T / 64) + N with cu_seqlens (rows_h = 1; a bound on the data-dependent chunk count).
int64_t gdn_state_chunks(const GdnParams& p);
// Byte offsets inside the saved buffer, each 256-byte aligned, in this order (dt = gdn_inter_dtype(p, false)):
//   [l2norm: qn, kn dt [B, T, H, K] (the normalised q, k), rq, rk f32 [B, T, H] (their 1/|x|)] | γ f32 [B, T, HV]
//   (the chunk-local gate cumsum) | A dt [B, T, HV, 64] (the WY inverse) | w dt [B, T, HV, K] |
//   v_new dt [B, T, HV, V] | h dt [rows_h, NTh, HV, K, V] (the state before each chunk).
// What the backward's steps read (bwd_dhu: qn, kn, w, γ; chunk_bwd_dqkwg: qn, kn, v_new, h, γ;
// prepare_wy_repr_bwd: kn, A, γ; the l2norm backward: qn, kn, rq, rk). u is not kept (only the state pass reads
// it). h is the largest part; every other part is at most as large for V >= 64.
struct GdnSavedLayout {
  size_t qn = 0, kn = 0, rq = 0, rk = 0, gam = 0, A = 0, w = 0, vnew = 0, h = 0;  // offsets (qn..rk: l2norm only)
  size_t h_end = 0;                                                                  // h's last byte + 1
  size_t bytes = 0;                                                                  // total
  // The alignment padding after each part, [pad_begin[i], pad_end[i]): written by no step (the forward zeroes it, and
  // with cu_seqlens h's slots past the last chunk, so that the buffer is the same bits on every run).
  size_t pad_begin[9] = {}, pad_end[9] = {};
  int pads = 0;
};
GdnSavedLayout gdn_cuda_saved_layout(const GdnParams& p);
inline size_t gdn_cuda_saved_bytes(const GdnParams& p) { return gdn_cuda_saved_layout(p).bytes; }

#if STRATA_WITH_CUDA
// ---- CUDA sm_90 (cuda_sm90.cu): composition of the sub-operators' CUDA entry points on `stream`, scratch in
// `workspace` (gdn_cuda_*_workspace bytes). p holds device pointers; cu_seqlens values are checked on the device
// before anything is written (one stream synchronisation with cu_seqlens; skipped during graph capture). ----
// With p.saved (256-byte aligned, gdn_cuda_saved_bytes(p) bytes) the forward also leaves the residuals there and
// the backward reads them instead of re-running the forward (no "forward WY" / "forward states" steps); the
// workspaces then leave those buffers out. The backward must get the forward's q, k, v, g, beta, initial_state,
// cu_seqlens and l2norm (the buffer is not checked against them beyond its size).
// How the forward fills p.saved (session 12): kComposed: l2norm, γ, prepare_wy_repr_fwd (w, u, A), the state pass
// chunk_gated_delta_rule_fwd_h (h, v_new, final state), chunk_fwd_o (o); kFusedPass: the same head, then the fused
// state + output pass (gdn::fwd_cuda_state_o_wgmma, kShort form) writing o, h, v_new and the final state in one pass
// (bf16, K = 128, V a multiple of 32, lean tensors; else kComposed). The same bits in saved (h is S rounded once in
// both; v_new from the same products), o from the fused pass's order. kAuto: the fused pass where it applies (s12run1:
// 1.508 against 2.243 ms at B = 4 T = 8192, 2.493 against 2.860 ms at B = 1 T = 32768; H200, bf16, HV = 32, K = V = 128).
// Without p.saved the form is ignored (the composed forward).
// kFusedPassPair (session 18): kFusedPass with the pass's CTAs of a q/k head in pairs (thread-block clusters of 2)
// sharing each chunk's K and Q tiles (and W's where a pair is one value head's column blocks) by copy-engine multicast,
// where a pair applies at the pass's width (gdn_cuda_fwd_pass_cluster > 0: 32 or 128 columns, G x column blocks even),
// else kFusedPass. The same saved, o and final-state bits as kFusedPass. kAuto runs it since session 18 (s18run1, H200,
// median of 9 interleaved: B = 4 T = 8192 1.491 ms either way, B = 1 T = 32768 2.410 against 2.465 ms).
enum class GdnSavedForward : int { kAuto = 0, kComposed, kFusedPass, kFusedPassPair };
// (Session 18) The cluster size kFusedPassPair's pass runs with on a device of `sms` SMs (2, or 0 where no pair
// applies: then it runs kFusedPass's pass). Host only; reads dtypes, presence and shapes.
int gdn_cuda_fwd_pass_cluster(const GdnParams& p, int sms);
// "" when the backward can fold dq's l2norm backward into chunk_bwd_dqkwg (GdnBwdDq::kStaged; dtypes and shapes:
// the run-time conditions are checked at the call), else why not.
std::string gdn_cuda_bwd_dq_fold_reject(const GdnParams& p);
size_t gdn_cuda_fwd_workspace(const GdnParams& p);
size_t gdn_cuda_bwd_workspace(const GdnParams& p);
struct GdnStepProbe;
// probe (timing tests only, session 18; GdnStepProbe below): with p.saved and the fused pass, marks "l2norm",
// "cumsum", "prep" (prepare_wy_repr_fwd: w, u, A), "gaps" (the saved buffer's padding zeroed), "pass".
strata_status gdn_cuda_fwd(const GdnParams& p, void* workspace, void* stream,
                           GdnSavedForward form = GdnSavedForward::kAuto, const GdnStepProbe* probe = nullptr);
// probe (timing tests only; nullptr in the library): called on the host after each step's launches are queued on
// the stream, with the step's name ("forward WY", "forward states", "bwd_dhu", "dqkwg", "wy_bwd", "tail"), so that
// a test can record an event per step. dhu_variant (timing tests only): DhuParams::mma_variant of the bwd_dhu call
// (kDhuAuto in the library). wy_variant: WyBwdParams::mma_variant of the prepare_wy_repr_bwd call (kWyAuto in the
// library = kWyFinStaged since session 17: with l2norm, dk written through its l2norm backward by that kernel, the
// tail's dk row_norm_bwd skipped, where gdn_cuda_bwd_dk_fold_reject(p) is empty; kWyTrimmed: the unfolded dk, as the
// forced implementation "cuda.sm90.chunked_unfolded" runs).
struct GdnStepProbe {
  void (*fn)(void* ctx, const char* step) = nullptr;
  void* ctx = nullptr;
};
strata_status gdn_cuda_bwd(const GdnParams& p, void* workspace, void* stream, const GdnStepProbe* probe = nullptr,
                           int dhu_variant = 0, int wy_variant = 0);
// "" when the backward can fold dk's l2norm backward into prepare_wy_repr_bwd (wy_variant kWyFinStaged), else why not.
std::string gdn_cuda_bwd_dk_fold_reject(const GdnParams& p);
// The forward with the fused state + output pass (prepare_wy_repr_fwd, then gdn::fwd_cuda_state_o: o computed
// inside the state recurrence, h never materialised), in one of its forms:
//   kAuto: the gated Q Kᵀ of each chunk inside the state pass (inline), or chunk-parallel before it
//     (gdn::fwd_cuda_qk_gate, then gdn::fwd_cuda_state_o(kPrecomputedP)) when the pass splits V into several
//     column blocks per head (gdn::fwd_cuda_state_o_pre_p_pays: B = 1 long sequences); 16-warp pass blocks where
//     8 would run 128 columns per block (gdn::fwd_cuda_state_o_auto_block: B = 4 T = 8192), 8 otherwise.
//   kInline, kPrecomputedP: either P form forced (8 warps); kInline16: inline P, 16-warp pass blocks
//     (gdn::StateOBlock::k16Warps, >= 64 columns per block).
// The mma.sync forms give the same bits as each other and every form takes the same workspace (P uses the A buffer the fused forward leaves
// unused). The forced forms ("cuda.sm90.fused_inline", "cuda.sm90.fused_pqk", "cuda.sm90.fused_w16") let the
// tests and benchmarks run each on any shape. gdn_cuda_fused_fwd_reject says why `form` cannot run p ("" if it
// can: q, k, v, o in one 16-bit dtype, K <= 128; kPrecomputedP: and the gated Q Kᵀ kernel applies); it reads
// dtypes, presence and shapes only.
//   kPrep ("cuda.sm90.fused_prep", session 8): w, u and the gated Q Kᵀ from one kernel (gdn::fwd_cuda_prep; since
//     session 10 prep_wgmma, bf16 only, on warpgroup MMA) instead of prepare_wy_repr_fwd plus fwd_cuda_qk_gate, then
//     the pass with the pre-computed P and the automatic block; not the same bits as the other forms since session 10
//     (summation order inside the products).
//   kWgmmaSplit ("cuda.sm90.fused_wgmma_split", session 9): the warp-specialised pass on Hopper warpgroup MMA
//     (gdn::fwd_cuda_state_o_wgmma, WgmmaPass::kAuto: state warpgroups run the recurrence, another forms o; P inline;
//     bf16, K = 128, V a multiple of 32, chunk 64); not the same bits as the mma.sync forms (other summation order
//     inside the products). kAuto runs this form wherever it applies (gdn::fwd_cuda_state_o_wgmma_pays; s9run2:
//     faster at B = 4 and B = 1). Session 8's serial wgmma forms (kWgmma, kWgmmaPqk, kPrepWgmma) lost to it
//     everywhere and were removed in session 10.
//   kFold ("cuda.sm90.fused_fold", session 11): kAuto's choices with the gate cumsum folded into the pre-state
//     kernel (gdn::fwd_cuda_prep_head: prep_wgmma reads the raw g and writes γ for the pass; bf16, K <= 128).
//     Forced only: slower than the cumsum launch in GPU run s11run2 (kFoldHead in cuda_sm90.cu is off).
//   kNorm ("cuda.sm90.fused_norm", session 13): with use_qk_l2norm_in_kernel, no l2norm launches: prep_wgmma and the
//     wgmma pass read the raw q, k and normalise in f32 (gdn::GdnFwdParams::qk_norm: prep forms 1 / |k| of its K rows
//     and hands it to the pass in the rk buffer, the pass forms 1 / |q| from its Q tiles); qn, kn are never stored.
//     Not fla's rounding (fla rounds qn, kn to bf16 before the products): held to the float64 conformance tolerance.
//     Needs l2norm, bf16, and prep's and the pass's rules; q, k, o views without the pass's 16-byte rows take the
//     l2norm launches (run time). s13run1 (H200, bf16 H = 16 HV = 32 K = V = 128) 1.117 against 1.171 ms at B = 4
//     T = 8192, 2.214 against 2.052 ms at B = 1 T = 32768: since session 14 kAuto takes it where the pass runs 128
//     columns (gdn_cuda_fused_fwd_auto_form).
//   kNormR ("cuda.sm90.fused_norm_r", session 14): kNorm with 1 / |q| from an rstd-only l2norm launch of q (reads q,
//     writes rq f32 [B, T, H], no qn) that the pass reads (gdn::GdnFwdParams::rq) instead of forming it from its Q
//     tiles (the row sums that lengthened the output warpgroup's chain at 32 columns: s13run1 pass 1.432 -> 1.730
//     ms); q, k raw as kNorm. kAuto takes it where the pass runs 32 columns (gdn_cuda_fused_fwd_auto_form).
//   kAutoUnfolded (session 15; no implementation of its own): kAuto's choices with the l2norm launches (the wgmma
//     pass where it applies, else the mma.sync pass with its P and block rules), what kAuto resolves to where it
//     takes no folded form.
//   kNormCluster ("cuda.sm90.fused_norm_cl", session 16): the folded form kAuto's width rule picks (kNormR at 32
//     columns, kNorm otherwise) with the pass's blocks in thread-block clusters that share each chunk's K and Q tiles
//     by copy-engine multicast (gdn::GdnFwdParams::pass_cluster = gdn::fwd_cuda_state_o_wgmma_cluster: the G value
//     heads x column blocks of a q/k head; pairs of CTAs, with W shared too where a pair is one value head's column
//     blocks). The same bits as the form without clusters. kAuto takes it wherever a pair applies (session 17).
enum class GdnFusedForm : int {
  kAuto = 0, kInline, kPrecomputedP, kInline16, kPrep, kWgmmaSplit, kFold, kNorm, kNormR, kAutoUnfolded, kNormCluster
};
std::string gdn_cuda_fused_fwd_reject(const GdnParams& p, GdnFusedForm form = GdnFusedForm::kAuto);
// What kAuto runs on p on a device of `sms` SMs: where kNorm's rules hold, by the wgmma pass's width
// (gdn::fwd_cuda_state_o_wgmma_width), kNorm at 128 columns, kNormR at 32, each as kNormCluster where a pair of CTAs
// applies (gdn::fwd_cuda_state_o_wgmma_cluster; s17run1 whole forward B = 4 T = 8192 0.988 against 1.087 ms); otherwise (64 columns: a tie in s14run2;
// no l2norm; rules not met) kAutoUnfolded. GPU run s14run1 (H200, bf16 H = 16 HV = 32 K = V = 128, l2norm, whole
// forward, median of 9 interleaved): B = 4 T = 8192 (128 columns) kNorm 1.117, kNormR 1.190, unfolded 1.175 ms;
// B = 1 T = 32768 (32 columns) kNormR 1.988, kNorm 2.218, unfolded 2.043 ms. Host only; reads dtypes, presence and
// shapes. Since session 15 the plan calls it once (chunk_gated_delta_rule.cpp: GdnProblem::fused_form, from the plan
// device's SM count) and its run passes the resolved form; before, every run of cuda.sm90.fused re-ran it (kNorm's
// reject rules and two carves of the buffers on the host).
GdnFusedForm gdn_cuda_fused_fwd_auto_form(const GdnParams& p, int sms);
size_t gdn_cuda_fused_fwd_workspace(const GdnParams& p);
// form kAuto resolves itself on every call (gdn_cuda_fused_fwd_auto_form with the current device's SM count: direct
// callers such as tests); the plan passes the form it resolved once. The folded forms fall back to kAutoUnfolded at
// run time where q, k, o lack the pass's 16-byte rows.
// probe (timing tests only, as gdn_cuda_bwd's): called after each step's launches ("l2norm", "cumsum", "prep",
// "pass"; kNorm: "cumsum", "prep", "pass"; kNormR: "rq" (the rstd-only launch), "cumsum", "prep", "pass").
strata_status gdn_cuda_fused_fwd(const GdnParams& p, GdnFusedForm form, void* workspace, void* stream,
                                 const GdnStepProbe* probe = nullptr);
// Host: why the sub-operator calls of a pass would not run their tensor-core kernels ("" if every one does).
// They do when q, k, v (and do) share one 16-bit dtype (and o has it too in the forward): the intermediates are
// then stored in that dtype. Reads dtypes, presence and shapes of p only.
std::string gdn_cuda_tensor_core_report(const GdnParams& p, bool bwd);
#endif

}  // namespace strata::linear_attn
