#!/usr/bin/env python3
"""Per-call overhead of the strata Python front end on tiny CPU tensors (warm plan cache), PERF_TARGETS.md
§Host overhead: <= 15 us per call.

    python bench/py_overhead.py [--iters N] [--repeats R] [--out FILE]

Each case runs R blocks of N calls after a warm-up (plan cache filled, allocator warm); a block's time / N is
one sample. Printed per case: the min and the median sample, in thread CPU time (what the front end costs the
calling thread: not inflated when other processes take the cores, so it is the figure to compare with the
target on a shared machine) and in wall-clock time (what a caller waits; equal to the CPU time on an idle
machine, larger under load). torch baselines alongside: two torch.empty calls (the outputs' allocation, a
floor no op can go below) and torch.nn.functional.normalize.

The cases: the three Issue 2 ops in eager mode without autograd (the fast path of python/strata/_ops.py),
l2norm with an input that requires grad (forward through torch.autograd.Function), and l2norm through the
torch.library dispatcher (STRATA_PY_FAST_PATH=0's path, also what torch.compile graphs call).
tests/python/test_overhead.py records measure()'s figures in the test suite (tests/python/bench_overhead.py
forwards to this file).
"""

import argparse
import datetime
import os
import platform
import statistics
import time

import torch

import strata
from strata import api


def cases(cuda: bool = True):
    """{name: callable} of one call each; "(grad)" cases run with grad enabled, the others under no_grad;
    names starting with "torch." are baselines."""
    x = torch.randn(4, 8)
    xg = x.clone().requires_grad_()
    g = torch.randn(1, 16, 2)

    def via_dispatcher(fn):
        def call():
            prev = strata.get_fast_path()
            strata.set_fast_path(False)
            try:
                return fn()
            finally:
                strata.set_fast_path(prev)
        return call

    out = {
        "l2norm": lambda: api.l2norm(x),
        "rmsnorm_without_weight": lambda: api.rmsnorm_without_weight(x),
        "rmsnorm_without_weight factor": lambda: api.rmsnorm_without_weight(x, mode="factor"),
        "chunk_local_cumsum": lambda: api.chunk_local_cumsum(g, 8),
        "l2norm (grad: requires_grad input, forward only)": lambda: api.l2norm(xg),
        "torch.empty x2 (allocation floor)": lambda: (torch.empty(4, 8), torch.empty(4)),
        "torch.nn.functional.normalize": lambda: torch.nn.functional.normalize(x, dim=-1),
    }
    if strata._ops.HAS_CUSTOM_OP:
        # set_fast_path is two global stores: negligible next to the dispatcher.
        out["l2norm via torch.library dispatcher"] = via_dispatcher(lambda: api.l2norm(x))
    if cuda and torch.cuda.is_available() and strata.built_with_cuda():
        # Host time of a launch on torch's current stream (the kernels run behind it; synchronized per block).
        xc = x.cuda()
        out["l2norm cuda (launch, current stream)"] = lambda: api.l2norm(xc)
        out["torch.nn.functional.normalize cuda"] = lambda: torch.nn.functional.normalize(xc, dim=-1)
    return out


def samples_us(fn, iters: int, repeats: int, clock, sync=lambda: None) -> list:
    """Per-call microseconds of `repeats` blocks of `iters` calls (after a warm-up)."""
    for _ in range(max(100, iters // 10)):
        fn()
    out = []
    for _ in range(repeats):
        sync()
        t0 = clock()
        for _ in range(iters):
            fn()
        out.append((clock() - t0) / iters * 1e6)
        sync()
    return out


def run_case(name, fn, iters, repeats, clock):
    sync = torch.cuda.synchronize if "cuda" in name else (lambda: None)
    if "(grad" in name:
        return samples_us(fn, iters, repeats, clock, sync)
    with torch.no_grad():
        return samples_us(fn, iters, repeats, clock, sync)


def measure(iters: int = 5000, ops=None, wall: bool = False, repeats: int = 7, cuda: bool = True) -> dict:
    """{name: min per-call microseconds} (thread CPU time, or wall time), for the cases named in `ops` (all by
    default)."""
    clock = time.perf_counter if wall else time.thread_time
    return {k: min(run_case(k, fn, iters, repeats, clock))
            for k, fn in cases(cuda).items() if ops is None or k in ops}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2000, help="calls per timed block")
    p.add_argument("--repeats", type=int, default=15, help="timed blocks per case")
    p.add_argument("--out", help="also write the report to this file")
    args = p.parse_args()

    lines = []
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines.append(f"# strata Python per-call overhead, tiny CPU tensors, warm plan cache ({now})")
    lines.append(f"device: {cpu_name()}, {os.cpu_count()} CPUs; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
                 f" (at start); strata {strata.version()} (strata threads {strata._C.get_num_threads()}), "
                 f"torch {torch.__version__}, Python {platform.python_version()}")
    lines.append(f"{args.repeats} blocks of {args.iters} calls per case; us per call: min and median over the blocks")
    lines.append("")
    w = max(len(k) for k in cases())
    lines.append(f"{'case':<{w}}  {'cpu min':>8}  {'cpu med':>8}  {'wall min':>8}  {'wall med':>8}")
    print("\n".join(lines), flush=True)
    res = {}
    for name, fn in cases().items():
        cpu = run_case(name, fn, args.iters, args.repeats, time.thread_time)
        wall = run_case(name, fn, args.iters, args.repeats, time.perf_counter)
        res[name] = (min(cpu), statistics.median(cpu), min(wall), statistics.median(wall))
        line = f"{name:<{w}}  " + "  ".join(f"{v:8.2f}" for v in res[name])
        lines.append(line)
        print(line, flush=True)
    worst = max(res[k][0] for k in ("l2norm", "rmsnorm_without_weight", "chunk_local_cumsum"))
    tail = f"\nIssue 2 ops, eager, no grad: worst cpu min {worst:.2f} us per call (target <= 15 us)"
    lines.append(tail)
    print(tail)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
