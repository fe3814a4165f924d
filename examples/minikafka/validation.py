"""Argument checks for configs and requests: fail at construction, naming the bad value."""

from __future__ import annotations

import math


def check_seconds(name: str, value: object) -> None:
    """A finite, non-negative number of seconds (bool rejected)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def check_int(name: str, value: object, minimum: int) -> None:
    """An int (bool rejected) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
