"""Strata ops: clipped_swiglu (torch ops in the style of _defs.py, and the public wrappers re-exported by api.py)."""

__all__ = []
