"""The producer client: partitioning, batching, pipelining and retries."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable

import structlog

from purgatory_aio import Clock, Timer, TimerHandle

from ..broker.cluster import Cluster
from ..errors import ErrorCode, KafkaError
from ..protocol import ProduceRequest, ProduceResponse, ProducerIdentity, no_latency
from ..records import Record, TopicPartition
from .accumulator import Delivery, ProducerBatch, RecordAccumulator, SendCallback
from .config import ProducerConfig
from .metadata import RecordMetadata
from .partitioner import Partitioner

_log = structlog.get_logger("minikafka.producer")


class ProducerStats:
    """Counters of one producer."""

    __slots__ = ("acked", "errors", "failed", "latencies", "requests", "retries", "sent")

    def __init__(self) -> None:
        #: Records handed to ``send``.
        self.sent = 0
        #: Records acknowledged (for ``acks=0``: handed to the broker).
        self.acked = 0
        #: Records that failed for good.
        self.failed = 0
        #: Batch resends after retriable errors.
        self.retries = 0
        #: Produce requests sent.
        self.requests = 0
        #: Error codes received, per batch.
        self.errors: Counter[str] = Counter()
        #: Seconds from ``send`` to acknowledgement, per acknowledged record.
        self.latencies: list[float] = []


class Producer:
    """Sends records to a :class:`~minikafka.broker.Cluster` the way KafkaProducer does.

    Records are partitioned (:class:`Partitioner`), collected per partition into
    batches (``batch_size``, ``linger``) and sent by one sender task, one
    request per leader broker holding every ready batch for it, with up to
    ``max_in_flight`` unanswered requests per broker. Responses arrive as
    callbacks (the broker answers ``acks=all`` requests from its produce
    purgatory), so in-flight requests cost no task each. Retriable errors are
    retried after ``retry_backoff``, within ``retries`` and ``delivery_timeout``.

    Three ways to send:
        ``send(...)`` fire and forget; ``send(..., callback=cb)`` asynchronous,
        ``cb(metadata, error)`` is called with the outcome; ``await send_and_wait(...)``
        synchronous, returns the metadata or raises :class:`~minikafka.errors.KafkaError`.

    Args:
        cluster: where to send.
        config: producer settings.
        producer_id: stamped with a per-partition sequence number on every record.
        timer: for linger, backoff and response delivery (its own timer on the
            cluster's clock by default).
        response_latency: seconds a response takes to come back, drawn per response.
    """

    def __init__(
        self,
        cluster: Cluster,
        config: ProducerConfig | None = None,
        *,
        producer_id: int = 0,
        timer: Timer | None = None,
        response_latency: Callable[[], float] = no_latency,
    ) -> None:
        self.config = config = config or ProducerConfig()
        self._cluster = cluster
        self._clock: Clock = cluster.clock
        self._timer = timer if timer is not None else Timer(clock=cluster.clock)
        self._owns_timer = timer is None
        self.producer_id = producer_id
        self._identity = ProducerIdentity(producer_id) if config.idempotence else None
        self.response_latency = response_latency
        self._partitioner = Partitioner()
        self._accumulator = RecordAccumulator(config.batch_size, config.linger)
        self._sequences: dict[TopicPartition, int] = {}
        self._partition_counts: dict[str, int] = {}
        self._leaders: dict[TopicPartition, int | None] = {}
        self._in_flight: dict[int, int] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sender: asyncio.Task[None] | None = None
        self._closed = False
        self.stats = ProducerStats()

    # -- sending -------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        *,
        delay: float = 0.0,
        callback: SendCallback | None = None,
    ) -> None:
        """Queue a record; ``callback(metadata, error)`` is told the outcome if given.

        ``delay`` makes it a delayed message: consumers see it ``delay`` seconds
        after the broker accepted it. Raises :class:`KafkaError` at once for an
        unknown topic, and ``RuntimeError`` after :meth:`close`.
        """
        self._append(topic, value, key, delay, callback)

    async def send_and_wait(
        self, topic: str, value: bytes, key: bytes | None = None, *, delay: float = 0.0
    ) -> RecordMetadata:
        """Send and wait for the outcome (Kafka's ``send(record).get()``)."""
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self._append(topic, value, key, delay, future)
        return await future

    async def flush(self) -> None:
        """Send everything queued now and wait until every request is answered."""
        self._accumulator.flushing = True
        self._wake.set()
        try:
            await self._idle.wait()
        finally:
            self._accumulator.flushing = False

    async def close(self, *, flush: bool = True) -> None:
        """Stop the producer; queued records are sent first unless ``flush=False``
        (then they fail with ``BROKER_NOT_AVAILABLE``)."""
        if self._closed:
            return
        if flush and self._sender is not None:
            await self.flush()
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for batch in self._accumulator.take_all():
            self._fail(batch, KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, "producer closed"))
        if self._owns_timer:
            self._timer.close()

    def _append(
        self, topic: str, value: bytes, key: bytes | None, delay: float, delivery: Delivery
    ) -> None:
        if self._closed:
            raise RuntimeError("the producer is closed")
        partitions = self._partitions(topic)
        partitioner = self._partitioner
        partition = partitioner.partition(topic, key, partitions)
        tp = TopicPartition(topic, partition)
        now = self._clock.time()
        sequence = self._sequences.get(tp, 0)
        record = Record(value, key, now, delay, self.producer_id, sequence)
        if key is None and not self._accumulator.has_room(tp, record.size):
            tp = TopicPartition(topic, partitioner.next_sticky(topic, partitions))
            sequence = self._sequences.get(tp, 0)
            record = record._replace(sequence=sequence)
        self._sequences[tp] = sequence + 1
        self.stats.sent += 1
        self._idle.clear()
        if self._accumulator.append(tp, record, delivery, now):
            self._wake.set()
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(
                self._run_sender(), name=f"producer-{self.producer_id}-sender"
            )

    def _partitions(self, topic: str) -> int:
        count = self._partition_counts.get(topic)
        if count is None:
            metadata = self._cluster.metadata(topic)
            if metadata is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, topic)
            count = self._partition_counts[topic] = len(metadata.partitions)
            for p in metadata.partitions:
                self._leaders[TopicPartition(topic, p.partition)] = p.leader
        return count

    # -- the sender ----------------------------------------------------------------------------

    async def _run_sender(self) -> None:
        timer = self._timer
        wake = self._wake
        while True:
            wake.clear()
            next_ready = await self._send_ready()
            handle: TimerHandle | None = None
            if next_ready < math.inf:
                handle = timer.call_at(next_ready, wake.set)
            await wake.wait()
            if handle is not None:
                handle.cancel()

    async def _send_ready(self) -> float:
        config = self.config
        in_flight = self._in_flight
        limit = config.max_in_flight
        while True:
            now = self._clock.time()
            requests, next_ready = self._accumulator.drain(
                now, self._leader_of, lambda b: in_flight.get(b, 0) < limit, config.max_request_size
            )
            if not requests:
                if self._accumulator.batches == 0 and not any(in_flight.values()):
                    self._idle.set()
                return next_ready
            for leader, batches in requests.items():
                await self._send(leader, batches, now)

    async def _send(self, leader: int, batches: list[ProducerBatch], now: float) -> None:
        config = self.config
        for batch in batches:
            batch.attempts += 1
        request = ProduceRequest(
            {batch.tp: batch.records for batch in batches},
            acks=config.acks,
            timeout=config.request_timeout,
            client_id=config.client_id,
            producer=self._identity,
        )
        self.stats.requests += 1
        if config.acks == 0:
            # No response will come: a record counts as delivered once it is handed over.
            await self._cluster.submit_produce(request, _ignore)
            for batch in batches:
                self._succeed(batch, -1, now)
            return
        self._in_flight[leader] = self._in_flight.get(leader, 0) + 1
        await self._cluster.submit_produce(
            request, lambda response: self._on_response(leader, batches, response)
        )

    def _leader_of(self, tp: TopicPartition) -> int | None:
        leader = self._leaders.get(tp)
        if leader is None:
            metadata = self._cluster.metadata(tp.topic)
            if metadata is not None:
                for p in metadata.partitions:
                    self._leaders[TopicPartition(tp.topic, p.partition)] = p.leader
                leader = self._leaders.get(tp)
        return leader

    # -- responses -----------------------------------------------------------------------------

    def _on_response(
        self, leader: int, batches: list[ProducerBatch], response: ProduceResponse
    ) -> None:
        delay = self.response_latency()
        if delay > 0:
            self._timer.call_later(delay, self._handle_response, leader, batches, response)
        else:
            self._handle_response(leader, batches, response)

    def _handle_response(
        self, leader: int, batches: list[ProducerBatch], response: ProduceResponse
    ) -> None:
        self._in_flight[leader] -= 1
        now = self._clock.time()
        config = self.config
        for batch in batches:
            result = response.partitions.get(batch.tp)
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if result is None else result.error
            if error is ErrorCode.NONE:
                assert result is not None
                self._succeed(batch, result.base_offset, now)
                continue
            self.stats.errors[error.name] += 1
            retry_at = now + config.retry_backoff
            if (
                (error.retriable or self._resend_after_gap(error))
                and batch.attempts <= config.retries
                and retry_at < batch.created + config.delivery_timeout
                and not self._closed
            ):
                self.stats.retries += 1
                batch.retry_at = retry_at
                if error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE):
                    self._leaders.pop(batch.tp, None)
                self._accumulator.reenqueue(batch, by_sequence=config.idempotence)
            else:
                self._fail(batch, KafkaError(error, str(batch.tp)))
        self._wake.set()

    def _resend_after_gap(self, error: ErrorCode) -> bool:
        """An idempotent producer's batch refused as out of order follows an earlier batch
        that failed and is being resent: it is resent after that one."""
        return self.config.idempotence and error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

    def _succeed(self, batch: ProducerBatch, base_offset: int, now: float) -> None:
        stats = self.stats
        tp = batch.tp
        offset = base_offset
        latencies = stats.latencies
        for record, enqueued, delivery in zip(
            batch.records, batch.enqueued, batch.deliveries, strict=True
        ):
            if record.delay > 0 or offset < 0:
                metadata = RecordMetadata(tp, -1, record.timestamp)
            else:
                metadata = RecordMetadata(tp, offset, record.timestamp)
                offset += 1
            latencies.append(now - enqueued)
            _deliver(delivery, metadata, None)
        stats.acked += len(batch.records)

    def _fail(self, batch: ProducerBatch, error: KafkaError) -> None:
        self.stats.failed += len(batch.records)
        for delivery in batch.deliveries:
            _deliver(delivery, None, error)


def _deliver(
    delivery: Delivery, metadata: RecordMetadata | None, error: BaseException | None
) -> None:
    if delivery is None:
        return
    if isinstance(delivery, asyncio.Future):
        if not delivery.done():
            if error is None:
                assert metadata is not None
                delivery.set_result(metadata)
            else:
                delivery.set_exception(error)
        return
    try:
        delivery(metadata, error)
    except Exception:
        _log.exception("send_callback_error")


def _ignore(response: ProduceResponse) -> None:
    return None
