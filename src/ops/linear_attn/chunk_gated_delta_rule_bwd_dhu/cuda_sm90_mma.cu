// Tensor-core CUDA kernel of chunk_gated_delta_rule_bwd_dhu ("cuda.sm90.mma", bf16/f16 token tensors): one
// 256-thread block (8 warps) per (sequence n, value head hv, BV-column tile of V) on grid.x (grid-stride: any
// N·HV), sequential over the sequence's chunks from the last. The recurrence is independent per column of dS,
// so V tiles never talk. dS [K, BV] is carried in f32 in the warps' mma accumulators (warp w owns rows
// [(w % 4) KP/4, (w % 4 + 1) KP/4) and columns (w / 4) BV/2 .. + BV/2 − 1, KP = K rounded up to 64) for the
// whole sequence. Tiles: K ≤ 64 with V > 64 takes BV = 128 and two pipeline stages (chunk c − 1's tiles load
// with cp.async while chunk c computes, one block per SM); 64 < K ≤ 128 with few (sequence, head) pairs
// (dhu_narrow_tiles) takes BV = 32 and two stages; other shapes take BV = 64 and one stage (at K ≤ 128 two blocks
// per SM: B = 4, HV = 32, V = 128 is 256 blocks, one wave; see launch_k), whose chunk tiles load as two cp.async
// groups (k, dv, then q, w, dO: dVn runs before the second group is waited for). Per chunk (L ≤ BT rows, zero-filled to 64):
//   dh[c] = dS                                          (from the f32 fragments, or the bf16 copy when dh is 16-bit)
//   sS    = T(dS)                                        [KP, BV] shared, the B operand below
//   dVn   = dv + diag(exp(γ_last − γ)) (Kc sS)           64 × BV, contraction KP; warp w rows 16 (w % 4)..
//   dS    = exp(γ_last) dS + [Qc ; Wc]ᵀ [T(scale E ⊙ dO) ; −T(dVn)]   KP × BV, contraction 128
// (fla's precision model: dS rounded to T for Kc dS, dVn rounded to T for Wcᵀ dVn, f32 accumulation.)
// FUSE (DhuParams::fuse_dv_local, the composed backward): dv is not read but formed per chunk from the tiles the
// block holds anyway, exactly as chunk_bwd_dv_local's tensor-core kernel does (the same products, the same
// per-element summation order, the same rounding to T: the same bits):
//   Bm = T(Upper(scale (Kc Qcᵀ) ⊙ exp(γ_i − γ_j)))  64 × 64 in shared memory ;  dv = T(Bm dO)  (this V tile)
// after the K sS product (so with one stage the q / dO group is waited for only then) and before dO is scaled.
// Every element is produced by one block in a fixed order: same bits every run, no atomics.
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"

#include <fmt/format.h>

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
using namespace gdn_bwd::tc;

constexpr int kWarps = 8;  // 4 (rows of dS / dVn) x 2 (column halves of the V tile)
constexpr int kThr = kWarps * 32;

// Shared memory of one block: per stage (the tiles of one chunk) q|w [128][KP + 8], k [64][KP + 8], E dO | dv
// [128][BV + 8] (16-bit) and the row factors [3][64] f32 (γ_i, scale exp(γ_i), exp(γ_last − γ_i): formed once
// per row by threads < 64 instead of once per element); then T(dS) [KP][BV + 8] once.
template <int KP, int BV, int STAGES, bool FUSE = false>
struct DhuSmem {
  static constexpr int kLdK = KP + 8, kLdB = BV + 8;  // 16-bit row pitches (conflict-free ldmatrix)
  static constexpr size_t kQW = 0;
  static constexpr size_t kK = kQW + size_t{128} * kLdK * 2;
  static constexpr size_t kB = kK + size_t{64} * kLdK * 2;
  static constexpr size_t kG = kB + size_t{128} * kLdB * 2;
  static constexpr size_t kStage = kG + 3 * 64 * sizeof(float);
  static constexpr size_t kS = STAGES * kStage;
  static constexpr size_t kBm = kS + size_t{KP} * kLdB * 2;  // FUSE: Bm [64][72] 16-bit
  static constexpr int kLdBm = 72;
  static constexpr size_t kBytes = kBm + (FUSE ? size_t{64} * kLdBm * 2 : 0);
};

template <class T, int KP, int BV, int STAGES, bool FUSE>
__global__ void __launch_bounds__(kThr, (KP <= 128 && BV <= 64 && STAGES == 1) ? 2 : 1)
    dhu_mma_kernel(DhuParams p, const int64_t* offs, int64_t items, int64_t vtiles) {
  using S = DhuSmem<KP, BV, STAGES, FUSE>;
  constexpr int MT = KP / 64;   // 16-row m-tiles of dS per warp
  constexpr int NT = BV / 16;   // 8-column n-tiles per warp (half of the V tile)
  constexpr int kLdK = S::kLdK, kLdB = S::kLdB;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* sS = reinterpret_cast<uint16_t*>(smem + S::kS);
  uint16_t* sBm = reinterpret_cast<uint16_t*>(smem + S::kBm);  // FUSE only
  const Dims& d = p.d;
  const int warp = threadIdx.x / 32, wm = warp % 4, cn = (warp / 4) * (BV / 2);
  const int row0 = wm * (KP / 4);  // this warp's first dS row; columns cn .. cn + BV/2 − 1
  const bool dh_vec = p.dh.dtype == Elem<T>::kDtype;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t vt = item % vtiles, hv = item / vtiles % d.HV, n = item / (vtiles * d.HV), h = hv / d.G;
    const int64_t e0 = vt * BV;
    const int vc = static_cast<int>(d.V - e0 < BV ? d.V - e0 : BV);
    const DhuSeq sq = dhu_sequence(d, offs, n);
    const int64_t b = sq.b, bos = sq.bos, eos = sq.eos, hc0 = sq.hc0;
    // dS = dht[n, hv] (or 0), f32 in the accumulators.
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = row0 + frag_row(mt, e), col = cn + frag_col(nt, e);
          acc[mt][nt][e] = (p.dht.present() && x < d.K && col < vc) ? ld_f32(p.dht, p.dht.off(n, hv, x) + e0 + col)
                                                                     : 0.f;
        }
    const int64_t nc = (eos - bos + d.BT - 1) / d.BT;
    const int kc = static_cast<int>(d.K);
    // Issues the cp.async copies of chunk c's tiles into stage st (one commit group) and returns this thread's γ
    // of the chunk and the chunk's γ_last (threads < 64; turned into the stage's row factors when the chunk is
    // computed, so the loads' latency overlaps the current chunk).
    auto issue = [&](int64_t c, int st) -> float2 {
      const int64_t t0 = bos + c * d.BT;
      const int L = static_cast<int>(eos - t0 < d.BT ? eos - t0 : d.BT);
      unsigned char* base = smem + st * S::kStage;
      uint16_t* sQW = reinterpret_cast<uint16_t*>(base + S::kQW);
      uint16_t* sB = reinterpret_cast<uint16_t*>(base + S::kB);
      // k and dv first (all that dVn needs); one stage: they are a commit group of their own, so dVn (and the dh,
      // dv2 stores) run while q, w, dO are still in flight (see the chunk loop).
      load_tile_async<T, kThr>(reinterpret_cast<uint16_t*>(base + S::kK), kLdK, 64, KP, p.k, p.k.off(b, t0, h),
                               p.k.s[1], L, kc);
      if (!FUSE)
        load_tile_async<T, kThr>(sB + 64 * kLdB, kLdB, 64, BV, p.dv, p.dv.off(b, t0, hv) + e0, p.dv.s[1], L, vc);
      if (STAGES == 1) ::strata::cuda::cp_async_commit();
      load_tile_async<T, kThr>(sQW, kLdK, 64, KP, p.q, p.q.off(b, t0, h), p.q.s[1], L, kc);
      load_tile_async<T, kThr>(sQW + 64 * kLdK, kLdK, 64, KP, p.w, p.w.off(b, t0, hv), p.w.s[1], L, kc);
      load_tile_async<T, kThr>(sB, kLdB, 64, BV, p.dout, p.dout.off(b, t0, hv) + e0, p.dout.s[1], L, vc);
      ::strata::cuda::cp_async_commit();
      const bool gate = p.g.present() && static_cast<int>(threadIdx.x) < L;  // (L >= 1 for every issued chunk)
      return make_float2(gate ? ld_f32(p.g, p.g.off(b, t0 + threadIdx.x, hv)) : 0.f,
                         gate ? ld_f32(p.g, p.g.off(b, t0 + L - 1, hv)) : 0.f);
    };
    __syncthreads();  // the previous item's readers of shared memory are done
    float2 g_next = nc > 0 ? issue(nc - 1, 0) : make_float2(0.f, 0.f);
    for (int64_t c = nc - 1, it = 0; c >= 0; --c, ++it) {
      const int st = STAGES == 2 ? static_cast<int>(it & 1) : 0;
      unsigned char* base = smem + st * S::kStage;
      uint16_t* sQW = reinterpret_cast<uint16_t*>(base + S::kQW);
      uint16_t* sK = reinterpret_cast<uint16_t*>(base + S::kK);
      uint16_t* sB = reinterpret_cast<uint16_t*>(base + S::kB);
      float* sG = reinterpret_cast<float*>(base + S::kG);  // γ_i
      float* sEs = sG + 64;                                 // scale exp(γ_i)
      float* sDec = sG + 128;                               // exp(γ_last − γ_i)
      const int64_t t0 = bos + c * d.BT, hc = hc0 + c;
      const int L = static_cast<int>(eos - t0 < d.BT ? eos - t0 : d.BT);
      if (STAGES == 1 && it > 0) g_next = issue(c, 0);  // (the previous chunk's readers passed the barrier below)
      if (threadIdx.x < 64) {
        const int i = threadIdx.x;  // rows past L get finite factors; their dO / dv rows are zero
        sG[i] = g_next.x;
        sEs[i] = p.scale * expf(g_next.x);
        sDec[i] = expf(g_next.y - g_next.x);
      }
      if (STAGES == 2 && c > 0) {
        g_next = issue(c - 1, st ^ 1);  // the stage chunk c + 1 used (its readers passed the barrier below)
        ::strata::cuda::cp_async_wait<1>();
      } else if (STAGES == 1) {
        ::strata::cuda::cp_async_wait<1>();  // k, dv of this chunk; q, w, dO may still be in flight
      } else {
        ::strata::cuda::cp_async_wait<0>();
      }
      // sS = T(dS) (the two adjacent columns of a fragment row as one 32-bit store); dh[c] = dS straight from the
      // f32 fragments unless dh holds T (copied from sS below).
      const bool write_dh = hc < d.NT;  // invalid cu_seqlens could point past dh
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int x = row0 + frag_row(mt, e), col = cn + frag_col(nt, e);  // col even
            *reinterpret_cast<uint32_t*>(sS + x * kLdB + col) =
                Elem<T>::from(acc[mt][nt][e]) | (uint32_t{Elem<T>::from(acc[mt][nt][e + 1])} << 16);
            if (write_dh && !dh_vec && x < d.K && col < vc)
              st_pair(p.dh, p.dh.off(b, hc, hv, x) + e0 + col, acc[mt][nt][e], acc[mt][nt][e + 1], col + 1 < vc);
          }
      __syncthreads();
      if (write_dh && dh_vec) {  // 16-bit dh: the rounded copy, row by row (consecutive threads, consecutive columns)
        uint16_t* dh16 = static_cast<uint16_t*>(p.dh.p);
        // 16-byte segments when every row segment of the tile is 16-byte aligned and V's tail is whole segments.
        const bool seg16 = (p.dh.s[3] & 7) == 0 && (vc & 7) == 0 &&
                           (reinterpret_cast<uintptr_t>(dh16 + p.dh.off(b, hc, hv, 0) + e0) & 15) == 0;
        if (seg16) {
          constexpr int kSegs = BV / 8;
          for (int e = threadIdx.x; e < kc * kSegs; e += kThr) {
            const int x = e / kSegs, col = (e % kSegs) * 8;
            if (col < vc)
              *reinterpret_cast<uint4*>(dh16 + p.dh.off(b, hc, hv, x) + e0 + col) =
                  *reinterpret_cast<const uint4*>(sS + x * kLdB + col);
          }
        } else {
          for (int e = threadIdx.x; e < kc * BV; e += kThr) {
            const int x = e / BV, col = e % BV;
            if (col < vc) dh16[p.dh.off(b, hc, hv, x) + e0 + col] = sS[x * kLdB + col];
          }
        }
      }
      const float gl = sG[L - 1];
      // dO rows scaled by scale · exp(γ_i), 8 columns (one 16-byte segment) per step (rows past L are zero
      // already; the row pitch kLdB and the stage offsets are multiples of 8 elements). Two stages: here (the
      // whole chunk has landed); one stage: after dVn, once q, w, dO have (rows 0..63 of sB; dVn uses 64..127).
      auto scale_do = [&] {
        constexpr int kSegs = BV / 8;
        for (int e = threadIdx.x; e < 64 * kSegs; e += kThr) {
          const int i = e / kSegs, col = (e % kSegs) * 8;
          if (i < L) {
            uint4* q4 = reinterpret_cast<uint4*>(sB + i * kLdB + col);
            uint4 u = *q4;
            const float f = sEs[i];
            uint32_t* w32 = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint16_t lo = Elem<T>::from(Elem<T>::to(static_cast<uint16_t>(w32[j] & 0xffffu)) * f);
              const uint16_t hi = Elem<T>::from(Elem<T>::to(static_cast<uint16_t>(w32[j] >> 16)) * f);
              w32[j] = lo | (uint32_t{hi} << 16);
            }
            *q4 = u;
          }
        }
      };
      if (STAGES == 2 && !FUSE) scale_do();
      // dVn = dv + diag(exp(γ_last − γ)) Kc sS: warp w rows 16 (w % 4).., columns cn .. cn + BV/2 − 1.
      {
        float dacc[1][NT][4];
        zero(dacc);
        warp_gemm<T, true, true, 1, NT>(dacc, sK + wm * 16 * kLdK, kLdK, sS + cn, kLdB, KP);
        // FUSE: dv_local of this tile in the same fragments (rows 16 (w % 4).., columns cn..), rounded to T.
        float dvl[1][NT][4];
        if constexpr (FUSE) {
          if (STAGES == 1) ::strata::cuda::cp_async_wait<0>();  // q, w, dO of this chunk
          __syncthreads();  // (every thread's copies visible; with two stages a no-op for the data)
          {  // Bm[j][i] = T(scale (k_j · q_i) exp(γ_i − γ_j)) for j ≤ i < L (exponent ≤ 0), 0 elsewhere
            const int r0 = wm * 16, c0 = (warp / 4) * 32;
            float pacc[1][4][4];
            zero(pacc);
            warp_gemm<T, true, false, 1, 4>(pacc, sK + r0 * kLdK, kLdK, sQW + c0 * kLdK, kLdK, KP);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int j = r0 + frag_row(0, e), i = c0 + frag_col(nt, e);
                sBm[j * S::kLdBm + i] =
                    Elem<T>::from(i >= j && i < L ? p.scale * pacc[0][nt][e] * expf(sG[i] - sG[j]) : 0.f);
              }
          }
          __syncthreads();
          zero(dvl);  // dv = Bm dO (B(i, col) = dO[i][col], unscaled: stored [k][n])
          warp_gemm<T, true, true, 1, NT>(dvl, sBm + wm * 16 * S::kLdBm, S::kLdBm, sB + cn, kLdB, 64);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {  // the two adjacent columns of a fragment row together
            const int i = wm * 16 + frag_row(0, e), col = cn + frag_col(nt, e);  // col even
            uint32_t* slot = reinterpret_cast<uint32_t*>(sB + (64 + i) * kLdB + col);  // dv[i][col..+1] → −T(dVn)
            const uint32_t dv = FUSE ? (Elem<T>::from(dvl[0][nt][e]) | (uint32_t{Elem<T>::from(dvl[0][nt][e + 1])} << 16))
                                     : *slot;
            const float dec = sDec[i];
            float x0 = 0.f, x1 = 0.f;
            if (i < L && col < vc) {
              x0 = Elem<T>::to(static_cast<uint16_t>(dv & 0xffffu)) + dec * dacc[0][nt][e];
              x1 = col + 1 < vc ? Elem<T>::to(static_cast<uint16_t>(dv >> 16)) + dec * dacc[0][nt][e + 1] : 0.f;
              st_pair(p.dv2, p.dv2.off(b, t0 + i, hv) + e0 + col, x0, x1, col + 1 < vc);
            }
            *slot = Elem<T>::from(-x0) | (uint32_t{Elem<T>::from(-x1)} << 16);
          }
      }
      if (FUSE) {  // every warp's Bm dO has read the unscaled dO
        __syncthreads();
        scale_do();
      } else if (STAGES == 1) {
        ::strata::cuda::cp_async_wait<0>();  // q, w, dO of this chunk
        __syncthreads();
        scale_do();
      }
      __syncthreads();
      // dS = exp(γ_last) dS + [Q ; W]ᵀ [E dO ; −dVn]
      const float decay = expf(gl);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] *= decay;
      warp_gemm<T, false, true, MT, NT>(acc, sQW + row0, kLdK, sB + cn, kLdB, 128);
      __syncthreads();  // this stage and sS are free for the next chunk
    }
    if (p.dh0.present())
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = row0 + frag_row(mt, e), col = cn + frag_col(nt, e);
            if (x < d.K && col < vc) st_f32(p.dh0, p.dh0.off(n, hv, x) + e0 + col, acc[mt][nt][e]);
          }
  }
}

template <class T, int KP, int BV, int STAGES, bool FUSE = false>
strata_status launch(const DhuParams& p, const int64_t* offs, cudaStream_t stream) {
  constexpr size_t smem = DhuSmem<KP, BV, STAGES, FUSE>::kBytes;
  static_assert(smem <= 227 * 1024, "shared memory of one block");
  const Dims& d = p.d;
  const int64_t vtiles = (d.V + BV - 1) / BV, items = d.N * d.HV * vtiles;
  static_assert(!(KP <= 128 && BV <= 64 && STAGES == 1) || 2 * (smem + 1024) <= 228 * 1024, "two blocks per SM");
  STRATA_CUDA_TRY(cudaFuncSetAttribute(dhu_mma_kernel<T, KP, BV, STAGES, FUSE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  if (KP <= 128 && BV <= 64 && STAGES == 1)  // the largest shared-memory carveout, so that two blocks fit
    STRATA_CUDA_TRY(cudaFuncSetAttribute(dhu_mma_kernel<T, KP, BV, STAGES, FUSE>,
                                         cudaFuncAttributePreferredSharedMemoryCarveout,
                                         static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  dhu_mma_kernel<T, KP, BV, STAGES, FUSE><<<static_cast<unsigned>(blocks), kThr, smem, stream>>>(p, offs, items,
                                                                                                vtiles);
  return cuda::check_launch(FUSE ? "chunk_gated_delta_rule_bwd_dhu (mma, fused dv_local)"
                                 : "chunk_gated_delta_rule_bwd_dhu (mma)");
}

// Tile choice: K ≤ 64 with V > 64: 128-column V tiles, two pipeline stages (the next chunk's tiles load while
// this one computes), one block per SM; otherwise 64-column V tiles without a second stage (two blocks per SM at
// K ≤ 128: 16 warps per SM hide each other's latency). At K = 128 the 64-column tiles measured faster on the H200
// (B = 4, T = 8192, HV = 32, V = 128: 1.97 ms with 256 blocks, two per SM, GPU run s3run1; 2.47-2.49 ms with
// 128-column tiles and two stages, one block per SM, s3run3 / s4run1), so K ≤ 128 takes them for every V.
//
// Few (sequence, head) pairs (dhu_narrow_tiles: N·HV·ceil(V / 32) ≤ the SM count, e.g. B = 1, HV = 32, V = 128: 64
// items of 64 columns would leave half of the 132 SMs idle for the whole serial pass) at 64 < K ≤ 128: 32-column
// V tiles and two pipeline stages, one block per SM, every block resident from the start: twice the blocks, each
// with half the columns and its next chunk's loads overlapping the current chunk (dS columns are independent,
// and every element is summed in the same order whatever BV: the same bits as the 64-column tiles).
template <class T, bool FUSE>
strata_status launch_k(const DhuParams& p, const int64_t* offs, cudaStream_t stream) {
  const int64_t K = p.d.K, V = p.d.V;
  if (K <= 64)
    return V > 64 ? launch<T, 64, 128, 2, FUSE>(p, offs, stream) : launch<T, 64, 64, 1, FUSE>(p, offs, stream);
  if (K <= 128 && (p.mma_variant == kDhuNarrow ||
                   (p.mma_variant != kDhuWide && dhu_narrow_tiles(p.d, ::strata::cuda::current_sm_count()))))
    return launch<T, 128, 32, 2, FUSE>(p, offs, stream);
  if (K <= 128) return launch<T, 128, 64, 1, FUSE>(p, offs, stream);
  if constexpr (FUSE) {
    return STRATA_ERROR_INTERNAL;  // (K > 128 with the fused dv_local: refused by the reject rule first)
  } else {
    if (K <= 192) return launch<T, 192, 64, 1>(p, offs, stream);
    return launch<T, 256, 64, 1>(p, offs, stream);
  }
}

// Whether kDhuAuto takes the warpgroup-MMA kernel where it runs (cuda_sm90_wgmma.cu). GPU run s9run2 (H200, bf16,
// HV = 32, K = V = 128): fused dv_local 0.929 against 1.253 ms (B = 4, T = 8192), 2.202 against 2.840 ms (B = 1);
// dv read 1.007 / 1.013 and 2.118 / 2.143 ms; correct (conformance and DhuWgmmaMatchesMma).
constexpr bool kDhuWgmmaAutomatic = true;

}  // namespace

std::string chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(const DhuParams& p) {
  if (p.fuse_dv_local) {
    if (!common_16bit_dtype({&p.q, &p.k, &p.w, &p.dout}))
      return "takes q, k, w, do of one 16-bit dtype (bf16 or f16) with the fused dv_local";
    if (p.d.K > 128) return fmt::format("K = {} > 128 with the fused dv_local", p.d.K);
    return "";
  }
  if (!common_16bit_dtype({&p.q, &p.k, &p.w, &p.dout, &p.dv}))
    return "takes q, k, w, do, dv of one 16-bit dtype (bf16 or f16); f32 runs the FMA kernel";
  if (p.d.K > 256) return fmt::format("K = {} > 256", p.d.K);
  return "";
}

bool chunk_gated_delta_rule_bwd_dhu_takes_wgmma(const DhuParams& p) {
  return (dhu_forces_wgmma(p.mma_variant) || (p.mma_variant == kDhuAuto && kDhuWgmmaAutomatic)) &&
         chunk_gated_delta_rule_bwd_dhu_wgmma_runs(p);
}

bool chunk_gated_delta_rule_bwd_dhu_fuses_dv_local(const DhuParams& p) {
  DhuParams f = p;
  f.fuse_dv_local = true;
  return chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(f).empty();
}

size_t chunk_gated_delta_rule_bwd_dhu_cuda_mma_workspace(const Dims& d) { return chunk_offsets_bytes(d); }

int chunk_gated_delta_rule_bwd_dhu_cuda_mma(const DhuParams& p, void* workspace, void* stream_ptr) {
  const std::string why = chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(p);
  if (!why.empty())
    return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_bwd_dhu cuda.sm90.mma: {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  if (d.N * d.HV == 0 || d.V == 0) return STRATA_SUCCESS;  // V = 0 or no sequence: every output is empty
  int64_t* offs = static_cast<int64_t*>(workspace);
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  if (chunk_gated_delta_rule_bwd_dhu_takes_wgmma(p)) return chunk_gated_delta_rule_bwd_dhu_cuda_wgmma(p, offs, stream);
  if (dhu_forces_wgmma(p.mma_variant)) {  // forced but not applicable
    const std::string r = chunk_gated_delta_rule_bwd_dhu_wgmma_reject(p);
    return fail(STRATA_ERROR_UNSUPPORTED, "chunk_gated_delta_rule_bwd_dhu wgmma: {}",
                r.empty() ? "q, k, w, do not 16-byte copyable, or dh, dv2 (dv) not aligned bf16 pairs" : r);
  }
  if (p.fuse_dv_local)
    return p.q.dtype == STRATA_DTYPE_BF16 ? launch_k<bf16_t, true>(p, offs, stream)
                                          : launch_k<f16_t, true>(p, offs, stream);
  return p.q.dtype == STRATA_DTYPE_BF16 ? launch_k<bf16_t, false>(p, offs, stream)
                                        : launch_k<f16_t, false>(p, offs, stream);
}

// The automatic choice (the entry point other operators call): tensor cores for 16-bit token tensors.
size_t chunk_gated_delta_rule_bwd_dhu_cuda_workspace(const Dims& d) {
  return std::max(chunk_gated_delta_rule_bwd_dhu_cuda_mma_workspace(d),
                  chunk_gated_delta_rule_bwd_dhu_cuda_fma_workspace(d));
}
int chunk_gated_delta_rule_bwd_dhu_cuda(const DhuParams& p, void* workspace, void* stream) {
  return chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(p).empty()
             ? chunk_gated_delta_rule_bwd_dhu_cuda_mma(p, workspace, stream)
             : chunk_gated_delta_rule_bwd_dhu_cuda_fma(p, workspace, stream);
}

}  // namespace strata::linear_attn
