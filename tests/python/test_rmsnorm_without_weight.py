"""strata.api.rmsnorm_without_weight (normalize and factor modes) against float64 (ops_fused.md §3)."""

import pytest
import torch

import strata
from strata import api

from conftest import DEVICES, TOL, assert_close_rel, device_dtypes, rel_rms


def ref_r(x, eps=1e-6):
    x64 = x.detach().double()
    return 1.0 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps)


def ref_y(x, eps=1e-6):
    return x.detach().double() * ref_r(x, eps)


def make_x(shape, dtype, device):
    return torch.randn(shape, dtype=torch.float32).to(dtype).to(device)


SHAPES = [(2, 9, 512), (3, 100), (1, 5, 4, 64), (17, 1), (1000,)]


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_normalize_forward(device, dtype, shape):
    x = make_x(shape, dtype, device)
    y, r = api.rmsnorm_without_weight_fwd(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert r.shape == x.shape[:-1] + (1,)
    assert r.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_close_rel(y, ref_y(x), dtype, "y")
    assert_close_rel(r, ref_r(x), torch.float64 if dtype == torch.float64 else torch.float32, "r")
    torch.testing.assert_close(api.rmsnorm_without_weight(x, mode="normalize"), y, rtol=0, atol=0)


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_factor_forward(device, dtype, shape):
    x = make_x(shape, dtype, device)
    r = api.rmsnorm_without_weight(x, mode="factor")
    assert r.shape == x.shape[:-1] + (1,) and r.dtype == dtype  # out_dtype defaults to x.dtype
    assert_close_rel(r, ref_r(x), dtype, "r")
    r32 = api.rmsnorm_without_weight(x, eps=1e-5, mode="factor", out_dtype=torch.float32)
    assert r32.dtype == torch.float32
    assert_close_rel(r32, ref_r(x, 1e-5), torch.float32, "r (f32)")


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("mode", ["normalize", "factor"])
def test_backward(device, dtype, mode):
    x = make_x((4, 37, 96), dtype, device).requires_grad_()
    out = api.rmsnorm_without_weight(x, mode=mode)
    g = torch.randn(out.shape, dtype=torch.float32).to(out.dtype).to(device)
    (dx,) = torch.autograd.grad(out, x, g)
    x64 = x.detach().double().requires_grad_()
    r64 = 1.0 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6)
    out64 = x64 * r64 if mode == "normalize" else r64
    (dx_ref,) = torch.autograd.grad(out64, x64, g.double())
    assert dx.dtype == dtype and dx.shape == x.shape
    # factor mode saves r in x.dtype (its output), so bf16/f16 get the rounding of r cubed: 2x ceiling.
    assert_close_rel(dx, dx_ref, dtype, "dx", factor=2.0)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous(device):
    base = make_x((8, 6, 160), torch.float32, device)
    for name, x in {"transposed": base.transpose(0, 1), "offset": base[3:, 1:],
                    "padded rows": base[..., :128], "strided last dim": base[..., ::2]}.items():
        assert rel_rms(api.rmsnorm_without_weight(x), ref_y(x)) <= TOL[torch.float32], name
        r = api.rmsnorm_without_weight(x, mode="factor")
        assert rel_rms(r, ref_r(x)) <= TOL[torch.float32], name


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    x = torch.empty(0, 32, device=device, requires_grad=True)
    y = api.rmsnorm_without_weight(x)
    r = api.rmsnorm_without_weight(x, mode="factor")
    assert y.shape == (0, 32) and r.shape == (0, 1)
    (y.sum() + r.sum()).backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("mode", ["normalize", "factor"])
def test_gradcheck(call_path, mode):
    x = torch.randn(2, 3, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: api.rmsnorm_without_weight(t, mode=mode), (x,), eps=1e-6, atol=1e-7)


def test_bwd_direct():
    x = make_x((5, 24), torch.float32, "cpu")
    y, r = api.rmsnorm_without_weight_fwd(x)
    dy = torch.randn_like(y)
    dx = api.rmsnorm_without_weight_bwd(x, r, dy, mode="normalize")
    x64, r64, dy64 = x.double(), r.double(), dy.double()
    dx_ref = r64 * (dy64 - x64 * r64 ** 2 * (dy64 * x64).mean(-1, keepdim=True))
    assert_close_rel(dx, dx_ref, torch.float32, "dx")
    dr = torch.randn_like(r)
    dx = api.rmsnorm_without_weight_bwd(x, r, dr, mode="factor")
    assert_close_rel(dx, -dr.double() * r64 ** 3 * x64 / x.shape[-1], torch.float32, "dx (factor)")


def test_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        api.rmsnorm_without_weight(torch.ones(2, 4), mode="scale")


def test_bad_dtype_raises_with_c_message():
    with pytest.raises(strata.StrataValueError) as e:
        api.rmsnorm_without_weight(torch.ones(2, 4, dtype=torch.int64))
    assert e.value.status == 102 and e.value.c_message in str(e.value)
