#!/bin/bash
# gdn_fwd (session 16; NOT GPU-run in session 16, no device lent: the first GPU run of the next session runs this):
# the fused wgmma pass in thread-block clusters sharing K, Q by TMA multicast
# (GdnFwdParams::pass_cluster; forced form cuda.sm90.fused_norm_cl). Repo root, BUILD set.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
echo "== gdn_fwd $(git rev-parse --short HEAD 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) $(date -u +%H:%M:%S)"
echo "== correctness: clustered pass = kShort bits (plain / r_q formed / r_q read, widths, cluster 2/4/8), f64 + same bits at op level"
tmo 10 $T --gtest_filter='GdnFwdCudaVariants.WgmmaClusterGivesShortBits' 2>&1 \
  | grep -E '^\[  (PASSED|FAILED)|^\[       OK|^\[  FAILED|Failure|not the split|differ from the split form$|gdn_fwd s16|Expected|Which is' \
  | grep -v ' 0 of ' | head -30
tmo 10 $T --gtest_filter='ChunkGatedDeltaRuleCuda.WgmmaFusedForwardMatchesReference' 2>&1 \
  | grep -E '^\[       OK|^\[  FAILED|Failure|gdn_fwd s16|Expected|Which is|clustered' | head -20
echo "== pass alone (median of 9 interleaved)"
tmo 8 $T --gtest_filter='GdnFwdCudaVariants.WgmmaClusterPassTiming' 2>&1 | grep -E 'gdn_fwd s16|FAILED|Failure'
echo "== whole forward (median of 9 interleaved) and steps"
tmo 14 $T --gtest_filter='GdnFwdSteps.FusedForwardTimingAtBenchShapes' 2>&1 \
  | grep -E 'gdn_fwd s1[56]|FAILED|Failure' | grep -v 'host time' | sed 's/\[gdn_fwd s15\]/[gdn_fwd s16]/'
echo "== conformance (cuda only): chunk_gated_delta_rule_fwd, every CUDA impl"
conformance_cases chunk_gated_delta_rule_fwd 4 "dtype=bf16 shape=2x130x2x4x128x128 cu=none h0=1 ht=1 dht=0 l2=1 gate=normal beta=sig scale=0 layout=contiguous seed=30" \
  "dtype=bf16 shape=1x300x1x2x128x64 cu=0-0-1-64-129-300 h0=1 ht=1 dht=0 l2=1 gate=strong beta=sig scale=0 layout=contiguous seed=31" \
  "dtype=bf16 shape=1x200x2x8x128x128 cu=0-63-64-200 h0=0 ht=1 dht=0 l2=1 gate=weak beta=sig scale=0 layout=contiguous seed=32" \
  "dtype=bf16 shape=2x100x1x2x128x96 cu=none h0=1 ht=1 dht=0 l2=1 gate=normal beta=small scale=0 layout=padded seed=33"
echo "== done $(date -u +%H:%M:%S) (${SECONDS} s)"
