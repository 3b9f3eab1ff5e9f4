"""strata.api.chunk_local_cumsum against a float64 loop reference (ops_gdn_kda.md §4.2)."""

import pytest
import torch

import strata
from strata import api

from conftest import DEVICES, TOL, assert_close_rel, device_dtypes, rel_rms


def ref_cumsum(g, chunk_size, reverse=False, scale=None, cu_seqlens=None):
    """float64 loops: chunks restart at every sequence start (fixed length: every batch row)."""
    g64 = g.detach().double().cpu()
    out = torch.zeros_like(g64)
    if cu_seqlens is None:
        segments = [(b, 0, g.shape[1]) for b in range(g.shape[0])]
    else:
        cu = cu_seqlens.cpu().tolist()
        segments = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    for b, bos, eos in segments:
        for s in range(bos, eos, chunk_size):
            e = min(s + chunk_size, eos)
            seg = g64[b, s:e]
            c = seg.flip(0).cumsum(0).flip(0) if reverse else seg.cumsum(0)
            out[b, s:e] = c
    return out * (1.0 if scale is None else scale)


def make_g(shape, dtype, device):
    # log-gates as in GDN: negative, O(1)
    return (-torch.rand(shape, dtype=torch.float32) * 2).to(dtype).to(device)


CASES = [  # (shape, chunk_size)
    ((2, 100, 3), 64),       # scalar gates, partial last chunk
    ((1, 64, 2), 16),
    ((2, 37, 2, 24), 16),    # vector gates
    ((1, 130, 1, 64), 32),
    ((3, 5, 4), 1),
    ((1, 300, 2), 1024),
]


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("shape,chunk_size", CASES, ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_forward(device, dtype, shape, chunk_size, reverse):
    g = make_g(shape, dtype, device)
    out = api.chunk_local_cumsum(g, chunk_size, reverse=reverse)
    assert out.shape == g.shape and out.dtype == torch.float32  # fp32 by default
    ref = ref_cumsum(g, chunk_size, reverse)
    assert_close_rel(out, ref, torch.float32, "out")  # output is float32 by default


@pytest.mark.parametrize("device,dtype", device_dtypes())
def test_scale_and_output_dtype(device, dtype):
    g = make_g((2, 70, 3, 8), dtype, device)
    scale = 1.0 / 0.6931471805599453  # log2 units, as current fla
    out = api.chunk_local_cumsum(g, 16, scale=scale, output_dtype=dtype)
    assert out.dtype == dtype
    scale32 = torch.tensor(scale, dtype=torch.float32).item()  # the C API takes scale as a float
    assert_close_rel(out, ref_cumsum(g, 16, scale=scale32), dtype, "out")
    assert api.chunk_local_cumsum(g, 16, output_dtype=None).dtype == dtype  # fla: output_dtype or g.dtype


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("reverse", [False, True])
def test_varlen(device, dtype, reverse):
    cu = torch.tensor([0, 5, 5, 69, 100, 163], dtype=torch.int64, device=device)  # includes an empty sequence
    for shape in [(1, 163, 2), (1, 163, 2, 16)]:
        g = make_g(shape, dtype, device)
        out = api.chunk_local_cumsum(g, 32, reverse=reverse, cu_seqlens=cu)
        assert_close_rel(out, ref_cumsum(g, 32, reverse, cu_seqlens=cu),
                         torch.float32, "out")
    # int32 cu_seqlens are converted
    out32 = api.chunk_local_cumsum(g, 32, reverse=reverse, cu_seqlens=cu.to(torch.int32))
    torch.testing.assert_close(out32, out, rtol=0, atol=0)


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("varlen", [False, True])
def test_backward(device, dtype, varlen):
    cu = torch.tensor([0, 20, 90, 97], dtype=torch.int64, device=device) if varlen else None
    shape = (1, 97, 3, 4) if varlen else (2, 97, 3)
    g = make_g(shape, dtype, device).requires_grad_()
    out = api.chunk_local_cumsum(g, 16, scale=0.5, cu_seqlens=cu)
    dout = torch.randn(out.shape, device=device)
    (dg,) = torch.autograd.grad(out, g, dout)
    assert dg.dtype == dtype and dg.shape == g.shape
    # adjoint: scale * reverse cumsum of dout
    dg_ref = ref_cumsum(dout, 16, reverse=True, scale=0.5, cu_seqlens=cu)
    assert_close_rel(dg, dg_ref, dtype, "dg")


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous(device):
    base = make_g((3, 80, 4, 8), torch.float32, device)
    views = {"head slice": base[:, :, 1:3], "permuted": base.permute(2, 1, 0, 3), "offset": base[:, 5:],
             "strided last dim": base[..., ::2], "scalar from vector": base[..., 0]}
    for name, g in views.items():
        out = api.chunk_local_cumsum(g, 16, reverse=True)
        assert rel_rms(out, ref_cumsum(g, 16, True)) <= TOL[torch.float32], name


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    g = torch.empty(2, 0, 3, device=device, requires_grad=True)
    out = api.chunk_local_cumsum(g, 16)
    assert out.shape == g.shape
    out.sum().backward()
    assert g.grad.shape == g.shape


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_gradcheck(call_path, reverse, varlen):
    cu = torch.tensor([0, 3, 11, 12], dtype=torch.int64) if varlen else None
    g = torch.randn((1, 12, 2) if varlen else (2, 11, 2, 3), dtype=torch.float64, requires_grad=True)
    fn = lambda t: api.chunk_local_cumsum(t, 4, reverse=reverse, scale=0.7, cu_seqlens=cu,  # noqa: E731
                                          output_dtype=torch.float64)
    assert torch.autograd.gradcheck(fn, (g,), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradgradcheck(fn, (g,), eps=1e-6, atol=1e-7)  # linear: backward is the op again


def test_errors_carry_c_message():
    g = torch.zeros(1, 8, 2)
    with pytest.raises(strata.StrataValueError) as e:
        api.chunk_local_cumsum(g, 12)  # not a power of two
    assert e.value.status == 105 and e.value.c_message in str(e.value) and "chunk_size" in e.value.c_message
    with pytest.raises(ValueError) as e:
        api.chunk_local_cumsum(torch.zeros(2, 8, 2), 4, cu_seqlens=torch.tensor([0, 8]))  # B must be 1
    assert isinstance(e.value, strata.StrataError) and "cu_seqlens" in str(e.value)
    with pytest.raises(strata.StrataError):
        api.chunk_local_cumsum(torch.zeros(8, 2), 4)  # rank 2


@pytest.mark.parametrize("device", DEVICES)
def test_cu_seqlens_values_checked_before_launch(device):
    """Bad cu_seqlens values raise a clear ValueError on every device and leave nothing computed (the
    CUDA kernel cannot check them itself without a host copy)."""
    g = torch.randn(1, 10, 3, device=device)
    cases = [([1, 4, 10], "cu_seqlens[0] must be 0"),
             ([0, 6, 4, 10], "non-decreasing, got cu_seqlens[2] = 4 after cu_seqlens[1] = 6"),
             ([0, 4, 9], "cu_seqlens[-1] must equal T = 10")]
    for values, needle in cases:
        cu = torch.tensor(values, dtype=torch.int64, device=device)
        with pytest.raises(ValueError) as e:
            api.chunk_local_cumsum(g, 4, cu_seqlens=cu)
        assert needle in str(e.value)
        with pytest.raises(ValueError):  # the host copy fla users pass is checked the same way
            api.chunk_local_cumsum(g, 4, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    ok = torch.tensor([0, 4, 4, 10], dtype=torch.int64, device=device)
    out = api.chunk_local_cumsum(g, 4, cu_seqlens=ok, cu_seqlens_cpu=ok.cpu())
    assert torch.equal(out, api.chunk_local_cumsum(g, 4, cu_seqlens=ok))
