"""Idempotent producers: what a partition remembers of each producer's batches.

An idempotent producer numbers the records it sends to each partition (0, 1, 2, ...)
and gets a producer id and epoch from the broker. The partition keeps, per producer, the
epoch and the sequence ranges of its last :data:`BATCHES_KEPT` batches, which is what
lets it tell a retry of a batch it already appended (acknowledged again, with the offset
it got the first time, and not appended twice) from a batch that skipped some records
(``OUT_OF_ORDER_SEQUENCE_NUMBER``) or one from a producer that has since been replaced
by a newer epoch (``INVALID_PRODUCER_EPOCH``).

The state is derived from the batches in the log, the way a Kafka follower builds it
from the batches it copies: a follower that becomes leader rebuilds it from its copy
(:meth:`ProducerStateManager.rebuild`), so retries after a failover are still
recognised.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import ErrorCode

#: Batches remembered per producer: Kafka's bound, which is also why an idempotent
#: producer may have at most five requests in flight per broker.
BATCHES_KEPT = 5

#: The largest sequence number; the next one wraps around to 0.
MAX_SEQUENCE = 2**31 - 1


class ProducerBatchInfo(NamedTuple):
    """An idempotent batch in a log: who sent it and which offsets it got."""

    producer_id: int
    epoch: int
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer's epoch and its latest batches, oldest first."""

    epoch: int
    batches: deque[ProducerBatchInfo]

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


class SequenceCheck(NamedTuple):
    """The verdict on an idempotent batch before it is appended.

    ``error`` is ``NONE`` for a batch to append, and for a retry of an appended batch;
    ``duplicate_of`` is then the batch as first appended (its offsets are the answer).
    """

    error: ErrorCode
    duplicate_of: ProducerBatchInfo | None = None
    message: str = ""


def _next_sequence(sequence: int) -> int:
    return 0 if sequence == MAX_SEQUENCE else sequence + 1


def last_sequence(first: int, count: int) -> int:
    """The sequence of the last of ``count`` records numbered from ``first`` (wrapping)."""
    return (first + count - 1) % (MAX_SEQUENCE + 1)


class ProducerStateManager:
    """Every idempotent producer's state on one partition."""

    __slots__ = ("_producers",)

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}

    def check(
        self, producer_id: int, epoch: int, first_sequence: int, last_seq: int
    ) -> SequenceCheck:
        """Judge a batch from ``producer_id`` (Kafka's rules, checked before appending)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            # An unknown producer, or one whose batches are all gone: any sequence starts it.
            return SequenceCheck(ErrorCode.NONE)
        if epoch < entry.epoch:
            return SequenceCheck(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                message=f"producer {producer_id} epoch {epoch} is older than {entry.epoch}",
            )
        if epoch > entry.epoch:
            # A new epoch starts its sequences from 0.
            if first_sequence != 0:
                return SequenceCheck(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    message=f"new epoch {epoch} of producer {producer_id} must start at "
                    f"sequence 0, got {first_sequence}",
                )
            return SequenceCheck(ErrorCode.NONE)
        for batch in entry.batches:
            if batch.first_sequence == first_sequence and batch.last_sequence == last_seq:
                return SequenceCheck(ErrorCode.NONE, duplicate_of=batch)
        expected = _next_sequence(entry.last_sequence)
        if first_sequence != expected:
            return SequenceCheck(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                message=f"producer {producer_id} sent sequence {first_sequence}, "
                f"expected {expected}",
            )
        return SequenceCheck(ErrorCode.NONE)

    def update(self, batch: ProducerBatchInfo) -> None:
        """Remember an appended batch (its epoch becomes the producer's)."""
        entry = self._producers.get(batch.producer_id)
        if entry is None or batch.epoch > entry.epoch:
            entry = self._producers[batch.producer_id] = ProducerEntry(
                batch.epoch, deque(maxlen=BATCHES_KEPT)
            )
        entry.batches.append(batch)

    def epoch(self, producer_id: int) -> int | None:
        entry = self._producers.get(producer_id)
        return None if entry is None else entry.epoch

    def rebuild(self, batches: Iterable[ProducerBatchInfo]) -> None:
        """Forget everything and replay ``batches`` (a log's idempotent batches, in order)."""
        self._producers.clear()
        for batch in batches:
            self.update(batch)

    def __len__(self) -> int:
        return len(self._producers)
