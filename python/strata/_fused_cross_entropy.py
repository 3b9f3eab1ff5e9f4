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

Target values must be in [0, V) or equal ignore_index. The C library checks them itself on the CPU (before
writing anything). On CUDA, ``check_targets=True`` (default; skipped while compiling) makes one cheap check
without stalling the GPU: the min and max of the non-ignored targets are reduced on the device (3 small
kernels, on a side stream that waits for the caller's stream but does not hold it up) and copied to pinned
host memory; the host waits for that copy (one event) only after the loss kernel's launch, and raises
ValueError (naming the first bad row) if a target is out of range. Nothing the
caller owns has been written by then: the default and ``inplace_backward`` forwards write only new tensors,
and the C library's fused forward (``grad_in_forward``) writes no gradient when any target is bad (its own
device-side count, made before the loss kernel), so the logits are left as they were. With
``check_targets=False`` nothing is checked on the host (no sync at all): a bad target then gives a NaN loss
row (and, with grad_in_forward, unchanged logits).
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

def _is_compiling() -> bool:
    comp = getattr(torch, "compiler", None)
    return bool(comp is not None and hasattr(comp, "is_compiling") and comp.is_compiling())


_side_streams = {}


def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    """One side stream per CUDA device for the target check (created on first use, then reused). High priority:
    its few small blocks are dispatched ahead of the loss kernel's pending ones, so the host's wait stays short."""
    s = _side_streams.get(device.index)
    if s is None:
        s = _side_streams[device.index] = torch.cuda.Stream(device=device, priority=-1)
    return s


def _bounds(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    # min and max of the targets with the ignored ones replaced by 0 (a valid value): bad iff min < 0 or
    # max >= V. 3 kernels (eq, where, aminmax) + one for the pair, whatever N.
    t = torch.where(target == ignore_index, 0, target)
    lo, hi = torch.aminmax(t)
    return torch.stack((lo, hi))


class _TargetCheck:
    """The target check (module docstring): started before the loss kernel, finished after its launch.

    On CUDA its small kernels and the copy run on a side stream that waits for the caller's stream (so they see
    the targets as the loss kernel will) but that the caller's stream does not wait for: the loss kernel starts
    without them in front of it (session 7 measured the check at ~0.03 ms of the caller's stream per call)."""

    __slots__ = ("target", "ignore_index", "V", "bounds", "event")

    def __init__(self, target: torch.Tensor, ignore_index: int, V: int):
        self.target, self.ignore_index, self.V = target, ignore_index, V
        self.event = None
        if target.is_cuda:
            main = torch.cuda.current_stream(target.device)
            side = _side_stream(target.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                pair = _bounds(target, ignore_index)  # allocated on (and freed in the order of) the side stream
                self.bounds = torch.empty(2, dtype=target.dtype, pin_memory=True)
                self.bounds.copy_(pair, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record(side)
            # The caller's targets are read on the side stream: their memory must not be reused before that.
            target.record_stream(side)
        else:
            self.bounds = _bounds(target, ignore_index)

    def finish(self) -> None:
        if self.event is not None:
            self.event.synchronize()  # the copy above, queued ahead of the loss kernel (which keeps running)
        lo, hi = self.bounds.tolist()
        if lo >= 0 and hi < self.V:
            return
        t = self.target
        bad = (t != self.ignore_index) & ((t < 0) | (t >= self.V))
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"fused_cross_entropy: target[{i}] must be in [0, {self.V}) (V) or equal ignore_index "
                         f"({self.ignore_index}), got {int(t[i])}")


def _start_check(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> Optional[_TargetCheck]:
    if (_is_compiling() or logits.dim() != 2 or target.dim() != 1 or target.numel() == 0
            or target.dtype not in (torch.int64, torch.int32) or target.device != logits.device):
        return None  # shapes, dtypes and devices are checked by the C library with a message naming the argument
    if target.is_cuda and torch.cuda.is_current_stream_capturing():
        return None  # a CUDA graph being captured cannot wait for the check (the C library's own count still holds)
    return _TargetCheck(target, int(ignore_index), logits.shape[1])


def _run(logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap,
         inplace_backward, grad_in_forward, process_group, check_targets):
    if process_group is not None:
        raise NotImplementedError("strata fused_cross_entropy: process_group (vocab-parallel) is not implemented")
    check = _start_check(logits, target, ignore_index) if check_targets else None
    if check is not None and not check.target.is_cuda:
        check.finish()  # CPU: at once (the C library would reject the target too, before writing anything)
        check = None
    out = _launch(logits, target, reduction, ignore_index, label_smoothing, logit_scale, lse_square_scale, softcap,
                  inplace_backward, grad_in_forward)
    if check is not None:
        check.finish()
    return out


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
