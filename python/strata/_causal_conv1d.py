"""Strata ops: causal_conv1d (ops_fused.md §5): torch ops (forward, backward, autograd) and the public
wrappers with the argument names of fla (`causal_conv1d`) and Dao-AILab causal-conv1d (`causal_conv1d_fn`).

Conventions (strata/ops/causal_conv1d.h): x [B, T, D] channel-last (any strides; unit channel stride is the
fast path), weight [D, W] (or [W, D] with weight_layout=1), states [N, D, W-1] (Dao's length; fla's length-W
states are accepted and their slot 0, which the convolution never reads, is dropped), cu_seqlens int32/int64
[N+1] with B = 1, or seq_idx [B, T].
"""

from typing import Optional, Tuple

import torch

from ._ops import OP, define, empty, empty_like, launch, OPS

__all__ = ["causal_conv1d", "causal_conv1d_fn", "causal_conv1d_fwd", "causal_conv1d_bwd"]

_ACTS = {None: 0, "silu": 1, "swish": 1}


def _act_code(activation) -> int:
    if isinstance(activation, bool):
        return 1 if activation else 0
    key = activation.lower() if isinstance(activation, str) else activation
    if key not in _ACTS:
        raise ValueError(f"causal_conv1d: activation must be None, 'silu' or 'swish', got {activation!r}")
    return _ACTS[key]


def _width(weight: torch.Tensor, weight_layout: int) -> int:
    return int(weight.shape[1 if weight_layout == 0 else 0]) if weight.dim() == 2 else 0


def _num_states(x: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> int:
    if cu_seqlens is not None:
        return max(int(cu_seqlens.shape[0]) - 1, 0) if cu_seqlens.dim() == 1 else 0
    return int(x.shape[0]) if x.dim() == 3 else 0


def _state_shape(x, weight, cu_seqlens, weight_layout):
    D = int(x.shape[-1]) if x.dim() else 0
    return (_num_states(x, cu_seqlens), D, max(_width(weight, weight_layout) - 1, 0))


# ---------------------------------------------------------------------------------------------------------
# forward: (y, final_state); final_state is an empty [0] tensor unless output_final_state.


def _fwd_fake(x, weight, bias, residual, initial_state, cu_seqlens, seq_idx, output_final_state, activation,
              weight_layout):
    y = x.new_empty(x.shape)
    if output_final_state:
        sdt = initial_state.dtype if initial_state is not None else x.dtype
        return y, x.new_empty(_state_shape(x, weight, cu_seqlens, weight_layout), dtype=sdt)
    return y, x.new_empty((0,))


def _fwd_setup(ctx, inputs, output):
    x, weight, bias, residual, initial_state, cu_seqlens, seq_idx, _, activation, weight_layout = inputs
    ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens, seq_idx)
    ctx.has_residual = residual is not None
    ctx.activation, ctx.weight_layout = activation, weight_layout


def _fwd_backward(ctx, dy, dfinal):
    x, weight, bias, initial_state, cu_seqlens, seq_idx = ctx.saved_tensors
    if dfinal is not None and dfinal.dim() != 3:  # the [0] placeholder of an unrequested final state
        dfinal = None
    dx, dw, db, dh0 = OPS["causal_conv1d_bwd"](x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal,
                                                ctx.activation, ctx.weight_layout)
    return (dx, dw, db if bias is not None else None, dy if ctx.has_residual else None,
            dh0 if initial_state is not None else None, None, None, None, None, None)


@define("causal_conv1d_fwd",
        "(Tensor x, Tensor weight, Tensor? bias, Tensor? residual, Tensor? initial_state, Tensor? cu_seqlens, "
        "Tensor? seq_idx, bool output_final_state, int activation, int weight_layout) -> (Tensor, Tensor)",
        fake=_fwd_fake, tensor_args=(0, 1, 2, 3, 4, 5, 6), setup_context=_fwd_setup, backward=_fwd_backward)
def _conv_fwd(x, weight, bias, residual, initial_state, cu_seqlens, seq_idx, output_final_state, activation,
              weight_layout):
    y = empty_like(x, x.dtype)
    if output_final_state:
        sdt = initial_state.dtype if initial_state is not None else x.dtype
        hT = empty(_state_shape(x, weight, cu_seqlens, weight_layout), sdt, x)
    else:
        hT = empty((0,), x.dtype, x)
    launch(OP.causal_conv1d_fwd,
           (x, weight, bias, residual, initial_state, cu_seqlens, seq_idx, y, hT if output_final_state else None),
           (activation, weight_layout))
    return y, hT


def _bwd_fake(x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal_state, activation, weight_layout):
    return (x.new_empty(x.shape), weight.new_empty(weight.shape),
            bias.new_empty(bias.shape) if bias is not None else x.new_empty((0,)),
            initial_state.new_empty(initial_state.shape) if initial_state is not None else x.new_empty((0,)))


@define("causal_conv1d_bwd",
        "(Tensor x, Tensor weight, Tensor? bias, Tensor? initial_state, Tensor? cu_seqlens, Tensor? seq_idx, "
        "Tensor dy, Tensor? dfinal_state, int activation, int weight_layout) -> (Tensor, Tensor, Tensor, Tensor)",
        fake=_bwd_fake, tensor_args=(0, 1, 2, 3, 4, 5, 6, 7))
def _conv_bwd(x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal_state, activation, weight_layout):
    dx = empty_like(x, x.dtype)
    dw = empty_like(weight, weight.dtype)
    db = empty_like(bias, bias.dtype) if bias is not None else empty((0,), x.dtype, x)
    dh0 = empty_like(initial_state, initial_state.dtype) if initial_state is not None else empty((0,), x.dtype, x)
    launch(OP.causal_conv1d_bwd,
           (x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal_state, dx, dw,
            db if bias is not None else None, dh0 if initial_state is not None else None),
           (activation, weight_layout))
    return dx, dw, db, dh0


# ---------------------------------------------------------------------------------------------------------
# public wrappers


def _state_in(initial_state: Optional[torch.Tensor], W: int) -> Optional[torch.Tensor]:
    # fla keeps W slots (slot 0 is never read by the convolution); Strata's states have W-1.
    if initial_state is not None and initial_state.dim() == 3 and W > 1 and initial_state.shape[-1] == W:
        return initial_state[..., 1:]
    return initial_state


def causal_conv1d_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      residual: Optional[torch.Tensor] = None, initial_state: Optional[torch.Tensor] = None,
                      output_final_state: bool = False, activation: Optional[str] = None,
                      cu_seqlens: Optional[torch.Tensor] = None, seq_idx: Optional[torch.Tensor] = None,
                      weight_layout: int = 0) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The op itself: (y, final_state or None), differentiable in x, weight, bias, residual, initial_state.
    cu_seqlens values (start at 0, never decrease, end at T) are checked by the C library on both devices before
    anything is written (on CUDA from a host copy: one small copy and a synchronisation per call)."""
    W = _width(weight, weight_layout)
    y, hT = OPS["causal_conv1d_fwd"](x, weight, bias, residual, _state_in(initial_state, W), cu_seqlens, seq_idx,
                                     bool(output_final_state), _act_code(activation), int(weight_layout))
    return y, (hT if output_final_state else None)


def causal_conv1d_bwd(x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal_state=None,
                      activation: Optional[str] = None, weight_layout: int = 0):
    """(dx, dweight, dbias, dinitial_state) from the forward's inputs (pre-activation recomputed); dbias /
    dinitial_state are empty tensors when bias / initial_state are None. dresidual is dy."""
    return OPS["causal_conv1d_bwd"](x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dfinal_state,
                                    _act_code(activation), int(weight_layout))


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  residual: Optional[torch.Tensor] = None, initial_state: Optional[torch.Tensor] = None,
                  output_final_state: bool = False, activation: Optional[str] = None, backend: Optional[str] = None,
                  cu_seqlens: Optional[torch.Tensor] = None, seq_idx: Optional[torch.Tensor] = None,
                  weight_layout: Optional[int] = None, **kwargs) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fla's `causal_conv1d`: y = act(conv(x) + bias) (+ residual), x [B, T, D] (B = 1 with cu_seqlens),
    weight [D, W] (MindSpeed's [W, D] with weight_layout=1; a 3-D Megatron weight [D, 1, W] is squeezed),
    initial_state [N, D, W-1] (or fla's [N, D, W]), returns (y, final_state [N, D, W-1] or None).
    backend and fla's other keyword arguments (cu_seqlens_cpu, chunk_indices) are accepted and unused;
    seq_idx [B, T] is Strata's (and Dao's) alternative to cu_seqlens."""
    unknown = set(kwargs) - {"cu_seqlens_cpu", "chunk_indices", "use_fast_conv1d"}
    if unknown:
        raise TypeError(f"causal_conv1d() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    if weight.dim() == 3 and weight.shape[1] == 1:
        weight = weight.squeeze(1)
    layout = 0 if weight_layout is None else int(weight_layout)
    return causal_conv1d_fwd(x, weight, bias, residual, initial_state, output_final_state, activation, cu_seqlens,
                             seq_idx, layout)


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     seq_idx: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
                     return_final_states: bool = False, final_states_out: Optional[torch.Tensor] = None,
                     activation: Optional[str] = None):
    """Dao-AILab's `causal_conv1d_fn`: x [B, D, T] (channel-first, or a channel-last view with
    x.stride(1) == 1), weight [D, W], initial_states [B, D, W-1]; returns out [B, D, T] (a view of a
    channel-last [B, T, D] tensor) and, with return_final_states, (out, final_states [B, D, W-1]), copied into
    final_states_out when given."""
    y, hT = causal_conv1d_fwd(x.transpose(1, 2), weight, bias, None, initial_states, return_final_states,
                              activation, None, seq_idx, 0)
    out = y.transpose(1, 2)
    if not return_final_states:
        return out
    if final_states_out is not None:
        final_states_out.copy_(hT)
        hT = final_states_out
    return out, hT
