"""Argument checks shared by the timer, operations and purgatory.

Each check raises before anything is mutated, with the offending value in the
message. Hot paths test the common case inline and call these only when it fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

INF: Final = math.inf


def check_seconds(value: object, what: str) -> float:
    """A finite, non-negative number of seconds (bool and str rejected)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    if not 0.0 <= value < INF:  # also rejects NaN
        raise ValueError(f"{what} must be finite and >= 0, got {value!r}")
    return _to_float(value, what)


def _to_float(value: int | float, what: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range: finite, but not a time
        raise ValueError(f"{what} is too large to be a time in seconds: {value!r}") from None


def check_instant(value: object, what: str) -> float:
    """A finite clock reading (may lie in the past)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a clock time in seconds, got {value!r}")
    if not -INF < value < INF:
        raise ValueError(f"{what} must be finite, got {value!r}")
    return _to_float(value, what)


def check_finite(value: object, what: str) -> float:
    """Any finite real number (bool and str rejected)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, got {value!r}")
    if not -INF < value < INF:
        raise ValueError(f"{what} must be finite, got {value!r}")
    return value  # an int stays exact: thresholds are often offsets


def check_flag(value: object, what: str) -> bool:
    """A real bool: ``1`` or ``"yes"`` are more likely mistakes than intentions."""
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, got {value!r}")
    return value


def check_positive_seconds(value: object, what: str) -> float:
    seconds = check_seconds(value, what)
    if seconds <= 0.0:
        raise ValueError(f"{what} must be > 0, got {value!r}")
    return seconds


def check_positive_int(value: object, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value!r}")
    return value


def check_callable(value: object, what: str) -> Callable[..., Any]:
    if not callable(value):
        raise TypeError(f"{what} must be callable, got {value!r}")
    return value
