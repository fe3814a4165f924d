"""The fan-out seam: events about keys, published anywhere, applied to every process's purgatories.

Three events travel between processes:

* ``check(key)``: something the operations on ``key`` depend on changed; each
  process runs ``check_and_complete(key)`` on its purgatories;
* ``advance(key, value)``: the monotonic value of ``key`` reached ``value``;
  each process runs ``advance_key(key, value)``, which visits only the
  operations that value reaches (O(log n + k)); replayed, duplicated or
  reordered advances are harmless;
* ``cancel(key)``: each process runs ``cancel_for_key(key)``.

The purgatories own what is watched: the fan-out keeps no copy of operations or
values. It listens to each purgatory's keys (:meth:`Purgatory.add_key_listener`):
when a key gains its first watcher, however it was watched, the key's stored
value is read from the engine and applied, after the operation was admitted, so
a slow or frozen engine never delays an answer. Messages are hints; the truth is
the engine's store of the latest value of each advanced key, re-read for every
watched key (:meth:`Purgatory.watched_keys`) whenever the subscription is
(re)established: an event lost in a gap completes its operations late, never
not at all.

The engine itself is a :class:`FanoutBackend`; :class:`Fanout` holds everything
else (validation, the bounded publish queue, retries, confirmations, reads,
resyncs, the bounded stop and the counters).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self, SupportsFloat

from .._logging import get_logger
from .._operation import DelayedOperation
from .._purgatory import Purgatory
from .._relay import ADVANCE, CANCEL, CHECK, Receiver, encode
from .._validation import check_positive_int, check_positive_seconds, check_seconds
from ._base import ABANDON_AFTER, BackendHost, Event, FanoutBackend, FanoutUnavailable, say
from ._checks import check_key, check_keys, check_value
from ._publisher import Publisher
from ._reader import READ_CHUNK, StoreReader
from ._stats import FanoutStats

if TYPE_CHECKING:
    from ._stream import ValueStream

_log = get_logger("purgatory_aio.fanout")


class Fanout(Publisher, StoreReader, BackendHost):
    """Publishes key events to every process and applies the events of every process locally.

    Use it as an async context manager (or ``start()``/``stop()``) around the
    purgatories' lifetime::

        fanout = MemoryFanout(hub, purgatory)
        async with purgatory, fanout:
            op = ValueReached(fanout, "job:1", 1, timeout=30)
            await fanout.watch_threshold(purgatory, op, "job:1", 1)
            ...
            fanout.advance("job:1", 1)  # from any process on the same hub / Redis

    Publishing (``check``, ``advance``, ``cancel``) is synchronous and never
    blocks: the event is applied to this process's purgatories at once and queued
    for the engine (a full queue, or a stopped fan-out, drops it: counted, logged).
    :meth:`advance_confirmed` waits until the engine has stored the value.

    Args:
        backend: the engine.
        purgatories: the purgatories events apply to (more with :meth:`attach`).
        queue_size: events that may wait to be published.
        batch: events per round trip to the engine.
        resync_interval: seconds between safety-net resyncs.
        connect_timeout: seconds to wait for a connection, and for a read.
        subscribe: False for a process that only publishes (a webhook receiver that
            never waits): no subscription, nothing applied from others.
    """

    def __init__(
        self,
        backend: FanoutBackend,
        *purgatories: Purgatory,
        queue_size: int = 65536,
        batch: int = 512,
        resync_interval: float = 30.0,
        connect_timeout: float = 2.0,
        subscribe: bool = True,
    ) -> None:
        if not isinstance(backend, FanoutBackend):
            raise TypeError(f"backend must be a FanoutBackend, got {backend!r}")
        # The core's rules for counts and seconds (TypeError for a str or bool, ValueError
        # for a number out of range, inf included), checked before anything is set.
        self._queue_size = check_positive_int(queue_size, "queue_size")
        self._batch = check_positive_int(batch, "batch")
        self._resync_interval = check_positive_seconds(resync_interval, "resync_interval")
        self._timeout = check_positive_seconds(connect_timeout, "connect_timeout")
        self.backend = backend
        self.origin = uuid.uuid4().hex[:12]
        self._subscribe = bool(subscribe)
        self._max_key = backend.max_key_bytes
        self._purgatories: list[Purgatory] = []
        self._stats = FanoutStats()
        # Applies every event, received or published here, and counts them.
        self._receiver = Receiver(self.origin, self._purgatories)
        if type(self).deliver is Fanout.deliver:  # not overridden by a subclass
            # The receiver's own bound method, with no Python frame before it: compiled, a
            # delivered advance costs 0.22 us instead of 0.27.
            self.deliver = self._receiver.deliver  # type: ignore[method-assign]
        self._queue: deque[Event] = deque()
        self._inflight: list[Event] = []
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._to_read: dict[str, None] = {}  # watched keys whose stored value is to be read
        self._reader: asyncio.Task[None] | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self._resync_again = False
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopped = False  # stop() began: nothing more is queued
        self._closing = False  # stop() gave up flushing: the tasks end, what is left is lost
        self._subscribed_once = False
        self._down_since: float | None = None
        self.attach(*purgatories)

    # -- configuration ---------------------------------------------------------------------------

    def attach(self, *purgatories: Purgatory) -> None:
        """Apply events to ``purgatories`` too (attaching one twice is harmless)."""
        for purgatory in purgatories:
            if not isinstance(purgatory, Purgatory):
                raise TypeError(f"expected a Purgatory, got {purgatory!r}")
        for purgatory in purgatories:
            if all(p is not purgatory for p in self._purgatories):
                self._purgatories.append(purgatory)
                purgatory.add_key_listener(self._key_listener)
                if self._started:
                    self._want(purgatory.watched_keys())

    @property
    def purgatories(self) -> tuple[Purgatory, ...]:
        """The purgatories this fan-out applies events to."""
        return tuple(self._purgatories)

    @property
    def queue_size(self) -> int:
        """How many events may wait to be published (``stats().queued`` counts those that do)."""
        return self._queue_size

    @property
    def address(self) -> str:
        """The engine's address (password masked)."""
        return self.backend.address

    # -- publishing ------------------------------------------------------------------------------

    def check(self, key: str) -> int:
        """Every process re-checks the operations on ``key``; returns how many completed here."""
        key = check_key(key, self._max_key)
        completed = self._receiver.apply_check(key)
        self._send(CHECK, key, 0.0, None)
        return completed

    def advance(self, key: str, value: SupportsFloat) -> int:
        """The value of ``key`` reached ``value`` (monotonic: merged by max everywhere, and
        stored, so processes that missed the message catch up). Returns how many operations
        completed here."""
        key = check_key(key, self._max_key)
        number = check_value(value)
        completed = self._receiver.apply_advance(key, number)
        self._send(ADVANCE, key, number, None)
        return completed

    async def advance_confirmed(
        self,
        key: str,
        value: SupportsFloat,
        *,
        timeout: float = 2.0,  # noqa: ASYNC109 - the bound of the confirmation, documented
    ) -> int:
        """:meth:`advance`, returning only once the engine has stored the value.

        Returns how many operations completed here. Raises
        :class:`FanoutUnavailable` if the value is not stored within ``timeout``
        seconds (the engine is down or slow, the queue is full, the fan-out is
        stopped, or the engine refused it). The event may still be stored later;
        advances merge by max, so the caller can simply publish it again.
        """
        key = check_key(key, self._max_key)
        number = check_value(value)
        bound = check_positive_seconds(timeout, "timeout")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        completed = self._receiver.apply_advance(key, number)
        self._send(ADVANCE, key, number, waiter)
        try:
            async with asyncio.timeout(bound):
                await waiter
        except TimeoutError:
            raise FanoutUnavailable(
                f"the advance of {key!r} was not stored at {self.address} within {bound:g} s"
                f"{'' if self._stats.connected else ' (the engine cannot be reached)'}"
            ) from None
        return completed

    def cancel(self, key: str) -> int:
        """Every process cancels the operations on ``key``; returns how many were cancelled here.

        Unlike advances, cancellations are not stored: a process whose subscription
        is down when one is published does not see it.
        """
        key = check_key(key, self._max_key)
        cancelled = self._receiver.apply_cancel(key)
        self._send(CANCEL, key, 0.0, None)
        return cancelled

    def _send(self, kind: str, key: str, value: float, waiter: asyncio.Future[None] | None) -> None:
        if self._stopped:
            self._drop("the fan-out is stopped", waiter)
            return
        if len(self._queue) >= self._queue_size:
            self._drop(f"the queue of events to publish is full ({self._queue_size})", waiter)
            return
        self._queue.append(Event(kind, key, value, encode(kind, key, value, self.origin), waiter))
        self._drained.clear()
        self._wakeup.set()

    def _drop(self, reason: str, waiter: asyncio.Future[None] | None) -> None:
        stats = self._stats
        stats.publish_dropped += 1
        if stats.publish_dropped % 1000 == 1:
            _log.warning("fanout_publish_dropped", reason=reason, total=stats.publish_dropped)
        if waiter is not None:
            waiter.set_exception(FanoutUnavailable(f"not published to {self.address}: {reason}"))

    # -- watching --------------------------------------------------------------------------------

    async def watch(
        self, purgatory: Purgatory, op: DelayedOperation[Any], keys: Iterable[str]
    ) -> bool:
        """``purgatory.try_complete_else_watch(op, keys)``, with ``purgatory`` attached."""
        checked = check_keys(keys, self._max_key)
        self.attach(purgatory)
        return await purgatory.try_complete_else_watch(op, checked)

    async def watch_threshold(
        self, purgatory: Purgatory, op: DelayedOperation[Any], key: str, threshold: SupportsFloat
    ) -> bool:
        """``purgatory.watch_threshold(op, key, threshold)``, with ``purgatory`` attached.

        The key's stored value is read from the engine after the operation is
        admitted, so an advance published before the watch began completes it.

        The event log names ``op`` by its class's ``op_type``: to label a
        :class:`ValueReached`, build it from ``ValueReached.labelled(label)``.
        """
        key = check_key(key, self._max_key)
        self.attach(purgatory)
        return await purgatory.watch_threshold(op, key, threshold)

    async def wait_for_value(
        self,
        purgatory: Purgatory,
        key: str,
        threshold: SupportsFloat,
        timeout: float,  # noqa: ASYNC109 - the operation's own deadline, enforced by the purgatory
        *,
        label: str | None = None,
    ) -> float | None:
        """Wait until the value of ``key`` reaches ``threshold`` in any process; return the value,
        or None if ``timeout`` passed first. Cancelling the caller withdraws the operation.

        ``label`` names the kind of wait in the event log and the report (its
        ``op_type``, ``ValueReached`` without one), such as the route template
        ``/orders/{id}/status``: see :meth:`ValueReached.labelled`.

        In a request handler use the integration's ``wait_for_value(request, ...)``,
        which also withdraws the operation when the client disconnects (and labels the
        wait with the route's template).
        """
        from ._value_reached import ValueReached  # here: _value_reached builds on this module

        op = ValueReached.labelled(label)(self, key, threshold, timeout)
        await self.watch_threshold(purgatory, op, key, op.threshold)
        try:
            return await op
        except BaseException:
            op.cancel()
            raise

    def stream(
        self,
        purgatory: Purgatory,
        key: str,
        *,
        timeout: float,
        after: SupportsFloat | None = None,
    ) -> ValueStream:
        """The successive values of ``key`` from any process, as a
        :class:`~purgatory_aio.fanout.ValueStream` (an async iterator; use it with
        ``async with``): each new maximum once, strictly increasing, none missed
        between two iterations, until ``timeout`` seconds have passed on the purgatory's
        clock, the key is cancelled, the purgatory shuts down or the stream is closed.
        ``after``: yield only values above it (None: the current value first)."""
        from ._stream import ValueStream  # here: _stream builds on this module

        return ValueStream(self, purgatory, key, timeout=timeout, after=after)

    def value(self, key: str) -> float | None:
        """The highest value of ``key`` the attached purgatories know, or None.

        Known while something is watched under ``key``
        (:meth:`Purgatory.key_value`); read from the engine when that starts.
        """
        best: float | None = None
        for purgatory in self._purgatories:
            value = purgatory.key_value(key)
            if value is not None and (best is None or value > best):
                best = value
        return best

    def watched_keys(self) -> list[str]:
        """The keys something is watched under in the attached purgatories (str keys only:
        the others cannot travel)."""
        keys: dict[str, None] = {}
        for purgatory in self._purgatories:
            for key in purgatory.watched_keys():
                if isinstance(key, str) and key:
                    keys[key] = None
        return list(keys)

    def stats(self) -> FanoutStats:
        """A snapshot of the counters and gauges; ``stats().as_dict()`` is JSON-ready."""
        stats = FanoutStats(**self._stats.as_dict())  # type: ignore[arg-type]
        for name, count in self._receiver.counts().items():
            setattr(stats, name, count)
        stats.watched_keys = len(self.watched_keys())
        stats.queued = len(self._queue) + len(self._inflight)
        stats.reads_pending = len(self._to_read)
        return stats

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and subscribe.

        Raises:
            FanoutUnavailable: the engine cannot be reached, or refused the credentials.
        """
        if self._stopped:  # before the started check: a stopped fan-out was started
            raise RuntimeError("a stopped fan-out cannot be started again: create another")
        if self._started:
            return
        try:
            async with asyncio.timeout(self._timeout * 2):
                await self.backend.connect(self if self._subscribe else None)
        except FanoutUnavailable:
            await self._close_backend()
            raise
        except TimeoutError:
            await self._close_backend()
            raise FanoutUnavailable(
                f"cannot reach {self.address}: no answer within {self._timeout * 2:g} s"
            ) from None
        self._started = True
        self._stats.connected = True
        loop = self._loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._publisher(), name="purgatory_aio.fanout.publisher")]
        if self._subscribe:
            self._tasks.append(
                loop.create_task(self._subscriber(), name="purgatory_aio.fanout.subscriber")
            )
            self._tasks.append(
                loop.create_task(self._safety_net(), name="purgatory_aio.fanout.resync")
            )
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        self._wakeup.set()  # events published before start
        _log.info("fanout_started", address=self.address)

    async def stop(self, *, flush_timeout: float = 1.0) -> None:
        """Publish what is queued, then disconnect. Idempotent.

        Returns within ``flush_timeout`` + 2 x :data:`ABANDON_AFTER` seconds
        whatever is in flight: it waits up to ``flush_timeout`` for the queue to
        drain (only while the engine is reachable), then up to ``ABANDON_AFTER``
        for its tasks to end and as long again for the connections to close, and
        abandons what is left. Events it could not hand to the engine are logged,
        counted (``undelivered``) and their :meth:`advance_confirmed` callers get
        :class:`FanoutUnavailable`. Publishing after ``stop()`` drops the event
        (counted in ``publish_dropped``).
        """
        if self._stopped:
            return
        bound = check_seconds(flush_timeout, "flush_timeout")
        self._stopped = True
        if not self._started:
            self._fail_undelivered()
            return
        if bound and self._stats.connected and not self._drained.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(bound):
                    await self._drained.wait()
        self._closing = True
        tasks = [t for t in (*self._tasks, self._reader, self._resync_task) if t is not None]
        for task in tasks:
            task.add_done_callback(_retrieve)
            task.cancel()
        # asyncio.wait, not gather: a task whose cancellation the client library swallows
        # (redis-py inside wait_for, on Python 3.11) is abandoned rather than waited for.
        if tasks:
            await asyncio.wait(tasks, timeout=ABANDON_AFTER)
        await self._close_backend()
        self._stats.connected = False
        self._fail_undelivered()
        for purgatory in self._purgatories:
            purgatory.remove_key_listener(self._key_listener)
        self._to_read.clear()
        _log.info("fanout_stopped", address=self.address)

    async def _close_backend(self) -> None:
        closing = asyncio.get_running_loop().create_task(self.backend.close())
        closing.add_done_callback(_retrieve)
        await asyncio.wait((closing,), timeout=ABANDON_AFTER)

    def _fail_undelivered(self) -> None:
        events = [*self._inflight, *self._queue]
        self._inflight = []
        self._queue.clear()
        self._drained.set()
        if not events:
            return
        self._stats.undelivered += len(events)
        _log.warning(
            "fanout_stopped_with_undelivered_events", events=len(events), address=self.address
        )
        error = FanoutUnavailable(f"the fan-out stopped before the event reached {self.address}")
        for event in events:
            event.settle(error)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._stopped:
            _log.error("fanout_task_failed", task=task.get_name(), error=repr(exc))

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- connection state (BackendHost) ----------------------------------------------------------

    @property
    def listening(self) -> bool:
        return not self._closing

    def down(self, exc: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._stats.connected = False
            self._stats.outages += 1
            self._receiver.revive = self._up  # the next message received says it is back
            _log.warning("fanout_engine_down", address=self.address, error=say(exc))

    def _up(self) -> None:
        if self._down_since is not None:
            downtime = time.monotonic() - self._down_since
            self._down_since = None
            self._receiver.revive = None
            self._stats.connected = True
            self._stats.recoveries += 1
            # At the outage's level: whoever was shown "down" must be shown "up" again.
            _log.warning("fanout_engine_recovered", address=self.address, downtime_s=downtime)
            if self._subscribe:
                # What was read or published meanwhile may have failed: catch up now.
                self._schedule_resync()

    def switched(self, previous: str, current: str) -> None:
        self._stats.failovers += 1
        # At the level of the outage before it: an operator sees where the engine went.
        _log.warning(
            "fanout_engine_switched", address=self.address, previous=previous, current=current
        )

    def subscribed(self) -> None:
        self._up()
        if self._subscribed_once:
            self._stats.resubscribes += 1
            _log.info("fanout_resubscribed", address=self.address)
        self._subscribed_once = True
        self._schedule_resync()

    def foreign_value(self, key: str, raw: object) -> None:
        self._receiver.malformed += 1
        _log.warning("fanout_foreign_value", key=key, value=repr(raw)[:100])

    def deliver(self, message: str | bytes) -> None:
        """Apply one channel message; a malformed one is logged, counted and skipped."""
        self._receiver.deliver(message)

    async def refresh(self, keys: Iterable[str]) -> int:
        """Read the stored values of ``keys`` and apply them; returns how many operations
        completed. An engine that cannot be read is counted and otherwise ignored: the
        operations still expire at their deadlines."""
        wanted = list(dict.fromkeys(keys))
        completed = 0
        for start in range(0, len(wanted), READ_CHUNK):
            values = await self._read(wanted[start : start + READ_CHUNK])
            if values is None or self._closing:
                return completed
            completed += self._apply_values(values)
        return completed

    async def resync(self) -> int:
        """Catch up: re-read the values of every watched key and re-check every one of them."""
        self._stats.resyncs += 1
        keys = self.watched_keys()
        completed = await self.refresh(keys)
        for i, key in enumerate(keys, 1):
            try:
                completed += self._receiver.apply_check(key)
            except Exception as exc:
                self._receiver.apply_failed(key, exc)
            if i % READ_CHUNK == 0:
                await asyncio.sleep(0)  # 100k watched keys must not stall the loop at once
        if completed:
            _log.info("fanout_resync_completed", keys=len(keys), completed=completed)
        return completed


def _retrieve(task: asyncio.Task[Any]) -> None:
    # An abandoned task's late failure is expected (its connection was closed): take it, so
    # asyncio does not report it as never retrieved.
    if not task.cancelled():
        task.exception()


__all__ = ["Fanout"]
