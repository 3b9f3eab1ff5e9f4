"""Strata ops: chunk_gated_delta_rule (Gated DeltaNet, ops_gdn_kda.md §4.12), forward and backward.

Two torch ops:
  strata::chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale, initial_state?, output_final_state, cu_seqlens?,
      use_qk_l2norm_in_kernel, save) -> (o, final_state, saved)   (final_state is an empty [0] tensor when not
      asked for; saved: the residuals for the backward, uint8 [saved_bytes(...)] when `save`, else empty)
  strata::chunk_gated_delta_rule_bwd(..., saved?) -> (dq, dk, dv, dg, dbeta, dh0)   (dh0 empty without
      initial_state; with a non-empty `saved` from the forward it does not re-run the forward)
The forward's autograd saves its inputs and, on CUDA when a gradient is needed, the `saved` buffer (the
normalised q, k, the gate cumsum, the WY factors, the chunk states and corrected values: 1 416 MiB at
B=4 T=8192 H=16 HV=32 K=V=128 bf16 with l2norm), so that the backward skips re-running the forward; with
recompute_in_backward=True only the inputs are kept and the backward re-computes everything (as fla does for
w, u, h, v_new). The buffer is freed with the autograd graph. The CPU implementations save nothing (0 bytes).
The public wrapper `chunk_gated_delta_rule` has fla's argument names and returns (o, final_state).
"""

from typing import Optional, Tuple

import torch

from . import _C
from ._ops import OP, OPS, cpu_output, define, dtype_code, empty, launch

__all__ = ["chunk_gated_delta_rule", "chunk_gated_delta_rule_saved_bytes"]

_STATE_DTYPE = torch.float32


def _n_seqs(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _state_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else _STATE_DTYPE


def saved_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                use_qk_l2norm_in_kernel: bool) -> int:
    """Bytes of the forward's `saved` buffer: a pure function of the shapes, dtypes, device and options (no data
    read), written with plain arithmetic on the sizes so that torch's fake implementation can size the buffer
    under symbolic shapes. Mirrors gdn_cuda_saved_layout (chunk_gated_delta_rule.h; the C function
    strata_chunk_gated_delta_rule_saved_bytes, strata._C.chunk_gated_delta_rule_saved_bytes, gives the same
    numbers: tests/python/test_chunk_gated_delta_rule.py checks it): 256-byte aligned parts
    [l2norm: qn, kn [B, T, H, K], rq, rk f32 [B, T, H]] | gamma f32 [B, T, HV] | A [B, T, HV, 64] |
    w [B, T, HV, K] | v_new [B, T, HV, V] | h [B or 1, NT, HV, K, V] (NT = ceil(T/64), + N with cu_seqlens), in
    2 bytes when q, k, v share one 16-bit dtype, else 4. 0 on the CPU and without tokens."""
    half = q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype and v.dtype == q.dtype
    return _saved_bytes(q.device.type == "cuda", q.shape, v.shape, half,
                        None if cu_seqlens is None else cu_seqlens.shape[0] - 1, use_qk_l2norm_in_kernel)


def _saved_bytes(cuda: bool, q_shape, v_shape, half: bool, n_cu, l2: bool):
    """saved_bytes from the sizes: q [B, T, H, K], v [.., .., HV, V], 16-bit intermediates or not, the number
    of cu_seqlens sequences (None: fixed length), l2norm."""
    if not cuda:
        return 0
    B, T, H, K = q_shape
    HV, V = v_shape[2], v_shape[3]
    bt = B * T
    if bt == 0:
        return 0
    es = 2 if half else 4

    def part(n):
        return (n + 255) // 256 * 256

    nt = (T + 63) // 64
    rows_h = B
    if n_cu is not None:
        nt = nt + n_cu
        rows_h = 1
    total = part(bt * HV * 4) + part(bt * HV * 64 * es) + part(bt * HV * K * es) + part(bt * HV * V * es)
    total = total + part(rows_h * nt * HV * K * V * es)
    if l2:
        total = total + 2 * part(bt * H * K * es) + 2 * part(bt * H * 4)
    return total


def _fwd_fake(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
              save):
    o = q.new_empty((q.shape[0], q.shape[1], v.shape[2], v.shape[3]), dtype=q.dtype)
    if output_final_state:
        ht = q.new_empty((_n_seqs(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]), dtype=_state_dtype(q))
    else:
        ht = q.new_empty((0,), dtype=_state_dtype(q))
    nbytes = saved_bytes(q, k, v, cu_seqlens, use_qk_l2norm_in_kernel) if save else 0
    return o, ht, q.new_empty((nbytes,), dtype=torch.uint8)


def _fwd_setup(ctx, inputs, output):
    q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, l2, save = inputs
    saved = output[2]
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, saved)
    # No zero gradients for outputs that get none: autograd would otherwise hand the backward a zero tensor the size
    # of `saved` (a non-differentiable output; 1.4 GiB at B=4 T=8192 HV=32), an allocation and memset per step.
    ctx.set_materialize_grads(False)
    ctx.scale, ctx.l2 = scale, l2
    ctx.has_h0 = initial_state is not None


def _fwd_backward(ctx, do, dht, dsaved):
    q, k, v, g, beta, initial_state, cu_seqlens, saved = ctx.saved_tensors
    if dht is not None and dht.numel() == 0:
        dht = None
    if do is None:
        do = torch.zeros((q.shape[0], q.shape[1], v.shape[2], v.shape[3]), dtype=q.dtype, device=q.device)
    dq, dk, dv, dg, dbeta, dh0 = OPS["chunk_gated_delta_rule_bwd"](
        q, k, v, g, beta, ctx.scale, initial_state, cu_seqlens, do, dht, ctx.l2, saved)
    return dq, dk, dv, dg, dbeta, None, (dh0 if ctx.has_h0 else None), None, None, None, None


@define("chunk_gated_delta_rule_fwd",
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor? initial_state, "
        "bool output_final_state, Tensor? cu_seqlens, bool use_qk_l2norm_in_kernel, bool save) "
        "-> (Tensor, Tensor, Tensor)",
        fake=_fwd_fake, tensor_args=(0, 1, 2, 3, 4, 6, 8), setup_context=_fwd_setup, backward=_fwd_backward)
def _gdn_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, save):
    # CPU outputs from the cached buffers of cpu_output: a fresh 16 MiB o faulted its pages in on every call.
    o = cpu_output((q.shape[0], q.shape[1], v.shape[2], v.shape[3]), q.dtype, q)
    if output_final_state:
        ht = cpu_output((_n_seqs(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]), _state_dtype(q), q)
    else:
        ht = empty((0,), _state_dtype(q), q)
    # The buffer's size from the C function (the fake implementation's Python formula must agree: opcheck).
    nbytes = _C.chunk_gated_delta_rule_saved_bytes(
        [_shape_meta(q), _shape_meta(k), _shape_meta(v), _shape_meta(cu_seqlens)],
        1 if use_qk_l2norm_in_kernel else 0) if save else 0
    saved = empty((nbytes,), torch.uint8, q)  # torch's CUDA allocator: 512-byte aligned, as the op needs
    launch(OP.chunk_gated_delta_rule_fwd,
           (q, k, v, g, beta, initial_state, cu_seqlens, o, ht if output_final_state else None,
            saved if nbytes else None),
           (scale, 1 if use_qk_l2norm_in_kernel else 0))
    return o, ht, saved


def _shape_meta(t: Optional[torch.Tensor]):
    """A tensor meta for the size function (dtype, device, shape, strides; the pointer is not read)."""
    if t is None:
        return None
    return (dtype_code(t.dtype), t.get_device() if t.is_cuda else -1, tuple(t.shape), tuple(t.stride()), 0)


def _bwd_fake(q, k, v, g, beta, scale, initial_state, cu_seqlens, do, dht, use_qk_l2norm_in_kernel, saved):
    dh0 = (initial_state.new_empty(initial_state.shape, dtype=_state_dtype(q)) if initial_state is not None
           else q.new_empty((0,), dtype=_state_dtype(q)))
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g),
            torch.empty_like(beta), dh0)


@define("chunk_gated_delta_rule_bwd",
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor? initial_state, "
        "Tensor? cu_seqlens, Tensor do, Tensor? dht, bool use_qk_l2norm_in_kernel, Tensor? saved) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
        fake=_bwd_fake, tensor_args=(0, 1, 2, 3, 4, 6, 7, 8, 9, 11))
def _gdn_bwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, do, dht, use_qk_l2norm_in_kernel, saved):
    dq = cpu_output(q.shape, q.dtype, q)
    dk = cpu_output(k.shape, k.dtype, q)
    dv = cpu_output(v.shape, v.dtype, q)
    dg = cpu_output(g.shape, g.dtype, q)
    dbeta = cpu_output(beta.shape, beta.dtype, q)
    dh0 = cpu_output(initial_state.shape if initial_state is not None else (0,), _state_dtype(q), q)
    launch(OP.chunk_gated_delta_rule_bwd,
           (q, k, v, g, beta, initial_state, cu_seqlens, do, dht, dq, dk, dv, dg, dbeta,
            dh0 if initial_state is not None else None,
            saved if saved is not None and saved.numel() > 0 else None),
           (scale, 1 if use_qk_l2norm_in_kernel else 0))
    return dq, dk, dv, dg, dbeta, dh0


_fwd = OPS["chunk_gated_delta_rule_fwd"]
chunk_gated_delta_rule_saved_bytes = saved_bytes


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                           output_final_state: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                           use_qk_l2norm_in_kernel: bool = False, *, recompute_in_backward: bool = False,
                           **kwargs) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gated DeltaNet (fla's chunk_gated_delta_rule): per sequence and value head, with state S [K, V]
    starting at initial_state (or 0):  S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;
    o_t = scale S^T q_t.

    q, k: [B, T, H, K] (K <= 256); v: [B, T, HV, V] with HV a multiple of H (value head hv reads q/k head
    hv // (HV/H)); g (log-space decay), beta: [B, T, HV]; initial_state: [N, HV, K, V] float32;
    cu_seqlens: int64 [N+1] packing N sequences into B = 1. scale defaults to K^-0.5. With
    use_qk_l2norm_in_kernel, q and k are L2-normalised per head vector inside the op (eps 1e-6 in the sqrt).
    Returns (o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None). Differentiable in
    q, k, v, g, beta and initial_state; a gradient may flow into final_state.

    On CUDA, when a gradient is needed, the forward keeps its residuals for the backward (normalised q, k, gate
    cumsum, WY factors w and A, the chunk states h and corrected values v_new: chunk_gated_delta_rule_saved_bytes,
    1 416 bytes per token and value head at K = V = 128, H = HV/2 in bf16 with l2norm: 1 416 MiB at B=4 T=8192
    HV=32), so that the backward does not
    re-run the forward. recompute_in_backward=True keeps only the inputs (less memory, a slower backward that
    re-computes them). The CPU implementations always re-compute (they save nothing)."""
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
    save = (not recompute_in_backward and q.is_cuda and torch.is_grad_enabled()
            and any(x is not None and x.requires_grad for x in (q, k, v, g, beta, initial_state)))
    o, ht, _ = _fwd(q, k, v, g, beta, float(scale), initial_state, bool(output_final_state), cu_seqlens,
                    bool(use_qk_l2norm_in_kernel), save)
    return o, (ht if output_final_state else None)
