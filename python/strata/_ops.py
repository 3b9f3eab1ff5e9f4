"""Op registry: turns a Strata C op into a PyTorch op in a few lines.

Each op is declared once with `define(...)`:

    @define("l2norm_fwd", "(Tensor x, float eps, ScalarType? output_dtype) -> (Tensor, Tensor)",
            fake=_l2norm_fwd_fake, setup_context=..., backward=...)
    def l2norm_fwd(x, eps, output_dtype):
        y = empty(x.shape, output_dtype or x.dtype, x)
        rstd = empty(x.shape[:-1], stat_dtype(x.dtype), x)
        launch(OP.l2norm_fwd, (x, y, rstd), (eps,))
        return y, rstd

which gives:
  * with torch >= 2.4, a `torch.library.custom_op` "strata::<name>" (fake implementation registered,
    autograd registered with setup_context/backward), so torch.compile(fullgraph=True) traces it and
    torch.library.opcheck passes;
  * always, an equivalent `torch.autograd.Function` (the only path on older torch, e.g. 1.13);
  * an eager fast path: when nothing needs the dispatcher (not compiling, no dispatch/function modes, no
    functorch transforms, plain tensors on cpu/cuda), calling the op skips the dispatcher: the
    implementation runs directly when no input needs grad, or through the autograd.Function when one does.
    The dispatcher costs ~15-25 us per call on a small machine; this path keeps a tiny call near the cost
    of allocating its outputs. `STRATA_PY_FAST_PATH=0` (or strata.set_fast_path(False)) turns it off.

`launch(op_id, tensors, attrs)` calls the C library through strata._C: it passes each tensor as plain
integers (dtype code, device, shape, strides, data_ptr; data_ptr already includes the storage offset),
runs on torch's current CUDA stream (wrapped once per stream) or synchronously on the CPU, and allocates
any workspace with torch (on the CPU, from one grow-only buffer per thread: see cpu_workspace).
"""

import mmap
import os
import sys
import threading
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from . import _C

# ---------------------------------------------------------------------------------------------------------
# dtypes

DTYPE_CODES: Dict[torch.dtype, int] = {
    torch.float64: 0,
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int64: 4,
    torch.int32: 5,
    torch.int16: 6,
    torch.int8: 7,
    torch.uint8: 8,
    torch.bool: 9,
}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


def dtype_code(dtype: torch.dtype) -> int:
    """STRATA_DTYPE_* code of a torch dtype (-1 when Strata has none: the C call then rejects it)."""
    return DTYPE_CODES.get(dtype, -1)


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of saved statistics (rstd, r): float32, or float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _OpIds:
    """Op ids of strata._C.execute, as attributes: OP.l2norm_fwd."""

    def __init__(self, table):
        self.__dict__.update(table)


OP = _OpIds(dict(_C.OPS))

# ---------------------------------------------------------------------------------------------------------
# streams

_streams: Dict[Tuple[int, int], int] = {}

_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_cuda_stream(dev: int) -> int:
    if _get_raw_stream is not None:
        return _get_raw_stream(dev)
    return torch.cuda.current_stream(dev).cuda_stream


def cuda_stream(dev: int) -> int:
    """strata_stream (as an int) wrapping torch's current CUDA stream on device `dev`; cached per stream.

    torch's default (legacy) stream has the handle 0, which is also Strata's NULL stream for CUDA."""
    raw = _raw_cuda_stream(dev)
    if raw == 0:
        return 0
    key = (raw, dev)
    s = _streams.get(key)
    if s is None:
        s = _streams[key] = _C.stream_wrap_cuda(dev, raw)
    return s


# ---------------------------------------------------------------------------------------------------------
# launching


def _meta(t: Optional[torch.Tensor]):
    if t is None:
        return None
    dev = t.get_device()
    if dev < 0 and not t.is_cpu:
        raise ValueError(f"strata: tensors must be on cpu or cuda, got a tensor on {t.device}")
    return (DTYPE_CODES.get(t.dtype, -1), dev, t.shape, t.stride(), t.data_ptr())


def launch(op: int, tensors: Sequence[Optional[torch.Tensor]], attrs: tuple) -> None:
    """Plans (through the C plan cache) and runs op `op` on `tensors` (in the op's documented order; None
    for an absent optional tensor) with attribute tuple `attrs`, on the first tensor's device.

    A plan that needs workspace gets it as a torch uint8 tensor on that device. If the op rejects the
    strides it was given (STRATA_ERROR_INVALID_STRIDE), it is retried once on contiguous copies."""
    metas = [_meta(t) for t in tensors]
    first = tensors[0]
    stream = 0 if metas[0][1] < 0 else cuda_stream(metas[0][1])
    try:
        plan = _C.execute(op, metas, attrs, stream)
    except _C.StrataError as e:
        if getattr(e, "status", 0) != 104 or all(t is None or t.is_contiguous() for t in tensors):
            raise
        # Outputs are fresh contiguous tensors, so .contiguous() returns them as they are and the op
        # still writes into them; only strided inputs are copied. The copies live until this returns,
        # which is enough on CUDA too (torch's allocator reuses their memory in stream order).
        tensors = [None if t is None else t.contiguous() for t in tensors]
        metas = [_meta(t) for t in tensors]
        plan = _C.execute(op, metas, attrs, stream)
    if plan is not None:
        if first.is_cpu:
            ws = cpu_workspace(plan.workspace_size)
        else:  # torch's caching allocator: reuse is free, and stream-ordered
            ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device=first.device)
        plan.run(metas, ws.data_ptr(), plan.workspace_size, stream)


_cpu_ws = threading.local()


def cpu_workspace(nbytes: int) -> torch.Tensor:
    """A CPU buffer of at least nbytes, kept per thread and grown when too small. CPU work on the null stream
    runs inline (synchronously), so a call is done with its workspace when it returns and the next call on the
    same thread can take the same buffer. A fresh torch.empty per call would fault in new pages every time
    (torch's CPU allocator does not cache): chunk_gated_delta_rule's backward takes 227 MiB of workspace at
    T=4096 Hv=8 K=V=128. release_cpu_workspace() frees it."""
    buf = getattr(_cpu_ws, "buf", None)
    if buf is None or buf.numel() < nbytes:
        _cpu_ws.buf = None  # the old buffer goes before the new one is faulted in
        buf = _cpu_ws.buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    return buf


def release_cpu_workspace() -> None:
    """Frees this thread's cached CPU workspace (the next CPU op that needs workspace allocates it again) and
    the idle buffers of its CPU output cache (cpu_output; buffers still held by tensors stay with them)."""
    _cpu_ws.buf = None
    _cpu_out.bufs = []


# CPU outputs (cpu_output): buffers of at least this size come from the per-thread cache, at most this many.
# 256 KiB: above glibc's initial mmap threshold (128 KiB), where fresh pages (and their faults) start; it takes
# GDN's 512 KiB final state at T=4096 HV=8 K=V=128 along with o.
CPU_OUTPUT_MIN_BYTES = 1 << 18
CPU_OUTPUT_CACHE = 8
_cpu_out = threading.local()
_itemsize: Dict[torch.dtype, int] = {}
# Private anonymous mappings (a MAP_SHARED one would be shared with fork()ed children); POSIX only.
_has_frombuffer = hasattr(torch, "frombuffer") and hasattr(mmap, "MAP_PRIVATE")


class _OutBuf:
    """One cached output buffer: an anonymous mapping, and sys.getrefcount of it while no tensor uses it (the torch
    storage of each tensor made from it by torch.frombuffer holds a reference to it until that storage dies)."""
    __slots__ = ("mem", "nbytes", "idle_refs")


def _refs(obj) -> int:
    return sys.getrefcount(obj)


def cpu_output(shape, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor for an op's output, as empty(); on the CPU, one of at least
    CPU_OUTPUT_MIN_BYTES takes its memory from a per-thread cache of buffers that no tensor uses any more.

    Why: torch's CPU allocator hands a large tensor fresh pages from mmap on every call, and the op's first
    write faults each 4 KiB page in (chunk_gated_delta_rule's 16 MiB `o` at T=4096 HV=8 V=128: 4096 faults,
    ~10 ms of CPU time on a 2-vCPU KVM guest against ~0.8 ms to write warm pages; session 13). A buffer is
    handed out again only when no tensor, view, storage object, numpy array or DLPack capsule made from the
    last tensor on it is alive (they all keep its torch storage alive, which holds a reference to the
    buffer), so reuse is invisible except in data_ptr(). The cache keeps at most CPU_OUTPUT_CACHE buffers per
    thread (least recently used idle ones are dropped first); release_cpu_workspace() empties it."""
    if not like.is_cpu or not _has_frombuffer:
        return empty(shape, dtype, like)
    numel = 1
    for n in shape:
        numel *= int(n)
    size = _itemsize.get(dtype)
    if size is None:
        size = _itemsize[dtype] = torch.empty((), dtype=dtype).element_size()
    nbytes = numel * size
    if nbytes < CPU_OUTPUT_MIN_BYTES:
        return empty(shape, dtype, like)
    bufs = getattr(_cpu_out, "bufs", None)
    if bufs is None:
        bufs = _cpu_out.bufs = []
    buf = None
    for i in range(len(bufs) - 1, -1, -1):  # most recently used first
        b = bufs[i]
        if b.nbytes == nbytes and _refs(b.mem) == b.idle_refs:
            buf = bufs.pop(i)
            break
    if buf is None:
        if len(bufs) >= CPU_OUTPUT_CACHE:
            idle = [i for i, b in enumerate(bufs) if _refs(b.mem) == b.idle_refs]
            bufs.pop(idle[0] if idle else 0)  # a buffer in use just stays with its tensors
        buf = _OutBuf()
        buf.mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
        buf.nbytes = nbytes
        buf.idle_refs = _refs(buf.mem)
    bufs.append(buf)
    strides, st = [], 1
    for n in reversed(shape):
        strides.append(st)
        st *= int(n)
    t = torch.frombuffer(buf.mem, dtype=dtype, count=numel)
    return t.as_strided_(tuple(int(n) for n in shape), tuple(reversed(strides)))


def plan_for(op: int, tensors: Sequence[Optional[torch.Tensor]], attrs: tuple):
    """The strata._C.Plan for these tensors (for inspection: impl_name, workspace_size); runs nothing."""
    return _C.plan(op, [_meta(t) for t in tensors], attrs)


_contiguous_format = torch.contiguous_format


def empty(shape, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor on like's device (torch's caching allocator). The sizes are passed as
    separate ints: torch parses those faster than a torch.Size."""
    if len(shape):
        return torch.empty(*shape, dtype=dtype, device=like.device)
    return torch.empty((), dtype=dtype, device=like.device)


def empty_like(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous tensor of like's shape and device with the given dtype."""
    return torch.empty_like(like, dtype=dtype, memory_format=_contiguous_format)


# ---------------------------------------------------------------------------------------------------------
# the registry

HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

_fast_path = os.environ.get("STRATA_PY_FAST_PATH", "1") not in ("0", "false", "False", "off")


def set_fast_path(enabled: bool) -> None:
    """Turns the eager fast path (see the module doc) on or off; off, every call goes through the
    torch.library custom op (torch >= 2.4)."""
    global _fast_path
    _fast_path = bool(enabled)


def get_fast_path() -> bool:
    return _fast_path


def _make_is_compiling():
    comp = getattr(torch, "compiler", None)
    if comp is not None and hasattr(comp, "is_compiling"):
        return comp.is_compiling
    try:
        from torch._dynamo import is_compiling  # type: ignore

        return is_compiling
    except Exception:  # pragma: no cover - torch without dynamo
        return lambda: False


_is_compiling = _make_is_compiling()
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_function_stack_len = getattr(torch._C, "_len_torch_function_stack", None)
if _function_stack_len is None:  # older torch
    _tf_enabled = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)
    _function_stack_len = lambda: 1 if _tf_enabled() else 0  # noqa: E731
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
try:
    import torch.autograd.forward_ad as _fwad
except Exception:  # pragma: no cover
    _fwad = None
_Tensor = torch.Tensor
_is_grad_enabled = torch.is_grad_enabled


def _mode_free() -> bool:
    if _dispatch_stack_len() or _function_stack_len() or _functorch_active():
        return False
    if _fwad is not None and getattr(_fwad, "_current_level", -1) >= 0:
        return False
    return True


class Op:
    """One registered op: call it like a function with all its arguments positionally (the public API
    in strata.api supplies defaults and names)."""

    def __init__(self, name: str, schema: str, impl: Callable, tensor_args: Sequence[int], fake: Callable,
                 setup_context: Optional[Callable], backward: Optional[Callable]):
        self.name = name
        self.qualname = f"strata::{name}"
        self.schema = schema
        self.impl = impl
        self.fake = fake
        self.tensor_args = tuple(tensor_args)
        self.setup_context = setup_context
        self.backward = backward
        self.function = _make_function(name, impl, setup_context, backward)
        self.custom = None
        if HAS_CUSTOM_OP:
            self.custom = torch.library.custom_op(self.qualname, impl, mutates_args=(), schema=schema)
            self.custom.register_fake(fake)
            if backward is not None:
                self.custom.register_autograd(backward, setup_context=setup_context)

    @property
    def overload(self):
        """torch.ops.strata.<name>.default (torch >= 2.4), e.g. for torch.library.opcheck."""
        return getattr(getattr(torch.ops.strata, self.name), "default")

    def __call__(self, *args):
        if _fast_path and not _is_compiling() and _mode_free():
            needs_grad = False
            for i in self.tensor_args:
                t = args[i]
                if t is None:
                    continue
                if type(t) is not _Tensor:  # FakeTensor, subclasses: let the dispatcher handle them
                    break
                if t.requires_grad:
                    needs_grad = True
            else:
                if needs_grad and _is_grad_enabled():
                    return self.function.apply(*args)
                return self.impl(*args)
        if self.custom is not None:
            return self.custom(*args)
        return self.function.apply(*args)

    def __repr__(self):
        return f"<strata op {self.qualname}: {self.schema}>"


def _make_function(name: str, impl: Callable, setup_context: Optional[Callable], backward: Optional[Callable]):
    """The torch.autograd.Function form of an op (old-style forward(ctx, ...) so it works on torch 1.13)."""

    def forward(ctx, *args):
        out = impl(*args)
        if setup_context is not None:
            setup_context(ctx, args, out)
        return out

    def backward_(ctx, *grads):
        if backward is None:
            raise RuntimeError(f"strata::{name} has no backward")
        return backward(ctx, *grads)

    return type(f"{name}_function", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward_)})


OPS: Dict[str, Op] = {}


def define(name: str, schema: str, *, fake: Callable, tensor_args: Sequence[int] = (0,),
           setup_context: Optional[Callable] = None, backward: Optional[Callable] = None):
    """Decorator registering `impl` as op strata::<name> with the given torch schema (arguments only in
    the schema, e.g. "(Tensor x, float eps, ScalarType? output_dtype) -> (Tensor, Tensor)").
    tensor_args: positions of the Tensor (or Tensor?) arguments. backward(ctx, *grads) returns one
    gradient per input (None for non-tensors), as torch.library.register_autograd expects."""

    def deco(impl: Callable) -> Op:
        if name in OPS:
            return OPS[name]
        op = Op(name, schema, impl, tensor_args, fake, setup_context, backward)
        OPS[name] = op
        return op

    return deco
