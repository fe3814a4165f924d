"""Deterministic time for tests and virtual-time simulations.

Examples:
    >>> async def test_expires_at_deadline():
    ...     clock = ManualClock()
    ...     async with Purgatory("p", clock=clock) as p:
    ...         op = MyOp(timeout=0.5)
    ...         await p.try_complete_else_watch(op, ["k"])
    ...         await clock.advance(0.499)
    ...         assert not op.is_completed
    ...         await clock.advance(0.002)
    ...         assert op.expired
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import weakref
from collections.abc import Callable
from typing import NoReturn, SupportsIndex

from ._clock import Quiescent
from ._errors import not_copyable
from ._validation import INF, check_instant, check_seconds
from ._waiters import wake

__all__ = ["ManualClock"]

#: 2026-01-01T00:00:00Z: virtual time 0 maps to a fixed, plausible wall-clock instant.
DEFAULT_EPOCH = 1_767_225_600.0
#: Passes of the loop with nothing visibly changing after which woken tasks are taken to
#: be blocked again, and the most passes one settling step makes.
_QUIET_PASSES = 10
_MAX_PASSES = 1000


class _ManualHandle:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback: Callable[[], object] | None = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = None


class ManualClock:
    """A clock that moves only when :meth:`advance` is awaited.

    Timers and purgatories built on it never read real time. ``advance`` walks
    through every wake-up due by the target time in order, setting the clock to
    each one's instant, and after each lets the tasks it woke run and the
    callbacks they started (async ``on_complete``, thread offloads) finish.
    It sees only public signs of activity (wake-ups armed on it, sleepers, the
    purgatories' callback tasks), so it takes woken tasks to be blocked again
    after ten loop passes in which none of these changed: a chain of more hand-offs
    between tasks that touch none of them (queues, events) may finish only after
    time has moved on.

    Concurrent advances take turns, each from the time its turn begins (two
    concurrent ``advance(1)`` move time by 2, as Kafka's MockTime): time never
    goes back, and every wake-up runs at its own instant. An advance awaited by a
    callback task that the running advance waits for starts once that one has
    stopped waiting for it (``stall_timeout``).

    Args:
        start: the initial reading, in seconds.
        epoch: the Unix time that reading 0.0 corresponds to (for event records).
        stall_timeout: real seconds ``advance`` waits for a callback task that makes
            no progress (one awaiting something only a later advance will bring)
            before moving on without it.
    """

    def __init__(
        self, start: float = 0.0, *, epoch: float = DEFAULT_EPOCH, stall_timeout: float = 1.0
    ) -> None:
        self._now = check_instant(start, "start")
        self._epoch = check_instant(epoch, "epoch")
        self._stall_timeout = check_seconds(stall_timeout, "stall_timeout")
        self._heap: list[tuple[float, int, _ManualHandle]] = []
        self._seq = itertools.count()
        self._armed = 0  # wake-ups ever armed: one of the signs of activity _settle watches
        self._sleepers: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()
        # Held strongly (the compiled Purgatory cannot be weakly referenced) and dropped
        # once closed with nothing left running.
        self._watched: dict[int, Quiescent] = {}
        # Makes concurrent advances take turns; one per event loop the clock is used on
        # (an asyncio.Lock binds to the first loop it makes a task wait on).
        self._turns: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @property
    def epoch_offset(self) -> float:
        """The Unix time that reading 0.0 stands for (the ``epoch`` argument)."""
        return self._epoch

    def time(self) -> float:
        """The clock's current reading; it moves only in :meth:`advance`."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> _ManualHandle:
        """Run ``callback`` when an advance reaches ``when``."""
        handle = _ManualHandle(when, callback)
        self._armed += 1
        heapq.heappush(self._heap, (when, next(self._seq), handle))
        return handle

    async def sleep(self, delay: float) -> None:
        """Sleep ``delay`` seconds of virtual time."""
        delay = check_seconds(delay, "delay")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        handle = self.call_at(self._now + delay, lambda: wake(future))
        task = asyncio.current_task()
        if task is not None:
            self._sleepers.add(task)
        try:
            await future
        finally:
            handle.cancel()
            if task is not None:
                self._sleepers.discard(task)

    def next_due(self) -> float | None:
        """The earliest pending wake-up, or None."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    async def advance(self, delta: float) -> None:
        """Move time forward by ``delta`` seconds, running everything due on the way.

        The seconds count from when this advance's turn begins (see the class).

        Raises:
            ValueError: ``delta`` is not a finite number >= 0, or time would leave the
                finite range (``advance(1e308)`` twice): nothing moves, nothing runs.
        """
        delta = check_seconds(delta, "delta")
        self._target(delta)
        async with self._turn():
            await self._advance_to(self._target(delta))

    def _target(self, delta: float) -> float:
        """Now plus ``delta``, refused if it is not a finite time (inf breaks every timer
        and purgatory on the clock: each refuses all input from then on)."""
        target = self._now + delta
        if target == INF:
            raise ValueError(
                f"cannot advance a ManualClock reading {self._now!r} by {delta!r}: "
                "time would leave the finite range"
            )
        return target

    async def advance_to(self, target: float) -> None:
        """Move time forward to ``target`` (never backwards).

        A concurrent advance that has moved past ``target`` by this one's turn
        leaves it nothing to do.
        """
        target = check_instant(target, "target")
        if target < self._now:
            raise ValueError(f"cannot move a ManualClock back from {self._now} to {target}")
        async with self._turn():
            await self._advance_to(max(target, self._now))

    def _turn(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        turns = self._turns
        if turns is None or turns[0] is not loop:
            turns = self._turns = (loop, asyncio.Lock())
        return turns[1]

    async def _advance_to(self, target: float) -> None:
        await self._settle()
        heap = self._heap
        while True:
            due = self.next_due()
            if due is None or due > target:
                break
            _, _, handle = heapq.heappop(heap)
            self._now = max(self._now, handle.when)
            callback = handle.callback
            handle.cancel()
            if callback is not None:
                callback()
            await self._settle()
        self._now = target
        await self._settle()

    def attach(self, owner: Quiescent) -> None:
        """Let ``advance`` wait for ``owner``'s callback tasks before returning.

        Called by each purgatory that starts on this clock (the :class:`Clock` hook).
        """
        self._watched[id(owner)] = owner

    async def _settle(self) -> None:
        """Run the loop until the tasks woken so far are blocked again."""
        while True:
            await self._run_until_quiet()
            busy: list[asyncio.Task[object]] = []
            for key, owner in list(self._watched.items()):
                tasks = owner.busy_tasks()
                if not tasks and owner.closed:
                    del self._watched[key]
                busy.extend(
                    task for task in tasks if not task.done() and task not in self._sleepers
                )
            if not busy:
                return
            done, _ = await asyncio.wait(
                busy, timeout=self._stall_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                return

    def _activity(self) -> tuple[int, int, int]:
        """What visibly changes while woken tasks still run: wake-ups armed and
        pending, tasks sleeping on this clock."""
        return (self._armed, len(self._heap), len(self._sleepers))

    async def _run_until_quiet(self) -> None:
        """Yield to the loop until nothing visible changes for a few passes.

        Each ``sleep(0)`` lets every callback already queued run once. A chain of
        wake-ups (a future set, a task woken, which sets another future...) shows
        itself through armed wake-ups, sleepers or tasks starting and ending; a few
        unchanged passes in a row mean the chain has run out.
        """
        last = self._activity()
        quiet = 0
        for _ in range(_MAX_PASSES):
            await asyncio.sleep(0)
            now = self._activity()
            if now == last:
                quiet += 1
                if quiet >= _QUIET_PASSES:
                    return
            else:
                quiet = 0
                last = now

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise not_copyable(
            self,
            "a clock is the one time source of the purgatories, timers and sleepers built "
            "on it; create another ManualClock instead",
        )

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now})"
