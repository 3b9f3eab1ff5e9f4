#!/usr/bin/env python3
"""Issue 4's three remaining CUDA targets timed beside copy probes of the same read:write mix (session 9), < 30 s:

  * rms_norm_gated forward bf16 [1048576, 128] G = 128 norm_before_gate, weight f32 (reads x, z; writes y, rstd);
  * clipped_swiglu forward bf16 [32768, 2 x 2880] interleaved, GPT-OSS constants (reads x of 2n, writes y of n);
  * fused_cross_entropy, gradient in the forward written in place, bf16 [8192, 151936] mean (reads and writes the
    logits once each, plus the targets).

Every op row is queued (calls back to back, CUDA events around the loop, median of 5 loops), once per CUDA
implementation that takes the shape (dispatch first, then each one forced). The copy probes move the op's bytes in
the op's mix, also queued: `copy_` (1 read : 1 write, the 4.22 TB/s of PERF_TARGETS' floor), `torch.add(a, b,
out=c)` (2 reads : 1 write, rms_norm_gated and clipped_swiglu), and `mul_(1)` in place (1 read : 1 write of the
same buffer, the CE gradient in place). Each op line gives ms, x the fixed floor (bytes / 4.22 TB/s) and x the
probe of its mix (bytes / the probe's rate in this run).

    PYTHONPATH=build/gpu/pyroot python3 bench/fused_mix_probe.py
"""

import torch

import strata
import strata.api as sapi
from cuda_timing import impls_for, queued_ms  # bench/ (this script's folder)

FLOOR_TBS = 4.22  # PERF_TARGETS' device copy rate (H200, 2026-11-29)


def probe_tbs(kind, nbytes):
    """TB/s of a torch probe moving nbytes in total in the given mix ('copy', 'add' 2:1, 'inplace' 1:1)."""
    if kind == "add":  # a, b read, c written: nbytes / 3 bytes each
        n = nbytes // 6
        a = torch.empty(n, dtype=torch.bfloat16, device="cuda").fill_(1)
        b, c = torch.empty_like(a).fill_(2), torch.empty_like(a)
        ms = queued_ms(lambda: torch.add(a, b, out=c), loops=5)
    elif kind == "inplace":  # one buffer read and written
        n = nbytes // 4
        a = torch.empty(n, dtype=torch.bfloat16, device="cuda").fill_(1)
        ms = queued_ms(lambda: a.mul_(1), loops=5)
    else:  # copy: src read, dst written
        n = nbytes // 4
        a = torch.empty(n, dtype=torch.bfloat16, device="cuda").fill_(1)
        c = torch.empty_like(a)
        ms = queued_ms(lambda: c.copy_(a), loops=5)
    return nbytes / (ms * 1e-3) / 1e12


def report(title, op, nbytes, mix, fn, only=None):
    copy = probe_tbs("copy", nbytes)
    mixr = probe_tbs(mix, nbytes) if mix != "copy" else copy
    fl, fm = nbytes / (FLOOR_TBS * 1e12) * 1e3, nbytes / (mixr * 1e12) * 1e3
    print(f"[mix probe] {title}: {nbytes / 1e6:.1f} MB; copy probe {copy:.3f} TB/s, {mix} probe ({'2:1' if mix == 'add' else '1:1'}) "
          f"{mixr:.3f} TB/s = {fm:.4f} ms; fixed floor {fl:.4f} ms")
    names = [""] + [n for n in impls_for(op) if only is None or n in only]
    for name in names:
        try:
            with strata.force_impl(name or None):
                ms = queued_ms(fn, loops=5)
        except Exception as e:  # an implementation that does not take the shape
            print(f"  {name or 'dispatch':<34} {type(e).__name__}: {str(e)[:80]}")
            continue
        print(f"  {name or 'dispatch':<34} {ms:8.4f} ms  {ms / fl:6.3f} x floor  {ms / fm:6.3f} x {mix} probe  "
              f"({nbytes / (ms * 1e-3) / 1e12:.3f} TB/s)")


def main():
    torch.manual_seed(0)
    # rms_norm_gated forward
    R, D = 1048576, 128
    x = torch.randn(R, D, dtype=torch.bfloat16, device="cuda")
    g = torch.randn_like(x)
    w = torch.rand(D, device="cuda") + 0.5
    report("rms_norm_gated fwd bf16 [1048576, 128] G=128 nbg, weight f32", "rms_norm_gated_fwd",
           3 * x.numel() * 2 + R * 4, "add", lambda: sapi.rms_norm_gated(x, g, w, eps=1e-6),
           only={"cuda.sm90.team_stream", "cuda.sm90.team_tma", "cuda.sm90.team_packed"})
    del x, g
    # clipped_swiglu forward
    N, I = 32768, 2880
    xs = torch.randn(N, 2 * I, dtype=torch.bfloat16, device="cuda") * 2
    report("clipped_swiglu fwd bf16 [32768, 2 x 2880] interleaved gpt-oss", "clipped_swiglu_fwd", 3 * N * I * 2, "add",
           lambda: sapi.swiglu(xs), only={"cuda.sm90.bulk_ring", "cuda.sm90.tile_tma", "cuda.sm90.pairwise"})
    del xs
    # fused cross entropy, gradient in the forward, in place (repeated calls overwrite the logits with gradients:
    # finite values, the same work per call)
    n, v = 8192, 151936
    logits = (torch.randn(n, v, device="cuda", dtype=torch.bfloat16) * 2).requires_grad_(True)
    t = torch.randint(0, v, (n,), device="cuda")
    report("fused_cross_entropy grad in fwd, in place, bf16 [8192, 151936] mean", "fused_cross_entropy_fwd",
           2 * n * v * 2 + n * 8, "inplace",
           lambda: sapi.fused_cross_entropy(logits, t, grad_in_forward=True, check_targets=False),
           only={"cuda.sm90.cluster_stored_exp_pf16", "cuda.sm90.cluster_stored_exp", "cuda.sm90.cluster_smem"})


if __name__ == "__main__":
    main()
