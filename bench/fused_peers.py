#!/usr/bin/env python3
"""The fused training operators of issue 4 side by side with their peers, in one process, against the floor set
by the copy bandwidth measured in the same run (ARCHITECTURE.md §7, PERF_TARGETS.md).

Rows per case: Strata (strata.api), PyTorch eager (the same math in plain torch ops, autograd for the backward),
and, when importable, fla, Liger-Kernel and cut-cross-entropy (peers live in the git-ignored /peers folder:
peers/fla/fla, peers/liger/liger_kernel, peers/cce/cut_cross_entropy; absent peers are skipped).

Shapes on CUDA are the PERF_TARGETS.md ones, bf16: rms_norm_gated [1048576, 128] (fwd; fwd+bwd), clipped_swiglu
N=32768 2x2880 (fwd), causal_conv1d B=4 T=8192 D=8192 W=4 SiLU (fwd; fwd+bwd), fused cross entropy N=8192
V=151936 (fwd+bwd, gradient in place where the implementation offers it), chunk_loss N=8192 D=4096 V=151936
(fwd+bwd). On the CPU (a dry run) every shape is cut down.

Bytes (for GB/s and the floor) count each input read once and each output or gradient written once; chunk_loss
is GEMM-bound and has no floor. "peak MiB" is the allocator's peak during one call above what was allocated
before it (inputs and the outputs kept alive are outside it): the extra memory the call needs.

    python bench/fused_peers.py [--device cuda|cpu] [--quick] [--iters N] [--json PATH] [--only NAME,...]

Exit status 1 when a Strata row fails; peers that fail are reported only.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The timing, copy-bandwidth, peer and table code is torch_peers.py's (one method for every side-by-side bench).
from torch_peers import (STRATA_STATUS, MiB, Timer, add_peers_to_path, compare_with_peers,  # noqa: E402
                         copy_bandwidth_gbs, print_table, sapi)

add_peers_to_path()


def optional(import_fn):
    """A peer's entry point, or (None, reason) when it does not import here."""
    try:
        return import_fn(), "ok"
    except Exception as e:  # noqa: BLE001 - any import failure means the peer is absent
        return None, f"not importable ({type(e).__name__}: {str(e).splitlines()[0][:80]})"


def _fla():
    import fla.modules as m  # type: ignore
    from fla.modules.conv.causal_conv1d import causal_conv1d  # type: ignore
    from fla.modules.fused_cross_entropy import cross_entropy_loss  # type: ignore
    from fla.modules.fused_norm_gate import rms_norm_gated  # type: ignore
    return {"rms_norm_gated": rms_norm_gated, "causal_conv1d": causal_conv1d, "cross_entropy": cross_entropy_loss,
            "linear_ce": m.FusedLinearCrossEntropyLoss}


def _liger():
    from liger_kernel.transformers.cross_entropy import LigerCrossEntropyLoss  # type: ignore
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss  # type: ignore
    return {"cross_entropy": LigerCrossEntropyLoss, "linear_ce": LigerFusedLinearCrossEntropyLoss}


def _cce():
    from cut_cross_entropy import linear_cross_entropy  # type: ignore
    return linear_cross_entropy


FLA, FLA_STATUS = optional(_fla)
LIGER, LIGER_STATUS = optional(_liger)
CCE, CCE_STATUS = optional(_cce)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    p.add_argument("--iters", type=int, default=0, help="timed calls per row (default 20, 3 with --quick)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--only", default="", help="comma-separated case names (rms_norm_gated, clipped_swiglu, "
                   "causal_conv1d, cross_entropy, chunk_loss)")
    return p.parse_args()


def fwd_bwd(forward, grads_of):
    """A call that runs forward on the inputs, then backward with a fixed upstream gradient; the leaves' .grad
    are cleared first so that every call does the same work."""
    def run(inp):
        for t in grads_of(inp):
            t.grad = None
        out = forward(inp)
        out = out[0] if isinstance(out, tuple) else out
        if out.dim() == 0:
            out.backward()
        else:
            out.backward(inp["dy"])
        return out
    return run


def leaf(t):
    return t.detach().requires_grad_(True)


# ---- rms_norm_gated: y = rmsnorm(x) * w * silu(g) (fla's order, GDN's output gate) ----
def rms_norm_gated_eager(x, g, w, eps=1e-6):
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.float()
    return (y * F.silu(g.float())).to(x.dtype)


def rms_norm_gated_cases(device, cut):
    rows, d = 1048576 // cut, 128
    nbytes_fwd = 3 * rows * d * 2  # x, g read; y written (bf16); w and the saved rstd are noise

    def make(grad):
        x = torch.randn(rows, d, device=device, dtype=torch.bfloat16)
        g = torch.randn_like(x)
        w = torch.rand(d, device=device, dtype=torch.float32) + 0.5
        inp = {"x": leaf(x) if grad else x, "g": leaf(g) if grad else g, "w": leaf(w) if grad else w}
        inp["dy"] = torch.randn_like(x)
        return inp

    impls_f = [("strata", lambda i: sapi.rms_norm_gated(i["x"], i["g"], i["w"], eps=1e-6)),
               ("torch eager", lambda i: rms_norm_gated_eager(i["x"], i["g"], i["w"]))]
    if FLA:
        impls_f.append(("fla", lambda i: FLA["rms_norm_gated"](i["x"], i["g"], i["w"], None, "swish", eps=1e-6)))
    grads = lambda i: (i["x"], i["g"], i["w"])  # noqa: E731
    impls_b = [(n, fwd_bwd(f, grads)) for n, f in impls_f]
    return [("rms_norm_gated fwd", f"bf16 [{rows}, {d}] w f32", nbytes_fwd, lambda: make(False), impls_f),
            # backward reads x, g, dy and writes dx, dg: 5 more rows of traffic
            ("rms_norm_gated fwd+bwd", f"bf16 [{rows}, {d}] w f32", nbytes_fwd + 5 * rows * d * 2,
             lambda: make(True), impls_b)]


# ---- clipped_swiglu (GPT-OSS): interleaved pairs, alpha 1.702, limit 7, linear half + 1 ----
def clipped_swiglu_eager(x, alpha=1.702, limit=7.0):
    gate, lin = x[..., 0::2].float(), x[..., 1::2].float()
    gate = gate.clamp(max=limit)
    lin = lin.clamp(-limit, limit)
    return (gate * torch.sigmoid(alpha * gate) * (lin + 1)).to(x.dtype)


def clipped_swiglu_cases(device, cut):
    n, i2 = 32768 // cut, 2 * 2880
    make = lambda: {"x": torch.randn(n, i2, device=device, dtype=torch.bfloat16) * 4}  # noqa: E731
    impls = [("strata", lambda i: sapi.clipped_swiglu(i["x"])), ("torch eager", lambda i: clipped_swiglu_eager(i["x"]))]
    return [("clipped_swiglu fwd", f"bf16 [{n}, {i2}] interleaved", n * i2 * 2 + n * i2 // 2 * 2, make, impls)]


# ---- causal_conv1d: depthwise, width 4, SiLU, x [B, T, D] channel-last, weight [D, W] ----
def causal_conv1d_eager(x, w, b):
    B, T, D = x.shape
    y = F.conv1d(F.pad(x.transpose(1, 2), (w.shape[1] - 1, 0)), w.unsqueeze(1), b, groups=D)
    return F.silu(y).transpose(1, 2)


def causal_conv1d_cases(device, cut):
    B, T, D, W = 4, 8192 // cut, 8192 // (4 if cut > 1 else 1), 4

    def make(grad):
        x = torch.randn(B, T, D, device=device, dtype=torch.bfloat16)
        w = torch.randn(D, W, device=device, dtype=torch.bfloat16) * 0.5
        b = torch.randn(D, device=device, dtype=torch.bfloat16) * 0.1
        inp = {k: (leaf(v) if grad else v) for k, v in {"x": x, "w": w, "b": b}.items()}
        inp["dy"] = torch.randn_like(x)
        return inp

    impls_f = [("strata", lambda i: sapi.causal_conv1d(i["x"], i["w"], i["b"], activation="silu")[0]),
               ("torch eager conv1d", lambda i: causal_conv1d_eager(i["x"], i["w"], i["b"]))]
    if FLA:
        impls_f.append(("fla (triton)", lambda i: FLA["causal_conv1d"](i["x"], i["w"], i["b"], activation="silu",
                                                                       backend="triton")[0]))
    grads = lambda i: (i["x"], i["w"], i["b"])  # noqa: E731
    impls_b = [(n, fwd_bwd(f, grads)) for n, f in impls_f]
    nbytes = 2 * B * T * D * 2  # x read, y written
    return [("causal_conv1d fwd", f"bf16 [{B}, {T}, {D}] W={W} silu", nbytes, lambda: make(False), impls_f),
            ("causal_conv1d fwd+bwd", f"bf16 [{B}, {T}, {D}] W={W} silu", nbytes + 3 * B * T * D * 2,
             lambda: make(True), impls_b)]


# ---- fused cross entropy: logits [N, V] bf16, mean over targets, gradient into the logits where offered ----
def cross_entropy_cases(device, cut):
    n, v = 8192 // cut, 151936 // (8 if cut > 1 else 1)

    def make():
        logits = torch.randn(n, v, device=device, dtype=torch.bfloat16) * 2
        return {"logits": leaf(logits), "t": torch.randint(0, v, (n,), device=device)}

    grads = lambda i: (i["logits"],)  # noqa: E731
    # strata's two in-place modes: fla's (forward kernel, then a backward kernel writing the gradient into the
    # logits) and Liger's (one kernel writes the loss and, into the logits, the gradient; backward is a no-op
    # for an upstream gradient of 1)
    # (the speedup column is against the first Strata row: the one-kernel mode, as Liger's)
    impls = [("strata (grad in fwd)", fwd_bwd(lambda i: sapi.fused_cross_entropy(i["logits"], i["t"],
                                                                                grad_in_forward=True), grads)),
             ("strata (in place bwd)", fwd_bwd(lambda i: sapi.fused_cross_entropy(i["logits"], i["t"],
                                                                                 inplace_backward=True), grads)),
             ("torch eager (f32 upcast)", fwd_bwd(lambda i: F.cross_entropy(i["logits"].float(), i["t"]), grads))]
    if FLA:
        impls.append(("fla (in place)", fwd_bwd(lambda i: FLA["cross_entropy"](i["logits"], i["t"],
                                                                              inplace_backward=True)[0].mean(), grads)))
    if LIGER:
        liger_ce = LIGER["cross_entropy"]()
        impls.append(("liger (in place)", fwd_bwd(lambda i: liger_ce(i["logits"], i["t"]), grads)))
    # one read of the logits for the loss, one read and one write for the gradient (in place: 2 passes are the
    # floor of a one-kernel implementation: read once, write once)
    return [("fused_cross_entropy fwd+bwd", f"bf16 [{n}, {v}] mean", 2 * n * v * 2, make, impls)]


# ---- chunk_loss (linear cross entropy): hidden [N, D] @ weight [V, D]^T, mean CE, grads for hidden and weight ----
def chunk_loss_cases(device, cut):
    if cut > 1:
        n, d, v = 1024, 1024, 32000  # PERF_TARGETS' CPU shape
    else:
        n, d, v = 8192, 4096, 151936
    dt = torch.bfloat16 if device == "cuda" else torch.float32

    def make():
        h = torch.randn(n, d, device=device, dtype=dt) * 0.5
        w = torch.randn(v, d, device=device, dtype=dt) * (d ** -0.5)
        return {"h": leaf(h), "w": leaf(w), "t": torch.randint(0, v, (n,), device=device)}

    grads = lambda i: (i["h"], i["w"])  # noqa: E731
    # strata: gradients in the inputs' dtype written by the forward and handed to .grad (peak: gradients + the
    # <= 64 MiB workspace); "f32 grads held" keeps f32 gradients between forward and backward (more memory, a
    # different plan on CUDA: dweight f32 leaves more room for kept logits tiles)
    impls = [("strata", fwd_bwd(lambda i: sapi.chunk_loss(i["h"], i["w"], i["t"]), grads)),
             ("strata (f32 grads held)", fwd_bwd(lambda i: sapi.chunk_loss(i["h"], i["w"], i["t"],
                                                                           hold_grad_in_fp32=True), grads)),
             ("torch eager (f32 logits)", fwd_bwd(lambda i: F.cross_entropy((i["h"] @ i["w"].t()).float(), i["t"]),
                                                  grads))]
    if FLA:
        fla_lce = FLA["linear_ce"]()
        impls.append(("fla", fwd_bwd(lambda i: fla_lce(i["h"], i["t"], i["w"]), grads)))
    if LIGER:
        liger_lce = LIGER["linear_ce"]()
        impls.append(("liger", fwd_bwd(lambda i: liger_lce(i["w"], i["h"], i["t"]), grads)))
    if CCE and device == "cuda":
        impls.append(("cut-cross-entropy", fwd_bwd(lambda i: CCE(i["h"], i["w"], i["t"]), grads)))
    return [("chunk_loss fwd+bwd", f"{str(dt)[6:]} N={n} D={d} V={v}", 0, make, impls)]


def compare_all(results):
    """compare_with_peers for a case with one or more Strata rows (the first is the reference of the speedup
    column); every Strata row gets its own difference from the first peer's output."""
    mine = [r for r in results if r["impl"].startswith("strata")]
    peers = [r for r in results if not r["impl"].startswith("strata")]
    first_peer = next((r for r in peers if "output" in r), None)
    for r in mine[1:]:
        if "output" in r and first_peer is not None:
            r["max_abs_diff_vs_torch"] = (r["output"].float() - first_peer["output"].float()).abs().max().item()
    compare_with_peers(mine[:1] + peers)
    for r in mine:
        r.pop("output", None)


CASES = {"rms_norm_gated": rms_norm_gated_cases, "clipped_swiglu": clipped_swiglu_cases,
         "causal_conv1d": causal_conv1d_cases, "cross_entropy": cross_entropy_cases, "chunk_loss": chunk_loss_cases}


def main():
    args = parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("fused_peers: --device cuda, but torch sees no GPU")
    iters = args.iters or (3 if args.quick else 20)
    timer = Timer(device, iters, warmup=1 if args.quick else 3)
    cut = 1 if device == "cuda" else 16
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    copy_gbs, copy_n = copy_bandwidth_gbs(device, timer, args.quick)
    print(f"fused_peers on {name}: torch {torch.__version__}, {STRATA_STATUS}; fla {FLA_STATUS}; "
          f"liger {LIGER_STATUS}; cut-cross-entropy {CCE_STATUS}")
    print(f"copy bandwidth {copy_gbs:.1f} GB/s (read + write, {copy_n / MiB:.0f} MiB buffer); median of {iters} "
          f"calls, floor = bytes / copy bandwidth")
    only = {s for s in args.only.split(",") if s}
    rows, strata_failed = [], False
    for key, make_cases in CASES.items():
        if only and key not in only:
            continue
        for op, shape, nbytes, make, impls in make_cases(device, cut):
            results = []
            for impl, fn in impls:
                row = {"op": op, "shape": shape, "impl": impl, "bytes": nbytes}
                if impl.startswith("strata") and sapi is None:
                    row["error"] = STRATA_STATUS
                    strata_failed = True
                    results.append(row)
                    continue
                try:
                    torch.manual_seed(0)  # the same inputs for every implementation of the case, made afresh
                    inp = make()          # for each (in-place gradients change them)
                    if device == "cuda":
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                    out = fn(inp)
                    if device == "cuda":
                        torch.cuda.synchronize()
                        row["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - base) / MiB
                    row["output"] = out.detach().float().flatten()[:4096].clone()
                    median_ms, min_ms = timer(fn, [inp])
                    row.update(median_ms=median_ms, min_ms=min_ms)
                    if nbytes:
                        floor_ms = nbytes / (copy_gbs * 1e9) * 1e3
                        row.update(gbs=nbytes / (median_ms * 1e-3) / 1e9, floor_ms=floor_ms,
                                   floor_ratio=median_ms / floor_ms)
                    else:
                        row.update(gbs=0.0, floor_ratio=float("nan"))
                    del inp, out
                except Exception as e:  # a peer that does not run here, an op missing from this build
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
                    strata_failed |= impl.startswith("strata")
                results.append(row)
                if device == "cuda":
                    torch.cuda.empty_cache()
            compare_all(results)
            rows.extend(results)
    print_table(rows)
    if device == "cuda":
        print("  peak extra MiB per call: " + "; ".join(
            f"{r['op']} / {r['impl']}: {r['peak_extra_mib']:.0f}" for r in rows if "peak_extra_mib" in r))
    errors = sum("error" in r for r in rows)
    print(f"fused_peers: {len(rows)} rows, {errors} without a time; {STRATA_STATUS}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "strata": STRATA_STATUS, "fla": FLA_STATUS,
                       "liger": LIGER_STATUS, "cce": CCE_STATUS, "copy_gbs": copy_gbs, "iters": iters,
                       "rows": rows}, f, indent=2)
    return 1 if strata_failed else 0


if __name__ == "__main__":
    sys.exit(main())
