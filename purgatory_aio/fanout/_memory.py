"""The in-memory backend: fan-out between the :class:`Fanout` objects of one process.

For tests and single-process applications, and the reference for what a backend
does. Delivery is asynchronous, as with a real engine (each event reaches the
other members on a later loop iteration), and the hub keeps the latest value of
every advanced key, so a member that starts late catches up the way a
reconnecting Redis or PostgreSQL subscriber does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .._purgatory import Purgatory
from ._base import ADVANCE, BackendHost, Event, FanoutBackend
from ._fanout import Fanout


class MemoryHub:
    """The shared bus and value store of a set of :class:`MemoryFanout` members."""

    __slots__ = ("members", "values")

    def __init__(self) -> None:
        self.members: list[Fanout] = []  # the subscribed members, in subscription order
        self.values: dict[str, float] = {}

    def publish(self, message: str) -> None:
        """Deliver a raw channel message to every subscribed member (as an engine would)."""
        loop = asyncio.get_running_loop()
        for member in self.members:
            loop.call_soon(member.deliver, message)


class MemoryBackend(FanoutBackend):
    """A :class:`FanoutBackend` over a :class:`MemoryHub`."""

    def __init__(self, hub: MemoryHub) -> None:
        self.hub = hub
        self._member: Fanout | None = None

    @property
    def address(self) -> str:
        return f"memory hub {id(self.hub):#x}"

    async def connect(self, host: BackendHost | None) -> None:
        if host is not None:
            assert isinstance(host, Fanout)
            self.hub.members.append(host)
            self._member = host

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        values = self.hub.values
        for event in events:
            if event.kind == ADVANCE:
                old = values.get(event.key)
                if old is not None and old >= event.value:
                    continue  # only a raise is announced
                values[event.key] = event.value
            self.hub.publish(event.message)
        return [None] * len(events)

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        values = self.hub.values
        return {key: values[key] for key in keys if key in values}

    async def subscribe(self, host: BackendHost) -> None:
        host.subscribed()
        await asyncio.Event().wait()  # until cancelled: a hub never drops a subscription

    async def close(self) -> None:
        member = self._member
        self._member = None
        if member is not None and member in self.hub.members:
            self.hub.members.remove(member)


class MemoryFanout(Fanout):
    """A member of a :class:`MemoryHub` (a new hub of its own if None)."""

    def __init__(self, hub: MemoryHub | None = None, *purgatories: Purgatory) -> None:
        self.hub = MemoryHub() if hub is None else hub
        super().__init__(MemoryBackend(self.hub), *purgatories)
