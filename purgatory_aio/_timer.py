"""Hierarchical timing wheel with one deadline-driven asyncio reaper.

Adding or cancelling a timer links or unlinks it in one bucket's list: O(1)
whatever the number pending. Only buckets go into the priority queue of due
times, each at most once per rotation, so the queue stays as small as the
number of non-empty slots. One reaper task sleeps until the earliest queued
bucket is due; with nothing pending it sleeps on a future nobody resolves, so an
idle timer costs no wake-ups at all.

Deadlines map to tick ``ceil(deadline / tick)``. A bucket is due from the
earliest deadline placed in it, not from the end of its tick: the reaper fires
the entries whose deadline has passed and leaves the rest of the bucket for the
next wake-up. Expirations are then late by the event loop's own wake-up delay
only, not by the tick on top of it, for at most one more wake-up per bucket.
An entry is fired only once the clock has reached its own deadline, which keeps
early wake-ups of the event loop (clock resolution, uvloop's millisecond
rounding) from firing anything early. At equal due ticks higher levels cascade
first, so entries fire in deadline order.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable, Coroutine
from typing import Any, Final, NoReturn, SupportsFloat, SupportsIndex, final

from . import _shell, _threads
from ._clock import DEFAULT_CLOCK, Cancellable, Clock
from ._entry import TimerEntry, TimerHandle
from ._errors import FATAL, not_copyable
from ._logging import get_logger
from ._native import refuse_subclass
from ._validation import (
    check_callable,
    check_instant,
    check_positive_int,
    check_positive_seconds,
    check_seconds,
)
from ._wheels import CASCADE_CHUNK, MAX_TICKS, NOT_QUEUED, Wheels, by_deadline

__all__ = ["CASCADE_CHUNK", "MAX_TICKS", "Timer", "TimerEntry", "TimerHandle"]

_log: Final = get_logger("purgatory_aio.timer")

_INF: Final = math.inf
#: The finest tick accepted: below it, tick arithmetic on a monotonic clock loses meaning.
MIN_TICK: Final = 1e-9
_heappop: Final = heapq.heappop
_callable: Final = callable  # a static in the compiled build, not a builtins lookup
_running_loop: Final = asyncio._get_running_loop
_get_ident: Final = _threads.get_ident  # threading.get_ident, see _threads


@final
class Timer(Wheels):
    """Masses of timeouts at O(1) per add and cancel, on one asyncio reaper.

    Examples:
        >>> async def main():
        ...     timer = Timer()
        ...     handle = timer.call_later(0.05, print, "late")
        ...     handle.cancel()                # removed from its bucket at once
        ...     assert len(timer) == 0

    Args:
        tick: width of a level-0 slot in seconds (at least 1 ns). A callback runs
            once the clock has reached its deadline, never before, late only by
            the event loop's own wake-up delay; the tick sets how many deadlines
            share a bucket, and how far ahead one can be placed
            (``MAX_TICKS * tick``: 285,000 years at 1 ms).
        wheel_size: slots per level.
        clock: time source; the running loop's monotonic clock by default,
            :class:`~purgatory_aio.testing.ManualClock` in tests.

    A timer can be created anywhere, but it belongs to the event loop it is
    first used on and, like asyncio's own scheduling calls, must be used from
    that loop's thread, from a coroutine or callback running on it. It is final
    and takes no weak references, on both builds.
    """

    __slots__ = (
        "_armed",
        "_armed_when",
        "_clock",
        "_loop",
        "_loop_running",
        "_now",
        "_reaper",
        "_rearm_soon",
        "_thread_id",
        "_wake",
        "wakeups",
    )

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Final on both builds, as Purgatory (see there for what it buys).
        raise refuse_subclass("Timer", cls)

    def __init__(
        self,
        tick: SupportsFloat = 0.001,
        wheel_size: SupportsIndex = 20,
        clock: Clock | None = None,
    ) -> None:
        seconds = check_positive_seconds(tick, "tick")
        if seconds < MIN_TICK:
            raise ValueError(f"tick must be at least {MIN_TICK} s (1 ns), got {tick!r}")
        size = check_positive_int(wheel_size, "wheel_size", minimum=2)
        self._clock: Clock = DEFAULT_CLOCK if clock is None else clock
        # The clock's reading function, bound once: a call through it skips the
        # method lookup on the clock that every add would otherwise make.
        self._now: Callable[[], float] = self._clock.time
        now = self._now()
        horizon = MAX_TICKS * seconds
        if not -horizon < now < horizon:
            raise ValueError(
                f"tick {tick!r} is too fine for this clock, which reads {now!r}: "
                f"at most {MAX_TICKS} ticks can be counted"
            )
        super().__init__(seconds, size, now)
        self._loop: asyncio.AbstractEventLoop | None = None
        # The thread _loop runs on and its is_running, once bound (see _check_loop).
        self._thread_id = -1
        self._loop_running: Callable[[], bool] = bool
        self._reaper: asyncio.Task[None] | None = None
        self._rearm_soon = False
        self._wake: asyncio.Future[None] | None = None
        self._armed: Cancellable | None = None
        self._armed_when = _INF
        #: Reaper wake-ups so far (each processes every bucket due by then).
        self.wakeups = 0

    # -- public API ------------------------------------------------------------------------

    @property
    def tick(self) -> float:
        """The width of a bucket of the finest wheel, in seconds: the timer's resolution."""
        return self._tick

    @property
    def clock(self) -> Clock:
        """The time source deadlines are read from."""
        return self._clock

    @property
    def levels(self) -> int:
        """Wheel levels created so far (overflow levels appear on demand)."""
        return len(self._levels)

    def time(self) -> float:
        """The current time of this timer's clock."""
        return self._clock.time()

    def call_later(
        self, delay: SupportsFloat, callback: Callable[..., object], *args: Any
    ) -> TimerHandle:
        """Run ``callback(*args)`` on the loop once ``delay`` seconds have passed."""
        # Parameters typed as protocols are not checked by the compiled build, so bad
        # input always reaches the checks here and gets their messages.
        seconds: float
        # An exact float only: a subclass could override its comparisons.
        if type(delay) is float and 0.0 <= delay < _INF:
            seconds = delay
        else:
            seconds = check_seconds(delay, "delay")
        if not _callable(callback):
            check_callable(callback, "callback")
        when = self._now() + seconds
        if when >= self.horizon:
            self.beyond(delay)
        self.check_loop()
        handle = TimerHandle(self, callback, args, when)
        self.add_entry(handle, when)
        return handle

    def call_at(
        self, when: SupportsFloat, callback: Callable[..., object], *args: Any
    ) -> TimerHandle:
        """Run ``callback(*args)`` once the clock reads ``when`` (at once if already past).

        Any finite ``when`` below :attr:`horizon` is accepted. One further back than
        ``-horizon`` (``-sys.float_info.max``, say) is past on every clock the timer
        accepts (it refuses one reading below that when created, and clocks only move
        forward): it runs at once like any past deadline, and ``when()`` reads
        ``-horizon``, the earliest deadline the timer counts in ticks.
        """
        instant = check_instant(when, "when")
        check_callable(callback, "callback")
        horizon = self.horizon
        if instant >= horizon:
            raise ValueError(
                f"when={when!r} is beyond what this timer can place "
                f"(up to {horizon:.6g} on its clock; a finer tick shortens that)"
            )
        self.check_loop()
        # Below -horizon the tick arithmetic of add_entry would leave the float range
        # (-1e306 / 1 ms is -inf) after the entry was counted.
        deadline = instant if instant > -horizon else -horizon
        handle = TimerHandle(self, callback, args, deadline)
        self.add_entry(handle, deadline)
        return handle

    def check_loop(self) -> None:
        """Refuse an add from anywhere but the loop this timer belongs to.

        Every add is checked, before anything changes, not only the first after an
        idle spell: once an entry is linked, the loop's own call_soon would be the
        first to notice, or nothing would (the entry then waits for a reaper that
        lives on a loop that does not run). The check that passes at once: this is the
        thread the timer's loop runs on, and that loop is running (a thread runs one
        loop at a time, so it is the running one), through the loop's ``is_running``
        bound once. It took call_later+cancel (compiled) from 116 to 161 ns on
        asyncio's loop, whose is_running is Python code, and from 118 to 135 ns on
        uvloop's. Asyncio's own ``_get_running_loop`` would say the same in one call,
        but Python 3.11 makes it call getpid(), a system call: 254 ns on both loops.
        A purgatory's adds skip all this: its admission has checked the loop already.
        """
        if _get_ident() == self._thread_id and self._loop_running():
            return
        loop = self._loop
        if loop is None:
            return  # the first add: _start binds the timer to the running loop
        if _running_loop() is not loop:
            raise RuntimeError(
                "this Timer belongs to another event loop (or thread): use it from a "
                "coroutine or callback on the loop it was first used on"
            )
        self._thread_id = _get_ident()  # its loop runs on another thread than before

    def beyond(self, delay: object) -> NoReturn:
        """Refuse ``delay``, which puts a deadline beyond the horizon."""
        raise ValueError(
            f"delay {delay!r} is beyond what this timer can place "
            f"(deadlines up to {self.horizon:.6g} on its clock; a finer tick shortens that)"
        )

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        """Stop the reaper and drop every pending entry without running it.

        Safe from one of the timer's own callbacks: the callbacks due in the same
        pass that have not run yet are dropped too. The timer can be used again
        afterwards (a new reaper starts with the next timer added).
        """
        for entry in self.drain_entries():
            if isinstance(entry, TimerHandle):
                entry.cancel()
        self._stop_reaper()

    # Plain methods returning a coroutine of the interpreted _shell module (see there).
    def __aenter__(self) -> Coroutine[Any, Any, Timer]:
        return _shell.returning(self)

    def __aexit__(self, *exc_info: object) -> Coroutine[Any, Any, None]:
        return _shell.called(self.close)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise not_copyable(
            self,
            "a timer is one live holder of its pending callbacks, its reaper and its event "
            "loop; create another Timer instead",
        )

    def __repr__(self) -> str:
        return f"<Timer tick={self._tick} pending={self._count} levels={len(self._levels)}>"

    # -- the entry API (add_entry and remove_entry are Wheels', beside the buckets) -----------

    def pending_entries(self) -> list[TimerEntry]:
        """Every pending entry, left in place (in no particular order)."""
        entries: list[TimerEntry] = []
        for bucket in [*(b for wheel in self._levels for b in wheel.buckets), *self._carries]:
            if bucket.size:
                entries.extend(bucket.entries())
        if self._firing is not None:
            held = self._batch
            entries.extend(entry for entry in self._firing if entry._bucket is held)
        return entries

    def drain_entries(self) -> list[TimerEntry]:
        """Remove and return every pending entry, in deadline order."""
        entries: list[TimerEntry] = []
        buckets = [bucket for wheel in self._levels for bucket in wheel.buckets]
        for bucket in [*buckets, *self._carries]:
            if bucket.size:
                entries.extend(bucket.take())
            bucket.expiration = NOT_QUEUED
        self._carries.clear()
        if self._firing is not None:
            # Called by a callback of a batch being fired: its entries not visited yet.
            held = self._batch
            for entry in self._firing:
                if entry._bucket is held:
                    held.remove(entry)
                    entries.append(entry)
            self._firing = None
        entries.sort(key=by_deadline)
        self._heap.clear()
        self._count = 0
        self._epoch += 1
        self._disarm()
        return entries

    # -- placing -------------------------------------------------------------------------------

    def _leave_idle(self) -> None:
        """The first entry after an idle spell (or ever): start and catch up.

        With nothing pending, every queued bucket is empty and nothing can be due
        before the present, so the queue is forgotten and the wheel jumps to now
        instead of cascading new entries down from stale levels.
        """
        if self._reaper is None:
            self._start()
        if self._heap:
            self._reset_queue()
        now_tick = self._tick_of(self._clock.time())
        if now_tick > self._level0.current:
            for level in self._levels:
                level.advance(now_tick)

    def _sooner(self, when: float) -> None:
        """Something is now due at ``when``: wake earlier than armed if need be."""
        if not self._reaping and not self._rearm_soon and when < self._armed_when:
            # Re-arm at the end of this loop iteration, not now: a request timeout is
            # usually added and cancelled again before then (the request completed), and
            # the wake-up then needs no change at all.
            self._rearm_soon = True
            self._loop.call_soon(self._rearm)  # type: ignore[union-attr]

    def _rearm(self) -> None:
        self._rearm_soon = False
        if not self._reaping:
            self._arm_next()

    # -- the reaper ----------------------------------------------------------------------------
    # One task, woken by one loop timer armed for the first deadline of the earliest
    # queued bucket. Each wake-up is one pass of _advance: the due buckets are taken
    # in order and each is fired (level 0), cascaded down (higher levels) or fed a
    # chunk (a carry); then the wheels catch up with the clock.

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "a Timer must be used from a running event loop: create it anywhere, but "
                "call call_later()/call_at() from a coroutine or callback on that loop"
            ) from None
        if self._loop is not None and self._loop is not loop:
            raise RuntimeError("this Timer belongs to another event loop")
        self._loop = loop
        self._thread_id = _get_ident()
        self._loop_running = loop.is_running
        self._reaper = loop.create_task(
            _shell.reap(self), name=f"purgatory_aio-reaper-{id(self):x}"
        )

    def _stop_reaper(self) -> None:
        self._disarm()
        reaper, self._reaper = self._reaper, None
        if reaper is not None and not reaper.done():
            reaper.cancel()

    # The reaper's loop is the coroutine _shell.reap; these are its steps.

    def reaper_is(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task`` is this timer's reaper (a replaced reaper stops)."""
        return self._reaper is task

    def next_wake(self) -> asyncio.Future[None]:
        """Arm the wake-up for the earliest bucket; the future it sets."""
        loop = self._loop
        assert loop is not None
        self._wake = wake = loop.create_future()
        self._arm_next()
        return wake

    def reap_once(self) -> None:
        """One pass of the reaper after a wake-up: fire, cascade and feed what is due."""
        self.wakeups += 1
        try:
            self._advance(self._clock.time())
        except FATAL:
            # KeyboardInterrupt/SystemExit from a callback: everything else is back in
            # place; a new reaper takes over if the loop runs on.
            self._reaper = None
            loop = self._loop
            assert loop is not None
            loop.call_soon(self._revive)
            raise
        except BaseException:  # a bug in one pass must not stop every later timeout
            _log.exception("timer_reaper_error")

    def _revive(self) -> None:
        if self._reaper is None and self._count:
            self._start()

    def _on_due(self) -> None:
        self._armed = None
        self._armed_when = _INF
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _arm(self, when: float) -> None:
        if self._armed is not None:
            self._armed.cancel()
        self._armed_when = when
        self._armed = self._clock.call_at(when, self._on_due)

    def _disarm(self) -> None:
        if self._armed is not None:
            self._armed.cancel()
            self._armed = None
        self._armed_when = _INF

    def _arm_next(self) -> None:
        """Arm the wake-up for the first deadline of the earliest non-empty bucket, or none."""
        heap = self._heap
        while heap:
            expiration, _, _, bucket = heap[0]
            if bucket.expiration == expiration and bucket.size:
                when = expiration * self._tick
                if bucket.first < when:
                    when = bucket.first
                if when != self._armed_when:
                    self._arm(when)
                return
            _heappop(heap)
            if bucket.expiration == expiration:
                bucket.expiration = NOT_QUEUED
        self._disarm()

    def _reset_queue(self) -> None:
        """With nothing pending, every queued bucket is empty: forget them all."""
        for _, _, _, bucket in self._heap:
            bucket.expiration = NOT_QUEUED
        self._heap.clear()
        self._carries.clear()
        self._disarm()
