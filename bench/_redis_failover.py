"""What ``bench fanout``'s failover measurements need of a replicated Redis topology.

The measurements (a master killed, confirmed acks lost, the replica option's cost) are the
same for Redis behind Sentinel and for a Redis Cluster; only the questions differ: which
master holds a key, which replica follows it, which node took over, what the survivors
hold. Each topology of the tests (``Sentinels``, ``Cluster``) is wrapped in a ``Side``
that answers them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol


class Side(Protocol):
    """One topology as the failover measurements see it; the blocking methods are called
    from a thread."""

    name: str

    def url(self, first: Any = None) -> str:
        """The URL of the topology; a member subscribes on ``first`` if it can choose."""

    def wait_healthy(self) -> None: ...

    def master(self, key: str) -> Any:
        """The node that serves ``key`` (a stored key, prefix included) now."""

    def replica(self, master: Any) -> Any: ...

    def new_master(self, old: Any, key: str) -> Any:
        """The node that serves ``key`` once ``old`` (killed) no longer does."""

    def freeze(self, node: Any) -> None: ...

    def thaw(self, node: Any) -> None: ...

    async def held(self, keys: Sequence[str]) -> list[Any]:
        """The values stored under ``keys`` (prefixes included) now, None where missing."""


class SentinelSide:
    """One master and its replica behind three sentinels: every key on the master."""

    name = "sentinel"

    def __init__(self, topology: Any) -> None:
        self.topology = topology

    def url(self, first: Any = None) -> str:
        return str(self.topology.url)

    def wait_healthy(self) -> None:
        self.topology.wait_healthy()

    def master(self, key: str) -> Any:
        return self.topology.master()

    def replica(self, master: Any) -> Any:
        return self.topology.replica()

    def new_master(self, old: Any, key: str) -> Any:
        return self.topology.wait_new_master(old)

    def freeze(self, node: Any) -> None:
        self.topology.freeze(node)

    def thaw(self, node: Any) -> None:
        self.topology.thaw(node)

    async def held(self, keys: Sequence[str]) -> list[Any]:
        import redis.asyncio as aioredis

        client = aioredis.Redis(host="127.0.0.1", port=self.topology.master().port)
        try:
            return await _in_chunks(client.mget, keys)
        finally:
            await client.aclose()


class ClusterSide:
    """Three masters with a replica each: a key on the master of its slot."""

    name = "cluster"

    def __init__(self, topology: Any) -> None:
        self.topology = topology

    def url(self, first: Any = None) -> str:
        return str(self.topology.url(first))

    def wait_healthy(self) -> None:
        self.topology.wait_healthy()

    def master(self, key: str) -> Any:
        return self.topology.master_of(key)

    def replica(self, master: Any) -> Any:
        return self.topology.replica_of(master)

    def new_master(self, old: Any, key: str) -> Any:
        new = self.topology.wait_promoted(old, key)
        self.topology.wait_serving()
        return new

    def freeze(self, node: Any) -> None:
        self.topology.freeze(node)

    def thaw(self, node: Any) -> None:
        self.topology.thaw(node)

    async def held(self, keys: Sequence[str]) -> list[Any]:
        from redis.asyncio.cluster import RedisCluster

        port = self.topology.answering()[0].port
        client = RedisCluster(host="127.0.0.1", port=port)
        try:
            return await _in_chunks(client.mget_nonatomic, keys)
        finally:
            await client.aclose()


async def _in_chunks(
    read: Callable[[list[str]], Awaitable[list[Any]]], keys: Sequence[str]
) -> list[Any]:
    """``read`` of every key, a thousand at a time."""
    values: list[Any] = []
    for start in range(0, len(keys), 1000):
        values += await read(list(keys[start : start + 1000]))
    return values
