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

from urllib.parse import urlsplit

try:
    import redis.asyncio  # noqa: F401 - the engines' modules import from it
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.fanout.RedisFanout needs redis-py: install the extra: "
        "pip install 'purgatory-aio[redis]'"
    ) from exc

from .._purgatory import Purgatory
from .._validation import check_positive_int, check_positive_seconds
from ._fanout import Fanout
from ._redis_backend import RedisBackend
from ._redis_cluster import ClusterBackend
from ._redis_sentinel import SentinelBackend
from ._redis_urls import (
    CLUSTER_SCHEMES,
    ENV_URL,
    SENTINEL_SCHEMES,
    ClusterTarget,
    SentinelTarget,
    check_url,
    parse_cluster_url,
    parse_sentinel_url,
    resolve_url,
)
from ._urls import redacted


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
