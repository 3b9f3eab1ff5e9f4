// chunk_bwd_dqkwg tensor-core kernel, "wide" launch variant (DqkwgParams::mma_variant = kDqkwgWide; 16-bit token
// tensors, 64 < K <= 128, V >= 1): one 256-thread block (8 warps, one block per SM, up to 255 registers) per
// (token window, q/k head h) covering all K columns at once, instead of one block per 64-column K tile
// (cuda_sm90_mma.cu). What that saves per chunk and q/k head: the dO, Vn, dV tiles are loaded once instead of
// once per K tile, Ds = scale Lower((dO Vnᵀ) ⊙ Γ) and its exponentials are formed once, every A fragment feeds 8
// n-tiles instead of 4, and dγ is complete in the block (written directly: no [K tiles, B, T, HV] workspace and
// no reduction pass).
//
// Per chunk and value head hv = h G + g (S = h[c], dS = dh[c], in 32-column V tiles; two cp.async stages, or three
// for kDqkwgWide3: the next steps' tiles load while this one computes, across head boundaries):
//   ds  += dO Vnᵀ  (64 x 64)     dq += dO Sᵀ,  dk += Vn dSᵀ,  dw += dV Sᵀ   (64 x 128)
// then the epilogue of the head: Ds → shared (T), dq *= scale E, dk *= exp(γ_last − γ), dw out, dq += Ds K,
// dk += Dsᵀ Q, dγ_i = q_i·dq_i − k_i·dk_i (+ exp(γ_last) ⟨S, dS⟩ + Σ k·dK_int on the last row), and dq, dk added
// to the per-thread sums over the G heads (shared memory, [2][32][256] f32).
// Warp w: rows 16 (w % 4).., K columns 64 (w / 4).. of dq, dk, dw; columns 32 (w / 4).. of Ds.
// Summation orders: dq, dk, dw and Ds add the same products in the same order as the per-K-tile kernels (the V
// contraction in 16-deep slices in increasing V, then Ds K / Dsᵀ Q over j, then the heads in increasing g): the
// same bits. dγ adds its row partials of two 64-column halves (instead of four 32-column quarters summed per tile),
// and ⟨S, dS⟩ / Σ k·dK_int over other thread partitions: the same values up to f32 reassociation (the variant test
// bounds the difference). Everything runs in a fixed order: same bits every run, no atomics.
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"

#include <algorithm>

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
using namespace gdn_bwd::tc;

constexpr int kThr = 256;
constexpr int kLdW = 136;  // pitch of the 128-column Q, K tiles (272 bytes: conflict-free ldmatrix)
constexpr int kLdD = 72;   // pitch of the 64 x 64 Ds tile
// Shared-memory layout for kStages stages of kVW-column V tiles, in 16-bit elements. One stage: dO, Vn, dV
// [64][kLdV], S, dS [128][kLdV] (rows: K index x, columns: V index e); Q, K [64][kLdW]; Ds [64][kLdD]; then f32: the
// dq, dk sums over the heads [2][32][kThr], γ, scale exp(γ), exp(γ_last − γ) [64] each, row partials [2][64],
// block_sum2 scratch [2][8]. kVW = 32: 179 KiB with two stages, 214 KiB with three (one block per SM either way).
template <int kVW, int kStages>
struct WideCfg {
  static constexpr int kLdV = kVW + 8;  // 80 bytes for kVW = 32: the 8 rows of an ldmatrix 8 x 8 hit distinct banks
  static constexpr int kODo = 0, kOVn = 64 * kLdV, kODv = 128 * kLdV, kOS = 192 * kLdV, kODS = 320 * kLdV;
  static constexpr int kStageElems = 448 * kLdV;
  static constexpr int kOQ = kStages * kStageElems, kOK = kOQ + 64 * kLdW, kODs = kOK + 64 * kLdW;
  static constexpr size_t kTileBytes = size_t{kODs + 64 * kLdD} * 2;
  static constexpr size_t kSumBytes = size_t{2 * 32 * kThr} * sizeof(float);
  static constexpr size_t kBytes = kTileBytes + kSumBytes + (3 * 64 + 2 * 64 + 16) * sizeof(float);
  static_assert(kTileBytes % 16 == 0, "16-byte aligned sums");
  static_assert(kBytes <= 227 * 1024, "shared memory of one block");
};

// The V-contraction products of one kVW-deep step for the warp: ds (rows r0.., Ds columns cs..) += dO Vnᵀ,
// dq += dO Sᵀ, dk += Vn dSᵀ, with want_dw dw += dV Sᵀ (rows r0.., K columns cw..). B operands are stored [n][k].
template <class T, int kVW, class C>
__device__ __forceinline__ void wide_step(float (&ds)[1][4][4], float (&dq)[1][8][4], float (&dk)[1][8][4],
                                          float (&dw)[1][8][4], const uint16_t* st, int r0, int cs, int cw,
                                          bool want_dw) {
  namespace mm = ::strata::cuda::mma;
  using M = MmaT<T>;
  constexpr int kLdV = C::kLdV;
  const M* aDo = reinterpret_cast<const M*>(st + C::kODo + r0 * kLdV);
  const M* aVn = reinterpret_cast<const M*>(st + C::kOVn + r0 * kLdV);
  const M* aDv = reinterpret_cast<const M*>(st + C::kODv + r0 * kLdV);
  const M* bVn = reinterpret_cast<const M*>(st + C::kOVn + cs * kLdV);
  const M* bS = reinterpret_cast<const M*>(st + C::kOS + cw * kLdV);
  const M* bDS = reinterpret_cast<const M*>(st + C::kODS + cw * kLdV);
#pragma unroll
  for (int k0 = 0; k0 < kVW; k0 += 16) {
    const mm::FragA fDo = mm::load_a(aDo, kLdV, 0, k0), fVn = mm::load_a(aVn, kLdV, 0, k0);
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      mm::FragB b0, b1;
      mm::load_b2(b0, b1, bVn, kLdV, k0, np * 16);
      mma16816<T>(ds[0][2 * np], fDo, b0);
      mma16816<T>(ds[0][2 * np + 1], fDo, b1);
    }
    if (want_dw) {
      const mm::FragA fDv = mm::load_a(aDv, kLdV, 0, k0);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        mm::FragB b0, b1;
        mm::load_b2(b0, b1, bS, kLdV, k0, np * 16);
        mma16816<T>(dq[0][2 * np], fDo, b0);
        mma16816<T>(dq[0][2 * np + 1], fDo, b1);
        mma16816<T>(dw[0][2 * np], fDv, b0);
        mma16816<T>(dw[0][2 * np + 1], fDv, b1);
      }
    } else {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        mm::FragB b0, b1;
        mm::load_b2(b0, b1, bS, kLdV, k0, np * 16);
        mma16816<T>(dq[0][2 * np], fDo, b0);
        mma16816<T>(dq[0][2 * np + 1], fDo, b1);
      }
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      mm::FragB b0, b1;
      mm::load_b2(b0, b1, bDS, kLdV, k0, np * 16);
      mma16816<T>(dk[0][2 * np], fVn, b0);
      mma16816<T>(dk[0][2 * np + 1], fVn, b1);
    }
  }
}

template <class T, int kVW, int kStages>
__global__ void __launch_bounds__(kThr, 1) dqkwg_wide_kernel(DqkwgParams p, const int64_t* offs, int64_t items) {
  using C = WideCfg<kVW, kStages>;
  constexpr int kLdV = C::kLdV, kStageElems = C::kStageElems;
  constexpr int kODo = C::kODo, kOVn = C::kOVn, kODv = C::kODv, kOS = C::kOS, kODS = C::kODS;
  constexpr size_t kTileBytes = C::kTileBytes, kSumBytes = C::kSumBytes;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* const tiles = reinterpret_cast<uint16_t*>(smem);
  uint16_t* const sQ = tiles + C::kOQ;
  uint16_t* const sK = tiles + C::kOK;
  uint16_t* const sDs = tiles + C::kODs;
  float* const sSum = reinterpret_cast<float*>(smem + kTileBytes);  // [2][32][kThr]: this thread's slots only
  float* const sG = reinterpret_cast<float*>(smem + kTileBytes + kSumBytes);
  float* const sEq = sG + 64;    // scale exp(γ_i) on valid rows, 0 past L
  float* const sEk = sG + 128;   // exp(γ_last − γ_i) on valid rows, 0 past L
  float* const sRow = sG + 192;  // [2][64] row partials of the two column halves
  float* const sRed = sRow + 128;
  const Dims& d = p.d;
  const bool want_dw = p.dw.present() && p.dv.present(), want_dg = p.dg.present();
  const int warp = threadIdx.x / 32, wm = warp % 4, wn = warp / 4;
  const int r0 = wm * 16, cs = wn * 32, cw = wn * 64;
  const int kc = static_cast<int>(d.K);  // 64 < K <= 128 (wide_applies)
  const int64_t VT = (d.V + kVW - 1) / kVW, steps = d.G * VT;  // V >= 1
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t h = item % d.H, w = item / d.H;
    for_each_chunk(d, offs, w, [&](const DevChunk& c) {
      if (c.hc >= d.NT) return;  // only with invalid cu_seqlens (uniform across the block)
      const int L = static_cast<int>(c.t1 - c.t0);
      __syncthreads();  // the previous chunk's readers are done
      load_tile_async<T, kThr>(sQ, kLdW, 64, 128, p.q, p.q.off(c.b, c.t0, h), p.q.s[1], L, kc);
      load_tile_async<T, kThr>(sK, kLdW, 64, 128, p.k, p.k.off(c.b, c.t0, h), p.k.s[1], L, kc);
      auto gamma = [&](int64_t g) {  // γ of this thread's row and γ_last (threads < L; 0 without a gate)
        const bool gate = p.g.present() && static_cast<int>(threadIdx.x) < L;
        return make_float2(gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + threadIdx.x, h * d.G + g)) : 0.f,
                           gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + L - 1, h * d.G + g)) : 0.f);
      };
      // Step s = g VT + vt loads into stage s % kStages (one commit group), kStages - 1 steps ahead of the one
      // computing. A head's first step also fetches its γ into gn[g % 2] (written to shared memory when the head
      // starts; with VT = 1 and three stages head g + 2 is issued during head g, whose own slot is then consumed).
      float2 gn0 = make_float2(0.f, 0.f), gn1 = gn0;
      auto issue = [&](int64_t s) {
        const int64_t g = s / VT, e0 = (s - g * VT) * kVW, hv = h * d.G + g;
        if (e0 == 0) {
          if (g & 1) gn1 = gamma(g);
          else gn0 = gamma(g);
        }
        const int vc = static_cast<int>(d.V - e0 < kVW ? d.V - e0 : kVW);
        uint16_t* const st = tiles + (s % kStages) * kStageElems;
        load_tile_async<T, kThr>(st + kODo, kLdV, 64, kVW, p.dout, p.dout.off(c.b, c.t0, hv) + e0, p.dout.s[1], L, vc);
        load_tile_async<T, kThr>(st + kOVn, kLdV, 64, kVW, p.v, p.v.off(c.b, c.t0, hv) + e0, p.v.s[1], L, vc);
        if (want_dw)
          load_tile_async<T, kThr>(st + kODv, kLdV, 64, kVW, p.dv, p.dv.off(c.b, c.t0, hv) + e0, p.dv.s[1], L, vc);
        load_tile_async<T, kThr>(st + kOS, kLdV, 128, kVW, p.h, p.h.off(c.b, c.hc, hv, 0) + e0, p.h.s[3], kc, vc);
        load_tile_async<T, kThr>(st + kODS, kLdV, 128, kVW, p.dh, p.dh.off(c.b, c.hc, hv, 0) + e0, p.dh.s[3], kc, vc);
        ::strata::cuda::cp_async_commit();
      };
      // (the q / k tiles join step 0's group; empty groups past the last step keep the wait count uniform)
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {
        if (s < steps) issue(s);
        else ::strata::cuda::cp_async_commit();
      }
#pragma unroll
      for (int x = 0; x < 64; ++x) sSum[x * kThr + threadIdx.x] = 0.f;
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t hv = h * d.G + g;
        if (g > 0) __syncthreads();  // the previous head's readers of sG / Ds / sRow are done
        if (threadIdx.x < 64) {  // the row vectors of this head (read after the step barriers)
          const int i = threadIdx.x;
          const float2 gg = (g & 1) ? gn1 : gn0;
          sG[i] = gg.x;
          sEq[i] = i < L ? p.scale * expf(gg.x) : 0.f;
          sEk[i] = i < L ? expf(gg.y - gg.x) : 0.f;
        }
        float ds[1][4][4], dq[1][8][4], dk[1][8][4], dw[1][8][4];
        zero(ds), zero(dq), zero(dk), zero(dw);
        float sds = 0.f;  // this thread's share of <S, dS>
        for (int64_t vt = 0; vt < VT; ++vt) {
          const int64_t s = g * VT + vt;
          if (s + kStages - 1 < steps) issue(s + kStages - 1);  // into the stage step s - 1 read
          else ::strata::cuda::cp_async_commit();
          ::strata::cuda::cp_async_wait<kStages - 1>();  // step s's group is complete (later ones may be in flight)
          __syncthreads();
          const uint16_t* const st = tiles + (s % kStages) * kStageElems;
          wide_step<T, kVW, C>(ds, dq, dk, dw, st, r0, cs, cw, want_dw);
          if (want_dg)  // S, dS [128][kVW]: segments of 8 (zero outside the valid rows / columns)
            for (int e = threadIdx.x; e < 128 * (kVW / 8); e += kThr) {
              const int x = e / (kVW / 8), col = (e % (kVW / 8)) * 8;
              const uint4 a4 = *reinterpret_cast<const uint4*>(st + kOS + x * kLdV + col);
              const uint4 b4 = *reinterpret_cast<const uint4*>(st + kODS + x * kLdV + col);
              const uint32_t* a32 = reinterpret_cast<const uint32_t*>(&a4);
              const uint32_t* b32 = reinterpret_cast<const uint32_t*>(&b4);
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                sds += Elem<T>::to(static_cast<uint16_t>(a32[j] & 0xffffu)) * Elem<T>::to(static_cast<uint16_t>(b32[j] & 0xffffu));
                sds += Elem<T>::to(static_cast<uint16_t>(a32[j] >> 16)) * Elem<T>::to(static_cast<uint16_t>(b32[j] >> 16));
              }
            }
          __syncthreads();  // stage s % kStages is free for step s + kStages
        }
        // Epilogue of the head.
        const float gl = sG[L - 1];
        float kdki = 0.f;
        const bool diag_block = cs <= r0 + 15;  // Ds blocks wholly above the diagonal form no exponentials
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int i = r0 + frag_row(0, e), j = cs + frag_col(nt, e);  // j even
            float ds0 = 0.f, ds1 = 0.f;
            if (diag_block && i < L) {
              const float gi = sG[i];
              if (j <= i) ds0 = p.scale * ds[0][nt][e] * expf(gi - sG[j]);
              if (j + 1 <= i) ds1 = p.scale * ds[0][nt][e + 1] * expf(gi - sG[j + 1]);
            }
            *reinterpret_cast<uint32_t*>(sDs + i * kLdD + j) = Elem<T>::from(ds0) | (uint32_t{Elem<T>::from(ds1)} << 16);
          }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int i = r0 + frag_row(0, e), x = cw + frag_col(nt, e);  // x even
            const float fq = sEq[i], fk = sEk[i];  // 0 on rows past L
            dq[0][nt][e] *= fq, dq[0][nt][e + 1] *= fq;
            dk[0][nt][e] *= fk, dk[0][nt][e + 1] *= fk;
            if (want_dw && i < L && x < kc)
              st_pair(p.dw, p.dw.off(c.b, c.t0 + i, hv) + x, -dw[0][nt][e], -dw[0][nt][e + 1], x + 1 < kc);
            const uint32_t k2 = *reinterpret_cast<const uint32_t*>(sK + i * kLdW + x);
            kdki += Elem<T>::to(static_cast<uint16_t>(k2 & 0xffffu)) * dk[0][nt][e];
            kdki += Elem<T>::to(static_cast<uint16_t>(k2 >> 16)) * dk[0][nt][e + 1];
          }
        // Σ k·dK_int and <S, dS> over the block (fixed order; its barriers also complete Ds).
        const float2 sums = block_sum2<kThr>(kdki, sds, sRed);
        // dQ += Ds K ; dK += Dsᵀ Q   (B(j, x) = K[j][x], Q[j][x]: stored [k][n]; A = Dsᵀ: stored [k][m])
        warp_gemm<T, true, true, 1, 8>(dq, sDs + r0 * kLdD, kLdD, sK + cw, kLdW, 64);
        warp_gemm<T, false, true, 1, 8>(dk, sDs + r0, kLdD, sQ + cw, kLdW, 64);
        if (want_dg) {
          float part[2] = {0.f, 0.f};  // row partials of q·dQ − k·dK over this warp's 64 columns
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = r0 + frag_row(0, e), x = cw + frag_col(nt, e);
              part[e >> 1] += Elem<T>::to(sQ[i * kLdW + x]) * dq[0][nt][e] - Elem<T>::to(sK[i * kLdW + x]) * dk[0][nt][e];
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
            float v = sRow[i] + sRow[64 + i];
            if (i == L - 1) v += expf(gl) * sums.y + sums.x;
            st_f32(p.dg, p.dg.off(c.b, c.t0 + i, hv), v);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            sSum[(nt * 4 + e) * kThr + threadIdx.x] += dq[0][nt][e];
            sSum[(32 + nt * 4 + e) * kThr + threadIdx.x] += dk[0][nt][e];
          }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int i = r0 + frag_row(0, e), x = cw + frag_col(nt, e);
          if (i < L && x < kc) {
            const float* a = sSum + (nt * 4 + e) * kThr + threadIdx.x;
            const float* b = sSum + (32 + nt * 4 + e) * kThr + threadIdx.x;
            st_pair(p.dq, p.dq.off(c.b, c.t0 + i, h) + x, a[0], a[kThr], x + 1 < kc);
            st_pair(p.dk, p.dk.off(c.b, c.t0 + i, h) + x, b[0], b[kThr], x + 1 < kc);
          }
        }
    });
  }
}

}  // namespace

bool chunk_bwd_dqkwg_wide_applies(const gdn_bwd::Dims& d) { return d.K > 64 && d.K <= 128 && d.V >= 1 && d.G >= 1; }

namespace {
template <class T, int kStages>
strata_status launch_wide(const DqkwgParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  constexpr size_t smem = WideCfg<32, kStages>::kBytes;
  STRATA_CUDA_TRY(cudaFuncSetAttribute(dqkwg_wide_kernel<T, 32, kStages>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(items, int64_t{1} << 30));
  dqkwg_wide_kernel<T, 32, kStages><<<blocks, kThr, smem, stream>>>(p, offs, items);
  return cuda::check_launch(kStages == 3 ? "chunk_bwd_dqkwg (mma, wide, three stages)" : "chunk_bwd_dqkwg (mma, wide)");
}
}  // namespace

int chunk_bwd_dqkwg_wide_launch(const DqkwgParams& p, const int64_t* offs, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t items = num_windows(p.d) * p.d.H;
  if (items <= 0) return STRATA_SUCCESS;
  const bool bf16 = p.q.dtype == STRATA_DTYPE_BF16, three = p.mma_variant == kDqkwgWide3;
  if (bf16) return three ? launch_wide<bf16_t, 3>(p, offs, items, stream) : launch_wide<bf16_t, 2>(p, offs, items, stream);
  return three ? launch_wide<f16_t, 3>(p, offs, items, stream) : launch_wide<f16_t, 2>(p, offs, items, stream);
}

}  // namespace strata::linear_attn
