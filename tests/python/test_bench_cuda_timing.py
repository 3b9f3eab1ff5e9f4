"""The timing helpers shared by the CUDA bench scripts (bench/cuda_timing.py): the implementation filter on any
build, the timings on a CUDA device (each a positive finite number of the right scale)."""

import math
import os
import sys

import pytest
import torch
from conftest import requires_cuda

from strata import _C

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import cuda_timing  # noqa: E402


def test_impls_for_keeps_dispatch_order_and_filters_by_prefix():
    names = _C.op_impl_names("rms_norm_gated_fwd")
    assert cuda_timing.impls_for("rms_norm_gated_fwd", "cpu.") == [n for n in names if n.startswith("cpu.")]
    assert cuda_timing.impls_for("rms_norm_gated_fwd", "") == list(names)
    assert all(n.startswith("cuda.") for n in cuda_timing.impls_for("rms_norm_gated_fwd"))


@pytest.mark.cuda
@requires_cuda
def test_timings_on_cuda():
    x = torch.randn(1 << 20, device="cuda")
    calls = []

    def fn():
        calls.append(1)
        x.mul_(1.0)

    for ms in (cuda_timing.back_to_back(fn, iters=5), cuda_timing.queued_ms(fn, iters=5, loops=3, warm=2),
               cuda_timing.per_call_events(fn, iters=5)):
        assert math.isfinite(ms) and 0 < ms < 1000
    assert len(calls) == 5 + (2 + 3 * 5) + (3 + 5)
    us = cuda_timing.host_us(fn, iters=5)
    assert math.isfinite(us) and us > 0
    gbs = cuda_timing.copy_gbs(1 << 24)
    assert math.isfinite(gbs) and gbs > 1
