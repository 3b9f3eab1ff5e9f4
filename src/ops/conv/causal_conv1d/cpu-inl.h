// CPU kernels of causal_conv1d, forward and backward, written once with Highway and compiled for every
// target in tile::cpu_isas() (one implementation "cpu.<isa>" each).
//
// Channels are the vector dimension. Work items are (time tile of kTimeTile tokens of one row, channel chunk
// of kFwdChan / kBwdChan channels); an item sweeps its tokens in order, each token row read with full-width loads (the
// W-1 previous rows it also reads are still in the caches). The weights and bias are staged once per
// call as f32 [W][D]. Tokens whose taps all read x of the same sequence (all but the first W-1 of each
// sequence, and those next to a seq_idx change) take the vector path, unrolled for W = 2, 3, 4; the others,
// and every token of tensors without unit channel stride, take the element-wise path of causal_conv1d.h
// (sources from the initial state, masked taps).
//
// Backward: an item first computes g = dy * act'(u) (u recomputed) for its tokens and the W-1 after them into
// an f32 buffer [kTimeTile + W - 1][chunk], accumulating dweight/dbias over its own tokens in t order, then
// gathers dx[p] = sum_i w[W-1-i] g[p+i]. Each item writes its partial sums to the workspace row of its time
// tile ([tile][W + 1][D] f32); a second pass adds the tiles in index order. The split is fixed (items never
// depend on the thread count) and no float is added by two threads, so the bits are the same for any number
// of threads (tests/cpp/test_causal_conv1d.cpp checks 1 vs 2).
//
// Build layout (build time is a budget, STYLE.md 12): the kernels live only in this file. The units
// cpu_fwd_{f32,bf16,f16}.cpp and cpu_bwd_{f32,bf16,f16}.cpp (the forward / backward for one activation dtype; the
// backward was one unit for all three dtypes until session 15, the longest compile of the build) each include it for every target (tile/cpu/foreach_isa.h) and instantiate their part, so they compile in
// parallel; cpu.cpp declares the units' entry points, dispatches on the dtype and owns the HWY_EXPORT tables.
// The "native bf16" instances (cpu.avx512_bf16: bf16 outputs rounded by AVX512-BF16) exist only on AVX3
// (STRATA_NATIVE_BF16) and only for bf16; every other native entry runs the portable instance.
//
// Per-target include guard (Highway's convention for -inl.h files).
#if defined(STRATA_OPS_CONV_CAUSAL_CONV1D_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_OPS_CONV_CAUSAL_CONV1D_CPU_INL_H_
#undef STRATA_OPS_CONV_CAUSAL_CONV1D_CPU_INL_H_
#else
#define STRATA_OPS_CONV_CAUSAL_CONV1D_CPU_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "ops/conv/causal_conv1d/causal_conv1d.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#define STRATA_WANT_AVX512_BF16  // the "cpu.avx512_bf16" instances (tile/cpu/vec-inl.h)
#include "tile/cpu/vec-inl.h"
#include "tile/cpu/math-inl.h"
#include "tile/cpu/sigmoid_nodiv-inl.h"

#ifndef STRATA_CONV1D_CPU_CONSTANTS_
#define STRATA_CONV1D_CPU_CONSTANTS_
namespace strata::conv {
// Tokens per work item: the halo (W-1 extra rows of g in the backward) costs (W-1)/kTimeTile.
inline constexpr int64_t kTimeTile = 64;
// Channels per work item. Pieces of 1 KiB of 16 KiB rows (512 bf16 channels) defeated the hardware
// prefetchers (each piece sits in another 4 KiB page) and ran at a fifth of the copy rate, so the forward
// prefetches in software the same channels of the next token while it computes a token (FwdRow's `next`); with
// that, 1024 channels keep the staged f32 weights and bias (W + 1) x 4 KiB and the W tap rows in L1 (at 8192
// channels every vector needed W weight loads from L2). The backward keeps g for the tile and the W-1 tokens
// after it, (64 + W-1) x kBwdChan f32 = 0.5 MiB at 2048 channels, in L2.
inline constexpr int64_t kFwdChan = 1024;
inline constexpr int64_t kBwdChan = 2048;
}  // namespace strata::conv
// The column sweeps' per-token lambdas: inlined, so that the compile-time window rotation resolves to registers.
#define STRATA_CONV_ALWAYS_INLINE __attribute__((always_inline))
#endif

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3  // as in tile/cpu/vec-inl.h: lets the native-bf16 instances use AVX512-BF16
#pragma GCC target("avx512bf16")
#endif
namespace strata::conv::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace tv = strata::tile::HWY_NAMESPACE;

// ---- the units' entry points (defined in cpu_fwd_<dtype>.cpp and cpu_bwd_<dtype>.cpp, called by cpu.cpp) ----
void CausalConv1dFwdF32(const Conv1dParams& p);
void CausalConv1dFwdBf16(const Conv1dParams& p);
void CausalConv1dFwdF16(const Conv1dParams& p);
void CausalConv1dBwdF32(const Conv1dParams& p, float* partials);
void CausalConv1dBwdBf16(const Conv1dParams& p, float* partials);
void CausalConv1dBwdF16(const Conv1dParams& p, float* partials);
#if STRATA_NATIVE_BF16
void CausalConv1dFwdBf16Native(const Conv1dParams& p);
void CausalConv1dBwdBf16Native(const Conv1dParams& p, float* partials);
#endif

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Which column sweeps this target compiles (session 16): the split sweeps (BwdSweepSplit, FwdColumnsSplit:
// passes over an L1 scratch, every tile of a sequence) on AVX2, SSE4 and the scalar fallback, where they were
// measured faster on the AMD EPYC (AVX2) development VM; AVX-512 keeps the session-15 sweeps (BwdSweep,
// FwdColumns: 32 registers hold their state without spills), since no AVX-512 machine could time the split ones
// in session 16 (README, Performance: the Xeon A/B is pending).
inline constexpr bool kSplitSweeps = !STRATA_HWY_IS_AVX512;

// sigma(u) = 1 / (1 + exp(-u)) for the activations' dtype T: for bf16/f16 a reduced-precision one (relative error
// < 1e-6 + 7.5e-8 |u|, far below their rounding; the kernels are compute-bound on the sigmoid): SigmoidLp on
// AVX-512, elsewhere SigmoidLpNoDiv (tile/cpu/sigmoid_nodiv-inl.h, session 16: no division, ~16 vector operations
// instead of ~21 and a vdivps); for f32 the f32-accurate FastSigmoid of tile/cpu/math-inl.h.
template <class T>
HWY_INLINE VF Sigmoid(DF df, VF u) {
  if constexpr (sizeof(T) == 2) return tv::SigmoidLpNoDiv(df, u);  // AVX-512 and scalar: SigmoidLp
  else return tv::SigmoidFor<T>(df, u);
}
// g = dy act'(u) for SiLU, act'(u) = s (1 + u (1 - s)) with s = sigma(u), written (dy s)(1 + u - u s): after s
// two operations remain on the dependency chain (an FNMA and a multiply) instead of four.
// AVX-512 keeps the session-15 expression dy (s (1 + u (1 - s))) (its kernels' bits unchanged, see kSplitSweeps).
// SiluGradS: the same from s = sigma(u) already computed (BwdSweepSplit's array form, several vectors' sigmoids
// at once).
HWY_INLINE VF SiluGradS(DF df, VF u, VF s, VF dy) {
  const VF one = hn::Set(df, 1.f);
#if STRATA_HWY_IS_AVX512
  return hn::Mul(dy, hn::Mul(s, hn::MulAdd(u, hn::Sub(one, s), one)));
#else
  return hn::Mul(hn::Mul(dy, s), hn::NegMulAdd(u, s, hn::Add(one, u)));
#endif
}
template <class T>
HWY_INLINE VF SiluGrad(DF df, VF u, VF dy) {
  return SiluGradS(df, u, Sigmoid<T>(df, u), dy);
}
// The forward's: y = u sigma(u) (+ residual) is rounded straight to T and read by nothing else, so bf16/f16 take
// SigmoidOut16 on AVX-512 (relative error < 1.4e-4, 0.07 of a bf16 half-ulp; 8 vector operations instead of 13,
// session 11) and SigmoidOut16NoDiv elsewhere (the same bound; 14 operations, no division; session 16).
template <class T>
HWY_INLINE VF SigmoidFwd(DF df, VF u) {
  if constexpr (sizeof(T) == 2) return tv::SigmoidOut16NoDiv(df, u);
  else return Sigmoid<T>(df, u);
}

// Copies one 64-byte line (src: any alignment, dst: aligned to the vector) with non-temporal stores of whole
// vectors: the column sweeps' dx rows, gathered in L1 per line so that the streamed lines are complete.
template <class T>
HWY_INLINE void StreamLine(const T* HWY_RESTRICT src, T* HWY_RESTRICT dst) {
  const hn::ScalableTag<uint8_t> du8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(du8));
  const uint8_t* s = reinterpret_cast<const uint8_t*>(src);
  uint8_t* d = reinterpret_cast<uint8_t*>(dst);
  for (int64_t k = 0; k < 64; k += L) hn::Stream(hn::LoadU(du8, s + k), du8, d + k);
}

#if HWY_TARGET == HWY_AVX2
// u + 0x7fff + lsb (u: the bits of v, lsb: the lowest bit kept): v rounded to bf16 (nearest even) in the high half
// of each lane; for non-NaN v (the callers test for NaN first).
HWY_INLINE __m256i Bf16RoundHigh(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i bias =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
  return _mm256_add_epi32(u, bias);
}
#endif
// Two token rows' outputs of one vector of channels (dx[t], dx[t + 1] or y[t], y[t + 1]) rounded to T and stored, as
// StoreOut<false, kNative> twice, with the same bits (session 17). AVX2 bf16: each vector's integer rounding to
// nearest even (Bf16Bits' without its NaN blend), one vpackusdw + vpermq for both, the two 16-byte halves stored to
// their rows (vmovdqu, vextracti128), and one NaN test for the pair (vcmpunordps + vtestps; a pair with a NaN takes
// StoreOut, which quiets it): 7 vector operations per vector instead of StoreOut's 11 (compare, quieting OR and
// blend, pack, permute, store each). Other targets and dtypes: StoreOut twice.
template <bool kNative, class T>
HWY_INLINE void StoreRows2(DF df, VF a, VF b, T* HWY_RESTRICT pa, T* HWY_RESTRICT pb) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<T, bf16_t>) {
    const __m256 unord = _mm256_cmp_ps(a.raw, b.raw, _CMP_UNORD_Q);
    if (HWY_LIKELY(_mm256_testz_ps(unord, unord))) {
      auto round = [](__m256 v) { return _mm256_srli_epi32(Bf16RoundHigh(v), 16); };
      // Lanes in [0, 0xffff]: the signed-to-unsigned pack keeps them; it packs per 128-bit half (a lo, b lo, a hi,
      // b hi), vpermq 0xD8 makes that (a lo, a hi, b lo, b hi).
      const __m256i ab = _mm256_permute4x64_epi64(_mm256_packus_epi32(round(a.raw), round(b.raw)), 0xD8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pa), _mm256_castsi256_si128(ab));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pb), _mm256_extracti128_si256(ab, 1));
      return;
    }
  }
#endif
  tv::StoreOut<false, kNative>(df, a, pa);
  tv::StoreOut<false, kNative>(df, b, pb);
}

// The product u sigma(u) as rounded, before the residual is added (bf16 in FwdSweepSplit's four-token loop): GCC
// contracts a multiply and an add that meet in one basic block into an FMA (its default -ffp-contract=fast), which it
// did for some of the four tokens once the loop was reshaped for StoreRows2 (1 bf16 ulp off the token-by-token form's
// bits in some outputs, session 17); the empty asm hides the product's origin. Not for f16, whose build before
// session 17 fused them already (the bits of main 3524d4d are kept; compared bitwise, README, Performance, CPU).
HWY_INLINE VF Rounded(VF v) {
#if HWY_ARCH_X86
  asm("" : "+x"(v.raw));
#endif
  return v;
}

// The next work item's rows, brought into L2 while the current item computes. The column sweeps walk one
// line of each of ~70 token rows (~70 pages per tensor) at a time, too many concurrent streams for the L2
// hardware prefetcher, so without this every line came from DRAM on demand, one column ahead (the fill buffers
// bound that to about half the copy rate per core). Walking the next item's rectangle in row order instead
// gives the prefetcher one page at a time to follow. The rectangle: `rows` rows of `row_lines` 64-byte lines of
// up to two tensors (row strides in bytes); `Take(n)` hands out the next run of at most n lines of one row,
// which a sweep prefetches one line per token step.
struct RegionPrefetch {
  const char* a = nullptr;
  const char* b = nullptr;  // optional second tensor of the same shape
  int64_t sa = 0, sb = 0, rows = 0, row_lines = 0;
  int64_t row = 0, line = 0;
  struct Run {
    const char* a = nullptr;
    const char* b = nullptr;  // == a when there is no second tensor
    int64_t n = 0;
  };
  Run Take(int64_t n) {
    Run r;
    if (row >= rows) return r;
    r.a = a + row * sa + line * 64;
    r.b = b ? b + row * sb + line * 64 : r.a;
    r.n = std::min(n, row_lines - line);
    line += r.n;
    if (line == row_lines) {
      line = 0;
      ++row;
    }
    return r;
  }
};

// ---- forward: one token row of a chunk on the vector path ----
// rows[k]: the source row of tap k (x at t - (W-1) + k, chunk start); wt [W][nc], bt [nc] staged f32.
template <int KW, bool kSilu, bool kNative, bool kStream, class T>
HWY_NOINLINE void FwdRow(int W, const T* const* rows, const float* HWY_RESTRICT wt, int64_t ws,
                         const float* HWY_RESTRICT bt, int64_t nc, const T* HWY_RESTRICT res, T* HWY_RESTRICT y,
                         const T* HWY_RESTRICT next) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int Wn = KW ? KW : W;
  constexpr int64_t kStep = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(T));
  int64_t j = 0;
  for (; j + N <= nc; j += N) {
    // The newest tap's row came from memory (prefetched during the previous token, whose `next` it was); the
    // older ones were read for the previous tokens. next: the same channels of the following token.
    if (next) tv::PrefetchAhead<kStep, 0>(next + j);
    VF acc = hn::LoadU(df, bt + j);
    for (int k = 0; k < Wn; ++k) acc = hn::MulAdd(hn::LoadU(df, wt + k * ws + j), tv::LoadF32(df, rows[k] + j), acc);
    if constexpr (kSilu) acc = hn::Mul(acc, SigmoidFwd<T>(df, acc));
    if (res) acc = hn::Add(acc, tv::LoadF32(df, res + j));
    tv::StoreOut<kStream, kNative>(df, acc, y + j);
  }
  for (; j < nc; ++j) {
    float acc = bt[j];
    for (int k = 0; k < Wn; ++k) acc = std::fma(wt[k * ws + j], to_f32(rows[k][j]), acc);
    if constexpr (kSilu) acc = acc / (1.f + std::exp(std::min(-acc, 88.f)));
    if (res) acc += to_f32(res[j]);
    y[j] = from_f32<T>(acc);
  }
}

// ---- forward: a whole time tile whose tokens all take the vector path, swept column by column ----
// Columns of 2 vectors (one 64-byte line of bf16) walk the tile's tokens in order with the W-1 previous x
// vectors kept converted in registers and the chunk's weights and bias in registers: each x element is loaded
// and converted once instead of W times (FwdRow reads every tap row), and no weight is reloaded per token. The
// arithmetic is FwdRow's (bias, then the taps in k order), so the results are the same bits. x0 / y0 / r0:
// token t0 of the tile at the chunk's first channel; xs / ys / rs: token strides; nt tokens.
template <int KW, bool kSilu, bool kNative, bool kStream, class T>
HWY_NOINLINE void FwdColumns(const T* HWY_RESTRICT x0, int64_t xs, const float* HWY_RESTRICT wt, int64_t ws,
                             const float* HWY_RESTRICT bt, int64_t nc, const T* HWY_RESTRICT r0, int64_t rs,
                             T* HWY_RESTRICT y0, int64_t ys, int64_t nt) {
  static_assert(KW >= 2, "the column sweep is unrolled for W = 2, 3, 4");
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto column = [&](int64_t j, auto nv_tag) {
    constexpr int NV = decltype(nv_tag)::value;
    VF w[NV][KW], bv[NV], win[NV][KW - 1];
    for (int v = 0; v < NV; ++v) {
      bv[v] = hn::LoadU(df, bt + j + v * N);
      for (int k = 0; k < KW; ++k) w[v][k] = hn::LoadU(df, wt + k * ws + j + v * N);
      for (int k = 0; k < KW - 1; ++k) win[v][k] = tv::LoadF32(df, x0 + (k - (KW - 1)) * xs + j + v * N);
    }
    for (int64_t t = 0; t < nt; ++t) {
      // The next column's line of this token: used one column sweep (nt tokens) later.
      tv::PrefetchAhead<64, 0>(x0 + t * xs + j + NV * N);
      for (int v = 0; v < NV; ++v) {
        const VF xc = tv::LoadF32(df, x0 + t * xs + j + v * N);
        VF acc = bv[v];
        for (int k = 0; k < KW - 1; ++k) acc = hn::MulAdd(w[v][k], win[v][k], acc);
        acc = hn::MulAdd(w[v][KW - 1], xc, acc);
        if constexpr (kSilu) acc = hn::Mul(acc, SigmoidFwd<T>(df, acc));
        if (r0) acc = hn::Add(acc, tv::LoadF32(df, r0 + t * rs + j + v * N));
        tv::StoreOut<kStream, kNative>(df, acc, y0 + t * ys + j + v * N);
        for (int k = 0; k + 1 < KW - 1; ++k) win[v][k] = win[v][k + 1];
        win[v][KW - 2] = xc;
      }
    }
  };
  int64_t j = 0;
  for (; j + 2 * N <= nc; j += 2 * N) column(j, std::integral_constant<int, 2>{});
  for (; j + N <= nc; j += N) column(j, std::integral_constant<int, 1>{});
  for (; j < nc; ++j) {
    for (int64_t t = 0; t < nt; ++t) {
      float acc = bt[j];
      for (int k = 0; k < KW; ++k) acc = std::fma(wt[k * ws + j], to_f32(x0[(t - (KW - 1) + k) * xs + j]), acc);
      if constexpr (kSilu) acc = acc / (1.f + std::exp(std::min(-acc, 88.f)));
      if (r0) acc += to_f32(r0[t * rs + j]);
      y0[t * ys + j] = from_f32<T>(acc);
    }
  }
}

// The column sweeps' walk with non-temporal output stores, which must write whole 64-byte lines while one sweep
// (one vector) fills only part of a line (half of one on AVX-512 for bf16, a quarter on AVX2): the sweeps of a
// line's vectors write their rows into one of two line buffers (`line`: [2][kTimeTile][64 bytes], L1), and the
// first sweep of the next line group streams the previous group's lines out, one per token step (a burst of 64
// line stores after each group would stall on the fill buffers); the last group's after the loop.
// sweep(c, out, outs, lines, lines_to, nlines): one sweep at channel c writing its row t to out + t * outs and
// streaming nlines lines from `lines` to lines_to (row stride outs0). Returns the channels covered (whole groups).
// kPer: vectors of channels per sweep (2: FwdSweepSplitEO).
template <class T, int kPer = 1, class Sweep>
HWY_INLINE int64_t SweepLineGroups(int64_t nc, int64_t nt, T* line, T* out0, int64_t outs0, Sweep&& sweep) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  constexpr int64_t kLineElems = 64 / static_cast<int64_t>(sizeof(T));
  const int64_t vpl = std::max<int64_t>(1, kLineElems / N);
  T* buf[2] = {line, line + kTimeTile * kLineElems};
  int64_t prev = -1;  // channel of the group whose lines wait in buf[1]
  int64_t j = 0;
  for (; j + vpl * N <= nc; j += vpl * N) {
    for (int64_t v = 0; v < vpl; v += kPer) {
      const bool flush = v == 0 && prev >= 0;
      sweep(j + v * N, buf[0] + v * N, kLineElems, buf[1], flush ? out0 + prev : nullptr, flush ? nt : 0);
    }
    std::swap(buf[0], buf[1]);
    prev = j;
  }
  if (prev >= 0)
    for (int64_t t = 0; t < nt; ++t) StreamLine(buf[1] + t * kLineElems, out0 + t * outs0 + prev);
  return j;
}

// FwdColumns in passes over an L1 scratch, one vector of channels per sweep (session 16): the two-vector column
// holds 2 x (W weights + bias + W-1 window) = 16 vectors at W = 4, all 16 ymm registers of AVX2 before the
// sigmoid's temporaries, and on AVX2 its two vectors of bf16 are half a 64-byte line, so its non-temporal stores
// wrote each line in two halves 64 tokens apart (partial write-combining flushes: 0.9 GB/s from memory on the AMD
// EPYC development VM against 3.4 in cache). Here pass 1 converts x once into xf and forms u = bias + sum_k w_k x
// (the older taps read back from xf) into us; pass 2 (SiLU) forms y = u sigma(u) (+ residual) from us, the
// sigmoid's ~50-cycle chain overlapping across tokens; the output rows go to `out` (the L1 line buffer of
// FwdColumnsSplit when streaming). The same operations in the same order as FwdColumns / FwdRow, so the same bits
// wherever they use the same sigmoid. pre: as BwdSweepSplit's (the sources before a sequence's first tile).
template <int KW, bool kSilu, bool kNative, class T>
HWY_NOINLINE void FwdSweepSplit(const T* HWY_RESTRICT x0, int64_t xs, const float* HWY_RESTRICT wc, int64_t ws,
                                const float* HWY_RESTRICT bc, int64_t ahead, const T* HWY_RESTRICT r0, int64_t rs,
                                T* HWY_RESTRICT out, int64_t outs, int64_t nt, const float* HWY_RESTRICT pre,
                                int64_t pres, RegionPrefetch::Run pf, const T* HWY_RESTRICT lines,
                                T* HWY_RESTRICT lines_to, int64_t lines_ts, int64_t nlines) {
  constexpr int R = KW - 1;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float xf[(kTimeTile + R) * hn::MaxLanes(DF())];  // x of tokens -R .. nt - 1
  HWY_ALIGN float us[kTimeTile * hn::MaxLanes(DF())];        // u of tokens 0 .. nt - 1
  VF w[KW];
  for (int k = 0; k < KW; ++k) w[k] = hn::LoadU(df, wc + k * ws);
  for (int k = 0; k < R; ++k)
    hn::Store(pre ? hn::LoadU(df, pre + k * pres) : tv::LoadF32(df, x0 + (k - R) * xs), df, xf + k * N);
  const VF bv = hn::LoadU(df, bc);
  // Pass 1 for one token, the cursors advanced (session 17: pointer steps instead of index products; README,
  // Performance, CPU).
  const T* xp = x0;
  float* xw = xf + R * N;
  int64_t t = 0;
  auto pass1 = [&]() STRATA_CONV_ALWAYS_INLINE {
    const VF xc = tv::LoadF32(df, xp);
    hn::Store(xc, df, xw);
    VF acc = bv;
    for (int k = 0; k < R; ++k) acc = hn::MulAdd(w[k], hn::Load(df, xw + (k - R) * N), acc);
    acc = hn::MulAdd(w[R], xc, acc);
    if constexpr (kSilu) {
      hn::Store(acc, df, us + t * N);
    } else {
      if (r0) acc = hn::Add(acc, tv::LoadF32(df, r0 + t * rs));
      tv::StoreOut<false, kNative>(df, acc, out + t * outs);
    }
    xp += xs;
    xw += N;
  };
  for (; t < nt; ++t) {
    tv::PrefetchAhead<64, 0>(xp + ahead);  // the next line group's, swept one group later
    if (t < pf.n) {  // one line of the next item's run (L2), as in BwdSweep
      __builtin_prefetch(pf.a + t * 64, 0, 2);
      __builtin_prefetch(pf.b + t * 64, 0, 2);
    }
    if (t < nlines) StreamLine(lines + t * (64 / static_cast<int64_t>(sizeof(T))), lines_to + t * lines_ts);
    pass1();
  }
  if constexpr (kSilu) {
    t = 0;
    // bf16 / f16 (session 16, h16/cpu_conv2): four tokens' sigmoids step by step (SigmoidOut16NoDivN: the same
    // operations per vector as SigmoidFwd's, so the same bits), their chains interleaved (as BwdSweepSplit's A2);
    // the y rows stored two tokens at a time (StoreRows2, session 17).
    if constexpr (sizeof(T) == 2) {
      constexpr int kU = 4;
      for (; t + kU <= nt; t += kU) {
        VF u[kU], s[kU];
        for (int i = 0; i < kU; ++i) s[i] = u[i] = hn::Load(df, us + (t + i) * N);
        tv::SigmoidOut16NoDivN(df, s);
        for (int i = 0; i < kU; ++i) {
          s[i] = hn::Mul(u[i], s[i]);
          if (r0)
            s[i] = hn::Add(std::is_same_v<T, bf16_t> ? Rounded(s[i]) : s[i],
                           tv::LoadF32(df, r0 + (t + i) * rs));
        }
        for (int i = 0; i < kU; i += 2)
          StoreRows2<kNative>(df, s[i], s[i + 1], out + (t + i) * outs, out + (t + i + 1) * outs);
      }
    }
    for (; t < nt; ++t) {
      const VF u = hn::Load(df, us + t * N);
      VF acc = hn::Mul(u, SigmoidFwd<T>(df, u));
      if (r0) acc = hn::Add(acc, tv::LoadF32(df, r0 + t * rs));
      tv::StoreOut<false, kNative>(df, acc, out + t * outs);
    }
  }
}

#if HWY_TARGET == HWY_AVX2
// FwdSweepSplit for 16 bf16 channels (one 32-byte load) with the channels in even / odd order (session 18): a
// 32-bit lane of the load holds channel 2i (low half) and 2i + 1 (high half), so the even channels' f32 values are
// the lanes shifted left by 16 and the odd ones the lanes with the low half cleared (vpslld, vpand) instead of two
// widening loads (vpmovzxwd: a load and a shuffle each), and the y row is the even vector's rounded bits >> 16
// blended with the odd one's high halves (vpblendw, one 32-byte store) instead of vpackusdw + vpermq. Weights, bias
// and the staged sources before the tile are loaded once per sweep in the same order (ConcatEven / ConcatOdd).
// Per channel the same operations in the same order as FwdSweepSplit, so the same bits.
HWY_INLINE void LoadEO(DF df, const float* HWY_RESTRICT p, VF& e, VF& o) {
  const VF lo = hn::LoadU(df, p), hi = hn::LoadU(df, p + hn::Lanes(df));
  e = hn::ConcatEven(df, hi, lo);
  o = hn::ConcatOdd(df, hi, lo);
}
HWY_INLINE void LoadEO(DF df, const bf16_t* HWY_RESTRICT p, VF& e, VF& o) {
  const hn::RebindToUnsigned<DF> du;
  const auto raw = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  e = hn::BitCast(df, hn::ShiftLeft<16>(raw));
  o = hn::BitCast(df, hn::And(raw, hn::Set(du, 0xffff0000u)));
}
// Rounds e and o to bf16 (nearest even; a NaN quieted as StoreOut does: a pair with a NaN takes Bf16Bits) and
// stores them interleaved (16 channels, one 32-byte store).
HWY_INLINE void StoreEO(DF df, VF e, VF o, bf16_t* HWY_RESTRICT p) {
  __m256i r;
  const __m256 unord = _mm256_cmp_ps(e.raw, o.raw, _CMP_UNORD_Q);
  if (HWY_LIKELY(_mm256_testz_ps(unord, unord)))
    r = _mm256_blend_epi16(_mm256_srli_epi32(Bf16RoundHigh(e.raw), 16), Bf16RoundHigh(o.raw), 0xAA);
  else
    r = hn::Or(tv::Bf16Bits(df, e), hn::ShiftLeft<16>(tv::Bf16Bits(df, o))).raw;
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), r);
}
template <int KW, bool kSilu>
HWY_NOINLINE void FwdSweepSplitEO(const bf16_t* HWY_RESTRICT x0, int64_t xs, const float* HWY_RESTRICT wc,
                                  int64_t ws, const float* HWY_RESTRICT bc, int64_t ahead,
                                  const bf16_t* HWY_RESTRICT r0, int64_t rs, bf16_t* HWY_RESTRICT out, int64_t outs,
                                  int64_t nt, const float* HWY_RESTRICT pre, int64_t pres, RegionPrefetch::Run pf,
                                  const bf16_t* HWY_RESTRICT lines, bf16_t* HWY_RESTRICT lines_to, int64_t lines_ts,
                                  int64_t nlines) {
  constexpr int R = KW - 1;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(DF()));
  const DF df;
  HWY_ALIGN float xf[(kTimeTile + R) * 2 * N];  // x of tokens -R .. nt - 1: even, odd
  HWY_ALIGN float us[kTimeTile * 2 * N];        // u of tokens 0 .. nt - 1: even, odd
  VF we[KW], wo[KW], be, bo;
  for (int k = 0; k < KW; ++k) LoadEO(df, wc + k * ws, we[k], wo[k]);
  LoadEO(df, bc, be, bo);
  for (int k = 0; k < R; ++k) {
    VF e, o;
    if (pre) LoadEO(df, pre + k * pres, e, o);
    else LoadEO(df, x0 + (k - R) * xs, e, o);
    hn::Store(e, df, xf + 2 * k * N);
    hn::Store(o, df, xf + (2 * k + 1) * N);
  }
  const bf16_t* xp = x0;
  float* xw = xf + 2 * R * N;
  for (int64_t t = 0; t < nt; ++t) {
    tv::PrefetchAhead<64, 0>(xp + ahead);  // the next line group's, swept one group later
    if (t < pf.n) {  // one line of the next item's run (L2)
      __builtin_prefetch(pf.a + t * 64, 0, 2);
      __builtin_prefetch(pf.b + t * 64, 0, 2);
    }
    if (t < nlines) StreamLine(lines + t * 32, lines_to + t * lines_ts);
    VF xe, xo;
    LoadEO(df, xp, xe, xo);
    hn::Store(xe, df, xw);
    hn::Store(xo, df, xw + N);
    VF ae = be, ao = bo;
    for (int k = 0; k < R; ++k) {
      ae = hn::MulAdd(we[k], hn::Load(df, xw + 2 * (k - R) * N), ae);
      ao = hn::MulAdd(wo[k], hn::Load(df, xw + (2 * (k - R) + 1) * N), ao);
    }
    ae = hn::MulAdd(we[R], xe, ae);
    ao = hn::MulAdd(wo[R], xo, ao);
    if constexpr (kSilu) {
      hn::Store(ae, df, us + 2 * t * N);
      hn::Store(ao, df, us + (2 * t + 1) * N);
    } else {
      if (r0) {
        VF re, ro;
        LoadEO(df, r0 + t * rs, re, ro);
        ae = hn::Add(ae, re);
        ao = hn::Add(ao, ro);
      }
      StoreEO(df, ae, ao, out + t * outs);
    }
    xp += xs;
    xw += 2 * N;
  }
  if constexpr (kSilu) {
    // Two tokens' even and odd vectors: four sigmoids step by step, as FwdSweepSplit's four tokens (those of its
    // four-token loop, u sigma(u) rounded before the residual is added).
    int64_t t = 0;
    for (; t + 2 <= nt / 4 * 4; t += 2) {
      VF u[4], sg[4];
      for (int i = 0; i < 4; ++i) sg[i] = u[i] = hn::Load(df, us + (2 * t + i) * N);
      tv::SigmoidOut16NoDivN(df, sg);
      for (int i = 0; i < 4; ++i) sg[i] = hn::Mul(u[i], sg[i]);
      if (r0) {
        for (int i = 0; i < 2; ++i) {
          VF re, ro;
          LoadEO(df, r0 + (t + i) * rs, re, ro);
          sg[2 * i] = hn::Add(Rounded(sg[2 * i]), re);
          sg[2 * i + 1] = hn::Add(Rounded(sg[2 * i + 1]), ro);
        }
      }
      StoreEO(df, sg[0], sg[1], out + t * outs);
      StoreEO(df, sg[2], sg[3], out + (t + 1) * outs);
    }
    // The last nt % 4 tokens: FwdSweepSplit's token loop, where GCC contracts u sigma(u) + residual into an FMA
    // (written as one here, so that the bits are those of FwdSweepSplit).
    for (; t < nt; ++t) {
      VF y[2], r[2];
      if (r0) LoadEO(df, r0 + t * rs, r[0], r[1]);
      for (int i = 0; i < 2; ++i) {
        const VF u = hn::Load(df, us + (2 * t + i) * N);
        y[i] = r0 ? hn::MulAdd(u, SigmoidFwd<bf16_t>(df, u), r[i]) : hn::Mul(u, SigmoidFwd<bf16_t>(df, u));
      }
      StoreEO(df, y[0], y[1], out + t * outs);
    }
  }
}
#endif

// The sweeps of FwdSweepSplit over a chunk of nc channels, one vector each (AVX2 bf16: FwdSweepSplitEO, two
// vectors each); with kStream the y rows of a 64-byte line's vectors gather in the line buffers `line` (two of
// [kTimeTile][64 bytes]) and the next group's first sweep streams them out whole, as BwdColumns does for dx.
// Leftover channels: FwdRow's scalar formulas.
template <int KW, bool kSilu, bool kNative, bool kStream, class T>
HWY_NOINLINE void FwdColumnsSplit(const T* HWY_RESTRICT x0, int64_t xs, const float* HWY_RESTRICT wt, int64_t ws,
                                  const float* HWY_RESTRICT bt, int64_t nc, const T* HWY_RESTRICT r0, int64_t rs,
                                  T* HWY_RESTRICT y0, int64_t ys, int64_t nt, const float* HWY_RESTRICT pre,
                                  RegionPrefetch& pf, T* HWY_RESTRICT line) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kLineElems = 64 / static_cast<int64_t>(sizeof(T));
  const int64_t vpl = std::max<int64_t>(1, kLineElems / N);
  // The next item's lines spread evenly over this item's sweeps (at most one per token step).
  const int64_t sweeps = std::max<int64_t>(1, nc / N);
  const int64_t per_sweep = std::min(nt, (pf.rows * pf.row_lines + sweeps - 1) / sweeps);
  auto sweep = [&](int64_t c, T* out, int64_t outs, const T* lines, T* lines_to, int64_t nlines) {
    FwdSweepSplit<KW, kSilu, kNative, T>(x0 + c, xs, wt + c, ws, bt + c, vpl * N, r0 ? r0 + c : nullptr, rs, out,
                                         outs, nt, pre ? pre + c : nullptr, nc, pf.Take(per_sweep), lines, lines_to,
                                         ys, nlines);
  };
  int64_t j = 0;
#if HWY_TARGET == HWY_AVX2
  constexpr bool kEO = std::is_same_v<T, bf16_t> && !kNative;
  if constexpr (kEO) {
    // 16 channels per sweep (FwdSweepSplitEO): half as many sweeps take the next item's run.
    const int64_t sweeps_eo = std::max<int64_t>(1, nc / (2 * N));
    const int64_t per_eo = std::min(nt, (pf.rows * pf.row_lines + sweeps_eo - 1) / sweeps_eo);
    auto sweep_eo = [&](int64_t c, T* out, int64_t outs, const T* lines, T* lines_to, int64_t nlines) {
      FwdSweepSplitEO<KW, kSilu>(x0 + c, xs, wt + c, ws, bt + c, vpl * N, r0 ? r0 + c : nullptr, rs, out, outs, nt,
                                 pre ? pre + c : nullptr, nc, pf.Take(per_eo), lines, lines_to, ys, nlines);
    };
    if constexpr (kStream) j = SweepLineGroups<T, 2>(nc, nt, line, y0, ys, sweep_eo);
    for (; j + 2 * N <= nc; j += 2 * N) sweep_eo(j, y0 + j, ys, nullptr, nullptr, 0);
  }
#else
  constexpr bool kEO = false;
#endif
  if constexpr (kStream && !kEO) j = SweepLineGroups(nc, nt, line, y0, ys, sweep);
  for (; j + N <= nc; j += N) sweep(j, y0 + j, ys, nullptr, nullptr, 0);
  for (; j < nc; ++j) {
    auto xq = [&](int64_t q) { return q < 0 && pre ? pre[(q + KW - 1) * nc + j] : to_f32(x0[q * xs + j]); };
    for (int64_t t = 0; t < nt; ++t) {
      float acc = bt[j];
      for (int k = 0; k < KW; ++k) acc = std::fma(wt[k * ws + j], xq(t - (KW - 1) + k), acc);
      if constexpr (kSilu) acc = acc / (1.f + std::exp(std::min(-acc, 88.f)));
      if (r0) acc += to_f32(r0[t * rs + j]);
      y0[t * ys + j] = from_f32<T>(acc);
    }
  }
}

// ---- backward: g row (and the item's dweight/dbias sums when `own`) on the vector path ----
template <int KW, bool kSilu, class T>
HWY_NOINLINE void GradRow(int W, const T* const* rows, const float* HWY_RESTRICT wt, int64_t ws,
                          const float* HWY_RESTRICT bt, int64_t nc, const T* HWY_RESTRICT dy, float* HWY_RESTRICT g, bool own,
                          float* HWY_RESTRICT dw, float* HWY_RESTRICT db) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int Wn = KW ? KW : W;
  constexpr int64_t kStep = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(T));
  int64_t j = 0;
  for (; j + N <= nc; j += N) {
    tv::PrefetchAhead<kStep>(dy + j);  // dy and the newest tap's row come from memory
    tv::PrefetchAhead<kStep>(rows[Wn - 1] + j);
    VF gv = tv::LoadF32(df, dy + j);
    if constexpr (kSilu) {
      VF acc = hn::LoadU(df, bt + j);
      for (int k = 0; k < Wn; ++k)
        acc = hn::MulAdd(hn::LoadU(df, wt + k * ws + j), tv::LoadF32(df, rows[k] + j), acc);
      gv = SiluGrad<T>(df, acc, gv);
    }
    hn::StoreU(gv, df, g + j);
    if (own) {
      hn::StoreU(hn::Add(hn::LoadU(df, db + j), gv), df, db + j);
      for (int k = 0; k < Wn; ++k)
        hn::StoreU(hn::MulAdd(gv, tv::LoadF32(df, rows[k] + j), hn::LoadU(df, dw + k * nc + j)), df, dw + k * nc + j);
    }
  }
  for (; j < nc; ++j) {
    float gs = to_f32(dy[j]);
    if constexpr (kSilu) {
      float acc = bt[j];
      for (int k = 0; k < Wn; ++k) acc = std::fma(wt[k * ws + j], to_f32(rows[k][j]), acc);
      const float s = 1.f / (1.f + std::exp(std::min(-acc, 88.f)));
      gs *= s * std::fma(acc, 1.f - s, 1.f);
    }
    g[j] = gs;
    if (own) {
      db[j] += gs;
      for (int k = 0; k < Wn; ++k) dw[k * nc + j] = std::fma(gs, to_f32(rows[k][j]), dw[k * nc + j]);
    }
  }
}

// dx row of a position whose W taps (tokens pos .. pos + W-1) are all in its sequence: grows[i] is g at
// pos + i; dx = sum_i w[W-1-i] g[pos + i].
template <int KW, bool kNative, bool kStream, class T>
HWY_NOINLINE void DxRow(int W, const float* const* grows, const float* HWY_RESTRICT wt, int64_t ws, int64_t nc,
                        T* HWY_RESTRICT dx) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int Wn = KW ? KW : W;
  int64_t j = 0;
  for (; j + N <= nc; j += N) {
    VF acc = hn::Zero(df);
    for (int i = 0; i < Wn; ++i)
      acc = hn::MulAdd(hn::LoadU(df, wt + (Wn - 1 - i) * ws + j), hn::LoadU(df, grows[i] + j), acc);
    tv::StoreOut<kStream, kNative>(df, acc, dx + j);
  }
  for (; j < nc; ++j) {
    float acc = 0.f;
    for (int i = 0; i < Wn; ++i) acc = std::fma(wt[(Wn - 1 - i) * ws + j], grows[i][j], acc);
    dx[j] = from_f32<T>(acc);
  }
}

// One sweep of BwdColumns: the vector of channels at x0 / dy0 (token 0 of the tile), dx row of token
// t - (KW-1) at out + (t - (KW-1)) * outs, the sums to dw [KW][dws] and db. Parameters by value so that the
// whole sweep lives in registers.
template <int KW, bool kSilu, bool kNative, class T>
HWY_NOINLINE void BwdSweep(const T* HWY_RESTRICT x0, int64_t xs, const T* HWY_RESTRICT dy0, int64_t dys,
                           const float* HWY_RESTRICT wc, int64_t ws, const float* HWY_RESTRICT bc, int64_t ahead,
                           T* HWY_RESTRICT out, int64_t outs, int64_t nt, float* HWY_RESTRICT dw, int64_t dws,
                           float* HWY_RESTRICT db, RegionPrefetch::Run pf, const T* HWY_RESTRICT lines,
                           T* HWY_RESTRICT lines_to, int64_t lines_ts, int64_t nlines) {
  constexpr int R = KW - 1;  // window length, and the unroll of the token loop
  const DF df;
  // The weights and bias are read from the staged rows (L1); the compiler hoists what fits into registers.
  auto w = [&](int k) STRATA_CONV_ALWAYS_INLINE { return hn::LoadU(df, wc + k * ws); };
  VF win[R], gwin[R], sw[KW];
  for (int k = 0; k < KW; ++k) sw[k] = hn::Zero(df);
  VF sb = hn::Zero(df);
  for (int k = 0; k < R; ++k) {
    win[k] = tv::LoadF32(df, x0 + (k - R) * xs);
    gwin[k] = hn::Zero(df);
  }
  // Token t, whose window holds tokens t - R + i at slot (r + i) % R (r = t % R, a compile-time constant);
  // its own x and g then replace the oldest, slot r.
  auto step = [&](int64_t t, auto r_tag, auto own_tag, auto emit_tag) STRATA_CONV_ALWAYS_INLINE {
    constexpr int r = decltype(r_tag)::value;
    constexpr bool kOwn = decltype(own_tag)::value, kEmit = decltype(emit_tag)::value;
    // The line `ahead` elements on of this token (the next line group's, swept one group later).
    tv::PrefetchAhead<64, 0>(x0 + t * xs + ahead);
    tv::PrefetchAhead<64, 0>(dy0 + t * dys + ahead);
    if (t < pf.n) {  // one line of the next item's run (L2: prefetcht1 on x86)
      __builtin_prefetch(pf.a + t * 64, 0, 2);
      __builtin_prefetch(pf.b + t * 64, 0, 2);
    }
    // One finished dx line of the previous line group, streamed out (spread over the steps, not in a burst
    // that would stall on the fill buffers).
    if (t < nlines) StreamLine(lines + t * (64 / static_cast<int64_t>(sizeof(T))), lines_to + t * lines_ts);
    const VF xc = tv::LoadF32(df, x0 + t * xs);
    VF gv = tv::LoadF32(df, dy0 + t * dys);
    if constexpr (kSilu) {
      VF acc = hn::LoadU(df, bc);
      for (int k = 0; k < R; ++k) acc = hn::MulAdd(w(k), win[(r + k) % R], acc);
      acc = hn::MulAdd(w(R), xc, acc);
      gv = SiluGrad<T>(df, acc, gv);
    }
    if constexpr (kOwn) {
      sb = hn::Add(sb, gv);
      for (int k = 0; k < R; ++k) sw[k] = hn::MulAdd(gv, win[(r + k) % R], sw[k]);
      sw[R] = hn::MulAdd(gv, xc, sw[R]);
    }
    if constexpr (kEmit) {
      // g at t - R + i: gwin[(r + i) % R] for i < R, gv for i = R.
      VF acc = hn::Zero(df);
      for (int i = 0; i < R; ++i) acc = hn::MulAdd(w(R - i), gwin[(r + i) % R], acc);
      acc = hn::MulAdd(w(0), gv, acc);
      tv::StoreOut<false, kNative>(df, acc, out + (t - R) * outs);
    }
    win[r] = xc;
    gwin[r] = gv;
  };
  using I0 = std::integral_constant<int, 0>;
  using I1 = std::integral_constant<int, (R > 1 ? 1 : 0)>;
  using I2 = std::integral_constant<int, (R > 2 ? 2 : 0)>;
  // Token t with its rotation chosen at run time (the loop's ends; the bulk runs whole groups of R).
  auto step_any = [&](int64_t t, auto own_tag, auto emit_tag) STRATA_CONV_ALWAYS_INLINE {
    const int64_t r = t % R;
    if (r == 0) step(t, I0{}, own_tag, emit_tag);
    if constexpr (R > 1) if (r == 1) step(t, I1{}, own_tag, emit_tag);
    if constexpr (R > 2) if (r == 2) step(t, I2{}, own_tag, emit_tag);
  };
  int64_t t = 0;
  for (; t < R; ++t) step_any(t, std::true_type{}, std::false_type{});
  // t = R is a multiple of R: whole groups while every token of the group is own.
  for (; t + R <= nt; t += R) {
    step(t, I0{}, std::true_type{}, std::true_type{});
    if constexpr (R > 1) step(t + 1, I1{}, std::true_type{}, std::true_type{});
    if constexpr (R > 2) step(t + 2, I2{}, std::true_type{}, std::true_type{});
  }
  for (; t < nt; ++t) step_any(t, std::true_type{}, std::true_type{});
  for (; t < nt + R; ++t) step_any(t, std::false_type{}, std::true_type{});
  for (int k = 0; k < KW; ++k) hn::StoreU(sw[k], df, dw + k * dws);
  hn::StoreU(sb, df, db);
}

// BwdSweep in passes over an L1 scratch (session 16): the same vector of channels, the same memory-side work
// (prefetches, streamed dx lines) and the same arithmetic in the same order, but the state no longer has to fit
// in registers at once. BwdSweep keeps the x and g windows, the W + 1 sums, the weights and the bias live
// together (at W = 4: 16 vectors before the sigmoid's temporaries; on AVX2, 16 ymm registers, it spilled: 643
// stack references in its 2100 instructions). Here:
//   pass A1 (tokens 0 .. nt + nh - 1): x converted once and stored to xf, u = bias + sum_k w_k x (the older taps
//     read back from xf as memory operands) stored to gs: weights and bias live;
//   pass A2 (SiLU only): g = dy act'(u) over gs in place, interleaved with pass B (W-1 tokens ahead of it): the
//     sigmoid's long dependency chain overlaps with B's short independent operations (in A1's loop it bounded the
//     out-of-order window: A1 + A2 as one loop ran no faster than the single-loop BwdSweep on AVX2);
//   pass B (tokens 0 .. nt - 1): dbias / dweight sums, g[t] times the x of its taps (xf, memory operands), and
//     dx[t] = sum_i w[W-1-i] g[t + i] (gs, memory operands): the W + 1 sums and the weights live.
// xf [nt + 2(W-1)] and gs [nt + W-1] vectors of scratch (at most 2 x 70 x 64 bytes: L1).
// The tile may start its sequence: `pre` (nullptr: x rows before x0) holds the W-1 sources before token 0 as f32
// rows of stride `pres` (initial state or zeros, BwdItem); and it may end within W-1 tokens of its sequence's end:
// only nh <= W-1 tokens after the tile have a g, the others count as 0 (no final-state gradient then: BwdItem).
template <int KW, bool kSilu, bool kNative, class T>
HWY_NOINLINE void BwdSweepSplit(const T* HWY_RESTRICT x0, int64_t xs, const T* HWY_RESTRICT dy0, int64_t dys,
                                const float* HWY_RESTRICT wc, int64_t ws, const float* HWY_RESTRICT bc,
                                int64_t ahead, T* HWY_RESTRICT out, int64_t outs, int64_t nt, int64_t nh,
                                const float* HWY_RESTRICT pre, int64_t pres, float* HWY_RESTRICT dw, int64_t dws,
                                float* HWY_RESTRICT db, RegionPrefetch::Run pf, const T* HWY_RESTRICT lines,
                                T* HWY_RESTRICT lines_to, int64_t lines_ts, int64_t nlines) {
  constexpr int R = KW - 1;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float xf[(kTimeTile + 2 * R) * hn::MaxLanes(DF())];  // x of tokens -R .. nt + R - 1
  HWY_ALIGN float gs[(kTimeTile + R) * hn::MaxLanes(DF())];       // g of tokens 0 .. nt + R - 1
  VF w[KW];
  for (int k = 0; k < KW; ++k) w[k] = hn::LoadU(df, wc + k * ws);
  for (int k = 0; k < R; ++k)
    hn::Store(pre ? hn::LoadU(df, pre + k * pres) : tv::LoadF32(df, x0 + (k - R) * xs), df, xf + k * N);
  const int64_t ng = nt + nh;  // tokens with a g
  {
    const VF bv = hn::LoadU(df, bc);
    // Pass A1 for one token, the cursors advanced (session 17: pointer steps instead of index products; README,
    // Performance, CPU).
    const T* xp = x0;
    const T* dp = dy0;
    float* xw = xf + R * N;
    float* gw = gs;
    auto a1 = [&]() STRATA_CONV_ALWAYS_INLINE {
      const VF xc = tv::LoadF32(df, xp);
      hn::Store(xc, df, xw);
      if constexpr (kSilu) {
        VF acc = bv;
        for (int k = 0; k < R; ++k) acc = hn::MulAdd(w[k], hn::Load(df, xw + (k - R) * N), acc);
        hn::Store(hn::MulAdd(w[R], xc, acc), df, gw);
      } else {
        hn::Store(tv::LoadF32(df, dp), df, gw);
      }
      xp += xs;
      dp += dys;
      xw += N;
      gw += N;
    };
    for (int64_t t = 0; t < ng; ++t) {
      // The next line group's x and dy lines, swept one group later (every sweep of the group issues them: sharing
      // the rows out among the group's sweeps, or the group's first sweep alone, was 2-9 % slower from memory on the
      // AMD EPYC, session 17).
      tv::PrefetchAhead<64, 0>(xp + ahead);
      tv::PrefetchAhead<64, 0>(dp + ahead);
      if (t < pf.n) {
        __builtin_prefetch(pf.a + t * 64, 0, 2);
        __builtin_prefetch(pf.b + t * 64, 0, 2);
      }
      if (t < nlines) StreamLine(lines + t * (64 / static_cast<int64_t>(sizeof(T))), lines_to + t * lines_ts);
      a1();
    }
    for (int64_t t = ng; t < nt + R; ++t) hn::Store(hn::Zero(df), df, gs + t * N);
  }
  // Pass A2 for token t (u in gs becomes g), run W-1 tokens ahead of pass B in B's loop: its sigmoid is one long
  // dependency chain per token (~55 cycles on Zen 3), which B's short independent operations overlap.
  auto a2 = [&](int64_t t) STRATA_CONV_ALWAYS_INLINE {
    if constexpr (kSilu)
      hn::Store(SiluGrad<T>(df, hn::Load(df, gs + t * N), tv::LoadF32(df, dy0 + t * dys)), df, gs + t * N);
  };
  VF sw[KW];
  for (int k = 0; k < KW; ++k) sw[k] = hn::Zero(df);
  VF sb = hn::Zero(df);
  // Pass B for token t: the sums, and dx[t] returned (the caller stores it).
  auto b = [&](int64_t t) STRATA_CONV_ALWAYS_INLINE {
    const VF gv = hn::Load(df, gs + t * N);
    sb = hn::Add(sb, gv);
    for (int k = 0; k < KW; ++k) sw[k] = hn::MulAdd(gv, hn::Load(df, xf + (t + k) * N), sw[k]);
    VF acc = hn::MulAdd(w[R], gv, hn::Zero(df));  // BwdSweep's first tap (MulAdd keeps its sign of zero)
    for (int i = 1; i <= R; ++i) acc = hn::MulAdd(w[R - i], hn::Load(df, gs + (t + i) * N), acc);
    return acc;
  };
  for (int64_t t = 0; t < std::min<int64_t>(R, ng); ++t) a2(t);
  const int64_t tb = std::max<int64_t>(0, std::min(nt, ng - R));  // B's tokens whose A2 token t + W-1 has a g
  int64_t t = 0;
  // bf16 / f16 SiLU (session 16, h16/cpu_conv2): A2 for kA2 tokens at once, their sigmoids step by step over the
  // kA2 vectors (SigmoidLpNoDivN: the same operations per vector, so the same bits), then B for those tokens.
  // One token's sigmoid is a ~60-cycle chain; one chain at a time fills Zen 3's FP scheduler (as measured for
  // clipped_swiglu, sigmoid_nodiv-inl.h). +8 to +20 % on the EPYC (README, Performance, CPU).
  constexpr int kA2 = kSilu && sizeof(T) == 2 ? 4 : 1;
  if constexpr (kA2 > 1) {
    for (; t + kA2 <= tb; t += kA2) {
      VF u[kA2], s[kA2];
      for (int i = 0; i < kA2; ++i) s[i] = u[i] = hn::Load(df, gs + (t + R + i) * N);
      tv::SigmoidLpNoDivN(df, s);
      for (int i = 0; i < kA2; ++i)
        hn::Store(SiluGradS(df, u[i], s[i], tv::LoadF32(df, dy0 + (t + R + i) * dys)), df, gs + (t + R + i) * N);
      // dx of two tokens per store (StoreRows2, session 17); B's sums still in t order.
      for (int i = 0; i < kA2; i += 2) {
        const VF d0 = b(t + i);
        const VF d1 = b(t + i + 1);
        StoreRows2<kNative>(df, d0, d1, out + (t + i) * outs, out + (t + i + 1) * outs);
      }
    }
  }
  for (; t < tb; ++t) {
    a2(t + R);
    tv::StoreOut<false, kNative>(df, b(t), out + t * outs);
  }
  for (; t < nt; ++t) tv::StoreOut<false, kNative>(df, b(t), out + t * outs);
  for (int k = 0; k < KW; ++k) hn::StoreU(sw[k], df, dw + k * dws);
  hn::StoreU(sb, df, db);
}

// ---- backward: a whole time tile and its W-1 halo tokens on the vector path, swept column by column ----
// One vector of channels walks the tokens t0 .. t1 + W - 2 in order (BwdSweep) with the W-1 previous x and g
// vectors and its dweight / dbias sums in registers: at token t it forms g[t] = dy act'(u) (u recomputed), adds
// g[t] x to the sums while t is one of the tile's own tokens, and writes dx[t - (W-1)] = sum_i w[W-1-i]
// g[t - (W-1) + i] as soon as its last g is known. The x and g windows rotate through their registers (the
// token loop is unrolled by W-1, each step knowing at compile time which register holds which token), so
// nothing is copied or spilled per token (the earlier sweep of two vectors at once held 22 registers of state,
// spilled the sums and copied the windows every token). The arithmetic is GradRow's and DxRow's in their order
// (sums from 0 in t order, taps in k order), so the results are the same bits. Non-temporal dx stores must write
// whole 64-byte lines, which one sweep of bf16 fills half of: with kStream the sweeps of a line's vectors write
// their dx into `line` (two buffers of [nt][64 bytes], L1-resident), whose lines the next group's first sweep
// streams out, one per token step (the last group's after the loop). x0 / dy0 / dx0: token t0 of the tile at
// the chunk's first channel; nt = t1 - t0 >= W - 1 own tokens; dw [W][nc], db [nc]: the item's sums
// (overwritten); pf: the next item's prefetch, spread over the sweeps.
template <int KW, bool kSilu, bool kNative, bool kStream, class T>
HWY_NOINLINE void BwdColumns(const T* HWY_RESTRICT x0, int64_t xs, const T* HWY_RESTRICT dy0, int64_t dys,
                             const float* HWY_RESTRICT wt, int64_t ws, const float* HWY_RESTRICT bt, int64_t nc,
                             T* HWY_RESTRICT dx0, int64_t dxs, int64_t nt, int64_t nh, const float* HWY_RESTRICT pre,
                             float* HWY_RESTRICT dw, float* HWY_RESTRICT db, RegionPrefetch& pf, T* HWY_RESTRICT line) {
  static_assert(KW >= 2, "the column sweep is unrolled for W = 2, 3, 4");
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  // Vectors of T per 64-byte line (1 for f32 on AVX-512), and T elements per line.
  constexpr int64_t kLineElems = 64 / static_cast<int64_t>(sizeof(T));
  const int64_t vpl = std::max<int64_t>(1, kLineElems / N);
  // The next item's lines spread evenly over this item's sweeps (at most one per token step).
  const int64_t sweeps = std::max<int64_t>(1, nc / N);
  const int64_t per_sweep = std::min(nt + KW - 1, (pf.rows * pf.row_lines + sweeps - 1) / sweeps);
  auto sweep = [&](int64_t c, T* out, int64_t outs, const T* lines, T* lines_to, int64_t nlines) {
    if constexpr (kSplitSweeps)
      BwdSweepSplit<KW, kSilu, kNative, T>(x0 + c, xs, dy0 + c, dys, wt + c, ws, bt + c, vpl * N, out, outs, nt, nh,
                                           pre ? pre + c : nullptr, nc, dw + c, nc, db + c, pf.Take(per_sweep), lines,
                                           lines_to, dxs, nlines);
    else
      BwdSweep<KW, kSilu, kNative, T>(x0 + c, xs, dy0 + c, dys, wt + c, ws, bt + c, vpl * N, out, outs, nt, dw + c,
                                       nc, db + c, pf.Take(per_sweep), lines, lines_to, dxs, nlines);
  };
  int64_t j = 0;
  if constexpr (kStream) j = SweepLineGroups(nc, nt, line, dx0, dxs, sweep);
  for (; j + N <= nc; j += N) sweep(j, dx0 + j, dxs, nullptr, nullptr, 0);
  // Leftover channels (nc not a multiple of the vector): GradRow's / DxRow's scalar formulas per channel.
  for (; j < nc; ++j) {
    float g[kTimeTile + kMaxWidth];
    float sbj = 0.f, swj[kMaxWidth] = {};
    // x of token q (>= -(W-1)): the sources before the tile from `pre` when given.
    auto xq = [&](int64_t q) { return q < 0 && pre ? pre[(q + KW - 1) * nc + j] : to_f32(x0[q * xs + j]); };
    for (int64_t t = 0; t < nt + KW - 1; ++t) {
      if (t >= nt + nh) {
        g[t] = 0.f;
        continue;
      }
      float gs = to_f32(dy0[t * dys + j]);
      if constexpr (kSilu) {
        float acc = bt[j];
        for (int k = 0; k < KW; ++k) acc = std::fma(wt[k * ws + j], xq(t - (KW - 1) + k), acc);
        const float sg = 1.f / (1.f + std::exp(std::min(-acc, 88.f)));
        gs *= sg * std::fma(acc, 1.f - sg, 1.f);
      }
      g[t] = gs;
      if (t < nt) {
        sbj += gs;
        for (int k = 0; k < KW; ++k) swj[k] = std::fma(gs, xq(t - (KW - 1) + k), swj[k]);
      }
    }
    for (int64_t pos = 0; pos < nt; ++pos) {
      float acc = 0.f;
      for (int i = 0; i < KW; ++i) acc = std::fma(wt[(KW - 1 - i) * ws + j], g[pos + i], acc);
      dx0[pos * dxs + j] = from_f32<T>(acc);
    }
    for (int k = 0; k < KW; ++k) dw[k * nc + j] = swj[k];
    db[j] = sbj;
  }
}

// Whether every tap of token t reads x of t's own sequence (the vector path's condition).
HWY_INLINE bool all_taps_x(const Conv1dParams& p, int64_t b, int64_t t, const SeqSpan& s) {
  if (t - (p.W - 1) < s.start) return false;
  if (p.mode != kModeSeqIdx) return true;
  const int64_t id = seq_at(p, b, t);
  if (id < 0) return false;
  for (int64_t q = t - (p.W - 1); q < t; ++q)
    if (seq_at(p, b, q) != id) return false;
  return true;
}

// The W-1 sources before token t0 of sequence s (tokens t0 - (W-1) .. t0 - 1: x, initial state or zeros) at
// channels c0 .. c0 + nc, as f32 rows [W-1][nc] in `st`, for a column sweep of a tile that starts its sequence
// (FwdSweepSplit / BwdSweepSplit's `pre`); nullptr when they are all x (the sweep reads them itself).
inline const float* StageSourcesBefore(const Conv1dParams& p, int64_t b, const SeqSpan& s, int64_t t0, int64_t c0,
                                       int64_t nc, float* st) {
  const int64_t R = p.W - 1;
  if (t0 - R >= s.start) return nullptr;
  for (int64_t q = t0 - R; q < t0; ++q) {
    const TapSource src = q >= s.start ? TapSource{1, q} : p.h0 ? TapSource{2, q - s.start + R} : TapSource{0, 0};
    for (int64_t c = 0; c < nc; ++c) st[(q - t0 + R) * nc + c] = source_value(p, b, s.n, c0 + c, src);
  }
  return st;
}

// Stages the chunk's weights [W][nc] and bias [nc] as f32.
// Outputs (y, dx) of at least this size are written with non-temporal stores where a row is vector-aligned:
// they bypass the caches instead of first reading every output line (write-allocate), so the forward moves 2
// bytes per byte of x, like a copy, instead of 3.
constexpr int64_t kStreamBytes = 4 << 20;
// Only vectors of at least 16 stored bytes: a partial vector (4 bf16 on SSE4) would go through a 16-byte
// streaming store that needs 16-byte alignment (and writes 16 bytes).
template <class T>
bool Streams(const Conv1dParams& p) {
  return p.channels_contiguous && hn::Lanes(DF()) * sizeof(T) >= 16 &&
         p.B * p.T * p.D * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
}

// Weights as f32 [W][D] followed by the bias [D] (zeros without one), staged once per call and shared
// read-only by the threads.
// Row stride of the staged weights: D + 32 floats, so that the W + 1 rows do not fall into the same L1 sets
// when D is a multiple of 1024 (with the x rows of the taps, also 2^n apart, they would exceed its ways).
HWY_INLINE int64_t StagedStride(const Conv1dParams& p) { return p.D + 32; }
inline hwy::AlignedFreeUniquePtr<float[]> StageWeights(const Conv1dParams& p) {
  const int64_t ws = StagedStride(p);
  auto st = hwy::AllocateAligned<float>(static_cast<size_t>((p.W + 1) * ws));
  for (int64_t k = 0; k < p.W; ++k)
    for (int64_t d = 0; d < p.D; ++d) st[k * ws + d] = weight_at(p, d, k);
  for (int64_t d = 0; d < p.D; ++d) st[p.W * ws + d] = bias_at(p, d);
  return st;
}

// The x rows (and those of `other`, e.g. dy, with batch / token strides `os`, or none) that item i of a (tile,
// chunk) split reads: tokens t0 - (W-1) .. t0 + kTimeTile + W - 2 of its row, clipped to [0, T), at its chunk's
// channels; no rows past the last item or without unit channel stride (then nothing is prefetched).
template <class T>
RegionPrefetch NextItemRegion(const Conv1dParams& p, int64_t i, int64_t items, int64_t chunks, int64_t chan,
                              const void* other, const int64_t* os) {
  RegionPrefetch r;
  if (i >= items || !p.channels_contiguous) return r;
  const int64_t tpr = tiles_per_row(p, kTimeTile);
  const int64_t tile = i / chunks, chunk = i - tile * chunks;
  const int64_t b = tile / tpr, t0 = (tile - b * tpr) * kTimeTile;
  const int64_t c0 = chunk * chan, nc = std::min(chan, p.D - c0);
  const int64_t r0 = std::max<int64_t>(0, t0 - (p.W - 1)), r1 = std::min(p.T, t0 + kTimeTile + p.W - 1);
  const int64_t bytes = static_cast<int64_t>(sizeof(T));
  r.a = reinterpret_cast<const char*>(static_cast<const T*>(p.x) + b * p.xs[0] + r0 * p.xs[1] + c0);
  r.sa = p.xs[1] * bytes;
  if (other) {
    r.b = reinterpret_cast<const char*>(static_cast<const T*>(other) + b * os[0] + r0 * os[1] + c0);
    r.sb = os[1] * bytes;
  }
  r.rows = r1 - r0;
  r.row_lines = (nc * bytes + 63) / 64;
  return r;
}

template <bool kNative, class T>
void FwdRowDispatch(const Conv1dParams& p, const T* const* rows, const float* wt, const float* bt, int64_t nc,
                    const T* res, T* y, bool stream, const T* next) {
  const int W = static_cast<int>(p.W);
  const bool silu = p.activation == kActSilu;
  // The width (2-4 unrolled, else general) and the activation and store kind as template arguments.
  auto run = [&](auto stream_tag) {
    constexpr bool S = decltype(stream_tag)::value;
#define STRATA_CONV_FWD(KW)                                                                      \
  (silu ? FwdRow<KW, true, kNative, S, T>(W, rows, wt, StagedStride(p), bt, nc, res, y, next) \
        : FwdRow<KW, false, kNative, S, T>(W, rows, wt, StagedStride(p), bt, nc, res, y, next))
    switch (W) {
      case 2: STRATA_CONV_FWD(2); break;
      case 3: STRATA_CONV_FWD(3); break;
      case 4: STRATA_CONV_FWD(4); break;
      default: STRATA_CONV_FWD(0); break;
    }
#undef STRATA_CONV_FWD
  };
  if (stream) run(std::true_type{});
  else run(std::false_type{});
}

// The column sweeps' dispatch: calls f(std::integral_constant<int, W>{}, std::bool_constant<kStream>{},
// std::bool_constant<kSilu>{}) for W in {2, 3, 4} and the run-time stream / SiLU choices.
template <class F>
HWY_INLINE void WithColumnKinds(int64_t W, bool stream, bool silu, F&& f) {
  auto act = [&](auto w, auto st) {
    if (silu) f(w, st, std::true_type{});
    else f(w, st, std::false_type{});
  };
  auto str = [&](auto w) {
    if (stream) act(w, std::true_type{});
    else act(w, std::false_type{});
  };
  switch (W) {
    case 2: str(std::integral_constant<int, 2>{}); break;
    case 3: str(std::integral_constant<int, 3>{}); break;
    default: str(std::integral_constant<int, 4>{}); break;
  }
}

// Scratch of one forward thread for FwdColumnsSplit: the staged sources before a sequence's first tile and the
// streamed y lines (two buffers of 64 bytes per token).
struct FwdScratch {
  float pre[kMaxWidth * kFwdChan];
  alignas(64) unsigned char line[2 * kTimeTile * 64];
};

template <class T, bool kNative>
void FwdItem(const Conv1dParams& p, int64_t b, int64_t t0, int64_t t1, int64_t c0, int64_t nc, const float* wt,
             const float* bt, bool stream, FwdScratch& sc, RegionPrefetch& pf) {
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  const T* rows[kMaxWidth];
  SeqSpan s = find_sequence(p, b, t0);
  // FwdColumnsSplit: every tile inside one sequence, including its first (the sources before it staged) where the
  // target has FMA: without it MulAdd is a multiply and an add, and the element-wise path that a pack takes at a
  // sequence start (fmaf) would give other bits than the sequence run alone (PackedEqualsSeparate).
  if constexpr (kSplitSweeps) {
    if (p.channels_contiguous && p.mode != kModeSeqIdx && p.W >= 2 && p.W <= 4 && t1 <= s.end &&
        (HWY_NATIVE_FMA || all_taps_x(p, b, t0, s))) {
      const T* x0 = x + b * p.xs[0] + t0 * p.xs[1] + c0;
      T* y0 = y + b * p.ys[0] + t0 * p.ys[1] + c0;
      const T* r0 = res ? res + b * p.rs[0] + t0 * p.rs[1] + c0 : nullptr;
      // Non-temporal stores of whole lines: every token's row of the chunk 64-byte aligned.
      const bool st = stream && reinterpret_cast<uintptr_t>(y0) % 64 == 0 &&
                      (p.ys[1] * static_cast<int64_t>(sizeof(T))) % 64 == 0;
      const float* pre = StageSourcesBefore(p, b, s, t0, c0, nc, sc.pre);
      const bool silu = p.activation == kActSilu;
      const int64_t ws = StagedStride(p), nt = t1 - t0;
      T* line = reinterpret_cast<T*>(sc.line);
      WithColumnKinds(p.W, st, silu, [&](auto kw, auto kst, auto ksilu) {
        FwdColumnsSplit<decltype(kw)::value, decltype(ksilu)::value, kNative, decltype(kst)::value, T>(
            x0, p.xs[1], wt, ws, bt, nc, r0, p.rs[1], y0, p.ys[1], nt, pre, pf, line);
      });
      return;
    }
  }
  // FwdColumns (AVX-512): the whole tile on the vector path (one sequence, t0's taps all in it, no seq_idx).
  if constexpr (!kSplitSweeps) {
    if (p.channels_contiguous && p.mode != kModeSeqIdx && p.W >= 2 && p.W <= 4 && t1 <= s.end &&
        all_taps_x(p, b, t0, s)) {
      const T* x0 = x + b * p.xs[0] + t0 * p.xs[1] + c0;
      T* y0 = y + b * p.ys[0] + t0 * p.ys[1] + c0;
      const T* r0 = res ? res + b * p.rs[0] + t0 * p.rs[1] + c0 : nullptr;
      // Non-temporal stores need every token's row of the chunk aligned to the stored vector.
      const int64_t vb = static_cast<int64_t>(hn::Lanes(DF()) * sizeof(T));
      const bool st = stream && tv::StreamAligned(DF(), y0) && (p.ys[1] * static_cast<int64_t>(sizeof(T))) % vb == 0;
      const bool silu = p.activation == kActSilu;
      const int64_t ws = StagedStride(p), nt = t1 - t0;
      WithColumnKinds(p.W, st, silu, [&](auto kw, auto kst, auto ksilu) {
        FwdColumns<decltype(kw)::value, decltype(ksilu)::value, kNative, decltype(kst)::value, T>(
            x0, p.xs[1], wt, ws, bt, nc, r0, p.rs[1], y0, p.ys[1], nt);
      });
      return;
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    if (t >= s.end) s = find_sequence(p, b, t);
    if (p.channels_contiguous && all_taps_x(p, b, t, s)) {
      for (int64_t k = 0; k < p.W; ++k) rows[k] = x + b * p.xs[0] + (t - (p.W - 1) + k) * p.xs[1] + c0;
      T* yr = y + b * p.ys[0] + t * p.ys[1] + c0;
      const T* next = t + 1 < p.T ? x + b * p.xs[0] + (t + 1) * p.xs[1] + c0 : nullptr;
      FwdRowDispatch<kNative, T>(p, rows, wt, bt, nc, res ? res + b * p.rs[0] + t * p.rs[1] + c0 : nullptr, yr,
                                 stream && tv::StreamAligned(DF(), yr), next);
      continue;
    }
    // Element-wise: sequence starts (initial state), masked taps, padding, strided channels.
    const bool pad = is_padding(p, b, t);
    for (int64_t c = c0; c < c0 + nc; ++c) {
      const float u = pre_activation(p, b, t, s, c);
      float v = pad ? 0.f : (p.activation == kActSilu ? u / (1.f + std::exp(std::min(-u, 88.f))) : u);
      if (res) v += to_f32(res[b * p.rs[0] + t * p.rs[1] + c * p.rs[2]]);
      y[b * p.ys[0] + t * p.ys[1] + c * p.ys[2]] = from_f32<T>(v);
    }
  }
}

template <class T, bool kNative>
void Forward(const Conv1dParams& p) {
  const int64_t tpr = tiles_per_row(p, kTimeTile);
  const int64_t chunks = (p.D + kFwdChan - 1) / kFwdChan;
  const auto staged = StageWeights(p);
  const float* wt = staged.get();
  const float* bt = wt + p.W * StagedStride(p);
  const bool stream = Streams<T>(p);
  // One FwdScratch per thread (72 KiB) for FwdColumnsSplit, indexed by the OpenMP thread number (0 outside a
  // parallel region).
  auto scratch = hwy::AllocateAligned<FwdScratch>(kSplitSweeps ? std::max(1, strata::rt::num_threads()) : 1);
  tile::parallel_blocks(p.B * tpr * chunks, 1, [&](int64_t i0, int64_t i1) {
    FwdScratch& sc = scratch[omp_get_thread_num()];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t tile = i / chunks, chunk = i - tile * chunks;
      const int64_t b = tile / tpr, t0 = (tile - b * tpr) * kTimeTile;
      const int64_t c0 = chunk * kFwdChan;
      // The next item's x (and residual) rows into L2 during this one (FwdColumnsSplit; the column walk reads ~64
      // rows 16 KiB apart at a time, which the hardware prefetchers do not follow).
      RegionPrefetch pf = NextItemRegion<T>(p, i + 1, p.B * tpr * chunks, chunks, kFwdChan, p.residual, p.rs);
      FwdItem<T, kNative>(p, b, t0, std::min(t0 + kTimeTile, p.T), c0, std::min(kFwdChan, p.D - c0), wt + c0,
                          bt + c0, stream, sc, pf);
    }
    if (stream) hwy::FlushStream();  // order the non-temporal stores before the results are used
  });
  if (p.hT) {
    tile::parallel_blocks(p.N, std::max<int64_t>(1, 4096 / std::max<int64_t>(p.D, 1)), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t d = 0; d < p.D; ++d)
          for (int64_t j = 0; j < p.W - 1; ++j)
            st_f32(p.hT, p.hT_dtype, n * p.hTs[0] + d * p.hTs[1] + j * p.hTs[2], final_state_value(p, n, d, j));
    });
  }
}

template <class T>
void GradRowDispatch(const Conv1dParams& p, const T* const* rows, const float* wt, const float* bt, int64_t nc,
                     const T* dy, float* g, bool own, float* dw, float* db) {
  const int W = static_cast<int>(p.W);
  const bool silu = p.activation == kActSilu;
#define STRATA_CONV_GRAD(KW)                                                  \
  (silu ? GradRow<KW, true, T>(W, rows, wt, StagedStride(p), bt, nc, dy, g, own, dw, db) \
        : GradRow<KW, false, T>(W, rows, wt, StagedStride(p), bt, nc, dy, g, own, dw, db))
  switch (W) {
    case 2: STRATA_CONV_GRAD(2); break;
    case 3: STRATA_CONV_GRAD(3); break;
    case 4: STRATA_CONV_GRAD(4); break;
    default: STRATA_CONV_GRAD(0); break;
  }
#undef STRATA_CONV_GRAD
}

template <bool kNative, class T>
void DxRowDispatch(int64_t W, const float* const* grows, const float* wt, int64_t ws, int64_t nc, T* dx,
                   bool stream) {
  if (stream) {
    switch (W) {
      case 2: DxRow<2, kNative, true, T>(2, grows, wt, ws, nc, dx); break;
      case 3: DxRow<3, kNative, true, T>(3, grows, wt, ws, nc, dx); break;
      case 4: DxRow<4, kNative, true, T>(4, grows, wt, ws, nc, dx); break;
      default: DxRow<0, kNative, true, T>(static_cast<int>(W), grows, wt, ws, nc, dx); break;
    }
    return;
  }
  switch (W) {
    case 2: DxRow<2, kNative, false, T>(2, grows, wt, ws, nc, dx); break;
    case 3: DxRow<3, kNative, false, T>(3, grows, wt, ws, nc, dx); break;
    case 4: DxRow<4, kNative, false, T>(4, grows, wt, ws, nc, dx); break;
    default: DxRow<0, kNative, false, T>(static_cast<int>(W), grows, wt, ws, nc, dx); break;
  }
}

// Scratch of one backward item (per thread): staged weights, bias, g rows, and the item's sums.
struct BwdScratch {
  const float* wt;  // staged weights of the chunk (row stride StagedStride) and bias
  const float* bt;
  float g[(kTimeTile + kMaxWidth) * kBwdChan];
  float dw[kMaxWidth * kBwdChan];
  float db[kBwdChan];
  alignas(64) unsigned char line[2 * kTimeTile * 64];  // BwdColumns' dx lines (two buffers of 64 bytes per token)
};

template <class T, bool kNative>
void BwdItem(const Conv1dParams& p, int64_t b, int64_t tile, int64_t t0, int64_t t1, int64_t c0, int64_t nc,
             BwdScratch& sc, float* partials, bool stream, RegionPrefetch& pf) {
  const int64_t W = p.W;
  std::fill(sc.dw, sc.dw + W * nc, 0.f);
  std::fill(sc.db, sc.db + nc, 0.f);
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  const int64_t te = std::min(t1 + W - 1, p.T);
  const T* rows[kMaxWidth];

  // g over [t0, te); dweight/dbias sums over the item's own tokens [t0, t1), in t order.
  SeqSpan s = find_sequence(p, b, t0);
  // The column sweep. BwdSweep: the tile and its halo in one sequence, every tap reading x, no seq_idx, and
  // (then) no position of the tile among its sequence's last W-1 (which take the final state's gradient).
  // BwdSweepSplit also takes a tile that starts its sequence (the W-1 sources before it, from the initial state or
  // zeros, staged f32 in sc.g) or ends within W-1 tokens of its end (fewer halo tokens) unless a final-state
  // gradient reaches the tile: every tile of batch rows without dfinal_state, all but those at sequence
  // boundaries in a pack.
  const int64_t R = W - 1;
  const bool cols = p.channels_contiguous && p.mode != kModeSeqIdx && W >= 2 && W <= 4 &&
                    (kSplitSweeps ? t1 <= s.end && !(p.dhT && t1 + R > s.end)
                           : t1 - t0 >= R && t1 + R <= s.end && all_taps_x(p, b, t0, s));
  if (cols) {
    const int64_t nh = std::min(R, s.end - t1);
    const float* pre = StageSourcesBefore(p, b, s, t0, c0, nc, sc.g);
    const T* x0 = x + b * p.xs[0] + t0 * p.xs[1] + c0;
    const T* dy0 = dy + b * p.dys[0] + t0 * p.dys[1] + c0;
    T* dx0 = dx + b * p.dxs[0] + t0 * p.dxs[1] + c0;
    // Non-temporal stores of whole lines: every token's row of the chunk 64-byte aligned.
    const bool st = stream && reinterpret_cast<uintptr_t>(dx0) % 64 == 0 &&
                    (p.dxs[1] * static_cast<int64_t>(sizeof(T))) % 64 == 0;
    const bool silu = p.activation == kActSilu;
    const int64_t ws = StagedStride(p), nt = t1 - t0;
    T* line = reinterpret_cast<T*>(sc.line);
    WithColumnKinds(W, st, silu, [&](auto kw, auto kst, auto ksilu) {
      BwdColumns<decltype(kw)::value, decltype(ksilu)::value, kNative, decltype(kst)::value, T>(
          x0, p.xs[1], dy0, p.dys[1], sc.wt, ws, sc.bt, nc, dx0, p.dxs[1], nt, nh, pre, sc.dw, sc.db, pf, line);
    });
    float* part = partials + tile * (W + 1) * p.D + c0;
    for (int64_t k = 0; k < W; ++k) std::copy(sc.dw + k * nc, sc.dw + (k + 1) * nc, part + k * p.D);
    std::copy(sc.db, sc.db + nc, part + W * p.D);
    return;
  }
  for (int64_t t = t0; t < te; ++t) {
    if (t >= s.end) s = find_sequence(p, b, t);
    float* g = sc.g + (t - t0) * nc;
    const bool own = t < t1;
    if (p.channels_contiguous && all_taps_x(p, b, t, s)) {
      for (int64_t k = 0; k < W; ++k) rows[k] = x + b * p.xs[0] + (t - (W - 1) + k) * p.xs[1] + c0;
      GradRowDispatch<T>(p, rows, sc.wt, sc.bt, nc, dy + b * p.dys[0] + t * p.dys[1] + c0, g, own, sc.dw, sc.db);
      continue;
    }
    for (int64_t c = 0; c < nc; ++c) {
      const float gv = grad_pre(p, b, t, s, c0 + c);
      g[c] = gv;
      if (!own) continue;
      sc.db[c] += gv;
      for (int64_t k = 0; k < W; ++k) {
        const TapSource src = tap_source(p, b, t, s, k);
        if (src.kind != 0) sc.dw[k * nc + c] = std::fma(gv, source_value(p, b, s.n, c0 + c, src), sc.dw[k * nc + c]);
      }
    }
  }

  // dx[pos] = sum_i w[W-1-i] g[pos + i] over the tokens pos + i of pos's sequence (+ the final state's
  // gradient for the sequence's last W-1 positions).
  const float* grows[kMaxWidth];
  s = find_sequence(p, b, t0);
  for (int64_t pos = t0; pos < t1; ++pos) {
    if (pos >= s.end) s = find_sequence(p, b, pos);
    bool fast = p.channels_contiguous && pos + W - 1 < s.end && (!p.dhT || pos < s.end - (W - 1));
    if (fast && p.mode == kModeSeqIdx) {
      const int64_t id = seq_at(p, b, pos);
      for (int64_t q = pos + 1; q < pos + W && fast; ++q) fast = seq_at(p, b, q) == id;
    }
    if (fast) {
      for (int64_t i = 0; i < W; ++i) grows[i] = sc.g + (pos + i - t0) * nc;
      T* dxr = dx + b * p.dxs[0] + pos * p.dxs[1] + c0;
      DxRowDispatch<kNative, T>(W, grows, sc.wt, StagedStride(p), nc, dxr, stream && tv::StreamAligned(DF(), dxr));
      continue;
    }
    const int64_t id = p.mode == kModeSeqIdx ? seq_at(p, b, pos) : 0;
    for (int64_t c = 0; c < nc; ++c) {
      float acc = 0.f;
      for (int64_t i = 0; i < W; ++i) {
        const int64_t t = pos + i;
        if (t >= s.end || (p.mode == kModeSeqIdx && seq_at(p, b, t) != id)) continue;
        acc = std::fma(sc.wt[(W - 1 - i) * StagedStride(p) + c], sc.g[(t - t0) * nc + c], acc);
      }
      acc += dfinal_to_x(p, b, pos, s, c0 + c);
      dx[b * p.dxs[0] + pos * p.dxs[1] + (c0 + c) * p.dxs[2]] = from_f32<T>(acc);
    }
  }

  float* part = partials + tile * (W + 1) * p.D + c0;
  for (int64_t k = 0; k < W; ++k) std::copy(sc.dw + k * nc, sc.dw + (k + 1) * nc, part + k * p.D);
  std::copy(sc.db, sc.db + nc, part + W * p.D);
}

template <class T, bool kNative>
void Backward(const Conv1dParams& p, float* partials) {
  const int64_t tpr = tiles_per_row(p, kTimeTile);
  const int64_t tiles = p.B * tpr;
  const int64_t chunks = (p.D + kBwdChan - 1) / kBwdChan;
  const bool stream = Streams<T>(p);
  const auto staged = StageWeights(p);
  // Blocks of one time tile (all its chunks): one scratch allocation (0.8 MiB) per block.
  tile::parallel_blocks(tiles * chunks, chunks, [&](int64_t i0, int64_t i1) {
    auto sc = hwy::AllocateAligned<BwdScratch>(1);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t tile = i / chunks, chunk = i - tile * chunks;
      const int64_t b = tile / tpr, t0 = (tile - b * tpr) * kTimeTile;
      const int64_t c0 = chunk * kBwdChan;
      sc[0].wt = staged.get() + c0;
      sc[0].bt = staged.get() + p.W * StagedStride(p) + c0;
      RegionPrefetch pf = NextItemRegion<T>(p, i + 1, tiles * chunks, chunks, kBwdChan, p.dy, p.dys);
      BwdItem<T, kNative>(p, b, tile, t0, std::min(t0 + kTimeTile, p.T), c0, std::min(kBwdChan, p.D - c0), sc[0],
                          partials, stream, pf);
    }
    if (stream) hwy::FlushStream();
  });
  // dweight / dbias: the tiles' partial sums in tile order, per channel block.
  const int64_t W = p.W;
  tile::parallel_blocks(p.D, 256, [&](int64_t d0, int64_t d1) {
    HWY_ALIGN float acc[(kMaxWidth + 1) * 256];
    const int64_t nd = d1 - d0;
    std::fill(acc, acc + (W + 1) * nd, 0.f);
    for (int64_t tile = 0; tile < tiles; ++tile)
      for (int64_t k = 0; k <= W; ++k) {
        const float* src = partials + (tile * (W + 1) + k) * p.D + d0;
        for (int64_t c = 0; c < nd; ++c) acc[k * nd + c] += src[c];
      }
    for (int64_t c = 0; c < nd; ++c) {
      for (int64_t k = 0; k < W; ++k) st_f32(p.dw, p.w_dtype, (d0 + c) * p.dws[0] + k * p.dws[1], acc[k * nd + c]);
      if (p.db) st_f32(p.db, p.b_dtype, (d0 + c) * p.dbs, acc[W * nd + c]);
    }
  });
  if (p.dh0) {
    tile::parallel_blocks(p.N, std::max<int64_t>(1, 4096 / std::max<int64_t>(p.D, 1)), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t d = 0; d < p.D; ++d)
          for (int64_t j = 0; j < p.W - 1; ++j)
            st_f32(p.dh0, p.dh0_dtype, n * p.dh0s[0] + d * p.dh0s[1] + j * p.dh0s[2], dinitial_value(p, n, d, j));
    });
  }
}

}  // namespace strata::conv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
