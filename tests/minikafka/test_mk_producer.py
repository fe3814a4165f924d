"""The producer client: partitioning, batching, send modes, retries and ordering."""

from __future__ import annotations

import pytest
from minikafka import (
    ACKS_ALL,
    Cluster,
    ErrorCode,
    KafkaError,
    Producer,
    ProducerConfig,
    TopicPartition,
)
from minikafka.clients import Partitioner, RecordMetadata
from mk_support import TOPIC, TP0, Drive, MakeCluster, follower_fetch

from purgatory_aio.testing import ManualClock


def values(cluster: Cluster, tp: TopicPartition = TP0) -> list[bytes]:
    return [r.value for r in cluster.partition(tp).log]


def test_a_key_always_maps_to_the_same_partition() -> None:
    partitioner = Partitioner()
    chosen = {partitioner.partition(TOPIC, b"user-%d" % (i % 7), 6) for i in range(70)}
    assert len(chosen) <= 7
    assert partitioner.partition(TOPIC, b"user-1", 6) == Partitioner().partition(
        TOPIC, b"user-1", 6
    )


def test_records_without_a_key_stick_to_a_partition_until_its_batch_closes() -> None:
    partitioner = Partitioner()
    first = partitioner.partition(TOPIC, None, 3)
    assert partitioner.partition(TOPIC, None, 3) == first
    rotation = [partitioner.next_sticky(TOPIC, 3) for _ in range(4)]
    assert rotation == [(first + i) % 3 for i in range(1, 5)]


async def test_records_linger_and_leave_together_in_one_request(
    make_cluster: MakeCluster, clock: ManualClock
) -> None:
    cluster = await make_cluster(replicas=1)
    producer = Producer(cluster, ProducerConfig(acks=1, linger=0.05))
    for i in range(3):
        producer.send(TOPIC, b"%d" % i, key=b"k")
    await clock.advance(0.04)
    assert producer.stats.requests == 0
    await clock.advance(0.02)
    assert producer.stats.requests == 1
    assert producer.stats.acked == 3
    await producer.close()


async def test_a_full_batch_is_sent_without_waiting_for_linger(
    make_cluster: MakeCluster, clock: ManualClock
) -> None:
    cluster = await make_cluster(replicas=1)
    producer = Producer(cluster, ProducerConfig(acks=1, linger=10.0, batch_size=300))
    for _ in range(3):
        producer.send(TOPIC, b"x" * 100, key=b"k")
    await clock.advance(0)
    assert producer.stats.requests == 1
    assert producer.stats.acked == 2, "the third record opened the next batch"
    await producer.close()


async def test_sync_send_returns_the_offset(make_cluster: MakeCluster, drive: Drive) -> None:
    cluster = await make_cluster(replicas=1)
    producer = Producer(cluster, ProducerConfig(acks=ACKS_ALL, linger=0.0))
    first = await drive(producer.send_and_wait(TOPIC, b"a", key=b"k"))
    second = await drive(producer.send_and_wait(TOPIC, b"b", key=b"k"))
    assert (first.offset, second.offset) == (0, 1)
    assert first.tp == second.tp
    await producer.close()


async def test_async_send_reports_to_its_callback(make_cluster: MakeCluster, drive: Drive) -> None:
    cluster = await make_cluster(replicas=1)
    producer = Producer(cluster, ProducerConfig(acks=1, linger=0.0))
    outcomes: list[tuple[RecordMetadata | None, BaseException | None]] = []
    producer.send(TOPIC, b"a", callback=lambda m, e: outcomes.append((m, e)))
    await drive(producer.flush())
    [(metadata, error)] = outcomes
    assert error is None and metadata is not None and metadata.offset == 0
    await producer.close()


async def test_acks_0_counts_a_record_as_sent_without_an_offset(
    make_cluster: MakeCluster, drive: Drive
) -> None:
    cluster = await make_cluster(replicas=1)
    producer = Producer(cluster, ProducerConfig(acks=0, linger=0.0))
    metadata = await drive(producer.send_and_wait(TOPIC, b"a"))
    assert metadata.offset == -1
    assert values(cluster, metadata.tp) == [b"a"]
    await producer.close()


async def test_a_delayed_message_has_no_offset_yet(make_cluster: MakeCluster, drive: Drive) -> None:
    cluster = await make_cluster(replicas=1)
    producer = Producer(cluster, ProducerConfig(acks=1, linger=0.0))
    metadata = await drive(producer.send_and_wait(TOPIC, b"later", key=b"k", delay=1.0))
    assert metadata.offset == -1
    await producer.close()


async def test_retries_exhausted_fail_the_send(
    make_cluster: MakeCluster, clock: ManualClock, drive: Drive
) -> None:
    cluster = await make_cluster(replicate=False)
    cluster.partition(TP0).isr = (0,)
    config = ProducerConfig(acks=ACKS_ALL, linger=0.0, retries=2, retry_backoff=0.1)
    producer = Producer(cluster, config)
    with pytest.raises(KafkaError) as failure:
        await drive(producer.send_and_wait(TOPIC, b"a"))
    assert failure.value.code is ErrorCode.NOT_ENOUGH_REPLICAS
    assert producer.stats.retries == 2
    assert values(cluster) == []
    await producer.close()


async def ordering_after_a_retry(
    cluster: Cluster, clock: ManualClock, max_in_flight: int
) -> list[bytes]:
    """A is refused (ISR too small) and retried; B is sent while A's answer travels back.

    Returns the log.
    """
    partition = cluster.partition(TP0)
    config = ProducerConfig(
        acks=ACKS_ALL, linger=0.0, retry_backoff=0.1, max_in_flight=max_in_flight
    )
    producer = Producer(cluster, config, response_latency=lambda: 0.05)
    partition.isr = (0,)
    producer.send(TOPIC, b"A", key=b"k")
    await clock.advance(0.01)
    partition.isr = (0, 1, 2)
    producer.send(TOPIC, b"B", key=b"k")
    for _ in range(6):
        await clock.advance(0.06)
        for broker in (1, 2):
            await follower_fetch(cluster, broker, partition.log_end_offset)
    assert producer.stats.acked == 2
    await producer.close()
    return values(cluster)


async def test_with_several_requests_in_flight_a_retry_can_reorder_records(
    make_cluster: MakeCluster, clock: ManualClock
) -> None:
    cluster = await make_cluster(replicate=False)
    assert await ordering_after_a_retry(cluster, clock, max_in_flight=5) == [b"B", b"A"]


async def test_with_one_request_in_flight_a_retry_keeps_the_order(
    make_cluster: MakeCluster, clock: ManualClock
) -> None:
    cluster = await make_cluster(replicate=False)
    assert await ordering_after_a_retry(cluster, clock, max_in_flight=1) == [b"A", b"B"]
