"""The purgatory: operations watched under keys and timed out by a timing wheel.

Watch lists are insertion-ordered dicts (one per key), so adding and removing an
operation is O(1) and ``check_and_complete`` visits operations oldest first.
As in Kafka, an operation completed other than by walking a key stays in its
other watch lists until a walk meets it or a purge removes it; ``watched``
counts those entries too. A purge runs when such stale entries (or the
operations holding them) exceed ``purge_interval``, and visits only those
operations, never the whole set of watch lists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Coroutine, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Final, SupportsFloat, TypeVar

import anyio
import structlog

from ._callbacks import run_callbacks, settle
from ._clock import DEFAULT_CLOCK, Clock
from ._errors import PurgatoryClosed
from ._operation import DelayedOperation, try_guarded
from ._states import COMPLETED, ENDED, FAILED, describe
from ._threshold import ThresholdIndex, ThresholdKeys
from ._timer import Timer
from ._validation import check_finite, check_positive_int
from .events import EventSink, OperationEvent

__all__ = ["Purgatory", "PurgatoryStats"]

_log: Final = structlog.get_logger("purgatory_aio.purgatory")

R = TypeVar("R")

_get_ident: Final = threading.get_ident
# Held in a Final so the compiled purge loop reads it without a module-dict lookup.
_THRESHOLD_KEYS: Final = ThresholdKeys
_running_loop: Final = asyncio._get_running_loop


@dataclass(frozen=True, slots=True)
class PurgatoryStats:
    """A snapshot of a purgatory's counters (cumulative since it was created)."""

    name: str
    pending: int
    watched: int
    keys: int
    completed: int
    expired: int
    cancelled: int
    shutdown: int
    purged: int
    callback_errors: int
    events_failed: int


class Purgatory:
    """Holds delayed operations until their condition holds or their deadline passes.

    Example:
        >>> async def handle_fetch(p: Purgatory, partition, offset):
        ...     op = DelayedFetch(partition, offset, timeout=0.5)
        ...     return await p.watch_and_wait(op, [partition])

    Args:
        name: label for logs, metrics and the event log.
        tick: timing-wheel tick in seconds; expirations are at most one tick late
            (plus event-loop delay), never early.
        wheel_size: slots per timing-wheel level.
        purge_interval: how many stale watch-list entries may linger before a purge.
        clock: time source (the loop's monotonic clock by default; a
            :class:`~purgatory_aio.testing.ManualClock` in tests).
        event_sink: receives an :class:`~purgatory_aio.events.OperationEvent` per
            settled operation.
        offload_callbacks: run every operation's synchronous callbacks in worker
            threads (an operation class can ask for it alone).
        offload_threads: worker threads the offloaded callbacks may use at once.
        log_operations: log every settled operation at debug level.
    """

    def __init__(
        self,
        name: str,
        *,
        tick: float = 0.001,
        wheel_size: int = 20,
        purge_interval: int = 1000,
        clock: Clock | None = None,
        event_sink: EventSink | None = None,
        offload_callbacks: bool = False,
        offload_threads: int = 8,
        log_operations: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        self._purge_interval = check_positive_int(purge_interval, "purge_interval")
        self._offload_threads = check_positive_int(offload_threads, "offload_threads")
        if clock is not None and not (
            callable(getattr(clock, "time", None)) and callable(getattr(clock, "call_at", None))
        ):
            raise TypeError(f"clock must provide time() and call_at(), got {clock!r}")
        if event_sink is not None and not callable(getattr(event_sink, "emit", None)):
            raise TypeError(f"event_sink must have an emit(event) method, got {event_sink!r}")
        self._clock: Clock = DEFAULT_CLOCK if clock is None else clock
        self._timer = Timer(tick=tick, wheel_size=wheel_size, clock=self._clock)
        self._now: Callable[[], float] = self._clock.time  # bound once, as in Timer
        self.name = name
        self._offload = bool(offload_callbacks)
        self._capacity: anyio.CapacityLimiter | None = None
        self._sink = event_sink
        self._log_ops = log_operations
        self._observed = event_sink is not None or log_operations
        self._watchers: dict[Hashable, dict[DelayedOperation[Any], bool]] = {}
        self._thresholds: dict[Hashable, ThresholdIndex] = {}
        self._watched = 0  # entries in all watch lists
        self._live = 0  # entries belonging to operations still pending
        self._dirty: list[DelayedOperation[Any]] = []  # settled, maybe still listed
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = -1
        self._closed = False
        self._shutdown_task: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._n_completed = 0
        self._n_expired = 0
        self._n_cancelled = 0
        self._n_shutdown = 0
        self._n_purged = 0
        self._n_errors = 0
        self._n_event_errors = 0

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Purgatory:
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is shut down")
        self._start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def _start(self) -> None:
        """Bind to the running loop on first use; refuse any other loop afterwards."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"purgatory {self.name!r} must be used from a running event loop"
            ) from None
        if self._loop is not None:
            if self._loop is not loop:
                raise RuntimeError(
                    f"purgatory {self.name!r} belongs to another event loop (or thread)"
                )
            return
        self._loop = loop
        self._thread_id = _get_ident()
        track = getattr(self._clock, "_track", None)
        if track is not None:
            track(self)
        _log.debug("purgatory_started", purgatory=self.name)

    @property
    def closed(self) -> bool:
        return self._closed

    async def shutdown(self, *, expire_pending: bool = True) -> None:
        """Stop the reaper and settle every pending operation.

        By default each pending operation is expired now (``on_complete`` then
        ``on_expiration`` run, so every waiting client gets an answer); with
        ``expire_pending=False`` they are cancelled instead. Waits for callbacks
        still running. Idempotent: later calls wait for the first to finish.
        """
        if self._shutdown_task is None:
            self._closed = True
            self._shutdown_task = asyncio.get_running_loop().create_task(
                self._shutdown(expire_pending)
            )
        await asyncio.shield(self._shutdown_task)

    async def _shutdown(self, expire_pending: bool) -> None:
        pending = self._timer._drain()
        for op in pending:
            if not isinstance(op, DelayedOperation):
                continue
            if expire_pending:
                if op._expire_for_shutdown():
                    self._n_shutdown += 1
                    self._retire(op)
                    run_callbacks(op, self)
            else:
                op.cancel()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._timer.close()
        self._watchers.clear()
        self._thresholds.clear()
        self._dirty.clear()
        self._watched = self._live = 0
        _log.info(
            "purgatory_shutdown",
            purgatory=self.name,
            settled=len(pending),
            expired_pending=expire_pending,
        )

    # -- the contract --------------------------------------------------------------------------

    async def try_complete_else_watch(
        self, op: DelayedOperation[Any], keys: Iterable[Hashable]
    ) -> bool:
        """Try once; if not completed, watch ``op`` under every key, try again, and
        if still pending add it to the timer (deadline ``now + op.timeout``).

        Returns True if ``op`` was completed during this call.
        """
        return self._watch(op, keys)

    def _watch(
        self,
        op: DelayedOperation[Any],
        keys: Iterable[Hashable],
        threshold: float | None = None,
    ) -> bool:
        """Kafka's try, watch, try again, time — for a watch list or a threshold index."""
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is shut down")
        if _running_loop() is not self._loop:
            self._start()
        watch_keys = self._check_watch(op, keys)
        op._deadline = self._now() + op._timeout
        op._purgatory = self
        if try_guarded(op):
            return True
        if op._state & ENDED:
            return False
        if threshold is None:
            watchers = self._watchers
            for key in watch_keys:
                watch_list = watchers.get(key)
                if watch_list is None:
                    watchers[key] = {op: True}
                else:
                    watch_list[op] = True
            op._keys = watch_keys
            entries = len(watch_keys)
        else:
            index = self._thresholds.get(watch_keys[0])
            if index is None:
                index = self._thresholds[watch_keys[0]] = ThresholdIndex()
            index.push(threshold, op)
            op._keys = ThresholdKeys(watch_keys)
            entries = 1
        self._watched += entries
        self._live += entries
        if op._state & ENDED:
            return False
        if try_guarded(op):
            return True
        if not op._state & ENDED:
            self._timer._add(op, op._deadline)
        return False

    async def watch_and_wait(self, op: DelayedOperation[R], keys: Iterable[Hashable]) -> R:
        """Watch ``op`` and return its result, for request handlers.

        If the awaiting task is cancelled (the client went away), ``op`` is
        cancelled too, so nothing stays pending for a caller who is gone.
        """
        self._watch(op, keys)
        try:
            return await op
        except asyncio.CancelledError:
            op.cancel()
            raise

    async def watch_threshold(
        self, op: DelayedOperation[Any], key: Hashable, threshold: SupportsFloat
    ) -> bool:
        """Like :meth:`try_complete_else_watch` for one key, indexed by ``threshold``.

        For operations waiting for a monotonic per-key value (a high watermark, bytes
        available) to reach their own threshold: :meth:`advance_key` then visits
        only the operations the new value can satisfy. ``try_complete`` still decides;
        one that declines once its threshold is reached moves to the key's plain
        watch list, so general conditions keep working.
        """
        return self._watch(op, (key,), check_finite(threshold, "threshold"))

    def advance_key(self, key: Hashable, value: float) -> int:
        """The value watched under ``key`` reached ``value``: try exactly the operations
        whose threshold is <= ``value``, lowest first; return how many completed."""
        try:
            index = self._thresholds.get(key)
        except TypeError:
            raise TypeError(f"key {key!r} is not hashable") from None
        if index is None:
            return 0
        if self._thread_id != _get_ident():
            raise RuntimeError("advance_key called off the loop thread")
        completed = 0
        for op in index.pop_reached(value):
            self._watched -= 1
            if op._state & ENDED:
                continue
            if try_guarded(op):
                completed += 1
            elif not op._state & ENDED:
                watch_list = self._watchers.get(key)
                if watch_list is None:
                    watch_list = self._watchers[key] = {}
                watch_list[op] = True
                self._watched += 1
                op._keys = (key,)
        if not index.heap and self._thresholds.get(key) is index:
            del self._thresholds[key]
        return completed

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete the operations watched under ``key``; return how many did.

        For the loop thread (re-entrant calls from callbacks are fine); from other
        threads use :meth:`check_and_complete_threadsafe`.
        """
        try:
            watch_list = self._watchers.get(key)
        except TypeError:
            raise TypeError(f"key {key!r} is not hashable") from None
        if watch_list is None and not self._thresholds:
            return 0
        if self._thread_id != _get_ident():
            raise RuntimeError(
                "check_and_complete called off the loop thread; use check_and_complete_threadsafe"
            )
        completed = 0
        if watch_list is not None:
            # A snapshot: callbacks run while walking may watch, complete or cancel on this key.
            for op in tuple(watch_list):
                if op._state & ENDED:
                    if op in watch_list:
                        del watch_list[op]
                        self._watched -= 1
                    continue
                if op._busy:
                    continue
                # try_guarded(op), inlined: this loop visits every operation on the
                # key, and the call it saves is a third of a visit.
                op._busy = True
                try:
                    done = op.try_complete() and op._state & COMPLETED
                except Exception as exc:
                    done = op._fail_from_try_complete(exc)
                finally:
                    op._busy = False
                if done:
                    completed += 1
                    if op in watch_list:
                        del watch_list[op]
                        self._watched -= 1
            if not watch_list and self._watchers.get(key) is watch_list:
                del self._watchers[key]
        index = self._thresholds.get(key)
        if index is not None:
            for op in index.operations():
                if not op._state & ENDED and try_guarded(op):
                    completed += 1
        return completed

    def check_and_complete_threadsafe(self, key: Hashable) -> concurrent.futures.Future[int]:
        """:meth:`check_and_complete` from any thread; the future gets the count."""
        loop = self._loop
        if loop is None:
            raise RuntimeError(f"purgatory {self.name!r} has not started on an event loop")
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"key {key!r} is not hashable") from None
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        loop.call_soon_threadsafe(self._check_into, key, future)
        return future

    def _check_into(self, key: Hashable, future: concurrent.futures.Future[int]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(self.check_and_complete(key))
        except BaseException as exc:
            future.set_exception(exc)

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """Cancel every pending operation watched under ``key`` and return them."""
        try:
            watch_list = self._watchers.pop(key, None)
        except TypeError:
            raise TypeError(f"key {key!r} is not hashable") from None
        index = self._thresholds.pop(key, None)
        ops: list[DelayedOperation[Any]] = []
        if watch_list is not None:
            self._watched -= len(watch_list)
            ops.extend(watch_list)
        if index is not None:
            self._watched -= len(index)
            ops.extend(index.operations())
        return [op for op in ops if op.cancel()]

    @property
    def num_delayed(self) -> int:
        """Pending operations in the timer."""
        return len(self._timer)

    @property
    def watched(self) -> int:
        """Entries across all watch lists, including settled ones not yet purged."""
        return self._watched

    @property
    def clock(self) -> Clock:
        return self._clock

    def time(self) -> float:
        return self._clock.time()

    def stats(self) -> PurgatoryStats:
        return PurgatoryStats(
            name=self.name,
            pending=len(self._timer),
            watched=self._watched,
            keys=len(self._watchers.keys() | self._thresholds.keys()),
            completed=self._n_completed,
            expired=self._n_expired,
            cancelled=self._n_cancelled,
            shutdown=self._n_shutdown,
            purged=self._n_purged,
            callback_errors=self._n_errors,
            events_failed=self._n_event_errors,
        )

    def __repr__(self) -> str:
        return (
            f"<Purgatory {self.name!r} delayed={len(self._timer)} watched={self._watched}"
            f"{' closed' if self._closed else ''}>"
        )

    # -- validation ----------------------------------------------------------------------------

    def _check_watch(
        self, op: DelayedOperation[Any], keys: Iterable[Hashable]
    ) -> tuple[Hashable, ...]:
        """Validate a watch request; return its keys as a tuple without duplicates.

        The common case (a fresh operation, a tuple or list of up to three distinct
        hashable keys) costs a couple of attribute reads, a hash and a comparison
        per key, and no allocation.
        """
        try:
            fresh = op._purgatory is None and not op._state & ENDED
        except AttributeError:
            if isinstance(op, DelayedOperation):
                raise TypeError(
                    f"{type(op).__name__}.__init__ must call super().__init__(timeout)"
                ) from None
            raise TypeError(f"op must be a DelayedOperation, got {op!r}") from None
        if not fresh:
            assert isinstance(op, DelayedOperation)
            if op._purgatory is not None:
                raise ValueError(f"{op!r} was already handed to purgatory {op._purgatory.name!r}")
            raise ValueError(f"{op!r} is already completed or cancelled")
        if type(keys) is not tuple:
            if isinstance(keys, str | bytes):
                raise TypeError(f"keys must be a collection of keys, not the single key {keys!r}")
            if not isinstance(keys, Iterable):
                raise TypeError(f"keys must be an iterable of keys, got {keys!r}")
            keys = tuple(keys)
        count = len(keys)
        try:
            # Hash every key before anything is inserted, so an unhashable one leaves
            # no partial watch behind. Up to three keys, pairwise comparison finds
            # duplicates without building a set.
            if count == 1:
                hash(keys[0])
                return keys
            if count == 2:
                first, second = keys
                hash(first), hash(second)
                return keys if first != second else (first,)
            if count == 3:
                first, second, third = keys
                hash(first), hash(second), hash(third)
                if first != second and first != third and second != third:
                    return keys
                return tuple(dict.fromkeys(keys))
            distinct = len(set(keys))
        except TypeError:
            bad = next(k for k in keys if not _hashable(k))
            raise TypeError(f"watch key {bad!r} is not hashable") from None
        if distinct != count:
            keys = tuple(dict.fromkeys(keys))
        elif not distinct:
            raise ValueError("keys must not be empty: an operation has to be watched under a key")
        return keys

    # -- called by operations ------------------------------------------------------------------

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` now on the loop thread; from any other thread, hand it over."""
        if self._thread_id == _get_ident():
            fn(*args)
        else:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(fn, *args)

    def _completed(self, op: DelayedOperation[Any], failure: Exception | None) -> None:
        if op._bucket is not None:
            self._timer._remove(op)
        self._n_completed += 1
        self._retire(op)
        if failure is None:
            run_callbacks(op, self)
        else:
            settle(op, failure, True)

    def _on_expired(self, op: DelayedOperation[Any]) -> None:
        self._n_expired += 1
        self._retire(op)
        run_callbacks(op, self)

    def _cancelled(self, op: DelayedOperation[Any]) -> None:
        if op._bucket is not None:
            self._timer._remove(op)
        self._n_cancelled += 1
        self._retire(op)
        self._on_settled(op)

    def _retire(self, op: DelayedOperation[Any]) -> None:
        """``op`` is no longer pending: its watch entries become stale."""
        keys = op._keys
        if keys is None:
            return
        self._live -= len(keys)
        dirty = self._dirty
        dirty.append(op)
        limit = self._purge_interval
        if len(dirty) > limit or self._watched - self._live > limit:
            self._purge()

    def _purge(self) -> None:
        watchers = self._watchers
        removed = 0
        dirty, self._dirty = self._dirty, []
        thresholds = self._thresholds
        for op in dirty:
            keys = op._keys
            assert keys is not None
            if type(keys) is _THRESHOLD_KEYS:
                index = thresholds.get(keys[0])
                if index is not None:
                    index.stale += 1
                    if index.stale * 2 > len(index.heap):
                        removed += index.compact(_is_settled)
                        if not index.heap:
                            del thresholds[keys[0]]
                continue
            for key in keys:
                watch_list = watchers.get(key)
                # A membership test and del, not pop(): both are direct dict operations
                # in the compiled build, where pop() is a method call by name.
                if watch_list is not None and op in watch_list:
                    del watch_list[op]
                    removed += 1
                    if not watch_list:
                        del watchers[key]
        self._watched -= removed
        self._n_purged += removed

    def _on_settled(self, op: DelayedOperation[Any]) -> None:
        sink = self._sink
        if sink is not None:
            self._emit(sink, op)
        if self._log_ops:
            _log.debug("operation_settled", purgatory=self.name, op=repr(op))

    def _emit(self, sink: EventSink, op: DelayedOperation[Any]) -> None:
        state = op._state
        outcome = describe(state)
        error = None
        if state & FAILED:
            exc = op._outcome
            error = f"{type(exc).__name__}: {exc}"
        epoch = self._clock.epoch_offset
        deadline = op._deadline
        event = OperationEvent(
            purgatory=self.name,
            op_type=type(op).op_type or type(op).__name__,
            op_id=next(self._ids),
            keys=[str(key) for key in op._keys or ()],
            created_at=deadline - op._timeout + epoch,
            deadline=deadline + epoch,
            settled_at=self._clock.time() + epoch,
            outcome=outcome,  # type: ignore[arg-type]
            error=error,
        )
        try:
            sink.emit(event)
        except Exception:
            self._n_event_errors += 1
            _log.exception("event_sink_error", purgatory=self.name)

    def _callback_failed(self, op: DelayedOperation[Any], exc: Exception, stage: str) -> None:
        self._n_errors += 1
        _log.error("callback_error", purgatory=self.name, op=repr(op), stage=stage, exc_info=exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _busy_tasks(self) -> tuple[asyncio.Task[None], ...]:
        return tuple(self._tasks)

    def _limiter(self) -> anyio.CapacityLimiter:
        if self._capacity is None:
            self._capacity = anyio.CapacityLimiter(self._offload_threads)
        return self._capacity


def _is_settled(op: DelayedOperation[Any]) -> bool:
    return bool(op._state & ENDED)


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
