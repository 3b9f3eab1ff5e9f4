"""The GDN backward chunk operators through strata.api (fla's names and arguments), checked against torch
autograd of float64 forward maps written here:
  * chunk_bwd_dv_local     = d/dVn of  Σ do · scale Lower(Q Kᵀ ⊙ Γ) Vn;
  * chunk_bwd_dqkwg        = d/d(q, k, w, γ) of the chunked output/state terms (Appendix A) at given h, dh;
  * prepare_wy_repr_bwd    = d/d(k, v, β, γ) of Σ dw·W + Σ du·U with W, U from A = (I + M)^-1;
  * the four composed      = d/d(q, k, v, g, β, h0) of the token recurrence (§2.1) — the full GDN backward;
plus float32 / bfloat16 agreement with float64, optional outputs (None), opcheck of the custom ops, and clear
errors for unsupported options.
"""

import math

import pytest
import torch

import strata
from conftest import DEVICES
from strata import api

torch.manual_seed(0)


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def _chunks(T, BT, cu):
    """(b, t0, t1) of every chunk, sequence by sequence."""
    out = []
    if cu is None:
        return None
    for n in range(len(cu) - 1):
        for t0 in range(cu[n], cu[n + 1], BT):
            out.append((0, t0, min(t0 + BT, cu[n + 1])))
    return out


def _all_chunks(B, T, BT, cu):
    if cu is None:
        return [(b, t0, min(t0 + BT, T)) for b in range(B) for t0 in range(0, T, BT)]
    return _chunks(T, BT, cu)


def _local_cumsum(g, BT, cu, reverse=False):
    B, T, HV = g.shape
    out = torch.zeros_like(g)
    for b, t0, t1 in _all_chunks(B, T, BT, cu):
        x = g[b, t0:t1]
        out[b, t0:t1] = x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)
    return out


def _recurrence(q, k, v, g, beta, h0, scale, cu):
    """§2.1 in float64 (autograd-friendly): returns (o, ht)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    o = [[None] * T for _ in range(B)]
    hts = []
    for n, (b, bos, eos) in enumerate(seqs):
        Ss = []
        for hv in range(HV):
            h = hv // G
            S = h0[n, hv] if h0 is not None else q.new_zeros(K, V)
            rows = []
            for t in range(bos, eos):
                S = S * torch.exp(g[b, t, hv])
                pred = k[b, t, h] @ S
                S = S + torch.outer(k[b, t, h], beta[b, t, hv] * (v[b, t, hv] - pred))
                rows.append(scale * (q[b, t, h] @ S))
            Ss.append(S)
            for i, t in enumerate(range(bos, eos)):
                if o[b][t] is None:
                    o[b][t] = [None] * HV
                o[b][t][hv] = rows[i]
        hts.append(torch.stack(Ss))
    o_t = torch.stack([torch.stack([torch.stack(o[b][t]) for t in range(T)]) if T else q.new_zeros(0, HV, V)
                       for b in range(B)])
    return o_t, torch.stack(hts)


def _forward_chunk(q, k, v, gam, beta, h0, BT, cu):
    """Appendix A chunked forward (float64, no grad): A, w, u, h (start states), v_new."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    A = q.new_zeros(B, T, HV, BT)
    w = q.new_zeros(B, T, HV, K)
    vn = q.new_zeros(B, T, HV, V)
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    hs = {}
    for n, (b, bos, eos) in enumerate(seqs):
        for hv in range(HV):
            h = hv // G
            S = h0[n, hv].clone() if h0 is not None else q.new_zeros(K, V)
            for c, t0 in enumerate(range(bos, eos, BT)):
                t1 = min(t0 + BT, eos)
                L = t1 - t0
                kk, vv, bb, gg = k[b, t0:t1, h], v[b, t0:t1, hv], beta[b, t0:t1, hv], gam[b, t0:t1, hv]
                Gm = torch.exp(gg[:, None] - gg[None, :]).tril(-1)
                M = (bb[:, None] * (kk @ kk.T)) * Gm
                Ai = torch.linalg.inv(torch.eye(L, dtype=q.dtype) + M)
                A[b, t0:t1, hv, :L] = Ai
                ww = Ai @ (bb[:, None] * torch.exp(gg)[:, None] * kk)
                uu = Ai @ (bb[:, None] * vv)
                w[b, t0:t1, hv] = ww
                hs[(n, c, hv)] = S.clone()
                vnew = uu - ww @ S
                vn[b, t0:t1, hv] = vnew
                S = torch.exp(gg[-1]) * S + (kk * torch.exp(gg[-1] - gg)[:, None]).T @ vnew
    nt = [(eos - bos + BT - 1) // BT for (_, bos, eos) in seqs]
    if cu is None:
        hten = q.new_zeros(B, max(nt) if nt else 0, HV, K, V)
        for (n, c, hv), S in hs.items():
            hten[n, c, hv] = S
    else:
        off = [0]
        for x in nt:
            off.append(off[-1] + x)
        hten = q.new_zeros(1, off[-1], HV, K, V)
        for (n, c, hv), S in hs.items():
            hten[0, off[n] + c, hv] = S
    return A, w, hten, vn


def _problem(B=2, T=37, H=1, HV=2, K=8, V=5, BT=16, cu=None, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    if cu is not None:
        B, T = 1, cu[-1]
    q = _unit(torch.randn(B, T, H, K, generator=gen, dtype=dtype))
    k = _unit(torch.randn(B, T, H, K, generator=gen, dtype=dtype))
    v = torch.randn(B, T, HV, V, generator=gen, dtype=dtype)
    g = torch.nn.functional.logsigmoid(torch.rand(B, T, HV, generator=gen, dtype=dtype)) * 0.5
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen, dtype=dtype))
    N = B if cu is None else len(cu) - 1
    h0 = torch.randn(N, HV, K, V, generator=gen, dtype=dtype)
    do = torch.randn(B, T, HV, V, generator=gen, dtype=dtype)
    dht = torch.randn(N, HV, K, V, generator=gen, dtype=dtype)
    return q, k, v, g, beta, h0, do, dht


def _composed_backward(q, k, v, g, beta, h0, do, dht, scale, BT, cu, dtype=torch.float64, device="cpu"):
    """§3.2 with Strata's four ops (inputs cast to dtype and moved to device; γ and states stay float32/float64);
    the gradients come back as float64 CPU tensors."""
    gam = _local_cumsum(g, BT, cu)
    A, w, h, vn = _forward_chunk(q, k, v, gam, beta, h0, BT, cu)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int64, device=device)
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    c = lambda x: x.to(device=device, dtype=dtype)  # noqa: E731
    gam_s = gam.to(device=device, dtype=sd)
    h0_s = h0.to(device=device, dtype=sd if device != "cpu" else h0.dtype)
    dvl = api.chunk_bwd_dv_local(c(q), c(k), c(do), g=gam_s, scale=scale, cu_seqlens=cu_t, chunk_size=BT)
    dh, dh0, dv2 = api.chunk_gated_delta_rule_bwd_dhu(c(q), c(k), c(w), c(do), dvl, g=gam_s, h0=h0_s,
                                                      dht=dht.to(device=device, dtype=sd), scale=scale,
                                                      cu_seqlens=cu_t, chunk_size=BT)
    dq, dk, dw, dg = api.chunk_bwd_dqkwg(c(q), c(k), c(vn), c(do), c(h), dh, w=c(w), g=gam_s, dv=dv2, scale=scale,
                                         cu_seqlens=cu_t, chunk_size=BT)
    dk2, dv, db, dg2 = api.prepare_wy_repr_bwd(c(k), c(v), c(beta), c(A), dw, dv2, g=gam_s, cu_seqlens=cu_t)
    dgr = _local_cumsum((dg + dg2).double().cpu(), BT, cu, reverse=True)
    return tuple(x.double().cpu() for x in (dq, dk + dk2, dv)) + (dgr, db.double().cpu(), dh0.double().cpu())


def _autograd_reference(q, k, v, g, beta, h0, do, dht, scale, cu):
    xs = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    o, ht = _recurrence(*xs, scale, cu)
    loss = (o * do).sum() + (ht * dht).sum()
    return torch.autograd.grad(loss, xs)


def _rel(a, b):
    return float((a - b).norm() / (b.norm() + 1e-300))


@pytest.mark.parametrize("shape,cu,BT", [
    ((2, 37, 1, 2, 8, 5), None, 16),               # GVA G = 2, tail chunk
    ((1, 0, 1, 3, 6, 4), [0, 5, 5, 30, 31], 16),   # G = 3, zero-length and single-token sequences
    ((1, 70, 2, 2, 8, 8), None, 32),
])
def test_composed_float64_matches_autograd_of_the_recurrence(shape, cu, BT):
    B, T, H, HV, K, V = shape
    q, k, v, g, beta, h0, do, dht = _problem(B, T, H, HV, K, V, BT, cu)
    scale = float(torch.tensor(K ** -0.5, dtype=torch.float32))  # the C ops take scale as a float
    ours = _composed_backward(q, k, v, g, beta, h0, do, dht, scale, BT, cu)
    ref = _autograd_reference(q, k, v, g, beta, h0, do, dht, scale, cu)
    for name, a, b in zip(["dq", "dk", "dv", "dg", "dbeta", "dh0"], ours, ref):
        assert _rel(a, b) < 1e-9, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_composed_low_precision_close_to_float64(dtype, tol, device):
    q, k, v, g, beta, h0, do, dht = _problem(1, 0, 2, 4, 32, 16, 64, [0, 50, 50, 180], seed=3)
    scale = 32 ** -0.5
    ref = _composed_backward(q, k, v, g, beta, h0, do, dht, scale, 64, [0, 50, 50, 180])
    ours = _composed_backward(q, k, v, g, beta, h0, do, dht, scale, 64, [0, 50, 50, 180], dtype, device)
    for name, a, b in zip(["dq", "dk", "dv", "dg", "dbeta", "dh0"], ours, ref):
        assert _rel(a, b) < tol * (20 if name in ("dg", "dbeta") else 1), name


def test_dv_local_is_the_gradient_of_the_intra_chunk_output():
    q, k, v, g, beta, h0, do, dht = _problem(2, 45, 2, 4, 8, 6, 16)
    gam = _local_cumsum(g, 16, None)
    vn = torch.randn_like(v).requires_grad_(True)
    scale = 0.375  # exact in float32 (the C op takes scale as a float)
    o = torch.zeros_like(v)
    G = 2
    for b, t0, t1 in _all_chunks(2, 45, 16, None):
        for hv in range(4):
            qq, kk, gg = q[b, t0:t1, hv // G], k[b, t0:t1, hv // G], gam[b, t0:t1, hv]
            Aqk = torch.tril((qq @ kk.T) * torch.exp((gg[:, None] - gg[None, :]).tril()))
            o[b, t0:t1, hv] = scale * Aqk @ vn[b, t0:t1, hv]
    (ref,) = torch.autograd.grad((o * do).sum(), vn)
    dv = api.chunk_bwd_dv_local(q, k, do, g=gam, scale=scale, chunk_size=16)
    assert _rel(dv, ref) < 1e-12


def test_wy_bwd_is_the_gradient_of_w_and_u():
    k, v, beta, g = _problem(1, 40, 1, 2, 6, 5, 16)[1:5]
    gam = _local_cumsum(g, 16, None)
    xs = [x.clone().requires_grad_(True) for x in (k, v, beta, gam)]
    kk_, vv_, bb_, gg_ = xs
    dw = torch.randn(1, 40, 2, 6, dtype=torch.float64)
    du = torch.randn(1, 40, 2, 5, dtype=torch.float64)
    loss = 0
    A_full = torch.zeros(1, 40, 2, 16, dtype=torch.float64)
    for _, t0, t1 in _all_chunks(1, 40, 16, None):
        for hv in range(2):
            kc, vc, bc, gc = kk_[0, t0:t1, hv // 2], vv_[0, t0:t1, hv], bb_[0, t0:t1, hv], gg_[0, t0:t1, hv]
            L = t1 - t0
            M = (bc[:, None] * (kc @ kc.T)) * torch.exp((gc[:, None] - gc[None, :]).tril(-1)).tril(-1)
            Ai = torch.linalg.inv(torch.eye(L, dtype=torch.float64) + M)
            A_full[0, t0:t1, hv, :L] = Ai.detach()
            W = Ai @ (bc[:, None] * torch.exp(gc)[:, None] * kc)
            U = Ai @ (bc[:, None] * vc)
            loss = loss + (W * dw[0, t0:t1, hv]).sum() + (U * du[0, t0:t1, hv]).sum()
    ref = torch.autograd.grad(loss, xs)
    ours = api.prepare_wy_repr_bwd(k, v, beta, A_full, dw, du, g=gam)
    for name, a, b in zip(["dk", "dv", "dbeta", "dg"], ours, ref):
        assert _rel(a, b) < 1e-10, name


@pytest.mark.parametrize("device", DEVICES)
def test_optional_outputs_are_none(device):
    q, k, v, g, beta, h0, do, dht = (x.to(device) for x in _problem(1, 20, 1, 1, 4, 4, 16, dtype=torch.float32))
    h = torch.randn(1, 2, 1, 4, 4, device=device)
    dq, dk, dw, dg = api.chunk_bwd_dqkwg(q, k, v, do, h, h, scale=0.5, chunk_size=16)
    assert dw is None and dg is None and dq.shape == q.shape and dq.device == q.device
    dh, dh0, dv2 = api.chunk_gated_delta_rule_bwd_dhu(q, k, torch.randn(1, 20, 1, 4, device=device), do, do,
                                                      chunk_size=16)
    assert dh0 is None and dh.shape == (1, 2, 1, 4, 4) and dh.device == q.device
    A = torch.zeros(1, 20, 1, 16)
    for t in range(20):
        A[0, t, 0, t % 16] = 1.0  # identity blocks: chunks [0, 16) and [16, 20)
    dk, dv, db, dg = api.prepare_wy_repr_bwd(k, v, beta, A.to(device), torch.randn(1, 20, 1, 4, device=device), v)
    assert dg is None and db.shape == beta.shape and db.device == q.device
    # identity A, no gate: dv = beta * du and dk = beta * dw (here du = v): the values, not only the shapes
    assert torch.allclose(dv.cpu(), (beta[..., None] * v).cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_unsupported_options_raise(device):
    q, k, v, g, beta, h0, do, dht = (x.to(device) for x in _problem(1, 20, 1, 1, 4, 4, 16, dtype=torch.float32))
    with pytest.raises(NotImplementedError, match="g_gamma"):
        api.chunk_bwd_dv_local(q, k, do, g_gamma=torch.ones(1))
    with pytest.raises(NotImplementedError, match="state_v_first"):
        api.chunk_gated_delta_rule_bwd_dhu(q, k, q, do, do, state_v_first=True)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_names_the_argument(device):
    q, k, v, g, beta, h0, do, dht = (x.to(device) for x in _problem(1, 20, 2, 3, 4, 4, 16, dtype=torch.float32))
    with pytest.raises(Exception, match="multiple"):
        api.chunk_bwd_dv_local(q, k, do, chunk_size=16)
    q, k, v, g, beta, h0, do, dht = (x.to(device) for x in _problem(1, 20, 1, 2, 4, 4, 16, dtype=torch.float32))
    with pytest.raises(Exception, match="chunk_size"):
        api.chunk_bwd_dv_local(q, k, do, chunk_size=48)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from strata._ops import OPS
    q, k, v, g, beta, h0, do, dht = (x.to(device) for x in _problem(1, 20, 1, 2, 4, 4, 16, dtype=torch.float32))
    gam = _local_cumsum(g, 16, None)
    torch.library.opcheck(OPS["chunk_bwd_dv_local"].overload, (q, k, do, gam, None, 0.5, 16),
                          test_utils=("test_schema", "test_faketensor"))
    h = torch.randn(1, 2, 2, 4, 4, device=device)
    torch.library.opcheck(OPS["chunk_bwd_dqkwg"].overload, (q, k, v, do, h, h, v, gam, None, True, 0.5, 16),
                          test_utils=("test_schema", "test_faketensor"))
