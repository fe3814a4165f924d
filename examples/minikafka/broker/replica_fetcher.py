"""The follower side of replication: long-poll fetches from a leader."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import structlog

from purgatory_aio import Clock

from ..errors import ErrorCode
from ..protocol import FetchRequest, no_latency
from ..records import TopicPartition
from .config import BrokerConfig
from .replica_manager import ReplicaManager

_log = structlog.get_logger("minikafka.replica_fetcher")


class ReplicaFetcher:
    """Copies one leader's partitions to one follower broker.

    Like Kafka's replica fetcher thread, one fetcher serves every partition a
    follower replicates from a given leader, with one outstanding fetch at a
    time. The fetch offset of each partition is the follower's log end, which
    is how the leader learns what the follower holds.

    A fetcher can be stalled (a GC pause, a stuck disk, a dead broker): it stops
    fetching until :meth:`resume` or the stall's end.

    Args:
        broker_id: the follower broker.
        leader_id: the broker it fetches from.
        replicas: the leader's replica manager.
        clock: the cluster's clock.
        config: broker settings (fetch wait and sizes).
        latency: seconds a response takes to travel and be written, drawn per fetch.
    """

    def __init__(
        self,
        broker_id: int,
        leader_id: int,
        replicas: ReplicaManager,
        clock: Clock,
        config: BrokerConfig,
        latency: Callable[[], float] = no_latency,
    ) -> None:
        self.broker_id = broker_id
        self.leader_id = leader_id
        self._replicas = replicas
        self._clock = clock
        self._config = config
        self.latency = latency
        #: Log end offset of each partition on the follower.
        self.offsets: dict[TopicPartition, int] = {}
        self._work = asyncio.Event()
        self._stalled_until = -math.inf
        #: Fetch responses received so far.
        self.fetches = 0

    def add_partition(self, tp: TopicPartition, offset: int = 0) -> None:
        self.offsets.setdefault(tp, offset)
        self._work.set()

    def remove_partition(self, tp: TopicPartition) -> int | None:
        """Stop copying ``tp`` (its leader moved); returns the offset reached, if any."""
        return self.offsets.pop(tp, None)

    @property
    def stalled(self) -> bool:
        return self._clock.time() < self._stalled_until

    def stall(self, until: float = math.inf) -> None:
        """Stop fetching until clock time ``until`` (for ever by default)."""
        self._stalled_until = until
        _log.info(
            "replica_fetcher_stalled", broker=self.broker_id, leader=self.leader_id, until=until
        )

    def resume(self) -> None:
        self._stalled_until = -math.inf
        self._work.set()

    async def run(self) -> None:
        """Fetch until cancelled."""
        config = self._config
        while True:
            await self._wait_until_runnable()
            request = FetchRequest(
                dict(self.offsets),
                max_wait=config.replica_fetch_wait_max,
                min_bytes=config.replica_fetch_min_bytes,
                max_bytes=config.replica_fetch_max_bytes,
                replica_id=self.broker_id,
            )
            response = await self._replicas.fetch(request)
            delay = self.latency()
            if delay > 0:
                await self._clock.sleep(delay)
            await self._wait_until_runnable()
            self.fetches += 1
            offsets = self.offsets
            for tp, result in response.partitions.items():
                if result.error is ErrorCode.NONE and offsets.get(tp) == result.fetch_offset:
                    offsets[tp] = result.fetch_offset + len(result.records)

    async def _wait_until_runnable(self) -> None:
        while True:
            now = self._clock.time()
            if now < self._stalled_until:
                if math.isinf(self._stalled_until):
                    self._work.clear()
                    await self._work.wait()
                else:
                    await self._clock.sleep(self._stalled_until - now)
            elif not self.offsets:
                self._work.clear()
                await self._work.wait()
            else:
                return
