#!/bin/bash
# chunk_loss's CPU target on the H200 host's Xeon (session 18, h18/gap4_docs; <= 40 s): fwd+bwd N=1024 D=1024
# V=32000 against oneDNN's own dnnl_sgemm on the same three GEMMs (target >= 70 % of its rate, peak <= gradients +
# 64 MiB: the plan's workspace is printed), f32 and bf16, the three arms interleaved call by call in one process
# (bench/chunk_loss_cpu_rate.cpp), on 2 pinned cores and on 16 threads; then the ChunkLoss tests and the chunk_loss
# conformance on every CPU ISA of this host (AVX-512 included, which the AVX2-only CI machine cannot run) with what
# is left of the 40 s (expected: build 3 s, 2 cores ~15 s, 16 threads ~4 s).
set -u
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s]"; }
B=${BUILD:-build/gpu}
LIB=$B/libstrata.so
TMP=${OUT:-/tmp}/cpu_chunk_loss_tmp; mkdir -p "$TMP"
echo "===== cpu_chunk_loss ($(date -u +%H:%M:%S), tree $(git rev-parse --short HEAD 2>/dev/null), lib $LIB, load $(cut -d' ' -f1-3 /proc/loadavg))"
lscpu | grep -E "^Model name|^CPU\(s\)" | tr -s ' ' | paste -sd';'
timeout 20 g++ -std=c++20 -O2 -Iinclude bench/chunk_loss_cpu_rate.cpp -o "$TMP/clrate" -ldl || { echo "chunk_loss_cpu_rate: build failed"; exit 1; }
echo "== chunk_loss vs dnnl_sgemm x3: 2 threads on cores 2,3, wall, 3 rounds $(el)"
OMP_NUM_THREADS=2 timeout 20 taskset -c 2,3 "$TMP/clrate" "$LIB" 3 --wall 2>&1
echo "== the same, 16 threads, wall, 3 rounds $(el)"
OMP_NUM_THREADS=16 timeout 8 "$TMP/clrate" "$LIB" 3 --wall 2>&1 | grep -v "workspace"
left=$(( 38 - ($(date +%s) - T0) ))
echo "== tests: ChunkLoss.* and the chunk_loss conformance (every CPU ISA), ${left} s left $(el)"
if [ "$left" -gt 3 ]; then
  STRATA_CONFORMANCE_DEVICES=cpu timeout "$left" "$B/tests/strata_tests" \
    --gtest_filter='ChunkLoss.*:*Conformance*chunk_loss*:-ChunkLoss.Cuda*' > "$TMP/tests.txt" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|^\[conformance\]" "$TMP/tests.txt" | head -20
  [ $rc -eq 124 ] && echo "tests: cut by the time limit after $(grep -c '^\[       OK' "$TMP/tests.txt") passed tests (rc 124)"
fi
echo "== done $(el)"
