#!/usr/bin/env python3
"""Where the time of a Strata call from Python goes on CUDA: the kernel's own duration (torch.profiler, CUPTI)
next to the per-call time seen by CUDA events around each call, the throughput of back-to-back calls, and the
host time per call. Written to explain why strata.api.l2norm timed 2x slower through Python than through
`strata atk` on the H200 (bench/results/2026-11-29_h200_gpu_check_run1.log).

    python bench/py_launch_diag.py [--no-profile] [--fused]

--fused profiles issue 4's Python fwd+bwd calls instead (fused_cross_entropy grad-in-forward, rms_norm_gated,
causal_conv1d), to explain their Python-vs-C++ gaps (fused_cross_entropy: 2.31 ms from Python vs 1.70 ms in
`strata atk`, bench/results/2026-11-30_h200_session6_run2_fused_peers.log).
"""

import sys

import torch
import torch.nn.functional as F

import strata.api as sapi
from cuda_timing import back_to_back, host_us, per_call_events  # bench/ (this script's folder)


def alternating(fn, *inputs):
    """fn on the inputs taken in turn, as bench/torch_peers.py does (it rotates copies of an input so that
    together they exceed 4x the L2): torch_peers' first case, l2norm, has two such copies and has timed 2x
    slower than this script's one-input loop in every session, for torch's kernels too."""
    state = {"i": 0}

    def call():
        state["i"] += 1
        return fn(inputs[state["i"] % len(inputs)])
    return call


def fused_cases():
    def fwd_bwd(forward, leaves, dy=None):
        def run():
            for t in leaves:
                t.grad = None
            out = forward()
            out = out[0] if isinstance(out, tuple) else out
            out.backward() if dy is None else out.backward(dy)
        return run

    logits = torch.randn(8192, 151936, dtype=torch.bfloat16, device="cuda").mul_(2).requires_grad_(True)
    tgt = torch.randint(0, 151936, (8192,), device="cuda")
    xg = torch.randn(1048576, 128, dtype=torch.bfloat16, device="cuda").requires_grad_(True)
    gg = torch.randn_like(xg).requires_grad_(True)
    wg = (torch.rand(128, device="cuda") + 0.5).requires_grad_(True)
    dyg = torch.randn_like(xg)
    xc = torch.randn(4, 8192, 8192, dtype=torch.bfloat16, device="cuda").requires_grad_(True)
    wc = (torch.randn(8192, 4, dtype=torch.bfloat16, device="cuda") * 0.5).requires_grad_(True)
    bc = (torch.randn(8192, dtype=torch.bfloat16, device="cuda") * 0.1).requires_grad_(True)
    dyc = torch.randn_like(xc)
    return {
        "strata fused_cross_entropy grad_in_forward [8192,151936]": fwd_bwd(
            lambda: sapi.fused_cross_entropy(logits, tgt, grad_in_forward=True), [logits]),
        "strata fused_cross_entropy check_targets=False": fwd_bwd(
            lambda: sapi.fused_cross_entropy(logits, tgt, grad_in_forward=True, check_targets=False), [logits]),
        "strata rms_norm_gated fwd+bwd [1048576,128]": fwd_bwd(
            lambda: sapi.rms_norm_gated(xg, gg, wg, eps=1e-6), [xg, gg, wg], dyg),
        "strata causal_conv1d fwd+bwd [4,8192,8192] W=4": fwd_bwd(
            lambda: sapi.causal_conv1d(xc, wc, bc, activation="silu"), [xc, wc, bc], dyc),
    }


def main():
    if "--fused" in sys.argv:
        cases = fused_cases()
        print(f"{'case':<60} {'events/call ms':>15} {'back-to-back ms':>16} {'host us/call':>13}")
        for name, fn in cases.items():
            print(f"{name:<60} {per_call_events(fn):>15.4f} {back_to_back(fn):>16.4f} {host_us(fn):>13.1f}")
        profile_cases(cases)
        return
    x = torch.randn(524288, 128, dtype=torch.bfloat16, device="cuda")
    x2 = x.clone()
    xr = torch.randn(32768, 4096, dtype=torch.bfloat16, device="cuda")
    cases = {
        "strata l2norm [524288,128] bf16": lambda: sapi.l2norm(x),
        "strata l2norm, 2 inputs alternating": alternating(sapi.l2norm, x, x2),
        "torch F.normalize [524288,128] bf16": lambda: F.normalize(x, dim=-1),
        "torch F.normalize, 2 inputs alternating": alternating(lambda t: F.normalize(t, dim=-1), x, x2),
        "strata rmsnorm_without_weight [32768,4096] bf16": lambda: sapi.rmsnorm_without_weight(xr),
        "torch F.rms_norm [32768,4096] bf16": lambda: F.rms_norm(xr, (4096,)),
    }
    print(f"{'case':<50} {'events/call ms':>15} {'back-to-back ms':>16} {'host us/call':>13}")
    for name, fn in cases.items():
        print(f"{name:<50} {per_call_events(fn):>15.4f} {back_to_back(fn):>16.4f} {host_us(fn):>13.1f}")
    profile_cases(cases)


def profile_cases(cases):
    if "--no-profile" in sys.argv:
        return
    from torch.profiler import ProfilerActivity, profile

    for name, fn in cases.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        print(f"\n-- {name}: kernels (10 calls) --")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=60))


if __name__ == "__main__":
    main()
