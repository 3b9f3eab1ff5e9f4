#!/bin/bash
# causal_conv1d CPU kernels on the H200 host's Xeon (session 16, helper cpu_conv; first run in session 17's run 1:
# bench/results/2026-12-01_h200_session17_run1_pending.txt). Session 16 changed the kernels of AVX2 / SSE4 / scalar
# (split column sweeps, README "Performance / CPU"); AVX-512 (cpu.avx512_bf16, the Xeon's dispatch) keeps the
# session-15 sweeps bit for bit. This script (<= 45 s): (1) the rates of the dispatched implementation against the
# session-15 Xeon table (README: fwd / bwd [1,512,1024] 1 thread in L2 6.38 / 3.21 GB/s; [1,8192,8192] 2 threads
# fwd 13.96 GB/s = 54 % of copy, bwd 4.98 GB/s = 30 %; bwd 16 threads 33.4 GB/s = 67 %): expected unchanged;
# (2) the same 1-thread and 2-thread cases with STRATA_FORCE_IMPL=cpu.avx2 (the split sweeps on the Xeon's cores):
# if avx2 beats avx512_bf16 there, the next step is kSplitSweeps for AVX-512 too (cpu-inl.h) and an A/B;
# (3) the op's tests on every ISA of the Xeon (AVX-512 included, which the AVX2-only CI machine cannot run).
set -u
B=${BUILD:-build/gpu}
LIB=$B/libstrata.so
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s]"; }
TMP=${OUT:-/tmp}/cpu_conv_tmp; mkdir -p "$TMP"
echo "===== cpu_conv ($(date -u +%H:%M:%S), tree $(git rev-parse --short HEAD 2>/dev/null), lib $LIB)"
lscpu | grep -E "^Model name|^CPU\(s\)" | tr -s ' ' | paste -sd';'
timeout 20 g++ -std=c++20 -O2 -Iinclude bench/cpu_op_rates.cpp -o "$TMP/rates" -ldl || { echo "rates build failed"; exit 1; }
R="$TMP/rates"
for impl in "" cpu.avx2; do
  echo "== ${impl:-dispatched}: 1 thread on core 2, thread CPU time, shapes in L2, vs a 1-thread 256 MiB copy $(el)"
  STRATA_FORCE_IMPL=$impl OMP_NUM_THREADS=1 timeout 6 taskset -c 2 "$R" "$LIB" - 7 --copy 256 --set l2 conv_fwd conv_bwd 2>&1
  echo "== ${impl:-dispatched}: 2 threads on cores 2,3, wall, atk shapes vs a 2-thread 512 MiB copy $(el)"
  STRATA_FORCE_IMPL=$impl OMP_NUM_THREADS=2 timeout 8 taskset -c 2,3 "$R" "$LIB" - 5 --wall --copy 512 --set atk conv_bwd conv_fwd 2>&1
done
echo "== dispatched: 16 threads, wall, atk shapes vs a 16-thread 2 GiB copy $(el)"
OMP_NUM_THREADS=16 timeout 7 "$R" "$LIB" - 5 --wall --copy 2048 --set atk conv_bwd conv_fwd 2>&1 | grep -v impl
echo "== tests: causal_conv1d (every CPU ISA of this host, determinism), sigmoid_rcp, conformance $(el)"
timeout 12 "$B/tests/strata_tests" --gtest_filter='CausalConv1d.*:TileSigmoidRcp.*:*Conformance.*causal_conv1d*' 2>&1 \
  | grep -E "^\[  (PASSED|FAILED) |FAILED|OK \] .*(Conformance|Bitwise)|rcp max relative error" | head -30
echo "== done $(el)"
