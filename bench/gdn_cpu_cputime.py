#!/usr/bin/env python3
"""chunk_gated_delta_rule on the CPU: Strata against the PyTorch eager chunked peer of bench/gdn_peers.py (same
inputs, same FLOP counts) by process CPU time as well as wall time, the two alternated call by call.

On a shared machine (the 2-vCPU development VM with other jobs: load 10-40) wall times move by 2-100x with the
time slicing, and the eager peer, made of many small multi-threaded ops, suffers most (gdn_peers.py --quick at
load 41: 16.1 s against 0.16-0.21 s idle). Process CPU time (time.process_time: every thread of the process,
charged only while it runs) is much less sensitive, so this script reports, per call, both times and the ratio
peer / Strata of each alternated pair (median and quartiles over the pairs). With --threads 1 (the default) both
run on one thread: the CPU-time ratio is then the work ratio. It is a conservative estimate of the two-thread
idle wall-clock ratio as long as Strata scales at least as well as the eager peer from 1 to 2 threads (Strata:
1.57-1.98x forward, 1.95x backward, session 5; the eager peer's small ops scale worse).

Session 18: the fp32 FMA peak of `strata peak` (gdn_peers.fma_peak) is measured on the same thread count before
and after the pairs, and Strata's rate per CPU-second is given as a share of the probe's rate per thread
CPU-second (the higher of the two measurements): the load-robust form of issue 3's "% of the fp32 FMA peak".

--output-cache-ab adds a third contestant, Strata with its CPU output cache off (strata._ops.cpu_output handing
out fresh torch tensors, as before session 13), so that the cache's effect is measured in the same alternation.

    python bench/gdn_cpu_cputime.py [--threads N] [--pairs P] [--bwd] [--output-cache-ab]
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gdn_peers  # noqa: E402  (make, torch_chunked_gdn, flops)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--bwd", action="store_true", help="forward + backward (torch.autograd.grad) instead of forward")
    ap.add_argument("--output-cache-ab", action="store_true",
                    help="also time Strata with the CPU output cache off (fresh output tensors every call)")
    args = ap.parse_args()
    if gdn_peers.sapi is None:
        sys.exit(f"strata: {gdn_peers.STRATA}")
    torch.set_num_threads(args.threads)
    if int(os.environ.get("OMP_NUM_THREADS", "0")) != args.threads:
        print(f"note: set OMP_NUM_THREADS={args.threads} too (Strata reads it at load time)")
    B, T, H, HV, D = 1, 4096, 4, 8, 128
    q, k, v, g, beta = gdn_peers.make(B, T, H, HV, D, torch.float32, "cpu")
    do = torch.randn(B, T, HV, D, generator=torch.Generator().manual_seed(1))
    scale = D ** -0.5
    fns = {"torch_chunked": gdn_peers.torch_chunked_gdn, "strata": gdn_peers.sapi.chunk_gated_delta_rule}
    if args.output_cache_ab:
        from strata import _ops

        def fresh_outputs(*a, **kw):
            on = _ops.CPU_OUTPUT_MIN_BYTES
            _ops.CPU_OUTPUT_MIN_BYTES = 1 << 62  # every output from torch.empty, faulted in by the op
            try:
                return gdn_peers.sapi.chunk_gated_delta_rule(*a, **kw)
            finally:
                _ops.CPU_OUTPUT_MIN_BYTES = on
        fns["strata_fresh_out"] = fresh_outputs

    def call(fn):
        ins = [x.clone().requires_grad_(args.bwd) for x in (q, k, v, g, beta)]
        w0, c0 = time.perf_counter(), time.process_time()
        o, _ = fn(*ins, scale=scale, output_final_state=True, use_qk_l2norm_in_kernel=True)
        if args.bwd:
            torch.autograd.grad(o, ins, do)
        return time.perf_counter() - w0, time.process_time() - c0

    cli = gdn_peers.find_strata_cli()
    fma0, why = gdn_peers.fma_peak(cli, args.threads)
    for fn in fns.values():  # warm-up
        call(fn)
    res = {n: [] for n in fns}
    for i in range(args.pairs):  # the order reversed every other round
        for n, fn in (list(fns.items()) if i % 2 == 0 else list(fns.items())[::-1]):
            res[n].append(call(fn))
    fl = gdn_peers.flops(B, T, HV, D, False) + (gdn_peers.flops(B, T, HV, D, True) if args.bwd else 0)
    what = "fwd+bwd" if args.bwd else "fwd"
    print(f"B={B} T={T} H={H} HV={HV} K=V={D} f32, l2norm in kernel, final state; {what}; threads {args.threads}; "
          f"torch {torch.__version__}; load average {os.getloadavg()[0]:.1f}")
    for n, r in res.items():
        w = sorted(x[0] for x in r)
        c = sorted(x[1] for x in r)
        print(f"  {n:>14}: wall min {1e3 * w[0]:9.1f} median {1e3 * w[len(w) // 2]:9.1f} ms | CPU min "
              f"{1e3 * c[0]:9.1f} median {1e3 * c[len(c) // 2]:9.1f} ms ({fl / c[0] / 1e9:.1f} GFLOP/s per CPU-s)")
    fma1, _ = gdn_peers.fma_peak(cli, args.threads) if fma0 is not None else (None, "")
    if fma0 is None:
        print(f"  fp32 FMA peak: not measured ({why})")
    else:
        per_cpu = max(f["gflops_per_cpu_second"] for f in (fma0, fma1) if f is not None)
        c = min(x[1] for x in res["strata"])
        print(f"  fp32 FMA peak ({fma0['isa']}, {args.threads} threads) per thread CPU-second: "
              f"{fma0['gflops_per_cpu_second']:.1f} before, "
              f"{fma1['gflops_per_cpu_second'] if fma1 else float('nan'):.1f} after the pairs (wall: "
              f"{fma0['gflops']:.1f} / {fma1['gflops'] if fma1 else float('nan'):.1f} GFLOP/s); strata {what}: "
              f"{100 * fl / c / 1e9 / per_cpu:.1f} % of the higher per CPU-second")
    pairs = [("torch_chunked", "strata")] + ([("strata_fresh_out", "strata")] if args.output_cache_ab else [])
    for num, den in pairs:
        for i, label in ((1, "CPU time"), (0, "wall time")):
            rat = sorted(a[i] / b[i] for a, b in zip(res[num], res[den]))
            q1, q3 = rat[len(rat) // 4], rat[(3 * len(rat)) // 4]
            print(f"  {num} / {den}, paired {label}: median {statistics.median(rat):.3f}x "
                  f"(quartiles {q1:.3f}-{q3:.3f}, {len(rat)} pairs)")


if __name__ == "__main__":
    main()
