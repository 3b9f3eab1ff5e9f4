#!/usr/bin/env bash
# Installs what Strata needs on a Debian 12 machine (the development and CI kind), idempotently:
#   - C++ build and library dependencies from Debian (docs: ../shared/docs/reference/dependencies.md);
#   - a Python virtual environment with torch, numpy, pytest and the binding toolkit from PyPI.
# The venv lives outside the checkout (STRATA_VENV, default ~/.cache/strata/venv) so fresh clones reuse it.
set -euo pipefail

DEBS=(cmake ninja-build g++ pkg-config ccache libgtest-dev libgmock-dev googletest libbenchmark-dev
      libdnnl-dev ocl-icd-opencl-dev libhwy-dev libcli11-dev libfmt-dev nlohmann-json3-dev libdlpack-dev)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[strata] installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV="${STRATA_VENV:-$HOME/.cache/strata/venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[strata] creating the Python environment $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, numpy, pytest, nanobind, scikit_build_core, matplotlib" 2>/dev/null; then
  echo "[strata] installing Python packages into $VENV (torch is large: about a minute)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q torch numpy pytest nanobind scikit-build-core ninja "cmake>=3.25" matplotlib
fi
echo "$VENV"
