#!/usr/bin/env bash
# Downloads, on the development machine, the Debian packages of the C++ dependencies that the GPU machine
# lacks (docs GPU_MACHINE.md: it has no Highway and no network) into the git-ignored folder .deps/debs, which
# travels with the work tree. scripts/gpu_check.sh unpacks them there with `dpkg -x` into .deps/root.
#
#   scripts/fetch_gpu_deps.sh          # once, or after the package list below changes
#
# Debian 12 builds against glibc 2.36; the GPU machine (Ubuntu 24.04, glibc 2.39) runs them unchanged.
set -euo pipefail

# libhwy-dev: headers and the libhwy.so link; libhwy1: the shared library libhwy.so.1 it points to.
# libdnnl-dev + libdnnl2: oneDNN (chunk_loss's CPU GEMMs); libdnnl.so.2 needs libOpenCL.so.1 (ocl-icd-libopencl1).
packages=(libhwy-dev libhwy1 libdnnl-dev libdnnl2 ocl-icd-libopencl1)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
debs="$repo/.deps/debs"
mkdir -p "$debs"
cd "$debs"
# Old versions would be unpacked next to the new ones: keep only what this run downloads.
rm -f ./*.deb
apt-get download "${packages[@]}"
downloaded=(./*.deb)
echo "fetch_gpu_deps: ${#downloaded[@]} packages in $debs:"
ls -l "${downloaded[@]}"
