"""The Redis engine on one server: the advance script, pipelined batches, the subscription."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    NoScriptError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._logging import get_logger
from ._base import (
    ADVANCE,
    BackendHost,
    Event,
    FanoutBackend,
    FanoutUnavailable,
)
from ._redis_urls import in_words
from ._urls import redacted

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub


_log = get_logger("purgatory_aio.fanout.redis")


# Raise the stored value to max(old, new) and announce it; a replay or a lower value is
# neither stored nor published (everyone has seen a value at least as high, or will at
# their next resync). A stored value that is not a number is someone else's: refused (Lua
# reads hexadecimal as a number, Python does not: refused too). A NaN or an infinity,
# which this fan-out never writes and members never apply, is replaced, as PostgreSQL's
# upsert does: otherwise a stored +inf would absorb every advance, acknowledged or not.
# The channel is an argument, not a key: a Cluster refuses a script whose keys lie in
# different slots, and a channel is no key there (PUBLISH reaches every node).
_ADVANCE_LUA = """
local old = redis.call('GET', KEYS[1])
if old then
  local number = tonumber(old)
  if number == nil or string.find(old, '[xX]') then
    return redis.error_reply('FOREIGN the key holds a value that is not a number')
  end
  if number == number and number < math.huge and number > -math.huge
      and number >= tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[2])
return 1
"""

_ADVANCE_SHA = hashlib.sha1(_ADVANCE_LUA.encode()).hexdigest()

_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    TimeoutError,
)


def one_try() -> Retry:
    """redis-py's retry policy for the fan-out's command connections: none. Its default
    (three more tries, with a growing backoff) held a command to a frozen server about
    fifteen times ``connect_timeout``; the fan-out retries a failed batch itself, with its
    own backoff, wherever the engine is by then."""
    return Retry(NoBackoff(), 0)


class RedisBackend(FanoutBackend):
    """The Redis engine of :class:`RedisFanout`: a channel, and the values under a prefix."""

    network_errors = _NETWORK_ERRORS

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        value_ttl: float,
        timeout: float,
        resync_interval: float,
        min_replicas: int = 0,
        replica_timeout: float = 0.5,
    ) -> None:
        self.url = url
        self.channel = f"{prefix}:events"
        self._value_prefix = f"{prefix}:value:"
        self._ttl = max(1, round(value_ttl))
        self._timeout = timeout
        self._health = max(1.0, resync_interval / 3)
        self._min_replicas = min_replicas
        self._replica_timeout = replica_timeout
        self._client: aioredis.Redis | None = None
        self._sub_client: aioredis.Redis | None = None
        self._pubsub: PubSub | None = None
        self._primary: str | None = None  # host:port the subscription was last confirmed on
        self._switch: tuple[str, str] | None = None  # not yet taken by take_switch()

    @property
    def address(self) -> str:
        return f"Redis at {redacted(self.url)}"

    def _new_client(self, **options: Any) -> aioredis.Redis:
        return aioredis.from_url(
            self.url, socket_connect_timeout=self._timeout, decode_responses=False, **options
        )

    async def connect(self, host: BackendHost | None) -> None:
        # A command's bound covers the WAIT a confirmed batch may end with.
        bound = self._timeout + (self._replica_timeout if self._min_replicas else 0.0)
        client = self._new_client(socket_timeout=bound, max_connections=8, retry=one_try())
        self._client = client
        try:
            await client.ping()
            if host is not None:
                self._sub_client = self._new_client(health_check_interval=self._health)
                self._pubsub = self._sub_client.pubsub()
                await self._pubsub.subscribe(self.channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # redis-py's errors, in the user's words, on one line
            raise FanoutUnavailable(self._in_words(exc)) from None

    def _in_words(self, exc: BaseException) -> str:
        return in_words(exc, self.url, self.address)

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        client = self._client
        assert client is not None
        return await self._send(client, events)

    async def _send(
        self, client: aioredis.Redis, events: Sequence[Event]
    ) -> list[BaseException | None]:
        """One batch as one pipeline on one server (one connection, so a closing ``WAIT``
        covers the batch's writes)."""
        pipe = client.pipeline(transaction=False)
        channel, prefix, ttl = self.channel, self._value_prefix, self._ttl
        for event in events:
            if event.kind == ADVANCE:
                key, value = prefix + event.key, repr(event.value)
                pipe.evalsha(_ADVANCE_SHA, 1, key, value, event.message, ttl, channel)
            else:
                pipe.publish(channel, event.message)
        # Only a batch someone waits for pays the replicas' round trip.
        replicated = self._min_replicas > 0 and any(event.waiter for event in events)
        if replicated:
            pipe.execute_command("WAIT", self._min_replicas, round(self._replica_timeout * 1000))
        # EVALSHA by its digest rather than redis-py's registered Script, whose pipelines ask
        # SCRIPT EXISTS on every execute (a second round trip per batch). Replies are taken one
        # by one (raise_on_error=False): one refused event does not fail the others.
        replies = await pipe.execute(raise_on_error=False)
        acknowledged = replies.pop() if replicated else None
        results: list[BaseException | None] = [
            reply if isinstance(reply, Exception) else None for reply in replies
        ]
        wanted = self._min_replicas
        if replicated and not (isinstance(acknowledged, int) and acknowledged >= wanted):
            self._too_few_replicas(events, results, acknowledged)
        missing = [i for i, reply in enumerate(results) if isinstance(reply, NoScriptError)]
        if missing:
            # A Redis that does not know the script (first use, or restarted): load it and send
            # those events again.
            await client.script_load(_ADVANCE_LUA)
            again = await self._send(client, [events[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        return results

    def _too_few_replicas(
        self, events: Sequence[Event], results: list[BaseException | None], acknowledged: object
    ) -> None:
        """Fail the confirmed advances of a batch fewer replicas than asked acknowledged."""
        said = (
            f"{acknowledged} of the {self._min_replicas}"
            if isinstance(acknowledged, int)
            else f"none of the {self._min_replicas} (WAIT failed: {acknowledged})"
        )
        error = FanoutUnavailable(
            f"stored on the master at {self.address}, but {said} replicas asked for "
            f"acknowledged it within {self._replica_timeout:g} s: a failover now may lose it"
        )
        _log.warning(
            "fanout_replicas_behind",
            address=self.address,
            acknowledged=acknowledged if isinstance(acknowledged, int) else None,
            wanted=self._min_replicas,
        )
        for i, event in enumerate(events):
            if event.waiter is not None and results[i] is None:
                results[i] = error

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        client = self._client
        assert client is not None
        prefix = self._value_prefix
        return self._numbers(keys, await client.mget([prefix + key for key in keys]), host)

    @staticmethod
    def _numbers(keys: Sequence[str], raw: Sequence[Any], host: BackendHost) -> dict[str, float]:
        """The finite numbers among the stored values of ``keys``; others are reported."""
        values: dict[str, float] = {}
        for key, item in zip(keys, raw, strict=True):
            if item is None:
                continue
            try:
                number = float(item)
            except ValueError:
                host.foreign_value(key, item)
                continue
            if number - number == 0:  # finite
                values[key] = number
            else:
                host.foreign_value(key, item)
        return values

    async def subscribe(self, host: BackendHost) -> None:
        task = asyncio.current_task()
        backoff = 0.05
        while host.listening:
            pubsub = self._pubsub  # _follow_primary may put the subscription on another node
            assert pubsub is not None
            try:
                await self._follow_primary(pubsub)
                if self._pubsub is not None:
                    pubsub = self._pubsub
                message = await pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not host.listening:
                    return
                # A dropped connection (redis-py reconnects and resubscribes on the next call)
                # or a reply it cannot parse: either way, listen again after a pause.
                host.down(exc)
                await self._subscription_failed(pubsub, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if task is not None and task.cancelling():
                # redis-py's wait_for swallowed our cancellation (Python 3.11): honour it.
                raise asyncio.CancelledError
            backoff = 0.05
            if message is None:
                continue
            kind = message["type"]
            if kind == "message":
                host.deliver(message["data"])
            elif kind == "subscribe":
                # Active from here on: whatever was published before is in the store.
                self._note_primary(pubsub, host)
                host.subscribed()
            elif kind == "pong":
                self._answered(message["data"])

    def _note_primary(self, pubsub: PubSub, host: BackendHost) -> None:
        """Report a subscription confirmed on another server than the last one: a failover."""
        connection = pubsub.connection
        if connection is None:
            return
        primary = f"{connection.host}:{connection.port}"
        if self._primary is not None and primary != self._primary:
            host.switched(self._primary, primary)
        self._primary = primary

    async def _follow_primary(self, pubsub: PubSub) -> None:
        """Move a subscription left behind by a failover (a single server has none)."""

    def _note_switch(self, previous: str, current: str) -> None:
        """The writes moved from ``previous`` to ``current``; two moves before anyone asks
        are one, from the first server to the last (none if that is where they began)."""
        first = self._switch[0] if self._switch is not None else previous
        self._switch = None if first == current else (first, current)

    def take_switch(self) -> tuple[str, str] | None:
        switch, self._switch = self._switch, None
        return switch

    def _answered(self, data: object) -> None:
        """A ``PING`` sent on the subscription's connection was answered with ``data``."""

    async def _subscription_failed(self, pubsub: PubSub, exc: BaseException) -> None:
        """After a network error redis-py reconnects and resubscribes on the next call; after
        any other error the connection is closed, to start again from a clean state."""
        if not isinstance(exc, self.network_errors):
            with contextlib.suppress(Exception):
                connection = pubsub.connection
                if connection is not None:
                    await connection.disconnect()

    async def close(self) -> None:
        pubsub, client, sub_client = self._pubsub, self._client, self._sub_client
        self._pubsub = self._client = self._sub_client = None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        for one in (client, sub_client):
            if one is not None:
                with contextlib.suppress(Exception):
                    await one.aclose()


__all__ = ["RedisBackend"]
