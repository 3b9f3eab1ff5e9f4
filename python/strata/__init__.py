"""Strata: open compute stack for neural-network training (C++20/CUDA), PyTorch front end (layer L5).

    import strata
    y = strata.api.l2norm(x)                       # CPU or CUDA tensors, autograd-aware
    strata.version(), strata.devices()
    with strata.force_impl("reference"): ...      # pin an implementation (tests, benchmarks)

The ops live in strata.api; strata._C is the binding of the C API (no libtorch inside).
"""

import contextlib
import os

import torch  # noqa: F401  (loads torch's CUDA runtime before libstrata; the ops need torch anyway)

from . import _C
from ._C import StrataError, StrataValueError

__version__ = _C.version()


def _init_threads() -> None:
    # `import torch` leaves OpenMP at 1 thread on some machines, which would make Strata's CPU kernels
    # single-threaded inside Python. Unless the user chose (OMP_NUM_THREADS / STRATA_NUM_THREADS), use
    # the cores this process may run on. Results never depend on the thread count (fixed work split).
    n = os.environ.get("STRATA_NUM_THREADS")
    if n is None and os.environ.get("OMP_NUM_THREADS") is not None:
        return
    try:
        count = int(n) if n is not None else len(os.sched_getaffinity(0))
    except (AttributeError, ValueError):
        count = os.cpu_count() or 1
    try:
        _C.set_num_threads(count)
    except Exception:  # never fail the import over this
        pass


_init_threads()

from . import api  # noqa: E402
from ._ops import get_fast_path, release_cpu_workspace, set_fast_path  # noqa: E402,F401


def version() -> str:
    """Library version string, e.g. "0.1.0"."""
    return _C.version()


def version_int() -> int:
    """major*10000 + minor*100 + patch."""
    return _C.version_int()


def built_with_cuda() -> bool:
    """Whether libstrata was compiled with its CUDA backend."""
    return _C.built_with_cuda()


def devices() -> list:
    """Properties of every device Strata sees: dicts with type ("cpu"/"cuda"), index, name, uuid,
    multiprocessor_count, sm, isa, total_memory, l2_cache_bytes. The CPU is always first."""
    out = [_C.device_properties(_C.DEVICE_CPU, 0)]
    for i in range(_C.device_count(_C.DEVICE_CUDA)):
        out.append(_C.device_properties(_C.DEVICE_CUDA, i))
    return out


def device_properties(device="cpu") -> dict:
    """Properties of one device: "cpu", "cuda", "cuda:1", or a torch.device."""
    d = torch.device(device)
    if d.type == "cpu":
        return _C.device_properties(_C.DEVICE_CPU, 0)
    if d.type == "cuda":
        return _C.device_properties(_C.DEVICE_CUDA, 0 if d.index is None else d.index)
    raise ValueError(f"strata: no such device type {d.type!r} (cpu or cuda)")


def cuda_device_count() -> int:
    """CUDA devices Strata sees (0 when built without CUDA or without a driver)."""
    return _C.device_count(_C.DEVICE_CUDA)


def set_determinism(level: int) -> None:
    """0 off, 1 same bits run to run (default), 2 batch- and thread-count-invariant."""
    _C.set_determinism(int(level))


def get_determinism() -> int:
    return _C.get_determinism()


def set_num_threads(n: int) -> None:
    """CPU threads for Strata's kernels (0 = all cores); results never depend on it."""
    _C.set_num_threads(int(n))


def get_num_threads() -> int:
    return _C.get_num_threads()


def op_names() -> list:
    """Names of the C library's registered ops."""
    return _C.op_names()


def impl_names(op: str) -> list:
    """Implementation names of a C op, in dispatch order (fastest first, reference last)."""
    return _C.op_impl_names(op)


def plan_cache_stats() -> dict:
    """{"hits", "misses", "entries"} of the C plan cache."""
    return _C.plan_cache_stats()


def plan_cache_clear() -> None:
    _C.plan_cache_clear()


_FORCE_ENV = "STRATA_FORCE_IMPL"
_forced = None  # the name pinned through set_force_impl (None: not pinned from Python)


def set_force_impl(name) -> None:
    """Pins the implementation the C library picks for every op planned from now on ("cpu.avx512",
    "reference", ...; strata.impl_names(op) lists them); None unpins (STRATA_FORCE_IMPL applies again).

    An op that has no implementation of that name ignores it; one that has it but cannot apply it to the
    problem fails to plan with STRATA_ERROR_NO_IMPLEMENTATION (a StrataError). The forced name is part of
    the plan cache key, so no cached plan hides the change."""
    global _forced
    _C.set_force_impl("" if name is None else str(name))
    _forced = None if name is None else str(name)


def get_force_impl():
    """The pinned implementation name (from set_force_impl, else STRATA_FORCE_IMPL), or None."""
    return _forced if _forced is not None else (os.environ.get(_FORCE_ENV) or None)


@contextlib.contextmanager
def force_impl(name):
    """Context manager form of set_force_impl: restores the previous setting on exit."""
    prev = _forced
    set_force_impl(name)
    try:
        yield
    finally:
        set_force_impl(prev)


__all__ = [
    "api",
    "StrataError",
    "StrataValueError",
    "version",
    "version_int",
    "built_with_cuda",
    "devices",
    "device_properties",
    "cuda_device_count",
    "set_determinism",
    "get_determinism",
    "set_num_threads",
    "get_num_threads",
    "op_names",
    "impl_names",
    "plan_cache_stats",
    "plan_cache_clear",
    "set_force_impl",
    "get_force_impl",
    "force_impl",
    "set_fast_path",
    "get_fast_path",
    "release_cpu_workspace",
]
