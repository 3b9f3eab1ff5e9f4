"""strata.api fused cross entropy (cross_entropy_loss, fused_cross_entropy, FusedCrossEntropyLoss) against a
float64 reference (ops_fused.md §1): every reduction and option, the three gradient modes (new dlogits,
in place in the backward, in place in the forward), gradcheck in f64, opcheck, torch.compile, and the
validation of target values."""
import pytest
import torch

import strata
from strata import _ops, api

from conftest import DEVICES, TOL, assert_close_rel, device_dtypes, rel_rms, requires_cuda

IG = -100


def ref_rows(logits, target, ls=0.0, scale=1.0, lam=0.0, cap=None, ignore_index=IG):
    """float64 per-row (loss, lse, z_loss) straight from the definition."""
    z = logits.detach().double().cpu() * scale
    c = cap * torch.tanh(z / cap) if cap else z
    lse = torch.logsumexp(c, dim=-1)
    t = target.cpu()
    valid = t != ignore_index
    cy = c.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
    loss = lse - (1 - ls) * cy - ls * c.mean(-1) + lam * lse * lse
    zl = lam * lse * lse
    return torch.where(valid, loss, 0.0), lse, torch.where(valid, zl, 0.0), int(valid.sum())


def reduce(x, red, n):
    if red == "none":
        return x
    s = x.sum()
    return s if red == "sum" else (s / n if n > 0 else s * 0)


def make(N, V, dtype, device, ignore_every=4, scale=3.0):
    logits = (torch.randn(N, V) * scale).to(dtype).to(device)
    target = torch.randint(0, V, (N,))
    if ignore_every:
        target[ignore_every - 1::ignore_every] = IG
    return logits, target.to(device)


OPTS = [dict(), dict(label_smoothing=0.1), dict(lse_square_scale=1e-3), dict(logit_scale=0.7),
        dict(softcap=30.0), dict(label_smoothing=0.1, lse_square_scale=1e-4, logit_scale=0.9, softcap=4.0)]


def _ref_kwargs(o):
    return dict(ls=o.get("label_smoothing", 0.0), scale=o.get("logit_scale", 1.0), lam=o.get("lse_square_scale", 0.0),
                cap=o.get("softcap"))


def _f32(v):  # the C API takes float attributes
    return torch.tensor(v, dtype=torch.float32).item() if v is not None else None


@pytest.mark.parametrize("device,dtype", device_dtypes())
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", OPTS, ids=str)
def test_forward_and_gradient(device, dtype, reduction, opts):
    logits, target = make(13, 1031, dtype, device)
    x = logits.clone().requires_grad_()
    loss, z, lse = api.fused_cross_entropy(x, target, reduction=reduction, return_z_loss=True, return_lse=True, **opts)
    o32 = {k: _f32(v) for k, v in opts.items()}
    rl, rlse, rz, n = ref_rows(logits, target, **_ref_kwargs(o32))
    stat_tol = TOL[torch.float64] if dtype == torch.float64 else TOL[torch.float32]
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert rel_rms(loss, reduce(rl, reduction, n)) <= stat_tol * 10
    assert rel_rms(lse, rlse) <= stat_tol
    if opts.get("lse_square_scale"):
        assert rel_rms(z, reduce(rz, reduction, n)) <= stat_tol * 10
    g = torch.randn(loss.shape, device=device, dtype=loss.dtype) if reduction == "none" else torch.tensor(
        1.7, device=device, dtype=loss.dtype)
    (dx,) = torch.autograd.grad(loss, x, g)
    # reference gradient by autograd through the float64 reference
    x64 = logits.detach().double().cpu().requires_grad_()
    z64 = x64 * o32.get("logit_scale", 1.0)
    c64 = o32["softcap"] * torch.tanh(z64 / o32["softcap"]) if o32.get("softcap") else z64
    lse64 = torch.logsumexp(c64, -1)
    t = target.cpu()
    valid = t != IG
    ls, lam = o32.get("label_smoothing", 0.0), o32.get("lse_square_scale", 0.0)
    rows = lse64 - (1 - ls) * c64.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1) - ls * c64.mean(-1) + lam * lse64 ** 2
    rows = torch.where(valid, rows, 0.0)
    (dref,) = torch.autograd.grad(reduce(rows, reduction, int(valid.sum())), x64, g.double().cpu())
    assert dx.dtype == dtype and dx.shape == logits.shape
    assert_close_rel(dx, dref, dtype, "dlogits")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_inplace_modes_give_the_same_gradient(device, reduction):
    logits, target = make(9, 3001, torch.bfloat16, device)
    g = torch.rand(9, device=device) + 0.5 if reduction == "none" else torch.tensor(0.8, device=device)
    grads = {}
    for mode in ["default", "inplace_backward", "grad_in_forward"]:
        x = logits.clone().requires_grad_()
        kw = dict(inplace_backward=mode == "inplace_backward", grad_in_forward=mode == "grad_in_forward")
        loss = api.fused_cross_entropy(x, target, reduction=reduction, label_smoothing=0.05, **kw)
        if mode == "grad_in_forward":  # the logits already hold the gradient (for an upstream gradient of 1)
            assert not torch.equal(x.detach(), logits)
        else:
            assert torch.equal(x.detach(), logits)  # untouched by the forward
        loss.backward(g)
        grads[mode] = x.grad.clone()
        if mode != "default":  # the gradient was written into the logits' own storage
            assert torch.equal(x.detach(), x.grad)
    torch.testing.assert_close(grads["inplace_backward"], grads["default"], rtol=0, atol=0)
    # grad_in_forward scales a bf16 gradient computed for G = 1 afterwards: one more bf16 rounding
    assert rel_rms(grads["grad_in_forward"], grads["default"]) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("mode", ["inplace_backward", "grad_in_forward", "fla functional", "module"])
def test_inplace_modes_copy_nothing(device, reduction, mode):
    """In place means no [N, V] copy anywhere: .grad is the logits' own storage (AccumulateGrad stole the
    gradient instead of cloning it) and, on CUDA, the call's peak above the inputs is far below one logits
    buffer (loss/lse/z_loss rows and the target check only)."""
    N, V = 64, 4099
    logits, target = make(N, V, torch.bfloat16, device)
    x = logits.clone().requires_grad_()
    g = torch.rand(N, device=device) + 0.5 if reduction == "none" else torch.tensor(1.0, device=device)
    cuda = x.is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    if mode == "fla functional":
        loss = api.cross_entropy_loss(x, target, inplace_backward=True)[0]
        loss = loss if reduction == "none" else loss.sum()
    elif mode == "module":
        loss = api.FusedCrossEntropyLoss(reduction=reduction, inplace_backward=True)(x, target)
    else:
        loss = api.fused_cross_entropy(x, target, reduction=reduction, **{mode: True})
    loss.backward(g)
    assert x.grad is not None and x.grad.data_ptr() == x.data_ptr()
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
    if cuda:
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        assert extra < N * V * x.element_size() // 4, f"peak {extra} B above the inputs: a logits-sized copy"
    # and it is the right gradient
    ref = logits.clone().requires_grad_()
    red = "sum" if mode == "fla functional" and reduction == "mean" else reduction  # per-row losses, summed
    api.fused_cross_entropy(ref, target, reduction=red).backward(g)
    assert rel_rms(x.grad, ref.grad) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
def test_all_ignored_and_huge_logits(device):
    logits, target = make(6, 500, torch.float32, device, ignore_every=1)
    x = logits.clone().requires_grad_()
    loss = api.fused_cross_entropy(x, target)  # mean over zero rows: 0 (not NaN)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.count_nonzero(x.grad) == 0
    huge = (torch.rand(5, 1000) * 2e4 - 1e4).to(device)
    t = torch.randint(0, 1000, (5,), device=device)
    out = api.fused_cross_entropy(huge, t, reduction="none")
    ref, _, _, _ = ref_rows(huge, t)
    assert torch.isfinite(out).all() and rel_rms(out, ref) <= 1e-6


def test_gradcheck(call_path):
    logits = torch.randn(5, 7, dtype=torch.float64)
    target = torch.tensor([1, 3, IG, 6, 0])

    def fn(x):
        l, z = api.cross_entropy_loss(x, target, label_smoothing=0.1, logit_scale=0.7, lse_square_scale=1e-2,
                                      logit_softcapping=4.0)
        return l

    assert torch.autograd.gradcheck(fn, (logits.requires_grad_(),), eps=1e-6, atol=1e-7)
    for red in ["mean", "sum"]:
        f2 = lambda x: api.fused_cross_entropy(x, target, reduction=red, softcap=3.0)  # noqa: E731
        assert torch.autograd.gradcheck(f2, (logits,), eps=1e-6, atol=1e-7)


def test_inplace_backward_matches_in_float64():
    """The in-place modes overwrite what their backward reads, so they are not reentrant (gradcheck's
    double-backward check does not apply, as for fla and Liger): compare one backward with the default."""
    logits = torch.randn(5, 7, dtype=torch.float64)
    target = torch.tensor([1, 3, IG, 6, 0])
    g = torch.randn(5, dtype=torch.float64)
    kw = dict(label_smoothing=0.1, logit_scale=0.7, lse_square_scale=1e-2, logit_softcapping=4.0)
    x0 = logits.clone().requires_grad_()
    api.cross_entropy_loss(x0, target, **kw)[0].backward(g)
    x1 = logits.clone().requires_grad_()
    api.cross_entropy_loss(x1, target, inplace_backward=True, **kw)[0].backward(g)
    torch.testing.assert_close(x1.grad, x0.grad, rtol=0, atol=0)
    x2 = logits.clone().requires_grad_()
    api.fused_cross_entropy(x2, target, reduction="none", grad_in_forward=True, label_smoothing=0.1,
                            logit_scale=0.7, lse_square_scale=1e-2, softcap=4.0).backward(g)
    torch.testing.assert_close(x2.grad, x0.grad, rtol=1e-15, atol=0)


@pytest.mark.skipif(not _ops.HAS_CUSTOM_OP or not hasattr(torch.library, "opcheck"), reason="torch < 2.4")
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits, target = make(7, 301, torch.float32, device)
    x = logits.clone().requires_grad_()
    for red in (0, 1, 2):
        torch.library.opcheck(_ops.OPS["fused_cross_entropy_fwd"].overload, (x, target, red, IG, 0.1, 1.0, 1e-3, 0.0))
    _, lse, _ = _ops.OPS["fused_cross_entropy_fwd"](logits, target, 1, IG, 0.0, 1.0, 0.0, 0.0)
    torch.library.opcheck(_ops.OPS["fused_cross_entropy_bwd"].overload,
                          (logits, target, lse, torch.tensor(1.0, device=device), 1, IG, 0.0, 1.0, 0.0, 0.0))


@pytest.mark.skipif(not _ops.HAS_CUSTOM_OP, reason="torch < 2.4")
def test_compile_fullgraph():
    W = torch.randn(300, 16, dtype=torch.float64, requires_grad=True)
    h = torch.randn(11, 16, dtype=torch.float64)
    target = torch.randint(0, 300, (11,))
    target[3] = IG

    def model(h, W):
        return api.fused_cross_entropy(h @ W.t(), target, label_smoothing=0.1, lse_square_scale=1e-3,
                                       check_targets=False)

    eager = model(h, W)
    (dw,) = torch.autograd.grad(eager, W)
    out = torch.compile(model, fullgraph=True, backend="aot_eager")(h, W)
    (cdw,) = torch.autograd.grad(out, W)
    torch.testing.assert_close(out, eager, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cdw, dw, rtol=1e-12, atol=1e-12)


def test_module_matches_functional():
    logits, target = make(8, 257, torch.float32, "cpu")
    m = api.FusedCrossEntropyLoss(reduction="sum", label_smoothing=0.1, lse_square_scale=1e-3, return_z_loss=True)
    loss, z = m(logits, target)
    l2, z2 = api.fused_cross_entropy(logits, target, reduction="sum", label_smoothing=0.1, lse_square_scale=1e-3,
                                     return_z_loss=True)
    assert torch.equal(loss, l2) and torch.equal(z, z2)
    rows, zrows = api.cross_entropy_loss(logits, target, label_smoothing=0.1, lse_square_scale=1e-3)
    assert rows.shape == (8,) and abs(rows.sum().item() - loss.item()) <= 1e-5 * abs(loss.item())
    with pytest.raises(NotImplementedError):
        api.FusedCrossEntropyLoss(process_group=object())(logits, target)


@pytest.mark.parametrize("device", DEVICES)
def test_target_values_checked(device):
    logits, target = make(4, 10, torch.float32, device, ignore_every=0)
    for bad in (10, -1, -101):
        t = target.clone()
        t[2] = bad
        with pytest.raises(ValueError, match=r"target\[2\] must be in \[0, 10\)"):
            api.fused_cross_entropy(logits, t)
        # every gradient mode, and nothing written: with grad_in_forward the logits keep their values (the C
        # library rejects the target before any launch that writes)
        for kw in (dict(grad_in_forward=True), dict(inplace_backward=True), dict(reduction="none")):
            x = logits.clone().requires_grad_()
            with pytest.raises(ValueError, match=r"target\[2\] must be in \[0, 10\)"):
                api.fused_cross_entropy(x, t, **kw)
            assert torch.equal(x.detach(), logits) and x.grad is None
        # the ignored value itself is fine, the same check with int32 targets
        t[2] = IG
        api.fused_cross_entropy(logits, t.to(torch.int32))
    t = target.clone()
    t[2] = 10
    with pytest.raises(ValueError, match=r"target\[2\]"):
        api.fused_cross_entropy(logits, t.to(torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_target_without_check(device):
    """check_targets=False changes nothing: the C library itself rejects a bad target on both devices (on CUDA
    its device count is read back before any launch that writes), so the fused forward leaves the logits as they
    were and no loss is returned."""
    logits, target = make(4, 10, torch.float32, device, ignore_every=0)
    target[1] = 10
    for kw in (dict(grad_in_forward=True), dict(reduction="none", grad_in_forward=True), dict(reduction="sum")):
        x = logits.clone().requires_grad_()
        with pytest.raises(ValueError, match=r"target\[1\] must be in \[0, 10\)"):
            api.fused_cross_entropy(x, target, check_targets=False, **kw)
        assert torch.equal(x.detach(), logits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("g", [1.0, 0.8, -2.5, "rows"])
def test_grad_in_forward_any_upstream(device, reduction, g):
    """grad_in_forward's backward (the C op's scale mode: dloss read on the device) for any upstream gradient,
    1 included (nothing touched), against the default mode; in float64 on the CPU to the last bits."""
    if g == "rows" and reduction != "none":
        pytest.skip("a per-row upstream gradient exists for reduction none only")
    dtypes = [torch.float64, torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        logits, target = make(10, 257, dtype, device)
        if g == "rows":
            up = torch.tensor([1.0, 0.5, -1.0, 0.0, 2.0, 1.0, 3.0, -0.25, 1.0, 7.0], device=device)
        else:
            up = torch.full((10,), g, device=device) if reduction == "none" else torch.tensor(g, device=device)
        up = up.to(torch.float64 if dtype == torch.float64 else torch.float32)
        x0 = logits.clone().requires_grad_()
        api.fused_cross_entropy(x0, target, reduction=reduction, label_smoothing=0.1).backward(up)
        x1 = logits.clone().requires_grad_()
        loss = api.fused_cross_entropy(x1, target, reduction=reduction, label_smoothing=0.1, grad_in_forward=True)
        g1 = x1.detach().clone()  # the gradient for an upstream gradient of 1
        loss.backward(up)
        assert x1.grad.data_ptr() == x1.data_ptr()
        if dtype == torch.float64:
            torch.testing.assert_close(x1.grad, x0.grad, rtol=1e-14, atol=1e-300)
        elif dtype == torch.float32:
            torch.testing.assert_close(x1.grad, x0.grad, rtol=2e-6, atol=1e-9)
        else:  # one more bf16 rounding than the default mode
            assert rel_rms(x1.grad, x0.grad) <= TOL[torch.bfloat16]
        # rows whose factor is exactly 1 are untouched (same bits), the others are the f32 product
        u = up.reshape(-1) if reduction == "none" else up.reshape(1).expand(10)
        want = (g1.to(torch.float32 if dtype != torch.float64 else dtype) * u[:, None].to(
            torch.float32 if dtype != torch.float64 else dtype)).to(dtype)
        ones = u == 1
        assert torch.equal(x1.grad[ones], g1[ones])
        valid = target != IG
        assert torch.equal(x1.grad[~ones & valid], want[~ones & valid])


@pytest.mark.cuda
@requires_cuda
def test_grad_in_forward_backward_never_syncs():
    """The backward of grad_in_forward reads dloss on the device: no host sync (torch's sync debug mode
    raises on one), for dloss == 1 and != 1 and reduction none. (The forward synchronises once, in the C
    library's target check, which torch's debug mode does not see: it is outside the checked region.)"""
    logits, target = make(64, 4099, torch.bfloat16, "cuda")
    for reduction, g in (("mean", 1.0), ("sum", 0.5), ("none", None)):
        x = logits.clone().requires_grad_()
        up = torch.rand(64, device="cuda") + 0.5 if g is None else torch.tensor(g, device="cuda")
        loss = api.fused_cross_entropy(x, target, reduction=reduction, grad_in_forward=True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss.backward(up)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        ref = logits.clone().requires_grad_()
        api.fused_cross_entropy(ref, target, reduction=reduction).backward(up)
        assert rel_rms(x.grad, ref.grad) <= TOL[torch.bfloat16]


def test_errors_carry_c_message():
    with pytest.raises(strata.StrataError) as e:
        api.fused_cross_entropy(torch.zeros(4, 10), torch.zeros(4, dtype=torch.float32))  # float targets
    assert "target" in str(e.value)
    with pytest.raises(strata.StrataError) as e:
        api.fused_cross_entropy(torch.zeros(4, 10), torch.zeros(5, dtype=torch.int64), check_targets=False)
    assert "target must have shape [4]" in str(e.value)
    with pytest.raises(strata.StrataError) as e:
        api.fused_cross_entropy(torch.zeros(4, 10), torch.zeros(4, dtype=torch.int64), label_smoothing=2.0)
    assert "label_smoothing" in str(e.value)
    with pytest.raises(ValueError):
        api.fused_cross_entropy(torch.zeros(4, 10), torch.zeros(4, dtype=torch.int64), reduction="avg")
