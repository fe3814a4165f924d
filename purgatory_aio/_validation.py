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
    return float(value)


def check_instant(value: object, what: str) -> float:
    """A finite clock reading (may lie in the past)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a clock time in seconds, got {value!r}")
    if not -INF < value < INF:
        raise ValueError(f"{what} must be finite, got {value!r}")
    return float(value)


def check_finite(value: object, what: str) -> float:
    """Any finite real number (bool and str rejected)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, got {value!r}")
    if not -INF < value < INF:
        raise ValueError(f"{what} must be finite, got {value!r}")
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
