#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, then run `strata atk` (precision,
# performance against the measured copy bandwidth, peak memory) on the GPU when one is present, else on the
# CPU. Reports land in atk_report/ (JSON, Markdown and PNG plots).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$STRATA_ROOT"
bash scripts/install_deps.sh >/dev/null
PRESET=cpu-release
DEVICE=cpu
if [ "$STRATA_HAS_GPU" = 1 ]; then PRESET=cuda-release; DEVICE=cuda; fi
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j "$(nproc)"
"$STRATA_VENV/bin/python" -m pip install -q --no-build-isolation "$STRATA_ROOT"
"build/$PRESET/tools/strata/strata" info
status=0
"build/$PRESET/tools/strata/strata" atk --device "$DEVICE" --out atk_report "$@" || status=$?
"$STRATA_VENV/bin/python" tools/atk_plot.py atk_report/atk.json  # atk_perf.png, atk_precision.png
exit $status
