"""The Redis engine behind Sentinel: it follows the master of a service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import redis.asyncio as aioredis
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from .._logging import get_logger
from ._base import (
    BackendHost,
    Event,
    FanoutUnavailable,
)
from ._redis_backend import RedisBackend, one_try
from ._redis_urls import in_words, parse_sentinel_url
from ._urls import redacted

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub


_log = get_logger("purgatory_aio.fanout.redis")


#: Seconds between the subscriber's questions to the sentinels: how long a subscription may
#: stay on a master that was demoted or frozen without closing its connection.
_SENTINEL_POLL: Final = 1.0


class SentinelBackend(RedisBackend):
    """The Redis engine behind Sentinel: the master of a service, wherever it is now."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.target = target = parse_sentinel_url(url)
        sentinel_options = {
            "socket_connect_timeout": self._timeout,
            "socket_timeout": self._timeout,
            # One try per sentinel per question: the next sentinel is the retry, and the
            # fan-out retries the whole question with its own backoff.
            "retry": one_try(),
            **target.sentinel,
        }
        self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=sentinel_options
        )
        self._next_poll = self._next_publish_poll = 0.0
        self._writing_to: str | None = None  # the master the last stored batch went to

    @property
    def address(self) -> str:
        return f"Redis service {self.target.service!r} via sentinels {redacted(self.url)}"

    async def connect(self, host: BackendHost | None) -> None:
        try:
            await super().connect(host)
        except FanoutUnavailable as unavailable:
            why = await self._why_no_sentinel_answered(unavailable.__context__)
            if why is None:
                raise
            raise FanoutUnavailable(why) from None

    def _none_answered(self, exc: BaseException | None) -> bool:
        # redis-py lists the sentinels it could not ask after " : ", one " - " each.
        unreachable = str(exc).partition(" : ")[2].count(" - ")
        return isinstance(exc, MasterNotFoundError) and unreachable >= len(self.target.sentinels)

    async def _why_no_sentinel_answered(self, exc: BaseException | None) -> str | None:
        """When no sentinel answered, why the first one did not (an untrusted certificate,
        TLS spoken to a plain port...), asked again: redis-py's error names each failure's
        type alone."""
        if not self._none_answered(exc):
            return None
        first = self._sentinel.sentinels[0]
        try:
            async with asyncio.timeout(self._timeout):
                await first.ping()
        except asyncio.CancelledError:
            raise
        except Exception as failure:
            where = first.connection_pool.connection_kwargs
            sentinel = f"{where.get('host')}:{where.get('port')}"
            return in_words(
                failure, self.url, f"{self.address}: no sentinel answered; the first, {sentinel}"
            )
        return None  # it answers now: the line already said what happened

    def _in_words(self, exc: BaseException) -> str:
        if not isinstance(exc, MasterNotFoundError):
            return super()._in_words(exc)
        if self._none_answered(exc):
            return f"cannot reach {self.address}: no sentinel answered"
        return (
            f"{self.address}: no sentinel knows a master of that service that is up "
            "(is the service name right? is a failover under way?)"
        )

    def _new_client(self, **options: Any) -> aioredis.Redis:
        client: aioredis.Redis = self._sentinel.master_for(
            self.target.service,
            socket_connect_timeout=self._timeout,
            decode_responses=False,
            **self.target.master,
            **options,
        )
        return client

    async def _follow_master(self, *, now: bool = False) -> None:
        """Point the command connections at the master the sentinels name (at most once a
        second unless ``now``): redis-py drops the idle ones when the master moved.

        After SENTINEL FAILOVER the old master keeps its role, and its clients, until the
        sentinels convert it (they look at it every 10 s), and a frozen one keeps them until
        it thaws: what is written there meanwhile is lost, and what is read is stale.
        """
        moment = time.monotonic()
        pool = self._client.connection_pool if self._client is not None else None
        if (now or moment >= self._next_publish_poll) and isinstance(pool, SentinelConnectionPool):
            self._next_publish_poll = moment + _SENTINEL_POLL
            with contextlib.suppress(Exception):  # a failover under way: the command will tell
                async with asyncio.timeout(self._timeout):
                    await pool.get_master_address()  # type: ignore[no-untyped-call]

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        await self._follow_master()
        results = await super().store_and_publish(events)
        self._note_writes()
        return results

    def _note_writes(self) -> None:
        """Remember the master the sentinels last named (redis-py's pool asks them at each new
        connection, and _follow_master once a second), and a change of it as a switch."""
        pool = self._client.connection_pool if self._client is not None else None
        master = getattr(pool, "master_address", None) if pool is not None else None
        if not master:
            return
        current = f"{master[0]}:{master[1]}"
        previous, self._writing_to = self._writing_to, current
        if previous is not None and previous != current:
            self._note_switch(previous, current)

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        await self._follow_master()
        return await super().read(keys, host)

    async def _follow_primary(self, pubsub: PubSub) -> None:
        # A master that was demoted keeps its clients until the sentinels convert it, and a
        # frozen one keeps them until it thaws: ask the sentinels, and move if they say so.
        now = time.monotonic()
        connection = pubsub.connection
        if now < self._next_poll or connection is None or not connection.is_connected:
            return
        self._next_poll = now + _SENTINEL_POLL
        try:
            async with asyncio.timeout(self._timeout):
                host, port = await self._sentinel.discover_master(self.target.service)
        except asyncio.CancelledError:
            raise
        except Exception:  # a failover under way, or the sentinels unreachable: ask later
            return
        if (str(host), int(port)) != (connection.host, connection.port):
            _log.info(
                "fanout_subscription_moving",
                address=self.address,
                old=f"{connection.host}:{connection.port}",
                new=f"{host}:{port}",
            )
            # The next read reconnects through the sentinels and subscribes again; the resync
            # that follows must read from the new master too.
            await self._follow_master(now=True)
            await connection.disconnect()

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(Exception):
            await self._sentinel.aclose()


__all__ = ["SentinelBackend"]
