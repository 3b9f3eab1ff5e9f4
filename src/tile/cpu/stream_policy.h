// Whether a kernel that writes two interleaved output streams (rms_norm_gated's backward dx and dz; the
// split-layout clipped_swiglu backward's dA and dB halves of each row) should write them with non-temporal stores.
// Measured in session 15 (bench/cpu_op_rates.cpp, bf16, the atk shapes, 2 threads, plain against non-temporal
// stores interleaved call by call; bench/results/2026-12-01_*cpu_fused_s15*): on the AMD EPYC (Zen 3) development VM
// the two-stream kernels ran 1.2-3.1 x faster with plain stores (rms_norm_gated bwd [4096, 5120] 0.99 -> 2.68 GB/s,
// [262144, 128] 3.35 -> 4.00; clipped_swiglu bwd split [8192, 4096] 1.00 -> 3.14), while one-stream kernels moved
// within -12 / +23 %. On the H200 host's Xeon the same two-stream kernels were within 3 % either way at 2 threads
// except rms_norm_gated bwd [262144, 128], where the non-temporal stores were 5 % (2 threads) and 21 % (16
// threads) faster. So: non-temporal stores for two output streams everywhere but on AMD. (A synthetic two-stream
// probe slowed the same way on the AMD VM only when the outputs sat 16-128 bytes past the inputs mod 4 KiB: loads
// 4K-aliasing partly filled write-combining lines are the likely cause.)
#pragma once

namespace strata::tile {

inline bool cpu_streams_two_outputs() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = [] {
    __builtin_cpu_init();
    return !__builtin_cpu_is("amd");
  }();
  return ok;
#else
  return true;
#endif
}

}  // namespace strata::tile
