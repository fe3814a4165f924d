"""The owner of every operation's lifecycle: what follows each transition, in one place.

An operation flips its own state word and reports who won
(:mod:`~purgatory_aio._operation`); the winner then calls its owner, a
:class:`Lifecycle`, through the three methods declared below. Read top to
bottom, this module is the whole life of an operation in a purgatory::

    admit ─► try ─► watch ─► try ─► timer ─┬─ completed ─► withdraw ─► callbacks ─► settle
                                            ├─ expired   ─► withdraw ─► callbacks ─► settle
                                            ├─ cancelled ─► withdraw ──────────────► settle
                                            └─ shutdown  ─► withdraw ─► callbacks ─► settle

*withdraw* takes it out of the timer and retires its watch entries; *callbacks*
run ``on_complete`` (then ``on_expiration`` if it expired) inline, as a task, or
in a worker thread; *settle* records the outcome, releases awaiters, counts it
and emits its event. Everything after a transition runs on the loop thread: a
transition won on another thread is handed over. User code may raise anything:
every ``BaseException`` becomes the operation's outcome and is logged and
counted; only ``KeyboardInterrupt`` and ``SystemExit`` propagate, and only
after the operation has settled.

Operations never handed to a purgatory belong to :data:`DETACHED`, which runs
their callbacks where they complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, Final, NoReturn

import anyio
import anyio.to_thread

from . import _gc
from ._clock import DEFAULT_CLOCK, Clock
from ._errors import FATAL, OutsideLoop, PurgatoryClosed
from ._logging import get_logger
from ._shell import run_callbacks, settle_all
from ._states import (
    CANCELLED,
    COMPLETED,
    ENDED,
    EXPIRED,
    FAILED,
    SETTLED,
    SHUTDOWN,
    describe,
    transition,
)
from ._timer import Timer
from ._validation import check_flag
from ._watches import IN_WALK, WatchStore
from .events import EventSink, OperationEvent

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ["DETACHED", "FATAL", "Lifecycle", "try_guarded"]

_log: Final = get_logger("purgatory_aio.purgatory")


_get_ident: Final = threading.get_ident


def _not_started() -> bool:
    """The loop-is-running test of a lifecycle not yet bound to a loop."""
    return False


_running_loop: Final = asyncio._get_running_loop

# The cyclic-GC helpers (see _gc): statics in the compiled build, so each is one C call
# with no lookup; None in the pure build.
_untrack: Final = _gc.untrack
_track: Final = _gc.track
_track_container: Final = _gc.track_container


class Lifecycle:
    """Everything that happens to the operations of one purgatory after a transition.

    The interface operations call (and nothing else of this class):
    :meth:`completed`, :meth:`expired`, :meth:`cancelled` and :meth:`callback_failed`.
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
        self.name = name
        self._timer = timer
        self._store = store
        self._clock = clock
        # Bound once: the admission path reads the clock and the limit without lookups.
        self._now = clock.time
        self._horizon = timer.horizon
        self._sink = event_sink
        self._log_ops = log_operations
        self._observed = event_sink is not None or log_operations
        self._offload = offload
        self._offload_threads = offload_threads
        self._capacity: anyio.CapacityLimiter | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Callback tasks awaiting the shutdown, which therefore does not wait for them,
        # and what wakes the shutdown's wait when one more joins (see join_shutdown).
        self._joiners: set[asyncio.Task[Any]] = set()
        self._joined: asyncio.Future[None] | None = None
        self._shutdown_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_running: Callable[[], bool] = _not_started
        self._thread_id = -1
        self.closed = False
        self._ids = itertools.count(1)
        self.n_completed = 0
        self.n_expired = 0
        self.n_cancelled = 0
        self.n_shutdown = 0
        self.n_errors = 0
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
        if self._loop is not None:
            if self._loop is not loop:
                raise RuntimeError(
                    f"purgatory {self.name!r} belongs to another event loop (or thread)"
                )
            self._thread_id = _get_ident()  # its loop may run on another thread now
            return
        self._loop = loop
        self._loop_running = loop.is_running
        self._thread_id = _get_ident()
        self._clock.attach(self)
        _log.debug("purgatory_started", purgatory=self.name)

    def enter(self) -> None:
        """``async with`` the purgatory: refused once shut down, else bound to the loop."""
        if self.closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is shut down")
        self.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def busy_tasks(self) -> tuple[asyncio.Task[None], ...]:
        """Callback tasks still running (for shutdown and ManualClock.advance)."""
        return tuple(self._tasks)

    # -- admission: try, watch, try again, time ------------------------------------------------

    def watch(
        self, op: DelayedOperation[Any], keys: Iterable[Hashable], threshold: float | None
    ) -> bool:
        """Kafka's tryCompleteElseWatch: True if ``op`` completed during the call.

        Everything is checked before anything changes: a refused operation is left
        as it was, usable elsewhere.
        """
        if self.closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is shut down")
        # On the thread the purgatory's loop runs on, with that loop running, the running
        # loop is that one (a thread runs one loop at a time). Checked that way rather
        # than by asyncio's _get_running_loop, which on Python 3.11 makes a getpid()
        # system call each time: 137 against 29 + 23 ns per call here.
        if self._thread_id != _get_ident() or not self._loop_running():
            self.start()
        watch_keys = _check_watch(op, keys)
        deadline = self._now() + op._timeout
        if deadline >= self._horizon:
            raise ValueError(
                f"timeout {op._timeout!r} of {op!r} is beyond what the timer of purgatory "
                f"{self.name!r} can place (deadlines up to {self._horizon:.6g} on its clock; "
                "a finer tick shortens that)"
            )
        # Admitted: from here on the operation is this owner's until it settles. Another
        # thread completing or cancelling it this very moment may still have read the
        # detached owner: it then settles the operation itself, and the checks of ENDED
        # below stop the admission before anything is watched or timed.
        op._owner = self
        op._keys = watch_keys
        op._deadline = deadline
        if try_guarded(op):
            return True
        if op._state & ENDED:
            return False  # another thread completed or cancelled it; its hand-over follows
        try:
            if threshold is None:
                self._store.watch(op, watch_keys)
            else:
                self._store.watch_threshold(op, watch_keys[0], threshold)
        except BaseException as exc:
            # Comparing a key with one already watched raised (the keys themselves were
            # checked above; the operation is never hashed): nothing may stay half-watched.
            # The try costs nothing measurable (callgrind, compiled and pure).
            self._refuse(op, watch_keys, exc)
        # Ended meanwhile (another thread)? try_guarded declines, and the timer is skipped.
        if try_guarded(op):
            return True
        if not op._state & ENDED:
            self._timer._add(op, deadline)
            if _untrack is not None:
                # Pending now, held by the timer until it settles (which tracks it
                # again): no full collection traverses it meanwhile (see _gc). W1's
                # outside variant, 1M operations: 1.42 -> 1.05 us net per operation on
                # asyncio, 1.32 -> 1.08 on uvloop (the class opted out vs not, one run).
                _untrack(op)
        return False

    def _refuse(
        self, op: DelayedOperation[Any], keys: tuple[Hashable, ...], exc: BaseException
    ) -> NoReturn:
        """Undo the admission of ``op``, which the watch lists raised ``exc`` for."""
        self._store.unwatch(op, keys)
        op._owner = DETACHED
        op._keys = ()
        if not isinstance(exc, Exception) or isinstance(exc, MemoryError):
            raise exc
        error: TypeError | None = None
        for key in keys:
            if _fails_lookup(self._store, key):
                error = _bad_key(key, exc, "watch key")
                break
        if error is None:
            error = TypeError(f"watching {op!r} under {keys!r} failed: {exc!r}")
        raise error from exc

    # -- walks over a key (loop thread; re-entrant calls from callbacks are fine) --------------

    def check(self, key: Hashable) -> int:
        """check_and_complete: try every pending operation watched under ``key``."""
        store = self._store
        if not _looked_up(store, key, False):
            return 0
        self._on_loop_thread("check_and_complete", "; use check_and_complete_threadsafe")
        return store.check(key, try_guarded)

    def advance(self, key: Hashable, value: float) -> int:
        """advance_key: try the threshold operations on ``key`` that ``value`` reaches."""
        store = self._store
        if not _looked_up(store, key, True):
            return 0
        self._on_loop_thread("advance_key", "")
        # The tries run here, with try_guarded called natively: handed to the store as a
        # callable, each try went through its Python-level wrapper (W2 at P = 100k: 72
        # instructions per reached operation, callgrind).
        reached = store.begin_walk(key, value)
        if reached is None:
            return 0
        completed = 0
        visited = 0
        # The ones still watched after their try: usually none.
        left: list[DelayedOperation[Any]] = []
        try:
            for op in reached:
                if op._store == IN_WALK:  # not a stale entry, nor taken by cancel_for_key
                    if try_guarded(op) and op._state & COMPLETED:
                        completed += 1
                    if op._state & ENDED:
                        store.walked(op)
                    else:
                        left.append(op)
                visited += 1
        finally:
            if visited < len(reached):  # interrupted: the rest were never tried
                left.extend(reached[visited:])
            store.end_walk(key, reached, left)
        return completed

    def cancel_key(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """cancel_for_key: withdraw every pending operation watched under ``key``."""
        store = self._store
        if not _looked_up(store, key, False):
            return []
        self._on_loop_thread("cancel_for_key", "")
        return [op for op in store.take(key) if op.cancel()]

    def _on_loop_thread(self, what: str, hint: str) -> None:
        if self._thread_id != _get_ident():
            raise RuntimeError(
                f"{what} called off the loop thread of purgatory {self.name!r}{hint}"
            )

    # -- the transitions' aftermath (called by the operation that won) -------------------------

    def completed(self, op: DelayedOperation[Any], failure: BaseException | None) -> None:
        """``op`` won *completed*: satisfied, or ``try_complete`` raised ``failure``."""
        if self._thread_id != _get_ident():
            self._hand_over(self.completed, op, failure)
            return
        # Won on the loop thread: if a try of op is under way, this is its doing (see
        # try_guarded, which reads this when try_complete raises after completing).
        # Measured (callgrind, per watched-and-completed op): compiled unchanged at
        # 11.5k instructions, pure +73 of 39.8k.
        op._busy = False
        # _withdraw(op), inlined: this is every satisfied operation's path.
        if op._bucket is not None:
            self._timer._remove(op)
        if op._store:
            self._store.retire(op)
        self.n_completed += 1
        if failure is None:
            self._run_callbacks(op)
        else:
            self.settle(op, failure, True)

    def expired(self, op: DelayedOperation[Any]) -> None:
        """``op`` won *expired*: the timer found its deadline passed (on the loop thread)."""
        self.n_expired += 1
        self._withdraw(op)
        self._run_callbacks(op)

    def cancelled(self, op: DelayedOperation[Any]) -> None:
        """``op`` won *cancelled*: no callback runs, awaiters get CancelledError."""
        if self._thread_id != _get_ident():
            self._hand_over(self.cancelled, op)
            return
        self._withdraw(op)
        self.n_cancelled += 1
        self.settle(op, None, False)

    def callback_failed(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        """A callback of ``op`` raised ``exc``: log and count it (it becomes the outcome)."""
        self.n_errors += 1
        _log.error("callback_error", purgatory=self.name, op=repr(op), stage=stage, exc_info=exc)

    def check_can_complete(self, op: DelayedOperation[Any]) -> None:
        """Refuse a completion that could not run its callbacks (detached operations)."""

    # -- shutdown ------------------------------------------------------------------------------

    def check_shutdown_loop(self) -> None:
        """Refuse a shutdown from anywhere but this purgatory's loop while that loop lives.

        Once its loop is closed, nothing can run there any more: a shutdown from any
        loop then settles everything (callbacks that need the loop settle with
        :class:`PurgatoryClosed`), so that no operation is left hanging.
        """
        loop = self._loop
        if loop is not None and loop is not _running_loop() and not loop.is_closed():
            raise RuntimeError(
                f"purgatory {self.name!r} belongs to another event loop (or thread): "
                "shut it down from a coroutine on that loop"
            )

    def shutdown_task(self, expire_pending: object) -> asyncio.Task[None]:
        """The purgatory's one shutdown task, started by the first call (which checks
        its argument and the loop before anything changes); later calls get the same."""
        shutdown = self._shutdown_task
        if shutdown is None:
            flag = check_flag(expire_pending, "expire_pending")
            self.check_shutdown_loop()
            loop = asyncio.get_running_loop()
            self.closed = True
            shutdown = self._shutdown_task = loop.create_task(settle_all(self, flag))
        elif not shutdown.done():
            self.check_shutdown_loop()
        return shutdown

    def join(self, task: asyncio.Task[Any]) -> bool:
        """``task`` awaits the shutdown: if it is one of the callback tasks, the shutdown
        stops waiting for it (True); otherwise it waits for the shutdown (False)."""
        if task not in self._tasks:
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
        if _running_loop() is not self._loop:
            return []
        return list(self._tasks)

    def callbacks_to_wait_for(self) -> set[asyncio.Task[None]]:
        """Callback tasks the shutdown waits for: all but those awaiting it (none once
        the loop is closed: none could run)."""
        if self._loop_closed():
            return set()
        return self._tasks - self._joiners

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
        self.closed = True
        pending: list[DelayedOperation[Any]] = self._timer._drain()  # type: ignore[assignment]
        fatal: BaseException | None = None
        for op in pending:
            try:
                if not expire_pending:
                    op.cancel()
                elif expire_for_shutdown(op):
                    self.n_shutdown += 1
                    self._withdraw(op)
                    self._run_callbacks(op)
            except FATAL as exc:  # settled already; the others must settle too
                fatal = fatal or exc
        if fatal is not None:
            raise fatal
        return len(pending), [op for op in pending if not op._state & SETTLED]

    def finish_shutdown(self) -> None:
        """Close the timer and the watch store, once every operation has settled."""
        self._timer.close()
        self._store.clear()

    def _loop_closed(self) -> bool:
        loop = self._loop
        return loop is not None and loop.is_closed()

    # -- withdraw, callbacks, settle -----------------------------------------------------------

    def _withdraw(self, op: DelayedOperation[Any]) -> None:
        """Out of the timer, and its watch entries stale."""
        if op._bucket is not None:
            self._timer._remove(op)
        if op._store:
            self._store.retire(op)

    def _run_callbacks(self, op: DelayedOperation[Any]) -> None:
        """``on_complete`` (then ``on_expiration`` if expired), then settle."""
        cls = type(op)
        expired = op._state & EXPIRED
        inline = cls._inline_expire if expired else cls._inline_complete
        if inline and not self._offload:
            stage = "on_complete"
            try:
                result = op.on_complete()
                if expired:
                    stage = "on_expiration"
                    op.on_expiration()
            except BaseException as exc:
                self.callback_raised(op, exc, stage)
            else:
                self.settle(op, result, False)
            return
        self._spawn(op, cls.offload_callbacks or self._offload)

    def callback_raised(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        """A callback of ``op`` raised ``exc`` at ``stage``: log and count it, settle ``op``
        with it, and raise it again if it must stop the program (KeyboardInterrupt,
        SystemExit)."""
        self.callback_failed(op, exc, stage)
        self.settle(op, exc, True)
        if isinstance(exc, FATAL):
            raise exc

    def settle(self, op: DelayedOperation[Any], outcome: Any, failed: bool) -> None:
        """Record the outcome, release awaiters, emit the event (once per operation)."""
        if _track is not None:
            # Every settlement ends here: the operation (untracked while pending, see
            # watch) and its dict are the collector's again.
            _track(op)
        if failed:  # a branch the state bits needed anyway: success costs nothing more
            if isinstance(outcome, StopIteration):
                outcome = _not_a_result(outcome)
            op._outcome = outcome
            op._state |= SETTLED | FAILED
        else:
            op._outcome = outcome
            op._state |= SETTLED
        waiter = op._waiter
        if waiter is not None:
            op._waiter = None
            _release(waiter)
        if self._observed:
            self._observe(op)

    def retrack_pending(self) -> None:
        """Give every operation still pending, and the containers holding them, back to
        the cyclic GC: the purgatory that held them is gone (see _gc.DropGuard)."""
        if _track is None or _track_container is None:
            return
        for entry in self._timer._pending():
            _track(entry)
        for container in self._store.containers():
            _track_container(container)

    # -- observing settled operations ----------------------------------------------------------

    def _observe(self, op: DelayedOperation[Any]) -> None:
        sink = self._sink
        if sink is not None:
            try:
                sink.emit(self._event(op))
            except BaseException as exc:  # the sink is user code too
                self.n_event_errors += 1
                _log.error("event_sink_error", purgatory=self.name, exc_info=exc)
                if isinstance(exc, FATAL):
                    raise
        if self._log_ops:
            _log.debug("operation_settled", purgatory=self.name, op=repr(op))

    def _event(self, op: DelayedOperation[Any]) -> OperationEvent:
        state = op._state
        error = None
        if state & FAILED:
            exc = op._outcome
            error = f"{type(exc).__name__}: {exc}"
        clock = self._clock
        epoch = clock.epoch_offset
        deadline = op._deadline
        return OperationEvent(
            purgatory=self.name,
            op_type=type(op).op_type or type(op).__name__,
            op_id=next(self._ids),
            # The keys it was handed to the purgatory with, also when its first try
            # satisfied it before it was ever watched: it was asked for under them.
            keys=[str(key) for key in op._keys],
            created_at=deadline - op._timeout + epoch,
            deadline=deadline + epoch,
            settled_at=clock.time() + epoch,
            outcome=describe(state),  # type: ignore[arg-type]
            error=error,
        )

    # -- the loop and its tasks ----------------------------------------------------------------

    def _hand_over(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread, from another thread."""
        loop = self._loop
        assert loop is not None
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            # The loop is closed: nobody is left to run callbacks. Settle with the reason
            # so that anything still holding the operation sees a final outcome.
            op: DelayedOperation[Any] = args[0]
            closed = PurgatoryClosed(f"purgatory {self.name!r}: its event loop is closed")
            self.settle(op, None if op._state & CANCELLED else closed, not op._state & CANCELLED)

    def _spawn(self, op: DelayedOperation[Any], offload: bool) -> None:
        """Run ``op``'s callbacks in a task on the loop (they settle it when done)."""
        loop = self._loop
        assert loop is not None
        coro = run_callbacks(self, op, offload)
        try:
            task = loop.create_task(coro)
        except BaseException as exc:
            # No task, so nothing else will ever settle it: settle it here. A closed
            # loop (the operation completed on this thread after its loop ended) is
            # what _hand_over meets from other threads: the same outcome.
            coro.close()
            if loop.is_closed():
                closed = PurgatoryClosed(f"purgatory {self.name!r}: its event loop is closed")
                self.settle(op, closed, True)
                return
            self.callback_failed(op, exc, "on_complete")
            self.settle(op, exc, True)
            if isinstance(exc, FATAL):
                raise
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def limiter(self) -> anyio.CapacityLimiter | None:
        if self._capacity is None:
            self._capacity = anyio.CapacityLimiter(self._offload_threads)
        return self._capacity


class _Detached(Lifecycle):
    """The owner of operations no purgatory holds: callbacks run where they complete."""

    def __init__(self) -> None:
        # Never started and never timed: its timer and store stay empty.
        super().__init__("detached", Timer(), WatchStore(1), DEFAULT_CLOCK)
        # Tasks of async callbacks: kept here so they are not collected mid-way.
        self._orphans: set[asyncio.Task[None]] = set()

    def check_can_complete(self, op: DelayedOperation[Any]) -> None:
        cls = type(op)
        if not cls._inline_complete and _running_loop() is None:
            what = "an async on_complete" if cls._async_complete else "offloaded callbacks"
            raise RuntimeError(
                f"{op!r} has {what} and no purgatory: complete it from a running event "
                "loop, or hand it to a purgatory first"
            )

    def completed(self, op: DelayedOperation[Any], failure: BaseException | None) -> None:
        if failure is None:
            self._run_callbacks(op)
        else:
            self.settle(op, failure, True)

    def expired(self, op: DelayedOperation[Any]) -> None:  # pragma: no cover - never timed
        self._run_callbacks(op)

    def cancelled(self, op: DelayedOperation[Any]) -> None:
        self.settle(op, None, False)

    def callback_failed(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        _log.error("callback_error", op=repr(op), stage=stage, exc_info=exc)

    def _spawn(self, op: DelayedOperation[Any], offload: bool) -> None:
        task = asyncio.get_running_loop().create_task(run_callbacks(self, op, offload))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    def limiter(self) -> anyio.CapacityLimiter | None:
        return None


#: The owner of every operation not (yet) handed to a purgatory.
DETACHED: Final = _Detached()


def _not_a_result(exc: StopIteration) -> RuntimeError:
    """What a failure with ``exc`` becomes, as in asyncio.Future.set_exception.

    Raised out of ``await op`` (a generator), a StopIteration would end it as a
    return: the compiled build would hand its value out as the result, the pure one
    raise a bare "generator raised StopIteration".
    """
    error = RuntimeError(
        f"{exc!r} was raised as an operation's outcome; StopIteration interacts badly "
        "with generators and cannot be raised out of await"
    )
    error.__cause__ = exc
    error.__context__ = exc
    return error


def _release(waiter: asyncio.Future[None] | list[asyncio.Future[None]]) -> None:
    if isinstance(waiter, list):
        for future in waiter:
            _release_one(future)
    else:
        _release_one(waiter)


def _release_one(future: asyncio.Future[None]) -> None:
    if future.done():
        return
    loop = future.get_loop()
    if _running_loop() is loop:
        future.set_result(None)
    else:
        # RuntimeError: that loop is closed, so nobody is left to wake.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(wake, future)


def wake(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` unless something else already did (a thread-safe wake-up)."""
    if not future.done():
        future.set_result(None)


# -- the transitions the owner drives ---------------------------------------------------------


def expire_for_shutdown(op: DelayedOperation[Any]) -> bool:
    """The shutdown transition: completed and expired, marked as by shutdown."""
    return transition(op, COMPLETED | EXPIRED | SHUTDOWN)


def try_guarded(op: DelayedOperation[Any]) -> bool:
    """``op.try_complete()`` guarded against re-entrant calls; True only for a real completion.

    Whatever ``try_complete`` raises completes the operation with that exception
    (it could otherwise be left pending with a condition that can never be checked);
    only ``KeyboardInterrupt`` and ``SystemExit`` then propagate.
    """
    if op._busy or op._state & ENDED:
        return False
    op._busy = True
    try:
        if op.try_complete():
            return op._state & COMPLETED != 0
        return False
    except FATAL as exc:
        # Let it through, but not before the operation has settled (unless the
        # interruption came out of its own completion, which settled it already).
        if not op._state & ENDED:
            fail(op, exc)
        raise
    except BaseException as exc:
        # A completion won by this try (on this thread) counts even though
        # try_complete raised after it: Lifecycle.completed cleared ``_busy`` then.
        # One won by another thread meanwhile does not (its hand-over is still to
        # run on this loop), as when try_complete returns its force_complete().
        return fail(op, exc) or (op._state & COMPLETED != 0 and not op._busy)
    finally:
        op._busy = False


def fail(op: DelayedOperation[Any], exc: BaseException) -> bool:
    """``try_complete`` raised: complete ``op`` with ``exc`` as its outcome if still pending."""
    owner = op._owner
    owner.callback_failed(op, exc, "try_complete")
    if not transition(op, COMPLETED):
        return False
    owner.completed(op, exc)
    return True


def _check_watch(op: DelayedOperation[Any], keys: Iterable[Hashable]) -> tuple[Hashable, ...]:
    """Validate a watch request; return its keys as a tuple without duplicates.

    The common case (a fresh operation, a tuple or list of up to three distinct
    hashable keys) costs a couple of attribute reads, a hash and a comparison
    per key, and no allocation.
    """
    try:
        fresh = op._owner is DETACHED and not op._state & ENDED
    except AttributeError:
        if isinstance(op, _operation_type()):
            raise TypeError(
                f"{type(op).__name__}.__init__ must call super().__init__(timeout)"
            ) from None
        raise TypeError(f"op must be a DelayedOperation, got {op!r}") from None
    if not fresh:
        if op._owner is not DETACHED:
            raise ValueError(f"{op!r} was already handed to purgatory {op._owner.name!r}")
        raise ValueError(f"{op!r} is already completed or cancelled")
    if type(keys) is not tuple:
        if isinstance(keys, str | bytes):
            raise TypeError(f"keys must be a collection of keys, not the single key {keys!r}")
        if not isinstance(keys, Iterable):
            raise TypeError(f"keys must be an iterable of keys, got {keys!r}")
        keys = tuple(keys)
    count = len(keys)
    try:
        # Hash every key before anything is inserted, so an unhashable one leaves no
        # partial watch behind. Duplicates are what the watch lists' dicts would take
        # for one key: equal hashes, then the same object or ==. Up to three keys,
        # distinct hashes (the common case) settle it with int comparisons: no set
        # (measured: 0.9k instructions per op), no == call, no allocation (callgrind,
        # compiled, per watched op: 2 keys 12.9k unchanged, 3 keys 14.3k -> 14.0k).
        # Keys with equal hashes go to a dict, which decides exactly as the watch
        # lists will (a NaN given twice is one key there, though nan != nan).
        if count == 1:
            hash(keys[0])
            return keys
        if count == 2:
            first, second = keys
            if hash(first) != hash(second):
                return keys
            return tuple(dict.fromkeys(keys))
        if count == 3:
            first, second, third = keys
            one, two, three = hash(first), hash(second), hash(third)
            if one != two and one != three and two != three:
                return keys
            return tuple(dict.fromkeys(keys))
        distinct = len(set(keys))
    except Exception as exc:
        # Whatever a key's __hash__ or __eq__ raises becomes a TypeError naming the key. A
        # StopIteration in particular must not escape: raised through a coroutine (the
        # callers'), it would end it as if it had returned.
        raise _bad_watch_key(keys, exc) from exc
    if distinct != count:
        keys = tuple(dict.fromkeys(keys))
    elif not distinct:
        raise ValueError("keys must not be empty: an operation has to be watched under a key")
    return keys


def _bad_watch_key(keys: tuple[Hashable, ...], exc: BaseException) -> TypeError:
    """The error for watch keys that could not be hashed or compared, naming the key.

    Replays what failed one key at a time: hashing it, then adding it to a dict of
    the keys before it (which compares it with those of an equal hash).
    """
    seen: dict[Hashable, None] = {}
    for key in keys:
        error = _hash_error(key, "watch key")
        if error is not None:
            return error
        try:
            seen[key] = None
        except Exception as raised:
            return TypeError(
                f"watch key {key!r} cannot be compared with the keys before it: {raised!r}"
            )
    return TypeError(f"watch keys {keys!r} cannot be hashed or compared: {exc!r}")


def _looked_up(store: WatchStore, key: Hashable, indexed: bool) -> bool:
    """Whether ``store`` holds ``key`` (its threshold index looked up first, if
    ``indexed``: one lookup for advance_key's usual key), with a key that cannot be
    hashed or compared refused by name, whatever its ``__hash__`` or ``__eq__`` raised
    (a StopIteration from them must not end a calling coroutine). A key held only in a
    plain list or a walk counts too: advance_key records its value for them."""
    try:
        return (indexed and key in store.indexes) or store.holds(key)
    except Exception as exc:
        raise _bad_key(key, exc) from exc


def _bad_key(key: object, exc: BaseException, what: str = "key") -> TypeError:
    """The error for a key whose lookup in the watch lists raised ``exc``."""
    error = _hash_error(key, what)
    if error is not None:
        return error
    return TypeError(f"{what} {key!r} cannot be compared with the keys watched: {exc!r}")


def _fails_lookup(store: WatchStore, key: Hashable) -> bool:
    try:
        store.holds(key)
    except Exception:
        return True
    return False


def _hash_error(key: object, what: str) -> TypeError | None:
    """Why ``key`` cannot be hashed, or None if it can."""
    try:
        hash(key)
    except TypeError:
        return TypeError(f"{what} {key!r} is not hashable")
    except Exception as raised:  # StopIteration included: never let it through
        return TypeError(f"{what} {key!r} cannot be hashed: its __hash__ raised {raised!r}")
    return None


def _operation_type() -> type:
    from ._operation import DelayedOperation

    return DelayedOperation
