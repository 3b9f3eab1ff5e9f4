"""Per-call overhead of the strata Python front end on tiny CPU tensors (warm plan cache).

    python tests/python/bench_overhead.py [--iters N]

Prints microseconds per call (best of several repeats; thread CPU time, or wall-clock time with --wall)
for each op through the eager fast path, with autograd recording, and through the torch.library
dispatcher; torch baselines alongside. The target is
<= 15 us for a tiny CPU l2norm with a warm cache (the no-grad fast path). test_overhead.py runs
`measure()` and records the numbers.
"""

import argparse
import time

import torch

import strata
from strata import api


def _time_us(fn, iters: int, repeats: int = 7, clock=time.thread_time) -> float:
    """Best-of-`repeats` time per call. The default clock is this thread's CPU time, which is what the
    front end costs; unlike wall time it is not inflated when other processes share the cores (wall time on
    an idle machine is the same figure)."""
    for _ in range(max(100, iters // 10)):  # warm up: plan cache, allocator
        fn()
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(iters):
            fn()
        samples.append((clock() - t0) / iters * 1e6)
    return min(samples)


def measure(iters: int = 5000, ops=None, wall: bool = False, cuda: bool = True) -> dict:
    """{name: microseconds per call}; names starting with "torch." are baselines."""
    clock = time.perf_counter if wall else time.thread_time
    x = torch.randn(4, 8)
    xg = x.clone().requires_grad_()
    g = torch.randn(1, 16, 2)
    cases = {
        "l2norm": lambda: api.l2norm(x),
        "l2norm (requires_grad, forward only)": lambda: api.l2norm(xg),
        "rmsnorm_without_weight": lambda: api.rmsnorm_without_weight(x),
        "rmsnorm_without_weight factor": lambda: api.rmsnorm_without_weight(x, mode="factor"),
        "chunk_local_cumsum": lambda: api.chunk_local_cumsum(g, 8),
        "torch.empty x2 (allocation floor)": lambda: (torch.empty(4, 8), torch.empty(4)),
        "torch.nn.functional.normalize": lambda: torch.nn.functional.normalize(x, dim=-1),
    }
    if ops is not None:
        cases = {k: v for k, v in cases.items() if k in ops}
    out = {}
    with torch.no_grad():
        for name, fn in cases.items():
            if "requires_grad" not in name:
                out[name] = _time_us(fn, iters, clock=clock)
    for name, fn in cases.items():
        if "requires_grad" in name:
            out[name] = _time_us(fn, iters, clock=clock)
    if strata._ops.HAS_CUSTOM_OP and (ops is None or "l2norm" in ops):
        prev = strata.get_fast_path()
        strata.set_fast_path(False)
        try:
            with torch.no_grad():
                out["l2norm via torch.library dispatcher"] = _time_us(lambda: api.l2norm(x), iters, clock=clock)
            out["l2norm via dispatcher (requires_grad)"] = _time_us(lambda: api.l2norm(xg), iters, clock=clock)
        finally:
            strata.set_fast_path(prev)
    if cuda and torch.cuda.is_available() and strata.built_with_cuda():
        xc = x.cuda()

        def cuda_call():
            api.l2norm(xc)

        with torch.no_grad():
            cuda_call()
            torch.cuda.synchronize()
            out["l2norm cuda (launch, current stream)"] = _time_us(cuda_call, iters, clock=clock)
            torch.cuda.synchronize()
            out["torch.nn.functional.normalize cuda"] = _time_us(
                lambda: torch.nn.functional.normalize(xc, dim=-1), iters, clock=clock)
            torch.cuda.synchronize()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=5000)
    p.add_argument("--wall", action="store_true", help="wall-clock time instead of thread CPU time")
    args = p.parse_args()
    res = measure(args.iters, wall=args.wall)
    print(f"strata {strata.version()}, torch {torch.__version__}, tiny tensors, warm plan cache, "
          f"{'wall' if args.wall else 'thread CPU'} time")
    w = max(len(k) for k in res)
    for k, v in res.items():
        print(f"  {k:<{w}}  {v:8.2f} us/call")
    print(f"l2norm per-call overhead: {res['l2norm']:.2f} us (target <= 15 us)")


if __name__ == "__main__":
    main()
