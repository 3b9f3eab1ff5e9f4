"""Records the per-call overhead of the Python front end (bench/py_overhead.py, through bench_overhead.py).
Not a timing gate: the machine may be loaded, so only a generous bound is asserted."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import bench_overhead  # noqa: E402


def test_overhead_recorded(record_property, capsys):
    res = bench_overhead.measure(iters=2000, ops=["l2norm", "l2norm (grad: requires_grad input, forward only)",
                                                   "torch.empty x2 (allocation floor)"], cuda=False)
    us = res["l2norm"]
    record_property("l2norm_overhead_us", round(us, 3))
    with capsys.disabled():
        print(f"\nstrata l2norm tiny CPU call: {us:.2f} us (thread CPU time; target <= 15 us); "
              f"with requires_grad: {res['l2norm (grad: requires_grad input, forward only)']:.2f} us; "
              f"torch.empty x2: {res['torch.empty x2 (allocation floor)']:.2f} us")
    if us > 200:
        pytest.fail(f"per-call overhead {us:.1f} us exceeds the generous 200 us bound")
