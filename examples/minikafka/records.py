"""Records and the partitions they live in."""

from __future__ import annotations

from typing import NamedTuple

#: Bytes a record costs beyond its key and value (offset delta, timestamp, lengths, headers).
RECORD_OVERHEAD = 16


class TopicPartition(NamedTuple):
    """One partition of a topic; the watch key of produce and fetch operations."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class Record(NamedTuple):
    """One message as producers send it and consumers receive it.

    ``value`` None is a tombstone (Kafka's null value, a delete in a compacted
    topic), as is a header value of None: both are kept apart from ``b""``.
    ``delay`` asks the broker to hold the record back: it joins the log (and
    becomes visible to consumers) ``delay`` seconds after the broker accepted it.
    ``producer_id`` and ``sequence`` are stamped by the producer client per
    partition. The broker checks them only for an idempotent producer
    (:attr:`~minikafka.protocol.ProduceRequest.producer`); otherwise it stores them
    untouched, which makes duplicates and reordering caused by retries visible in the log.
    """

    value: bytes | None
    key: bytes | None = None
    timestamp: float = 0.0
    delay: float = 0.0
    producer_id: int = -1
    sequence: int = -1
    #: Kafka record headers, kept for real clients (the simulator sends none).
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @property
    def size(self) -> int:
        """Bytes this record occupies in a log, a batch or a fetch response."""
        return record_size(self)


def record_size(record: Record) -> int:
    key = record.key
    value = record.value
    return RECORD_OVERHEAD + (0 if value is None else len(value)) + (0 if key is None else len(key))
