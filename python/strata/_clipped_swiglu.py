"""Strata ops: clipped_swiglu (torch ops in the style of _defs.py, and the public wrappers re-exported by api.py).

The clamped SwiGLU of GPT-OSS and DeepSeek-V4 MoE experts (ops_fused.md §8):
    a = min(A, limit), b = clamp(B, -limit, limit), y = a * sigmoid(alpha * a) * (b + bias) [* probs]
with (A, B) interleaved (GPT-OSS) or split halves (Megatron, DeepSeek)."""

from typing import Optional

import torch

from ._ops import OP, OPS, define, empty, empty_like, launch

__all__ = ["clipped_swiglu", "swiglu", "swiglu_with_limit"]


def _half(x):
    return tuple(x.shape[:-1]) + (x.shape[-1] // 2,)


def _fwd_fake(x, probs, alpha, limit, bias, interleaved):
    return x.new_empty(_half(x))


def _fwd_setup(ctx, inputs, output):
    x, probs, alpha, limit, bias, interleaved = inputs
    ctx.save_for_backward(x, probs)
    ctx.attrs = (alpha, limit, bias, interleaved)


def _fwd_backward(ctx, dy):
    x, probs = ctx.saved_tensors
    need_dp = probs is not None and ctx.needs_input_grad[1]
    dx, dp = OPS["clipped_swiglu_bwd"](x, probs, dy.contiguous(), *ctx.attrs, need_dp)
    return (dx if ctx.needs_input_grad[0] else None, dp if need_dp else None, None, None, None, None)


@define("clipped_swiglu_fwd",
        "(Tensor x, Tensor? probs, float alpha, float limit, float bias, bool interleaved) -> Tensor",
        fake=_fwd_fake, tensor_args=(0, 1), setup_context=_fwd_setup, backward=_fwd_backward)
def _csw_fwd(x, probs, alpha, limit, bias, interleaved):
    y = empty(_half(x), x.dtype, x)
    launch(OP.clipped_swiglu_fwd, (x, probs, y), (alpha, limit, bias, int(interleaved)))
    return y


def _bwd_fake(x, probs, dy, alpha, limit, bias, interleaved, need_dprobs):
    dp = probs.new_empty(probs.shape) if (probs is not None and need_dprobs) else x.new_empty((0,))
    return x.new_empty(x.shape), dp


@define("clipped_swiglu_bwd",
        "(Tensor x, Tensor? probs, Tensor dy, float alpha, float limit, float bias, bool interleaved, "
        "bool need_dprobs) -> (Tensor, Tensor)",
        fake=_bwd_fake, tensor_args=(0, 1, 2))
def _csw_bwd(x, probs, dy, alpha, limit, bias, interleaved, need_dprobs):
    dx = empty_like(x, x.dtype)
    want = probs is not None and need_dprobs
    dp = empty(probs.shape, probs.dtype, x) if want else empty((0,), x.dtype, x)
    launch(OP.clipped_swiglu_bwd, (x, probs, dy, dx, dp if want else None), (alpha, limit, bias, int(interleaved)))
    return dx, dp


def clipped_swiglu(x: torch.Tensor, group_index: Optional[torch.Tensor] = None, dim: int = -1, alpha: float = 1.702,
                   limit: float = 7.0, bias: float = 1.0, interleaved: bool = True,
                   probs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """CANN's `ClippedSwiglu(x, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True)`
    plus an optional fused per-row multiplier `probs` (Megatron's weighted variant: the router probability).

    x [..., 2I, ...] (the pair dimension `dim`) -> y with `dim` halved. interleaved: gate = x[..., 0::2],
    linear = x[..., 1::2]; else gate = first half, linear = second half. probs: x's shape without `dim`.
    group_index is not supported (pass None). Differentiable in x and probs."""
    if group_index is not None:
        raise NotImplementedError("clipped_swiglu: group_index (MoE grouped rows) is not supported; slice x instead")
    nd = x.dim()
    d = dim % nd if nd else 0
    xm = x if d == nd - 1 else x.movedim(d, -1)
    pm = probs
    y = OPS["clipped_swiglu_fwd"](xm, pm, float(alpha), float(limit), float(bias), bool(interleaved))
    return y if d == nd - 1 else y.movedim(-1, d)


def swiglu(x: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """GPT-OSS `swiglu(x, alpha=1.702, limit=7.0)`: interleaved pairs, +1 on the linear half."""
    return clipped_swiglu(x, alpha=alpha, limit=limit, bias=1.0, interleaved=True)


def swiglu_with_limit(x: torch.Tensor, limit: float = 10.0) -> torch.Tensor:
    """MindSpeed-LLM / DeepSeek-V4 `swiglu_with_limit(x, limit)`: split halves, plain SiLU gate (alpha 1), no +1."""
    return clipped_swiglu(x, alpha=1.0, limit=limit, bias=0.0, interleaved=False)
