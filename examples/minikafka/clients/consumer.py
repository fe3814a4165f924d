"""The consumer client: group membership, long-poll fetches and offset commits."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import structlog

from purgatory_aio import Clock

from ..broker.cluster import Cluster
from ..errors import ErrorCode, KafkaError
from ..protocol import FetchRequest, no_latency
from ..records import Record, TopicPartition
from .config import ConsumerConfig

_log = structlog.get_logger("minikafka.consumer")


class ConsumerRecord(NamedTuple):
    tp: TopicPartition
    offset: int
    record: Record


class ConsumerStats:
    """Counters of one consumer."""

    __slots__ = ("bytes", "early", "fetches", "joins", "records", "waits")

    def __init__(self) -> None:
        #: Fetch requests answered.
        self.fetches = 0
        #: Fetches answered before ``fetch_max_wait`` (enough bytes, or at once).
        self.early = 0
        #: Seconds each fetch was held by the broker.
        self.waits: list[float] = []
        self.records = 0
        self.bytes = 0
        #: Completed joins (generations this consumer took part in).
        self.joins = 0


class Consumer:
    """A member of a consumer group that reads its assigned partitions.

    :meth:`poll` does what KafkaConsumer's poll loop does: joins the group when
    needed (waiting in the coordinator's join barrier), heartbeats on schedule,
    commits positions every ``auto_commit_interval`` and before rejoining, and
    sends one long-poll fetch for all assigned partitions, which the broker holds
    in its fetch purgatory until ``fetch_min_bytes`` are there or
    ``fetch_max_wait`` has passed.

    A consumer that stops calling :meth:`poll` stops heartbeating too: after
    ``session_timeout`` the coordinator expels it and rebalances the group, and
    its next poll rejoins as a new member.

    Args:
        cluster: where to read.
        config: consumer settings.
        response_latency: seconds a fetch response takes to arrive, drawn per fetch.
    """

    def __init__(
        self,
        cluster: Cluster,
        config: ConsumerConfig,
        *,
        response_latency: Callable[[], float] = no_latency,
    ) -> None:
        self.config = config
        self._cluster = cluster
        self._clock: Clock = cluster.clock
        self.response_latency = response_latency
        self.member_id = ""
        self.generation = -1
        self.assignment: tuple[TopicPartition, ...] = ()
        #: Next offset to read, per assigned partition.
        self.positions: dict[TopicPartition, int] = {}
        self._needs_join = True
        self._next_heartbeat = 0.0
        self._next_commit = 0.0
        self.stats = ConsumerStats()

    async def poll(self) -> list[ConsumerRecord]:
        """Return the next records (possibly none after ``fetch_max_wait``)."""
        clock = self._clock
        config = self.config
        if self._needs_join:
            await self._join()
        if clock.time() >= self._next_heartbeat:
            await self._heartbeat()
            if self._needs_join:
                await self._join()
        if clock.time() >= self._next_commit:
            self.commit()
        if not self.positions:
            await clock.sleep(max(0.0, self._next_heartbeat - clock.time()))
            return []
        request = FetchRequest(
            dict(self.positions),
            max_wait=config.fetch_max_wait,
            min_bytes=config.fetch_min_bytes,
            max_bytes=config.fetch_max_bytes,
            partition_max_bytes=config.max_partition_fetch_bytes,
        )
        started = clock.time()
        response = await self._cluster.fetch(request)
        waited = clock.time() - started
        stats = self.stats
        stats.fetches += 1
        stats.waits.append(waited)
        if waited < config.fetch_max_wait:
            stats.early += 1
        delay = self.response_latency()
        if delay > 0:
            await clock.sleep(delay)
        records: list[ConsumerRecord] = []
        positions = self.positions
        for tp, result in response.partitions.items():
            if positions.get(tp) != result.fetch_offset:
                continue  # reassigned while the fetch was out
            if result.error is ErrorCode.NONE:
                offset = result.fetch_offset
                for record in result.records:
                    records.append(ConsumerRecord(tp, offset, record))
                    stats.bytes += record.size
                    offset += 1
                positions[tp] = offset
            elif result.error is ErrorCode.OFFSET_OUT_OF_RANGE:
                positions[tp] = 0
        stats.records += len(records)
        return records

    def commit(self) -> ErrorCode:
        """Commit the current positions (synchronously: the coordinator is in-process)."""
        self._next_commit = self._clock.time() + self.config.auto_commit_interval
        if not self.member_id or not self.positions:
            return ErrorCode.NONE
        return self._cluster.commit_offsets(
            self.config.group_id, self.member_id, self.generation, self.positions
        )

    async def close(self) -> None:
        """Commit and leave the group, so it rebalances at once rather than after a timeout."""
        if self.member_id:
            self.commit()
            await self._cluster.leave_group(self.config.group_id, self.member_id)
        self.member_id = ""
        self.assignment = ()
        self.positions = {}
        self._needs_join = True

    async def _join(self) -> None:
        config = self.config
        self.commit()
        self.assignment = ()
        self.positions = {}
        while True:
            response = await self._cluster.join_group(
                config.group_id,
                self.member_id,
                client_id=config.client_id,
                topics=config.topics,
                session_timeout=config.session_timeout,
                rebalance_timeout=config.rebalance_timeout,
            )
            if response.error is ErrorCode.UNKNOWN_MEMBER_ID and self.member_id:
                self.member_id = ""
                continue
            if response.error is not ErrorCode.NONE:
                raise KafkaError(response.error, f"joining group {config.group_id!r}")
            break
        self.member_id = response.member_id
        self.generation = response.generation
        self.assignment = response.assignment
        committed = self._cluster.committed(config.group_id, self.assignment)
        self.positions = {tp: committed.get(tp, 0) for tp in self.assignment}
        self._needs_join = False
        self.stats.joins += 1
        now = self._clock.time()
        self._next_heartbeat = now + config.heartbeat_interval
        _log.debug(
            "consumer_joined",
            member=self.member_id,
            generation=self.generation,
            assignment=[str(tp) for tp in self.assignment],
        )

    async def _heartbeat(self) -> None:
        config = self.config
        response = await self._cluster.heartbeat(config.group_id, self.member_id, self.generation)
        self._next_heartbeat = self._clock.time() + config.heartbeat_interval
        error = response.error
        if error is ErrorCode.NONE:
            return
        if error is ErrorCode.UNKNOWN_MEMBER_ID:
            # Expelled (session timed out): positions are lost, rejoin as a new member.
            self.member_id = ""
        self._needs_join = True
