// CUDA sm_90 kernel prep_group_mma: everything the GDN forward computes before its state pass, in one
// chunk-parallel launch (gdn_fwd_kernels.h, fwd_cuda_prep): w = A diag(β e^γ) K, u = A diag(β) V with
// A = (I + strictly-lower(diag(β) K Kᵀ ⊙ Γ))⁻¹, A itself when p.A is present, and the gated Q Kᵀ p.Pqk when present.
//
// One block per (chunk, q/k head h, pair of value heads of h's group): kGb = 2 value heads (G even) or 1 (G odd),
// each owned by a GROUP of 4 warps that runs that head's whole chain concurrently with the other group, plus
// (when Pqk is written) 2 P warps that form the gated Q Kᵀ of the block's heads beside those chains:
//
//   group threads: K (and Q) [64][kcols] as one cp.async group, V of each group's head [64][Vp] as a second;
//   all: γ, β and the column scales fw = β e^γ, fu = β of both heads; wait for K (Q), block barrier
//   group g, warp q: (products: row blocks min(q, 3 − q) and 3 − min(q, 3 − q), 16-column units of parity q / 2)
//     R = K Kᵀ (column blocks <= row block), gated in registers: M = strictly-lower(diag(β) R ⊙ Γ) into the group's
//     f32 tile
//     X = (I + M)⁻¹ IN PLACE over M (4 diagonal blocks by substitution, 3 block-row merges; group barriers only)
//     A = X stored when p.A is present
//   P warps (with Pqk): Q Kᵀ once per row block (warp 0: blocks 3, 0; warp 1: 2, 1), gated with each head's γ and
//     stored as Pqk[hv] straight from the accumulators
//   block barrier (V of both heads complete); the P warps leave
//     groups: w = X diag(fw) K, u = X diag(fu) V (the warp's row blocks and column units, every 64-column tile)
//
// Why this shape (README.md, "The pre-state kernel"): wy_mma<kPrepare> (one block of 8 warps per value head, 74 KB,
// 3 blocks per SM) + qk_gate_mma measured 0.769 ms at B = 4 T = 8192 H = 16 HV = 32 K = V = 128 bf16, ~3x the byte
// floor; both are chains of dependent phases (loads, products, gating, the barrier-separated inverse, w / u) with
// few chains per SM. session 8's prep_mma ran the G heads of a block ONE AFTER THE OTHER (0.826 ms). Here the two
// heads of a block run side by side on their own warps and barriers, the gating is done in the product registers
// (no pass over a shared tile), the inverse is formed in place (one f32 tile per head instead of two) so that two
// blocks fit per SM (111.5 KB at K = V = 128 with Q: 4 value-head chains per SM instead of 3), K and Q are loaded
// once per pair of heads, and Q Kᵀ is formed once per pair, off the chains, without a second launch.
//
// Every value goes through the fragments, order and expressions of the kernels it replaces (wy_mma<kPrepare>:
// K Kᵀ over 64-column key tiles, gating, the inverse's steps (invert_diag_column / invert_merge_y / _x), wu_tiles;
// qk_gate_mma: 8 key steps over 128 zero-padded columns, gating): w, u, A and Pqk are the same bits (tested on the
// GPU: tests/cpp/test_gdn_fwd_cuda_variants.cpp, GdnFwdCudaPrep.SameBitsAsWyMmaAndQkGate).
//
// Determinism: fixed work split and order, no atomics; every output element written once by one thread.
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_mma_tiles.cuh"

namespace strata::linear_attn::gdn {
namespace {

constexpr int kGroupThreads = 128;           // 4 warps per value head
constexpr int kPWarps = 2;                   // warps forming the gated Q Kᵀ (Pqk) of the block's heads
constexpr size_t kPrepMaxSmem = 227 * 1024;  // sm_90 dynamic shared memory per block

// Value heads per block: 2 when the group size G is even (K and Q shared by the pair), else 1.
inline int prep_heads_per_block(int64_t G) { return G % 2 == 0 ? 2 : 1; }

// Columns of the K / Q tiles: 128 with Q (qk_gate_mma's 8 key steps over zero-padded columns, K <= 128), else K
// rounded up to 64 (wy_mma's tiles).
__host__ __device__ inline int prep_key_cols(int64_t K, bool with_p) { return with_p ? kKF : round64(K); }

// K, Q (with Pqk) [64][kcols + 8] 16-bit; per value head of the block: V [64][Vp + 8] 16-bit, M / X [64][kLdF] f32,
// merge scratch [3][16][kLdY] f32, γ, β, fw, fu [64] f32.
inline size_t prep_smem(int64_t K, int64_t V, int gb, bool with_p) {
  const size_t kt = size_t(kRows) * (prep_key_cols(K, with_p) + 8) * 2;
  const size_t vt = size_t(kRows) * (round64(V) + 8) * 2;
  const size_t per_head = vt + size_t(kRows) * kLdF * 4 + 3 * 16 * kLdY * 4 + 4 * kRows * 4;
  return kt * (with_p ? 2 : 1) + gb * per_head;
}

// Barrier of the 128 threads of value-head group g (named barrier g + 1; 0 is __syncthreads). Immediate ids, so
// that the kernel reserves 3 barriers, not all 16.
__device__ __forceinline__ void group_sync(int g) {
  if (g == 0) asm volatile("bar.sync 1, %0;" ::"n"(kGroupThreads) : "memory");
  else asm volatile("bar.sync 2, %0;" ::"n"(kGroupThreads) : "memory");
}

// In-place X = (I + M)^-1 over the strictly lower M of one group's tile MX (zero outside the strictly lower part;
// the blocks above the block diagonal stay 0), run by the group's 4 warps (wg = warp in the group, group barrier
// g). The steps and their order are invert()'s; in round r warp c < r reads M_rk (k >= c) of row block r, which
// warps c' > c overwrite with X_rc', so every warp forms its Y before any writes X (one more group barrier per
// round than invert, which keeps M and X apart).
__device__ __forceinline__ void invert_in_place(float* MX, float* Yf, int wg, int lane, int g) {
  if (lane < 16) {
    const int r0 = 16 * wg, j = lane;
    float x[16];
    invert_diag_column(MX, r0, j, x);
    __syncwarp(0xffffu);  // every lane has read the block's M rows
#pragma unroll
    for (int i = 0; i < 16; ++i) MX[(r0 + i) * kLdF + r0 + j] = x[i];
  }
  for (int r = 1; r < 4; ++r) {
    group_sync(g);  // X_rr and the blocks of rows < r are complete
    float* Yw = Yf + wg * 16 * kLdY;
    if (wg < r) invert_merge_y(MX, MX, r, wg, Yw);
    group_sync(g);  // every read of row block r's M is done
    if (wg < r) invert_merge_x(MX, Yw, r, wg);
  }
  group_sync(g);
}

// Threads of a block: kGb groups of 4 warps, plus kPWarps warps for the gated Q Kᵀ when Pqk is written.
__host__ __device__ constexpr int prep_threads(int gb, bool with_p) {
  return gb * kGroupThreads + (with_p ? kPWarps * 32 : 0);
}

// Block index -> (chunk slot, q/k head h, first value head hv0 of the block's kGb heads).
struct PrepItem {
  int64_t slot, h, hv0;
};
__device__ __forceinline__ PrepItem prep_item(int64_t bid, int64_t H, int64_t G, int kGb) {
  const int64_t parts = G / kGb;
  const int64_t hp = bid % (H * parts), h = hp / parts;
  return {bid / (H * parts), h, h * G + (hp % parts) * kGb};
}

template <class T, int kGb, bool kWithP>
__global__ void __launch_bounds__(prep_threads(kGb, kWithP), kGb == 2 ? 2 : 3)
    prep_group_mma(const GdnFwdParams p) {
  constexpr int kNThr = prep_threads(kGb, kWithP);
  constexpr int kLoadThr = kGb * kGroupThreads;  // the groups' threads issue the tile loads (whole lean_rows passes)
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t H = p.shape.H, G = p.shape.G, K = p.shape.K, V = p.shape.V;
  const int kcols = prep_key_cols(K, kWithP), vcols = round64(V);
  const int ldk = kcols + 8, ldv = vcols + 8;  // conflict-free ldmatrix (row stride 16 mod 128 bytes)
  T* Kt = reinterpret_cast<T*>(smem);          // [64][ldk] K chunk of q/k head h
  T* Qt = Kt + kRows * ldk;                    // [64][ldk] Q chunk (kWithP)
  T* Vt = Qt + (kWithP ? kRows * ldk : 0);     // [kGb][64][ldv] V chunks of the block's value heads
  float* MXs = reinterpret_cast<float*>(Vt + kGb * kRows * ldv);  // [kGb][64][kLdF] M, then X in place
  float* Yfs = MXs + kGb * kRows * kLdF;                          // [kGb][3][16][kLdY] merge scratch
  float* vecs = Yfs + kGb * 3 * 16 * kLdY;                        // [kGb][γ, β, fw, fu][64]
  const PrepItem item = prep_item(blockIdx.x, H, G, kGb);
  const int64_t h = item.h, hv0 = item.hv0;
  const ChunkPos c = locate_chunk(p.chunks, item.slot);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s);
  const int BT = static_cast<int>(p.shape.BT);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // Rows [0, L) of D columns of head `head` into dst [64][ld], `width` (>= D, a multiple of 64) columns, zero
  // past L and D. Fixed-slot copies when the tensor is plain 16-bit and D fills the width.
  auto load_rows = [&](T* dst, const GdnTensor& t, int64_t head, int64_t D, int width, int ld) {
    const int64_t base = off_tok(t, c.b, c.s, head);
    if (D == width && lean_tensor<T>(t)) {
      lean_rows<kLoadThr>(dst, ld, t, base, L, D);
    } else {
      for (int d0 = 0; d0 < width; d0 += 64)
        load_tile<T, 64, kLoadThr>(dst + d0, ld, t, base, t.st[1], t.st[3], L, d0, D);
    }
  };
  // K and Q as one cp.async group, the V chunks as a second (they arrive during the products and the inverses).
  if (tid < kLoadThr) {
    load_rows(Kt, p.k, h, K, kcols, ldk);
    if constexpr (kWithP) load_rows(Qt, p.q, h, K, kcols, ldk);
  }
  cuda::cp_async_commit();
  if (tid < kLoadThr) {
#pragma unroll
    for (int g = 0; g < kGb; ++g) load_rows(Vt + g * kRows * ldv, p.v, hv0 + g, V, vcols, ldv);
  }
  cuda::cp_async_commit();
  for (int idx = tid; idx < kGb * kRows; idx += kNThr) {
    const int g = idx / kRows, i = idx % kRows;
    const int64_t hv = hv0 + g;
    float gv = 0.f, bv = 1.f;
    if (i < L) {
      if (p.g.present()) gv = load_f(p.g, off_tok(p.g, c.b, c.s + i, hv));
      if (p.beta.present()) bv = load_f(p.beta, off_tok(p.beta, c.b, c.s + i, hv));
    }
    float* vg = vecs + g * 4 * kRows;
    vg[i] = gv;
    vg[kRows + i] = bv;
    vg[2 * kRows + i] = i < L ? bv * expf(gv) : 0.f;  // fw = β e^γ (w), 0 past L: wy_mma's expression
    vg[3 * kRows + i] = i < L ? bv : 0.f;             // fu = β (u)
  }
  cuda::cp_async_wait<1>();  // K (and Q) complete; V may be in flight
  __syncthreads();

  if (kWithP && warp >= kGb * 4) {
    // The P warps: Q Kᵀ as qk_gate_mma (row block rb, column blocks <= rb, 8 key steps over 128 zero-padded columns),
    // formed once for the block's kGb heads, gated per head and stored as Pqk[hv] rows 16 rb.. < L, columns < BT:
    // (q_i·k_j) e^{γ_i − γ_j} for j <= i, else 0, rounded to T. Warp 0 takes row blocks 3 and 0, warp 1 blocks 2
    // and 1 (5 of the 10 lower blocks each). They run beside the groups' chains and meet them only at the V
    // barrier.
    const int pw = warp - kGb * 4;
    const bool pvec = pair_vec<T>(p.Pqk);
#pragma unroll 1
    for (int step = 0; step < 2; ++step) {
      const int rb = step == 0 ? 3 - pw : pw;
      FragC R[8];
#pragma unroll
      for (int n = 0; n < 8; ++n) R[n].zero();
#pragma unroll
      for (int kq = 0; kq < kKF / 16; ++kq) {
        const FragA a = mma::load_a(Qt, ldk, 16 * rb, 16 * kq);
#pragma unroll
        for (int cb = 0; cb < 4; ++cb)
          if (cb <= rb) {
            FragB b0, b1;
            mma::load_b2(b0, b1, Kt, ldk, 16 * kq, 16 * cb);
            mma::mma16816<T>(R[2 * cb], a, b0);
            mma::mma16816<T>(R[2 * cb + 1], a, b1);
          }
      }
#pragma unroll 1
      for (int gi = 0; gi < kGb; ++gi) {  // one copy of the gating / store code (instruction fetch, see above)
        const float* gm = vecs + gi * 4 * kRows;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * rb + mma::c_row(2 * half);
          if (i >= L) continue;
          const int64_t ro = off_tok(p.Pqk, c.b, c.s + i, hv0 + gi);
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
    __syncthreads();  // the V barrier of the groups (every thread of the block takes it)
    return;
  }
  // The warp's index in its group (its diagonal block and merge column in the inverse): warp w runs on SM
  // sub-partition w % 4 and group 1 numbers its warps in reverse, so each sub-partition holds the inverse roles rb
  // and 3 − rb of the two heads (row block rb's merges are the longest for rb = 0).
  const int g = warp >> 2, rw = g == 0 ? (warp & 3) : 3 - (warp & 3);
  const int64_t hv = hv0 + g;
  float* MX = MXs + g * kRows * kLdF;
  const float* gam = vecs + g * 4 * kRows;
  const float* bet = gam + kRows;
  const float* fw = gam + 2 * kRows;
  const float* fu = gam + 3 * kRows;
  // Work split of the products (K Kᵀ and w / u carry (rb + 1) / 10 of a head's work in row block rb): warp q of a
  // group takes the row blocks rbA = min(q, 3 − q) and rbB = 3 − rbA, and the 16-column units of parity q / 2
  // (warps q and 3 − q share two row blocks), so every warp has 5 / 20 of the products instead of (rw + 1) / 10.
  const int rbA = rw < 2 ? rw : 3 - rw, rbB = 3 - rbA, par = rw >> 1;
  {
    // R = K Kᵀ as wy_mma (row blocks rbA, rbB; column blocks np <= rb of parity par; 64-column key tiles d0 < K,
    // 4 steps each), gated in the registers: M[i][j] = β_i (k_i·k_j) e^{γ_i − γ_j} for j < i < L, else 0 (selected:
    // e^{...} never overflows); the columns of parity par of rows 16 rbA.. and 16 rbB.. are written in full (0 right
    // of the diagonal), so the two warps of a row-block pair write all of M.
    FragC R[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int n = 0; n < 4; ++n) R[t][n].zero();
    for (int d0 = 0; d0 < K; d0 += 64) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int rb = t == 0 ? rbA : rbB;
          const FragA a = mma::load_a(Kt, ldk, 16 * rb, d0 + 16 * ks);
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int np = 2 * u + par;
            if (np <= rb) {
              FragB b0, b1;
              mma::load_b2(b0, b1, Kt, ldk, d0 + 16 * ks, 16 * np);
              mma::mma16816<T>(R[t][2 * u], a, b0);
              mma::mma16816<T>(R[t][2 * u + 1], a, b1);
            }
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int hn = 0; hn < 2; ++hn)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int n = 2 * (2 * u + par) + hn;
            const int i = 16 * (t == 0 ? rbA : rbB) + mma::c_row(e), j = 8 * n + mma::c_col(e);
            const float r = R[t][2 * u + hn].x[e];
            MX[i * kLdF + j] = (j < i && i < L) ? bet[i] * r * expf(gam[i] - gam[j]) : 0.f;
          }
  }
  group_sync(g);  // M of head g complete
  invert_in_place(MX, Yfs + g * 3 * 16 * kLdY, rw, lane, g);
  if (p.A.present()) store_chunk_mat<T, kGroupThreads>(p.A, c, hv, L, BT, MX, tid - g * kGroupThreads);
  cuda::cp_async_wait<0>();  // the V chunks
  __syncthreads();
  // One copy of the w / u code for the four (tensor, row block) steps: GPU run s9run1's ncu showed the kernel
  // stalled on instruction fetch (no_instruction 6.2 cycles per issue against 0.7 for wy_mma).
  const T* Vg = Vt + g * kRows * ldv;
#pragma unroll 1
  for (int step = 0; step < 4; ++step) {
    const bool is_u = step >= 2;
    const int rb = (step & 1) ? rbB : rbA;
    if (is_u) wu_tiles<T, 2>(p.u, Vg, ldv, V, MX, fu, rb, c, hv, L, par);
    else wu_tiles<T, 2>(p.w, Kt, ldk, K, MX, fw, rb, c, hv, L, par);
  }
}

template <class T, int kGb, bool kWithP>
int launch_prep(const GdnFwdParams& p, cudaStream_t stream) {
  const int64_t blocks = chunk_slots(p.chunks) * p.shape.H * (p.shape.G / kGb);
  const size_t smem = prep_smem(p.shape.K, p.shape.V, kGb, kWithP);
  return launch_n(prep_group_mma<T, kGb, kWithP>, "prepare_wy_repr_fwd (prep_group_mma)", blocks,
                  prep_threads(kGb, kWithP), smem, stream, p);
}

template <class T>
int launch_prep(const GdnFwdParams& p, cudaStream_t stream) {
  const bool with_p = p.Pqk.present();
  if (prep_heads_per_block(p.shape.G) == 2)
    return with_p ? launch_prep<T, 2, true>(p, stream) : launch_prep<T, 2, false>(p, stream);
  return with_p ? launch_prep<T, 1, true>(p, stream) : launch_prep<T, 1, false>(p, stream);
}

}  // namespace

std::string fwd_cuda_prep_reject(const GdnFwdParams& p) {
  // k, v (product operands) one 16-bit dtype T, w, u (and A when present) T too; K, V <= 256; BT <= 64.
  std::string r = fwd_cuda_mma_reject(FwdOp::kPrepareWY, p);
  if (!r.empty()) return r;
  if (!p.k.present() || !p.v.present() || !p.w.present() || !p.u.present())
    return "the pre-state kernel reads k, v and writes w, u (one of them is absent)";
  if (p.shape.H < 1 || p.shape.G < 1 || p.shape.H * p.shape.G != p.shape.HV) return "HV must be a multiple G of H";
  const bool with_p = p.Pqk.present();
  if (with_p) {
    if (!p.q.present() || p.q.dtype != p.k.dtype) return "the gated Q Kᵀ (Pqk) needs q in the dtype of k";
    if (p.Pqk.dtype != p.k.dtype) return "the gated Q Kᵀ (Pqk) is stored in the dtype of q, k";
    if (p.shape.K > kKF) return fmt::format("the gated Q Kᵀ (Pqk) needs K <= {}", kKF);
  }
  const size_t smem = prep_smem(p.shape.K, p.shape.V, prep_heads_per_block(p.shape.G), with_p);
  if (smem > kPrepMaxSmem)
    return fmt::format("the pre-state kernel needs {} bytes of shared memory per block, more than {}", smem,
                       kPrepMaxSmem);
  return {};
}

int fwd_cuda_prep(const GdnFwdParams& p, void* stream_ptr) {
  const std::string why = fwd_cuda_prep_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_fwd (prep_group_mma): {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  return p.k.dtype == STRATA_DTYPE_BF16 ? launch_prep<__nv_bfloat16>(p, stream) : launch_prep<__half>(p, stream);
}

}  // namespace strata::linear_attn::gdn
