"""strata.api.rms_norm_gated against float64 torch compositions (ops_fused.md §4): both orders, both gates, groups,
weight / bias / residual / prenorm options, gradients (gradcheck in float64), opcheck and torch.compile."""

import pytest
import torch

from strata import _ops, api

from conftest import DEVICES, TOL, assert_close_rel, device_dtypes, requires_cuda

needs_custom_op = pytest.mark.skipif(not _ops.HAS_CUSTOM_OP or not hasattr(torch.library, "opcheck"),
                                     reason="torch < 2.4: no torch.library.custom_op / opcheck")


def ref(x, g, weight, bias, activation="swish", residual=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """float64 torch composition."""
    x, g = x.double(), g.double()
    if residual is not None:
        x = x + residual.double()
    act = torch.sigmoid(g) if activation == "sigmoid" else g * torch.sigmoid(g)
    D = x.shape[-1]
    G = group_size or D
    u = x if norm_before_gate else x * act
    ug = u.reshape(*u.shape[:-1], D // G, G)
    nrm = (ug * torch.rsqrt((ug * ug).mean(-1, keepdim=True) + eps)).reshape(u.shape)
    o = nrm * (weight.double() if weight is not None else 1.0) + (bias.double() if bias is not None else 0.0)
    return o * act if norm_before_gate else o


def rnd(shape, dtype, device, scale=1.0, mean=0.0):
    return (torch.randn(shape, dtype=torch.float32) * scale + mean).to(dtype).to(device)


CASES = [  # (shape, group_size, norm_before_gate, activation)
    ((2, 7, 4, 128), None, True, "swish"),
    ((33, 96), 32, True, "sigmoid"),
    ((5, 1200), None, False, "silu"),
    ((9, 64), 16, False, "sigmoid"),
    ((4, 63), 21, True, "silu"),
    ((3, 2, 50), None, True, "swish"),
]


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_backward(device, dtype, case):
    shape, group, nbg, act = case
    D = shape[-1]
    x = rnd(shape, dtype, device, mean=0.2).requires_grad_()
    g = rnd(shape, dtype, device, 2.0).requires_grad_()
    w = rnd((D,), torch.float32 if dtype != torch.float64 else dtype, device, 0.2, 1.0).requires_grad_()
    b = rnd((D,), w.dtype, device, 0.2).requires_grad_()
    y = api.rms_norm_gated(x, g, w, b, act, eps=1e-5, group_size=group, norm_before_gate=nbg)
    assert y.shape == x.shape and y.dtype == dtype
    yr = ref(x.detach(), g.detach(), w.detach(), b.detach(), act, eps=1e-5, group_size=group, norm_before_gate=nbg)
    assert_close_rel(y, yr, dtype, "y")
    dy = rnd(shape, dtype, device)
    grads = torch.autograd.grad(y, (x, g, w, b), dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, g, w, b)]
    yr = ref(*leaves[:2], leaves[2], leaves[3], act, eps=1e-5, group_size=group, norm_before_gate=nbg)
    rgrads = torch.autograd.grad(yr, leaves, dy.double())
    for name, a, r in zip(("dx", "dg", "dweight", "dbias"), grads, rgrads):
        assert a.dtype == (dtype if name in ("dx", "dg") else w.dtype)
        # dweight/dbias sum over all rows (f32 accumulation of values rounded to dtype): a looser factor.
        assert_close_rel(a, r, dtype, name, factor=2.0 if name in ("dweight", "dbias") else 1.0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])])
@pytest.mark.parametrize("residual_in_fp32", [False, True])
def test_residual_prenorm(device, residual_in_fp32):
    dtype = torch.bfloat16
    x = rnd((6, 128), dtype, device).requires_grad_()
    g = rnd((6, 128), dtype, device).requires_grad_()
    r = rnd((6, 128), dtype, device).requires_grad_()
    w = rnd((128,), torch.float32, device, 0.1, 1.0)
    y, ro = api.rms_norm_gated(x, g, w, None, "swish", residual=r, prenorm=True, residual_in_fp32=residual_in_fp32)
    assert ro.dtype == (torch.float32 if residual_in_fp32 else dtype)
    assert_close_rel(ro, x.detach().double() + r.detach().double(), dtype, "residual_out")
    assert_close_rel(y, ref(x.detach(), g.detach(), w, None, residual=r.detach()), dtype, "y")
    (y.float().square().sum() + ro.float().sum()).backward()
    leaves = [t.detach().double().requires_grad_() for t in (x, g, r)]
    yr = ref(leaves[0], leaves[1], w, None, residual=leaves[2])
    (yr.square().sum() + (leaves[0] + leaves[2]).sum()).backward()
    for name, a, l in zip(("dx", "dg", "dresidual"), (x.grad, g.grad, r.grad), leaves):
        assert_close_rel(a, l.grad, dtype, name, factor=2.0)


@pytest.mark.parametrize("nbg", [True, False])
@pytest.mark.parametrize("act", ["swish", "sigmoid"])
def test_gradcheck(nbg, act):
    x = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    w = torch.randn(12, dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)

    def f(x, g, w, b, r):
        y, ro = api.rms_norm_gated(x, g, w, b, act, residual=r, eps=1e-5, prenorm=True, group_size=4,
                                   norm_before_gate=nbg)
        return y, ro

    assert torch.autograd.gradcheck(f, (x, g, w, b, r), eps=1e-6, atol=1e-6)


def test_modules():
    m = api.RMSNormGated(64, eps=1e-5, group_size=16, norm_before_gate=False)
    x, z = torch.randn(5, 64), torch.randn(5, 64)
    assert_close_rel(m(x, z), ref(x, z, m.weight.detach(), None, "silu", eps=1e-5, group_size=16,
                                  norm_before_gate=False), torch.float32, "RMSNormGated")
    f = api.FusedRMSNormGated(64, eps=1e-5, activation="sigmoid")
    assert_close_rel(f(x, z), ref(x, z, f.weight.detach(), None, "sigmoid", eps=1e-5), torch.float32,
                     "FusedRMSNormGated")


def test_bad_input():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="group_size must divide D"):
        api.rms_norm_gated(x, x, None, None, group_size=5)
    with pytest.raises(ValueError, match="activation must be"):
        api.rms_norm_gated(x, x, None, None, activation="gelu")
    with pytest.raises(ValueError, match="eps must be finite"):
        api.rms_norm_gated(x, x, None, None, eps=float("nan"))
    with pytest.raises(ValueError, match="g must have the shape of x"):
        api.rms_norm_gated(x, x[:, :8], None, None)


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(3, 5, 16, dtype=torch.float32, device=device, requires_grad=True)
    g = torch.randn(3, 5, 16, dtype=torch.float32, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    b = torch.randn(16, device=device, requires_grad=True)
    r = torch.randn(3, 5, 16, device=device, requires_grad=True)
    fwd = _ops.OPS["rms_norm_gated_fwd"].overload
    torch.library.opcheck(fwd, (x, g, w, b, r, 1e-6, 8, True, 0, True, torch.float32))
    torch.library.opcheck(fwd, (x, g, None, None, None, 1e-5, 0, False, 1, False, None))
    y, rstd, _ = _ops.OPS["rms_norm_gated_fwd"](x.detach(), g.detach(), w.detach(), b.detach(), None, 1e-6, 8, True, 0,
                                              False, None)
    torch.library.opcheck(_ops.OPS["rms_norm_gated_bwd"].overload,
                          (x.detach(), g.detach(), w.detach(), b.detach(), None, rstd, torch.randn_like(y), None, 8,
                           True, 0, True, True))


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()

    def model(x, g, w):
        return api.rms_norm_gated(x, g, w, None, "swish", eps=1e-6, group_size=8).square().sum()

    dt, tol = (torch.float64, 1e-10) if device == "cpu" else (torch.float32, 1e-5)  # CUDA has no f64 kernels
    x = torch.randn(4, 32, dtype=dt, device=device, requires_grad=True)
    g = torch.randn(4, 32, dtype=dt, device=device, requires_grad=True)
    w = torch.randn(32, dtype=dt, device=device, requires_grad=True)
    eager = model(x, g, w)
    de = torch.autograd.grad(eager, (x, g, w))
    out = torch.compile(model, fullgraph=True, backend="aot_eager")(x, g, w)
    dc = torch.autograd.grad(out, (x, g, w))
    torch.testing.assert_close(out, eager, rtol=tol, atol=tol)
    for a, b in zip(dc, de):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
