// Hopper warpgroup-MMA kernel of chunk_bwd_dqkwg ("cuda.sm90.wgmma", bf16 token and state tensors, K = V = 128,
// chunk size 64; sm_90a). Persistent: one 384-thread block (three warpgroups) per SM walks the work items
// (chunk, q/k head h) blockIdx.x, + gridDim.x, ...; per item it visits the G value heads hv = h G + g in
// increasing g, each in four steps q over 32-row blocks of K (S, dS rows 32 q..32 q + 31), and sums dq, dk over
// the heads in f32 registers (no per-head workspace, no reduction pass; dγ is written directly, no per-K-tile
// partials). Per chunk and value head (S = h[c], dS = dh[c]), by warpgroup role:
//   dq group:  columns 32 q.. of dQh = dO Sᵀ (m64n32, V contracted in 8 slices of 16, every step); epilogue:
//              dQh ·= scale exp(γ), dQh += Ds K, q·dQh per row, dQ += dQh
//   dk group:  columns 32 q.. of dKh = Vn dSᵀ; epilogue: dKh ·= exp(γ_last − γ), Σ k·dK_int, dKh += Dsᵀ Q,
//              k·dKh per row, dK += dKh
//   ds group:  Ds += dO Vnᵀ (m64n64, V slices 2 q, 2 q + 1), columns 32 q.. of dW = dV Sᵀ, ⟨S, dS⟩;
//              epilogue: Ds = scale Lower(Ds ⊙ Γ) rounded into shared memory twice (as is: A of Ds K; transposed
//              by stmatrix.trans: A of Dsᵀ Q), dw = −dW out, then dγ_i = q_i·dQh_i − k_i·dKh_i
//              (+ exp(γ_last) ⟨S, dS⟩ + Σ k·dK_int on the last row) out.
// Named barriers hand Ds to the dq / dk groups and their row sums back. Loads (cp.async, issued by the ds group
// while its products run), every piece a whole 256-byte row: per value head dO, Vn, dV [64 t][128 v] (48 KiB,
// two buffers: the next head loads while this one computes), per step the rows of S, dS [32 k][128 v] (8 KiB
// contiguous each, a three-stage ring, step s + 2 requested at step s), across item boundaries; K-major
// no-swizzle core-matrix tiles (wgmma_layout.h). Each item's q, k [64][128] come with its first value head into
// their own buffer and are transposed (ldmatrix + stmatrix.trans) into Qᵀ, Kᵀ [128][64] at its first step.
// Every sum runs in a fixed order: the same bits every run, no atomics.
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"
#include "tile/cuda/tma_tile.cuh"
#include "tile/cuda/wgmma.cuh"
#include "tile/cuda/wgmma_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
namespace wg = ::strata::cuda::wgmma;
namespace mma = ::strata::cuda::mma;
using Bf = __nv_bfloat16;

// Three warpgroups: the dq group (dO Sᵀ, Ds K: all 128 K columns of dq), the dk group (Vn dSᵀ, Dsᵀ Q) and the
// ds group (dO Vnᵀ → Ds, dV Sᵀ → dw, ⟨S, dS⟩, dγ out), which also issues the loads.
constexpr int kThr = 384;
// setmaxnreg per thread: 2 x 176 + 152 = 3 x 168, the launch allocation (168 = 65536 / 384 rounded down to 8, what
// ptxas uses here); setmaxnreg.inc takes registers only from those the other warpgroups released to the CTA pool,
// so the increments must not exceed the decrements (else it blocks for ever). The host launches the kernel only
// when it was compiled to exactly kRegsLaunch registers (else the mma.sync kernel runs).
constexpr int kRegsLaunch = 168, kRegsDqk = 176, kRegsDs = 152;
static_assert(2 * (kRegsDqk - kRegsLaunch) <= kRegsLaunch - kRegsDs, "register increments within the decrements");
enum { kRoleDq = 0, kRoleDk = 1, kRoleDs = 2 };
// Named barriers: all threads (a step's stage ready), Ds ready (ds → dq, dk), row sums ready (dq, dk → ds).
// kBarDq (kFoldDq only): the dq group's 128 threads, its staged head sums written.
enum { kBarAll = 1, kBarDs = 2, kBarRows = 3, kBarDq = 4 };
constexpr int kQ = 4;  // steps (32-row blocks of K) per value head
constexpr int kRing = 3;  // S, dS ring depth: step s + 2 loads while step s computes
// Shared memory (bytes): two token buffers {dO, Vn, dV [64][128]}, kRing stages {S, dS rows [32][128]}, q, k
// [64][128] as loaded, Qᵀ, Kᵀ [128][64], Ds, Dsᵀ [64][64] (K-major core-matrix tiles), then f32 γ, scale exp(γ),
// exp(γ_last − γ) [64] each, row sums [2][64] and warp sums [16].
constexpr uint32_t kQK = 64 * 128 * 2, kT = 128 * 64 * 2, kDsB = 64 * 64 * 2, kSq = 32 * 128 * 2;
constexpr uint32_t kTokB = 3 * kQK, oTDo = 0, oTVn = kQK, oTDv = 2 * kQK, kStage = 2 * kSq, oStS = 0, oStDS = kSq;
constexpr uint32_t oRing = 2 * kTokB, oQ = oRing + kRing * kStage, oK = oQ + kQK, oQT = oK + kQK, oKT = oQT + kT,
                   oDs = oKT + kT, oDsT = oDs + kDsB, oF = oDsT + kDsB;
// Copy-engine form: mbarriers of the kRing stages and the two token buffers after the f32 values; the tiles at
// 1024-byte aligned offsets (the 128-byte swizzle atoms; the kernel aligns its base, hence the 1 KiB of slack).
constexpr uint32_t oBar = oF + (3 * 64 + 2 * 64 + 16) * sizeof(float);
constexpr size_t kSmem = oBar + (kRing + 2) * sizeof(uint64_t) + 1024;
static_assert(kSmem <= 227 * 1024, "shared memory of one block");
static_assert(kTokB % 1024 == 0 && kQK % 1024 == 0 && kSq % 1024 == 0 && oRing % 1024 == 0, "1024-byte atoms");

__device__ __forceinline__ float bf(uint16_t b) { return bf16_bits_to_f32(b); }

// One chunk of the problem: batch row b, first token t0, valid rows L (0: nothing to do, only with invalid
// cu_seqlens), index hc along h's chunk dimension.
struct ChunkAt {
  int64_t b, t0, hc;
  int L;
};
// Chunk ci of the flattened chunk list (fixed length: ci = b ceil(T / BT) + c; variable length: the position along h's chunk
// dimension, sequence n found by binary search in the chunk offsets).
__device__ __forceinline__ ChunkAt chunk_at(const Dims& d, const int64_t* offs, int64_t ci) {
  const int64_t BT = d.BT;
  if (!d.varlen()) {
    const int64_t per_row = d.chunks_per_row(), b = ci / per_row, c = ci - b * per_row, t0 = c * BT;
    if (c >= d.NT) return {b, t0, 0, 0};  // (h has fewer chunks than the rows: nothing to do)
    return {b, t0, c, static_cast<int>(t0 + BT < d.T ? BT : d.T - t0)};
  }
  if (ci >= offs[d.N]) return {0, 0, 0, 0};
  int64_t lo = 0, hi = d.N - 1;  // the last n with offs[n] <= ci (its offs[n + 1] > ci)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (offs[mid] <= ci) lo = mid;
    else hi = mid - 1;
  }
  const int64_t t0 = d.cu_at(lo) + (ci - offs[lo]) * BT, eos = d.cu_at(lo + 1);
  const int64_t t1 = t0 + BT < eos ? t0 + BT : eos;
  return {0, t0, ci, t1 > t0 ? static_cast<int>(t1 - t0) : 0};
}

// cp.async of a [kN][128] bf16 block into a tile_off<128> tile at shared byte address dst, by the 128 threads of
// the ds group (t = its thread index): segment q = (t / 8) % 16, rows r0 + 8 it with
// r0 = t % 8 (tile_off<128>(r0 + 8 it, c) moves by it rows of core matrices: 2048 bytes); the 128 threads read
// 8 whole rows (2 KiB) per `it`. src points at row 0, column 0, rs is the row stride; rows >= valid are
// zero-filled (not read).
template <int kN>
__device__ __forceinline__ void load128(int t, uint32_t dst, const uint16_t* src, int64_t rs, int valid) {
  const int q = (t >> 3) & 15, r0 = t & 7;
  const uint32_t d0 = dst + 2u * static_cast<uint32_t>(wg::tile_off<128>(r0, 8 * q));
  const uint16_t* s0 = src + 8 * q;
#pragma unroll
  for (int it = 0; it < kN / 8; ++it) {
    const int r = r0 + 8 * it;
    const bool ok = r < valid;
    ::strata::cuda::cp_async16(d0 + it * 2048u, ok ? s0 + r * rs : s0, ok);
  }
}
// Output stores of an m64nN accumulator a (N / 2 registers: rows i0 = 16 w + lane / 4 and i0 + 8, columns
// 8 j + 2 (lane % 4) + {0, 1}) times `sign`, rows < L, into out at element offset o0 (row 0, column 0) with row
// stride out.s[1]: one 4-byte (16-bit outputs) or 8-byte (f32) store per column pair, the dtype branch taken once.
template <int kDt, int N>
__device__ __forceinline__ void store_rows_t(const View& out, int64_t o0, int L, int w, int lane, const float (&a)[N / 2],
                                             float sign) {
  using E = std::conditional_t<kDt == STRATA_DTYPE_F32, float, uint16_t>;
  const int i0 = 16 * w + (lane >> 2);
  E* const base = static_cast<E*>(out.p) + o0 + 2 * (lane & 3);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = i0 + 8 * hh;
    if (i >= L) continue;
    E* const row = base + i * out.s[1];
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const float x0 = sign * a[4 * j + 2 * hh], x1 = sign * a[4 * j + 2 * hh + 1];
      if constexpr (kDt == STRATA_DTYPE_F32)
        *reinterpret_cast<float2*>(row + 8 * j) = make_float2(x0, x1);
      else if constexpr (kDt == STRATA_DTYPE_BF16)
        *reinterpret_cast<uint32_t*>(row + 8 * j) = mma::pack2<Bf>(x0, x1);
      else
        *reinterpret_cast<uint32_t*>(row + 8 * j) = mma::pack2<__half>(x0, x1);
    }
  }
}
template <int N>
__device__ __forceinline__ void store_rows(const View& out, int64_t o0, int L, int w, int lane, const float (&a)[N / 2],
                                           float sign) {
  if (out.dtype == STRATA_DTYPE_BF16) store_rows_t<STRATA_DTYPE_BF16, N>(out, o0, L, w, lane, a, sign);
  else if (out.dtype == STRATA_DTYPE_F16) store_rows_t<STRATA_DTYPE_F16, N>(out, o0, L, w, lane, a, sign);
  else store_rows_t<STRATA_DTYPE_F32, N>(out, o0, L, w, lane, a, sign);
}

// Descriptor of the 16-column K step ks of a [kRows][128] operand (dO, Vn, dV: kRows = 64; S, dS rows: 32) at
// shared byte address a: a K-major core-matrix tile (cp.async form) or two 128-byte-swizzled 64-column blocks
// (copy-engine form, kTma). The same products either way: the same bits.
template <bool kTma, int kRows>
__device__ __forceinline__ uint64_t op_desc(uint32_t a, int ks) {
  if constexpr (kTma) return wg::sw128_desc<kRows>(a, ks);
  else return wg::tile_desc<128>(a, ks);
}

// Columns 32 q..32 q + 31 of an m64n128 accumulator d (its registers 16 q..16 q + 15) = A Bᵀ, V = 128 contracted in
// 8 slices of 16 in increasing order (m64n32k16), A [64][128] and B [32][128] operand tiles (op_desc) at shared
// byte addresses a, b. q must be a compile-time constant after inlining (the step loop over q unrolled), so that
// the slice is fixed registers.
template <bool kTma>
__device__ __forceinline__ void slice_product(float (&d)[64], int q, uint32_t a, uint32_t b) {
#pragma unroll
  for (int qq = 0; qq < kQ; ++qq)
    if (qq == q) {
      float(&part)[16] = *reinterpret_cast<float(*)[16]>(&d[16 * qq]);
#pragma unroll
      for (int ks = 0; ks < 8; ++ks)
        wg::mma_ss<Bf, 32>(part, op_desc<kTma, 64>(a, ks), op_desc<kTma, 32>(b, ks), ks != 0);
    }
}

// Tensor maps of the copy-engine form (128-byte-swizzled boxes of 64 columns): dO, Vn, dV as (V, HV, T, B) with
// boxes of 64 tokens, h, dh as (V, K, HV, NT, B) with boxes of 32 rows of K.
// dq_rstd: the rows' rstd of the kFoldDq instantiation (the others do not read it; after the maps, so that their
// code is unchanged by it).
struct DqkwgMaps {
  CUtensorMap dout, v, dv, h, dh;
  View dq_rstd;
};

// What every role needs: the problem, shared memory and this block's walk over its items (chunk, q/k head h):
// items blockIdx.x + k gridDim.x, k < mine, each in `steps` = kQ G steps (global step gs = k steps + s).
struct Ctx {
  const DqkwgParams& p;
  const int64_t* offs;
  const DqkwgMaps* maps;  // (copy-engine form)
  unsigned char* smem;
  uint32_t sb;  // shared byte address of smem
  int64_t mine;
  int steps;
  bool want_dw, want_dg;
  __device__ int64_t item_of(int64_t k) const { return blockIdx.x + k * static_cast<int64_t>(gridDim.x); }
  __device__ ChunkAt chunk_of(int64_t k) const { return chunk_at(p.d, offs, item_of(k) / p.d.H); }
  __device__ int64_t head_of(int64_t k) const { return item_of(k) % p.d.H; }
  // mbarrier i of the copy-engine form: stage i < kRing, token buffer i - kRing
  __device__ uint64_t* bar(int i) const { return reinterpret_cast<uint64_t*>(smem + oBar) + i; }
};

// Copy-engine form: the phase parity each thread expects next of every mbarrier (bit i of bits), flipped by each
// wait (every stage and token buffer completes once per use, in use order). The ds group waits first, bounded (a
// bug traps rather than hangs); the dq / dk groups wait after it, at the next block barrier, unbounded (their
// phases are complete by then; the bound's register would cost them spills).
template <bool kBounded>
struct Phases {
  uint32_t bits = 0;
  __device__ __forceinline__ void wait(const Ctx& x, int i) {
    ::strata::cuda::tma::mbar_wait_ptx<kBounded>(x.sb + oBar + 8u * static_cast<uint32_t>(i), (bits >> i) & 1u);
    bits ^= 1u << i;
  }
};

// The ds group's load cursors: states() requests the S, dS rows of the next step (item k, step s, its stage; the
// item's chunk L and the first element of its S, dS (value head h G) set once per item), tokens() the dO, Vn, dV
// of the next value head (item kt, value head gt, buffer bt; with the item's q, k at its first head). Each call
// site commits one cp.async group per thread (empty past the block's last item).
// Copy-engine form (kTma): thread t = 0 of the group announces the bytes on the stage's / buffer's mbarrier and
// issues the boxes (two 64-column halves per tensor); q, k stay cp.async (their tiles are transposed by ldmatrix).
template <bool kTma>
struct Loader {
  int64_t k = 0;
  int s = 0, stage = 0, L = 0;
  const uint16_t *hs = nullptr, *dhs = nullptr;
  int cb = 0, chc = 0, chv = 0;  // (copy-engine form: the item's batch row, chunk and first value head)
  int64_t kt = 0;
  int gt = 0, bt = 0;
  __device__ __forceinline__ void load_qk(const Ctx& x, int t, const ChunkAt& c, int64_t h) const {
    const DqkwgParams& p = x.p;
    load128<64>(t, x.sb + oQ, static_cast<const uint16_t*>(p.q.p) + p.q.off(c.b, c.t0, h), p.q.s[1], c.L);
    load128<64>(t, x.sb + oK, static_cast<const uint16_t*>(p.k.p) + p.k.off(c.b, c.t0, h), p.k.s[1], c.L);
  }
  // Rows 32 (s % 4).. of S, dS of value head s / 4 into the cursor's stage, then advance.
  __device__ __forceinline__ void states(const Ctx& x, int t) {
    if (k < x.mine) {
      const DqkwgParams& p = x.p;
      if (s == 0) {
        const ChunkAt c = x.chunk_of(k);
        const int64_t hv0 = x.head_of(k) * p.d.G;
        L = c.L;  // (no chunk, L = 0: hc may lie past h's chunk dimension; nothing is read)
        if constexpr (kTma) {
          cb = static_cast<int>(c.b), chc = static_cast<int>(c.hc), chv = static_cast<int>(hv0);
        } else {
          hs = static_cast<const uint16_t*>(p.h.p) + p.h.off(c.b, c.hc, hv0, 0);
          dhs = static_cast<const uint16_t*>(p.dh.p) + p.dh.off(c.b, c.hc, hv0, 0);
        }
      }
      const int64_t g = s / kQ, r0 = 32 * (s % kQ);
      const uint32_t st = x.sb + oRing + static_cast<uint32_t>(stage) * kStage;
      if constexpr (kTma) {  // (the host takes this form only where every chunk is present: L > 0)
        if (t == 0) {
          const uint32_t bar = ::strata::cuda::smem_u32(x.bar(stage));
          wg::fence_proxy_async();  // the previous readers' generic reads (⟨S, dS⟩) before the async writes
          ::strata::cuda::mbar_arrive_expect_tx(x.bar(stage), kStage);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            namespace tma = ::strata::cuda::tma;
            tma::load_box5(st + oStS + hf * (kSq / 2), &x.maps->h, 64 * hf, static_cast<int>(r0),
                           chv + static_cast<int>(g), chc, cb, bar);
            tma::load_box5(st + oStDS + hf * (kSq / 2), &x.maps->dh, 64 * hf, static_cast<int>(r0),
                           chv + static_cast<int>(g), chc, cb, bar);
          }
        }
      } else {
        const int srows = L > 0 ? 32 : 0;
        load128<32>(t, st + oStS, hs + g * p.h.s[2] + r0 * p.h.s[3], p.h.s[3], srows);
        load128<32>(t, st + oStDS, dhs + g * p.dh.s[2] + r0 * p.dh.s[3], p.dh.s[3], srows);
      }
      if (++s == x.steps) s = 0, ++k;
      if (++stage == kRing) stage = 0;
    }
  }
  // dO, Vn, dV of the token cursor's value head into its buffer (q, k with the item's first head).
  __device__ __forceinline__ void tokens(const Ctx& x, int t) {
    if (kt < x.mine) {
      const DqkwgParams& p = x.p;
      const ChunkAt c = x.chunk_of(kt);
      const int64_t h = x.head_of(kt), hv = h * p.d.G + gt;
      const uint32_t b = x.sb + static_cast<uint32_t>(bt) * kTokB;
      if constexpr (kTma) {
        if (t == 0) {
          uint64_t* const bp = x.bar(kRing + bt);
          const uint32_t bar = ::strata::cuda::smem_u32(bp);
          wg::fence_proxy_async();
          ::strata::cuda::mbar_arrive_expect_tx(bp, (x.want_dw ? 3u : 2u) * kQK);
          const int ih = static_cast<int>(hv), it0 = static_cast<int>(c.t0), ib = static_cast<int>(c.b);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            namespace tma = ::strata::cuda::tma;
            tma::load_box(b + oTDo + hf * (kQK / 2), &x.maps->dout, 64 * hf, ih, it0, ib, bar);
            tma::load_box(b + oTVn + hf * (kQK / 2), &x.maps->v, 64 * hf, ih, it0, ib, bar);
            if (x.want_dw) tma::load_box(b + oTDv + hf * (kQK / 2), &x.maps->dv, 64 * hf, ih, it0, ib, bar);
          }
        }
      } else {
        load128<64>(t, b + oTDo, static_cast<const uint16_t*>(p.dout.p) + p.dout.off(c.b, c.t0, hv), p.dout.s[1],
                    c.L);
        load128<64>(t, b + oTVn, static_cast<const uint16_t*>(p.v.p) + p.v.off(c.b, c.t0, hv), p.v.s[1], c.L);
        if (x.want_dw)
          load128<64>(t, b + oTDv, static_cast<const uint16_t*>(p.dv.p) + p.dv.off(c.b, c.t0, hv), p.dv.s[1], c.L);
      }
      if (gt == 0) load_qk(x, t, c, h);
      if (++gt == p.d.G) gt = 0, ++kt;
      bt ^= 1;
    }
  }
};

// kFoldDq (session 16; chunk_bwd_dqkwg_cuda_wgmma_dq_norm): the item's dq (the head sum, f32 sum[64] in the
// accumulator layout) through the l2norm backward, dq = rstd (dq − qn (qn · dq)) with qn the item's q (the kernel's
// q input: the normalized q of the composed backward), written once in bf16 — instead of an f32 dq that row_norm_bwd
// reads back. The session-15 form did this in registers inside the epilogue (1.77 ms against 1.61 for the plain
// kernel + row_norm_bwd, and the plain kernel's code changed with it); this is the staged form that won for
// prepare_wy_repr_bwd's dk (kWyFinStaged): the rows staged in shared memory, then four threads per row.
// The staging area is the token buffer `dead` (48 KiB; f32 [64][136], 34 KiB used): its last readers, the three
// groups' step-3 products of the item's last value head, are complete once this group passed that head's kBarDs
// (all 384 threads meet there), and the ds group issues its next loads into it only after the next kBarAll, which
// this group reaches after this function (its reads done: their values feed the stores issued before it; the
// issuing thread fences the async proxy before the copy, as for the ds group's own reads of the stages). qn comes
// from Qᵀ (rewritten by this group only, at the next item's first step). Rows of a pass: warp w, quad j → row
// 32 pass + 8 w + (j & 4 | (j & 1) << 1 | (j >> 1) & 1) (the two quads of a quarter-warp two rows apart: their
// float4 reads of the padded rows hit 32 distinct banks); thread q of the quad takes columns 4 q + 16 m, m < 8 (a
// quad: 32 contiguous bytes of bf16 dq per m). The output dtype is fixed (bf16): the phase in three dtype copies, or
// with a dtype branch at each store, made ptxas serialise the kernel's wgmma (C7511).
__device__ __forceinline__ void store_dq_norm_staged(const Ctx& x, const View& rstd, const ChunkAt& c, int64_t h,
                                                     int w, int lane, const float (&sum)[64], uint32_t dead) {
  constexpr int ld = 136;  // f32 row stride: the accumulator's float2 writes of a half-warp hit 32 distinct banks
  float* const sF = reinterpret_cast<float*>(x.smem + dead);
  const uint16_t* const qt = reinterpret_cast<const uint16_t*>(x.smem + oQT);
  const DqkwgParams& p = x.p;
  const int j = lane >> 2, q = lane & 3, L = c.L;
  const int r0 = 8 * w + ((j & 4) | ((j & 1) << 1) | ((j >> 1) & 1));
#pragma unroll
  for (int u = 0; u < 64; u += 2) {
    const int i = wg::acc_row(w, lane, u & 3), col = wg::acc_col(lane, u >> 2, u & 3);
    *reinterpret_cast<float2*>(sF + i * ld + col) = make_float2(sum[u], sum[u + 1]);
  }
  wg::bar_sync(kBarDq, 128);
#pragma unroll 1
  for (int ps = 0; ps < 2; ++ps) {
    const int i = 32 * ps + r0;
    if (i >= L) continue;  // (whole quads)
    const float r = static_cast<const float*>(rstd.p)[rstd.off(c.b, c.t0 + i, h)];  // (f32: the reject)
    const float* const srow = sF + i * ld + 4 * q;
    // column 4 q + 16 m + e of row i: qrow + tile_off<64>(16 m + e, 0) (4 q + e < 8 stays in one core matrix row)
    const uint16_t* const qrow = qt + wg::tile_off<64>(4 * q, i);
    float dot = 0.f;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const float4 v = *reinterpret_cast<const float4*>(srow + 16 * m);
      const float y[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) dot += y[e] * bf(qrow[wg::tile_off<64>(16 * m + e, 0)]);
    }
    const unsigned quad = 0xfu << (lane & 28);
    dot += __shfl_xor_sync(quad, dot, 1);
    dot += __shfl_xor_sync(quad, dot, 2);
    uint16_t* const row = static_cast<uint16_t*>(p.dq.p) + p.dq.off(c.b, c.t0 + i, h) + 4 * q;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const float4 v = *reinterpret_cast<const float4*>(srow + 16 * m);
      const float y[4] = {v.x, v.y, v.z, v.w};
      float o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = r * (y[e] - dot * bf(qrow[wg::tile_off<64>(16 * m + e, 0)]));
      *reinterpret_cast<uint2*>(row + 16 * m) = make_uint2(mma::pack2<Bf>(o[0], o[1]), mma::pack2<Bf>(o[2], o[3]));
    }
  }
}

// The dq (kRole = kRoleDq) or dk group: the item's q or k transposed, its product every step, its epilogue per
// value head, dq / dk out per item (kFoldDq: dq through its l2norm backward, store_dq_norm_staged; rstd: its rows).
template <bool kTma, int kRole, bool kFoldDq>
__device__ __forceinline__ void run_dqk(const Ctx& x) {
  constexpr bool kDq = kRole == kRoleDq;
  const DqkwgParams& p = x.p;
  const int tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3;
  const uint32_t sb = x.sb;
  const float* const fac = reinterpret_cast<const float*>(x.smem + oF) + (kDq ? 64 : 128);  // sEq or sEk
  float* const sRow = reinterpret_cast<float*>(x.smem + oF) + 192;
  float* const sRed = sRow + 128;
  // q (dq group) or k (dk group) values for the row sums: Xᵀ [128][64]
  const uint16_t* const xt = reinterpret_cast<const uint16_t*>(x.smem + (kDq ? oQT : oKT));
  const uint16_t* const kt = reinterpret_cast<const uint16_t*>(x.smem + oKT);
  float acc[64], sum[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = sum[i] = 0.f;
  int stage = 0, hb = 0;  // ring stage of this step, token buffer of this value head
  Phases<false> ph;
  for (int64_t k = 0; k < x.mine; ++k) {
    for (int g = 0; g < x.p.d.G; ++g)
#pragma unroll  // (q known at compile time: the accumulator slices are fixed registers)
    for (int q = 0; q < kQ; ++q) {
      const int s = g * kQ + q;
      wg::bar_sync(kBarAll, kThr);  // this step's stage loaded and visible (the ds group waited and fenced)
      if (s == 0) {  // this item's q (dq group) or k (dk group) → Qᵀ or Kᵀ (the previous item's readers are done)
        wg::transpose_tile<64, 128, 4>(w, x.smem + (kDq ? oQ : oK), sb + (kDq ? oQT : oKT));  // X [64 t][128] → Xᵀ
        wg::fence_proxy_async();
        wg::bar_sync(kBarAll, kThr);  // Qᵀ, Kᵀ visible; the q, k buffer is free for the next item's loads
      }
      if constexpr (kTma) {  // (complete already: the ds group waited before the barrier; this thread observes it)
        ph.wait(x, stage);
        if (q == 0) ph.wait(x, kRing + hb);
      }
      const uint32_t st = sb + oRing + static_cast<uint32_t>(stage) * kStage;
      if (++stage == kRing) stage = 0;
      wg::reg_fence(acc);
      wg::wg_fence();
      // columns 32 q.. of dQh (dO S_qᵀ) or dKh (Vn dS_qᵀ)
      slice_product<kTma>(acc, q, sb + static_cast<uint32_t>(hb) * kTokB + (kDq ? oTDo : oTVn), st + (kDq ? oStS : oStDS));
      wg::wg_commit();
      wg::wg_wait<0>();
      wg::reg_fence(acc);
      if (q != kQ - 1) continue;
      hb ^= 1;  // (the next value head's tokens are in the other buffer)

      // ---- epilogue of value head g (the row factors were written at step (g, 1), visible since) ----
      float kdki = 0.f;
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int r = wg::acc_row(w, lane, i & 3);
        acc[i] *= fac[r];
        if (!kDq) kdki += bf(kt[wg::tile_off<64>(wg::acc_col(lane, i >> 2, i & 3), r)]) * acc[i];
      }
      if (!kDq) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) kdki += __shfl_xor_sync(0xffffffffu, kdki, o);
        if (lane == 0) sRed[4 + w] = kdki;
      }
      wg::bar_sync(kBarDs, kThr);  // Ds, Dsᵀ from the ds group
      wg::reg_fence(acc);
      wg::wg_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wg::mma_ss<Bf, 128>(acc, wg::tile_desc<64>(sb + (kDq ? oDs : oDsT), ks),
                            wg::tile_desc<64>(sb + (kDq ? oKT : oQT), ks), 1);
      wg::wg_commit();
      wg::wg_wait<0>();
      wg::reg_fence(acc);
      if (x.want_dg) {
        float part[2] = {0.f, 0.f};  // rows acc_row(w, lane, 0) and + 8 over this thread's 32 columns
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const int r = wg::acc_row(w, lane, i & 3), col = wg::acc_col(lane, i >> 2, i & 3);
          part[(i & 3) >> 1] += bf(xt[wg::tile_off<64>(col, r)]) * acc[i];
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          part[r] += __shfl_xor_sync(0xffffffffu, part[r], 1);
          part[r] += __shfl_xor_sync(0xffffffffu, part[r], 2);
        }
        if ((lane & 3) == 0) {
          const int r = 16 * w + (lane >> 2);
          sRow[kRole * 64 + r] = part[0];
          sRow[kRole * 64 + r + 8] = part[1];
        }
      }
      wg::bar_arrive(kBarRows, kThr);
#pragma unroll
      for (int i = 0; i < 64; ++i) sum[i] += acc[i];
    }
    // ---- the item's dq or dk (summed over its value heads) ----
    const ChunkAt c = x.chunk_of(k);
    const int64_t h = x.head_of(k);
    const View& out = kDq ? p.dq : p.dk;
    if constexpr (kFoldDq && kDq)  // (the token buffer of the item's last value head: hb flipped after it)
      store_dq_norm_staged(x, x.maps->dq_rstd, c, h, w, lane, sum, static_cast<uint32_t>(hb ^ 1) * kTokB);
    else
      store_rows<128>(out, out.off(c.b, c.t0, h), c.L, w, lane, sum, 1.f);
#pragma unroll
    for (int i = 0; i < 64; ++i) sum[i] = 0.f;
  }
}

// The ds group: the loads (cp.async ring), Ds and dW every step, γ and ⟨S, dS⟩; its epilogue
// per value head (Ds out to shared memory, dw, dγ).
template <bool kTma, bool kBoundedWait>
__device__ __forceinline__ void run_ds(const Ctx& x) {
  const DqkwgParams& p = x.p;
  const int tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3, t = tid - 2 * 128;
  const uint32_t sb = x.sb;
  float* const sG = reinterpret_cast<float*>(x.smem + oF);
  float* const sEq = sG + 64;    // scale exp(γ_i) on valid rows, 0 past L
  float* const sEk = sG + 128;   // exp(γ_last − γ_i) on valid rows, 0 past L
  const float* const sRow = sG + 192;
  float* const sRed = sG + 320;
  Loader<kTma> ld;
  Phases<kBoundedWait> ph;
  ld.tokens(x, t);  // value head 0 (and the first item's q, k) with step 0's rows
#pragma unroll 1
  for (int i = 0; i < kRing - 1; ++i) {
    ld.states(x, t);
    ::strata::cuda::cp_async_commit();
  }
  float dw[64], ds[32];
#pragma unroll
  for (int i = 0; i < 64; ++i) dw[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) ds[i] = 0.f;
  float sds = 0.f;                        // this thread's share of ⟨S, dS⟩ of the current head
  float2 gam = make_float2(0.f, 0.f);     // γ_t, γ_last of the current head (threads t < 64)
  int stage = 0, hb = 0;  // as in run_dqk
  for (int64_t k = 0; k < x.mine; ++k) {
    const ChunkAt c = x.chunk_of(k);
    const int64_t h = x.head_of(k);
    for (int g = 0; g < x.p.d.G; ++g)
#pragma unroll  // (q known at compile time: the accumulator slices are fixed registers)
    for (int q = 0; q < kQ; ++q) {
      const int s = g * kQ + q;
      const int64_t hv = h * p.d.G + g;
      // This step's group is complete (the younger one, step s + 1's, may be in flight; the token group of this
      // value head is older).
      ::strata::cuda::cp_async_wait<kRing - 2>();
      if constexpr (kTma) {  // this step's S, dS rows (and at its first step the value head's tokens) landed
        ph.wait(x, stage);
        if (q == 0) {
          ph.wait(x, kRing + hb);
          // Rows L.. of a partial chunk: zeros, as the cp.async form's zero fill (the boxes read the next packed
          // sequence's tokens there; rows past T come zero-filled already): 8 16-byte pieces per 128-byte row of
          // each 64-column half of dO, Vn, dV (fenced for the products with the stage below).
          // (unrolled, predicated: a loop here costs the products their register allocation, ptxas C7511)
          if (c.L < 64) {
            unsigned char* const tb = x.smem + static_cast<uint32_t>(hb) * kTokB + (t & 7) * 16;
#pragma unroll
            for (int pass = 0; pass < 4; ++pass) {
              const int r = c.L + 16 * pass + (t >> 3);
              if (r < 64)
#pragma unroll
                for (int half = 0; half < 6; ++half)
                  *reinterpret_cast<uint4*>(tb + half * (kQK / 2) + r * 128) = make_uint4(0, 0, 0, 0);
            }
          }
        }
      }
      // Generic-proxy writes that the products read: the cp.async form's loads, the zero fill of a partial chunk. The
      // copy engine's writes are async-proxy already: that form fences only after a zero fill (session 13: the
      // per-step fence, a MEMBAR of this group's outstanding stores, cost ~2 % at the bench shape).
      if (!kTma || (q == 0 && c.L < 64)) wg::fence_proxy_async();
      wg::bar_sync(kBarAll, kThr);  // this stage visible to all; the previous step's readers are done
      if (s == 0) wg::bar_sync(kBarAll, kThr);  // the dq and dk groups' transposes of q, k into Qᵀ, Kᵀ
      const uint32_t st = sb + oRing + static_cast<uint32_t>(stage) * kStage;
      if (++stage == kRing) stage = 0;
      // The loads: step gs + 2's rows into the stage the previous step used, at q = 0 the next value head into the
      // buffer the previous head used (cp.async form: while this group's products run; copy-engine form: before
      // them, so that the issuing thread's addressing is not live across the asynchronous products).
      auto issue_loads = [&] {
        ld.states(x, t);
        if (q == 0) ld.tokens(x, t);
        ::strata::cuda::cp_async_commit();
      };
      if constexpr (kTma) issue_loads();
      wg::reg_fence(dw), wg::reg_fence(ds);
      wg::wg_fence();
      {  // Ds: V slices 2 q, 2 q + 1 of dO Vnᵀ; dW: columns 32 q.. (dV S_qᵀ)
        const uint32_t tb = sb + static_cast<uint32_t>(hb) * kTokB;
#pragma unroll
        for (int k2 = 0; k2 < 2; ++k2) {
          const int ks = 2 * q + k2;
          wg::mma_ss<Bf, 64>(ds, op_desc<kTma, 64>(tb + oTDo, ks), op_desc<kTma, 64>(tb + oTVn, ks), ks != 0);
        }
        // (without dv the dW product runs on a stale buffer and is not stored: no branch between the products)
        slice_product<kTma>(dw, q, tb + oTDv, st + oStS);
      }
      wg::wg_commit();
      if constexpr (!kTma) issue_loads();
      // While the products run: this head's γ (requested at its first step, stored at the second, so that the
      // load's latency overlaps a step), ⟨S, dS⟩ over this stage (the same layout for both tiles).
      if (q == 0) {
        sds = 0.f;
        const bool gate = p.g.present() && t < c.L;  // (t < L <= 64)
        gam = make_float2(gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + t, hv)) : 0.f,
                          gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + c.L - 1, hv)) : 0.f);
      } else if (q == 1 && t < 64) {
        sG[t] = gam.x;
        sEq[t] = t < c.L ? p.scale * expf(gam.x) : 0.f;
        sEk[t] = t < c.L ? expf(gam.y - gam.x) : 0.f;
      }
      if (x.want_dg) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          // 16-byte segment (row 8 j + t % 8, columns 8 (t / 8)..) of both tiles, in either layout: the same
          // elements in the same order (the same bits in both forms)
          const uint32_t e = kTma ? wg::sw128_seg<32>(8 * j + (t & 7), t >> 3) : static_cast<uint32_t>(t + 128 * j) * 16u;
          const uint4 a4 = *reinterpret_cast<const uint4*>(x.smem + (st - sb) + oStS + e);
          const uint4 b4 = *reinterpret_cast<const uint4*>(x.smem + (st - sb) + oStDS + e);
          const uint32_t a32[4] = {a4.x, a4.y, a4.z, a4.w}, b32[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float2 fa = mma::unpack2<Bf>(a32[u]), fb = mma::unpack2<Bf>(b32[u]);
            sds += fa.x * fb.x;
            sds += fa.y * fb.y;
          }
        }
      }
      wg::wg_wait<0>();
      wg::reg_fence(dw), wg::reg_fence(ds);
      if (q != kQ - 1) continue;
      hb ^= 1;

      // ---- epilogue of value head g: Ds (gated, scaled, on and below the diagonal of valid rows) → Ds, Dsᵀ ----
      // (sG of this head was written at step (g, 1) by this group, visible since the barriers after it)
      const int L = c.L;
      const float gl = L > 0 ? sG[L - 1] : 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int i = wg::acc_row(w, lane, e), col = wg::acc_col(lane, j, e), u = 4 * j + e;
          float v0 = 0.f, v1 = 0.f;
          if (i < L && col <= i) {
            const float gi = sG[i];
            v0 = p.scale * ds[u] * expf(gi - sG[col]);
            if (col + 1 <= i) v1 = p.scale * ds[u + 1] * expf(gi - sG[col + 1]);
          }
          ds[u] = v0, ds[u + 1] = v1;
          *reinterpret_cast<uint32_t*>(x.smem + oDs + 2 * wg::tile_off<64>(i, col)) = mma::pack2<Bf>(v0, v1);
        }
      wg::stmatrix_acc_trans<64, 64>(sb + oDsT, 16 * w, lane, ds);  // Dsᵀ [64][64], bf16
      wg::fence_proxy_async();
      wg::bar_arrive(kBarDs, kThr);  // Ds, Dsᵀ ready for the dq and dk groups
      if (x.want_dw) store_rows<128>(p.dw, p.dw.off(c.b, c.t0, hv), L, w, lane, dw, -1.f);
      float v = sds;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) sRed[8 + w] = v;
      wg::bar_sync(kBarRows, kThr);  // the dq and dk groups' row sums and Σ k·dK_int; this group's ⟨S, dS⟩ sums
      if (x.want_dg && t < L) {
        float r = sRow[t] - sRow[64 + t];
        if (t == L - 1) {
          const float sds_sum = (sRed[8] + sRed[9]) + (sRed[10] + sRed[11]);
          const float kdki_sum = (sRed[4] + sRed[5]) + (sRed[6] + sRed[7]);
          r += expf(gl) * sds_sum + kdki_sum;
        }
        st_f32(p.dg, p.dg.off(c.b, c.t0 + t, hv), r);
      }
    }
  }
}

// kTma: the copy-engine form (dO, Vn, dV, S, dS by 128-byte-swizzled boxes on mbarriers; maps used only there).
// kBoundedWait: the ds group's mbarrier waits trap after 2^24 polls (the cp.async form, and the copy-engine form
// forced by kDqkwgWgmmaBoundedWait: a debugging aid that turns a hang into a trap; the counter costs 52 bytes of
// spills); false: plain waits, no spills — the copy-engine form's automatic choice since session 14 (s14run2, H200,
// bf16 B=4 T=8192 H=16 HV=32 K=V=128 with dv, dw, dg: 1.213 / 1.209 ms against 1.341 / 1.323 bounded, the same
// bits; the dq / dk groups' waits were always unbounded).
// kFoldDq (with kTma, unbounded waits only; session 16): dq through its l2norm backward (store_dq_norm_staged),
// maps.dq_rstd its rows' rstd f32 [B, T, H].
template <bool kTma, bool kBoundedWait, bool kFoldDq = false>
__global__ void __launch_bounds__(kThr, 1)
    dqkwg_wgmma_kernel(DqkwgParams p, const int64_t* offs, int64_t items, const __grid_constant__ DqkwgMaps maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host entry launches this kernel only on sm_90 devices of an sm_90a build)
#else
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // (the 128-byte swizzle atoms need 1024-byte alignment: kSmem has the slack)
  unsigned char* const smem = smem_raw + ((1024u - (::strata::cuda::smem_u32(smem_raw) & 1023u)) & 1023u);
  const int64_t mine = items > blockIdx.x ? (items - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const Ctx x{p, offs, &maps, smem, ::strata::cuda::smem_u32(smem), mine,
              static_cast<int>(kQ * p.d.G), p.dw.present() && p.dv.present(), p.dg.present()};
  if constexpr (kTma) {
    if (threadIdx.x == 0)
      for (int i = 0; i < kRing + 2; ++i) ::strata::cuda::mbar_init(x.bar(i), 1);
    __syncthreads();
  }
  const int role = threadIdx.x >> 7;
  // Registers (2 kRegsDqk + kRegsDs = 3 x 168): the dq and dk groups hold 128 accumulators a thread, the ds group
  // 96 and the load cursor and addressing.
  if (role == kRoleDs) {
    wg::setmaxnreg_dec<kRegsDs>();
    run_ds<kTma, kBoundedWait>(x);
  } else {
    wg::setmaxnreg_inc<kRegsDqk>();
    if (role == kRoleDq) run_dqk<kTma, kRoleDq, kFoldDq>(x);
    else run_dqk<kTma, kRoleDk, false>(x);
  }
#endif
}

bool aligned16(const View& v) { return (reinterpret_cast<uintptr_t>(v.p) & 15u) == 0; }

// The copy-engine form's tensor maps, where it applies: every chunk of a fixed-length batch present in h, dh (the
// form loads the S, dS rows of every item), coordinates within int, the driver's encoder available. False: the
// cp.async form.
bool make_maps(const DqkwgParams& p, bool want_dw, DqkwgMaps* m) {
  const Dims& d = p.d;
  if ((!d.varlen() && d.NT < d.chunks_per_row()) || d.T > (int64_t{1} << 30) || d.B > (int64_t{1} << 30) ||
      d.NT > (int64_t{1} << 30))
    return false;
  namespace tma = ::strata::cuda::tma;
  auto tok = [&](CUtensorMap* x, const View& v) {
    const int64_t dims[4] = {128, d.HV, d.T, d.B}, st[3] = {v.s[2], v.s[1], v.s[0]};
    const uint32_t box[4] = {64, 1, 64, 1};
    return tma::encode_sw128_map(x, v.p, 4, dims, st, box);
  };
  auto state = [&](CUtensorMap* x, const View& v) {
    const int64_t dims[5] = {128, 128, d.HV, d.NT, d.B}, st[4] = {v.s[3], v.s[2], v.s[1], v.s[0]};
    const uint32_t box[5] = {64, 32, 1, 1, 1};
    return tma::encode_sw128_map(x, v.p, 5, dims, st, box);
  };
  return tok(&m->dout, p.dout) && tok(&m->v, p.v) && (!want_dw || tok(&m->dv, p.dv)) && state(&m->h, p.h) &&
         state(&m->dh, p.dh);
}

// The kernel instantiations and the register count each was compiled to (the host runs one only when that is
// kRegsLaunch, which its setmaxnreg split assumes).
using KernelFn = void (*)(DqkwgParams, const int64_t*, int64_t, DqkwgMaps);
struct KernelForm {
  KernelFn fn;
  int (*regs)();
};
template <bool kTma, bool kBoundedWait, bool kFoldDq>
KernelForm kernel_form_of() {
  return {dqkwg_wgmma_kernel<kTma, kBoundedWait, kFoldDq>, [] {
            static const int regs = [] {
              cudaFuncAttributes fa{};
              return cudaFuncGetAttributes(&fa, dqkwg_wgmma_kernel<kTma, kBoundedWait, kFoldDq>) == cudaSuccess
                         ? fa.numRegs
                         : 0;
            }();
            return regs;
          }};
}
// The one map from (form, mma_variant, folded dq) to the instantiation: the cp.async form (bounded waits); the
// copy-engine form with the ds group's waits unbounded (the automatic choice since session 14), bounded where
// kDqkwgWgmmaBoundedWait forces them, or with dq's l2norm backward folded (kFoldDq: unbounded waits).
KernelForm kernel_form(bool tma, int variant, bool fold_dq) {
  if (!tma) return kernel_form_of<false, true, false>();
  if (fold_dq) return kernel_form_of<true, false, true>();
  return variant == kDqkwgWgmmaBoundedWait ? kernel_form_of<true, true, false>() : kernel_form_of<true, false, false>();
}

// Column pairs stored by one 4-byte (16-bit) or 8-byte (f32) access: even row strides, pointer aligned to a pair.
bool pair_aligned(const View& v) {
  const uintptr_t a = v.dtype == STRATA_DTYPE_F32 ? 8u : 4u;
  return (reinterpret_cast<uintptr_t>(v.p) & (a - 1)) == 0 && ((v.s[0] | v.s[1] | v.s[2]) & 1) == 0;
}
// Inputs 16-byte aligned, outputs aligned to a column pair (else the mma.sync kernel runs).
bool views_aligned(const DqkwgParams& p) {
  bool ok = true;
  for (const View* v : {&p.q, &p.k, &p.v, &p.dout, &p.h, &p.dh, &p.dv}) ok = ok && (!v->present() || aligned16(*v));
  for (const View* v : {&p.dq, &p.dk, &p.dw}) ok = ok && (!v->present() || pair_aligned(*v));
  return ok;
}

// The copy-engine form runs for p (its maps filled): the automatic choice (session 12: 1.36 against 1.75 ms at
// the bench shape, the same bits) unless mma_variant forces the cp.async form; compiled to kRegsLaunch, maps made.
// fold_dq: the kFoldDq instantiation's register count is the one checked.
bool copy_engine_form(const DqkwgParams& p, bool fold_dq, DqkwgMaps* maps) {
  return p.mma_variant != kDqkwgWgmmaCpAsync && kernel_form(true, p.mma_variant, fold_dq).regs() == kRegsLaunch &&
         make_maps(p, p.dw.present() && p.dv.present(), maps);
}

// Persistent launch of instantiation f: one block per SM (at most one per item).
int launch(const DqkwgParams& p, KernelFn f, bool tma, const DqkwgMaps& maps, void* workspace, cudaStream_t stream) {
  const Dims& d = p.d;
  int64_t* offs = static_cast<int64_t*>(workspace);
  // Work items (chunk, q/k head): fixed length B ceil(T / BT) chunks, variable length NT (h's chunk dimension).
  const int64_t items = (d.varlen() ? d.NT : d.B * d.chunks_per_row()) * d.H;
  if (items == 0) return STRATA_SUCCESS;
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  STRATA_CUDA_TRY(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  int dev = 0, sms = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&dev));
  STRATA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t blocks = std::min<int64_t>(items, std::max(sms, 1));  // persistent: one block per SM
  f<<<static_cast<unsigned>(blocks), kThr, kSmem, stream>>>(p, offs, items, maps);
  return cuda::check_launch(!tma                   ? "chunk_bwd_dqkwg (wgmma)"
                            : maps.dq_rstd.present() ? "chunk_bwd_dqkwg (wgmma, copy engine, dq l2norm backward)"
                                                : "chunk_bwd_dqkwg (wgmma, copy engine)");
}

}  // namespace

std::string chunk_bwd_dqkwg_cuda_wgmma_reject(const DqkwgParams& p) {
  const Dims& d = p.d;
  for (const View* v : {&p.q, &p.k, &p.v, &p.dout, &p.h, &p.dh})
    if (v->dtype != STRATA_DTYPE_BF16) return "takes bf16 q, k, v, do, h, dh (and dv)";
  if (p.dv.present() && p.dv.dtype != STRATA_DTYPE_BF16) return "takes bf16 q, k, v, do, h, dh (and dv)";
  if (d.K != 128 || d.V != 128 || d.BT != 64) return "needs K = V = 128 and chunk size 64";
  // 16-byte row segments: every outer stride a multiple of 8 elements (pointers are checked at run time).
  auto strides8 = [](const View& v, int n) {
    for (int i = 0; i < n; ++i)
      if (v.s[i] % 8 != 0) return false;
    return true;
  };
  if (!strides8(p.q, 3) || !strides8(p.k, 3) || !strides8(p.v, 3) || !strides8(p.dout, 3) || !strides8(p.h, 4) ||
      !strides8(p.dh, 4) || (p.dv.present() && !strides8(p.dv, 3)))
    return "needs strides that are multiples of 8 elements";
  return "";
}

bool chunk_bwd_dqkwg_cuda_wgmma_copy_engine(const DqkwgParams& p) {
  DqkwgMaps maps{};
  return chunk_bwd_dqkwg_cuda_wgmma_reject(p).empty() && views_aligned(p) && copy_engine_form(p, false, &maps);
}

// Workspace: the chunk offsets (the kernel's only use), or the mma.sync kernel's when it runs instead (unaligned).
size_t chunk_bwd_dqkwg_cuda_wgmma_workspace(const Dims& d) { return chunk_bwd_dqkwg_cuda_mma_workspace(d); }

int chunk_bwd_dqkwg_cuda_wgmma(const DqkwgParams& p, void* workspace, void* stream_ptr) {
  const std::string why = chunk_bwd_dqkwg_cuda_wgmma_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_bwd_dqkwg cuda.sm90.wgmma: {}", why);
  // Inputs not 16-byte aligned or outputs not aligned to a column pair (views at odd offsets): the mma.sync
  // kernel, which copies them element-wise. So too if the kernel was not compiled to the register count that its
  // setmaxnreg split assumes (kRegsLaunch). The copy-engine form where make_maps accepts p (unless mma_variant =
  // kDqkwgWgmmaCpAsync), else the cp.async form.
  DqkwgMaps maps{};
  const bool tma = views_aligned(p) && copy_engine_form(p, false, &maps);
  const KernelForm f = kernel_form(tma, p.mma_variant, false);
  if (!tma && !(views_aligned(p) && f.regs() == kRegsLaunch)) {
    DqkwgParams pm = p;
    pm.mma_variant = kDqkwgTwoPerSm;
    return chunk_bwd_dqkwg_cuda_mma(pm, workspace, stream_ptr);
  }
  return launch(p, f.fn, tma, maps, workspace, static_cast<cudaStream_t>(stream_ptr));
}

std::string chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(const DqkwgParams& p, const View& dq_rstd) {
  std::string why = chunk_bwd_dqkwg_cuda_wgmma_reject(p);
  if (!why.empty()) return why;
  if (!dq_rstd.present() || dq_rstd.dtype != STRATA_DTYPE_F32) return "dq_rstd: f32 [B, T, H] required";
  if (p.dq.dtype != STRATA_DTYPE_BF16) return "the folded dq is written in bf16 only";
  if (p.mma_variant != kDqkwgAuto && p.mma_variant != kDqkwgWgmma && p.mma_variant != kDqkwgWgmmaTma &&
      p.mma_variant != kDqkwgWgmmaUnboundedWait)
    return fmt::format("the folded dq runs the copy-engine form with unbounded waits only, not variant {}",
                       p.mma_variant);
  // The staged rows go out as 8-byte pieces of 4 columns.
  if (((p.dq.s[0] | p.dq.s[1] | p.dq.s[2]) & 3) != 0) return "dq needs strides that are multiples of 4 elements";
  return "";
}

bool chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs(const DqkwgParams& p, const View& dq_rstd) {
  DqkwgMaps maps{};
  return chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(p, dq_rstd).empty() && views_aligned(p) &&
         (reinterpret_cast<uintptr_t>(p.dq.p) & 7u) == 0 && copy_engine_form(p, true, &maps);
}

int chunk_bwd_dqkwg_cuda_wgmma_dq_norm(const DqkwgParams& p, const View& dq_rstd, void* workspace, void* stream_ptr) {
  if (!chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs(p, dq_rstd)) {
    const std::string why = chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(p, dq_rstd);
    return fail(STRATA_ERROR_UNSUPPORTED, "chunk_bwd_dqkwg cuda.sm90.wgmma with dq_rstd: {}",
                why.empty() ? "tensors not aligned for the copy-engine form, or its tensor maps not made" : why);
  }
  DqkwgMaps maps{};
  copy_engine_form(p, true, &maps);
  maps.dq_rstd = dq_rstd;
  return launch(p, kernel_form(true, p.mma_variant, true).fn, true, maps, workspace,
                static_cast<cudaStream_t>(stream_ptr));
}

}  // namespace strata::linear_attn
