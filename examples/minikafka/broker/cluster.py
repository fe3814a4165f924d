"""The broker side of a small Kafka cluster, in one process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType

from purgatory_aio import Clock, EventSink, LoopClock, Purgatory, PurgatoryClosed, Timer

from ..errors import ErrorCode
from ..protocol import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    FetchRequest,
    FetchResponse,
    HeartbeatResponse,
    JoinGroupResponse,
    ProduceRequest,
    ProduceResponse,
    TopicMetadata,
)
from ..records import TopicPartition
from .config import BrokerConfig
from .controller import Controller
from .group_coordinator import GroupCoordinator
from .partition import Partition
from .replica_fetcher import ReplicaFetcher
from .replica_manager import ReplicaManager

#: Names of the cluster's purgatories, as they appear in the event log.
PURGATORY_NAMES = ("produce", "fetch", "join", "heartbeat", "create_topics")


class Cluster:
    """``brokers`` Kafka brokers sharing one event loop, serving plain request objects.

    Each partition has a leader and followers on distinct brokers; followers copy
    the leader log with long-poll fetches (unless ``replicate=False``, for tests
    that drive follower fetches by hand). Every wait is a delayed operation in
    one of five purgatories: ``produce`` (``acks=all``), ``fetch`` (long polls of
    consumers and followers), ``join`` (rebalance barriers), ``heartbeat``
    (session expiry) and ``create_topics`` (waiting for leaders).

    The request methods take and return the dataclasses of
    :mod:`minikafka.protocol`; errors come back as codes, never as exceptions.
    After :meth:`close` they raise :class:`~purgatory_aio.PurgatoryClosed`.

    Example:
        >>> async with Cluster(BrokerConfig(brokers=3)) as cluster:     # doctest: +SKIP
        ...     await cluster.create_topics(CreateTopicsRequest({"orders": TopicSpec(6, 3)}))
        ...     await cluster.produce(ProduceRequest({tp: [Record(b"hi")]}, acks=-1))

    Args:
        config: broker settings.
        clock: the time source of every purgatory, timer and follower (real
            monotonic time by default; a ``ManualClock`` for virtual time).
        event_sink: receives one record per settled operation of every purgatory.
        replicate: run follower fetchers.
        follower_latency: seconds each follower fetch response takes to arrive.
    """

    def __init__(
        self,
        config: BrokerConfig | None = None,
        *,
        clock: Clock | None = None,
        event_sink: EventSink | None = None,
        replicate: bool = True,
        follower_latency: Callable[[], float] | None = None,
    ) -> None:
        self.config = config = config or BrokerConfig()
        self.clock: Clock = clock if clock is not None else LoopClock()
        self._replicate = replicate
        self._follower_latency = follower_latency
        self.timer = Timer(tick=config.tick, wheel_size=config.wheel_size, clock=self.clock)
        self.purgatories: dict[str, Purgatory] = {
            name: Purgatory(
                name,
                tick=config.tick,
                wheel_size=config.wheel_size,
                clock=self.clock,
                event_sink=event_sink,
            )
            for name in PURGATORY_NAMES
        }
        p = self.purgatories
        self.replicas = ReplicaManager(config, self.clock, self.timer, p["produce"], p["fetch"])
        self.coordinator = GroupCoordinator(
            config, self.clock, self.replicas, p["join"], p["heartbeat"]
        )
        self.controller = Controller(
            config, self.clock, self.timer, self.replicas, p["create_topics"]
        )
        self._fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        self._fetcher_tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.replicas.on_leader_elected(self._follow)

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop replication and settle every waiting request (each gets its response)."""
        if self._closed:
            return
        self._closed = True
        for task in self._fetcher_tasks:
            task.cancel()
        await asyncio.gather(*self._fetcher_tasks, return_exceptions=True)
        self.replicas.close()
        self.coordinator.close()
        for purgatory in self.purgatories.values():
            await purgatory.shutdown()
        self.timer.close()

    # -- requests ------------------------------------------------------------------------------

    async def create_topics(self, request: CreateTopicsRequest) -> CreateTopicsResponse:
        self._check_open()
        return await self.controller.create_topics(request)

    async def produce(self, request: ProduceRequest) -> ProduceResponse:
        self._check_open()
        return await self.replicas.produce(request)

    async def submit_produce(
        self, request: ProduceRequest, respond: Callable[[ProduceResponse], None]
    ) -> None:
        self._check_open()
        await self.replicas.submit_produce(request, respond)

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        self._check_open()
        return await self.replicas.fetch(request)

    async def join_group(
        self,
        group_id: str,
        member_id: str = "",
        *,
        client_id: str = "consumer",
        topics: Iterable[str] = (),
        session_timeout: float = 10.0,
        rebalance_timeout: float = 30.0,
    ) -> JoinGroupResponse:
        self._check_open()
        return await self.coordinator.join_group(
            group_id,
            member_id,
            client_id=client_id,
            topics=topics,
            session_timeout=session_timeout,
            rebalance_timeout=rebalance_timeout,
        )

    async def heartbeat(self, group_id: str, member_id: str, generation: int) -> HeartbeatResponse:
        self._check_open()
        return await self.coordinator.heartbeat(group_id, member_id, generation)

    async def leave_group(self, group_id: str, member_id: str) -> ErrorCode:
        self._check_open()
        return await self.coordinator.leave_group(group_id, member_id)

    def commit_offsets(
        self, group_id: str, member_id: str, generation: int, offsets: Mapping[TopicPartition, int]
    ) -> ErrorCode:
        self._check_open()
        return self.coordinator.commit_offsets(group_id, member_id, generation, offsets)

    def committed(self, group_id: str, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.coordinator.committed(group_id, tps)

    def metadata(self, topic: str) -> TopicMetadata | None:
        return self.replicas.metadata(topic)

    # -- introspection -------------------------------------------------------------------------

    def partition(self, tp: TopicPartition) -> Partition:
        partition = self.replicas.partition(tp)
        if partition is None:
            raise KeyError(f"no partition {tp}")
        return partition

    def fetcher(self, broker_id: int, leader_id: int) -> ReplicaFetcher | None:
        """The fetcher copying ``leader_id``'s partitions to ``broker_id``, once one exists."""
        return self._fetchers.get((broker_id, leader_id))

    @property
    def fetchers(self) -> list[ReplicaFetcher]:
        return list(self._fetchers.values())

    # -- internals -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PurgatoryClosed("the cluster is closed")

    def _follow(self, partition: Partition) -> None:
        """A leader was elected: have each follower broker start fetching the partition."""
        if not self._replicate or self._closed:
            return
        leader = partition.leader
        assert leader is not None
        end = partition.log_end_offset
        moved: dict[int, int] = {}
        for (broker, source), old in self._fetchers.items():
            if source != leader:
                reached = old.remove_partition(partition.tp)
                if reached is not None:
                    # A follower's copy ends at most where the new leader's does.
                    moved[broker] = min(reached, end)
        for broker in partition.replicas:
            if broker == leader:
                continue
            fetcher = self._fetchers.get((broker, leader))
            if fetcher is None:
                fetcher = ReplicaFetcher(broker, leader, self.replicas, self.clock, self.config)
                if self._follower_latency is not None:
                    fetcher.latency = self._follower_latency
                self._fetchers[broker, leader] = fetcher
                self._fetcher_tasks.append(
                    asyncio.get_running_loop().create_task(
                        fetcher.run(), name=f"replica-fetcher-{broker}-from-{leader}"
                    )
                )
            state = partition.follower(broker)
            fetcher.add_partition(
                partition.tp, moved.get(broker, state.log_end if state is not None else 0)
            )
