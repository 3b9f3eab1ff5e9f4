// float64 reference of chunk_local_cumsum: the ground truth every kernel is tested against (STYLE.md 1).
// Plain loops over sequences, chunks and lanes, written directly from the definition (it does not use the
// window walk the kernels share, so it cross-checks that too). Any float dtypes, any strides.
#include "ops/linear_attn/chunk_local_cumsum/chunk_local_cumsum.h"

#include <algorithm>

namespace strata::linear_attn {

void chunk_local_cumsum_reference(const ChunkCumsumParams& p) {
  const int64_t C = p.chunk_size;
  const double scale = p.scale;
  auto scan_sequence = [&](int64_t b, int64_t bos, int64_t eos) {
    for (int64_t cs = bos; cs < eos; cs += C) {
      const int64_t ce = std::min(cs + C, eos);
      for (int64_t l = 0; l < p.lanes; ++l) {
        const int64_t gl = b * p.g_strides[0] + lane_offset(p.g_strides, p.S, l);
        const int64_t ol = b * p.out_strides[0] + lane_offset(p.out_strides, p.S, l);
        double acc = 0.0;
        for (int64_t i = 0; i < ce - cs; ++i) {
          const int64_t t = p.reverse ? ce - 1 - i : cs + i;
          acc += load_elem(p.g, p.g_dtype, gl + t * p.g_strides[1]);
          store_elem(p.out, p.out_dtype, ol + t * p.out_strides[1], scale * acc);
        }
      }
    }
  };
  if (!p.cu_seqlens) {
    for (int64_t b = 0; b < p.B; ++b) scan_sequence(b, 0, p.T);
    return;
  }
  for (int64_t n = 0; n < p.num_seqs; ++n)
    scan_sequence(0, p.cu_seqlens[n * p.cu_stride], p.cu_seqlens[(n + 1) * p.cu_stride]);
}

}  // namespace strata::linear_attn
