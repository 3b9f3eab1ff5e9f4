// Kernel entry points of the GDN forward chunk operators (ops_gdn_kda.md §4.3-§4.8), for the operators'
// plans and for composite ops (chunk_gated_delta_rule) that call them directly, without descriptors.
// All take a GdnFwdParams (gdn_common.h) with shape, chunks and the tensors below filled; tensors may have
// any float dtype (f64 on the CPU only) and any element strides; all math is f32 (f64 in the references).
//
//   op                     reads                       writes
//   chunk_scaled_dot_kkt   k, beta, g (optional)       Akk  [B,T,HV,BT]  strictly lower, 0 elsewhere in the chunk
//   solve_tril             Akk                         A    [B,T,HV,BT]  (I + StrictLower(Akk))^-1, 0 above the diagonal
//   recompute_w_u_fwd      k, v, beta, A, g (opt.)     w [B,T,HV,K], u [B,T,HV,V]
//   prepare_wy_repr_fwd    k, v, beta, g (opt.)        w, u, A  (kkt + solve + recompute fused per chunk)
//   chunk_gated_delta_rule_fwd_h  k, w, u, g (opt.), h0 (opt.)  h [B,NT,HV,K,V], v_new (opt.), ht (opt.) [N,HV,K,V]
//   chunk_fwd_o            q, k, v (= v_new), h, g (opt.)  o [B,T,HV,V]
//
// Columns j >= L of rows in a partial chunk (L < BT valid rows) and columns above the diagonal are written as
// 0 in Akk / A; rows past a sequence end are never written (they belong to the next chunk or do not exist).
//
// Variable length: params.chunks.cu and params.chunks.offsets must be set (offsets in the memory space of the
// kernel: fill_chunk_offsets on the host, gdn_chunk_offsets_cuda on the device, using gdn_fwd_workspace()
// bytes of workspace for them). The CPU functions expect valid cu_seqlens values (check them first with
// check_cu_seqlens_host); the CUDA ones clamp and never go out of bounds.
#pragma once

#include <cstddef>
#include <string>

#include "ops/linear_attn/gdn_common/gdn_common.h"

namespace strata::linear_attn::gdn {

enum class FwdOp : int {
  kKkt = 0,
  kSolveTril,
  kRecomputeWU,
  kPrepareWY,
  kFwdH,
  kFwdO,
  kCount
};
const char* fwd_op_name(FwdOp op);  // "chunk_scaled_dot_kkt", ...

// float64 references: plain loops written from the spec formulas (Appendix A), any dtypes and strides.
// Templated on the accumulation type so that tests can also run the same loops in f32 (the "naive"
// same-precision computation of the acceptance rule): Real = double (reference) or float (naive).
template <class Real>
void fwd_reference(FwdOp op, const GdnFwdParams& p);

// CPU kernels for one Highway target (tile::cpu_isas()); nullptr if that target is not compiled.
using GdnFwdCpuFn = void (*)(FwdOp, const GdnFwdParams&);
GdnFwdCpuFn fwd_cpu_for(int64_t hwy_target);
// The best compiled CPU kernel for this machine.
void fwd_cpu(FwdOp op, const GdnFwdParams& p);

#if STRATA_WITH_CUDA
// CUDA sm_90 kernels. `params.chunks.offsets` must already be on the device for varlen (see above).
// Return a strata_status (launch checked). Stream-ordered; no host sync.
//   kMma: tensor-core kernels (gdn_fwd_cuda_mma.cu, mma.sync m16n8k16, f32 accumulation) for bf16 / f16 token
//         tensors; fwd_cuda_mma_reject says why they cannot run a problem ("" if they can).
//   kFma: f32 SIMT kernels (gdn_fwd_cuda_sm90.cu), any f32 / bf16 / f16 tensors.
//   kAuto: kMma when it applies, else kFma (what composite ops use); for kFwdH the split wgmma pass
//          (fwd_cuda_fwd_h_wgmma) first where it applies (bf16, K = 128; session 9, measured 2x faster).
//          kMma itself stays the mma.sync kernels (the ops' forced "cuda.sm90.mma").
enum class FwdCudaKernels : int { kAuto = 0, kMma, kFma };
int fwd_cuda(FwdOp op, const GdnFwdParams& p, void* stream);  // kAuto
int fwd_cuda(FwdOp op, const GdnFwdParams& p, FwdCudaKernels which, void* stream);
int fwd_cuda_mma(FwdOp op, const GdnFwdParams& p, void* stream);
int fwd_cuda_fma(FwdOp op, const GdnFwdParams& p, void* stream);
// Host: why the tensor-core kernels cannot run op on p ("" if they can). Reads only dtypes, presence and shape.
std::string fwd_cuda_mma_reject(FwdOp op, const GdnFwdParams& p);
// The fused state + output pass of chunk_gated_delta_rule's forward when the chunk states are not wanted
// (gdn_fwd_cuda_mma.cu, state_o_mma): reads q, k, w, u, g (opt.), h0 (opt.); writes o = chunk_fwd_o's output,
// v_new (opt.), ht (opt.); h must be absent (never materialised). bf16 / f16 tensor cores, K <= 128, BT <= 64;
// fwd_cuda_state_o_reject says why it cannot run p ("" if it can).
int fwd_cuda_state_o(const GdnFwdParams& p, void* stream);
std::string fwd_cuda_state_o_reject(const GdnFwdParams& p);
// Variants of the fused pass: kInline computes the gated Q Kᵀ of each chunk inside the sequential pass (every
// column block of a head recomputes it); kPrecomputedP reads it from p.Pqk, which fwd_cuda_qk_gate has filled
// (chunk-parallel, once per chunk and q/k head for the G value heads of its group), so the pass's chunk step
// loses the P products, their gating and the 10-blocks-on-8-warps imbalance. Same values and summation order:
// the two variants give the same bits. fwd_cuda_state_o(p, stream) is kInline.
enum class StateOKernel : int { kInline = 0, kPrecomputedP };
int fwd_cuda_state_o(const GdnFwdParams& p, StateOKernel which, void* stream);  // 8 warps
// Block of the fused pass: 8 warps (256 threads; 32 / 64 / 128 columns of S per block) or 16 warps (512 threads,
// <= 128 registers each; 64 / 128 columns: a warp's share of the chunk products is half as wide, and twice the
// warps per scheduler hide the chunk step's dependent chains). Every output element sees the same products in
// the same order, so the two blocks give the same bits (at any widths: columns are independent).
enum class StateOBlock : int { k8Warps = 0, k16Warps };
int fwd_cuda_state_o(const GdnFwdParams& p, StateOKernel which, StateOBlock block, void* stream);
// Whether the pre-computed P is expected to pay on p: the pass splits V into several column blocks per (sequence,
// value head) (few sequence-heads: B = 1 long sequences), each of which would form the same P on its sequential
// chain. With one block per head (V <= the pass's width) P is formed once anyway and the extra launch and
// round trip of P through memory would only add time. Not for f16 at 32 columns (the pre-computed form has room
// for two cp.async stages there, the inline one for three).
bool fwd_cuda_state_o_pre_p_pays(const GdnFwdParams& p);
// The block the automatic fused forward runs on p (8 warps, or 16 where they were measured faster).
StateOBlock fwd_cuda_state_o_auto_block(const GdnFwdParams& p);
// p.Pqk = the gated Q Kᵀ (from q, k, g; shape and chunks as the fused pass). bf16 / f16 (q, k and Pqk of one
// dtype), K <= 128, BT <= 64; fwd_cuda_qk_gate_reject says why it cannot run p ("" if it can).
int fwd_cuda_qk_gate(const GdnFwdParams& p, void* stream);
std::string fwd_cuda_qk_gate_reject(const GdnFwdParams& p);
// The fused pass on Hopper warpgroup MMA (gdn_fwd_cuda_wgmma.cu): the same inputs, outputs and precision model as
// fwd_cuda_state_o with P inline, S kept in wgmma accumulators. bf16, K = 128, V a multiple of 32, chunk size 64
// (fwd_cuda_state_o_wgmma_reject says why not, "" if it applies); token tensors whose run-time layout is not lean
// (unit column stride, strides multiples of 8, 16-byte aligned) are passed to fwd_cuda_state_o. width: columns of S
// per block (32, 64 or 128; 0 = fwd_cuda_state_o_wgmma_width). Not bit-identical to state_o_mma (other f32
// summation order in the products). Forms (kAuto: the measured best per block width, gdn_common/README.md):
//   kSplit (session 9, state_split_wgmma): warp-specialised: two warpgroups run only the recurrence W S → v_new →
//     S update, a third forms o of the same chunk from the S copy and Vn they leave in shared memory; tiles by
//     cp.async from the state threads, one block barrier per chunk;
//   kShort (session 11): kSplit's steps and values with a shorter recurrence chain: the output warpgroup meets the
//     state ones only at producer / consumer named barriers (its P Vn and o stores overlap the next chunk), and the
//     state threads' gate factors, S decay and u reads are issued while W S runs, o and (fwd_h) v_new are staged
//     for 16-byte stores; kShortOneWg: kShort with one state warpgroup of all the block's columns at widths 32 and
//     64 (W read once per chunk, no state-state barrier; 128 as kShort).
enum class WgmmaPass : int { kAuto = 0, kSplit, kShort, kShortOneWg };
int fwd_cuda_state_o_wgmma(const GdnFwdParams& p, int width, WgmmaPass form, void* stream);
// Session 12 (chunk_gated_delta_rule's saved residuals): with p.h (bf16) present the fused pass also writes h, the
// bf16 chunk-start states (S rounded once: the bits fwd_h writes), from the pairs of S's shared-memory copy, and
// with p.v_new present v_new; it then needs fwd_cuda_state_o_wgmma_lean (else an error: state_o_mma does not
// write h). fwd_cuda_state_o_wgmma_lean: the run-time layout the pass needs (lean token tensors, pair stores).
bool fwd_cuda_state_o_wgmma_lean(const GdnFwdParams& p);
// chunk_gated_delta_rule_fwd_h on the split pass's recurrence warpgroups (session 9): h (the bf16 chunk-start
// states, S rounded once, as state_mma's h), v_new (opt.), ht (opt.) from k, w, u, g (opt.), h0 (opt.). bf16 k, w, u,
// h, v_new; K = 128, V a multiple of 32, chunk size 64 (fwd_cuda_fwd_h_wgmma_reject); views that are not lean run
// fwd_cuda_mma. width as fwd_cuda_state_o_wgmma. Not bit-identical to state_mma (summation order).
int fwd_cuda_fwd_h_wgmma(const GdnFwdParams& p, int width, void* stream);  // WgmmaPass::kAuto
int fwd_cuda_fwd_h_wgmma(const GdnFwdParams& p, int width, WgmmaPass form, void* stream);
std::string fwd_cuda_fwd_h_wgmma_reject(const GdnFwdParams& p);
std::string fwd_cuda_state_o_wgmma_reject(const GdnFwdParams& p);
// Columns per block of the automatic choice on a device of `sms` SMs: the narrowest of 32 / 64 / 128 dividing V
// whose blocks fit in one wave, else the widest dividing V.
int fwd_cuda_state_o_wgmma_width(const GdnFwdParams& p, int sms);
// (Session 16) The cluster size (GdnFwdParams::pass_cluster) of the clustered kShort pass at `width` columns: 2 where
// it divides the CTAs of a q/k head (G x V / width) and that form is compiled for p's qk_norm / rq / h (h: 32, 128
// columns, session 18); 0 where none applies (one CTA a head, no compiled form). Sizes 4 and 8 removed in s17.
int fwd_cuda_state_o_wgmma_cluster(const GdnFwdParams& p, int width);
// (Session 16, tests) *clusters = how many clusters of p.pass_cluster CTAs of that pass can be resident at once
// (cudaOccupancyMaxActiveClusters): fewer than the grid's clusters where one wave would hold all CTAs means a second
// wave.
int fwd_cuda_state_o_wgmma_cluster_occupancy(const GdnFwdParams& p, int width, int* clusters);
// Whether the automatic fused forward runs the wgmma pass (split form, P inline) on p: wherever it applies (s9run2:
// B = 4 T = 8192 0.610 ms, B = 1 T = 32768 1.535 ms against 0.780 / 1.65 ms for the best mma.sync forms).
bool fwd_cuda_state_o_wgmma_pays(const GdnFwdParams& p);
// Test probe of the wgmma pass's primitives (descriptors, register A fragments, stmatrix.trans) on one warpgroup:
// A bf16 [64][128], B bf16 [16][128] (op 2: [16][64]), D f32 [64][16] (op 3: [16][64]); see gdn_fwd_cuda_wgmma.cu.
int fwd_cuda_wgmma_layout_probe(int op, const void* A, const void* B, float* D, void* stream);
// Everything before the state pass in one chunk-parallel kernel on Hopper warpgroup MMA (gdn_fwd_cuda_prep.cu,
// prep_wgmma, session 10: one warpgroup per chunk and value head): w, u (and A when p.A is present) as
// prepare_wy_repr_fwd's tensor-core kernel computes them, plus p.Pqk as fwd_cuda_qk_gate when p.Pqk is present — the
// same precision model as wy_mma<kPrepare> and qk_gate_mma, not the same bits (summation order inside the products).
// Reads k, v, beta (opt.), g (opt.), q (with Pqk). bf16 token tensors (k, v, w, u, A, q, Pqk), K <= 128, V <= 256,
// BT <= 64, any strides; sm_90a. fwd_cuda_prep_reject says why it cannot run p ("" if it can).
int fwd_cuda_prep(const GdnFwdParams& p, void* stream);
std::string fwd_cuda_prep_reject(const GdnFwdParams& p);
// (session 11) chunk_gated_delta_rule's gate cumsum folded into the pre-state kernel: with g_in present (the raw
// log gates [B, T, HV], any float dtype) the kernel forms γ = their chunk-local cumsum itself and writes it into
// p.g (f32 [B, T, HV]: the γ the later sub-operators read) instead of reading p.g. Everything else as fwd_cuda_prep.
// (Session 11 also folded the l2norm of q, k; measured slower than the two row_norm_fwd_cuda launches and removed:
// README "The forward's kernels and the folded head".)
struct GdnFwdHead {
  GdnTensor g_in;
};
int fwd_cuda_prep_head(const GdnFwdParams& p, const GdnFwdHead& head, void* stream);
std::string fwd_cuda_prep_head_reject(const GdnFwdParams& p, const GdnFwdHead& head);
#endif

}  // namespace strata::linear_attn::gdn
