"""strata.api.l2norm / l2norm_fwd / l2norm_bwd against a float64 reference (ops_gdn_kda.md §4.1)."""

import pytest
import torch

import strata
from strata import api

from conftest import DEVICES, TOL, assert_close_rel, device_dtypes, rel_rms


def ref_l2norm(x, eps=1e-6):
    x64 = x.detach().double()
    rstd = 1.0 / torch.sqrt((x64 * x64).sum(-1) + eps)
    return x64 * rstd.unsqueeze(-1), rstd


def make_x(shape, dtype, device):
    return (0.5 * torch.randn(shape, dtype=torch.float32) + 0.3).to(dtype).to(device)


SHAPES = [(1, 63, 1, 60), (2, 50, 4, 64), (3, 17, 100), (5, 128), (7, 1), (300,)]


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward(device, dtype, shape):
    x = make_x(shape, dtype, device)
    y, rstd = api.l2norm_fwd(x)
    y_ref, rstd_ref = ref_l2norm(x)
    assert y.dtype == dtype and y.shape == x.shape and y.device == x.device
    assert rstd.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert rstd.shape == x.shape[:-1]
    assert_close_rel(y, y_ref, dtype, "y")
    assert_close_rel(rstd, rstd_ref, torch.float32 if dtype != torch.float64 else dtype, "rstd")
    torch.testing.assert_close(api.l2norm(x), y, rtol=0, atol=0)


@pytest.mark.parametrize("device,dtype", device_dtypes())
def test_output_dtype(device, dtype):
    x = make_x((4, 33, 96), dtype, device)
    y = api.l2norm(x, eps=1e-5, output_dtype=torch.float32)
    assert y.dtype == torch.float32
    # inputs are the rounded dtype values, so the f32 output is as good as the f32 kernel
    assert_close_rel(y, ref_l2norm(x, 1e-5)[0], torch.float32, "y")


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("shape", [(2, 50, 4, 64), (3, 17, 100)], ids=str)
def test_backward(device, dtype, shape):
    x = make_x(shape, dtype, device).requires_grad_()
    y = api.l2norm(x)
    dy = torch.randn(shape, dtype=torch.float32).to(dtype).to(device)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    y64 = x64 / torch.sqrt((x64 * x64).sum(-1, keepdim=True) + 1e-6)
    (dx_ref,) = torch.autograd.grad(y64, x64, dy.double())
    assert dx.dtype == dtype and dx.shape == x.shape
    # The backward uses the saved y (rounded to the dtype), as fla does: allow 2x the ceiling.
    assert_close_rel(dx, dx_ref, dtype, "dx", factor=2.0)


@pytest.mark.parametrize("device,dtype", device_dtypes())
def test_l2norm_bwd_direct(device, dtype):
    x = make_x((6, 40), dtype, device)
    y, rstd = api.l2norm_fwd(x)
    dy = torch.randn_like(y)
    dx = api.l2norm_bwd(y, rstd, dy)
    y64, r64, dy64 = y.double(), rstd.double(), dy.double()
    dx_ref = r64.unsqueeze(-1) * (dy64 - (dy64 * y64).sum(-1, keepdim=True) * y64)
    assert dx.dtype == y.dtype
    assert_close_rel(dx, dx_ref, dtype, "dx")


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous(device):
    base = make_x((6, 10, 128), torch.float32, device)
    views = {
        "transposed leading dims": base.transpose(0, 1),
        "storage offset": base[2:, 3:],
        "padded rows": base[..., :100],
        "strided last dim": base[..., ::2],
        "expanded rows": base[:1, :1].expand(4, 5, 128),
    }
    for name, x in views.items():
        y, rstd = api.l2norm_fwd(x)
        y_ref, rstd_ref = ref_l2norm(x)
        assert y.is_contiguous()
        assert rel_rms(y, y_ref) <= TOL[torch.float32], name
        assert rel_rms(rstd, rstd_ref) <= TOL[torch.float32], name
    # gradient flows through a view (and the incoming grad from .sum() is an expanded, stride-0 tensor)
    xv = base.clone().requires_grad_()
    api.l2norm(xv.transpose(0, 1)).sum().backward()
    x64 = base.double().requires_grad_()
    (x64.transpose(0, 1) / torch.sqrt((x64.transpose(0, 1) ** 2).sum(-1, keepdim=True) + 1e-6)).sum().backward()
    assert rel_rms(xv.grad, x64.grad) <= 2 * TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    x = torch.empty(0, 64, device=device)
    y, rstd = api.l2norm_fwd(x)
    assert y.shape == (0, 64) and rstd.shape == (0,)
    x = torch.empty(3, 0, 64, device=device, requires_grad=True)
    y = api.l2norm(x)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_zero_row_is_finite():
    x = torch.zeros(2, 16)
    y, rstd = api.l2norm_fwd(x, eps=1e-6)
    assert torch.equal(y, torch.zeros_like(y))
    torch.testing.assert_close(rstd, torch.full((2,), 1000.0), rtol=1e-6, atol=0)


def test_gradcheck(call_path):
    x = torch.randn(3, 4, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: api.l2norm(t), (x,), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradcheck(lambda t: api.l2norm(t, eps=1e-3), (x,), eps=1e-6, atol=1e-7)


def test_bad_input_raises_with_c_message():
    with pytest.raises(strata.StrataError) as e:
        api.l2norm(torch.zeros((), dtype=torch.float32))  # rank 0: no row dimension
    assert e.value.c_message and e.value.c_message in str(e.value)
    assert "l2norm" in str(e.value)
    with pytest.raises(strata.StrataError) as e:
        api.l2norm(torch.ones(4, 8, dtype=torch.int32))
    assert isinstance(e.value, ValueError)  # bad argument: a 1xx status
    assert e.value.status == 102 and e.value.status_name == "STRATA_ERROR_INVALID_DTYPE"
    assert "x" in e.value.c_message
