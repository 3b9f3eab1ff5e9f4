"""strata.api.chunk_gated_delta_rule: values and gradients against a float64 token-by-token recurrence
(differentiated by torch autograd), torch.autograd.gradcheck in float64, torch.library.opcheck,
torch.compile(fullgraph=True), varlen packing, GVA, the fused l2norm, and bad input. Every test but the float64
gradcheck runs on the CPU and, when torch sees a GPU, on CUDA tensors (cuda.sm90.chunked)."""

import math

import pytest
import torch

import strata
from conftest import DEVICES, requires_cuda
from strata import api
from strata._ops import HAS_CUSTOM_OP, OPS


def recurrence(q, k, v, g, beta, scale, h0=None, cu=None, l2=False):
    """float64 token recurrence of ops_gdn_kda.md §2.1 (torch ops, so autograd gives its exact gradients)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if l2:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    q = q.repeat_interleave(G, dim=2)
    k = k.repeat_interleave(G, dim=2)
    if cu is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        seqs = [(0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    outs = [None] * (B * T)
    finals = []
    for n, (b, bos, eos) in enumerate(seqs):
        S = h0[n].double() if h0 is not None else torch.zeros(HV, K, V, dtype=torch.float64)
        for t in range(bos, eos):
            S = S * torch.exp(g[b, t])[:, None, None]
            pred = torch.einsum("hkv,hk->hv", S, k[b, t])
            r = (v[b, t] - pred) * beta[b, t][:, None]
            S = S + k[b, t][:, :, None] * r[:, None, :]
            outs[b * T + t] = scale * torch.einsum("hkv,hk->hv", S, q[b, t])
        finals.append(S)
    o = torch.stack(outs).reshape(B, T, HV, V) if B * T > 0 else torch.zeros(B, T, HV, V, dtype=torch.float64)
    return o, torch.stack(finals)


def make_inputs(B, T, H, HV, K, V, dtype=torch.float32, cu=None, h0=True, l2=False, seed=0, gate=1.0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    N = B if cu is None else len(cu) - 1
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    if not l2:
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.rand(B, T, HV, generator=gen)) / gate
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    s = torch.randn(N, HV, K, V, generator=gen) * 0.5 if h0 else None
    cu_t = torch.tensor(cu, dtype=torch.int64) if cu is not None else None
    ins = [q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype)]
    if device != "cpu":
        ins = [x.to(device) for x in ins]
        s = s.to(device) if s is not None else None
        cu_t = cu_t.to(device) if cu_t is not None else None
    return ins, s, cu_t


def rel_rms(a, b):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return ((a - b).pow(2).mean().sqrt() / (b.pow(2).mean().sqrt() + 1e-12)).item()


CASES = [
    # B, T, H, HV, K, V, cu, h0, l2, dtype
    (2, 65, 2, 4, 32, 16, None, True, False, torch.float32),
    (1, 130, 1, 3, 64, 32, None, False, True, torch.float32),
    (1, 100, 2, 4, 32, 32, [0, 1, 15, 15, 80, 100], True, True, torch.float32),
    (2, 70, 1, 2, 100, 24, None, True, True, torch.float32),
    (1, 64, 2, 2, 64, 64, None, True, True, torch.bfloat16),
    (1, 63, 1, 4, 32, 32, [0, 20, 63], True, False, torch.float16),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_float64_recurrence(case, device):
    B, T, H, HV, K, V, cu, has_h0, l2, dtype = case
    ins, h0, cu_t = make_inputs(B, T, H, HV, K, V, dtype, cu, has_h0, l2, device=device)
    scale = K ** -0.5
    leaves = [x.clone().requires_grad_(True) for x in ins]
    h0_leaf = h0.clone().requires_grad_(True) if h0 is not None else None
    o, ht = api.chunk_gated_delta_rule(*leaves, scale=None, initial_state=h0_leaf, output_final_state=True,
                                       cu_seqlens=cu_t, use_qk_l2norm_in_kernel=l2)
    assert o.dtype == dtype and ht.dtype == torch.float32
    assert o.device == ins[0].device and ht.device == ins[0].device
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen)
    dht = torch.randn(ht.shape, generator=gen)
    ((o.float() * do.to(device)).sum() + (ht * dht.to(device)).sum()).backward()

    rl = [x.detach().cpu().double().requires_grad_(True) for x in ins]
    rh = h0.detach().cpu().double().requires_grad_(True) if h0 is not None else None
    o_r, ht_r = recurrence(*rl, scale, rh, cu, l2)
    ((o_r * do.double()).sum() + (ht_r * dht.double()).sum()).backward()

    tol = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    assert rel_rms(o, o_r) < tol
    assert rel_rms(ht, ht_r) < tol
    for name, a, r in zip(["q", "k", "v", "g", "beta"], leaves, rl):
        assert a.grad.dtype == a.dtype, name
        assert rel_rms(a.grad, r.grad) < 4 * tol, name
    if h0 is not None:
        assert rel_rms(h0_leaf.grad, rh.grad) < 4 * tol


def test_gradcheck_float64():
    ins, h0, cu_t = make_inputs(1, 9, 1, 2, 4, 3, torch.float64, [0, 4, 4, 9], True, True)
    ins = [x.double().requires_grad_(True) for x in ins]
    h0 = h0.double().requires_grad_(True)

    def f(q, k, v, g, beta, s):
        o, ht = api.chunk_gated_delta_rule(q, k, v, g, beta, scale=0.7, initial_state=s, output_final_state=True,
                                           cu_seqlens=cu_t, use_qk_l2norm_in_kernel=True)
        return o, ht

    assert torch.autograd.gradcheck(f, (*ins, h0), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_no_final_state_and_no_initial_state(device):
    ins, _, _ = make_inputs(2, 33, 1, 1, 16, 8, h0=False, device=device)
    leaves = [x.clone().requires_grad_(True) for x in ins]
    o, ht = api.chunk_gated_delta_rule(*leaves)
    assert ht is None
    o.sum().backward()
    o_r, _ = recurrence(*[x.cpu().double() for x in ins], 16 ** -0.5)
    assert rel_rms(o, o_r) < 2e-5
    assert all(x.grad is not None for x in leaves)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_equals_separate(device):
    cu = [0, 30, 30, 95]
    ins, h0, cu_t = make_inputs(1, 95, 1, 2, 16, 8, cu=cu, device=device)
    o, ht = api.chunk_gated_delta_rule(*ins, initial_state=h0, output_final_state=True, cu_seqlens=cu_t)
    for n in range(3):
        a, b = cu[n], cu[n + 1]
        part = [x[:, a:b] for x in ins]
        o1, ht1 = api.chunk_gated_delta_rule(*part, initial_state=h0[n:n + 1], output_final_state=True)
        assert torch.equal(o1, o[:, a:b])
        assert torch.equal(ht1, ht[n:n + 1])


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_bits(device):
    ins, h0, _ = make_inputs(1, 200, 2, 4, 32, 32, torch.bfloat16, l2=True, device=device)
    outs = []
    for _ in range(2):
        leaves = [x.clone().requires_grad_(True) for x in ins]
        o, ht = api.chunk_gated_delta_rule(*leaves, initial_state=h0, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)
        (o.float().square().sum() + ht.sum()).backward()
        outs.append([o, ht] + [x.grad for x in leaves])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch < 2.4")
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ins, h0, cu_t = make_inputs(1, 40, 1, 2, 8, 4, cu=[0, 17, 40], l2=True, device=device)
    fwd = OPS["chunk_gated_delta_rule_fwd"].overload
    for save in (False, True):  # with save, the fake implementation sizes `saved` (0 bytes on the CPU); every byte
        # of the buffer is written (or zeroed) by the forward, so the eager and compiled runs compare equal
        args = (*[x.clone().requires_grad_(True) for x in ins], 0.3, h0.clone().requires_grad_(True), True, cu_t,
                True, save)
        torch.library.opcheck(fwd, args)
    bwd = OPS["chunk_gated_delta_rule_bwd"].overload
    do = torch.randn(1, 40, 2, 4).to(device)
    dht = torch.randn(2, 2, 8, 4).to(device)
    torch.library.opcheck(bwd, (*ins, 0.3, h0, cu_t, do, dht, True, None))
    _, _, saved = fwd(*ins, 0.3, h0, True, cu_t, True, True)
    torch.library.opcheck(bwd, (*ins, 0.3, h0, cu_t, do, dht, True, saved))


def test_saved_bytes_python_formula_matches_the_c_function():
    """The fake implementation's formula (plain arithmetic, symbolic shapes) against the C size function, for a
    CUDA device (a pure function: no GPU needed)."""
    from strata import _C
    from strata._chunk_gated_delta_rule import _saved_bytes
    from strata._ops import DTYPE_CODES

    def meta(dtype, shape, dev):
        st = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            st[i] = st[i + 1] * max(shape[i + 1], 1)
        return (DTYPE_CODES[dtype], dev, tuple(shape), tuple(st), 0)

    bf, f32 = torch.bfloat16, torch.float32
    for (B, T, H, HV, K, V, dq, dv, n_cu, l2) in [(4, 8192, 16, 32, 128, 128, bf, bf, None, True),
                                                  (1, 100, 2, 4, 32, 16, f32, bf, 3, False),
                                                  (2, 65, 1, 3, 100, 24, torch.float16, torch.float16, None, False),
                                                  (1, 1, 1, 1, 16, 8, bf, bf, 1, True),
                                                  (3, 0, 1, 2, 16, 16, bf, bf, None, True)]:
        for dev in (0, -1):
            metas = [meta(dq, (B, T, H, K), dev), meta(dq, (B, T, H, K), dev), meta(dv, (B, T, HV, V), dev),
                     None if n_cu is None else meta(torch.int64, (n_cu + 1,), dev)]
            want = _C.chunk_gated_delta_rule_saved_bytes(metas, 1 if l2 else 0)
            half = dq in (bf, torch.float16) and dv == dq
            assert _saved_bytes(dev >= 0, (B, T, H, K), (B, T, HV, V), half, n_cu, l2) == want
            assert (want == 0) == (dev < 0 or B * T == 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_saved_and_recompute_give_the_same_gradients():
    """CUDA: the forward keeps `saved` when a gradient is needed, and the backward reading it gives the same bits
    as the re-computing backward (recompute_in_backward=True); the buffer is freed with the graph."""
    for case in CASES:
        B, T, H, HV, K, V, cu, has_h0, l2, dtype = case
        ins, h0, cu_t = make_inputs(B, T, H, HV, K, V, dtype, cu, has_h0, l2, device="cuda")
        grads, outs = [], []
        for recompute in (False, True):
            leaves = [x.clone().requires_grad_(True) for x in ins]
            h0_leaf = h0.clone().requires_grad_(True) if h0 is not None else None
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            o, ht = api.chunk_gated_delta_rule(*leaves, initial_state=h0_leaf, output_final_state=True,
                                               cu_seqlens=cu_t, use_qk_l2norm_in_kernel=l2,
                                               recompute_in_backward=recompute)
            held = torch.cuda.memory_allocated() - before
            ((o.float() * 0.5).sum() + ht.square().sum()).backward()
            grads.append([x.grad for x in leaves] + ([h0_leaf.grad] if h0 is not None else []))
            outs.append(o.detach())
            del o, ht
            torch.cuda.synchronize()
            if recompute:
                assert held < saved_held, case
            else:
                saved_held = held
        for a, b in zip(*grads):
            assert torch.equal(a, b), case
        assert rel_rms(outs[0], outs[1]) < {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]


@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch < 2.4")
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    ins, h0, _ = make_inputs(2, 20, 1, 2, 8, 4, l2=True, device=device)

    def f(q, k, v, g, beta, s):
        o, ht = api.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)
        return o.sum() + ht.sum()

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    la = [x.clone().requires_grad_(True) for x in (*ins, h0)]
    lb = [x.clone().requires_grad_(True) for x in (*ins, h0)]
    f(*la).backward()
    cf(*lb).backward()
    for a, b in zip(la, lb):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_errors(device):
    ins, h0, _ = make_inputs(1, 8, 2, 4, 4, 3, device=device)
    q, k, v, g, beta = ins
    with pytest.raises(Exception, match="k must have shape"):
        api.chunk_gated_delta_rule(q, k[:, :, :1], v, g, beta)
    with pytest.raises(Exception, match="multiple of the q/k heads"):
        api.chunk_gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(Exception, match="non-decreasing"):
        api.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 5, 3, 8], device=device))
    with pytest.raises(Exception, match="must equal T"):
        api.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 5, 7], device=device))
    with pytest.raises(Exception, match="dtype"):
        api.chunk_gated_delta_rule(q.int(), k, v, g, beta)
    with pytest.raises(Exception, match="must be in \\[1, 256\\]"):
        big = torch.randn(1, 8, 2, 257, device=device)
        api.chunk_gated_delta_rule(big, big, v, g, beta)
    with pytest.raises(NotImplementedError):
        api.chunk_gated_delta_rule(q, k, v, g, beta, head_first=True)


@pytest.mark.cuda
@requires_cuda
def test_cpu_tensor_among_cuda_tensors_is_an_error():
    """One tensor left on the host among CUDA tensors: the C API's device error naming it (forward, and the
    backward through autograd), and the next valid call still works (nothing left broken on the device)."""
    ins, h0, _ = make_inputs(1, 8, 2, 4, 4, 3, device="cuda")
    cu = torch.tensor([0, 3, 8], dtype=torch.int64)
    for i, name in enumerate(("k", "v", "g", "beta"), start=1):
        args = list(ins)
        args[i] = args[i].cpu()
        with pytest.raises(Exception, match=f"{name} is on cpu, expected cuda:0"):
            api.chunk_gated_delta_rule(*args)
    with pytest.raises(Exception, match="initial_state is on cpu, expected cuda:0"):
        api.chunk_gated_delta_rule(*ins, initial_state=h0.cpu())
    with pytest.raises(Exception, match="cu_seqlens is on cpu, expected cuda:0"):
        api.chunk_gated_delta_rule(*ins, cu_seqlens=cu)
    with pytest.raises(Exception, match="cu_seqlens is on cpu, expected cuda:0"):  # the backward op directly
        OPS["chunk_gated_delta_rule_bwd"].overload(*ins, 0.5, None, cu, ins[2], None, False, None)
    o, ht = api.chunk_gated_delta_rule(*ins, initial_state=h0, output_final_state=True)
    assert o.is_cuda and torch.isfinite(o).all() and torch.isfinite(ht).all()
