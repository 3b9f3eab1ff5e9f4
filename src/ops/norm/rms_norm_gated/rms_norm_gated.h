// rms_norm_gated (ops_fused.md §4; README.md beside this file): kernel params, the scalar math shared by
// every implementation (STRATA_HD), and the kernel entry points.
//
//   x, z, y [..., D] (one dtype), weight [D], bias [D] (optional, any float dtype), residual [..., D] and
//   residual_out [..., D] (optional, x's dtype or f32), rstd [..., D / G] (f32; f64 for f64 x).
//   Rows are the leading dimensions flattened; each row is cut into D / G groups of G = group_size
//   consecutive features, and each group is normalised with its own r = 1 / sqrt(mean_group(v^2) + eps).
//   h = x (+ residual), accumulated in f32; residual_out = h.
//     norm_before_gate (fla, GDN):  y = (h * r * w + b) * act(z)
//     gate_before_norm (Mamba2):    u = h * act(z),  y = u * r * w + b
//   act = silu or sigmoid. Backward (rstd saved, everything else recomputed; §4.4):
//     norm_before_gate: xh = h r, o = xh w + b, do = dy act(z), dz = dy o act'(z), dxh = do w,
//                       dh = r (dxh - xh mean_group(dxh xh)), dw = sum_rows do xh, db = sum_rows do
//     gate_before_norm: uh = u r, duh = dy w, du = r (duh - uh mean_group(duh uh)),
//                       dh = du act(z), dz = du h act'(z), dw = sum_rows dy uh, db = sum_rows dy
//   dx = dh (+ dresidual_out); the residual's gradient is dx as well (the caller reuses it).
//   dw, db: per-block f32 partial sums [num_partials, D] in the workspace (fixed row blocks, rows in order
//   inside a block), then one fixed-order sum over the blocks: the same bits every run and, on the CPU, for
//   every thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "opbase/row_layout.h"

#ifdef __CUDACC__
#define STRATA_RNG_EXP expf
#else
#include <cmath>
#define STRATA_RNG_EXP std::exp
#endif

namespace strata::norm {

enum RmsNormGatedAct : int32_t { kActSilu = 0, kActSigmoid = 1 };

struct RmsNormGatedFwdParams {
  const void* x = nullptr;
  const void* z = nullptr;
  const void* weight = nullptr;    // nullptr: w = 1
  const void* bias = nullptr;      // nullptr: b = 0
  const void* residual = nullptr;  // nullptr: h = x
  void* y = nullptr;
  void* residual_out = nullptr;    // nullptr: not written
  void* rstd = nullptr;
  int32_t x_dtype = 0;             // x, z, y
  int32_t w_dtype = 0, b_dtype = 0, res_dtype = 0, res_out_dtype = 0, rstd_dtype = 0;
  int64_t rows = 0, D = 0, group = 0;  // group divides D (D > 0), or D == 0
  RowLayout x_rows, z_rows, y_rows, res_rows, res_out_rows, rstd_rows;  // rstd_rows: rows of D / group
  RowLayout w_row, b_row;          // a single row each (base offset and stride)
  float eps = 1e-6f;
  bool norm_before_gate = true;
  int32_t act = kActSilu;
};

struct RmsNormGatedBwdParams {
  const void* x = nullptr;
  const void* z = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;
  const void* rstd = nullptr;
  const void* dy = nullptr;
  const void* dres_out = nullptr;  // incoming gradient of residual_out (nullptr: none)
  void* dx = nullptr;
  void* dz = nullptr;
  void* dweight = nullptr;         // nullptr: not computed
  void* dbias = nullptr;
  int32_t x_dtype = 0;             // x, z, dy, dx, dz
  int32_t w_dtype = 0, b_dtype = 0, res_dtype = 0, dres_out_dtype = 0, rstd_dtype = 0, dw_dtype = 0,
          db_dtype = 0;
  int64_t rows = 0, D = 0, group = 0;
  RowLayout x_rows, z_rows, res_rows, rstd_rows, dy_rows, dres_out_rows, dx_rows, dz_rows;
  RowLayout w_row, b_row, dw_row, db_row;
  bool norm_before_gate = true;
  int32_t act = kActSilu;
  // Workspace: f32 partial sums, [num_partials, D] for dweight then [num_partials, D] for dbias.
  float* partial = nullptr;
  int64_t num_partials = 0;
};

// act(v) and act'(v) in the evaluation precision T (float in kernels, double in the reference).
template <class T>
STRATA_HD T rng_sigmoid(T v) {
  return T(1) / (T(1) + STRATA_RNG_EXP(-v));
}
template <class T>
STRATA_HD T rng_act(int32_t act, T v) {
  const T s = rng_sigmoid(v);
  return act == kActSilu ? v * s : s;
}
template <class T>
STRATA_HD T rng_act_grad(int32_t act, T v) {
  const T s = rng_sigmoid(v);
  return act == kActSilu ? s * (T(1) + v * (T(1) - s)) : s * (T(1) - s);
}

// Workspace bytes of a backward problem with `num_partials` partial rows (0 when no dweight / dbias).
inline size_t rms_norm_gated_bwd_workspace(const RmsNormGatedBwdParams& p, int64_t num_partials) {
  if (!p.dweight && !p.dbias) return 0;
  return static_cast<size_t>(2 * num_partials * p.D) * sizeof(float);
}

// float64 reference (any float dtypes, any strides): plain loops. The backward needs no workspace.
void rms_norm_gated_fwd_reference(const RmsNormGatedFwdParams& p);
void rms_norm_gated_bwd_reference(const RmsNormGatedBwdParams& p);
// The same loops in f32 arithmetic (one rounding per stored value): the "naive same-dtype computation" of the
// acceptance rule, used by the ATK harness.
void rms_norm_gated_fwd_naive_f32(const RmsNormGatedFwdParams& p);
void rms_norm_gated_bwd_naive_f32(const RmsNormGatedBwdParams& p);
// The float64 backward that also returns, per output element, the size of the terms it is formed from
// (|r dn| + |r nrm mean| for dx, sums of |terms| for dw / db): the scale of the rounding error any
// finite-precision implementation makes (atk::compare's `magnitude`). Vectors in [rows, D] / [D] order.
struct RmsNormGatedBwdMagnitudes {
  std::vector<double> dx, dz, dw, db;
};
void rms_norm_gated_bwd_magnitudes(const RmsNormGatedBwdParams& p, RmsNormGatedBwdMagnitudes& mag);

// CPU kernels per Highway target (nullptr when not compiled): f32/bf16/f16 activations, any float weight;
// vector path for unit column strides. Backward partials: rms_norm_gated_cpu_partials(p) rows blocks.
using RmsNormGatedFwdFn = void (*)(const RmsNormGatedFwdParams&);
using RmsNormGatedBwdFn = void (*)(const RmsNormGatedBwdParams&);
RmsNormGatedFwdFn rms_norm_gated_fwd_cpu(int64_t hwy_target);
RmsNormGatedBwdFn rms_norm_gated_bwd_cpu(int64_t hwy_target);
// The AVX3 builds whose bf16 outputs are rounded by AVX512-BF16 ("cpu.avx512_bf16"; nullptr if AVX3 was not
// compiled); offered only on CPUs that have the feature (tile::cpu_has_avx512_bf16).
RmsNormGatedFwdFn rms_norm_gated_fwd_cpu_native_bf16();
RmsNormGatedBwdFn rms_norm_gated_bwd_cpu_native_bf16();
int64_t rms_norm_gated_cpu_partials(const RmsNormGatedBwdParams& p);

#if STRATA_WITH_CUDA
// CUDA (sm_90): lane groups per row (D <= 1024, shuffled group sums), a block per row (D <= 8192), or a
// looped kernel (any D, group, stride, alignment). Returns a strata_status.
int rms_norm_gated_fwd_cuda(const RmsNormGatedFwdParams& p, void* stream);
// The packed team forward (cuda.sm90.team_packed): "" if a plan with these params may take it (bf16/f16, no
// residual, D <= 1024 in lane teams, unit column strides), else why not. At run time rows that are not
// 16-byte aligned go to rms_norm_gated_fwd_cuda.
std::string rms_norm_gated_fwd_cuda_packed_reject(const RmsNormGatedFwdParams& p);
// l2_hint_loads: ld_stream's hinted loads (sessions 5-11) instead of plain ld.global.v4 (the default since s12run1:
// 0.2577 against 0.2601 ms at bf16 [1048576, 128]).
int rms_norm_gated_fwd_cuda_packed(const RmsNormGatedFwdParams& p, void* stream, bool l2_hint_loads = false);
// The streaming team forward (cuda.sm90.team_stream, cuda_sm90_stream.cu): bf16/f16, no residual, f32 rstd,
// D <= 256 with one 8-feature chunk per lane of a team (choose()'s nv == 1), groups of 8 * 2^k features that
// divide the team's slice; "" if a plan with these params may take it, else why not. Rows that are not 16-byte
// aligned at run time go to rms_norm_gated_fwd_cuda.
std::string rms_norm_gated_fwd_cuda_stream_reject(const RmsNormGatedFwdParams& p);
// persistent = false: the forced-only cuda.sm90.team_stream_flat (a grid covering the rows once).
// l2_hint_loads: ld.global.L1::no_allocate.L2::256B loads (the form of sessions 7-11) instead of plain
// ld.global.v4 (the default since s12run1: 0.1954 against 0.2134 ms at bf16 [1048576, 128], C++ queued).
int rms_norm_gated_fwd_cuda_stream(const RmsNormGatedFwdParams& p, void* stream, bool persistent = true,
                                   bool l2_hint_loads = false);
// The tiled bulk-copy forward (cuda.sm90.team_tma, cuda_sm90_stream.cu; session 9): the streaming forward's row
// math in short-lived blocks of `threads` threads, each owning `rpt` consecutive rows that the copy engine loads
// (x, z) and stores (y) whole. Same plan-time conditions as team_stream (its reject); at run time rows that are
// not dense (x, z, y rows exactly D apart) or tiles over 48 KiB take team_stream's kernel, unaligned rows
// group_rows'. flags: bit 0 stores y with an L2 evict-first policy, bit 1 loads x and z with it, bit 2 gathers the
// tile's rstd in shared memory and writes it with consecutive threads (else each group's first lane stores its
// own). The default tile (16 rows, 128 threads: D = 128 bf16, 8 KiB of x and z per block; s9run1 0.2105 ms at
// [1048576, 128] against 16 x 64's 0.2137 and team_stream's 0.2156) is the impl's.
struct RmsNormGatedTmaTile {
  int rpt = 16, threads = 128, flags = 0;
};
int rms_norm_gated_fwd_cuda_tma(const RmsNormGatedFwdParams& p, void* stream, RmsNormGatedTmaTile tile = {});
// The register tile forward (cuda.sm90.team_regs, cuda_sm90_stream.cu; session 10): the streaming forward's row
// math in short-lived blocks of `threads` threads (whole teams, at most 256), each team `rows_per_team` (1, 2 or
// 4) rows whose 16-byte loads it issues before any math (fla's [BT, D] tile per program). Same conditions as
// team_stream (its reject; any equally spaced rows); unaligned rows at run time take group_rows'. The default
// (2 rows per team of 16 lanes, 128 threads: 16 rows of D = 128 a block; s10run1 0.2037 ms at [1048576, 128]
// against 4 rows per team's 0.2113 and team_tma's 0.2084) is the impl's; plain 16-byte loads since session 11.
struct RmsNormGatedRegsTile {
  int rows_per_team = 2, threads = 128;
  // The session-10 loads (ld.global.L1::no_allocate.L2::256B; 2 rows per team only) instead of plain
  // ld.global.v4 (session 11: s11run1 0.2054 ms against 0.1893 at [1048576, 128] bf16): kept for the sweep.
  bool l2_hint_loads = false;
};
int rms_norm_gated_fwd_cuda_regs(const RmsNormGatedFwdParams& p, void* stream, RmsNormGatedRegsTile tile = {});
// l2_hint_loads: the streaming backward (lane-team rows without residual / dres_out) with ld_stream's hinted
// loads (since session 4; kept: s12run1 0.4694 ms against plain ld.global.v4's 0.4706 at bf16 [1048576, 128]);
// the other kernels take plain loads.
int rms_norm_gated_bwd_cuda(const RmsNormGatedBwdParams& p, void* stream, bool l2_hint_loads = true);
// The final fixed-order sum of the p.num_partials partial rows into dweight / dbias (zeros without rows).
int rms_norm_gated_bwd_reduce_cuda(const RmsNormGatedBwdParams& p, void* stream);
// The bulk-copy ring (cuda.sm90.bulk_ring, cuda_sm90_ring.cu): bf16/f16, no residual, D and G multiples of 8,
// D <= 8192, equally spaced rows, unit column strides; "" if a plan with these params may take it, else why not.
// At run time rows that are not 16-byte aligned go to rms_norm_gated_fwd_cuda / _bwd_cuda. The backward
// needs the workspace of rms_norm_gated_cuda_partials (its grid is at most that many CTAs).
// Backward scopes (GPU run s6run2: the ring won for lane-team rows and D = 8192 and lost 4 % at D = 5120):
// wide_only = false, the dispatched entry: lane-team rows and wide rows of D > 6144; true, the forced-only
// entry cuda.sm90.bulk_ring_wide: every wide row (a block per row, D <= 8192).
std::string rms_norm_gated_fwd_cuda_ring_reject(const RmsNormGatedFwdParams& p);
std::string rms_norm_gated_bwd_cuda_ring_reject(const RmsNormGatedBwdParams& p, bool wide_only = false);
int rms_norm_gated_fwd_cuda_ring(const RmsNormGatedFwdParams& p, void* stream);
int rms_norm_gated_bwd_cuda_ring(const RmsNormGatedBwdParams& p, void* stream);
int64_t rms_norm_gated_cuda_partials(const RmsNormGatedBwdParams& p);
#endif

}  // namespace strata::norm
