"""The owner of every operation's lifecycle: what follows each transition, in one place.

An operation flips its own state word and reports who won
(:mod:`~purgatory_aio._operation`); the winner then calls its owner, a
:class:`Lifecycle` here, through the interface :class:`~._owner.Owner` declares. Read top to
bottom, this module is the whole life of an operation in a purgatory::

    admit ─► try ─► watch ─► try ─► timer ─┬─ completed ─► withdraw ─► callbacks ─► settle
                                            ├─ expired   ─► withdraw ─► callbacks ─► settle
                                            ├─ shutdown  ─► withdraw ─► callbacks ─► settle
                                            └─ cancelled ─► withdraw ──────────────► settle

The first three are one method (:meth:`Lifecycle.completed`). *withdraw* takes it
out of the timer and retires its watch entries; *callbacks* run ``on_complete``
(then ``on_expiration`` if it expired) inline, as a task, or in a worker thread;
*settle* records the outcome, releases awaiters and emits its event. Everything
after a transition runs on the loop thread: one won on another thread is handed
over. User code may raise anything: every ``BaseException`` becomes the
operation's outcome and is logged and counted; only ``KeyboardInterrupt`` and
``SystemExit`` propagate, and only after the operation has settled. Operations no
purgatory holds belong to the detached owner (:mod:`._detached`), the other
implementation of that interface, which shares the callbacks and the settlement
with this one (both in :mod:`._owner`).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, Final, NoReturn

import anyio
import anyio.to_thread

from . import _gc
from ._clock import Clock
from ._errors import FATAL, OutsideLoop, PurgatoryClosed
from ._keys import bad_key, check_keys, fails_lookup, looked_up, not_an_operation, not_fresh
from ._logging import get_logger
from ._owner import Owner
from ._records import event_of
from ._shell import run_callbacks
from ._states import (
    CANCELLED,
    COMPLETED,
    ENDED,
    EXPIRED,
    SHUTDOWN,
    transition,
)
from ._timer import Timer
from ._watches import IN_WALK, WatchStore
from .events import EventSink

if TYPE_CHECKING:
    from ._index import ThresholdIndex
    from ._operation import DelayedOperation

__all__ = ["FATAL", "Lifecycle", "try_guarded"]

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


class Lifecycle(Owner):
    """Everything that happens to the operations of one purgatory after a transition.

    Operations call it only through the :class:`~._owner.Owner` interface; the
    purgatory calls the rest (admission, the walks over a key, shutdown's part).
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
        self._timer = timer
        self._store = store
        self._clock = clock
        # Bound once: the admission path reads the clock and the limit without lookups.
        self._now = clock.time
        self._horizon = timer.horizon
        self._sink = event_sink
        self._log_ops = log_operations
        self._offload_threads = offload_threads
        self._capacity: anyio.CapacityLimiter | None = None
        self._tasks: set[asyncio.Task[None]] = set()
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
        try:
            detached = op._owner
            fresh = detached.detached and not op._state & ENDED
        except AttributeError:
            raise not_an_operation(op) from None
        if not fresh:
            raise not_fresh(op)
        watch_keys = check_keys(keys)
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
                op._keys = self._store.watch_threshold(op, watch_keys[0], threshold)
        except BaseException as exc:
            # Comparing a key with one already watched raised (the keys themselves were
            # checked above; the operation is never hashed): nothing may stay half-watched.
            # The try costs nothing measurable (callgrind, compiled and pure).
            self._refuse(op, watch_keys, exc, detached)
        # Ended meanwhile (another thread)? try_guarded declines, and the timer is skipped.
        if try_guarded(op):
            return True
        if not op._state & ENDED:
            self._timer.add_entry(op, deadline)
            if _untrack is not None:
                # Pending now, held by the timer until it settles (which tracks it
                # again): no full collection traverses it meanwhile (see _gc). W1's
                # outside variant, 1M operations: 1.42 -> 1.05 us net per operation on
                # asyncio, 1.32 -> 1.08 on uvloop (the class opted out vs not, one run).
                _untrack(op)
        return False

    def _refuse(
        self,
        op: DelayedOperation[Any],
        keys: tuple[Hashable, ...],
        exc: BaseException,
        detached: Owner,
    ) -> NoReturn:
        """Undo the admission of ``op``, which the watch lists raised ``exc`` for: back
        to its ``detached`` owner."""
        self._store.unwatch(op, keys)
        op._owner = detached
        op._keys = ()
        if not isinstance(exc, Exception) or isinstance(exc, MemoryError):
            raise exc
        error: TypeError | None = None
        for key in keys:
            if fails_lookup(self._store, key):
                error = bad_key(key, exc, "watch key")
                break
        if error is None:
            error = TypeError(f"watching {op!r} under {keys!r} failed: {exc!r}")
        raise error from exc

    # -- walks over a key (loop thread; re-entrant calls from callbacks are fine) --------------

    def check(self, key: Hashable) -> int:
        """check_and_complete: try every pending operation watched under ``key``.

        The walk protocol of both walks (this one and :meth:`advance`): the store
        hands over what is watched under the key, the tries run here, with
        :func:`try_guarded` called natively, and the store is told which entries
        to drop. Each walk works on a snapshot: callbacks it runs may watch,
        complete, cancel or purge on this very key; an entry is dropped only by
        whoever finds it still there.
        """
        store = self._store
        try:
            # The key's lookups, refused by name when its __hash__ or __eq__ raises
            # (a StopIteration from them must not end a calling coroutine). The index
            # and walk dicts are looked into only when they hold anything.
            held = store.lists.get(key)
            index = store.indexes.get(key) if store.indexes else None
            walks = store.walks.get(key) if store.walks else None
        except Exception as exc:
            raise bad_key(key, exc) from exc
        if held is None and index is None and walks is None:
            return 0
        if self._thread_id != _get_ident():
            raise self._off_loop_thread("check_and_complete", "; use check_and_complete_threadsafe")
        completed = 0
        if held is not None:
            # The key's one operation, or a snapshot of its list of two or more.
            ops: tuple[DelayedOperation[Any], ...] = (
                tuple(held.values()) if type(held) is dict else (held,)  # type: ignore[assignment]
            )
            for op in ops:
                if op._state & ENDED:
                    store.discard(key, op)  # a stale entry
                elif try_guarded(op):
                    completed += 1
                    store.discard(key, op)
        if index is not None or walks is not None:
            completed += _try_indexed(index, walks)
        return completed

    def advance(self, key: Hashable, value: float) -> int:
        """advance_key: try the threshold operations on ``key`` that ``value`` reaches."""
        store = self._store
        if not looked_up(store, key, True):
            return 0
        if self._thread_id != _get_ident():
            raise self._off_loop_thread("advance_key", "")
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
        if not looked_up(store, key, False):
            return []
        if self._thread_id != _get_ident():
            raise self._off_loop_thread("cancel_for_key", "")
        return [op for op in store.take(key) if op.cancel()]

    def _off_loop_thread(self, what: str, hint: str) -> RuntimeError:
        return RuntimeError(f"{what} called off the loop thread of purgatory {self.name!r}{hint}")

    # -- the transitions' aftermath (called by the operation that won) -------------------------

    def completed(self, op: DelayedOperation[Any], failure: BaseException | None) -> None:
        """``op`` won *completed* (satisfied, expired or shut down), or ``try_complete``
        raised ``failure``: the whole aftermath, in this one place.

        Off the loop thread it is handed to the loop. On it: out of the timer, its
        watch entries stale, counted, then ``on_complete`` (and ``on_expiration``
        if it expired) inline, or in a task or a worker thread, and settled (both
        :meth:`~._owner.Owner.run_callbacks`, shared with the detached owner).
        """
        if self._thread_id != _get_ident() and not self._claim_thread():
            self._hand_over(self.completed, op, failure)
            return
        # Won on the loop thread: if a try of op is under way, this is its doing (see
        # try_guarded, which reads this when try_complete raises after completing).
        # Measured (callgrind, per watched-and-completed op): compiled unchanged at
        # 11.5k instructions, pure +73 of 39.8k.
        op._busy = False
        if op._bucket is not None:
            self._timer.remove_entry(op)
        if op._store:
            self._store.retire(op)
        state = op._state
        if not state & EXPIRED:
            self.n_completed += 1
        elif state & SHUTDOWN:
            self.n_shutdown += 1
        else:
            self.n_expired += 1
        self.run_callbacks(op, failure)

    def cancelled(self, op: DelayedOperation[Any]) -> None:
        """``op`` won *cancelled*: no callback runs, awaiters get CancelledError."""
        if self._thread_id != _get_ident() and not self._claim_thread():
            self._hand_over(self.cancelled, op)
            return
        if op._bucket is not None:
            self._timer.remove_entry(op)
        if op._store:
            self._store.retire(op)
        self.n_cancelled += 1
        self.settle(op, None, False)

    def _claim_thread(self) -> bool:
        """Whether this thread, not the one last seen, now runs the purgatory's loop (a
        loop may be run from another thread later): then it is the loop thread."""
        if self._loop is None or _running_loop() is not self._loop:
            return False
        self._thread_id = _get_ident()
        return True

    def callback_failed(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        """A callback of ``op`` raised ``exc``: log and count it (it becomes the outcome)."""
        self.n_errors += 1
        _log.error("callback_error", purgatory=self.name, op=repr(op), stage=stage, exc_info=exc)

    # -- what the shutdown (see _shutdown) asks of it --------------------------------------------

    def loop_closed(self) -> bool:
        """Whether the loop this purgatory is bound to is closed (nothing runs there)."""
        loop = self._loop
        return loop is not None and loop.is_closed()

    def take_over_closed_loop(self) -> None:
        """A shutdown from another loop once this one's is closed: nothing can run there
        any more, so the calling thread settles everything, here and now."""
        if self.loop_closed():
            self._thread_id = _get_ident()

    def expire_for_shutdown(self, op: DelayedOperation[Any]) -> None:
        """The shutdown's transition of a pending ``op`` (completed and expired, marked
        as by shutdown), then its aftermath; nothing if it has ended already."""
        if transition(op, COMPLETED | EXPIRED | SHUTDOWN):
            self.completed(op, None)

    # -- settlement (the rest is Owner's) -------------------------------------------------------

    def retrack_pending(self) -> None:
        """Give every operation still pending, and the containers holding them, back to
        the cyclic GC: the purgatory that held them is gone (see _gc.DropGuard)."""
        if _track is None or _track_container is None:
            return
        for entry in self._timer.pending_entries():
            _track(entry)
        for container in self._store.containers():
            _track_container(container)

    # -- observing settled operations ----------------------------------------------------------

    def _observe(self, op: DelayedOperation[Any]) -> None:
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


# -- the transitions the owner drives ---------------------------------------------------------


def _try_indexed(
    index: ThresholdIndex | None, walks: list[list[DelayedOperation[Any]]] | None
) -> int:
    """The rest of check_and_complete's walk over a key: the operations in its threshold
    index, and those an advance_key walk on it has yet to try (check_and_complete
    called from one of that walk's callbacks). How many completed."""
    completed = 0
    if index is not None:
        for op in index.operations():
            if try_guarded(op):
                completed += 1
    if walks is not None:
        for walk in tuple(walks):
            for op in walk:
                if op._store == IN_WALK and try_guarded(op):
                    completed += 1
    return completed


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
