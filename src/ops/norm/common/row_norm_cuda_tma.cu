// TMA forward kernels of the row norms (config.stream = 5, sm_90; forward only), session 8.
//
// What s7run2 left open: at l2norm [524288, 128] bf16 the best register kernel (multi-row, 0.0718 ms) runs 5.7 %
// over our own copy kernel of the same bytes (0.0679 ms) and the session-6 bulk ring (a persistent grid that
// bulk-loads x and stores y from registers) was slower still (0.087 ms). Persistent grids lost in every
// experiment of session 7 (copies included), short-lived blocks won. This kernel keeps the short-lived blocks
// and moves both directions of the traffic onto the copy engine:
//   one tile of `rpt` consecutive dense rows per block (l2norm D = 128 bf16: 16 rows = 4 KiB, 64 threads):
//   thread 0 bulk-loads the tile (cp.async.bulk global -> shared, completion counted in bytes on an mbarrier);
//   teams of TPR lanes normalise the rows in shared memory in place (vector k of lane t is vector k * TPR + t
//   of the row, the packed kernels' layout and sum order: one fma chain per lane in k order, then the fixed
//   shuffle tree; a warp reads 512 contiguous bytes per instruction: no bank conflicts);
//   thread 0 bulk-stores the tile (cp.async.bulk shared -> global, one bulk group) and the tile's rstd values
//   leave as one coalesced store per warp from a shared array.
// The SM's load/store units then issue one request each way per block instead of one 16-byte access per vector,
// and the bytes in flight are the tiles of the resident blocks (D = 128 bf16: 32 blocks x 4 KiB per SM), not
// registers. A block walks further tiles with a grid stride only when the grid is capped
// (max_blocks, tests; or more than 2^31 - 1 tiles), reusing its tile buffer after the previous store has read it.
// Rows of more than 128 vectors (rmsnorm D = 4096 bf16: 8 KiB) take a warp per row that walks the row in shared
// memory twice (NV = 0: the sum of squares, then the scaling in place; the lane's vectors in the same order as
// with registers, so the sum is the packed kernels' for a warp), in tiles of whole rows within 48 KiB.
// hints (run-time, uniform): bit 0 stores with an L2 evict-first policy, bit 1 loads with it.
#include "ops/norm/common/row_norm_cuda_tma.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "opbase/dtype.h"
#include "tile/cuda/bulk_copy.cuh"
#include "tile/cuda/check.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm {
namespace {

constexpr int kTmaThreads = 128;  // threads per block at most (fewer for tiles of few rows)
constexpr int kTmaMinBlocks = 12;  // at most 42 registers (29-40 used)

// Header of the dynamic shared memory: the mbarrier (8 bytes, padded to 16), then one float per tile row
// (rstd), padded so that the tile starts 128-byte aligned.
__host__ __device__ constexpr int64_t tma_header_bytes(int rpt) { return (16 + 4 * int64_t{rpt} + 127) / 128 * 128; }

// Threads of a block for tiles of rpt rows and teams of tpr lanes: whole warps, at most kTmaThreads.
int tma_threads(int tpr, int rpt) {
  return static_cast<int>(std::min<int64_t>(kTmaThreads, (int64_t{rpt} * tpr + 31) / 32 * 32));
}

__device__ __forceinline__ int64_t row_off(const RowLayout& l, int64_t r) { return l.base + r * l.strides[0]; }

template <int TPR, int NV>
__global__ void __launch_bounds__(kTmaThreads, kTmaMinBlocks) fwd_tma(const RowNormFwdParams p, int rpt, int hints) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  float* rs = reinterpret_cast<float*>(smem + 16);  // [rpt]
  unsigned char* tile = smem + tma_header_bytes(rpt);
  const int32_t dt = p.x_dtype;
  const int ve = cuda::vec16_elems(dt), es = ve == 4 ? 4 : 2;
  const int nvec = static_cast<int>(p.D / ve);  // <= TPR * NV (host-checked) unless NV == 0
  const uint32_t row_bytes = static_cast<uint32_t>(nvec) * 16u;
  const int64_t ntiles = (p.rows + rpt - 1) / rpt;
  const int tid = static_cast<int>(threadIdx.x), nthr = static_cast<int>(blockDim.x);
  const int t = tid % TPR, team = tid / TPR, nteams = nthr / TPR;
  // Dense rows (host-checked): row r of x at x + r * row_bytes, of y likewise.
  const char* x = static_cast<const char*>(p.x) + p.x_rows.base * es;
  char* y = p.y ? static_cast<char*>(p.y) + p.y_rows.base * es : nullptr;
  const float n_div = static_cast<float>(p.n_div);
  if (tid == 0) cuda::mbar_init(bar, 1);
  __syncthreads();  // the barrier is initialised before anyone waits on it
  uint32_t parity = 0;
  for (int64_t tix = blockIdx.x; tix < ntiles; tix += gridDim.x, parity ^= 1u) {  // uniform per block
    const int64_t r0 = tix * rpt;
    const int n = static_cast<int>(min(static_cast<int64_t>(rpt), p.rows - r0));
    const uint32_t bytes = static_cast<uint32_t>(n) * row_bytes;
    if (tid == 0) {
      // A previous tile of this block: its store has read the buffer, and every thread's accesses of it are
      // ordered (the closing __syncthreads) before the copy engine writes it again.
      cuda::bulk_wait_read();
      cuda::fence_proxy_async();
      cuda::mbar_arrive_expect_tx(bar, bytes);
      if (hints & 2) cuda::bulk_g2s_hint(tile, x + r0 * row_bytes, bytes, bar, cuda::l2_evict_first());
      else cuda::bulk_g2s(tile, x + r0 * row_bytes, bytes, bar);
    }
    cuda::mbar_wait(bar, parity);
    // Every team runs the same trip count (the shuffles need whole warps); rows past n load zeros.
    const int trips = (n + nteams - 1) / nteams;
    for (int j = 0; j < trips; ++j) {
      const int r = team + j * nteams;
      const bool live = r < n;
      uint4* row = reinterpret_cast<uint4*>(tile + static_cast<size_t>(live ? r : 0) * row_bytes);
      if constexpr (NV == 0) {  // long rows: two passes over shared memory, vector i = t, t + TPR, ...
        float ss = 0.f;
        if (live)
          for (int i = t; i < nvec; i += TPR) {
            const uint4 a = row[i];
            ss = cuda::vec16_dot(a, a, dt, ss);
          }
        ss = cuda::group_sum<TPR>(ss);
        if (!live) continue;
        const float rstd = rsqrtf(ss / n_div + p.eps);
        if (t == 0) rs[r] = rstd;
        if (!y) continue;
        for (int i = t; i < nvec; i += TPR) {
          const uint4 a = row[i];
          row[i] = cuda::vec16_map(a, a, dt, [rstd](float e, float) { return e * rstd; });
        }
      } else {
        uint4 v[NV];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int i = k * TPR + t;
          v[k] = live && i < nvec ? row[i] : make_uint4(0, 0, 0, 0);
          ss = cuda::vec16_dot(v[k], v[k], dt, ss);  // zero vectors add nothing: one fma chain per lane, in k order
        }
        ss = cuda::group_sum<TPR>(ss);
        if (!live) continue;
        const float rstd = rsqrtf(ss / n_div + p.eps);  // a division, as the other kernels
        if (t == 0) rs[r] = rstd;
        if (!y) continue;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int i = k * TPR + t;
          if (i < nvec) row[i] = cuda::vec16_map(v[k], v[k], dt, [rstd](float a, float) { return a * rstd; });
        }
      }
    }
    if (y) cuda::fence_proxy_async();  // this thread's writes of the tile before the copy engine reads it
    __syncthreads();                   // the whole tile and rs written
    if (tid == 0 && y) {
      if (hints & 1) cuda::bulk_s2g_hint(y + r0 * row_bytes, tile, bytes, cuda::l2_evict_first());
      else cuda::bulk_s2g(y + r0 * row_bytes, tile, bytes);
      cuda::bulk_commit();
    }
    // rstd: consecutive threads, consecutive rows (one coalesced store per warp for dense rstd).
    for (int r = tid; r < n; r += nthr) cuda::store_one(p.rstd, p.rstd_dtype, row_off(p.rstd_rows, r0 + r), rs[r]);
    if (tix + gridDim.x < ntiles) __syncthreads();  // rs read before the next tile writes it
  }
  if (tid == 0) cuda::bulk_wait_read();  // the last store has read the tile before the block's memory is freed
#else
  __trap();  // the host rejects the TMA configurations below sm_90
#endif
}

template <int TPR, int NV>
int launch_inst(const RowNormFwdParams& p, const RowNormCudaConfig& c, cudaStream_t s) {
  if (p.rows == 0) return STRATA_SUCCESS;
  const int threads = tma_threads(TPR, c.rpg);
  const int64_t nvec = p.D / cuda::vec16_elems(p.x_dtype);
  const int64_t smem = row_norm_tma_smem_bytes(nvec, c.rpg);
  if (smem > kTmaMaxSmem || threads < TPR) return STRATA_ERROR_INVALID_ATTRIBUTE;  // host checks; never here
  int64_t grid = std::min<int64_t>(cuda::ceil_div(p.rows, c.rpg), 0x7fffffff);
  if (c.max_blocks > 0) grid = std::min<int64_t>(grid, c.max_blocks);
  fwd_tma<TPR, NV><<<static_cast<unsigned>(grid), threads, static_cast<size_t>(smem), s>>>(p, c.rpg, c.hints);
  return cuda::check_launch("row_norm_fwd (tma)");
}

using Launcher = int (*)(const RowNormFwdParams&, const RowNormCudaConfig&, cudaStream_t);
struct Instance {
  int tpr, nv;
  Launcher fn;
};
// Teams of 4..32 lanes with 1, 2 or 4 vectors per lane: rows of up to 128 vectors (2 KiB); D = 128 bf16 is
// 16 vectors (8 x 2 the pick, 16 x 1 and 4 x 4 for the sweep), f32 32 vectors (16 x 2). A warp walking the row in
// shared memory (nv 0): any row whose tile fits (D = 4096 bf16: 8 KiB rows).
constexpr Instance kInstances[] = {
    {4, 1, launch_inst<4, 1>},   {4, 2, launch_inst<4, 2>},   {4, 4, launch_inst<4, 4>},
    {8, 1, launch_inst<8, 1>},   {8, 2, launch_inst<8, 2>},   {8, 4, launch_inst<8, 4>},
    {16, 1, launch_inst<16, 1>}, {16, 2, launch_inst<16, 2>}, {16, 4, launch_inst<16, 4>},
    {32, 1, launch_inst<32, 1>}, {32, 2, launch_inst<32, 2>}, {32, 4, launch_inst<32, 4>},
    {32, 0, launch_inst<32, 0>},
};

const Instance* find(const RowNormCudaConfig& c) {
  for (const Instance& i : kInstances)
    if (i.tpr == c.tpr && i.nv == c.nv) return &i;
  return nullptr;
}

int pow2ceil(int64_t v) {
  int q = 1;
  while (q < v) q <<= 1;
  return q;
}

}  // namespace

bool row_norm_tma_known(const RowNormCudaConfig& c) {
  return c.stream == 5 && find(c) != nullptr && c.rpg >= 1 && c.rpg <= kTmaMaxRows && c.hints >= 0 && c.hints <= 3 &&
         c.blocks_per_sm == 0 && c.max_blocks >= 0;
}

int64_t row_norm_tma_smem_bytes(int64_t nvec, int rpt) { return tma_header_bytes(rpt) + int64_t{rpt} * nvec * 16; }

// s8run2 (H200, row_norm_cuda_sweep --tma, 40 queued calls, median): small tiles of small blocks won. l2norm
// [524288, 128] bf16: teams of 4 x 4, 16 rows per tile (4 KiB, 64-thread blocks: 32 per SM) 0.0699 ms; 4 x 4 /
// 8 x 2 / 16 x 1 with 32 rows 0.0713-0.0715, with 64 rows 0.0724-0.0727 (the multi-row default 0.0724, our copy
// kernel 0.0678); f32 [524288, 128]: 16-row tiles the fastest TMA (0.1354-0.1361), 32 / 64 rows 0.1374-0.1381.
// rmsnorm [32768, 4096] bf16 (a warp per 8 KiB row): tiles of 1, 2 or 4 rows 0.1368-0.1371.
RowNormCudaConfig row_norm_tma_pick(int64_t nvec) {
  RowNormCudaConfig c;
  if (nvec < 1 || row_norm_tma_smem_bytes(nvec, 1) > kTmaMaxSmem) return c;
  c.chunk_elems = 0, c.stream = 5;
  if (nvec <= 16) {
    c.tpr = 4, c.nv = nvec <= 4 ? 1 : nvec <= 8 ? 2 : 4;
  } else if (nvec <= 64) {
    c.tpr = pow2ceil(nvec) / 2, c.nv = 2;
  } else if (nvec <= 128) {
    c.tpr = 32, c.nv = 4;
  } else {
    c.tpr = 32, c.nv = 0;  // a warp walks the row in shared memory
  }
  // Tiles of 16 rows, at most 16 KiB (D = 128 bf16: 4 KiB; f32: 8 KiB; D = 4096 bf16: 2 rows), within kTmaMaxSmem.
  int64_t rpt = std::clamp<int64_t>(16384 / (nvec * 16), 1, 16);
  while (rpt > 1 && row_norm_tma_smem_bytes(nvec, static_cast<int>(rpt)) > kTmaMaxSmem) --rpt;
  c.rpg = static_cast<int>(rpt);
  return c;
}

// The forward defaults (s8run2). l2norm [524288, 128] bf16: the pick (4 x 4, 16-row tiles) 0.0699 ms in the
// sweep against the multi-row default's 0.0724; atk (4 rounds of queued calls after 512 MiB copies, median) timed
// 8 x 2 with 32-row tiles at 0.0719 and 64-row tiles at 0.0728 against the multi-row default's 0.0756 (its
// st.global.cs stores, 2 % faster in the sweep, read 2 % slower than plain stores in atk). rmsnorm [32768, 4096]
// bf16: the pick (a warp per row, 2-row tiles) 0.1371 ms in atk against the multi-row default's 0.1423 (forced:
// 0.1441), 0.1368 in the sweep against its 0.1321: the TMA kernel reads the same under both timings, the
// multi-row kernel's .cs stores do not, and only the TMA kernel meets the 0.14 ms target under both. f32 rows
// keep the other kernels (l2norm f32: classic 0.1329 against TMA 0.1354 in the sweep). Rules by row class of
// 16-bit rows: 9-16 vectors and 257-512 vectors (f16 as bf16: the same bytes and instructions). Since session 13
// row_norm_fwd_cuda_config takes the packed kernel 128 x 4 where this names a tile for 257-512 vectors (s13run1:
// 0.1345 against 0.1375 ms at rmsnorm [32768, 4096] bf16).
RowNormCudaConfig row_norm_tma_default(int64_t D, int32_t dtype) {
  const int ve = cuda::vec16_elems(dtype);
  if (ve != 8 || D <= 0 || D % ve != 0) return RowNormCudaConfig{};
  const int64_t nvec = D / ve;
  if ((nvec >= 9 && nvec <= 16) || (nvec >= 257 && nvec <= 512)) return row_norm_tma_pick(nvec);
  return RowNormCudaConfig{};
}

std::vector<RowNormCudaConfig> row_norm_tma_instances() {
  std::vector<RowNormCudaConfig> v;
  for (const Instance& i : kInstances) {
    RowNormCudaConfig c;
    c.chunk_elems = 0, c.tpr = i.tpr, c.nv = i.nv, c.rpg = 64, c.stream = 5;
    v.push_back(c);
  }
  return v;
}

int row_norm_fwd_tma_launch(const RowNormFwdParams& p, const RowNormCudaConfig& c, void* stream) {
  const Instance* i = find(c);
  if (!i || !row_norm_tma_known(c)) return STRATA_ERROR_INVALID_ATTRIBUTE;
  return i->fn(p, c, static_cast<cudaStream_t>(stream));
}

}  // namespace strata::norm
