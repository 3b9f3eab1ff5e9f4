"""Strata ops: gdn_bwd (torch ops in the style of _defs.py, and the public wrappers re-exported by api.py).

The Gated DeltaNet backward chunk operators (docs/reference/ops_gdn_kda.md §3.2, §4.6, §4.9-§4.11) with fla's
names, argument names and layouts: chunk_bwd_dv_local, chunk_gated_delta_rule_bwd_dhu, chunk_bwd_dqkwg,
prepare_wy_repr_bwd. They are gradients themselves (fla does not differentiate them either), so they have no
autograd. `g` is the chunk-local cumsum of the log gates (γ, float32), as fla passes it to these kernels.
Optional outputs the C ops do not produce come back as None. dg and dh0 are float32 (float64 with float64
inputs, the CPU reference path used by gradient checks).
"""

from typing import Optional, Tuple

import torch

from ._ops import OP, define, empty, empty_like, launch, stat_dtype

__all__ = ["chunk_bwd_dv_local", "chunk_gated_delta_rule_bwd_dhu", "chunk_bwd_dqkwg", "prepare_wy_repr_bwd"]

_NONE = (0,)  # the shape of an absent optional output inside the custom ops (schemas return Tensors)


def _absent(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(_NONE, dtype=torch.float32, device=like.device)


# ---------------------------------------------------------------------------------------------------------
# chunk_bwd_dv_local (§4.9)


def _dv_local_fake(q, k, do, g, cu_seqlens, scale, chunk_size):
    return do.new_empty(do.shape)


@define("chunk_bwd_dv_local",
        "(Tensor q, Tensor k, Tensor do, Tensor? g, Tensor? cu_seqlens, float scale, int chunk_size) -> Tensor",
        fake=_dv_local_fake, tensor_args=(0, 1, 2, 3, 4))
def _dv_local(q, k, do, g, cu_seqlens, scale, chunk_size):
    dv = empty_like(do, do.dtype)
    launch(OP.chunk_bwd_dv_local, (q, k, do, g, cu_seqlens, dv), (scale, chunk_size))
    return dv


# ---------------------------------------------------------------------------------------------------------
# chunk_gated_delta_rule_bwd_dhu (§4.10)


def _dhu_outputs(q, w, do, dv, cu_seqlens, num_chunks, want_dh0, make):
    B, T, _, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
    dh = make((B, num_chunks, HV, K, V), q.dtype)
    dh0 = make((N, HV, K, V), stat_dtype(q.dtype)) if want_dh0 else make(_NONE, torch.float32)
    dv2 = make(tuple(dv.shape), dv.dtype)
    return dh, dh0, dv2


def _dhu_fake(q, k, w, do, dv, g, dht, cu_seqlens, num_chunks, want_dh0, scale, chunk_size):
    return _dhu_outputs(q, w, do, dv, cu_seqlens, num_chunks, want_dh0, lambda s, d: q.new_empty(s, dtype=d))


@define("chunk_gated_delta_rule_bwd_dhu",
        "(Tensor q, Tensor k, Tensor w, Tensor do, Tensor dv, Tensor? g, Tensor? dht, Tensor? cu_seqlens,"
        " int num_chunks, bool want_dh0, float scale, int chunk_size) -> (Tensor, Tensor, Tensor)",
        fake=_dhu_fake, tensor_args=(0, 1, 2, 3, 4, 5, 6, 7))
def _dhu(q, k, w, do, dv, g, dht, cu_seqlens, num_chunks, want_dh0, scale, chunk_size):
    dh, dh0, dv2 = _dhu_outputs(q, w, do, dv, cu_seqlens, num_chunks, want_dh0, lambda s, d: empty(s, d, q))
    launch(OP.chunk_gated_delta_rule_bwd_dhu,
           (q, k, w, do, dv, g, dht, cu_seqlens, dh, dh0 if want_dh0 else None, dv2), (scale, chunk_size))
    return dh, dh0, dv2


# ---------------------------------------------------------------------------------------------------------
# chunk_bwd_dqkwg (§4.11)


def _dqkwg_outputs(q, k, v, want_dw, want_dg, make, g_dtype=torch.float32):
    B, T, _, K = q.shape
    HV = v.shape[2]
    dq = make(tuple(q.shape), q.dtype)
    dk = make(tuple(k.shape), k.dtype)
    dw = make((B, T, HV, K), q.dtype) if want_dw else make(_NONE, torch.float32)
    dg = make((B, T, HV), stat_dtype(g_dtype)) if want_dg else make(_NONE, torch.float32)
    return dq, dk, dw, dg


def _dqkwg_fake(q, k, v, do, h, dh, dv, g, cu_seqlens, want_dw, scale, chunk_size):
    return _dqkwg_outputs(q, k, v, want_dw, g is not None, lambda s, d: q.new_empty(s, dtype=d),
                          g.dtype if g is not None else torch.float32)


@define("chunk_bwd_dqkwg",
        "(Tensor q, Tensor k, Tensor v, Tensor do, Tensor h, Tensor dh, Tensor? dv, Tensor? g, Tensor? cu_seqlens,"
        " bool want_dw, float scale, int chunk_size) -> (Tensor, Tensor, Tensor, Tensor)",
        fake=_dqkwg_fake, tensor_args=(0, 1, 2, 3, 4, 5, 6, 7, 8))
def _dqkwg(q, k, v, do, h, dh, dv, g, cu_seqlens, want_dw, scale, chunk_size):
    want_dg = g is not None
    dq, dk, dw, dg = _dqkwg_outputs(q, k, v, want_dw, want_dg, lambda s, d: empty(s, d, q),
                                    g.dtype if want_dg else torch.float32)
    launch(OP.chunk_bwd_dqkwg, (q, k, v, do, h, dh, dv, g, cu_seqlens, dq, dk, dw if want_dw else None,
                                dg if want_dg else None), (scale, chunk_size))
    return dq, dk, dw, dg


# ---------------------------------------------------------------------------------------------------------
# prepare_wy_repr_bwd (§4.6)


def _wy_outputs(k, v, beta, want_dg, make, g_dtype=torch.float32):
    return (make(tuple(k.shape), k.dtype), make(tuple(v.shape), v.dtype), make(tuple(beta.shape), beta.dtype),
            make(tuple(beta.shape), stat_dtype(g_dtype)) if want_dg else make(_NONE, torch.float32))


def _wy_fake(k, v, beta, A, dw, du, g, cu_seqlens):
    return _wy_outputs(k, v, beta, g is not None, lambda s, d: k.new_empty(s, dtype=d),
                       g.dtype if g is not None else torch.float32)


@define("prepare_wy_repr_bwd",
        "(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dw, Tensor du, Tensor? g, Tensor? cu_seqlens)"
        " -> (Tensor, Tensor, Tensor, Tensor)",
        fake=_wy_fake, tensor_args=(0, 1, 2, 3, 4, 5, 6, 7))
def _wy(k, v, beta, A, dw, du, g, cu_seqlens):
    want_dg = g is not None
    dk, dv, db, dg = _wy_outputs(k, v, beta, want_dg, lambda s, d: empty(s, d, k),
                                 g.dtype if want_dg else torch.float32)
    launch(OP.prepare_wy_repr_bwd, (k, v, beta, A, dw, du, g, cu_seqlens, dk, dv, db, dg if want_dg else None), ())
    return dk, dv, db, dg


# ---------------------------------------------------------------------------------------------------------
# public wrappers (fla's signatures)


def _cu(cu_seqlens: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if cu_seqlens is not None and cu_seqlens.dtype != torch.int64:
        cu_seqlens = cu_seqlens.to(torch.int64)
    return cu_seqlens


def _scale(scale: Optional[float], k: torch.Tensor) -> float:
    return float(k.shape[-1]) ** -0.5 if scale is None else float(scale)


def _unsupported(op: str, **flags) -> None:
    for name, value in flags.items():
        if value is not None and value is not False:
            raise NotImplementedError(f"{op}: {name} is not supported by Strata's GDN backward (got {name}={value!r})")


def _num_chunks(T: int, chunk_size: int, cu_seqlens: Optional[torch.Tensor], chunk_indices, cu_seqlens_cpu) -> int:
    """Chunk count of the chunk-state tensors: ceil(T / BT) per row, or Σ ceil(L_n / BT) for a pack (from
    chunk_indices [NT, 2] or cu_seqlens_cpu without a sync; else from a host copy of cu_seqlens)."""
    if cu_seqlens is None:
        return (T + chunk_size - 1) // chunk_size
    if chunk_indices is not None:
        return int(chunk_indices.shape[0])
    host = (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).detach().to("cpu", torch.int64)
    lens = (host[1:] - host[:-1]).clamp_min(0)
    return int(((lens + chunk_size - 1) // chunk_size).sum())


def chunk_bwd_dv_local(q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, g: Optional[torch.Tensor] = None,
                       g_gamma: Optional[torch.Tensor] = None, A: Optional[torch.Tensor] = None,
                       scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                       chunk_size: int = 64, chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dv_j = scale Σ_{i >= j in the chunk} (q_i·k_j) exp(γ_i − γ_j) do_i (§4.9). q, k [B, T, H, K];
    do [B, T, HV, V]; g = γ [B, T, HV] float32 or None. Returns dv like do."""
    _unsupported("chunk_bwd_dv_local", g_gamma=g_gamma, A=A)
    return _dv_local(q, k, do, g, _cu(cu_seqlens), _scale(scale, k), int(chunk_size))


def chunk_gated_delta_rule_bwd_dhu(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, do: torch.Tensor,
                                   dv: torch.Tensor, g: Optional[torch.Tensor] = None,
                                   gk: Optional[torch.Tensor] = None, h0: Optional[torch.Tensor] = None,
                                   dht: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                                   cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                                   chunk_indices: Optional[torch.Tensor] = None, state_v_first: bool = False,
                                   cu_seqlens_cpu: Optional[torch.Tensor] = None, **kwargs
                                   ) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Reverse-time state gradient (§4.10): returns (dh [B, NT, HV, K, V] in q.dtype, dh0 [N, HV, K, V]
    float32 when h0 is given else None, dv2 like dv). dht None means zero."""
    _unsupported("chunk_gated_delta_rule_bwd_dhu", gk=gk, state_v_first=state_v_first)
    kwargs.pop("use_exp2", None)
    if kwargs:
        raise TypeError(f"chunk_gated_delta_rule_bwd_dhu() got unexpected keyword arguments: {sorted(kwargs)}")
    cu = _cu(cu_seqlens)
    nt = _num_chunks(q.shape[1], int(chunk_size), cu, chunk_indices, cu_seqlens_cpu)
    dh, dh0, dv2 = _dhu(q, k, w, do, dv, g, dht, cu, nt, h0 is not None, _scale(scale, k), int(chunk_size))
    return dh, (dh0 if h0 is not None else None), dv2


def chunk_bwd_dqkwg(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, h: torch.Tensor,
                    dh: torch.Tensor, w: Optional[torch.Tensor] = None, g: Optional[torch.Tensor] = None,
                    g_gamma: Optional[torch.Tensor] = None, dv: Optional[torch.Tensor] = None,
                    scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                    chunk_size: int = 64, chunk_indices: Optional[torch.Tensor] = None, **kwargs):
    """Per-chunk dq, dk (summed over the GVA group), dw and the chunk-local dγ (§4.11): returns
    (dq, dk, dw or None, dg or None). dw = −dv hᵀ is produced when w and dv are given; dg when g is."""
    _unsupported("chunk_bwd_dqkwg", g_gamma=g_gamma, state_v_first=kwargs.pop("state_v_first", False))
    kwargs.pop("use_exp2", None)
    if kwargs:
        raise TypeError(f"chunk_bwd_dqkwg() got unexpected keyword arguments: {sorted(kwargs)}")
    want_dw = w is not None and dv is not None
    dq, dk, dw, dg = _dqkwg(q, k, v, do, h, dh, dv if want_dw else None, g, _cu(cu_seqlens), want_dw,
                            _scale(scale, k), int(chunk_size))
    return dq, dk, (dw if want_dw else None), (dg if g is not None else None)


def prepare_wy_repr_bwd(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, A: torch.Tensor, dw: torch.Tensor,
                        du: torch.Tensor, g: Optional[torch.Tensor] = None,
                        cu_seqlens: Optional[torch.Tensor] = None, chunk_indices: Optional[torch.Tensor] = None,
                        **kwargs):
    """Backward of the WY representation (§4.6): returns (dk [B, T, H, K] summed over the GVA group, dv,
    dbeta, dg or None). The chunk size is A.shape[-1]."""
    kwargs.pop("use_exp2", None)
    if kwargs:
        raise TypeError(f"prepare_wy_repr_bwd() got unexpected keyword arguments: {sorted(kwargs)}")
    dk, dv, db, dg = _wy(k, v, beta, A, dw, du, g, _cu(cu_seqlens))
    return dk, dv, db, (dg if g is not None else None)
