"""Strata ops: chunk_gated_delta_rule (Gated DeltaNet, ops_gdn_kda.md §4.12), forward and backward.

Two torch ops:
  strata::chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale, initial_state?, output_final_state, cu_seqlens?,
      use_qk_l2norm_in_kernel) -> (o, final_state)   (final_state is an empty [0] tensor when not asked for)
  strata::chunk_gated_delta_rule_bwd(...) -> (dq, dk, dv, dg, dbeta, dh0)   (dh0 empty without initial_state)
The forward's autograd saves only its inputs; the backward re-computes everything else (as fla does for w, u,
h, v_new). The public wrapper `chunk_gated_delta_rule` has fla's argument names and returns (o, final_state).
"""

from typing import Optional, Tuple

import torch

from ._ops import OP, OPS, define, empty, launch

__all__ = ["chunk_gated_delta_rule"]

_STATE_DTYPE = torch.float32


def _n_seqs(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _state_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else _STATE_DTYPE


def _fwd_fake(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel):
    o = q.new_empty((q.shape[0], q.shape[1], v.shape[2], v.shape[3]), dtype=q.dtype)
    if output_final_state:
        ht = q.new_empty((_n_seqs(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]), dtype=_state_dtype(q))
    else:
        ht = q.new_empty((0,), dtype=_state_dtype(q))
    return o, ht


def _fwd_setup(ctx, inputs, output):
    q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, l2 = inputs
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens)
    ctx.scale, ctx.l2 = scale, l2
    ctx.has_h0 = initial_state is not None


def _fwd_backward(ctx, do, dht):
    q, k, v, g, beta, initial_state, cu_seqlens = ctx.saved_tensors
    if dht is not None and dht.numel() == 0:
        dht = None
    if do is None:
        do = torch.zeros((q.shape[0], q.shape[1], v.shape[2], v.shape[3]), dtype=q.dtype, device=q.device)
    dq, dk, dv, dg, dbeta, dh0 = OPS["chunk_gated_delta_rule_bwd"](
        q, k, v, g, beta, ctx.scale, initial_state, cu_seqlens, do, dht, ctx.l2)
    return dq, dk, dv, dg, dbeta, None, (dh0 if ctx.has_h0 else None), None, None, None


@define("chunk_gated_delta_rule_fwd",
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor? initial_state, "
        "bool output_final_state, Tensor? cu_seqlens, bool use_qk_l2norm_in_kernel) -> (Tensor, Tensor)",
        fake=_fwd_fake, tensor_args=(0, 1, 2, 3, 4, 6, 8), setup_context=_fwd_setup, backward=_fwd_backward)
def _gdn_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel):
    o = empty((q.shape[0], q.shape[1], v.shape[2], v.shape[3]), q.dtype, q)
    if output_final_state:
        ht = empty((_n_seqs(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]), _state_dtype(q), q)
    else:
        ht = empty((0,), _state_dtype(q), q)
    launch(OP.chunk_gated_delta_rule_fwd,
           (q, k, v, g, beta, initial_state, cu_seqlens, o, ht if output_final_state else None),
           (scale, 1 if use_qk_l2norm_in_kernel else 0))
    return o, ht


def _bwd_fake(q, k, v, g, beta, scale, initial_state, cu_seqlens, do, dht, use_qk_l2norm_in_kernel):
    dh0 = (initial_state.new_empty(initial_state.shape, dtype=_state_dtype(q)) if initial_state is not None
           else q.new_empty((0,), dtype=_state_dtype(q)))
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g),
            torch.empty_like(beta), dh0)


@define("chunk_gated_delta_rule_bwd",
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor? initial_state, "
        "Tensor? cu_seqlens, Tensor do, Tensor? dht, bool use_qk_l2norm_in_kernel) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
        fake=_bwd_fake, tensor_args=(0, 1, 2, 3, 4, 6, 7, 8, 9))
def _gdn_bwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, do, dht, use_qk_l2norm_in_kernel):
    dq = empty(q.shape, q.dtype, q)
    dk = empty(k.shape, k.dtype, q)
    dv = empty(v.shape, v.dtype, q)
    dg = empty(g.shape, g.dtype, q)
    dbeta = empty(beta.shape, beta.dtype, q)
    dh0 = empty(initial_state.shape if initial_state is not None else (0,), _state_dtype(q), q)
    launch(OP.chunk_gated_delta_rule_bwd,
           (q, k, v, g, beta, initial_state, cu_seqlens, do, dht, dq, dk, dv, dg, dbeta,
            dh0 if initial_state is not None else None),
           (scale, 1 if use_qk_l2norm_in_kernel else 0))
    return dq, dk, dv, dg, dbeta, dh0


_fwd = OPS["chunk_gated_delta_rule_fwd"]


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                           output_final_state: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                           use_qk_l2norm_in_kernel: bool = False, **kwargs
                           ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gated DeltaNet (fla's chunk_gated_delta_rule): per sequence and value head, with state S [K, V]
    starting at initial_state (or 0):  S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;
    o_t = scale S^T q_t.

    q, k: [B, T, H, K] (K <= 256); v: [B, T, HV, V] with HV a multiple of H (value head hv reads q/k head
    hv // (HV/H)); g (log-space decay), beta: [B, T, HV]; initial_state: [N, HV, K, V] float32;
    cu_seqlens: int64 [N+1] packing N sequences into B = 1. scale defaults to K^-0.5. With
    use_qk_l2norm_in_kernel, q and k are L2-normalised per head vector inside the op (eps 1e-6 in the sqrt).
    Returns (o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None). Differentiable in
    q, k, v, g, beta and initial_state; a gradient may flow into final_state."""
    for name in ("head_first", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first",
                 "use_gate_in_kernel"):
        if kwargs.pop(name, False):
            raise NotImplementedError(f"chunk_gated_delta_rule: {name}=True is not supported by Strata")
    kwargs.pop("cu_seqlens_cpu", None)
    kwargs.pop("chunk_indices", None)
    cs = kwargs.pop("chunk_size", 64)
    if cs != 64:
        raise NotImplementedError(f"chunk_gated_delta_rule: chunk_size must be 64, got {cs}")
    if kwargs:
        raise TypeError(f"chunk_gated_delta_rule: unexpected arguments {sorted(kwargs)}")
    if q.dim() != 4:
        raise ValueError(f"chunk_gated_delta_rule: q must have shape [B, T, H, K], got {list(q.shape)}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if cu_seqlens is not None and cu_seqlens.dtype == torch.int32:
        cu_seqlens = cu_seqlens.to(torch.int64)
    o, ht = _fwd(q, k, v, g, beta, float(scale), initial_state, bool(output_final_state), cu_seqlens,
                 bool(use_qk_l2norm_in_kernel))
    return o, (ht if output_final_state else None)
