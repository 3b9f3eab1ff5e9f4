"""strata.api.clipped_swiglu / swiglu / swiglu_with_limit against float64 torch compositions (ops_fused.md §8):
both layouts, GPT-OSS and DeepSeek constants, probs, the clamp-boundary gradients, gradcheck, opcheck,
torch.compile."""

import pytest
import torch

from strata import _ops, api

from conftest import DEVICES, assert_close_rel, device_dtypes, requires_cuda

needs_custom_op = pytest.mark.skipif(not _ops.HAS_CUSTOM_OP or not hasattr(torch.library, "opcheck"),
                                     reason="torch < 2.4: no torch.library.custom_op / opcheck")


def ref(x, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, probs=None):
    """float64 composition as in GPT-OSS's swiglu, with the spec's clamp gradients (§8.4: passed on the closed
    interval, boundary included). torch.where spells that out: the torch 2.15 here gives torch.clamp a zero
    gradient at the boundary itself."""
    # The op's attributes are float32 (C API): use the same values.
    alpha, limit, bias = (torch.tensor(v, dtype=torch.float32).item() for v in (alpha, limit, bias))
    x = x.double()
    A, B = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, -1)
    lim = torch.tensor(limit, dtype=x.dtype, device=x.device)
    a = torch.where(A > lim, lim, A)
    b = torch.where(B > lim, lim, torch.where(B < -lim, -lim, B))
    y = a * torch.sigmoid(alpha * a) * (b + bias)
    return y if probs is None else y * probs.double().unsqueeze(-1)


VARIANTS = {"gptoss": (1.702, 7.0, 1.0), "deepseek": (1.0, 10.0, 0.0)}


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("variant", ["gptoss", "deepseek"])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("with_probs", [False, True])
def test_forward_backward(device, dtype, variant, interleaved, with_probs):
    alpha, limit, bias = VARIANTS[variant]
    x = (torch.randn(5, 7, 2 * 72) * 5).to(dtype).to(device).requires_grad_()
    probs = torch.rand(5, 7, dtype=torch.float32).to(device).requires_grad_() if with_probs else None
    y = api.clipped_swiglu(x, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved, probs=probs)
    assert y.shape == (5, 7, 72) and y.dtype == dtype
    assert_close_rel(y, ref(x.detach(), alpha, limit, bias, interleaved,
                            probs.detach() if with_probs else None), dtype, "y")
    dy = torch.randn(y.shape).to(dtype).to(device)
    leaves = (x, probs) if with_probs else (x,)
    grads = torch.autograd.grad(y, leaves, dy)
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    yr = ref(l64[0], alpha, limit, bias, interleaved, l64[1] if with_probs else None)
    rgrads = torch.autograd.grad(yr, l64, dy.double())
    assert_close_rel(grads[0], rgrads[0], dtype, "dx")
    if with_probs:
        assert grads[1].dtype == torch.float32
        # dprobs is float32 (probs' dtype): an f32 tolerance at least.
        assert_close_rel(grads[1], rgrads[1], torch.float32 if dtype == torch.float64 else dtype, "dprobs", factor=2.0)


def test_boundary_gradients():
    # A == limit: the gate gradient passes; B == +-limit: the linear gradient passes; beyond: exactly 0.
    x = torch.tensor([[7.0, 0.5, 7.5, 0.5, 1.0, 7.0, 1.0, -7.0, 1.0, 8.0, 1.0, -8.0]], dtype=torch.float64,
                     requires_grad=True)
    y = api.swiglu(x)
    (dx,) = torch.autograd.grad(y.sum(), x)
    x64 = x.detach().clone().requires_grad_()
    (dr,) = torch.autograd.grad(ref(x64).sum(), x64)
    torch.testing.assert_close(dx, dr, rtol=1e-12, atol=1e-12)
    assert dx[0, 2] == 0 and dx[0, 9] == 0 and dx[0, 11] == 0
    assert dx[0, 0] != 0 and dx[0, 5] != 0 and dx[0, 7] != 0


def test_wrappers_and_dim():
    x = torch.randn(4, 6, 10) * 4
    torch.testing.assert_close(api.swiglu(x), ref(x).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(api.swiglu_with_limit(x, 10.0), ref(x, 1.0, 10.0, 0.0, False).float(), rtol=1e-5,
                               atol=1e-5)
    # The pair dimension elsewhere than last.
    y = api.clipped_swiglu(x, dim=1)
    torch.testing.assert_close(y, ref(x.movedim(1, -1)).movedim(-1, 1).float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError):
        api.clipped_swiglu(x, group_index=torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="must be even"):
        api.clipped_swiglu(torch.randn(3, 5))
    with pytest.raises(ValueError, match="limit must be > 0"):
        api.clipped_swiglu(x, limit=0.0)


@pytest.mark.parametrize("interleaved", [True, False])
def test_gradcheck(interleaved):
    x = (torch.randn(3, 16, dtype=torch.float64) * 4)
    x = torch.where((x.abs() - 7).abs() < 1e-3, x + 0.01, x).requires_grad_()
    p = torch.rand(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, p: api.clipped_swiglu(x, interleaved=interleaved, probs=p), (x, p),
                                    eps=1e-6, atol=1e-6)


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(3, 5, 32, device=device, requires_grad=True) * 4
    p = torch.rand(3, 5, device=device, requires_grad=True)
    fwd = _ops.OPS["clipped_swiglu_fwd"].overload
    torch.library.opcheck(fwd, (x.detach().requires_grad_(), p, 1.702, 7.0, 1.0, True))
    torch.library.opcheck(fwd, (x.detach().requires_grad_(), None, 1.0, 10.0, 0.0, False))
    torch.library.opcheck(_ops.OPS["clipped_swiglu_bwd"].overload,
                          (x.detach(), p.detach(), torch.randn(3, 5, 16, device=device), 1.702, 7.0, 1.0, True, True))


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()

    def model(x, p):
        return (api.clipped_swiglu(x, probs=p) ** 2).sum() + api.swiglu_with_limit(x).sum()

    dt, tol = (torch.float64, 1e-10) if device == "cpu" else (torch.float32, 1e-5)  # CUDA has no f64 kernels
    x = (torch.randn(4, 24, dtype=dt, device=device) * 4).requires_grad_()
    p = torch.rand(4, dtype=dt, device=device, requires_grad=True)
    eager = model(x, p)
    de = torch.autograd.grad(eager, (x, p))
    out = torch.compile(model, fullgraph=True, backend="aot_eager")(x, p)
    dc = torch.autograd.grad(out, (x, p))
    torch.testing.assert_close(out, eager, rtol=tol, atol=tol)
    for a, b in zip(dc, de):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
