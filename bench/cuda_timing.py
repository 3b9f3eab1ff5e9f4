"""CUDA timing helpers shared by the bench scripts (fused_mix_probe.py, norm_conv_queued.py, py_launch_diag.py).

Three ways of timing a Python callable `fn` that launches CUDA work, all in milliseconds per call except host_us:

  * queued: calls launched back to back between two CUDA events (the host runs ahead, so its overhead is hidden;
    what `strata atk` and bench/fused_peers.py measure), after warm-up calls, median over `loops` such loops;
  * per call: each call between its own pair of events, all queued, median over the calls;
  * host: wall time per call on the host while the queue fills (the Python + dispatch overhead).

Plus the implementation lists and the bandwidth of a torch copy, measured the same way (the floor of the
memory-bound ops: bytes / that bandwidth). The scripts import this module from their own folder (bench/).
"""

import statistics
import time

import torch

from strata import _C


def back_to_back(fn, iters=30):
    """ms per call of `iters` calls queued back to back between two CUDA events (no warm-up)."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def queued_ms(fn, iters=20, loops=1, warm=3):
    """`warm` calls, then the median over `loops` loops of back_to_back(fn, iters)."""
    for _ in range(warm):
        fn()
    return statistics.median(back_to_back(fn, iters) for _ in range(loops))


def per_call_events(fn, iters=30):
    """Median ms of `iters` calls, each between its own pair of CUDA events (3 warm-up calls first)."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[len(t) // 2]


def host_us(fn, iters=30):
    """Host microseconds per call while `iters` calls are queued (the device work is not waited for)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6


def impls_for(op, prefix="cuda."):
    """The registered implementations of `op` whose names start with `prefix`, in dispatch order."""
    return [n for n in _C.op_impl_names(op) if n.startswith(prefix)]


def copy_gbs(nbytes, iters=20):
    """Read + write GB/s of a queued torch copy moving nbytes in total (nbytes / 2 read, nbytes / 2 written)."""
    n = int(nbytes // 2)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = queued_ms(lambda: dst.copy_(src), iters=iters)
    return nbytes / (ms * 1e-3) / 1e9
