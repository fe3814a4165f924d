"""The record accumulator: per-partition batches waiting to be sent."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import TypeAlias

from ..records import Record, TopicPartition, record_size
from .metadata import RecordMetadata

#: Told of a record's fate: (metadata, None) on success, (None, error) on failure.
SendCallback: TypeAlias = Callable[[RecordMetadata | None, BaseException | None], None]
#: Where a record's outcome goes: a future (sync send), a callback, or nowhere.
Delivery: TypeAlias = "asyncio.Future[RecordMetadata] | SendCallback | None"


class ProducerBatch:
    """Records for one partition, sent (and retried) together."""

    __slots__ = (
        "attempts",
        "created",
        "deliveries",
        "enqueued",
        "records",
        "retry_at",
        "size",
        "tp",
    )

    def __init__(self, tp: TopicPartition, now: float) -> None:
        self.tp = tp
        self.records: list[Record] = []
        #: ``send`` time of each record, for latency.
        self.enqueued: list[float] = []
        self.deliveries: list[Delivery] = []
        self.size = 0
        self.created = now
        self.attempts = 0
        self.retry_at = -math.inf

    def append(self, record: Record, delivery: Delivery, now: float) -> None:
        self.records.append(record)
        self.enqueued.append(now)
        self.deliveries.append(delivery)
        self.size += record_size(record)

    def __repr__(self) -> str:
        return f"ProducerBatch({self.tp}, records={len(self.records)}, attempts={self.attempts})"


class RecordAccumulator:
    """Collects records into batches and says which batches may be sent when.

    The head batch of a partition is ready once it is full (or followed by
    another batch), once it has lingered ``linger`` seconds, or, after a failed
    attempt, once its retry backoff has passed. A retried batch goes back to the
    head of its partition's queue, so with one request in flight per broker it is
    resent before anything newer and order holds.
    """

    __slots__ = ("_batch_size", "_linger", "_queues", "batches", "flushing")

    def __init__(self, batch_size: int, linger: float) -> None:
        self._batch_size = batch_size
        self._linger = linger
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        #: Batches waiting to be sent.
        self.batches = 0
        #: Send every batch at once, ignoring ``linger`` (``flush`` and ``close``).
        self.flushing = False

    def has_room(self, tp: TopicPartition, size: int) -> bool:
        """Whether ``tp`` has an open batch that a record of ``size`` bytes fits in."""
        queue = self._queues.get(tp)
        if not queue:
            return False
        last = queue[-1]
        return last.attempts == 0 and last.size + size <= self._batch_size

    def append(self, tp: TopicPartition, record: Record, delivery: Delivery, now: float) -> bool:
        """Add ``record``; True if it opened a new batch or filled one (the sender should look)."""
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        size = record_size(record)
        opened = False
        if not queue or queue[-1].attempts > 0 or queue[-1].size + size > self._batch_size:
            queue.append(ProducerBatch(tp, now))
            self.batches += 1
            opened = True
        batch = queue[-1]
        batch.append(record, delivery, now)
        return opened or batch.size >= self._batch_size

    def reenqueue(self, batch: ProducerBatch, *, by_sequence: bool = False) -> None:
        """Put a batch that failed back at the head of its partition's queue.

        With ``by_sequence`` (an idempotent producer) it goes among the other resent
        batches at the head in the order of their sequence numbers, since the broker
        accepts a partition's batches only in that order.
        """
        queue = self._queues.get(batch.tp)
        if queue is None:
            queue = self._queues[batch.tp] = deque()
        index = 0
        if by_sequence:
            first = batch.records[0].sequence
            while (
                index < len(queue)
                and queue[index].attempts > 0
                and queue[index].records[0].sequence < first
            ):
                index += 1
        queue.insert(index, batch)
        self.batches += 1

    def drain(
        self,
        now: float,
        leader_of: Callable[[TopicPartition], int | None],
        has_capacity: Callable[[int], bool],
        max_request_size: int,
    ) -> tuple[dict[int, list[ProducerBatch]], float]:
        """Take the sendable batches: one request's worth per broker with capacity.

        Returns the batches per leader broker (at most one batch per partition),
        and the earliest time a batch still waiting becomes ready by itself
        (``inf`` if none will: more records, a response or a flush must come first).
        """
        requests: dict[int, list[ProducerBatch]] = {}
        sizes: dict[int, int] = {}
        next_ready = math.inf
        linger = self._linger
        for tp, queue in self._queues.items():
            if not queue:
                continue
            batch = queue[0]
            if batch.attempts > 0:
                ready_at = batch.retry_at
            elif len(queue) > 1 or batch.size >= self._batch_size or self.flushing:
                ready_at = now
            else:
                ready_at = batch.created + linger
            if ready_at > now:
                next_ready = min(next_ready, ready_at)
                continue
            leader = leader_of(tp)
            if leader is None or not has_capacity(leader):
                continue
            size = sizes.get(leader, 0)
            if size and size + batch.size > max_request_size:
                continue
            sizes[leader] = size + batch.size
            requests.setdefault(leader, []).append(queue.popleft())
            self.batches -= 1
        return requests, next_ready

    def take_all(self) -> list[ProducerBatch]:
        """Remove and return every waiting batch (to fail them when closing)."""
        batches = [batch for queue in self._queues.values() for batch in queue]
        self._queues.clear()
        self.batches = 0
        return batches
