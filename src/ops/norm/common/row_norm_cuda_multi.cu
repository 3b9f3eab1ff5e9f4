// Multi-row forward kernels of the row norms (config.stream = 4; forward only), session 7.
//
// The packed kernels (row_norm_cuda.cu, stream = 2) give each lane NV 16-byte vectors of ONE row: 32 bytes in
// flight per lane for l2norm [524288, 128] bf16 (teams of 8 lanes x 2), after which the lane reduces, stores
// and retires; s6run1 ncu: 72 % of DRAM peak, 80 % achieved occupancy, 15.5 waves of 16384 short blocks. Here a
// team of TPR lanes (4..32, 256-thread blocks) or a block of TPR = 128/256/512 threads takes U consecutive rows
// per step and issues all U * NV of its loads before the first use (U times the bytes in flight per lane, one
// reduction round for U rows), then walks the rows with a grid stride. The grid is either one step per block
// (blocks_per_sm 0) or persistent: blocks_per_sm resident blocks per SM (capped by the occupancy), every block
// running the same number of steps (up to one), so there is no partial last wave.
// Vector k of lane t of a row is vector k * TPR + t (each load instruction of a team covers TPR * 16
// contiguous bytes: whole sectors); the per-row sum is the packed kernels' (one fma chain per lane in k order,
// then the fixed shuffle tree, or the block reduction): deterministic.
// The U rows' rstd values leave in one store instruction per warp (lane u of a team writes row u of the team:
// a warp's teams hold consecutive rows, so the stored floats are contiguous).
// hints (run-time, uniform): bit 0 stores with st.global.cs (evict-first streaming stores), bit 1 loads with an
// L2 evict-first cache policy (x is read once). Loads bypass L1 and ask L2 for whole 256-byte blocks, as the
// packed kernels' (not `.nc`: y may alias x; each element is loaded before the same lane stores it).
#include "ops/norm/common/row_norm_cuda_multi.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "opbase/dtype.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/reduce.cuh"
#include "tile/cuda/vec_io.cuh"

namespace strata::norm {
namespace {

constexpr int kTeamBlock = 256;  // threads per block of the lane-team instances

template <int TPR>
constexpr int multi_block() {
  return TPR > 32 ? TPR : kTeamBlock;
}
// Minimum resident blocks asked of ptxas: room for the U * NV vectors (4 registers each) plus 32 registers of
// addresses, sums and loop state (the packed kernels' 40-register cap spilled nothing with 2 vectors).
template <int TPR, int NV, int U>
constexpr int multi_min_blocks() {
  constexpr int b = 65536 / ((4 * NV * U + 32) * multi_block<TPR>());
  return b < 1 ? 1 : b;
}

// Row offset of an equally spaced row layout (host-checked: RowLayout::uniform()).
__device__ __forceinline__ int64_t row_off(const RowLayout& l, int64_t r) { return l.base + r * l.strides[0]; }

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol = 0;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// ld_stream (L1 bypassed, 256-byte L2 fetch) with an L2 cache policy.
__device__ __forceinline__ uint4 ld_stream_policy(const void* p, uint64_t pol) {
  uint4 v;
  asm("ld.global.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ void st_cs16(void* p, const uint4& v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

template <int TPR, int NV, int U>
__global__ void __launch_bounds__(multi_block<TPR>(), multi_min_blocks<TPR, NV, U>())
    fwd_multi(const RowNormFwdParams p, int hints) {
  constexpr bool kBlk = TPR > 32;
  constexpr int GPB = kBlk ? 1 : kTeamBlock / TPR;  // teams per block
  constexpr int RPS = GPB * U;                      // rows per block per step
  __shared__ float scratch[kBlk ? U * 32 : 1];
  const int t = kBlk ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % TPR);
  const int team = kBlk ? 0 : static_cast<int>(threadIdx.x / TPR);
  const int32_t dt = p.x_dtype;
  const int ve = cuda::vec16_elems(dt);
  const int es = ve == 4 ? 4 : 2;
  const int nvec = static_cast<int>(p.D / ve);  // <= TPR * NV (host-checked)
  const float n_div = static_cast<float>(p.n_div);
  const bool cs = (hints & 1) != 0, ef = (hints & 2) != 0;
  const uint64_t pol = ef ? evict_first_policy() : 0;
  const char* x = static_cast<const char*>(p.x);
  char* y = static_cast<char*>(p.y);
  const int64_t step = static_cast<int64_t>(gridDim.x) * RPS;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * RPS; r0 < p.rows; r0 += step) {  // uniform per block
    const int64_t row0 = r0 + static_cast<int64_t>(team) * U;  // the team's U consecutive rows
    uint4 v[U][NV];
    // Every load of the U rows first; lanes past the last row or the row's end load nothing (zeros), but stay
    // for the shuffles (full-warp masks) and the block reduction.
    auto load_all = [&](auto hinted) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool live = row0 + u < p.rows;
        const char* xr = x + (live ? row_off(p.x_rows, row0 + u) * es : 0);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int i = k * TPR + t;
          if (live && i < nvec) {
            if constexpr (decltype(hinted)::value) v[u][k] = ld_stream_policy(xr + static_cast<int64_t>(i) * 16, pol);
            else v[u][k] = cuda::ld_stream(xr + static_cast<int64_t>(i) * 16);
          } else {
            v[u][k] = make_uint4(0, 0, 0, 0);
          }
        }
      }
    };
    if (ef) load_all(std::true_type{});
    else load_all(std::false_type{});
    float ss[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ss[u] = 0.f;  // zero vectors add nothing: one fma chain per lane, in k order
#pragma unroll
      for (int k = 0; k < NV; ++k) ss[u] = cuda::vec16_dot(v[u][k], v[u][k], dt, ss[u]);
    }
    if constexpr (kBlk) {
      cuda::block_sum_n<U>(ss, scratch);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) ss[u] = cuda::group_sum<TPR>(ss[u]);
    }
    float rstd[U];
#pragma unroll
    for (int u = 0; u < U; ++u) rstd[u] = rsqrtf(ss[u] / n_div + p.eps);  // a division, as the other kernels
    // Lane u (< U <= TPR) of the team writes row u's rstd: one store instruction per warp, contiguous rows.
    if (t < U && row0 + t < p.rows) {
      float mine = rstd[0];
#pragma unroll
      for (int u = 1; u < U; ++u)
        if (t == u) mine = rstd[u];
      cuda::store_one(p.rstd, p.rstd_dtype, row_off(p.rstd_rows, row0 + t), mine);
    }
    if (!y) continue;
    auto store_all = [&](auto streaming) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (row0 + u >= p.rows) break;
        char* yr = y + row_off(p.y_rows, row0 + u) * es;
        const float r = rstd[u];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int i = k * TPR + t;
          if (i >= nvec) continue;
          const uint4 o = cuda::vec16_map(v[u][k], v[u][k], dt, [r](float a, float) { return a * r; });
          if constexpr (decltype(streaming)::value) st_cs16(yr + static_cast<int64_t>(i) * 16, o);
          else cuda::st_vec16(yr + static_cast<int64_t>(i) * 16, o);
        }
      }
    };
    if (cs) store_all(std::true_type{});
    else store_all(std::false_type{});
  }
}

// One instance: a step (U rows per team or block) per block, or a persistent grid of blocks_per_sm blocks per
// SM (at most the occupancy) with balanced steps; capped at 2^31 - 1 blocks and at max_blocks when set.
template <int TPR, int NV, int U>
int launch_inst(const RowNormFwdParams& p, const RowNormCudaConfig& c, cudaStream_t s) {
  constexpr int BT = multi_block<TPR>();
  constexpr int RPS = (TPR > 32 ? 1 : kTeamBlock / TPR) * U;
  if (p.rows == 0) return STRATA_SUCCESS;
  const auto kernel = fwd_multi<TPR, NV, U>;
  const int64_t steps = cuda::ceil_div(p.rows, RPS);
  int64_t grid = std::min<int64_t>(steps, 0x7fffffff);
  if (c.blocks_per_sm > 0) {
    static const int occ = cuda::occupancy_blocks_per_sm(kernel, BT);
    const int64_t slots = static_cast<int64_t>(cuda::current_sm_count()) * std::min(c.blocks_per_sm, occ);
    if (grid > slots) grid = cuda::ceil_div(steps, cuda::ceil_div(steps, slots));
  }
  if (c.max_blocks > 0) grid = std::min<int64_t>(grid, c.max_blocks);
  kernel<<<static_cast<unsigned>(grid), BT, 0, s>>>(p, c.hints);
  return cuda::check_launch("row_norm_fwd (multi)");
}

using Launcher = int (*)(const RowNormFwdParams&, const RowNormCudaConfig&, cudaStream_t);
struct Instance {
  int tpr, nv, rpg;
  Launcher fn;
};
// The instances: lane teams covering 16 or 32 vectors (D = 128 of bf16/f16 or f32) with 1, 2 or 4 rows per
// team, a warp x 16 vectors (D = 4096 bf16 in one warp, no block barrier), and blocks covering 512 or 1024
// vectors (D = 4096 of bf16 or f32) with 1 or 2 rows per block (64 x 8, 128 x 4, 256 x 2, 512 x 1; 256 x 4,
// 512 x 2).
constexpr Instance kInstances[] = {
    {4, 4, 1, launch_inst<4, 4, 1>},       {4, 4, 2, launch_inst<4, 4, 2>},       {4, 4, 4, launch_inst<4, 4, 4>},
    {8, 2, 1, launch_inst<8, 2, 1>},       {8, 2, 2, launch_inst<8, 2, 2>},       {8, 2, 4, launch_inst<8, 2, 4>},
    {16, 1, 1, launch_inst<16, 1, 1>},     {16, 1, 2, launch_inst<16, 1, 2>},     {16, 1, 4, launch_inst<16, 1, 4>},
    {8, 4, 1, launch_inst<8, 4, 1>},       {8, 4, 2, launch_inst<8, 4, 2>},       {8, 4, 4, launch_inst<8, 4, 4>},
    {16, 2, 1, launch_inst<16, 2, 1>},     {16, 2, 2, launch_inst<16, 2, 2>},     {16, 2, 4, launch_inst<16, 2, 4>},
    {32, 1, 1, launch_inst<32, 1, 1>},     {32, 1, 2, launch_inst<32, 1, 2>},     {32, 1, 4, launch_inst<32, 1, 4>},
    {32, 16, 1, launch_inst<32, 16, 1>},
    {64, 8, 1, launch_inst<64, 8, 1>},     {64, 8, 2, launch_inst<64, 8, 2>},
    {128, 4, 1, launch_inst<128, 4, 1>},   {128, 4, 2, launch_inst<128, 4, 2>},
    {256, 2, 1, launch_inst<256, 2, 1>},   {256, 2, 2, launch_inst<256, 2, 2>},
    {512, 1, 1, launch_inst<512, 1, 1>},   {512, 1, 2, launch_inst<512, 1, 2>},
    {256, 4, 1, launch_inst<256, 4, 1>},   {256, 4, 2, launch_inst<256, 4, 2>},
    {512, 2, 1, launch_inst<512, 2, 1>},   {512, 2, 2, launch_inst<512, 2, 2>},
};

const Instance* find(const RowNormCudaConfig& c) {
  for (const Instance& i : kInstances)
    if (i.tpr == c.tpr && i.nv == c.nv && i.rpg == c.rpg) return &i;
  return nullptr;
}

}  // namespace

bool row_norm_multi_known(const RowNormCudaConfig& c) { return find(c) != nullptr; }

std::vector<RowNormCudaConfig> row_norm_multi_instances() {
  std::vector<RowNormCudaConfig> v;
  for (const Instance& i : kInstances) {
    RowNormCudaConfig c;
    c.chunk_elems = 0, c.tpr = i.tpr, c.nv = i.nv, c.rpg = i.rpg, c.stream = 4;
    v.push_back(c);
  }
  return v;
}

// No row takes a multi-row configuration by default until a GPU run has timed them against the packed
// kernels (session 7 run 2: bench/row_norm_cuda_sweep --focus, atk [cfg multi ...] rows).
RowNormCudaConfig row_norm_multi_default(int64_t D, int32_t dtype) {
  (void)D;
  (void)dtype;
  return RowNormCudaConfig{};
}

int row_norm_fwd_multi_launch(const RowNormFwdParams& p, const RowNormCudaConfig& c, void* stream) {
  const Instance* i = find(c);
  if (!i) return STRATA_ERROR_INVALID_ATTRIBUTE;
  return i->fn(p, c, static_cast<cudaStream_t>(stream));
}

}  // namespace strata::norm
