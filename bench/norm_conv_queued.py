#!/usr/bin/env python3
"""Queued timings for issue 4's rms_norm_gated and causal_conv1d on CUDA (session 8), in one short run (< 40 s):

  * rms_norm_gated forward bf16 [1048576, 128] G = 128 norm_before_gate, weight f32: calls launched back to back
    (CUDA events around the whole loop, as `strata atk` and bench/fused_peers.py time), once per implementation
    (dispatch, then each CUDA forward that takes the shape, forced), against the floor = bytes / the bandwidth of
    a torch copy of the same size measured in the same run;
  * rms_norm_gated forward + backward through Python (autograd; the bench/py_launch_diag.py --fused case): per
    call with a synchronisation, back to back, and the host time per call;
  * causal_conv1d backward bf16 [1, 32768, 8192] W = 4 SiLU with the cu_seqlens of atk's varlen case, queued,
    per CUDA backward implementation (cuda.sm90.lean: dispatched since session 8; cuda.sm90.pipe before).

    PYTHONPATH=build/gpu/pyroot python3 bench/norm_conv_queued.py
"""

import torch

import strata
import strata.api as sapi
from cuda_timing import copy_gbs, host_us, impls_for, per_call_events, queued_ms  # bench/ (this script's folder)


def main():
    torch.manual_seed(0)
    R, D = 1048576, 128
    x = torch.randn(R, D, dtype=torch.bfloat16, device="cuda")
    g = torch.randn_like(x)
    w = torch.rand(D, device="cuda") + 0.5
    nbytes = 3 * x.numel() * 2 + R * 4  # x, z read; y, rstd written
    bw = copy_gbs(nbytes)
    floor = nbytes / (bw * 1e9) * 1e3
    print(f"copy {bw:.0f} GB/s, rms_norm_gated fwd floor {floor:.4f} ms")
    fwd = lambda: sapi.rms_norm_gated(x, g, w, eps=1e-6)  # noqa: E731
    print(f"{'rms_norm_gated fwd bf16 [1048576, 128] nbg, queued':<62} {'ms':>8} {'x floor':>8}")
    for name in [""] + impls_for("rms_norm_gated_fwd"):
        try:
            with strata.force_impl(name or None):
                ms = queued_ms(fwd, iters=40, warm=4)
        except Exception as e:  # an implementation that does not take the shape
            print(f"  {name or 'dispatch'}: {type(e).__name__}: {str(e)[:80]}")
            continue
        print(f"  {name or 'dispatch':<60} {ms:8.4f} {ms / floor:8.3f}")

    xg, gg = x.clone().requires_grad_(True), g.clone().requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    dy = torch.randn_like(x)

    def fwd_bwd():
        xg.grad = gg.grad = wg.grad = None
        sapi.rms_norm_gated(xg, gg, wg, eps=1e-6).backward(dy)

    print(f"rms_norm_gated fwd+bwd via Python: per call {per_call_events(fwd_bwd):.4f} ms, back to back "
          f"{queued_ms(fwd_bwd, iters=30, warm=4):.4f} ms, host {host_us(fwd_bwd):.1f} us/call")
    del x, g, xg, gg, dy

    T, C, W = 32768, 8192, 4
    cu = torch.tensor([0, T // 16 + 5, T // 4 - 3, T // 4 + 1, T // 2 + 17, 7 * T // 8, T], dtype=torch.int32,
                      device="cuda")
    xc = torch.randn(1, T, C, dtype=torch.bfloat16, device="cuda")
    dyc = torch.randn_like(xc)
    wc = torch.randn(C, W, device="cuda") * 0.5
    bc = torch.randn(C, device="cuda") * 0.1
    cbytes = 3 * xc.numel() * 2  # x, dy read; dx written
    cfloor = cbytes / (bw * 1e9) * 1e3
    bwd = lambda: sapi.causal_conv1d_bwd(xc, wc, bc, None, cu, None, dyc, None, "silu")  # noqa: E731
    print(f"{'causal_conv1d bwd bf16 [1, 32768, 8192] W=4 silu varlen N=6, queued':<62} {'ms':>8} {'x floor':>8}")
    for name in [""] + impls_for("causal_conv1d_bwd"):
        try:
            with strata.force_impl(name or None):
                ms = queued_ms(bwd, iters=20, warm=4)
        except Exception as e:
            print(f"  {name or 'dispatch'}: {type(e).__name__}: {str(e)[:80]}")
            continue
        print(f"  {name or 'dispatch':<60} {ms:8.4f} {ms / cfloor:8.3f}")


if __name__ == "__main__":
    main()
