"""The in-memory backend: fan-out between the :class:`Fanout` objects of one process.

For tests and single-process applications. Delivery is asynchronous, as with a
real broker (each event reaches the other members on the next loop iteration),
and the hub keeps the latest value of every advanced key, so a member that
starts late catches up the way a reconnecting Redis subscriber does.
"""

from __future__ import annotations

import asyncio

from .._purgatory import Purgatory
from ._base import ADVANCE, Fanout, encode


class MemoryHub:
    """The shared bus and value store of a set of :class:`MemoryFanout` members."""

    __slots__ = ("members", "values")

    def __init__(self) -> None:
        self.members: list[MemoryFanout] = []
        self.values: dict[str, float] = {}

    def publish(self, message: str) -> None:
        """Deliver a raw channel message to every started member (as Redis would)."""
        for member in self.members:
            member._deliver(message)


class MemoryFanout(Fanout):
    """A member of a :class:`MemoryHub`."""

    def __init__(self, hub: MemoryHub | None = None, *purgatories: Purgatory) -> None:
        super().__init__(*purgatories)
        self.hub = MemoryHub() if hub is None else hub
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.hub.members.append(self)
        self._stats.connected = True
        await self.resync()

    async def stop(self) -> None:
        if self._loop is None:
            return
        self.hub.members.remove(self)
        self._loop = None
        self._stats.connected = False

    def _send(self, kind: str, key: str, value: float) -> None:
        self._stats.published += 1
        if kind == ADVANCE:
            old = self.hub.values.get(key)
            if old is not None and old >= value:
                return  # as the Redis script: only a raise is announced
            self.hub.values[key] = value
        self.hub.publish(encode(kind, key, value, self.origin))

    def _deliver(self, message: str) -> None:
        if self._loop is not None:
            self._loop.call_soon(self._receive, message)

    async def _load(self, keys: list[str]) -> dict[str, float]:
        values = self.hub.values
        return {key: values[key] for key in keys if key in values}
