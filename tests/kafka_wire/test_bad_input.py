"""What the broker does with input no client should send: Kafka's answer or Kafka's closed
connection, one log line, and everyone else served as before."""

from __future__ import annotations

import datetime
import logging
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode as E
from minikafka.broker.config import BrokerConfig
from minikafka.wire.codec import build, nested
from minikafka.wire.server import WireConfig

from .conftest import RunningBroker
from .raw import RawConnection

PRODUCE, METADATA, API_VERSIONS = 0, 3, 18
MAX_REQUEST = 4096


@pytest.fixture
def strict_broker() -> Iterator[RunningBroker]:
    """No auto-created topics, and a small request limit to cross."""
    running = RunningBroker(
        BrokerConfig(brokers=1),
        WireConfig(port=0, auto_create_topics=False, max_request_bytes=MAX_REQUEST),
        "asyncio",
    )
    yield running
    running.stop()


def _still_serving(broker: RunningBroker) -> None:
    with RawConnection(broker) as other:
        assert other.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1")
        reply = other.call(METADATA, 5, topics=None, allow_auto_topic_creation=False)
        assert [b.node_id for b in reply.brokers] == [0]


def _header(api_key: int, version: int, correlation: int = 1) -> bytes:
    """A v1 request header (no tagged fields), client id "raw"."""
    return struct.pack(">hhih", api_key, version, correlation, 3) + b"raw"


def _closes(broker: RunningBroker, send: Callable[[RawConnection], None]) -> list[dict[str, Any]]:
    """The warnings the broker logged while closing a connection that sent ``send``."""
    saved = structlog.get_config()
    # The suite silences logs below CRITICAL before any processor runs: let warnings through.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        with structlog.testing.capture_logs() as logs, RawConnection(broker, timeout=10) as conn:
            send(conn)
            assert conn.closed_by_peer(), "the broker kept the connection open"
            _still_serving(broker)
    finally:
        structlog.configure(**saved)
    return logs


def _events(lines: list[dict[str, Any]]) -> list[str]:
    return [line["event"] for line in lines]


def test_header_shorter_than_its_fixed_fields(strict_broker: RunningBroker) -> None:
    lines = _closes(strict_broker, lambda c: c.send_frame(b"\x00\x03\x00"))
    assert _events(lines) == ["malformed_request"]
    assert "shorter than its header" in lines[0]["error"]


def test_body_that_does_not_decode(strict_broker: RunningBroker) -> None:
    # Metadata v5: a topic array of 1000 entries, then nothing.
    frame = _header(METADATA, 5) + struct.pack(">i", 1000)
    lines = _closes(strict_broker, lambda c: c.send_frame(frame))
    assert _events(lines) == ["malformed_request"]
    assert "MetadataRequest v5" in lines[0]["error"]


@pytest.mark.parametrize("size", [-1, MAX_REQUEST + 1, 2**31 - 1], ids=str)
def test_size_out_of_bounds_closes_without_reading(strict_broker: RunningBroker, size: int) -> None:
    lines = _closes(strict_broker, lambda c: c.sock.sendall(struct.pack(">i", size)))
    assert _events(lines) == ["request_size_invalid"]
    assert lines[0]["size"] == size and lines[0]["limit"] == MAX_REQUEST


def test_frame_cut_short_by_the_client(strict_broker: RunningBroker) -> None:
    def send(conn: RawConnection) -> None:
        conn.sock.sendall(struct.pack(">i", 100) + _header(METADATA, 5))
        conn.sock.shutdown(1)  # SHUT_WR: the rest never comes

    lines = _closes(strict_broker, send)
    assert _events(lines) == ["request_truncated"]
    assert lines[0]["expected"] == 100 and lines[0]["received"] == len(_header(METADATA, 5))


def test_unknown_api_key(strict_broker: RunningBroker) -> None:
    lines = _closes(strict_broker, lambda c: c.send_frame(_header(999, 0)))
    assert _events(lines) == ["malformed_request"]
    assert "unsupported API key 999" in lines[0]["error"]


def test_unsupported_version_of_a_known_key(strict_broker: RunningBroker) -> None:
    lines = _closes(strict_broker, lambda c: c.send_frame(_header(METADATA, 99)))
    assert _events(lines) == ["malformed_request"]
    assert "version 99" in lines[0]["error"]


def test_api_versions_too_new_is_answered_with_the_supported_range(
    strict_broker: RunningBroker,
) -> None:
    """Kafka answers an ApiVersions it cannot parse with a v0 body and UNSUPPORTED_VERSION,
    so that the client can retry with a version both know."""
    with RawConnection(strict_broker) as conn:
        conn.send_frame(_header(API_VERSIONS, 99, correlation=7) + b"\x00" * 8)
        frame = conn.read_frame()
        correlation, error, count = struct.unpack_from(">ihi", frame)
        assert (correlation, error) == (7, E.unsupported_version.value)
        versions = {
            struct.unpack_from(">hhh", frame, 10 + 6 * i)[0]: struct.unpack_from(
                ">hhh", frame, 10 + 6 * i
            )[1:]
            for i in range(count)
        }
        assert versions[API_VERSIONS] == (0, 3)
        # The connection stays usable, as in Kafka.
        assert conn.call(API_VERSIONS, 0).error_code == E.none


def test_produce_to_an_unknown_topic(strict_broker: RunningBroker) -> None:
    topic_t = nested(load_request_schema(PRODUCE, 7), "topic_data")
    part_t = nested(topic_t, "partition_data")
    nowhere = build(topic_t, name="nowhere", partition_data=(build(part_t, index=0, records=b""),))
    with RawConnection(strict_broker) as conn:
        reply = conn.call(
            PRODUCE,
            7,
            transactional_id=None,
            acks=1,
            timeout=datetime.timedelta(seconds=1),
            topic_data=(nowhere,),
        )
        ((only,),) = [t.partition_responses for t in reply.responses]
        assert only.error_code == E.unknown_topic_or_partition
        meta = conn.call(METADATA, 5, topics=None, allow_auto_topic_creation=True)
        assert meta.topics == ()  # and nothing was created
