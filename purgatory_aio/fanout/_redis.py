"""The Redis backend: one subscription per process, publishing off the request path, catch-up.

Needs the ``redis`` extra (``pip install 'purgatory-aio[redis]'``).

* **One channel.** Every process subscribes to one channel,
  ``<prefix>:events``, on one connection, for however many keys it watches;
  it filters by key with a dict lookup. Subscribing per key instead costs a
  SUBSCRIBE and an UNSUBSCRIBE round trip per watched key, plus a re-read of
  the key's value to close the race between watching and being subscribed;
  ``python -m bench fanout`` measures both (see the README). With a handful of
  worker processes per Redis the single channel is the cheaper one.
* **Publishing never blocks.** Events go to a bounded queue; one task sends
  them in pipelined batches. A full queue drops the event (counted, logged);
  a connection error keeps the batch and retries with backoff.
* **The store is the truth.** An advance is a Lua script that raises the key's
  stored value to ``max(old, new)`` (a string key with a TTL, so job ids do not
  accumulate forever) and publishes only when it raised it. Every time the
  subscription is confirmed (first connection and each reconnection, which
  redis-py performs silently) the process re-reads the values of its watched
  keys and re-checks each of them; a slow periodic resync is the safety net.
* **While Redis is down** nothing waits for it: operations expire at their
  deadlines, published events queue up (bounded), and the outage and the
  recovery are logged and counted in :class:`~purgatory_aio.fanout.FanoutStats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

try:
    import redis.asyncio as aioredis
    from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.fanout.RedisFanout needs redis-py: install the extra: "
        "pip install 'purgatory-aio[redis]'"
    ) from exc

from .._logging import get_logger
from .._purgatory import Purgatory
from ._base import ADVANCE, Fanout, FanoutUnavailable, encode

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

_log = get_logger("purgatory_aio.fanout.redis")

#: The environment variable read when no URL is given.
ENV_URL = "PURGATORY_AIO_REDIS_URL"
"""The environment variable ``RedisFanout(None)`` reads its Redis URL from."""

# Raise the stored value to max(old, new) and announce it; a replay or a lower value is
# neither stored nor published (everyone has seen a value at least as high, or will at
# their next resync).
_ADVANCE_LUA = """
local old = redis.call('GET', KEYS[1])
if old and tonumber(old) >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('PUBLISH', KEYS[2], ARGV[2])
return 1
"""

_ADVANCE_SHA = hashlib.sha1(_ADVANCE_LUA.encode()).hexdigest()

_NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)


def redacted(url: str) -> str:
    """``url`` with its password replaced, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$PURGATORY_AIO_REDIS_URL``; a clear error if neither."""
    chosen = url if url is not None else os.environ.get(ENV_URL)
    if not chosen:
        raise ValueError(f"no Redis URL: pass url='redis://host:6379/0' or set ${ENV_URL}")
    if not isinstance(chosen, str) or urlsplit(chosen).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"not a Redis URL: {redacted(str(chosen))!r} (expected redis://, rediss:// or unix://)"
        )
    return chosen


class RedisFanout(Fanout):
    """Fan-out through Redis pub/sub, with the latest advanced values stored in Redis.

    Args:
        url: ``redis://[user:password@]host:port/db``; ``None`` reads
            ``$PURGATORY_AIO_REDIS_URL``.
        purgatories: the purgatories events apply to (more with :meth:`attach`).
        prefix: namespace of the channel and the value keys, so several
            applications can share one Redis.
        queue_size: events that may wait to be published; beyond it they are dropped
            (counted in ``publish_dropped``).
        batch: events per pipelined round trip.
        value_ttl: seconds a stored value outlives its last raise.
        resync_interval: seconds between safety-net resyncs.
        connect_timeout: seconds to wait for a connection (and for a command).
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
        super().__init__(*purgatories)
        self.url = resolve_url(url)
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty str, got {prefix!r}")
        for name, number in (("queue_size", queue_size), ("batch", batch)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise ValueError(f"{name} must be a positive int, got {number!r}")
        for name, seconds in (
            ("value_ttl", value_ttl),
            ("resync_interval", resync_interval),
            ("connect_timeout", connect_timeout),
        ):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}")
        self.channel = f"{prefix}:events"
        self._value_prefix = f"{prefix}:value:"
        self._queue_size = queue_size
        self._batch = batch
        self._ttl = max(1, round(value_ttl))
        self._resync_interval = float(resync_interval)
        self._timeout = float(connect_timeout)
        self._queue: deque[tuple[str, str, float]] = deque()
        self._queued = asyncio.Event()
        self._drained = asyncio.Event()
        self._client: aioredis.Redis | None = None
        self._sub_client: aioredis.Redis | None = None
        self._pubsub: PubSub | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loads: list[tuple[list[str], asyncio.Future[dict[str, float]]]] = []
        self._load_task: asyncio.Task[None] | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self._resync_again = False
        self._subscribed_once = False
        self._down_since: float | None = None
        self._started = False
        self._subscribe = bool(subscribe)

    # -- lifecycle -------------------------------------------------------------------------------

    def _new_client(self, **options: Any) -> aioredis.Redis:
        return aioredis.from_url(
            self.url,
            socket_connect_timeout=self._timeout,
            decode_responses=False,
            **options,
        )

    async def start(self) -> None:
        """Connect, check the credentials and subscribe.

        Raises:
            FanoutUnavailable: Redis cannot be reached, or refused the credentials.
        """
        if self._started:
            return
        client = self._new_client(socket_timeout=self._timeout, max_connections=8)
        sub_client = pubsub = None
        if self._subscribe:
            sub_client = self._new_client(health_check_interval=max(1.0, self._resync_interval / 3))
            pubsub = sub_client.pubsub()
        try:
            async with asyncio.timeout(self._timeout * 2):
                await client.ping()
                if pubsub is not None:
                    await pubsub.subscribe(self.channel)
        except (AuthenticationError, ResponseError) as exc:
            await _close(pubsub, client, sub_client)
            raise FanoutUnavailable(
                f"Redis at {redacted(self.url)} refused the connection: {exc} "
                "(check the user and password in the URL)"
            ) from None
        except _NETWORK_ERRORS as exc:
            await _close(pubsub, client, sub_client)
            raise FanoutUnavailable(
                f"cannot reach Redis at {redacted(self.url)}: {exc or type(exc).__name__}"
            ) from None
        self._client, self._sub_client, self._pubsub = client, sub_client, pubsub
        self._started = True
        self._stats.connected = True
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._publisher(), name="purgatory_aio.fanout.publisher")]
        if pubsub is not None:
            self._tasks.append(
                loop.create_task(self._subscriber(pubsub), name="purgatory_aio.fanout.subscriber")
            )
        _log.info("fanout_started", url=redacted(self.url), channel=self.channel)

    async def stop(self, *, flush_timeout: float = 1.0) -> None:
        """Publish what is queued (for up to ``flush_timeout`` seconds), then disconnect."""
        if not self._started:
            return
        self._started = False
        if self._queue and self._stats.connected:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(flush_timeout):
                    await self._drained.wait()
        tasks = [*self._tasks, self._load_task, self._resync_task]
        for task in tasks:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
        for _, future in self._loads:
            if not future.done():
                future.set_exception(FanoutUnavailable("the fan-out is stopped"))
        self._loads.clear()
        await _close(self._pubsub, self._client, self._sub_client)
        self._pubsub = self._client = self._sub_client = None
        self._stats.connected = False
        if self._queue:
            _log.warning("fanout_stopped_with_unpublished_events", events=len(self._queue))
        _log.info("fanout_stopped", channel=self.channel)

    # -- connection state ------------------------------------------------------------------------

    def _down(self, exc: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._stats.connected = False
            self._stats.outages += 1
            _log.warning("fanout_redis_down", url=redacted(self.url), error=repr(exc))

    def _up(self) -> None:
        if self._down_since is not None:
            downtime = time.monotonic() - self._down_since
            self._down_since = None
            self._stats.connected = True
            self._stats.recoveries += 1
            _log.info("fanout_redis_recovered", url=redacted(self.url), downtime_s=downtime)

    # -- publishing ------------------------------------------------------------------------------

    def _send(self, kind: str, key: str, value: float) -> None:
        if len(self._queue) >= self._queue_size:
            self._stats.publish_dropped += 1
            if self._stats.publish_dropped % 1000 == 1:
                _log.warning(
                    "fanout_publish_dropped",
                    queued=len(self._queue),
                    total=self._stats.publish_dropped,
                )
            return
        self._queue.append((kind, key, value))
        self._drained.clear()
        self._queued.set()

    async def _publisher(self) -> None:
        queue = self._queue
        backoff = 0.05
        while True:
            if not queue:
                self._drained.set()
                self._queued.clear()
                await self._queued.wait()
                continue
            batch = [queue.popleft() for _ in range(min(self._batch, len(queue)))]
            while True:
                try:
                    await self._send_batch(batch)
                except _NETWORK_ERRORS as exc:
                    self._stats.publish_failures += 1
                    self._down(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                self._stats.published += len(batch)
                backoff = 0.05
                self._up()
                break

    async def _send_batch(self, batch: list[tuple[str, str, float]]) -> None:
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        channel, origin, prefix, ttl = self.channel, self.origin, self._value_prefix, self._ttl
        for kind, key, value in batch:
            message = encode(kind, key, value, origin)
            if kind == ADVANCE:
                pipe.evalsha(_ADVANCE_SHA, 2, prefix + key, channel, repr(value), message, ttl)
            else:
                pipe.publish(channel, message)
        # EVALSHA by its digest rather than redis-py's registered Script, whose pipelines ask
        # SCRIPT EXISTS on every execute (a second round trip per batch). A Redis that does
        # not know the script (first use, or restarted) fails the batch with NOSCRIPT: load
        # it and send the batch again; a check or cancel sent twice is harmless.
        try:
            await pipe.execute()
        except NoScriptError:
            await self._client.script_load(_ADVANCE_LUA)
            await self._send_batch(batch)

    # -- subscribing -----------------------------------------------------------------------------

    async def _subscriber(self, pubsub: PubSub) -> None:
        backoff = 0.05
        next_resync = time.monotonic() + self._resync_interval
        while True:
            try:
                message = await pubsub.get_message(timeout=min(1.0, self._resync_interval))
            except asyncio.CancelledError:
                raise
            except _NETWORK_ERRORS as exc:
                self._down(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except Exception as exc:
                # A reply redis-py cannot parse: log it and carry on listening.
                self._stats.malformed += 1
                _log.warning("fanout_subscriber_error", error=repr(exc))
                continue
            backoff = 0.05
            if message is not None:
                kind = message["type"]
                if kind == "message":
                    self._receive(message["data"])
                elif kind == "subscribe":
                    self._subscribed(message)
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + self._resync_interval
                self._schedule_resync()

    def _subscribed(self, message: dict[str, Any]) -> None:
        """The subscription is active from here on: whatever was published before it is in
        the store, so this is when to catch up (redis-py resubscribes silently after a cut)."""
        self._up()
        if self._subscribed_once:
            self._stats.resubscribes += 1
            _log.info("fanout_resubscribed", channel=self.channel)
        self._subscribed_once = True
        self._schedule_resync()

    def _schedule_resync(self) -> None:
        if self._resync_task is not None and not self._resync_task.done():
            self._resync_again = True
            return
        self._resync_task = asyncio.get_running_loop().create_task(self._resync_loop())

    async def _resync_loop(self) -> None:
        while True:
            self._resync_again = False
            try:
                await self.resync()
            except Exception as exc:  # never let the safety net take the subscriber down
                _log.warning("fanout_resync_failed", error=repr(exc))
            if not self._resync_again:
                return

    # -- reading the store -----------------------------------------------------------------------

    async def _load(self, keys: list[str]) -> dict[str, float]:
        """Concurrent reads are coalesced into one MGET per loop iteration, so ten thousand
        requests arriving at once cost a few round trips, not ten thousand."""
        if not self._started or not self._stats.connected:
            raise FanoutUnavailable("Redis is not connected")
        future: asyncio.Future[dict[str, float]] = asyncio.get_running_loop().create_future()
        self._loads.append((keys, future))
        if self._load_task is None or self._load_task.done():
            self._load_task = asyncio.get_running_loop().create_task(self._run_loads())
        async with asyncio.timeout(self._timeout):
            return await asyncio.shield(future)

    async def _run_loads(self) -> None:
        await asyncio.sleep(0)  # let the requests of this iteration join
        while self._loads:
            loads, self._loads = self._loads, []
            wanted = list(dict.fromkeys(key for keys, _ in loads for key in keys))
            try:
                values = await self._mget(wanted)
            except Exception as exc:
                for _, future in loads:
                    if not future.done():
                        future.set_exception(FanoutUnavailable(f"reading values failed: {exc!r}"))
                continue
            for keys, future in loads:
                if not future.done():
                    future.set_result({key: values[key] for key in keys if key in values})

    async def _mget(self, keys: list[str]) -> dict[str, float]:
        assert self._client is not None
        values: dict[str, float] = {}
        prefix = self._value_prefix
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            raw = await self._client.mget([prefix + key for key in chunk])
            for key, item in zip(chunk, raw, strict=True):
                if item is None:
                    continue
                try:
                    values[key] = float(item)
                except ValueError:
                    self._stats.malformed += 1
                    _log.warning("fanout_malformed_value", key=key, value=repr(item)[:100])
        return values

    def stats(self) -> Any:
        """:meth:`Fanout.stats`, with the events waiting in the publish queue."""
        stats = super().stats()
        stats.queued = len(self._queue)
        return stats


async def _close(pubsub: PubSub | None, *clients: aioredis.Redis | None) -> None:
    with contextlib.suppress(Exception):
        if pubsub is not None:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
    for client in clients:
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()
