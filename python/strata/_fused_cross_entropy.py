"""Strata ops: fused_cross_entropy (ops_fused.md §1): torch ops and the public wrappers re-exported by api.py.

Three ways to get the gradient, which differ only in *when the logits tensor is overwritten*:

* default (``inplace_backward=False``, ``grad_in_forward=False``): the forward saves ``logits`` and ``lse``;
  the backward allocates a new ``dlogits`` [N, V]. Nothing is overwritten. This path is a
  ``torch.library`` custom op (fake + autograd registered), so ``torch.compile`` and ``opcheck`` see it.
* ``inplace_backward=True`` (fla / flash-attn semantics): the forward is the same; the *backward* writes the
  gradient into the logits' own storage and returns that tensor as the gradient. After ``loss.backward()``
  the logits tensor holds d(loss)/d(logits) and its values are gone. No second [N, V] tensor exists.
* ``grad_in_forward=True`` (Liger-Kernel semantics, one fused kernel): when ``logits.requires_grad``, the
  *forward* writes the gradient of the loss (for an upstream gradient of 1) into the logits' storage in the
  same pass that computes the loss: right after the call, ``logits`` holds the gradient. The backward scales
  it in place by the upstream gradient (``grad_output[:, None]`` for reduction "none") with the C op's scale
  mode (the backward op without lse), which reads the upstream gradient on the device and touches nothing
  when it is 1: the backward never waits for the GPU. Use it only when the logits are consumed by nothing
  else (the usual ``logits = h @ W.T`` -> loss).

Both in-place modes bypass torch's version counter (the C library writes through the data pointer), like
fla and Liger; they are plain ``torch.autograd.Function``s (not traced by torch.compile), and their backward
can run only once (a second backward, e.g. with retain_graph, would read the overwritten logits).

Target values must be in [0, V) or equal ignore_index. The C library checks them itself on both devices
before writing anything and raises ValueError naming the first bad row (on CUDA: a one-block count kernel and
one small read-back with a stream synchronisation per call, loss/common/cuda_targets.h; skipped only while a
CUDA graph is being captured, where a bad row gets a NaN loss and the fused forward writes no gradient).
``check_targets`` is accepted for compatibility and has no effect (there is no second, Python-side check).
"""

from typing import Optional, Tuple

import torch

from ._ops import OP, OPS, define, empty, launch

__all__ = ["cross_entropy_loss", "fused_cross_entropy", "FusedCrossEntropyLoss"]

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _stat_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _loss_shape(logits: torch.Tensor, reduction: int):
    return (logits.shape[0],) if reduction == 0 else ()


def _attrs(reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap):
    return (reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap)


# ---------------------------------------------------------------------------------------------------------
# torch ops

def _fwd_fake(logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap):
    sd = _stat_dtype(logits)
    ls = _loss_shape(logits, reduction)
    return (logits.new_empty(ls, dtype=sd), logits.new_empty((logits.shape[0],), dtype=sd),
            logits.new_empty(ls, dtype=sd))


def _fwd_setup(ctx, inputs, output):
    logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap = inputs
    loss, lse, z_loss = output
    ctx.mark_non_differentiable(lse, z_loss)
    ctx.save_for_backward(logits, target, lse)
    ctx.attrs = _attrs(reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap)


def _fwd_backward(ctx, dloss, dlse, dz):
    logits, target, lse = ctx.saved_tensors
    dlogits = OPS["fused_cross_entropy_bwd"](logits, target, lse, dloss.to(lse.dtype).contiguous(), *ctx.attrs)
    return dlogits, None, None, None, None, None, None, None


@define("fused_cross_entropy_fwd",
        "(Tensor logits, Tensor target, int reduction, int ignore_index, float label_smoothing, float logit_scale,"
        " float lse_square_scale, float softcap) -> (Tensor, Tensor, Tensor)",
        fake=_fwd_fake, tensor_args=(0, 1), setup_context=_fwd_setup, backward=_fwd_backward)
def _fwd(logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap):
    loss, lse, z_loss = _fwd_fake(logits, target, reduction, ignore_index, label_smoothing, logit_scale,
                                  lse_square_scale, softcap)
    launch(OP.fused_cross_entropy_fwd, (logits, target, loss, lse, z_loss, None),
           _attrs(reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap) + (1.0,))
    return loss, lse, z_loss


def _bwd_fake(logits, target, lse, dloss, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale,
              softcap):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@define("fused_cross_entropy_bwd",
        "(Tensor logits, Tensor target, Tensor lse, Tensor dloss, int reduction, int ignore_index,"
        " float label_smoothing, float logit_scale, float lse_square_scale, float softcap) -> Tensor",
        fake=_bwd_fake, tensor_args=(0, 1, 2, 3))
def _bwd(logits, target, lse, dloss, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale,
         softcap):
    dlogits = torch.empty_like(logits, memory_format=torch.contiguous_format)
    launch(OP.fused_cross_entropy_bwd, (logits, target, lse, dloss, dlogits),
           _attrs(reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap))
    return dlogits


# ---------------------------------------------------------------------------------------------------------
# in-place modes (autograd.Functions: they write into the logits' storage)

class _InplaceBackward(torch.autograd.Function):
    """fla semantics: forward as the default op; backward overwrites the logits with their gradient."""

    @staticmethod
    def forward(ctx, logits, target, *attrs):
        loss, lse, z_loss = _fwd(logits, target, *attrs)
        ctx.mark_non_differentiable(lse, z_loss)
        ctx.save_for_backward(logits, target, lse)
        ctx.attrs = attrs
        return loss, lse, z_loss

    @staticmethod
    def backward(ctx, dloss, dlse, dz):
        logits, target, lse = ctx.saved_tensors
        dloss = dloss.to(lse.dtype).contiguous()
        launch(OP.fused_cross_entropy_bwd, (logits, target, lse, dloss, logits), tuple(ctx.attrs))
        # A fresh alias (.detach()) of the logits' storage, not the saved tensor itself: the leaf the caller
        # holds shares the saved TensorImpl, so AccumulateGrad would see use_count > 1 and clone [N, V] into
        # .grad; the alias is referenced only here, so it is stolen and .grad aliases the logits (no copy).
        return (logits.detach(), None) + (None,) * len(ctx.attrs)


class _GradInForward(torch.autograd.Function):
    """Liger semantics: one fused kernel writes the loss and, in the logits' storage, the gradient for an
    upstream gradient of 1; the backward rescales it in place when the upstream gradient differs."""

    @staticmethod
    def forward(ctx, logits, target, *attrs):
        loss, lse, z_loss = _fwd_fake(logits, target, *attrs)
        launch(OP.fused_cross_entropy_fwd, (logits, target, loss, lse, z_loss, logits), tuple(attrs) + (1.0,))
        ctx.mark_non_differentiable(lse, z_loss)
        ctx.save_for_backward(logits, target)
        ctx.attrs = attrs
        return loss, lse, z_loss

    @staticmethod
    def backward(ctx, dloss, dlse, dz):
        logits, target = ctx.saved_tensors
        grad = logits.detach()  # an alias of the logits' storage (see _InplaceBackward.backward)
        # The backward op's scale mode (lse omitted): grad *= dloss (row i by dloss[i] for "none") in f32 on the
        # device; dloss is never read on the host, and dloss == 1 (or a row's 1) touches nothing.
        dloss = dloss.to(_stat_dtype(grad)).contiguous()
        launch(OP.fused_cross_entropy_bwd, (grad, target, None, dloss, grad), tuple(ctx.attrs))
        return (grad, None) + (None,) * len(ctx.attrs)


# ---------------------------------------------------------------------------------------------------------
# public wrappers

def _run(logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap,
         inplace_backward, grad_in_forward, process_group, check_targets):
    if process_group is not None:
        raise NotImplementedError("strata fused_cross_entropy: process_group (vocab-parallel) is not implemented")
    del check_targets  # the C library checks the targets (module docstring)
    return _launch(logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap,
                   inplace_backward, grad_in_forward)


def _launch(logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap,
            inplace_backward, grad_in_forward):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"fused_cross_entropy: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    attrs = (_REDUCTIONS[reduction], int(ignore_index), float(label_smoothing), float(logit_scale),
             float(lse_square_scale), float(softcap or 0.0))
    needs_grad = logits.requires_grad and torch.is_grad_enabled()
    if needs_grad and grad_in_forward:
        return _GradInForward.apply(logits, target, *attrs)
    if needs_grad and inplace_backward:
        return _InplaceBackward.apply(logits, target, *attrs)
    return OPS["fused_cross_entropy_fwd"](logits, target, *attrs)


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
                       logit_scale: float = 1.0, lse_square_scale: float = 0.0, ignore_index: int = -100,
                       inplace_backward: bool = False, process_group=None,
                       logit_softcapping: Optional[float] = None,
                       check_targets: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """fla's functional form: per-row ``(losses [N], z_losses [N])`` in fp32 (z_losses for logging; their
    gradient is not propagated). ``logits_softcapping`` None or > 0."""
    loss, _, z = _run(logits, labels, "none", ignore_index, label_smoothing, logit_scale, lse_square_scale,
                      logit_softcapping, inplace_backward, False, process_group, check_targets)
    return loss, z


def fused_cross_entropy(input: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                        lse_square_scale: float = 0.0, label_smoothing: float = 0.0, reduction: str = "mean",
                        softcap: Optional[float] = None, return_z_loss: bool = False, logit_scale: float = 1.0,
                        inplace_backward: bool = False, grad_in_forward: bool = False, return_lse: bool = False,
                        check_targets: bool = True):
    """Liger-style functional form (LigerCrossEntropyFunction's argument names): the reduced loss, plus
    z_loss (if return_z_loss) and lse [N] (if return_lse). mean over zero non-ignored rows is 0.
    See the module docstring for inplace_backward / grad_in_forward."""
    loss, lse, z = _run(input, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale,
                        softcap, inplace_backward, grad_in_forward, None, check_targets)
    out = (loss,)
    if return_z_loss:
        out += (z,)
    if return_lse:
        out += (lse,)
    return out[0] if len(out) == 1 else out


class FusedCrossEntropyLoss(torch.nn.Module):
    """fla's module: ``FusedCrossEntropyLoss(ignore_index=-100, reduction="mean", label_smoothing=0.0,
    logit_scale=1.0, lse_square_scale=0.0, logit_softcapping=None, inplace_backward=False,
    process_group=None, return_z_loss=False)``; ``forward(input [N, V], target [N])`` returns the reduced
    loss (and the reduced z_loss when return_z_loss). Extra: ``grad_in_forward`` (Liger semantics)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 logit_scale: float = 1.0, lse_square_scale: float = 0.0, logit_softcapping: Optional[float] = None,
                 inplace_backward: bool = False, process_group=None, return_z_loss: bool = False,
                 grad_in_forward: bool = False):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise NotImplementedError("Only support reduction = 'mean', 'sum' or 'none'")
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.logit_scale = logit_scale
        self.lse_square_scale = lse_square_scale
        self.logit_softcapping = logit_softcapping
        self.inplace_backward = inplace_backward
        self.process_group = process_group
        self.return_z_loss = return_z_loss
        self.grad_in_forward = grad_in_forward

    def forward(self, input: torch.Tensor, target: torch.Tensor):
        loss, _, z = _run(input, target, self.reduction, self.ignore_index, self.label_smoothing,
                          self.logit_scale, self.lse_square_scale, self.logit_softcapping, self.inplace_backward,
                          self.grad_in_forward, self.process_group, True)
        return (loss, z) if self.return_z_loss else loss
