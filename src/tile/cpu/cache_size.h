// The host CPU's per-core L2 size, for kernels that size their cache blocks by it (session 17, h17/cpu_norm2:
// rms_norm_gated's one-group backward sub-blocks, which overflowed the 512 KiB L2 of the Zen 3 CI machine at the size
// chosen on the Xeon's 2 MiB one).
#pragma once

#include <unistd.h>

#include <cstdint>

namespace strata::tile {

// Bytes of L2 per core as the C library reports it (sysconf), or 0 when it does not know.
inline int64_t cpu_l2_bytes() {
  static const int64_t bytes = [] {
#ifdef _SC_LEVEL2_CACHE_SIZE
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{0};
#else
    return int64_t{0};
#endif
  }();
  return bytes;
}

}  // namespace strata::tile
