"""The fan-out checks its seconds and counts by the core's rule, not one of its own.

For every option of every engine and every hostile value, the fan-out raises exactly
what the core's check raises for a parameter of that name: the same exception type
and the same message. Nothing connects: the engines' constructors check before that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from purgatory_aio import Purgatory
from purgatory_aio._validation import check_positive_int, check_positive_seconds, check_seconds
from purgatory_aio.fanout import Fanout, MemoryFanout, MemoryHub, PostgresFanout, RedisFanout
from purgatory_aio.fanout._memory import MemoryBackend

REDIS_URL = "redis://127.0.0.1:1/0"
POSTGRES_URL = "postgresql://127.0.0.1:1/db"


def _plain(**options: Any) -> Fanout:
    return Fanout(MemoryBackend(MemoryHub()), **options)


def _redis(**options: Any) -> Fanout:
    return RedisFanout(REDIS_URL, **options)


def _postgres(**options: Any) -> Fanout:
    return PostgresFanout(POSTGRES_URL, **options)


ENGINES: dict[str, tuple[Callable[..., Fanout], tuple[str, ...]]] = {
    "fanout": (_plain, ("resync_interval", "connect_timeout")),
    "redis": (_redis, ("value_ttl", "resync_interval", "connect_timeout")),
    "postgres": (
        _postgres,
        ("value_ttl", "resync_interval", "connect_timeout", "command_timeout", "health_interval"),
    ),
}
COUNTS = ("queue_size", "batch")


class _Sneaky(float):
    """A float whose conversion says something else: the core checks the converted value."""

    def __float__(self) -> float:
        return math.nan


HOSTILE_SECONDS: list[object] = [
    "1",  # the old rule's ValueError, the core's TypeError
    b"1",
    True,
    None,
    [1.0],
    Decimal("1"),
    Fraction(1, 2),
    math.inf,  # the old rule accepted it
    -math.inf,
    math.nan,
    -1,
    -0.5,
    0,
    0.0,
    10**400,
    _Sneaky(1.0),
]
HOSTILE_COUNTS: list[object] = ["8", 8.0, True, None, 0, -1, -(10**400), Decimal(8)]


def _refusal(check: Callable[[object, str], object], value: object, name: str) -> Exception:
    try:
        check(value, name)
    except (TypeError, ValueError) as exc:
        return exc
    raise AssertionError(f"the core accepts {name}={value!r}")


@pytest.mark.parametrize("rule", ["seconds", "counts"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_option_is_refused_as_the_core_refuses_it(engine: str, rule: str) -> None:
    make, seconds = ENGINES[engine]
    check, names, values = (
        (check_positive_seconds, seconds, HOSTILE_SECONDS)
        if rule == "seconds"
        else (check_positive_int, COUNTS, HOSTILE_COUNTS)
    )
    for name in names:
        for value in values:
            expected = _refusal(check, value, name)
            assert name in str(expected)
            with pytest.raises((TypeError, ValueError)) as caught:
                make(**{name: value})
            assert type(caught.value) is type(expected)
            assert str(caught.value) == str(expected)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_numbers_the_core_takes_are_taken(engine: str) -> None:
    make, options = ENGINES[engine]

    class Count(int):
        pass

    fanout = make(
        **{
            name: value for name, value in zip(options, (1, 0.25, Count(3), 1e9, 2.5), strict=False)
        },
        queue_size=Count(4),
        batch=1,
    )
    assert not fanout.stats().connected


async def test_the_bounds_of_stop_and_of_a_confirmed_advance_follow_the_same_rule() -> None:
    async with Purgatory("a") as a, MemoryFanout(None, a) as fanout:
        for value in HOSTILE_SECONDS:
            expected = _refusal(check_positive_seconds, value, "timeout")
            with pytest.raises(type(expected)) as caught:
                await fanout.advance_confirmed("k", 1, timeout=value)  # type: ignore[arg-type]
            assert str(caught.value) == str(expected)
        assert fanout.stats().queued == 0 and fanout.value("k") is None
        for value in HOSTILE_SECONDS:
            if value in (0, 0.0):
                continue  # flush_timeout=0: stop without waiting for the queue
            expected = _refusal(check_seconds, value, "flush_timeout")
            with pytest.raises(type(expected)) as caught:
                await fanout.stop(flush_timeout=value)  # type: ignore[arg-type]
            assert str(caught.value) == str(expected)
        # Refused calls changed nothing: the fan-out still publishes, and stops once.
        assert await fanout.advance_confirmed("k", 2, timeout=5) == 0
        await fanout.stop(flush_timeout=0)
