"""Requests and responses of the broker APIs: plain data with error codes.

These are what a transport (an HTTP route, the in-process clients) passes in
and gets back; nothing in them refers to broker internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from .errors import ErrorCode
from .records import Record, TopicPartition
from .validation import check_int, check_seconds


def no_latency() -> float:
    """The default network delay of a request or response: none."""
    return 0.0


#: ``replica_id`` of a fetch sent by a consumer rather than by a follower broker.
CONSUMER_REPLICA_ID: Final = -1

#: ``acks`` value meaning "every in-sync replica" (``acks=all``).
ACKS_ALL: Final = -1


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    """An idempotent producer: the id the broker handed out and its epoch."""

    producer_id: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """Records to append, grouped by partition.

    Args:
        records: the records for each partition, in order.
        acks: 0 (no response), 1 (the leader appended) or -1 (all in-sync replicas have them).
        timeout: seconds an ``acks=-1`` request may wait for replication.
        client_id: who sent it, for logs.
        producer: set by an idempotent producer: each partition's records are then one
            batch whose ``sequence`` numbers the broker checks (a retry of a batch it
            already has is acknowledged with the first offsets and not appended again).
        batch_bytes: the size of each partition's batch as it arrived, checked against
            the topic's ``max.message.bytes``; without it the records' sizes plus a
            batch header are.
    """

    records: Mapping[TopicPartition, Sequence[Record]]
    acks: int = ACKS_ALL
    timeout: float = 30.0
    client_id: str = ""
    producer: ProducerIdentity | None = None
    batch_bytes: Mapping[TopicPartition, int] | None = None

    def __post_init__(self) -> None:
        check_seconds("timeout", self.timeout)


@dataclass(frozen=True, slots=True)
class PartitionProduceResult:
    """The outcome for one partition of a produce request.

    ``base_offset`` is the offset of the first record appended at once (-1 if none);
    ``scheduled`` counts records held back for delayed delivery.
    """

    error: ErrorCode
    base_offset: int = -1
    scheduled: int = 0


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    partitions: Mapping[TopicPartition, PartitionProduceResult]

    @property
    def ok(self) -> bool:
        return all(r.error is ErrorCode.NONE for r in self.partitions.values())


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Read from partitions, waiting up to ``max_wait`` for ``min_bytes`` to be available.

    Args:
        offsets: the offset to read from, per partition.
        max_wait: seconds to wait for ``min_bytes``; what there is is returned then.
        min_bytes: return as soon as this many bytes can be returned.
        max_bytes: cap on the response size (at least one record is always returned
            when there is one, as Kafka does, so an oversized record cannot stall a reader).
        partition_max_bytes: cap per partition.
        replica_id: the follower broker fetching, or :data:`CONSUMER_REPLICA_ID`.
            Followers read up to the log end; consumers only up to the high watermark.
    """

    offsets: Mapping[TopicPartition, int]
    max_wait: float = 0.5
    min_bytes: int = 1
    max_bytes: int = 50 * 1024 * 1024
    partition_max_bytes: int = 1024 * 1024
    replica_id: int = CONSUMER_REPLICA_ID

    def __post_init__(self) -> None:
        check_seconds("max_wait", self.max_wait)
        for name in ("min_bytes", "max_bytes", "partition_max_bytes"):
            check_int(name, getattr(self, name), 0)


@dataclass(frozen=True, slots=True)
class PartitionFetchResult:
    """Records of one partition starting at ``fetch_offset``."""

    error: ErrorCode
    fetch_offset: int
    high_watermark: int = -1
    log_end_offset: int = -1
    records: Sequence[Record] = ()


@dataclass(frozen=True, slots=True)
class FetchResponse:
    partitions: Mapping[TopicPartition, PartitionFetchResult]

    @property
    def size(self) -> int:
        """Bytes of records in the response."""
        return sum(r.size for p in self.partitions.values() for r in p.records)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create; ``max_message_bytes`` (Kafka's ``max.message.bytes``) overrides
    the broker's ``message_max_bytes`` for it."""

    partitions: int
    replication_factor: int
    max_message_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest:
    """Topics to create; with ``timeout > 0`` the response waits until all have leaders."""

    topics: Mapping[str, TopicSpec]
    timeout: float = 30.0

    def __post_init__(self) -> None:
        check_seconds("timeout", self.timeout)


@dataclass(frozen=True, slots=True)
class CreateTopicsResponse:
    """Per topic: ``NONE`` once every partition has a leader, else why not."""

    errors: Mapping[str, ErrorCode]


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader: int | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic: str
    partitions: tuple[PartitionMetadata, ...]


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    """The result of a join barrier for one member.

    The coordinator assigns partitions itself (a stand-in for the leader-driven
    SyncGroup round of real Kafka), so ``assignment`` comes with the join.
    """

    error: ErrorCode
    generation: int = -1
    member_id: str = ""
    leader_id: str = ""
    members: tuple[str, ...] = ()
    assignment: tuple[TopicPartition, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error: ErrorCode
