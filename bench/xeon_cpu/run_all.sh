#!/usr/bin/env bash
# Runs every script of this folder (README.md) on the GPU machine after scripts/gpu_check.sh built
# $BUILD (default build/gpu): each script with a 60 s cap, its output prefixed by its name.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
export BUILD=${BUILD:-build/gpu}
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/$BUILD/pyroot${PYTHONPATH:+:$PYTHONPATH}
rc=0
for s in bench/xeon_cpu/*.sh; do
  [[ $(basename "$s") == run_all.sh ]] && continue
  echo "===== $(basename "$s" .sh)"
  OUT=${OUT:-/tmp} timeout -k 5 "${PENDING_CAP_S:-60}" bash "$s" || { echo "== rc=$?"; rc=1; }
done
exit $rc
