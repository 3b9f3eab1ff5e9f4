#!/usr/bin/env python3
"""chunk_gated_delta_rule: Strata against its peers, in one process, with the dense GEMM peak of the benchmark's
dtype measured in the same run (ARCHITECTURE.md §7).

Peers:
  * torch_chunked: a PyTorch eager implementation of the same chunked math (written here, in the style of
    transformers' torch_chunk_gated_delta_rule: WY transform per 64-token chunk, the inverse by row
    recursion, then a Python loop over chunks for the state); its backward is torch autograd through it.
  * fla: fla.ops.gated_delta_rule.chunk_gated_delta_rule when importable (CUDA only; peers live in the
    git-ignored /peers folder and are skipped gracefully when absent).
  * strata[<impl>]: Strata's forward with one implementation pinned (strata.force_impl), for each CUDA forward
    variant beside the automatic choice (cuda.sm90.fused_inline, cuda.sm90.fused_pqk, cuda.sm90.fused_w16,
    cuda.sm90.fused_prep), so old and new kernels are timed side by side.
Peak ("% of peak"): the median rate of a large dense GEMM in the benchmark's dtype, measured in the same run:
torch.mm fp32 on the CPU (oneDNN/MKL sgemm; the CPU shapes are fp32), torch.matmul bf16 8192^3 on the GPU
(cuBLAS on the tensor cores: the ceiling of the bf16 tensor-core work the kernels do). Until session 6 the GPU
column used the fp32 rate (~51 TFLOP/s on an H200, which runs fp32 GEMMs without tensor cores), so bf16 kernels
showed > 100 % of "peak".

FLOPs are those of the chunked algorithm Strata runs, per 64-token chunk C and value head with K = V = D:
forward 10 C^2 D + 6 C D^2; backward (a pass re-computing the chunk states, then the reverse sweep)
26 C^2 D + 16 C D^2 + 4 C^3. The same counts are applied to every peer, so the rates compare times.
"fwd+bwd" times the op's forward and then torch.autograd.grad(o, inputs, do) with a fixed do (session 9; until
then `o.float().sum().backward()`, which added work outside the op: an f32 copy of o, its reduction, .grad accumulation).

Two times per row on CUDA (session 14): "ms" is the median of calls each framed by torch.cuda.synchronize(), so it
includes the host's Python and launch time before the first kernel (the latency of one isolated call); "queued" is
the mean of `iters` calls issued back to back between two synchronisations, the device time per call when the host
runs ahead of the GPU as in a training loop (what the C++ timing tests measure). Every peer gets both.

    python bench/gdn_peers.py [--device cpu|cuda] [--quick] [--json PATH] [--only strata,fla]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peers import add_peers_to_path  # noqa: E402

add_peers_to_path()

try:
    import strata
    import strata.api as sapi
    STRATA = "ok"
except ImportError as e:  # not built for this Python
    strata, sapi, STRATA = None, None, f"not importable ({e})"

try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn  # type: ignore
    FLA = "ok"
except Exception as e:  # noqa: BLE001 - any import failure means the peer is absent
    fla_gdn, FLA = None, f"not importable ({type(e).__name__})"


def torch_chunked_gdn(q, k, v, g, beta, scale, initial_state=None, output_final_state=False,
                      use_qk_l2norm_in_kernel=False, chunk=64):
    """Gated DeltaNet in PyTorch eager ops, chunked (ops_gdn_kda.md §2.4): fp32 math, [B, T, H, D] layout in,
    o in q's dtype out. GVA by repeating q/k over the value heads."""
    dtype = q.dtype
    if use_qk_l2norm_in_kernel:
        q = q.float() * torch.rsqrt(q.float().square().sum(-1, keepdim=True) + 1e-6)
        k = k.float() * torch.rsqrt(k.float().square().sum(-1, keepdim=True) + 1e-6)
    G = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
    # [B, HV, T, D] fp32
    q, k, v = (x.transpose(1, 2).float() for x in (q, k, v))
    g, beta = g.transpose(1, 2).float(), beta.transpose(1, 2).float()
    B, HV, T, K = k.shape
    V = v.shape[-1]
    pad = (chunk - T % chunk) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    NT = (T + pad) // chunk
    q, k, v = (x.reshape(B, HV, NT, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(B, HV, NT, chunk), beta.reshape(B, HV, NT, chunk)
    gam = g.cumsum(-1)
    lower = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device))
    strict = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), -1)
    diff = gam[..., :, None] - gam[..., None, :]
    decay = torch.exp(diff.masked_fill(~lower, float("-inf")))  # mask before exp (§6.1)
    kb = k * beta[..., None]
    # A = (I + StrictLower(diag(beta) K K^T Gamma))^-1 by row recursion
    a = -(kb @ k.transpose(-1, -2) * decay).masked_fill(~strict, 0)
    for i in range(1, chunk):  # row i of (I + M)^-1 - I from the rows above it (in place, autograd-tracked)
        row = a[..., i, :i].clone()
        sub = a[..., :i, :i].clone()  # clones keep autograd's saved tensors unmodified
        a[..., i, :i] = row + (row[..., :, None] * sub).sum(-2)
    a = a + torch.eye(chunk, device=q.device)
    u = a @ (v * beta[..., None])
    w = a @ (kb * torch.exp(gam)[..., None])
    S = initial_state.float() if initial_state is not None else q.new_zeros(B, HV, K, V)
    outs = []
    for c in range(NT):
        qc, kc, gc = q[:, :, c], k[:, :, c], gam[:, :, c]
        intra = (qc @ kc.transpose(-1, -2) * decay[:, :, c]).masked_fill(~lower, 0)
        vn = u[:, :, c] - w[:, :, c] @ S
        outs.append((qc * torch.exp(gc)[..., None]) @ S + intra @ vn)
        glast = gc[..., -1]
        S = S * torch.exp(glast)[..., None, None] + (kc * torch.exp(glast[..., None] - gc)[..., None]).transpose(-1, -2) @ vn
    o = torch.stack(outs, 2).reshape(B, HV, NT * chunk, V)[:, :, :T] * scale
    return o.transpose(1, 2).to(dtype), (S if output_final_state else None)


def flops(B, T, HV, D, bwd, C=64):
    per = 10 * C * C * D + 6 * C * D * D
    if bwd:
        per = 26 * C * C * D + 16 * C * D * D + 4 * C ** 3
    return per * B * HV * -(-T // C)


def timeit(fn, device, iters, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def queued(fn, iters, warmup=1):
    """Mean seconds per call of `iters` calls issued back to back (CUDA): device time when the host runs ahead."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def gemm_peak(device, n, iters, dtype=torch.float32):
    """Median FLOP/s of an n^3 dense GEMM in dtype (2 n^3 FLOPs)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t = timeit(lambda: torch.matmul(a, b), device, iters)
    return 2.0 * n ** 3 / t


def make(B, T, H, HV, D, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=gen).to(device, dtype)
    k = torch.randn(B, T, H, D, generator=gen).to(device, dtype)
    v = torch.randn(B, T, HV, D, generator=gen).to(device, dtype)
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)).to(device)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen)).to(device, dtype)
    return q, k, v, g, beta


# Forward-only CUDA implementations of chunk_gated_delta_rule timed by name beside the automatic choice.
FORCED_FWD_VARIANTS = ("cuda.sm90.fused_inline", "cuda.sm90.fused_pqk", "cuda.sm90.fused_w16", "cuda.sm90.fused_prep",
                       "cuda.sm90.fused_wgmma_split", "cuda.sm90.fused_fold")


def forced(impl):
    """Strata's chunk_gated_delta_rule with implementation `impl` pinned for the call."""
    def fn(*a, **kw):
        with strata.force_impl(impl):
            return sapi.chunk_gated_delta_rule(*a, **kw)
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--only", help="comma-separated peer names to run (e.g. strata,fla); default every peer")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    dev = args.device
    iters = 3 if args.quick else 7
    if dev == "cpu":
        shapes = [(1, 4096, 4, 8, 128, torch.float32)]
        peak_n, peak_dt = (2048 if args.quick else 4096), torch.float32
        peak_label = f"fp32 sgemm peak (torch.mm {peak_n}^3 fp32)"
    else:
        shapes = [(4, 8192, 16, 32, 128, torch.bfloat16), (1, 32768, 16, 32, 128, torch.bfloat16)]
        peak_n, peak_dt = 8192, torch.bfloat16
        peak_label = f"bf16 tensor-core dense GEMM peak (torch.matmul {peak_n}^3 bf16, cuBLAS)"
    peak = gemm_peak(dev, peak_n, iters, peak_dt)
    print(f"device {dev}, torch {torch.__version__}, threads {torch.get_num_threads()}; strata: {STRATA}; "
          f"fla: {FLA}")
    print(f"{peak_label}: {peak / 1e9:.1f} GFLOP/s (the '% of peak' column)")
    rows = []
    for (B, T, H, HV, D, dtype) in shapes:
        q, k, v, g, beta = make(B, T, H, HV, D, dtype, dev)
        do = torch.randn(B, T, HV, D, generator=torch.Generator().manual_seed(1)).to(dev, dtype)
        scale = D ** -0.5
        peers = {"torch_chunked": lambda *a, **kw: torch_chunked_gdn(*a, **kw)}
        if sapi is not None:
            peers["strata"] = lambda *a, **kw: sapi.chunk_gated_delta_rule(*a, **kw)
            if dev == "cuda":
                for impl in FORCED_FWD_VARIANTS:
                    peers[f"strata[{impl[10:]}]"] = forced(impl)
        if fla_gdn is not None and dev == "cuda":
            peers["fla"] = lambda *a, **kw: fla_gdn(*a, **kw)
        for name, fn in peers.items():
            if only is not None and name not in only:
                continue
            for bwd in ((False,) if name.startswith("strata[") else (False, True)):
                ins = [x.clone().requires_grad_(bwd) for x in (q, k, v, g, beta)]

                # fwd+bwd = the op's forward and its backward for a given do (torch.autograd.grad): no loss
                # reduction, no .grad accumulation, the same framing for every peer.
                def call():
                    o, _ = fn(*ins, scale=scale, output_final_state=True, use_qk_l2norm_in_kernel=True)
                    if bwd:
                        torch.autograd.grad(o, ins, do)
                try:
                    t = timeit(call, dev, iters if name != "torch_chunked" else max(2, iters // 2), warmup=1)
                    tq = queued(call, iters) if dev == "cuda" and name != "torch_chunked" else None
                except Exception as e:  # noqa: BLE001 - a failing peer is reported, not fatal
                    print(f"  {name} failed: {type(e).__name__}: {e}")
                    continue
                # fwd+bwd time minus the forward's gives the backward alone
                fl = flops(B, T, HV, D, False) + (flops(B, T, HV, D, True) if bwd else 0)
                row = dict(peer=name, shape=f"B={B} T={T} H={H} HV={HV} K=V={D} {str(dtype)[6:]}", dims=(B, T, HV, D),
                           pass_="fwd+bwd" if bwd else "fwd", ms=t * 1e3, gflops=fl / t / 1e9,
                           pct_peak=100 * fl / t / peak, ms_queued=None if tq is None else tq * 1e3)
                rows.append(row)
                qtxt = "" if tq is None else f"  (queued {tq * 1e3:.3f} ms)"
                print(f"  {row['peer']:>18} {row['pass_']:>8} {row['shape']}: {row['ms']:9.2f} ms "
                      f"{row['gflops']:8.1f} GFLOP/s  {row['pct_peak']:5.1f}% of peak{qtxt}")
    # backward alone and the speed-up over the eager chunked version
    by = {(r["peer"], r["shape"], r["pass_"]): r["ms"] for r in rows}
    byq = {(r["peer"], r["shape"], r["pass_"]): r["ms_queued"] for r in rows}
    dims = {r["shape"]: r["dims"] for r in rows}
    for (peer, shape, p), ms in list(by.items()):
        if p == "fwd+bwd" and (peer, shape, "fwd") in by:
            b = ms - by[(peer, shape, "fwd")]
            fl = flops(*dims[shape], True)
            fq, bq = byq[(peer, shape, "fwd")], byq[(peer, shape, p)]
            qtxt = "" if fq is None or bq is None else f"  (queued {bq - fq:.3f} ms)"
            print(f"  {peer:>18}      bwd {shape}: {b:9.2f} ms {fl / (b / 1e3) / 1e9:8.1f} GFLOP/s  "
                  f"{100 * fl / (b / 1e3) / peak:5.1f}% of peak{qtxt}")
    for shape in {r["shape"] for r in rows}:
        for p in ("fwd", "fwd+bwd"):
            if ("strata", shape, p) in by and ("torch_chunked", shape, p) in by:
                print(f"  strata vs torch_chunked {p} {shape}: "
                      f"{by[('torch_chunked', shape, p)] / by[('strata', shape, p)]:.1f}x faster")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(peak_gflops=peak / 1e9, peak=peak_label, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
