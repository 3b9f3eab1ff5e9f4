#!/usr/bin/env bash
# The whole test suite: C++ (GoogleTest under ctest, including the conformance driver over every CPU ISA and,
# with a GPU, every CUDA path) and Python (pytest: autograd, gradcheck, torch.library / torch.compile).
# Installs what is missing first, so it runs on a fresh machine.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$STRATA_ROOT"
bash scripts/install_deps.sh >/dev/null
# The C++ tests build the CUDA code whenever nvcc exists (so CI compiles it); they run it when a GPU answers.
CUDA=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then CUDA=ON; export PATH="$PATH:/usr/local/cuda/bin"; fi
BUILD=build/test
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_ENABLE_CUDA="$CUDA" -DSTRATA_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
status=0
(cd "$BUILD" && ctest --output-on-failure -j "$(nproc)" > ctest.log 2>&1) || status=1
grep -E "^(The following tests FAILED|[[:space:]]+[0-9]+ - .*\(Failed\))" "$BUILD/ctest.log" || true
grep -h "^\[conformance\]" "$BUILD"/Testing/Temporary/LastTest.log 2>/dev/null | sort -u || true
grep -E "tests passed|Total Test time" "$BUILD/ctest.log" || true  # ctest's closing lines

# Python: the extension is built CPU-only unless a GPU is here (the CUDA code was compiled above already).
if [ "$STRATA_HAS_GPU" = 1 ]; then PYCUDA=AUTO; else PYCUDA=OFF; fi
CMAKE_ARGS="-DSTRATA_ENABLE_CUDA=$PYCUDA" "$STRATA_VENV/bin/python" -m pip install -q --no-build-isolation . || status=1
"$STRATA_VENV/bin/python" -m pytest -q tests/python 2>&1 | tail -n 15 || status=1
exit $status
