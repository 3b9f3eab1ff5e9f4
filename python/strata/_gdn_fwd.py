"""Strata ops: gdn_fwd (torch ops in the style of _defs.py, and the public wrappers re-exported by api.py).

The Gated DeltaNet forward chunk operators (docs/reference/ops_gdn_kda.md §4.3-§4.8) with fla's argument
names: chunk_scaled_dot_kkt_fwd, solve_tril, recompute_w_u_fwd, prepare_wy_repr_fwd,
chunk_gated_delta_rule_fwd_h, chunk_fwd_o. They are building blocks of chunk_gated_delta_rule (which owns
the autograd); each is a torch custom op with a fake implementation (torch.compile traces it) and no
backward of its own. Layouts are fla's (sequence first): q, k [B,T,H,K]; v [B,T,HV,V]; g (the chunk-local
cumsum γ), beta [B,T,HV]; A [B,T,HV,BT]; h [B,NT,HV,K,V]; states [N,HV,K,V] float32.
"""

from typing import Optional, Tuple

import torch

from ._ops import OP, define, empty, launch

__all__ = [
    "chunk_scaled_dot_kkt",
    "chunk_scaled_dot_kkt_fwd",
    "solve_tril",
    "recompute_w_u_fwd",
    "prepare_wy_repr_fwd",
    "chunk_gated_delta_rule_fwd_h",
    "chunk_fwd_o",
]


def _check_cu_seqlens(cu_seqlens: Optional[torch.Tensor], T: int, B: int, op: str):
    """Host check of the cu_seqlens values (the CUDA kernels cannot read them without a sync) and the
    number of chunks per sequence. Returns the list of sequence lengths (or None)."""
    if cu_seqlens is None:
        return None
    if B != 1:
        raise ValueError(f"{op}: with cu_seqlens the batch size must be 1, got {B}")
    cu = cu_seqlens.tolist()
    if len(cu) < 1 or cu[0] != 0:
        raise ValueError(f"{op}: cu_seqlens[0] must be 0, got {cu[:1]}")
    for i in range(len(cu) - 1):
        if cu[i + 1] < cu[i]:
            raise ValueError(f"{op}: cu_seqlens must be non-decreasing, got cu_seqlens[{i + 1}] = {cu[i + 1]} "
                             f"after cu_seqlens[{i}] = {cu[i]}")
    if cu[-1] != T:
        raise ValueError(f"{op}: the last entry cu_seqlens[{len(cu) - 1}] must equal T = {T}, got {cu[-1]}")
    return [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]


def _num_chunks(T: int, B: int, chunk_size: int, cu_seqlens: Optional[torch.Tensor], op: str) -> int:
    lens = _check_cu_seqlens(cu_seqlens, T, B, op)
    if lens is None:
        return (T + chunk_size - 1) // chunk_size
    return sum((n + chunk_size - 1) // chunk_size for n in lens)


# ---- chunk_scaled_dot_kkt ----


def _kkt_fake(k, g, beta, cu_seqlens, chunk_size, output_dtype):
    return k.new_empty((beta.shape[0], beta.shape[1], beta.shape[2], chunk_size), dtype=output_dtype)


@define("chunk_scaled_dot_kkt",
        "(Tensor k, Tensor? g, Tensor beta, Tensor? cu_seqlens, int chunk_size, ScalarType output_dtype) -> Tensor",
        fake=_kkt_fake, tensor_args=(0, 1, 2, 3))
def _kkt(k, g, beta, cu_seqlens, chunk_size, output_dtype):
    A = empty((beta.shape[0], beta.shape[1], beta.shape[2], chunk_size), output_dtype, k)
    launch(OP.chunk_scaled_dot_kkt, (k, g, beta, cu_seqlens, A), (chunk_size,))
    return A


# ---- solve_tril ----


def _solve_fake(A, cu_seqlens, output_dtype):
    return A.new_empty(A.shape, dtype=output_dtype)


@define("solve_tril", "(Tensor A, Tensor? cu_seqlens, ScalarType output_dtype) -> Tensor",
        fake=_solve_fake, tensor_args=(0, 1))
def _solve(A, cu_seqlens, output_dtype):
    Ai = empty(A.shape, output_dtype, A)
    launch(OP.solve_tril, (A, cu_seqlens, Ai), ())
    return Ai


# ---- recompute_w_u_fwd ----


def _wu_fake(k, v, beta, A, g, cu_seqlens):
    return (k.new_empty((k.shape[0], k.shape[1], v.shape[2], k.shape[3])), v.new_empty(v.shape))


@define("recompute_w_u_fwd",
        "(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor? g, Tensor? cu_seqlens) -> (Tensor, Tensor)",
        fake=_wu_fake, tensor_args=(0, 1, 2, 3, 4, 5))
def _wu(k, v, beta, A, g, cu_seqlens):
    w = empty((k.shape[0], k.shape[1], v.shape[2], k.shape[3]), k.dtype, k)
    u = empty(v.shape, v.dtype, k)
    launch(OP.recompute_w_u_fwd, (k, v, beta, A, g, cu_seqlens, w, u), ())
    return w, u


# ---- prepare_wy_repr_fwd ----


def _wy_fake(k, v, g, beta, cu_seqlens, chunk_size, A_dtype):
    B, T, HV = k.shape[0], k.shape[1], v.shape[2]
    return (k.new_empty((B, T, HV, k.shape[3])), v.new_empty(v.shape), k.new_empty((B, T, HV, chunk_size), dtype=A_dtype))


@define("prepare_wy_repr_fwd",
        "(Tensor k, Tensor v, Tensor? g, Tensor beta, Tensor? cu_seqlens, int chunk_size, ScalarType A_dtype)"
        " -> (Tensor, Tensor, Tensor)",
        fake=_wy_fake, tensor_args=(0, 1, 2, 3, 4))
def _wy(k, v, g, beta, cu_seqlens, chunk_size, A_dtype):
    B, T, HV = k.shape[0], k.shape[1], v.shape[2]
    w = empty((B, T, HV, k.shape[3]), k.dtype, k)
    u = empty(v.shape, v.dtype, k)
    A = empty((B, T, HV, chunk_size), A_dtype, k)
    launch(OP.prepare_wy_repr_fwd, (k, v, g, beta, cu_seqlens, w, u, A), (chunk_size,))
    return w, u, A


# ---- chunk_gated_delta_rule_fwd_h ----


def _state_dtype(k):
    # States are float32 (float64 only for float64 inputs on the CPU, e.g. gradcheck).
    return torch.float64 if k.dtype == torch.float64 else torch.float32


def _h_shapes(k, u, num_chunks, n_seqs):
    B, T, K = k.shape[0], k.shape[1], k.shape[3]
    HV, V = u.shape[2], u.shape[3]
    return (B, num_chunks, HV, K, V), (n_seqs, HV, K, V)


def _fwd_h_fake(k, w, u, g, initial_state, cu_seqlens, chunk_size, num_chunks, output_final_state):
    n = k.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    hs, ss = _h_shapes(k, u, num_chunks, n)
    return (k.new_empty(hs), u.new_empty(u.shape),
            k.new_empty(ss if output_final_state else (0,), dtype=_state_dtype(k)))


@define("chunk_gated_delta_rule_fwd_h",
        "(Tensor k, Tensor w, Tensor u, Tensor? g, Tensor? initial_state, Tensor? cu_seqlens, int chunk_size,"
        " int num_chunks, bool output_final_state) -> (Tensor, Tensor, Tensor)",
        fake=_fwd_h_fake, tensor_args=(0, 1, 2, 3, 4, 5))
def _fwd_h(k, w, u, g, initial_state, cu_seqlens, chunk_size, num_chunks, output_final_state):
    n = k.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    hs, ss = _h_shapes(k, u, num_chunks, n)
    h = empty(hs, k.dtype, k)
    v_new = empty(u.shape, u.dtype, k)
    ht = empty(ss if output_final_state else (0,), _state_dtype(k), k)
    launch(OP.chunk_gated_delta_rule_fwd_h,
           (k, w, u, g, initial_state, cu_seqlens, h, v_new, ht if output_final_state else None), (chunk_size,))
    return h, v_new, ht


# ---- chunk_fwd_o ----


def _o_fake(q, k, v, h, g, cu_seqlens, scale, chunk_size):
    return v.new_empty(v.shape)


@define("chunk_fwd_o",
        "(Tensor q, Tensor k, Tensor v, Tensor h, Tensor? g, Tensor? cu_seqlens, float scale, int chunk_size)"
        " -> Tensor",
        fake=_o_fake, tensor_args=(0, 1, 2, 3, 4, 5))
def _o(q, k, v, h, g, cu_seqlens, scale, chunk_size):
    o = empty(v.shape, v.dtype, q)
    launch(OP.chunk_fwd_o, (q, k, v, h, g, cu_seqlens, o), (scale, chunk_size))
    return o


# ---------------------------------------------------------------------------------------------------------
# public wrappers (fla's names and argument names; chunk_indices is accepted and unused: Strata enumerates
# the chunks itself without a host table)


def chunk_scaled_dot_kkt(k: torch.Tensor, g: Optional[torch.Tensor] = None, beta: Optional[torch.Tensor] = None,
                         cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                         output_dtype: torch.dtype = torch.float32,
                         chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A [B,T,HV,BT]: A[s+i, hv, j] = beta_i (k_i . k_j) exp(g_i - g_j) for j < i inside each chunk, else 0.
    k [B,T,H,K]; g = chunk-local cumsum of the log gates [B,T,HV] (or None); beta [B,T,HV] (HV from beta)."""
    if beta is None:
        raise ValueError("chunk_scaled_dot_kkt: beta is required")
    if cu_seqlens is not None:
        _check_cu_seqlens(cu_seqlens, k.shape[1], k.shape[0], "chunk_scaled_dot_kkt")
    return OPS_kkt(k, g, beta, cu_seqlens, chunk_size, output_dtype)


chunk_scaled_dot_kkt_fwd = chunk_scaled_dot_kkt


def solve_tril(A: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
               chunk_indices: Optional[torch.Tensor] = None,
               output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(I + StrictLower(A))^-1 per chunk of BT = A.shape[-1] in {16, 32, 64} rows; A [B,T,H,BT]."""
    if cu_seqlens is not None:
        _check_cu_seqlens(cu_seqlens, A.shape[1], A.shape[0], "solve_tril")
    return OPS_solve(A, cu_seqlens, output_dtype)


def recompute_w_u_fwd(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, A: torch.Tensor,
                      g: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                      chunk_indices: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(w, u) = (A diag(beta exp(g)) K, A diag(beta) V) per chunk; w in k.dtype, u in v.dtype."""
    if cu_seqlens is not None:
        _check_cu_seqlens(cu_seqlens, k.shape[1], k.shape[0], "recompute_w_u_fwd")
    return OPS_wu(k, v, beta, A, g, cu_seqlens)


def prepare_wy_repr_fwd(k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
                        cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                        chunk_indices: Optional[torch.Tensor] = None,
                        output_dtype: Optional[torch.dtype] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w, u, A): chunk_scaled_dot_kkt + solve_tril + recompute_w_u_fwd fused per chunk; A (the inverse) in
    output_dtype (default k.dtype, as fla)."""
    if cu_seqlens is not None:
        _check_cu_seqlens(cu_seqlens, k.shape[1], k.shape[0], "prepare_wy_repr_fwd")
    return OPS_wy(k, v, g, beta, cu_seqlens, chunk_size, output_dtype or k.dtype)


def chunk_gated_delta_rule_fwd_h(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor,
                                 g: Optional[torch.Tensor] = None, gk: Optional[torch.Tensor] = None,
                                 initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                                 chunk_size: int = 64, save_new_value: bool = True, state_v_first: bool = False,
                                 cu_seqlens: Optional[torch.Tensor] = None,
                                 chunk_indices: Optional[torch.Tensor] = None):
    """(h [B,NT,HV,K,V] in k.dtype, v_new [B,T,HV,V] in u.dtype or None, final_state [N,HV,K,V] f32 or None).
    gk (KDA per-channel gates) and state_v_first are not supported by this operator."""
    if gk is not None:
        raise NotImplementedError("chunk_gated_delta_rule_fwd_h: gk (per-channel gates) is not supported")
    if state_v_first:
        raise NotImplementedError("chunk_gated_delta_rule_fwd_h: state_v_first is not supported")
    nt = _num_chunks(k.shape[1], k.shape[0], chunk_size, cu_seqlens, "chunk_gated_delta_rule_fwd_h")
    h, v_new, ht = OPS_fwd_h(k, w, u, g, initial_state, cu_seqlens, chunk_size, nt, output_final_state)
    return h, (v_new if save_new_value else None), (ht if output_final_state else None)


def chunk_fwd_o(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: torch.Tensor,
                g: Optional[torch.Tensor] = None, g_gamma: Optional[torch.Tensor] = None,
                scale: Optional[float] = None, state_v_first: bool = False,
                cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """o = scale (diag(exp(g)) Q h[c] + Lower((Q K^T) * exp(g_i - g_j)) v) per chunk; v = v_new; scale
    defaults to K^-0.5. g_gamma and state_v_first are not supported."""
    if g_gamma is not None:
        raise NotImplementedError("chunk_fwd_o: g_gamma is not supported")
    if state_v_first:
        raise NotImplementedError("chunk_fwd_o: state_v_first is not supported")
    if scale is None:
        scale = k.shape[-1] ** -0.5
    if cu_seqlens is not None:
        nt = _num_chunks(k.shape[1], k.shape[0], chunk_size, cu_seqlens, "chunk_fwd_o")
        if h.shape[1] != nt:
            raise ValueError(f"chunk_fwd_o: h must have shape[1] = NT = {nt} (chunks of cu_seqlens), got {h.shape[1]}")
    return OPS_o(q, k, v, h, g, cu_seqlens, float(scale), chunk_size)


OPS_kkt = _kkt
OPS_solve = _solve
OPS_wu = _wu
OPS_wy = _wy
OPS_fwd_h = _fwd_h
OPS_o = _o
