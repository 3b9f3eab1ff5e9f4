"""strata.api GDN forward chunk ops (ops_gdn_kda.md §4.3-§4.8) against float64 torch references written from
the spec formulas, and the composed forward against the token recurrence of §2.1 (fixed length and varlen,
GVA, tails, initial state)."""

import pytest
import torch

from strata import api

from conftest import device_dtypes, rel_rms, requires_cuda

TOLS = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def segments(B, T, cu):
    if cu is None:
        return [(b, 0, T) for b in range(B)]
    c = cu.tolist()
    return [(0, c[i], c[i + 1]) for i in range(len(c) - 1)]


def chunks(B, T, cu, BT):
    out = []
    for b, bos, eos in segments(B, T, cu):
        for s in range(bos, eos, BT):
            out.append((b, s, min(s + BT, eos)))
    return out


def make_inputs(B, T, H, HV, K, V, device, dtype, cu=None, BT=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    beta = torch.sigmoid(torch.rand(B, T, HV, generator=gen, dtype=torch.float64))
    graw = torch.nn.functional.logsigmoid(torch.rand(B, T, HV, generator=gen, dtype=torch.float64))
    g = torch.zeros_like(graw)
    for b, s, e in chunks(B, T, cu, BT):
        g[b, s:e] = graw[b, s:e].cumsum(0)
    N = B if cu is None else cu.numel() - 1
    h0 = 0.5 * torch.randn(N, HV, K, V, generator=gen, dtype=torch.float64)
    cast = lambda t: t.to(dtype).to(device)  # noqa: E731
    gd = torch.float64 if dtype == torch.float64 else torch.float32
    return dict(q=cast(q), k=cast(k), v=cast(v), beta=beta.to(gd).to(device), g=g.to(gd).to(device),
                graw=graw, h0=h0.to(gd).to(device))


def rep(x, G):  # [B,T,H,K] -> [B,T,HV,K] (repeat_interleave, GVA)
    return x.repeat_interleave(G, dim=2)


def ref_wy(k, v, beta, g, cu, BT):
    """float64 (w, u, A) per the spec: A = (I + StrictLower(beta k k^T Gamma))^-1."""
    k, v, beta, g = (t.double().cpu() for t in (k, v, beta, g))
    B, T, H, K = k.shape
    HV = v.shape[2]
    kk = rep(k, HV // H)
    w = torch.zeros(B, T, HV, K, dtype=torch.float64)
    u = torch.zeros_like(v)
    A = torch.zeros(B, T, HV, BT, dtype=torch.float64)
    for b, s, e in chunks(B, T, cu, BT):
        L = e - s
        for hv in range(HV):
            kc, gc, bc = kk[b, s:e, hv], g[b, s:e, hv], beta[b, s:e, hv]
            M = torch.tril(bc[:, None] * (kc @ kc.T) * torch.exp((gc[:, None] - gc[None, :]).clamp(max=0)), -1)
            Ai = torch.linalg.inv(torch.eye(L, dtype=torch.float64) + M)
            A[b, s:e, hv, :L] = Ai
            u[b, s:e, hv] = Ai @ (bc[:, None] * v[b, s:e, hv])
            w[b, s:e, hv] = Ai @ ((bc * torch.exp(gc))[:, None] * kc)
    return w, u, A


def recurrence(q, k, v, graw, beta, h0, scale, cu):
    q, k, v, beta = (t.double().cpu() for t in (q, k, v, beta))
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    ht = torch.zeros(h0.shape, dtype=torch.float64)
    for n, (b, bos, eos) in enumerate(segments(B, T, cu)):
        for hv in range(HV):
            S = h0[n, hv].double().cpu().clone()
            for t in range(bos, eos):
                S = S * torch.exp(graw[b, t, hv])
                kt = k[b, t, hv // G]
                r = beta[b, t, hv] * (v[b, t, hv] - kt @ S)
                S = S + torch.outer(kt, r)
                o[b, t, hv] = scale * (q[b, t, hv // G] @ S)
            ht[n, hv] = S
    return o, ht


SHAPES = [  # (B, T, H, HV, K, V, BT, cu)
    (2, 75, 1, 3, 32, 16, 64, None),
    (1, 0, 2, 4, 16, 24, 32, [0, 1, 17, 17, 80, 145]),
    (1, 100, 2, 2, 100, 32, 16, None),
]


def _cu(cu, device):
    return None if cu is None else torch.tensor(cu, dtype=torch.int64, device=device)


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_wy_ops_match_float64(device, dtype, shape):
    B, T, H, HV, K, V, BT, cu = shape
    if cu is not None:
        T = cu[-1]
    cu_t = _cu(cu, device)
    x = make_inputs(B, T, H, HV, K, V, device, dtype, cu_t, BT)
    w_ref, u_ref, A_ref = ref_wy(x["k"], x["v"], x["beta"], x["g"], cu_t, BT)
    w, u, A = api.prepare_wy_repr_fwd(x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu_t, chunk_size=BT)
    tol = TOLS[dtype]
    assert rel_rms(w, w_ref) < tol and rel_rms(u, u_ref) < tol and rel_rms(A, A_ref) < tol
    Akk = api.chunk_scaled_dot_kkt_fwd(x["k"], x["g"], x["beta"], cu_seqlens=cu_t, chunk_size=BT)
    Ai = api.solve_tril(Akk, cu_seqlens=cu_t)
    assert rel_rms(Ai, A_ref) < max(tol, 1e-5)
    w2, u2 = api.recompute_w_u_fwd(x["k"], x["v"], x["beta"], A, x["g"], cu_seqlens=cu_t)
    assert rel_rms(w2, w_ref) < 2 * tol and rel_rms(u2, u_ref) < 2 * tol


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_pipeline_matches_recurrence(device, dtype, shape):
    B, T, H, HV, K, V, BT, cu = shape
    if cu is not None:
        T = cu[-1]
    cu_t = _cu(cu, device)
    x = make_inputs(B, T, H, HV, K, V, device, dtype, cu_t, BT, seed=1)
    scale = float(torch.tensor(K ** -0.5, dtype=torch.float32))  # the C API takes a float32 scale
    w, u, A = api.prepare_wy_repr_fwd(x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu_t, chunk_size=BT)
    h, v_new, ht = api.chunk_gated_delta_rule_fwd_h(x["k"], w, u, g=x["g"], initial_state=x["h0"],
                                                    output_final_state=True, chunk_size=BT, cu_seqlens=cu_t)
    o = api.chunk_fwd_o(x["q"], x["k"], v_new, h, g=x["g"], scale=scale, cu_seqlens=cu_t, chunk_size=BT)
    # the recurrence sees the values the kernels saw (rounded inputs)
    o_ref, ht_ref = recurrence(x["q"], x["k"], x["v"], x["graw"], x["beta"], x["h0"], scale, cu_t)
    tol = TOLS[dtype] * (4 if dtype in (torch.float16, torch.bfloat16) else 2)
    assert o.dtype == dtype and ht.dtype == x["h0"].dtype
    assert rel_rms(o, o_ref) < tol, rel_rms(o, o_ref)
    assert rel_rms(ht, ht_ref) < tol, rel_rms(ht, ht_ref)


def test_validation_messages():
    x = make_inputs(1, 40, 1, 2, 8, 8, "cpu", torch.float32)
    with pytest.raises(Exception, match="chunk_size must be one of"):
        api.chunk_scaled_dot_kkt(x["k"], x["g"], x["beta"], chunk_size=48)
    with pytest.raises(ValueError, match="non-decreasing"):
        api.chunk_scaled_dot_kkt(x["k"], x["g"], x["beta"], cu_seqlens=torch.tensor([0, 30, 20, 40]))
    with pytest.raises(NotImplementedError):
        api.chunk_fwd_o(x["q"], x["k"], x["v"], torch.zeros(1, 1, 2, 8, 8), state_v_first=True)


def test_fake_shapes_compile():
    x = make_inputs(1, 70, 1, 2, 16, 8, "cpu", torch.float32)

    def f(k, v, g, beta, q):
        w, u, A = api.prepare_wy_repr_fwd(k, v, g, beta)
        h, vn, ht = api.chunk_gated_delta_rule_fwd_h(k, w, u, g=g, output_final_state=True)
        return api.chunk_fwd_o(q, k, vn, h, g=g), ht

    eager = f(x["k"], x["v"], x["g"], x["beta"], x["q"])
    compiled = torch.compile(f, fullgraph=True)(x["k"], x["v"], x["g"], x["beta"], x["q"])
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch < 2.4: no torch.library.opcheck")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])])
def test_opcheck(device):
    from strata import _ops
    x = make_inputs(1, 40, 1, 2, 16, 8, device, torch.float32, BT=16)
    cu = torch.tensor([0, 7, 40], dtype=torch.int64, device=device)
    w, u, A = api.prepare_wy_repr_fwd(x["k"], x["v"], x["g"], x["beta"], chunk_size=16)
    h, vn, _ = api.chunk_gated_delta_rule_fwd_h(x["k"], w, u, g=x["g"], chunk_size=16)
    Akk = api.chunk_scaled_dot_kkt(x["k"], x["g"], x["beta"], chunk_size=16)
    cases = [
        ("chunk_scaled_dot_kkt", (x["k"], x["g"], x["beta"], None, 16, torch.float32)),
        ("chunk_scaled_dot_kkt", (x["k"], None, x["beta"], cu, 32, torch.bfloat16)),
        ("solve_tril", (Akk, None, torch.float32)),
        ("recompute_w_u_fwd", (x["k"], x["v"], x["beta"], A, x["g"], None)),
        ("prepare_wy_repr_fwd", (x["k"], x["v"], x["g"], x["beta"], cu, 16, torch.float32)),
        ("chunk_gated_delta_rule_fwd_h", (x["k"], w, u, x["g"], x["h0"][:1], None, 16, 3, True)),
        ("chunk_fwd_o", (x["q"], x["k"], vn, h, x["g"], None, 0.25, 16)),
    ]
    for name, args in cases:
        torch.library.opcheck(_ops.OPS[name].overload, args)
