// Hopper warpgroup-MMA (wgmma.mma_async m64nNk16, f32 accumulation, sm_90a) kernel of
// chunk_gated_delta_rule_bwd_dhu for bf16 token tensors with K = 128, V a multiple of 32 and chunk size 64: the
// variant kDhuWgmma of the tensor-core implementation (DhuParams::mma_variant). The same math and precision
// model as dhu_mma_kernel (cuda_sm90_mma.cu: dS rounded to bf16 for K dS, E dO and dVn rounded to bf16 before
// their products, dv_local's Bm rounded to bf16, f32 accumulation); only the f32 summation order inside the
// products differs (not the same bits as the mma.sync kernel; compared within a tolerance by
// GdnBwdCudaVariants.DhuWgmma and against float64 by the conformance sweep once it is the automatic choice).
//
// Block: 2 warpgroups (256 threads) per (sequence n, value head hv, 2 kN columns of V); warpgroup g owns the kN
// columns v0 + g kN.. of dS [128, kN] (two m64 x kN f32 accumulators, keys 0..63 and 64..127) and runs the whole
// recurrence of those columns alone: the two warpgroups share only the chunk's stage (one block barrier per chunk)
// and otherwise meet at warpgroup named barriers. Per chunk c (from the last; L valid rows, zero-filled to 64) and
// warpgroup, with the critical path (the products dS depends on) issued first:
//   group P (fused dv_local): P = K Qᵀ (A = the K tile, B = the Q tile, N = 64, 8 K steps);
//   group A: D = K dS (A = the K tile, B = the bf16 copy of dS stored transposed, 8 K steps);
//   meanwhile dh[c] = dS from the registers, and the chunk's dO (this warpgroup's columns) transposed by stmatrix
//   into K-major tiles: dOᵀ (fused: the B operand of Bm dO) and (scale e^γ ⊙ dO)ᵀ rounded to bf16;
//   fused: Bm = bf16(Upper(scale P ⊙ e^{γ_i − γ_j}), i < L) in registers, group V: dv = Bm dO (A from registers);
//   group U1: dS = e^{γ_last} dS + Qᵀ (scale E dO) (A = Qᵀ by ldmatrix.trans from the Q tile, 2 x 4 steps): not on
//   the recurrence's path (it only has to finish before U2);
//   dVn = bf16(dv) + e^{γ_last − γ} ⊙ D (rows < L) → dv2 and −bf16(dVn) stored transposed (stmatrix.trans);
//   group U2: dS += Wᵀ (−dVn) (A = Wᵀ by ldmatrix.trans from the W tile); then the bf16 copy of the new dS.
// Unfused (the public op): dv is read from the dv tensor into registers instead (no P, V groups).
// Chunk c − 1's K, Q, W, dO tiles load by cp.async into the other of two stages while chunk c computes; γ one
// chunk further ahead through a register. No atomics, fixed order: bitwise reproducible.
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"
#include "tile/cuda/check.cuh"
#include "tile/cuda/cp_async.cuh"
#include "tile/cuda/fast_math.cuh"
#include "tile/cuda/mma.cuh"
#include "tile/cuda/tma_tile.cuh"
#include "tile/cuda/wgmma.cuh"
#include "tile/cuda/wgmma_layout.h"

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
namespace wg = ::strata::cuda::wgmma;
using T = __nv_bfloat16;

constexpr int kThr = 256;   // 2 warpgroups
constexpr int kRows = 64;   // rows of a chunk tile (BT)
constexpr int kKeys = 128;  // K

// e^x for the gate exponentials (x <= 0 wherever the value is used): one FMUL and one MUFU.EX2.
__device__ __forceinline__ float gate_exp(float x) { return ::strata::cuda::ex2_ftz(x * 1.4426950408889634f); }


// Writes an m64 x kN operand held as bf16 pairs in accumulator layout (u[2 j + h] = the pair of 8-column block j,
// row half h: accumulator elements 4 j + 2 h, 4 j + 2 h + 1) transposed into the K-major tile X [kN][kRowsLd] at
// shared byte address x (X's row = the column, X's column = row0 + the row), by kN / 16 stmatrix.x4.trans.
template <int kN, int kRowsLd>
__device__ __forceinline__ void store_pairs_trans(uint32_t x, int row0, const uint32_t (&u)[kN / 4]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int jp = 0; jp < kN / 16; ++jp)
    wg::stmatrix_x4_trans(x + 2u * static_cast<uint32_t>(wg::st_trans_off<kRowsLd>(lane, row0 + 16 * w, jp)),
                          u[4 * jp], u[4 * jp + 1], u[4 * jp + 2], u[4 * jp + 3]);
}
// The same for f32 accumulators (rounded to bf16), each pair multiplied by f[h] (the row factor of row half h).
template <int kN, int kRowsLd>
__device__ __forceinline__ void store_acc_trans(uint32_t x, int row0, const float (&d)[kN / 2], float f0 = 1.f,
                                                float f1 = 1.f) {
  uint32_t u[kN / 4];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    u[2 * j] = ::strata::cuda::mma::pack2<T>(f0 * d[4 * j], f0 * d[4 * j + 1]);
    u[2 * j + 1] = ::strata::cuda::mma::pack2<T>(f1 * d[4 * j + 2], f1 * d[4 * j + 3]);
  }
  store_pairs_trans<kN, kRowsLd>(x, row0, u);
}

// Shared memory: two stages of {K, Q, W [64][128] tiles, dO [64][2 kN]}, then per warpgroup its dS copy [kN][128],
// dOᵀ, (scale E dO)ᵀ and −dVnᵀ [kN][64] (core-matrix tiles) and a ring of two chunks' γ [64] f32 (slot c & 1), then
// (kBmTile) the gated Bm both warpgroups read, then (kTma) the stages' mbarriers. cp.async: K, Q, W tile_off tiles,
// dO row-major with a pitch of 2 kN + 8 (conflict-free 32-bit pair reads); kTma: the copy engine's cb_off<64> tiles
// (tma_tile.cuh) for all four.
template <int kN, bool kTma, bool kBmTile = false>
struct WgSmem {
  static constexpr int kLdO = kTma ? 2 * kN : 2 * kN + 8;
  static constexpr int kTile = kRows * kKeys * 2;
  static constexpr int kK = 0, kQ = kTile, kW = 2 * kTile, kO = 3 * kTile;
  static constexpr int kStage = kO + kRows * kLdO * 2;  // (kTma: the bytes of a chunk's boxes)
  static constexpr int kSb = kN * kKeys * 2, kSmall = kN * kRows * 2;
  static constexpr int kGam = kSb + 3 * kSmall;       // per warpgroup: sb, dOᵀ, (sE dO)ᵀ, −dVnᵀ, γ ring
  static constexpr int kWgB = kGam + 2 * kRows * 4;
  static constexpr int kBm = 2 * kStage + 2 * kWgB;  // (kBmTile: the block's Bm [64][64] bf16, tile_off<64>)
  static constexpr int kBytes = kBm + (kBmTile ? kRows * kRows * 2 : 0) + (kTma ? 128 : 0);
  static_assert(kStage % 128 == 0 && kWgB % 128 == 0, "128-byte aligned regions");
  // Element offset of dO (row r, column c) in a stage's dO tile.
  __device__ static constexpr int o_off(int r, int c) { return kTma ? wg::cb_off<kRows>(r, c) : r * kLdO + c; }
};


// The row factors of chunk c for this thread's two accumulator rows (acc_row(w, lane, 2 hh)): γ_i, e^{γ_last − γ_i}
// and scale e^{γ_i} (both 0 at i >= L: rows past the sequence then add nothing to dVn or Qᵀ (sE dO)).
struct RowF {
  float gi[2], dec[2], es[2], glast;
  int L;
};
// Valid rows of chunk c of the sequence [bos, eos) (64 but in its last chunk).
__device__ __forceinline__ int chunk_rows(int64_t bos, int64_t eos, int64_t c) {
  const int64_t left = eos - bos - c * kRows;
  return static_cast<int>(left < kRows ? left : kRows);
}
// γ of row `row` of chunk c of the sequence [bos, eos) in batch row b, value head hv: 0 for row >= 64, past the
// sequence, for c < 0 (no such chunk) or without g.
__device__ __forceinline__ float fetch_gamma_row(const DhuParams& p, int64_t b, int64_t hv, int64_t bos, int64_t eos,
                                                 int64_t c, int row) {
  const int64_t t = bos + c * kRows + row;
  return (row < kRows && c >= 0 && t < eos && p.g.present()) ? ld_f32(p.g, p.g.off(b, t, hv)) : 0.f;
}
// This thread's RowF of a chunk of L rows whose γ (64 floats, 0 past L) is at gam.
__device__ __forceinline__ RowF row_factors_of(const float* gam, int L, float scale) {
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  RowF r;
  r.L = L;
  r.glast = gam[L - 1];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = wg::acc_row(w, lane, 2 * hh);
    r.gi[hh] = gam[i];
    r.dec[hh] = i < L ? gate_exp(r.glast - r.gi[hh]) : 0.f;
    r.es[hh] = i < L ? scale * gate_exp(r.gi[hh]) : 0.f;
  }
  return r;
}
// This thread's pairs of a [64][·] bf16 tile at sO (element offset off(row, column)), columns col0.. of kNc, in
// accumulator layout (raw[2 j + hh]: 8-column block j, row half hh).
template <int kNc, class Off>
__device__ __forceinline__ void load_tile_pairs(const uint16_t* sO, int col0, Off off, uint32_t (&raw)[kNc / 4]) {
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kNc / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      raw[2 * j + hh] =
          *reinterpret_cast<const uint32_t*>(sO + off(wg::acc_row(w, lane, 2 * hh), col0 + wg::acc_col(lane, j, 0)));
}
// (scale E dO) of such pairs rounded to bf16 (each row half hh times r.es[hh]).
template <int kNc>
__device__ __forceinline__ void scale_pairs(const uint32_t (&raw)[kNc / 4], const RowF& r, uint32_t (&u)[kNc / 4]) {
  namespace mm = ::strata::cuda::mma;
#pragma unroll
  for (int j = 0; j < kNc / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float2 f = mm::unpack2<T>(raw[2 * j + hh]);
      u[2 * j + hh] = mm::pack2<T>(f.x * r.es[hh], f.y * r.es[hh]);
    }
}
// Group A: accD = K dS (m64 x kN, 8 K steps; A = the K tile at ktile (kCb: cb_off<64> layout, else tile_off<128>),
// B = the bf16 copy of dS [kN][128] at sb).
template <int kN, bool kCb>
__device__ __forceinline__ void issue_kds(float (&accD)[kN / 2], uint32_t ktile, uint32_t sb) {
  wg::reg_fence(accD);
  wg::wg_fence();
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) {
    if constexpr (kCb) wg::mma_ss<T, kN>(accD, wg::cb_desc<kRows>(ktile, ks), wg::tile_desc<kKeys>(sb, ks), ks > 0);
    else wg::mma_ss<T, kN>(accD, wg::tile_desc<kKeys>(ktile, ks), wg::tile_desc<kKeys>(sb, ks), ks > 0);
  }
  wg::wg_commit();
}
// Groups U1 / U2: dS += Xᵀ Y (keys 64 mt.., A = the Xᵀ fragments f (load_trans), B = Yᵀ [kN][64] at bt).
template <int kN>
__device__ __forceinline__ void issue_update(float (&dS)[2][kN / 2], uint32_t (&f)[2][4][4], uint32_t bt) {
  wg::wg_fence();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wg::mma_rs<T, kN>(dS[mt], f[mt][kk], wg::tile_desc<kRows>(bt, kk), 1);
  wg::wg_commit();
}
// dVn = dv + dec ⊙ accD (row half hh: row factor dec[hh]; rows >= L: 0) from the bf16 pairs dvw of dv, as bf16 pairs
// pos (dv2) and neg (−dVn, U2's operand), accumulator layout.
template <int kN>
__device__ __forceinline__ void dvn_pairs(const uint32_t (&dvw)[kN / 4], const float (&dec)[2], const float (&accD)[kN / 2],
                                          int L, uint32_t (&pos)[kN / 4], uint32_t (&neg)[kN / 4]) {
  namespace mm = ::strata::cuda::mma;
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const bool live = wg::acc_row(w, lane, 2 * hh) < L;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const int e = 4 * j + 2 * hh;
      const float2 dv = mm::unpack2<T>(dvw[2 * j + hh]);
      const float x0 = live ? dv.x + dec[hh] * accD[e] : 0.f, x1 = live ? dv.y + dec[hh] * accD[e + 1] : 0.f;
      pos[2 * j + hh] = mm::pack2<T>(x0, x1);
      neg[2 * j + hh] = mm::pack2<T>(-x0, -x1);
    }
  }
}

// scale P ⊙ e^{γ_i − γ_j} of accumulator element x (value pij) of P's columns i0.. (0 where i < j or i >= L; gam:
// the chunk's γ). The accumulator is only read here: a wgmma accumulator carried across the loop (kAhead) that other
// instructions also write makes ptxas serialise every wgmma (C7511).
__device__ __forceinline__ float gated_p(float pij, int x, int i0, const RowF& r, const float* gam, float scale) {
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int j = wg::acc_row(w, lane, x & 3), i = i0 + wg::acc_col(lane, x >> 2, x & 3);
  return (i >= j && i < r.L) ? scale * pij * gate_exp(gam[i] - r.gi[(x >> 1) & 1]) : 0.f;
}

// Fused dv_local, once P (m64n64, accP) is done: Bm = bf16(Upper(scale P ⊙ e^{γ_i − γ_j}), i < L) into the A
// fragments pa, then group V: accV = Bm dO (m64 x kNV, B = dOᵀ [kNV][64] at dot).
template <int kNV>
__device__ __forceinline__ void gate_issue_V(float (&accP)[32], const RowF& r, const float* gam, float scale,
                                             uint32_t dot, uint32_t (&pa)[4][4], float (&accV)[kNV / 2]) {
  wg::reg_fence(accP);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q)  // rows g / g + 8 (q & 1), K columns 16 kk + 2 (l % 4) (+ 8 for q >= 2)
      pa[kk][q] = ::strata::cuda::mma::pack2<T>(gated_p(accP[8 * kk + 2 * q], 8 * kk + 2 * q, 0, r, gam, scale),
                                                gated_p(accP[8 * kk + 2 * q + 1], 8 * kk + 2 * q + 1, 0, r, gam, scale));
  wg::reg_fence(accV);
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg::mma_rs<T, kNV>(accV, pa[kk], wg::tile_desc<kRows>(dot, kk), kk > 0);
  wg::wg_commit();
}

// Staged stores (kHalfP, the split form): an accumulator-layout m64 x kN block of bf16 pairs (u[2 j + hh]: block j,
// row half hh) written by stmatrix into this warp's 16 rows (16 w..) of a row-major [64][kN] bf16 staging area at
// shared byte address buf (the 16-byte chunk index XOR row % (kN / 8): conflict-free), then read back as 16-byte row
// chunks and stored by `put(row, chunk, value)`: whole 32-byte sectors instead of 4-byte pairs (GPU run s11run1:
// L2 84 % busy with the pair stores). Only this warp's rows: __syncwarp, no warpgroup barrier. (smem, s0: the
// block's shared memory and its shared address.)
template <int kN, class Put>
__device__ __forceinline__ void stage_rows(const unsigned char* smem, uint32_t s0, uint32_t buf,
                                           const uint32_t (&u)[kN / 4], Put&& put) {
  constexpr int kChunks = kN / 8;
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  auto chunk_addr = [&](int row, int chunk) {
    return static_cast<uint32_t>(row * kN * 2 + 16 * (chunk ^ (row & (kChunks - 1))));
  };
#pragma unroll
  for (int jp = 0; jp < kN / 16; ++jp) {
    const int m = lane >> 3, row = 16 * w + 8 * (m & 1) + (lane & 7);  // matrix m: block 2 jp + m / 2, half m % 2
    wg::stmatrix_x4(buf + chunk_addr(row, 2 * jp + (m >> 1)), u[4 * jp], u[4 * jp + 1], u[4 * jp + 2], u[4 * jp + 3]);
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kN / 16; ++k) {
    const int idx = lane + 32 * k, row = 16 * w + idx / kChunks, chunk = idx % kChunks;
    put(row, chunk, *reinterpret_cast<const uint4*>(smem + (buf - s0) + chunk_addr(row, chunk)));
  }
  __syncwarp();
}

// This warpgroup's dS (keys 64 mt + acc_row(w, lane, x & 3), columns col0 + acc_col(lane, x >> 2, x & 3) at
// dS[mt][x]) from dht (0 without), and to dh0 (where requested).
template <int kN>
__device__ __forceinline__ void load_dht(const DhuParams& p, int64_t n, int64_t hv, int64_t col0, float (&dS)[2][kN / 2]) {
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int x = 0; x < kN / 2; ++x) {
      const int64_t key = 64 * mt + wg::acc_row(w, lane, x & 3), col = col0 + wg::acc_col(lane, x >> 2, x & 3);
      dS[mt][x] = p.dht.present() ? ld_f32(p.dht, p.dht.off(n, hv, key) + col) : 0.f;
    }
}
template <int kN>
__device__ __forceinline__ void store_dh0(const DhuParams& p, int64_t n, int64_t hv, int64_t col0,
                                          const float (&dS)[2][kN / 2]) {
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  if (p.dh0.present())
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int x = 0; x < kN / 2; ++x)
        st_f32(p.dh0, p.dh0.off(n, hv, 64 * mt + wg::acc_row(w, lane, x & 3)) + col0 + wg::acc_col(lane, x >> 2, x & 3),
               dS[mt][x]);
}
// The bf16 copy of dS, transposed ([kN][128] at sb: the B operand of the next chunk's K dS), proxy-fenced.
template <int kN>
__device__ __forceinline__ void store_copy(uint32_t sb, const float (&dS)[2][kN / 2]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) store_acc_trans<kN, kKeys>(sb, 64 * mt, dS[mt]);
  wg::fence_proxy_async();
}
// The A fragments of Xᵀ (keys 64 mt + 16 w.., chunk rows 16 kk..) from the [t][key] tile X at `base` (kCb: the copy
// engine's cb_off<64> layout, else tile_off<128>).
template <bool kCb>
__device__ __forceinline__ void load_trans(uint32_t base, uint32_t (&f)[2][4][4]) {
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      int off;
      if constexpr (kCb) off = wg::cb_ld_trans_off<kRows>(lane, 16 * kk, 64 * mt + 16 * w);
      else off = wg::ld_trans_off<kKeys>(lane, 16 * kk, 64 * mt + 16 * w);
      wg::ldmatrix_x4_trans(f[mt][kk], base + 2u * static_cast<uint32_t>(off));
    }
}

// dh[hc] of this warpgroup's kN columns = bf16(dS) (keys 64 mt + accumulator rows) by staged 16-byte rows through the
// [64][kN] staging area at buf; dhp: dh's key 0, first column of them; ld: dh's key stride.
template <int kN>
__device__ __forceinline__ void store_state_staged(const unsigned char* smem, uint32_t s0, uint32_t buf,
                                                   const float (&dS)[2][kN / 2], uint16_t* dhp, int64_t ld) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    uint32_t u[kN / 4];
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        u[2 * j + hh] = ::strata::cuda::mma::pack2<T>(dS[mt][4 * j + 2 * hh], dS[mt][4 * j + 2 * hh + 1]);
    stage_rows<kN>(smem, s0, buf, u, [&](int row, int chunk, uint4 v) {
      *reinterpret_cast<uint4*>(dhp + (64 * mt + row) * ld + 8 * chunk) = v;
    });
  }
}

// The tensor maps of the kTma kernels (unused by the cp.async one).
// box5: encoded by encode_blocks_map (one box a tile: K, Q, W all 16 blocks, dO the block's 2 kN / 8), else by
// encode_rows_map (one box per 8 columns).
struct DhuMaps {
  CUtensorMap k, q, w, dout;
  int box5;
};
// The copy engine's boxes of chunk rows t0.. (batch row b): K, Q, W [64][128] (16 boxes of 8 columns each) and
// dO's 2 kN columns v0.. (2 kN / 8 boxes) into the cb_off<64> tiles of the stage at shared byte address `base`
// (K, Q, W, dO at 0, 16, 32, 48 KB), completing on the mbarrier at `bar`; this thread issues boxes i0, i0 + step, ..
// Rows past the sequence arrive as they are (past T: zeros); the kernels select them away.
template <int kN>
__device__ __forceinline__ void chunk_boxes(const DhuMaps& maps, uint32_t base, uint32_t bar, int i0, int step, int v0,
                                            int h, int hv, int t0, int b) {
  constexpr int kTileBoxes = 3 * (kKeys / 8), kBoxes = kTileBoxes + 2 * kN / 8;
  constexpr uint32_t kTile = kRows * kKeys * 2;
  for (int i = i0; i < kBoxes; i += step) {
    if (i < kTileBoxes) {
      const int m = i / (kKeys / 8), q = i % (kKeys / 8);  // K, Q, W; 8-column block q
      ::strata::cuda::tma::load_box(base + m * kTile + q * (kRows * 16), m == 0 ? &maps.k : m == 1 ? &maps.q : &maps.w,
                                    8 * q, m == 2 ? hv : h, t0, b, bar);
    } else {
      const int q = i - kTileBoxes;
      ::strata::cuda::tma::load_box(base + 3 * kTile + q * (kRows * 16), &maps.dout, v0 + 8 * q, hv, t0, b, bar);
    }
  }
}

// maps.box5: the chunk's four tiles as one box each (K, Q, W: blocks 0..15; dO: the block's 2 kN columns v0..),
// issued by lane 0 of warps 0..3 (k = the thread's index among the issuing warpgroup's threads): 4 copies a chunk
// instead of 48 + 2 kN / 8, each issued one lane at a time through the uniform datapath.
__device__ __forceinline__ void chunk_tiles(const DhuMaps& maps, uint32_t base, uint32_t bar, int k, int v0, int h,
                                            int hv, int t0, int b) {
  if (k < 128 && (k & 31) == 0) {
    const int m = k >> 5;  // K, Q, W, dO
    ::strata::cuda::tma::load_blocks(base + m * (kRows * kKeys * 2),
                                     m == 0 ? &maps.k : m == 1 ? &maps.q : m == 2 ? &maps.w : &maps.dout, t0,
                                     m == 3 ? v0 / 8 : 0, m == 2 || m == 3 ? hv : h, b, bar);
  }
}


// kAhead (kDhuWgmmaAhead, kTma only): the chunk step with only K dS → dVn → Wᵀ (−dVn) on the recurrence's chain;
// dv_local's P = K Qᵀ, the dO transposes and the row factors of chunk c − 1 are formed while chunk c's state update
// runs (see the loop). Otherwise the session-10 order (P and K dS first, then Bm dO, then the state update).
// kHalfP (kDhuWgmmaAheadHalfP, with kAhead and the fused dv_local): the two warpgroups share P instead of each forming
// all of it: warpgroup g forms and gates P's columns 32 g.. (m64n32, 16 ex2 a thread instead of 32), stores its half
// of Bm to shared memory, and after a 256-thread named barrier both run Bm dO with A from shared memory.
template <int kN, bool kFuse, bool kTma, bool kAhead, bool kHalfP>
__global__ void __launch_bounds__(kThr, 1)
    dhu_wgmma_kernel(const DhuParams p, const int64_t* offs, int64_t nvt, const __grid_constant__ DhuMaps maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host launches this kernel only in sm_90a builds on sm_90 devices)
#else
  static_assert(kN == 16 || kN == 32 || kN == 64, "per-warpgroup column widths with a wgmma wrapper");
  static_assert(kTma || !kAhead, "the reordered chunk step waits for chunk c − 1's tiles on their mbarrier");
  static_assert(!kHalfP || (kAhead && kFuse), "the shared P is a form of the reordered fused step");
  using S = WgSmem<kN, kTma, kHalfP>;
  constexpr int kPN = kHalfP ? 32 : 64;  // columns of P this warpgroup forms
  namespace mm = ::strata::cuda::mma;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const Dims& d = p.d;
  const int tid = threadIdx.x, wgi = tid >> 7, wt = tid & 127, w = (tid >> 5) & 3, lane = tid & 31;
  const int64_t vt = blockIdx.x % nvt, hv = blockIdx.x / nvt % d.HV, n = blockIdx.x / (nvt * d.HV), h = hv / d.G;
  const int cb = wgi * kN;
  const int64_t v0 = vt * 2 * kN;
  const uint32_t sb = s0 + 2 * S::kStage + wgi * S::kWgB;
  const uint32_t dot = sb + S::kSb, sedot = dot + S::kSmall, dvnt = sedot + S::kSmall;
  // This warpgroup's γ ring: γ of chunk c in slot c & 1, written by its threads wt < 64 right after the block barrier
  // of chunk c + 1 and read by the warpgroup until the block barrier of chunk c − 1.
  float* const gring = reinterpret_cast<float*>(smem + 2 * S::kStage + wgi * S::kWgB + S::kGam);
  auto gslot = [gring](int64_t c) { return gring + (c & 1) * kRows; };

  const DhuSeq sq = dhu_sequence(d, offs, n);
  const int64_t b = sq.b, bos = sq.bos, eos = sq.eos, hc0 = sq.hc0;
  const int64_t nc = (eos - bos + kRows - 1) / kRows;
  // The K / Q / W tiles' descriptors (the K step ks) and ldmatrix.trans offsets in either layout.
  auto tdesc = [](uint32_t base, int ks) {
    if constexpr (kTma) return wg::cb_desc<kRows>(base, ks);
    else return wg::tile_desc<kKeys>(base, ks);
  };

  // dS: keys 64 mt + acc_row(w, lane, x & 3), columns v0 + cb + acc_col(lane, x >> 2, x & 3) at dS[mt][x].
  float dS[2][kN / 2];
  load_dht<kN>(p, n, hv, v0 + cb, dS);
  if (nc == 0) {  // no chunk: dh0 = dht
    store_dh0<kN>(p, n, hv, v0 + cb, dS);
    return;
  }
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBytes - 128);  // kTma: stage st's copies
  // kAhead: thread 0 posts a stage's expected bytes before the block barrier that precedes its request (every warp
  // issues some of the boxes then), here for the prologue's chunk nc − 1 (stage 0) and the first loop request.
  auto post_expect = [&](int st) {
    if (tid == 0) ::strata::cuda::mbar_arrive_expect_tx(full + st, S::kStage);
  };
  if constexpr (kTma) {
    if (tid == 0) ::strata::cuda::mbar_init(full, 1), ::strata::cuda::mbar_init(full + 1, 1);
    if constexpr (kAhead) {
      post_expect(0);
      if (nc > 1) post_expect(1);
    }
    __syncthreads();
  }

  // Requests chunk c's K, Q, W, dO tiles into stage st (one cp.async group; rows >= L zero-filled). K / Q / W:
  // thread row r0 + 16 it (r0 = tid % 8 + 8 (tid / 128)), segment q = (tid / 8) % 16: the 8 threads of a 128-byte
  // shared wavefront write 8 rows of one core-matrix column (distinct banks); dO: kN / 4 segments a row.
  // kTma: warp 0 issues the 48 + kN / 4 boxes (one per 8-column block of each tile) of chunk c on full[st]; rows past
  // the sequence arrive as they are (past T: zeros) and only meet zeros (rows >= L of dVn, scale E dO, Bm and the
  // dv read are selected as 0). kAhead: every warp issues up to 8 of them (lanes < 8; the copies go through the
  // uniform datapath one lane at a time, ~8 instructions each, so warp 0 alone spent ~500 issue slots a chunk while
  // its warpgroup's wgmma waited), the expected bytes posted before (post_expect).
  auto request = [&](int64_t c, int st) {
    const int64_t t0 = bos + c * kRows;
    const uint32_t base = s0 + st * S::kStage;
    if constexpr (kTma) {
      constexpr int kWarps = kAhead ? kThr / 32 : 1;
      if (kAhead || tid < 32) {
        wg::fence_proxy_async();  // earlier generic reads of the stage before the copy engine's writes
        if constexpr (!kAhead) {
          if (lane == 0) ::strata::cuda::mbar_arrive_expect_tx(full + st, S::kStage);
          __syncwarp();
        }
        const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(full + st));
        if (maps.box5)
          chunk_tiles(maps, base, bar, tid, static_cast<int>(v0), static_cast<int>(h), static_cast<int>(hv),
                      static_cast<int>(t0), static_cast<int>(b));
        else
          chunk_boxes<kN>(maps, base, bar, (tid >> 5) + kWarps * lane, 32 * kWarps, static_cast<int>(v0),
                          static_cast<int>(h), static_cast<int>(hv), static_cast<int>(t0), static_cast<int>(b));
      }
      return;
    }
    const int L = chunk_rows(bos, eos, c);
    {
      const int q = (tid >> 3) & 15, r0 = (tid & 7) + 8 * (tid >> 7);
      const uint32_t d0 = base + 2u * static_cast<uint32_t>(wg::tile_off<kKeys>(r0, 8 * q));
      const uint16_t* srcs[3] = {static_cast<const uint16_t*>(p.k.p) + p.k.off(b, t0, h) + 8 * q,
                                 static_cast<const uint16_t*>(p.q.p) + p.q.off(b, t0, h) + 8 * q,
                                 static_cast<const uint16_t*>(p.w.p) + p.w.off(b, t0, hv) + 8 * q};
      const int64_t rss[3] = {p.k.s[1], p.q.s[1], p.w.s[1]};
#pragma unroll
      for (int m = 0; m < 3; ++m)
#pragma unroll
        for (int it = 0; it < kRows / 16; ++it) {
          const int r = r0 + 16 * it;
          const bool ok = r < L;
          // tile_off(r0 + 16 it, c) = tile_off(r0, c) + 2 it rows of core matrices (8 x 128 elements each)
          ::strata::cuda::cp_async16(d0 + m * S::kTile + it * (2 * 8 * kKeys * 2), ok ? srcs[m] + r * rss[m] : srcs[m],
                                     ok);
        }
    }
    {
      constexpr int kSeg = 2 * kN / 8, kStep = kThr / kSeg;
      const int q = tid % kSeg, r0 = tid / kSeg;
      const uint16_t* src = static_cast<const uint16_t*>(p.dout.p) + p.dout.off(b, t0, hv) + v0 + 8 * q;
      const uint32_t d0 = base + S::kO + 2u * static_cast<uint32_t>(r0 * S::kLdO + 8 * q);
#pragma unroll
      for (int it = 0; it < kRows / kStep; ++it) {
        const int r = r0 + kStep * it;
        const bool ok = r < L;
        ::strata::cuda::cp_async16(d0 + 2u * static_cast<uint32_t>(kStep * it * S::kLdO),
                                   ok ? src + r * p.dout.s[1] : src, ok);
      }
    }
    ::strata::cuda::cp_async_commit();
  };
  // γ of row wt (< 64) of chunk c: 0 past the chunk or without g.
  auto fetch_gamma = [&](int64_t c) { return fetch_gamma_row(p, b, hv, bos, eos, c, wt); };

  // dh[hc] = dS, as bf16 pairs through one row pointer per accumulator row (the generic dtype-switching stores
  // cost ~30 instructions each: GPU run s9run1 measured this pass at 1.42 ms with them). Called with no wgmma group
  // in flight (ptxas otherwise waits for them before reading dS).
  // kHalfP: staged 16-byte rows (store_state_staged).
  auto store_dh = [&](int64_t hc) {
    if (hc >= d.NT) return;  // (invalid cu_seqlens could point past dh)
    if constexpr (kHalfP) {  // through dvnt (free after U2)
      store_state_staged<kN>(smem, s0, dvnt, dS, static_cast<uint16_t*>(p.dh.p) + p.dh.off(b, hc, hv, 0) + v0 + cb,
                             p.dh.s[3]);
      return;
    }
    uint16_t* dhp = static_cast<uint16_t*>(p.dh.p) + p.dh.off(b, hc, hv, 0) + v0 + cb + 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        uint32_t* row = reinterpret_cast<uint32_t*>(dhp + (64 * mt + wg::acc_row(w, lane, 2 * hh)) * p.dh.s[3]);
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) row[4 * j] = mm::pack2<T>(dS[mt][4 * j + 2 * hh], dS[mt][4 * j + 2 * hh + 1]);
      }
  };

  const float scale = p.scale;
  // The chunk step's pieces (the two orders below call them in different places).
  auto row_factors = [&](int64_t c) { return row_factors_of(gslot(c), chunk_rows(bos, eos, c), scale); };
  // Group P (fused dv_local): P = K Qᵀ of the chunk in stage st (kHalfP: columns 32 wgi.., the Q tile's rows
  // 32 wgi.. at 16 bytes a row in the cb_off layout).
  auto issue_P = [&](int st, float(&accP)[kPN / 2]) {
    const uint32_t kst = s0 + st * S::kStage, qst = kst + S::kQ + (kHalfP ? wgi * 32 * 16 : 0);
    wg::reg_fence(accP);
    wg::wg_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) wg::mma_ss<T, kPN>(accP, tdesc(kst + S::kK, ks), tdesc(qst, ks), ks > 0);
    wg::wg_commit();
  };
  // Group A: D = K dS (B = the bf16 copy of dS).
  auto issue_A = [&](int st, float(&accD)[kN / 2]) { issue_kds<kN, kTma>(accD, s0 + st * S::kStage + S::kK, sb); };
  // This thread's dO pairs of the chunk in stage st (this warpgroup's columns, accumulator layout).
  auto load_dO = [&](int st, uint32_t(&raw)[kN / 4]) {
    load_tile_pairs<kN>(reinterpret_cast<const uint16_t*>(smem + st * S::kStage + S::kO), cb,
                        [](int r, int c) { return S::o_off(r, c); }, raw);
  };
  // (scale E dO)ᵀ rounded to bf16, the B operand of U1.
  auto store_sedo = [&](const uint32_t(&raw)[kN / 4], const RowF& r) {
    uint32_t u[kN / 4];
    scale_pairs<kN>(raw, r, u);
    store_pairs_trans<kN, kRows>(sedot, 0, u);
  };
  // Unfused: this thread's dv pairs of chunk c (0 past L).
  auto load_dv = [&](int64_t c, uint32_t(&dvw)[kN / 4]) {
    const int64_t t0 = bos + c * kRows;
    const int L = chunk_rows(bos, eos, c);
    const uint16_t* dvp = static_cast<const uint16_t*>(p.dv.p) + p.dv.off(b, t0, hv) + v0 + cb + 2 * (lane & 3);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = wg::acc_row(w, lane, 2 * hh);
      const uint32_t* row = reinterpret_cast<const uint32_t*>(dvp + i * p.dv.s[1]);
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) dvw[2 * j + hh] = i < L ? row[4 * j] : 0u;
    }
  };
  // kHalfP: this warpgroup's half of Bm (columns 32 wgi..) as bf16 pairs into the shared tile_off<64> tile, a
  // 256-thread named barrier, then group V with A = Bm from shared memory.
  auto gate_share_issue_V = [&](float(&accP)[kPN / 2], const RowF& r, const float* gam, float(&accV)[kN / 2]) {
    wg::reg_fence(accP);
#pragma unroll
    for (int j = 0; j < kPN / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int x = 4 * j + 2 * hh;
        const int off = wg::tile_off<kRows>(wg::acc_row(w, lane, 2 * hh), 32 * wgi + wg::acc_col(lane, j, 0));
        *reinterpret_cast<uint32_t*>(smem + S::kBm + 2 * off) =
            mm::pack2<T>(gated_p(accP[x], x, 32 * wgi, r, gam, scale), gated_p(accP[x + 1], x + 1, 32 * wgi, r, gam, scale));
      }
    wg::fence_proxy_async();
    wg::bar_sync(3, kThr);  // both halves of Bm visible to both warpgroups' wgmma
    wg::reg_fence(accV);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wg::mma_ss<T, kN>(accV, wg::tile_desc<kRows>(s0 + S::kBm, kk), wg::tile_desc<kRows>(dot, kk), kk > 0);
    wg::wg_commit();
  };
  // dS *= e^{γ_last} (with no wgmma group in flight where possible: scaling dS while K dS runs made ptxas inject a
  // warpgroup.wait in the dv-read kernels, in a branch of the reordered one: C7518).
  auto decay_dS = [&](float decay) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int x = 0; x < kN / 2; ++x) dS[mt][x] *= decay;
  };
  // Group U1: dS (decayed) + Qᵀ (scale E dO) (A = Qᵀ by ldmatrix.trans from the Q tile of stage st).
  auto issue_U1 = [&](int st, uint32_t(&qf)[2][4][4]) {
    load_trans<kTma>(s0 + st * S::kStage + S::kQ, qf);
    wg::reg_fence(dS[0]), wg::reg_fence(dS[1]);
    issue_update<kN>(dS, qf, sedot);
  };
  // dVn = bf16(dv) + e^{γ_last − γ} D (rows < L; 0 past L) → dv2, and −bf16(dVn) transposed into dvnt for U2.
  auto dvn_step = [&](int64_t t0, const RowF& r, const float(&accD)[kN / 2], const float(&accV)[kFuse ? kN / 2 : 1],
                      const uint32_t(&dvw)[kFuse ? 1 : kN / 4]) {
    uint32_t neg[kN / 4], pos[kN / 4];
    uint16_t* dv2p = static_cast<uint16_t*>(p.dv2.p) + p.dv2.off(b, t0, hv) + v0 + cb + (kHalfP ? 0 : 2 * (lane & 3));
    if constexpr (kFuse) {
      uint32_t dvr[kN / 4];  // dv rounded to bf16
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) dvr[2 * j + hh] = mm::pack2<T>(accV[4 * j + 2 * hh], accV[4 * j + 2 * hh + 1]);
      dvn_pairs<kN>(dvr, r.dec, accD, r.L, pos, neg);
    } else {
      dvn_pairs<kN>(dvw, r.dec, accD, r.L, pos, neg);
    }
    if constexpr (!kHalfP) {  // dv2 as bf16 pairs, rows < L
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = wg::acc_row(w, lane, 2 * hh);
        uint32_t* row = reinterpret_cast<uint32_t*>(dv2p + i * p.dv2.s[1]);
        if (i < r.L) {
#pragma unroll
          for (int j = 0; j < kN / 8; ++j) row[4 * j] = pos[2 * j + hh];
        }
      }
    }
    if constexpr (kHalfP)  // dv2 rows < L through dot (its reader V(c) is done; rewritten after the next barrier)
      stage_rows<kN>(smem, s0, dot, pos, [&](int row, int chunk, uint4 v) {
        if (row < r.L) *reinterpret_cast<uint4*>(dv2p + row * p.dv2.s[1] + 8 * chunk) = v;
      });
    store_pairs_trans<kN, kRows>(dvnt, 0, neg);
  };
  // Group U2: dS += Wᵀ (−dVn) (A = Wᵀ fragments loaded before).
  auto issue_U2 = [&](uint32_t(&wf)[2][4][4]) { issue_update<kN>(dS, wf, dvnt); };
  // The bf16 copy of dS for the next chunk's K dS (its reader, group A, has completed).
  auto store_sb = [&] { store_copy<kN>(sb, dS); };
  // γ ring: in the chunk c step, after its block barrier, γ of chunk c − 1 (fetched one chunk earlier) into its slot
  // (whose chunk c + 1 readers are done) and γ of chunk c − 2 into the register.
  float g_next = nc > 1 ? fetch_gamma(nc - 2) : 0.f;
  auto advance_gamma = [&](int64_t c) {
    if (c > 0) {
      if (wt < kRows) gslot(c - 1)[wt] = g_next;
      g_next = c > 1 ? fetch_gamma(c - 2) : 0.f;
    }
    __syncwarp();  // the γ branch of warps 0-1 of each warpgroup: converged before the .aligned wgmma instructions
  };

  // Prologue: chunk nc − 1 requested into stage 0 with its γ; the bf16 copy of dS (made visible by the first loop
  // barrier with its proxy fence).
  request(nc - 1, 0);
  if (wt < kRows) gslot(nc - 1)[wt] = fetch_gamma(nc - 1);
  store_sb();
  store_dh(hc0 + nc - 1);  // dh of the last chunk: dS = dht

  if constexpr (!kAhead) {
    for (int64_t c = nc - 1, it = 0; c >= 0; --c, ++it) {
      const int st = static_cast<int>(it & 1);
      const int64_t t0 = bos + c * kRows, hc = hc0 + c;
      if constexpr (!kTma) ::strata::cuda::cp_async_wait<0>();  // chunk c (the only group in flight)
      wg::fence_proxy_async();
      __syncthreads();  // stage st, γ of chunk c and every dS copy visible; every reader of the other stage is done
      // kTma: chunk c − 1's boxes into the other stage now, with no wgmma in flight (issued between the groups, warp
      // 0's branch made ptxas serialise the fused kernel's wgmma: C7511).
      if constexpr (kTma) {
        if (c > 0) request(c - 1, st ^ 1);
      }
      advance_gamma(c);
      if constexpr (kTma) ::strata::cuda::mbar_wait(full + st, static_cast<uint32_t>(it >> 1) & 1u);  // chunk c landed
      // The row factors first (their branches between the issue of a group and its wait made ptxas serialise the
      // wgmma: C7511).
      const RowF r = row_factors(c);
      float accP[kFuse ? 32 : 1], accD[kN / 2];
      if constexpr (kFuse) issue_P(st, accP);
      issue_A(st, accD);
      // While they run: unfused: this thread's dv pairs; dOᵀ (fused) and (sE dO)ᵀ of this warpgroup's columns.
      uint32_t dvw[kFuse ? 1 : kN / 4];
      if constexpr (!kFuse) load_dv(c, dvw);
      {
        uint32_t raw[kN / 4];
        load_dO(st, raw);
        if constexpr (kFuse) store_pairs_trans<kN, kRows>(dot, 0, raw);
        store_sedo(raw, r);
      }
      wg::fence_proxy_async();
      wg::bar_wg(1 + wgi);  // this warpgroup's dOᵀ, (sE dO)ᵀ visible to its wgmma
      float accV[kFuse ? kN / 2 : 1];
      uint32_t pa[kFuse ? 4 : 1][4];
      if constexpr (kFuse) {
        wg::wg_wait<1>();  // P done (A may still run)
        gate_issue_V<kN>(accP, r, gslot(c), scale, dot, pa, accV);
      }
      // cp.async: chunk c − 1 into the other stage after the groups that dv needs are issued (P, A, V), so that its
      // address arithmetic is not on the recurrence's path.
      if constexpr (!kTma) {
        if (c > 0) request(c - 1, st ^ 1);
      }
      uint32_t qf[2][4][4];
      decay_dS(gate_exp(r.glast));
      issue_U1(st, qf);
      wg::wg_wait<1>();  // A (and V) done; U1 may still run
      wg::reg_fence(accD);
      if constexpr (kFuse) wg::reg_fence(accV);
      dvn_step(t0, r, accD, accV, dvw);
      uint32_t wf[2][4][4];
      load_trans<kTma>(s0 + st * S::kStage + S::kW, wf);
      wg::fence_proxy_async();
      wg::bar_wg(1 + wgi);  // −dVnᵀ visible to this warpgroup's wgmma
      issue_U2(wf);
      wg::wg_wait<0>();
      wg::reg_fence(dS[0]), wg::reg_fence(dS[1]);
      wg::reg_fence_u(qf), wg::reg_fence_u(wf);
      if constexpr (kFuse) wg::reg_fence_u(pa);
      store_sb();
      if (c > 0) store_dh(hc - 1);  // dh of the next chunk (the gradient of the state at its end: this dS)
    }
  } else {
    // The recurrence's chain per chunk: block barrier → A (K dS) → dVn → U2 (Wᵀ (−dVn)) → the bf16 copy of dS. The
    // rest of chunk c's work is ready when it starts: its P (in flight or done), dOᵀ, (sE dO)ᵀ and row factors were
    // formed during chunk c + 1's U1 / U2; chunk c − 1's are formed during this chunk's U1 / U2 in the same way.
    // Tensor-core order per warpgroup: A(c), V(c), U1(c), U2(c), P(c − 1); nothing but A and V precedes dVn.
    ::strata::cuda::mbar_wait(full, 0u);
    wg::bar_wg(1 + wgi);  // γ of chunk nc − 1 visible to this warpgroup
    RowF r = row_factors(nc - 1);
    float accP[kFuse ? kPN / 2 : 1];
    uint32_t dvw[kFuse ? 1 : kN / 4];
    {
      uint32_t raw[kN / 4];
      load_dO(0, raw);
      if constexpr (kFuse) {
        store_pairs_trans<kN, kRows>(dot, 0, raw);
        issue_P(0, accP);
      } else {
        load_dv(nc - 1, dvw);
      }
      store_sedo(raw, r);
    }
    decay_dS(gate_exp(r.glast));
    for (int64_t c = nc - 1, it = 0; c >= 0; --c, ++it) {
      const int st = static_cast<int>(it & 1);
      const int64_t t0 = bos + c * kRows, hc = hc0 + c;
      wg::fence_proxy_async();
      __syncthreads();  // dS copy, dOᵀ, (sE dO)ᵀ of chunk c visible; every reader of the other stage is done
      if (c > 0) request(c - 1, st ^ 1);
      advance_gamma(c);
      float accD[kN / 2];
      if constexpr (kFuse) wg::wg_wait<0>(), wg::reg_fence(accP);  // P(c) done
      issue_A(st, accD);
      float accV[kFuse ? kN / 2 : 1];
      uint32_t pa[kFuse && !kHalfP ? 4 : 1][4];
      if constexpr (kHalfP) gate_share_issue_V(accP, r, gslot(c), accV);
      else if constexpr (kFuse) gate_issue_V<kN>(accP, r, gslot(c), scale, dot, pa, accV);
      uint32_t qf[2][4][4], wf[2][4][4];
      issue_U1(st, qf);  // (dS decayed at the end of the chunk before)
      wg::wg_wait<1>();  // A (and V) done; U1 may still run
      wg::reg_fence(accD);
      if constexpr (kFuse) wg::reg_fence(accV);
      if constexpr (kFuse && !kHalfP) wg::reg_fence_u(pa);
      dvn_step(t0, r, accD, accV, dvw);
      load_trans<kTma>(s0 + st * S::kStage + S::kW, wf);
      wg::fence_proxy_async();
      wg::bar_wg(1 + wgi);  // −dVnᵀ visible to this warpgroup's wgmma; γ of chunk c − 1 to its threads
      issue_U2(wf);
      // Chunk c − 1's dv_local P, dOᵀ, row factors, (sE dO)ᵀ (unfused: its dv pairs) while U2 runs. At c = 0 there is
      // no such chunk: the same steps run on the other stage's stale tiles and γ slot (P is waited for after the
      // loop, nothing reads the rest), so that no wgmma wait sits in a branch (ptxas then serialises: C7518).
      if (c > 0) ::strata::cuda::mbar_wait(full + (st ^ 1), static_cast<uint32_t>((it + 1) >> 1) & 1u);
      r = row_factors(c - 1);
      {
        uint32_t raw[kN / 4];
        load_dO(st ^ 1, raw);
        if constexpr (kFuse) store_pairs_trans<kN, kRows>(dot, 0, raw);  // (its reader V(c) is done)
        else load_dv(c > 0 ? c - 1 : 0, dvw);  // (c = 0: chunk 0 again, unused; no branch here: C7518)
        wg::wg_wait<1>();  // U1(c) done: its Qᵀ fragments and (sE dO)ᵀ free
        wg::reg_fence_u(qf);
        if constexpr (kFuse) issue_P(st ^ 1, accP);
        store_sedo(raw, r);
      }
      wg::wg_wait<kFuse ? 1 : 0>();  // U2(c) done (P(c − 1) may still run, into the next chunk)
      wg::reg_fence(dS[0]), wg::reg_fence(dS[1]);
      wg::reg_fence_u(wf);
      store_sb();
      if (c > 0) store_dh(hc - 1);
      decay_dS(c > 0 ? gate_exp(r.glast) : 1.f);  // by chunk c − 1's e^{γ_last} (none after the first chunk)
      if (c > 1) post_expect(st);  // chunk c − 2, requested into this stage after the next block barrier
    }
    if constexpr (kFuse) wg::wg_wait<0>();  // the P group issued at c = 0
  }
  store_dh0<kN>(p, n, hv, v0 + cb, dS);
#endif
}

// ---- kDhuWgmmaSplit (session 12): the warp-specialised chunk step, fused dv_local, kN = 16 (B = 1's width) ----
// Why: at 16 columns a warpgroup (s11run2: 2.157 ms at B = 1, T = 32768, 512 chunks ≈ 7 500 cycles a chunk) spends
// most of its chunk step on work that does not depend on dS — P = K Qᵀ over all 64 columns and its gating, the dO
// transposes, the row factors, the copy-engine requests — issued in order between the links of the recurrence's
// chain (K dS → dVn → Wᵀ (−dVn) → the bf16 copy of dS), each link waiting on the ~9 cycles a warp instruction takes.
// Here a third warpgroup (the "side" one) does that work one chunk ahead, for both state warpgroups at once:
//   side, step for chunk c: request chunk c − 1's boxes (3-stage ring); wait for chunk c's; the row factors; the
//     state's per-row e^{γ_last − γ_i} and e^{γ_last} into `fac`; P = K Qᵀ (m64n64); dOᵀ (2 kN columns) for Bm dO
//     and (scale E dO)ᵀ for both state warpgroups' U1; Bm gated into registers; dv_local = Bm dO (m64n(2 kN), A from
//     registers) rounded to bf16 into `dvl` (row-major, padded pitch).
//   state warpgroup g (kN columns of dS, as the other forms), step for chunk c: A = K dS; dS *= e^{γ_last}; U1 =
//     Qᵀ (sE dO); dVn = dv_local + e^{γ_last − γ} ⊙ A → −dVnᵀ; U2 = Wᵀ (−dVn); dv2 staged (while U2 runs); the bf16
//     copy of dS; dh staged.
// One 384-thread barrier per step: after it the side works on chunk c − 1 while the state warpgroups work on chunk
// c; `fac`, `dvl` and the (sE dO)ᵀ tiles are double-buffered by chunk parity, the stages are a ring of three (chunk
// c's tiles are read by the side in one step and by the state warpgroups in the next). The same products with the
// same shapes per element and the same rounding points as kDhuWgmmaAheadHalfP: the same bits.
template <int kN>
struct SplitSmem {
  static constexpr int kTile = kRows * kKeys * 2;
  static constexpr int kK = 0, kQ = kTile, kW = 2 * kTile, kO = 3 * kTile;
  static constexpr int kStage = kO + kRows * 2 * kN * 2, kStages = 3;
  static constexpr int kSb = 0, kSbB = kN * kKeys * 2;               // per state warpgroup, after the stages
  static constexpr int kDvnt = kSb + kSbB, kSmall = kN * kRows * 2;  // −dVnᵀ [kN][64] (dh staging too)
  static constexpr int kStg = kDvnt + kSmall;                        // dv2 staging [64][kN]
  static constexpr int kWgB = kStg + kSmall;
  static constexpr int kPairs = 3 * kStage + 2 * kWgB;                                  // (sE dO)ᵀ [2][2 kN][64]
  static constexpr int kPairB = 2 * kN * kRows * 2, kDot = kPairs + 2 * kPairB;          // dOᵀ [2 kN][64]
  static constexpr int kLdV = 2 * kN + 8, kDvl = kDot + kPairB;                          // dv_local [2][64][kLdV]
  static constexpr int kFac = kDvl + 2 * kRows * kLdV * 2;                               // [2][64 + 1 (+ 3)] f32
  static constexpr int kGam = kFac + 2 * 68 * 4;                                        // side's γ [2][64]
  static constexpr int kBar = kGam + 2 * kRows * 4, kBytes = kBar + 3 * 8;
  static_assert(kStage % 128 == 0 && kWgB % 128 == 0 && kPairB % 128 == 0 && kDvl % 16 == 0 && kBar % 8 == 0,
                "aligned regions");
};

constexpr int kSplitThr = 384;
template <int kN>
__global__ void __launch_bounds__(kSplitThr, 1)
    dhu_wgmma_split_kernel(const DhuParams p, const int64_t* offs, int64_t nvt, const __grid_constant__ DhuMaps maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host launches this kernel only in sm_90a builds on sm_90 devices)
#else
  static_assert(kN == 16, "3 stages and the side's buffers fit at 16 columns a warpgroup");
  constexpr int kThreads = kSplitThr;
  using S = SplitSmem<kN>;
  constexpr int kN2 = 2 * kN;  // the block's columns (the side's dO, dv_local)
  namespace mm = ::strata::cuda::mma;
  namespace sc = ::strata::cuda;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const Dims& d = p.d;
  const int tid = threadIdx.x, wgi = tid >> 7, wt = tid & 127, w = (tid >> 5) & 3, lane = tid & 31;
  const bool side = wgi == 2;
  const int64_t vt = blockIdx.x % nvt, hv = blockIdx.x / nvt % d.HV, n = blockIdx.x / (nvt * d.HV), h = hv / d.G;
  const int cb = side ? 0 : wgi * kN;
  const int64_t v0 = vt * kN2;
  const DhuSeq sq = dhu_sequence(d, offs, n);
  const int64_t b = sq.b, bos = sq.bos, eos = sq.eos, hc0 = sq.hc0;
  const int64_t nc = (eos - bos + kRows - 1) / kRows;
  const float scale = p.scale;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBar);
  auto stage = [&](int64_t i) { return s0 + static_cast<uint32_t>(i % 3) * S::kStage; };  // chunk of side index i
  auto parity = [](int64_t i) { return static_cast<uint32_t>(i / 3) & 1u; };

  if (side) {
    // ---------------- side warpgroup ----------------
    auto fetch_gamma = [&](int64_t c) { return fetch_gamma_row(p, b, hv, bos, eos, c, wt); };
    auto gam_of = [&](int64_t i) { return reinterpret_cast<float*>(smem + S::kGam) + (i & 1) * kRows; };
    auto request = [&](int64_t i) {  // chunk of side index i (chunk nc − 1 − i), expected bytes posted before
      const int64_t t0 = bos + (nc - 1 - i) * kRows;
      wg::fence_proxy_async();
      const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(full + i % 3));
      if (maps.box5) {
        chunk_tiles(maps, stage(i), bar, wt, static_cast<int>(v0), static_cast<int>(h),
                    static_cast<int>(hv), static_cast<int>(t0), static_cast<int>(b));
      } else {
        chunk_boxes<kN>(maps, stage(i), bar, w + 4 * lane, 128, static_cast<int>(v0), static_cast<int>(h),
                        static_cast<int>(hv), static_cast<int>(t0), static_cast<int>(b));
      }
    };
    if (nc == 0) return;
    if (wt == 0) {
      for (int s = 0; s < 3; ++s) sc::mbar_init(full + s, 1);
      sc::mbar_arrive_expect_tx(full, S::kStage);
      if (nc > 1) sc::mbar_arrive_expect_tx(full + 1, S::kStage);
    }
    if (wt < kRows) gam_of(0)[wt] = fetch_gamma(nc - 1);
    float g_next = fetch_gamma(nc - 2);
    __syncthreads();  // mbarriers initialised, γ of the first chunk
    request(0);
    for (int64_t i = 0; i <= nc; ++i) {
      wg::fence_proxy_async();
      wg::bar_sync(4, kThreads);  // (the step barrier; see the state loop)
      if (i == nc) break;
      const int64_t c = nc - 1 - i;
      if (c > 0) request(i + 1);
      if (c > 0 && wt < kRows) gam_of(i + 1)[wt] = g_next;  // (read after the next step barrier)
      g_next = fetch_gamma(c - 2);
      __syncwarp();
      sc::mbar_wait(full + i % 3, parity(i));  // chunk c landed
      const uint32_t st = stage(i);
      const float* gam = gam_of(i);
      const RowF r = row_factors_of(gam, chunk_rows(bos, eos, c), scale);
      // The state's row factors: e^{γ_last − γ_i} (0 at i >= L) and e^{γ_last}.
      float* fac = reinterpret_cast<float*>(smem + S::kFac) + (i & 1) * 68;
      if (wt < kRows) fac[wt] = wt < r.L ? gate_exp(r.glast - gam[wt]) : 0.f;
      if (wt == 0) fac[kRows] = gate_exp(r.glast);
      // P = K Qᵀ (all 64 columns).
      constexpr int kVN = kN2;  // dO / dv_local columns
      float accP[32];
      wg::reg_fence(accP);
      wg::wg_fence();
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks)
        wg::mma_ss<T, 64>(accP, wg::cb_desc<kRows>(st + S::kK, ks), wg::cb_desc<kRows>(st + S::kQ, ks), ks > 0);
      wg::wg_commit();
      // dOᵀ (the B operand of Bm dO) and (scale E dO)ᵀ (both state warpgroups' U1 B operands: rows g kN..).
      const uint32_t dot = s0 + S::kDot;
      {
        uint32_t raw[kVN / 4], u[kVN / 4];
        load_tile_pairs<kVN>(reinterpret_cast<const uint16_t*>(smem + (st - s0) + S::kO), 0,
                             [](int row, int col) { return wg::cb_off<kRows>(row, col); }, raw);
        scale_pairs<kVN>(raw, r, u);
        store_pairs_trans<kVN, kRows>(dot, 0, raw);
        store_pairs_trans<kVN, kRows>(s0 + S::kPairs + (i & 1) * S::kPairB, 0, u);
      }
      float accV[kVN / 2];
      {
        wg::fence_proxy_async();
        wg::bar_wg(3);  // dOᵀ visible to the side's wgmma
        wg::wg_wait<0>();
        uint32_t pa[4][4];
        gate_issue_V<kVN>(accP, r, gam, scale, dot, pa, accV);
        wg::wg_wait<0>();
        wg::reg_fence_u(pa);
      }
      wg::reg_fence(accV);
      // dv_local rounded to bf16 (what the other forms' dVn reads), row-major [64][2 kN + 8].
      uint32_t* dvl = reinterpret_cast<uint32_t*>(smem + S::kDvl + (i & 1) * (kRows * S::kLdV * 2));
#pragma unroll
      for (int j = 0; j < kVN / 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          dvl[(wg::acc_row(w, lane, 2 * hh) * S::kLdV + wg::acc_col(lane, j, 0)) / 2] =
              mm::pack2<T>(accV[4 * j + 2 * hh], accV[4 * j + 2 * hh + 1]);
      if (wt == 0 && c > 1) sc::mbar_arrive_expect_tx(full + (i + 2) % 3, S::kStage);  // chunk c − 2
    }
    return;
  }

  // ---------------- state warpgroups 0, 1 ----------------
  const uint32_t sb = s0 + 3 * S::kStage + wgi * S::kWgB, dvnt = sb + S::kDvnt, stg = sb + S::kStg;
  float dS[2][kN / 2];
  load_dht<kN>(p, n, hv, v0 + cb, dS);
  if (nc == 0) {  // no chunk: dh0 = dht
    store_dh0<kN>(p, n, hv, v0 + cb, dS);
    return;
  }
  auto store_sb = [&] { store_copy<kN>(sb, dS); };
  auto store_dh = [&](int64_t hc) {
    if (hc < d.NT)  // (invalid cu_seqlens could point past dh)
      store_state_staged<kN>(smem, s0, dvnt, dS, static_cast<uint16_t*>(p.dh.p) + p.dh.off(b, hc, hv, 0) + v0 + cb,
                             p.dh.s[3]);
  };
  store_sb();
  store_dh(hc0 + nc - 1);  // dh of the last chunk: dS = dht
  __syncthreads();         // (the side's mbarrier initialisation)
  for (int64_t k = 0; k <= nc; ++k) {
    // Step barrier: the side has finished chunk c = nc − k (dv_local, (sE dO)ᵀ, fac) and every reader of the stage
    // it now requests into is done; this warpgroup's dS copy of the chunk before is visible.
    wg::fence_proxy_async();
    wg::bar_sync(4, kThreads);
    if (k == 0) continue;
    const int64_t i = k - 1, c = nc - k, t0 = bos + c * kRows;
    const uint32_t st = stage(i);
    sc::mbar_wait(full + i % 3, parity(i));  // (landed: the side waited; this makes the copies visible here)
    // dS *= e^{γ_last} (A reads the bf16 copy made before; scaled while A runs, ptxas waited for A first: C7517).
    const float* fac = reinterpret_cast<const float*>(smem + S::kFac) + (i & 1) * 68;
    const int L = chunk_rows(bos, eos, c);
    float dec[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) dec[hh] = fac[wg::acc_row(w, lane, 2 * hh)];
    const float decay = fac[kRows];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int x = 0; x < kN / 2; ++x) dS[mt][x] *= decay;
    // A = K dS (B = the bf16 copy of dS).
    float accD[kN / 2];
    issue_kds<kN, true>(accD, st + S::kK, sb);
    // U1: dS += Qᵀ (scale E dO).
    uint32_t qf[2][4][4], wf[2][4][4];
    load_trans<true>(st + S::kQ, qf);
    const uint32_t sedot = s0 + S::kPairs + (i & 1) * S::kPairB + wgi * (kN * kRows * 2);
    wg::reg_fence(dS[0]), wg::reg_fence(dS[1]);
    issue_update<kN>(dS, qf, sedot);
    // dVn = dv_local + e^{γ_last − γ} A (rows < L; 0 past L) → −bf16(dVn)ᵀ into dvnt; dv2 after U2 is issued.
    const uint32_t* dvl = reinterpret_cast<const uint32_t*>(smem + S::kDvl + (i & 1) * (kRows * S::kLdV * 2));
    uint32_t dvw[kN / 4];
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        dvw[2 * j + hh] = dvl[(wg::acc_row(w, lane, 2 * hh) * S::kLdV + cb + wg::acc_col(lane, j, 0)) / 2];
    wg::wg_wait<1>();  // A done; U1 may still run
    wg::reg_fence(accD);
    uint32_t neg[kN / 4], pos[kN / 4];
    dvn_pairs<kN>(dvw, dec, accD, L, pos, neg);
    store_pairs_trans<kN, kRows>(dvnt, 0, neg);
    load_trans<true>(st + S::kW, wf);
    wg::fence_proxy_async();
    wg::bar_wg(1 + wgi);  // −dVnᵀ visible to this warpgroup's wgmma
    // U2: dS += Wᵀ (−dVn).
    issue_update<kN>(dS, wf, dvnt);
    {
      uint16_t* dv2p = static_cast<uint16_t*>(p.dv2.p) + p.dv2.off(b, t0, hv) + v0 + cb;
      stage_rows<kN>(smem, s0, stg, pos, [&](int row, int chunk, uint4 v) {
        if (row < L) *reinterpret_cast<uint4*>(dv2p + row * p.dv2.s[1] + 8 * chunk) = v;
      });
    }
    wg::wg_wait<0>();
    wg::reg_fence(dS[0]), wg::reg_fence(dS[1]);
    wg::reg_fence_u(qf), wg::reg_fence_u(wf);
    store_sb();
    if (c > 0) store_dh(hc0 + c - 1);  // dh of the next chunk (the gradient of the state at its end: this dS)
  }
  store_dh0<kN>(p, n, hv, v0 + cb, dS);
#endif
}

// The tensor maps of the kTma kernel; false where a view does not qualify (the cp.async kernel runs then).
// dcols > 0: the 5-D maps of one box a tile (dO boxes of dcols columns) where the driver encodes them (box5).
bool make_maps(const DhuParams& p, DhuMaps& m, int dcols = 0) {
  const Dims& d = p.d;
  const int64_t B = d.varlen() ? 1 : d.B;
  auto enc5 = [&](CUtensorMap* x, const View& v, int64_t heads, int64_t D, int cols) {
    return ::strata::cuda::tma::encode_blocks_map(x, v.p, B, d.T, heads, D, v.s[0], v.s[1], v.s[2], kRows, cols / 8);
  };
  m.box5 = dcols > 0 && enc5(&m.k, p.k, d.H, d.K, kKeys) && enc5(&m.q, p.q, d.H, d.K, kKeys) &&
           enc5(&m.w, p.w, d.HV, d.K, kKeys) && enc5(&m.dout, p.dout, d.HV, d.V, dcols);
  if (m.box5) return true;
  auto enc = [&](CUtensorMap* x, const View& v, int64_t heads, int64_t D) {
    return ::strata::cuda::tma::encode_rows_map(x, v.p, B, d.T, heads, D, v.s[0], v.s[1], v.s[2], kRows);
  };
  return enc(&m.k, p.k, d.H, d.K) && enc(&m.q, p.q, d.H, d.K) && enc(&m.w, p.w, d.HV, d.K) &&
         enc(&m.dout, p.dout, d.HV, d.V);
}

// box5 (kDhuWgmmaAheadHalfPBox5, session 13; kDhuAuto's half-P form): the chunk tiles as one 5-D box each
// (make_maps' dcols = 2 kN) where the driver encodes them, else the 8-column boxes.
template <int kN, bool kFuse, bool kTma, bool kAhead, bool kHalfP = false>
strata_status launch(const DhuParams& p, const int64_t* offs, cudaStream_t stream, bool box5 = false) {
  DhuMaps maps{};
  if constexpr (kTma)
    if (!make_maps(p, maps, box5 ? 2 * kN : 0)) return launch<kN, kFuse, false, false>(p, offs, stream);
  constexpr int smem = WgSmem<kN, kTma, kHalfP>::kBytes;
  static_assert(smem <= 227 * 1024, "shared memory of one block");
  const int64_t nvt = p.d.V / (2 * kN), blocks = p.d.N * p.d.HV * nvt;
  auto kernel = dhu_wgmma_kernel<kN, kFuse, kTma, kAhead, kHalfP>;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<static_cast<unsigned>(blocks), kThr, smem, stream>>>(p, offs, nvt, maps);
  return cuda::check_launch(kFuse ? "chunk_gated_delta_rule_bwd_dhu (wgmma, fused dv_local)"
                                  : "chunk_gated_delta_rule_bwd_dhu (wgmma)");
}

// kDhuWgmmaSplit (fused dv_local, 16 columns a warpgroup, 16-byte rows of dh / dv2; checked by the caller), with the
// 5-D maps where the driver encodes them.
strata_status launch_split(const DhuParams& p, const int64_t* offs, cudaStream_t stream) {
  constexpr int kN = 16;
  DhuMaps maps{};
  if (!make_maps(p, maps, 2 * kN)) return launch<kN, true, false, false>(p, offs, stream);
  constexpr int smem = SplitSmem<kN>::kBytes;
  static_assert(smem <= 227 * 1024, "shared memory of one block");
  const int64_t nvt = p.d.V / (2 * kN), blocks = p.d.N * p.d.HV * nvt;
  auto kernel = dhu_wgmma_split_kernel<kN>;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<static_cast<unsigned>(blocks), kSplitThr, smem, stream>>>(p, offs, nvt, maps);
  return cuda::check_launch("chunk_gated_delta_rule_bwd_dhu (wgmma, split, fused dv_local)");
}

// kHalfP applies to the fused dv_local only (dv read: the kAhead kernel).
template <bool kTma, bool kAhead, bool kHalfP = false>
strata_status launch_cols(const DhuParams& p, int kn, const int64_t* offs, cudaStream_t stream, bool box5 = false) {
  if (p.fuse_dv_local) {
    if (kn == 64) return launch<64, true, kTma, kAhead, kHalfP>(p, offs, stream, box5);
    if (kn == 32) return launch<32, true, kTma, kAhead, kHalfP>(p, offs, stream, box5);
    return launch<16, true, kTma, kAhead, kHalfP>(p, offs, stream, box5);
  }
  if (kn == 64) return launch<64, false, kTma, kAhead>(p, offs, stream, box5);
  if (kn == 32) return launch<32, false, kTma, kAhead>(p, offs, stream, box5);
  return launch<16, false, kTma, kAhead>(p, offs, stream, box5);
}

// A token tensor the kernel copies by 16-byte segments at any (b, t, head): bf16, outer strides multiples of 8
// elements, 16-byte aligned data (the last dimension has unit stride in every View).
bool lean16(const View& v) {
  return v.dtype == STRATA_DTYPE_BF16 && ((v.s[0] | v.s[1] | v.s[2]) & 7) == 0 &&
         (reinterpret_cast<uintptr_t>(v.p) & 15u) == 0;
}
// dv read as aligned 32-bit pairs: bf16, even outer strides, 4-byte aligned.
bool pair16(const View& v) {
  return v.dtype == STRATA_DTYPE_BF16 && ((v.s[0] | v.s[1] | v.s[2]) & 1) == 0 &&
         (reinterpret_cast<uintptr_t>(v.p) & 3u) == 0;
}

}  // namespace

std::string chunk_gated_delta_rule_bwd_dhu_wgmma_reject(const DhuParams& p) {
  const Dims& d = p.d;
  for (const View* v : {&p.q, &p.k, &p.w, &p.dout})
    if (v->dtype != STRATA_DTYPE_BF16) return "takes bf16 q, k, w, do";
  if (!p.fuse_dv_local && p.dv.dtype != STRATA_DTYPE_BF16) return "takes bf16 dv";
  if (d.K != kKeys) return fmt::format("K = {} (takes K = 128)", d.K);
  if (d.V <= 0 || d.V % 32 != 0) return fmt::format("V = {} (takes a multiple of 32)", d.V);
  if (d.BT != kRows) return fmt::format("chunk size {} (takes 64)", d.BT);
  if (d.N * d.HV * (d.V / 32) >= (int64_t{1} << 31)) return "more than 2^31 blocks";
  return "";
}

bool chunk_gated_delta_rule_bwd_dhu_wgmma_runs(const DhuParams& p) {
  if (!chunk_gated_delta_rule_bwd_dhu_wgmma_reject(p).empty()) return false;
  for (const View* v : {&p.q, &p.k, &p.w, &p.dout})
    if (!lean16(*v)) return false;
  // dh and dv2 are written, dv read, as aligned bf16 pairs (dh's key stride s[3] even too).
  if (!pair16(p.dh) || (p.dh.s[3] & 1) != 0 || !pair16(p.dv2)) return false;
  return p.fuse_dv_local || pair16(p.dv);
}

int chunk_gated_delta_rule_bwd_dhu_cuda_wgmma(const DhuParams& p, const int64_t* offs, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int kn = dhu_wgmma_cols(p.d, ::strata::cuda::current_sm_count(), p.wgmma_cols);
  if (kn == 0) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_bwd_dhu wgmma: {} columns per warpgroup "
                                                     "do not divide V = {}", p.wgmma_cols, p.d.V);
  // kDhuAuto: the reordered copy-engine-fed kernel (kAhead; GPU run s11run1, H200, bf16, HV = 32, K = V = 128, the same
  // bits as the others: fused B = 4 T = 8192 0.929 ms against 0.984 (TMA) / 1.025 (cp.async), B = 1 T = 32768 2.045
  // against 2.181 / 2.390; dv read 0.892 against 1.112 / 0.923 and 1.910 against 1.954 / 1.990 ms), with the fused
  // dv_local in its half-P form with staged 16-byte dh / dv2 stores (s11run2: the same bits, B = 4 0.830 against
  // 1.012 ms for kAhead, B = 1 2.157 against 2.185). kDhuWgmmaTma / kDhuWgmma force the session-10 order (timing).
  const bool rows16 = lean16(p.dh) && (p.dh.s[3] & 7) == 0 && lean16(p.dv2);  // 16-byte dh / dv2 rows (staged)
  // kDhuWgmmaSplit (session 12, forced only): the warp-specialised form at 16 columns; other widths run half P.
  // kDhuAuto with the fused dv_local at 16 columns a warpgroup (B = 1's width): the warp-specialised form (GPU run
  // s12run1, H200, B = 1 T = 32768: 1.691 ms against 2.158 for half P; the same bits).
  const bool split = p.mma_variant == kDhuWgmmaSplit || (p.mma_variant == kDhuAuto && p.fuse_dv_local);
  if (split && p.fuse_dv_local && kn == 16 && rows16) return launch_split(p, offs, stream);
  // kDhuWgmmaAheadHalfPBox5 (session 13): half P (dv read: kDhuWgmmaAhead) with one 5-D box a chunk tile; kDhuAuto
  // (and kDhuWgmmaSplit at other widths) with the fused dv_local and 16-byte dh / dv2 rows since GPU run s13run1
  // (H200, bf16, HV = 32, K = V = 128, the same bits): B = 4 T = 8192 0.697 ms against 0.844 with the 8-column boxes
  // (kDhuWgmmaAheadHalfP, forced), B = 1 T = 32768 (16 columns) 1.792 against 2.170 (the split form, 1.666, runs
  // there). Dv read keeps the 8-column boxes (5-D: 0.967 against 0.921 ms at B = 4, 1.904 against 1.952 at B = 1).
  const bool box5 = p.mma_variant == kDhuWgmmaAheadHalfPBox5 ||
                    (p.fuse_dv_local && rows16 && (p.mma_variant == kDhuAuto || p.mma_variant == kDhuWgmmaSplit));
  const bool half_p = p.mma_variant == kDhuWgmmaAheadHalfP || box5 || split ||
                      (p.mma_variant == kDhuAuto && p.fuse_dv_local);
  if (half_p)
    return rows16 ? launch_cols<true, true, true>(p, kn, offs, stream, box5)
                  : launch_cols<true, true>(p, kn, offs, stream, box5);
  if (p.mma_variant == kDhuWgmmaAhead || p.mma_variant == kDhuAuto) return launch_cols<true, true>(p, kn, offs, stream);
  const bool tma = p.mma_variant == kDhuWgmmaTma;
  return tma ? launch_cols<true, false>(p, kn, offs, stream) : launch_cols<false, false>(p, kn, offs, stream);
}

}  // namespace strata::linear_attn
