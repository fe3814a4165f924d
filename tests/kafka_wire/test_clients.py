"""Unmodified confluent-kafka (librdkafka) clients against purgatory-broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .conftest import RunningBroker


def _consume_all(bootstrap: str, topic: str, partitions: int, count: int) -> list[object]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[object] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_librdkafka_produce_then_consume_in_order(broker: RunningBroker, acks: str) -> None:
    topic = f"orders-{acks}"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": acks, "linger.ms": 5})
    failures: list[KafkaError] = []
    for i in range(40):
        producer.produce(
            topic,
            key=b"k%d" % (i % 4),
            value=b"v%d" % i,
            headers=[("n", str(i).encode())],
            on_delivery=lambda err, msg: failures.append(err) if err else None,
        )
    assert producer.flush(20) == 0
    assert failures == []
    got = _consume_all(broker.bootstrap, topic, 2, 40)
    assert len(got) == 40
    per_partition: dict[int, list[int]] = {}
    for message in got:
        n = int(dict(message.headers())["n"])  # type: ignore[attr-defined]
        assert message.value() == b"v%d" % n  # type: ignore[attr-defined]
        assert message.key() == b"k%d" % (n % 4)  # type: ignore[attr-defined]
        per_partition.setdefault(message.partition(), []).append(n)  # type: ignore[attr-defined]
    for numbers in per_partition.values():
        assert numbers == sorted(numbers)
    # the same key always lands on the same partition
    assert sum(len(v) for v in per_partition.values()) == 40


def test_empty_poll_waits_then_returns_when_data_arrives(broker_any_loop: RunningBroker) -> None:
    broker = broker_any_loop
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("waits", value=b"first")
    assert producer.flush(10) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "unused",
            "fetch.wait.max.ms": 400,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("waits", p, 0) for p in range(2)])
    try:
        first = None
        deadline = time.monotonic() + 10
        while first is None and time.monotonic() < deadline:
            first = consumer.poll(0.5)
        assert first is not None and first.value() == b"first"
        # Nothing more: the broker holds the fetch in the fetch purgatory.
        assert consumer.poll(1.0) is None
        producer.produce("waits", value=b"second", partition=first.partition())
        assert producer.flush(10) == 0
        second = None
        deadline = time.monotonic() + 10
        while second is None and time.monotonic() < deadline:
            second = consumer.poll(0.5)
        assert second is not None and second.value() == b"second"
    finally:
        consumer.close()


def test_admin_create_topics(broker: RunningBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
    futures["made"].result(10)
    again = admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
    with pytest.raises(Exception, match=r"TOPIC_ALREADY_EXISTS|already exists"):
        again["made"].result(10)
    metadata = admin.list_topics(timeout=10)
    assert len(metadata.topics["made"].partitions) == 3
