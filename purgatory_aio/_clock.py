"""The clock seam: where timers and purgatories read time and arm wake-ups.

Production code runs on :class:`LoopClock`; tests swap in
:class:`purgatory_aio.testing.ManualClock`, whose time moves only when told.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Cancellable(Protocol):
    """A scheduled wake-up that can be withdrawn."""

    def cancel(self) -> None: ...


class Quiescent(Protocol):
    """What a purgatory shows its clock: the callback tasks it still has running."""

    @property
    def closed(self) -> bool: ...

    def busy_tasks(self) -> Sequence[asyncio.Task[Any]]: ...


@runtime_checkable
class Clock(Protocol):
    """Time source and wake-up scheduler used by :class:`~purgatory_aio.Timer`.

    ``time()`` is monotonic seconds; ``epoch_offset`` converts it to Unix time
    (``time() + epoch_offset``) for event records. ``attach(owner)`` is called
    once by each purgatory that starts on the clock: a clock that moves time
    itself (``ManualClock``) waits for the owner's callback tasks; a real clock
    ignores it.
    """

    @property
    def epoch_offset(self) -> float:
        """Add it to ``time()`` to get Unix time (for event records)."""
        ...

    def time(self) -> float:
        """The current time, in seconds (only differences between readings mean anything)."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable:
        """Run ``callback`` on the running loop once ``time() >= when`` (maybe later)."""
        ...

    async def sleep(self, delay: float) -> None:
        """Return once ``delay`` seconds of this clock's time have passed."""
        ...

    def attach(self, owner: Quiescent) -> None:
        """Told of a timer or purgatory built on this clock, so the clock can wait for
        its callbacks when it moves time; a real-time clock ignores it."""
        ...


class LoopClock:
    """Real time: ``time.monotonic`` and the running loop's timers.

    ``time.monotonic`` rather than ``loop.time()``: uvloop's ``loop.time()`` is a
    millisecond value cached once per loop iteration, which would let a deadline
    computed from it fall before the real instant. Wake-ups armed through the
    loop may still fire a little early (clock resolution, uvloop's millisecond
    rounding), so every consumer re-checks ``time()`` when woken.
    """

    __slots__ = ("_epoch_offset",)

    def __init__(self) -> None:
        self._epoch_offset = time.time() - time.monotonic()

    @property
    def epoch_offset(self) -> float:
        """Unix time minus monotonic time, measured when the clock was made."""
        return self._epoch_offset

    time = staticmethod(time.monotonic)

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable:
        """Run ``callback`` on the running loop once ``time() >= when`` (maybe later)."""
        loop = asyncio.get_running_loop()
        # Measured against the loop's own clock: uvloop's is the start of the current
        # iteration, truncated to the millisecond, and it rounds delays to whole
        # milliseconds; rounding up there keeps wake-ups from landing early and
        # spinning through re-arms until the deadline.
        delay = when - loop.time()
        if _coarse_timers(loop):
            delay = math.ceil(delay * 1000.0) / 1000.0
        return loop.call_later(max(0.0, delay), callback)

    async def sleep(self, delay: float) -> None:
        """``asyncio.sleep(delay)``."""
        await asyncio.sleep(delay)

    def attach(self, owner: Quiescent) -> None:
        """Real time waits for nobody."""

    def __repr__(self) -> str:
        return "LoopClock()"


_coarse: dict[type, bool] = {}


def _coarse_timers(loop: asyncio.AbstractEventLoop) -> bool:
    """True for loops whose timers have millisecond resolution (uvloop)."""
    kind = type(loop)
    coarse = _coarse.get(kind)
    if coarse is None:
        coarse = _coarse[kind] = kind.__module__.partition(".")[0] == "uvloop"
    return coarse


#: Shared by every timer and purgatory built without an explicit clock.
DEFAULT_CLOCK = LoopClock()
