"""Shutdown orchestration: stop taking operations, settle every pending one, and wait
for those still settling.

One :class:`Shutdown` per purgatory, started once by the first
``Purgatory.shutdown()`` (later calls join the same task). Its steps are
synchronous methods here; the coroutines that run them are in
:mod:`._shell` (``shutdown``, ``join_shutdown``, ``settle_all``). Every operation
completed before or during the shutdown settles before it returns: in a callback
task, or in a hand-over from another thread, whose settlement wakes the wait.
A callback task that awaits the shutdown itself (an async ``on_complete`` shutting
its purgatory down) is not waited for: it settles its own operation once the
shutdown returns to it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from ._errors import FATAL
from ._shell import settle_all
from ._validation import check_flag

if TYPE_CHECKING:
    from ._lifecycle import Lifecycle
    from ._operation import DelayedOperation
    from ._timer import Timer
    from ._watches import WatchStore

__all__ = ["Shutdown"]

_running_loop: Final = asyncio._get_running_loop


class Shutdown:
    """The shutdown of one purgatory: its task, and the callback tasks awaiting it."""

    __slots__ = ("_joined", "_joiners", "_life", "_store", "_task", "_timer")

    def __init__(self, life: Lifecycle, timer: Timer, store: WatchStore) -> None:
        self._life = life
        self._timer = timer
        self._store = store
        # Callback tasks awaiting the shutdown, which therefore does not wait for them,
        # and what wakes the shutdown's wait when one more joins (see join).
        self._joiners: set[asyncio.Task[Any]] = set()
        self._joined: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self._life.name

    def check_loop(self) -> None:
        """Refuse a shutdown from anywhere but the purgatory's loop while that loop lives.

        Once its loop is closed, nothing can run there any more: a shutdown from any
        loop then settles everything (callbacks that need the loop settle with
        :class:`PurgatoryClosed`), so that no operation is left hanging.
        """
        loop = self._life.loop
        if loop is not None and loop is not _running_loop() and not loop.is_closed():
            raise RuntimeError(
                f"purgatory {self.name!r} belongs to another event loop (or thread): "
                "shut it down from a coroutine on that loop"
            )

    def task(self, expire_pending: object) -> asyncio.Task[None]:
        """The purgatory's one shutdown task, started by the first call (which checks
        its argument and the loop before anything changes); later calls get the same."""
        shutdown = self._task
        if shutdown is None:
            flag = check_flag(expire_pending, "expire_pending")
            self.check_loop()
            loop = asyncio.get_running_loop()
            self._life.closed = True
            shutdown = self._task = loop.create_task(settle_all(self, flag))
        elif not shutdown.done():
            self.check_loop()
        return shutdown

    def join(self, task: asyncio.Task[Any]) -> bool:
        """``task`` awaits the shutdown: if it is one of the callback tasks, the shutdown
        stops waiting for it (True); otherwise it waits for the shutdown (False)."""
        if task not in self._life.busy_tasks():
            return False
        self._joiners.add(task)
        joined = self._joined
        if joined is not None and not joined.done():
            joined.set_result(None)  # the shutdown is waiting for this task: stop it
        return True

    def leave(self, task: asyncio.Task[Any]) -> None:
        """``task`` (see :meth:`join`) no longer awaits the shutdown."""
        self._joiners.discard(task)

    def callbacks_to_join(self) -> list[asyncio.Task[None]]:
        """Callback tasks a finished shutdown still waits for (none off its own loop)."""
        if _running_loop() is not self._life.loop:
            return []
        return list(self._life.busy_tasks())

    def callbacks_to_wait_for(self) -> set[asyncio.Task[None]]:
        """Callback tasks the shutdown waits for: all but those awaiting it (none once
        the loop is closed: none could run)."""
        if self._life.loop_closed():
            return set()
        return set(self._life.busy_tasks()) - self._joiners

    def watch_joins(self) -> asyncio.Future[None]:
        """A future set when another callback task starts awaiting the shutdown."""
        self._joined = joined = asyncio.get_running_loop().create_future()
        return joined

    def unwatch_joins(self) -> None:
        self._joined = None

    def settle_pending(self, expire_pending: bool) -> tuple[int, list[DelayedOperation[Any]]]:
        """Settle every pending operation (expired or cancelled); return how many there
        were, and those still settling (in a callback task or a hand-over from another
        thread)."""
        life = self._life
        life.closed = True
        life.take_over_closed_loop()
        self._store.stop_purging()
        pending: list[DelayedOperation[Any]] = self._timer.drain_entries()  # type: ignore[assignment]
        fatal: BaseException | None = None
        for op in pending:
            try:
                if not expire_pending:
                    op.cancel()
                else:
                    life.expire_for_shutdown(op)
            except FATAL as exc:  # settled already; the others must settle too
                fatal = fatal or exc
        if fatal is not None:
            raise fatal
        return len(pending), [op for op in pending if not op.done()]

    def finish(self) -> None:
        """Close the timer and the watch store, once every operation has settled."""
        self._timer.close()
        self._store.clear()
