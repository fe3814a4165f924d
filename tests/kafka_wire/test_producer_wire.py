"""Idempotent producers, size limits, time lookups and transactions, request by request.

What a misbehaving or unusual client can send (sequence gaps, stale epochs, producer ids
nobody handed out, transactional batches, oversized batches) is answered with Kafka's
error code for it, and the broker goes on serving everyone else.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.record.default_records import (  # type: ignore[import-untyped]
    DefaultRecordBatchBuilder,
)
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode as E
from minikafka.broker.config import BrokerConfig
from minikafka.wire.codec import build, nested
from minikafka.wire.server import WireConfig

from .conftest import RunningBroker
from .raw import RawConnection

PRODUCE, LIST_OFFSETS, CREATE_TOPICS, INIT_PRODUCER_ID = 0, 2, 19, 22
TOPIC = "w"
LIMIT = 2000


@pytest.fixture(params=["asyncio", "uvloop"])
def small_broker(request: pytest.FixtureRequest) -> Iterator[RunningBroker]:
    running = RunningBroker(
        BrokerConfig(brokers=1, message_max_bytes=LIMIT),
        WireConfig(port=0, partitions=1),
        request.param,
    )
    yield running
    running.stop()


def batch(
    values: list[bytes | None],
    *,
    producer_id: int = -1,
    epoch: int = -1,
    sequence: int = -1,
    transactional: bool = False,
    timestamps: list[int] | None = None,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=int(transactional),
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=2**31 - 1,
    )
    for i, value in enumerate(values):
        stamp = timestamps[i] if timestamps else 1_700_000_000_000 + i
        builder.append(i, timestamp=stamp, key=None, value=value, headers=[])
    return bytes(builder.build())


def produce(conn: RawConnection, records: bytes, *, topic: str = TOPIC) -> tuple[E, int]:
    topic_t = nested(load_request_schema(PRODUCE, 9), "topic_data")
    part_t = nested(topic_t, "partition_data")
    reply = conn.call(
        PRODUCE,
        9,
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            build(topic_t, name=topic, partition_data=(part_t(index=0, records=records),)),
        ),
    )
    (part,) = reply.responses[0].partition_responses
    return part.error_code, part.base_offset


def init_producer_id(conn: RawConnection, transactional_id: str | None = None) -> Any:
    return conn.call(
        INIT_PRODUCER_ID,
        4,
        transactional_id=transactional_id,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )


def create(conn: RawConnection, name: str, configs: dict[str, str]) -> Any:
    topic_t = nested(load_request_schema(CREATE_TOPICS, 5), "topics")
    config_t = nested(topic_t, "configs")
    reply = conn.call(
        CREATE_TOPICS,
        5,
        topics=(
            build(
                topic_t,
                name=name,
                num_partitions=1,
                replication_factor=1,
                assignments=(),
                configs=tuple(config_t(name=k, value=v) for k, v in configs.items()),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    return reply.topics[0]


def offset_for(conn: RawConnection, timestamp: int, version: int = 7) -> tuple[int, int]:
    topic_t = nested(load_request_schema(LIST_OFFSETS, version), "topics")
    part_t = nested(topic_t, "partitions")
    reply = conn.call(
        LIST_OFFSETS,
        version,
        replica_id=-1,
        isolation_level=0,
        topics=(
            topic_t(
                name=TOPIC,
                partitions=(
                    build(
                        part_t,
                        partition_index=0,
                        current_leader_epoch=-1,
                        timestamp=timestamp,
                    ),
                ),
            ),
        ),
    )
    part = reply.topics[0].partitions[0]
    assert part.error_code is E.none
    return part.offset, part.timestamp


def ready(conn: RawConnection) -> None:
    """Creates the topic (auto-creation answers the first produce with an error)."""
    assert create(conn, TOPIC, {}).error_code in (E.none, E.topic_already_exists)


def test_sequences_epochs_and_producer_ids_get_kafkas_error_codes(
    small_broker: RunningBroker,
) -> None:
    with RawConnection(small_broker) as conn, RawConnection(small_broker) as bystander:
        ready(conn)
        pid = init_producer_id(conn).producer_id
        assert pid > 0
        first = produce(conn, batch([b"a", b"b"], producer_id=pid, epoch=0, sequence=0))
        assert first == (E.none, 0)
        # A retry: the first offset again, nothing appended.
        assert produce(conn, batch([b"a", b"b"], producer_id=pid, epoch=0, sequence=0)) == first
        gap = produce(conn, batch([b"c"], producer_id=pid, epoch=0, sequence=5))
        assert gap[0] is E.out_of_order_sequence_number
        assert produce(bystander, batch([b"plain"])) == (E.none, 2)
        nobody = produce(conn, batch([b"x"], producer_id=pid + 1000, epoch=0, sequence=0))
        assert nobody[0] is E.unknown_producer_id
        assert produce(conn, batch([b"c"], producer_id=pid, epoch=1, sequence=0)) == (E.none, 3)
        stale = produce(conn, batch([b"d"], producer_id=pid, epoch=0, sequence=2))
        assert stale[0] is E.invalid_producer_epoch
        bad = produce(conn, batch([b"e"], producer_id=pid, epoch=1, sequence=-1))
        assert bad[0] is E.invalid_record
        txn = produce(conn, batch([b"f"], producer_id=pid, epoch=1, sequence=1, transactional=True))
        assert txn[0] is E.invalid_txn_state
        two = batch([b"g"]) + batch([b"h"])
        assert produce(conn, two)[0] is E.corrupt_message  # one batch per partition
        assert produce(bystander, batch([b"still"])) == (E.none, 4)


def test_transactional_ids_are_refused_at_once(small_broker: RunningBroker) -> None:
    with RawConnection(small_broker) as conn:
        refused = init_producer_id(conn, "tx")
        assert refused.error_code is E.transactional_id_authorization_failed
        assert refused.producer_id == -1
        assert init_producer_id(conn).error_code is E.none


def test_batches_over_message_max_bytes_or_the_topic_limit_are_refused(
    small_broker: RunningBroker,
) -> None:
    with RawConnection(small_broker) as conn:
        ready(conn)
        assert produce(conn, batch([b"x" * (LIMIT + 1)]))[0] is E.message_too_large
        assert produce(conn, batch([b"x" * 100])) == (E.none, 0)
        assert create(conn, "roomy", {"max.message.bytes": "100000"}).error_code is E.none
        assert produce(conn, batch([b"x" * (LIMIT + 1)]), topic="roomy") == (E.none, 0)
        bad = create(conn, "bad", {"max.message.bytes": "lots"})
        assert bad.error_code is E.invalid_config
        assert "max.message.bytes" in bad.error_message


@pytest.mark.parametrize("version", [1, 4, 7])
def test_offsets_by_time_are_the_first_record_at_or_after_with_its_timestamp(
    small_broker: RunningBroker, version: int
) -> None:
    with RawConnection(small_broker) as conn:
        ready(conn)
        stamps = [1000, 3000, 2000, 5000]
        assert produce(conn, batch([b"a", b"b", b"c", b"d"], timestamps=stamps))[0] is E.none
        assert offset_for(conn, 0, version) == (0, 1000)
        assert offset_for(conn, 2500, version) == (1, 3000)
        assert offset_for(conn, 3001, version) == (3, 5000)
        assert offset_for(conn, 5001, version) == (-1, -1)  # nothing that late
        assert offset_for(conn, -2, version) == (0, -1)  # earliest
        assert offset_for(conn, -1, version) == (4, -1)  # latest
