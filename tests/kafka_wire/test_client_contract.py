"""What real clients rely on, with librdkafka, aiokafka and kafka-python unmodified.

Tombstones and null header values read back as null; offsets by time; an oversized record
refused; an idempotent producer whose writes time out and are retried leaves no
duplicates; a static member restarted within its session keeps its partitions while a
dynamic one sees no rebalance; a transactional producer fails at once, saying why.

Each runs against one broker on asyncio and against three (replication factor 3, min ISR
2) on uvloop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from minikafka.broker.config import BrokerConfig
from minikafka.records import TopicPartition
from minikafka.wire.server import WireConfig

from .conftest import RunningBroker

pytest.importorskip("kafka")

BIG = 2_000_000  # over message.max.bytes (1,048,588 by default)
#: The records every client sends: (key, value, headers); None values and headers are nulls.
RECORDS: list[tuple[bytes, bytes | None, list[tuple[str, bytes | None]]]] = [
    (b"k1", b"v1", [("h", b"x")]),
    (b"k1", None, [("h", None)]),  # a tombstone with a null header value
    (b"k2", b"", [("h", b"")]),  # empty, which is not null
]
STAMPS = [1_700_000_001_000, 1_700_000_003_000, 1_700_000_005_000]


@pytest.fixture(
    params=[("asyncio", 1), ("uvloop", 3)], ids=["1-broker-asyncio", "3-brokers-uvloop"]
)
def cluster(request: pytest.FixtureRequest) -> Iterator[RunningBroker]:
    loop, brokers = request.param
    running = RunningBroker(
        BrokerConfig(brokers=brokers, min_insync_replicas=min(2, brokers)),
        WireConfig(port=0, partitions=1, replication_factor=brokers),
        loop,
    )
    yield running
    running.stop()


def create_topic(broker: RunningBroker, name: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    factor = len(broker.wire.ports)
    futures = admin.create_topics(
        [NewTopic(name, partitions, factor, config=config)], operation_timeout=10
    )
    futures[name].result(20)


# -- per client: send RECORDS, read them back, look offsets up by time, send a big one -------


def _librdkafka(bootstrap: str, topic: str) -> dict[str, Any]:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": 3 * BIG, "linger.ms": 1}
    )
    for (key, value, headers), stamp in zip(RECORDS, STAMPS, strict=True):
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=stamp)
    assert producer.flush(20) == 0
    errors: list[KafkaError] = []
    producer.produce(topic, value=b"x" * BIG, on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(20) == 0
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "ck", "enable.auto.commit": False}
    )
    try:
        consumer.assign([CkTopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < len(RECORDS) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.key(), msg.value(), msg.headers()))
        times = [
            consumer.offsets_for_times([CkTopicPartition(topic, 0, stamp + 1)], 10)[0]
            for stamp in (STAMPS[0], STAMPS[-1])
        ]
    finally:
        consumer.close()
    return {
        "records": got,
        "after_first": times[0].offset,
        "after_last": times[1].offset,
        "too_large": errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE,
    }


def _aiokafka(bootstrap: str, topic: str) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import MessageSizeTooLargeError

    async def run() -> dict[str, Any]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=3 * BIG)
        await producer.start()
        try:
            for (key, value, headers), stamp in zip(RECORDS, STAMPS, strict=True):
                await producer.send_and_wait(
                    topic, value, key=key, headers=headers, timestamp_ms=stamp
                )
            try:
                await producer.send_and_wait(topic, b"x" * BIG)
                too_large = False
            except MessageSizeTooLargeError:
                too_large = True
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got = []
            deadline = time.monotonic() + 20
            while len(got) < len(RECORDS) and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend((r.key, r.value, list(r.headers)) for r in records)
            first = await consumer.offsets_for_times({tp: STAMPS[0] + 1})
            last = await consumer.offsets_for_times({tp: STAMPS[-1] + 1})
        finally:
            await consumer.stop()
        return {
            "records": got,
            "after_first": first[tp].offset,
            "after_last": last[tp],
            "too_large": too_large,
        }

    return asyncio.run(asyncio.wait_for(run(), 60))


def _kafka_python(bootstrap: str, topic: str) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import MessageSizeTooLargeError

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=3 * BIG)
    try:
        for (key, value, headers), stamp in zip(RECORDS, STAMPS, strict=True):
            if any(v is None for _, v in headers):
                # kafka-python cannot send a null header value: librdkafka sends that one,
                # for kafka-python to read back.
                other = Producer({"bootstrap.servers": bootstrap})
                other.produce(topic, value=value, key=key, headers=headers, timestamp=stamp)
                assert other.flush(20) == 0
                continue
            producer.send(topic, value, key=key, headers=headers, timestamp_ms=stamp).get(20)
        try:
            producer.send(topic, b"x" * BIG).get(20)
            too_large = False
        except MessageSizeTooLargeError:
            too_large = True
    finally:
        producer.close(10)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < len(RECORDS) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.key, r.value, list(r.headers)) for r in records)
        first = consumer.offsets_for_times({tp: STAMPS[0] + 1})
        last = consumer.offsets_for_times({tp: STAMPS[-1] + 1})
    finally:
        consumer.close()
    return {
        "records": got,
        "after_first": first[tp].offset,
        "after_last": last[tp],
        "too_large": too_large,
    }


CLIENTS: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "librdkafka": _librdkafka,
    "aiokafka": _aiokafka,
    "kafka-python": _kafka_python,
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_nulls_offsets_by_time_and_size_limit(cluster: RunningBroker, client: str) -> None:
    topic = f"contract-{client}"
    create_topic(cluster, topic)
    seen = CLIENTS[client](cluster.bootstrap, topic)
    assert [(k, v, list(h)) for k, v, h in seen["records"]] == RECORDS
    assert seen["after_first"] == 1  # the first record at or after the time
    # Nothing that late: librdkafka says -1 (its OFFSET_END), the others None.
    assert seen["after_last"] in (-1, None)
    assert seen["too_large"], "the 2,000,000-byte record was not refused as too large"
    assert log_end(cluster, topic) == len(RECORDS)


def log_end(broker: RunningBroker, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    return broker.call(lambda: broker.wire.cluster.partition(tp).log_end_offset)


# -- idempotent producer ------------------------------------------------------------------------


def _stall_followers(broker: RunningBroker, stalled: bool) -> None:
    def apply() -> None:
        for fetcher in broker.wire.cluster.fetchers:
            if stalled:
                fetcher.stall()
            else:
                fetcher.resume()

    broker.call(apply)


@pytest.fixture(params=["asyncio", "uvloop"])
def replicated(request: pytest.FixtureRequest) -> Iterator[RunningBroker]:
    running = RunningBroker(
        BrokerConfig(brokers=3, min_insync_replicas=2, replica_lag_time_max=30.0),
        WireConfig(port=0, partitions=1, replication_factor=3),
        request.param,
    )
    yield running
    running.stop()


def test_idempotent_librdkafka_retries_timed_out_writes_without_duplicates(
    replicated: RunningBroker,
) -> None:
    """The same run without idempotence leaves duplicates in the log (checked by hand)."""
    topic = "idem"
    create_topic(replicated, topic)
    producer = Producer(
        {
            "bootstrap.servers": replicated.bootstrap,
            "enable.idempotence": True,
            "request.timeout.ms": 1000,  # the broker answers REQUEST_TIMED_OUT after it
            "message.timeout.ms": 30_000,
            "linger.ms": 5,
        }
    )
    errors: list[KafkaError | None] = []
    # With the followers paused, acks=all writes are appended by the leader but time out:
    # the producer sends the same batches again.
    _stall_followers(replicated, True)
    for i in range(40):
        producer.produce(
            topic, value=b"%d" % i, partition=0, on_delivery=lambda e, _m: errors.append(e)
        )
        producer.poll(0)
        time.sleep(0.02)
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        producer.poll(0.1)
    expired = replicated.purgatory_stats("produce")["expired"]
    _stall_followers(replicated, False)
    assert producer.flush(30) == 0
    assert errors == [None] * 40
    assert int(expired) > 0, "no write timed out: the retries were not exercised"
    tp = TopicPartition(topic, 0)
    values = replicated.call(lambda: [r.value for r in replicated.wire.cluster.partition(tp).log])
    assert values == [b"%d" % i for i in range(40)]


# -- static membership --------------------------------------------------------------------------


class Member:
    """A librdkafka consumer that records what it is assigned and revoked."""

    def __init__(self, broker: RunningBroker, topic: str, instance: str | None) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "static",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
            "partition.assignment.strategy": "range",
            "enable.auto.commit": False,
        }
        if instance is not None:
            config["group.instance.id"] = instance
        self.consumer = Consumer(config)
        self.events: list[tuple[str, list[int]]] = []
        self.assigned: list[int] = []
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)

    def _assign(self, _c: object, parts: list[CkTopicPartition]) -> None:
        self.assigned = sorted(p.partition for p in parts)
        self.events.append(("assign", self.assigned))

    def _revoke(self, _c: object, parts: list[CkTopicPartition]) -> None:
        self.assigned = []
        self.events.append(("revoke", sorted(p.partition for p in parts)))

    def poll(self) -> None:
        msg = self.consumer.poll(0.05)
        assert msg is None or msg.error() is None, msg.error()


def poll_until(members: list[Member], done: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, [m.events for m in members]
        for member in members:
            member.poll()


def test_a_restarted_static_member_keeps_its_partitions_without_a_rebalance(
    cluster: RunningBroker,
) -> None:
    topic = "static-topic"
    create_topic(cluster, topic, partitions=4)
    static, dynamic = Member(cluster, topic, "box-1"), Member(cluster, topic, None)
    poll_until(
        [static, dynamic],
        lambda: len(static.assigned) == 2 and len(dynamic.assigned) == 2,
    )
    kept, seen_by_dynamic = static.assigned, list(dynamic.events)
    # A static member leaves no LeaveGroup behind: its place waits for it.
    static.consumer.close()
    restarted = Member(cluster, topic, "box-1")
    poll_until([restarted, dynamic], lambda: bool(restarted.assigned), within=5.0)
    assert restarted.assigned == kept
    settle = time.monotonic() + 1.0
    poll_until([restarted, dynamic], lambda: time.monotonic() > settle)
    assert dynamic.events == seen_by_dynamic, "the dynamic member was rebalanced"
    restarted.consumer.close()
    dynamic.consumer.close()


def test_a_second_live_member_with_the_same_instance_id_fences_the_first(
    cluster: RunningBroker,
) -> None:
    topic = "fenced-topic"
    create_topic(cluster, topic, partitions=2)
    first = Member(cluster, topic, "box-2")
    poll_until([first], lambda: bool(first.assigned))
    second = Member(cluster, topic, "box-2")
    poll_until([second], lambda: bool(second.assigned), within=5.0)
    assert second.assigned == [0, 1]
    # The first one learns at its next heartbeat that it was replaced: a fatal error.
    deadline = time.monotonic() + 10
    error = None
    while error is None:
        assert time.monotonic() < deadline, "the first member was never fenced"
        msg = first.consumer.poll(0.1)
        if msg is not None and msg.error() is not None:
            error = msg.error()
    assert error.code() in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID), error
    assert "fenced by other consumer with same group.instance.id" in error.str(), error
    second.consumer.close()
    first.consumer.close()


# -- transactions -------------------------------------------------------------------------------


def _transactional_librdkafka(bootstrap: str) -> str:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "tx-ck",
            "transaction.timeout.ms": 60_000,
        }
    )
    try:
        producer.init_transactions(30)
    except Exception as exc:
        return str(exc)
    return "started"


def _transactional_aiokafka(bootstrap: str) -> str:
    from aiokafka import AIOKafkaProducer

    async def run() -> str:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="tx-ak")
        try:
            await producer.start()
        except Exception as exc:
            return type(exc).__name__
        finally:
            await producer.stop()
        return "started"

    return asyncio.run(asyncio.wait_for(run(), 60))


def _transactional_kafka_python(bootstrap: str) -> str:
    from kafka import KafkaProducer

    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="tx-kp")
        try:
            producer.init_transactions()
        finally:
            producer.close(5)
    except Exception as exc:
        return type(exc).__name__
    return "started"


TRANSACTIONAL: dict[str, Callable[[str], str]] = {
    "librdkafka": _transactional_librdkafka,
    "aiokafka": _transactional_aiokafka,
    "kafka-python": _transactional_kafka_python,
}


@pytest.mark.parametrize("client", sorted(TRANSACTIONAL))
def test_a_transactional_producer_fails_at_once_saying_why(
    cluster: RunningBroker, client: str
) -> None:
    started = time.monotonic()
    error = TRANSACTIONAL[client](cluster.bootstrap)
    assert time.monotonic() - started < 5  # not after a transaction or request timeout
    assert "authorization" in error.lower() or "Authorization" in error, error
