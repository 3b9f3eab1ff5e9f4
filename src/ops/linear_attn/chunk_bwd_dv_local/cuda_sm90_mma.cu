// Tensor-core CUDA kernel of chunk_bwd_dv_local ("cuda.sm90.mma", bf16/f16 q, k, do): one 256-thread block
// (8 warps) per (token window, q/k head h) on grid.x (grid-stride: any N·H). Per chunk of the window:
//   P  = Kc Qcᵀ                                  64 × 64, contraction K (rounded up to 64), f32, once for the
//                                                G value heads hv = h G + g of h (in registers); then per head:
//   Bm = T(scale Upper(P ⊙ exp(γ_i − γ_j)))      (Bm[j][i], i ≥ j, i < L; the exponent is formed only there: ≤ 0)
//   dv = Bm dO                                   64 × V, per 64-column tile of V
// Warp w owns rows 16 (w % 4).., columns 32 (w / 4).. of each 64 × 64 product. k, q load once per chunk with
// cp.async, do per value head in two stages (head g + 1's tile loads while head g computes); K and V are rounded
// up to 64 at run time (zero-filled columns), so one instantiation per dtype serves every K, V ≤ 256. No
// atomics: same bits every run.
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/gdn_bwd_common/cuda_mma.cuh"

#include <fmt/format.h>

#include <algorithm>

namespace strata::linear_attn {
namespace {
using namespace gdn_bwd;
using namespace gdn_bwd::cu;
using namespace gdn_bwd::tc;

constexpr int kThr = 256;
constexpr int kLdP = 72;  // row pitch of the 64 × 64 Bm tile

int64_t round64(int64_t x) { return (x + 63) / 64 * 64; }
// Shared memory: k, q [64][KP + 8], two stages of do [64][VP + 8], Bm [64][72] (16-bit), two stages of γ [64] f32.
size_t smem_bytes(const Dims& d) {
  const int64_t kp = std::max<int64_t>(round64(d.K), 64), vp = std::max<int64_t>(round64(d.V), 64);
  return static_cast<size_t>(64 * (2 * (kp + 8) + 2 * (vp + 8) + kLdP) * 2 + 2 * 64 * 4);
}

template <class T>
__global__ void __launch_bounds__(kThr) dv_local_mma_kernel(DvLocalParams p, const int64_t* offs, int64_t items,
                                                            int KP, int VP) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ldk = KP + 8, ldv = VP + 8;
  uint16_t* sK = reinterpret_cast<uint16_t*>(smem);
  uint16_t* sQ = sK + 64 * ldk;
  uint16_t* sDo0 = sQ + 64 * ldk;  // two stages of do [64][ldv]: head g + 1's loads while head g computes
  uint16_t* sP = sDo0 + 2 * 64 * ldv;
  float* sG0 = reinterpret_cast<float*>(sP + 64 * kLdP);  // two stages of γ [64]
  const Dims& d = p.d;
  const int warp = threadIdx.x / 32, r0 = (warp % 4) * 16, c0 = (warp / 4) * 32;
  const int kc = static_cast<int>(d.K), vc = static_cast<int>(d.V);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t w = item / d.H, h = item % d.H;
    for_each_chunk(d, offs, w, [&](const DevChunk& c) {
      const int L = static_cast<int>(c.t1 - c.t0);
      // Issues head g's do tile into stage g % 2 (one commit group); returns this thread's γ of the head.
      auto issue = [&](int64_t g) -> float {
        const int64_t hv = h * d.G + g;
        load_tile_async<T, kThr>(sDo0 + (g & 1) * 64 * ldv, ldv, 64, VP, p.dout, p.dout.off(c.b, c.t0, hv),
                                 p.dout.s[1], L, vc);
        ::strata::cuda::cp_async_commit();
        return p.g.present() && static_cast<int>(threadIdx.x) < L ? ld_f32(p.g, p.g.off(c.b, c.t0 + threadIdx.x, hv))
                                                                   : 0.f;
      };
      __syncthreads();  // the previous chunk's readers are done
      load_tile_async<T, kThr>(sK, ldk, 64, KP, p.k, p.k.off(c.b, c.t0, h), p.k.s[1], L, kc);
      load_tile_async<T, kThr>(sQ, ldk, 64, KP, p.q, p.q.off(c.b, c.t0, h), p.q.s[1], L, kc);
      float g_next = issue(0);  // (k and q join head 0's group)
      // P[j][i] = k_j · q_i, shared by the G value heads of q/k head h (only the gate mask differs).
      float acc[1][4][4];
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t hv = h * d.G + g;
        uint16_t* sDo = sDo0 + (g & 1) * 64 * ldv;
        float* sG = sG0 + (g & 1) * 64;
        if (g > 0) __syncthreads();  // head g − 1's readers of sP and of stage (g + 1) % 2 are done
        if (threadIdx.x < 64) sG[threadIdx.x] = g_next;
        if (g + 1 < d.G) {
          g_next = issue(g + 1);
          ::strata::cuda::cp_async_wait<1>();
        } else {
          ::strata::cuda::cp_async_wait<0>();
        }
        __syncthreads();
        if (g == 0) {  // (B(x, i) = Q[i][x]: stored [n][k])
          zero(acc);
          warp_gemm<T, true, false, 1, 4>(acc, sK + r0 * ldk, ldk, sQ + c0 * ldk, ldk, KP);
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = r0 + frag_row(0, e), i = c0 + frag_col(nt, e);
            sP[j * kLdP + i] =
                Elem<T>::from(i >= j && i < L ? p.scale * acc[0][nt][e] * expf(sG[i] - sG[j]) : 0.f);
          }
        __syncthreads();
        // dv = Bm dO, one 64-column tile of V at a time (B(i, e) = dO[i][e]: stored [k][n]).
        for (int e0 = 0; e0 < VP; e0 += 64) {
          float o[1][4][4];
          zero(o);
          warp_gemm<T, true, true, 1, 4>(o, sP + r0 * kLdP, kLdP, sDo + e0 + c0, ldv, 64);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {  // the two adjacent columns of a fragment row together
              const int j = r0 + frag_row(0, e), col = e0 + c0 + frag_col(nt, e);
              if (j < L && col < vc)
                st_pair(p.dv, p.dv.off(c.b, c.t0 + j, hv) + col, o[0][nt][e], o[0][nt][e + 1], col + 1 < vc);
            }
        }
      }
    });
  }
}

template <class T>
strata_status launch(const DvLocalParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  const Dims& d = p.d;
  const size_t smem = smem_bytes(d);
  const int KP = static_cast<int>(std::max<int64_t>(round64(d.K), 64));
  const int VP = static_cast<int>(std::max<int64_t>(round64(d.V), 64));
  STRATA_CUDA_TRY(cudaFuncSetAttribute(dv_local_mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const int64_t blocks = std::min<int64_t>(items, int64_t{1} << 30);
  dv_local_mma_kernel<T><<<static_cast<unsigned>(blocks), kThr, smem, stream>>>(p, offs, items, KP, VP);
  return cuda::check_launch("chunk_bwd_dv_local (mma)");
}

}  // namespace

std::string chunk_bwd_dv_local_cuda_mma_reject(const DvLocalParams& p) {
  if (!common_16bit_dtype({&p.q, &p.k, &p.dout}))
    return "takes q, k, do of one 16-bit dtype (bf16 or f16); f32 runs the FMA kernel";
  if (p.d.K > 256 || p.d.V > 256) return fmt::format("K = {}, V = {}: at most 256 each", p.d.K, p.d.V);
  return "";
}

size_t chunk_bwd_dv_local_cuda_mma_workspace(const Dims& d) { return chunk_offsets_bytes(d); }

int chunk_bwd_dv_local_cuda_mma(const DvLocalParams& p, void* workspace, void* stream_ptr) {
  const std::string why = chunk_bwd_dv_local_cuda_mma_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "chunk_bwd_dv_local cuda.sm90.mma: {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  const int64_t items = num_windows(d) * d.H;
  if (items == 0 || d.V == 0) return STRATA_SUCCESS;
  int64_t* offs = static_cast<int64_t*>(workspace);
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  return p.q.dtype == STRATA_DTYPE_BF16 ? launch<bf16_t>(p, offs, items, stream) : launch<f16_t>(p, offs, items, stream);
}

// The automatic choice (the entry point other operators call): tensor cores for 16-bit token tensors.
size_t chunk_bwd_dv_local_cuda_workspace(const Dims& d) {
  return std::max(chunk_bwd_dv_local_cuda_mma_workspace(d), chunk_bwd_dv_local_cuda_fma_workspace(d));
}
int chunk_bwd_dv_local_cuda(const DvLocalParams& p, void* workspace, void* stream) {
  return chunk_bwd_dv_local_cuda_mma_reject(p).empty() ? chunk_bwd_dv_local_cuda_mma(p, workspace, stream)
                                                       : chunk_bwd_dv_local_cuda_fma(p, workspace, stream);
}

}  // namespace strata::linear_attn
