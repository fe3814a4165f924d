"""Argument checks shared by the timer, operations and purgatory.

Each check raises before anything is mutated, with the offending value in the
message. Hot paths test the common case inline and call these only when it fails.

A number is first converted to the exact built-in value the library will use
(``float(value)``, ``operator.index(value)``), and that value is what gets checked
and returned: a subclass of int or float can override ``__float__`` or its
comparisons, so testing the argument itself and then using its conversion would
let, say, an int that reads as 5 become a NaN timeout.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any, Final

INF: Final = math.inf


def check_seconds(value: object, what: str) -> float:
    """A finite, non-negative number of seconds (bool and str rejected)."""
    seconds = _to_float(value, what, "a number of seconds")
    if not 0.0 <= seconds < INF:  # also rejects NaN
        raise ValueError(f"{what} must be finite and >= 0, got {_shown(value, seconds)}")
    return seconds


def check_instant(value: object, what: str) -> float:
    """A finite clock reading (may lie in the past)."""
    instant = _to_float(value, what, "a clock time in seconds")
    if not -INF < instant < INF:
        raise ValueError(f"{what} must be finite, got {_shown(value, instant)}")
    return instant


def check_finite(value: object, what: str) -> float:
    """Any finite real number (bool and str rejected), as a float.

    As a float on both builds (the compiled one cannot return anything else from
    a function typed ``-> float``): thresholds and the values that reach them are
    compared as floats, which keeps their order (conversion is monotonic).
    """
    number = _to_float(value, what, "a number")
    if not -INF < number < INF:
        raise ValueError(f"{what} must be finite, got {_shown(value, number)}")
    return number


def _to_float(value: object, what: str, kind: str) -> float:
    """``value`` as the exact float it stands for (TypeError for bool, str, ...)."""
    if type(value) is float:
        return value
    # Exact types first: isinstance() against int | float goes through the union's
    # __instancecheck__. Measured (callgrind, per threshold operation, which checks a
    # threshold and an advance_key value): compiled 13.7k -> 11.6k instructions with
    # int values, 13.1k -> 10.6k with floats; pure 25.7k -> 24.6k, 25.0k -> 23.1k.
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise TypeError(f"{what} must be {kind}, got {value!r}")
    try:
        return float(value)  # an exact float, whatever __float__ a subclass defines
    except OverflowError:  # an int beyond the float range: finite, but not a time
        raise ValueError(f"{what} is too large to be a float: {value!r}") from None
    except Exception as exc:  # a subclass's __float__ (a StopIteration must not escape)
        raise TypeError(f"{what} must be {kind}, got {value!r}: float() raised {exc!r}") from exc


def _shown(value: object, number: float) -> str:
    """``value`` for a message, with the float it became if that reads differently
    (a subclass of int or float can convert to anything)."""
    shown = repr(value)
    if type(value) is not float and type(value) is not int and repr(number) != shown:
        shown += f" (as a float: {number!r})"
    return shown


def check_flag(value: object, what: str) -> bool:
    """A real bool: ``1`` or ``"yes"`` are more likely mistakes than intentions."""
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, got {value!r}")
    return value


def check_positive_seconds(value: object, what: str) -> float:
    seconds = check_seconds(value, what)
    if seconds <= 0.0:
        raise ValueError(f"{what} must be > 0, got {_shown(value, seconds)}")
    return seconds


def check_positive_int(value: object, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    # An exact int with the same value (an int subclass's own comparisons and
    # arithmetic are left behind).
    number = operator.index(value)
    if number < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value!r}")
    return number


def check_callable(value: object, what: str) -> Callable[..., Any]:
    if not callable(value):
        raise TypeError(f"{what} must be callable, got {value!r}")
    return value
