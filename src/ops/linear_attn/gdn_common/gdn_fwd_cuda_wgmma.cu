// CUDA sm_90a GDN state passes on Hopper warpgroup MMA (wgmma.mma_async m64nNk16, f32 accumulation) for bf16
// token tensors: chunk_gated_delta_rule's fused forward (o without the chunk states) and
// chunk_gated_delta_rule_fwd_h (h, v_new). The same math, inputs and precision model as state_o_mma / state_mma
// (gdn_fwd_cuda_mma.cu; S and v_new / Vd enter their products as one bf16 term, P = Q Kᵀ ⊙ Γ rounded to bf16), only
// the f32 summation order inside the products differs. Per chunk c of a (sequence, value head) with start state
// S_c [K = 128, cols] in f32 registers:
//   v_new = u − W S_c,   o = scale (diag(e^γ) Q S_c + (Q Kᵀ ⊙ Γ, lower incl. diagonal) v_new),
//   S_{c+1} = e^{γ_last} S_c + Kᵀ (v_new ⊙ e^{γ_last − γ}).
// A warp-specialised kernel runs it (the state warpgroups carry S, an output warpgroup forms o): state_split_wgmma
// (tiles by cp.async from the state threads, session 9; its kShort form, session 11, shortens the recurrence chain).
// Session 10's copy-engine-fed form (state_tma_wgmma) was correct but slower (s10run2) and was removed in session 11.
// Session 8's serial pass (each warpgroup forming o beside its recurrence, P inline or pre-computed) and session 9's
// u-in-registers form lost to the split pass at every measured shape (s9run1 / s9run2) and were removed in session 10.
//
// Applies (fwd_cuda_state_o_wgmma_reject / fwd_cuda_fwd_h_wgmma_reject) to bf16 tensors with K = 128, V a multiple
// of 32, chunk size 64; at run time every token tensor must also be "lean" (unit column stride, strides multiples of
// 8 elements, 16-byte aligned data; o / v_new / h 4-byte pairs), else the mma.sync passes run. No atomics, fixed
// order: bitwise reproducible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_wgmma_layout.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/cp_async.cuh"
#include "tile/cuda/fast_math.cuh"
#include "tile/cuda/mma.cuh"
#include "tile/cuda/tma_tile.cuh"
#include "tile/cuda/wgmma.cuh"

namespace strata::linear_attn::gdn {
namespace {

namespace mma = strata::cuda::mma;

namespace wg = strata::cuda::wgmma;
using wg::mma_ss;
using wg::mma_rs;
using wg::wg_fence;
using wg::wg_commit;
using wg::wg_wait;
using wg::reg_fence;
using wg::reg_fence_u;
using wg::fence_proxy_async;
using wg::bar_wg;
using wg::bar_sync;
using wg::bar_arrive;
using wg::stmatrix_x4;
using wg::stmatrix_x4_trans;
using wg::ldmatrix_x4_trans;
using strata::cuda::cp_async16;

// Writes the m64 x kN accumulator rows of the warp (16 w..) as T pairs pk[half][j] (rows acc_row(.., 2 half),
// columns acc_col(j) and + 1: pack_state's order), transposed, into the K-major tile X [kN][kRowsLd] at byte address
// x (X's row = d's column, X's column = d's row + row0), by kN / 16 stmatrix.x4.trans (layout: wgl::st_trans_off).
template <int kN, int kRowsLd>
__device__ __forceinline__ void store_trans_pk(uint32_t x, int row0, const uint32_t (&pk)[2][kN / 8]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int jp = 0; jp < kN / 16; ++jp) {
    const uint32_t a = x + 2u * static_cast<uint32_t>(wgl::st_trans_off<kRowsLd>(lane, row0 + 16 * w, jp));
    stmatrix_x4_trans(a, pk[0][2 * jp], pk[1][2 * jp], pk[0][2 * jp + 1], pk[1][2 * jp + 1]);
  }
}
// The accumulator d (m64 x kN) rounded to T as store_trans_pk's pairs.
template <class T, int kN>
__device__ __forceinline__ void pack_acc(const float (&d)[kN / 2], uint32_t (&pk)[2][kN / 8]) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) pk[half][j] = mma::pack2<T>(d[4 * j + 2 * half], d[4 * j + 2 * half + 1]);
}
// The accumulator d rounded to T, transposed into X (store_trans_pk).
template <class T, int kN, int kRowsLd>
__device__ __forceinline__ void store_trans(uint32_t x, int row0, const float (&d)[kN / 2]) {
  uint32_t pk[2][kN / 8];
  pack_acc<T, kN>(d, pk);
  store_trans_pk<kN, kRowsLd>(x, row0, pk);
}

// e^x for the gate exponentials (x <= 0 wherever the value is used): one FMUL and one MUFU.EX2 (ex2.approx.ftz,
// relative error ~2^-22, far below the bf16 rounding of every product operand), where expf adds a range branch
// per call (32 + 4 calls per thread and chunk step with P inline).
__device__ __forceinline__ float gate_exp(float x) { return cuda::ex2_ftz(x * 1.4426950408889634f); }

// S's start value at this thread's accumulator positions (keys 64 mt + acc_row(w, lane, x & 3), columns
// col0 + acc_col(lane, x >> 2, x & 3) at S[mt][x]): h0 of (n, hv), 0 without h0.
template <int kN>
__device__ __forceinline__ void load_state(const GdnFwdParams& p, int64_t n, int64_t hv, int64_t col0,
                                           float (&S)[2][kN / 2]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int x = 0; x < kN / 2; ++x) {
      const int64_t a = 64 * mt + wgl::acc_row(w, lane, x & 3), col = col0 + wgl::acc_col(lane, x >> 2, x & 3);
      S[mt][x] = p.h0.present()
                     ? load_f(p.h0, n * p.h0.st[0] + hv * p.h0.st[1] + a * p.h0.st[2] + col * p.h0.st[3])
                     : 0.f;
    }
}
// The final state S into ht (same positions as load_state).
template <int kN>
__device__ __forceinline__ void store_state(const GdnFwdParams& p, int64_t n, int64_t hv, int64_t col0,
                                            const float (&S)[2][kN / 2]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int x = 0; x < kN / 2; ++x) {
      const int64_t a = 64 * mt + wgl::acc_row(w, lane, x & 3), col = col0 + wgl::acc_col(lane, x >> 2, x & 3);
      store_f(p.ht, n * p.ht.st[0] + hv * p.ht.st[1] + a * p.ht.st[2] + col * p.ht.st[3], S[mt][x]);
    }
}
// fwd_h: S rounded to T as the pairs of its rows (hpk[mt][row half][8-column block]; the bits store_trans writes
// into S's copy), packed before W S is issued (stores straight from S would make ptxas wait for W S: S is a wgmma
// accumulator).
template <class T, int kN>
__device__ __forceinline__ void pack_state(const float (&S)[2][kN / 2], uint32_t (&hpk)[2][2][kN / 8]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) pack_acc<T, kN>(S[mt], hpk[mt]);
}
// Keys 64 mt.. of h of chunk cidx (batch row b), columns col0.. of this warpgroup, from pack_acc's pairs of S[mt].
template <int kN>
__device__ __forceinline__ void store_h_rows_mt(const GdnFwdParams& p, int64_t b, int64_t cidx, int64_t hv,
                                                int64_t col0, int mt, const uint32_t (&pk)[2][kN / 8]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
  uint16_t* hp = static_cast<uint16_t*>(p.h.data) + h_base(p.h, p.chunks, b, cidx) + hv * p.h.st[2] + col0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint16_t* hrow = hp + (64 * mt + wgl::acc_row(w, lane, 2 * half)) * p.h.st[3];
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) *reinterpret_cast<uint32_t*>(hrow + wgl::acc_col(lane, j, 0)) = pk[half][j];
  }
}
// h of chunk cidx (batch row b), columns col0.. of this warpgroup, from pack_state's pairs.
template <int kN>
__device__ __forceinline__ void store_h_rows(const GdnFwdParams& p, int64_t b, int64_t cidx, int64_t hv, int64_t col0,
                                             const uint32_t (&hpk)[2][2][kN / 8]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) store_h_rows_mt<kN>(p, b, cidx, hv, col0, mt, hpk[mt]);
}
// P = Q Kᵀ ⊙ Γ (j <= i < L, selected), rounded to T, as the register A operand of the 4 K steps of P Vn
// (accP: the m64n64 accumulator of Q Kᵀ; gam: γ of the chunk's rows).
// kNorm (session 13, GdnFwdParams::qk_norm: Q Kᵀ of the raw rows): P[i][j] also scaled by rq[row half of i] (the
// thread's two rows' 1 / |q_i|) and rk[j] (1 / |k_j|), in f32 before the rounding.
template <class T, bool kNorm>
__device__ __forceinline__ void gate_p(float (&accP)[32], uint32_t (&pa)[4][4], const float* gam, int L,
                                       const float (&rq)[2], const float* rk) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int x = 0; x < 32; ++x) {
    const int i = wgl::acc_row(w, lane, x & 3), j = wgl::acc_col(lane, x >> 2, x & 3);
    const float a = kNorm ? accP[x] * (rq[(x >> 1) & 1] * rk[j]) : accP[x];
    accP[x] = (j <= i && i < L) ? a * gate_exp(gam[i] - gam[j]) : 0.f;
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = mma::pack2<T>(accP[8 * kk + 0], accP[8 * kk + 1]);  // rows g, K columns 16 kk + 2 (l % 4)
    pa[kk][1] = mma::pack2<T>(accP[8 * kk + 2], accP[8 * kk + 3]);  // rows g + 8
    pa[kk][2] = mma::pack2<T>(accP[8 * kk + 4], accP[8 * kk + 5]);  // rows g, K columns + 8
    pa[kk][3] = mma::pack2<T>(accP[8 * kk + 6], accP[8 * kk + 7]);  // rows g + 8, K columns + 8
  }
}
// o rows < L of the chunk at t0 (columns col0 .. col0 + kCols − 1) = scale · accO, as T pairs.
template <class T, int kCols>
__device__ __forceinline__ void store_o_rows(const GdnFwdParams& p, const SeqPos& sq, int64_t hv, int64_t t0,
                                             int64_t col0, int L, float scale, const float (&accO)[kCols / 2]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = wgl::acc_row(w, lane, 2 * half);
    if (i >= L) continue;
    uint16_t* orow =
        static_cast<uint16_t*>(p.o.data) + sq.b * p.o.st[0] + (t0 + i) * p.o.st[1] + hv * p.o.st[2] + col0;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
      *reinterpret_cast<uint32_t*>(orow + wgl::acc_col(lane, j, 0)) =
          mma::pack2<T>(scale * accO[4 * j + 2 * half], scale * accO[4 * j + 2 * half + 1]);
  }
}

// Rows < L of a token tensor x [B, T, heads, D] at (sq.b, t0 + row, hv, col0..), from the warp's accumulator rows
// as T pairs pk (store_trans_pk's order), staged (session 11): the warp's 16 rows go row-major into its slice of the
// staging tile at stg ([64][kCols + 8] T: 16-byte padded rows, conflict-free stmatrix and 16-byte reads) by kCols / 16
// stmatrix.x4, then out by 16-byte stores of whole rows, whole 32-byte sectors (kCols / 8 lanes a row), where the
// pairs wrote half sectors (prep_wgmma's staged stores: −0.1 ms, s10run1). x must take 16-byte stores (rows16).
template <int kCols>
__device__ __forceinline__ void store_rows_staged(const GdnTensor& x, const SeqPos& sq, int64_t hv, int64_t t0,
                                                  int64_t col0, int L, const uint32_t (&pk)[2][kCols / 8],
                                                  unsigned char* stg) {
  constexpr int kLd = kCols + 8, kSeg = kCols / 8, kRowsIt = 32 / kSeg;
  static_assert(32 % kSeg == 0 && 16 % kRowsIt == 0, "whole rows per warp instruction");
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(stg));
  const int bi = lane >> 3, br = 16 * w + 8 * (bi & 1) + (lane & 7);  // block bi of a group: (half bi % 2, j + bi / 2)
#pragma unroll
  for (int jp = 0; jp < kCols / 16; ++jp)
    stmatrix_x4(s + 2u * static_cast<uint32_t>(br * kLd + 8 * (2 * jp + (bi >> 1))), pk[0][2 * jp], pk[1][2 * jp],
                pk[0][2 * jp + 1], pk[1][2 * jp + 1]);
  __syncwarp();
  const int seg = lane % kSeg;
#pragma unroll
  for (int it = 0; it < 16 / kRowsIt; ++it) {
    const int i = 16 * w + kRowsIt * it + lane / kSeg;
    const uint4 v = *reinterpret_cast<const uint4*>(stg + 2 * (i * kLd + 8 * seg));
    if (i < L)
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(x.data) + sq.b * x.st[0] + (t0 + i) * x.st[1] + hv * x.st[2] +
                                col0 + 8 * seg) = v;
  }
  __syncwarp();  // the reads done before the next chunk's stmatrix
}
// A token tensor whose rows take 16-byte stores at column offsets that are multiples of 8.
__device__ __forceinline__ bool rows16(const GdnTensor& x) {
  return ((x.st[0] | x.st[1] | x.st[2]) & 7) == 0 && (reinterpret_cast<uintptr_t>(x.data) & 15) == 0;
}

// A token tensor [B, T, heads, D] that the pass copies by 16-byte segments at any (b, t, head): dtype T, unit
// column stride, outer strides multiples of 8 elements, 16-byte aligned data.
template <class T>
bool lean16(const GdnTensor& t) {
  const int32_t dt = std::is_same_v<T, __nv_bfloat16> ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16;
  return t.dtype == dt && t.st[3] == 1 && ((t.st[0] | t.st[1] | t.st[2]) & 7) == 0 &&
         (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0;
}
// An output stored by aligned 32-bit pairs: dtype T, unit column stride, even outer strides, 4-byte aligned.
template <class T>
bool pair16(const GdnTensor& t) {
  const int32_t dt = std::is_same_v<T, __nv_bfloat16> ? STRATA_DTYPE_BF16 : STRATA_DTYPE_F16;
  return t.dtype == dt && t.st[3] == 1 && ((t.st[0] | t.st[1] | t.st[2]) & 1) == 0 &&
         (reinterpret_cast<uintptr_t>(t.data) & 3u) == 0;
}

// h stored by 32-bit pairs (unit column stride, even outer strides; GdnTensor h has 5 strides).
bool h_pairs(const GdnTensor& h) {
  return h.st[4] == 1 && ((h.st[0] | h.st[1] | h.st[2] | h.st[3]) & 1) == 0 &&
         (reinterpret_cast<uintptr_t>(h.data) & 3u) == 0;
}

constexpr int kRowsC = 64;   // rows of a chunk tile
constexpr int kKeys = 128;   // K (rows of S, columns of the K / W / Q tiles)
constexpr int kMaxSmem = 227 * 1024;

// S rounded to T into this warpgroup's S copy (store_trans) and, with hc >= 0 (the fused pass writing h, session
// 12), as h of chunk hc from the same pairs: the pairs are packed once, after the update has been waited for, so
// that nothing extra is live across the pass's wgmma issues.
template <class T, int kN>
__device__ __forceinline__ void store_state_copy(const GdnFwdParams& p, uint32_t sb, const float (&S)[2][kN / 2],
                                                 int64_t b, int64_t hc, int64_t hv, int64_t col0) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    uint32_t pk[2][kN / 8];
    pack_acc<T, kN>(S[mt], pk);
    store_trans_pk<kN, kKeys>(sb, 64 * mt, pk);
    if (hc >= 0) store_h_rows_mt<kN>(p, b, hc, hv, col0, mt, pk);
  }
}

// The state warpgroups' steps of one chunk (row i of the chunk: wgl::acc_row; the U tile: row-major with leading
// dimension ldu, this warpgroup's columns from cb). Both forms of the split pass run the same steps on the same values
// (the same bits); the session-11 form only issues the first three while W S runs.
// fd[half] = e^{γ_L − γ_i} of the thread's two rows (0 past L): the decay of v_new's rows in the S update.
__device__ __forceinline__ void gate_fd(float (&fd)[2], const float* gam, float glast, int L) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = wgl::acc_row(w, lane, 2 * half);
    fd[half] = i < L ? gate_exp(glast - gam[i]) : 0.f;
  }
}
// The u pairs of the thread's accumulator positions (up[half][j]: row acc_row(.., 2 half), columns cb + acc_col(j)).
template <int kN, int kLdU>
__device__ __forceinline__ void load_u(uint32_t (&up)[2][kN / 8], const uint16_t* Us, int cb) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
      up[half][j] = *reinterpret_cast<const uint32_t*>(Us + wgl::acc_row(w, lane, 2 * half) * kLdU + cb +
                                                       wgl::acc_col(lane, j, 0));
}
// S *= e^{γ_L} (the first term of S_{c+1}).
template <int kN>
__device__ __forceinline__ void scale_state(float (&S)[2][kN / 2], float decay) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int x = 0; x < kN / 2; ++x) S[mt][x] *= decay;
}
// v_new = u − W S for this thread's rows (accW holds W S on entry, v_new on return; vnp: v_new rounded to T as
// store_trans_pk's pairs: what Vn and p.v_new hold).
template <class T, int kN>
__device__ __forceinline__ void form_v_new(float (&accW)[kN / 2], const uint32_t (&up)[2][kN / 8],
                                           uint32_t (&vnp)[2][kN / 8]) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const float2 uu = mma::unpack2<T>(up[half][j]);
      const float x0 = uu.x - accW[4 * j + 2 * half], x1 = uu.y - accW[4 * j + 2 * half + 1];
      vnp[half][j] = mma::pack2<T>(x0, x1);
      accW[4 * j + 2 * half] = x0, accW[4 * j + 2 * half + 1] = x1;
    }
}
// v_new's rows < L of the chunk at t0 (columns col0 + acc_col) into p.v_new when present, from form_v_new's pairs.
template <int kN>
__device__ __forceinline__ void store_v_new_rows(const GdnFwdParams& p, const SeqPos& sq, int64_t hv, int64_t t0,
                                                 int64_t col0, int L, const uint32_t (&vnp)[2][kN / 8]) {
  if (!p.v_new.present()) return;
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = wgl::acc_row(w, lane, 2 * half);
    if (i >= L) continue;
    uint16_t* vrow = static_cast<uint16_t*>(p.v_new.data) + sq.b * p.v_new.st[0] + (t0 + i) * p.v_new.st[1] +
                     hv * p.v_new.st[2] + col0;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) *reinterpret_cast<uint32_t*>(vrow + wgl::acc_col(lane, j, 0)) = vnp[half][j];
  }
}
// The Kᵀ A fragments of the S update (keys 64 mt + 16 w.., chunk rows 16 kk..) from the stage's [t][key] K tile at
// kst (tile_off<128>; kCb: the copy engine's column-block layout cb_off<64>, session 16).
template <bool kCb = false>
__device__ __forceinline__ void load_kt(uint32_t (&kf)[2][4][4], uint32_t kst) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ldmatrix_x4_trans(kf[mt][kk], kst + 2u * static_cast<uint32_t>(
                                              kCb ? wgl::cb_ld_trans_off<kRowsC>(lane, 16 * kk, 64 * mt + 16 * w)
                                                  : wgl::ld_trans_off<kKeys>(lane, 16 * kk, 64 * mt + 16 * w)));
}
// Descriptor of K step ks of a [64][128] K / Q tile: tile_off<128> (cp.async) or, kCb, cb_off<64> (copy engine).
template <bool kCb>
__device__ __forceinline__ uint64_t kq_desc(uint32_t base, int ks) {
  return kCb ? wgl::cb_desc<kRowsC>(base, ks) : wgl::tile_desc<kKeys>(base, ks);
}

// ---- session 16: thread-block clusters sharing the K and Q tiles (GdnFwdParams::pass_cluster) ----
// The K and Q (and W) tensor maps of the clustered pass (tma::encode_blocks_map, boxes of 64 rows landing as part of a
// cb_off<64> tile): one box of 32 / kCS 8-column blocks of K | Q per CTA, or, w_shared (the cluster's CTAs are column
// blocks of one value head, so they read the same W tile too), a box of 16 / kCS blocks of each of K, W, Q.
struct PassMaps {
  CUtensorMap k, q, w;
  int w_shared;
};
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster (release / acquire: mbarrier inits before any remote use; no CTA exits
// while another may still arrive on its barriers).
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// An arrival (release at cluster scope) on the mbarrier at shared offset bar of CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// tma::load_blocks multicast: the box lands at offset dst of every CTA in `mask` and completes its bytes on the
// mbarrier at offset bar of each.
__device__ __forceinline__ void load_blocks_mc(uint32_t dst, const CUtensorMap* map, int t, int q, int head, int b,
                                               uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3, %4, %5, %6}], [%7], %8;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(t), "r"(q), "r"(head), "r"(b), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void st_shared_zero16(uint32_t a) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(a), "r"(0) : "memory");
}
// S += Kᵀ Vd (S scaled by e^{γ_L} just before: scale_state; Vd the warpgroup's [kN][64] tile at vd) issued; waited
// for by update_wait.
template <class T, int kN>
__device__ __forceinline__ void update_issue(float (&S)[2][kN / 2], uint32_t (&kf)[2][4][4], uint32_t vd) {
  reg_fence(S[0]), reg_fence(S[1]);
  wg_fence();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_rs<T, kN>(S[mt], kf[mt][kk], wgl::tile_desc<kRowsC>(vd, kk), 1);
  wg_commit();
}
template <int kN>
__device__ __forceinline__ void update_wait(float (&S)[2][kN / 2], uint32_t (&kf)[2][4][4]) {
  wg_wait<0>();
  reg_fence(S[0]), reg_fence(S[1]);
  reg_fence_u(kf);  // the register A operands stay live (unchanged) until their group completed
}

// ---------------------------------------------------------------- the split pass (session 9)
// state_split_wgmma<T, kN, kStages, kOut>: the same recurrence with the output products taken off its critical
// path by warp specialisation. In session 8's serial pass each warpgroup issued W S, then Q S + Q Kᵀ (24 wgmma), then
// the S update; wgmma of one warpgroup execute in order, so Q S and Q Kᵀ sat between W S and the S update of every
// chunk. Here warpgroups 0 and 1 ("state", kN columns each: both 64-row halves of the 128 keys, two m64 x kN
// accumulators) run only the recurrence:
//   W S_c → v_new, Vn, Vd → S_{c+1} = e^{γ_L} S_c + Kᵀ Vd → the bf16 copy of S_{c+1},
// and with kOut a third warpgroup ("output", all 2 kN columns of the block) forms o of the same chunk from the
// shared tiles the state warpgroups leave:
//   Q S_c (B = the two state warpgroups' S copies, adjacent rows of one [2 kN][128] K-major tile: one N = 2 kN
//   wgmma a K step), Q Kᵀ (once per block instead of once per warpgroup), P gated into registers, then O += P Vn_c
//   (B = the two Vn tiles, again one [2 kN][64] tile).
// Per chunk c (all warpgroups meet at the block barrier (B): the stage of chunk c and S_c's copy visible):
//   state:  W S_c issued; loads of chunk c + kStages − 1; Kᵀ fragments (ldmatrix.trans); W S waited; v_new (global),
//           Vn, Vd (stmatrix.trans); arrive (V) [kOut]; S update; wait (Q) [kOut]; S_{c+1}'s copy written.
//   output: Q S_c, then Q Kᵀ issued; Q S waited → arrive (Q); Q Kᵀ waited, P gated; wait (V); P Vn_c; o stored.
// Named barriers: (Q) = Q S_c has read S_c's copy (the state warpgroups overwrite it with S_{c+1} after it),
// (V) = Vn_c written (and fenced to the async proxy) by both state warpgroups. Each is passed once per chunk by
// every thread (bar.arrive on one side, bar.sync on the other; 3 × 128 threads), and (B) orders the chunks, so the
// S copy, Vn and Vd need one buffer each, and the output warpgroup reads Q_c, K_c within chunk c as the state ones
// do.
// Without kOut (chunk_gated_delta_rule_fwd_h): 2 warpgroups, no Q tile, no Vn; the chunk-start states h_c = S_c
// rounded to bf16 (the bits of the S copy, fwd_h's state_mma rounding) are stored from the registers while W S_c
// runs, v_new as in kOut.
// Shared memory (bytes; kN = 64, i.e. 128 columns a block): stage = K, W [, Q] 16 KB each + U [64][136] 17 KB
// (65 / 49 KB); S copy [128][128] 32 KB, Vd [128][64] 16 KB, Vn 16 KB (kOut), γ [2][64] 512 B:
//   kOut: 2 stages 194.5 KB (3 would be 259.5 KB); fwd_h: 3 stages 195.5 KB.
//   kN = 32: kOut 3 stages 203.5 KB, fwd_h 3 stages 147.5 KB; kN = 16: 175.5 / 123.5 KB.
// Registers: a state thread holds S (kN f32), W S / v_new (kN / 2), the Kᵀ fragments (32); an output thread O (kN),
// Q Kᵀ (32) and P's bf16 A fragments (16). kOut has 384 threads (<= 168 registers each), fwd_h 256.
//
// kShort (session 11): the same steps on the same values (the same bits), with the recurrence's chain shortened.
// (1) The output warpgroup no longer meets the state ones at a block barrier: (B) becomes (S), a barrier of the state
// threads (stage c, γ_c, S_c's copy among them), and four producer / consumer pairs (bar.arrive on one side,
// bar.sync on the other) with the output warpgroup:
//   (F) state → output: stage c, γ_c and S_c's copy written (at the top of chunk c; arrived once W S_c was done, so
//       that Q S_c would not share the tensor cores with W S_c, it was 14 % slower: s11run1);
//   (Q) output → state: Q S_c and Q Kᵀ_c done (S_c's copy and the stage's Q, K tiles may be overwritten);
//   (V) state → output: Vn_c written;   (N) output → state: P Vn_c done (Vn may be overwritten; not after the last
//       chunk).
// So the output's P Vn_c and o stores overlap the state warpgroups' next W S instead of holding (B); it runs at most
// about one chunk behind (its Q S_{c+1} must finish before S_{c+2}'s copy is written). γ: a ring of 4 chunks.
// (2) Per state thread, the work that does not need W S_c (the rows' decays e^{γ_L − γ}, the u pairs, the Kᵀ
// fragments where registers allow) is issued while W S_c runs instead of after its wait; (3) where registers allow
// (not the 128-column fused pass), Vn (with its (N) wait and (V) arrival) and the v_new stores are issued after the
// S update, while it runs, instead of before it.
// Each named barrier alternates strictly between its two sides (each side passes a barrier of the other kind in
// between), so one hardware barrier each suffices.
// kSW = 1 (kShortOneWg, blocks of 32 or 64 columns): one state warpgroup holds all kBV = kN columns of the block (S
// 2 x kN / 2 f32 a thread), so W is read once per chunk by one N = kN wgmma chain instead of by two warpgroups of
// kN / 2 columns (at 32 columns W S was 8 m64n16k16 per warpgroup: the 2 KB W slice of a K step dominates its
// shared-memory reads), and (S) is a barrier of 128 threads. Not the same summation grouping as kSW = 2 in general
// (other N per wgmma), so it is compared with the split form within bf16 tolerance, not by bits.
template <int kBV, bool kOut>
constexpr int sp_stage_bytes() {
  return (kOut ? 3 : 2) * kRowsC * kKeys * 2 + kRowsC * (kBV + 8) * 2;
}
constexpr int kGamRing = 4;  // γ of chunks c & 3 (kShort; the session-9 form uses two of them)
// (+ the kShort forms' staging tile: o [64][kBV + 8] (kOut) or each state warpgroup's v_new [64][kN + 8] (fwd_h))
// (+ kNorm: a ring of 1 / |k| of the chunks' rows beside γ's, GdnFwdParams::qk_norm)
// (+ kMc, session 16: a full and an empty mbarrier per stage)
template <int kBV, int kStages, bool kOut, bool kNorm = false, bool kMc = false>
constexpr int sp_smem_bytes() {
  return kStages * sp_stage_bytes<kBV, kOut>() + kBV * kKeys * 2 + (kOut ? 2 : 1) * kBV * kRowsC * 2 +
         (kNorm ? 2 : 1) * kGamRing * kRowsC * 4 + kRowsC * (kBV + 16) * 2 + (kMc ? 16 * kStages : 0);
}
template <int kBV, bool kOut, bool kNorm = false, bool kMc = false>
constexpr int sp_stages() {
  return sp_smem_bytes<kBV, 3, kOut, kNorm, kMc>() <= kMaxSmem ? 3 : 2;
}
constexpr int sp_threads(int sw, bool out) { return (sw + (out ? 1 : 0)) * 128; }
// Named barriers ((B) is 0; 1, 2 are the state warpgroups' own; kShort: (F), (N), (S)).
constexpr int kBarQ = 3, kBarV = 4, kBarF = 5, kBarN = 6, kBarS = 7;
// kOut at 128 columns: 168 registers a thread at launch (384 threads); the state warpgroups (S 64, v_new 32, Kᵀ
// fragments 32) take 184, the output one (O 64, Q Kᵀ 32, P 16) 136: 2 x 184 + 136 = 3 x 168.
constexpr int kStateRegs = 184, kOutRegs = 136;
static_assert(2 * kStateRegs + kOutRegs == 3 * 168, "the block's register budget");

// kH (kOut, kShort only; session 12): the fused pass also writes h (store_state_copy); its own instantiations, so that
// the pass without h keeps its registers (with the h stores compiled in, the 128-column pass spilled 4 bytes).
// kNorm (kOut, kShort, two state warpgroups; session 13): GdnFwdParams::qk_norm, q and k the raw rows: the state
// warpgroups read r_k = p.rk of the chunk's rows into a ring beside γ's (threads 64..127, a chunk ahead, as γ) and
// scale Vd's rows by it (S += Knᵀ Vd = Kᵀ diag(r_k) Vd); the output warpgroup forms r_q of its two rows from the Q
// tile while Q S and Q Kᵀ run (each lane 32 columns of both rows, two xor shuffles) and scales the rows of Q S and
// Q Kᵀ by r_q, the columns of Q Kᵀ by r_k. Its own instantiations (the plain pass keeps its registers).
// kQLoad (session 14, GdnFwdParams::rq present; with kNorm): r_q not formed from the Q tile but read from p.rq (1 / |q|
// of the raw rows from an rstd-only l2norm launch), each output thread its two rows of chunk c + 1 while chunk c runs
// (registers: no shared memory, nothing on the state warpgroups' chain). r_k as with kNorm. (Session 14 also measured
// k's fold alone, q normalised by its l2norm launch: B = 1 2.024 ms against 1.988 for this one; removed.)
// kCS > 1 (session 16, GdnFwdParams::pass_cluster; kOut, kShort, two state warpgroups): the grid runs as clusters
// of kCS CTAs of one q/k head (blocks of the head's G value heads x nvt column blocks are consecutive), and each chunk's
// K and Q tiles (32 KB, read by every CTA of the cluster) come by copy-engine multicast: CTA r of the cluster fetches
// 8-column blocks r (32 / kCS).. of K | Q for all (one 5-D box, maps), so the cluster reads them from L2 once instead of
// kCS times (the pass was L2-bound: s11run2 ncu L2 73-77 %). They land in the column-block layout cb_off<64> (wgmma
// descriptors cb_desc, Kᵀ fragments cb_ld_trans_off: the same products, the same bits); U stays cp.async, and so does W
// unless the cluster's CTAs are column blocks of one value head (maps.w_shared: each CTA then fetches 16 / kCS blocks of
// each of K, W, Q for all; B = 1's 32-column blocks, 4 a head, read the same W tile). Per stage
// a full mbarrier (1 arrival + the 32 (48) KB: every CTA's own expect_tx, the bytes from all CTAs' boxes) and an empty one
// (kCS arrivals): before refilling a stage, thread 0 of each CTA arrives on the empty barrier of every CTA of the
// cluster (its own readers are done: after (S) and (Q)) and waits on its own for all kCS, so no CTA's box overwrites a
// tile another CTA still reads. Rows past the chunk (varlen: the next sequence's rows) are zeroed after the copy, as
// cp.async's zero fill did, before (S) / (F) publish the stage.
// kCS > 1 with kH (session 18, the saved forward's pass writing h): each CTA stores h of its own columns from its S
// registers (store_state_copy), as unclustered; the cluster changes only how K and Q (and W) reach shared memory, so h,
// v_new, o and ht are the unclustered kH pass's bits. Shared memory as the plain clustered pass (h adds none).
template <class T, int kN, int kSW, int kStages, bool kOut, bool kShort, bool kH = false, bool kNorm = false,
          bool kQLoad = false, int kCS = 1>
__global__ void __launch_bounds__(sp_threads(kSW, kOut), 1)
    state_split_wgmma(const GdnFwdParams p, int64_t nvt, const __grid_constant__ PassMaps maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host entry launches this kernel only on sm_90 devices of an sm_90a build)
#else
  static_assert(kN == 16 || kN == 32 || kN == 64, "per-warpgroup column widths with a wgmma wrapper");
  static_assert(kStages == 2 || kStages == 3, "two or three stages");
  static_assert(kSW == 2 || (kSW == 1 && kShort), "one state warpgroup only in the kShort form");
  static_assert(!kH || (kOut && kShort), "h from the fused pass in its kShort form only (fwd_h writes its own)");
  static_assert(!kNorm || (kOut && kShort && kSW == 2 && !kH), "qk_norm: the fused kShort pass, two state warpgroups");
  static_assert(kNorm || !kQLoad, "r_q only with the folded l2norm");
  static_assert(kCS == 1 || (kOut && kShort && kSW == 2 && (kCS == 2 || kCS == 4 || kCS == 8)),
                "clusters: the fused kShort pass with two state warpgroups; 2, 4 or 8 CTAs");
  constexpr bool kMc = kCS > 1;
  constexpr int kThreads = sp_threads(kSW, kOut);
  constexpr int kST = kSW * 128;              // state threads
  constexpr int kBV = kSW * kN;               // columns of S per block
  constexpr int kTileB = kRowsC * kKeys * 2;  // bytes of a K / W / Q tile
  constexpr int kLdU = kBV + 8;               // U's leading dim (elements): conflict-free pair reads
  constexpr int kUOff = (kOut ? 3 : 2) * kTileB;
  constexpr int kStageB = sp_stage_bytes<kBV, kOut>();
  constexpr int kSbB = kN * kKeys * 2;  // a state warpgroup's S copy
  constexpr int kVB = kN * kRowsC * 2;  // a state warpgroup's Vd (and Vn)
  constexpr int kGm = kShort ? kGamRing - 1 : 1;  // γ slot of chunk c: c & kGm
  static_assert(kTileB % 128 == 0 && kStageB % 16 == 0 && kSbB % 128 == 0 && kVB % 128 == 0, "aligned regions");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t sb_all = s0 + kStages * kStageB;  // [kBV][128]: rows wg kN.. = warpgroup wg's S copy
  const uint32_t vd_all = sb_all + kSW * kSbB;     // [kBV][64]
  const uint32_t vn_all = vd_all + kSW * kVB;      // [kBV][64] (kOut)
  // γ ring [4][64]
  float* gam2 = reinterpret_cast<float*>(smem + kStages * kStageB + kSW * kSbB + (kOut ? 2 : 1) * kSW * kVB);
  float* rk2 = gam2 + kGamRing * kRowsC;  // (kNorm) r_k ring [4][64], same slots as γ's
  unsigned char* const stage_tile = reinterpret_cast<unsigned char*>(gam2 + (kNorm ? 2 : 1) * kGamRing * kRowsC);
  // (kMc) full[kStages], empty[kStages] after the staging tile
  uint64_t* const full = reinterpret_cast<uint64_t*>(stage_tile + kRowsC * (kBV + 16) * 2);
  uint64_t* const empty = full + kStages;

  const int64_t HV = p.shape.HV, BT = p.shape.BT;
  const int64_t vt = blockIdx.x % nvt, rest = blockIdx.x / nvt;
  const int64_t n = rest / HV, hv = rest % HV, h = hv / p.shape.G;
  const int64_t v0 = vt * kBV;
  const SeqPos sq = locate_sequence(p.chunks, n);
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31;
  if constexpr (kMc) {
    if (tid == 0)
      for (int s = 0; s < kStages; ++s) cuda::mbar_init(full + s, 1), cuda::mbar_init(empty + s, kCS);
    cluster_sync_all();  // every CTA's barriers initialised before any box or remote arrival reaches them
  }
  // (kMc) parity of chunk c's phase of its stage's full barrier
  [[maybe_unused]] auto full_parity = [](int64_t c) { return static_cast<uint32_t>((c / kStages) & 1); };

  if (kOut && wg == kSW) {
    // ------------------------------------------------ output warpgroup: o of chunk c, alongside the recurrence
    if constexpr (kOut && kN == 64 && kSW == 2) wg::setmaxnreg_dec<kOutRegs>();
    const float scale = p.shape.scale;
    // kShort: o staged for 16-byte stores when o's rows allow them (the block's columns start at multiples of 32).
    const bool o16 = rows16(p.o);
    unsigned char* ost = stage_tile;
    int st = 0;
    int64_t c = 0;
    // (kQLoad) r_q of this thread's two rows (acc_row(.., 0 / 2)) of the chunk at t (1 past the sequence: o's rows
    // there are never stored).
    [[maybe_unused]] auto fetch_rq = [&](int64_t t, float (&r)[2]) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t i = t + wgl::acc_row(w, lane, 2 * half);
        r[half] = i < sq.eos ? static_cast<const float*>(p.rq.data)[sq.b * p.rq.st[0] + i * p.rq.st[1] + h * p.rq.st[2]]
                             : 1.f;
      }
    };
    [[maybe_unused]] float rq_next[2] = {1.f, 1.f};
    if constexpr (kQLoad) fetch_rq(sq.bos, rq_next);
    for (int64_t t0 = sq.bos; t0 < sq.eos; t0 += BT, ++c, st = st + 1 == kStages ? 0 : st + 1) {
      const int L = static_cast<int>(t0 + BT < sq.eos ? BT : sq.eos - t0);
      float rq[2] = {1.f, 1.f};
      if constexpr (kQLoad) {  // this chunk's r_q (loaded a chunk ago), then the next chunk's in flight
        rq[0] = rq_next[0], rq[1] = rq_next[1];
        if (t0 + BT < sq.eos) fetch_rq(t0 + BT, rq_next);
      }
      bar_sync(kShort ? kBarF : 0, kThreads);  // (F) / (B)
      if constexpr (kMc) cuda::tma::mbar_wait_ptx<false>(cuda::smem_u32(full + st), full_parity(c));  // (done: (F))
      const float* gam = gam2 + (c & kGm) * kRowsC;
      const uint32_t kst = s0 + st * kStageB, qst = kst + 2 * kTileB;
      float accO[kBV / 2], accP[32];
      reg_fence(accO), reg_fence(accP);
      wg_fence();
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks)
        mma_ss<T, kBV>(accO, kq_desc<kMc>(qst, ks), wgl::tile_desc<kKeys>(sb_all, ks), ks > 0);
      wg_commit();
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks) mma_ss<T, 64>(accP, kq_desc<kMc>(qst, ks), kq_desc<kMc>(kst, ks), ks > 0);
      wg_commit();
      float eo[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = wgl::acc_row(w, lane, 2 * half);
        eo[half] = i < L ? gate_exp(gam[i]) : 0.f;
        if constexpr (kQLoad) eo[half] *= rq[half];
      }
      if constexpr (kNorm && !kQLoad) {  // r_q of rows acc_row(.., 0 / 2) while Q S and Q Kᵀ run: lane l sums columns 32 (l % 4)..
        const uint16_t* Qs = reinterpret_cast<const uint16_t*>(smem + st * kStageB + 2 * kTileB);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = wgl::acc_row(w, lane, 2 * half);
          float ss = 0.f;
#pragma unroll
          for (int sg = 0; sg < 4; ++sg)
            ss = wgl::sum_sq_bf16x8(
                *reinterpret_cast<const uint4*>(Qs + (kMc ? wgl::cb_off<kRowsC>(i, 32 * (lane & 3) + 8 * sg)
                                                          : wgl::tile_off<kKeys>(i, 32 * (lane & 3) + 8 * sg))),
                ss);
          ss += __shfl_xor_sync(0xffffffffu, ss, 1);
          ss += __shfl_xor_sync(0xffffffffu, ss, 2);
          rq[half] = rsqrtf(ss + p.qk_norm_eps);
          eo[half] *= rq[half];
        }
      }
      if constexpr (kShort) {
        wg_wait<0>();  // Q S_c and Q Kᵀ_c done: S_c's copy and the stage's Q, K tiles are free
        reg_fence(accO), reg_fence(accP);
        bar_arrive(kBarQ, kThreads);
      } else {
        wg_wait<1>();  // Q S_c done: the state warpgroups may overwrite S_c's copy
        reg_fence(accO);
        bar_arrive(kBarQ, kThreads);
      }
#pragma unroll
      for (int x = 0; x < kBV / 2; ++x) accO[x] *= eo[(x >> 1) & 1];
      if constexpr (!kShort) {
        wg_wait<0>();
        reg_fence(accP);
      }
      uint32_t pa[4][4];
      gate_p<T, kNorm>(accP, pa, gam, L, rq, rk2 + (c & kGm) * kRowsC);
      bar_sync(kBarV, kThreads);  // Vn_c of both state warpgroups written and fenced
      reg_fence(accO);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) mma_rs<T, kBV>(accO, pa[kk], wgl::tile_desc<kRowsC>(vn_all, kk), 1);
      wg_commit();
      wg_wait<0>();
      reg_fence(accO);
      reg_fence_u(pa);
      if (kShort && t0 + BT < sq.eos) bar_arrive(kBarN, kThreads);  // (N): Vn may take Vn_{c+1}
      if (kShort && o16) {
        uint32_t pk[2][kBV / 8];
#pragma unroll
        for (int x = 0; x < kBV / 2; ++x) accO[x] *= scale;
        pack_acc<T, kBV>(accO, pk);
        store_rows_staged<kBV>(p.o, sq, hv, t0, v0, L, pk, ost);
      } else {
        store_o_rows<T, kBV>(p, sq, hv, t0, v0, L, scale, accO);
      }
    }
    if constexpr (kMc) cluster_sync_all();
    return;
  }

  // ------------------------------------------------ state warpgroups (wg < kSW): the recurrence of kN columns
  if constexpr (kOut && kN == 64 && kSW == 2) wg::setmaxnreg_inc<kStateRegs>();
  const int cb = wg * kN;  // first column (inside the block) of this warpgroup
  const uint32_t sb = sb_all + wg * kSbB, vd = vd_all + wg * kVB, vn = vn_all + wg * kVB;
  // fwd_h kShort: v_new staged for 16-byte stores (this warpgroup's slice of the staging tile; the fused pass's
  // output warpgroup stages o there, so there v_new keeps its pair stores).
  unsigned char* vst = stage_tile + wg * kRowsC * (kN + 8) * 2;
  const bool vn16 = !kOut && p.v_new.present() && rows16(p.v_new);

  float S[2][kN / 2];
  load_state<kN>(p, n, hv, v0 + cb, S);

  // Requests chunk [t, t + BT) into stage st (one cp.async group of the kST state threads; an empty one past the
  // sequence, so that the group count stays uniform). Fixed slots: K / W / Q 16 segments a row, 8 kSW rows a pass,
  // 4 (kSW = 2) or 8 passes; U kBV / 8 segments a row. Rows >= Lr are zero-filled (nothing read). r0 + 8 kSW it
  // keeps r0 % 8, so tile_off moves by whole rows of core matrices.
  // kMc: K and Q by the cluster's boxes instead (thread 0: release of the stage's previous chunk, the wait for every
  // CTA's release, this CTA's expected bytes and its box for all).
  auto request = [&](int64_t t, int st) {
    if (t < sq.eos) {
      const int Lr = static_cast<int>(t + BT < sq.eos ? BT : sq.eos - t);
      const uint32_t base = s0 + st * kStageB;
      if constexpr (kMc) {
        if (tid == 0) {
          const int64_t j = (t - sq.bos) / BT;  // chunk index: fill j / kStages of stage st
          const uint32_t eb = cuda::smem_u32(empty + st);
          if (j >= kStages) {  // chunk j − kStages read by this CTA (after (S), (Q)); wait for the whole cluster
#pragma unroll
            for (int r = 0; r < kCS; ++r) mbar_arrive_remote(eb, static_cast<uint32_t>(r));
            cuda::tma::mbar_wait_ptx<false>(eb, static_cast<uint32_t>((j / kStages - 1) & 1));
          }
          const uint32_t fb = cuda::smem_u32(full + st);
          const uint16_t mask = static_cast<uint16_t>((1u << kCS) - 1);
          if (maps.w_shared) {  // 16 / kCS blocks of each of K, W, Q (stage order K, W, Q)
            cuda::mbar_arrive_expect_tx(full + st, 3 * kTileB);
            const int q0 = static_cast<int>(cluster_rank()) * (16 / kCS);
#pragma unroll
            for (int m = 0; m < 3; ++m)
              load_blocks_mc(base + m * kTileB + q0 * (kRowsC * 16), m == 0 ? &maps.k : m == 1 ? &maps.w : &maps.q,
                             static_cast<int>(t), q0, static_cast<int>(m == 1 ? hv : h), static_cast<int>(sq.b), fb,
                             mask);
          } else {
            cuda::mbar_arrive_expect_tx(full + st, 2 * kTileB);
            constexpr int kNb = 32 / kCS;  // 8-column blocks of K | Q per CTA
            const int blk = static_cast<int>(cluster_rank()) * kNb, m = blk / 16, q0 = blk % 16;
            load_blocks_mc(base + (m ? 2 * kTileB : 0) + q0 * (kRowsC * 16), m ? &maps.q : &maps.k,
                           static_cast<int>(t), q0, static_cast<int>(h), static_cast<int>(sq.b), fb, mask);
          }
        }
      }
      {
        const int q = wgl::kwq_seg(tid), r0 = wgl::kwq_row(tid, 0);
        const uint32_t d0 = base + 2u * static_cast<uint32_t>(wgl::tile_off<kKeys>(r0, 8 * q));
        const uint16_t* srcs[3] = {
            static_cast<const uint16_t*>(p.k.data) + (sq.b * p.k.st[0] + t * p.k.st[1] + h * p.k.st[2]) + 8 * q,
            static_cast<const uint16_t*>(p.w.data) + (sq.b * p.w.st[0] + t * p.w.st[1] + hv * p.w.st[2]) + 8 * q,
            kOut ? static_cast<const uint16_t*>(p.q.data) + (sq.b * p.q.st[0] + t * p.q.st[1] + h * p.q.st[2]) + 8 * q
                 : nullptr};
        const int64_t rss[3] = {p.k.st[1], p.w.st[1], kOut ? p.q.st[1] : 0};
#pragma unroll
        for (int m = 0; m < (kOut ? 3 : 2); ++m) {
          if (kMc && (m != 1 || maps.w_shared)) continue;  // K, Q (and a shared W) by the copy engine
#pragma unroll
          for (int it = 0; it < kRowsC / (8 * kSW); ++it) {
            const int r = r0 + 8 * kSW * it;
            const bool ok = r < Lr;
            cp_async16(d0 + m * kTileB + it * (kSW * 8 * kKeys * 2), ok ? srcs[m] + r * rss[m] : srcs[m], ok);
          }
        }
      }
      {
        constexpr int kSegU = kBV / 8, kStepU = kST / kSegU;
        static_assert(kST % kSegU == 0 && kRowsC % kStepU == 0, "whole passes over U");
        const int q = tid % kSegU, r0 = tid / kSegU;
        const uint16_t* src =
            static_cast<const uint16_t*>(p.u.data) + (sq.b * p.u.st[0] + t * p.u.st[1] + hv * p.u.st[2]) + v0 + 8 * q;
        const uint32_t d0 = base + kUOff + 2u * static_cast<uint32_t>(r0 * kLdU + 8 * q);
#pragma unroll
        for (int it = 0; it < kRowsC / kStepU; ++it) {
          const int r = r0 + kStepU * it;
          const bool ok = r < Lr;
          cp_async16(d0 + 2u * static_cast<uint32_t>(kStepU * it * kLdU), ok ? src + r * p.u.st[1] : src, ok);
        }
      }
    }
    cuda::cp_async_commit();
  };
  auto fetch_gamma = [&](int64_t t) {
    const int64_t Lr = t + BT < sq.eos ? BT : sq.eos - t;
    return (tid < Lr && p.g.present()) ? load_f(p.g, sq.b * p.g.st[0] + (t + tid) * p.g.st[1] + hv * p.g.st[2])
                                       : 0.f;
  };

  // (kNorm) r_k of row tid − 64 of the chunk at t (threads 64..127; 0 past the chunk).
  auto fetch_rk = [&](int64_t t) {
    const int64_t Lr = t + BT < sq.eos ? BT : sq.eos - t, i = tid - kRowsC;
    return i < Lr ? static_cast<const float*>(p.rk.data)[sq.b * p.rk.st[0] + (t + i) * p.rk.st[1] + h * p.rk.st[2]]
                  : 0.f;
  };
  const bool rk_thread = kNorm && tid >= kRowsC && tid < 2 * kRowsC;

  request(sq.bos, 0);
  if (kStages == 3) request(sq.bos + BT, 1);
  if (tid < kRowsC) gam2[tid] = sq.bos < sq.eos ? fetch_gamma(sq.bos) : 0.f;
  float g_next = (tid < kRowsC && sq.bos + BT < sq.eos) ? fetch_gamma(sq.bos + BT) : 0.f;
  if (rk_thread) rk2[tid - kRowsC] = sq.bos < sq.eos ? fetch_rk(sq.bos) : 0.f;
  float r_next = (rk_thread && sq.bos + BT < sq.eos) ? fetch_rk(sq.bos + BT) : 0.f;
  // The fused pass with h (kH): h_c = S_c rounded, written with S_c's copy (chunk c, when it exists and, varlen,
  // lies inside h's chunk dimension); -1: none. fwd_h writes h_c at the start of chunk c instead.
  auto h_chunk = [&](int64_t c, int64_t t) -> int64_t {
    const int64_t cidx = sq.chunk0 + c;
    return kH && t < sq.eos && (!p.chunks.varlen() || cidx < p.shape.NT) ? cidx : -1;
  };
  store_state_copy<T, kN>(p, sb, S, sq.b, h_chunk(0, sq.bos), hv, v0 + cb);

  int st = 0;
  int64_t c = 0;
  for (int64_t t0 = sq.bos; t0 < sq.eos; t0 += BT, ++c, st = st + 1 == kStages ? 0 : st + 1) {
    const int L = static_cast<int>(t0 + BT < sq.eos ? BT : sq.eos - t0);
    cuda::cp_async_wait<kStages - 2>();
    if constexpr (kMc) {
      const uint32_t kb = s0 + st * kStageB;
      cuda::tma::mbar_wait_ptx<false>(cuda::smem_u32(full + st), full_parity(c));
      if (L < kRowsC) {  // rows L.. of K, Q (, W) (cb_off<64>: 16-byte row r of block q at q · 1 KB + 16 r) to 0
        const int nrow = kRowsC - L, per = 16 * nrow, tiles = maps.w_shared ? 3 : 2;
        for (int i = tid; i < tiles * per; i += kST) {
          const int m = i / per, rem = i - m * per, q = rem / nrow, r = L + rem - q * nrow;
          const int tile = tiles == 3 ? m : 2 * m;  // K, W, Q or K, Q
          st_shared_zero16(kb + tile * kTileB + q * (kRowsC * 16) + r * 16);
        }
      }
    }
    fence_proxy_async();
    if constexpr (kShort) {
      if constexpr (kOut) bar_arrive(kBarF, kThreads);  // (F): stage c, γ_c, S_c's copy to the output
      bar_sync(kOut ? kBarS : 0, kST);  // (S) stage c, γ_c and S_c's copy visible; chunk c − 1 done
    } else {
      bar_sync(0, kThreads);  // (B) stage st, this chunk's γ and S_c's copy visible; chunk c − 1 done
    }
    const float* gam = gam2 + (c & kGm) * kRowsC;
    const uint32_t kst = s0 + st * kStageB, wst = kst + kTileB;
    const uint16_t* Us = reinterpret_cast<const uint16_t*>(smem + st * kStageB + kUOff);

    // fwd_h: h_c = S_c rounded to bf16 (the pairs store_trans packed into S_c's copy), packed before W S is issued
    // and stored while it runs (stores straight from S would make ptxas wait for W S: S is a wgmma accumulator).
    const int64_t cidx = sq.chunk0 + c;
    const bool h_out = !kOut && p.h.present() && (!p.chunks.varlen() || cidx < p.shape.NT);
    uint32_t hpk[kOut ? 1 : 2][kOut ? 1 : 2][kN / 8];
    if constexpr (!kOut) pack_state<T, kN>(S, hpk);
    // W S_c (alone in this warpgroup's wgmma queue).
    float accW[kN / 2];
    reg_fence(accW);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
      mma_ss<T, kN>(accW, kMc && maps.w_shared ? wgl::cb_desc<kRowsC>(wst, ks) : wgl::tile_desc<kKeys>(wst, ks),
                    wgl::tile_desc<kKeys>(sb, ks), ks > 0);
    wg_commit();
    // While it runs: the next loads (into the stage of chunk c − 1, whose readers all passed (B) / (S) and (Q)), γ of
    // chunk c + 1, and (fwd_h) h_c.
    request(t0 + (kStages - 1) * BT, st == 0 ? kStages - 1 : st - 1);
    if (tid < kRowsC) {
      gam2[((c + 1) & kGm) * kRowsC + tid] = g_next;
      g_next = t0 + 2 * BT < sq.eos ? fetch_gamma(t0 + 2 * BT) : 0.f;
    }
    if (rk_thread) {
      rk2[((c + 1) & kGm) * kRowsC + tid - kRowsC] = r_next;
      r_next = t0 + 2 * BT < sq.eos ? fetch_rk(t0 + 2 * BT) : 0.f;
    }
    __syncwarp();  // the γ branch of warps 0-1: converged before the .aligned instructions
    if constexpr (!kOut)
      if (h_out) store_h_rows<kN>(p, sq.b, cidx, hv, v0 + cb, hpk);
    float glast = 0.f, fd[2];
    uint32_t up[2][kN / 8], kf[2][4][4], vnp[2][kN / 8];
    // kShort: the Kᵀ fragments too below 64 columns a warpgroup (at 64 they spilled 108 bytes in the fused pass);
    // Vn and v_new after the update is issued, except in the 128-column fused pass (v_new's pairs live across the
    // issue spilled 20 bytes at its 184 registers).
    constexpr bool kKtEarly = kShort && kN < 64;
    constexpr bool kVnLate = kShort && !(kOut && kSW == 2 && kN == 64);
    if constexpr (kShort) {  // (2): what does not need W S_c (S *= e^{γ_L} here made ptxas wait for W S: C7517)
      glast = gam[L - 1];
      gate_fd(fd, gam, glast, L);
      if constexpr (kNorm) {  // Vd's rows also by r_k (the raw K is the update's A operand)
        const float* rkc = rk2 + (c & kGm) * kRowsC;
        fd[0] *= rkc[wgl::acc_row(w, lane, 0)], fd[1] *= rkc[wgl::acc_row(w, lane, 2)];
      }
      load_u<kN, kLdU>(up, Us, cb);
      if constexpr (kKtEarly) load_kt<kMc>(kf, kst);
    }
    wg_wait<0>();  // W S done
    reg_fence(accW);
    if constexpr (!kShort) {
      glast = gam[L - 1];
      gate_fd(fd, gam, glast, L);
      load_u<kN, kLdU>(up, Us, cb);
    }
    form_v_new<T, kN>(accW, up, vnp);
    if constexpr (!kVnLate) {
      store_v_new_rows<kN>(p, sq, hv, t0, v0 + cb, L, vnp);
      if constexpr (kOut) {
        if (kShort && c > 0) bar_sync(kBarN, kThreads);  // (N): the output's P Vn_{c−1} has read Vn
        store_trans_pk<kN, kRowsC>(vn, 0, vnp);          // Vn = v_new (T)
      }
    }
#pragma unroll
    for (int x = 0; x < kN / 2; ++x) accW[x] *= fd[(x >> 1) & 1];
    store_trans<T, kN, kRowsC>(vd, 0, accW);  // Vd = v_new e^{γ_L − γ} (T)
    // Kᵀ A fragments of the S update (keys 64 mt + 16 w.., chunk rows 16 kk..), at 128 columns (split form) loaded
    // once v_new is out of the registers (S, v_new and the fragments were not live together: <= 184 registers).
    if constexpr (!kKtEarly) load_kt<kMc>(kf, kst);
    fence_proxy_async();
    bar_wg(1 + wg);  // this warpgroup's Vd visible to its wgmma
    if constexpr (kOut && !kVnLate) bar_arrive(kBarV, kThreads);  // (V): Vn_c to the output warpgroup
    scale_state<kN>(S, gate_exp(glast));
    update_issue<T, kN>(S, kf, vd);  // S_{c+1} = e^{γ_L} S_c + Kᵀ Vd
    if constexpr (kVnLate) {  // (3): Vn and v_new leave while the update runs
      if constexpr (kOut) {
        if (c > 0) bar_sync(kBarN, kThreads);  // (N): the output's P Vn_{c−1} has read Vn
        store_trans_pk<kN, kRowsC>(vn, 0, vnp);  // Vn = v_new (T)
        fence_proxy_async();
        bar_arrive(kBarV, kThreads);  // (V): Vn_c to the output warpgroup
      }
      if (vn16) store_rows_staged<kN>(p.v_new, sq, hv, t0, v0 + cb, L, vnp, vst);
      else store_v_new_rows<kN>(p, sq, hv, t0, v0 + cb, L, vnp);
      __syncwarp();  // the rows' branch converged before wgmma.wait_group (.aligned)
    }
    update_wait<kN>(S, kf);
    if constexpr (kOut) bar_sync(kBarQ, kThreads);  // (Q): the output warpgroup's Q S_c has read the copy
    store_state_copy<T, kN>(p, sb, S, sq.b, h_chunk(c + 1, t0 + BT), hv, v0 + cb);
  }
  cuda::cp_async_wait<0>();  // no copy may land in shared memory after the block exits
  if (p.ht.present()) store_state<kN>(p, n, hv, v0 + cb, S);
  if constexpr (kMc) cluster_sync_all();
#endif
}

// ---------------------------------------------------------------- layout probe (tests)
// One warpgroup runs one of the pass's primitives on fixed tiles so that a test can check it against host
// arithmetic (tests/cpp/test_gdn_fwd_cuda_variants.cpp, WgmmaLayoutProbe): A bf16 [64][128] and B bf16
// [16][128] row-major in global memory are copied into tile_off tiles; D f32 [64][16] row-major.
//   op 0: D = A Bᵀ (mma_ss, the W S / Q S / Q Kᵀ descriptors: tile_desc<128>, 8 K steps)
//   op 1: the same with LBO and SBO exchanged in both descriptors (diagnostic: must differ from op 0's host value)
//   op 2: D[key][v] = Σ_t A[t][key] B[v][t] for keys < 64, t < 64 (the state update: A fragments by
//         ldmatrix.trans from the [t][key] tile, B = [v][t] tile_desc<64>, 4 K steps; B read as [16][64])
//   op 4: op 2 with A registers 1 and 2 exchanged (diagnostic: must differ from op 2's host value)
//   op 3: D (op 0) rounded to bf16, stored transposed by store_trans into a [16][64] tile, read back: D[v][t]
//         written row-major as [16][64] (= op 0's Dᵀ rounded)
__global__ void __launch_bounds__(128, 1) wgmma_probe(int op, const uint16_t* A, const uint16_t* B, float* D) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  using T = __nv_bfloat16;
  __shared__ __align__(128) uint16_t sa[64 * 128];
  __shared__ __align__(128) uint16_t sbt[16 * 128];
  __shared__ __align__(128) uint16_t sx[16 * 64];
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  for (int i = tid; i < 64 * 128; i += 128) sa[wgl::tile_off<128>(i / 128, i % 128)] = A[i];
  if (op == 2 || op == 4) {
    for (int i = tid; i < 16 * 64; i += 128) sbt[wgl::tile_off<64>(i / 64, i % 64)] = B[i];
  } else {
    for (int i = tid; i < 16 * 128; i += 128) sbt[wgl::tile_off<128>(i / 128, i % 128)] = B[i];
  }
  fence_proxy_async();
  __syncthreads();
  const uint32_t a0 = static_cast<uint32_t>(__cvta_generic_to_shared(sa));
  const uint32_t b0 = static_cast<uint32_t>(__cvta_generic_to_shared(sbt));
  const uint32_t x0 = static_cast<uint32_t>(__cvta_generic_to_shared(sx));
  float d[8];
  reg_fence(d);
  if (op == 2 || op == 4) {
    uint32_t kf[1][4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ldmatrix_x4_trans(kf[0][kk], a0 + 2u * static_cast<uint32_t>(wgl::ld_trans_off<128>(lane, 16 * kk, 16 * w)));
      if (op == 4) {  // diagnostic: registers 1 and 2 exchanged
        const uint32_t x = kf[0][kk][1];
        kf[0][kk][1] = kf[0][kk][2], kf[0][kk][2] = x;
      }
    }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_rs<T, 16>(d, kf[0][kk], wgl::tile_desc<64>(b0, kk), kk > 0);
    wg_commit();
    wg_wait<0>();
    reg_fence_u(kf);
  } else {
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      uint64_t da = wgl::tile_desc<128>(a0, ks), db = wgl::tile_desc<128>(b0, ks);
      if (op == 1) {
        da = wgl::make_desc(a0 + ks * 256, 2048, 128), db = wgl::make_desc(b0 + ks * 256, 2048, 128);
      }
      mma_ss<T, 16>(d, da, db, ks > 0);
    }
    wg_commit();
    wg_wait<0>();
  }
  reg_fence(d);
  if (op == 3) {
    store_trans<T, 16, 64>(x0, 0, d);
    __syncthreads();
    for (int i = tid; i < 16 * 64; i += 128) {
      const uint32_t bits = static_cast<uint32_t>(sx[wgl::tile_off<64>(i / 64, i % 64)]) << 16;
      D[i] = __uint_as_float(bits);
    }
    return;
  }
#pragma unroll
  for (int x = 0; x < 8; ++x) D[wgl::acc_row(w, lane, x & 3) * 16 + wgl::acc_col(lane, x >> 2, x & 3)] = d[x];
#endif
}

// ---------------------------------------------------------------- launch
int sm_count_wg(int& sms) {
  int dev = 0;
  sms = 132;
  STRATA_CUDA_TRY(cudaGetDevice(&dev));
  STRATA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return STRATA_SUCCESS;
}

// (kCS > 1) The K and Q maps of the clustered pass: one box = 32 / kCS 8-column blocks of 64 rows (tokens past T
// zero-filled; past a varlen sequence the kernel zeroes them). False where the driver refuses a view.
// w_shared where the clusters are column blocks of one value head (nvt a multiple of cs) and p.pass_cluster_w.
bool pass_maps(const GdnFwdParams& p, int cs, int64_t nvt, PassMaps& m) {
  const int64_t B = p.chunks.varlen() ? 1 : p.shape.B;
  m.w_shared = p.pass_cluster_w && nvt % cs == 0 ? 1 : 0;
  const int blocks = m.w_shared ? 16 / cs : 32 / cs;
  auto enc = [&](CUtensorMap* x, const GdnTensor& v, int64_t heads) {
    return cuda::tma::encode_blocks_map(x, v.data, B, p.shape.T, heads, kKeys, v.st[0], v.st[1], v.st[2], kRowsC,
                                        blocks);
  };
  return enc(&m.k, p.k, p.shape.H) && enc(&m.q, p.q, p.shape.H) && (!m.w_shared || enc(&m.w, p.w, p.shape.HV));
}

// occ (clusters only): instead of launching, *occ = the clusters of this kernel that can be resident at once
// (cudaOccupancyMaxActiveClusters; one CTA per SM, so clusters that do not fit a GPC's free SMs wait for a second wave).
template <int kN, int kSW, bool kOut, bool kShort, bool kH = false, bool kNorm = false, bool kQLoad = false,
          int kCS = 1>
int launch_split(const GdnFwdParams& p, cudaStream_t stream, int* occ = nullptr) {
  constexpr bool kMc = kCS > 1;
  constexpr int kStages = sp_stages<kSW * kN, kOut, kNorm, kMc>();
  constexpr int smem = sp_smem_bytes<kSW * kN, kStages, kOut, kNorm, kMc>();
  static_assert(smem <= kMaxSmem, "sm_90 shared memory per block");
  const int64_t nvt = p.shape.V / (kSW * kN), blocks = p.shape.N * p.shape.HV * nvt;
  const char* name = kOut ? "chunk_gated_delta_rule_fwd (state_split_wgmma)"
                          : "chunk_gated_delta_rule_fwd_h (state_split_wgmma)";
  if (blocks <= 0) return STRATA_SUCCESS;
  if (blocks > 0x7fffffffLL)
    return fail(STRATA_ERROR_UNSUPPORTED, "{}: {} blocks exceed the CUDA grid limit", name, blocks);
  auto kernel = state_split_wgmma<__nv_bfloat16, kN, kSW, kStages, kOut, kShort, kH, kNorm, kQLoad, kCS>;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  PassMaps maps{};
  if constexpr (kMc) {
    if ((p.shape.G * nvt) % kCS != 0)
      return fail(STRATA_ERROR_UNSUPPORTED, "{}: clusters of {} CTAs need G x column blocks ({} x {}) a multiple", name,
                  kCS, p.shape.G, nvt);
    if (!pass_maps(p, kCS, nvt, maps))
      return fail(STRATA_ERROR_UNSUPPORTED, "{}: the driver refused the K / Q tensor maps of the clustered pass", name);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
    cfg.blockDim = dim3(sp_threads(kSW, kOut), 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCS, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (occ) {
      STRATA_CUDA_TRY(cudaOccupancyMaxActiveClusters(occ, kernel, &cfg));
      return STRATA_SUCCESS;
    }
    STRATA_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, p, nvt, maps));
    return cuda::check_launch(name);
  }
  kernel<<<static_cast<unsigned>(blocks), sp_threads(kSW, kOut), smem, stream>>>(p, nvt, maps);
  return cuda::check_launch(name);
}

// (Session 16) The clustered instantiations, pairs of CTAs only: plain at 32 / 64 / 128 columns, the folded l2norm
// with r_q formed (kNorm: the 128-column default) at 128, with r_q read (kNormR: the 32-column default) at 32. GPU run
// s17run1 (H200, 2026-12-01, bf16 H = 16 HV = 32 K = V = 128, pass alone, median of 9 interleaved): B = 4 T = 8192,
// 128 columns: no cluster 0.579 / cluster 2 0.533 ms (plain), 0.632 / 0.531 (r_q formed); B = 1 T = 32768, 32
// columns, r_q read: no cluster 1.452, cluster 2 K, Q, W 1.380, K, Q only 1.567, cluster 4 K, Q, W 2.922 ms, cluster 8
// 4.013 ms (4 and 8: 30 of 32 / 15 of 16 clusters resident, so a second wave; the same for plain). Sizes 4 and 8
// lost everywhere they ran and were removed.
// (Session 18) With h (kH: the saved forward's pass) at 32 and 128 columns, the widths fwd_cuda_state_o_wgmma_width
// picks at the bench shapes (B = 1 T = 32768 / B = 4 T = 8192 on 132 SMs); 64 keeps the unclustered kH pass.
constexpr bool mc_instance(int kn, bool norm, bool qload, int cs, bool h = false) {
  if (cs != 2) return false;
  if (h) return !norm && (kn == 16 || kn == 64);
  if (norm) return qload ? kn == 16 : kn == 64;
  return true;
}
template <int kN, bool kNorm, bool kQLoad, bool kH = false>
int launch_cluster(const GdnFwdParams& p, cudaStream_t stream, int* occ) {
  switch (p.pass_cluster) {
    case 2:
      if constexpr (mc_instance(kN, kNorm, kQLoad, 2, kH))
        return launch_split<kN, 2, true, true, kH, kNorm, kQLoad, 2>(p, stream, occ);
      break;
    default: break;
  }
  return fail(STRATA_ERROR_UNSUPPORTED, "state_split_wgmma: no {}-CTA cluster form at {} columns{}", p.pass_cluster,
              2 * kN, kH ? " writing h" : kNorm ? (kQLoad ? " with r_q read" : " with the folded l2norm") : "");
}
// The clustered pass at `width` columns (p.pass_cluster > 1; occ: launch_split's occupancy query instead).
int launch_cluster_width(const GdnFwdParams& p, int width, cudaStream_t stream, int* occ = nullptr) {
  const bool norm = p.qk_norm, qload = p.rq.present();
  if (p.h.present()) {  // (session 18) the pass writing h (no folded l2norm: fwd_cuda_state_o_wgmma_reject)
    switch (width) {
      case 32: return launch_cluster<16, false, false, true>(p, stream, occ);
      case 64: return launch_cluster<32, false, false, true>(p, stream, occ);
      case 128: return launch_cluster<64, false, false, true>(p, stream, occ);
      default: return fail(STRATA_ERROR_INTERNAL, "state_split_wgmma: no {}-column block", width);
    }
  }
  switch (width) {
    case 32:
      return norm ? (qload ? launch_cluster<16, true, true>(p, stream, occ) : launch_cluster<16, true, false>(p, stream, occ))
                  : launch_cluster<16, false, false>(p, stream, occ);
    case 64:
      return norm ? (qload ? launch_cluster<32, true, true>(p, stream, occ) : launch_cluster<32, true, false>(p, stream, occ))
                  : launch_cluster<32, false, false>(p, stream, occ);
    case 128:
      return norm ? (qload ? launch_cluster<64, true, true>(p, stream, occ) : launch_cluster<64, true, false>(p, stream, occ))
                  : launch_cluster<64, false, false>(p, stream, occ);
    default: return fail(STRATA_ERROR_INTERNAL, "state_split_wgmma: no {}-column block", width);
  }
}

// A block of kBV columns: two state warpgroups of kBV / 2 columns, or (kShortOneWg, kBV <= 64) one of kBV.
template <int kBV, bool kOut>
int launch_form(const GdnFwdParams& p, WgmmaPass form, cudaStream_t stream) {
  if (form == WgmmaPass::kSplit) return launch_split<kBV / 2, 2, kOut, false>(p, stream);
  if constexpr (kBV <= 64)
    if (form == WgmmaPass::kShortOneWg) return launch_split<kBV, 1, kOut, true>(p, stream);
  return launch_split<kBV / 2, 2, kOut, true>(p, stream);  // kShort
}

// WgmmaPass::kAuto: the form measured fastest at this width. s11run2 (H200, bf16 H = 16 HV = 32 K = V = 128, pass
// alone, median of 7): fused B = 4 (128 columns) split 0.602 / kShort 0.581 ms, B = 1 (32 columns) split 1.514 /
// kShort 1.463 / one state warpgroup 1.520 ms; fwd_h B = 4 split 0.714 / kShort 0.643 ms, B = 1 (32 columns) split
// 1.389 / kShort 1.329 / one state warpgroup 1.271 ms.
WgmmaPass auto_form(int width, bool out) {
  return !out && width == 32 ? WgmmaPass::kShortOneWg : WgmmaPass::kShort;
}

template <bool kOut>
int launch_split_width(const GdnFwdParams& p, int width, WgmmaPass form, cudaStream_t stream) {
  if (form == WgmmaPass::kAuto) form = auto_form(width, kOut);
  if (kOut && p.pass_cluster > 1) {  // (session 16) K, Q shared by a cluster: kShort, two state warpgroups (h: s18)
    if (form != WgmmaPass::kShort)
      return fail(STRATA_ERROR_UNSUPPORTED, "state_split_wgmma: clusters in the kShort form only");
    return launch_cluster_width(p, width, stream);
  }
  if (kOut && p.qk_norm) {  // (session 13) the folded l2norm: kShort, two state warpgroups, no h
    if (form != WgmmaPass::kShort || p.h.present())
      return fail(STRATA_ERROR_UNSUPPORTED, "state_split_wgmma: the folded l2norm in the kShort form without h only");
    if (p.rq.present()) {  // (session 14) r_q read from p.rq
      switch (width) {
        case 32: return launch_split<16, 2, true, true, false, true, true>(p, stream);
        case 64: return launch_split<32, 2, true, true, false, true, true>(p, stream);
        case 128: return launch_split<64, 2, true, true, false, true, true>(p, stream);
        default: return fail(STRATA_ERROR_INTERNAL, "state_split_wgmma: no {}-column block", width);
      }
    }
    switch (width) {
      case 32: return launch_split<16, 2, true, true, false, true>(p, stream);
      case 64: return launch_split<32, 2, true, true, false, true>(p, stream);
      case 128: return launch_split<64, 2, true, true, false, true>(p, stream);
      default: return fail(STRATA_ERROR_INTERNAL, "state_split_wgmma: no {}-column block", width);
    }
  }
  if (kOut && p.h.present()) {  // the fused pass writing h: kShort, two state warpgroups (auto_form's fused choice)
    if (form != WgmmaPass::kShort)
      return fail(STRATA_ERROR_UNSUPPORTED, "state_split_wgmma: h from the fused pass in its kShort form only");
    switch (width) {
      case 32: return launch_split<16, 2, true, true, true>(p, stream);
      case 64: return launch_split<32, 2, true, true, true>(p, stream);
      case 128: return launch_split<64, 2, true, true, true>(p, stream);
      default: return fail(STRATA_ERROR_INTERNAL, "state_split_wgmma: no {}-column block", width);
    }
  }
  switch (width) {
    case 32: return launch_form<32, kOut>(p, form, stream);
    case 64: return launch_form<64, kOut>(p, form, stream);
    case 128: return launch_form<128, kOut>(p, form, stream);
    default: return fail(STRATA_ERROR_INTERNAL, "state_split_wgmma: no {}-column block", width);
  }
}

// The block width of the wgmma passes (0 = fwd_cuda_state_o_wgmma_width) once V is known to be a multiple of 32.
int resolve_width(const GdnFwdParams& p, int& width, const char* name) {
  int sms = 132;
  if (const int r = sm_count_wg(sms); r != STRATA_SUCCESS) return r;
  if (width == 0) width = fwd_cuda_state_o_wgmma_width(p, sms);
  if (p.shape.V % width != 0)
    return fail(STRATA_ERROR_UNSUPPORTED, "{}: V = {} is not a multiple of the {}-column block", name, p.shape.V,
                width);
  return STRATA_SUCCESS;
}

}  // namespace

int fwd_cuda_state_o_wgmma_width(const GdnFwdParams& p, int sms) {
  // The narrowest width whose blocks fit in one wave (less work on each block's sequential chain), else the
  // widest (fewest waves; the K / W / Q tiles are loaded once per width). B = 4 T = 8192 HV = 32 V = 128: 128
  // columns, 128 blocks; B = 1 T = 32768: 32 columns, 128 blocks.
  const int64_t nh = p.shape.N * p.shape.HV;
  int widest = 0;
  for (const int bv : {32, 64, 128}) {
    if (p.shape.V % bv != 0) continue;
    if (nh * (p.shape.V / bv) <= sms) return bv;
    widest = bv;
  }
  return widest;
}

int fwd_cuda_state_o_wgmma_cluster(const GdnFwdParams& p, int width) {
  if ((width != 32 && width != 64 && width != 128) || p.shape.V % width != 0) return 0;
  const int64_t ctas = p.shape.G * (p.shape.V / width);  // CTAs of one q/k head
  return ctas % 2 == 0 && mc_instance(width / 2, p.qk_norm, p.rq.present(), 2, p.h.present()) ? 2 : 0;
}

int fwd_cuda_state_o_wgmma_cluster_occupancy(const GdnFwdParams& p, int width, int* clusters) {
  *clusters = 0;
  if (p.pass_cluster < 2) return fail(STRATA_ERROR_INVALID_VALUE, "state_split_wgmma: pass_cluster < 2");
  if (const int r = resolve_width(p, width, "state_split_wgmma (occupancy)"); r != STRATA_SUCCESS) return r;
  return launch_cluster_width(p, width, nullptr, clusters);
}

int fwd_cuda_wgmma_layout_probe(int op, const void* A, const void* B, float* D, void* stream) {
  if (op < 0 || op > 4) return fail(STRATA_ERROR_INVALID_VALUE, "wgmma_probe: op {} not in [0, 4]", op);
  wgmma_probe<<<1, 128, 0, static_cast<cudaStream_t>(stream)>>>(op, static_cast<const uint16_t*>(A),
                                                                 static_cast<const uint16_t*>(B), D);
  return cuda::check_launch("wgmma_probe");
}

bool fwd_cuda_state_o_wgmma_pays(const GdnFwdParams& p) {
  // Where the wgmma pass applies, its split form (the automatic fused forward runs WgmmaPass::kSplit, P inline).
  // GPU runs s9run1 / s9run2 (H200, bf16, H = 16, HV = 32, K = V = 128; pass alone): B = 4 T = 8192 (128 columns)
  // 0.604 / 0.610 ms against 0.718 ms for the serial wgmma pass and 0.780 ms for the 16-warp mma.sync pass; B = 1
  // T = 32768 (32 columns) 1.536 / 1.535 ms against 1.469 / 1.477 ms for the 8-warp mma.sync pass, which also needs
  // qk_gate_mma's pre-computed P (0.177 ms): 1.65 ms. Whole forward through Python (gdn_peers, s9run2): B = 1 2.323 ms
  // with the split pass forced against 2.533 ms for the automatic choice of then (mma.sync, P pre-computed).
  return fwd_cuda_state_o_wgmma_reject(p).empty();
}

std::string fwd_cuda_state_o_wgmma_reject(const GdnFwdParams& p) {
  if (p.k.dtype != STRATA_DTYPE_BF16) return "the wgmma pass takes bf16 token tensors";
  for (const GdnTensor* t : {&p.q, &p.w, &p.u})
    if (t->dtype != STRATA_DTYPE_BF16) return "the wgmma pass needs q, k, w, u in bf16";
  if (!p.o.present()) return "the wgmma pass writes o";
  for (const GdnTensor* t : {&p.o, &p.v_new})
    if (t->present() && t->dtype != STRATA_DTYPE_BF16) return "the wgmma pass needs o (and v_new) in bf16";
  if (p.h.present() && p.h.dtype != STRATA_DTYPE_BF16) return "the wgmma pass needs h in bf16";
  if (p.shape.K != kKeys) return fmt::format("the wgmma pass needs K = {} (got {})", kKeys, p.shape.K);
  if (p.shape.V % 32 != 0) return fmt::format("the wgmma pass needs V a multiple of 32 (got {})", p.shape.V);
  if (p.shape.BT != kRowsC) return fmt::format("the wgmma pass needs chunk size {} (got {})", kRowsC, p.shape.BT);
  if (p.qk_norm) {
    if (!p.rk.present() || p.rk.dtype != STRATA_DTYPE_F32) return "the folded l2norm (qk_norm) reads rk in f32";
    if (!(p.qk_norm_eps > 0.f)) return "the folded l2norm (qk_norm) needs eps > 0";
    if (p.h.present() || p.Pqk.present()) return "the folded l2norm (qk_norm) writes neither h nor reads Pqk";
  }
  if (p.rq.present() && !p.qk_norm) return "rq (1 / |q| of the raw q) goes with qk_norm only";
  if (p.rq.present() && p.rq.dtype != STRATA_DTYPE_F32) return "the folded l2norm reads rq in f32";
  return {};
}

bool fwd_cuda_state_o_wgmma_lean(const GdnFwdParams& p) {
  using T = __nv_bfloat16;
  return lean16<T>(p.k) && lean16<T>(p.w) && lean16<T>(p.q) && lean16<T>(p.u) && pair16<T>(p.o) &&
         (!p.v_new.present() || pair16<T>(p.v_new)) && (!p.h.present() || h_pairs(p.h));
}

int fwd_cuda_state_o_wgmma(const GdnFwdParams& p, int width, WgmmaPass form, void* stream_ptr) {
  const std::string why = fwd_cuda_state_o_wgmma_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_fwd (wgmma pass): {}", why);
  // Run-time layout: 16-byte tile copies and 32-bit pair stores; other views take state_o_mma.
  if (!fwd_cuda_state_o_wgmma_lean(p)) {
    if (p.qk_norm)  // state_o_mma reads normalised q, k
      return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_fwd (wgmma pass): qk_norm needs lean token tensors");
    if (p.h.present())  // state_o_mma does not write h
      return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_fwd (wgmma pass): h needs lean token tensors");
    return fwd_cuda_state_o(p, StateOKernel::kInline, fwd_cuda_state_o_auto_block(p), stream_ptr);
  }
  if (const int r = resolve_width(p, width, "chunk_gated_delta_rule_fwd (wgmma pass)"); r != STRATA_SUCCESS) return r;
  return launch_split_width<true>(p, width, form, static_cast<cudaStream_t>(stream_ptr));
}

std::string fwd_cuda_fwd_h_wgmma_reject(const GdnFwdParams& p) {
  for (const GdnTensor* t : {&p.k, &p.w, &p.u})
    if (t->dtype != STRATA_DTYPE_BF16) return "the wgmma pass needs k, w, u in bf16";
  if (!p.h.present()) return "the wgmma fwd_h pass writes h";
  for (const GdnTensor* t : {&p.h, &p.v_new})
    if (t->present() && t->dtype != STRATA_DTYPE_BF16) return "the wgmma pass needs h (and v_new) in bf16";
  if (p.shape.K != kKeys) return fmt::format("the wgmma pass needs K = {} (got {})", kKeys, p.shape.K);
  if (p.shape.V % 32 != 0) return fmt::format("the wgmma pass needs V a multiple of 32 (got {})", p.shape.V);
  if (p.shape.BT != kRowsC) return fmt::format("the wgmma pass needs chunk size {} (got {})", kRowsC, p.shape.BT);
  return {};
}

int fwd_cuda_fwd_h_wgmma(const GdnFwdParams& p, int width, void* stream_ptr) {
  return fwd_cuda_fwd_h_wgmma(p, width, WgmmaPass::kAuto, stream_ptr);
}

int fwd_cuda_fwd_h_wgmma(const GdnFwdParams& p, int width, WgmmaPass form, void* stream_ptr) {
  const std::string why = fwd_cuda_fwd_h_wgmma_reject(p);
  if (!why.empty())
    return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_fwd_h (state_split_wgmma): {}", why);
  using T = __nv_bfloat16;
  const bool lean = lean16<T>(p.k) && lean16<T>(p.w) && lean16<T>(p.u) && h_pairs(p.h) &&
                    (!p.v_new.present() || pair16<T>(p.v_new));
  if (!lean) return fwd_cuda_mma(FwdOp::kFwdH, p, stream_ptr);
  if (const int r = resolve_width(p, width, "chunk_gated_delta_rule_fwd_h (state_split_wgmma)"); r != STRATA_SUCCESS)
    return r;
  return launch_split_width<false>(p, width, form, static_cast<cudaStream_t>(stream_ptr));
}

}  // namespace strata::linear_attn::gdn
