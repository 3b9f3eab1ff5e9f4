// Hopper warpgroup-MMA kernel of prepare_wy_repr_bwd ("cuda.sm90.wgmma", bf16 k, v, A, dw, du, dv, K = V = 128,
// chunk size 64; sm_90a). One 128-thread block (one warpgroup) per (token window, q/k head h), grid-stride on
// grid.x, two blocks per SM (110 KiB of shared memory each); it walks the G value heads hv = h G + g in increasing
// g and sums dk over them in f32 accumulators (no per-head workspace, no reduction pass).
//
// Per value head, in this order (E = exp(γ); every product m64nNk16 with bf16 operands and f32 accumulators;
// K-major core-matrix tiles, wgmma_layout.h):
//   dA  = StrictLower(dW Kᵀ diag(βE) + dU Vᵀ diag(β))   dW, K and dU, V as loaded → dAᵀ tile (stmatrix.trans);
//                                                      Aᵀ (A transposed by ldmatrix / stmatrix.trans) meanwhile
//   for the 64-row halves x of K (feature dimension on the MMA rows, token on the columns):
//     Xᵀ = dWᵀ A (X = Aᵀ dW) ; dkᵀ += Xᵀ diag(βE) ; Σ_x X k    dWᵀ and Kᵀ fragments by ldmatrix.trans from the tiles
//   for the 64-row halves of V: Yᵀ = dUᵀ A ; Σ_v Y v ; dv = diag(β) Y (staged transposed by stmatrix.trans, stored
//   as 16-byte rows)
//   — dW, V, dU are dead here: head g + 1's load into them while the rest of head g runs —
//   KK  = K Kᵀ ; tmp = Aᵀ dA (Aᵀ, dAᵀ) ; dM = −StrictLower(tmp Aᵀ) (tmp from registers, bf16; A as loaded)
//   dP = dM ⊙ Γ ; Bm = diag(β) dP (strictly lower) → bf16 tiles Bm (as is) and Bmᵀ (stmatrix.trans), added into
//   Sym = Bm + Bmᵀ (disjoint supports: the same values as the f32 sum rounded once); dβ / dγ sums of dP ⊙ KK from
//   the registers; dβ, dγ of the head's rows out
//   — A is dead here: head g + 1's loads into it —
//   dkᵀ[x][i] += Σ_j K[j][x] Sym[j][i] (Sym K)
// then dk (+ dk_add) of the chunk through an f32 staging tile (row-contiguous stores).
// The feature-on-rows form needs no transposed copy of dW, dU or K: their transposes are A operands, read from the
// tiles as loaded by ldmatrix.trans into registers. Every sum runs in a fixed order: the same bits every run.
#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"
#include "ops/linear_attn/prepare_wy_repr_bwd/cuda_wy_bwd.cuh"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"
#include "tile/cuda/wgmma.cuh"
#include "tile/cuda/wgmma_layout.h"

#include <fmt/format.h>

#include <algorithm>

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
namespace wg = ::strata::cuda::wgmma;
namespace mma = ::strata::cuda::mma;
using Bf = __nv_bfloat16;

constexpr int kThr = 128;  // one warpgroup
// Shared memory (bytes): K, dW, V, dU [64][128] and A, Aᵀ, dAᵀ, Bmᵀ (T1), Bm then Sym (T2) [64][64] bf16 tiles
// (tile_off layouts), then f32 γ, β, E, Σ_j dP KK [64] each, the dγ column partials [4 warps][64], the Σ X k and
// Σ Y v partials [2 halves x 4 warps][64] each. dv is staged [64][128] bf16 over T1 and T2 (free then), dk
// [64][kDkLd] f32 over dW, V, dU (dead at the chunk's end).
constexpr uint32_t kT128 = 64 * 128 * 2, kT64 = 64 * 64 * 2;
constexpr uint32_t oK = 0, oDw = oK + kT128, oV = oDw + kT128, oDu = oV + kT128, oA = oDu + kT128, oAT = oA + kT64,
                   oDAT = oAT + kT64, oT1 = oDAT + kT64, oT2 = oT1 + kT64, oF = oT2 + kT64;
constexpr uint32_t oDvStage = oT1, oDkStage = oDw;
constexpr int kDkLd = 132;  // ≡ 4 mod 32: the transposing f32 stores of a warp hit 32 banks
static_assert(oDvStage + kT128 <= oF, "dv staging over T1 and T2 only");
static_assert(oDkStage + 64 * kDkLd * 4 <= oA, "dk staging over dW, V, dU only");
constexpr size_t kSmem = oF + (4 * 64 + 4 * 64 + 8 * 64 + 8 * 64) * sizeof(float);
static_assert(2 * (kSmem + 1024) <= 228 * 1024, "two blocks per SM");

// cp.async of a [64][kCols] bf16 block (rows < valid; the others zero-filled, not read) into a tile_off<kCols> tile at
// shared byte address dst: thread t copies segment q = (t / 8) % S (S = kCols / 8) of rows r0 + 8 kGroups it,
// r0 = t % 8 + 8 ((t / 8) / S) (the 8 threads of a core matrix write its 128 contiguous bytes). Returns nothing;
// src is row 0, column 0 of the block, rs its row stride.
template <int kCols>
struct TileRows {
  static constexpr int S = kCols / 8, kGroups = kThr / (8 * S), kIt = 64 / (8 * kGroups);
  __device__ static int seg() { return (threadIdx.x >> 3) % S; }
  __device__ static int row(int it) { return (threadIdx.x & 7) + 8 * ((threadIdx.x >> 3) / S) + 8 * kGroups * it; }
};
template <int kCols>
__device__ __forceinline__ void load_tile(uint32_t dst, const uint16_t* src, int64_t rs, int valid) {
  using R = TileRows<kCols>;
  const int q = R::seg();
#pragma unroll
  for (int it = 0; it < R::kIt; ++it) {
    const int r = R::row(it);
    const bool ok = r < valid;
    ::strata::cuda::cp_async16(dst + 2u * static_cast<uint32_t>(wg::tile_off<kCols>(r, 8 * q)),
                               ok ? src + r * rs + 8 * q : src, ok);
  }
}

// A fragments (m16n8k16 layout, 4 k-steps of 16 tokens) of Xᵀ rows x0 + 16 w.. for the [64 t][128 x] tile X at
// shared byte address base: ldmatrix.trans (wgmma_layout.h's ld_trans_off).
__device__ __forceinline__ void frags_trans(uint32_t (&f)[4][4], uint32_t base, int x0, int w, int lane) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    wg::ldmatrix_x4_trans(f[ks], base + 2u * static_cast<uint32_t>(wg::ld_trans_off<128>(lane, 16 * ks, x0 + 16 * w)));
}
// Value (x, i) of an accumulator-layout register u = 4 j + e out of the Kᵀ / Vᵀ fragments f (the A fragment of
// k-step j / 2 covers the accumulator's 8-column blocks j = 2 ks, 2 ks + 1: register (e / 2) + 2 (j % 2), half e % 2).
__device__ __forceinline__ float frag_at(const uint32_t (&f)[4][4], int j, int e) {
  const float2 v = mma::unpack2<Bf>(f[j >> 1][(e >> 1) + 2 * (j & 1)]);
  return (e & 1) ? v.y : v.x;
}
// a + b on two bf16 pairs.
__device__ __forceinline__ uint32_t add_bf16x2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 s = __hadd2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&s);
}
// Column sums of an m64n64 accumulator block (16 columns a thread: 8 j + 2 (lane % 4) + b at cs[2 j + b]) over the
// warp's 16 rows: the 8 row groups by an xor butterfly (4, 8, 16: every lane of a column holds the same bits), then
// lanes 0-3 write them to out[64].
__device__ __forceinline__ void col_sums_to(float (&cs)[16], float* out, int lane) {
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int o = 4; o <= 16; o <<= 1) cs[i] += __shfl_xor_sync(0xffffffffu, cs[i], o);
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < 8; ++j) out[8 * j + 2 * lane] = cs[2 * j], out[8 * j + 2 * lane + 1] = cs[2 * j + 1];
  }
}

// Zᵀ = Pᵀ A for the 64-row half x0.. of the feature dimension (P the [64 t][128 x] tile at shared byte address pb,
// its transpose as register A fragments by ldmatrix.trans; Aᵀ tile at atb as B) into z, and the column sums of
// Zᵀ ⊙ Qᵀ (Σ_x Z_ix Q_ix per token i over the warp's 16 rows x; Q the [64 t][128 x] tile at qb) into out[64].
__device__ __forceinline__ void half_product(float (&z)[32], uint32_t pb, uint32_t qb, uint32_t atb, int x0, int w,
                                             int lane, float* out) {
  uint32_t qf[4][4], pf[4][4];
  frags_trans(qf, qb, x0, w, lane);
  frags_trans(pf, pb, x0, w, lane);
#pragma unroll
  for (int i = 0; i < 32; ++i) z[i] = 0.f;
  wg::reg_fence(z);
  wg::wg_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wg::mma_rs<Bf, 64>(z, pf[ks], wg::tile_desc<64>(atb, ks), ks != 0);
  wg::wg_commit();
  wg::wg_wait<0>();
  wg::reg_fence(z);
  wg::reg_fence_u(pf);
  float cs[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) cs[i] = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) cs[2 * j + (e & 1)] += z[4 * j + e] * frag_at(qf, j, e);
  col_sums_to(cs, out, lane);
}

__global__ void __launch_bounds__(kThr, 2) wy_bwd_wgmma_kernel(WyBwdParams p, const int64_t* offs, int64_t items) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host entry launches this kernel only on sm_90 devices of an sm_90a build)
#else
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sb = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  float* const sG = reinterpret_cast<float*>(smem + oF);
  float* const sBeta = sG + 64;
  float* const sE = sG + 128;
  float* const sDb = sG + 192;  // Σ_j dP_ij KK_ij (row i)
  float* const sCs = sG + 256;  // [4][64]: Σ_r β_r dP_ri KK_ri over warp w's rows r
  float* const sXk = sG + 512;  // [2][4][64]: Σ_x X_ix k_ix over half m, warp w's rows x
  float* const sYv = sG + 1024;  // [2][4][64]
  const Dims& d = p.d;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  // f32 dk_add / dk whose rows of 4 columns are 16-byte aligned: float4 accesses in the dk epilogue
  auto vec4 = [](const View& v) {
    return v.dtype == STRATA_DTYPE_F32 && (reinterpret_cast<uintptr_t>(v.p) & 15u) == 0 &&
           ((v.s[0] | v.s[1] | v.s[2]) & 3) == 0;
  };
  const bool add_vec = vec4(p.dk_add), dk_vec = vec4(p.dk);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t win = item / d.H, h = item % d.H;
    for_each_chunk(d, offs, win, [&](const DevChunk& c) {
      const int L = static_cast<int>(c.t1 - c.t0);
      // The per-head tiles of head g (cp.async, one commit group per call).
      auto load_dw_v_du = [&](int64_t g) {
        const int64_t hv = h * d.G + g;
        load_tile<128>(sb + oDw, static_cast<const uint16_t*>(p.dw.p) + p.dw.off(c.b, c.t0, hv), p.dw.s[1], L);
        load_tile<128>(sb + oV, static_cast<const uint16_t*>(p.v.p) + p.v.off(c.b, c.t0, hv), p.v.s[1], L);
        load_tile<128>(sb + oDu, static_cast<const uint16_t*>(p.du.p) + p.du.off(c.b, c.t0, hv), p.du.s[1], L);
        ::strata::cuda::cp_async_commit();
      };
      auto load_a = [&](int64_t g) {
        const int64_t hv = h * d.G + g;
        load_tile<64>(sb + oA, static_cast<const uint16_t*>(p.A.p) + p.A.off(c.b, c.t0, hv), p.A.s[1], L);
        ::strata::cuda::cp_async_commit();
      };
      float dk[2][32];
#pragma unroll
      for (int i = 0; i < 32; ++i) dk[0][i] = dk[1][i] = 0.f;
      __syncthreads();  // the previous chunk's readers of every tile, staging area and vector are done
      load_tile<128>(sb + oK, static_cast<const uint16_t*>(p.k.p) + p.k.off(c.b, c.t0, h), p.k.s[1], L);
      load_dw_v_du(0);
      load_a(0);
      // γ, β and dg_add of row tid (threads < L) of head g: fetched with head g's tiles (at the chunk's start, or
      // while head g − 1 finishes), so that their latency is not exposed at head g's start.
      auto row_values = [&](int64_t g) {
        const int64_t hv = h * d.G + g;
        const bool ok = tid < L;
        return make_float3(ok && p.g.present() ? ld_f32(p.g, p.g.off(c.b, c.t0 + tid, hv)) : 0.f,
                           ok ? ld_f32(p.beta, p.beta.off(c.b, c.t0 + tid, hv)) : 0.f,
                           ok ? wy_bwd_cu::dg_addend(p, c, hv, tid) : 0.f);
      };
      float3 rv = row_values(0), rv_next = make_float3(0.f, 0.f, 0.f);
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t hv = h * d.G + g;
        const bool next = g + 1 < d.G;  // head g + 1's tiles load while this head computes (see below)
        const float dga = rv.z;  // dg_add of row tid
        {
          const bool ok = tid < L;
          const float gi = rv.x, bi = rv.y;
          ::strata::cuda::cp_async_wait<0>();
          if (L < 64) {  // A's columns >= L of a partial chunk are not part of its L x L block: zero this thread's
            using R = TileRows<64>;
            const int c0 = 8 * R::seg();
#pragma unroll
            for (int it = 0; it < R::kIt; ++it) {
              const int r = R::row(it);
              if (r < L)
                for (int cc = c0 > L ? c0 : L; cc < c0 + 8; ++cc)
                  *reinterpret_cast<uint16_t*>(smem + oA + 2 * wg::tile_off<64>(r, cc)) = 0;
            }
          }
          if (tid < 64) {
            sG[tid] = gi;
            sBeta[tid] = bi;
            sE[tid] = ok ? expf(gi) : 0.f;
          }
        }
        wg::fence_proxy_async();
        __syncthreads();

        // ---- dA = StrictLower(dW Kᵀ diag(βE) + dU Vᵀ diag(β)) → dAᵀ ; Aᵀ ----
        {
          float wk[32], uv[32];
#pragma unroll
          for (int i = 0; i < 32; ++i) wk[i] = uv[i] = 0.f;
          wg::reg_fence(wk), wg::reg_fence(uv);
          wg::wg_fence();
#pragma unroll
          for (int ks = 0; ks < 8; ++ks)
            wg::mma_ss<Bf, 64>(wk, wg::tile_desc<128>(sb + oDw, ks), wg::tile_desc<128>(sb + oK, ks), ks != 0);
#pragma unroll
          for (int ks = 0; ks < 8; ++ks)
            wg::mma_ss<Bf, 64>(uv, wg::tile_desc<128>(sb + oDu, ks), wg::tile_desc<128>(sb + oV, ks), ks != 0);
          wg::wg_commit();
          wg::transpose_tile<64, 64, 4>(w, smem + oA, sb + oAT);  // Aᵀ, while the products run
          wg::wg_wait<0>();
          wg::reg_fence(wk), wg::reg_fence(uv);
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int u = 4 * j + e, r = wg::acc_row(w, lane, e), col = wg::acc_col(lane, j, e);
              wk[u] = col < r ? sBeta[col] * (sE[col] * wk[u] + uv[u]) : 0.f;
            }
          wg::stmatrix_acc_trans<64, 64>(sb + oDAT, 16 * w, lane, wk);
        }
        wg::fence_proxy_async();
        __syncthreads();

        // ---- per 64-row half m of K: Xᵀ = dWᵀ A (X = Aᵀ dW) ; Σ_x X k ; dkᵀ += Xᵀ diag(βE) ----
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          float xt[32];
          half_product(xt, sb + oDw, sb + oK, sb + oAT, 64 * m, w, lane, sXk + 64 * (4 * m + w));
#pragma unroll
          for (int u = 0; u < 32; ++u) {
            const int i = wg::acc_col(lane, u >> 2, u & 3);
            dk[m][u] += sBeta[i] * sE[i] * xt[u];
          }
        }
        // ---- per 64-row half m of V: Yᵀ = dUᵀ A ; Σ_v Y v ; dv = diag(β) Y → staging (transposed) ----
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          float yt[32];
          half_product(yt, sb + oDu, sb + oV, sb + oAT, 64 * m, w, lane, sYv + 64 * (4 * m + w));
#pragma unroll
          for (int u = 0; u < 32; ++u) yt[u] *= sBeta[wg::acc_col(lane, u >> 2, u & 3)];
          wg::stmatrix_acc_trans<128, 64>(sb + oDvStage, 64 * m + 16 * w, lane, yt);
        }
        __syncthreads();  // dv staged; dW, V, dU read for the last time by every warp

        if (next) {  // into the dead dW, V, dU tiles, while this head finishes
          load_dw_v_du(g + 1);
          rv_next = row_values(g + 1);
        }
        {  // dv rows < L (16-byte stores)
          using R = TileRows<128>;
          const int q = R::seg();
          uint16_t* const dv = static_cast<uint16_t*>(p.dv.p) + p.dv.off(c.b, c.t0, hv) + 8 * q;
#pragma unroll
          for (int it = 0; it < R::kIt; ++it) {
            const int r = R::row(it);
            if (r < L)
              *reinterpret_cast<uint4*>(dv + r * p.dv.s[1]) =
                  *reinterpret_cast<const uint4*>(smem + oDvStage + 2 * wg::tile_off<128>(r, 8 * q));
          }
        }

        // ---- KK = K Kᵀ, tmp = Aᵀ dA ; dM' = tmp Aᵀ ; dP, Bm → T2 (as is), T1 (transposed); dβ / dγ sums ----
        {
          float kk[32], t[32], dm[32];
#pragma unroll
          for (int i = 0; i < 32; ++i) kk[i] = t[i] = dm[i] = 0.f;
          wg::reg_fence(kk), wg::reg_fence(t);
          wg::wg_fence();
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wg::mma_ss<Bf, 64>(t, wg::tile_desc<64>(sb + oAT, ks), wg::tile_desc<64>(sb + oDAT, ks), ks != 0);
#pragma unroll
          for (int ks = 0; ks < 8; ++ks)
            wg::mma_ss<Bf, 64>(kk, wg::tile_desc<128>(sb + oK, ks), wg::tile_desc<128>(sb + oK, ks), ks != 0);
          wg::wg_commit();
          wg::wg_wait<0>();
          wg::reg_fence(kk), wg::reg_fence(t);
          uint32_t ta[4][4];  // tmp rounded to bf16 as the A fragments of the k-steps over its columns
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
#pragma unroll
            for (int q = 0; q < 4; ++q) ta[ks][q] = mma::pack2<Bf>(t[8 * ks + 2 * q], t[8 * ks + 2 * q + 1]);
          wg::reg_fence(dm);
          wg::wg_fence();
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) wg::mma_rs<Bf, 64>(dm, ta[ks], wg::tile_desc<64>(sb + oA, ks), ks != 0);
          wg::wg_commit();
          wg::wg_wait<0>();
          wg::reg_fence(dm);
          wg::reg_fence_u(ta);
          float rp[2] = {0.f, 0.f}, cp[16];
#pragma unroll
          for (int i = 0; i < 16; ++i) cp[i] = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int u = 4 * j + e, i = wg::acc_row(w, lane, e), col = wg::acc_col(lane, j, e);
              // dP = dM ⊙ Γ, dM = −StrictLower(tmp Aᵀ) (the exponent is formed only below the diagonal: ≤ 0)
              const float dp = (col < i && i < L) ? -dm[u] * expf(sG[i] - sG[col]) : 0.f;
              const float pk = dp * kk[u];
              rp[e >> 1] += pk;
              cp[2 * j + (e & 1)] += sBeta[i] * pk;
              dm[u] = sBeta[i] * dp;  // Bm
            }
#pragma unroll
          for (int s = 0; s < 2; ++s) {  // the warp holds whole rows: the quad's sum is the row's
            rp[s] += __shfl_xor_sync(0xffffffffu, rp[s], 1);
            rp[s] += __shfl_xor_sync(0xffffffffu, rp[s], 2);
          }
          if ((lane & 3) == 0) sDb[16 * w + (lane >> 2)] = rp[0], sDb[16 * w + (lane >> 2) + 8] = rp[1];
          col_sums_to(cp, sCs + 64 * w, lane);
          __syncthreads();  // every warp has stored its dv rows out of the staging area (T1, T2)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int i = wg::acc_row(w, lane, 2 * hh), col = wg::acc_col(lane, j, 0);
              *reinterpret_cast<uint32_t*>(smem + oT2 + 2 * wg::tile_off<64>(i, col)) =
                  mma::pack2<Bf>(dm[4 * j + 2 * hh], dm[4 * j + 2 * hh + 1]);
            }
          wg::stmatrix_acc_trans<64, 64>(sb + oT1, 16 * w, lane, dm);
        }
        __syncthreads();  // Bm, Bmᵀ, the dβ / dγ partials written; A read for the last time (dM, Aᵀ)
        if (next) load_a(g + 1);
        if (tid < L) {  // dβ, dγ of the head's rows
          float xk = 0.f, yv = 0.f;
#pragma unroll
          for (int s = 0; s < 8; ++s) xk += sXk[64 * s + tid], yv += sYv[64 * s + tid];
          const float cs = ((sCs[tid] + sCs[64 + tid]) + sCs[128 + tid]) + sCs[192 + tid];
          wy_bwd_cu::store_dbeta_dg(p, c, hv, tid, sE[tid], sBeta[tid], xk, yv, sDb[tid], cs, dga);
        }
        // Sym = Bm + Bmᵀ → T2: bf16 sums in which one operand is ±0 (disjoint supports), so exact: the same bf16
        // values as the f32 sum rounded once, and one m64n64k64 product per half below instead of two.
        for (int e = tid; e < static_cast<int>(kT64 / 16); e += kThr) {
          uint4 a = *reinterpret_cast<const uint4*>(smem + oT2 + 16 * e);
          const uint4 b = *reinterpret_cast<const uint4*>(smem + oT1 + 16 * e);
          a.x = add_bf16x2(a.x, b.x), a.y = add_bf16x2(a.y, b.y), a.z = add_bf16x2(a.z, b.z), a.w = add_bf16x2(a.w, b.w);
          *reinterpret_cast<uint4*>(smem + oT2 + 16 * e) = a;
        }
        wg::fence_proxy_async();
        __syncthreads();

        // ---- per 64-row half m of K: dkᵀ += Kᵀ Sym ----
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          uint32_t kf[4][4];
          frags_trans(kf, sb + oK, 64 * m, w, lane);
          wg::reg_fence(dk[m]);
          wg::wg_fence();  // (after the fragment loads: wgmma reads A registers written since the last fence)
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) wg::mma_rs<Bf, 64>(dk[m], kf[ks], wg::tile_desc<64>(sb + oT2, ks), 1);
          wg::wg_commit();
          wg::wg_wait<0>();
          wg::reg_fence(dk[m]);
          wg::reg_fence_u(kf);
        }
        __syncthreads();  // every warp is past its reads of Sym, sG, sBeta, sE and the partials of this head
        rv = rv_next;
      }

      // ---- dk (+ dk_add) of the chunk: dkᵀ accumulators → f32 [64 i][kDkLd] staging → rows < L ----
      float* const st = reinterpret_cast<float*>(smem + oDkStage);  // (dW, V, dU: dead after the last head)
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            st[wg::acc_col(lane, j, e) * kDkLd + 64 * m + wg::acc_row(w, lane, e)] = dk[m][4 * j + e];
      __syncthreads();
      // Rows < L, this thread's kDkN float4 groups (row e / 32, columns 4 (e % 32).., e = tid + kThr n: a warp covers
      // one row's 512 contiguous bytes). Every dk_add load is in flight before the first store (dk_add may alias dk,
      // so the compiler would not move a later load above an earlier store: one full latency per group).
      constexpr int kDkN = 64 * 32 / kThr;
      float4 add[kDkN];
#pragma unroll
      for (int n = 0; n < kDkN; ++n) {
        const int e = tid + kThr * n, i = e >> 5, x = (e & 31) * 4;
        add[n] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (p.dk_add.present() && i < L) {
          const int64_t o = p.dk_add.off(c.b, c.t0 + i, h) + x;
          if (add_vec) {
            add[n] = *reinterpret_cast<const float4*>(static_cast<const float*>(p.dk_add.p) + o);
          } else {
            add[n] = make_float4(ld_f32(p.dk_add, o), ld_f32(p.dk_add, o + 1), ld_f32(p.dk_add, o + 2),
                                 ld_f32(p.dk_add, o + 3));
          }
        }
      }
#pragma unroll
      for (int n = 0; n < kDkN; ++n) {
        const int e = tid + kThr * n, i = e >> 5, x = (e & 31) * 4;
        if (i >= L) break;
        float4 a = *reinterpret_cast<const float4*>(st + i * kDkLd + x);
        if (p.dk_add.present()) {  // dk = dk_add + dk
          a.x = add[n].x + a.x, a.y = add[n].y + a.y, a.z = add[n].z + a.z, a.w = add[n].w + a.w;
        }
        const int64_t o = p.dk.off(c.b, c.t0 + i, h) + x;
        if (dk_vec) {
          *reinterpret_cast<float4*>(static_cast<float*>(p.dk.p) + o) = a;
        } else {
          tc::st_pair(p.dk, o, a.x, a.y, true);
          tc::st_pair(p.dk, o + 2, a.z, a.w, true);
        }
      }
    });
  }
#endif
}

bool aligned16(const View& v) { return (reinterpret_cast<uintptr_t>(v.p) & 15u) == 0; }

}  // namespace

std::string prepare_wy_repr_bwd_cuda_wgmma_reject(const WyBwdParams& p) {
  for (const View* v : {&p.k, &p.v, &p.A, &p.dw, &p.du, &p.dv})
    if (v->dtype != STRATA_DTYPE_BF16) return "takes bf16 k, v, A, dw, du and dv";
  if (p.d.K != 128 || p.d.V != 128 || p.d.BT != 64) return "needs K = V = 128 and chunk size 64";
  for (const View* v : {&p.k, &p.v, &p.A, &p.dw, &p.du, &p.dv})
    if (v->s[0] % 8 != 0 || v->s[1] % 8 != 0 || v->s[2] % 8 != 0) return "needs strides that are multiples of 8 elements";
  return "";
}

size_t prepare_wy_repr_bwd_cuda_wgmma_workspace(const Dims& d) { return prepare_wy_repr_bwd_cuda_mma_workspace(d); }

int prepare_wy_repr_bwd_cuda_wgmma(const WyBwdParams& p, void* workspace, void* stream_ptr) {
  const std::string why = prepare_wy_repr_bwd_cuda_wgmma_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_bwd cuda.sm90.wgmma: {}", why);
  // Token views not 16-byte aligned (views at odd offsets): the mma.sync kernel, which copies them element-wise.
  bool ok = true;
  for (const View* v : {&p.k, &p.v, &p.A, &p.dw, &p.du, &p.dv}) ok = ok && aligned16(*v);
  if (!ok) return prepare_wy_repr_bwd_cuda_mma(p, workspace, stream_ptr);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  const int64_t items = num_windows(d) * d.H;
  if (items == 0) return STRATA_SUCCESS;
  int64_t* offs = static_cast<int64_t*>(workspace);
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  STRATA_CUDA_TRY(cudaFuncSetAttribute(wy_bwd_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem)));
  STRATA_CUDA_TRY(cudaFuncSetAttribute(wy_bwd_wgmma_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  wy_bwd_wgmma_kernel<<<static_cast<unsigned>(blocks), kThr, kSmem, stream>>>(p, offs, items);
  return cuda::check_launch("prepare_wy_repr_bwd (wgmma)");
}

}  // namespace strata::linear_attn
