"""Unmodified aiokafka and kafka-python clients against purgatory-broker.

Each client produces with acks 0, 1 and all (and gzip, the codec both ship without
extra packages) and reads everything back with the same library; an idle consumer's
fetches wait in the broker's fetch purgatory; topics are created through each
library's admin client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import RunningBroker

pytest.importorskip("kafka")

COUNT = 30
PARTITIONS = 2  # the conftest broker's default for auto-created topics

Sent = tuple[int, bytes, bytes, list[tuple[str, bytes]]]


def _records() -> list[Sent]:
    return [
        (i, b"k%d" % (i % 4), b"v%d" % i, [("n", str(i).encode()), ("src", b"test")])
        for i in range(COUNT)
    ]


def _aiokafka_round_trip(bootstrap: str, topic: str, acks: int | str, codec: str | None) -> list:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def run() -> list[Any]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks=acks, compression_type=codec, linger_ms=5
        )
        await producer.start()
        try:
            sent = [
                await producer.send(topic, value, key=key, headers=headers)
                for _, key, value, headers in _records()
            ]
            await producer.flush()
            if acks != 0:
                assert all(f.result().offset >= 0 for f in sent)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while len(got) < COUNT and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                got.extend(r for records in batch.values() for r in records)
            return got
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(run(), 60))


def _kafka_python_round_trip(
    bootstrap: str, topic: str, acks: int | str, codec: str | None
) -> list:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks=acks, compression_type=codec, linger_ms=5
    )
    try:
        sent = [
            producer.send(topic, value, key=key, headers=headers)
            for _, key, value, headers in _records()
        ]
        producer.flush(20)
        if acks != 0:
            assert all(f.get(10).offset >= 0 for f in sent)
    finally:
        producer.close(10)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < COUNT and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500)
            got.extend(r for records in batch.values() for r in records)
        return got
    finally:
        consumer.close()


ROUND_TRIPS: dict[str, Callable[[str, str, int | str, str | None], list]] = {
    "aiokafka": _aiokafka_round_trip,
    "kafka-python": _kafka_python_round_trip,
}


@pytest.mark.parametrize(
    ("acks", "codec"), [(0, None), (1, None), ("all", None), ("all", "gzip")], ids=str
)
@pytest.mark.parametrize("client", sorted(ROUND_TRIPS))
def test_produce_then_consume_in_order(
    broker: RunningBroker, client: str, acks: int | str, codec: str | None
) -> None:
    topic = f"{client}-{acks}-{codec}"
    got = ROUND_TRIPS[client](broker.bootstrap, topic, acks, codec)
    assert len(got) == COUNT
    per_partition: dict[int, list[int]] = {}
    key_partition: dict[bytes, int] = {}
    for record in got:
        headers = dict(record.headers)
        n = int(headers["n"])
        assert headers["src"] == b"test"
        assert record.value == b"v%d" % n
        assert record.key == b"k%d" % (n % 4)
        assert key_partition.setdefault(record.key, record.partition) == record.partition
        per_partition.setdefault(record.partition, []).append(n)
        assert record.offset == len(per_partition[record.partition]) - 1
    assert sorted(n for ns in per_partition.values() for n in ns) == list(range(COUNT))
    for numbers in per_partition.values():
        assert numbers == sorted(numbers)


def _fetches_settled(broker: RunningBroker) -> tuple[int, int]:
    """(completed, expired) operations of the broker's fetch purgatory so far."""
    stats = broker.purgatory_stats("fetch")
    return int(stats["completed"]), int(stats["expired"])


IDLE_S = 2.0
MAX_WAIT_MS = 400


def _check_idle(before: tuple[int, int], after: tuple[int, int]) -> None:
    """``before``/``after``: :func:`_fetches_settled` around an idle poll of an empty partition."""
    completed, expired = after[0] - before[0], after[1] - before[1]
    # Every fetch of the idle window waited in the purgatory until fetch.max.wait.ms:
    # none was answered early, and the client did not spin (an unheld fetch would be
    # answered at once and the client would send hundreds).
    assert completed == 0
    assert 1 <= expired <= IDLE_S * 1000 / MAX_WAIT_MS + 2


def test_aiokafka_empty_poll_waits_in_the_fetch_purgatory(
    broker_any_loop: RunningBroker,
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    broker = broker_any_loop
    tp = TopicPartition("aio-waits", 0)

    async def run() -> tuple[tuple[int, int], tuple[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=MAX_WAIT_MS,
        )
        await consumer.start()
        try:
            await producer.send_and_wait(tp.topic, b"first", partition=0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            first = await consumer.getone()
            assert first.value == b"first"
            loop = asyncio.get_running_loop()
            # getmany answers from the fetch results; read the stats around it.
            before = await loop.run_in_executor(None, _fetches_settled, broker)
            assert await consumer.getmany(timeout_ms=int(IDLE_S * 1000)) == {}
            after = await loop.run_in_executor(None, _fetches_settled, broker)
            await producer.send_and_wait(tp.topic, b"second", partition=0)
            second = await asyncio.wait_for(consumer.getone(), 10)
            assert second.value == b"second"
            return before, after
        finally:
            await consumer.stop()
            await producer.stop()

    _check_idle(*asyncio.run(asyncio.wait_for(run(), 60)))


def test_kafka_python_empty_poll_waits_in_the_fetch_purgatory(
    broker_any_loop: RunningBroker,
) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    broker = broker_any_loop
    tp = TopicPartition("kp-waits", 0)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=MAX_WAIT_MS,
    )
    try:
        producer.send(tp.topic, b"first", partition=0).get(10)
        consumer.assign([tp])

        def poll_one() -> Any:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500, max_records=1).values():
                    return records[0]
            raise AssertionError("no record within 10 s")

        assert poll_one().value == b"first"

        def idle() -> None:
            deadline = time.monotonic() + IDLE_S
            while (left := deadline - time.monotonic()) > 0:
                assert consumer.poll(timeout_ms=max(1, int(left * 1000))) == {}

        before = _fetches_settled(broker)
        idle()
        _check_idle(before, _fetches_settled(broker))
        producer.send(tp.topic, b"second", partition=0).get(10)
        assert poll_one().value == b"second"
    finally:
        consumer.close()
        producer.close(10)


def test_aiokafka_admin_creates_topics(broker: RunningBroker) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    async def run() -> tuple[list[Any], int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            created = await admin.create_topics([NewTopic("aio-made", 3, 1)])
            again = await admin.create_topics([NewTopic("aio-made", 3, 1)])
            described = await admin.describe_topics(["aio-made"])
            return [created, again], len(described[0]["partitions"])
        finally:
            await admin.close()

    (created, again), partitions = asyncio.run(asyncio.wait_for(run(), 30))
    assert [error for _, error, *_ in created.topic_errors] == [0]
    assert [error for _, error, *_ in again.topic_errors] == [TopicAlreadyExistsError.errno]
    assert partitions == 3


def test_kafka_python_admin_creates_topics(broker: RunningBroker) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("kp-made", 3, 1)])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("kp-made", 3, 1)])
        (described,) = admin.describe_topics(["kp-made"])
        assert len(described["partitions"]) == 3
    finally:
        admin.close()
