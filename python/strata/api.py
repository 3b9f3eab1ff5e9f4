"""Strata's PyTorch API: drop-in, autograd-aware ops with the argument names of the public
implementations (fla, MindSpeed Ops). Every function works on CPU and CUDA tensors; on CUDA it runs on
torch's current stream. Each is a torch.library custom op (strata::<name>) on torch >= 2.4, so
torch.compile(fullgraph=True) traces it.
"""

from typing import Optional, Tuple, Union

import torch

from . import _defs  # noqa: F401  (registers the ops)
from ._ops import OPS

__all__ = [
    "l2norm",
    "l2norm_fwd",
    "l2norm_bwd",
    "rmsnorm_without_weight",
    "rmsnorm_without_weight_bwd",
    "chunk_local_cumsum",
]

_l2norm_fwd = OPS["l2norm_fwd"]
_l2norm_bwd = OPS["l2norm_bwd"]
_rms_fwd = OPS["rmsnorm_without_weight_fwd"]
_rms_factor = OPS["rmsnorm_without_weight_factor"]
_rms_bwd = OPS["rmsnorm_without_weight_bwd"]
_cumsum = OPS["chunk_local_cumsum"]


# ---- l2norm ----


def l2norm(x: torch.Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """y = x / sqrt(sum(x^2, -1) + eps) per row of the last dim (eps inside the sqrt, as fla).

    x: [..., D] float32/bfloat16/float16 (float64 on CPU); y has output_dtype (default x.dtype).
    Differentiable in x."""
    return _l2norm_fwd(x, eps, output_dtype)[0]


def l2norm_fwd(x: torch.Tensor, eps: float = 1e-6,
               output_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y as l2norm, rstd = 1/sqrt(sum(x^2)+eps) of shape x.shape[:-1], float32 (float64 for
    float64 x). y is differentiable in x; rstd is a saved statistic (marked non-differentiable)."""
    return _l2norm_fwd(x, eps, output_dtype)


def l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, eps: float = 1e-6,
               output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """dx = rstd * (dy - (dy . y) y) from the saved y and rstd. eps is accepted for fla compatibility and
    unused (rstd already holds it). dx has output_dtype (default y.dtype)."""
    return _l2norm_bwd(y, rstd, dy, output_dtype)


# ---- rmsnorm_without_weight ----

_MODES = {"normalize": 0, "factor": 1}


def _mode(mode: Union[str, int]) -> int:
    if isinstance(mode, str):
        m = _MODES.get(mode.lower())
        if m is None:
            raise ValueError(f"rmsnorm_without_weight: mode must be 'normalize' or 'factor', got {mode!r}")
        return m
    if mode in (0, 1):
        return int(mode)
    raise ValueError(f"rmsnorm_without_weight: mode must be 'normalize' or 'factor', got {mode!r}")


def rmsnorm_without_weight(x: torch.Tensor, eps: float = 1e-6, mode: Union[str, int] = "normalize",
                           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Parameter-free RMS norm, r = 1/sqrt(mean(x^2, -1) + eps) (ops_fused.md §3).

    mode "normalize": returns y = x * r, shape [..., D], dtype out_dtype (default x.dtype); r is saved in
    float32 for the backward. mode "factor": returns r itself, shape [..., 1], dtype out_dtype (default
    x.dtype; e.g. out_dtype=torch.float32 for an fp32 factor from bf16 x). Differentiable in x."""
    if _mode(mode) == 0:
        return _rms_fwd(x, eps, out_dtype)[0]
    return _rms_factor(x, eps, out_dtype)


def rmsnorm_without_weight_fwd(x: torch.Tensor, eps: float = 1e-6,
                               out_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Normalize mode with the saved factor: (y [..., D], r [..., 1] float32 (float64 for float64 x))."""
    return _rms_fwd(x, eps, out_dtype)


def rmsnorm_without_weight_bwd(x: torch.Tensor, r: torch.Tensor, dout: torch.Tensor,
                               mode: Union[str, int] = "normalize",
                               output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """dx from x, the saved r and dout (dy [..., D] in normalize mode, dr [..., 1] in factor mode)."""
    return _rms_bwd(x, r, dout, _mode(mode), output_dtype)


# ---- chunk_local_cumsum ----


def _tracing() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def _check_cu_seqlens(cu: torch.Tensor, g: torch.Tensor) -> None:
    """Raises ValueError unless cu (int [N+1]) starts at 0, never decreases and ends at g.shape[1]."""
    if cu.dim() != 1 or cu.numel() < 1:
        return  # shape errors are reported by the C library with its own message
    host = cu.detach().to("cpu", torch.int64)
    T = g.shape[1] if g.dim() >= 2 else 0
    if int(host[0]) != 0:
        raise ValueError(f"chunk_local_cumsum: cu_seqlens[0] must be 0, got {int(host[0])}")
    steps = host[1:] - host[:-1]
    if host.numel() > 1 and bool((steps < 0).any()):
        i = int(torch.nonzero(steps < 0)[0]) + 1
        raise ValueError(f"chunk_local_cumsum: cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = "
                         f"{int(host[i])} after cu_seqlens[{i - 1}] = {int(host[i - 1])}")
    if int(host[-1]) != T:
        raise ValueError(f"chunk_local_cumsum: cu_seqlens[-1] must equal T = {T} (g.shape[1]), got {int(host[-1])}")


def chunk_local_cumsum(g: torch.Tensor, chunk_size: int, reverse: bool = False, scale: Optional[float] = None,
                       cu_seqlens: Optional[torch.Tensor] = None,
                       output_dtype: Optional[torch.dtype] = torch.float32,
                       chunk_indices: Optional[torch.Tensor] = None,
                       cu_seqlens_cpu: Optional[torch.Tensor] = None, **kwargs) -> torch.Tensor:
    """Chunk-local cumulative sum over the time axis (ops_gdn_kda.md §4.2), as fla's.

    g: [B, T, H] or [B, T, H, S] float32/bfloat16/float16 (float64 on CPU). Chunks of chunk_size tokens
    (a power of two) restart at every sequence start; out[t] = scale * sum(g[chunk start .. t]), or with
    reverse=True over [t, chunk end). scale None means 1. cu_seqlens: int64 [N+1] on g's device with
    B == 1 for variable-length packs (other integer dtypes are converted). output_dtype None means
    g.dtype (fla's `output_dtype or g.dtype`); default float32. chunk_indices is accepted for fla
    compatibility and unused (Strata derives the chunks from cu_seqlens). Differentiable in g: the
    adjoint is the opposite-direction cumsum with the same scale.

    The values of cu_seqlens are checked here in eager mode (0 first, non-decreasing, T last): the CUDA
    kernel cannot check them without a device-to-host copy, so for CUDA tensors this reads a host copy;
    pass cu_seqlens_cpu (fla's name) to avoid that synchronisation."""
    if kwargs:
        unknown = ", ".join(sorted(k for k in kwargs if k != "head_first"))
        if unknown:
            raise TypeError(f"chunk_local_cumsum() got unexpected keyword arguments: {unknown}")
        if kwargs.get("head_first"):
            raise ValueError("chunk_local_cumsum: head_first=True is not supported (use [B, T, H, ...])")
    if cu_seqlens is not None and cu_seqlens.dtype != torch.int64:
        cu_seqlens = cu_seqlens.to(torch.int64)
    if cu_seqlens is not None and not _tracing():
        _check_cu_seqlens(cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu, g)
    return _cumsum(g, chunk_size, bool(reverse), 1.0 if scale is None else float(scale), cu_seqlens,
                   output_dtype or g.dtype)


# ---- operator families, one module each (python/strata/_<family>.py) ----
from . import _gdn_fwd  # noqa: E402
from ._gdn_fwd import *  # noqa: E402,F401,F403
from . import _gdn_bwd  # noqa: E402
from ._gdn_bwd import *  # noqa: E402,F401,F403
from . import _chunk_gated_delta_rule  # noqa: E402
from ._chunk_gated_delta_rule import *  # noqa: E402,F401,F403
from . import _rms_norm_gated  # noqa: E402
from ._rms_norm_gated import *  # noqa: E402,F401,F403
from . import _clipped_swiglu  # noqa: E402
from ._clipped_swiglu import *  # noqa: E402,F401,F403
from . import _causal_conv1d  # noqa: E402
from ._causal_conv1d import *  # noqa: E402,F401,F403
from . import _fused_cross_entropy  # noqa: E402
from ._fused_cross_entropy import *  # noqa: E402,F401,F403
from . import _chunk_loss  # noqa: E402
from ._chunk_loss import *  # noqa: E402,F401,F403

for _family in (_gdn_fwd, _gdn_bwd, _chunk_gated_delta_rule, _rms_norm_gated, _clipped_swiglu, _causal_conv1d, _fused_cross_entropy, _chunk_loss):
    __all__ += _family.__all__
del _family
