"""The Redis backend: one subscription per process, publishing off the request path, catch-up.

Needs the ``redis`` extra (``pip install 'purgatory-aio[redis]'``).

* **One channel.** Every process subscribes to one channel,
  ``<prefix>:events``, on one connection, for however many keys it watches;
  it filters by key with a dict lookup. Subscribing per key instead costs a
  SUBSCRIBE and an UNSUBSCRIBE round trip per watched key, plus a re-read of
  the key's value to close the race between watching and being subscribed.
  With a handful of worker processes per Redis the single channel is the
  cheaper one.
* **The store is the truth.** An advance is a Lua script that raises the key's
  stored value to ``max(old, new)`` (a string key with a TTL, so job ids do not
  accumulate forever) and publishes only when it raised it. Every time the
  subscription is confirmed (first connection and each reconnection, which
  redis-py performs silently) the process re-reads the values of its watched
  keys and re-checks each of them.
* **Refusals are per event.** A batch is one pipeline whose replies are taken
  one by one: a foreign value under the prefix (a string that is not a number,
  a hash: ``WRONGTYPE``) fails that event alone, logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

try:
    import redis.asyncio as aioredis
    from redis.exceptions import AuthenticationError, NoScriptError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.fanout.RedisFanout needs redis-py: install the extra: "
        "pip install 'purgatory-aio[redis]'"
    ) from exc

from .._logging import get_logger
from .._purgatory import Purgatory
from .._validation import check_positive_seconds
from ._base import (
    ADVANCE,
    BackendHost,
    Event,
    Fanout,
    FanoutBackend,
    FanoutUnavailable,
)
from ._urls import redacted

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

_log = get_logger("purgatory_aio.fanout.redis")

#: The environment variable read when no URL is given.
ENV_URL = "PURGATORY_AIO_REDIS_URL"
"""The environment variable ``RedisFanout(None)`` reads its Redis URL from."""

# Raise the stored value to max(old, new) and announce it; a replay or a lower value is
# neither stored nor published (everyone has seen a value at least as high, or will at
# their next resync). A stored value that is not a number is someone else's: refused (Lua
# reads hexadecimal as a number, Python does not: refused too). A NaN or an infinity,
# which this fan-out never writes and members never apply, is replaced, as PostgreSQL's
# upsert does: otherwise a stored +inf would absorb every advance, acknowledged or not.
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
redis.call('PUBLISH', KEYS[2], ARGV[2])
return 1
"""

_ADVANCE_SHA = hashlib.sha1(_ADVANCE_LUA.encode()).hexdigest()

_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    TimeoutError,
)


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$PURGATORY_AIO_REDIS_URL``, checked before any
    connection: a clear ``ValueError`` naming what is wrong."""
    chosen = url if url is not None else os.environ.get(ENV_URL)
    if not chosen:
        raise ValueError(f"no Redis URL: pass url='redis://host:6379/0' or set ${ENV_URL}")
    if not isinstance(chosen, str):
        raise TypeError(f"the Redis URL must be a str, got {chosen!r}")
    check_url(chosen)
    return chosen


def check_url(url: str) -> None:
    """Refuse a Redis URL whose scheme, host, port or database is wrong (redis-py would
    quietly use localhost:6379 for a missing host)."""
    shown = redacted(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"not a Redis URL: {shown!r}: the scheme must be redis://, rediss:// or unix://"
        )
    if scheme == "unix":
        if not parts.path:
            raise ValueError(f"Redis URL {shown!r} names no socket path (unix:///path/redis.sock)")
        return
    if not url.lower().startswith(f"{scheme}://"):
        raise ValueError(
            f"Redis URL {shown!r} is malformed: expected {scheme}://host:port/db "
            f"(two slashes after '{scheme}:')"
        )
    if not parts.hostname:
        raise ValueError(f"Redis URL {shown!r} names no host: expected {scheme}://host:port/db")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(
            f"Redis URL {shown!r} has an invalid port: expected a number from 1 to 65535"
        ) from None
    if port == 0:
        raise ValueError(
            f"Redis URL {shown!r} has an invalid port: expected a number from 1 to 65535"
        )
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ValueError(
            f"Redis URL {shown!r} has an invalid database {db!r}: expected a number (/0)"
        )


def _in_words(exc: BaseException, url: str) -> str:
    """Why a connection to Redis failed, in the user's words, on one line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = text.lower()
    where = f"Redis at {redacted(url)}"
    signs = ("noauth", "wrongpass", "authentication", "password", "auth ")
    if isinstance(exc, AuthenticationError) or any(sign in lowered for sign in signs):
        if _password(url) is None:
            return (
                f"{where} requires a password: put it in the URL "
                "(redis://:password@host:port/0, or redis://user:password@...)"
            )
        return f"{where} refused the user name or password in the URL"
    if "protocol error" in lowered or type(exc).__name__ == "InvalidResponse":
        return (
            f"{where} did not answer in the Redis protocol: is another service (HTTP?) "
            "listening on that port?"
        )
    if any(sign in lowered for sign in ("connection refused", "connect call failed", "error 111")):
        return f"cannot reach {where}: connection refused (is redis-server running there?)"
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return f"cannot reach {where}: no answer in time"
    if "closed by server" in lowered or "connection reset" in lowered:
        return f"{where} closed the connection at once: is it a Redis server?"
    if isinstance(exc, RedisConnectionError | OSError):
        return f"cannot reach {where}: {text}"
    return f"cannot use {where}: {text}"


class RedisBackend(FanoutBackend):
    """The Redis engine of :class:`RedisFanout`: a channel, and the values under a prefix."""

    network_errors = _NETWORK_ERRORS

    def __init__(
        self, url: str, *, prefix: str, value_ttl: float, timeout: float, resync_interval: float
    ) -> None:
        self.url = url
        self.channel = f"{prefix}:events"
        self._value_prefix = f"{prefix}:value:"
        self._ttl = max(1, round(value_ttl))
        self._timeout = timeout
        self._health = max(1.0, resync_interval / 3)
        self._client: aioredis.Redis | None = None
        self._sub_client: aioredis.Redis | None = None
        self._pubsub: PubSub | None = None

    @property
    def address(self) -> str:
        return f"Redis at {redacted(self.url)}"

    def _new_client(self, **options: Any) -> aioredis.Redis:
        return aioredis.from_url(
            self.url, socket_connect_timeout=self._timeout, decode_responses=False, **options
        )

    async def connect(self, host: BackendHost | None) -> None:
        client = self._new_client(socket_timeout=self._timeout, max_connections=8)
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
            raise FanoutUnavailable(_in_words(exc, self.url)) from None

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        client = self._client
        assert client is not None
        pipe = client.pipeline(transaction=False)
        channel, prefix, ttl = self.channel, self._value_prefix, self._ttl
        for event in events:
            if event.kind == ADVANCE:
                key, value = prefix + event.key, repr(event.value)
                pipe.evalsha(_ADVANCE_SHA, 2, key, channel, value, event.message, ttl)
            else:
                pipe.publish(channel, event.message)
        # EVALSHA by its digest rather than redis-py's registered Script, whose pipelines ask
        # SCRIPT EXISTS on every execute (a second round trip per batch). Replies are taken one
        # by one (raise_on_error=False): one refused event does not fail the others.
        replies = await pipe.execute(raise_on_error=False)
        results: list[BaseException | None] = [
            reply if isinstance(reply, Exception) else None for reply in replies
        ]
        missing = [i for i, reply in enumerate(results) if isinstance(reply, NoScriptError)]
        if missing:
            # A Redis that does not know the script (first use, or restarted): load it and send
            # those events again.
            await client.script_load(_ADVANCE_LUA)
            again = await self.store_and_publish([events[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        return results

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        client = self._client
        assert client is not None
        prefix = self._value_prefix
        raw = await client.mget([prefix + key for key in keys])
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
        pubsub = self._pubsub
        assert pubsub is not None
        task = asyncio.current_task()
        backoff = 0.05
        while host.listening:
            try:
                message = await pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not host.listening:
                    return
                # A dropped connection (redis-py reconnects and resubscribes on the next call)
                # or a reply it cannot parse: either way, listen again after a pause.
                host.down(exc)
                if not isinstance(exc, self.network_errors):
                    with contextlib.suppress(Exception):
                        connection = pubsub.connection
                        if connection is not None:
                            await connection.disconnect()
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
                host.subscribed()

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


class RedisFanout(Fanout):
    """Fan-out through Redis pub/sub, with the latest advanced values stored in Redis.

    Args:
        url: ``redis://[user:password@]host:port/db``; ``None`` reads
            ``$PURGATORY_AIO_REDIS_URL``. Checked at once (scheme, host, port,
            database): a ``ValueError`` says what is wrong.
        purgatories: the purgatories events apply to (more with :meth:`attach`).
        prefix: namespace of the channel and the value keys, so several
            applications can share one Redis.
        queue_size: events that may wait to be published; beyond it they are dropped
            (counted in ``publish_dropped``).
        batch: events per pipelined round trip.
        value_ttl: seconds a stored value outlives its last raise.
        resync_interval: seconds between safety-net resyncs.
        connect_timeout: seconds to wait for a connection, and for a command.
        subscribe: False for a process that only publishes (a webhook receiver that
            never waits): no subscription connection, nothing applied from others.
    """

    def __init__(
        self,
        url: str | None = None,
        *purgatories: Purgatory,
        prefix: str = "purgatory_aio",
        queue_size: int = 65536,
        batch: int = 512,
        value_ttl: float = 86400.0,
        resync_interval: float = 30.0,
        connect_timeout: float = 2.0,
        subscribe: bool = True,
    ) -> None:
        resolved = resolve_url(url)
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty str, got {prefix!r}")
        backend = RedisBackend(
            resolved,
            prefix=prefix,
            value_ttl=check_positive_seconds(value_ttl, "value_ttl"),
            timeout=check_positive_seconds(connect_timeout, "connect_timeout"),
            resync_interval=check_positive_seconds(resync_interval, "resync_interval"),
        )
        super().__init__(
            backend,
            *purgatories,
            queue_size=queue_size,
            batch=batch,
            resync_interval=resync_interval,
            connect_timeout=connect_timeout,
            subscribe=subscribe,
        )
        self.url = resolved
        self.channel = backend.channel


__all__ = ["ENV_URL", "RedisBackend", "RedisFanout", "check_url", "redacted", "resolve_url"]
