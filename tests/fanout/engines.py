"""The fan-out's engines behind one face, so one behavioural suite runs against each.

An :class:`Engine` makes fan-out members that share one bus and store (a memory
hub, one redis-server, one PostgreSQL server, or a production topology: a Redis
master with a replica behind three sentinels, a Redis Cluster of three masters
with a replica each, a PostgreSQL primary with a streaming standby), each test
under a prefix of its own, and reaches around the fan-out to the engine itself,
as a hostile neighbour would: raw messages on the channel, foreign values in the
store. On a topology it reaches the node that holds the data now: the master the
sentinels name, the master of the key's slot, the primary.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from cluster_support import Cluster
from fanout_support import RedisServer
from pg_support import PostgresServer, ReplicatedPair
from sentinel_support import Sentinels

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, MemoryHub
from purgatory_aio.fanout._memory import MemoryBackend

ENGINES = ("memory", "redis", "postgres", "redis-sentinel", "redis-cluster", "postgres-standby")


@dataclass
class Engine:
    name: str
    make: Callable[..., Fanout]  # make(*purgatories, **options): a member, not started
    publish_raw: Callable[[str], Awaitable[None]]  # a message on the members' channel
    stored: Callable[[str], Awaitable[float | None]]  # the value the engine holds for a key
    # store_foreign(key): a value under key the fan-out did not write (None: cannot hold one)
    store_foreign: Callable[[str], Awaitable[None]] | None
    prefix: str = ""  # the members' prefix (none for the memory hub)


def memory_engine() -> Engine:
    hub = MemoryHub()

    def make(*purgatories: Purgatory, **options: Any) -> Fanout:
        return Fanout(MemoryBackend(hub), *purgatories, **options)

    async def publish_raw(message: str) -> None:
        hub.publish(message)

    async def stored(key: str) -> float | None:
        return hub.values.get(key)

    return Engine("memory", make, publish_raw, stored, None)


def redis_engine(server: RedisServer) -> Engine:
    async def node(_key: str) -> str:
        return server.url

    return _redis_engine("redis", server.url, node)


def sentinel_engine(sentinels: Sentinels) -> Engine:
    """Members on the ``redis+sentinel://`` URL; the engine itself is the master now."""

    async def master(_key: str) -> str:
        return (await asyncio.to_thread(sentinels.master)).url

    return _redis_engine("redis-sentinel", sentinels.url, master)


def cluster_engine(cluster: Cluster, first: RedisServer | None = None) -> Engine:
    """Members on the ``redis+cluster://`` URL (``first`` named first: the node they
    subscribe on); a key's value is on its slot's master, and a classic PUBLISH on any node
    reaches every node."""

    async def master_of(key: str) -> str:
        return (await asyncio.to_thread(cluster.master_of, key)).url

    return _redis_engine("redis-cluster", cluster.url(first), master_of)


def _redis_engine(name: str, url: str, node: Callable[[str], Awaitable[str]]) -> Engine:
    """A Redis engine whose members connect to ``url``; ``node(key)`` is the URL of the
    plain redis-server that holds ``key`` now."""
    from purgatory_aio.fanout import RedisFanout

    prefix = f"t{uuid.uuid4().hex[:10]}"

    def make(*purgatories: Purgatory, **options: Any) -> Fanout:
        return RedisFanout(url, *purgatories, prefix=prefix, **options)

    async def command(key: str, *args: Any) -> Any:
        client = aioredis.from_url(await node(key))
        try:
            return await client.execute_command(*args)
        finally:
            await client.aclose()

    async def publish_raw(message: str) -> None:
        channel = f"{prefix}:events"
        await command(channel, "PUBLISH", channel, message)

    async def store_foreign(key: str) -> None:
        full = f"{prefix}:value:{key}"
        await command(full, "SET", full, "not a number")

    async def stored(key: str) -> float | None:
        full = f"{prefix}:value:{key}"
        raw = await command(full, "GET", full)
        return None if raw is None else float(raw)

    return Engine(name, make, publish_raw, stored, store_foreign, prefix)


def postgres_engine(server: PostgresServer) -> Engine:
    return _postgres_engine("postgres", server.url)


def standby_engine(pair: ReplicatedPair) -> Engine:
    """Members on the pair's multi-host URL (``target_session_attrs=read-write``): the
    engine itself is whichever server is the primary now."""
    return _postgres_engine("postgres-standby", pair.url)


def _postgres_engine(name: str, url: str) -> Engine:
    from purgatory_aio.fanout import PostgresFanout

    prefix = f"t{uuid.uuid4().hex[:10]}"

    def make(*purgatories: Purgatory, **options: Any) -> Fanout:
        return PostgresFanout(url, *purgatories, prefix=prefix, **options)

    async def sql(query: str, *args: Any) -> Any:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            return await conn.fetchval(query, *args, timeout=10)
        finally:
            await conn.close(timeout=10)

    async def publish_raw(message: str) -> None:
        await sql("SELECT pg_notify($1, $2)", f"{prefix}_events", message)

    async def store_foreign(key: str) -> None:
        # A float8 column holds numbers only: the foreign values it can hold are NaN and
        # the infinities.
        await sql(
            f"INSERT INTO {prefix}_values (key, value) VALUES ($1, 'NaN') "
            "ON CONFLICT (key) DO UPDATE SET value = 'NaN'",
            key,
        )

    async def stored(key: str) -> float | None:
        value: float | None = await sql(f"SELECT value FROM {prefix}_values WHERE key = $1", key)
        return value

    return Engine(name, make, publish_raw, stored, store_foreign, prefix)
