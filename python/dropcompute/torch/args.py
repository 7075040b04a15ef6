"""Checks of the numeric arguments the torch layer takes itself (those it forwards to the
extension module are checked there: ``_core`` refuses a bool where a number belongs).

Owns: ``count`` (an int, never a bool, at least a minimum). Must not touch: the range rules
of values the crate validates."""

from __future__ import annotations

from typing import Any, Optional


def count(name: str, value: Any, minimum: int, *, optional: bool = False) -> Optional[int]:
    """``value`` as an int >= ``minimum`` (None passes when ``optional``). Raises TypeError for
    a bool (``True`` is an int to Python: a flag where a count belongs) or a non-int, ValueError
    below ``minimum``; both name ``name``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: {value!r}: must be an int (not a bool)")
    if value < minimum:
        raise ValueError(f"{name}: {value}: must be an int >= {minimum}")
    return value
