"""strata.api.chunk_loss (fused LM head + cross entropy, ops_fused.md §2) against a float64 torch reference:
forward and gradients for every dtype, both strategies and each option, gradcheck in f64, opcheck,
torch.compile(fullgraph=True), gradient accumulation, the public-name wrappers and bad input."""

import pytest
import torch

from strata import _ops, api

from conftest import DEVICES, TOL, device_dtypes, rel_rms, requires_cuda

HAS_CUSTOM_OP = _ops.HAS_CUSTOM_OP
needs_custom_op = pytest.mark.skipif(not HAS_CUSTOM_OP or not hasattr(torch.library, "opcheck"),
                                     reason="torch < 2.4: no torch.library.custom_op / opcheck")


def ref_loss(h, w, t, b=None, ignore_index=-100, reduction="mean", eps=0.0, scale=1.0, softcap=None, zloss=0.0):
    """float64 composition: logits, softcap, log-sum-exp, smoothing, z-loss; mean over valid rows (0 if none)."""
    z = h.double() @ w.double().T
    if b is not None:
        z = z + b.double()
    u = scale * z
    c = softcap * torch.tanh(u / softcap) if softcap else u
    lse = torch.logsumexp(c, dim=-1)
    valid = t != ignore_index
    ty = torch.where(valid, t, torch.zeros_like(t))
    cy = c.gather(1, ty[:, None])[:, 0]
    V = w.shape[0]
    loss = lse - (1 - eps) * cy - eps / V * c.sum(-1) + zloss * lse * lse
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    total = loss.sum()
    if reduction == "mean":
        n = int(valid.sum())
        total = total / n if n else total * 0
    return total, lse


def make(N, D, V, dtype, device, bias=False, ignored=0.2, mag=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g).to(dtype).to(device)
    w = (torch.randn(V, D, generator=g) * mag / D ** 0.5).to(dtype).to(device)
    b = torch.randn(V, generator=g).to(dtype).to(device) if bias else None
    t = torch.randint(0, V, (N,), generator=g)
    t[torch.rand(N, generator=g) < ignored] = -100
    return h, w, b, t.to(device)


def run_both(h, w, b, t, **kw):
    """strata loss and gradients, and the float64 reference's, on the same (rounded) inputs."""
    hs, ws = h.clone().requires_grad_(), w.clone().requires_grad_()
    bs = b.clone().requires_grad_() if b is not None else None
    loss = api.chunk_loss(hs, ws, t, bs, **kw)
    G = torch.tensor(1.75, device=h.device)  # exact in every float dtype
    (loss * G).backward()
    hr, wr = h.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    br = b.detach().double().cpu().requires_grad_() if b is not None else None
    ref_kw = {k: v for k, v in kw.items() if k in ("ignore_index", "reduction")}
    f32 = lambda x: None if x is None else torch.tensor(x, dtype=torch.float32).item()  # the op's float attributes
    ref_kw.update(eps=f32(kw.get("label_smoothing", 0.0)), scale=f32(kw.get("logit_scale", 1.0)),
                  softcap=f32(kw.get("softcap")), zloss=f32(kw.get("lse_square_scale", 0.0)))
    rl, _ = ref_loss(hr, wr, t.cpu(), br, **ref_kw)
    (rl * 1.75).backward()
    out = [(loss, rl), (hs.grad, hr.grad), (ws.grad, wr.grad)]
    if b is not None:
        out.append((bs.grad, br.grad))
    return out


OPTIONS = [
    {},
    {"label_smoothing": 0.1},
    {"lse_square_scale": 1e-3},
    {"softcap": 20.0},
    {"logit_scale": 0.5, "reduction": "sum"},
    {"label_smoothing": 0.05, "softcap": 15.0, "lse_square_scale": 1e-3, "logit_scale": 0.7},
]


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("strategy", ["auto", "token_chunked", "vocab_tiled"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_forward_backward(device, dtype, strategy, opts):
    h, w, b, t = make(37, 48, 211, dtype, device, bias=True)
    kw = dict(opts, strategy=strategy, chunk_tokens=16, vocab_tile=64)
    for name, (out, ref) in zip(["loss", "dhidden", "dweight", "dbias"], run_both(h, w, b, t, **kw)):
        assert out.dtype == (torch.float64 if dtype == torch.float64 and name == "loss" else
                             torch.float32 if name == "loss" else dtype), name
        err = rel_rms(out, ref)
        assert err <= TOL[dtype] * (2 if dtype != torch.float64 else 1e3), f"{name}: {err:.3e}"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])])
def test_all_ignored_mean_is_zero_with_zero_gradients(device):
    h, w, b, t = make(10, 16, 30, torch.float32, device, bias=True, ignored=1.0)
    hs = h.clone().requires_grad_()
    loss = api.chunk_loss(hs, w, t, b)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(hs.grad) == 0


@pytest.mark.parametrize("strategy", ["token_chunked", "vocab_tiled"])
def test_gradcheck(strategy):
    h, w, b, t = make(6, 5, 9, torch.float64, "cpu", bias=True, ignored=0.3)
    t[0] = 2

    def fn(h_, w_, b_):
        return api.chunk_loss(h_, w_, t, b_, label_smoothing=0.1, softcap=4.0, lse_square_scale=0.05,
                              logit_scale=0.9, strategy=strategy, chunk_tokens=4, vocab_tile=4)

    args = tuple(x.clone().requires_grad_() for x in (h, w, b))
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-7)


def test_gradients_accumulate_into_grad():
    h, w, b, t = make(12, 16, 40, torch.float32, "cpu")
    ws = w.clone().requires_grad_()
    api.chunk_loss(h, ws, t).backward()
    once = ws.grad.clone()
    api.chunk_loss(h, ws, t).backward()
    torch.testing.assert_close(ws.grad, 2 * once)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("upstream", [1.0, 0.625])
def test_backward_hands_the_forward_gradients_to_grad(device, dtype, upstream):
    """The gradients written by the forward are the very buffers that land in .grad (scaled in place when the
    upstream gradient is not 1): no copy, no f32 intermediate. The saved-tensor pack hook sees the forward's
    gradient buffers; .grad must have their addresses and the inputs' dtype."""
    h, w, b, t = make(40, 32, 300, dtype, device, bias=True)
    hs, ws, bs = (x.clone().requires_grad_() for x in (h, w, b))
    saved = []

    def pack(x):
        saved.append(x.data_ptr())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = api.chunk_loss(hs, ws, t, bs)
    (loss * upstream).backward()
    for x in (hs, ws, bs):
        assert x.grad.dtype == dtype and x.grad.data_ptr() in saved
    _, wr = h.clone().requires_grad_(), w.clone().requires_grad_()
    (api.chunk_loss(h, wr, t, b, hold_grad_in_fp32=True) * upstream).backward()
    assert rel_rms(ws.grad, wr.grad) <= (0 if dtype == torch.float32 else TOL[torch.bfloat16])


@pytest.mark.cuda
@requires_cuda
def test_cuda_peak_is_gradients_plus_workspace():
    """Issue target: fwd+bwd through Python peaks at the gradients' size + 64 MiB (bf16; the plan's workspace
    and the row buffers), measured by torch's allocator above the inputs."""
    N, D, V = 2048, 512, 32000
    h, w, b, t = make(N, D, V, torch.bfloat16, "cuda")
    hs, ws = h.clone().requires_grad_(), w.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = api.chunk_loss(hs, ws, t)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    grads = (N * D + V * D) * 2
    assert extra <= grads + (64 << 20) + (1 << 20), f"peak {extra / 2**20:.1f} MiB, gradients {grads / 2**20:.1f} MiB"
    # the backward allocates nothing of size: no copies, no zero-filled gradients of the unused outputs
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss.backward()
    torch.cuda.synchronize()
    bwd = torch.cuda.max_memory_allocated() - before
    assert bwd <= (1 << 20), f"backward peak {bwd / 2**20:.1f} MiB above the forward's"


def test_backward_allocates_nothing_of_size():
    """CPU, by the profiler's memory events: the backward of the gradient-in-forward path allocates no
    gradient-sized tensor (no copy of the saved gradients, no zero-filled gradients for the unused outputs
    dh / dw / lse, which autograd would materialize by default)."""
    from torch.profiler import ProfilerActivity, profile
    h, w, b, t = make(256, 64, 4000, torch.bfloat16, "cpu")
    hs, ws = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = api.chunk_loss(hs, ws, t)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss.backward()
    big = [(e.name, e.cpu_memory_usage) for e in prof.events() if e.cpu_memory_usage >= hs.numel() * 2]
    assert not big, f"backward allocated {big}"


def test_return_lse_and_public_names():
    h, w, b, t = make(20, 16, 50, torch.float32, "cpu", bias=True)
    loss, lse = api.chunk_loss(h, w, t, b, return_lse=True)
    rl, rlse = ref_loss(h, w, t, b)
    assert rel_rms(loss, rl) < 1e-5 and rel_rms(lse, rlse) < 1e-5
    l2 = api.fused_linear_cross_entropy_loss(h, t, w, b, logit_softcapping=None, num_chunks=3)
    l3 = api.linear_cross_entropy(h, w, t, b)
    assert rel_rms(l2, rl) < 1e-5 and rel_rms(l3, rl) < 1e-5


def test_bad_input():
    h, w, b, t = make(8, 16, 20, torch.float32, "cpu")
    with pytest.raises(Exception, match="D = 16"):
        api.chunk_loss(h, w[:, :15].contiguous(), t)
    bad = t.clone()
    bad[3] = 20
    with pytest.raises(Exception, match="out of range"):
        api.chunk_loss(h, w, bad)
    with pytest.raises(Exception, match="label_smoothing"):
        api.chunk_loss(h, w, t, label_smoothing=float("nan"))
    with pytest.raises(Exception, match="weight"):
        api.chunk_loss(h, w.to(torch.bfloat16), t)
    with pytest.raises(Exception, match="target"):
        api.chunk_loss(h, w, t.to(torch.int32))
    with pytest.raises(ValueError, match="reduction"):
        api.chunk_loss(h, w, t, reduction="none")


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    h, w, b, t = make(9, 8, 13, torch.float32, device, bias=True)
    h.requires_grad_()
    w.requires_grad_()
    attrs = (-100, 0, 0.1, 1.0, 0.0, 0.0, 0, 4, 8)
    torch.library.opcheck(_ops.OPS["chunk_loss"].overload, (h, w, b, t) + attrs + (True, True))
    torch.library.opcheck(_ops.OPS["chunk_loss"].overload, (h, w, None, t) + attrs + (False, False))
    _, lse = api.chunk_loss(h.detach(), w.detach(), t, b, return_lse=True, label_smoothing=0.1)
    torch.library.opcheck(_ops.OPS["chunk_loss_bwd"].overload,
                          (h.detach(), w.detach(), b, t, lse, torch.tensor(1.5, device=device)) + attrs)


def _model(h, w, b, t):
    return api.chunk_loss(h, w, t, b, softcap=10.0) + 0.5 * api.chunk_loss(h * 2, w, t, strategy="vocab_tiled")


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    dt, tol = (torch.float64, 1e-10) if device == "cpu" else (torch.float32, 1e-5)  # CUDA has no f64 kernels
    h, w, b, t = make(16, 8, 30, dt, device, bias=True)
    args = [x.clone().requires_grad_() for x in (h, w, b)]
    eager = _model(*args, t)
    grads = torch.autograd.grad(eager, args)
    compiled = torch.compile(_model, fullgraph=True, backend="aot_eager")
    out = compiled(*args, t)
    cgrads = torch.autograd.grad(out, args)
    torch.testing.assert_close(out, eager, rtol=tol, atol=tol)
    for a, c in zip(grads, cgrads):
        torch.testing.assert_close(c, a, rtol=tol, atol=tol)
