#!/usr/bin/env bash
# The public peers that the side-by-side benches (bench/fused_peers.py, gdn_peers.py) time beside Strata, as
# source trees in the git-ignored peers/ folder (pure Python + Triton; nothing is installed or built). They are
# read and run, never copied into Strata (ARCHITECTURE.md §9). Bring peers/ along to the GPU machine (the
# device tool's `carry`); the benches skip any peer that does not import.
#
#   scripts/fetch_peers.sh            # needs network access to github.com
#
# Pinned commits (the ones timed in bench/results):
#   fla-org/flash-linear-attention  bc3b101dcb713ddc5bd8924b66754eb68b5ccf89  -> peers/fla/fla
#   linkedin/Liger-Kernel           ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c  -> peers/liger/liger_kernel
#   apple/ml-cross-entropy          d42911f9b1a1f98289bb601c35c8151562603d74  -> peers/cce/cut_cross_entropy
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
get() {  # get OWNER/NAME COMMIT SUBDIR DEST
  git -C "$tmp" init -q "$2" && git -C "$tmp/$2" fetch -q --depth 1 "https://github.com/$1" "$2"
  rm -rf "$repo/peers/$4" && mkdir -p "$repo/peers/$4"
  git -C "$tmp/$2" archive FETCH_HEAD "$3" | tar x -C "$repo/peers/$4" --strip-components="$(awk -F/ '{print NF-1}' <<<"$3")"
  echo "peers/$4: $1 @ $2"
}
get fla-org/flash-linear-attention bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 fla fla
get linkedin/Liger-Kernel ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c src/liger_kernel liger
get apple/ml-cross-entropy d42911f9b1a1f98289bb601c35c8151562603d74 cut_cross_entropy cce
