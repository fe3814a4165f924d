"""Idempotent producers, record size limits and time lookups on the broker itself."""

from __future__ import annotations

import pytest
from minikafka import (
    ACKS_ALL,
    Cluster,
    CreateTopicsRequest,
    ErrorCode,
    FetchRequest,
    ProduceRequest,
    ProducerIdentity,
    Record,
    TopicPartition,
    TopicSpec,
)
from minikafka.broker.log import Log
from minikafka.broker.producer_state import MAX_SEQUENCE, ProducerBatchInfo, ProducerStateManager
from minikafka.protocol import PartitionProduceResult
from mk_support import TP0, Drive, MakeCluster, follower_fetch

PID = ProducerIdentity(7, 0)


def batch(first: int, count: int = 2, pid: int = 7) -> list[Record]:
    return [Record(b"v%d" % (first + i), producer_id=pid, sequence=first + i) for i in range(count)]


async def send(
    cluster: Cluster,
    records: list[Record],
    producer: ProducerIdentity | None = PID,
    acks: int = 1,
) -> PartitionProduceResult:
    request = ProduceRequest({TP0: records}, acks=acks, timeout=1.0, producer=producer)
    return (await cluster.produce(request)).partitions[TP0]


async def test_a_retried_batch_is_acknowledged_with_its_first_offset_and_not_appended(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False)
    first = await send(cluster, batch(0))
    second = await send(cluster, batch(2))
    again = await send(cluster, batch(0))
    assert (first.error, second.error, again.error) == (ErrorCode.NONE,) * 3
    assert again.base_offset == first.base_offset == 0
    assert cluster.partition(TP0).log_end_offset == 4


async def test_only_the_last_five_batches_are_remembered(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(replicate=False)
    for n in range(6):
        assert (await send(cluster, batch(2 * n))).error is ErrorCode.NONE
    # The sixth-newest batch is forgotten: its retry is out of sequence, not a duplicate.
    assert (await send(cluster, batch(0))).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (await send(cluster, batch(2))).base_offset == 2


async def test_a_gap_is_out_of_order_and_leaves_the_log_alone(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(replicate=False)
    await send(cluster, batch(0))
    gap = await send(cluster, batch(5))
    assert gap.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert cluster.partition(TP0).log_end_offset == 2
    assert (await send(cluster, batch(2))).error is ErrorCode.NONE


async def test_epochs_fence_older_producers(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(replicate=False)
    await send(cluster, batch(0))
    newer = ProducerIdentity(7, 1)
    # A new epoch starts at sequence 0 ...
    assert (await send(cluster, batch(2), newer)).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (await send(cluster, batch(0), newer)).error is ErrorCode.NONE
    # ... and the old epoch is refused from then on, even for a retry it could have sent.
    assert (await send(cluster, batch(2))).error is ErrorCode.INVALID_PRODUCER_EPOCH
    assert cluster.partition(TP0).log_end_offset == 4


async def test_a_producer_without_state_may_start_anywhere_and_plain_producers_are_unchecked(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False)
    assert (await send(cluster, batch(40))).error is ErrorCode.NONE
    plain = [Record(b"x", producer_id=7, sequence=40)] * 2
    assert (await send(cluster, plain, producer=None)).error is ErrorCode.NONE
    assert cluster.partition(TP0).log_end_offset == 4


def test_sequences_wrap_around_after_the_largest() -> None:
    state = ProducerStateManager()
    assert state.check(1, 0, MAX_SEQUENCE - 1, MAX_SEQUENCE).error is ErrorCode.NONE
    state.update(ProducerBatchInfo(1, 0, MAX_SEQUENCE - 1, MAX_SEQUENCE, 0, 1))
    assert state.check(1, 0, MAX_SEQUENCE - 1, MAX_SEQUENCE).duplicate_of is not None
    assert state.check(1, 0, 0, 1).error is ErrorCode.NONE
    assert state.check(1, 0, 1, 2).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


async def test_acks_all_retry_waits_for_the_first_copy_to_be_replicated(
    make_cluster: MakeCluster, drive: Drive
) -> None:
    cluster = await make_cluster(replicate=False)
    timed_out = await drive(send(cluster, batch(0), acks=ACKS_ALL))
    assert timed_out.error is ErrorCode.REQUEST_TIMED_OUT
    await follower_fetch(cluster, broker=1, offset=2)
    await follower_fetch(cluster, broker=2, offset=2)
    retry = await drive(send(cluster, batch(0), acks=ACKS_ALL))
    assert (retry.error, retry.base_offset) == (ErrorCode.NONE, 0)
    assert cluster.partition(TP0).log_end_offset == 2


async def test_a_follower_that_becomes_leader_still_recognises_retries(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False)
    await send(cluster, batch(0))
    await send(cluster, batch(2))
    await send(cluster, batch(4))
    # Broker 1 copied the first two batches; broker 2 the first one only.
    await follower_fetch(cluster, broker=1, offset=4)
    await follower_fetch(cluster, broker=2, offset=4)
    await follower_fetch(cluster, broker=2, offset=2)
    cluster.replicas.elect_leader(TP0, 1)
    partition = cluster.partition(TP0)
    assert partition.leader == 1 and partition.log_end_offset == 4
    # A retry of a batch the new leader holds is a duplicate; the lost third batch is
    # appended again; a gap is still a gap.
    assert (await send(cluster, batch(2))).base_offset == 2
    assert (await send(cluster, batch(8))).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    resent = await send(cluster, batch(4))
    assert (resent.error, resent.base_offset) == (ErrorCode.NONE, 4)
    values = [
        r.value
        for r in (await cluster.fetch(FetchRequest({TP0: 0}, max_wait=0))).partitions[TP0].records
    ]
    assert values == [b"v0", b"v1", b"v2", b"v3"]  # below the high watermark
    with pytest.raises(ValueError, match="not an in-sync follower"):
        partition.fail_over(7, 0.0)


async def test_batches_over_the_size_limits_are_refused(
    make_cluster: MakeCluster, drive: Drive
) -> None:
    cluster = await make_cluster(replicate=False, message_max_bytes=1000)
    big = [Record(b"x" * 2000)]
    assert (await send(cluster, big, producer=None)).error is ErrorCode.RECORD_TOO_LARGE
    assert cluster.partition(TP0).log_end_offset == 0
    created = await drive(
        cluster.create_topics(
            CreateTopicsRequest(
                {"roomy": TopicSpec(1, 1, max_message_bytes=5000), "bad": TopicSpec(1, 1, -1)}
            )
        )
    )
    assert created.errors == {"roomy": ErrorCode.NONE, "bad": ErrorCode.INVALID_CONFIG}
    roomy = TopicPartition("roomy", 0)
    response = await cluster.produce(ProduceRequest({roomy: big}, acks=1))
    assert response.partitions[roomy].error is ErrorCode.NONE


def test_time_lookup_skips_segments_and_finds_the_first_record_at_or_after() -> None:
    log = Log(segment_bytes=100)
    stamps = [5.0, 1.0, 9.0, 3.0, 12.0, 2.0, 20.0, 15.0]
    log.append(Record(b"x" * 40, timestamp=t) for t in stamps)
    assert log.offset_for_time(0.0, len(log)) == (0, 5.0)
    assert log.offset_for_time(6.0, len(log)) == (2, 9.0)
    assert log.offset_for_time(13.0, len(log)) == (6, 20.0)
    assert log.offset_for_time(13.0, 6) is None  # only below the end given
    assert log.offset_for_time(21.0, len(log)) is None
    log.truncate(3)
    assert log.offset_for_time(10.0, 100) is None
    assert log.offset_for_time(6.0, 100) == (2, 9.0)


def test_null_values_and_headers_are_not_empty_bytes() -> None:
    tombstone = Record(None, b"k", headers=(("h", None),))
    assert tombstone.size == Record(b"", b"k").size
    assert tombstone.value is None and tombstone.headers[0][1] is None


async def test_an_idempotent_batch_without_sequences_is_an_invalid_record(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False)
    unnumbered = [Record(b"x")]
    assert (await send(cluster, unnumbered)).error is ErrorCode.INVALID_RECORD
    negative = ProducerIdentity(7, -1)
    assert (await send(cluster, batch(0), negative)).error is ErrorCode.INVALID_RECORD
    assert cluster.partition(TP0).log_end_offset == 0
