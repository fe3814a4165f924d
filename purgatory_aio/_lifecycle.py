"""A purgatory's owner of its operations: admission, loop binding, and what an operation's
aftermath asks of its owner.

The life of an operation in a purgatory::

    admit ─► try ─► watch ─► try ─► timer ─┬─ completed ─► withdraw ─► callbacks ─► settle
                                            ├─ expired   ─► withdraw ─► callbacks ─► settle
                                            ├─ shutdown  ─► withdraw ─► callbacks ─► settle
                                            └─ cancelled ─► withdraw ──────────────► settle

The admission (Kafka's tryCompleteElseWatch) is the operation's own
(:mod:`._operation`, ``admit``: it writes the operation's slots, so it lives with
them), reading what it needs of the lifecycle through its public attributes; the
walks over a key are the watch store's (:mod:`._watches`); everything after a
transition is the operation's own too (``completed`` and ``cancelled``: *withdraw*
takes it out of the timer and retires its watch entries, *callbacks* run
``on_complete``, then ``on_expiration`` if it expired, inline, as a task or in a
worker thread, *settle* records the outcome, releases awaiters and
emits its event). The lifecycle gives that aftermath what only an owner can: the
loop thread (one won on another thread is handed over to it), callback tasks, the
event sink and the counters. User code may raise anything: every ``BaseException``
becomes the operation's outcome and is logged and counted; only
``KeyboardInterrupt`` and ``SystemExit`` propagate, and only after the operation
has settled. Operations no purgatory holds belong to the detached owner
(:mod:`._detached`), the other implementation of :class:`~._owner.Owner`.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.to_thread

from . import _gc, _threads
from ._clock import Clock
from ._errors import FATAL, OutsideLoop, PurgatoryClosed
from ._keys import looked_up
from ._logging import get_logger
from ._operation import completed, settle, transition
from ._owner import Owner
from ._records import event_of
from ._shell import run_callbacks
from ._states import CANCELLED, COMPLETED, EXPIRED, SHUTDOWN
from ._timer import Timer
from ._watches import WatchStore
from .events import EventSink

if TYPE_CHECKING:
    from ._operation import DelayedOperation
    from ._owner import Aftermath

__all__ = ["FATAL", "Lifecycle"]

_log: Final = get_logger("purgatory_aio.purgatory")
_get_ident: Final = _threads.get_ident  # threading.get_ident, see _threads


def _not_started() -> bool:
    """The loop-is-running test of a lifecycle not yet bound to a loop."""
    return False


_running_loop: Final = asyncio._get_running_loop
_CACHED_RUNNING_LOOP: Final = sys.version_info >= (3, 12)  # _running_loop: no getpid()
_BASE_IS_RUNNING: Final = asyncio.BaseEventLoop.is_running

# The cyclic-GC helpers (see _gc): statics in the compiled build, so each is one C call
# with no lookup; None in the pure build.
_track: Final = _gc.track
_track_container: Final = _gc.track_container


class Lifecycle(Owner):
    """The owner of the operations of one purgatory.

    Operations call it only through the :class:`~._owner.Owner` interface; the
    admission (``_operation.admit``) asks it ``on_loop()`` and reads its public
    attributes (now, horizon, store, timer); the purgatory and the watch store's
    walks call the rest (the loop thread, cancel_for_key, shutdown's part).
    """

    def __init__(
        self,
        name: str,
        timer: Timer,
        store: WatchStore,
        clock: Clock,
        *,
        event_sink: EventSink | None = None,
        offload: bool = False,
        offload_threads: int = 8,
        log_operations: bool = False,
    ) -> None:
        super().__init__(
            name,
            detached=False,
            observed=event_sink is not None or log_operations,
            offload=offload,
        )
        self.timer = timer
        self.store = store
        self._clock = clock
        # Bound once: the admission (_operation.admit) reads the clock and the limit
        # without lookups.
        self.now = clock.time
        self.horizon = timer.horizon
        self._sink = event_sink
        self._log_ops = log_operations
        self._offload_threads = offload_threads
        self._capacity: anyio.CapacityLimiter | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: The loop it is bound to, and that loop's is_running (see on_loop).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_running: Callable[[], bool] = _not_started
        #: On 3.11, the loop when its class keeps asyncio's is_running (see start).
        self._base_loop: Any = None
        self.closed = False
        self._ids = itertools.count(1)
        self.n_event_errors = 0

    # -- binding to a loop ---------------------------------------------------------------------

    def start(self) -> None:
        """Bind to the running loop on first use; refuse any other loop afterwards."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise OutsideLoop(
                f"purgatory {self.name!r} must be used from a running event loop"
            ) from None
        if self.loop is not None:
            if self.loop is not loop:
                raise RuntimeError(
                    f"purgatory {self.name!r} belongs to another event loop (or thread)"
                )
            self.thread_id = _get_ident()  # its loop may run on another thread now
            return
        self.loop = loop
        self._loop_running = loop.is_running
        if not _CACHED_RUNNING_LOOP and type(loop).is_running is _BASE_IS_RUNNING:
            self._base_loop = loop  # see on_loop
        self.thread_id = _get_ident()
        self._clock.attach(self)
        _log.debug("purgatory_started", purgatory=self.name)

    def on_loop(self) -> bool:
        """Whether the caller runs on this purgatory's loop, that loop running, and the
        purgatory open: the admission's test (it calls :meth:`enter` when not).

        On the loop's thread with it running, the running loop is that one. 3.12 caches it
        per thread (W1-cost on 3.12, compiled, asyncio: -507 instructions per operation
        against the loop's is_running, a Python method). 3.11's _get_running_loop makes a
        getpid() call (137 ns, against 29 + 23 for is_running), and its asyncio's
        is_running is `self._thread_id is not None`: for a loop whose class keeps that
        method, the test reads the same attribute (W1-cost, compiled, asyncio: -248
        instructions per operation); other loops are asked. 3.11 changes no more.
        """
        return (
            not self.closed
            and self.thread_id == _get_ident()
            and (
                _running_loop() is self.loop
                if _CACHED_RUNNING_LOOP
                else self._base_loop._thread_id is not None
                if self._base_loop is not None
                else self._loop_running()
            )
        )

    def enter(self) -> None:
        """``async with`` the purgatory: refused once shut down, else bound to the loop."""
        if self.closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is shut down")
        self.start()

    def busy_tasks(self) -> tuple[asyncio.Task[None], ...]:
        """Callback tasks still running (for shutdown and ManualClock.advance)."""
        return tuple(self._tasks)

    # -- admission: _operation.admit's (Kafka's tryCompleteElseWatch) --------------------------

    def beyond_horizon(self, op: DelayedOperation[Any]) -> ValueError:
        """The error for admitting ``op``, whose deadline the timer cannot place."""
        return ValueError(
            f"timeout {op.timeout!r} of {op!r} is beyond what the timer of purgatory "
            f"{self.name!r} can place (deadlines up to {self.horizon:.6g} on its clock; "
            "a finer tick shortens that)"
        )

    # -- walks over a key: the watch store's (see WatchStore.check and .advance) --------------

    def cancel_key(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """cancel_for_key: withdraw every pending operation watched under ``key``."""
        store = self.store
        assert store is not None  # a lifecycle's always is (Owner's is typed optional)
        if not looked_up(store, key, False):
            return []
        if self.thread_id != _get_ident():
            raise self.off_loop_thread("cancel_for_key", "")
        # Each one taken is offered its cancel, whatever an override of it does with the
        # others: an answer is taken by its truth (the compiled build's call through the
        # class would demand an exact bool), and the first exception raised is raised once
        # every one has been offered.
        withdrawn: list[DelayedOperation[Any]] = []
        failure: BaseException | None = None
        for op in store.take(key):
            user: Any = op
            try:
                if user.cancel():
                    withdrawn.append(op)
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return withdrawn

    def off_loop_thread(self, what: str, hint: str) -> RuntimeError:
        """The error for a walk over a key called off the loop thread."""
        return RuntimeError(f"{what} called off the loop thread of purgatory {self.name!r}{hint}")

    # -- what an operation's aftermath asks of its owner (see _operation.completed) -----------

    def claim_thread(self) -> bool:
        """Whether this thread, not the one last seen, now runs the purgatory's loop (a
        loop may be run from another thread later): then it is the loop thread."""
        if self.loop is None or _running_loop() is not self.loop:
            return False
        self.thread_id = _get_ident()
        return True

    def callback_failed(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        """A callback of ``op`` raised ``exc``: log and count it (it becomes the outcome)."""
        self.n_errors += 1
        _log.error("callback_error", purgatory=self.name, op=repr(op), stage=stage, exc_info=exc)

    # -- what the shutdown (see _shutdown) asks of it --------------------------------------------

    def loop_closed(self) -> bool:
        """Whether the loop this purgatory is bound to is closed (nothing runs there)."""
        loop = self.loop
        return loop is not None and loop.is_closed()

    def take_over_closed_loop(self) -> None:
        """A shutdown from another loop once this one's is closed: nothing can run there
        any more, so the calling thread settles everything, here and now."""
        if self.loop_closed():
            self.thread_id = _get_ident()

    def expire_for_shutdown(self, op: DelayedOperation[Any]) -> None:
        """The shutdown's transition of a pending ``op`` (completed and expired, marked
        as by shutdown), then its aftermath; nothing if it has ended already."""
        if transition(op, COMPLETED | EXPIRED | SHUTDOWN):
            completed(op, None)

    # -- settlement (the rest is Owner's) -------------------------------------------------------

    def retrack_pending(self) -> None:
        """Give every operation still pending, and the containers holding them, back to
        the cyclic GC: the purgatory that held them is gone (see _gc.DropGuard)."""
        timer, store = self.timer, self.store
        if _track is None or _track_container is None or timer is None or store is None:
            return
        for entry in timer.pending_entries():
            _track(entry)
        for container in store.containers():
            _track_container(container)

    # -- observing settled operations ----------------------------------------------------------

    def observe(self, op: DelayedOperation[Any]) -> None:
        sink = self._sink
        if sink is not None:
            try:
                sink.emit(event_of(op, self.name, next(self._ids), self._clock))
            except BaseException as exc:  # the sink is user code too
                self.n_event_errors += 1
                _log.error("event_sink_error", purgatory=self.name, exc_info=exc)
                if isinstance(exc, FATAL):
                    raise
        if self._log_ops:
            _log.debug("operation_settled", purgatory=self.name, op=repr(op))

    # -- the loop and its tasks ----------------------------------------------------------------

    def hand_over(
        self, aftermath: Aftermath, op: DelayedOperation[Any], failure: BaseException | None
    ) -> None:
        """Run ``aftermath(op, failure)`` on the loop thread, from another thread."""
        loop = self.loop
        assert loop is not None
        try:
            loop.call_soon_threadsafe(aftermath, op, failure)
        except RuntimeError:
            # The loop is closed: nobody is left to run callbacks. Settle with the reason
            # so that anything still holding the operation sees a final outcome.
            closed = PurgatoryClosed(f"purgatory {self.name!r}: its event loop is closed")
            settle(op, None if op._state & CANCELLED else closed, not op._state & CANCELLED)

    def spawn(self, op: DelayedOperation[Any], offload: bool) -> None:
        """Run ``op``'s callbacks in a task on the loop (they settle it when done)."""
        loop = self.loop
        assert loop is not None
        coro = run_callbacks(self, op, offload)
        try:
            task = loop.create_task(coro)
        except BaseException as exc:
            # No task, so nothing else will ever settle it: settle it here. A closed
            # loop (the operation completed on this thread after its loop ended) is
            # what hand_over meets from other threads: the same outcome.
            coro.close()
            if loop.is_closed():
                closed = PurgatoryClosed(f"purgatory {self.name!r}: its event loop is closed")
                settle(op, closed, True)
                return
            self.callback_failed(op, exc, "on_complete")
            settle(op, exc, True)
            if isinstance(exc, FATAL):
                raise
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def limiter(self) -> anyio.CapacityLimiter | None:
        if self._capacity is None:
            self._capacity = anyio.CapacityLimiter(self._offload_threads)
        return self._capacity
