"""The replica manager: appends, fetches, replication and the ISR of every partition."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import structlog

from purgatory_aio import Clock, Purgatory, Timer, TimerHandle

from ..errors import ErrorCode
from ..protocol import (
    ACKS_ALL,
    FetchRequest,
    FetchResponse,
    PartitionFetchResult,
    PartitionMetadata,
    PartitionProduceResult,
    ProduceRequest,
    ProduceResponse,
    TopicMetadata,
)
from ..records import Record, TopicPartition, record_size
from .config import BrokerConfig
from .delayed_delivery import DelayedDelivery
from .delayed_fetch import DelayedFetch
from .delayed_produce import DelayedProduce
from .partition import Partition

_log = structlog.get_logger("minikafka.replica_manager")


#: Bytes of a record batch before its records (Kafka's v2 batch header).
BATCH_HEADER_BYTES = 61


def batch_size(records: Sequence[Record]) -> int:
    """What a batch of ``records`` weighs against ``max.message.bytes``."""
    return BATCH_HEADER_BYTES + sum(record_size(r) for r in records)


@dataclass(frozen=True, slots=True)
class IsrChange:
    """A follower left (``shrink``) or rejoined (``expand``) a partition's ISR."""

    time: float
    tp: TopicPartition
    kind: Literal["shrink", "expand"]
    broker: int
    isr: tuple[int, ...]


class ReplicaManager:
    """Every partition of the cluster and the two purgatories that serve them.

    Completion is driven the way Kafka drives it: an append checks the fetch
    purgatory on that partition (followers are waiting for data), and a move of
    the high watermark checks both the produce purgatory (``acks=all`` writes)
    and the fetch purgatory (consumers read up to the high watermark).

    Args:
        config: broker settings.
        clock: the cluster's clock.
        timer: the cluster's timer (delayed messages and the periodic ISR check).
        produce: the purgatory for :class:`DelayedProduce`.
        fetch: the purgatory for :class:`DelayedFetch`.
    """

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        timer: Timer,
        produce: Purgatory,
        fetch: Purgatory,
    ) -> None:
        self._config = config
        self._clock = clock
        self._timer = timer
        self._produce = produce
        self._fetch = fetch
        self._partitions: dict[TopicPartition, Partition] = {}
        self._topics: dict[str, tuple[Partition, ...]] = {}
        self._isr_check: TimerHandle | None = None
        self._leader_listeners: list[Callable[[Partition], None]] = []
        self.delivery = DelayedDelivery(timer, clock, self._append_due)
        #: Every ISR change so far, oldest first.
        self.isr_changes: list[IsrChange] = []

    # -- partitions ----------------------------------------------------------------------------

    def add_topic(
        self,
        topic: str,
        assignment: list[tuple[int, ...]],
        max_message_bytes: int | None = None,
    ) -> tuple[Partition, ...]:
        """Create a topic's partitions, leaderless, with the given replica lists."""
        limit = self._config.message_max_bytes if max_message_bytes is None else max_message_bytes
        partitions = tuple(
            Partition(TopicPartition(topic, i), replicas, limit)
            for i, replicas in enumerate(assignment)
        )
        self._topics[topic] = partitions
        for partition in partitions:
            self._partitions[partition.tp] = partition
        return partitions

    def has_topic(self, topic: str) -> bool:
        return topic in self._topics

    def topics(self) -> tuple[str, ...]:
        """Every topic's name, in creation order."""
        return tuple(self._topics)

    def topic_partitions(self, topic: str) -> tuple[Partition, ...]:
        return self._topics.get(topic, ())

    def partition(self, tp: TopicPartition) -> Partition | None:
        return self._partitions.get(tp)

    @property
    def partitions(self) -> Mapping[TopicPartition, Partition]:
        return self._partitions

    def elect_leader(self, tp: TopicPartition, broker: int | None = None) -> None:
        """Make the preferred replica the leader of a new partition, or, with ``broker``,
        move the leadership of a led one to that in-sync follower; tell the followers.

        Writes waiting for replication are re-checked; those the new leader's copy
        does not hold time out (their producers retry).
        """
        partition = self._partitions[tp]
        now = self._clock.time()
        if broker is None or partition.leader is None:
            partition.become_leader(partition.replicas[0] if broker is None else broker, now)
        else:
            partition.fail_over(broker, now)
            _log.info("leader_moved", partition=str(tp), leader=broker, isr=list(partition.isr))
        self._start_isr_checks()
        for listener in self._leader_listeners:
            listener(partition)
        self._high_watermark_moved(tp)

    def on_leader_elected(self, listener: Callable[[Partition], None]) -> None:
        """Call ``listener(partition)`` after each leader election (followers start fetching)."""
        self._leader_listeners.append(listener)

    def metadata(self, topic: str) -> TopicMetadata | None:
        partitions = self._topics.get(topic)
        if partitions is None:
            return None
        return TopicMetadata(
            topic,
            tuple(
                PartitionMetadata(p.tp.partition, p.leader, p.replicas, p.isr) for p in partitions
            ),
        )

    # -- produce -------------------------------------------------------------------------------

    async def produce(self, request: ProduceRequest) -> ProduceResponse:
        """Append and, for ``acks=all``, wait for replication.

        With ``acks=0`` the response is built at once (a transport that honours
        ``acks=0`` simply does not send it).
        """
        results, waiting = self._append(request)
        if not waiting or request.acks != ACKS_ALL:
            return ProduceResponse(results)
        op = DelayedProduce(request.timeout, self, results, waiting)
        return await self._produce.watch_and_wait(op, tuple(waiting))

    async def submit_produce(
        self, request: ProduceRequest, respond: Callable[[ProduceResponse], None]
    ) -> None:
        """Append and arrange for ``respond(response)`` to be called once, Kafka style.

        Returns as soon as the request is appended (and, for ``acks=all``, watched):
        a client can pipeline requests without a task per request. ``acks=0``
        requests get no response at all.
        """
        results, waiting = self._append(request)
        if request.acks == 0:
            return
        if not waiting:
            respond(ProduceResponse(results))
            return
        op = DelayedProduce(request.timeout, self, results, waiting, respond)
        await self._produce.try_complete_else_watch(op, tuple(waiting))

    def replication_status(self, tp: TopicPartition, required_offset: int) -> ErrorCode | None:
        """For :class:`DelayedProduce`: whether the ISR of ``tp`` holds ``required_offset``."""
        partition = self._partitions.get(tp)
        if partition is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return partition.replication_status(required_offset, self._config.min_insync_replicas)

    def _append(
        self, request: ProduceRequest
    ) -> tuple[dict[TopicPartition, PartitionProduceResult], dict[TopicPartition, int]]:
        results: dict[TopicPartition, PartitionProduceResult] = {}
        waiting: dict[TopicPartition, int] = {}
        acks = request.acks
        if acks not in (0, 1, ACKS_ALL):
            for tp in request.records:
                results[tp] = PartitionProduceResult(ErrorCode.INVALID_REQUIRED_ACKS)
            return results, waiting
        now = self._clock.time()
        min_insync = self._config.min_insync_replicas
        producer = request.producer
        sizes = request.batch_bytes
        for tp, records in request.records.items():
            partition = self._partitions.get(tp)
            if partition is None:
                results[tp] = PartitionProduceResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if partition.leader is None:
                results[tp] = PartitionProduceResult(ErrorCode.LEADER_NOT_AVAILABLE)
                continue
            size = sizes.get(tp, 0) if sizes is not None else batch_size(records)
            if size > partition.max_message_bytes:
                results[tp] = PartitionProduceResult(ErrorCode.RECORD_TOO_LARGE)
                continue
            if acks == ACKS_ALL and len(partition.isr) < min_insync:
                # Refused before appending: the producer knows nothing was written.
                results[tp] = PartitionProduceResult(ErrorCode.NOT_ENOUGH_REPLICAS)
                continue
            if producer is not None and records:
                first = records[0].sequence
                if first < 0 or producer.epoch < 0 or producer.producer_id < 0:
                    # An idempotent batch numbers its records from a sequence of 0 or more.
                    results[tp] = PartitionProduceResult(ErrorCode.INVALID_RECORD)
                    continue
                check = partition.check_sequence(
                    producer.producer_id, producer.epoch, first, len(records)
                )
                if check.error is not ErrorCode.NONE:
                    _log.info(
                        "produce_refused",
                        partition=str(tp),
                        error=check.error.name,
                        reason=check.message,
                    )
                    results[tp] = PartitionProduceResult(check.error)
                    continue
                duplicate = check.duplicate_of
                if duplicate is not None:
                    # A retry of a batch already appended: the first answer again, and for
                    # acks=all the same wait for that batch to be replicated.
                    results[tp] = PartitionProduceResult(ErrorCode.NONE, duplicate.base_offset)
                    if acks == ACKS_ALL and duplicate.last_offset >= 0:
                        waiting[tp] = duplicate.last_offset + 1
                    continue
            immediate: Sequence[Record] = records
            scheduled = 0
            if any(r.delay > 0 for r in records):
                now_due: list[Record] = []
                for record in records:
                    if record.delay > 0:
                        self.delivery.schedule(tp, record, now + record.delay)
                        scheduled += 1
                    else:
                        now_due.append(record)
                immediate = now_due
            base = -1
            if producer is not None and records:
                base, hw_moved = partition.append_batch(
                    immediate, producer.producer_id, producer.epoch, first, len(records)
                )
                if immediate:
                    self._after_append(tp, hw_moved)
                    if acks == ACKS_ALL:
                        waiting[tp] = partition.log_end_offset
            elif immediate:
                base, hw_moved = partition.append(immediate)
                self._after_append(tp, hw_moved)
                if acks == ACKS_ALL:
                    waiting[tp] = partition.log_end_offset
            results[tp] = PartitionProduceResult(ErrorCode.NONE, base, scheduled)
        return results, waiting

    def _append_due(self, tp: TopicPartition, record: Record) -> None:
        partition = self._partitions.get(tp)
        if partition is None or partition.leader is None:
            return
        _, hw_moved = partition.append((record,))
        self._after_append(tp, hw_moved)

    def _after_append(self, tp: TopicPartition, hw_moved: bool) -> None:
        if hw_moved:
            self._high_watermark_moved(tp)
        else:
            self._fetch.check_and_complete(tp)

    def _high_watermark_moved(self, tp: TopicPartition) -> None:
        self._produce.check_and_complete(tp)
        self._fetch.check_and_complete(tp)

    # -- fetch ---------------------------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """Read, waiting up to ``max_wait`` for ``min_bytes`` (a long poll)."""
        if request.replica_id >= 0:
            self._record_follower_fetch(request)
        if request.max_wait <= 0 or not request.offsets or self.fetch_satisfied(request):
            return self.read(request)
        return await self._fetch.watch_and_wait(DelayedFetch(request, self), tuple(request.offsets))

    def fetch_satisfied(self, request: FetchRequest) -> bool:
        """For :class:`DelayedFetch`: can the request be answered now?

        True once ``min_bytes`` are readable, or when a partition has an error to report.
        """
        follower = request.replica_id >= 0
        cap = request.partition_max_bytes
        available = 0
        for tp, offset in request.offsets.items():
            partition = self._partitions.get(tp)
            if partition is None or partition.leader is None:
                return True
            end = partition.log.end_offset
            if offset > end or offset < 0:
                return True
            if not follower:
                end = partition.high_watermark
            available += min(cap, partition.log.bytes_between(offset, end))
            if available >= request.min_bytes:
                return True
        return False

    def read(self, request: FetchRequest) -> FetchResponse:
        """Read every partition of ``request`` now, within its byte limits."""
        follower = request.replica_id >= 0
        budget = request.max_bytes
        results: dict[TopicPartition, PartitionFetchResult] = {}
        for tp, offset in request.offsets.items():
            partition = self._partitions.get(tp)
            if partition is None:
                results[tp] = PartitionFetchResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, offset)
                continue
            if partition.leader is None:
                results[tp] = PartitionFetchResult(ErrorCode.LEADER_NOT_AVAILABLE, offset)
                continue
            log = partition.log
            hw = partition.high_watermark
            end = log.end_offset
            if follower and request.replica_id not in partition.replicas:
                results[tp] = PartitionFetchResult(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER, offset, hw, end
                )
                continue
            if offset > end or offset < 0:
                results[tp] = PartitionFetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, offset, hw, end)
                continue
            records: Sequence[Record] = ()
            if budget > 0:
                limit = min(budget, request.partition_max_bytes)
                records = log.read(offset, end if follower else hw, limit)
                budget -= log.bytes_between(offset, offset + len(records))
            results[tp] = PartitionFetchResult(ErrorCode.NONE, offset, hw, end, records)
        return FetchResponse(results)

    def _record_follower_fetch(self, request: FetchRequest) -> None:
        now = self._clock.time()
        broker = request.replica_id
        lag_max = self._config.replica_lag_time_max
        for tp, offset in request.offsets.items():
            partition = self._partitions.get(tp)
            if (
                partition is None
                or partition.follower(broker) is None
                or not 0 <= offset <= partition.log.end_offset
            ):
                continue
            hw_moved, rejoined = partition.on_follower_fetch(broker, offset, now, lag_max)
            if rejoined:
                self._isr_changed(IsrChange(now, tp, "expand", broker, partition.isr))
            if hw_moved:
                self._high_watermark_moved(tp)

    # -- ISR maintenance -----------------------------------------------------------------------

    def _start_isr_checks(self) -> None:
        if self._isr_check is None:
            interval = self._config.replica_lag_time_max / 2
            self._isr_check = self._timer.call_later(interval, self._check_isrs, interval)

    def _check_isrs(self, interval: float) -> None:
        now = self._clock.time()
        lag_max = self._config.replica_lag_time_max
        for tp, partition in self._partitions.items():
            if partition.leader is None:
                continue
            dropped, hw_moved = partition.shrink_isr(now, lag_max)
            for broker in dropped:
                self._isr_changed(IsrChange(now, tp, "shrink", broker, partition.isr))
            if hw_moved:
                # Writes that were waiting only for the dropped followers complete now.
                self._high_watermark_moved(tp)
        self._isr_check = self._timer.call_later(interval, self._check_isrs, interval)

    def _isr_changed(self, change: IsrChange) -> None:
        self.isr_changes.append(change)
        _log.info(
            "isr_" + change.kind,
            partition=str(change.tp),
            broker=change.broker,
            isr=list(change.isr),
        )

    def close(self) -> None:
        if self._isr_check is not None:
            self._isr_check.cancel()
            self._isr_check = None
