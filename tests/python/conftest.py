"""Shared helpers for the strata Python tests (pytest tests/python after `pip install .`)."""

import os

import pytest
import torch

import strata

# ARCHITECTURE.md §6 ceilings on the relative RMS error vs the float64 reference.
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
FLOAT_DTYPES_CPU = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
FLOAT_DTYPES_CUDA = [torch.float32, torch.bfloat16, torch.float16]


def cuda_ok() -> bool:
    return torch.cuda.is_available() and strata.built_with_cuda() and strata.cuda_device_count() > 0


requires_cuda = pytest.mark.skipif(not cuda_ok(), reason="needs a CUDA GPU visible to torch and a CUDA build of strata")

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])]


def device_dtypes():
    """(device, dtype) pairs: f32/bf16/f16/f64 on CPU; f32/bf16/f16 on CUDA."""
    out = [pytest.param("cpu", dt, id=f"cpu-{str(dt)[6:]}") for dt in FLOAT_DTYPES_CPU]
    out += [pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}", marks=[pytest.mark.cuda, requires_cuda])
            for dt in FLOAT_DTYPES_CUDA]
    return out


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (0 for two empty tensors)."""
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if ref.numel() == 0:
        return 0.0
    return ((out - ref).norm() / (ref.norm() + 1e-30)).item()


def assert_close_rel(out, ref, dtype, what="output", factor=1.0):
    assert torch.isfinite(out.detach().double()).all(), f"{what}: non-finite values"
    err = rel_rms(out, ref)
    tol = TOL[dtype] * factor
    assert err <= tol, f"{what}: relative RMS error {err:.3e} > {tol:.1e} ({dtype})"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(params=["fast", "dispatcher"])
def call_path(request):
    """Runs a test twice: through the eager fast path and through the torch.library dispatcher."""
    if request.param == "dispatcher" and strata._ops.HAS_CUSTOM_OP is False:
        pytest.skip("torch < 2.4: no torch.library.custom_op")
    prev = strata.get_fast_path()
    strata.set_fast_path(request.param == "fast")
    yield request.param
    strata.set_fast_path(prev)


def pytest_report_header(config):
    return (f"strata {strata.version()} (cuda build: {strata.built_with_cuda()}), torch {torch.__version__}, "
            f"threads {strata.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
