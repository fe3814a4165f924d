"""What a producer learns about a record it sent."""

from __future__ import annotations

from dataclasses import dataclass

from ..records import TopicPartition


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was written.

    ``offset`` is -1 when it is unknown: with ``acks=0``, and for delayed
    messages, which get their offset only when they are due.
    """

    tp: TopicPartition
    offset: int
    timestamp: float
