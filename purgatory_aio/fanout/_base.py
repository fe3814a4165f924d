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
import itertools
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Final, Self, SupportsFloat

from .._logging import get_logger
from .._operation import DelayedOperation
from .._purgatory import Purgatory
from .._relay import ADVANCE as ADVANCE
from .._relay import CANCEL as CANCEL
from .._relay import CHECK as CHECK
from .._relay import MalformedMessage as MalformedMessage
from .._relay import Receiver
from .._relay import decode as decode
from .._relay import encode as encode
from .._validation import check_finite, check_positive_int, check_positive_seconds, check_seconds

if TYPE_CHECKING:
    from ._stream import ValueStream

_log = get_logger("purgatory_aio.fanout")

#: Keys read from the engine per round trip.
READ_CHUNK: Final = 1000

ABANDON_AFTER: Final = 0.25
"""Seconds :meth:`Fanout.stop` waits for its tasks, and again for the engine's connections
to close, before abandoning them: a frozen engine never holds a shutdown."""


class FanoutUnavailable(ConnectionError):
    """The fan-out's engine cannot be reached, refused the credentials, or did not
    store an event within the bound the caller chose."""


@dataclass(slots=True)
class FanoutStats:
    """Counters of one process's fan-out (monotonic since start, except the gauges)."""

    # Those from `received` to `malformed` are counted by the fan-out's receiver, on the
    # compiled path of every delivered message (native ints there, not attributes of this).

    published: int = 0  # events the engine stored / published
    publish_dropped: int = 0  # refused at once: the queue was full, or the fan-out stopped
    publish_failures: int = 0  # batches sent again after a connection error
    publish_errors: int = 0  # events the engine refused (a foreign value under the key...)
    undelivered: int = 0  # events stop() could not hand to the engine
    received: int = 0
    applied_checks: int = 0
    applied_advances: int = 0
    applied_cancels: int = 0
    apply_errors: int = 0  # events whose application raised (logged)
    completed: int = 0  # operations completed by applied events
    malformed: int = 0  # messages or stored values that are not ours
    outages: int = 0
    recoveries: int = 0
    resyncs: int = 0
    resubscribes: int = 0  # subscriptions re-established after the first
    failovers: int = 0  # subscriptions re-established on another server than before
    refresh_failures: int = 0  # reads of stored values that failed (retried)
    connected: bool = False  # gauge
    watched_keys: int = 0  # gauge
    queued: int = 0  # gauge: events waiting to be published
    reads_pending: int = 0  # gauge: watched keys whose stored value is still to be read

    def as_dict(self) -> dict[str, int | bool]:
        """Every field by name, ready for ``json.dumps``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_key(key: object, max_bytes: int | None = None) -> str:
    """A key the fan-out can carry: a non-empty str that encodes as UTF-8, without NUL."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"fan-out keys are non-empty str (they name channels), got {key!r}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"fan-out key {key!r} cannot be sent: it is not valid text "
            f"({exc.reason} at index {exc.start})"
        ) from None
    if "\x00" in key:
        # PostgreSQL's text cannot hold NUL; refused on every engine, so that a key that
        # works on one works on all.
        raise ValueError(f"fan-out key {key!r} contains NUL (\\x00), which keys may not")
    if max_bytes is not None and size > max_bytes:
        raise ValueError(
            f"fan-out key {key[:40]!r}... is {size} bytes in UTF-8; the engine carries at most "
            f"{max_bytes}"
        )
    return key


def check_keys(keys: object, max_bytes: int | None = None) -> tuple[str, ...]:
    """A collection of keys, refused as the purgatory refuses it when it is a single str."""
    if isinstance(keys, str | bytes):
        raise TypeError(f"keys must be a collection of keys, not the single key {keys!r}")
    if not isinstance(keys, Iterable):
        raise TypeError(f"keys must be an iterable of keys, got {keys!r}")
    return tuple(check_key(key, max_bytes) for key in keys)


def check_value(value: object, what: str = "value") -> float:
    """A finite number, as the purgatory's ``advance_key`` takes it (same errors)."""
    return check_finite(value, what)


class Event:
    """One event on its way to the engine; ``message`` is what subscribers receive."""

    __slots__ = ("key", "kind", "message", "value", "waiter")

    def __init__(
        self,
        kind: str,
        key: str,
        value: float,
        message: str,
        waiter: asyncio.Future[None] | None = None,
    ) -> None:
        self.kind = kind
        self.key = key
        self.value = value
        self.message = message
        self.waiter = waiter

    def settle(self, error: BaseException | None) -> None:
        """Tell the caller waiting for this event (if any) that it was stored, or why not."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)


class FanoutBackend(ABC):
    """The engine-specific part of a fan-out (Redis, PostgreSQL, in memory).

    A backend only talks to its engine; :class:`Fanout` calls it from one event
    loop and never concurrently for the same method, except :meth:`read`, which
    may run beside :meth:`store_and_publish` and :meth:`subscribe`.

    * :meth:`connect` opens the connections (and checks the credentials), and
      subscribes unless the member only publishes, or raises
      :class:`FanoutUnavailable` with one line naming the address (password
      masked) and the cause in the user's words.
    * :meth:`store_and_publish` sends one batch of events. For an advance it
      raises the key's stored value to ``max(stored, event.value)`` and publishes
      ``event.message`` only if that raised it; checks and cancels are published
      only. It returns one entry per event: None when done, or the exception the
      engine answered for that event alone (a foreign value stored under the key,
      a script error), which is logged and counted and not sent again. It raises
      one of :attr:`network_errors` when the batch as a whole may not have
      reached the engine: the fan-out sends it again later (resending is
      harmless: advances merge by max).
    * :meth:`read` returns the stored values of ``keys`` (keys with none, or with
      a value that is not a number, left out; report the latter to
      ``host.foreign_value``), or raises when the engine cannot be read.
    * :meth:`subscribe` runs until cancelled or ``host.listening`` turns False (a
      client library may swallow a cancellation: test both after each wait, and
      ``asyncio.current_task().cancelling()`` too): it receives every channel message
      and hands it to ``host.deliver``; it reconnects by itself after an error,
      reporting ``host.down(exc)``; and it calls ``host.subscribed()`` each time
      the subscription is (re)established, which is when the fan-out re-reads
      every watched key; before that, ``host.switched(previous, current)`` when it
      now reaches another server (a failover). It is not called for a member that
      only publishes.
    * :meth:`close` releases the connections. It may be abandoned after
      :data:`ABANDON_AFTER` seconds, so nothing may depend on it finishing.

    Whatever a backend method raises other than its network errors is logged and
    counted by the fan-out, which carries on: a backend cannot wedge it.
    """

    #: Exceptions meaning "the engine could not be reached": the batch is sent again.
    network_errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)
    #: The longest key the engine can carry, in UTF-8 bytes (None: no limit of its own).
    max_key_bytes: int | None = None

    @property
    @abstractmethod
    def address(self) -> str:
        """Where the engine is, for messages and logs (any password masked)."""

    @abstractmethod
    async def connect(self, host: BackendHost | None) -> None:
        """Connect; unless ``host`` is None (a member that only publishes), subscribe too,
        so that every message published once this returns reaches ``host``."""

    @abstractmethod
    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        """Store and publish one batch; one result per event (see the class docstring)."""

    @abstractmethod
    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        """The stored values of ``keys``."""

    @abstractmethod
    async def subscribe(self, host: BackendHost) -> None:
        """Deliver the channel's messages to ``host`` until cancelled, reconnecting."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connections."""


class BackendHost(ABC):
    """What a backend reports to its fan-out (:class:`Fanout` is the only host)."""

    @property
    @abstractmethod
    def listening(self) -> bool:
        """False once the fan-out is stopping: :meth:`FanoutBackend.subscribe` returns."""

    @abstractmethod
    def deliver(self, message: str | bytes) -> None:
        """A message arrived on the channel."""

    @abstractmethod
    def subscribed(self) -> None:
        """The subscription is (re)established: whatever was published before is stored."""

    @abstractmethod
    def down(self, exc: BaseException) -> None:
        """The engine cannot be reached (the backend is retrying)."""

    @abstractmethod
    def switched(self, previous: str, current: str) -> None:
        """The subscription now reaches another server than before (a failover): ``previous``
        and ``current`` name them. :meth:`subscribed` follows, which re-reads every key."""

    @abstractmethod
    def foreign_value(self, key: str, raw: object) -> None:
        """A value stored under ``key`` that the fan-out did not write."""


class Fanout(BackendHost):
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
            _log.warning("fanout_engine_down", address=self.address, error=_say(exc))

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

    # -- the publisher ---------------------------------------------------------------------------

    async def _publisher(self) -> None:
        queue = self._queue
        backoff = 0.05
        while not self._closing:
            if not queue:
                self._drained.set()
                self._wakeup.clear()
                if self._stopped:
                    return
                await self._wakeup.wait()
                continue
            batch = self._inflight = [queue.popleft() for _ in range(min(self._batch, len(queue)))]
            while True:
                try:
                    results = await self.backend.store_and_publish(batch)
                except self.backend.network_errors as exc:
                    if self._closing:
                        return
                    self._stats.publish_failures += 1
                    self.down(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                except Exception as exc:  # the backend's bug: never wedge the publisher
                    results = [exc] * len(batch)
                break
            if self._closing:
                return  # stop() counted the batch as undelivered: it could not wait for it
            self._inflight = []
            backoff = 0.05
            self._up()
            self._settle_batch(batch, results)

    def _settle_batch(self, batch: list[Event], results: Sequence[BaseException | None]) -> None:
        stats = self._stats
        for event, error in zip(batch, results, strict=False):
            if error is None:
                stats.published += 1
                event.settle(None)
                continue
            stats.publish_errors += 1
            if stats.publish_errors % 1000 == 1:
                _log.error(
                    "fanout_event_refused",
                    address=self.address,
                    key=event.key,
                    error=_say(error),
                    total=stats.publish_errors,
                )
            if isinstance(error, FanoutUnavailable):  # the engine's own words, address included
                event.settle(error)
                continue
            refused = f"{self.address} refused the event on {event.key!r}: {_say(error)}"
            event.settle(FanoutUnavailable(refused))

    # -- reading the store -----------------------------------------------------------------------

    def _key_listener(self, key: Hashable, held: bool) -> None:
        # Called in the middle of a purgatory's bookkeeping: record, schedule, nothing more.
        if not isinstance(key, str):
            return
        if held:
            if self._started and not self._stopped and self._subscribe:
                self._to_read[key] = None
                self._start_reader()
        else:
            self._to_read.pop(key, None)

    def _want(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            if isinstance(key, str) and key:
                self._to_read[key] = None
        self._start_reader()

    def _start_reader(self) -> None:
        loop = self._loop
        if loop is None or self._stopped or not self._to_read:
            return
        if self._reader is None or self._reader.done():
            self._reader = loop.create_task(self._read_stored())

    async def _read_stored(self) -> None:
        """Read the stored values of newly watched keys, in coalesced round trips, and apply
        them. Failures are retried after a pause; the operations meanwhile wait for their
        deadlines, never for this."""
        await asyncio.sleep(0)  # let the watches of this loop iteration join
        backoff = 0.05
        to_read = self._to_read
        while to_read and not self._stopped:
            keys = list(itertools.islice(to_read, READ_CHUNK))
            for key in keys:
                del to_read[key]
            values = await self._read(keys)
            if values is None:
                for key in keys:
                    to_read.setdefault(key, None)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            self._apply_values(values)

    async def _read(self, keys: list[str]) -> dict[str, float] | None:
        try:
            async with asyncio.timeout(self._timeout):
                values = await self.backend.read(keys, self)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._stats.refresh_failures += 1
            if isinstance(exc, self.backend.network_errors):
                self.down(exc)
            else:
                _log.warning("fanout_read_failed", address=self.address, error=_say(exc))
            return None
        self._up()
        return values

    def _apply_values(self, values: dict[str, float]) -> int:
        completed = 0
        for key, value in values.items():
            try:
                completed += self._receiver.apply_advance(key, value)
            except Exception as exc:
                self._receiver.apply_failed(key, exc)
        return completed

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

    def _schedule_resync(self) -> None:
        if self._stopped:
            return
        if self._resync_task is not None and not self._resync_task.done():
            self._resync_again = True
            return
        if self._loop is not None:
            self._resync_task = self._loop.create_task(self._resync_loop())

    async def _resync_loop(self) -> None:
        backoff = 0.05
        while True:
            self._resync_again = False
            failures = self._stats.refresh_failures
            try:
                await self.resync()
            except Exception as exc:  # never let the safety net take the subscriber down
                _log.warning("fanout_resync_failed", error=repr(exc))
            if self._stats.refresh_failures != failures and not self._stopped:
                # The re-read failed (a connection still held by a server that has just
                # failed over, an engine down again): nothing else may trigger another
                # before the safety net, so try again, as the reader of new keys does.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if not self._resync_again:
                return

    async def _subscriber(self) -> None:
        backoff = 0.05
        while not self._stopped:
            try:
                await self.backend.subscribe(self)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the backend gave up or failed: subscribe again
                self._receiver.apply_errors += 1
                self.down(exc)
                _log.error("fanout_subscriber_failed", address=self.address, error=_say(exc))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _safety_net(self) -> None:
        while True:
            await asyncio.sleep(self._resync_interval)
            self._schedule_resync()


def _retrieve(task: asyncio.Task[Any]) -> None:
    # An abandoned task's late failure is expected (its connection was closed): take it, so
    # asyncio does not report it as never retrieved.
    if not task.cancelled():
        task.exception()


def _say(exc: BaseException) -> str:
    """An exception as one short line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


MAX_LABEL_CHARS: Final = 200
"""The longest operation label, in characters."""
MAX_LABELS: Final = 1000
"""How many distinct labels one process may use: a label names a kind of wait (a route
template), never one request, or the report would have a group per request."""


def check_label(label: object) -> str:
    """An operation label: a non-empty printable str of at most :data:`MAX_LABEL_CHARS`."""
    if not isinstance(label, str):
        raise TypeError(f"an operation label must be a str, got {type(label).__name__}")
    if not label or len(label) > MAX_LABEL_CHARS or not label.isprintable():
        raise ValueError(
            f"an operation label must be 1-{MAX_LABEL_CHARS} printable characters (it names a "
            f"kind of wait in the event log, such as '/orders/{{id}}/status'), got {label[:60]!r}"
            f"{'...' if len(label) > 60 else ''} ({len(label)} characters)"
        )
    return label


class ValueReached(DelayedOperation[float | None]):
    """Completes when the value of ``key`` reaches ``threshold`` in any process.

    Its result is the value reached, or None if it expired first. Watch it with
    :meth:`Fanout.watch_threshold` (or use :meth:`Fanout.wait_for_value`). The event
    log names it ``ValueReached``; ``ValueReached.labelled(label)`` is the same class
    under another name.
    """

    __slots__ = ("fanout", "key", "reached", "threshold")

    # The classes made by labelled(), one per (class, label). The library reads op_type off
    # the class (one attribute read per settled operation, no slot per operation), so a
    # label is a subclass with nothing but its op_type.
    _labelled: ClassVar[dict[tuple[type[ValueReached], str], type[ValueReached]]] = {}

    @classmethod
    def labelled(cls, label: str | None) -> type[ValueReached]:
        """This class under the name ``label`` in the event log and the report (its
        ``op_type``); ``cls`` itself for None. Made once per label and reused.

        Raises:
            TypeError, ValueError: a label that is not 1-:data:`MAX_LABEL_CHARS` printable
                characters, or more than :data:`MAX_LABELS` distinct labels in this process
                (a label names a kind of wait, not one request).
        """
        if label is None:
            return cls
        made = ValueReached._labelled
        found = made.get((cls, label)) if type(label) is str else None
        if found is not None:
            return found
        check_label(label)
        if len(made) >= MAX_LABELS:
            raise ValueError(
                f"more than {MAX_LABELS} distinct operation labels in this process: a label "
                "names a kind of wait (a route template such as '/orders/{id}/status'), not "
                f"one request; refused {label[:60]!r}"
            )
        namespace = {
            "__slots__": (),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "op_type": label,
        }
        labelled = made[cls, label] = type(cls.__name__, (cls,), namespace)
        return labelled

    def __init__(self, fanout: Fanout, key: str, threshold: SupportsFloat, timeout: float) -> None:
        super().__init__(timeout)
        if not isinstance(fanout, Fanout):
            raise TypeError(f"fanout must be a Fanout, got {fanout!r}")
        self.fanout = fanout
        self.key = check_key(key, fanout.backend.max_key_bytes)
        self.threshold = check_value(threshold, "threshold")
        self.reached: float | None = None

    def try_complete(self) -> bool:
        value = self.fanout.value(self.key)
        if value is not None and value >= self.threshold:
            self.reached = value
            return self.force_complete()
        return False

    def on_complete(self) -> float | None:
        return self.reached


__all__ = [
    "ABANDON_AFTER",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "BackendHost",
    "Event",
    "Fanout",
    "FanoutBackend",
    "FanoutStats",
    "FanoutUnavailable",
    "MalformedMessage",
    "ValueReached",
]
