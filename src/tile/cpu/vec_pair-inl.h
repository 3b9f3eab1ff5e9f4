// Two adjacent output vectors stored at once (session 16, h16/cpu_norm): StoreOut2(df, v0, v1, p) writes
// v0 to p[0, N) and v1 to p[N, 2N) rounded to T, as StoreOut (tile/cpu/vec-inl.h) twice, with the same bits.
// On AVX2, bf16 outputs pack the two vectors before one store: the integer rounding of each vector, then one
// vpackusdw + vpermq and one 32-byte store (per vector 1.5 operations and half a store fewer than StoreOut's
// vpackusdw + vpermq + 16-byte store). Non-temporal stores (kStream: callers check only the alignment of one
// vector), the other dtypes and the other targets take StoreOut twice (an AVX-512 form, one vcvtne2ps2bf16 per
// two vectors, waits for a machine with AVX-512 to test and time it on). Include after tile/cpu/vec-inl.h
// (per-target include guard, as vec-inl.h).
#if defined(STRATA_TILE_CPU_VEC_PAIR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_TILE_CPU_VEC_PAIR_INL_H_
#undef STRATA_TILE_CPU_VEC_PAIR_INL_H_
#else
#define STRATA_TILE_CPU_VEC_PAIR_INL_H_
#endif

#include <hwy/highway.h>

#include <type_traits>

#include "tile/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3 && defined(STRATA_WANT_AVX512_BF16)
#pragma GCC target("avx512bf16")  // as vec-inl.h: StoreOut's native instances inline here
#endif
namespace strata::tile::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <bool kStream, bool kNative, class DF, class T>
HWY_INLINE void StoreOut2(DF df, hn::Vec<DF> v0, hn::Vec<DF> v1, T* p) {
  if constexpr (!kStream && std::is_same_v<T, bf16_t>) {
#if HWY_TARGET == HWY_AVX2
    // Bf16Bits leaves each lane's bits in [0, 0xffff]: the signed-to-unsigned 16-bit pack keeps them; it packs
    // per 128-bit half (v0 lo, v1 lo, v0 hi, v1 hi), so vpermq 0xD8 restores the order.
    const __m256i packed = _mm256_packus_epi32(Bf16Bits(df, v0).raw, Bf16Bits(df, v1).raw);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
    return;
#endif
  }
  StoreOut<kStream, kNative>(df, v0, p);
  StoreOut<kStream, kNative>(df, v1, p + hn::Lanes(df));
}

}  // namespace strata::tile::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
