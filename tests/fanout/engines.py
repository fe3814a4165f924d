"""The fan-out's engines behind one face, so one behavioural suite runs against each.

An :class:`Engine` makes fan-out members that share one bus and store (a memory
hub, one redis-server, one PostgreSQL server), each test under a prefix of its
own, and reaches around the fan-out to the engine itself, as a hostile neighbour
would: raw messages on the channel, foreign values in the store.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from fanout_support import RedisServer
from pg_support import PostgresServer

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, MemoryHub
from purgatory_aio.fanout._memory import MemoryBackend

ENGINES = ("memory", "redis", "postgres")


@dataclass
class Engine:
    name: str
    make: Callable[..., Fanout]  # make(*purgatories, **options): a member, not started
    publish_raw: Callable[[str], Awaitable[None]]  # a message on the members' channel
    stored: Callable[[str], Awaitable[float | None]]  # the value the engine holds for a key
    # store_foreign(key): a value under key the fan-out did not write (None: cannot hold one)
    store_foreign: Callable[[str], Awaitable[None]] | None


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
    from purgatory_aio.fanout import RedisFanout

    prefix = f"t{uuid.uuid4().hex[:10]}"

    def make(*purgatories: Purgatory, **options: Any) -> Fanout:
        return RedisFanout(server.url, *purgatories, prefix=prefix, **options)

    async def command(*args: Any) -> Any:
        client = aioredis.from_url(server.url)
        try:
            return await client.execute_command(*args)
        finally:
            await client.aclose()

    async def publish_raw(message: str) -> None:
        await command("PUBLISH", f"{prefix}:events", message)

    async def store_foreign(key: str) -> None:
        await command("SET", f"{prefix}:value:{key}", "not a number")

    async def stored(key: str) -> float | None:
        raw = await command("GET", f"{prefix}:value:{key}")
        return None if raw is None else float(raw)

    return Engine("redis", make, publish_raw, stored, store_foreign)


def postgres_engine(server: PostgresServer) -> Engine:
    from purgatory_aio.fanout import PostgresFanout

    prefix = f"t{uuid.uuid4().hex[:10]}"

    def make(*purgatories: Purgatory, **options: Any) -> Fanout:
        return PostgresFanout(server.url, *purgatories, prefix=prefix, **options)

    async def sql(query: str, *args: Any) -> Any:
        conn = await asyncpg.connect(server.url, timeout=10)
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

    return Engine("postgres", make, publish_raw, stored, store_foreign)
