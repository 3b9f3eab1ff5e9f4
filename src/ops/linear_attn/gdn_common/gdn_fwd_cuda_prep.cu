// CUDA sm_90 kernel prep_mma: everything the GDN forward computes before its state pass, in one chunk-parallel
// launch (gdn_fwd_kernels.h, fwd_cuda_prep). One block of 8 warps per (chunk, q/k head h) covers the G value heads
// hv = h G .. h G + G − 1 of h's group:
//
//   K, Q [64][128 | Kp] and V of the first two value heads requested at once (cp.async: K, Q as one group, each V
//   as its own group; V of head gi + 2 is requested once head gi has used its buffer)
//   warps 0-3: R = K Kᵀ (row block w, column blocks <= w)        warps 4-7: R = Q Kᵀ (row block w − 4, same)
//   for each value head hv of the group (γ, β per value head):
//     warps 0-3: M = strictly-lower(diag(β) K Kᵀ ⊙ Γ) from R       warps 4-7: Pqk[hv] = lower(Q Kᵀ ⊙ Γ) from R
//     X = (I + M)^-1 (invert, f32), A = X when p.A is present
//     warps 0-3: w = X diag(β e^γ) K                               warps 4-7: u = X diag(β) V
//
// K Kᵀ and Q Kᵀ are formed once per (chunk, q/k head) instead of once per value head, K and Q are read once,
// and the G value heads' inverses and products follow each other in one block while the next value head's V
// arrives. Every value is computed with the fragments, order and expressions of the kernels it replaces —
// wy_mma<kWyPrepare> (K Kᵀ over 64-column key tiles, gating, invert, wu_tiles) and qk_gate_mma (8 key steps over
// 128 zero-padded columns, gating) — so w, u, A and Pqk are the same bits as theirs (tested:
// tests/cpp/test_gdn_fwd_cuda_prep.cpp). Pqk (the gated Q Kᵀ that state_o_mma<kPreP> reads) is written when
// p.Pqk is present (then q too, K <= 128); prepare_wy_repr_fwd's plan runs it without q / Pqk as
// `cuda.sm90.prep`.
//
// Shared memory (K = V = 128, G >= 2, with Pqk): K, Q 2 x 17 KB, V 2 x 17 KB, M, X 2 x 17 KB, merge scratch, γ / β
// of the group: 108 KB, two blocks per SM (<= 128 registers: __launch_bounds__(256, 2)). Without Q: 91 KB. The
// largest case (K = V = 256, no Q): 139 KB, one block per SM.
//
// Determinism: fixed work split and order, no atomics; every output element written once by one thread.
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_mma_tiles.cuh"

namespace strata::linear_attn::gdn {
namespace {

constexpr int kPrepThreads = 256;                // 8 warps
constexpr size_t kPrepMaxSmem = 227 * 1024;  // sm_90 dynamic shared memory per block

// Columns of the K / Q tiles: 128 with Q (qk_gate_mma's 8 key steps over zero-padded columns, K <= 128), else K
// rounded up to 64 (wy_mma's tiles).
__host__ __device__ inline int prep_key_cols(int64_t K, bool with_p) { return with_p ? kKF : round64(K); }

// K, Q (with Pqk) [64][kcols + 8], V [64][Vp + 8] (16-bit); Rk, M, X [64][kLdF] (f32); merge scratch; γ, β of the
// G value heads.
inline size_t prep_smem(int64_t K, int64_t V, int64_t G, bool with_p) {
  const size_t kt = size_t(kRows) * (prep_key_cols(K, with_p) + 8) * 2;
  const size_t vt = size_t(kRows) * (round64(V) + 8) * 2;
  return kt * (with_p ? 2 : 1) + vt + 3 * size_t(kRows) * kLdF * 4 + 3 * 16 * kLdY * 4 + 2 * size_t(G) * kRows * 4;
}

template <class T>
__global__ void __launch_bounds__(kPrepThreads, 2) prep_mma(const GdnFwdParams p, int with_p_flag) {
  constexpr int kNThr = kPrepThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t H = p.shape.H, G = p.shape.G, K = p.shape.K, V = p.shape.V;
  const bool with_p = with_p_flag != 0;
  const int kcols = prep_key_cols(K, with_p), vcols = round64(V);
  const int ldk = kcols + 8, ldv = vcols + 8;  // conflict-free ldmatrix (row stride 16 mod 128 bytes)
  T* Kt = reinterpret_cast<T*>(smem);                             // [64][ldk] K chunk of q/k head h
  T* Qt = Kt + kRows * ldk;                                       // [64][ldk] Q chunk (with_p)
  T* Vt = Qt + (with_p ? kRows * ldk : 0);                        // [64][ldv] V chunk of the current value head
  float* Rk = reinterpret_cast<float*>(Vt + kRows * ldv);         // [64][kLdF] K Kᵀ (f32, ungated)
  float* M = Rk + kRows * kLdF;                                   // [64][kLdF] gated β K Kᵀ of a value head
  float* X = M + kRows * kLdF;                                    // [64][kLdF] its inverse
  float* Yf = X + kRows * kLdF;                                   // [3][16][kLdY] merge scratch
  float* gam = Yf + 3 * 16 * kLdY;                                // [G][64] γ (0 without g)
  float* bet = gam + G * kRows;                                   // [G][64] β (1 without beta)
  const int64_t slot = blockIdx.x / H, h = blockIdx.x % H;
  const ChunkPos c = locate_chunk(p.chunks, slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  const int BT = static_cast<int>(p.shape.BT);
  const int tid = threadIdx.x, warp = tid >> 5, rw = warp & 3;

  // Rows [0, L) of D columns of head `head` into dst [64][ld], `width` (>= D, a multiple of 64) columns, zero
  // past L and D. Fixed-slot copies when the tensor is plain 16-bit and D fills the width.
  auto load_rows = [&](T* dst, const GdnTensor& t, int64_t head, int64_t D, int width, int ld) {
    const int64_t base = off_tok(t, c.b, c.s, head);
    if (D == width && lean_tensor<T>(t)) {
      lean_rows<kNThr>(dst, ld, t, base, L, D);
    } else {
      for (int d0 = 0; d0 < width; d0 += 64)
        load_tile<T, 64, kNThr>(dst + d0, ld, t, base, t.st[1], t.st[3], L, d0, D);
    }
  };
  // K and Q as one cp.async group, V of the first value head as a second (it arrives during the products and the
  // first inverse); V of head gi + 1 is requested when head gi has used the buffer (it arrives during gi + 1's
  // gating and inverse).
  load_rows(Kt, p.k, h, K, kcols, ldk);
  if (with_p) load_rows(Qt, p.q, h, K, kcols, ldk);
  cuda::cp_async_commit();
  load_rows(Vt, p.v, h * G, V, vcols, ldv);
  cuda::cp_async_commit();
  for (int64_t idx = tid; idx < G * kRows; idx += kNThr) {
    const int64_t hv = h * G + idx / kRows;
    const int i = static_cast<int>(idx % kRows);
    float gv = 0.f, bv = 1.f;
    if (i < L) {
      if (p.g.present()) gv = load_f(p.g, off_tok(p.g, c.b, c.s + i, hv));
      if (p.beta.present()) bv = load_f(p.beta, off_tok(p.beta, c.b, c.s + i, hv));
    }
    gam[idx] = gv;
    bet[idx] = bv;
  }
  cuda::cp_async_wait<1>();  // K (and Q) complete; V may be in flight
  __syncthreads();

  {
    // Warps 0-3: K Kᵀ as wy_mma (row block rw, column blocks np <= rw, 64-column key tiles d0 < K, 4 steps each)
    // into Rk. Warps 4-7: Q Kᵀ as qk_gate_mma (row block rw, column blocks <= rw, 8 key steps over 128 columns),
    // gated and stored as Pqk for every value head of the group.
    FragC R[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) R[n].zero();
    if (warp < 4) {
      for (int d0 = 0; d0 < K; d0 += 64) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const FragA a = mma::load_a(Kt, ldk, 16 * rw, d0 + 16 * ks);
#pragma unroll
          for (int np = 0; np < 4; ++np)
            if (np <= rw) {
              FragB b0, b1;
              mma::load_b2(b0, b1, Kt, ldk, d0 + 16 * ks, 16 * np);
              mma::mma16816<T>(R[2 * np], a, b0);
              mma::mma16816<T>(R[2 * np + 1], a, b1);
            }
        }
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) mma::store_c(Rk, kLdF, 16 * rw, 8 * n, R[n]);  // right of the diagonal: 0
    } else if (with_p) {
#pragma unroll
      for (int kq = 0; kq < kKF / 16; ++kq) {
        const FragA a = mma::load_a(Qt, ldk, 16 * rw, 16 * kq);
#pragma unroll
        for (int cb = 0; cb < 4; ++cb)
          if (cb <= rw) {
            FragB b0, b1;
            mma::load_b2(b0, b1, Kt, ldk, 16 * kq, 16 * cb);
            mma::mma16816<T>(R[2 * cb], a, b0);
            mma::mma16816<T>(R[2 * cb + 1], a, b1);
          }
      }
      // Pqk[hv] rows 16 rw.. < L, columns < BT: (q_i·k_j) e^{γ_i − γ_j} for j <= i, else 0, rounded to T.
      const bool pvec = pair_vec<T>(p.Pqk);
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t hv = h * G + gi;
        const float* gm = gam + gi * kRows;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * rw + mma::c_row(2 * half);
          if (i >= L) continue;
          const int64_t ro = off_tok(p.Pqk, c.b, c.s + i, hv);
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            float x[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = 8 * n + mma::c_col(2 * half + e);
              const float v = R[n].x[2 * half + e];
              x[e] = (j <= i && i < L) ? v * expf(gm[i] - gm[j]) : 0.f;
            }
            store_pair_v<T>(p.Pqk, pvec, ro, 8 * n + mma::c_col(0), BT, x[0], x[1]);
          }
        }
      }
    }
  }
  __syncthreads();  // Rk complete

  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t hv = h * G + gi;
    const float* gm = gam + gi * kRows;
    const float* bt = bet + gi * kRows;
    // M[i][j] = β_i (k_i·k_j) e^{γ_i − γ_j} for j < i < L, else 0 (selected: e^{...} never overflows); the
    // expression of wy_mma, so the same bits.
    for (int idx = tid; idx < kRows * kRows; idx += kNThr) {
      const int i = idx >> 6, j = idx & 63;
      M[i * kLdF + j] = (j < i && i < L) ? bt[i] * Rk[i * kLdF + j] * expf(gm[i] - gm[j]) : 0.f;
    }
    __syncthreads();          // M complete
    invert<kNThr>(M, X, Yf);  // ends with a barrier: M is no longer read
    if (p.A.present()) store_chunk_mat<T, kNThr>(p.A, c, hv, L, BT, X);
    // Column scales in M's storage: fw = β e^γ (w), fu = β (u); 0 past L.
    float* fw = M;
    float* fu = M + kRows;
    for (int j = tid; j < kRows; j += kNThr) {
      fw[j] = j < L ? bt[j] * expf(gm[j]) : 0.f;
      fu[j] = j < L ? bt[j] : 0.f;
    }
    cuda::cp_async_wait<0>();  // V of hv
    __syncthreads();
    if (warp < 4) wu_tiles<T>(p.w, Kt, ldk, K, X, fw, rw, c, hv, L);
    else wu_tiles<T>(p.u, Vt, ldv, V, X, fu, rw, c, hv, L);
    if (gi + 1 < G) {
      __syncthreads();  // M (fw, fu), X and the V buffer are free for the next value head
      load_rows(Vt, p.v, hv + 1, V, vcols, ldv);
      cuda::cp_async_commit();
    }
  }
}

}  // namespace

std::string fwd_cuda_prep_reject(const GdnFwdParams& p) {
  // k, v (product operands) one 16-bit dtype T, w, u (and A when present) T too; K, V <= 256; BT <= 64.
  std::string r = fwd_cuda_mma_reject(FwdOp::kPrepareWY, p);
  if (!r.empty()) return r;
  if (!p.k.present() || !p.v.present() || !p.w.present() || !p.u.present())
    return "prep_mma reads k, v and writes w, u (one of them is absent)";
  if (p.shape.H < 1 || p.shape.G < 1 || p.shape.H * p.shape.G != p.shape.HV) return "HV must be a multiple G of H";
  const bool with_p = p.Pqk.present();
  if (with_p) {
    if (!p.q.present() || p.q.dtype != p.k.dtype) return "the gated Q Kᵀ (Pqk) needs q in the dtype of k";
    if (p.Pqk.dtype != p.k.dtype) return "the gated Q Kᵀ (Pqk) is stored in the dtype of q, k";
    if (p.shape.K > kKF) return fmt::format("the gated Q Kᵀ (Pqk) needs K <= {}", kKF);
  }
  const size_t smem = prep_smem(p.shape.K, p.shape.V, p.shape.G, with_p);
  if (smem > kPrepMaxSmem)
    return fmt::format("prep_mma needs {} bytes of shared memory per block (G = {}), more than {}", smem, p.shape.G,
                       kPrepMaxSmem);
  return {};
}

int fwd_cuda_prep(const GdnFwdParams& p, void* stream_ptr) {
  const std::string why = fwd_cuda_prep_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_fwd (prep_mma): {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool with_p = p.Pqk.present();
  const int64_t blocks = chunk_slots(p.chunks) * p.shape.H;
  const size_t smem = prep_smem(p.shape.K, p.shape.V, p.shape.G, with_p);
  return p.k.dtype == STRATA_DTYPE_BF16
             ? launch_n(prep_mma<__nv_bfloat16>, "prepare_wy_repr_fwd (prep_mma)", blocks, kPrepThreads, smem, stream,
                        p, with_p ? 1 : 0)
             : launch_n(prep_mma<__half>, "prepare_wy_repr_fwd (prep_mma)", blocks, kPrepThreads, smem, stream, p,
                        with_p ? 1 : 0);
}

}  // namespace strata::linear_attn::gdn
