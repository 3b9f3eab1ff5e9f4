"""strata.api.causal_conv1d (fla names) and causal_conv1d_fn (Dao-AILab names) against a float64 reference
built from torch.nn.functional.conv1d (ops_fused.md §5): forward, autograd, gradcheck, opcheck, torch.compile."""

import pytest
import torch
import torch.nn.functional as F

import strata
from strata import api

from conftest import DEVICES, TOL, assert_close_rel, device_dtypes, rel_rms


def ref_conv(x, w, bias=None, residual=None, h0=None, silu=True, cu=None):
    """float64: per sequence, left-pad by the initial state (or zeros) and run F.conv1d (ops_fused.md §5.3).
    x [B, T, D], w [D, W], h0 [N, D, W-1]; returns (y [B, T, D], final_state [N, D, W-1])."""
    x64, w64 = x.detach().double().cpu(), w.detach().double().cpu()
    D, W = w64.shape
    seqs = [(b, 0, x.shape[1]) for b in range(x.shape[0])] if cu is None else \
        [(0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    y = torch.zeros_like(x64)
    finals = []
    for n, (b, s, e) in enumerate(seqs):
        pad = h0[n].detach().double().cpu() if h0 is not None else torch.zeros(D, W - 1, dtype=torch.float64)
        xs = torch.cat([pad, x64[b, s:e].T], dim=1)  # [D, W-1 + L]
        finals.append(xs[:, xs.shape[1] - (W - 1):])
        if e == s:
            continue
        u = F.conv1d(xs[None], w64[:, None, :], None if bias is None else bias.detach().double().cpu(),
                     groups=D)[0].T  # [L, D]
        y[b, s:e] = F.silu(u) if silu else u
    if residual is not None:
        y = y + residual.detach().double().cpu()
    return y, torch.stack(finals) if finals else torch.zeros(0, D, W - 1, dtype=torch.float64)


CASES = [  # (B, T, D, W)
    (2, 1, 8, 4), (2, 63, 36, 4), (2, 65, 67, 3), (1, 97, 20, 2), (2, 130, 16, 5),
]


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("B,T,D,W", CASES, ids=str)
def test_forward(device, dtype, B, T, D, W):
    x = torch.randn(B, T, D).to(dtype).to(device)
    w = (torch.rand(D, W) - 0.5).to(device)  # fp32 weights, as the public tests
    bias = (torch.rand(D) - 0.5).to(device)
    res = torch.randn(B, T, D).to(dtype).to(device)
    h0 = torch.randn(B, D, W - 1).to(device)
    y, hT = api.causal_conv1d(x, w, bias, residual=res, initial_state=h0, output_final_state=True,
                              activation="silu")
    ry, rh = ref_conv(x, w, bias, res, h0)
    assert y.dtype == dtype and hT.shape == (B, D, W - 1)
    assert_close_rel(y, ry, dtype, "y")
    assert_close_rel(hT, rh, torch.float32, "final_state")


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_and_layouts(device):
    cu = torch.tensor([0, 0, 1, 3, 3, 40, 41, 100], dtype=torch.int32, device=device)
    D, W = 24, 4
    x = torch.randn(1, 100, D, device=device)
    w = torch.randn(W, D, device=device) * 0.5  # MindSpeed's [W, D]
    h0 = torch.randn(7, D, W - 1, device=device)
    y, hT = api.causal_conv1d(x, w, initial_state=h0, output_final_state=True, activation="swish",
                              cu_seqlens=cu, weight_layout=1)
    ry, rh = ref_conv(x, w.T, h0=h0, cu=cu.tolist())
    assert_close_rel(y, ry, torch.float32, "y")
    assert_close_rel(hT, rh, torch.float32, "final_state")
    # fla's length-W state: slot 0 is dropped.
    h0w = torch.cat([torch.randn(7, D, 1, device=device), h0], dim=-1)
    y2, _ = api.causal_conv1d(x, w, initial_state=h0w, activation="silu", cu_seqlens=cu, weight_layout=1)
    assert torch.equal(y, y2)
    # A strided x (a slice of a wider projection) and a channel-first x (Dao) give the same values.
    wide = torch.randn(1, 100, 3 * D, device=device)
    xs = wide[..., D:2 * D]
    ys, _ = api.causal_conv1d(xs, w, activation="silu", cu_seqlens=cu, weight_layout=1)
    assert_close_rel(ys, ref_conv(xs, w.T, cu=cu.tolist())[0], torch.float32, "y (strided x)")


@pytest.mark.parametrize("device", DEVICES)
def test_dao_interface(device):
    B, D, T, W = 2, 12, 50, 4
    x = torch.randn(B, D, T, device=device)  # channel-first
    w = torch.randn(D, W, device=device)
    bias = torch.randn(D, device=device)
    h0 = torch.randn(B, D, W - 1, device=device)
    out, hT = api.causal_conv1d_fn(x, w, bias, initial_states=h0, return_final_states=True, activation="silu")
    ry, rh = ref_conv(x.transpose(1, 2), w, bias, h0=h0)
    assert out.shape == (B, D, T)
    assert_close_rel(out.transpose(1, 2), ry, torch.float32, "out")
    assert_close_rel(hT, rh, torch.float32, "final_states")


@pytest.mark.parametrize("device", DEVICES)
def test_seq_idx_masks_taps(device):
    """seq_idx = [0,0,0,1,1,1,1,...]: the second sequence starts from zeros, as its own conv."""
    D, W, T = 6, 4, 12
    x = torch.randn(1, T, D, device=device)
    w = torch.randn(D, W, device=device)
    seq = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32, device=device)
    y, _ = api.causal_conv1d(x, w, activation="silu", seq_idx=seq)
    r0, _ = ref_conv(x[:, :5], w)
    r1, _ = ref_conv(x[:, 5:], w)
    assert_close_rel(y, torch.cat([r0, r1], dim=1), torch.float32, "y")


@pytest.mark.parametrize("device,dtype", device_dtypes())
def test_backward_matches_float64_autograd(device, dtype):
    B, T, D, W = 2, 70, 20, 4
    x = torch.randn(B, T, D).to(dtype).to(device).requires_grad_()
    w = (torch.rand(D, W) - 0.5).to(device).requires_grad_()
    bias = (torch.rand(D) - 0.5).to(device).requires_grad_()
    h0 = torch.randn(B, D, W - 1).to(device).requires_grad_()
    res = torch.randn(B, T, D).to(dtype).to(device).requires_grad_()
    y, hT = api.causal_conv1d(x, w, bias, residual=res, initial_state=h0, output_final_state=True,
                              activation="silu")
    gy, gh = torch.randn_like(y), torch.randn_like(hT)
    (y * gy).sum().add_((hT * gh).sum()).backward()
    leaves = [t.detach().double().cpu().requires_grad_() for t in (x, w, bias, h0, res)]
    # float64 autograd through the F.conv1d reference:
    x64, w64, b64, h64, r64 = leaves
    D_ = w64.shape[0]
    ys, hs = [], []
    for b in range(B):
        xs = torch.cat([h64[b], x64[b].T], dim=1)
        u = F.conv1d(xs[None], w64[:, None, :], b64, groups=D_)[0].T
        ys.append(F.silu(u))
        hs.append(xs[:, -(W - 1):])
    ry = torch.stack(ys) + r64
    rh = torch.stack(hs)
    (ry * gy.double().cpu()).sum().add((rh * gh.double().cpu()).sum()).backward()
    tol = 2.0 if dtype != torch.float32 else 4.0
    for name, got, ref in zip(("dx", "dweight", "dbias", "dinitial_state", "dresidual"), (x, w, bias, h0, res),
                              leaves):
        assert_close_rel(got.grad, ref.grad, dtype if got.dtype == dtype else torch.float32, name, factor=tol)


@pytest.mark.parametrize("varlen", [False, True])
def test_gradcheck(call_path, varlen):
    D, W = 3, 4
    cu = torch.tensor([0, 2, 2, 9], dtype=torch.int64) if varlen else None
    N = 3 if varlen else 2
    x = torch.randn((1, 9, D) if varlen else (2, 7, D), dtype=torch.float64, requires_grad=True)
    w = torch.randn(D, W, dtype=torch.float64, requires_grad=True)
    b = torch.randn(D, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(N, D, W - 1, dtype=torch.float64, requires_grad=True)
    r = torch.randn(x.shape, dtype=torch.float64, requires_grad=True)

    def fn(x, w, b, h0, r):
        y, hT = api.causal_conv1d(x, w, b, residual=r, initial_state=h0, output_final_state=True,
                                  activation="silu", cu_seqlens=cu)
        return y, hT

    assert torch.autograd.gradcheck(fn, (x, w, b, h0, r), eps=1e-6, atol=1e-7)


@pytest.mark.skipif(not strata._ops.HAS_CUSTOM_OP, reason="torch < 2.4")
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(2, 9, 5, device=device)
    w = torch.randn(5, 3, device=device)
    b = torch.randn(5, device=device)
    h0 = torch.randn(2, 5, 2, device=device)
    fwd = strata._ops.OPS["causal_conv1d_fwd"].overload
    torch.library.opcheck(fwd, (x.requires_grad_(), w.requires_grad_(), b, None, h0, None, None, True, 1, 0))
    bwd = strata._ops.OPS["causal_conv1d_bwd"].overload
    dy = torch.randn(2, 9, 5, device=device)
    torch.library.opcheck(bwd, (x.detach(), w.detach(), b, h0, None, None, dy, None, 1, 0))
    # a cu_seqlens pack (the C library checks its values on both devices)
    cu = torch.tensor([0, 4, 9], device=device)
    torch.library.opcheck(fwd, (x[:1].detach().requires_grad_(), w, b, None, h0, cu, None, True, 1, 0))


@pytest.mark.skipif(not strata._ops.HAS_CUSTOM_OP, reason="torch < 2.4")
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile(device):
    x = torch.randn(2, 33, 8, device=device, requires_grad=True)
    w = torch.randn(8, 4, device=device, requires_grad=True)

    def f(x, w):
        y, _ = api.causal_conv1d(x, w, activation="silu")
        return (y * y).sum()

    # inductor on the CPU; aot_eager on CUDA (the graph capture and the op's fake / autograd registration are what
    # is tested, not Triton's code for y * y)
    compiled = torch.compile(f, fullgraph=True, backend="inductor" if device == "cpu" else "aot_eager")
    loss = compiled(x, w)
    gx, gw = torch.autograd.grad(loss, (x, w))
    loss2 = f(x, w)
    gx2, gw2 = torch.autograd.grad(loss2, (x, w))
    assert torch.allclose(loss, loss2) and torch.equal(gx, gx2) and torch.equal(gw, gw2)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    x = torch.empty(2, 0, 5, device=device, requires_grad=True)
    w = torch.randn(5, 4, device=device, requires_grad=True)
    h0 = torch.randn(2, 5, 3, device=device, requires_grad=True)
    y, hT = api.causal_conv1d(x, w, initial_state=h0, output_final_state=True, activation="silu")
    assert y.shape == x.shape and torch.equal(hT, h0.detach())  # no tokens: the state passes through
    hT.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(h0.grad, torch.ones_like(h0))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    x = torch.randn(1, 10, 4, device=device)
    w = torch.randn(4, 4, device=device)
    for values, needle in [([1, 4, 10], "cu_seqlens[0] must be 0"), ([0, 6, 4, 10], "non-decreasing"),
                           ([0, 4, 9], "must equal T = 10")]:
        with pytest.raises(ValueError) as e:
            api.causal_conv1d(x, w, cu_seqlens=torch.tensor(values, device=device))
        assert needle in str(e.value)
    with pytest.raises(ValueError):
        api.causal_conv1d(x, w, activation="gelu")
    with pytest.raises(strata.StrataValueError) as e:
        api.causal_conv1d(x, torch.randn(4, 17, device=device))
    assert "W must be in [2, 16]" in str(e.value)
