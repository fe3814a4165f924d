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
* **Sentinel.** ``redis+sentinel://h1:p1,h2:p2/service?db=0`` asks the sentinels
  for the service's master before each connection (redis-py's ``Sentinel``).
  The subscriber asks them again about once a second, so that a subscription
  left on a demoted or frozen master moves to the new one; each move is logged
  and counted (``failovers``), and the resubscription re-reads every watched key.
* **Replicas.** Replication is asynchronous: with ``min_replicas=N``, a batch
  holding a confirmed advance ends with ``WAIT N timeout`` in the same pipeline
  (the same connection, so it covers the batch's writes), and the confirmations
  of that batch fail with :class:`FanoutUnavailable` when fewer replicas
  acknowledged in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

try:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
    from redis.backoff import NoBackoff
    from redis.exceptions import (
        AskError,
        AuthenticationError,
        ClusterDownError,
        MasterDownError,
        MovedError,
        NoScriptError,
        ReadOnlyError,
        TryAgainError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.fanout.RedisFanout needs redis-py: install the extra: "
        "pip install 'purgatory-aio[redis]'"
    ) from exc

from .._logging import get_logger
from .._purgatory import Purgatory
from .._validation import check_positive_int, check_positive_seconds
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

# A Cluster's answers meaning "not here, or not now": the slot moved or is moving, or a
# failover is under way.
_MOVING: Final = (
    MovedError,
    AskError,
    TryAgainError,
    ClusterDownError,
    ReadOnlyError,
    MasterDownError,
)

# What OpenSSL says when the other end does not speak TLS.
_TLS_MISMATCH: Final = ("wrong version number", "record layer failure", "packet length too long")

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


#: The schemes of a URL naming the sentinels of a service rather than a server.
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
_SENTINEL_PORT: Final = 26379
_TLS_OPTIONS: Final = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
_CERT_REQS: Final = ("required", "optional", "none")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
#: Seconds between the subscriber's questions to the sentinels: how long a subscription may
#: stay on a master that was demoted or frozen without closing its connection.
_SENTINEL_POLL: Final = 1.0


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: the sentinels, the service, and the options
    of the connections to the master (``master``) and to the sentinels (``sentinel``)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    master: dict[str, Any] = field(default_factory=dict)
    sentinel: dict[str, Any] = field(default_factory=dict)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read ``redis+sentinel://[user:password@]host:port[,host:port...]/service[?db=N]``
    (``rediss+sentinel://`` for TLS to the master and the sentinels), or raise a
    ``ValueError`` naming what is wrong.

    The password in the address is the master's; ``sentinel_username`` and
    ``sentinel_password`` in the query are the sentinels' own. Over TLS the query may
    also hold ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``
    (required, optional, none) and ``ssl_check_hostname`` (true, false).
    """
    shown = redacted(url)
    scheme, parts, sentinels = _servers(
        url, SENTINEL_SCHEMES, "Sentinel", "sentinel", _SENTINEL_PORT, "/service[?db=0]"
    )
    form = f"{scheme}://[:password@]host:port[,host:port...]/service[?db=0]"
    service = unquote(parts.path[1:])
    if not service or "/" in service:
        raise ValueError(
            f"Sentinel URL {shown!r} must name one service after the sentinels: expected {form}"
        )
    tls = scheme == "rediss+sentinel"
    allowed = ["db", "sentinel_username", "sentinel_password"]
    if tls:
        allowed += [*_TLS_OPTIONS, "ssl_check_hostname"]
    master: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    shared: dict[str, Any] = {"ssl": True} if tls else {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in allowed:
            extra = "" if tls else " (the ssl_* options need rediss+sentinel://)"
            raise ValueError(
                f"Sentinel URL {shown!r} has an unknown option {name!r}: expected "
                f"{', '.join(allowed)}{extra}"
            )
        if name == "db":
            if not value.isdigit():
                raise ValueError(
                    f"Sentinel URL {shown!r} has an invalid database {value!r}: "
                    "expected a number (?db=0)"
                )
            master["db"] = int(value)
        elif name.startswith("sentinel_"):
            sentinel[name.removeprefix("sentinel_")] = value
        else:
            shared[name] = _tls_option(name, value, f"Sentinel URL {shown!r}")
    _check_files(parse_qsl(parts.query), shown)
    if parts.username:
        master["username"] = unquote(parts.username)
    if parts.password:
        master["password"] = unquote(parts.password)
    return SentinelTarget(sentinels, service, {**master, **shared}, {**sentinel, **shared})


def _tls_option(name: str, value: str, where: str) -> object:
    """The value of one ``ssl_*`` option of a URL's query, checked."""
    if name == "ssl_check_hostname":
        if value.lower() not in (*_TRUE, *_FALSE):
            raise ValueError(f"{where}: ssl_check_hostname must be true or false, got {value!r}")
        return value.lower() in _TRUE
    if name == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
        raise ValueError(
            f"{where}: ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, got {value!r}"
        )
    return value


def _servers(
    url: str, schemes: tuple[str, ...], kind: str, what: str, default_port: int, rest: str
) -> tuple[str, SplitResult, tuple[tuple[str, int], ...]]:
    """The scheme, the parts and the ``host:port`` list of a URL naming several servers
    (``kind`` Sentinel or Cluster, each server a ``what``), checked."""
    shown = redacted(url)
    scheme, separator, _ = url.partition("://")
    scheme = scheme.lower()
    form = f"{schemes[0]}://host:port[,host:port...]{rest}"
    if scheme not in schemes or not separator:
        raise ValueError(f"not a {kind} URL: {shown!r}: expected {form}")
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        raise ValueError(f"{kind} URL {shown!r} names no {what}: expected {form}")
    where = f"{kind} URL {shown!r}"
    return (
        scheme,
        parts,
        tuple(_address(item, where, what, default_port) for item in hosts.split(",")),
    )


def _address(item: str, where: str, what: str, default_port: int) -> tuple[str, int]:
    """One ``host[:port]`` of a URL naming several servers."""
    bad_port = f"{where} has an invalid port in {item!r}: expected a number from 1 to 65535"
    try:
        parts = urlsplit(f"//{item}")
        port = parts.port
    except ValueError:
        raise ValueError(bad_port) from None
    if not parts.hostname:
        raise ValueError(
            f"{where} has an empty {what} address in {item!r}: "
            "expected host:port, separated by commas"
        )
    if port == 0:
        raise ValueError(bad_port)
    return parts.hostname, default_port if port is None else port


#: The schemes of a URL naming some nodes of a Redis Cluster.
CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")
_REDIS_PORT: Final = 6379


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """What a ``redis+cluster://`` URL names: some nodes of the cluster (the others are
    found through them) and the options of every connection."""

    nodes: tuple[tuple[str, int], ...]
    options: dict[str, Any] = field(default_factory=dict)


def parse_cluster_url(url: str) -> ClusterTarget:
    """Read ``redis+cluster://[user:password@]host:port[,host:port...][/]`` (``rediss+cluster://``
    for TLS, whose query may hold ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_cert_reqs`` and ``ssl_check_hostname``), or raise a ``ValueError`` naming what is
    wrong. A cluster has one database: the URL names none."""
    shown = redacted(url)
    where = f"Cluster URL {shown!r}"
    scheme, parts, nodes = _servers(url, CLUSTER_SCHEMES, "Cluster", "node", _REDIS_PORT, "")
    if parts.path.strip("/"):
        raise ValueError(
            f"{where} names a database ({parts.path.strip('/')!r}): a Redis Cluster has only "
            "database 0, so the URL ends after the nodes"
        )
    tls = scheme == "rediss+cluster"
    options: dict[str, Any] = {"ssl": True} if tls else {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if not tls or name not in (*_TLS_OPTIONS, "ssl_check_hostname"):
            expected = ", ".join((*_TLS_OPTIONS, "ssl_check_hostname")) if tls else "none"
            extra = "" if tls else " (the ssl_* options need rediss+cluster://)"
            raise ValueError(f"{where} has an unknown option {name!r}: expected {expected}{extra}")
        options[name] = _tls_option(name, value, where)
    _check_files(parse_qsl(parts.query), shown)
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    return ClusterTarget(nodes, options)


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
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
        return
    if scheme in CLUSTER_SCHEMES:
        parse_cluster_url(url)
        return
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"not a Redis URL: {shown!r}: the scheme must be redis://, rediss://, unix://, "
            "redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://"
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
    _check_files(parse_qsl(parts.query), shown)


def _check_files(query: list[tuple[str, str]], shown: str) -> None:
    """The certificate and key files a URL names exist (else the error would come at the
    first connection, as an OS error number)."""
    for name, value in query:
        if name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile") and not os.path.isfile(value):
            raise ValueError(f"Redis URL {shown!r}: {name}={value!r} is not a file")


def _in_words(exc: BaseException, url: str, where: str | None = None) -> str:
    """Why a connection to Redis failed, in the user's words, on one line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = text.lower()
    where = where or f"Redis at {redacted(url)}"
    signs = ("noauth", "wrongpass", "authentication", "password", "auth ")
    if isinstance(exc, AuthenticationError) or any(sign in lowered for sign in signs):
        if _password(url) is None:
            return (
                f"{where} requires a password: put it in the URL "
                "(redis://:password@host:port/0, or redis://user:password@...)"
            )
        return f"{where} refused the user name or password in the URL"
    if "certificate verify failed" in lowered:
        reason = text.partition("certificate verify failed:")[2].partition("(_ssl")[0].strip(" .")
        if "mismatch" in lowered or "not valid for" in lowered:
            return f"{where}: its TLS certificate does not name the host in the URL ({reason})"
        return (
            f"{where}: its TLS certificate is not trusted ({reason}): name the CA that signed "
            "it with ?ssl_ca_certs=/path/ca.pem"
        )
    if any(sign in lowered for sign in _TLS_MISMATCH):
        return f"{where}: the TLS handshake failed ({text}): does that port speak TLS?"
    if "protocol error" in lowered or type(exc).__name__ == "InvalidResponse":
        return (
            f"{where} did not answer in the Redis protocol: is another service (HTTP?) "
            "listening on that port?"
        )
    if any(sign in lowered for sign in ("connection refused", "connect call failed", "error 111")):
        return f"cannot reach {where}: connection refused (is redis-server running there?)"
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        # A TLS greeting sent to a server without TLS gets no answer at all.
        tls = " (a server without TLS? redis://)" if url.lower().startswith("rediss") else ""
        return f"cannot reach {where}: no answer in time{tls}"
    if "closed by server" in lowered or "connection reset" in lowered:
        tls = "" if url.lower().startswith("rediss") else " (one that takes TLS only? rediss://)"
        return f"{where} closed the connection at once: is it a Redis server{tls}?"
    if isinstance(exc, RedisConnectionError | OSError):
        return f"cannot reach {where}: {text}"
    return f"cannot use {where}: {text}"


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
        client = self._new_client(socket_timeout=bound, max_connections=8)
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
        return _in_words(exc, self.url, self.address)

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
                self._note_primary(pubsub, host)
                host.subscribed()

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
            "retry": Retry(NoBackoff(), 0),
            **target.sentinel,
        }
        self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=sentinel_options
        )
        self._next_poll = self._next_publish_poll = 0.0

    @property
    def address(self) -> str:
        return f"Redis service {self.target.service!r} via sentinels {redacted(self.url)}"

    def _in_words(self, exc: BaseException) -> str:
        if not isinstance(exc, MasterNotFoundError):
            return super()._in_words(exc)
        # redis-py lists the sentinels it could not ask after " : ", one " - " each.
        unreachable = str(exc).partition(" : ")[2].count(" - ")
        if unreachable >= len(self.target.sentinels):
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
        return await super().store_and_publish(events)

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


class ClusterBackend(RedisBackend):
    """The Redis engine on a Redis Cluster: values spread over the slots, one subscription.

    * **Writes go to each key's master.** A batch is split by the master owning each key's
      slot (as the cluster client last saw the slots) and sent as one pipeline per master,
      all at once; with ``min_replicas`` each pipeline holding a confirmed advance ends with
      ``WAIT``, which therefore counts that key's master's replicas. Checks and cancels go
      to any master. A reply saying the slot moved (``MOVED``, ``ASK``), or that the
      cluster is down or a node is read-only (a failover under way), makes the batch a
      network error: the slots are read again and the batch is sent again (harmless:
      advances merge by max).
    * **Reads** group the keys by slot (``MGET`` per slot, redis-py's ``mget_nonatomic``),
      following redirections.
    * **One subscription per process**, on one node: classic ``PUBLISH`` reaches every
      node of a cluster, masters and replicas alike, so any node will do. When that node
      dies the subscription moves to another node the cluster client knows, which is
      logged and counted (``failovers``), and the resubscription re-reads every watched
      key, as after any reconnection.
    """

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.target = parse_cluster_url(url)
        self._nodes: dict[str, aioredis.Redis] = {}  # host:port -> a client of that node
        self._stale = False  # the slots moved since the cluster client last read them

    @property
    def address(self) -> str:
        return f"Redis Cluster at {redacted(self.url)}"

    def _node_options(self) -> dict[str, Any]:
        return {
            "socket_connect_timeout": self._timeout,
            "decode_responses": False,
            **self.target.options,
        }

    def _cluster(self) -> RedisCluster:
        client = self._client
        assert isinstance(client, RedisCluster)
        return client

    async def connect(self, host: BackendHost | None) -> None:
        bound = self._timeout + (self._replica_timeout if self._min_replicas else 0.0)
        client = RedisCluster(
            startup_nodes=[ClusterNode(name, port) for name, port in self.target.nodes],
            socket_timeout=bound,
            max_connections=8,
            **self._node_options(),
        )
        self._client = client  # type: ignore[assignment]
        try:
            await client.initialize()
            if host is not None:
                await self._subscribe_somewhere(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # redis-py's errors, in the user's words, on one line
            raise FanoutUnavailable(self._in_words(exc)) from None

    def _node(self, node: ClusterNode) -> aioredis.Redis:
        """A client of one node (kept): one pipeline on it is one connection, which ``WAIT``
        needs."""
        client = self._nodes.get(node.name)
        if client is None:
            bound = self._timeout + (self._replica_timeout if self._min_replicas else 0.0)
            client = self._nodes[node.name] = aioredis.Redis(
                host=node.host,
                port=int(node.port),
                socket_timeout=bound,
                max_connections=8,
                **self._node_options(),
            )
        return client

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        cluster = self._cluster()
        if self._stale:
            await cluster.nodes_manager.initialize()
            self._stale = False
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        anywhere: ClusterNode | None = None
        for i, event in enumerate(events):
            if event.kind == ADVANCE:
                node = cluster.get_node_from_key(self._value_prefix + event.key)
            else:
                anywhere = anywhere or cluster.get_default_node() or cluster.get_random_node()
                node = anywhere
            assert node is not None
            groups.setdefault(node.name, (node, []))[1].append(i)
        # The masters answer side by side: one batch costs one round trip, not one per master.
        try:
            answers = await asyncio.gather(
                *(
                    self._send(self._node(node), [events[i] for i in indexes])
                    for node, indexes in groups.values()
                )
            )
        except self.network_errors:
            self._stale = True  # a node died: where are its slots now?
            raise
        results: list[BaseException | None] = [None] * len(events)
        for (_, indexes), answer in zip(groups.values(), answers, strict=True):
            for i, result in zip(indexes, answer, strict=True):
                if isinstance(result, _MOVING):
                    self._stale = True
                    raise RedisConnectionError(f"the cluster is changing: {result}")
                results[i] = result
        return results

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        prefix = self._value_prefix
        raw = await self._cluster().mget_nonatomic([prefix + key for key in keys])
        return self._numbers(keys, raw, host)

    async def _subscribe_somewhere(self, current: str | None) -> None:
        """Subscribe on the first node that answers, in the URL's order, then the others the
        cluster named; the one it was on (``current``) last."""
        names = [f"{name}:{port}" for name, port in self.target.nodes]  # the URL's order
        names += [node.name for node in self._cluster().get_nodes()]
        ordered = [name for name in dict.fromkeys(names) if name != current]
        if current is not None:
            ordered.append(current)
        failure: BaseException | None = None
        for name in ordered:
            where, _, port = name.rpartition(":")
            client = aioredis.Redis(
                host=where, port=int(port), health_check_interval=max(1, round(self._health)),
                socket_timeout=self._timeout, **self._node_options(),
            )  # fmt: skip
            pubsub = client.pubsub()
            try:
                async with asyncio.timeout(self._timeout):
                    await pubsub.subscribe(self.channel)
            except asyncio.CancelledError:
                await _quietly_close(pubsub, client)
                raise
            except Exception as exc:  # that node is down too: the next one
                failure = exc
                await _quietly_close(pubsub, client)
                continue
            old_pubsub, old_client = self._pubsub, self._sub_client
            self._pubsub, self._sub_client = pubsub, client
            await _quietly_close(old_pubsub, old_client)
            if current is not None:
                _log.info("fanout_subscription_moving", address=self.address, old=current, new=name)
            return
        raise RedisConnectionError(f"no node of the cluster took the subscription: {failure}")

    async def _follow_primary(self, pubsub: PubSub) -> None:
        # A dropped subscription is not taken up again on the same node (it may be dead):
        # the next node that answers takes it.
        connection = pubsub.connection
        if connection is not None and connection.is_connected:
            return
        current = None if connection is None else f"{connection.host}:{connection.port}"
        await self._subscribe_somewhere(current or self._primary)

    async def close(self) -> None:
        nodes, self._nodes = list(self._nodes.values()), {}
        for one in nodes:
            with contextlib.suppress(Exception):
                await one.aclose()
        await super().close()


async def _quietly_close(pubsub: PubSub | None, client: aioredis.Redis | None) -> None:
    if pubsub is not None:
        with contextlib.suppress(Exception):
            await pubsub.aclose()  # type: ignore[no-untyped-call]
    if client is not None:
        with contextlib.suppress(Exception):
            await client.aclose()


class RedisFanout(Fanout):
    """Fan-out through Redis pub/sub, with the latest advanced values stored in Redis.

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS, or
            ``redis+sentinel://[:password@]host:port[,host:port...]/service[?db=0]``
            (``rediss+sentinel://`` for TLS) to follow a Sentinel-managed master, or
            ``redis+cluster://[:password@]host:port[,host:port...]`` (``rediss+cluster://``
            for TLS) naming some nodes of a Redis Cluster;
            ``None`` reads ``$PURGATORY_AIO_REDIS_URL``. Checked at once (scheme,
            hosts, ports, database, service): a ``ValueError`` says what is wrong.
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
        min_replicas: replicas that must hold a confirmed advance before
            :meth:`~Fanout.advance_confirmed` returns (Redis ``WAIT``); 0, the
            default, confirms once the master stored it. Fewer acknowledgements
            within ``replica_timeout`` fail the confirmation with
            :class:`FanoutUnavailable` (the value stays stored on the master).
        replica_timeout: seconds ``WAIT`` waits for the replicas.
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
        min_replicas: int = 0,
        replica_timeout: float = 0.5,
    ) -> None:
        resolved = resolve_url(url)
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty str, got {prefix!r}")
        scheme = urlsplit(resolved).scheme.lower()
        engine: type[RedisBackend] = (
            SentinelBackend
            if scheme in SENTINEL_SCHEMES
            else ClusterBackend
            if scheme in CLUSTER_SCHEMES
            else RedisBackend
        )
        backend = engine(
            resolved,
            prefix=prefix,
            value_ttl=check_positive_seconds(value_ttl, "value_ttl"),
            timeout=check_positive_seconds(connect_timeout, "connect_timeout"),
            resync_interval=check_positive_seconds(resync_interval, "resync_interval"),
            min_replicas=check_positive_int(min_replicas, "min_replicas", minimum=0),
            replica_timeout=check_positive_seconds(replica_timeout, "replica_timeout"),
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


__all__ = [
    "CLUSTER_SCHEMES",
    "ENV_URL",
    "SENTINEL_SCHEMES",
    "ClusterBackend",
    "ClusterTarget",
    "RedisBackend",
    "RedisFanout",
    "SentinelBackend",
    "SentinelTarget",
    "check_url",
    "parse_cluster_url",
    "parse_sentinel_url",
    "redacted",
    "resolve_url",
]
