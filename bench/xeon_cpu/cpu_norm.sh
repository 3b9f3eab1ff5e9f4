#!/bin/bash
# Run from the repo root of a GPU build (BUILD=build/gpu), <= 45 s (first run: session 17 run 1).
# Session 16 (h16/cpu_norm): rms_norm_gated and clipped_swiglu CPU rates on the H200 host's Xeon (AVX-512) and the
# two ops' CPU tests. bench/cpu_op_rates.cpp times the C API of build/gpu/libstrata.so; copy = a copy of the named
# size on the same threads, interleaved with the op round by round ("= N% of copy": median of the paired ratios).
set -u
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s]"; }
BUILD=${BUILD:-build/gpu}
LIB=$BUILD/libstrata.so
D=${OUT:-/tmp}
lscpu | grep -E "^Model name|^CPU\(s\)|^L2 cache" | tr -s ' ' | tr '\n' ';'; echo
g++ -std=c++20 -O2 -Iinclude bench/cpu_op_rates.cpp -o "$D/cpu_op_rates" -ldl || { echo "cpu_op_rates: build failed"; exit 1; }
R="$D/cpu_op_rates"
echo "== 1 thread on core 2, thread CPU time, shapes in L2 (instruction-bound rate) vs a 1-thread 256 MiB copy $(el)"
OMP_NUM_THREADS=1 timeout 9 taskset -c 2 "$R" "$LIB" - 5 --copy 256 --set l2 rng_fwd rng_bwd sw_fwd sw_bwd 2>/dev/null
echo "== 2 threads on cores 2,3, wall, atk shapes vs a 2-thread 512 MiB copy $(el)"
OMP_NUM_THREADS=2 timeout 13 taskset -c 2,3 "$R" "$LIB" - 5 --wall --copy 512 --set atk rng_fwd rng_bwd sw_fwd sw_bwd 2>/dev/null
echo "== 16 threads, wall, atk shapes vs a 16-thread 2 GiB copy $(el)"
OMP_NUM_THREADS=16 timeout 5 "$R" "$LIB" - 3 --wall --copy 2048 --set atk rng_bwd sw_bwd 2>/dev/null
echo "== tests: sigmoids, both ops (CPU + CUDA), conformance of both ops on every implementation $(el)"
timeout 12 "$BUILD/tests/strata_tests" \
  --gtest_filter='TileSigmoidNoDiv.*:RmsNormGated*:ClippedSwiglu*:*Conformance*rms_norm_gated*:*Conformance*clipped_swiglu*' 2>&1 |
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|max relative" | head -30
echo "== done $(el)"
