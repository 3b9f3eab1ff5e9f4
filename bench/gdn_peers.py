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
Peak ("% of peak"), measured in the same run. CPU (session 18): the fp32 FMA peak of `strata peak` (FMA chains of
the best Highway ISA on every Strata thread, src/testkit/fma_peak.h), the ceiling issue 3's CPU target names ("≥ 40 %
of the fp32 FMA peak measured in the same run"); it is measured before and after the rows, and the closing lines
give Strata's % against the higher of the two. The torch.mm fp32 rate (oneDNN/MKL sgemm) is still printed for
reference; until session 17 it was the CPU column's denominator, and the fused kernels read 129-171 % of it, so it
is no peak. The strata command is looked up as --strata-cli, $STRATA_CLI, $BUILD/tools/strata/strata, the newest
build/*/tools/strata/strata of this checkout, then PATH; without it the CPU column falls back to the sgemm rate and
says so. GPU: torch.matmul bf16 8192^3 (cuBLAS on the tensor cores: the ceiling of the bf16 tensor-core work the
kernels do). Until session 6 the GPU column used the fp32 rate (~51 TFLOP/s on an H200, which runs fp32 GEMMs
without tensor cores), so bf16 kernels showed > 100 % of "peak".

Peak memory (CUDA, session 18): per row, one more call after the timing between torch.cuda.reset_peak_memory_stats()
and torch.cuda.max_memory_allocated(), minus the memory allocated before it (the inputs, their clones and do): the
extra memory of the op's forward (or forward + backward, with autograd's saved tensors and the gradients) at its
peak, for every peer.

Shapes (--shapes, comma-separated): b4 = B=4 T=8192 H=16 HV=32 K=V=128 bf16, b1 = B=1 T=32768 (the CUDA default:
b4,b1), docs256 / eq256 = B=1 T=32768 packed through cu_seqlens as 256 documents of random lengths (255 cuts drawn
uniformly, seed 11; not the same draw as the atk bench case) / of equal lengths (128 tokens), and cpu = B=1 T=4096
H=4 HV=8 K=V=128 f32 (the CPU default). The eager peer has no cu_seqlens and skips the packed shapes; their FLOPs
count each document's partial last chunk as a full one (T/64 + 256 chunks per value head, as the atk case does).

FLOPs are those of the chunked algorithm Strata runs, per 64-token chunk C and value head with K = V = D:
forward 10 C^2 D + 6 C D^2; backward (a pass re-computing the chunk states, then the reverse sweep)
26 C^2 D + 16 C D^2 + 4 C^3. The same counts are applied to every peer, so the rates compare times.
"fwd+bwd" times the op's forward and then torch.autograd.grad(o, inputs, do) with a fixed do (session 9; until
then `o.float().sum().backward()`, which added work outside the op: an f32 copy of o, its reduction, .grad accumulation).

Two times per row on CUDA (session 14): "ms" is the median of calls each framed by torch.cuda.synchronize(), so it
includes the host's Python and launch time before the first kernel (the latency of one isolated call); "queued" is
the mean of `iters` calls issued back to back between two synchronisations, the device time per call when the host
runs ahead of the GPU as in a training loop (what the C++ timing tests measure). Every peer gets both.

    python bench/gdn_peers.py [--device cpu|cuda] [--quick] [--json PATH] [--only strata,fla] [--shapes b4,docs256]
                              [--strata-cli PATH]
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
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


def flops(B, T, HV, D, bwd, C=64, docs=0):
    per = 10 * C * C * D + 6 * C * D * D
    if bwd:
        per = 26 * C * C * D + 16 * C * D * D + 4 * C ** 3
    chunks = -(-T // C) if docs == 0 else T // C + abs(docs)
    return per * B * HV * chunks


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


def find_strata_cli(explicit=None):
    """Path of the `strata` command (see the module doc for the order), or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cands = [explicit, os.environ.get("STRATA_CLI")]
    if os.environ.get("BUILD"):
        cands.append(os.path.join(os.environ["BUILD"], "tools", "strata", "strata"))
    cands += sorted(glob.glob(os.path.join(here, "build", "*", "tools", "strata", "strata")),
                    key=os.path.getmtime, reverse=True)
    cands.append(shutil.which("strata"))
    return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def fma_peak(cli, threads, reps=5):
    """fp32 FMA peak of this CPU on `threads` threads from `strata peak --json` (dict), or None with the reason."""
    if cli is None:
        return None, "no strata command found"
    try:
        r = subprocess.run([cli, "peak", "--threads", str(threads), "--reps", str(reps), "--json"],
                           capture_output=True, text=True, timeout=120, check=True)
        return json.loads(r.stdout), ""
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        return None, f"{cli} peak failed: {type(e).__name__}: {e}"


def make(B, T, H, HV, D, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=gen).to(device, dtype)
    k = torch.randn(B, T, H, D, generator=gen).to(device, dtype)
    v = torch.randn(B, T, HV, D, generator=gen).to(device, dtype)
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)).to(device)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen)).to(device, dtype)
    return q, k, v, g, beta


def cu_seqlens_for(T, docs, device, seed=11):
    """Offsets of `abs(docs)` documents covering T tokens: random lengths (docs > 0: abs(docs) - 1 distinct cuts
    drawn uniformly from 1..T-1) or equal lengths (docs < 0)."""
    n = abs(docs)
    if docs > 0:
        gen = torch.Generator().manual_seed(seed)
        cuts = (torch.randperm(T - 1, generator=gen)[: n - 1] + 1).sort().values
    else:
        cuts = torch.arange(1, n) * T // n
    return torch.cat([torch.zeros(1, dtype=torch.long), cuts.long(), torch.tensor([T])]).to(device)


# name: (B, T, H, HV, D, dtype, docs) with docs as in cu_seqlens_for (0: no cu_seqlens)
SHAPES = {
    "b4": (4, 8192, 16, 32, 128, torch.bfloat16, 0),
    "b1": (1, 32768, 16, 32, 128, torch.bfloat16, 0),
    "docs256": (1, 32768, 16, 32, 128, torch.bfloat16, 256),
    "eq256": (1, 32768, 16, 32, 128, torch.bfloat16, -256),
    "cpu": (1, 4096, 4, 8, 128, torch.float32, 0),
}

MiB = 1 << 20


def peak_extra_mib(call):
    """Memory allocated at the peak of one call of `call`, above what was allocated before it (CUDA)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / MiB


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
    ap.add_argument("--shapes", help=f"comma-separated shape names ({', '.join(SHAPES)}); default b4,b1 on CUDA, "
                                     "cpu on the CPU")
    ap.add_argument("--strata-cli", help="path of the strata command (CPU FMA peak)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    dev = args.device
    iters = 3 if args.quick else 7
    names = args.shapes.split(",") if args.shapes else (["cpu"] if dev == "cpu" else ["b4", "b1"])
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shape(s) {unknown}; known: {list(SHAPES)}")
    fma = None
    if dev == "cpu":
        peak_n, peak_dt = (2048 if args.quick else 4096), torch.float32
        threads = strata.get_num_threads() if strata is not None else torch.get_num_threads()
        cli = find_strata_cli(args.strata_cli)
        fma, why = fma_peak(cli, threads)
        sgemm = gemm_peak(dev, peak_n, iters, peak_dt)
        if fma is not None:
            peak = fma["gflops"] * 1e9
            peak_label = (f"fp32 FMA peak ({cli} peak: {fma['threads']} threads, {fma['isa']}, best of "
                          f"{len(fma['rep_gflops'])}; median {fma['gflops_median']:.1f}, "
                          f"{fma['gflops_per_cpu_second']:.1f} per thread CPU-second)")
        else:
            peak = sgemm
            peak_label = f"fp32 sgemm rate (torch.mm {peak_n}^3; NOT the FMA peak: {why})"
    else:
        peak_n, peak_dt = 8192, torch.bfloat16
        peak_label = f"bf16 tensor-core dense GEMM peak (torch.matmul {peak_n}^3 bf16, cuBLAS)"
        peak = gemm_peak(dev, peak_n, iters, peak_dt)
    load = f", load average {os.getloadavg()[0]:.2f}" if dev == "cpu" else ""
    print(f"device {dev}, torch {torch.__version__}, threads {torch.get_num_threads()}; strata: {STRATA}; "
          f"fla: {FLA}{load}")
    print(f"{peak_label}: {peak / 1e9:.1f} GFLOP/s (the '% of peak' column)")
    if dev == "cpu":
        print(f"torch.mm {peak_n}^3 fp32 sgemm rate, for reference: {sgemm / 1e9:.1f} GFLOP/s")
    rows = []
    for sname in names:
        B, T, H, HV, D, dtype, docs = SHAPES[sname]
        q, k, v, g, beta = make(B, T, H, HV, D, dtype, dev)
        cu = cu_seqlens_for(T, docs, dev) if docs else None
        do = torch.randn(B, T, HV, D, generator=torch.Generator().manual_seed(1)).to(dev, dtype)
        scale = D ** -0.5
        peers = {} if docs else {"torch_chunked": lambda *a, **kw: torch_chunked_gdn(*a, **kw)}
        if sapi is not None:
            peers["strata"] = lambda *a, **kw: sapi.chunk_gated_delta_rule(*a, **kw)
            if dev == "cuda":
                for impl in FORCED_FWD_VARIANTS:
                    peers[f"strata[{impl[10:]}]"] = forced(impl)
        if fla_gdn is not None and dev == "cuda":
            peers["fla"] = lambda *a, **kw: fla_gdn(*a, **kw)
        docs_txt = "" if not docs else (f" {docs} random docs" if docs > 0 else f" {-docs} equal docs")
        shape = f"B={B} T={T} H={H} HV={HV} K=V={D} {str(dtype)[6:]}{docs_txt}"
        for name, fn in peers.items():
            if only is not None and name not in only:
                continue
            for bwd in ((False,) if name.startswith("strata[") else (False, True)):
                ins = [x.clone().requires_grad_(bwd) for x in (q, k, v, g, beta)]
                kw = dict(scale=scale, output_final_state=True, use_qk_l2norm_in_kernel=True)
                if cu is not None:
                    kw["cu_seqlens"] = cu

                # fwd+bwd = the op's forward and its backward for a given do (torch.autograd.grad): no loss
                # reduction, no .grad accumulation, the same framing for every peer.
                def call():
                    o, _ = fn(*ins, **kw)
                    if bwd:
                        torch.autograd.grad(o, ins, do)
                try:
                    t = timeit(call, dev, iters if name != "torch_chunked" else max(2, iters // 2), warmup=1)
                    tq = queued(call, iters) if dev == "cuda" and name != "torch_chunked" else None
                    mem = peak_extra_mib(call) if dev == "cuda" else None
                except Exception as e:  # noqa: BLE001 - a failing peer is reported, not fatal
                    print(f"  {name} failed: {type(e).__name__}: {e}")
                    continue
                # fwd+bwd time minus the forward's gives the backward alone
                fl = flops(B, T, HV, D, False, docs=docs) + (flops(B, T, HV, D, True, docs=docs) if bwd else 0)
                row = dict(peer=name, shape=shape, dims=(B, T, HV, D, docs),
                           pass_="fwd+bwd" if bwd else "fwd", ms=t * 1e3, gflops=fl / t / 1e9,
                           pct_peak=100 * fl / t / peak, ms_queued=None if tq is None else tq * 1e3,
                           peak_extra_mib=mem)
                rows.append(row)
                qtxt = "" if tq is None else f"  (queued {tq * 1e3:.3f} ms)"
                mtxt = "" if mem is None else f"  peak +{mem:.0f} MiB"
                print(f"  {row['peer']:>18} {row['pass_']:>8} {row['shape']}: {row['ms']:9.2f} ms "
                      f"{row['gflops']:8.1f} GFLOP/s  {row['pct_peak']:5.1f}% of peak{qtxt}{mtxt}", flush=True)
    # backward alone and the speed-up over the eager chunked version
    by = {(r["peer"], r["shape"], r["pass_"]): r["ms"] for r in rows}
    byq = {(r["peer"], r["shape"], r["pass_"]): r["ms_queued"] for r in rows}
    dims = {r["shape"]: r["dims"] for r in rows}
    bwd_rate = {}
    for (peer, shape, p), ms in list(by.items()):
        if p == "fwd+bwd" and (peer, shape, "fwd") in by:
            b = ms - by[(peer, shape, "fwd")]
            B, T, HV, D, docs = dims[shape]
            fl = flops(B, T, HV, D, True, docs=docs)
            bwd_rate[(peer, shape)] = fl / (b / 1e3)
            fq, bq = byq[(peer, shape, "fwd")], byq[(peer, shape, p)]
            qtxt = "" if fq is None or bq is None else f"  (queued {bq - fq:.3f} ms)"
            print(f"  {peer:>18}      bwd {shape}: {b:9.2f} ms {fl / (b / 1e3) / 1e9:8.1f} GFLOP/s  "
                  f"{100 * fl / (b / 1e3) / peak:5.1f}% of peak{qtxt}")
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for p in ("fwd", "fwd+bwd"):
            if ("strata", shape, p) in by and ("torch_chunked", shape, p) in by:
                print(f"  strata vs torch_chunked {p} {shape}: "
                      f"{by[('torch_chunked', shape, p)] / by[('strata', shape, p)]:.1f}x faster")
    # many short documents against equal ones (issue 3: <= 1.5x), per peer and pass
    for peer in dict.fromkeys(r["peer"] for r in rows):
        for p in ("fwd", "fwd+bwd"):
            rnd = [r for r in rows if r["peer"] == peer and r["pass_"] == p and r["dims"][4] > 0]
            eq = [r for r in rows if r["peer"] == peer and r["pass_"] == p and r["dims"][4] < 0]
            for a in rnd:
                for e in eq:
                    if a["dims"][:4] == e["dims"][:4] and a["dims"][4] == -e["dims"][4]:
                        qa, qe = a["ms_queued"], e["ms_queued"]
                        qtxt = "" if qa is None or qe is None else f"; queued {qa:.3f} / {qe:.3f} ms = {qa / qe:.2f}x"
                        print(f"  {peer} {p} {a['dims'][4]} random docs / equal docs: {a['ms']:.3f} / {e['ms']:.3f} ms "
                              f"= {a['ms'] / e['ms']:.2f}x{qtxt}")
    fma_end = None
    if fma is not None:
        fma_end, _ = fma_peak(find_strata_cli(args.strata_cli), fma["threads"])
        if fma_end is not None:
            hi = max(fma["gflops"], fma_end["gflops"]) * 1e9
            print(f"fp32 FMA peak again after the rows: {fma_end['gflops']:.1f} GFLOP/s (median "
                  f"{fma_end['gflops_median']:.1f}); load average {os.getloadavg()[0]:.2f}")
            for r in rows:
                if r["peer"] == "strata":
                    print(f"  strata {r['pass_']:>8} {r['shape']}: {100 * r['gflops'] * 1e9 / hi:5.1f}% of the "
                          f"higher FMA peak ({hi / 1e9:.1f} GFLOP/s)")
            for (peer, shape), rate in bwd_rate.items():
                if peer == "strata":
                    print(f"  strata      bwd {shape}: {100 * rate / hi:5.1f}% of the higher FMA peak")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(peak_gflops=peak / 1e9, peak=peak_label, fma_peak=fma, fma_peak_end=fma_end,
                           sgemm_gflops=sgemm / 1e9 if dev == "cpu" else None, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
