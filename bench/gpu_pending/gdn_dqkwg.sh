#!/bin/bash
# gdn_dqkwg (session 16): chunk_bwd_dqkwg writing dq through its l2norm backward, rows staged in shared memory
# (chunk_bwd_dqkwg_cuda_wgmma_dq_norm, a separate kernel instantiation; forced impl cuda.sm90.chunked_dq_staged,
# GdnBwdDq::kStaged in gdn_cuda_bwd). Repo root, BUILD set.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
echo "[dqkwg s16] $(git rev-parse --short HEAD 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) $(date -u +%H:%M:%S)"
echo "[dqkwg s16] == correctness: staged fold vs plain + float64 l2norm bwd, rejects, composed forced impl (conformance cases), forms same bits, wgmma vs mma, determinism"
tmo 18 $T --gtest_filter='GdnDqkwgTma.StagedDqNormMatchesPlainPlusNormBwd:GdnDqkwgTma.StagedDqNormRejects:GdnDqkwgTma.ComposedDqStagedConformance:GdnDqkwgTma.SameBitsAsCpAsyncForm:GdnDqkwgTma.UnboundedWaitSameBits:GdnBwdCudaVariants.DqkwgWgmmaMatchesMma:GdnBwdDeterminism.CudaSameBitsForRepeats' 2>&1 \
  | grep -E '^\[dqkwg s16\]|^\[       OK|^\[  FAILED|^\[  PASSED|Failure|differs|dq\[|Expected|Which is|worst' | head -40 | sed 's/^/[dqkwg s16] /'
echo "[dqkwg s16] == timing (bf16 H=16 HV=32 K=V=128)"
tmo 12 $T --gtest_filter='GdnDqkwgTma.StagedDqNormTiming:GdnDqkwgTma.ComposedDqStagedTiming' 2>&1 | grep -E '^\[dqkwg s16\]|FAILED|Failure'
echo "[dqkwg s16] == conformance (cuda, every CUDA impl) of the bf16 K=128 l2norm cases"
conformance_cases chunk_gated_delta_rule_bwd 6 "dtype=bf16 shape=2x130x2x4x128x128 cu=none h0=1 ht=1 dht=1 l2=1 gate=normal beta=sig scale=0 layout=contiguous seed=30" | sed 's/^/[dqkwg s16] /'
tmo 6 $T --gtest_filter='GdnSave.SavedTiming' 2>&1 | grep -E '^\[gdn_save timing|FAILED' | sed 's/^/[dqkwg s16] /'
echo "[dqkwg s16] == done $(date -u +%H:%M:%S) (${SECONDS} s)"
