# Sourced by the scripts: common settings for building and running Strata here.
STRATA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STRATA_VENV="${STRATA_VENV:-$HOME/.cache/strata/venv}"
export STRATA_ROOT STRATA_VENV
# torch sets OpenMP to one thread on import on these VMs (dependencies.md pitfall 4): ask for every core.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
# OpenBLAS (under torch) misdetects this CPU family; name the core type it should use (pitfall 1).
if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SKYLAKEX; else export OPENBLAS_CORETYPE=HASWELL; fi
# The build preset: CUDA when a GPU answers here, else CPU only (nvcc alone still builds the CUDA code in
# the test build, see scripts/test.sh).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  STRATA_HAS_GPU=1
else
  STRATA_HAS_GPU=0
fi
export STRATA_HAS_GPU
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
