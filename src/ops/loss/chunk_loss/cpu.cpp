// CPU implementation of chunk_loss, one per Highway target ("cpu.<isa>"): the driver's loops (driver.h) with
//   GEMMs   oneDNN dnnl_sgemm (row-major f32). 16-bit hidden / weight rows are converted to f32 per token
//           block / vocabulary slice into workspace (dnnl_sgemm takes f32 only; oneDNN's bf16 matmul is
//           emulated on CPUs without AMX-BF16 kernels and ran 4x slower, dependencies.md).
//   epilogues written once with Highway: row statistics (two passes over a row: max and sum of c, then the
//           sum of exp(c - m)), the row gradient, column sums, conversions.
//
// Determinism: every GEMM is cut into blocks fixed by its shape (never by the thread count) and each block is
// one single-threaded dnnl_sgemm call inside our OpenMP region (oneDNN runs sequentially inside an active
// parallel region; with one thread the region's own thread-count setting is set to 1 so oneDNN does not
// start threads of its own). Rows of the epilogues are computed by one thread each; column sums run over rows
// in order. So the result has the same bits for any thread count (tests/cpp/test_chunk_loss.cpp checks it).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/loss/chunk_loss/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops/loss/chunk_loss/chunk_loss.h"
#include "ops/loss/chunk_loss/driver.h"
#include "runtime/error.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/vec-inl.h"

#ifndef STRATA_CHUNK_LOSS_CPU_ONCE
#define STRATA_CHUNK_LOSS_CPU_ONCE
namespace strata::loss {
namespace {

// Runs fn(b) for blocks b in [0, nblocks) on up to rt::num_threads() threads, with oneDNN calls inside fn
// kept single-threaded (see the file comment).
template <class Fn>
void parallel_gemm_blocks(int64_t nblocks, Fn&& fn) {
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nblocks, rt::num_threads())));
#pragma omp parallel num_threads(threads)
  {
    if (threads == 1) omp_set_num_threads(1);  // this region's implicit task only: oneDNN then stays on it
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblocks; ++b) fn(b);
  }
}

// Row-major C[M, N] = op(A) op(B) + beta C in f32, cut into a fixed grid of blocks over M and N.
strata_status sgemm_blocked(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return STRATA_SUCCESS;
  if (K == 0) {
    if (beta == 0.f)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return STRATA_SUCCESS;
  }
  // About 16 blocks of at least 64 x 128 (enough to balance up to 16 threads); the larger side is cut.
  constexpr int64_t kTarget = 16;
  const int64_t mb = std::clamp<int64_t>(M / 64, 1, kTarget);
  const int64_t nb = std::clamp<int64_t>(N / 128, 1, std::max<int64_t>(1, kTarget / mb));
  const int64_t bm = (M + mb - 1) / mb, bn = (N + nb - 1) / nb;
  const int64_t gm = (M + bm - 1) / bm, gn = (N + bn - 1) / bn;
  int failed = 0;
  parallel_gemm_blocks(gm * gn, [&](int64_t b) {
    const int64_t i0 = b / gn * bm, j0 = b % gn * bn;
    const int64_t m = std::min(bm, M - i0), n = std::min(bn, N - j0);
    const float* a = ta ? A + i0 : A + i0 * lda;
    const float* bb = tb ? B + j0 * ldb : B + j0;
    const dnnl_status_t s = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, K, alpha, a, lda, bb, ldb, beta,
                                       C + i0 * ldc + j0, ldc);
    if (s != dnnl_success) {
#pragma omp atomic write
      failed = static_cast<int>(s);
    }
  });
  if (failed)
    return fail(STRATA_ERROR_RUNTIME, "chunk_loss: dnnl_sgemm (M={}, N={}, K={}) failed with status {}", M, N, K,
                failed);
  return STRATA_SUCCESS;
}

}  // namespace
}  // namespace strata::loss
#endif

HWY_BEFORE_NAMESPACE();
namespace strata::loss::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace tv = strata::tile::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// c = ce_logit(z + b) on a vector.
template <class TB>
HWY_INLINE hn::Vec<DF> LogitVec(DF df, const float* z, const TB* bias, const CeConsts& k) {
  auto v = hn::LoadU(df, z);
  if (bias) v = hn::Add(v, tv::LoadF32(df, bias));
  v = hn::Mul(v, hn::Set(df, k.scale));
  if (k.softcap_on) v = hn::Mul(hn::Set(df, k.cap), hn::CallTanh(df, hn::Mul(v, hn::Set(df, k.inv_cap))));
  return v;
}

template <class TB>
HWY_INLINE float LogitScalar(const float* z, const TB* bias, int64_t j, const CeConsts& k) {
  return ce_logit(k, z[j] + (bias ? to_f32(bias[j]) : 0.f));
}

// Row statistics of one tile row: (max, sum exp(c - max), sum c, c_target).
template <class TB>
CeRowStats RowStat(const float* z, const TB* bias, int64_t cols, int64_t yj, const CeConsts& o) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  auto vmax = hn::Set(df, -INFINITY), vsum = hn::Zero(df);
  int64_t j = 0;
  for (; j + L <= cols; j += L) {
    const auto c = LogitVec(df, z + j, bias ? bias + j : nullptr, o);
    vmax = hn::Max(vmax, c);
    vsum = hn::Add(vsum, c);
  }
  float m = hn::GetLane(hn::MaxOfLanes(df, vmax)), sumc = hn::GetLane(hn::SumOfLanes(df, vsum));
  for (int64_t k = j; k < cols; ++k) {
    const float c = LogitScalar(z, bias, k, o);
    m = std::max(m, c);
    sumc += c;
  }
  const auto vm = hn::Set(df, m);
  auto vs = hn::Zero(df);
  for (j = 0; j + L <= cols; j += L)
    vs = hn::Add(vs, hn::CallExp(df, hn::Sub(LogitVec(df, z + j, bias ? bias + j : nullptr, o), vm)));
  float s = hn::GetLane(hn::SumOfLanes(df, vs));
  for (int64_t k = j; k < cols; ++k) s += std::exp(LogitScalar(z, bias, k, o) - m);
  CeRowStats st;
  st.lse = {m, s};
  st.sum_c = sumc;
  st.c_y = yj >= 0 && yj < cols ? LogitScalar(z, bias, yj, o) : 0.f;
  return st;
}

// dZ of one row: f (p_coef p - uniform) everywhere (ce_grad_row's constants for g = coef; f = 1 - t^2 with
// softcap), the target element by the scalar formula (it also subtracts the target term).
template <class TB, class TD>
void RowGrad(const float* z, const TB* bias, int64_t cols, int64_t yj, float lse, float coef, const CeConsts& o,
             TD* dz) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (coef == 0.f) {  // ignored row (or a zero scale): exact zeros
    for (int64_t j = 0; j < cols; ++j) dz[j] = from_f32<TD>(0.f);
    return;
  }
  const CeGradRow g = ce_grad_row(o, lse, coef);
  const auto vlse = hn::Set(df, lse);
  const auto vpcoef = hn::Set(df, g.p_coef);
  const auto vuniform = hn::Set(df, g.uniform);
  const auto vinvcap = hn::Set(df, o.inv_cap);
  const auto one = hn::Set(df, 1.f);
  // dz may alias z (in place): the target element's value is computed before the row is overwritten.
  const bool has_y = yj >= 0 && yj < cols;
  const float dy = has_y ? ce_grad_from_logit(o, g, LogitScalar(z, bias, yj, o), true) : 0.f;
  int64_t j = 0;
  for (; j + L <= cols; j += L) {
    const auto c = LogitVec(df, z + j, bias ? bias + j : nullptr, o);
    const auto p = hn::CallExp(df, hn::Sub(c, vlse));
    auto d = hn::MulSub(p, vpcoef, vuniform);
    if (o.softcap_on) {
      const auto t = hn::Mul(c, vinvcap);
      d = hn::Mul(d, hn::NegMulAdd(t, t, one));
    }
    tv::StoreF32(df, d, dz + j);
  }
  for (; j < cols; ++j) dz[j] = from_f32<TD>(ce_grad_from_logit(o, g, LogitScalar(z, bias, j, o), false));
  if (has_y) dz[yj] = from_f32<TD>(dy);
}

template <class TO>
void ConvertRow(const float* src, TO* dst, int64_t n) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + L <= n; j += L) tv::StoreF32(df, hn::LoadU(df, src + j), dst + j);
  for (; j < n; ++j) dst[j] = from_f32<TO>(src[j]);
}

template <class TI>
void ConvertRowToF32(const TI* src, float* dst, int64_t n) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + L <= n; j += L) hn::StoreU(tv::LoadF32(df, src + j), df, dst + j);
  for (; j < n; ++j) dst[j] = to_f32(src[j]);
}

// acc[j] (+)= scale * sum_r dz[r, j] over rows in order, for columns [j0, j1) (contiguous acc).
void ColSumBlock(const float* dz, int64_t lddz, int64_t rows, int64_t j0, int64_t j1, float* acc, bool first,
                 float scale) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto vscale = hn::Set(df, scale);
  int64_t j = j0;
  for (; j + L <= j1; j += L) {
    auto s = hn::Zero(df);
    for (int64_t r = 0; r < rows; ++r) s = hn::Add(s, hn::LoadU(df, dz + r * lddz + j));
    s = hn::Mul(s, vscale);
    hn::StoreU(first ? s : hn::Add(hn::LoadU(df, acc + j), s), df, acc + j);
  }
  for (; j < j1; ++j) {
    float s = 0.f;
    for (int64_t r = 0; r < rows; ++r) s += dz[r * lddz + j];
    acc[j] = first ? s * scale : acc[j] + s * scale;
  }
}

template <class TW>
struct CpuBackend : BackendBase {
  CpuBackend(const ChunkLossParams& p_, const ChunkLossLayout& L_, char* ws_) : BackendBase(p_, L_, ws_) {}
  BackendTraits traits() const { return chunk_loss_cpu_traits(); }

  // 16-bit rows are converted to f32 (h_conv / w_conv); f32 rows are used where they are.
  Mat to_f32_rows(const void* base, int64_t ld, int64_t r0, int64_t rows, size_t conv_off) {
    if constexpr (std::is_same_v<TW, float>) {
      return {static_cast<const float*>(base) + r0 * ld, STRATA_DTYPE_F32, ld};
    } else {
      float* dst = reinterpret_cast<float*>(ws + conv_off);
      const TW* src = static_cast<const TW*>(base) + r0 * ld;
      const int64_t D = p.D;
      tile::parallel_blocks(rows, tile::block_for_bytes(D * 6), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) ConvertRowToF32(src + i * ld, dst + i * D, D);
      });
      return {dst, STRATA_DTYPE_F32, D};
    }
  }
  Mat hidden_block(int64_t r0, int64_t rows) { return to_f32_rows(p.hidden, p.ld_h, r0, rows, L.h_conv); }
  Mat weight_block(int64_t v0, int64_t vn) { return to_f32_rows(p.weight, p.ld_w, v0, vn, L.w_conv); }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, Mat A, Mat B, float beta, void* C, int32_t,
            int64_t ldc, float alpha = 1.f) {
    if (err) return;
    note(sgemm_blocked(ta, tb, M, N, K, alpha, static_cast<const float*>(A.p), A.ld, static_cast<const float*>(B.p),
                       B.ld, beta, static_cast<float*>(C), ldc));
  }
  float dz_scale() const { return 1.f; }  // f32 dZ: nothing to keep out

  void zero(void* dst, int32_t dt, int64_t ld, int64_t rows, int64_t cols) {
    const size_t es = dtype_size(dt);
    for (int64_t r = 0; r < rows; ++r)
      std::memset(static_cast<char*>(dst) + r * ld * static_cast<int64_t>(es), 0, static_cast<size_t>(cols) * es);
  }

  void copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

  strata_status count_targets() {
    STRATA_RETURN_IF_ERROR(check_targets(p, &n_valid));
    prepare_bias();
    return STRATA_SUCCESS;
  }

  // The bias as contiguous f32 (converted once per run into bias_conv, any stride and dtype).
  const float* bias_at(int64_t v0) const {
    return p.bias ? reinterpret_cast<const float*>(ws + L.bias_conv) + v0 : nullptr;
  }
  void prepare_bias() {
    if (!p.bias) return;
    float* dst = reinterpret_cast<float*>(ws + L.bias_conv);
    for (int64_t j = 0; j < p.V; ++j) dst[j] = to_f32(static_cast<const TW*>(p.bias)[j * p.bias_stride]);
  }

  // Z is always f32 here (chunk_loss_cpu_traits: no bf16_tile).
  void stats(const void* Zv, int32_t, int64_t ldz, int64_t rows, int64_t cols, int64_t r0, int64_t v0, bool first,
             bool last) {
    const float* Z = static_cast<const float*>(Zv);
    auto* stat = reinterpret_cast<CeRowStats*>(ws + L.stat);
    auto* rowloss = reinterpret_cast<float*>(ws + L.rowloss);
    const float* b = bias_at(v0);
    tile::parallel_blocks(rows, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t r = i0; r < i1; ++r) {
        const int64_t row = r0 + r;
        const int64_t y = p.target[row * p.target_stride];
        CeRowStats st = RowStat(Z + r * ldz, b, cols, y - v0, p.ce);
        if (!first) st = ce_stats_merge(stat[r], st);
        if (!last) {
          stat[r] = st;
          continue;
        }
        lse_w[row * lse_w_stride] = ce_lse(st.lse);
        rowloss[row] = y == p.ce.ignore_index ? 0.f : ce_row_loss(p.ce, st, p.V);
      }
    });
  }

  float coef_base() const {
    const double a = p.reduction == kReduceMean ? (n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0) : 1.0;
    return static_cast<float>(a * p.grad_scale);
  }

  // (BackendTraits::overlap_stats is off on the CPU: the driver never calls these two.)
  void grad_async(const void* Z, int32_t z_dt, int64_t ldz, void* dZ, int32_t dz_dt, int64_t lddz, int64_t rows,
                  int64_t cols, int64_t r0, int64_t v0) {
    grad(Z, z_dt, ldz, dZ, dz_dt, lddz, rows, cols, r0, v0);
  }
  void grad_wait() {}
  void grad(const void* Zv, int32_t, int64_t ldz, void* dZ, int32_t, int64_t lddz, int64_t rows, int64_t cols,
            int64_t r0, int64_t v0) {
    const float* Z = static_cast<const float*>(Zv);
    const float* b = bias_at(v0);
    const float g = p.backward_op && p.dloss ? *static_cast<const float*>(p.dloss) : 1.f;
    const float cb = coef_base() * g;
    float* dz = static_cast<float*>(dZ);
    tile::parallel_blocks(rows, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t r = i0; r < i1; ++r) {
        const int64_t row = r0 + r;
        const int64_t y = p.target[row * p.target_stride];
        const float coef = y == p.ce.ignore_index ? 0.f : cb;
        RowGrad(Z + r * ldz, b, cols, y - v0, lse_r[row * lse_r_stride], coef, p.ce, dz + r * lddz);
      }
    });
  }

  void colsum(const void* dZ, int32_t, int64_t lddz, int64_t rows, int64_t cols, float* acc, int64_t acc_stride,
              bool first, float scale = 1.f) {
    // acc is contiguous here (the f32 db output with unit stride, or the workspace accumulator); other strides
    // are routed through the workspace by the plan (db_in_place requires unit stride).
    (void)acc_stride;
    constexpr int64_t kCols = 256;
    tile::parallel_blocks((cols + kCols - 1) / kCols, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        ColSumBlock(static_cast<const float*>(dZ), lddz, rows, b * kCols, std::min(cols, (b + 1) * kCols), acc, first,
                    scale);
    });
  }

  void convert(const float* src, int64_t ld_src, void* dst, int32_t dt, int64_t ld_dst, int64_t rows, int64_t cols) {
    visit_float_dtype(dt, [&](auto to) {
      using TO = decltype(to);
      if constexpr (!std::is_same_v<TO, double>) {
        TO* d = static_cast<TO*>(dst);
        if (cols == 1) {  // a column vector with strides (db)
          for (int64_t r = 0; r < rows; ++r) d[r * ld_dst] = from_f32<TO>(src[r * ld_src]);
          return;
        }
        tile::parallel_blocks(rows, tile::block_for_bytes(cols * 6), [&](int64_t i0, int64_t i1) {
          for (int64_t r = i0; r < i1; ++r) ConvertRow(src + r * ld_src, d + r * ld_dst, cols);
        });
      }
    });
  }

  strata_status finish_loss() {
    const double scale = p.reduction == kReduceMean ? (n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0) : 1.0;
    const float* rl = reinterpret_cast<const float*>(ws + L.rowloss);
    double s = 0.0;
    for (int64_t i = 0; i < p.N; ++i) s += rl[i];
    *static_cast<float*>(p.loss) = static_cast<float>(s * scale);
    return err;
  }
};

strata_status ChunkLossCpu(const ChunkLossParams& p, const ChunkLossLayout& L, void* workspace) {
  strata_status st = STRATA_SUCCESS;
  visit_float_dtype(p.h_dtype, [&](auto tw) {
    using TW = decltype(tw);
    if constexpr (!std::is_same_v<TW, double>) {
      CpuBackend<TW> be(p, L, static_cast<char*>(workspace));
      st = chunk_loss_drive(p, L, static_cast<char*>(workspace), be);
    }
  });
  return st;
}

}  // namespace strata::loss::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::loss {
HWY_EXPORT(ChunkLossCpu);

ChunkLossCpuFn chunk_loss_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(ChunkLossCpu, hwy_target); }

BackendTraits chunk_loss_cpu_traits() {
  BackendTraits t;
  t.convert_operands = true;
  t.separate_dz = false;
  t.gemm_stores_any = false;
  // Below 64 rows the per-chunk f32 read-modify-write of dW (8 V D bytes) costs more than a tenth of the
  // chunk's GEMM time on the development machine.
  t.min_chunk_rows = 64;
  return t;
}
}  // namespace strata::loss
#endif
