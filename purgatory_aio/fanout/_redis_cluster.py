"""The Redis engine on a Redis Cluster."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    ReadOnlyError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .._logging import get_logger
from ._base import (
    ADVANCE,
    BackendHost,
    Event,
    FanoutUnavailable,
)
from ._redis_backend import RedisBackend, one_try
from ._redis_urls import parse_cluster_url
from ._urls import redacted

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub


_log = get_logger("purgatory_aio.fanout.redis")


# A Cluster's answers meaning "not here, or not now": the slot moved or is moving, or a
# failover is under way; each with its name in the Cluster's answers, for the logs.
_MOVING_WORDS: Final = (
    (MovedError, "MOVED"),
    (AskError, "ASK"),
    (TryAgainError, "TRYAGAIN"),
    (ClusterDownError, "CLUSTERDOWN"),
    (ReadOnlyError, "READONLY"),
    (MasterDownError, "MASTERDOWN"),
)
_MOVING: Final = tuple(kind for kind, _ in _MOVING_WORDS)

#: Seconds between the probes of the subscription's node, and the probe's message.
_PROBE_EVERY: Final = 1.0
_PROBE: Final = "purgatory-aio-probe"


class ClusterBackend(RedisBackend):
    """The Redis engine on a Redis Cluster: values spread over the slots, one subscription.

    * **Writes go to each key's master.** A batch is split by the master owning each key's
      slot (as the cluster client last saw the slots) and sent as one pipeline per master,
      all at once; with ``min_replicas`` each pipeline holding a confirmed advance ends with
      ``WAIT``, which therefore counts that key's master's replicas. Checks and cancels go
      to any master. A reply saying the slot moved (``MOVED``, ``ASK``), or that the
      cluster is down or a node is read-only (a failover under way), makes the batch a
      network error, logged with the Cluster's word for it (``MOVED``, ``ASK``...): the
      slots are read again and the batch is sent again (harmless: advances merge by max).
      A batch to a slot still migrating is sent again until the move is finished.
    * **Reads** group the keys by slot (``MGET`` per slot, redis-py's ``mget_nonatomic``),
      following redirections; a read that fails has the slots read again before the next.
    * **One subscription per process**, on one node: classic ``PUBLISH`` reaches every
      node of a cluster, masters and replicas alike, so any node will do. When that node
      dies, or leaves a ``PING`` on the subscription's connection (one a second)
      unanswered for ``connect_timeout`` (frozen, partitioned: logged as
      ``fanout_subscription_unanswered``), the subscription moves to another node the
      cluster client knows, which is logged and counted (``failovers``), and the
      resubscription re-reads every watched key, as after any reconnection.
    """

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.target = parse_cluster_url(url)
        self._nodes: dict[str, aioredis.Redis] = {}  # host:port -> a client of that node
        self._stale = False  # the slots moved since the cluster client last read them
        self._next_probe = 0.0
        self._probe_sent: float | None = None  # when the unanswered probe went out
        self._lost = False  # the subscription failed: another node takes it
        self._gone: set[str] = set()  # masters that left the slots' map, not yet replaced

    @property
    def address(self) -> str:
        return f"Redis Cluster at {redacted(self.url)}"

    def _node_options(self, *, retry: bool = False) -> dict[str, Any]:
        """The options of a connection to a node; ``retry``: let redis-py try again.

        The clients of one node do not: the fan-out sends a failed batch again with its own
        backoff, after reading the slots again, and moves a dropped subscription. redis-py's
        default (3 more tries, each reconnecting) held a batch to a frozen master for 15.7 s
        instead of the 1 s of its timeout, and every confirmation of that batch with it,
        whatever their master. The cluster client keeps its tries: they follow MOVED and ASK.
        """
        return {
            "socket_connect_timeout": self._timeout,
            "decode_responses": False,
            **({} if retry else {"retry": one_try()}),
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
            **self._node_options(retry=True),
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

    async def _read_slots_if_stale(self) -> None:
        if self._stale:
            cluster = self._cluster()
            before = {node.name for node in cluster.get_primaries()}
            await cluster.nodes_manager.initialize()
            self._stale = False
            self._note_masters(before, {node.name for node in cluster.get_primaries()})

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        cluster = self._cluster()
        await self._read_slots_if_stale()
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
                    word = next(word for kind, word in _MOVING_WORDS if isinstance(result, kind))
                    raise RedisConnectionError(f"the cluster is changing: {word} {result}")
                results[i] = result
        return results

    def _note_masters(self, before: set[str], after: set[str]) -> None:
        """A master gone and another in its place (a replica promoted): the writes of its
        slots now reach another server, a switch for a member that only publishes."""
        # A master may vanish from the slots' map a reading before its replica appears.
        self._gone = (self._gone | (before - after)) - after
        new = sorted(after - before)
        if self._gone and new:
            self._note_switch(",".join(sorted(self._gone)), ",".join(new))
            self._gone = set()

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        prefix = self._value_prefix
        await self._read_slots_if_stale()
        try:
            raw = await self._cluster().mget_nonatomic([prefix + key for key in keys])
        except BaseException:
            # A node died, or froze and the fan-out's timeout cancelled the read before the
            # cluster client gave up on it: read the slots again before the next try, or every
            # try would wait on the frozen node until it thaws.
            self._stale = True
            raise
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
            self._pubsub, self._sub_client, self._lost = pubsub, client, False
            await _quietly_close(old_pubsub, old_client)
            if current is not None:
                _log.info("fanout_subscription_moving", address=self.address, old=current, new=name)
            return
        raise RedisConnectionError(f"no node of the cluster took the subscription: {failure}")

    async def _follow_primary(self, pubsub: PubSub) -> None:
        # A dropped subscription is not taken up again on the same node (it may be dead):
        # the next node that answers takes it. Nor is one on a node that stopped answering
        # (frozen, partitioned): its connection may stay open for ever, delivering nothing.
        connection = pubsub.connection
        if not self._lost and connection is not None and connection.is_connected:
            if self._probe_sent is None and time.monotonic() < self._next_probe:
                # Called once per message received: with no probe due, no coroutine to await
                # (185 against 283 ns per call, measured alone on asyncio).
                return
            if await self._answering(pubsub):
                return
            with contextlib.suppress(Exception):
                await connection.disconnect()
        self._probe_sent = None
        current = None if connection is None else f"{connection.host}:{connection.port}"
        await self._subscribe_somewhere(current or self._primary)

    async def _answering(self, pubsub: PubSub) -> bool:
        """Whether the subscription's node answered the last probe (a ``PING`` on the
        subscription's connection, once a second) within ``connect_timeout``."""
        now = time.monotonic()
        if self._probe_sent is not None:
            if now - self._probe_sent <= self._timeout:
                return True
            connection = pubsub.connection
            _log.warning(
                "fanout_subscription_unanswered",
                address=self.address,
                node=None if connection is None else f"{connection.host}:{connection.port}",
                waited_s=round(now - self._probe_sent, 3),
            )
            return False
        if now >= self._next_probe:
            self._next_probe = now + _PROBE_EVERY
            self._probe_sent = now
            try:
                async with asyncio.timeout(self._timeout):
                    await pubsub.ping(_PROBE)
            except asyncio.CancelledError:
                raise
            except Exception:
                return False
        return True

    async def _subscription_failed(self, pubsub: PubSub, exc: BaseException) -> None:
        # redis-py would take it up again on the same node, and a node that stopped answering
        # (frozen, cut off) still accepts connections: another node takes it.
        await super()._subscription_failed(pubsub, exc)
        self._lost = True

    def _answered(self, data: object) -> None:
        if data == _PROBE.encode():
            self._probe_sent = None

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


__all__ = ["ClusterBackend"]
