#!/usr/bin/env bash
# Nsight Compute profiles of the kernels behind `strata atk` cases, on the GPU machine, after
# scripts/gpu_check.sh has built build/gpu. For each op named, the first LAUNCHES kernel launches of its first
# bench case (the atk cases run largest-first for most ops; see each harness) whose names match KERNELS are
# profiled with the sections that say why a kernel is slow: speed of light (achieved memory and compute
# throughput), launch statistics (registers, shared memory, grid), occupancy, warp stall reasons and the memory
# workload. One text report per op, all appended to one file (the device tool returns few files).
#
#   scripts/gpu_ncu.sh OUT_FILE op[:launches] ...     e.g. scripts/gpu_ncu.sh $OUT/ncu.txt chunk_gated_delta_rule_fwd:8
#
# Environment: GPU_NCU_KERNELS (ncu -k filter, e.g. regex:state_mma; default: every kernel: the benchmark's copy
# probe is a memcpy and its inputs are filled on the host, so the first launches are the op's), GPU_NCU_OP_S (time cap per op, default 90 s), GPU_NCU_SECTIONS (default below).
# ncu runs with --clock-control none: the machine's clocks are left as they are (docs/GPU_MACHINE.md).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
strata_bin="$repo/build/gpu/tools/strata/strata"
out="${1:?usage: gpu_ncu.sh OUT_FILE op[:launches] ...}"
shift
if ! command -v ncu >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /opt/nvidia/nsight-compute/*/; do [[ -x $d/ncu ]] && PATH="$d:$PATH"; done
fi
command -v ncu >/dev/null 2>&1 || { echo "gpu_ncu: ncu not found" | tee -a "$out"; exit 1; }
[[ -x $strata_bin ]] || { echo "gpu_ncu: $strata_bin not built (run scripts/gpu_check.sh first)" | tee -a "$out"; exit 1; }

kernel_args=()
[[ -n ${GPU_NCU_KERNELS:-} ]] && kernel_args=(-k "$GPU_NCU_KERNELS")
read -r -a sections <<<"${GPU_NCU_SECTIONS:-SpeedOfLight LaunchStats Occupancy WarpStateStats MemoryWorkloadAnalysis}"
section_args=()
for s in "${sections[@]}"; do section_args+=(--section "$s"); done

rc=0
for spec in "$@"; do
  op="${spec%%:*}"
  launches=8
  [[ $spec == *:* ]] && launches="${spec##*:}"
  {
    echo
    echo "==================== ncu: $op (first $launches launches ${GPU_NCU_KERNELS:+ matching $GPU_NCU_KERNELS}) ===================="
  } >>"$out"
  timeout "${GPU_NCU_OP_S:-90}" ncu --clock-control none --target-processes all "${kernel_args[@]}" \
    --launch-count "$launches" "${section_args[@]}" \
    "$strata_bin" atk --device cuda --ops "$op" --no-precision --iters 1 --out "/tmp/gpu_ncu_$op" >>"$out" 2>&1 ||
    { rc=1; echo "gpu_ncu: $op failed or timed out" | tee -a "$out"; }
  echo "gpu_ncu: $op done"
done
exit "$rc"
