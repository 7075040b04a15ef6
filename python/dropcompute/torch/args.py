"""Checks of the numeric arguments the torch layer takes itself (those it forwards to the
extension module are checked there: ``_core`` refuses a bool where a number belongs).

Owns: ``count`` and ``opt_count`` (an integer, never a bool, at least a minimum). Must not touch: the range
rules of values the crate validates."""

from __future__ import annotations

import operator
from typing import Any, Optional


def is_bool(value: Any) -> bool:
    """Python's bool, NumPy's bool scalar, or any 0-d boolean array or tensor (``dtype`` bool):
    each converts to an int (1 or 0) without complaint."""
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and str(dtype) in ("bool", "torch.bool")


def count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``: any integer Python and NumPy know
    (``operator.index``: int, ``np.int64``, ``np.uint32``, ...). Raises TypeError for a bool
    (``is_bool``: a flag where a count belongs) or a non-integer (a float is never truncated),
    ValueError below ``minimum``; each names ``name``."""
    if is_bool(value):
        raise TypeError(f"{name}: {value!r}: a bool where an integer belongs")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: {value!r}: must be an integer") from None
    if v < minimum:
        raise ValueError(f"{name}: {v}: must be an int >= {minimum}")
    return v


def opt_count(name: str, value: Any, minimum: int) -> Optional[int]:
    """None, or ``count(name, value, minimum)``."""
    return None if value is None else count(name, value, minimum)
