// Fixed work split for OpenMP: the items are cut into blocks whose boundaries depend only on the problem
// (never on the thread count), and every block's result is computed by one thread in a fixed order. So any
// reduction that combines block results in block order gives the same bits with 1, 2 or 64 threads
// (determinism levels 1 and 2, ARCHITECTURE.md §2).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "runtime/runtime_internal.h"

namespace strata::tile {

// Calls fn(begin, end) for consecutive blocks of `block` items covering [0, n), in parallel.
template <class Fn>
void parallel_blocks(int64_t n, int64_t block, Fn&& fn) {
  if (n <= 0) return;
  block = std::max<int64_t>(block, 1);
  const int64_t nblocks = (n + block - 1) / block;
  const int threads = static_cast<int>(std::min<int64_t>(nblocks, rt::num_threads()));
  if (threads <= 1) {
    for (int64_t b = 0; b < nblocks; ++b) fn(b * block, std::min(n, (b + 1) * block));
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t b = 0; b < nblocks; ++b) fn(b * block, std::min(n, (b + 1) * block));
}

// A block size that gives each block about `target_bytes` of traffic (at least one item).
inline int64_t block_for_bytes(int64_t bytes_per_item, int64_t target_bytes = 64 * 1024) {
  return std::max<int64_t>(1, target_bytes / std::max<int64_t>(bytes_per_item, 1));
}

}  // namespace strata::tile
