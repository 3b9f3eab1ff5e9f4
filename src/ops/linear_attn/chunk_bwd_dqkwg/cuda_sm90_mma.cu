// Tensor-core CUDA kernel of chunk_bwd_dqkwg ("cuda.sm90.mma", bf16/f16 token tensors): one 256-thread block
// (8 warps) per (token window, q/k head h, 64-column tile of K), tile index fastest (the K tiles of one chunk
// run side by side and share dO, v, dv through L2), grid-stride on grid.x. The block walks the G value heads
// hv = h G + g of its q/k head in increasing g and sums dq, dk over them in f32 registers (no per-head
// workspace, no reduction pass). Per chunk and value head (S = h[c], dS = dh[c], 64-column V tiles):
//   Ds     = scale Lower((dO Vnᵀ) ⊙ Γ)              64 × 64, contraction V            → T, shared
//   dQ     = diag(scale E) dO Sᵀ + Ds K              64 × 64 (this K tile)
//   dK_int = diag(exp(γ_last − γ)) Vn dSᵀ ;  dK = dK_int + Dsᵀ Q
//   dW     = −dV Sᵀ                                  written per value head
//   dγ_i   = q_i·dQ_i − k_i·dK_i over this tile's columns (+ exp(γ_last) ⟨S, dS⟩ + Σ k·dK_int on the last row)
// Warp w owns rows 16 (w % 4).., columns 32 (w / 4).. of every 64 × 64 product. The dγ partials of the K tiles
// go to a workspace [K tiles, B, T, HV] and launch_reduce_tiles sums them in increasing tile order. The
// (value head, V tile) steps are software-pipelined: the next step's five tiles load (cp.async) into the other
// of two shared-memory stages while this one computes. All sums run
// in a fixed order (quad shuffles, then the two column-half warps in order): same bits every run, no atomics.
// Launch variants (DqkwgParams::mma_variant, see DqCfg): the above (kDqkwgPipelined); one stage with two blocks
// per SM (kDqkwgTwoPerSm, the automatic choice: the same bits as kDqkwgPipelined, measured fastest in GPU run
// s5run2 at B = 4, T = 8192, H = 16, HV = 32, K = V = 128: 2.62 ms against 2.86 (pipelined) and 2.74 (16 warps));
// 16 warps of 16 x 16 blocks (kDqkwgWarps16).
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"

#include <fmt/format.h>

#include <algorithm>

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
using namespace gdn_bwd::tc;

constexpr int kLd = 72;  // 16-bit row pitch of the 64-column tiles (conflict-free ldmatrix)
constexpr int kTileElems = 64 * kLd;
constexpr size_t kTileBytes = size_t{kTileElems} * 2;
// Shared memory: 16-bit tiles dO, Vn, dV, S, dS of one (value head, V tile) step, twice (the next step's tiles
// load while this one computes), Q, K (per chunk), Ds; f32 row vectors γ, scale exp(γ), exp(γ_last − γ) [64]
// each (formed once per row, not once per element), row partials [2][64], block-sum scratch [256].
// kTwo (kDqkwgTwoPerSm): one stage (a step's tiles load after the previous step's readers are done; the other
// block on the SM computes meanwhile), the per-thread dq / dk sums over the value heads in shared memory
// [2][16][256] f32 instead of 32 registers, and B fragments loaded one n-tile pair at a time: at most 128
// registers and 106 KiB of shared memory, so two blocks (16 warps) share an SM.
// kDqkwgWarps16: two stages as kDqkwgPipelined, 16 warps (512 threads) of 16 x 16 blocks instead of 8 of
// 16 x 32: half the accumulators per thread, the head sums in shared memory too, 16 warps per SM from one block
// (dq, dk, dw the same bits; the dγ row and block sums add their partials in another order).
enum { kDo, kVn, kDv, kS, kDS, kStage };
template <int kVar>
struct DqCfg {
  static constexpr bool kTwo = kVar == kDqkwgTwoPerSm;
  static constexpr int kWN = kVar == kDqkwgWarps16 ? 4 : 2;  // warps across the 64 columns of a product
  static constexpr int kThreads = 128 * kWN;                 // 4 warps down the 64 rows
  static constexpr int NT = 8 / kWN;                         // 8-column n-tiles per warp
  static constexpr int kStages = kTwo ? 1 : 2;
  static constexpr int kQ = kStages * kStage, kK = kQ + 1, kDs = kQ + 2, kNumTiles = kQ + 3;
  static constexpr size_t kSums = kNumTiles * kTileBytes;
  // the per-thread dq / dk sums over the value heads in shared memory [2][NT * 4][kThreads] instead of registers
  static constexpr bool kSmemSums = kVar != kDqkwgPipelined;
  static constexpr size_t kVec = kSums + (kSmemSums ? size_t{2 * NT * 4 * kThreads} * sizeof(float) : 0);
  // γ, scale exp(γ), exp(γ_last − γ) [64] each, row partials [kWN][64], block-sum scratch [kThreads]
  static constexpr size_t kBytes = kVec + (3 * 64 + kWN * 64 + kThreads) * sizeof(float);
};

inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }
int64_t k_tiles(const Dims& d) { return d.K > 0 ? (d.K + 63) / 64 : 1; }

// The four V-contraction products of one (value head, V tile) step, 64 deep, for the warp's 16 x 32 block
// (rows r0.., columns c0..): ds += dO Vnᵀ, dq += dO Sᵀ, dk += Vn dSᵀ and, with want_dw, dw += dV Sᵀ (B operands
// stored [n][k]). Interleaved per 16-deep slice: the dO fragment feeds ds and dq, the S fragments dq and dw (9
// ldmatrix instead of 12 per slice), and 16 independent accumulators are in flight instead of 4. Each accumulator
// still sums its slices in increasing k: the same bits as four separate warp GEMMs.
template <class T, int NT>
__device__ __forceinline__ void step_products(float (&ds)[1][NT][4], float (&dq)[1][NT][4], float (&dk)[1][NT][4],
                                              float (&dw)[1][NT][4], const uint16_t* st, int r0, int c0,
                                              bool want_dw) {
  namespace mm = ::strata::cuda::mma;
  using M = MmaT<T>;
  const M* aDo = reinterpret_cast<const M*>(st + kDo * kTileElems + r0 * kLd);
  const M* aVn = reinterpret_cast<const M*>(st + kVn * kTileElems + r0 * kLd);
  const M* aDv = reinterpret_cast<const M*>(st + kDv * kTileElems + r0 * kLd);
  const M* bVn = reinterpret_cast<const M*>(st + kVn * kTileElems + c0 * kLd);
  const M* bS = reinterpret_cast<const M*>(st + kS * kTileElems + c0 * kLd);
  const M* bDS = reinterpret_cast<const M*>(st + kDS * kTileElems + c0 * kLd);
#pragma unroll
  for (int k0 = 0; k0 < 64; k0 += 16) {
    const mm::FragA fDo = mm::load_a(aDo, kLd, 0, k0), fVn = mm::load_a(aVn, kLd, 0, k0);
    mm::FragB fv[NT], fs[NT], fd[NT];
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      mm::load_b2(fv[2 * np], fv[2 * np + 1], bVn, kLd, k0, np * 16);
      mm::load_b2(fs[2 * np], fs[2 * np + 1], bS, kLd, k0, np * 16);
      mm::load_b2(fd[2 * np], fd[2 * np + 1], bDS, kLd, k0, np * 16);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma16816<T>(ds[0][nt], fDo, fv[nt]);
      mma16816<T>(dq[0][nt], fDo, fs[nt]);
      mma16816<T>(dk[0][nt], fVn, fd[nt]);
    }
    if (want_dw) {
      const mm::FragA fDv = mm::load_a(aDv, kLd, 0, k0);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma16816<T>(dw[0][nt], fDv, fs[nt]);
    }
  }
}

// step_products with the B fragments of one n-tile pair live at a time (12 registers instead of 24; kTwo). Every
// accumulator still sums its 16-deep slices in increasing k: the same bits.
template <class T>
__device__ __forceinline__ void step_products_pairs(float (&ds)[1][4][4], float (&dq)[1][4][4], float (&dk)[1][4][4],
                                                    float (&dw)[1][4][4], const uint16_t* st, int r0, int c0,
                                                    bool want_dw) {
  namespace mm = ::strata::cuda::mma;
  using M = MmaT<T>;
  const M* aDo = reinterpret_cast<const M*>(st + kDo * kTileElems + r0 * kLd);
  const M* aVn = reinterpret_cast<const M*>(st + kVn * kTileElems + r0 * kLd);
  const M* aDv = reinterpret_cast<const M*>(st + kDv * kTileElems + r0 * kLd);
  const M* bVn = reinterpret_cast<const M*>(st + kVn * kTileElems + c0 * kLd);
  const M* bS = reinterpret_cast<const M*>(st + kS * kTileElems + c0 * kLd);
  const M* bDS = reinterpret_cast<const M*>(st + kDS * kTileElems + c0 * kLd);
#pragma unroll
  for (int k0 = 0; k0 < 64; k0 += 16) {
    const mm::FragA fDo = mm::load_a(aDo, kLd, 0, k0), fVn = mm::load_a(aVn, kLd, 0, k0);
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      mm::FragB fv[2], fs[2], fd[2];
      mm::load_b2(fv[0], fv[1], bVn, kLd, k0, np * 16);
      mm::load_b2(fs[0], fs[1], bS, kLd, k0, np * 16);
      mm::load_b2(fd[0], fd[1], bDS, kLd, k0, np * 16);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        mma16816<T>(ds[0][2 * np + j], fDo, fv[j]);
        mma16816<T>(dq[0][2 * np + j], fDo, fs[j]);
        mma16816<T>(dk[0][2 * np + j], fVn, fd[j]);
      }
      if (want_dw) {
        const mm::FragA fDv = mm::load_a(aDv, kLd, 0, k0);
#pragma unroll
        for (int j = 0; j < 2; ++j) mma16816<T>(dw[0][2 * np + j], fDv, fs[j]);
      }
    }
  }
}

template <class T, int kVar>
__global__ void __launch_bounds__(DqCfg<kVar>::kThreads, DqCfg<kVar>::kTwo ? 2 : 1)
    dqkwg_mma_kernel(DqkwgParams p, const int64_t* offs, float* ws_dg, int64_t items, int64_t ktiles) {
  using S = DqCfg<kVar>;
  constexpr bool kTwo = S::kTwo;
  constexpr int kQ = S::kQ, kK = S::kK, kDs = S::kDs, kThr = S::kThreads, NT = S::NT, kWN = S::kWN;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* const tiles = reinterpret_cast<uint16_t*>(smem);  // tile i at tiles + i * kTileElems
  float* const sSum = reinterpret_cast<float*>(smem + S::kSums);  // kSmemSums: [2][NT * 4][kThr], this thread's dq, dk sums
  float* sG = reinterpret_cast<float*>(smem + S::kVec);
  float* sEq = sG + 64;     // scale exp(γ_i) on valid rows, 0 past L
  float* sEk = sG + 128;    // exp(γ_last − γ_i) on valid rows, 0 past L
  float* sRow = sG + 192;   // [kWN][64]: row partials of the column groups
  float* sRed = sRow + kWN * 64;  // block_sum2 scratch [2][kThr / 32]
  const Dims& d = p.d;
  const bool want_dw = p.dw.present() && p.dv.present(), want_dg = p.dg.present();
  const int warp = threadIdx.x / 32, wm = warp % 4, wn = warp / 4;
  const int r0 = wm * 16, c0 = wn * (64 / kWN);  // this warp's block of every 64 x 64 product
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t kt = item % ktiles, h = item / ktiles % d.H, w = item / (ktiles * d.H);
    const int64_t x0 = kt * 64;
    const int kc = static_cast<int>(d.K - x0 < 64 ? (d.K - x0 > 0 ? d.K - x0 : 0) : 64);
    for_each_chunk(d, offs, w, [&](const DevChunk& c) {
      if (c.hc >= d.NT) return;  // only with invalid cu_seqlens (uniform across the block)
      const int L = static_cast<int>(c.t1 - c.t0);
      __syncthreads();  // the previous chunk's readers are done
      load_tile_async<T, kThr, !kTwo>((tiles + kQ * kTileElems), kLd, 64, 64, p.q, p.q.off(c.b, c.t0, h) + x0, p.q.s[1], L, kc);
      load_tile_async<T, kThr, !kTwo>((tiles + kK * kTileElems), kLd, 64, 64, p.k, p.k.off(c.b, c.t0, h) + x0, p.k.s[1], L, kc);
      // Steps s = g VT + vt over (value head, V tile); step s loads into stage s % 2 while step s - 1 computes.
      const int64_t VT = d.V > 0 ? (d.V + 63) / 64 : 0, steps = d.G * VT;
      // γ of head g for this thread and the chunk's γ_last (threads < 64; 0 past the chunk or without a gate).
      auto gamma = [&](int64_t g) {
        const bool gate = p.g.present() && static_cast<int>(threadIdx.x) < L;  // (L >= 1)
        return make_float2(gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + threadIdx.x, h * d.G + g)) : 0.f,
                           gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + L - 1, h * d.G + g)) : 0.f);
      };
      // Issues step s's tiles (one commit group); the first step of a head also fetches that head's γ into g_next
      // (written to shared memory when the head starts, so the load's latency overlaps the previous head).
      float2 g_next = make_float2(0.f, 0.f);
      auto issue = [&](int64_t s) {
        const int64_t g = s / VT, e0 = (s - g * VT) * 64, hv = h * d.G + g;
        if (e0 == 0) g_next = gamma(g);
        const int vc = static_cast<int>(d.V - e0 < 64 ? d.V - e0 : 64);
        uint16_t* const st = tiles + (kTwo ? 0 : (s & 1)) * kStage * kTileElems;
        load_tile_async<T, kThr, !kTwo>((st + kDo * kTileElems), kLd, 64, 64, p.dout, p.dout.off(c.b, c.t0, hv) + e0, p.dout.s[1], L, vc);
        load_tile_async<T, kThr, !kTwo>((st + kVn * kTileElems), kLd, 64, 64, p.v, p.v.off(c.b, c.t0, hv) + e0, p.v.s[1], L, vc);
        if (want_dw)
          load_tile_async<T, kThr, !kTwo>((st + kDv * kTileElems), kLd, 64, 64, p.dv, p.dv.off(c.b, c.t0, hv) + e0, p.dv.s[1], L, vc);
        load_tile_async<T, kThr, !kTwo>((st + kS * kTileElems), kLd, 64, 64, p.h, p.h.off(c.b, c.hc, hv, x0) + e0, p.h.s[3], kc, vc);
        load_tile_async<T, kThr, !kTwo>((st + kDS * kTileElems), kLd, 64, 64, p.dh, p.dh.off(c.b, c.hc, hv, x0) + e0, p.dh.s[3], kc, vc);
        ::strata::cuda::cp_async_commit();
      };
      if (steps > 0) issue(0);  // (the q / k tiles join its group)
      else ::strata::cuda::cp_async_commit();
      float dq_sum[1][NT][4], dk_sum[1][NT][4];  // (kSmemSums: in sSum)
      zero(dq_sum), zero(dk_sum);
      if constexpr (S::kSmemSums) {
#pragma unroll
        for (int x = 0; x < 8 * NT; ++x) sSum[x * kThr + threadIdx.x] = 0.f;  // only this thread's slots
      }
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t hv = h * d.G + g;
        if (g > 0) __syncthreads();  // the previous head's readers of sG / Ds are done
        if (threadIdx.x < 64) {  // the row vectors of this head (read after the barriers below)
          const int i = threadIdx.x;
          const float2 gg = VT > 0 ? g_next : gamma(g);
          sG[i] = gg.x;
          sEq[i] = i < L ? p.scale * expf(gg.x) : 0.f;
          sEk[i] = i < L ? expf(gg.y - gg.x) : 0.f;
        }
        float ds[1][NT][4], dq[1][NT][4], dk[1][NT][4], dw[1][NT][4];
        zero(ds), zero(dq), zero(dk), zero(dw);
        float sds = 0.f;  // this thread's share of <S, dS> over the tile's rows
        for (int64_t vt = 0; vt < VT; ++vt) {
          const int64_t s = g * VT + vt;
          if constexpr (kTwo) {
            ::strata::cuda::cp_async_wait<0>();  // issued after the previous step's readers were done
          } else if (s + 1 < steps) {
            issue(s + 1);
            ::strata::cuda::cp_async_wait<1>();  // this step's group is complete, the next one may be in flight
          } else {
            ::strata::cuda::cp_async_wait<0>();
          }
          __syncthreads();
          const uint16_t* const st = tiles + (kTwo ? 0 : (s & 1)) * kStage * kTileElems;
          // B(e, j) = Vn[j][e], S[x][e], dS[x][e]: stored [n][k].
          if constexpr (kTwo && NT == 4)
            step_products_pairs<T>(ds, dq, dk, dw, st, r0, c0, want_dw);
          else
            step_products<T, NT>(ds, dq, dk, dw, st, r0, c0, want_dw);
          if (want_dg)  // 8 columns (one 16-byte segment of each tile) per step; zero outside the valid rows / columns
            for (int e = threadIdx.x; e < 64 * 8; e += kThr) {
              const int x = e / 8, col = (e % 8) * 8;
              const uint4 a4 = *reinterpret_cast<const uint4*>((st + kS * kTileElems) + x * kLd + col);
              const uint4 b4 = *reinterpret_cast<const uint4*>((st + kDS * kTileElems) + x * kLd + col);
              const uint32_t* a32 = reinterpret_cast<const uint32_t*>(&a4);
              const uint32_t* b32 = reinterpret_cast<const uint32_t*>(&b4);
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                sds += Elem<T>::to(static_cast<uint16_t>(a32[j] & 0xffffu)) * Elem<T>::to(static_cast<uint16_t>(b32[j] & 0xffffu));
                sds += Elem<T>::to(static_cast<uint16_t>(a32[j] >> 16)) * Elem<T>::to(static_cast<uint16_t>(b32[j] >> 16));
              }
            }
          __syncthreads();  // stage s % 2 is free for step s + 2
          // kTwo: the one stage is free now; the next step's tiles (the next head's first: during the epilogue)
          if constexpr (kTwo) {
            if (s + 1 < steps) issue(s + 1);
          }
        }
        if (VT == 0) {  // no V tile waited for the q / k tiles and γ
          ::strata::cuda::cp_async_wait<0>();
          __syncthreads();
        }
        // Epilogue of the V contraction: Ds → shared (T), row factors on dq / dk, dw out, Σ k·dK_int.
        const float gl = sG[L - 1];
        float kdki = 0.f;
        // Warps whose 16 x 32 block lies wholly above the diagonal (columns > rows) form no exponentials.
        const bool diag_block = c0 <= r0 + 15;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {  // the two adjacent columns of a fragment row together
            const int i = r0 + frag_row(0, e), j = c0 + frag_col(nt, e);  // j even
            const bool row_ok = i < L;
            float ds0 = 0.f, ds1 = 0.f;
            if (diag_block && row_ok) {
              const float gi = sG[i];
              if (j <= i) ds0 = p.scale * ds[0][nt][e] * expf(gi - sG[j]);
              if (j + 1 <= i) ds1 = p.scale * ds[0][nt][e + 1] * expf(gi - sG[j + 1]);
            }
            *reinterpret_cast<uint32_t*>((tiles + kDs * kTileElems) + i * kLd + j) =
                Elem<T>::from(ds0) | (uint32_t{Elem<T>::from(ds1)} << 16);
            const float fq = sEq[i], fk = sEk[i];  // 0 on rows past L
            dq[0][nt][e] *= fq, dq[0][nt][e + 1] *= fq;
            dk[0][nt][e] *= fk, dk[0][nt][e + 1] *= fk;
            if (want_dw && row_ok && j < kc)
              st_pair(p.dw, p.dw.off(c.b, c.t0 + i, hv) + x0 + j, -dw[0][nt][e], -dw[0][nt][e + 1], j + 1 < kc);
            const uint32_t k2 = *reinterpret_cast<const uint32_t*>((tiles + kK * kTileElems) + i * kLd + j);
            kdki += Elem<T>::to(static_cast<uint16_t>(k2 & 0xffffu)) * dk[0][nt][e];
            kdki += Elem<T>::to(static_cast<uint16_t>(k2 >> 16)) * dk[0][nt][e + 1];
          }
        // Σ k·dK_int and <S, dS> over the block (fixed order; the barriers inside also complete Ds).
        const float2 sums = block_sum2<kThr>(kdki, sds, sRed);
        const float kdki_sum = sums.x, sds_sum = sums.y;
        // dQ += Ds K ; dK += Dsᵀ Q   (B(j, x) = K[j][x], Q[i][x]: stored [k][n]; A = Dsᵀ: stored [k][m])
        warp_gemm<T, true, true, 1, NT>(dq, (tiles + kDs * kTileElems) + r0 * kLd, kLd, (tiles + kK * kTileElems) + c0, kLd, 64);
        warp_gemm<T, false, true, 1, NT>(dk, (tiles + kDs * kTileElems) + r0, kLd, (tiles + kQ * kTileElems) + c0, kLd, 64);
        if (want_dg) {
          // Row partials of q·dQ − k·dK over this warp's 32 columns: thread (2 rows x 8 columns), then the quad.
          float part[2] = {0.f, 0.f};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = r0 + frag_row(0, e), x = c0 + frag_col(nt, e);
              part[e >> 1] += Elem<T>::to((tiles + kQ * kTileElems)[i * kLd + x]) * dq[0][nt][e] -
                              Elem<T>::to((tiles + kK * kTileElems)[i * kLd + x]) * dk[0][nt][e];
            }
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            part[s] += __shfl_xor_sync(0xffffffffu, part[s], 1);
            part[s] += __shfl_xor_sync(0xffffffffu, part[s], 2);
          }
          if ((threadIdx.x & 3) == 0) {
            const int i = r0 + (threadIdx.x & 31) / 4;
            sRow[wn * 64 + i] = part[0];
            sRow[wn * 64 + i + 8] = part[1];
          }
          __syncthreads();
          if (static_cast<int>(threadIdx.x) < L) {
            const int i = threadIdx.x;
            float v = sRow[i];
#pragma unroll
            for (int j = 1; j < kWN; ++j) v += sRow[j * 64 + i];  // the column groups in order
            if (i == L - 1) v += expf(gl) * sds_sum + kdki_sum;
            ws_dg[((kt * d.B + c.b) * d.T + c.t0 + i) * d.HV + hv] = v;
          }
        }
        if constexpr (S::kSmemSums) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              sSum[(nt * 4 + e) * kThr + threadIdx.x] += dq[0][nt][e];
              sSum[(4 * NT + nt * 4 + e) * kThr + threadIdx.x] += dk[0][nt][e];
            }
        } else {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dq_sum[0][nt][e] += dq[0][nt][e], dk_sum[0][nt][e] += dk[0][nt][e];
        }
      }
      if constexpr (S::kSmemSums) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dq_sum[0][nt][e] = sSum[(nt * 4 + e) * kThr + threadIdx.x];
            dk_sum[0][nt][e] = sSum[(4 * NT + nt * 4 + e) * kThr + threadIdx.x];
          }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {  // the two adjacent columns of a fragment row together
          const int i = r0 + frag_row(0, e), x = c0 + frag_col(nt, e);
          if (i < L && x < kc) {
            st_pair(p.dq, p.dq.off(c.b, c.t0 + i, h) + x0 + x, dq_sum[0][nt][e], dq_sum[0][nt][e + 1], x + 1 < kc);
            st_pair(p.dk, p.dk.off(c.b, c.t0 + i, h) + x0 + x, dk_sum[0][nt][e], dk_sum[0][nt][e + 1], x + 1 < kc);
          }
        }
    });
  }
}

template <class T, int kVar>
strata_status launch(const DqkwgParams& p, const int64_t* offs, float* ws_dg, int64_t items, int64_t ktiles,
                     cudaStream_t stream) {
  constexpr bool kTwo = DqCfg<kVar>::kTwo;
  constexpr int threads = DqCfg<kVar>::kThreads;
  constexpr size_t smem = DqCfg<kVar>::kBytes;
  static_assert(smem <= 227 * 1024, "shared memory of one block");
  static_assert(!kTwo || 2 * (smem + 1024) <= 228 * 1024, "two blocks per SM");
  STRATA_CUDA_TRY(cudaFuncSetAttribute(dqkwg_mma_kernel<T, kVar>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  if (kTwo)  // the largest shared-memory carveout, so that two blocks fit
    STRATA_CUDA_TRY(cudaFuncSetAttribute(dqkwg_mma_kernel<T, kVar>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  dqkwg_mma_kernel<T, kVar><<<static_cast<unsigned>(blocks), threads, smem, stream>>>(p, offs, ws_dg, items, ktiles);
  return cuda::check_launch(kVar == kDqkwgTwoPerSm ? "chunk_bwd_dqkwg (mma, two per SM)"
                            : kVar == kDqkwgWarps16 ? "chunk_bwd_dqkwg (mma, 16 warps)"
                                                    : "chunk_bwd_dqkwg (mma)");
}
template <class T>
strata_status launch_variant(const DqkwgParams& p, const int64_t* offs, float* ws_dg, int64_t items, int64_t ktiles,
                             cudaStream_t stream) {
  switch (p.mma_variant) {
    case kDqkwgPipelined: return launch<T, kDqkwgPipelined>(p, offs, ws_dg, items, ktiles, stream);
    case kDqkwgWarps16: return launch<T, kDqkwgWarps16>(p, offs, ws_dg, items, ktiles, stream);
    default: return launch<T, kDqkwgTwoPerSm>(p, offs, ws_dg, items, ktiles, stream);  // kDqkwgAuto too
  }
}

}  // namespace

std::string chunk_bwd_dqkwg_cuda_mma_reject(const DqkwgParams& p) {
  if (!common_16bit_dtype({&p.q, &p.k, &p.v, &p.dout}))
    return "takes q, k, v, do of one 16-bit dtype (bf16 or f16); f32 runs the FMA kernel";
  return "";
}

// Workspace: chunk offsets, then the dγ partials [K tiles, B, T, HV] f32.
size_t chunk_bwd_dqkwg_cuda_mma_workspace(const Dims& d) {
  return align256(chunk_offsets_bytes(d)) + static_cast<size_t>(k_tiles(d) * d.B * d.T * d.HV) * sizeof(float);
}

int chunk_bwd_dqkwg_cuda_mma(const DqkwgParams& p, void* workspace, void* stream_ptr) {
  const std::string why = chunk_bwd_dqkwg_cuda_mma_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_bwd_dqkwg cuda.sm90.mma: {}", why);
  if ((p.mma_variant == kDqkwgWgmma || p.mma_variant == kDqkwgWgmmaTma || p.mma_variant == kDqkwgWgmmaCpAsync ||
       p.mma_variant == kDqkwgWgmmaUnboundedWait || p.mma_variant == kDqkwgWgmmaBoundedWait) &&
      chunk_bwd_dqkwg_cuda_wgmma_reject(p).empty())
    return chunk_bwd_dqkwg_cuda_wgmma(p, workspace, stream_ptr);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  int64_t* offs = static_cast<int64_t*>(workspace);
  float* ws_dg = reinterpret_cast<float*>(static_cast<char*>(workspace) + align256(chunk_offsets_bytes(d)));
  const int64_t ktiles = k_tiles(d), items = num_windows(d) * d.H * ktiles;
  if (items > 0) {
    STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
    STRATA_RETURN_IF_ERROR(p.q.dtype == STRATA_DTYPE_BF16
                               ? launch_variant<bf16_t>(p, offs, ws_dg, items, ktiles, stream)
                               : launch_variant<f16_t>(p, offs, ws_dg, items, ktiles, stream));
  }
  if (p.dg.present()) STRATA_RETURN_IF_ERROR(launch_reduce_tiles(ws_dg, ktiles, d, p.dg, stream));
  return STRATA_SUCCESS;
}

// The automatic choice (the entry point other operators call): the warpgroup-MMA kernel where it applies (bf16,
// K = V = 128; GPU run s9run2, H200, B = 4, T = 8192, HV = 32: 2.27 ms against 2.61 ms for the mma.sync kernel),
// else mma.sync tensor cores for 16-bit token tensors, else the f32 FMA kernel.
size_t chunk_bwd_dqkwg_cuda_workspace(const Dims& d) {
  return std::max({chunk_bwd_dqkwg_cuda_wgmma_workspace(d), chunk_bwd_dqkwg_cuda_mma_workspace(d),
                   chunk_bwd_dqkwg_cuda_fma_workspace(d)});
}
int chunk_bwd_dqkwg_cuda(const DqkwgParams& p, void* workspace, void* stream) {
  if (chunk_bwd_dqkwg_cuda_wgmma_reject(p).empty()) return chunk_bwd_dqkwg_cuda_wgmma(p, workspace, stream);
  return chunk_bwd_dqkwg_cuda_mma_reject(p).empty() ? chunk_bwd_dqkwg_cuda_mma(p, workspace, stream)
                                                    : chunk_bwd_dqkwg_cuda_fma(p, workspace, stream);
}

}  // namespace strata::linear_attn
