"""The fan-out seam: events about keys, published anywhere, applied to every process's purgatories.

Three events travel between processes:

* ``check(key)``: something the operations on ``key`` depend on changed; each
  process runs ``check_and_complete(key)`` on its purgatories;
* ``advance(key, value)``: the monotonic value of ``key`` reached ``value``;
  each process raises its local copy to ``max(old, value)`` and runs
  ``advance_key`` (and ``check_and_complete``), so replayed, duplicated or
  reordered advances are harmless;
* ``cancel(key)``: each process runs ``cancel_for_key(key)``.

A backend (in memory, Redis) carries them. Messages are hints; the truth is the
store: the latest value of each advanced key is kept by the backend, and a
process re-reads the values of its watched keys and re-checks them whenever its
subscription is (re)established, so an event lost in a gap completes its
operations late, never not at all.

The fan-out layer learns which keys are watched locally through its own watch
helpers (:meth:`Fanout.watch`, :meth:`Fanout.watch_threshold`,
:meth:`Fanout.wait_for_value`); operations watched directly on a purgatory still
receive every event, but are left out of the catch-up after a reconnection.
"""

from __future__ import annotations

import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Self, SupportsFloat

from .._logging import get_logger
from .._operation import DelayedOperation
from .._purgatory import Purgatory

_log = get_logger("purgatory_aio.fanout")

CHECK = "c"
ADVANCE = "a"
CANCEL = "x"

# How many watch calls between sweeps of settled operations out of the key index.
_SWEEP_EVERY = 4096


class FanoutUnavailable(ConnectionError):
    """The fan-out backend cannot be reached (or refused the credentials)."""


class MalformedMessage(ValueError):
    """A message on the fan-out channel that is not an event this library sends."""


@dataclass(slots=True)
class FanoutStats:
    """Counters of one process's fan-out (monotonic since start, except the gauges)."""

    published: int = 0
    publish_dropped: int = 0  # the outgoing queue was full
    publish_failures: int = 0  # batches sent again after a connection error
    received: int = 0
    applied_checks: int = 0
    applied_advances: int = 0
    applied_cancels: int = 0
    completed: int = 0  # operations completed by applied events
    malformed: int = 0
    outages: int = 0
    recoveries: int = 0
    resyncs: int = 0
    resubscribes: int = 0  # subscriptions re-established after the first
    refresh_failures: int = 0
    connected: bool = False  # gauge
    watched_keys: int = 0  # gauge
    queued: int = 0  # gauge: events waiting to be published

    def as_dict(self) -> dict[str, int | bool]:
        """Every field by name, ready for ``json.dumps``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def encode(kind: str, key: str, value: float = 0.0, origin: str = "") -> str:
    """One event as a channel message: ``kind|origin|value|key`` (the key last, so it may
    contain the separator)."""
    return f"{kind}|{origin}|{value!r}|{key}" if kind == ADVANCE else f"{kind}|{origin}||{key}"


def decode(message: str) -> tuple[str, str, float, str]:
    """``(kind, origin, value, key)`` of a channel message; :class:`MalformedMessage` if it is
    not one."""
    parts = message.split("|", 3)
    if len(parts) != 4 or parts[0] not in (CHECK, ADVANCE, CANCEL) or not parts[3]:
        raise MalformedMessage(f"not a fan-out event: {message[:200]!r}")
    kind, origin, raw, key = parts
    value = 0.0
    if kind == ADVANCE:
        try:
            value = float(raw)
        except ValueError:
            raise MalformedMessage(f"advance with a non-numeric value: {message[:200]!r}") from None
        if not math.isfinite(value):
            raise MalformedMessage(f"advance with a non-finite value: {message[:200]!r}")
    return kind, origin, value, key


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"fan-out keys are non-empty str (they name channels), got {key!r}")
    return key


def check_value(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"value must be a finite number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"value must be a finite number, got {value!r}")
    return number


class Fanout(ABC):
    """Publishes key events to every process and applies the events of every process locally.

    Use it as an async context manager (or ``start()``/``stop()``) around the
    purgatories' lifetime::

        fanout = MemoryFanout(hub, purgatory)
        async with purgatory, fanout:
            op = ValueReached(fanout, "job:1", 1, timeout=30)
            await fanout.watch_threshold(purgatory, op, "job:1", 1)
            ...
            fanout.advance("job:1", 1)  # from any process on the same hub / Redis

    Publishing is synchronous and never blocks: the event is applied to this
    process's purgatories at once and handed to the backend.
    """

    def __init__(self, *purgatories: Purgatory) -> None:
        self.origin = uuid.uuid4().hex[:12]
        self._purgatories: list[Purgatory] = []
        self._values: dict[str, float] = {}
        # key -> operations watched under it through this layer (settled ones swept lazily)
        # key -> {id(op): op}: by identity, as an operation class may compare by value
        # or be unhashable (each op is held here, so its id is not reused meanwhile).
        self._watching: dict[str, dict[int, DelayedOperation[Any]]] = {}
        self._since_sweep = 0
        self._stats = FanoutStats()
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

    @property
    def purgatories(self) -> tuple[Purgatory, ...]:
        """The purgatories this fan-out applies events to."""
        return tuple(self._purgatories)

    # -- publishing ------------------------------------------------------------------------------

    def check(self, key: str) -> int:
        """Every process re-checks the operations on ``key``; returns how many completed here."""
        key = check_key(key)
        completed = self._apply_check(key)
        self._send(CHECK, key, 0.0)
        return completed

    def advance(self, key: str, value: SupportsFloat) -> int:
        """The value of ``key`` reached ``value`` (monotonic: merged by max everywhere, and
        stored, so processes that missed the message catch up). Returns how many operations
        completed here."""
        key = check_key(key)
        number = check_value(value)
        completed = self._apply_advance(key, number)
        self._send(ADVANCE, key, number)
        return completed

    def cancel(self, key: str) -> int:
        """Every process cancels the operations on ``key``; returns how many were cancelled here.

        Unlike advances, cancellations are not stored: a process whose subscription
        is down when one is published does not see it.
        """
        key = check_key(key)
        cancelled = self._apply_cancel(key)
        self._send(CANCEL, key, 0.0)
        return cancelled

    # -- watching --------------------------------------------------------------------------------

    async def watch(
        self, purgatory: Purgatory, op: DelayedOperation[Any], keys: Iterable[str]
    ) -> bool:
        """``purgatory.try_complete_else_watch(op, keys)``, with the keys remembered for the
        catch-up after a reconnection."""
        keys = tuple(check_key(key) for key in keys)
        self.attach(purgatory)
        done = await purgatory.try_complete_else_watch(op, keys)
        if not done:
            self._remember(op, keys)
        return done

    async def watch_threshold(
        self, purgatory: Purgatory, op: DelayedOperation[Any], key: str, threshold: SupportsFloat
    ) -> bool:
        """``purgatory.watch_threshold(op, key, threshold)``, with ``key`` remembered for the
        catch-up; the key's stored value is read first, so an advance published before the
        watch began is seen."""
        check_key(key)
        self.attach(purgatory)
        await self.refresh((key,))
        done = await purgatory.watch_threshold(op, key, threshold)
        if not done:
            self._remember(op, (key,))
        return done

    async def wait_for_value(
        self,
        purgatory: Purgatory,
        key: str,
        threshold: SupportsFloat,
        timeout: float,  # noqa: ASYNC109 - the operation's own deadline, enforced by the purgatory
    ) -> float | None:
        """Wait until the value of ``key`` reaches ``threshold`` in any process; return the value,
        or None if ``timeout`` passed first. Cancelling the caller withdraws the operation."""
        op = ValueReached(self, key, threshold, timeout)
        await self.watch_threshold(purgatory, op, key, op.threshold)
        try:
            return await op
        except BaseException:
            op.cancel()
            raise

    def value(self, key: str) -> float | None:
        """The highest value of ``key`` this process has seen, or None."""
        return self._values.get(key)

    def watched_keys(self) -> list[str]:
        """The keys with pending operations watched through this layer."""
        self._sweep()
        return list(self._watching)

    def stats(self) -> FanoutStats:
        """A snapshot of the counters and gauges; ``stats().as_dict()`` is JSON-ready."""
        self._sweep()
        stats = self._stats
        stats.watched_keys = len(self._watching)
        return FanoutStats(**stats.as_dict())  # type: ignore[arg-type]

    # -- lifecycle -------------------------------------------------------------------------------

    @abstractmethod
    async def start(self) -> None:
        """Connect and subscribe; raise a clear error if the backend cannot be reached."""

    @abstractmethod
    async def stop(self) -> None:
        """Flush what can be flushed quickly, unsubscribe and disconnect. Idempotent."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- for backends ----------------------------------------------------------------------------

    @abstractmethod
    def _send(self, kind: str, key: str, value: float) -> None:
        """Hand one event to the backend without blocking."""

    @abstractmethod
    async def _load(self, keys: list[str]) -> dict[str, float]:
        """The stored values of ``keys`` (missing ones left out)."""

    async def refresh(self, keys: Iterable[str]) -> int:
        """Read the stored values of ``keys`` and apply them; returns how many operations
        completed. A backend that cannot be reached is counted and otherwise ignored: the
        operations still expire at their deadlines."""
        wanted = list(keys)
        if not wanted:
            return 0
        try:
            values = await self._load(wanted)
        except Exception as exc:
            self._stats.refresh_failures += 1
            _log.debug("fanout_refresh_failed", error=repr(exc))
            return 0
        return sum(self._apply_advance(key, value) for key, value in values.items())

    async def resync(self) -> int:
        """Catch up: re-read the values of every watched key and re-check every one of them."""
        self._stats.resyncs += 1
        keys = self.watched_keys()
        completed = await self.refresh(keys)
        for key in keys:
            completed += self._apply_check(key)
        if completed:
            _log.info("fanout_resync_completed", keys=len(keys), completed=completed)
        return completed

    def _receive(self, message: str | bytes) -> None:
        """Apply one channel message; a malformed one is logged, counted and skipped."""
        self._stats.received += 1
        try:
            if isinstance(message, bytes):
                message = message.decode("utf-8")
            kind, origin, value, key = decode(message)
        except (MalformedMessage, UnicodeDecodeError) as exc:
            self._stats.malformed += 1
            _log.warning("fanout_malformed_message", error=str(exc))
            return
        if origin == self.origin:
            return  # applied when it was published
        if kind == CHECK:
            self._apply_check(key)
        elif kind == ADVANCE:
            self._apply_advance(key, value)
        else:
            self._apply_cancel(key)

    def _apply_check(self, key: str) -> int:
        self._stats.applied_checks += 1
        completed = 0
        for purgatory in self._purgatories:
            if not purgatory.closed:
                completed += purgatory.check_and_complete(key)
        self._stats.completed += completed
        return completed

    def _apply_advance(self, key: str, value: float) -> int:
        self._stats.applied_advances += 1
        old = self._values.get(key)
        if old is not None and old >= value:
            return 0  # a replay or a late, lower value: nothing new
        self._values[key] = value
        completed = 0
        for purgatory in self._purgatories:
            if not purgatory.closed:
                # advance_key for threshold watches; check_and_complete for operations that
                # declined at their threshold and moved to the plain watch list.
                completed += purgatory.advance_key(key, value)
                completed += purgatory.check_and_complete(key)
        self._stats.completed += completed
        return completed

    def _apply_cancel(self, key: str) -> int:
        self._stats.applied_cancels += 1
        cancelled = 0
        for purgatory in self._purgatories:
            if not purgatory.closed:
                cancelled += len(purgatory.cancel_for_key(key))
        self._watching.pop(key, None)
        return cancelled

    def _remember(self, op: DelayedOperation[Any], keys: tuple[str, ...]) -> None:
        for key in keys:
            ops = self._watching.get(key)
            if ops is None:
                self._watching[key] = {id(op): op}
            else:
                ops[id(op)] = op
        self._since_sweep += 1
        if self._since_sweep >= _SWEEP_EVERY:
            self._sweep()

    def _sweep(self) -> None:
        """Forget settled operations, and keys left without pending ones."""
        self._since_sweep = 0
        for key in list(self._watching):
            ops = self._watching[key]
            for ident in [ident for ident, op in ops.items() if op.done()]:
                del ops[ident]
            if not ops:
                del self._watching[key]
        # Values of keys nobody watches any more are dropped, so memory follows the watches.
        if len(self._values) > 2 * len(self._watching) + _SWEEP_EVERY:
            self._values = {k: v for k, v in self._values.items() if k in self._watching}


class ValueReached(DelayedOperation[float | None]):
    """Completes when the value of ``key`` reaches ``threshold`` in any process.

    Its result is the value reached, or None if it expired first. Watch it with
    :meth:`Fanout.watch_threshold` (or use :meth:`Fanout.wait_for_value`).
    """

    __slots__ = ("fanout", "key", "threshold")

    def __init__(self, fanout: Fanout, key: str, threshold: SupportsFloat, timeout: float) -> None:
        super().__init__(timeout)
        self.fanout = fanout
        self.key = check_key(key)
        self.threshold = check_value(threshold)

    def try_complete(self) -> bool:
        value = self.fanout._values.get(self.key)
        if value is not None and value >= self.threshold:
            return self.force_complete()
        return False

    def on_complete(self) -> float | None:
        value = self.fanout._values.get(self.key)
        return value if value is not None and value >= self.threshold else None
