"""Producer and consumer settings, named after Kafka's client configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..broker.producer_state import BATCHES_KEPT
from ..protocol import ACKS_ALL
from ..validation import check_int, check_seconds

Acks = Literal[0, 1, -1]


def parse_acks(value: int | str) -> Acks:
    """``0``, ``1``, ``-1`` or ``"all"`` (also as strings) to the wire value."""
    text = str(value).strip().lower()
    if text in ("all", "-1"):
        return ACKS_ALL
    if text == "0":
        return 0
    if text == "1":
        return 1
    raise ValueError(f"acks must be 0, 1 or 'all', got {value!r}")


def acks_name(acks: int) -> str:
    return "all" if acks == ACKS_ALL else str(acks)


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """How a producer batches, sends and retries.

    Args:
        acks: 0 (fire and forget at the protocol level), 1 (leader only) or -1 (all in-sync).
        batch_size: bytes at which a partition's batch is sent without waiting for ``linger``.
        linger: seconds a batch waits for more records before it is sent.
        retries: times a batch is resent after a retriable error.
        retry_backoff: seconds between a failed attempt and its retry.
        max_in_flight: unanswered requests per broker. Above 1, a retried batch can
            land after a later one: retries then reorder records within a partition.
        request_timeout: how long the broker may hold an ``acks=all`` request.
        delivery_timeout: upper bound from ``send`` to success or failure, retries included.
        max_request_size: cap on the records of one request.
        client_id: name in broker logs.
        idempotence: send as an idempotent producer (Kafka's ``enable.idempotence``):
            the broker checks each batch's sequence numbers, so a retry of a batch it
            already appended is acknowledged, not appended twice. At most five
            requests may then be in flight (what the broker remembers per producer).
    """

    acks: Acks = ACKS_ALL
    batch_size: int = 16 * 1024
    linger: float = 0.005
    retries: int = 5
    retry_backoff: float = 0.1
    max_in_flight: int = 5
    request_timeout: float = 30.0
    delivery_timeout: float = 120.0
    max_request_size: int = 1024 * 1024
    client_id: str = "producer"
    idempotence: bool = False

    def __post_init__(self) -> None:
        if self.acks not in (0, 1, ACKS_ALL):
            raise ValueError(f"acks must be 0, 1 or -1, got {self.acks!r}")
        for name in ("batch_size", "max_in_flight", "max_request_size"):
            check_int(name, getattr(self, name), 1)
        check_int("retries", self.retries, 0)
        if self.idempotence and self.max_in_flight > BATCHES_KEPT:
            raise ValueError(
                f"an idempotent producer allows at most {BATCHES_KEPT} requests in flight, "
                f"got max_in_flight={self.max_in_flight}"
            )
        for name in ("linger", "retry_backoff", "request_timeout", "delivery_timeout"):
            check_seconds(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """How a consumer fetches and takes part in its group.

    Args:
        group_id: the consumer group.
        topics: topics to subscribe to.
        fetch_min_bytes: bytes that end a fetch's wait early.
        fetch_max_wait: seconds a fetch waits for ``fetch_min_bytes``.
        fetch_max_bytes: cap on one fetch response.
        max_partition_fetch_bytes: cap per partition in a fetch response.
        session_timeout: seconds without a heartbeat before the coordinator expels the member.
        heartbeat_interval: seconds between heartbeats.
        rebalance_timeout: how long the coordinator waits for members to rejoin.
        auto_commit_interval: seconds between offset commits.
        client_id: name in member ids and logs.
    """

    group_id: str
    topics: tuple[str, ...]
    fetch_min_bytes: int = 1
    fetch_max_wait: float = 0.5
    fetch_max_bytes: int = 50 * 1024 * 1024
    max_partition_fetch_bytes: int = 1024 * 1024
    session_timeout: float = 10.0
    heartbeat_interval: float = 3.0
    rebalance_timeout: float = 30.0
    auto_commit_interval: float = 5.0
    client_id: str = "consumer"

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id must not be empty")
        if not self.topics:
            raise ValueError("topics must not be empty")
        check_int("fetch_min_bytes", self.fetch_min_bytes, 0)
        check_int("fetch_max_bytes", self.fetch_max_bytes, 1)
        check_int("max_partition_fetch_bytes", self.max_partition_fetch_bytes, 1)
        for name in (
            "fetch_max_wait",
            "session_timeout",
            "heartbeat_interval",
            "rebalance_timeout",
            "auto_commit_interval",
        ):
            check_seconds(name, getattr(self, name))
        if self.heartbeat_interval >= self.session_timeout:
            raise ValueError(
                "heartbeat_interval must be below session_timeout, got "
                f"{self.heartbeat_interval!r} >= {self.session_timeout!r}"
            )
