"""naive-futures: what an asyncio developer writes without the library.

Each operation is a future registered in a ``dict[key, set[...]]`` with its
timeout as a loop timer handle; completion resolves the future, cancels the
handle and discards the operation from its sets, and the timeout does the same.

The sets hold a slotted record wrapping the future rather than the bare future:
a future cannot carry attributes, and both the completer and a key scan need the
operation's handle, keys and condition. A developer would write the same record
(or a side dict, which costs more). The timeout is ``loop.call_later(timeout)``,
which *is* ``loop.call_at(loop.time() + timeout)`` minus a Python-level call, so
the baseline gets the cheaper spelling.

Written to be a fair, tight baseline: no per-operation task, no logging, local
variable lookups in the hot paths, empty sets dropped like the purgatory drops
empty watch lists.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable

from ._common import Settlements

__all__ = ["NaiveFutures", "NaiveWaiter", "ThresholdWaiter"]

_monotonic = time.monotonic


class NaiveWaiter:
    """One pending operation of the baseline."""

    __slots__ = ("deadline", "future", "handle", "keys", "ready")

    def __init__(
        self, future: asyncio.Future[bool], keys: tuple[Hashable, ...], deadline: float
    ) -> None:
        self.future = future
        self.keys = keys
        # Kept in time.monotonic terms, the clock lateness is measured against
        # (uvloop's loop.time() is a cached millisecond value).
        self.deadline = deadline
        self.ready = False
        self.handle: asyncio.TimerHandle | None = None


class ThresholdWaiter(NaiveWaiter):
    """A waiter whose condition is ``counter >= threshold`` (W2)."""

    __slots__ = ("threshold",)

    def __init__(
        self,
        future: asyncio.Future[bool],
        keys: tuple[Hashable, ...],
        deadline: float,
        threshold: int,
    ) -> None:
        super().__init__(future, keys, deadline)
        self.threshold = threshold


class NaiveFutures:
    """The naive-futures baseline, reporting to a :class:`Settlements`."""

    __slots__ = ("_loop", "_settlements", "watchers")

    def __init__(self, settlements: Settlements) -> None:
        self._loop = asyncio.get_running_loop()
        self._settlements = settlements
        self.watchers: dict[Hashable, set[NaiveWaiter]] = {}

    def watch(self, keys: tuple[Hashable, ...], timeout: float) -> NaiveWaiter:
        loop = self._loop
        waiter = NaiveWaiter(loop.create_future(), keys, _monotonic() + timeout)
        self._register(waiter, timeout)
        return waiter

    def watch_threshold(
        self, keys: tuple[Hashable, ...], timeout: float, threshold: int
    ) -> ThresholdWaiter:
        loop = self._loop
        waiter = ThresholdWaiter(loop.create_future(), keys, _monotonic() + timeout, threshold)
        self._register(waiter, timeout)
        return waiter

    def add(self, waiter: NaiveWaiter, timeout: float) -> None:
        """Register a waiter the caller built (a subclass carrying its request, W5)."""
        self._register(waiter, timeout)

    def _register(self, waiter: NaiveWaiter, timeout: float) -> None:
        watchers = self.watchers
        for key in waiter.keys:
            waiting = watchers.get(key)
            if waiting is None:
                watchers[key] = {waiter}
            else:
                waiting.add(waiter)
        waiter.handle = self._loop.call_later(timeout, self._expire, waiter)

    def complete(self, waiter: NaiveWaiter) -> bool:
        """Resolve ``waiter`` now; False if it had already settled."""
        future = waiter.future
        if future.done():
            return False
        future.set_result(True)
        handle = waiter.handle
        if handle is not None:
            handle.cancel()
        self._unwatch(waiter)
        self._settlements.completed_one()
        return True

    def _expire(self, waiter: NaiveWaiter) -> None:
        future = waiter.future
        if future.done():
            return
        lateness = _monotonic() - waiter.deadline
        future.set_result(False)
        self._unwatch(waiter)
        self._settlements.expired_one(lateness)

    def _unwatch(self, waiter: NaiveWaiter) -> None:
        watchers = self.watchers
        for key in waiter.keys:
            waiting = watchers.get(key)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del watchers[key]

    def complete_ready(self, key: Hashable) -> int:
        """Scan ``key``'s set and complete every waiter whose flag is set (W1-check)."""
        waiting = self.watchers.get(key)
        if not waiting:
            return 0
        ready = [w for w in waiting if w.ready]
        complete = self.complete
        for waiter in ready:
            complete(waiter)
        return len(ready)

    def complete_reached(self, key: Hashable, value: int) -> int:
        """Scan ``key``'s set and complete every waiter with ``threshold <= value`` (W2)."""
        waiting = self.watchers.get(key)
        if not waiting:
            return 0
        ready = [w for w in waiting if w.threshold <= value]  # type: ignore[attr-defined]
        complete = self.complete
        for waiter in ready:
            complete(waiter)
        return len(ready)

    def cancel_all(self) -> int:
        """Withdraw everything still pending (end of a run); returns how many."""
        pending: dict[NaiveWaiter, None] = {}
        for waiting in self.watchers.values():
            pending.update(dict.fromkeys(waiting))
        self.watchers.clear()
        for waiter in pending:
            if waiter.handle is not None:
                waiter.handle.cancel()
            waiter.future.cancel()
        return len(pending)

    def pending(self) -> int:
        seen: set[NaiveWaiter] = set()
        for waiting in self.watchers.values():
            seen.update(waiting)
        return len(seen)
