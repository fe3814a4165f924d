"""acks=all seen from librdkafka while followers stop copying: Kafka's rules, then recovery.

A three-broker cluster, one partition with three replicas, ``min.insync.replicas=2``
and a follower lag limit of one second. The producer does not retry, so each delivery
report carries the broker's own answer:

- the ISR shrinks below the minimum while a write waits in the produce purgatory: the
  write is already in the leader's log, so it completes with
  ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``;
- the ISR is already too small when a write arrives: refused before the append,
  ``NOT_ENOUGH_REPLICAS``; acks=1 is not concerned;
- the write's own timeout passes first: ``REQUEST_TIMED_OUT``;
- one follower of two stopped: the ISR drops to two, which is enough, and the write
  succeeds once the stopped follower leaves the ISR;
- followers resume, catch up, rejoin the ISR: acks=all succeeds again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Producer
from minikafka.broker.config import BrokerConfig
from minikafka.records import TopicPartition
from minikafka.wire.server import WireConfig

from .conftest import RunningBroker

TOPIC = "replicated"
TP = TopicPartition(TOPIC, 0)
LAG_S = 1.0


@pytest.fixture
def cluster() -> Iterator[RunningBroker]:
    running = RunningBroker(
        BrokerConfig(brokers=3, min_insync_replicas=2, replica_lag_time_max=LAG_S),
        WireConfig(port=0, partitions=1, replication_factor=3),
        "asyncio",
    )
    yield running
    running.stop()


def _send(broker: RunningBroker, value: bytes, acks: str = "all", timeout_ms: int = 10_000) -> int:
    """The delivery report's error code (0 on success) of one record."""
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": acks,
            "retries": 0,
            "request.timeout.ms": timeout_ms,
            "message.timeout.ms": timeout_ms + 20_000,
        }
    )
    errors: list[KafkaError | None] = []
    producer.produce(TOPIC, value=value, partition=0, on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(40) == 0, "no delivery report"
    (error,) = errors
    return 0 if error is None else int(error.code())


def _isr(broker: RunningBroker) -> tuple[int, ...]:
    return broker.call(lambda: tuple(broker.wire.cluster.partition(TP).isr))


def _leader(broker: RunningBroker) -> int:
    leader = broker.call(lambda: broker.wire.cluster.partition(TP).leader)
    assert leader is not None
    return leader


def _stall(broker: RunningBroker, followers: set[int]) -> None:
    def stall() -> None:
        for fetcher in broker.wire.cluster.fetchers:
            if fetcher.broker_id in followers:
                fetcher.stall()

    broker.call(stall)


def _resume_all(broker: RunningBroker) -> None:
    broker.call(lambda: [fetcher.resume() for fetcher in broker.wire.cluster.fetchers])


def _wait_for_isr(broker: RunningBroker, size: int, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while len(_isr(broker)) != size:
        assert time.monotonic() < deadline, f"ISR {_isr(broker)} never reached {size} replicas"
        time.sleep(0.05)


def test_acks_all_follows_kafkas_rules_as_followers_stop_and_recover(
    cluster: RunningBroker,
) -> None:
    assert _send(cluster, b"healthy") == 0  # auto-creates the topic, then succeeds
    _wait_for_isr(cluster, 3)
    leader = _leader(cluster)
    followers = {0, 1, 2} - {leader}

    _stall(cluster, followers)
    # Appended, then held in the produce purgatory until the ISR shrinks under the minimum.
    assert _send(cluster, b"during") == KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert _isr(cluster) == (leader,)
    # Refused before the append now; a leader-only write is still fine.
    assert _send(cluster, b"refused") == KafkaError.NOT_ENOUGH_REPLICAS
    assert _send(cluster, b"leader only", acks="1") == 0

    _resume_all(cluster)
    _wait_for_isr(cluster, 3)
    assert _send(cluster, b"recovered") == 0


def test_acks_all_times_out_before_the_isr_shrinks(cluster: RunningBroker) -> None:
    assert _send(cluster, b"healthy") == 0
    _wait_for_isr(cluster, 3)
    _stall(cluster, {0, 1, 2} - {_leader(cluster)})
    # The write's own timeout (300 ms) passes before the followers' lag limit (1 s).
    assert _send(cluster, b"late", timeout_ms=300) == KafkaError.REQUEST_TIMED_OUT
    _resume_all(cluster)
    _wait_for_isr(cluster, 3)
    assert _send(cluster, b"recovered") == 0


def test_acks_all_succeeds_with_one_follower_stopped(cluster: RunningBroker) -> None:
    assert _send(cluster, b"healthy") == 0
    _wait_for_isr(cluster, 3)
    leader = _leader(cluster)
    stopped = min({0, 1, 2} - {leader})
    _stall(cluster, {stopped})
    # Waits for the stopped follower until it leaves the ISR; two replicas are enough.
    assert _send(cluster, b"two of three") == 0
    assert stopped not in _isr(cluster) and len(_isr(cluster)) == 2
    assert _send(cluster, b"again") == 0
