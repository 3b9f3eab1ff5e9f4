"""Strata ops: chunk_loss (torch ops in the style of _defs.py, and the public wrappers re-exported by api.py).

chunk_loss fuses the LM head and the cross entropy (ops_fused.md §2): loss of hidden . weight^T (+ bias)
against target without storing the [N, V] logits. Two torch ops:

  strata::chunk_loss      forward; with with_grad it also returns the gradients of the loss (computed in the
                          same call: "gradient in forward"); its backward multiplies them by the upstream
                          gradient. Without with_grad it returns lse for:
  strata::chunk_loss_bwd  gradients by recomputation from lse and the upstream gradient (vocab_tiled).

The public wrappers pick: strategy "vocab_tiled" takes the recompute route (forward saves lse only, the
GEMMs are redone in backward); "auto" and "token_chunked" compute the gradients in the forward call (the C
plan then picks token_chunked or vocab_tiled loops by its heuristic, README.md). As with every
gradient-in-forward implementation (Liger, fla), the loss must be used once (its gradient is a scalar).
"""

from typing import Optional

import torch

from ._ops import OP, OPS, define, empty, launch

__all__ = ["chunk_loss", "fused_linear_cross_entropy_loss", "linear_cross_entropy"]

_STRATEGIES = {"auto": 0, "token_chunked": 1, "vocab_tiled": 2}
_REDUCTIONS = {"mean": 0, "sum": 1}


def _attrs(ignore_index, reduction, eps, scale, softcap, zloss, strategy, chunk_rows, vocab_tile):
    return (ignore_index, reduction, eps, scale, softcap, zloss, strategy, (chunk_rows << 32) + vocab_tile)


def _grad_dtype(t: torch.Tensor, f32: bool) -> torch.dtype:
    return torch.float32 if f32 and t.dtype != torch.float64 else t.dtype


def _stat(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _none_like(t):
    return t.new_empty((0,))


# ---------------------------------------------------------------------------------------------------------
# forward (+ gradients in forward)


def _fwd_fake(hidden, weight, bias, target, ignore_index, reduction, eps, scale, softcap, zloss, strategy,
              chunk_rows, vocab_tile, with_grad, grad_f32):
    loss = hidden.new_empty((), dtype=_stat(hidden))
    lse = hidden.new_empty((hidden.shape[0],), dtype=_stat(hidden))
    if not with_grad:
        return loss, lse, _none_like(hidden), _none_like(hidden), _none_like(hidden)
    dh = hidden.new_empty(hidden.shape, dtype=_grad_dtype(hidden, grad_f32))
    dw = weight.new_empty(weight.shape, dtype=_grad_dtype(weight, grad_f32))
    db = weight.new_empty((weight.shape[0],) if bias is not None else (0,), dtype=_grad_dtype(weight, grad_f32))
    return loss, lse, dh, dw, db


def _fwd_setup(ctx, inputs, output):
    hidden, weight, bias, target = inputs[:4]
    loss, lse, dh, dw, db = output
    ctx.mark_non_differentiable(lse, dh, dw, db)
    # Without this, autograd hands backward zero-filled gradients for every output the graph does not use: a
    # zeros [N, D] and a zeros [V, D] for dh / dw (session 5 run 2: 1.2 GiB extra at N=8192 V=151936).
    ctx.set_materialize_grads(False)
    ctx.with_grad = inputs[13]
    ctx.has_bias = bias is not None
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.attrs = inputs[4:13]
    if ctx.with_grad:
        ctx.save_for_backward(dh, dw, db)
    else:
        ctx.save_for_backward(hidden, weight, bias, target, lse)


def _traced(t: torch.Tensor) -> bool:
    """True while torch.compile / AOTAutograd traces (fake or functional tensor subclasses, or dynamo)."""
    comp = getattr(torch, "compiler", None)
    return type(t) is not torch.Tensor or bool(comp is not None and hasattr(comp, "is_compiling")
                                               and comp.is_compiling())


def _scaled_grad(grad: torch.Tensor, g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gradient computed in the forward (for an upstream gradient of 1) times the upstream gradient g, in
    the input's dtype, without a copy in eager mode: scaled in place (skipped when g == 1: the usual
    loss.backward()), and returned as a fresh alias (.detach()) so that AccumulateGrad, seeing it referenced
    nowhere else, steals it into .grad instead of cloning it. A gradient held in f32 (grad_f32) is converted
    once here. While tracing (torch.compile) the functional form is used."""
    if _traced(g) or _traced(grad):
        return (grad * g).to(dtype)
    # One small device-to-host read (the forward already synchronises for its target check). A Python float
    # multiplies a 16-bit tensor in f32 and rounds once, in place: g itself is not rounded to bf16 first.
    gv = float(g)
    if gv != 1.0:
        grad.mul_(gv)
    return grad.detach() if grad.dtype == dtype else grad.to(dtype)


def _fwd_backward(ctx, dloss, dlse, ddh, ddw, ddb):
    if dloss is None:  # (materialize_grads off) the loss is not in the graph being differentiated
        return (None,) * 15
    if ctx.with_grad:
        dh, dw, db = ctx.saved_tensors
        g = dloss.to(torch.float32 if dh.dtype != torch.float64 else torch.float64)
        out_h = _scaled_grad(dh, g, ctx.dtypes[0])
        out_w = _scaled_grad(dw, g, ctx.dtypes[1])
        out_b = _scaled_grad(db, g, ctx.dtypes[2]) if ctx.has_bias else None
    else:
        hidden, weight, bias, target, lse = ctx.saved_tensors
        out_h, out_w, out_b = OPS["chunk_loss_bwd"](hidden, weight, bias, target, lse, dloss.to(lse.dtype),
                                                    *ctx.attrs)
        if not ctx.has_bias:
            out_b = None
    return (out_h, out_w, out_b, None) + (None,) * 11  # target, then the 11 non-tensor arguments


@define("chunk_loss",
        "(Tensor hidden, Tensor weight, Tensor? bias, Tensor target, int ignore_index, int reduction, float eps, "
        "float scale, float softcap, float zloss, int strategy, int chunk_rows, int vocab_tile, bool with_grad, "
        "bool grad_f32) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        fake=_fwd_fake, tensor_args=(0, 1, 2, 3), setup_context=_fwd_setup, backward=_fwd_backward)
def _chunk_loss(hidden, weight, bias, target, ignore_index, reduction, eps, scale, softcap, zloss, strategy,
                chunk_rows, vocab_tile, with_grad, grad_f32):
    loss = empty((), _stat(hidden), hidden)
    lse = empty((hidden.shape[0],), _stat(hidden), hidden)
    if with_grad:
        dh = empty(hidden.shape, _grad_dtype(hidden, grad_f32), hidden)
        dw = empty(weight.shape, _grad_dtype(weight, grad_f32), weight)
        db = empty((weight.shape[0],) if bias is not None else (0,), _grad_dtype(weight, grad_f32), weight)
    else:
        dh, dw, db = _none_like(hidden), _none_like(hidden), _none_like(hidden)
    launch(OP.chunk_loss,
           (hidden, weight, bias, target, loss, lse, dh if with_grad else None, dw if with_grad else None,
            db if with_grad and bias is not None else None),
           _attrs(ignore_index, reduction, eps, scale, softcap, zloss, strategy, chunk_rows, vocab_tile))
    return loss, lse, dh, dw, db


# ---------------------------------------------------------------------------------------------------------
# backward by recomputation


def _bwd_fake(hidden, weight, bias, target, lse, dloss, ignore_index, reduction, eps, scale, softcap, zloss,
              strategy, chunk_rows, vocab_tile):
    return (hidden.new_empty(hidden.shape), weight.new_empty(weight.shape),
            weight.new_empty((weight.shape[0],) if bias is not None else (0,)))


@define("chunk_loss_bwd",
        "(Tensor hidden, Tensor weight, Tensor? bias, Tensor target, Tensor lse, Tensor dloss, int ignore_index, "
        "int reduction, float eps, float scale, float softcap, float zloss, int strategy, int chunk_rows, "
        "int vocab_tile) -> (Tensor, Tensor, Tensor)",
        fake=_bwd_fake, tensor_args=(0, 1, 2, 3, 4, 5))
def _chunk_loss_bwd(hidden, weight, bias, target, lse, dloss, ignore_index, reduction, eps, scale, softcap, zloss,
                    strategy, chunk_rows, vocab_tile):
    dh = empty(hidden.shape, hidden.dtype, hidden)
    dw = empty(weight.shape, weight.dtype, weight)
    db = empty((weight.shape[0],) if bias is not None else (0,), weight.dtype, weight)
    launch(OP.chunk_loss_bwd,
           (hidden, weight, bias, target, lse, dloss.reshape(()).contiguous(), dh, dw,
            db if bias is not None else None),
           _attrs(ignore_index, reduction, eps, scale, softcap, zloss, strategy, chunk_rows, vocab_tile))
    return dh, dw, db


# ---------------------------------------------------------------------------------------------------------
# public wrappers


def chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: Optional[torch.Tensor] = None,
               ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
               logit_scale: float = 1.0, softcap: Optional[float] = None, lse_square_scale: float = 0.0,
               chunk_tokens: Optional[int] = None, vocab_tile: Optional[int] = None, strategy: str = "auto",
               accumulate_grad_in_fp32: bool = True, return_lse: bool = False, hold_grad_in_fp32: bool = False):
    """Cross entropy of the LM head hidden [..., D] . weight[V, D]^T (+ bias [V]) against labels [...] (int64),
    without storing the [N, V] logits (ops_fused.md §2, the recommended API there).

    reduction "mean" (over rows whose label is not ignore_index; 0 when there is none) or "sum".
    label_smoothing eps, logit_scale s, softcap (Gemma-2 tanh capping; None = off), lse_square_scale (z-loss)
    as in fla/Liger. strategy: "auto", "token_chunked" (gradients in forward, 3 GEMMs) or "vocab_tiled"
    (recompute in backward, 4 GEMMs); chunk_tokens / vocab_tile override the sizes the plan picks from its
    64 MiB budget. Differentiable in hidden, weight and bias. Returns loss (f32 scalar), and lse [N] f32 with
    return_lse.

    Memory: the op accumulates in f32 inside (in its workspace, or in the gradient buffers' own storage) and
    rounds each gradient once into the inputs' dtype, so by default ("auto" / "token_chunked") the forward
    writes the gradients in that dtype and the backward hands the very same buffers to .grad (scaled in place
    when the upstream gradient is not 1): the peak is the gradients + the op's workspace (<= 64 MiB on CUDA
    with bf16 inputs and on every device with f32 inputs; README.md "Workspace").
    accumulate_grad_in_fp32 (ops_fused.md §2: dW accumulated in f32) is always the case, so False is accepted
    and changes nothing (the result is as accurate as with True). hold_grad_in_fp32=True holds f32 gradients
    from forward to backward instead (for 16-bit inputs: about twice the gradients' memory and a conversion
    in backward; the result differs only when the upstream gradient is not 1, by one rounding; on CUDA with
    bf16 inputs an f32 dweight lets the plan keep more logits tiles, README.md)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"chunk_loss: reduction must be 'mean' or 'sum', got {reduction!r}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"chunk_loss: strategy must be one of {sorted(_STRATEGIES)}, got {strategy!r}")
    h = hidden.reshape(-1, hidden.shape[-1])
    t = labels.reshape(-1)
    if t.shape[0] != h.shape[0]:
        raise ValueError(f"chunk_loss: labels must have {h.shape[0]} elements (hidden rows), got {tuple(labels.shape)}")
    needs_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (hidden, weight, bias))
    strat = _STRATEGIES[strategy]
    with_grad = needs_grad and strategy != "vocab_tiled"
    loss, lse = OPS["chunk_loss"](
        h, weight, bias, t, int(ignore_index), _REDUCTIONS[reduction], float(label_smoothing), float(logit_scale),
        0.0 if softcap is None else float(softcap), float(lse_square_scale), strat, int(chunk_tokens or 0),
        int(vocab_tile or 0), with_grad, bool(hold_grad_in_fp32))[:2]
    return (loss, lse) if return_lse else loss


def fused_linear_cross_entropy_loss(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
                                    bias: Optional[torch.Tensor] = None, ignore_index: int = -100,
                                    label_smoothing: float = 0.0, logit_scale: float = 1.0,
                                    logit_softcapping: Optional[float] = None, num_chunks: Optional[int] = None,
                                    reduction: str = "mean", accumulate_grad_in_fp32: bool = True) -> torch.Tensor:
    """fla's fused_linear_cross_entropy_loss argument names. num_chunks (fla's token chunk count) is mapped to
    chunk rows ceil(N / num_chunks); None lets the plan choose. accumulate_grad_in_fp32 (fla: accumulate dW
    over the chunks in f32) is always the case inside this op (see chunk_loss)."""
    n = x.numel() // x.shape[-1] if x.shape[-1] else 0
    rows = -(-n // num_chunks) if num_chunks else None
    return chunk_loss(x, weight, target, bias, ignore_index=ignore_index, reduction=reduction,
                      label_smoothing=label_smoothing, logit_scale=logit_scale, softcap=logit_softcapping,
                      chunk_tokens=rows, accumulate_grad_in_fp32=accumulate_grad_in_fp32)


def linear_cross_entropy(e: torch.Tensor, c: torch.Tensor, targets: torch.Tensor, bias: Optional[torch.Tensor] = None,
                         ignore_index: int = -100, softcap: Optional[float] = None,
                         reduction: str = "mean") -> torch.Tensor:
    """Apple Cut-Cross-Entropy's linear_cross_entropy argument names (exact: no gradient filtering, no shift);
    the vocab-tiled route with recomputation in backward, like CCE."""
    return chunk_loss(e, c, targets, bias, ignore_index=ignore_index, reduction=reduction, softcap=softcap,
                      strategy="vocab_tiled")
