#!/bin/bash
# gdn_wybwd (session 16; NOT GPU-run: no device was lent in session 16). kWyFinStaged restored (dk's l2norm backward
# folded into prepare_wy_repr_bwd) and wired into the composed GDN backward (gdn_cuda_bwd's wy_variant; forced impl
# cuda.sm90.chunked_dk_staged); cuda.sm90.mma split into one unit per dtype. For the first GPU run of the next session:
# run from the repo root with BUILD=<build dir> (strata_tests built with CUDA); ~30-45 s. What to compare and the
# decision rule: src/ops/linear_attn/prepare_wy_repr_bwd/README.md, "Session 16", "Not GPU-run".
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
echo "== gdn_wybwd $(git rev-parse --short HEAD 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) $(date -u +%H:%M:%S)"
echo "== correctness: NormFold (float64), rejects, forms same bits, composed fold vs row_norm_bwd tail, saved, variants"
tmo 10 $T --gtest_filter='GdnWyBwdEpilogue.SameBitsAsTwoPerSm:GdnWyBwdEpilogue.NormFold*:GdnWyBwdEpilogue.ComposedDkFold:GdnBwdCudaVariants.WyBwdVariants:GdnSave.CudaBackwardWithSavedSameBits:GdnBwdDeterminism.CudaSameBitsForRepeats' 2>&1 \
  | grep -E '^\[  (PASSED|FAILED)|^\[       OK|^\[  FAILED|Failure|differs|dk\[|Expected|Which is' | head -40
echo "== timing (bf16 H=16 HV=32 K=V=128, median of 9 interleaved calls)"
tmo 14 $T --gtest_filter='GdnWyBwdEpilogue.Timing:GdnWyBwdEpilogue.ComposedDkFoldTiming' 2>&1 | grep -E '^\[wy_bwd|FAILED'
echo "== conformance (cuda only): chunk_gated_delta_rule_bwd l2norm cases (every CUDA impl), prepare_wy_repr_bwd (all)"
conformance_cases chunk_gated_delta_rule_bwd 4 "dtype=bf16 shape=2x130x2x4x128x128 cu=none h0=1 ht=1 dht=1 l2=1 gate=normal beta=sig scale=0 layout=contiguous seed=30" \
  "dtype=f16 shape=1x100x1x4x128x128 cu=none h0=1 ht=1 dht=0 l2=1 gate=normal beta=sig scale=0 layout=contiguous seed=29" \
  "dtype=bf16 shape=1x80x1x2x100x100 cu=none h0=1 ht=1 dht=1 l2=1 gate=normal beta=sig scale=0 layout=padded seed=34" \
  "dtype=bf16 shape=1x130x2x6x64x64 cu=none h0=0 ht=1 dht=1 l2=1 gate=normal beta=sig scale=1 layout=contiguous seed=28 saved=1"
STRATA_CONFORMANCE_DEVICES=cuda tmo 10 $T --gtest_filter='Ops/Conformance.EveryImplementationMatchesFloat64/prepare_wy_repr_bwd' 2>&1 \
  | grep -E '^\[conformance\]|^\[  FAILED|impl=' | head -8
tmo 6 $T --gtest_filter='GdnSave.SavedTiming' 2>&1 | grep -E '^\[gdn_save timing|FAILED'
echo "== done $(date -u +%H:%M:%S) (${SECONDS} s)"
