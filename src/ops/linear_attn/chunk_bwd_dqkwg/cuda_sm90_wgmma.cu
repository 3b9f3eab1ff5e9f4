// Hopper warpgroup-MMA kernel of chunk_bwd_dqkwg ("cuda.sm90.wgmma", bf16 token and state tensors, K = V = 128,
// chunk size 64; sm_90a): one 384-thread block (three warpgroups) per (token window, q/k head h), grid-stride on
// grid.x. The block walks the G value heads hv = h G + g in increasing g, each in two steps over 64-column halves
// of V, and sums dq, dk over the heads in f32 registers (no per-head workspace, no reduction pass; dγ is written
// directly, no per-K-tile partials). Per chunk and value head (S = h[c], dS = dh[c]), by warpgroup role:
//   dq group:  dQh += dO Sᵀ (m64n128, per step); epilogue: dQh ·= scale exp(γ), dQh += Ds K, q·dQh per row,
//              dQ += dQh
//   dk group:  dKh += Vn dSᵀ; epilogue: dKh ·= exp(γ_last − γ), Σ k·dK_int, dKh += Dsᵀ Q, k·dKh per row, dK += dKh
//   ds group:  Ds += dO Vnᵀ (m64n64), dW += dV Sᵀ (m64n128), ⟨S, dS⟩; epilogue: Ds = scale Lower(Ds ⊙ Γ) rounded
//              into shared memory twice (as is: A of Ds K; transposed by stmatrix.trans: A of Dsᵀ Q), dw = −dW out,
//              then dγ_i = q_i·dQh_i − k_i·dKh_i (+ exp(γ_last) ⟨S, dS⟩ + Σ k·dK_int on the last row) out.
// Named barriers hand Ds to the dq / dk groups and their row sums back. Loads (by the dq and dk groups): a
// three-stage cp.async ring of steps {dO, Vn, dV [64][64], S, dS [128][64]} (56 KiB each, K-major no-swizzle
// core-matrix tiles, wgmma_layout.h), step s + 2 requested while step s computes; the chunk's q, k [64][128] come
// with step 0 into the third stage's space and are transposed (ldmatrix + stmatrix.trans) into Qᵀ, Kᵀ [128][64]
// before step 2 reuses it. Every sum runs in a fixed order: same bits every run, no atomics.
#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"
#include "tile/cuda/wgmma.cuh"
#include "tile/cuda/wgmma_layout.h"

#include <fmt/format.h>

#include <algorithm>

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
using gdn_bwd::tc::block_sum2;
using gdn_bwd::tc::st_pair;
namespace wg = ::strata::cuda::wgmma;
namespace mma = ::strata::cuda::mma;
using Bf = __nv_bfloat16;

// Three warpgroups: the dq group (dO Sᵀ, Ds K: all 128 K columns of dq), the dk group (Vn dSᵀ, Dsᵀ Q) and the
// ds group (dO Vnᵀ → Ds, dV Sᵀ → dw, ⟨S, dS⟩, dγ out); the first two also issue the loads.
constexpr int kThr = 384, kLoaders = 256;
enum { kRoleDq = 0, kRoleDk = 1, kRoleDs = 2 };
enum { kBarDs = 1, kBarRows = 2 };  // named barriers: Ds ready (ds → dq, dk), row sums ready (dq, dk → ds)
// Shared memory (bytes): three stages {dO, Vn, dV: [64][64]; S, dS: [128][64]}, Qᵀ, Kᵀ [128][64], Ds, Dsᵀ [64][64]
// (K-major core-matrix tiles), then f32 γ, scale exp(γ), exp(γ_last − γ) [64] each, row partials [2][64] and the
// block-sum scratch [16].
constexpr uint32_t kTok = 64 * 64 * 2, kSt = 128 * 64 * 2;
constexpr uint32_t oDo = 0, oVn = kTok, oDv = 2 * kTok, oS = 3 * kTok, oDS = 3 * kTok + kSt, kStageB = 3 * kTok + 2 * kSt;
constexpr int kStages = 3;
constexpr uint32_t oQT = kStages * kStageB, oKT = oQT + kSt, oDs = oKT + kSt, oDsT = oDs + kTok, oF = oDsT + kTok;
constexpr size_t kSmem = oF + (3 * 64 + 2 * 64 + 16) * sizeof(float);
static_assert(kSmem <= 227 * 1024, "shared memory of one block");
static_assert(2 * kTok * 2 <= kStageB, "the chunk's q, k fit in a stage");

__device__ __forceinline__ float bf(uint16_t b) { return bf16_bits_to_f32(b); }

// Ds (the ds group's m64n64 accumulator d, rows 16 w.. of warp w) rounded to bf16, transposed, into the K-major
// tile Dsᵀ [64][64] at byte address x (stmatrix.x4.trans, layout st_trans_off).
__device__ __forceinline__ void store_ds_trans(uint32_t x, int w, int lane, const float (&d)[32]) {
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) {
    const uint32_t a = x + 2u * static_cast<uint32_t>(wg::st_trans_off<64>(lane, 16 * w, jp));
    const int j0 = 2 * jp, j1 = 2 * jp + 1;
    wg::stmatrix_x4_trans(a, mma::pack2<Bf>(d[4 * j0], d[4 * j0 + 1]), mma::pack2<Bf>(d[4 * j0 + 2], d[4 * j0 + 3]),
                          mma::pack2<Bf>(d[4 * j1], d[4 * j1 + 1]), mma::pack2<Bf>(d[4 * j1 + 2], d[4 * j1 + 3]));
  }
}

// cp.async of a [rows][64] bf16 block (row stride rs elements, rows >= valid zero-filled) into a tile_off<64> tile
// at shared byte address dst. Thread: segment q = (tid / 8) % 8, rows r0 + 32 it with r0 = tid % 8 + 8 (tid / 64):
// the 8 threads of a 128-byte shared wavefront fill one core matrix; tile_off<64>(r0 + 32 it, c) moves by 4 it
// rows of core matrices.
template <int kRows>
__device__ __forceinline__ void load64(uint32_t dst, const uint16_t* src, int64_t rs, int valid) {
  const int tid = threadIdx.x, q = (tid >> 3) & 7, r0 = (tid & 7) + 8 * (tid >> 6);
  const uint32_t d0 = dst + 2u * static_cast<uint32_t>(wg::tile_off<64>(r0, 8 * q));
  const uint16_t* s0 = src + 8 * q;
#pragma unroll
  for (int it = 0; it < kRows / 32; ++it) {
    const int r = r0 + 32 * it;
    const bool ok = r < valid;
    ::strata::cuda::cp_async16(d0 + it * (4u * 512u * 2u), ok ? s0 + r * rs : s0, ok);
  }
}
// The same for a [64][128] block into a tile_off<128> tile: segment q = (tid / 8) % 16, rows r0 + 16 it with
// r0 = tid % 8 + 8 (tid / 128).
__device__ __forceinline__ void load128(uint32_t dst, const uint16_t* src, int64_t rs, int valid) {
  const int tid = threadIdx.x, q = (tid >> 3) & 15, r0 = (tid & 7) + 8 * (tid >> 7);
  const uint32_t d0 = dst + 2u * static_cast<uint32_t>(wg::tile_off<128>(r0, 8 * q));
  const uint16_t* s0 = src + 8 * q;
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int r = r0 + 16 * it;
    const bool ok = r < valid;
    ::strata::cuda::cp_async16(d0 + it * (2u * 8u * 128u * 2u), ok ? s0 + r * rs : s0, ok);
  }
}
// X [64 t][128 x] (tile_off<128>) → Xᵀ [128 x][64 t] (tile_off<64>): 128 8 x 8 blocks, 4 per ldmatrix.x4 /
// stmatrix.x4.trans, 4 of those per warp. Lane 8 i + r addresses row r of block i in both.
__device__ __forceinline__ void transpose_tile(const unsigned char* smem, uint32_t sbase, uint32_t src, uint32_t dst) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane & 7;
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int b = (warp * 4 + it) * 4 + (lane >> 3), tb = b >> 4, xb = b & 15;
    uint32_t v[4];
    mma::ldmatrix_x4(v, smem + (src - sbase) + 2 * wg::tile_off<128>(8 * tb + r, 8 * xb));
    wg::stmatrix_x4_trans(dst + 2u * static_cast<uint32_t>(wg::tile_off<64>(8 * xb + r, 8 * tb)), v[0], v[1], v[2], v[3]);
  }
}

__global__ void __launch_bounds__(kThr, 1)
    dqkwg_wgmma_kernel(DqkwgParams p, const int64_t* offs, int64_t items) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host entry launches this kernel only on sm_90 devices of an sm_90a build)
#else
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sb = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  float* const sG = reinterpret_cast<float*>(smem + oF);
  float* const sEq = sG + 64;    // scale exp(γ_i) on valid rows, 0 past L
  float* const sEk = sG + 128;   // exp(γ_last − γ_i) on valid rows, 0 past L
  float* const sRow = sG + 192;  // [2][64]: q·dQ (dq group), k·dK (dk group) per row
  float* const sRed = sG + 320;  // [4..7]: the dk group's warp sums of k·dK_int, [8..11]: the ds group's of S ⊙ dS
  const uint16_t* const sQT = reinterpret_cast<const uint16_t*>(smem + oQT);
  const uint16_t* const sKT = reinterpret_cast<const uint16_t*>(smem + oKT);
  const Dims& d = p.d;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, role = warp >> 2, w = warp & 3;
  const bool want_dw = p.dw.present() && p.dv.present(), want_dg = p.dg.present();
  const bool loader = tid < kLoaders;
  const int64_t G = d.G;
  const int steps = static_cast<int>(2 * G);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t h = item % d.H, win = item / d.H;
    for_each_chunk(d, offs, win, [&](const DevChunk& c) {
      if (c.hc >= d.NT) return;  // only with invalid cu_seqlens (uniform across the block)
      const int L = static_cast<int>(c.t1 - c.t0);
      __syncthreads();  // the previous chunk's readers are done
      // Requests step s = 2 g + half into stage s % 3 (one commit group of each loader thread, empty past the
      // last step); step 0 also brings q, k into the third stage's space.
      auto issue = [&](int s) {
        if (s < steps) {
          const int64_t hv = h * G + (s >> 1), e0 = 64 * (s & 1);
          const uint32_t st = sb + (s % kStages) * kStageB;
          load64<64>(st + oDo, static_cast<const uint16_t*>(p.dout.p) + p.dout.off(c.b, c.t0, hv) + e0, p.dout.s[1], L);
          load64<64>(st + oVn, static_cast<const uint16_t*>(p.v.p) + p.v.off(c.b, c.t0, hv) + e0, p.v.s[1], L);
          if (want_dw)
            load64<64>(st + oDv, static_cast<const uint16_t*>(p.dv.p) + p.dv.off(c.b, c.t0, hv) + e0, p.dv.s[1], L);
          load64<128>(st + oS, static_cast<const uint16_t*>(p.h.p) + p.h.off(c.b, c.hc, hv, 0) + e0, p.h.s[3], 128);
          load64<128>(st + oDS, static_cast<const uint16_t*>(p.dh.p) + p.dh.off(c.b, c.hc, hv, 0) + e0, p.dh.s[3], 128);
          if (s == 0) {
            const uint32_t qk = sb + 2 * kStageB;
            load128(qk, static_cast<const uint16_t*>(p.q.p) + p.q.off(c.b, c.t0, h), p.q.s[1], L);
            load128(qk + kTok * 2, static_cast<const uint16_t*>(p.k.p) + p.k.off(c.b, c.t0, h), p.k.s[1], L);
          }
        }
        ::strata::cuda::cp_async_commit();
      };
      if (loader) issue(0), issue(1);
      // Accumulators by role: dq group: acc0 = dQh, acc1 = Σ_g dQh; dk group: dKh, Σ_g dKh; ds group: acc0 = dW,
      // acc1[0..31] = Ds.
      float acc0[64], acc1[64];
#pragma unroll
      for (int x = 0; x < 64; ++x) acc0[x] = acc1[x] = 0.f;
      float(&ds)[32] = *reinterpret_cast<float(*)[32]>(&acc1[0]);
      float sds = 0.f;  // ds group: this thread's share of ⟨S, dS⟩ of the current head
      for (int s = 0; s < steps; ++s) {
        const int64_t g = s >> 1, hv = h * G + g;
        const int half = s & 1;
        if (loader) {
          ::strata::cuda::cp_async_wait<1>();  // step s's group is complete (step s + 1's may be in flight)
          wg::fence_proxy_async();
        }
        __syncthreads();  // stage s % 3 visible; step s - 1's readers of stage (s + 2) % 3 are done
        if (s == 0) {  // q, k → Qᵀ, Kᵀ (B operands of Dsᵀ Q and Ds K, and the q / k values of dγ)
          if (loader) {
            const uint32_t qk = sb + 2 * kStageB;
            transpose_tile(smem, sb, qk, sb + oQT);
            transpose_tile(smem, sb, qk + kTok * 2, sb + oKT);
            wg::fence_proxy_async();
          }
          __syncthreads();  // the third stage is free for step 2; Qᵀ, Kᵀ visible
        }
        if (loader) issue(s + 2);
        const uint32_t st = sb + (s % kStages) * kStageB;
        wg::reg_fence(acc0), wg::reg_fence(acc1);
        wg::wg_fence();
        if (role == kRoleDq) {
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wg::mma_ss<Bf, 128>(acc0, wg::tile_desc<64>(st + oDo, ks), wg::tile_desc<64>(st + oS, ks), (half | ks) != 0);
        } else if (role == kRoleDk) {
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wg::mma_ss<Bf, 128>(acc0, wg::tile_desc<64>(st + oVn, ks), wg::tile_desc<64>(st + oDS, ks), (half | ks) != 0);
        } else {
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            wg::mma_ss<Bf, 64>(ds, wg::tile_desc<64>(st + oDo, ks), wg::tile_desc<64>(st + oVn, ks), (half | ks) != 0);
            if (want_dw)
              wg::mma_ss<Bf, 128>(acc0, wg::tile_desc<64>(st + oDv, ks), wg::tile_desc<64>(st + oS, ks), (half | ks) != 0);
          }
        }
        wg::wg_commit();
        if (role == kRoleDs) {
          // While the products run: this head's γ (first step), ⟨S, dS⟩ over this stage (the same layout for both).
          const int t = tid - 2 * 128;
          if (half == 0 && t < 64) {
            const bool gate = p.g.present() && t < L;
            const float gi = gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + t, hv)) : 0.f;
            const float gl = gate ? ld_f32(p.g, p.g.off(c.b, c.t0 + L - 1, hv)) : 0.f;
            sG[t] = gi;
            sEq[t] = t < L ? p.scale * expf(gi) : 0.f;
            sEk[t] = t < L ? expf(gl - gi) : 0.f;
          }
          if (half == 0) sds = 0.f;
          if (want_dg) {
#pragma unroll 4
            for (int k = 0; k < 8; ++k) {
              const int e = (t + 128 * k) * 8;
              const uint4 a4 = *reinterpret_cast<const uint4*>(smem + (st - sb) + oS + 2 * e);
              const uint4 b4 = *reinterpret_cast<const uint4*>(smem + (st - sb) + oDS + 2 * e);
              const uint32_t* a32 = reinterpret_cast<const uint32_t*>(&a4);
              const uint32_t* b32 = reinterpret_cast<const uint32_t*>(&b4);
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const float2 fa = mma::unpack2<Bf>(a32[j]), fb = mma::unpack2<Bf>(b32[j]);
                sds += fa.x * fb.x;
                sds += fa.y * fb.y;
              }
            }
          }
        }
        wg::wg_wait<0>();
        wg::reg_fence(acc0), wg::reg_fence(acc1);
        if (half == 0) continue;

        // ---- epilogue of head g (sG, sEq, sEk written in step (g, 0), visible since step (g, 1)'s barrier) ----
        if (role == kRoleDs) {
          const float gl = sG[L - 1];
          // Ds: gate and scale on and below the diagonal of valid rows, rounded, into Ds and Dsᵀ (Dsᵀ via stmatrix.trans).
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
              const int i = wg::acc_row(w, lane, e), col = wg::acc_col(lane, j, e);
              const int x = 4 * j + e;
              float v0 = 0.f, v1 = 0.f;
              if (i < L && col <= i) {
                const float gi = sG[i];
                v0 = p.scale * ds[x] * expf(gi - sG[col]);
                if (col + 1 <= i) v1 = p.scale * ds[x + 1] * expf(gi - sG[col + 1]);
              }
              ds[x] = v0, ds[x + 1] = v1;
              *reinterpret_cast<uint32_t*>(smem + oDs + 2 * wg::tile_off<64>(i, col)) = mma::pack2<Bf>(v0, v1);
            }
          store_ds_trans(sb + oDsT, w, lane, ds);
          wg::fence_proxy_async();
          wg::bar_arrive(kBarDs, kThr);  // Ds, Dsᵀ ready for the dq and dk groups
#pragma unroll
          for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
              const int i = wg::acc_row(w, lane, e), col = wg::acc_col(lane, j, e);
              if (want_dw && i < L)
                st_pair(p.dw, p.dw.off(c.b, c.t0 + i, hv) + col, -acc0[4 * j + e], -acc0[4 * j + e + 1], true);
            }
          float v = sds;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          if (lane == 0) sRed[8 + w] = v;
          wg::bar_sync(kBarRows, kThr);  // the row sums of the dq and dk groups, Σ k·dK_int; this group's sums
          const int t = tid - 2 * 128;
          if (want_dg && t < L) {
            float x = sRow[t] - sRow[64 + t];
            if (t == L - 1) {
              const float sds_sum = (sRed[8] + sRed[9]) + (sRed[10] + sRed[11]);
              const float kdki_sum = (sRed[4] + sRed[5]) + (sRed[6] + sRed[7]);
              x += expf(gl) * sds_sum + kdki_sum;
            }
            st_f32(p.dg, p.dg.off(c.b, c.t0 + t, hv), x);
          }
          continue;
        }
        // dq group: dQh ·= scale exp(γ), += Ds K, q·dQh; dk group: dKh ·= exp(γ_last − γ), Σ k·dK_int,
        // += Dsᵀ Q, k·dKh.
        const bool dqg = role == kRoleDq;
        const float* const fac = dqg ? sEq : sEk;
        const uint16_t* const xt = dqg ? sQT : sKT;  // q (dq group) or k (dk group) values: Xᵀ [128][64]
        float kdki = 0.f;
#pragma unroll
        for (int x = 0; x < 64; ++x) {
          const int i = wg::acc_row(w, lane, x & 3);
          acc0[x] *= fac[i];
          if (!dqg) kdki += bf(sKT[wg::tile_off<64>(wg::acc_col(lane, x >> 2, x & 3), i)]) * acc0[x];
        }
        if (!dqg) {
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) kdki += __shfl_xor_sync(0xffffffffu, kdki, o);
          if (lane == 0) sRed[4 + w] = kdki;
        }
        wg::bar_sync(kBarDs, kThr);  // Ds, Dsᵀ from the ds group
        wg::reg_fence(acc0);
        wg::wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wg::mma_ss<Bf, 128>(acc0, wg::tile_desc<64>(sb + (dqg ? oDs : oDsT), ks),
                              wg::tile_desc<64>(sb + (dqg ? oKT : oQT), ks), 1);
        wg::wg_commit();
        wg::wg_wait<0>();
        wg::reg_fence(acc0);
        float part[2] = {0.f, 0.f};  // rows acc_row(w, lane, 0) and + 8 over this thread's 32 columns
        if (want_dg) {
#pragma unroll
          for (int x = 0; x < 64; ++x) {
            const int i = wg::acc_row(w, lane, x & 3), col = wg::acc_col(lane, x >> 2, x & 3);
            part[(x & 3) >> 1] += bf(xt[wg::tile_off<64>(col, i)]) * acc0[x];
          }
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            part[r] += __shfl_xor_sync(0xffffffffu, part[r], 1);
            part[r] += __shfl_xor_sync(0xffffffffu, part[r], 2);
          }
          if ((lane & 3) == 0) {
            const int i = 16 * w + (lane >> 2);
            sRow[role * 64 + i] = part[0];
            sRow[role * 64 + i + 8] = part[1];
          }
        }
        wg::bar_arrive(kBarRows, kThr);
#pragma unroll
        for (int x = 0; x < 64; ++x) acc1[x] += acc0[x];
      }
      if (role != kRoleDs) {
        const View& out = role == kRoleDq ? p.dq : p.dk;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int i = wg::acc_row(w, lane, e), col = wg::acc_col(lane, j, e);
            if (i < L) st_pair(out, out.off(c.b, c.t0 + i, h) + col, acc1[4 * j + e], acc1[4 * j + e + 1], true);
          }
      }
    });
  }
#endif
}

bool aligned16(const View& v) { return (reinterpret_cast<uintptr_t>(v.p) & 15u) == 0; }

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

// Workspace: the chunk offsets (the kernel's only use), or the mma.sync kernel's when it runs instead (unaligned).
size_t chunk_bwd_dqkwg_cuda_wgmma_workspace(const Dims& d) { return chunk_bwd_dqkwg_cuda_mma_workspace(d); }

int chunk_bwd_dqkwg_cuda_wgmma(const DqkwgParams& p, void* workspace, void* stream_ptr) {
  const std::string why = chunk_bwd_dqkwg_cuda_wgmma_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_bwd_dqkwg cuda.sm90.wgmma: {}", why);
  // Tensors not 16-byte aligned (views at odd offsets): the mma.sync kernel, which copies them element-wise.
  for (const View* v : {&p.q, &p.k, &p.v, &p.dout, &p.h, &p.dh, &p.dv})
    if (v->present() && !aligned16(*v)) {
      DqkwgParams pm = p;
      pm.mma_variant = kDqkwgTwoPerSm;
      return chunk_bwd_dqkwg_cuda_mma(pm, workspace, stream_ptr);
    }
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  int64_t* offs = static_cast<int64_t*>(workspace);
  const int64_t items = num_windows(d) * d.H;
  if (items == 0) return STRATA_SUCCESS;
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  STRATA_CUDA_TRY(cudaFuncSetAttribute(dqkwg_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  dqkwg_wgmma_kernel<<<static_cast<unsigned>(blocks), kThr, kSmem, stream>>>(p, offs, items);
  return cuda::check_launch("chunk_bwd_dqkwg (wgmma)");
}

}  // namespace strata::linear_attn
