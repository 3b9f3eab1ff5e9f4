// The chunk_loss driver: the loops of both strategies (chunk_loss.h), written once over a backend that does
// the GEMMs and the epilogues (cpu.cpp: oneDNN + Highway; cuda_sm90.cu: cuBLAS + CUDA kernels). Host code
// (C++17: nvcc compiles it too).
//
// Backend interface (BE):
//   struct Mat { const void* p; int32_t dt; int64_t ld; };                 a row-major GEMM operand
//   Mat hidden_block(r0, rows)   hidden rows [r0, r0 + rows) as a GEMM operand (CPU: f32 copy of 16-bit rows)
//   Mat weight_block(v0, vn)     weight rows [v0, v0 + vn); stays valid across hidden_block calls
//   void gemm(ta, tb, M, N, K, Mat A, Mat B, beta, void* C, c_dt, ldc, alpha = 1)
//                                C = alpha op(A) op(B) + beta C, row-major
//   float dz_scale()             factor kept out of the stored dZ (multiplied back by the GEMMs' alpha)
//   strata_status count_targets()           counts valid rows (and rejects out-of-range targets)
//   void stats(Z, z_dt, ldz, rows, cols, r0, v0, first, last)   merges the tile's row statistics; on the
//                                          last vocabulary tile writes lse and the per-row loss
//   void grad(Z, z_dt, ldz, dZ, dz_dt, lddz, rows, cols, r0, v0)  dZ of the tile from the row lse (dZ may be
//                                          Z itself: each element is read before it is written)
//   void grad_async(same as grad), grad_wait()   (only with BackendTraits::overlap_stats) grad launched beside
//                                          the following GEMMs; grad_wait orders what follows after it
//   (Z is the logits tile in L.z_dtype: f32, or bf16 where BackendTraits::bf16_tile allows it)
//   void colsum(dZ, dz_dt, lddz, rows, cols, float* acc, acc_stride, first, scale)
//                                acc[j] (+)= scale * sum over rows, in row order
//   void convert(const float* src, ld_src, void* dst, dt, ld_dst, rows, cols)
//   void zero(void* dst, dt, ld, rows, cols)
//   void copy(void* dst, const void* src, bytes)   contiguous bytes, no overlap
//   strata_status finish_loss()            loss = sum_i loss_i (fixed order) * (1/#valid for mean)
//   strata_status status()                 first failure of the calls above (launch / library errors)
//   void gemm_batch2(ta, tb, M, N, K, A, sa, B, sb, beta, C, sc, c_dt, ldc, alpha)   (only with kGemmBatch2 =
//                                true) gemm twice, on A + i sa, B + i sb, C + i sc (elements, i = 0, 1), as one call
//
// Accumulation order is fixed by the loops: dW over token chunks (token_chunked) or token blocks
// (vocab_tiled) in increasing order, dH over vocabulary tiles in increasing order, db likewise. No atomics.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/loss/chunk_loss/chunk_loss.h"
#include "runtime/error.h"

namespace strata::loss {

// What every backend holds the same way: the call, its layout and workspace, the first failure of its calls,
// the number of valid rows (count_targets), and where lse is written (a forward: the caller's lse, else a
// workspace slot) and read back by the gradient (the same place, or lse_in in a backward-only call).
struct BackendBase {
  struct Mat {
    const void* p;
    int32_t dt;
    int64_t ld;
  };
  const ChunkLossParams& p;
  const ChunkLossLayout& L;
  char* ws;
  strata_status err = STRATA_SUCCESS;
  int64_t n_valid = 0;
  float* lse_w = nullptr;  // where the forward writes lse
  int64_t lse_w_stride = 1;
  const float* lse_r = nullptr;  // where the gradient reads it
  int64_t lse_r_stride = 1;

  BackendBase(const ChunkLossParams& p_, const ChunkLossLayout& L_, char* ws_) : p(p_), L(L_), ws(ws_) {
    if (p.backward_op) {
      lse_r = static_cast<const float*>(p.lse_in);
      lse_r_stride = p.lse_stride;
    } else {
      lse_w = p.lse ? static_cast<float*>(p.lse) : reinterpret_cast<float*>(ws + L.lse);
      lse_w_stride = p.lse ? p.lse_stride : 1;
      lse_r = lse_w;
      lse_r_stride = lse_w_stride;
    }
  }
  static constexpr bool kGemmBatch2 = false;  // a backend with gemm_batch2 sets it (CUDA)
  strata_status status() const { return err; }
  void note(strata_status s) {
    if (err == STRATA_SUCCESS) err = s;
  }
};

// Where one vocab_tiled call keeps what (driver below; README.md "Strategy heuristic" 3): the f32 dH accumulator in
// dweight's tail and dhidden's storage, and the logits tiles kept from the forward. A function of the call's
// parameters, layout and pointers only (host code), so tests can check it at any shape without a device.
struct VtMemory {
  int64_t dw_stop = 0;     // first dweight row of the accumulator's tail (V without one): later tiles are deferred
  int64_t free_bytes = 0;  // bytes of dweight before the accumulator (all of it without one; 0: nothing kept)
  float* dh_in_dw = nullptr;  // L.dh_in_dw: the accumulator's tail rows in dweight
  int64_t h_lo = 0;        // split accumulator: rows in dhidden's storage (0: none)
  int64_t stage_r0 = 0;    // the first row of the f32 rows in dhidden's storage; the tail holds the other rows
  bool dh_batch = false;   // the two halves' dH GEMMs as one strided batch
  int64_t n_keep = 0;      // logits tiles 0..n_keep-1 kept from the forward
  int64_t slot = 0;        // bytes per kept tile in dweight
  int64_t base1 = 0;       // keep_first_in_ws: byte offset of kept tile 1 in dweight
  char* dw_base = nullptr;
  char* fwd_scratch = nullptr;  // keep_first_in_ws: the forward's tiles that are not kept go here (dhidden)
  bool alternate = false;  // BackendTraits::overlap_stats: they alternate between the workspace tile and dweight
  // The logits tile ti in the backward (kept, or Z: the workspace tile, recomputed there) ...
  void* tile(int64_t ti, void* Z) const {
    if (fwd_scratch) return ti > 0 && ti < n_keep ? static_cast<void*>(dw_base + base1 + (ti - 1) * slot) : Z;
    return ti < n_keep ? static_cast<void*>(dw_base + (ti + 1) * slot) : Z;
  }
  // ... and where the forward computes it.
  void* fwd(int64_t ti, void* Z) const {
    if (ti >= n_keep && fwd_scratch) return fwd_scratch;
    if (ti >= n_keep && n_keep > 0 && alternate && (ti - n_keep) % 2 == 1) return dw_base;
    return tile(ti, Z);
  }
};

inline VtMemory vt_memory(const ChunkLossParams& p, const ChunkLossLayout& L, const BackendTraits& tr,
                          bool gemm_batch2) {
  VtMemory m;
  const int64_t N = p.N, D = p.D, V = p.V, Nb = p.rows, vt = p.vtile;
  const int64_t n_tiles = (V + vt - 1) / vt;
  const int64_t z_es = static_cast<int64_t>(dtype_size(L.z_dtype));
  const int64_t dw_es = p.dweight ? static_cast<int64_t>(dtype_size(p.dw_dtype)) : 0;
  char* const dw_base = static_cast<char*>(p.dweight);
  m.dw_base = dw_base;
  m.dw_stop = V;
  // L.dh_in_dw: the f32 dH accumulator is the last N D 4 bytes of (contiguous) dweight, its address rounded
  // down to 256 bytes; vocabulary tiles reaching its first row dw_stop are deferred (their dW is stored
  // after dH is complete).
  // Split accumulator (with L.dh_in_dw): its rows [0, h_lo) live in dhidden's own storage instead (a 16-bit
  // dhidden holds h_lo <= N es / 4 f32 rows; contiguous, 16-byte aligned, one token block), rows [h_lo, N) in
  // dweight's tail. Halving the tail halves the deferred tiles and frees room for one more kept tile (at the
  // H200 shape, bf16 dweight: 3 deferred instead of 5 and 17 kept instead of 16; f32 dweight: 2 and 36 instead
  // of 3 and 35). The end converts rows [0, h_lo) into the logits tile buffer first (free by then: it must hold
  // h_lo D es bytes), then rows [h_lo, N) into dhidden, then copies the staged rows in.
  int64_t& h_lo = m.h_lo;
  if (L.dh_in_dw && p.dhidden && p.ld_dh == D && Nb >= N && reinterpret_cast<uintptr_t>(p.dhidden) % 16 == 0) {
    const int64_t dh_es = static_cast<int64_t>(dtype_size(p.dh_dtype));
    const int64_t stage_rows = (Nb * vt * z_es) / std::max<int64_t>(D * dh_es, 1);  // rows the tile buffer holds
    h_lo = std::min((N * dh_es) / 4, stage_rows);
    if (h_lo >= N) h_lo = 0;  // (not reached for 16-bit dhidden: h_lo <= N / 2)
  }
  if (L.dw_direct && p.ld_dw == D) m.free_bytes = V * D * dw_es;
  if (L.dh_in_dw) {
    const int64_t row_bytes = D * dw_es;
    const uintptr_t base = reinterpret_cast<uintptr_t>(dw_base);
    const uintptr_t acc = (base + static_cast<uintptr_t>(V * row_bytes - (N - h_lo) * D * 4)) / 256 * 256;
    m.dh_in_dw = reinterpret_cast<float*>(acc);
    m.dw_stop = static_cast<int64_t>(acc - base) / row_bytes;
    m.free_bytes = static_cast<int64_t>(acc - base);
  }
  // Session 14, BackendTraits::dh_batch2 with equal halves (h_lo = N / 2): each tile's two dH GEMMs run as one
  // strided batch, whose strides must be positive: the half at the lower address takes rows [0, N / 2). So when
  // dweight's tail lies below dhidden, dhidden's storage holds rows [h_lo, N) (stage_r0 = h_lo) and the tail rows
  // [0, h_lo); otherwise (and without the batch) dhidden's storage holds rows [0, h_lo).
  if (gemm_batch2 && h_lo > 0 && 2 * h_lo == N && tr.dh_batch2) {
    m.dh_batch = true;
    if (reinterpret_cast<uintptr_t>(m.dh_in_dw) < reinterpret_cast<uintptr_t>(p.dhidden)) m.stage_r0 = h_lo;
  }
  // Logits tiles kept from the forward (one token block, contiguous dweight, 16-byte aligned): dweight holds
  // no dW yet during the forward, so tile s is stored at byte (s + 1) * slot of dweight, slot = the larger of
  // a logits tile and a dW tile (256-byte aligned), for s < n_keep (ending before the accumulator). The
  // backward then skips their recompute; dZ overwrites a kept tile in place (or goes to the workspace's f16
  // dZ). Safe: dW tile t (bytes [t wt, (t + 1) wt)) is written at step t and ends at (t + 1) wt <=
  // (t + 1) slot, where kept tile t starts, so it only overlaps kept tiles s < t, consumed already; no kept
  // tile reaches a deferred tile's rows or the accumulator.
  //
  // Session 15, BackendTraits::keep_first_in_ws (CUDA default): when not every tile fits in dweight and dhidden's
  // own storage can hold a logits tile (contiguous, 16-byte aligned, N D es_dh >= N vt z_es: D >= vt with bf16),
  // tile 0 stays in the workspace tile from the forward to the backward, which takes it first: one logits GEMM fewer.
  // The forward's tiles that are not kept then go to dhidden's storage, which nothing reads or writes before the
  // backward's first dH GEMM. Kept tile s >= 1 lives at byte base1 + (s - 1) slot of dweight, base1 = the larger of
  // slot and 2 wt (256-byte aligned): dW tile t ends at (t + 1) wt <= base1 + (t - 1) slot, where kept tile t starts,
  // for every t >= 1 (slot >= wt), so again it only overlaps kept tiles already consumed. At the H200 shape (bf16
  // dweight, zt = 2 wt = slot) that is byte s slot: tiles 1..17 in dweight and tile 0 in the workspace, 18 kept
  // instead of 17.
  const int64_t free_bytes = m.free_bytes;
  int64_t &n_keep = m.n_keep, &slot = m.slot;
  m.alternate = tr.overlap_stats;
  if (!p.backward_op && p.wants_grad() && free_bytes > 0 && Nb >= N &&
      reinterpret_cast<uintptr_t>(dw_base) % 16 == 0) {
    const int64_t zt = N * vt * z_es, wt = vt * D * dw_es;
    slot = (std::max(zt, wt) + 255) / 256 * 256;
    n_keep = std::min(n_tiles, std::max<int64_t>(0, free_bytes / slot - 1));
    const int64_t dh_es = p.dhidden ? static_cast<int64_t>(dtype_size(p.dh_dtype)) : 0;
    if (tr.keep_first_in_ws && !tr.overlap_stats && n_keep < n_tiles && p.dhidden &&
        p.ld_dh == D && N * D * dh_es >= zt && reinterpret_cast<uintptr_t>(p.dhidden) % 16 == 0) {
      m.base1 = (std::max(slot, 2 * wt) + 255) / 256 * 256;
      const int64_t in_dw = free_bytes >= m.base1 ? (free_bytes - m.base1) / slot : 0;  // tiles 1..in_dw in dweight
      n_keep = std::min(n_tiles, in_dw + 1);
      m.fwd_scratch = static_cast<char*>(p.dhidden);
    }
  }
  // The forward's tiles that are not kept: with BackendTraits::overlap_stats (CUDA: the statistics of tile t run
  // beside the GEMM of tile t + 1) they alternate between the workspace tile and dweight's first slot, free during
  // the forward (kept tile s is at (s + 1) slot), so that the GEMM does not overwrite the tile being read.
  // With fwd_scratch (keep_first_in_ws) they go to dhidden's storage instead, the workspace tile keeping tile 0.
  return m;
}

template <class BE>
strata_status chunk_loss_drive(const ChunkLossParams& p, const ChunkLossLayout& L, char* ws, BE& be) {
  using Mat = typename BE::Mat;
  const int64_t N = p.N, D = p.D, V = p.V;
  STRATA_RETURN_IF_ERROR(be.count_targets());

  const int32_t f32 = STRATA_DTYPE_F32;
  const int32_t z_dt = L.z_dtype;
  const int64_t z_es = static_cast<int64_t>(dtype_size(z_dt));
  char* Z = ws + L.z;
  auto z_at = [&](int64_t col0) { return static_cast<void*>(Z + col0 * z_es); };
  // dZ: in place over Z (f32, or the bf16 tile), or a separate 16-bit tile (CUDA, f16 inputs: tensor-core GEMMs).
  const bool sep = L.dz != L.z;
  const int32_t dz_dt = sep ? p.h_dtype : z_dt;
  void* dZ = sep ? static_cast<void*>(ws + L.dz) : static_cast<void*>(Z);
  const size_t dz_es = dtype_size(dz_dt);
  auto dz_mat = [&](int64_t col0, int64_t ld) {
    return Mat{static_cast<const char*>(dZ) + col0 * static_cast<int64_t>(dz_es), dz_dt, ld};
  };
  // dZ is stored divided by dzs and the GEMMs / column sums multiply it back (alpha): the CUDA f16 path keeps
  // the mean's 1/#valid out of the 16-bit dZ, which would otherwise fall into f16's subnormal range.
  const float dzs = be.dz_scale();
  float* db_acc = p.dbias ? (L.db_in_place ? static_cast<float*>(p.dbias) : reinterpret_cast<float*>(ws + L.db_acc))
                          : nullptr;
  const int64_t db_ld = L.db_in_place ? p.db_stride : 1;

  if (N == 0) {  // no token: zero gradients of the weights, loss 0
    if (p.dweight) be.zero(p.dweight, p.dw_dtype, p.ld_dw, V, D);
    if (p.dbias) be.zero(p.dbias, p.db_dtype, p.db_stride, V, 1);
    if (!p.backward_op) STRATA_RETURN_IF_ERROR(be.finish_loss());
    return be.status();
  }

  if (!p.backward_op && p.strategy == kStrategyTokenChunked) {
    const int64_t C = p.rows, vs = p.vtile;
    float* dw_acc = nullptr;
    int64_t dw_ld = D;
    if (p.dweight) {
      dw_acc = L.dw_in_place ? static_cast<float*>(p.dweight) : reinterpret_cast<float*>(ws + L.dw_acc);
      dw_ld = L.dw_in_place ? p.ld_dw : D;
    }
    for (int64_t r0 = 0; r0 < N; r0 += C) {
      const int64_t rows = std::min(C, N - r0);
      const Mat Hm = be.hidden_block(r0, rows);
      for (int64_t v0 = 0; v0 < V; v0 += vs) {
        const int64_t vn = std::min(vs, V - v0);
        be.gemm(false, true, rows, vn, D, Hm, be.weight_block(v0, vn), 0.f, z_at(v0), z_dt, V);
      }
      be.stats(Z, z_dt, V, rows, V, r0, 0, true, true);
      if (!p.wants_grad()) continue;
      be.grad(Z, z_dt, V, dZ, dz_dt, V, rows, V, r0, 0);
      if (p.dhidden) {
        // dH_c = dZ W (K = V): straight into dhidden when it is f32 (or the GEMM stores its dtype and one
        // call covers V), else through an f32 accumulator.
        char* dh_rows = static_cast<char*>(p.dhidden) + r0 * p.ld_dh * static_cast<int64_t>(dtype_size(p.dh_dtype));
        const bool direct = p.dh_dtype == f32 || (be.traits().gemm_stores_any && vs >= V);
        void* dst = direct ? static_cast<void*>(dh_rows) : static_cast<void*>(ws + L.dh_acc);
        const int32_t dst_dt = direct ? p.dh_dtype : f32;
        const int64_t dst_ld = direct ? p.ld_dh : D;
        for (int64_t v0 = 0; v0 < V; v0 += vs) {
          const int64_t vn = std::min(vs, V - v0);
          be.gemm(false, false, rows, D, vn, dz_mat(v0, V), be.weight_block(v0, vn), v0 > 0 ? 1.f : 0.f, dst,
                  dst_dt, dst_ld, dzs);
        }
        if (!direct) be.convert(reinterpret_cast<float*>(ws + L.dh_acc), D, dh_rows, p.dh_dtype, p.ld_dh, rows, D);
      }
      if (p.dweight)  // dW += dZ^T H_c, chunk order
        for (int64_t v0 = 0; v0 < V; v0 += vs) {
          const int64_t vn = std::min(vs, V - v0);
          be.gemm(true, false, vn, D, rows, dz_mat(v0, V), Hm, r0 > 0 ? 1.f : 0.f, dw_acc + v0 * dw_ld, f32, dw_ld,
                  dzs);
        }
      if (p.dbias) be.colsum(dZ, dz_dt, V, rows, V, db_acc, db_ld, r0 == 0, dzs);
    }
    if (p.dweight && !L.dw_in_place) be.convert(dw_acc, D, p.dweight, p.dw_dtype, p.ld_dw, V, D);
    if (p.dbias && !L.db_in_place) be.convert(db_acc, 1, p.dbias, p.db_dtype, p.db_stride, V, 1);
    STRATA_RETURN_IF_ERROR(be.finish_loss());
    return be.status();
  }

  const int64_t Nb = p.rows, vt = p.vtile;
  const int64_t dw_es = p.dweight ? static_cast<int64_t>(dtype_size(p.dw_dtype)) : 0;
  char* const dw_base = static_cast<char*>(p.dweight);
  auto dw_tile_of = [&](int64_t v0) { return static_cast<void*>(dw_base + v0 * p.ld_dw * dw_es); };

  // Where the vocab_tiled loop keeps what in dweight's and dhidden's storage (vt_memory above).
  const VtMemory M = vt_memory(p, L, be.traits(), BE::kGemmBatch2);
  const int64_t dw_stop = M.dw_stop, h_lo = M.h_lo, stage_r0 = M.stage_r0, n_keep = M.n_keep;
  const bool dh_batch = M.dh_batch;
  float* const dh_in_dw = M.dh_in_dw;
  const int64_t tail_r0 = stage_r0 == 0 ? h_lo : 0;
  auto tile_z = [&](int64_t ti) { return M.tile(ti, Z); };
  auto fwd_z = [&](int64_t ti) { return M.fwd(ti, Z); };
  auto dz_of = [&](void* d) { return Mat{d, dz_dt, vt}; };

  if (!p.backward_op) {  // vocab_tiled forward: online statistics over the vocabulary tiles
    for (int64_t b0 = 0; b0 < N; b0 += Nb) {
      const int64_t rows = std::min(Nb, N - b0);
      const Mat Hm = be.hidden_block(b0, rows);
      for (int64_t v0 = 0; v0 < V; v0 += vt) {
        const int64_t vn = std::min(vt, V - v0);
        void* Zt = fwd_z(v0 / vt);
        be.gemm(false, true, rows, vn, D, Hm, be.weight_block(v0, vn), 0.f, Zt, z_dt, vt);
        be.stats(Zt, z_dt, vt, rows, vn, b0, v0, v0 == 0, v0 + vn == V);
      }
    }
    if (!p.wants_grad()) {
      STRATA_RETURN_IF_ERROR(be.finish_loss());
      return be.status();
    }
  }

  // vocab_tiled backward: per vocabulary tile and token block, Z (kept, or recomputed), dZ from the row lse.
  float* dh_acc = nullptr;  // rows [tail_r0, tail_r0 + N - h_lo) (all rows without the split)
  float* const dh_lo = h_lo > 0 ? static_cast<float*>(p.dhidden) : nullptr;  // rows [stage_r0, stage_r0 + h_lo), ld D
  int64_t dh_ld = D;
  if (p.dhidden) {
    dh_acc = L.dh_in_place  ? static_cast<float*>(p.dhidden)
             : L.dh_in_dw   ? dh_in_dw
                            : reinterpret_cast<float*>(ws + L.dh_acc);
    dh_ld = L.dh_in_place ? p.ld_dh : D;
  }
  // Kept tiles with dZ in place and BackendTraits::overlap_stats (CUDA): the gradient of kept tile ti + 1 runs
  // on the second stream beside the GEMMs of tile ti, and tile ti + 1 waits for it (grad_wait). It reads and
  // writes only its own slot [(ti + 2) slot, (ti + 3) slot), which tile ti's GEMMs do not write (dW tile ti ends
  // at (ti + 1) wt <= (ti + 1) slot; dH goes to the accumulator).
  const bool grad_ahead = be.traits().overlap_stats && !sep && n_keep > 1;
  for (int64_t v0 = 0; v0 < V; v0 += vt) {
    const int64_t vn = std::min(vt, V - v0), ti = v0 / vt;
    const Mat Wm = be.weight_block(v0, vn);
    const bool deferred = v0 + vn > dw_stop;
    // dW tile: straight into dweight (f32 in place, or any dtype with one token block: L.dw_direct), else the
    // f32 tile accumulator converted after the last block.
    void* dw_tile = nullptr;
    int32_t dw_dt = f32;
    int64_t dw_ld = D;
    if (p.dweight) {
      const bool direct = L.dw_in_place || L.dw_direct;
      dw_tile = direct ? dw_tile_of(v0) : static_cast<void*>(ws + L.dw_acc);
      dw_dt = direct ? p.dw_dtype : f32;
      dw_ld = direct ? p.ld_dw : D;
    }
    void* Zt = tile_z(ti);
    const Mat dZt = dz_of(sep ? dZ : Zt);
    for (int64_t b0 = 0; b0 < N; b0 += Nb) {
      const int64_t rows = std::min(Nb, N - b0);
      const Mat Hm = be.hidden_block(b0, rows);
      if (ti >= n_keep) be.gemm(false, true, rows, vn, D, Hm, Wm, 0.f, Zt, z_dt, vt);
      if (grad_ahead && ti > 0 && ti < n_keep) be.grad_wait();  // launched beside the previous tile's GEMMs
      else be.grad(Zt, z_dt, vt, const_cast<void*>(dZt.p), dz_dt, vt, rows, vn, b0, v0);
      if (grad_ahead && ti + 1 < n_keep) {  // n_keep > 0: one token block (b0 = 0, rows = N)
        const int64_t v1 = v0 + vt, vn1 = std::min(vt, V - v1);
        be.grad_async(tile_z(ti + 1), z_dt, vt, tile_z(ti + 1), dz_dt, vt, rows, vn1, b0, v1);
      }
      if (p.dweight && !deferred)  // L.dw_direct: a single block (b0 = 0), so beta = 0 and one rounding
        be.gemm(true, false, vn, D, rows, dZt, Hm, b0 > 0 ? 1.f : 0.f, dw_tile, dw_dt, dw_ld, dzs);
      if (p.dhidden && h_lo > 0) {  // the split accumulator (one token block: b0 = 0, rows = N)
        auto dz_rows = [&](int64_t r) {
          return Mat{static_cast<const char*>(dZt.p) + r * vt * static_cast<int64_t>(dz_es), dz_dt, vt};
        };
        const float beta = v0 > 0 ? 1.f : 0.f;
        if constexpr (BE::kGemmBatch2) {
          if (dh_batch) {  // rows [0, h_lo) into the lower accumulator, rows [h_lo, N) into the upper one
            float* const c0 = stage_r0 == 0 ? dh_lo : dh_acc;
            float* const c1 = stage_r0 == 0 ? dh_acc : dh_lo;
            const int64_t sc =
                static_cast<int64_t>(reinterpret_cast<uintptr_t>(c1) - reinterpret_cast<uintptr_t>(c0)) / 4;
            be.gemm_batch2(false, false, h_lo, D, vn, dZt, h_lo * vt, Wm, 0, beta, c0, sc, f32, D, dzs);
          }
        }
        if (!dh_batch) {
          be.gemm(false, false, h_lo, D, vn, dz_rows(stage_r0), Wm, beta, dh_lo, f32, D, dzs);
          be.gemm(false, false, rows - h_lo, D, vn, dz_rows(tail_r0), Wm, beta, dh_acc, f32, dh_ld, dzs);
        }
      } else if (p.dhidden) {
        be.gemm(false, false, rows, D, vn, dZt, Wm, v0 > 0 ? 1.f : 0.f, dh_acc + b0 * dh_ld, f32, dh_ld, dzs);
      }
      if (p.dbias) be.colsum(dZt.p, dz_dt, vt, rows, vn, db_acc + v0 * db_ld, db_ld, b0 == 0, dzs);
    }
    if (p.dweight && !L.dw_in_place && !L.dw_direct)
      be.convert(static_cast<const float*>(dw_tile), D, dw_tile_of(v0), p.dw_dtype, p.ld_dw, vn, D);
  }
  if (p.dhidden && h_lo > 0) {
    const int64_t dh_es = static_cast<int64_t>(dtype_size(p.dh_dtype));
    be.convert(dh_lo, D, Z, p.dh_dtype, D, h_lo, D);  // staged: dhidden's storage still holds these f32 rows
    be.convert(dh_acc, D, static_cast<char*>(p.dhidden) + tail_r0 * D * dh_es, p.dh_dtype, D, N - h_lo, D);
    be.copy(static_cast<char*>(p.dhidden) + stage_r0 * D * dh_es, Z, static_cast<size_t>(h_lo * D * dh_es));
  } else if (p.dhidden && !L.dh_in_place) {
    be.convert(dh_acc, D, p.dhidden, p.dh_dtype, p.ld_dh, N, D);
  }
  if (L.dh_in_dw)  // the deferred tiles: recompute Z and dZ (one token block), store dW over the accumulator
    for (int64_t v0 = dw_stop / vt * vt; v0 < V; v0 += vt) {
      const int64_t vn = std::min(vt, V - v0);
      const Mat Wm = be.weight_block(v0, vn), Hm = be.hidden_block(0, N);
      be.gemm(false, true, N, vn, D, Hm, Wm, 0.f, Z, z_dt, vt);
      be.grad(Z, z_dt, vt, dZ, dz_dt, vt, N, vn, 0, v0);
      be.gemm(true, false, vn, D, N, dz_of(dZ), Hm, 0.f, dw_tile_of(v0), p.dw_dtype, p.ld_dw, dzs);
    }
  if (p.dbias && !L.db_in_place) be.convert(db_acc, 1, p.dbias, p.db_dtype, p.db_stride, V, 1);
  if (!p.backward_op) STRATA_RETURN_IF_ERROR(be.finish_loss());
  return be.status();
}

}  // namespace strata::loss
