// CUDA kernels of causal_conv1d ("cuda.sm90.time_tile"), forward and backward. Memory-bound: the forward
// reads x once and writes y once; the backward reads x and dy once and writes dx once, recomputing the
// pre-activation instead of saving it (ops_fused.md §14).
//
// Work decomposition (both directions): a thread owns V = 4 consecutive channels (one 8-byte load per token
// for bf16/f16, 16 bytes for f32: a warp reads 256 contiguous bytes of a bf16 token row) and a time tile of one
// batch row; it walks the tile token by token keeping the W-1 previous sources in registers (the halo: the
// tile's first W-1 sources are read once more, 3/64 of the traffic at W = 4). Loads are issued kUnroll tokens
// ahead so that each thread keeps kUnroll vector loads in flight.
//
// Sequences. cu_seqlens: the thread finds the sequence of its first token by a binary search on the device
// copy (no host sync) and, whenever the walk reaches the next sequence start, refills the window from that
// sequence's initial state (or zeros). seq_idx: every window entry carries its sequence id and a tap counts
// only when the ids match (the initial state carries the id of the row's first token). All cu_seqlens values
// are clamped to [0, T] (causal_conv1d.h), so invalid values cannot cause an out-of-bounds access; the CPU
// path and the Python layer check them.
//
// Backward: the walk runs W-1 tokens past the tile to have g = dy * act'(u) for the taps of the tile's last
// positions, keeps the last W values of g in registers, and emits dx[t - (W-1)] at each step (a gather: no
// atomics). dweight/dbias are accumulated per thread over its tile in registers and written as f32 partial
// sums [tile][W + 1][D] to the workspace; a second kernel sums the tiles in index order (fixed order: the
// same bits every run). dinitial_state and final_state are small element-wise kernels over [N, D].
//
// Paths: W in {2, 3, 4} are unrolled at compile time, with 4-channel vectors when every activation tensor has
// unit channel stride, D % 4 == 0 and aligned rows, else one channel per thread. Other widths (5..16) run
// element-wise kernels over the tap helpers of causal_conv1d.h (a correctness path: the public models use
// W <= 4).
//
// Build layout (build time is a budget, STYLE.md 12): the kernels and launchers live only in this header, in an
// anonymous namespace; each implementation's entry points are compiled in their own unit, which instantiates only
// the kernels it launches: cuda_sm90.cu ("cuda.sm90.time_tile" and the workspace size), cuda_sm90_vec.cu
// ("cuda.sm90.vec"), cuda_sm90_pipe.cu ("cuda.sm90.pipe"), cuda_sm90_lean.cu ("cuda.sm90.lean"). A path that falls
// back to another (misaligned pointers, f32) calls that path's entry point, so no unit compiles another's
// kernels. Until session 16 this was one unit of 140 s on the H200 host, one of the build's longest.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "opbase/dtype.h"
#include "ops/conv/causal_conv1d/causal_conv1d.h"
#include "tile/cuda/check.cuh"
#include "tile/cuda/cp_async.cuh"
#include "tile/cuda/fast_math.cuh"

namespace strata::conv {
namespace {

constexpr int kThreads = 128;
constexpr int kFwdTile = 64;   // tokens per thread, forward
constexpr int kBwdTile = 128;  // tokens per thread, backward (fewer tiles: a smaller partial-sum workspace)
constexpr int kUnroll = 8;     // tokens loaded ahead
constexpr int64_t kNoId = INT64_MIN;

// ---- typed vector access: V elements of T as f32 ----
template <class T>
struct Elem;
template <>
struct Elem<float> {
  __device__ static float load(const float* p) { return *p; }
  __device__ static void store(float* p, float v) { *p = v; }
};
template <>
struct Elem<bf16_t> {
  __device__ static float load(const bf16_t* p) { return __uint_as_float(static_cast<uint32_t>(p->bits) << 16); }
  __device__ static void store(bf16_t* p, float v) { p->bits = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <>
struct Elem<f16_t> {
  __device__ static float load(const f16_t* p) { return __half2float(__ushort_as_half(p->bits)); }
  __device__ static void store(f16_t* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }
};

// Vector of V elements of T (V * sizeof(T) bytes: 8 for 16-bit types, 16 for f32) as one load/store.
template <int Bytes>
struct Raw;
template <>
struct Raw<4> {
  using type = unsigned;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<16> {
  using type = uint4;
};

// Loads V elements at p (aligned to V * sizeof(T) when V > 1).
template <class T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = Elem<T>::load(p);
  } else {
    using R = typename Raw<V * sizeof(T)>::type;
    const R raw = __ldg(reinterpret_cast<const R*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = Elem<T>::load(e + i);
  }
}
// Two floats -> one 32-bit word of two 16-bit values (round to nearest even; the first at the lower address).
template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// Stores V elements at p (aligned to V * sizeof(T) when V > 1, global memory) with one vector store
// instruction; 16-bit types are packed in pairs. The 8- and 16-byte stores are written in PTX (plain weak
// st.global, as a dereference would be): a store of a uint2 / uint4 through the element pointer was split by
// the compiler into 32-bit stores (session 6 SASS: two STG.E per token in conv_fwd_vec, four in conv_fwd_pipe).
__device__ __forceinline__ void st_global8(void* p, uint32_t a, uint32_t b) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}
__device__ __forceinline__ void st_global16(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[V]) {
  if constexpr (V == 1) {
    Elem<T>::store(p, v[0]);
  } else {
    constexpr int kWords = V * static_cast<int>(sizeof(T)) / 4;
    static_assert(kWords == 1 || kWords == 2 || kWords == 4, "4, 8 or 16 bytes");
    uint32_t w[kWords];
    if constexpr (sizeof(T) == 2) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = pack2<T>(v[2 * i], v[2 * i + 1]);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = __float_as_uint(v[i]);
    }
    if constexpr (kWords == 1) *reinterpret_cast<uint32_t*>(p) = w[0];
    else if constexpr (kWords == 2) st_global8(p, w[0], w[1]);
    else st_global16(p, w[0], w[1], w[2], w[3]);
  }
}

// silu and its derivative. 16-bit outputs use the approximate exp / reciprocal of tile/cuda/fast_math.cuh
// (their error, a few f32 ulps, is far below a bf16/f16 rounding; the precise versions would make the kernels
// compute-bound); f32 keeps the precise ones. The flush-to-zero forms: ex2.approx.ftz is 2 instructions (FMUL,
// MUFU.EX2) where __expf's non-ftz form adds a compare and two predicated multiplies to keep results below 2^-126 as denormals, which
// change nothing here (1 + e rounds to 1 either way); rcp.approx.ftz differs from __fdividef(1, y) only where
// 1 / y < 2^-126 (y > 2^126: silu(u) for u < -87 is then -0 instead of ~-1e-36).
template <class T>
__device__ __forceinline__ float sigmoid_t(float v) {
  if constexpr (sizeof(T) == 2) return cuda::sigmoid_fast(v);
  else return 1.f / (1.f + expf(-v));
}
template <class T>
__device__ __forceinline__ float act_t(const Conv1dParams& p, float u) {
  return p.activation == kActSilu ? u * sigmoid_t<T>(u) : u;
}
template <class T>
__device__ __forceinline__ float dact_t(const Conv1dParams& p, float u) {
  if (p.activation != kActSilu) return 1.f;
  const float s = sigmoid_t<T>(u);
  return s * (1.f + u * (1.f - s));
}

// The block -> (time tile, channel group) map: blockIdx.x = tile * channel_blocks + channel block.
struct ThreadWork {
  int64_t b, t0, t1, tile, d0;
  bool active;
};
__device__ __forceinline__ ThreadWork thread_work(const Conv1dParams& p, int64_t tile_len, int64_t groups, int V) {
  const int64_t cblocks = (groups + kThreads - 1) / kThreads;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) / cblocks;
  const int64_t grp = (static_cast<int64_t>(blockIdx.x) - tile * cblocks) * kThreads + threadIdx.x;
  const int64_t tpr = tiles_per_row(p, tile_len);
  ThreadWork w;
  w.tile = tile;
  w.b = tile / tpr;
  w.t0 = (tile - w.b * tpr) * tile_len;
  w.t1 = w.t0 + tile_len < p.T ? w.t0 + tile_len : p.T;
  w.d0 = grp * V;
  w.active = grp < groups;
  return w;
}

// Window entry i (i < W-1) holds the source of position t - (W-1) + i for the current token t. Fills it for
// token t of sequence s (cu_seqlens and rows: positions before s.start read the initial state or zero;
// seq_idx: s.start = 0 and entries carry ids).
template <class T, int WM, int V>
__device__ __forceinline__ void fill_window(const Conv1dParams& p, int W, int64_t b, int64_t t, const SeqSpan& s,
                                            int64_t d0, float (&win)[WM][V], int64_t (&wid)[WM]) {
  const T* x = static_cast<const T*>(p.x);
  const bool seq = p.mode == kModeSeqIdx;
#pragma unroll
  for (int i = 0; i < WM - 1; ++i) {
    if (i >= W - 1) break;
    const int64_t pos = t - (W - 1) + i;
#pragma unroll
    for (int v = 0; v < V; ++v) win[i][v] = 0.f;
    wid[i] = kNoId;
    if (pos >= s.start) {
      load_vec<T, V>(x + b * p.xs[0] + pos * p.xs[1] + d0 * p.xs[2], win[i]);
      wid[i] = seq ? seq_at(p, b, pos) : 0;
    } else if (p.h0) {
#pragma unroll
      for (int v = 0; v < V; ++v) win[i][v] = h0_at(p, s.n, d0 + v, pos - s.start + W - 1);
      wid[i] = seq ? seq_at(p, b, 0) : 0;
    }
  }
}

// Slides the window by one token (conv_fwd, conv_bwd): entries 0..W-3 take their successors, and the token
// just consumed (its V sources `src`, its sequence id) becomes entry W-2.
template <int WM, int V>
__device__ __forceinline__ void slide_window(int W, float (&win)[WM][V], int64_t (&wid)[WM], const float (&src)[V],
                                             int64_t id) {
#pragma unroll
  for (int i = 0; i < WM - 2; ++i)
    if (i < W - 2) {
#pragma unroll
      for (int v = 0; v < V; ++v) win[i][v] = win[i + 1][v];
      wid[i] = wid[i + 1];
    }
#pragma unroll
  for (int i = 0; i < WM - 1; ++i)
    if (i == W - 2) {
#pragma unroll
      for (int v = 0; v < V; ++v) win[i][v] = src[v];
      wid[i] = id;
    }
}

// The start shared by conv_fwd and conv_bwd (one thread: V channels from tw.d0, a tile of kFwdTile / kBwdTile
// tokens from tw.t0): the KW taps and the bias of its channels, the sequence holding its first token, and the
// window of the KW-1 sources before that token (fill_window). Inlined, so the kernels keep it all in registers.
template <class T, int KW, int V>
__device__ __forceinline__ SeqSpan conv_tile_start(const Conv1dParams& p, const ThreadWork& tw, float (&w)[KW][V],
                                                   float (&bias)[V], float (&win)[KW][V], int64_t (&wid)[KW]) {
#pragma unroll
  for (int k = 0; k < KW; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) w[k][v] = weight_at(p, tw.d0 + v, k);
#pragma unroll
  for (int v = 0; v < V; ++v) bias[v] = bias_at(p, tw.d0 + v);
  const SeqSpan s = find_sequence(p, tw.b, tw.t0);
  fill_window<T, KW, V>(p, KW, tw.b, tw.t0, s, tw.d0, win, wid);
  return s;
}

template <class T, int KW, int V>
__global__ void __launch_bounds__(kThreads) conv_fwd(const Conv1dParams p, int64_t groups) {
  constexpr int WM = KW, W = KW;
  const ThreadWork tw = thread_work(p, kFwdTile, groups, V);
  if (!tw.active) return;  // no block-wide synchronisation below
  const int64_t b = tw.b, d0 = tw.d0;
  const bool seq = p.mode == kModeSeqIdx, cu = p.mode == kModeCuSeqlens;
  float w[WM][V], bias[V], win[WM][V];
  int64_t wid[WM];
  SeqSpan s = conv_tile_start<T, KW, V>(p, tw, w, bias, win, wid);

  const T* x = static_cast<const T*>(p.x) + b * p.xs[0] + d0 * p.xs[2];
  const T* res = p.residual ? static_cast<const T*>(p.residual) + b * p.rs[0] + d0 * p.rs[2] : nullptr;
  T* y = static_cast<T*>(p.y) + b * p.ys[0] + d0 * p.ys[2];

  for (int64_t tb = tw.t0; tb < tw.t1; tb += kUnroll) {
    float xin[kUnroll][V], rin[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = tb + u;
      if (t < tw.t1) {
        load_vec<T, V>(x + t * p.xs[1], xin[u]);
        if (res) load_vec<T, V>(res + t * p.rs[1], rin[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = tb + u;
      if (t >= tw.t1) break;
      if (cu && t >= s.end) {  // a new sequence starts at t: its window is its initial state (or zeros)
        s = find_sequence(p, b, t);
        fill_window<T, WM, V>(p, W, b, t, s, d0, win, wid);
      }
      const int64_t id = seq ? seq_at(p, b, t) : 0;
      float out[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        float acc = bias[v];
#pragma unroll
        for (int k = 0; k < WM - 1; ++k)
          if (k < W - 1 && (!seq || wid[k] == id)) acc = fmaf(w[k][v], win[k][v], acc);
        acc = fmaf(w[W - 1][v], xin[u][v], acc);  // the current token is tap W-1
        float o = act_t<T>(p, acc);
        if (seq && id < 0) o = 0.f;  // padding token
        if (res) o += rin[u][v];
        out[v] = o;
      }
      store_vec<T, V>(y + t * p.ys[1], out);
      slide_window<WM, V>(W, win, wid, xin[u], id);
    }
  }
}

template <class T, int KW, int V>
__global__ void __launch_bounds__(kThreads) conv_bwd(const Conv1dParams p, int64_t groups, float* partials) {
  constexpr int WM = KW, W = KW;
  const ThreadWork tw = thread_work(p, kBwdTile, groups, V);
  if (!tw.active) return;
  const int64_t b = tw.b, d0 = tw.d0;
  const bool seq = p.mode == kModeSeqIdx, cu = p.mode == kModeCuSeqlens;
  float w[WM][V], bias[V], win[WM][V];
  int64_t wid[WM];
  SeqSpan s = conv_tile_start<T, KW, V>(p, tw, w, bias, win, wid);

  // g window: gw[i] = g at position t - (W-1) + i after step t; gid the sequence id of that position.
  float gw[WM][V], dwa[WM][V], dba[V];
  int64_t gid[WM];
#pragma unroll
  for (int i = 0; i < WM; ++i) {
    gid[i] = kNoId;
#pragma unroll
    for (int v = 0; v < V; ++v) gw[i][v] = dwa[i][v] = 0.f;
  }
#pragma unroll
  for (int v = 0; v < V; ++v) dba[v] = 0.f;

  const T* x = static_cast<const T*>(p.x) + b * p.xs[0] + d0 * p.xs[2];
  const T* dy = static_cast<const T*>(p.dy) + b * p.dys[0] + d0 * p.dys[2];
  T* dx = static_cast<T*>(p.dx) + b * p.dxs[0] + d0 * p.dxs[2];
  const int64_t tend = tw.t1 + W - 1;  // walk end: the taps of the tile's last position reach t1 + W - 2
  const int64_t tload = tend < p.T ? tend : p.T;

  for (int64_t tb = tw.t0; tb < tend; tb += kUnroll) {
    float xin[kUnroll][V], dyin[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = tb + u;
      if (t < tload) {
        load_vec<T, V>(x + t * p.xs[1], xin[u]);
        load_vec<T, V>(dy + t * p.dys[1], dyin[u]);
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) xin[u][v] = dyin[u][v] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = tb + u;
      if (t >= tend) break;
      const bool real = t < p.T;
      if (real && cu && t >= s.end) {
        s = find_sequence(p, b, t);
        fill_window<T, WM, V>(p, W, b, t, s, d0, win, wid);
      }
      const int64_t id = !real ? kNoId : (seq ? seq_at(p, b, t) : (cu ? s.n : 0));
      float g[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if (!real || (seq && id < 0)) {
          g[v] = 0.f;
          continue;
        }
        float acc = bias[v];
#pragma unroll
        for (int k = 0; k < WM - 1; ++k)
          if (k < W - 1 && (!seq || wid[k] == id)) acc = fmaf(w[k][v], win[k][v], acc);
        acc = fmaf(w[W - 1][v], xin[u][v], acc);
        g[v] = dyin[u][v] * dact_t<T>(p, acc);
      }
      if (t < tw.t1) {  // the tile's own tokens: dweight / dbias partial sums
#pragma unroll
        for (int v = 0; v < V; ++v) {
          dba[v] += g[v];
#pragma unroll
          for (int k = 0; k < WM - 1; ++k)
            if (k < W - 1 && (!seq || wid[k] == id)) dwa[k][v] = fmaf(g[v], win[k][v], dwa[k][v]);
        }
#pragma unroll
        for (int v = 0; v < V; ++v) dwa[W - 1][v] = fmaf(g[v], xin[u][v], dwa[W - 1][v]);
      }
      // Slide the x window and the g window.
      slide_window<WM, V>(W, win, wid, xin[u], id);
#pragma unroll
      for (int i = 0; i < WM - 1; ++i)
        if (i < W - 1) {
#pragma unroll
          for (int v = 0; v < V; ++v) gw[i][v] = gw[i + 1][v];
          gid[i] = gid[i + 1];
        }
#pragma unroll
      for (int i = 0; i < WM; ++i)
        if (i == W - 1) {
#pragma unroll
          for (int v = 0; v < V; ++v) gw[i][v] = g[v];
          gid[i] = id;
        }
      // dx at position t - (W-1): taps i = 0..W-1 are the tokens pos + i (tap k = W-1-i of each), counted when
      // they belong to pos's sequence.
      const int64_t pos = t - (W - 1);
      if (pos >= tw.t0) {
        const int64_t pid = gid[0];
        float o[V];
#pragma unroll
        for (int v = 0; v < V; ++v) o[v] = 0.f;
#pragma unroll
        for (int i = 0; i < WM; ++i)
          if (i < W && gid[i] == pid) {
#pragma unroll
            for (int v = 0; v < V; ++v) o[v] = fmaf(w[W - 1 - i][v], gw[i][v], o[v]);
          }
        if (p.dhT) {  // the final state copied pos when it is among its sequence's last W-1 positions
          const int64_t e = cu ? cu_at(p, pid + 1) : p.T;
          const int64_t j = pos - (e - (W - 1));
          const bool ok = j >= 0 && (!seq || pid == seq_at(p, b, p.T - 1));
          if (ok) {
            const int64_t n = cu ? pid : b;
#pragma unroll
            for (int v = 0; v < V; ++v)
              o[v] += ld_f32(p.dhT, p.dhT_dtype, n * p.dhTs[0] + (d0 + v) * p.dhTs[1] + j * p.dhTs[2]);
          }
        }
        store_vec<T, V>(dx + pos * p.dxs[1], o);
      }
    }
  }
  // Partial sums of this tile: [tile][W + 1][D], channel-contiguous (coalesced).
  float* part = partials + tw.tile * (W + 1) * p.D + d0;
#pragma unroll
  for (int k = 0; k < WM; ++k)
    if (k < W) {
#pragma unroll
      for (int v = 0; v < V; ++v) part[k * p.D + v] = dwa[k][v];
    }
#pragma unroll
  for (int v = 0; v < V; ++v) part[W * p.D + v] = dba[v];
}

// ---- general width (W > 4): element-wise, through the tap helpers of causal_conv1d.h ----
// Forward: one thread per (b, t, d), channels fastest (coalesced for unit channel stride).
template <class T>
__global__ void __launch_bounds__(kThreads) conv_fwd_general(const Conv1dParams p) {
  const int64_t total = p.B * p.T * p.D;
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t d = i % p.D, bt = i / p.D, t = bt % p.T, b = bt / p.T;
    const SeqSpan s = find_sequence(p, b, t);
    float o = is_padding(p, b, t) ? 0.f : act_t<T>(p, pre_activation(p, b, t, s, d));
    if (res) o += Elem<T>::load(res + b * p.rs[0] + t * p.rs[1] + d * p.rs[2]);
    Elem<T>::store(y + b * p.ys[0] + t * p.ys[1] + d * p.ys[2], o);
  }
}

// Backward: one thread per (time tile, d): g of the tile's tokens and the W-1 after them in a ring indexed by
// position mod W, dweight/dbias sums over the tile in t order, dx gathered from the ring.
template <class T>
__global__ void __launch_bounds__(kThreads) conv_bwd_general(const Conv1dParams p, float* partials) {
  const int64_t tpr = tiles_per_row(p, kBwdTile);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.B * tpr * p.D) return;
  const int64_t d = i % p.D, tile = i / p.D;
  const int64_t b = tile / tpr, t0 = (tile - b * tpr) * kBwdTile;
  const int64_t t1 = t0 + kBwdTile < p.T ? t0 + kBwdTile : p.T;
  const int W = static_cast<int>(p.W);
  const bool seq = p.mode == kModeSeqIdx;
  float dwl[kMaxWidth], gr[kMaxWidth], dbl = 0.f;
  for (int k = 0; k < kMaxWidth; ++k) dwl[k] = gr[k] = 0.f;
  T* dx = static_cast<T*>(p.dx);
  SeqSpan s = find_sequence(p, b, t0);
  for (int64_t t = t0; t < t1 + W - 1; ++t) {
    float g = 0.f;
    if (t < p.T) {
      if (t >= s.end) s = find_sequence(p, b, t);
      g = grad_pre(p, b, t, s, d);
      if (t < t1) {
        dbl += g;
        for (int k = 0; k < W; ++k) {
          const TapSource src = tap_source(p, b, t, s, k);
          if (src.kind != 0) dwl[k] = fmaf(g, source_value(p, b, s.n, d, src), dwl[k]);
        }
      }
    }
    gr[t % W] = g;
    const int64_t pos = t - (W - 1);
    if (pos < t0) continue;
    const SeqSpan sp = find_sequence(p, b, pos);
    const int64_t id = seq ? seq_at(p, b, pos) : 0;
    float acc = 0.f;
    for (int j = 0; j < W; ++j) {
      const int64_t tt = pos + j;
      if (tt >= sp.end) break;
      if (seq && seq_at(p, b, tt) != id) continue;
      acc = fmaf(weight_at(p, d, W - 1 - j), gr[tt % W], acc);
    }
    acc += dfinal_to_x(p, b, pos, sp, d);
    Elem<T>::store(dx + b * p.dxs[0] + pos * p.dxs[1] + d * p.dxs[2], acc);
  }
  float* part = partials + tile * (W + 1) * p.D + d;
  for (int k = 0; k < W; ++k) part[k * p.D] = dwl[k];
  part[W * p.D] = dbl;
}

// dweight[d, k] and dbias[d] from the tiles' partial sums [tiles][W + 1][D]: a block of 32 x 8 threads per 32
// outputs i = k D + d; thread (x, y) sums the tiles y, y + 8, y + 16, ... of output x in increasing order, then
// thread (x, 0) adds the 8 sums in y order. A fixed split and order: the same bits every run. (One thread per
// output walking all tiles took 25 us at B=4 T=8192 D=8192 W=4, 172 tiles: 320 blocks, one load in flight each.)
constexpr int kRedCols = 32, kRedSplit = 8;
__global__ void __launch_bounds__(kRedCols* kRedSplit) reduce_partials(const Conv1dParams p, const float* partials,
                                                                       int64_t tiles) {
  __shared__ float part[kRedSplit][kRedCols + 1];
  const int64_t W = p.W, n = (W + 1) * p.D;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRedCols + threadIdx.x;
  float acc = 0.f;
  if (i < n) {
#pragma unroll 4
    for (int64_t tile = threadIdx.y; tile < tiles; tile += kRedSplit) acc += partials[tile * n + i];
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || i >= n) return;
  float s = part[0][threadIdx.x];
#pragma unroll
  for (int y = 1; y < kRedSplit; ++y) s += part[y][threadIdx.x];
  const int64_t k = i / p.D, d = i - k * p.D;
  if (k < W) st_f32(p.dw, p.w_dtype, d * p.dws[0] + k * p.dws[1], s);
  else if (p.db) st_f32(p.db, p.b_dtype, d * p.dbs, s);
}

// final_state (forward) or dinitial_state (backward), one thread per (n, d).
__global__ void states_kernel(const Conv1dParams p, bool backward) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.N * p.D) return;
  const int64_t n = i / p.D, d = i - n * p.D;
  for (int64_t j = 0; j < p.W - 1; ++j) {
    if (backward) st_f32(p.dh0, p.dh0_dtype, n * p.dh0s[0] + d * p.dh0s[1] + j * p.dh0s[2], dinitial_value(p, n, d, j));
    else st_f32(p.hT, p.hT_dtype, n * p.hTs[0] + d * p.hTs[1] + j * p.hTs[2], final_state_value(p, n, d, j));
  }
}

// Whether the vector path applies to these activation tensors (V elements of `esize` bytes).
inline bool vector_ok(const Conv1dParams& p, int V, size_t esize, std::initializer_list<std::pair<const void*, const int64_t*>> ts) {
  if (!p.channels_contiguous || p.D % V != 0) return false;
  for (const auto& [ptr, st] : ts) {
    if (!ptr) continue;
    if (reinterpret_cast<uintptr_t>(ptr) % (V * esize) != 0) return false;
    if (st[0] % V != 0 || st[1] % V != 0) return false;
  }
  return true;
}

// Channels per thread on the vector paths: 4 (8-byte loads of 16-bit types, 16-byte loads of f32). Wider
// 16-byte vectors of 16-bit types would need ~250 registers per thread in the backward (x, dy, g windows and
// the dweight sums for 8 channels), and fewer resident threads hold fewer loads in flight.
constexpr int kVec = 4;

inline int64_t grid_for(const Conv1dParams& p, int64_t tile_len, int64_t groups) {
  return p.B * tiles_per_row(p, tile_len) * ((groups + kThreads - 1) / kThreads);
}

// The grid of `blocks` one-dimensional blocks as an unsigned, or an error naming the op when it exceeds a grid.
inline strata_status grid_of(const char* op, int64_t blocks, unsigned* grid) {
  if (blocks > INT_MAX)
    return fail(STRATA_ERROR_UNSUPPORTED, "{}: problem too large for one grid ({} blocks)", op, blocks);
  *grid = static_cast<unsigned>(blocks);
  return STRATA_SUCCESS;
}

// Calls f(std::integral_constant<int, W>{}) for the compile-time width W in {2, 3, 4} equal to p.W (the
// unrolled kernels; W > 4 runs the general ones).
template <class F>
void with_width(const Conv1dParams& p, F&& f) {
  if (p.W == 2) f(std::integral_constant<int, 2>{});
  else if (p.W == 3) f(std::integral_constant<int, 3>{});
  else f(std::integral_constant<int, 4>{});
}

// What every forward path launches after its main kernel: final_state, one thread per (n, d).
inline strata_status launch_fwd_states(const Conv1dParams& p, cudaStream_t stream) {
  if (!p.hT || p.N * p.D == 0) return STRATA_SUCCESS;
  states_kernel<<<static_cast<unsigned>(cuda::ceil_div(p.N * p.D, kThreads)), kThreads, 0, stream>>>(p, false);
  return cuda::check_launch("causal_conv1d_fwd (final state)");
}

// What every backward path launches after its main kernel: dweight / dbias from the `tiles` partial sums in
// tile order, then dinitial_state (one thread per (n, d)).
inline strata_status launch_bwd_reduce(const Conv1dParams& p, const float* partials, int64_t tiles, cudaStream_t stream) {
  const int64_t n_red = (p.W + 1) * p.D;
  if (n_red > 0)
    reduce_partials<<<static_cast<unsigned>(cuda::ceil_div(n_red, kRedCols)), dim3(kRedCols, kRedSplit), 0, stream>>>(
        p, partials, tiles);
  STRATA_RETURN_IF_ERROR(cuda::check_launch("causal_conv1d_bwd (reduce_partials)"));
  if (!p.dh0 || p.N * p.D == 0) return STRATA_SUCCESS;
  states_kernel<<<static_cast<unsigned>(cuda::ceil_div(p.N * p.D, kThreads)), kThreads, 0, stream>>>(p, true);
  return cuda::check_launch("causal_conv1d_bwd (dinitial_state)");
}

template <class T>
strata_status launch_fwd(const Conv1dParams& p, cudaStream_t stream) {
  const int64_t total = p.B * p.T * p.D;
  if (p.W > 4) {
    if (total > 0) {
      const int64_t blocks = cuda::ceil_div(total, kThreads) < (int64_t{1} << 30) ? cuda::ceil_div(total, kThreads)
                                                                                 : (int64_t{1} << 30);
      conv_fwd_general<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
      STRATA_RETURN_IF_ERROR(cuda::check_launch("causal_conv1d_fwd (conv_fwd_general)"));
    }
  } else {
    constexpr int V = kVec;
    const bool vec = vector_ok(p, V, sizeof(T), {{p.x, p.xs}, {p.y, p.ys}, {p.residual, p.rs}});
    const int64_t groups = vec ? p.D / V : p.D;
    unsigned g = 0;
    STRATA_RETURN_IF_ERROR(grid_of("causal_conv1d_fwd", grid_for(p, kFwdTile, groups), &g));
    if (g > 0) {
      with_width(p, [&](auto w) {
        if (vec) conv_fwd<T, decltype(w)::value, V><<<g, kThreads, 0, stream>>>(p, groups);
        else conv_fwd<T, decltype(w)::value, 1><<<g, kThreads, 0, stream>>>(p, groups);
      });
      STRATA_RETURN_IF_ERROR(cuda::check_launch("causal_conv1d_fwd (conv_fwd)"));
    }
  }
  return launch_fwd_states(p, stream);
}

template <class T>
strata_status launch_bwd(const Conv1dParams& p, float* partials, cudaStream_t stream) {
  const int64_t tiles = p.B * tiles_per_row(p, kBwdTile);
  if (p.W > 4) {
    unsigned g = 0;
    STRATA_RETURN_IF_ERROR(grid_of("causal_conv1d_bwd", cuda::ceil_div(tiles * p.D, kThreads), &g));
    if (g > 0) {
      conv_bwd_general<T><<<g, kThreads, 0, stream>>>(p, partials);
      STRATA_RETURN_IF_ERROR(cuda::check_launch("causal_conv1d_bwd (conv_bwd_general)"));
    }
  } else {
    constexpr int V = kVec;
    const bool vec = vector_ok(p, V, sizeof(T), {{p.x, p.xs}, {p.dy, p.dys}, {p.dx, p.dxs}});
    const int64_t groups = vec ? p.D / V : p.D;
    unsigned g = 0;
    STRATA_RETURN_IF_ERROR(grid_of("causal_conv1d_bwd", grid_for(p, kBwdTile, groups), &g));
    if (g > 0) {
      with_width(p, [&](auto w) {
        if (vec) conv_bwd<T, decltype(w)::value, V><<<g, kThreads, 0, stream>>>(p, groups, partials);
        else conv_bwd<T, decltype(w)::value, 1><<<g, kThreads, 0, stream>>>(p, groups, partials);
      });
      STRATA_RETURN_IF_ERROR(cuda::check_launch("causal_conv1d_bwd (conv_bwd)"));
    }
  }
  return launch_bwd_reduce(p, partials, tiles, stream);
}

// ------------------------------------------------------------------------------------------------------
// "cuda.sm90.vec": the common case only (batch rows or cu_seqlens packs as sequences, W in {2, 3, 4}, unit
// channel stride, D % 8 == 0, 16-byte aligned rows; causal_conv1d_vec_reason). No per-token sequence
// bookkeeping beyond a cu_seqlens boundary check, so a thread holds only its weights, the W-1 window and the
// loads in flight.
//   forward:  a thread owns 4 channels (one 8-byte bf16/f16 or 16-byte f32 load per token) and kVecFwdTile
//             tokens of one batch row; the 8 tokens of a batch are loaded before any is used.
//   backward: 2 channels (4-byte bf16/f16, 8-byte f32 loads) and kBwdTile tokens (the time_tile workspace
//             layout [tile][W + 1][D] and reduce_partials are shared).
// Register budgets (launch bounds) are set for many resident warps: see fwd_vec_blocks_per_sm / kBwdVec.
// The initial state enters through the window of a sequence's first tile (cu_seqlens: the window is refilled
// at each sequence start, and the backward's gather of g counts only taps of the position's own sequence),
// the final state and dinitial_state through the element-wise helpers (states_kernel); dfinal_state only
// touches a sequence's last W-1 positions.

constexpr int kVecFwdTile = 64;

// Loads stay packed in registers until their token is processed (8 tokens of 4 bf16 channels are 16
// registers packed, 32 as floats).
template <class T, int V>
using RawVec = typename Raw<V * sizeof(T)>::type;
template <class T, int V>
__device__ __forceinline__ RawVec<T, V> load_raw(const T* p) {
  return __ldg(reinterpret_cast<const RawVec<T, V>*>(p));
}
template <class T, int V>
__device__ __forceinline__ void unpack(const RawVec<T, V>& raw, float (&out)[V]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = Elem<T>::load(e + i);
}

// The W-1 sources before token t of row b in sequence sq (t a tile start, or a sequence start of a
// cu_seqlens pack): x, the sequence's initial state, or zeros.
template <class T, int W, int V>
__device__ __forceinline__ void vec_window(const Conv1dParams& p, int64_t b, int64_t t, const SeqSpan& sq,
                                           int64_t d0, float (&win)[W - 1][V]) {
  const T* x = static_cast<const T*>(p.x) + b * p.xs[0] + d0;
#pragma unroll
  for (int i = 0; i < W - 1; ++i) {
    const int64_t pos = t - (W - 1) + i;
    if (pos >= sq.start) {
      load_vec<T, V>(x + pos * p.xs[1], win[i]);
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) win[i][v] = p.h0 ? h0_at(p, sq.n, d0 + v, pos - sq.start + W - 1) : 0.f;
    }
  }
}

// CU: cu_seqlens packs (a compile-time flag: the refill inlined into the unrolled token loop costs registers).
// Resident blocks per SM: 16 bytes of 8 bf16 channels per thread at four blocks (128 registers) ran at 1.6 x
// floor on the H200 (session 3 run 1: 16 warps per SM left the load / compute phases unoverlapped), so the
// forward takes 4 channels (8 bytes of bf16) at seven blocks per SM (<= 72 registers; at eight, 64 registers,
// W = 4 spilled 36 bytes).
template <class T, bool RES, bool CU>
constexpr int fwd_vec_blocks_per_sm() {
  return sizeof(T) == 2 ? (CU || RES ? 6 : 7) : (CU ? 4 : 5);
}
// One thread's forward walk along the tokens of a time tile (V channels of one batch row or cu_seqlens pack,
// W taps): shared by conv_fwd_vec (x loaded from global memory into registers) and conv_fwd_pipe (copied
// into shared memory by cp.async). step(t) takes token t's x (and residual) and writes y[t].
template <class T, int W, int V, bool RES>
struct FwdWalk {
  float w[W][V], bias[V];
  float win[W - 1][V];  // x at t - (W-1) + i before step t (the initial state / zeros before a sequence)
  SeqSpan sq;
  int64_t b, d0;

  __device__ __forceinline__ void init(const Conv1dParams& p, const ThreadWork& tw) {
    b = tw.b;
    d0 = tw.d0;
#pragma unroll
    for (int k = 0; k < W; ++k)
#pragma unroll
      for (int v = 0; v < V; ++v) w[k][v] = weight_at(p, d0 + v, k);
#pragma unroll
    for (int v = 0; v < V; ++v) bias[v] = bias_at(p, d0 + v);
    // cu_seqlens: the sequence of the tile's first token (binary search on the device copy), and a window
    // refill from the next sequence's initial state (or zeros) whenever the walk reaches its start.
    sq = find_sequence(p, b, tw.t0);
    vec_window<T, W, V>(p, b, tw.t0, sq, d0, win);
  }

  // y: this row's y at channel d0 (y + b * ys[0] + d0); rin: the residual (RES only).
  __device__ __forceinline__ void step(const Conv1dParams& p, int64_t t, const float (&xin)[V],
                                       const float (&rin)[V], T* y, bool silu, bool cu) {
    if (cu && t >= sq.end) {
      sq = find_sequence(p, b, t);
      vec_window<T, W, V>(p, b, t, sq, d0, win);
    }
    float out[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float acc = bias[v];
#pragma unroll
      for (int k = 0; k < W - 1; ++k) acc = fmaf(w[k][v], win[k][v], acc);
      acc = fmaf(w[W - 1][v], xin[v], acc);
      // The sigmoid is computed for either activation so that the choice is a select, not a branch per
      // element (the branches split the unrolled token loop into blocks that ptxas scheduled one by one).
      const float sg = sigmoid_t<T>(acc);
      float o = silu ? acc * sg : acc;
      if constexpr (RES) o += rin[v];
      out[v] = o;
    }
    store_vec<T, V>(y + t * p.ys[1], out);
#pragma unroll
    for (int i = 0; i < W - 2; ++i)
#pragma unroll
      for (int v = 0; v < V; ++v) win[i][v] = win[i + 1][v];
#pragma unroll
    for (int v = 0; v < V; ++v) win[W - 2][v] = xin[v];
  }
};

template <class T, int W, int V, bool RES, bool CU>
__global__ void __launch_bounds__(kThreads, (fwd_vec_blocks_per_sm<T, RES, CU>())) conv_fwd_vec(const Conv1dParams p, int64_t groups) {
  constexpr int U = RES ? 4 : 8;  // tokens loaded ahead (a residual doubles the packed registers per token)
  const ThreadWork tw = thread_work(p, kVecFwdTile, groups, V);
  if (!tw.active) return;
  FwdWalk<T, W, V, RES> walk;
  walk.init(p, tw);
  const int64_t xs = p.xs[1], rs = p.rs[1];
  const T* x = static_cast<const T*>(p.x) + tw.b * p.xs[0] + tw.d0;
  const T* res = RES ? static_cast<const T*>(p.residual) + tw.b * p.rs[0] + tw.d0 : nullptr;
  T* y = static_cast<T*>(p.y) + tw.b * p.ys[0] + tw.d0;
  const bool silu = p.activation == kActSilu;
  for (int64_t tb = tw.t0; tb < tw.t1; tb += U) {
    RawVec<T, V> xr[U], rr[RES ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (tb + u < tw.t1) {
        xr[u] = load_raw<T, V>(x + (tb + u) * xs);
        if constexpr (RES) rr[u] = load_raw<T, V>(res + (tb + u) * rs);
      }
    // A whole group of U tokens (all but a row's last, partial group) runs without the per-token exit: the
    // exits split the unrolled loop into one block per token, each ending with register moves of the window
    // and a bound check (session 6 SASS of the bf16 W = 4 kernel: ~12 of ~66 instructions per token).
    if (tb + U <= tw.t1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float xin[V], rin[V];
        unpack<T, V>(xr[u], xin);
        if constexpr (RES) unpack<T, V>(rr[u], rin);
        walk.step(p, tb + u, xin, rin, y, silu, CU);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (tb + u >= tw.t1) break;
        float xin[V], rin[V];
        unpack<T, V>(xr[u], xin);
        if constexpr (RES) unpack<T, V>(rr[u], rin);
        walk.step(p, tb + u, xin, rin, y, silu, CU);
      }
    }
  }
}

// ---- "cuda.sm90.pipe" (16-bit activations): x (and dy) staged in shared memory by cp.async ----
// The register-streaming kernels hold their loads in flight in registers, which caps the channels per thread
// (vec backward: 2, at 0.99 ms = 2.6 x floor for bf16 B=4 T=8192 D=8192, session 5 run 1) and the tokens
// ahead; the per-token bookkeeping (addresses, sequence ids, the dx gather) is then paid for every 2-4
// channels. Here cp.async copies chunks of kPipeChunk tokens of the block's channel slab into shared memory
// kPipeStages - 1 chunks ahead: the bytes in flight cost no registers (4 blocks x 2 chunks x 16 KiB = 128
// KiB per SM), so a thread owns 8 channels forward (one 16-byte shared load per token) and 4 backward (x and
// dy: 8 bytes each), and runs the same FwdWalk / BwdWalk as the vec kernels on them.
constexpr int kPipeChunk = 8;   // tokens per stage
constexpr int kPipeStages = 3;  // 2 chunks in flight while one is computed
constexpr int kPipeFwdV = 8, kPipeBwdV = 4;
constexpr int kPipeFwdTile = 128;  // tokens per block
// Backward: blocks per SM and tokens per block (one partial-sum row per tile). W = 4 (4 x 4 dweight sums, two
// windows and the weights: ~64 live floats besides the loads) needs more than 128 registers: at four blocks per
// SM ptxas spilled 136-336 bytes, and with 4 x 48 KiB of shared memory little L1 is left for spills, so W = 4
// runs three blocks (<= 168 registers) with 192-token tiles (B = 4, T = 8192, D = 8192: 2752 blocks = 6.95 waves
// of 396; 256-token tiles would leave a last wave 17 % full). W = 2, 3: four blocks, 256 tokens (3.9 waves).
template <int W>
constexpr int pipe_bwd_blocks_per_sm() {
  return W == 4 ? 3 : 4;
}
template <int W>
constexpr int pipe_bwd_tile() {
  return W == 4 ? 192 : 256;
}
inline int64_t pipe_bwd_tile(int64_t W) { return W == 4 ? pipe_bwd_tile<4>() : pipe_bwd_tile<2>(); }

// A compiler-only fence after every kPipeGroup tokens of the unrolled token loop: the shared-memory loads of
// later tokens are not hoisted above it, so at most kPipeGroup tokens of loads are live at once. Without it
// ptxas hoisted all 8 tokens' loads (32 registers backward) and spilled the W = 4 kernels at 128 registers.
constexpr int kPipeGroup = 2;
__device__ __forceinline__ void pipe_group_fence(int u) {
  if (u % kPipeGroup == kPipeGroup - 1) asm volatile("" ::: "memory");
}

// Copies tokens [c0, c0 + kPipeChunk) of the block's channel slab [slab, slab + kThreads V) of one row (row: its
// first element, ts: its time stride) into dst[token][thread] (one thread's V channels per entry) as 16-byte
// pieces of 8 channels; tokens >= tload and channels >= D are zero-filled without reading (D % 8 == 0: a
// piece is all in or all out).
template <class T, int V>
__device__ __forceinline__ void pipe_copy(RawVec<T, V> (*dst)[kThreads], const T* row, int64_t ts, int64_t c0,
                                          int64_t tload, int64_t slab, int64_t D) {
  static_assert(sizeof(T) == 2 && (V == 4 || V == 8), "16-bit activations, 4 or 8 channels per thread");
  constexpr int kPieces = kThreads * V / 8;  // per token row
  constexpr int kPerThread = kPipeChunk * kPieces / kThreads;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kThreads;
    const int r = i / kPieces, c = i - r * kPieces;
    const int64_t t = c0 + r, d = slab + 8 * c;
    const bool ok = t < tload && d < D;
    cuda::cp_async16(&dst[r][c * (8 / V)], ok ? row + t * ts + d : row, ok);
  }
}

// Forward: 128 threads x 8 channels (a 2 KiB slab of a bf16 token row) x kPipeFwdTile tokens; no residual
// (causal_conv1d_pipe_reason: a residual call takes the vec kernel).
template <class T, int W, bool CU>
__global__ void __launch_bounds__(kThreads, 4) conv_fwd_pipe(const Conv1dParams p, int64_t groups) {
  constexpr int V = kPipeFwdV, S = kPipeStages;
  __shared__ __align__(16) RawVec<T, V> sx[S][kPipeChunk][kThreads];  // 3 x 8 x 128 x 16 bytes = 48 KiB
  // Every thread takes part in the copies and barriers; only those with channels < D compute.
  const ThreadWork tw = thread_work(p, kPipeFwdTile, groups, V);
  const int64_t slab = tw.d0 - static_cast<int64_t>(threadIdx.x) * V;
  const int64_t nchunks = (tw.t1 - tw.t0 + kPipeChunk - 1) / kPipeChunk;  // the same for the whole block
  const T* xrow = static_cast<const T*>(p.x) + tw.b * p.xs[0];
  T* y = static_cast<T*>(p.y) + tw.b * p.ys[0] + tw.d0;
  const bool silu = p.activation == kActSilu;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nchunks) pipe_copy<T, V>(sx[s], xrow, p.xs[1], tw.t0 + s * kPipeChunk, tw.t1, slab, p.D);
    cuda::cp_async_commit();  // one group per chunk slot, empty or not: the wait count below stays exact
  }
  // Weights and the window's W-1 tokens (plain loads) while the first chunks are in flight.
  FwdWalk<T, W, V, false> walk;
  if (tw.active) walk.init(p, tw);
  const float none[V] = {};
  for (int64_t c = 0; c < nchunks; ++c) {
    cuda::cp_async_wait<S - 2>();  // this thread's copies of chunk c have landed
    __syncthreads();               // everyone's have, and everyone is done with chunk c - 1's stage
    const int64_t cn = c + S - 1;
    if (cn < nchunks) pipe_copy<T, V>(sx[cn % S], xrow, p.xs[1], tw.t0 + cn * kPipeChunk, tw.t1, slab, p.D);
    cuda::cp_async_commit();
    if (tw.active) {
      const int st = static_cast<int>(c % S);
      const int64_t tc = tw.t0 + c * kPipeChunk;
#pragma unroll
      for (int u = 0; u < kPipeChunk; ++u) {
        if (tc + u >= tw.t1) break;
        float xin[V];
        unpack<T, V>(sx[st][u][threadIdx.x], xin);
        walk.step(p, tc + u, xin, none, y, silu, CU);
        pipe_group_fence(u);
      }
    }
  }
  cuda::cp_async_wait<0>();  // no copy outlives the block (the trailing groups are empty)
}

// One thread's backward walk along the tokens of a time tile: V channels of one batch row (or of a cu_seqlens
// pack), W taps. Shared by conv_bwd_vec (x / dy loaded from global memory into registers) and conv_bwd_pipe
// (copied into shared memory by cp.async). step(t) takes token t's x and dy (zeros past the row's end),
// recomputes u and g = dy * act'(u), adds the tile's dweight / dbias terms and emits dx[t - (W-1)] once all the
// taps of that position are known (a gather from the last W values of g: no atomics).
// kRows: batch rows only (no cu_seqlens; the pipe kernel's compile-time case): every tap of a position belongs
// to its row and g is set to 0 past the row's end, so no sequence ids are tracked (3 registers and the id
// compares of the gather fewer).
template <class T, int W, int V, bool kRows = false>
struct BwdWalk {
  float w[W][V], bias[V];
  float win[W - 1][V];  // x at t - (W-1) + i before step t (the initial state / zeros before a sequence)
  // g at position t - (W-1) + i before step t, gid its sequence (positions before t0 count as 0: dx is only
  // emitted for positions >= t0, whose taps are all at >= t0; -1 past the row's end).
  float gw[W - 1][V];
  float dwa[W][V], dba[V];
  int gid[W - 1];
  SeqSpan sq;
  int64_t b, d0, t0, t1;

  __device__ __forceinline__ void init(const Conv1dParams& p, const ThreadWork& tw) {
    b = tw.b;
    d0 = tw.d0;
    t0 = tw.t0;
    t1 = tw.t1;
#pragma unroll
    for (int k = 0; k < W; ++k)
#pragma unroll
      for (int v = 0; v < V; ++v) w[k][v] = weight_at(p, d0 + v, k);
#pragma unroll
    for (int v = 0; v < V; ++v) bias[v] = bias_at(p, d0 + v);
    sq = find_sequence(p, b, t0);
    vec_window<T, W, V>(p, b, t0, sq, d0, win);
#pragma unroll
    for (int i = 0; i < W - 1; ++i) gid[i] = -1;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      dba[v] = 0.f;
#pragma unroll
      for (int i = 0; i < W - 1; ++i) gw[i][v] = 0.f;
#pragma unroll
      for (int k = 0; k < W; ++k) dwa[k][v] = 0.f;
    }
  }

  // The pieces of a token's step, shared by step() and step_fast() (the same arithmetic in the same order, so both
  // give the same bits). g = dy act'(u) with u recomputed from the window and the token's x (act' = 1 without
  // SiLU).
  __device__ __forceinline__ void token_g(const float (&xin)[V], const float (&gin)[V], bool silu,
                                          float (&g)[V]) const {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float acc = bias[v];
#pragma unroll
      for (int k = 0; k < W - 1; ++k) acc = fmaf(w[k][v], win[k][v], acc);
      acc = fmaf(w[W - 1][v], xin[v], acc);
      float d = 1.f;
      if (silu) {
        const float s = sigmoid_t<T>(acc);
        d = s * (1.f + acc * (1.f - s));
      }
      g[v] = gin[v] * d;
    }
  }
  // The tile's dweight / dbias terms of the token.
  __device__ __forceinline__ void add_terms(const float (&xin)[V], const float (&g)[V]) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      dba[v] += g[v];
#pragma unroll
      for (int k = 0; k < W - 1; ++k) dwa[k][v] = fmaf(g[v], win[k][v], dwa[k][v]);
      dwa[W - 1][v] = fmaf(g[v], xin[v], dwa[W - 1][v]);
    }
  }
  // dx at pos = t - (W-1): tap W-1-i of the token pos + i, i = 0..W-1 (gw[0..W-2], then g). kAll: every tap
  // counts (batch rows, or a run inside one sequence); else only the taps of pos's sequence pid (id: the token's).
  template <bool kAll>
  __device__ __forceinline__ void gather(const float (&g)[V], int pid, int id, float (&o)[V]) const {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float a = 0.f;
#pragma unroll
      for (int i = 0; i < W - 1; ++i)
        if (kAll || gid[i] == pid) a = fmaf(w[W - 1 - i][v], gw[i][v], a);
      o[v] = (kAll || id == pid) ? fmaf(w[0][v], g[v], a) : a;
    }
  }
  // The windows move on by one token: x and g of the token enter at the end.
  __device__ __forceinline__ void shift(const float (&xin)[V], const float (&g)[V]) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
#pragma unroll
      for (int i = 0; i < W - 2; ++i) {
        win[i][v] = win[i + 1][v];
        gw[i][v] = gw[i + 1][v];
      }
      win[W - 2][v] = xin[v];
      gw[W - 2][v] = g[v];
    }
  }

  // dx: this row's dx at channel d0 (dx + b * dxs[0] + d0); cu: cu_seqlens pack.
  __device__ __forceinline__ void step(const Conv1dParams& p, int64_t t, const float (&xin)[V],
                                       const float (&gin)[V], T* dx, bool silu, bool cu) {
    if (cu && t < p.T && t >= sq.end) {  // a new sequence starts at t: its window is its initial state or zeros
      sq = find_sequence(p, b, t);
      vec_window<T, W, V>(p, b, t, sq, d0, win);
    }
    const int id = kRows ? 0 : (t < p.T ? static_cast<int>(sq.n) : -1);
    float g[V];
    token_g(xin, gin, silu, g);  // 0 past the row's end (gin is 0 there; kRows: also if d is not finite)
    if constexpr (kRows) {
#pragma unroll
      for (int v = 0; v < V; ++v) g[v] = t < p.T ? g[v] : 0.f;
    }
    if (t < t1) add_terms(xin, g);
    // Only taps of pos's own sequence count (rows: always; cu_seqlens: up to its end).
    const int64_t pos = t - (W - 1);
    if (pos >= t0) {
      const int pid = kRows ? 0 : (W > 1 ? gid[0] : id);
      float o[V];
      gather<kRows>(g, pid, id, o);
      if (p.dhT) {  // final_state slot j of pos's sequence copied x[pos] when pos is among its last W-1
        const int64_t e = cu ? cu_at(p, pid + 1) : p.T, n = cu ? pid : b;
        const int64_t j = pos - (e - (W - 1));
        if (j >= 0) {
#pragma unroll
          for (int v = 0; v < V; ++v)
            o[v] += ld_f32(p.dhT, p.dhT_dtype, n * p.dhTs[0] + (d0 + v) * p.dhTs[1] + j * p.dhTs[2]);
        }
      }
      store_vec<T, V>(dx + pos * p.dxs[1], o);
    }
    if constexpr (!kRows) {
#pragma unroll
      for (int i = 0; i < W - 2; ++i) gid[i] = gid[i + 1];
      gid[W - 2] = id;
    }
    shift(xin, g);
  }

  // step() for a token of the tile's interior (conv_bwd_lean's full chunks): t0 <= t < t1 <= T, and for a
  // cu_seqlens pack (!kRows) the caller has checked that t and every tap of the emitted position t - (W-1) lie
  // in the current sequence sq, before its last W-1 tokens (conv_bwd_lean's lean_chunk_ok); so there is no
  // row-end, tile-end, sequence or dfinal_state check, and the activation is a compile-time choice.
  // dx[t - (W-1)] is stored at dx + off when `emit` (false for the tile's first W-1 tokens, whose positions
  // belong to the previous tile). The same pieces as step(), so the same bits. The sequence ids of the gather
  // window are not tracked here: fast_run_done() sets them after the run.
  template <bool SILU>
  __device__ __forceinline__ void step_fast(const float (&xin)[V], const float (&gin)[V], T* dx, int64_t off,
                                            bool emit) {
    float g[V];
    token_g(xin, gin, SILU, g);
    add_terms(xin, g);
    if (emit) {
      float o[V];
      gather<true>(g, 0, 0, o);
      store_vec<T, V>(dx + off, o);
    }
    shift(xin, g);
  }

  // After a run of step_fast tokens (at least W - 1 of them, all in sequence sq; cu_seqlens packs): the g in the
  // gather window all belong to sq, for the step() that may follow. Once per run rather than a shift per token
  // (the ids of a pack are not needed inside the run).
  __device__ __forceinline__ void fast_run_done() {
    if constexpr (!kRows) {
#pragma unroll
      for (int i = 0; i < W - 1; ++i) gid[i] = static_cast<int>(sq.n);
    }
  }

  // The tile's dweight / dbias partial sums: [tile][W + 1][D], channel-contiguous (coalesced).
  __device__ __forceinline__ void store_partials(const Conv1dParams& p, float* partials, int64_t tile) const {
    float* part = partials + tile * (W + 1) * p.D + d0;
#pragma unroll
    for (int k = 0; k < W; ++k)
#pragma unroll
      for (int v = 0; v < V; ++v) part[k * p.D + v] = dwa[k][v];
#pragma unroll
    for (int v = 0; v < V; ++v) part[W * p.D + v] = dba[v];
  }
};

// Two channels per thread (4-byte bf16 loads, 8-byte f32) at five blocks per SM (<= 96 registers; at six,
// 80, W = 3 spilled): four channels needed 168 registers (three blocks, 12 warps per SM) and ran at 2.4 x
// floor (session 3 run 1).
constexpr int kBwdVec = 2;
template <class T, int W, int V>
__global__ void __launch_bounds__(kThreads, 5) conv_bwd_vec(const Conv1dParams p, int64_t groups, float* partials) {
  const ThreadWork tw = thread_work(p, kBwdTile, groups, V);
  if (!tw.active) return;
  BwdWalk<T, W, V> walk;
  walk.init(p, tw);
  const int64_t xs = p.xs[1], gs = p.dys[1];
  const T* x = static_cast<const T*>(p.x) + tw.b * p.xs[0] + tw.d0;
  const T* dy = static_cast<const T*>(p.dy) + tw.b * p.dys[0] + tw.d0;
  T* dx = static_cast<T*>(p.dx) + tw.b * p.dxs[0] + tw.d0;
  const bool silu = p.activation == kActSilu, cu = p.mode == kModeCuSeqlens;
  const int64_t tend = tw.t1 + W - 1;             // the taps of position t1 - 1 reach t1 + W - 2
  const int64_t tload = tend < p.T ? tend : p.T;  // g is 0 past the row's end
  constexpr int U = 8;  // tokens loaded ahead (packed: 8 x 2 registers of x and dy)
  for (int64_t tb = tw.t0; tb < tend; tb += U) {
    RawVec<T, V> xr[U], gr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (tb + u < tload) {
        xr[u] = load_raw<T, V>(x + (tb + u) * xs);
        gr[u] = load_raw<T, V>(dy + (tb + u) * gs);
      } else {
        xr[u] = RawVec<T, V>{};
        gr[u] = RawVec<T, V>{};
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (tb + u >= tend) break;
      float xin[V], gin[V];
      unpack<T, V>(xr[u], xin);
      unpack<T, V>(gr[u], gin);
      walk.step(p, tb + u, xin, gin, dx, silu, cu);
    }
  }
  walk.store_partials(p, partials, tw.tile);
}

// Backward pipe: 128 threads x 4 channels (a 1 KiB slab of a bf16 token row) x pipe_bwd_tile<W>() tokens of one row;
// the walk covers [t0, t1 + W - 1) as in conv_bwd_vec (the taps of the tile's last positions).
template <class T, int W, bool CU>
__global__ void __launch_bounds__(kThreads, pipe_bwd_blocks_per_sm<W>())
    conv_bwd_pipe(const Conv1dParams p, int64_t groups, float* partials) {
  constexpr int V = kPipeBwdV, S = kPipeStages;
  // 2 x 3 x 8 x 128 x 8 bytes = 48 KiB (the static limit): four blocks per SM.
  __shared__ __align__(16) RawVec<T, V> sx[S][kPipeChunk][kThreads];
  __shared__ __align__(16) RawVec<T, V> sg[S][kPipeChunk][kThreads];
  // Every thread takes part in the copies and barriers; only those with channels < D compute.
  const ThreadWork tw = thread_work(p, pipe_bwd_tile<W>(), groups, V);
  const int64_t slab = tw.d0 - static_cast<int64_t>(threadIdx.x) * V;
  const int64_t tend = tw.t1 + W - 1;
  const int64_t tload = tend < p.T ? tend : p.T;
  const int64_t nchunks = (tend - tw.t0 + kPipeChunk - 1) / kPipeChunk;  // the same for the whole block
  const T* xrow = static_cast<const T*>(p.x) + tw.b * p.xs[0];
  const T* grow = static_cast<const T*>(p.dy) + tw.b * p.dys[0];
  T* dx = static_cast<T*>(p.dx) + tw.b * p.dxs[0] + tw.d0;
  const bool silu = p.activation == kActSilu;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nchunks) {
      pipe_copy<T, V>(sx[s], xrow, p.xs[1], tw.t0 + s * kPipeChunk, tload, slab, p.D);
      pipe_copy<T, V>(sg[s], grow, p.dys[1], tw.t0 + s * kPipeChunk, tload, slab, p.D);
    }
    cuda::cp_async_commit();  // one group per chunk slot, empty or not: the wait count below stays exact
  }
  // Weights and the window's W-1 tokens (plain loads) while the first chunks are in flight.
  BwdWalk<T, W, V, !CU> walk;
  if (tw.active) walk.init(p, tw);
  for (int64_t c = 0; c < nchunks; ++c) {
    cuda::cp_async_wait<S - 2>();  // this thread's copies of chunk c have landed
    __syncthreads();               // everyone's have, and everyone is done with chunk c - 1's stage
    const int64_t cn = c + S - 1;
    if (cn < nchunks) {
      const int sn = static_cast<int>(cn % S);
      pipe_copy<T, V>(sx[sn], xrow, p.xs[1], tw.t0 + cn * kPipeChunk, tload, slab, p.D);
      pipe_copy<T, V>(sg[sn], grow, p.dys[1], tw.t0 + cn * kPipeChunk, tload, slab, p.D);
    }
    cuda::cp_async_commit();
    if (tw.active) {
      const int st = static_cast<int>(c % S);
      const int64_t tc = tw.t0 + c * kPipeChunk;
#pragma unroll
      for (int u = 0; u < kPipeChunk; ++u) {
        if (tc + u >= tend) break;
        float xin[V], gin[V];
        unpack<T, V>(sx[st][u][threadIdx.x], xin);
        unpack<T, V>(sg[st][u][threadIdx.x], gin);
        walk.step(p, tc + u, xin, gin, dx, silu, CU);
        pipe_group_fence(u);
      }
    }
  }
  cuda::cp_async_wait<0>();  // no copy outlives the block (the trailing groups are empty)
  if (tw.active) walk.store_partials(p, partials, tw.tile);
}

// ---- "cuda.sm90.lean" backward (16-bit activations, batch rows or cu_seqlens packs): conv_bwd_pipe's staging, ----
// a leaner token. conv_bwd_pipe runs the general BwdWalk::step for every token (run-time activation; row-end,
// tile-end, sequence and dfinal_state checks): ~52 issued instructions per (token, channel) at 158 registers (three
// blocks, 12 warps per SM), 0.647 ms = 1.7 x floor at bf16 B=4 T=8192 D=8192 W=4 SiLU, bound by issue more than by
// DRAM (ncu, s7run1: SM 63 %, DRAM 53 %). Here the chunks that lie inside [t0, t1) (and, in a cu_seqlens pack,
// inside one sequence: lean_chunk_ok) run BwdWalk::step_fast (compile-time activation, no per-token check but the
// dx emission of the tile's first W-1 tokens); the rest (a row's short last tile, the W-1 tokens past the tile,
// chunks that meet a sequence boundary or a sequence's last W-1 tokens, dfinal_state) runs step as before. 128
// registers for four blocks per SM (16 warps; 4 x 48 KiB of shared memory), 256-token tiles (that shape: 2048
// blocks = 3.9 waves of 528, and 2/3 of the partial sums of 192-token tiles). cu_seqlens packs (session 8): the
// pipe kernel took 0.744 ms there (s7run2, [1, 32768, 8192] W=4 N=6) against lean's 0.467 ms on dense rows; with
// sequences of hundreds of tokens, all but a few chunks per sequence still take step_fast.
constexpr int kLeanTile = 256;

// cp.async of 16 bytes to a shared-memory address (zero-filled without reading when !valid).
__device__ __forceinline__ void cp_async16_shared(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// conv_bwd_lean's copies of x and dy into their stages [S][kPipeChunk][kThreads] of 4-channel vectors (8 bytes):
// a chunk row (one token, the block's 512 channels) is 64 pieces of 16 bytes, so thread i copies piece i % 64 of
// rows i / 64 + 2k, k < 4, of every chunk, for both tensors. The source pointers advance by one chunk per
// issue(); the token strides and the zero-fill source (any valid address: nothing is read) come from the
// kernel parameters, so the state between chunks is 2 pointers, 3 integers and a flag (pipe_copy recomputed a
// 64-bit address and a 64-bit bound per piece: ~30 instructions per cp.async in the SASS of conv_bwd_pipe, ~240
// per chunk).
template <class T>
struct LeanCopies {
  static constexpr int kRowBytes = kThreads * kPipeBwdV * static_cast<int>(sizeof(T));  // 1 KiB
  static constexpr int kPiecesPerRow = kRowBytes / 16;                                 // 64
  static constexpr int kRowsPerPass = kThreads / kPiecesPerRow;                        // 2
  static constexpr int kPerThread = kPipeChunk / kRowsPerPass;                         // 4
  static constexpr int kStageBytes = kPipeChunk * kRowBytes;                           // 8 KiB
  static_assert(kThreads % kPiecesPerRow == 0 && kPipeChunk % kRowsPerPass == 0, "whole rows per pass");
  const char *sx, *sg;  // this thread's piece of the next chunk's first row, x and dy
  uint32_t dx, dg;      // shared addresses of this thread's piece in stage 0
  int rel, rel_end;     // the next chunk's first row of this thread and tload, relative to t0
  bool dok;             // the piece's channels are < D (D % 8 == 0: a piece is all in or all out)

  __device__ __forceinline__ void init(const Conv1dParams& p, const ThreadWork& tw, int64_t tload, int64_t slab,
                                       const void* xstage0, const void* gstage0) {
    const int r0 = static_cast<int>(threadIdx.x) / kPiecesPerRow, c = static_cast<int>(threadIdx.x) % kPiecesPerRow;
    const int64_t d = slab + 8 * c;
    dok = d < p.D;
    const int64_t dd = dok ? d : 0;
    sx = reinterpret_cast<const char*>(static_cast<const T*>(p.x) + tw.b * p.xs[0] + (tw.t0 + r0) * p.xs[1] + dd);
    sg = reinterpret_cast<const char*>(static_cast<const T*>(p.dy) + tw.b * p.dys[0] + (tw.t0 + r0) * p.dys[1] + dd);
    const uint32_t off = static_cast<uint32_t>(r0 * kRowBytes + c * 16);
    dx = static_cast<uint32_t>(__cvta_generic_to_shared(xstage0)) + off;
    dg = static_cast<uint32_t>(__cvta_generic_to_shared(gstage0)) + off;
    rel = r0;
    rel_end = static_cast<int>(tload - tw.t0);
  }
  // Copies the next chunk of x and dy into `stage` (rows at or past tload, and channels >= D, zero-filled).
  __device__ __forceinline__ void issue(const Conv1dParams& p, int stage) {
    const int64_t xb = p.xs[1] * static_cast<int64_t>(sizeof(T)), gb = p.dys[1] * static_cast<int64_t>(sizeof(T));
    const uint32_t so = static_cast<uint32_t>(stage * kStageBytes);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const bool ok = dok && rel + kRowsPerPass * k < rel_end;
      const uint32_t o = so + static_cast<uint32_t>(k * kRowsPerPass * kRowBytes);
      cp_async16_shared(dx + o, ok ? sx + k * kRowsPerPass * xb : static_cast<const char*>(p.x), ok);
      cp_async16_shared(dg + o, ok ? sg + k * kRowsPerPass * gb : static_cast<const char*>(p.dy), ok);
    }
    sx += kPipeChunk * xb;
    sg += kPipeChunk * gb;
    rel += kPipeChunk;
  }
};

// Whether chunk c (tokens [tc, tc + kPipeChunk), tc + kPipeChunk <= t1) of a cu_seqlens pack can take step_fast:
// every token in the current sequence sq (so no sequence starts inside it) and none of its emitted positions
// tc + u - (W-1) before sq's start (their taps would cross into the previous sequence) or among sq's last W-1
// tokens (dfinal_state terms). Chunk 0's first W-1 tokens emit nothing (their positions are the previous
// tile's), so there only its tokens must start at or after sq.start (true unless cu_seqlens[0] > 0).
// The same for every thread of the block (a tile's tokens, sq and c are the block's).
template <int W>
__device__ __forceinline__ bool lean_chunk_ok(const SeqSpan& sq, int64_t tc, int c) {
  return tc + kPipeChunk <= sq.end && tc - (c == 0 ? 0 : W - 1) >= sq.start;
}

template <class T, int W, bool SILU, bool CU>
__global__ void __launch_bounds__(kThreads, 4) conv_bwd_lean(const Conv1dParams p, int64_t groups, float* partials) {
  constexpr int V = kPipeBwdV, S = kPipeStages;
  __shared__ __align__(16) RawVec<T, V> sx[S][kPipeChunk][kThreads];  // 2 x 24 KiB, as conv_bwd_pipe
  __shared__ __align__(16) RawVec<T, V> sg[S][kPipeChunk][kThreads];
  static_assert(sizeof(sx[0]) == LeanCopies<T>::kStageBytes, "stage layout");
  static_assert(kPipeChunk >= W - 1, "a fast chunk refills the whole gather window (fast_run_done)");
  // Every thread takes part in the copies and barriers; only those with channels < D compute.
  const ThreadWork tw = thread_work(p, kLeanTile, groups, V);
  const int64_t slab = tw.d0 - static_cast<int64_t>(threadIdx.x) * V;
  const int64_t tend = tw.t1 + W - 1;  // the taps of position t1 - 1 reach t1 + W - 2
  const int64_t tload = tend < p.T ? tend : p.T;
  const int nchunks = static_cast<int>((tend - tw.t0 + kPipeChunk - 1) / kPipeChunk);  // <= 33, whole block
  const int nfast = static_cast<int>((tw.t1 - tw.t0) / kPipeChunk);                      // chunks inside [t0, t1)
  T* dx = static_cast<T*>(p.dx) + tw.b * p.dxs[0] + tw.d0;
  const int64_t dxs = p.dxs[1];
  LeanCopies<T> cp;
  cp.init(p, tw, tload, slab, &sx[0][0][0], &sg[0][0][0]);
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nchunks) cp.issue(p, s);
    cuda::cp_async_commit();  // one group per chunk slot, empty or not: the wait count below stays exact
  }
  BwdWalk<T, W, V, !CU> walk;
  if (tw.active) walk.init(p, tw);
  int st = 0, sn = S - 1;  // the stage computed and the stage copied into in this iteration
  for (int c = 0; c < nchunks; ++c) {
    cuda::cp_async_wait<S - 2>();  // this thread's copies of chunk c have landed
    __syncthreads();               // everyone's have, and everyone is done with chunk c - 1's stage
    if (c + S - 1 < nchunks) cp.issue(p, sn);
    cuda::cp_async_commit();
    sn = sn + 1 == S ? 0 : sn + 1;
    if (tw.active) {
      const int64_t tc = tw.t0 + static_cast<int64_t>(c) * kPipeChunk;
      if (c < nfast && (!CU || lean_chunk_ok<W>(walk.sq, tc, c))) {
        const bool later = c > 0;  // the first chunk's first W-1 tokens emit no dx (their positions are < t0)
#pragma unroll
        for (int u = 0; u < kPipeChunk; ++u) {
          float xin[V], gin[V];
          unpack<T, V>(sx[st][u][threadIdx.x], xin);
          unpack<T, V>(sg[st][u][threadIdx.x], gin);
          walk.template step_fast<SILU>(xin, gin, dx, (tc + u - (W - 1)) * dxs, later || u >= W - 1);
          pipe_group_fence(u);
        }
        walk.fast_run_done();  // kPipeChunk >= W - 1 tokens of sq
      } else {
#pragma unroll
        for (int u = 0; u < kPipeChunk; ++u) {
          if (tc + u >= tend) break;
          float xin[V], gin[V];
          unpack<T, V>(sx[st][u][threadIdx.x], xin);
          unpack<T, V>(sg[st][u][threadIdx.x], gin);
          walk.step(p, tc + u, xin, gin, dx, SILU, CU);
          pipe_group_fence(u);
        }
      }
    }
    st = st + 1 == S ? 0 : st + 1;
  }
  cuda::cp_async_wait<0>();  // no copy outlives the block (the trailing groups are empty)
  if (tw.active) walk.store_partials(p, partials, tw.tile);
}

inline bool aligned_to(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

template <class T>
strata_status launch_fwd_vec(const Conv1dParams& p, cudaStream_t stream) {
  constexpr int V = 4;
  // Pointer alignment is only known now: a misaligned call takes the time_tile kernels (same results).
  if (!aligned_to(p.x, 16) || !aligned_to(p.y, 16) || (p.residual && !aligned_to(p.residual, 16)))
    return static_cast<strata_status>(causal_conv1d_fwd_cuda(p, stream));
  const int64_t groups = p.D / V;
  unsigned g = 0;
  STRATA_RETURN_IF_ERROR(grid_of("causal_conv1d_fwd", grid_for(p, kVecFwdTile, groups), &g));
  if (g > 0) {
    const bool cu = p.mode == kModeCuSeqlens;
    with_width(p, [&](auto w) {
      constexpr int W = decltype(w)::value;
      if (p.residual) {
        if (cu) conv_fwd_vec<T, W, V, true, true><<<g, kThreads, 0, stream>>>(p, groups);
        else conv_fwd_vec<T, W, V, true, false><<<g, kThreads, 0, stream>>>(p, groups);
      } else {
        if (cu) conv_fwd_vec<T, W, V, false, true><<<g, kThreads, 0, stream>>>(p, groups);
        else conv_fwd_vec<T, W, V, false, false><<<g, kThreads, 0, stream>>>(p, groups);
      }
    });
    STRATA_RETURN_IF_ERROR(cuda::check_launch("causal_conv1d_fwd (conv_fwd_vec)"));
  }
  return launch_fwd_states(p, stream);
}

// The tiled backward launches (vec, pipe, lean): V channels per thread, `tile` tokens per block and partial-sum
// row; launch(grid, groups, w) starts the kernel for the problem's width w, then the launch check and the
// fixed-order partial-sum reduction. The workspace (causal_conv1d_cuda_bwd_workspace) holds a partial row per
// kBwdTile tokens: tiles of at least that many tokens fit.
template <int V, class Launch>
strata_status launch_bwd_tiles(const Conv1dParams& p, float* partials, cudaStream_t stream, int64_t tile,
                               const char* what, Launch&& launch) {
  const int64_t tiles = p.B * tiles_per_row(p, tile);
  const int64_t groups = p.D / V;
  unsigned g = 0;
  STRATA_RETURN_IF_ERROR(grid_of("causal_conv1d_bwd", grid_for(p, tile, groups), &g));
  if (g > 0) {
    strata_status st = STRATA_SUCCESS;
    with_width(p, [&](auto w) { st = launch(g, groups, w); });
    STRATA_RETURN_IF_ERROR(st);
    STRATA_RETURN_IF_ERROR(cuda::check_launch(what));
  }
  return launch_bwd_reduce(p, partials, tiles, stream);
}
static_assert(pipe_bwd_tile<4>() >= kBwdTile && pipe_bwd_tile<2>() >= kBwdTile && kLeanTile >= kBwdTile,
              "the workspace holds tiles of kBwdTile tokens");

// x, dy and dx can be read / written in 16-byte pieces (else the vec kernels fall back to time_tile and the
// staged ones to vec; same results).
inline bool bwd_aligned(const Conv1dParams& p) { return aligned_to(p.x, 16) && aligned_to(p.dy, 16) && aligned_to(p.dx, 16); }

template <class T>
strata_status launch_bwd_vec(const Conv1dParams& p, float* partials, cudaStream_t stream) {
  if (!bwd_aligned(p)) return static_cast<strata_status>(causal_conv1d_bwd_cuda(p, partials, stream));
  return launch_bwd_tiles<kBwdVec>(p, partials, stream, kBwdTile, "causal_conv1d_bwd (conv_bwd_vec)",
                                   [&](unsigned g, int64_t groups, auto w) {
                                     conv_bwd_vec<T, decltype(w)::value, kBwdVec><<<g, kThreads, 0, stream>>>(p, groups, partials);
                                     return STRATA_SUCCESS;
                                   });
}

// Launches a staged kernel (pipe, lean: 3-4 x 48 KiB of shared memory per SM) on `grid` blocks with the whole
// shared-memory carveout (the default split may keep more L1 and fewer resident blocks).
template <class K, class... A>
strata_status launch_staged(K* kernel, unsigned grid, cudaStream_t stream, const A&... args) {
  STRATA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  kernel<<<grid, kThreads, 0, stream>>>(args...);
  return STRATA_SUCCESS;
}

template <class T>
strata_status launch_fwd_pipe(const Conv1dParams& p, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return static_cast<strata_status>(causal_conv1d_fwd_cuda_vec(p, stream));  // not reached: the plan takes 16-bit activations only
  } else {
    // cp.async reads 16-byte pieces of x; y is written 16 bytes per thread. A misaligned call (or one with a
    // residual: not reached, the plan rejects it) takes the register-streaming kernels (same results).
    if (p.residual || !aligned_to(p.x, 16) || !aligned_to(p.y, 16)) return static_cast<strata_status>(causal_conv1d_fwd_cuda_vec(p, stream));
    constexpr int V = kPipeFwdV;
    const int64_t groups = p.D / V;
    unsigned g = 0;
    STRATA_RETURN_IF_ERROR(grid_of("causal_conv1d_fwd", grid_for(p, kPipeFwdTile, groups), &g));
    if (g > 0) {
      auto go = [&](auto* kernel) { return launch_staged(kernel, g, stream, p, groups); };
      const bool cu = p.mode == kModeCuSeqlens;
      strata_status st = STRATA_SUCCESS;
      with_width(p, [&](auto w) {
        st = cu ? go(conv_fwd_pipe<T, decltype(w)::value, true>) : go(conv_fwd_pipe<T, decltype(w)::value, false>);
      });
      STRATA_RETURN_IF_ERROR(st);
      STRATA_RETURN_IF_ERROR(cuda::check_launch("causal_conv1d_fwd (conv_fwd_pipe)"));
    }
    return launch_fwd_states(p, stream);
  }
}

// The staged backward launches (pipe, lean): 128 threads x kPipeBwdV channels, cp.async staging with the whole
// shared-memory carveout (launch_staged); a misaligned call takes the register-streaming kernels.
template <class T>
strata_status launch_bwd_pipe(const Conv1dParams& p, float* partials, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return static_cast<strata_status>(causal_conv1d_bwd_cuda_vec(p, partials, stream));  // not reached: the plan takes 16-bit activations only
  } else {
    if (!bwd_aligned(p)) return static_cast<strata_status>(causal_conv1d_bwd_cuda_vec(p, partials, stream));
    const bool cu = p.mode == kModeCuSeqlens;
    return launch_bwd_tiles<kPipeBwdV>(p, partials, stream, pipe_bwd_tile(p.W), "causal_conv1d_bwd (conv_bwd_pipe)",
                                       [&](unsigned g, int64_t groups, auto w) {
                                         constexpr int W = decltype(w)::value;  // tiles of pipe_bwd_tile<W>()
                                         auto* k = cu ? conv_bwd_pipe<T, W, true> : conv_bwd_pipe<T, W, false>;
                                         return launch_staged(k, g, stream, p, groups, partials);
                                       });
  }
}

template <class T>
strata_status launch_bwd_lean(const Conv1dParams& p, float* partials, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return static_cast<strata_status>(causal_conv1d_bwd_cuda_vec(p, partials, stream));  // not reached: the plan takes 16-bit activations only
  } else {
    // Batch rows or cu_seqlens packs (causal_conv1d_lean_reason; seq_idx takes neither).
    if (p.mode != kModeRows && p.mode != kModeCuSeqlens) return static_cast<strata_status>(causal_conv1d_bwd_cuda_pipe(p, partials, stream));
    if (!bwd_aligned(p)) return static_cast<strata_status>(causal_conv1d_bwd_cuda_vec(p, partials, stream));
    const bool silu = p.activation == kActSilu, cu = p.mode == kModeCuSeqlens;
    return launch_bwd_tiles<kPipeBwdV>(
        p, partials, stream, kLeanTile, "causal_conv1d_bwd (conv_bwd_lean)", [&](unsigned g, int64_t groups, auto w) {
          constexpr int W = decltype(w)::value;
          auto* k = cu ? (silu ? conv_bwd_lean<T, W, true, true> : conv_bwd_lean<T, W, false, true>)
                       : (silu ? conv_bwd_lean<T, W, true, false> : conv_bwd_lean<T, W, false, false>);
          return launch_staged(k, g, stream, p, groups, partials);
        });
  }
}

}  // namespace

// The entry points: f(T{}) with T the activation dtype's storage type (f32, bf16, f16; the plans allow no other).
template <class F>
int by_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case STRATA_DTYPE_F32: return f(float{});
    case STRATA_DTYPE_BF16: return f(bf16_t{});
    default: return f(f16_t{});
  }
}

}  // namespace strata::conv
