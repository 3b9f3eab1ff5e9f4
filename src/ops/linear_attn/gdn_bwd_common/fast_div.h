// Division of 31-bit unsigned values by a divisor fixed at launch, by one 32 x 32 -> 64-bit multiply and a shift
// (session 14: chunk_bwd_dqkwg's persistent wgmma kernel decodes its work items (chunk, head) every value head;
// the 64-bit divisions it used cost ~60 instructions each on the group that limits it).
//   l = ceil(log2 d), m = ceil(2^(31 + l) / d) (< 2^32), floor(n / d) = (n m) >> (31 + l) for 0 <= n < 2^31:
//   m d = 2^(31 + l) + e with 0 <= e < d <= 2^l, so n m / 2^(31 + l) = n / d + n e / (d 2^(31 + l)), and the
//   second term is below 1 / d, which never carries n / d past the next integer. On the device: the high word
//   of (2 n) m shifted by l (32-bit operations only).
#pragma once

#include <cstdint>

#include "opbase/dtype.h"  // STRATA_HD

namespace strata::linear_attn::gdn_bwd {

struct FastDiv {
  uint32_t d = 1, m = 1u << 31, l = 0;  // (d = 1: m = 2^31, l = 0)
  STRATA_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    return __umulhi(n << 1, m) >> l;
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(n << 1) * m) >> 32) >> l;
#endif
  }
};
// The divider of d (1 <= d < 2^31); n must stay below 2^31.
inline FastDiv make_fast_div(uint32_t d) {
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  FastDiv f;
  f.d = d;
  f.m = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
  f.l = l;
  return f;
}

}  // namespace strata::linear_attn::gdn_bwd
