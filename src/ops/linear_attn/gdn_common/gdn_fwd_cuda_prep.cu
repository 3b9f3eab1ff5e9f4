// CUDA sm_90a kernel prep_wgmma (session 10): everything the GDN forward computes before its state pass, in one
// chunk-parallel launch on Hopper warpgroup MMA (gdn_fwd_kernels.h, fwd_cuda_prep): w = A diag(β e^γ) K,
// u = A diag(β) V with A = (I + strictly-lower(diag(β) K Kᵀ ⊙ Γ))⁻¹, A itself when p.A is present (the backward's
// re-run forward), and the gated Q Kᵀ p.Pqk when present (the fused forward's pre-computed P).
//
// One block = one warpgroup (4 warps; warp w owns rows 16w..16w+15 of every m64 product) per (chunk, value head):
//   loads      K (and Q) [64][K] as one cp.async group, V [64][V] as a second, into 64-column core-matrix panels
//              (wgmma_layout.h tile_off<64>: row = token, column = key / value column); γ (read, or formed from the
//              raw gates: GdnFwdHead::g_in), β, fw = β e^γ, fu = β [64] (0 past the chunk's L rows)
//   wgmma 1    R = K Kᵀ: m64n64k16, A and B the same K panels (K-major both: the contraction is the key column)
//   wgmma 2    (with Pqk) Q Kᵀ, the same way
//   Pqk        (with Pqk) P = lower(Q Kᵀ ⊙ Γ) gated in the registers, staged through Q's panels and stored as
//              16-byte segments
//   gating     M = strictly-lower(diag(β) R ⊙ Γ) from the accumulator registers into an f32 tile (over Q's panels)
//   inverse    X = (I + M)⁻¹ in place over M: the f32 blocked inverse of wy_mma (invert_diag_column,
//              invert_merge_y / _x: substitution on the 16 x 16 diagonal blocks, ~f32 split products in the
//              merges); A = X stored when p.A is present
//   wgmma 3..  per 64-column tile of w then of u: D = (X diag(f))_{bf16} B with the scaled inverse as the register
//              A operand (warp w's m16n8k16 A fragments = frag_a_scaled) and B = the K / V panel as loaded, read as
//              an MN-major operand (tokens x columns; session 11: session 10 transposed the panels into K-major Kᵀ /
//              Vᵀ tiles first), staged through the dead f32 tile and stored as 16-byte segments
// Shared memory 55 KB at K = V = 128: four blocks (16 warps) per SM.
//
// Forms (session 12; gdn_fwd_cuda_prep.h PrepForm): the above per block of one (chunk, value head) is the chunk
// form (prep_wgmma); the persistent form (prep_wgmma_persist) runs the same steps on resident blocks that walk
// (chunk, q/k head) units, K loaded once for the unit's G value heads and the next item's loads in flight during
// the current item's products (the same bits); kPersistentTree also replaces the row-wise inverse by invert_tree.
//
// Why (README.md, "The pre-state kernel"): wy_mma<kPrepare> (mma.sync) and session 9's prep_group_mma measured
// 0.59–0.62 ms for w, u at B = 4 T = 8192 H = 16 HV = 32 K = V = 128 bf16 with the shared-memory pipe at 71–75 %
// (ncu): every warp fetched the B operands of its products by ldmatrix (the same K / V columns 4 times per
// block), and the gating pass and the split fragments read f32 tiles by scalar loads. Here the products read
// their operands from shared memory once per warpgroup (descriptors), the gating runs in the accumulator
// registers, Q Kᵀ reuses the loaded K, and the outputs leave as whole 16-byte segments (GPU run s10run1: w, u
// 0.466 ms against 0.587 ms for wy_mma; 0.571 ms with 4-byte pair stores from the accumulators).
//
// Precision: the same model as wy_mma (products of bf16 inputs with f32 accumulation, M and the inverse in f32,
// X diag(f) rounded to bf16 once); not the same bits in general (the summation order inside a wgmma, __expf), so
// it is tested against the float64 references (conformance suites) and against wy_mma / qk_gate_mma within bf16
// tolerances (tests/cpp/test_gdn_fwd_cuda_variants.cpp, GdnFwdCudaPrep.MatchesWyMmaAndQkGate).
//
// Determinism: fixed work split and order, no atomics; every output element written once by one thread.
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_prep.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_cuda_mma_tiles.cuh"
#include "ops/linear_attn/gdn_common/gdn_fwd_wgmma_layout.h"
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
// [64][kLdF] at m (max(Q, 17 KB)), the merge scratch [4][16][kLdY] f32 at y (3 blocks for invert_in_place,
// 4 for invert_tree) and γ, β, fw, fu, rn (the rows' 1 / |k|: GdnFwdParams::qk_norm) [64] f32 at vec.
// K = V = 128: 54.25 KB, four blocks per SM.
struct PrepLayout {
  int nk, nv;                 // 64-column panels of K and V
  int v, m, y, vec, total;    // byte offsets (K at 0) and size
};
__host__ __device__ inline PrepLayout prep_layout(int64_t K, int64_t V, bool tree = false) {
  PrepLayout l{};
  l.nk = round64(K) / 64;
  l.nv = round64(V) / 64;
  l.v = l.nk * kPanelB;
  l.m = l.v + l.nv * kPanelB;
  l.y = l.m + (l.nk * kPanelB > kMBytes ? l.nk * kPanelB : kMBytes);
  l.vec = l.y + (tree ? 4 : 3) * 16 * kLdY * 4;
  l.total = l.vec + 5 * kRows * 4;
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

// (Session 12) load_panels for a lean tensor t with D = 64 kPanels (every segment inside D; K, V = 128): the thread's segments are fixed by (warp, lane) at compile-time steps, so a segment is one
// predicated cp.async and its address (rows past L zero-filled) instead of load_panels' run-time tests.
template <int kPanels>
__device__ __forceinline__ void load_panels_lean(Bf16* dst, const GdnTensor& t, const ChunkPos& c, int64_t head,
                                                 int L) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t rs = t.st[1];
  const uint16_t* src = static_cast<const uint16_t*>(t.data) + off_tok(t, c.b, c.s, head);
#pragma unroll
  for (int i = 0; i < 4 * kPanels; ++i) {
    const int s = warp + 4 * i;
    const int r = 8 * (s & 7) + (lane & 7), col = 8 * (4 * (s >> 3) + (lane >> 3));
    Bf16* d = dst + (col >> 6) * kPanel + wg::tile_off<64>(r, col & 63);
    const bool ok = r < L;
    cp_async16_s(mma::smem_addr(d), ok ? src + r * rs + col : src, ok);
  }
}
// The K / V (Q) loads: load_panels_lean when t is lean and D = 64 kPanels, load_panels otherwise.
template <int kPanels>
__device__ __forceinline__ void load_panels_fixed(Bf16* dst, const GdnTensor& t, bool lean, const ChunkPos& c,
                                                  int64_t head, int L, int64_t D, int panels) {
  if (lean) load_panels_lean<kPanels>(dst, t, c, head, L);
  else load_panels(dst, t, c, head, L, D, panels);
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
// Two steps (session 12), so that the persistent form can issue the next chunk's loads long before it needs them:
// row_load issues the thread's global loads (RowIn: the gates a0, a1 and β b0, b1 of its rows; nothing used yet),
// row_put forms and stores the factors (row_factors = row_put of row_load).
struct RowIn {
  float a0 = 0.f, a1 = 0.f, b0 = 1.f, b1 = 1.f;
};
__device__ __forceinline__ RowIn row_load(const GdnFwdParams& p, const GdnTensor& g_in, const ChunkPos& c,
                                          int64_t hv, int L) {
  const int tid = threadIdx.x;
  auto beta_at = [&](int i) {
    return i < L && p.beta.present() ? load_f(p.beta, off_tok(p.beta, c.b, c.s + i, hv)) : 1.f;
  };
  RowIn r;
  if (g_in.present()) {
    if (tid >= 32) return r;
    const int i0 = 2 * tid;  // both rows' gate and β: one round trip on the block's critical path
    r.a0 = i0 < L ? load_f(g_in, off_tok(g_in, c.b, c.s + i0, hv)) : 0.f;
    r.a1 = i0 + 1 < L ? load_f(g_in, off_tok(g_in, c.b, c.s + i0 + 1, hv)) : 0.f;
    r.b0 = beta_at(i0), r.b1 = beta_at(i0 + 1);
  } else if (tid < kRows) {
    r.a0 = tid < L && p.g.present() ? load_f(p.g, off_tok(p.g, c.b, c.s + tid, hv)) : 0.f;
    r.b0 = beta_at(tid);
  }
  return r;
}
__device__ __forceinline__ void row_put(const GdnFwdParams& p, const GdnTensor& g_in, const ChunkPos& c, int64_t hv,
                                        int L, const RowIn& r, float* gam, float* bet, float* fw, float* fu) {
  const int tid = threadIdx.x, lane = tid & 31;
  auto put = [&](int i, float gv, float bv) {
    gam[i] = gv;
    bet[i] = bv;
    fw[i] = i < L ? bv * __expf(gv) : 0.f;  // β e^γ (w), 0 past L
    fu[i] = i < L ? bv : 0.f;               // β (u)
  };
  if (g_in.present()) {
    if (tid >= 32) return;
    const int i0 = 2 * lane;
    const float b = r.a0 + r.a1;
    float incl = b;  // inclusive scan of the lanes' pair sums
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const float prev = __shfl_up_sync(0xffffffffu, incl, 1);
    const float g0 = lane ? prev : 0.f;  // sum of the rows before 2l
    const float gv[2] = {g0 + r.a0, g0 + b};
    put(i0, gv[0], r.b0);
    put(i0 + 1, gv[1], r.b1);
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (i0 + e < L) static_cast<float*>(p.g.data)[off_tok(p.g, c.b, c.s + i0 + e, hv)] = gv[e];
    return;
  }
  if (tid < kRows) put(tid, r.a0, r.b0);
}
__device__ __forceinline__ void row_factors(const GdnFwdParams& p, const GdnTensor& g_in, const ChunkPos& c,
                                            int64_t hv, int L, float* gam, float* bet, float* fw, float* fu) {
  row_put(p, g_in, c, hv, L, row_load(p, g_in, c, hv, L), gam, bet, fw, fu);
}

// The diagonal 16 x 16 blocks of X = (I + M)^-1 in place over M's (warp w: block w, lanes j < 16: column j).
__device__ __forceinline__ void invert_diag_in_place(float* MX, int w, int lane) {
  if (lane < 16) {
    const int r0 = 16 * w, j = lane;
    float x[16];
    invert_diag_column(MX, r0, j, x);
    __syncwarp(0xffffu);  // every lane has read the block's M rows
#pragma unroll
    for (int i = 0; i < 16; ++i) MX[(r0 + i) * kLdF + r0 + j] = x[i];
  }
}

// In-place X = (I + M)^-1 over the strictly lower M of the tile MX (zero outside the strictly lower part; the
// blocks above the block diagonal stay 0), by the block's 4 warps (w = warp). The steps and their order are
// invert()'s; in round r warp c < r reads M_rk (k >= c) of row block r, which warps c' > c overwrite with X_rc',
// so every warp forms its Y before any writes X (one more barrier per round than invert, which keeps M and X
// apart): 7 block barriers, and warp 0 forms 9 of the 16 split block products in sequence.
__device__ __forceinline__ void invert_in_place(float* MX, float* Yf, int w, int lane) {
  invert_diag_in_place(MX, w, lane);
  for (int r = 1; r < 4; ++r) {
    __syncthreads();  // X_rr and the blocks of rows < r are complete
    float* Yw = Yf + w * 16 * kLdY;
    if (w < r) invert_merge_y(MX, MX, r, w, Yw);
    __syncthreads();  // every read of row block r's M is done
    if (w < r) invert_merge_x(MX, Yw, r, w);
  }
  __syncthreads();
}

// acc (the two 8-column n-tiles of a 16 x 16 block) += A B with A the 16 x 16 block (ra, ka) of the f32 tile Af
// (leading dim lda) and B the block (kb, nb) of Bf (ldb), as ~f32 split products (invert_merge_y's step).
__device__ __forceinline__ void split_block_mma(FragC (&acc)[2], const float* Af, int lda, int ra, int ka,
                                                const float* Bf, int ldb, int kb, int nb) {
  FragA ah, al;
  FragB bh[2], bl[2];
  frag_a_split(Af, lda, ra, ka, ah, al);
  frag_b_split(Bf, ldb, kb, nb, bh, bl);
  mma_split(acc, ah, al, bh, bl);
}

// (Session 12) invert_in_place as a tree of merges: the diagonal blocks; the two 32-row inverses (warp 0: X_10 =
// −X_11 M_10 X_00, warp 2: X_32 = −X_33 M_32 X_22, wy_mma's merge steps); then the 64-row merge X_{2:3,0:1} =
// −X_{2:3,2:3} (M_{2:3,0:1} X_{0:1,0:1}) in two steps of one output block per warp (Y_rc = Σ_{k=c}^{1} M_rk X_kc
// into scratch block w, then X_rc = −Σ_{k=2}^{r} X_rk Y_kc over M_rc). The same 16 split block products as the
// row-wise order, but at most 2 in sequence per step (warp 0 forms 1 + 1 + 2 + 1 = 5 in sequence, not 9) and 4
// block barriers instead of 7. Not the same bits (another association of the sums; the same split products).
__device__ __forceinline__ void invert_tree(float* MX, float* Yf, int w, int lane) {
  invert_diag_in_place(MX, w, lane);
  __syncthreads();  // X_00 .. X_33
  if ((w & 1) == 0) {
    float* Yw = Yf + w * 16 * kLdY;
    invert_merge_y(MX, MX, w + 1, w, Yw);
    __syncwarp();
    invert_merge_x(MX, Yw, w + 1, w);
  }
  __syncthreads();  // X_10, X_32
  const int r = 2 + (w >> 1), c = w & 1;
  {
    FragC y[2];
    y[0].zero(), y[1].zero();
    for (int k = c; k < 2; ++k) split_block_mma(y, MX, kLdF, 16 * r, 16 * k, MX, kLdF, 16 * k, 16 * c);
    float* Yw = Yf + w * 16 * kLdY;
    mma::store_c(Yw, kLdY, 0, 0, y[0]);
    mma::store_c(Yw, kLdY, 0, 8, y[1]);
  }
  __syncthreads();  // every read of M_{2:3,0:1} done; the Y blocks visible
  {
    FragC x[2];
    x[0].zero(), x[1].zero();
    for (int k = 2; k <= r; ++k)
      split_block_mma(x, MX, kLdF, 16 * r, 16 * k, Yf + (2 * (k - 2) + c) * 16 * kLdY, kLdY, 0, 0);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[nt].x[e] = -x[nt].x[e];
      mma::store_c(MX, kLdF, 16 * r, 16 * c + 8 * nt, x[nt]);
    }
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

// Shared-memory pointers of a block (prep_layout; Q panels only with Pqk, over the M / X tile).
struct PrepSmem {
  Bf16 *Kp, *Vs, *Qp;
  float *MX, *Yf, *gam, *bet, *fw, *fu, *rn;
  uint32_t s_k, s_q, s_v;
  __device__ PrepSmem(unsigned char* smem, const PrepLayout& ly) {
    Kp = reinterpret_cast<Bf16*>(smem);
    Vs = reinterpret_cast<Bf16*>(smem + ly.v);
    Qp = reinterpret_cast<Bf16*>(smem + ly.m);
    MX = reinterpret_cast<float*>(smem + ly.m);
    Yf = reinterpret_cast<float*>(smem + ly.y);
    gam = reinterpret_cast<float*>(smem + ly.vec);
    bet = gam + kRows, fw = gam + 2 * kRows, fu = gam + 3 * kRows, rn = gam + 4 * kRows;
    s_k = mma::smem_addr(Kp), s_q = mma::smem_addr(Qp), s_v = mma::smem_addr(Vs);
  }
};

// D = A Kᵀ over every 16-column key step of the panels (A = K: R = K Kᵀ; A = Q: Q Kᵀ; zero columns past K add +0).
// Issues the wgmmas only (the caller fences, commits and waits).
__device__ __forceinline__ void mma_kt(float (&d)[32], uint32_t s_a, uint32_t s_k, int ksteps) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
    if (ks < ksteps) wg::mma_ss<Bf16, 64>(d, panel_desc(s_a, ks), panel_desc(s_k, ks), ks > 0);
}

// (Session 13, GdnFwdParams::qk_norm) r_i = 1 / sqrt(|k_i|² + eps) of the chunk's raw K rows from the panels (zero
// past L and K, so every kNk · 64 column may be summed): threads 2 i and 2 i + 1 sum the squares of row i's two
// halves (4 kNk 16-byte segments each; a warp's 8 rows of a core matrix read 128 contiguous bytes), one xor
// shuffle; thread 2 i puts r_i into sm.rn, folds it into w's row factor (w = X diag(β e^γ r) K: the raw K panels
// are w's B operand) and, in the first value head of the q/k head, writes it into p.rk (rows < L) for the state
// pass. Run while K Kᵀ is in flight; the caller's next block barrier publishes sm.rn and sm.fw.
template <int kNk>
__device__ __forceinline__ void k_row_norms(const GdnFwdParams& p, const PrepSmem& sm, const ChunkPos& c, int64_t h,
                                            int64_t hv, int L) {
  const int i = threadIdx.x >> 1, half = threadIdx.x & 1;
  float ss = 0.f;
#pragma unroll
  for (int sg = 0; sg < 4 * kNk; ++sg) {
    const int col = 32 * kNk * half + 8 * sg;
    ss = wgl::sum_sq_bf16x8(
        *reinterpret_cast<const uint4*>(sm.Kp + (col >> 6) * kPanel + wg::tile_off<64>(i, col & 63)), ss);
  }
  ss += __shfl_xor_sync(0xffffffffu, ss, 1);
  if (half) return;
  const float r = rsqrtf(ss + p.qk_norm_eps);
  sm.rn[i] = r;
  sm.fw[i] *= r;
  if (i < L && hv % p.shape.G == 0 && p.rk.present())
    static_cast<float*>(p.rk.data)[c.b * p.rk.st[0] + (c.s + i) * p.rk.st[1] + h * p.rk.st[2]] = r;
}

// Gating in the registers: M[i][j] = β_i (k_i·k_j) e^{γ_i − γ_j} for j < i < L, else 0 (selected: e^{...} never
// overflows), every column of the warp's rows written into MX (the upper blocks are the inverse's zeros). The gate
// exponentials by __expf (ex2.approx: ~2 ulp of f32, far below the bf16 roundings of the outputs; one FMUL and
// one MUFU instead of expf's ~10 instructions, 64 per thread here).
// Accumulator element 4 jb + e of lane l: row 16 warp + l / 4 + 8 (e / 2), column 8 jb + 2 (l % 4) + e % 2.
// (Session 11) Formed in place first, then stored, so that the row and column factors are read from shared memory
// once (no stores in between); the column blocks right of the warp's rows (jb > 2 warp + 1) are 0 without
// exponentials (a warp-uniform branch: 3 of 8 blocks on average).
// kNorm (session 13, GdnFwdParams::qk_norm: R = K Kᵀ of the raw rows): M[i][j] = β_i r_i (k_i·k_j) r_j e^{γ_i − γ_j}
// with r = sm.rn, i.e. Kn Knᵀ of the normalised rows kn = r k, formed in f32.
template <bool kNorm>
__device__ __forceinline__ void gate_to_m(float (&R)[32], const PrepSmem& sm, int L) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i0 = 16 * warp + (lane >> 2);
  const float gi[2] = {sm.gam[i0], sm.gam[i0 + 8]};
  float bi[2] = {sm.bet[i0], sm.bet[i0 + 8]};
  if constexpr (kNorm) bi[0] *= sm.rn[i0], bi[1] *= sm.rn[i0 + 8];
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    const bool lower = 8 * jb <= 16 * warp + 15;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hh = e >> 1, i = i0 + 8 * hh, j = 8 * jb + 2 * (lane & 3) + (e & 1);
      float& r = R[4 * jb + e];
      const float rj = kNorm ? r * sm.rn[j] : r;
      r = (lower && j < i && i < L) ? bi[hh] * rj * __expf(gi[hh] - sm.gam[j]) : 0.f;
    }
  }
#pragma unroll
  for (int jb = 0; jb < 8; ++jb)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      *reinterpret_cast<float2*>(sm.MX + (i0 + 8 * hh) * kLdF + 8 * jb + 2 * (lane & 3)) =
          make_float2(R[4 * jb + 2 * hh], R[4 * jb + 2 * hh + 1]);
}

// One 64-column tile of w (B = a K panel) or u (a V panel): acc = (X diag(f))_{bf16} B with the register A
// fragments a and the panel at s_b read as the MN-major B operand, then columns c0.. of dst (< D) stored, staged
// through the warp's block stg for a lean dst and a whole tile; keep: fragments still needed by later tiles. One tile in flight per block (the SM's other
// blocks fill the wait): a second accumulator tile in flight made ptxas inject a wait at the loop head (C7517).
__device__ __forceinline__ void wu_tile(FragA (&a)[4], FragA (&keep)[4], uint32_t s_b, const GdnTensor& dst, bool staged,
                                        const ChunkPos& c, int64_t hv, int L, int64_t c0, int64_t D, Bf16* stg) {
  float acc[32];
  wg::reg_fence(acc);
  wg::wg_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) mma_rs_mn64(acc, a[ks].x, panel_desc_mn(s_b, ks), ks > 0);
  wg::wg_commit();
  wg::wg_wait<0>();
  wg::reg_fence(acc);
  keep_frags(a), keep_frags(keep);
  if (staged && c0 + 64 <= D) store_tile_staged(acc, dst, c, hv, L, c0, stg);
  else store_tile(acc, dst, c, hv, L, c0, D);
}

// From M in MX (gated, complete: the caller synchronised) to X = (I + M)⁻¹ in place, A stored when present, and the
// warp's register A fragments of X diag(fw) (w) and X diag(fu) (u). kTree: invert_tree, else invert_in_place.
template <bool kTree>
__device__ __forceinline__ void invert_and_fragments(const GdnFwdParams& p, const PrepSmem& sm, const ChunkPos& c,
                                                     int64_t hv, int L, int BT, FragA (&aw)[4], FragA (&au)[4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if constexpr (kTree) invert_tree(sm.MX, sm.Yf, warp, lane);
  else invert_in_place(sm.MX, sm.Yf, warp, lane);
  if (p.A.present()) store_chunk_mat<Bf16, kThreads>(p.A, c, hv, L, BT, sm.MX);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    aw[ks] = frag_a_scaled<Bf16>(sm.MX, 16 * warp, 16 * ks, sm.fw);
    au[ks] = frag_a_scaled<Bf16>(sm.MX, 16 * warp, 16 * ks, sm.fu);
  }
}

// prep_wgmma, PrepForm::kChunk: one block per (chunk, value head). kNk: K's 64-column panels (1 or 2; a compile-time
// count keeps ptxas from splitting the K Kᵀ chain with injected warpgroup arrives, session 12).
// kNorm (session 13, w, u only): GdnFwdParams::qk_norm, the raw k rows normalised in f32 (k_row_norms, gate_to_m).
template <bool kWithP, int kNk, bool kTree, bool kNorm = false>
__global__ void __launch_bounds__(kThreads, 4) prep_wgmma(const GdnFwdParams p, const GdnFwdHead hd) {
  static_assert(!(kWithP && kNorm), "qk_norm: w, u only");
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs sm_90a (the host entry launches this kernel only on sm_90 devices of an sm_90a build)
#else
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t HV = p.shape.HV, K = p.shape.K, V = p.shape.V;
  const PrepLayout ly = prep_layout(K, V, kTree);
  const int64_t hv = static_cast<int64_t>(blockIdx.x) % HV, h = hv / p.shape.G;
  const ChunkPos c = locate_chunk(p.chunks, static_cast<int64_t>(blockIdx.x) / HV);
  if (!c.valid) return;
  const int L = static_cast<int>(c.e - c.s), BT = static_cast<int>(p.shape.BT);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const PrepSmem sm(smem, ly);

  // (Session 15) load_panels, not load_panels_fixed's fixed-slot lean loads (session 12): the same shared-memory
  // contents, so the same bits, and faster here. GPU run s15run1 (H200, bf16 H = 16 HV = 32 K = V = 128, chunk-tree,
  // median of 15 interleaved, B = 4 T = 8192 / B = 1 T = 32768): w, u 0.444 -> 0.424 / 0.444 -> 0.422 ms, with the
  // folded l2norm 0.467 -> 0.451 / 0.465 -> 0.452 ms (the K Kᵀ step count from the run-time panel count, the session-11
  // kernel's other difference, measured no faster: 0.445 / 0.472 ms). The persistent form keeps load_panels_fixed.
  load_panels(sm.Kp, p.k, c, h, L, K, ly.nk);
  if constexpr (kWithP) load_panels(sm.Qp, p.q, c, h, L, K, ly.nk);
  cuda::cp_async_commit();
  load_panels(sm.Vs, p.v, c, hv, L, V, ly.nv);
  cuda::cp_async_commit();
  row_factors(p, hd.g_in, c, hv, L, sm.gam, sm.bet, sm.fw, sm.fu);
  cuda::cp_async_wait<1>();  // K (and Q) complete; V may be in flight
  wg::fence_proxy_async();  // the panels visible to the wgmma (async proxy)
  __syncthreads();

  // wgmma 1: R = K Kᵀ; wgmma 2: Q Kᵀ.
  const int ksteps = 4 * kNk;
  float R[32];
  float P[kWithP ? 32 : 1];
  wg::reg_fence(R);
  if constexpr (kWithP) wg::reg_fence(P);
  wg::wg_fence();
  mma_kt(R, sm.s_k, sm.s_k, ksteps);
  wg::wg_commit();
  if constexpr (kWithP) {
    mma_kt(P, sm.s_q, sm.s_k, ksteps);
    wg::wg_commit();
  }
  if constexpr (kNorm) k_row_norms<kNk>(p, sm, c, h, hv, L);  // published by the V barrier below
  wg::wg_wait<0>();
  wg::reg_fence(R);
  if constexpr (kWithP) wg::reg_fence(P);
  cuda::cp_async_wait<0>();  // V
  wg::fence_proxy_async();  // V read by the u wgmma as loaded
  __syncthreads();  // V visible; every warp's wgmma 1 / 2 done: Q panels are free once read here
  if constexpr (kWithP) {
    // P[i][j] = (q_i·k_j) e^{γ_i − γ_j} for j <= i < L, else 0, rounded to bf16, rows < L and columns < BT of
    // Pqk[hv]: staged through Q's panels (free now, M's next) when Pqk is lean and BT = 64, else pair stores.
    // (The right blocks jb > 2 warp + 1 are 0 without exponentials, as the gating of M.)
    const int i0 = 16 * warp + (lane >> 2);
    const float gi[2] = {sm.gam[i0], sm.gam[i0 + 8]};
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) {
      const bool lower = 8 * jb <= 16 * warp + 15;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + 8 * (e >> 1), j = 8 * jb + 2 * (lane & 3) + (e & 1);
        P[4 * jb + e] = (lower && j <= i) ? P[4 * jb + e] * __expf(gi[e >> 1] - sm.gam[j]) : 0.f;
      }
    }
    if (BT == kRows && lean_tensor<Bf16>(p.Pqk) && ly.nk * kPanelB >= 4 * 16 * kLdStage * 2) {  // K > 64: room
      store_tile_staged(P, p.Pqk, c, hv, L, 0, sm.Qp + warp * 16 * kLdStage);
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

  gate_to_m<kNorm>(R, sm, L);
  __syncthreads();  // M complete
  FragA aw[4], au[4];
  invert_and_fragments<kTree>(p, sm, c, hv, L, BT, aw, au);
  // The f32 tile is dead once every warp has its fragments; each warp stages its tiles' rows there.
  Bf16* stg = reinterpret_cast<Bf16*>(sm.MX) + warp * 16 * kLdStage;
  const bool w_staged = lean_tensor<Bf16>(p.w), u_staged = lean_tensor<Bf16>(p.u);
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < kNk + ly.nv; ++t) {
    if (t < kNk) wu_tile(aw, au, sm.s_k + t * kPanelB, p.w, w_staged, c, hv, L, 64 * t, K, stg);
    else wu_tile(au, aw, sm.s_v + (t - kNk) * kPanelB, p.u, u_staged, c, hv, L, 64 * (t - kNk), V, stg);
  }
#endif
}

// (Session 12) prep_wgmma_persist, PrepForm::kPersistent: w, u (and A) without Pqk by resident blocks (as many as
// fit on the device, each 4 per SM) that walk the units (chunk, q/k head h) u = blockIdx.x, + gridDim.x, ... and
// within a unit its G value heads hv = G h + g one after the other, with the next item's loads in flight while
// the current one computes:
//   * K is loaded once per unit (the G heads of a q/k head share it: G = 2 halves the K reads) and the next unit's
//     K is requested as soon as the current item's w tiles are done (K is dead then), during its u tiles;
//   * the next item's V is requested once its u tiles are done (V dead) and waited for only before the next
//     item's u tiles, so it arrives during K Kᵀ, the gating and the inverse;
//   * the next item's γ / β (row_load) are requested after the w tiles and formed (row_put) after the u tiles.
// The chunk form (prep_wgmma) instead waits for its loads at the start of every block: the block's chain starts
// with a full memory round trip. Every item runs the chunk form's products in the same order: the same bits.
// cp.async groups: exactly two a item, committed in the order K (empty within a unit) then V, so that
// wait<1> at an item's start means "K here" and wait<0> before the u tiles "V here".
template <int kNk, bool kTree>
__global__ void __launch_bounds__(kThreads, 4) prep_wgmma_persist(const GdnFwdParams p, const GdnFwdHead hd,
                                                                  int units) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  extern __shared__ __align__(128) unsigned char smem[];
  const int H = static_cast<int>(p.shape.H), G = static_cast<int>(p.shape.G);
  const int64_t K = p.shape.K, V = p.shape.V;
  const PrepLayout ly = prep_layout(K, V, kTree);
  const int BT = static_cast<int>(p.shape.BT), warp = threadIdx.x >> 5;
  const PrepSmem sm(smem, ly);
  Bf16* stg = reinterpret_cast<Bf16*>(sm.MX) + warp * 16 * kLdStage;
  const bool w_staged = lean_tensor<Bf16>(p.w), u_staged = lean_tensor<Bf16>(p.u);
  const bool k_lean = lean_tensor<Bf16>(p.k) && K == 64 * kNk, v_lean = lean_tensor<Bf16>(p.v) && V == 128;
  int u = static_cast<int>(blockIdx.x);
  if (u >= units) return;
  ChunkPos c = locate_chunk(p.chunks, u / H);
  if (!c.valid) return;
  int g = 0;
  {
    const int L = static_cast<int>(c.e - c.s);
    load_panels_fixed<kNk>(sm.Kp, p.k, k_lean, c, u % H, L, K, ly.nk);
    cuda::cp_async_commit();
    load_panels_fixed<2>(sm.Vs, p.v, v_lean, c, (u % H) * G, L, V, ly.nv);
    cuda::cp_async_commit();
    row_factors(p, hd.g_in, c, (u % H) * G, L, sm.gam, sm.bet, sm.fw, sm.fu);
  }
  for (;;) {
    const int64_t hv = static_cast<int64_t>(u % H) * G + g;
    const int L = static_cast<int>(c.e - c.s);
    cuda::cp_async_wait<1>();  // K complete; V may be in flight
    wg::fence_proxy_async();
    __syncthreads();  // K and the row factors visible; the previous item's reads of MX done
    float R[32];
    wg::reg_fence(R);
    wg::wg_fence();
    mma_kt(R, sm.s_k, sm.s_k, 4 * kNk);
    wg::wg_commit();
    wg::wg_wait<0>();
    wg::reg_fence(R);
    gate_to_m<false>(R, sm, L);
    __syncthreads();  // M complete
    FragA aw[4], au[4];
    invert_and_fragments<kTree>(p, sm, c, hv, L, BT, aw, au);
    cuda::cp_async_wait<0>();  // V
    wg::fence_proxy_async();
    __syncthreads();  // V visible; every warp has its fragments (MX is staging from here)
#pragma unroll
    for (int t = 0; t < kNk; ++t) wu_tile(aw, au, sm.s_k + t * kPanelB, p.w, w_staged, c, hv, L, 64 * t, K, stg);
    __syncthreads();  // every warp's w products done: K is free
    // The next item: the next head of this unit (same K), or the first head of the next unit. Its chunk is located
    // here for the K request and again after the u tiles (cheaper than holding it through them: registers).
    const bool same_k = g + 1 < G;
    const int nu = same_k ? u : u + static_cast<int>(gridDim.x), ng = same_k ? g + 1 : 0;
    const int64_t nhv = static_cast<int64_t>(nu % H) * G + ng;
    RowIn ri;
    {
      const ChunkPos nc = nu < units ? locate_chunk(p.chunks, nu / H) : ChunkPos{};
      const int nL = static_cast<int>(nc.e - nc.s);
      if (!same_k && nc.valid) load_panels_fixed<kNk>(sm.Kp, p.k, k_lean, nc, nu % H, nL, K, ly.nk);
      if (nc.valid) ri = row_load(p, hd.g_in, nc, nhv, nL);
    }
    cuda::cp_async_commit();
#pragma unroll 1
    for (int t = 0; t < ly.nv; ++t) wu_tile(au, au, sm.s_v + t * kPanelB, p.u, u_staged, c, hv, L, 64 * t, V, stg);
    __syncthreads();  // every warp's u products and staging reads done: V and MX are free
    if (nu >= units) break;
    const ChunkPos nc = locate_chunk(p.chunks, nu / H);
    if (!nc.valid) break;
    const int nL = static_cast<int>(nc.e - nc.s);
    load_panels_fixed<2>(sm.Vs, p.v, v_lean, nc, nhv, nL, V, ly.nv);
    cuda::cp_async_commit();
    row_put(p, hd.g_in, nc, nhv, nL, ri, sm.gam, sm.bet, sm.fw, sm.fu);
    u = nu, g = ng, c = nc;
  }
#endif
}

template <bool kWithP>
int launch_prep(const GdnFwdParams& p, const GdnFwdHead& hd, bool tree, cudaStream_t stream) {
  const int64_t blocks = chunk_slots(p.chunks) * p.shape.HV;
  const size_t smem = static_cast<size_t>(prep_layout(p.shape.K, p.shape.V, tree).total);
  auto kernel = p.shape.K > 64 ? (tree ? prep_wgmma<kWithP, 2, true> : prep_wgmma<kWithP, 2, false>)
                                : (tree ? prep_wgmma<kWithP, 1, true> : prep_wgmma<kWithP, 1, false>);
  if constexpr (!kWithP)
    if (p.qk_norm)  // (session 13) the chunk-tree form only (fwd_cuda_prep_head checks the form)
      kernel = p.shape.K > 64 ? prep_wgmma<false, 2, true, true> : prep_wgmma<false, 1, true, true>;
  return launch_n(kernel, "prepare_wy_repr_fwd (prep_wgmma)", blocks, kThreads, smem, stream, p, hd);
}

// Resident blocks: as many as fit (the occupancy query with the kernel's shared memory; 4 per SM at K = V = 128),
// at most one per unit, at most max_blocks when > 0 (tests: many units per block).
int launch_prep_persist(const GdnFwdParams& p, const GdnFwdHead& hd, bool tree, int max_blocks, cudaStream_t stream) {
  const int64_t units = chunk_slots(p.chunks) * p.shape.H;
  if (units > 0x7fffffffLL - 0x100000LL) return launch_prep<false>(p, hd, tree, stream);  // 32-bit unit indices
  const int smem = prep_layout(p.shape.K, p.shape.V, tree).total;
  auto kernel = p.shape.K > 64 ? (tree ? prep_wgmma_persist<2, true> : prep_wgmma_persist<2, false>)
                                : (tree ? prep_wgmma_persist<1, true> : prep_wgmma_persist<1, false>);
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  STRATA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  int64_t blocks = static_cast<int64_t>(per_sm > 0 ? per_sm : 1) * cuda::current_sm_count();
  if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
  if (blocks > units) blocks = units;
  return launch_n(kernel, "prepare_wy_repr_fwd (prep_wgmma_persist)", blocks, kThreads,
                  static_cast<size_t>(smem), stream, p, hd, static_cast<int>(units));
}


}  // namespace

std::string fwd_cuda_prep_reject(const GdnFwdParams& p) {
  // k, v (product operands) one 16-bit dtype, w, u (and A when present) too; K, V <= 256; BT <= 64.
  std::string r = fwd_cuda_mma_reject(FwdOp::kPrepareWY, p);
  if (!r.empty()) return r;
  if (!p.k.present() || !p.v.present() || !p.w.present() || !p.u.present())
    return "the pre-state kernel reads k, v and writes w, u (one of them is absent)";
  if (p.k.dtype != STRATA_DTYPE_BF16) return "the pre-state kernel (warpgroup MMA) takes bf16 token tensors";
  if (p.shape.H < 1 || p.shape.G < 1 || p.shape.H * p.shape.G != p.shape.HV) return "HV must be a multiple G of H";
  if (p.shape.K > kKF) return fmt::format("the pre-state kernel needs K <= {}", kKF);
  if (p.Pqk.present()) {
    if (!p.q.present() || p.q.dtype != p.k.dtype) return "the gated Q Kᵀ (Pqk) needs q in the dtype of k";
    if (p.Pqk.dtype != p.k.dtype) return "the gated Q Kᵀ (Pqk) is stored in the dtype of q, k";
  }
  if (p.qk_norm) {
    if (p.Pqk.present() || p.A.present()) return "the folded l2norm (qk_norm) forms w, u only (no Pqk, no A)";
    if (!(p.qk_norm_eps > 0.f)) return "the folded l2norm (qk_norm) needs eps > 0";
    if (p.rk.present() && p.rk.dtype != STRATA_DTYPE_F32) return "the folded l2norm writes rk in f32";
  }
  const size_t smem = static_cast<size_t>(prep_layout(p.shape.K, p.shape.V, true).total);  // the larger layout
  if (smem > kPrepMaxSmem)
    return fmt::format("the pre-state kernel needs {} bytes of shared memory per block, more than {}", smem,
                       kPrepMaxSmem);
  return {};
}

int fwd_cuda_prep(const GdnFwdParams& p, void* stream_ptr) { return fwd_cuda_prep_head(p, GdnFwdHead{}, stream_ptr); }

std::string fwd_cuda_prep_head_reject(const GdnFwdParams& p, const GdnFwdHead& hd) {
  std::string r = fwd_cuda_prep_reject(p);
  if (r.empty() && hd.g_in.present() && (!p.g.present() || p.g.dtype != STRATA_DTYPE_F32))
    r = "the folded gate cumsum writes γ into an f32 g";
  return r;
}

int fwd_cuda_prep_head(const GdnFwdParams& p, const GdnFwdHead& hd, void* stream_ptr) {
  return fwd_cuda_prep_head(p, hd, PrepForm::kAuto, stream_ptr);
}

int fwd_cuda_prep_head(const GdnFwdParams& p, const GdnFwdHead& hd, PrepForm form, void* stream_ptr, int max_blocks) {
  const std::string why = fwd_cuda_prep_head_reject(p, hd);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_fwd (prep_wgmma): {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  // kAuto: the chunk form with the tree inverse (s12run1: the tree inverse 3 % faster for w, u in the persistent form;
  // the persistent form itself not faster than the chunk form).
  const bool tree = form == PrepForm::kAuto || form == PrepForm::kChunkTree || form == PrepForm::kPersistentTree;
  if (p.qk_norm && form != PrepForm::kAuto && form != PrepForm::kChunkTree)
    return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_fwd (prep_wgmma): the folded l2norm runs the chunk-tree form");
  if (p.Pqk.present()) return launch_prep<true>(p, hd, tree, stream);
  if (form == PrepForm::kPersistent || form == PrepForm::kPersistentTree)
    return launch_prep_persist(p, hd, tree, max_blocks, stream);
  return launch_prep<false>(p, hd, tree, stream);
}

}  // namespace strata::linear_attn::gdn
