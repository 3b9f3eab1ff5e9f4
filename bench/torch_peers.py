#!/usr/bin/env python3
"""Strata's ops (through strata.api) side by side with their PyTorch eager equivalents, in one process, against
the floor set by the copy bandwidth measured in the same run (ARCHITECTURE.md §7, PERF_TARGETS.md).

Shapes on CUDA are the PERF_TARGETS.md ones, bf16: l2norm fwd [524288, 128], rmsnorm_without_weight fwd
[32768, 4096]; chunk_local_cumsum runs on KDA's per-key gates, g [4, 8192, 32, 128] f32 in 64-token chunks
(the gate shape of the chunk_kda target). On the CPU (a dry run without a GPU) the rows are cut 16x.

Timing: warm-up calls, then CUDA events around every call (perf_counter after a synchronize on the CPU), and
the median. Inputs are rotated among enough copies that together they exceed 4x the L2 cache, so no call
finds its input in the cache. Bytes count each input read once and each output written once (the stats a
Strata op saves for backward are left out, as in PERF_TARGETS.md); floor = bytes / copy bandwidth.

The copy that sets the floor moves random bytes (not a constant) and its two 1 GiB buffers are handed back to
the driver afterwards (torch.cuda.empty_cache), so the cases' tensors are fresh allocations.

Up to session 6 the l2norm case timed about 2x slower here than in bench/py_launch_diag.py, for Strata and
torch alike (s6run1: 0.143 / 0.429 ms against 0.075 / 0.306 ms; s6run2 the same with a warm-up pass). The
cause was this script: the input makers were closures over the loop variables `rows` and `d`, which the
rmsnorm case reassigns before any maker runs, so the "l2norm [524288, 128]" row timed l2norm of a [32768, 4096]
input (twice the bytes its floor counted; Strata's 0.143 ms is exactly its rmsnorm time on that shape). The
makers now bind their shapes when they are defined.

    python bench/torch_peers.py [--device cuda|cpu] [--quick] [--iters N] [--json PATH]

Exit status 1 when strata imports but one of its ops fails; torch peers that fail are reported only.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

try:
    import strata
    import strata.api as sapi

    STRATA_STATUS = f"strata {strata.__version__}"
except ImportError as e:  # the package is not built or installed for this Python
    sapi = None
    STRATA_STATUS = f"not built ({e})"

EPS = 1e-6
MiB = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    p.add_argument("--iters", type=int, default=0, help="timed calls per row (default 30, 5 with --quick)")
    p.add_argument("--json", help="also write the rows here")
    return p.parse_args()


class Timer:
    """Median time of fn over inputs taken in turn: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device, iters, warmup):
        self.cuda = device == "cuda"
        self.iters, self.warmup = iters, warmup

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn, inputs):
        for i in range(self.warmup):
            fn(inputs[i % len(inputs)])
        self.sync()
        ms = []
        if self.cuda:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(self.iters)]
            for i, (start, end) in enumerate(events):
                start.record()
                fn(inputs[i % len(inputs)])
                end.record()
            torch.cuda.synchronize()
            ms = [start.elapsed_time(end) for start, end in events]
        else:
            for i in range(self.iters):
                t0 = time.perf_counter()
                fn(inputs[i % len(inputs)])
                ms.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ms), min(ms)


def cache_bytes(device):
    if device == "cuda":
        return torch.cuda.get_device_properties(0).L2_cache_size
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        return int(text[:-1]) * (1024 if text.endswith("K") else MiB) if text[-1] in "KM" else int(text)
    except (OSError, ValueError):
        return 32 * MiB


def rotated(make, device):
    """Enough copies of one input that together they exceed 4x the last-level cache (at most 8)."""
    first = make()
    nbytes = first.numel() * first.element_size()
    copies = min(8, max(1, math.ceil(4 * cache_bytes(device) / nbytes)))
    return [first] + [first.clone() for _ in range(copies - 1)]


def copy_bandwidth_gbs(device, timer, quick):
    # >= 4x the last-level cache: 1 GiB on the GPU (H200 L2 = 60 MB); 256 MiB on the CPU (64 MiB quick).
    floor = 1024 * MiB if device == "cuda" else (64 if quick else 256) * MiB
    n = max(floor, 4 * cache_bytes(device))
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    median_ms, _ = timer(lambda s: dst.copy_(s), [src])
    del src, dst
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the cases allocate afresh instead of inside the copy's freed 1 GiB blocks
    return 2 * n / (median_ms * 1e-3) / 1e9, n


def add_peers_to_path():
    """Puts every folder of the git-ignored peers/ folder (scripts/fetch_peers.sh: peers/fla, peers/liger,
    peers/cce) on sys.path, so that fla, liger_kernel and cut_cross_entropy import from there when present."""
    peers = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peers")
    if os.path.isdir(peers):
        for entry in sorted(os.listdir(peers)):
            path = os.path.join(peers, entry)
            if os.path.isdir(path) and path not in sys.path:
                sys.path.append(path)


def compare_with_peers(results):
    """results[0] is Strata's row, the rest its peers' (dicts; "output" the tensor a call returned). Adds
    Strata's speedup over each peer and how far its output is from the first peer's (a sanity check that the
    timed call computed the same thing; accuracy proper is `strata atk`'s job), then drops the outputs."""
    mine = results[0]
    peer = next((r for r in results[1:] if "output" in r), None)
    if "output" in mine and peer is not None:
        mine["max_abs_diff_vs_torch"] = (mine["output"].float() - peer["output"].float()).abs().max().item()
    for r in results[1:]:
        if "median_ms" in r and "median_ms" in mine:
            r["strata_speedup"] = r["median_ms"] / mine["median_ms"]
    for r in results:
        r.pop("output", None)


def rms_norm_torch(x):
    if hasattr(F, "rms_norm"):  # torch >= 2.4
        return F.rms_norm(x, (x.shape[-1],), eps=EPS)
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def cases(device):
    """(op, shape text, bytes, input maker, [(implementation, fn)]) with Strata first."""
    cut = 16 if device == "cpu" else 1
    out = []

    rows, d = 524288 // cut, 128
    # Default arguments bind the shape now: a plain closure would see the rows / d of the last case.
    out.append(("l2norm fwd", f"bf16 [{rows}, {d}]", 2 * rows * d * 2,
                lambda rows=rows, d=d: torch.randn(rows, d, device=device, dtype=torch.bfloat16),
                [("strata", lambda x: sapi.l2norm(x, EPS)),
                 ("torch eager rsqrt", lambda x: (x * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + EPS))
                  .to(x.dtype)),
                 ("torch F.normalize", lambda x: F.normalize(x, dim=-1))]))

    rows, d = 32768 // cut, 4096
    out.append(("rmsnorm_without_weight fwd", f"bf16 [{rows}, {d}]", 2 * rows * d * 2,
                lambda rows=rows, d=d: torch.randn(rows, d, device=device, dtype=torch.bfloat16),
                [("strata", lambda x: sapi.rmsnorm_without_weight(x, EPS)),
                 ("torch F.rms_norm" if hasattr(F, "rms_norm") else "torch eager rsqrt", rms_norm_torch)]))

    b, t, h, s, chunk = 4, 8192 // cut, 32, 128, 64

    def chunk_cumsum_torch(g):
        return g.float().view(b, t // chunk, chunk, h, s).cumsum(2).view(b, t, h, s)

    out.append(("chunk_local_cumsum", f"f32 [{b}, {t}, {h}, {s}] chunk {chunk}", 2 * b * t * h * s * 4,
                lambda b=b, t=t, h=h, s=s: torch.randn(b, t, h, s, device=device, dtype=torch.float32) * 0.1,
                [("strata", lambda g: sapi.chunk_local_cumsum(g, chunk)),
                 ("torch eager chunked cumsum", chunk_cumsum_torch)]))
    return out


def print_table(rows):
    """Aligned columns; a row that failed shows its error after the implementation name."""
    header = ("op", "shape", "impl", "ms", "GB/s", "x floor", "strata speedup", "max|diff|")
    cells = []
    for r in rows:
        if "error" in r:
            cells.append((r["op"], r["shape"], r["impl"], "error: " + r["error"]))
            continue
        gbs = f"{r['gbs']:.0f}" if r["gbs"] >= 100 else f"{r['gbs']:.1f}"
        cells.append((r["op"], r["shape"], r["impl"], f"{r['median_ms']:.4f}", gbs, f"{r['floor_ratio']:.2f}",
                      f"{r['strata_speedup']:.2f}x" if "strata_speedup" in r else "",
                      f"{r['max_abs_diff_vs_torch']:.2e}" if "max_abs_diff_vs_torch" in r else ""))
    full = [c for c in cells if len(c) == len(header)]
    widths = [max([len(h)] + [len(c[i]) for c in (cells if i < 3 else full)]) for i, h in enumerate(header)]

    def line(c):
        text = [v.ljust(w) for v, w in zip(c[:3], widths)]
        text += [c[3]] if len(c) < len(header) else [v.rjust(w) for v, w in zip(c[3:], widths[3:])]
        return "  " + "  ".join(text).rstrip()

    print(line(header))
    print("  " + "  ".join("-" * w for w in widths))
    for c in cells:
        print(line(c))


def main():
    args = parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_peers: --device cuda, but torch sees no GPU")
    iters = args.iters or (5 if args.quick else 30)
    timer = Timer(device, iters, warmup=2 if args.quick else 5)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    copy_gbs, copy_n = copy_bandwidth_gbs(device, timer, args.quick)
    print(f"torch_peers on {name}: torch {torch.__version__}, {STRATA_STATUS}")
    print(f"copy bandwidth {copy_gbs:.1f} GB/s (read + write, {copy_n / MiB:.0f} MiB buffer); "
          f"median of {iters} calls, floor = bytes / copy bandwidth")

    rows, strata_failed = [], False
    for op, shape, nbytes, make, impls in cases(device):
        inputs = rotated(make, device)
        # The label's shape is the input's (s6run2: a closure bug timed another shape under this label).
        assert f"[{', '.join(str(n) for n in inputs[0].shape)}]" in shape, (shape, tuple(inputs[0].shape))
        floor_ms = nbytes / (copy_gbs * 1e9) * 1e3
        results = []
        for impl, fn in impls:
            row = {"op": op, "shape": shape, "impl": impl, "bytes": nbytes, "floor_ms": floor_ms}
            if impl == "strata" and sapi is None:
                row["error"] = STRATA_STATUS
            else:
                try:
                    median_ms, min_ms = timer(fn, inputs)
                    row.update(median_ms=median_ms, min_ms=min_ms, gbs=nbytes / (median_ms * 1e-3) / 1e9,
                               floor_ratio=median_ms / floor_ms, output=fn(inputs[0]))
                except Exception as e:  # an op missing from this build, a dtype a peer lacks on the CPU
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
                    strata_failed |= impl == "strata"
            results.append(row)
        compare_with_peers(results)
        rows.extend(results)
        del inputs

    print_table(rows)
    errors = sum("error" in r for r in rows)
    print(f"torch_peers: {len(rows)} rows, {errors} without a time; {STRATA_STATUS}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "strata": STRATA_STATUS, "copy_gbs": copy_gbs,
                       "copy_bytes": copy_n, "iters": iters, "rows": rows}, f, indent=2)
    return 1 if strata_failed else 0


if __name__ == "__main__":
    sys.exit(main())
