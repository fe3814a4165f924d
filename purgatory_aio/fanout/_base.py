"""The seam between a fan-out and its engine: the backend interface, what a backend reports
to its host, one event on its way to the engine, and the error an unreachable engine gives.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Final

from .._relay import ADVANCE as ADVANCE
from .._relay import CANCEL as CANCEL
from .._relay import CHECK as CHECK
from .._relay import MalformedMessage as MalformedMessage
from .._relay import decode as decode
from .._relay import encode as encode

ABANDON_AFTER: Final = 0.25
"""Seconds :meth:`Fanout.stop` waits for its tasks, and again for the engine's connections
to close, before abandoning them: a frozen engine never holds a shutdown."""


class FanoutUnavailable(ConnectionError):
    """The fan-out's engine cannot be reached, refused the credentials, or did not
    store an event within the bound the caller chose."""


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
    * :meth:`take_switch` is asked after each stored batch of a member that only
      publishes (it has no subscription to notice a failover by): the servers its
      writes moved between since the last answer, or None.
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

    def take_switch(self) -> tuple[str, str] | None:
        """``(previous, current)`` when the writes now reach another server than at the
        last call (a failover), else None; an engine without failovers keeps this default."""
        return None


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


def say(exc: BaseException) -> str:
    """An exception as one short line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = [
    "ABANDON_AFTER",
    "ADVANCE",
    "CANCEL",
    "CHECK",
    "BackendHost",
    "Event",
    "FanoutBackend",
    "FanoutUnavailable",
    "MalformedMessage",
    "decode",
    "encode",
    "say",
]
