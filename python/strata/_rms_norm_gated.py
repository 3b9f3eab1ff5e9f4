"""Strata ops: rms_norm_gated (torch ops in the style of _defs.py, and the public wrappers re-exported by api.py).

Group-wise RMS norm with a SiLU / sigmoid output gate (ops_fused.md §4): norm-then-gate (fla
FusedRMSNormGated, Gated DeltaNet) or gate-then-norm (Mamba2 RMSNormGated), optional weight, bias, fused
residual add (prenorm) and groups of `group_size` features."""

from typing import Optional, Tuple, Union

import torch

from ._ops import OP, OPS, define, empty, empty_like, launch, stat_dtype

__all__ = ["rms_norm_gated", "RMSNormGated", "FusedRMSNormGated"]

_ACT = {"silu": 0, "swish": 0, "sigmoid": 1}


def _rstd_shape(x, group):
    D = x.shape[-1]
    G = D if group == 0 else group
    return tuple(x.shape[:-1]) + ((D // G) if G > 0 else 0,)


def _fwd_fake(x, z, weight, bias, residual, eps, group, nbg, act, prenorm, residual_dtype):
    ro = x.new_empty(x.shape if prenorm else (0,), dtype=residual_dtype or x.dtype)
    return (x.new_empty(x.shape), x.new_empty(_rstd_shape(x, group), dtype=stat_dtype(x.dtype)), ro)


def _fwd_setup(ctx, inputs, output):
    x, z, weight, bias, residual, eps, group, nbg, act, prenorm, residual_dtype = inputs
    _, rstd, _ = output
    ctx.mark_non_differentiable(rstd)
    # Gradients of outputs that got none stay None instead of zero tensors: autograd would otherwise allocate
    # and fill a zero rstd gradient (and residual_out's) on every backward, two allocations and two fill
    # kernels that the backward never reads (the missing dy / dresidual_out are handled below).
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, z, weight, bias, residual, rstd)
    ctx.group, ctx.nbg, ctx.act, ctx.prenorm = group, nbg, act, prenorm


def _fwd_backward(ctx, dy, drstd, dres_out):
    x, z, weight, bias, residual, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dres = dres_out.contiguous() if (ctx.prenorm and dres_out is not None) else None
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dx, dz, dw, db = OPS["rms_norm_gated_bwd"](x, z, weight, bias, residual, rstd, dy, dres,
                                               ctx.group, ctx.nbg, ctx.act, bool(need[2]), bool(need[3]))
    dresidual = dx.to(residual.dtype) if (residual is not None and need[4]) else None
    return (dx if need[0] else None, dz if need[1] else None, dw if need[2] else None,
            db if need[3] else None, dresidual, None, None, None, None, None, None)


@define("rms_norm_gated_fwd",
        "(Tensor x, Tensor z, Tensor? weight, Tensor? bias, Tensor? residual, float eps, int group_size, "
        "bool norm_before_gate, int activation, bool prenorm, ScalarType? residual_dtype) -> (Tensor, Tensor, Tensor)",
        fake=_fwd_fake, tensor_args=(0, 1, 2, 3, 4), setup_context=_fwd_setup, backward=_fwd_backward)
def _rng_fwd(x, z, weight, bias, residual, eps, group, nbg, act, prenorm, residual_dtype):
    y = empty_like(x, x.dtype)
    rstd = empty(_rstd_shape(x, group), stat_dtype(x.dtype), x)
    ro = empty(x.shape if prenorm else (0,), residual_dtype or x.dtype, x)
    launch(OP.rms_norm_gated_fwd, (x, z, weight, bias, residual, y, ro if prenorm else None, rstd),
           (eps, group, int(nbg), act))
    return y, rstd, ro


def _bwd_fake(x, z, weight, bias, residual, rstd, dy, dres_out, group, nbg, act, need_dw, need_db):
    dw = weight.new_empty(weight.shape) if (weight is not None and need_dw) else x.new_empty((0,))
    db = bias.new_empty(bias.shape) if (bias is not None and need_db) else x.new_empty((0,))
    return x.new_empty(x.shape), x.new_empty(x.shape), dw, db


@define("rms_norm_gated_bwd",
        "(Tensor x, Tensor z, Tensor? weight, Tensor? bias, Tensor? residual, Tensor rstd, Tensor dy, "
        "Tensor? dres_out, int group_size, bool norm_before_gate, int activation, bool need_dweight, "
        "bool need_dbias) -> (Tensor, Tensor, Tensor, Tensor)",
        fake=_bwd_fake, tensor_args=(0, 1, 2, 3, 4, 5, 6, 7))
def _rng_bwd(x, z, weight, bias, residual, rstd, dy, dres_out, group, nbg, act, need_dw, need_db):
    dx = empty_like(x, x.dtype)
    dz = empty_like(x, x.dtype)
    want_dw = weight is not None and need_dw
    want_db = bias is not None and need_db
    dw = empty(weight.shape, weight.dtype, x) if want_dw else empty((0,), x.dtype, x)
    db = empty(bias.shape, bias.dtype, x) if want_db else empty((0,), x.dtype, x)
    launch(OP.rms_norm_gated_bwd,
           (x, z, weight, bias, residual, rstd, dy, dres_out, dx, dz, dw if want_dw else None,
            db if want_db else None), (group, int(nbg), act))
    return dx, dz, dw, db


def _act_code(activation: Union[str, int]) -> int:
    if isinstance(activation, int):
        if activation in (0, 1):
            return activation
    elif activation in _ACT:
        return _ACT[activation]
    raise ValueError(f"rms_norm_gated: activation must be 'silu', 'swish' or 'sigmoid', got {activation!r}")


def rms_norm_gated(x: torch.Tensor, g: torch.Tensor, weight: Optional[torch.Tensor] = None,
                   bias: Optional[torch.Tensor] = None, activation: str = "swish",
                   residual: Optional[torch.Tensor] = None, eps: float = 1e-6, prenorm: bool = False,
                   residual_in_fp32: bool = False, group_size: Optional[int] = None,
                   norm_before_gate: bool = True) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """fla's `rms_norm_gated(x, g, weight, bias, activation, residual, eps, prenorm, residual_in_fp32)`, plus
    Mamba2's `group_size` and `norm_before_gate`.

    norm_before_gate=True (fla, GDN):  y = rmsnorm_g(x) * weight (+ bias) * act(g)
    norm_before_gate=False (Mamba2):   y = rmsnorm_g(x * act(g)) * weight (+ bias)
    rmsnorm_g normalises each group of `group_size` consecutive features (None: the whole last dim) with
    rstd = 1 / sqrt(mean(v^2) + eps). activation: "swish"/"silu" or "sigmoid". With `residual`, x + residual is
    normalised; prenorm=True also returns residual_out = x + residual (float32 if residual_in_fp32).
    x, g: [..., D] float32/bfloat16/float16 (float64 on CPU); weight, bias: [D] or None. Differentiable in x, g,
    weight, bias and residual."""
    if g.shape != x.shape:
        raise ValueError(f"rms_norm_gated: g must have the shape of x {tuple(x.shape)}, got {tuple(g.shape)}")
    act = _act_code(activation)
    group = 0 if group_size is None else int(group_size)
    if residual is not None and residual_in_fp32 and residual.dtype != torch.float64:
        residual = residual.float()
    rdt = None
    if prenorm:
        rdt = torch.float32 if (residual_in_fp32 and x.dtype != torch.float64) else (
            residual.dtype if residual is not None else x.dtype)
    y, _, ro = OPS["rms_norm_gated_fwd"](x, g, weight, bias, residual, float(eps), group, bool(norm_before_gate),
                                         act, bool(prenorm), rdt)
    return (y, ro) if prenorm else y


class RMSNormGated(torch.nn.Module):
    """Mamba2's `RMSNormGated(hidden_size, eps=1e-5, group_size=None, norm_before_gate=False)`;
    forward(x, z) = rms_norm_gated(x, z, weight, None, "silu", eps=eps, group_size=..., norm_before_gate=...)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, device=None, dtype=None):
        super().__init__()
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return rms_norm_gated(x, z, self.weight, None, "silu", eps=self.eps, group_size=self.group_size,
                              norm_before_gate=self.norm_before_gate)


class FusedRMSNormGated(torch.nn.Module):
    """fla's `FusedRMSNormGated(hidden_size, elementwise_affine=True, eps=1e-5, activation="swish")`;
    forward(x, g, residual=None, prenorm=False, residual_in_fp32=False). Norm first, then gate."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device=None, dtype=None):
        super().__init__()
        self.eps, self.activation = eps, activation
        _act_code(activation)
        self.weight = (torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        return rms_norm_gated(x, g, self.weight, None, self.activation, residual=residual, eps=self.eps,
                              prenorm=prenorm, residual_in_fp32=residual_in_fp32)
