// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) primitives shared by the kernels that use it: the m64nNk16
// bf16 products with f32 accumulators (A and B from shared-memory descriptors, or A from registers), the
// fence / commit / wait of the async groups, register fences that keep the compiler from touching accumulators
// while a group is in flight, the generic-to-async proxy fence, warpgroup named barriers, and the transposing
// ldmatrix / stmatrix used to form K-major operands. Descriptors and shared layouts: wgmma_layout.h.
//
// Each specialisation is one PTX string (inline asm cannot build its register list from a template
// parameter); add the N a kernel needs next to the others. Every function is warpgroup-collective unless said.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tile/cuda/mma.cuh"
#include "tile/cuda/wgmma_layout.h"

namespace strata::cuda::wgmma {

// d (m64 x N f32 accumulator, N / 2 registers a thread) (+)= A B with A and B in shared memory (descriptors) or
// A in registers (the m16n8k16 A fragment of the warp's 16 rows, 4 registers); acc = 0 overwrites d.
template <class T, int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, int acc);
template <class T, int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int acc);

// (wgmma needs sm_90a: compile the kernels that use these only for it, e.g. under __CUDA_ARCH_FEAT_SM90_ALL.)
template <> __device__ __forceinline__ void mma_ss<__nv_bfloat16, 16>(float (&d)[8], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(acc));
}

template <> __device__ __forceinline__ void mma_rs<__nv_bfloat16, 16>(float (&d)[8], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

template <> __device__ __forceinline__ void mma_ss<__nv_bfloat16, 32>(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}

template <> __device__ __forceinline__ void mma_rs<__nv_bfloat16, 32>(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

template <> __device__ __forceinline__ void mma_ss<__nv_bfloat16, 64>(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}

template <> __device__ __forceinline__ void mma_rs<__nv_bfloat16, 64>(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads / writes of accumulator registers across a wgmma fence / wait (the
// hardware writes them asynchronously between mma_async and wait_group).
template <int n>
__device__ __forceinline__ void reg_fence(float (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int a, int b>
__device__ __forceinline__ void reg_fence_u(uint32_t (&r)[a][b]) {
#pragma unroll
  for (int i = 0; i < a; ++i)
#pragma unroll
    for (int j = 0; j < b; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
template <int a, int b, int c>
__device__ __forceinline__ void reg_fence_u(uint32_t (&r)[a][b][c]) {
#pragma unroll
  for (int i = 0; i < a; ++i) reg_fence_u(r[i]);
}
// Generic-proxy writes to shared memory (st / stmatrix / cp.async) made visible to the async proxy (wgmma);
// each writing thread fences, then the threads synchronise.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Barrier of the 128 threads of one warpgroup (named barrier `id` >= 1; 0 is __syncthreads).
__device__ __forceinline__ void bar_wg(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
// Named barrier `id` over `threads` threads (a multiple of 32): e.g. producer and consumer warpgroups meeting.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the producer side of bar_sync).
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// m64n128k16 (session 9: the output warpgroup of the split GDN state pass, 128 columns of o / S per block;
// chunk_bwd_dqkwg's wgmma kernel, 128-column dq / dk / dw blocks of one warpgroup).
template <> __device__ __forceinline__ void mma_ss<__nv_bfloat16, 128>(float (&d)[64], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}

template <> __device__ __forceinline__ void mma_rs<__nv_bfloat16, 128>(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

// Warpgroup register reallocation (sm_90a; session 9): a warp-specialised kernel moves registers from the
// warpgroups that need few to those that need many. The per-thread counts are multiples of 8 in [24, 256], the
// sum over the block must not exceed what it was launched with; all warps of a warpgroup execute the same one.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- accumulator and tile transposes through stmatrix.trans (chunk_bwd_dqkwg's wgmma kernel) ----
// stmatrix.x4.trans of an m64nN accumulator d (rounded to bf16; warp rows rb..rb+15, rb = the accumulator's row
// origin inside X's column range + 16 w) into the transposed K-major tile X [col][row] (tile_off<kRowsLd>) at
// shared byte address x (st_trans_off's layout; N / 16 stores a warp).
template <int kRowsLd, int N>
__device__ __forceinline__ void stmatrix_acc_trans(uint32_t x, int rb, int lane, const float (&d)[N / 2]) {
#pragma unroll
  for (int jp = 0; jp < N / 16; ++jp) {
    const uint32_t a = x + 2u * static_cast<uint32_t>(st_trans_off<kRowsLd>(lane, rb, jp));
    const int j0 = 2 * jp, j1 = 2 * jp + 1;
    stmatrix_x4_trans(a, mma::pack2<__nv_bfloat16>(d[4 * j0], d[4 * j0 + 1]),
                      mma::pack2<__nv_bfloat16>(d[4 * j0 + 2], d[4 * j0 + 3]),
                      mma::pack2<__nv_bfloat16>(d[4 * j1], d[4 * j1 + 1]),
                      mma::pack2<__nv_bfloat16>(d[4 * j1 + 2], d[4 * j1 + 3]));
  }
}
// Y [kRows][kCols] (tile_off<kCols>, generic pointer src) → Yᵀ [kCols][kRows] (tile_off<kRows>, shared byte
// address dst) by kWarps warps (this one: warp): the 8 x 8 blocks four at a time (ldmatrix.x4, then
// stmatrix.x4.trans; lane 8 i + r addresses row r of block i in both).
template <int kRows, int kCols, int kWarps>
__device__ __forceinline__ void transpose_tile(int warp, const unsigned char* src, uint32_t dst) {
  constexpr int kBlocks = (kRows / 8) * (kCols / 8);
  static_assert(kBlocks % (4 * kWarps) == 0, "whole x4 groups per warp");
  const int lane = threadIdx.x & 31, r = lane & 7;
#pragma unroll
  for (int it = 0; it < kBlocks / (4 * kWarps); ++it) {
    const int b = (warp * (kBlocks / (4 * kWarps)) + it) * 4 + (lane >> 3), tb = b / (kCols / 8),
              xb = b % (kCols / 8);
    uint32_t v[4];
    mma::ldmatrix_x4(v, src + 2 * tile_off<kCols>(8 * tb + r, 8 * xb));
    stmatrix_x4_trans(dst + 2u * static_cast<uint32_t>(tile_off<kRows>(8 * xb + r, 8 * tb)), v[0], v[1], v[2], v[3]);
  }
}

// ---- session 11 (the GDN forward's state pass): staging an accumulator row-major for 16-byte global stores ----
// stmatrix.x4 (not transposed): lane 8 i + r addresses row r of 8 x 8 block i; register i holds the lane's pair of
// block i in the mma accumulator layout (row lane / 4, columns 2 (lane % 4), + 1).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2),
               "r"(r3)
               : "memory");
}

// ---- session 12 (chunk_bwd_dqkwg's copy-engine form): 128-byte-swizzled K-major operands ----
// A [kRows][kCols] tile (16-bit, K = the column) stored as kCols / 64 column blocks [kRows][64] one after another,
// each the layout a SWIZZLE_128B copy-engine box of 64 columns writes (tma_tile.cuh's encode_sw128_map): rows of
// 128 bytes, 16-byte chunk c of row r at chunk c ^ (r % 8), 8-row atoms of 1024 bytes (the tile 1024-byte
// aligned). Descriptor advanced to the 16-column K step ks: column block ks / 4, start + 32 (ks % 4) bytes inside
// the atom (the swizzle is applied by the hardware to the address bits, as for the copy engine), SBO = 1024 bytes
// (the next 8 rows), LBO unused (encoded 1), layout type 1 (128-byte swizzle) in bits 62-63.
template <int kRows>
STRATA_HD constexpr uint64_t sw128_desc(uint32_t base, int ks) {
  return make_desc(base + static_cast<uint32_t>(ks >> 2) * (kRows * 128u) + static_cast<uint32_t>(ks & 3) * 32u, 16u,
                   1024u) |
         (uint64_t{1} << 62);
}
// Byte offset of the 16-byte segment (row r, columns 8 cs..8 cs + 7) in such a tile.
template <int kRows>
STRATA_HD constexpr uint32_t sw128_seg(int r, int cs) {
  return static_cast<uint32_t>((cs >> 3) * (kRows * 128) + r * 128 + (((cs & 7) ^ (r & 7)) << 4));
}

}  // namespace strata::cuda::wgmma
