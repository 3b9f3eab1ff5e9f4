// Test helpers for the CUDA-only tests that drive kernels directly (the GDN variant tests): whether a GPU is
// present, and a device buffer that uploads, poisons and reads back its bytes. Include inside
// `#if STRATA_WITH_CUDA`.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "opbase/row_layout.h"

namespace strata::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device buffer of `bytes` bytes (freed on scope exit).
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : bytes(b) { EXPECT_EQ(cudaMalloc(&p, b ? b : 1), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<uint8_t> bits() const {
    std::vector<uint8_t> h(bytes);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (bytes) EXPECT_EQ(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void poison() { EXPECT_EQ(cudaMemset(p, 0xff, bytes), cudaSuccess); }  // NaN in f32 / bf16 / f16
};

// Rows `width` elements apart with unit column stride, row 0 at offset 0 (session 10, fused_gpu's tests).
inline RowLayout dense_rows(int64_t rows, int64_t width) {
  RowLayout l;
  l.nd = 1;
  l.sizes[0] = rows;
  l.strides[0] = width;
  return l;
}

}  // namespace strata::test
