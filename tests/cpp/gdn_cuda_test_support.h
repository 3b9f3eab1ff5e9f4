// Device-side helpers shared by the CUDA tests of the GDN kernels (test_gdn_fwd_cuda_variants.cpp,
// test_gdn_bwd_cuda_variants.cpp): random token tensors uploaded to the GPU and contiguous gdn_bwd::View
// descriptors.
#pragma once

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_support.h"
#include "opbase/dtype.h"
#include "ops/linear_attn/gdn_bwd_common/gdn_bwd_common.h"

namespace strata::linear_attn::gdn_test {

// n random values in dtype dt (bf16 / f16 bits, or f32), N(0, sd) (uniform in [lo, 0] for gates when lo < 0).
inline std::vector<uint8_t> random_bytes(int64_t n, int32_t dt, std::mt19937_64& rng, double sd, double lo = 0) {
  std::normal_distribution<float> nd(0.f, static_cast<float>(sd));
  std::uniform_real_distribution<float> ud(static_cast<float>(lo), 0.f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * dtype_size(dt));
  for (int64_t i = 0; i < n; ++i) {
    const float x = lo < 0 ? ud(rng) : nd(rng);
    if (dt == STRATA_DTYPE_F32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t b = dt == STRATA_DTYPE_BF16 ? f32_to_bf16_bits(x) : f32_to_f16_bits(x);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

inline std::unique_ptr<test::Dev> upload(const std::vector<uint8_t>& h) {
  auto d = std::make_unique<test::Dev>(h.size());
  if (!h.empty()) EXPECT_EQ(cudaMemcpy(d->p, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// Contiguous views: [B, T, heads, D] (D = 0: [B, T, heads]) and the chunk states [B, NT, HV, K, V].
inline gdn_bwd::View tok(void* p, int32_t dt, int64_t T, int64_t heads, int64_t D) {
  gdn_bwd::View v;
  v.p = p, v.dtype = dt;
  if (D > 0) v.s[0] = T * heads * D, v.s[1] = heads * D, v.s[2] = D;
  else v.s[0] = T * heads, v.s[1] = heads, v.s[2] = 1;
  return v;
}
inline gdn_bwd::View states(void* p, int32_t dt, int64_t NT, int64_t HV, int64_t K, int64_t V) {
  gdn_bwd::View v;
  v.p = p, v.dtype = dt;
  v.s[0] = NT * HV * K * V, v.s[1] = HV * K * V, v.s[2] = K * V, v.s[3] = V;
  return v;
}

}  // namespace strata::linear_attn::gdn_test
#endif  // STRATA_WITH_CUDA
