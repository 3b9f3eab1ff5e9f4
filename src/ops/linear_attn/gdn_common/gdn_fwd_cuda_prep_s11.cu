// (Session 13, GPU run 1 only) The session-11 prep_wgmma kernel as it was at commit 4612426 (the chunk form with a
// run-time K panel count and the row-wise inverse), compiled beside the current one so that one run times both side by
// side (session 11 measured w, u 0.430 ms in s11run2, session 12's final run 0.445 ms for the current default in
// another run). Reached only by fwd_cuda_prep_s11 (gdn_fwd_cuda_prep.h; tests/cpp/test_gdn_prep_fold.cpp,
// GdnFwdCudaPrepForms.*): checked against the current chunk form and timed there. Removed after the run.
//
// The file below is 4612426's gdn_fwd_cuda_prep.cu up to its launch, unchanged but for this comment and the exported
// entry at the end; its helpers are in an anonymous namespace (no symbol shared with gdn_fwd_cuda_prep.cu).
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_prep.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_mma_tiles.cuh"
#include "tile/cuda/wgmma.cuh"
#include "tile/cuda/wgmma_layout.h"

namespace strata::linear_attn::gdn {
namespace {

namespace wg = strata::cuda::wgmma;
using Bf16 = __nv_bfloat16;

constexpr int kPanel = 64 * 64;               // elements of a 64 x 64 core-matrix panel (tile_off<64>)
constexpr int kPanelB = kPanel * 2;           // its bytes
constexpr int kMBytes = kRows * kLdF * 4;     // the f32 M / X tile
constexpr size_t kPrepMaxSmem = 227 * 1024;   // sm_90 dynamic shared memory per block

// Shared memory (byte offsets): K panels [nk] at 0, V panels [nv] at v, Q panels [nk] (with Pqk) then M / X f32
// [64][kLdF] at m (max(Q, 17 KB)), the merge scratch [3][16][kLdY] f32 at y and γ, β, fw, fu [64] f32 at vec.
// K = V = 128: 54.25 KB, four blocks per SM.
struct PrepLayout {
  int nk, nv;                 // 64-column panels of K and V
  int v, m, y, vec, total;    // byte offsets (K at 0) and size
};
__host__ __device__ inline PrepLayout prep_layout(int64_t K, int64_t V) {
  PrepLayout l{};
  l.nk = round64(K) / 64;
  l.nv = round64(V) / 64;
  l.v = l.nk * kPanelB;
  l.m = l.v + l.nv * kPanelB;
  l.y = l.m + (l.nk * kPanelB > kMBytes ? l.nk * kPanelB : kMBytes);
  l.vec = l.y + 3 * 16 * kLdY * 4;
  l.total = l.vec + 4 * kRows * 4;
  return l;
}

// Rows [0, L) and columns [0, D) of head `head` of the chunk into `panels` 64-column core-matrix panels at dst,
// zero past L and D. A warp copies 8 rows x 4 segments of 16 bytes per step (rows: lane % 8): 64 contiguous bytes
// per row in global memory, 4 whole core matrices (conflict-free) in shared memory. One cp.async per segment for
// a lean tensor (lean_tensor: bf16, unit column stride, strides multiples of 8, 16-byte aligned), element-wise
// converting copies otherwise (element_segment: any dtype and strides). Caller commits.
__device__ __forceinline__ void load_panels(Bf16* dst, const GdnTensor& t, const ChunkPos& c, int64_t head, int L,
                                            int64_t D, int panels) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t base = off_tok(t, c.b, c.s, head), rs = t.st[1];
  const bool lean = lean_tensor<Bf16>(t);
  const uint16_t* src = static_cast<const uint16_t*>(t.data) + base;
  const int steps = 16 * panels;  // (8 row groups) x (2 panels' 4-segment groups)
#pragma unroll 2
  for (int s = warp; s < steps; s += 4) {
    const int r = 8 * (s & 7) + (lane & 7), q = 4 * (s >> 3) + (lane >> 3), col = 8 * q;
    Bf16* d = dst + (q >> 3) * kPanel + wg::tile_off<64>(r, col & 63);
    if (lean) {
      const bool ok = r < L && col + 8 <= D;
      if (ok || r >= L || col >= D) {
        cp_async16_s(mma::smem_addr(d), ok ? src + r * rs + col : src, ok);
        continue;
      }
    }
    element_segment<Bf16>(d, t.data, t.dtype, base, rs, t.st[3], r, L, col, D);
  }
}

// Descriptor of K-step ks (16 contraction columns) of a K-major operand held as 64-column panels at `base`.
__device__ __forceinline__ uint64_t panel_desc(uint32_t base, int ks) {
  return wg::tile_desc<64>(base + static_cast<uint32_t>(ks >> 2) * kPanelB, ks & 3);
}

// (Session 11) A 64 x 64 panel (tile_off<64>: row = token, 8 contiguous columns per 16-byte
// row of a core matrix) read as the MN-major B operand tokens x columns of w = X diag(f) K / u = X diag(f) V: the
// contraction (tokens) steps by 8-row core-matrix rows (LBO = 1 KB, the next 8 tokens), the N columns by core
// matrices (SBO = 128 B, the next 8 columns); K-step ks (16 tokens) starts 2 KB further.
__device__ __forceinline__ uint64_t panel_desc_mn(uint32_t base, int ks) {
  return wg::make_desc(base + static_cast<uint32_t>(ks) * 2048u, 1024u, 128u);
}
// wgmma m64n64k16 with the register A and an MN-major B (imm-trans-b = 1); otherwise wg::mma_rs<bf16, 64>.
__device__ __forceinline__ void mma_rs_mn64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

// γ, β and the w / u row factors of the chunk's rows i < 64 into gam, bet, fw = β e^γ, fu = β (0 past L; γ, β 0
// and 1 past L, or with the gates absent). γ read from p.g, or (GdnFwdHead::g_in present) formed here as the
// chunk-local cumsum of the raw gates and stored into p.g (f32, rows < L): warp 0, two rows per lane (2l, 2l + 1),
// a shuffle scan of the lanes' pair sums. Threads 0..63 / warp 0; the caller synchronises.
__device__ __forceinline__ void row_factors(const GdnFwdParams& p, const GdnTensor& g_in, const ChunkPos& c,
                                            int64_t hv, int L, float* gam, float* bet, float* fw, float* fu) {
  const int tid = threadIdx.x, lane = tid & 31;
  auto beta_at = [&](int i) {
    return i < L && p.beta.present() ? load_f(p.beta, off_tok(p.beta, c.b, c.s + i, hv)) : 1.f;
  };
  auto put = [&](int i, float gv, float bv) {
    gam[i] = gv;
    bet[i] = bv;
    fw[i] = i < L ? bv * __expf(gv) : 0.f;  // β e^γ (w), 0 past L
    fu[i] = i < L ? bv : 0.f;               // β (u)
  };
  if (g_in.present()) {
    if (tid >= 32) return;
    const int i0 = 2 * lane;
    // Every global load first (both rows' gate and β: one round trip on the block's critical path), then the scan.
    const float a = i0 < L ? load_f(g_in, off_tok(g_in, c.b, c.s + i0, hv)) : 0.f;
    const float a1 = i0 + 1 < L ? load_f(g_in, off_tok(g_in, c.b, c.s + i0 + 1, hv)) : 0.f;
    const float b0 = beta_at(i0), b1 = beta_at(i0 + 1);
    const float b = a + a1;
    float incl = b;  // inclusive scan of the lanes' pair sums
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const float prev = __shfl_up_sync(0xffffffffu, incl, 1);
    const float g0 = lane ? prev : 0.f;  // sum of the rows before 2l
    const float gv[2] = {g0 + a, g0 + b};
    put(i0, gv[0], b0);
    put(i0 + 1, gv[1], b1);
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (i0 + e < L) static_cast<float*>(p.g.data)[off_tok(p.g, c.b, c.s + i0 + e, hv)] = gv[e];
    return;
  }
  if (tid < kRows) {
    const int i = tid;
    put(i, i < L && p.g.present() ? load_f(p.g, off_tok(p.g, c.b, c.s + i, hv)) : 0.f, beta_at(i));
  }
}

// In-place X = (I + M)^-1 over the strictly lower M of the tile MX (zero outside the strictly lower part; the
// blocks above the block diagonal stay 0), by the block's 4 warps (w = warp). The steps and their order are
// invert()'s; in round r warp c < r reads M_rk (k >= c) of row block r, which warps c' > c overwrite with X_rc',
// so every warp forms its Y before any writes X (one more barrier per round than invert, which keeps M and X
// apart).
__device__ __forceinline__ void invert_in_place(float* MX, float* Yf, int w, int lane) {
  if (lane < 16) {
    const int r0 = 16 * w, j = lane;
    float x[16];
    invert_diag_column(MX, r0, j, x);
    __syncwarp(0xffffu);  // every lane has read the block's M rows
#pragma unroll
    for (int i = 0; i < 16; ++i) MX[(r0 + i) * kLdF + r0 + j] = x[i];
  }
  for (int r = 1; r < 4; ++r) {
    __syncthreads();  // X_rr and the blocks of rows < r are complete
    float* Yw = Yf + w * 16 * kLdY;
    if (w < r) invert_merge_y(MX, MX, r, w, Yw);
    __syncthreads();  // every read of row block r's M is done
    if (w < r) invert_merge_x(MX, Yw, r, w);
  }
  __syncthreads();
}

// Keeps the register A operands of an in-flight wgmma alive and unchanged until its group is waited for.
__device__ __forceinline__ void keep_frags(FragA (&a)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[k].x[e])::"memory");
}

// Stores rows i < L of the warp's part of an m64n64 accumulator tile (columns c0.. of dst, < D), rounded to bf16:
// one row pointer and aligned 32-bit stores when the tile is inside D and dst is pair_vec, store_pair_v otherwise.
__device__ __forceinline__ void store_tile(const float (&acc)[32], const GdnTensor& dst, const ChunkPos& c,
                                           int64_t hv, int L, int64_t c0, int64_t D) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool vec = pair_vec<Bf16>(dst);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = 16 * warp + (lane >> 2) + 8 * hh;
    if (i >= L) continue;
    const int64_t ro = off_tok(dst, c.b, c.s + i, hv);
    if (vec && c0 + 64 <= D) {
      uint16_t* row = static_cast<uint16_t*>(dst.data) + ro + c0 + 2 * (lane & 3);
#pragma unroll
      for (int jb = 0; jb < 8; ++jb)
        *reinterpret_cast<uint32_t*>(row + 8 * jb) = mma::pack2<Bf16>(acc[4 * jb + 2 * hh], acc[4 * jb + 2 * hh + 1]);
    } else {
#pragma unroll
      for (int jb = 0; jb < 8; ++jb)
        store_pair_v<Bf16>(dst, vec, ro, c0 + 8 * jb + 2 * (lane & 3), D, acc[4 * jb + 2 * hh],
                           acc[4 * jb + 2 * hh + 1]);
    }
  }
}


constexpr int kLdStage = 64 + 8;  // staging row (bf16): 144 bytes, so 8 stmatrix rows hit distinct banks

// store_tile through shared memory (whole 64-column tiles of a lean dst): the warp writes its 16 rows rounded to
// bf16 into its staging block stg [16][kLdStage] by 4 stmatrix.x4, then copies them out as 16-byte segments (8 lanes
// per 128-byte row: 4 stores per lane instead of 16 4-byte pair stores, whole sectors). GPU run s10run1 (B = 4
// T = 8192 H = 16 HV = 32 K = V = 128): w, u 0.571 -> 0.466 ms, w, u, Pqk 0.785 -> 0.673 ms (w, u staged only).
__device__ __forceinline__ void store_tile_staged(const float (&acc)[32], const GdnTensor& dst, const ChunkPos& c,
                                                  int64_t hv, int L, int64_t c0, Bf16* stg) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // matrices (row half mi % 2, column block 2q + mi / 2)
    const int j0 = 2 * q, j1 = 2 * q + 1;
    wg::stmatrix_x4(mma::smem_addr(stg + (8 * (mi & 1) + r) * kLdStage + 8 * (2 * q + (mi >> 1))),
                mma::pack2<Bf16>(acc[4 * j0], acc[4 * j0 + 1]), mma::pack2<Bf16>(acc[4 * j0 + 2], acc[4 * j0 + 3]),
                mma::pack2<Bf16>(acc[4 * j1], acc[4 * j1 + 1]), mma::pack2<Bf16>(acc[4 * j1 + 2], acc[4 * j1 + 3]));
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int row = mi + 4 * k, i = 16 * warp + row;
    if (i < L) {
      const uint4 v = *reinterpret_cast<const uint4*>(stg + row * kLdStage + 8 * r);
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(dst.data) + off_tok(dst, c.b, c.s + i, hv) + c0 + 8 * r) = v;
    }
  }
  __syncwarp();  // the block is read before the next tile overwrites it
}

template <bool kWithP>
__global__ void __launch_bounds__(kThreads, 4) prep_wgmma(const GdnFwdParams p, const GdnFwdHead hd) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host entry launches this kernel only on sm_90 devices of an sm_90a build)
#else
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V;
  const PrepLayout ly = prep_layout(K, V);
  const int64_t hv = static_cast<int64_t>(blockIdx.x) % HV, h = hv / p.shape.G;
  const ChunkPos c = locate_chunk(p.chunks, static_cast<int64_t>(blockIdx.x) / HV);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s), BT = static_cast<int>(p.shape.BT);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  Bf16* Kp = reinterpret_cast<Bf16*>(smem);            // K panels
  Bf16* Vs = reinterpret_cast<Bf16*>(smem + ly.v);     // V panels
  Bf16* Qp = reinterpret_cast<Bf16*>(smem + ly.m);     // Q panels (with Pqk), then M / X
  float* MX = reinterpret_cast<float*>(smem + ly.m);
  float* Yf = reinterpret_cast<float*>(smem + ly.y);
  float* gam = reinterpret_cast<float*>(smem + ly.vec);
  float* bet = gam + kRows;
  float* fw = gam + 2 * kRows;
  float* fu = gam + 3 * kRows;
  const uint32_t s_k = mma::smem_addr(Kp), s_q = mma::smem_addr(Qp), s_v = mma::smem_addr(Vs);

  load_panels(Kp, p.k, c, h, L, K, ly.nk);
  if constexpr (kWithP) load_panels(Qp, p.q, c, h, L, K, ly.nk);
  cuda::cp_async_commit();
  load_panels(Vs, p.v, c, hv, L, V, ly.nv);
  cuda::cp_async_commit();
  row_factors(p, hd.g_in, c, hv, L, gam, bet, fw, fu);
  cuda::cp_async_wait<1>();  // K (and Q) complete; V may be in flight
  wg::fence_proxy_async();  // the panels visible to the wgmma (async proxy)
  __syncthreads();

  // wgmma 1: R = K Kᵀ; wgmma 2: Q Kᵀ (every 16-column key step of the panels; zero columns past K add +0).
  const int ksteps = 4 * ly.nk;
  float R[32];
  float P[kWithP ? 32 : 1];
  wg::reg_fence(R);
  if constexpr (kWithP) wg::reg_fence(P);
  wg::wg_fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
    if (ks < ksteps) wg::mma_ss<Bf16, 64>(R, panel_desc(s_k, ks), panel_desc(s_k, ks), ks > 0);
  wg::wg_commit();
  if constexpr (kWithP) {
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
      if (ks < ksteps) wg::mma_ss<Bf16, 64>(P, panel_desc(s_q, ks), panel_desc(s_k, ks), ks > 0);
    wg::wg_commit();
  }
  wg::wg_wait<0>();
  wg::reg_fence(R);
  if constexpr (kWithP) wg::reg_fence(P);
  cuda::cp_async_wait<0>();  // V
  wg::fence_proxy_async();  // V read by the u wgmma as loaded
  __syncthreads();  // V visible; every warp's wgmma 1 / 2 done: Q panels are free once read here
  if constexpr (kWithP) {
    // P[i][j] = (q_i·k_j) e^{γ_i − γ_j} for j <= i < L, else 0, rounded to bf16, rows < L and columns < BT of
    // Pqk[hv]: staged through Q's panels (free now, M's next) when Pqk is lean and BT = 64, else pair stores.
    // (The right blocks jb > 2 warp + 1 are 0 without exponentials, as the gating of M below.)
    const int i0 = 16 * warp + (lane >> 2);
    const float gi[2] = {gam[i0], gam[i0 + 8]};
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) {
      const bool lower = 8 * jb <= 16 * warp + 15;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + 8 * (e >> 1), j = 8 * jb + 2 * (lane & 3) + (e & 1);
        P[4 * jb + e] = (lower && j <= i) ? P[4 * jb + e] * __expf(gi[e >> 1] - gam[j]) : 0.f;
      }
    }
    if (BT == kRows && lean_tensor<Bf16>(p.Pqk) && ly.nk * kPanelB >= 4 * 16 * kLdStage * 2) {  // K > 64: room
      store_tile_staged(P, p.Pqk, c, hv, L, 0, Qp + warp * 16 * kLdStage);
    } else {
      const bool pvec = pair_vec<Bf16>(p.Pqk);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = 16 * warp + (lane >> 2) + 8 * hh;
        if (i >= L) continue;
        const int64_t ro = off_tok(p.Pqk, c.b, c.s + i, hv);
#pragma unroll
        for (int jb = 0; jb < 8; ++jb)
          store_pair_v<Bf16>(p.Pqk, pvec, ro, 8 * jb + 2 * (lane & 3), BT, P[4 * jb + 2 * hh], P[4 * jb + 2 * hh + 1]);
      }
    }
    __syncthreads();  // every warp's staging reads of Q's panels done (M overwrites them)
  }

  // Gating in the registers: M[i][j] = β_i (k_i·k_j) e^{γ_i − γ_j} for j < i < L, else 0 (selected: e^{...} never
  // overflows), every column of the warp's rows written (the upper blocks are the inverse's zeros). The gate
  // exponentials by __expf (ex2.approx: ~2 ulp of f32, far below the bf16 roundings of the outputs; one FMUL and
  // one MUFU instead of expf's ~10 instructions, 64 per thread here).
  // Accumulator element 4 jb + e of lane l: row 16 warp + l / 4 + 8 (e / 2), column 8 jb + 2 (l % 4) + e % 2.
  // (Session 11) Formed in place first, then stored, so that the row and column factors are read from shared memory
  // once (no stores in between); the column blocks right of the warp's rows (jb > 2 warp + 1) are 0 without
  // exponentials (a warp-uniform branch: 3 of 8 blocks on average). The same bits as before.
  const int i0 = 16 * warp + (lane >> 2);
  const float gi[2] = {gam[i0], gam[i0 + 8]}, bi[2] = {bet[i0], bet[i0 + 8]};
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    const bool lower = 8 * jb <= 16 * warp + 15;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hh = e >> 1, i = i0 + 8 * hh, j = 8 * jb + 2 * (lane & 3) + (e & 1);
      float& r = R[4 * jb + e];
      r = (lower && j < i && i < L) ? bi[hh] * r * __expf(gi[hh] - gam[j]) : 0.f;
    }
  }
#pragma unroll
  for (int jb = 0; jb < 8; ++jb)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      *reinterpret_cast<float2*>(MX + (i0 + 8 * hh) * kLdF + 8 * jb + 2 * (lane & 3)) =
          make_float2(R[4 * jb + 2 * hh], R[4 * jb + 2 * hh + 1]);
  __syncthreads();  // M complete
  invert_in_place(MX, Yf, warp, lane);
  if (p.A.present()) store_chunk_mat<Bf16, kThreads>(p.A, c, hv, L, BT, MX);

  // w, u: 64-column tiles t < nk of w (B = K panel t), then of u (B = V panel t − nk).
  FragA aw[4], au[4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    aw[ks] = frag_a_scaled<Bf16>(MX, 16 * warp, 16 * ks, fw);
    au[ks] = frag_a_scaled<Bf16>(MX, 16 * warp, 16 * ks, fu);
  }
  // One tile in flight per block (the SM's other three blocks fill the wait): a second accumulator tile in flight
  // made ptxas inject a wait at the loop head (C7517), and 128 registers are the four-block bound.
  const int nk = ly.nk, nt = ly.nk + ly.nv;
  // The f32 tile is dead once every warp has its fragments; each warp stages its tiles' rows there.
  Bf16* stg = reinterpret_cast<Bf16*>(MX) + warp * 16 * kLdStage;
  const bool w_staged = lean_tensor<Bf16>(p.w), u_staged = lean_tensor<Bf16>(p.u);
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < nt; ++t) {
    float acc[32];
    wg::reg_fence(acc);
    wg::wg_fence();
    if (t < nk) {  // B = the K / V panel t as loaded
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) mma_rs_mn64(acc, aw[ks].x, panel_desc_mn(s_k + t * kPanelB, ks), ks > 0);
    } else {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) mma_rs_mn64(acc, au[ks].x, panel_desc_mn(s_v + (t - nk) * kPanelB, ks), ks > 0);
    }
    wg::wg_commit();
    wg::wg_wait<0>();
    wg::reg_fence(acc);
    keep_frags(aw), keep_frags(au);
    if (t < nk) {
      if (w_staged && 64 * t + 64 <= K) store_tile_staged(acc, p.w, c, hv, L, 64 * t, stg);
      else store_tile(acc, p.w, c, hv, L, 64 * t, K);
    } else {
      if (u_staged && 64 * (t - nk) + 64 <= V) store_tile_staged(acc, p.u, c, hv, L, 64 * (t - nk), stg);
      else store_tile(acc, p.u, c, hv, L, 64 * (t - nk), V);
    }
  }
#endif
}

template <bool kWithP>
int launch_prep(const GdnFwdParams& p, const GdnFwdHead& hd, cudaStream_t stream) {
  const int64_t blocks = chunk_slots(p.chunks) * p.shape.HV;
  const size_t smem = static_cast<size_t>(prep_layout(p.shape.K, p.shape.V).total);
  return launch_n(prep_wgmma<kWithP>, "prepare_wy_repr_fwd (prep_wgmma)", blocks, kThreads, smem, stream, p, hd);
}


}  // namespace

int fwd_cuda_prep_s11(const GdnFwdParams& p, void* stream_ptr) {
  const std::string why = fwd_cuda_prep_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_fwd (prep_wgmma s11): {}", why);
  if (p.qk_norm) return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_fwd (prep_wgmma s11): no folded l2norm");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  return p.Pqk.present() ? launch_prep<true>(p, GdnFwdHead{}, stream) : launch_prep<false>(p, GdnFwdHead{}, stream);
}

}  // namespace strata::linear_attn::gdn
