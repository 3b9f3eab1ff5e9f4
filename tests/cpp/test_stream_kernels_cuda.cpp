// The streaming CUDA kernels (persistent one-wave grids that prefetch their next iteration: every streaming
// configuration of the row norms, the rms_norm_gated short-row backward, clipped_swiglu interleaved forward,
// and the bulk-copy ring kernels of rms_norm_gated and clipped_swiglu)
// on inputs large enough that every block walks several iterations — the conformance cases (<= 1025 rows) fit in one wave and never reach the prefetch
// path. Each output is compared with the float64 reference run on the same (rounded) inputs, outputs are
// NaN-poisoned before the run (an unwritten element fails), and the backward's reductions are checked for
// the same bits on a second run.
#include <gtest/gtest.h>

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "ops/activation/clipped_swiglu/clipped_swiglu.h"
#include "ops/norm/common/row_norm.h"
#include "ops/norm/rms_norm_gated/rms_norm_gated.h"

namespace strata {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A tensor held twice: host bytes (for the reference) and a device copy (for the kernel); f32 or bf16.
struct Twin {
  int32_t dt = STRATA_DTYPE_F32;
  size_t n = 0;
  std::vector<uint8_t> host;
  void* dev = nullptr;
  Twin(size_t count, int32_t dtype) : dt(dtype), n(count), host(count * dtype_size(dtype)) {
    EXPECT_EQ(cudaMalloc(&dev, host.size() + 16), cudaSuccess);
  }
  ~Twin() { cudaFree(dev); }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  void set(size_t i, float v) {
    if (dt == STRATA_DTYPE_F32) std::memcpy(host.data() + 4 * i, &v, 4);
    else {
      const uint16_t b = f32_to_bf16_bits(v);
      std::memcpy(host.data() + 2 * i, &b, 2);
    }
  }
  float at(const std::vector<uint8_t>& bytes, size_t i) const {
    if (dt == STRATA_DTYPE_F32) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return v;
    }
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    return bf16_bits_to_f32(b);
  }
  void upload() { EXPECT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess); }
  void poison() { EXPECT_EQ(cudaMemset(dev, 0xff, host.size()), cudaSuccess); }  // NaN in f32 and bf16
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(host.size());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), dev, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  // Relative RMS difference of the device result against the host (reference) values; NaN -> infinity.
  double rel_rms_vs_host() const {
    const std::vector<uint8_t> d = download();
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
      const double a = at(d, i), r = at(host, i);
      if (!std::isfinite(a)) return INFINITY;
      num += (a - r) * (a - r);
      den += r * r;
    }
    return std::sqrt(num / (den + 1e-300));
  }
};

RowLayout dense(int64_t rows, int64_t width) {
  RowLayout l;
  l.nd = 1;
  l.sizes[0] = rows;
  l.strides[0] = width;
  l.col_stride = 1;
  return l;
}
RowLayout one_row() { return RowLayout{}; }  // nd 0: a single row at offset 0

void fill(Twin& t, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < t.n; ++i) t.set(i, nd(rng) * scale);
  t.upload();
}

double tol(int32_t dt) { return dt == STRATA_DTYPE_F32 ? 1e-5 : 6e-3; }

// ---- row norms: forward (l2norm divisor and rms divisor), backward of every kind ----
TEST(StreamKernelsCuda, RowNormsManyIterations) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  std::mt19937 rng(11);
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F32})
    for (int64_t D : {128, 4096}) {
      const int64_t rows = D == 128 ? 150001 : 4099;  // several grid-stride iterations per block
      const std::string where = std::string(dt == STRATA_DTYPE_F32 ? "f32" : "bf16") + " D=" + std::to_string(D);
      Twin x(rows * D, dt), y(rows * D, dt), rstd(rows, STRATA_DTYPE_F32), dy(rows * D, dt), dx(rows * D, dt),
          dr(rows, STRATA_DTYPE_F32);
      fill(x, rng);
      fill(dy, rng);
      fill(dr, rng);
      norm::RowNormFwdParams fp;
      fp.x_dtype = fp.y_dtype = dt, fp.rstd_dtype = STRATA_DTYPE_F32;
      fp.rows = rows, fp.D = D, fp.n_div = D == 128 ? 1 : D, fp.eps = 1e-6f;
      fp.x_rows = fp.y_rows = dense(rows, D);
      fp.rstd_rows = dense(rows, 1);
      norm::RowNormFwdParams dp = fp, hp = fp;
      dp.x = x.dev, dp.y = y.dev, dp.rstd = rstd.dev;
      hp.x = x.host.data(), hp.y = y.host.data(), hp.rstd = rstd.host.data();
      // The streaming (1), packed (2), bulk (3), multi-row (4) and TMA (5) configurations that cover D without idle
      // lanes (label: " kind <stream>").
      std::vector<norm::RowNormCudaConfig> cfgs;
      for (const norm::RowNormCudaConfig& c : norm::row_norm_cuda_all_configs())
        if (c.stream && norm::row_norm_fwd_cuda_config_reject(dp, c).empty() &&
            static_cast<int64_t>(c.tpr) * c.nv * (16 / static_cast<int64_t>(dtype_size(dt))) < 2 * D)
          cfgs.push_back(c);
      ASSERT_FALSE(cfgs.empty()) << where;
      norm::row_norm_fwd_reference(hp);
      for (const norm::RowNormCudaConfig& c : cfgs) {
        const std::string cw = where + " kind " + std::to_string(c.stream) + " tpr=" + std::to_string(c.tpr) + " nv=" + std::to_string(c.nv) +
                                " rpg=" + std::to_string(c.rpg) + " hints=" + std::to_string(c.hints);
        y.poison();
        rstd.poison();
        ASSERT_EQ(norm::row_norm_fwd_cuda(dp, nullptr, &c), 0) << cw;
        EXPECT_LE(y.rel_rms_vs_host(), tol(dt)) << "fwd y " << cw;
        EXPECT_LE(rstd.rel_rms_vs_host(), 1e-5) << "fwd rstd " << cw;
      }
      for (norm::RowNormBwdKind kind :
           {norm::RowNormBwdKind::kNormalizedSrc, norm::RowNormBwdKind::kRawSrc, norm::RowNormBwdKind::kFactor}) {
        const bool factor = kind == norm::RowNormBwdKind::kFactor;
        norm::RowNormBwdParams bp;
        bp.src_dtype = bp.dx_dtype = dt, bp.rstd_dtype = STRATA_DTYPE_F32;
        bp.dout_dtype = factor ? STRATA_DTYPE_F32 : dt;
        bp.rows = rows, bp.D = D, bp.n_div = fp.n_div, bp.kind = kind;
        bp.src_rows = bp.dx_rows = dense(rows, D);
        bp.dout_rows = factor ? dense(rows, 1) : dense(rows, D);
        bp.rstd_rows = dense(rows, 1);
        norm::RowNormBwdParams dbp = bp, hbp = bp;
        // rstd: the reference's (host) values on both sides.
        rstd.upload();
        dbp.src = x.dev, dbp.rstd = rstd.dev, dbp.dout = factor ? dr.dev : dy.dev, dbp.dx = dx.dev;
        hbp.src = x.host.data(), hbp.rstd = rstd.host.data(), hbp.dout = factor ? dr.host.data() : dy.host.data();
        hbp.dx = dx.host.data();
        norm::row_norm_bwd_reference(hbp);
        for (const norm::RowNormCudaConfig& c : cfgs) {
          if (!norm::row_norm_bwd_cuda_config_reject(dbp, c).empty()) continue;
          dx.poison();
          ASSERT_EQ(norm::row_norm_bwd_cuda(dbp, nullptr, &c), 0) << where;
          EXPECT_LE(dx.rel_rms_vs_host(), tol(dt) * 2)
              << "bwd dx kind " << static_cast<int>(kind) << " " << where << " kind " << c.stream << " tpr=" << c.tpr << " nv=" << c.nv
              << " rpg=" << c.rpg;
        }
      }
    }
}

// ---- rms_norm_gated short rows (lane teams): forward (team kernel, packed team kernel) and streaming backward,
// both gate orders ----
TEST(StreamKernelsCuda, RmsNormGatedManyIterations) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  std::mt19937 rng(12);
  struct Variant {
    bool nbg;
    int32_t act;
    bool bias;
    int64_t D, G;
  };
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F32})
    for (const Variant v : {Variant{true, norm::kActSilu, true, 128, 128}, Variant{false, norm::kActSigmoid, false, 128, 64},
                            Variant{true, norm::kActSilu, false, 256, 128}}) {
      const int64_t rows = 60001, D = v.D, G = v.G, ng = D / G;
      const std::string where = std::string(dt == STRATA_DTYPE_F32 ? "f32" : "bf16") + " D=" + std::to_string(D) +
                                " G=" + std::to_string(G) + (v.nbg ? " norm_before_gate" : " gate_before_norm");
      Twin x(rows * D, dt), z(rows * D, dt), y(rows * D, dt), rstd(rows * ng, STRATA_DTYPE_F32), w(D, STRATA_DTYPE_F32),
          b(D, STRATA_DTYPE_F32), dy(rows * D, dt), dx(rows * D, dt), dz(rows * D, dt), dw(D, STRATA_DTYPE_F32),
          db(D, STRATA_DTYPE_F32);
      fill(x, rng);
      fill(z, rng, 2.f);
      fill(w, rng);
      fill(b, rng);
      fill(dy, rng);
      norm::RmsNormGatedFwdParams fp;
      fp.x_dtype = dt, fp.w_dtype = fp.b_dtype = STRATA_DTYPE_F32, fp.rstd_dtype = STRATA_DTYPE_F32;
      fp.rows = rows, fp.D = D, fp.group = G, fp.eps = 1e-6f, fp.norm_before_gate = v.nbg, fp.act = v.act;
      fp.x_rows = fp.z_rows = fp.y_rows = dense(rows, D);
      fp.rstd_rows = dense(rows, ng);
      fp.w_row = fp.b_row = one_row();
      norm::RmsNormGatedFwdParams dp = fp, hp = fp;
      dp.x = x.dev, dp.z = z.dev, dp.y = y.dev, dp.rstd = rstd.dev, dp.weight = w.dev, dp.bias = v.bias ? b.dev : nullptr;
      hp.x = x.host.data(), hp.z = z.host.data(), hp.y = y.host.data(), hp.rstd = rstd.host.data();
      hp.weight = w.host.data(), hp.bias = v.bias ? b.host.data() : nullptr;
      y.poison();
      rstd.poison();
      ASSERT_EQ(norm::rms_norm_gated_fwd_cuda(dp, nullptr), 0) << where;
      norm::rms_norm_gated_fwd_reference(hp);
      EXPECT_LE(y.rel_rms_vs_host(), tol(dt)) << "fwd y " << where;
      EXPECT_LE(rstd.rel_rms_vs_host(), 1e-5) << "fwd rstd " << where;
      // The packed team forward (cuda.sm90.team_packed; bf16 only, f32 falls back to the call above): many
      // 16-row blocks, every gate order / activation / bias variant, the same bits on a second run.
      if (dt == STRATA_DTYPE_BF16) {
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_packed_reject(dp), "") << where;
        y.poison();
        rstd.poison();
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_packed(dp, nullptr), 0) << where;
        const std::vector<uint8_t> y1 = y.download();
        EXPECT_LE(y.rel_rms_vs_host(), tol(dt)) << "fwd packed y " << where;
        EXPECT_LE(rstd.rel_rms_vs_host(), 1e-5) << "fwd packed rstd " << where;
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_packed(dp, nullptr), 0) << where;
        EXPECT_EQ(y.download(), y1) << "fwd packed y bits differ between runs " << where;
        // The streaming team forward (cuda.sm90.team_stream): a persistent grid, so every thread walks ~7 rows
        // (60001 rows: the last step has dead teams), prefetching the next row's chunks.
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_stream_reject(dp), "") << where;
        y.poison();
        rstd.poison();
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_stream(dp, nullptr), 0) << where;
        const std::vector<uint8_t> y3 = y.download();
        EXPECT_LE(y.rel_rms_vs_host(), tol(dt)) << "fwd stream y " << where;
        EXPECT_LE(rstd.rel_rms_vs_host(), 1e-5) << "fwd stream rstd " << where;
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_stream(dp, nullptr), 0) << where;
        EXPECT_EQ(y.download(), y3) << "fwd stream y bits differ between runs " << where;
        // Its one-pass grid (cuda.sm90.team_stream_flat): the same kernel, so the same bits.
        y.poison();
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_stream(dp, nullptr, false), 0) << where;
        EXPECT_EQ(y.download(), y3) << "fwd stream flat y differs from the persistent grid " << where;
        // The tiled bulk-copy forward (cuda.sm90.team_tma; dense rows): the same row math, so the same bits, in
        // several tile shapes (60001 rows: a partial last tile; teams that walk several rows of their tile).
        // flags: L2 evict-first stores (1) / loads (2), rstd through shared memory (4).
        for (const norm::RmsNormGatedTmaTile tile :
             {norm::RmsNormGatedTmaTile{}, norm::RmsNormGatedTmaTile{16, 64, 0}, norm::RmsNormGatedTmaTile{32, 64, 3},
              norm::RmsNormGatedTmaTile{7, 32, 4}, norm::RmsNormGatedTmaTile{16, 128, 7},
              norm::RmsNormGatedTmaTile{8, 64, 5}}) {
          y.poison();
          rstd.poison();
          ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_tma(dp, nullptr, tile), 0) << where;
          EXPECT_EQ(y.download(), y3) << "fwd tma y differs from the streaming kernel " << where << " rpt " << tile.rpt
                                      << " threads " << tile.threads << " flags " << tile.flags;
          EXPECT_LE(rstd.rel_rms_vs_host(), 1e-5) << "fwd tma rstd " << where;
        }
        // The bulk-copy ring (cuda.sm90.bulk_ring): every CTA walks more tiles than its ring has stages.
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_ring_reject(dp), "") << where;
        y.poison();
        rstd.poison();
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_ring(dp, nullptr), 0) << where;
        const std::vector<uint8_t> y2 = y.download();
        EXPECT_LE(y.rel_rms_vs_host(), tol(dt)) << "fwd ring y " << where;
        EXPECT_LE(rstd.rel_rms_vs_host(), 1e-5) << "fwd ring rstd " << where;
        ASSERT_EQ(norm::rms_norm_gated_fwd_cuda_ring(dp, nullptr), 0) << where;
        EXPECT_EQ(y.download(), y2) << "fwd ring y bits differ between runs " << where;
      }

      norm::RmsNormGatedBwdParams bp;
      bp.x_dtype = dt, bp.w_dtype = bp.b_dtype = bp.rstd_dtype = bp.dw_dtype = bp.db_dtype = STRATA_DTYPE_F32;
      bp.rows = rows, bp.D = D, bp.group = G, bp.norm_before_gate = v.nbg, bp.act = v.act;
      bp.x_rows = bp.z_rows = bp.dy_rows = bp.dx_rows = bp.dz_rows = dense(rows, D);
      bp.rstd_rows = dense(rows, ng);
      bp.w_row = bp.b_row = bp.dw_row = bp.db_row = one_row();
      rstd.upload();  // the reference's rstd on both sides
      norm::RmsNormGatedBwdParams dbp = bp, hbp = bp;
      dbp.x = x.dev, dbp.z = z.dev, dbp.weight = w.dev, dbp.bias = v.bias ? b.dev : nullptr, dbp.rstd = rstd.dev;
      dbp.dy = dy.dev, dbp.dx = dx.dev, dbp.dz = dz.dev, dbp.dweight = dw.dev, dbp.dbias = db.dev;
      hbp.x = x.host.data(), hbp.z = z.host.data(), hbp.weight = w.host.data();
      hbp.bias = v.bias ? b.host.data() : nullptr, hbp.rstd = rstd.host.data(), hbp.dy = dy.host.data();
      hbp.dx = dx.host.data(), hbp.dz = dz.host.data(), hbp.dweight = dw.host.data(), hbp.dbias = db.host.data();
      const size_t ws = norm::rms_norm_gated_bwd_workspace(dbp, norm::rms_norm_gated_cuda_partials(dbp));
      void* wsp = nullptr;
      ASSERT_EQ(cudaMalloc(&wsp, ws + 16), cudaSuccess);
      dbp.partial = static_cast<float*>(wsp);
      dx.poison();
      dz.poison();
      dw.poison();
      db.poison();
      ASSERT_EQ(norm::rms_norm_gated_bwd_cuda(dbp, nullptr), 0) << where;
      const std::vector<uint8_t> dw1 = dw.download(), db1 = db.download();
      ASSERT_EQ(norm::rms_norm_gated_bwd_cuda(dbp, nullptr), 0) << where;
      EXPECT_EQ(dw.download(), dw1) << "dweight bits differ between runs " << where;
      EXPECT_EQ(db.download(), db1) << "dbias bits differ between runs " << where;
      norm::rms_norm_gated_bwd_reference(hbp);
      EXPECT_LE(dx.rel_rms_vs_host(), 2 * tol(dt)) << "bwd dx " << where;
      EXPECT_LE(dz.rel_rms_vs_host(), 2 * tol(dt)) << "bwd dz " << where;
      EXPECT_LE(dw.rel_rms_vs_host(), 1e-4) << "bwd dweight " << where;
      EXPECT_LE(db.rel_rms_vs_host(), 1e-4) << "bwd dbias " << where;
      // The bulk-copy ring backward (bf16): the same checks, the same bits on a second run.
      if (dt == STRATA_DTYPE_BF16) {
        ASSERT_EQ(norm::rms_norm_gated_bwd_cuda_ring_reject(dbp), "") << where;
        dx.poison();
        dz.poison();
        dw.poison();
        db.poison();
        ASSERT_EQ(norm::rms_norm_gated_bwd_cuda_ring(dbp, nullptr), 0) << where;
        const std::vector<uint8_t> dx2 = dx.download(), dw2 = dw.download(), db2 = db.download();
        ASSERT_EQ(norm::rms_norm_gated_bwd_cuda_ring(dbp, nullptr), 0) << where;
        EXPECT_EQ(dx.download(), dx2) << "ring dx bits differ between runs " << where;
        EXPECT_EQ(dw.download(), dw2) << "ring dweight bits differ between runs " << where;
        EXPECT_EQ(db.download(), db2) << "ring dbias bits differ between runs " << where;
        EXPECT_LE(dx.rel_rms_vs_host(), 2 * tol(dt)) << "ring bwd dx " << where;
        EXPECT_LE(dz.rel_rms_vs_host(), 2 * tol(dt)) << "ring bwd dz " << where;
        EXPECT_LE(dw.rel_rms_vs_host(), 1e-4) << "ring bwd dweight " << where;
        EXPECT_LE(db.rel_rms_vs_host(), 1e-4) << "ring bwd dbias " << where;
      }
      cudaFree(wsp);
    }
}

// ---- clipped_swiglu interleaved forward (the flat streaming kernel), with and without probs ----
TEST(StreamKernelsCuda, ClippedSwigluInterleavedManyIterations) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  std::mt19937 rng(13);
  for (int32_t dt : {STRATA_DTYPE_BF16, STRATA_DTYPE_F32})
    for (bool with_probs : {false, true}) {
      const int64_t rows = 100003, I = 256;
      const std::string where = std::string(dt == STRATA_DTYPE_F32 ? "f32" : "bf16") + (with_probs ? " probs" : "");
      Twin x(rows * 2 * I, dt), y(rows * I, dt), pr(rows, STRATA_DTYPE_F32);
      fill(x, rng, 4.f);
      fill(pr, rng);
      activation::ClippedSwigluFwdParams fp;
      fp.x_dtype = dt, fp.probs_dtype = STRATA_DTYPE_F32, fp.rows = rows, fp.I = I;
      fp.x_rows = dense(rows, 2 * I), fp.y_rows = dense(rows, I), fp.probs_rows = dense(rows, 1);
      activation::ClippedSwigluFwdParams dp = fp, hp = fp;
      dp.x = x.dev, dp.y = y.dev, dp.probs = with_probs ? pr.dev : nullptr;
      hp.x = x.host.data(), hp.y = y.host.data(), hp.probs = with_probs ? pr.host.data() : nullptr;
      y.poison();
      ASSERT_EQ(activation::clipped_swiglu_fwd_cuda(dp, nullptr), 0) << where;
      activation::clipped_swiglu_fwd_reference(hp);
      EXPECT_LE(y.rel_rms_vs_host(), tol(dt)) << "fwd y " << where;
      // The bulk-copy ring (cuda.sm90.bulk_ring) and the tiled bulk-copy kernel (cuda.sm90.tile_tma, in three tile
      // shapes: 100003 rows, a partial last tile; rows of 2I = 512 elements, 8 or 16 rows per tile), both layouts:
      // every ring CTA walks more tiles than its ring has stages. The tiled kernel computes the ring's chunk math,
      // so the same bits.
      for (bool inter : {true, false}) {
        dp.interleaved = hp.interleaved = inter;
        const std::string w2 = where + (inter ? " interleaved" : " split");
        ASSERT_EQ(activation::clipped_swiglu_fwd_cuda_ring_reject(dp), "") << w2;
        y.poison();
        ASSERT_EQ(activation::clipped_swiglu_fwd_cuda_ring(dp, nullptr), 0) << w2;
        activation::clipped_swiglu_fwd_reference(hp);
        EXPECT_LE(y.rel_rms_vs_host(), tol(dt)) << "fwd ring y " << w2;
        const std::vector<uint8_t> ring_bits = y.download();
        ASSERT_EQ(activation::clipped_swiglu_fwd_cuda_tma_reject(dp), "") << w2;
        for (const activation::ClippedSwigluTmaTile tile :
             {activation::ClippedSwigluTmaTile{}, activation::ClippedSwigluTmaTile{16384, 256, 3},
              activation::ClippedSwigluTmaTile{3000, 64, 1}}) {
          y.poison();
          ASSERT_EQ(activation::clipped_swiglu_fwd_cuda_tma(dp, nullptr, tile), 0) << w2;
          EXPECT_EQ(y.download(), ring_bits) << "fwd tile_tma y differs from the ring " << w2 << " x_bytes "
                                             << tile.x_bytes << " threads " << tile.threads << " flags " << tile.flags;
        }
      }
    }
}

// ---- timing of the tiled bulk-copy forwards (session 9) against the defaults, at the bench shapes ----
// Queued calls (20 back to back between CUDA events, median of 5 loops), inputs by cudaMemset (bf16 0x3c3c ~
// 0.0115), the tile shapes of each kernel swept; floor = bytes / 4.22 TB/s (PERF_TARGETS). Prints one line per
// case ("[fused tma timing] ..."); bench/fused_mix_probe.py times the same defaults beside copy probes.
double queued_ms(const std::function<int()>& call) {
  for (int i = 0; i < 3; ++i)
    if (call() != 0) return -1.0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  std::vector<double> t;
  for (int loop = 0; loop < 5; ++loop) {
    cudaEventRecord(e0);
    for (int i = 0; i < 20; ++i) call();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms / 20.0);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

TEST(StreamKernelsCuda, FusedTmaTilesTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device answers";
  constexpr double kFloorTBs = 4.22;
  auto line = [&](const char* what, double bytes, const std::string& name, double ms) {
    EXPECT_GT(ms, 0.0) << what << " " << name;
    std::printf("[fused tma timing] %s: %-34s %.4f ms  %.3f x floor\n", what, name.c_str(), ms,
                ms / (bytes / (kFloorTBs * 1e12) * 1e3));
  };
  {  // rms_norm_gated forward bf16 [1048576, 128] G = 128 norm_before_gate silu, weight f32
    const int64_t rows = 1048576, D = 128;
    void *x, *z, *y, *rstd, *w;
    ASSERT_EQ(cudaMalloc(&x, rows * D * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&z, rows * D * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&y, rows * D * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&rstd, rows * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&w, D * 4), cudaSuccess);
    cudaMemset(x, 0x3c, rows * D * 2), cudaMemset(z, 0x3c, rows * D * 2), cudaMemset(w, 0, D * 4);
    norm::RmsNormGatedFwdParams p;
    p.x = x, p.z = z, p.y = y, p.rstd = rstd, p.weight = w;
    p.x_dtype = STRATA_DTYPE_BF16, p.w_dtype = p.b_dtype = p.rstd_dtype = STRATA_DTYPE_F32;
    p.rows = rows, p.D = D, p.group = D, p.eps = 1e-6f, p.norm_before_gate = true, p.act = norm::kActSilu;
    p.x_rows = p.z_rows = p.y_rows = dense(rows, D);
    p.rstd_rows = dense(rows, 1);
    p.w_row = p.b_row = one_row();
    const double bytes = 3.0 * rows * D * 2 + rows * 4.0;
    const char* what = "rms_norm_gated fwd bf16 [1048576, 128]";
    line(what, bytes, "team_stream", queued_ms([&] { return norm::rms_norm_gated_fwd_cuda_stream(p, nullptr); }));
    for (const norm::RmsNormGatedTmaTile tile :
         {norm::RmsNormGatedTmaTile{16, 128, 0}, norm::RmsNormGatedTmaTile{16, 128, 1},
          norm::RmsNormGatedTmaTile{16, 128, 2}, norm::RmsNormGatedTmaTile{16, 128, 3},
          norm::RmsNormGatedTmaTile{16, 128, 4}, norm::RmsNormGatedTmaTile{16, 128, 5},
          norm::RmsNormGatedTmaTile{16, 128, 7}, norm::RmsNormGatedTmaTile{8, 64, 0}, norm::RmsNormGatedTmaTile{8, 64, 5},
          norm::RmsNormGatedTmaTile{32, 256, 0}, norm::RmsNormGatedTmaTile{32, 256, 5}, norm::RmsNormGatedTmaTile{8, 128, 0},
          norm::RmsNormGatedTmaTile{8, 128, 5}, norm::RmsNormGatedTmaTile{16, 64, 0}})
      line(what, bytes,
           "team_tma rpt " + std::to_string(tile.rpt) + " threads " + std::to_string(tile.threads) + " flags " +
               std::to_string(tile.flags),
           queued_ms([&] { return norm::rms_norm_gated_fwd_cuda_tma(p, nullptr, tile); }));
    for (void* q : {x, z, y, rstd, w}) cudaFree(q);
  }
  {  // clipped_swiglu forward bf16 [32768, 2 x 2880] interleaved, GPT-OSS constants
    const int64_t rows = 32768, I = 2880;
    void *x, *y;
    ASSERT_EQ(cudaMalloc(&x, rows * 2 * I * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&y, rows * I * 2), cudaSuccess);
    cudaMemset(x, 0x3c, rows * 2 * I * 2);
    activation::ClippedSwigluFwdParams p;
    p.x = x, p.y = y, p.x_dtype = STRATA_DTYPE_BF16, p.rows = rows, p.I = I;
    p.x_rows = dense(rows, 2 * I), p.y_rows = dense(rows, I);
    const double bytes = 3.0 * rows * I * 2;
    const char* what = "clipped_swiglu fwd bf16 [32768, 2 x 2880]";
    line(what, bytes, "bulk_ring", queued_ms([&] { return activation::clipped_swiglu_fwd_cuda_ring(p, nullptr); }));
    line(what, bytes, "pairwise stream", queued_ms([&] { return activation::clipped_swiglu_fwd_cuda(p, nullptr); }));
    for (const activation::ClippedSwigluTmaTile tile :
         {activation::ClippedSwigluTmaTile{8192, 256, 0}, activation::ClippedSwigluTmaTile{8192, 256, 1},
          activation::ClippedSwigluTmaTile{8192, 256, 2}, activation::ClippedSwigluTmaTile{8192, 256, 3},
          activation::ClippedSwigluTmaTile{24000, 256, 1}, activation::ClippedSwigluTmaTile{24000, 256, 3}})
      line(what, bytes,
           "tile_tma x_bytes " + std::to_string(tile.x_bytes) + " threads " + std::to_string(tile.threads) + " flags " +
               std::to_string(tile.flags),
           queued_ms([&] { return activation::clipped_swiglu_fwd_cuda_tma(p, nullptr, tile); }));
    // DeepSeek-V4's split layout [32768, 2 x 2048] (limit 10, alpha 1, bias 0), in the same buffers.
    activation::ClippedSwigluFwdParams q = p;
    q.I = 2048, q.interleaved = false, q.alpha = 1.f, q.limit = 10.f, q.bias = 0.f;
    q.x_rows = dense(rows, 2 * q.I), q.y_rows = dense(rows, q.I);
    const double qbytes = 3.0 * rows * q.I * 2;
    const char* qwhat = "clipped_swiglu fwd bf16 [32768, 2 x 2048] split";
    line(qwhat, qbytes, "bulk_ring", queued_ms([&] { return activation::clipped_swiglu_fwd_cuda_ring(q, nullptr); }));
    for (const activation::ClippedSwigluTmaTile tile :
         {activation::ClippedSwigluTmaTile{8192, 256, 0}, activation::ClippedSwigluTmaTile{8192, 256, 1},
          activation::ClippedSwigluTmaTile{8192, 256, 3}})
      line(qwhat, qbytes,
           "tile_tma x_bytes " + std::to_string(tile.x_bytes) + " threads " + std::to_string(tile.threads) + " flags " +
               std::to_string(tile.flags),
           queued_ms([&] { return activation::clipped_swiglu_fwd_cuda_tma(q, nullptr, tile); }));
    cudaFree(x), cudaFree(y);
  }
}

}  // namespace
}  // namespace strata
#endif  // STRATA_WITH_CUDA
